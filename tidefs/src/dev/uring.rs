//! Batches of device writes through io_uring: every run of a batch is handed to the kernel in
//! one system call and the caller waits once for all of them, where the writer threads of
//! `dev/file.rs` cost a wake-up per run and another for the caller. A commit's file data and
//! log body, and a checkpoint's scattered blocks, reach the device together.
//!
//! A device keeps a few rings; a batch takes one that is free, or returns its runs to the
//! caller (who writes them with the threads) when all are busy or the host refuses io_uring
//! (an old kernel, `kernel.io_uring_disabled`, a seccomp filter).
//!
//! This module is the only code that talks to io_uring, and its `unsafe` is one promise:
//! pushing an entry promises the kernel that the buffer it names stays valid
//! until the entry completes, which [`UringWriter::write_runs`] keeps by never returning (and
//! never dropping a buffer) before every entry it pushed has completed.
#![allow(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd as _;

use io_uring::{opcode, types, IoUring};
use parking_lot::Mutex;

use super::aligned::AlignedBuf;

/// Entries per ring: the most runs in flight from one batch at a time.
const RING_ENTRIES: u32 = 64;

/// Rings per device: batches written at the same time (a commit beside a checkpoint).
const RINGS: usize = 2;

/// A device's rings; `None` in a slot whose ring broke (it is never used again).
pub(crate) struct UringWriter {
    rings: Vec<Mutex<Option<IoUring>>>,
}

impl UringWriter {
    /// Rings for one device, or the reason the host refuses io_uring.
    pub(crate) fn new() -> Result<UringWriter, io::Error> {
        let mut rings = Vec::with_capacity(RINGS);
        for _ in 0..RINGS {
            rings.push(Mutex::new(Some(IoUring::new(RING_ENTRIES)?)));
        }
        Ok(UringWriter { rings })
    }

    /// Writes every run (offset, bytes) to `file`, all in flight together, and returns once
    /// each has landed or failed: the first error, if any. Hands the runs back untouched
    /// when no ring is free (the caller writes them another way).
    pub(crate) fn write_runs(
        &self,
        file: &File,
        runs: Vec<(u64, AlignedBuf)>,
    ) -> Result<io::Result<()>, Vec<(u64, AlignedBuf)>> {
        // A ring that is free and not retired.
        let free = self
            .rings
            .iter()
            .find_map(|r| r.try_lock().filter(|ring| ring.is_some()));
        let Some(mut slot) = free else {
            return Err(runs);
        };
        let Some(ring) = slot.as_mut() else {
            return Err(runs);
        };
        let outcome = write_all(ring, file, &runs);
        match outcome {
            Ok(result) => Ok(result),
            Err(broken) => {
                // Entries may still be in flight with no way to learn when they end: the
                // buffers must outlive them, so they are leaked, and the ring is retired.
                log::error!("io_uring failed during a batch of writes ({broken}); retiring it");
                *slot = None;
                std::mem::forget(runs);
                Ok(Err(broken))
            }
        }
    }
}

