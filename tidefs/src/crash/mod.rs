//! The crash-state harness (docs/DESIGN.md §6, issue 3): record a workload's writes and flushes,
//! rebuild the disk as a power cut could leave it, recover, and check the promises.
//!
//! A run, for one data mode:
//! 1. make a small base image with the real `mkfs.ext4`, fill its free blocks with a marker
//!    pattern (so a file that shows a block nobody wrote shows garbage, not zeros), run the
//!    setup of the file set and unmount cleanly;
//! 2. for each workload of the family (in a fixed, seeded order): run it through the library on
//!    a [`RecordingDevice`](crate::dev::record::RecordingDevice) over a copy of the base, then
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
//! - the oracle mounts never use the canary: it breaks the recorded run only.

pub mod gen;
pub mod oracle;
pub mod workload;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::dev::record::RecordingDevice;
use crate::dev::{BlockDevice, MemDev};
use crate::fs::{Canary, DataMode, Fs, MountOptions};
use crate::{FsError, Result};

use gen::{build_image, epochs, flush_state, sampled_state, CrashState, Epoch, Rng};
use oracle::{RTree, ScratchImage};
use workload::{DataWrite, Family, Model, Recorded, Workload, Workloads};

/// Sampled in-flight states per epoch (fewer when the epoch has fewer distinct subsets).
pub const SAMPLES_PER_EPOCH: u64 = 3;
/// Crash-during-recovery states per workload.
pub const RECOVERY_STATES_PER_WORKLOAD: u64 = 2;
/// Size of the base image.
pub const IMAGE_BYTES: u64 = 8 << 20;

/// What to run.
#[derive(Clone, Debug)]
pub struct Config {
    /// Data mode of the recorded runs and of recovery.
    pub mode: DataMode,
    /// Workload family.
    pub family: Family,
    /// Budget: states checked (global indices `0..states`).
    pub states: u64,
    /// Seed of every random choice.
    pub seed: u64,
    /// Check only this global state index (replay).
    pub only_state: Option<u64>,
    /// A deliberately broken ordering in the recorded runs.
    pub canary: Option<Canary>,
    /// Let sampled states tear writes at 512-byte sectors.
    pub torn: bool,
    /// Add sampled three-step sequences to the ACE family.
    pub ace_len3: bool,
    /// Compare with e2fsprogs' own journal replay (`e2fsck -fy`) where the journal holds only
    /// standard records.
    pub kernel_compare: bool,
    /// Print progress on stderr.
    pub progress: bool,
}

impl Config {
    /// Defaults for `mode`: ACE family, 1000 states, seed 1, kernel comparison on.
    pub fn new(mode: DataMode) -> Config {
        Config {
            mode,
            family: Family::Ace,
            states: 1000,
            seed: 1,
            only_state: None,
            canary: None,
            torn: false,
            ace_len3: false,
            kernel_compare: true,
            progress: false,
        }
    }

