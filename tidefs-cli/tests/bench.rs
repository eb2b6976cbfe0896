//! Goal: every `tidefs bench` subcommand runs its systems side by side and reports the shape
//! its documentation promises. Method: tiny runs through the built binary (recovery, burst with
//! its probe, postmark, sqlite in every phase and in its split configuration, streams paced and
//! in a burst); the JSON and the printed table must name every system, thread count, stream
//! count, journal mode or phase, carry the ratio to ext4 `data=ordered` where the benchmark
//! compares, and the SVG plot must exist. Bad `--systems` lists and bad options are usage
//! errors. No timing is asserted.

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
    assert_eq!(
        modes,
        [
            "lightweight",
            "writeback",
            "ordered",
            "journal",
            "wasteless",
            "selective"
        ]
    );
    for m in report.as_array().expect("OK to unwrap: array") {
        let run = &m["runs"][0];
        assert!(
            run["transactions"].as_u64().expect("OK to unwrap: number") > 0,
            "{m}"
        );
        // Lightweight appends journal nothing once the log's copies of their inodes are home
        // (a create's commit logs them, and a lightweight commit then checkpoints them).
        if m["mode"].as_str() != Some("lightweight") {
            assert!(
                run["blocks_replayed"]
                    .as_u64()
                    .expect("OK to unwrap: number")
                    > 0,
                "{m}"
            );
        }
        // e2fsprogs refuses to replay a journal with tidefs's extension records.
        let extensions = matches!(m["mode"].as_str(), Some("wasteless" | "selective"));
        assert_eq!(
            run["e2fsck_refuses_extension_records"].as_bool(),
            Some(extensions),
            "{m}"
        );
        assert_eq!(
            run["e2fsck_replay_ms"].as_f64().is_some(),
            !extensions,
            "{m}"
        );
        if extensions {
            assert!(run["range_records"].as_u64().unwrap_or(0) > 0, "{m}");
        }
    }
    let out = output(tidefs().args(["bench", "recovery", "--mode", "fast"]));
    assert_eq!(out.status.code(), Some(2), "stderr: {}", stderr(&out));
}

/// Why the benchmarks that set up loop devices and kernel mounts cannot run here, if they
/// cannot (through [`skip`], which fails in CI).
fn bench_skip(test: &str) -> bool {
    if let Some(why) = mount_skip_reason() {
        skip(test, &why);
        return true;
    }
    if !need_root(test, "loop devices and kernel mounts") {
        return true;
    }
    if tool("losetup").is_none() || tool("mkfs.ext4").is_none() {
        skip(test, "losetup (util-linux mount) or mkfs.ext4 is missing");
        return true;
    }
    false
}

/// Runs `tidefs bench ARGS` on 128 MiB images under `dir`, which must succeed; returns its
/// table (stdout) and the JSON it wrote.
fn run_bench(dir: &std::path::Path, args: &[&str]) -> (String, serde_json::Value) {
    let json = dir.join("report.json");
    let out = output(
        tidefs()
            .arg("bench")
            .args(args)
            .args(["--size", "128M", "--dir"])
            .arg(dir.join("work"))
            .arg("--json")
            .arg(&json),
    );
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    let text = std::fs::read_to_string(&json).expect("OK to unwrap: the bench wrote its JSON");
    let report = serde_json::from_str(&text).expect("OK to unwrap: JSON");
    (stdout(&out), report)
}

/// The strings at `key` of each element of `array`.
fn names<'a>(array: &'a serde_json::Value, key: &str) -> Vec<&'a str> {
    array
        .as_array()
        .expect("OK to unwrap: array")
        .iter()
        .map(|r| r[key].as_str().expect("OK to unwrap: string"))
        .collect()
}

/// Every row has a positive `figure` and a ratio to ext4:ordered (`ratio_to_ext4_ordered`
/// unless `ratio` names another field), which is 1 on its own row.
fn assert_compared(rows: &serde_json::Value, figure: &str) {
    assert_compared_by(rows, figure, "ratio_to_ext4_ordered");
}

