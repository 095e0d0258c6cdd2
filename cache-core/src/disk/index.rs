//! The in-memory index: key hash → packed disk address, 16 bytes of payload per entry.
//!
//! A record is one `u64`: region (24 bits), page offset in the region (16 bits), length in
//! pages (16 bits) and a 2-bit read count (S3-FIFO's frequency: reclaim re-inserts an entry
//! while the count is above zero and spends one each time). The full key lives only on disk
//! and is compared on every read, so two keys sharing a hash cost a miss, never wrong bytes.
//! Races between a reader, a writer replacing an entry and reclaim are settled by comparing the
//! whole record ("remove only if it still points where I think"), not by per-entry sequence
//! numbers.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use parking_lot::Mutex;

use crate::disk::format::SummaryRecord;

const SHARDS: usize = 64;
const REGION_BITS: u32 = 24;
const PAGE_BITS: u32 = 16;
const FREQ_SHIFT: u32 = 62;
const FREQ: u64 = 3 << FREQ_SHIFT;
/// Where the count saturates: past a few reads, more say nothing S3-FIFO would act on, and two
/// bits keep the record one `u64`.
const MAX_FREQ: u64 = 3;

fn freq(v: u64) -> u64 {
    v >> FREQ_SHIFT
}

fn with_freq(v: u64, f: u64) -> u64 {
    (v & !FREQ) | f << FREQ_SHIFT
}

/// Count one more read, saturating.
fn bump(v: &mut u64) {
    *v = with_freq(*v, (freq(*v) + 1).min(MAX_FREQ));
}

/// Where an entry lives: region, first page and page count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Addr {
    pub(crate) region: u32,
    pub(crate) page: u32,
    pub(crate) pages: u32,
}

/// Most regions an index can address.
pub(crate) const MAX_REGIONS: u64 = 1 << REGION_BITS;

impl Addr {
    /// Where the entry a region summary lists lives.
    pub(crate) fn of(region: u32, rec: &SummaryRecord) -> Self {
        Self {
            region,
            page: rec.page,
            pages: rec.pages,
        }
    }

    fn pack(self) -> u64 {
        debug_assert!((self.region as u64) < MAX_REGIONS);
        debug_assert!(self.page < 1 << PAGE_BITS && self.pages < 1 << PAGE_BITS);
        (self.region as u64) << (2 * PAGE_BITS)
            | (self.page as u64) << PAGE_BITS
            | self.pages as u64
    }

    fn unpack(v: u64) -> Self {
        let v = v & !FREQ;
        Self {
            region: (v >> (2 * PAGE_BITS)) as u32 & ((1 << REGION_BITS) - 1),
            page: (v >> PAGE_BITS) as u32 & ((1 << PAGE_BITS) - 1),
            pages: v as u32 & ((1 << PAGE_BITS) - 1),
        }
    }
}

/// Keys are already hashes (xxh3, or HMAC-SHA256 in a sealed store); hashing them again would
/// only cost time.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type Shard = HashMap<u64, u64, BuildHasherDefault<PassThrough>>;

pub(crate) struct Index {
    shards: Box<[Mutex<Shard>]>,
}

