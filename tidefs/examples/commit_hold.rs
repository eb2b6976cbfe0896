//! How long a commit that writes back much new data keeps other operations waiting, embedded:
//! WRITERS (4) threads each write a new file of MIB (32) MiB in 1 MiB writes and fsync it,
//! while one more thread creates and unlinks a file in a directory of its own, over and over,
//! timing each pair. It prints the pairs' p50, p99 and slowest, the writers' time, the
//! commits and the longest hold of the metadata lock (`tidefs stats`). A commit's write-back
//! allocates blocks for every page over a hole, and whatever of it runs under the metadata
//! lock in one piece is what the pairs wait for (docs/DESIGN.md §2.5, "Delayed allocation and
//! write-back").
//!
//! Usage (an image made by `tidefs mkfs` or mkfs.ext4, 1 GiB or more; the files are removed
//! at the end; PIECE sets `MountOptions::allocate_piece_pages`, 1024 by default):
//!
//! ```text
//! cargo run --release -p tidefs --example commit_hold -- IMAGE [WRITERS [MIB [PIECE]]]
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

use common::{arg, dir};
use tidefs::fs::{Creds, Fs, MountOptions};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(image) = args.get(1).map(std::path::Path::new) else {
        eprintln!("usage: commit_hold IMAGE [WRITERS [MIB [PIECE]]]");
        std::process::exit(2);
    };
    let writers: u32 = arg(&args, 2, 4, "WRITERS");
    let mib: u64 = arg(&args, 3, 32, "MIB");
    let opts = MountOptions {
        allocate_piece_pages: arg(&args, 4, 1024, "PIECE"),
        ..MountOptions::default()
    };
    let fs = Arc::new(Fs::open(image, &opts).expect("open the image"));
    let data_dir = dir(&fs, b"data");
    let probe_dir = dir(&fs, b"probe");
    fs.fsync(probe_dir, false).expect("fsync");
    let stop = Arc::new(AtomicBool::new(false));
    let probe = {
        let (fs, stop) = (fs.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut times = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                fs.create(probe_dir, b"p", 0o100644, 0, Creds::ROOT)
                    .expect("create");
                fs.unlink(probe_dir, b"p").expect("unlink");
                times.push(t.elapsed());
                std::thread::sleep(Duration::from_micros(200));
            }
            times
        })
    };
    let before = fs.stats();
    let started = Instant::now();
    let threads: Vec<_> = (0..writers)
        .map(|w| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let name = format!("f{w}");
                let f = fs
                    .create(data_dir, name.as_bytes(), 0o100644, 0, Creds::ROOT)
                    .expect("create")
                    .ino;
                let chunk = vec![w as u8 + 1; 1 << 20];
                for i in 0..mib {
                    let n = fs.write(f, i << 20, &chunk).expect("write");
                    assert_eq!(n as usize, chunk.len(), "short write");
                }
                fs.fsync(f, false).expect("fsync");
            })
        })
        .collect();
    for t in threads {
        t.join().expect("writer");
    }
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut times = probe.join().expect("probe");
    times.sort_unstable();
    let at = |q: f64| times[((times.len() - 1) as f64 * q) as usize];
    println!(
        "writers {writers} x {mib} MiB: {:.0} ms, {} commits",
        took.as_secs_f64() * 1e3,
        fs.stats().commits - before.commits
    );
    let after = fs.stats();
    println!(
        "waits for journal room {}, device reads deferred {}",
        after.journal_room_waits - before.journal_room_waits,
        after.deferred_reads - before.deferred_reads
    );
    println!(
        "metadata lock: longest hold {} us, {} holds of 1 ms or more",
        after.metadata_hold_max_us, after.metadata_holds_over_ms
    );
    println!(
        "create + unlink meanwhile ({}): p50 {:?} p99 {:?} max {:?}",
        times.len(),
        at(0.5),
        at(0.99),
        times.last().copied().unwrap_or_default()
    );
    for w in 0..writers {
        fs.unlink(data_dir, format!("f{w}").as_bytes())
            .expect("unlink");
    }
    fs.unmount().expect("unmount");
}
