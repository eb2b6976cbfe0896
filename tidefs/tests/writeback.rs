//! Goal: the page cache with delayed allocation and the per-inode fsync rules do what they
//! promise: data written and deleted between commits never reaches the device; files written
//! in turns still get one extent each; fdatasync of an overwrite sends the data home without a
//! commit and that data survives a crash; fsync of a file whose last change is already durable
//! does not commit somebody else's changes; fdatasync commits when the size changed.
//! Method: fresh `mkfs.ext4` images opened with the library, the commit timer far away so that
//! only the calls under test commit; commits and device bytes counted through `Fs::stats`;
//! extents read back with the real `debugfs`; crashes made with `Fs::crash()` and checked after
//! the next open (journal replay), never on the live mount.

mod common;

use std::time::Duration;

use tidefs::fs::{Creds, DataMode, Fs, MountOptions, ROOT_INO};

const BS: usize = 4096;

fn options(mode: DataMode) -> MountOptions {
    MountOptions {
        data_mode: mode,
        commit_interval: Duration::from_secs(3600),
        ..MountOptions::default()
    }
}

const IN_PLACE_MODES: [DataMode; 3] = [
    DataMode::Lightweight,
    DataMode::Writeback,
    DataMode::Ordered,
];

#[test]
fn a_file_created_and_deleted_between_commits_costs_no_data_write() {
    if !common::have_e2fsprogs() {
        return;
    }
    for mode in [DataMode::Ordered, DataMode::Journal] {
        let dir = tempfile::tempdir().unwrap();
        let img = common::mkimage(dir.path(), "w.img", 64, &[]);
        let fs = Fs::open(&img, &options(mode)).unwrap();
        let before = fs.stats();
        for k in 0..20u8 {
            let name = [b'f', b'0' + k];
            let f = fs
                .create(ROOT_INO, &name, 0o100644, 0, Creds::ROOT)
                .unwrap();
            fs.write(f.ino, 0, &vec![k; 256 * 1024]).unwrap();
            fs.unlink(ROOT_INO, &name).unwrap();
        }
        fs.sync().unwrap();
        let after = fs.stats();
        let written =
            (after.home_bytes - before.home_bytes) + (after.journal_bytes - before.journal_bytes);
        // 5 MiB were written and deleted; only metadata (a few blocks) may reach the device.
        assert!(
            written < 128 * 1024,
            "{mode:?}: {written} bytes reached the device for data that was deleted"
        );
        fs.unmount().unwrap();
        drop(fs);
        common::assert_fsck_clean(&img);
    }
}

/// Extents of `/name` as `debugfs -R "ex /name"` lists them: one line per extent.
fn extent_count(img: &std::path::Path, name: &str) -> usize {
    let out = common::run_ok(
        "debugfs",
        &["-R", &format!("ex /{name}"), img.to_str().unwrap()],
    );
    out.lines()
        .filter(|l| {
            let l = l.trim_start();
            l.starts_with(|c: char| c.is_ascii_digit()) && l.contains(" - ")
        })
        .count()
}

#[test]
fn files_written_in_turns_get_one_extent_each() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkimage(dir.path(), "e.img", 64, &[]);
    let fs = Fs::open(&img, &options(DataMode::Ordered)).unwrap();
    let a = fs.create(ROOT_INO, b"a", 0o100644, 0, Creds::ROOT).unwrap();
    let b = fs.create(ROOT_INO, b"b", 0o100644, 0, Creds::ROOT).unwrap();
    // Allocating at write time would interleave the two files block by block.
    for k in 0..64u64 {
        fs.write(a.ino, k * BS as u64, &[1u8; BS]).unwrap();
        fs.write(b.ino, k * BS as u64, &[2u8; BS]).unwrap();
    }
    assert_eq!(
        fs.getattr(a.ino).unwrap().blocks,
        64 * 8,
        "reserved blocks count"
    );
    fs.unmount().unwrap();
    drop(fs);
    common::assert_fsck_clean(&img);
    assert_eq!(extent_count(&img, "a"), 1, "a is fragmented");
    assert_eq!(extent_count(&img, "b"), 1, "b is fragmented");
}

