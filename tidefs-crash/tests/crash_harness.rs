//! Goal: every data mode keeps its crash promise (docs/DESIGN.md §3) over a bounded, seeded set of
//! crash states, also with several writer threads in one crash state, on an image of several
//! block groups whose journal wraps, and on the real file-backed device; the harness catches
//! each deliberately broken ordering; the crash-state generator builds exactly the states it
//! claims to and replays them by seed and index.
//!
//! Method: (i) `tidefs_crash` runs the ACE and random workload families in each mode on a
//! recording device, rebuilds the disk at every flush point, at sampled subsets and orders of
//! the in-flight writes (torn at 512-byte sectors under `TIDEFS_CI=1`) and at interrupted
//! recoveries, recovers each through the library and checks `e2fsck -fn`, the fsync promises,
//! the mode's promise and e2fsck's own replay. (ii) The `threads` family does the same with four
//! writer threads appending and fsyncing at once, on a four-group image after a prelude that
//! brings the journal's head near its end, so every workload's journal wraps. (iii) One run
//! records through `FileDev` on an image file, and the log must match what reached the file.
//! (iv) Each canary device in front of the recording device, in ordered mode: the harness must
//! report violations. The budgets are small because a debug build is slow; the long run is
//! `tidefs crashtest --mode all --workloads all --states 10000` (README, "Crash testing").
//! (v) The generator on logs written through a `RecordingDevice` by hand.

use std::sync::{Arc, OnceLock};

use tidefs::dev::record::{LogEntry, RecordingDevice};
use tidefs::dev::BlockDevice;
use tidefs::fs::DataMode;
use tidefs::test_support::{current_test, skip};
use tidefs_crash::canary::Canary;
use tidefs_crash::gen::{self, Rng};
use tidefs_crash::workload::{Family, Op, WriteKind, LARGE_WRITE};
use tidefs_crash::{Config, FreshImage, Harness, ImageShape, Report};

/// Crash states per mode of the ACE and random families. A debug build checks about 30 of them
/// a second per core (torn writes on), and the modes share two cores with the rest of this file:
/// the whole file takes about five CPU-minutes.
const STATES_PER_MODE: u64 = 2000;
/// Crash states per mode of the `threads` family (about two workloads; their states are slower:
/// larger image, longer log).
const THREAD_STATES_PER_MODE: u64 = 200;
/// States per mode of the fenced-commit runs.
const FENCED_STATES: u64 = 600;

/// Whether e2fsprogs is installed; if not, the test skips (and fails under `TIDEFS_CI=1`).
fn have_e2fsprogs() -> bool {
    let ok = ["mke2fs", "e2fsck", "dumpe2fs", "debugfs"]
        .iter()
        .all(|t| tidefs_mkfs::find_e2fsprogs_tool(t).is_some());
    if !ok {
        skip(
            &current_test(),
            "e2fsprogs (mke2fs, e2fsck, dumpe2fs, debugfs) not installed",
        );
    }
    ok
}

fn fresh_image(shape: ImageShape) -> &'static FreshImage {
    static ONE: OnceLock<FreshImage> = OnceLock::new();
    static GROUPS: OnceLock<FreshImage> = OnceLock::new();
    let cell = match shape {
        ImageShape::OneGroup => &ONE,
        ImageShape::Groups => &GROUPS,
    };
    cell.get_or_init(|| {
        tidefs_crash::make_fresh_image(shape).expect("mkfs.ext4 for the base image")
    })
}

fn run(cfg: Config) -> Report {
    let fresh = fresh_image(cfg.image);
    let report = Harness::new(cfg, fresh).unwrap().run().unwrap();
    eprintln!("{report}");
    report
}

fn assert_clean(report: &Report, states: u64) {
    assert!(report.op_failures.is_empty(), "{report}");
    assert_eq!(report.states_tried, states);
    assert!(report.violations.is_empty(), "{report}");
}

fn assert_mode_clean(mode: DataMode) {
    if !have_e2fsprogs() {
        return;
    }
    let report = run(Config {
        family: Family::All,
        states: STATES_PER_MODE,
        seed: 0x71de,
        ..Config::new(mode)
    });
    assert_clean(&report, STATES_PER_MODE);
}

