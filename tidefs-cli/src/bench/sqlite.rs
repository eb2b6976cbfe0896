//! `tidefs bench sqlite`: the dajFS experiment. SQLite (the `rusqlite` crate, SQLite built
//! from its C source) runs three [`Phase`]s of `--ops` autocommit transactions with
//! `synchronous=FULL` — inserts of random rows, updates of random rows by key, deletes of
//! random rows by key, the same seeded sequence on every system — in the rollback journal
//! (`journal_mode=DELETE`) and in write-ahead-log mode (`journal_mode=WAL`), on each system's
//! fresh file system.
//!
//! Every system keeps the database in `db/` and SQLite's rollback journal in `journal/` of its
//! mount, through the `tidefs-split` VFS ([`super::sqlite_vfs`]), so the files are laid out
//! alike everywhere. On `tidefs:split` the two directories have different journaling modes
//! (the database `journal`, the rollback journal `lightweight`, set with
//! `user.tidefs.journal`); on the other systems both have the mount's.
//!
//! The table gives, per journal mode, phase and system, and for the three phases together:
//! transactions per second, seconds, what the device received per transaction (bytes,
//! flushes), journal commits per transaction where the system counts them, FUSE requests per
//! transaction for tidefs through FUSE (the daemon's count), and the time against ext4
//! `data=ordered` in the same journal mode and phase. `--plot` draws the seconds
//! as grouped bars, one chart per journal mode.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use rusqlite::{Connection, OpenFlags};
use tidefs_crash::gen::Rng;

use super::report::{self, Series};
use super::sqlite_vfs;
use super::systems::{self, DeviceCounters, JournalPlace, System, Target};
use crate::CliError;

const WHAT: &str = "bench sqlite";

/// The split configuration's name.
const SPLIT: &str = "tidefs:split";

/// The split configuration's directory modes.
const SPLIT_MODES: DirModes = DirModes {
    database: "journal",
    journal: "lightweight",
};

/// The systems without `--systems` (fuse2fs only when it is installed).
const DEFAULT_SYSTEMS: &str =
    "tidefs:split,tidefs:journal,tidefs:ordered,ext4:ordered,ext4:journal,fuse2fs";

/// Length of the random text of a row.
const VALUE_BYTES: usize = 100;

/// Arguments of `tidefs bench sqlite`.
#[derive(clap::Args, Debug)]
pub struct SqliteArgs {
    /// Transactions per phase (each one autocommit statement): inserts, then updates, then
    /// deletes.
    #[arg(long, default_value_t = 10_000)]
    pub ops: u64,
    /// SQLite journal modes, comma-separated: delete, wal.
    #[arg(long, default_value = "delete,wal")]
    pub journal_modes: String,
    /// Systems, comma-separated: tidefs:split (database directory in `journal` mode, rollback
    /// journal directory in `lightweight` mode), tidefs:MODE, ext4:MODE, fuse2fs. Default:
    /// tidefs:split, tidefs:journal, tidefs:ordered, ext4:ordered, ext4:journal, and fuse2fs
    /// if it is installed.
    #[arg(long)]
    pub systems: Option<String>,
    /// Seed of the random keys and rows (the same for every system).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Also draw the seconds of each phase as grouped bars into this SVG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
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
                        WHAT,
                        format!("unknown journal mode '{name}': expected delete or wal"),
                    ))
                }
            };
            if !modes.contains(&mode) {
                modes.push(mode);
            }
        }
        if modes.is_empty() {
            return Err(CliError::usage(WHAT, "--journal-modes is empty"));
        }
        Ok(modes)
    }
}

/// The journaling modes of the database and rollback-journal directories on a tidefs mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
struct DirModes {
    /// The database's directory.
    database: &'static str,
    /// The rollback journal's directory.
    journal: &'static str,
}

/// A system as this benchmark sets it up.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Setup {
    /// The name in the table and the JSON.
    name: String,
    /// What is mounted.
    system: System,
    /// The directory modes set on the mount; `None`: both directories have the mount's.
    dir_modes: Option<DirModes>,
}

