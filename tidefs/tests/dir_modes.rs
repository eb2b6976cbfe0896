//! Goal: per-directory journaling modes (docs/DESIGN.md §3.2) work through the library: a
//! directory's mode is set and read through the API and through the `user.tidefs.journal`
//! attribute; new directories inherit it, new files obey it, an explicit file mode wins, a rename
//! or a hard link moves a file under the mode of the directory that linked it last, a symlink has
//! none; modes survive a remount and a crash; `journal` sets ext4's per-inode data-journaling flag
//! (read back with the real `debugfs`, and with `getfattr`/`lsattr` on the kernel's own ext4
//! mount); the image stays clean by the real `e2fsck`; and each directory's data goes where its own
//! mode sends it, also across a switch.

mod common;

use tidefs::fs::{Creds, DataMode, Fs, MountOptions, XattrSetMode, JOURNAL_MODE_XATTR, ROOT_INO};
use tidefs::FsError;

const J: &[u8] = JOURNAL_MODE_XATTR;

fn mode_of(fs: &Fs, ino: u64) -> (DataMode, bool) {
    let m = fs.journal_mode(ino).unwrap();
    let via_xattr = fs.getxattr(ino, J).unwrap();
    assert_eq!(via_xattr, m.mode.name().as_bytes(), "xattr and API agree");
    (m.mode, m.own)
}

fn opts(mode: DataMode) -> MountOptions {
    MountOptions {
        data_mode: mode,
        ..MountOptions::default()
    }
}

/// `debugfs -R "stat PATH"`'s flags line, as a number.
fn ext4_flags(img: &std::path::Path, path: &str) -> u32 {
    let out = common::run_ok(
        "debugfs",
        &["-R", &format!("stat {path}"), img.to_str().unwrap()],
    );
    let hex = out
        .split("Flags: 0x")
        .nth(1)
        .unwrap_or_else(|| panic!("no flags in debugfs output: {out}"));
    let hex: String = hex.chars().take_while(char::is_ascii_hexdigit).collect();
    u32::from_str_radix(&hex, 16).unwrap()
}

const JOURNAL_DATA_FL: u32 = 0x4000;

