//! Goal: the library API works end to end on an image made by the real mkfs.ext4, and the image
//! it leaves behind is clean by the real e2fsck. Method: open, run every kind of operation,
//! check what reads back, unmount, run `e2fsck -fn`, reopen and check again.

mod common;

use tidefs::fs::{Creds, Fs, MountOptions, RenameFlags, SetAttr, XattrSetMode, ROOT_INO};
use tidefs::FsError;

/// A fresh image of `mb` MiB from the real mkfs, opened with the default options: the
/// directory that holds it (removed when dropped), its path and the file system; `None` (the
/// test skips, or fails in CI) without e2fsprogs.
fn fresh(name: &str, mb: u64) -> Option<(tempfile::TempDir, std::path::PathBuf, Fs)> {
    if !common::have_e2fsprogs() {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkimage(dir.path(), name, mb, &[]);
    let fs = Fs::open(&img, &MountOptions::default()).unwrap();
    Some((dir, img, fs))
}

/// Goal and method: see the module doc.
#[test]
fn operations_round_trip_and_fsck_clean() {
    let Some((_dir, img, fs)) = fresh("t.img", 64) else {
        return;
    };
    let c = Creds::ROOT;
    let d = fs.mkdir(ROOT_INO, b"dir", 0o755, c).unwrap();
    let f = fs.create(d.ino, b"file", 0o100644, 0, c).unwrap();
    assert_eq!(fs.write(f.ino, 0, b"hello world").unwrap(), 11);
    assert_eq!(fs.write(f.ino, 10000, b"tail").unwrap(), 4);
    assert_eq!(fs.read(f.ino, 0, 11).unwrap(), b"hello world");
    let all = fs.read(f.ino, 0, 20000).unwrap();
    assert_eq!(all.len(), 10004);
    assert!(all[11..10000].iter().all(|b| *b == 0));
    fs.symlink(d.ino, b"short", b"file", c).unwrap();
    let long = vec![b'x'; 200];
    let l = fs.symlink(d.ino, b"long", &long, c).unwrap();
    assert_eq!(fs.readlink(l.ino).unwrap(), long);
    fs.link(f.ino, ROOT_INO, b"hard").unwrap();
    assert_eq!(fs.getattr(f.ino).unwrap().nlink, 2);
    fs.setxattr(f.ino, b"user.k", b"v", XattrSetMode::Create)
        .unwrap();
    assert_eq!(fs.getxattr(f.ino, b"user.k").unwrap(), b"v");
    fs.setxattr(f.ino, b"user.big", &vec![7u8; 1000], XattrSetMode::Any)
        .unwrap();
    assert_eq!(fs.listxattr(f.ino).unwrap().len(), 2);
    fs.rename(d.ino, b"file", ROOT_INO, b"moved", RenameFlags::default())
        .unwrap();
    assert_eq!(fs.lookup(ROOT_INO, b"moved").unwrap().ino, f.ino);
    for i in 0..300 {
        fs.create(d.ino, format!("n{i:04}").as_bytes(), 0o100644, 0, c)
            .unwrap();
    }
    for i in (0..300).step_by(3) {
        fs.unlink(d.ino, format!("n{i:04}").as_bytes()).unwrap();
    }
    let mut names = Vec::new();
    fs.readdir(d.ino, 0, &mut |e| {
        names.push(e.name);
        true
    })
    .unwrap();
    assert_eq!(names.len(), 2 + 200 + 2);
    fs.setattr(
        f.ino,
        &SetAttr {
            size: Some(5),
            ..SetAttr::default()
        },
    )
    .unwrap();
    assert_eq!(fs.read(f.ino, 0, 100).unwrap(), b"hello");
    fs.fallocate(f.ino, 0, 1 << 20, true).unwrap();
    fs.fsync(f.ino, false).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    common::assert_fsck_clean(&img);

    let fs = Fs::open(&img, &MountOptions::default()).unwrap();
    let m = fs.lookup(ROOT_INO, b"moved").unwrap();
    assert_eq!(fs.read(m.ino, 0, 100).unwrap(), b"hello");
    assert_eq!(fs.getxattr(m.ino, b"user.big").unwrap(), vec![7u8; 1000]);
    assert!(fs.lookup(ROOT_INO, b"dir").is_ok());
    fs.unmount().unwrap();
    common::assert_fsck_clean(&img);
}

/// Goal: the commit timer writes nothing when nothing changed (an idle mount does not fill its
/// journal with empty transactions), and does commit a change on its own: durably, so the
/// change survives a crash with no fsync. Method: a 10 ms timer; count commits while idle, then
/// make a change, wait for the timer's commit, stop as at a power cut and open again.
#[test]
fn commit_timer_skips_idle_and_commits_changes() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkimage(dir.path(), "idle.img", 32, &[]);
    let opts = MountOptions {
        commit_interval: std::time::Duration::from_millis(10),
        ..MountOptions::default()
    };
    let fs = Fs::open(&img, &opts).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_eq!(
        fs.stats().commits,
        0,
        "the timer committed an empty transaction"
    );
    fs.mkdir(ROOT_INO, b"d", 0o755, Creds::ROOT).unwrap();
    let mut waited = 0;
    while fs.stats().commits == 0 && waited < 500 {
        std::thread::sleep(std::time::Duration::from_millis(10));
        waited += 1;
    }
    assert_eq!(fs.stats().commits, 1, "the timer did not commit the change");
    fs.crash();
    drop(fs);
    let fs = Fs::open(&img, &MountOptions::default()).unwrap();
    assert!(
        fs.lookup(ROOT_INO, b"d").is_ok(),
        "the change the timer committed is lost after a crash"
    );
    fs.unmount().unwrap();
}

