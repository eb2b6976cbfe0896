//! The FUSE adapter: kernel requests in, [`Fs`] calls, errno out.
//!
//! Invariants:
//! - No file-system logic lives here. Each request is translated into one [`Fs`] call (two for
//!   `create`: create, then open) and its result into a reply.
//! - [`errno`] is the single place where [`FsError`] becomes an errno.
//! - Inode numbers are ext4's, except that the root is FUSE's 1 and ext4's 2 ([`to_fs`],
//!   [`to_fuse`]); ext4 never hands out inode 1 (the bad-blocks inode), so the map is a bijection
//!   on every inode the kernel can see.
//! - Permission checks are the kernel's (`default_permissions`), so `access` always succeeds and
//!   set-id bits are cleared by the kernel through `setattr`.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, BsdFileFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, KernelConfig, LockOwner, Notifier, OpenFlags, RenameFlags,
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyStatx, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use tidefs::fs::{
    Attr, Creds, FileKind, Fs, Ino, RenameFlags as FsRenameFlags, SetAttr, SetTime, Timestamp,
    XattrSetMode, ROOT_INO,
};
use tidefs::FsError;

/// How long the kernel may cache attributes and entries (a day, as long as the kernel keeps
/// them anyway). The image is locked to this daemon, every change of names, attributes, sizes
/// and extended attributes is a request of this mount, and the kernel drops or updates what
/// each request makes stale (the parent directory's attributes after a create or unlink, a
/// file's after a write). The one attribute that moves behind a request's back, `st_blocks`
/// (extent-tree blocks at write-back, an attribute block), is reported by the library and
/// forgotten by the kernel on our word ([`forget_attributes_of_changed_blocks`]). A short
/// validity only cost round trips: with one second, a lookup of a name not used in the last
/// second (every `stat` of a random file among many) waited for the daemon.
const TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// `fallocate` mode bit: do not change the file size.
const FALLOC_FL_KEEP_SIZE: i32 = 0x01;
/// `fallocate` mode bit: deallocate the range (Linux requires KEEP_SIZE with it).
const FALLOC_FL_PUNCH_HOLE: i32 = 0x02;
/// `fallocate` mode bit: make the range read as zeros, keeping it allocated.
const FALLOC_FL_ZERO_RANGE: i32 = 0x10;
/// `setxattr` flag: fail if the attribute exists.
const XATTR_CREATE: i32 = 0x1;
/// `setxattr` flag: fail if the attribute is missing.
const XATTR_REPLACE: i32 = 0x2;

/// The outcome of the final [`Fs::unmount`], shared between the adapter (which closes the file
/// system in `destroy`) and the daemon's main thread (which closes it if `destroy` never ran).
#[derive(Default)]
pub struct CloseOnce {
    /// `None` until the file system was closed; then the result of [`Fs::unmount`].
    result: Mutex<Option<Result<(), String>>>,
}

impl CloseOnce {
    /// Unmounts `fs` unless that happened already; returns the result of the one unmount.
    pub fn close(&self, fs: &Fs) -> Result<(), String> {
        let mut result = self.result.lock().unwrap_or_else(|e| e.into_inner());
        result
            .get_or_insert_with(|| fs.unmount().map_err(|e| e.to_string()))
            .clone()
    }
}

/// How every open file is served. The kernel keeps its page cache across opens: every change
/// to a file goes through this mount (the daemon is the image's only owner), and the kernel
/// updates or drops its cached pages on write, truncate and fallocate itself, so the cache is
/// never stale; reads of cached data then never reach the daemon. No FLUSH on close: tidefs
/// promises nothing at close (fsync does), so the request would only cost a round trip.
const OPEN_FLAGS: FopenFlags = FopenFlags::FOPEN_KEEP_CACHE.union(FopenFlags::FOPEN_NOFLUSH);

/// Answers a create or tmpfile request with the new file's attributes and its handle.
fn reply_created(reply: ReplyCreate, attr: &Attr) {
    reply.created(
        &TTL,
        &file_attr(attr),
        Generation(u64::from(attr.generation)),
        FileHandle(0),
        OPEN_FLAGS,
    );
}