/// Goal and method: see the module doc; every rule of the issue on one image, then a remount,
/// e2fsck and debugfs.
#[test]
fn modes_follow_the_inheritance_rename_and_link_rules() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkimage(dir.path(), "modes.img", 64, &[]);
    let fs = Fs::open(&img, &opts(DataMode::Ordered)).unwrap();
    let c = Creds::ROOT;
    // Defaults: no own mode anywhere, everything follows the mount's.
    assert_eq!(mode_of(&fs, ROOT_INO), (DataMode::Ordered, false));
    assert!(fs.listxattr(ROOT_INO).unwrap().is_empty());

    let db = fs.mkdir(ROOT_INO, b"db", 0o755, c).unwrap().ino;
    let scratch = fs.mkdir(ROOT_INO, b"scratch", 0o755, c).unwrap().ino;
    let old = fs.set_journal_mode(db, Some(DataMode::Journal)).unwrap();
    assert_eq!(old, DataMode::Ordered);
    fs.setxattr(scratch, J, b"lightweight", XattrSetMode::Any)
        .unwrap();
    assert_eq!(mode_of(&fs, db), (DataMode::Journal, true));
    assert_eq!(mode_of(&fs, scratch), (DataMode::Lightweight, true));
    assert_eq!(fs.listxattr(db).unwrap(), vec![J.to_vec()]);

    // Bad values and kinds are refused, and change nothing.
    for bad in [&b"fastest"[..], b"selective:0", b"selective:2G", b""] {
        assert!(
            matches!(
                fs.setxattr(db, J, bad, XattrSetMode::Any),
                Err(FsError::Invalid(_))
            ),
            "{bad:?}"
        );
    }
    assert!(matches!(
        fs.setxattr(db, J, b"journal", XattrSetMode::Create),
        Err(FsError::Exists)
    ));
    assert_eq!(mode_of(&fs, db), (DataMode::Journal, true));

    // A new directory inherits; a new file obeys its directory; a symlink has no mode.
    let sub = fs.mkdir(db, b"sub", 0o755, c).unwrap().ino;
    assert_eq!(mode_of(&fs, sub), (DataMode::Journal, true));
    let f = fs.create(db, b"f", 0o100644, 0, c).unwrap().ino;
    assert_eq!(mode_of(&fs, f), (DataMode::Journal, false));
    let l = fs.symlink(db, b"l", b"f", c).unwrap().ino;
    assert!(matches!(fs.getxattr(l, J), Err(FsError::NoAttribute)));
    assert!(matches!(
        fs.set_journal_mode(l, Some(DataMode::Journal)),
        Err(FsError::Invalid(_))
    ));
    // The record of the directory is hidden.
    assert!(fs.listxattr(f).unwrap().is_empty());
    assert!(matches!(
        fs.getxattr(f, b"trusted.tidefs.linked"),
        Err(FsError::NoAttribute)
    ));
    assert!(matches!(
        fs.setxattr(
            f,
            b"trusted.tidefs.linked",
            b"\x02\0\0\0",
            XattrSetMode::Any
        ),
        Err(FsError::NotPermitted)
    ));

    // Rename into another directory: the destination's mode.
    fs.rename(db, b"f", scratch, b"f", Default::default())
        .unwrap();
    assert_eq!(mode_of(&fs, f), (DataMode::Lightweight, false));
    // Hard link: the directory that linked it most recently.
    fs.link(f, db, b"again").unwrap();
    assert_eq!(mode_of(&fs, f), (DataMode::Journal, false));
    // Setting the old directory's mode does not move a file it no longer governs.
    fs.set_journal_mode(scratch, Some(DataMode::Writeback))
        .unwrap();
    assert_eq!(mode_of(&fs, f), (DataMode::Journal, false));
    // Setting its directory's mode moves it.
    fs.set_journal_mode(db, Some(DataMode::Wasteless)).unwrap();
    assert_eq!(mode_of(&fs, f), (DataMode::Wasteless, false));
    assert_eq!(
        mode_of(&fs, sub),
        (DataMode::Journal, true),
        "subdirectories keep their own"
    );
    // An explicit file mode wins over its directory's, and removing it gives the file back.
    fs.setxattr(f, J, b"selective:8K\n", XattrSetMode::Any)
        .unwrap();
    assert_eq!(
        mode_of(&fs, f),
        (DataMode::Selective { threshold: 8192 }, true)
    );
    fs.set_journal_mode(db, Some(DataMode::Journal)).unwrap();
    assert_eq!(
        mode_of(&fs, f),
        (DataMode::Selective { threshold: 8192 }, true)
    );
    fs.removexattr(f, J).unwrap();
    assert_eq!(mode_of(&fs, f), (DataMode::Journal, false));
    assert!(matches!(fs.removexattr(f, J), Err(FsError::NoAttribute)));
    // A directory that loses its own mode follows the mount's default, and so do its files.
    let g = fs.create(scratch, b"g", 0o100644, 0, c).unwrap().ino;
    assert_eq!(mode_of(&fs, g), (DataMode::Writeback, false));
    fs.removexattr(scratch, J).unwrap();
    assert_eq!(mode_of(&fs, scratch), (DataMode::Ordered, false));
    assert_eq!(mode_of(&fs, g), (DataMode::Ordered, false));
    fs.unmount().unwrap();
    drop(fs);
    common::assert_fsck_clean(&img);
    assert_ne!(
        ext4_flags(&img, "/db") & JOURNAL_DATA_FL,
        0,
        "db is journal"
    );
    assert_ne!(ext4_flags(&img, "/db/again") & JOURNAL_DATA_FL, 0);
    assert_eq!(ext4_flags(&img, "/scratch") & JOURNAL_DATA_FL, 0);
    assert_eq!(ext4_flags(&img, "/scratch/g") & JOURNAL_DATA_FL, 0);
    // The kernel's ext4 reads the same: the attribute, and the flag as lsattr's `j`.
    if common::can_loop_mount() {
        let k = common::KernelMount::mount(&img, "ro").unwrap();
        let db_path = k.path().join("db");
        let value = common::run_ok(
            "getfattr",
            &[
                "--only-values",
                "-n",
                "user.tidefs.journal",
                db_path.to_str().unwrap(),
            ],
        );
        assert_eq!(value, "journal");
        let attrs = common::run_ok("lsattr", &["-d", db_path.to_str().unwrap()]);
        let flags = attrs.split_whitespace().next().unwrap_or("");
        assert!(flags.contains('j'), "lsattr -d db: {attrs}");
        k.umount();
    }

    // Everything survives a remount; a different default changes only what has no mode.
    let fs = Fs::open(&img, &opts(DataMode::Writeback)).unwrap();
    assert_eq!(mode_of(&fs, db), (DataMode::Journal, true));
    assert_eq!(mode_of(&fs, sub), (DataMode::Journal, true));
    assert_eq!(mode_of(&fs, f), (DataMode::Journal, false));
    assert_eq!(mode_of(&fs, scratch), (DataMode::Writeback, false));
    assert_eq!(mode_of(&fs, g), (DataMode::Writeback, false));
    fs.unmount().unwrap();
}

