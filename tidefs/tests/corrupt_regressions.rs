//! Goal: each corruption a reviewer found gives `Corrupt` (or the ext4 behaviour the kernel has)
//! instead of a panic, a hang, silent data loss or a write onto metadata.
//!
//! Method: images from the real mkfs.ext4, populated through the library, are damaged one
//! structure at a time with the damaged structure's own checksum stored again (so the damage
//! reaches the validation under test rather than the checksum), then opened and used through
//! the library. Where the kernel's tools are the reference (journal replay), the same damaged
//! image is also given to `e2fsck -fy` and the results compared. Slow paths run under a hang
//! detector (a generous time budget, not a performance threshold).

mod common;
mod damage;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use tidefs::format::jbd2::{BlockHeader, BlockType, DescriptorBlock, JournalSuperblock, TagFormat};
use tidefs::fs::{Creds, Fs, MountOptions, RenameFlags, SetAttr, ROOT_INO};
use tidefs::FsError;

const BS: usize = 4096;

fn open(img: &Path) -> Fs {
    Fs::open(img, &MountOptions::default()).unwrap()
}

/// Runs `f` on another thread and fails the test if it has not finished within a minute: a
/// hang detector, far above the milliseconds the work takes.
fn within_a_minute<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("hung (or panicked) for a minute")
}

/// A fresh 32 MiB image with `/f` holding `blocks` blocks of 0xAB; returns (image, f's inode).
fn image_with_file(dir: &Path, name: &str, blocks: usize) -> (PathBuf, u32) {
    let img = common::mkimage(dir, name, 32, &[]);
    let fs = open(&img);
    let f = fs.create(ROOT_INO, b"f", 0o100644, 0, Creds::ROOT).unwrap();
    fs.write(f.ino, 0, &vec![0xAB; blocks * BS]).unwrap();
    fs.unmount().unwrap();
    (img, u32::try_from(f.ino).unwrap())
}

/// Sets field `at` (byte offset inside `i_block`) of the inode's root extent node.
fn poke_i_block(img: &Path, ino: u32, at: usize, bytes: &[u8]) {
    damage::edit(img, |b| {
        damage::edit_inode(b, ino, |i| {
            i.i_block_mut()[at..at + bytes.len()].copy_from_slice(bytes)
        })
    });
}

#[test]
fn zero_length_extent_is_corrupt_not_a_panic() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (img, ino) = image_with_file(dir.path(), "zero.img", 3);
    // First extent entry at 12: ee_block u32, ee_len u16 (at 16).
    poke_i_block(&img, ino, 16, &0u16.to_le_bytes());
    let fs = open(&img);
    let n = u64::from(ino);
    assert!(damage::is_corrupt(&fs.read(n, 0, 4096)));
    assert!(damage::is_corrupt(&fs.write(n, 0, b"x")));
    let shrink = SetAttr {
        size: Some(100),
        ..SetAttr::default()
    };
    assert!(damage::is_corrupt(&fs.setattr(n, &shrink)));
    assert!(damage::is_corrupt(&fs.fallocate(n, 0, 1 << 20, false)));
    let e = fs.write(n, 0, b"x").unwrap_err();
    assert!(e.to_string().contains(&format!("inode {ino}")), "{e}");
    assert!(e.to_string().contains("length 0"), "{e}");
    fs.unmount().unwrap();
}

#[test]
fn extent_pointing_at_the_journal_or_an_inode_table_is_refused() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for target in ["journal", "inode table"] {
        let (img, ino) = image_with_file(dir.path(), "aim.img", 2);
        let bytes = std::fs::read(&img).unwrap();
        let (_, _, itable) = damage::group_blocks(&bytes, 0);
        let itable_blocks = (damage::superblock(&bytes).inodes_per_group() as usize * 256) / BS;
        let block = match target {
            // The middle of the journal: far from what this session's commits touch.
            "journal" => (damage::journal_block_offset(&bytes, 500) / BS) as u64,
            // The last block of group 0's inode table holds no inode in use.
            _ => itable + itable_blocks as u64 - 1,
        };
        let at = block as usize * BS;
        let before = bytes[at..at + BS].to_vec();
        // ee_start_hi u16 at 18, ee_start_lo u32 at 20.
        poke_i_block(&img, ino, 18, &0u16.to_le_bytes());
        poke_i_block(&img, ino, 20, &u32::try_from(block).unwrap().to_le_bytes());
        let fs = open(&img);
        let e = fs.write(u64::from(ino), 0, &[0x5A; BS]).unwrap_err();
        assert!(matches!(e, FsError::Corrupt(_)), "{target}: {e:?}");
        assert!(e.to_string().contains(target), "{target}: {e}");
        assert!(damage::is_corrupt(&fs.read(u64::from(ino), 0, 10)));
        fs.unmount().unwrap();
        let after = std::fs::read(&img).unwrap();
        assert!(
            after[at..at + BS] == before[..],
            "{target} block {block} was overwritten"
        );
    }
}