/// Writer threads on the multi-group image; every workload's journal must wrap.
fn assert_mode_clean_with_threads(mode: DataMode) {
    if !have_e2fsprogs() {
        return;
    }
    let report = run(Config {
        family: Family::Threads,
        image: ImageShape::Groups,
        states: THREAD_STATES_PER_MODE,
        seed: 0x71de,
        ..Config::new(mode)
    });
    assert_clean(&report, THREAD_STATES_PER_MODE);
    assert!(report.workloads >= 1, "{report}");
    if mode.logs_byte_ranges() {
        // Compact commits take a sector each, and group commit merges the threads' fsyncs
        // into a number of commits that varies from run to run: the prelude leaves the head
        // in the last block, which most workloads fill.
        assert!(
            report.journal_wraps >= 1,
            "no workload wrapped the journal: {report}"
        );
    } else {
        assert_eq!(
            report.journal_wraps, report.workloads,
            "every threads workload wraps the journal: {report}"
        );
    }
}

/// Goal: lightweight mode keeps its crash promise over the seeded states (see the module doc).
#[test]
fn lightweight_keeps_its_promise() {
    assert_mode_clean(DataMode::Lightweight);
}

/// Goal: writeback mode keeps its crash promise over the seeded states (see the module doc).
#[test]
fn writeback_keeps_its_promise() {
    assert_mode_clean(DataMode::Writeback);
}

/// Goal: ordered mode keeps its crash promise over the seeded states (see the module doc).
#[test]
fn ordered_keeps_its_promise() {
    assert_mode_clean(DataMode::Ordered);
}

/// Goal: the other barrier strategy, every commit fenced (`fenced_commits`), keeps ordered and
/// journal mode's promises too, and its journals are the kernel's (the e2fsck comparison runs
/// on every state whose primary superblock e2fsck can read).
#[test]
fn fenced_commits_keep_the_promise() {
    if !have_e2fsprogs() {
        return;
    }
    for mode in [DataMode::Ordered, DataMode::Journal] {
        let report = run(Config {
            family: Family::All,
            states: FENCED_STATES,
            seed: 0x71de,
            fenced_commits: true,
            ..Config::new(mode)
        });
        assert_clean(&report, FENCED_STATES);
        // Fenced, these modes leave the journal readable by e2fsprogs (no tidefs incompat
        // bit) in nearly every state, so its replay is compared with tidefs's there; unfenced,
        // most states carry the bit.
        assert!(
            report.uncompared_tidefs_journal * 10 <= report.images_checked,
            "fenced commits left most images to tidefs alone: {report}"
        );
    }
}

/// Goal: journal mode keeps its crash promise over the seeded states (see the module doc).
#[test]
fn journal_keeps_its_promise() {
    assert_mode_clean(DataMode::Journal);
}

/// Goal: wasteless mode keeps its crash promise (level 4: every write all-or-nothing) over
/// the seeded states, with data and metadata logged as byte ranges.
#[test]
fn wasteless_keeps_its_promise() {
    assert_mode_clean(DataMode::Wasteless);
}

/// Goal: selective mode keeps its crash promise over the seeded states: level 3 everywhere,
/// level 4 for files written only in writes below the threshold. A threshold of 1 KiB puts
/// the workloads' writes on both sides of it.
#[test]
fn selective_keeps_its_promise() {
    assert_mode_clean(DataMode::Selective { threshold: 1024 });
}

/// Goal: lightweight mode keeps its promise with writer threads and a wrapping journal.
#[test]
fn lightweight_keeps_its_promise_with_writer_threads() {
    assert_mode_clean_with_threads(DataMode::Lightweight);
}

/// Goal: writeback mode keeps every fsync promise with writer threads and a wrapping journal.
#[test]
fn writeback_keeps_its_promise_with_writer_threads() {
    assert_mode_clean_with_threads(DataMode::Writeback);
}