/// Goal: the library drops privileges a file's new contents or owner were not granted, as
/// the kernel does for a local file system: a write, a truncate and a change of owner remove
/// `security.capability` (and nothing else); `kill_suidgid` clears set-user-ID, and
/// set-group-ID only when the group may execute the file. Method: set, change, read back.
#[test]
fn writes_truncates_and_chown_drop_capabilities_and_setid_bits() {
    let Some((_dir, img, fs)) = fresh("t.img", 64) else {
        return;
    };
    let f = fs
        .create(ROOT_INO, b"prog", 0o106755, 0, Creds::ROOT)
        .unwrap();
    let caps = [
        1u8, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    let give = || {
        fs.setxattr(f.ino, b"security.capability", &caps, XattrSetMode::Any)
            .unwrap();
    };
    let has_caps = || fs.getxattr(f.ino, b"security.capability").is_ok();
    fs.setxattr(f.ino, b"user.keep", b"1", XattrSetMode::Any)
        .unwrap();
    give();
    assert!(has_caps());
    fs.write(f.ino, 0, b"#!").unwrap();
    assert!(!has_caps(), "a write keeps security.capability");
    give();
    fs.setattr(
        f.ino,
        &SetAttr {
            size: Some(1),
            ..SetAttr::default()
        },
    )
    .unwrap();
    assert!(!has_caps(), "a truncate keeps security.capability");
    give();
    fs.setattr(
        f.ino,
        &SetAttr {
            uid: Some(1000),
            ..SetAttr::default()
        },
    )
    .unwrap();
    assert!(!has_caps(), "a chown keeps security.capability");
    assert_eq!(fs.getxattr(f.ino, b"user.keep").unwrap(), b"1");
    // Set-ID bits stay until asked: root's write keeps them.
    assert_eq!(fs.getattr(f.ino).unwrap().perm, 0o6755);
    fs.kill_suidgid(f.ino).unwrap();
    assert_eq!(fs.getattr(f.ino).unwrap().perm, 0o755);
    let set_perm = |p: u16| {
        fs.setattr(
            f.ino,
            &SetAttr {
                mode: Some(p),
                ..SetAttr::default()
            },
        )
        .unwrap();
    };
    set_perm(0o6745);
    fs.kill_suidgid(f.ino).unwrap();
    assert_eq!(fs.getattr(f.ino).unwrap().perm, 0o2745, "no group execute");
    fs.unmount().unwrap();
    common::assert_fsck_clean(&img);
}

/// Goal: timestamps are multigrain, as the kernel's ext4 has them since Linux 6.13: a write
/// after someone looked at the file's times always moves them forward, while a write right
/// after another that nobody looked at takes the coarse clock, so it usually changes nothing
/// and the fsync after it needs no commit. Method: getattr around writes (always newer), then
/// 50 rounds of write + fsync + write + fsync with no getattr: some second fsyncs must find
/// nothing to commit (a round shorter than a clock tick keeps the times).
#[test]
fn timestamps_are_multigrain() {
    let Some((_dir, img, fs)) = fresh("t.img", 64) else {
        return;
    };
    let f = fs
        .create(ROOT_INO, b"log", 0o100644, 0, Creds::ROOT)
        .unwrap();
    let time = |a: &tidefs::fs::Attr| (a.mtime.sec, a.mtime.nsec, a.ctime.sec, a.ctime.nsec);
    let mut before = time(&fs.getattr(f.ino).unwrap());
    for i in 0..20u64 {
        fs.write(f.ino, i, b"x").unwrap();
        let after = time(&fs.getattr(f.ino).unwrap());
        assert!(
            after > before,
            "a write after a getattr must move the times forward"
        );
        before = after;
    }
    fs.fsync(f.ino, false).unwrap();
    // Commits of `rounds` rounds of write + fsync, `between`, write + fsync.
    let rounds = 50;
    let commits_of = |between: &dyn Fn()| {
        let start = fs.stats().commits;
        for i in 0..rounds {
            fs.write(f.ino, i, b"a").unwrap();
            fs.fsync(f.ino, false).unwrap();
            between();
            fs.write(f.ino, i, b"b").unwrap();
            fs.fsync(f.ino, false).unwrap();
        }
        fs.stats().commits - start
    };
    let commits = commits_of(&|| {});
    assert!(
        commits < 2 * rounds,
        "{commits} commits for {rounds} rounds: no second write kept the times"
    );
    // `refresh_attr` is not a look: with one between the writes the rounds cost no more
    // commits than without, while `getattr` there makes every second write change the times.
    let refreshed = commits_of(&|| assert_eq!(fs.refresh_attr(f.ino).unwrap().size, 50));
    assert!(
        refreshed < 2 * rounds,
        "{refreshed} commits for {rounds} rounds with refreshes"
    );
    let looked = commits_of(&|| assert_eq!(fs.getattr(f.ino).unwrap().size, 50));
    assert!(
        looked >= rounds,
        "{looked} commits for {rounds} rounds with a getattr between the writes"
    );
    // The data is all there and the times moved past the last look.
    let last = fs.getattr(f.ino).unwrap();
    assert!(time(&last) >= before);
    assert_eq!(fs.read(f.ino, 0, 50).unwrap(), vec![b'b'; 50]);
    fs.unmount().unwrap();
    common::assert_fsck_clean(&img);
}

/// Goal: open handles keep an unlinked file until the last release, also when opens and releases of
/// linked files take the path that skips the metadata lock (their counts live in a table of their
/// own, `fs/open_files.rs`). Method: a file opened twice is unlinked; it stays readable, can be
/// opened once more while open, is freed at the last release only (free counts back to where they
/// were), and cannot be opened after that. Then threads open, read and release files while another
/// thread unlinks and re-creates them: every open either fails with NotFound or reads one file's
/// whole content (or nothing, before its write), and after all handles are gone the image is clean
/// by e2fsck (no inode freed under an open handle, none leaked).
#[test]
fn open_handles_keep_unlinked_files_until_the_last_release() {
    use std::sync::atomic::{AtomicBool, Ordering};

    let Some((_dir, img, fs)) = fresh("open.img", 64) else {
        return;
    };
    let c = Creds::ROOT;
    let before = fs.statfs().unwrap();
    let f = fs.create(ROOT_INO, b"f", 0o100644, 0, c).unwrap().ino;
    fs.write(f, 0, &vec![5u8; 50_000]).unwrap();
    fs.sync().unwrap();
    fs.getattr(f).unwrap();
    fs.open_inode(f).unwrap();
    fs.open_inode(f).unwrap();
    fs.unlink(ROOT_INO, b"f").unwrap();
    assert_eq!(fs.getattr(f).unwrap().nlink, 0);
    // Still open, so it can be opened again (as through /proc/self/fd).
    fs.open_inode(f).unwrap();
    fs.release_inode(f).unwrap();
    fs.release_inode(f).unwrap();
    assert_eq!(fs.read(f, 0, 50_000).unwrap(), vec![5u8; 50_000]);
    fs.release_inode(f).unwrap();
    assert!(matches!(fs.getattr(f), Err(FsError::NotFound)));
    assert!(matches!(fs.open_inode(f), Err(FsError::NotFound)));
    fs.sync().unwrap();
    let after = fs.statfs().unwrap();
    assert_eq!(
        (after.blocks_free, after.files_free),
        (before.blocks_free, before.files_free),
        "the last release freed the file"
    );

    let names: Vec<Vec<u8>> = (0..4).map(|i| format!("g{i}").into_bytes()).collect();
    let content = |i: usize| vec![i as u8 + 1; 9000];
    for (i, n) in names.iter().enumerate() {
        let g = fs.create(ROOT_INO, n, 0o100644, 0, c).unwrap().ino;
        fs.write(g, 0, &content(i)).unwrap();
    }
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..3 {
            let (fs, names, stop) = (&fs, &names, &stop);
            s.spawn(move || {
                let mut k = t;
                while !stop.load(Ordering::SeqCst) {
                    k = (k + 1) % names.len();
                    let Ok(a) = fs.lookup(ROOT_INO, &names[k]) else {
                        continue;
                    };
                    match fs.open_inode(a.ino) {
                        Ok(()) => {
                            // Empty when the name's new file is not written yet. The number
                            // may belong to another name's file by now: a lookup does not pin
                            // the inode (the kernel opens through a handle it holds), so
                            // between this thread's lookup and its open the file can be
                            // unlinked, freed, and its number taken by the next create.
                            let got = fs.read(a.ino, 0, 9000).unwrap();
                            assert!(
                                got.is_empty() || (0..names.len()).any(|j| got == content(j)),
                                "an open handle reads one file's whole content, got {} bytes: {:?}",
                                got.len(),
                                got.iter().collect::<std::collections::BTreeSet<_>>()
                            );
                            fs.release_inode(a.ino).unwrap();
                        }
                        Err(FsError::NotFound) => {}
                        Err(e) => panic!("open: {e}"),
                    }
                }
            });
        }
        for round in 0..200 {
            let k = round % names.len();
            fs.unlink(ROOT_INO, &names[k]).unwrap();
            let g = fs.create(ROOT_INO, &names[k], 0o100644, 0, c).unwrap().ino;
            fs.write(g, 0, &content(k)).unwrap();
        }
        stop.store(true, Ordering::SeqCst);
    });
    fs.unmount().unwrap();
    drop(fs);
    common::assert_fsck_clean(&img);
}

