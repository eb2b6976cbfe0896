//! Time to create names in one large directory: the measurement behind docs/DESIGN.md §4.1
//! (a rolled-back operation forgets only the directory indexes it touched).
//!
//! Usage (an image made by mkfs.ext4 with enough inodes, e.g. `truncate -s 1G img && mke2fs
//! -t ext4 -b 4096 -O metadata_csum,64bit -N 131072 img`):
//!
//! ```text
//! cargo run --release -p tidefs --example big_dir -- IMAGE [NAMES]
//! ```
//!
//! Creates NAMES (30 000) empty files in a new directory and prints the time taken after
//! every 10 000; a cost per create that grows with the directory's size shows up as
//! intervals that grow.

use std::time::Instant;

use tidefs::fs::{Creds, Fs, MountOptions, ROOT_INO};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(image) = args.get(1).map(std::path::Path::new) else {
        eprintln!("usage: big_dir IMAGE [NAMES]");
        std::process::exit(2);
    };
    let names: u32 = match args.get(2).map(|s| s.parse()) {
        None => 30_000,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            eprintln!("NAMES must be a number");
            std::process::exit(2);
        }
    };
    let fs = Fs::open(image, &MountOptions::default()).expect("open the image");
    let dir = fs
        .mkdir(ROOT_INO, b"big", 0o755, Creds::ROOT)
        .expect("mkdir big (run on a fresh image)")
        .ino;
    let started = Instant::now();
    let mut last = started;
    for k in 0..names {
        fs.create(
            dir,
            format!("entry-{k:06}").as_bytes(),
            0o100644,
            0,
            Creds::ROOT,
        )
        .expect("create");
        if (k + 1) % 10_000 == 0 || k + 1 == names {
            println!(
                "{} names: {:.2} s in all, the last {} in {:.2} s",
                k + 1,
                started.elapsed().as_secs_f64(),
                (k % 10_000) + 1,
                last.elapsed().as_secs_f64()
            );
            last = Instant::now();
        }
    }
    fs.unmount().expect("unmount");
}
