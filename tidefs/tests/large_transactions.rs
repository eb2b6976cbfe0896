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

use std::path::{Path, PathBuf};

use tidefs::fs::{Creds, DataMode, Fs, MountOptions, SetAttr, ROOT_INO};

#[test]
fn a_fallocate_larger_than_one_transaction_is_committed_in_parts() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = groups_image(dir.path());
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

/// Goal: freeing blocks over more groups than one transaction carries the bitmaps of goes in
/// steps, each committed, wherever a free happens: a truncate (`setattr`), the unlink of a
/// file nobody holds, the last release of an unlinked file, and the orphan list at the mount
/// after a crash (which refused to mount such an image: "transaction larger than the
/// journal"). Each leaves the free count where it was before the file, and a clean image.
/// Method: the image of the test above; a 900 MiB file made with fallocate, freed each way in
/// turn; the crash case holds the file open, unlinks it, makes the unlink durable with a
/// directory fsync, crashes, and mounts again.
#[test]
fn frees_larger_than_one_transaction_are_committed_in_parts() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = groups_image(dir.path());
    let len: u64 = 900 << 20;
    let fs = Fs::open(&img, &MountOptions::default()).unwrap();
    let free_before = fs.statfs().unwrap().blocks_free;
    let big = |fs: &Fs, name: &[u8]| {
        let f = fs.create(ROOT_INO, name, 0o100644, 0, Creds::ROOT).unwrap();
        fs.fallocate(f.ino, 0, len, false).unwrap();
        fs.fsync(f.ino, false).unwrap();
        f.ino
    };
    let settled = |fs: &Fs, what: &str| {
        fs.sync().unwrap();
        let free = fs.statfs().unwrap().blocks_free;
        // The 1 MiB kept by the truncate, and an extent block or two.
        assert!(
            free + 1024 + 8 >= free_before,
            "{what}: {free} blocks free, {free_before} before the file"
        );
    };

    // A truncate to 1 MiB.
    let a = big(&fs, b"a");
    let commits = fs.stats().commits;
    let cut = SetAttr {
        size: Some(1 << 20),
        ..SetAttr::default()
    };
    assert_eq!(fs.setattr(a, &cut).unwrap().size, 1 << 20);
    assert!(
        fs.stats().commits - commits > 2,
        "the cut took several commits"
    );
    settled(&fs, "truncate");
    fs.unlink(ROOT_INO, b"a").unwrap();

    // A cut inside the last block of a file with a large allocation past its end
    // (FALLOC_FL_KEEP_SIZE), which a truncate frees too.
    let e = fs.create(ROOT_INO, b"e", 0o100644, 0, Creds::ROOT).unwrap();
    fs.write(e.ino, 0, &[7u8; 5000]).unwrap();
    fs.fallocate(e.ino, 0, len, true).unwrap();
    fs.fsync(e.ino, false).unwrap();
    let cut = SetAttr {
        size: Some(4097),
        ..SetAttr::default()
    };
    assert_eq!(fs.setattr(e.ino, &cut).unwrap().size, 4097);
    fs.unlink(ROOT_INO, b"e").unwrap();
    settled(&fs, "cut inside the last block");

    // The unlink of a file nobody holds.
    big(&fs, b"b");
    fs.unlink(ROOT_INO, b"b").unwrap();
    settled(&fs, "unlink");

    // The last release of a file unlinked while held.
    let c = big(&fs, b"c");
    fs.open_inode(c).unwrap();
    fs.unlink(ROOT_INO, b"c").unwrap();
    fs.forget_inode(c, 1).unwrap();
    settled(&fs, "release");

    // The orphan list after a crash.
    let d = big(&fs, b"d");
    fs.open_inode(d).unwrap();
    fs.unlink(ROOT_INO, b"d").unwrap();
    fs.fsync(ROOT_INO, false).unwrap();
    fs.crash();
    drop(fs);
    let fs = Fs::open(&img, &MountOptions::default()).expect("mount after the crash");
    settled(&fs, "orphan list");
    fs.unmount().unwrap();
    drop(fs);
    common::assert_fsck_clean(&img);

    // A truncate in `lightweight` mode, whose frees reach the bitmaps a commit late.
    let light = MountOptions {
        data_mode: DataMode::Lightweight,
        ..MountOptions::default()
    };
    let fs = Fs::open(&img, &light).unwrap();
    let f = big(&fs, b"light");
    assert_eq!(fs.setattr(f, &cut_to_1m()).unwrap().size, 1 << 20);
    fs.unlink(ROOT_INO, b"light").unwrap();
    settled(&fs, "lightweight truncate and unlink");
    fs.unmount().unwrap();
    drop(fs);
    common::assert_fsck_clean(&img);
}

