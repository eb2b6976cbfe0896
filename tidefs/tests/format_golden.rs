//! Goal: the format layer reads exactly what the real e2fsprogs writes. Method: images made by
//! the real `mkfs.ext4` (1 KiB and 4 KiB blocks, with and without `metadata_csum`) are parsed
//! with `tidefs::format` and every field is compared with what `dumpe2fs` prints; checksums
//! must verify and writing a parsed structure back must give the original bytes. The journal
//! superblock is checked the same way, both fresh from mkfs and after tidefs has mounted the
//! image (when tidefs enables checksum v3, `dumpe2fs` must agree).

mod common;

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use tidefs::format::crc32c_raw;
use tidefs::format::ext4::dirent;
use tidefs::format::ext4::extent::{parse_node, write_node, ExtentNode};
use tidefs::format::ext4::group_desc::{
    bitmap_checksum, GroupDescRef, BG_BLOCK_UNINIT, BG_INODE_UNINIT,
};
use tidefs::format::ext4::inode::Inode;
use tidefs::format::ext4::inode_csum_seed;
use tidefs::format::ext4::superblock::{
    incompat, ro_compat, Superblock, SUPERBLOCK_OFFSET, SUPERBLOCK_SIZE,
};
use tidefs::format::jbd2::{self, JournalSuperblock};
use tidefs::fs::{Fs, MountOptions, ROOT_INO};

const UUID: &str = "6a1f9e3c-2b4d-4c8e-9f10-112233445566";
const HASH_SEED: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";

/// One mkfs configuration.
struct Config {
    block_size: u32,
    csum: bool,
}

const CONFIGS: [Config; 4] = [
    Config {
        block_size: 1024,
        csum: true,
    },
    Config {
        block_size: 4096,
        csum: true,
    },
    Config {
        block_size: 1024,
        csum: false,
    },
    Config {
        block_size: 4096,
        csum: false,
    },
];

fn make(dir: &Path, c: &Config) -> std::path::PathBuf {
    let bs = c.block_size.to_string();
    let features = if c.csum {
        "metadata_csum,64bit"
    } else {
        "^metadata_csum,64bit"
    };
    let ext = format!("lazy_itable_init=0,lazy_journal_init=0,hash_seed={HASH_SEED}");
    let name = format!("g{}-{}.img", c.block_size, c.csum);
    // 40 MiB: several groups with 1 KiB blocks (8 MiB each), one with 4 KiB blocks.
    common::mkfs_raw(
        dir,
        &name,
        40,
        &["-b", &bs, "-O", features, "-U", UUID, "-E", &ext],
    )
}

fn uuid_string(u: &[u8]) -> String {
    let h: Vec<String> = u.iter().map(|b| format!("{b:02x}")).collect();
    let h = h.concat();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn num(m: &HashMap<String, String>, k: &str) -> u64 {
    let v = m
        .get(k)
        .unwrap_or_else(|| panic!("dumpe2fs -h has no {k:?}"));
    v.split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap_or_else(|_| panic!("{k}: {v:?} is not a number"))
}

/// Names of the features set in `sb`, spelled as e2fsprogs spells them.
fn feature_names(sb: &Superblock) -> BTreeSet<String> {
    const COMPAT: &[(u32, &str)] = &[
        (0x1, "dir_prealloc"),
        (0x2, "imagic_inodes"),
        (0x4, "has_journal"),
        (0x8, "ext_attr"),
        (0x10, "resize_inode"),
        (0x20, "dir_index"),
        (0x200, "sparse_super2"),
        (0x400, "fast_commit"),
        (0x800, "stable_inodes"),
        (0x1000, "orphan_file"),
    ];
    let mut out = BTreeSet::new();
    for (bits, names) in [
        (sb.feature_compat(), COMPAT),
        (sb.feature_incompat(), incompat::NAMES),
        (sb.feature_ro_compat(), ro_compat::NAMES),
    ] {
        for bit in 0..32 {
            let m = 1u32 << bit;
            if bits & m != 0 {
                let n = names
                    .iter()
                    .find(|(b, _)| *b == m)
                    .map(|(_, n)| n.to_string());
                out.insert(n.unwrap_or_else(|| format!("unnamed bit {m:#x}")));
            }
        }
    }
    out
}

/// Per-group facts from the full `dumpe2fs` output.
#[derive(Debug, Default)]
struct DumpGroup {
    block_bitmap: u64,
    block_bitmap_csum: Option<u32>,
    inode_bitmap: u64,
    inode_bitmap_csum: Option<u32>,
    inode_table: u64,
    free_blocks: u32,
    free_inodes: u32,
    dirs: u32,
    csum: Option<u16>,
}

fn after<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.find(key).map(|i| &line[i + key.len()..])
}

