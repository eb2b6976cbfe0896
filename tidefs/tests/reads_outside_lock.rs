//! Goal: an operation that must read the device does not hold up the others while it waits
//! for the read (docs/DESIGN.md §2.5, "Device reads outside the lock"): a write and a readdir
//! of what is cached complete while a lookup waits for a cold inode-table block, and the
//! lookup then answers correctly. And a block read without the lock is never used once a
//! newer copy exists: under constant cache eviction, threads that change files sharing
//! inode-table blocks and bitmaps read back exactly what they wrote, before and after a
//! remount, and `e2fsck -fn` finds the image clean.
//!
//! Method: images from the real `mkfs.ext4`, served from memory through a device that, once
//! armed, holds every read until released (or slows every read, to widen the window between
//! a read's plan and its use). The cold lookup runs on one thread; the cached operations run
//! on another and must finish within a generous bound while the read is held (a hang there is
//! the failure this test exists for; the bound is not a speed test).

mod common;

use std::path::Path;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use common::HeldDev;
use tidefs::dev::{BlockDevice, MemDev};
use tidefs::fs::{Creds, DataMode, Fs, MountOptions, RenameFlags, ROOT_INO};
use tidefs::FsError;

/// An image from the real mkfs.ext4, served from memory.
fn image_in_memory(dir: &Path, name: &str, size_mb: u64, extra: &[&str]) -> Arc<MemDev> {
    let img = common::mkimage(dir, name, size_mb, extra);
    Arc::new(MemDev::from_bytes(std::fs::read(img).unwrap()))
}

/// The smallest caches (64 metadata blocks, 64 pages of data), so blocks and pages come and
/// go all the time.
fn smallest_caches() -> MountOptions {
    MountOptions {
        cache_size_bytes: 0,
        ..MountOptions::default()
    }
}

/// Unmounts `fs` (its other holders are gone), mounts `mem` again with default options, runs
/// `check` there, unmounts, and runs `e2fsck -fn` on the bytes.
fn after_remount(
    fs: impl std::ops::Deref<Target = Fs>,
    mem: &Arc<MemDev>,
    check: impl FnOnce(&Fs),
) {
    fs.unmount().unwrap();
    drop(fs);
    let fs = Fs::open_devices(mem.clone(), None, &MountOptions::default()).unwrap();
    check(&fs);
    fs.unmount().unwrap();
    drop(fs);
    common::assert_mem_fsck_clean(mem);
}

/// Whether `bytes` hold one value, and not zero: a file rewritten whole with one nonzero byte
/// value, read at one moment.
fn uniform(bytes: &[u8]) -> bool {
    bytes.iter().all(|b| *b == bytes[0]) && bytes.first() != Some(&0)
}

/// Two threads reading random files of `inos` whole (up to `len` bytes) until `stop`; every
/// read must show one value ([`uniform`]), or be empty if `empty_ok` (files emptied before
/// they are rewritten). `what` starts each failure message. Returns the threads and the
/// count of reads done.
fn uniform_readers(
    fs: &Arc<Fs>,
    inos: &[u64],
    len: u32,
    empty_ok: bool,
    what: &str,
    stop: &Arc<std::sync::atomic::AtomicBool>,
) -> (
    Vec<std::thread::JoinHandle<()>>,
    Arc<std::sync::atomic::AtomicU64>,
) {
    let reads = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let readers = (0..2u64)
        .map(|t| {
            let (fs, inos, stop, reads) = (fs.clone(), inos.to_vec(), stop.clone(), reads.clone());
            let what = what.to_string();
            std::thread::spawn(move || {
                let mut rng = common::Rng(0x51_7CC1_B727_220A ^ (t + 1));
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let k = rng.below(inos.len() as u64) as usize;
                    let back = fs.read(inos[k], 0, len).unwrap();
                    assert!(
                        (empty_ok && back.is_empty()) || uniform(&back),
                        "{what}file {k}: a read of {} bytes mixes values {:?}",
                        back.len(),
                        back.iter().collect::<std::collections::BTreeSet<_>>()
                    );
                    reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            })
        })
        .collect();
    (readers, reads)
}

/// Reads every file of `inos` (up to `len` bytes), remounts (`after_remount`), and checks that
/// each still holds one value, the same as before.
fn assert_uniform_across_remount(
    fs: Arc<Fs>,
    mem: &Arc<MemDev>,
    inos: &[u64],
    len: u32,
    what: &str,
) {
    let finals: Vec<Vec<u8>> = inos
        .iter()
        .map(|&ino| fs.read(ino, 0, len).unwrap())
        .collect();
    after_remount(fs, mem, |fs| {
        for (k, (&ino, before)) in inos.iter().zip(&finals).enumerate() {
            let after = fs.read(ino, 0, len).unwrap();
            assert!(uniform(&after), "{what}file {k} after the remount");
            assert!(
                after == *before,
                "{what}file {k} changed across the remount"
            );
        }
    });
}

/// Number of entries readdir lists in the root.
fn names(fs: &Fs) -> usize {
    let mut n = 0;
    fs.readdir(ROOT_INO, 0, &mut |_| {
        n += 1;
        true
    })
    .unwrap();
    n
}

#[test]
fn cached_operations_do_not_wait_for_another_operations_device_read() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mem = image_in_memory(dir.path(), "held.img", 16, &[]);
    let creds = Creds::ROOT;
    // 40 files: the first shares an inode-table block with the root, the last is 3 blocks on
    // (256-byte inodes, 16 per 4 KiB block).
    {
        let fs = Fs::open_devices(mem.clone(), None, &MountOptions::default()).unwrap();
        for k in 0..40 {
            fs.create(ROOT_INO, format!("f{k}").as_bytes(), 0o100644, 0, creds)
                .unwrap();
        }
        fs.unmount().unwrap();
    }

    // A cold cache: warm only what the cached operations will use.
    let dev = Arc::new(HeldDev::reads(mem, Duration::ZERO));
    let fs = Arc::new(Fs::open_devices(dev.clone(), None, &MountOptions::default()).unwrap());
    let warm = fs.lookup(ROOT_INO, b"f0").unwrap();
    assert!(names(&fs) >= 40);
    fs.write(warm.ino, 0, &[1u8; 100]).unwrap();
    let cold_ino = warm.ino + 39;

    let lookup = {
        let fs = fs.clone();
        dev.hold_of("the cold lookup", move || fs.lookup(ROOT_INO, b"f39"))
    };
    let (tx, rx) = mpsc::channel();
    {
        let fs = fs.clone();
        std::thread::spawn(move || {
            let w = fs.write(warm.ino, 100, &[2u8; 50]);
            let r = names(&fs);
            let _ = tx.send((w, r));
        });
    }
    let cached = rx.recv_timeout(Duration::from_secs(20));
    dev.release();
    let (w, r) = cached.expect("cached operations waited for another operation's device read");
    assert_eq!(w.unwrap(), 50);
    assert!(r >= 40);
    let attr = lookup.join().unwrap().unwrap();
    assert_eq!(attr.ino, cold_ino);
    assert_eq!(fs.read(warm.ino, 0, 200).unwrap().len(), 150);
    fs.unmount().unwrap();
}

