//! tidefs patch: FUSE over io_uring (Linux 6.14 and later, `CONFIG_FUSE_IO_URING`, with the
//! `fuse` module's `enable_uring` parameter set).
//!
//! The kernel keeps one request queue per possible CPU and puts each request on the queue of
//! the CPU its caller runs on. This module serves each queue from one thread pinned to that
//! CPU, through its own io_uring: the thread registers a number of ring entries (a header
//! buffer and a payload buffer each) with `FUSE_IO_URING_CMD_REGISTER`, the kernel completes
//! an entry's command when it has put a request in the entry's buffers, and the thread hands
//! the reply back and asks for the next request in one `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`.
//! A request and its reply so cost one wake-up of a thread on the caller's CPU, where
//! /dev/fuse wakes whichever reader thread sleeps, often on the other CPU.
//!
//! FORGET and INTERRUPT still come through /dev/fuse (the kernel sends them there), and so do
//! notifications, so the /dev/fuse threads keep running beside the rings.
//!
//! Layout of an entry's header buffer (`struct fuse_uring_req_header`, 288 bytes):
//!
//! | offset | size | request                         | reply                  |
//! |--------|------|---------------------------------|------------------------|
//! | 0      | 128  | `fuse_in_header` (40 bytes)     | `fuse_out_header` (16) |
//! | 128    | 128  | the operation's own header      | unused                 |
//! | 256    | 32   | `fuse_uring_ent_in_out`         | same                   |
//!
//! `fuse_uring_ent_in_out`: `flags` u64 at 0, `commit_id` u64 at 8 (the request's unique id),
//! `payload_sz` u32 at 16 (bytes used in the payload buffer), 12 bytes reserved. The rest of
//! the request (names, written data) is in the payload buffer; a reply's body (everything
//! after its `fuse_out_header`) goes there too.
//!
//! The commands' 80-byte area of the 128-byte SQE (`struct fuse_uring_cmd_req`): `flags` u64
//! at 0, `commit_id` u64 at 8, `qid` u16 at 16, 6 bytes padding. REGISTER points `addr` at
//! two iovecs (header, payload) and sets `len` to 2.
//!
//! Replies may come from any thread (tidefs answers fsync from the thread that made the commit
//! durable). Only the queue's own thread talks to its ring (the ring is single-issuer and
//! its task work runs on that thread), so a reply is copied into the queue's outbox and the
//! queue's thread, woken through an eventfd when the reply came from elsewhere, writes it into
//! the entry's buffers and commits it after the request it is serving returns.

use std::io;
use std::io::IoSlice;
use std::os::fd::AsRawFd;
use std::os::fd::FromRawFd;
use std::os::fd::OwnedFd;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::mpsc;
use std::thread::ThreadId;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::error;
use log::warn;
use parking_lot::Mutex;

use crate::Filesystem;
use crate::channel::ChannelSender;
use crate::ll;
use crate::ll::Operation;
use crate::ll::ResponseErrno;
use crate::reply::Reply;
use crate::reply::ReplyEmpty;
use crate::reply::ReplyRaw;
use crate::reply::ReplySender;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

/// `FUSE_IO_URING_CMD_REGISTER`.
const CMD_REGISTER: u32 = 1;
/// `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`.
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// Size of `struct fuse_uring_req_header`.
const HEADER_SIZE: usize = 288;
/// Offset of the operation's header in the header buffer.
const OP_IN: usize = 128;
/// Offset of `struct fuse_uring_ent_in_out` in the header buffer.
const ENT_IN_OUT: usize = 256;
/// Largest operation header the kernel puts at [`OP_IN`].
const OP_IN_SIZE: usize = 128;
/// `sizeof(struct fuse_in_header)`.
const IN_HEADER_SIZE: usize = 40;
/// `sizeof(struct fuse_out_header)`.
const OUT_HEADER_SIZE: usize = 16;
/// Room kept in front of each payload buffer: a request's `fuse_in_header` and operation
/// header are copied there, so the whole request lies in one slice, as /dev/fuse gives it,
/// without copying the payload.
const FRONT: usize = 256;
/// `user_data` of the eventfd read that wakes a queue's thread for replies from elsewhere.
const WAKE: u64 = u64::MAX;
/// Set in the `user_data` of a REGISTER command (the entry's index is in the low bits).
const REGISTERING: u64 = 1 << 32;

