//! Helpers shared by the library's integration tests: images made by the real `mkfs.ext4`,
//! and the real `e2fsck -fn` as the consistency oracle.
//!
//! Skip rule: a test that lacks root, loop devices or e2fsprogs goes through [`skip`], which
//! prints `skipped <test>: <why>` outside CI and fails the test under `TIDEFS_CI=1`.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub use tidefs::test_support::{current_test, skip};

/// Whether e2fsprogs is installed; if not, the test skips through [`skip`] (fails in CI).
pub fn have_e2fsprogs() -> bool {
    let ok = Command::new("mkfs.ext4").arg("-V").output().is_ok()
        && Command::new("e2fsck").arg("-V").output().is_ok();
    if !ok {
        skip(&current_test(), "mkfs.ext4/e2fsck not installed");
    }
    ok
}

/// Makes an ext4 image of `size_mb` MiB with the feature set tidefs supports.
pub fn mkimage(dir: &Path, name: &str, size_mb: u64, extra: &[&str]) -> PathBuf {
    let mut args = vec![
        "-b",
        "4096",
        "-O",
        "metadata_csum,64bit",
        "-E",
        "lazy_itable_init=0,lazy_journal_init=0",
    ];
    args.extend_from_slice(extra);
    mkfs_raw(dir, name, size_mb, &args)
}

/// The bytes of a fresh 16 MiB image from [`mkimage`], made once per test binary (every call
/// returns the first image, whatever `name`), for tests that mount many copies in memory;
/// `None` without e2fsprogs.
pub fn small_image_bytes(name: &str) -> Option<&'static Vec<u8>> {
    static IMAGE: std::sync::OnceLock<Option<Vec<u8>>> = std::sync::OnceLock::new();
    IMAGE
        .get_or_init(|| {
            if !have_e2fsprogs() {
                return None;
            }
            let dir = tempfile::tempdir().unwrap();
            let img = mkimage(dir.path(), name, 16, &[]);
            Some(std::fs::read(img).unwrap())
        })
        .as_ref()
}

/// Lightweight mode's check: `e2fsck -fn` may find leaked blocks and inodes (marked in use,
/// used by nothing) but never a used one marked free; `e2fsck -fy` then leaves it clean.
pub fn assert_fsck_clean_but_leaks(image: &Path) {
    let out = Command::new("e2fsck")
        .arg("-fn")
        .arg(image)
        .output()
        .unwrap();
    if out.status.success() {
        return;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let overclaims = tidefs_crash::oracle::used_but_marked_free(&text);
    assert!(
        overclaims.is_empty(),
        "used blocks/inodes marked free: {overclaims:?}\n{text}"
    );
    let fixed = Command::new("e2fsck")
        .arg("-fy")
        .arg(image)
        .output()
        .unwrap();
    assert!(
        fixed.status.code().is_some_and(|c| c <= 1),
        "e2fsck -fy could not repair:\n{}",
        String::from_utf8_lossy(&fixed.stdout)
    );
    assert_fsck_clean(image);
}

/// Writes the bytes of an in-memory image to a temporary file and runs [`assert_fsck_clean`].
pub fn assert_mem_fsck_clean(mem: &tidefs::dev::MemDev) {
    check_mem_image(mem, assert_fsck_clean);
}

/// As [`assert_mem_fsck_clean`], with [`assert_fsck_clean_but_leaks`].
pub fn assert_mem_fsck_clean_but_leaks(mem: &tidefs::dev::MemDev) {
    check_mem_image(mem, assert_fsck_clean_but_leaks);
}

/// Runs `check` on the bytes of an in-memory image written to a temporary file.
fn check_mem_image(mem: &tidefs::dev::MemDev, check: fn(&Path)) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("check.img");
    std::fs::write(&path, mem.to_bytes()).unwrap();
    check(&path);
}

