//! Goal: every data mode keeps its crash promise (docs/DESIGN.md §3) over a bounded, seeded set of
//! crash states; the harness catches a deliberately broken ordering; the crash-state generator
//! builds exactly the states it claims to and replays them by seed and index.
//!
//! Method: (i) `tidefs::crash` runs the ACE and random workload families in each mode on a
//! recording device, rebuilds the disk at every flush point, at sampled subsets and orders of
//! the in-flight writes and at interrupted recoveries, recovers each through the library and
//! checks `e2fsck -fn`, the fsync promises, the mode's promise and e2fsck's own replay.
//! The budget here is small because a debug build is slow; the long run is
//! `tidefs crashtest --mode all --workloads all --states 10000` (README, "Crash testing").
//! (ii) the generator on logs written through a `RecordingDevice` by hand.

mod common;

use std::sync::{Arc, OnceLock};

use tidefs::crash::gen::{self, Rng};
use tidefs::crash::workload::Family;
use tidefs::crash::{Config, Harness, Report};
use tidefs::dev::record::{LogEntry, RecordingDevice};
use tidefs::dev::BlockDevice;
use tidefs::fs::DataMode;

/// Crash states per mode in this test. Debug builds check about 40 states a second per core;
/// four modes share two cores, so 3000 states per mode keep the file near two minutes (measured: 113 s).
const STATES_PER_MODE: u64 = 3000;

fn fresh_image() -> &'static [u8] {
    static IMG: OnceLock<Vec<u8>> = OnceLock::new();
    IMG.get_or_init(|| tidefs::crash::make_fresh_image().expect("mkfs.ext4 for the base image"))
}

fn run(cfg: Config) -> Report {
    let report = Harness::new(cfg, fresh_image()).unwrap().run().unwrap();
    eprintln!("{report}");
    report
}

fn assert_mode_clean(mode: DataMode) {
    if !common::have_e2fsprogs() {
        return;
    }
    let report = run(Config {
        family: Family::All,
        states: STATES_PER_MODE,
        seed: 0x71de,
        ..Config::new(mode)
    });
    assert!(report.op_failures.is_empty(), "{report}");
    assert_eq!(report.states_tried, STATES_PER_MODE);
    assert!(report.violations.is_empty(), "{report}");
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

/// Goal: journal mode keeps its crash promise over the seeded states (see the module doc).
#[test]
fn journal_keeps_its_promise() {
    assert_mode_clean(DataMode::Journal);
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
            snapshots.push(dev.content());
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
