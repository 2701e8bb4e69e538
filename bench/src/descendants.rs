//! The processes the bench started do not outlive a panic. The release profile aborts on a
//! panic (`panic = "abort"`), so no `Drop` runs: the nodes, peers, control planes and etcd
//! members the bench started would go on running, holding their ports and cores, and skew
//! the next measurement. The hook kills every process descended from the bench first.

/// Installs the hook; the default one still prints the panic first. A build that unwinds
/// (debug) needs none: its `Drop`s run, and a panic a task's handle catches is no end.
pub fn killed_on_panic() {
    if cfg!(not(panic = "abort")) {
        return;
    }
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        for pid in descendants_of(std::process::id()) {
            // SAFETY: `kill` takes any pid and signal; a process that has gone already gives
            // ESRCH, which changes nothing.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        }
    }));
}

/// Every process whose parent, or its parent, and so on, is `root`.
fn descendants_of(root: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .filter_map(|pid: u32| Some((pid, parent_of(pid)?)))
        .collect();
    let mut found = vec![root];
    let mut next = 0;
    while next < found.len() {
        let parent = found[next];
        found.extend(
            parents
                .iter()
                .filter(|(_, p)| *p == parent)
                .map(|(pid, _)| pid),
        );
        next += 1;
    }
    found.split_off(1)
}

/// The parent's pid, from `/proc/PID/stat` (the field after the state, which follows the
/// name's closing parenthesis: a name may hold spaces and parentheses itself).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_and_its_child_are_found() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & wait"])
            .spawn()
            .unwrap();
        let me = std::process::id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let grandchild = loop {
            let found = descendants_of(me);
            let of_child = found
                .iter()
                .find(|&&pid| parent_of(pid) == Some(child.id()));
            if let Some(&pid) = of_child {
                break pid;
            }
            assert!(std::time::Instant::now() < deadline, "sh started no sleep");
            std::thread::sleep(std::time::Duration::from_millis(1));
        };
        assert!(descendants_of(me).contains(&child.id()));
        assert_eq!(parent_of(grandchild), Some(child.id()));
        child.kill().unwrap();
        child.wait().unwrap();
        let killed = std::process::Command::new("kill")
            .arg(grandchild.to_string())
            .status();
        assert!(killed.unwrap().success());
    }
}
