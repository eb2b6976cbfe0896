//! `tidefs bench sqlite`: SQLite (the `rusqlite` crate, SQLite built from its C source) doing
//! autocommit transactions with `synchronous=FULL`, in the rollback journal
//! (`journal_mode=DELETE`) and in write-ahead-log mode (`journal_mode=WAL`), on each system's
//! fresh file system. Each [`Phase`] is `--ops` transactions of one statement; the table gives
//! transactions per second, what the device received per transaction (bytes, flushes), journal
//! commits per transaction where the system counts them, and the ratio to ext4 `data=ordered`
//! in the same journal mode and phase.
//!
//! A run is a list of phases on one database per journal mode, so further statements (updates,
//! deletes) are one more [`Phase`] each, and a system is anything [`Target`] can set up.

use std::path::Path;
use std::time::Instant;

use rusqlite::Connection;

use super::report;
use super::systems::{DeviceCounters, JournalPlace, System, Target};
use crate::CliError;

/// Arguments of `tidefs bench sqlite`.
#[derive(clap::Args, Debug)]
pub struct SqliteArgs {
    /// Transactions per phase (each one autocommit statement).
    #[arg(long, default_value_t = 5_000)]
    pub ops: u64,
    /// SQLite journal modes, comma-separated: delete, wal.
    #[arg(long, default_value = "delete,wal")]
    pub journal_modes: String,
    /// Systems, comma-separated (no embedded ones: SQLite opens a path). Default: tidefs in
    /// every data mode, ext4 in every mode, and fuse2fs if it is installed.
    #[arg(long)]
    pub systems: Option<String>,
    #[command(flatten)]
    pub common: super::CommonArgs,
}

/// SQLite's journal mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum JournalMode {
    /// Rollback journal, deleted at each commit.
    Delete,
    /// Write-ahead log.
    Wal,
}

impl JournalMode {
    fn name(self) -> &'static str {
        match self {
            JournalMode::Delete => "delete",
            JournalMode::Wal => "wal",
        }
    }

    fn parse_list(text: &str) -> Result<Vec<JournalMode>, CliError> {
        let mut modes = Vec::new();
        for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let mode = match name {
                "delete" => JournalMode::Delete,
                "wal" => JournalMode::Wal,
                _ => {
                    return Err(CliError::usage(
                        "bench sqlite",
                        format!("unknown journal mode '{name}': expected delete or wal"),
                    ))
                }
            };
            if !modes.contains(&mode) {
                modes.push(mode);
            }
        }
        if modes.is_empty() {
            return Err(CliError::usage("bench sqlite", "--journal-modes is empty"));
        }
        Ok(modes)
    }
}

/// A timed series of autocommit transactions of one statement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// `INSERT` of a new row with a 100-byte value.
    Insert,
}

impl Phase {
    /// The phases of a run, in order.
    const ALL: [Phase; 1] = [Phase::Insert];

    fn name(self) -> &'static str {
        match self {
            Phase::Insert => "insert",
        }
    }

    /// The statement, with `?1` the row number and `?2` a value.
    fn sql(self) -> &'static str {
        match self {
            Phase::Insert => "INSERT INTO t (id, v) VALUES (?1, ?2)",
        }
    }
}

/// One phase on one system in one journal mode.
#[derive(Debug, serde::Serialize)]
struct Sample {
    system: String,
    journal_mode: &'static str,
    phase: &'static str,
    run: usize,
    transactions: u64,
    seconds: f64,
    transactions_per_s: f64,
    device: DeviceCounters,
    commits: Option<u64>,
}

/// The table's row: medians over the runs.
#[derive(Debug, serde::Serialize)]
struct Row {
    system: String,
    journal_mode: &'static str,
    phase: &'static str,
    transactions_per_s: f64,
    device_bytes_per_transaction: f64,
    flushes_per_transaction: f64,
    commits_per_transaction: Option<f64>,
    ratio_to_ext4_ordered: Option<f64>,
}

report::compared!(Row, |r| r.transactions_per_s, ratio_to_ext4_ordered);

fn err(what: &str, why: impl std::fmt::Display) -> CliError {
    CliError::new(format!("bench sqlite: {what}"), why.to_string())
}

