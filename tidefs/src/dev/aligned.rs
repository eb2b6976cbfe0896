//! `AlignedBuf`: memory that direct I/O can move, aligned to [`MEMORY_ALIGN`]. Every transfer of
//! the file backend (`dev/file.rs`) and of its `io_uring` writer (`dev/uring.rs`) goes through one.

/// Alignment of the memory of every direct transfer. 4096 covers every device's DMA alignment
/// (`statx`'s `stx_dio_mem_align` is at most the page size).
pub const MEMORY_ALIGN: usize = 4096;

/// A byte buffer whose first byte is aligned to [`MEMORY_ALIGN`]: an over-allocated
/// `Vec` used from the first aligned position, so no `unsafe` is needed.
pub struct AlignedBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// `len` zero bytes, aligned.
    pub fn zeroed(len: usize) -> AlignedBuf {
        let storage = vec![0u8; len + MEMORY_ALIGN];
        let start = storage.as_ptr().align_offset(MEMORY_ALIGN);
        // align_offset on a u8 pointer always succeeds and is below the alignment.
        assert!(start < MEMORY_ALIGN);
        AlignedBuf {
            storage,
            start,
            len,
        }
    }

    /// `pieces` one after the other, aligned, `len` bytes in all (which they must add up to).
    /// Nothing is zeroed first, since every byte is written: a commit's merged runs of file
    /// data are megabytes.
    pub fn from_pieces<'a>(len: usize, pieces: impl IntoIterator<Item = &'a [u8]>) -> AlignedBuf {
        let mut storage: Vec<u8> = Vec::with_capacity(len + MEMORY_ALIGN);
        let start = storage.as_ptr().align_offset(MEMORY_ALIGN);
        assert!(start < MEMORY_ALIGN);
        // Within the capacity, so the storage never moves and `start` stays aligned.
        storage.resize(start, 0);
        for piece in pieces {
            storage.extend_from_slice(piece);
        }
        assert_eq!(
            storage.len(),
            start + len,
            "pieces do not add up to the length"
        );
        AlignedBuf {
            storage,
            start,
            len,
        }
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a buffer built from pieces is aligned and holds exactly the pieces in order, for
    /// sizes around the alignment; pieces that do not add up to the length are refused.
    #[test]
    fn pieces_land_aligned_and_in_order() {
        for sizes in [
            vec![1usize],
            vec![4096, 4096],
            vec![512, 3584, 8192],
            vec![100, 1],
        ] {
            let pieces: Vec<Vec<u8>> = sizes
                .iter()
                .enumerate()
                .map(|(k, &n)| vec![k as u8 + 1; n])
                .collect();
            let len = sizes.iter().sum();
            let buf = AlignedBuf::from_pieces(len, pieces.iter().map(|p| &p[..]));
            assert_eq!(buf.as_slice().as_ptr() as usize % MEMORY_ALIGN, 0);
            assert_eq!(buf.as_slice(), pieces.concat());
        }
        let short = std::panic::catch_unwind(|| AlignedBuf::from_pieces(10, [&[1u8; 9][..]]));
        assert!(short.is_err(), "pieces shorter than the length were taken");
    }
}
