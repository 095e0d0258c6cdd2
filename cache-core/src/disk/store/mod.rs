//! One partition's store: its regions, index, write path, reads and reclaim.
//!
//! Regions are filled append-only, one at a time, and evicted whole in FIFO order (preferring a
//! much emptier region among the oldest few). A region's life: ready → open (its remaining index
//! records removed, then its header names a fresh epoch; appending) → sealed (summary and header
//! written) → reclaimed (entries read since written copied forward) → ready, its entries still
//! readable. Readers never take a lock across I/O: they note the region's epoch when they look
//! the entry up and check it again after the read, and the epoch changes only after the
//! region's index records are removed, so bytes from a reused region are never served.
//!
//! The read path (lookups, verification, the epoch check) is in `read`, eviction in `reclaim`.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::{Notify, OnceCell, OwnedSemaphorePermit, Semaphore};

use crate::disk::admission::{Admission, Ghost, Offer, RateLimit};
use crate::disk::format::{
    self, EntryHeader, EntryLayout, RegionHeader, SummaryRecord, MAX_KEY_LEN, PAGE,
};
use crate::disk::index::{Addr, Index};
use crate::disk::io::{AlignedBuf, IoEngine};
use crate::disk::sealing::DataKey;
use crate::disk::stats::{Counters, DropReason};

mod read;
mod reclaim;

pub(crate) use read::stream;
pub use read::{ReadFailed, ValueStream};

/// Hash of a key in a plain store, stable across builds and restarts (it is persisted in region
/// summaries). A sealed store keys its hashes instead ([`Store::hash`]).
pub(crate) fn hash_key(key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key)
}

pub(crate) struct RegionSlot {
    /// Epoch of the data the region holds, 0 if it never held any. Readers compare it before
    /// and after.
    pub(crate) epoch: AtomicU64,
    /// Bytes of indexed entries in the region, to prefer much emptier victims.
    pub(crate) live: AtomicU64,
}

struct OpenRegion {
    epoch: u64,
    /// Next free byte within the region.
    write_pos: u64,
    records: Vec<SummaryRecord>,
    /// Writes allocated here and not yet finished.
    pending: usize,
    full: bool,
    /// The region header naming the new epoch must land before any entry does.
    header: Arc<OnceCell<bool>>,
}

#[derive(Default)]
pub(crate) struct Alloc {
    open: HashMap<u32, OpenRegion>,
    active: Option<u32>,
    /// Sealed regions, oldest first.
    pub(crate) fifo: VecDeque<u32>,
    /// How many regions reclaim took out of order while the oldest waited (reset when the
    /// oldest is taken), so the oldest waits a bounded time however full it is.
    pub(crate) passed_over: usize,
    /// Regions ready for writing, in the order they became ready.
    pub(crate) free: VecDeque<Ready>,
    pub(crate) next_epoch: u64,
}

/// A region ready for writing, and what it may still hold.
pub(crate) struct Ready {
    pub(crate) region: u32,
    pub(crate) stale: Stale,
}

/// What a ready region still holds, readable until the region is opened for writing.
pub(crate) enum Stale {
    /// Nothing: never written, or of another generation.
    Nothing,
    /// The entries its summary lists.
    Records(Vec<SummaryRecord>),
    /// Unknown (the summary could not be read): the whole index is swept for it.
    Unknown,
}

impl Ready {
    pub(crate) fn empty(region: u32) -> Self {
        Self {
            region,
            stale: Stale::Nothing,
        }
    }
}

struct Pending {
    key: Bytes,
    value: Bytes,
    ticket: u64,
}

/// How a store behaves; fixed at open.
#[derive(Debug, Clone)]
pub(crate) struct StoreConfig {
    pub(crate) name: String,
    pub(crate) base: u64,
    pub(crate) regions: u32,
    pub(crate) region_size: u64,
    pub(crate) generation: u64,
    pub(crate) admission: Admission,
    pub(crate) write_rate: u64,
    pub(crate) write_buffer: u64,
    pub(crate) max_entry: u64,
    /// The key every entry is sealed with, if any.
    pub(crate) sealing: Option<Arc<DataKey>>,
}

