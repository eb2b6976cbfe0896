//! Goal: the mount daemon's life cycle. A background mount is usable when `tidefs mount`
//! returns; `tidefs umount`, `fusermount3 -u` and SIGTERM all close the file system cleanly
//! (the daemon exits, `e2fsck -fn` is clean, data is there after a remount); `stats` reports
//! the counters; `fsck` follows fsck(8)'s exit codes and `-n` never writes; a daemon killed
//! with SIGKILL in the middle of fsyncs leaves an image that `tidefs fsck` recovers to a clean
//! state with every fsynced record present.
//! Method: drive the real binary against real images and a real FUSE mount.

mod common;

use std::io::{Read as _, Write as _};
use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::time::Duration;

use common::*;

fn write_tree(m: &Mount) {
    std::fs::create_dir_all(m.path("a/b/c")).expect("OK to unwrap: mkdir");
    for i in 0..20 {
        std::fs::write(
            m.path(&format!("a/b/c/f{i}")),
            format!("file {i}\n").repeat(i + 1),
        )
        .expect("OK to unwrap: write");
    }
    std::os::unix::fs::symlink("b/c/f1", m.path("a/link")).expect("OK to unwrap: symlink");
}

fn check_tree(m: &Mount) {
    for i in 0..20 {
        let text =
            std::fs::read_to_string(m.path(&format!("a/b/c/f{i}"))).expect("OK to unwrap: read");
        assert_eq!(text, format!("file {i}\n").repeat(i + 1));
    }
    assert_eq!(
        std::fs::read_to_string(m.path("a/link")).expect("OK to unwrap: read"),
        "file 1\nfile 1\n"
    );
}

fn assert_clean(m: &Mount) {
    let (code, text) = e2fsck(&m.image);
    assert_eq!(code, 0, "e2fsck -fn after a clean close:\n{text}");
}

/// Goal: the mount daemon runs with transparent huge pages off (`without_huge_pages` in
/// main.rs: with them, commits on many threads spent their time clearing fresh 2 MiB pages).
/// Method: the kernel's own report of the flag in `/proc/PID/status` (`THP_enabled`, Linux
/// 5.0 and later) while the daemon serves a mount.
#[test]
fn the_daemon_runs_without_transparent_huge_pages() {
    let Some(mut m) = Mount::new(
        "the_daemon_runs_without_transparent_huge_pages",
        "64M",
        &[],
        &[],
    ) else {
        return;
    };
    let pid = m.daemon_pid();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("OK to unwrap: the daemon's status");
    let flag = status
        .lines()
        .find_map(|l| l.strip_prefix("THP_enabled:"))
        .map(str::trim);
    m.umount_ok();
    assert_eq!(flag, Some("0"), "THP_enabled of the daemon:\n{status}");
}

/// Goal: the kernel's read-ahead window of a mount is 4 MiB unless `-o readahead=` says
/// otherwise (the kernel gives FUSE mounts 128 KiB), set before `tidefs mount` returns, and
/// `tidefs status` reports it. Method: the mount's `read_ahead_kb` in sysfs (named after the
/// device number of its root) and `status`, with the default and with `readahead=1M`, and
/// the bytes of a file read back through the larger window.
#[test]
fn the_mount_sets_its_read_ahead_window() {
    let test = "the_mount_sets_its_read_ahead_window";
    if !need_root(test, "only root may set a mount's read-ahead in sysfs") {
        return;
    }
    let Some(mut m) = Mount::new(test, "64M", &[], &[]) else {
        return;
    };
    let window = |m: &Mount| -> (u64, u64) {
        // The mount's device (field 3) from the line of its mount point (field 5).
        let mnt = m.mnt.canonicalize().expect("OK to unwrap: the mountpoint");
        let info = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        let dev = info
            .lines()
            .map(|l| l.split(' ').collect::<Vec<_>>())
            .filter(|f| f.get(4).is_some_and(|p| Path::new(p) == mnt))
            .map(|f| f[2].to_string())
            .next_back()
            .expect("the mount is in mountinfo");
        let file = format!("/sys/class/bdi/{dev}/read_ahead_kb");
        let kib = std::fs::read_to_string(&file).expect("OK to unwrap: sysfs");
        let status = m.status()["read_ahead_bytes"]
            .as_u64()
            .expect("status reports the window");
        (kib.trim().parse::<u64>().expect("a number") * 1024, status)
    };
    assert_eq!(window(&m), (4 << 20, 4 << 20), "the default window");
    let data: Vec<u8> = (0..(8u32 << 20)).map(|i| (i % 253) as u8).collect();
    std::fs::write(m.path("f"), &data).expect("OK to unwrap: write");
    m.umount_ok();
    m.mount(&["readahead=1M"]);
    assert_eq!(window(&m), (1 << 20, 1 << 20), "readahead=1M");
    assert!(
        std::fs::read(m.path("f")).expect("OK to unwrap: read") == data,
        "the file read back differs"
    );
    m.umount_ok();
}