/// Goal: a hole punched over more groups than one transaction carries the bitmaps of is
/// punched in steps from its end, each committed, and a zero-range over that many holes
/// allocates them in parts before zeroing (both failed their commit and put the file system in
/// its error state); the partial blocks at the edges are zeroed only inside the range, the
/// size stays, the blocks come back to the free count, and the image stays clean — in
/// `ordered` and in `lightweight` mode, whose frees reach the bitmaps a commit late.
/// Method: the image of the tests above; a 900 MiB fallocated file with data at both ends,
/// then a punch of all but 4 000 bytes at the start and 1 000 at the end, then a zero-range
/// over the whole file.
#[test]
fn punch_hole_and_zero_range_larger_than_one_transaction_go_in_parts() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = groups_image(dir.path());
    let len: u64 = 900 << 20;
    for mode in [DataMode::Ordered, DataMode::Lightweight] {
        let opts = MountOptions {
            data_mode: mode,
            ..MountOptions::default()
        };
        let fs = Fs::open(&img, &opts).unwrap();
        let free_before = fs.statfs().unwrap().blocks_free;
        let f = fs.create(ROOT_INO, b"p", 0o100644, 0, Creds::ROOT).unwrap();
        fs.fallocate(f.ino, 0, len, false).unwrap();
        fs.write(f.ino, 0, &[1u8; 5000]).unwrap();
        fs.write(f.ino, len - 3000, &[2u8; 3000]).unwrap();
        fs.fsync(f.ino, false).unwrap();

        let commits = fs.stats().commits;
        fs.punch_hole(f.ino, 4000, len - 5000).unwrap();
        assert!(
            fs.stats().commits - commits > 2,
            "{mode:?}: the punch took several commits"
        );
        let mut head = vec![1u8; 4000];
        head.resize(5000, 0);
        assert_eq!(fs.read(f.ino, 0, 5000).unwrap(), head, "{mode:?}");
        let mut tail = vec![0u8; 2000];
        tail.resize(3000, 2);
        assert_eq!(fs.read(f.ino, len - 3000, 3000).unwrap(), tail, "{mode:?}");
        let attr = fs.getattr(f.ino).unwrap();
        assert_eq!(attr.size, len);
        // The two edge blocks (1 KiB each) and the first block's neighbours up to 4 000
        // bytes, and an extent block or two.
        assert!(
            attr.blocks * 512 <= 16 << 10,
            "{mode:?}: {} blocks",
            attr.blocks
        );
        fs.sync().unwrap();
        fs.sync().unwrap();
        let free = fs.statfs().unwrap().blocks_free;
        assert!(
            free + 16 >= free_before,
            "{mode:?}: {free} blocks free after the punch, {free_before} before the file"
        );

        let commits = fs.stats().commits;
        fs.zero_range(f.ino, 0, len, true).unwrap();
        assert!(
            fs.stats().commits - commits > 2,
            "{mode:?}: the zero-range took several commits"
        );
        assert_eq!(fs.read(f.ino, 0, 5000).unwrap(), vec![0u8; 5000]);
        assert_eq!(fs.read(f.ino, len - 3000, 3000).unwrap(), vec![0u8; 3000]);
        let attr = fs.getattr(f.ino).unwrap();
        assert_eq!(attr.size, len);
        assert!(attr.blocks * 512 >= len, "{mode:?}: {} blocks", attr.blocks);
        fs.unlink(ROOT_INO, b"p").unwrap();
        fs.unmount().unwrap();
        drop(fs);
        common::assert_fsck_clean(&img);
    }
}

