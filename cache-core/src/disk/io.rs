//! The I/O seam: page-aligned reads and writes at device offsets, behind one trait with two
//! engines — [`PsyncEngine`] (pread/pwrite on dedicated threads) and, on Linux, the io_uring
//! engine in `uring.rs`. Both take requests through bounded queues and serve demand reads before
//! anything else, so a burst of cache fills cannot starve a client waiting on a hit.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use parking_lot::{Condvar, Mutex};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

use super::format::PAGE;

/// A page-aligned buffer, as O_DIRECT requires, built without `unsafe`: an over-allocated
/// `Vec` and the aligned window inside it. Large ones go back to a small pool when dropped (or
/// when the [`Bytes`] made of them are), so a disk hit reuses memory already mapped and zeroed
/// once, instead of zeroing and faulting in a fresh megabyte per read.
#[derive(Debug)]
pub struct AlignedBuf {
    vec: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// `len` zeroed bytes starting on a page boundary.
    pub fn zeroed(len: usize) -> Self {
        Self::over(vec![0u8; len + PAGE], len)
    }

    /// `len` bytes starting on a page boundary, of unspecified contents (a recycled buffer's
    /// old bytes, or zeros): for a read that fills all of them.
    pub fn for_read(len: usize) -> Self {
        match RECYCLED.take(len + PAGE) {
            Some(vec) => Self::over(vec, len),
            None => Self::zeroed(len),
        }
    }

    fn over(vec: Vec<u8>, len: usize) -> Self {
        let addr = vec.as_ptr() as usize;
        let start = (PAGE - addr % PAGE) % PAGE;
        Self { vec, start, len }
    }

    /// The aligned bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.vec[self.start..self.start + self.len]
    }

    /// The aligned bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.vec[self.start..self.start + self.len]
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes `[from, to)` of the buffer as shared [`Bytes`], without a copy; the buffer
    /// goes back to the pool when the last of them is dropped.
    pub fn freeze(mut self, from: usize, to: usize) -> Bytes {
        let start = self.start;
        Bytes::from_owner(Recycle(std::mem::take(&mut self.vec))).slice(start + from..start + to)
    }

    #[cfg(target_os = "linux")]
    pub(crate) fn into_parts(mut self) -> (Vec<u8>, usize, usize) {
        (std::mem::take(&mut self.vec), self.start, self.len)
    }

    #[cfg(target_os = "linux")]
    pub(crate) fn from_parts(vec: Vec<u8>, start: usize, len: usize) -> Self {
        Self { vec, start, len }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        RECYCLED.put(std::mem::take(&mut self.vec));
    }
}

/// A buffer's `Vec` inside [`Bytes`]: returned to the pool when the last `Bytes` goes.
struct Recycle(Vec<u8>);

impl AsRef<[u8]> for Recycle {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Recycle {
    fn drop(&mut self) {
        RECYCLED.put(std::mem::take(&mut self.0));
    }
}

/// Buffers smaller than this are not pooled: zeroing them costs less than the pool's lock.
const RECYCLE_MIN: usize = 64 * 1024;
/// Most bytes the pool holds, so it stays a bounded cost beside `memory_capacity`: sixteen
/// 1 MiB reads, or a few 8 MiB blocks.
const RECYCLE_MAX_BYTES: usize = 64 << 20;

/// Free buffers by exact length: disk reads repeat a few lengths (whole blocks of one size,
/// their 1 MiB pieces), so an exact match is the common case and no buffer is handed out
/// larger than asked (the memory tier may keep it, counting only what it asked for).
static RECYCLED: Recycler = Recycler {
    free: Mutex::new(Free {
        bufs: Vec::new(),
        bytes: 0,
    }),
};

struct Recycler {
    free: Mutex<Free>,
}

/// Free buffers, newest last, and their total length (at most [`RECYCLE_MAX_BYTES`]).
struct Free {
    bufs: Vec<Vec<u8>>,
    bytes: usize,
}

impl Free {
    fn remove(&mut self, at: usize) -> Vec<u8> {
        let vec = self.bufs.swap_remove(at);
        self.bytes -= vec.len();
        vec
    }
}

impl Recycler {
    fn take(&self, len: usize) -> Option<Vec<u8>> {
        if len < RECYCLE_MIN {
            return None;
        }
        let mut free = self.free.lock();
        let at = free.bufs.iter().rposition(|v| v.len() == len)?;
        Some(free.remove(at))
    }

