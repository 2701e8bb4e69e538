//! Rolling upgrades, the node's side: when its desired config names another build than the
//! one it runs, the node fetches that binary over its channel, checks its SHA-256, keeps it
//! on its own volume, stops as on SIGTERM (its last usage record reported) and `exec`s it:
//! the same process, so whatever supervises it (systemd on a cloud instance, the local
//! provider) sees no exit, and the data directory goes on with the new build.
//!
//! A new build is on trial until it has stayed up for [`TRIAL`] after the control plane heard
//! from it (or stops cleanly after that). The files in `DATA_DIR/builds/` say where a node
//! stands:
//! - `dataplane-SHA256`: a fetched build (checked when written and again before each run);
//! - `trying`: the build exec'd and not yet through its trial;
//! - `selected`: the build that passed its trial, run again whenever the node starts (the
//!   supervisor starts the binary it installed; that one execs the selected build at once);
//! - `starts`: how many times in a row the selected build was started without staying up
//!   [`STABLE`] or stopping cleanly: at [`UNSTABLE_STARTS`] it is refused (a build that fails
//!   after its trial would otherwise loop until the supervisor gives up on the node);
//! - `refused-SHA256`: why that build will not be tried again.
//!
//! A start that finds `trying` set by another build means the trial failed (the new build
//! exited or crashed and the supervisor started the installed binary again): that build is
//! refused, and the node serves on the one that runs. The control plane hears of the refusal
//! with the next confirmed config ([`qe_shared::node_channel::Applied::refused_build`]) and
//! halts the roll.

use crate::control_plane::channel::Channel;
use qe_shared::backoff::Backoff;
use qe_shared::build::is_sha256;
use qe_shared::files::{write_private, write_whole};
use qe_shared::node_channel::{DesiredBuild, RefusedBuild};
use sha2::Digest;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How long a new build must stay up, after its first confirmed config, to be selected.
pub const TRIAL: Duration = Duration::from_secs(10);
/// How long a start of the selected build must last to count as a good one.
pub const STABLE: Duration = Duration::from_secs(300);
/// Starts in a row of the selected build that did not last [`STABLE`] before it is refused.
pub const UNSTABLE_STARTS: u32 = 3;
/// The wait before fetching again after a failed fetch; doubles up to a minute.
const FETCH_RETRY: Duration = Duration::from_secs(2);
/// How long one fetch of a build may take (tens of megabytes).
const FETCH_WITHIN: Duration = Duration::from_secs(600);
const PREFIX: &str = "dataplane-";

/// Where a node keeps its builds.
pub fn builds_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("builds")
}

fn binary(dir: &Path, sha256: &str) -> PathBuf {
    dir.join(format!("{PREFIX}{sha256}"))
}

fn read_name(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let name = text.trim();
    is_sha256(name).then(|| name.to_string())
}

/// The build this process runs when it is one of the fetched ones (its file's name says
/// which); None for the binary its supervisor installed.
pub fn fetched_build_running(data_dir: &Path) -> Option<String> {
    let exe = std::env::current_exe().ok()?;
    // The running binary's path is absolute with every link resolved; the data directory
    // may be given relative or through a link.
    let dir = std::fs::canonicalize(builds_dir(data_dir)).ok()?;
    if exe.parent()? != dir {
        return None;
    }
    let name = exe.file_name()?.to_str()?.strip_prefix(PREFIX)?;
    is_sha256(name).then(|| name.to_string())
}

/// What a node does first, before it reads its config: the build to `exec` if it is not the
/// one to run. A build whose trial this start ends is refused here; the one selected before
/// it (if any) runs again.
pub fn at_start(data_dir: &Path) -> Option<Ready> {
    let dir = builds_dir(data_dir);
    if !dir.is_dir() || fetched_build_running(data_dir).is_some() {
        return None;
    }
    if let Some(tried) = read_name(&dir.join("trying")) {
        let reason = "it did not stay up: the node started again on its installed build";
        tracing::error!(build = %tried, "a new build did not stay up: refused, serving on the installed one");
        refuse(&dir, &tried, reason);
    }
    let selected = read_name(&dir.join("selected"))?;
    let starts = read_starts(&dir) + 1;
    if starts > UNSTABLE_STARTS {
        let reason = format!(
            "it was started {UNSTABLE_STARTS} times in a row without staying up {} s",
            STABLE.as_secs()
        );
        tracing::error!(build = %selected, %reason, "the selected build is refused, serving on the installed one");
        refuse(&dir, &selected, &reason);
        return None;
    }
    let path = binary(&dir, &selected);
    match std::fs::read(&path).map(|bytes| qe_shared::hex(&sha2::Sha256::digest(bytes))) {
        Ok(sha256) if sha256 == selected => {}
        _ => {
            refuse(
                &dir,
                &selected,
                "its file on the node does not match its SHA-256",
            );
            return None;
        }
    }
    if let Err(error) = write_private(&dir.join("starts"), starts.to_string().as_bytes()) {
        tracing::error!(%error, "cannot count the selected build's starts: serving on the installed one");
        return None;
    }
    Some(Ready {
        sha256: selected,
        path,
    })
}

