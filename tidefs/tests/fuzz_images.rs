//! Goal: a whole image with damaged metadata never makes tidefs panic, hang, or write file
//! data onto metadata. It may refuse to mount, fail operations with `Corrupt`, or work.
//!
//! Method: base images come from the real mkfs.ext4 (8 MiB with 1 KiB blocks, 16 MiB with 4 KiB
//! blocks, and the 4 KiB one again left after a simulated crash, so its journal needs
//! recovery), populated through the library first: directories, files, a fragmented file whose
//! extent tree has an index root and leaf blocks, symlinks (inline and in a block), xattrs in
//! the inode and in an xattr block. Each case, from a seed, picks one to three metadata
//! structures of a base image (superblock, group descriptors, block and inode bitmaps, the
//! populated inodes including the journal inode, extent-tree blocks, directory blocks, the
//! xattr block, the journal superblock and log blocks), overwrites 1 to 8 random bytes in each,
//! and half the time stores that structure's checksum again so the damage gets past the
//! checksum to the validation behind it. The damaged image is opened on an in-memory device,
//! the whole tree is walked (readdir, getattr, read every file, readlink, listxattr and
//! getxattr), a few changes are made (create and write, truncate, unlink, mkdir, setxattr),
//! and the file system is unmounted; every result is allowed, as long as nothing panics. Each
//! case runs on its own thread and fails if it has not finished within a minute (a hang
//! detector, far above the fraction of a second a case takes).
//!
//! Write oracle: the device records every write. F is the set of blocks that hold fixed
//! metadata in the *undamaged* image (superblock and group-descriptor copies with their
//! reserved GDT blocks, block and inode bitmaps, inode tables), computed from its superblock
//! and descriptors; tidefs only ever writes such blocks as whole blocks that are copies it
//! logged in the journal (checkpoint, replay), or, for the primary superblock's block, directly.
//! File data, in the ordered mode used here, is written home directly. So a write that lands on
//! a block of F must (a) cover whole blocks and (b) carry, block by block, content that already
//! exists outside F: written earlier by the run into a block outside F (where the journal is),
//! or present there in the damaged image (a journal about to be replayed). The file data the
//! run writes is unique random bytes, so a data write that lands on F fails (b). Writes into
//! the undamaged image's journal must be whole blocks or the 1 KiB journal superblock.
//!
//! `TIDEFS_FUZZ_CASES=N` runs N cases per base image (default 40); `TIDEFS_FUZZ_SEED=S` runs
//! the single case S (the failure message names it).

mod common;
mod damage;

use std::collections::HashSet;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tidefs::dev::{BlockDevice, MemDev};
use tidefs::format::crc32c_raw;
use tidefs::format::ext4::group_desc::GroupDesc;
use tidefs::fs::{Creds, FileKind, Fs, Ino, MountOptions, SetAttr, XattrSetMode, ROOT_INO};

use common::Rng;

/// How to store a structure's checksum again after damaging it.
#[derive(Clone, Copy, Debug)]
enum Fix {
    None,
    Superblock,
    Desc(u32),
    BlockBitmap(u32),
    InodeBitmap(u32),
    Inode(u32),
    ExtentBlock(u32),
    DirBlock(u32),
}

/// A damageable structure: bytes `[start, end)` of the image.
#[derive(Clone, Copy, Debug)]
struct Target {
    start: usize,
    end: usize,
    fix: Fix,
}

/// A populated, valid image and what the oracle and the mutator know about it.
struct Base {
    name: &'static str,
    bytes: Vec<u8>,
    bs: usize,
    targets: Vec<Target>,
    /// Per block: fixed metadata of the undamaged image (F).
    fixed: Vec<bool>,
    /// Per block: the undamaged image's journal.
    journal: Vec<bool>,
    /// Byte offset of the journal superblock.
    jsb: u64,
}

