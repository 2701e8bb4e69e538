//! The operator's rolling upgrades: `qe builds publish|list`, `qe rollouts
//! start|list|get|halt|resume|rollback` (docs/deploy.md §14).

use super::{json_of, utc};
use crate::args::{BuildsCommand, RolloutsCommand};
use crate::context::Context;
use crate::failure::Failure;
use crate::output::Output;
use qe_client::control_plane::{Rollout, RolloutAction, RolloutPlan};
use std::time::Duration;

/// How often `qe rollouts start --wait` looks at the rollout.
const WATCH_EVERY: Duration = Duration::from_secs(1);

pub async fn builds(context: &mut Context, command: BuildsCommand) -> Result<(), Failure> {
    let api = context.api()?;
    match command {
        BuildsCommand::Publish { file, label } => {
            let binary = std::fs::read(&file)
                .map_err(|e| Failure::Usage(format!("{}: {e}", file.display())))?;
            let build = api.publish_build(binary, label.as_deref()).await?;
            let row = vec![
                build.sha256.clone(),
                build.size.to_string(),
                build.architecture.clone(),
                build.label.clone().unwrap_or_default(),
                utc(build.published),
            ];
            Output::new(BUILD_COLUMNS.to_vec(), vec![row], json_of(&build)).print(context.format);
        }
        BuildsCommand::List => {
            let builds = api.builds().await?;
            let mut rows: Vec<Vec<String>> = builds
                .installed
                .iter()
                .map(|installed| {
                    let size = installed.size.to_string();
                    let installed_label = "(installed)".to_string();
                    let sha256 = installed.binary_sha256.clone();
                    vec![sha256, size, String::new(), installed_label, String::new()]
                })
                .collect();
            rows.extend(builds.builds.iter().map(|build| {
                vec![
                    build.sha256.clone(),
                    build.size.to_string(),
                    build.architecture.clone(),
                    build.label.clone().unwrap_or_default(),
                    utc(build.published),
                ]
            }));
            Output::new(BUILD_COLUMNS.to_vec(), rows, json_of(&builds)).print(context.format);
        }
    }
    Ok(())
}

const BUILD_COLUMNS: [&str; 5] = ["SHA256", "SIZE", "ARCHITECTURE", "LABEL", "PUBLISHED"];
const ROLLOUT_COLUMNS: [&str; 6] = ["ID", "STATE", "BUILD", "WAVE", "QUEUES", "REASON"];

fn rollout_row(rollout: &Rollout) -> Vec<String> {
    vec![
        rollout.id.clone(),
        rollout.state.clone(),
        rollout.build.binary_sha256.chars().take(12).collect(),
        format!(
            "{}/{}",
            rollout.wave.min(rollout.waves.len()),
            rollout.waves.len()
        ),
        rollout.queues.len().to_string(),
        rollout.reason.clone().unwrap_or_default(),
    ]
}

fn print_rollout(context: &Context, rollout: &Rollout) {
    let rows = vec![rollout_row(rollout)];
    Output::new(ROLLOUT_COLUMNS.to_vec(), rows, json_of(rollout)).print(context.format);
}

pub async fn rollouts(context: &mut Context, command: RolloutsCommand) -> Result<(), Failure> {
    let api = context.api()?;
    let act = |id: String, action| {
        let api = api.clone();
        async move { api.act_on_rollout(&id, action).await }
    };
    // Only a start that waits answers for how the roll went.
    let waited = matches!(command, RolloutsCommand::Start { wait: true, .. });
    let rollout = match command {
        RolloutsCommand::Start {
            binary_sha256,
            canary,
            pause_secs,
            wave_timeout_secs,
            wait,
        } => {
            let plan = RolloutPlan {
                binary_sha256,
                canary,
                pause_secs,
                wave_timeout_secs,
            };
            let rollout = api.start_rollout(&plan).await?;
            match wait {
                true => until_settled(&api, rollout).await?,
                false => rollout,
            }
        }
        RolloutsCommand::List => {
            let rollouts = api.rollouts().await?;
            let rows = rollouts.iter().map(rollout_row).collect();
            Output::new(ROLLOUT_COLUMNS.to_vec(), rows, json_of(&rollouts)).print(context.format);
            return Ok(());
        }
        RolloutsCommand::Get { id } => api.rollout(&id).await?,
        RolloutsCommand::Halt { id } => act(id, RolloutAction::Halt).await?,
        RolloutsCommand::Resume { id } => act(id, RolloutAction::Resume).await?,
        RolloutsCommand::Rollback { id } => act(id, RolloutAction::Rollback).await?,
    };
    print_rollout(context, &rollout);
    match rollout.state.as_str() {
        "halted" if waited => Err(Failure::Refused {
            code: None,
            message: format!(
                "rollout {} halted: {}",
                rollout.id,
                rollout.reason.as_deref().unwrap_or("")
            ),
        }),
        _ => Ok(()),
    }
}

/// `rollout` once it is done, halted or rolled back; each new wave said on stderr.
async fn until_settled(
    api: &qe_client::control_plane::ControlPlane,
    mut rollout: Rollout,
) -> Result<Rollout, Failure> {
    let mut wave_said = None;
    loop {
        if wave_said != Some(rollout.wave) && rollout.wave < rollout.waves.len() {
            let queues = rollout.waves[rollout.wave].join(", ");
            eprintln!(
                "wave {} of {}: {queues}",
                rollout.wave + 1,
                rollout.waves.len()
            );
            wave_said = Some(rollout.wave);
        }
        if rollout.state != "rolling" {
            return Ok(rollout);
        }
        tokio::time::sleep(WATCH_EVERY).await;
        rollout = api.rollout(&rollout.id).await?;
    }
}
