//! `tidefs bench`: benchmarks that run tidefs beside its peers in one run and print tables.
//!
//! - `recovery` ([`recovery`]): recovery time per pass after a crash with a full journal.
//! - `burst` ([`burst`]): threads each doing write(125 B) + fdatasync on their own file, on
//!   tidefs through FUSE, tidefs in-process and the kernel's ext4; plus a read-latency probe.
//! - `postmark` ([`postmark`]): Debian's `postmark` with one configuration for every system.
//! - `sqlite` ([`sqlite`]): SQLite autocommit transactions with `synchronous=FULL`.
//!
//! [`systems`] sets up each system on its own loop device with direct I/O (so that every system
//! reaches the same backing disk the same way and the device's counters measure them all alike)
//! and tears it down, also on error paths; [`report`] holds percentiles, tables, JSON and plots.
//!
//! Invariants:
//! - Every mount and loop device a benchmark creates is owned by a guard whose `Drop` removes
//!   it, so an error or a panic half-way leaves nothing mounted or attached.
//! - Tables compare systems measured in the same run, interleaved, never against numbers from
//!   another run.

pub mod burst;
pub mod postmark;
pub mod recovery;
mod report;
pub mod sqlite;
mod systems;

use std::path::{Path, PathBuf};

pub use recovery::{run, RecoveryBench};

/// The default place for benchmark images.
pub fn default_dir() -> PathBuf {
    Path::new("/var/tmp").join("tidefs-bench")
}

/// The default systems of the benchmarks that run programs on a mounted path.
pub const PATH_SYSTEMS: &str = "tidefs:lightweight,tidefs:writeback,tidefs:ordered,tidefs:journal,\
                                ext4:ordered,ext4:journal,ext4:writeback,fuse2fs";

/// The options the comparison benchmarks (burst, postmark, sqlite) share.
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