fn block_hash(b: &[u8]) -> u64 {
    // The journal stores a block that starts with the jbd2 magic with those 4 bytes zeroed
    // (escaped): compare blocks without them.
    let mut h = std::hash::DefaultHasher::new();
    std::hash::Hasher::write(&mut h, &b[4..]);
    std::hash::Hasher::finish(&h)
}

/// The device of one case: memory, plus the write oracle.
struct Recorder {
    inner: MemDev,
    bs: u64,
    fixed: Vec<bool>,
    journal: Vec<bool>,
    jsb: u64,
    /// Hashes of whole-block contents that exist outside F.
    known: Mutex<HashSet<u64>>,
    violations: Mutex<Vec<String>>,
}

impl Recorder {
    fn new(base: &Base, image: Vec<u8>) -> Recorder {
        let known = image
            .chunks(base.bs)
            .enumerate()
            .filter(|(b, _)| !base.fixed[*b])
            .map(|(_, c)| block_hash(c))
            .collect();
        Recorder {
            inner: MemDev::from_bytes(image),
            bs: base.bs as u64,
            fixed: base.fixed.clone(),
            journal: base.journal.clone(),
            jsb: base.jsb,
            known: Mutex::new(known),
            violations: Mutex::new(Vec::new()),
        }
    }

    fn check(&self, offset: u64, buf: &[u8]) {
        let bs = self.bs;
        let len = buf.len() as u64;
        if len == 0 {
            return;
        }
        let whole = offset % bs == 0 && len % bs == 0;
        let first = offset / bs;
        let last = (offset + len - 1) / bs;
        let mut known = self.known.lock().unwrap();
        let mut bad = self.violations.lock().unwrap();
        for b in first..=last {
            let i = b as usize;
            let in_fixed = self.fixed.get(i).copied().unwrap_or(false);
            let in_journal = self.journal.get(i).copied().unwrap_or(false);
            if in_journal && !whole && !(offset == self.jsb && len == 1024) {
                bad.push(format!(
                    "partial write {offset}+{len} into journal block {b}"
                ));
            }
            if !whole {
                if in_fixed {
                    bad.push(format!(
                        "partial write {offset}+{len} onto metadata block {b}"
                    ));
                }
                continue;
            }
            let at = ((b - first) * bs) as usize;
            let h = block_hash(&buf[at..at + bs as usize]);
            if in_fixed && !known.contains(&h) {
                bad.push(format!(
                    "write {offset}+{len} puts content onto metadata block {b} that was never \
                     logged"
                ));
            }
            if !in_fixed {
                known.insert(h);
            }
        }
    }
}

impl BlockDevice for Recorder {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        // The primary superblock's block is written directly at mount and unmount.
        if offset / self.bs != 1024 / self.bs {
            self.check(offset, buf);
        }
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn len_bytes(&self) -> u64 {
        self.inner.len_bytes()
    }
}

/// Populates a fresh image through the library; returns the inodes it made.
fn populate(fs: &Fs, rng: &mut Rng) -> Vec<Ino> {
    let c = Creds::ROOT;
    let d1 = fs.mkdir(ROOT_INO, b"d1", 0o755, c).unwrap();
    let sub = fs.mkdir(d1.ino, b"sub", 0o700, c).unwrap();
    let small = fs.create(d1.ino, b"small", 0o100644, 0, c).unwrap();
    fs.write(small.ino, 0, &rng.bytes(3000)).unwrap();
    let big = fs.create(sub.ino, b"fragmented", 0o100600, 0, c).unwrap();
    let bs = u64::from(fs.block_size());
    // Every other block: one extent each, more than an inode holds, so the tree gets leaves.
    for k in 0..40 {
        fs.write(big.ino, 2 * k * bs, &rng.bytes(200)).unwrap();
    }
    let short = fs.symlink(ROOT_INO, b"short", b"d1/small", c).unwrap();
    let long_target = vec![b'x'; 300];
    let long = fs.symlink(d1.ino, b"long", &long_target, c).unwrap();
    fs.setxattr(small.ino, b"user.a", b"in the inode", XattrSetMode::Any)
        .unwrap();
    fs.setxattr(big.ino, b"user.b", &rng.bytes(700), XattrSetMode::Any)
        .unwrap();
    fs.link(small.ino, ROOT_INO, b"hard").unwrap();
    for i in 0..30 {
        let f = fs
            .create(sub.ino, format!("n{i}").as_bytes(), 0o100644, 0, c)
            .unwrap();
        fs.write(f.ino, 0, &rng.bytes(100)).unwrap();
    }
    vec![
        ROOT_INO, d1.ino, sub.ino, small.ino, big.ino, short.ino, long.ino,
    ]
}