/// Write-back gives the pages over a row of holes their blocks a run at a time: a row that
/// crosses block groups, rows broken by gaps, and holes around blocks already on disk all
/// land where the map says, with the bitmaps right, in every mode that writes data home.
#[test]
fn runs_of_holes_get_their_blocks_across_groups_and_gaps() {
    if !common::have_e2fsprogs() {
        return;
    }
    for mode in [DataMode::Lightweight, DataMode::Ordered, DataMode::Journal] {
        let dir = tempfile::tempdir().unwrap();
        // 1 024 blocks per group: a 6 MiB row crosses groups.
        let img = common::mkimage(dir.path(), "r.img", 64, &["-g", "1024"]);
        let fs = Fs::open(&img, &options(mode)).unwrap();
        let f = fs.create(ROOT_INO, b"r", 0o100644, 0, Creds::ROOT).unwrap();
        let block = |k: u64| vec![(k % 251) as u8 + 1; BS];
        // Blocks 2000..2010 on disk first; then rows around them and a gap.
        let mut written: Vec<u64> = (2000..2010).collect();
        for &k in &written {
            fs.write(f.ino, k * BS as u64, &block(k)).unwrap();
        }
        fs.sync().unwrap();
        let rows: Vec<u64> = (0..1500).chain(1600..1700).chain(1995..2015).collect();
        for &k in &rows {
            fs.write(f.ino, k * BS as u64, &block(k)).unwrap();
        }
        written.extend(rows);
        fs.sync().unwrap();
        fs.unmount().unwrap();
        drop(fs);
        common::assert_fsck_clean(&img);
        assert!(
            extent_count(&img, "r") <= 12,
            "{mode:?}: {} extents for three rows",
            extent_count(&img, "r")
        );
        let fs = Fs::open(&img, &options(mode)).unwrap();
        let data = fs.read(f.ino, 0, 2015 * BS as u32).unwrap();
        for k in 0..2015u64 {
            let at = k as usize * BS;
            let want = if written.contains(&k) {
                block(k)
            } else {
                vec![0u8; BS]
            };
            assert!(data[at..at + BS] == want[..], "{mode:?}: block {k} differs");
        }
        fs.unmount().unwrap();
    }
}

/// Goal: a commit that allocates for many pages over holes does it in pieces before its close
/// (docs/DESIGN.md §2.5), and the close still treats each of those blocks as just allocated:
/// in the modes that journal data it logs the whole page, never only the bytes written, so
/// the rest of the block reads as zeros after a crash and replay, not as what the block held
/// before. Method: free space scribbled with 0xEE first (a 40 MiB file written, deleted and
/// checkpointed by a clean unmount); then, in every mode, with pieces of 16 pages (seen in
/// the holds of the metadata lock the fsyncs take), three new
/// files with 100 bytes written into each of 120 pages and one file of whole pages, fsync
/// of each, a crash; after replay every byte is what was written or zero, and `e2fsck -fn`
/// is clean. With the close logging those pages as byte ranges (the blocks taken for
/// written ones), the byte-range modes read 0xEE back.
#[test]
fn blocks_allocated_ahead_of_the_close_are_logged_whole() {
    if !common::have_e2fsprogs() {
        return;
    }
    let modes = [
        DataMode::Lightweight,
        DataMode::Writeback,
        DataMode::Ordered,
        DataMode::Journal,
        DataMode::Wasteless,
        DataMode::Selective { threshold: 1024 },
    ];
    for mode in modes {
        let dir = tempfile::tempdir().unwrap();
        // A 16 MiB journal: the journaled pages fit one transaction, which the first fsync
        // commits (a smaller one commits at the writes, in smaller pieces).
        let img = common::mkimage(dir.path(), "a.img", 64, &["-J", "size=16"]);
        let fs = Fs::open(&img, &options(DataMode::Ordered)).unwrap();
        let old = fs
            .create(ROOT_INO, b"old", 0o100644, 0, Creds::ROOT)
            .unwrap();
        for k in 0..40u64 {
            fs.write(old.ino, k << 20, &vec![0xEE; 1 << 20]).unwrap();
        }
        fs.sync().unwrap();
        fs.unlink(ROOT_INO, b"old").unwrap();
        fs.unmount().unwrap();
        drop(fs);

        let opts = MountOptions {
            allocate_piece_pages: 16,
            ..options(mode)
        };
        let fs = Fs::open(&img, &opts).unwrap();
        let pages = 120u64;
        let mut files = Vec::new();
        for k in 0..3u8 {
            let f = fs
                .create(ROOT_INO, &[b'p', b'0' + k], 0o100644, 0, Creds::ROOT)
                .unwrap();
            for p in 0..pages {
                fs.write(f.ino, p * BS as u64 + 1000, &[k + 1; 100])
                    .unwrap();
            }
            files.push(f.ino);
        }
        let whole = fs.create(ROOT_INO, b"w", 0o100644, 0, Creds::ROOT).unwrap();
        fs.write(whole.ino, 0, &vec![9u8; 64 * BS]).unwrap();
        let locked = fs.stats().metadata_locked;
        for &f in files.iter().chain([&whole.ino]) {
            fs.fsync(f, false).unwrap();
        }
        assert!(
            fs.stats().metadata_locked - locked >= (3 * pages + 64) / 16,
            "{mode:?}: the allocation did not go in pieces"
        );
        fs.crash();
        drop(fs);

        let fs = Fs::open(&img, &opts).unwrap();
        for (k, &f) in files.iter().enumerate() {
            let data = fs.read(f, 0, (pages as usize * BS) as u32).unwrap();
            assert_eq!(data.len() as u64, (pages - 1) * BS as u64 + 1100);
            for (at, &b) in data.iter().enumerate() {
                let want = if (1000..1100).contains(&(at % BS)) {
                    k as u8 + 1
                } else {
                    0
                };
                assert_eq!(b, want, "{mode:?}: file {k}, byte {at}");
            }
        }
        let data = fs.read(whole.ino, 0, 64 * BS as u32).unwrap();
        assert!(
            data == vec![9u8; 64 * BS],
            "{mode:?}: the whole pages differ"
        );
        fs.unmount().unwrap();
        drop(fs);
        common::assert_fsck_clean(&img);
    }
}

