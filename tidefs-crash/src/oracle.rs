//! The oracle: what must hold after recovery of a crash state.
//!
//! (a) the real `e2fsck -fn` is clean on the recovered (and cleanly unmounted) image;
//! (b) every promise of a persistence point that returned before the crash holds, unless an op
//!     started after it (and before the crash) touched the promised object;
//! (c) the mode's promise (docs/DESIGN.md §3): ordered and journal, every byte of every file is
//!     zero or a byte some issued write put at that offset of that file; journal, every write shows
//!     all of its bytes or none (bytes overwritten or cut by a later op excepted).
//!
//! In a mixed tree (directories of different modes, switched during the run) each file and
//! directory is held to the weakest mode it may have obeyed at any time of the run
//! ([`Model::modes_of_file`], [`Model::modes_of_dir`]): never a false alarm, and a file that
//! stayed in one directory of one mode is held to exactly that mode's promise.
//!
//! Invariants:
//! - the checks read the file system only through the library API;
//! - a check that cannot tell (a byte two writes could have put there) never reports.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use tidefs::fs::{FileKind, Fs, Ino, ROOT_INO};

use tidefs::fs::DataMode;

use crate::workload::{pattern_byte, DataWrite, Event, Expect, ExpectEntry, Key, Model, Recorded};

/// One object of a recovered tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RObj {
    /// Inode number.
    pub ino: Ino,
    /// Kind.
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
    /// Link count.
    pub nlink: u32,
    /// Content of regular files.
    pub data: Option<Vec<u8>>,
    /// Target of symbolic links.
    pub target: Option<Vec<u8>>,
    /// Extended attributes.
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

/// Path (relative, `""` for the root) → object.
pub type RTree = BTreeMap<String, RObj>;

/// Largest number of objects a walk visits before it calls the tree corrupt.
const WALK_MAX_OBJECTS: usize = 10_000;
/// Largest file the walk reads whole.
const WALK_MAX_FILE_BYTES: u64 = 16 << 20;

/// Walks the whole tree through the library.
pub fn walk(fs: &Fs) -> Result<RTree, String> {
    let mut tree = RTree::new();
    let mut stack = vec![(String::new(), ROOT_INO)];
    let mut seen_dirs = std::collections::HashSet::new();
    while let Some((path, ino)) = stack.pop() {
        if tree.len() > WALK_MAX_OBJECTS {
            return Err("more objects than the workload could create".into());
        }
        let shown = if path.is_empty() { "/" } else { path.as_str() };
        let a = fs
            .getattr(ino)
            .map_err(|e| format!("getattr {shown} (ino {ino}): {e}"))?;
        let mut xattrs = BTreeMap::new();
        for n in fs
            .listxattr(ino)
            .map_err(|e| format!("listxattr {shown}: {e}"))?
        {
            let v = fs
                .getxattr(ino, &n)
                .map_err(|e| format!("getxattr {shown}: {e}"))?;
            xattrs.insert(n, v);
        }
        let data = if a.kind == FileKind::File {
            if a.size > WALK_MAX_FILE_BYTES {
                return Err(format!("{shown}: size {} is absurd", a.size));
            }
            // Bounded above by WALK_MAX_FILE_BYTES.
            let d = fs
                .read(ino, 0, a.size as u32)
                .map_err(|e| format!("read {shown}: {e}"))?;
            if d.len() as u64 != a.size {
                return Err(format!("read {shown}: {} bytes of {}", d.len(), a.size));
            }
            Some(d)
        } else {
            None
        };
        let target = if a.kind == FileKind::Symlink {
            Some(
                fs.readlink(ino)
                    .map_err(|e| format!("readlink {shown}: {e}"))?,
            )
        } else {
            None
        };
        if a.kind == FileKind::Dir {
            if !seen_dirs.insert(ino) {
                return Err(format!("directory {shown} (ino {ino}) reached twice"));
            }
            let mut entries = Vec::new();
            fs.readdir(ino, 0, &mut |e| {
                entries.push(e);
                entries.len() <= WALK_MAX_OBJECTS
            })
            .map_err(|e| format!("readdir {shown}: {e}"))?;
            for e in entries {
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                let name = String::from_utf8_lossy(&e.name).into_owned();
                let child = if path.is_empty() {
                    name
                } else {
                    format!("{path}/{name}")
                };
                stack.push((child, e.ino));
            }
        }
        tree.insert(
            path,
            RObj {
                ino,
                kind: a.kind,
                size: a.size,
                nlink: a.nlink,
                data,
                target,
                xattrs,
            },
        );
    }
    Ok(tree)
}

