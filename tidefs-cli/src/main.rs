//! `tidefs`: the command-line tool. mkfs, mount (FUSE), umount, sync, fsck, stats and a demo.
//! Started as `mount.fuse.tidefs` (a link `tidefs install-helper` makes), it is mount(8)'s
//! helper for the type `fuse.tidefs`.
//!
//! Every failure prints `tidefs: <what>: <why>` on stderr and exits non-zero: 2 for bad usage,
//! fsck's own codes for `fsck` (16 for bad usage), 1 otherwise.

mod bench;
mod control;
mod crashtest;
mod demo;
mod dump_journal;
mod fsck;
mod fuse_adapter;
mod helper;
mod journal;
mod mkfs;
mod mount;
mod sys;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// A failure to report: `tidefs: <what>: <why>`, then exit with `code`.
#[derive(Debug)]
pub struct CliError {
    /// The command or object that failed.
    pub what: String,
    /// Why, in words a user can act on.
    pub why: String,
    /// The exit code.
    pub code: u8,
}

impl CliError {
    /// A failure with exit code 1.
    pub fn new(what: impl Into<String>, why: impl Into<String>) -> CliError {
        CliError {
            what: what.into(),
            why: why.into(),
            code: 1,
        }
    }

    /// Bad usage: exit code 2.
    pub fn usage(what: impl Into<String>, why: impl Into<String>) -> CliError {
        CliError {
            code: 2,
            ..CliError::new(what, why)
        }
    }
}

