//! Goal: `Fs::punch_hole` (FALLOC_FL_PUNCH_HOLE | KEEP_SIZE) and `Fs::zero_range`
//! (FALLOC_FL_ZERO_RANGE) in every data mode: the range reads as zeros and the bytes around it
//! keep their data, punching frees the whole blocks inside the range (the inode's block count
//! drops) while zeroing keeps or makes the range allocated, the size changes only where Linux
//! changes it, the image stays clean by the real `e2fsck -fn`, and a crash leaves each block
//! either as it was or as the operation left it, never a mix.
//! Method: files with a known pattern on fresh `mkfs.ext4` images, one mount per data mode;
//! every operation is mirrored on an in-memory model of the file's bytes, and whole-file reads
//! are compared with the model before and after a clean remount. The crash test stops the file
//! system with `Fs::crash()` (no commit, nothing more written) with the commit timer far away,
//! reopens it (journal replay) and compares block by block with the states before and after.

mod common;

use std::time::Duration;

use tidefs::fs::{Attr, Creds, DataMode, Fs, Ino, MountOptions, ROOT_INO};
use tidefs::FsError;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const BS: u64 = 4096;
/// 512-byte sectors per block, the unit of `Attr::blocks`.
const SECTORS: u64 = BS / 512;

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add((i % 251) as u8).max(1))
        .collect()
}

/// Mount options for `mode`; the commit timer never fires during a test, so only fsync and
/// unmount commit.
fn options(mode: DataMode) -> MountOptions {
    MountOptions {
        data_mode: mode,
        commit_interval: Duration::from_secs(3600),
        ..MountOptions::default()
    }
}

/// A file with its expected bytes.
struct Model {
    ino: Ino,
    name: &'static [u8],
    bytes: Vec<u8>,
}

impl Model {
    /// A file whose data is written back (allocated on disk), so the range operations act on
    /// real blocks; `cached` below covers data still in the page cache.
    fn create(fs: &Fs, name: &'static [u8], bytes: Vec<u8>) -> Result<Model, FsError> {
        let f = fs.create(ROOT_INO, name, 0o100644, 0, Creds::ROOT)?;
        fs.write(f.ino, 0, &bytes)?;
        fs.fsync(f.ino, true)?;
        Ok(Model {
            ino: f.ino,
            name,
            bytes,
        })
    }

    fn zero(&mut self, offset: usize, len: usize) {
        let end = (offset + len).min(self.bytes.len());
        if offset < end {
            self.bytes[offset..end].fill(0);
        }
    }

    fn check(&self, fs: &Fs, what: &str) -> Result<Attr, FsError> {
        let attr = fs.getattr(self.ino)?;
        assert_eq!(attr.size, self.bytes.len() as u64, "{what}: size");
        let got = fs.read(self.ino, 0, self.bytes.len() as u32 + 10_000)?;
        assert!(got == self.bytes, "{what}: contents differ from the model");
        Ok(attr)
    }
}

