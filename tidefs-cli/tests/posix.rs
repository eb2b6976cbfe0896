//! Goal: POSIX semantics through a real FUSE mount of tidefs, as the kernel's ext4 has them:
//! every operation of issue 2 and the errno of each failure, ownership and permissions for
//! several users, nanosecond timestamps, sparse files, big directories, deep trees. After each
//! test the image is unmounted and must be clean by `e2fsck -fn`.
//! Method: each test gets its own fresh image and mount ([`Mount`]), operates with std and libc
//! calls, and checks results with stat and reads. Multi-user cases run shell commands as other
//! uids (std's `Command::uid`, which execs, so no multi-threaded fork).

mod common;

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::os::unix::fs::{FileExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;

/// Mounts a fresh 64 MiB image, or returns from the test when the machine cannot.
macro_rules! mount {
    ($name:expr) => {
        mount!($name, "64M", &[], &[])
    };
    ($name:expr, $size:expr, $mkfs:expr, $opts:expr) => {
        match Mount::new($name, $size, $mkfs, $opts) {
            Some(m) => Checked(m),
            None => return,
        }
    };
}

/// Mounts a fresh 64 MiB image that other users may enter (`allow_other`), or returns from the
/// test, saying `why` it needs root, when not running as root.
macro_rules! mount_for_other_users {
    ($name:expr, $why:expr) => {{
        if !is_root() {
            skip($name, $why);
            return;
        }
        mount!($name, "64M", &[], &["allow_other"])
    }};
}

/// A mount that is unmounted and checked with `e2fsck -fn` when the test body ends normally.
struct Checked(Mount);

impl std::ops::Deref for Checked {
    type Target = Mount;
    fn deref(&self) -> &Mount {
        &self.0
    }
}

impl std::ops::DerefMut for Checked {
    fn deref_mut(&mut self) -> &mut Mount {
        &mut self.0
    }
}

impl Drop for Checked {
    fn drop(&mut self) {
        if std::thread::panicking() || !self.0.mounted {
            return;
        }
        self.0.umount_ok();
        let (code, text) = e2fsck(&self.0.image);
        assert_eq!(code, 0, "e2fsck -fn after the test:\n{text}");
    }
}

fn write_file(path: &Path, data: &[u8]) {
    fs::write(path, data).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

fn read_file(path: &Path) -> Vec<u8> {
    fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Goal: create, write, read back, reopen; writes at offsets, across blocks, appends; O_EXCL,
/// ENOENT.
#[test]
fn create_write_read_and_reopen() {
    let m = mount!("create_write_read_and_reopen");
    let path = m.path("hello.txt");
    let mut f = OpenOptions::new()
        .create_new(true)
        .write(true)
        .read(true)
        .mode(0o640)
        .open(&path)
        .expect("OK to unwrap: create");
    f.write_all(b"hello, world\n").expect("OK to unwrap: write");
    f.seek(SeekFrom::Start(7)).expect("OK to unwrap: seek");
    let mut rest = String::new();
    f.read_to_string(&mut rest).expect("OK to unwrap: read");
    assert_eq!(rest, "world\n");
    drop(f);
    let meta = fs::metadata(&path).expect("OK to unwrap: stat");
    assert!(meta.is_file());
    assert_eq!(meta.len(), 13);
    assert_eq!(meta.mode() & 0o7777, 0o640);
    assert_eq!(meta.nlink(), 1);
    assert_eq!(read_file(&path), b"hello, world\n");
    // Writes at offsets, across block boundaries, and appends.
    let f = OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("OK to unwrap: open");
    f.write_all_at(&[b'x'; 5000], 4000)
        .expect("OK to unwrap: pwrite");
    drop(f);
    let data = read_file(&path);
    assert_eq!(data.len(), 9000);
    assert_eq!(&data[..13], b"hello, world\n");
    assert!(data[13..4000].iter().all(|&b| b == 0));
    assert!(data[4000..].iter().all(|&b| b == b'x'));
    let mut f = OpenOptions::new()
        .append(true)
        .open(&path)
        .expect("OK to unwrap: open");
    f.write_all(b"tail").expect("OK to unwrap: append");
    drop(f);
    assert_eq!(&read_file(&path)[9000..], b"tail");
    // A large write spanning many blocks reads back.
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 256) as u8).collect();
    write_file(&m.path("big"), &big);
    assert!(read_file(&m.path("big")) == big);
    // O_EXCL on an existing name.
    assert_eq!(
        errno(OpenOptions::new().create_new(true).write(true).open(&path)),
        libc::EEXIST
    );
    assert_eq!(errno(File::open(m.path("missing"))), libc::ENOENT);
}

/// Goal: truncate shrinks and grows (the grown part reads as zeros), O_TRUNC empties, EFBIG past
/// ext4's limit.
#[test]
fn truncate_shrinks_and_grows_with_zeros() {
    let m = mount!("truncate_shrinks_and_grows_with_zeros");
    let path = m.path("t");
    write_file(&path, &[b'a'; 10_000]);
    let f = OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("OK to unwrap: open");
    f.set_len(100).expect("OK to unwrap: shrink");
    assert_eq!(fs::metadata(&path).expect("OK to unwrap").len(), 100);
    f.set_len(20_000).expect("OK to unwrap: grow");
    drop(f);
    let data = read_file(&path);
    assert_eq!(data.len(), 20_000);
    assert!(data[..100].iter().all(|&b| b == b'a'));
    assert!(
        data[100..].iter().all(|&b| b == 0),
        "grown part must read as zeros"
    );
    // O_TRUNC.
    let f = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&path)
        .expect("OK to unwrap: open");
    drop(f);
    assert_eq!(fs::metadata(&path).expect("OK to unwrap").len(), 0);
    // EFBIG past the largest ext4 file (16 TiB - 4 KiB with 4 KiB blocks).
    let f = OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("OK to unwrap: open");
    assert_eq!(errno(f.set_len(1 << 45)), libc::EFBIG);
    assert_eq!(errno(f.write_all_at(b"x", 1 << 44)), libc::EFBIG);
}

/// Goal: fallocate mode 0 sets the size and allocates zeroed blocks, KEEP_SIZE allocates only,
/// punch hole is EOPNOTSUPP. Method: check size, block count and content with stat and reads.
#[test]
fn fallocate_mode_zero_and_keep_size() {
    let m = mount!("fallocate_mode_zero_and_keep_size");
    let path = m.path("f");
    let f = OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(&path)
        .expect("OK to unwrap: create");
    fallocate(&f, 0, 0, 1 << 20).expect("OK to unwrap: fallocate");
    let meta = fs::metadata(&path).expect("OK to unwrap");
    assert_eq!(meta.len(), 1 << 20);
    assert!(meta.blocks() >= 2048, "blocks {}", meta.blocks());
    assert!(read_file(&path).iter().all(|&b| b == 0));
    fallocate(&f, libc::FALLOC_FL_KEEP_SIZE, 1 << 20, 1 << 20).expect("OK to unwrap: keep size");
    let meta = fs::metadata(&path).expect("OK to unwrap");
    assert_eq!(meta.len(), 1 << 20, "KEEP_SIZE must not change the size");
    assert!(meta.blocks() >= 4096, "blocks {}", meta.blocks());
    // Data written into preallocated space reads back.
    f.write_all_at(b"inside", 4096)
        .expect("OK to unwrap: write");
    let mut buf = [0u8; 6];
    f.read_exact_at(&mut buf, 4096).expect("OK to unwrap: read");
    assert_eq!(&buf, b"inside");
    // Linux requires KEEP_SIZE with PUNCH_HOLE; COLLAPSE_RANGE is not implemented.
    assert_eq!(
        errno(fallocate(&f, libc::FALLOC_FL_PUNCH_HOLE, 0, 4096)),
        libc::EOPNOTSUPP
    );
    assert_eq!(
        errno(fallocate(&f, libc::FALLOC_FL_COLLAPSE_RANGE, 0, 4096)),
        libc::EOPNOTSUPP
    );
}

/// `stat --format='%s %b'` of `path`, asked of the file system: (size, 512-byte blocks).
fn size_and_blocks(path: &Path) -> (u64, u64) {
    let text = coreutils_stat(path, "%s %b");
    let mut fields = text.split(' ').map(|f| f.parse::<u64>());
    match (fields.next(), fields.next()) {
        (Some(Ok(size)), Some(Ok(blocks))) => (size, blocks),
        _ => panic!("unexpected stat output {text:?}"),
    }
}

