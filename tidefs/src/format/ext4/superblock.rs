//! The ext4 superblock (1024 bytes at byte 1024 of the device, little-endian).
//!
//! Layout (only the fields tidefs reads or writes; all others are preserved byte for byte):
//! ```text
//! 0x00 s_inodes_count u32      0x04 s_blocks_count_lo u32   0x08 s_r_blocks_count_lo u32
//! 0x0C s_free_blocks_count_lo  0x10 s_free_inodes_count     0x14 s_first_data_block
//! 0x18 s_log_block_size        0x1C s_log_cluster_size      0x20 s_blocks_per_group
//! 0x24 s_clusters_per_group    0x28 s_inodes_per_group      0x2C s_mtime   0x30 s_wtime
//! 0x34 s_mnt_count u16         0x36 s_max_mnt_count u16     0x38 s_magic u16 (0xEF53)
//! 0x3A s_state u16 (1 clean, 2 errors, 4 orphans)           0x4C s_rev_level u32
//! 0x54 s_first_ino u32         0x58 s_inode_size u16         0x5A s_block_group_nr u16
//! 0x5C s_feature_compat        0x60 s_feature_incompat      0x64 s_feature_ro_compat
//! 0x68 s_uuid [16]             0xCE s_reserved_gdt_blocks u16
//! 0xE0 s_journal_inum u32      0xE8 s_last_orphan u32       0xEC s_hash_seed [4 x u32]
//! 0xFC s_def_hash_version u8   0xFE s_desc_size u16         0x150 s_blocks_count_hi u32
//! 0x154 s_r_blocks_count_hi    0x158 s_free_blocks_count_hi 0x15C s_min_extra_isize u16
//! 0x15E s_want_extra_isize u16 0x160 s_flags u32            0x174 s_log_groups_per_flex u8
//! 0x175 s_checksum_type u8 (1 = crc32c)                     0x178 s_kbytes_written u64
//! 0x194 s_error_count u32      0x198 s_first_error_time u32 0x19C s_first_error_ino u32
//! 0x1A0 s_first_error_block u64                             0x1A8 s_first_error_func [32]
//! 0x1C8 s_first_error_line u32 0x1CC s_last_error_time u32  0x1D0 s_last_error_ino u32
//! 0x1D4 s_last_error_line u32  0x1D8 s_last_error_block u64 0x1E0 s_last_error_func [32]
//! 0x27C s_first_error_errcode u8                            0x27D s_last_error_errcode u8
//! 0x270 s_checksum_seed u32    0x3FC s_checksum u32 (crc32c of bytes 0..0x3FC)
//! ```

use crate::error::Corrupt;
use crate::format::{crc32c_raw, le16, le32, le64, put_le16, put_le32, put_le64};

/// Size of the superblock.
pub const SUPERBLOCK_SIZE: usize = 1024;
/// Byte offset of the superblock on the device.
pub const SUPERBLOCK_OFFSET: u64 = 1024;
/// ext2/3/4 magic number.
pub const EXT4_MAGIC: u16 = 0xEF53;

/// Block groups a file system may have: tidefs keeps a summary of each in memory (and
/// mke2fs's default geometry reaches this only at 2 PiB with 4 KiB blocks), so a superblock
/// claiming billions of tiny groups is refused rather than exhausting memory.
pub const MAX_GROUPS: u64 = 1 << 24;

