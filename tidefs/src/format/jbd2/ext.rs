//! tidefs's own journal extension records (**big-endian**, like the rest of jbd2): byte-range
//! records, compact commits and range blocks. Pure parse/serialize, no I/O. docs/FORMAT.md §5
//! is the reference; this comment repeats the layout.
//!
//! While any live transaction of the log holds one of these records, the journal superblock
//! carries the incompat bit [`INCOMPAT_TIDEFS_EXT`] (0x80000000), which the kernel and e2fsck do
//! not know, so they refuse the journal instead of replaying it wrongly; while one is unfenced
//! (its commit block written with its body), [`INCOMPAT_TIDEFS_UNFENCED`] (0x40000000). With
//! both clear the journal is plain jbd2.
//!
//! ```text
//! Entry area: entries back to back, each
//!   0x0 e_kind   u8   1 = byte-range record, 2 = revoke
//!   0x1 e_flags  u8   range record: 0, or 1 (ZERO_REST: the block is zeros outside its
//!                     ranges, so replay starts from a zero block, not the home block);
//!                     revoke: 0
//!   0x2 e_count  u16  range record: number of ranges (>= 1, or >= 0 with ZERO_REST);
//!                     revoke: 0
//!   0x4 e_home   u64  home block number
//!   range record only:
//!   0xC          e_count x (offset u16, length u16): sorted, disjoint, length >= 1,
//!                offset + length <= block size
//!   then the bytes of each range, back to back, in range order
//!
//! Compact commit (a whole transaction in a few sectors, starting at a sector boundary inside a
//! journal block and never crossing its end; its own commit record):
//!   0x00 h_magic        u32  0xC03B3998
//!   0x04 h_blocktype    u32  0x74640001
//!   0x08 h_sequence     u32  tid
//!   0x0C c_sectors      u16  length in sectors
//!   0x0E c_sector_shift u8   log2 of the sector size the writer used (9 ..= 16)
//!   0x0F c_flags        u8   0
//!   0x10 c_entries      u32  number of entries
//!   0x14 c_area_len     u32  bytes of the entry area
//!   0x18 c_commit_sec   u64  commit time, seconds
//!   0x20 c_commit_nsec  u32  commit time, nanoseconds
//!   0x24 c_checksum     u32  crc32c(journal seed, the c_sectors << c_sector_shift bytes of
//!                            the record with this field zeroed)
//!   0x28 entry area (c_area_len bytes), then zeros to the end of the last sector
//!
//! Range block (a journal block of the classic block layout, after the descriptors and their
//! copies, before the revoke blocks, carrying the range records of a large transaction):
//!   0x00 h_magic        u32  0xC03B3998
//!   0x04 h_blocktype    u32  0x74640002
//!   0x08 h_sequence     u32  tid
//!   0x0C r_entries      u32  number of entries (range records only)
//!   0x10 r_area_len     u32  bytes of the entry area
//!   0x14 entry area, zeros after it
//!   bs-4 r_checksum     u32  crc32c(journal seed, the block with this field zeroed), always
//! ```
//!
//! Invariants: parsers never panic; every count, length and offset is checked against the
//! buffer and the block size before use, and anything inconsistent is [`Corrupt`]; a record
//! that verifies re-encodes to the same bytes.

use super::{be16, be32, be64, put_be16, put_be32, put_be64, JBD2_MAGIC};
use crate::error::Corrupt;
use crate::format::crc32c_raw;

