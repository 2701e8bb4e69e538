//! An "EC2 instance" booted for real on this machine: `tests/instance/boot.py` runs the user
//! data the control plane gave EC2 (moto) in a network namespace of its own, with the queue's
//! volume a loop device; the real `dataplane` comes from the control plane, as on a cloud node.

use std::io::{BufRead, BufReader};
use std::net::Ipv6Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How long a boot may take: the first boot downloads a debug `dataplane` (about 140 MB).
const BOOT_WITHIN: Duration = Duration::from_secs(180);

pub struct Instance {
    name: String,
    state: PathBuf,
    child: Child,
    /// boot.py's stdout lines, read by a thread.
    lines: mpsc::Receiver<String>,
}

impl Instance {
    /// Boots `user_data` as instance `name` (a few lowercase letters and digits), EC2's
    /// `instance_id` (its metadata service says so), at `v6` (in a /64 whose host end is
    /// `host_v6`), with the queue's volume `volume_id` kept in `volume_file`; returns once its
    /// node runs.
    #[allow(clippy::too_many_arguments)]
    pub fn boot(
        name: &str,
        instance_id: &str,
        user_data: &str,
        volume_id: &str,
        volume_file: &Path,
        v6: Ipv6Addr,
        host_v6: Ipv6Addr,
        state: &Path,
    ) -> Instance {
        Instance::boot_beside(
            name,
            instance_id,
            user_data,
            volume_id,
            volume_file,
            v6,
            host_v6,
            state,
            &[],
        )
    }

