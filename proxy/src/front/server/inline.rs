//! The executor hyper's HTTP/2 server hands each request's response to.
//!
//! hyper serves an HTTP/1.1 request inside its connection's task, but hands every HTTP/2 stream
//! (the request's service future and the piping of its body into the stream) to its executor.
//! With `TokioExecutor` that is a task spawned per request: an allocation, a place in a run
//! queue, often a wake-up of the other worker (a futex call when it sleeps), and then the
//! connection's task woken again from that task to write the frames out. A memory hit does all
//! of its work on its first poll: the service answers at once and its body fits the stream's
//! window. [`InlineFirst`] polls each stream once where hyper hands it over, in the
//! connection's task, and spawns only what is still pending then (misses, disk reads, bodies
//! waiting for flow-control window), so those go on running beside the connection as before.
//!
//! A stream answered in place queues its frames with the `h2` crate, which wakes the
//! connection's task to write them: the task wakes itself while it is running. tokio takes
//! that as a yield, puts the task at the back of its queue and wakes the other worker to come
//! and steal it, a futex call and often a move across cores per request. [`InPoll`] polls the
//! connection with a waker that notes such wakes instead and polls it again at once.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use parking_lot::Mutex;

/// Polls a future once in the caller's task; spawns it on tokio only if it is not done.
///
/// The first poll runs with a waker that does nothing, and a future still pending after it has
/// left that waker with whatever it waits on. Nothing is lost: tokio polls a spawned task once
/// at its start, with the task's own waker, and a future must wake the waker of its latest
/// poll.
///
/// A panic in that first poll is caught and ends that stream alone, as it did when every
/// stream was a task of its own (tokio catches a task's panic): the stream's future is dropped,
/// which resets the stream, and the connection's other streams go on. Left to unwind, it would
/// end the connection's task and every request the client had in flight on it. (A handler's
/// panic is answered 500 before this, in `routes`; what reaches here is a panic while the
/// response's body is polled.)
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct InlineFirst;

impl<F> hyper::rt::Executor<F> for InlineFirst
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, fut: F) {
        let mut fut = Box::pin(fut);
        // Unwind safety: after a panic the future is dropped here and never polled again, and
        // whatever else it shared is left as a panic in a task of its own (which tokio catches)
        // would leave it: the handling is the same as before streams ran in place.
        let first = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            fut.as_mut().poll(&mut Context::from_waker(Waker::noop()))
        }));
        match first {
            Ok(Poll::Ready(())) => {}
            Ok(Poll::Pending) => {
                tokio::spawn(fut);
            }
            // The panic's message went to the panic hook (stderr) as it unwound.
            Err(_) => tracing::error!("an HTTP/2 request's handler panicked: its stream is reset"),
        }
    }
}

/// Polls of a future that may wake its own task while it is being polled: such wakes are
/// noted ([`InPoll::woken_in_poll`]) for the caller to poll again in place, and do not reach
/// the task; wakes from anywhere else reach the task as they would.
pub(super) struct InPoll {
    state: Arc<InPollState>,
    /// The waker the future is polled with: `state`, made once.
    waker: Waker,
}

/// Most polls of the future in one poll of its task. Past them (or with tokio's cooperative
/// budget spent, whose resources wake the task to make it yield) the task is woken and
/// yields, as it would have without [`InPoll`], so other tasks are not starved.
pub(super) const REPOLLS: usize = 4;

struct InPollState {
    /// Whether the future is being polled now.
    polling: AtomicBool,
    /// Whether it was woken since its latest poll began.
    woken: AtomicBool,
    /// The task polling it, as of its latest poll.
    task: Mutex<Option<Waker>>,
}

impl Wake for InPollState {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Noted before `polling` is read, and `polling` lowered before `woken` is read by the
        // poller (all sequentially consistent): either the poller sees this wake and polls
        // again, or this sees the poll ended and wakes the task. Both may happen; none is lost.
        self.woken.store(true, SeqCst);
        if !self.polling.load(SeqCst) {
            if let Some(task) = self.task.lock().as_ref() {
                task.wake_by_ref();
            }
        }
    }
}

impl InPoll {
    pub(super) fn new() -> Self {
        let state = Arc::new(InPollState {
            polling: AtomicBool::new(false),
            woken: AtomicBool::new(false),
            task: Mutex::new(None),
        });
        Self {
            waker: Waker::from(state.clone()),
            state,
        }
    }

