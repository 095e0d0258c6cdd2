//! One partition's store: its regions, index, write path, reads and reclaim.
//!
//! Regions are filled append-only, one at a time, and evicted whole in FIFO order (preferring a
//! mostly-dead region among the oldest few). A region's life: free → open (appending; its header
//! names a fresh epoch) → sealed (summary and header written) → reclaimed (index records removed,
//! epoch cleared) → free. Readers never take a lock across I/O: they note the region's epoch when
//! they look the entry up and check it again after the read, and reclaim clears the epoch only
//! after removing the region's index records, so bytes from a reused region are never served.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::{Notify, OnceCell, OwnedSemaphorePermit, Semaphore};

use super::admission::{Admission, Doorkeeper, RateLimit};
use super::format::{
    self, EntryHeader, EntryLayout, RegionHeader, SummaryRecord, CHUNK, MAX_KEY_LEN, PAGE,
};
use super::index::{Addr, Index};
use super::io::{AlignedBuf, IoEngine, Priority};
use super::stats::{Counters, DropReason};

/// Hash of a key, stable across builds and restarts (it is persisted in region summaries).
pub(crate) fn hash_key(key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key)
}

pub(crate) struct RegionSlot {
    /// Epoch of the data the region holds, 0 while free. Readers compare it before and after.
    pub(crate) epoch: AtomicU64,
    /// Bytes of indexed entries in the region, to prefer mostly-dead victims.
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
    pub(crate) free: VecDeque<u32>,
    pub(crate) next_epoch: u64,
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
    doorkeeper: Doorkeeper,
    pub(crate) counters: Counters,
    next_ticket: AtomicU64,
    region_freed: Notify,
    /// Writes accepted and not finished, and a wake-up for `drain` when it reaches 0.
    writing: AtomicU64,
    idle: Notify,
    reclaim_wanted: Notify,
    pub(crate) closed: AtomicBool,
}

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
            doorkeeper: Doorkeeper::new(1 << 16),
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

    pub(crate) fn contains(&self, key: &[u8]) -> bool {
        let hash = hash_key(key);
        self.inflight.lock().contains_key(&hash) || self.index.contains(hash)
    }

    /// Offer `value` for a disk write. Never waits: either the entry is accepted (readable at once,
    /// written in the background) or it is dropped and counted under the reason returned.
    pub(crate) fn insert(
        self: &Arc<Self>,
        key: &[u8],
        value: Bytes,
        reinsert: bool,
    ) -> Result<(), DropReason> {
        let r = self.admit(key, &value, reinsert);
        if let Err(reason) = r {
            self.counters.dropped(reason);
        }
        r
    }

    fn admit(
        self: &Arc<Self>,
        key: &[u8],
        value: &Bytes,
        reinsert: bool,
    ) -> Result<(), DropReason> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(DropReason::Closed);
        }
        let layout = EntryLayout::new(key.len(), value.len());
        if key.len() > MAX_KEY_LEN
            || value.len() as u64 > self.cfg.max_entry
            || layout.total_len() as u64 > self.max_total()
        {
            return Err(DropReason::TooLarge);
        }
        let hash = hash_key(key);
        if !reinsert {
            if self.cfg.admission == Admission::SecondHit && !self.doorkeeper.seen_before(hash) {
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
        Ok(())
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
            let mut buf = AlignedBuf::zeroed(total as usize);
            format::encode_entry(buf.as_mut_slice(), epoch, &key, &value);
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
                    if let Some(r) = a.free.pop_front() {
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

    /// The whole value of `key`, from the in-flight table or the device.
    pub(crate) async fn get(&self, key: &[u8]) -> Option<Bytes> {
        self.get_with(key, None).await
    }

    /// Bytes `range` of the value of `key` (clamped to its length), reading and verifying only
    /// the 64 KiB chunks the range touches.
    pub(crate) async fn get_range(&self, key: &[u8], range: Range<u64>) -> Option<Bytes> {
        self.get_with(key, Some(range)).await
    }

    async fn get_with(&self, key: &[u8], range: Option<Range<u64>>) -> Option<Bytes> {
        let hash = hash_key(key);
        // A read that loses a race with reclaim looks once more: reclaim may have just copied
        // the entry forward (it is then in flight or at its new address).
        for attempt in 0..2 {
            if let Some(value) = self.inflight_value(hash, key) {
                self.counters.hit(value.len() as u64, true);
                return Some(clamp(value, range));
            }
            let Some((addr, epoch)) = self.index.lookup(hash, |a| {
                self.regions[a.region as usize]
                    .epoch
                    .load(Ordering::Acquire)
            }) else {
                self.counters.miss();
                return None;
            };
            let got = match &range {
                None => self.read_whole(addr, epoch, key, Priority::Demand).await,
                Some(range) => self.read_range(addr, epoch, key, range.clone()).await,
            };
            match got {
                Ok(bytes) => {
                    self.counters.hit(bytes.len() as u64, false);
                    return Some(bytes);
                }
                Err(Fault::Raced) if attempt == 0 => self.counters.raced(),
                Err(fault) => {
                    self.fault(hash, addr, fault);
                    return None;
                }
            }
        }
        None
    }

    fn inflight_value(&self, hash: u64, key: &[u8]) -> Option<Bytes> {
        let inflight = self.inflight.lock();
        let p = inflight.get(&hash)?;
        (p.key.as_ref() == key).then(|| p.value.clone())
    }

    fn fault(&self, hash: u64, addr: Addr, fault: Fault) {
        self.counters.miss();
        match fault {
            Fault::Corrupt => {
                self.counters.corrupt();
                // Drop the record so the next read refetches instead of failing again.
                if self.index.remove_if(hash, addr).is_some() {
                    self.dead(addr);
                }
            }
            Fault::Raced => self.counters.raced(),
            Fault::Collision => self.counters.collision(),
            Fault::Io => self.counters.io_error(),
        }
    }

    fn check_epoch(&self, addr: Addr, epoch: u64) -> Result<(), Fault> {
        if epoch != 0
            && self.regions[addr.region as usize]
                .epoch
                .load(Ordering::Acquire)
                == epoch
        {
            Ok(())
        } else {
            Err(Fault::Raced)
        }
    }

    async fn read_entry(
        &self,
        addr: Addr,
        epoch: u64,
        key: Option<&[u8]>,
        priority: Priority,
    ) -> Result<ReadEntry, Fault> {
        let len = addr.pages as usize * PAGE;
        let buf = self
            .io
            .read(self.entry_offset(addr), len, priority)
            .await
            .map_err(|_| Fault::Io)?;
        self.check_epoch(addr, epoch)?;
        let header = EntryHeader::decode(buf.as_slice()).map_err(|_| Fault::Corrupt)?;
        if header.epoch != epoch || header.layout.total_len() != len {
            return Err(Fault::Corrupt);
        }
        if key.is_some_and(|k| header.key(buf.as_slice()) != k) {
            return Err(Fault::Collision);
        }
        let data = &buf.as_slice()[header.layout.header_len..][..header.layout.value_len];
        if !header.verify(buf.as_slice(), 0, data) {
            return Err(Fault::Corrupt);
        }
        Ok(ReadEntry { header, buf })
    }

    async fn read_whole(
        &self,
        addr: Addr,
        epoch: u64,
        key: &[u8],
        priority: Priority,
    ) -> Result<Bytes, Fault> {
        let e = self.read_entry(addr, epoch, Some(key), priority).await?;
        let at = e.header.layout.header_len;
        Ok(e.buf.freeze(at, at + e.header.layout.value_len))
    }

    async fn read_range(
        &self,
        addr: Addr,
        epoch: u64,
        key: &[u8],
        range: Range<u64>,
    ) -> Result<Bytes, Fault> {
        let base = self.entry_offset(addr);
        let first = self
            .io
            .read(base, PAGE, Priority::Demand)
            .await
            .map_err(|_| Fault::Io)?;
        let header_len = EntryHeader::peek_len(first.as_slice()).map_err(|_| Fault::Corrupt)?;
        let hbuf = if header_len > PAGE {
            self.io
                .read(base, header_len, Priority::Demand)
                .await
                .map_err(|_| Fault::Io)?
        } else {
            first
        };
        let header = EntryHeader::decode(hbuf.as_slice()).map_err(|_| Fault::Corrupt)?;
        if header.epoch != epoch || header.layout.total_len() != addr.pages as usize * PAGE {
            return Err(Fault::Corrupt);
        }
        if header.key(hbuf.as_slice()) != key {
            return Err(Fault::Collision);
        }
        let value_len = header.layout.value_len as u64;
        let (start, end) = (range.start.min(value_len), range.end.min(value_len));
        if start >= end {
            self.check_epoch(addr, epoch)?;
            return Ok(Bytes::new());
        }
        let chunk = CHUNK as u64;
        let first_chunk = start / chunk;
        let data_from = first_chunk * chunk;
        let data_to = (end.div_ceil(chunk) * chunk).min(value_len);
        let read_len = format::round_up(data_to - data_from, PAGE as u64) as usize;
        let data = self
            .io
            .read(
                header_len as u64 + base + data_from,
                read_len,
                Priority::Demand,
            )
            .await
            .map_err(|_| Fault::Io)?;
        self.check_epoch(addr, epoch)?;
        let span = (data_to - data_from) as usize;
        if !header.verify(
            hbuf.as_slice(),
            first_chunk as usize,
            &data.as_slice()[..span],
        ) {
            return Err(Fault::Corrupt);
        }
        Ok(data.freeze((start - data_from) as usize, (end - data_from) as usize))
    }

    /// Drop `key` from the in-flight table and the index. Keys name immutable values, so a
    /// removal is not persisted: after a restart the entry may be found again, with its bytes.
    pub(crate) fn remove(&self, key: &[u8]) {
        let hash = hash_key(key);
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

    /// Reclaim regions until `reserve` are free; runs until the store closes.
    pub(crate) async fn reclaimer(self: Arc<Self>) {
        loop {
            let wanted = self.reclaim_wanted.notified();
            tokio::pin!(wanted);
            wanted.as_mut().enable();
            while self.alloc.lock().free.len() < reserve(self.cfg.regions) {
                let Some(victim) = self.pick_victim() else {
                    break;
                };
                self.reclaim(victim).await;
            }
            if self.closed.load(Ordering::Relaxed) {
                return;
            }
            wanted.await;
        }
    }

    /// Among the oldest few sealed regions, the one with the fewest live bytes: FIFO order keeps
    /// eviction fair; the small window lets a region emptied by overwrites go first.
    fn pick_victim(&self) -> Option<u32> {
        const WINDOW: usize = 4;
        let mut a = self.alloc.lock();
        let (pos, _) = a
            .fifo
            .iter()
            .take(WINDOW)
            .enumerate()
            .min_by_key(|(_, r)| self.regions[**r as usize].live.load(Ordering::Relaxed))?;
        a.fifo.remove(pos)
    }

    /// Free `region`: re-insert entries that were hit (up to half a region's worth, so reclaim
    /// always frees space), drop the rest from the index, clear the epoch, hand it back.
    pub(crate) async fn reclaim(self: &Arc<Self>, region: u32) {
        let epoch = self.regions[region as usize].epoch.load(Ordering::Acquire);
        let records = self.read_summary(region, epoch).await;
        let mut reinsert_budget = self.cfg.region_size / 2;
        let mut evicted = 0u64;
        match &records {
            Some(records) => {
                for rec in records {
                    let addr = Addr {
                        region,
                        page: rec.page,
                        pages: rec.pages,
                    };
                    let bytes = rec.pages as u64 * PAGE as u64;
                    if bytes <= reinsert_budget && self.index.was_hit(rec.hash, addr) {
                        reinsert_budget -= bytes;
                        self.reinsert(addr, epoch).await;
                    }
                    if self.index.remove_if(rec.hash, addr).is_some() {
                        evicted += 1;
                    }
                }
            }
            // No readable summary: sweep the index instead (slow, rare).
            None => evicted = self.index.remove_region(region) as u64,
        }
        self.regions[region as usize]
            .epoch
            .store(0, Ordering::Release);
        self.regions[region as usize]
            .live
            .store(0, Ordering::Relaxed);
        self.counters.reclaimed(evicted);
        self.alloc.lock().free.push_back(region);
        self.region_freed.notify_waiters();
    }

    async fn reinsert(self: &Arc<Self>, addr: Addr, epoch: u64) {
        let Ok(e) = self
            .read_entry(addr, epoch, None, Priority::Background)
            .await
        else {
            return;
        };
        let key = e.header.key(e.buf.as_slice()).to_vec();
        let at = e.header.layout.header_len;
        let value_len = e.header.layout.value_len;
        let value = e.buf.freeze(at, at + value_len);
        if self.insert(&key, value, true).is_ok() {
            self.counters.reinserted();
        }
    }

    /// The summary of `region` as sealed in `epoch`; `None` if what is on disk is anything else
    /// (never sealed, or a header of an earlier use whose rewrite failed).
    async fn read_summary(&self, region: u32, epoch: u64) -> Option<Vec<SummaryRecord>> {
        let base = self.region_offset(region);
        let page = self.io.read(base, PAGE, Priority::Background).await.ok()?;
        let h = RegionHeader::decode(page.as_slice()).ok()?;
        if h.summary_offset == 0 || h.generation != self.cfg.generation || h.epoch != epoch {
            return None;
        }
        let len = format::summary_len(h.summary_entries as usize) as usize;
        let buf = self
            .io
            .read(base + h.summary_offset as u64, len, Priority::Background)
            .await
            .ok()?;
        format::decode_summary(buf.as_slice(), h.summary_entries, h.summary_crc).ok()
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

fn clamp(value: Bytes, range: Option<Range<u64>>) -> Bytes {
    match range {
        None => value,
        Some(r) => {
            let len = value.len() as u64;
            let (s, e) = (r.start.min(len), r.end.min(len));
            value.slice(s as usize..e.max(s) as usize)
        }
    }
}

/// Why a lookup found an index record but served nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Checksums or headers do not verify.
    Corrupt,
    /// The region was reclaimed while the read ran.
    Raced,
    /// Another key with the same 64-bit hash.
    Collision,
    /// The device returned an error.
    Io,
}