/// [`assert_compared`] with the ratio in the field `ratio`.
fn assert_compared_by(rows: &serde_json::Value, figure: &str, ratio: &str) {
    for row in rows.as_array().expect("OK to unwrap: array") {
        let value = row[figure].as_f64().expect("OK to unwrap: a number");
        assert!(value > 0.0, "{row}");
        let ratio = row[ratio].as_f64();
        assert!(ratio.is_some(), "{row}");
        if row["system"] == "ext4:ordered" {
            assert_eq!(ratio, Some(1.0), "{row}");
        }
    }
}

/// Goal: burst measures FUSE, embedded and kernel systems at each thread count in one run, and
/// the probe compares FUSE with ext4. Method: 2 ops per thread at 1 and 2 threads, a probe
/// directory of 50 names; table, JSON and SVG checked; no timing asserted.
#[test]
fn burst_reports_every_system_thread_count_and_probe() {
    let test = "burst_reports_every_system_thread_count_and_probe";
    if bench_skip(test) {
        return;
    }
    let dir = tempfile::tempdir().expect("OK to unwrap: temp dir");
    let svg = dir.path().join("burst.svg");
    let (text, report) = run_bench(
        dir.path(),
        &[
            "burst",
            "--threads",
            "1,2",
            "--ops",
            "2",
            "--systems",
            "tidefs:ordered,tidefs-embedded:journal,ext4:ordered",
            "--probe",
            "--probe-threads",
            "2",
            "--probe-entries",
            "50",
            "--plot",
            svg.to_str().expect("OK to unwrap: temp paths are UTF-8"),
        ],
    );
    for header in [
        "system",
        "threads",
        "ops/s",
        "p99",
        "commits",
        "vs ext4:ordered",
    ] {
        assert!(text.contains(header), "no column {header}:\n{text}");
    }
    let rows = &report["rows"];
    assert_eq!(
        names(rows, "system"),
        [
            "tidefs:ordered",
            "tidefs-embedded:journal",
            "ext4:ordered",
            "tidefs:ordered",
            "tidefs-embedded:journal",
            "ext4:ordered"
        ]
    );
    for row in rows.as_array().expect("OK to unwrap: array") {
        let threads = row["threads"].as_u64().expect("OK to unwrap: threads");
        assert!(threads == 1 || threads == 2, "{row}");
        // Every operation of every thread is counted and timed.
        assert_eq!(row["latency"]["count"].as_u64(), Some(2 * threads), "{row}");
        // tidefs and the kernel's jbd2 both count their commits.
        assert!(row["commits"].as_u64().is_some(), "{row}");
    }
    assert_compared(rows, "ops_per_s");
    // The embedded system has no path to probe.
    assert_eq!(
        names(&report["probe"], "system"),
        ["tidefs:ordered", "ext4:ordered"]
    );
    for probe in report["probe"].as_array().expect("OK to unwrap: array") {
        assert!(
            probe["probe"]["count"]
                .as_u64()
                .expect("OK to unwrap: count")
                > 0,
            "{probe}"
        );
        assert!(
            probe["p99_ratio_to_ext4_ordered"].as_f64().is_some(),
            "{probe}"
        );
    }
    assert_plot(
        &svg,
        &["tidefs:ordered", "tidefs-embedded:journal", "ext4:ordered"],
    );
}

