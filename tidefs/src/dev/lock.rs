//! One owner per image: the claim a process lays on an image file, block device or external
//! journal before it writes to it, and the search for whoever holds it when the claim fails.
//!
//! A writable open takes an exclusive `flock` on the file, a read-only open a shared one, so a
//! second tidefs mount, `tidefs mkfs` or a writing `tidefs fsck` of a served image fails at once
//! instead of writing over a live file system. A writable block device is also opened with
//! `O_EXCL`, which Linux refuses (EBUSY) while the device is mounted or claimed exclusively by
//! another opener (the kernel, `mke2fs`, `e2fsck`). An image the kernel has mounted — a block
//! device in `/proc/self/mountinfo`, or a file backing a loop device that is mounted — is
//! refused before it is opened for writing.
//!
//! Invariants:
//! - A claim lives as long as the open file description that holds it; it goes away with the
//!   last descriptor, also when the process is killed, so a crash never leaves a stale claim.
//! - Every refusal is an `io::Error` of kind `ResourceBusy` whose message starts with the path
//!   and names the holder where it can be found (pid and command, or the kernel mountpoint).
//! - File systems without `flock` support (ENOLCK, EOPNOTSUPP) are opened without a claim: the
//!   claim protects against other users, it is not needed to read or write.

use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

/// Extra attempts, 5 ms apart, before a held claim is reported busy.
const CLAIM_RETRIES: u32 = 20;

/// How a file is claimed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// Many readers; no writer.
    Shared,
    /// One writer, nobody else.
    Exclusive,
}

/// Opens `path` for reading, and for writing when `writable`, and claims it: exclusively when
/// writable, shared otherwise. A writable block device is opened with `O_EXCL`; a writable image
/// the kernel has mounted is refused.
pub fn open_claimed(path: &Path, writable: bool) -> io::Result<File> {
    let meta = std::fs::metadata(path)?;
    let block_device = meta.file_type().is_block_device();
    if writable {
        if let Some(mount) = kernel_mount(&meta) {
            return Err(busy(format!(
                "{}: mounted by the kernel on {mount}; unmount it first",
                path.display()
            )));
        }
    }
    let mut options = OpenOptions::new();
    options.read(true).write(writable);
    if writable && block_device {
        options.custom_flags(libc::O_EXCL);
    }
    let file = options
        .open(path)
        .map_err(|e| exclusive_open_error(e, path))?;
    let claim = if writable {
        Claim::Exclusive
    } else {
        Claim::Shared
    };
    claim_file(&file, path, claim)?;
    Ok(file)
}

