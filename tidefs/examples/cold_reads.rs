//! Latency of a cached operation while other threads read cold metadata: the measurement
//! behind docs/DESIGN.md §2.5 "Device reads outside the lock".
//!
//! Usage (an image made by mkfs.ext4 with enough inodes, e.g. `truncate -s 1G img && mke2fs
//! -t ext4 -b 4096 -O metadata_csum,64bit img`):
//!
//! ```text
//! cargo run --release -p tidefs --example cold_reads -- IMAGE setup   # 60 000 files
//! cargo run --release -p tidefs --example cold_reads -- IMAGE         # measure
//! ```
//!
//! The file system is opened with a 4 MiB cache, so the 60 000 inodes (3 750 inode-table
//! blocks) keep missing it. Four threads look up random names (each miss reads an
//! inode-table block from the device) while the main thread writes 100 bytes to a cached
//! file every 300 µs, 3 000 times, and prints that write's latency.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidefs::fs::{Creds, Fs, MountOptions, ROOT_INO};

const FILES: u64 = 60_000;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(image) = args.get(1).map(std::path::Path::new) else {
        eprintln!("usage: cold_reads IMAGE [setup]");
        std::process::exit(2);
    };
    let creds = Creds { uid: 0, gid: 0 };
    let opts = MountOptions {
        cache_size_bytes: 4 << 20,
        ..MountOptions::default()
    };
    let fs = Arc::new(Fs::open(image, &opts).expect("open the image"));
    if args.get(2).map(String::as_str) == Some("setup") {
        let d = fs.mkdir(ROOT_INO, b"d", 0o755, creds).expect("mkdir d");
        for k in 0..FILES {
            fs.create(d.ino, format!("f{k}").as_bytes(), 0o100644, 0, creds)
                .expect("create");
        }
        fs.create(ROOT_INO, b"warm", 0o100644, 0, creds)
            .expect("create warm");
        fs.unmount().expect("unmount");
        return;
    }
    let d = fs.lookup(ROOT_INO, b"d").expect("run setup first").ino;
    let warm = fs.lookup(ROOT_INO, b"warm").expect("run setup first").ino;
    fs.drop_caches().expect("drop caches");
    // The directory's name index and the warm file, cached again.
    fs.lookup(d, b"f1").expect("lookup");
    fs.write(warm, 0, &[1u8; 100]).expect("write");

    let stop = Arc::new(AtomicBool::new(false));
    let lookups = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..4u64)
        .map(|t| {
            let (fs, stop, lookups) = (fs.clone(), stop.clone(), lookups.clone());
            std::thread::spawn(move || {
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (t + 1);
                while !stop.load(Ordering::Relaxed) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    fs.lookup(d, format!("f{}", x % FILES).as_bytes())
                        .expect("lookup");
                    lookups.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let mut latency_us = Vec::with_capacity(3000);
    let started = Instant::now();
    for i in 0..3000u64 {
        let t = Instant::now();
        fs.write(warm, i % 4000, &[2u8; 100]).expect("write");
        latency_us.push(t.elapsed().as_micros());
        std::thread::sleep(Duration::from_micros(300));
    }
    let secs = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().expect("reader thread");
    }
    latency_us.sort_unstable();
    let at = |q: f64| latency_us[((latency_us.len() - 1) as f64 * q) as usize];
    println!(
        "cached write latency (us): p50 {} p99 {} max {}; lookups by the readers: {:.0}/s",
        at(0.5),
        at(0.99),
        latency_us[latency_us.len() - 1],
        lookups.load(Ordering::Relaxed) as f64 / secs
    );
    fs.unmount().expect("unmount");
}