#[test]
fn reads_outside_the_lock_never_use_a_stale_block() {
    if !common::have_e2fsprogs() {
        return;
    }
    const THREADS: u64 = 4;
    const OPS: u64 = 250;
    const FILES: u64 = 12;
    let dir = tempfile::tempdir().unwrap();
    let mem = image_in_memory(dir.path(), "churn.img", 32, &["-J", "size=4"]);
    let dev = Arc::new(HeldDev::reads(mem.clone(), Duration::from_micros(300)));
    let fs = Arc::new(Fs::open_devices(dev.clone(), None, &smallest_caches()).unwrap());
    let creds = Creds::ROOT;
    let reads_at_mount = dev.reads.load(std::sync::atomic::Ordering::Relaxed);
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let d = fs
                    .mkdir(ROOT_INO, format!("d{t}").as_bytes(), 0o755, creds)
                    .unwrap()
                    .ino;
                let mut rng = common::Rng(0x9E37_79B9_7F4A_7C15 ^ (t + 1));
                // Name -> expected content.
                let mut model: std::collections::BTreeMap<String, Vec<u8>> = Default::default();
                for op in 0..OPS {
                    let name = format!("f{}", rng.below(FILES));
                    match (model.contains_key(&name), rng.below(10)) {
                        (false, _) => {
                            fs.create(d, name.as_bytes(), 0o100644, 0, creds).unwrap();
                            model.insert(name, Vec::new());
                        }
                        (true, 0) => {
                            fs.unlink(d, name.as_bytes()).unwrap();
                            model.remove(&name);
                        }
                        (true, 1) => {
                            let to = format!("f{}", rng.below(FILES));
                            fs.rename(d, name.as_bytes(), d, to.as_bytes(), RenameFlags::default())
                                .unwrap();
                            let content = model.remove(&name).unwrap();
                            model.insert(to, content);
                        }
                        (true, k) => {
                            let ino = fs.lookup(d, name.as_bytes()).unwrap().ino;
                            let content = model.get_mut(&name).unwrap();
                            // Partial blocks at any offset: the old bytes of blocks on disk
                            // are read first.
                            let at = rng.below(40_000) as usize;
                            let len = 1 + rng.below(6000) as usize;
                            let bytes = rng.bytes(len);
                            assert_eq!(
                                fs.write(ino, at as u64, &bytes).unwrap() as usize,
                                bytes.len()
                            );
                            if content.len() < at + bytes.len() {
                                content.resize(at + bytes.len(), 0);
                            }
                            content[at..at + bytes.len()].copy_from_slice(&bytes);
                            if k <= 4 {
                                fs.fsync(ino, op % 2 == 0).unwrap();
                            }
                            let back = fs.read(ino, 0, content.len() as u32 + 10).unwrap();
                            assert!(
                                back == *content,
                                "thread {t} op {op}: {name} reads back wrong"
                            );
                        }
                    }
                }
                (d, model)
            })
        })
        .collect();
    let results: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    let check = |fs: &Fs| {
        for (t, (_, model)) in results.iter().enumerate() {
            let d = fs.lookup(ROOT_INO, format!("d{t}").as_bytes()).unwrap().ino;
            for (name, content) in model {
                let ino = fs.lookup(d, name.as_bytes()).unwrap().ino;
                assert!(
                    fs.read(ino, 0, content.len() as u32 + 10).unwrap() == *content,
                    "d{t}/{name}"
                );
            }
        }
    };
    check(&fs);
    let reads = dev.reads.load(std::sync::atomic::Ordering::Relaxed) - reads_at_mount;
    eprintln!("device reads while the threads ran: {reads}");
    // Typically 1 000–1 400 device reads (fewer since the attributes of a file are cached
    // again after each change, 2026-11-26: one clean-clone run saw 982); the bound only
    // checks that the smallest caches made the threads read the device again and again.
    assert!(reads > 400, "the caches were meant to churn: {reads} reads");
    after_remount(fs, &mem, check);
}

/// A fresh image behind a [`HeldDev`] device with file `old` (8 KiB of `x`) and an empty
/// file `other`, synced and out of the caches; what a deletion, a create, a commit and a
/// write-back need is warmed (a file written and synced) without caching the old file's
/// second block. With `published`, the first block of `old` is read, which publishes its
/// map, so a read of the second block is planned without the metadata lock; else only its
/// attributes are cached.
struct HeldFile {
    _dir: tempfile::TempDir,
    mem: Arc<MemDev>,
    dev: Arc<HeldDev>,
    fs: Arc<Fs>,
    old: u64,
    other: u64,
}

fn held_file(published: bool) -> HeldFile {
    let dir = tempfile::tempdir().unwrap();
    let mem = image_in_memory(dir.path(), "held.img", 16, &[]);
    let dev = Arc::new(HeldDev::reads(mem.clone(), Duration::ZERO));
    let fs = Arc::new(Fs::open_devices(dev.clone(), None, &MountOptions::default()).unwrap());
    let creds = Creds::ROOT;
    let old = fs.create(ROOT_INO, b"old", 0o100644, 0, creds).unwrap().ino;
    fs.write(old, 0, &[b'x'; 8192]).unwrap();
    let other = fs.create(ROOT_INO, b"other", 0o100644, 0, creds);
    let other = other.unwrap().ino;
    fs.sync().unwrap();
    fs.drop_caches().unwrap();
    let warm = fs.create(ROOT_INO, b"warm", 0o100644, 0, creds);
    fs.write(warm.unwrap().ino, 0, &[1u8; 4096]).unwrap();
    fs.getattr(other).unwrap();
    fs.sync().unwrap();
    if published {
        assert_eq!(fs.read(old, 0, 4096).unwrap(), vec![b'x'; 4096]);
    } else {
        fs.getattr(old).unwrap();
    }
    HeldFile {
        _dir: dir,
        mem,
        dev,
        fs,
        old,
        other,
    }
}

