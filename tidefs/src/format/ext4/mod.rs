//! ext4 on-disk structures (little-endian). Each module documents its byte layout at the top and
//! offers typed accessors over the raw bytes, so that fields tidefs does not interpret are kept
//! exactly as they were on disk.
//!
//! Source of the layouts: the kernel's Documentation/filesystems/ext4/ and e2fsprogs'
//! lib/ext2fs/ext2_fs.h.

pub mod dirent;
pub mod extent;
pub mod group_desc;
pub mod inode;
pub mod superblock;
pub mod xattr;

/// Seed of every per-object checksum: crc32c of the UUID, or `s_checksum_seed` when the
/// `metadata_csum_seed` feature is on. `None` when the file system has no metadata checksums.
pub type CsumSeed = Option<u32>;

/// The seed for checksums of an inode's own structures (inode, extent blocks, directory blocks):
/// the file-system seed chained with the inode number and generation.
pub fn inode_csum_seed(fs_seed: u32, ino: u32, generation: u32) -> u32 {
    let s = super::crc32c_raw(fs_seed, &ino.to_le_bytes());
    super::crc32c_raw(s, &generation.to_le_bytes())
}