pub(crate) struct Store {
    pub(crate) cfg: StoreConfig,
    pub(crate) io: Arc<dyn IoEngine>,
    pub(crate) regions: Box<[RegionSlot]>,
    pub(crate) index: Index,
    pub(crate) alloc: Mutex<Alloc>,
    inflight: Mutex<HashMap<u64, Pending>>,
    budget: Arc<Semaphore>,
    rate: RateLimit,
    ghost: Ghost,
    pub(crate) counters: Counters,
    next_ticket: AtomicU64,
    region_freed: Notify,
    /// Writes accepted and not finished, and a wake-up for `drain` when it reaches 0.
    writing: AtomicU64,
    idle: Notify,
    reclaim_wanted: Notify,
    pub(crate) closed: AtomicBool,
}

/// Largest value sealed on the writing task itself (about 60 µs of AES-GCM here); larger ones
/// are sealed on a blocking thread.
const SEAL_INLINE: usize = 256 * 1024;

/// Free regions reclaim keeps ready, so a writer rarely waits for one.
fn reserve(regions: u32) -> usize {
    if regions >= 8 {
        2
    } else {
        1
    }
}

/// An entry that has been read and verified.
struct ReadEntry {
    header: EntryHeader,
    buf: AlignedBuf,
}

impl Store {
    pub(crate) fn new(cfg: StoreConfig, io: Arc<dyn IoEngine>) -> Arc<Self> {
        let regions = (0..cfg.regions)
            .map(|_| RegionSlot {
                epoch: AtomicU64::new(0),
                live: AtomicU64::new(0),
            })
            .collect();
        let pages = (cfg.write_buffer / PAGE as u64).clamp(1, u32::MAX as u64 >> 4) as usize;
        Arc::new(Self {
            rate: RateLimit::new(cfg.write_rate),
            budget: Arc::new(Semaphore::new(pages)),
            // As many hashes as the store could hold entries (two pages each at the least).
            ghost: Ghost::new(
                (cfg.regions as u64 * cfg.region_size / (2 * PAGE as u64)).min(1 << 24) as usize,
            ),
            cfg,
            io,
            regions,
            index: Index::new(),
            alloc: Mutex::new(Alloc {
                next_epoch: 1,
                ..Alloc::default()
            }),
            inflight: Mutex::new(HashMap::new()),
            counters: Counters::default(),
            next_ticket: AtomicU64::new(1),
            region_freed: Notify::new(),
            writing: AtomicU64::new(0),
            idle: Notify::new(),
            reclaim_wanted: Notify::new(),
            closed: AtomicBool::new(false),
        })
    }

    fn region_offset(&self, region: u32) -> u64 {
        self.cfg.base + region as u64 * self.cfg.region_size
    }

    fn entry_offset(&self, addr: Addr) -> u64 {
        self.region_offset(addr.region) + addr.page as u64 * PAGE as u64
    }

    /// Largest entry (on disk) that fits an empty region next to its header and summary.
    fn max_total(&self) -> u64 {
        self.cfg.region_size - PAGE as u64 - format::summary_len(1)
    }

    /// Hash of a key for the index and the region summaries: xxh3, or, when entries are sealed,
    /// keyed by the device key, so the summaries on the device do not confirm a guessed key.
    pub(crate) fn hash(&self, key: &[u8]) -> u64 {
        match &self.cfg.sealing {
            None => hash_key(key),
            Some(device) => device.hash_key(key),
        }
    }

    pub(crate) fn contains(&self, key: &[u8]) -> bool {
        let hash = self.hash(key);
        self.inflight.lock().contains_key(&hash) || self.index.contains(hash)
    }

    /// [`contains`](Self::contains), counting a read of `key` made elsewhere.
    pub(crate) fn touch(&self, key: &[u8]) -> bool {
        let hash = self.hash(key);
        self.inflight.lock().contains_key(&hash) || self.index.touch(hash)
    }

    #[cfg(test)]
    pub(crate) fn reads_counted(&self, key: &[u8]) -> Option<u64> {
        self.index.reads(self.hash(key))
    }

    /// Offer `value` for a disk write. Never waits: either the entry is accepted (readable at once,
    /// written in the background) or it is dropped and counted under the reason returned.
    pub(crate) fn insert(
        self: &Arc<Self>,
        key: &[u8],
        value: Bytes,
        offer: Offer,
    ) -> Result<(), DropReason> {
        let r = self.admit(key, &value, offer);
        if let Err(reason) = r {
            self.counters.dropped(reason);
        }
        r
    }

