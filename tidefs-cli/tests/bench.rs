//! Goal: `tidefs bench recovery` runs the recovery experiment for every data mode and reports
//! each pass beside e2fsprogs' replay of the same journal. Method: a small run (few threads and
//! writes) through the built binary; the JSON must name every mode, show that recovery replayed
//! transactions, and carry the peer's time. No timing is asserted.

mod common;

use common::*;

/// Goal: the recovery bench reports every mode beside e2fsprogs' replay. Method: a tiny run, JSON
/// checked; no timing asserted.
#[test]
fn recovery_bench_reports_every_mode_and_the_peer() {
    if tool("mke2fs").is_none() || tool("e2fsck").is_none() {
        skip(
            "recovery_bench_reports_every_mode_and_the_peer",
            "e2fsprogs is not installed",
        );
        return;
    }
    let dir = tempfile::tempdir().expect("OK to unwrap: temp dir");
    let out = output(
        tidefs()
            .args([
                "bench",
                "recovery",
                "--threads",
                "4",
                "--writes",
                "5",
                "--runs",
                "1",
                "--json",
                "--dir",
            ])
            .arg(dir.path()),
    );
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let report: serde_json::Value =
        serde_json::from_str(&stdout(&out)).expect("OK to unwrap: JSON");
    let modes: Vec<&str> = report
        .as_array()
        .expect("OK to unwrap: array")
        .iter()
        .map(|m| m["mode"].as_str().expect("OK to unwrap: mode"))
        .collect();
    assert_eq!(modes, ["lightweight", "writeback", "ordered", "journal"]);
    for m in report.as_array().expect("OK to unwrap: array") {
        let run = &m["runs"][0];
        assert!(
            run["transactions"].as_u64().expect("OK to unwrap: number") > 0,
            "{m}"
        );
        assert!(
            run["blocks_replayed"]
                .as_u64()
                .expect("OK to unwrap: number")
                > 0,
            "{m}"
        );
        assert!(run["e2fsck_replay_ms"].as_f64().is_some(), "{m}");
    }
    let out = output(tidefs().args(["bench", "recovery", "--mode", "fast"]));
    assert_eq!(out.status.code(), Some(2), "stderr: {}", stderr(&out));
}
