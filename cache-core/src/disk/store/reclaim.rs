//! Eviction: a background task keeps free regions ahead of the writers by reclaiming whole
//! regions in FIFO order (preferring a mostly-dead one among the oldest few), reinserting
//! entries that were hit (up to half a region's worth).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::disk::format::{self, RegionHeader, SummaryRecord, PAGE};
use crate::disk::index::Addr;
use crate::disk::io::Priority;

use super::{reserve, Store};

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
}
