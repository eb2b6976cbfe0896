//! Goal: `Fs::tmpfile` (O_TMPFILE) makes an unnamed file on the ext4 orphan list: linked, it
//! keeps its data across a remount; never linked, it is freed at its last release, or, after a
//! crash, by orphan processing at the next mount; and the image stays clean by `e2fsck -fn`.
//! Method: fresh `mkfs.ext4` images through the library; free inode and block counts from
//! `statfs` show what was freed; `Fs::crash()` stops the file system as a power cut would after
//! an fsync made the orphan list durable, and e2fsprogs' own journal replay and orphan cleanup
//! on a copy of the crashed image shows which inodes that list holds.

mod common;

use tidefs::fs::{Creds, DataMode, Fs, MountOptions, ROOT_INO};
use tidefs::FsError;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn options(mode: DataMode) -> MountOptions {
    MountOptions {
        data_mode: mode,
        ..MountOptions::default()
    }
}

#[test]
fn linked_tmpfile_keeps_its_data_across_a_remount() -> TestResult {
    if !common::have_e2fsprogs() {
        return Ok(());
    }
    for mode in [DataMode::Ordered, DataMode::Journal] {
        let dir = tempfile::tempdir()?;
        let img = common::mkimage(dir.path(), "t.img", 64, &[]);
        let fs = Fs::open(&img, &options(mode))?;
        let d = fs.mkdir(ROOT_INO, b"d", 0o755, Creds::ROOT)?;
        let t = fs.tmpfile(d.ino, 0o600, Creds { uid: 7, gid: 8 })?;
        assert_eq!(t.nlink, 0, "{mode:?}: a tmpfile has no links");
        assert_eq!((t.perm, t.uid, t.gid), (0o600, 7, 8));
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 253) as u8).collect();
        fs.write(t.ino, 0, &data)?;
        assert_eq!(fs.getattr(t.ino)?.size, 10_000);
        let mut names = Vec::new();
        fs.readdir(d.ino, 0, &mut |e| {
            names.push(e.name);
            true
        })?;
        assert_eq!(names.len(), 2, "{mode:?}: the tmpfile has no name yet");
        let linked = fs.link(t.ino, d.ino, b"named")?;
        assert_eq!(linked.nlink, 1);
        // The last release of a linked tmpfile frees nothing.
        fs.release_inode(t.ino)?;
        assert_eq!(fs.lookup(d.ino, b"named")?.ino, t.ino);
        fs.unmount()?;
        drop(fs);
        common::assert_fsck_clean(&img);
        let fs = Fs::open(&img, &options(mode))?;
        let found = fs.lookup(d.ino, b"named")?;
        assert_eq!(found.ino, t.ino);
        assert_eq!(found.nlink, 1);
        assert_eq!(fs.read(found.ino, 0, 20_000)?, data, "{mode:?}");
        fs.unmount()?;
    }
    Ok(())
}

#[test]
fn unlinked_tmpfile_is_freed_at_its_last_release() -> TestResult {
    if !common::have_e2fsprogs() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let img = common::mkimage(dir.path(), "r.img", 64, &[]);
    let fs = Fs::open(&img, &MountOptions::default())?;
    let before = fs.statfs()?;
    let t = fs.tmpfile(ROOT_INO, 0o644, Creds::ROOT)?;
    fs.write(t.ino, 0, &[5u8; 3 * 4096])?;
    let during = fs.statfs()?;
    assert_eq!(during.files_free, before.files_free - 1);
    assert_eq!(during.blocks_free, before.blocks_free - 3);
    // A second handle keeps it alive past the first release.
    fs.open_inode(t.ino)?;
    fs.release_inode(t.ino)?;
    assert_eq!(fs.read(t.ino, 0, 10)?, vec![5u8; 10]);
    fs.release_inode(t.ino)?;
    assert!(matches!(fs.getattr(t.ino), Err(FsError::NotFound)));
    let after = fs.statfs()?;
    assert_eq!(after.files_free, before.files_free);
    assert_eq!(after.blocks_free, before.blocks_free);
    // Only regular files.
    assert!(matches!(
        fs.tmpfile(ROOT_INO, 0o040755, Creds::ROOT),
        Err(FsError::Invalid(_))
    ));
    fs.unmount()?;
    drop(fs);
    common::assert_fsck_clean(&img);
    Ok(())
}

#[test]
fn unlinked_tmpfiles_are_freed_by_orphan_processing_after_a_crash() -> TestResult {
    if !common::have_e2fsprogs() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let img = common::mkimage(dir.path(), "c.img", 64, &[]);
    let fs = Fs::open(&img, &MountOptions::default())?;
    let before = fs.statfs()?;
    // Three tmpfiles on the orphan list; the middle one gets a name, which takes it out of the
    // middle of the list.
    let a = fs.tmpfile(ROOT_INO, 0o600, Creds::ROOT)?;
    let b = fs.tmpfile(ROOT_INO, 0o600, Creds::ROOT)?;
    let c = fs.tmpfile(ROOT_INO, 0o600, Creds::ROOT)?;
    for (t, byte) in [(&a, 1u8), (&b, 2), (&c, 3)] {
        fs.write(t.ino, 0, &vec![byte; 2 * 4096])?;
    }
    fs.link(b.ino, ROOT_INO, b"kept")?;
    fs.fsync(c.ino, false)?;
    // Stop while a and c are still open: nothing more reaches the disk.
    fs.crash();
    drop(fs);
    // The orphan list as recovery finds it, read by e2fsprogs: its journal replay on a copy
    // of the image frees exactly the orphans it finds on the list.
    let copy = dir.path().join("copy.img");
    std::fs::copy(&img, &copy)?;
    let out = std::process::Command::new("e2fsck")
        .args(["-E", "journal_only", "-y"])
        .arg(&copy)
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    for t in [&a, &c] {
        assert!(
            text.contains(&format!("Clearing orphaned inode {} ", t.ino)),
            "e2fsck must find tmpfile {} on the orphan list:\n{text}",
            t.ino
        );
    }
    assert!(
        !text.contains(&format!("orphaned inode {} ", b.ino)),
        "the linked tmpfile left the orphan list:\n{text}"
    );

    let fs = Fs::open(&img, &MountOptions::default())?;
    let kept = fs.lookup(ROOT_INO, b"kept")?;
    assert_eq!(kept.ino, b.ino);
    assert_eq!(fs.read(kept.ino, 0, 3 * 4096)?, vec![2u8; 2 * 4096]);
    for t in [&a, &c] {
        assert!(matches!(fs.getattr(t.ino), Err(FsError::NotFound)));
    }
    let after = fs.statfs()?;
    assert_eq!(after.files_free, before.files_free - 1, "only b is left");
    assert_eq!(after.blocks_free, before.blocks_free - 2);
    fs.unmount()?;
    drop(fs);
    common::assert_fsck_clean(&img);
    Ok(())
}