/// Runs `e2fsck -fn` and panics with its output unless the image is clean.
pub fn assert_fsck_clean(image: &Path) {
    let out = Command::new("e2fsck")
        .arg("-fn")
        .arg(image)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "e2fsck -fn found problems (exit {:?}):\n{}\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---------------------------------------------------------------------------------------------
// Helpers for the format, bad-input, interop and crash suites (added; the ones above are
// unchanged).

/// True when `TIDEFS_LONG=1`: tests enlarge their sizes for a longer, documented run.
pub fn long_run() -> bool {
    std::env::var("TIDEFS_LONG").is_ok_and(|v| v == "1")
}

/// Runs mkfs.ext4 with exactly `args` (no defaults added) on a fresh sparse file of `size_mb`.
pub fn mkfs_raw(dir: &Path, name: &str, size_mb: u64, args: &[&str]) -> PathBuf {
    let path = dir.join(name);
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(size_mb << 20).unwrap();
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .args(args)
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mkfs.ext4 {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

/// Runs a command, panicking with its output unless it exits 0; returns stdout.
pub fn run_ok(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed (exit {:?}):\n{}\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `dumpe2fs -h` as a map from field name to value (both trimmed).
pub fn dumpe2fs_h(image: &Path) -> std::collections::HashMap<String, String> {
    let text = run_ok("dumpe2fs", &["-h", image.to_str().unwrap()]);
    let mut m = std::collections::HashMap::new();
    for line in text.lines() {
        if let Some((k, v)) = line.split_once(':') {
            m.insert(k.trim().to_string(), v.trim().to_string());
        }
    }
    m
}

/// A 64-bit hash of some bytes (SipHash with fixed keys: stable inside one build, which is all
/// the tests need, parent and re-executed child being the same binary).
pub fn hash_bytes(b: &[u8]) -> u64 {
    use std::hash::Hasher;
    let mut h = std::hash::DefaultHasher::new();
    h.write(b);
    h.finish()
}

/// Hash of a whole file on the host.
pub fn file_hash(p: &Path) -> u64 {
    hash_bytes(&std::fs::read(p).unwrap())
}

/// A small deterministic PRNG (xorshift64*), for random file contents without extra crates.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        v.truncate(n);
        v
    }
}

/// Whether we are root and can attach loop devices and mount ext4; if not, the test (or the
/// part of it that needs the kernel) skips through [`skip`] (fails in CI).
pub fn can_loop_mount() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        .unwrap_or("");
    if euid != "0" {
        skip(
            &current_test(),
            "not root, cannot loop-mount with the kernel's ext4",
        );
        return false;
    }
    let ok = Command::new("losetup")
        .arg("-f")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        skip(&current_test(), "no free loop device (losetup -f failed)");
        return false;
    }
    let fs = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if !fs.lines().any(|l| l.trim_end().ends_with("ext4")) {
        // ext4 may be a module not yet loaded; mount will load it. Let the first mount decide.
        eprintln!("note: ext4 not in /proc/filesystems yet");
    }
    true
}

/// A kernel ext4 mount of an image through a loop device; unmounted on drop.
pub struct KernelMount {
    pub dir: tempfile::TempDir,
    mounted: bool,
}

impl KernelMount {
    /// Mounts `image` with `-o loop,<opts>`; `Err(message)` when the kernel refuses.
    pub fn mount(image: &Path, opts: &str) -> Result<KernelMount, String> {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args(["-t", "ext4", "-o", &format!("loop,{opts}")])
            .arg(image)
            .arg(dir.path())
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "mount -o loop,{opts} {} failed: {}",
                image.display(),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(KernelMount { dir, mounted: true })
    }
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
    /// Unmounts now, panicking on failure.
    pub fn umount(mut self) {
        self.mounted = false;
        run_ok("umount", &[self.dir.path().to_str().unwrap()]);
    }
}

impl Drop for KernelMount {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg(self.dir.path()).status();
        }
    }
}

/// What a tree walk records about one object; two walks of the same image through different
/// implementations must produce equal maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// 'f' file, 'd' dir, 'l' symlink, 'c' char dev, 'b' block dev, 'p' fifo, 's' socket.
    pub kind: char,
    pub size: u64,
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub mtime: (i64, u32),
    pub ctime: (i64, u32),
    /// Only when the walk asks for it (reads through the kernel may change it).
    pub atime: Option<(i64, u32)>,
    /// 512-byte units.
    pub blocks: u64,
    /// (major, minor) of device nodes.
    pub rdev: (u32, u32),
    pub target: Option<Vec<u8>>,
    pub xattrs: Xattrs,
    /// Hash of the content (see [`SAMPLE_ABOVE`]); `None` for non-files.
    pub content: Option<u64>,
}

