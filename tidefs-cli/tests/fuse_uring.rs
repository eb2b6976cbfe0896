//! Goal: `-o fuse_uring` (FUSE over io_uring, one queue per CPU) serves a mount as /dev/fuse does:
//! every kind of request the posix tests use, writes and reads as large as the kernel sends
//! (1 MiB), fsync and fdatasync answered from the committing thread while other threads keep
//! writing, promises kept across a daemon kill, a clean image after unmount; and a kernel with the
//! transport switched off gets a clear refusal instead of a mount.
//! Method: the kernel's switch (`/sys/module/fuse/parameters/enable_uring`, root only) is set
//! for each test and put back after it; the tests take one lock so that they never see each
//! other's setting. The switch is global: another process mounting with `fuse_uring` at the
//! same time (a second test run) may see it off. The daemon's `status` reports the transport
//! and how many requests came through the rings, which must be nearly all of them.

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::{Read as _, Write as _};
use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::sync::Mutex;

use common::*;

const SWITCH: &str = "/sys/module/fuse/parameters/enable_uring";

/// Serializes the tests of this file around the kernel's switch.
static SWITCH_LOCK: Mutex<()> = Mutex::new(());

/// The kernel's switch set to `on` until dropped, then put back as it was.
struct Switch {
    before: String,
    _lock: std::sync::MutexGuard<'static, ()>,
}

impl Switch {
    /// Sets the switch, or skips the test (failing in CI) when this machine cannot.
    fn set(test: &str, on: bool) -> Option<Switch> {
        if let Some(why) = mount_skip_reason() {
            skip(test, &why);
            return None;
        }
        if !need_root(test, "switching FUSE over io_uring on needs root") {
            return None;
        }
        let lock = SWITCH_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let Ok(before) = fs::read_to_string(SWITCH) else {
            skip(
                test,
                "this kernel has no FUSE over io_uring (CONFIG_FUSE_IO_URING)",
            );
            return None;
        };
        fs::write(SWITCH, if on { "Y" } else { "N" }).expect("OK to unwrap: write the switch");
        Some(Switch {
            before: before.trim().to_string(),
            _lock: lock,
        })
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        let _ = fs::write(SWITCH, &self.before);
    }
}

/// The switch on and a fresh image of `size` mounted with `fuse_uring`, or `None` after a
/// skip (which fails in CI).
fn mount_through_rings(test: &str, size: &str) -> Option<(Switch, Mount)> {
    let switch = Switch::set(test, true)?;
    let m = Mount::new(test, size, &[], &["fuse_uring"])?;
    Some((switch, m))
}

/// `len` bytes that differ from offset to offset and from `seed` to `seed`.
fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3] ^ seed)
        .collect()
}

fn requests_over_uring(m: &Mount) -> u64 {
    m.status()["fuse_requests_over_uring"]
        .as_u64()
        .expect("OK to unwrap: status counts requests over io_uring")
}

/// Requests served, but for those the kernel sends through /dev/fuse even with the rings
/// (FORGET, BATCH_FORGET, INTERRUPT).
fn requests_for_the_rings(m: &Mount) -> u64 {
    m.stats()["fuse_requests"]
        .as_object()
        .expect("OK to unwrap: stats has fuse_requests")
        .iter()
        .filter(|(kind, _)| !matches!(kind.as_str(), "FORGET" | "BATCH_FORGET" | "INTERRUPT"))
        .filter_map(|(_, n)| n.as_u64())
        .sum()
}

