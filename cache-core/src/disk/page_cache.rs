//! Demand reads through the kernel's page cache: a decorator around the I/O engines.
//!
//! The device is written with O_DIRECT, so fills, reclaim and recovery never crowd the page
//! cache. A client's read, though, goes through a second, buffered handle: a disk entry read
//! again is then a copy out of memory the kernel already holds, not another device read. This is
//! what nginx's cache hits are (files in the page cache); with O_DIRECT alone, each of Larder's
//! disk hits waited on the device, and one client reading 1 MiB objects got about half of
//! nginx's throughput (docs/benchmarks.md, "Disk hits through the page cache").
//!
//! - **Inline when cached.** A demand read of at most [`INLINE_MAX`] bytes first tries
//!   `preadv2(RWF_NOWAIT)` on the caller's thread: the kernel copies the bytes if every page is
//!   cached and refuses (`EAGAIN`) otherwise, never waiting on the device. A hit thus costs one
//!   syscall and no hop to an I/O thread and back. Larger reads always take the hop, so one copy
//!   never holds an async worker for long.
//! - **Otherwise, buffered on I/O threads.** The read goes to an engine over the buffered handle,
//!   which fills the page cache as it reads.
//! - **Everything else is O_DIRECT**: writes and background reads go to the engine over the
//!   direct handle.
//!
//! Nothing here weakens verification: every read is checked by the store as before (header,
//! epoch, key, chunk CRCs). A page the kernel kept from before its region was rewritten (Linux
//! invalidates cached pages on every O_DIRECT write; this guards the rare failure of that) fails
//! those checks and is a miss, never wrong bytes.
//!
//! The page cache is the kernel's memory, outside `memory_capacity`: it gives it back under
//! pressure, and `disk_page_cache = false` turns this path off.

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;

use super::io::{AlignedBuf, IoEngine, Priority};
use super::stats::PageCacheCounters;

/// Largest demand read tried inline on the caller's thread: a 1 MiB value with its header
/// (a page) is one; at memory speed that copy takes tens of microseconds.
pub(super) const INLINE_MAX: usize = (1 << 20) + 64 * 1024;

/// The decorator: demand reads through the page cache, the rest to the direct engine.
pub(super) struct PageCached {
    buffered: File,
    reads: Arc<dyn IoEngine>,
    rest: Arc<dyn IoEngine>,
    /// Cleared when the filesystem refuses `RWF_NOWAIT` itself, so it is not asked again.
    nowait: AtomicBool,
    counters: Arc<PageCacheCounters>,
}

impl PageCached {
    /// Demand reads first inline from `buffered`, else through `reads` (an engine over a
    /// buffered handle of the same device); background reads and writes through `rest`.
    pub(super) fn new(
        buffered: File,
        reads: Arc<dyn IoEngine>,
        rest: Arc<dyn IoEngine>,
        counters: Arc<PageCacheCounters>,
    ) -> Self {
        Self {
            buffered,
            reads,
            rest,
            nowait: AtomicBool::new(true),
            counters,
        }
    }

    /// `len` bytes at `offset` if every page is in the page cache; `None` otherwise (including a
    /// short read at the device's end, which the engine then reports as the error it is).
    fn cached(&self, offset: u64, len: usize) -> Option<AlignedBuf> {
        if len > INLINE_MAX || !self.nowait.load(Ordering::Relaxed) {
            return None;
        }
        let mut buf = AlignedBuf::reused(len);
        let got = rustix::io::preadv2(
            &self.buffered,
            &mut [io::IoSliceMut::new(buf.as_mut_slice())],
            offset,
            rustix::io::ReadWriteFlags::NOWAIT,
        );
        match got {
            Ok(n) if n == len => Some(buf),
            // Some pages are not cached (a short read or EAGAIN): the engine reads them.
            Ok(_) | Err(rustix::io::Errno::AGAIN) => None,
            Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::INVAL) => {
                tracing::debug!("RWF_NOWAIT refused here; disk hits take an I/O thread");
                self.nowait.store(false, Ordering::Relaxed);
                None
            }
            Err(_) => None,
        }
    }
}

