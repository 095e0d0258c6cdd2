//! Eviction: a background task keeps regions ready ahead of the writers by reclaiming whole
//! regions in FIFO order (preferring a much emptier one among the oldest few), reinserting
//! entries read since they were written (up to half a region's worth), each re-insert spending
//! one of the entry's counted reads (S3-FIFO's main queue, with its 2-bit frequency). A ready
//! region's entries stay indexed and readable until a writer opens it ([`Store::evict`]), so
//! the regions kept ready cost no capacity: on a small disk (a few dozen regions) two empty
//! ones would be several percent of it.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::disk::admission::Offer;
use crate::disk::format::{self, RegionHeader, SummaryRecord, PAGE};
use crate::disk::index::Addr;
use crate::disk::io::Priority;

use super::{reserve, Ready, Stale, Store};

impl Store {
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

    /// The oldest sealed region, unless one of the next few is much emptier (overwrites and
    /// removals left it a quarter less live or more): reclaiming that frees more for the same
    /// copying. FIFO order otherwise, and the oldest is passed over at most `WINDOW` times in a
    /// row: once, a region fuller than the three behind it (smaller entries pack tighter) was
    /// never reclaimed, and what it held never left the cache.
    fn pick_victim(&self) -> Option<u32> {
        const WINDOW: usize = 4;
        let mut a = self.alloc.lock();
        let live = |r: u32| self.regions[r as usize].live.load(Ordering::Relaxed);
        let oldest = live(*a.fifo.front()?);
        let (pos, least) = a
            .fifo
            .iter()
            .take(WINDOW)
            .map(|r| live(*r))
            .enumerate()
            .min_by_key(|(_, l)| *l)?;
        let pos = if pos > 0 && least < oldest - oldest / 4 && a.passed_over < WINDOW {
            a.passed_over += 1;
            pos
        } else {
            a.passed_over = 0;
            0
        };
        a.fifo.remove(pos)
    }

    /// Ready `region` for reuse: re-insert entries with reads counted (up to half a region's
    /// worth, so reclaim always frees space) and hand it to the writers with the records of what
    /// it still holds, which stays readable until [`evict`](Self::evict) drops it.
    pub(crate) async fn reclaim(self: &Arc<Self>, region: u32) {
        let epoch = self.regions[region as usize].epoch.load(Ordering::Acquire);
        let stale = match self.read_summary(region, epoch).await {
            Some(records) => {
                let mut reinsert_budget = self.cfg.region_size / 2;
                for rec in &records {
                    let addr = Addr::of(region, rec);
                    let bytes = rec.pages as u64 * PAGE as u64;
                    if bytes <= reinsert_budget && self.index.spend_read(rec.hash, addr) {
                        reinsert_budget -= bytes;
                        self.reinsert(addr, epoch).await;
                    }
                }
                Stale::Records(records)
            }
            // No readable summary: the index is swept instead (slow, rare).
            None => Stale::Unknown,
        };
        self.alloc.lock().free.push_back(Ready { region, stale });
        self.region_freed.notify_waiters();
    }

    /// Drop from the index what a ready region still holds, just before it is opened for
    /// writing. Called under the allocation lock, before the region's epoch changes: a reader
    /// that found an entry here earlier sees the epoch change and reads a miss.
    pub(crate) fn evict(&self, ready: &Ready) {
        let region = ready.region;
        let evicted = match &ready.stale {
            Stale::Nothing => return,
            Stale::Records(records) => records
                .iter()
                .filter(|rec| self.index.remove_if(rec.hash, Addr::of(region, rec)))
                .count(),
            Stale::Unknown => self.index.remove_region(region),
        };
        self.regions[region as usize]
            .live
            .store(0, Ordering::Relaxed);
        self.counters.reclaimed(evicted as u64);
    }

    /// Reclaim the oldest sealed region and drop what it holds at once, as if a writer had
    /// opened it. For tests.
    pub(crate) async fn reclaim_now(self: &Arc<Self>) -> bool {
        let Some(region) = self.alloc.lock().fifo.pop_front() else {
            return false;
        };
        self.reclaim(region).await;
        let mut a = self.alloc.lock();
        if let Some(ready) = a.free.iter_mut().find(|r| r.region == region) {
            self.evict(ready);
            ready.stale = Stale::Nothing;
        }
        true
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
        if self.insert(&key, value, Offer::Reinsert).is_ok() {
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
}
