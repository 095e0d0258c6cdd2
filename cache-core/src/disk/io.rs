//! The I/O seam: page-aligned reads and writes at device offsets, behind one trait with two
//! engines — [`PsyncEngine`] (pread/pwrite on dedicated threads) and, on Linux, the io_uring
//! engine in `uring.rs`. Both take requests through bounded queues and serve demand reads before
//! anything else, so a burst of cache fills cannot starve a client waiting on a hit.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use futures::future::BoxFuture;
use parking_lot::{Condvar, Mutex};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

pub use crate::buffers::AlignedBuf;

#[cfg(test)]
use super::format::PAGE;

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
                let mut buf = AlignedBuf::reused(len);
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
