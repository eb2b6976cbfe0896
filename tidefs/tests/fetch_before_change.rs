//! Goal: operations fetch the blocks they will change before their first change (docs/DESIGN.md
//! §4.1), so that one that must read a block from the device stops for it with nothing to take back
//! (one that has changed something reads under the metadata lock instead, counted in
//! `Stats::reads_after_change`): a create's new inode-table block, a new directory's block bitmap,
//! the bitmaps and group descriptors an unlink, rmdir, rename-over, truncate or punch-hole frees
//! into or an allocation takes from, the partial edge blocks a truncate, punch-hole or zero-range
//! keeps, the index of a directory moved to another parent (its `..` entry changes), the inodes,
//! maps and bitmaps a commit's write-back needs (past the blocks waiting in quarantine and those
//! the files before it take), the new extent-tree block of a punch that splits an extent, the
//! truncate of a file with capabilities, and the orphan list walked to an inode that leaves it.
//!
//! Method: an image made by the real `mkfs.ext4` with several block groups and inode-table
//! blocks that were never read, mounted in memory; each phase starts with every cache
//! dropped, runs creates, mkdirs, moves and exchanges of directories across parents,
//! rename-overs, unlinks and rmdirs,
//! and the counters must show operations that stopped for device reads (the test reaches the
//! cold paths) and none that read a block after changing something. The image is then checked
//! with the real `e2fsck -fn`.

mod common;

use std::sync::Arc;

use tidefs::dev::MemDev;
use tidefs::fs::{Creds, Fs, MountOptions, RenameFlags, SetAttr, XattrSetMode, ROOT_INO};

