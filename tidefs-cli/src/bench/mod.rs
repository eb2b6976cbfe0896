//! `tidefs bench`: benchmarks that run tidefs beside its peers in one run and print tables.
//!
//! - `recovery` ([`recovery`]): recovery time per pass after a crash with a full journal.
//! - `burst` ([`burst`]): threads each doing write(125 B) + fdatasync on their own file, on
//!   tidefs through FUSE, tidefs in-process and the kernel's ext4; plus a read-latency probe.
//! - `postmark` ([`postmark`]): Debian's `postmark` with one configuration for every system.
//! - `checkpoint` ([`checkpoint`]): the checkpoint of a parallel job, each rank writing a file
//!   of its own sequentially and fsyncing it, and its restart, every file read back after a
//!   remount.
//! - `sqlite` ([`sqlite`]): SQLite inserts, updates and deletes, autocommit with
//!   `synchronous=FULL`, the rollback journal moved to a directory of its own by the VFS of
//!   [`sqlite_vfs`] (the only `unsafe` code of the benchmarks): on `tidefs:split` a
//!   `lightweight` directory beside the database's `journal` one.
//! - `streams` ([`streams`]): many streams each appending records with fdatasync, paced at a
//!   bit rate or in a burst; journal and home bytes per app byte with the journal on its own
//!   device.
//!
//! [`systems`] sets up each system on its own loop device with direct I/O (so that every system
//! reaches the same backing disk the same way and the device's counters measure them all alike)
//! and tears it down, also on error paths; [`report`] holds percentiles, tables, JSON and plots.
//!
//! Invariants:
//! - Every mount and loop device a benchmark creates is owned by a guard whose `Drop` removes
//!   it, so an error or a panic half-way leaves nothing mounted or attached. Ctrl-C (SIGINT),
//!   SIGTERM and SIGHUP only raise a flag ([`catch_interrupts`]); the workloads stop at the next
//!   operation and return an error, so the guards run then too. A second signal exits at once.
//! - Tables compare systems measured in the same run, interleaved, never against numbers from
//!   another run.

pub mod burst;
pub mod checkpoint;
pub mod postmark;
pub mod recovery;
mod report;
pub mod sqlite;
mod sqlite_vfs;
pub mod streams;
mod systems;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::CliError;

pub use recovery::{run, RecoveryBench};

/// The default place for benchmark images.
pub fn default_dir() -> PathBuf {
    Path::new("/var/tmp").join("tidefs-bench")
}

/// The options the comparison benchmarks (burst, postmark, checkpoint, sqlite, streams) share.
#[derive(clap::Args, Debug)]
pub struct CommonArgs {
    /// Rounds over every measurement; the tables show the median.
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    /// Size of each system's image.
    #[arg(long, value_parser = crate::parse_size_arg, default_value = "1G")]
    pub size: u64,
    /// Directory for the images and mountpoints (default /var/tmp/tidefs-bench).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

impl CommonArgs {
    /// Where the images go.
    pub fn dir(&self) -> PathBuf {
        self.dir.clone().unwrap_or_else(default_dir)
    }
}

/// Runs `one` for each of `systems` in each of `runs` rounds (the systems interleaved within a
/// round, so a drift of the machine's speed touches them all), behind a progress bar
/// labelled `label`; returns the samples in that order.
fn rounds<S>(
    what: &str,
    label: &str,
    runs: usize,
    systems: &[systems::System],
    mut one: impl FnMut(&systems::System, usize) -> Result<S, CliError>,
) -> Result<Vec<S>, CliError> {
    let bar = report::progress(runs * systems.len(), label);
    let mut samples = Vec::new();
    for run in 0..runs {
        for system in systems {
            check_interrupt(what)?;
            bar.set_message(system.name());
            samples.push(one(system, run)?);
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    Ok(samples)
}

/// Set once a stop signal arrived ([`catch_interrupts`]).
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Turns SIGINT, SIGTERM and SIGHUP into the [`interrupted`] flag, so that a stopped benchmark
/// still unmounts and detaches what it set up; a second signal exits at once (status 130).
/// Call it before any thread exists: the signals are blocked in every thread but one that waits
/// for them (child processes start with an empty mask, so postmark and the tools still stop).
pub fn catch_interrupts() -> Result<(), CliError> {
    let signals = crate::sys::STOP_SIGNALS;
    crate::sys::block_signals(&signals)
        .map_err(|e| CliError::new("bench: signals", e.to_string()))?;
    std::thread::spawn(move || {
        while crate::sys::wait_signal(&signals).is_ok() {
            if INTERRUPTED.swap(true, Ordering::SeqCst) {
                std::process::exit(130);
            }
            eprintln!("tidefs: bench: interrupted; cleaning up (again to exit at once)");
        }
    });
    Ok(())
}

/// Whether a stop signal arrived.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// An error once a stop signal arrived, for the loops of the workloads.
pub fn check_interrupt(what: &str) -> Result<(), CliError> {
    if interrupted() {
        return Err(CliError {
            code: 130,
            ..CliError::new(what, "interrupted")
        });
    }
    Ok(())
}
