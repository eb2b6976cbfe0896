//! Goal: bad input is refused with a message that names the problem, and the refused image is
//! not modified; running out of blocks or inodes gives `NoSpace` and leaves a consistent file
//! system. Method: images from the real mkfs.ext4 are damaged one field at a time (fixing the
//! superblock checksum where only the feature bits should be wrong), opened through `Fs::open`
//! read-write and read-only, and hashed before and after. ENOSPC: fill a small image with data,
//! and one made with few inodes with files, then check with the real `e2fsck -fn` and read
//! everything back.

mod common;

use std::path::{Path, PathBuf};

use tidefs::format::crc32c_raw;
use tidefs::format::jbd2::JournalSuperblock;
use tidefs::fs::{Creds, DataMode, Fs, MountOptions, ROOT_INO};
use tidefs::FsError;

const SB: usize = 1024;

fn opts(ro: bool) -> MountOptions {
    MountOptions {
        read_only: ro,
        ..MountOptions::default()
    }
}

/// Opens `image` expecting a refusal; returns the error.
fn open_err(image: &Path, ro: bool) -> FsError {
    match Fs::open(image, &opts(ro)) {
        Ok(fs) => {
            let _ = fs.unmount();
            panic!(
                "{} opened (read_only={ro}) although it should be refused",
                image.display()
            )
        }
        Err(e) => e,
    }
}

/// Opens `image` read-write and read-only; each must fail with an error that `ok` accepts and
/// whose message contains every word of `words`; the image bytes must not change.
fn assert_refused(image: &Path, modes: &[bool], ok: fn(&FsError) -> bool, words: &[&str]) {
    for &ro in modes {
        let before_bytes = std::fs::read(image).unwrap();
        let before = common::hash_bytes(&before_bytes);
        let e = open_err(image, ro);
        let msg = e.to_string();
        eprintln!("read_only={ro}: refused with: {msg}");
        assert!(ok(&e), "read_only={ro}: wrong error kind: {e:?}");
        for w in words {
            assert!(
                msg.to_lowercase().contains(&w.to_lowercase()),
                "read_only={ro}: message {msg:?} does not name {w:?}"
            );
        }
        let after = std::fs::read(image).unwrap();
        if common::hash_bytes(&after) != before {
            panic!(
                "read_only={ro}: the refused image was modified ({e}); {}",
                describe_changes(&before_bytes, &after)
            );
        }
    }
}

/// Which 1 KiB units of the image changed (for the failure message).
fn describe_changes(a: &[u8], b: &[u8]) -> String {
    if a.len() != b.len() {
        return format!("length {} -> {}", a.len(), b.len());
    }
    let changed: Vec<String> = a
        .chunks(1024)
        .zip(b.chunks(1024))
        .enumerate()
        .filter(|(_, (x, y))| x != y)
        .map(|(i, _)| format!("bytes {:#x}..{:#x}", i * 1024, (i + 1) * 1024))
        .collect();
    format!(
        "{} KiB changed: {}",
        changed.len(),
        changed
            .iter()
            .take(10)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ")
    )
}

fn is_corrupt(e: &FsError) -> bool {
    matches!(e, FsError::Corrupt(_))
}

fn is_incompatible(e: &FsError) -> bool {
    matches!(e, FsError::Incompatible(_))
}

fn edit(image: &Path, f: impl FnOnce(&mut Vec<u8>)) {
    let mut b = std::fs::read(image).unwrap();
    f(&mut b);
    std::fs::write(image, b).unwrap();
}

fn fix_sb_csum(b: &mut [u8]) {
    let c = crc32c_raw(!0, &b[SB..SB + 0x3FC]);
    b[SB + 0x3FC..SB + 0x400].copy_from_slice(&c.to_le_bytes());
}

fn or_u32(b: &mut [u8], off: usize, bits: u32) {
    let v = u32::from_le_bytes(b[off..off + 4].try_into().unwrap()) | bits;
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

fn fresh(dir: &Path, name: &str) -> PathBuf {
    common::mkimage(dir, name, 32, &[])
}

/// Goal: a wrong superblock magic is refused as corrupt, naming the magic, image unchanged.
#[test]
fn bad_magic() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = fresh(dir.path(), "m.img");
    edit(&img, |b| {
        b[SB + 0x38] = 0x12;
        b[SB + 0x39] = 0x34;
    });
    assert_refused(&img, &[false, true], is_corrupt, &["magic"]);
}