fn first_num(s: &str) -> u64 {
    let d: String = s
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    d.parse().unwrap()
}

fn hex_after(s: &str, key: &str) -> Option<u64> {
    let rest = after(s, key)?;
    let h: String = rest.chars().take_while(char::is_ascii_hexdigit).collect();
    Some(u64::from_str_radix(&h, 16).unwrap())
}

fn dump_groups(image: &Path) -> Vec<DumpGroup> {
    let text = common::run_ok("dumpe2fs", &[image.to_str().unwrap()]);
    let mut groups: Vec<DumpGroup> = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("Group ") && t.contains("(Blocks") {
            let g = DumpGroup {
                csum: hex_after(t, "csum 0x").map(|v| v as u16),
                ..DumpGroup::default()
            };
            groups.push(g);
            continue;
        }
        let Some(g) = groups.last_mut() else { continue };
        if let Some(r) = after(t, "Block bitmap at ") {
            g.block_bitmap = first_num(r);
            g.block_bitmap_csum = hex_after(t, "csum 0x").map(|v| v as u32);
        } else if let Some(r) = after(t, "Inode bitmap at ") {
            g.inode_bitmap = first_num(r);
            g.inode_bitmap_csum = hex_after(t, "csum 0x").map(|v| v as u32);
        } else if let Some(r) = after(t, "Inode table at ") {
            g.inode_table = first_num(r);
        } else if t.contains(" free blocks, ") {
            let parts: Vec<&str> = t.split(", ").collect();
            g.free_blocks = first_num(parts[0]) as u32;
            g.free_inodes = first_num(parts[1]) as u32;
            g.dirs = first_num(parts[2]) as u32;
        }
    }
    groups
}

fn block(img: &[u8], bs: u32, nr: u64) -> &[u8] {
    let s = (nr * u64::from(bs)) as usize;
    &img[s..s + bs as usize]
}

fn desc<'a>(img: &'a [u8], sb: &Superblock, g: u64) -> &'a [u8] {
    let bs = u64::from(sb.block_size());
    let ds = u64::from(sb.desc_size());
    let start = (u64::from(sb.first_data_block()) + 1) * bs + g * ds;
    &img[start as usize..(start + ds) as usize]
}

fn inode_bytes<'a>(img: &'a [u8], sb: &Superblock, ino: u32) -> &'a [u8] {
    let g = u64::from((ino - 1) / sb.inodes_per_group());
    let idx = u64::from((ino - 1) % sb.inodes_per_group());
    let table = GroupDescRef::new(desc(img, sb, g)).inode_table();
    let start = table * u64::from(sb.block_size()) + idx * u64::from(sb.inode_size());
    &img[start as usize..start as usize + usize::from(sb.inode_size())]
}