/// Goal: `flushes` in the statistics counts every cache flush the device received, including
/// the one that ends each commit record's durable write. Method: ten appends with an fsync
/// each on an `ordered` mount commit ten times, each with a flush before its commit record
/// and the commit record's own: at least two flushes per commit.
#[test]
fn flush_count_includes_each_commit_record() {
    let Some((_dir, _img, fs)) = fresh("flushes.img", 64) else {
        return;
    };
    let f = fs
        .create(ROOT_INO, b"log", 0o100644, 0, Creds::ROOT)
        .unwrap()
        .ino;
    fs.fsync(f, false).unwrap();
    let before = fs.stats();
    for i in 0..10u64 {
        fs.write(f, i * 100, &[b'r'; 100]).unwrap();
        fs.fsync(f, true).unwrap();
    }
    let after = fs.stats();
    let commits = after.commits - before.commits;
    let flushes = after.flushes - before.flushes;
    assert_eq!(commits, 10, "each growing append commits");
    assert!(
        flushes >= 2 * commits,
        "{flushes} flushes for {commits} commits"
    );
    fs.unmount().unwrap();
}

/// Goal: space held by an orphan (an unlinked inode still held, as the FUSE adapter holds one
/// until the kernel forgets it) is waited for, briefly, by an operation that runs out of
/// space: `rm big; write` finds the space even when the last release comes a moment later.
/// Method: fill a small image, hold the file, unlink it, release it from another thread 50 ms
/// later while this thread writes 1 MiB: the write is whole. Held with no release coming, the
/// write fails with ENOSPC after a bounded wait instead.
#[test]
fn a_full_file_system_waits_for_orphans_being_released() {
    let Some((_dir, img, fs)) = fresh("full.img", 16) else {
        return;
    };
    let fs = std::sync::Arc::new(fs);
    let c = Creds::ROOT;
    let chunk = vec![3u8; 1 << 20];
    let fill = |name: &[u8]| {
        let f = fs.create(ROOT_INO, name, 0o100644, 0, c).unwrap().ino;
        let mut at = 0u64;
        loop {
            match fs.write(f, at, &chunk) {
                Ok(n) => at += u64::from(n),
                Err(FsError::NoSpace) => break,
                Err(e) => panic!("fill: {e}"),
            }
        }
        assert!(at > 8 << 20, "filled only {at} bytes");
        f
    };
    let big = fill(b"big");
    fs.open_inode(big).unwrap();
    fs.unlink(ROOT_INO, b"big").unwrap();
    let releaser = {
        let fs = fs.clone();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            fs.forget_inode(big, 1).unwrap();
        })
    };
    let after = fs.create(ROOT_INO, b"after", 0o100644, 0, c).unwrap().ino;
    assert_eq!(
        fs.write(after, 0, &chunk).unwrap() as usize,
        chunk.len(),
        "the write found the orphan's space"
    );
    releaser.join().unwrap();
    fs.unlink(ROOT_INO, b"after").unwrap();
    // Held for good: the wait is bounded, and the write fails as it must.
    let late = fs.create(ROOT_INO, b"late", 0o100644, 0, c).unwrap().ino;
    let big = fill(b"big2");
    fs.open_inode(big).unwrap();
    fs.unlink(ROOT_INO, b"big2").unwrap();
    assert!(matches!(fs.write(late, 0, &chunk), Err(FsError::NoSpace)));
    fs.release_inode(big).unwrap();
    fs.unmount().unwrap();
    common::assert_fsck_clean(&img);
}