/// Goal: ordered mode keeps every fsync promise and shows no garbage with writer threads and a
/// wrapping journal.
#[test]
fn ordered_keeps_its_promise_with_writer_threads() {
    assert_mode_clean_with_threads(DataMode::Ordered);
}

/// Goal: journal mode keeps every fsync promise and every write atomic with writer threads and
/// a wrapping journal.
#[test]
fn journal_keeps_its_promise_with_writer_threads() {
    assert_mode_clean_with_threads(DataMode::Journal);
}

/// Goal: wasteless mode keeps every fsync promise and every write atomic with writer threads
/// and a wrapping journal.
#[test]
fn wasteless_keeps_its_promise_with_writer_threads() {
    assert_mode_clean_with_threads(DataMode::Wasteless);
}

/// Goal: selective mode keeps its promise with writer threads and a wrapping journal.
#[test]
fn selective_keeps_its_promise_with_writer_threads() {
    assert_mode_clean_with_threads(DataMode::Selective { threshold: 1024 });
}

/// Crash states of each mixed-tree configuration (root in one mode, `A` in another and
/// switched while the workloads run).
const MIXED_STATES: u64 = 600;

/// A mixed tree: the root obeys `root` (the mount's mode), directory `A` has `dir` of its own
/// and the workloads switch it between modes; each directory keeps its own promise.
fn assert_mixed_clean(root: DataMode, dir: DataMode, family: Family) {
    if !have_e2fsprogs() {
        return;
    }
    let threads = family == Family::Threads;
    let states = if threads {
        THREAD_STATES_PER_MODE
    } else {
        MIXED_STATES
    };
    let report = run(Config {
        family,
        dir_mode: Some(dir),
        image: if threads {
            ImageShape::Groups
        } else {
            ImageShape::OneGroup
        },
        states,
        seed: 0x71de,
        ..Config::new(root)
    });
    assert_clean(&report, states);
}

/// Goal: an `ordered` root beside a `lightweight` directory (switched to journaling modes and
/// back while the workloads run): the ordered files keep every fsync promise and level 3, and
/// e2fsck finds damage only in inodes that obeyed lightweight.
#[test]
fn mixed_ordered_root_and_lightweight_directory_keep_their_promises() {
    assert_mixed_clean(DataMode::Ordered, DataMode::Lightweight, Family::All);
}

/// Goal: a `lightweight` root beside a `journal` directory: the journaled files keep every
/// promise, their writes atomic, whatever the lightweight operations beside them leave.
#[test]
fn mixed_lightweight_root_and_journal_directory_keep_their_promises() {
    assert_mixed_clean(DataMode::Lightweight, DataMode::Journal, Family::All);
}

/// Goal: writer threads in a `wasteless` root and in an `ordered` directory while a fifth
/// thread switches that directory between modes; the journal wraps.
#[test]
fn mixed_modes_switched_under_writer_threads_keep_their_promises() {
    assert_mixed_clean(DataMode::Wasteless, DataMode::Ordered, Family::Threads);
}

/// Goal: crash states built from the real file-backed device (`FileDev` under the recording
/// wrapper) keep ordered mode's promise, and the log matches what reached the file (the
/// harness reports a mismatch as an op failure). Method: the `threads` family recorded on an
/// image file in a directory on a disk file system (`/var/tmp` when there is one).
#[test]
fn file_backed_device_states_keep_the_promise() {
    if !have_e2fsprogs() {
        return;
    }
    let parent = ["/var/tmp", "/tmp"]
        .into_iter()
        .find(|d| std::path::Path::new(d).is_dir())
        .map_or_else(std::env::temp_dir, std::path::PathBuf::from);
    let dir = tempfile::tempdir_in(parent).unwrap();
    let states = 160;
    let report = run(Config {
        family: Family::Threads,
        image: ImageShape::Groups,
        states,
        seed: 0xf11e,
        file_dev_dir: Some(dir.path().to_path_buf()),
        ..Config::new(DataMode::Ordered)
    });
    assert_clean(&report, states);
    assert!(report.journal_wraps > 0, "{report}");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(
        left.is_empty(),
        "recording image files left behind: {left:?}"
    );
}