/// Goal: postmark runs one configuration on tidefs, the kernel's ext4 and fuse2fs and reports
/// transactions/s, time, device bytes and the ratio. Method: 20 files, 50 transactions.
#[test]
fn postmark_reports_every_system() {
    let test = "postmark_reports_every_system";
    if bench_skip(test) {
        return;
    }
    if tool("postmark").is_none() || tool("fuse2fs").is_none() {
        skip(
            test,
            "postmark or fuse2fs is not installed (scripts/install-deps.sh)",
        );
        return;
    }
    let dir = tempfile::tempdir().expect("OK to unwrap: temp dir");
    let (text, report) = run_bench(
        dir.path(),
        &[
            "postmark",
            "--files",
            "20",
            "--transactions",
            "50",
            "--systems",
            "tidefs:writeback,ext4:ordered,fuse2fs",
        ],
    );
    for header in [
        "tx/s",
        "total s",
        "dev MB written",
        "of which journal",
        "FUSE req/tx",
        "vs ext4:ordered",
    ] {
        assert!(text.contains(header), "no column {header}:\n{text}");
    }
    assert_eq!(
        names(&report["rows"], "system"),
        ["tidefs:writeback", "ext4:ordered", "fuse2fs"]
    );
    assert_compared(&report["rows"], "transactions_per_s");
    // The journals are on their own devices; fuse2fs has none.
    for row in report["rows"].as_array().expect("OK to unwrap: array") {
        let journal = row["journal_bytes_written"].as_f64();
        if row["system"] == "fuse2fs" {
            assert_eq!(journal, None, "{row}");
        } else {
            assert!(journal.is_some_and(|j| j > 0.0), "{row}");
        }
        // Only the tidefs daemon counts its FUSE requests: every transaction takes some.
        let requests = row["fuse_requests_per_transaction"].as_f64();
        if row["system"] == "tidefs:writeback" {
            assert!(requests.is_some_and(|r| r >= 1.0), "{row}");
        } else {
            assert_eq!(requests, None, "{row}");
        }
    }
}

/// The rows a sqlite report must have, in order: for each of `modes`, for each phase and then
/// the total, every one of `systems`.
fn sqlite_row_keys<'a>(modes: &[&'a str], systems: &[&'a str]) -> Vec<(&'a str, &'a str, &'a str)> {
    let mut keys = Vec::new();
    for &mode in modes {
        for phase in ["insert", "update", "delete", "total"] {
            for &system in systems {
                keys.push((mode, phase, system));
            }
        }
    }
    keys
}

/// Runs sqlite with 5 transactions per phase in `modes` on `systems` with a plot, and checks
/// the report: its rows are [`sqlite_row_keys`], each phase counts its transactions (the total
/// three times as many), every row is compared in time with ext4:ordered's, the table shows
/// the columns and the plot names every system, phase and journal mode. Returns the JSON.
fn run_sqlite(modes: &[&str], systems: &[&str]) -> serde_json::Value {
    const OPS: u64 = 5;
    let dir = tempfile::tempdir().expect("OK to unwrap: temp dir");
    let svg = dir.path().join("sqlite.svg");
    let (text, report) = run_bench(
        dir.path(),
        &[
            "sqlite",
            "--ops",
            &OPS.to_string(),
            "--journal-modes",
            &modes.join(","),
            "--systems",
            &systems.join(","),
            "--plot",
            svg.to_str().expect("OK to unwrap: temp paths are UTF-8"),
        ],
    );
    for header in [
        "txn/s",
        "seconds",
        "dev B/txn",
        "commits/txn",
        "FUSE req/txn",
        "time vs ext4:ordered",
    ] {
        assert!(text.contains(header), "no column {header}:\n{text}");
    }
    let rows = &report["rows"];
    let keys: Vec<(&str, &str, &str)> = rows
        .as_array()
        .expect("OK to unwrap: array")
        .iter()
        .map(|r| {
            let key = |k: &str| r[k].as_str().expect("OK to unwrap: string");
            (key("journal_mode"), key("phase"), key("system"))
        })
        .collect();
    assert_eq!(keys, sqlite_row_keys(modes, systems));
    for row in rows.as_array().expect("OK to unwrap: array") {
        let expected = if row["phase"] == "total" {
            3 * OPS
        } else {
            OPS
        };
        assert_eq!(row["transactions"].as_u64(), Some(expected), "{row}");
        assert!(
            row["transactions_per_s"].as_f64().is_some_and(|t| t > 0.0),
            "{row}"
        );
        // tidefs and the kernel's jbd2 both count their commits.
        assert!(row["commits_per_transaction"].as_f64().is_some(), "{row}");
        // Only the tidefs daemon counts its FUSE requests; a transaction takes several.
        let requests = row["fuse_requests_per_transaction"].as_f64();
        if row["system"]
            .as_str()
            .is_some_and(|s| s.starts_with("tidefs:"))
        {
            assert!(requests.is_some_and(|r| r >= 3.0), "{row}");
        } else {
            assert!(requests.is_none(), "{row}");
        }
    }
    assert_compared_by(rows, "seconds", "time_ratio_to_ext4_ordered");
    assert_eq!(names(&report["systems"], "system"), systems);
    assert_eq!(report["vfs"], "tidefs-split");
    assert_plot(&svg, systems);
    let plot = std::fs::read_to_string(&svg).expect("OK to unwrap: the plot exists");
    let modes = modes
        .iter()
        .map(|m| format!("journal_mode={}", m.to_uppercase()));
    for label in ["insert", "update", "delete"]
        .map(String::from)
        .into_iter()
        .chain(modes)
    {
        assert!(plot.contains(&label), "the plot shows {label}");
    }
    report
}

