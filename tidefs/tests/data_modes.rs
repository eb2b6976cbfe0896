//! Goal: each data mode (`lightweight`, `writeback`, `ordered`, `journal`) works end to end
//! through the library: what is written reads back before and after a clean remount, the image
//! is clean by the real e2fsck, and each mode sends its data where docs/DESIGN.md §3 says (journal
//! mode logs data blocks, the others do not). Crash behaviour is the crash harness's job.

mod common;

use tidefs::fs::{Creds, DataMode, Fs, MountOptions, SetAttr, ROOT_INO};

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add((i % 251) as u8))
        .collect()
}

fn run_mode(mode: DataMode) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkimage(dir.path(), "m.img", 64, &[]);
    let opts = MountOptions {
        data_mode: mode,
        ..MountOptions::default()
    };
    let fs = Fs::open(&img, &opts).unwrap();
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, Creds::ROOT).unwrap();
    let f = fs.create(d.ino, b"f", 0o100644, 0, Creds::ROOT).unwrap();
    let big = pattern(1, 300_000);
    fs.write(f.ino, 0, &big).unwrap();
    fs.write(f.ino, 4000, &pattern(9, 200)).unwrap();
    fs.fsync(f.ino, false).unwrap();
    let mut want = big.clone();
    want[4000..4200].copy_from_slice(&pattern(9, 200));
    assert_eq!(
        fs.read(f.ino, 0, 400_000).unwrap(),
        want,
        "{mode:?} read before remount"
    );
    fs.setattr(
        f.ino,
        &SetAttr {
            size: Some(5000),
            ..SetAttr::default()
        },
    )
    .unwrap();
    want.truncate(5000);
    for i in 0..50 {
        let g = fs
            .create(
                d.ino,
                format!("small{i}").as_bytes(),
                0o100644,
                0,
                Creds::ROOT,
            )
            .unwrap();
        fs.write(g.ino, 0, &pattern(i, 125)).unwrap();
        fs.fsync(g.ino, true).unwrap();
    }
    let made = fs.stats().journal_bytes;
    fs.unmount().unwrap();
    drop(fs);
    // Appends to files that exist, after a remount (the log empty): what lightweight writes in
    // place (the inode's new size), where the other modes journal the inode-table block.
    // Making the files was journaled in every mode (a change of names).
    let fs = Fs::open(&img, &opts).unwrap();
    for i in 0..50 {
        let g = fs.lookup(d.ino, format!("small{i}").as_bytes()).unwrap();
        fs.write(g.ino, 125, &pattern(i + 50, 125)).unwrap();
        fs.fsync(g.ino, true).unwrap();
    }
    let appended = fs.stats().journal_bytes;
    fs.unmount().unwrap();
    drop(fs);
    common::assert_fsck_clean(&img);
    let fs = Fs::open(&img, &opts).unwrap();
    let f = fs.lookup(d.ino, b"f").unwrap();
    assert_eq!(
        fs.read(f.ino, 0, 400_000).unwrap(),
        want,
        "{mode:?} read after remount"
    );
    for i in 0..50u8 {
        let g = fs.lookup(d.ino, format!("small{i}").as_bytes()).unwrap();
        let want = [pattern(i, 125), pattern(i + 50, 125)].concat();
        assert_eq!(fs.read(g.ino, 0, 400).unwrap(), want);
    }
    fs.unmount().unwrap();
    made + appended
}

/// Goal and method: see the module doc; each mode round-trips, and only journal mode logs data
/// blocks.
#[test]
fn every_mode_round_trips_and_journal_mode_logs_data() {
    if !common::have_e2fsprogs() {
        return;
    }
    let light = run_mode(DataMode::Lightweight);
    let writeback = run_mode(DataMode::Writeback);
    let ordered = run_mode(DataMode::Ordered);
    let journal = run_mode(DataMode::Journal);
    eprintln!("journal bytes: lightweight {light} writeback {writeback} ordered {ordered} journal {journal}");
    // Journal mode logs the ~300 KB of file data too; lightweight logs the least.
    assert!(
        journal > ordered + 300_000,
        "journal mode must log data blocks"
    );
    assert!(
        journal > writeback + 300_000,
        "writeback mode must not log data blocks"
    );
    assert!(
        light < ordered,
        "lightweight mode must log less metadata than ordered"
    );
}