/// Goal: `tidefs umount` closes cleanly: the daemon exits, e2fsck and fsck are clean, and the tree
/// is there after a remount. Method: write a tree, unmount, check, remount, read.
#[test]
fn umount_closes_cleanly_and_data_survives_a_remount() {
    let Some(mut m) = Mount::new(
        "umount_closes_cleanly_and_data_survives_a_remount",
        "64M",
        &[],
        &[],
    ) else {
        return;
    };
    write_tree(&m);
    let pid = m.daemon_pid();
    m.umount_ok();
    assert!(!is_mounted(&m.mnt));
    // The daemon has exited when umount returns; give init a moment to reap it.
    assert!(
        wait_gone(pid, Duration::from_secs(5)),
        "the daemon must have exited when umount returns"
    );
    assert_clean(&m);
    let out = output(tidefs().arg("fsck").arg(&m.image));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    m.mount(&[]);
    check_tree(&m);
    m.umount_ok();
    assert_clean(&m);
}

/// Goal: `fusermount3 -u` closes as cleanly as `tidefs umount`. Method: as above, with fusermount3.
#[test]
fn fusermount_u_closes_cleanly() {
    if tool("fusermount3").is_none() {
        skip(
            "fusermount_u_closes_cleanly",
            "fusermount3 is not installed",
        );
        return;
    }
    let Some(mut m) = Mount::new("fusermount_u_closes_cleanly", "64M", &[], &[]) else {
        return;
    };
    write_tree(&m);
    let pid = m.daemon_pid();
    let out = output(
        std::process::Command::new("fusermount3")
            .arg("-u")
            .arg(&m.mnt),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(m.wait_unmounted(Duration::from_secs(10)));
    assert!(
        wait_gone(pid, Duration::from_secs(60)),
        "daemon still running"
    );
    assert_clean(&m);
    m.mount(&[]);
    check_tree(&m);
}

/// Goal: SIGTERM to the daemon closes cleanly. Method: write a tree, SIGTERM, wait, e2fsck,
/// remount, read.
#[test]
fn sigterm_closes_cleanly() {
    let Some(mut m) = Mount::new("sigterm_closes_cleanly", "64M", &[], &[]) else {
        return;
    };
    write_tree(&m);
    let pid = m.daemon_pid();
    kill(pid, libc::SIGTERM).expect("OK to unwrap: kill");
    assert!(
        wait_gone(pid, Duration::from_secs(60)),
        "daemon still running"
    );
    assert!(m.wait_unmounted(Duration::from_secs(5)));
    assert_clean(&m);
    m.mount(&[]);
    check_tree(&m);
}

/// Goal: a second mount on a live tidefs mountpoint is refused (exit 1) and names the problem.
#[test]
fn a_second_mount_on_the_same_mountpoint_is_refused() {
    let Some(m) = Mount::new(
        "a_second_mount_on_the_same_mountpoint_is_refused",
        "64M",
        &[],
        &[],
    ) else {
        return;
    };
    let out = output(tidefs().arg("mount").arg(&m.image).arg(&m.mnt));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("already a tidefs mount"),
        "{}",
        stderr(&out)
    );
}