/// Checks the superblock against `dumpe2fs -h` and its round trip; returns it.
fn check_superblock(img: &[u8], image: &Path, c: &Config) -> Superblock {
    let raw = &img[SUPERBLOCK_OFFSET as usize..SUPERBLOCK_OFFSET as usize + SUPERBLOCK_SIZE];
    let sb = Superblock::parse(raw).expect("mkfs.ext4's superblock parses");
    let d = common::dumpe2fs_h(image);
    assert_eq!(sb.block_size(), c.block_size);
    assert_eq!(u64::from(sb.block_size()), num(&d, "Block size"));
    assert_eq!(sb.blocks_count(), num(&d, "Block count"));
    assert_eq!(u64::from(sb.inodes_count()), num(&d, "Inode count"));
    assert_eq!(sb.free_blocks_count(), num(&d, "Free blocks"));
    assert_eq!(u64::from(sb.free_inodes_count()), num(&d, "Free inodes"));
    assert_eq!(sb.r_blocks_count(), num(&d, "Reserved block count"));
    assert_eq!(u64::from(sb.first_data_block()), num(&d, "First block"));
    assert_eq!(
        u64::from(sb.blocks_per_group()),
        num(&d, "Blocks per group")
    );
    assert_eq!(
        u64::from(sb.inodes_per_group()),
        num(&d, "Inodes per group")
    );
    assert_eq!(u64::from(sb.inode_size()), num(&d, "Inode size"));
    assert_eq!(u64::from(sb.first_ino()), num(&d, "First inode"));
    assert_eq!(u64::from(sb.journal_inum()), num(&d, "Journal inode"));
    assert_eq!(
        u64::from(sb.reserved_gdt_blocks()),
        num(&d, "Reserved GDT blocks")
    );
    assert_eq!(u64::from(sb.desc_size()), num(&d, "Group descriptor size"));
    assert_eq!(
        u64::from(sb.min_extra_isize()),
        num(&d, "Required extra isize")
    );
    assert_eq!(
        u64::from(sb.want_extra_isize()),
        num(&d, "Desired extra isize")
    );
    assert_eq!(uuid_string(&sb.uuid()), d["Filesystem UUID"]);
    assert_eq!(uuid_string(&sb.uuid()), UUID);
    let seed_bytes: Vec<u8> = sb
        .hash_seed()
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect();
    assert_eq!(uuid_string(&seed_bytes), d["Directory Hash Seed"]);
    assert_eq!(uuid_string(&seed_bytes), HASH_SEED);
    let want: BTreeSet<String> = d["Filesystem features"]
        .split_whitespace()
        .map(String::from)
        .collect();
    assert_eq!(
        feature_names(&sb),
        want,
        "feature names differ from dumpe2fs"
    );
    assert_eq!(d["Filesystem state"], "clean");
    assert_eq!(sb.state() & 1, 1, "clean bit");
    let groups = (sb.blocks_count() - u64::from(sb.first_data_block()))
        .div_ceil(u64::from(sb.blocks_per_group()));
    assert_eq!(sb.group_count(), groups);
    assert_eq!(sb.has_ro_compat(ro_compat::METADATA_CSUM), c.csum);
    if c.csum {
        let stored = u32::from_le_bytes(raw[0x3FC..].try_into().unwrap());
        assert_eq!(d["Checksum"], format!("{stored:#010x}"));
        assert_eq!(stored, crc32c_raw(!0, &raw[..0x3FC]));
        assert_eq!(sb.csum_seed(), Some(crc32c_raw(!0, &sb.uuid())));
        assert_eq!(d["Checksum type"], "crc32c");
    } else {
        assert_eq!(sb.csum_seed(), None);
    }
    // Round trip: write gives the original bytes, also after recomputing the checksum.
    let mut out = vec![0u8; SUPERBLOCK_SIZE];
    sb.write(&mut out);
    assert!(
        out == raw,
        "superblock write differs from the original bytes"
    );
    let mut sb2 = sb.clone();
    sb2.update_checksum();
    sb2.write(&mut out);
    assert!(
        out == raw,
        "superblock checksum recomputation changed the bytes"
    );
    // A changed field breaks the checksum (when on) and a fresh checksum repairs it.
    if c.csum {
        let mut bad = raw.to_vec();
        bad[0x0C] ^= 1;
        assert!(
            Superblock::parse(&bad).is_err(),
            "a flipped free-blocks bit passes the checksum"
        );
    }
    // Backup superblock in group 1 parses too and describes the same file system.
    if sb.group_count() > 1 {
        let b1 = u64::from(sb.first_data_block()) + u64::from(sb.blocks_per_group());
        let off = (b1 * u64::from(sb.block_size())) as usize;
        let backup =
            Superblock::parse(&img[off..off + SUPERBLOCK_SIZE]).expect("backup superblock parses");
        assert_eq!(backup.blocks_count(), sb.blocks_count());
        assert_eq!(backup.uuid(), sb.uuid());
    }
    sb
}

