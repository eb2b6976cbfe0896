//! Goal: images tidefs writes are ext4 to the real tools and to the kernel, and images the
//! kernel writes are read back by tidefs exactly. Method:
//! (a) tidefs fills an mkfs.ext4 image through the library with every kind of object and
//!     operation (thousands of files, a deep tree, renames of every flavour, hard links,
//!     symlinks, device nodes, fifos, sockets, xattrs in the inode and in a block, a sparse file
//!     with data at 1 TiB, large random files, a big directory, truncates, fallocate, unlinks),
//!     unmounts, and `e2fsck -fn` must be clean;
//! (b) the kernel's ext4 (root and loop devices needed: outside CI this part is skipped without
//!     them, in CI it fails) mounts that image read-only and a walk of
//!     it (names, types, sizes, modes, owners, link counts, times to the nanosecond, block
//!     counts, symlink targets, device numbers, xattrs, content hashes) must equal a walk through
//!     the tidefs library;
//! (c) the kernel populates a fresh image (with a directory big enough to get an htree), tidefs
//!     must read it all back identically, then modify it (the htree directory included), and
//!     `e2fsck -fn` and the kernel must still agree.
//! Sizes grow with `TIDEFS_LONG=1`.

mod common;

use std::path::Path;

use tidefs::format::ext4::inode::makedev;
use tidefs::fs::{
    Creds, Fs, MountOptions, RenameFlags, SetAttr, SetTime, Timestamp, XattrSetMode, ROOT_INO,
};
use tidefs::FsError;

const USER: Creds = Creds {
    uid: 1000,
    gid: 1000,
};

fn ro() -> MountOptions {
    MountOptions {
        read_only: true,
        ..MountOptions::default()
    }
}

struct Scale {
    files: usize,
    big_dir: usize,
    depth: usize,
}

fn scale() -> Scale {
    if common::long_run() {
        Scale {
            files: 20_000,
            big_dir: 100_000,
            depth: 300,
        }
    } else {
        Scale {
            files: 3000,
            big_dir: 20_000,
            depth: 100,
        }
    }
}

fn mkdir_p(fs: &Fs, parent: u64, name: &str) -> u64 {
    fs.mkdir(parent, name.as_bytes(), 0o755, Creds::ROOT)
        .unwrap()
        .ino
}

fn new_file(fs: &Fs, parent: u64, name: &str, data: &[u8], creds: Creds) -> u64 {
    let a = fs
        .create(parent, name.as_bytes(), 0o100644, 0, creds)
        .unwrap();
    if !data.is_empty() {
        assert_eq!(fs.write(a.ino, 0, data).unwrap() as usize, data.len());
    }
    a.ino
}

fn at(sec: i64, nsec: u32) -> SetTime {
    SetTime::At(Timestamp { sec, nsec })
}

