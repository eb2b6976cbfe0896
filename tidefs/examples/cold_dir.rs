//! The first lookup in a large directory after its blocks left the caches, and what it costs
//! the operations of other threads meanwhile: the measurement behind docs/DESIGN.md §2.5
//! "Directory read-ahead".
//!
//! Usage (an image made by mkfs.ext4 with enough inodes, e.g. `truncate -s 1G img && mke2fs
//! -t ext4 -b 4096 -O metadata_csum,64bit -N 131072 img`):
//!
//! ```text
//! cargo run --release -p tidefs --example cold_dir -- IMAGE setup   # 100 000 names
//! cargo run --release -p tidefs --example cold_dir -- IMAGE         # measure
//! ```
//!
//! One thread creates and removes a file in the root directory back to back (each takes
//! the metadata lock) while the main thread, after emptying the caches, looks a name up in
//! the large directory, whose name index must be built from every block. Prints the
//! lookup's time, the longest create or unlink meanwhile, and the device reads it made; then,
//! caches emptied again each time, the time and reads of a listing of the whole directory,
//! and of a lookup of every name (each reads its inode).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidefs::fs::{Creds, Fs, MountOptions, ROOT_INO};

const NAMES: u32 = 100_000;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(image) = args.get(1).map(std::path::Path::new) else {
        eprintln!("usage: cold_dir IMAGE [setup]");
        std::process::exit(2);
    };
    let creds = Creds::ROOT;
    let fs = Arc::new(Fs::open(image, &MountOptions::default()).expect("open the image"));
    if args.get(2).map(String::as_str) == Some("setup") {
        let d = fs.mkdir(ROOT_INO, b"big", 0o755, creds).expect("mkdir big");
        for k in 0..NAMES {
            fs.create(
                d.ino,
                format!("entry-{k:06}").as_bytes(),
                0o100644,
                0,
                creds,
            )
            .expect("create");
        }
        fs.unmount().expect("unmount");
        return;
    }
    let d = fs.lookup(ROOT_INO, b"big").expect("run setup first").ino;
    fs.drop_caches().expect("drop caches");
    let before = fs.stats();
    let stop = Arc::new(AtomicBool::new(false));
    let worst_us = Arc::new(AtomicU64::new(0));
    let churn = {
        let (fs, stop, worst_us) = (fs.clone(), stop.clone(), worst_us.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                fs.create(ROOT_INO, b"churn", 0o100644, 0, creds)
                    .expect("create");
                fs.unlink(ROOT_INO, b"churn").expect("unlink");
                worst_us.fetch_max(t.elapsed().as_micros() as u64, Ordering::Relaxed);
                n += 1;
            }
            n
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    let t = Instant::now();
    fs.lookup(d, b"entry-054321").expect("lookup");
    let lookup = t.elapsed();
    std::thread::sleep(Duration::from_millis(50));
    stop.store(true, Ordering::Relaxed);
    let pairs = churn.join().expect("churn thread");
    let after = fs.stats();
    println!(
        "cold lookup: {:.1} ms; longest create + unlink meanwhile: {:.1} ms ({pairs} pairs); \
         stops for reads: {}, reads under the lock: {}",
        lookup.as_secs_f64() * 1e3,
        worst_us.load(Ordering::Relaxed) as f64 / 1e3,
        after.deferred_reads - before.deferred_reads,
        after.reads_under_lock - before.reads_under_lock,
    );
    fs.drop_caches().expect("drop caches");
    let before = fs.stats();
    let t = Instant::now();
    let mut names = 0u32;
    fs.readdir(d, 0, &mut |_| {
        names += 1;
        true
    })
    .expect("readdir");
    let after = fs.stats();
    println!(
        "cold listing of {names} names: {:.1} ms; stops for reads: {}, reads under the lock: {}",
        t.elapsed().as_secs_f64() * 1e3,
        after.deferred_reads - before.deferred_reads,
        after.reads_under_lock - before.reads_under_lock,
    );
    fs.drop_caches().expect("drop caches");
    let before = fs.stats();
    let t = Instant::now();
    for k in 0..NAMES {
        fs.lookup(d, format!("entry-{k:06}").as_bytes())
            .expect("lookup");
    }
    let after = fs.stats();
    println!(
        "cold lookups of every name, in order: {:.1} ms; stops for reads: {}, reads under the \
         lock: {}",
        t.elapsed().as_secs_f64() * 1e3,
        after.deferred_reads - before.deferred_reads,
        after.reads_under_lock - before.reads_under_lock,
    );
    fs.unmount().expect("unmount");
}