/// Goal: sqlite times inserts, updates and deletes, each phase and in total, in both journal
/// modes on each system, compared in time with ext4 `data=ordered` in the same mode and phase,
/// and plots the seconds as bars. Method: 5 transactions per phase; table, JSON and SVG checked.
#[test]
fn sqlite_reports_every_phase_and_journal_mode() {
    if bench_skip("sqlite_reports_every_phase_and_journal_mode") {
        return;
    }
    let report = run_sqlite(&["delete", "wal"], &["tidefs:ordered", "ext4:ordered"]);
    for system in report["systems"].as_array().expect("OK to unwrap: array") {
        assert_eq!(
            system["directory_modes"],
            serde_json::Value::Null,
            "{system}"
        );
    }
}

/// Goal: `tidefs:split` keeps the database in a `journal` mode directory and SQLite's rollback
/// journal in a `lightweight` one on a tidefs mount, set through `user.tidefs.journal`, and is
/// compared with tidefs:journal and ext4. Method: 5 transactions per phase in the rollback
/// journal mode; the bench itself checks that both directories and a new file in each read
/// their mode back, and fails otherwise; the plot of one journal mode names it in its title.
#[test]
fn sqlite_split_runs_with_per_directory_modes() {
    if bench_skip("sqlite_split_runs_with_per_directory_modes") {
        return;
    }
    let report = run_sqlite(
        &["delete"],
        &["tidefs:split", "tidefs:journal", "ext4:ordered"],
    );
    let split = &report["systems"][0];
    assert_eq!(split["mounted"], "tidefs:journal", "{split}");
    assert_eq!(
        split["directory_modes"],
        serde_json::json!({"database": "journal", "journal": "lightweight"})
    );
}

/// Goal: a bad `--systems` list is a usage error (exit 2) naming the problem, before anything
/// is set up. Method: an unknown name, an embedded system where a path is needed, an empty list.
#[test]
fn bench_systems_lists_are_checked() {
    for (args, expected) in [
        (
            &["burst", "--systems", "ext5:ordered"][..],
            "unknown system 'ext5:ordered'",
        ),
        (
            &["postmark", "--systems", "tidefs-embedded:ordered"][..],
            "mounted path",
        ),
        (&["sqlite", "--systems", ","][..], "names no system"),
        (&["sqlite", "--systems", "tidefs:splat"][..], "data=splat"),
        (
            &["sqlite", "--journal-modes", "truncate"][..],
            "unknown journal mode",
        ),
        (&["burst", "--threads", "0"][..], "positive"),
    ] {
        let out = output(tidefs().arg("bench").args(args));
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(expected),
            "{args:?}: {}",
            stderr(&out)
        );
    }
}

