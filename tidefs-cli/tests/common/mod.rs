//! Shared test support: the `tidefs` binary, skip rules, a mounted image with a guard that
//! always unmounts, and thin libc wrappers for calls std does not offer.
//!
//! Tests skip (with a printed reason) only when the machine lacks what they need: e2fsprogs,
//! /dev/fuse, or root, and only through [`skip`]. CI has all of them and sets `TIDEFS_CI=1`
//! (`.ci/run`): there [`skip`] fails the test instead, so nothing returns early and passes.

#![allow(dead_code, unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// A `tidefs` command.
pub fn tidefs() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tidefs"))
}

/// Runs a command and returns its output.
pub fn output(command: &mut Command) -> Output {
    // OK to unwrap: the binary was built by cargo for this test.
    command.output().expect("command runs")
}

/// stderr as text.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// stdout as text.
pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Finds an e2fsprogs tool in PATH or the sbin directories.
pub fn tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Whether we run as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Why mount tests cannot run here, if they cannot.
pub fn mount_skip_reason() -> Option<String> {
    if tool("mke2fs").is_none() || tool("e2fsck").is_none() {
        return Some("e2fsprogs (mke2fs, e2fsck) is not installed".into());
    }
    if !Path::new("/dev/fuse").exists() {
        return Some("/dev/fuse is missing".into());
    }
    if !is_root() && tool("fusermount3").is_none() {
        return Some("not root and fusermount3 is missing".into());
    }
    None
}

pub use tidefs::test_support::skip;

/// Whether the test may go on as root: if not, it skips through [`skip`] (fails in CI).
pub fn need_root(test: &str, why: &str) -> bool {
    if is_root() {
        return true;
    }
    skip(test, &format!("not root: {why}"));
    false
}

/// Runs `e2fsck -fn` on an image; returns (exit code, output).
pub fn e2fsck(image: &Path) -> (i32, String) {
    // OK to unwrap: mount_skip_reason checked e2fsck exists.
    let out = Command::new(tool("e2fsck").expect("e2fsck installed"))
        .arg("-fn")
        .arg(image)
        .output()
        .expect("OK to unwrap: e2fsck runs");
    (
        out.status.code().unwrap_or(-1),
        format!("{}{}", stdout(&out), stderr(&out)),
    )
}

/// Makes an image with `tidefs mkfs`.
pub fn mkfs(image: &Path, size: &str, extra: &[&str]) {
    let out = output(
        tidefs()
            .arg("mkfs")
            .arg("--size")
            .arg(size)
            .args(extra)
            .arg(image),
    );
    assert!(out.status.success(), "mkfs failed: {}", stderr(&out));
}

/// A temporary directory holding an image and a mountpoint, mounted while `mounted` is set.
/// Dropping it unmounts (cleanly if possible, else lazily) and removes everything.
pub struct Mount {
    /// The temporary directory (removed last).
    pub dir: tempfile::TempDir,
    /// The image file.
    pub image: PathBuf,
    /// The mountpoint.
    pub mnt: PathBuf,
    /// Whether the image is mounted now.
    pub mounted: bool,
}

impl Mount {
    /// Makes a fresh image of `size` (plus mkfs arguments `mkfs_extra`) and mounts it with
    /// `options`. Returns `None` (after [`skip`], which fails in CI) when the machine cannot
    /// mount.
    pub fn new(test: &str, size: &str, mkfs_extra: &[&str], options: &[&str]) -> Option<Mount> {
        if let Some(why) = mount_skip_reason() {
            skip(test, &why);
            return None;
        }
        let m = Mount::unmounted(size, mkfs_extra);
        let mut m = m;
        m.mount(options);
        Some(m)
    }