/// Claims an open `file` (named `path` in errors). The claim is held until the file's last
/// descriptor closes.
pub fn claim_file(file: &File, path: &Path, claim: Claim) -> io::Result<()> {
    // A claim just released may still be held for an instant by a child that the releasing
    // process forked before its exec closed the descriptor (O_CLOEXEC): a few short retries
    // keep a close followed by a reopen, in a process that starts programs, from failing.
    let mut result = try_flock(file, claim);
    for _ in 0..CLAIM_RETRIES {
        if !matches!(&result, Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK)) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
        result = try_flock(file, claim);
    }
    match result {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {
            let holder = file
                .metadata()
                .ok()
                .and_then(|meta| lock_holder(&meta))
                .map(describe_process)
                .unwrap_or_else(|| "another process".to_string());
            Err(busy(format!("{}: in use by {holder}", path.display())))
        }
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOLCK | libc::EOPNOTSUPP | libc::ENOSYS)
            ) =>
        {
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// `flock(fd, LOCK_EX | LOCK_NB)` (or `LOCK_SH`). `std::fs::File::try_lock` does the same
/// but needs Rust 1.89, above the workspace's rust-version (1.85).
#[allow(unsafe_code)]
fn try_flock(file: &File, claim: Claim) -> io::Result<()> {
    use std::os::unix::io::AsRawFd as _;
    let operation = match claim {
        Claim::Exclusive => libc::LOCK_EX,
        Claim::Shared => libc::LOCK_SH,
    } | libc::LOCK_NB;
    // SAFETY: flock only reads its two integer arguments; the descriptor belongs to `file`,
    // which is borrowed for the duration of the call, so it is open and not reused meanwhile.
    if unsafe { libc::flock(file.as_raw_fd(), operation) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Claims `path` exclusively without keeping it open for I/O: for callers that let another
/// program (`mke2fs`, `e2fsck`) write to the image while they hold it. A block device is not
/// opened with `O_EXCL` here (that program takes its own), but an image the kernel has mounted
/// is refused.
pub fn claim_path(path: &Path) -> io::Result<File> {
    let meta = std::fs::metadata(path)?;
    if let Some(mount) = kernel_mount(&meta) {
        return Err(busy(format!(
            "{}: mounted by the kernel on {mount}; unmount it first",
            path.display()
        )));
    }
    if meta.file_type().is_block_device() {
        // Probe the kernel's exclusive claim: a mounted or exclusively opened device is named
        // now rather than by the tool's own, vaguer error.
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_EXCL)
            .open(path)
            .map_err(|e| exclusive_open_error(e, path))?;
    }
    let file = File::open(path)?;
    claim_file(&file, path, Claim::Exclusive)?;
    Ok(file)
}

/// An `O_EXCL` open of a block device that the kernel refused with EBUSY, said in words.
fn exclusive_open_error(e: io::Error, path: &Path) -> io::Error {
    if e.raw_os_error() == Some(libc::EBUSY) {
        busy(format!(
            "{}: in use (mounted, or opened exclusively by another program)",
            path.display()
        ))
    } else {
        e
    }
}

fn busy(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::ResourceBusy, message)
}

/// The pid holding a `flock` on the file `meta` describes, from `/proc/locks`. A line reads
/// `1: FLOCK  ADVISORY  WRITE 1234 08:01:131 0 EOF` (device numbers in hex, inode in decimal);
/// lines of blocked waiters (`1: -> FLOCK ...`) are skipped.
fn lock_holder(meta: &Metadata) -> Option<u32> {
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    let wanted = (
        u64::from(libc::major(meta.dev())),
        u64::from(libc::minor(meta.dev())),
        meta.ino(),
    );
    locks.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.get(1) != Some(&"FLOCK") {
            return None;
        }
        let pid: u32 = fields.get(4)?.parse().ok()?;
        let mut id = fields.get(5)?.split(':');
        let major = u64::from_str_radix(id.next()?, 16).ok()?;
        let minor = u64::from_str_radix(id.next()?, 16).ok()?;
        let ino: u64 = id.next()?.parse().ok()?;
        ((major, minor, ino) == wanted).then_some(pid)
    })
}

/// `pid 1234 (tidefs)`: the pid and, where readable, the command name.
fn describe_process(pid: u32) -> String {
    match std::fs::read_to_string(format!("/proc/{pid}/comm")) {
        Ok(comm) if !comm.trim().is_empty() => format!("pid {pid} ({})", comm.trim()),
        _ => format!("pid {pid}"),
    }
}

/// Where the kernel has mounted the image `meta` describes: the mountpoint (and loop device) of a
/// mount of this block device, or of a loop device this file backs. `None` when not mounted.
fn kernel_mount(meta: &Metadata) -> Option<String> {
    let mounts = kernel_mounts();
    if meta.file_type().is_block_device() {
        let device = (libc::major(meta.rdev()), libc::minor(meta.rdev()));
        return mounts
            .iter()
            .find(|m| m.device == device)
            .map(|m| m.mountpoint.display().to_string());
    }
    if !meta.is_file() {
        return None;
    }
    let entries = std::fs::read_dir("/sys/block").ok()?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with("loop") {
            continue;
        }
        let Ok(backing) = std::fs::read_to_string(entry.path().join("loop/backing_file")) else {
            continue;
        };
        let backing = backing.trim_end_matches('\n');
        let backing = Path::new(backing.strip_suffix(" (deleted)").unwrap_or(backing));
        let same_file = std::fs::metadata(backing)
            .map(|b| b.dev() == meta.dev() && b.ino() == meta.ino())
            .unwrap_or(false);
        if !same_file {
            continue;
        }
        let Some(device) = std::fs::read_to_string(entry.path().join("dev"))
            .ok()
            .and_then(|text| parse_device(text.trim()))
        else {
            continue;
        };
        if let Some(m) = mounts.iter().find(|m| m.device == device) {
            return Some(format!(
                "{} (through /dev/{})",
                m.mountpoint.display(),
                name.to_string_lossy()
            ));
        }
    }
    None
}