fn parent_of(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(p, _)| p)
}

fn name_of(path: &str) -> &str {
    path.rsplit_once('/').map_or(path, |(_, n)| n)
}

/// Whether an event at log position `pos` had happened before a crash at `crash_pos`. Position
/// 0 stands for the setup, which is in the base image.
pub fn issued(pos: usize, crash_pos: usize) -> bool {
    pos == 0 || pos < crash_pos
}

/// The promises in force at a crash at `crash_pos`: the latest promise of each key that no op
/// started since (before the crash) touched.
pub fn expectations(events: &[Event], crash_pos: usize) -> BTreeMap<Key, Expect> {
    let mut m = BTreeMap::new();
    for e in events {
        match e {
            Event::Promise { pos, promises } if *pos < crash_pos => {
                for (k, v) in promises {
                    m.insert(k.clone(), v.clone());
                }
            }
            Event::OpStart { pos, touched, .. } if *pos < crash_pos => {
                for k in touched {
                    m.remove(k);
                }
            }
            _ => {}
        }
    }
    m
}

fn first_diff(a: &[u8], b: &[u8]) -> String {
    let i = a.iter().zip(b).position(|(x, y)| x != y);
    match i {
        Some(i) => format!(
            "first difference at byte {i}: found {:02x?}, expected {:02x?}",
            &a[i..(i + 8).min(a.len())],
            &b[i..(i + 8).min(b.len())]
        ),
        None => format!("found {} bytes, expected {}", a.len(), b.len()),
    }
}

/// Checks every promise in force; appends what does not hold to `problems`.
pub fn check_promises(tree: &RTree, expects: &BTreeMap<Key, Expect>, problems: &mut Vec<String>) {
    let by_ino: HashMap<Ino, (&String, &RObj)> =
        tree.iter().map(|(p, o)| (o.ino, (p, o))).collect();
    for (key, exp) in expects {
        match (key, exp) {
            (Key::Entry(p), Expect::Entry(e)) => {
                let got = tree.get(p);
                let ok = match (e, got) {
                    (None, None) => true,
                    (Some(ExpectEntry::File(ino)), Some(o)) => {
                        o.kind == FileKind::File && o.ino == *ino
                    }
                    (Some(ExpectEntry::Dir), Some(o)) => o.kind == FileKind::Dir,
                    (Some(ExpectEntry::Symlink(t)), Some(o)) => {
                        o.kind == FileKind::Symlink && o.target.as_ref() == Some(t)
                    }
                    _ => false,
                };
                if !ok {
                    problems.push(format!(
                        "promised entry /{p}: expected {e:?}, found {:?}",
                        got.map(|o| (o.kind, o.ino, &o.target))
                    ));
                }
            }
            (Key::Listing(d), Expect::Listing(names)) => {
                let is_dir = tree.get(d).is_some_and(|o| o.kind == FileKind::Dir);
                let got: std::collections::BTreeSet<Vec<u8>> = tree
                    .keys()
                    .filter(|k| !k.is_empty() && parent_of(k) == d && *k != d)
                    .map(|k| name_of(k).as_bytes().to_vec())
                    .collect();
                if !is_dir || &got != names {
                    let show = |s: &std::collections::BTreeSet<Vec<u8>>| {
                        s.iter()
                            .map(|n| String::from_utf8_lossy(n).into_owned())
                            .collect::<Vec<_>>()
                    };
                    problems.push(format!(
                        "promised listing of /{d}: expected {:?}, found {}",
                        show(names),
                        if is_dir {
                            format!("{:?}", show(&got))
                        } else {
                            "no directory".into()
                        }
                    ));
                }
            }
            (Key::Content(_), Expect::Content(ino, data)) => match by_ino.get(ino) {
                Some((p, o)) if o.kind == FileKind::File => {
                    let got = o.data.as_deref().unwrap_or(&[]);
                    if got != data.as_slice() {
                        problems.push(format!(
                            "promised content of /{p} (ino {ino}, {} bytes): {}",
                            data.len(),
                            first_diff(got, data)
                        ));
                    }
                }
                _ => problems.push(format!(
                    "promised file ino {ino} ({} bytes) is not in the tree",
                    data.len()
                )),
            },
            (Key::Xattrs(_), Expect::Xattrs(ino, xs)) => match by_ino.get(ino) {
                Some((p, o)) => {
                    if &o.xattrs != xs {
                        problems.push(format!(
                            "promised xattrs of /{p} (ino {ino}): expected names {:?}, found {:?} \
                             (or values differ)",
                            xs.keys()
                                .map(|k| String::from_utf8_lossy(k).into_owned())
                                .collect::<Vec<_>>(),
                            o.xattrs
                                .keys()
                                .map(|k| String::from_utf8_lossy(k).into_owned())
                                .collect::<Vec<_>>()
                        ));
                    }
                }
                None => problems.push(format!(
                    "promised xattrs: file ino {ino} is not in the tree"
                )),
            },
            _ => problems.push(format!("internal: key {key:?} with {exp:?}")),
        }
    }
}