    /// Makes a fresh image but does not mount it. Call only after `mount_skip_reason()`.
    pub fn unmounted(size: &str, mkfs_extra: &[&str]) -> Mount {
        // The mountpoint must be reachable by other users for the multi-user tests.
        let dir = tempfile::Builder::new()
            .prefix("tidefs-test-")
            .tempdir()
            .expect("OK to unwrap: temp dir");
        set_mode(dir.path(), 0o755);
        let image = dir.path().join("fs.img");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).expect("OK to unwrap: mountpoint");
        mkfs(&image, size, mkfs_extra);
        Mount {
            dir,
            image,
            mnt,
            mounted: false,
        }
    }

    /// Mounts in the background; panics with the tool's message if that fails. Returns the
    /// mount command's output (its notes on stderr).
    pub fn mount(&mut self, options: &[&str]) -> Output {
        let mut command = tidefs();
        command.arg("mount");
        for option in options {
            command.arg("-o").arg(option);
        }
        // Mounts made here go through FUSE over io_uring instead of /dev/fuse with
        // `TIDEFS_TEST_FUSE_URING=1 cargo test` (the kernel's `enable_uring` switch must be
        // on; scripts/test.sh runs the POSIX and lifecycle suites so).
        if std::env::var_os("TIDEFS_TEST_FUSE_URING").is_some_and(|v| v == "1") {
            command.arg("-o").arg("fuse_uring");
        }
        let out = output(command.arg(&self.image).arg(&self.mnt));
        assert!(
            out.status.success(),
            "mount failed ({}): {}",
            out.status,
            stderr(&out)
        );
        self.mounted = true;
        out
    }

    /// `tidefs umount`; returns its output.
    pub fn umount(&mut self) -> Output {
        let out = output(tidefs().arg("umount").arg(&self.mnt));
        if out.status.success() {
            self.mounted = false;
        }
        out
    }

    /// `tidefs umount`, which must succeed. A busy mount is tried again for up to 2 s: tests
    /// run in threads of one process, and a child another test forks holds a copy of every
    /// descriptor open at that moment until it executes its program (the descriptors are
    /// close-on-exec), so a file this test has just closed can keep the mount busy a moment
    /// longer on a loaded machine.
    pub fn umount_ok(&mut self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            let out = self.umount();
            if out.status.success() {
                return;
            }
            let busy = stderr(&out).contains("busy");
            assert!(
                busy && std::time::Instant::now() < deadline,
                "umount failed: {}",
                stderr(&out)
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// A path inside the mount.
    pub fn path(&self, relative: &str) -> PathBuf {
        self.mnt.join(relative)
    }

    /// The daemon's `tidefs status` reply.
    pub fn status(&self) -> serde_json::Value {
        let out = output(tidefs().arg("status").arg(&self.mnt));
        assert!(out.status.success(), "status failed: {}", stderr(&out));
        serde_json::from_str(&stdout(&out)).expect("OK to unwrap: status is JSON")
    }

    /// The daemon's counters, from `tidefs stats --json`.
    pub fn stats(&self) -> serde_json::Value {
        let out = output(tidefs().args(["stats", "--json"]).arg(&self.mnt));
        assert!(out.status.success(), "stats failed: {}", stderr(&out));
        serde_json::from_str(&stdout(&out)).expect("OK to unwrap: stats is JSON")
    }

    /// The daemon's pid, from `tidefs status`.
    pub fn daemon_pid(&self) -> u32 {
        let value = self.status();
        let pid = value["pid"]
            .as_u64()
            .expect("OK to unwrap: status has a pid");
        u32::try_from(pid).expect("OK to unwrap: pids fit in u32")
    }

    /// Stops the daemon as a power cut would: SIGKILL (nothing more reaches the image), then
    /// the dead mount is removed. The image then needs recovery; see [`Mount::recover`].
    pub fn crash(&mut self) {
        let pid = self.daemon_pid();
        kill(pid, libc::SIGKILL).expect("OK to unwrap: kill");
        assert!(
            wait_gone(pid, Duration::from_secs(10)),
            "the daemon survived SIGKILL"
        );
        // `tidefs umount` removes the dead mount and says the daemon is gone (exit 1).
        let _ = self.umount();
        if is_mounted(&self.mnt) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
        assert!(!is_mounted(&self.mnt), "the dead mount is still there");
        self.mounted = false;
    }

    /// After [`Mount::crash`]: replays the journal with `tidefs fsck IMAGE` (exit 0, or 1 when
    /// it replayed), checks the result with `e2fsck -fn`, and opens the image read-only through
    /// the library, so what reads back is what is on disk, not what a live mount remembers.
    pub fn recover(&self) -> tidefs::fs::Fs {
        let out = output(tidefs().arg("fsck").arg(&self.image));
        assert!(
            matches!(out.status.code(), Some(0 | 1)),
            "tidefs fsck after the crash: {:?}\n{}{}",
            out.status.code(),
            stdout(&out),
            stderr(&out)
        );
        let (code, text) = e2fsck(&self.image);
        assert_eq!(code, 0, "e2fsck -fn after tidefs fsck:\n{text}");
        open_read_only(&self.image)
    }

    /// Waits until the kernel no longer lists the mount.
    pub fn wait_unmounted(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if !is_mounted(&self.mnt) {
                self.mounted = false;
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.mounted || is_mounted(&self.mnt) {
            let out = tidefs().arg("umount").arg(&self.mnt).output();
            if !matches!(out, Ok(ref o) if o.status.success()) && is_mounted(&self.mnt) {
                let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
                let _ = Command::new("fusermount3")
                    .arg("-uz")
                    .arg(&self.mnt)
                    .status();
            }
        }
    }
}

/// Record `r` of writer `t` in an append storm ([`append_storm`]): 125 bytes naming both.
pub fn storm_record(t: usize, r: usize) -> Vec<u8> {
    let mut rec = format!("{t}:{r:04}:").into_bytes();
    rec.resize(125, b'.');
    rec
}

/// `writers` threads each append `records` records ([`storm_record`]) to `log<t>` on the
/// mount, syncing after each one (`sync(file, r)`: fdatasync or fsync), then fsync the root
/// so that the new names are durable too.
pub fn append_storm(
    m: &Mount,
    writers: usize,
    records: usize,
    sync: fn(&std::fs::File, usize) -> io::Result<()>,
) {
    let handles: Vec<_> = (0..writers)
        .map(|t| {
            let path = m.path(&format!("log{t}"));
            std::thread::spawn(move || {
                let mut f = std::fs::File::create(&path).expect("OK to unwrap: create");
                for r in 0..records {
                    std::io::Write::write_all(&mut f, &storm_record(t, r))
                        .expect("OK to unwrap: write");
                    sync(&f, r).expect("OK to unwrap: sync");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("OK to unwrap: writer");
    }
    std::fs::File::open(&m.mnt)
        .and_then(|d| d.sync_all())
        .expect("OK to unwrap: fsync root");
}

/// After a crash: every log of [`append_storm`] holds exactly the records synced.
pub fn check_append_storm(fs: &tidefs::fs::Fs, writers: usize, records: usize) {
    for t in 0..writers {
        let want: Vec<u8> = (0..records).flat_map(|r| storm_record(t, r)).collect();
        let got = lib_read(fs, &format!("log{t}"))
            .unwrap_or_else(|| panic!("log{t} is missing after the crash"));
        assert!(
            got == want,
            "log{t}: {} bytes after the crash, {} synced",
            got.len(),
            want.len()
        );
    }
}

/// Opens an image read-only through the library (a journal that still needs replay is
/// replayed in memory only; the image is not written).
pub fn open_read_only(image: &Path) -> tidefs::fs::Fs {
    let options = tidefs::fs::MountOptions {
        read_only: true,
        ..tidefs::fs::MountOptions::default()
    };
    tidefs::fs::Fs::open(image, &options)
        .unwrap_or_else(|e| panic!("open {} read-only: {e}", image.display()))
}

/// The whole content of the file at `path` ('/'-separated, from the root) through the library;
/// `None` when a component is missing.
pub fn lib_read(fs: &tidefs::fs::Fs, path: &str) -> Option<Vec<u8>> {
    let mut ino = tidefs::fs::ROOT_INO;
    for name in path.split('/') {
        ino = fs.lookup(ino, name.as_bytes()).ok()?.ino;
    }
    let size = fs.getattr(ino).expect("OK to unwrap: getattr").size;
    let mut data = Vec::new();
    while (data.len() as u64) < size {
        let chunk = fs
            .read(ino, data.len() as u64, 1 << 20)
            .expect("OK to unwrap: read");
        assert!(!chunk.is_empty(), "{path}: read stopped short of its size");
        data.extend(chunk);
    }
    Some(data)
}

/// Whether the kernel lists a mount at `path`.
pub fn is_mounted(path: &Path) -> bool {
    let canonical = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let wanted = canonical.to_string_lossy().replace(' ', "\\040");
    info.lines()
        .any(|l| l.split(' ').nth(4) == Some(wanted.as_str()))
}

/// chmod that must work.
pub fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .expect("OK to unwrap: chmod");
}

/// The mode bits of a path (lstat).
pub fn mode_of(path: &Path) -> u32 {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::symlink_metadata(path)
        .expect("OK to unwrap: stat")
        .mode()
}

/// Runs `sh -c script` as `uid`/`gid` (no supplementary groups); returns its output.
pub fn run_as(uid: u32, gid: u32, script: &str) -> Output {
    use std::os::unix::process::CommandExt as _;
    Command::new("/bin/sh")
        .arg("-c")
        .arg(script)
        .uid(uid)
        .gid(gid)
        .output()
        .expect("OK to unwrap: sh runs")
}

/// The errno of a failed std call.
pub fn errno<T: std::fmt::Debug>(result: io::Result<T>) -> i32 {
    match result {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e
            .raw_os_error()
            .unwrap_or_else(|| panic!("not an OS error: {e}")),
    }
}

fn cstr(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).expect("OK to unwrap: no NUL in test paths")
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn check_size(rc: libc::ssize_t) -> io::Result<usize> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(usize::try_from(rc).unwrap_or(0))
    }
}

/// renameat2(AT_FDCWD, from, AT_FDCWD, to, flags).
pub fn rename2(from: &Path, to: &Path, flags: u32) -> io::Result<()> {
    let (from, to) = (cstr(from), cstr(to));
    // SAFETY: both strings are valid NUL-terminated paths that outlive the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            flags,
        )
    };
    check(rc)
}

/// mknod(path, mode, dev).
pub fn mknod(path: &Path, mode: u32, dev: libc::dev_t) -> io::Result<()> {
    let path = cstr(path);
    // SAFETY: `path` is a valid NUL-terminated string that outlives the call.
    check(unsafe { libc::mknod(path.as_ptr(), mode, dev) })
}

/// fallocate(fd, mode, offset, len).
pub fn fallocate(file: &std::fs::File, mode: i32, offset: i64, len: i64) -> io::Result<()> {
    use std::os::unix::io::AsRawFd as _;
    // SAFETY: the descriptor is owned by `file`, borrowed for the call.
    check(unsafe { libc::fallocate(file.as_raw_fd(), mode, offset, len) })
}

/// setxattr(path, name, value, flags).
pub fn setxattr(path: &Path, name: &str, value: &[u8], flags: i32) -> io::Result<()> {
    let (path, name) = (
        cstr(path),
        CString::new(name).expect("OK to unwrap: no NUL"),
    );
    // SAFETY: the strings are NUL-terminated and `value` is valid for `value.len()` bytes.
    check(unsafe {
        libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    })
}

/// getxattr(path, name, buf of `size` bytes); size 0 probes. Returns the bytes (or the probed
/// size as a vector of that many zeros when `size` is 0).
pub fn getxattr(path: &Path, name: &str, size: usize) -> io::Result<Vec<u8>> {
    let (path, name) = (
        cstr(path),
        CString::new(name).expect("OK to unwrap: no NUL"),
    );
    let mut buf = vec![0u8; size];
    // SAFETY: `buf` is valid for `size` bytes (a null pointer with size 0 is a probe).
    let rc = unsafe {
        libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            if size == 0 {
                std::ptr::null_mut()
            } else {
                buf.as_mut_ptr().cast()
            },
            size,
        )
    };
    let n = check_size(rc)?;
    if size == 0 {
        return Ok(vec![0; n]);
    }
    buf.truncate(n);
    Ok(buf)
}