impl Setup {
    /// The setups `--systems` names (`None`: [`DEFAULT_SYSTEMS`]), in order, each once.
    fn parse_list(text: Option<&str>) -> Result<Vec<Setup>, CliError> {
        let mut setups: Vec<Setup> = Vec::new();
        for name in systems::system_names(WHAT, text, DEFAULT_SYSTEMS) {
            let setup = if name == SPLIT {
                // Mounted in the database's mode: only the journal directory differs from
                // tidefs:journal.
                Setup {
                    name,
                    system: System::Tidefs(SPLIT_MODES.database.to_string()),
                    dir_modes: Some(SPLIT_MODES),
                }
            } else {
                let system = System::parse_list(WHAT, &name, true)?
                    .into_iter()
                    .next()
                    // OK to unwrap: parse_list names one system for a name without commas.
                    .expect("one system");
                Setup {
                    name: system.name(),
                    system,
                    dir_modes: None,
                }
            };
            if !setups.contains(&setup) {
                setups.push(setup);
            }
        }
        if setups.is_empty() {
            return Err(CliError::usage(WHAT, "--systems names no system"));
        }
        Ok(setups)
    }

    /// What the JSON says of the setup.
    fn describe(&self) -> serde_json::Value {
        serde_json::json!({
            "system": self.name,
            "mounted": self.system.name(),
            "directory_modes": self.dir_modes,
        })
    }
}

/// A timed series of autocommit transactions of one statement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// `INSERT` of a row with a new random key and a random text.
    Insert,
    /// `UPDATE` of a random row's text, by key.
    Update,
    /// `DELETE` of a random row, by key.
    Delete,
}

impl Phase {
    /// The phases of a run, in order.
    const ALL: [Phase; 3] = [Phase::Insert, Phase::Update, Phase::Delete];

    /// The name of the three phases together in the rows.
    const TOTAL: &'static str = "total";

    fn name(self) -> &'static str {
        match self {
            Phase::Insert => "insert",
            Phase::Update => "update",
            Phase::Delete => "delete",
        }
    }

    /// The statement, with `?1` the key and `?2` the text.
    fn sql(self) -> &'static str {
        match self {
            Phase::Insert => "INSERT INTO t (id, v) VALUES (?1, ?2)",
            Phase::Update => "UPDATE t SET v = ?2 WHERE id = ?1",
            Phase::Delete => "DELETE FROM t WHERE id = ?1",
        }
    }
}

/// The seeded choices of a run: keys and texts of the rows, and which rows the updates and
/// deletes hit. The same seed gives every system the same statements.
struct Workload {
    rng: Rng,
    /// Keys of the rows in the table.
    keys: Vec<i64>,
    /// Every key inserted so far (a key is never reused).
    used: HashSet<i64>,
}

impl Workload {
    fn new(seed: u64) -> Workload {
        Workload {
            rng: Rng::new(seed),
            keys: Vec::new(),
            used: HashSet::new(),
        }
    }

    /// The next statement of `phase`: the key, and the text for inserts and updates; `None`
    /// when the table has no row left to update or delete.
    fn next(&mut self, phase: Phase) -> Option<(i64, Option<String>)> {
        match phase {
            Phase::Insert => {
                let key = loop {
                    // Non-negative keys of 63 random bits.
                    let key = i64::try_from(self.rng.next_u64() >> 1).unwrap_or(0);
                    if self.used.insert(key) {
                        break key;
                    }
                };
                self.keys.push(key);
                Some((key, Some(self.text())))
            }
            Phase::Update => {
                let index = self.pick()?;
                let key = *self.keys.get(index)?;
                Some((key, Some(self.text())))
            }
            Phase::Delete => {
                let index = self.pick()?;
                Some((self.keys.swap_remove(index), None))
            }
        }
    }

    /// A random index into the rows, if there is any.
    fn pick(&mut self) -> Option<usize> {
        let rows = u64::try_from(self.keys.len()).ok().filter(|&n| n > 0)?;
        usize::try_from(self.rng.below(rows)).ok()
    }

    /// A random text of [`VALUE_BYTES`] letters and digits.
    fn text(&mut self) -> String {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        (0..VALUE_BYTES)
            .map(|_| {
                let i = self.rng.below(ALPHABET.len() as u64) as usize;
                char::from(ALPHABET[i])
            })
            .collect()
    }
}