/// Blocks of fixed metadata of an image, per block.
fn fixed_blocks(img: &[u8]) -> Vec<bool> {
    let sb = damage::superblock(img);
    let bs = u64::from(sb.block_size());
    let nblocks = (img.len() as u64 / bs) as usize;
    let mut fixed = vec![false; nblocks];
    let mut mark = |a: u64, b: u64| {
        for x in a..b.min(nblocks as u64) {
            fixed[x as usize] = true;
        }
    };
    let groups = sb.group_count();
    let bpg = u64::from(sb.blocks_per_group());
    let fdb = u64::from(sb.first_data_block());
    let meta = 1 + sb.gdt_blocks() + u64::from(sb.reserved_gdt_blocks());
    let itable = (u64::from(sb.inodes_per_group()) * u64::from(sb.inode_size())).div_ceil(bs);
    mark(0, fdb);
    for g in 0..groups {
        if sb.group_has_super(g) {
            mark(fdb + g * bpg, fdb + g * bpg + meta);
        }
        let (bb, ib, it) = damage::group_blocks(img, g as u32);
        mark(bb, bb + 1);
        mark(ib, ib + 1);
        mark(it, it + itable);
    }
    fixed
}

fn build_base(name: &'static str, block_size: &str, size_mb: u64, crashed: bool) -> Base {
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkfs_raw(
        dir.path(),
        "base.img",
        size_mb,
        &[
            "-b",
            block_size,
            "-O",
            "metadata_csum,64bit",
            "-E",
            "lazy_itable_init=0,lazy_journal_init=0",
        ],
    );
    let mut rng = Rng(0x5EED_0000 + size_mb);
    let opts = MountOptions {
        deterministic_writes: crashed,
        ..MountOptions::default()
    };
    let fs = Fs::open(&img, &opts).unwrap();
    let inodes = populate(&fs, &mut rng);
    if crashed {
        // A few committed transactions left in the journal for recovery to replay.
        for i in 0..5 {
            let f = fs
                .create(
                    ROOT_INO,
                    format!("late{i}").as_bytes(),
                    0o100644,
                    0,
                    Creds::ROOT,
                )
                .unwrap();
            fs.write(f.ino, 0, &rng.bytes(5000)).unwrap();
            fs.fsync(f.ino, false).unwrap();
        }
        fs.crash();
    } else {
        fs.unmount().unwrap();
    }
    drop(fs);
    let bytes = std::fs::read(&img).unwrap();
    let sb = damage::superblock(&bytes);
    let bs = sb.block_size() as usize;
    let isz = usize::from(sb.inode_size());
    let fixed = fixed_blocks(&bytes);
    let mut journal = vec![false; bytes.len() / bs];
    let (_, jruns) = damage::tree_blocks(&bytes, sb.journal_inum());
    for (start, len) in &jruns {
        for b in *start..start + u64::from(*len) {
            journal[b as usize] = true;
        }
    }
    let block = |nr: u64, fix| Target {
        start: nr as usize * bs,
        end: (nr as usize + 1) * bs,
        fix,
    };
    let mut targets = vec![Target {
        start: 1024,
        end: 2048,
        fix: Fix::Superblock,
    }];
    for g in 0..sb.group_count() as u32 {
        let d = damage::desc_offset(&bytes, g);
        targets.push(Target {
            start: d,
            end: d + sb.desc_size() as usize,
            fix: Fix::Desc(g),
        });
        let (bb, ib, _) = damage::group_blocks(&bytes, g);
        targets.push(block(bb, Fix::BlockBitmap(g)));
        targets.push(block(ib, Fix::InodeBitmap(g)));
    }
    let mut all_inodes: Vec<u32> = inodes.iter().map(|i| *i as u32).collect();
    all_inodes.push(sb.journal_inum());
    for ino in all_inodes {
        let at = common::inode_offset(&bytes, ino);
        targets.push(Target {
            start: at,
            end: at + isz,
            fix: Fix::Inode(ino),
        });
        let i = damage::inode(&bytes, ino);
        let (tree, runs) = damage::tree_blocks(&bytes, ino);
        for t in tree {
            targets.push(block(t, Fix::ExtentBlock(ino)));
        }
        if i.is_dir() {
            for (start, len) in runs {
                for b in start..start + u64::from(len) {
                    targets.push(block(b, Fix::DirBlock(ino)));
                }
            }
        }
        if i.file_acl() != 0 {
            targets.push(block(i.file_acl(), Fix::None));
        }
    }
    // The journal superblock and the first log blocks (descriptors, data, commits when the
    // journal needs recovery).
    for n in 0..12 {
        let at = damage::journal_block_offset(&bytes, n);
        targets.push(Target {
            start: at,
            end: at + bs,
            fix: Fix::None,
        });
    }
    let jsb = damage::journal_block_offset(&bytes, 0) as u64;
    Base {
        name,
        bytes,
        bs,
        targets,
        fixed,
        journal,
        jsb,
    }
}

