//! ext4 inodes (`s_inode_size` bytes, usually 256; the first 128 are the classic inode).
//!
//! Layout:
//! ```text
//! 0x00 i_mode u16     0x02 i_uid u16      0x04 i_size_lo u32   0x08 i_atime u32
//! 0x0C i_ctime u32    0x10 i_mtime u32    0x14 i_dtime u32     0x18 i_gid u16
//! 0x1A i_links_count u16                  0x1C i_blocks_lo u32 0x20 i_flags u32
//! 0x24 l_i_version u32                    0x28 i_block [60 bytes: extent tree root, symlink
//!                                              target, or device numbers]
//! 0x64 i_generation u32                   0x68 i_file_acl_lo u32 0x6C i_size_high u32
//! 0x74 l_i_blocks_high u16                0x76 l_i_file_acl_high u16
//! 0x78 l_i_uid_high u16                   0x7A l_i_gid_high u16
//! 0x7C l_i_checksum_lo u16                -- extra part (i_extra_isize bytes) --
//! 0x80 i_extra_isize u16                  0x82 i_checksum_hi u16
//! 0x84 i_ctime_extra  0x88 i_mtime_extra  0x8C i_atime_extra  0x90 i_crtime  0x94 i_crtime_extra
//! ```
//! `*_extra` time words: bits 0-1 extend the seconds past 2038 (epoch), bits 2-31 nanoseconds.
//! Checksum: crc32c(seed, le32 ino, le32 generation, the inode with both checksum fields
//! zeroed); low 16 bits in `l_i_checksum_lo`, high 16 in `i_checksum_hi` when it fits.

use crate::error::Corrupt;
use crate::format::{crc32c_raw, le16, le32, put_le16, put_le32};

use super::inode_csum_seed;

const I_MODE: usize = 0x00;
const I_UID: usize = 0x02;
const I_SIZE_LO: usize = 0x04;
const I_ATIME: usize = 0x08;
const I_CTIME: usize = 0x0C;
const I_MTIME: usize = 0x10;
const I_DTIME: usize = 0x14;
const I_GID: usize = 0x18;
const I_LINKS_COUNT: usize = 0x1A;
const I_BLOCKS_LO: usize = 0x1C;
const I_FLAGS: usize = 0x20;
/// Offset of `i_block`.
pub const I_BLOCK: usize = 0x28;
/// Size of `i_block`.
pub const I_BLOCK_LEN: usize = 60;
const I_GENERATION: usize = 0x64;
const I_FILE_ACL_LO: usize = 0x68;
const I_SIZE_HIGH: usize = 0x6C;
const I_BLOCKS_HIGH: usize = 0x74;
const I_FILE_ACL_HIGH: usize = 0x76;
const I_UID_HIGH: usize = 0x78;
const I_GID_HIGH: usize = 0x7A;
const I_CHECKSUM_LO: usize = 0x7C;
/// Size of the classic inode; the extra part follows.
pub const GOOD_OLD_INODE_SIZE: usize = 0x80;
const I_EXTRA_ISIZE: usize = 0x80;
const I_CHECKSUM_HI: usize = 0x82;
const I_CTIME_EXTRA: usize = 0x84;
const I_MTIME_EXTRA: usize = 0x88;
const I_ATIME_EXTRA: usize = 0x8C;
const I_CRTIME: usize = 0x90;
const I_CRTIME_EXTRA: usize = 0x94;

/// `i_mode` file type bits.
pub mod mode {
    /// Mask of the type bits.
    pub const S_IFMT: u16 = 0o170000;
    /// Socket.
    pub const S_IFSOCK: u16 = 0o140000;
    /// Symbolic link.
    pub const S_IFLNK: u16 = 0o120000;
    /// Regular file.
    pub const S_IFREG: u16 = 0o100000;
    /// Block device.
    pub const S_IFBLK: u16 = 0o060000;
    /// Directory.
    pub const S_IFDIR: u16 = 0o040000;
    /// Character device.
    pub const S_IFCHR: u16 = 0o020000;
    /// Fifo.
    pub const S_IFIFO: u16 = 0o010000;
    /// Set-uid bit.
    pub const S_ISUID: u16 = 0o4000;
    /// Set-gid bit.
    pub const S_ISGID: u16 = 0o2000;
    /// Sticky bit.
    pub const S_ISVTX: u16 = 0o1000;
    /// Execute permission of the group.
    pub const S_IXGRP: u16 = 0o0010;
}

