//! `tidefs bench streams`: many streams each append small records to their own file and
//! fdatasync after every record, the workload of loggers, sensors and message queues that the
//! Okeanos papers measure. This module owns the workload (paced or burst), its measurement of
//! journal and home bytes per application byte, and its table, JSON and figures; the systems
//! come from [`super::systems`], the file appends and the burst driver from [`super::burst`],
//! percentiles, tables and plots from [`super::report`].
//!
//! - **Paced** (`--rate`): each stream writes at a fixed bit rate. Below 100 Kbit/s a record is
//!   125 bytes (1K: one a second, 10K: ten a second), the papers' small records; from 100
//!   Kbit/s up a record is 16 KiB, whole blocks appended at block boundaries (1M: one every
//!   131.072 ms), a stream of large writes. The streams' deadlines are spread evenly over the
//!   interval: slot `j` belongs to stream `j % N` and is due at `j * interval / N`, so one
//!   atomic counter is the whole timer wheel. A pool of threads (`--threads`, default one per
//!   stream up to 256) takes the slots in order, sleeps until each is due and runs it. The
//!   pool bounds the fdatasyncs in flight (group commit feeds on them); at 1K × 1000 a system
//!   with millisecond fdatasyncs needs only a handful in flight, and on a small machine one
//!   thread per stream measures the scheduler more than the file system (in one trial on the
//!   2-core development machine, 10K × 1000 with 1000 threads instead of 256 cut ext4's rate
//!   by a sixth and nearly quadrupled its p50). How late
//!   records started is measured; the table notes a system whose p99 lateness exceeds the
//!   interval, i.e. that (or whose pool) did not keep up.
//! - **Burst** (`--burst SIZE`): one thread per stream appends back to back, as
//!   `tidefs bench burst`.
//!
//! Each measurement (a stream count, a run, a system) gets a fresh file system with its
//! journal on its own direct-I/O loop device ([`JournalPlace::External`]); the streams' files
//! are created and synced before the counters start, and the counters stop after the unmount,
//! so the final commit, checkpoint and write-back count. Systems interleave per stream count;
//! with `--runs` the table shows medians.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::burst::{appender, drive, Append, Budget};
use super::report::{self, Latency, Panel, Series};
use super::systems::{cpu_seconds, JournalPlace, System, Target, Traffic};
use crate::CliError;

const WHAT: &str = "bench streams";

/// Arguments of `tidefs bench streams`.
#[derive(clap::Args, Debug)]
pub struct StreamsArgs {
    /// Paced mode (the default, at 1K): each stream's bit rate, e.g. 1K, 10K, 1M (K, M, G are
    /// powers of 1000). Below 100K each record is 125 bytes (1K: one a second, 10K: ten a
    /// second); from 100K up it is 16 KiB, block-aligned (1M: one every 131 ms).
    #[arg(long, value_parser = parse_rate, conflicts_with = "burst")]
    pub rate: Option<u64>,
    /// Burst mode: each stream appends records of SIZE bytes back to back, one thread per
    /// stream (as `bench burst`).
    #[arg(long, value_name = "SIZE", value_parser = crate::parse_size_arg)]
    pub burst: Option<u64>,
    /// Stream counts to measure, comma-separated (each a point of the figures).
    #[arg(long, default_value = "100", value_delimiter = ',')]
    pub streams: Vec<usize>,
    /// Seconds each measurement lasts.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Paced mode: threads serving the streams' deadlines (default: one per stream, at most
    /// 256).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Systems, comma-separated: tidefs:MODE (FUSE), tidefs-embedded:MODE (the library in
    /// this process), MODE as for `tidefs mount -o data=MODE`; ext4:ordered, ext4:writeback,
    /// ext4:journal, ext4:fast_commit; fuse2fs (no external journal: home bytes only).
    #[arg(
        long,
        default_value = "tidefs:ordered,tidefs:journal,tidefs-embedded:ordered,ext4:ordered,\
                         ext4:journal,ext4:fast_commit"
    )]
    pub systems: String,
    #[command(flatten)]
    pub common: super::CommonArgs,
    /// Also draw journal and home bytes per app byte and fdatasync latency (p50, p99) against
    /// the stream count, one line per system, into this SVG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