fn read_starts(dir: &Path) -> u32 {
    let text = std::fs::read_to_string(dir.join("starts")).unwrap_or_default();
    text.trim().parse().unwrap_or(0)
}

fn reset_starts(dir: &Path) {
    let _ = std::fs::remove_file(dir.join("starts"));
}

/// This start of build `running` went well (it stayed up, or stopped cleanly): if it is the
/// selected build, its count of bad starts begins again.
fn started_well(dir: &Path, running: &str) {
    if read_name(&dir.join("selected")).as_deref() == Some(running) {
        reset_starts(dir);
    }
}

/// Keeps why build `sha256` is refused, and forgets it as the one to run.
fn refuse(dir: &Path, sha256: &str, reason: &str) {
    let _ = write_private(&dir.join(format!("refused-{sha256}")), reason.as_bytes());
    for name in ["trying", "selected"] {
        if read_name(&dir.join(name)).as_deref() == Some(sha256) {
            let _ = std::fs::remove_file(dir.join(name));
            if name == "selected" {
                reset_starts(dir);
            }
        }
    }
    let _ = std::fs::remove_file(binary(dir, sha256));
}

/// The build refused last, if any: the control plane hears of it with every confirmed config.
pub fn last_refused(data_dir: &Path) -> Option<RefusedBuild> {
    let entries = std::fs::read_dir(builds_dir(data_dir)).ok()?;
    let newest = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry
                .file_name()
                .to_str()?
                .strip_prefix("refused-")?
                .to_string();
            let modified = entry.metadata().ok()?.modified().ok()?;
            is_sha256(&name).then_some((modified, name, entry.path()))
        })
        .max();
    let (_, binary_sha256, path) = newest?;
    let reason = std::fs::read_to_string(path).unwrap_or_default();
    Some(RefusedBuild {
        binary_sha256,
        reason,
    })
}

fn is_refused(data_dir: &Path, sha256: &str) -> bool {
    builds_dir(data_dir)
        .join(format!("refused-{sha256}"))
        .exists()
}

/// Selects the build this process runs once it has stayed up for [`TRIAL`] after its first
/// confirmed config (`confirmed`, the version confirmed last, is past 0 then).
pub async fn pass_trial(data_dir: PathBuf, mut confirmed: tokio::sync::watch::Receiver<u64>) {
    let Some(running) = fetched_build_running(&data_dir) else {
        return;
    };
    let started = tokio::time::Instant::now();
    let dir = builds_dir(&data_dir);
    if read_name(&dir.join("trying")).as_deref() == Some(running.as_str()) {
        if confirmed.wait_for(|version| *version > 0).await.is_err() {
            return;
        }
        tokio::time::sleep(TRIAL).await;
        match select_if_on_trial(&dir, &running) {
            Ok(true) => tracing::info!(build = %running, "the new build passed its trial"),
            Ok(false) => {}
            Err(error) => tracing::error!(%error, "cannot select the build that passed its trial"),
        }
    }
    // Up long enough: this start of the selected build was a good one.
    tokio::time::sleep_until(started + STABLE).await;
    started_well(&dir, &running);
}

/// Selects build `running` if it is the one on trial; whether it was.
fn select_if_on_trial(dir: &Path, running: &str) -> std::io::Result<bool> {
    if read_name(&dir.join("trying")).as_deref() != Some(running) {
        return Ok(false);
    }
    write_private(&dir.join("selected"), running.as_bytes())?;
    reset_starts(dir);
    std::fs::remove_file(dir.join("trying"))?;
    Ok(true)
}