/// Incompat feature bit of tidefs's extension records. The kernel defines bits 0x1 ..= 0x20
/// and adds new ones from the bottom; the top bit keeps clear of them.
pub const INCOMPAT_TIDEFS_EXT: u32 = 0x8000_0000;
/// Incompat feature bit of unfenced transactions (commit blocks carrying `FLAG_UNFENCED`,
/// written in one batch with their body): a failing block of such a transaction is a tear, the
/// end of the log, not damage to skip. A bit of its own, so that a tidefs build that knows
/// extension records but not unfenced commits refuses the log instead of replaying a torn one.
pub const INCOMPAT_TIDEFS_UNFENCED: u32 = 0x4000_0000;
/// The incompat bits only tidefs reads; the kernel and e2fsck refuse a journal with any of them.
pub const INCOMPAT_TIDEFS_ONLY: u32 = INCOMPAT_TIDEFS_EXT | INCOMPAT_TIDEFS_UNFENCED;
/// `h_blocktype` of a compact commit.
pub const BLOCKTYPE_COMPACT: u32 = 0x7464_0001;
/// `h_blocktype` of a range block.
pub const BLOCKTYPE_RANGES: u32 = 0x7464_0002;
/// Size of the compact commit header.
pub const COMPACT_HEADER: usize = 0x28;
/// Size of the range block header.
pub const RANGES_HEADER: usize = 0x14;
/// Size of the range block's checksum tail.
pub const RANGES_TAIL: usize = 4;
/// Size of an entry header.
pub const ENTRY_HEADER: usize = 12;
/// Size of one (offset, length) pair of a range record.
pub const RANGE_DESC: usize = 4;

const KIND_RANGE: u8 = 1;
/// `e_flags` of a range record whose block is zeros outside its ranges.
const FLAG_ZERO_REST: u8 = 1;
const KIND_REVOKE: u8 = 2;
const C_SECTORS: usize = 0x0C;
const C_SHIFT: usize = 0x0E;
const C_FLAGS: usize = 0x0F;
const C_ENTRIES: usize = 0x10;
const C_AREA: usize = 0x14;
const C_SEC: usize = 0x18;
const C_NSEC: usize = 0x20;
const C_CSUM: usize = 0x24;
const R_ENTRIES: usize = 0x0C;
const R_AREA: usize = 0x10;

/// One entry of an entry area.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    /// New bytes of some ranges of a home block: `(offset, bytes)` in offset order.
    Range {
        /// Home block number.
        home: u64,
        /// The ranges and their new bytes.
        ranges: Vec<(u32, Vec<u8>)>,
        /// The block is zeros outside the ranges (replay does not read it from home).
        zero_rest: bool,
    },
    /// A revoke of a home block.
    Revoke {
        /// Home block number.
        home: u64,
    },
}

impl Entry {
    /// Bytes this entry takes in an entry area.
    pub fn encoded_len(&self) -> usize {
        match self {
            Entry::Range { ranges, .. } => range_entry_len(ranges.iter().map(|(_, b)| b.len())),
            Entry::Revoke { .. } => ENTRY_HEADER,
        }
    }
}

/// Bytes a range record with ranges of the given lengths takes in an entry area.
pub fn range_entry_len(lens: impl Iterator<Item = usize>) -> usize {
    lens.fold(ENTRY_HEADER, |acc, l| acc + RANGE_DESC + l)
}

/// Appends the encoding of a range record: `(offset, bytes)` pairs, and whether the block is
/// zeros outside them. Offsets and lengths must fit in 16 bits (the caller logs larger changes
/// as full blocks).
pub fn encode_range(out: &mut Vec<u8>, home: u64, ranges: &[(u32, &[u8])], zero_rest: bool) {
    let at = out.len();
    out.resize(at + ENTRY_HEADER + RANGE_DESC * ranges.len(), 0);
    out[at] = KIND_RANGE;
    if zero_rest {
        out[at + 1] = FLAG_ZERO_REST;
    }
    put_be16(out, at + 2, u16::try_from(ranges.len()).unwrap_or(u16::MAX));
    put_be64(out, at + 4, home);
    for (i, (off, bytes)) in ranges.iter().enumerate() {
        let d = at + ENTRY_HEADER + RANGE_DESC * i;
        put_be16(out, d, u16::try_from(*off).unwrap_or(u16::MAX));
        put_be16(out, d + 2, u16::try_from(bytes.len()).unwrap_or(u16::MAX));
    }
    for (_, bytes) in ranges {
        out.extend_from_slice(bytes);
    }
}