/// Goal: an orphan that is added and freed again within one transaction (what every unlink of
/// a closed file through FUSE does: the kernel's FORGET follows the unlink) costs the journal
/// no superblock block. Method: the journal bytes of committing an unlink of a held file
/// released right after equal those of committing a plain unlink of a file just like it.
#[test]
fn an_orphan_freed_in_its_own_transaction_leaves_the_superblock_out() {
    let Some((_dir, img, fs)) = fresh("orphan.img", 64) else {
        return;
    };
    let journal_for = |name: &[u8], held: bool| -> u64 {
        let f = fs
            .create(ROOT_INO, name, 0o100644, 0, Creds::ROOT)
            .unwrap()
            .ino;
        fs.write(f, 0, b"x").unwrap();
        fs.sync().unwrap();
        let before = fs.stats().journal_bytes;
        if held {
            fs.open_inode(f).unwrap();
        }
        fs.unlink(ROOT_INO, name).unwrap();
        if held {
            fs.release_inode(f).unwrap();
        }
        fs.sync().unwrap();
        fs.stats().journal_bytes - before
    };
    // The first unfenced commit sets the journal's extension bit (a superblock write that
    // counts as journal bytes); measure after it.
    journal_for(b"warm", false);
    let plain = journal_for(b"plain", false);
    let held = journal_for(b"held", true);
    assert_eq!(held, plain, "journal bytes: held then released vs plain");
    fs.unmount().unwrap();
    common::assert_fsck_clean(&img);
}