fn punch_in_mode(mode: DataMode) -> TestResult {
    let dir = tempfile::tempdir()?;
    let img = common::mkimage(dir.path(), "p.img", 64, &[]);
    let fs = Fs::open(&img, &options(mode))?;
    let what = |case: &str| format!("{mode:?} {case}");

    // The middle of a file, both ends unaligned: blocks 2..8 are wholly inside.
    let mut mid = Model::create(&fs, b"middle", pattern(1, 40 * BS as usize))?;
    let before = fs.getattr(mid.ino)?.blocks;
    assert_eq!(before, 40 * SECTORS);
    fs.punch_hole(mid.ino, 5000, 30_000)?;
    mid.zero(5000, 30_000);
    let a = mid.check(&fs, &what("middle"))?;
    assert_eq!(a.blocks, before - 6 * SECTORS, "{}", what("middle blocks"));
    // The hole takes new data again.
    fs.write(mid.ino, 20_000, b"refill")?;
    mid.bytes[20_000..20_006].copy_from_slice(b"refill");
    let a = mid.check(&fs, &what("refilled"))?;
    assert_eq!(a.blocks, before - 5 * SECTORS);

    // The edges: the first two blocks, then the last 3000 bytes (a partial block, kept).
    let mut edges = Model::create(&fs, b"edges", pattern(2, 10 * BS as usize - 100))?;
    fs.punch_hole(edges.ino, 0, 2 * BS)?;
    edges.zero(0, 2 * BS as usize);
    let len = edges.bytes.len();
    fs.punch_hole(edges.ino, len as u64 - 3000, 3000)?;
    edges.zero(len - 3000, 3000);
    let a = edges.check(&fs, &what("edges"))?;
    assert_eq!(a.blocks, 8 * SECTORS, "{}", what("edges blocks"));

    // A range inside one block frees nothing and zeroes its bytes.
    let mut small = Model::create(&fs, b"small", pattern(3, 3 * BS as usize))?;
    fs.punch_hole(small.ino, 4196, 200)?;
    small.zero(4196, 200);
    assert_eq!(small.check(&fs, &what("small"))?.blocks, 3 * SECTORS);

    // The whole file: every block goes, the size stays.
    let mut whole = Model::create(&fs, b"whole", pattern(4, 100_000))?;
    fs.punch_hole(whole.ino, 0, 100_000)?;
    whole.zero(0, 100_000);
    assert_eq!(whole.check(&fs, &what("whole"))?.blocks, 0);

    // Beyond the end of file: the tail of the last block is zeroed, the blocks preallocated
    // past the end inside the range are freed, the size does not grow.
    let mut tail = Model::create(&fs, b"tail", pattern(5, 5 * BS as usize + 500))?;
    fs.fallocate(tail.ino, 6 * BS, 10 * BS, true)?;
    assert_eq!(fs.getattr(tail.ino)?.blocks, 16 * SECTORS);
    fs.punch_hole(tail.ino, 5 * BS + 100, 1 << 30)?;
    tail.zero(5 * BS as usize + 100, 1 << 30);
    assert_eq!(tail.check(&fs, &what("tail"))?.blocks, 6 * SECTORS);
    // Entirely past the end: nothing changes.
    fs.punch_hole(tail.ino, 1 << 30, BS)?;
    assert_eq!(tail.check(&fs, &what("past"))?.blocks, 6 * SECTORS);

    // Many holes split one extent into more than the inode holds: the tree grows a leaf.
    let mut comb = Model::create(&fs, b"comb", pattern(6, 64 * BS as usize))?;
    for k in 0..16u64 {
        fs.punch_hole(comb.ino, (4 * k + 1) * BS, BS)?;
        comb.zero(((4 * k + 1) * BS) as usize, BS as usize);
    }
    let a = comb.check(&fs, &what("comb"))?;
    // 48 data blocks plus one extent-tree leaf.
    assert_eq!(a.blocks, 49 * SECTORS, "{}", what("comb blocks"));

    // Data still in the page cache (delayed allocation): the punched pages are dropped and
    // their reserved blocks returned; what is left is allocated at the next commit.
    let f = fs.create(ROOT_INO, b"cached", 0o100644, 0, Creds::ROOT)?;
    let mut cached = Model {
        ino: f.ino,
        name: b"cached",
        bytes: pattern(9, 8 * BS as usize),
    };
    fs.write(cached.ino, 0, &cached.bytes)?;
    fs.punch_hole(cached.ino, BS + 10, 3 * BS)?;
    cached.zero(BS as usize + 10, 3 * BS as usize);
    assert_eq!(cached.check(&fs, &what("cached"))?.blocks, 6 * SECTORS);
    fs.fsync(cached.ino, false)?;
    assert_eq!(cached.check(&fs, &what("cached"))?.blocks, 6 * SECTORS);

    assert!(matches!(
        fs.punch_hole(mid.ino, 0, 0),
        Err(FsError::Invalid(_))
    ));
    assert!(matches!(
        fs.punch_hole(ROOT_INO, 0, BS),
        Err(FsError::IsDir)
    ));

    fs.unmount()?;
    drop(fs);
    common::assert_fsck_clean(&img);
    let fs = Fs::open(&img, &options(mode))?;
    for m in [&mid, &edges, &small, &whole, &tail, &comb, &cached] {
        let found = fs.lookup(ROOT_INO, m.name)?;
        assert_eq!(found.ino, m.ino);
        m.check(&fs, &what("after remount"))?;
    }
    fs.unmount()?;
    Ok(())
}

