//! `qe login`, `qe profiles`, `qe queues login`: what the config file keeps.

use super::first_line_of_stdin;
use crate::args::LoginArgs;
use crate::config::{Profile, QueueLogins};
use crate::context::Context;
use crate::failure::Failure;
use crate::output::Output;
use qe_client::control_plane::Logins;
use qe_client::{Credentials, Role};
use serde::Deserialize;
use serde_json::json;
use std::path::{Path, PathBuf};

/// What `controlplane dev` writes to `DIR/demo.json` (the fields `qe` uses).
#[derive(Debug, Deserialize)]
struct DevDemo {
    /// The control plane's URL (`http://127.0.0.1:8443`).
    api: String,
    /// The operator's token.
    token: String,
    /// The demo account's full API key.
    account_key: String,
    /// Its DNS server, `IP:PORT`: the only one that knows the queues' names.
    dns: String,
    /// The PEM root that signs the nodes' certificates.
    trust: PathBuf,
    /// The demo queue's id.
    queue: String,
    /// Where its node listens (`wss://HOST:PORT/`).
    node: String,
    /// Its three logins.
    logins: Logins,
}

/// `qe login`: writes the profile in use, from flags or from dev's demo.json, after checking
/// the token with the API (unless `--no-check`).
pub async fn login(context: &mut Context, args: LoginArgs) -> Result<(), Failure> {
    let profile = match &args.from_dev {
        Some(path) => profile_from_dev(path, args.operator)?,
        None => profile_from_flags(&args)?,
    };
    let earlier = context.config.profiles.get(&context.profile_name);
    let profile = keep_queues_of(earlier, profile);
    context
        .config
        .profiles
        .insert(context.profile_name.clone(), profile);
    let queues = match args.no_check {
        true => None,
        false => Some(context.api()?.queues().await?.len()),
    };
    context.save()?;
    let profile = context.profile()?;
    let api = profile.api.clone().unwrap_or_default();
    let saved: Vec<&String> = profile.queues.keys().collect();
    let checked = queues.map_or("not checked".to_string(), |n| format!("yes, sees {n}"));
    Output::new(
        vec!["PROFILE", "API", "TOKEN CHECKED", "LOGINS FOR"],
        vec![vec![
            context.profile_name.clone(),
            api.clone(),
            checked,
            saved
                .iter()
                .map(|id| id.as_str())
                .collect::<Vec<_>>()
                .join(" "),
        ]],
        json!({"profile": context.profile_name, "api": api, "queues_seen": queues,
               "logins_for": saved, "config": context.path}),
    )
    .print(context.format);
    Ok(())
}

/// A profile of dev's demo: its API with the demo account's key (or the operator's token),
/// its DNS and trust, and the demo queue's logins.
fn profile_from_dev(path: &Path, operator: bool) -> Result<Profile, Failure> {
    let unreadable = |e: String| Failure::Usage(format!("{}: {e}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| unreadable(e.to_string()))?;
    let demo: DevDemo = serde_json::from_str(&text).map_err(|e| unreadable(e.to_string()))?;
    let demo_queue = QueueLogins {
        url: Some(demo.node),
        publisher: Some(demo.logins.publisher),
        subscriber: Some(demo.logins.subscriber),
        admin: Some(demo.logins.admin),
    };
    Ok(Profile {
        api: Some(demo.api),
        token: Some(match operator {
            true => demo.token,
            false => demo.account_key,
        }),
        ca: Some(demo.trust),
        dns: Some(demo.dns),
        queues: [(demo.queue, demo_queue)].into(),
    })
}

/// A profile of `--api`, the token (`--token`, `QE_TOKEN` or `--token-stdin`), `--ca`, `--dns`.
fn profile_from_flags(args: &LoginArgs) -> Result<Profile, Failure> {
    let token = match (&args.token, args.token_stdin) {
        (_, true) => first_line_of_stdin("token")?,
        (Some(token), false) => token.clone(),
        (None, false) => {
            return Err(Failure::Usage(
                "no token: give --token-stdin, --token or QE_TOKEN".into(),
            ))
        }
    };
    if let Some(ca) = &args.ca {
        std::fs::metadata(ca).map_err(|e| Failure::Usage(format!("--ca {}: {e}", ca.display())))?;
    }
    Ok(Profile {
        api: args.api.clone(),
        token: Some(token),
        ca: args.ca.as_ref().map(|ca| absolute(ca)),
        dns: args.dns.clone(),
        queues: Default::default(),
    })
}

/// The path as given from anywhere: a profile is used from other directories.
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// `new`, keeping the queue logins of `earlier` when it is the same control plane (they are
/// shown only once, so a new token must not lose them).
fn keep_queues_of(earlier: Option<&Profile>, mut new: Profile) -> Profile {
    let Some(earlier) = earlier.filter(|earlier| earlier.api == new.api) else {
        return new;
    };
    for (id, logins) in &earlier.queues {
        new.queues
            .entry(id.clone())
            .or_insert_with(|| logins.clone());
    }
    new
}

/// `qe profiles`: every profile, its API and the queues it has logins for (no secrets).
pub fn profiles(context: &Context) -> Result<(), Failure> {
    let config = &context.config;
    let in_use = &context.profile_name;
    let mut rows = Vec::new();
    let mut json = Vec::new();
    for (name, profile) in &config.profiles {
        let queues: Vec<&String> = profile.queues.keys().collect();
        let used = if name == in_use { "*" } else { "" };
        rows.push(vec![
            used.to_string(),
            name.clone(),
            profile.api.clone().unwrap_or_else(|| "-".into()),
            profile.dns.clone().unwrap_or_else(|| "-".into()),
            queues
                .iter()
                .map(|id| id.as_str())
                .collect::<Vec<_>>()
                .join(" "),
        ]);
        json.push(
            json!({"name": name, "in_use": name == in_use, "api": profile.api,
                         "dns": profile.dns, "ca": profile.ca, "queues": queues}),
        );
    }
    Output::new(
        vec!["IN USE", "PROFILE", "API", "DNS", "LOGINS FOR"],
        rows,
        json.into(),
    )
    .print(context.format);
    Ok(())
}

/// `qe queues login`: keeps a login of `queue` (the password from stdin) in the profile.
pub fn queue_login(
    context: &mut Context,
    queue: &str,
    role: Role,
    username: String,
    url: Option<String>,
) -> Result<(), Failure> {
    let password = first_line_of_stdin("password")?;
    // A profile of queues only (no control plane) starts here.
    let saved = context
        .config
        .profiles
        .entry(context.profile_name.clone())
        .or_default()
        .queues
        .entry(queue.to_string())
        .or_default();
    saved.set_login(role, Credentials::new(username, password));
    if url.is_some() {
        saved.url = url;
    }
    context.save()?;
    eprintln!(
        "kept the {} login of {queue} in profile {:?}",
        role.name(),
        context.profile_name
    );
    Ok(())
}