/// Goal: the listener of `Fs::on_blocks_changed` hears of every inode whose block count moves
/// without an operation on it asking (extent-tree blocks added at write-back, an attribute
/// block), and of no other. Method: a file of 10 separate one-block extents and a file written
/// in one run, fsync of both; then a 2000-byte attribute on the second, set and removed. The
/// block counts are checked beside what the listener heard.
#[test]
fn the_blocks_listener_hears_of_changes_no_operation_asked_for() {
    let Some((_dir, _img, fs)) = fresh("blocks.img", 64) else {
        return;
    };
    let heard = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = std::sync::Arc::clone(&heard);
    fs.on_blocks_changed(Box::new(move |inodes| {
        sink.lock().unwrap().extend_from_slice(inodes);
    }));
    let c = Creds::ROOT;
    let sparse = fs.create(ROOT_INO, b"sparse", 0o100644, 0, c).unwrap();
    let dense = fs.create(ROOT_INO, b"dense", 0o100644, 0, c).unwrap();
    for k in 0..10u64 {
        fs.write(sparse.ino, k * 8192, &[b'x'; 4096]).unwrap();
    }
    fs.write(dense.ino, 0, &vec![b'y'; 40960]).unwrap();
    assert_eq!(fs.getattr(sparse.ino).unwrap().blocks, 80);
    fs.fsync(sparse.ino, false).unwrap();
    fs.fsync(dense.ino, false).unwrap();
    assert_eq!(fs.getattr(sparse.ino).unwrap().blocks, 88);
    assert_eq!(fs.getattr(dense.ino).unwrap().blocks, 80);
    assert_eq!(*heard.lock().unwrap(), vec![sparse.ino]);
    heard.lock().unwrap().clear();
    fs.setxattr(dense.ino, b"user.big", &[b'v'; 2000], XattrSetMode::Any)
        .unwrap();
    fs.setxattr(dense.ino, b"user.small", b"v", XattrSetMode::Any)
        .unwrap();
    fs.removexattr(dense.ino, b"user.big").unwrap();
    assert_eq!(fs.getattr(dense.ino).unwrap().blocks, 80);
    assert_eq!(*heard.lock().unwrap(), vec![dense.ino, dense.ino]);
    fs.unmount().unwrap();
}
