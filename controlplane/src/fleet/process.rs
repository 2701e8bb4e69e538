//! A node's process as the local provider holds it: a child it started, or a node a previous
//! control plane started and this one adopted. Both can be waited on and killed; waiting on an
//! adopted node (not our child) goes through a pidfd, so it is an event, not a poll.

use super::FleetError;
use qe_shared::backoff::Backoff;
use std::future::Future;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::process::Child;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The wait before starting a process that exited; it doubles while starts fail.
const RESTART_AFTER: Duration = Duration::from_millis(200);
const RESTART_AFTER_AT_MOST: Duration = Duration::from_secs(30);

/// What starts a supervised process (a node, a standby) again.
pub trait Launch: Send + Sync + 'static {
    fn launch(&self) -> impl Future<Output = Result<NodeProcess, FleetError>> + Send;
    /// What it starts, for the log: `a node`, `a standby`.
    fn what(&self) -> &'static str;
    /// The directory it starts it in, for the log.
    fn dir(&self) -> &Path;
}

/// A process kept running: one that exits is started again, backing off while starts fail.
pub struct Supervised {
    /// Its process id now (a restart changes it).
    pid: Arc<AtomicU32>,
    /// Ends the supervision and the process, giving it this long to stop by itself.
    stop: oneshot::Sender<Duration>,
    supervisor: JoinHandle<()>,
}

impl Supervised {
    /// Supervises `child`, which `launcher` started (or which was adopted), from now on.
    pub fn start(child: NodeProcess, launcher: impl Launch) -> Supervised {
        let pid = Arc::new(AtomicU32::new(child.id()));
        let (stop, stopping) = oneshot::channel();
        let supervisor = tokio::spawn(supervise(child, launcher, pid.clone(), stopping));
        Supervised {
            pid,
            stop,
            supervisor,
        }
    }

    pub fn pid(&self) -> u32 {
        self.pid.load(Ordering::Relaxed)
    }

    /// Stops the process, giving it `grace` to stop by itself (none: killed), and the
    /// supervision with it.
    pub async fn stop(self, grace: Duration) {
        let _ = self.stop.send(grace);
        let _ = self.supervisor.await;
    }

    /// Ends the supervision, leaving the process running.
    pub fn let_go(self) {
        self.supervisor.abort();
    }
}

async fn supervise(
    mut child: NodeProcess,
    launcher: impl Launch,
    pid: Arc<AtomicU32>,
    mut stop: oneshot::Receiver<Duration>,
) {
    loop {
        tokio::select! {
            grace = &mut stop => {
                // A sender dropped unsent is a provider letting go: the process runs on.
                if let Ok(grace) = grace {
                    child.stop(grace).await;
                }
                return;
            }
            _ = child.exited() => {}
        }
        let mut backoff = Backoff::new(RESTART_AFTER, RESTART_AFTER_AT_MOST);
        child = loop {
            tokio::select! {
                _ = &mut stop => return,
                _ = tokio::time::sleep(backoff.next_wait()) => {}
            }
            match launcher.launch().await {
                Ok(child) => break child,
                Err(error) => {
                    tracing::error!(%error, "{} could not be restarted", launcher.what())
                }
            }
        };
        pid.store(child.id(), Ordering::Relaxed);
        tracing::info!(dir = %launcher.dir().display(), "{} was restarted", launcher.what());
    }
}

pub enum NodeProcess {
    Child(Child),
    Adopted { pid: u32, exit: AsyncFd<OwnedFd> },
}

/// Whether process `pid` has `wanted` among its arguments (false for one that is gone).
pub fn has_argument(pid: u32, wanted: &[u8]) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    cmdline.split(|b| *b == 0).any(|arg| arg == wanted)
}

/// Spawns `command` with its pid written to `pid_file` by the child itself, after the fork
/// and before it runs the program: a control plane killed at any moment leaves a process its
/// successor finds there ([`adopt_from`]). The pid was written by the parent once `spawn`
/// returned; a kill between the two left a node no pid file named, and the next leader
/// started a twin beside it every second, which could not take the orphan's port.
pub fn spawn_naming_itself(
    command: &mut tokio::process::Command,
    pid_file: &Path,
) -> std::io::Result<Child> {
    use std::os::fd::AsRawFd;
    let file = qe_shared::files::on_disk(|| std::fs::File::create(pid_file))?;
    let fd = file.as_raw_fd();
    // SAFETY: between the fork and the exec the child calls only getpid and write, both
    // async-signal-safe, and itoa's digits on its stack: no allocation and no lock. `fd` is open
    // in the child until the exec (close-on-exec), as `file` outlives the spawn.
    unsafe {
        command.pre_exec(move || {
            let mut buffer = itoa::Buffer::new();
            let digits = buffer.format(libc::getpid());
            let written = libc::write(fd, digits.as_ptr().cast(), digits.len());
            match written == digits.len() as isize {
                true => Ok(()),
                false => Err(std::io::Error::last_os_error()),
            }
        });
    }
    let child = command.spawn();
    drop(file);
    child
}

/// The process `pid_file` names, adopted if it runs with `marker` among its arguments
/// ([`NodeProcess::adopt`]).
pub fn adopt_from(pid_file: &Path, marker: &Path) -> Option<NodeProcess> {
    let pid = std::fs::read_to_string(pid_file)
        .ok()?
        .trim()
        .parse()
        .ok()?;
    NodeProcess::adopt(pid, marker)
}

