//! Goal: the namespace operations fetch the blocks they will change before their first change
//! (docs/DESIGN.md §4.1), so that one that must read a block from the device stops for it
//! with nothing to take back: a create's new inode-table block, a new directory's block
//! bitmap, the bitmaps an unlink, rmdir or rename-over frees into, and the index of a
//! directory moved to another parent (its `..` entry changes).
//!
//! Method: an image made by the real `mkfs.ext4` with several block groups and inode-table
//! blocks that were never read, mounted in memory; each phase starts with every cache
//! dropped, runs creates, mkdirs, moves and exchanges of directories across parents,
//! rename-overs, unlinks and rmdirs,
//! and the counters must show operations that stopped for device reads (the test reaches the
//! cold paths) and none that stopped after changing something. The image is then checked
//! with the real `e2fsck -fn`.

mod common;

use std::sync::Arc;

use tidefs::dev::MemDev;
use tidefs::fs::{Creds, Fs, MountOptions, RenameFlags, ROOT_INO};

#[test]
fn namespace_operations_stop_for_reads_only_before_their_first_change() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // 4 096 blocks per group: eight groups, so new directories spread to cold groups.
    let image = common::mkimage(dir.path(), "t.img", 128, &["-g", "4096", "-N", "8192"]);
    let mem = Arc::new(MemDev::from_bytes(std::fs::read(&image).unwrap()));
    let fs = Fs::open_devices(mem.clone(), None, &MountOptions::default()).unwrap();
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
        s.stops_after_change, 0,
        "operations stopped for a read after their first change ({} of {} stops)",
        s.stops_after_change, s.deferred_reads
    );
    fs.unmount().unwrap();
    common::assert_mem_fsck_clean(&mem);
}