/// `i_flags` bits tidefs interprets.
pub mod flags {
    /// Hashed directory (htree).
    pub const INDEX: u32 = 0x1000;
    /// Per-file data journaling.
    pub const JOURNAL_DATA: u32 = 0x4000;
    /// `i_blocks` counts file-system blocks, not sectors.
    pub const HUGE_FILE: u32 = 0x40000;
    /// The inode uses an extent tree.
    pub const EXTENTS: u32 = 0x80000;
    /// The inode stores a large xattr value.
    pub const EA_INODE: u32 = 0x200000;
    /// Data stored inside the inode.
    pub const INLINE_DATA: u32 = 0x1000_0000;
}

/// A time stored in an inode: seconds since the epoch and nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InodeTime {
    /// Seconds (signed, extended by the epoch bits).
    pub sec: i64,
    /// Nanoseconds.
    pub nsec: u32,
}

/// An inode as raw bytes with typed accessors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inode {
    raw: Vec<u8>,
}

impl Inode {
    /// Wraps raw inode bytes (`inode_size` long) without checks; see [`Inode::verify`].
    pub fn from_bytes(raw: &[u8]) -> Inode {
        Inode { raw: raw.to_vec() }
    }

    /// A zeroed inode of `size` bytes whose extra part is `extra_isize` long.
    pub fn new_zeroed(size: usize, extra_isize: u16) -> Inode {
        let mut raw = vec![0u8; size];
        if size > GOOD_OLD_INODE_SIZE {
            put_le16(&mut raw, I_EXTRA_ISIZE, extra_isize);
        }
        Inode { raw }
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.raw
    }

    /// Checks the extra size and, with metadata checksums, the checksum.
    pub fn verify(&self, seed: Option<u32>, ino: u32) -> Result<(), Corrupt> {
        if self.raw.len() > GOOD_OLD_INODE_SIZE {
            let extra = usize::from(self.extra_isize());
            if GOOD_OLD_INODE_SIZE + extra > self.raw.len() || extra % 4 != 0 {
                return Err(Corrupt::new(format!(
                    "inode {ino}: invalid extra size {extra}"
                )));
            }
        }
        if let Some(seed) = seed {
            let (stored, computed) = (self.stored_checksum(), self.compute_checksum(seed, ino));
            if stored != computed {
                return Err(Corrupt::new(format!(
                    "inode {ino}: checksum mismatch (stored {stored:#x}, computed {computed:#x})"
                )));
            }
        }
        Ok(())
    }

    fn has_checksum_hi(&self) -> bool {
        self.raw.len() > GOOD_OLD_INODE_SIZE && usize::from(self.extra_isize()) >= 4
    }

    fn stored_checksum(&self) -> u32 {
        let lo = u32::from(le16(&self.raw, I_CHECKSUM_LO));
        if self.has_checksum_hi() {
            lo | (u32::from(le16(&self.raw, I_CHECKSUM_HI)) << 16)
        } else {
            lo
        }
    }

    fn compute_checksum(&self, seed: u32, ino: u32) -> u32 {
        let mut copy = self.raw.clone();
        put_le16(&mut copy, I_CHECKSUM_LO, 0);
        let has_hi = self.has_checksum_hi();
        if has_hi {
            put_le16(&mut copy, I_CHECKSUM_HI, 0);
        }
        let s = inode_csum_seed(seed, ino, self.generation());
        let c = crc32c_raw(s, &copy);
        if has_hi {
            c
        } else {
            c & 0xFFFF
        }
    }

