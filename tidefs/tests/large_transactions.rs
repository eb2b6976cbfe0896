//! Goal: an operation whose metadata changes do not fit one journal transaction is carried by
//! several, as ext4 restarts its handle: a fallocate over more block groups than a small
//! journal holds bitmaps for succeeds (it did fail, and the commit then put the file system in
//! its error state, read-only until remounted), commits more than once, allocates the whole
//! range, and leaves an image `e2fsck -fn` finds clean.
//! Method: the real `mkfs.ext4` with 1 KiB blocks, 512 blocks per group (2 049 groups in
//! 1 GiB) and the smallest journal (1 024 blocks: a transaction may carry about 250), then a
//! 900 MiB fallocate through the library: about 1 800 groups, a bitmap and a descriptor block
//! each.

mod common;

use tidefs::fs::{Creds, Fs, MountOptions, ROOT_INO};

#[test]
fn a_fallocate_larger_than_one_transaction_is_committed_in_parts() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkfs_raw(
        dir.path(),
        "groups.img",
        1024,
        &[
            "-b",
            "1024",
            "-g",
            "512",
            "-O",
            "^resize_inode,metadata_csum,64bit",
            "-J",
            "size=1",
        ],
    );
    let fs = Fs::open(&img, &MountOptions::default()).unwrap();
    let f = fs
        .create(ROOT_INO, b"big", 0o100644, 0, Creds::ROOT)
        .unwrap();
    let len: u64 = 900 << 20;
    let commits_before = fs.stats().commits;
    fs.fallocate(f.ino, 0, len, false).unwrap();
    fs.fsync(f.ino, false).unwrap();
    let attr = fs.getattr(f.ino).unwrap();
    assert_eq!(attr.size, len);
    // The whole range, plus the extent-tree blocks (counted in st_blocks too).
    assert!(
        (len..len + (64 << 10)).contains(&(attr.blocks * 512)),
        "{} bytes allocated for {len}",
        attr.blocks * 512
    );
    let commits = fs.stats().commits - commits_before;
    assert!(
        commits > 2,
        "{commits} commits carried about 1 800 groups' bitmaps"
    );
    fs.unmount().unwrap();
    drop(fs);
    common::assert_fsck_clean(&img);
    // What was allocated stays allocated after a remount.
    let fs = Fs::open(&img, &MountOptions::default()).unwrap();
    let ino = fs.lookup(ROOT_INO, b"big").unwrap().ino;
    assert_eq!(fs.getattr(ino).unwrap().blocks, attr.blocks);
    fs.unmount().unwrap();
}