/// Goal: a mode set just before a crash is there after recovery once its transaction
/// committed, and each directory keeps its own after the replay.
#[test]
fn modes_survive_a_crash() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkimage(dir.path(), "crash.img", 32, &[]);
    let fs = Fs::open(&img, &opts(DataMode::Ordered)).unwrap();
    let a = fs.mkdir(ROOT_INO, b"a", 0o755, Creds::ROOT).unwrap().ino;
    fs.set_journal_mode(a, Some(DataMode::Wasteless)).unwrap();
    let f = fs.create(a, b"f", 0o100644, 0, Creds::ROOT).unwrap().ino;
    fs.write(f, 0, b"hello").unwrap();
    fs.fsync(f, false).unwrap();
    fs.crash();
    drop(fs);
    let fs = Fs::open(&img, &opts(DataMode::Ordered)).unwrap();
    assert_eq!(mode_of(&fs, a), (DataMode::Wasteless, true));
    assert_eq!(mode_of(&fs, f), (DataMode::Wasteless, false));
    assert_eq!(fs.read(f, 0, 10).unwrap(), b"hello");
    fs.unmount().unwrap();
    drop(fs);
    common::assert_fsck_clean(&img);
}

/// Journal bytes a closure costs, between two syncs.
fn journal_cost(fs: &Fs, f: impl FnOnce()) -> u64 {
    fs.sync().unwrap();
    let before = fs.stats().journal_bytes;
    f();
    fs.sync().unwrap();
    fs.stats().journal_bytes - before
}