/// The [`Filesystem`] that fuser drives.
pub struct FuseFs {
    fs: Arc<Fs>,
    close: Arc<CloseOnce>,
    /// The kernel accepts ENOSYS from opendir as "no handle needed" (FUSE_NO_OPENDIR_SUPPORT).
    no_opendir: bool,
    /// The same for open (FUSE_NO_OPEN_SUPPORT).
    no_open: bool,
    /// Ask for FUSE over io_uring at init (`-o fuse_uring`).
    fuse_uring: bool,
}

impl FuseFs {
    /// An adapter over `fs`; `destroy` closes it through `close`.
    pub fn new(fs: Arc<Fs>, close: Arc<CloseOnce>) -> FuseFs {
        FuseFs {
            fs,
            close,
            no_opendir: false,
            no_open: false,
            fuse_uring: false,
        }
    }

    /// Ask the kernel for FUSE over io_uring at init; the mount fails if it does not offer it.
    pub fn with_fuse_uring(mut self, on: bool) -> FuseFs {
        self.fuse_uring = on;
        self
    }
}

/// The errno for a file-system error. The only place where errno values are chosen.
///
/// Corruption answers EUCLEAN ("structure needs cleaning"), as the kernel's ext4 answers
/// EFSCORRUPTED, and is logged on stderr (the daemon's log) with the inode and block numbers
/// the library found, since the caller only sees the errno. Something tidefs does not
/// implement (a file in the ext2/ext3 block-map layout) answers EOPNOTSUPP and is logged the
/// same way. A device error that is the host running out of room under the image (a sparse
/// image file on a full disk) answers ENOSPC, not EIO: the medium is fine.
pub fn errno(error: &FsError) -> Errno {
    match error {
        FsError::Corrupt(c) => log_corrupt(c),
        FsError::Incompatible(what) => eprintln!("tidefs: not supported: {what}"),
        _ => {}
    }
    match error {
        FsError::NotFound => Errno::ENOENT,
        FsError::Exists => Errno::EEXIST,
        FsError::NotDir => Errno::ENOTDIR,
        FsError::IsDir => Errno::EISDIR,
        FsError::NotEmpty => Errno::ENOTEMPTY,
        FsError::NoSpace => Errno::ENOSPC,
        FsError::NameTooLong => Errno::ENAMETOOLONG,
        FsError::TooManyLinks => Errno::EMLINK,
        FsError::FileTooBig => Errno::EFBIG,
        FsError::Invalid(_) => Errno::EINVAL,
        FsError::NotPermitted => Errno::EPERM,
        FsError::AccessDenied => Errno::EACCES,
        FsError::NoAttribute => Errno::ENODATA,
        FsError::Range => Errno::ERANGE,
        FsError::ReadOnly => Errno::EROFS,
        FsError::NotSupported => Errno::EOPNOTSUPP,
        FsError::Busy(_) => Errno::EBUSY,
        FsError::Corrupt(_) => Errno::from_i32(libc::EUCLEAN),
        FsError::Incompatible(_) => Errno::EOPNOTSUPP,
        FsError::Io(e) if matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) => {
            Errno::ENOSPC
        }
        FsError::Io(_) => Errno::EIO,
        _ => Errno::EIO,
    }
}

/// One log line per corruption reported to a caller: `tidefs: ino N: corrupt: <what>`.
fn log_corrupt(c: &tidefs::error::Corrupt) {
    match c.ino {
        Some(ino) => eprintln!("tidefs: ino {ino}: corrupt: {}", c.what),
        None => eprintln!("tidefs: corrupt: {}", c.what),
    }
}

/// FUSE inode number → ext4 inode number.
fn to_fs(ino: INodeNo) -> Ino {
    if ino == INodeNo::ROOT {
        ROOT_INO
    } else {
        ino.0
    }
}

/// ext4 inode number → FUSE inode number.
fn to_fuse(ino: Ino) -> INodeNo {
    if ino == ROOT_INO {
        INodeNo::ROOT
    } else {
        INodeNo(ino)
    }
}

