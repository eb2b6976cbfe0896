//! Goal: a superblock whose home copy was torn by a crash (a checkpoint write cut between its
//! sectors) is brought back from the journal instead of failing the mount, while a bad
//! superblock checksum with nothing to replay is still refused without touching the image.
//! Method: commit a transaction that logs the superblock, stop as at a power cut, damage the
//! superblock's second sector at home, and open again.

mod common;

use tidefs::fs::{Creds, Fs, MountOptions, ROOT_INO};
use tidefs::FsError;

/// Goal and method: see the module doc.
#[test]
fn torn_superblock_is_replayed_from_the_journal() {
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