const S_INODES_COUNT: usize = 0x00;
const S_BLOCKS_COUNT_LO: usize = 0x04;
const S_R_BLOCKS_COUNT_LO: usize = 0x08;
const S_FREE_BLOCKS_COUNT_LO: usize = 0x0C;
const S_FREE_INODES_COUNT: usize = 0x10;
const S_FIRST_DATA_BLOCK: usize = 0x14;
const S_LOG_BLOCK_SIZE: usize = 0x18;
const S_LOG_CLUSTER_SIZE: usize = 0x1C;
const S_BLOCKS_PER_GROUP: usize = 0x20;
const S_INODES_PER_GROUP: usize = 0x28;
const S_MTIME: usize = 0x2C;
const S_WTIME: usize = 0x30;
const S_MNT_COUNT: usize = 0x34;
const S_MAGIC: usize = 0x38;
const S_STATE: usize = 0x3A;
const S_REV_LEVEL: usize = 0x4C;
const S_FIRST_INO: usize = 0x54;
const S_INODE_SIZE: usize = 0x58;
const S_BLOCK_GROUP_NR: usize = 0x5A;
const S_FEATURE_COMPAT: usize = 0x5C;
const S_FEATURE_INCOMPAT: usize = 0x60;
const S_FEATURE_RO_COMPAT: usize = 0x64;
const S_UUID: usize = 0x68;
const S_RESERVED_GDT_BLOCKS: usize = 0xCE;
const S_JOURNAL_UUID: usize = 0xD0;
const S_JOURNAL_INUM: usize = 0xE0;
const S_JOURNAL_DEV: usize = 0xE4;
const S_LAST_ORPHAN: usize = 0xE8;
const S_HASH_SEED: usize = 0xEC;
const S_DEF_HASH_VERSION: usize = 0xFC;
const S_DESC_SIZE: usize = 0xFE;
const S_BLOCKS_COUNT_HI: usize = 0x150;
const S_R_BLOCKS_COUNT_HI: usize = 0x154;
const S_FREE_BLOCKS_COUNT_HI: usize = 0x158;
const S_MIN_EXTRA_ISIZE: usize = 0x15C;
const S_WANT_EXTRA_ISIZE: usize = 0x15E;
const S_FLAGS: usize = 0x160;
const S_CHECKSUM_TYPE: usize = 0x175;
const S_KBYTES_WRITTEN: usize = 0x178;
const S_ERROR_COUNT: usize = 0x194;
const ERROR_FUNC_LEN: usize = 32;
const S_CHECKSUM_SEED: usize = 0x270;

/// Where one error record lives: the first-error and last-error fields have the same members at
/// different offsets (and the last error puts its line before its block).
struct ErrorFields {
    time: usize,
    ino: usize,
    block: usize,
    func: usize,
    line: usize,
    errcode: usize,
}

const FIRST_ERROR: ErrorFields = ErrorFields {
    time: 0x198,
    ino: 0x19C,
    block: 0x1A0,
    func: 0x1A8,
    line: 0x1C8,
    errcode: 0x27C,
};
const LAST_ERROR: ErrorFields = ErrorFields {
    time: 0x1CC,
    ino: 0x1D0,
    block: 0x1D8,
    func: 0x1E0,
    line: 0x1D4,
    errcode: 0x27D,
};
const S_CHECKSUM: usize = 0x3FC;
const _: () = assert!(S_CHECKSUM + 4 == SUPERBLOCK_SIZE);

/// Compatible features: an implementation that does not know them may still read and write.
pub mod compat {
    /// A journal exists.
    pub const HAS_JOURNAL: u32 = 0x4;
    /// Extended attributes.
    pub const EXT_ATTR: u32 = 0x8;
    /// Reserved GDT blocks for growth (inode 7); tidefs never touches them.
    pub const RESIZE_INODE: u32 = 0x10;
    /// Hashed directories.
    pub const DIR_INDEX: u32 = 0x20;
    /// Directory preallocation hint.
    pub const DIR_PREALLOC: u32 = 0x1;
    /// Inodes whose numbers never change (a promise tidefs keeps).
    pub const STABLE_INODES: u32 = 0x800;
    /// Every compat feature tidefs can honour when writing.
    pub const SUPPORTED: u32 =
        HAS_JOURNAL | EXT_ATTR | RESIZE_INODE | DIR_INDEX | DIR_PREALLOC | STABLE_INODES;
}

