//! The io_uring engine: dedicated threads, each running a `tokio-uring` runtime over its own
//! handle to the device, fed by bounded channels. A thread takes demand reads before background
//! work (biased select); once submitted, the kernel runs requests concurrently up to the queue
//! depth, which the engine's semaphores bound.

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio_uring::buf::BoundedBuf;

use super::io::{gone, AlignedBuf, IoEngine, Job, Op, Priority};

struct Lane {
    demand: mpsc::Sender<Job>,
    background: mpsc::Sender<Job>,
}

/// io_uring through tokio-uring on `threads` dedicated threads.
pub struct UringEngine {
    lanes: Vec<Lane>,
    next: AtomicUsize,
    demand_slots: Arc<Semaphore>,
    background_slots: Arc<Semaphore>,
}

impl UringEngine {
    /// Start `threads` ring threads over `file` with up to `depth` requests per class in flight.
    /// Fails (so the caller can fall back to psync) when the kernel refuses io_uring.
    pub fn new(file: File, threads: usize, depth: usize) -> io::Result<Self> {
        let depth = depth.max(1);
        let mut lanes = Vec::new();
        for i in 0..threads.max(1) {
            let file = file.try_clone()?;
            let (demand, demand_rx) = mpsc::channel(depth);
            let (background, background_rx) = mpsc::channel(depth);
            let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
            std::thread::Builder::new()
                .name(format!("larder-uring-{i}"))
                .spawn(move || ring_thread(file, demand_rx, background_rx, ready_tx, depth))?;
            // The ring is created on its thread; wait to hear whether the kernel allowed it.
            ready_rx
                .recv()
                .map_err(|_| io::Error::other("io_uring thread died while starting"))??;
            lanes.push(Lane { demand, background });
        }
        Ok(Self {
            lanes,
            next: AtomicUsize::new(0),
            demand_slots: Arc::new(Semaphore::new(depth)),
            background_slots: Arc::new(Semaphore::new(depth)),
        })
    }

    fn submit<T: Send + 'static>(
        &self,
        op: Op,
        demand: bool,
        rx: oneshot::Receiver<io::Result<T>>,
    ) -> BoxFuture<'static, io::Result<T>> {
        let lane = &self.lanes[self.next.fetch_add(1, Ordering::Relaxed) % self.lanes.len()];
        let (tx, slots) = if demand {
            (lane.demand.clone(), self.demand_slots.clone())
        } else {
            (lane.background.clone(), self.background_slots.clone())
        };
        Box::pin(async move {
            let slot = slots.acquire_owned().await.map_err(|_| gone())?;
            tx.send(Job { op, _slot: slot }).await.map_err(|_| gone())?;
            rx.await.map_err(|_| gone())?
        })
    }
}

fn ring_thread(
    file: File,
    mut demand: mpsc::Receiver<Job>,
    mut background: mpsc::Receiver<Job>,
    ready: std::sync::mpsc::SyncSender<io::Result<()>>,
    depth: usize,
) {
    let entries = (2 * depth).next_power_of_two().clamp(64, 4096) as u32;
    let started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        tokio_uring::builder().entries(entries).start(async move {
            let _ = ready.send(Ok(()));
            let file = std::rc::Rc::new(tokio_uring::fs::File::from_std(file));
            loop {
                let job = tokio::select! {
                    biased;
                    Some(job) = demand.recv() => job,
                    Some(job) = background.recv() => job,
                    else => break,
                };
                let file = file.clone();
                tokio_uring::spawn(async move { run(&file, job).await });
            }
        })
    }));
    // tokio-uring panics when the kernel refuses a ring (old kernel, seccomp); the caller then
    // falls back to psync. `ready` was moved into the runtime, so a failure drops it unsent and
    // the caller's recv() errors.
    if started.is_err() {
        tracing::warn!("io_uring runtime failed to start");
    }
}

async fn run(file: &tokio_uring::fs::File, job: Job) {
    let Job { op, _slot } = job;
    match op {
        Op::Read { offset, len, done } => {
            let buf = AlignedBuf::reused(len);
            let (vec, start, len) = buf.into_parts();
            let (res, slice) = file
                .read_exact_at(vec.slice(start..start + len), offset)
                .await;
            let vec = slice.into_inner();
            let _ = done.send(res.map(|()| AlignedBuf::from_parts(vec, start, len)));
        }
        Op::Write { offset, buf, done } => {
            let (vec, start, len) = buf.into_parts();
            let (res, _) = file
                .write_all_at(vec.slice(start..start + len), offset)
                .await;
            let _ = done.send(res);
        }
    }
}

impl IoEngine for UringEngine {
    fn read(
        &self,
        offset: u64,
        len: usize,
        priority: Priority,
    ) -> BoxFuture<'static, io::Result<AlignedBuf>> {
        let (done, rx) = oneshot::channel();
        self.submit(
            Op::Read { offset, len, done },
            priority == Priority::Demand,
            rx,
        )
    }

    fn write(&self, offset: u64, buf: AlignedBuf) -> BoxFuture<'static, io::Result<()>> {
        let (done, rx) = oneshot::channel();
        self.submit(Op::Write { offset, buf, done }, false, rx)
    }

    fn name(&self) -> &'static str {
        "uring"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn uring_round_trip_when_available() {
        let file = tempfile::tempfile().expect("tempfile");
        file.set_len(1 << 20).expect("set_len");
        let engine = match UringEngine::new(file, 1, 8) {
            Ok(engine) => engine,
            // Only a kernel that refuses io_uring outright (not built in, or turned off by
            // `kernel.io_uring_disabled` or a seccomp profile) skips this; any other failure to
            // start the engine fails it.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOSYS | libc::EPERM | libc::EACCES)
                ) =>
            {
                eprintln!(
                    "SKIPPED: io_uring refused by this kernel ({e}); the psync engine serves here"
                );
                return;
            }
            Err(e) => panic!("the io_uring engine failed to start: {e}"),
        };
        crate::disk::io::tests::round_trip(&engine, 9).await;
    }
}