/// Goal: no mode hands out a block before the transaction that freed it commits (ext4's rule).
/// Method: in each mode, a file's version is fsync'd; another file is renamed over it (freeing
/// its blocks in the running transaction) and a third file is written at once; then power is
/// cut before any commit. After recovery the rename never happened, so the first file is back
/// and must hold exactly the bytes that were fsync'd, not the third file's.
#[test]
fn no_mode_reuses_a_freed_block_before_its_transaction_commits() {
    if !common::have_e2fsprogs() {
        return;
    }
    for mode in [
        DataMode::Lightweight,
        DataMode::Writeback,
        DataMode::Ordered,
        DataMode::Journal,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let img = common::mkimage(dir.path(), "reuse.img", 32, &[]);
        let opts = MountOptions {
            data_mode: mode,
            ..MountOptions::default()
        };
        let fs = Fs::open(&img, &opts).unwrap();
        let old = pattern(3, 64 << 10);
        let a = fs.create(ROOT_INO, b"a", 0o100644, 0, Creds::ROOT).unwrap();
        fs.write(a.ino, 0, &old).unwrap();
        fs.fsync(a.ino, false).unwrap();
        let b = fs.create(ROOT_INO, b"b", 0o100644, 0, Creds::ROOT).unwrap();
        fs.write(b.ino, 0, b"replacement").unwrap();
        fs.rename(ROOT_INO, b"b", ROOT_INO, b"a", Default::default())
            .unwrap();
        let c = fs.create(ROOT_INO, b"c", 0o100644, 0, Creds::ROOT).unwrap();
        fs.write(c.ino, 0, &pattern(200, 256 << 10)).unwrap();
        fs.crash();
        drop(fs);
        let fs = Fs::open(&img, &opts).unwrap();
        let a = fs.lookup(ROOT_INO, b"a").unwrap();
        assert_eq!(
            a.size,
            old.len() as u64,
            "{mode:?}: the rename was not committed"
        );
        assert!(
            fs.read(a.ino, 0, old.len() as u32).unwrap() == old,
            "{mode:?}: the fsync'd file holds another file's bytes after the crash"
        );
        fs.unmount().unwrap();
    }
}

/// Counts the blocks or inodes of e2fsck's "<what> bitmap differences:" line with sign `sign`
/// (`-(a--b)` counts b - a + 1).
fn e2fsck_differences(report: &str, what: &str, sign: char) -> u64 {
    let Some(line) = report.lines().find_map(|l| {
        l.trim()
            .strip_prefix(&format!("{what} bitmap differences:"))
    }) else {
        return 0;
    };
    line.split_whitespace()
        .filter_map(|t| t.strip_prefix(sign))
        .map(|t| {
            let t = t.trim_start_matches('(').trim_end_matches(')');
            match t.split_once("--") {
                Some((a, b)) => b.parse::<u64>().unwrap() - a.parse::<u64>().unwrap() + 1,
                None => 1,
            }
        })
        .sum()
}