    /// The command that replays state `index` of this configuration.
    pub fn replay_command(&self, index: u64) -> String {
        let mut s = format!(
            "tidefs crashtest --mode {} --workloads {} --seed {} --state {index}",
            self.mode.name(),
            self.family.name(),
            self.seed
        );
        if let Some(c) = self.canary {
            s.push_str(match c {
                Canary::CommitWithoutFlush => " --canary commit-without-flush",
                Canary::DataAfterCommit => " --canary data-after-commit",
            });
        }
        if self.torn {
            s.push_str(" --torn");
        }
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
             workloads in {:.1}s, {} violation(s)",
            self.mode.name(),
            self.family.name(),
            self.seed,
            self.states_tried,
            self.images_checked,
            self.workloads,
            self.elapsed.as_secs_f64(),
            self.violations.len()
        )?;
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

/// A formatted fresh image: `mkfs.ext4` through [`crate::mkfs`], free blocks filled with a
/// marker pattern.
pub fn make_fresh_image() -> Result<Vec<u8>> {
    let dir = std::env::temp_dir();
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = dir.join(format!("tidefs-crash-base-{}-{n}.img", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let r = (|| {
        crate::mkfs::mkfs(
            &path,
            &crate::mkfs::MkfsOptions {
                size: Some(IMAGE_BYTES),
                ..Default::default()
            },
        )?;
        let mut img = std::fs::read(&path)?;
        fill_free_blocks(&path, &mut img)?;
        Ok(img)
    })();
    let _ = std::fs::remove_file(&path);
    r
}

/// Fills the free blocks of the image at `path` (also in `img`) with a marker pattern of
/// non-zero bytes: "FREE" plus the block number, repeated.
fn fill_free_blocks(path: &std::path::Path, img: &mut [u8]) -> Result<()> {
    let tool = crate::mkfs::find_e2fsprogs_tool("dumpe2fs")
        .ok_or_else(|| FsError::Io(std::io::Error::other("dumpe2fs not found")))?;
    let out = std::process::Command::new(tool).arg(path).output()?;
    if !out.status.success() {
        return Err(FsError::Io(std::io::Error::other(format!(
            "dumpe2fs failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ))));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let bs = 4096usize;
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
                    // Block numbers of an 8 MiB image fit in u32.
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

fn record_opts(cfg: &Config) -> MountOptions {
    MountOptions {
        data_mode: cfg.mode,
        canary: cfg.canary,
        commit_interval: Duration::from_secs(3600),
        // No background checkpoints: the recording must not depend on thread timing, so
        // that a seed replays the same states. The log is still checkpointed when full.
        hold_checkpoints: true,
        ..MountOptions::default()
    }
}

fn oracle_opts(cfg: &Config) -> MountOptions {
    MountOptions {
        data_mode: cfg.mode,
        canary: None,
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
    model: Model,
    setup_writes: Vec<DataWrite>,
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

/// What recovery of one image gave, shared by every state with the same image.
#[derive(Clone)]
struct ImageVerdict {
    tree: Option<RTree>,
    problems: Vec<String>,
}

impl Harness {
    /// Prepares a run: the base image from `fresh` (a formatted image, see
    /// [`make_fresh_image`]) with the setup applied in `cfg.mode`.
    pub fn new(cfg: Config, fresh: &[u8]) -> Result<Harness> {
        let opts = MountOptions {
            canary: None,
            ..record_opts(&cfg)
        };
        let (base, model, setup_writes) = workload::setup_base(fresh.to_vec(), &opts)?;
        Ok(Harness {
            cfg,
            base: Arc::new(base),
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
        Workloads::new(
            self.cfg.family,
            self.cfg.seed,
            &self.model,
            self.cfg.ace_len3,
        )
    }

    /// Records one workload.
    pub fn record(&self, wl: &Workload) -> Result<Recorded> {
        workload::record(
            &self.base,
            &self.model,
            &self.setup_writes,
            wl,
            &record_opts(&self.cfg),
        )
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
                        ops: wl.ops.iter().map(ToString::to_string).collect(),
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
                let v = self.recover_and_check(&built.image);
                cache.insert(built.key.clone(), v.clone());
                v
            }
        };
        problems.extend(verdict.problems.iter().cloned());
        if let Some(tree) = &verdict.tree {
            if self.cfg.mode != DataMode::Lightweight {
                let exp = oracle::expectations(&rec.events, built.crash_pos);
                oracle::check_promises(tree, &exp, &mut problems);
            }
            if matches!(self.cfg.mode, DataMode::Ordered | DataMode::Journal) {
                oracle::check_no_garbage(tree, rec, built.crash_pos, &mut problems);
            }
            if self.cfg.mode == DataMode::Journal {
                oracle::check_atomic_writes(tree, rec, built.crash_pos, &mut problems);
            }
        }
        (problems, built.describe)
    }

    /// Recovers `image` with the library and checks what does not depend on the crash point:
    /// recovery works, the tree walks, `e2fsck -fn` is clean, e2fsprogs' replay agrees.
    fn recover_and_check(&self, image: &[u8]) -> ImageVerdict {
        let mut problems = Vec::new();
        let lightweight = self.cfg.mode == DataMode::Lightweight;
        let dev = Arc::new(MemDev::from_bytes(image.to_vec()));
        let fs = match Fs::open_devices(dev.clone(), None, &oracle_opts(&self.cfg)) {
            Ok(fs) => fs,
            Err(e) => {
                return ImageVerdict {
                    tree: None,
                    problems: vec![format!("recovery / mount failed: {e}")],
                }
            }
        };
        let tree = match oracle::walk(&fs) {
            Ok(t) => Some(t),
            Err(e) => {
                if !lightweight {
                    problems.push(format!("walk after recovery failed: {e}"));
                }
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
                // Lightweight promises only the allocation structures: e2fsck may have to repair
                // the rest, and must then leave a clean file system.
                let (code, out) = oracle::e2fsck(&img, &["-fy"])?;
                if code >= 4 {
                    return Err(format!("e2fsck -fy cannot repair (exit {code}): {out}"));
                }
                let (code, out) = oracle::e2fsck(&img, &["-fn"])?;
                if code != 0 {
                    return Err(format!("e2fsck -fn after e2fsck -fy exits {code}: {out}"));
                }
                Ok(())
            });
        if let Err(e) = fsck {
            problems.push(e);
        }
        if self.cfg.kernel_compare && !lightweight {
            if let Some(ours) = &tree {
                if let Err(e) = self.compare_with_e2fsck(image, ours) {
                    problems.push(e);
                }
            }
        }
        ImageVerdict { tree, problems }
    }

    /// e2fsprogs replays a copy of the crash image (`e2fsck -fy`); the tree it leaves must equal
    /// the one tidefs's recovery gave.
    fn compare_with_e2fsck(&self, image: &[u8], ours: &RTree) -> std::result::Result<(), String> {
        let img = ScratchImage::new(image).map_err(|e| format!("scratch image: {e}"))?;
        let (code, out) = oracle::e2fsck(&img, &["-fy"])?;
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
            Ok(())
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
    let fresh = make_fresh_image()?;
    Harness::new(cfg.clone(), &fresh)?.run()
}