/// One phase (or the three together) on one system in one journal mode.
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
    /// FUSE requests the daemon served (tidefs through FUSE only).
    fuse_requests: Option<u64>,
}

/// The table's row: medians over the runs.
#[derive(Debug, serde::Serialize)]
struct Row {
    system: String,
    journal_mode: &'static str,
    phase: &'static str,
    transactions: u64,
    seconds: f64,
    transactions_per_s: f64,
    device_bytes_per_transaction: f64,
    flushes_per_transaction: f64,
    commits_per_transaction: Option<f64>,
    /// FUSE round trips per transaction (tidefs through FUSE only).
    fuse_requests_per_transaction: Option<f64>,
    /// Seconds against ext4 `data=ordered`'s in the same journal mode and phase.
    time_ratio_to_ext4_ordered: Option<f64>,
}

report::compared!(Row, |r| r.seconds, time_ratio_to_ext4_ordered);

fn err(what: &str, why: impl std::fmt::Display) -> CliError {
    CliError::new(format!("{WHAT}: {what}"), why.to_string())
}

/// Runs the benchmark and prints its table.
pub fn run(args: SqliteArgs) -> Result<(), CliError> {
    if args.ops == 0 || args.common.runs == 0 {
        return Err(CliError::usage(WHAT, "counts must be positive"));
    }
    let modes = JournalMode::parse_list(&args.journal_modes)?;
    let setups = Setup::parse_list(args.systems.as_deref())?;
    let dir = args.common.dir();

    let steps = args.common.runs * setups.len() * modes.len() * Phase::ALL.len();
    let bar = report::progress(steps, "sqlite");
    let mut samples = Vec::new();
    for run in 0..args.common.runs {
        for setup in &setups {
            let target = Target::prepare(
                setup.system.clone(),
                &dir,
                args.common.size,
                JournalPlace::Internal,
            )?;
            let (db_dir, journal_dir) = directories(&target, setup)?;
            for &mode in &modes {
                let database = Database {
                    target: &target,
                    name: &setup.name,
                    mode,
                    path: db_dir.join(format!("bench-{}-{run}.db", mode.name())),
                    journal_dir: &journal_dir,
                    run,
                };
                samples.extend(database.run(args.ops, args.seed, &bar)?);
            }
        }
    }
    bar.finish_and_clear();

    let mut rows = Vec::new();
    for &mode in &modes {
        let phases = Phase::ALL.map(Phase::name);
        for phase in phases.into_iter().chain([Phase::TOTAL]) {
            let mut block: Vec<Row> = setups
                .iter()
                .map(|s| row(&s.name, mode, phase, &samples))
                .collect();
            report::set_ratios(&mut block);
            rows.extend(block);
        }
    }

    println!(
        "sqlite: {} autocommit transactions per phase (insert, update, delete of random rows, \
         seed {}), synchronous=FULL, SQLite {}; database in db/, rollback journal in \
         journal/ (VFS {}); median of {} run(s)",
        args.ops,
        args.seed,
        rusqlite::version(),
        sqlite_vfs::NAME,
        args.common.runs
    );
    report::print_table(
        "system|journal|phase|txn/s|seconds|dev B/txn|flush/txn|commits/txn|FUSE req/txn|time vs ext4:ordered",
        &rows,
        |r: &Row| {
            vec![
                r.system.clone(),
                r.journal_mode.to_string(),
                r.phase.to_string(),
                format!("{:.0}", r.transactions_per_s),
                format!("{:.2}", r.seconds),
                format!("{:.0}", r.device_bytes_per_transaction),
                format!("{:.2}", r.flushes_per_transaction),
                r.commits_per_transaction
                    .map_or_else(|| "-".into(), |c| format!("{c:.2}")),
                r.fuse_requests_per_transaction
                    .map_or_else(|| "-".into(), |c| format!("{c:.1}")),
                report::ratio_cell(r.time_ratio_to_ext4_ordered),
            ]
        },
    );
    if let Some(path) = &args.common.json {
        let value = serde_json::json!({
            "benchmark": "sqlite",
            "ops": args.ops,
            "seed": args.seed,
            "value_bytes": VALUE_BYTES,
            "synchronous": "FULL",
            "sqlite_version": rusqlite::version(),
            "vfs": sqlite_vfs::NAME,
            "runs": args.common.runs,
            "systems": setups.iter().map(Setup::describe).collect::<Vec<_>>(),
            "rows": rows,
            "samples": samples,
        });
        report::write_json(path, &value)?;
    }
    if let Some(path) = &args.plot {
        plot(path, &setups, &modes, &rows, args.ops)?;
    }
    Ok(())
}

