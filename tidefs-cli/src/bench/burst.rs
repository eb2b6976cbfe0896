//! `tidefs bench burst`: small synchronous appends, the workload of databases' logs and mail
//! queues. Each of N threads appends a record (125 bytes by default) to its own file and
//! fdatasyncs it, back to back, for a time or a count. Every system of `--systems` is set up
//! once and the measurements interleave (for each run, for each thread count, each system in
//! turn), so slow drift of the machine hits them all alike. Reported per system and thread
//! count: ops/s, latency of write + fdatasync (p50, p99, max), journal commits, device bytes and
//! flushes per operation, and the ratio to the kernel's ext4 `data=ordered` at the same thread
//! count.
//!
//! `--probe` adds the read-latency probe: while `--probe-threads` writers run the same storm on
//! other files, one thread repeatedly stats and reads a small cached file and stats a name in a
//! directory of `--probe-entries` names (`stat(2)`, see `sys::stat_size`); the table compares its
//! p50/p99 with ext4 `data=ordered` under the same storm. Only systems reached through a path are
//! probed.

use std::fs::OpenOptions;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use tidefs::fs::{Creds, Fs, ROOT_INO};

use super::report::{self, Latency, Series};
use super::systems::{DeviceCounters, JournalPlace, System, Target};
use crate::CliError;

/// Arguments of `tidefs bench burst`.
#[derive(clap::Args, Debug)]
pub struct BurstArgs {
    /// Thread counts to measure, comma-separated.
    #[arg(long, default_value = "1,4,16,64", value_delimiter = ',')]
    pub threads: Vec<usize>,
    /// Seconds each measurement lasts (default 3, unless --ops is given).
    #[arg(long, conflicts_with = "ops")]
    pub seconds: Option<f64>,
    /// Operations per thread in each measurement, instead of a duration.
    #[arg(long)]
    pub ops: Option<u64>,
    /// Bytes per write.
    #[arg(long, default_value_t = 125)]
    pub record_size: usize,
    /// Systems, comma-separated: tidefs:MODE, tidefs-embedded:MODE, ext4:ordered,
    /// ext4:writeback, ext4:journal, ext4:fast_commit, fuse2fs.
    #[arg(
        long,
        default_value = "tidefs:ordered,tidefs-embedded:ordered,ext4:ordered,ext4:fast_commit,ext4:journal"
    )]
    pub systems: String,
    /// Also run the read-latency probe under a write + fdatasync storm.
    #[arg(long)]
    pub probe: bool,
    /// Writer threads of the probe's storm.
    #[arg(long, default_value_t = 16)]
    pub probe_threads: usize,
    /// Names in the probe's directory.
    #[arg(long, default_value_t = 20_000)]
    pub probe_entries: usize,
    #[command(flatten)]
    pub common: super::CommonArgs,
    /// Also draw ops/s against threads, one line per system, into this SVG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

/// How long each writer goes on.
#[derive(Clone, Copy, Debug)]
pub(super) enum Budget {
    /// This many operations per thread.
    Ops(u64),
    /// Until this much time has passed.
    Time(Duration),
}

impl Budget {
    fn more(self, done: u64, started: Instant) -> bool {
        match self {
            Budget::Ops(n) => done < n,
            Budget::Time(d) => started.elapsed() < d,
        }
    }
}

/// One measurement: one system, one thread count, one run.
#[derive(Debug, serde::Serialize)]
struct Cell {
    system: String,
    threads: usize,
    run: usize,
    ops: u64,
    seconds: f64,
    ops_per_s: f64,
    latency: Latency,
    /// Journal commits during the measurement, where the system counts them.
    commits: Option<u64>,
    /// Operations that took tidefs's metadata lock during the measurement (tidefs only).
    metadata_locked: Option<u64>,
    device: DeviceCounters,
    #[serde(skip)]
    samples: Vec<u64>,
}

/// The table's row: one system at one thread count, over all runs.
#[derive(Debug, serde::Serialize)]
struct Row {
    system: String,
    threads: usize,
    /// Median over the runs.
    ops_per_s: f64,
    /// Over every operation of every run.
    latency: Latency,
    /// Median over the runs.
    commits: Option<u64>,
    /// Operations that took tidefs's metadata lock per write + fdatasync, over all runs
    /// (tidefs only).
    metadata_locked_per_op: Option<f64>,
    device_bytes_per_op: f64,
    flushes_per_op: f64,
    /// ops/s divided by ext4:ordered's at the same thread count.
    ratio_to_ext4_ordered: Option<f64>,
}