/// A build on trial that served and confirmed a config and is now stopped cleanly (SIGTERM:
/// a reboot, a stop) passed: the next start runs it again, rather than refuse it.
pub fn stopped_cleanly(data_dir: &Path) {
    let Some(running) = fetched_build_running(data_dir) else {
        return;
    };
    let dir = builds_dir(data_dir);
    if let Err(error) = select_if_on_trial(&dir, &running) {
        tracing::error!(%error, "cannot select the build on trial as it stops");
    }
    started_well(&dir, &running);
}

/// A build fetched, checked and ready to `exec`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ready {
    pub sha256: String,
    pub path: PathBuf,
}

/// Fetches the builds a node's desired config names; says when one is ready to run.
#[derive(Clone)]
pub struct Upgrader {
    channel: Channel,
    data_dir: PathBuf,
    /// The build last asked for; the fetcher follows it.
    wanted: Arc<tokio::sync::watch::Sender<Option<DesiredBuild>>>,
    ready: Arc<tokio::sync::watch::Sender<Option<Ready>>>,
}

impl Upgrader {
    /// With the fetcher running; `ready` tells of a build to restart into.
    pub fn start(
        channel: Channel,
        data_dir: PathBuf,
    ) -> (Upgrader, tokio::sync::watch::Receiver<Option<Ready>>) {
        let (wanted, _) = tokio::sync::watch::channel(None);
        let (ready, ready_rx) = tokio::sync::watch::channel(None);
        channel.tell_refused(last_refused(&data_dir));
        let upgrader = Upgrader {
            channel,
            data_dir,
            wanted: Arc::new(wanted),
            ready: Arc::new(ready),
        };
        tokio::spawn(upgrader.clone().fetch_wanted());
        (upgrader, ready_rx)
    }

    /// The desired config names `build` (or none).
    pub fn want(&self, build: Option<&DesiredBuild>) {
        self.wanted.send_if_modified(|wanted| {
            let changed = wanted.as_ref() != build;
            *wanted = build.cloned();
            changed
        });
    }

    async fn fetch_wanted(self) {
        let mut wanted = self.wanted.subscribe();
        loop {
            let build = wanted.borrow_and_update().clone();
            if let Some(build) = build {
                tokio::select! {
                    () = self.fetch_until_ready(&build) => {}
                    // Another build (or none) asked for meanwhile.
                    _ = wanted.changed() => continue,
                }
                // The node restarts into it: fetching more (and removing its file to make
                // room) is for the next build to do.
                if self.ready.borrow().is_some() {
                    return;
                }
            }
            if wanted.changed().await.is_err() {
                return;
            }
        }
    }

    /// Fetches `build` unless it runs, is refused, or is kept already, retrying failed
    /// fetches; then says it is ready.
    async fn fetch_until_ready(&self, build: &DesiredBuild) {
        let sha256 = &build.binary_sha256;
        if !is_sha256(sha256) || is_refused(&self.data_dir, sha256) {
            return;
        }
        let running = match fetched_build_running(&self.data_dir) {
            Some(running) => Some(running),
            None => crate::control_plane::channel::this_build()
                .await
                .map(|build| build.binary_sha256),
        };
        if running.as_deref() == Some(sha256.as_str()) {
            return;
        }
        let dir = builds_dir(&self.data_dir);
        let path = binary(&dir, sha256);
        let mut backoff = Backoff::new(FETCH_RETRY, Duration::from_secs(60));
        loop {
            match self.fetch(build, &dir, &path).await {
                Ok(()) => break,
                Err(FetchError::Mismatch(reason)) => {
                    tracing::error!(build = %sha256, %reason, "a build did not check out: refused");
                    refuse(&dir, sha256, &reason);
                    self.channel.tell_refused(last_refused(&self.data_dir));
                    self.channel.confirm_again().await;
                    return;
                }
                Err(FetchError::Failed(error)) => {
                    let wait = backoff.next_wait();
                    tracing::warn!(build = %sha256, %error, retry_in = ?wait, "fetching a build failed");
                    tokio::time::sleep(wait).await;
                }
            }
        }
        tracing::info!(build = %sha256, "a new build is fetched and checked: restarting into it");
        self.ready.send_replace(Some(Ready {
            sha256: sha256.clone(),
            path,
        }));
    }

