//! Goal: the `wasteless` and `selective` modes do what docs/DESIGN.md §3 says, end to end:
//! small writes and the metadata around them reach the journal as byte ranges and survive a
//! crash; `selective` writes a sequence that starts large home in place and journals one that
//! starts small; a block whose journaled copy is not home yet stays journaled when a large
//! write follows, so neither a checkpoint nor a replay puts the older copy over the newer
//! data.
//! Method: fresh `mkfs.ext4` images opened with the library, the commit timer far away so that
//! only the calls under test commit; what went where counted through `Fs::stats`; crashes
//! made with `Fs::crash()` and checked after the next open (journal replay), never on the live
//! mount; `e2fsck -fn` after a clean unmount.

mod common;

use std::time::Duration;

use tidefs::fs::{Creds, DataMode, Fs, MountOptions, ROOT_INO};

const BS: usize = 4096;

fn options(mode: DataMode) -> MountOptions {
    MountOptions {
        data_mode: mode,
        commit_interval: Duration::from_secs(3600),
        deterministic_writes: true,
        ..MountOptions::default()
    }
}

const SELECTIVE: DataMode = DataMode::Selective { threshold: 4096 };

/// Record `k` of a stream: 125 bytes that name it.
fn record(k: usize) -> Vec<u8> {
    let mut r = format!("record {k:05} ").into_bytes();
    r.resize(124, b'.');
    r.push(b'\n');
    r
}

#[test]
fn small_appends_are_logged_as_byte_ranges_and_survive_a_crash() {
    if !common::have_e2fsprogs() {
        return;
    }
    for mode in [DataMode::Wasteless, SELECTIVE] {
        let dir = tempfile::tempdir().unwrap();
        let img = common::mkimage(dir.path(), "r.img", 64, &[]);
        let fs = Fs::open(&img, &options(mode)).unwrap();
        let f = fs
            .create(ROOT_INO, b"stream", 0o100644, 0, Creds::ROOT)
            .unwrap();
        fs.fsync(f.ino, false).unwrap();
        let before = fs.stats();
        const N: usize = 60;
        for k in 0..N {
            let at = (k * 125) as u64;
            assert_eq!(fs.write(f.ino, at, &record(k)).unwrap(), 125);
            fs.fsync(f.ino, true).unwrap();
        }
        let after = fs.stats();
        assert_eq!(
            after.commits - before.commits,
            N as u64,
            "{mode}: one commit each"
        );
        // Every append after the first into a block changes a few bytes of it and of the
        // inode table block: both go as ranges.
        let ranged = after.range_records - before.range_records;
        assert!(
            ranged >= N as u64,
            "{mode}: only {ranged} blocks logged as ranges in {N} commits"
        );
        let per_commit = (after.journal_bytes - before.journal_bytes) / N as u64;
        eprintln!("{mode}: {per_commit} journal bytes per 125-byte append");
        // Each commit is one compact commit of a few sectors, never descriptor + blocks +
        // commit block (three blocks at least).
        assert!(
            per_commit <= BS as u64,
            "{mode}: {per_commit} journal bytes per commit"
        );
        assert!(
            after.compact_commits - before.compact_commits >= N as u64,
            "{mode}: {after:?}"
        );
        // Nothing went home in place: the data is in the journal until a checkpoint.
        assert_eq!(
            after.home_bytes, before.home_bytes,
            "{mode}: small journaled writes went home before a checkpoint"
        );
        fs.crash();
        drop(fs);

        let fs = Fs::open(&img, &options(mode)).unwrap();
        let a = fs.lookup(ROOT_INO, b"stream").unwrap();
        let want: Vec<u8> = (0..N).flat_map(record).collect();
        assert_eq!(a.size, want.len() as u64, "{mode}: size after replay");
        assert!(
            fs.read(a.ino, 0, want.len() as u32).unwrap() == want,
            "{mode}: content after replay"
        );
        fs.unmount().unwrap();
        drop(fs);
        common::assert_fsck_clean(&img);
    }
}