/// Goal: a write in a data-journaling mode whose blocks are more than one transaction carries
/// is journaled in parts, each its own transaction, as ext4's `data=journal` takes a handle per
/// page (it failed its commit with "transaction larger than the journal": EINVAL for the write,
/// then the file system read-only); every byte is there after an fsync, a remount and a crash
/// after the fsync, and the image stays clean.
/// Method: the image of the tests above (a transaction carries about 250 blocks of 1 KiB); one
/// 8 MiB write through the library in `journal` and in `wasteless` mode, fsync, then a crash.
#[test]
fn a_journaled_write_larger_than_one_transaction_goes_in_parts() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = groups_image(dir.path());
    let data: Vec<u8> = (0..8u32 << 20).map(|i| (i % 251) as u8).collect();
    for mode in [DataMode::Journal, DataMode::Wasteless] {
        let opts = MountOptions {
            data_mode: mode,
            ..MountOptions::default()
        };
        let name = format!("{mode:?}");
        let fs = Fs::open(&img, &opts).unwrap();
        let f = fs
            .create(ROOT_INO, name.as_bytes(), 0o100644, 0, Creds::ROOT)
            .unwrap();
        let commits = fs.stats().commits;
        assert_eq!(fs.write(f.ino, 0, &data).unwrap() as usize, data.len());
        fs.fsync(f.ino, false).unwrap();
        assert!(
            fs.stats().commits - commits > 8,
            "{name}: 8 192 journaled blocks took {} commits",
            fs.stats().commits - commits
        );
        fs.crash();
        drop(fs);
        let fs = Fs::open(&img, &opts).expect("mount after the crash");
        let ino = fs.lookup(ROOT_INO, name.as_bytes()).unwrap().ino;
        assert_eq!(fs.getattr(ino).unwrap().size, data.len() as u64, "{name}");
        let mut back = Vec::new();
        while back.len() < data.len() {
            back.extend(fs.read(ino, back.len() as u64, 1 << 20).unwrap());
        }
        assert!(back == data, "{name}: the data differs after the crash");
        fs.unmount().unwrap();
        drop(fs);
        common::assert_fsck_clean(&img);
    }

    // A directory set to `journal` on an `ordered` mount: the first large write after a
    // mount comes before anything loaded the directory's mode, and must still go in parts.
    let fs = Fs::open(&img, &MountOptions::default()).unwrap();
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, Creds::ROOT).unwrap().ino;
    fs.set_journal_mode(d, Some(DataMode::Journal)).unwrap();
    let f = fs.create(d, b"f", 0o100644, 0, Creds::ROOT).unwrap().ino;
    fs.unmount().unwrap();
    drop(fs);
    let fs = Fs::open(&img, &MountOptions::default()).unwrap();
    assert_eq!(fs.write(f, 0, &data).unwrap() as usize, data.len());
    fs.fsync(f, false).unwrap();
    fs.crash();
    drop(fs);
    let fs = Fs::open(&img, &MountOptions::default()).unwrap();
    assert_eq!(fs.getattr(f).unwrap().size, data.len() as u64);
    assert!(fs.read(f, 7 << 20, 1 << 20).unwrap() == data[7 << 20..]);
    fs.unmount().unwrap();
    drop(fs);
    common::assert_fsck_clean(&img);
}

/// Goal: deleting a file whose data the log still holds (journal mode) revokes every such
/// block in one operation, which fits the log (revoke records are packed hundreds to a
/// block) and must succeed; counted a block per revoke against a quarter of the log, the
/// unlink was refused with EINVAL. Method: the image of the tests above, `journal` mode,
/// checkpoints held so the log keeps the data; 700 KiB written and fsynced, then unlinked;
/// the space comes back and the image is clean.
#[test]
fn deleting_a_file_the_log_holds_revokes_it_in_one_operation() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = groups_image(dir.path());
    let opts = MountOptions {
        data_mode: DataMode::Journal,
        deterministic_writes: true,
        ..MountOptions::default()
    };
    let fs = Fs::open(&img, &opts).unwrap();
    let free_before = fs.statfs().unwrap().blocks_free;
    let f = fs.create(ROOT_INO, b"j", 0o100644, 0, Creds::ROOT).unwrap();
    fs.write(f.ino, 0, &vec![5u8; 700 << 10]).unwrap();
    fs.fsync(f.ino, false).unwrap();
    fs.unlink(ROOT_INO, b"j")
        .expect("the unlink of a file the log holds");
    fs.sync().unwrap();
    fs.sync().unwrap();
    let free = fs.statfs().unwrap().blocks_free;
    assert!(free + 8 >= free_before, "{free} free, {free_before} before");
    fs.unmount().unwrap();
    drop(fs);
    common::assert_fsck_clean(&img);
}

fn cut_to_1m() -> SetAttr {
    SetAttr {
        size: Some(1 << 20),
        ..SetAttr::default()
    }
}

/// 1 GiB with 1 KiB blocks and 512 blocks per group (2 049 groups) and the smallest journal
/// (1 024 blocks: a transaction may carry about 250), made by the real `mkfs.ext4`.
fn groups_image(dir: &Path) -> PathBuf {
    common::mkfs_raw(
        dir,
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
    )
}