/// Goal: the allocation audit counts exactly what e2fsck finds: nothing on a clean image, and
/// after a lightweight crash the same leaked blocks and inodes as e2fsck's bitmap differences,
/// with no used block or inode marked free.
/// Method: a populated image (a multi-level extent file, an xattr block, directories) is
/// audited after a clean unmount; then, in lightweight mode, files are truncated and fsync'd
/// (their frees reach the bitmaps one commit later) and power is cut; after recovery the audit is
/// compared with `e2fsck -fn` on the recovered image.
#[test]
fn allocation_audit_agrees_with_e2fsck() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkimage(dir.path(), "audit.img", 64, &[]);
    let opts = MountOptions {
        data_mode: DataMode::Lightweight,
        ..MountOptions::default()
    };
    let fs = Fs::open(&img, &opts).unwrap();
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, Creds::ROOT).unwrap();
    let mut inos = Vec::new();
    for i in 0..20u8 {
        let f = fs
            .create(d.ino, format!("f{i}").as_bytes(), 0o100644, 0, Creds::ROOT)
            .unwrap();
        // Every other block written: many extents, so a tree deeper than the inode's root.
        for k in 0..400u64 {
            fs.write(f.ino, k * 8192, &pattern(i, 100)).unwrap();
        }
        inos.push(f.ino);
    }
    fs.setxattr(
        inos[0],
        b"user.big",
        &[7u8; 3000],
        tidefs::fs::XattrSetMode::Any,
    )
    .unwrap();
    fs.unmount().unwrap();
    drop(fs);
    common::assert_fsck_clean(&img);
    let fs = Fs::open(&img, &opts).unwrap();
    assert_eq!(
        fs.audit_allocation().unwrap(),
        tidefs::fs::AllocationAudit::default(),
        "a clean image has no leaks"
    );
    // Truncated, not unlinked: an unlink changes names, which is journaled in every mode, and
    // frees at once; a lightweight truncate's frees reach the bitmaps one commit later.
    for &ino in &inos[..10] {
        fs.setattr(
            ino,
            &SetAttr {
                size: Some(0),
                ..SetAttr::default()
            },
        )
        .unwrap();
        fs.fsync(ino, false).unwrap();
    }
    fs.crash();
    drop(fs);
    let fs = Fs::open(&img, &opts).unwrap();
    let audit = fs.audit_allocation().unwrap();
    eprintln!("after the crash: {audit:?}");
    fs.unmount().unwrap();
    drop(fs);
    let out = std::process::Command::new("e2fsck")
        .arg("-fn")
        .arg(&img)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        audit.leaked_blocks > 0,
        "the crash should leak: {audit:?}\n{report}"
    );
    assert_eq!(audit.used_blocks_marked_free, 0, "{report}");
    assert_eq!(audit.used_inodes_marked_free, 0, "{report}");
    assert_eq!(e2fsck_differences(&report, "Block", '+'), 0, "{report}");
    assert_eq!(
        audit.leaked_blocks,
        e2fsck_differences(&report, "Block", '-'),
        "{audit:?}\n{report}"
    );
    assert_eq!(
        audit.leaked_inodes,
        e2fsck_differences(&report, "Inode", '-'),
        "{audit:?}\n{report}"
    );
}

/// Goal: lightweight appends to a file made in the same mount go in place once the log's copy
/// of its inode-table block is home. While the log holds a block, a lightweight change of it
/// is journaled (a checkpoint must never write that older copy over an in-place write), and
/// checkpoints start at half a log: every append journaled the block until then. Now after two
/// commits in a row that journaled such blocks, the next commit checkpoints first.
/// Method: a file is made (a change of names, journaled) and fsync'd, then 20 appends of 125
/// bytes with fdatasync back to back (no pause for a background checkpoint to win a race);
/// the journal bytes each added: the first allocates, the second journals the held block
/// (descriptor, block, commit: 12 KiB), and from the fourth on only the commit block.
#[test]
fn lightweight_appends_go_in_place_once_the_log_lets_go() {
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkimage(dir.path(), "lw.img", 64, &[]);
    let opts = MountOptions {
        data_mode: DataMode::Lightweight,
        ..MountOptions::default()
    };
    let fs = Fs::open(&img, &opts).unwrap();
    let f = fs
        .create(ROOT_INO, b"log", 0o100644, 0, Creds::ROOT)
        .unwrap();
    fs.fsync(f.ino, false).unwrap();
    let per_append: Vec<u64> = (0..20u64)
        .map(|k| {
            let before = fs.stats().journal_bytes;
            fs.write(f.ino, k * 125, &pattern(k as u8, 125)).unwrap();
            fs.fsync(f.ino, true).unwrap();
            fs.stats().journal_bytes - before
        })
        .collect();
    assert!(
        per_append[1] > 8192,
        "the second append should journal the block the log held: {per_append:?}"
    );
    assert!(
        per_append[3..].iter().all(|&b| b <= 4096),
        "appends kept journaling their inode-table block: {per_append:?}"
    );
    fs.unmount().unwrap();
    drop(fs);
    common::assert_fsck_clean(&img);
    let fs = Fs::open(&img, &opts).unwrap();
    let want: Vec<u8> = (0..20u64).flat_map(|k| pattern(k as u8, 125)).collect();
    assert_eq!(fs.read(f.ino, 0, 4000).unwrap(), want);
    fs.unmount().unwrap();
}
