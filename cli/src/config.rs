//! The config file: profiles, each a control plane with its token and the queues whose logins
//! you have. Written 0600 in a directory of 0700, since it holds tokens and passwords.
//!
//! ```toml
//! default_profile = "default"
//!
//! [profiles.default]
//! api = "http://127.0.0.1:8443"
//! token = "qek_…"
//! ca = "/path/to/root.pem"
//! dns = "127.0.0.1:8053"
//!
//! [profiles.default.queues.abcdefgh1234]
//! url = "wss://abcdefgh1234.q.dev.thequeueexpert.com:8001/"
//! publisher = { username = "…", password = "…" }
//! subscriber = { username = "…", password = "…" }
//! admin = { username = "…", password = "…" }
//! ```

use crate::failure::Failure;
use qe_client::{Credentials, Role};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The whole file.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The profile used without `--profile` or `QE_PROFILE`; `"default"` unless given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_profile: Option<String>,
    /// The profiles by name.
    #[serde(default)]
    pub profiles: BTreeMap<String, Profile>,
}

/// One control plane and the queues reached through it.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// The control plane's URL (`https://api.CLUSTER.thequeueexpert.com/`); none: only the
    /// queues below, by their saved URLs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api: Option<String>,
    /// Its token: an account's API key (`qek_…`) or the operator's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// A PEM file of roots trusted besides Mozilla's, for the API and the queues.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<PathBuf>,
    /// A DNS server (`IP:PORT`) to resolve queue names through, instead of the system's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<String>,
    /// The queues whose logins you have, by id.
    #[serde(default)]
    pub queues: BTreeMap<String, QueueLogins>,
}

/// A queue's address and the logins you have for it.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueLogins {
    /// Where it was last seen; the control plane's answer wins when it gives one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The publisher's login.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publisher: Option<Credentials>,
    /// The subscriber's login.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subscriber: Option<Credentials>,
    /// The administrator's login.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin: Option<Credentials>,
}

impl QueueLogins {
    /// The login of `role`, if you have it.
    pub fn login(&self, role: Role) -> Option<&Credentials> {
        match role {
            Role::Publisher => self.publisher.as_ref(),
            Role::Subscriber => self.subscriber.as_ref(),
            Role::Admin => self.admin.as_ref(),
        }
    }

    /// Keeps `login` as the login of `role`.
    pub fn set_login(&mut self, role: Role, login: Credentials) {
        match role {
            Role::Publisher => self.publisher = Some(login),
            Role::Subscriber => self.subscriber = Some(login),
            Role::Admin => self.admin = Some(login),
        }
    }
}

/// Where the file is: `$QE_CONFIG`, else `$XDG_CONFIG_HOME/qe/config.toml`, else
/// `~/.config/qe/config.toml`.
pub fn path() -> Result<PathBuf, Failure> {
    if let Some(path) = std::env::var_os("QE_CONFIG") {
        return Ok(path.into());
    }
    let base = match std::env::var_os("XDG_CONFIG_HOME").filter(|dir| !dir.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => match std::env::var_os("HOME") {
            Some(home) => PathBuf::from(home).join(".config"),
            None => {
                return Err(Failure::Usage(
                    "no HOME: give the config file with QE_CONFIG".into(),
                ))
            }
        },
    };
    Ok(base.join("qe").join("config.toml"))
}

impl Config {
    /// The file at `path`, or an empty config if there is none yet.
    pub fn load(path: &Path) -> Result<Config, Failure> {
        match std::fs::read_to_string(path) {
            Ok(text) => {
                Config::parse(&text).map_err(|e| Failure::Usage(format!("{}: {e}", path.display())))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Config::default()),
            Err(e) => Err(Failure::Usage(format!("{}: {e}", path.display()))),
        }
    }

    /// A config from its text.
    pub fn parse(text: &str) -> Result<Config, toml::de::Error> {
        toml::from_str(text)
    }

    /// Writes it to `path` (0600; a directory made for it is 0700), through a temporary file
    /// so a reader never sees half of it.
    pub fn save(&self, path: &Path) -> Result<(), Failure> {
        use std::io::Write;
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
        let failed = |e: std::io::Error| Failure::Usage(format!("{}: {e}", path.display()));
        if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            if !dir.exists() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(dir)
                    .map_err(failed)?;
            }
        }
        let text = toml::to_string(self).expect("a config serializes");
        let temporary = path.with_extension("toml.new");
        let _ = std::fs::remove_file(&temporary);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temporary)
            .map_err(failed)?;
        file.write_all(text.as_bytes()).map_err(failed)?;
        file.sync_all().map_err(failed)?;
        std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(0o600))
            .map_err(failed)?;
        std::fs::rename(&temporary, path).map_err(failed)
    }

    /// The name of the profile in use: `chosen` (`--profile`, `QE_PROFILE`), else the file's
    /// `default_profile`, else `"default"`.
    pub fn profile_name(&self, chosen: Option<&str>) -> String {
        chosen
            .map(str::to_string)
            .or_else(|| self.default_profile.clone())
            .unwrap_or_else(|| "default".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_reads_writes_and_stays_private() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qe").join("config.toml");
        let mut config = Config::parse(
            "[profiles.work]\napi = \"http://127.0.0.1:8443\"\ntoken = \"qek_a_b\"\n\
             dns = \"127.0.0.1:8053\"\n[profiles.work.queues.q1]\nurl = \"ws://127.0.0.1:1/\"\n\
             admin = { username = \"a\", password = \"p\" }\n",
        )
        .unwrap();
        let work = &config.profiles["work"];
        assert_eq!(work.dns.as_deref(), Some("127.0.0.1:8053"));
        assert_eq!(
            work.queues["q1"].login(Role::Admin),
            Some(&Credentials::new("a", "p"))
        );
        assert!(work.queues["q1"].login(Role::Publisher).is_none());
        config.default_profile = Some("work".into());
        config.save(&path).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        let again = Config::load(&path).unwrap();
        assert_eq!(again.profile_name(None), "work");
        assert_eq!(again.profile_name(Some("other")), "other");
        assert!(Config::parse("[profiles.x]\nnope = 1\n").is_err());
    }
}