/// Goal: the pieces of a commit's allocation ahead of its close interleave with any other
/// operation — writes, truncates, unlinks and new files, fsyncs — and the allocator stays
/// exact: no block given twice, none lost, every file as its writer left it. Method: pieces
/// of 2 pages; four threads each run a seeded random mix of those operations on files of
/// their own while a fifth syncs in a loop; then a clean unmount, `e2fsck -fn`, and every
/// file compared with its thread's model after a remount.
#[test]
fn allocation_ahead_of_the_close_interleaves_with_other_operations() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkimage(dir.path(), "i.img", 64, &[]);
    let opts = MountOptions {
        allocate_piece_pages: 2,
        ..options(DataMode::Ordered)
    };
    let fs = std::sync::Arc::new(Fs::open(&img, &opts).unwrap());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let syncer = {
        let (fs, stop) = (fs.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                fs.sync().unwrap();
            }
        })
    };
    let workers: Vec<_> = (0..4u64)
        .map(|t| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let mut rng = common::Rng(0x5EED + t);
                let names: Vec<Vec<u8>> =
                    (0..3).map(|k| format!("t{t}f{k}").into_bytes()).collect();
                let mut model: Vec<Option<Vec<u8>>> = vec![None; names.len()];
                for _ in 0..300 {
                    let k = rng.below(names.len() as u64) as usize;
                    let ino = match &model[k] {
                        Some(_) => fs.lookup(ROOT_INO, &names[k]).unwrap().ino,
                        None => {
                            model[k] = Some(Vec::new());
                            fs.create(ROOT_INO, &names[k], 0o100644, 0, Creds::ROOT)
                                .unwrap()
                                .ino
                        }
                    };
                    let content = model[k].as_mut().unwrap();
                    match rng.below(10) {
                        0..=5 => {
                            let at = rng.below(48 * BS as u64) as usize;
                            let len = 1 + rng.below(6 * BS as u64) as usize;
                            let bytes = rng.bytes(len);
                            fs.write(ino, at as u64, &bytes).unwrap();
                            if content.len() < at + bytes.len() {
                                content.resize(at + bytes.len(), 0);
                            }
                            content[at..at + bytes.len()].copy_from_slice(&bytes);
                        }
                        6 => {
                            let size = rng.below(content.len() as u64 + 1) as usize;
                            let cut = tidefs::fs::SetAttr {
                                size: Some(size as u64),
                                ..Default::default()
                            };
                            fs.setattr(ino, &cut).unwrap();
                            content.truncate(size);
                        }
                        7 => {
                            fs.unlink(ROOT_INO, &names[k]).unwrap();
                            model[k] = None;
                        }
                        _ => fs.fsync(ino, rng.below(2) == 0).unwrap(),
                    }
                }
                (names, model)
            })
        })
        .collect();
    let results: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    syncer.join().unwrap();
    fs.unmount().unwrap();
    drop(fs);
    common::assert_fsck_clean(&img);

    let fs = Fs::open(&img, &opts).unwrap();
    for (names, model) in results {
        for (name, content) in names.iter().zip(model) {
            let found = fs.lookup(ROOT_INO, name);
            let Some(content) = content else {
                assert!(found.is_err(), "{name:?} was unlinked");
                continue;
            };
            let ino = found.unwrap().ino;
            assert_eq!(fs.getattr(ino).unwrap().size, content.len() as u64);
            let mut back = Vec::new();
            while back.len() < content.len() {
                back.extend(fs.read(ino, back.len() as u64, 1 << 20).unwrap());
            }
            assert!(back == content, "{name:?} differs from what was written");
        }
    }
    fs.unmount().unwrap();
}