    /// Recomputes and stores the checksum (no-op without metadata checksums).
    pub fn update_checksum(&mut self, seed: Option<u32>, ino: u32) {
        if let Some(seed) = seed {
            let c = self.compute_checksum(seed, ino);
            put_le16(&mut self.raw, I_CHECKSUM_LO, (c & 0xFFFF) as u16);
            if self.has_checksum_hi() {
                put_le16(&mut self.raw, I_CHECKSUM_HI, (c >> 16) as u16);
            }
        }
    }

    /// Mode: type and permission bits.
    pub fn mode(&self) -> u16 {
        le16(&self.raw, I_MODE)
    }
    /// Sets the mode.
    pub fn set_mode(&mut self, v: u16) {
        put_le16(&mut self.raw, I_MODE, v);
    }
    /// Type bits of the mode.
    pub fn file_type(&self) -> u16 {
        self.mode() & mode::S_IFMT
    }
    /// Whether this is a directory.
    pub fn is_dir(&self) -> bool {
        self.file_type() == mode::S_IFDIR
    }
    /// Whether this is a regular file.
    pub fn is_reg(&self) -> bool {
        self.file_type() == mode::S_IFREG
    }
    /// Whether this is a symbolic link.
    pub fn is_symlink(&self) -> bool {
        self.file_type() == mode::S_IFLNK
    }
    /// Owner.
    pub fn uid(&self) -> u32 {
        u32::from(le16(&self.raw, I_UID)) | (u32::from(le16(&self.raw, I_UID_HIGH)) << 16)
    }
    /// Sets the owner.
    pub fn set_uid(&mut self, v: u32) {
        put_le16(&mut self.raw, I_UID, (v & 0xFFFF) as u16);
        put_le16(&mut self.raw, I_UID_HIGH, (v >> 16) as u16);
    }
    /// Group.
    pub fn gid(&self) -> u32 {
        u32::from(le16(&self.raw, I_GID)) | (u32::from(le16(&self.raw, I_GID_HIGH)) << 16)
    }
    /// Sets the group.
    pub fn set_gid(&mut self, v: u32) {
        put_le16(&mut self.raw, I_GID, (v & 0xFFFF) as u16);
        put_le16(&mut self.raw, I_GID_HIGH, (v >> 16) as u16);
    }
    /// Size in bytes.
    pub fn size(&self) -> u64 {
        u64::from(le32(&self.raw, I_SIZE_LO)) | (u64::from(le32(&self.raw, I_SIZE_HIGH)) << 32)
    }
    /// Sets the size.
    pub fn set_size(&mut self, v: u64) {
        put_le32(&mut self.raw, I_SIZE_LO, (v & 0xFFFF_FFFF) as u32);
        put_le32(&mut self.raw, I_SIZE_HIGH, (v >> 32) as u32);
    }
    /// Hard-link count.
    pub fn links_count(&self) -> u16 {
        le16(&self.raw, I_LINKS_COUNT)
    }
    /// Sets the hard-link count.
    pub fn set_links_count(&mut self, v: u16) {
        put_le16(&mut self.raw, I_LINKS_COUNT, v);
    }
    /// Blocks used, in 512-byte sectors (or fs blocks with `HUGE_FILE` flag; see
    /// [`Inode::blocks_512`]).
    fn raw_blocks(&self) -> u64 {
        u64::from(le32(&self.raw, I_BLOCKS_LO)) | (u64::from(le16(&self.raw, I_BLOCKS_HIGH)) << 32)
    }
    /// Space used in 512-byte units.
    pub fn blocks_512(&self, block_size: u32) -> u64 {
        if self.flags() & flags::HUGE_FILE != 0 {
            self.raw_blocks() * u64::from(block_size / 512)
        } else {
            self.raw_blocks()
        }
    }
    /// Sets the space used, in 512-byte units (clears the `HUGE_FILE` flag).
    pub fn set_blocks_512(&mut self, v: u64) {
        self.set_flags(self.flags() & !flags::HUGE_FILE);
        put_le32(&mut self.raw, I_BLOCKS_LO, (v & 0xFFFF_FFFF) as u32);
        put_le16(&mut self.raw, I_BLOCKS_HIGH, ((v >> 32) & 0xFFFF) as u16);
    }
    /// Inode flags.
    pub fn flags(&self) -> u32 {
        le32(&self.raw, I_FLAGS)
    }
    /// Sets the inode flags.
    pub fn set_flags(&mut self, v: u32) {
        put_le32(&mut self.raw, I_FLAGS, v);
    }
    /// Deletion time (also the next orphan while on the orphan list).
    pub fn dtime(&self) -> u32 {
        le32(&self.raw, I_DTIME)
    }
    /// Sets the deletion time / next orphan.
    pub fn set_dtime(&mut self, v: u32) {
        put_le32(&mut self.raw, I_DTIME, v);
    }
    /// Generation number.
    pub fn generation(&self) -> u32 {
        le32(&self.raw, I_GENERATION)
    }
    /// Sets the generation number.
    pub fn set_generation(&mut self, v: u32) {
        put_le32(&mut self.raw, I_GENERATION, v);
    }
    /// Block holding extended attributes (0 if none).
    pub fn file_acl(&self) -> u64 {
        u64::from(le32(&self.raw, I_FILE_ACL_LO))
            | (u64::from(le16(&self.raw, I_FILE_ACL_HIGH)) << 32)
    }
    /// Sets the extended-attribute block.
    pub fn set_file_acl(&mut self, v: u64) {
        put_le32(&mut self.raw, I_FILE_ACL_LO, (v & 0xFFFF_FFFF) as u32);
        put_le16(&mut self.raw, I_FILE_ACL_HIGH, ((v >> 32) & 0xFFFF) as u16);
    }
    /// Size of the extra part after the classic 128 bytes.
    pub fn extra_isize(&self) -> u16 {
        if self.raw.len() > GOOD_OLD_INODE_SIZE {
            le16(&self.raw, I_EXTRA_ISIZE)
        } else {
            0
        }
    }
    /// The 60 bytes of `i_block`.
    pub fn i_block(&self) -> &[u8] {
        &self.raw[I_BLOCK..I_BLOCK + I_BLOCK_LEN]
    }
    /// The 60 bytes of `i_block`, writable.
    pub fn i_block_mut(&mut self) -> &mut [u8] {
        &mut self.raw[I_BLOCK..I_BLOCK + I_BLOCK_LEN]
    }
    /// Bytes after the extra part, where in-inode extended attributes live.
    pub fn xattr_area(&self) -> &[u8] {
        let start = GOOD_OLD_INODE_SIZE + usize::from(self.extra_isize());
        self.raw.get(start..).unwrap_or(&[])
    }
    /// The in-inode extended-attribute area, writable.
    pub fn xattr_area_mut(&mut self) -> &mut [u8] {
        let start = GOOD_OLD_INODE_SIZE + usize::from(self.extra_isize());
        let len = self.raw.len();
        &mut self.raw[start.min(len)..]
    }