#[test]
fn fallocate_punch_hole_and_zero_range_from_util_linux() {
    let m = mount!("fallocate_punch_hole_and_zero_range_from_util_linux");
    let path = m.path("f");
    let data: Vec<u8> = (0..40_960u32).map(|i| (i % 251) as u8 | 1).collect();
    write_file(&path, &data);
    let mut want = data.clone();
    assert_eq!(size_and_blocks(&path), (40_960, 80));
    // Blocks 2..=5 lie wholly inside [5000, 25000): they are freed.
    let (ok, err) = util_fallocate(&["-p", "-o", "5000", "-l", "20000"], &path);
    assert!(ok, "fallocate -p: {err}");
    want[5000..25_000].fill(0);
    assert_eq!(size_and_blocks(&path), (40_960, 48));
    assert!(read_file(&path) == want, "a punched range reads as zeros");
    // Zeroing past the end grows the file and allocates the range.
    let (ok, err) = util_fallocate(&["-z", "-o", "30000", "-l", "20000"], &path);
    assert!(ok, "fallocate -z: {err}");
    want[30_000..].fill(0);
    want.resize(50_000, 0);
    assert_eq!(size_and_blocks(&path), (50_000, 48 + 24));
    assert!(read_file(&path) == want, "a zeroed range reads as zeros");
    // With --keep-size the size stays.
    let (ok, err) = util_fallocate(&["-z", "-n", "-o", "0", "-l", "100000"], &path);
    assert!(ok, "fallocate -z -n: {err}");
    assert_eq!(size_and_blocks(&path).0, 50_000);
    assert!(read_file(&path).iter().all(|&b| b == 0));
    // Data written into the range afterwards reads back.
    let f = OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("OK to unwrap: open");
    f.write_all_at(b"after", 12_345)
        .expect("OK to unwrap: pwrite");
    drop(f);
    let back = read_file(&path);
    assert_eq!(&back[12_345..12_350], b"after");
}

#[test]
fn statx_reports_the_birth_time_kept_in_the_inode() {
    let mut m = mount!("statx_reports_the_birth_time_kept_in_the_inode");
    let path = m.path("born");
    write_file(&path, b"x");
    let (sec, nsec) = statx_btime(&path)
        .expect("OK to unwrap: statx")
        .expect("OK to unwrap: tidefs reports a birth time");
    assert!(sec > 0, "birth time {sec}");
    assert_eq!(coreutils_stat(&path, "%W"), sec.to_string());
    // Changing the other times leaves the birth time alone.
    utimens(&path, (1_000, 1), (2_000, 2)).expect("OK to unwrap: utimens");
    assert_eq!(
        statx_btime(&path).expect("OK to unwrap: statx"),
        Some((sec, nsec))
    );
    fs::create_dir(m.path("dir")).expect("OK to unwrap: mkdir");
    let dir_btime = statx_btime(&m.path("dir")).expect("OK to unwrap: statx");
    assert!(dir_btime.is_some_and(|(s, _)| s > 0));
    // The same instant the library reads from the inode's i_crtime.
    m.0.umount_ok();
    let (code, text) = e2fsck(&m.image);
    assert_eq!(code, 0, "e2fsck -fn:\n{text}");
    let options = tidefs::fs::MountOptions {
        read_only: true,
        ..tidefs::fs::MountOptions::default()
    };
    let fs = tidefs::fs::Fs::open(&m.image, &options).expect("OK to unwrap: open the image");
    let attr = fs
        .lookup(tidefs::fs::ROOT_INO, b"born")
        .expect("OK to unwrap: lookup");
    assert_eq!((attr.crtime.sec, attr.crtime.nsec), (sec, nsec));
    let dir = fs
        .lookup(tidefs::fs::ROOT_INO, b"dir")
        .expect("OK to unwrap: lookup");
    assert_eq!(Some((dir.crtime.sec, dir.crtime.nsec)), dir_btime);
}

/// Free inodes of the mount, from statvfs.
fn free_inodes(m: &Mount) -> u64 {
    statvfs(&m.mnt).expect("OK to unwrap: statvfs").f_ffree
}

#[test]
fn o_tmpfile_linked_appears_and_unlinked_leaves_nothing() {
    use std::os::fd::AsRawFd as _;
    let m = mount!("o_tmpfile_linked_appears_and_unlinked_leaves_nothing");
    fs::create_dir(m.path("d")).expect("OK to unwrap: mkdir");
    let tmp = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .mode(0o640)
        .open(m.path("d"))
        .expect("OK to unwrap: open O_TMPFILE");
    tmp.write_all_at(b"from a tmpfile", 0)
        .expect("OK to unwrap: write");
    let meta = tmp.metadata().expect("OK to unwrap: fstat");
    assert_eq!(meta.nlink(), 0);
    assert!(meta.is_file());
    assert_eq!(
        fs::read_dir(m.path("d"))
            .expect("OK to unwrap: readdir")
            .count(),
        0
    );
    let proc_link = format!("/proc/self/fd/{}", tmp.as_raw_fd());
    linkat_follow(Path::new(&proc_link), &m.path("d/named")).expect("OK to unwrap: linkat");
    drop(tmp);
    assert_eq!(read_file(&m.path("d/named")), b"from a tmpfile");
    let meta = fs::metadata(m.path("d/named")).expect("OK to unwrap: stat");
    assert_eq!(meta.nlink(), 1);
    assert_eq!(meta.mode() & 0o7777, 0o640);

    // Never linked: closing it frees the inode; the directory gains nothing.
    let before = free_inodes(&m);
    let tmp = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .mode(0o600)
        .open(m.path("d"))
        .expect("OK to unwrap: open O_TMPFILE");
    tmp.write_all_at(&[7u8; 3 * 4096], 0)
        .expect("OK to unwrap: write");
    assert_eq!(free_inodes(&m), before - 1);
    drop(tmp);
    // The kernel forgets the inode after close() returns.
    assert_eq!(
        settles(before, || free_inodes(&m)),
        before,
        "the unlinked tmpfile is freed at close"
    );
    let names: Vec<_> = fs::read_dir(m.path("d"))
        .expect("OK to unwrap: readdir")
        .map(|e| e.expect("OK to unwrap: entry").file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("named")]);
}

/// Goal: an unlinked file stays readable while open; unlink errors (ENOENT, EISDIR).
#[test]
fn unlink_and_open_unlinked_file() {
    let m = mount!("unlink_and_open_unlinked_file");
    let path = m.path("u");
    write_file(&path, b"still readable");
    let f = File::open(&path).expect("OK to unwrap: open");
    fs::remove_file(&path).expect("OK to unwrap: unlink");
    assert_eq!(errno(fs::metadata(&path)), libc::ENOENT);
    let mut text = String::new();
    (&f).read_to_string(&mut text).expect("OK to unwrap: read");
    assert_eq!(
        text, "still readable",
        "an open unlinked file stays readable"
    );
    drop(f);
    assert_eq!(errno(fs::remove_file(&path)), libc::ENOENT);
    fs::create_dir(m.path("d")).expect("OK to unwrap: mkdir");
    assert_eq!(errno(fs::remove_file(m.path("d"))), libc::EISDIR);
}

/// Free blocks of the mount, from statvfs.
fn free_blocks(m: &Mount) -> u64 {
    statvfs(&m.mnt).expect("OK to unwrap: statvfs").f_bfree
}

/// Polls `f` until it returns `want` or 10 s pass (the kernel forgets an inode a moment after
/// its last close or unlink returned); returns the last value.
fn settles(want: u64, f: impl Fn() -> u64) -> u64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut now = f();
    while now != want && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        now = f();
    }
    now
}