fn zero_range_in_mode(mode: DataMode) -> TestResult {
    let dir = tempfile::tempdir()?;
    let img = common::mkimage(dir.path(), "z.img", 64, &[]);
    let fs = Fs::open(&img, &options(mode))?;
    let what = |case: &str| format!("{mode:?} {case}");

    // Inside written data: zeros, every block stays allocated, the size stays.
    let mut inside = Model::create(&fs, b"inside", pattern(7, 10 * BS as usize))?;
    fs.zero_range(inside.ino, 5000, 20_000, false)?;
    inside.zero(5000, 20_000);
    assert_eq!(inside.check(&fs, &what("inside"))?.blocks, 10 * SECTORS);
    // Data written into the zeroed (now unwritten) blocks reads back, zeros around it.
    fs.write(inside.ino, 3 * BS + 10, b"again")?;
    inside.bytes[3 * BS as usize + 10..3 * BS as usize + 15].copy_from_slice(b"again");
    inside.check(&fs, &what("rewritten"))?;

    // Past the end without KEEP_SIZE: the size grows to the end of the range and the new
    // blocks are allocated.
    let mut grow = Model::create(&fs, b"grow", pattern(8, 2 * BS as usize + 100))?;
    fs.zero_range(grow.ino, 2 * BS, 3 * BS, false)?;
    grow.zero(2 * BS as usize, 100);
    grow.bytes.resize(5 * BS as usize, 0);
    assert_eq!(grow.check(&fs, &what("grow"))?.blocks, 5 * SECTORS);

    // With KEEP_SIZE the size stays, the blocks are still allocated.
    let mut keep = Model::create(&fs, b"keep", pattern(9, BS as usize))?;
    fs.zero_range(keep.ino, 100, 4 * BS, true)?;
    keep.zero(100, 4 * BS as usize);
    assert_eq!(keep.check(&fs, &what("keep"))?.blocks, 5 * SECTORS);

    // Over a hole of a sparse file: the hole becomes allocated and reads as zeros.
    let mut sparse = Model::create(&fs, b"sparse", Vec::new())?;
    fs.write(sparse.ino, 8 * BS, b"end")?;
    sparse.bytes = vec![0; 8 * BS as usize];
    sparse.bytes.extend_from_slice(b"end");
    assert_eq!(fs.getattr(sparse.ino)?.blocks, SECTORS);
    fs.zero_range(sparse.ino, BS, 2 * BS, false)?;
    assert_eq!(sparse.check(&fs, &what("sparse"))?.blocks, 3 * SECTORS);

    assert!(matches!(
        fs.zero_range(inside.ino, 0, 0, false),
        Err(FsError::Invalid(_))
    ));
    assert!(matches!(
        fs.zero_range(inside.ino, 1 << 45, BS, false),
        Err(FsError::FileTooBig)
    ));

    fs.unmount()?;
    drop(fs);
    common::assert_fsck_clean(&img);
    let fs = Fs::open(&img, &options(mode))?;
    for m in [&inside, &grow, &keep, &sparse] {
        fs.lookup(ROOT_INO, m.name)?;
        m.check(&fs, &what("after remount"))?;
    }
    fs.unmount()?;
    Ok(())
}