/// Workload (a): every kind of object and operation, through the library.
fn populate_with_tidefs(fs: &Fs, s: &Scale) {
    let c = Creds::ROOT;
    let mut rng = common::Rng(0xDEC0_DE00_1234_5678);

    // Thousands of files over 40 directories, of varied sizes, some owned by a user.
    let top = mkdir_p(fs, ROOT_INO, "tree");
    let dirs: Vec<u64> = (0..40)
        .map(|i| mkdir_p(fs, top, &format!("d{i:02}")))
        .collect();
    let mut names = Vec::new();
    for i in 0..s.files {
        let d = dirs[i % dirs.len()];
        let size = match i % 10 {
            0 => 0,
            1..=6 => rng.below(4096) as usize,
            7 | 8 => rng.below(64 << 10) as usize,
            _ => rng.below(300 << 10) as usize,
        };
        let data = rng.bytes(size);
        let name = format!("file-{i:06}");
        new_file(fs, d, &name, &data, if i % 7 == 0 { USER } else { c });
        names.push((d, name));
    }
    // A file written at scattered offsets, with holes in between.
    let holes = new_file(fs, top, "holes", b"", c);
    for k in 0..20u64 {
        fs.write(holes, k * 1_000_003, &rng.bytes(5000)).unwrap();
    }

    // A deep tree with a file at the bottom.
    let mut d = mkdir_p(fs, ROOT_INO, "deep");
    for i in 0..s.depth {
        d = mkdir_p(fs, d, &format!("level{i}"));
    }
    new_file(fs, d, "bottom", b"at the bottom of a deep tree", c);

    // Renames: within a directory, across directories, over an existing file, a directory
    // across directories, RENAME_NOREPLACE, RENAME_EXCHANGE (file/file and file/dir).
    let r = mkdir_p(fs, ROOT_INO, "ren");
    let (ra, rb) = (mkdir_p(fs, r, "a"), mkdir_p(fs, r, "b"));
    new_file(fs, ra, "one", b"one", c);
    new_file(fs, ra, "two", b"two", c);
    new_file(fs, rb, "victim", b"victim", c);
    new_file(fs, rb, "x1", b"x1-content", c);
    new_file(fs, ra, "x2", b"x2-content", c);
    fs.rename(ra, b"one", ra, b"uno", RenameFlags::default())
        .unwrap();
    fs.rename(ra, b"two", rb, b"dos", RenameFlags::default())
        .unwrap();
    fs.rename(ra, b"uno", rb, b"victim", RenameFlags::default())
        .unwrap();
    let sub = mkdir_p(fs, ra, "subdir");
    new_file(fs, sub, "inside", b"inside", c);
    fs.rename(ra, b"subdir", rb, b"moved-subdir", RenameFlags::default())
        .unwrap();
    let nr = RenameFlags {
        noreplace: true,
        ..RenameFlags::default()
    };
    assert!(matches!(
        fs.rename(rb, b"dos", rb, b"victim", nr),
        Err(FsError::Exists)
    ));
    let ex = RenameFlags {
        exchange: true,
        ..RenameFlags::default()
    };
    fs.rename(rb, b"x1", ra, b"x2", ex).unwrap();
    fs.rename(rb, b"moved-subdir", ra, b"x2", ex).unwrap();
    // Renames of a few thousand tree files across directories, some over others.
    for (i, (d, name)) in names.iter_mut().enumerate().filter(|(i, _)| i % 5 == 1) {
        let to = dirs[(i * 7 + 3) % dirs.len()];
        let new = format!("renamed-{i:06}");
        fs.rename(
            *d,
            name.as_bytes(),
            to,
            new.as_bytes(),
            RenameFlags::default(),
        )
        .unwrap();
        *d = to;
        *name = new;
    }
    for k in (0..names.len().saturating_sub(40)).step_by(97) {
        let (sd, sn) = names[k].clone();
        let (td, tn) = names[k + 20].clone();
        if (sd, &sn) != (td, &tn) {
            fs.rename(sd, sn.as_bytes(), td, tn.as_bytes(), RenameFlags::default())
                .unwrap();
            names[k].1 = String::new();
        }
    }

    // Hard links: one file with links in several directories, one link then removed.
    let hl = mkdir_p(fs, ROOT_INO, "links");
    let target = new_file(fs, hl, "target", b"linked content", c);
    for (i, d) in dirs.iter().take(5).enumerate() {
        fs.link(target, *d, format!("link{i}").as_bytes()).unwrap();
    }
    fs.unlink(dirs[4], b"link4").unwrap();
    assert_eq!(fs.getattr(target).unwrap().nlink, 5);

    // Symlinks: short (in the inode), long (in a block), longest (block size - 1), dangling.
    fs.symlink(hl, b"short", b"target", c).unwrap();
    fs.symlink(hl, b"long", "../tree/".repeat(20).as_bytes(), c)
        .unwrap();
    let longest = fs.block_size() as usize - 1;
    fs.symlink(hl, b"longest", &vec![b'p'; longest], c).unwrap();
    fs.symlink(hl, b"dangling", b"/nowhere/at/all", USER)
        .unwrap();

    // Device nodes, fifo, socket.
    let dev = mkdir_p(fs, ROOT_INO, "dev");
    fs.create(dev, b"null", 0o020666, makedev(1, 3), c).unwrap();
    fs.create(dev, b"sda1", 0o060660, makedev(8, 1), c).unwrap();
    fs.create(dev, b"bigdev", 0o020600, makedev(300, 70000), c)
        .unwrap();
    fs.create(dev, b"fifo", 0o010644, 0, USER).unwrap();
    fs.create(dev, b"sock", 0o140755, 0, c).unwrap();

    // Xattrs: user/trusted/security, small ones in the inode, large ones in a block, on a
    // file, a directory and a symlink; one replaced, one removed.
    let xd = mkdir_p(fs, ROOT_INO, "xattrs");
    let xf = new_file(fs, xd, "f", b"has xattrs", c);
    fs.setxattr(xf, b"user.small", b"v", XattrSetMode::Create)
        .unwrap();
    fs.setxattr(xf, b"trusted.t", b"trusted value", XattrSetMode::Create)
        .unwrap();
    fs.setxattr(xf, b"security.s", b"security value", XattrSetMode::Create)
        .unwrap();
    let large = fs.block_size() as usize * 6 / 10;
    fs.setxattr(xf, b"user.large", &rng.bytes(large), XattrSetMode::Create)
        .unwrap();
    // Larger than an xattr block (no ea_inode feature): NoSpace, as the kernel's ENOSPC.
    let too_big = vec![1u8; fs.block_size() as usize + 1];
    assert!(matches!(
        fs.setxattr(xf, b"user.huge", &too_big, XattrSetMode::Create),
        Err(FsError::NoSpace | FsError::Range)
    ));
    fs.setxattr(xf, b"user.small", b"replaced", XattrSetMode::Replace)
        .unwrap();
    let xg = new_file(fs, xd, "only-in-inode", b"", c);
    fs.setxattr(xg, b"user.a", b"1", XattrSetMode::Create)
        .unwrap();
    let xh = new_file(fs, xd, "many", b"", c);
    for i in 0..30 {
        fs.setxattr(
            xh,
            format!("user.attr{i:02}").as_bytes(),
            format!("value {i}").as_bytes(),
            XattrSetMode::Any,
        )
        .unwrap();
    }
    fs.removexattr(xh, b"user.attr07").unwrap();
    fs.setxattr(xd, b"user.on-dir", b"dir value", XattrSetMode::Create)
        .unwrap();
    let sl = fs.symlink(xd, b"link", b"f", c).unwrap();
    fs.setxattr(
        sl.ino,
        b"trusted.on-link",
        b"link value",
        XattrSetMode::Create,
    )
    .unwrap();

    // Sparse file with data at 0 and at 1 TiB; large files of random content.
    let big = mkdir_p(fs, ROOT_INO, "big");
    let sp = new_file(fs, big, "sparse", b"start", c);
    fs.write(sp, 1 << 40, &rng.bytes(8192)).unwrap();
    for (i, mib) in [3usize, 5, 7].iter().enumerate() {
        let f = new_file(fs, big, &format!("random{i}"), b"", c);
        let data = rng.bytes(mib << 20);
        for (k, ch) in data.chunks(1 << 20).enumerate() {
            assert_eq!(
                fs.write(f, (k << 20) as u64, ch).unwrap() as usize,
                ch.len()
            );
        }
    }

    // Truncates (shrink inside a block, to zero, grow) and fallocate (mode 0 and KEEP_SIZE).
    let t = mkdir_p(fs, ROOT_INO, "trunc");
    let shrink = new_file(fs, t, "shrink", &rng.bytes(100_000), c);
    fs.setattr(
        shrink,
        &SetAttr {
            size: Some(5000),
            ..SetAttr::default()
        },
    )
    .unwrap();
    let zero = new_file(fs, t, "zero", &rng.bytes(50_000), c);
    fs.setattr(
        zero,
        &SetAttr {
            size: Some(0),
            ..SetAttr::default()
        },
    )
    .unwrap();
    let grow = new_file(fs, t, "grow", b"grows", c);
    fs.setattr(
        grow,
        &SetAttr {
            size: Some(3 << 20),
            ..SetAttr::default()
        },
    )
    .unwrap();
    let fa = new_file(fs, t, "falloc", b"", c);
    fs.fallocate(fa, 0, 2 << 20, false).unwrap();
    fs.write(fa, 4096, b"written inside an allocated range")
        .unwrap();
    let fk = new_file(fs, t, "falloc-keep", b"short", c);
    fs.fallocate(fk, 0, 1 << 20, true).unwrap();
    assert_eq!(fs.getattr(fk).unwrap().size, 5);

    // Modes, owners, times with nanoseconds.
    let m = mkdir_p(fs, ROOT_INO, "modes");
    let suid = new_file(fs, m, "suid", b"#!/bin/true\n", c);
    fs.setattr(
        suid,
        &SetAttr {
            mode: Some(0o4755),
            ..SetAttr::default()
        },
    )
    .unwrap();
    let sticky = mkdir_p(fs, m, "sticky");
    fs.setattr(
        sticky,
        &SetAttr {
            mode: Some(0o1777),
            ..SetAttr::default()
        },
    )
    .unwrap();
    let owned = new_file(fs, m, "owned", b"owned", c);
    fs.setattr(
        owned,
        &SetAttr {
            uid: Some(4242),
            gid: Some(70000),
            mode: Some(0o640),
            ..SetAttr::default()
        },
    )
    .unwrap();
    let timed = new_file(fs, m, "timed", b"timed", c);
    fs.setattr(
        timed,
        &SetAttr {
            atime: Some(at(1_000_000_000, 123_456_789)),
            mtime: Some(at(1_234_567_890, 987_654_321)),
            ..SetAttr::default()
        },
    )
    .unwrap();
    let old = new_file(fs, m, "pre-1970", b"", c);
    fs.setattr(
        old,
        &SetAttr {
            mtime: Some(at(-86_400, 5)),
            ..SetAttr::default()
        },
    )
    .unwrap();
    let future = new_file(fs, m, "post-2038", b"", c);
    fs.setattr(
        future,
        &SetAttr {
            mtime: Some(at(4_000_000_000, 999_999_999)),
            ..SetAttr::default()
        },
    )
    .unwrap();

    // A big directory (its entries spread over many blocks), then some of them removed.
    let bd = mkdir_p(fs, ROOT_INO, "bigdir");
    for i in 0..s.big_dir {
        fs.create(
            bd,
            format!("entry-with-a-longish-name-{i:07}").as_bytes(),
            0o100644,
            0,
            c,
        )
        .unwrap();
    }
    for i in (0..s.big_dir).step_by(10) {
        fs.unlink(bd, format!("entry-with-a-longish-name-{i:07}").as_bytes())
            .unwrap();
    }

    // Unlinks and rmdirs: a third of the tree files, and some emptied directories.
    for (i, (d, name)) in names.iter().enumerate() {
        if i % 3 == 0 && !name.is_empty() {
            fs.unlink(*d, name.as_bytes()).unwrap();
        }
    }
    let gone = mkdir_p(fs, ROOT_INO, "gone");
    new_file(fs, gone, "f", b"x", c);
    fs.unlink(gone, b"f").unwrap();
    fs.rmdir(ROOT_INO, b"gone").unwrap();
    assert!(matches!(
        fs.rmdir(ROOT_INO, b"tree"),
        Err(FsError::NotEmpty)
    ));
}