#[derive(Parser)]
#[command(
    name = "tidefs",
    version,
    about = "A user-space journaling file system in the ext4 format with a jbd2 journal"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create (or format) an image with the tidefs ext4 feature set.
    Mkfs {
        /// Image size, e.g. 1G or 512M (default 1G for a new image; an existing file keeps its
        /// size unless given).
        #[arg(long, value_parser = parse_size_arg)]
        size: Option<u64>,
        /// Journal size (whole MiB, e.g. 64M), or the size of a new external journal file.
        #[arg(long, value_parser = parse_size_arg)]
        journal_size: Option<u64>,
        /// Put the journal on this external device or file (made with mke2fs -O journal_dev).
        #[arg(long)]
        journal_device: Option<PathBuf>,
        /// Number of inodes (default: one per 16 KiB).
        #[arg(long)]
        inodes: Option<u64>,
        /// Overwrite an existing ext2/3/4 file system or journal without asking.
        #[arg(short = 'F', long)]
        force: bool,
        /// The root directory's journaling mode, which new directories inherit (without it,
        /// directories follow the mount's -o data=, else ordered).
        #[arg(long, value_name = "MODE", value_parser = parse_mode_arg)]
        default_mode: Option<tidefs::fs::DataMode>,
        /// The image file or block device.
        image: PathBuf,
    },
    /// List the transactions in an image's journal, as recovery would replay them.
    DumpJournal(dump_journal::DumpJournalArgs),
    /// Read or set the journaling mode of directories and files (mounted, or --image).
    Journal {
        #[command(subcommand)]
        which: journal::JournalCommand,
    },
    /// Mount an image with FUSE (in the background unless -f).
    Mount {
        /// Stay in the foreground (serve until unmounted).
        #[arg(short, long)]
        foreground: bool,
        /// Mount options: ro, rw, commit=SECONDS, journal_device=PATH, cache_size=SIZE,
        /// data=MODE, barrier=flush|none, fenced_commits, fuse_uring, allow_other, private,
        /// nosuid|suid, nodev|dev, noexec|exec (see the README).
        #[arg(short = 'o', value_name = "OPTIONS")]
        options: Vec<String>,
        /// Internal: started by a background mount; report on stdout.
        #[arg(long, hide = true)]
        daemon_child: bool,
        /// The image file or block device.
        image: PathBuf,
        /// Where to mount it.
        mountpoint: PathBuf,
    },
    /// Unmount cleanly: final commit, checkpoint, empty journal, clean state.
    Umount {
        /// The mountpoint.
        mountpoint: PathBuf,
    },
    /// Commit and flush a mounted file system; returns when everything written is durable.
    Sync {
        /// The mountpoint.
        mountpoint: PathBuf,
    },
    /// Replay the journal and check the file system (exit codes as fsck(8)).
    Fsck {
        /// Never modify the image: replay and check a temporary copy.
        #[arg(short = 'n')]
        no_modify: bool,
        /// Repair automatically what is safe to repair without questions (e2fsck -p).
        #[arg(short = 'p', short_alias = 'a')]
        preen: bool,
        /// Repair everything, answering yes to every question (e2fsck -y).
        #[arg(short = 'y')]
        yes: bool,
        /// External journal device.
        #[arg(long)]
        journal_device: Option<PathBuf>,
        /// The image file or block device.
        image: PathBuf,
    },
    /// Live counters of a mounted file system.
    Stats {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// The mountpoint.
        mountpoint: PathBuf,
    },
    /// Show the daemon serving a mountpoint: pid, image, options (JSON).
    Status {
        /// The mountpoint.
        mountpoint: PathBuf,
    },
    /// Benchmarks that run tidefs beside its peers and print tables.
    Bench {
        #[command(subcommand)]
        which: BenchCommand,
    },
    /// Crash-state harness: record workloads, rebuild the disk at crash points, recover and
    /// check each data mode's promises (exit 1 on any violation).
    Crashtest(crashtest::CrashtestArgs),
    /// Make `DIR/mount.fuse.tidefs` (default /sbin) a link to this binary, so that
    /// `mount -t fuse.tidefs` and fstab lines work (needs root for /sbin).
    InstallHelper {
        /// Where mount(8) looks for helpers.
        #[arg(long, default_value = "/sbin")]
        dir: PathBuf,
    },
    /// Create an image, mount it, run a short workload, print stats, unmount, check.
    Demo {
        /// The image to use (created if missing).
        #[arg(long, default_value = "tidefs-demo.img")]
        image: PathBuf,
        /// Size of a new image.
        #[arg(long, value_parser = parse_size_arg, default_value = "1G")]
        size: u64,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Recovery time per pass (scan, revoke, replay) after a crash with a full journal, for each
    /// data mode, beside e2fsprogs replaying the same journal.
    Recovery {
        /// Writer threads.
        #[arg(long, default_value_t = 100)]
        threads: usize,
        /// fdatasync'd writes per thread.
        #[arg(long, default_value_t = 100)]
        writes: usize,
        /// Bytes per write.
        #[arg(long, default_value_t = 125)]
        record_size: usize,
        /// Runs per mode.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Data mode to measure (lightweight, writeback, ordered, journal), or all.
        #[arg(long, default_value = "all")]
        mode: String,
        /// Directory for the images.
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Threads each doing write(125 B) + fdatasync on their own file, on tidefs through FUSE,
    /// tidefs in-process and the kernel's ext4, interleaved; `--probe` adds read latency under
    /// the storm.
    Burst(bench::burst::BurstArgs),
    /// Debian's postmark, one configuration for tidefs (FUSE), the kernel's ext4 and fuse2fs.
    Postmark(bench::postmark::PostmarkArgs),
    /// The checkpoint of a parallel job: ranks each writing a file of their own sequentially,
    /// then fsync; bandwidth, time and device bytes for tidefs, the kernel's ext4 and fuse2fs;
    /// then the restart, every file read back after a remount.
    Checkpoint(bench::checkpoint::CheckpointArgs),
    /// SQLite inserts, updates and deletes (autocommit, synchronous=FULL), rollback journal
    /// and WAL; tidefs:split keeps the rollback journal in a lightweight directory.
    Sqlite(bench::sqlite::SqliteArgs),
    /// Many streams each appending records to their own file with fdatasync after each,
    /// paced at a bit rate or in a burst; journal and home bytes per app byte (journal on its
    /// own device), latency, commits and CPU, side by side.
    Streams(bench::streams::StreamsArgs),
}

/// The data modes named by a `--mode` argument (`all` for every mode).
pub fn parse_modes(text: &str) -> Result<Vec<tidefs::fs::DataMode>, CliError> {
    use tidefs::fs::DataMode;
    if text == "all" {
        return Ok(DataMode::ALL.to_vec());
    }
    DataMode::parse(text).map(|m| vec![m]).ok_or_else(|| {
        CliError::usage(
            "--mode",
            format!("'{text}': expected {} or all", DataMode::NAMES_HELP),
        )
    })
}

pub fn parse_mode_arg(text: &str) -> Result<tidefs::fs::DataMode, String> {
    tidefs::fs::DataMode::parse(text).ok_or_else(|| {
        format!(
            "'{text}' is not a journaling mode: expected {}",
            tidefs::fs::DataMode::NAMES_HELP
        )
    })
}

fn parse_size_arg(text: &str) -> Result<u64, String> {
    tidefs_mkfs::parse_size(text)
        .ok_or_else(|| format!("'{text}' is not a size (examples: 4096, 64K, 64M, 1G)"))
}

/// The harness and the benchmarks open thousands of crashed images on purpose: the library's
/// recovery and audit messages would drown their reports, so only errors are shown there unless
/// `RUST_LOG` asks for more.
fn quiet_library() {
    if std::env::var_os("RUST_LOG").is_none() {
        log::set_max_level(log::LevelFilter::Error);
    }
}

/// The mount daemon allocates a 4 KiB page buffer per block written and frees it after
/// write-back, from many request threads at once. Under glibc's allocator a quarter of the
/// daemon's processor time went to growing and trimming its arenas (page faults, the kernel
/// clearing the pages again, `madvise`); mimalloc keeps freed pages for reuse per thread.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Turns transparent huge pages off for this process, as database servers advise. mimalloc
/// asks for huge pages on its memory; the page buffers of one commit are allocated on the
/// thread that runs it, which with many syncing threads is a different one each time, so
/// freed memory goes back to the kernel and comes again as fresh 2 MiB pages the kernel
/// must clear. 64 threads of write + fdatasync (`tidefs bench burst`, in process) spent
/// more than half of the processor time clearing pages, and a fifth of the commits stopped
/// 8-26 ms to build their buffers; with 4 KiB pages, three alternating runs gave 0.86-1.03
/// times ext4's operations against 0.59-0.83, and a p99 of 7-17 ms against 21-44 (README,
/// `bench burst`). The setting belongs to the process and is inherited by the programs it
/// starts (the benchmarks' `fuse2fs` and `postmark`, e2fsprogs). Kernels before 3.15 refuse
/// it: nothing changes there.
fn without_huge_pages() {
    if let Err(e) = rustix::thread::disable_transparent_huge_pages(true) {
        log::debug!("transparent huge pages stay on: {e}");
    }
}

fn main() -> ExitCode {
    // The library reports what it finds (errors that put the file system read-only, a replayed
    // journal error, a repaired superblock) through `log`; they go to stderr, which is the
    // daemon's log file. `RUST_LOG` overrides the level.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_target(false)
        .init();
    without_huge_pages();
    if helper::started_as_helper() {
        return match helper::run(std::env::args_os().skip(1)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("tidefs: {}: {}", e.what, e.why);
                ExitCode::from(e.code)
            }
        };
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                e.exit();
            }
            let rendered = e.to_string();
            let mut lines = rendered
                .lines()
                .filter(|l| !l.trim().is_empty() && !l.starts_with("For more information"));
            let first = lines.next().unwrap_or("").trim_start_matches("error: ");
            eprintln!("tidefs: usage: {first}");
            for line in lines {
                eprintln!("  {}", line.trim());
            }
            eprintln!("(run `tidefs --help` for usage)");
            // fsck(8) reserves 16 for usage errors.
            let is_fsck = std::env::args().nth(1).as_deref() == Some("fsck");
            return ExitCode::from(if is_fsck { fsck::USAGE } else { 2 });
        }
    };
    if matches!(cli.command, Command::DumpJournal(_)) {
        sys::default_sigpipe();
    }
    match run(cli.command) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("tidefs: {}: {}", e.what, e.why);
            ExitCode::from(e.code)
        }
    }
}