/// listxattr(path) → names.
pub fn listxattr(path: &Path) -> io::Result<Vec<String>> {
    let path = cstr(path);
    // SAFETY: a null buffer with size 0 asks for the needed size.
    let needed = check_size(unsafe { libc::listxattr(path.as_ptr(), std::ptr::null_mut(), 0) })?;
    let mut buf = vec![0u8; needed];
    // SAFETY: `buf` is valid for `needed` bytes.
    let n = check_size(unsafe { libc::listxattr(path.as_ptr(), buf.as_mut_ptr().cast(), needed) })?;
    buf.truncate(n);
    Ok(buf
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect())
}

/// removexattr(path, name).
pub fn removexattr(path: &Path, name: &str) -> io::Result<()> {
    let (path, name) = (
        cstr(path),
        CString::new(name).expect("OK to unwrap: no NUL"),
    );
    // SAFETY: both strings are valid NUL-terminated strings.
    check(unsafe { libc::removexattr(path.as_ptr(), name.as_ptr()) })
}

/// utimensat(AT_FDCWD, path, [atime, mtime], 0) with raw timespecs (UTIME_NOW allowed).
pub fn utimens(path: &Path, atime: (i64, i64), mtime: (i64, i64)) -> io::Result<()> {
    let path = cstr(path);
    let times = [
        libc::timespec {
            tv_sec: atime.0,
            tv_nsec: atime.1,
        },
        libc::timespec {
            tv_sec: mtime.0,
            tv_nsec: mtime.1,
        },
    ];
    // SAFETY: `path` is NUL-terminated and `times` points to two timespecs.
    check(unsafe { libc::utimensat(libc::AT_FDCWD, path.as_ptr(), times.as_ptr(), 0) })
}