/// Runs workload (a) on an image made with `extra` mkfs options, then checks it with e2fsck,
/// a tidefs remount and (when possible) the kernel.
fn fill_and_compare(s: &Scale, size_mb: u64, extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let inodes = (s.files + s.big_dir + s.depth + 1000).to_string();
    let mut args = vec!["-N", inodes.as_str()];
    args.extend_from_slice(extra);
    let img = common::mkimage(dir.path(), "a.img", size_mb, &args);
    let fs = Fs::open(&img, &MountOptions::default()).unwrap();
    populate_with_tidefs(&fs, s);
    let before_unmount = common::walk_lib(&fs, true);
    fs.unmount().unwrap();
    drop(fs);
    common::assert_fsck_clean(&img);

    // Remount through tidefs: the same tree.
    let fs = Fs::open(&img, &ro()).unwrap();
    let lib = common::walk_lib(&fs, true);
    drop(fs);
    common::assert_trees_equal(
        "tidefs before unmount vs after remount",
        &before_unmount,
        &lib,
    );
    assert!(
        lib.len() > s.files / 2 + s.big_dir / 2,
        "walk found only {} objects",
        lib.len()
    );

    // (b) The kernel reads the same tree.
    if !common::can_loop_mount() {
        return;
    }
    let km = common::KernelMount::mount(&img, "ro").expect("the kernel mounts tidefs's image");
    let (mut host, xattrs_ok) = common::walk_host(km.path(), true);
    km.umount();
    let mut lib = lib;
    if !xattrs_ok {
        common::strip_xattrs(&mut lib);
        common::strip_xattrs(&mut host);
    }
    eprintln!(
        "compared {} objects (tidefs) with {} (kernel); xattrs compared: {xattrs_ok}",
        lib.len(),
        host.len()
    );
    common::assert_trees_equal("tidefs walk vs kernel walk", &lib, &host);
    common::assert_fsck_clean(&img);
}