/// Ordered and journal: every byte of every file is zero or put at that offset by a write to
/// that file issued before the crash.
pub fn check_no_garbage(
    tree: &RTree,
    rec: &Recorded,
    crash_pos: usize,
    problems: &mut Vec<String>,
) {
    // Ordered and stronger promise it; a file that may have obeyed lightweight or writeback
    // at any time is not held to it.
    let weak: std::collections::HashSet<Ino> = rec
        .fid_ino
        .iter()
        .filter(|(fid, _)| {
            rec.model
                .modes_of_file(**fid)
                .iter()
                .any(|m| matches!(m, DataMode::Lightweight | DataMode::Writeback))
        })
        .map(|(_, ino)| *ino)
        .collect();
    for (path, o) in tree {
        let Some(data) = &o.data else { continue };
        if weak.contains(&o.ino) {
            continue;
        }
        let mut ok: Vec<bool> = data.iter().map(|&b| b == 0).collect();
        for w in &rec.writes {
            if rec.fid_ino.get(&w.fid) != Some(&o.ino) || !issued(w.pos, crash_pos) {
                continue;
            }
            let start = w.offset;
            let end = (w.offset + w.len as u64).min(data.len() as u64);
            for off in start..end {
                // off < data.len(), a usize.
                let i = off as usize;
                if !ok[i] && data[i] == pattern_byte(w.id, off) {
                    ok[i] = true;
                }
            }
        }
        let bad: Vec<usize> = (0..data.len()).filter(|&i| !ok[i]).collect();
        if let Some(&first) = bad.first() {
            problems.push(format!(
                "garbage in /{path} (ino {}, size {}): {} byte(s) no write put there, first at \
                 offset {first}: {:02x?}",
                o.ino,
                data.len(),
                bad.len(),
                &data[first..(first + 16).min(data.len())]
            ));
        }
    }
}