/// Goal: umount of a busy mount fails (exit 1) and the mount keeps serving. Method: hold a file
/// open.
#[test]
fn umount_of_a_busy_mount_fails_and_keeps_serving() {
    let Some(mut m) = Mount::new(
        "umount_of_a_busy_mount_fails_and_keeps_serving",
        "64M",
        &[],
        &[],
    ) else {
        return;
    };
    let file = std::fs::File::create(m.path("open")).expect("OK to unwrap: create");
    let out = m.umount();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).starts_with("tidefs: umount: "),
        "{}",
        stderr(&out)
    );
    file.write_all_at(b"still here", 0)
        .expect("OK to unwrap: write");
    drop(file);
    assert_eq!(
        std::fs::read(m.path("open")).expect("OK to unwrap: read"),
        b"still here"
    );
    m.umount_ok();
    assert_clean(&m);
}

/// Goal: a read-only mount serves the tree, refuses changes with EROFS and never writes the image.
/// Method: compare the image's bytes before and after; the read-only mount is given
/// `commit=` too, which it notes changes nothing (`data=` still sets the mode it reports).
#[test]
fn read_only_mount_refuses_changes() {
    let Some(mut m) = Mount::new("read_only_mount_refuses_changes", "64M", &[], &[]) else {
        return;
    };
    write_tree(&m);
    m.umount_ok();
    let before = std::fs::read(&m.image).expect("OK to unwrap: read");
    // When it would commit changes nothing read-only, and the mount says so.
    let out = m.mount(&["ro,data=journal,commit=3"]);
    assert!(
        stderr(&out).contains("commit= change nothing on a read-only mount"),
        "{}",
        stderr(&out)
    );
    check_tree(&m);
    assert_eq!(errno(std::fs::File::create(m.path("new"))), libc::EROFS);
    assert_eq!(errno(std::fs::remove_file(m.path("a/link"))), libc::EROFS);
    m.umount_ok();
    assert!(
        std::fs::read(&m.image).expect("OK to unwrap: read") == before,
        "a read-only mount changed the image"
    );
}

/// Goal: `-o ro` takes effect: every change fails with EROFS and `status` says read-only.
/// Method: mount a fresh image with `ro` (given with other options, `-o` repeated) and try
/// changes.
#[test]
fn mount_option_ro_refuses_changes_with_erofs() {
    let Some(m) = Mount::new(
        "mount_option_ro_refuses_changes_with_erofs",
        "64M",
        &[],
        &["commit=1,cache_size=16M", "ro"],
    ) else {
        return;
    };
    assert_eq!(m.status()["read_only"], true, "{}", m.status());
    assert_eq!(errno(std::fs::File::create(m.path("x"))), libc::EROFS);
    assert_eq!(errno(std::fs::create_dir(m.path("d"))), libc::EROFS);
    assert_eq!(
        errno(std::fs::remove_dir(m.path("lost+found"))),
        libc::EROFS
    );
}

/// Goal: `-o commit=N` takes effect: a write that nobody fsyncs reaches the disk within N
/// seconds on its own, and with a long interval it does not.
/// Method: two mounts side by side, `commit=1` and `commit=3600`; write the same file in each
/// (no fsync), wait 4 seconds, SIGKILL both daemons, replay with `tidefs fsck` and read the
/// images through the library. This is a behaviour check with a wide margin, not a timing one.
#[test]
fn mount_option_commit_makes_writes_durable_on_its_own() {
    let name = "mount_option_commit_makes_writes_durable_on_its_own";
    let Some(mut short) = Mount::new(name, "64M", &[], &["commit=1"]) else {
        return;
    };
    let Some(mut long) = Mount::new(name, "64M", &[], &["commit=3600"]) else {
        return;
    };
    assert_eq!(short.status()["commit_seconds"], 1.0, "{}", short.status());
    assert_eq!(long.status()["commit_seconds"], 3600.0, "{}", long.status());
    let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    for m in [&short, &long] {
        std::fs::create_dir(m.path("dir")).expect("OK to unwrap: mkdir");
        std::fs::write(m.path("dir/unsynced"), &data).expect("OK to unwrap: write");
    }
    std::thread::sleep(Duration::from_secs(4));
    short.crash();
    long.crash();
    let fs = short.recover();
    assert_eq!(
        lib_read(&fs, "dir/unsynced").as_deref(),
        Some(&data[..]),
        "commit=1: a write 4 s old did not survive the crash"
    );
    let fs = long.recover();
    assert_eq!(
        lib_read(&fs, "dir"),
        None,
        "commit=3600: a change nobody synced reached the disk within 4 s, so the check above \
         proves nothing about commit="
    );
}