    /// `build` at `path`, checked (kept from before, or fetched now); other fetched builds
    /// than this one and the running one are removed (a volume keeps two at most).
    async fn fetch(&self, build: &DesiredBuild, dir: &Path, path: &Path) -> Result<(), FetchError> {
        let failed = |error: String| FetchError::Failed(error);
        std::fs::create_dir_all(dir).map_err(|e| failed(e.to_string()))?;
        remove_other_builds(dir, &build.binary_sha256, &self.data_dir);
        if checked(path, &build.binary_sha256).await {
            return Ok(());
        }
        let what = format!("builds/{}", build.binary_sha256);
        let mut response = self
            .channel
            .fetch(&what, FETCH_WITHIN)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let mut hasher = sha2::Sha256::new();
        let mut bytes = Vec::with_capacity(build.size.min(1 << 30) as usize);
        // A file that is not the build announced (a damaged copy on one replica) is fetched
        // again later: only what this machine cannot run is refused for good.
        while let Some(chunk) = response.chunk().await.map_err(|e| failed(e.to_string()))? {
            if (bytes.len() + chunk.len()) as u64 > build.size {
                return Err(failed(format!(
                    "it is longer than the {} bytes it was announced with",
                    build.size
                )));
            }
            hasher.update(&chunk);
            bytes.extend_from_slice(&chunk);
        }
        let got = qe_shared::hex(&hasher.finalize());
        if got != build.binary_sha256 {
            return Err(failed(format!("its SHA-256 is {got}")));
        }
        if let Some(reason) = not_runnable_here(&bytes) {
            return Err(FetchError::Mismatch(reason));
        }
        let path = path.to_path_buf();
        let written = tokio::task::spawn_blocking(move || write_executable(&path, &bytes)).await;
        match written {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(failed(error.to_string())),
            Err(error) => Err(failed(error.to_string())),
        }
    }
}

enum FetchError {
    /// Fetched, and not a build this machine runs: never retried.
    Mismatch(String),
    /// Try again later.
    Failed(String),
}

/// Whether the file at `path` is there and has this hash.
async fn checked(path: &Path, sha256: &str) -> bool {
    let path = path.to_path_buf();
    let hashed = tokio::task::spawn_blocking(move || std::fs::read(path));
    match hashed.await {
        Ok(Ok(bytes)) => qe_shared::hex(&sha2::Sha256::digest(bytes)) == sha256,
        _ => false,
    }
}

/// Why `binary` cannot run on this machine: not ELF, or built for another CPU.
fn not_runnable_here(binary: &[u8]) -> Option<String> {
    let here = std::env::consts::ARCH;
    match qe_shared::build::architecture(binary) {
        Ok(built_for) if built_for == here => None,
        Ok(built_for) => Some(format!(
            "it is not built for {here} (it is for {built_for})"
        )),
        Err(why) => Some(why),
    }
}

/// Writes `bytes` to `path` whole (beside it first, synced, renamed, the rename synced),
/// executable by the node's user alone.
fn write_executable(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_whole(path, bytes, 0o700)
}