/// Goal: workload (a) on 4 KiB blocks is clean by e2fsck and walks the same through tidefs and the
/// kernel (module doc (a), (b)).
#[test]
fn tidefs_fills_image_and_kernel_reads_it() {
    if common::have_e2fsprogs() {
        fill_and_compare(&scale(), 1024, &[]);
    }
}

/// The same with 1 KiB blocks: many groups, deeper extent trees, smaller directory blocks.
#[test]
fn tidefs_fills_1k_block_image_and_kernel_reads_it() {
    if !common::have_e2fsprogs() {
        return;
    }
    let s = if common::long_run() {
        Scale {
            files: 5000,
            big_dir: 30_000,
            depth: 100,
        }
    } else {
        Scale {
            files: 1000,
            big_dir: 5000,
            depth: 40,
        }
    };
    fill_and_compare(&s, 1024, &["-b", "1024"]);
}

/// Flags of inode at `path` as debugfs prints them.
fn debugfs_flags(img: &Path, path: &str) -> u32 {
    let out = common::run_ok(
        "debugfs",
        &["-R", &format!("stat {path}"), img.to_str().unwrap()],
    );
    let line = out
        .lines()
        .find(|l| l.contains("Flags:"))
        .expect("debugfs stat prints Flags");
    let hex = line
        .split("Flags:")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap();
    u32::from_str_radix(hex.trim_start_matches("0x"), 16).unwrap()
}