/// Goal: an inode lives exactly as long as the kernel may name it. Opens of existing files
/// never reach the daemon (FUSE_NO_OPEN_SUPPORT), so what holds an unlinked or renamed-over
/// file is the kernel's lookup, dropped by FORGET after the last close: the file stays
/// usable through its descriptor, its number is not reused meanwhile, and its inode and blocks
/// come back after the close (then e2fsck finds the image clean).
#[test]
fn inodes_live_while_the_kernel_holds_them() {
    let m = mount!("inodes_live_while_the_kernel_holds_them");
    let (inodes, blocks) = (free_inodes(&m), free_blocks(&m));
    write_file(&m.path("held"), &[1u8; 64 << 10]);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.path("held"))
        .expect("OK to unwrap: open");
    let held_ino = f.metadata().expect("OK to unwrap: fstat").ino();
    fs::remove_file(m.path("held")).expect("OK to unwrap: unlink");
    assert_eq!(free_inodes(&m), inodes - 1, "held while open");
    f.write_all_at(b"after unlink", 0)
        .expect("OK to unwrap: write");
    let mut back = [0u8; 12];
    f.read_exact_at(&mut back, 0).expect("OK to unwrap: read");
    assert_eq!(&back, b"after unlink");
    for i in 0..20 {
        write_file(&m.path(&format!("new{i}")), b"x");
        let ino = fs::metadata(m.path(&format!("new{i}")))
            .expect("OK to unwrap: stat")
            .ino();
        assert_ne!(ino, held_ino, "an inode still open was handed out again");
    }
    // Renamed over while open: the same.
    write_file(&m.path("over"), b"old contents");
    let g = File::open(m.path("over")).expect("OK to unwrap: open");
    write_file(&m.path("src"), b"new contents");
    fs::rename(m.path("src"), m.path("over")).expect("OK to unwrap: rename");
    let mut text = String::new();
    (&g).read_to_string(&mut text).expect("OK to unwrap: read");
    assert_eq!(text, "old contents");
    assert_eq!(read_file(&m.path("over")), b"new contents");
    drop(f);
    drop(g);
    for i in 0..20 {
        fs::remove_file(m.path(&format!("new{i}"))).expect("OK to unwrap: unlink");
    }
    fs::remove_file(m.path("over")).expect("OK to unwrap: unlink");
    assert_eq!(
        settles(inodes, || free_inodes(&m)),
        inodes,
        "inodes come back"
    );
    assert_eq!(
        settles(blocks, || free_blocks(&m)),
        blocks,
        "blocks come back"
    );
}

/// Goal: mkdir/rmdir keep link counts right and fail with ext4's errno (EEXIST, ENOTEMPTY, ENOTDIR,
/// ENOENT, ENAMETOOLONG); a 255-byte name works.
#[test]
fn mkdir_rmdir_and_their_errors() {
    let m = mount!("mkdir_rmdir_and_their_errors");
    let d = m.path("dir");
    fs::create_dir(&d).expect("OK to unwrap: mkdir");
    let meta = fs::metadata(&d).expect("OK to unwrap");
    assert!(meta.is_dir());
    assert_eq!(meta.nlink(), 2);
    let root_links = fs::metadata(&m.mnt).expect("OK to unwrap").nlink();
    fs::create_dir(d.join("sub")).expect("OK to unwrap: mkdir");
    assert_eq!(fs::metadata(&d).expect("OK to unwrap").nlink(), 3);
    assert_eq!(errno(fs::create_dir(&d)), libc::EEXIST);
    assert_eq!(errno(fs::remove_dir(&d)), libc::ENOTEMPTY);
    write_file(&m.path("file"), b"");
    assert_eq!(errno(fs::remove_dir(m.path("file"))), libc::ENOTDIR);
    assert_eq!(errno(fs::create_dir(m.path("file/x"))), libc::ENOTDIR);
    assert_eq!(errno(fs::create_dir(m.path("missing/x"))), libc::ENOENT);
    assert_eq!(errno(fs::remove_dir(m.path("missing"))), libc::ENOENT);
    fs::remove_dir(d.join("sub")).expect("OK to unwrap: rmdir");
    fs::remove_dir(&d).expect("OK to unwrap: rmdir");
    assert_eq!(
        fs::metadata(&m.mnt).expect("OK to unwrap").nlink(),
        root_links - 1
    );
    let long = "n".repeat(256);
    assert_eq!(errno(fs::create_dir(m.path(&long))), libc::ENAMETOOLONG);
    assert_eq!(errno(File::create(m.path(&long))), libc::ENAMETOOLONG);
    let max = "m".repeat(255);
    write_file(&m.path(&max), b"255 bytes is fine");
    assert_eq!(read_file(&m.path(&max)), b"255 bytes is fine");
}

/// Goal: rename over a file, across directories, of a directory (link counts, `..`), and its
/// errors.
#[test]
fn rename_over_existing_across_dirs_and_errors() {
    let m = mount!("rename_over_existing_across_dirs_and_errors");
    write_file(&m.path("a"), b"A");
    write_file(&m.path("b"), b"B");
    fs::rename(m.path("a"), m.path("b")).expect("OK to unwrap: rename over");
    assert_eq!(read_file(&m.path("b")), b"A");
    assert_eq!(errno(fs::metadata(m.path("a"))), libc::ENOENT);
    fs::create_dir_all(m.path("x/y")).expect("OK to unwrap: mkdir");
    fs::create_dir(m.path("z")).expect("OK to unwrap: mkdir");
    fs::rename(m.path("b"), m.path("x/y/b2")).expect("OK to unwrap: across dirs");
    assert_eq!(read_file(&m.path("x/y/b2")), b"A");
    // A directory moves with its contents; link counts of both parents follow.
    fs::rename(m.path("x/y"), m.path("z/y")).expect("OK to unwrap: move dir");
    assert_eq!(read_file(&m.path("z/y/b2")), b"A");
    assert_eq!(fs::metadata(m.path("x")).expect("OK to unwrap").nlink(), 2);
    assert_eq!(fs::metadata(m.path("z")).expect("OK to unwrap").nlink(), 3);
    // ".." of the moved directory is its new parent.
    assert_eq!(
        fs::metadata(m.path("z/y/..")).expect("OK to unwrap").ino(),
        fs::metadata(m.path("z")).expect("OK to unwrap").ino()
    );
    // A directory over an empty directory; not over a non-empty one; not onto a file.
    fs::create_dir(m.path("empty")).expect("OK to unwrap: mkdir");
    fs::rename(m.path("x"), m.path("empty")).expect("OK to unwrap: dir over empty dir");
    assert_eq!(
        errno(fs::rename(m.path("empty"), m.path("z"))),
        libc::ENOTEMPTY
    );
    write_file(&m.path("f"), b"");
    assert_eq!(
        errno(fs::rename(m.path("empty"), m.path("f"))),
        libc::ENOTDIR
    );
    assert_eq!(
        errno(fs::rename(m.path("f"), m.path("empty"))),
        libc::EISDIR
    );
    assert_eq!(
        errno(fs::rename(m.path("z"), m.path("z/y/inside"))),
        libc::EINVAL
    );
    assert_eq!(
        errno(fs::rename(m.path("nope"), m.path("f2"))),
        libc::ENOENT
    );
}

/// Goal: renameat2 RENAME_NOREPLACE and RENAME_EXCHANGE (file/file, file/directory) and their
/// errors.
#[test]
fn rename_noreplace_and_exchange() {
    let m = mount!("rename_noreplace_and_exchange");
    write_file(&m.path("a"), b"A");
    write_file(&m.path("b"), b"B");
    assert_eq!(
        errno(rename2(&m.path("a"), &m.path("b"), libc::RENAME_NOREPLACE)),
        libc::EEXIST
    );
    rename2(&m.path("a"), &m.path("c"), libc::RENAME_NOREPLACE).expect("OK to unwrap: new name");
    assert_eq!(read_file(&m.path("c")), b"A");
    fs::create_dir(m.path("d")).expect("OK to unwrap: mkdir");
    write_file(&m.path("d/inner"), b"I");
    rename2(&m.path("c"), &m.path("d/inner"), libc::RENAME_EXCHANGE).expect("OK to unwrap: xchg");
    assert_eq!(read_file(&m.path("c")), b"I");
    assert_eq!(read_file(&m.path("d/inner")), b"A");
    // Exchange a file with a directory.
    rename2(&m.path("b"), &m.path("d"), libc::RENAME_EXCHANGE).expect("OK to unwrap: xchg");
    assert!(fs::metadata(m.path("b")).expect("OK to unwrap").is_dir());
    assert_eq!(read_file(&m.path("b/inner")), b"A");
    assert_eq!(read_file(&m.path("d")), b"B");
    assert_eq!(
        errno(rename2(
            &m.path("c"),
            &m.path("missing"),
            libc::RENAME_EXCHANGE
        )),
        libc::ENOENT
    );
    assert_eq!(
        errno(rename2(
            &m.path("c"),
            &m.path("d"),
            libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE
        )),
        libc::EINVAL
    );
}