/// A bit rate: a positive number with an optional K, M or G (powers of 1000).
fn parse_rate(text: &str) -> Result<u64, String> {
    let (number, scale) = match text.chars().last() {
        Some('K' | 'k') => (&text[..text.len() - 1], 1e3),
        Some('M' | 'm') => (&text[..text.len() - 1], 1e6),
        Some('G' | 'g') => (&text[..text.len() - 1], 1e9),
        _ => (text, 1.0),
    };
    number
        .parse::<f64>()
        .ok()
        .map(|n| (n * scale).round())
        .filter(|r| r.is_finite() && *r >= 1.0 && *r <= 1e12)
        .map(|r| r as u64)
        .ok_or_else(|| format!("'{text}' is not a bit rate (examples: 1K, 10K, 1M)"))
}

/// What each stream does.
#[derive(Clone, Copy, Debug)]
enum Workload {
    /// One record every `interval`, `rate` bits per second.
    Paced {
        rate: u64,
        record: usize,
        interval: Duration,
    },
    /// Records back to back.
    Burst { record: usize },
}

impl Workload {
    fn from_args(args: &StreamsArgs) -> Result<Workload, CliError> {
        match (args.burst, args.rate) {
            (Some(0), _) => Err(CliError::usage(WHAT, "--burst needs a positive size")),
            (Some(size), _) => Ok(Workload::Burst {
                record: usize::try_from(size)
                    .map_err(|_| CliError::usage(WHAT, "--burst is too large"))?,
            }),
            (None, rate) => Ok(Workload::paced(rate.unwrap_or(1_000))),
        }
    }

    /// Paced at `rate` bit/s: 125-byte records below 100 Kbit/s, 16 KiB from there up.
    fn paced(rate: u64) -> Workload {
        let record = if rate < 100_000 { 125 } else { 16 << 10 };
        Workload::Paced {
            rate,
            record,
            interval: Duration::from_secs_f64(record as f64 * 8.0 / rate.max(1) as f64),
        }
    }

    fn record(self) -> usize {
        match self {
            Workload::Paced { record, .. } | Workload::Burst { record } => record,
        }
    }

    fn describe(self) -> String {
        match self {
            Workload::Paced {
                rate,
                record,
                interval,
            } => format!(
                "paced at {} bit/s per stream: a {record}-byte record every {:.1} ms",
                rate,
                interval.as_secs_f64() * 1e3
            ),
            Workload::Burst { record } => format!("burst: {record}-byte records back to back"),
        }
    }

    fn json(self) -> serde_json::Value {
        match self {
            Workload::Paced {
                rate,
                record,
                interval,
            } => serde_json::json!({
                "mode": "paced",
                "rate_bits_per_s": rate,
                "record_size": record,
                "interval_ms": interval.as_secs_f64() * 1e3,
            }),
            Workload::Burst { record } => serde_json::json!({
                "mode": "burst",
                "record_size": record,
            }),
        }
    }
}

/// What every measurement of a run shares.
struct Plan {
    workload: Workload,
    /// The record every append writes.
    record: Vec<u8>,
    /// How long each measurement lasts.
    length: Duration,
    /// Image size and where the images go.
    size: u64,
    dir: PathBuf,
}

/// What a workload ran: its wall time, every record's latency and (paced) how late each
/// started, in microseconds.
struct Timing {
    elapsed: Duration,
    samples: Vec<u64>,
    late: Option<Vec<u64>>,
}