/// Goal: in one mount, each directory's data follows its own mode, and a switch keeps the old
/// mode for what was written before it. Method: the same 64 KiB written in a `journal`
/// directory and in an `ordered` one cost the journal about 64 KiB more in the first; data
/// written under `journal` and synced after its directory switched to `ordered` still goes
/// through the journal, and data written after the switch does not.
#[test]
fn each_directory_journals_by_its_own_mode_across_switches() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkimage(dir.path(), "mixed.img", 64, &[]);
    let fs = Fs::open(&img, &opts(DataMode::Ordered)).unwrap();
    let c = Creds::ROOT;
    let jd = fs.mkdir(ROOT_INO, b"j", 0o755, c).unwrap().ino;
    let od = fs.mkdir(ROOT_INO, b"o", 0o755, c).unwrap().ino;
    fs.set_journal_mode(jd, Some(DataMode::Journal)).unwrap();
    let jf = fs.create(jd, b"f", 0o100644, 0, c).unwrap().ino;
    let of = fs.create(od, b"f", 0o100644, 0, c).unwrap().ino;
    let data = vec![7u8; 64 << 10];
    let in_journal = journal_cost(&fs, || {
        fs.write(jf, 0, &data).unwrap();
    });
    let in_ordered = journal_cost(&fs, || {
        fs.write(of, 0, &data).unwrap();
    });
    assert!(
        in_journal > in_ordered + 60_000,
        "journal dir {in_journal} B, ordered dir {in_ordered} B"
    );
    // Written under journal into new blocks (nothing of them in the log yet), switched
    // before the commit: still journaled.
    let jf2 = fs.create(jd, b"f2", 0o100644, 0, c).unwrap().ino;
    let switched = journal_cost(&fs, || {
        fs.write(jf2, 0, &vec![8u8; 64 << 10]).unwrap();
        fs.set_journal_mode(jd, Some(DataMode::Ordered)).unwrap();
    });
    assert!(
        switched > in_ordered + 60_000,
        "written under journal: {switched} B (ordered {in_ordered} B)"
    );
    // Written after the switch: in place, new blocks and old ones alike (the old ones once
    // their journaled copies are home: a remount checkpoints them).
    fs.unmount().unwrap();
    drop(fs);
    let fs = Fs::open(&img, &opts(DataMode::Ordered)).unwrap();
    let after = journal_cost(&fs, || {
        fs.write(jf, 0, &vec![9u8; 64 << 10]).unwrap();
        let jf3 = fs.create(jd, b"f3", 0o100644, 0, c).unwrap().ino;
        fs.write(jf3, 0, &vec![9u8; 64 << 10]).unwrap();
    });
    assert!(
        after < 60_000,
        "written under ordered after the switch: {after} B"
    );
    fs.unmount().unwrap();
    drop(fs);
    common::assert_fsck_clean(&img);
    let fs = Fs::open(&img, &opts(DataMode::Ordered)).unwrap();
    assert_eq!(fs.read(jf, 0, 64 << 10).unwrap(), vec![9u8; 64 << 10]);
    assert_eq!(fs.read(jf2, 0, 64 << 10).unwrap(), vec![8u8; 64 << 10]);
    assert_eq!(fs.read(of, 0, 64 << 10).unwrap(), data);
    fs.unmount().unwrap();
}

/// Goal: `lightweight` directories beside `ordered` ones never leave a used block marked free,
/// whatever a crash cuts: deletes in a lightweight directory wait for their in-place writes.
/// Method: many create/write/delete rounds in both directories with fsyncs, then a crash
/// without unmount; after recovery e2fsck may find leaks but nothing worse, and every file
/// fsync'd in the ordered directory is intact.
#[test]
fn lightweight_beside_ordered_only_ever_leaks() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkimage(dir.path(), "light.img", 64, &[]);
    let fs = Fs::open(&img, &opts(DataMode::Ordered)).unwrap();
    let c = Creds::ROOT;
    let ld = fs.mkdir(ROOT_INO, b"light", 0o755, c).unwrap().ino;
    let od = fs.mkdir(ROOT_INO, b"ordered", 0o755, c).unwrap().ino;
    fs.set_journal_mode(ld, Some(DataMode::Lightweight))
        .unwrap();
    for round in 0..40u32 {
        let name = format!("f{round}");
        let lf = fs.create(ld, name.as_bytes(), 0o100644, 0, c).unwrap().ino;
        fs.write(lf, 0, &vec![round as u8; 20_000]).unwrap();
        fs.fsync(lf, false).unwrap();
        let of = fs.create(od, name.as_bytes(), 0o100644, 0, c).unwrap().ino;
        fs.write(of, 0, &vec![round as u8; 9_000]).unwrap();
        fs.fsync(of, false).unwrap();
        if round % 3 == 0 {
            fs.unlink(ld, name.as_bytes()).unwrap();
        }
    }
    fs.crash();
    drop(fs);
    let fs = Fs::open(&img, &opts(DataMode::Ordered)).unwrap();
    for round in 0..40u32 {
        let of = fs.lookup(od, format!("f{round}").as_bytes()).unwrap();
        assert_eq!(
            fs.read(of.ino, 0, 10_000).unwrap(),
            vec![round as u8; 9_000]
        );
    }
    fs.unmount().unwrap();
    drop(fs);
    common::assert_fsck_clean_but_leaks(&img);
}