    fn put(&self, vec: Vec<u8>) {
        if vec.len() < RECYCLE_MIN || vec.len() > RECYCLE_MAX_BYTES {
            return;
        }
        let mut free = self.free.lock();
        // Full: make room by dropping buffers of other lengths, so the pool follows the lengths
        // being read now; with none to drop, this one goes.
        while free.bytes + vec.len() > RECYCLE_MAX_BYTES {
            match free.bufs.iter().position(|v| v.len() != vec.len()) {
                Some(at) => drop(free.remove(at)),
                None => return,
            }
        }
        free.bytes += vec.len();
        free.bufs.push(vec);
    }
}

/// Who is waiting on a read: a client (served first) or background work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// A client is waiting.
    Demand,
    /// Cache fills, reclaim, recovery.
    Background,
}

/// Page-aligned I/O at absolute device offsets.
pub trait IoEngine: Send + Sync + 'static {
    /// Read `len` bytes (a multiple of the page size) at `offset`.
    fn read(
        &self,
        offset: u64,
        len: usize,
        priority: Priority,
    ) -> BoxFuture<'static, io::Result<AlignedBuf>>;
    /// Write all of `buf` at `offset`.
    fn write(&self, offset: u64, buf: AlignedBuf) -> BoxFuture<'static, io::Result<()>>;
    /// `"psync"` or `"uring"`, for logs and metrics.
    fn name(&self) -> &'static str;
}

pub(crate) enum Op {
    Read {
        offset: u64,
        len: usize,
        done: oneshot::Sender<io::Result<AlignedBuf>>,
    },
    Write {
        offset: u64,
        buf: AlignedBuf,
        done: oneshot::Sender<io::Result<()>>,
    },
}

/// A job plus the queue slot it holds until it completes.
pub(crate) struct Job {
    pub(crate) op: Op,
    pub(crate) _slot: OwnedSemaphorePermit,
}

#[derive(Default)]
struct Queues {
    demand: std::collections::VecDeque<Job>,
    background: std::collections::VecDeque<Job>,
    closed: bool,
}

/// pread/pwrite on a fixed set of threads. Each queue is bounded by a semaphore that callers
/// wait on asynchronously; workers always drain demand reads first.
pub struct PsyncEngine {
    shared: Arc<(Mutex<Queues>, Condvar)>,
    demand_slots: Arc<Semaphore>,
    background_slots: Arc<Semaphore>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl PsyncEngine {
    /// `threads` workers over `file`, with at most `depth` requests queued or running per class.
    pub fn new(file: File, threads: usize, depth: usize) -> io::Result<Self> {
        let shared = Arc::new((Mutex::new(Queues::default()), Condvar::new()));
        let mut handles = Vec::new();
        for i in 0..threads.max(1) {
            let file = file.try_clone()?;
            let shared = shared.clone();
            handles.push(
                std::thread::Builder::new()
                    .name(format!("larder-psync-{i}"))
                    .spawn(move || worker(&file, &shared))?,
            );
        }
        Ok(Self {
            shared,
            demand_slots: Arc::new(Semaphore::new(depth.max(1))),
            background_slots: Arc::new(Semaphore::new(depth.max(1))),
            threads: handles,
        })
    }

    fn submit(&self, op: Op, demand: bool) -> BoxFuture<'static, ()> {
        let slots = if demand {
            self.demand_slots.clone()
        } else {
            self.background_slots.clone()
        };
        let shared = self.shared.clone();
        Box::pin(async move {
            // The semaphore is never closed, so acquire cannot fail; if it did, dropping `op`
            // drops its sender and the caller sees an error.
            let Ok(slot) = slots.acquire_owned().await else {
                return;
            };
            let job = Job { op, _slot: slot };
            let (lock, cv) = &*shared;
            let mut q = lock.lock();
            if demand {
                q.demand.push_back(job);
            } else {
                q.background.push_back(job);
            }
            drop(q);
            cv.notify_one();
        })
    }
}