/// One line of `/proc/self/mountinfo`: the device (major, minor) and the mountpoint.
struct KernelMount {
    device: (u32, u32),
    mountpoint: PathBuf,
}

/// The mounts of this process's mount namespace. Field 3 of a mountinfo line is `major:minor`,
/// field 5 the mountpoint with octal escapes (`\040` for a space).
fn kernel_mounts() -> Vec<KernelMount> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let device = parse_device(fields.nth(2)?)?;
            let mountpoint = unescape_mountinfo(fields.nth(1)?);
            Some(KernelMount { device, mountpoint })
        })
        .collect()
}

/// `"7:3"` → `(7, 3)`.
fn parse_device(text: &str) -> Option<(u32, u32)> {
    let (major, minor) = text.split_once(':')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
pub fn unescape_mountinfo(field: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt as _;
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let digits = std::str::from_utf8(&bytes[i + 1..i + 4]).unwrap_or("");
            if let Ok(value) = u8::from_str_radix(digits, 8) {
                out.push(value);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a second exclusive claim of a claimed image fails with ResourceBusy naming this
    /// process; a shared claim coexists with another shared one but not with an exclusive one.
    /// Method: claims on temporary files. Each phase uses a fresh file: the release of a claim
    /// is not checked here, since a child that another test forks in this process may hold a
    /// copy of the descriptor until it execs (the CLI tests check release through remounts).
    #[test]
    fn claims_exclude_each_other_and_name_the_holder() {
        let fresh = || {
            let tmp = tempfile::NamedTempFile::new().expect("OK to unwrap: test setup");
            tmp.as_file()
                .set_len(4096)
                .expect("OK to unwrap: test setup");
            tmp
        };
        let tmp = fresh();
        let _writer = open_claimed(tmp.path(), true).expect("OK to unwrap: first writer");
        let err = open_claimed(tmp.path(), true).expect_err("a second writer must be refused");
        assert_eq!(err.kind(), io::ErrorKind::ResourceBusy, "{err}");
        let pid = format!("pid {}", std::process::id());
        assert!(err.to_string().contains(&pid), "{err}");
        let err = open_claimed(tmp.path(), false).expect_err("a reader beside a writer");
        assert_eq!(err.kind(), io::ErrorKind::ResourceBusy, "{err}");
        let err = claim_path(tmp.path()).expect_err("mkfs beside a writer");
        assert_eq!(err.kind(), io::ErrorKind::ResourceBusy, "{err}");

        let tmp = fresh();
        let _reader_a = open_claimed(tmp.path(), false).expect("OK to unwrap: reader");
        let _reader_b = open_claimed(tmp.path(), false).expect("OK to unwrap: second reader");
        let err = open_claimed(tmp.path(), true).expect_err("a writer beside readers");
        assert_eq!(err.kind(), io::ErrorKind::ResourceBusy, "{err}");
        let err = claim_path(tmp.path()).expect_err("mkfs beside readers");
        assert_eq!(err.kind(), io::ErrorKind::ResourceBusy, "{err}");
    }

    #[test]
    fn device_numbers_and_escapes_parse() {
        assert_eq!(parse_device("7:3"), Some((7, 3)));
        assert_eq!(parse_device("259:12"), Some((259, 12)));
        assert_eq!(parse_device("7"), None);
        assert_eq!(
            unescape_mountinfo("/mnt/with\\040space"),
            PathBuf::from("/mnt/with space")
        );
    }
}
