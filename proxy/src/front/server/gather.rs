//! HTTP/2 responses go out in a few large writes, not one per frame.
//!
//! The `h2` crate (0.4, under hyper) writes every DATA frame longer than 256 bytes with a
//! write of its own and flushes after it (hyperium/h2#902): a 1 MiB body in the 16 KiB frames
//! clients allow (h2load's default, and hyper's own client's, which replicas use to ask each
//! other for blocks) is 64 `writev` calls, each through the whole TCP send path. So an HTTP/2
//! connection's stream is [`Gathered`]: what the connection writes is copied into a buffer of
//! at most [`GATHER`] bytes (a full buffer is written out before more is taken), its flushes
//! are noted and not done, and [`FlushedAfter`] writes the buffer out each time the
//! connection's future has been polled. Nothing waits past the poll that wrote it; the frames
//! of one poll go out together.
//!
//! HTTP/1.1 connections are not wrapped: hyper writes a response's head and body in one
//! `writev` without copying the body, which a buffer here would copy.

use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::inline::{InPoll, REPOLLS};

/// Most bytes gathered before they are written out: a quarter of a MiB is 16 frames of 16 KiB,
/// few enough bytes that a write of them seldom finds the socket's buffer full.
pub(super) const GATHER: usize = 256 * 1024;

/// Most buffer a connection keeps once its gathered bytes are written: thousands of idle
/// connections must not each hold [`GATHER`]. A write of a whole frame's size (16 KiB, a body
/// streaming) takes a buffer of [`GATHER`] at once, rather than growing one by copies.
const KEEP: usize = 16 * 1024;

/// What an HTTP/2 connection was going to write, and the stream it goes to.
pub(super) struct Gather<I> {
    io: I,
    buf: Vec<u8>,
    /// Bytes of `buf` already written.
    at: usize,
    /// A write of gathered bytes that failed after the connection was told they were taken:
    /// its next read, write or flush returns it.
    failed: Option<io::Error>,
}

impl<I: AsyncWrite + Unpin> Gather<I> {
    /// Write out everything gathered, then flush the stream (under TLS, the encrypted records).
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.at < self.buf.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.buf[self.at..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.at += n;
        }
        if self.buf.capacity() > KEEP {
            self.buf = Vec::new();
        } else {
            self.buf.clear();
        }
        self.at = 0;
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_take(&mut self, cx: &mut Context<'_>, bufs: &[IoSlice<'_>]) -> Poll<io::Result<usize>> {
        if let Some(e) = self.failed.take() {
            return Poll::Ready(Err(e));
        }
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        if self.buf.len() + len > GATHER {
            ready!(self.poll_drain(cx))?;
            if len >= GATHER {
                return Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
            }
        }
        if len >= KEEP && self.buf.capacity() < self.buf.len() + len {
            self.buf.reserve_exact(GATHER - self.buf.len());
        }
        for b in bufs {
            self.buf.extend_from_slice(b);
        }
        Poll::Ready(Ok(len))
    }
}

/// A connection's stream: HTTP/1.1's as it is, HTTP/2's gathered.
pub(super) enum Gathered<I> {
    Direct(I),
    Gathering(Arc<Mutex<Gather<I>>>),
}

impl<I> Gathered<I> {
    /// `io`, gathered when `h2`; with what [`FlushedAfter`] drains.
    pub(super) fn new(io: I, h2: bool) -> (Self, Option<Arc<Mutex<Gather<I>>>>) {
        if !h2 {
            return (Self::Direct(io), None);
        }
        let gather = Arc::new(Mutex::new(Gather {
            io,
            buf: Vec::new(),
            at: 0,
            failed: None,
        }));
        (Self::Gathering(gather.clone()), Some(gather))
    }
}