fn run(command: Command) -> Result<u8, CliError> {
    match command {
        Command::Mkfs {
            size,
            journal_size,
            journal_device,
            inodes,
            force,
            default_mode,
            image,
        } => {
            let journal = journal_device.clone();
            let opts = tidefs_mkfs::MkfsOptions {
                size,
                journal_size,
                journal_device,
                inode_count: inodes,
                label: None,
                blocks_per_group: None,
                force,
            };
            mkfs::run(&image, opts)?;
            if let Some(mode) = default_mode {
                mkfs::set_root_mode(&image, journal, mode)?;
            }
            Ok(0)
        }
        Command::Mount {
            foreground,
            options,
            daemon_child,
            image,
            mountpoint,
        } => {
            mount::run(mount::MountArgs {
                foreground,
                daemon_child,
                options,
                image,
                mountpoint,
            })?;
            Ok(0)
        }
        Command::DumpJournal(args) => dump_journal::run(args),
        Command::Umount { mountpoint } => {
            umount(&mountpoint)?;
            Ok(0)
        }
        Command::Journal { which } => journal::run(which),
        Command::Sync { mountpoint } => {
            sync(&mountpoint)?;
            Ok(0)
        }
        Command::Fsck {
            no_modify,
            preen,
            yes,
            journal_device,
            image,
        } => {
            let mode = match (no_modify, preen, yes) {
                (false, false, false) => fsck::Mode::Check,
                (true, false, false) => fsck::Mode::ReadOnly,
                (false, true, false) => fsck::Mode::Preen,
                (false, false, true) => fsck::Mode::Yes,
                _ => {
                    eprintln!("tidefs: fsck: -n, -p and -y exclude each other");
                    return Ok(fsck::USAGE);
                }
            };
            Ok(fsck::run(&image, journal_device.as_deref(), mode))
        }
        Command::Stats { json, mountpoint } => {
            stats(&mountpoint, json)?;
            Ok(0)
        }
        Command::Status { mountpoint } => {
            let mut client = control::Client::connect(&mountpoint)
                .map_err(|_| not_tidefs("status", &mountpoint))?
                .patience(control::QUICK_ANSWER);
            let reply = client.request("status").map_err(|e| match e {
                control::ClientError::NotTidefs => not_tidefs("status", &mountpoint),
                control::ClientError::Failed(why) => CliError::new("status", why),
            })?;
            // Only now: the request itself went over a socket.
            sys::default_sigpipe();
            println!("{reply}");
            Ok(0)
        }
        Command::Bench { which } => {
            quiet_library();
            run_bench(which)?;
            Ok(0)
        }
        Command::Crashtest(args) => {
            quiet_library();
            crashtest::run(args)
        }
        Command::InstallHelper { dir } => {
            let link = helper::install(&dir)?;
            println!("installed {}", link.display());
            Ok(0)
        }
        Command::Demo { image, size } => {
            demo::run(&image, size)?;
            Ok(0)
        }
    }
}

