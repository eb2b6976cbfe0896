//! Goal: every parser of on-disk bytes in `format/` returns `Ok` or `Corrupt` for any input —
//! never a panic — and what a writer produces parses back to the same value.
//!
//! Method: proptest. Each parser gets (a) arbitrary bytes of arbitrary length and (b) real
//! bytes from an image made by the real mkfs.ext4 and populated through the library (its
//! superblock, group descriptors, inodes, directory, extent and xattr blocks, journal
//! superblock) with a few random bytes overwritten. Writers get arbitrary values and must
//! round-trip. `TIDEFS_FUZZ_CASES` raises the number of cases per property (default 256).

mod common;
mod damage;

use std::sync::OnceLock;

use proptest::prelude::*;
use tidefs::format::ext4::dirent;
use tidefs::format::ext4::extent::{self, Extent, ExtentIndex, ExtentNode};
use tidefs::format::ext4::group_desc::GroupDescRef;
use tidefs::format::ext4::inode::Inode;
use tidefs::format::ext4::superblock::Superblock;
use tidefs::format::ext4::xattr::{self, Xattr};
use tidefs::format::jbd2::{
    ext, BlockHeader, CommitBlock, DescriptorBlock, JournalSuperblock, RevokeBlock, TagFormat,
};
use tidefs::fs::{Creds, Fs, MountOptions, XattrSetMode, ROOT_INO};

