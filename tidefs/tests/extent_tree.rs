//! Goal: the extent tree of a heavily fragmented file is edited in place (`fs/extent_map.rs`)
//! and stays valid for the real `e2fsck -fn` through splits, depth growth, merges across
//! leaves, punched holes that empty leaves, zeroed ranges and truncation; and a small change
//! to a big fragmented file rewrites a bounded number of tree blocks, not every leaf after
//! the change.
//! Method: 1 KiB-block images (84 extents per leaf, so a few thousand extents make a tree of
//! depth 2 with dozens of leaves). Two files are written in turns, every other block, so no
//! two extents can merge; every operation is mirrored on an in-memory model of the bytes,
//! compared with whole-file reads after a crash and recovery and before and after a clean
//! remount, each followed by `e2fsck -fn`. A third file, one contiguous run zeroed every other
//! block, has thousands of extents that merge with their neighbours (across leaves too) as
//! the blocks between them are zeroed or written. The cost of a small change is the number of
//! blocks the commit that carries it writes to the journal (`Stats::journal_bytes`, ordered
//! mode: metadata blocks, whole).

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use tidefs::fs::{Creds, DataMode, Fs, Ino, MountOptions, ROOT_INO};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const BS: u64 = 1024;
/// 512-byte sectors per block, the unit of `Attr::blocks`.
const SECTORS: u64 = BS / 512;

fn options(mode: DataMode) -> MountOptions {
    MountOptions {
        data_mode: mode,
        commit_interval: Duration::from_secs(3600),
        ..MountOptions::default()
    }
}

fn image(dir: &Path, name: &str) -> PathBuf {
    common::mkfs_raw(
        dir,
        name,
        96,
        &[
            "-b",
            "1024",
            "-O",
            "metadata_csum,64bit",
            "-E",
            "lazy_itable_init=0,lazy_journal_init=0",
        ],
    )
}

/// The bytes of block `lblk` of the file with `seed` (never all zero).
fn block_bytes(seed: u8, lblk: u64) -> Vec<u8> {
    (0..BS)
        .map(|i| seed.wrapping_add((lblk as u8) ^ (i % 251) as u8).max(1))
        .collect()
}

/// A file with its expected bytes.
struct Model {
    ino: Ino,
    name: &'static [u8],
    seed: u8,
    bytes: Vec<u8>,
}

impl Model {
    fn create(fs: &Fs, name: &'static [u8], seed: u8) -> Result<Model, tidefs::FsError> {
        let f = fs.create(ROOT_INO, name, 0o100644, 0, Creds::ROOT)?;
        Ok(Model {
            ino: f.ino,
            name,
            seed,
            bytes: Vec::new(),
        })
    }

    fn write_block(&mut self, fs: &Fs, lblk: u64) -> Result<(), tidefs::FsError> {
        let b = block_bytes(self.seed, lblk);
        fs.write(self.ino, lblk * BS, &b)?;
        let at = (lblk * BS) as usize;
        if self.bytes.len() < at + b.len() {
            self.bytes.resize(at + b.len(), 0);
        }
        self.bytes[at..at + b.len()].copy_from_slice(&b);
        Ok(())
    }

    fn zero(&mut self, offset: u64, len: u64) {
        let end = ((offset + len) as usize).min(self.bytes.len());
        if (offset as usize) < end {
            self.bytes[offset as usize..end].fill(0);
        }
    }

    fn truncate(&mut self, fs: &Fs, size: u64) -> Result<(), tidefs::FsError> {
        let changes = tidefs::fs::SetAttr {
            size: Some(size),
            ..Default::default()
        };
        fs.setattr(self.ino, &changes)?;
        self.bytes.resize(size as usize, 0);
        Ok(())
    }

    fn check(&self, fs: &Fs, what: &str) -> Result<(), tidefs::FsError> {
        let attr = fs.getattr(self.ino)?;
        assert_eq!(attr.size, self.bytes.len() as u64, "{what}: size");
        let got = fs.read(self.ino, 0, self.bytes.len() as u32 + 10_000)?;
        assert!(got == self.bytes, "{what}: contents differ from the model");
        Ok(())
    }
}