/// Files larger than this are hashed on their first and last [`SAMPLE_LEN`] bytes only (sparse
/// files of 1 TiB cannot be read whole in a test).
pub const SAMPLE_ABOVE: u64 = 64 << 20;
/// See [`SAMPLE_ABOVE`].
pub const SAMPLE_LEN: u64 = 8 << 20;

/// Path (bytes, '/'-joined, "" for the root) → node.
pub type Tree = std::collections::BTreeMap<Vec<u8>, Node>;

fn join(parent: &[u8], name: &[u8]) -> Vec<u8> {
    if parent.is_empty() {
        name.to_vec()
    } else {
        let mut p = parent.to_vec();
        p.push(b'/');
        p.extend_from_slice(name);
        p
    }
}

/// The ranges a content hash covers for a file of `size` bytes.
pub fn hash_ranges(size: u64) -> Vec<(u64, u64)> {
    if size <= SAMPLE_ABOVE {
        vec![(0, size)]
    } else {
        vec![(0, SAMPLE_LEN), (size - SAMPLE_LEN, size)]
    }
}

fn kind_char(k: tidefs::fs::FileKind) -> char {
    use tidefs::fs::FileKind as K;
    match k {
        K::File => 'f',
        K::Dir => 'd',
        K::Symlink => 'l',
        K::CharDev => 'c',
        K::BlockDev => 'b',
        K::Fifo => 'p',
        K::Socket => 's',
    }
}

/// Walks the whole tree through the tidefs library API.
pub fn walk_lib(fs: &tidefs::fs::Fs, with_atime: bool) -> Tree {
    use tidefs::format::ext4::inode::{dev_major, dev_minor};
    let mut tree = Tree::new();
    let mut stack: Vec<(Vec<u8>, u64)> = vec![(Vec::new(), tidefs::fs::ROOT_INO)];
    while let Some((path, ino)) = stack.pop() {
        let a = fs
            .getattr(ino)
            .unwrap_or_else(|e| panic!("getattr {}: {e}", String::from_utf8_lossy(&path)));
        let kind = kind_char(a.kind);
        let mut xattrs = std::collections::BTreeMap::new();
        for n in fs.listxattr(ino).unwrap() {
            let v = fs.getxattr(ino, &n).unwrap();
            xattrs.insert(n, v);
        }
        let mut h = std::hash::DefaultHasher::new();
        let content = if kind == 'f' {
            use std::hash::Hasher;
            for (start, end) in hash_ranges(a.size) {
                let mut off = start;
                while off < end {
                    let n = (end - off).min(1 << 20) as u32;
                    let d = fs.read(ino, off, n).unwrap();
                    assert_eq!(
                        d.len(),
                        n as usize,
                        "short read in {}",
                        String::from_utf8_lossy(&path)
                    );
                    h.write(&d);
                    off += u64::from(n);
                }
            }
            Some(std::hash::Hasher::finish(&h))
        } else {
            None
        };
        let target = if kind == 'l' {
            Some(fs.readlink(ino).unwrap())
        } else {
            None
        };
        let rdev = if kind == 'c' || kind == 'b' {
            (dev_major(a.rdev), dev_minor(a.rdev))
        } else {
            (0, 0)
        };
        tree.insert(
            path.clone(),
            Node {
                kind,
                size: a.size,
                perm: u32::from(a.perm),
                uid: a.uid,
                gid: a.gid,
                nlink: a.nlink,
                mtime: (a.mtime.sec, a.mtime.nsec),
                ctime: (a.ctime.sec, a.ctime.nsec),
                atime: with_atime.then_some((a.atime.sec, a.atime.nsec)),
                blocks: a.blocks,
                rdev,
                target,
                xattrs,
                content,
            },
        );
        if kind == 'd' {
            let mut entries = Vec::new();
            fs.readdir(ino, 0, &mut |e| {
                entries.push(e);
                true
            })
            .unwrap();
            for e in entries {
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                let child = join(&path, &e.name);
                let ca = fs.getattr(e.ino).unwrap();
                assert_eq!(
                    ca.kind,
                    e.kind,
                    "readdir kind differs from getattr for {}",
                    String::from_utf8_lossy(&child)
                );
                stack.push((child, e.ino));
            }
        }
    }
    tree
}