    /// Whether the inode keeps the nanoseconds (and epoch bits) of its change and
    /// modification times: its extra part reaches `i_ctime_extra` and `i_mtime_extra`.
    pub fn keeps_nanoseconds(&self) -> bool {
        self.has_extra_field(I_CTIME_EXTRA) && self.has_extra_field(I_MTIME_EXTRA)
    }

    fn has_extra_field(&self, off: usize) -> bool {
        self.raw.len() > GOOD_OLD_INODE_SIZE
            && off + 4 <= GOOD_OLD_INODE_SIZE + usize::from(self.extra_isize())
    }

    fn time(&self, base: usize, extra: usize) -> InodeTime {
        let secs = i64::from(le32(&self.raw, base) as i32);
        if self.has_extra_field(extra) {
            let x = le32(&self.raw, extra);
            InodeTime {
                sec: secs + (i64::from(x & 3) << 32),
                nsec: x >> 2,
            }
        } else {
            InodeTime { sec: secs, nsec: 0 }
        }
    }

    fn set_time(&mut self, base: usize, extra: usize, t: InodeTime) {
        // What the fields hold, as the kernel clamps a time to them (`s_time_min` and
        // `s_time_max`): 1901-12-13 to 2038-01-19 in the base field alone, to 2446-05-10
        // with the 2-bit epoch of the extra field.
        let wide = self.has_extra_field(extra);
        let (min, max) = (
            i64::from(i32::MIN),
            i64::from(i32::MAX) + if wide { 3 << 32 } else { 0 },
        );
        let sec = t.sec.clamp(min, max);
        // The low 32 bits go to the base field; the bits above are the 2-bit epoch.
        put_le32(&mut self.raw, base, (sec & 0xFFFF_FFFF) as u32);
        if wide {
            let epoch = (((sec - i64::from((sec & 0xFFFF_FFFF) as u32 as i32)) >> 32) & 3) as u32;
            // A time at either end is the end itself, as the kernel's `timestamp_truncate`
            // makes it.
            let nsec = if min < sec && sec < max {
                t.nsec.min(999_999_999)
            } else {
                0
            };
            put_le32(&mut self.raw, extra, (nsec << 2) | epoch);
        }
    }