/// Whether the process of pidfd `fd` has exited (the pidfd is readable then).
fn has_exited(fd: &OwnedFd) -> bool {
    use std::os::fd::AsRawFd;
    let mut poll = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd we own, and a timeout of 0: it only looks.
    let ready = unsafe { libc::poll(&mut poll, 1, 0) };
    ready != 0
}

impl NodeProcess {
    /// Adopts the running process `pid`, if it is the one started with `marker` among its
    /// arguments (a node's bootstrap, a standby's data directory).
    ///
    /// The pidfd is opened first, then the command line read, then the process checked to be
    /// alive still: so the command line read is the pidfd's process's, and a pid reused
    /// meanwhile by another process is never adopted (nor, later, signalled).
    pub fn adopt(pid: u32, marker: &Path) -> Option<NodeProcess> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if fd < 0 {
            return None;
        }
        // SAFETY: `fd` was just returned to us and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let wanted = marker.as_os_str().as_encoded_bytes();
        if !has_argument(pid, wanted) || has_exited(&fd) {
            return None;
        }
        // SAFETY: the OwnedFd is open and moves into the AsyncFd, which keeps it until dropped.
        let exit =
            unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }.ok()?;
        Some(NodeProcess::Adopted { pid, exit })
    }

    pub fn id(&self) -> u32 {
        match self {
            NodeProcess::Child(child) => child.id().unwrap_or(0),
            NodeProcess::Adopted { pid, .. } => *pid,
        }
    }

    /// Returns when the process has exited.
    pub async fn exited(&mut self) {
        match self {
            NodeProcess::Child(child) => {
                // One that stopped cleanly (asked to, or at the end of its work) is no news.
                match child.wait().await {
                    Ok(status) if status.success() => tracing::info!("a node stopped"),
                    status => tracing::warn!(?status, "a node exited"),
                }
            }
            // A pidfd becomes readable when its process exits.
            NodeProcess::Adopted { exit, pid } => {
                let _ = exit.readable().await;
                tracing::warn!(pid, "an adopted node exited");
            }
        }
    }

    /// SIGTERM (the node makes and reports its last usage record), then SIGKILL if it is
    /// still there after `grace`; no grace, SIGKILL at once.
    pub async fn stop(&mut self, grace: Duration) {
        if grace.is_zero() {
            self.signal(libc::SIGKILL);
            self.exited().await;
            return;
        }
        self.signal(libc::SIGTERM);
        if tokio::time::timeout(grace, self.exited()).await.is_err() {
            tracing::warn!(pid = self.id(), "a node ignored SIGTERM; killing it");
            self.signal(libc::SIGKILL);
            self.exited().await;
        }
    }

    fn signal(&self, signal: libc::c_int) {
        match self {
            NodeProcess::Child(child) => {
                if let Some(pid) = child.id() {
                    // SAFETY: kill takes a pid and a signal; the child is not reaped yet, so
                    // the pid is still its own.
                    unsafe { libc::kill(pid as libc::pid_t, signal) };
                }
            }
            NodeProcess::Adopted { exit, .. } => {
                use std::os::fd::AsRawFd;
                let fd = exit.get_ref().as_raw_fd();
                // Through the pidfd, so a reused pid is never signalled.
                // SAFETY: pidfd_send_signal takes our open pidfd, a signal, no info and no flags.
                unsafe {
                    libc::syscall(
                        libc::SYS_pidfd_send_signal,
                        fd,
                        signal,
                        std::ptr::null::<libc::siginfo_t>(),
                        0,
                    )
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_process_spawned_naming_itself_is_named_before_it_runs() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("node.pid");
        std::fs::write(&pid_file, "an earlier pid, longer than any").unwrap();
        // The program reads the pid file as it starts: it was written before it ran.
        let mut command = tokio::process::Command::new("sh");
        command
            .args(["-c", "cat \"$0\""])
            .arg(&pid_file)
            .stdout(std::process::Stdio::piped());
        let child = spawn_naming_itself(&mut command, &pid_file).unwrap();
        let pid = child.id().unwrap();
        let output = child.wait_with_output().await.unwrap();
        assert_eq!(String::from_utf8(output.stdout).unwrap(), pid.to_string());
        assert_eq!(std::fs::read_to_string(&pid_file).unwrap(), pid.to_string());
        let missing = dir.path().join("no/such/dir/node.pid");
        assert!(spawn_naming_itself(&mut tokio::process::Command::new("true"), &missing).is_err());
    }

    #[tokio::test]
    async fn only_a_live_process_started_with_the_bootstrap_is_adopted() {
        let bootstrap = Path::new("/tmp/qe-adopt-test/bootstrap.toml");
        // A shell that stays (two commands), with the path among its arguments.
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30; true", bootstrap.to_str().unwrap()])
            .spawn()
            .unwrap();
        let pid = child.id();
        // Its command line reads empty until its exec is through.
        while std::fs::read(format!("/proc/{pid}/cmdline"))
            .unwrap()
            .is_empty()
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(NodeProcess::adopt(pid, Path::new("/elsewhere/bootstrap.toml")).is_none());
        let mut adopted = NodeProcess::adopt(pid, bootstrap).expect("its own process");
        assert_eq!(adopted.id(), pid);
        child.kill().unwrap();
        // Exited, not yet reaped: its pid still names it, and it is not adopted.
        adopted.exited().await;
        assert!(
            NodeProcess::adopt(pid, bootstrap).is_none(),
            "an exited process"
        );
        child.wait().unwrap();
    }
}