/// Clears bits of group 0's block (or inode) bitmap, leaving its checksum stale.
fn clear_bitmap_bits(img: &Path, inode: bool, bits: &[u64]) {
    damage::edit(img, |b| {
        let (bb, ib, _) = damage::group_blocks(b, 0);
        let at = if inode { ib } else { bb } as usize * BS;
        for bit in bits {
            b[at + *bit as usize / 8] &= !(1 << (bit % 8));
        }
    });
}

#[test]
fn bitmap_with_cleared_bits_and_bad_checksum_is_not_trusted() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (img, ino) = image_with_file(dir.path(), "bitmap.img", 8);
    let (_, runs) = damage::tree_blocks(&std::fs::read(&img).unwrap(), ino);
    assert!(!runs.is_empty());
    let bits: Vec<u64> = runs
        .iter()
        .flat_map(|(start, len)| *start..start + u64::from(*len))
        .collect();
    // Group 0 starts at block 0 with 4 KiB blocks.
    clear_bitmap_bits(&img, false, &bits);
    let fs = open(&img);
    let g = fs.create(ROOT_INO, b"g", 0o100644, 0, Creds::ROOT).unwrap();
    // The write lands in the page cache; allocation happens at write-back, where the damaged
    // bitmap is found. The only group is damaged, so the commit fails and names it, and the
    // file system stops taking changes.
    fs.write(g.ino, 0, &vec![0xCD; 8 * BS]).unwrap();
    let e = fs.fsync(g.ino, false).unwrap_err();
    assert!(matches!(e, FsError::Corrupt(_)), "{e:?}");
    assert!(e.to_string().contains("block bitmap"), "{e}");
    assert!(e.to_string().contains("group 0"), "{e}");
    assert!(fs.unmount().is_err(), "unmount must report the error");
    drop(fs);
    let fs = open(&img);
    let data = fs.read(u64::from(ino), 0, (8 * BS) as u32).unwrap();
    assert!(data.iter().all(|b| *b == 0xAB), "f was overwritten");
    fs.unmount().unwrap();
}

/// Journal positions of the data blocks of each transaction in the log, oldest first.
fn logged_data_blocks(img: &[u8]) -> Vec<Vec<usize>> {
    let jsb = common::journal_sb_offset(img);
    let sb = JournalSuperblock::parse(&img[jsb..jsb + 1024]).unwrap();
    let format = TagFormat::from_incompat(sb.feature_incompat);
    let block = |n: u32| {
        let at = damage::journal_block_offset(img, n);
        &img[at..at + BS]
    };
    let mut out = vec![Vec::new()];
    let mut n = sb.start_block;
    let mut tid = sb.sequence;
    for _ in 0..sb.len_blocks {
        let Ok(h) = BlockHeader::parse(block(n)) else {
            break;
        };
        if h.sequence != tid {
            break;
        }
        match h.block_type {
            BlockType::Descriptor => {
                let d = DescriptorBlock::parse(block(n), format).unwrap();
                for _ in &d.tags {
                    n += 1;
                    // OK to unwrap: `out` starts non-empty and only grows.
                    out.last_mut()
                        .unwrap()
                        .push(damage::journal_block_offset(img, n));
                }
            }
            BlockType::Commit => {
                tid += 1;
                out.push(Vec::new());
            }
            _ => {}
        }
        n += 1;
        if n >= sb.len_blocks {
            n = sb.first_log_block;
        }
    }
    out.pop();
    out
}