fn check_groups(img: &[u8], image: &Path, sb: &Superblock, c: &Config) {
    let dump = dump_groups(image);
    assert_eq!(dump.len() as u64, sb.group_count(), "dumpe2fs group count");
    let seed = sb.csum_seed();
    let bs = sb.block_size();
    let (mut free_b, mut free_i) = (0u64, 0u64);
    for (g, dg) in dump.iter().enumerate() {
        let raw = desc(img, sb, g as u64);
        let d = GroupDescRef::new(raw);
        assert_eq!(d.block_bitmap(), dg.block_bitmap, "group {g} block bitmap");
        assert_eq!(d.inode_bitmap(), dg.inode_bitmap, "group {g} inode bitmap");
        assert_eq!(d.inode_table(), dg.inode_table, "group {g} inode table");
        assert_eq!(d.free_blocks(), dg.free_blocks, "group {g} free blocks");
        assert_eq!(d.free_inodes(), dg.free_inodes, "group {g} free inodes");
        assert_eq!(d.used_dirs(), dg.dirs, "group {g} directories");
        free_b += u64::from(d.free_blocks());
        free_i += u64::from(d.free_inodes());
        if let Some(seed) = seed {
            assert_eq!(
                Some(d.checksum()),
                dg.csum,
                "group {g} stored checksum vs dumpe2fs"
            );
            assert_eq!(
                d.checksum(),
                d.compute_checksum(seed, g as u32),
                "group {g} checksum verifies"
            );
            assert_ne!(
                d.checksum(),
                d.compute_checksum(seed, g as u32 + 1),
                "checksum covers the group number"
            );
            assert_eq!(
                Some(d.block_bitmap_csum()),
                dg.block_bitmap_csum,
                "group {g} block bitmap csum"
            );
            assert_eq!(
                Some(d.inode_bitmap_csum()),
                dg.inode_bitmap_csum,
                "group {g} inode bitmap csum"
            );
            if d.flags() & BG_BLOCK_UNINIT == 0 {
                let bm = block(img, bs, d.block_bitmap());
                let len = (sb.blocks_per_group() / 8) as usize;
                assert_eq!(
                    bitmap_checksum(seed, bm, len),
                    d.block_bitmap_csum(),
                    "group {g} block bitmap content"
                );
            }
            if d.flags() & BG_INODE_UNINIT == 0 {
                let bm = block(img, bs, d.inode_bitmap());
                let len = (sb.inodes_per_group() / 8) as usize;
                assert_eq!(
                    bitmap_checksum(seed, bm, len),
                    d.inode_bitmap_csum(),
                    "group {g} inode bitmap content"
                );
            }
        } else {
            assert_eq!(dg.csum, None);
            let _ = c;
        }
    }
    assert_eq!(free_b, sb.free_blocks_count(), "sum of group free blocks");
    assert_eq!(
        free_i,
        u64::from(sb.free_inodes_count()),
        "sum of group free inodes"
    );
}