/// A fresh image from the real mkfs.ext4 with eight groups of 4 096 blocks (new directories
/// and large files spread to cold groups), mounted in memory; `None` without e2fsprogs.
fn mounted() -> Option<(Fs, Arc<MemDev>)> {
    if !common::have_e2fsprogs() {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = common::mkimage(dir.path(), "t.img", 128, &["-g", "4096", "-N", "8192"]);
    let mem = Arc::new(MemDev::from_bytes(std::fs::read(&image).unwrap()));
    let fs = Fs::open_devices(mem.clone(), None, &MountOptions::default()).unwrap();
    Some((fs, mem))
}

/// Checks the counters since `before`: the phase `what` met cold blocks and never read one
/// after a change; returns the counters now.
fn assert_stops_only_before_changes(fs: &Fs, what: &str, before: (u64, u64)) -> (u64, u64) {
    let s = fs.stats();
    let (stops, late) = (s.deferred_reads - before.0, s.reads_after_change - before.1);
    assert!(stops > 0, "{what}: the phase should meet cold blocks");
    assert_eq!(
        late, 0,
        "{what}: operations read {late} block(s) after their first change ({stops} stops)"
    );
    (s.deferred_reads, s.reads_after_change)
}

#[test]
fn namespace_operations_stop_for_reads_only_before_their_first_change() {
    let Some((fs, mem)) = mounted() else {
        return;
    };
    let creds = Creds::ROOT;
    let name = |prefix: &str, i: usize| format!("{prefix}{i}").into_bytes();
    let payload = vec![7u8; 3 * 4096 + 100];

    // Phase 1, cold: directories (spread over groups) with files in them.
    fs.drop_caches().unwrap();
    let mut dirs = Vec::new();
    for d in 0..6 {
        let ino = fs.mkdir(ROOT_INO, &name("d", d), 0o755, creds).unwrap().ino;
        for f in 0..40 {
            let file = fs
                .create(ino, &name("f", f), 0o100644, 0, creds)
                .unwrap()
                .ino;
            fs.write(file, 0, &payload).unwrap();
        }
        dirs.push(ino);
    }
    let sub = fs.mkdir(dirs[0], b"sub", 0o755, creds).unwrap().ino;
    fs.create(sub, b"inner", 0o100644, 0, creds).unwrap();
    let other = fs.mkdir(dirs[2], b"other", 0o755, creds).unwrap().ino;
    fs.create(other, b"inner", 0o100644, 0, creds).unwrap();
    fs.sync().unwrap();

    // Phase 2, cold: moves across parents, rename-overs, unlinks, rmdirs.
    fs.drop_caches().unwrap();
    let none = RenameFlags::default();
    fs.rename(dirs[0], b"sub", dirs[1], b"sub", none).unwrap();
    fs.drop_caches().unwrap();
    let exchange = RenameFlags {
        exchange: true,
        noreplace: false,
    };
    fs.rename(dirs[1], b"sub", dirs[2], b"other", exchange)
        .unwrap();
    fs.rename(dirs[2], b"f0", dirs[3], b"f0", none).unwrap();
    for f in 1..20 {
        fs.unlink(dirs[4], &name("f", f)).unwrap();
    }
    fs.drop_caches().unwrap();
    for f in 0..40 {
        fs.unlink(dirs[5], &name("f", f)).unwrap();
    }
    fs.rmdir(ROOT_INO, b"d5").unwrap();
    fs.drop_caches().unwrap();
    fs.mkdir(dirs[3], b"empty", 0o755, creds).unwrap();
    fs.drop_caches().unwrap();
    fs.rmdir(dirs[3], b"empty").unwrap();
    fs.sync().unwrap();

    let s = fs.stats();
    assert!(
        s.deferred_reads > 20,
        "the workload should meet cold blocks: {} deferred reads",
        s.deferred_reads
    );
    assert_eq!(
        s.reads_after_change, 0,
        "operations read {} block(s) after their first change ({} stops)",
        s.reads_after_change, s.deferred_reads
    );
    fs.unmount().unwrap();
    common::assert_mem_fsck_clean(&mem);
}

#[test]
fn data_and_attribute_operations_stop_for_reads_only_before_their_first_change() {
    let Some((fs, mem)) = mounted() else {
        return;
    };
    let creds = Creds::ROOT;
    let mut files = Vec::new();
    for d in 0..5 {
        let dir = fs
            .mkdir(ROOT_INO, format!("d{d}").as_bytes(), 0o755, creds)
            .unwrap()
            .ino;
        let f = fs.create(dir, b"f", 0o100644, 0, creds).unwrap().ino;
        for k in 0..50u64 {
            fs.write(f, k * 8192, &[1u8; 4096]).unwrap();
        }
        files.push(f);
    }
    // 40 MiB: the file spans three groups of 16 MiB.
    let big = fs.create(ROOT_INO, b"big", 0o100644, 0, creds).unwrap().ino;
    for k in 0..40u64 {
        fs.write(big, k << 20, &vec![3u8; 1 << 20]).unwrap();
    }
    let many: Vec<u64> = (0..300)
        .map(|k| {
            let name = format!("m{k}");
            fs.create(ROOT_INO, name.as_bytes(), 0o100644, 0, creds)
                .unwrap()
                .ino
        })
        .collect();
    fs.sync().unwrap();
    let truncate = |size| SetAttr {
        size: Some(size),
        ..Default::default()
    };
    let mut seen = (fs.stats().deferred_reads, fs.stats().reads_after_change);
    let mut cold = |what: &str, op: &dyn Fn()| {
        fs.drop_caches().unwrap();
        op();
        fs.sync().unwrap();
        seen = assert_stops_only_before_changes(&fs, what, seen);
    };
    cold("truncate", &|| {
        fs.setattr(files[0], &truncate(4096)).unwrap();
    });
    cold("setxattr with a new block", &|| {
        fs.setxattr(files[1], b"user.big", &[b'x'; 3000], XattrSetMode::Any)
            .unwrap();
    });
    cold("fallocate", &|| {
        fs.fallocate(files[2], 1 << 20, 1 << 20, false).unwrap()
    });
    cold("punch-hole", &|| {
        fs.punch_hole(files[3], 0, 8192 * 20).unwrap()
    });
    cold("write-back of new blocks", &|| {
        fs.write(files[4], 10 << 20, &[2u8; 40960]).unwrap();
    });
    cold("truncate across groups", &|| {
        fs.setattr(big, &truncate(4096)).unwrap();
    });
    cold("write-back across groups", &|| {
        let big2 = fs
            .create(ROOT_INO, b"big2", 0o100644, 0, creds)
            .unwrap()
            .ino;
        for k in 0..40u64 {
            fs.write(big2, k << 20, &vec![3u8; 1 << 20]).unwrap();
        }
    });
    cold("punch-hole across groups", &|| {
        let big2 = fs.lookup(ROOT_INO, b"big2").unwrap().ino;
        fs.punch_hole(big2, 0, 30 << 20).unwrap();
    });
    cold("unaligned truncate", &|| {
        fs.setattr(files[2], &truncate(8192 * 10 + 100)).unwrap();
    });
    cold("unaligned punch-hole", &|| {
        fs.punch_hole(files[3], 8192 * 30 + 100, 8192 * 5).unwrap()
    });
    cold("unaligned zero-range", &|| {
        fs.zero_range(files[4], 8192 * 2 + 100, 8192 * 3, true)
            .unwrap()
    });
    cold("fallocate across groups", &|| {
        let f = fs
            .create(ROOT_INO, b"falloc", 0o100644, 0, creds)
            .unwrap()
            .ino;
        fs.fallocate(f, 0, 40 << 20, false).unwrap();
    });
    cold("write-back of many cold files", &|| {
        for &f in &many {
            fs.write(f, 0, b"hello").unwrap();
        }
    });
    // As many extents as the inode holds, four blocks each, the last in another group than
    // the others (a file filled their group first): a hole inside the first needs a leaf,
    // allocated near the last.
    let spread = fs.mkdir(ROOT_INO, b"spread", 0o755, creds).unwrap().ino;
    let pieces = fs
        .create(spread, b"pieces", 0o100644, 0, creds)
        .unwrap()
        .ino;
    for k in 0..3u64 {
        fs.write(pieces, k * 32768, &[5u8; 16384]).unwrap();
    }
    fs.sync().unwrap();
    let filler = fs
        .create(spread, b"filler", 0o100644, 0, creds)
        .unwrap()
        .ino;
    fs.write(filler, 0, &vec![4u8; 20 << 20]).unwrap();
    fs.sync().unwrap();
    fs.write(pieces, 1 << 20, &[5u8; 16384]).unwrap();
    let capped = fs
        .create(ROOT_INO, b"capped", 0o100644, 0, creds)
        .unwrap()
        .ino;
    fs.write(capped, 0, &vec![6u8; 64 << 10]).unwrap();
    fs.setxattr(capped, b"security.capability", b"caps", XattrSetMode::Any)
        .unwrap();
    // An O_TMPFILE file, then open but unlinked files, in directories of different groups:
    // the orphan list runs through inode-table blocks of their own.
    let d4 = fs.lookup(ROOT_INO, b"d4").unwrap().ino;
    let unnamed = fs.tmpfile(d4, 0o644, creds).unwrap().ino;
    let orphans: Vec<u64> = (0..4)
        .map(|k| {
            let dir = fs.lookup(ROOT_INO, format!("d{k}").as_bytes()).unwrap().ino;
            let f = fs.create(dir, b"orphan", 0o100644, 0, creds).unwrap().ino;
            fs.write(f, 0, &[9u8; 8192]).unwrap();
            fs.open_inode(f).unwrap();
            fs.unlink(dir, b"orphan").unwrap();
            f
        })
        .collect();
    fs.sync().unwrap();
    seen = (fs.stats().deferred_reads, fs.stats().reads_after_change);
    let mut cold = |what: &str, op: &dyn Fn()| {
        fs.drop_caches().unwrap();
        op();
        fs.sync().unwrap();
        seen = assert_stops_only_before_changes(&fs, what, seen);
    };
    cold("punch-hole splitting a full leaf", &|| {
        fs.punch_hole(pieces, 4096, 4096).unwrap();
    });
    cold("truncate of a file with capabilities", &|| {
        fs.setattr(capped, &truncate(4096)).unwrap();
    });
    cold("release of an orphan behind others", &|| {
        fs.release_inode(orphans[1]).unwrap();
    });
    cold("link of an unnamed file behind orphans", &|| {
        fs.link(unnamed, d4, b"named").unwrap();
    });
    fs.unmount().unwrap();
    common::assert_mem_fsck_clean(&mem);
}

/// Goal: a write-back that allocates right after an unlink freed the groups its goal would
/// lead it to (the freed blocks wait in quarantine until the commit, yet the group
/// descriptors count them free) fetches the groups it will really take its blocks from,
/// before its first change. Method: a 40 MiB file is unlinked and, in the same transaction,
/// another 40 MiB file in the same directory is written, with every cache dropped between.
#[test]
fn writeback_after_an_unlink_fetches_past_blocks_in_quarantine() {
    let Some((fs, mem)) = mounted() else {
        return;
    };
    let creds = Creds::ROOT;
    let dir = fs.mkdir(ROOT_INO, b"d", 0o755, creds).unwrap().ino;
    let old = fs.create(dir, b"old", 0o100644, 0, creds).unwrap().ino;
    for k in 0..40u64 {
        fs.write(old, k << 20, &vec![1u8; 1 << 20]).unwrap();
    }
    fs.sync().unwrap();
    let before = (fs.stats().deferred_reads, fs.stats().reads_after_change);
    fs.drop_caches().unwrap();
    fs.unlink(dir, b"old").unwrap();
    let new = fs.create(dir, b"new", 0o100644, 0, creds).unwrap().ino;
    for k in 0..40u64 {
        fs.write(new, k << 20, &vec![2u8; 1 << 20]).unwrap();
    }
    fs.sync().unwrap();
    assert_stops_only_before_changes(&fs, "write-back after an unlink", before);
    fs.unmount().unwrap();
    common::assert_mem_fsck_clean(&mem);
}

/// Goal: a write-back of several new files whose block searches start in the same group
/// fetches, for each file, the groups it will take its blocks from after the files before it
/// took theirs, before its first change. Method: three 12 MiB files in one directory (one
/// goal, groups of 16 MiB) written in one transaction with every cache dropped before; a
/// file written and deleted there first leaves the groups' bitmaps on disk (a group never
/// used has its bitmap made in memory, with no read).
#[test]
fn writeback_of_files_sharing_a_goal_fetches_past_each_others_blocks() {
    let Some((fs, mem)) = mounted() else {
        return;
    };
    let creds = Creds::ROOT;
    let dir = fs.mkdir(ROOT_INO, b"d", 0o755, creds).unwrap().ino;
    let first = fs.create(dir, b"first", 0o100644, 0, creds).unwrap().ino;
    for m in 0..48u64 {
        fs.write(first, m << 20, &vec![9u8; 1 << 20]).unwrap();
    }
    fs.sync().unwrap();
    fs.unlink(dir, b"first").unwrap();
    fs.sync().unwrap();
    let before = (fs.stats().deferred_reads, fs.stats().reads_after_change);
    fs.drop_caches().unwrap();
    for k in 0..3u8 {
        let f = fs
            .create(dir, &[b'f', b'0' + k], 0o100644, 0, creds)
            .unwrap()
            .ino;
        for m in 0..12u64 {
            fs.write(f, m << 20, &vec![k; 1 << 20]).unwrap();
        }
    }
    fs.sync().unwrap();
    assert_stops_only_before_changes(&fs, "write-back of files sharing a goal", before);
    fs.unmount().unwrap();
    common::assert_mem_fsck_clean(&mem);
}