/// `tidefs bench ...`.
fn run_bench(which: BenchCommand) -> Result<(), CliError> {
    match which {
        BenchCommand::Recovery {
            threads,
            writes,
            record_size,
            runs,
            mode,
            dir,
            json,
        } => {
            if threads == 0 || writes == 0 || record_size == 0 || runs == 0 {
                return Err(CliError::usage(
                    "bench recovery",
                    "counts and sizes must be positive",
                ));
            }
            let cfg = bench::RecoveryBench {
                threads,
                writes,
                record_size,
                runs,
                modes: parse_modes(&mode)?,
                dir: dir.unwrap_or_else(bench::default_dir),
                json,
            };
            bench::run(&cfg)
        }
        BenchCommand::Burst(args) => {
            bench::catch_interrupts()?;
            bench::burst::run(args)
        }
        BenchCommand::Postmark(args) => {
            bench::catch_interrupts()?;
            bench::postmark::run(args)
        }
        BenchCommand::Checkpoint(args) => {
            bench::catch_interrupts()?;
            bench::checkpoint::run(args)
        }
        BenchCommand::Sqlite(args) => {
            bench::catch_interrupts()?;
            bench::sqlite::run(args)
        }
        BenchCommand::Streams(args) => {
            bench::catch_interrupts()?;
            bench::streams::run(args)
        }
    }
}