/// Goal: a bad superblock checksum (or a field changed under it) is refused as corrupt, image
/// unchanged.
#[test]
fn superblock_checksum_corrupted() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = fresh(dir.path(), "c.img");
    edit(&img, |b| b[SB + 0x3FC] ^= 0x5A);
    assert_refused(
        &img,
        &[false, true],
        is_corrupt,
        &["superblock", "checksum"],
    );
    // A data field changed without fixing the checksum: also refused.
    let img2 = fresh(dir.path(), "c2.img");
    edit(&img2, |b| b[SB + 0x10] ^= 1);
    assert_refused(
        &img2,
        &[false, true],
        is_corrupt,
        &["superblock", "checksum"],
    );
}

/// Goal: a bad group descriptor checksum (or a field changed under it) is refused, image unchanged.
#[test]
fn group_descriptor_checksum_corrupted() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = fresh(dir.path(), "g.img");
    // 4 KiB blocks: the descriptor table is block 1; group 0's bg_checksum is at 0x1E.
    edit(&img, |b| b[4096 + 0x1E] ^= 0xFF);
    assert_refused(
        &img,
        &[false, true],
        is_corrupt,
        &["group descriptor", "checksum"],
    );
    // A descriptor field changed (free inodes) without a new checksum: refused the same way.
    let img2 = fresh(dir.path(), "g2.img");
    edit(&img2, |b| b[4096 + 0x0E] ^= 1);
    assert_refused(
        &img2,
        &[false, true],
        is_corrupt,
        &["group descriptor", "checksum"],
    );
}

/// Goal: an incompat feature tidefs lacks (known or undefined) is refused, naming it, image
/// unchanged.
#[test]
fn unknown_incompat_feature() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // A known feature tidefs does not implement, with a valid superblock checksum.
    let img = fresh(dir.path(), "i.img");
    edit(&img, |b| {
        or_u32(b, SB + 0x60, 0x8000);
        fix_sb_csum(b);
    });
    assert_refused(&img, &[false, true], is_incompatible, &["inline_data"]);
    // A bit nobody has defined.
    let img2 = fresh(dir.path(), "i2.img");
    edit(&img2, |b| {
        or_u32(b, SB + 0x60, 0x4000_0000);
        fix_sb_csum(b);
    });
    assert_refused(&img2, &[false, true], is_incompatible, &["0x40000000"]);
}

/// Goal: an unknown ro_compat feature refuses read-write (naming it) but allows a read-only open
/// that reads the data, refuses changes and leaves the image unchanged.
#[test]
fn unknown_ro_compat_feature_allows_read_only() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = fresh(dir.path(), "r.img");
    {
        let fs = Fs::open(&img, &opts(false)).unwrap();
        let f = fs
            .create(ROOT_INO, b"hello", 0o100644, 0, Creds::ROOT)
            .unwrap();
        fs.write(f.ino, 0, b"still readable").unwrap();
        fs.unmount().unwrap();
    }
    // 0x2000 = project quota (known to e2fsprogs, not implemented by tidefs); 0x0100_0000 is
    // undefined.
    edit(&img, |b| {
        or_u32(b, SB + 0x64, 0x2000 | 0x0100_0000);
        fix_sb_csum(b);
    });
    assert_refused(
        &img,
        &[false],
        is_incompatible,
        &["project", "0x1000000", "read-only"],
    );
    let before = common::file_hash(&img);
    let fs = Fs::open(&img, &opts(true))
        .expect("an unknown ro_compat feature still allows a read-only open");
    let a = fs.lookup(ROOT_INO, b"hello").unwrap();
    assert_eq!(fs.read(a.ino, 0, 100).unwrap(), b"still readable");
    assert!(matches!(
        fs.create(ROOT_INO, b"x", 0o100644, 0, Creds::ROOT),
        Err(FsError::ReadOnly)
    ));
    fs.unmount().unwrap();
    drop(fs);
    assert_eq!(
        common::file_hash(&img),
        before,
        "a read-only open modified the image"
    );
}

/// Goal: a bad root inode checksum is refused as corrupt, naming inode 2, image unchanged.
#[test]
fn root_inode_checksum_corrupted() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = fresh(dir.path(), "ri.img");
    edit(&img, |b| {
        let off = common::inode_offset(b, ROOT_INO as u32);
        b[off + 0x7C] ^= 0xFF; // l_i_checksum_lo
    });
    assert_refused(&img, &[false, true], is_corrupt, &["inode 2", "checksum"]);
}