/// Name → value of the extended attributes of one object.
pub type Xattrs = std::collections::BTreeMap<Vec<u8>, Vec<u8>>;

/// Every extended attribute under `root` (symlinks not followed), read in one batch by
/// `getfattr -R` or, failing that, python3 (`None` when neither exists). Keys are paths relative
/// to `root` as in [`Tree`].
pub fn host_xattrs_all(root: &Path) -> Option<std::collections::BTreeMap<Vec<u8>, Xattrs>> {
    use std::os::unix::ffi::OsStrExt;
    let script = r#"
import os, sys
root = sys.argv[1].encode()
out = sys.stdout.buffer
def dump(p, rel):
    for n in sorted(os.listxattr(p, follow_symlinks=False)):
        v = os.getxattr(p, n, follow_symlinks=False)
        out.write(rel.hex().encode() + b" " + n.encode().hex().encode() + b" " + v.hex().encode() + b"\n")
dump(root, b"")
for d, dirs, files in os.walk(root):
    for n in dirs + files:
        p = os.path.join(d, n)
        dump(p, os.path.relpath(p, root))
"#;
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(root)
        .output()
        .ok()
        .filter(|o| o.status.success());
    let Some(out) = out else {
        skip(
            &current_test(),
            "python3 not available to read xattrs through the kernel; xattrs not compared",
        );
        return None;
    };
    let hex = |s: &str| -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    };
    let mut m: std::collections::BTreeMap<Vec<u8>, Xattrs> = Default::default();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let mut it = line.split(' ');
        let (p, n, v) = (
            it.next().unwrap(),
            it.next().unwrap(),
            it.next().unwrap_or(""),
        );
        let mut rel = hex(p);
        if rel == b"." {
            rel.clear();
        }
        m.entry(rel).or_default().insert(hex(n), hex(v));
    }
    let _ = root.as_os_str().as_bytes();
    Some(m)
}