/// Writes the even blocks of `[0, 2 * extents)` of `a` and `b` in turns, `per_round` extents
/// of each per commit: every block of each file is its own extent.
fn write_interleaved(fs: &Fs, a: &mut Model, b: &mut Model, extents: u64) -> TestResult {
    let per_round = 100;
    for round in 0..extents.div_ceil(per_round) {
        for m in [&mut *a, &mut *b] {
            for k in round * per_round..((round + 1) * per_round).min(extents) {
                m.write_block(fs, 2 * k)?;
            }
        }
        fs.sync()?;
    }
    Ok(())
}

/// Tree blocks of a file whose data blocks are `data`.
fn tree_blocks(fs: &Fs, ino: Ino, data: u64) -> Result<u64, tidefs::FsError> {
    Ok(fs.getattr(ino)?.blocks / SECTORS - data)
}

fn fragmented_in_mode(mode: DataMode) -> TestResult {
    let dir = tempfile::tempdir()?;
    let img = image(dir.path(), "frag.img");
    let fs = Fs::open(&img, &options(mode))?;
    let what = |case: &str| format!("{mode:?} {case}");
    let mut a = Model::create(&fs, b"a", 11)?;
    let mut b = Model::create(&fs, b"b", 77)?;
    write_interleaved(&fs, &mut a, &mut b, 3000)?;
    // 3000 extents in leaves of 84 under an index block: depth 2.
    assert!(
        tree_blocks(&fs, a.ino, 3000)? >= 37,
        "{}",
        what("tree size")
    );
    a.check(&fs, &what("written"))?;
    b.check(&fs, &what("written"))?;

    // Odd blocks in the middle of `a`: inserts into full leaves split them.
    for k in 1000..1400u64 {
        a.write_block(&fs, 2 * k + 1)?;
    }
    fs.sync()?;
    // Holes punched in the middle empty whole leaves and split extents at their edges.
    fs.punch_hole(a.ino, 100 * BS, 900 * BS)?;
    a.zero(100 * BS, 900 * BS);
    fs.punch_hole(a.ino, 2100 * BS + 300, 333 * BS)?;
    a.zero(2100 * BS + 300, 333 * BS);
    // Zeroed ranges: written extents become unwritten; writes into them split them again.
    fs.zero_range(b.ino, 1000 * BS, 1500 * BS, true)?;
    b.zero(1000 * BS, 1500 * BS);
    for k in [1001u64, 1003, 1500, 2001] {
        b.write_block(&fs, k)?;
    }
    // Preallocation past the end of `b`, then truncation of both files.
    fs.fallocate(b.ino, 6000 * BS, 500 * BS, true)?;
    a.check(&fs, &what("punched"))?;
    b.check(&fs, &what("zeroed"))?;
    fs.sync()?;
    // A crash here: recovery replays the commits, and the trees are those the last one left,
    // valid for e2fsck.
    fs.crash();
    drop(fs);
    let fs = Fs::open(&img, &options(mode))?;
    a.check(&fs, &what("recovered"))?;
    b.check(&fs, &what("recovered"))?;
    fs.unmount()?;
    drop(fs);
    common::assert_fsck_clean(&img);
    let fs = Fs::open(&img, &options(mode))?;
    a.truncate(&fs, 4500 * BS + 17)?;
    b.truncate(&fs, 3333 * BS)?;
    a.check(&fs, &what("truncated"))?;
    b.check(&fs, &what("truncated"))?;

    // A third file grown big and truncated to zero: its whole tree goes.
    let mut c = Model::create(&fs, b"c", 5)?;
    for k in 0..500 {
        c.write_block(&fs, 2 * k)?;
    }
    fs.sync()?;
    assert!(tree_blocks(&fs, c.ino, 500)? >= 6);
    c.truncate(&fs, 0)?;
    assert_eq!(
        fs.getattr(c.ino)?.blocks,
        0,
        "{}",
        what("truncated to zero")
    );
    c.write_block(&fs, 3)?;

    // One contiguous run, every odd block zeroed (unwritten): 2000 extents of one block that
    // continue each other physically. Zeroing the even blocks of the middle one by one joins
    // them into one unwritten extent, the joins crossing leaf boundaries and emptying leaves;
    // writing blocks back splits it again and joins each with its written neighbours.
    let mut d = Model::create(&fs, b"d", 9)?;
    let run: Vec<u8> = (0..2000).flat_map(|k| block_bytes(d.seed, k)).collect();
    fs.write(d.ino, 0, &run)?;
    d.bytes = run;
    fs.sync()?;
    for k in (1..2000u64).step_by(2) {
        fs.zero_range(d.ino, k * BS, BS, true)?;
        d.zero(k * BS, BS);
    }
    fs.sync()?;
    assert!(
        tree_blocks(&fs, d.ino, 2000)? >= 24,
        "{}",
        what("zeroed comb")
    );
    for k in (500..1500u64).step_by(2) {
        fs.zero_range(d.ino, k * BS, BS, true)?;
        d.zero(k * BS, BS);
    }
    fs.sync()?;
    for k in (700..1300u64).step_by(3) {
        d.write_block(&fs, k)?;
    }
    d.check(&fs, &what("joined"))?;

    fs.unmount()?;
    drop(fs);
    common::assert_fsck_clean(&img);
    let fs = Fs::open(&img, &options(mode))?;
    for m in [&a, &b, &c, &d] {
        assert_eq!(fs.lookup(ROOT_INO, m.name)?.ino, m.ino);
        m.check(&fs, &what("after remount"))?;
    }
    // The reloaded trees take more edits: fill every hole of `a`'s first part.
    for k in 0..1000u64 {
        if a.bytes[(k * BS) as usize] == 0 {
            a.write_block(&fs, k)?;
        }
    }
    a.check(&fs, &what("refilled"))?;
    fs.unmount()?;
    drop(fs);
    common::assert_fsck_clean(&img);
    let fs = Fs::open(&img, &options(mode))?;
    a.check(&fs, &what("refilled, after remount"))?;
    fs.unmount()?;
    drop(fs);
    kernel_reads(&img, &[&a, &b, &c, &d])
}