/// The root inode, its extent root and its directory block.
fn check_root(img: &[u8], sb: &Superblock) {
    let seed = sb.csum_seed();
    let bs = sb.block_size();
    let raw = inode_bytes(img, sb, ROOT_INO as u32);
    let root = Inode::from_bytes(raw);
    root.verify(seed, ROOT_INO as u32)
        .expect("root inode verifies");
    assert!(root.is_dir());
    assert_eq!(root.mode() & 0o7777, 0o755);
    assert_eq!(
        root.links_count(),
        3,
        "root: '.', '..' of itself and of lost+found"
    );
    assert_eq!(root.size(), u64::from(bs));
    assert_eq!(root.as_bytes(), raw);
    let mut copy = root.clone();
    copy.update_checksum(seed, ROOT_INO as u32);
    assert_eq!(
        copy.as_bytes(),
        raw,
        "inode checksum recomputation changed the bytes"
    );
    if seed.is_some() {
        assert!(
            root.verify(seed, 3).is_err(),
            "the inode checksum covers the inode number"
        );
    }
    let node = parse_node(root.i_block()).expect("root extent root parses");
    let ExtentNode::Leaf(exts) = &node else {
        panic!("root extent root is not a leaf: {node:?}")
    };
    assert_eq!(exts.len(), 1);
    assert_eq!(
        (exts[0].logical, exts[0].len, exts[0].unwritten),
        (0, 1, false)
    );
    let mut ib = vec![0u8; 60];
    write_node(&node, &mut ib);
    assert_eq!(ib, root.i_block(), "extent root round trip");

    let dblock = block(img, bs, exts[0].physical);
    let end = dirent::records_end(bs as usize, seed.is_some());
    let recs = dirent::parse_block(dblock, end).expect("root directory block parses");
    let names: Vec<(&[u8], u32, u8)> = recs
        .iter()
        .map(|r| (r.name.as_slice(), r.inode, r.file_type))
        .collect();
    assert_eq!(
        names,
        vec![
            (&b"."[..], 2, dirent::ft::DIR),
            (&b".."[..], 2, dirent::ft::DIR),
            (&b"lost+found"[..], 11, dirent::ft::DIR)
        ]
    );
    assert_eq!(
        recs.last().unwrap().offset + recs.last().unwrap().rec_len,
        end,
        "records cover the block"
    );
    // Rebuild the block from the parsed records on zeroes: it must equal mkfs's bytes.
    let mut rebuilt = vec![0u8; bs as usize];
    for r in &recs {
        dirent::write_record(
            &mut rebuilt,
            r.offset,
            r.inode,
            r.rec_len,
            r.file_type,
            &r.name,
        );
    }
    if let Some(seed) = seed {
        let iseed = inode_csum_seed(seed, ROOT_INO as u32, root.generation());
        assert!(dirent::has_tail(dblock));
        dirent::verify_tail_checksum(dblock, iseed).expect("root directory tail checksum verifies");
        assert!(dirent::verify_tail_checksum(dblock, iseed ^ 1).is_err());
        dirent::init_tail(&mut rebuilt);
        dirent::set_tail_checksum(&mut rebuilt, iseed);
    }
    assert!(
        rebuilt == dblock,
        "directory block rebuilt from its records differs"
    );

    // lost+found: verifies, and is a directory of several blocks (mkfs preallocates).
    let lf = Inode::from_bytes(inode_bytes(img, sb, 11));
    lf.verify(seed, 11).expect("lost+found inode verifies");
    assert!(lf.is_dir());
    assert!(lf.size() >= u64::from(bs));
}