fn row(system: &str, mode: JournalMode, phase: &'static str, samples: &[Sample]) -> Row {
    let mine: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.system == system && s.journal_mode == mode.name() && s.phase == phase)
        .collect();
    let per_txn = |s: &Sample, n: u64| n as f64 / s.transactions.max(1) as f64;
    let median = |f: &dyn Fn(&Sample) -> f64| report::median_by(&mine, f);
    let has_commits = mine.iter().all(|s| s.commits.is_some());
    let has_requests = mine.iter().all(|s| s.fuse_requests.is_some());
    Row {
        system: system.to_string(),
        journal_mode: mode.name(),
        phase,
        transactions: mine.first().map_or(0, |s| s.transactions),
        seconds: median(&|s| s.seconds),
        transactions_per_s: median(&|s| s.transactions_per_s),
        device_bytes_per_transaction: median(&|s| per_txn(s, s.device.bytes_written)),
        flushes_per_transaction: median(&|s| per_txn(s, s.device.flushes)),
        commits_per_transaction: has_commits
            .then(|| median(&|s| per_txn(s, s.commits.unwrap_or(0)))),
        fuse_requests_per_transaction: has_requests
            .then(|| median(&|s| per_txn(s, s.fuse_requests.unwrap_or(0)))),
        time_ratio_to_ext4_ordered: None,
    }
}

/// Makes the database and rollback-journal directories on the target's mount, sets their
/// journaling modes for a split setup, and sends the journals of the one to the other
/// through the VFS; returns the two directories.
fn directories(target: &Target, setup: &Setup) -> Result<(PathBuf, PathBuf), CliError> {
    // OK to unwrap: Setup::parse_list refused the systems without a path.
    let root = target.root().expect("sqlite systems have a path");
    let (db, journal) = (root.join("db"), root.join("journal"));
    for dir in [&db, &journal] {
        std::fs::create_dir(dir)
            .map_err(|e| err(&setup.name, format!("{}: {e}", dir.display())))?;
    }
    if let Some(modes) = setup.dir_modes {
        systems::set_directory_mode(&db, modes.database)?;
        systems::set_directory_mode(&journal, modes.journal)?;
    }
    sqlite_vfs::split_journals(&db, &journal).map_err(|e| err(&setup.name, e))?;
    Ok((db, journal))
}

/// One database of a run: its system, journal mode and path.
struct Database<'a> {
    target: &'a Target,
    /// The setup's name.
    name: &'a str,
    mode: JournalMode,
    path: PathBuf,
    /// Where the VFS puts the rollback journal.
    journal_dir: &'a Path,
    run: usize,
}

