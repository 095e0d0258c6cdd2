//! Lookups: the index record, one read of the entry (whole or the 64 KiB chunks a range
//! touches), every chunk verified, and the region's epoch checked after the read, so bytes of a
//! region reclaimed meanwhile are never served.

use std::ops::Range;
use std::sync::atomic::Ordering;

use bytes::Bytes;

use crate::disk::format::{self, EntryHeader, CHUNK, PAGE};
use crate::disk::index::Addr;
use crate::disk::io::Priority;

use super::{hash_key, ReadEntry, Store};

impl Store {
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

    pub(super) async fn read_entry(
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
        // The value starts right after the header, not on a page: read the pages around the
        // chunks (never past the entry, whose length is padded to a page).
        let from = header.layout.header_len as u64 + data_from;
        let page_from = from / PAGE as u64 * PAGE as u64;
        let skip = (from - page_from) as usize;
        let read_len = format::round_up(skip as u64 + data_to - data_from, PAGE as u64) as usize;
        let data = self
            .io
            .read(base + page_from, read_len, Priority::Demand)
            .await
            .map_err(|_| Fault::Io)?;
        self.check_epoch(addr, epoch)?;
        let span = (data_to - data_from) as usize;
        if !header.verify(
            hbuf.as_slice(),
            first_chunk as usize,
            &data.as_slice()[skip..skip + span],
        ) {
            return Err(Fault::Corrupt);
        }
        Ok(data.freeze(
            skip + (start - data_from) as usize,
            skip + (end - data_from) as usize,
        ))
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
pub(super) enum Fault {
    /// Checksums or headers do not verify.
    Corrupt,
    /// The region was reclaimed while the read ran.
    Raced,
    /// Another key with the same 64-bit hash.
    Collision,
    /// The device returned an error.
    Io,
}