/// Holds a read of the second block of `old` at the device and runs `work` on another thread
/// meanwhile, which must finish without a device read; then lets the read go. Returns what
/// `work` and the read returned.
fn race_held_read<T: Send + 'static>(
    h: &HeldFile,
    work: impl FnOnce(&Fs) -> tidefs::Result<T> + Send + 'static,
) -> (tidefs::Result<T>, tidefs::Result<Vec<u8>>) {
    let reader = {
        let (fs, old) = (h.fs.clone(), h.old);
        h.dev.hold_of("the read", move || fs.read(old, 4096, 4096))
    };
    let (tx, rx) = mpsc::channel();
    let fs = h.fs.clone();
    std::thread::spawn(move || {
        let _ = tx.send(work(&fs));
    });
    let done = rx.recv_timeout(Duration::from_secs(20));
    h.dev.release();
    let done = done.expect("the work waited for the held read");
    (done, reader.join().unwrap())
}

/// Goal: a block read from the device for a file that is deleted meanwhile is not kept as a
/// page of the file that reuses its number, whether the read was planned under the metadata
/// lock or without it, through the block map an earlier read published. Method: the read is
/// held at the device while the file is unlinked and a create reuses its number; the new
/// file, written after a hole, must read zeros there, also after a remount. Fails if the page
/// cache keeps what the read fetched without checking for drops since the read was planned.
#[test]
fn a_read_of_a_deleted_file_is_not_cached_for_the_file_that_reuses_its_number() {
    if !common::have_e2fsprogs() {
        return;
    }
    for published in [false, true] {
        let h = held_file(published);
        let (fs, old) = (h.fs.clone(), h.old);
        let (new, read) = race_held_read(&h, |fs| {
            fs.unlink(ROOT_INO, b"old")?;
            fs.create(ROOT_INO, b"new", 0o100644, 0, Creds::ROOT)
        });
        let new = new.unwrap().ino;
        assert_eq!(
            new, old,
            "the new file was meant to reuse the old one's number"
        );
        // Planned before the unlink, read after it: the read is planned again and finds the
        // number's new file, still empty (the old file's blocks may be another's by then).
        assert_eq!(read.unwrap(), Vec::<u8>::new());
        fs.write(new, 4196, b"0123456789").unwrap();
        let mut expected = vec![0u8; 100];
        expected.extend_from_slice(b"0123456789");
        assert_eq!(
            fs.read(new, 4096, 4096).unwrap(),
            expected,
            "published map: {published}"
        );
        fs.sync().unwrap();
        fs.drop_caches().unwrap();
        assert_eq!(fs.read(new, 4096, 4096).unwrap(), expected);
        fs.unmount().unwrap();
        drop(fs);
        common::assert_mem_fsck_clean(&h.mem);
    }
}

/// Goal: a read held at the device while its file is deleted, and the freed blocks are
/// allocated to another file and written, never returns that other file's bytes: whether
/// planned under the metadata lock or through a published map, it plans again after the
/// deletion and finds the file gone. Method: the read is held while the file is unlinked, the
/// freeing committed, and another file (made before, so with another number) written and
/// synced into the freed blocks; the held read must then fail with NotFound. Fails if a read
/// returns what it fetched without checking for drops of its file since its plan.
#[test]
fn a_read_racing_its_files_deletion_never_returns_another_files_bytes() {
    if !common::have_e2fsprogs() {
        return;
    }
    for published in [false, true] {
        let h = held_file(published);
        let (fs, other) = (h.fs.clone(), h.other);
        let (done, got) = race_held_read(&h, move |fs| {
            fs.unlink(ROOT_INO, b"old")?;
            fs.sync()?;
            fs.write(other, 0, &[b'y'; 8192])?;
            fs.sync()
        });
        done.unwrap();
        assert!(
            matches!(got, Err(FsError::NotFound)),
            "published map: {published}: the read of the deleted file gave {:?}",
            got.map(|b| b
                .iter()
                .copied()
                .collect::<std::collections::BTreeSet<u8>>())
        );
        assert_eq!(fs.read(other, 0, 8192).unwrap(), vec![b'y'; 8192]);
        fs.unmount().unwrap();
        drop(fs);
        common::assert_mem_fsck_clean(&h.mem);
    }
}