/// Stores the checksum of the damaged structure `t` again. Locations and seeds come from the
/// undamaged image, so fixing one structure never depends on another one's damage.
fn apply_fix(base: &Base, img: &mut [u8], t: Target) {
    let sb = damage::superblock(&base.bytes);
    let Some(seed) = sb.csum_seed() else {
        return;
    };
    let bs = base.bs;
    let inode_seed = |ino: u32| {
        let generation = damage::inode(&base.bytes, ino).generation();
        tidefs::format::ext4::inode_csum_seed(seed, ino, generation)
    };
    let desc = |g: u32| {
        let d = damage::desc_offset(&base.bytes, g);
        d..d + sb.desc_size() as usize
    };
    let block = &mut img[t.start..t.end];
    match t.fix {
        Fix::None => {}
        Fix::Superblock => {
            if let Ok(mut s) =
                tidefs::format::ext4::superblock::Superblock::parse_checked(block, false)
            {
                s.update_checksum();
                s.write(block);
            }
        }
        Fix::Desc(g) => GroupDesc::new(block).update_checksum(seed, g),
        Fix::BlockBitmap(g) | Fix::InodeBitmap(g) => {
            let inode = matches!(t.fix, Fix::InodeBitmap(_));
            let len = if inode {
                sb.inodes_per_group() as usize / 8
            } else {
                sb.blocks_per_group() as usize / 8
            };
            let c = crc32c_raw(seed, &block[..len.min(bs)]);
            let mut d = GroupDesc::new(&mut img[desc(g)]);
            if inode {
                d.set_inode_bitmap_csum(c);
            } else {
                d.set_block_bitmap_csum(c);
            }
            d.update_checksum(seed, g);
        }
        Fix::Inode(ino) => {
            let mut i = tidefs::format::ext4::inode::Inode::from_bytes(block);
            i.update_checksum(Some(seed), ino);
            block.copy_from_slice(i.as_bytes());
        }
        Fix::ExtentBlock(ino) => {
            tidefs::format::ext4::extent::set_tail_checksum(block, inode_seed(ino))
        }
        Fix::DirBlock(ino) => {
            if tidefs::format::ext4::dirent::has_tail(block) {
                tidefs::format::ext4::dirent::set_tail_checksum(block, inode_seed(ino));
            }
        }
    }
}