fn cases() -> u32 {
    std::env::var("TIDEFS_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

const TAG_FORMATS: [u32; 6] = [0, 0x2, 0x8, 0xA, 0x10, 0x12];

/// Real structures: (name, bytes) from a populated mkfs.ext4 image; empty without e2fsprogs.
fn samples() -> &'static Vec<(&'static str, Vec<u8>)> {
    static SAMPLES: OnceLock<Vec<(&'static str, Vec<u8>)>> = OnceLock::new();
    SAMPLES.get_or_init(|| {
        if !common::have_e2fsprogs() {
            return Vec::new();
        }
        let dir = tempfile::tempdir().unwrap();
        let img = common::mkimage(dir.path(), "samples.img", 16, &[]);
        let fs = Fs::open(&img, &MountOptions::default()).unwrap();
        let d = fs.mkdir(ROOT_INO, b"dir", 0o755, Creds::ROOT).unwrap();
        let f = fs.create(d.ino, b"file", 0o100644, 0, Creds::ROOT).unwrap();
        // Every other block: one extent each, enough for a tree with an index root.
        for k in 0..20u64 {
            fs.write(f.ino, k * 2 * 4096, &[k as u8; 100]).unwrap();
        }
        fs.setxattr(f.ino, b"user.big", &[7; 3000], XattrSetMode::Any)
            .unwrap();
        fs.setxattr(f.ino, b"user.small", b"v", XattrSetMode::Any)
            .unwrap();
        fs.unmount().unwrap();
        drop(fs);
        let b = std::fs::read(&img).unwrap();
        let bs = 4096;
        let block = |nr: u64| b[nr as usize * bs..(nr as usize + 1) * bs].to_vec();
        let ino = u32::try_from(f.ino).unwrap();
        let dino = u32::try_from(d.ino).unwrap();
        let (tree, _) = damage::tree_blocks(&b, ino);
        let (_, dir_runs) = damage::tree_blocks(&b, dino);
        let acl = damage::inode(&b, ino).file_acl();
        let jsb = common::journal_sb_offset(&b);
        let gdt = damage::desc_offset(&b, 0);
        let mut out = vec![
            ("superblock", b[1024..2048].to_vec()),
            ("group descriptor", b[gdt..gdt + 64].to_vec()),
            ("inode", damage::inode(&b, ino).as_bytes().to_vec()),
            ("dir inode", damage::inode(&b, dino).as_bytes().to_vec()),
            ("dir block", block(dir_runs[0].0)),
            ("xattr block", block(acl)),
            ("journal superblock", b[jsb..jsb + 1024].to_vec()),
        ];
        assert!(
            !tree.is_empty(),
            "the sample file should have an extent tree block"
        );
        out.extend(tree.iter().map(|t| ("extent block", block(*t))));
        out
    })
}

/// Feeds `bytes` to every parser; none may panic.
fn parse_everything(bytes: &[u8]) {
    let _ = Superblock::parse(bytes);
    let _ = Superblock::parse_checked(bytes, false);
    let _ = extent::parse_node(bytes);
    if bytes.len() >= extent::ENTRY_SIZE * 2 {
        let _ = extent::verify_tail_checksum(bytes, 1);
    }
    let _ = dirent::parse_block(bytes, bytes.len());
    if bytes.len() >= dirent::TAIL_SIZE {
        let _ = dirent::verify_tail_checksum(bytes, 1);
        let _ = dirent::verify_dx_checksum(bytes, 1);
        let _ = dirent::is_index_block(bytes, 1);
    }
    let _ = xattr::parse_inode_area(bytes);
    let _ = xattr::parse_block(bytes, Some(1), 5);
    let _ = xattr::parse_block(bytes, None, 5);
    if bytes.len() >= 128 {
        let i = Inode::from_bytes(&bytes[..128.max(bytes.len().min(1024) & !127)]);
        let _ = i.verify(Some(1), 12);
        let _ = (i.size(), i.links_count(), i.blocks_512(4096), i.file_acl());
        let _ = xattr::parse_inode_area(i.xattr_area());
    }
    if bytes.len() >= 64 {
        let d = GroupDescRef::new(&bytes[..64]);
        let _ = (d.block_bitmap(), d.inode_table(), d.compute_checksum(1, 0));
    }
    let _ = JournalSuperblock::parse(bytes);
    let _ = BlockHeader::parse(bytes);
    let _ = CommitBlock::parse(bytes);
    for incompat in TAG_FORMATS {
        let format = TagFormat::from_incompat(incompat);
        let _ = DescriptorBlock::parse(bytes, format);
        let _ = RevokeBlock::parse(bytes, format);
    }
    let _ = ext::parse_compact(bytes, 1, 0, 4096);
    let _ = ext::parse_ranges_block(bytes, 1, 0);
    let _ = ext::parse_entries(bytes, 3, 4096);
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..5000)) {
        parse_everything(&bytes);
    }

    /// Arbitrary bytes behind a valid magic number, so the parsers get past their first check.
    #[test]
    fn arbitrary_bytes_behind_a_magic_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..5000),
        magic in 0usize..10,
    ) {
        let mut bytes = bytes;
        let plant: &[(usize, &[u8])] = match magic {
            0 => &[(0, &[0x0A, 0xF3])],
            1 => &[(0, &[0xC0, 0x3B, 0x39, 0x98]), (4, &[0, 0, 0, 1])],
            2 => &[(0, &[0xC0, 0x3B, 0x39, 0x98]), (4, &[0, 0, 0, 2])],
            3 => &[(0, &[0xC0, 0x3B, 0x39, 0x98]), (4, &[0, 0, 0, 4])],
            4 => &[(0, &[0xC0, 0x3B, 0x39, 0x98]), (4, &[0, 0, 0, 5])],
            5 => &[(0, &[0x00, 0x00, 0x02, 0xEA]), (8, &[1, 0, 0, 0])],
            6 => &[(0x38, &[0x53, 0xEF])],
            // tidefs's compact commit and range block, tid 0 (sector shift 9).
            7 => &[(0, &[0xC0, 0x3B, 0x39, 0x98, 0x74, 0x64, 0, 1, 0, 0, 0, 0]), (0x0E, &[9, 0])],
            8 => &[(0, &[0xC0, 0x3B, 0x39, 0x98, 0x74, 0x64, 0, 2, 0, 0, 0, 0])],
            _ => &[(0, &[0, 0, 0, 0]), (4, &[0, 0x10])],
        };
        for (at, v) in plant {
            if bytes.len() >= at + v.len() {
                bytes[*at..at + v.len()].copy_from_slice(v);
            }
        }
        parse_everything(&bytes);
    }

    #[test]
    fn mutated_real_bytes_never_panic(
        which in any::<prop::sample::Index>(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
    ) {
        let samples = samples();
        if samples.is_empty() {
            return Ok(());
        }
        let (_, original) = &samples[which.index(samples.len())];
        let mut bytes = original.clone();
        for (at, v) in &edits {
            let i = at.index(bytes.len());
            bytes[i] = *v;
        }
        parse_everything(&bytes);
    }

    #[test]
    fn extent_nodes_round_trip(
        leaf in any::<bool>(),
        depth in 1u16..=5,
        raw in proptest::collection::vec((any::<u32>(), 1u32..=32768, any::<u64>(), any::<bool>()), 0..=340),
    ) {
        let node = if leaf {
            ExtentNode::Leaf(raw.iter().map(|&(logical, len, physical, unwritten)| Extent {
                logical,
                len: if unwritten { len.min(32767) } else { len },
                physical: physical & 0xFFFF_FFFF_FFFF,
                unwritten,
            }).collect())
        } else {
            ExtentNode::Index {
                depth,
                entries: raw.iter().map(|&(logical, _, child, _)| ExtentIndex {
                    logical,
                    child: child & 0xFFFF_FFFF_FFFF,
                }).collect(),
            }
        };
        let mut block = vec![0u8; 4096];
        extent::write_node(&node, &mut block);
        extent::set_tail_checksum(&mut block, 9);
        prop_assert!(extent::verify_tail_checksum(&block, 9).is_ok());
        prop_assert_eq!(extent::parse_node(&block).unwrap(), node);
    }

    #[test]
    fn dir_records_round_trip(names in proptest::collection::vec(
        (1u32.., proptest::collection::vec(1u8..=255, 1..=255), 0u8..8), 1..12)) {
        let bs = 4096;
        let mut block = vec![0u8; bs];
        dirent::init_empty_block(&mut block, true);
        let end = dirent::records_end(bs, true);
        let mut off = 0;
        let mut fitted = Vec::new();
        for (k, (ino, name, ft)) in names.iter().enumerate() {
            let size = dirent::rec_size(name.len());
            if off + size > end {
                break;
            }
            let last = k + 1 == names.len() || off + size + dirent::rec_size(names[k + 1].1.len()) > end;
            let rec_len = if last { end - off } else { size };
            dirent::write_record(&mut block, off, *ino, rec_len, *ft, name);
            fitted.push((off, *ino, name.clone(), *ft));
            off += rec_len;
            if last {
                break;
            }
        }
        dirent::set_tail_checksum(&mut block, 3);
        prop_assert!(dirent::verify_tail_checksum(&block, 3).is_ok());
        let parsed = dirent::parse_block(&block, end).unwrap();
        let got: Vec<_> = parsed.iter().map(|r| (r.offset, r.inode, r.name.clone(), r.file_type)).collect();
        prop_assert_eq!(got, fitted);
    }

    #[test]
    fn xattr_block_round_trip(attrs in proptest::collection::vec(
        (1u8..=7, proptest::collection::vec(b'a'..=b'z', 1..20), proptest::collection::vec(any::<u8>(), 0..200)), 0..10)) {
        let mut attrs: Vec<Xattr> = attrs.into_iter().map(|(index, name, value)| Xattr { index, name, value }).collect();
        attrs.sort_by(|a, b| (a.index, &a.name).cmp(&(b.index, &b.name)));
        attrs.dedup_by(|a, b| a.index == b.index && a.name == b.name);
        prop_assume!(xattr::fits_in_block(&attrs, 4096));
        let mut block = vec![0u8; 4096];
        xattr::write_block(&mut block, &attrs, Some(11), 77);
        let mut parsed = xattr::parse_block(&block, Some(11), 77).unwrap();
        parsed.sort_by(|a, b| (a.index, &a.name).cmp(&(b.index, &b.name)));
        prop_assert_eq!(parsed, attrs);
    }

    #[test]
    fn journal_blocks_round_trip(
        sequence in any::<u32>(),
        incompat in prop::sample::select(TAG_FORMATS.to_vec()),
        homes in proptest::collection::vec(any::<u32>(), 1..50),
        sec in any::<u64>(),
    ) {
        let format = TagFormat::from_incompat(incompat);
        let entries: Vec<(u64, bool, u32)> = homes.iter().map(|h| (u64::from(*h), h % 3 == 0, h.rotate_left(7))).collect();
        let desc = DescriptorBlock::build(sequence, format, [5; 16], &entries);
        let mut b = vec![0u8; 4096];
        desc.write(&mut b);
        let parsed = DescriptorBlock::parse(&b, format).unwrap();
        prop_assert_eq!(parsed.tags.len(), desc.tags.len());
        for (p, d) in parsed.tags.iter().zip(&desc.tags) {
            prop_assert_eq!(p.home_block, d.home_block);
            prop_assert_eq!(p.escaped(), d.escaped());
        }
        let revoke = RevokeBlock { sequence, format, blocks: entries.iter().map(|e| e.0).collect() };
        let mut b = vec![0u8; 4096];
        revoke.write(&mut b);
        prop_assert_eq!(RevokeBlock::parse(&b, format).unwrap(), revoke);
        let commit = CommitBlock { sequence, chksum_type: 0, chksum_size: 0, flags: (sec & 1) as u8, chksum: [0; 8], commit_sec: sec, commit_nsec: 5 };
        let mut b = vec![0u8; 4096];
        commit.write(&mut b);
        prop_assert_eq!(CommitBlock::parse(&b).unwrap(), commit);
    }
}

#[test]
fn real_structures_round_trip() {
    for (name, bytes) in samples() {
        match *name {
            "superblock" => {
                let sb = Superblock::parse(bytes).unwrap();
                let mut out = vec![0u8; 1024];
                sb.write(&mut out);
                assert_eq!(&out, bytes, "{name}");
            }
            "journal superblock" => {
                let sb = JournalSuperblock::parse(bytes).unwrap();
                let mut out = vec![0u8; 1024];
                sb.write(&mut out);
                assert_eq!(JournalSuperblock::parse(&out).unwrap(), sb, "{name}");
            }
            "extent block" => {
                let node = extent::parse_node(bytes).unwrap();
                let mut out = vec![0u8; bytes.len()];
                extent::write_node(&node, &mut out);
                let t = out.len() - (out.len() - 12) % 12;
                assert_eq!(out[..t], bytes[..t], "{name}");
            }
            _ => parse_everything(bytes),
        }
    }
}