/// The kernel's ext4 reads the files of `models` from `img` as the models say.
fn kernel_reads(img: &Path, models: &[&Model]) -> TestResult {
    if !common::can_loop_mount() {
        return Ok(());
    }
    let km = common::KernelMount::mount(img, "ro")?;
    for m in models {
        let name = std::str::from_utf8(m.name)?;
        let got = std::fs::read(km.path().join(name))?;
        assert!(got == m.bytes, "the kernel reads {name} differently");
    }
    km.umount();
    Ok(())
}

#[test]
fn fragmented_files_stay_valid_ordered() -> TestResult {
    if !common::have_e2fsprogs() {
        return Ok(());
    }
    fragmented_in_mode(DataMode::Ordered)
}

#[test]
fn fragmented_files_stay_valid_journal() -> TestResult {
    if !common::have_e2fsprogs() {
        return Ok(());
    }
    fragmented_in_mode(DataMode::Journal)
}

/// A fragmented tree the kernel made (its leaves split where it appended) is loaded and
/// edited in place by tidefs, and the result is clean for `e2fsck -fn` and read back by the
/// kernel.
#[test]
fn kernel_made_fragmented_tree_edited_in_place() -> TestResult {
    if !common::have_e2fsprogs() || !common::can_loop_mount() {
        return Ok(());
    }
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir()?;
    let img = image(dir.path(), "kernel.img");
    let mut a = Model {
        ino: 0,
        name: b"a",
        seed: 21,
        bytes: Vec::new(),
    };
    {
        let km = common::KernelMount::mount(&img, "rw")?;
        let f = std::fs::File::create(km.path().join("a"))?;
        for k in 0..3000u64 {
            let bytes = block_bytes(a.seed, 2 * k);
            f.write_all_at(&bytes, 2 * k * BS)?;
            if k % 100 == 99 {
                f.sync_all()?;
            }
        }
        f.sync_all()?;
        drop(f);
        km.umount();
    }
    for k in 0..3000u64 {
        let b = block_bytes(a.seed, 2 * k);
        let at = (2 * k * BS) as usize;
        a.bytes.resize(at + b.len(), 0);
        a.bytes[at..].copy_from_slice(&b);
    }
    let fs = Fs::open(&img, &options(DataMode::Ordered))?;
    a.ino = fs.lookup(ROOT_INO, b"a")?.ino;
    assert!(tree_blocks(&fs, a.ino, 3000)? >= 36, "the kernel's tree");
    a.check(&fs, "the kernel's file")?;
    for k in (1001..1800u64).step_by(2) {
        a.write_block(&fs, k)?;
    }
    fs.sync()?;
    fs.punch_hole(a.ino, 3000 * BS, 1500 * BS)?;
    a.zero(3000 * BS, 1500 * BS);
    a.write_block(&fs, 1)?;
    a.truncate(&fs, 5000 * BS)?;
    a.check(&fs, "edited")?;
    fs.unmount()?;
    drop(fs);
    common::assert_fsck_clean(&img);
    kernel_reads(&img, &[&a])
}