fn not_tidefs(what: &str, mountpoint: &std::path::Path) -> CliError {
    CliError::new(
        what,
        format!("{} is not a tidefs mount", mountpoint.display()),
    )
}

/// `tidefs umount`: asks the daemon to unmount, then waits until it closed the file system and
/// exited.
pub fn umount(mountpoint: &std::path::Path) -> Result<(), CliError> {
    let what = "umount";
    let mut client = match control::Client::connect(mountpoint) {
        Ok(client) => client,
        Err(_) if control::is_tidefs_mounted(mountpoint) => {
            if let Some(socket) = control::untrusted_socket(mountpoint) {
                return Err(CliError::new(
                    what,
                    format!(
                        "{}: its daemon's socket {} is in a directory that is not private to \
                         this user (another user's, or open to others); not detaching a mount \
                         whose daemon may be alive",
                        mountpoint.display(),
                        socket.display()
                    ),
                ));
            }
            // A tidefs mount without a daemon: it was killed. Detach what is left.
            let path = control::canonical_mountpoint(mountpoint);
            mount::kernel_unmount(&path, true)
                .map_err(|e| CliError::new(what, format!("{}: {e}", path.display())))?;
            return Err(CliError::new(
                what,
                format!(
                    "{}: the daemon is gone; removed the mount without a clean close \
                     (run `tidefs fsck IMAGE`)",
                    path.display()
                ),
            ));
        }
        Err(_) => return Err(not_tidefs(what, mountpoint)),
    };
    let failed = |e: control::ClientError| match e {
        control::ClientError::NotTidefs => not_tidefs(what, mountpoint),
        control::ClientError::Failed(why) => {
            CliError::new(what, format!("{}: {why}", mountpoint.display()))
        }
    };
    client.request("unmount").map_err(failed)?;
    client.next_reply().map_err(failed)?;
    client.wait_closed();
    Ok(())
}

/// `tidefs sync`: the daemon commits the running transaction and flushes; returns once that is
/// durable. Unlike sync(2), which the kernel passes to a FUSE daemon only where it sends
/// FUSE_SYNCFS, this always reaches the file system.
fn sync(mountpoint: &std::path::Path) -> Result<(), CliError> {
    let what = "sync";
    let mut client =
        control::Client::connect(mountpoint).map_err(|_| not_tidefs(what, mountpoint))?;
    client.request("sync").map_err(|e| match e {
        control::ClientError::NotTidefs => not_tidefs(what, mountpoint),
        control::ClientError::Failed(why) => CliError::new(what, why),
    })?;
    Ok(())
}

