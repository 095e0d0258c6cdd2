//! Large HTTP/1.1 bodies sent from the cache's own buffers, without copying them into the socket.
//!
//! A hit's body is the cached block itself ([`Bytes`](bytes::Bytes) of one of cache-core's
//! pooled buffers), and writing it copies every byte into the socket's buffer: for 1 MiB and
//! up that copy was about half of a memory hit's CPU, and nginx, which sends its cache files
//! with `sendfile`, does not make it. A cleartext HTTP/1.1 connection is [`Lending`]: a body's
//! bytes of such a buffer, once the memory tier has served them often
//! (`buffers::LEND_AFTER_READS`: a loan costs the buffer fresh pages later, which a block read
//! a few times does not earn back), go into a pipe by reference
//! ([`cache_core::buffers::lend_into_pipe`], `vmsplice`) and from the pipe to the socket
//! (`splice`), the pages themselves, as `sendfile` does. Heads, small bodies and bytes of any
//! other memory are written as before.
//!
//! The pipe is the connection's extra send buffer: bytes in it count as written (hyper drops
//! its `Bytes`; the buffer's pages stay with the pipe, see cache-core's `buffers`), and every
//! write, flush and shutdown empties it into the socket first, so the order of the stream is
//! kept and a client that stops reading stops the writes. A write from the pipe that fails
//! after hyper was told its bytes were taken is returned by the next write, flush or shutdown,
//! as a socket's own buffered send would fail.
//!
//! A client on this host is lent only the bodies of small blocks (`send_by_reference = "auto"`,
//! the default: at most [`LOCAL_LEND_MAX`]), unless many are busy ([`Busy`]: then blocks of up
//! to [`LOCAL_BUSY_LEND_MAX`]). It copies the body out of its socket on this machine's CPUs: a
//! lone client reading large hits is held to its own copy's speed, which the server's copy
//! otherwise ran beside on another core (on loopback, one client reading 512 KiB to 64 MiB
//! hits: 15 to 58 % less throughput lent; 8 and 64 MiB hits: the machine's CPU per request up
//! 23 to 57 %), where 64 to 256 KiB hits came out even or better for client and machine alike.
//! With eight or more connections reading 1 MiB hits the cores are the limit, and the copy a
//! loan saves is the machine's: 27 to 33 % more throughput at 39 to 46 % less of the server's
//! CPU and no more of the clients' (docs/benchmarks.md). A client across a network gets the
//! pages from the network card, which reads them either way.
//!
//! TLS connections encrypt in user space and HTTP/2's frames are gathered
//! ([`super::gather`]), so neither lends.

use std::io::{self, IoSlice};
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use rustix::net::{send, SendFlags};
use rustix::pipe::{fcntl_setpipe_size, pipe_with, splice, PipeFlags, SpliceFlags};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

use crate::config::SendByReference;

/// Bodies (a single `Bytes` of one) shorter than this are copied: a loan's two system calls and
/// the page references it takes are worth it only for larger writes, and a buffer that lent
/// pages is faulted in afresh when next used. From 64 KiB (the smallest buffers pooled, and
/// so the smallest lendable), sixteen clients reading hits of that size on loopback cost the
/// server 23 % less CPU lent than copied, one client as much (docs/benchmarks.md).
const LEND_MIN: usize = 64 * 1024;

/// The largest blocks whose bytes a client on this host is lent (`send_by_reference = "auto"`):
/// up to this size, lending measured no worse for one client's throughput nor the machine's
/// CPU, and better with many clients; from 512 KiB one client's throughput fell.
const LOCAL_LEND_MAX: usize = 256 * 1024;

/// The largest blocks whose bytes a client on this host is lent while [`LOCAL_BUSY_MIN`]
/// connections on this host are sending large bodies: with eight and more connections reading
/// 1 MiB hits, lent bodies were better for throughput and for both sides' CPU; with sixteen and
/// sixty-four reading 2 MiB hits they gained no throughput (−7 to +3 %) and cost the clients
/// 17 to 33 % more CPU, and 4 MiB hits lost 15 to 17 % of their throughput.
const LOCAL_BUSY_LEND_MAX: usize = 1 << 20;

/// How many connections on this host sending large bodies at once make it busy: one and two
/// connections reading 1 MiB hits lost 33 and 9 % of their throughput lent, four came out
/// even, eight gained 27 % (docs/benchmarks.md).
const LOCAL_BUSY_MIN: usize = 8;