/// Pushes and reaps until every run is written. `Ok(result)`: nothing is in flight any more,
/// and `result` is the first write error. `Err`: the ring itself failed while entries may be
/// in flight.
fn write_all(
    ring: &mut IoUring,
    file: &File,
    runs: &[(u64, AlignedBuf)],
) -> io::Result<io::Result<()>> {
    let fd = types::Fd(file.as_raw_fd());
    // What is left of each run: a short write is continued from where it stopped.
    let mut done = vec![0usize; runs.len()];
    let mut first_error: io::Result<()> = Ok(());
    let mut queued: Vec<usize> = (0..runs.len()).rev().collect();
    let mut in_flight = 0usize;
    while !queued.is_empty() || in_flight > 0 {
        while let Some(&i) = queued.last() {
            let (offset, buf) = &runs[i];
            let rest = &buf.as_slice()[done[i]..];
            let len = u32::try_from(rest.len()).unwrap_or(u32::MAX);
            let entry = opcode::Write::new(fd, rest.as_ptr(), len)
                .offset(offset + done[i] as u64)
                .build()
                .user_data(i as u64);
            // SAFETY: the entry names `len` bytes of `runs[i]`'s buffer, which the caller
            // keeps alive and unmoved until this function has reaped every entry it pushed
            // (or, if the ring fails, leaks); `fd` stays open as long as `file` is borrowed.
            let pushed = unsafe { ring.submission().push(&entry) };
            if pushed.is_err() {
                break;
            }
            queued.pop();
            in_flight += 1;
        }
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => return Err(e),
        }
        for cqe in ring.completion() {
            in_flight -= 1;
            let i = usize::try_from(cqe.user_data()).unwrap_or(usize::MAX);
            let Some((_, buf)) = runs.get(i) else {
                return Err(io::Error::other(
                    "io_uring completed an entry it was not given",
                ));
            };
            let res = cqe.result();
            let failed = match usize::try_from(res) {
                Err(_) if -res == libc::EINTR || -res == libc::EAGAIN => {
                    queued.push(i);
                    None
                }
                Err(_) => Some(io::Error::from_raw_os_error(-res)),
                Ok(0) => Some(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "the device accepted no bytes",
                )),
                Ok(written) => {
                    done[i] += written;
                    if done[i] < buf.as_slice().len() {
                        queued.push(i);
                    }
                    None
                }
            };
            if let (Some(e), Ok(())) = (failed, &first_error) {
                first_error = Err(e);
            }
        }
    }
    Ok(first_error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support;

    /// Rings for a test, or `None` after the skip rule (io_uring refused by this host).
    fn rings() -> Option<UringWriter> {
        match UringWriter::new() {
            Ok(u) => Some(u),
            Err(e) => {
                test_support::skip(
                    &test_support::current_test(),
                    &format!("io_uring refused: {e}"),
                );
                None
            }
        }
    }

    fn run(offset: u64, len: usize, seed: u8) -> (u64, AlignedBuf) {
        let mut buf = AlignedBuf::zeroed(len);
        for (i, b) in buf.as_mut_slice().iter_mut().enumerate() {
            *b = seed.wrapping_add(i as u8);
        }
        (offset, buf)
    }

    /// Goal: a batch of more runs than a ring has entries lands every byte where it belongs.
    /// Method: 200 scattered runs of one to three blocks, in a shuffled order, through one
    /// ring; the file is compared with a model.
    #[test]
    fn a_batch_larger_than_the_ring_lands_every_run() {
        let Some(rings) = rings() else {
            return;
        };
        let tmp = tempfile::NamedTempFile::new().expect("OK to unwrap: test file");
        let len = 1000 * 4096;
        tmp.as_file().set_len(len).expect("OK to unwrap: size");
        let mut model = vec![0u8; len as usize];
        let mut runs = Vec::new();
        for k in 0..200u64 {
            let block = (k * 389) % 330 * 3;
            let blocks = 1 + (k % 3) as usize;
            let r = run(block * 4096, blocks * 4096, k as u8);
            let at = r.0 as usize;
            model[at..at + r.1.as_slice().len()].copy_from_slice(r.1.as_slice());
            runs.push(r);
        }
        let result = rings
            .write_runs(tmp.as_file(), runs)
            .unwrap_or_else(|_| panic!("a free ring refused the batch"));
        result.expect("OK to unwrap: the writes succeed");
        assert_eq!(std::fs::read(tmp.path()).expect("read back"), model);
    }

    /// Goal: a write the kernel refuses is the batch's error, the other runs are still
    /// written, and the ring stays usable. Method: a batch to a file opened read-only
    /// (EBADF for every run), then a batch to a writable one.
    #[test]
    fn a_refused_write_is_the_batch_error_and_the_ring_lives_on() {
        let Some(rings) = rings() else {
            return;
        };
        let tmp = tempfile::NamedTempFile::new().expect("OK to unwrap: test file");
        tmp.as_file().set_len(65536).expect("OK to unwrap: size");
        let read_only = File::open(tmp.path()).expect("OK to unwrap: open");
        let runs = vec![run(0, 4096, 1), run(8192, 4096, 2)];
        let result = rings
            .write_runs(&read_only, runs)
            .unwrap_or_else(|_| panic!("a free ring refused the batch"));
        let err = result.expect_err("writes to a read-only descriptor fail");
        assert_eq!(err.raw_os_error(), Some(libc::EBADF), "{err}");
        for _ in 0..RINGS {
            let runs = vec![run(0, 4096, 3), run(8192, 4096, 4)];
            let result = rings
                .write_runs(tmp.as_file(), runs)
                .unwrap_or_else(|_| panic!("a free ring refused the batch"));
            result.expect("OK to unwrap: the writes succeed");
        }
        let back = std::fs::read(tmp.path()).expect("read back");
        assert_eq!(back[8192], 4);
    }

    /// Goal: a retired ring is passed over for one that still works. Method: retire the
    /// first ring, then write a batch.
    #[test]
    fn a_retired_ring_is_passed_over() {
        let Some(rings) = rings() else {
            return;
        };
        *rings.rings[0].lock() = None;
        let tmp = tempfile::NamedTempFile::new().expect("OK to unwrap: test file");
        tmp.as_file().set_len(65536).expect("OK to unwrap: size");
        let result = rings
            .write_runs(tmp.as_file(), vec![run(0, 4096, 1), run(8192, 4096, 2)])
            .unwrap_or_else(|_| panic!("the working ring refused the batch"));
        result.expect("OK to unwrap: the writes succeed");
        assert_eq!(std::fs::read(tmp.path()).expect("read back")[8192], 2);
    }

    /// Goal: when every ring is busy, a batch is handed back untouched for the threads to
    /// write. Method: hold every ring's lock, then ask.
    #[test]
    fn a_batch_comes_back_when_every_ring_is_busy() {
        let Some(rings) = rings() else {
            return;
        };
        let held: Vec<_> = rings.rings.iter().map(|r| r.lock()).collect();
        let tmp = tempfile::NamedTempFile::new().expect("OK to unwrap: test file");
        let back = rings
            .write_runs(tmp.as_file(), vec![run(0, 4096, 9)])
            .expect_err("no ring is free");
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].1.as_slice()[0], 9);
        drop(held);
    }
}
