//! Goal: a lookup or readdir answered without the metadata lock, from a cached name or from a
//! directory's published name index (docs/DESIGN.md §2.5, "Lookups and attributes without the
//! lock"), always agrees with the directory's entries: after every change, a name that exists
//! is found with its inode and a name that does not is not found (`.` and `..` included), also
//! for a directory whose inode number was freed and handed out again under another parent.
//!
//! Method: random sequences of create, unlink, link, rename (within and across directories,
//! over an existing name or not), mkdir and rmdir (the directories come and go, in the root or
//! in each other, so their numbers are reused under other parents) and cache drops, on an
//! image made by the real `mkfs.ext4` mounted with the smallest caches (so operations often
//! stop for a device read and are rolled back and run again). After every step, every
//! directory is listed twice by readdir, two entries per call (the calls under the lock and
//! without it alternate, and each continues from the other's cookie), and every name of every
//! directory is looked up twice (the first lookup of a directory after a change plans under
//! the lock and publishes its index; the second is answered without it); all is compared
//! with a model. At the end the image is clean by the real `e2fsck -fn`.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use proptest::prelude::*;
use tidefs::dev::MemDev;
use tidefs::fs::{Creds, Fs, MountOptions, RenameFlags, ROOT_INO};
use tidefs::FsError;

/// Directories the sequences make and remove (slot 0 is the root itself).
const SUBDIRS: usize = 3;
/// Names used in every directory.
const NAMES: usize = 3;

#[derive(Clone, Debug)]
enum Op {
    Create(usize, usize),
    Unlink(usize, usize),
    Link(usize, usize, usize, usize),
    Rename(usize, usize, usize, usize),
    /// Makes directory slot `.0` in directory slot `.1`.
    Mkdir(usize, usize),
    /// Empties the directory of its files, then removes it (unless a directory is in it).
    Rmdir(usize),
    DropCaches,
}

fn op() -> impl Strategy<Value = Op> {
    let dir = 0..=SUBDIRS;
    let name = 0..NAMES;
    prop_oneof![
        3 => (dir.clone(), name.clone()).prop_map(|(d, n)| Op::Create(d, n)),
        2 => (dir.clone(), name.clone()).prop_map(|(d, n)| Op::Unlink(d, n)),
        1 => (dir.clone(), name.clone(), dir.clone(), name.clone())
            .prop_map(|(a, m, b, n)| Op::Link(a, m, b, n)),
        2 => (dir.clone(), name.clone(), dir, name)
            .prop_map(|(a, m, b, n)| Op::Rename(a, m, b, n)),
        1 => (1..=SUBDIRS, 0..=SUBDIRS).prop_map(|(d, p)| Op::Mkdir(d, p)),
        1 => (1..=SUBDIRS).prop_map(Op::Rmdir),
        1 => Just(Op::DropCaches),
    ]
}

/// A fresh 16 MiB image from the real mkfs, as bytes (made once); `None` without e2fsprogs.
fn base_image() -> Option<&'static Vec<u8>> {
    common::small_image_bytes("lookups.img")
}

fn name(k: usize) -> Vec<u8> {
    format!("n{k}").into_bytes()
}

fn subdir_name(slot: usize) -> Vec<u8> {
    format!("d{slot}").into_bytes()
}

/// The directories as they should be: each slot's inode and parent slot (when it exists),
/// and the files.
struct Model {
    dirs: Vec<Option<(u64, usize)>>,
    files: HashMap<(usize, usize), u64>,
    /// The root's `lost+found`, which mkfs made.
    lost_found: u64,
}

impl Model {
    fn ino(&self, slot: usize) -> Option<u64> {
        self.dirs[slot].map(|(ino, _)| ino)
    }

