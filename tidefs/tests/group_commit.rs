//! Goal: concurrent fsyncs share commits (group commit). Method: 100 threads each append
//! 125-byte records to their own file with an fdatasync after each, through the library; the
//! file system's own counters must show many fsyncs per commit, every record must read back, and
//! the image must be clean by e2fsck afterwards.

mod common;

use std::sync::Arc;

use tidefs::fs::{Creds, Fs, MountOptions, ROOT_INO};

#[test]
fn hundred_threads_share_commits() {
    if !common::have_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = common::mkimage(dir.path(), "g.img", 128, &[]);
    let fs = Arc::new(Fs::open(&img, &MountOptions::default()).unwrap());
    let threads = 100;
    let records = 20;
    let mut handles = Vec::new();
    for t in 0..threads {
        let fs = fs.clone();
        handles.push(std::thread::spawn(move || {
            let a = fs
                .create(
                    ROOT_INO,
                    format!("stream{t}").as_bytes(),
                    0o100644,
                    0,
                    Creds::ROOT,
                )
                .unwrap();
            for r in 0..records {
                let rec = [b'a' + (t % 26) as u8; 125];
                fs.write(a.ino, (r * 125) as u64, &rec).unwrap();
                fs.fsync(a.ino, true).unwrap();
            }
        }));
    }
    for h in handles {
        h.join().unwrap();
    }
    let s = fs.stats();
    eprintln!("{s:?}");
    assert_eq!(s.fsyncs, (threads * records) as u64);
    assert!(s.fsyncs_per_commit > 10.0, "group commit too weak: {s:?}");
    for t in 0..threads {
        let a = fs
            .lookup(ROOT_INO, format!("stream{t}").as_bytes())
            .unwrap();
        assert_eq!(a.size, (records * 125) as u64);
        let data = fs.read(a.ino, 0, (records * 125) as u32).unwrap();
        assert!(data.iter().all(|b| *b == b'a' + (t % 26) as u8));
    }
    fs.unmount().unwrap();
    common::assert_fsck_clean(&img);
}