/// Goal: a bad journal inode checksum is refused as corrupt, naming inode 8, image unchanged.
#[test]
fn journal_inode_checksum_corrupted() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = fresh(dir.path(), "ji.img");
    edit(&img, |b| {
        let off = common::inode_offset(b, 8);
        b[off + 0x7C] ^= 0xFF;
    });
    assert_refused(&img, &[false, true], is_corrupt, &["inode 8", "checksum"]);
}

/// Goal: an image shorter than its superblock says, or too small for one, is refused, unchanged.
#[test]
fn truncated_image() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = fresh(dir.path(), "t.img");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&img)
        .unwrap()
        .set_len(20 << 20)
        .unwrap();
    assert_refused(&img, &[false, true], is_corrupt, &["truncated"]);
    let img2 = fresh(dir.path(), "t2.img");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&img2)
        .unwrap()
        .set_len(1500)
        .unwrap();
    assert_refused(&img2, &[false, true], is_corrupt, &["too small"]);
    let empty = dir.path().join("empty.img");
    std::fs::write(&empty, b"").unwrap();
    assert_refused(&empty, &[false, true], is_corrupt, &["too small"]);
}

/// Sets `bits` in the journal superblock's incompat features, re-encoding it (so a v2/v3
/// checksum, when on, is valid and only the feature is wrong).
fn set_journal_incompat(image: &Path, bits: u32) {
    edit(image, |b| {
        let off = common::journal_sb_offset(b);
        let mut jsb = JournalSuperblock::parse(&b[off..off + 1024]).unwrap();
        jsb.feature_incompat |= bits;
        jsb.write(&mut b[off..off + 1024]);
        assert_eq!(
            JournalSuperblock::parse(&b[off..off + 1024])
                .unwrap()
                .feature_incompat
                & bits,
            bits
        );
    });
}

/// Goal: an unknown journal incompat feature is refused, naming it, with and without a journal
/// checksum.
#[test]
fn journal_unknown_incompat_feature() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Fresh from mkfs: the journal superblock has no checksum.
    let img = fresh(dir.path(), "j.img");
    set_journal_incompat(&img, 0x20);
    assert_refused(
        &img,
        &[false, true],
        is_incompatible,
        &["journal", "fast_commit"],
    );
    // After a tidefs mount the journal has checksum v3: the re-encoded checksum is valid.
    let img2 = fresh(dir.path(), "j2.img");
    Fs::open(&img2, &opts(false)).unwrap().unmount().unwrap();
    let b = std::fs::read(&img2).unwrap();
    let off = common::journal_sb_offset(&b);
    assert!(JournalSuperblock::parse(&b[off..off + 1024])
        .unwrap()
        .has_csum_v2_or_v3());
    set_journal_incompat(&img2, 0x400);
    assert_refused(
        &img2,
        &[false, true],
        is_incompatible,
        &["journal", "0x400"],
    );
}

/// Goal: a journal superblock with a bad magic is refused as corrupt, image unchanged.
#[test]
fn journal_superblock_corrupted() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = fresh(dir.path(), "jc.img");
    edit(&img, |b| {
        let off = common::journal_sb_offset(b);
        b[off] ^= 0xFF; // jbd2 magic
    });
    assert_refused(&img, &[false, true], is_corrupt, &["journal"]);
}

/// Goal: an external journal device opened as a file system is refused, naming journal_dev.
#[test]
fn external_journal_device_given_as_image() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let jdev = common::mkfs_raw(
        dir.path(),
        "jdev.img",
        16,
        &["-O", "journal_dev", "-b", "4096"],
    );
    assert_refused(&jdev, &[false, true], is_incompatible, &["journal_dev"]);
}