/// Removes fetched builds other than `keep` and the one running.
fn remove_other_builds(dir: &Path, keep: &str, data_dir: &Path) {
    let running = fetched_build_running(data_dir);
    let selected = read_name(&dir.join("selected"));
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name();
        let Some(sha256) = name.to_str().and_then(|name| name.strip_prefix(PREFIX)) else {
            continue;
        };
        let sha256 = sha256.trim_end_matches(".new");
        let kept = [Some(keep), running.as_deref(), selected.as_deref()];
        if !kept.contains(&Some(sha256)) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Puts `ready` on trial and replaces this process with it, with the same arguments. Returns
/// only if that failed (the build is then refused).
pub fn exec_into(data_dir: &Path, ready: &Ready) -> std::io::Error {
    use std::os::unix::process::CommandExt;
    let dir = builds_dir(data_dir);
    // A fetched build still on trial has served and confirmed its config (a new one comes
    // only after that): it is the one to come back to if the next does not stay up.
    if let Some(running) = fetched_build_running(data_dir) {
        if let Err(error) = select_if_on_trial(&dir, &running) {
            return error;
        }
    }
    if let Err(error) = write_private(&dir.join("trying"), ready.sha256.as_bytes()) {
        return error;
    }
    tracing::info!(build = %ready.sha256, "restarting into a new build");
    let error = std::process::Command::new(&ready.path)
        .args(std::env::args_os().skip(1))
        .exec();
    match error.kind() {
        // Gone (removed meanwhile): fetched again by the next start, not refused.
        std::io::ErrorKind::NotFound => {
            let _ = std::fs::remove_file(dir.join("trying"));
        }
        _ => refuse(
            &dir,
            &ready.sha256,
            &format!("it could not be run: {error}"),
        ),
    }
    error
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_elf_binaries_of_this_machine_run() {
        let own = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(not_runnable_here(&own), None);
        assert!(not_runnable_here(b"#!/bin/sh\nexit 0\n").is_some());
        // The same binary marked as built for the other CPU nodes run on.
        let mut other = own[..64].to_vec();
        let other_machine: u16 = match std::env::consts::ARCH {
            "x86_64" => 0xb7,
            _ => 0x3e,
        };
        other[18..20].copy_from_slice(&other_machine.to_le_bytes());
        assert!(not_runnable_here(&other).unwrap().contains("not built for"));
    }

    #[test]
    fn a_trial_that_ends_in_a_start_refuses_the_build() {
        let data = tempfile::tempdir().unwrap();
        let dir = builds_dir(data.path());
        std::fs::create_dir_all(&dir).unwrap();
        let sha = "a".repeat(64);
        std::fs::write(binary(&dir, &sha), b"x").unwrap();
        std::fs::write(dir.join("trying"), &sha).unwrap();
        std::fs::write(dir.join("selected"), &sha).unwrap();
        assert_eq!(at_start(data.path()), None);
        let refused = last_refused(data.path()).unwrap();
        assert_eq!(refused.binary_sha256, sha);
        assert!(
            refused.reason.contains("did not stay up"),
            "{}",
            refused.reason
        );
        assert!(!dir.join("trying").exists() && !dir.join("selected").exists());
        assert!(!binary(&dir, &sha).exists());
    }

    #[test]
    fn a_build_on_trial_is_selected_once_it_passed_and_no_other_is() {
        let data = tempfile::tempdir().unwrap();
        let dir = builds_dir(data.path());
        std::fs::create_dir_all(&dir).unwrap();
        let (on_trial, other) = ("b".repeat(64), "c".repeat(64));
        std::fs::write(dir.join("trying"), &on_trial).unwrap();
        assert!(!select_if_on_trial(&dir, &other).unwrap());
        assert_eq!(read_name(&dir.join("selected")), None);
        assert!(select_if_on_trial(&dir, &on_trial).unwrap());
        assert_eq!(read_name(&dir.join("selected")), Some(on_trial));
        assert!(!dir.join("trying").exists());
    }

    #[test]
    fn a_selected_build_runs_until_it_keeps_failing_or_its_file_changed() {
        let data = tempfile::tempdir().unwrap();
        let dir = builds_dir(data.path());
        std::fs::create_dir_all(&dir).unwrap();
        let body = b"\x7fELF build".to_vec();
        let sha = qe_shared::hex(&sha2::Sha256::digest(&body));
        std::fs::write(binary(&dir, &sha), &body).unwrap();
        std::fs::write(dir.join("selected"), &sha).unwrap();
        let ready = Ready {
            sha256: sha.clone(),
            path: binary(&dir, &sha),
        };
        // Each start counts, until one lasts (or stops cleanly): the count starts again.
        for starts in 1..=UNSTABLE_STARTS {
            assert_eq!(at_start(data.path()), Some(ready.clone()));
            assert_eq!(read_starts(&dir), starts);
        }
        reset_starts(&dir);
        assert_eq!(at_start(data.path()), Some(ready.clone()));
        assert_eq!(read_starts(&dir), 1);
        // Started again and again without lasting: refused, the installed build serves.
        for _ in 1..UNSTABLE_STARTS {
            assert_eq!(at_start(data.path()), Some(ready.clone()));
        }
        assert_eq!(at_start(data.path()), None);
        let refused = last_refused(data.path()).unwrap();
        assert!(
            refused.reason.contains("times in a row"),
            "{}",
            refused.reason
        );
        assert_eq!(read_name(&dir.join("selected")), None);

        // Changed on disk since it was selected: refused, not run.
        let other = b"\x7fELF other build".to_vec();
        let other_sha = qe_shared::hex(&sha2::Sha256::digest(&other));
        std::fs::write(binary(&dir, &other_sha), b"\x7fELF tampered").unwrap();
        std::fs::write(dir.join("selected"), &other_sha).unwrap();
        assert_eq!(at_start(data.path()), None);
        assert!(last_refused(data.path())
            .unwrap()
            .reason
            .contains("does not match"));
    }
}