/// Goal: `-o cache_size=` and `-o data=` take effect: `status` reports them, and `data=journal`
/// logs file data (its journal traffic grows by at least the data fsynced).
/// Method: mount with both, read `status`, fsync 1 MiB and compare `stats` before and after.
#[test]
fn mount_options_cache_size_and_data_mode_are_in_effect() {
    let Some(m) = Mount::new(
        "mount_options_cache_size_and_data_mode_are_in_effect",
        "64M",
        &[],
        &["cache_size=16M,data=journal"],
    ) else {
        return;
    };
    let status = m.status();
    assert_eq!(status["cache_size_bytes"], 16u64 << 20, "{status}");
    assert_eq!(status["data_mode"], "journal", "{status}");
    assert_eq!(status["read_only"], false, "{status}");
    assert!(status["error"].is_null(), "{status}");
    let journal_bytes = |m: &Mount| -> u64 {
        let out = output(tidefs().args(["stats", "--json"]).arg(&m.mnt));
        assert!(out.status.success(), "{}", stderr(&out));
        let value: serde_json::Value =
            serde_json::from_str(&stdout(&out)).expect("OK to unwrap: JSON");
        value["journal_bytes"]
            .as_u64()
            .expect("OK to unwrap: a number")
    };
    let before = journal_bytes(&m);
    let mut file = std::fs::File::create(m.path("data")).expect("OK to unwrap: create");
    file.write_all(&vec![0x5a; 1 << 20])
        .expect("OK to unwrap: write");
    file.sync_all().expect("OK to unwrap: fsync");
    let after = journal_bytes(&m);
    assert!(
        after - before >= 1 << 20,
        "data=journal logged {} bytes for 1 MiB of fsynced data",
        after - before
    );
    // The defaults, for contrast: ordered data, 5 s commits, a 256 MiB cache.
    let Some(d) = Mount::new(
        "mount_options_cache_size_and_data_mode_are_in_effect",
        "64M",
        &[],
        &[],
    ) else {
        return;
    };
    let status = d.status();
    assert_eq!(status["data_mode"], "ordered", "{status}");
    assert_eq!(status["commit_seconds"], 5.0, "{status}");
    assert_eq!(status["cache_size_bytes"], 256u64 << 20, "{status}");
}

/// Goal: with `-o allow_other` another user can use the mount (here uid 65534 lists it).
/// Method: mount as root with `allow_other`, then run `ls` as uid/gid 65534 with no
/// supplementary groups. (Whether a mount without the option lets others in depends on the
/// mount's defaults; only the explicit option is checked.)
#[test]
fn mount_option_allow_other_lets_another_user_in() {
    let name = "mount_option_allow_other_lets_another_user_in";
    if !need_root(name, "switching to another uid needs root") {
        return;
    }
    let Some(m) = Mount::new(name, "64M", &[], &["allow_other"]) else {
        return;
    };
    std::fs::write(m.path("visible"), b"to everyone").expect("OK to unwrap: write");
    let out = run_as(65534, 65534, &format!("ls {}", m.mnt.display()));
    assert!(
        out.status.success(),
        "uid 65534 cannot list an allow_other mount: {}",
        stderr(&out)
    );
    assert!(stdout(&out).contains("visible"), "{}", stdout(&out));
    let out = run_as(
        65534,
        65534,
        &format!("cat {}", m.path("visible").display()),
    );
    assert_eq!(stdout(&out), "to everyone", "{}", stderr(&out));
}

