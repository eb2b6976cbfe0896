//! Goal: `getxattr` and `listxattr` answered without the metadata lock, from an inode's
//! published extended attributes (docs/DESIGN.md §2.5, "Extended attributes without the
//! lock"), always agree with the inode's attributes: after every change a set attribute reads
//! back with its value, a removed one is gone, a write drops the file's capabilities, and a
//! file that reuses a freed inode's number has none of the freed file's attributes.
//!
//! Method: random sequences of creates, unlinks (with a sync, so the next create reuses the
//! number), sets (small values, and values too large to publish or to fit in the inode, which
//! move the attributes to an attribute block), removals, one-byte writes and cache drops on a
//! few files of an image made by the real `mkfs.ext4`, mounted with the smallest caches. After
//! every step every name of every file is read twice and every file listed twice (the first
//! read after a change runs under the lock and publishes; the second is answered without it),
//! against a model. At the end the image is clean by the real `e2fsck -fn`.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use proptest::prelude::*;
use tidefs::dev::MemDev;
use tidefs::fs::{Creds, Fs, MountOptions, XattrSetMode, ROOT_INO};
use tidefs::FsError;

/// Files the sequences make and remove.
const FILES: usize = 3;
/// The attribute names used; a write removes the last one.
const NAMES: [&[u8]; 3] = [b"user.a", b"trusted.b", b"security.capability"];

#[derive(Clone, Debug)]
enum Op {
    Create(usize),
    Unlink(usize),
    /// Sets name `.1` of file `.0` to a value of `.2` bytes.
    Set(usize, usize, usize),
    Remove(usize, usize),
    Write(usize),
    DropCaches,
}

fn op() -> impl Strategy<Value = Op> {
    let file = 0..FILES;
    let name = 0..NAMES.len();
    prop_oneof![
        2 => file.clone().prop_map(Op::Create),
        1 => file.clone().prop_map(Op::Unlink),
        4 => (file.clone(), name.clone(), prop_oneof![1..40usize, 600..1500usize])
            .prop_map(|(f, n, len)| Op::Set(f, n, len)),
        2 => (file.clone(), name).prop_map(|(f, n)| Op::Remove(f, n)),
        1 => file.prop_map(Op::Write),
        1 => Just(Op::DropCaches),
    ]
}

/// A fresh 16 MiB image from the real mkfs, as bytes (made once); `None` without e2fsprogs.
fn base_image() -> Option<&'static Vec<u8>> {
    common::small_image_bytes("xattrs.img")
}

fn file_name(f: usize) -> Vec<u8> {
    format!("f{f}").into_bytes()
}

/// The files as they should be: inode and attributes, by slot.
type Model = HashMap<usize, (u64, BTreeMap<Vec<u8>, Vec<u8>>)>;

fn check(fs: &Fs, model: &Model, after: &Op) -> Result<(), TestCaseError> {
    for (&f, (ino, attrs)) in model {
        for pass in 0..2 {
            for name in NAMES {
                let got = match fs.getxattr(*ino, name) {
                    Ok(v) => Some(v),
                    Err(FsError::NoAttribute) => None,
                    Err(e) => {
                        return Err(TestCaseError::fail(format!(
                            "after {after:?}: getxattr of file {f}: {e}"
                        )))
                    }
                };
                prop_assert_eq!(
                    got.as_ref(),
                    attrs.get(name),
                    "after {:?}: {} of file {} (read {})",
                    after,
                    String::from_utf8_lossy(name),
                    f,
                    pass
                );
            }
            let mut listed = fs
                .listxattr(*ino)
                .map_err(|e| TestCaseError::fail(format!("listxattr: {e}")))?;
            listed.sort();
            let want: Vec<Vec<u8>> = attrs.keys().cloned().collect();
            prop_assert_eq!(
                listed,
                want,
                "after {:?}: list of file {} ({})",
                after,
                f,
                pass
            );
        }
    }
    Ok(())
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
    let mut model = Model::new();
    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Create(f) => {
                model.entry(f).or_insert_with(|| {
                    let made = fs.create(ROOT_INO, &file_name(f), 0o100644, 0, creds);
                    (made.unwrap().ino, BTreeMap::new())
                });
            }
            Op::Unlink(f) => {
                if model.remove(&f).is_some() {
                    fs.unlink(ROOT_INO, &file_name(f)).unwrap();
                    // Freed numbers are handed out again once the freeing commit is durable.
                    fs.sync().unwrap();
                }
            }
            Op::Set(f, n, len) => {
                if let Some((ino, attrs)) = model.get_mut(&f) {
                    let value = vec![step as u8; len];
                    match fs.setxattr(*ino, NAMES[n], &value, XattrSetMode::Any) {
                        Ok(()) => {
                            attrs.insert(NAMES[n].to_vec(), value);
                        }
                        // The file's values no longer fit in the inode and one block.
                        Err(FsError::NoSpace) => {}
                        Err(e) => panic!("setxattr: {e}"),
                    }
                }
            }
            Op::Remove(f, n) => {
                if let Some((ino, attrs)) = model.get_mut(&f) {
                    let got = fs.removexattr(*ino, NAMES[n]);
                    match attrs.remove(NAMES[n]) {
                        Some(_) => got.unwrap(),
                        None => assert!(matches!(got, Err(FsError::NoAttribute)), "{got:?}"),
                    }
                }
            }
            Op::Write(f) => {
                if let Some((ino, attrs)) = model.get_mut(&f) {
                    fs.write(*ino, 0, b"x").unwrap();
                    attrs.remove(&b"security.capability"[..]);
                }
            }
            Op::DropCaches => fs.drop_caches().unwrap(),
        }
        check(&fs, &model, op)?;
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
    fn xattr_reads_agree_with_the_inodes_after_every_change(
        ops in proptest::collection::vec(op(), 1..40)
    ) {
        run(&ops)?;
    }
}