/// How many queues the kernel makes: one per possible CPU (`num_possible_cpus()`).
pub(crate) fn queue_count() -> io::Result<usize> {
    let list = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    let mut count = 0;
    for range in list.trim().split(',').filter(|r| !r.is_empty()) {
        let bad = || io::Error::new(io::ErrorKind::InvalidData, format!("cpu list {list:?}"));
        let (first, last) = range.split_once('-').unwrap_or((range, range));
        let first: usize = first.parse().map_err(|_| bad())?;
        let last: usize = last.parse().map_err(|_| bad())?;
        count += last.checked_sub(first).ok_or_else(bad)? + 1;
    }
    Ok(count.max(1))
}

/// What ends the FUSE connection when a queue fails. A queue that stops serving would leave
/// every later request of its CPU waiting forever; aborting the connection fails them all at
/// once (ECONNABORTED), ends the /dev/fuse threads and the other queues, and so the session,
/// after which the file system is closed as at an unmount. In order: the connection's abort
/// file (`/sys/fs/fuse/connections/N/abort`, when fusectl is mounted), a forced unmount of
/// the mount point (`umount2(MNT_FORCE)`, which aborts a FUSE connection first; root only);
/// if neither works, the process exits (status 70), which ends the connection too.
#[derive(Debug, Clone, Default)]
pub(crate) struct ConnectionAbort {
    abort_file: Option<std::path::PathBuf>,
    mountpoint: Option<std::path::PathBuf>,
}

impl ConnectionAbort {
    pub(crate) fn new(
        abort_file: Option<std::path::PathBuf>,
        mountpoint: std::path::PathBuf,
    ) -> ConnectionAbort {
        ConnectionAbort {
            abort_file,
            mountpoint: Some(mountpoint),
        }
    }

    /// Abort the connection, saying `why` in the log.
    pub(crate) fn abort(&self, why: &str) {
        error!("FUSE io_uring: {why}; aborting the connection");
        if let Some(path) = &self.abort_file {
            match std::fs::write(path, "1") {
                Ok(()) => return,
                Err(e) => warn!("FUSE io_uring: abort through {}: {e}", path.display()),
            }
        }
        if let Some(mountpoint) = &self.mountpoint {
            match nix::mount::umount2(mountpoint.as_path(), nix::mount::MntFlags::MNT_FORCE) {
                // EBUSY: the connection was aborted before the unmount found the mount busy.
                Ok(()) | Err(nix::errno::Errno::EBUSY) => return,
                Err(e) => warn!("FUSE io_uring: forced unmount of {}: {e}", mountpoint.display()),
            }
        }
        error!("FUSE io_uring: the connection cannot be aborted; exiting");
        std::process::exit(70);
    }
}

/// The reply path of one request that came in a ring entry.
#[derive(Clone, Debug)]
pub(crate) struct UringReplyTo {
    queue: Arc<QueueShared>,
    entry: u16,
}

impl UringReplyTo {
    /// Queue the reply (`fuse_out_header` and body) for the entry's commit.
    pub(crate) fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let mut reply = Vec::with_capacity(data.iter().map(|d| d.len()).sum());
        for slice in data {
            reply.extend_from_slice(slice);
        }
        self.queue.outbox.lock().push((self.entry, reply));
        if self.queue.thread.get() != Some(&std::thread::current().id()) {
            self.queue.wake()?;
        }
        Ok(())
    }

    /// /dev/fuse, for what does not travel through the ring (backing files).
    pub(crate) fn channel(&self) -> &ChannelSender {
        &self.queue.channel
    }
}

/// What a queue's thread shares with the threads that reply.
#[derive(Debug)]
struct QueueShared {
    qid: u16,
    /// Replies waiting for their commit: entry index, `fuse_out_header` + body.
    outbox: Mutex<Vec<(u16, Vec<u8>)>>,
    /// Written to wake the queue's thread.
    wake: OwnedFd,
    /// The queue's thread (a reply from it needs no wake-up).
    thread: OnceLock<ThreadId>,
    channel: ChannelSender,
}