/// Tells the kernel to forget the cached attributes of inodes whose block count the library
/// changed behind its back (`Fs::on_blocks_changed`): attributes are valid for [`TTL`], and
/// nothing else would make it ask again for a file whose extent tree grew at a commit.
pub fn forget_attributes_of_changed_blocks(fs: &Fs, notifier: Notifier) {
    fs.on_blocks_changed(Box::new(move |inodes| {
        for &ino in inodes {
            // ENOENT: the kernel does not hold the inode, so it has nothing to forget;
            // ENODEV, ENOTCONN: the mount is gone (the final commit of an unmount).
            if let Err(e) = notifier.inval_inode(to_fuse(ino), -1, 0) {
                let gone = [libc::ENOENT, libc::ENODEV, libc::ENOTCONN];
                if !e.raw_os_error().is_some_and(|n| gone.contains(&n)) {
                    log::warn!("telling the kernel that inode {ino} changed: {e}");
                }
            }
        }
    }));
}

fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::CharDev => FileType::CharDevice,
        FileKind::BlockDev => FileType::BlockDevice,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
    }
}

fn system_time(t: Timestamp) -> SystemTime {
    let nanos = Duration::from_nanos(u64::from(t.nsec));
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::from_secs(t.sec.unsigned_abs()) + nanos
    } else {
        UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs()) + nanos
    }
}

fn timestamp(t: SystemTime) -> Timestamp {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timestamp {
            sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            nsec: d.subsec_nanos(),
        },
        Err(before) => {
            // Before the epoch: -1.25 s is sec -2, nsec 750 000 000.
            let d = before.duration();
            let mut sec = -i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            let mut nsec = d.subsec_nanos();
            if nsec > 0 {
                sec -= 1;
                nsec = 1_000_000_000 - nsec;
            }
            Timestamp { sec, nsec }
        }
    }
}

/// A time from a kernel request. fuser 0.18 builds a request's pre-epoch time (sec < 0, nsec)
/// as `UNIX_EPOCH - (|sec| s + nsec ns)` instead of `- |sec| s + nsec ns` (the TODO in its
/// `time.rs`), so before the epoch we undo exactly that: the distance's whole seconds are
/// `-sec` and its nanoseconds are `nsec`. Replies go through fuser's correct inverse.
fn request_timestamp(t: SystemTime) -> Timestamp {
    match t.duration_since(UNIX_EPOCH) {
        Ok(_) => timestamp(t),
        Err(before) => {
            let d = before.duration();
            Timestamp {
                sec: -i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
                nsec: d.subsec_nanos(),
            }
        }
    }
}

fn set_time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::SpecificTime(t) => SetTime::At(request_timestamp(t)),
        TimeOrNow::Now => SetTime::Now,
    }
}

fn file_attr(attr: &Attr) -> FileAttr {
    FileAttr {
        ino: to_fuse(attr.ino),
        size: attr.size,
        blocks: attr.blocks,
        atime: system_time(attr.atime),
        mtime: system_time(attr.mtime),
        ctime: system_time(attr.ctime),
        crtime: system_time(attr.crtime),
        kind: file_type(attr.kind),
        perm: attr.perm,
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        rdev: attr.rdev,
        blksize: attr.blksize,
        flags: 0,
    }
}

/// The reply to a lookup of a name that does not exist: an entry with node id 0, which the
/// kernel keeps as a negative dentry for [`TTL`] (as `negative_timeout` does for libfuse file
/// systems), so a program that keeps asking whether a file exists (SQLite, before each
/// transaction, for its `-wal` file) does not cost a round trip each time. Every change of
/// names goes through this mount's kernel, which turns the negative dentry positive itself.
fn negative_entry() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

fn creds(req: &Request) -> Creds {
    Creds {
        uid: req.uid(),
        gid: req.gid(),
    }
}

fn name_bytes(name: &OsStr) -> &[u8] {
    name.as_bytes()
}

/// Replies with an entry the kernel will hold (it counts a lookup until its FORGET): the
/// inode is held as well, so it outlives its last link while the kernel may still name it
/// (see `FuseFs::forget`).
fn reply_held_entry(fs: &Fs, reply: ReplyEntry, result: tidefs::Result<Attr>) {
    // The root is never freed, and the kernel never forgets it (see `forget`).
    let held = result.and_then(|attr| {
        if attr.ino == ROOT_INO {
            return Ok(attr);
        }
        fs.open_inode(attr.ino).map(|()| attr)
    });
    reply_entry(reply, held);
}