/// Appends the encoding of a revoke entry.
pub fn encode_revoke(out: &mut Vec<u8>, home: u64) {
    let at = out.len();
    out.resize(at + ENTRY_HEADER, 0);
    out[at] = KIND_REVOKE;
    put_be64(out, at + 4, home);
}

/// Appends the encoding of `e`.
pub fn encode_entry(out: &mut Vec<u8>, e: &Entry) {
    match e {
        Entry::Range {
            home,
            ranges,
            zero_rest,
        } => {
            let r: Vec<(u32, &[u8])> = ranges.iter().map(|(o, b)| (*o, &b[..])).collect();
            encode_range(out, *home, &r, *zero_rest);
        }
        Entry::Revoke { home } => encode_revoke(out, *home),
    }
}

/// Decodes `count` entries filling exactly `area`, for a journal of `block_size`-byte blocks.
pub fn parse_entries(area: &[u8], count: u32, block_size: usize) -> Result<Vec<Entry>, Corrupt> {
    let mut out = Vec::new();
    let mut at = 0usize;
    for i in 0..count {
        let bad = |why: &str| Corrupt::new(format!("extension entry {i} at byte {at}: {why}"));
        if area.len() - at < ENTRY_HEADER {
            return Err(bad("runs past the entry area"));
        }
        let kind = area[at];
        let flags = area[at + 1];
        let n = usize::from(be16(area, at + 2));
        let home = be64(area, at + 4);
        let zero_rest = kind == KIND_RANGE && flags == FLAG_ZERO_REST;
        if flags != 0 && !zero_rest {
            return Err(bad("unknown flags"));
        }
        match kind {
            KIND_REVOKE => {
                if n != 0 {
                    return Err(bad("revoke with ranges"));
                }
                at += ENTRY_HEADER;
                out.push(Entry::Revoke { home });
            }
            KIND_RANGE => {
                if n == 0 && !zero_rest {
                    return Err(bad("range record without ranges"));
                }
                let descs = at + ENTRY_HEADER;
                if (area.len() - descs) / RANGE_DESC < n {
                    return Err(bad("range list runs past the entry area"));
                }
                let mut data = descs + RANGE_DESC * n;
                let mut ranges = Vec::with_capacity(n);
                let mut prev_end = 0usize;
                for k in 0..n {
                    let off = usize::from(be16(area, descs + RANGE_DESC * k));
                    let len = usize::from(be16(area, descs + RANGE_DESC * k + 2));
                    if len == 0 || off < prev_end || off + len > block_size {
                        return Err(bad(
                            "range empty, out of order, overlapping or past the block",
                        ));
                    }
                    if area.len() - data < len {
                        return Err(bad("range bytes run past the entry area"));
                    }
                    ranges.push((
                        u32::try_from(off).unwrap_or(u32::MAX),
                        area[data..data + len].to_vec(),
                    ));
                    data += len;
                    prev_end = off + len;
                }
                at = data;
                out.push(Entry::Range {
                    home,
                    ranges,
                    zero_rest,
                });
            }
            _ => return Err(bad("unknown kind")),
        }
    }
    if at != area.len() {
        return Err(Corrupt::new(format!(
            "extension entry area: {} bytes, entries end at {at}",
            area.len()
        )));
    }
    Ok(out)
}

/// True when `b` starts with a jbd2 header of block type `blocktype` and sequence `tid`.
pub fn has_header(b: &[u8], blocktype: u32, tid: u32) -> bool {
    b.len() >= 12 && be32(b, 0) == JBD2_MAGIC && be32(b, 4) == blocktype && be32(b, 8) == tid
}