/// statvfs(path).
pub fn statvfs(path: &Path) -> io::Result<libc::statvfs> {
    let path = cstr(path);
    // SAFETY: an all-zero statvfs is a valid value for the out-parameter.
    let mut out: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and `out` is a valid out-pointer.
    check(unsafe { libc::statvfs(path.as_ptr(), &mut out) })?;
    Ok(out)
}

/// kill(pid, signal).
pub fn kill(pid: u32, signal: i32) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid).expect("OK to unwrap: pids fit");
    // SAFETY: kill has no memory-safety preconditions.
    check(unsafe { libc::kill(pid, signal) })
}

/// Whether a process exists.
pub fn alive(pid: u32) -> bool {
    kill(pid, 0).is_ok()
}

/// Waits until process `pid` is gone.
pub fn wait_gone(pid: u32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if !alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// makedev(major, minor).
pub fn makedev(major: u32, minor: u32) -> libc::dev_t {
    libc::makedev(major, minor)
}

/// linkat(AT_FDCWD, from, AT_FDCWD, to, AT_SYMLINK_FOLLOW): with `from` a `/proc/self/fd/N`
/// link, this names an O_TMPFILE file.
pub fn linkat_follow(from: &Path, to: &Path) -> io::Result<()> {
    let (from, to) = (cstr(from), cstr(to));
    // SAFETY: both strings are valid NUL-terminated paths that outlive the call.
    check(unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    })
}