fn stats(mountpoint: &std::path::Path, as_json: bool) -> Result<(), CliError> {
    let what = "stats";
    let mut client = control::Client::connect(mountpoint)
        .map_err(|_| not_tidefs(what, mountpoint))?
        .patience(control::QUICK_ANSWER);
    let reply = client.request("stats").map_err(|e| match e {
        control::ClientError::NotTidefs => not_tidefs(what, mountpoint),
        control::ClientError::Failed(why) => CliError::new(what, why),
    })?;
    // Only now: the request itself went over a socket.
    sys::default_sigpipe();
    let value = reply.get("stats").cloned().unwrap_or_default();
    let stats: tidefs::fs::Stats = serde_json::from_value(value)
        .map_err(|e| CliError::new(what, format!("bad reply from the daemon: {e}")))?;
    let requests = reply
        .get("fuse_requests")
        .cloned()
        .unwrap_or_else(|| serde_json::json!({}));
    if as_json {
        // OK to unwrap: a plain struct of numbers always serializes to an object.
        let mut out = serde_json::to_value(&stats).expect("stats serialize");
        out["fuse_requests"] = requests;
        println!(
            "{}",
            serde_json::to_string_pretty(&out).expect("stats serialize")
        );
    } else {
        let mut kinds: Vec<(String, u64)> = requests
            .as_object()
            .map(|r| {
                r.iter()
                    .filter_map(|(kind, n)| Some((kind.clone(), n.as_u64()?)))
                    .collect()
            })
            .unwrap_or_default();
        // Most frequent first, then by name.
        kinds.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        print!("{}", stats_table(&stats));
        print!("{}", requests_table(&kinds));
    }
    Ok(())
}

/// The FUSE requests a mount served, one line per kind (most frequent first), and their total.
pub fn requests_table(requests: &[(String, u64)]) -> String {
    let total: u64 = requests.iter().map(|(_, n)| n).sum();
    let mut out = format!("{:<24}{:>20}\n", "fuse_requests", total);
    for (kind, n) in requests {
        out += &format!("  {kind:<22}{n:>20}\n");
    }
    out
}

/// The human form of the counters.
pub fn stats_table(s: &tidefs::fs::Stats) -> String {
    let rows: [(&str, String); 25] = [
        ("journal_bytes", bytes(s.journal_bytes)),
        ("home_bytes", bytes(s.home_bytes)),
        ("commits", s.commits.to_string()),
        ("fsyncs", s.fsyncs.to_string()),
        ("fsyncs_per_commit", format!("{:.2}", s.fsyncs_per_commit)),
        (
            "avg_transaction_blocks",
            format!("{:.2}", s.avg_transaction_blocks),
        ),
        ("fsync_p50", format!("{} us", s.fsync_p50_us)),
        ("fsync_p99", format!("{} us", s.fsync_p99_us)),
        ("checkpoints", s.checkpoints.to_string()),
        ("flushes", s.flushes.to_string()),
        ("changed_metadata_bytes", bytes(s.changed_metadata_bytes)),
        ("range_records", s.range_records.to_string()),
        ("range_bytes", bytes(s.range_bytes)),
        ("compact_commits", s.compact_commits.to_string()),
        ("deferred_reads", s.deferred_reads.to_string()),
        ("reads_after_change", s.reads_after_change.to_string()),
        ("reads_under_lock", s.reads_under_lock.to_string()),
        (
            "dir_indexes_built_unlocked",
            s.dir_indexes_built_unlocked.to_string(),
        ),
        ("failed_after_change", s.failed_after_change.to_string()),
        ("journal_room_waits", s.journal_room_waits.to_string()),
        (
            "late_journal_reservations",
            s.late_journal_reservations.to_string(),
        ),
        (
            "journal_credit_overruns",
            s.journal_credit_overruns.to_string(),
        ),
        ("metadata_locked", s.metadata_locked.to_string()),
        (
            "metadata_hold_max",
            format!("{} us", s.metadata_hold_max_us),
        ),
        (
            "metadata_holds_over_ms",
            s.metadata_holds_over_ms.to_string(),
        ),
    ];
    rows.iter()
        .map(|(k, v)| format!("{k:<24}{v:>20}\n"))
        .collect()
}

fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{n} ({value:.1} {})", UNITS[unit])
    }
}