/// Blocks the next commit writes to the journal after `change`.
fn journal_blocks_of(
    fs: &Fs,
    change: impl FnOnce() -> TestResult,
) -> Result<u64, Box<dyn std::error::Error>> {
    let before = fs.stats();
    change()?;
    fs.sync()?;
    let after = fs.stats();
    assert_eq!(after.commits, before.commits + 1, "one commit");
    Ok((after.journal_bytes - before.journal_bytes) / BS)
}

#[test]
fn a_small_change_to_a_fragmented_file_writes_few_tree_blocks() -> TestResult {
    if !common::have_e2fsprogs() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let img = image(dir.path(), "small.img");
    let fs = Fs::open(&img, &options(DataMode::Ordered))?;
    let mut a = Model::create(&fs, b"a", 3)?;
    let mut b = Model::create(&fs, b"b", 4)?;
    write_interleaved(&fs, &mut a, &mut b, 4000)?;
    let leaves = tree_blocks(&fs, a.ino, 4000)?;
    assert!(leaves >= 48, "{leaves} tree blocks");
    // Each change below, near the start of the file, moves every later extent by one slot if
    // the tree is rebuilt from the list: about 48 leaves. In place it costs the leaf, maybe a
    // new leaf and the index block, plus the inode, bitmap and group descriptor blocks and
    // the commit's own descriptor and commit blocks.
    let bound = 12;
    let insert = journal_blocks_of(&fs, || Ok(a.write_block(&fs, 5)?))?;
    let punch = journal_blocks_of(&fs, || {
        fs.punch_hole(a.ino, 40 * BS, BS)?;
        a.zero(40 * BS, BS);
        Ok(())
    })?;
    let zero = journal_blocks_of(&fs, || {
        fs.zero_range(a.ino, 80 * BS, BS, true)?;
        a.zero(80 * BS, BS);
        Ok(())
    })?;
    let rewrite = journal_blocks_of(&fs, || Ok(a.write_block(&fs, 80)?))?;
    eprintln!(
        "journal blocks per commit, {leaves} tree blocks: insert {insert}, punch {punch}, \
         zero range {zero}, write into unwritten {rewrite}"
    );
    for (what, n) in [
        ("insert", insert),
        ("punch", punch),
        ("zero range", zero),
        ("write into unwritten", rewrite),
    ] {
        assert!(n <= bound, "{what}: {n} journal blocks");
    }
    a.check(&fs, "changed")?;
    fs.unmount()?;
    drop(fs);
    common::assert_fsck_clean(&img);
    let fs = Fs::open(&img, &options(DataMode::Ordered))?;
    a.check(&fs, "after remount")?;
    b.check(&fs, "after remount")?;
    fs.unmount()?;
    Ok(())
}