/// The journal inode, its extents, and the jbd2 superblock at its first block.
fn journal_sb(img: &[u8], sb: &Superblock) -> (JournalSuperblock, usize) {
    let ji = Inode::from_bytes(inode_bytes(img, sb, sb.journal_inum()));
    ji.verify(sb.csum_seed(), sb.journal_inum())
        .expect("journal inode verifies");
    assert!(ji.is_reg());
    let node = parse_node(ji.i_block()).expect("journal extent root parses");
    let first = match &node {
        ExtentNode::Leaf(exts) => {
            let total: u64 = exts.iter().map(|e| u64::from(e.len)).sum();
            assert_eq!(
                total * u64::from(sb.block_size()),
                ji.size(),
                "journal extents cover its size"
            );
            exts.iter()
                .find(|e| e.logical == 0)
                .expect("journal block 0 mapped")
                .physical
        }
        ExtentNode::Index { entries, .. } => {
            let child = block(img, sb.block_size(), entries[0].child);
            if let Some(seed) = sb.csum_seed() {
                let iseed = inode_csum_seed(seed, sb.journal_inum(), ji.generation());
                tidefs::format::ext4::extent::verify_tail_checksum(child, iseed)
                    .expect("journal extent block csum");
            }
            match parse_node(child).expect("journal extent leaf parses") {
                ExtentNode::Leaf(exts) => exts[0].physical,
                other => panic!("unexpected deep journal tree {other:?}"),
            }
        }
    };
    let off = (first * u64::from(sb.block_size())) as usize;
    let jsb = JournalSuperblock::parse(&img[off..off + jbd2::superblock::SUPERBLOCK_SIZE])
        .expect("jbd2 superblock parses");
    (jsb, off)
}

fn check_journal(img: &[u8], image: &Path, sb: &Superblock) -> JournalSuperblock {
    let (jsb, off) = journal_sb(img, sb);
    let d = common::dumpe2fs_h(image);
    assert!(jsb.v2, "mkfs writes a v2 journal superblock");
    assert_eq!(jsb.block_size, sb.block_size());
    assert_eq!(u64::from(jsb.len_blocks), num(&d, "Total journal blocks"));
    assert_eq!(u64::from(jsb.start_block), num(&d, "Journal start"));
    assert_eq!(d["Journal sequence"], format!("{:#010x}", jsb.sequence));
    assert_eq!(jsb.first_log_block, 1);
    assert_eq!(jsb.errno, 0);
    let names: Vec<String> = (0..32)
        .map(|i| 1u32 << i)
        .filter(|b| jsb.feature_incompat & b != 0)
        .map(jbd2::incompat_name)
        .collect();
    let compat: Vec<&str> = if jsb.feature_compat & jbd2::COMPAT_CHECKSUM != 0 {
        vec!["journal_checksum"]
    } else {
        vec![]
    };
    let mut ours: BTreeSet<String> = names.into_iter().collect();
    ours.extend(compat.into_iter().map(String::from));
    let theirs: BTreeSet<String> = match d["Journal features"].as_str() {
        "(none)" => BTreeSet::new(),
        s => s.split_whitespace().map(String::from).collect(),
    };
    assert_eq!(ours, theirs, "journal features differ from dumpe2fs");
    if jsb.has_csum_v2_or_v3() {
        let stored = u32::from_be_bytes(img[off + 0xFC..off + 0x100].try_into().unwrap());
        assert_eq!(d["Journal checksum"], format!("{stored:#010x}"));
        assert_eq!(d["Journal checksum type"], "crc32c");
    }
    let raw = &img[off..off + jbd2::superblock::SUPERBLOCK_SIZE];
    let mut out = vec![0u8; jbd2::superblock::SUPERBLOCK_SIZE];
    jsb.write(&mut out);
    assert!(
        out == raw,
        "jbd2 superblock write differs from the original bytes"
    );
    jsb
}