/// Goal: the random family writes large files (`WriteKind::AppendLarge`): more new blocks
/// than the page cache keeps spare, allocated ahead of the commit's close in many pieces and,
/// on these images' small journal, written in `journal` mode as several operations, so its
/// crash states cover those paths (the other writes of the workloads touch at most three
/// blocks); and recording one is clean. Method: the first random workloads of the default
/// seed, one with a large write recorded in `journal` mode.
#[test]
fn the_random_family_writes_large_files_in_parts() {
    if !have_e2fsprogs() {
        return;
    }
    let cfg = Config {
        family: Family::Random,
        ..Config::new(DataMode::Journal)
    };
    let h = Harness::new(cfg, fresh_image(ImageShape::OneGroup)).unwrap();
    let with_large: Vec<_> = h
        .workloads()
        .take(20)
        .filter(|w| {
            w.ops
                .iter()
                .any(|op| matches!(op, Op::Write(_, WriteKind::AppendLarge)))
        })
        .collect();
    assert!(
        with_large.len() >= 2,
        "{} of 20 random workloads write a large file",
        with_large.len()
    );
    let rec = h.record(&with_large[0]).unwrap();
    assert!(rec.failures.is_empty(), "{:?}", rec.failures);
    assert!(
        rec.writes
            .iter()
            .any(|w| w.len == LARGE_WRITE && w.parts.len() > 1),
        "no large write went in parts: {:?}",
        rec.writes
            .iter()
            .map(|w| (w.len, w.parts.len()))
            .collect::<Vec<_>>()
    );
}

fn canary_caught(canary: Canary) -> Report {
    // A commit block that goes out with its records is caught only where a crash keeps the
    // commit block but loses ordered-mode data written before it (the journal's own checksums
    // reject a commit whose records are missing); the random family, rich in appends to new
    // blocks, exposes that far more often than the one- and two-step sequences.
    let (family, states) = match canary {
        Canary::CommitWithoutFlush => (Family::Random, 600),
        Canary::DataAfterCommit => (Family::Ace, 400),
    };
    let report = run(Config {
        family,
        states,
        canary: Some(canary),
        kernel_compare: false,
        ..Config::new(DataMode::Ordered)
    });
    assert!(
        !report.violations.is_empty(),
        "canary {} not caught in {} states",
        canary.name(),
        report.states_tried
    );
    report
}

/// Goal: the harness reports violations when a device drops the flush between a transaction's
/// body and its commit block (canary).
#[test]
fn canary_commit_without_flush_is_caught() {
    if !have_e2fsprogs() {
        return;
    }
    canary_caught(Canary::CommitWithoutFlush);
}

/// Goal: the harness reports violations when a device lets ordered data reach home only after
/// the commit block that maps it (canary).
#[test]
fn canary_data_after_commit_is_caught() {
    if !have_e2fsprogs() {
        return;
    }
    canary_caught(Canary::DataAfterCommit);
}

/// A violation replays alone, by seed and index, to the same crash point and the same findings.
#[test]
fn replay_by_seed_and_index_is_exact() {
    if !have_e2fsprogs() {
        return;
    }
    let report = canary_caught(Canary::DataAfterCommit);
    for v in report.violations.iter().take(3) {
        let again = run(Config {
            states: 400,
            canary: Some(Canary::DataAfterCommit),
            kernel_compare: false,
            only_state: Some(v.state_index),
            ..Config::new(DataMode::Ordered)
        });
        assert_eq!(again.states_tried, 1);
        assert_eq!(again.violations.len(), 1, "{again}");
        let w = &again.violations[0];
        assert_eq!(w.state_index, v.state_index);
        assert_eq!(w.workload, v.workload);
        assert_eq!(w.crash, v.crash);
        assert_eq!(w.problems, v.problems);
    }
}