/// Goal: hard links share the inode and its data; link counts follow; EEXIST, EPERM on a directory,
/// ENOENT.
#[test]
fn hard_links_share_the_inode() {
    let m = mount!("hard_links_share_the_inode");
    write_file(&m.path("orig"), b"shared");
    fs::create_dir(m.path("d")).expect("OK to unwrap: mkdir");
    fs::hard_link(m.path("orig"), m.path("d/link")).expect("OK to unwrap: link");
    let a = fs::metadata(m.path("orig")).expect("OK to unwrap");
    let b = fs::metadata(m.path("d/link")).expect("OK to unwrap");
    assert_eq!(a.ino(), b.ino());
    assert_eq!(a.nlink(), 2);
    let f = OpenOptions::new()
        .write(true)
        .open(m.path("d/link"))
        .expect("OK to unwrap");
    f.write_all_at(b"SH", 0).expect("OK to unwrap: write");
    drop(f);
    assert_eq!(read_file(&m.path("orig")), b"SHared");
    fs::remove_file(m.path("orig")).expect("OK to unwrap: unlink");
    assert_eq!(
        fs::metadata(m.path("d/link"))
            .expect("OK to unwrap")
            .nlink(),
        1
    );
    assert_eq!(
        errno(fs::hard_link(m.path("d/link"), m.path("d/link"))),
        libc::EEXIST
    );
    assert_eq!(
        errno(fs::hard_link(m.path("d"), m.path("dlink"))),
        libc::EPERM
    );
    assert_eq!(
        errno(fs::hard_link(m.path("nope"), m.path("x"))),
        libc::ENOENT
    );
}

/// ext4 caps a file's hard links at 65 000.
#[test]
fn too_many_links_is_emlink() {
    let m = mount!("too_many_links_is_emlink", "256M", &[], &[]);
    write_file(&m.path("target"), b"");
    fs::create_dir(m.path("links")).expect("OK to unwrap: mkdir");
    let mut made = 1;
    let err = loop {
        match fs::hard_link(m.path("target"), m.path(&format!("links/{made}"))) {
            Ok(()) => made += 1,
            Err(e) => break e,
        }
        assert!(made <= 65_000, "more than 65 000 links were allowed");
    };
    assert_eq!(
        err.raw_os_error(),
        Some(libc::EMLINK),
        "after {made} links: {err}"
    );
    assert_eq!(made, 65_000);
    fs::remove_dir_all(m.path("links")).expect("OK to unwrap: cleanup");
}

/// Goal: symlinks in the inode (short), in a block (long, very long), dangling, and their errors.
#[test]
fn symlinks_short_and_long() {
    let m = mount!("symlinks_short_and_long");
    write_file(&m.path("target"), b"via link");
    std::os::unix::fs::symlink("target", m.path("short")).expect("OK to unwrap: symlink");
    assert_eq!(
        fs::read_link(m.path("short")).expect("OK to unwrap"),
        Path::new("target")
    );
    assert_eq!(read_file(&m.path("short")), b"via link");
    let meta = fs::symlink_metadata(m.path("short")).expect("OK to unwrap");
    assert!(meta.file_type().is_symlink());
    assert_eq!(meta.len(), 6);
    // Longer than the 60 bytes that fit in the inode: stored in a block.
    let long = format!("{}/target", "./".repeat(100));
    std::os::unix::fs::symlink(&long, m.path("long")).expect("OK to unwrap: symlink");
    assert_eq!(
        fs::read_link(m.path("long")).expect("OK to unwrap"),
        Path::new(&long)
    );
    assert_eq!(read_file(&m.path("long")), b"via link");
    let very_long = "a/".repeat(2000);
    std::os::unix::fs::symlink(&very_long, m.path("very_long")).expect("OK to unwrap: symlink");
    assert_eq!(
        fs::read_link(m.path("very_long")).expect("OK to unwrap"),
        Path::new(&very_long)
    );
    std::os::unix::fs::symlink("nowhere", m.path("dangling")).expect("OK to unwrap: symlink");
    assert_eq!(errno(fs::metadata(m.path("dangling"))), libc::ENOENT);
    assert_eq!(
        errno(std::os::unix::fs::symlink("x", m.path("short"))),
        libc::EEXIST
    );
    assert_eq!(errno(fs::read_link(m.path("target"))), libc::EINVAL);
}

/// Goal: mknod makes fifos and device nodes with the right type, mode and device number; EEXIST.
#[test]
fn mknod_fifo_char_block() {
    if !is_root() {
        skip("mknod_fifo_char_block", "device nodes need root");
        return;
    }
    let m = mount!("mknod_fifo_char_block");
    mknod(&m.path("fifo"), libc::S_IFIFO | 0o644, 0).expect("OK to unwrap: mkfifo");
    mknod(&m.path("chr"), libc::S_IFCHR | 0o600, makedev(1, 3)).expect("OK to unwrap: chr");
    mknod(&m.path("blk"), libc::S_IFBLK | 0o600, makedev(7, 200)).expect("OK to unwrap: blk");
    use std::os::unix::fs::FileTypeExt as _;
    let fifo = fs::symlink_metadata(m.path("fifo")).expect("OK to unwrap");
    assert!(fifo.file_type().is_fifo());
    assert_eq!(fifo.mode() & 0o7777, 0o644);
    let chr = fs::symlink_metadata(m.path("chr")).expect("OK to unwrap");
    assert!(chr.file_type().is_char_device());
    assert_eq!(chr.rdev(), makedev(1, 3));
    let blk = fs::symlink_metadata(m.path("blk")).expect("OK to unwrap");
    assert!(blk.file_type().is_block_device());
    assert_eq!(blk.rdev(), makedev(7, 200));
    assert_eq!(
        errno(mknod(&m.path("fifo"), libc::S_IFIFO | 0o644, 0)),
        libc::EEXIST
    );
}

/// Goal: chmod sets the mode and moves ctime; chown sets owners and clears set-user-id (root only).
#[test]
fn chmod_chown_and_ctime() {
    let m = mount!("chmod_chown_and_ctime");
    let path = m.path("f");
    write_file(&path, b"");
    let before = fs::metadata(&path).expect("OK to unwrap");
    std::thread::sleep(Duration::from_millis(20));
    set_mode(&path, 0o4751);
    let after = fs::metadata(&path).expect("OK to unwrap");
    assert_eq!(after.mode() & 0o7777, 0o4751);
    assert!(
        (after.ctime(), after.ctime_nsec()) > (before.ctime(), before.ctime_nsec()),
        "chmod must change ctime"
    );
    if need_root("chmod_chown_and_ctime", "chown to another owner needs root") {
        std::os::unix::fs::chown(&path, Some(1234), Some(5678)).expect("OK to unwrap: chown");
        let meta = fs::metadata(&path).expect("OK to unwrap");
        assert_eq!((meta.uid(), meta.gid()), (1234, 5678));
        // chown clears set-user-id.
        assert_eq!(meta.mode() & 0o4000, 0, "chown must clear S_ISUID");
        std::os::unix::fs::lchown(&path, None, Some(42)).expect("OK to unwrap: chgrp");
        assert_eq!(fs::metadata(&path).expect("OK to unwrap").gid(), 42);
    }
}

/// Goal: utimensat keeps nanoseconds, times before 1970, UTIME_NOW and UTIME_OMIT; a write moves
/// mtime.
#[test]
fn utimens_with_nanoseconds() {
    let m = mount!("utimens_with_nanoseconds");
    let path = m.path("t");
    write_file(&path, b"");
    utimens(
        &path,
        (1_000_000_000, 123_456_789),
        (1_500_000_000, 987_654_321),
    )
    .expect("OK to unwrap: utimensat");
    let meta = fs::metadata(&path).expect("OK to unwrap");
    assert_eq!(
        (meta.atime(), meta.atime_nsec()),
        (1_000_000_000, 123_456_789)
    );
    assert_eq!(
        (meta.mtime(), meta.mtime_nsec()),
        (1_500_000_000, 987_654_321)
    );
    // Before the epoch (ext4's extra epoch bits).
    utimens(&path, (-100, 5), (-1, 999_999_999)).expect("OK to unwrap: utimensat");
    let meta = fs::metadata(&path).expect("OK to unwrap");
    assert_eq!((meta.atime(), meta.atime_nsec()), (-100, 5));
    assert_eq!((meta.mtime(), meta.mtime_nsec()), (-1, 999_999_999));
    // UTIME_NOW for mtime, UTIME_OMIT for atime.
    utimens(&path, (0, libc::UTIME_OMIT), (0, libc::UTIME_NOW)).expect("OK to unwrap: now");
    let meta = fs::metadata(&path).expect("OK to unwrap");
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("OK to unwrap: after 1970")
        .as_secs();
    assert!(
        meta.mtime().abs_diff(now as i64) < 30,
        "mtime {}",
        meta.mtime()
    );
    assert_eq!((meta.atime(), meta.atime_nsec()), (-100, 5));
    // A write moves mtime and ctime forward.
    let before = fs::metadata(&path).expect("OK to unwrap");
    std::thread::sleep(Duration::from_millis(20));
    write_file(&path, b"x");
    let after = fs::metadata(&path).expect("OK to unwrap");
    assert!((after.mtime(), after.mtime_nsec()) > (before.mtime(), before.mtime_nsec()));
}

