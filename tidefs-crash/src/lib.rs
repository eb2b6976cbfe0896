//! The crash-state harness (docs/DESIGN.md §6): record a workload's writes and flushes,
//! rebuild the disk as a power cut could leave it, recover, and check the promises.
//!
//! This crate is a user of the `tidefs` library like any other: it opens file systems with
//! `Fs::open_devices` on devices of its own choosing and reads them back through the `Fs` API.
//! It owns the workloads ([`workload`]), the crash-state generator ([`gen`]), the [`oracle`]
//! and the canaries ([`canary`]: devices that break one ordering on purpose).
//!
//! A run, for one data mode:
//! 1. make a small base image with the real `mkfs.ext4`, fill its free blocks with a marker
//!    pattern (so a file that shows a block nobody wrote shows garbage, not zeros), run the
//!    setup of the file set and unmount cleanly;
//! 2. for each workload of the family (in a fixed, seeded order): run it through the library on
//!    a [`RecordingDevice`](tidefs::dev::record::RecordingDevice) over a copy of the base, then
//!    unmount cleanly (the unmount's checkpoint writes are crash points too);
//! 3. list the workload's crash states: the state at every flush, sampled subsets and orders of
//!    the writes in flight between flushes, and crashes during recovery of some of those;
//! 4. for each state, recover through the library and ask the [`oracle`].
//!
//! Every state has a global index (workloads in order, their states in order), so a failing
//! state replays alone: `tidefs crashtest --mode M --workloads F --seed S --state I`.
//!
//! Invariants:
//! - the list of states of a workload depends only on the seed, the workload and the shape of
//!   its log (offsets, lengths, flushes), never on the budget, so indices are stable;

pub mod canary;
pub mod gen;
pub mod oracle;
pub mod workload;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidefs::dev::record::RecordingDevice;
use tidefs::dev::{BlockDevice, FileDev, MemDev};
use tidefs::fs::{DataMode, Fs, MountOptions};
use tidefs::{FsError, Result};

use canary::{Canary, JournalArea};
use gen::{build_image, epochs, flush_state, sampled_state, CrashState, Epoch, Rng};
use oracle::{RTree, ScratchImage};
use workload::{DataWrite, Family, Model, RecordDevices, Recorded, Workload, Workloads};

/// Sampled in-flight states per epoch (fewer when the epoch has fewer distinct subsets).
pub const SAMPLES_PER_EPOCH: u64 = 3;
/// Crash-during-recovery states per workload.
pub const RECOVERY_STATES_PER_WORKLOAD: u64 = 2;
/// Block size of every harness image.
pub const BLOCK_BYTES: u64 = 4096;

/// Blocks per group of [`ImageShape::Groups`].
const GROUPS_BLOCKS_PER_GROUP: u32 = 1024;

/// What e2fsck says when the primary superblock fails its checksum.
const TORN_PRIMARY_SUPERBLOCK: &str = "Superblock checksum does not match superblock";

/// The geometry of the base image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageShape {
    /// 8 MiB, one block group, mke2fs' smallest journal (4 MiB): the `ace` and `random`
    /// families' image.
    OneGroup,
    /// 16 MiB in four block groups of 4 MiB (so there are backup superblocks and
    /// group descriptors, and allocation crosses groups), with a 4 MiB journal: the `threads`
    /// family's image, whose prelude makes that journal wrap.
    Groups,
}

impl ImageShape {
    /// Parses `one-group` or `groups`.
    pub fn parse(s: &str) -> Option<ImageShape> {
        match s {
            "one-group" => Some(ImageShape::OneGroup),
            "groups" => Some(ImageShape::Groups),
            _ => None,
        }
    }

