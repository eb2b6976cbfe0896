//! The crash-state generator: from a base image and a write log, the disk images a power cut
//! could leave behind.
//!
//! The log is cut into *epochs* at its flushes: epoch 0 runs from the start of the log to the
//! first flush, epoch `k` from flush `k` to flush `k + 1` (or the end of the log). A crash in
//! epoch `k` finds every write of the epochs before `k` durable (a flush returned after them) and
//! any subset of the writes of epoch `k` issued so far, persisted in any order, possibly torn at
//! 512-byte sectors.
//!
//! Invariants:
//! - a [`CrashState`] of epoch `k` applies exactly the writes of epochs `< k` in log order, then
//!   its `applied` writes (all from epoch `k`, each at most once) in its own order;
//! - `crash_pos` is the log position of the crash: entries before it had been issued (so their
//!   markers count as promises made), entries from it on had not. It never lies past the flush
//!   that closes the epoch, since that flush would have made the epoch's writes durable;
//! - the same (log, epoch, rng seed) always gives the same state.

use tidefs::dev::record::LogEntry;

/// Size of a device sector: the unit a torn write keeps or loses.
pub const SECTOR_BYTES: usize = 512;

/// A small deterministic PRNG (SplitMix64), so the harness needs no extra crate and a seed
/// replays exactly on every platform.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// A generator for item `index` of stream `seed` (independent of the other items).
    pub fn derive(seed: u64, stream: u64, index: u64) -> Rng {
        let mut r = Rng(seed ^ mix(stream.wrapping_add(0x5851_F42D_4C95_7F2D)));
        let s = r.next_u64() ^ mix(index);
        Rng(s)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0);
        self.next_u64() % n
    }

    /// True with probability `num / den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }

    /// Shuffles `v` (Fisher-Yates).
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            // i + 1 fits in u64 and the result is at most i.
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }
}

/// SplitMix64's finaliser: a bijective 64-bit mixer.
pub fn mix(x: u64) -> u64 {
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One epoch of a log: the entries between two flushes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Epoch {
    /// Log index of the first entry of the epoch (just after the flush that opens it, or 0).
    pub start: usize,
    /// Log index of the flush that closes the epoch, or the log length for the last epoch.
    pub end: usize,
    /// Log indices of the epoch's writes, in order.
    pub writes: Vec<usize>,
}

/// Cuts a log into epochs (always at least one).
pub fn epochs(log: &[LogEntry]) -> Vec<Epoch> {
    let mut out = Vec::new();
    let mut cur = Epoch {
        start: 0,
        end: log.len(),
        writes: Vec::new(),
    };
    for (i, e) in log.iter().enumerate() {
        match e {
            LogEntry::Write { .. } => cur.writes.push(i),
            LogEntry::Flush => {
                cur.end = i;
                out.push(std::mem::replace(
                    &mut cur,
                    Epoch {
                        start: i + 1,
                        end: log.len(),
                        writes: Vec::new(),
                    },
                ));
            }
            LogEntry::Marker(_) => {}
        }
    }
    out.push(cur);
    out
}

/// A write of the crash epoch that reached the disk.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Applied {
    /// Log index of the write.
    pub log_index: usize,
    /// `None`: the whole write. `Some(mask)`: torn, only sectors whose bit is set (sector `i`
    /// of the write is bit `i`; writes longer than 64 sectors are never torn).
    pub sectors: Option<u64>,
}

/// A disk image a crash could leave, described relative to a log.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CrashState {
    /// The epoch in which the crash happened.
    pub epoch: usize,
    /// Writes of that epoch that persisted, in the order they are applied.
    pub applied: Vec<Applied>,
    /// Log position of the crash (see the module invariants).
    pub crash_pos: usize,
}

impl CrashState {
    /// One line for reports.
    pub fn describe(&self, log: &[LogEntry]) -> String {
        let mut s = format!(
            "epoch {} (crash at log position {}), ",
            self.epoch, self.crash_pos
        );
        if self.applied.is_empty() {
            s.push_str("no in-flight write persisted");
            return s;
        }
        s.push_str("in-flight writes persisted, in this order: ");
        let parts: Vec<String> = self
            .applied
            .iter()
            .map(|a| {
                let (off, len) = match &log[a.log_index] {
                    LogEntry::Write { offset, data } => (*offset, data.len()),
                    _ => (0, 0),
                };
                let torn = match a.sectors {
                    None => String::new(),
                    Some(m) => format!(" torn(sectors {m:#x})"),
                };
                format!("#{}@{off}+{len}{torn}", a.log_index)
            })
            .collect();
        s.push_str(&parts.join(", "));
        s
    }
}