/// Goal: statvfs reports the geometry and free counts, and 4 MiB of data uses 1024 blocks and one
/// inode.
#[test]
fn statfs_reports_the_file_system() {
    let m = mount!("statfs_reports_the_file_system");
    let before = statvfs(&m.mnt).expect("OK to unwrap: statvfs");
    assert_eq!(before.f_bsize, 4096);
    assert_eq!(before.f_namemax, 255);
    assert!(
        before.f_blocks > 10_000 && before.f_blocks <= 16_384,
        "{}",
        before.f_blocks
    );
    assert!(before.f_bfree <= before.f_blocks && before.f_bavail <= before.f_bfree);
    assert!(before.f_files > 0 && before.f_ffree < before.f_files);
    let f = File::create(m.path("big")).expect("OK to unwrap: create");
    f.write_all_at(&vec![1u8; 4 << 20], 0)
        .expect("OK to unwrap: write");
    f.sync_all().expect("OK to unwrap: fsync");
    let after = statvfs(&m.mnt).expect("OK to unwrap: statvfs");
    assert!(
        before.f_bfree - after.f_bfree >= 1024,
        "4 MiB must use 1024 blocks: {} → {}",
        before.f_bfree,
        after.f_bfree
    );
    assert_eq!(before.f_ffree - after.f_ffree, 1);
}

/// Goal: xattrs in the user, trusted and security namespaces: create/replace flags, size probes,
/// ERANGE, ENODATA, empty and large values, listing, removal, xattrs on directories.
#[test]
fn xattrs_user_trusted_security() {
    let m = mount!("xattrs_user_trusted_security");
    let path = m.path("x");
    write_file(&path, b"");
    for name in ["user.color", "trusted.secret", "security.label"] {
        if name.starts_with("trusted.")
            && !need_root("xattrs_user_trusted_security", "trusted.* xattrs need root")
        {
            continue;
        }
        setxattr(&path, name, b"value-1", 0).expect("OK to unwrap: setxattr");
        assert_eq!(getxattr(&path, name, 64).expect("OK to unwrap"), b"value-1");
        assert_eq!(
            errno(setxattr(&path, name, b"v", libc::XATTR_CREATE)),
            libc::EEXIST
        );
        setxattr(&path, name, b"value-two", libc::XATTR_REPLACE).expect("OK to unwrap: replace");
        // Size probe, exact buffer, short buffer.
        assert_eq!(getxattr(&path, name, 0).expect("OK to unwrap").len(), 9);
        assert_eq!(
            getxattr(&path, name, 9).expect("OK to unwrap"),
            b"value-two"
        );
        assert_eq!(errno(getxattr(&path, name, 3)), libc::ERANGE);
    }
    assert_eq!(
        errno(setxattr(&path, "user.absent", b"v", libc::XATTR_REPLACE)),
        libc::ENODATA
    );
    assert_eq!(errno(getxattr(&path, "user.absent", 64)), libc::ENODATA);
    assert_eq!(
        errno(setxattr(
            &path,
            "user.both",
            b"v",
            libc::XATTR_CREATE | libc::XATTR_REPLACE
        )),
        libc::EINVAL
    );
    // An empty value and a large one (beyond the in-inode space).
    setxattr(&path, "user.empty", b"", 0).expect("OK to unwrap: empty value");
    assert_eq!(
        getxattr(&path, "user.empty", 16).expect("OK to unwrap"),
        b""
    );
    let big = vec![b'z'; 3000];
    setxattr(&path, "user.big", &big, 0).expect("OK to unwrap: big value");
    assert_eq!(
        getxattr(&path, "user.big", 4096).expect("OK to unwrap"),
        big
    );
    let names: HashSet<String> = listxattr(&path)
        .expect("OK to unwrap")
        .into_iter()
        .collect();
    for name in ["user.color", "security.label", "user.empty", "user.big"] {
        assert!(names.contains(name), "{name} missing from {names:?}");
    }
    removexattr(&path, "user.color").expect("OK to unwrap: removexattr");
    assert_eq!(errno(getxattr(&path, "user.color", 64)), libc::ENODATA);
    assert_eq!(errno(removexattr(&path, "user.color")), libc::ENODATA);
    // Directories carry xattrs too.
    fs::create_dir(m.path("d")).expect("OK to unwrap: mkdir");
    setxattr(&m.path("d"), "user.dir", b"yes", 0).expect("OK to unwrap: dir xattr");
    assert_eq!(
        getxattr(&m.path("d"), "user.dir", 8).expect("OK to unwrap"),
        b"yes"
    );
}

/// Goal: readdir cookies stay valid while the directory changes: no entry is returned twice,
/// and every entry that exists from start to end is returned.
#[test]
fn readdir_while_the_directory_changes() {
    let m = mount!("readdir_while_the_directory_changes");
    let dir = m.path("d");
    fs::create_dir(&dir).expect("OK to unwrap: mkdir");
    for i in 0..2000 {
        write_file(&dir.join(format!("stable-{i:04}")), b"");
    }
    for i in 0..500 {
        write_file(&dir.join(format!("doomed-{i:04}")), b"");
    }
    let mut seen = HashSet::new();
    let mut iter = fs::read_dir(&dir).expect("OK to unwrap: opendir");
    for _ in 0..300 {
        let entry = iter
            .next()
            .expect("OK to unwrap: entries left")
            .expect("OK to unwrap");
        assert!(
            seen.insert(entry.file_name()),
            "duplicate {:?}",
            entry.file_name()
        );
    }
    // Change the directory in the middle of the listing.
    for i in 0..500 {
        fs::remove_file(dir.join(format!("doomed-{i:04}"))).expect("OK to unwrap: unlink");
    }
    for i in 0..1000 {
        write_file(&dir.join(format!("new-{i:04}")), b"");
    }
    for entry in iter {
        let entry = entry.expect("OK to unwrap: readdir");
        assert!(
            seen.insert(entry.file_name()),
            "duplicate {:?}",
            entry.file_name()
        );
    }
    for i in 0..2000 {
        let name = std::ffi::OsString::from(format!("stable-{i:04}"));
        assert!(seen.contains(&name), "stable-{i:04} was skipped");
    }
    // A fresh listing shows exactly the current contents.
    let names: HashSet<_> = fs::read_dir(&dir)
        .expect("OK to unwrap")
        .map(|e| e.expect("OK to unwrap").file_name())
        .collect();
    assert_eq!(names.len(), 3000);
}

/// Goal: running out of blocks and of inodes gives ENOSPC, freed space is usable again, and the
/// image is clean by e2fsck afterwards (checked when the mount is dropped).
#[test]
fn enospc_on_a_small_image_leaves_it_consistent() {
    let m = mount!(
        "enospc_on_a_small_image_leaves_it_consistent",
        "16M",
        &[],
        &[]
    );
    let chunk = vec![7u8; 1 << 20];
    let mut f = File::create(m.path("fill")).expect("OK to unwrap: create");
    let mut written = 0usize;
    let err = loop {
        match f.write(&chunk) {
            Ok(n) => written += n,
            Err(e) => break e,
        }
        assert!(written < 64 << 20, "wrote more than the image holds");
    };
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    drop(f);
    // Freeing space makes it usable again.
    fs::remove_file(m.path("fill")).expect("OK to unwrap: unlink");
    write_file(&m.path("after"), &chunk);
    assert!(read_file(&m.path("after")) == chunk);
    // Inodes run out too (16 MiB has 1024 inodes).
    fs::create_dir(m.path("many")).expect("OK to unwrap: mkdir");
    let mut made = 0;
    let err = loop {
        match File::create(m.path(&format!("many/{made}"))) {
            Ok(_) => made += 1,
            Err(e) => break e,
        }
        assert!(made < 100_000, "too many inodes for a 16 MiB image");
    };
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    assert!(made > 900, "only {made} inodes before ENOSPC");
    fs::remove_file(m.path("many/0")).expect("OK to unwrap: unlink");
    write_file(&m.path("many/again"), b"an inode was freed");
}