/// The SVG at `path` exists and its legends name every one of `systems`.
fn assert_plot(path: &std::path::Path, systems: &[&str]) {
    let plot = std::fs::read_to_string(path).expect("OK to unwrap: the plot exists");
    assert!(
        plot.starts_with("<svg"),
        "not an SVG: {}",
        &plot[..plot.len().min(80)]
    );
    for system in systems {
        assert!(plot.contains(system), "the legend names {system}");
    }
}

/// Checks the rows of a streams report: the `systems` at each of `streams`, in that order,
/// bytes per app byte positive and finite (journal bytes where a journal device exists),
/// records timed, commits counted.
fn assert_streams_rows(report: &serde_json::Value, systems: &[&str], streams: &[u64]) {
    let rows = &report["rows"];
    let expected: Vec<&str> = streams
        .iter()
        .flat_map(|_| systems.iter().copied())
        .collect();
    assert_eq!(names(rows, "system"), expected);
    for (i, row) in rows
        .as_array()
        .expect("OK to unwrap: array")
        .iter()
        .enumerate()
    {
        assert_eq!(
            row["streams"].as_u64(),
            Some(streams[i / systems.len()]),
            "{row}"
        );
        for key in ["journal_bytes_per_app_byte", "home_bytes_per_app_byte"] {
            let value = row[key].as_f64().expect("OK to unwrap: a number");
            assert!(value.is_finite() && value > 0.0, "{key}: {row}");
        }
        assert!(
            row["latency"]["count"].as_u64().is_some_and(|c| c > 0),
            "{row}"
        );
        assert!(row["ops_per_s"].as_f64().is_some_and(|o| o > 0.0), "{row}");
        assert!(row["commits"].as_u64().is_some(), "{row}");
        assert!(row["cpu_s"].as_f64().is_some(), "{row}");
    }
    for cell in report["cells"].as_array().expect("OK to unwrap: array") {
        let app = cell["app_bytes"].as_u64().expect("OK to unwrap: app bytes");
        let journal = cell["traffic"]["journal"]["bytes_written"].as_u64();
        assert!(app > 0 && journal.is_some_and(|j| j > 0), "{cell}");
    }
}

/// Goal: streams measures FUSE, embedded and kernel systems with their journals on their own
/// devices, paced and in a burst, and reports bytes per app byte, latency, commits and CPU.
/// Method: 4 paced streams at 10 Kbit/s for 2 s (table, JSON and the SVG checked); then a
/// 1-second burst at 1 and 2 streams on two systems. No timing asserted.
#[test]
fn streams_reports_every_system() {
    let test = "streams_reports_every_system";
    if bench_skip(test) {
        return;
    }
    let systems = ["tidefs:ordered", "tidefs-embedded:journal", "ext4:ordered"];
    let dir = tempfile::tempdir().expect("OK to unwrap: temp dir");
    let svg = dir.path().join("streams.svg");
    let (text, report) = run_bench(
        dir.path(),
        &[
            "streams",
            "--rate",
            "10K",
            "--streams",
            "4",
            "--seconds",
            "2",
            "--systems",
            &systems.join(","),
            "--plot",
            svg.to_str().expect("OK to unwrap: temp paths are UTF-8"),
        ],
    );
    for header in [
        "journal B/app B",
        "home B/app B",
        "ops/s",
        "p50",
        "p99",
        "max",
        "commits",
        "cpu s",
    ] {
        assert!(text.contains(header), "no column {header}:\n{text}");
    }
    for system in systems {
        assert!(text.contains(system), "no row {system}:\n{text}");
    }
    assert_eq!(report["workload"]["mode"], "paced");
    assert_eq!(report["workload"]["record_size"], 125);
    assert_streams_rows(&report, &systems, &[4]);
    for row in report["rows"].as_array().expect("OK to unwrap: array") {
        assert!(row["lateness_p99_us"].as_u64().is_some(), "{row}");
    }
    assert_plot(&svg, &systems);

    let systems = ["tidefs-embedded:ordered", "ext4:fast_commit"];
    let dir = tempfile::tempdir().expect("OK to unwrap: temp dir");
    let (_, report) = run_bench(
        dir.path(),
        &[
            "streams",
            "--burst",
            "125",
            "--streams",
            "1,2",
            "--seconds",
            "1",
            "--systems",
            &systems.join(","),
        ],
    );
    assert_eq!(report["workload"]["mode"], "burst");
    assert_streams_rows(&report, &systems, &[1, 2]);
}