fn put_header(b: &mut [u8], blocktype: u32, tid: u32) {
    put_be32(b, 0, JBD2_MAGIC);
    put_be32(b, 4, blocktype);
    put_be32(b, 8, tid);
}

/// Bytes a compact commit with an entry area of `area_len` bytes takes, in whole sectors.
pub fn compact_len(area_len: usize, sector: usize) -> usize {
    (COMPACT_HEADER + area_len).div_ceil(sector) * sector
}

/// Builds a compact commit of transaction `tid` around an encoded entry area of `entries`
/// entries. `sector` is a power of two between 512 and 65536.
pub fn build_compact(
    seed: u32,
    tid: u32,
    entries: u32,
    area: &[u8],
    sector: usize,
    commit_time: (u64, u32),
) -> Vec<u8> {
    let len = compact_len(area.len(), sector);
    let mut b = vec![0u8; len];
    put_header(&mut b, BLOCKTYPE_COMPACT, tid);
    put_be16(
        &mut b,
        C_SECTORS,
        u16::try_from(len / sector).unwrap_or(u16::MAX),
    );
    b[C_SHIFT] = u8::try_from(sector.trailing_zeros()).unwrap_or(0);
    put_be32(&mut b, C_ENTRIES, entries);
    put_be32(
        &mut b,
        C_AREA,
        u32::try_from(area.len()).unwrap_or(u32::MAX),
    );
    put_be64(&mut b, C_SEC, commit_time.0);
    put_be32(&mut b, C_NSEC, commit_time.1);
    b[COMPACT_HEADER..COMPACT_HEADER + area.len()].copy_from_slice(area);
    let csum = crc32c_raw(seed, &b);
    put_be32(&mut b, C_CSUM, csum);
    b
}

/// A compact commit read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompactCommit {
    /// Transaction id.
    pub tid: u32,
    /// Bytes the record takes (sectors times sector size).
    pub len: usize,
    /// Commit time (seconds, nanoseconds).
    pub commit_time: (u64, u32),
    /// Its entries, in order.
    pub entries: Vec<Entry>,
}

/// What a compact commit header at some position says, before its checksum is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompactProbe {
    /// No compact commit of this tid starts here.
    Absent,
    /// One starts here and verifies.
    Valid,
    /// One of this tid starts here but is torn or corrupt: the end of the log.
    Invalid,
}

/// Parses the compact commit of transaction `tid` at the start of `b` (the rest of its journal
/// block from the record's first byte). `Ok(None)` when no compact commit of `tid` starts
/// there; `Err` when one does but fails its checks (torn, corrupt).
pub fn parse_compact(
    b: &[u8],
    seed: u32,
    tid: u32,
    block_size: usize,
) -> Result<Option<CompactCommit>, Corrupt> {
    if !has_header(b, BLOCKTYPE_COMPACT, tid) {
        return Ok(None);
    }
    if b.len() < COMPACT_HEADER {
        return Err(Corrupt::new("compact commit header runs past its block"));
    }
    let shift = u32::from(b[C_SHIFT]);
    if !(9..=16).contains(&shift) || b[C_FLAGS] != 0 {
        return Err(Corrupt::new(format!(
            "compact commit {tid}: bad sector shift {shift} or flags"
        )));
    }
    let len = usize::from(be16(b, C_SECTORS)) << shift;
    if len < COMPACT_HEADER || len > b.len() || len > block_size {
        return Err(Corrupt::new(format!(
            "compact commit {tid}: length {len} does not fit its block"
        )));
    }
    let rec = &b[..len];
    let stored = be32(rec, C_CSUM);
    let c = crc32c_raw(seed, &rec[..C_CSUM]);
    let c = crc32c_raw(c, &[0u8; 4]);
    let computed = crc32c_raw(c, &rec[C_CSUM + 4..]);
    if stored != computed {
        return Err(Corrupt::new(format!(
            "compact commit {tid}: checksum {stored:#010x} does not match computed {computed:#010x}"
        )));
    }
    let area_len = usize::try_from(be32(rec, C_AREA)).unwrap_or(usize::MAX);
    if area_len > len - COMPACT_HEADER {
        return Err(Corrupt::new(format!(
            "compact commit {tid}: entry area of {area_len} bytes runs past the record"
        )));
    }
    let entries = parse_entries(
        &rec[COMPACT_HEADER..COMPACT_HEADER + area_len],
        be32(rec, C_ENTRIES),
        block_size,
    )?;
    Ok(Some(CompactCommit {
        tid,
        len,
        commit_time: (be64(rec, C_SEC), be32(rec, C_NSEC)),
        entries,
    }))
}

