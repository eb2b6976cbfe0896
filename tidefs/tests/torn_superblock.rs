//! Goal: a superblock whose home copy was torn by a crash (a checkpoint write cut between its
//! sectors) is brought back from the journal instead of failing the mount, while a bad
//! superblock checksum with nothing to replay is still refused without touching the image.
//! Method: commit a transaction that logs the superblock (an orphan-list change), stop as at a
//! power cut, damage the superblock's second sector at home, and open again.

mod common;

use tidefs::fs::{Creds, Fs, MountOptions, ROOT_INO};
use tidefs::FsError;

/// Goal and method: see the module doc.
#[test]
fn torn_superblock_after_a_crash_is_repaired() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkimage(dir.path(), "t.img", 32, &[]);
    let fs = Fs::open(&img, &MountOptions::default()).unwrap();
    let f = fs
        .create(ROOT_INO, b"kept", 0o100644, 0, Creds::ROOT)
        .unwrap();
    fs.write(f.ino, 0, &[7u8; 10_000]).unwrap();
    // An open unnamed file goes on the orphan list, whose head is in the superblock: the
    // commit logs the superblock (free counts alone are not logged).
    fs.tmpfile(ROOT_INO, 0o600, Creds::ROOT).unwrap();
    fs.fsync(f.ino, false).unwrap();
    fs.crash();
    drop(fs);
    // Tear the superblock: its second 512-byte sector holds other bytes now.
    let mut bytes = std::fs::read(&img).unwrap();
    bytes[1024 + 512..2048].iter_mut().for_each(|b| *b ^= 0x5A);
    std::fs::write(&img, &bytes).unwrap();

    let fs = Fs::open(&img, &MountOptions::default()).unwrap();
    assert!(fs.recovery_report().is_some_and(|r| r.transactions > 0));
    let a = fs.lookup(ROOT_INO, b"kept").unwrap();
    assert_eq!(fs.read(a.ino, 0, 20_000).unwrap(), vec![7u8; 10_000]);
    fs.unmount().unwrap();
    drop(fs);
    common::assert_fsck_clean(&img);

    // Nothing left to replay: the same damage is refused, and the image is left as it was.
    let mut bytes = std::fs::read(&img).unwrap();
    bytes[1024 + 512..2048].iter_mut().for_each(|b| *b ^= 0x5A);
    std::fs::write(&img, &bytes).unwrap();
    match Fs::open(&img, &MountOptions::default()) {
        Err(FsError::Corrupt(c)) => assert!(c.what.contains("superblock checksum"), "{c}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a corrupt superblock was accepted"),
    }
    assert_eq!(std::fs::read(&img).unwrap(), bytes);
}

