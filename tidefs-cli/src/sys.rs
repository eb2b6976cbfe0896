//! The few libc calls the daemon needs that std does not offer. The only module with `unsafe`;
//! each call is an FFI boundary with its justification beside it.

#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::io::AsRawFd as _;
use std::path::Path;

/// The signals that ask the daemon to unmount cleanly.
pub const STOP_SIGNALS: [i32; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

fn signal_set(signals: &[i32]) -> io::Result<libc::sigset_t> {
    // SAFETY: sigset_t is a plain bit set; an all-zero value is a valid (if unspecified) state
    // that sigemptyset then initialises as POSIX requires.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, exclusively borrowed sigset_t.
    if unsafe { libc::sigemptyset(&mut set) } != 0 {
        return Err(io::Error::last_os_error());
    }
    for &signal in signals {
        // SAFETY: `set` is valid and initialised; an invalid signal number yields EINVAL.
        if unsafe { libc::sigaddset(&mut set, signal) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(set)
}

/// Blocks `signals` in the calling thread and in every thread it creates afterwards, so that
/// only [`wait_signal`] receives them. Call it before any thread exists.
pub fn block_signals(signals: &[i32]) -> io::Result<()> {
    let set = signal_set(signals)?;
    // SAFETY: `set` is an initialised sigset_t; a null old-set pointer is allowed.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Waits until one of `signals` (blocked by [`block_signals`]) arrives; returns its number.
pub fn wait_signal(signals: &[i32]) -> io::Result<i32> {
    let set = signal_set(signals)?;
    let mut signal: libc::c_int = 0;
    // SAFETY: `set` is initialised and `signal` is a valid out-pointer for the call's duration.
    let rc = unsafe { libc::sigwait(&set, &mut signal) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(signal)
}

/// Starts a new session, detaching the daemon from the terminal of whoever mounted.
pub fn setsid() -> io::Result<()> {
    // SAFETY: setsid takes no arguments and only changes the calling process's session.
    if unsafe { libc::setsid() } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Points standard output at `/dev/null` (after the daemon reported to its parent, whose pipe
/// it must not keep open).
pub fn stdout_to_null() -> io::Result<()> {
    let null = std::fs::OpenOptions::new().write(true).open("/dev/null")?;
    // SAFETY: both descriptors are open: `null` for the duration of the call, 1 by convention;
    // dup2 replaces fd 1 atomically and `null` is closed when dropped.
    if unsafe { libc::dup2(null.as_raw_fd(), libc::STDOUT_FILENO) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Lets a closed standard output end the process quietly, as it ends `cat` (SIGPIPE's
/// default action), instead of a panic in `println!` (Rust ignores SIGPIPE). Only for
/// commands that just print, once they are done with any socket: the daemon writes to
/// sockets, and a benchmark or fsck must not stop half-way.
pub fn default_sigpipe() {
    // SAFETY: signal() with a valid signal number and SIG_DFL has no preconditions; the
    // process has no handler of its own for SIGPIPE to lose.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

/// The effective user id.
pub fn geteuid() -> u32 {
    // SAFETY: geteuid cannot fail and has no preconditions.
    unsafe { libc::geteuid() }
}

/// Unmounts `path` (umount2); `lazy` detaches it even while busy (`umount -l`). Needs root.
pub fn umount(path: &Path, lazy: bool) -> io::Result<()> {
    let path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: `path` is a valid NUL-terminated string that outlives the call.
    if unsafe { libc::umount2(path.as_ptr(), flags) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `stat(2)` of `path`, following symlinks: the basic attributes only, as `ls -l` and C
/// programs ask for them. (Rust's `std::fs::metadata` calls `statx` with the birth time as
/// well, which a FUSE kernel module does not keep from lookups: it asks the daemon once per
/// inode, so a benchmark that means "stat" must not measure that.) Returns the size.
pub fn stat_size(path: &Path) -> io::Result<u64> {
    let path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: an all-zero `struct stat` is a valid value of a plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a valid NUL-terminated string and `st` a writable `struct stat`,
    // both outliving the call.
    if unsafe { libc::stat(path.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(u64::try_from(st.st_size).unwrap_or(0))
}

/// Position of the next data at or after `offset` in `file` (SEEK_DATA), or `None` past the
/// last data.
pub fn seek_data(file: &std::fs::File, offset: u64) -> io::Result<Option<u64>> {
    seek(file, offset, libc::SEEK_DATA)
}

/// Position of the next hole at or after `offset` in `file` (SEEK_HOLE).
pub fn seek_hole(file: &std::fs::File, offset: u64) -> io::Result<Option<u64>> {
    seek(file, offset, libc::SEEK_HOLE)
}

fn seek(file: &std::fs::File, offset: u64, whence: i32) -> io::Result<Option<u64>> {
    let offset =
        libc::off_t::try_from(offset).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: the descriptor belongs to `file`, which is borrowed for the call. The file
    // offset it moves is not used by anyone else: callers read with positioned reads.
    let rc = unsafe { libc::lseek(file.as_raw_fd(), offset, whence) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENXIO) {
            return Ok(None);
        }
        return Err(e);
    }
    Ok(u64::try_from(rc).ok())
}