/// Journaled data: each write issued before the crash shows all of its bytes or none of them
/// (bytes a later issued op overwrote or truncated are left out); a write that goes as several
/// operations (`DataWrite::parts`, a large one), each of its parts. Only files whose every
/// write is journaled for sure are checked: by the mode the file obeyed when it ran, or when
/// the model does not know that, by every mode the file may have obeyed (selective journals
/// only writes below its threshold for sure; lightweight, writeback and ordered none).
pub fn check_atomic_writes(
    tree: &RTree,
    rec: &Recorded,
    crash_pos: usize,
    problems: &mut Vec<String>,
) {
    let by_ino: HashMap<Ino, (&String, &RObj)> =
        tree.iter().map(|(p, o)| (o.ino, (p, o))).collect();
    let has_large: std::collections::HashSet<_> = rec
        .writes
        .iter()
        .filter(|x| match x.mode {
            // The page keeps the mode of the write (or a stricter one) until its write-back.
            Some(m) => !m.journals_data(x.len),
            None => !rec
                .model
                .modes_of_file(x.fid)
                .iter()
                .all(|m| m.journals_data(x.len)),
        })
        .map(|x| x.fid)
        .collect();
    for w in &rec.writes {
        // Writes before the ops (setup, and the prelude that positions the journal) were all
        // made durable before any crash point: the promise checks cover them.
        if w.pos < rec.first_op_pos || w.pos >= crash_pos {
            continue;
        }
        if has_large.contains(&w.fid) {
            continue;
        }
        let Some(&ino) = rec.fid_ino.get(&w.fid) else {
            continue;
        };
        if rec.fid_ino.values().filter(|&&i| i == ino).count() != 1 {
            continue;
        }
        let Some((path, o)) = by_ino.get(&ino) else {
            continue;
        };
        let Some(data) = &o.data else { continue };
        // Bytes a later truncate (from `later_cut` on) or zero-range / punch-hole (up to
        // `zeroed_later`) of this file, issued before the crash, may have taken away.
        let (mut later_cut, mut zeroed_later) = (u64::MAX, 0);
        for e in &rec.events {
            let (pos, fid) = match e {
                Event::Truncate { pos, fid, .. } | Event::Zeroed { pos, fid, .. } => (*pos, *fid),
                _ => continue,
            };
            if fid != w.fid || pos <= w.pos || pos >= crash_pos {
                continue;
            }
            match e {
                Event::Truncate { size, .. } => later_cut = later_cut.min(*size),
                Event::Zeroed { len, .. } => zeroed_later = zeroed_later.max(*len),
                _ => {}
            }
        }
        let others: Vec<_> = rec
            .writes
            .iter()
            .filter(|x| x.id != w.id && x.fid == w.fid && issued(x.pos, crash_pos))
            .collect();
        for (k, part) in w.parts.iter().enumerate() {
            let (shows, lacks) =
                part_shows(w, part.clone(), &others, data, later_cut, zeroed_later);
            if shows > 0 && lacks > 0 {
                let which = if w.parts.len() > 1 {
                    format!(
                        ", part {} of {} ({}..{})",
                        k + 1,
                        w.parts.len(),
                        part.start,
                        part.end
                    )
                } else {
                    String::new()
                };
                problems.push(format!(
                    "write #{} to /{path} ({}+{}{which}) is torn: {shows} of its bytes are \
                     there, {lacks} are not",
                    w.id, w.offset, w.len
                ));
            }
        }
    }
}

/// Of the bytes `part` of write `w`, those the file (`data`) shows from it and those it lacks,
/// leaving out bytes a later issued write covers, a later truncate (from `later_cut`) or
/// zero-range / punch-hole (below `zeroed_later`) took away, and bytes another write of the
/// same pattern could explain.
fn part_shows(
    w: &DataWrite,
    part: std::ops::Range<u64>,
    others: &[&DataWrite],
    data: &[u8],
    later_cut: u64,
    zeroed_later: u64,
) -> (usize, usize) {
    let (mut shows, mut lacks) = (0usize, 0usize);
    for off in part {
        if off >= later_cut || off < zeroed_later {
            continue;
        }
        let covered_later = others
            .iter()
            .any(|x| x.pos > w.pos && off >= x.offset && off < x.offset + x.len as u64);
        if covered_later {
            continue;
        }
        let want = pattern_byte(w.id, off);
        let got = usize::try_from(off).ok().and_then(|i| data.get(i)).copied();
        match got {
            Some(b) if b == want => {
                let ambiguous = others.iter().any(|x| {
                    off >= x.offset && off < x.offset + x.len as u64 && pattern_byte(x.id, off) == b
                });
                if !ambiguous {
                    shows += 1;
                }
            }
            _ => lacks += 1,
        }
    }
    (shows, lacks)
}