/// The probe's result on one system.
#[derive(Debug, serde::Serialize)]
struct ProbeRow {
    system: String,
    storm_threads: usize,
    storm_ops_per_s: f64,
    probe: Latency,
    /// This p99 divided by ext4:ordered's.
    p99_ratio_to_ext4_ordered: Option<f64>,
}

report::compared!(Row, |r| r.ops_per_s, ratio_to_ext4_ordered);

report::compared!(
    ProbeRow,
    |r| r.probe.p99_us as f64,
    p99_ratio_to_ext4_ordered
);

fn err(what: &str, why: impl std::fmt::Display) -> CliError {
    CliError::new(format!("bench burst: {what}"), why.to_string())
}

/// Runs the benchmark and prints its tables.
pub fn run(args: BurstArgs) -> Result<(), CliError> {
    let what = "bench burst";
    if args.threads.is_empty() || args.threads.contains(&0) {
        return Err(CliError::usage(what, "--threads needs positive counts"));
    }
    if args.common.runs == 0 || args.record_size == 0 || args.probe_threads == 0 {
        return Err(CliError::usage(what, "counts and sizes must be positive"));
    }
    let budget = match (args.ops, args.seconds) {
        (Some(0), _) => return Err(CliError::usage(what, "--ops must be positive")),
        (Some(n), _) => Budget::Ops(n),
        (None, Some(s)) if s.is_finite() && s > 0.0 => Budget::Time(Duration::from_secs_f64(s)),
        (None, Some(_)) => return Err(CliError::usage(what, "--seconds must be positive")),
        (None, None) => Budget::Time(Duration::from_secs(3)),
    };
    let systems = System::parse_list(what, &args.systems, false)?;
    let dir = args.common.dir();
    let record = vec![b'b'; args.record_size];

    let mut targets = Vec::new();
    for system in &systems {
        targets.push(Target::prepare(
            system.clone(),
            &dir,
            args.common.size,
            JournalPlace::Internal,
        )?);
    }
    let probed: Vec<&Target> = targets.iter().filter(|t| t.system.has_path()).collect();
    let steps = args.common.runs * args.threads.len() * targets.len()
        + if args.probe { probed.len() } else { 0 };
    let bar = report::progress(steps, "burst");
    let mut cells = Vec::new();
    for run in 0..args.common.runs {
        for &threads in &args.threads {
            for target in &targets {
                super::check_interrupt(what)?;
                bar.set_message(format!("{} x{threads}", target.system.name()));
                cells.push(measure(target, threads, budget, &record, run)?);
                bar.inc(1);
            }
        }
    }
    let mut probes = Vec::new();
    if args.probe {
        for target in &probed {
            super::check_interrupt(what)?;
            bar.set_message(format!("probe {}", target.system.name()));
            probes.push(probe(target, &args, budget, &record)?);
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    drop(targets);

    let rows = aggregate(&systems, &args.threads, &cells);
    print_rows(&rows, &args, budget);
    let probe_rows = probe_rows(probes, args.probe_threads);
    if args.probe {
        print_probes(&probe_rows, &args);
    }
    if let Some(path) = &args.common.json {
        let value = serde_json::json!({
            "benchmark": "burst",
            "record_size": args.record_size,
            "budget": match budget {
                Budget::Ops(n) => serde_json::json!({ "ops_per_thread": n }),
                Budget::Time(d) => serde_json::json!({ "seconds": d.as_secs_f64() }),
            },
            "runs": args.common.runs,
            "rows": rows,
            "cells": cells,
            "probe": probe_rows,
        });
        report::write_json(path, &value)?;
    }
    if let Some(path) = &args.plot {
        let series: Vec<Series> = systems
            .iter()
            .map(|s| Series {
                name: s.name(),
                points: rows
                    .iter()
                    .filter(|r| r.system == s.name())
                    .map(|r| (r.threads as f64, r.ops_per_s))
                    .collect(),
            })
            .collect();
        report::plot_lines(
            path,
            &format!(
                "write({} B) + fdatasync per thread, own file",
                args.record_size
            ),
            ("threads", "ops/s"),
            &series,
            true,
        )?;
    }
    Ok(())
}

/// One measurement of `target` with `threads` writers in a fresh directory.
fn measure(
    target: &Target,
    threads: usize,
    budget: Budget,
    record: &[u8],
    run: usize,
) -> Result<Cell, CliError> {
    let name = target.system.name();
    let label = format!("burst-{run}-{threads}");
    let commits_before = target.commits();
    let locked_before = target.metadata_locked();
    let device_before = target.counters();
    let (elapsed, samples) =
        storm(target, &label, threads, budget, record, None).map_err(|e| err(&name, e))?;
    let commits = commits_before
        .zip(target.commits())
        .map(|(a, b)| b.saturating_sub(a));
    let metadata_locked = locked_before
        .zip(target.metadata_locked())
        .map(|(a, b)| b.saturating_sub(a));
    let device = target.counters().since(device_before).total();
    let mut sorted = samples.clone();
    let ops = samples.len() as u64;
    let seconds = elapsed.as_secs_f64();
    Ok(Cell {
        system: name,
        threads,
        run,
        ops,
        seconds,
        ops_per_s: ops as f64 / seconds.max(1e-9),
        latency: Latency::of(&mut sorted),
        commits,
        metadata_locked,
        device,
        samples,
    })
}

/// Runs `threads` writers, each on its own new file in directory `label` of `target`; sets
/// `done` (if given) when they finish. Returns the wall time and every operation's latency.
fn storm(
    target: &Target,
    label: &str,
    threads: usize,
    budget: Budget,
    record: &[u8],
    done: Option<&AtomicBool>,
) -> Result<(Duration, Vec<u64>), String> {
    let result = appender(target, label, record).and_then(|open| drive(threads, budget, open));
    if let Some(done) = done {
        done.store(true, Ordering::SeqCst);
    }
    result
}

/// One stream's operation: append the record to its file and fdatasync it.
pub(super) type Append<'a> = Box<dyn FnMut() -> Result<(), String> + Send + 'a>;

/// Makes directory `label` in `target` and returns the maker of its streams: `open(i)` creates
/// file `f{i}` there and returns its [`Append`] of `record`, through the mounted path or the
/// embedded library.
pub(super) fn appender<'a>(
    target: &'a Target,
    label: &str,
    record: &'a [u8],
) -> Result<impl Fn(usize) -> Result<Append<'a>, String> + Sync + 'a, String> {
    enum Place<'a> {
        Path(PathBuf),
        Embedded(&'a Arc<Fs>, u64),
    }
    let place = match (target.root(), target.embedded()) {
        (Some(root), _) => {
            let dir = root.join(label);
            std::fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
            Place::Path(dir)
        }
        (None, Some(fs)) => {
            let dir = fs
                .mkdir(ROOT_INO, label.as_bytes(), 0o755, Creds::ROOT)
                .map_err(|e| format!("mkdir {label}: {e}"))?
                .ino;
            Place::Embedded(fs, dir)
        }
        (None, None) => return Err("the system has neither a path nor a library handle".into()),
    };
    Ok(move |i: usize| -> Result<Append<'a>, String> {
        let name = format!("f{i}");
        match &place {
            Place::Path(dir) => {
                let path = dir.join(&name);
                let mut file = OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                Ok(Box::new(move || {
                    file.write_all(record).map_err(|e| format!("write: {e}"))?;
                    file.sync_data().map_err(|e| format!("fdatasync: {e}"))
                }))
            }
            &Place::Embedded(fs, dir) => {
                let ino = fs
                    .create(dir, name.as_bytes(), 0o100644, 0, Creds::ROOT)
                    .map_err(|e| format!("create {name}: {e}"))?
                    .ino;
                let mut offset = 0u64;
                Ok(Box::new(move || {
                    fs.write(ino, offset, record)
                        .map_err(|e| format!("write: {e}"))?;
                    fs.fsync(ino, true).map_err(|e| format!("fdatasync: {e}"))?;
                    offset += record.len() as u64;
                    Ok(())
                }))
            }
        }
    })
}