/// Goal: an image with an external journal needs `journal_device`; with it an fsync survives a
/// crash and e2fsck is clean; given to an image with an internal journal it is refused, nothing
/// written.
#[test]
fn external_journal_needs_journal_device() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // mke2fs only attaches a journal that is a block device: go through a loop device.
    if !common::can_loop_mount() {
        return;
    }
    let jdev = common::mkfs_raw(
        dir.path(),
        "jdev.img",
        16,
        &["-O", "journal_dev", "-b", "4096"],
    );
    let lo = common::run_ok("losetup", &["-f", "--show", jdev.to_str().unwrap()])
        .trim()
        .to_string();
    let img = dir.path().join("fs.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let out = std::process::Command::new("mkfs.ext4")
        .args([
            "-q",
            "-F",
            "-b",
            "4096",
            "-O",
            "metadata_csum,64bit",
            "-J",
            &format!("device={lo}"),
        ])
        .arg(&img)
        .output()
        .unwrap();
    common::run_ok("losetup", &["-d", &lo]);
    assert!(
        out.status.success(),
        "mkfs -J device: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_refused(
        &img,
        &[false, true],
        |e| matches!(e, FsError::Invalid(_)),
        &["journal_device"],
    );
    // With the journal device it works: an fsync survives a crash (recovery replays the
    // external journal), and e2fsck (given the same journal) is clean.
    let o = MountOptions {
        journal_device: Some(jdev.clone()),
        ..MountOptions::default()
    };
    let fs = Fs::open(&img, &o).expect("open with the external journal");
    let f = fs.create(ROOT_INO, b"f", 0o100644, 0, Creds::ROOT).unwrap();
    fs.write(f.ino, 0, b"external").unwrap();
    fs.fsync(f.ino, false).unwrap();
    fs.fsync(ROOT_INO, false).unwrap();
    fs.crash();
    drop(fs);
    let fs = Fs::open(&img, &o).expect("recover with the external journal");
    assert!(
        fs.recovery_report().is_some(),
        "the crashed image did not need recovery"
    );
    let f = fs
        .lookup(ROOT_INO, b"f")
        .expect("the fsynced file survives");
    assert_eq!(fs.read(f.ino, 0, 100).unwrap(), b"external");
    fs.unmount().unwrap();
    drop(fs);
    common::run_ok(
        "e2fsck",
        &["-fn", "-j", jdev.to_str().unwrap(), img.to_str().unwrap()],
    );
    // Giving a journal device to an image with an internal journal is refused, unchanged.
    let internal = fresh(dir.path(), "int.img");
    let before = (common::file_hash(&internal), common::file_hash(&jdev));
    match Fs::open(&internal, &o) {
        Ok(_) => panic!("journal_device accepted for an image with an internal journal"),
        Err(e) => assert!(e.to_string().contains("internal journal"), "{e}"),
    }
    assert_eq!(
        (common::file_hash(&internal), common::file_hash(&jdev)),
        before
    );
}

/// Goal: an image without a journal is refused read-write, naming the journal.
#[test]
fn no_journal_refused_read_write() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkimage(dir.path(), "nj.img", 32, &["-O", "^has_journal"]);
    assert_refused(&img, &[false], is_incompatible, &["journal"]);
}

/// Content of chunk `c` of file `f` in the fill test.
fn chunk(f: u64, c: u64, len: usize) -> Vec<u8> {
    common::Rng(0x9E37_79B9_7F4A_7C15 ^ (f << 20) ^ c ^ 1).bytes(len)
}

const CH: usize = 256 << 10;

/// Fills the file system with files f000, f001... of up to 8 chunks of [`CH`] bytes until
/// NoSpace; returns the chunk lengths written per file (partial writes allowed).
fn fill(fs: &Fs) -> Vec<Vec<usize>> {
    let mut files: Vec<Vec<usize>> = Vec::new();
    for f in 0..1000u64 {
        let a = match fs.create(
            ROOT_INO,
            format!("f{f:03}").as_bytes(),
            0o100644,
            0,
            Creds::ROOT,
        ) {
            Ok(a) => a,
            Err(FsError::NoSpace) => return files,
            Err(e) => panic!("create: {e}"),
        };
        files.push(Vec::new());
        for c in 0..8u64 {
            let data = chunk(f, c, CH);
            match fs.write(a.ino, c * CH as u64, &data) {
                Ok(n) => {
                    assert!(n as usize <= CH);
                    files.last_mut().unwrap().push(n as usize);
                    if (n as usize) < CH {
                        // A short write: the next one must report NoSpace (or write nothing).
                        match fs.write(a.ino, c * CH as u64 + u64::from(n), &data[n as usize..]) {
                            Err(FsError::NoSpace) | Ok(0) => {}
                            other => panic!("write after a short write: {other:?}"),
                        }
                        return files;
                    }
                }
                Err(FsError::NoSpace) => return files,
                Err(e) => panic!("write: {e}"),
            }
        }
    }
    panic!("never ran out of space");
}