/// Goal: the superblock writes of mount (its first write) and unmount (its last) can be torn
/// by a power cut at any of them and the image still opens, with everything that was durable.
/// Method: for each write that touches the superblock's bytes during mount or unmount, in turn,
/// only its first sector lands and the device dies there; the image is then opened on a healthy
/// device and must mount, verify and hold the fsync'd file; e2fsck -fn is clean after unmount.
#[test]
fn every_superblock_write_of_mount_and_unmount_survives_a_tear() {
    use std::sync::Arc;
    use tidefs::dev::fault::{Fault, FaultDev, FaultOp};
    use tidefs::dev::MemDev;

    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkimage(dir.path(), "m.img", 32, &[]);
    let base = std::fs::read(&img).unwrap();
    // A sector of the superblock lands, the other keeps its old bytes.
    let tear = |n: u64| {
        Fault::nth_in_range(FaultOp::Write, 1024..2048, n)
            .short(1536)
            .then_dead()
    };
    let check = |what: &str, bytes: Vec<u8>, want_file: bool| {
        let mem = Arc::new(MemDev::from_bytes(bytes));
        let fs = Fs::open_devices(mem.clone(), None, &MountOptions::default())
            .unwrap_or_else(|e| panic!("{what}: open after the tear: {e}"));
        if want_file {
            let a = fs.lookup(ROOT_INO, b"kept").unwrap();
            assert_eq!(fs.read(a.ino, 0, 100).unwrap(), b"fsync'd", "{what}");
        }
        fs.unmount().unwrap();
        drop(fs);
        let path = dir.path().join("check.img");
        std::fs::write(&path, mem.to_bytes()).unwrap();
        common::assert_fsck_clean(&path);
    };
    // Mount's writes.
    let mut torn_mounts = 0;
    for n in 0.. {
        let mem = Arc::new(MemDev::from_bytes(base.clone()));
        let dev = Arc::new(FaultDev::new(mem.clone()));
        dev.inject(tear(n));
        let opened = Fs::open_devices(dev.clone(), None, &MountOptions::default());
        if dev.counts().injected == 0 {
            dev.heal();
            opened.unwrap().unmount().unwrap();
            break;
        }
        torn_mounts += 1;
        if let Ok(fs) = opened {
            fs.crash();
        }
        check(
            &format!("mount, superblock write {n}"),
            mem.to_bytes(),
            false,
        );
    }
    assert!(torn_mounts > 0, "mount never wrote the superblock");
    // Unmount's writes, after an fsync'd file.
    let mut torn_unmounts = 0;
    for n in 0.. {
        let mem = Arc::new(MemDev::from_bytes(base.clone()));
        let dev = Arc::new(FaultDev::new(mem.clone()));
        let fs = Fs::open_devices(dev.clone(), None, &MountOptions::default()).unwrap();
        let f = fs
            .create(ROOT_INO, b"kept", 0o100644, 0, Creds::ROOT)
            .unwrap();
        fs.write(f.ino, 0, b"fsync'd").unwrap();
        fs.fsync(f.ino, false).unwrap();
        dev.inject(tear(n));
        let closed = fs.unmount();
        if dev.counts().injected == 0 {
            closed.unwrap();
            break;
        }
        torn_unmounts += 1;
        drop(fs);
        check(
            &format!("unmount, superblock write {n}"),
            mem.to_bytes(),
            true,
        );
    }
    assert!(torn_unmounts > 0, "unmount never wrote the superblock");
}

/// Goal: a damaged primary superblock with nothing in the journal is repaired from the backup
/// in group 1, and mount rewrites the primary. Method: a 256 MiB image (two groups), clean
/// unmount, then the primary's second sector is garbled; open, check, unmount, and the primary
/// verifies again with e2fsck -fn clean.
#[test]
fn damaged_primary_superblock_is_repaired_from_the_backup() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkimage(dir.path(), "b.img", 256, &[]);
    let fs = Fs::open(&img, &MountOptions::default()).unwrap();
    let f = fs
        .create(ROOT_INO, b"kept", 0o100644, 0, Creds::ROOT)
        .unwrap();
    fs.write(f.ino, 0, &[9u8; 50_000]).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let mut bytes = std::fs::read(&img).unwrap();
    bytes[1024 + 512..2048].iter_mut().for_each(|b| *b ^= 0x5A);
    std::fs::write(&img, &bytes).unwrap();
    let fs = Fs::open(&img, &MountOptions::default()).unwrap();
    let a = fs.lookup(ROOT_INO, b"kept").unwrap();
    assert_eq!(fs.read(a.ino, 0, 60_000).unwrap(), vec![9u8; 50_000]);
    let free = fs.statfs().unwrap().blocks_free;
    fs.unmount().unwrap();
    drop(fs);
    let bytes = std::fs::read(&img).unwrap();
    let sb = tidefs::format::ext4::superblock::Superblock::parse(&bytes[1024..2048])
        .expect("the primary verifies again");
    assert_eq!(sb.block_group_nr(), 0);
    assert_eq!(
        sb.free_blocks_count(),
        free,
        "free counts come from the group descriptors"
    );
    common::assert_fsck_clean(&img);
}