#[test]
fn bad_journal_data_block_skips_only_that_block() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkimage(dir.path(), "forty.img", 32, &[]);
    let fs = Fs::open(
        &img,
        &MountOptions {
            deterministic_writes: true,
            ..MountOptions::default()
        },
    )
    .unwrap();
    for i in 0..40 {
        let f = fs
            .create(
                ROOT_INO,
                format!("f{i:02}").as_bytes(),
                0o100644,
                0,
                Creds::ROOT,
            )
            .unwrap();
        fs.write(f.ino, 0, format!("file {i}").as_bytes()).unwrap();
        fs.fsync(f.ino, false).unwrap();
    }
    fs.crash();
    drop(fs);
    damage::edit(&img, |b| {
        let txns = logged_data_blocks(b);
        assert!(
            txns.len() >= 40,
            "only {} transactions in the log",
            txns.len()
        );
        let victim = txns[2][0];
        b[victim + 100] ^= 0xFF;
    });
    // The reference: e2fsck -fy replays the same damaged journal.
    let reference = dir.path().join("reference.img");
    std::fs::copy(&img, &reference).unwrap();
    let out = std::process::Command::new("e2fsck")
        .arg("-fy")
        .arg(&reference)
        .output()
        .unwrap();
    eprintln!("e2fsck -fy: {}", String::from_utf8_lossy(&out.stdout));
    let ro = MountOptions {
        read_only: true,
        ..MountOptions::default()
    };
    let theirs = {
        let fs = Fs::open(&reference, &ro).unwrap();
        damage::names(&fs, ROOT_INO).unwrap()
    };
    let fs = open(&img);
    let report = fs.recovery_report().unwrap();
    assert_eq!(report.corrupt_blocks, 1, "{report:?}");
    assert_eq!(report.failed_commit, None);
    let ours = damage::names(&fs, ROOT_INO).unwrap();
    fs.unmount().unwrap();
    let kept = ours.iter().filter(|n| n.starts_with(b"f")).count();
    assert_eq!(kept, 40, "tidefs kept {kept} of the 40 fsync'd files");
    assert_eq!(ours, theirs, "tidefs and e2fsck -fy replayed differently");
}

#[test]
fn corrupted_journal_uuid_is_an_error_not_a_clean_journal() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkimage(dir.path(), "uuid.img", 32, &[]);
    let fs = open(&img);
    let f = fs.create(ROOT_INO, b"f", 0o100644, 0, Creds::ROOT).unwrap();
    fs.fsync(f.ino, false).unwrap();
    fs.crash();
    drop(fs);
    let pristine = std::fs::read(&img).unwrap();
    // With the superblock checksum stored again, the UUID seeds every log checksum wrongly.
    for rechecksum in [true, false] {
        std::fs::write(&img, &pristine).unwrap();
        damage::edit(&img, |b| {
            let at = common::journal_sb_offset(b);
            let mut sb = JournalSuperblock::parse(&b[at..at + 1024]).unwrap();
            assert!(sb.start_block != 0, "the journal should need recovery");
            assert!(sb.has_csum_v2_or_v3());
            if rechecksum {
                sb.uuid[3] ^= 0x40;
                sb.write(&mut b[at..at + 1024]);
            } else {
                b[at + 0x30 + 3] ^= 0x40;
            }
        });
        match Fs::open(&img, &MountOptions::default()) {
            Ok(fs) => panic!(
                "opened with a corrupt journal UUID: {:?}",
                fs.recovery_report()
            ),
            Err(e) => {
                assert!(matches!(e, FsError::Corrupt(_)), "{e:?}");
                eprintln!("rechecksum={rechecksum}: {e}");
            }
        }
        assert!(tidefs::fs::recover_image(&img, None).is_err());
    }
}

#[test]
fn directory_claiming_a_terabyte_fails_fast() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkimage(dir.path(), "bigdir.img", 32, &[]);
    let fs = open(&img);
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, Creds::ROOT).unwrap();
    fs.create(d.ino, b"x", 0o100644, 0, Creds::ROOT).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let d = u32::try_from(d.ino).unwrap();
    for (size, valid) in [(1u64 << 40, false), ((1u64 << 31) - BS as u64, true)] {
        damage::edit(&img, |b| damage::edit_inode(b, d, |i| i.set_size(size)));
        let img = img.clone();
        within_a_minute(move || {
            let fs = open(&img);
            let listed = damage::names(&fs, u64::from(d));
            if valid {
                // A size within the bound, but only one block mapped: only that block is read.
                assert_eq!(listed.unwrap(), vec![b"x".to_vec()]);
            } else {
                assert!(damage::is_corrupt(&listed), "{listed:?}");
                assert!(damage::is_corrupt(&fs.lookup(u64::from(d), b"x")));
                let e = fs.getattr(u64::from(d)).unwrap_err();
                assert!(e.to_string().contains("i_size"), "{e}");
            }
            fs.unmount().unwrap();
        });
    }
}

