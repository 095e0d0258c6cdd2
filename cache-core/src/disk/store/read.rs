//! Lookups: the index record, then the entry read whole, or the 64 KiB chunks a range touches,
//! or as a stream of pieces; every chunk verified, and the region's epoch checked after each
//! read, so bytes of a region reclaimed meanwhile are never served.

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::{self, BoxStream, Stream, StreamExt};

use crate::disk::format::{self, EntryHeader, CHUNK, PAGE};
use crate::disk::index::Addr;
use crate::disk::io::Priority;

use super::{ReadEntry, Store};

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
        let hash = self.hash(key);
        // A read that loses a race with reclaim looks once more: reclaim may have just copied
        // the entry forward (it is then in flight or at its new address).
        for attempt in 0..2 {
            if let Some(value) = self.inflight_value(hash, key) {
                self.counters.hit(value.len() as u64, true);
                return Some(clamp(value, range));
            }
            let (addr, epoch) = self.lookup(hash)?;
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

    /// Where the entry of `hash` is and its region's epoch now; a miss is counted.
    fn lookup(&self, hash: u64) -> Option<(Addr, u64)> {
        let found = self.index.lookup(hash, |a| {
            self.regions[a.region as usize]
                .epoch
                .load(Ordering::Acquire)
        });
        if found.is_none() {
            self.counters.miss();
        }
        found
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
                if self.index.remove_if(hash, addr) {
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
        let mut buf = self
            .io
            .read(self.entry_offset(addr), len, priority)
            .await
            .map_err(|_| Fault::Io)?;
        self.check_epoch(addr, epoch)?;
        let header = self.decode_header(buf.as_slice())?;
        if header.epoch != epoch || header.layout.total_len() != len {
            return Err(Fault::Corrupt);
        }
        if key.is_some_and(|k| header.key(buf.as_slice()) != k) {
            return Err(Fault::Collision);
        }
        let (head, rest) = buf.as_mut_slice().split_at_mut(header.layout.header_len);
        if !header.verify(head, 0, &mut rest[..header.layout.value_len]) {
            return Err(Fault::Corrupt);
        }
        Ok(ReadEntry { header, buf })
    }

    /// The entry header at the start of `b`, decoded and checked (and its key opened, if the
    /// store seals its entries).
    pub(super) fn decode_header(&self, b: &[u8]) -> Result<EntryHeader, Fault> {
        EntryHeader::decode(b, self.cfg.sealing.as_deref()).map_err(|_| Fault::Corrupt)
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
        let head = self.read_head(addr, epoch, key).await?;
        let value_len = head.header.layout.value_len as u64;
        let (start, end) = (range.start.min(value_len), range.end.min(value_len));
        if start >= end {
            self.check_epoch(addr, epoch)?;
            return Ok(Bytes::new());
        }
        self.read_span(addr, epoch, &head, start..end).await
    }

    /// Read and check the header of the entry at `addr`: its first page, and the rest of it
    /// if it is longer.
    async fn read_head(&self, addr: Addr, epoch: u64, key: &[u8]) -> Result<Head, Fault> {
        let base = self.entry_offset(addr);
        let first = self
            .io
            .read(base, PAGE, Priority::Demand)
            .await
            .map_err(|_| Fault::Io)?;
        let header_len = EntryHeader::peek_len(first.as_slice()).map_err(|_| Fault::Corrupt)?;
        let buf = if header_len > first.len() {
            self.io
                .read(base, header_len, Priority::Demand)
                .await
                .map_err(|_| Fault::Io)?
        } else {
            first
        };
        let header = self.decode_header(buf.as_slice())?;
        if header.epoch != epoch || header.layout.total_len() != addr.pages as usize * PAGE {
            return Err(Fault::Corrupt);
        }
        if header.key(buf.as_slice()) != key {
            return Err(Fault::Collision);
        }
        let len = buf.len();
        Ok(Head {
            header,
            buf: buf.freeze(0, len),
        })
    }

    /// Bytes `range` of the value whose checked header is `head` (the range within the value),
    /// reading and verifying the 64 KiB chunks it touches.
    async fn read_span(
        &self,
        addr: Addr,
        epoch: u64,
        head: &Head,
        range: Range<u64>,
    ) -> Result<Bytes, Fault> {
        let (start, end) = (range.start, range.end);
        let value_len = head.header.layout.value_len as u64;
        let chunk = CHUNK as u64;
        let first_chunk = start / chunk;
        let data_from = first_chunk * chunk;
        let data_to = (end.div_ceil(chunk) * chunk).min(value_len);
        // The value starts right after the header, not on a page: read the pages around the
        // chunks (never past the entry, whose length is padded to a page).
        let from = head.header.layout.header_len as u64 + data_from;
        let page_from = from / PAGE as u64 * PAGE as u64;
        let skip = (from - page_from) as usize;
        let read_len = format::round_up(skip as u64 + data_to - data_from, PAGE as u64) as usize;
        let mut data = self
            .io
            .read(
                self.entry_offset(addr) + page_from,
                read_len,
                Priority::Demand,
            )
            .await
            .map_err(|_| Fault::Io)?;
        self.check_epoch(addr, epoch)?;
        let span = (data_to - data_from) as usize;
        if !head.header.verify(
            &head.buf,
            first_chunk as usize,
            &mut data.as_mut_slice()[skip..skip + span],
        ) {
            return Err(Fault::Corrupt);
        }
        Ok(data.freeze(
            skip + (start - data_from) as usize,
            skip + (end - data_from) as usize,
        ))
    }
}

/// How many pieces of one streamed value are read at once: enough to keep an NVMe device's
/// queue busy for one reader (4 I/O threads by default), and a bound on the bytes read ahead of
/// the reader.
const STREAM_PARALLEL: usize = 4;
/// The first piece of a streamed value: small, so the first byte waits for 256 KiB, not the
/// block.
const STREAM_FIRST: u64 = 256 * 1024;
/// Later pieces: a quarter of the value (so a small one is still read in parallel), at most
/// 1 MiB (so a syscall's cost stays small beside its bytes).
const STREAM_PIECE: u64 = 1024 * 1024;

/// The pieces a value of `len` bytes is streamed in: whole chunks each, so each verifies alone.
fn stream_spans(len: u64) -> impl Iterator<Item = Range<u64>> {
    let chunk = CHUNK as u64;
    let piece = (len / STREAM_PARALLEL as u64)
        .div_ceil(chunk)
        .clamp(1, STREAM_PIECE / chunk)
        * chunk;
    let first = piece.min(STREAM_FIRST).min(len);
    std::iter::once(0..first).filter(|r| !r.is_empty()).chain(
        (first..len)
            .step_by(piece as usize)
            .map(move |from| from..(from + piece).min(len)),
    )
}

/// A value's header, checked: its chunk checks verify (and, sealed, its cipher opens) every
/// later read of the value.
struct Head {
    header: EntryHeader,
    buf: Bytes,
}

/// The value of one disk entry, read as a stream of verified pieces in order.
pub struct ValueStream {
    len: u64,
    pieces: BoxStream<'static, Result<Bytes, ReadFailed>>,
}

impl ValueStream {
    /// The value's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the value is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Stream for ValueStream {
    type Item = Result<Bytes, ReadFailed>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.pieces.as_mut().poll_next(cx)
    }
}