/// Differences between two recovered trees (tidefs's and the reference's), at most 20.
pub fn compare_trees(ours: &RTree, theirs: &RTree) -> Vec<String> {
    let mut d = Vec::new();
    for (p, a) in ours {
        match theirs.get(p) {
            None => d.push(format!("/{p} only after tidefs recovery")),
            Some(b) if a != b => {
                let what = if a.kind != b.kind {
                    format!("kind {:?} vs {:?}", a.kind, b.kind)
                } else if a.ino != b.ino {
                    format!("ino {} vs {}", a.ino, b.ino)
                } else if a.size != b.size {
                    format!("size {} vs {}", a.size, b.size)
                } else if a.data != b.data {
                    let (x, y) = (
                        a.data.as_deref().unwrap_or(&[]),
                        b.data.as_deref().unwrap_or(&[]),
                    );
                    format!("content: {}", first_diff(x, y))
                } else if a.nlink != b.nlink {
                    format!("nlink {} vs {}", a.nlink, b.nlink)
                } else if a.target != b.target {
                    "symlink target".into()
                } else {
                    "xattrs".into()
                };
                d.push(format!("/{p} differs (tidefs vs e2fsck): {what}"));
            }
            _ => {}
        }
    }
    for p in theirs.keys() {
        if !ours.contains_key(p) {
            d.push(format!("/{p} only after e2fsck recovery"));
        }
    }
    d.truncate(20);
    d
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A scratch image file (in /dev/shm when it exists), removed on drop.
pub struct ScratchImage {
    /// Its path.
    pub path: PathBuf,
}

impl ScratchImage {
    /// Writes `bytes` to a new scratch file.
    pub fn new(bytes: &[u8]) -> std::io::Result<ScratchImage> {
        let dir = if std::path::Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("tidefs-crash-{}-{n}.img", std::process::id()));
        std::fs::write(&path, bytes)?;
        Ok(ScratchImage { path })
    }

    /// The file's content.
    pub fn read(&self) -> std::io::Result<Vec<u8>> {
        std::fs::read(&self.path)
    }
}