/// Goal: `tidefs stats` reports every counter and they move. Method: 10 fdatasynced appends, then
/// JSON.
#[test]
fn stats_reports_the_counters() {
    let Some(m) = Mount::new("stats_reports_the_counters", "64M", &[], &[]) else {
        return;
    };
    let mut file = std::fs::File::create(m.path("log")).expect("OK to unwrap: create");
    for _ in 0..10 {
        file.write_all(&[b'x'; 125]).expect("OK to unwrap: write");
        file.sync_data().expect("OK to unwrap: fdatasync");
    }
    let out = output(tidefs().args(["stats", "--json"]).arg(&m.mnt));
    assert!(out.status.success(), "{}", stderr(&out));
    let value: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("OK to unwrap: JSON");
    for key in [
        "journal_bytes",
        "home_bytes",
        "commits",
        "fsyncs",
        "fsyncs_per_commit",
        "avg_transaction_blocks",
        "fsync_p50_us",
        "fsync_p99_us",
        "checkpoints",
        "metadata_hold_max_us",
        "metadata_holds_over_ms",
    ] {
        assert!(value.get(key).is_some(), "{key} missing in {value}");
    }
    // The create at least took the metadata lock.
    assert!(
        value["metadata_locked"].as_u64().unwrap_or(0) >= 1,
        "{value}"
    );
    assert!(value["fsyncs"].as_u64().unwrap_or(0) >= 10, "{value}");
    assert!(value["commits"].as_u64().unwrap_or(0) >= 1, "{value}");
    assert!(value["journal_bytes"].as_u64().unwrap_or(0) > 0, "{value}");
    let out = output(tidefs().arg("stats").arg(&m.mnt));
    assert!(out.status.success());
    assert!(
        stdout(&out).contains("fsyncs_per_commit"),
        "{}",
        stdout(&out)
    );
    // The FUSE requests, by kind: one WRITE and one FSYNC per append; opening the file again
    // ten times reaches the daemon once at most (the first OPEN, which tells the kernel to open
    // files without asking from then on), and never releases.
    drop(file);
    let requests = |m: &Mount| m.stats()["fuse_requests"].clone();
    let before = requests(&m);
    assert!(before["WRITE"].as_u64().unwrap_or(0) >= 10, "{before}");
    assert!(before["FSYNC"].as_u64().unwrap_or(0) >= 10, "{before}");
    for _ in 0..10 {
        let mut text = Vec::new();
        std::fs::File::open(m.path("log"))
            .and_then(|mut f| f.read_to_end(&mut text))
            .expect("OK to unwrap: read");
        assert_eq!(text.len(), 1250);
    }
    let after = requests(&m);
    let count = |v: &serde_json::Value, kind: &str| v[kind].as_u64().unwrap_or(0);
    assert!(count(&after, "OPEN") <= 1, "{after}");
    // The created file's own handle may still send its RELEASE (asynchronously, after the
    // close above); the re-opens send none.
    assert!(
        count(&after, "RELEASE") <= count(&before, "RELEASE") + 1,
        "{after}"
    );
    let out = output(tidefs().arg("stats").arg(&m.mnt));
    assert!(stdout(&out).contains("fuse_requests"), "{}", stdout(&out));
}

/// Goal: with -n, fsck never writes to the image, even when the journal needs replay.
/// Method: fsck -n a cleanly unmounted image, then one left by a SIGKILLed daemon with fsynced
/// changes in its journal; the image's bytes must not change, and the second run must say it
/// replayed (in a copy). A plain fsck then replays for real (exit 1).
#[test]
fn fsck_n_never_writes() {
    let Some(mut m) = Mount::new("fsck_n_never_writes", "64M", &[], &[]) else {
        return;
    };
    write_tree(&m);
    m.umount_ok();
    let before = std::fs::read(&m.image).expect("OK to unwrap: read");
    let out = output(tidefs().arg("fsck").arg("-n").arg(&m.image));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(
        stdout(&out).contains("e2fsck -fn: clean"),
        "{}",
        stdout(&out)
    );
    assert!(std::fs::read(&m.image).expect("OK to unwrap: read") == before);

    // Now with a journal to replay.
    m.mount(&[]);
    std::fs::write(m.path("after"), b"in the journal only").expect("OK to unwrap: write");
    std::fs::File::open(&m.mnt)
        .and_then(|d| d.sync_all())
        .expect("OK to unwrap: fsync");
    m.crash();
    let before = std::fs::read(&m.image).expect("OK to unwrap: read");
    let out = output(tidefs().arg("fsck").arg("-n").arg(&m.image));
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("in a temporary copy"), "{text}");
    assert!(text.contains("e2fsck -fn: clean"), "{text}");
    assert!(
        std::fs::read(&m.image).expect("OK to unwrap: read") == before,
        "fsck -n wrote to an image that needed replay"
    );
    let out = output(tidefs().arg("fsck").arg(&m.image));
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let fs = open_read_only(&m.image);
    assert_eq!(
        lib_read(&fs, "after").as_deref(),
        Some(&b"in the journal only"[..])
    );
}