/// Goal: a file with data at 1 TiB stays sparse (few blocks), and its hole reads as zeros.
#[test]
fn sparse_file_at_one_tebibyte() {
    let m = mount!("sparse_file_at_one_tebibyte");
    let path = m.path("sparse");
    let f = OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(&path)
        .expect("OK to unwrap: create");
    let tib: u64 = 1 << 40;
    f.write_all_at(b"far away", tib)
        .expect("OK to unwrap: pwrite at 1 TiB");
    f.write_all_at(b"near", 0)
        .expect("OK to unwrap: pwrite at 0");
    f.sync_all().expect("OK to unwrap: fsync");
    let meta = fs::metadata(&path).expect("OK to unwrap");
    assert_eq!(meta.len(), tib + 8);
    assert!(
        meta.blocks() <= 64,
        "sparse file uses {} sectors",
        meta.blocks()
    );
    let mut buf = [1u8; 8];
    f.read_exact_at(&mut buf, tib).expect("OK to unwrap: read");
    assert_eq!(&buf, b"far away");
    f.read_exact_at(&mut buf, tib / 2)
        .expect("OK to unwrap: read hole");
    assert_eq!(buf, [0; 8]);
    f.read_exact_at(&mut buf[..4], 0)
        .expect("OK to unwrap: read");
    assert_eq!(&buf[..4], b"near");
}

/// Goal: a directory of 100 000 entries works: every entry is created, found by lookup and
/// listed once. (The lookup time is printed for the reader, never asserted.)
#[test]
fn directory_of_100_000_entries() {
    let m = mount!(
        "directory_of_100_000_entries",
        "1G",
        &["--inodes", "131072"],
        &[]
    );
    let dir = m.path("big");
    fs::create_dir(&dir).expect("OK to unwrap: mkdir");
    for i in 0..100_000 {
        File::create(dir.join(format!("entry-{i:06}")))
            .unwrap_or_else(|e| panic!("create entry-{i:06}: {e}"));
    }
    let start = std::time::Instant::now();
    for i in (0..100_000).step_by(1000) {
        let meta = fs::metadata(dir.join(format!("entry-{i:06}")))
            .unwrap_or_else(|e| panic!("lookup entry-{i:06}: {e}"));
        assert!(meta.is_file());
    }
    eprintln!(
        "100 lookups in a 100 000-entry directory: {:?}",
        start.elapsed()
    );
    assert_eq!(errno(fs::metadata(dir.join("entry-100000"))), libc::ENOENT);
    let count = fs::read_dir(&dir).expect("OK to unwrap").count();
    assert_eq!(count, 100_000);
}