/// Goal: a read sees whole writes while reads are served from the page cache without the
/// metadata lock, or fetched from the device and cached, under constant eviction, write-back
/// and cache drops: each writer empties its files and rewrites them with one byte value, so
/// a read that mixes two values, or old bytes with zeros, saw a page that was not the file's
/// content. Afterwards, across a remount, every file still holds one value, and `e2fsck -fn`
/// finds the image clean. (Fails, for one, if a read served from the pages alone returns the
/// zeros past the file's end in its last page.)
#[test]
fn concurrent_reads_see_whole_writes_through_eviction_and_write_back() {
    if !common::have_e2fsprogs() {
        return;
    }
    const FILES: u64 = 6;
    const WRITES: u64 = 300;
    let dir = tempfile::tempdir().unwrap();
    let mem = image_in_memory(dir.path(), "shared.img", 32, &["-J", "size=4"]);
    let fs = Arc::new(Fs::open_devices(mem.clone(), None, &smallest_caches()).unwrap());
    let inos: Vec<u64> = (0..FILES)
        .map(|k| {
            fs.create(
                ROOT_INO,
                format!("s{k}").as_bytes(),
                0o100644,
                0,
                Creds::ROOT,
            )
            .unwrap()
            .ino
        })
        .collect();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (readers, reads) = uniform_readers(&fs, &inos, 32_768, true, "", &stop);
    let dropper = {
        let (fs, stop) = (fs.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(5));
                fs.drop_caches().unwrap();
            }
        })
    };
    // Each writer owns the files of its parity, so a file's content is one write's.
    let writers: Vec<_> = (0..2u64)
        .map(|t| {
            let (fs, inos) = (fs.clone(), inos.clone());
            std::thread::spawn(move || {
                let mut rng = common::Rng(0x2545_F491_4F6C_DD1D ^ (t + 7));
                for op in 0..WRITES {
                    let k = (2 * rng.below(FILES / 2) + t) as usize;
                    let value = 1 + rng.below(255) as u8;
                    let len = 1 + rng.below(5 * 4096 + 100) as usize;
                    let empty = tidefs::fs::SetAttr {
                        size: Some(0),
                        ..Default::default()
                    };
                    fs.setattr(inos[k], &empty).unwrap();
                    assert_eq!(
                        fs.write(inos[k], 0, &vec![value; len]).unwrap() as usize,
                        len
                    );
                    if op % 3 == 0 {
                        fs.fsync(inos[k], op % 2 == 0).unwrap();
                    }
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    dropper.join().unwrap();
    let n = reads.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        n > 100,
        "the readers were meant to run throughout: {n} reads"
    );
    assert_uniform_across_remount(fs, &mem, &inos, 32_768, "");
}

/// Goal: reads that find a file's blocks on the device through its published block map, without
/// the metadata lock (docs/DESIGN.md §2.5), never return a block older than the file's content,
/// in every mode, also when a directory switches to a mode that journals file data while
/// readers hold its files' maps: there, a block's newest copy sits in the buffer cache or the
/// journal (checkpoints held back), and its home is stale. Each writer rewrites whole files
/// with one byte value, in place (and now and then one block longer, so write-back allocates);
/// readers under constant eviction (64 pages for up to 128 blocks of data) read whole files,
/// which must show one value. Across a remount every file keeps its last value; `e2fsck -fn`
/// finds the image clean. Fails if a read without the lock plans from the map alone, ignoring
/// the pages (checked: zeros mixed in). The journaling configurations run the guards of
/// `Inner::plan_read_unlocked` together (no map published while data may be journaled, maps
/// withdrawn at write-back, a committed copy read from the journal); each one alone is not
/// shown to be needed here: with any one removed the test still passes.
#[test]
fn reads_through_published_maps_see_current_blocks_in_every_mode() {
    if !common::have_e2fsprogs() {
        return;
    }
    const FILES: u64 = 8;
    const WRITES: u64 = 200;
    const BLOCK: usize = 4096;
    let configs = [
        (DataMode::Ordered, None),
        (DataMode::Ordered, Some(DataMode::Journal)),
        (DataMode::Ordered, Some(DataMode::Wasteless)),
        (DataMode::Writeback, None),
        (DataMode::Journal, None),
        (DataMode::Wasteless, None),
    ];
    for (mount_mode, switch_to) in configs {
        let what = format!("mount {mount_mode:?}, directory switched to {switch_to:?}: ");
        let dir = tempfile::tempdir().unwrap();
        let mem = image_in_memory(dir.path(), "maps.img", 32, &["-J", "size=4"]);
        let opts = MountOptions {
            data_mode: mount_mode,
            deterministic_writes: true,
            ..smallest_caches()
        };
        let fs = Arc::new(Fs::open_devices(mem.clone(), None, &opts).unwrap());
        let d = fs.mkdir(ROOT_INO, b"d", 0o755, Creds::ROOT).unwrap().ino;
        let inos: Vec<u64> = (0..FILES)
            .map(|k| {
                let ino = fs
                    .create(d, format!("f{k}").as_bytes(), 0o100644, 0, Creds::ROOT)
                    .unwrap()
                    .ino;
                fs.write(ino, 0, &[1u8; 6 * BLOCK]).unwrap();
                ino
            })
            .collect();
        fs.sync().unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (readers, _) = uniform_readers(&fs, &inos, 64 * 1024, false, &what, &stop);
        let mut rng = common::Rng(0xBB67_AE85_84CA_A73B);
        let mut lens = vec![6 * BLOCK; FILES as usize];
        for op in 0..WRITES {
            if op == WRITES / 3 {
                if let Some(mode) = switch_to {
                    fs.set_journal_mode(d, Some(mode)).unwrap();
                }
            }
            let k = rng.below(FILES) as usize;
            let value = 2 + rng.below(250) as u8;
            if rng.below(4) == 0 && lens[k] < 16 * BLOCK {
                lens[k] += BLOCK;
            }
            assert_eq!(
                fs.write(inos[k], 0, &vec![value; lens[k]]).unwrap() as usize,
                lens[k]
            );
            if op % 3 == 0 {
                fs.fsync(inos[k], op % 2 == 0).unwrap();
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for r in readers {
            r.join().unwrap();
        }
        assert_uniform_across_remount(fs, &mem, &inos, 64 * 1024, &what);
    }
}

/// Goal: partial writes into cached pages (clean again after each write-back) stay exact while
/// reads of other files fetch blocks and evict pages without the metadata lock, before and
/// after a remount. Fails if that eviction may drop a dirty page (checked). (The narrower race
/// it was written for, a clean page evicted between a write's look for it and its write into
/// it, is closed by construction in `Meta::put_data`; its window is too small to hit here.)
#[test]
fn writes_into_clean_pages_survive_reads_that_evict() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mem = image_in_memory(dir.path(), "evict.img", 32, &["-J", "size=4"]);
    let fs = Arc::new(Fs::open_devices(mem.clone(), None, &smallest_caches()).unwrap());
    let creds = Creds::ROOT;
    let target = fs.create(ROOT_INO, b"w", 0o100644, 0, creds).unwrap().ino;
    let mut model = vec![1u8; 16 * 4096];
    fs.write(target, 0, &model).unwrap();
    let others: Vec<u64> = (0..4)
        .map(|k| {
            let ino = fs
                .create(ROOT_INO, format!("r{k}").as_bytes(), 0o100644, 0, creds)
                .unwrap()
                .ino;
            fs.write(ino, 0, &vec![2u8; 40 * 4096]).unwrap();
            ino
        })
        .collect();
    fs.sync().unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2u64)
        .map(|t| {
            let (fs, others, stop) = (fs.clone(), others.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut rng = common::Rng(0x3C6E_F372_FE94_F82B ^ (t + 1));
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let ino = others[rng.below(others.len() as u64) as usize];
                    let at = rng.below(40) * 4096;
                    assert_eq!(fs.read(ino, at, 8192).unwrap()[0], 2);
                }
            })
        })
        .collect();
    let mut rng = common::Rng(0x6A09_E667_F3BC_C908);
    for op in 0..3000u64 {
        let at = rng.below(model.len() as u64 - 100) as usize;
        let value = 3 + rng.below(250) as u8;
        fs.write(target, at as u64, &[value; 100]).unwrap();
        model[at..at + 100].fill(value);
        if op % 40 == 0 {
            // Write-back makes the pages clean, so evictable again.
            fs.fsync(target, true).unwrap();
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    assert!(fs.read(target, 0, model.len() as u32).unwrap() == model);
    after_remount(fs, &mem, |fs| {
        assert!(fs.read(target, 0, model.len() as u32).unwrap() == model);
    });
}

/// Goal: the last release of an unlinked file frees it when its inode has left the cache and
/// freeing it stops for device reads (the release of the handle is not done twice). Fails if
/// the release and the free share one operation: its second run finds no handle to release.
#[test]
fn last_release_of_an_evicted_orphan_frees_it() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mem = image_in_memory(dir.path(), "orphan.img", 32, &[]);
    let dev = Arc::new(HeldDev::reads(mem.clone(), Duration::ZERO));
    let opts = MountOptions::default();
    let fs = Fs::open_devices(dev.clone(), None, &opts).unwrap();
    let creds = Creds::ROOT;
    let free_at_start = fs.statfs().unwrap().files_free;
    let victim = fs
        .create(ROOT_INO, b"victim", 0o100644, 0, creds)
        .unwrap()
        .ino;
    fs.write(victim, 0, &[7u8; 10_000]).unwrap();
    fs.open_inode(victim).unwrap();
    fs.unlink(ROOT_INO, b"victim").unwrap();
    fs.sync().unwrap();
    let others: Vec<u64> = (0..40)
        .map(|k| {
            fs.create(ROOT_INO, format!("o{k}").as_bytes(), 0o100644, 0, creds)
                .unwrap()
                .ino
        })
        .collect();
    // Only the device holds the victim's inode now.
    fs.drop_caches().unwrap();
    let reads = dev.reads.load(std::sync::atomic::Ordering::Relaxed);
    fs.release_inode(victim).unwrap();
    assert!(
        dev.reads.load(std::sync::atomic::Ordering::Relaxed) > reads,
        "the victim's inode was meant to be read again"
    );
    assert_eq!(
        fs.statfs().unwrap().files_free,
        free_at_start - others.len() as u64,
        "the orphan was freed at its last release"
    );
    fs.unmount().unwrap();
    drop(fs);
    common::assert_mem_fsck_clean(&mem);
}

/// What one call cost: the stops for device reads, the reads made under the lock, and the
/// reads the device served.
fn read_costs<T>(fs: &Fs, dev: &HeldDev, f: impl FnOnce() -> T) -> (T, u64, u64, u64) {
    let served = || dev.reads.load(std::sync::atomic::Ordering::Relaxed);
    let (before, reads) = (fs.stats(), served());
    let r = f();
    let after = fs.stats();
    (
        r,
        after.deferred_reads - before.deferred_reads,
        after.reads_under_lock - before.reads_under_lock,
        served() - reads,
    )
}

/// Names in the directory `/big` of [`big_directory`].
const NAMES: u32 = 8_000;

/// A 64 MiB image from the real `mkfs.ext4`, in memory, with a directory `/big` of [`NAMES`]
/// names (about 40 blocks, written one after the other).
fn big_directory(dir: &Path) -> Arc<MemDev> {
    directory_image(dir, NAMES, &[])
}

/// A 64 MiB image from the real `mkfs.ext4` (made with `mkfs_args` too), in memory, with a
/// directory `/big` of `names` names `entry-NNNNNN`.
fn directory_image(dir: &Path, names: u32, mkfs_args: &[&str]) -> Arc<MemDev> {
    let mem = image_in_memory(dir, "big.img", 64, mkfs_args);
    let fs = Fs::open_devices(mem.clone(), None, &MountOptions::default()).unwrap();
    let d = fs.mkdir(ROOT_INO, b"big", 0o755, Creds::ROOT).unwrap();
    for k in 0..names {
        fs.create(
            d.ino,
            format!("entry-{k:06}").as_bytes(),
            0o100644,
            0,
            Creds::ROOT,
        )
        .unwrap();
    }
    fs.unmount().unwrap();
    mem
}

/// The physical block of `/big`'s block `lblk` in the image `mem`, as the real `debugfs`
/// (`bmap`) finds it in a copy written into `dir`.
fn big_block(dir: &Path, mem: &MemDev, lblk: u32) -> u64 {
    let copy = dir.join("copy.img");
    std::fs::write(&copy, mem.to_bytes()).unwrap();
    let cmd = format!("bmap /big {lblk}");
    let bmap = common::run_ok("debugfs", &["-R", &cmd, copy.to_str().unwrap()]);
    bmap.trim()
        .parse()
        .expect("debugfs bmap prints a block number")
}

/// [`big_directory`] mounted on a device that counts its reads (never armed), with `/big`.
fn big_directory_counted(dir: &Path) -> (Arc<HeldDev>, Fs, tidefs::fs::Attr) {
    let mem = big_directory(dir);
    let dev = Arc::new(HeldDev::reads(mem, Duration::ZERO));
    let fs = Fs::open_devices(dev.clone(), None, &MountOptions::default()).unwrap();
    let big = fs.lookup(ROOT_INO, b"big").unwrap();
    (dev, fs, big)
}

/// Goal: the first lookup in a large directory whose blocks left the caches reads them
/// without the metadata lock in one stop, contiguous blocks with one device read, and a
/// listing of it reads ahead a window at a time (docs/DESIGN.md §2.5, "Read-ahead"); both
/// answer right. Before, the lookup stopped once per block for its first 16 blocks and read
/// the rest under the lock, and the listing stopped once per block. Method: a directory of
/// 8 000 names (about 40 blocks, written one after the other) on an image from the real
/// `mkfs.ext4`, mounted again cold on a device that counts its reads.
#[test]
fn a_cold_directory_is_read_in_batches_without_the_lock() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (dev, fs, big) = big_directory_counted(dir.path());
    let blocks = big.size / 4096;
    assert!(blocks >= 32, "the directory has {blocks} blocks");
    // The directory's inode is cached by the lookup above; its blocks are not.
    let built = fs.stats().dir_indexes_built_unlocked;
    let (found, stops, under_lock, reads) =
        read_costs(&fs, &dev, || fs.lookup(big.ino, b"entry-004321"));
    found.unwrap();
    assert_eq!(
        fs.stats().dir_indexes_built_unlocked,
        built + 1,
        "the index was not built without the lock"
    );
    assert_eq!(under_lock, 0, "the lookup read blocks under the lock");
    assert!(
        stops <= 3,
        "{stops} stops for the lookup in a cold directory of {blocks} blocks"
    );
    assert!(
        reads <= 8,
        "{reads} device reads for {blocks} directory blocks written one after the other"
    );
    assert!(matches!(
        fs.lookup(big.ino, b"entry-999999"),
        Err(FsError::NotFound)
    ));

    fs.drop_caches().unwrap();
    fs.lookup(ROOT_INO, b"big").unwrap();
    let (names, stops, under_lock, _) = read_costs(&fs, &dev, || {
        let mut names = std::collections::BTreeSet::new();
        fs.readdir(big.ino, 0, &mut |e| {
            assert!(names.insert(e.name), "a name listed twice");
            true
        })
        .unwrap();
        names
    });
    assert_eq!(names.len() as u32, NAMES + 2, "every name, with . and ..");
    assert!(names.contains(b"entry-007999".as_slice()));
    assert_eq!(under_lock, 0, "the listing read blocks under the lock");
    assert!(
        stops <= blocks / 32 + 4,
        "{stops} stops to list a cold directory of {blocks} blocks"
    );
    fs.unmount().unwrap();
}

/// Goal: a cold extent tree of many leaves is read with one stop for all the children of its
/// index node, not one per leaf, and maps the file right. Method: a file of 3 000 extents
/// (every other block written, about 9 leaves under the root's index), mounted again cold;
/// the read of its last block loads the whole map.
#[test]
fn the_leaves_of_a_cold_extent_tree_are_read_together() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mem = image_in_memory(dir.path(), "leaves.img", 64, &[]);
    const EXTENTS: u64 = 3_000;
    {
        let fs = Fs::open_devices(mem.clone(), None, &MountOptions::default()).unwrap();
        let f = fs
            .create(ROOT_INO, b"sparse", 0o100644, 0, Creds::ROOT)
            .unwrap();
        for k in 0..EXTENTS {
            fs.write(f.ino, 2 * k * 4096, &k.to_le_bytes()).unwrap();
        }
        fs.unmount().unwrap();
    }
    // Never armed: it only counts the reads.
    let dev = Arc::new(HeldDev::reads(mem.clone(), Duration::ZERO));
    let fs = Fs::open_devices(dev.clone(), None, &MountOptions::default()).unwrap();
    let f = fs.lookup(ROOT_INO, b"sparse").unwrap();
    let last = 2 * (EXTENTS - 1) * 4096;
    let (bytes, stops, under_lock, _) = read_costs(&fs, &dev, || fs.read(f.ino, last, 8));
    assert_eq!(bytes.unwrap(), (EXTENTS - 1).to_le_bytes());
    assert_eq!(under_lock, 0);
    assert!(
        stops <= 3,
        "{stops} stops to load a cold tree of about 9 leaves"
    );
    for k in [0, 1, 1234, EXTENTS / 2] {
        assert_eq!(fs.read(f.ino, 2 * k * 4096, 8).unwrap(), k.to_le_bytes());
        assert_eq!(fs.read(f.ino, (2 * k + 1) * 4096, 8).unwrap(), [0u8; 8]);
    }
    fs.unmount().unwrap();
    common::assert_mem_fsck_clean(&mem);
}