    /// Every name of every directory, as it should look up: files, directories, `.`, `..`.
    fn check(&self, fs: &Fs, after: &Op) -> Result<(), TestCaseError> {
        for (slot, entry) in self.dirs.iter().enumerate() {
            let Some((dir, parent)) = *entry else {
                continue;
            };
            let mut expected: Vec<(Vec<u8>, Option<u64>)> = (0..NAMES)
                .map(|n| (name(n), self.files.get(&(slot, n)).copied()))
                .collect();
            for sub in 1..=SUBDIRS {
                let inside = self.dirs[sub].filter(|(_, p)| *p == slot && sub != slot);
                expected.push((subdir_name(sub), inside.map(|(ino, _)| ino)));
            }
            expected.push((b".".to_vec(), Some(dir)));
            expected.push((b"..".to_vec(), self.ino(parent)));
            if slot == 0 {
                expected.push((b"lost+found".to_vec(), Some(self.lost_found)));
            }
            // Listed twice, two entries per call: each call continues from the last cookie,
            // and calls answered under the lock and without it alternate.
            let mut want: Vec<(Vec<u8>, u64)> = expected
                .iter()
                .filter_map(|(n, ino)| ino.map(|i| (n.clone(), i)))
                .collect();
            want.sort();
            for pass in 0..2 {
                let mut got = listing(fs, dir)?;
                got.sort();
                prop_assert_eq!(
                    &got,
                    &want,
                    "after {:?}: listing of slot {} ({})",
                    after,
                    slot,
                    pass
                );
            }
            for (n, want) in expected {
                // The first may plan under the lock; the second is answered without it.
                for pass in 0..2 {
                    let got = match fs.lookup(dir, &n) {
                        Ok(attr) => Some(attr.ino),
                        Err(FsError::NotFound) => None,
                        Err(e) => {
                            return Err(TestCaseError::fail(format!(
                                "after {after:?}: lookup in slot {slot}: {e}"
                            )))
                        }
                    };
                    prop_assert_eq!(
                        got,
                        want,
                        "after {:?}: {} in slot {} (lookup {})",
                        after,
                        String::from_utf8_lossy(&n),
                        slot,
                        pass
                    );
                }
            }
        }
        Ok(())
    }
}

/// Every entry of `dir` as readdir lists it, two per call, continuing from the cookie of the
/// last one each time.
fn listing(fs: &Fs, dir: u64) -> Result<Vec<(Vec<u8>, u64)>, TestCaseError> {
    let mut out = Vec::new();
    let mut cookie = 0;
    loop {
        let mut page = Vec::new();
        fs.readdir(dir, cookie, &mut |e| {
            page.push(e);
            page.len() < 2
        })
        .map_err(|e| TestCaseError::fail(format!("readdir: {e}")))?;
        let Some(last) = page.last() else {
            return Ok(out);
        };
        cookie = last.next_offset;
        out.extend(page.into_iter().map(|e| (e.name, e.ino)));
    }
}

fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let Some(base) = base_image() else {
        return Ok(());
    };
    let mem = Arc::new(MemDev::from_bytes(base.clone()));
    let opts = MountOptions {
        cache_size_bytes: 0,
        ..MountOptions::default()
    };
    let fs = Fs::open_devices(mem.clone(), None, &opts).unwrap();
    let creds = Creds::ROOT;
    let mut m = Model {
        dirs: vec![None; SUBDIRS + 1],
        files: HashMap::new(),
        lost_found: fs.lookup(ROOT_INO, b"lost+found").unwrap().ino,
    };
    m.dirs[0] = Some((ROOT_INO, 0));
    for op in ops {
        match *op {
            Op::Create(d, n) => {
                if let (Some(dir), false) = (m.ino(d), m.files.contains_key(&(d, n))) {
                    let ino = fs.create(dir, &name(n), 0o100644, 0, creds).unwrap().ino;
                    m.files.insert((d, n), ino);
                }
            }
            Op::Unlink(d, n) => {
                if let (Some(dir), Some(_)) = (m.ino(d), m.files.get(&(d, n))) {
                    fs.unlink(dir, &name(n)).unwrap();
                    m.files.remove(&(d, n));
                }
            }
            Op::Link(a, x, b, y) => {
                if let (Some(ino), Some(to), false) = (
                    m.files.get(&(a, x)).copied(),
                    m.ino(b),
                    m.files.contains_key(&(b, y)),
                ) {
                    fs.link(ino, to, &name(y)).unwrap();
                    m.files.insert((b, y), ino);
                }
            }
            Op::Rename(a, x, b, y) => {
                if let (Some(from), Some(to), Some(ino)) =
                    (m.ino(a), m.ino(b), m.files.get(&(a, x)).copied())
                {
                    fs.rename(from, &name(x), to, &name(y), RenameFlags::default())
                        .unwrap();
                    // Renaming a name onto another link of the same inode leaves both.
                    if m.files.get(&(b, y)) != Some(&ino) {
                        m.files.remove(&(a, x));
                        m.files.insert((b, y), ino);
                    }
                }
            }
            Op::Mkdir(slot, parent) => {
                if let (None, Some(p), true) = (m.dirs[slot], m.ino(parent), slot != parent) {
                    let ino = fs.mkdir(p, &subdir_name(slot), 0o755, creds).unwrap().ino;
                    m.dirs[slot] = Some((ino, parent));
                }
            }
            Op::Rmdir(slot) => {
                let has_subdir = m
                    .dirs
                    .iter()
                    .skip(1)
                    .any(|e| e.is_some_and(|(_, p)| p == slot));
                if let (Some((dir, parent)), false) = (m.dirs[slot], has_subdir) {
                    for n in 0..NAMES {
                        if m.files.remove(&(slot, n)).is_some() {
                            fs.unlink(dir, &name(n)).unwrap();
                        }
                    }
                    let p = m.ino(parent).expect("a directory's parent exists");
                    fs.rmdir(p, &subdir_name(slot)).unwrap();
                    m.dirs[slot] = None;
                }
            }
            Op::DropCaches => fs.drop_caches().unwrap(),
        }
        m.check(&fs, op)?;
    }
    fs.unmount().unwrap();
    drop(fs);
    common::assert_mem_fsck_clean(&mem);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if common::long_run() { 512 } else { 48 },
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Goal and method: see the module doc.
    #[test]
    fn lookups_agree_with_the_directories_after_every_change(
        ops in proptest::collection::vec(op(), 1..40)
    ) {
        run(&ops)?;
    }
}