fn check_config(c: &Config) {
    let dir = tempfile::tempdir().unwrap();
    let image = make(dir.path(), c);
    let img = std::fs::read(&image).unwrap();
    let sb = check_superblock(&img, &image, c);
    check_groups(&img, &image, &sb, c);
    check_root(&img, &sb);
    let fresh = check_journal(&img, &image, &sb);
    assert_eq!(
        fresh.feature_incompat, 0,
        "mkfs leaves the journal without features"
    );
    assert!(!sb.has_incompat(incompat::RECOVER));

    // tidefs mounts and unmounts; everything must still parse, verify and agree with dumpe2fs,
    // and the journal tidefs set up must be what dumpe2fs reads.
    let fs = Fs::open(&image, &MountOptions::default()).expect("tidefs opens mkfs.ext4's image");
    let d = fs
        .mkdir(ROOT_INO, b"d", 0o755, tidefs::fs::Creds::ROOT)
        .unwrap();
    let f = fs
        .create(d.ino, b"f", 0o100644, 0, tidefs::fs::Creds::ROOT)
        .unwrap();
    fs.write(f.ino, 0, &vec![0x5A; 3 * c.block_size as usize])
        .unwrap();
    fs.fsync(f.ino, false).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    common::assert_fsck_clean(&image);
    let img = std::fs::read(&image).unwrap();
    let sb2 = Superblock::parse(&img[1024..2048]).expect("superblock parses after tidefs");
    let d2 = common::dumpe2fs_h(&image);
    assert_eq!(sb2.free_blocks_count(), num(&d2, "Free blocks"));
    assert_eq!(u64::from(sb2.free_inodes_count()), num(&d2, "Free inodes"));
    assert_eq!(sb2.free_inodes_count(), sb.free_inodes_count() - 2);
    assert!(
        !sb2.has_incompat(incompat::RECOVER),
        "clean unmount clears needs_recovery"
    );
    check_groups(&img, &image, &sb2, c);
    let after = check_journal(&img, &image, &sb2);
    assert_eq!(
        after.start_block, 0,
        "the journal is empty after a clean unmount"
    );
    if c.csum {
        assert!(
            after.has_csum_v2_or_v3(),
            "tidefs turns on journal checksums on a metadata_csum fs"
        );
    }
}

/// Goal: the format layer matches dumpe2fs on a 1 KiB-block metadata_csum image (see the module
/// doc).
#[test]
fn golden_1k_metadata_csum() {
    if common::have_e2fsprogs() {
        check_config(&CONFIGS[0]);
    }
}

/// Goal: the format layer matches dumpe2fs on a 4 KiB-block metadata_csum image (see the module
/// doc).
#[test]
fn golden_4k_metadata_csum() {
    if common::have_e2fsprogs() {
        check_config(&CONFIGS[1]);
    }
}

/// Goal: the format layer matches dumpe2fs on a 1 KiB-block image without checksums.
#[test]
fn golden_1k_no_csum() {
    if common::have_e2fsprogs() {
        check_config(&CONFIGS[2]);
    }
}

/// Goal: the format layer matches dumpe2fs on a 4 KiB-block image without checksums.
#[test]
fn golden_4k_no_csum() {
    if common::have_e2fsprogs() {
        check_config(&CONFIGS[3]);
    }
}

/// The default feature set of this machine's mke2fs (whatever /etc/mke2fs.conf says) parses too;
/// if it has features tidefs does not implement, `Fs::open` must say which, by name.
#[test]
fn golden_default_mkfs_features() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = common::mkfs_raw(dir.path(), "def.img", 64, &[]);
    let img = std::fs::read(&image).unwrap();
    let sb = Superblock::parse(&img[1024..2048]).expect("default superblock parses");
    let d = common::dumpe2fs_h(&image);
    let want: BTreeSet<String> = d["Filesystem features"]
        .split_whitespace()
        .map(String::from)
        .collect();
    assert_eq!(feature_names(&sb), want);
    match Fs::open(&image, &MountOptions::default()) {
        Ok(fs) => fs.unmount().unwrap(),
        Err(tidefs::FsError::Incompatible(msg)) => {
            eprintln!("default mkfs features not supported: {msg}");
            assert!(
                want.iter().any(|f| msg.contains(f.as_str())),
                "message {msg:?} names no feature of {want:?}"
            );
        }
        Err(e) => panic!("default mkfs image: unexpected error {e}"),
    }
}
