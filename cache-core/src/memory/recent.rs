//! Values the memory tier's main part let go, kept a little longer: a victim cache, first in,
//! first out, bounded in bytes.
//!
//! Why it exists: the main part is moka, whose TinyLFU admission has no window. A new value is
//! weighed against the **sum** of the estimated frequencies of the values it would evict, so a
//! large block is turned away however many readers missed it whenever the values at the tier's
//! old end were read more (one value whose count is saturated is enough). Its fetch still served every reader that joined it, but readers
//! that came after the fetch ended (a herd's stragglers, a query run again) fetched it again:
//! 9 upstream GETs for 8 blocks in the full benchmark (docs/benchmarks.md, "The herd after a
//! full tier"). W-TinyLFU gives new values a window before admission; this gives the values
//! admission or eviction let go one after it, in a share of the same byte budget.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;

/// Bytes an entry is weighed at beyond its value's: its key, its two table slots and their
/// bookkeeping, roughly. Keeps the number of entries bounded even for empty values.
const ENTRY_OVERHEAD: u64 = 128;

/// Values let go, oldest first out, at most `capacity` bytes (values plus [`ENTRY_OVERHEAD`]).
pub(super) struct Recent<K> {
    capacity: u64,
    inner: Mutex<Inner<K>>,
    hits: AtomicU64,
}

struct Inner<K> {
    /// Each held value with its place in `order` and whether a read offered it to the main
    /// part again since it came here.
    values: HashMap<K, Entry>,
    /// Keys by the order they came in: the smallest sequence number goes first.
    order: BTreeMap<u64, K>,
    bytes: u64,
    next: u64,
}

struct Entry {
    seq: u64,
    bytes: Bytes,
    offered: bool,
}

fn weight(value: &Bytes) -> u64 {
    value.len() as u64 + ENTRY_OVERHEAD
}

/// What a lookup found.
pub(super) struct Found {
    pub(super) bytes: Bytes,
    /// The first read since the value came here: the caller offers it to the main part again,
    /// whose admission has now counted the misses for it.
    pub(super) first_read: bool,
}

impl<K: Hash + Eq + Clone> Recent<K> {
    pub(super) fn new(capacity: u64) -> Self {
        Self {
            capacity,
            inner: Mutex::new(Inner {
                values: HashMap::new(),
                order: BTreeMap::new(),
                bytes: 0,
                next: 0,
            }),
            hits: AtomicU64::new(0),
        }
    }

    /// Keep `value`, letting the oldest values go as far as needed to stay within capacity. A
    /// value already held under `key` is replaced and counts as new.
    pub(super) fn push(&self, key: K, value: Bytes) {
        if weight(&value) > self.capacity {
            return;
        }
        let mut inner = self.inner.lock();
        let seq = inner.next;
        inner.next += 1;
        inner.bytes += weight(&value);
        let entry = Entry {
            seq,
            bytes: value,
            offered: false,
        };
        if let Some(old) = inner.values.insert(key.clone(), entry) {
            inner.order.remove(&old.seq);
            inner.bytes -= weight(&old.bytes);
        }
        inner.order.insert(seq, key);
        while inner.bytes > self.capacity {
            let Some((_, oldest)) = inner.order.pop_first() else {
                break;
            };
            if let Some(gone) = inner.values.remove(&oldest) {
                inner.bytes -= weight(&gone.bytes);
            }
        }
    }

    /// The value held under `key`, if any. `offer`: whether this read would offer the value
    /// to the main part again, which only the first such read since the value came here is
    /// told to do.
    pub(super) fn get(&self, key: &K, offer: bool) -> Option<Found> {
        if self.capacity == 0 {
            return None;
        }
        let mut inner = self.inner.lock();
        let entry = inner.values.get_mut(key)?;
        let first_read = offer && !entry.offered;
        entry.offered |= offer;
        let bytes = entry.bytes.clone();
        drop(inner);
        self.hits.fetch_add(1, Ordering::Relaxed);
        Some(Found { bytes, first_read })
    }

    pub(super) fn contains(&self, key: &K) -> bool {
        self.capacity > 0 && self.inner.lock().values.contains_key(key)
    }

    pub(super) fn remove(&self, key: &K) {
        if self.capacity == 0 {
            return;
        }
        let mut inner = self.inner.lock();
        if let Some(gone) = inner.values.remove(key) {
            inner.order.remove(&gone.seq);
            inner.bytes -= weight(&gone.bytes);
        }
    }

    /// A copy of every key and value held now.
    pub(super) fn snapshot(&self) -> Vec<(K, Bytes)> {
        let inner = self.inner.lock();
        inner
            .values
            .iter()
            .map(|(k, e)| (k.clone(), e.bytes.clone()))
            .collect()
    }

    /// Bytes held (as weighed), entries held, and reads served since start.
    pub(super) fn stats(&self) -> (u64, u64, u64) {
        let inner = self.inner.lock();
        (
            inner.bytes,
            inner.values.len() as u64,
            self.hits.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(len: usize) -> Bytes {
        Bytes::from(vec![7u8; len])
    }

    #[test]
    fn lets_the_oldest_go_first_and_stays_within_capacity() {
        let recent = Recent::new(3 * (1000 + ENTRY_OVERHEAD));
        for k in 0..5u32 {
            recent.push(k, value(1000));
        }
        let (bytes, entries, _) = recent.stats();
        assert_eq!((bytes, entries), (3 * (1000 + ENTRY_OVERHEAD), 3));
        assert!(recent.get(&0, true).is_none() && recent.get(&1, true).is_none());
        assert!((2..5).all(|k| recent.get(&k, true).is_some()));
    }

    #[test]
    fn a_value_pushed_again_counts_as_new_and_once() {
        let recent = Recent::new(2 * (1000 + ENTRY_OVERHEAD));
        recent.push(1u32, value(1000));
        recent.push(2, value(1000));
        // Pushed again: now the newest, and the old copy's bytes are no longer counted.
        recent.push(1, value(1000));
        recent.push(3, value(1000));
        assert!(recent.get(&2, true).is_none(), "2 was the oldest");
        assert!(recent.get(&1, true).is_some() && recent.get(&3, true).is_some());
        assert_eq!(recent.stats().1, 2);
        // Pushed again and again without going over: its place in the order is not repeated.
        for _ in 0..1000 {
            recent.push(3, value(10));
        }
        assert_eq!(recent.inner.lock().order.len(), 2);
    }

    #[test]
    fn the_first_read_is_told_apart_and_a_push_resets_it() {
        let recent = Recent::new(1 << 20);
        recent.push(1u32, value(10));
        // A read that would not offer it (the fetcher's own) leaves the first read to come.
        assert!(!recent.get(&1, false).unwrap().first_read);
        assert!(recent.get(&1, true).unwrap().first_read);
        assert!(!recent.get(&1, true).unwrap().first_read);
        recent.push(1, value(10));
        assert!(recent.get(&1, true).unwrap().first_read);
        assert_eq!(recent.stats().2, 4);
    }

    #[test]
    fn values_larger_than_capacity_and_removed_ones_are_not_held() {
        let recent = Recent::new(1000);
        recent.push(1u32, value(1000));
        assert!(!recent.contains(&1));
        recent.push(2, value(10));
        recent.remove(&2);
        assert!(!recent.contains(&2));
        assert_eq!(recent.stats(), (0, 0, 0));
        let none = Recent::new(0);
        none.push(1u32, value(0));
        assert!(none.get(&1, true).is_none());
    }
}