/// Goal: filling the image with data ends in NoSpace with little space left, freeing makes room,
/// and every byte written reads back after a remount; e2fsck is clean.
#[test]
fn enospc_data() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkimage(dir.path(), "full.img", 16, &[]);
    let fs = Fs::open(&img, &opts(false)).unwrap();
    let st0 = fs.statfs().unwrap();
    let files = fill(&fs);
    let st = fs.statfs().unwrap();
    eprintln!("before: {st0:?}\nfull:   {st:?}");
    assert!(
        st.blocks_free < st0.blocks_free / 20,
        "NoSpace while {} of {} blocks are free",
        st.blocks_free,
        st0.blocks_free
    );
    let written: usize = files.iter().flatten().sum();
    assert!(
        written as u64 >= st0.blocks_free * 4096 / 2,
        "only {written} bytes fit in {} free blocks",
        st0.blocks_free
    );
    // Still usable: free a file, commit, then a new file can be written.
    let victim = fs.lookup(ROOT_INO, b"f000").unwrap();
    fs.unlink(ROOT_INO, b"f000").unwrap();
    assert!(fs.getattr(victim.ino).is_err());
    fs.sync().unwrap();
    let n = fs
        .create(ROOT_INO, b"after", 0o100644, 0, Creds::ROOT)
        .unwrap();
    assert_eq!(fs.write(n.ino, 0, &[1u8; 100_000]).unwrap(), 100_000);
    fs.fsync(n.ino, false).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    common::assert_fsck_clean(&img);

    let fs = Fs::open(&img, &opts(true)).unwrap();
    for (f, chunks) in files.iter().enumerate().skip(1) {
        let name = format!("f{f:03}");
        let a = fs.lookup(ROOT_INO, name.as_bytes()).unwrap();
        let total: usize = chunks.iter().sum();
        assert_eq!(a.size, total as u64, "file {name} size");
        for (c, &len) in chunks.iter().enumerate() {
            let got = fs.read(a.ino, (c * CH) as u64, len as u32).unwrap();
            assert!(
                got == chunk(f as u64, c as u64, CH)[..len],
                "file {name} chunk {c} differs after ENOSPC"
            );
        }
    }
    assert!(fs.lookup(ROOT_INO, b"f000").is_err());
    assert_eq!(
        fs.read(fs.lookup(ROOT_INO, b"after").unwrap().ino, 0, 200_000)
            .unwrap(),
        vec![1u8; 100_000]
    );
}

/// The kernel's ext4, on ENOSPC with blocks freed in the running transaction, forces a commit
/// and retries (ext4_should_retry_alloc). Space freed by an unlink must be usable without the
/// caller having to sync first.
#[test]
fn enospc_space_freed_by_unlink_is_usable_without_sync() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkimage(dir.path(), "full2.img", 16, &[]);
    let fs = Fs::open(&img, &opts(false)).unwrap();
    let files = fill(&fs);
    assert!(files[0].iter().sum::<usize>() == 8 * CH);
    fs.unlink(ROOT_INO, b"f000").unwrap();
    let n = fs
        .create(ROOT_INO, b"after", 0o100644, 0, Creds::ROOT)
        .unwrap();
    let w = fs.write(n.ino, 0, &[1u8; 1 << 20]);
    assert!(
        matches!(w, Ok(n) if n == 1 << 20),
        "after freeing 2 MiB, a 1 MiB write gave {w:?} (freed blocks wait for a commit that nobody forces)"
    );
    fs.unmount().unwrap();
    drop(fs);
    common::assert_fsck_clean(&img);
}

