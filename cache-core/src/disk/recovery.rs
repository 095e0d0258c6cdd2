//! Rebuilding a store's index at start: one header page per region, the summary of every sealed
//! region, and a scan of entry headers only in regions that were open at the crash.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::stream::{self, StreamExt};

use super::format::{self, EntryHeader, FormatError, RegionHeader, SummaryRecord, PAGE};
use super::index::Addr;
use super::io::Priority;
use super::store::{Ready, Store};

/// What recovery found in one store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Recovered {
    pub(crate) regions: u64,
    pub(crate) entries: u64,
    /// Regions that were open at the crash and were scanned entry by entry.
    pub(crate) scanned: u64,
    /// Region headers or summaries that failed their checksum.
    pub(crate) damaged: u64,
}

enum RegionState {
    Free,
    Used {
        epoch: u64,
        records: Vec<SummaryRecord>,
        scanned: bool,
    },
    Damaged,
}

/// Regions read at once during recovery.
const PARALLEL: usize = 32;

pub(crate) async fn recover(store: &Arc<Store>) -> Recovered {
    let n = store.cfg.regions;
    let states: Vec<(u32, RegionState)> = stream::iter(0..n)
        .map(|r| {
            let store = store.clone();
            async move { (r, read_region(&store, r).await) }
        })
        .buffer_unordered(PARALLEL)
        .collect()
        .await;
    let mut used: Vec<(u64, u32, Vec<SummaryRecord>)> = Vec::new();
    let mut report = Recovered::default();
    let mut free = Vec::new();
    for (r, state) in states {
        match state {
            RegionState::Used {
                epoch,
                records,
                scanned,
            } => {
                report.scanned += u64::from(scanned);
                used.push((epoch, r, records));
            }
            RegionState::Damaged => {
                report.damaged += 1;
                free.push(r);
            }
            RegionState::Free => free.push(r),
        }
    }
    // Oldest first: a key found in two regions keeps its newest copy.
    used.sort_by_key(|(epoch, _, _)| *epoch);
    let mut alloc = store.alloc.lock();
    for (epoch, r, records) in &used {
        store.regions[*r as usize]
            .epoch
            .store(*epoch, Ordering::Release);
        for rec in records {
            let addr = Addr::of(*r, rec);
            store.index_insert(rec.hash, addr);
        }
        alloc.fifo.push_back(*r);
        alloc.next_epoch = alloc.next_epoch.max(epoch + 1);
    }
    free.sort_unstable();
    alloc.free.extend(free.into_iter().map(Ready::empty));
    report.regions = used.len() as u64;
    report.entries = store.index.len() as u64;
    report
}

async fn read_region(store: &Store, region: u32) -> RegionState {
    let base = store.cfg.base + region as u64 * store.cfg.region_size;
    let Ok(page) = store.io.read(base, PAGE, Priority::Background).await else {
        return RegionState::Damaged;
    };
    let header = match RegionHeader::decode(page.as_slice()) {
        Ok(h) if h.generation == store.cfg.generation && h.epoch != 0 => h,
        Ok(_) | Err(FormatError::Magic) => return RegionState::Free,
        Err(_) => return RegionState::Damaged,
    };
    if header.summary_offset != 0 {
        let len = format::summary_len(header.summary_entries as usize) as usize;
        let Ok(buf) = store
            .io
            .read(
                base + header.summary_offset as u64,
                len,
                Priority::Background,
            )
            .await
        else {
            return RegionState::Damaged;
        };
        return match format::decode_summary(
            buf.as_slice(),
            header.summary_entries,
            header.summary_crc,
        ) {
            Ok(records) => RegionState::Used {
                epoch: header.epoch,
                records,
                scanned: false,
            },
            Err(_) => RegionState::Damaged,
        };
    }
    let (records, end) = scan(store, base, header.epoch).await;
    // Seal what the scan found, so the region is immutable from here on and the next start
    // reads one summary instead of scanning again. The allocator always left room for it.
    let (summary, crc) = format::encode_summary(&records);
    if end + summary.len() as u64 <= store.cfg.region_size {
        let sealed = RegionHeader {
            summary_offset: end as u32,
            summary_entries: records.len() as u32,
            summary_crc: crc,
            ..header
        };
        if store.write_page_buf(base + end, &summary).await.is_ok() {
            let _ = store.write_page_buf(base, &sealed.encode()).await;
        }
    }
    RegionState::Used {
        epoch: header.epoch,
        records,
        scanned: true,
    }
}

/// Entry headers of an open region in order, up to the first that is missing, torn or from an
/// earlier use of the region. Values are not read: a torn value fails its checksum when read.
async fn scan(store: &Store, base: u64, epoch: u64) -> (Vec<SummaryRecord>, u64) {
    let mut records = Vec::new();
    let mut pos = PAGE as u64;
    while pos + PAGE as u64 <= store.cfg.region_size {
        let Ok(first) = store.io.read(base + pos, PAGE, Priority::Background).await else {
            break;
        };
        let Ok(header_len) = EntryHeader::peek_len(first.as_slice()) else {
            break;
        };
        let buf = if header_len > PAGE {
            match store
                .io
                .read(base + pos, header_len, Priority::Background)
                .await
            {
                Ok(b) => b,
                Err(_) => break,
            }
        } else {
            first
        };
        let Ok(header) = EntryHeader::decode(buf.as_slice(), store.cfg.sealing.as_deref()) else {
            break;
        };
        let total = header.layout.total_len() as u64;
        if header.epoch != epoch || pos + total > store.cfg.region_size {
            break;
        }
        records.push(SummaryRecord {
            hash: store.hash(header.key(buf.as_slice())),
            page: (pos / PAGE as u64) as u32,
            pages: (total / PAGE as u64) as u32,
        });
        pos += total;
    }
    (records, pos)
}
