//! Goal: concurrent fsyncs share commits (group commit), and sharing loses nothing a returned
//! fsync promised. Method: 100 threads each append 125-byte records to their own file with an
//! fdatasync after each, through the library; the file system's own counters must show many
//! fsyncs per commit. Then the file system stops as at a power cut (`Fs::crash`), is opened
//! again (journal recovery), and every record must read back byte for byte; after a clean
//! unmount the image must be clean by e2fsck.

mod common;

use std::sync::Arc;

use tidefs::fs::{Creds, Fs, MountOptions, ROOT_INO};

/// Goal and method: see the module doc (group commit, then a crash and recovery).
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
    // The names: a directory fsync makes them durable.
    fs.fsync(ROOT_INO, false).unwrap();
    let s = fs.stats();
    eprintln!("{s:?}");
    assert_eq!(s.fsyncs, (threads * records) as u64 + 1);
    assert!(s.fsyncs_per_commit > 10.0, "group commit too weak: {s:?}");
    fs.crash();
    drop(fs);
    let fs = Fs::open(&img, &MountOptions::default()).unwrap();
    assert!(
        fs.recovery_report().is_some(),
        "the crashed image did not need recovery"
    );
    for t in 0..threads {
        let a = fs
            .lookup(ROOT_INO, format!("stream{t}").as_bytes())
            .unwrap();
        assert_eq!(a.size, (records * 125) as u64, "stream{t} size");
        let data = fs.read(a.ino, 0, (records * 125) as u32).unwrap();
        assert!(
            data == vec![b'a' + (t % 26) as u8; records * 125],
            "stream{t} content after the crash"
        );
    }
    fs.unmount().unwrap();
    common::assert_fsck_clean(&img);
}