/// Incompatible features: an implementation that does not know one must not mount.
pub mod incompat {
    /// Directory entries carry a file type.
    pub const FILETYPE: u32 = 0x2;
    /// The journal needs recovery.
    pub const RECOVER: u32 = 0x4;
    /// This device is an external journal.
    pub const JOURNAL_DEV: u32 = 0x8;
    /// Files use extent trees.
    pub const EXTENTS: u32 = 0x40;
    /// 64-bit block numbers and 64-byte group descriptors.
    pub const BIT64: u32 = 0x80;
    /// Flexible block groups.
    pub const FLEX_BG: u32 = 0x200;
    /// The checksum seed is stored in the superblock.
    pub const CSUM_SEED: u32 = 0x2000;
    /// Every incompat feature tidefs implements.
    pub const SUPPORTED: u32 = FILETYPE | RECOVER | EXTENTS | BIT64 | FLEX_BG | CSUM_SEED;
    /// Names of known incompat bits, for error messages.
    pub const NAMES: &[(u32, &str)] = &[
        (0x1, "compression"),
        (FILETYPE, "filetype"),
        (RECOVER, "needs_recovery"),
        (JOURNAL_DEV, "journal_dev"),
        (0x10, "meta_bg"),
        (EXTENTS, "extent"),
        (BIT64, "64bit"),
        (0x100, "mmp"),
        (FLEX_BG, "flex_bg"),
        (0x400, "ea_inode"),
        (0x1000, "dirdata"),
        (CSUM_SEED, "metadata_csum_seed"),
        (0x4000, "large_dir"),
        (0x8000, "inline_data"),
        (0x10000, "encrypt"),
        (0x20000, "casefold"),
    ];
}

/// Read-only-compatible features: an implementation that does not know one may only read.
pub mod ro_compat {
    /// Superblock backups only in some groups.
    pub const SPARSE_SUPER: u32 = 0x1;
    /// Files larger than 2 GiB.
    pub const LARGE_FILE: u32 = 0x2;
    /// i_blocks may exceed 2^32 sectors.
    pub const HUGE_FILE: u32 = 0x8;
    /// Group descriptor checksums (crc16), superseded by metadata_csum.
    pub const GDT_CSUM: u32 = 0x10;
    /// Directories may have more than 65000 subdirectories.
    pub const DIR_NLINK: u32 = 0x20;
    /// Inodes have extra space after the first 128 bytes.
    pub const EXTRA_ISIZE: u32 = 0x40;
    /// crc32c on every metadata structure.
    pub const METADATA_CSUM: u32 = 0x400;
    /// Every ro_compat feature tidefs implements.
    pub const SUPPORTED: u32 =
        SPARSE_SUPER | LARGE_FILE | HUGE_FILE | DIR_NLINK | EXTRA_ISIZE | METADATA_CSUM;
    /// Names of known ro_compat bits, for error messages.
    pub const NAMES: &[(u32, &str)] = &[
        (SPARSE_SUPER, "sparse_super"),
        (LARGE_FILE, "large_file"),
        (0x4, "btree_dir"),
        (HUGE_FILE, "huge_file"),
        (GDT_CSUM, "uninit_bg"),
        (DIR_NLINK, "dir_nlink"),
        (EXTRA_ISIZE, "extra_isize"),
        (0x80, "has_snapshot"),
        (0x100, "quota"),
        (0x200, "bigalloc"),
        (METADATA_CSUM, "metadata_csum"),
        (0x800, "replica"),
        (0x1000, "read-only"),
        (0x2000, "project"),
        (0x4000, "shared_blocks"),
        (0x8000, "verity"),
        (0x10000, "orphan_present"),
    ];
}

/// Names the bits of `bits` that are not in `supported`, using `names`.
pub fn describe_unknown(bits: u32, supported: u32, names: &[(u32, &str)]) -> Option<String> {
    let unknown = bits & !supported;
    if unknown == 0 {
        return None;
    }
    let mut parts = Vec::new();
    for bit in 0..32 {
        let mask = 1u32 << bit;
        if unknown & mask != 0 {
            match names.iter().find(|(m, _)| *m == mask) {
                Some((_, name)) => parts.push((*name).to_string()),
                None => parts.push(format!("unknown bit {mask:#x}")),
            }
        }
    }
    Some(parts.join(", "))
}

/// `s_state` bit: cleanly unmounted.
pub const STATE_VALID: u16 = 1;
/// `s_state` bit: errors detected.
pub const STATE_ERROR: u16 = 2;
/// `s_first_error_errcode` / `s_last_error_errcode` for an I/O error (the kernel's
/// `EXT4_ERR_EIO`).
pub const ERRCODE_EIO: u8 = 2;
/// The same for corrupt metadata (`EXT4_ERR_EFSCORRUPTED`).
pub const ERRCODE_CORRUPTED: u8 = 5;

/// The superblock, kept as its raw 1024 bytes with typed accessors.
#[derive(Clone, PartialEq, Eq)]
pub struct Superblock {
    raw: Box<[u8; SUPERBLOCK_SIZE]>,
}