/// How long a connection counts as sending large bodies after it last wrote [`LEND_MIN`] bytes
/// of one at once: it counts in the span it wrote in and the next.
const BUSY_SPAN: Duration = Duration::from_millis(100);

/// The pipe's size asked for. Each `splice` from a fuller pipe takes the socket's lock and
/// wakes the client once for more bytes: one client reading 8 MiB hits cost 1,597 ms of CPU
/// per 1,000 with 1 MiB pipes and 1,986 with 256 KiB ones (docs/benchmarks.md). What waits in
/// a pipe is references to the cache's pages, as a socket's send buffer (up to 4 MiB by
/// default) holds copies; a page is extra memory only if its block left the memory tier
/// meanwhile. The kernel may give less (an unprivileged user's pipes past
/// `/proc/sys/fs/pipe-user-pages-soft` keep the default 64 KiB): then only more calls.
const PIPE_SIZE: usize = 1 << 20;

/// A cleartext socket whose large writes of cached bytes are lent, not copied.
pub(super) struct Lending {
    socket: TcpStream,
    pipe: Pipe,
    /// The largest blocks whose bytes are lent.
    most: Most,
    /// Bytes in the pipe, taken from the connection and not yet in the socket.
    piped: usize,
}

/// Which blocks' bytes a connection lends.
enum Most {
    /// Those of blocks of at most this many bytes.
    Fixed(usize),
    /// A client on this host under `auto`: [`LOCAL_LEND_MAX`], or [`LOCAL_BUSY_LEND_MAX`] while
    /// `busy` says the host is busy; `counted` is the span this connection last counted in.
    Local { busy: &'static Busy, counted: u64 },
}

enum Pipe {
    /// None needed yet: most connections never write a large body.
    Unopened,
    Open {
        read: OwnedFd,
        write: OwnedFd,
    },
    /// This connection copies: `send_by_reference` says so for its client, or the system
    /// would not make a pipe (out of descriptors), or `vmsplice` failed.
    Off,
}

impl Lending {
    pub(super) fn new(socket: TcpStream, by_reference: SendByReference) -> Self {
        Self::counted_by(socket, by_reference, &BUSY)
    }

    /// A connection whose client, if on this host, is counted by `busy`.
    fn counted_by(socket: TcpStream, by_reference: SendByReference, busy: &'static Busy) -> Self {
        let most = match by_reference {
            SendByReference::Always => Some(Most::Fixed(usize::MAX)),
            SendByReference::Never => None,
            SendByReference::Remote => (!on_this_host(&socket)).then_some(Most::Fixed(usize::MAX)),
            SendByReference::Auto if on_this_host(&socket) => {
                Some(Most::Local { busy, counted: 0 })
            }
            SendByReference::Auto => Some(Most::Fixed(usize::MAX)),
        };
        Self {
            socket,
            pipe: if most.is_some() {
                Pipe::Unopened
            } else {
                Pipe::Off
            },
            most: most.unwrap_or(Most::Fixed(0)),
            piped: 0,
        }
    }

    /// The largest blocks whose bytes this write may lend; a write with a large body in it
    /// counts this connection as busy.
    fn most(&mut self, bufs: &[IoSlice<'_>]) -> usize {
        match &mut self.most {
            Most::Fixed(most) => *most,
            Most::Local { busy, counted } => {
                let large = bufs.iter().any(|b| b.len() >= LEND_MIN);
                if large && busy.count(counted) >= LOCAL_BUSY_MIN {
                    LOCAL_BUSY_LEND_MAX
                } else {
                    LOCAL_LEND_MAX
                }
            }
        }
    }

    /// The pipe's write end, made on first use.
    fn pipe(&mut self) -> Option<&OwnedFd> {
        if let Pipe::Unopened = self.pipe {
            self.pipe = match pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK) {
                Ok((read, write)) => {
                    let _ = fcntl_setpipe_size(&write, PIPE_SIZE);
                    Pipe::Open { read, write }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "no pipe for lending; this connection copies");
                    Pipe::Off
                }
            };
        }
        match &self.pipe {
            Pipe::Open { write, .. } => Some(write),
            Pipe::Unopened | Pipe::Off => None,
        }
    }

    /// Empty the pipe into the socket.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.piped > 0 {
            let Pipe::Open { read, .. } = &self.pipe else {
                unreachable!("bytes are piped only through an open pipe");
            };
            let (socket, piped) = (&self.socket, self.piped);
            let n = ready!(poll_writable(socket, cx, || Ok(splice(
                read,
                None,
                socket,
                None,
                piped,
                SpliceFlags::NONBLOCK | SpliceFlags::MOVE,
            )?)))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.piped -= n;
        }
        Poll::Ready(Ok(()))
    }
}

