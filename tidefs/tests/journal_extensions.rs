//! Goal: the compatibility rule of tidefs's journal extension records (docs/FORMAT.md §5):
//! while byte-range records or compact commits are live in the log, the journal superblock
//! carries tidefs's incompat bit, so `e2fsck` and the kernel refuse the image instead of
//! replaying it wrongly; after tidefs's recovery the image is plain ext4 again (`e2fsck -fn`
//! clean, the kernel mounts it) and holds the ranges applied.
//!
//! Method: a real `mkfs.ext4` image with a file written by tidefs; the file's data blocks are
//! then patched through the journal alone (compact commits of byte ranges, a block-layout
//! transaction with a full block and a range block), and the journal is dropped as at a power
//! cut with the ext4 `needs_recovery` flag set. `e2fsck -fn` and `mount -t ext4 -o ro` must
//! refuse the crashed image; `tidefs::fs::recover_image` replays it; then `e2fsck -fn` is clean,
//! the kernel mounts it read-only and reads the patched content, and tidefs reads it too.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use tidefs::fs::{Creds, Fs, MountOptions, ROOT_INO};
use tidefs::journal::{
    dump_image, open_image, CommitRequest, DumpLayout, JournalOptions, RangeUpdate, TagKind,
};

const BS: usize = 4096;
const FILE_BLOCKS: usize = 4;

fn original() -> Vec<u8> {
    (0..FILE_BLOCKS * BS).map(|i| (i % 251) as u8).collect()
}

/// Physical block of logical block `n` of inode `ino`, by debugfs.
fn bmap(image: &Path, ino: u64, n: usize) -> u64 {
    let out = common::run_ok(
        "debugfs",
        &["-R", &format!("bmap <{ino}> {n}"), image.to_str().unwrap()],
    );
    out.trim().parse().unwrap_or_else(|_| panic!("bmap: {out}"))
}