/// Goal: a file-system workload through the rings gives the results it gives through
/// /dev/fuse, nearly every request comes through a ring, and the image is clean and holds
/// the same bytes after unmount and a mount without the rings.
#[test]
fn the_rings_serve_a_file_system_workload() {
    let test = "the_rings_serve_a_file_system_workload";
    let Some((_switch, mut m)) = mount_through_rings(test, "256M") else {
        return;
    };
    let status = m.status();
    assert_eq!(status["fuse_transport"], "io_uring", "{status}");

    // Small and large files: a 1 MiB write is the largest the kernel sends (max_write), and a
    // 3 MiB read crosses several 1 MiB replies.
    let small = pattern(1, 3000);
    fs::write(m.path("small"), &small).expect("OK to unwrap: write small");
    let big = pattern(2, 3 << 20);
    {
        let mut f = File::create(m.path("big")).expect("OK to unwrap: create big");
        for chunk in big.chunks(1 << 20) {
            f.write_all(chunk).expect("OK to unwrap: write big");
        }
        f.sync_all().expect("OK to unwrap: fsync big");
    }
    assert_eq!(
        fs::read(m.path("small")).expect("OK to unwrap: read"),
        small
    );
    let mut got = Vec::new();
    File::open(m.path("big"))
        .and_then(|mut f| f.read_to_end(&mut got))
        .expect("OK to unwrap: read big");
    assert!(
        got == big,
        "big reads back {} bytes, not what was written",
        got.len()
    );
    // An unaligned overwrite in the middle.
    let f = OpenOptions::new()
        .write(true)
        .open(m.path("big"))
        .expect("OK to unwrap: open big");
    f.write_all_at(b"overwritten", 1_000_001)
        .expect("OK to unwrap: pwrite");
    drop(f);

    // Names: a directory of 2 000 entries (several READDIR replies), renames, links,
    // symlinks, extended attributes, truncate, unlink and their errors.
    fs::create_dir(m.path("dir")).expect("OK to unwrap: mkdir");
    for i in 0..2000 {
        File::create(m.path(&format!("dir/entry-{i:05}"))).expect("OK to unwrap: create");
    }
    let listed = fs::read_dir(m.path("dir"))
        .expect("OK to unwrap: readdir")
        .count();
    assert_eq!(listed, 2000);
    fs::rename(m.path("dir/entry-00000"), m.path("moved")).expect("OK to unwrap: rename");
    fs::hard_link(m.path("moved"), m.path("linked")).expect("OK to unwrap: link");
    std::os::unix::fs::symlink("small", m.path("symlink")).expect("OK to unwrap: symlink");
    assert_eq!(
        fs::read_link(m.path("symlink")).expect("OK to unwrap: readlink"),
        Path::new("small")
    );
    xattr::set(m.path("small"), "user.kind", b"sample").expect("OK to unwrap: setxattr");
    assert_eq!(
        xattr::get(m.path("small"), "user.kind").expect("OK to unwrap: getxattr"),
        Some(b"sample".to_vec())
    );
    OpenOptions::new()
        .write(true)
        .open(m.path("small"))
        .and_then(|f| f.set_len(1000))
        .expect("OK to unwrap: truncate");
    assert_eq!(errno(fs::remove_dir(m.path("dir"))), libc::ENOTEMPTY);
    assert_eq!(errno(fs::metadata(m.path("absent"))), libc::ENOENT);
    assert_eq!(errno(File::create(m.path("small/below"))), libc::ENOTDIR);
    for i in 1..1000 {
        fs::remove_file(m.path(&format!("dir/entry-{i:05}"))).expect("OK to unwrap: unlink");
    }

    let total = requests_for_the_rings(&m);
    let over_uring = requests_over_uring(&m);
    // The few that came before the rings were ready used /dev/fuse.
    assert!(
        over_uring + 10 >= total && total > 8000,
        "only {over_uring} of {total} requests came through the rings"
    );

    m.umount_ok();
    let (code, text) = e2fsck(&m.image);
    assert_eq!(code, 0, "e2fsck -fn after unmount:\n{text}");

    m.mount(&[]);
    let mut want = big.clone();
    want[1_000_001..1_000_012].copy_from_slice(b"overwritten");
    let got = fs::read(m.path("big")).expect("OK to unwrap: read big again");
    assert!(got == want, "big after the remount is not what was written");
    assert_eq!(
        fs::read(m.path("small")).expect("OK to unwrap: read small again"),
        small[..1000]
    );
    assert_eq!(
        fs::read_dir(m.path("dir")).expect("OK to unwrap").count(),
        1000
    );
    assert_eq!(
        fs::metadata(m.path("linked")).expect("OK to unwrap").len(),
        0,
        "the hard link"
    );
    m.umount_ok();
}