impl QueueShared {
    fn wake(&self) -> io::Result<()> {
        let one = 1u64.to_ne_bytes();
        nix::unistd::write(&self.wake, &one)?;
        Ok(())
    }
}

/// Aborts the connection when dropped before the queue ended as it should (also when a panic
/// unwinds through the queue's thread).
struct AbortUnlessDone {
    abort: ConnectionAbort,
    why: String,
    done: bool,
}

impl Drop for AbortUnlessDone {
    fn drop(&mut self) {
        if !self.done {
            self.abort.abort(&self.why);
        }
    }
}

/// The same error again (one for the session's set-up, one for the queue's thread).
fn copy_error(e: &io::Error) -> io::Error {
    io::Error::new(e.kind(), e.to_string())
}

/// Pin the calling thread to `cpu`.
fn pin_to_cpu(cpu: usize) -> nix::Result<()> {
    let mut cpus = nix::sched::CpuSet::new();
    cpus.set(cpu)?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &cpus)
}

/// One ring entry's buffers. They are written by the kernel while the entry waits for a
/// request, so they are only ever touched through raw pointers, by the queue's thread,
/// between the completion that hands the entry to user space and the next commit.
struct EntryBuffers {
    header: *mut u8,
    /// The payload buffer starts [`FRONT`] bytes into this area.
    area: *mut u8,
    /// Header and payload, as the kernel takes them at registration.
    iov: Box<[libc::iovec; 2]>,
    _header_memory: Box<[u64]>,
    _area_memory: Box<[u64]>,
}

impl EntryBuffers {
    fn new(payload_size: usize) -> EntryBuffers {
        // u64 words: the request's headers are read in place and need 8-byte alignment.
        let mut header_memory = vec![0u64; HEADER_SIZE / 8].into_boxed_slice();
        let mut area_memory = vec![0u64; (FRONT + payload_size).div_ceil(8)].into_boxed_slice();
        let header = header_memory.as_mut_ptr().cast::<u8>();
        let area = area_memory.as_mut_ptr().cast::<u8>();
        let iov = Box::new([
            libc::iovec {
                iov_base: header.cast(),
                iov_len: HEADER_SIZE,
            },
            libc::iovec {
                // SAFETY: FRONT is inside the area allocated just above.
                iov_base: unsafe { area.add(FRONT) }.cast(),
                iov_len: payload_size,
            },
        ]);
        EntryBuffers {
            header,
            area,
            iov,
            _header_memory: header_memory,
            _area_memory: area_memory,
        }
    }
}

/// The thread that serves one queue.
pub(crate) struct RingQueue<FS: Filesystem> {
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    fuse_fd: RawFd,
    shared: Arc<QueueShared>,
    /// Freed only once the kernel has ended every entry (`serve` returned `Ok`); leaked
    /// otherwise, since the kernel may still write a request into them.
    entries: std::mem::ManuallyDrop<Vec<EntryBuffers>>,
    payload_size: usize,
    /// Where the eventfd read lands: leaked (8 bytes per queue), since a read still pending
    /// when the ring closes may complete after this queue is gone.
    wake_buffer: &'static mut u64,
    event_loop: SessionEventLoop<FS>,
}

impl<FS: Filesystem> RingQueue<FS> {
    /// A queue for CPU `qid` with `depth` entries of `payload_size` bytes of payload.
    fn new(
        qid: u16,
        depth: u16,
        payload_size: usize,
        fuse_fd: RawFd,
        event_loop: SessionEventLoop<FS>,
    ) -> io::Result<RingQueue<FS>> {
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .build(u32::from(depth) + 2)?;
        // SAFETY: eventfd(2) has no memory arguments; the result is checked before use.
        let wake = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if wake < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `wake` is a new descriptor that nothing else owns.
        let wake = unsafe { OwnedFd::from_raw_fd(wake) };
        let shared = Arc::new(QueueShared {
            qid,
            outbox: Mutex::new(Vec::new()),
            wake,
            thread: OnceLock::new(),
            channel: event_loop.ch.sender(),
        });
        Ok(RingQueue {
            ring,
            fuse_fd,
            shared,
            entries: std::mem::ManuallyDrop::new(
                (0..depth).map(|_| EntryBuffers::new(payload_size)).collect(),
            ),
            payload_size,
            wake_buffer: Box::leak(Box::new(0)),
            event_loop,
        })
    }