/// Runs `e2fsck -fn`; returns (exit code, stdout + stderr).
fn e2fsck_n(image: &Path) -> (i32, String) {
    let out = Command::new("e2fsck")
        .arg("-fn")
        .arg(image)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// The patches: (logical block of the file, offset, bytes), one commit per inner list.
fn patches() -> Vec<Vec<(usize, usize, Vec<u8>)>> {
    vec![
        vec![(0, 100, b"RANGE-ONE".to_vec())],
        vec![(0, 2000, b"two".to_vec()), (1, 0, vec![0xAA; 16])],
        vec![(2, 4000, vec![0x55; 96])],
    ]
}

#[test]
fn kernel_and_e2fsck_refuse_extension_records_until_tidefs_recovers() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = common::mkimage(dir.path(), "ext.img", 64, &[]);
    // A file of FILE_BLOCKS blocks, written by tidefs, cleanly unmounted.
    let ino = {
        let fs = Fs::open(&image, &MountOptions::default()).unwrap();
        let a = fs
            .create(ROOT_INO, b"f", 0o100_644, 0, Creds::ROOT)
            .unwrap();
        fs.write(a.ino, 0, &original()).unwrap();
        fs.unmount().unwrap();
        a.ino
    };
    common::assert_fsck_clean(&image);
    let blocks: Vec<u64> = (0..FILE_BLOCKS).map(|n| bmap(&image, ino, n)).collect();
    // As a mount would leave it: the ext4 superblock says the journal needs recovery.
    common::run_ok(
        "debugfs",
        &[
            "-w",
            "-R",
            "feature needs_recovery",
            image.to_str().unwrap(),
        ],
    );

    // Patch the file through the journal alone, then crash.
    let mut expect = original();
    {
        let opts = JournalOptions {
            csum_v3: true,
            tags_64bit: true,
            ..JournalOptions::default()
        };
        let j = open_image(&image, None, opts).unwrap();
        j.hold_checkpoints(true);
        for (t, commit) in patches().into_iter().enumerate() {
            let mut ranges = Vec::new();
            for (n, off, bytes) in commit {
                let at = n * BS + off;
                expect[at..at + bytes.len()].copy_from_slice(&bytes);
                ranges.push(RangeUpdate {
                    home: blocks[n],
                    data: expect[n * BS..(n + 1) * BS].to_vec().into(),
                    ranges: vec![(off as u32, bytes.len() as u32)],
                });
            }
            let mut req = CommitRequest {
                ranges,
                ..CommitRequest::default()
            };
            if t == 1 {
                // A block-layout transaction too: a full block beside the ranges.
                let n = 3;
                expect[n * BS..(n + 1) * BS].fill(0x3C);
                req.blocks
                    .push((blocks[n], expect[n * BS..(n + 1) * BS].to_vec().into()));
                // Enough range records that they do not fit a compact commit.
                for k in 0..120usize {
                    let at = BS + 100 + k * 19;
                    expect[at..at + 7].copy_from_slice(b"many-rr");
                }
                let data: Arc<[u8]> = expect[BS..2 * BS].to_vec().into();
                let mut rs: Vec<(u32, u32)> = vec![(0, 16)];
                rs.extend((0..120u32).map(|k| (100 + k * 19, 7)));
                req.ranges.retain(|r| r.home != blocks[1]);
                req.ranges.push(RangeUpdate {
                    home: blocks[1],
                    data,
                    ranges: rs,
                });
            }
            j.commit(req).unwrap();
        }
        assert_eq!(j.stats().compact_commits, 2);
        assert!(j.stats().range_records >= 4);
        j.stop_background();
        // Dropped without close: a power cut.
    }
    let dump = dump_image(&image, None).unwrap();
    assert!(dump.extension_bit);
    assert_eq!(dump.transactions.len(), 3, "{dump:?}");
    assert_eq!(dump.transactions[0].layout, DumpLayout::Compact);
    assert_eq!(dump.transactions[1].layout, DumpLayout::Block);
    assert!(dump.transactions[1]
        .tags
        .iter()
        .any(|t| t.kind == TagKind::Range && t.ranges.len() == 121));

    // e2fsck refuses the journal.
    let (code, text) = e2fsck_n(&image);
    assert_ne!(code, 0, "e2fsck -fn accepted the image:\n{text}");
    let lower = text.to_lowercase();
    assert!(
        lower.contains("journal") && lower.contains("feature"),
        "e2fsck's refusal names the journal features:\n{text}"
    );
    eprintln!("e2fsck -fn refuses, as it must (exit {code}):\n{text}");
    let crashed = std::fs::read(&image).unwrap();

    // The kernel refuses it too.
    let kernel = common::can_loop_mount();
    if kernel {
        match common::KernelMount::mount(&image, "ro") {
            Ok(m) => {
                m.umount();
                panic!("the kernel mounted an image with tidefs extension records");
            }
            Err(e) => eprintln!("the kernel refuses, as it must: {e}"),
        }
        assert_eq!(
            std::fs::read(&image).unwrap(),
            crashed,
            "the refused mount left the image untouched"
        );
    }

    // tidefs recovers it: plain ext4 again, with the ranges applied.
    let report = tidefs::fs::recover_image(&image, None).unwrap();
    assert_eq!(report.transactions, 3);
    assert!(report.range_records >= 4);
    let dump = dump_image(&image, None).unwrap();
    assert!(!dump.extension_bit && dump.start_block == 0);
    assert!(dump.transactions.is_empty());
    common::assert_fsck_clean(&image);
    {
        let ro = MountOptions {
            read_only: true,
            ..MountOptions::default()
        };
        let fs = Fs::open(&image, &ro).unwrap();
        let got = fs.read(ino, 0, (FILE_BLOCKS * BS) as u32).unwrap();
        assert!(got == expect, "tidefs reads the ranges applied");
    }
    if kernel {
        let m = common::KernelMount::mount(&image, "ro").unwrap();
        let got = std::fs::read(m.path().join("f")).unwrap();
        m.umount();
        assert!(got == expect, "the kernel reads the ranges applied");
    }
}
