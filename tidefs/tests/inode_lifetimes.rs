//! Goal: an inode lives exactly as long as something may still name it. The FUSE adapter holds
//! an inode once per entry it hands the kernel (`Fs::open_inode`) and drops the kernel's
//! references when it forgets them (`Fs::forget_inode`); opens of existing files never reach
//! the daemon. So the library must never free an inode that is held, even unlinked or renamed
//! over, never hand its number out again meanwhile, and free it when the last hold goes.
//!
//! Method: a model of the kernel's side (references per inode, open descriptors that pin them,
//! eviction only of inodes nothing has open) drives random sequences of create, lookup, open,
//! close, read, unlink, rename and forget on an image made by the real `mkfs.ext4`. Every read
//! through a descriptor must return the content its file was created with (a freed or reused
//! inode would not); at the end, with every descriptor closed and every reference forgotten,
//! the free inode count is back to what the remaining names account for, and the image is
//! clean by the real `e2fsck -fn`.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use proptest::prelude::*;
use tidefs::dev::MemDev;
use tidefs::fs::{Creds, Fs, MountOptions, RenameFlags, ROOT_INO};
use tidefs::FsError;

/// Names the sequences use.
const NAMES: usize = 4;

#[derive(Clone, Debug)]
enum Op {
    Create(usize),
    Lookup(usize),
    Open(usize),
    Close(usize),
    Read(usize),
    Unlink(usize),
    Rename(usize, usize),
    /// The kernel evicts the `n`th inode it holds that nothing has open.
    Forget(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..NAMES).prop_map(Op::Create),
        (0..NAMES).prop_map(Op::Lookup),
        (0..NAMES).prop_map(Op::Open),
        (0..8usize).prop_map(Op::Close),
        (0..8usize).prop_map(Op::Read),
        (0..NAMES).prop_map(Op::Unlink),
        (0..NAMES, 0..NAMES).prop_map(|(a, b)| Op::Rename(a, b)),
        (0..8usize).prop_map(Op::Forget),
    ]
}

/// A fresh 16 MiB image from the real mkfs, as bytes (made once); `None` without e2fsprogs.
fn base_image() -> Option<&'static Vec<u8>> {
    static IMAGE: OnceLock<Option<Vec<u8>>> = OnceLock::new();
    IMAGE
        .get_or_init(|| {
            if !common::have_e2fsprogs() {
                return None;
            }
            let dir = tempfile::tempdir().unwrap();
            let img = common::mkimage(dir.path(), "lifetimes.img", 16, &[]);
            Some(std::fs::read(img).unwrap())
        })
        .as_ref()
}

/// The kernel's side, as the FUSE adapter sees it.
#[derive(Default)]
struct Kernel {
    /// References per inode (one per entry handed out, until forgotten).
    refs: HashMap<u64, u64>,
    /// Open descriptors: the inode and the content its file was created with.
    fds: Vec<(u64, Vec<u8>)>,
    /// What each name holds now: its inode and content.
    names: HashMap<usize, (u64, Vec<u8>)>,
}

impl Kernel {
    fn hold(&mut self, fs: &Fs, ino: u64) {
        fs.open_inode(ino).unwrap();
        *self.refs.entry(ino).or_default() += 1;
    }
}

fn name(k: usize) -> Vec<u8> {
    format!("n{k}").into_bytes()
}

fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let Some(base) = base_image() else {
        return Ok(());
    };
    let mem = Arc::new(MemDev::from_bytes(base.clone()));
    let fs = Fs::open_devices(mem.clone(), None, &MountOptions::default()).unwrap();
    let free_at_start = fs.statfs().unwrap().files_free;
    let mut k = Kernel::default();
    let mut serial = 0u32;
    for op in ops {
        match *op {
            Op::Create(n) => {
                if k.names.contains_key(&n) {
                    continue;
                }
                serial += 1;
                let content = format!("file {serial}").into_bytes();
                let ino = fs
                    .create(ROOT_INO, &name(n), 0o100644, 0, Creds::ROOT)
                    .unwrap()
                    .ino;
                k.hold(&fs, ino);
                fs.write(ino, 0, &content).unwrap();
                for (held, _) in &k.fds {
                    prop_assert_ne!(*held, ino, "a number handed out again while open");
                }
                k.names.insert(n, (ino, content));
            }
            Op::Lookup(n) => match fs.lookup(ROOT_INO, &name(n)) {
                Ok(attr) => {
                    prop_assert_eq!(Some(attr.ino), k.names.get(&n).map(|e| e.0));
                    k.hold(&fs, attr.ino);
                }
                Err(FsError::NotFound) => prop_assert!(!k.names.contains_key(&n)),
                Err(e) => return Err(TestCaseError::fail(format!("lookup: {e}"))),
            },
            Op::Open(n) => {
                // An open goes through an entry the kernel holds; it reaches no daemon.
                if let Some((ino, content)) = k.names.get(&n).cloned() {
                    if k.refs.get(&ino).copied().unwrap_or(0) > 0 {
                        k.fds.push((ino, content));
                    }
                }
            }
            Op::Close(i) => {
                if !k.fds.is_empty() {
                    let i = i % k.fds.len();
                    k.fds.swap_remove(i);
                }
            }
            Op::Read(i) => {
                if !k.fds.is_empty() {
                    let (ino, content) = &k.fds[i % k.fds.len()];
                    let got = fs.read(*ino, 0, 64).map_err(|e| {
                        TestCaseError::fail(format!("read of open inode {ino}: {e}"))
                    })?;
                    prop_assert_eq!(&got, content, "inode {} read back", ino);
                }
            }
            Op::Unlink(n) => {
                if k.names.remove(&n).is_some() {
                    fs.unlink(ROOT_INO, &name(n)).unwrap();
                }
            }
            Op::Rename(a, b) => {
                if a == b || !k.names.contains_key(&a) {
                    continue;
                }
                fs.rename(
                    ROOT_INO,
                    &name(a),
                    ROOT_INO,
                    &name(b),
                    RenameFlags::default(),
                )
                .unwrap();
                let moved = k.names.remove(&a).unwrap();
                k.names.insert(b, moved);
            }
            Op::Forget(i) => {
                let open: Vec<u64> = k.fds.iter().map(|f| f.0).collect();
                let mut evictable: Vec<u64> = k
                    .refs
                    .keys()
                    .copied()
                    .filter(|ino| !open.contains(ino))
                    .collect();
                evictable.sort_unstable();
                if evictable.is_empty() {
                    continue;
                }
                let ino = evictable[i % evictable.len()];
                let n = k.refs.remove(&ino).unwrap();
                fs.forget_inode(ino, n).unwrap();
            }
        }
    }
    // Everything closed and forgotten: only the names hold inodes any more.
    k.fds.clear();
    for (ino, n) in std::mem::take(&mut k.refs) {
        fs.forget_inode(ino, n).unwrap();
    }
    let in_use = free_at_start - fs.statfs().unwrap().files_free;
    prop_assert_eq!(
        in_use,
        k.names.len() as u64,
        "inodes in use against names left"
    );
    for (n, (ino, content)) in &k.names {
        prop_assert_eq!(fs.lookup(ROOT_INO, &name(*n)).unwrap().ino, *ino);
        prop_assert_eq!(&fs.read(*ino, 0, 64).unwrap(), content);
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
    fn held_inodes_outlive_their_names_and_no_longer(ops in proptest::collection::vec(op(), 1..40)) {
        run(&ops)?;
    }
}