/// How many connections on this host are sending large bodies: those that wrote [`LEND_MIN`]
/// bytes of one at once in this span of [`BUSY_SPAN`] or the one before. A count only steers
/// how bytes are sent, never which: two connections racing at a span's turn may go uncounted
/// for it, which costs at most one span of copies.
struct Busy {
    /// How long a span is.
    length: Duration,
    /// The span `now` counts (spans since the process's first count, from 1).
    span: AtomicU64,
    now: AtomicUsize,
    before: AtomicUsize,
}

/// The process's count.
static BUSY: Busy = Busy::new(BUSY_SPAN);

impl Busy {
    const fn new(length: Duration) -> Self {
        Self {
            length,
            span: AtomicU64::new(0),
            now: AtomicUsize::new(0),
            before: AtomicUsize::new(0),
        }
    }

    /// Count a connection sending a large body (once per span: `counted` is the span it last
    /// counted in), and return how many are.
    fn count(&self, counted: &mut u64) -> usize {
        static START: OnceLock<Instant> = OnceLock::new();
        let elapsed = START.get_or_init(Instant::now).elapsed();
        let span = 1 + (elapsed.as_millis() / self.length.as_millis()) as u64;
        self.count_in(span, counted)
    }

    fn count_in(&self, span: u64, counted: &mut u64) -> usize {
        let seen = self.span.load(Ordering::Acquire);
        if span > seen
            && self
                .span
                .compare_exchange(seen, span, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            // The first to see a new span moves the count along; after a quiet span, none.
            let last = self.now.swap(0, Ordering::AcqRel);
            let before = if span == seen + 1 { last } else { 0 };
            self.before.store(before, Ordering::Release);
        }
        if *counted < span {
            *counted = span;
            self.now.fetch_add(1, Ordering::AcqRel);
        }
        let now = self.now.load(Ordering::Acquire);
        now.max(self.before.load(Ordering::Acquire))
    }
}

/// Whether the client is on this host: a loopback address, or the address it connected to (an
/// address it could not be asked for counts as this host's: copying is never wrong).
fn on_this_host(socket: &TcpStream) -> bool {
    match (socket.peer_addr(), socket.local_addr()) {
        (Ok(peer), Ok(local)) => {
            let peer = peer.ip().to_canonical();
            peer.is_loopback() || peer == local.ip().to_canonical()
        }
        _ => true,
    }
}

/// Run `op` on the socket once it is writable, until it stops answering "would block".
fn poll_writable<T>(
    socket: &TcpStream,
    cx: &mut Context<'_>,
    mut op: impl FnMut() -> io::Result<T>,
) -> Poll<io::Result<T>> {
    loop {
        ready!(socket.poll_write_ready(cx))?;
        match socket.try_io(Interest::WRITABLE, &mut op) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            done => return Poll::Ready(done),
        }
    }
}

impl AsyncRead for Lending {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().socket).poll_read(cx, buf)
    }
}

impl AsyncWrite for Lending {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Pipe::Off = this.pipe {
            // Not even a look at the pool's registry (a lock all connections share).
            return Pin::new(&mut this.socket).poll_write_vectored(cx, bufs);
        }
        ready!(this.poll_drain(cx))?;
        let most = this.most(bufs);
        let lendable = bufs.iter().position(|b| {
            b.len() >= LEND_MIN && cache_core::buffers::lendable(b, most) >= LEND_MIN
        });
        let Some(at) = lendable.filter(|_| this.pipe().is_some()) else {
            return Pin::new(&mut this.socket).poll_write_vectored(cx, bufs);
        };
        let before = &bufs[..at];
        if before.iter().any(|b| !b.is_empty()) {
            // What comes before the body (its head) first, held back to leave with the body's
            // first bytes rather than in a packet of its own.
            return match before {
                [one] => poll_writable(&this.socket, cx, || {
                    Ok(send(&this.socket, one, SendFlags::MORE)?)
                }),
                _ => Pin::new(&mut this.socket).poll_write_vectored(cx, before),
            };
        }
        let Some(pipe) = this.pipe() else {
            unreachable!("checked above");
        };
        // Every slice before it is empty, so the bytes lent are the first bytes written.
        match cache_core::buffers::lend_into_pipe(pipe, &bufs[at]) {
            Ok(0) => Pin::new(&mut this.socket).poll_write_vectored(cx, &bufs[..=at]),
            Ok(n) => {
                this.piped = n;
                // Start them on their way; a full socket leaves them for the next call.
                if let Poll::Ready(Err(e)) = this.poll_drain(cx) {
                    return Poll::Ready(Err(e));
                }
                Poll::Ready(Ok(n))
            }
            Err(e) => {
                tracing::debug!(error = %e, "vmsplice failed; this connection copies");
                this.pipe = Pipe::Off;
                Pin::new(&mut this.socket).poll_write_vectored(cx, bufs)
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.socket).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.socket).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use cache_core::buffers::AlignedBuf;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A connection on loopback whose server side lends (as to a client on another host).
    async fn pair() -> (Lending, TcpStream) {
        pair_sending(SendByReference::Always).await
    }