/// Goal: a tree 200 directories deep is created, walked to the bottom and removed.
#[test]
fn deep_tree_of_depth_200() {
    let m = mount!("deep_tree_of_depth_200");
    let mut path = m.path("");
    for level in 0..200 {
        path.push(format!("d{level}"));
    }
    fs::create_dir_all(&path).expect("OK to unwrap: mkdir -p");
    write_file(&path.join("leaf"), b"at the bottom");
    assert_eq!(read_file(&path.join("leaf")), b"at the bottom");
    let mut depth = 0;
    let mut walk = m.path("d0");
    while let Some(entry) = fs::read_dir(&walk)
        .expect("OK to unwrap")
        .map(|e| e.expect("OK to unwrap"))
        .find(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
    {
        walk = entry.path();
        depth += 1;
    }
    assert_eq!(depth, 199);
    fs::remove_dir_all(m.path("d0")).expect("OK to unwrap: rm -r");
}

/// Goal: files and directories created in a set-gid directory take its group, and
/// subdirectories inherit the set-gid bit.
#[test]
fn setgid_directory_inheritance() {
    if !is_root() {
        skip("setgid_directory_inheritance", "needs root to chown");
        return;
    }
    let m = mount!("setgid_directory_inheritance");
    let dir = m.path("shared");
    fs::create_dir(&dir).expect("OK to unwrap: mkdir");
    std::os::unix::fs::chown(&dir, Some(0), Some(4321)).expect("OK to unwrap: chown");
    set_mode(&dir, 0o2775);
    write_file(&dir.join("file"), b"");
    fs::create_dir(dir.join("sub")).expect("OK to unwrap: mkdir");
    let file = fs::metadata(dir.join("file")).expect("OK to unwrap");
    assert_eq!(file.gid(), 4321);
    let sub = fs::metadata(dir.join("sub")).expect("OK to unwrap");
    assert_eq!(sub.gid(), 4321);
    assert_ne!(sub.mode() & 0o2000, 0, "subdirectory must inherit S_ISGID");
    // Outside the set-gid directory: the creator's group.
    write_file(&m.path("plain"), b"");
    assert_eq!(
        fs::metadata(m.path("plain")).expect("OK to unwrap").gid(),
        0
    );
}

/// Goal: in a sticky directory only the owner of a file (or of the directory, or root) may
/// remove or rename it.
#[test]
fn sticky_directory_protects_other_users_files() {
    let m = mount_for_other_users!(
        "sticky_directory_protects_other_users_files",
        "needs root to switch users"
    );
    let dir = m.path("tmp");
    fs::create_dir(&dir).expect("OK to unwrap: mkdir");
    set_mode(&dir, 0o1777);
    let d = dir.display();
    let out = run_as(1001, 1001, &format!("echo mine > {d}/alice && echo ok"));
    assert!(stdout(&out).contains("ok"), "{}", stderr(&out));
    assert_eq!(
        fs::metadata(dir.join("alice")).expect("OK to unwrap").uid(),
        1001
    );
    let out = run_as(1002, 1002, &format!("rm -f {d}/alice"));
    assert!(
        !out.status.success(),
        "another user removed a file in a sticky dir"
    );
    assert!(dir.join("alice").exists());
    let out = run_as(1002, 1002, &format!("mv {d}/alice {d}/stolen"));
    assert!(
        !out.status.success(),
        "another user renamed a file in a sticky dir"
    );
    let out = run_as(1001, 1001, &format!("rm {d}/alice && echo ok"));
    assert!(stdout(&out).contains("ok"), "{}", stderr(&out));
    assert!(!dir.join("alice").exists());
    // Without the sticky bit, anyone with write access may remove.
    set_mode(&dir, 0o777);
    run_as(1001, 1001, &format!("echo mine > {d}/bob"));
    let out = run_as(1002, 1002, &format!("rm -f {d}/bob && echo ok"));
    assert!(stdout(&out).contains("ok"), "{}", stderr(&out));
}

/// Goal: a name looked up while missing (which the kernel caches as a negative entry) is
/// seen at once when it is created, renamed to, linked, made a directory, symlink or node,
/// and missing again once removed. Method: stat each name before and after each change.
#[test]
fn missing_names_appear_and_vanish_at_once() {
    let m = mount!("missing_names_appear_and_vanish_at_once");
    let missing = |name: &str| {
        assert_eq!(
            fs::metadata(m.path(name))
                .map_err(|e| e.raw_os_error())
                .err(),
            Some(Some(libc::ENOENT)),
            "{name} must be missing"
        );
    };
    let present = |name: &str| {
        fs::symlink_metadata(m.path(name)).unwrap_or_else(|e| panic!("{name} must exist: {e}"));
    };
    for name in ["f", "moved", "linked", "d", "s", "fifo", "later"] {
        missing(name);
        missing(name);
    }
    write_file(&m.path("f"), b"x");
    present("f");
    fs::rename(m.path("f"), m.path("moved")).expect("OK to unwrap: rename");
    missing("f");
    present("moved");
    fs::hard_link(m.path("moved"), m.path("linked")).expect("OK to unwrap: link");
    present("linked");
    fs::create_dir(m.path("d")).expect("OK to unwrap: mkdir");
    present("d");
    std::os::unix::fs::symlink("moved", m.path("s")).expect("OK to unwrap: symlink");
    present("s");
    let status = std::process::Command::new("mkfifo")
        .arg(m.path("fifo"))
        .status()
        .expect("OK to unwrap: mkfifo");
    assert!(status.success());
    present("fifo");
    for name in ["moved", "linked", "s", "fifo"] {
        fs::remove_file(m.path(name)).expect("OK to unwrap: unlink");
        missing(name);
    }
    fs::remove_dir(m.path("d")).expect("OK to unwrap: rmdir");
    missing("d");
    // Created again under a name that was looked up, removed and looked up again.
    write_file(&m.path("moved"), b"again");
    assert_eq!(read_file(&m.path("moved")), b"again");
    missing("later");
}

/// Goal: names and attributes the kernel was given stay valid in its caches (nothing changes
/// them behind its back), so looking at them again later costs the daemon nothing, and a
/// change made through the mount is still seen at once. Method: stat names and a directory,
/// wait past a second (the old validity), stat them again and count the LOOKUP and GETATTR
/// requests the daemon received; then change a file and see the change.
#[test]
fn cached_names_and_attributes_stay_valid() {
    let m = mount!("cached_names_and_attributes_stay_valid");
    fs::create_dir(m.path("d")).expect("OK to unwrap: mkdir");
    for i in 0..20 {
        write_file(&m.path(&format!("d/f{i}")), b"x");
    }
    let look = || {
        for i in 0..20 {
            let meta = fs::metadata(m.path(&format!("d/f{i}"))).expect("OK to unwrap: stat");
            assert_eq!(meta.len(), 1);
        }
        fs::metadata(m.path("d")).expect("OK to unwrap: stat of the directory");
        assert!(fs::metadata(m.path("d/missing")).is_err());
    };
    look();
    let asked = |m: &Mount| {
        let requests = m.stats()["fuse_requests"].clone();
        let count = |kind: &str| requests[kind].as_u64().unwrap_or(0);
        (count("LOOKUP"), count("GETATTR"))
    };
    let before = asked(&m);
    std::thread::sleep(Duration::from_millis(1500));
    look();
    assert_eq!(
        asked(&m),
        before,
        "the kernel asked again for what it was told"
    );
    // A change through the mount drops what it makes stale.
    write_file(&m.path("d/f3"), b"longer");
    assert_eq!(fs::metadata(m.path("d/f3")).expect("stat").len(), 6);
    fs::remove_file(m.path("d/f4")).expect("OK to unwrap: unlink");
    assert!(fs::metadata(m.path("d/f4")).is_err());
}

/// Goal: the kernel keeps a symbolic link's target (FUSE_CACHE_SYMLINKS): paths through a
/// link cost one READLINK, not one per resolution, and a link replaced under the same name
/// shows its new target at once. Method: resolve a path through a link many times and count
/// the READLINK requests; replace the link and read its target again.
#[test]
fn symlink_targets_are_cached_by_the_kernel() {
    let m = mount!("symlink_targets_are_cached_by_the_kernel");
    fs::create_dir(m.path("real")).expect("OK to unwrap: mkdir");
    write_file(&m.path("real/f"), b"through the link");
    std::os::unix::fs::symlink("real", m.path("link")).expect("OK to unwrap: symlink");
    let readlinks = |m: &Mount| m.stats()["fuse_requests"]["READLINK"].as_u64().unwrap_or(0);
    let before = readlinks(&m);
    for _ in 0..50 {
        assert_eq!(read_file(&m.path("link/f")), b"through the link");
        assert_eq!(
            fs::read_link(m.path("link")).expect("OK to unwrap: readlink"),
            std::path::Path::new("real")
        );
    }
    let asked = readlinks(&m) - before;
    assert!(asked <= 1, "{asked} READLINK requests for one link");
    fs::remove_file(m.path("link")).expect("OK to unwrap: unlink");
    fs::create_dir(m.path("other")).expect("OK to unwrap: mkdir");
    write_file(&m.path("other/f"), b"the new target");
    std::os::unix::fs::symlink("other", m.path("link")).expect("OK to unwrap: symlink");
    assert_eq!(read_file(&m.path("link/f")), b"the new target");
    assert_eq!(
        fs::read_link(m.path("link")).expect("OK to unwrap: readlink"),
        std::path::Path::new("other")
    );
}

/// Goal: `st_blocks` is right after changes the kernel does not expect to move it, although
/// the kernel keeps attributes for a day: a commit whose write-back grows a file's extent tree
/// by a block, and an extended attribute that moves out of the inode into a block of its own.
/// Method: a file of 10 separate one-block extents (more than the inode holds: a leaf block at
/// write-back), stat before and after `fsync`; a 2000-byte attribute set and removed, stat
/// after each.
#[test]
fn st_blocks_follows_changes_behind_the_kernel() {
    let m = mount!("st_blocks_follows_changes_behind_the_kernel");
    let path = m.path("sparse");
    let f = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(&path)
        .expect("OK to unwrap: create");
    for k in 0..10u64 {
        f.write_all_at(&[b'x'; 4096], k * 2 * 4096)
            .expect("OK to unwrap: write");
    }
    let blocks = |p: &Path| fs::metadata(p).expect("OK to unwrap: stat").blocks();
    // Ten data blocks, counted from the writes on; asked twice so the kernel holds them.
    assert_eq!(blocks(&path), 80);
    assert_eq!(blocks(&path), 80);
    f.sync_all().expect("OK to unwrap: fsync");
    assert_eq!(
        blocks(&path),
        88,
        "the extent tree's leaf block after write-back"
    );
    let big = vec![b'v'; 2000];
    setxattr(&path, "user.big", &big, 0).expect("OK to unwrap: setxattr");
    assert_eq!(blocks(&path), 96, "the attribute block");
    removexattr(&path, "user.big").expect("OK to unwrap: removexattr");
    assert_eq!(blocks(&path), 88, "the attribute block freed");
}

/// Goal: a write by a non-root user clears set-user-id and set-group-id (with group exec), as
/// ext4 does; root's write keeps them.
#[test]
fn setid_bits_are_cleared_on_write_by_non_root() {
    let m = mount_for_other_users!(
        "setid_bits_are_cleared_on_write_by_non_root",
        "needs root to switch users"
    );
    let path = m.path("prog");
    write_file(&path, b"#!/bin/sh\n");
    set_mode(&path, 0o6777);
    // Root writing keeps the bits.
    let mut f = OpenOptions::new()
        .append(true)
        .open(&path)
        .expect("OK to unwrap: open");
    f.write_all(b"# root\n").expect("OK to unwrap: write");
    drop(f);
    assert_eq!(mode_of(&path) & 0o7777, 0o6777);
    let out = run_as(
        1001,
        1001,
        &format!("echo '# user' >> {} && echo ok", path.display()),
    );
    assert!(stdout(&out).contains("ok"), "{}", stderr(&out));
    assert_eq!(mode_of(&path) & 0o6000, 0, "mode {:o}", mode_of(&path));
    assert_eq!(mode_of(&path) & 0o777, 0o777);
    // Truncation by a non-owner clears them too.
    set_mode(&path, 0o6777);
    let out = run_as(1001, 1001, &format!(": > {} && echo ok", path.display()));
    assert!(stdout(&out).contains("ok"), "{}", stderr(&out));
    assert_eq!(mode_of(&path) & 0o6000, 0, "mode {:o}", mode_of(&path));
}

/// File capabilities granting `cap_net_raw` (effective, permitted): a `vfs_cap_data` of
/// revision 2, as `setcap cap_net_raw+ep` writes it.
const NET_RAW_CAPS: [u8; 20] = [
    0x01, 0x00, 0x00, 0x02, 0x00, 0x20, 0x00, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
];

/// Goal: with FUSE_HANDLE_KILLPRIV_V2 (the kernel asks the file system to drop set-ID bits,
/// and stops asking it for `security.capability` before every write) the mount still drops
/// privileges as ext4 does: any write, truncate or change of owner drops
/// `security.capability`, even root's; a change of owner drops set-user-ID and set-group-ID;
/// a write by another user keeps set-group-ID when the group may not execute the file.
/// (The library's own part is checked without the kernel in `tidefs/tests/library_basic.rs`.)
#[test]
fn capabilities_and_setid_bits_are_killed_by_the_file_system() {
    let m = mount_for_other_users!(
        "capabilities_and_setid_bits_are_killed_by_the_file_system",
        "needs root to set file capabilities and switch users"
    );
    let path = m.path("prog");
    write_file(&path, b"#!/bin/sh\n");
    let caps = |p: &Path| getxattr(p, "security.capability", 64).ok();
    let give_caps = |p: &Path| {
        setxattr(p, "security.capability", &NET_RAW_CAPS, 0).expect("OK to unwrap: set caps");
        assert_eq!(caps(p).as_deref(), Some(&NET_RAW_CAPS[..]));
    };
    // Root's write drops the capabilities.
    give_caps(&path);
    let mut f = OpenOptions::new()
        .append(true)
        .open(&path)
        .expect("OK to unwrap: open");
    f.write_all(b"# root\n").expect("OK to unwrap: write");
    drop(f);
    assert_eq!(caps(&path), None, "a write must remove security.capability");
    // So does a truncate, and a change of owner, which also drops the set-ID bits.
    give_caps(&path);
    OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("OK to unwrap: open")
        .set_len(3)
        .expect("OK to unwrap: truncate");
    assert_eq!(
        caps(&path),
        None,
        "a truncate must remove security.capability"
    );
    give_caps(&path);
    set_mode(&path, 0o6755);
    std::os::unix::fs::chown(&path, Some(1001), Some(1001)).expect("OK to unwrap: chown");
    assert_eq!(caps(&path), None, "chown must remove security.capability");
    assert_eq!(mode_of(&path) & 0o7777, 0o755, "mode {:o}", mode_of(&path));
    // Set-group-ID without group execute is not a set-ID program: another user's write keeps
    // it, and clears set-user-ID.
    set_mode(&path, 0o6767);
    let out = run_as(
        1002,
        1002,
        &format!("echo '# user' >> {} && echo ok", path.display()),
    );
    assert!(stdout(&out).contains("ok"), "{}", stderr(&out));
    assert_eq!(mode_of(&path) & 0o7777, 0o2767, "mode {:o}", mode_of(&path));
    // Extended attributes other than the capabilities stay through all of it.
    setxattr(&path, "user.keep", b"1", 0).expect("OK to unwrap: setxattr");
    write_file(&path, b"new\n");
    assert_eq!(getxattr(&path, "user.keep", 8).expect("OK to unwrap"), b"1");
}

/// Goal: permission checks for another user (the kernel's, with default_permissions).
#[test]
fn permissions_are_enforced_for_other_users() {
    let m = mount_for_other_users!(
        "permissions_are_enforced_for_other_users",
        "needs root to switch users"
    );
    let path = m.path("private");
    write_file(&path, b"secret");
    set_mode(&path, 0o600);
    let out = run_as(1001, 1001, &format!("cat {}", path.display()));
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("Permission denied"),
        "{}",
        stderr(&out)
    );
    let out = run_as(1001, 1001, &format!("chmod 777 {}", path.display()));
    assert!(!out.status.success(), "a non-owner changed the mode");
    let out = run_as(1001, 1001, &format!("touch {}/newfile", m.mnt.display()));
    assert!(
        !out.status.success(),
        "root dir is 0755: others cannot create"
    );
}