/// Goal: an inode-table block shared by a `lightweight` file and an `ordered` one journals only
/// the ordered file's bytes; the lightweight file's go home in place after the commit
/// (docs/DESIGN.md §3.2). Method: two files whose inodes share a block, one of them
/// lightweight by its own mode; one transaction changes both (the lightweight one grows, the
/// ordered one changes mode bits). The commit writes a range record. Then the same again,
/// with the device dying at the in-place write of that block: after recovery the ordered
/// file's change is there (its slot was in the journal) and the lightweight file's is not (it
/// would be, had the whole block been journaled), and e2fsck finds nothing worse than leaks.
#[test]
fn a_shared_inode_block_journals_only_the_stricter_inodes() {
    use std::sync::Arc;
    use tidefs::dev::fault::{Fault, FaultDev, FaultOp};
    use tidefs::dev::MemDev;
    use tidefs::fs::SetAttr;

    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkimage(dir.path(), "shared.img", 16, &[]);
    let c = Creds::ROOT;
    let mem = Arc::new(MemDev::from_bytes(std::fs::read(&img).unwrap()));
    let (light, strict) = {
        let fs = Fs::open_devices(mem.clone(), None, &opts(DataMode::Ordered)).unwrap();
        let d = fs.mkdir(ROOT_INO, b"d", 0o755, c).unwrap().ino;
        let light = fs.create(d, b"light", 0o100644, 0, c).unwrap().ino;
        let strict = fs.create(d, b"strict", 0o100644, 0, c).unwrap().ino;
        fs.set_journal_mode(light, Some(DataMode::Lightweight))
            .unwrap();
        fs.unmount().unwrap();
        (light, strict)
    };
    let bytes = mem.to_bytes();
    let bs = 4096;
    let block_of = |ino: u64| common::inode_offset(&bytes, ino as u32) / bs;
    assert_eq!(
        block_of(light),
        block_of(strict),
        "the two inodes share a block"
    );
    let itable = (block_of(light) * bs) as u64;

    // One transaction that changes both inodes; the journal empty before it (clean mount).
    let change_both = |fs: &Fs, mode: u16| {
        fs.write(light, 0, &[b'l'; 3000]).unwrap();
        fs.setattr(
            strict,
            &SetAttr {
                mode: Some(mode),
                ..SetAttr::default()
            },
        )
        .unwrap();
    };
    let fs = Fs::open_devices(mem.clone(), None, &opts(DataMode::Ordered)).unwrap();
    let before = fs.stats();
    change_both(&fs, 0o600);
    fs.sync().unwrap();
    let after = fs.stats();
    assert!(
        after.range_records > before.range_records,
        "the shared block went to the journal as a range record: {before:?} -> {after:?}"
    );
    fs.unmount().unwrap();
    drop(fs);
    let fs = Fs::open_devices(mem.clone(), None, &opts(DataMode::Ordered)).unwrap();
    assert_eq!(fs.getattr(light).unwrap().size, 3000);
    assert_eq!(fs.getattr(strict).unwrap().perm & 0o7777, 0o600);
    fs.unmount().unwrap();
    drop(fs);
    let clean = dir.path().join("clean.img");
    std::fs::write(&clean, mem.to_bytes()).unwrap();
    common::assert_fsck_clean(&clean);

    // Again, and the device dies at the in-place write of the shared block.
    fs_truncate_light(&mem, light);
    let fault = Arc::new(FaultDev::new(mem.clone()));
    let fs = Fs::open_devices(fault.clone(), None, &opts(DataMode::Ordered)).unwrap();
    change_both(&fs, 0o640);
    fault.inject(Fault::range(FaultOp::Write, itable..itable + bs as u64).then_dead());
    assert!(fs.sync().is_err(), "the in-place write failed");
    fs.crash();
    drop(fs);
    let crashed = mem.to_bytes();
    let mem = Arc::new(MemDev::from_bytes(crashed));
    let fs = Fs::open_devices(mem.clone(), None, &opts(DataMode::Ordered)).unwrap();
    assert_eq!(
        fs.getattr(strict).unwrap().perm & 0o7777,
        0o640,
        "the ordered inode's change was journaled"
    );
    assert_eq!(
        fs.getattr(light).unwrap().size,
        0,
        "the lightweight inode's change was only in place, and lost"
    );
    fs.unmount().unwrap();
    drop(fs);
    let recovered = dir.path().join("recovered.img");
    std::fs::write(&recovered, mem.to_bytes()).unwrap();
    common::assert_fsck_clean_but_leaks(&recovered);
}