/// Goal: streams refuses bad options with a usage error (exit 2) that names the problem,
/// before anything is set up; a tidefs mode is refused in tidefs' own words.
#[test]
fn streams_options_are_checked() {
    for (args, expected) in [
        (&["--rate", "5X"][..], "'5X' is not a bit rate"),
        (&["--systems", "nosuch"][..], "unknown system 'nosuch'"),
        (&["--systems", "tidefs:nosuch"][..], "data=nosuch"),
        (&["--streams", "0"][..], "--streams needs positive counts"),
        (&["--streams", "4,x"][..], "invalid value 'x'"),
        (&["--burst", "0"][..], "--burst needs a positive size"),
        (
            &["--rate", "1K", "--burst", "125"][..],
            "cannot be used with",
        ),
        (&["--seconds", "0"][..], "--seconds must be positive"),
    ] {
        let out = output(tidefs().args(["bench", "streams"]).args(args));
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(expected),
            "{args:?}: {}",
            stderr(&out)
        );
    }
}

/// Goal: the checkpoint bench writes one file per rank on tidefs, the kernel's ext4 and
/// fuse2fs and reports bandwidth, time, device bytes and the ratio, then reads every file back
/// after a remount (each byte checked by the bench, which fails otherwise) and reports that
/// restart's bandwidth and ratio, the data coming from the device, not from a cache left
/// warm. Method: 2 ranks of 2000 KiB in writes of 256 KiB (the last one short); no timing
/// asserted.
#[test]
fn checkpoint_reports_every_system() {
    let test = "checkpoint_reports_every_system";
    if bench_skip(test) {
        return;
    }
    if tool("fuse2fs").is_none() {
        skip(test, "fuse2fs is not installed (scripts/install-deps.sh)");
        return;
    }
    let dir = tempfile::tempdir().expect("OK to unwrap: temp dir");
    let (text, report) = run_bench(
        dir.path(),
        &[
            "checkpoint",
            "--threads",
            "2",
            "--file-size",
            "2000K",
            "--chunk",
            "256K",
            "--systems",
            "tidefs:ordered,tidefs:journal,ext4:ordered,fuse2fs",
        ],
    );
    for header in [
        "MB/s",
        "total s",
        "dev MB written",
        "of which journal",
        "vs ext4:ordered",
        "restart MB/s",
        "restart s",
        "restart vs ext4:ordered",
    ] {
        assert!(text.contains(header), "no column {header}:\n{text}");
    }
    assert_eq!(
        names(&report["rows"], "system"),
        [
            "tidefs:ordered",
            "tidefs:journal",
            "ext4:ordered",
            "fuse2fs"
        ]
    );
    assert_compared(&report["rows"], "mb_per_s");
    assert_compared_by(
        &report["rows"],
        "restart_mb_per_s",
        "restart_ratio_to_ext4_ordered",
    );
    // Every system received at least the data, and read it back from its device.
    let data = 2.0 * 2000.0 * 1024.0;
    for row in report["rows"].as_array().expect("OK to unwrap: array") {
        let written = row["device_bytes_written"]
            .as_f64()
            .expect("OK to unwrap: number");
        assert!(written >= data, "{row}");
        let read = row["restart_device_bytes_read"]
            .as_f64()
            .expect("OK to unwrap: number");
        assert!(read >= data, "a warm restart: {row}");
    }
    // Bad sizes are usage errors.
    let out = output(tidefs().args(["bench", "checkpoint", "--threads", "0"]));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}
