//! Latency of reading a cached file, and blocks of a file that only the device holds, while
//! other threads write and fdatasync their own files: the measurement behind docs/DESIGN.md
//! §2.5 "Reads without the lock".
//!
//! Usage (an image made by mkfs.ext4, e.g. `truncate -s 1G img && mke2fs -t ext4 -b 4096 -O
//! metadata_csum,64bit img`):
//!
//! ```text
//! cargo run --release -p tidefs --example cached_reads -- IMAGE [THREADS [STREAM_MODE]]
//! ```
//!
//! THREADS (16) threads each append 125 bytes to their own file and fdatasync it, in a loop
//! (with STREAM_MODE, e.g. `wasteless`, the files are in a directory of that journaling mode,
//! the other files in the root, which keeps the mount's `ordered`);
//! meanwhile the main thread reads a cached 4 KiB file, stats it, asks for its
//! `security.capability` (which it does not have: what the kernel asks before most writes
//! through FUSE), and appends 125 bytes to a file of its own (timed) and reads them back, every
//! millisecond, 3 000 times, then reads 3 000 blocks of a 64 MiB file, each block once, in random order, one
//! every millisecond (each from the device; the file was read once before the storm, so its
//! block map is loaded), then looks up 3 000 names that do not exist, then lists the root
//! directory (about twenty names) 3 000 times, one step every millisecond each, and prints
//! the latency of each kind. Then, with the storm stopped
//! and the caches dropped, it reads a 32 MiB file twice and prints how long each pass took
//! (the first from the device, the second from the page cache).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidefs::fs::{Creds, Fs, MountOptions, XattrSetMode, JOURNAL_MODE_XATTR, ROOT_INO};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(image) = args.get(1).map(std::path::Path::new) else {
        eprintln!("usage: cached_reads IMAGE [THREADS [STREAM_MODE]]");
        std::process::exit(2);
    };
    let threads: u64 = match args.get(2).map(|s| s.parse()) {
        None => 16,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            eprintln!("THREADS must be a number");
            std::process::exit(2);
        }
    };
    let stream_mode = args.get(3);
    let creds = Creds::ROOT;
    let opts = MountOptions {
        cache_size_bytes: 128 << 20,
        ..MountOptions::default()
    };
    let fs = Arc::new(Fs::open(image, &opts).expect("open the image"));
    let root = |name: &str| {
        let name = name.as_bytes();
        match fs.lookup(ROOT_INO, name) {
            Ok(a) => a.ino,
            Err(_) => {
                fs.create(ROOT_INO, name, 0o100644, 0, creds)
                    .expect("create")
                    .ino
            }
        }
    };
    let small = root("cached-4k");
    fs.write(small, 0, &[1u8; 4096]).expect("write");
    let cold = root("cold-64m");
    const COLD_BLOCKS: u64 = 16_384;
    if fs.getattr(cold).expect("getattr").size == 0 {
        let chunk = vec![5u8; 1 << 20];
        for k in 0..COLD_BLOCKS / 256 {
            fs.write(cold, k << 20, &chunk).expect("write");
        }
    }
    fs.sync().expect("sync");
    fs.drop_caches().expect("drop caches");
    fs.read(small, 0, 4096).expect("read");
    fs.read(cold, 0, 4096).expect("read");

    let stop = Arc::new(AtomicBool::new(false));
    let appends = Arc::new(AtomicU64::new(0));
    let stream_dir = match stream_mode {
        None => ROOT_INO,
        Some(mode) => {
            let dir = match fs.lookup(ROOT_INO, b"streams") {
                Ok(a) => a.ino,
                Err(_) => {
                    fs.mkdir(ROOT_INO, b"streams", 0o755, creds)
                        .expect("mkdir")
                        .ino
                }
            };
            fs.setxattr(dir, JOURNAL_MODE_XATTR, mode.as_bytes(), XattrSetMode::Any)
                .expect("set the streams' journaling mode");
            dir
        }
    };
    let storm: Vec<_> = (0..threads)
        .map(|t| {
            let name = format!("stream{t}");
            let file = match fs.lookup(stream_dir, name.as_bytes()) {
                Ok(a) => a.ino,
                Err(_) => {
                    fs.create(stream_dir, name.as_bytes(), 0o100644, 0, creds)
                        .expect("create")
                        .ino
                }
            };
            let (fs, stop, appends) = (fs.clone(), stop.clone(), appends.clone());
            std::thread::spawn(move || {
                let mut at = fs.getattr(file).expect("getattr").size;
                while !stop.load(Ordering::Relaxed) {
                    fs.write(file, at, &[7u8; 125]).expect("append");
                    fs.fsync(file, true).expect("fdatasync");
                    at += 125;
                    appends.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let (mut reads, mut stats, mut caps) = (Vec::new(), Vec::new(), Vec::new());
    let tail = root("tail");
    let mut tail_at = fs.getattr(tail).expect("getattr").size;
    let (mut tail_writes, mut tail_reads) = (Vec::new(), Vec::new());
    let started = Instant::now();
    for _ in 0..3000 {
        let t = Instant::now();
        fs.read(small, 0, 4096).expect("read");
        reads.push(t.elapsed().as_micros());
        let t = Instant::now();
        fs.getattr(small).expect("getattr");
        stats.push(t.elapsed().as_micros());
        let t = Instant::now();
        assert!(fs.getxattr(small, b"security.capability").is_err());
        caps.push(t.elapsed().as_micros());
        let t = Instant::now();
        fs.write(tail, tail_at, &[9u8; 125]).expect("append");
        tail_writes.push(t.elapsed().as_micros());
        let t = Instant::now();
        assert_eq!(fs.read(tail, tail_at, 125).expect("read"), [9u8; 125]);
        tail_reads.push(t.elapsed().as_micros());
        tail_at += 125;
        std::thread::sleep(Duration::from_millis(1));
    }
    // Blocks 1.. of the cold file in an order of their own (a multiplicative step that is odd,
    // so prime to the power of two: every block at most once).
    let mut cold_reads = Vec::new();
    for k in 1..=3000u64 {
        let block = (k * 40_503) % COLD_BLOCKS;
        let t = Instant::now();
        fs.read(cold, block * 4096, 4096).expect("read");
        cold_reads.push(t.elapsed().as_micros());
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut missing = Vec::new();
    for k in 0..3000u64 {
        let name = format!("missing-{k}");
        let t = Instant::now();
        assert!(fs.lookup(ROOT_INO, name.as_bytes()).is_err());
        missing.push(t.elapsed().as_micros());
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut listings = Vec::new();
    for _ in 0..3000 {
        let t = Instant::now();
        let mut n = 0;
        fs.readdir(ROOT_INO, 0, &mut |_| {
            n += 1;
            true
        })
        .expect("readdir");
        listings.push(t.elapsed().as_micros());
        // The root holds the files above, and the storm's files unless they have their own
        // directory.
        let streams_here = if stream_mode.is_none() { threads } else { 0 };
        assert!(n > 3 + streams_here as usize);
        std::thread::sleep(Duration::from_millis(1));
    }
    let secs = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for s in storm {
        s.join().expect("storm thread");
    }
    for (name, v) in [
        ("read 4 KiB cached", &mut reads),
        ("getattr", &mut stats),
        ("getxattr of a missing attribute", &mut caps),
        ("append of 125 bytes", &mut tail_writes),
        ("read of 125 bytes just appended", &mut tail_reads),
        ("read 4 KiB from the device", &mut cold_reads),
        ("lookup of a missing name", &mut missing),
        ("readdir of the root", &mut listings),
    ] {
        v.sort_unstable();
        let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize];
        println!(
            "{name} under the storm (us): p50 {} p90 {} p99 {} max {}",
            at(0.5),
            at(0.9),
            at(0.99),
            v[v.len() - 1]
        );
    }
    println!(
        "storm: {threads} threads, {:.0} appends+fdatasync/s",
        appends.load(Ordering::Relaxed) as f64 / secs
    );

    let big = root("big-32m");
    if fs.getattr(big).expect("getattr").size == 0 {
        let chunk = vec![3u8; 1 << 20];
        for k in 0..32u64 {
            fs.write(big, k << 20, &chunk).expect("write");
        }
    }
    fs.drop_caches().expect("drop caches");
    for pass in ["from the device", "cached"] {
        let t = Instant::now();
        for k in 0..256u64 {
            fs.read(big, k << 17, 1 << 17).expect("read");
        }
        println!(
            "32 MiB in 128 KiB reads, {pass}: {:.1} ms",
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    fs.unmount().expect("unmount");
}