/// Goal: blocks that cannot be read ahead do not fail an operation that does not need them,
/// nor make it stop again and again: a listing's first batch succeeds, with a few stops,
/// though two blocks among the 32 it reads ahead are bad; the listing fails with EIO when
/// it reaches the first of them, not before; a lookup, which needs every block, fails with
/// EIO; the rest of the file system still answers. Method: the physical blocks of `/big`'s
/// blocks 20 and 22 from the real `debugfs` (`bmap`), made unreadable by the
/// fault-injecting device.
#[test]
fn bad_blocks_read_ahead_fail_only_the_operations_that_need_them() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mem = big_directory(dir.path());
    let dev = Arc::new(tidefs::dev::fault::FaultDev::new(mem.clone()));
    for lblk in [20, 22] {
        let bad = big_block(dir.path(), &mem, lblk);
        dev.inject(tidefs::dev::fault::Fault::range(
            tidefs::dev::fault::FaultOp::Read,
            bad * 4096..(bad + 1) * 4096,
        ));
    }
    let fs = Fs::open_devices(dev.clone(), None, &MountOptions::default()).unwrap();
    let big = fs.lookup(ROOT_INO, b"big").unwrap();
    let before = fs.stats();
    let mut first = Vec::new();
    fs.readdir(big.ino, 0, &mut |e| {
        first.push(e.name);
        first.len() < 300
    })
    .expect("the first batch needs none of the bad blocks");
    assert_eq!(first.len(), 300);
    let stops = fs.stats().deferred_reads - before.deferred_reads;
    assert!(stops <= 3, "{stops} stops for the first batch");
    let mut listed = 0u32;
    let all = fs.readdir(big.ino, 0, &mut |_| {
        listed += 1;
        true
    });
    assert!(matches!(all, Err(FsError::Io(_))), "{all:?}");
    // About 200 names to a block: the 20 blocks before the first bad one, not fewer.
    assert!(
        (19 * 200..21 * 210).contains(&listed),
        "the listing failed after {listed} names, not at block 20"
    );
    let found = fs.lookup(big.ino, b"entry-000001");
    assert!(matches!(found, Err(FsError::Io(_))), "{found:?}");
    fs.create(ROOT_INO, b"still", 0o100644, 0, Creds::ROOT)
        .unwrap();
    fs.unmount().unwrap();
}