/// Goal: SIGKILL in the middle of many fsyncs loses nothing that an fsync promised, and
/// `tidefs fsck` (or a plain remount) brings the image back to clean.
/// Method: 8 writer threads append numbered 125-byte records with fdatasync after each and
/// count the ones that returned; kill the daemon; check that every counted record is there.
#[test]
fn sigkill_during_fsyncs_loses_nothing_promised() {
    sigkill_trial("sigkill_during_fsyncs_loses_nothing_promised", &[], true);
}

/// Goal: as `sigkill_during_fsyncs_loses_nothing_promised`, in the journal, wasteless,
/// selective, writeback and lightweight modes.
#[test]
fn sigkill_trials_in_every_data_mode() {
    sigkill_trial("sigkill_trials_in_every_data_mode", &["data=journal"], true);
    sigkill_trial(
        "sigkill_trials_in_every_data_mode",
        &["data=wasteless"],
        true,
    );
    sigkill_trial(
        "sigkill_trials_in_every_data_mode",
        &["data=selective"],
        true,
    );
    sigkill_trial(
        "sigkill_trials_in_every_data_mode",
        &["data=writeback"],
        true,
    );
    // Lightweight promises only the allocation structures: inodes and directories go home in
    // place, so a kill may leak blocks or inodes, but never leave one in use that the bitmap
    // calls free; `tidefs fsck -p` must then leave it clean, and every fsync that returned must
    // still hold. Several trials, since the window is narrow.
    for _ in 0..4 {
        sigkill_trial(
            "sigkill_trials_in_every_data_mode",
            &["data=lightweight"],
            false,
        );
    }
}

/// Record `r` of writer `t` in [`sigkill_trial`]: 125 bytes.
fn record(t: usize, r: usize) -> Vec<u8> {
    let mut record = format!("{t} {r:08}").into_bytes();
    record.resize(124, b'.');
    record.push(b'\n');
    record
}