/// One measurement: one system, one stream count, one run.
#[derive(Debug, serde::Serialize)]
struct Cell {
    system: String,
    streams: usize,
    run: usize,
    /// Records written (each one write + fdatasync).
    ops: u64,
    seconds: f64,
    ops_per_s: f64,
    /// Bytes the streams wrote.
    app_bytes: u64,
    /// What the devices received from the start of the workload to the end of the unmount.
    traffic: Traffic,
    /// Journal device bytes per app byte (`None` without an external journal: fuse2fs).
    journal_bytes_per_app_byte: Option<f64>,
    /// File-system device bytes per app byte.
    home_bytes_per_app_byte: f64,
    /// write + fdatasync of each record.
    latency: Latency,
    /// How late records started against their schedule (paced mode).
    lateness: Option<Latency>,
    /// Journal commits during the workload and its final sync, where the system counts them.
    commits: Option<u64>,
    /// CPU seconds of this process (the writers; the file system too when embedded; ext4's
    /// work in the writers' system calls).
    app_cpu_s: Option<f64>,
    /// CPU seconds of the file system's server: the tidefs daemon, fuse2fs, ext4's jbd2 thread.
    server_cpu_s: Option<f64>,
    #[serde(skip)]
    samples: Vec<u64>,
}

/// The table's row: one system at one stream count, over all runs (medians; latency over
/// every record of every run).
#[derive(Debug, serde::Serialize)]
struct Row {
    system: String,
    streams: usize,
    journal_bytes_per_app_byte: Option<f64>,
    home_bytes_per_app_byte: f64,
    ops_per_s: f64,
    latency: Latency,
    lateness_p99_us: Option<u64>,
    commits: Option<u64>,
    /// This process and the server together.
    cpu_s: Option<f64>,
    app_cpu_s: Option<f64>,
    server_cpu_s: Option<f64>,
}

fn err(what: &str, why: impl std::fmt::Display) -> CliError {
    CliError::new(format!("{WHAT}: {what}"), why.to_string())
}

/// Runs the benchmark and prints its table.
pub fn run(args: StreamsArgs) -> Result<(), CliError> {
    if args.streams.is_empty() || args.streams.contains(&0) {
        return Err(CliError::usage(WHAT, "--streams needs positive counts"));
    }
    if args.common.runs == 0 || args.threads == Some(0) {
        return Err(CliError::usage(
            WHAT,
            "--runs and --threads must be positive",
        ));
    }
    if !(args.seconds.is_finite() && args.seconds > 0.0) {
        return Err(CliError::usage(WHAT, "--seconds must be positive"));
    }
    let workload = Workload::from_args(&args)?;
    let systems = System::parse_list(WHAT, &args.systems, false)?;
    let plan = Plan {
        workload,
        record: vec![b's'; workload.record()],
        length: Duration::from_secs_f64(args.seconds),
        size: args.common.size,
        dir: args.common.dir(),
    };

    let bar = report::progress(
        args.streams.len() * args.common.runs * systems.len(),
        "streams",
    );
    let mut cells = Vec::new();
    for &streams in &args.streams {
        let threads = args.threads.unwrap_or(streams.min(256));
        for run in 0..args.common.runs {
            for system in &systems {
                super::check_interrupt(WHAT)?;
                bar.set_message(format!("{} x{streams} run {}", system.name(), run + 1));
                cells.push(measure(system, &plan, streams, threads, run)?);
                bar.inc(1);
            }
        }
    }
    bar.finish_and_clear();

    let rows = aggregate(&systems, &args.streams, &cells);
    print_rows(&rows, &args, workload);
    if let Some(path) = &args.common.json {
        let value = serde_json::json!({
            "benchmark": "streams",
            "workload": workload.json(),
            "seconds": args.seconds,
            "runs": args.common.runs,
            "journal": "on its own loop device with direct I/O (fuse2fs: none apart, home bytes only)",
            "rows": rows,
            "cells": cells,
        });
        report::write_json(path, &value)?;
    }
    if let Some(path) = &args.plot {
        plot(path, &systems, &rows, workload)?;
    }
    Ok(())
}