/// Punches and zeroes ranges on a committed file, crashes (after an fsync if `synced`),
/// recovers, and checks every block against the states before and after.
fn crash_in_mode(mode: DataMode, synced: bool) -> TestResult {
    let dir = tempfile::tempdir()?;
    let img = common::mkimage(dir.path(), "c.img", 64, &[]);
    let fs = Fs::open(&img, &options(mode))?;
    let old = pattern(10, 16 * BS as usize);
    let mut file = Model::create(&fs, b"f", old.clone())?;
    fs.fsync(file.ino, false)?;
    fs.punch_hole(file.ino, 5000, 30_000)?;
    file.zero(5000, 30_000);
    fs.zero_range(file.ino, 10 * BS + 700, 3 * BS, true)?;
    file.zero(10 * BS as usize + 700, 3 * BS as usize);
    let new = file.bytes.clone();
    if synced {
        fs.fsync(file.ino, false)?;
    }
    fs.crash();
    drop(fs);

    let fs = Fs::open(&img, &options(mode))?;
    let f = fs.lookup(ROOT_INO, b"f")?;
    let got = fs.read(f.ino, 0, old.len() as u32)?;
    assert_eq!(got.len(), old.len(), "{mode:?}: size after the crash");
    if synced {
        assert!(
            got == new,
            "{mode:?}: an fsync'd punch must survive the crash"
        );
    } else if mode == DataMode::Journal {
        // The zeros of the partial blocks went through the journal like any write, and the
        // transaction never committed: the file is as it was.
        assert!(
            got == old,
            "{mode:?}: the uncommitted punch must leave no trace"
        );
    }
    for (k, block) in got.chunks(BS as usize).enumerate() {
        let range = k * BS as usize..(k + 1) * BS as usize;
        assert!(
            block == &old[range.clone()] || block == &new[range],
            "{mode:?} synced={synced}: block {k} is neither the old nor the new state"
        );
    }
    fs.unmount()?;
    drop(fs);
    if mode == DataMode::Lightweight {
        // Its frees reach the bitmaps one commit after the punch: a crash leaks them.
        common::assert_fsck_clean_but_leaks(&img);
    } else {
        common::assert_fsck_clean(&img);
    }
    Ok(())
}

#[test]
fn punch_hole_frees_blocks_and_reads_zeros_in_every_mode() -> TestResult {
    if !common::have_e2fsprogs() {
        return Ok(());
    }
    for mode in DataMode::ALL {
        punch_in_mode(mode)?;
    }
    Ok(())
}

#[test]
fn zero_range_keeps_blocks_and_reads_zeros_in_every_mode() -> TestResult {
    if !common::have_e2fsprogs() {
        return Ok(());
    }
    for mode in DataMode::ALL {
        zero_range_in_mode(mode)?;
    }
    Ok(())
}

#[test]
fn punch_and_zero_survive_a_crash_whole_per_block_in_every_mode() -> TestResult {
    if !common::have_e2fsprogs() {
        return Ok(());
    }
    for mode in DataMode::ALL {
        crash_in_mode(mode, true)?;
        crash_in_mode(mode, false)?;
    }
    Ok(())
}

/// Writes six blocks, fsyncs, punches the four in the middle, fsyncs, crashes; returns the
/// revoke records recovery found.
fn revokes_after_punch(mode: DataMode) -> Result<u64, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let img = common::mkimage(dir.path(), "r.img", 64, &[]);
    let fs = Fs::open(&img, &options(mode))?;
    let mut file = Model::create(&fs, b"f", pattern(11, 6 * BS as usize))?;
    fs.fsync(file.ino, false)?;
    fs.punch_hole(file.ino, BS, 4 * BS)?;
    file.zero(BS as usize, 4 * BS as usize);
    fs.fsync(file.ino, false)?;
    fs.crash();
    drop(fs);
    let fs = Fs::open(&img, &options(mode))?;
    let revokes = fs.recovery_report().map_or(0, |r| r.revoke_records);
    assert_eq!(fs.lookup(ROOT_INO, b"f")?.blocks, 2 * SECTORS);
    file.check(&fs, &format!("{mode:?} after replay"))?;
    fs.unmount()?;
    drop(fs);
    common::assert_fsck_clean(&img);
    Ok(revokes)
}

#[test]
fn punched_blocks_logged_in_journal_mode_are_revoked() -> TestResult {
    if !common::have_e2fsprogs() {
        return Ok(());
    }
    // Journal mode logged the data blocks, so freeing them must revoke the logged copies
    // (replay would otherwise write stale data over a later use); ordered mode never logged
    // them and revokes nothing.
    assert!(revokes_after_punch(DataMode::Journal)? >= 4);
    assert_eq!(revokes_after_punch(DataMode::Ordered)?, 0);
    Ok(())
}
