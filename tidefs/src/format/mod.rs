//! Pure parse/serialize of on-disk structures: [`ext4`] (little-endian) and [`jbd2`]
//! (big-endian). No I/O happens in this module tree.
//!
//! Shared here: the crc32c flavour both formats use, and bounds-checked little-endian field
//! access for ext4 structures.

pub mod ext4;
pub mod jbd2;

/// The crc32c the kernel's `crc32c()` / e2fsprogs' `ext2fs_crc32c_le()` compute: the Castagnoli
/// polynomial, seeded with `seed`, with no inversion before or after. ext4 and jbd2 checksums
/// chain it, starting from a seed derived from the file-system UUID.
pub fn crc32c_raw(seed: u32, data: &[u8]) -> u32 {
    // The crc32c crate inverts on entry and exit; undo both to get the raw update.
    !crc32c::crc32c_append(!seed, data)
}

/// Little-endian u16 at `off`. Callers pass offsets of fixed layouts inside buffers whose length
/// they have checked, so an out-of-range offset is a programmer error and panics.
pub fn le16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

/// Little-endian u32 at `off` (see [`le16`] for the bounds contract).
pub fn le32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Little-endian u64 at `off` (see [`le16`] for the bounds contract).
pub fn le64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

/// Stores `v` little-endian at `off`.
pub fn put_le16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}

/// Stores `v` little-endian at `off`.
pub fn put_le32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

/// Stores `v` little-endian at `off`.
pub fn put_le64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_raw_matches_known_vector() {
        // Standard crc32c("123456789") = 0xE3069283 with inversion on both ends.
        assert_eq!(!crc32c_raw(!0, b"123456789"), 0xE306_9283);
        // Chaining two halves equals one pass.
        let whole = crc32c_raw(0x1234, b"hello world");
        let split = crc32c_raw(crc32c_raw(0x1234, b"hello "), b"world");
        assert_eq!(whole, split);
    }

    #[test]
    fn le_helpers_round_trip() {
        let mut b = [0u8; 16];
        put_le16(&mut b, 0, 0xBEEF);
        put_le32(&mut b, 2, 0xDEAD_BEEF);
        put_le64(&mut b, 6, 0x0102_0304_0506_0708);
        assert_eq!(le16(&b, 0), 0xBEEF);
        assert_eq!(le32(&b, 2), 0xDEAD_BEEF);
        assert_eq!(le64(&b, 6), 0x0102_0304_0506_0708);
        assert_eq!(b[6], 0x08);
    }
}