impl std::fmt::Debug for Superblock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Superblock")
            .field("blocks_count", &self.blocks_count())
            .field("block_size", &self.block_size())
            .field("inodes_count", &self.inodes_count())
            .finish()
    }
}

impl Superblock {
    /// Parses and validates a superblock: magic, geometry that cannot cause division by zero or
    /// overflow, and (when `metadata_csum` is on) the checksum.
    pub fn parse(bytes: &[u8]) -> Result<Superblock, Corrupt> {
        Superblock::parse_checked(bytes, true)
    }

    /// As [`Superblock::parse`], with the checksum check optional: a superblock whose last
    /// write was torn by a crash can still locate the journal that holds its good copy.
    pub fn parse_checked(bytes: &[u8], verify_checksum: bool) -> Result<Superblock, Corrupt> {
        if bytes.len() < SUPERBLOCK_SIZE {
            return Err(Corrupt::new("superblock is truncated"));
        }
        let mut raw = Box::new([0u8; SUPERBLOCK_SIZE]);
        raw.copy_from_slice(&bytes[..SUPERBLOCK_SIZE]);
        let sb = Superblock { raw };
        let magic = le16(&sb.raw[..], S_MAGIC);
        if magic != EXT4_MAGIC {
            return Err(Corrupt::new(format!(
                "bad superblock magic {magic:#06x} (expected {EXT4_MAGIC:#06x}): not an ext2/3/4 file system"
            )));
        }
        if verify_checksum && sb.has_ro_compat(ro_compat::METADATA_CSUM) {
            if sb.raw[S_CHECKSUM_TYPE] != 1 {
                return Err(Corrupt::new(format!(
                    "unknown superblock checksum type {}",
                    sb.raw[S_CHECKSUM_TYPE]
                )));
            }
            let stored = le32(&sb.raw[..], S_CHECKSUM);
            let computed = sb.compute_checksum();
            if stored != computed {
                return Err(Corrupt::new(format!(
                    "superblock checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
                )));
            }
        }
        if sb.has_incompat(incompat::JOURNAL_DEV) {
            // An external journal device: its geometry fields do not describe a file system,
            // so they are not checked here; callers refuse it by this feature, by name.
            return Ok(sb);
        }
        let log = le32(&sb.raw[..], S_LOG_BLOCK_SIZE);
        if log > 6 {
            return Err(Corrupt::new(format!("block size 2^(10+{log}) is invalid")));
        }
        if le32(&sb.raw[..], S_LOG_CLUSTER_SIZE) != log {
            return Err(Corrupt::new(
                "cluster size differs from block size (bigalloc)",
            ));
        }
        let bs = sb.block_size();
        // The bounds e2fsck checks: at least 8 blocks (one bitmap byte) and a block of
        // inodes per group, at most what one bitmap block maps.
        let bpg = sb.blocks_per_group();
        if bpg < 8 || bpg > bs * 8 {
            return Err(Corrupt::new(format!("invalid blocks per group {bpg}")));
        }
        let isz = u32::from(sb.inode_size());
        if isz < 128 || isz > bs || !isz.is_power_of_two() {
            return Err(Corrupt::new(format!("invalid inode size {isz}")));
        }
        let ipg = sb.inodes_per_group();
        if ipg < bs / isz || ipg > bs * 8 {
            return Err(Corrupt::new(format!("invalid inodes per group {ipg}")));
        }
        if sb.blocks_count() <= u64::from(sb.first_data_block()) {
            return Err(Corrupt::new(
                "block count is smaller than the first data block",
            ));
        }
        let groups = sb.group_count();
        if groups > MAX_GROUPS {
            return Err(Corrupt::new(format!(
                "{groups} block groups (of {bpg} blocks): more than tidefs keeps in memory \
                 ({MAX_GROUPS})"
            )));
        }
        if u64::from(ipg).checked_mul(groups) != Some(u64::from(sb.inodes_count())) {
            return Err(Corrupt::new(format!(
                "inode count {} does not match {groups} groups of {ipg} inodes",
                sb.inodes_count()
            )));
        }
        if sb.has_incompat(incompat::BIT64) {
            let ds = sb.desc_size();
            if !(64..=1024).contains(&ds) || !ds.is_power_of_two() {
                return Err(Corrupt::new(format!("invalid group descriptor size {ds}")));
            }
        }
        if sb.rev_level() >= 1 && sb.first_ino() < 11 {
            return Err(Corrupt::new("first non-reserved inode is below 11"));
        }
        Ok(sb)
    }

