//! `tidefs bench recovery`: the recovery-time experiment of the Okeanos papers. Many threads
//! each append small records with an fdatasync after each, checkpointing is held off so the
//! journal is full of committed transactions, the file system stops as at a power cut, and
//! recovery is timed pass by pass (scan, revoke, replay) for each data mode. The peer in the
//! same run is e2fsprogs replaying the same journal (`e2fsck -E journal_only`), on a copy of the
//! same crashed image.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidefs::fs::{Creds, DataMode, Fs, MountOptions, ROOT_INO};
use tidefs_mkfs::{find_e2fsprogs_tool, mkfs, MkfsOptions};

use crate::CliError;

/// Parameters of `tidefs bench recovery`.
pub struct RecoveryBench {
    /// Writer threads.
    pub threads: usize,
    /// Records each thread appends (each followed by fdatasync).
    pub writes: usize,
    /// Bytes per record.
    pub record_size: usize,
    /// Runs per mode; the table shows min / median / max.
    pub runs: usize,
    /// Modes to measure.
    pub modes: Vec<DataMode>,
    /// Where the images go.
    pub dir: PathBuf,
    /// Print JSON instead of a table.
    pub json: bool,
}

/// One run's measurements.
#[derive(Clone, Debug, Default, serde::Serialize)]
struct Sample {
    transactions: u32,
    blocks_replayed: u64,
    revoke_records: u64,
    scan_ms: f64,
    revoke_ms: f64,
    replay_ms: f64,
    /// Whole `Fs::open` (recovery plus mount work).
    open_ms: f64,
    /// e2fsprogs replaying the same journal; `None` without e2fsck, or when it refuses the
    /// journal.
    e2fsck_replay_ms: Option<f64>,
    /// The journal held tidefs extension records, which e2fsprogs refuses to replay.
    e2fsck_refuses_extension_records: bool,
    /// Byte-range records replayed.
    range_records: u64,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn err(what: &str, e: impl std::fmt::Display) -> CliError {
    CliError::new(format!("bench recovery: {what}"), e.to_string())
}

/// Runs the workload on a fresh image, stops it as a crash, and measures both recoveries.
fn one_run(cfg: &RecoveryBench, mode: DataMode, run: usize) -> Result<Sample, CliError> {
    let image = cfg.dir.join(format!("recovery-{}-{run}.img", mode.name()));
    let _ = std::fs::remove_file(&image);
    let opts = MkfsOptions {
        size: Some(1 << 30),
        journal_size: Some(256 << 20),
        ..MkfsOptions::default()
    };
    mkfs(&image, &opts).map_err(|e| err("mkfs", e))?;
    let mount = MountOptions {
        data_mode: mode,
        // Fenced, so that e2fsprogs can replay the journal of the modes without byte-range
        // records and stay the peer of the comparison (unfenced commits would guard the log
        // with tidefs's incompat bit, as byte-range records do).
        fenced_commits: true,
        deterministic_writes: true,
        commit_interval: Duration::from_secs(3600),
        ..MountOptions::default()
    };
    let fs = Arc::new(Fs::open(&image, &mount).map_err(|e| err("open", e))?);
    let record = vec![b'r'; cfg.record_size];
    let workers: Vec<_> = (0..cfg.threads)
        .map(|t| {
            let (fs, record, writes) = (fs.clone(), record.clone(), cfg.writes);
            std::thread::spawn(move || -> tidefs::Result<()> {
                let name = format!("stream{t}");
                let f = fs.create(ROOT_INO, name.as_bytes(), 0o100644, 0, Creds::ROOT)?;
                for w in 0..writes {
                    fs.write(f.ino, (w * record.len()) as u64, &record)?;
                    fs.fsync(f.ino, true)?;
                }
                Ok(())
            })
        })
        .collect();
    for w in workers {
        w.join()
            .map_err(|_| err("workload", "a writer thread panicked"))?
            .map_err(|e| err("workload", e))?;
    }
    fs.crash();
    drop(fs);

    let copy = cfg
        .dir
        .join(format!("recovery-{}-{run}.e2fsck.img", mode.name()));
    let status = Command::new("cp")
        .args(["--sparse=always"])
        .arg(&image)
        .arg(&copy)
        .status()
        .map_err(|e| err("copy", e))?;
    if !status.success() {
        return Err(err("copy", "cp failed"));
    }

    let started = Instant::now();
    let fs = Fs::open(&image, &MountOptions::default()).map_err(|e| err("recover", e))?;
    let open_ms = ms(started.elapsed());
    let report = fs.recovery_report().unwrap_or_default();
    fs.unmount().map_err(|e| err("unmount", e))?;

    // e2fsprogs refuses a journal that holds tidefs's extension records (wasteless,
    // selective) or unfenced transactions: that is the compatibility rule, so there is no
    // peer time to show.
    let refused = tidefs::journal::dump_image(&copy, None)
        .map_err(|e| err("journal of the crashed image", e))?
        .tidefs_only();
    let e2fsck_replay_ms = match find_e2fsprogs_tool("e2fsck") {
        Some(_) if refused => None,
        Some(e2fsck) => {
            let started = Instant::now();
            let out = Command::new(e2fsck)
                .args(["-E", "journal_only", "-y"])
                .arg(&copy)
                .output()
                .map_err(|e| err("e2fsck", e))?;
            let t = ms(started.elapsed());
            // Exit 1 means "errors corrected": the journal was replayed.
            if !matches!(out.status.code(), Some(0 | 1)) {
                return Err(err("e2fsck replay", String::from_utf8_lossy(&out.stdout)));
            }
            Some(t)
        }
        None => None,
    };
    let _ = std::fs::remove_file(&image);
    let _ = std::fs::remove_file(&copy);
    Ok(Sample {
        transactions: report.transactions,
        blocks_replayed: report.blocks_replayed,
        revoke_records: report.revoke_records,
        scan_ms: ms(report.scan),
        revoke_ms: ms(report.revoke),
        replay_ms: ms(report.replay),
        open_ms,
        e2fsck_replay_ms,
        e2fsck_refuses_extension_records: refused,
        range_records: report.range_records,
    })
}

/// min / median / max of a figure over the runs.
fn spread(values: &mut [f64]) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    match values {
        [] => (0.0, 0.0, 0.0),
        v => (v[0], v[v.len() / 2], v[v.len() - 1]),
    }
}