impl<I: AsyncRead + AsyncWrite + Unpin> AsyncRead for Gathered<I> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Direct(io) => Pin::new(io).poll_read(cx, buf),
            Self::Gathering(g) => {
                let mut g = g.lock();
                if let Some(e) = g.failed.take() {
                    return Poll::Ready(Err(e));
                }
                Pin::new(&mut g.io).poll_read(cx, buf)
            }
        }
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Gathered<I> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Direct(io) => Pin::new(io).poll_write(cx, buf),
            Self::Gathering(g) => g.lock().poll_take(cx, &[IoSlice::new(buf)]),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Direct(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            Self::Gathering(g) => g.lock().poll_take(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Direct(io) => io.is_write_vectored(),
            Self::Gathering(_) => true,
        }
    }

    /// Gathering: done by [`FlushedAfter`] once the connection's poll ends, not now.
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Direct(io) => Pin::new(io).poll_flush(cx),
            Self::Gathering(g) => Poll::Ready(g.lock().failed.take().map_or(Ok(()), Err)),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Direct(io) => Pin::new(io).poll_shutdown(cx),
            Self::Gathering(g) => {
                let mut g = g.lock();
                ready!(g.poll_drain(cx))?;
                Pin::new(&mut g.io).poll_shutdown(cx)
            }
        }
    }
}

/// A connection's future whose gathered writes are written out after each of its polls. It
/// ends once the connection has and everything gathered is written (or failed).
pub(super) struct FlushedAfter<C: Future, I> {
    conn: Pin<Box<C>>,
    gather: Option<Arc<Mutex<Gather<I>>>>,
    /// An HTTP/2 connection's polls, which its own streams wake ([`InPoll`]).
    in_poll: Option<InPoll>,
    /// The connection's end, held while its last gathered bytes go out.
    ended: Option<C::Output>,
}

impl<C: Future, I> FlushedAfter<C, I> {
    pub(super) fn new(conn: C, gather: Option<Arc<Mutex<Gather<I>>>>) -> Self {
        Self {
            conn: Box::pin(conn),
            in_poll: gather.is_some().then(InPoll::new),
            gather,
            ended: None,
        }
    }

    /// The connection, to ask it to close: `None` once it has ended.
    pub(super) fn conn(&mut self) -> Option<Pin<&mut C>> {
        self.ended.is_none().then_some(self.conn.as_mut())
    }
}