    async fn pair_sending(by_reference: SendByReference) -> (Lending, TcpStream) {
        pair_counted(by_reference, quiet()).await
    }

    /// A count of its own, whose spans last an hour: a test never sees one turn, nor another
    /// test's connections.
    fn quiet() -> &'static Busy {
        Box::leak(Box::new(Busy::new(Duration::from_secs(3600))))
    }

    async fn pair_counted(
        by_reference: SendByReference,
        busy: &'static Busy,
    ) -> (Lending, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let client = TcpStream::connect(listener.local_addr().expect("addr"))
            .await
            .expect("connect");
        let (server, _) = listener.accept().await.expect("accept");
        (Lending::counted_by(server, by_reference, busy), client)
    }

    /// Write a response of `body` through `server`: whether its bytes were lent (the pipe
    /// opened), after checking that the client got the response whole.
    async fn lends(mut server: Lending, mut client: TcpStream, body: &[u8]) -> bool {
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.expect("read");
            got
        });
        write_all_vectored(&mut server, &[HEAD, body]).await;
        let lent = matches!(server.pipe, Pipe::Open { .. });
        server.shutdown().await.expect("shutdown");
        assert_eq!(reader.await.expect("reader"), [HEAD, body].concat());
        lent
    }

    /// A body in one of cache-core's pooled buffers, read as often as a hot block's.
    fn pooled(len: usize, byte: impl Fn(usize) -> u8) -> Bytes {
        let mut buf = AlignedBuf::reused(len);
        for (i, b) in buf.as_mut_slice().iter_mut().enumerate() {
            *b = byte(i);
        }
        let bytes = buf.freeze(0, len);
        for _ in 0..cache_core::buffers::LEND_AFTER_READS {
            cache_core::buffers::read_again(&bytes);
        }
        bytes
    }

    /// Write all of `bufs` through `io` with vectored writes, as hyper writes a response.
    async fn write_all_vectored(io: &mut Lending, bufs: &[&[u8]]) {
        let mut left: Vec<&[u8]> = bufs.to_vec();
        while !left.is_empty() {
            let slices: Vec<IoSlice<'_>> = left.iter().map(|b| IoSlice::new(b)).collect();
            let mut n = io.write_vectored(&slices).await.expect("write");
            assert!(n > 0);
            while n > 0 {
                if n >= left[0].len() {
                    n -= left[0].len();
                    left.remove(0);
                } else {
                    left[0] = &left[0][n..];
                    n = 0;
                }
            }
        }
    }

    const HEAD: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\n";

    #[tokio::test]
    async fn a_large_pooled_body_leaves_by_reference_in_order() {
        let (mut server, mut client) = pair().await;
        let body = pooled(3 * LEND_MIN + 5 * 4096 + 11, |i| (i % 251) as u8);
        let tail: &[u8] = b"\r\n0\r\n\r\n";
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.expect("read");
            got
        });
        write_all_vectored(&mut server, &[HEAD, &body, tail]).await;
        assert!(
            matches!(server.pipe, Pipe::Open { .. }),
            "the body was lent"
        );
        server.shutdown().await.expect("shutdown");
        let got = reader.await.expect("reader");
        assert_eq!(got, [HEAD, &body[..], tail].concat());
    }

    #[tokio::test]
    async fn a_client_on_this_host_is_lent_small_blocks_only_unless_told_otherwise() {
        let (small, large) = (LOCAL_LEND_MAX, LOCAL_LEND_MAX + 4096);
        for (by_reference, len, lent) in [
            (SendByReference::Auto, LEND_MIN, true),
            (SendByReference::Auto, small, true),
            (SendByReference::Auto, large, false),
            (SendByReference::Remote, small, false),
            (SendByReference::Never, small, false),
            (SendByReference::Always, small, true),
            (SendByReference::Always, large, true),
        ] {
            let (server, client) = pair_sending(by_reference).await;
            assert!(on_this_host(&server.socket), "loopback is this host");
            let body = pooled(len, |i| (i % 7) as u8);
            assert_eq!(
                lends(server, client, &body).await,
                lent,
                "{by_reference:?}, {len} bytes"
            );
        }
    }

    #[test]
    fn busy_counts_each_connection_once_a_span_and_forgets_after_a_quiet_one() {
        let busy = Busy::new(BUSY_SPAN);
        let mut conns = [0u64; 3];
        // Span 1: all three, each counted once however often it writes.
        for _ in 0..4 {
            for c in &mut conns {
                busy.count_in(1, c);
            }
        }
        assert_eq!(busy.count_in(1, &mut conns[0]), 3);
        // Span 2: one so far, but the three of span 1 still count.
        assert_eq!(busy.count_in(2, &mut conns[0]), 3);
        assert_eq!(busy.count_in(2, &mut conns[1]), 3);
        // Span 3: span 2 had two.
        assert_eq!(busy.count_in(3, &mut conns[0]), 2);
        // Span 5, after a span with none: only itself.
        assert_eq!(busy.count_in(5, &mut conns[2]), 1);
    }

    #[tokio::test]
    async fn a_client_on_this_host_is_lent_blocks_of_1_mib_while_eight_connections_are_busy() {
        let block = LOCAL_BUSY_LEND_MAX;
        for (others, len, lent) in [
            (0, block, false),
            (LOCAL_BUSY_MIN - 2, block, false),
            (LOCAL_BUSY_MIN - 1, block, true),
            (LOCAL_BUSY_MIN - 1, block + 4096, false),
        ] {
            let busy = quiet();
            for _ in 0..others {
                busy.count(&mut 0);
            }
            let (server, client) = pair_counted(SendByReference::Auto, busy).await;
            let body = pooled(len, |i| (i % 13) as u8);
            assert_eq!(
                lends(server, client, &body).await,
                lent,
                "{others} other connections busy, {len} bytes"
            );
        }
    }

    #[tokio::test]
    async fn bytes_of_other_memory_are_copied() {
        let (mut server, mut client) = pair().await;
        let body = Bytes::from(
            (0..4 * LEND_MIN)
                .map(|i| (i % 13) as u8)
                .collect::<Vec<_>>(),
        );
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.expect("read");
            got
        });
        write_all_vectored(&mut server, &[HEAD, &body]).await;
        assert!(
            matches!(server.pipe, Pipe::Unopened),
            "no pipe for memory not the pool's"
        );
        server.shutdown().await.expect("shutdown");
        assert_eq!(reader.await.expect("reader"), [HEAD, &body[..]].concat());
    }

    #[tokio::test]
    async fn a_client_reading_late_gets_the_bytes_sent_though_their_buffer_was_reused() {
        let (mut server, mut client) = pair().await;
        // A length no other test uses, so the pool hands this buffer back below.
        let len = PIPE_SIZE - 5 * 4096;
        assert!(len >= LEND_MIN);
        let body = pooled(len, |_| 0xA1);
        let at = body.as_ptr();
        // The client reads nothing yet: the body waits in the pipe and the socket, by reference.
        tokio::time::timeout(
            Duration::from_secs(10),
            write_all_vectored(&mut server, &[HEAD, &body]),
        )
        .await
        .expect("the pipe took the body without the client reading");
        // The response is written as far as hyper knows: its bytes are dropped, the memory
        // tier evicts the block, and the next fill takes the buffer and overwrites it.
        drop(body);
        let again = pooled(len, |_| 0x5E);
        assert_eq!(again.as_ptr(), at, "the pool gave the same buffer back");
        let (sent, got) = tokio::join!(
            async {
                server.shutdown().await.expect("shutdown");
            },
            async {
                let mut got = Vec::new();
                client.read_to_end(&mut got).await.expect("read");
                got
            }
        );
        let () = sent;
        assert_eq!(&got[..HEAD.len()], HEAD);
        assert_eq!(got.len(), HEAD.len() + len);
        assert!(
            got[HEAD.len()..].iter().all(|&b| b == 0xA1),
            "the client got the bytes sent, not what the buffer holds now"
        );
    }
}