/// Goal: what fdatasync, fsync and a directory fsync promise is on disk after a crash: file
/// data, a new name in a new directory, and a rename that replaced a file.
/// Method: make the promises through the mount, SIGKILL the daemon once the last fsync has
/// returned, replay the journal with `tidefs fsck`, and read the image through the library
/// (never the live mount, whose cache would answer whatever reached the disk).
#[test]
fn fsync_and_fdatasync_and_directory_fsync() {
    let mut m = mount!("fsync_and_fdatasync_and_directory_fsync");
    let mut f = File::create(m.path("durable")).expect("OK to unwrap: create");
    f.write_all(b"record 1\n").expect("OK to unwrap: write");
    f.sync_data().expect("OK to unwrap: fdatasync");
    f.write_all(b"record 2\n").expect("OK to unwrap: write");
    f.sync_all().expect("OK to unwrap: fsync");
    drop(f);
    // A new file in a new directory: fsync the file, its directory and the root.
    fs::create_dir(m.path("d")).expect("OK to unwrap: mkdir");
    let mut f = File::create(m.path("d/new")).expect("OK to unwrap: create");
    f.write_all(b"a new name").expect("OK to unwrap: write");
    f.sync_all().expect("OK to unwrap: fsync");
    drop(f);
    File::open(m.path("d"))
        .and_then(|d| d.sync_all())
        .expect("OK to unwrap: fsync dir");
    // Rename-replace: the new content under the old name, made durable by the directory fsync.
    write_file(&m.path("config"), b"old config");
    File::open(&m.mnt)
        .and_then(|d| d.sync_all())
        .expect("OK to unwrap: fsync root");
    let mut f = File::create(m.path("config.tmp")).expect("OK to unwrap: create");
    f.write_all(b"new config").expect("OK to unwrap: write");
    f.sync_all().expect("OK to unwrap: fsync");
    drop(f);
    fs::rename(m.path("config.tmp"), m.path("config")).expect("OK to unwrap: rename");
    File::open(&m.mnt)
        .and_then(|d| d.sync_all())
        .expect("OK to unwrap: fsync root");

    m.crash();
    let fs = m.recover();
    assert_eq!(
        lib_read(&fs, "durable").as_deref(),
        Some(&b"record 1\nrecord 2\n"[..])
    );
    assert_eq!(lib_read(&fs, "d/new").as_deref(), Some(&b"a new name"[..]));
    assert_eq!(lib_read(&fs, "config").as_deref(), Some(&b"new config"[..]));
    assert_eq!(
        lib_read(&fs, "config.tmp"),
        None,
        "the rename's old name is back"
    );
}

/// Goal: many threads writing and fdatasyncing at once are all served, and every record whose
/// fdatasync returned is on disk after a crash, byte for byte.
/// Method: 16 threads append 50 numbered 125-byte records each with fdatasync after each; then
/// SIGKILL the daemon, replay with `tidefs fsck`, and read every log through the library.
#[test]
fn concurrent_appends_with_fdatasync() {
    let mut m = mount!("concurrent_appends_with_fdatasync");
    append_storm(&m, 16, 50, |f, _| f.sync_data());
    m.crash();
    check_append_storm(&m.recover(), 16, 50);
}

/// Goal: the kernel's own attribute requests (a size refresh before a read past the end it
/// knows) do not count as a look at the file's times, so a rewrite after one keeps the coarse
/// mtime and its fsync needs no commit, as on the kernel's ext4 (SQLite's rollback journal
/// does exactly this); while a `stat` in between still makes the next write's mtime newer than
/// what it showed. Method: 50 rounds of rewrite of the first bytes and fsync, then 50 with a
/// read past the end before each rewrite, counting commits with `tidefs stats`: the reads may
/// not make every rewrite commit (a busy machine makes both loops commit more, as the coarse
/// clock ticks between rounds); then rounds with an `fstat` between the read and the rewrite,
/// comparing the mtime before and after.
#[test]
fn reads_past_the_end_do_not_count_as_looks_at_the_times() {
    let m = mount!("reads_past_the_end_do_not_count_as_looks_at_the_times");
    let path = m.path("journal");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .expect("OK to unwrap: create");
    f.write_all_at(&[b'x'; 8720], 0)
        .expect("OK to unwrap: write");
    f.sync_all().expect("OK to unwrap: fsync");
    let commits = || m.stats()["commits"].as_u64().expect("commits is a number");
    let mut buf = [0u8; 8];
    let rounds = 50;
    // The rewrites alone: they commit only when the coarse clock (a 4 ms tick) moved on since
    // the last one, which depends on how busy the machine is.
    let before = commits();
    for _ in 0..rounds {
        f.write_all_at(b"header", 0).expect("OK to unwrap: rewrite");
        f.sync_all().expect("OK to unwrap: fsync");
    }
    let alone = commits() - before;
    // The same with a read past the end before each: fewer commits than rounds.
    let before = commits();
    for _ in 0..rounds {
        assert_eq!(f.read_at(&mut buf, 9216).expect("OK to unwrap: read"), 0);
        f.write_all_at(b"header", 0).expect("OK to unwrap: rewrite");
        f.sync_all().expect("OK to unwrap: fsync");
    }
    let spent = commits() - before;
    // Were each refresh a look, every rewrite would commit: one commit per round at least.
    // Without it, rounds within one tick of the coarse clock share its mtime; how many do
    // depends on the machine's load (27 of 50 committed once with three test runs sharing two
    // cores, 13 without the reads), so only the every-round signature is a failure.
    assert!(
        spent < rounds,
        "{spent} commits for {rounds} rewrites after reads past the end, {alone} without the reads"
    );
    for _ in 0..20 {
        assert_eq!(f.read_at(&mut buf, 9216).expect("OK to unwrap: read"), 0);
        let seen = f
            .metadata()
            .expect("OK to unwrap: fstat")
            .modified()
            .unwrap();
        f.write_all_at(b"header", 0).expect("OK to unwrap: rewrite");
        let after = fs::metadata(&path)
            .expect("OK to unwrap: stat")
            .modified()
            .unwrap();
        assert!(after > seen, "a write after a stat moves the mtime forward");
    }
}