    /// Access time.
    pub fn atime(&self) -> InodeTime {
        self.time(I_ATIME, I_ATIME_EXTRA)
    }
    /// Change time.
    pub fn ctime(&self) -> InodeTime {
        self.time(I_CTIME, I_CTIME_EXTRA)
    }
    /// Modification time.
    pub fn mtime(&self) -> InodeTime {
        self.time(I_MTIME, I_MTIME_EXTRA)
    }
    /// Creation time.
    pub fn crtime(&self) -> InodeTime {
        if self.has_extra_field(I_CRTIME) {
            self.time(I_CRTIME, I_CRTIME_EXTRA)
        } else {
            InodeTime::default()
        }
    }
    /// Sets the access time.
    pub fn set_atime(&mut self, t: InodeTime) {
        self.set_time(I_ATIME, I_ATIME_EXTRA, t);
    }
    /// Sets the change time.
    pub fn set_ctime(&mut self, t: InodeTime) {
        self.set_time(I_CTIME, I_CTIME_EXTRA, t);
    }
    /// Sets the modification time.
    pub fn set_mtime(&mut self, t: InodeTime) {
        self.set_time(I_MTIME, I_MTIME_EXTRA, t);
    }
    /// Sets the creation time (no-op without room for it).
    pub fn set_crtime(&mut self, t: InodeTime) {
        if self.has_extra_field(I_CRTIME) {
            self.set_time(I_CRTIME, I_CRTIME_EXTRA, t);
        }
    }
}

/// Device number stored in `i_block` of a device inode, in the kernel's encodings: the old
/// 16-bit form in word 0 when it fits, else the new form in word 1.
pub fn decode_rdev(i_block: &[u8]) -> u32 {
    let w0 = le32(i_block, 0);
    if w0 != 0 {
        let major = (w0 >> 8) & 0xFF;
        let minor = w0 & 0xFF;
        return (major << 8) | minor;
    }
    let w1 = le32(i_block, 4);
    let major = (w1 & 0xFFF00) >> 8;
    let minor = (w1 & 0xFF) | ((w1 >> 12) & 0xFFF00);
    makedev(major, minor)
}

/// Encodes a device number into `i_block` as the kernel does.
pub fn encode_rdev(i_block: &mut [u8], rdev: u32) {
    let (major, minor) = (dev_major(rdev), dev_minor(rdev));
    i_block[..8].fill(0);
    if major < 256 && minor < 256 {
        put_le32(i_block, 0, (major << 8) | minor);
    } else {
        put_le32(
            i_block,
            4,
            (minor & 0xFF) | (major << 8) | ((minor & !0xFF) << 12),
        );
    }
}

