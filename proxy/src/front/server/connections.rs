//! Client connections on the S3 listener: at most `max_connections` at once, each closed when
//! it sends no first request within `client_header_timeout` or moves no bytes for
//! `client_idle_timeout`, HTTP/1.1 or HTTP/2 (by ALPN under TLS), and drained at shutdown.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, SendByReference};
use crate::front::tls::TlsConfig;

use super::gather::{FlushedAfter, Gathered};
use super::inline::InlineFirst;
use super::lend::Lending;

/// What one client may hold of a listener, and how its large bodies are sent.
#[derive(Debug, Clone, Copy)]
pub(super) struct ClientLimits {
    /// Most connections open at once.
    pub(super) max_connections: usize,
    /// Longest wait for a request's headers, and for a connection's first request.
    pub(super) header_timeout: Duration,
    /// Longest a connection may stay with no bytes moving either way.
    pub(super) idle_timeout: Duration,
    /// Most requests in flight on one HTTP/2 connection.
    pub(super) max_streams: u32,
    /// Which cleartext HTTP/1.1 clients get large cached bodies by reference ([`Lending`]).
    pub(super) send_by_reference: SendByReference,
}

impl From<&Config> for ClientLimits {
    fn from(config: &Config) -> Self {
        Self {
            max_connections: config.max_connections,
            header_timeout: config.client_header_timeout.0,
            idle_timeout: config.client_idle_timeout.0,
            max_streams: config.client_max_streams,
            send_by_reference: config.send_by_reference,
        }
    }
}

/// A listener's accept loop. Unlike `axum::serve` it caps open connections (a permit per
/// connection, taken before accepting, so at the cap new clients wait in the backlog), closes
/// connections whose TLS handshake or first request does not arrive in time or that sit idle
/// (HTTP/1 and HTTP/2 alike: see [`Activity`]), and terminates TLS.
pub(super) async fn serve_clients<S>(
    listener: TcpListener,
    service: S,
    limits: ClientLimits,
    tls: Option<TlsConfig>,
    shutdown: CancellationToken,
) -> std::io::Result<()>
where
    S: tower::Service<
            http::Request<hyper::body::Incoming>,
            Response = http::Response<axum::body::Body>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    // HTTP/2 streams done on their first poll stay in the connection's task ([`InlineFirst`]).
    let mut http = ConnBuilder::new(InlineFirst);
    http.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    // No keep-alive pings: their traffic would keep an idle connection "active" forever. The
    // idle timeout closes dead and idle peers alike.
    http.http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_streams)
        .max_header_list_size(64 * 1024);
    loop {
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break,
            },
            () = shutdown.cancelled() => break,
        };
        let socket = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((socket, _)) => socket,
                Err(e) => {
                    // Out of file descriptors and the like: back off rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        let _ = socket.set_nodelay(true);
        let (http, inner, tls, shutdown) =
            (http.clone(), service.clone(), tls.clone(), shutdown.clone());
        tokio::spawn(async move {
            let activity = Arc::new(Activity::new());
            let seen = activity.clone();
            let service = TowerToHyperService::new(tower::ServiceExt::map_request(
                inner,
                move |req: http::Request<hyper::body::Incoming>| {
                    seen.requested();
                    req
                },
            ));
            match tls {
                None => {
                    // Nothing decided within the header timeout: no request came.
                    let h2 = tokio::select! {
                        h2 = speaks_h2(&socket, limits.header_timeout) => h2,
                        () = shutdown.cancelled() => None,
                    };
                    let Some(h2) = h2 else {
                        return;
                    };
                    if h2 {
                        let io = Tracked::new(socket, activity.clone());
                        serve_one(&http, io, h2, service, &activity, limits, &shutdown).await
                    } else {
                        // Large bodies of cached bytes may leave by reference ([`super::lend`]).
                        let lending = Lending::new(socket, limits.send_by_reference);
                        let io = Tracked::new(lending, activity.clone());
                        serve_one(&http, io, h2, service, &activity, limits, &shutdown).await
                    }
                }
                Some(tls) => {
                    let io = Tracked::new(socket, activity.clone());
                    let handshake = tokio::time::timeout(limits.header_timeout, tls.accept(io));
                    match handshake.await {
                        Ok(Ok(stream)) => {
                            let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
                            serve_one(&http, stream, h2, service, &activity, limits, &shutdown)
                                .await
                        }
                        Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                        Err(_) => {}
                    }
                }
            }
            drop(permit);
        });
    }
    // Close the listening socket first: while it stays open the kernel would go on completing
    // handshakes into its backlog, connections no one will ever serve, which clients see as a
    // hang instead of a refusal they can retry elsewhere.
    drop(listener);
    // Wait for the connections to finish their responses (each gave its permit back), then close
    // whatever is still running.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    tokio::select! {
        _ = slots.acquire_many(all) => {}
        () = tokio::time::sleep(Duration::from_secs(30)) => tracing::warn!("responses still running after 30s; closing them"),
    }
    Ok(())
}

