//! `infra/` checked as it ships: `infra/check.py` renders the cloud-init template and checks it
//! (YAML, cloud-init's schema where installed, EC2's 16 KB), the units, the IAM policy and the
//! example config, and runs the rendered first-boot script against a loop device in a mount
//! namespace (first boot, a second run, a replacement, a wrong hash, a foreign filesystem).

#[test]
fn infra_check_passes() {
    let workspace = qe_tests::workspace();
    let python = workspace.join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/test",
        python.display()
    );
    let output = std::process::Command::new(python)
        .arg(workspace.join("infra/check.py"))
        .output()
        .expect("infra/check.py runs");
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && said.contains("all passed"),
        "{said}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