    /// Boots as [`Instance::boot`] does, beside `peers` (each an instance booted before it, by
    /// name, and its address): this one and each of them reach each other directly, as two
    /// instances of one VPC do, while the host forwards nothing between instances. For a
    /// standby instance that must reach its primary.
    #[allow(clippy::too_many_arguments)]
    pub fn boot_beside(
        name: &str,
        instance_id: &str,
        user_data: &str,
        volume_id: &str,
        volume_file: &Path,
        v6: Ipv6Addr,
        host_v6: Ipv6Addr,
        state: &Path,
        peers: &[(&str, Ipv6Addr)],
    ) -> Instance {
        std::fs::create_dir_all(state).unwrap();
        let user_data_file = state.join("user-data");
        std::fs::write(&user_data_file, user_data).unwrap();
        let peer_args = peers
            .iter()
            .flat_map(|(peer, address)| ["--peer".to_string(), format!("{peer}={address}")]);
        let mut child = Command::new("python3")
            .arg(boot_py())
            .args([
                "--name",
                name,
                "--volume-id",
                volume_id,
                "--instance-id",
                instance_id,
                "--boot-timeout",
                "170",
            ])
            .arg("--user-data")
            .arg(&user_data_file)
            .arg("--volume-file")
            .arg(volume_file)
            .args([
                "--v6",
                &format!("{v6}/64"),
                "--host-v6",
                &host_v6.to_string(),
            ])
            .arg("--state")
            .arg(state)
            .args(peer_args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 tests/instance/boot.py");
        let lines = follow(child.stdout.take().unwrap());
        let mut instance = Instance {
            name: name.to_string(),
            state: state.to_path_buf(),
            child,
            lines,
        };
        let line = instance.next_line(BOOT_WITHIN);
        assert!(
            line.starts_with("booted pid="),
            "instance {name} did not boot: {line}\n{}",
            instance.log("first-boot.log")
        );
        instance
    }

    /// A file of its state directory (`node.log`, `first-boot.log`).
    pub fn log(&self, file: &str) -> String {
        std::fs::read_to_string(self.state.join(file)).unwrap_or_default()
    }

    /// Waits until its node's log has `needle` (the node writes it as it goes).
    pub fn wait_for_node_log(&self, needle: &str) {
        let deadline = std::time::Instant::now() + crate::PROMPT * 6;
        while !self.log("node.log").contains(needle) {
            assert!(
                std::time::Instant::now() < deadline,
                "{needle:?} not in the node's log:\n{}",
                self.log("node.log")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Cuts it off from `address` alone (a partition: the control plane unreachable, its
    /// clients and peers not): nothing it sends there leaves its namespace.
    pub fn cut_off_from(&self, address: Ipv6Addr) {
        let netns = format!("qe-{}", self.name);
        let unreachable = format!("{address}/128");
        ip(&[
            "-n",
            &netns,
            "-6",
            "route",
            "add",
            "unreachable",
            &unreachable,
        ]);
    }

    /// Cuts its network as a lost link would: the host end of its veth pair goes down, and so
    /// do its links to peers; the instance runs on reaching nobody (nor reached by anyone).
    pub fn lose_network(&self) {
        ip(&["link", "set", "dev", &format!("qeh-{}", self.name), "down"]);
        // Either end of a peer link will do: each peer link (to an instance booted beside this
        // one, or beside which this one was booted) has one in its netns, qep-* or qeq-*.
        let netns = format!("qe-{}", self.name);
        let shown = Command::new("ip")
            .args(["-n", &netns, "-o", "link", "show"])
            .output()
            .expect("ip");
        let shown = String::from_utf8_lossy(&shown.stdout);
        let links = shown
            .lines()
            .filter_map(|line| line.split(": ").nth(1)?.split('@').next())
            .filter(|link| link.starts_with("qep-") || link.starts_with("qeq-"));
        for link in links {
            ip(&["-n", &netns, "link", "set", "dev", link, "down"]);
        }
    }

    fn next_line(&mut self, within: Duration) -> String {
        match self.lines.recv_timeout(within) {
            Ok(line) => line,
            Err(_) => {
                let _ = self.child.kill();
                panic!(
                    "instance {}: nothing from boot.py within {within:?}\n{}",
                    self.name,
                    self.log("first-boot.log")
                )
            }
        }
    }

    /// Waits until its node exits on its own (a node that only hands over its last records,
    /// after which the instance powers off); returns boot.py's last word.
    pub fn wait_for_exit(mut self) -> String {
        let line = self.next_line(crate::PROMPT * 6);
        let _ = self.child.wait();
        line
    }

    /// Shuts it down as EC2 terminates an instance: the node gets SIGTERM (it reports its
    /// last records) and the instance is torn down. Returns boot.py's last word.
    pub fn terminate(mut self) -> String {
        crate::signal(self.child.id(), libc::SIGTERM);
        let line = self.next_line(Duration::from_secs(40));
        let _ = self.child.wait();
        line
    }
}

impl Drop for Instance {
    /// Killed abruptly (a lost instance), and nothing of it left behind.
    fn drop(&mut self) {
        let _ = Command::new("python3")
            .arg(boot_py())
            .args(["--cleanup", "--name", &self.name])
            .arg("--state")
            .arg(&self.state)
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `ip` with `args`; it must succeed.
/// An address of the host's own, on its loopback link, for as long as this lives: the
/// control plane's address in the instances' subnet (`moto::HOST_V6`) is otherwise only on the
/// host ends of the instances' links, and goes with the last of them, so that an instance in
/// another subnet (a standby's) could no longer reach the control plane once the one beside
/// it is killed. A VPC's route to the control plane does not depend on its other instances.
/// (The kernel here has no dummy links.)
pub struct HostAddress {
    address: String,
}

impl HostAddress {
    pub fn keep(address: Ipv6Addr) -> HostAddress {
        let address = format!("{address}/128");
        ip(&["-6", "addr", "replace", &address, "dev", "lo", "nodad"]);
        HostAddress { address }
    }
}

impl Drop for HostAddress {
    fn drop(&mut self) {
        let gone = ["-6", "addr", "del", &self.address, "dev", "lo"];
        let _ = Command::new("ip").args(gone).status();
    }
}

fn ip(args: &[&str]) {
    let status = Command::new("ip").args(args).status().expect("ip");
    assert!(status.success(), "ip {}", args.join(" "));
}

fn boot_py() -> PathBuf {
    crate::workspace().join("tests/instance/boot.py")
}

/// The lines of `stdout`, as they come.
fn follow(stdout: ChildStdout) -> mpsc::Receiver<String> {
    let (send, receive) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if send.send(line).is_err() {
                return;
            }
        }
    });
    receive
}