/// Goal: running out of inodes ends in NoSpace with every free inode used, failed creates leave no
/// entries, a freed inode is reusable, and everything reads back after a remount.
#[test]
fn enospc_inodes() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkimage(dir.path(), "few.img", 16, &["-N", "48"]);
    let fs = Fs::open(&img, &opts(false)).unwrap();
    let free0 = fs.statfs().unwrap().files_free;
    assert!(free0 < 200, "mkfs -N 48 gave {free0} free inodes");
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, Creds::ROOT).unwrap();
    let mut made = 0u64;
    loop {
        match fs.create(
            d.ino,
            format!("n{made}").as_bytes(),
            0o100644,
            0,
            Creds::ROOT,
        ) {
            Ok(a) => {
                fs.write(a.ino, 0, format!("content {made}").as_bytes())
                    .unwrap();
                made += 1;
            }
            Err(FsError::NoSpace) => break,
            Err(e) => panic!("create #{made}: {e}"),
        }
        assert!(
            made <= free0,
            "created more files than there were free inodes"
        );
    }
    assert_eq!(
        made,
        free0 - 1,
        "every free inode (less the directory's) was usable"
    );
    assert_eq!(fs.statfs().unwrap().files_free, 0);
    assert!(matches!(
        fs.mkdir(ROOT_INO, b"x", 0o755, Creds::ROOT),
        Err(FsError::NoSpace)
    ));
    assert!(matches!(
        fs.symlink(ROOT_INO, b"y", b"t", Creds::ROOT),
        Err(FsError::NoSpace)
    ));
    assert!(
        fs.lookup(ROOT_INO, b"x").is_err() && fs.lookup(ROOT_INO, b"y").is_err(),
        "failed creates left entries"
    );
    // Hard links need no inode.
    let a = fs.lookup(d.ino, b"n0").unwrap();
    fs.link(a.ino, ROOT_INO, b"hard").unwrap();
    fs.unlink(d.ino, b"n1").unwrap();
    fs.create(d.ino, b"again", 0o100644, 0, Creds::ROOT)
        .expect("a freed inode is reusable");
    fs.sync().unwrap();
    fs.unmount().unwrap();
    drop(fs);
    common::assert_fsck_clean(&img);

    let fs = Fs::open(&img, &opts(true)).unwrap();
    for i in 0..made {
        let r = fs.lookup(d.ino, format!("n{i}").as_bytes());
        if i == 1 {
            assert!(r.is_err());
            continue;
        }
        let a = r.unwrap();
        assert_eq!(
            fs.read(a.ino, 0, 100).unwrap(),
            format!("content {i}").as_bytes()
        );
    }
    assert_eq!(fs.lookup(ROOT_INO, b"hard").unwrap().nlink, 2);
}

/// Goal: `write` and `read` of an inode that is not a regular file — a symbolic link (fast,
/// in the inode, or slow, in a block of its own), a device node, a fifo — are refused
/// (EINVAL; EISDIR for a directory) and change nothing: a slow link's block holds its target,
/// so a write went into the target and past it changed the link's size, which `e2fsck`
/// then found invalid. Method: each kind on a fresh image, written and read through the
/// library, then the target read back and the image checked with the real `e2fsck -fn`.
#[test]
fn writes_and_reads_of_special_files_are_refused() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = fresh(dir.path(), "special.img");
    let fs = Fs::open(&image, &MountOptions::default()).unwrap();
    let creds = Creds::ROOT;
    let short = b"target".to_vec();
    let long = vec![b't'; 3000];
    let fast = fs.symlink(ROOT_INO, b"fast", &short, creds).unwrap().ino;
    let slow = fs.symlink(ROOT_INO, b"slow", &long, creds).unwrap().ino;
    let node = fs
        .create(ROOT_INO, b"node", 0o020644, 0x0801, creds)
        .unwrap()
        .ino;
    let fifo = fs
        .create(ROOT_INO, b"fifo", 0o010644, 0, creds)
        .unwrap()
        .ino;
    let sub = fs.mkdir(ROOT_INO, b"sub", 0o755, creds).unwrap().ino;
    for (what, ino) in [
        ("fast link", fast),
        ("slow link", slow),
        ("node", node),
        ("fifo", fifo),
    ] {
        for offset in [0, 5000] {
            let w = fs.write(ino, offset, b"data");
            assert!(
                matches!(w, Err(FsError::Invalid(_))),
                "write to a {what} at {offset}: {w:?}"
            );
        }
        let r = fs.read(ino, 0, 4096);
        assert!(
            matches!(r, Err(FsError::Invalid(_))),
            "read of a {what}: {r:?}"
        );
    }
    assert!(matches!(fs.write(sub, 0, b"data"), Err(FsError::IsDir)));
    assert!(matches!(fs.read(sub, 0, 10), Err(FsError::IsDir)));
    assert_eq!(fs.readlink(fast).unwrap(), short);
    assert_eq!(fs.readlink(slow).unwrap(), long);
    fs.unmount().unwrap();
    common::assert_fsck_clean(&image);
}