impl Database<'_> {
    /// Creates the database and times every phase on it, `ops` transactions each with the
    /// choices of `seed`; the samples of the phases and of the three together.
    fn run(
        &self,
        ops: u64,
        seed: u64,
        bar: &indicatif::ProgressBar,
    ) -> Result<Vec<Sample>, CliError> {
        let what = format!("{} ({})", self.name, self.mode.name());
        let failed = |e: rusqlite::Error| err(&what, e);
        let conn = open(&self.path, self.mode).map_err(|e| err(self.name, e))?;
        if self.mode == JournalMode::Delete {
            check_journal_place(&conn, &self.path, self.journal_dir).map_err(|e| err(&what, e))?;
        }
        self.target.sync()?;
        let mut workload = Workload::new(seed);
        let mut samples = Vec::new();
        for phase in Phase::ALL {
            bar.set_message(format!("{what} {}", phase.name()));
            let mut statement = conn.prepare(phase.sql()).map_err(failed)?;
            let commits_before = self.target.commits();
            let requests_before = self.target.fuse_requests();
            let device_before = self.target.counters();
            let started = Instant::now();
            for _ in 0..ops {
                super::check_interrupt(WHAT)?;
                let (key, text) = workload
                    .next(phase)
                    .ok_or_else(|| err(&what, format!("{}: no row left", phase.name())))?;
                let changed = match &text {
                    Some(text) => statement.execute(rusqlite::params![key, text]),
                    None => statement.execute([key]),
                }
                .map_err(failed)?;
                if changed != 1 {
                    return Err(err(
                        &what,
                        format!("{} of key {key} changed {changed} rows", phase.name()),
                    ));
                }
            }
            let seconds = started.elapsed().as_secs_f64();
            samples.push(
                self.sample(
                    phase.name(),
                    ops,
                    seconds,
                    self.target.counters().since(device_before).total(),
                    commits_before
                        .zip(self.target.commits())
                        .map(|(a, b)| b.saturating_sub(a)),
                    requests_before
                        .zip(self.target.fuse_requests())
                        .map(|(a, b)| b.saturating_sub(a)),
                ),
            );
            bar.inc(1);
        }
        let total = self.sample(
            Phase::TOTAL,
            samples.iter().map(|s| s.transactions).sum(),
            samples.iter().map(|s| s.seconds).sum(),
            samples
                .iter()
                .fold(DeviceCounters::default(), |sum, s| sum.plus(s.device)),
            samples.iter().map(|s| s.commits).sum(),
            samples.iter().map(|s| s.fuse_requests).sum(),
        );
        samples.push(total);
        Ok(samples)
    }

    fn sample(
        &self,
        phase: &'static str,
        transactions: u64,
        seconds: f64,
        device: DeviceCounters,
        commits: Option<u64>,
        fuse_requests: Option<u64>,
    ) -> Sample {
        Sample {
            system: self.name.to_string(),
            journal_mode: self.mode.name(),
            phase,
            run: self.run,
            transactions,
            seconds,
            transactions_per_s: transactions as f64 / seconds.max(1e-9),
            device,
            commits,
            fuse_requests,
        }
    }
}

