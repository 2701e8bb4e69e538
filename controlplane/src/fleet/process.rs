//! A node's process as the local provider holds it: a child it started, or a node a previous
//! control plane started and this one adopted. Both can be waited on and killed; waiting on an
//! adopted node (not our child) goes through a pidfd, so it is an event, not a poll.

use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::process::Child;

pub enum NodeProcess {
    Child(Child),
    Adopted { pid: u32, exit: AsyncFd<OwnedFd> },
}

impl NodeProcess {
    /// Adopts the running process `pid`, if it is the node started with `bootstrap`.
    pub fn adopt(pid: u32, bootstrap: &Path) -> Option<NodeProcess> {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let wanted = bootstrap.as_os_str().as_encoded_bytes();
        if !cmdline.split(|b| *b == 0).any(|arg| arg == wanted) {
            return None;
        }
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if fd < 0 {
            return None;
        }
        // SAFETY: `fd` was just returned to us and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
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