const EXT4_INDEX_FL: u32 = 0x1000;

/// Populates a tree through the kernel (std and coreutils on a mounted image).
fn populate_with_kernel(root: &Path, big_dir: usize) {
    use std::io::{Seek, SeekFrom, Write};
    use std::os::unix::fs::{symlink, PermissionsExt};
    let mut rng = common::Rng(0x1234_5678_9ABC_DEF1);
    let big = root.join("big");
    std::fs::create_dir(&big).unwrap();
    for i in 0..big_dir {
        let p = big.join(format!("a-fairly-long-entry-name-to-fill-blocks-{i:07}"));
        let data = if i % 100 == 0 {
            rng.bytes(100 + i % 3000)
        } else {
            Vec::new()
        };
        std::fs::write(p, data).unwrap();
    }
    for d in 0..10 {
        let dd = root.join(format!("dir{d}"));
        std::fs::create_dir(&dd).unwrap();
        for f in 0..60 {
            let size = rng.below(if f % 10 == 0 { 200 << 10 } else { 8 << 10 }) as usize;
            std::fs::write(dd.join(format!("f{f}")), rng.bytes(size)).unwrap();
        }
    }
    let mut deep = root.join("deep");
    for i in 0..50 {
        deep = deep.join(format!("l{i}"));
    }
    std::fs::create_dir_all(&deep).unwrap();
    std::fs::write(deep.join("bottom"), b"bottom").unwrap();
    std::fs::write(root.join("large"), rng.bytes(6 << 20)).unwrap();
    let mut sp = std::fs::File::create(root.join("sparse")).unwrap();
    sp.write_all(b"head").unwrap();
    sp.seek(SeekFrom::Start(1 << 40)).unwrap();
    sp.write_all(&rng.bytes(10_000)).unwrap();
    drop(sp);
    std::fs::write(root.join("linked"), b"linked").unwrap();
    std::fs::hard_link(root.join("linked"), root.join("dir0/hard1")).unwrap();
    std::fs::hard_link(root.join("linked"), root.join("dir1/hard2")).unwrap();
    symlink("linked", root.join("short-link")).unwrap();
    symlink("x".repeat(3000), root.join("long-link")).unwrap();
    common::run_ok(
        "mknod",
        &[root.join("chr").to_str().unwrap(), "c", "1", "3"],
    );
    common::run_ok(
        "mknod",
        &[root.join("blk").to_str().unwrap(), "b", "259", "300000"],
    );
    common::run_ok("mknod", &[root.join("fifo").to_str().unwrap(), "p"]);
    let x = root.join("xattrs");
    std::fs::write(&x, b"x").unwrap();
    let have_py = common::host_setxattr(&x, "user.small", b"small");
    if have_py {
        common::host_setxattr(&x, "trusted.t", b"trusted");
        common::host_setxattr(&x, "security.s", b"sec");
        common::host_setxattr(&x, "user.large", &rng.bytes(3000));
        common::host_setxattr(&big, "user.on-big-dir", b"yes");
    }
    let owned = root.join("owned");
    std::fs::write(&owned, b"owned").unwrap();
    std::os::unix::fs::chown(&owned, Some(1234), Some(5678)).unwrap();
    std::fs::set_permissions(&owned, std::fs::Permissions::from_mode(0o2751)).unwrap();
    let t = std::fs::File::options()
        .write(true)
        .open(root.join("dir2/f1"))
        .unwrap();
    t.set_modified(std::time::UNIX_EPOCH + std::time::Duration::new(1_500_000_000, 123_456_789))
        .unwrap();
}