/// Opens a new database at `path` through the `tidefs-split` VFS in `mode` with
/// `synchronous=FULL` and its table.
fn open(path: &Path, mode: JournalMode) -> Result<Connection, String> {
    let text = |e: rusqlite::Error| format!("{}: {e}", path.display());
    let conn = Connection::open_with_flags_and_vfs(path, OpenFlags::default(), sqlite_vfs::NAME)
        .map_err(text)?;
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

/// Checks, with one transaction rolled back, that the rollback journal of the database at
/// `db` lives in `journal_dir` during a transaction and not beside the database: that the VFS
/// moved it, so that the benchmark measures the layout it claims.
fn check_journal_place(conn: &Connection, db: &Path, journal_dir: &Path) -> Result<(), String> {
    let text = |e: rusqlite::Error| format!("{}: {e}", db.display());
    let mut name = db.file_name().unwrap_or_default().to_owned();
    name.push("-journal");
    conn.execute_batch("BEGIN; INSERT INTO t (id, v) VALUES (-1, '')")
        .map_err(text)?;
    let (moved, beside) = (journal_dir.join(&name), db.with_file_name(&name));
    let placed = moved.exists() && !beside.exists();
    conn.execute_batch("ROLLBACK").map_err(text)?;
    if placed {
        return Ok(());
    }
    Err(format!(
        "during a transaction the rollback journal was not at {} (VFS {})",
        moved.display(),
        sqlite_vfs::NAME
    ))
}

/// The seconds of each phase as grouped bars (a group per phase, a bar per system), one chart
/// per journal mode.
fn plot(
    path: &Path,
    setups: &[Setup],
    modes: &[JournalMode],
    rows: &[Row],
    ops: u64,
) -> Result<(), CliError> {
    let phases = Phase::ALL.map(Phase::name);
    let series: Vec<Vec<Series>> = modes
        .iter()
        .map(|mode| {
            setups
                .iter()
                .map(|setup| Series {
                    name: setup.name.clone(),
                    points: rows
                        .iter()
                        .filter(|r| r.system == setup.name && r.journal_mode == mode.name())
                        .filter_map(|r| {
                            let group = phases.iter().position(|p| *p == r.phase)?;
                            Some((group as f64, r.seconds))
                        })
                        .collect(),
                })
                .collect()
        })
        .collect();
    let captions: Vec<String> = modes
        .iter()
        .map(|m| format!("journal_mode={}", m.name().to_uppercase()))
        .collect();
    let charts: Vec<(&str, &[Series])> = captions
        .iter()
        .map(String::as_str)
        .zip(series.iter().map(Vec::as_slice))
        .collect();
    // A single chart has the title for its caption: it names the journal mode too.
    let only_mode = match captions.as_slice() {
        [caption] => format!(", {caption}"),
        _ => String::new(),
    };
    report::plot_bars(
        path,
        &format!("SQLite, {ops} autocommit transactions per phase, synchronous=FULL{only_mode}"),
        "seconds",
        &phases,
        &charts,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the same seed gives the same statements; inserts never repeat a key, updates hit
    /// live rows, deletes remove each row once, and nothing is left to delete after as many
    /// deletes as inserts.
    #[test]
    fn workload_is_seeded_and_consistent() {
        let statements = |seed| {
            let mut w = Workload::new(seed);
            let mut all = Vec::new();
            for phase in Phase::ALL {
                for _ in 0..50 {
                    all.push(w.next(phase).expect("OK to unwrap: rows remain"));
                }
            }
            assert_eq!(w.next(Phase::Delete), None);
            all
        };
        let a = statements(7);
        assert_eq!(a, statements(7));
        assert_ne!(a, statements(8));
        let inserted: HashSet<i64> = a[..50].iter().map(|s| s.0).collect();
        assert_eq!(inserted.len(), 50);
        assert!(a[50..100].iter().all(|s| inserted.contains(&s.0)));
        let deleted: HashSet<i64> = a[100..].iter().map(|s| s.0).collect();
        assert_eq!(deleted, inserted);
        for (key, text) in &a[..100] {
            let text = text
                .as_deref()
                .expect("OK to unwrap: inserts and updates carry text");
            assert!(*key >= 0 && text.len() == VALUE_BYTES);
        }
        assert!(a[100..].iter().all(|s| s.1.is_none()));
    }

    /// Goal: the layout check passes where the VFS moves the rollback journal and fails where
    /// nothing moves it. Method: plain temporary directories, one of them split.
    #[test]
    fn journal_place_is_checked() {
        let tmp = tempfile::tempdir().expect("OK to unwrap: temp dir");
        let dir = |name: &str| {
            let dir = tmp.path().join(name);
            std::fs::create_dir(&dir).expect("OK to unwrap: mkdir");
            dir
        };
        let (db, journal, unsplit) = (dir("db"), dir("journal"), dir("unsplit"));
        sqlite_vfs::split_journals(&db, &journal).expect("OK to unwrap: the VFS registers");
        for (dir, moved) in [(&db, true), (&unsplit, false)] {
            let path = dir.join("t.db");
            let conn = open(&path, JournalMode::Delete).expect("OK to unwrap: open");
            let checked = check_journal_place(&conn, &path, &journal);
            assert_eq!(checked.is_ok(), moved, "{checked:?}");
        }
    }

    /// Goal: `tidefs:split` is the split setup over a `data=journal` mount, other names are
    /// the common systems, repeats are dropped, and an empty list is a usage error.
    #[test]
    fn systems_parse() {
        let setups = Setup::parse_list(Some("tidefs:split,ext4:ordered,tidefs:split"))
            .expect("OK to unwrap: valid names");
        assert_eq!(setups.len(), 2);
        assert_eq!(setups[0].name, SPLIT);
        assert_eq!(setups[0].system, System::Tidefs("journal".into()));
        assert_eq!(setups[0].dir_modes, Some(SPLIT_MODES));
        assert_eq!(setups[1].system, System::BASELINE);
        assert_eq!(setups[1].dir_modes, None);
        let code = |text| Setup::parse_list(Some(text)).err().map(|e| e.code);
        assert_eq!(code(","), Some(2));
        assert_eq!(code("tidefs:splat"), Some(2));
        assert_eq!(code("tidefs-embedded:ordered"), Some(2));
    }
}