/// A hand-made log: random writes (some overlapping) and flushes, with the device content
/// snapshotted at each flush.
fn hand_log(seed: u64) -> (Arc<Vec<u8>>, Vec<LogEntry>, Vec<Vec<u8>>) {
    let base: Arc<Vec<u8>> = Arc::new((0..64 * 1024).map(|i| (i % 251) as u8).collect());
    let dev = RecordingDevice::new(base.clone());
    let mut r = Rng::new(seed);
    let mut snapshots = vec![base.as_ref().clone()];
    for step in 0..60u64 {
        if r.chance(1, 5) {
            dev.flush().unwrap();
            snapshots.push(dev.content().unwrap());
        } else if r.chance(1, 6) {
            dev.mark(step);
        } else {
            let len = 1 + r.below(3 * 512) as usize;
            let off = r.below(16) * 1024 + r.below(100);
            let data: Vec<u8> = (0..len).map(|_| r.next_u64() as u8).collect();
            dev.write_at(off, &data).unwrap();
        }
    }
    (base, dev.recording().log, snapshots)
}

/// Goal: a crash at a flush point rebuilds exactly the disk as it was at that flush. Method:
/// hand-made logs with snapshots taken at each flush.
#[test]
fn flush_states_equal_the_prefix() {
    for seed in 0..20 {
        let (base, log, snapshots) = hand_log(seed);
        let eps = gen::epochs(&log);
        assert_eq!(eps.len(), snapshots.len());
        for (e, snap) in snapshots.iter().enumerate() {
            let st = gen::flush_state(&eps, e);
            assert!(st.applied.is_empty());
            assert_eq!(&gen::build_image(&base, &log, &eps, &st), snap, "epoch {e}");
            // The crash lies before the epoch's first write and after its opening flush.
            assert!(st.crash_pos >= eps[e].start);
            assert!(eps[e].writes.iter().all(|&w| w >= st.crash_pos));
        }
        let last = snapshots.len() - 1;
        let mut replayed = snapshots[last].clone();
        for &w in &eps[last].writes {
            let LogEntry::Write { offset, data } = &log[w] else {
                panic!("epoch write is not a write");
            };
            replayed[*offset as usize..*offset as usize + data.len()].copy_from_slice(data);
        }
        assert_eq!(gen::final_image(&base, &log), replayed);
    }
}

/// Goal: a sampled crash state is the flush prefix plus only writes in flight in that epoch, each
/// once, and the same seed gives the same state. Method: hand-made logs.
#[test]
fn sampled_states_hold_only_in_flight_writes() {
    for seed in 0..20 {
        let (base, log, snapshots) = hand_log(seed);
        let eps = gen::epochs(&log);
        for (e, ep) in eps.iter().enumerate() {
            for k in 0..30 {
                let mut r = Rng::derive(seed, e as u64, k);
                let st = gen::sampled_state(&log, &eps, e, &mut r, k % 2 == 0);
                assert_eq!(st.epoch, e);
                let mut seen = std::collections::HashSet::new();
                for a in &st.applied {
                    assert!(ep.writes.contains(&a.log_index), "not of this epoch");
                    assert!(a.log_index < st.crash_pos, "issued after the crash");
                    assert!(seen.insert(a.log_index), "applied twice");
                }
                assert!(st.crash_pos <= ep.end, "past the closing flush");
                // The image is the flush prefix plus exactly the applied writes.
                let mut want = snapshots[e].clone();
                for a in &st.applied {
                    let LogEntry::Write { offset, data } = &log[a.log_index] else {
                        panic!("applied a non-write");
                    };
                    for (i, chunk) in data.chunks(gen::SECTOR_BYTES).enumerate() {
                        if a.sectors.is_none_or(|m| m & (1 << i) != 0) {
                            let at = *offset as usize + i * gen::SECTOR_BYTES;
                            want[at..at + chunk.len()].copy_from_slice(chunk);
                        }
                    }
                }
                assert_eq!(gen::build_image(&base, &log, &eps, &st), want);
                // The same seed gives the same state.
                let mut r2 = Rng::derive(seed, e as u64, k);
                assert_eq!(gen::sampled_state(&log, &eps, e, &mut r2, k % 2 == 0), st);
            }
        }
    }
}