    /// Copies the superblock, with a fresh checksum when `metadata_csum` is on, into `out`.
    pub fn write(&self, out: &mut [u8]) {
        out[..SUPERBLOCK_SIZE].copy_from_slice(&self.raw[..]);
    }

    /// Recomputes the stored checksum (call after every change, before writing).
    pub fn update_checksum(&mut self) {
        if self.has_ro_compat(ro_compat::METADATA_CSUM) {
            let c = self.compute_checksum();
            put_le32(&mut self.raw[..], S_CHECKSUM, c);
        }
    }

    fn compute_checksum(&self) -> u32 {
        crc32c_raw(!0, &self.raw[..S_CHECKSUM])
    }

    fn u32_at(&self, off: usize) -> u32 {
        le32(&self.raw[..], off)
    }

    /// Total inodes.
    pub fn inodes_count(&self) -> u32 {
        self.u32_at(S_INODES_COUNT)
    }
    /// Total blocks.
    pub fn blocks_count(&self) -> u64 {
        self.lo_hi(S_BLOCKS_COUNT_LO, S_BLOCKS_COUNT_HI)
    }
    /// Blocks reserved for the superuser.
    pub fn r_blocks_count(&self) -> u64 {
        self.lo_hi(S_R_BLOCKS_COUNT_LO, S_R_BLOCKS_COUNT_HI)
    }
    /// Free blocks.
    pub fn free_blocks_count(&self) -> u64 {
        self.lo_hi(S_FREE_BLOCKS_COUNT_LO, S_FREE_BLOCKS_COUNT_HI)
    }
    /// Sets the free block count.
    pub fn set_free_blocks_count(&mut self, v: u64) {
        self.set_lo_hi(S_FREE_BLOCKS_COUNT_LO, S_FREE_BLOCKS_COUNT_HI, v);
    }
    /// Free inodes.
    pub fn free_inodes_count(&self) -> u32 {
        self.u32_at(S_FREE_INODES_COUNT)
    }
    /// Sets the free inode count.
    pub fn set_free_inodes_count(&mut self, v: u32) {
        put_le32(&mut self.raw[..], S_FREE_INODES_COUNT, v);
    }
    /// First data block (1 for 1 KiB blocks, else 0).
    pub fn first_data_block(&self) -> u32 {
        self.u32_at(S_FIRST_DATA_BLOCK)
    }
    /// Block size in bytes.
    pub fn block_size(&self) -> u32 {
        1024u32 << self.u32_at(S_LOG_BLOCK_SIZE).min(6)
    }
    /// Blocks per group.
    pub fn blocks_per_group(&self) -> u32 {
        self.u32_at(S_BLOCKS_PER_GROUP)
    }
    /// Inodes per group.
    pub fn inodes_per_group(&self) -> u32 {
        self.u32_at(S_INODES_PER_GROUP)
    }
    /// Number of block groups.
    pub fn group_count(&self) -> u64 {
        let data = self
            .blocks_count()
            .saturating_sub(u64::from(self.first_data_block()));
        data.div_ceil(u64::from(self.blocks_per_group().max(1)))
    }
    /// Revision level (0 = fixed 128-byte inodes).
    pub fn rev_level(&self) -> u32 {
        self.u32_at(S_REV_LEVEL)
    }
    /// First inode number usable for ordinary files.
    pub fn first_ino(&self) -> u32 {
        if self.rev_level() == 0 {
            11
        } else {
            self.u32_at(S_FIRST_INO)
        }
    }
    /// On-disk inode size.
    pub fn inode_size(&self) -> u16 {
        if self.rev_level() == 0 {
            128
        } else {
            le16(&self.raw[..], S_INODE_SIZE)
        }
    }
    /// Compatible feature bits.
    pub fn feature_compat(&self) -> u32 {
        self.u32_at(S_FEATURE_COMPAT)
    }
    /// Incompatible feature bits.
    pub fn feature_incompat(&self) -> u32 {
        self.u32_at(S_FEATURE_INCOMPAT)
    }
    /// Read-only-compatible feature bits.
    pub fn feature_ro_compat(&self) -> u32 {
        self.u32_at(S_FEATURE_RO_COMPAT)
    }
    /// Whether incompat feature `bit` is on.
    pub fn has_incompat(&self, bit: u32) -> bool {
        self.feature_incompat() & bit != 0
    }
    /// Whether ro_compat feature `bit` is on.
    pub fn has_ro_compat(&self, bit: u32) -> bool {
        self.feature_ro_compat() & bit != 0
    }
    /// Whether compat feature `bit` is on.
    pub fn has_compat(&self, bit: u32) -> bool {
        self.feature_compat() & bit != 0
    }
    /// Sets or clears incompat feature `bit`.
    pub fn set_incompat(&mut self, bit: u32, on: bool) {
        let v = if on {
            self.feature_incompat() | bit
        } else {
            self.feature_incompat() & !bit
        };
        put_le32(&mut self.raw[..], S_FEATURE_INCOMPAT, v);
    }
    /// File-system UUID.
    pub fn uuid(&self) -> [u8; 16] {
        let mut u = [0u8; 16];
        u.copy_from_slice(&self.raw[S_UUID..S_UUID + 16]);
        u
    }
    /// UUID of the external journal device (zero for an internal journal).
    pub fn journal_uuid(&self) -> [u8; 16] {
        let mut u = [0u8; 16];
        u.copy_from_slice(&self.raw[S_JOURNAL_UUID..S_JOURNAL_UUID + 16]);
        u
    }
    /// Reserved GDT blocks after each group-descriptor table copy.
    pub fn reserved_gdt_blocks(&self) -> u16 {
        le16(&self.raw[..], S_RESERVED_GDT_BLOCKS)
    }
    /// Journal inode (0 with an external journal).
    pub fn journal_inum(&self) -> u32 {
        self.u32_at(S_JOURNAL_INUM)
    }
    /// External journal device number (informational).
    pub fn journal_dev(&self) -> u32 {
        self.u32_at(S_JOURNAL_DEV)
    }
    /// Head of the orphan inode list.
    pub fn last_orphan(&self) -> u32 {
        self.u32_at(S_LAST_ORPHAN)
    }
    /// Sets the head of the orphan inode list.
    pub fn set_last_orphan(&mut self, ino: u32) {
        put_le32(&mut self.raw[..], S_LAST_ORPHAN, ino);
    }
    /// Directory hash seed.
    pub fn hash_seed(&self) -> [u32; 4] {
        [0, 1, 2, 3].map(|i| self.u32_at(S_HASH_SEED + 4 * i))
    }
    /// Default directory hash version.
    pub fn def_hash_version(&self) -> u8 {
        self.raw[S_DEF_HASH_VERSION]
    }
    /// Group descriptor size (32 without the 64bit feature).
    pub fn desc_size(&self) -> u32 {
        if self.has_incompat(incompat::BIT64) {
            u32::from(le16(&self.raw[..], S_DESC_SIZE))
        } else {
            32
        }
    }
    /// Minimum extra inode size all inodes have.
    pub fn min_extra_isize(&self) -> u16 {
        le16(&self.raw[..], S_MIN_EXTRA_ISIZE)
    }
    /// Extra inode size new inodes should have.
    pub fn want_extra_isize(&self) -> u16 {
        le16(&self.raw[..], S_WANT_EXTRA_ISIZE)
    }
    /// Miscellaneous flags (signed/unsigned directory hash).
    pub fn flags(&self) -> u32 {
        self.u32_at(S_FLAGS)
    }
    /// File-system state bits.
    pub fn state(&self) -> u16 {
        le16(&self.raw[..], S_STATE)
    }
    /// Sets the state bits.
    pub fn set_state(&mut self, v: u16) {
        put_le16(&mut self.raw[..], S_STATE, v);
    }
    /// Counts one more mount and records the mount time.
    pub fn note_mount(&mut self, now: u32) {
        let c = le16(&self.raw[..], S_MNT_COUNT).wrapping_add(1);
        put_le16(&mut self.raw[..], S_MNT_COUNT, c);
        put_le32(&mut self.raw[..], S_MTIME, now);
    }
    /// Records the last write time.
    pub fn set_wtime(&mut self, now: u32) {
        put_le32(&mut self.raw[..], S_WTIME, now);
    }
    /// Adds to the lifetime kilobytes-written counter.
    pub fn add_kbytes_written(&mut self, kb: u64) {
        let v = le64(&self.raw[..], S_KBYTES_WRITTEN).saturating_add(kb);
        put_le64(&mut self.raw[..], S_KBYTES_WRITTEN, v);
    }
    /// Records a file-system error as the kernel's `ext4_error` does: sets the error state bit,
    /// counts it, and fills the first-error fields (once) and the last-error fields. `func`
    /// names where it happened (cut to 32 bytes), `errcode` is the kernel's EXT4_ERR_* code.
    pub fn record_error(&mut self, now: u32, ino: u32, block: u64, func: &str, errcode: u8) {
        let st = self.state() | STATE_ERROR;
        self.set_state(st);
        let count = self.u32_at(S_ERROR_COUNT);
        let name = func.as_bytes();
        let name = &name[..name.len().min(ERROR_FUNC_LEN)];
        let raw = &mut self.raw[..];
        let mut fill = |f: &ErrorFields| {
            put_le32(raw, f.time, now);
            put_le32(raw, f.ino, ino);
            put_le64(raw, f.block, block);
            put_le32(raw, f.line, 0);
            raw[f.func..f.func + ERROR_FUNC_LEN].fill(0);
            raw[f.func..f.func + name.len()].copy_from_slice(name);
            raw[f.errcode] = errcode;
        };
        if count == 0 {
            fill(&FIRST_ERROR);
        }
        fill(&LAST_ERROR);
        put_le32(raw, S_ERROR_COUNT, count.saturating_add(1));
    }
    /// Group whose copy this is (`s_block_group_nr`: 0 for the primary, g for a backup).
    pub fn block_group_nr(&self) -> u16 {
        le16(&self.raw[..], S_BLOCK_GROUP_NR)
    }
    /// Makes this the copy of group `g` (0 when a backup is promoted to primary).
    pub fn set_block_group_nr(&mut self, g: u16) {
        put_le16(&mut self.raw[..], S_BLOCK_GROUP_NR, g);
    }
    /// Number of errors recorded since the last check (`s_error_count`).
    pub fn error_count(&self) -> u32 {
        self.u32_at(S_ERROR_COUNT)
    }
    /// Seed of all metadata checksums; `None` without `metadata_csum`.
    pub fn csum_seed(&self) -> Option<u32> {
        if !self.has_ro_compat(ro_compat::METADATA_CSUM) {
            return None;
        }
        if self.has_incompat(incompat::CSUM_SEED) {
            Some(self.u32_at(S_CHECKSUM_SEED))
        } else {
            Some(crc32c_raw(!0, &self.raw[S_UUID..S_UUID + 16]))
        }
    }