/// The first bytes of an HTTP/2 connection with prior knowledge (RFC 9113, 3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Whether a cleartext connection speaks HTTP/2, from its first bytes, left unread for hyper.
/// `None` when they do not come within `within` or the client closes first.
async fn speaks_h2(socket: &tokio::net::TcpStream, within: Duration) -> Option<bool> {
    let decided = async {
        let mut first = [0u8; H2_PREFACE.len()];
        loop {
            let n = socket.peek(&mut first).await.ok()?;
            if n == 0 {
                return None;
            }
            if first[..n] != H2_PREFACE[..n] {
                return Some(false);
            }
            if n == H2_PREFACE.len() {
                return Some(true);
            }
            // A preface in pieces: `peek` would return the same bytes again at once.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::time::timeout(within, decided).await.ok().flatten()
}

/// Serve one connection until it ends, closing it gracefully (in-flight responses finish) on
/// shutdown, when no first request arrives within `header_timeout`, or when nothing has moved
/// for `idle_timeout`. A connection still open `header_timeout` after being asked to close is
/// dropped. An HTTP/2 connection's (`h2`) writes are gathered ([`super::gather`]).
async fn serve_one<I, S>(
    http: &ConnBuilder<InlineFirst>,
    io: I,
    h2: bool,
    service: S,
    activity: &Activity,
    limits: ClientLimits,
    shutdown: &CancellationToken,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::Service<
            http::Request<hyper::body::Incoming>,
            Response = http::Response<axum::body::Body>,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (io, gather) = Gathered::new(io, h2);
    let mut conn = FlushedAfter::new(http.serve_connection(TokioIo::new(io), service), gather);
    let tick = (limits.header_timeout.min(limits.idle_timeout) / 4).max(Duration::from_millis(50));
    let mut closing: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            _ = &mut conn => return,
            () = shutdown.cancelled(), if closing.is_none() => {
                if let Some(c) = conn.conn() {
                    c.graceful_shutdown();
                }
                closing = Some(tokio::time::Instant::now());
            }
            () = tokio::time::sleep(tick) => {
                match closing {
                    Some(since) if since.elapsed() > limits.header_timeout => return,
                    Some(_) => {}
                    None => if let Some(why) = activity.expired(limits) {
                        tracing::debug!(why, "closing a client connection");
                        if let Some(c) = conn.conn() {
                            c.graceful_shutdown();
                        }
                        closing = Some(tokio::time::Instant::now());
                    }
                }
            }
        }
    }
}

/// When a connection last moved bytes, and whether it ever sent a request.
///
/// Reads and writes only raise a flag; the idle check, every tick, notes the time when it
/// finds the flag raised. A clock read per read and write cost a 4 KiB hit about half a
/// percent of its CPU. The check only ever ran at ticks, so an idle connection was closed up
/// to a tick past the timeout; counted from the tick after its last bytes, now up to two.
struct Activity {
    opened: Instant,
    /// Raised by every read or write that moved bytes; lowered by [`Activity::expired`].
    moved: AtomicBool,
    /// Milliseconds after `opened` at which [`Activity::expired`] last found bytes moved.
    last: AtomicU64,
    requested: AtomicBool,
}

impl Activity {
    fn new() -> Self {
        Self {
            opened: Instant::now(),
            moved: AtomicBool::new(false),
            last: AtomicU64::new(0),
            requested: AtomicBool::new(false),
        }
    }

    fn moved(&self) {
        self.moved.store(true, Ordering::Relaxed);
    }

    fn requested(&self) {
        self.requested.store(true, Ordering::Relaxed);
    }

    /// Why the connection should close now, if it should.
    fn expired(&self, limits: ClientLimits) -> Option<&'static str> {
        let age = self.opened.elapsed();
        if self.moved.swap(false, Ordering::Relaxed) {
            let ms = u64::try_from(age.as_millis()).unwrap_or(u64::MAX);
            self.last.store(ms, Ordering::Relaxed);
        }
        if !self.requested.load(Ordering::Relaxed) && age > limits.header_timeout {
            return Some("no request within client_header_timeout");
        }
        let last = Duration::from_millis(self.last.load(Ordering::Relaxed));
        (age.saturating_sub(last) > limits.idle_timeout).then_some("idle for client_idle_timeout")
    }
}

/// A connection's socket that notes in [`Activity`] every time bytes move.
struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S> Tracked<S> {
    fn new(inner: S, activity: Arc<Activity>) -> Self {
        Self { inner, activity }
    }

    /// Pass a write's result on, noting activity if any byte went out.
    fn wrote(
        &self,
        polled: std::task::Poll<std::io::Result<usize>>,
    ) -> std::task::Poll<std::io::Result<usize>> {
        if let std::task::Poll::Ready(Ok(n)) = &polled {
            if *n > 0 {
                self.activity.moved();
            }
        }
        polled
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.moved();
        }
        polled
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        self.wrote(polled)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.wrote(polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