/// Goal: module doc (c): tidefs reads what the kernel wrote, modifies it, and both still agree.
#[test]
fn kernel_fills_image_and_tidefs_reads_and_modifies_it() {
    if !common::have_e2fsprogs() || !common::can_loop_mount() {
        return;
    }
    let big_dir = if common::long_run() { 60_000 } else { 12_000 };
    let dir = tempfile::tempdir().unwrap();
    let inodes = (big_dir + 5000).to_string();
    let img = common::mkimage(dir.path(), "k.img", 512, &["-N", &inodes]);
    let km = common::KernelMount::mount(&img, "rw").expect("mount rw");
    populate_with_kernel(km.path(), big_dir);
    let (mut host, xattrs_ok) = common::walk_host(km.path(), false);
    km.umount();
    common::assert_fsck_clean(&img);
    assert_ne!(
        debugfs_flags(&img, "/big") & EXT4_INDEX_FL,
        0,
        "the kernel did not build an htree for /big"
    );

    // tidefs reads the kernel's image: the same tree.
    let before = common::file_hash(&img);
    let fs = Fs::open(&img, &ro()).expect("tidefs opens the kernel's image");
    let mut lib = common::walk_lib(&fs, false);
    drop(fs);
    assert_eq!(
        common::file_hash(&img),
        before,
        "a read-only open modified the image"
    );
    if !xattrs_ok {
        common::strip_xattrs(&mut lib);
        common::strip_xattrs(&mut host);
    }
    common::assert_trees_equal(
        "kernel's walk vs tidefs's walk of the kernel's image",
        &host,
        &lib,
    );

    // tidefs modifies the image, the htree directory included: first moved (its `..` is its
    // first change, which rewrites its index) and moved back.
    let fs = Fs::open(&img, &MountOptions::default()).unwrap();
    let bd = fs.lookup(ROOT_INO, b"big").unwrap().ino;
    let d1 = fs.lookup(ROOT_INO, b"dir1").unwrap().ino;
    fs.rename(ROOT_INO, b"big", d1, b"big", RenameFlags::default())
        .unwrap();
    fs.rename(d1, b"big", ROOT_INO, b"big", RenameFlags::default())
        .unwrap();
    for i in 0..300 {
        let a = fs
            .create(
                bd,
                format!("added-by-tidefs-{i}").as_bytes(),
                0o100600,
                0,
                Creds::ROOT,
            )
            .unwrap();
        fs.write(a.ino, 0, format!("tidefs {i}").as_bytes())
            .unwrap();
    }
    for i in (0..big_dir).step_by(37) {
        fs.unlink(
            bd,
            format!("a-fairly-long-entry-name-to-fill-blocks-{i:07}").as_bytes(),
        )
        .unwrap();
    }
    fs.rename(
        bd,
        b"added-by-tidefs-0",
        ROOT_INO,
        b"moved-out",
        RenameFlags::default(),
    )
    .unwrap();
    let d0 = fs.lookup(ROOT_INO, b"dir0").unwrap().ino;
    fs.rename(d0, b"f5", bd, b"moved-in", RenameFlags::default())
        .unwrap();
    let l = fs.lookup(ROOT_INO, b"large").unwrap().ino;
    fs.write(l, 1 << 20, b"overwritten by tidefs").unwrap();
    fs.setattr(
        l,
        &SetAttr {
            size: Some(5 << 20),
            ..SetAttr::default()
        },
    )
    .unwrap();
    for i in 0..big_dir / 2 {
        assert!(
            fs.lookup(
                bd,
                format!("a-fairly-long-entry-name-to-fill-blocks-{:07}", i * 2 + 1).as_bytes()
            )
            .is_ok()
                || (i * 2 + 1) % 37 == 0
        );
    }
    let after_mod = common::walk_lib(&fs, true);
    // Every change reserved its journal space before its first change, and enough (the
    // kernel's htree index of /big among them: docs/DESIGN.md §4.1).
    common::assert_journal_reservations_held(&fs);
    fs.unmount().unwrap();
    drop(fs);
    common::assert_fsck_clean(&img);
    eprintln!(
        "/big flags after tidefs: {:#x}",
        debugfs_flags(&img, "/big")
    );

    // The kernel reads tidefs's changes.
    let km = common::KernelMount::mount(&img, "ro")
        .expect("the kernel mounts the image tidefs modified");
    let (mut host2, xattrs_ok) = common::walk_host(km.path(), true);
    km.umount();
    let mut after_mod = after_mod;
    if !xattrs_ok {
        common::strip_xattrs(&mut after_mod);
        common::strip_xattrs(&mut host2);
    }
    common::assert_trees_equal(
        "tidefs's walk vs kernel's walk after tidefs modified it",
        &after_mod,
        &host2,
    );
    assert!(host2.contains_key(&b"moved-out"[..]) && host2.contains_key(&b"big/moved-in"[..]));

    // And the kernel can still write to it (e.g. add to the directory tidefs changed).
    let km = common::KernelMount::mount(&img, "rw").unwrap();
    for i in 0..500 {
        std::fs::write(km.path().join(format!("big/kernel-again-{i}")), b"k").unwrap();
    }
    km.umount();
    common::assert_fsck_clean(&img);
}