    /// The body of queue `qid`'s thread: pin to the CPU, make the ring (a single-issuer
    /// ring belongs to the thread that makes it), register the entries and serve requests
    /// until the kernel tears the ring down (unmount, abort). `started` gets the outcome of
    /// the set-up. If the queue ends any other way (an error, a panic in the file system),
    /// `abort` ends the connection: the CPU's requests would otherwise wait forever.
    pub(crate) fn serve_queue(
        qid: u16,
        depth: u16,
        payload_size: usize,
        fuse_fd: RawFd,
        event_loop: SessionEventLoop<FS>,
        started: mpsc::Sender<io::Result<()>>,
        abort: ConnectionAbort,
    ) -> io::Result<()> {
        let mut guard = AbortUnlessDone {
            abort,
            why: format!("queue {qid} ended while the connection was up"),
            done: false,
        };
        if let Err(e) = pin_to_cpu(usize::from(qid)) {
            warn!("FUSE io_uring queue {qid}: not pinned to its CPU: {e}");
        }
        let result = match RingQueue::new(qid, depth, payload_size, fuse_fd, event_loop) {
            Ok(queue) => queue.run(started),
            Err(e) => {
                let _ = started.send(Err(copy_error(&e)));
                Err(e)
            }
        };
        match &result {
            Ok(()) => guard.done = true,
            Err(e) => guard.why = format!("queue {qid}: {e}"),
        }
        result
    }

    fn run(mut self, started: mpsc::Sender<io::Result<()>>) -> io::Result<()> {
        let _ = self.shared.thread.set(std::thread::current().id());
        let registered = self.register();
        let _ = started.send(registered.as_ref().map(|_| ()).map_err(copy_error));
        registered?;
        self.serve()?;
        // SAFETY of the drop: serve returned Ok only once the kernel ended every entry (each
        // completed with its teardown error), so it holds none of their buffers any more.
        // SAFETY (ManuallyDrop): `entries` is not used after this.
        unsafe { std::mem::ManuallyDrop::drop(&mut self.entries) };
        Ok(())
    }

    /// Register every entry and arm the wake-up read; fails with the kernel's answer if it
    /// refuses (an error completion comes back at once; a good registration completes only
    /// with the entry's first request).
    fn register(&mut self) -> io::Result<()> {
        for index in 0..self.entries.len() {
            self.register_entry(index)?;
        }
        self.arm_wake()?;
        self.ring.submit()?;
        let mut failure = None;
        let mut early = Vec::new();
        for cqe in self.ring.completion() {
            if cqe.result() < 0 && cqe.user_data() & REGISTERING != 0 && cqe.user_data() != WAKE {
                failure.get_or_insert(io::Error::from_raw_os_error(-cqe.result()));
            } else {
                early.push(cqe);
            }
        }
        if let Some(e) = failure {
            return Err(e);
        }
        // A request can already be there; serve() handles completions as they come.
        for cqe in early {
            self.handle_completion(cqe.user_data(), cqe.result())?;
        }
        Ok(())
    }

