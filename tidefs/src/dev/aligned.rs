//! `AlignedBuf`: memory that direct I/O can move, aligned to [`MEMORY_ALIGN`]. Every transfer of
//! the file backend (`dev/file.rs`) and of its `io_uring` writer (`dev/uring.rs`) goes through one.

/// Alignment of the memory of every direct transfer. 4096 covers every device's DMA alignment
/// (`statx`'s `stx_dio_mem_align` is at most the page size).
pub const MEMORY_ALIGN: usize = 4096;

/// A zeroed byte buffer whose first byte is aligned to [`MEMORY_ALIGN`]: an over-allocated
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

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}