    fn admit(self: &Arc<Self>, key: &[u8], value: &Bytes, offer: Offer) -> Result<(), DropReason> {
        let layout = self.fits(key, value)?;
        let hash = self.hash(key);
        if offer != Offer::Reinsert {
            if offer == Offer::New && !self.admits_new(hash) {
                return Err(DropReason::Admission);
            }
            if !self.rate.try_take(layout.total_len() as u64) {
                return Err(DropReason::RateLimit);
            }
        }
        let pages = (layout.total_len() / PAGE) as u32;
        let permit = self
            .budget
            .clone()
            .try_acquire_many_owned(pages)
            .map_err(|_| DropReason::Budget)?;
        self.start_write(hash, key, value, layout, permit);
        Ok(())
    }

    /// Whether a block offered with nothing known of its reuse may be written.
    fn admits_new(&self, hash: u64) -> bool {
        match self.cfg.admission {
            Admission::Always => true,
            Admission::SecondHit => {
                // Space never used yet costs nothing to fill.
                if self.alloc.lock().free.len() > reserve(self.cfg.regions) || self.ghost.take(hash)
                {
                    return true;
                }
                // Turned away: remembered for about as many offers as the store holds entries.
                self.ghost.remember(hash, self.index.len().max(64));
                false
            }
        }
    }

    /// Write `value`, waiting for room in the write buffer instead of dropping it, and past the
    /// admission filter and the rate limit: for what must not be lost, like the memory tier
    /// spilled at shutdown. Counted as dropped only if it cannot be written at all.
    pub(crate) async fn insert_waiting(
        self: &Arc<Self>,
        key: &[u8],
        value: Bytes,
    ) -> Result<(), DropReason> {
        let written = async {
            let layout = self.fits(key, &value)?;
            let pages = (layout.total_len() / PAGE) as u32;
            let permit = self
                .budget
                .clone()
                .acquire_many_owned(pages)
                .await
                .map_err(|_| DropReason::Closed)?;
            self.start_write(self.hash(key), key, &value, layout, permit);
            Ok(())
        }
        .await;
        if let Err(reason) = written {
            self.counters.dropped(reason);
        }
        written
    }

    /// The bytes of an entry, `total` long. In a reused buffer: `encode_entry` writes every
    /// byte, padding included. Sealing a large block is milliseconds of AES (an 8 MiB block at
    /// 4.6 GB/s: 1.8 ms), so it runs on a blocking thread, not on a worker that serves hits
    /// meanwhile; the write budget bounds how many run at once. A small one is sealed in place:
    /// the hop to another thread would cost more than the cipher.
    async fn encode(&self, epoch: u64, key: &Bytes, value: &Bytes, total: usize) -> AlignedBuf {
        let mut buf = AlignedBuf::reused(total);
        match &self.cfg.sealing {
            Some(device) if value.len() > SEAL_INLINE => {
                let (device, key, value) = (device.clone(), key.clone(), value.clone());
                let sealed = tokio::task::spawn_blocking(move || {
                    format::encode_entry(buf.as_mut_slice(), epoch, &key, &value, Some(&device));
                    buf
                });
                sealed.await.expect("sealing an entry does not panic")
            }
            sealing => {
                let sealing = sealing.as_deref();
                format::encode_entry(buf.as_mut_slice(), epoch, key, value, sealing);
                buf
            }
        }
    }