/// The birth time of `path` from statx(2) with `AT_STATX_FORCE_SYNC` (asked of the file
/// system, not the kernel's attribute cache), as (seconds, nanoseconds); `None` when the file
/// system does not report one.
pub fn statx_btime(path: &Path) -> io::Result<Option<(i64, u32)>> {
    let path = cstr(path);
    // SAFETY: an all-zero statx is a valid value for the out-parameter.
    let mut out: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and `out` is a valid out-pointer.
    check(unsafe {
        libc::statx(
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::AT_STATX_FORCE_SYNC,
            libc::STATX_BASIC_STATS | libc::STATX_BTIME,
            &mut out,
        )
    })?;
    if out.stx_mask & libc::STATX_BTIME == 0 {
        return Ok(None);
    }
    Ok(Some((out.stx_btime.tv_sec, out.stx_btime.tv_nsec)))
}

/// `stat --cached=never --format=FORMAT path` (coreutils, which asks statx for the birth time);
/// its output without the newline.
pub fn coreutils_stat(path: &Path, format: &str) -> String {
    let out = Command::new("stat")
        .arg("--cached=never")
        .arg(format!("--format={format}"))
        .arg(path)
        .output()
        .expect("OK to unwrap: coreutils stat runs");
    assert!(out.status.success(), "stat failed: {}", stderr(&out));
    stdout(&out).trim_end().to_string()
}

/// Runs util-linux `fallocate` with `args` on `path`; returns whether it succeeded and its
/// stderr.
pub fn util_fallocate(args: &[&str], path: &Path) -> (bool, String) {
    let out = Command::new("fallocate")
        .args(args)
        .arg(path)
        .output()
        .expect("OK to unwrap: util-linux fallocate runs");
    (out.status.success(), stderr(&out))
}