/// Goal: dirty pages past their limit start a commit, and the writes that put them there pay
/// for it, but an operation that adds no page (a create in another directory) does not wait
/// for that commit to write the other file's data: it asks the background thread to commit
/// and returns. It waited for the whole commit before (110-150 ms beside a 64 MiB writer).
/// Method: an image in memory behind a device that holds writes once armed; a 2 MiB cache
/// (dirty limit 512 KiB); a thread writes 1 MiB, which commits and is held at the device; a
/// create in another directory must return meanwhile (a generous bound: a hang is the
/// failure, not a slow answer). After the release, an fsync of the directory and a crash, the
/// new name and the written data are there.
#[test]
fn an_operation_that_adds_no_page_does_not_wait_for_the_commit_pages_start() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkimage(dir.path(), "h.img", 64, &[]);
    let mem = std::sync::Arc::new(tidefs::dev::MemDev::from_bytes(
        std::fs::read(&img).unwrap(),
    ));
    let opts = MountOptions {
        cache_size_bytes: 2 << 20,
        ..options(DataMode::Ordered)
    };
    let dev = std::sync::Arc::new(common::HeldDev::writes(mem.clone()));
    let fs = std::sync::Arc::new(Fs::open_devices(dev.clone(), None, &opts).unwrap());
    let f = fs
        .create(ROOT_INO, b"f", 0o100644, 0, Creds::ROOT)
        .unwrap()
        .ino;
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, Creds::ROOT).unwrap().ino;
    fs.sync().unwrap();
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i % 253) as u8).collect();
    let writer = {
        let (fs, data) = (fs.clone(), data.clone());
        dev.hold_of("the writer's commit", move || {
            fs.write(f, 0, &data).unwrap();
        })
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let creator = {
        let fs = fs.clone();
        std::thread::spawn(move || {
            let r = fs.create(d, b"x", 0o100644, 0, Creds::ROOT).map(|a| a.ino);
            tx.send(()).unwrap();
            r
        })
    };
    let returned = rx.recv_timeout(Duration::from_secs(30)).is_ok();
    dev.release();
    assert!(
        returned,
        "the create waited for the commit of another file's data"
    );
    let x = creator.join().unwrap().unwrap();
    writer.join().unwrap();
    fs.fsync(d, false).unwrap();
    fs.crash();
    drop(fs);

    let fs = Fs::open_devices(mem.clone(), None, &opts).unwrap();
    assert_eq!(
        fs.lookup(d, b"x").unwrap().ino,
        x,
        "the created name is lost"
    );
    let mut back = Vec::new();
    while back.len() < data.len() {
        back.extend(fs.read(f, back.len() as u64, 1 << 20).unwrap());
    }
    assert!(back == data, "the written data differs after the crash");
    fs.unmount().unwrap();
    drop(fs);
    common::assert_mem_fsck_clean(&mem);
}