/// Goal: a superblock whose geometry cannot be a file system tidefs can hold — block counts
/// that make billions of block groups, fewer blocks or inodes per group than e2fsck allows —
/// is refused as corrupt, naming the field, without a panic (an overflowing product of
/// inodes per group and groups once did) and without trying to allocate a summary per group.
/// Method: fields of a fresh image's superblock changed one case at a time, checksum fixed.
#[test]
fn impossible_group_geometry_is_refused() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let put = |b: &mut Vec<u8>, off: usize, v: u32| {
        b[SB + off..SB + off + 4].copy_from_slice(&v.to_le_bytes());
    };
    // (what, edits as (offset, value), a word the message names)
    type Case<'a> = (&'a str, &'a [(usize, u32)], &'a str);
    let cases: [Case; 4] = [
        (
            "2^52 blocks in groups of 8",
            &[(0x150, 0x0010_0000), (0x04, 0), (0x20, 8), (0x28, 32768)],
            "groups",
        ),
        (
            "2^63 blocks in groups of 1",
            &[(0x150, 0x8000_0000), (0x04, 0), (0x20, 1), (0x28, 2)],
            "blocks per group",
        ),
        ("4 blocks per group", &[(0x20, 4)], "blocks per group"),
        ("one inode per group", &[(0x28, 1)], "inodes per group"),
    ];
    for (i, (what, edits, word)) in cases.iter().enumerate() {
        let img = fresh(dir.path(), &format!("g{i}.img"));
        edit(&img, |b| {
            for &(off, v) in edits.iter() {
                put(b, off, v);
            }
            fix_sb_csum(b);
        });
        eprintln!("{what}:");
        assert_refused(&img, &[false, true], is_corrupt, &[word]);
    }
}

/// Goal: when the primary superblock is damaged, a backup in group 1 that does not hold up —
/// one marked as an external journal device with a first data block past the block count,
/// which once made the group count underflow and panic — is not adopted: the primary's
/// damage is the error, and the image is left as it was. Method: an image of two groups, the
/// primary's checksum broken, the backup's fields changed with its checksum fixed.
#[test]
fn a_damaged_primary_with_a_bad_backup_is_refused() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkimage(dir.path(), "b.img", 32, &["-g", "4096"]);
    edit(&img, |b| {
        // The backup superblock of group 1 starts at block 4096.
        let at = 4096 * 4096;
        let backup = &mut b[at - SB..];
        or_u32(backup, SB + 0x60, 0x8);
        backup[SB + 0x14..SB + 0x18].copy_from_slice(&u32::MAX.to_le_bytes());
        fix_sb_csum(backup);
        b[SB + 0x3FC] ^= 0x5A;
    });
    assert_refused(&img, &[false, true], is_corrupt, &["checksum"]);
}

/// Goal: a superblock asking new inodes for an extra size that is not a multiple of 4, or
/// that does not fit the inode, still gets inodes that tidefs and e2fsck accept (the kernel
/// clamps it the same way): once, every file made afterwards read back as corrupt. Method:
/// `s_want_extra_isize` of a fresh image set to 34, then to 200 (256-byte inodes); files
/// made, caches dropped, read back; the real `e2fsck -fn` on the image.
#[test]
fn odd_wanted_extra_inode_sizes_give_valid_inodes() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for want in [34u16, 200] {
        let img = fresh(dir.path(), &format!("x{want}.img"));
        edit(&img, |b| {
            b[SB + 0x15E..SB + 0x160].copy_from_slice(&want.to_le_bytes());
            fix_sb_csum(b);
        });
        let fs = Fs::open(&img, &opts(false)).unwrap();
        let f = fs
            .create(ROOT_INO, b"f", 0o100644, 0, Creds::ROOT)
            .unwrap()
            .ino;
        fs.write(f, 0, b"kept").unwrap();
        fs.drop_caches().unwrap();
        assert_eq!(fs.read(f, 0, 10).unwrap(), b"kept", "want {want}");
        fs.unmount().unwrap();
        let out = std::process::Command::new("e2fsck")
            .arg("-fn")
            .arg(&img)
            .output()
            .unwrap();
        // e2fsck objects to the superblock's wish itself, but not to the inode made.
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            !text.contains("extra size"),
            "want {want}: e2fsck finds an inode's extra size invalid:\n{text}"
        );
    }
}

/// Goal: the geometry checks accept the unusual shapes `mkfs.ext4` makes: 1 KiB blocks,
/// 128-byte inodes, small groups (1 024 blocks; smaller ones bring `meta_bg`, which tidefs
/// refuses by name) and few inodes. Method:
/// each image made, mounted, a directory and a file made in it, unmounted, checked with the
/// real `e2fsck -fn`.
#[test]
fn unusual_but_valid_geometries_mount() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let shapes: [&[&str]; 4] = [
        &["-b", "1024"],
        &["-I", "128"],
        &["-b", "1024", "-g", "1024", "-N", "2048"],
        &["-N", "64"],
    ];
    for (k, extra) in shapes.iter().enumerate() {
        let mut args = vec!["-O", "metadata_csum,64bit"];
        args.extend_from_slice(extra);
        let img = common::mkfs_raw(dir.path(), &format!("u{k}.img"), 32, &args);
        let fs =
            Fs::open(&img, &opts(false)).unwrap_or_else(|e| panic!("mkfs {extra:?}: refused: {e}"));
        let sub = fs.mkdir(ROOT_INO, b"sub", 0o755, Creds::ROOT).unwrap().ino;
        let f = fs.create(sub, b"f", 0o100644, 0, Creds::ROOT).unwrap().ino;
        fs.write(f, 0, &[3u8; 10_000]).unwrap();
        fs.unmount().unwrap();
        common::assert_fsck_clean(&img);
    }
}