fn cell(values: &mut [f64]) -> String {
    let (lo, mid, hi) = spread(values);
    format!("{mid:.2} ({lo:.2}-{hi:.2})")
}

/// Runs the benchmark and prints its table (or JSON).
pub fn run(cfg: &RecoveryBench) -> Result<(), CliError> {
    std::fs::create_dir_all(&cfg.dir).map_err(|e| err(&cfg.dir.display().to_string(), e))?;
    let mut results = Vec::new();
    for &mode in &cfg.modes {
        let mut samples = Vec::new();
        for run in 0..cfg.runs {
            samples.push(one_run(cfg, mode, run)?);
        }
        results.push((mode, samples));
    }
    if cfg.json {
        let out: Vec<_> = results
            .iter()
            .map(|(mode, samples)| serde_json::json!({ "mode": mode.name(), "runs": samples }))
            .collect();
        println!("{}", serde_json::Value::Array(out));
        return Ok(());
    }
    println!(
        "recovery after {} threads x {} fdatasync'd writes of {} bytes, checkpoints held off; \
         times in ms, median (min-max) of {} runs",
        cfg.threads, cfg.writes, cfg.record_size, cfg.runs
    );
    println!(
        "{:<12} {:>6} {:>8} {:>7} {:>22} {:>22} {:>22} {:>22} {:>22} {:>8}",
        "mode",
        "txns",
        "blocks",
        "revokes",
        "scan",
        "revoke",
        "replay",
        "tidefs open",
        "e2fsck replay",
        "ratio"
    );
    for (mode, samples) in &mut results {
        let pick = |f: fn(&Sample) -> f64| samples.iter().map(f).collect::<Vec<_>>();
        let mut e2 = samples
            .iter()
            .filter_map(|s| s.e2fsck_replay_ms)
            .collect::<Vec<_>>();
        let mut open = pick(|s| s.open_ms);
        let ratio = if e2.is_empty() {
            "-".to_string()
        } else {
            format!(
                "{:.2}",
                spread(&mut e2.clone()).1 / spread(&mut open.clone()).1.max(1e-9)
            )
        };
        let first = &samples[0];
        println!(
            "{:<12} {:>6} {:>8} {:>7} {:>22} {:>22} {:>22} {:>22} {:>22} {:>8}",
            mode.name(),
            first.transactions,
            first.blocks_replayed,
            first.revoke_records,
            cell(&mut pick(|s| s.scan_ms)),
            cell(&mut pick(|s| s.revoke_ms)),
            cell(&mut pick(|s| s.replay_ms)),
            cell(&mut open),
            if e2.is_empty() {
                "-".to_string()
            } else {
                cell(&mut e2)
            },
            ratio,
        );
    }
    println!("ratio = e2fsck replay time / tidefs open time (above 1: tidefs recovers faster)");
    println!(
        "e2fsck replay '-': e2fsprogs refuses a journal holding tidefs's byte-range records \
         (wasteless, selective), as the incompat bit asks"
    );
    Ok(())
}