/// Starts `threads` threads; each gets its operation from `open(index)`, all start together,
/// and each repeats the operation while `budget` allows. Returns the wall time from the start
/// to the last thread's end and every operation's latency in microseconds.
pub(super) fn drive<Open, Op>(
    threads: usize,
    budget: Budget,
    open: Open,
) -> Result<(Duration, Vec<u64>), String>
where
    Open: Fn(usize) -> Result<Op, String> + Sync,
    Op: FnMut() -> Result<(), String>,
{
    let barrier = Barrier::new(threads + 1);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|i| {
                let (barrier, open) = (&barrier, &open);
                scope.spawn(move || -> Result<Vec<u64>, String> {
                    let op = open(i);
                    // Wait even after a failed open, so that the others are not left waiting.
                    barrier.wait();
                    let mut op = op?;
                    let started = Instant::now();
                    let mut samples = Vec::new();
                    while budget.more(samples.len() as u64, started) && !super::interrupted() {
                        let t = Instant::now();
                        op()?;
                        samples.push(report::micros(t.elapsed()));
                    }
                    Ok(samples)
                })
            })
            .collect();
        barrier.wait();
        let started = Instant::now();
        let mut all = Vec::new();
        let mut failure = None;
        for worker in workers {
            match worker.join() {
                Ok(Ok(samples)) => all.extend(samples),
                Ok(Err(e)) => failure = Some(e),
                Err(_) => failure = Some("a writer thread panicked".to_string()),
            }
        }
        match failure {
            Some(e) => Err(e),
            None => Ok((started.elapsed(), all)),
        }
    })
}