impl<C: Future, I: AsyncWrite + Unpin> Future for FlushedAfter<C, I> {
    type Output = C::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<C::Output> {
        let this = self.get_mut();
        for round in 1..=REPOLLS {
            if this.ended.is_none() {
                let polled = match &this.in_poll {
                    Some(in_poll) => in_poll.poll(this.conn.as_mut(), cx),
                    None => this.conn.as_mut().poll(cx),
                };
                if let Poll::Ready(out) = polled {
                    this.ended = Some(out);
                }
            }
            // The connection woke itself (a stream it answered in place queued frames).
            let again = this.in_poll.as_ref().is_some_and(InPoll::woken_in_poll);
            if let Some(gather) = &this.gather {
                let mut g = gather.lock();
                match g.poll_drain(cx) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(e)) => {
                        // The connection took these bytes as written: it learns otherwise from
                        // its next read or write, and is polled again to make one.
                        g.buf.clear();
                        g.at = 0;
                        g.failed = Some(e);
                        cx.waker().wake_by_ref();
                    }
                    // Woken when the socket takes more; polled again then, if it woke itself.
                    Poll::Pending => {
                        if again {
                            cx.waker().wake_by_ref();
                        }
                        return Poll::Pending;
                    }
                }
            }
            if let Some(out) = this.ended.take() {
                return Poll::Ready(out);
            }
            if !again {
                return Poll::Pending;
            }
            // Polled again here, its frames written out between polls as before; but not past
            // the rounds or tokio's budget: then the task yields as a self-woken task does.
            if round == REPOLLS || !tokio::task::coop::has_budget_remaining() {
                break;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl<C: Future, I> Unpin for FlushedAfter<C, I> {}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::AsyncWriteExt;

    use super::*;

    /// A socket that records each write it is asked for, taking at most `room` bytes in all
    /// until more room is given.
    #[derive(Clone, Default)]
    struct Socket {
        writes: Arc<Mutex<Vec<Vec<u8>>>>,
        room: Arc<AtomicUsize>,
        waiting: Arc<Mutex<Option<std::task::Waker>>>,
    }

    impl Socket {
        fn with_room(room: usize) -> Self {
            let s = Self::default();
            s.room.store(room, Ordering::SeqCst);
            s
        }

        fn give(&self, room: usize) {
            self.room.fetch_add(room, Ordering::SeqCst);
            if let Some(w) = self.waiting.lock().take() {
                w.wake();
            }
        }

        fn written(&self) -> Vec<u8> {
            self.writes.lock().concat()
        }
    }

    impl AsyncWrite for Socket {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let room = self.room.load(Ordering::SeqCst);
            if room == 0 {
                *self.waiting.lock() = Some(cx.waker().clone());
                return Poll::Pending;
            }
            let n = room.min(buf.len());
            self.room.fetch_sub(n, Ordering::SeqCst);
            self.writes.lock().push(buf[..n].to_vec());
            Poll::Ready(Ok(n))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    impl AsyncRead for Socket {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Poll::Pending
        }
    }

    /// Frames as `h2` writes them: each written and flushed on its own, then the connection
    /// waits for something it will never get (as it waits for the client's next frame).
    async fn write_frames(mut io: Gathered<Socket>, frames: Vec<Vec<u8>>) {
        for f in &frames {
            io.write_all(f).await.unwrap();
            io.flush().await.unwrap();
        }
        std::future::pending::<()>().await;
    }

    fn frames(n: usize, len: usize) -> Vec<Vec<u8>> {
        (0..n).map(|i| vec![i as u8; len]).collect()
    }

    #[tokio::test]
    async fn the_frames_of_one_poll_go_out_in_one_write_before_the_poll_ends() {
        let socket = Socket::with_room(usize::MAX / 2);
        let (io, gather) = Gathered::new(socket.clone(), true);
        let sent = frames(8, 16 * 1024);
        let mut conn = FlushedAfter::new(write_frames(io, sent.clone()), gather);
        // One poll: the connection writes every frame and waits; nothing is left unsent.
        assert!(futures::poll!(&mut conn).is_pending());
        assert_eq!(socket.writes.lock().len(), 1);
        assert_eq!(socket.written(), sent.concat());
    }

    #[tokio::test]
    async fn a_full_buffer_goes_out_before_more_is_taken() {
        let socket = Socket::with_room(usize::MAX / 2);
        let (io, gather) = Gathered::new(socket.clone(), true);
        let sent = frames(40, 16 * 1024);
        let mut conn = FlushedAfter::new(write_frames(io, sent.clone()), gather);
        assert!(futures::poll!(&mut conn).is_pending());
        let writes: Vec<usize> = socket.writes.lock().iter().map(Vec::len).collect();
        assert!(writes.iter().all(|&n| n <= GATHER), "{writes:?}");
        assert_eq!(writes.len(), 40 * 16 * 1024 / GATHER + 1, "{writes:?}");
        assert_eq!(socket.written(), sent.concat());
    }

    #[tokio::test]
    async fn a_socket_that_takes_part_gets_the_rest_when_it_has_room() {
        let socket = Socket::with_room(10_000);
        let (io, gather) = Gathered::new(socket.clone(), true);
        let sent = frames(4, 16 * 1024);
        let mut conn = FlushedAfter::new(write_frames(io, sent.clone()), gather);
        assert!(futures::poll!(&mut conn).is_pending());
        assert_eq!(socket.written().len(), 10_000);
        socket.give(usize::MAX / 2);
        assert!(futures::poll!(&mut conn).is_pending());
        assert_eq!(socket.written(), sent.concat());
    }

    #[tokio::test]
    async fn a_connection_ends_only_once_its_last_bytes_are_written() {
        let socket = Socket::with_room(100);
        let (mut io, gather) = Gathered::new(socket.clone(), true);
        let mut conn = FlushedAfter::new(
            async move {
                io.write_all(&[7; 1000]).await.unwrap();
                io.flush().await.unwrap();
            },
            gather,
        );
        assert!(futures::poll!(&mut conn).is_pending());
        assert!(conn.conn().is_none(), "the connection itself has ended");
        socket.give(usize::MAX / 2);
        assert!(futures::poll!(&mut conn).is_ready());
        assert_eq!(socket.written(), vec![7; 1000]);
    }

    /// A connection that writes a frame and wakes its own task on each of its first `selves`
    /// polls (as `h2` does when a stream answered in place queues frames), then waits.
    struct SelfWaking {
        io: Gathered<Socket>,
        polls: usize,
        selves: usize,
    }

    impl Future for SelfWaking {
        type Output = ();

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.polls += 1;
            if self.polls > self.selves {
                return Poll::Pending;
            }
            let frame = [self.polls as u8; 100];
            assert!(Pin::new(&mut self.io).poll_write(cx, &frame).is_ready());
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    /// Counts the wakes of the task polling [`FlushedAfter`].
    struct Wakes(AtomicUsize);

    impl std::task::Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A [`SelfWaking`] connection waking itself `selves` times, HTTP/2 (`h2`) or not, and its
    /// socket.
    fn self_waking(h2: bool, selves: usize) -> (Socket, FlushedAfter<SelfWaking, Socket>) {
        let socket = Socket::with_room(usize::MAX / 2);
        let (io, gather) = Gathered::new(socket.clone(), h2);
        let conn = SelfWaking {
            io,
            polls: 0,
            selves,
        };
        (socket, FlushedAfter::new(conn, gather))
    }

    fn poll_counting<F: Future + Unpin>(fut: &mut F) -> (Poll<F::Output>, usize) {
        let wakes = Arc::new(Wakes(AtomicUsize::new(0)));
        let waker = std::task::Waker::from(wakes.clone());
        let polled = Pin::new(fut).poll(&mut Context::from_waker(&waker));
        (polled, wakes.0.load(Ordering::SeqCst))
    }

    #[tokio::test]
    async fn a_connection_that_wakes_itself_is_polled_again_in_place_its_frames_written_between() {
        let (socket, mut conn) = self_waking(true, 2);
        let (polled, wakes) = poll_counting(&mut conn);
        assert!(polled.is_pending());
        // Three polls in one: the two self-wakes were answered in place, the task not woken.
        assert_eq!(wakes, 0);
        // Each poll's frame went out before the next poll.
        let writes = socket.writes.lock().clone();
        assert_eq!(writes, vec![vec![1; 100], vec![2; 100]]);
    }

    #[tokio::test]
    async fn a_connection_that_keeps_waking_itself_yields_its_task() {
        let (socket, mut conn) = self_waking(true, usize::MAX);
        let (polled, wakes) = poll_counting(&mut conn);
        assert!(polled.is_pending());
        // Polled `REPOLLS` times, then the task is woken to come back after the others.
        assert_eq!(socket.writes.lock().len(), REPOLLS);
        assert_eq!(wakes, 1);
    }

    #[tokio::test]
    async fn http1_connections_are_polled_once_per_poll_of_their_task() {
        let (socket, mut conn) = self_waking(false, 2);
        let (polled, wakes) = poll_counting(&mut conn);
        assert!(polled.is_pending());
        assert_eq!(socket.writes.lock().len(), 1);
        assert_eq!(wakes, 1);
    }

    #[tokio::test]
    async fn a_connection_keeps_little_buffer_once_its_bytes_are_written() {
        let socket = Socket::with_room(usize::MAX / 2);
        let (io, gather) = Gathered::new(socket.clone(), true);
        let kept = gather.clone().unwrap();
        let mut conn = FlushedAfter::new(write_frames(io, frames(12, 16 * 1024)), gather);
        assert!(futures::poll!(&mut conn).is_pending());
        assert_eq!(socket.written().len(), 12 * 16 * 1024);
        let capacity = kept.lock().buf.capacity();
        assert!(capacity <= KEEP, "{capacity}");
    }

    #[tokio::test]
    async fn http1_writes_are_not_gathered() {
        let socket = Socket::with_room(usize::MAX / 2);
        let (io, gather) = Gathered::new(socket.clone(), false);
        assert!(gather.is_none());
        let mut conn = FlushedAfter::new(write_frames(io, frames(3, 100)), gather);
        assert!(futures::poll!(&mut conn).is_pending());
        assert_eq!(socket.writes.lock().len(), 3);
    }
}
