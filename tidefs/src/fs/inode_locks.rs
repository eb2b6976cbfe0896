//! Per-inode data locks: a read of a file holds its lock shared, and every change to the
//! file's bytes or size (write, truncate, hole punch, zero range) holds it exclusively, so a
//! read never sees blocks freed or remapped under it and a read served from the page cache
//! alone sees one state of the file (docs/DESIGN.md §2.5).
//!
//! A lock exists only while someone holds or waits for it: the locks live in a map split
//! into shards (a lookup locks one shard, not the whole map), and the last guard of an inode
//! removes its entry, so the map stays as small as the number of files in use at once.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::{ArcRwLockReadGuard, ArcRwLockWriteGuard, Mutex, RawRwLock, RwLock};

type Lock = Arc<RwLock<()>>;

/// Shards of the map (a power of two).
const SHARDS: usize = 64;

/// See the module documentation.
pub(crate) struct InodeLocks {
    shards: Box<[Mutex<HashMap<u32, Lock>>]>,
}

impl Default for InodeLocks {
    fn default() -> Self {
        InodeLocks {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }
}

/// A held lock; dropping it releases the lock, and removes the inode's entry if nobody else
/// holds or waits for it.
pub(crate) struct InodeGuard<'a> {
    locks: &'a InodeLocks,
    ino: u32,
    /// The held lock, with its reference to it; taken when the guard goes.
    held: Option<Held>,
}

enum Held {
    Shared(ArcRwLockReadGuard<RawRwLock, ()>),
    Exclusive(ArcRwLockWriteGuard<RawRwLock, ()>),
}

impl Held {
    /// Releases the lock, keeping the reference to it.
    fn release(self) -> Lock {
        match self {
            Held::Shared(g) => ArcRwLockReadGuard::into_arc(g),
            Held::Exclusive(g) => ArcRwLockWriteGuard::into_arc(g),
        }
    }
}

impl InodeLocks {
    fn shard(&self, ino: u32) -> &Mutex<HashMap<u32, Lock>> {
        &self.shards[ino as usize % SHARDS]
    }

    /// The lock of `ino`, made if missing.
    fn lock_of(&self, ino: u32) -> Lock {
        self.shard(ino).lock().entry(ino).or_default().clone()
    }

    /// Holds `ino`'s lock shared (readers).
    pub fn read(&self, ino: u32) -> InodeGuard<'_> {
        self.hold(ino, |l| Held::Shared(l.read_arc()))
    }

    /// Holds `ino`'s lock exclusively (changes to the file's bytes or size).
    pub fn write(&self, ino: u32) -> InodeGuard<'_> {
        self.hold(ino, |l| Held::Exclusive(l.write_arc()))
    }

    fn hold(&self, ino: u32, take: impl FnOnce(&Lock) -> Held) -> InodeGuard<'_> {
        InodeGuard {
            locks: self,
            ino,
            held: Some(take(&self.lock_of(ino))),
        }
    }

    /// Inodes with a lock entry (held or waited for).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }
}

impl Drop for InodeGuard<'_> {
    fn drop(&mut self) {
        let Some(held) = self.held.take() else {
            return;
        };
        let lock = held.release();
        let mut shard = self.locks.shard(self.ino).lock();
        // References are taken and, by guards, dropped only under the shard's mutex: two
        // left (the map's and this guard's) means nobody else holds or waits for the lock.
        if Arc::strong_count(&lock) == 2 {
            shard.remove(&self.ino);
        }
        drop(lock);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn entries_live_only_while_held_and_writers_exclude_readers_of_the_same_inode() {
        // Goal: the map does not grow with every inode ever locked; an exclusive holder
        // keeps readers of its inode out and nobody else's. Method: guards on threads.
        let locks = Arc::new(InodeLocks::default());
        for ino in 0..1000 {
            drop(locks.read(ino));
            drop(locks.write(ino));
        }
        assert_eq!(locks.len(), 0);

        let writer = locks.write(5);
        let (tx, rx) = mpsc::channel();
        for ino in [5u32, 6, 5 + SHARDS as u32] {
            let (locks, tx) = (locks.clone(), tx.clone());
            std::thread::spawn(move || {
                let _g = locks.read(ino);
                let _ = tx.send(ino);
            });
        }
        let mut first = vec![
            rx.recv_timeout(Duration::from_secs(20)).unwrap(),
            rx.recv_timeout(Duration::from_secs(20)).unwrap(),
        ];
        first.sort_unstable();
        assert_eq!(first, vec![6, 5 + SHARDS as u32]);
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
        drop(writer);
        assert_eq!(rx.recv_timeout(Duration::from_secs(20)).unwrap(), 5);
        // The reader's guard is dropped on its thread right after it sends.
        for _ in 0..2000 {
            if locks.len() == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(locks.len(), 0);
    }
}