/// Goal: a directory index built without the lock finds the same damage the build under the
/// lock would, and answers it as that directory's error: a lookup in a large directory with
/// a corrupt block 30 fails with the corruption named, the other directories still answer.
/// Method: a byte of `/big`'s block 30 (from the real `debugfs bmap`) flipped in the image.
#[test]
fn an_index_built_without_the_lock_reports_damage() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mem = big_directory(dir.path());
    let bad = big_block(dir.path(), &mem, 30);
    let mut byte = [0u8; 1];
    mem.read_at(bad * 4096 + 100, &mut byte).unwrap();
    mem.write_at(bad * 4096 + 100, &[byte[0] ^ 0x55]).unwrap();
    let fs = Fs::open_devices(mem.clone(), None, &MountOptions::default()).unwrap();
    let big = fs.lookup(ROOT_INO, b"big").unwrap();
    let built = fs.stats().dir_indexes_built_unlocked;
    let found = fs.lookup(big.ino, b"entry-000001");
    match &found {
        Err(FsError::Corrupt(c)) => {
            assert!(c.to_string().contains("directory block 30"), "{c}")
        }
        other => panic!("a lookup in a damaged directory answered {other:?}"),
    }
    assert_eq!(fs.stats().dir_indexes_built_unlocked, built + 1);
    fs.create(ROOT_INO, b"still", 0o100644, 0, Creds::ROOT)
        .unwrap();
    assert!(fs.lookup(ROOT_INO, b"still").is_ok());
}