/// Overwrites one aligned 16- or 32-bit field of `t` with a value a parser has to reject or
/// bound: 0, 1, a block number inside the file system (possibly on metadata), a length at
/// the format's limits, all ones. In inodes, half the fields land in `i_block` (the extent
/// root), since that is where a wrong value does the most harm.
fn overwrite_field(base: &Base, img: &mut [u8], t: Target, rng: &mut Rng) {
    let blocks = (base.bytes.len() / base.bs) as u64;
    let at = match t.fix {
        // An extent header or entry field (ee_block, ee_len, ee_start_hi, ee_start_lo),
        // mostly of the first entry, the one every file has.
        Fix::Inode(_) if rng.below(2) == 0 => {
            let entry = [0, 1, 1, 1, 2, 3, 4][rng.below(7) as usize];
            let field = [0, 4, 6, 8][rng.below(4) as usize];
            t.start + 0x28 + 12 * entry + field
        }
        _ => t.start + rng.below(((t.end - t.start) / 2) as u64) as usize * 2,
    };
    let v: u32 = match rng.below(9) {
        0 => 0,
        1 => 1,
        2 => rng.below(blocks) as u32,
        // The first blocks of a group hold its fixed metadata.
        3 => rng.below(blocks / 8) as u32,
        4 => rng.below(64) as u32,
        5 => 0x8000 + rng.below(2) as u32,
        6 => 0xFFFF,
        7 => u32::MAX,
        _ => rng.next_u64() as u32,
    };
    if rng.below(2) == 0 || at + 4 > t.end {
        img[at..at + 2].copy_from_slice(&(v as u16).to_le_bytes());
    } else {
        img[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }
}

/// Points a block pointer of `t` at a block of fixed metadata: an extent's start (in an inode's
/// extent root or an extent-tree block), an index entry's child, or a group descriptor's
/// bitmap or inode table. Returns false when `t` has no block pointer.
fn aim_at_metadata(base: &Base, img: &mut [u8], t: Target, rng: &mut Rng) -> bool {
    let fixed: Vec<usize> = (0..base.fixed.len()).filter(|b| base.fixed[*b]).collect();
    let journal: Vec<usize> = (0..base.journal.len())
        .filter(|b| base.journal[*b])
        .collect();
    let pool = if rng.below(3) == 0 && !journal.is_empty() {
        &journal
    } else {
        &fixed
    };
    let target_block = pool[rng.below(pool.len() as u64) as usize] as u32;
    let node = match t.fix {
        Fix::Inode(_) => t.start + 0x28,
        Fix::ExtentBlock(_) => t.start,
        Fix::Desc(_) => {
            // bg_block_bitmap_lo, bg_inode_bitmap_lo, bg_inode_table_lo.
            let at = t.start + 4 * rng.below(3) as usize;
            img[at..at + 4].copy_from_slice(&target_block.to_le_bytes());
            return true;
        }
        _ => return false,
    };
    // One of the node's entries, as the undamaged image has them: ee_start (hi at +6, lo at
    // +8) in a leaf, ei_leaf (lo at +4, hi at +8) in an index node.
    let entries = u16::from_le_bytes([base.bytes[node + 2], base.bytes[node + 3]]);
    let depth = u16::from_le_bytes([base.bytes[node + 6], base.bytes[node + 7]]);
    if base.bytes[node..node + 2] != [0x0A, 0xF3] || entries == 0 {
        return false;
    }
    let entry = node + 12 * (1 + rng.below(u64::from(entries)) as usize);
    if depth == 0 {
        img[entry + 6..entry + 8].fill(0);
        img[entry + 8..entry + 12].copy_from_slice(&target_block.to_le_bytes());
    } else {
        img[entry + 4..entry + 8].copy_from_slice(&target_block.to_le_bytes());
        img[entry + 8..entry + 10].fill(0);
    }
    true
}

/// The damaged image of case `seed`, and a description of the damage.
fn mutate(base: &Base, seed: u64) -> (Vec<u8>, String) {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut img = base.bytes.clone();
    let mut what = Vec::new();
    for _ in 0..1 + rng.below(3) {
        // Half the damage goes to inodes, which hold the pointers to file data.
        let pick = if rng.below(2) == 0 {
            base.targets
                .iter()
                .filter(|t| matches!(t.fix, Fix::Inode(_)))
                .count()
        } else {
            base.targets.len()
        };
        let inodes_first: Vec<&Target> = base
            .targets
            .iter()
            .filter(|t| matches!(t.fix, Fix::Inode(_)))
            .chain(
                base.targets
                    .iter()
                    .filter(|t| !matches!(t.fix, Fix::Inode(_))),
            )
            .collect();
        let t = *inodes_first[rng.below(pick as u64) as usize];
        let n = 1 + rng.below(8);
        let mode = rng.below(3);
        for _ in 0..n {
            if mode == 2 && aim_at_metadata(base, &mut img, t, &mut rng) {
                continue;
            }
            if mode > 0 {
                overwrite_field(base, &mut img, t, &mut rng);
                continue;
            }
            let at = t.start + rng.below((t.end - t.start) as u64) as usize;
            img[at] = match rng.below(4) {
                0 => 0,
                1 => 0xFF,
                2 => img[at] ^ (1 << rng.below(8)),
                _ => rng.next_u64() as u8,
            };
        }
        // Aimed pointers are only interesting behind a valid checksum.
        let fixed = mode == 2 || rng.below(2) == 0;
        if fixed {
            apply_fix(base, &mut img, t);
        }
        what.push(format!(
            "{n} {} in {}..{} ({:?}{})",
            ["byte(s)", "field(s)", "pointer(s)"][mode as usize],
            t.start,
            t.end,
            t.fix,
            if fixed { ", checksum stored again" } else { "" }
        ));
    }
    (img, what.join("; "))
}

/// Walks everything reachable and changes a little; every error is allowed.
fn exercise(fs: &Fs, rng: &mut Rng) {
    let mut dirs = vec![ROOT_INO];
    let mut files = Vec::new();
    let mut seen = HashSet::new();
    while let Some(d) = dirs.pop() {
        if !seen.insert(d) || seen.len() > 500 {
            continue;
        }
        let _ = fs.getattr(d);
        let _ = fs.listxattr(d);
        let mut entries = Vec::new();
        let _ = fs.readdir(d, 0, &mut |e| {
            entries.push(e);
            entries.len() < 2000
        });
        for e in entries {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            let _ = fs.lookup(d, &e.name);
            let _ = fs.getattr(e.ino);
            if let Ok(names) = fs.listxattr(e.ino) {
                for n in names {
                    let _ = fs.getxattr(e.ino, &n);
                }
            }
            match e.kind {
                FileKind::Dir => dirs.push(e.ino),
                FileKind::Symlink => {
                    let _ = fs.readlink(e.ino);
                }
                FileKind::File => {
                    let mut off = 0;
                    while off < 1 << 20 {
                        match fs.read(e.ino, off, 64 << 10) {
                            Ok(b) if !b.is_empty() => off += b.len() as u64,
                            _ => break,
                        }
                    }
                    files.push((d, e.name.clone(), e.ino));
                }
                _ => {}
            }
        }
    }
    let c = Creds::ROOT;
    if let Ok(f) = fs.create(ROOT_INO, b"new", 0o100644, 0, c) {
        let _ = fs.write(f.ino, 0, &rng.bytes(10_000));
        let _ = fs.write(f.ino, 30_000, &rng.bytes(5000));
        let _ = fs.fsync(f.ino, false);
    }
    let _ = fs.mkdir(ROOT_INO, b"newdir", 0o755, c);
    // Every file gets data written into its first blocks: a damaged extent is used at once.
    for (_, _, ino) in files.iter().take(40) {
        let _ = fs.write(*ino, 0, &rng.bytes(100));
        let _ = fs.write(*ino, 3 * 4096 + 10, &rng.bytes(5000));
    }
    for (k, (dir, name, ino)) in files.iter().enumerate().take(9) {
        match k % 3 {
            0 => {
                let half = SetAttr {
                    size: Some(1000),
                    ..SetAttr::default()
                };
                let _ = fs.setattr(*ino, &half);
                let _ = fs.write(*ino, 5000, &rng.bytes(3000));
            }
            1 => {
                let _ = fs.unlink(*dir, name);
            }
            _ => {
                let _ = fs.setxattr(*ino, b"user.fuzz", &rng.bytes(100), XattrSetMode::Any);
                let _ = fs.fallocate(*ino, 0, 50_000, false);
            }
        }
    }
    let _ = fs.sync();
}

/// Runs one case; returns whether the damaged image mounted.
fn run_case(base: &Arc<Base>, seed: u64) -> bool {
    let (img, what) = mutate(base, seed);
    let base2 = base.clone();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let dev = Arc::new(Recorder::new(&base2, img));
        let as_dev: Arc<dyn BlockDevice> = dev.clone();
        let mounted = match Fs::open_devices(as_dev, None, &MountOptions::default()) {
            Ok(fs) => {
                exercise(&fs, &mut Rng(seed | 1));
                let _ = fs.unmount();
                true
            }
            Err(_) => false,
        };
        let v = dev.violations.lock().unwrap().clone();
        let _ = tx.send((mounted, v));
    });
    let label = format!(
        "{} case {seed} (TIDEFS_FUZZ_SEED={seed}): {what}",
        base.name
    );
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok((mounted, v)) => {
            assert!(
                v.is_empty(),
                "{label}: writes onto metadata:\n{}",
                v.join("\n")
            );
            mounted
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{label}: hung for a minute"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{label}: panicked (see above)"),
    }
}

