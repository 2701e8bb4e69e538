//! A node stops cleanly on SIGTERM whenever it comes, also while it is still starting: its
//! control plane may delete a queue the moment its node says it serves, and a node killed by
//! the signal's default action would never send its last usage record.

use qe_tests::{dataplane_binary, signal, PROMPT};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// Waits until `child` logs `needle`, sends it SIGTERM, and asserts it then exits by itself
/// (status 0), not by the signal's default action.
fn stops_cleanly_on_sigterm_once_it_logs(mut child: Child, needle: &str) {
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut log = String::new();
    while !log.contains(needle) {
        let mut line = String::new();
        assert_ne!(
            stderr.read_line(&mut line).unwrap(),
            0,
            "exited early:\n{log}"
        );
        log.push_str(&line);
    }
    signal(child.id(), libc::SIGTERM);
    let (exited_tx, exited) = std::sync::mpsc::channel();
    std::thread::spawn(move || exited_tx.send(child.wait().unwrap()).unwrap());
    let status = exited.recv_timeout(PROMPT).expect("it stops on SIGTERM");
    assert_eq!(status.code(), Some(0), "{status:?}\n{log}");
}

#[test]
fn a_sigterm_while_the_node_waits_for_its_first_config_stops_it_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let bootstrap = dir.path().join("bootstrap.toml");
    // A control plane that is not there: the node asks for its config again and again.
    std::fs::write(
        &bootstrap,
        "control_plane = \"http://127.0.0.1:9\"\nqueue_id = \"q\"\nnode_token = \"t\"\n",
    )
    .unwrap();
    let child = Command::new(dataplane_binary())
        .arg("--bootstrap")
        .arg(&bootstrap)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    stops_cleanly_on_sigterm_once_it_logs(child, "no config from the control plane yet");
}

#[test]
fn a_sigterm_while_the_node_waits_for_its_certificate_stops_it_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("node.toml");
    // A control plane that is not there: the node waits for its certificate, retrying.
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\nlisten = [\"127.0.0.1:0\"]\ntls_from_control_plane = true\n\
             control_plane = \"http://127.0.0.1:9\"\nqueue_id = \"q\"\nnode_token = \"t\"\n",
            dir.path().join("data")
        ),
    )
    .unwrap();
    let child = Command::new(dataplane_binary())
        .arg("--config")
        .arg(&config)
        .args([
            "--publisher",
            "p:p",
            "--subscriber",
            "s:s",
            "--admin",
            "a:a",
        ])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    stops_cleanly_on_sigterm_once_it_logs(child, "no certificate from the control plane yet");
}

#[test]
fn a_cloud_bootstrap_without_its_node_token_on_the_volume_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let bootstrap = dir.path().join("bootstrap.toml");
    // As a cloud node's user data writes it: a bootstrap token, no node token.
    std::fs::write(
        &bootstrap,
        "control_plane = \"http://127.0.0.1:9\"\nqueue_id = \"q\"\nbootstrap_token = \"1.ab\"\n",
    )
    .unwrap();
    let data = dir.path().join("data");
    let start = || {
        Command::new(dataplane_binary())
            .arg("--bootstrap")
            .arg(&bootstrap)
            .arg("--data-dir")
            .arg(&data)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let refused = start().wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{said}");
    assert!(said.contains("no node token"), "{said}");
    // With the node token its first boot kept on the volume, it starts (and waits for its
    // config from a control plane that is not there).
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("node-token"), "t").unwrap();
    stops_cleanly_on_sigterm_once_it_logs(start(), "no config from the control plane yet");
}