/// Goal: fsync and fdatasync answered from the committing thread reach their callers through
/// the rings while other threads keep writing, and what they promised survives a kill of the
/// daemon (the kernel tears the rings down without a hang).
#[test]
fn fsync_promises_through_the_rings_survive_a_crash() {
    let test = "fsync_promises_through_the_rings_survive_a_crash";
    let Some((_switch, mut m)) = mount_through_rings(test, "128M") else {
        return;
    };
    // Even records fdatasync, odd ones fsync.
    append_storm(&m, 16, 60, |f, r| {
        if r % 2 == 0 {
            f.sync_data()
        } else {
            f.sync_all()
        }
    });
    assert!(
        requests_over_uring(&m) > 16 * 60,
        "the writes did not use the rings"
    );
    m.crash();
    check_append_storm(&m.recover(), 16, 60);
}

/// Goal: when the connection is aborted under the rings (`umount -f`, which aborts a FUSE
/// connection, as a daemon's queue does when it fails), every queue ends, the session ends and
/// the daemon closes the file system cleanly: it exits, the image needs no recovery and holds
/// everything written, synced or not. Method: write, abort, wait for the daemon to go, then
/// `e2fsck -fn` (which would see a journal needing recovery) and a mount without the rings.
#[test]
fn an_aborted_connection_ends_the_rings_and_closes_the_image_cleanly() {
    let test = "an_aborted_connection_ends_the_rings_and_closes_the_image_cleanly";
    let Some((_switch, mut m)) = mount_through_rings(test, "64M") else {
        return;
    };
    let synced = pattern(3, 70_000);
    let mut f = File::create(m.path("synced")).expect("OK to unwrap: create");
    f.write_all(&synced).expect("OK to unwrap: write");
    f.sync_all().expect("OK to unwrap: fsync");
    drop(f);
    let unsynced = pattern(4, 5_000);
    fs::write(m.path("unsynced"), &unsynced).expect("OK to unwrap: write");
    let pid = m.daemon_pid();
    let out = std::process::Command::new("umount")
        .arg("-f")
        .arg(&m.mnt)
        .output()
        .expect("OK to unwrap: run umount -f");
    assert!(out.status.success(), "umount -f: {}", stderr(&out));
    assert!(
        wait_gone(pid, std::time::Duration::from_secs(20)),
        "the daemon is still running after its connection was aborted"
    );
    m.mounted = false;
    let (code, text) = e2fsck(&m.image);
    assert_eq!(code, 0, "e2fsck -fn after the abort:\n{text}");
    m.mount(&[]);
    assert!(fs::read(m.path("synced")).expect("OK to unwrap") == synced);
    assert!(fs::read(m.path("unsynced")).expect("OK to unwrap") == unsynced);
    m.umount_ok();
}

/// Goal: with the kernel's switch off, `-o fuse_uring` is refused before anything is mounted,
/// with the way to switch it on; and a value after the option is a usage error.
#[test]
fn fuse_uring_with_the_switch_off_is_refused_clearly() {
    let test = "fuse_uring_with_the_switch_off_is_refused_clearly";
    let Some(_switch) = Switch::set(test, false) else {
        return;
    };
    let m = Mount::unmounted("64M", &[]);
    let out = output(
        tidefs()
            .args(["mount", "-o", "fuse_uring"])
            .arg(&m.image)
            .arg(&m.mnt),
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stderr(&out);
    assert!(
        text.contains("switched off") && text.contains(SWITCH),
        "unclear refusal: {text}"
    );
    assert!(!is_mounted(&m.mnt), "something was mounted");
    let out = output(
        tidefs()
            .args(["mount", "-o", "fuse_uring=1"])
            .arg(&m.image)
            .arg(&m.mnt),
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("takes no value"), "{}", stderr(&out));
}