    fn serve(&mut self) -> io::Result<()> {
        let mut live = self.entries.len();
        loop {
            live -= self.commit_replies()?;
            if live == 0 {
                return Ok(());
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
            let done: Vec<(u64, i32)> = self
                .ring
                .completion()
                .map(|cqe| (cqe.user_data(), cqe.result()))
                .collect();
            for (user_data, result) in done {
                if !self.handle_completion(user_data, result)? {
                    live -= 1;
                }
            }
        }
    }

    /// Handle one completion; false when an entry ended (the kernel tore it down).
    fn handle_completion(&mut self, user_data: u64, result: i32) -> io::Result<bool> {
        if user_data == WAKE {
            if result < 0 {
                // Without it, replies from other threads (fsync's) would wait for an
                // unrelated completion, perhaps forever.
                let e = io::Error::from_raw_os_error(-result);
                return Err(io::Error::new(e.kind(), format!("wake-up read: {e}")));
            }
            self.arm_wake()?;
            return Ok(true);
        }
        let index = (user_data & (REGISTERING - 1)) as usize;
        if result < 0 {
            if [libc::ENOTCONN, libc::ECANCELED, libc::ECONNABORTED].contains(&-result) {
                // Torn down: the connection ends.
                return Ok(false);
            }
            // A refused commit (no such request) or registration leaves the entry with the
            // kernel in a state that serves nothing; registering its buffers again could hand
            // them to two kernel entries at once. The queue cannot go on losing entries: end.
            let e = io::Error::from_raw_os_error(-result);
            let what = if user_data & REGISTERING != 0 { "register" } else { "commit" };
            return Err(io::Error::new(e.kind(), format!("entry {index}: {what}: {e}")));
        }
        self.serve_entry(index);
        Ok(true)
    }

    /// Hand entry `index`'s buffers to the kernel, to receive a request.
    fn register_entry(&mut self, index: usize) -> io::Result<()> {
        let iov = self.entries[index].iov.as_ptr();
        let sqe = self.command(CMD_REGISTER, 0, index as u64 | REGISTERING, Some(iov));
        self.push(&sqe)
    }

    /// Rebuild the request in the entry as one slice and dispatch it.
    fn serve_entry(&mut self, index: usize) {
        let entry = &self.entries[index];
        // SAFETY: the kernel handed the entry to user space (its command completed); until
        // the next commit only this thread touches the buffers, and every offset read below
        // is inside the header buffer's HEADER_SIZE bytes.
        let (in_len, unique, payload_len) = unsafe {
            let read_u32 = |at: usize| entry.header.add(at).cast::<u32>().read();
            let read_u64 = |at: usize| entry.header.add(at).cast::<u64>().read();
            (read_u32(0) as usize, read_u64(8), read_u32(ENT_IN_OUT + 16) as usize)
        };
        let reply_to = UringReplyTo {
            queue: self.shared.clone(),
            entry: index as u16,
        };
        let op_len = in_len.checked_sub(IN_HEADER_SIZE + payload_len);
        let op_len = match op_len {
            Some(n) if n <= OP_IN_SIZE && n % 8 == 0 && payload_len <= self.payload_size => n,
            _ => {
                error!(
                    "FUSE io_uring: malformed request (length {in_len}, payload {payload_len})"
                );
                Self::reply_eio(&reply_to, unique);
                return;
            }
        };
        let start = FRONT - IN_HEADER_SIZE - op_len;
        // SAFETY: as above; the copies go to the FRONT bytes before the payload (start >=
        // FRONT - 168), and the slice covers the copied headers and payload_len bytes of the
        // payload buffer, all inside the area, which nothing writes while the slice lives
        // (the kernel writes only after the commit, which this thread makes after dispatch).
        let data = unsafe {
            std::ptr::copy_nonoverlapping(entry.header, entry.area.add(start), IN_HEADER_SIZE);
            std::ptr::copy_nonoverlapping(
                entry.header.add(OP_IN),
                entry.area.add(start + IN_HEADER_SIZE),
                op_len,
            );
            std::slice::from_raw_parts(entry.area.add(start), in_len)
        };
        let request = match ll::AnyRequest::try_from(data) {
            Ok(request) => request,
            Err(err) => {
                error!("FUSE io_uring: {err}");
                Self::reply_eio(&reply_to, unique);
                return;
            }
        };
        if let Some(counts) = &self.event_loop.request_counts {
            counts.add_uring();
        }
        let req = RequestWithSender::from_uring(self.shared.channel.clone(), reply_to, request);
        if let Ok(Operation::Destroy(_)) = req.request.operation() {
            req.reply::<ReplyEmpty>().ok();
        } else {
            req.dispatch(&self.event_loop);
        }
    }

    /// Answers EIO to a request that could not be read, as fuser answers any error.
    fn reply_eio(reply_to: &UringReplyTo, unique: u64) {
        <ReplyRaw as Reply>::new(ll::RequestId(unique), ReplySender::Uring(reply_to.clone()))
            .send_ll(&ResponseErrno(ll::Errno::EIO));
    }

    /// Write the replies of the outbox into their entries and commit them (each commit also
    /// asks for the entry's next request). Returns how many entries could not be committed.
    fn commit_replies(&mut self) -> io::Result<usize> {
        let replies = std::mem::take(&mut *self.shared.outbox.lock());
        let mut lost = 0;
        for (index, mut reply) in replies {
            let index = usize::from(index);
            if reply.len() < OUT_HEADER_SIZE {
                error!("FUSE io_uring: reply shorter than its header");
                lost += 1;
                continue;
            }
            let body_len = reply.len() - OUT_HEADER_SIZE;
            let body_len = if body_len > self.payload_size {
                error!("FUSE io_uring: reply of {body_len} bytes does not fit the entry");
                reply.truncate(OUT_HEADER_SIZE);
                reply[4..8].copy_from_slice(&(-libc::EIO).to_ne_bytes());
                0
            } else {
                body_len
            };
            reply[0..4].copy_from_slice(&((OUT_HEADER_SIZE + body_len) as u32).to_ne_bytes());
            let unique = u64::from_ne_bytes(reply[8..16].try_into().expect("8 bytes"));
            let entry = &self.entries[index];
            // SAFETY: the entry is in user space (its request was handed over and this is its
            // one reply); the header copy fits HEADER_SIZE, the body fits the payload buffer
            // (checked above), and the payload size goes to its field in the header buffer.
            unsafe {
                std::ptr::copy_nonoverlapping(reply.as_ptr(), entry.header, OUT_HEADER_SIZE);
                std::ptr::copy_nonoverlapping(
                    reply.as_ptr().add(OUT_HEADER_SIZE),
                    entry.area.add(FRONT),
                    body_len,
                );
                entry.header.add(ENT_IN_OUT + 16).cast::<u32>().write(body_len as u32);
            }
            let sqe = self.command(CMD_COMMIT_AND_FETCH, unique, index as u64, None);
            self.push(&sqe)?;
        }
        Ok(lost)
    }

    /// A FUSE command for this queue. `iov` (REGISTER only) points at the entry's two
    /// iovecs, which the kernel reads while it handles the command.
    fn command(
        &self,
        op: u32,
        commit_id: u64,
        user_data: u64,
        iov: Option<*const libc::iovec>,
    ) -> squeue::Entry128 {
        let mut cmd = [0u8; 80];
        cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
        cmd[16..18].copy_from_slice(&self.shared.qid.to_ne_bytes());
        let mut builder = opcode::UringCmd80::new(types::Fd(self.fuse_fd), op).cmd(cmd);
        if let Some(iov) = iov {
            builder = builder.addr(Some(iov as u64));
        }
        let sqe = builder.build().user_data(user_data);
        if iov.is_none() {
            return sqe;
        }
        // The crate has no setter for the SQE's `len`, which REGISTER needs to be 2 (the
        // number of iovecs). SAFETY: `Entry128` is `repr(C)` over `io_uring_sqe` (64 bytes)
        // and 64 bytes of command area, plain integers with no invalid bit patterns; `len`
        // is the u32 at offset 24 of `io_uring_sqe`.
        let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
        raw[24..28].copy_from_slice(&2u32.to_ne_bytes());
        unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
    }

    fn arm_wake(&mut self) -> io::Result<()> {
        let buffer: *mut u64 = &mut *self.wake_buffer;
        let sqe = opcode::Read::new(types::Fd(self.shared.wake.as_raw_fd()), buffer.cast(), 8)
            .build()
            .user_data(WAKE);
        self.push(&sqe.into())
    }

    fn push(&mut self, sqe: &squeue::Entry128) -> io::Result<()> {
        // SAFETY: every buffer an SQE names lives as long as the kernel may use it: the
        // entries' iovecs and buffers until the kernel has ended every entry (or forever,
        // see `run`), the wake-up word forever.
        loop {
            if unsafe { self.ring.submission().push(sqe) }.is_ok() {
                return Ok(());
            }
            self.ring.submit()?;
        }
    }
}