/// The read-latency probe on one system reached through a path.
fn probe(
    target: &Target,
    args: &BurstArgs,
    budget: Budget,
    record: &[u8],
) -> Result<(String, f64, Vec<u64>), CliError> {
    let name = target.system.name();
    let failed = |e: String| err(&format!("probe {name}"), e);
    // OK to unwrap: only systems with a path are probed.
    let root = target.root().expect("probed systems have a path");
    let dir = root.join("probe-dir");
    std::fs::create_dir(&dir).map_err(|e| failed(format!("mkdir: {e}")))?;
    for i in 0..args.probe_entries {
        super::check_interrupt("bench burst")?;
        std::fs::File::create(dir.join(format!("e{i}")))
            .map_err(|e| failed(format!("create e{i}: {e}")))?;
    }
    let small = root.join("probe-small");
    std::fs::write(&small, vec![b's'; 4096]).map_err(|e| failed(format!("small file: {e}")))?;
    target.sync()?;
    // Warm: the file is meant to be cached, as the directory's blocks are after the creates.
    std::fs::read(&small).map_err(|e| failed(format!("read: {e}")))?;

    let done = AtomicBool::new(false);
    let entries = args.probe_entries.max(1);
    let (storm_result, samples) = std::thread::scope(|scope| {
        let storm = scope.spawn(|| {
            storm(
                target,
                "probe-storm",
                args.probe_threads,
                budget,
                record,
                Some(&done),
            )
        });
        let mut samples = Vec::new();
        // A fixed linear congruential sequence of names: the same names on every system.
        let mut pick: u64 = 12345;
        let mut probe_error = None;
        while !done.load(Ordering::SeqCst) {
            pick = pick
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let entry = dir.join(format!("e{}", (pick >> 33) % entries as u64));
            let t = Instant::now();
            let step = crate::sys::stat_size(&small)
                .and_then(|_| std::fs::read(&small))
                .and_then(|_| crate::sys::stat_size(&entry));
            samples.push(report::micros(t.elapsed()));
            if let Err(e) = step {
                probe_error = Some(format!("probe: {e}"));
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        // OK to unwrap: a panic in the storm thread is a bug to show, not to hide.
        let storm_result = storm.join().expect("the storm thread does not panic");
        match probe_error {
            Some(e) => (Err(e), samples),
            None => (storm_result, samples),
        }
    });
    let (elapsed, storm_samples) = storm_result.map_err(failed)?;
    let storm_ops_per_s = storm_samples.len() as f64 / elapsed.as_secs_f64().max(1e-9);
    Ok((name, storm_ops_per_s, samples))
}

fn probe_rows(probes: Vec<(String, f64, Vec<u64>)>, storm_threads: usize) -> Vec<ProbeRow> {
    let mut rows: Vec<ProbeRow> = probes
        .into_iter()
        .map(|(system, storm_ops_per_s, mut samples)| ProbeRow {
            system,
            storm_threads,
            storm_ops_per_s,
            probe: Latency::of(&mut samples),
            p99_ratio_to_ext4_ordered: None,
        })
        .collect();
    report::set_ratios(&mut rows);
    rows
}

/// Folds the runs into one row per system and thread count.
fn aggregate(systems: &[System], threads: &[usize], cells: &[Cell]) -> Vec<Row> {
    let groups = report::grouped(threads, systems, cells, |c| (&c.system, c.threads));
    let mut rows: Vec<Row> = groups
        .into_iter()
        .map(|(t, name, mine)| {
            let mut rates: Vec<f64> = mine.iter().map(|c| c.ops_per_s).collect();
            let mut samples: Vec<u64> = mine.iter().flat_map(|c| c.samples.clone()).collect();
            let mut commits: Vec<u64> = mine.iter().filter_map(|c| c.commits).collect();
            commits.sort_unstable();
            let ops: u64 = mine.iter().map(|c| c.ops).sum::<u64>().max(1);
            let locked = mine.iter().map(|c| c.metadata_locked).sum::<Option<u64>>();
            let device = mine
                .iter()
                .fold(DeviceCounters::default(), |acc, c| DeviceCounters {
                    bytes_written: acc.bytes_written + c.device.bytes_written,
                    flushes: acc.flushes + c.device.flushes,
                });
            Row {
                system: name,
                threads: t,
                ops_per_s: report::median(&mut rates),
                latency: Latency::of(&mut samples),
                commits: commits.get(commits.len() / 2).copied(),
                metadata_locked_per_op: locked.map(|l| l as f64 / ops as f64),
                device_bytes_per_op: device.bytes_written as f64 / ops as f64,
                flushes_per_op: device.flushes as f64 / ops as f64,
                ratio_to_ext4_ordered: None,
            }
        })
        .collect();
    // Each thread count is a block of one row per system, compared within.
    for block in rows.chunks_mut(systems.len().max(1)) {
        report::set_ratios(block);
    }
    rows
}

fn budget_text(budget: Budget) -> String {
    match budget {
        Budget::Ops(n) => format!("{n} ops per thread"),
        Budget::Time(d) => format!("{:.1} s per measurement", d.as_secs_f64()),
    }
}

fn print_rows(rows: &[Row], args: &BurstArgs, budget: Budget) {
    println!(
        "burst: write({} B) + fdatasync back to back, each thread on its own file; {}; \
         median of {} run(s); latency in ms",
        args.record_size,
        budget_text(budget),
        args.common.runs
    );
    report::print_table(
        "system|threads|ops/s|p50|p99|max|commits|locks/op|dev B/op|flush/op|vs ext4:ordered",
        rows,
        |r| {
            [
                vec![
                    r.system.clone(),
                    r.threads.to_string(),
                    format!("{:.0}", r.ops_per_s),
                ],
                r.latency.cells(),
                vec![
                    r.commits.map_or_else(|| "-".into(), |c| c.to_string()),
                    r.metadata_locked_per_op
                        .map_or_else(|| "-".into(), |l| format!("{l:.2}")),
                    format!("{:.0}", r.device_bytes_per_op),
                    format!("{:.2}", r.flushes_per_op),
                    report::ratio_cell(r.ratio_to_ext4_ordered),
                ],
            ]
            .concat()
        },
    );
}

fn print_probes(rows: &[ProbeRow], args: &BurstArgs) {
    println!();
    println!(
        "probe: stat + read of a cached 4 KiB file + stat of a name among {} in one directory, \
         every 1 ms, while {} threads run write + fdatasync; latency in ms",
        args.probe_entries, args.probe_threads
    );
    report::print_table(
        "system|probes|p50|p99|max|storm ops/s|p99 vs ext4:ordered",
        rows,
        |r| {
            [
                vec![r.system.clone(), r.probe.count.to_string()],
                r.probe.cells(),
                vec![
                    format!("{:.0}", r.storm_ops_per_s),
                    report::ratio_cell(r.p99_ratio_to_ext4_ordered),
                ],
            ]
            .concat()
        },
    );
}
