//! Helpers that damage images the way a bad disk or a malicious image would, while keeping the
//! checksums that would otherwise catch the damage valid where a test needs the damage to
//! reach deeper validation. Shared by the corruption regression tests and the image fuzzer.

#![allow(dead_code)]

use std::path::Path;

use tidefs::format::ext4::extent::{self, ExtentNode};
use tidefs::format::ext4::group_desc::{GroupDesc, GroupDescRef};
use tidefs::format::ext4::inode::Inode;
use tidefs::format::ext4::inode_csum_seed;
use tidefs::format::ext4::superblock::Superblock;
use tidefs::fs::{Fs, Ino};

/// The superblock of an image.
pub fn superblock(img: &[u8]) -> Superblock {
    Superblock::parse(&img[1024..2048]).unwrap()
}

/// Byte offset of group descriptor `g`.
pub fn desc_offset(img: &[u8], g: u32) -> usize {
    let sb = superblock(img);
    let bs = u64::from(sb.block_size());
    let first_gdt = (u64::from(sb.first_data_block()) + 1) * bs;
    (first_gdt + u64::from(g) * u64::from(sb.desc_size())) as usize
}

/// Group descriptor `g` as (block bitmap, inode bitmap, inode table).
pub fn group_blocks(img: &[u8], g: u32) -> (u64, u64, u64) {
    let ds = superblock(img).desc_size() as usize;
    let d = desc_offset(img, g);
    let r = GroupDescRef::new(&img[d..d + ds]);
    (r.block_bitmap(), r.inode_bitmap(), r.inode_table())
}

/// Edits group descriptor `g` and stores its checksum again.
pub fn edit_desc(img: &mut [u8], g: u32, f: impl FnOnce(&mut [u8])) {
    let sb = superblock(img);
    let ds = sb.desc_size() as usize;
    let d = desc_offset(img, g);
    f(&mut img[d..d + ds]);
    if let Some(seed) = sb.csum_seed() {
        GroupDesc::new(&mut img[d..d + ds]).update_checksum(seed, g);
    }
}

/// Reads inode `ino`.
pub fn inode(img: &[u8], ino: u32) -> Inode {
    let isz = usize::from(superblock(img).inode_size());
    let off = crate::common::inode_offset(img, ino);
    Inode::from_bytes(&img[off..off + isz])
}

/// Edits inode `ino` and stores its checksum again, so only the edited fields are wrong.
pub fn edit_inode(img: &mut [u8], ino: u32, f: impl FnOnce(&mut Inode)) {
    let sb = superblock(img);
    let isz = usize::from(sb.inode_size());
    let off = crate::common::inode_offset(img, ino);
    let mut i = Inode::from_bytes(&img[off..off + isz]);
    f(&mut i);
    i.update_checksum(sb.csum_seed(), ino);
    img[off..off + isz].copy_from_slice(i.as_bytes());
}

/// The extent-tree blocks of inode `ino` and, for its leaves, the mapped physical runs.
pub fn tree_blocks(img: &[u8], ino: u32) -> (Vec<u64>, Vec<(u64, u32)>) {
    let bs = superblock(img).block_size() as usize;
    let mut blocks = Vec::new();
    let mut runs = Vec::new();
    let Ok(root) = extent::parse_node(inode(img, ino).i_block()) else {
        return (blocks, runs);
    };
    let mut stack = vec![root];
    while let Some(n) = stack.pop() {
        match n {
            ExtentNode::Leaf(e) => runs.extend(e.iter().map(|x| (x.physical, x.len))),
            ExtentNode::Index { entries, .. } => {
                for x in entries {
                    let at = x.child as usize * bs;
                    if let Ok(child) = extent::parse_node(&img[at..at + bs]) {
                        blocks.push(x.child);
                        stack.push(child);
                    }
                }
            }
        }
    }
    (blocks, runs)
}

/// Stores the checksum tail of extent-tree block `nr` (owned by inode `ino`) again.
pub fn fix_extent_block(img: &mut [u8], ino: u32, nr: u64) {
    let sb = superblock(img);
    let bs = sb.block_size() as usize;
    let generation = inode(img, ino).generation();
    if let Some(seed) = sb.csum_seed() {
        let at = nr as usize * bs;
        extent::set_tail_checksum(
            &mut img[at..at + bs],
            inode_csum_seed(seed, ino, generation),
        );
    }
}

/// Stores the checksum tail of directory block `nr` (of directory `ino`) again.
pub fn fix_dir_block(img: &mut [u8], ino: u32, nr: u64) {
    let sb = superblock(img);
    let bs = sb.block_size() as usize;
    let generation = inode(img, ino).generation();
    let at = nr as usize * bs;
    let b = &mut img[at..at + bs];
    if let (Some(seed), true) = (sb.csum_seed(), tidefs::format::ext4::dirent::has_tail(b)) {
        tidefs::format::ext4::dirent::set_tail_checksum(b, inode_csum_seed(seed, ino, generation));
    }
}

/// Stores the superblock checksum again.
pub fn fix_sb(img: &mut [u8]) {
    let mut sb = Superblock::parse_checked(&img[1024..2048], false).unwrap();
    sb.update_checksum();
    sb.write(&mut img[1024..2048]);
}

/// Edits an image file in place.
pub fn edit(image: &Path, f: impl FnOnce(&mut Vec<u8>)) {
    let mut b = std::fs::read(image).unwrap();
    f(&mut b);
    std::fs::write(image, b).unwrap();
}

/// Names in directory `dir` (without "." and "..").
pub fn names(fs: &Fs, dir: Ino) -> tidefs::Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    fs.readdir(dir, 0, &mut |e| {
        if e.name != b"." && e.name != b".." {
            out.push(e.name);
        }
        true
    })?;
    out.sort();
    Ok(out)
}

/// Whether `r` failed with `Corrupt`.
pub fn is_corrupt<T: std::fmt::Debug>(r: &tidefs::Result<T>) -> bool {
    matches!(r, Err(tidefs::FsError::Corrupt(_)))
}

/// Byte offset in the image of block `n` of the internal journal (inode 8, whose extents live
/// in the inode: mkfs makes a journal of a few extents).
pub fn journal_block_offset(img: &[u8], n: u32) -> usize {
    let sb = superblock(img);
    let bs = sb.block_size() as usize;
    match extent::parse_node(inode(img, sb.journal_inum()).i_block()).unwrap() {
        ExtentNode::Leaf(exts) => {
            let e = exts
                .iter()
                .find(|e| n >= e.logical && n - e.logical < e.len)
                .unwrap();
            (e.physical + u64::from(n - e.logical)) as usize * bs
        }
        other => panic!("journal extent tree deeper than the tests expect: {other:?}"),
    }
}