    /// The name.
    pub fn name(self) -> &'static str {
        match self {
            ImageShape::OneGroup => "one-group",
            ImageShape::Groups => "groups",
        }
    }

    /// The shape a family runs on unless told otherwise.
    pub fn for_family(family: Family) -> ImageShape {
        match family {
            Family::Threads => ImageShape::Groups,
            Family::Ace | Family::Random | Family::All => ImageShape::OneGroup,
        }
    }

    /// The block of the first backup superblock (group 1), if the image has one.
    pub fn backup_superblock(self) -> Option<u64> {
        match self {
            ImageShape::OneGroup => None,
            ImageShape::Groups => Some(GROUPS_BLOCKS_PER_GROUP.into()),
        }
    }

    /// Size of the image.
    pub fn image_bytes(self) -> u64 {
        match self {
            ImageShape::OneGroup => 8 << 20,
            ImageShape::Groups => 16 << 20,
        }
    }

    fn mkfs_options(self) -> tidefs_mkfs::MkfsOptions {
        let groups = self == ImageShape::Groups;
        tidefs_mkfs::MkfsOptions {
            size: Some(self.image_bytes()),
            journal_size: groups.then_some(4 << 20),
            blocks_per_group: groups.then_some(GROUPS_BLOCKS_PER_GROUP),
            ..Default::default()
        }
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct Config {
    /// Data mode of the recorded runs and of recovery: the mount's default, which the root
    /// directory obeys.
    pub mode: DataMode,
    /// A mixed tree: directory `A` of the file set gets this mode of its own in the setup,
    /// and the workloads switch it between modes while they run (`SetMode` ops; a switcher
    /// thread in the `threads` family). Each file is then held to the promise of its modes.
    pub dir_mode: Option<DataMode>,
    /// Workload family.
    pub family: Family,
    /// Budget: states checked (global indices `0..states`).
    pub states: u64,
    /// Seed of every random choice.
    pub seed: u64,
    /// Check only this global state index (replay).
    pub only_state: Option<u64>,
    /// A deliberately broken ordering in the recorded runs (a device in front of the
    /// recording device; recovery never uses it).
    pub canary: Option<Canary>,
    /// The base image's geometry (it must match the image given to [`Harness::new`]).
    pub image: ImageShape,
    /// Record through the real file-backed device (`FileDev` on an image file in this
    /// directory) instead of an in-memory one.
    pub file_dev_dir: Option<PathBuf>,
    /// Let sampled states tear writes at 512-byte sectors.
    pub torn: bool,
    /// Add sampled three-step sequences to the ACE family.
    pub ace_len3: bool,
    /// Compare with e2fsprogs' own journal replay (`e2fsck -fy`) where the journal holds only
    /// standard records.
    pub kernel_compare: bool,
    /// Print progress on stderr.
    pub progress: bool,
    /// Record with `MountOptions::fenced_commits`: every commit block after a flush of its
    /// body (the other barrier strategy of the journal; unfenced commits are the default).
    pub fenced_commits: bool,
}

impl Config {
    /// Defaults for `mode`: ACE family on its one-group image in memory, 1000 states, seed 1,
    /// kernel comparison on, torn writes on in CI (`TIDEFS_CI=1`) and off elsewhere.
    pub fn new(mode: DataMode) -> Config {
        Config {
            mode,
            dir_mode: None,
            family: Family::Ace,
            states: 1000,
            seed: 1,
            only_state: None,
            canary: None,
            image: ImageShape::OneGroup,
            file_dev_dir: None,
            torn: tidefs::test_support::in_ci(),
            ace_len3: false,
            kernel_compare: true,
            progress: false,
            fenced_commits: false,
        }
    }

    /// Whether any directory of the run may be in `lightweight` mode, whose crash images
    /// e2fsck may find leaks in.
    pub fn lightweight_in_play(&self) -> bool {
        self.mode == DataMode::Lightweight || self.dir_mode == Some(DataMode::Lightweight)
    }

    /// The modes mixed-mode workloads switch directory `A` between (empty: not mixed): its
    /// own, the root's, and the journaling modes; `lightweight` only when the run has it.
    pub fn switch_modes(&self) -> Vec<DataMode> {
        let Some(dir) = self.dir_mode else {
            return Vec::new();
        };
        let mut v = vec![dir, self.mode];
        for m in [
            DataMode::Ordered,
            DataMode::Journal,
            DataMode::Wasteless,
            DataMode::Selective { threshold: 1024 },
        ] {
            if !v.contains(&m) {
                v.push(m);
            }
        }
        v.dedup();
        v
    }

    /// The command that replays state `index` of this configuration.
    pub fn replay_command(&self, index: u64) -> String {
        let mut s = format!(
            "tidefs crashtest --mode {} --workloads {} --seed {} --state {index}",
            self.mode.name(),
            self.family.name(),
            self.seed
        );
        if let Some(m) = self.dir_mode {
            s.push_str(&format!(" --dir-mode {}", m.name()));
        }
        if let Some(c) = self.canary {
            s.push_str(&format!(" --canary {}", c.name()));
        }
        if self.image != ImageShape::for_family(self.family) {
            s.push_str(&format!(" --image {}", self.image.name()));
        }
        if let Some(d) = &self.file_dev_dir {
            s.push_str(&format!(" --file-dev {}", d.display()));
        }
        s.push_str(if self.torn { " --torn" } else { " --no-torn" });
        if self.ace_len3 {
            s.push_str(" --ace3");
        }
        s
    }
}

/// One crash state whose recovery broke a promise.
#[derive(Clone, Debug)]
pub struct Violation {
    /// Global state index.
    pub state_index: u64,
    /// Workload name.
    pub workload: String,
    /// Its operations.
    pub ops: Vec<String>,
    /// The crash point.
    pub crash: String,
    /// What differed.
    pub problems: Vec<String>,
    /// The command that replays it.
    pub replay: String,
}

/// The result of a run.
#[derive(Clone, Debug)]
pub struct Report {
    /// Mode.
    pub mode: DataMode,
    /// Family.
    pub family: Family,
    /// Seed.
    pub seed: u64,
    /// Crash states checked.
    pub states_tried: u64,
    /// Distinct crash images recovered and checked.
    pub images_checked: u64,
    /// Workloads recorded.
    pub workloads: u64,
    /// Workloads whose journal wrapped after their operations began.
    pub journal_wraps: u64,
    /// Distinct images whose journal carries one of tidefs's incompat bits (it may hold
    /// extension records or unfenced commits, which only tidefs reads), which e2fsprogs
    /// refuses by design, so its replay was not compared with tidefs's.
    pub uncompared_tidefs_journal: u64,
    /// Distinct images e2fsprogs could not open (a torn primary superblock on an image
    /// without a backup), so its replay was not compared with tidefs's.
    pub uncompared_torn: u64,
    /// Operations that failed while recording (a model or fs problem, not a crash problem).
    pub op_failures: Vec<String>,
    /// Violations found.
    pub violations: Vec<Violation>,
    /// Wall time.
    pub elapsed: Duration,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "crashtest mode={} workloads={} seed={}: {} states ({} distinct images) from {} \
             workloads ({} with a wrapped journal) in {:.1}s, {} violation(s)",
            self.mode.name(),
            self.family.name(),
            self.seed,
            self.states_tried,
            self.images_checked,
            self.workloads,
            self.journal_wraps,
            self.elapsed.as_secs_f64(),
            self.violations.len()
        )?;
        if self.uncompared_tidefs_journal > 0 {
            writeln!(
                f,
                "  {} image(s) whose journal carries a tidefs incompat bit (e2fsck refuses \
                 them by design): recovery checked by e2fsck -fn, not compared with e2fsck's \
                 replay",
                self.uncompared_tidefs_journal
            )?;
        }
        if self.uncompared_torn > 0 {
            writeln!(
                f,
                "  {} image(s) with a torn primary superblock and no backup: e2fsck cannot open \
                 them, not compared",
                self.uncompared_torn
            )?;
        }
        for fail in &self.op_failures {
            writeln!(f, "  op failed while recording: {fail}")?;
        }
        for v in &self.violations {
            writeln!(f, "VIOLATION state {} ({}):", v.state_index, v.workload)?;
            writeln!(f, "  ops: {}", v.ops.join("; "))?;
            writeln!(f, "  crash: {}", v.crash)?;
            for p in &v.problems {
                writeln!(f, "  - {p}")?;
            }
            writeln!(f, "  replay: {}", v.replay)?;
        }
        Ok(())
    }
}