/// Goal: inodes the kernel's ext4 left on the orphan list with their links (it puts a file
/// there while a truncate or an extending write runs, and a crash leaves it there) are
/// finished at mount as the kernel finishes them: their blocks past the size are freed, their
/// data is kept, and they leave the list with no trace in `i_dtime` (which links the list).
/// tidefs used to step over them, so the blocks stayed and `e2fsck -fn` found "in use, but has
/// dtime set" after a clean unmount. One of them holds more than one transaction can free.
/// Method: the real `mkfs.ext4` (1 KiB blocks, 512 per group, smallest journal); three files
/// with data and a preallocation past their end (`FALLOC_FL_KEEP_SIZE`: 1 MiB, 2 MiB, 200 MiB
/// over 400 groups) made through the library; `debugfs` chains them on the orphan list; the
/// kernel mounts a copy read-write (its orphan cleanup is the oracle for the block counts),
/// tidefs mounts the original; both must agree, and `e2fsck -fn` must find the image clean.
#[test]
fn linked_orphans_are_truncated_at_mount_as_the_kernel_does() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkfs_raw(
        dir.path(),
        "orphans.img",
        256,
        &[
            "-b",
            "1024",
            "-g",
            "512",
            "-O",
            "^resize_inode",
            "-J",
            "size=1",
        ],
    );
    // `a` also had its size cut from 12 000 to 10 000 bytes by a truncate the crash stopped
    // before it zeroed the rest of the last block: those bytes must read as zeros once the
    // file grows again.
    let files: [(&str, usize, u64); 3] = [
        ("a", 10_000, 1 << 20),
        ("b", 3, 2 << 20),
        ("c", 5000, 200 << 20),
    ];
    let fs = Fs::open(&img, &MountOptions::default()).unwrap();
    let mut inos = Vec::new();
    for (name, size, prealloc) in files {
        let f = fs
            .create(ROOT_INO, name.as_bytes(), 0o100644, 0, Creds::ROOT)
            .unwrap();
        let written = if name == "a" { 12_000 } else { size };
        fs.write(f.ino, 0, &vec![name.as_bytes()[0]; written])
            .unwrap();
        fs.fallocate(f.ino, 0, prealloc, true).unwrap();
        assert!(fs.getattr(f.ino).unwrap().blocks * 512 >= prealloc);
        inos.push(f.ino);
    }
    fs.unmount().unwrap();
    drop(fs);
    let image = img.to_str().unwrap();
    common::run_ok(
        "debugfs",
        &["-w", "-R", &format!("ssv last_orphan {}", inos[0]), image],
    );
    common::run_ok(
        "debugfs",
        &["-w", "-R", &format!("sif <{}> size 10000", inos[0]), image],
    );
    for (ino, next) in [(inos[0], inos[1]), (inos[1], inos[2])] {
        common::run_ok(
            "debugfs",
            &["-w", "-R", &format!("sif <{ino}> dtime {next}"), image],
        );
    }

    // The kernel's cleanup, on a copy.
    let kernel_blocks = common::can_loop_mount().then(|| {
        let copy = dir.path().join("kernel.img");
        std::fs::copy(&img, &copy).unwrap();
        let km = common::KernelMount::mount(&copy, "rw").expect("kernel mount");
        let blocks: Vec<u64> = files
            .iter()
            .map(|(name, _, _)| {
                use std::os::unix::fs::MetadataExt;
                std::fs::metadata(km.path().join(name)).unwrap().blocks()
            })
            .collect();
        let a = km.path().join("a");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&a)
            .unwrap()
            .set_len(12_288)
            .unwrap();
        assert_eq!(
            std::fs::read(&a).unwrap()[10_000..],
            [0u8; 2288],
            "the kernel's own cleanup left the cut bytes"
        );
        km.umount();
        blocks
    });

    let fs = Fs::open(&img, &MountOptions::default()).unwrap();
    for (k, (name, size, _)) in files.iter().enumerate() {
        let attr = fs.getattr(inos[k]).unwrap();
        assert_eq!(attr.size, *size as u64, "{name}");
        // The data blocks and no more (1 KiB blocks; the tree fits in the inode again).
        let data_sectors = (*size as u64).div_ceil(1024) * 2;
        assert_eq!(attr.blocks, data_sectors, "{name}");
        if let Some(kernel) = &kernel_blocks {
            // The kernel freed the same blocks past the end, but may keep the file's last
            // extent-tree block (up to two of 1 KiB) where tidefs folds the tree back.
            assert!(
                (data_sectors..=data_sectors + 4).contains(&kernel[k]),
                "{name}: the kernel left {} sectors, tidefs {data_sectors}",
                kernel[k]
            );
        }
        let data = fs.read(inos[k], 0, *size as u32).unwrap();
        assert_eq!(data, vec![name.as_bytes()[0]; *size], "{name}");
    }
    let grow = SetAttr {
        size: Some(12_288),
        ..SetAttr::default()
    };
    fs.setattr(inos[0], &grow).unwrap();
    assert_eq!(
        fs.read(inos[0], 10_000, 2288).unwrap(),
        vec![0u8; 2288],
        "the bytes cut by the interrupted truncate came back"
    );
    fs.unmount().unwrap();
    drop(fs);
    common::assert_fsck_clean(&img);
}