/// Goal: lookups that build a large directory's index without the lock, while other threads
/// add and remove names in it, see every name that existed for the whole lookup and none
/// that never existed, and the directory ends as the threads left it. Method: the caches
/// are emptied before each lookup (so each builds the index again), a writer creates new
/// names and removes some older ones, another thread empties the caches every millisecond, and
/// the checker looks up the newest name known created, an old name never removed, and one
/// never created; at the end the listing holds exactly the names left and `e2fsck` finds
/// the image clean. (A stale index taken would show only through the writer's later changes
/// made with it; the unit test `an_index_built_from_blocks_changed_since_is_not_taken` in
/// `fs/mod.rs` checks that directly.)
#[test]
fn indexes_built_without_the_lock_race_changes_to_their_directory() {
    if !common::have_e2fsprogs() {
        return;
    }
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let mem = big_directory(dir.path());
    let fs = Arc::new(Fs::open_devices(mem.clone(), None, &MountOptions::default()).unwrap());
    let big = fs.lookup(ROOT_INO, b"big").unwrap().ino;
    let created = Arc::new(AtomicU32::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (fs, created, stop) = (fs.clone(), created.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut k = 0;
            while !stop.load(Ordering::Relaxed) && k < 2_000 {
                fs.create(
                    big,
                    format!("new-{k:06}").as_bytes(),
                    0o100644,
                    0,
                    Creds::ROOT,
                )
                .unwrap();
                created.store(k + 1, Ordering::SeqCst);
                // Old names 0..1000 go, one per new name: the blocks they sat in change.
                if k < 1_000 {
                    fs.unlink(big, format!("entry-{k:06}").as_bytes()).unwrap();
                }
                k += 1;
            }
        })
    };
    // Indexes dropped at any time, as memory pressure does: one built without the lock may
    // meet blocks changed by a writer whose own index is gone again.
    let dropper = {
        let (fs, stop) = (fs.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                fs.drop_caches().unwrap();
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let before = fs.stats().dir_indexes_built_unlocked;
    for round in 0..200u32 {
        let done = created.load(Ordering::SeqCst);
        fs.drop_caches().unwrap();
        if done > 0 {
            let name = format!("new-{:06}", done - 1);
            assert!(fs.lookup(big, name.as_bytes()).is_ok(), "{name} lost");
        }
        let kept = format!("entry-{:06}", 4_000 + round);
        assert!(fs.lookup(big, kept.as_bytes()).is_ok(), "{kept} lost");
        let never = format!("never-{round}");
        assert!(matches!(
            fs.lookup(big, never.as_bytes()),
            Err(FsError::NotFound)
        ));
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    dropper.join().unwrap();
    // How many builds without the lock were taken depends on timing (the dropper makes
    // many stale); `a_cold_directory_is_read_in_batches_without_the_lock` asserts one is.
    eprintln!(
        "indexes built without the lock and taken: {}",
        fs.stats().dir_indexes_built_unlocked - before
    );
    let done = created.load(Ordering::SeqCst);
    let mut names = 0u32;
    fs.readdir(big, 0, &mut |_| {
        names += 1;
        true
    })
    .unwrap();
    assert_eq!(names, NAMES + 2 + done - done.min(1_000));
    let Ok(fs) = Arc::try_unwrap(fs) else {
        panic!("the writer still holds the file system");
    };
    fs.unmount().unwrap();
    common::assert_mem_fsck_clean(&mem);
}

/// Goal: with a buffer cache too small to hold a large directory, its first lookup does not
/// read the directory's blocks over and over (read-ahead batches evicting each other): no
/// more device reads than about twice its blocks, and the right answer. Method: the smallest
/// caches (64 blocks) and a cold directory of 30 000 names (about 150 blocks), on a device
/// that counts its reads.
#[test]
fn read_ahead_does_not_thrash_a_small_cache() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mem = directory_image(dir.path(), 30_000, &["-N", "40000"]);
    // Never armed: it only counts the reads.
    let dev = Arc::new(HeldDev::reads(mem.clone(), Duration::ZERO));
    let fs = Fs::open_devices(dev.clone(), None, &smallest_caches()).unwrap();
    let huge = fs.lookup(ROOT_INO, b"big").unwrap();
    let blocks = huge.size / 4096;
    assert!(blocks > 128, "{blocks} blocks");
    let (found, _, _, reads) = read_costs(&fs, &dev, || fs.lookup(huge.ino, b"entry-012345"));
    found.unwrap();
    assert!(
        reads <= 2 * blocks + 16,
        "{reads} device reads for a lookup in a directory of {blocks} blocks"
    );
    fs.unmount().unwrap();
}

/// Goal: the inodes of a directory made one after the other are read from cold in batches,
/// not one stop per inode-table block (read-ahead of the table, as ext4's
/// `inode_readahead_blks`): looking up 1 000 names in order reads their 63 table blocks with
/// a few stops and no read under the lock, and every answer is right; lookups that skip
/// through the table read no more blocks than they use. Method: the directory of
/// [`big_directory`], its index warm and every other block cold.
#[test]
fn a_cold_inode_table_is_read_ahead() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (dev, fs, big) = big_directory_counted(dir.path());
    let first = fs.lookup(big.ino, b"entry-000000").unwrap().ino;
    fs.drop_caches().unwrap();
    fs.lookup(ROOT_INO, b"big").unwrap();
    // The index again, without the inodes of its names.
    assert!(fs.lookup(big.ino, b"no-such-name").is_err());
    let (inos, stops, under_lock, _) = read_costs(&fs, &dev, || {
        (0..1_000u64)
            .map(|k| {
                let attr = fs
                    .lookup(big.ino, format!("entry-{k:06}").as_bytes())
                    .unwrap();
                assert_eq!(attr.size, 0);
                attr.ino
            })
            .collect::<Vec<_>>()
    });
    assert_eq!(inos, (first..first + 1_000).collect::<Vec<_>>());
    assert_eq!(under_lock, 0);
    assert!(
        stops <= 6,
        "{stops} stops to read 63 cold inode-table blocks in order"
    );
    // Lookups that skip through the table (every 50th inode, three blocks apart) read
    // only the blocks they need: read-ahead that is not used would be waited for.
    fs.drop_caches().unwrap();
    fs.lookup(ROOT_INO, b"big").unwrap();
    assert!(fs.lookup(big.ino, b"no-such-name").is_err());
    let bytes = || dev.read_bytes.load(std::sync::atomic::Ordering::Relaxed);
    let before = bytes();
    for k in (2_000..6_000u64).step_by(50) {
        fs.lookup(big.ino, format!("entry-{k:06}").as_bytes())
            .unwrap();
    }
    let blocks = (bytes() - before) / 4096;
    assert!(
        blocks <= 80 + 4,
        "{blocks} blocks read for 80 inodes three blocks apart"
    );
    fs.unmount().unwrap();
}