fn worker(file: &File, shared: &(Mutex<Queues>, Condvar)) {
    let (lock, cv) = shared;
    loop {
        let job = {
            let mut q = lock.lock();
            loop {
                if let Some(job) = q.demand.pop_front().or_else(|| q.background.pop_front()) {
                    break job;
                }
                if q.closed {
                    return;
                }
                cv.wait(&mut q);
            }
        };
        match job.op {
            Op::Read { offset, len, done } => {
                let mut buf = AlignedBuf::for_read(len);
                let r = file.read_exact_at(buf.as_mut_slice(), offset).map(|()| buf);
                let _ = done.send(r);
            }
            Op::Write { offset, buf, done } => {
                let _ = done.send(file.write_all_at(buf.as_slice(), offset));
            }
        }
    }
}

impl Drop for PsyncEngine {
    fn drop(&mut self) {
        self.shared.0.lock().closed = true;
        self.shared.1.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

pub(crate) fn gone() -> io::Error {
    io::Error::other("I/O engine stopped")
}

impl IoEngine for PsyncEngine {
    fn read(
        &self,
        offset: u64,
        len: usize,
        priority: Priority,
    ) -> BoxFuture<'static, io::Result<AlignedBuf>> {
        let (done, rx) = oneshot::channel();
        let submit = self.submit(Op::Read { offset, len, done }, priority == Priority::Demand);
        Box::pin(async move {
            submit.await;
            rx.await.map_err(|_| gone())?
        })
    }

    fn write(&self, offset: u64, buf: AlignedBuf) -> BoxFuture<'static, io::Result<()>> {
        let (done, rx) = oneshot::channel();
        let submit = self.submit(Op::Write { offset, buf, done }, false);
        Box::pin(async move {
            submit.await;
            rx.await.map_err(|_| gone())?
        })
    }

    fn name(&self) -> &'static str {
        "psync"
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn aligned_buffers_are_aligned() {
        for len in [PAGE, 3 * PAGE, 1 << 20] {
            let b = AlignedBuf::zeroed(len);
            assert_eq!(b.as_slice().as_ptr() as usize % PAGE, 0);
            assert_eq!(b.len(), len);
        }
    }

    #[test]
    fn a_read_buffer_comes_back_to_the_pool_when_its_bytes_are_dropped() {
        // A length no other test uses, so the pool (shared by the tests) hands this one back.
        let len = 3 * RECYCLE_MIN + 7 * PAGE;
        let mut buf = AlignedBuf::for_read(len);
        buf.as_mut_slice().fill(3);
        let at = buf.as_slice().as_ptr();
        let bytes = buf.freeze(PAGE, 2 * PAGE);
        let other = AlignedBuf::for_read(len);
        assert_ne!(other.as_slice().as_ptr(), at, "still in use by the bytes");
        drop(other);
        drop(bytes);
        let again = AlignedBuf::for_read(len);
        assert_eq!(again.as_slice().as_ptr() as usize % PAGE, 0);
        assert!(
            again.as_slice().as_ptr() == at || RECYCLED.take(len + PAGE).is_some(),
            "a freed buffer of this length is pooled"
        );
        // Small ones are not pooled.
        drop(AlignedBuf::for_read(PAGE));
        assert!(RECYCLED.take(2 * PAGE).is_none());
    }

    /// Write two pages at page 1, read them back, and read past the end (an error, not zeros).
    pub(crate) async fn round_trip(engine: &dyn IoEngine, fill: u8) {
        let mut buf = AlignedBuf::zeroed(2 * PAGE);
        buf.as_mut_slice().fill(fill);
        engine.write(PAGE as u64, buf).await.expect("write");
        let back = engine
            .read(PAGE as u64, 2 * PAGE, Priority::Demand)
            .await
            .expect("read");
        assert!(back.as_slice().iter().all(|b| *b == fill));
        let err = engine.read(1 << 20, PAGE, Priority::Background).await;
        assert!(err.is_err(), "reading past the end is an error, not zeros");
    }

    #[tokio::test]
    async fn psync_round_trip() {
        let file = tempfile::tempfile().expect("tempfile");
        file.set_len(1 << 20).expect("set_len");
        round_trip(&PsyncEngine::new(file, 2, 8).expect("engine"), 7).await;
    }
}