/// Linux `makedev` for 32-bit device numbers (major 12 bits, minor 20 bits).
pub fn makedev(major: u32, minor: u32) -> u32 {
    ((major & 0xFFF) << 8) | (minor & 0xFF) | ((minor & 0xFFF00) << 12)
}

/// Major number of a 32-bit Linux device number.
pub fn dev_major(rdev: u32) -> u32 {
    (rdev >> 8) & 0xFFF
}

/// Minor number of a 32-bit Linux device number.
pub fn dev_minor(rdev: u32) -> u32 {
    (rdev & 0xFF) | ((rdev >> 12) & 0xFFF00)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_and_checksum() {
        let mut ino = Inode::new_zeroed(256, 32);
        ino.set_mode(mode::S_IFREG | 0o644);
        ino.set_uid(70000);
        ino.set_gid(5);
        ino.set_size(1 << 40);
        ino.set_links_count(2);
        ino.set_blocks_512(1 << 33);
        ino.set_generation(99);
        let t = InodeTime {
            sec: 1_700_000_000,
            nsec: 123_456_789,
        };
        ino.set_mtime(t);
        let far = InodeTime {
            sec: (1i64 << 32) + 5,
            nsec: 1,
        };
        ino.set_ctime(far);
        ino.update_checksum(Some(42), 12);
        assert_eq!(ino.uid(), 70000);
        assert_eq!(ino.size(), 1 << 40);
        assert_eq!(ino.blocks_512(4096), 1 << 33);
        assert_eq!(ino.mtime(), t);
        assert_eq!(ino.ctime(), far);
        ino.verify(Some(42), 12).unwrap();
        assert!(ino.verify(Some(42), 13).is_err());
        let mut bad = ino.clone();
        bad.set_links_count(3);
        assert!(bad
            .verify(Some(42), 12)
            .unwrap_err()
            .what
            .contains("checksum"));
    }

    #[test]
    fn negative_times_survive() {
        let mut ino = Inode::new_zeroed(256, 32);
        let t = InodeTime { sec: -5, nsec: 7 };
        ino.set_atime(t);
        assert_eq!(ino.atime(), t);
    }

    /// Times past what the fields hold are clamped to their ends, as the kernel does, never
    /// wrapped (year 2603 was stored as 2059) and never an overflow (`i64::MAX` panicked).
    #[test]
    fn times_out_of_range_are_clamped() {
        let wide_max = i64::from(i32::MAX) + (3 << 32);
        for (size, extra, max) in [(256, 32, wide_max), (128, 0, i64::from(i32::MAX))] {
            let mut ino = Inode::new_zeroed(size, extra);
            for (sec, want) in [
                (20_000_000_000, max),
                (i64::MAX, max),
                (i64::MIN, i64::from(i32::MIN)),
                (max, max),
                (-5, -5),
            ] {
                ino.set_mtime(InodeTime { sec, nsec: 5 });
                assert_eq!(ino.mtime().sec, want, "inode of {size} bytes, {sec}");
                if size > 128 {
                    let inside = i64::from(i32::MIN) < want && want < max;
                    let nsec = if inside { 5 } else { 0 };
                    assert_eq!(ino.mtime().nsec, nsec, "{sec}");
                }
            }
        }
    }

    #[test]
    fn rdev_encodings() {
        let mut b = [0u8; 60];
        for (maj, min) in [(8u32, 1u32), (259, 3), (4, 300)] {
            let d = makedev(maj, min);
            encode_rdev(&mut b, d);
            assert_eq!(decode_rdev(&b), d);
            assert_eq!((dev_major(d), dev_minor(d)), (maj, min));
        }
    }

    #[test]
    fn rejects_bad_extra_isize() {
        let mut raw = vec![0u8; 256];
        put_le16(&mut raw, I_EXTRA_ISIZE, 200);
        assert!(Inode::from_bytes(&raw).verify(None, 11).is_err());
    }
}