/// Empties the lightweight file of the shared-block test (and checkpoints: a clean unmount).
fn fs_truncate_light(mem: &std::sync::Arc<tidefs::dev::MemDev>, light: u64) {
    let fs = Fs::open_devices(mem.clone(), None, &opts(DataMode::Ordered)).unwrap();
    fs.setattr(
        light,
        &tidefs::fs::SetAttr {
            size: Some(0),
            ..tidefs::fs::SetAttr::default()
        },
    )
    .unwrap();
    fs.unmount().unwrap();
}

/// Goal: a directory with more files than one transaction carries the inodes of can still
/// change its mode: its files take the new mode in steps, each committed, the directory last
/// (before, the one operation was refused as larger than a transaction, EINVAL); every file
/// obeys the new mode after, also after a remount, and the image is clean. Method: 1 KiB
/// blocks (four inodes per inode-table block) and the smallest journal (1 024 blocks, a
/// transaction of at most 256), 3 600 files in one directory, `journal` set on it.
#[test]
fn a_directory_with_more_files_than_a_transaction_changes_its_mode() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkfs_raw(
        dir.path(),
        "many.img",
        64,
        &[
            "-b",
            "1024",
            "-N",
            "8192",
            "-J",
            "size=1",
            "-O",
            "metadata_csum,64bit",
        ],
    );
    let fs = Fs::open(&img, &opts(DataMode::Ordered)).unwrap();
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, Creds::ROOT).unwrap().ino;
    let files: Vec<u64> = (0..3600)
        .map(|k| {
            fs.create(d, format!("f{k}").as_bytes(), 0o100644, 0, Creds::ROOT)
                .unwrap()
                .ino
        })
        .collect();
    fs.sync().unwrap();
    let commits = fs.stats().commits;
    fs.set_journal_mode(d, Some(DataMode::Journal)).unwrap();
    assert!(
        fs.stats().commits > commits + 4,
        "the change should go in steps, each committed"
    );
    for &f in files.iter().step_by(97) {
        assert_eq!(mode_of(&fs, f).0, DataMode::Journal, "file {f}");
    }
    // Through the attribute, as `setfattr` and `tidefs journal set` on a mount change it.
    fs.setxattr(d, J, b"writeback", XattrSetMode::Replace)
        .unwrap();
    for &f in files.iter().step_by(101) {
        assert_eq!(mode_of(&fs, f).0, DataMode::Writeback, "file {f}");
    }
    fs.removexattr(d, J).unwrap();
    for &f in files.iter().step_by(103) {
        assert_eq!(mode_of(&fs, f).0, DataMode::Ordered, "file {f}");
    }
    fs.setxattr(d, J, b"journal", XattrSetMode::Create).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let fs = Fs::open(&img, &opts(DataMode::Ordered)).unwrap();
    assert_eq!(mode_of(&fs, d), (DataMode::Journal, true));
    for &f in files.iter().step_by(89) {
        assert_eq!(
            mode_of(&fs, f).0,
            DataMode::Journal,
            "file {f} after a remount"
        );
    }
    fs.unmount().unwrap();
    common::assert_fsck_clean(&img);
}