    /// Poll `fut` once, for the task of `cx`.
    pub(super) fn poll<F: Future + ?Sized>(
        &self,
        fut: Pin<&mut F>,
        cx: &mut Context<'_>,
    ) -> Poll<F::Output> {
        {
            let mut task = self.state.task.lock();
            if !task.as_ref().is_some_and(|t| t.will_wake(cx.waker())) {
                *task = Some(cx.waker().clone());
            }
        }
        self.state.woken.store(false, SeqCst);
        self.state.polling.store(true, SeqCst);
        let polled = fut.poll(&mut Context::from_waker(&self.waker));
        self.state.polling.store(false, SeqCst);
        polled
    }

    /// Whether the future was woken since its latest [`InPoll::poll`] began: the caller polls
    /// it again, or wakes its task.
    pub(super) fn woken_in_poll(&self) -> bool {
        self.state.woken.load(SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use hyper::rt::Executor;

    use super::*;

    #[tokio::test]
    async fn a_future_done_on_its_first_poll_runs_in_place() {
        let polls = Arc::new(AtomicUsize::new(0));
        let seen = polls.clone();
        InlineFirst.execute(async move {
            seen.fetch_add(1, Ordering::SeqCst);
        });
        // Done before `execute` returned: no task was needed.
        assert_eq!(polls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_pending_future_is_spawned_and_woken_by_what_it_waits_on() {
        let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<u32>();
        InlineFirst.execute(async move {
            let v = rx.await.expect("sent");
            done_tx.send(v + 1).expect("waiting");
        });
        // Its first poll registered the no-op waker with `rx`; the spawned task's own poll must
        // have replaced it, or this send would wake nothing and the wait below time out.
        tokio::task::yield_now().await;
        tx.send(41).expect("still waiting");
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), done_rx)
            .await
            .expect("woken")
            .expect("sent");
        assert_eq!(got, 42);
    }

    #[tokio::test]
    async fn a_panic_in_the_first_poll_ends_that_future_alone() {
        // A stream's handler that panics on its first poll: the panic stops in `execute`,
        // which would otherwise unwind through the connection's task.
        let dropped = Arc::new(AtomicUsize::new(0));
        struct Drops(Arc<AtomicUsize>);
        impl Drop for Drops {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let guard = Drops(dropped.clone());
        InlineFirst.execute(async move {
            let _held = guard;
            panic!("a handler's bug");
        });
        // Dropped (for hyper, the stream reset), not kept or spawned.
        assert_eq!(dropped.load(Ordering::SeqCst), 1);
        // The caller goes on: the next stream of the same connection is served as before.
        let polls = Arc::new(AtomicUsize::new(0));
        let seen = polls.clone();
        InlineFirst.execute(async move {
            seen.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(polls.load(Ordering::SeqCst), 1);
    }

    /// Wakes itself on each of its first `selves` polls; after that it waits for `rx`.
    struct Stepper {
        polls: usize,
        selves: usize,
        rx: tokio::sync::oneshot::Receiver<()>,
    }

    impl Future for Stepper {
        type Output = usize;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
            self.polls += 1;
            if self.polls <= self.selves {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            match Pin::new(&mut self.rx).poll(cx) {
                Poll::Ready(_) => Poll::Ready(self.polls),
                Poll::Pending => Poll::Pending,
            }
        }
    }

    /// Counts the wakes of the task polling through [`InPoll`].
    struct Counted(AtomicUsize);

    impl Wake for Counted {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_wake_during_its_own_poll_is_noted_not_sent_to_the_task() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let mut fut = Stepper {
            polls: 0,
            selves: 1,
            rx,
        };
        let task = Arc::new(Counted(AtomicUsize::new(0)));
        let waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&waker);
        let in_poll = InPoll::new();
        assert!(in_poll.poll(Pin::new(&mut fut), &mut cx).is_pending());
        // It woke itself: noted for the caller, the task not woken.
        assert!(in_poll.woken_in_poll());
        assert_eq!(task.0.load(Ordering::SeqCst), 0);
        assert!(in_poll.poll(Pin::new(&mut fut), &mut cx).is_pending());
        assert!(!in_poll.woken_in_poll());
        // A wake from outside a poll reaches the task.
        tx.send(()).expect("waiting");
        assert_eq!(task.0.load(Ordering::SeqCst), 1);
        assert_eq!(in_poll.poll(Pin::new(&mut fut), &mut cx), Poll::Ready(3));
    }
}