fn fuzz(name: &'static str, block_size: &str, size_mb: u64, crashed: bool, salt: u64) {
    if !common::have_e2fsprogs() {
        return;
    }
    let base = Arc::new(build_base(name, block_size, size_mb, crashed));
    let seeds: Vec<u64> = match std::env::var("TIDEFS_FUZZ_SEED") {
        Ok(s) => vec![s.parse().unwrap()],
        Err(_) => {
            let n: u64 = std::env::var("TIDEFS_FUZZ_CASES")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(40);
            (0..n).map(|i| salt + i).collect()
        }
    };
    let total = seeds.len();
    let mounted = seeds.into_iter().filter(|s| run_case(&base, *s)).count();
    eprintln!("{name}: {mounted} of {total} damaged images mounted");
}

/// The oracle itself: file data written onto an inode table is reported, a block logged
/// before (a checkpoint) is not.
#[test]
fn oracle_catches_a_data_write_onto_an_inode_table() {
    if !common::have_e2fsprogs() {
        return;
    }
    let base = build_base("oracle", "4096", 16, false);
    let dev = Recorder::new(&base, base.bytes.clone());
    let (_, _, itable) = damage::group_blocks(&base.bytes, 0);
    let at = itable * base.bs as u64;
    let logged = vec![0x11; base.bs];
    let outside = base.fixed.iter().position(|f| !f).unwrap() as u64 * base.bs as u64;
    dev.write_at(outside + 1024 * base.bs as u64, &logged)
        .unwrap();
    dev.write_at(at, &logged).unwrap();
    assert!(dev.violations.lock().unwrap().is_empty());
    dev.write_at(at, &Rng(7).bytes(base.bs)).unwrap();
    dev.write_at(at + 100, b"partial").unwrap();
    assert_eq!(dev.violations.lock().unwrap().len(), 2);
}

#[test]
fn damaged_1k_image() {
    fuzz("1 KiB blocks", "1024", 8, false, 1_000_000);
}

#[test]
fn damaged_4k_image() {
    fuzz("4 KiB blocks", "4096", 16, false, 2_000_000);
}

#[test]
fn damaged_image_needing_recovery() {
    fuzz("4 KiB blocks, crashed", "4096", 16, true, 3_000_000);
}
