//! Goal: every fsync and fdatasync that the mounted file system acknowledged survives a kill
//! of the daemon in the middle of a multi-threaded storm, on an image with several block
//! groups, in every data mode whose promise covers it; the recovered image is clean for
//! e2fsck.
//!
//! Method: a 512 MiB image with 4 KiB blocks (four block groups) is mounted by the real daemon.
//! Eight threads work at once: the even ones append records of checkable contents (each
//! record names its thread, round and number) to their own files, with fdatasync or fsync
//! after each; the odd ones replace a file atomically (write a temporary file, fsync it,
//! rename it over the old one, fsync the directory) and now and then move a new file into the
//! other directory the same way. After each acknowledged sync, the test process (outside the
//! file system) records the promise: the bytes the file must hold at least, or the versions a
//! replaced file may hold. Once a round's kill point (a count of acknowledgements, different
//! in every round) is reached, the daemon gets SIGKILL; the mount is remounted (the daemon
//! replays the journal), every promise of this round and the earlier ones is checked through
//! the mount, the image is unmounted and `e2fsck -fn` must find it clean. Rounds repeat on the
//! same image with other data modes and kill points, so promises from earlier crashes must
//! survive later recoveries too. Nothing here measures time.

mod common;

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::*;

/// Writer threads.
const THREADS: usize = 8;
/// Directories the threads share (and rename across).
const DIRS: usize = 2;

/// What one file must show after recovery.
#[derive(Clone, Debug)]
enum Promise {
    /// An appended file: at least its first `acked` bytes, exactly `written[..acked]`.
    Prefix { written: Vec<u8>, acked: usize },
    /// An atomically replaced file: exactly one of `versions[acked..]` (a later version may have
    /// reached the disk before the kill, an earlier one never).
    Replaced {
        versions: Vec<Vec<u8>>,
        acked: usize,
    },
}

/// Promises by path relative to the mountpoint; kept in this process, outside the file system.
type Promises = Mutex<BTreeMap<String, Promise>>;

/// A record: its thread, round and number, then filler derived from them, then a newline.
fn record(thread: usize, round: usize, n: usize) -> Vec<u8> {
    let mut r = format!("t{thread} r{round} n{n} ").into_bytes();
    let len = 40 + (thread * 31 + n * 17) % 180;
    let mut x = (thread as u32 + 1).wrapping_mul(2_654_435_761) ^ (n as u32).wrapping_mul(40_503);
    while r.len() < len {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        r.push(b'a' + (x % 26) as u8);
    }
    r.push(b'\n');
    r
}

/// One version of a replaced file: a few records, its length varying with the version.
fn version(thread: usize, round: usize, k: usize) -> Vec<u8> {
    (0..1 + (k * 7 + thread) % 40)
        .flat_map(|n| record(thread, round, 10_000 * (k + 1) + n))
        .collect()
}

/// fsync of a directory (makes the names in it durable).
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// The even threads: append records, each followed by fdatasync (two of three) or fsync.
fn appender(mnt: &Path, thread: usize, round: usize, promises: &Promises, acks: &AtomicUsize) {
    let rel = format!("d{}/r{round}-log{thread}", thread % DIRS);
    let Ok(mut file) = OpenOptions::new()
        .create(true)
        .append(true)
        .open(mnt.join(&rel))
    else {
        return;
    };
    let mut written = Vec::new();
    for n in 0.. {
        let r = record(thread, round, n);
        written.extend_from_slice(&r);
        if file.write_all(&r).is_err() {
            return;
        }
        let synced = if n % 3 == 2 {
            file.sync_all()
        } else {
            file.sync_data()
        };
        if synced.is_err() {
            return;
        }
        promises.lock().expect("OK to unwrap: no poisoning").insert(
            rel.clone(),
            Promise::Prefix {
                written: written.clone(),
                acked: written.len(),
            },
        );
        acks.fetch_add(1, Ordering::SeqCst);
    }
}

/// The odd threads: replace `cur` atomically again and again; every fourth version also moves
/// a new file into the other directory.
fn replacer(mnt: &Path, thread: usize, round: usize, promises: &Promises, acks: &AtomicUsize) {
    let here = format!("d{}", thread % DIRS);
    let there = format!("d{}", (thread + 1) % DIRS);
    let current = format!("{here}/r{round}-cur{thread}");
    let mut versions = Vec::new();
    for k in 0.. {
        let content = version(thread, round, k);
        versions.push(content.clone());
        let tmp = mnt.join(format!("{here}/r{round}-tmp{thread}"));
        let step = (|| -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&content)?;
            f.sync_all()?;
            drop(f);
            if k % 4 == 3 {
                let moved = format!("{there}/r{round}-moved{thread}-{k}");
                std::fs::rename(&tmp, mnt.join(&moved))?;
                sync_dir(&mnt.join(&there))?;
                promises.lock().expect("OK to unwrap: no poisoning").insert(
                    moved,
                    Promise::Prefix {
                        written: content.clone(),
                        acked: content.len(),
                    },
                );
                // The next version goes to `cur` as usual; this one only lives in `moved`.
                return Ok(());
            }
            std::fs::rename(&tmp, mnt.join(&current))?;
            sync_dir(&mnt.join(&here))?;
            promises.lock().expect("OK to unwrap: no poisoning").insert(
                current.clone(),
                Promise::Replaced {
                    versions: versions.clone(),
                    acked: k,
                },
            );
            Ok(())
        })();
        if step.is_err() {
            // The version that failed may still have been renamed into place before the kill:
            // keep it among the allowed versions (it already is, at index k).
            if let Some(Promise::Replaced { versions: v, .. }) = promises
                .lock()
                .expect("OK to unwrap: no poisoning")
                .get_mut(&current)
            {
                *v = versions.clone();
            }
            return;
        }
        acks.fetch_add(1, Ordering::SeqCst);
    }
}