impl IoEngine for PageCached {
    fn read(
        &self,
        offset: u64,
        len: usize,
        priority: Priority,
    ) -> BoxFuture<'static, io::Result<AlignedBuf>> {
        match priority {
            Priority::Background => self.rest.read(offset, len, priority),
            Priority::Demand => match self.cached(offset, len) {
                Some(buf) => {
                    self.counters.inline.fetch_add(1, Ordering::Relaxed);
                    Box::pin(std::future::ready(Ok(buf)))
                }
                None => {
                    self.counters.engine.fetch_add(1, Ordering::Relaxed);
                    self.reads.read(offset, len, priority)
                }
            },
        }
    }

    fn write(&self, offset: u64, buf: AlignedBuf) -> BoxFuture<'static, io::Result<()>> {
        self.rest.write(offset, buf)
    }

    fn name(&self) -> &'static str {
        self.rest.name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::format::PAGE;
    use crate::disk::io::PsyncEngine;
    use std::os::unix::fs::FileExt;
    use std::sync::atomic::AtomicU64;

    /// Counts what reaches it, serving every read as zeros (or failing past `size`).
    struct Counting {
        reads: AtomicU64,
        writes: AtomicU64,
    }

    impl IoEngine for Counting {
        fn read(
            &self,
            _: u64,
            len: usize,
            _: Priority,
        ) -> BoxFuture<'static, io::Result<AlignedBuf>> {
            self.reads.fetch_add(1, Ordering::Relaxed);
            Box::pin(std::future::ready(Ok(AlignedBuf::zeroed(len))))
        }
        fn write(&self, _: u64, _: AlignedBuf) -> BoxFuture<'static, io::Result<()>> {
            self.writes.fetch_add(1, Ordering::Relaxed);
            Box::pin(std::future::ready(Ok(())))
        }
        fn name(&self) -> &'static str {
            "counting"
        }
    }

    fn counting() -> Arc<Counting> {
        Arc::new(Counting {
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
        })
    }

    #[tokio::test]
    async fn cached_demand_reads_are_served_inline_and_the_rest_go_to_their_engines() {
        let file = tempfile::tempfile().expect("tempfile");
        file.set_len(4 << 20).expect("set_len");
        // Written through this handle, so its pages are in the page cache.
        file.write_all_at(&vec![7u8; 2 * PAGE], PAGE as u64)
            .expect("write");
        let (reads, rest) = (counting(), counting());
        let counters = Arc::new(PageCacheCounters::default());
        let engine = PageCached::new(
            file.try_clone().expect("clone"),
            reads.clone(),
            rest.clone(),
            counters.clone(),
        );
        let got = engine
            .read(PAGE as u64, 2 * PAGE, Priority::Demand)
            .await
            .expect("read");
        assert!(
            got.as_slice().iter().all(|b| *b == 7),
            "the cached bytes, not zeros"
        );
        assert_eq!(counters.inline.load(Ordering::Relaxed), 1);
        assert_eq!(reads.reads.load(Ordering::Relaxed), 0);

        // Larger than INLINE_MAX: the buffered engine, even though it is cached.
        file.write_all_at(&vec![1u8; 2 << 20], 0).expect("write");
        engine
            .read(0, 2 << 20, Priority::Demand)
            .await
            .expect("read");
        assert_eq!(reads.reads.load(Ordering::Relaxed), 1);
        assert_eq!(counters.engine.load(Ordering::Relaxed), 1);

        // Background reads and every write: the direct engine.
        engine
            .read(0, PAGE, Priority::Background)
            .await
            .expect("read");
        engine
            .write(0, AlignedBuf::zeroed(PAGE))
            .await
            .expect("write");
        assert_eq!(rest.reads.load(Ordering::Relaxed), 1);
        assert_eq!(rest.writes.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn a_read_past_the_end_is_the_engines_error_not_a_short_buffer() {
        let file = tempfile::tempfile().expect("tempfile");
        file.set_len(1 << 20).expect("set_len");
        let psync: Arc<dyn IoEngine> =
            Arc::new(PsyncEngine::new(file.try_clone().expect("clone"), 1, 4).expect("engine"));
        let engine = PageCached::new(
            file,
            psync.clone(),
            psync,
            Arc::new(PageCacheCounters::default()),
        );
        crate::disk::io::tests::round_trip(&engine, 9).await;
    }
}