/// Which state of a workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Spec {
    /// At the flush that opens epoch `e`.
    Flush(usize),
    /// Sample `k` of epoch `e`.
    Sampled(usize, u64),
    /// Recovery of the parent state, interrupted at its sample `k`.
    Recovery(Box<Spec>, u64),
}

/// A formatted image before the setup, and where its journal lies.
#[derive(Clone, Debug)]
pub struct FreshImage {
    /// Its geometry.
    pub shape: ImageShape,
    /// The image.
    pub bytes: Vec<u8>,
    /// The journal's device blocks, for the canaries and the prelude.
    pub journal: JournalArea,
}

/// A formatted fresh image: `mkfs.ext4` through [`tidefs_mkfs`], free blocks filled with a
/// marker pattern.
pub fn make_fresh_image(shape: ImageShape) -> Result<FreshImage> {
    let dir = std::env::temp_dir();
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = dir.join(format!("tidefs-crash-base-{}-{n}.img", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let r = (|| {
        tidefs_mkfs::mkfs(&path, &shape.mkfs_options())?;
        let mut bytes = std::fs::read(&path)?;
        fill_free_blocks(&path, &mut bytes)?;
        let journal = journal_area(&path)?;
        Ok(FreshImage {
            shape,
            bytes,
            journal,
        })
    })();
    let _ = std::fs::remove_file(&path);
    r
}

/// Runs an e2fsprogs tool on `path`; its standard output.
fn e2fsprogs_output(tool: &str, args: &[&str], path: &Path) -> Result<String> {
    let exe = tidefs_mkfs::find_e2fsprogs_tool(tool)
        .ok_or_else(|| FsError::Io(std::io::Error::other(format!("{tool} not found"))))?;
    let out = std::process::Command::new(exe)
        .args(args)
        .arg(path)
        .output()?;
    if !out.status.success() {
        return Err(FsError::Io(std::io::Error::other(format!(
            "{tool} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ))));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The blocks of the journal inode (8) of the image at `path`, in logical order, as
/// `debugfs -R "blocks <8>"` lists them.
fn journal_area(path: &Path) -> Result<JournalArea> {
    let text = e2fsprogs_output("debugfs", &["-R", "blocks <8>"], path)?;
    let blocks: Vec<u64> = text
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    if blocks.is_empty() {
        return Err(FsError::Io(std::io::Error::other(
            "debugfs lists no journal blocks",
        )));
    }
    Ok(JournalArea::from_blocks(&blocks, BLOCK_BYTES))
}

/// Fills the free blocks of the image at `path` (also in `img`) with a marker pattern of
/// non-zero bytes: "FREE" plus the block number, repeated.
fn fill_free_blocks(path: &Path, img: &mut [u8]) -> Result<()> {
    let text = e2fsprogs_output("dumpe2fs", &[], path)?;
    // The harness's block size fits in usize.
    let bs = BLOCK_BYTES as usize;
    for line in text.lines() {
        let Some(list) = line.trim().strip_prefix("Free blocks: ") else {
            continue;
        };
        for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (a, b) = part.split_once('-').unwrap_or((part, part));
            let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) else {
                continue;
            };
            for blk in a..=b {
                let Some(block) = img.get_mut(blk * bs..(blk + 1) * bs) else {
                    continue;
                };
                for (i, word) in block.chunks_mut(8).enumerate() {
                    let mut v = *b"FREE\0\0\0\0";
                    // Block numbers of a harness image fit in u32.
                    // The high bits keep every byte non-zero, so no byte passes as a hole.
                    let tag = ((blk as u32) ^ (i as u32)) | 0x8080_8080;
                    v[4..].copy_from_slice(&tag.to_le_bytes());
                    word.copy_from_slice(&v[..word.len()]);
                }
            }
        }
    }
    Ok(())
}

/// Mount options of the recorded runs: the mode, no timed commits and no background
/// checkpoints (a workload's commits come from its persistence points only, so its log is
/// reproducible).
fn mount_opts(cfg: &Config) -> MountOptions {
    MountOptions {
        data_mode: cfg.mode,
        commit_interval: Duration::from_secs(3600),
        // Every device write follows from the operations (no background checkpoints, large
        // transactions committed by the operations that find them): the recording must not
        // depend on thread timing, so that a seed replays the same states. The log is still
        // checkpointed when full.
        deterministic_writes: true,
        fenced_commits: cfg.fenced_commits,
        // A commit allocates for more than one page over holes in pieces before its close
        // (docs/DESIGN.md §2.5): the workloads' few-page writes go through it too, not only
        // megabytes.
        allocate_piece_pages: 1,
        ..MountOptions::default()
    }
}

/// What e2fsck says of a journal that carries one of tidefs's incompat bits.
const UNKNOWN_JOURNAL_FEATURE: &str = "Journal superblock has an unknown incompatible feature flag";

/// Whether the journal of `image` carries one of tidefs's incompat bits (byte-range records,
/// compact commits or unfenced transactions may be in its log), which e2fsprogs and the
/// kernel refuse to replay.
fn journal_needs_tidefs(image: &[u8]) -> bool {
    let dev: Arc<dyn BlockDevice> = Arc::new(MemDev::from_bytes(image.to_vec()));
    tidefs::journal::image_journal(dev, None)
        .and_then(tidefs::journal::dump)
        .is_ok_and(|d| d.tidefs_only())
}

/// Mount options of recovery and of the oracle's checks.
fn oracle_opts(cfg: &Config) -> MountOptions {
    MountOptions {
        data_mode: cfg.mode,
        commit_interval: Duration::from_secs(3600),
        ..MountOptions::default()
    }
}

/// The states of a recorded workload, in index order.
pub fn state_specs(rec: &Recorded, seed: u64, workload_index: u64) -> Vec<Spec> {
    let eps = epochs(&rec.recording.log);
    let first = eps
        .iter()
        .position(|e| e.end >= rec.first_op_pos)
        .unwrap_or(0);
    let mut specs = Vec::new();
    for (e, ep) in eps.iter().enumerate().skip(first) {
        specs.push(Spec::Flush(e));
        let n = ep.writes.len().min(10);
        let distinct = (1u64 << n) - 1;
        for k in 0..SAMPLES_PER_EPOCH.min(distinct) {
            specs.push(Spec::Sampled(e, k));
        }
    }
    let parents: Vec<Spec> = specs.clone();
    let mut r = Rng::derive(seed, 11, workload_index);
    for k in 0..RECOVERY_STATES_PER_WORKLOAD {
        if parents.is_empty() {
            break;
        }
        let p = parents[r.below(parents.len() as u64) as usize].clone();
        specs.push(Spec::Recovery(Box::new(p), k));
    }
    specs
}

/// Everything one mode's run shares.
pub struct Harness {
    cfg: Config,
    base: Arc<Vec<u8>>,
    journal: JournalArea,
    model: Model,
    setup_writes: Vec<DataWrite>,
}

/// An image file the recorded run goes through (file-backed recording), removed on drop.
struct RecordFile(PathBuf);

impl Drop for RecordFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The image of a state and where its crash lies.
struct Built {
    image: Vec<u8>,
    crash_pos: usize,
    describe: String,
    /// Identity of the image inside its workload, for the cache.
    key: String,
    /// A problem found while building (recovery of the parent failed).
    problem: Option<String>,
}

/// Why e2fsprogs' replay of a crash image could not be compared with tidefs's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Uncompared {
    /// The journal carries one of tidefs's incompat bits: refused by design.
    TidefsJournal,
    /// A torn primary superblock on an image without a backup: e2fsprogs cannot open it.
    Torn,
}

/// What recovery of one image gave, shared by every state with the same image.
#[derive(Clone)]
struct ImageVerdict {
    tree: Option<RTree>,
    problems: Vec<String>,
    /// Why e2fsprogs' replay of the crash image was not compared with tidefs's, if it was
    /// not.
    uncompared: Option<Uncompared>,
}

impl Harness {
    /// Prepares a run: the base image from `fresh` (see [`make_fresh_image`]; its shape must
    /// be `cfg.image`) with the setup applied in `cfg.mode`.
    pub fn new(cfg: Config, fresh: &FreshImage) -> Result<Harness> {
        if fresh.shape != cfg.image {
            return Err(FsError::Invalid(
                "the fresh image's shape is not the configured one",
            ));
        }
        let (base, model, setup_writes) =
            workload::setup_base(fresh.bytes.clone(), &mount_opts(&cfg), cfg.dir_mode)?;
        Ok(Harness {
            cfg,
            base: Arc::new(base),
            journal: fresh.journal.clone(),
            model,
            setup_writes,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The workloads of the configured family.
    pub fn workloads(&self) -> Workloads {
        Workloads::with_switches(
            self.cfg.family,
            self.cfg.seed,
            &self.model,
            self.cfg.ace_len3,
            self.cfg.switch_modes(),
        )
    }

    /// Records one workload: on an in-memory recording device, or on one over the real
    /// file-backed device; with the configured canary in front of it.
    pub fn record(&self, wl: &Workload) -> Result<Recorded> {
        let (recording, file) = match &self.cfg.file_dev_dir {
            None => (Arc::new(RecordingDevice::new(self.base.clone())), None),
            Some(dir) => {
                static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
                let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let file = RecordFile(
                    dir.join(format!("tidefs-crash-rec-{}-{n}.img", std::process::id())),
                );
                std::fs::write(&file.0, self.base.as_slice())?;
                let below = Arc::new(FileDev::open(&file.0, false)?);
                (Arc::new(RecordingDevice::over(below)?), Some(file))
            }
        };
        let below: Arc<dyn BlockDevice> = recording.clone();
        let fs_dev = match self.cfg.canary {
            Some(c) => c.wrap(below, self.journal.clone()),
            None => below,
        };
        let devs = RecordDevices {
            recording,
            fs_dev,
            journal: self.journal.clone(),
        };
        let mut rec = workload::record(
            &devs,
            &self.model,
            &self.setup_writes,
            wl,
            &mount_opts(&self.cfg),
        )?;
        if let Some(file) = &file {
            // The log must describe the real device exactly, or the crash states built from
            // it are not states of that device.
            let on_disk = std::fs::read(&file.0)?;
            if gen::final_image(&rec.recording.base, &rec.recording.log) != on_disk {
                rec.failures.push(format!(
                    "the image file {} differs from its base with every logged write applied",
                    file.0.display()
                ));
            }
        }
        Ok(rec)
    }

    /// Runs the configured budget (or the one replayed state).
    pub fn run(&self) -> Result<Report> {
        let started = Instant::now();
        let cfg = &self.cfg;
        let mut report = Report {
            mode: cfg.mode,
            family: cfg.family,
            seed: cfg.seed,
            states_tried: 0,
            images_checked: 0,
            workloads: 0,
            journal_wraps: 0,
            uncompared_tidefs_journal: 0,
            uncompared_torn: 0,
            op_failures: Vec::new(),
            violations: Vec::new(),
            elapsed: Duration::ZERO,
        };
        let limit = match cfg.only_state {
            Some(i) => i + 1,
            None => cfg.states,
        };
        let mut offset = 0u64;
        for (wi, wl) in self.workloads().enumerate() {
            if offset >= limit {
                break;
            }
            let wi = wi as u64;
            let rec = self.record(&wl)?;
            report.workloads += 1;
            report.journal_wraps += u64::from(rec.journal_wrapped);
            for f in &rec.failures {
                report.op_failures.push(format!("{}: {f}", wl.name));
            }
            let specs = state_specs(&rec, cfg.seed, wi);
            let count = specs.len() as u64;
            if let Some(target) = cfg.only_state {
                if target >= offset + count {
                    offset += count;
                    continue;
                }
            }
            let eps = epochs(&rec.recording.log);
            let mut cache: HashMap<String, ImageVerdict> = HashMap::new();
            for (k, spec) in specs.iter().enumerate() {
                let index = offset + k as u64;
                if index >= limit {
                    break;
                }
                if cfg.only_state.is_some_and(|t| t != index) {
                    continue;
                }
                let (problems, crash) = self.check_state(&rec, &eps, spec, wi, &mut cache);
                report.states_tried += 1;
                if !problems.is_empty() {
                    report.violations.push(Violation {
                        state_index: index,
                        workload: wl.name.clone(),
                        ops: wl.describe_ops(),
                        crash,
                        problems,
                        replay: cfg.replay_command(index),
                    });
                }
                if cfg.progress && report.states_tried % 200 == 0 {
                    eprintln!(
                        "crashtest {}: {} states, {} violation(s), {:.0}s",
                        cfg.mode.name(),
                        report.states_tried,
                        report.violations.len(),
                        started.elapsed().as_secs_f64()
                    );
                }
            }
            report.images_checked += cache.len() as u64;
            for v in cache.values() {
                match v.uncompared {
                    Some(Uncompared::TidefsJournal) => report.uncompared_tidefs_journal += 1,
                    Some(Uncompared::Torn) => report.uncompared_torn += 1,
                    None => {}
                }
            }
            offset += count;
        }
        report.elapsed = started.elapsed();
        Ok(report)
    }

    fn build(&self, rec: &Recorded, eps: &[Epoch], spec: &Spec, wi: u64) -> Built {
        let log = &rec.recording.log;
        let state = |spec: &Spec| -> CrashState {
            match spec {
                Spec::Flush(e) => flush_state(eps, *e),
                Spec::Sampled(e, k) => {
                    let mut r = Rng::derive(self.cfg.seed ^ gen::mix(wi), *e as u64, *k);
                    sampled_state(log, eps, *e, &mut r, self.cfg.torn)
                }
                Spec::Recovery(..) => unreachable!("recovery states have a plain parent"),
            }
        };
        match spec {
            Spec::Flush(_) | Spec::Sampled(..) => {
                let st = state(spec);
                Built {
                    image: build_image(&rec.recording.base, log, eps, &st),
                    crash_pos: st.crash_pos,
                    describe: st.describe(log),
                    key: format!("{}:{:?}", st.epoch, st.applied),
                    problem: None,
                }
            }
            Spec::Recovery(parent, k) => {
                let st = state(parent);
                let parent_image = Arc::new(build_image(&rec.recording.base, log, eps, &st));
                let dev = Arc::new(RecordingDevice::new(parent_image.clone()));
                let mut describe = st.describe(log);
                let opened = Fs::open_devices(
                    dev.clone() as Arc<dyn BlockDevice>,
                    None,
                    &oracle_opts(&self.cfg),
                );
                let problem = match opened {
                    Ok(fs) => {
                        fs.crash();
                        None
                    }
                    Err(e) => Some(format!("recovery of the crash image failed: {e}")),
                };
                let rlog = dev.recording().log;
                let reps = epochs(&rlog);
                let mut r = Rng::derive(self.cfg.seed ^ gen::mix(wi), 1 << 32, *k);
                let e = r.below(reps.len() as u64) as usize;
                let sub = if r.chance(1, 3) {
                    flush_state(&reps, e)
                } else {
                    sampled_state(&rlog, &reps, e, &mut r, self.cfg.torn)
                };
                describe.push_str(&format!(
                    "; then recovery (log of {} entries, {} flushes) crashed in its {}",
                    rlog.len(),
                    reps.len() - 1,
                    sub.describe(&rlog)
                ));
                Built {
                    image: build_image(&parent_image, &rlog, &reps, &sub),
                    crash_pos: st.crash_pos,
                    describe,
                    key: format!(
                        "{}:{:?}/recovery {}:{:?}",
                        st.epoch, st.applied, sub.epoch, sub.applied
                    ),
                    problem,
                }
            }
        }
    }

    fn check_state(
        &self,
        rec: &Recorded,
        eps: &[Epoch],
        spec: &Spec,
        wi: u64,
        cache: &mut HashMap<String, ImageVerdict>,
    ) -> (Vec<String>, String) {
        let built = self.build(rec, eps, spec, wi);
        let mut problems: Vec<String> = built.problem.iter().cloned().collect();
        let verdict = match cache.get(&built.key) {
            Some(v) => v.clone(),
            None => {
                let v = self.recover_and_check(&built.image, rec);
                cache.insert(built.key.clone(), v.clone());
                v
            }
        };
        problems.extend(verdict.problems.iter().cloned());
        if let Some(tree) = &verdict.tree {
            // Promises hold in every mode; the data checks hold each object to the modes it may
            // have obeyed (the mount's one mode, unless the tree is mixed).
            let exp = oracle::expectations(&rec.events, built.crash_pos);
            oracle::check_promises(tree, &exp, &mut problems);
            oracle::check_no_garbage(tree, rec, built.crash_pos, &mut problems);
            oracle::check_atomic_writes(tree, rec, built.crash_pos, &mut problems);
        }
        (problems, built.describe)
    }

    /// Recovers `image` with the library and checks what does not depend on the crash point:
    /// recovery works, the tree walks, `e2fsck -fn` is clean, e2fsprogs' replay agrees.
    fn recover_and_check(&self, image: &[u8], rec: &Recorded) -> ImageVerdict {
        let mut problems = Vec::new();
        let lightweight = self.cfg.lightweight_in_play();
        let dev = Arc::new(MemDev::from_bytes(image.to_vec()));
        let fs = match Fs::open_devices(dev.clone(), None, &oracle_opts(&self.cfg)) {
            Ok(fs) => fs,
            Err(e) => {
                return ImageVerdict {
                    tree: None,
                    problems: vec![format!("recovery / mount failed: {e}")],
                    uncompared: None,
                }
            }
        };
        // Every mode keeps the tree walkable and what a persistence point promised, lightweight
        // too (its in-place writes are durable before the commit counts, and changes of names
        // are journaled): only leaks are its own.
        let tree = match oracle::walk(&fs) {
            Ok(t) => Some(t),
            Err(e) => {
                problems.push(format!("walk after recovery failed: {e}"));
                None
            }
        };
        if let Err(e) = fs.unmount() {
            problems.push(format!("unmount after recovery failed: {e}"));
        }
        drop(fs);
        let recovered = dev.to_bytes();
        let fsck = ScratchImage::new(&recovered)
            .map_err(|e| format!("scratch image: {e}"))
            .and_then(|img| {
                let (code, full) = oracle::e2fsck_full(&img, &["-fn"])?;
                if code == 0 {
                    return Ok(());
                }
                let out = oracle::tail_of(&full);
                if !lightweight {
                    return Err(format!("e2fsck -fn after recovery exits {code}: {out}"));
                }
                // Leaks are allowed; a block or inode in use that the bitmap calls free is not.
                let overclaims = oracle::used_but_marked_free(&full);
                if !overclaims.is_empty() {
                    return Err(format!(
                        "lightweight left used blocks/inodes marked free: {}",
                        overclaims.join(", ")
                    ));
                }
                // In a mixed tree only inodes that may have obeyed lightweight may be damaged.
                if self.cfg.dir_mode.is_some() {
                    let allowed = oracle::lightweight_inodes(&rec.model);
                    let strict: Vec<u64> = oracle::inodes_named(&full)
                        .into_iter()
                        .filter(|i| !allowed.contains(i))
                        .collect();
                    if !strict.is_empty() {
                        return Err(format!(
                            "e2fsck -fn after recovery exits {code} on inodes {strict:?}, which \
                             never obeyed lightweight: {out}"
                        ));
                    }
                }
                // Lightweight promises only the allocation structures: what else a crash leaves
                // (leaks, stale counts, an inode or entry written in place without its partner)
                // must be what a boot-time check mends on its own, `e2fsck -p` (the promise of
                // `tidefs fsck -p`), and must then leave a clean file system. A repair that needs
                // `-y` (a torn extent tree, say) is a broken promise.
                let (code, out) = oracle::e2fsck(&img, &["-fp"])?;
                if code >= 4 {
                    return Err(format!("e2fsck -fp cannot mend it (exit {code}): {out}"));
                }
                let (code, out) = oracle::e2fsck(&img, &["-fn"])?;
                if code != 0 {
                    return Err(format!("e2fsck -fn after e2fsck -fp exits {code}: {out}"));
                }
                Ok(())
            });
        if let Err(e) = fsck {
            problems.push(e);
        }
        let mut uncompared = None;
        if self.cfg.kernel_compare && !lightweight {
            if let Some(ours) = &tree {
                match self.compare_with_e2fsck(image, ours) {
                    Ok(why) => uncompared = why,
                    Err(e) => problems.push(e),
                }
            }
        }
        ImageVerdict {
            tree,
            problems,
            uncompared,
        }
    }

    /// e2fsprogs replays a copy of the crash image (`e2fsck -fy`); the tree it leaves must equal
    /// the one tidefs's recovery gave. `Ok(None)`: compared, equal; `Ok(Some(why))`: there is
    /// nothing to compare.
    fn compare_with_e2fsck(
        &self,
        image: &[u8],
        ours: &RTree,
    ) -> std::result::Result<Option<Uncompared>, String> {
        if journal_needs_tidefs(image) {
            // e2fsprogs refuses such a journal, by design (the incompat bit): nothing to
            // compare. tidefs's recovery was checked against e2fsck -fn already.
            return Ok(Some(Uncompared::TidefsJournal));
        }
        let img = ScratchImage::new(image).map_err(|e| format!("scratch image: {e}"))?;
        let (mut code, mut out) = oracle::e2fsck(&img, &["-fy"])?;
        if code >= 4 && out.contains(TORN_PRIMARY_SUPERBLOCK) {
            // A torn write of block 0: tidefs recovered the superblock from the journal's copy.
            // e2fsck finds a backup only at the default group sizes, so it is pointed at the
            // first backup, as an administrator would; an image without one cannot be
            // compared.
            let Some(backup) = self.cfg.image.backup_superblock() else {
                return Ok(Some(Uncompared::Torn));
            };
            let backup = backup.to_string();
            let block = BLOCK_BYTES.to_string();
            (code, out) = oracle::e2fsck(&img, &["-fy", "-b", &backup, "-B", &block])?;
        }
        if code >= 4 && out.contains(UNKNOWN_JOURNAL_FEATURE) {
            // One of tidefs's incompat bits (extension records, unfenced commits) in the
            // journal superblock, seen by e2fsck through a backup superblock when the primary
            // was torn (`journal_needs_tidefs` reads only the primary): refused by
            // design, nothing to compare.
            return Ok(Some(Uncompared::TidefsJournal));
        }
        if code >= 4 {
            return Err(format!(
                "e2fsck -fy on the crash image (e2fsprogs' own recovery) exits {code}: {out}"
            ));
        }
        let bytes = img.read().map_err(|e| format!("scratch image: {e}"))?;
        let dev = Arc::new(MemDev::from_bytes(bytes));
        let opts = MountOptions {
            read_only: true,
            ..oracle_opts(&self.cfg)
        };
        let fs = Fs::open_devices(dev, None, &opts)
            .map_err(|e| format!("open after e2fsck -fy failed: {e}"))?;
        let theirs = oracle::walk(&fs).map_err(|e| format!("walk after e2fsck -fy: {e}"))?;
        drop(fs);
        let diffs = oracle::compare_trees(ours, &theirs);
        if diffs.is_empty() {
            Ok(None)
        } else {
            Err(format!(
                "tidefs recovery and e2fsck -fy differ (e2fsck exit {code}): {}",
                diffs.join("; ")
            ))
        }
    }
}

/// Runs one mode: makes the base image and runs the configured budget.
pub fn run(cfg: &Config) -> Result<Report> {
    let fresh = make_fresh_image(cfg.image)?;
    Harness::new(cfg.clone(), &fresh)?.run()
}
