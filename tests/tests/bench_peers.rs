//! `bench peers` as docs/performance.md runs issue 34's rows: our node over `ws://` and over
//! `wss://` (`dataplane-wss`) one after another in each row, and `scripts/peers-summary`
//! reading the table into medians and ratios. Short runs of the debug node: this checks
//! that the command and the summary work, not what they measure.

use qe_tests::{bench_binary, dataplane_binary, workspace};
use std::process::Command;

#[test]
fn peers_run_the_node_over_both_wires_in_each_row_and_the_summary_reads_them() {
    let data_root = tempfile::tempdir().unwrap();
    let output = Command::new(bench_binary())
        .arg("--dataplane")
        .arg(dataplane_binary())
        .arg("--data-root")
        .arg(data_root.path())
        .args([
            "peers",
            "--systems",
            "dataplane,dataplane-wss",
            "--workloads",
            "w1,w4",
        ])
        .args(["--sizes", "100", "--durabilities", "0", "--seconds", "1"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{table}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // Each row's systems one after another, in the order asked for.
    let systems: Vec<&str> = table
        .lines()
        .filter(|line| line.contains(" W1 ") || line.contains(" W4 "))
        .map(|line| line.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(
        systems,
        ["dataplane", "dataplane-wss", "dataplane", "dataplane-wss"],
        "{table}"
    );

    let summary = Command::new(workspace().join("scripts/peers-summary"))
        .arg(data_root.path().join("missing"))
        .output()
        .unwrap();
    assert!(
        !summary.status.success(),
        "a file that is not there is an error"
    );
    let table_file = data_root.path().join("table.txt");
    std::fs::write(&table_file, table.as_bytes()).unwrap();
    let summary = Command::new(workspace().join("scripts/peers-summary"))
        .arg(&table_file)
        .output()
        .unwrap();
    let summary = String::from_utf8_lossy(&summary.stdout);
    for row in ["dataplane     W1    0    1", "dataplane-wss W4    0    1"] {
        assert!(summary.contains(row), "{row:?} in\n{summary}");
    }
    for ratio in ["W1 d0: wss/ws cpu ", "W4 d0: wss/ws cpu "] {
        assert!(summary.contains(ratio), "{ratio:?} in\n{summary}");
    }
}