/// One measurement of `streams` streams (paced by `threads` threads) on a fresh file system
/// of `system`.
fn measure(
    system: &System,
    plan: &Plan,
    streams: usize,
    threads: usize,
    run: usize,
) -> Result<Cell, CliError> {
    let name = system.name();
    let failed = |e: String| err(&name, e);
    let target = Target::prepare(system.clone(), &plan.dir, plan.size, JournalPlace::External)?;
    // Declared after the target, so dropped before it: the files close before the unmount.
    let open = appender(&target, "streams", &plan.record).map_err(failed)?;
    let mut files = Vec::with_capacity(streams);
    for i in 0..streams {
        super::check_interrupt(WHAT)?;
        files.push(Mutex::new(open(i).map_err(failed)?));
    }
    target.sync()?;
    let commits_before = target.commits();
    let traffic_before = target.counters();
    let app_cpu_before = cpu_seconds("self");
    let server_cpu_before = target.server_cpu_seconds();

    let Timing {
        elapsed,
        mut samples,
        late,
    } = match plan.workload {
        Workload::Paced { interval, .. } => paced(&files, interval, plan.length, threads),
        Workload::Burst { .. } => drive(streams, Budget::Time(plan.length), |i| {
            let file = &files[i];
            Ok(move || append(file))
        })
        .map(|(elapsed, samples)| Timing {
            elapsed,
            samples,
            late: None,
        }),
    }
    .map_err(failed)?;
    super::check_interrupt(WHAT)?;

    target.sync()?;
    let commits = commits_before
        .zip(target.commits())
        .map(|(a, b)| b.saturating_sub(a));
    let server_cpu_s = server_cpu_before
        .zip(target.server_cpu_seconds())
        .map(|(a, b)| b - a);
    drop(files);
    drop(open);
    let traffic = target.finish().since(traffic_before);
    let app_cpu_s = app_cpu_before.zip(cpu_seconds("self")).map(|(a, b)| b - a);

    let ops = samples.len() as u64;
    let app_bytes = ops * plan.record.len() as u64;
    let per_app_byte = |bytes: u64| bytes as f64 / app_bytes.max(1) as f64;
    let seconds = elapsed.as_secs_f64();
    Ok(Cell {
        system: name.clone(),
        streams,
        run,
        ops,
        seconds,
        ops_per_s: ops as f64 / seconds.max(1e-9),
        app_bytes,
        traffic,
        journal_bytes_per_app_byte: traffic.journal.map(|j| per_app_byte(j.bytes_written)),
        home_bytes_per_app_byte: per_app_byte(traffic.home.bytes_written),
        latency: Latency::of(&mut samples),
        lateness: late.map(|mut l| Latency::of(&mut l)),
        commits,
        app_cpu_s,
        server_cpu_s,
        samples,
    })
}

/// Runs one stream's append, under its lock.
fn append(file: &Mutex<Append>) -> Result<(), String> {
    let mut op = file.lock().map_err(|_| "a writer thread panicked")?;
    op()
}

/// Paced streams: `threads` threads run the slots of the timer wheel (see the module's
/// documentation) for `length`.
fn paced(
    files: &[Mutex<Append>],
    interval: Duration,
    length: Duration,
    threads: usize,
) -> Result<Timing, String> {
    let n = files.len() as u128;
    let interval_ns = interval.as_nanos();
    let next = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let results = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                let (next, stop) = (&next, &stop);
                scope.spawn(move || -> Result<(Vec<u64>, Vec<u64>), String> {
                    let mut samples = Vec::new();
                    let mut late = Vec::new();
                    loop {
                        let slot = next.fetch_add(1, Ordering::Relaxed);
                        let at = u128::from(slot) * interval_ns / n;
                        let at = Duration::from_nanos(u64::try_from(at).unwrap_or(u64::MAX));
                        if at >= length {
                            return Ok((samples, late));
                        }
                        let due = started + at;
                        // Sleep in short steps, so that a stop is seen within 100 ms.
                        loop {
                            if stop.load(Ordering::Relaxed) || super::interrupted() {
                                return Ok((samples, late));
                            }
                            let now = Instant::now();
                            if now >= due {
                                break;
                            }
                            std::thread::sleep((due - now).min(Duration::from_millis(100)));
                        }
                        let file = &files[usize::try_from(u128::from(slot) % n).unwrap_or(0)];
                        let result = {
                            let mut op = file.lock().map_err(|_| "a writer thread panicked")?;
                            let t = Instant::now();
                            late.push(report::micros(t.saturating_duration_since(due)));
                            let result = op();
                            samples.push(report::micros(t.elapsed()));
                            result
                        };
                        if let Err(e) = result {
                            stop.store(true, Ordering::Relaxed);
                            return Err(e);
                        }
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err("a writer thread panicked".to_string()))
            })
            .collect::<Vec<_>>()
    });
    let elapsed = started.elapsed();
    let (mut samples, mut late) = (Vec::new(), Vec::new());
    for result in results {
        let (s, l) = result?;
        samples.extend(s);
        late.extend(l);
    }
    Ok(Timing {
        elapsed,
        samples,
        late: Some(late),
    })
}