/// Checks every promise through the mount; returns the failures.
fn check_promises(mnt: &Path, promises: &BTreeMap<String, Promise>) -> Vec<String> {
    let mut failures = Vec::new();
    for (rel, promise) in promises {
        let got = match std::fs::read(mnt.join(rel)) {
            Ok(got) => got,
            Err(e) => {
                failures.push(format!("{rel}: acknowledged, now unreadable: {e}"));
                continue;
            }
        };
        match promise {
            Promise::Prefix { written, acked } => {
                if got.len() < *acked {
                    failures.push(format!(
                        "{rel}: {} bytes after recovery, {acked} were acknowledged",
                        got.len()
                    ));
                } else if got[..*acked] != written[..*acked] {
                    let at = got
                        .iter()
                        .zip(written)
                        .position(|(a, b)| a != b)
                        .unwrap_or(0);
                    failures.push(format!(
                        "{rel}: acknowledged bytes differ from byte {at} on (of {acked})"
                    ));
                }
            }
            Promise::Replaced { versions, acked } => {
                if !versions[*acked..].contains(&got) {
                    let which = versions.iter().position(|v| *v == got);
                    failures.push(format!(
                        "{rel}: holds {} (version {which:?}), version {acked} or later was \
                         acknowledged",
                        got.len()
                    ));
                }
            }
        }
    }
    failures
}

/// One round: mount in `mode`, storm until `kill_after` acknowledgements, kill, remount, check.
fn round(m: &mut Mount, round: usize, mode: &str, kill_after: usize, promises: &Promises) {
    m.mount(&[&format!("data={mode}")]);
    for d in 0..DIRS {
        let dir = m.path(&format!("d{d}"));
        if !dir.exists() {
            std::fs::create_dir(&dir).expect("OK to unwrap: mkdir on the fresh mount");
        }
    }
    sync_dir(&m.mnt).expect("OK to unwrap: fsync of the root");
    let acks = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (mnt, acks) = (m.mnt.clone(), &acks);
            scope.spawn(move || {
                if t % 2 == 0 {
                    appender(&mnt, t, round, promises, acks);
                } else {
                    replacer(&mnt, t, round, promises, acks);
                }
            });
        }
        // The kill point: a count of acknowledgements, so it falls inside the storm however
        // fast this machine is. A storm that stalls fails the test rather than hanging it.
        let deadline = Instant::now() + Duration::from_secs(120);
        while acks.load(Ordering::SeqCst) < kill_after {
            assert!(
                Instant::now() < deadline,
                "round {round} ({mode}): only {} acknowledgements in 120 s",
                acks.load(Ordering::SeqCst)
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        // SIGKILL, then the dead mount is removed; the threads' next calls fail and they end.
        m.crash();
    });
    let acked = acks.load(Ordering::SeqCst);
    assert!(acked >= kill_after, "round {round}: killed too early");

    // Recovery by the daemon itself: the mount replays the journal.
    m.mount(&[&format!("data={mode}")]);
    let snapshot = promises.lock().expect("OK to unwrap: no poisoning").clone();
    let failures = check_promises(&m.mnt, &snapshot);
    m.umount_ok();
    assert!(
        failures.is_empty(),
        "round {round} (data={mode}, killed after {acked} acknowledgements): {} broken \
         promise(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
    let (code, text) = e2fsck(&m.image);
    assert_eq!(
        code, 0,
        "round {round} (data={mode}): e2fsck -fn after recovery and unmount:\n{text}"
    );
}

/// Goal and method: see the module header.
#[test]
fn storm_kill_keeps_every_acknowledged_fsync() {
    let test = "storm_kill_keeps_every_acknowledged_fsync";
    if let Some(why) = mount_skip_reason() {
        skip(test, &why);
        return;
    }
    let mut m = Mount::unmounted("512M", &[]);
    let promises = Promises::default();
    // (data mode, acknowledgements before the kill): lightweight is left out, as its promise
    // allows leaked blocks that e2fsck reports until `tidefs fsck -p` reclaims them.
    let rounds = [
        ("ordered", 40),
        ("journal", 150),
        ("writeback", 90),
        ("wasteless", 120),
        ("selective:1K", 200),
        ("ordered", 300),
    ];
    for (i, (mode, kill_after)) in rounds.into_iter().enumerate() {
        round(&mut m, i, mode, kill_after, &promises);
    }
    let total = promises.lock().expect("OK to unwrap: no poisoning").len();
    assert!(total >= THREADS, "only {total} files carried promises");
}