#[test]
fn file_larger_than_the_format_allows_is_corrupt() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (img, ino) = image_with_file(dir.path(), "huge.img", 1);
    let max = ((1u64 << 32) - 1) * BS as u64;
    for (size, valid) in [(max + 1, false), (u64::MAX, false), (max, true)] {
        damage::edit(&img, |b| damage::edit_inode(b, ino, |i| i.set_size(size)));
        let fs = open(&img);
        let n = u64::from(ino);
        if valid {
            assert_eq!(fs.getattr(n).unwrap().size, max);
            assert_eq!(fs.read(n, max - 10, 100).unwrap(), vec![0; 10]);
        } else {
            let e = fs.read(n, 0, 10).unwrap_err();
            assert!(e.to_string().contains("bad i_size"), "{e}");
            assert!(damage::is_corrupt(&fs.getattr(n)));
        }
        fs.unmount().unwrap();
    }
}

#[test]
fn link_counts_at_the_limit() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (img, ino) = image_with_file(dir.path(), "links.img", 1);
    let fs = open(&img);
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, Creds::ROOT).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let d = u32::try_from(d.ino).unwrap();
    // (links on disk, links after one more subdirectory): dir_nlink turns a count that would
    // reach 65000 into 1, whatever the disk said.
    for (links, after) in [(64_997u16, 64_998u32), (64_999, 1), (65_535, 1), (1, 1)] {
        damage::edit(&img, |b| {
            damage::edit_inode(b, ino, |i| i.set_links_count(65_535));
            damage::edit_inode(b, d, |i| i.set_links_count(links));
        });
        let fs = open(&img);
        let e = fs.link(u64::from(ino), ROOT_INO, b"more").unwrap_err();
        assert!(matches!(e, FsError::TooManyLinks), "{e:?}");
        let sub = fs.mkdir(u64::from(d), b"sub", 0o755, Creds::ROOT).unwrap();
        assert_eq!(
            fs.getattr(u64::from(d)).unwrap().nlink,
            after,
            "from {links}"
        );
        fs.rmdir(u64::from(d), b"sub").unwrap();
        let _ = sub;
        fs.unmount().unwrap();
    }
}

#[test]
fn directory_size_ending_inside_its_blocks_is_corrupt() {
    // Found by fuzz_images: appending a block at the size would have reused a mapped block.
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkimage(dir.path(), "short.img", 32, &[]);
    let fs = open(&img);
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, Creds::ROOT).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let d = u32::try_from(d.ino).unwrap();
    damage::edit(&img, |b| damage::edit_inode(b, d, |i| i.set_size(0)));
    let fs = open(&img);
    let r = fs.create(u64::from(d), b"y", 0o100644, 0, Creds::ROOT);
    assert!(damage::is_corrupt(&r), "{r:?}");
    // Found before the create's first change: an error for that directory only, the file
    // system stays writable (found after it, the file system went into its error state).
    assert_eq!(fs.stats().failed_after_change, 0);
    fs.mkdir(ROOT_INO, b"e", 0o755, Creds::ROOT).unwrap();
    let r = fs.rename(ROOT_INO, b"e", u64::from(d), b"e", RenameFlags::default());
    assert!(damage::is_corrupt(&r), "{r:?}");
    assert_eq!(fs.stats().failed_after_change, 0);
    fs.unmount().unwrap();
}

#[test]
fn inode_bitmap_with_a_cleared_bit_and_bad_checksum_is_not_trusted() {
    // Trusting it would hand out the inode of /f again, overwriting it.
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (img, ino) = image_with_file(dir.path(), "ibitmap.img", 1);
    clear_bitmap_bits(&img, true, &[u64::from(ino - 1)]);
    let fs = open(&img);
    let e = fs
        .create(ROOT_INO, b"g", 0o100644, 0, Creds::ROOT)
        .unwrap_err();
    assert!(e.to_string().contains("inode bitmap"), "{e}");
    let data = fs.read(u64::from(ino), 0, BS as u32).unwrap();
    assert!(data.iter().all(|b| *b == 0xAB));
    fs.unmount().unwrap();
}