    fn lo_hi(&self, lo: usize, hi: usize) -> u64 {
        let l = u64::from(self.u32_at(lo));
        if self.has_incompat(incompat::BIT64) {
            l | (u64::from(self.u32_at(hi)) << 32)
        } else {
            l
        }
    }

    fn set_lo_hi(&mut self, lo: usize, hi: usize, v: u64) {
        // Truncation to the low 32 bits is the format: the high half goes to its own field.
        put_le32(&mut self.raw[..], lo, (v & 0xFFFF_FFFF) as u32);
        if self.has_incompat(incompat::BIT64) {
            put_le32(&mut self.raw[..], hi, (v >> 32) as u32);
        }
    }

    /// Whether group `g` holds a superblock backup (sparse_super: groups 0, 1 and powers of
    /// 3, 5 and 7).
    pub fn group_has_super(&self, g: u64) -> bool {
        if g == 0 || !self.has_ro_compat(ro_compat::SPARSE_SUPER) {
            return true;
        }
        if g == 1 {
            return true;
        }
        for base in [3u64, 5, 7] {
            let mut p = base;
            while p < g {
                p *= base;
            }
            if p == g {
                return true;
            }
        }
        false
    }

    /// Blocks taken by one copy of the group-descriptor table.
    pub fn gdt_blocks(&self) -> u64 {
        (self.group_count() * u64::from(self.desc_size())).div_ceil(u64::from(self.block_size()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> [u8; SUPERBLOCK_SIZE] {
        let mut b = [0u8; SUPERBLOCK_SIZE];
        put_le32(&mut b, S_INODES_COUNT, 8192);
        put_le32(&mut b, S_BLOCKS_COUNT_LO, 32768);
        put_le32(&mut b, S_LOG_BLOCK_SIZE, 2);
        put_le32(&mut b, S_LOG_CLUSTER_SIZE, 2);
        put_le32(&mut b, S_BLOCKS_PER_GROUP, 32768);
        put_le32(&mut b, S_INODES_PER_GROUP, 8192);
        put_le16(&mut b, S_MAGIC, EXT4_MAGIC);
        put_le32(&mut b, S_REV_LEVEL, 1);
        put_le32(&mut b, S_FIRST_INO, 11);
        put_le16(&mut b, S_INODE_SIZE, 256);
        put_le32(&mut b, S_FEATURE_RO_COMPAT, ro_compat::METADATA_CSUM);
        b[S_CHECKSUM_TYPE] = 1;
        let c = crc32c_raw(!0, &b[..S_CHECKSUM]);
        put_le32(&mut b, S_CHECKSUM, c);
        b
    }

    #[test]
    fn parses_valid_and_round_trips() {
        let b = sample();
        let sb = Superblock::parse(&b).unwrap();
        assert_eq!(sb.block_size(), 4096);
        assert_eq!(sb.group_count(), 1);
        let mut out = [0u8; SUPERBLOCK_SIZE];
        sb.write(&mut out);
        assert_eq!(out, b);
    }

    #[test]
    fn rejects_bad_magic() {
        let mut b = sample();
        b[S_MAGIC] = 0;
        let e = Superblock::parse(&b).unwrap_err();
        assert!(e.what.contains("magic"), "{e}");
    }

    #[test]
    fn rejects_bad_checksum() {
        let mut b = sample();
        b[S_CHECKSUM] ^= 1;
        let e = Superblock::parse(&b).unwrap_err();
        assert!(e.what.contains("checksum"), "{e}");
    }

    #[test]
    fn rejects_truncated() {
        let b = sample();
        assert!(Superblock::parse(&b[..512]).is_err());
    }

    #[test]
    fn rejects_bad_geometry() {
        let mut b = sample();
        put_le32(&mut b, S_INODES_PER_GROUP, 0);
        let c = crc32c_raw(!0, &b[..S_CHECKSUM]);
        put_le32(&mut b, S_CHECKSUM, c);
        assert!(Superblock::parse(&b).is_err());
    }

    #[test]
    fn update_checksum_makes_changes_valid() {
        let mut sb = Superblock::parse(&sample()).unwrap();
        sb.set_free_blocks_count(1234);
        sb.update_checksum();
        let mut out = [0u8; SUPERBLOCK_SIZE];
        sb.write(&mut out);
        assert_eq!(Superblock::parse(&out).unwrap().free_blocks_count(), 1234);
    }

    #[test]
    fn names_unknown_features() {
        let s = describe_unknown(0x8000 | 0x2, incompat::SUPPORTED, incompat::NAMES).unwrap();
        assert_eq!(s, "inline_data");
        assert!(describe_unknown(0x2, incompat::SUPPORTED, incompat::NAMES).is_none());
        let s = describe_unknown(1 << 31, incompat::SUPPORTED, incompat::NAMES).unwrap();
        assert!(s.contains("0x80000000"));
    }

    #[test]
    fn sparse_super_groups() {
        let sb = Superblock::parse(&sample()).unwrap();
        let mut b = sample();
        put_le32(
            &mut b,
            S_FEATURE_RO_COMPAT,
            ro_compat::METADATA_CSUM | ro_compat::SPARSE_SUPER,
        );
        let c = crc32c_raw(!0, &b[..S_CHECKSUM]);
        put_le32(&mut b, S_CHECKSUM, c);
        let sparse = Superblock::parse(&b).unwrap();
        assert!(sb.group_has_super(4));
        let with: Vec<u64> = (0..30).filter(|g| sparse.group_has_super(*g)).collect();
        assert_eq!(with, vec![0, 1, 3, 5, 7, 9, 25, 27]);
    }

    proptest::proptest! {
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..1100)) {
            let _ = Superblock::parse(&bytes);
        }
    }
}