/// Goal: a directory entry that names a reserved inode — the journal (8), the bad-blocks
/// inode (1) — is damage of that entry, not a file to open (through it the journal's inode
/// took writes, and inode 1 would have shown as a second root), and of that entry only, as
/// with the kernel: a lookup of its name, a create over it and its unlink fail as
/// corruption, while the directory is listed (the entry with it) and its other files are
/// found, read, created and removed. Method: the entries made with e2fsprogs' `debugfs ln`
/// beside a file in each directory; before, one such entry failed its whole directory.
#[test]
fn entries_naming_reserved_inodes_are_corruption_of_that_entry() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = fresh(dir.path(), "r.img");
    let fs = Fs::open(&img, &opts(false)).unwrap();
    for name in ["journal", "first"] {
        let d = fs
            .mkdir(ROOT_INO, name.as_bytes(), 0o755, Creds::ROOT)
            .unwrap()
            .ino;
        let f = fs
            .create(d, b"sibling", 0o100644, 0, Creds::ROOT)
            .unwrap()
            .ino;
        fs.write(f, 0, b"still here").unwrap();
    }
    fs.unmount().unwrap();
    drop(fs);
    for (name, ino) in [("journal", 8), ("first", 1)] {
        let out = std::process::Command::new("debugfs")
            .args(["-w", "-R", &format!("ln <{ino}> /{name}/entry")])
            .arg(&img)
            .output()
            .unwrap();
        assert!(out.status.success(), "debugfs: {out:?}");
    }
    let journal_inode = || {
        let out = std::process::Command::new("debugfs")
            .args(["-R", "stat <8>"])
            .arg(&img)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let journal_before = journal_inode();
    let fs = Fs::open(&img, &opts(false)).unwrap();
    fn corrupt<T: std::fmt::Debug>(r: &Result<T, FsError>, what: &str) {
        assert!(matches!(r, Err(FsError::Corrupt(_))), "{what}: {r:?}");
    }
    // The journal's attributes cached, as a library user or a walk by inode number does.
    fs.getattr(8).unwrap();
    for (name, ino) in [(&b"journal"[..], 8u64), (b"first", 1)] {
        let d = fs.lookup(ROOT_INO, name).unwrap().ino;
        corrupt(&fs.lookup(d, b"entry"), "lookup");
        // Again once the directory's index is published (lookups without the lock).
        fs.lookup(d, b"sibling").unwrap();
        corrupt(&fs.lookup(d, b"entry"), "lookup without the lock");
        // A change of the directory's journaling mode changes the files it governs, not
        // the inode the damaged entry names.
        fs.set_journal_mode(d, Some(DataMode::Journal)).unwrap();
        corrupt(
            &fs.create(d, b"entry", 0o100644, 0, Creds::ROOT),
            "create over it",
        );
        corrupt(&fs.unlink(d, b"entry"), "unlink");
        let mut listed = Vec::new();
        fs.readdir(d, 0, &mut |e| {
            listed.push((e.name.clone(), e.ino));
            true
        })
        .unwrap();
        assert!(listed.contains(&(b"entry".to_vec(), ino)), "{listed:?}");
        let sibling = fs.lookup(d, b"sibling").unwrap().ino;
        assert_eq!(fs.read(sibling, 0, 100).unwrap(), b"still here");
        fs.create(d, b"new", 0o100644, 0, Creds::ROOT).unwrap();
        fs.unlink(d, b"sibling").unwrap();
        // Not empty: the entry is there.
        let r = fs.rmdir(ROOT_INO, name);
        assert!(matches!(r, Err(FsError::NotEmpty)), "rmdir: {r:?}");
    }
    fs.unmount().unwrap();
    drop(fs);
    assert_eq!(
        journal_inode(),
        journal_before,
        "the journal's inode changed"
    );
}