/// Kills the mount daemon with SIGKILL while 8 threads append fsync'd records, then checks
/// with the real e2fsck and by reading every record whose fsync returned, byte for byte, from a
/// new mount of the recovered image.
fn sigkill_trial(name: &str, options: &[&str], strict_fsck: bool) {
    let Some(mut m) = Mount::new(name, "128M", &[], options) else {
        return;
    };
    let pid = m.daemon_pid();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..8)
        .map(|t| {
            let path = m.path(&format!("log{t}"));
            let stop = stop.clone();
            std::thread::spawn(move || -> usize {
                let Ok(mut file) = std::fs::File::create(&path) else {
                    return 0;
                };
                let mut durable = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if file.write_all(&record(t, durable)).is_err() || file.sync_data().is_err() {
                        break;
                    }
                    durable += 1;
                }
                durable
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    kill(pid, libc::SIGKILL).expect("OK to unwrap: kill");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let durable: Vec<usize> = writers
        .into_iter()
        .map(|w| w.join().expect("OK to unwrap: writer"))
        .collect();
    assert!(wait_gone(pid, Duration::from_secs(10)));
    // Remove the dead mount (umount says the daemon is gone and exits 1).
    let _ = m.umount();
    assert!(!is_mounted(&m.mnt));
    m.mounted = false;

    let out = output(tidefs().arg("fsck").arg(&m.image));
    let code = out.status.code();
    // Lightweight may leave leaks, which e2fsck -fn reports (exit 4 passed through, with 1
    // added when the journal was replayed).
    assert!(
        code == Some(0) || code == Some(1) || (!strict_fsck && matches!(code, Some(4 | 5))),
        "fsck after SIGKILL: {code:?}\n{}{}",
        stdout(&out),
        stderr(&out)
    );
    let (code, text) = e2fsck(&m.image);
    if strict_fsck {
        assert_eq!(code, 0, "e2fsck -fn after tidefs fsck:\n{text}");
    } else if code != 0 {
        let overclaims = tidefs_crash::oracle::used_but_marked_free(&text);
        assert!(
            overclaims.is_empty(),
            "lightweight left used blocks/inodes marked free: {overclaims:?}\n{text}"
        );
        let out = output(tidefs().args(["fsck", "-p"]).arg(&m.image));
        assert!(
            matches!(out.status.code(), Some(0 | 1)),
            "tidefs fsck -p could not repair the leaks: {:?}\n{}{}",
            out.status.code(),
            stdout(&out),
            stderr(&out)
        );
        let (code, text) = e2fsck(&m.image);
        assert_eq!(code, 0, "e2fsck -fn after tidefs fsck -p:\n{text}");
    }
    m.mount(options);
    for (t, &count) in durable.iter().enumerate() {
        let data = std::fs::read(m.path(&format!("log{t}"))).expect("OK to unwrap: read");
        assert!(
            data.len() >= count * 125,
            "log{t}: {} bytes, but {count} records were fsynced",
            data.len()
        );
        for r in 0..count {
            assert!(
                data[r * 125..(r + 1) * 125] == record(t, r)[..],
                "log{t} record {r} differs: {:?}",
                String::from_utf8_lossy(&data[r * 125..(r + 1) * 125])
            );
        }
    }
    m.umount_ok();
    let (code, text) = e2fsck(&m.image);
    assert_eq!(code, 0, "{text}");
}

/// Goal: an image whose journal is on an external device mounts with `journal_device=`, an
/// fsync through it survives a crash (`tidefs fsck --journal-device` replays it), and a clean
/// unmount leaves a clean image.
/// Method: mkfs with `--journal-device`, mount, write and fsync, SIGKILL the daemon, recover and
/// read through the library; remount, unmount, fsck.
#[test]
fn external_journal_device() {
    if !is_root() {
        skip("external_journal_device", "needs root (losetup for mkfs)");
        return;
    }
    if let Some(why) = mount_skip_reason() {
        skip("external_journal_device", &why);
        return;
    }
    let dir = tempfile::tempdir().expect("OK to unwrap: temp dir");
    let image = dir.path().join("fs.img");
    let journal = dir.path().join("journal.img");
    let out = output(
        tidefs()
            .args([
                "mkfs",
                "--size",
                "64M",
                "--journal-size",
                "8M",
                "--journal-device",
            ])
            .arg(&journal)
            .arg(&image),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).expect("OK to unwrap: mkdir");
    let mut m = Mount {
        image: image.clone(),
        mnt: mnt.clone(),
        mounted: false,
        dir,
    };
    let option = format!("journal_device={}", journal.display());
    m.mount(&[&option]);
    std::fs::write(m.path("x"), b"through an external journal").expect("OK to unwrap: write");
    std::fs::File::open(m.path("x"))
        .and_then(|f| f.sync_all())
        .expect("OK to unwrap: fsync");
    std::fs::File::open(&m.mnt)
        .and_then(|d| d.sync_all())
        .expect("OK to unwrap: fsync dir");
    // A crash after the fsync: the external journal must bring the file back.
    m.crash();
    let out = output(
        tidefs()
            .arg("fsck")
            .arg("--journal-device")
            .arg(&journal)
            .arg(&image),
    );
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "fsck after SIGKILL: {:?}\n{}{}",
        out.status.code(),
        stdout(&out),
        stderr(&out)
    );
    let fs = tidefs::fs::Fs::open(
        &image,
        &tidefs::fs::MountOptions {
            read_only: true,
            journal_device: Some(journal.clone()),
            ..tidefs::fs::MountOptions::default()
        },
    )
    .expect("OK to unwrap: open with the external journal");
    assert_eq!(
        lib_read(&fs, "x").as_deref(),
        Some(&b"through an external journal"[..])
    );
    drop(fs);
    // And a clean unmount leaves nothing for fsck to do.
    m.mount(&[&option]);
    assert_eq!(
        std::fs::read(m.path("x")).expect("OK to unwrap: read"),
        b"through an external journal"
    );
    m.umount_ok();
    let out = output(
        tidefs()
            .arg("fsck")
            .arg("--journal-device")
            .arg(&journal)
            .arg(&image),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
}