/// Sets an extended attribute on a host path through the kernel (python3, as the tests may not
/// link libc's unsafe calls); returns false when python3 is missing (after [`skip`], which fails
/// the test in CI).
pub fn host_setxattr(p: &Path, name: &str, value: &[u8]) -> bool {
    let hexv: String = value.iter().map(|b| format!("{b:02x}")).collect();
    let script = "import os,sys; os.setxattr(sys.argv[1], sys.argv[2], bytes.fromhex(sys.argv[3]), follow_symlinks=False)";
    match Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(p)
        .arg(name)
        .arg(&hexv)
        .output()
    {
        Ok(o) if o.status.success() => true,
        Ok(o) => panic!(
            "setxattr {} {name}: {}",
            p.display(),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(_) => {
            skip(
                &current_test(),
                "python3 not available to set xattrs through the kernel; no xattrs made",
            );
            false
        }
    }
}

/// Removes every xattr from a walk (when the host side could not read them).
pub fn strip_xattrs(t: &mut Tree) {
    for n in t.values_mut() {
        n.xattrs.clear();
    }
}

/// Walks a tree mounted by the kernel with std (xattrs through [`host_xattrs_all`]); the bool
/// says whether xattrs could be read (if not, they are empty: strip the other side too).
pub fn walk_host(root: &Path, with_atime: bool) -> (Tree, bool) {
    let xa = host_xattrs_all(root);
    use std::io::{Read, Seek, SeekFrom};
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let mut tree = Tree::new();
    let mut stack: Vec<(Vec<u8>, PathBuf)> = vec![(Vec::new(), root.to_path_buf())];
    while let Some((path, host)) = stack.pop() {
        let md = std::fs::symlink_metadata(&host).unwrap();
        let ft = md.mode() & libc::S_IFMT;
        let kind = match ft {
            libc::S_IFREG => 'f',
            libc::S_IFDIR => 'd',
            libc::S_IFLNK => 'l',
            libc::S_IFCHR => 'c',
            libc::S_IFBLK => 'b',
            libc::S_IFIFO => 'p',
            libc::S_IFSOCK => 's',
            other => panic!("unknown file type {other:o}"),
        };
        let content = if kind == 'f' {
            use std::hash::Hasher;
            let mut h = std::hash::DefaultHasher::new();
            let mut f = std::fs::File::open(&host).unwrap();
            for (start, end) in hash_ranges(md.size()) {
                f.seek(SeekFrom::Start(start)).unwrap();
                let mut left = end - start;
                let mut buf = vec![0u8; 1 << 20];
                while left > 0 {
                    let n = left.min(1 << 20) as usize;
                    f.read_exact(&mut buf[..n]).unwrap();
                    h.write(&buf[..n]);
                    left -= n as u64;
                }
            }
            Some(h.finish())
        } else {
            None
        };
        let target = if kind == 'l' {
            Some(
                std::fs::read_link(&host)
                    .unwrap()
                    .as_os_str()
                    .as_bytes()
                    .to_vec(),
            )
        } else {
            None
        };
        let rdev = if kind == 'c' || kind == 'b' {
            let r = md.rdev();
            (libc::major(r), libc::minor(r))
        } else {
            (0, 0)
        };
        tree.insert(
            path.clone(),
            Node {
                kind,
                size: md.size(),
                perm: md.mode() & 0o7777,
                uid: md.uid(),
                gid: md.gid(),
                nlink: md.nlink() as u32,
                mtime: (md.mtime(), md.mtime_nsec() as u32),
                ctime: (md.ctime(), md.ctime_nsec() as u32),
                atime: with_atime.then_some((md.atime(), md.atime_nsec() as u32)),
                blocks: md.blocks(),
                rdev,
                target,
                xattrs: xa
                    .as_ref()
                    .and_then(|m| m.get(&path).cloned())
                    .unwrap_or_default(),
                content,
            },
        );
        if kind == 'd' {
            for e in std::fs::read_dir(&host).unwrap() {
                let e = e.unwrap();
                stack.push((join(&path, e.file_name().as_bytes()), e.path()));
            }
        }
    }
    (tree, xa.is_some())
}

/// Panics with the first differences (at most 20) between two walks.
pub fn assert_trees_equal(what: &str, a: &Tree, b: &Tree) {
    let mut diffs = Vec::new();
    for (k, va) in a {
        match b.get(k) {
            None => diffs.push(format!("only in first: {}", String::from_utf8_lossy(k))),
            Some(vb) if va != vb => diffs.push(format!(
                "differs: {}\n   first:  {va:?}\n   second: {vb:?}",
                String::from_utf8_lossy(k)
            )),
            _ => {}
        }
    }
    for k in b.keys() {
        if !a.contains_key(k) {
            diffs.push(format!("only in second: {}", String::from_utf8_lossy(k)));
        }
    }
    if !diffs.is_empty() {
        let n = diffs.len();
        diffs.truncate(20);
        panic!(
            "{what}: {n} difference(s) over {} / {} paths:\n{}",
            a.len(),
            b.len(),
            diffs.join("\n")
        );
    }
}

/// Byte offset in the image of inode `ino` (read through the format layer).
pub fn inode_offset(img: &[u8], ino: u32) -> usize {
    use tidefs::format::ext4::group_desc::GroupDescRef;
    use tidefs::format::ext4::superblock::Superblock;
    let sb = Superblock::parse(&img[1024..2048]).unwrap();
    let bs = u64::from(sb.block_size());
    let ds = u64::from(sb.desc_size());
    let g = u64::from((ino - 1) / sb.inodes_per_group());
    let idx = u64::from((ino - 1) % sb.inodes_per_group());
    let d = ((u64::from(sb.first_data_block()) + 1) * bs + g * ds) as usize;
    let table = GroupDescRef::new(&img[d..d + ds as usize]).inode_table();
    (table * bs + idx * u64::from(sb.inode_size())) as usize
}

/// Byte offset in the image of the internal journal's superblock (journal block 0).
pub fn journal_sb_offset(img: &[u8]) -> usize {
    use tidefs::format::ext4::extent::{parse_node, ExtentNode};
    use tidefs::format::ext4::inode::Inode;
    use tidefs::format::ext4::superblock::Superblock;
    let sb = Superblock::parse(&img[1024..2048]).unwrap();
    let off = inode_offset(img, sb.journal_inum());
    let ji = Inode::from_bytes(&img[off..off + usize::from(sb.inode_size())]);
    match parse_node(ji.i_block()).unwrap() {
        ExtentNode::Leaf(e) => {
            let first = e.iter().find(|x| x.logical == 0).unwrap();
            (first.physical * u64::from(sb.block_size())) as usize
        }
        other => panic!("journal extent tree deeper than the tests expect: {other:?}"),
    }
}

/// Asserts that every operation of `fs` so far reserved its journal space before its first
/// change, and enough (`Stats::journal_credit_overruns`, `Stats::late_journal_reservations`;
/// docs/DESIGN.md §4.1).
pub fn assert_journal_reservations_held(fs: &tidefs::fs::Fs) {
    let stats = fs.stats();
    assert_eq!(
        (
            stats.journal_credit_overruns,
            stats.late_journal_reservations
        ),
        (0, 0),
        "journal reservations overrun, or made after a change"
    );
}

/// A memory device whose reads (or writes), once armed, wait until released: a test holds an
/// operation at its device access and checks what others can do meanwhile.
pub struct HeldDev {
    inner: std::sync::Arc<tidefs::dev::MemDev>,
    /// Whether writes are held (else reads).
    holds_writes: bool,
    /// Every read sleeps this long first.
    delay: std::time::Duration,
    /// (armed, released); `held` counts accesses waiting.
    state: std::sync::Mutex<(bool, bool)>,
    changed: std::sync::Condvar,
    held: std::sync::Mutex<usize>,
    held_changed: std::sync::Condvar,
    pub reads: std::sync::atomic::AtomicU64,
    /// Bytes the reads asked for.
    pub read_bytes: std::sync::atomic::AtomicU64,
}

impl HeldDev {
    /// A device that holds reads once armed; every read first sleeps `delay`.
    pub fn reads(
        inner: std::sync::Arc<tidefs::dev::MemDev>,
        delay: std::time::Duration,
    ) -> HeldDev {
        HeldDev {
            inner,
            holds_writes: false,
            delay,
            state: std::sync::Mutex::new((false, false)),
            changed: std::sync::Condvar::new(),
            held: std::sync::Mutex::new(0),
            held_changed: std::sync::Condvar::new(),
            reads: Default::default(),
            read_bytes: Default::default(),
        }
    }

    /// A device that holds writes once armed.
    pub fn writes(inner: std::sync::Arc<tidefs::dev::MemDev>) -> HeldDev {
        HeldDev {
            holds_writes: true,
            ..HeldDev::reads(inner, std::time::Duration::ZERO)
        }
    }

    pub fn arm(&self) {
        self.state.lock().unwrap().0 = true;
    }

    pub fn release(&self) {
        self.state.lock().unwrap().1 = true;
        self.changed.notify_all();
    }

    /// Arms the device and runs `f` on a new thread; returns once `f`'s device access is held
    /// (`what` names it if it never comes).
    pub fn hold_of<T: Send + 'static>(
        &self,
        what: &str,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<T> {
        self.arm();
        let thread = std::thread::spawn(f);
        assert!(
            self.wait_for_held(std::time::Duration::from_secs(30)),
            "{what} never reached the device"
        );
        thread
    }

    /// Waits until an access is being held (or `timeout` passes); returns whether one is.
    pub fn wait_for_held(&self, timeout: std::time::Duration) -> bool {
        let held = self.held.lock().unwrap();
        let (held, _) = self
            .held_changed
            .wait_timeout_while(held, timeout, |n| *n == 0)
            .unwrap();
        *held > 0
    }

    /// Waits while the device is armed and not released.
    fn wait_if_held(&self) {
        let mut s = self.state.lock().unwrap();
        if s.0 && !s.1 {
            *self.held.lock().unwrap() += 1;
            self.held_changed.notify_all();
            while !s.1 {
                s = self.changed.wait(s).unwrap();
            }
        }
    }
}

impl tidefs::dev::BlockDevice for HeldDev {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.read_bytes
            .fetch_add(buf.len() as u64, std::sync::atomic::Ordering::Relaxed);
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        if !self.holds_writes {
            self.wait_if_held();
        }
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        if self.holds_writes {
            self.wait_if_held();
        }
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn len_bytes(&self) -> u64 {
        self.inner.len_bytes()
    }
}