/// Goal: the `..` of a directory whose inode number was freed and handed out again under
/// another parent names the new parent, though a lookup cached the old `..` and the old
/// parent's attributes are cached too.
#[test]
fn dotdot_of_a_reused_directory_number_names_its_new_parent() {
    let Some(base) = base_image() else {
        return;
    };
    let mem = Arc::new(MemDev::from_bytes(base.clone()));
    let fs = Fs::open_devices(mem.clone(), None, &MountOptions::default()).unwrap();
    let creds = Creds::ROOT;
    let a = fs.mkdir(ROOT_INO, b"a", 0o755, creds).unwrap().ino;
    let b = fs.mkdir(ROOT_INO, b"b", 0o755, creds).unwrap().ino;
    let c = fs.mkdir(a, b"c", 0o755, creds).unwrap().ino;
    assert_eq!(fs.lookup(c, b"..").unwrap().ino, a);
    fs.rmdir(a, b"c").unwrap();
    // Freed numbers are handed out again once the freeing transaction is durable.
    fs.sync().unwrap();
    fs.getattr(a).unwrap();
    let again = fs.mkdir(b, b"c", 0o755, creds).unwrap().ino;
    assert_eq!(
        again, c,
        "the new directory was meant to reuse the old one's number"
    );
    assert_eq!(fs.lookup(again, b"..").unwrap().ino, b);
    assert_eq!(fs.lookup(again, b"..").unwrap().ino, b);
    fs.unmount().unwrap();
    drop(fs);
    common::assert_mem_fsck_clean(&mem);
}

/// Goal: a symbolic link's target, once read, is read again without the metadata lock
/// (`Fs::readlink`), and a link freed and made anew under the same inode number never shows
/// the old target. Method: targets kept in the inode and in a block of their own, each read
/// twice counting `Stats::metadata_locked`; then each link is removed, the removal
/// committed, and new links are made until one gets the old number, whose target is read.
#[test]
fn symlink_targets_are_read_without_the_lock() {
    let Some(bytes) = common::small_image_bytes("links.img") else {
        return;
    };
    let mem = Arc::new(MemDev::from_bytes(bytes.clone()));
    let fs = Fs::open_devices(mem.clone(), None, &MountOptions::default()).unwrap();
    for (name, target) in [
        (&b"short"[..], b"in-the-inode".to_vec()),
        (&b"long"[..], vec![b'x'; 300]),
    ] {
        let ino = fs
            .symlink(ROOT_INO, name, &target, Creds::ROOT)
            .unwrap()
            .ino;
        assert_eq!(fs.readlink(ino).unwrap(), target);
        let locked = fs.stats().metadata_locked;
        assert_eq!(fs.readlink(ino).unwrap(), target);
        assert_eq!(
            fs.stats().metadata_locked,
            locked,
            "the second read took the lock"
        );
        fs.unlink(ROOT_INO, name).unwrap();
        fs.sync().unwrap();
        let mut reused = false;
        for k in 0..64 {
            let new_target = format!("new-{k}").into_bytes();
            let made = fs
                .symlink(
                    ROOT_INO,
                    format!("{}-{k}", String::from_utf8_lossy(name)).as_bytes(),
                    &new_target,
                    Creds::ROOT,
                )
                .unwrap()
                .ino;
            assert_eq!(fs.readlink(made).unwrap(), new_target);
            if made == ino {
                reused = true;
                break;
            }
        }
        assert!(reused, "inode {ino} was not handed out again");
    }
    fs.unmount().unwrap();
    common::assert_mem_fsck_clean(&mem);
}