impl Index {
    pub(crate) fn new() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
        }
    }

    fn shard(&self, hash: u64) -> &Mutex<Shard> {
        // hashbrown takes a bucket from the low bits and a tag from the top 7: the shard comes
        // from bits in between, so every table still sees well-spread buckets and tags.
        &self.shards[(hash >> 40) as usize % SHARDS]
    }

    /// The address of `hash`, counting a read, and `witness(addr)` taken under the same lock, so
    /// that anything which removes the record first (reclaim) is ordered before the witness.
    pub(crate) fn lookup<W>(
        &self,
        hash: u64,
        witness: impl FnOnce(Addr) -> W,
    ) -> Option<(Addr, W)> {
        let mut shard = self.shard(hash).lock();
        let v = shard.get_mut(&hash)?;
        bump(v);
        let addr = Addr::unpack(*v);
        Some((addr, witness(addr)))
    }

    pub(crate) fn contains(&self, hash: u64) -> bool {
        self.shard(hash).lock().contains_key(&hash)
    }

    /// Whether `hash` is held, counting a read of it made elsewhere (the memory tier read a
    /// copy of it again): the disk's count then says how hot the block is, not only how often
    /// the disk itself served it, which for a block memory holds is rarely.
    pub(crate) fn touch(&self, hash: u64) -> bool {
        let mut shard = self.shard(hash).lock();
        shard.get_mut(&hash).map(bump).is_some()
    }

    /// Point `hash` at `addr`; the address it replaces, if any. A replaced record's read count
    /// carries over: the same hash is the same key, hence the same bytes (a re-insert by
    /// reclaim, which spent one read of the count first).
    pub(crate) fn insert(&self, hash: u64, addr: Addr) -> Option<Addr> {
        match self.shard(hash).lock().entry(hash) {
            Entry::Occupied(mut e) => {
                let old = *e.get();
                e.insert(with_freq(addr.pack(), freq(old)));
                Some(Addr::unpack(old))
            }
            Entry::Vacant(e) => {
                e.insert(addr.pack());
                None
            }
        }
    }

    /// Remove `hash` whatever it points at.
    pub(crate) fn remove(&self, hash: u64) -> Option<Addr> {
        self.shard(hash).lock().remove(&hash).map(Addr::unpack)
    }

    /// The reads counted for `hash`, if held.
    #[cfg(test)]
    pub(crate) fn reads(&self, hash: u64) -> Option<u64> {
        self.shard(hash).lock().get(&hash).map(|v| freq(*v))
    }

    /// Remove `hash` only if it still points at `addr`; whether it did.
    pub(crate) fn remove_if(&self, hash: u64, addr: Addr) -> bool {
        let mut shard = self.shard(hash).lock();
        let points_at = shard.get(&hash).is_some_and(|v| Addr::unpack(*v) == addr);
        if points_at {
            shard.remove(&hash);
        }
        points_at
    }

    /// Whether the record for `hash` still points at `addr` with reads counted; if so, one is
    /// spent (reclaim re-inserts it), so a block read once survives one more pass of the FIFO
    /// and one read three times or more survives three.
    pub(crate) fn spend_read(&self, hash: u64, addr: Addr) -> bool {
        let mut shard = self.shard(hash).lock();
        match shard.get_mut(&hash) {
            Some(v) if Addr::unpack(*v) == addr && freq(*v) > 0 => {
                *v = with_freq(*v, freq(*v) - 1);
                true
            }
            _ => false,
        }
    }

    /// Remove every record in `region`; how many. A full sweep, for a region whose summary
    /// cannot be read.
    pub(crate) fn remove_region(&self, region: u32) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let mut s = s.lock();
                let before = s.len();
                s.retain(|_, v| Addr::unpack(*v).region != region);
                before - s.len()
            })
            .sum()
    }

    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// Heap bytes the tables hold: per slot a 16-byte record and a control byte.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let cap = s.lock().capacity();
                // hashbrown allocates buckets = next_pow2(cap * 8 / 7) plus 16 trailing
                // control bytes; capacity() is 7/8 of the buckets once past 8.
                let buckets = if cap == 0 {
                    0
                } else {
                    (cap * 8 / 7).next_power_of_two()
                };
                buckets * 17 + if buckets > 0 { 16 } else { 0 }
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_pack_losslessly() {
        for addr in [
            Addr {
                region: 0,
                page: 0,
                pages: 1,
            },
            Addr {
                region: (1 << 24) - 1,
                page: 65535,
                pages: 65535,
            },
            Addr {
                region: 12345,
                page: 2049,
                pages: 2050,
            },
        ] {
            assert_eq!(Addr::unpack(addr.pack()), addr);
            assert_eq!(Addr::unpack(addr.pack() | FREQ), addr);
        }
    }

    /// An empty index, and two addresses of the same length in different regions.
    fn index_and_two_addresses() -> (Index, Addr, Addr) {
        let a = Addr {
            region: 1,
            page: 1,
            pages: 3,
        };
        (Index::new(), a, Addr { region: 2, ..a })
    }

    #[test]
    fn remove_if_only_removes_the_named_address() {
        let (index, a, b) = index_and_two_addresses();
        assert_eq!(index.insert(7, a), None);
        assert_eq!(index.insert(7, b), Some(a));
        assert!(!index.remove_if(7, a));
        assert!(index.remove_if(7, b));
        assert!(!index.contains(7));
    }

    #[test]
    fn reads_are_counted_to_three_spent_one_by_one_and_carried_by_a_reinsert() {
        let (index, a, b) = index_and_two_addresses();
        index.insert(7, a);
        assert!(!index.spend_read(7, a), "never read: nothing to spend");
        for _ in 0..5 {
            assert_eq!(index.lookup(7, |x| x), Some((a, a)));
        }
        assert!(index.touch(7) && !index.touch(8));
        assert!(!index.spend_read(7, b), "another address: not this record");
        assert!(index.spend_read(7, a));
        // Re-inserted elsewhere: the two reads left carry over, and no more than that.
        assert_eq!(index.insert(7, b), Some(a));
        assert!(index.spend_read(7, b) && index.spend_read(7, b));
        assert!(!index.spend_read(7, b));
        assert_eq!(
            index.lookup(7, |x| x),
            Some((b, b)),
            "the address is intact"
        );
        assert!(index.spend_read(7, b) && !index.spend_read(7, b));
    }

    #[test]
    fn bytes_per_entry_as_the_tables_grow() {
        let index = Index::new();
        let n = 200_000;
        for i in 0..n as u64 {
            let h = xxhash_rust::xxh3::xxh3_64(&i.to_le_bytes());
            index.insert(
                h,
                Addr {
                    region: 1,
                    page: 0,
                    pages: 1,
                },
            );
        }
        let per = index.heap_bytes() as f64 / index.len() as f64;
        // A table grows by doubling at 87.5% full, so it is 44% to 87.5% full: 19.4 to 38.9 B.
        assert!((17.0..40.0).contains(&per), "{per} B per entry");
    }
}