/// The state at the flush that opens epoch `e`: exactly the writes before it, nothing after.
/// The crash is placed just before the epoch's first write, so markers placed between the
/// flush and that write count as promises (the disk content is the same).
pub fn flush_state(eps: &[Epoch], e: usize) -> CrashState {
    let ep = &eps[e];
    CrashState {
        epoch: e,
        applied: Vec::new(),
        crash_pos: ep.writes.first().copied().unwrap_or(ep.end),
    }
}

/// A sampled state of epoch `e`: a crash after some of the epoch's writes were issued, with a
/// random subset of them persisted in a random order; with `torn`, some persist only partly.
/// An epoch without writes gives its flush state.
pub fn sampled_state(
    log: &[LogEntry],
    eps: &[Epoch],
    e: usize,
    rng: &mut Rng,
    torn: bool,
) -> CrashState {
    let ep = &eps[e];
    let n = ep.writes.len();
    if n == 0 {
        return flush_state(eps, e);
    }
    // n is a small count of log entries; it fits in u64, and the results fit back in usize.
    // Half the crashes come after the whole epoch was issued: the write just before a flush
    // (a commit block, say) is the one whose ordering the flush exists for.
    let cut = if rng.chance(1, 2) {
        n
    } else {
        1 + rng.below(n as u64) as usize
    };
    let issued = &ep.writes[..cut];
    let shape = rng.below(5);
    let mut chosen: Vec<usize> = match shape {
        // An in-order disk: a prefix of the issued writes.
        0 => issued[..rng.below(cut as u64 + 1) as usize].to_vec(),
        // Everything but one write. Shape 1 always keeps the newest issued write, losing an
        // older one: the state that a missing ordering point between the two exposes.
        1 | 2 => {
            let candidates = if shape == 1 && cut >= 2 { cut - 1 } else { cut };
            let skip = rng.below(candidates as u64) as usize;
            issued
                .iter()
                .enumerate()
                .filter(|&(i, _)| i != skip)
                .map(|(_, &w)| w)
                .collect()
        }
        // Any subset.
        _ => issued
            .iter()
            .copied()
            .filter(|_| rng.chance(1, 2))
            .collect(),
    };
    rng.shuffle(&mut chosen);
    let applied = chosen
        .into_iter()
        .map(|log_index| {
            let len = match &log[log_index] {
                LogEntry::Write { data, .. } => data.len(),
                _ => 0,
            };
            let sectors = len.div_ceil(SECTOR_BYTES);
            let mask = if torn && (2..=64).contains(&sectors) && rng.chance(1, 3) {
                let full = if sectors == 64 {
                    u64::MAX
                } else {
                    (1u64 << sectors) - 1
                };
                let m = rng.next_u64() & full;
                // Keep at least one sector and lose at least one, or it is not torn.
                let m = if m == 0 { 1 } else { m };
                Some(if m == full { full & !1 } else { m })
            } else {
                None
            };
            Applied {
                log_index,
                sectors: mask,
            }
        })
        .collect();
    CrashState {
        epoch: e,
        applied,
        crash_pos: ep.writes.get(cut).copied().unwrap_or(ep.end),
    }
}

fn apply(img: &mut [u8], offset: u64, data: &[u8], sectors: Option<u64>) {
    // Offsets in a log were checked against the device length when the write happened.
    let start = usize::try_from(offset).unwrap_or(usize::MAX);
    match sectors {
        None => img[start..start + data.len()].copy_from_slice(data),
        Some(mask) => {
            for (i, chunk) in data.chunks(SECTOR_BYTES).enumerate() {
                if i < 64 && mask & (1u64 << i) != 0 {
                    let at = start + i * SECTOR_BYTES;
                    img[at..at + chunk.len()].copy_from_slice(chunk);
                }
            }
        }
    }
}

/// Builds the image of `state`: `base`, every write of the epochs before the crash epoch, then
/// the applied in-flight writes.
pub fn build_image(base: &[u8], log: &[LogEntry], eps: &[Epoch], state: &CrashState) -> Vec<u8> {
    let mut img = base.to_vec();
    let durable_end = eps[state.epoch].start;
    for e in &log[..durable_end] {
        if let LogEntry::Write { offset, data } = e {
            apply(&mut img, *offset, data, None);
        }
    }
    for a in &state.applied {
        if let LogEntry::Write { offset, data } = &log[a.log_index] {
            apply(&mut img, *offset, data, a.sectors);
        }
    }
    img
}

/// The image after every write of the log (what the device showed at its end).
pub fn final_image(base: &[u8], log: &[LogEntry]) -> Vec<u8> {
    let mut img = base.to_vec();
    for e in log {
        if let LogEntry::Write { offset, data } = e {
            apply(&mut img, *offset, data, None);
        }
    }
    img
}