/// Runs the benchmark and prints its table.
pub fn run(args: SqliteArgs) -> Result<(), CliError> {
    let what = "bench sqlite";
    if args.ops == 0 || args.common.runs == 0 {
        return Err(CliError::usage(what, "counts must be positive"));
    }
    let modes = JournalMode::parse_list(&args.journal_modes)?;
    let systems = System::parse_path_list(what, args.systems.as_deref())?;
    let dir = args.common.dir();

    let bar = report::progress(args.common.runs * systems.len() * modes.len(), "sqlite");
    let mut samples = Vec::new();
    for run in 0..args.common.runs {
        for system in &systems {
            let target = Target::prepare(
                system.clone(),
                &dir,
                args.common.size,
                JournalPlace::Internal,
            )?;
            for &mode in &modes {
                bar.set_message(format!("{} {}", system.name(), mode.name()));
                samples.extend(one_database(&target, mode, args.ops, run)?);
                bar.inc(1);
            }
        }
    }
    bar.finish_and_clear();

    let mut rows = Vec::new();
    for &mode in &modes {
        for phase in Phase::ALL {
            let mut block: Vec<Row> = systems
                .iter()
                .map(|s| row(s.name(), mode, phase, &samples))
                .collect();
            report::set_ratios(&mut block);
            rows.extend(block);
        }
    }

    println!(
        "sqlite: {} autocommit transactions per phase, synchronous=FULL, SQLite {}; \
         median of {} run(s)",
        args.ops,
        rusqlite::version(),
        args.common.runs
    );
    report::print_table(
        "system|journal|phase|txn/s|dev B/txn|flush/txn|commits/txn|vs ext4:ordered",
        &rows,
        |r: &Row| {
            vec![
                r.system.clone(),
                r.journal_mode.to_string(),
                r.phase.to_string(),
                format!("{:.0}", r.transactions_per_s),
                format!("{:.0}", r.device_bytes_per_transaction),
                format!("{:.2}", r.flushes_per_transaction),
                r.commits_per_transaction
                    .map_or_else(|| "-".into(), |c| format!("{c:.2}")),
                report::ratio_cell(r.ratio_to_ext4_ordered),
            ]
        },
    );
    if let Some(path) = &args.common.json {
        let value = serde_json::json!({
            "benchmark": "sqlite",
            "ops": args.ops,
            "synchronous": "FULL",
            "sqlite_version": rusqlite::version(),
            "runs": args.common.runs,
            "rows": rows,
            "samples": samples,
        });
        report::write_json(path, &value)?;
    }
    Ok(())
}

fn row(system: String, mode: JournalMode, phase: Phase, samples: &[Sample]) -> Row {
    let mine: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.system == system && s.journal_mode == mode.name() && s.phase == phase.name())
        .collect();
    let per_txn = |s: &Sample, n: u64| n as f64 / s.transactions.max(1) as f64;
    let median = |f: &dyn Fn(&Sample) -> f64| {
        report::median(&mut mine.iter().map(|s| f(s)).collect::<Vec<_>>())
    };
    let has_commits = mine.iter().all(|s| s.commits.is_some());
    Row {
        journal_mode: mode.name(),
        phase: phase.name(),
        transactions_per_s: median(&|s| s.transactions_per_s),
        device_bytes_per_transaction: median(&|s| per_txn(s, s.device.bytes_written)),
        flushes_per_transaction: median(&|s| per_txn(s, s.device.flushes)),
        commits_per_transaction: has_commits
            .then(|| median(&|s| per_txn(s, s.commits.unwrap_or(0)))),
        ratio_to_ext4_ordered: None,
        system,
    }
}

/// Creates a database in `mode` on `target` and times every phase on it.
fn one_database(
    target: &Target,
    mode: JournalMode,
    ops: u64,
    run: usize,
) -> Result<Vec<Sample>, CliError> {
    let system = target.system.name();
    // OK to unwrap: parse_list refused the systems without a path.
    let root = target.root().expect("sqlite systems have a path");
    let path = root.join(format!("bench-{}-{run}.db", mode.name()));
    let failed = |e: rusqlite::Error| err(&format!("{system} ({})", mode.name()), e);
    let conn = open(&path, mode).map_err(|e| err(&system, e))?;
    target.sync()?;
    let mut samples = Vec::new();
    for phase in Phase::ALL {
        let mut statement = conn.prepare(phase.sql()).map_err(failed)?;
        let commits_before = target.commits();
        let device_before = target.counters();
        let started = Instant::now();
        for i in 0..ops {
            super::check_interrupt("bench sqlite")?;
            let value = format!("{i:0>100}");
            statement
                .execute(rusqlite::params![
                    i64::try_from(i).unwrap_or(i64::MAX),
                    value
                ])
                .map_err(failed)?;
        }
        let seconds = started.elapsed().as_secs_f64();
        samples.push(Sample {
            system: system.clone(),
            journal_mode: mode.name(),
            phase: phase.name(),
            run,
            transactions: ops,
            seconds,
            transactions_per_s: ops as f64 / seconds.max(1e-9),
            device: target.counters().since(device_before).total(),
            commits: commits_before
                .zip(target.commits())
                .map(|(a, b)| b.saturating_sub(a)),
        });
    }
    Ok(samples)
}

/// Opens a new database at `path` in `mode` with `synchronous=FULL` and its table.
fn open(path: &Path, mode: JournalMode) -> Result<Connection, String> {
    let text = |e: rusqlite::Error| format!("{}: {e}", path.display());
    let conn = Connection::open(path).map_err(text)?;
    let journal: String = conn
        .query_row(&format!("PRAGMA journal_mode={}", mode.name()), [], |r| {
            r.get(0)
        })
        .map_err(text)?;
    if !journal.eq_ignore_ascii_case(mode.name()) {
        return Err(format!(
            "{}: SQLite kept journal_mode={journal} instead of {}",
            path.display(),
            mode.name()
        ));
    }
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(text)?;
    conn.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        .map_err(text)?;
    Ok(conn)
}