/// Goal: two cold walks through the inode tables of different block groups at once (an
/// `ls -l` of two directories side by side) are both read ahead: one does not reset the
/// other's record of where it is. Method: two directories of 600 files, spread by mkdir to
/// groups 0 and 1 of a two-group image from the real `mkfs.ext4` (`dumpe2fs -h` gives the
/// inodes per group), looked up alternately in order after emptying the caches.
#[test]
fn walks_of_two_groups_inode_tables_are_both_read_ahead() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkimage(dir.path(), "two.img", 256, &[]);
    let ipg: u64 = common::dumpe2fs_h(&img)["Inodes per group"]
        .parse()
        .unwrap();
    let mem = Arc::new(MemDev::from_bytes(std::fs::read(&img).unwrap()));
    let dev = Arc::new(HeldDev::reads(mem.clone(), Duration::ZERO));
    let fs = Fs::open_devices(dev.clone(), None, &MountOptions::default()).unwrap();
    let mut dirs = Vec::new();
    for name in [&b"a"[..], b"b"] {
        let d = fs.mkdir(ROOT_INO, name, 0o755, Creds::ROOT).unwrap().ino;
        for k in 0..600 {
            fs.create(d, format!("f{k:04}").as_bytes(), 0o100644, 0, Creds::ROOT)
                .unwrap();
        }
        dirs.push(d);
    }
    let group = |ino: u64| (ino - 1) / ipg;
    let first: Vec<u64> = dirs
        .iter()
        .map(|&d| fs.lookup(d, b"f0000").unwrap().ino)
        .collect();
    assert_ne!(group(first[0]), group(first[1]), "files {first:?}");
    fs.drop_caches().unwrap();
    for &d in &dirs {
        // The indexes again, without the inodes of their names.
        assert!(fs.lookup(d, b"no-such-name").is_err());
    }
    let before = fs.stats().deferred_reads;
    for k in 0..600 {
        for &d in &dirs {
            fs.lookup(d, format!("f{k:04}").as_bytes()).unwrap();
        }
    }
    let stops = fs.stats().deferred_reads - before;
    // 38 table blocks each: a first miss, then read-ahead of 32 and of the rest, per walk
    // (7 with one record for both: each walk's second miss reads alone).
    assert!(
        stops <= 5,
        "{stops} stops for two walks of 38 cold table blocks"
    );
    fs.unmount().unwrap();
}

/// Runs `change` (which also applies itself to the model) on bytes `[1000, 2 * 4096 + 2000)`
/// of a file of four blocks written on disk, with its first and last blocks in no page, and
/// returns the operation's stops; checks the file against the model, also after a remount.
/// Method: an image from the real `mkfs.ext4`; the file made durable, the caches dropped, its
/// inode and block map loaded again by a write that covers its last block whole; the stops
/// counted with `Stats::deferred_reads`; no timed commit in the measured window (it could
/// stop for a read of its own).
fn stops_over_two_cold_partial_edges(change: impl Fn(&Fs, u64, (u64, u64), &mut Vec<u8>)) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let mem = image_in_memory(dir.path(), "edges.img", 32, &["-b", "4096"]);
    let opts = MountOptions {
        commit_interval: Duration::from_secs(3600),
        ..MountOptions::default()
    };
    let fs = Fs::open_devices(mem.clone(), None, &opts).unwrap();
    let f = fs
        .create(ROOT_INO, b"edges", 0o100644, 0, Creds::ROOT)
        .unwrap()
        .ino;
    let mut model: Vec<u8> = (0..4 * 4096u32).map(|i| (i % 251) as u8).collect();
    fs.write(f, 0, &model).unwrap();
    fs.fsync(f, false).unwrap();
    fs.drop_caches().unwrap();
    let whole = vec![7u8; 4096];
    fs.write(f, 3 * 4096, &whole).unwrap();
    model[3 * 4096..].copy_from_slice(&whole);
    let before = fs.stats().deferred_reads;
    change(&fs, f, (1000, 2 * 4096 + 2000), &mut model);
    let stops = fs.stats().deferred_reads - before;
    let read = |fs: &Fs| fs.read(f, 0, model.len() as u32).unwrap();
    assert!(read(&fs) == model, "the file after the change");
    fs.unmount().unwrap();
    let fs = Fs::open_devices(mem, None, &opts).unwrap();
    assert!(read(&fs) == model, "the file after a remount");
    fs.unmount().unwrap();
    stops
}

/// Goal: a write whose first and last blocks are both partial, written on disk and cached in
/// no page reads the old bytes of the two in one stop, not one stop each, and lands exactly
/// its bytes. Method: [`stops_over_two_cold_partial_edges`].
#[test]
fn a_write_with_two_cold_partial_edges_reads_them_in_one_stop() {
    if !common::have_e2fsprogs() {
        return;
    }
    let stops = stops_over_two_cold_partial_edges(|fs, f, (at, end), model| {
        let (at, end) = (at as usize, end as usize);
        let new: Vec<u8> = (0..end - at).map(|i| (i % 13) as u8 + 100).collect();
        assert_eq!(fs.write(f, at as u64, &new).unwrap() as usize, new.len());
        model[at..end].copy_from_slice(&new);
    });
    assert_eq!(stops, 1, "stops for a write with two cold partial edges");
}

/// Goal: a zero range whose first and last blocks are both partial, written on disk and
/// cached in no page fetches the two (whose other bytes it keeps) in one stop, as a write
/// does. Method: [`stops_over_two_cold_partial_edges`].
#[test]
fn a_zero_range_with_two_cold_partial_edges_fetches_them_in_one_stop() {
    if !common::have_e2fsprogs() {
        return;
    }
    let stops = stops_over_two_cold_partial_edges(|fs, f, (at, end), model| {
        fs.zero_range(f, at, end - at, true).unwrap();
        model[at as usize..end as usize].fill(0);
    });
    assert_eq!(
        stops, 1,
        "stops for a zero range with two cold partial edges"
    );
}
