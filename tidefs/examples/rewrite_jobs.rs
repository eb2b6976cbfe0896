//! Checkpoints of parallel jobs, embedded: THREADS (16) threads each rewrite small files in a
//! directory of their own, SECONDS (3) long — truncate to nothing (`O_TRUNC`), two 4 KiB
//! writes, fsync — over 50 names in turn, and it prints the files rewritten per second and how
//! many times an operation took the metadata lock per file (docs/DESIGN.md §2.5).
//!
//! Usage (an image made by `tidefs mkfs` or mkfs.ext4):
//!
//! ```text
//! cargo run --release -p tidefs --example rewrite_jobs -- IMAGE [THREADS [SECONDS]]
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

use common::{arg, dir};
use tidefs::fs::{Creds, Fs, MountOptions, SetAttr};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(image) = args.get(1).map(std::path::Path::new) else {
        eprintln!("usage: rewrite_jobs IMAGE [THREADS [SECONDS]]");
        std::process::exit(2);
    };
    let threads: u64 = arg(&args, 2, 16, "THREADS");
    let seconds: f64 = arg(&args, 3, 3.0, "SECONDS");
    let fs = Arc::new(Fs::open(image, &MountOptions::default()).expect("open the image"));
    let stop = Arc::new(AtomicBool::new(false));
    let files = Arc::new(AtomicU64::new(0));
    let locked_before = fs.stats().metadata_locked;
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (fs, stop, files) = (fs.clone(), stop.clone(), files.clone());
            std::thread::spawn(move || {
                let name = format!("job{t}");
                let dir = dir(&fs, name.as_bytes());
                let block = [7u8; 4096];
                let cut = SetAttr {
                    size: Some(0),
                    ..SetAttr::default()
                };
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let name = format!("checkpoint{}", n % 50);
                    let ino = match fs.lookup(dir, name.as_bytes()) {
                        Ok(a) => a.ino,
                        Err(_) => {
                            fs.create(dir, name.as_bytes(), 0o100644, 0, Creds::ROOT)
                                .expect("create")
                                .ino
                        }
                    };
                    fs.setattr(ino, &cut).expect("truncate");
                    fs.write(ino, 0, &block).expect("write");
                    fs.write(ino, 4096, &block).expect("write");
                    fs.fsync(ino, false).expect("fsync");
                    n += 1;
                }
                files.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().expect("a job thread panicked");
    }
    let elapsed = start.elapsed().as_secs_f64();
    let n = files.load(Ordering::Relaxed);
    let locked = fs.stats().metadata_locked - locked_before;
    println!(
        "{threads} threads: {:.0} files/s, {:.2} metadata-lock holds per file",
        n as f64 / elapsed,
        locked as f64 / n.max(1) as f64
    );
    fs.unmount().expect("unmount");
}