impl Drop for ScratchImage {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Runs `e2fsck ARGS image`; returns the exit code and the last lines of its output.
pub fn e2fsck(img: &ScratchImage, args: &[&str]) -> Result<(i32, String), String> {
    let (code, text) = e2fsck_full(img, args)?;
    Ok((code, tail_of(&text)))
}

/// Runs e2fsck with `args` on `img`; returns its exit code and its whole output.
pub fn e2fsck_full(img: &ScratchImage, args: &[&str]) -> Result<(i32, String), String> {
    let tool = tidefs_mkfs::find_e2fsprogs_tool("e2fsck")
        .ok_or_else(|| "e2fsck not found (install e2fsprogs)".to_string())?;
    let out = Command::new(tool)
        .args(args)
        .arg(&img.path)
        .output()
        .map_err(|e| format!("cannot run e2fsck: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out.status.code().unwrap_or(-1), text))
}

/// The last lines of an e2fsck report that say something (pass headers dropped).
pub fn tail_of(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("Pass ") && !l.starts_with("e2fsck "))
        .collect();
    lines[lines.len().saturating_sub(12)..].join(" | ")
}

/// Blocks or inodes that e2fsck found in use while their bitmap calls them free: the `+`
/// entries of its "Block bitmap differences" and "Inode bitmap differences" lines. A leak (`-`)
/// is allowed in lightweight mode; one of these is a future double allocation.
pub fn used_but_marked_free(e2fsck_output: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in e2fsck_output.lines() {
        let line = line.trim();
        for what in ["Block bitmap differences:", "Inode bitmap differences:"] {
            if let Some(rest) = line.strip_prefix(what) {
                out.extend(
                    rest.split_whitespace()
                        .filter(|t| t.starts_with('+'))
                        .map(|t| format!("{} {t}", &what[..what.len() - 1])),
                );
            }
        }
    }
    out
}

/// Inode numbers an e2fsck report names ("inode N", "Inode N," and the "(N)" after a path),
/// the null inode left out.
pub fn inodes_named(report: &str) -> std::collections::BTreeSet<u64> {
    let num = |t: &str| {
        t.trim_matches(|c: char| !c.is_ascii_digit())
            .parse::<u64>()
            .ok()
    };
    let mut out = std::collections::BTreeSet::new();
    for line in report.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        for (i, w) in words.iter().enumerate() {
            // "... has illegal extended attribute value inode N": N is what the damaged
            // attribute says, not an inode of the file system.
            let value_ref = i > 0 && words[i - 1] == "value";
            if w.eq_ignore_ascii_case("inode") && !value_ref {
                if let Some(n) = words.get(i + 1).and_then(|t| num(t)) {
                    out.insert(n);
                }
            }
            // "... has a hash (N) which is invalid": N is a hash value.
            let hash_value = i > 0 && words[i - 1] == "hash";
            let bare = w.trim_end_matches([',', '.', ':']);
            if bare.starts_with('(') && bare.ends_with(')') && !hash_value {
                if let Some(n) = num(bare) {
                    out.insert(n);
                }
            }
        }
    }
    out.remove(&0);
    out
}

/// In a mixed tree: the inodes that may have obeyed `lightweight` (the directories and files
/// whose modes include it, the symbolic links of a lightweight mount or made in a directory
/// that was lightweight), whose damage after a crash that mode allows.
pub fn lightweight_inodes(model: &Model) -> std::collections::HashSet<u64> {
    let light = |modes: Vec<DataMode>| modes.contains(&DataMode::Lightweight);
    let dirs = model
        .dir_inos
        .iter()
        .filter(|(p, _)| light(model.modes_of_dir(p)))
        .flat_map(|(_, inos)| inos.iter().copied());
    let files = model
        .files
        .iter()
        .filter(|(fid, _)| light(model.modes_of_file(**fid)))
        .map(|(_, f)| f.ino);
    // A symbolic link's inode obeys the mount's mode; its entry, the mode of the directory
    // holding it, which can lose the entry and leave the inode unattached.
    let links = model
        .symlink_inos
        .iter()
        .filter(|(d, _)| {
            model.default_mode == DataMode::Lightweight || light(model.modes_of_dir(d))
        })
        .flat_map(|(_, inos)| inos.iter().copied());
    dirs.chain(files).chain(links).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symlinks_of_a_lightweight_mount_or_directory_may_be_damaged() {
        // Goal: a symbolic link made on a lightweight mount, or in a directory that was
        // lightweight, counts as lightweight in a mixed tree (seed 20261203, state 948 of
        // `--mode lightweight --dir-mode wasteless`: its inode leaked, which that mode allows,
        // and was reported as a violation); one made in a strict directory of a strict mount
        // does not.
        let mut m = Model::default();
        m.default_mode = DataMode::Lightweight;
        m.symlink_inos.entry(String::new()).or_default().insert(14);
        assert!(lightweight_inodes(&m).contains(&14));
        let mut m = Model::default();
        m.default_mode = DataMode::Ordered;
        m.symlink_inos.entry("A".into()).or_default().insert(15);
        m.symlink_inos.entry("B".into()).or_default().insert(16);
        m.dir_modes_seen
            .entry("A".into())
            .or_default()
            .insert("lightweight".into());
        let light = lightweight_inodes(&m);
        assert!(light.contains(&15) && !light.contains(&16), "{light:?}");
    }

    #[test]
    fn e2fsck_reports_name_their_inodes() {
        let report = "Pass 2: Checking directory structure\n\
            Entry 'bar' in /A (12) has deleted/unused inode 14.  Clear? no\n\
            Inode 15, i_size is 0, should be 4096.  Fix? no\n\
            Inode 15 has illegal extended attribute value inode 2155906546.\n\
            Extended attribute in inode 16 has a hash (611737362) which is invalid\n\
            '..' in /A (12) is <The NULL inode> (0), should be / (2).\n\
            Block bitmap differences:  -(1069--1070)\n\
            Free blocks count wrong for group #0 (5, counted=7).\n\
            Inode bitmap differences:  -13\n";
        let want: std::collections::BTreeSet<u64> = [2, 12, 14, 15, 16].into_iter().collect();
        assert_eq!(inodes_named(report), want);
    }

    #[test]
    fn bitmap_differences_are_split_into_leaks_and_overclaims() {
        let report = "Pass 5: Checking group summary information\n\
            Block bitmap differences:  -131197 -131210 -131397 +(147134--147135)\n\
            Fix? no\n\
            Inode bitmap differences:  -32788 +40\n";
        assert_eq!(
            used_but_marked_free(report),
            vec![
                "Block bitmap differences +(147134--147135)".to_string(),
                "Inode bitmap differences +40".to_string()
            ]
        );
        assert!(used_but_marked_free("Block bitmap differences:  -(1--4)\n").is_empty());
    }
}