/// The median of the values that are there; `None` when a run has none.
fn median_of(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let mut all: Vec<f64> = values.collect::<Option<Vec<f64>>>()?;
    (!all.is_empty()).then(|| report::median(&mut all))
}

/// Folds the runs into one row per stream count and system.
fn aggregate(systems: &[System], streams: &[usize], cells: &[Cell]) -> Vec<Row> {
    let groups = report::grouped(streams, systems, cells, |c| (&c.system, c.streams));
    groups
        .into_iter()
        .map(|(n, name, mine)| {
            let pick = |f: &dyn Fn(&Cell) -> Option<f64>| median_of(mine.iter().map(|c| f(c)));
            let mut samples: Vec<u64> = mine.iter().flat_map(|c| c.samples.clone()).collect();
            let app_cpu_s = pick(&|c| c.app_cpu_s);
            let server_cpu_s = pick(&|c| c.server_cpu_s);
            Row {
                system: name,
                streams: n,
                journal_bytes_per_app_byte: pick(&|c| c.journal_bytes_per_app_byte),
                home_bytes_per_app_byte: pick(&|c| Some(c.home_bytes_per_app_byte)).unwrap_or(0.0),
                ops_per_s: pick(&|c| Some(c.ops_per_s)).unwrap_or(0.0),
                latency: Latency::of(&mut samples),
                lateness_p99_us: pick(&|c| c.lateness.map(|l| l.p99_us as f64)).map(|l| l as u64),
                commits: pick(&|c| c.commits.map(|c| c as f64)).map(|c| c as u64),
                cpu_s: app_cpu_s.map(|a| a + server_cpu_s.unwrap_or(0.0)),
                app_cpu_s,
                server_cpu_s,
            }
        })
        .collect()
}

fn print_rows(rows: &[Row], args: &StreamsArgs, workload: Workload) {
    println!(
        "streams: {}, each stream on its own file with fdatasync after every record; {:.1} s \
         per measurement; median of {} run(s)",
        workload.describe(),
        args.seconds,
        args.common.runs
    );
    println!(
        "journal on its own direct-I/O loop device; B/app B = device bytes written (up to the \
         end of the unmount) per byte the streams wrote; latency = write + fdatasync in ms; \
         cpu s = this process + the file system's server (tidefs daemon, fuse2fs, ext4's jbd2 \
         thread)"
    );
    let ratio = |r: f64| format!("{r:.2}");
    report::print_table(
        "system|streams|journal B/app B|home B/app B|ops/s|p50|p99|max|commits|cpu s",
        rows,
        |r| {
            [
                vec![
                    r.system.clone(),
                    r.streams.to_string(),
                    r.journal_bytes_per_app_byte
                        .map_or_else(|| "-".into(), ratio),
                    ratio(r.home_bytes_per_app_byte),
                    format!("{:.0}", r.ops_per_s),
                ],
                r.latency.cells(),
                vec![
                    r.commits.map_or_else(|| "-".into(), |c| c.to_string()),
                    r.cpu_s.map_or_else(|| "-".into(), |c| format!("{c:.2}")),
                ],
            ]
            .concat()
        },
    );
    if rows.iter().any(|r| r.journal_bytes_per_app_byte.is_none()) {
        println!("fuse2fs has no external journal: its bytes all count as home bytes");
    }
    if let Workload::Paced { interval, .. } = workload {
        // A record that starts after the stream's next one was due is one the system (or the
        // pool) did not keep up with.
        let limit = report::micros(interval);
        for r in rows {
            if let Some(late) = r.lateness_p99_us.filter(|&l| l > limit) {
                println!(
                    "note: {} at {} streams did not keep up: p99 of records started {} ms \
                     behind schedule, more than the interval (the system, or the pool of \
                     --threads, was too slow)",
                    r.system,
                    r.streams,
                    report::ms_cell(late)
                );
            }
        }
    }
}