    /// The entry's layout, if the store is open and the entry is one it can hold.
    fn fits(&self, key: &[u8], value: &Bytes) -> Result<EntryLayout, DropReason> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(DropReason::Closed);
        }
        let layout = EntryLayout::new(key.len(), value.len(), self.cfg.sealing.is_some());
        if key.len() > MAX_KEY_LEN
            || value.len() as u64 > self.cfg.max_entry
            || layout.total_len() as u64 > self.max_total()
        {
            return Err(DropReason::TooLarge);
        }
        Ok(layout)
    }

    /// Make an admitted entry readable at once and write it in the background.
    fn start_write(
        self: &Arc<Self>,
        hash: u64,
        key: &[u8],
        value: &Bytes,
        layout: EntryLayout,
        permit: OwnedSemaphorePermit,
    ) {
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        let key = Bytes::copy_from_slice(key);
        self.inflight.lock().insert(
            hash,
            Pending {
                key: key.clone(),
                value: value.clone(),
                ticket,
            },
        );
        let store = self.clone();
        let value = value.clone();
        self.writing.fetch_add(1, Ordering::AcqRel);
        tokio::spawn(async move {
            store
                .clone()
                .write(hash, key, value, ticket, layout, permit)
                .await;
            if store.writing.fetch_sub(1, Ordering::AcqRel) == 1 {
                store.idle.notify_waiters();
            }
        });
    }

    async fn write(
        self: Arc<Self>,
        hash: u64,
        key: Bytes,
        value: Bytes,
        ticket: u64,
        layout: EntryLayout,
        _permit: OwnedSemaphorePermit,
    ) {
        let total = layout.total_len() as u64;
        let Some((addr, epoch, header)) = self.allocate(total).await else {
            self.forget(hash, ticket);
            self.counters.dropped(DropReason::Closed);
            return;
        };
        let header_ok = *header
            .get_or_init(|| async {
                let h = RegionHeader {
                    generation: self.cfg.generation,
                    epoch,
                    summary_offset: 0,
                    summary_entries: 0,
                    summary_crc: 0,
                };
                self.write_page_buf(self.region_offset(addr.region), &h.encode())
                    .await
                    .is_ok()
            })
            .await;
        let written = if header_ok {
            let buf = self.encode(epoch, &key, &value, total as usize).await;
            self.io.write(self.entry_offset(addr), buf).await
        } else {
            Err(std::io::Error::other("region header write failed"))
        };
        let record = match written {
            Ok(()) => {
                self.counters.written(total);
                self.publish(hash, ticket, addr)
            }
            Err(e) => {
                tracing::warn!(error = %e, partition = %self.cfg.name, "disk write failed");
                self.forget(hash, ticket);
                self.counters.dropped(DropReason::IoError);
                None
            }
        };
        self.finish_write(addr.region, record).await;
    }

    /// Make a finished write visible, unless it was removed or replaced while in flight.
    fn publish(&self, hash: u64, ticket: u64, addr: Addr) -> Option<SummaryRecord> {
        let mut inflight = self.inflight.lock();
        if inflight.get(&hash).map(|p| p.ticket) != Some(ticket) {
            self.counters.dropped(DropReason::Superseded);
            return None;
        }
        // Index first, then leave the in-flight table, so a reader always finds one of them.
        self.index_insert(hash, addr);
        inflight.remove(&hash);
        Some(SummaryRecord {
            hash,
            page: addr.page,
            pages: addr.pages,
        })
    }

    fn forget(&self, hash: u64, ticket: u64) {
        let mut inflight = self.inflight.lock();
        if inflight.get(&hash).map(|p| p.ticket) == Some(ticket) {
            inflight.remove(&hash);
        }
    }

    /// Room for `total` bytes in the open region, opening a new one (and waiting for reclaim to
    /// free one) when it is full. `None` once the store is closed.
    async fn allocate(&self, total: u64) -> Option<(Addr, u64, Arc<OnceCell<bool>>)> {
        loop {
            let freed = self.region_freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let mut seal = None;
            {
                let mut a = self.alloc.lock();
                if let Some(r) = a.active {
                    let open = a.open.get_mut(&r)?;
                    let summary = format::summary_len(open.records.len() + open.pending + 1);
                    if open.write_pos + total + summary <= self.cfg.region_size {
                        let addr = Addr {
                            region: r,
                            page: (open.write_pos / PAGE as u64) as u32,
                            pages: (total / PAGE as u64) as u32,
                        };
                        open.write_pos += total;
                        open.pending += 1;
                        return Some((addr, open.epoch, open.header.clone()));
                    }
                    open.full = true;
                    if open.pending == 0 {
                        seal = Some(r);
                    }
                    a.active = None;
                }
                if seal.is_none() {
                    if let Some(ready) = a.free.pop_front() {
                        self.evict(&ready);
                        let r = ready.region;
                        let epoch = a.next_epoch;
                        a.next_epoch += 1;
                        self.regions[r as usize]
                            .epoch
                            .store(epoch, Ordering::Release);
                        a.open.insert(
                            r,
                            OpenRegion {
                                epoch,
                                write_pos: PAGE as u64,
                                records: Vec::new(),
                                pending: 0,
                                full: false,
                                header: Arc::new(OnceCell::new()),
                            },
                        );
                        a.active = Some(r);
                        if a.free.len() < reserve(self.cfg.regions) {
                            self.reclaim_wanted.notify_one();
                        }
                        continue;
                    }
                }
            }
            if let Some(r) = seal {
                self.seal(r).await;
                continue;
            }
            if self.closed.load(Ordering::Relaxed) {
                return None;
            }
            self.reclaim_wanted.notify_one();
            freed.await;
        }
    }

    async fn finish_write(&self, region: u32, record: Option<SummaryRecord>) {
        let seal = {
            let mut a = self.alloc.lock();
            let Some(open) = a.open.get_mut(&region) else {
                return;
            };
            open.pending -= 1;
            if let Some(rec) = record {
                open.records.push(rec);
            }
            open.full && open.pending == 0
        };
        if seal {
            self.seal(region).await;
        }
    }

    /// Write the summary and the final header of a full region, then hand it to the FIFO.
    async fn seal(&self, region: u32) {
        let Some(open) = self.alloc.lock().open.remove(&region) else {
            return;
        };
        let (summary, crc) = format::encode_summary(&open.records);
        let header = RegionHeader {
            generation: self.cfg.generation,
            epoch: open.epoch,
            summary_offset: open.write_pos as u32,
            summary_entries: open.records.len() as u32,
            summary_crc: crc,
        };
        let base = self.region_offset(region);
        // A region whose header never landed has nothing recoverable; it still goes to the FIFO
        // so its index records age out normally.
        if open.header.get() == Some(&true)
            && self
                .write_page_buf(base + open.write_pos, &summary)
                .await
                .is_ok()
        {
            let _ = self.write_page_buf(base, &header.encode()).await;
        }
        let mut a = self.alloc.lock();
        a.fifo.push_back(region);
        if a.free.len() < reserve(self.cfg.regions) {
            self.reclaim_wanted.notify_one();
        }
    }

    pub(crate) async fn write_page_buf(&self, offset: u64, bytes: &[u8]) -> std::io::Result<()> {
        let mut buf = AlignedBuf::zeroed(bytes.len());
        buf.as_mut_slice().copy_from_slice(bytes);
        self.io.write(offset, buf).await
    }

    /// Drop `key` from the in-flight table and the index. Keys name immutable values, so a
    /// removal is not persisted: after a restart the entry may be found again, with its bytes.
    pub(crate) fn remove(&self, key: &[u8]) {
        let hash = self.hash(key);
        self.inflight.lock().remove(&hash);
        if let Some(old) = self.index.remove(hash) {
            self.dead(old);
        }
    }

    /// Point `hash` at `addr`, moving the live-bytes count from the entry it replaces.
    pub(crate) fn index_insert(&self, hash: u64, addr: Addr) {
        if let Some(old) = self.index.insert(hash, addr) {
            self.dead(old);
        }
        self.regions[addr.region as usize]
            .live
            .fetch_add(addr.pages as u64 * PAGE as u64, Ordering::Relaxed);
    }

    /// `addr`'s bytes no longer count as live in its region.
    fn dead(&self, addr: Addr) {
        self.regions[addr.region as usize]
            .live
            .fetch_sub(addr.pages as u64 * PAGE as u64, Ordering::Relaxed);
    }

    /// Wait until every accepted write has finished. Does not hold back new writes (taking the
    /// whole budget would make every concurrent insert fail).
    pub(crate) async fn drain(&self) {
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.writing.load(Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }

    /// Seal the open region (after `drain`), so the next start reads its summary instead of
    /// scanning it entry by entry.
    pub(crate) async fn seal_active(&self) {
        let region = {
            let mut a = self.alloc.lock();
            let Some(r) = a.active.take() else {
                return;
            };
            match a.open.get_mut(&r) {
                Some(open) if open.pending == 0 => Some(r),
                Some(open) => {
                    // Still being written: the last writer seals it.
                    open.full = true;
                    None
                }
                None => None,
            }
        };
        if let Some(r) = region {
            self.seal(r).await;
        }
    }

    pub(crate) fn wake(&self) {
        self.region_freed.notify_waiters();
        self.reclaim_wanted.notify_one();
    }

    pub(crate) fn inflight_len(&self) -> usize {
        self.inflight.lock().len()
    }
}