/// Entry-area bytes one range block of `block_size` holds.
pub fn ranges_capacity(block_size: usize) -> usize {
    block_size.saturating_sub(RANGES_HEADER + RANGES_TAIL)
}

/// Builds a range block of transaction `tid` around an encoded entry area.
pub fn build_ranges_block(
    seed: u32,
    tid: u32,
    entries: u32,
    area: &[u8],
    block_size: usize,
) -> Vec<u8> {
    assert!(area.len() <= ranges_capacity(block_size));
    let mut b = vec![0u8; block_size];
    put_header(&mut b, BLOCKTYPE_RANGES, tid);
    put_be32(&mut b, R_ENTRIES, entries);
    put_be32(
        &mut b,
        R_AREA,
        u32::try_from(area.len()).unwrap_or(u32::MAX),
    );
    b[RANGES_HEADER..RANGES_HEADER + area.len()].copy_from_slice(area);
    super::block_tail_set(seed, &mut b);
    b
}

/// Parses a range block (a whole journal block) of transaction `tid`, checking its checksum.
pub fn parse_ranges_block(b: &[u8], seed: u32, tid: u32) -> Result<Vec<Entry>, Corrupt> {
    if !has_header(b, BLOCKTYPE_RANGES, tid) || b.len() < RANGES_HEADER + RANGES_TAIL {
        return Err(Corrupt::new(format!(
            "not a range block of transaction {tid}"
        )));
    }
    super::block_tail_verify(seed, b, "range block")?;
    let area_len = usize::try_from(be32(b, R_AREA)).unwrap_or(usize::MAX);
    if area_len > ranges_capacity(b.len()) {
        return Err(Corrupt::new(format!(
            "range block: entry area of {area_len} bytes runs past the block"
        )));
    }
    let entries = parse_entries(
        &b[RANGES_HEADER..RANGES_HEADER + area_len],
        be32(b, R_ENTRIES),
        b.len(),
    )?;
    if entries.iter().any(|e| matches!(e, Entry::Revoke { .. })) {
        return Err(Corrupt::new("range block holds a revoke entry"));
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Entry> {
        vec![
            Entry::Range {
                home: 0x1_0000_0007,
                ranges: vec![(0, vec![1, 2, 3]), (100, vec![9; 20])],
                zero_rest: false,
            },
            Entry::Revoke { home: 42 },
            Entry::Range {
                home: 5,
                ranges: vec![(4095, vec![7])],
                zero_rest: true,
            },
            Entry::Range {
                home: 6,
                ranges: vec![],
                zero_rest: true,
            },
        ]
    }

    fn area(entries: &[Entry]) -> Vec<u8> {
        let mut a = Vec::new();
        for e in entries {
            encode_entry(&mut a, e);
        }
        assert_eq!(
            a.len(),
            entries.iter().map(Entry::encoded_len).sum::<usize>()
        );
        a
    }

    /// Golden bytes of one range record: the layout of the module comment.
    #[test]
    fn range_entry_golden() {
        let mut a = Vec::new();
        encode_range(
            &mut a,
            0x0102,
            &[(0x10, &[0xAA, 0xBB]), (0x20, &[0xCC])],
            false,
        );
        assert_eq!(
            a,
            [
                1, 0, 0, 2, // kind, flags, count
                0, 0, 0, 0, 0, 0, 0x01, 0x02, // home
                0, 0x10, 0, 2, 0, 0x20, 0, 1, // (offset, length) x 2
                0xAA, 0xBB, 0xCC, // bytes
            ]
        );
        let mut z = Vec::new();
        encode_range(&mut z, 3, &[], true);
        assert_eq!(z, [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3]);
        // ZERO_REST is a range record's flag only; an empty range list needs it.
        z[0] = 2;
        assert!(parse_entries(&z, 1, 4096).is_err(), "revoke with flags");
        z[0] = 1;
        z[1] = 0;
        assert!(parse_entries(&z, 1, 4096).is_err(), "no ranges");
        z[1] = 2;
        assert!(parse_entries(&z, 1, 4096).is_err(), "unknown flag");
    }

    #[test]
    fn compact_round_trip_and_checksum() {
        let e = sample();
        let a = area(&e);
        let b = build_compact(0x1234, 9, 4, &a, 512, (77, 88));
        assert_eq!(b.len(), 512);
        let mut block = b.clone();
        block.resize(4096, 0xEE);
        let c = parse_compact(&block, 0x1234, 9, 4096).unwrap().unwrap();
        assert_eq!(c.entries, e);
        assert_eq!(c.len, 512);
        assert_eq!(c.commit_time, (77, 88));
        assert_eq!(parse_compact(&block, 0x1234, 10, 4096).unwrap(), None);
        for at in [0x0C, 0x30, 511] {
            let mut bad = block.clone();
            bad[at] ^= 1;
            assert!(
                parse_compact(&bad, 0x1234, 9, 4096).is_err(),
                "flip at {at}"
            );
        }
        // A record longer than what is left of its block.
        assert!(parse_compact(&block[..256], 0x1234, 9, 4096).is_err());
    }

    #[test]
    fn range_block_round_trip() {
        let e: Vec<Entry> = sample()
            .into_iter()
            .filter(|e| matches!(e, Entry::Range { .. }))
            .collect();
        let a = area(&e);
        let b = build_ranges_block(5, 3, 3, &a, 4096);
        assert_eq!(parse_ranges_block(&b, 5, 3).unwrap(), e);
        let mut bad = b.clone();
        bad[200] ^= 1;
        assert!(parse_ranges_block(&bad, 5, 3).is_err());
        assert!(parse_ranges_block(&b, 5, 4).is_err());
    }

    #[test]
    fn entries_reject_bad_ranges() {
        let mut a = Vec::new();
        encode_range(&mut a, 1, &[(10, &[1; 5]), (12, &[1; 2])], false);
        assert!(parse_entries(&a, 1, 4096).is_err(), "overlap");
        let mut a = Vec::new();
        encode_range(&mut a, 1, &[(4095, &[1; 2])], false);
        assert!(parse_entries(&a, 1, 4096).is_err(), "past the block");
        let a = area(&sample());
        assert!(parse_entries(&a, 5, 4096).is_err(), "count too large");
        assert!(parse_entries(&a[..a.len() - 1], 4, 4096).is_err(), "short");
        assert!(parse_entries(&a, 3, 4096).is_err(), "trailing bytes");
    }

    proptest::proptest! {
        /// Goal: the extension parsers never panic. Method: random bytes, with a valid header
        /// half of the time.
        #[test]
        fn parsers_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..1100),
                               header in proptest::prelude::any::<bool>(), n in 0u32..8) {
            let mut b = bytes;
            if header && b.len() >= 16 {
                put_header(&mut b, BLOCKTYPE_COMPACT, 1);
                b[C_SHIFT] = 9;
            }
            let _ = parse_compact(&b, 1, 1, 1024);
            let _ = parse_ranges_block(&b, 1, 1);
            let _ = parse_entries(&b, n, 1024);
        }
    }
}