#[test]
fn fdatasync_of_an_overwrite_needs_no_commit_and_survives_a_crash() {
    if !common::have_e2fsprogs() {
        return;
    }
    for mode in IN_PLACE_MODES {
        let dir = tempfile::tempdir().unwrap();
        let img = common::mkimage(dir.path(), "o.img", 64, &[]);
        let fs = Fs::open(&img, &options(mode)).unwrap();
        let f = fs.create(ROOT_INO, b"f", 0o100644, 0, Creds::ROOT).unwrap();
        fs.write(f.ino, 0, &[b'a'; 3 * BS]).unwrap();
        fs.fsync(f.ino, false).unwrap();
        let commits = fs.stats().commits;
        // Overwrites change only the timestamps: fdatasync writes the data home and flushes.
        for k in 0..10u64 {
            fs.write(f.ino, k * 100, b"overwritten").unwrap();
            fs.fsync(f.ino, true).unwrap();
        }
        assert_eq!(fs.stats().commits, commits, "{mode:?}: fdatasync committed");
        // Another file's change waits in the running transaction; fsync of a file whose last
        // change is durable does not commit it.
        let g = fs.create(ROOT_INO, b"g", 0o100644, 0, Creds::ROOT).unwrap();
        fs.write(g.ino, 0, b"not promised").unwrap();
        fs.fsync(f.ino, true).unwrap();
        assert_eq!(
            fs.stats().commits,
            commits,
            "{mode:?}: fsync committed another file"
        );
        // An append changes the size: fdatasync must commit.
        fs.write(f.ino, 3 * BS as u64, b"appended").unwrap();
        fs.fsync(f.ino, true).unwrap();
        assert_eq!(
            fs.stats().commits,
            commits + 1,
            "{mode:?}: append not committed"
        );
        fs.write(f.ino, 5, b"last overwrite").unwrap();
        fs.fsync(f.ino, true).unwrap();
        fs.crash();
        drop(fs);

        let fs = Fs::open(&img, &options(mode)).unwrap();
        let a = fs.lookup(ROOT_INO, b"f").unwrap();
        let got = fs.read(a.ino, 0, 4 * BS as u32).unwrap();
        let mut want = vec![b'a'; 3 * BS];
        for k in 0..10usize {
            want[k * 100..k * 100 + 11].copy_from_slice(b"overwritten");
        }
        want[5..19].copy_from_slice(b"last overwrite");
        want.extend_from_slice(b"appended");
        assert!(got == want, "{mode:?}: fdatasync'd data lost in the crash");
        fs.unmount().unwrap();
        drop(fs);
        common::assert_fsck_clean(&img);
    }
}

#[test]
fn fsync_of_cached_data_over_holes_commits_its_allocation() {
    if !common::have_e2fsprogs() {
        return;
    }
    for mode in [DataMode::Ordered, DataMode::Journal, DataMode::Writeback] {
        let dir = tempfile::tempdir().unwrap();
        let img = common::mkimage(dir.path(), "h.img", 64, &[]);
        let fs = Fs::open(&img, &options(mode)).unwrap();
        let f = fs.create(ROOT_INO, b"f", 0o100644, 0, Creds::ROOT).unwrap();
        fs.fsync(f.ino, false).unwrap();
        // Writes into a hole inside the size: only the page cache knows the data, and the
        // inode's size does not change, yet fdatasync must allocate and commit.
        fs.setattr(
            f.ino,
            &tidefs::fs::SetAttr {
                size: Some(10 * BS as u64),
                ..Default::default()
            },
        )
        .unwrap();
        fs.fsync(f.ino, false).unwrap();
        fs.write(f.ino, 4 * BS as u64 + 7, b"in the hole").unwrap();
        fs.fsync(f.ino, true).unwrap();
        fs.crash();
        drop(fs);
        let fs = Fs::open(&img, &options(mode)).unwrap();
        let a = fs.lookup(ROOT_INO, b"f").unwrap();
        assert_eq!(a.size, 10 * BS as u64);
        let got = fs.read(a.ino, 4 * BS as u64, 32).unwrap();
        assert_eq!(&got[7..18], b"in the hole", "{mode:?}");
        assert!(got[..7].iter().all(|b| *b == 0), "{mode:?}");
        fs.unmount().unwrap();
        drop(fs);
        common::assert_fsck_clean(&img);
    }
}

#[test]
fn fallocate_under_cached_data_counts_each_block_once() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkimage(dir.path(), "f.img", 64, &[]);
    let fs = Fs::open(&img, &options(DataMode::Ordered)).unwrap();
    let f = fs.create(ROOT_INO, b"f", 0o100644, 0, Creds::ROOT).unwrap();
    fs.write(f.ino, 0, b"hello").unwrap();
    assert_eq!(fs.getattr(f.ino).unwrap().blocks, 8, "one reserved block");
    // The preallocation covers the cached page's block: it must not stay reserved as well.
    fs.fallocate(f.ino, 0, 4 * BS as u64, true).unwrap();
    assert_eq!(fs.getattr(f.ino).unwrap().blocks, 4 * 8);
    fs.fsync(f.ino, false).unwrap();
    assert_eq!(fs.getattr(f.ino).unwrap().blocks, 4 * 8);
    assert_eq!(fs.read(f.ino, 0, 100).unwrap(), b"hello");
    fs.unmount().unwrap();
    drop(fs);
    common::assert_fsck_clean(&img);
}