/// A streamed value stopped part-way: a piece failed its checksum, the region was reclaimed
/// while it was read, or the device failed. The entry is dropped (when corrupt) and counted;
/// the bytes already given were verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a disk read stopped part-way")]
pub struct ReadFailed;

/// The value of `key` as verified pieces, in order: its header is read first (a page), then
/// its pieces [`STREAM_PARALLEL`] reads at a time, so a reader's first byte waits for one small
/// piece rather than the whole value, and the device reads while the reader sends. `None` on a
/// miss or a fault in the header.
pub(crate) async fn stream(store: Arc<Store>, key: &[u8]) -> Option<ValueStream> {
    let hash = store.hash(key);
    if let Some(value) = store.inflight_value(hash, key) {
        store.counters.hit(value.len() as u64, true);
        return Some(ValueStream {
            len: value.len() as u64,
            pieces: stream::once(async { Ok(value) }).boxed(),
        });
    }
    let (addr, epoch) = store.lookup(hash)?;
    let head = match store.read_head(addr, epoch, key).await {
        Ok(head) => Arc::new(head),
        Err(fault) => {
            store.fault(hash, addr, fault);
            return None;
        }
    };
    let len = head.header.layout.value_len as u64;
    store.counters.hit(len, false);
    let pieces = stream::iter(stream_spans(len))
        .map(move |span| {
            let (store, head) = (store.clone(), head.clone());
            async move {
                store
                    .read_span(addr, epoch, &head, span)
                    .await
                    .map_err(|fault| {
                        store.fault(hash, addr, fault);
                        ReadFailed
                    })
            }
        })
        .buffered(STREAM_PARALLEL)
        // The first failure ends the stream: the pieces after it are of no use to a reader.
        .scan(false, |failed, piece| {
            let go_on = !*failed;
            *failed |= piece.is_err();
            std::future::ready(go_on.then_some(piece))
        });
    Some(ValueStream {
        len,
        pieces: pieces.boxed(),
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn lens(len: u64) -> Vec<u64> {
        let spans: Vec<_> = stream_spans(len).collect();
        // Contiguous, in order, covering the value.
        assert_eq!(spans.first().map_or(0, |s| s.start), 0);
        assert!(spans.windows(2).all(|w| w[0].end == w[1].start));
        assert_eq!(spans.last().map_or(0, |s| s.end), len);
        spans.iter().map(|s| s.end - s.start).collect()
    }

    #[test]
    fn a_value_streams_in_whole_chunks_small_first_then_at_most_a_mib() {
        const K: u64 = 1024;
        assert_eq!(lens(0), Vec::<u64>::new());
        assert_eq!(lens(1000), vec![1000]);
        assert_eq!(lens(100 * K), vec![64 * K, 36 * K]);
        assert_eq!(lens(1024 * K), vec![256 * K; 4]);
        let mut eight = vec![256 * K];
        eight.extend([1024 * K; 7]);
        eight.push(768 * K);
        assert_eq!(lens(8192 * K), eight);
    }
}