/// The figures: journal and home bytes per app byte, fdatasync p50 and p99, against streams.
fn plot(
    path: &std::path::Path,
    systems: &[System],
    rows: &[Row],
    workload: Workload,
) -> Result<(), CliError> {
    let series = |figure: &dyn Fn(&Row) -> Option<f64>| -> Vec<Series> {
        systems
            .iter()
            .map(|s| Series {
                name: s.name(),
                points: rows
                    .iter()
                    .filter(|r| r.system == s.name())
                    .filter_map(|r| Some((r.streams as f64, figure(r)?)))
                    .collect(),
            })
            .collect()
    };
    let journal = series(&|r| r.journal_bytes_per_app_byte);
    let home = series(&|r| Some(r.home_bytes_per_app_byte));
    let p50 = series(&|r| Some(r.latency.p50_us as f64 / 1e3));
    let p99 = series(&|r| Some(r.latency.p99_us as f64 / 1e3));
    report::plot_panels(
        path,
        &format!("{}, fdatasync after every record", workload.describe()),
        "streams",
        &[
            Panel {
                y_desc: "journal bytes per app byte",
                series: &journal,
            },
            Panel {
                y_desc: "home bytes per app byte",
                series: &home,
            },
            Panel {
                y_desc: "write + fdatasync p50 (ms)",
                series: &p50,
            },
            Panel {
                y_desc: "write + fdatasync p99 (ms)",
                series: &p99,
            },
        ],
        true,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: rates parse with decimal suffixes and bad ones are refused.
    #[test]
    fn rates_parse() {
        assert_eq!(parse_rate("1K"), Ok(1_000));
        assert_eq!(parse_rate("10k"), Ok(10_000));
        assert_eq!(parse_rate("1M"), Ok(1_000_000));
        assert_eq!(parse_rate("2.5K"), Ok(2_500));
        assert_eq!(parse_rate("300"), Ok(300));
        for bad in ["5X", "", "K", "0", "-1K", "nanK"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
    }

    /// Goal: the record sizes and intervals the help text promises.
    #[test]
    fn paced_records() {
        let paced = |rate| match Workload::paced(rate) {
            Workload::Paced {
                record, interval, ..
            } => (record, interval.as_secs_f64()),
            Workload::Burst { .. } => unreachable!("paced is paced"),
        };
        assert_eq!(paced(1_000), (125, 1.0));
        assert_eq!(paced(10_000), (125, 0.1));
        assert_eq!(paced(1_000_000), (16384, 0.131072));
    }

    /// Goal: the timer wheel runs every slot once, each stream at its rate, and stops at the
    /// end. Method: 8 counting streams at 20 ms for 200 ms on 3 threads.
    #[test]
    fn paced_runs_each_stream_at_its_rate() {
        let counts: Vec<AtomicU64> = (0..8).map(|_| AtomicU64::new(0)).collect();
        let files: Vec<Mutex<Append>> = counts
            .iter()
            .map(|c| {
                Mutex::new(Box::new(move || {
                    c.fetch_add(1, Ordering::Relaxed);
                    Ok(())
                }) as Append)
            })
            .collect();
        let Timing { samples, late, .. } = paced(
            &files,
            Duration::from_millis(20),
            Duration::from_millis(200),
            3,
        )
        .expect("OK to unwrap: the operations do not fail");
        assert_eq!(samples.len(), 80);
        assert_eq!(late.map(|l| l.len()), Some(80));
        for c in &counts {
            assert_eq!(c.load(Ordering::Relaxed), 10);
        }
    }
}