#[test]
fn wasteless_logs_metadata_changes_as_byte_ranges() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkimage(dir.path(), "m.img", 64, &[]);
    let fs = Fs::open(&img, &options(DataMode::Wasteless)).unwrap();
    fs.sync().unwrap();
    let before = fs.stats();
    for k in 0..20u8 {
        let f = fs
            .create(ROOT_INO, &[b'f', b'a' + k], 0o100644, 0, Creds::ROOT)
            .unwrap();
        fs.setattr(
            f.ino,
            &tidefs::fs::SetAttr {
                mode: Some(0o600),
                ..Default::default()
            },
        )
        .unwrap();
        fs.fsync(f.ino, false).unwrap();
    }
    let after = fs.stats();
    // Each commit changes an inode, the directory block, a bitmap and a group descriptor:
    // none of them fresh, so all are ranges.
    let ranged = after.range_records - before.range_records;
    assert!(ranged >= 20 * 3, "only {ranged} blocks logged as ranges");
    fs.crash();
    drop(fs);
    let fs = Fs::open(&img, &options(DataMode::Wasteless)).unwrap();
    for k in 0..20u8 {
        let a = fs.lookup(ROOT_INO, &[b'f', b'a' + k]).unwrap();
        assert_eq!(a.perm, 0o600, "file {k}: mode after replay");
    }
    fs.unmount().unwrap();
    drop(fs);
    common::assert_fsck_clean(&img);
}

#[test]
fn selective_writes_a_large_sequence_home_and_journals_a_small_one() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkimage(dir.path(), "s.img", 64, &[]);
    let fs = Fs::open(&img, &options(SELECTIVE)).unwrap();
    let f = fs.create(ROOT_INO, b"f", 0o100644, 0, Creds::ROOT).unwrap();
    let s0 = fs.stats();
    fs.write(f.ino, 0, &[b'L'; 16 * BS]).unwrap();
    fs.fsync(f.ino, true).unwrap();
    let s1 = fs.stats();
    assert!(
        s1.home_bytes - s0.home_bytes >= (16 * BS) as u64,
        "a 64 KiB write did not go home in place ({} bytes)",
        s1.home_bytes - s0.home_bytes
    );
    assert!(
        s1.journal_bytes - s0.journal_bytes < (8 * BS) as u64,
        "a large write was journaled ({} journal bytes)",
        s1.journal_bytes - s0.journal_bytes
    );
    // A small overwrite of a block at home starts a journaled sequence: nothing goes home.
    fs.write(f.ino, 3 * BS as u64 + 10, b"small").unwrap();
    fs.fsync(f.ino, true).unwrap();
    let s2 = fs.stats();
    assert_eq!(
        s2.home_bytes, s1.home_bytes,
        "a small write went home in place"
    );
    assert!(
        s2.range_records > s1.range_records,
        "the small write was not ranged"
    );
    fs.crash();
    drop(fs);

    let fs = Fs::open(&img, &options(SELECTIVE)).unwrap();
    let a = fs.lookup(ROOT_INO, b"f").unwrap();
    let mut want = vec![b'L'; 16 * BS];
    want[3 * BS + 10..3 * BS + 15].copy_from_slice(b"small");
    assert!(fs.read(a.ino, 0, (16 * BS) as u32).unwrap() == want);
    fs.unmount().unwrap();
    drop(fs);
    common::assert_fsck_clean(&img);
}

#[test]
fn selective_keeps_journaling_a_block_whose_journaled_copy_is_not_home() {
    if !common::have_e2fsprogs() {
        return;
    }
    // Small write (journaled, its copy waits in the journal), then a large write over the
    // same block and the next: the first block must stay journaled, or the checkpoint of its
    // older copy (or a replay of it) would overwrite the large write.
    for crash in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let img = common::mkimage(dir.path(), "h.img", 64, &[]);
        let fs = Fs::open(&img, &options(SELECTIVE)).unwrap();
        let f = fs.create(ROOT_INO, b"f", 0o100644, 0, Creds::ROOT).unwrap();
        fs.write(f.ino, 0, &[b'a'; 2 * BS]).unwrap();
        fs.sync().unwrap();
        fs.write(f.ino, 100, b"small write").unwrap();
        fs.fsync(f.ino, true).unwrap();
        fs.write(f.ino, 0, &[b'B'; 2 * BS]).unwrap();
        fs.fsync(f.ino, true).unwrap();
        if crash {
            fs.crash();
        } else {
            fs.unmount().unwrap();
        }
        drop(fs);
        let fs = Fs::open(&img, &options(SELECTIVE)).unwrap();
        let a = fs.lookup(ROOT_INO, b"f").unwrap();
        assert!(
            fs.read(a.ino, 0, (2 * BS) as u32).unwrap() == vec![b'B'; 2 * BS],
            "crash={crash}: the large write was undone"
        );
        fs.unmount().unwrap();
        drop(fs);
        common::assert_fsck_clean(&img);
    }
}
