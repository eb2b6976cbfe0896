//! Where each byte of a file read comes from: the file's cached pages, zeros (a hole or an
//! unwritten extent), a copy of a block not yet at home (journaled data), or the block's home
//! location on the device.
//!
//! One planner serves both kinds of read (docs/DESIGN.md §2.5, "Reads without the lock"):
//! under the metadata lock, from the block map it loads, and without it, from the block map
//! an earlier read under the lock published in the page cache. Either way the caller holds
//! the page cache's mutex while planning, so the pages found and the map used belong to one
//! state of the file. Pure data: it knows nothing of `Meta`.

use std::sync::Arc;

use super::datacache::DataCache;
use super::extent_map::ExtentMap;

/// Where the bytes of a piece of a read come from.
#[derive(Clone, Debug)]
pub(crate) enum ReadSource {
    /// A hole or an unwritten extent: zeros.
    Zeros,
    /// The home location on the device: `in_block` bytes into physical block `block`, which
    /// holds logical block `lblk` of the file (the blocks after it follow in both).
    Device {
        block: u64,
        in_block: usize,
        lblk: u32,
    },
    /// Bytes already in memory: cached pages, or a copy not yet at home (journal-mode data in
    /// the buffer cache or the journal).
    Bytes(Vec<u8>),
}

/// A piece of a read: `len` bytes, consecutive in the file.
#[derive(Clone, Debug)]
pub(crate) struct ReadSegment {
    pub len: usize,
    pub source: ReadSource,
}

/// Plans the read of bytes `[offset, end)` of file `ino` (`end` already clipped to its size):
/// each block from its page if cached, else from `map` (zeros for a hole or an unwritten
/// extent), else from `newer_copy` of its physical block if that has one (a copy newer than
/// home), else from home. Adjacent pieces of one kind are merged (device pieces when their
/// blocks follow each other on the device too).
pub(crate) fn plan(
    map: &ExtentMap,
    pages: &mut DataCache,
    ino: u32,
    offset: u64,
    end: u64,
    block_size: u32,
    mut newer_copy: impl FnMut(u64) -> Option<Arc<[u8]>>,
) -> Vec<ReadSegment> {
    let bs = u64::from(block_size);
    let mut segs: Vec<ReadSegment> = Vec::new();
    let mut pos = offset;
    while pos < end {
        // The caller checked `offset` and the size against the 32-bit block range.
        let lblk = (pos / bs) as u32;
        let in_block = (pos % bs) as usize;
        let len = (bs - in_block as u64).min(end - pos) as usize;
        pos += len as u64;
        let mut bytes = vec![0u8; len];
        let at = u64::from(lblk) * bs + in_block as u64;
        let source = if pages.copy_out(ino, at, &mut bytes, block_size) {
            ReadSource::Bytes(bytes)
        } else {
            match map.map(lblk) {
                Some((p, false)) => match newer_copy(p) {
                    Some(copy) => ReadSource::Bytes(copy[in_block..in_block + len].to_vec()),
                    None => ReadSource::Device {
                        block: p,
                        in_block,
                        lblk,
                    },
                },
                _ => ReadSource::Zeros,
            }
        };
        // Merge with the previous segment when contiguous (a device piece after the first
        // starts at its block's beginning).
        if let Some(last) = segs.last_mut() {
            let merged = match (&mut last.source, &source) {
                (ReadSource::Zeros, ReadSource::Zeros) => true,
                (
                    ReadSource::Device {
                        block: a,
                        in_block: at,
                        ..
                    },
                    ReadSource::Device { block: b, .. },
                ) => *a * bs + (*at + last.len) as u64 == *b * bs,
                (ReadSource::Bytes(a), ReadSource::Bytes(b)) => {
                    a.extend_from_slice(b);
                    true
                }
                _ => false,
            };
            if merged {
                last.len += len;
                continue;
            }
        }
        segs.push(ReadSegment { len, source });
    }
    segs
}

#[cfg(test)]
mod tests {
    use super::*;

    const BS: u32 = 1024;

    /// Blocks 0–3 of file 5 at 100–103, block 4 unwritten at 104, block 6 at 200, a hole at 5.
    fn map() -> ExtentMap {
        let mut m = ExtentMap::default();
        for l in 0..4 {
            m.insert(l, 100 + u64::from(l), false);
        }
        m.insert(4, 104, true);
        m.insert(6, 200, false);
        m
    }

    fn kinds(segs: &[ReadSegment]) -> Vec<(usize, String)> {
        segs.iter()
            .map(|s| {
                let k = match &s.source {
                    ReadSource::Zeros => "zeros".to_string(),
                    ReadSource::Device {
                        block,
                        in_block,
                        lblk,
                    } => {
                        format!("dev {block}+{in_block} (l{lblk})")
                    }
                    ReadSource::Bytes(b) => format!("bytes {}", b.len()),
                };
                (s.len, k)
            })
            .collect()
    }

    #[test]
    fn pieces_come_from_pages_then_newer_copies_then_home_and_merge_by_kind() {
        let mut pages = DataCache::new(64);
        // Block 2 is cached.
        assert!(pages.insert_read(5, 2, vec![7u8; BS as usize].into(), pages.drops(5)));
        let newer = |p: u64| (p == 200).then(|| Arc::from(vec![9u8; BS as usize]));
        let segs = plan(&map(), &mut pages, 5, 10, 7 * u64::from(BS), BS, newer);
        assert_eq!(
            kinds(&segs),
            vec![
                (2 * BS as usize - 10, "dev 100+10 (l0)".to_string()),
                (BS as usize, "bytes 1024".to_string()),
                (BS as usize, "dev 103+0 (l3)".to_string()),
                // The unwritten block and the hole read as zeros, merged.
                (2 * BS as usize, "zeros".to_string()),
                // Block 6's newest copy is not at home.
                (BS as usize, "bytes 1024".to_string()),
            ]
        );
        let ReadSource::Bytes(b) = &segs[4].source else {
            unreachable!()
        };
        assert!(b.iter().all(|&x| x == 9));
    }

    #[test]
    fn consecutive_cached_pieces_become_one_segment() {
        let mut pages = DataCache::new(64);
        for l in 0..3 {
            assert!(pages.insert_read(5, l, vec![l as u8; BS as usize].into(), 0));
        }
        let segs = plan(
            &map(),
            &mut pages,
            5,
            100,
            3 * u64::from(BS) - 1,
            BS,
            |_| None,
        );
        assert_eq!(segs.len(), 1);
        let ReadSource::Bytes(b) = &segs[0].source else {
            unreachable!()
        };
        assert_eq!(b.len(), 3 * BS as usize - 101);
        assert_eq!(b[0], 0);
        assert_eq!(b[BS as usize - 100], 1);
        assert_eq!(*b.last().unwrap(), 2);
    }
}