fn reply_entry(reply: ReplyEntry, result: tidefs::Result<Attr>) {
    match result {
        Ok(attr) => reply.entry(
            &TTL,
            &file_attr(&attr),
            Generation(u64::from(attr.generation)),
        ),
        Err(e) => reply.error(errno(&e)),
    }
}

fn reply_empty(reply: ReplyEmpty, result: tidefs::Result<()>) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

/// A reply sent once an fsync or sync is durable: the library calls it on the thread that
/// made the commit durable, so the request thread that read the fsync goes straight back to the
/// kernel (docs/DESIGN.md §2.7: one slow fsync never holds the other requests).
fn reply_later(reply: ReplyEmpty) -> tidefs::fs::SyncDone {
    Box::new(move |result| reply_empty(reply, result))
}

/// Replies to a getxattr/listxattr: the size for a probe (`size == 0`), ERANGE when the
/// caller's buffer is too small, else the bytes.
fn reply_xattr(reply: ReplyXattr, size: u32, bytes: &[u8]) {
    let Ok(len) = u32::try_from(bytes.len()) else {
        reply.error(Errno::E2BIG);
        return;
    };
    if size == 0 {
        reply.size(len);
    } else if len > size {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(bytes);
    }
}

impl Filesystem for FuseFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Lookups and readdirs in one directory may run in parallel; the fs locks what it needs.
        // Writes stay uncached (no FUSE_WRITEBACK_CACHE): tidefs must see every write.
        let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        // tidefs kills set-ID bits and capabilities itself (on write, truncate and chown), so
        // the kernel need not ask for security.capability before every write: one request
        // per write instead of two.
        let _ = config.add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2);
        // The kernel keeps symbolic links' targets in its page cache: a target never changes
        // (a link is replaced, never rewritten), and an inode number is never handed out
        // again while the kernel holds the old inode (`Fs::forget_inode`), so a path through
        // a link costs no READLINK after the first.
        let _ = config.add_capabilities(InitFlags::FUSE_CACHE_SYMLINKS);
        // Directories need no open handle (see `opendir`).
        self.no_opendir = config
            .add_capabilities(InitFlags::FUSE_NO_OPENDIR_SUPPORT)
            .is_ok();
        // Nor do files (see `open`).
        self.no_open = config
            .add_capabilities(InitFlags::FUSE_NO_OPEN_SUPPORT)
            .is_ok();
        let _ = config.set_max_write(1 << 20);
        if self.fuse_uring
            && config
                .add_capabilities(InitFlags::FUSE_OVER_IO_URING)
                .is_err()
        {
            return Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "the kernel did not offer FUSE over io_uring (fuse_uring)",
            ));
        }
        Ok(())
    }

    fn destroy(&mut self) {
        if let Err(e) = self.close.close(&self.fs) {
            eprintln!("tidefs: unmount: {e}");
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.fs.lookup(to_fs(parent), name_bytes(name)) {
            Err(FsError::NotFound) => reply.entry(&TTL, &negative_entry(), Generation(0)),
            found => reply_held_entry(&self.fs, reply, found),
        }
    }

    /// The kernel dropped `nlookup` of its references to `ino` (it counts one per entry reply,
    /// each of which held the inode in the library's open table): the last one frees an inode
    /// without links. The kernel forgets an inode only once nothing uses it (no open file, no
    /// working directory, no mapping), so this is the only hold the adapter needs, and an
    /// inode number is never reused while the kernel may still name it.
    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        if ino == INodeNo::ROOT {
            return;
        }
        if let Err(e) = self.fs.forget_inode(to_fs(ino), nlookup) {
            // No reply to carry it: the inode stays until unmount or the next mount's orphan
            // processing frees it.
            log::warn!("forget of inode {ino}: {e}");
        }
    }

    /// A request with a file handle comes from the kernel itself, never from `stat` (the
    /// kernel's `fuse_getattr` passes no file): it refreshes the size before a read past the
    /// end it knows or an `lseek` from the end. Its reply is for that use only: it does not
    /// count as a look at the times (so the next write may keep a coarse, unchanged mtime and
    /// its fsync need not commit; docs/DESIGN.md §4.3), and the kernel may not keep it (valid
    /// for no time), so any later `stat` asks again and sees times that count as seen.
    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let (attr, ttl) = match fh {
            Some(_) => (self.fs.refresh_attr(to_fs(ino)), Duration::ZERO),
            None => (self.fs.getattr(to_fs(ino)), TTL),
        };
        match attr {
            Ok(attr) => reply.attr(&ttl, &file_attr(&attr)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// statx(2) with the birth time: ext4's `i_crtime`.
    fn statx(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: Option<FileHandle>,
        _flags: u32,
        _mask: u32,
        reply: ReplyStatx,
    ) {
        match self.fs.getattr(to_fs(ino)) {
            Ok(attr) => reply.statx(&TTL, &file_attr(&attr)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let changes = SetAttr {
            // The kernel sends the whole i_mode; the type bits are not ours to change.
            mode: mode.map(|m| (m & 0o7777) as u16),
            uid,
            gid,
            size,
            atime: atime.map(set_time),
            mtime: mtime.map(set_time),
            ctime: ctime.map(request_timestamp),
        };
        match self.fs.setattr(to_fs(ino), &changes) {
            Ok(attr) => reply.attr(&TTL, &file_attr(&attr)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.readlink(to_fs(ino)) {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let mode = mode & !(umask & 0o777);
        reply_held_entry(
            &self.fs,
            reply,
            self.fs
                .create(to_fs(parent), name_bytes(name), mode, rdev, creds(req)),
        );
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let perm = (mode & !umask & 0o7777) as u16;
        reply_held_entry(
            &self.fs,
            reply,
            self.fs
                .mkdir(to_fs(parent), name_bytes(name), perm, creds(req)),
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.fs.unlink(to_fs(parent), name_bytes(name)));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.fs.rmdir(to_fs(parent), name_bytes(name)));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        reply_held_entry(
            &self.fs,
            reply,
            self.fs.symlink(
                to_fs(parent),
                name_bytes(link_name),
                target.as_os_str().as_bytes(),
                creds(req),
            ),
        );
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let known = RenameFlags::RENAME_NOREPLACE | RenameFlags::RENAME_EXCHANGE;
        if !known.contains(flags) || flags == known {
            reply.error(Errno::EINVAL);
            return;
        }
        let fs_flags = FsRenameFlags {
            noreplace: flags.contains(RenameFlags::RENAME_NOREPLACE),
            exchange: flags.contains(RenameFlags::RENAME_EXCHANGE),
        };
        reply_empty(
            reply,
            self.fs.rename(
                to_fs(parent),
                name_bytes(name),
                to_fs(newparent),
                name_bytes(newname),
                fs_flags,
            ),
        );
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply_held_entry(
            &self.fs,
            reply,
            self.fs
                .link(to_fs(ino), to_fs(newparent), name_bytes(newname)),
        );
    }

    /// Before a truncate or change of owner by a caller without `CAP_FSETID`, or an open
    /// with `O_TRUNC` (FUSE_HANDLE_KILLPRIV_V2).
    fn kill_suidgid(&self, _req: &Request, ino: INodeNo) -> Result<(), Errno> {
        self.fs.kill_suidgid(to_fs(ino)).map_err(|e| errno(&e))
    }

    /// Where the kernel offers FUSE_NO_OPEN_SUPPORT the first open answers ENOSYS, which the
    /// kernel takes as success for every later open: no OPEN or RELEASE round trip. Handles
    /// need no counting: an inode's lifetime follows the kernel's lookups (see `forget`), which
    /// an open file keeps.
    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if self.no_open {
            reply.error(Errno::ENOSYS);
        } else {
            reply.opened(FileHandle(0), OPEN_FLAGS);
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.fs.read(to_fs(ino), offset, size) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
            if let Err(e) = self.fs.kill_suidgid(to_fs(ino)) {
                reply.error(errno(&e));
                return;
            }
        }
        match self.fs.write(to_fs(ino), offset, data) {
            Ok(written) => reply.written(written),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close() promises nothing about durability; fsync does. ENOSYS tells the kernel so
        // for good: it sends no more FLUSH (files opened without an OPEN request do not carry
        // FOPEN_NOFLUSH).
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        // Nothing to drop: handles are not counted (see `open`); the kernel's FORGET, which
        // follows the last close, frees an unlinked inode.
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.fs.fsync_then(to_fs(ino), datasync, reply_later(reply));
    }

    /// Directories keep no per-open state (readdir works from offsets), so where the kernel
    /// offers FUSE_NO_OPENDIR_SUPPORT the first opendir answers ENOSYS, which the kernel
    /// takes as success: it sends no more OPENDIR or RELEASEDIR, two round trips fewer for
    /// every `ls` or directory fsync.
    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if self.no_opendir {
            reply.error(Errno::ENOSYS);
        } else {
            reply.opened(FileHandle(0), FopenFlags::empty());
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let result = self.fs.readdir(to_fs(ino), offset, &mut |entry| {
            let full = reply.add(
                to_fuse(entry.ino),
                entry.next_offset,
                file_type(entry.kind),
                OsStr::from_bytes(&entry.name),
            );
            !full
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.fs.fsync_then(to_fs(ino), datasync, reply_later(reply));
    }

    /// `syncfs(2)`: commit and flush everything, reply once durable. Linux 6.18 sends
    /// FUSE_SYNCFS only on connections that ask for it (virtiofs); on this /dev/fuse mount
    /// `sync -f` and `syncfs(2)` never reach the daemon, but a kernel that forwards them gets
    /// the right answer here.
    fn syncfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyEmpty) {
        self.fs.sync_then(reply_later(reply));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.fs.statfs() {
            Ok(s) => reply.statfs(
                s.blocks,
                s.blocks_free,
                s.blocks_available,
                s.files,
                s.files_free,
                s.block_size,
                s.name_max,
                s.block_size,
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        position: u32,
        reply: ReplyEmpty,
    ) {
        let mode = match flags {
            0 => XattrSetMode::Any,
            XATTR_CREATE => XattrSetMode::Create,
            XATTR_REPLACE => XattrSetMode::Replace,
            _ => {
                reply.error(Errno::EINVAL);
                return;
            }
        };
        if position != 0 {
            reply.error(Errno::EINVAL);
            return;
        }
        reply_empty(
            reply,
            self.fs.setxattr(to_fs(ino), name_bytes(name), value, mode),
        );
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        match self.fs.getxattr(to_fs(ino), name_bytes(name)) {
            Ok(value) => reply_xattr(reply, size, &value),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.fs.listxattr(to_fs(ino)) {
            Ok(names) => {
                let mut list = Vec::new();
                for name in names {
                    list.extend_from_slice(&name);
                    list.push(0);
                }
                reply_xattr(reply, size, &list);
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.fs.removexattr(to_fs(ino), name_bytes(name)));
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // Mounted with default_permissions: the kernel has checked already.
        reply.ok();
    }

    /// Where files open without OPEN requests (see `open`), CREATE answers ENOSYS, which the
    /// kernel takes for good: it creates files with MKNOD and opens them without asking, so a
    /// new file costs one request instead of CREATE and, at its close, RELEASE.
    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        if self.no_open {
            reply.error(Errno::ENOSYS);
            return;
        }
        let mode = mode & !(umask & 0o777);
        let attr = match self
            .fs
            .create(to_fs(parent), name_bytes(name), mode, 0, creds(req))
        {
            Ok(attr) => attr,
            Err(e) => {
                reply.error(errno(&e));
                return;
            }
        };
        // The kernel's lookup holds the inode until FORGET (and outlasts the new handle).
        match self.fs.open_inode(attr.ino) {
            Ok(()) => reply_created(reply, &attr),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// O_TMPFILE: an unnamed file that holds one open handle, released by `release`.
    fn tmpfile(
        &self,
        req: &Request,
        parent: INodeNo,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let mode = mode & !(umask & 0o777);
        // The tmpfile comes with one hold: the kernel's lookup, dropped by its FORGET.
        match self.fs.tmpfile(to_fs(parent), mode, creds(req)) {
            Ok(attr) => reply_created(reply, &attr),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let ino = to_fs(ino);
        // PUNCH_HOLE without KEEP_SIZE is EOPNOTSUPP, as Linux requires; so are the modes
        // tidefs does not implement (COLLAPSE_RANGE, INSERT_RANGE, UNSHARE_RANGE...).
        let result = match mode {
            0 => self.fs.fallocate(ino, offset, length, false),
            FALLOC_FL_KEEP_SIZE => self.fs.fallocate(ino, offset, length, true),
            m if m == FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE => {
                self.fs.punch_hole(ino, offset, length)
            }
            FALLOC_FL_ZERO_RANGE => self.fs.zero_range(ino, offset, length, false),
            m if m == FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE => {
                self.fs.zero_range(ino, offset, length, true)
            }
            _ => Err(FsError::NotSupported),
        };
        reply_empty(reply, result);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_maps_both_ways_and_others_are_identity() {
        assert_eq!(to_fs(INodeNo::ROOT), ROOT_INO);
        assert_eq!(to_fuse(ROOT_INO), INodeNo::ROOT);
        assert_eq!(to_fs(INodeNo(12)), 12);
        assert_eq!(to_fuse(12), INodeNo(12));
    }

    #[test]
    fn timestamps_round_trip_with_nanoseconds_and_before_the_epoch() {
        for t in [
            Timestamp { sec: 0, nsec: 0 },
            Timestamp {
                sec: 1_700_000_000,
                nsec: 123_456_789,
            },
            Timestamp {
                sec: -2,
                nsec: 750_000_000,
            },
            Timestamp { sec: -1, nsec: 1 },
        ] {
            assert_eq!(timestamp(system_time(t)), t);
        }
    }

    #[test]
    fn pre_epoch_request_times_undo_fusers_conversion() {
        // fuser turns the kernel's (-100 s, 5 ns) into EPOCH - 100.000000005 s.
        let from_fuser = UNIX_EPOCH - Duration::new(100, 5);
        assert_eq!(
            request_timestamp(from_fuser),
            Timestamp { sec: -100, nsec: 5 }
        );
        let after = UNIX_EPOCH + Duration::new(7, 9);
        assert_eq!(request_timestamp(after), Timestamp { sec: 7, nsec: 9 });
    }

    #[test]
    fn every_error_has_its_errno() {
        let cases = [
            (FsError::NotFound, Errno::ENOENT),
            (FsError::Exists, Errno::EEXIST),
            (FsError::NotDir, Errno::ENOTDIR),
            (FsError::IsDir, Errno::EISDIR),
            (FsError::NotEmpty, Errno::ENOTEMPTY),
            (FsError::NoSpace, Errno::ENOSPC),
            (FsError::NameTooLong, Errno::ENAMETOOLONG),
            (FsError::TooManyLinks, Errno::EMLINK),
            (FsError::FileTooBig, Errno::EFBIG),
            (FsError::Invalid("x"), Errno::EINVAL),
            (FsError::NotPermitted, Errno::EPERM),
            (FsError::AccessDenied, Errno::EACCES),
            (FsError::NoAttribute, Errno::ENODATA),
            (FsError::Range, Errno::ERANGE),
            (FsError::ReadOnly, Errno::EROFS),
            (FsError::NotSupported, Errno::EOPNOTSUPP),
            (FsError::corrupt("bad"), Errno::from_i32(libc::EUCLEAN)),
            (FsError::Io(std::io::Error::other("disk")), Errno::EIO),
            (
                FsError::Io(std::io::Error::from_raw_os_error(libc::EIO)),
                Errno::EIO,
            ),
            (
                FsError::Io(std::io::Error::from_raw_os_error(libc::ENOSPC)),
                Errno::ENOSPC,
            ),
            (
                FsError::Io(std::io::Error::from_raw_os_error(libc::EDQUOT)),
                Errno::ENOSPC,
            ),
            (
                FsError::Incompatible("block maps".into()),
                Errno::EOPNOTSUPP,
            ),
        ];
        for (error, expected) in cases {
            assert_eq!(errno(&error), expected, "{error:?}");
        }
    }
}
