//! The benchmarks' stand-in for S3's latency: an HTTP/1.1 pass-through in front of the real S3
//! server (MinIO) that holds every request for 20–50 ms (with a tail) before forwarding it, and
//! counts what it forwards, so misses cost what they cost against S3 and upstream requests are
//! counted where they land, not by the caches under test.
//!
//! It is written in Rust rather than reusing the e2e suite's Python pass-through because the
//! baseline "direct to S3" runs push GiB/s through it on the same two cores as the caches under
//! test: a pass-through that is itself the bottleneck would flatter every cache.
//!
//! It parses only request heads (to delay and count each request, including the ones a
//! keep-alive connection carries one after another) and copies everything else untouched.
//! With `--tls-listen ADDR --tls-cert PEM --tls-key PEM` it serves the same over TLS on a
//! second port, as S3 speaks HTTPS. Control requests on their own connection (either port):
//! `GET /__proxy/stats`, `GET /__proxy/reset`,
//! `GET /__proxy/latency?delay_ms=20&jitter_ms=30&tail_fraction=0.01&tail_ms=200`, and
//! `GET /__proxy/limits?connection_mbps=90&prefix_rps=5500`.
//!
//! Two limits model what S3 does beyond latency, both off by default:
//! - **per-connection bandwidth** (`--connection-mbps`, MB/s of response bytes per connection):
//!   one S3 connection delivers roughly 80-100 MB/s, which is why the AWS CRT, Mountpoint and
//!   the S3 connectors split large reads into parallel ranged GETs; 90 is the value to model S3;
//! - **a request rate per prefix** (`--prefix-rps`, requests per second per bucket and first key
//!   segment, one second of burst): S3 answers `503 SlowDown` past about 5,500 GETs per second
//!   per prefix. A refused request is answered here, never forwarded, and counted as `SlowDown`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const MAX_HEAD: usize = 64 * 1024;

/// S3's answer past a prefix's request rate.
const SLOW_DOWN_BODY: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>";

/// Added latency, in microseconds (and parts per million for the tail's share).
#[derive(Default)]
struct Latency {
    delay_us: AtomicU64,
    jitter_us: AtomicU64,
    tail_ppm: AtomicU64,
    tail_us: AtomicU64,
}

impl Latency {
    fn set(&self, delay_ms: f64, jitter_ms: f64, tail_fraction: f64, tail_ms: f64) {
        self.delay_us
            .store((delay_ms * 1e3) as u64, Ordering::Relaxed);
        self.jitter_us
            .store((jitter_ms * 1e3) as u64, Ordering::Relaxed);
        self.tail_ppm
            .store((tail_fraction * 1e6) as u64, Ordering::Relaxed);
        self.tail_us
            .store((tail_ms * 1e3) as u64, Ordering::Relaxed);
    }

    fn sample(&self, rng: &mut Rng) -> Duration {
        let mut us = self.delay_us.load(Ordering::Relaxed);
        let jitter = self.jitter_us.load(Ordering::Relaxed);
        if jitter > 0 {
            us += rng.next() % (jitter + 1);
        }
        if rng.next() % 1_000_000 < self.tail_ppm.load(Ordering::Relaxed) {
            us += self.tail_us.load(Ordering::Relaxed);
        }
        Duration::from_micros(us)
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "delay_ms": self.delay_us.load(Ordering::Relaxed) as f64 / 1e3,
            "jitter_ms": self.jitter_us.load(Ordering::Relaxed) as f64 / 1e3,
            "tail_fraction": self.tail_ppm.load(Ordering::Relaxed) as f64 / 1e6,
            "tail_ms": self.tail_us.load(Ordering::Relaxed) as f64 / 1e3,
        })
    }
}

/// xorshift64*: enough randomness for latency jitter, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Most prefixes the rate limit tracks; past it the table starts over (a benchmark tool: a
/// bound, not fairness, is what matters).
const MAX_PREFIXES: usize = 10_000;

/// What S3 limits beyond latency; 0 turns a limit off.
#[derive(Default)]
struct Limits {
    /// Response bytes per second per connection.
    connection_bps: AtomicU64,
    /// Requests per second per prefix.
    prefix_rps: AtomicU64,
    /// Token buckets by prefix: (tokens, when last refilled).
    prefixes: Mutex<std::collections::HashMap<String, (f64, std::time::Instant)>>,
}

impl Limits {
    fn set(&self, connection_mbps: f64, prefix_rps: f64) {
        self.connection_bps
            .store((connection_mbps * 1e6) as u64, Ordering::Relaxed);
        self.prefix_rps.store(prefix_rps as u64, Ordering::Relaxed);
        self.prefixes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Whether a request for `target` may go on now (a token of its prefix's bucket taken).
    fn admit(&self, target: &str, now: std::time::Instant) -> bool {
        let rps = self.prefix_rps.load(Ordering::Relaxed) as f64;
        if rps == 0.0 {
            return true;
        }
        let mut prefixes = self.prefixes.lock().unwrap_or_else(|e| e.into_inner());
        if prefixes.len() >= MAX_PREFIXES {
            prefixes.clear();
        }
        let (tokens, last) = prefixes
            .entry(prefix(target).to_owned())
            .or_insert((rps, now));
        *tokens = (*tokens + now.duration_since(*last).as_secs_f64() * rps).min(rps);
        *last = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "connection_mbps": self.connection_bps.load(Ordering::Relaxed) as f64 / 1e6,
            "prefix_rps": self.prefix_rps.load(Ordering::Relaxed),
        })
    }
}

/// The prefix S3 would partition a request under: its bucket and the key's first segment
/// (`/bucket/a/b?x` → `/bucket/a`).
fn prefix(target: &str) -> &str {
    let path = target.split('?').next().unwrap_or("");
    let mut slashes = path.match_indices('/').map(|(i, _)| i).skip(2);
    match slashes.next() {
        Some(end) => &path[..end],
        None => path,
    }
}

/// Paces one connection's response bytes at a rate, with a small burst so that an idle
/// connection does not bank credit.
struct Pacer {
    tokens: f64,
    last: tokio::time::Instant,
}

impl Pacer {
    const BURST: f64 = 256.0 * 1024.0;

    fn new() -> Self {
        Self {
            tokens: Self::BURST,
            last: tokio::time::Instant::now(),
        }
    }

    /// How long to wait before sending `bytes` at `rate` bytes/s (0: unlimited); takes them.
    fn take(&mut self, bytes: usize, rate: u64) -> Duration {
        if rate == 0 {
            return Duration::ZERO;
        }
        let now = tokio::time::Instant::now();
        let rate = rate as f64;
        self.tokens =
            (self.tokens + now.duration_since(self.last).as_secs_f64() * rate).min(Self::BURST);
        self.last = now;
        self.tokens -= bytes as f64;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / rate)
        }
    }
}

#[derive(Default)]
struct Stats {
    by_method: Mutex<BTreeMap<String, u64>>,
    response_bytes: AtomicU64,
    /// Client connections that sent a request: with `requests`, how well clients reuse them.
    connections: AtomicU64,
}

impl Stats {
    fn count(&self, method: &str) {
        let mut m = self.by_method.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry(method.to_owned()).or_default() += 1;
    }

    fn json(&self) -> serde_json::Value {
        let m = self.by_method.lock().unwrap_or_else(|e| e.into_inner());
        serde_json::json!({
            "requests": m.values().sum::<u64>(),
            "by_method": *m,
            "response_bytes": self.response_bytes.load(Ordering::Relaxed),
            "connections": self.connections.load(Ordering::Relaxed),
        })
    }

    fn reset(&self) {
        self.by_method
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.response_bytes.store(0, Ordering::Relaxed);
        self.connections.store(0, Ordering::Relaxed);
    }
}

struct Proxy {
    upstream: SocketAddr,
    latency: Latency,
    limits: Limits,
    stats: Stats,
    connections: AtomicU64,
}

/// One parsed request head: its length in the buffer and what follows it.
struct Head {
    len: usize,
    method: String,
    target: String,
    content_length: u64,
    chunked: bool,
}

fn parse_head(buf: &[u8]) -> anyhow::Result<Option<Head>> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        if buf.len() > MAX_HEAD {
            bail!("request head over {MAX_HEAD} bytes");
        }
        return Ok(None);
    };
    let text = std::str::from_utf8(&buf[..end]).context("request head is not UTF-8")?;
    let mut lines = text.split("\r\n");
    let mut first = lines.next().unwrap_or("").split(' ');
    let method = first.next().unwrap_or("").to_owned();
    let target = first.next().unwrap_or("").to_owned();
    let (mut content_length, mut chunked) = (0, false);
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            content_length = value.parse().context("bad Content-Length")?;
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.to_ascii_lowercase().contains("chunked");
        }
    }
    Ok(Some(Head {
        len: end + 4,
        method,
        target,
        content_length,
        chunked,
    }))
}

/// Reads until `buf` holds a whole request head; `None` when the client closed first.
async fn read_head<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
) -> anyhow::Result<Option<Head>> {
    loop {
        if let Some(head) = parse_head(buf)? {
            return Ok(Some(head));
        }
        let mut chunk = [0u8; 16 * 1024];
        let n = r.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

impl Proxy {
    async fn serve<S>(self: Arc<Self>, client: S) -> anyhow::Result<()>
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (mut cr, mut cw) = tokio::io::split(client);
        let mut buf = Vec::new();
        let Some(first) = read_head(&mut cr, &mut buf).await? else {
            return Ok(());
        };
        if first.target.starts_with("/__proxy/") {
            return self.control(&first.target, &mut cw).await;
        }
        let upstream = TcpStream::connect(self.upstream).await?;
        upstream.set_nodelay(true)?;
        let (mut ur, mut uw) = upstream.into_split();
        let this = self.clone();
        // Answers refused by the rate limit, written in order with the forwarded ones: a refused
        // request's answer must not overtake the answer of one forwarded before it.
        let (refusals, mut refused) = tokio::sync::mpsc::channel::<()>(1);
        let responses = tokio::spawn(async move {
            let mut chunk = vec![0u8; 256 * 1024];
            let mut pacer = Pacer::new();
            let slow_down = format!(
                "HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\r\n{SLOW_DOWN_BODY}",
                SLOW_DOWN_BODY.len()
            );
            loop {
                tokio::select! {
                    biased;
                    r = ur.read(&mut chunk) => {
                        let n = match r {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        this.stats
                            .response_bytes
                            .fetch_add(n as u64, Ordering::Relaxed);
                        let rate = this.limits.connection_bps.load(Ordering::Relaxed);
                        // Sent in slices of at most 64 KiB, each when the pace allows it.
                        for part in chunk[..n].chunks(64 * 1024) {
                            // A zero sleep would still wait for the timer's next tick (1 ms).
                            let wait = pacer.take(part.len(), rate);
                            if !wait.is_zero() {
                                tokio::time::sleep(wait).await;
                            }
                            // Flushed too: over TLS, a write the socket could not take all of
                            // leaves encrypted records in the session until the next write or
                            // flush, and the body's end would wait there (as a stall of the
                            // reader) for a next response that may never come.
                            if cw.write_all(part).await.is_err() || cw.flush().await.is_err() {
                                return;
                            }
                        }
                    }
                    Some(()) = refused.recv() => {
                        if cw.write_all(slow_down.as_bytes()).await.is_err() || cw.flush().await.is_err() {
                            return;
                        }
                    }
                }
            }
            let _ = cw.shutdown().await;
        });
        let seed = self.connections.fetch_add(1, Ordering::Relaxed);
        self.stats.connections.fetch_add(1, Ordering::Relaxed);
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ seed.wrapping_mul(0xBF58_476D_1CE4_E5B9) | 1);
        let mut head = Some(first);
        while let Some(h) = head.take() {
            if !self.limits.admit(&h.target, std::time::Instant::now()) {
                // Refused: answered here, the body dropped. Only requests without a body are
                // refused, so that the answer can follow the previous one (a keep-alive
                // connection carries one request at a time from S3 clients, which wait).
                if h.content_length == 0 && !h.chunked {
                    self.stats.count("SlowDown");
                    buf.drain(..h.len);
                    refusals.send(()).await?;
                    head = read_head(&mut cr, &mut buf).await?;
                    continue;
                }
            }
            self.stats.count(&h.method);
            tokio::time::sleep(self.latency.sample(&mut rng)).await;
            uw.write_all(&buf[..h.len]).await?;
            buf.drain(..h.len);
            if h.chunked {
                // Not parsed: the rest of the connection is copied as it is, undelayed.
                uw.write_all(&buf).await?;
                tokio::io::copy(&mut cr, &mut uw).await?;
                break;
            }
            copy_body(&mut cr, &mut uw, &mut buf, h.content_length).await?;
            head = read_head(&mut cr, &mut buf).await?;
        }
        drop(refusals);
        let _ = uw.shutdown().await;
        let _ = responses.await;
        Ok(())
    }

    async fn control<W: AsyncWrite + Unpin>(&self, target: &str, w: &mut W) -> anyhow::Result<()> {
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let body = match path {
            "/__proxy/stats" => self.stats.json(),
            "/__proxy/reset" => {
                self.stats.reset();
                self.stats.json()
            }
            "/__proxy/latency" => {
                let get = |name| query_num(query, name);
                self.latency.set(
                    get("delay_ms"),
                    get("jitter_ms"),
                    get("tail_fraction"),
                    get("tail_ms"),
                );
                self.latency.json()
            }
            "/__proxy/limits" => {
                let get = |name| query_num(query, name);
                self.limits.set(get("connection_mbps"), get("prefix_rps"));
                self.limits.json()
            }
            _ => serde_json::json!({"error": "unknown control path"}),
        }
        .to_string();
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        w.write_all(response.as_bytes()).await?;
        w.shutdown().await?;
        Ok(())
    }
}

/// The number a query string gives `name`, 0 if none.
fn query_num(query: &str, name: &str) -> f64 {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == name)
        .and_then(|(_, v)| v.parse::<f64>().ok())
        .unwrap_or(0.0)
}

/// Forwards `len` body bytes: first what is already buffered, then from the client.
async fn copy_body<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    r: &mut R,
    w: &mut W,
    buf: &mut Vec<u8>,
    len: u64,
) -> anyhow::Result<()> {
    let buffered = (buf.len() as u64).min(len) as usize;
    w.write_all(&buf[..buffered]).await?;
    buf.drain(..buffered);
    let rest = len - buffered as u64;
    if rest > 0 {
        let copied = tokio::io::copy(&mut r.take(rest), w).await?;
        if copied < rest {
            bail!("client closed mid-body");
        }
    }
    Ok(())
}

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: larder-latency-proxy --listen ADDR --upstream ADDR [--delay-ms 20] [--jitter-ms 30] [--tail-fraction 0.01] [--tail-ms 200] [--connection-mbps 0] [--prefix-rps 0] [--tls-listen ADDR --tls-cert PEM --tls-key PEM]";
    let listen: SocketAddr = flag(&args, "--listen").context(usage)?.parse()?;
    let upstream: SocketAddr = flag(&args, "--upstream").context(usage)?.parse()?;
    let num = |name: &str, default: f64| -> anyhow::Result<f64> {
        flag(&args, name).map_or(Ok(default), |v| {
            v.parse().with_context(|| format!("{name} {v}"))
        })
    };
    let proxy = Arc::new(Proxy {
        upstream,
        latency: Latency::default(),
        limits: Limits::default(),
        stats: Stats::default(),
        connections: AtomicU64::new(0),
    });
    proxy.latency.set(
        num("--delay-ms", 20.0)?,
        num("--jitter-ms", 30.0)?,
        num("--tail-fraction", 0.01)?,
        num("--tail-ms", 200.0)?,
    );
    proxy
        .limits
        .set(num("--connection-mbps", 0.0)?, num("--prefix-rps", 0.0)?);
    let listener = TcpListener::bind(listen).await?;
    println!("listening on {}", listener.local_addr()?);
    if let Some(tls_listen) = flag(&args, "--tls-listen") {
        let cert = flag(&args, "--tls-cert").context("--tls-listen needs --tls-cert")?;
        let key = flag(&args, "--tls-key").context("--tls-listen needs --tls-key")?;
        let acceptor = tls_acceptor(&cert, &key)?;
        let tls = TcpListener::bind(tls_listen.parse::<SocketAddr>()?).await?;
        println!("listening with TLS on {}", tls.local_addr()?);
        tokio::spawn(serve_tls(tls, acceptor, proxy.clone()));
    }
    loop {
        let (conn, _) = listener.accept().await?;
        conn.set_nodelay(true)?;
        let proxy = proxy.clone();
        tokio::spawn(async move {
            if let Err(e) = proxy.serve(conn).await {
                eprintln!("connection: {e:#}");
            }
        });
    }
}

/// S3 speaks HTTPS: with `--tls-listen`, the same pass-through is served over TLS on a second
/// port (the plain one stays, for the control requests and for plain clients), so that the
/// benchmarks' clients and caches pay for TLS as they do against S3.
fn tls_acceptor(cert: &str, key: &str) -> anyhow::Result<tokio_rustls::TlsAcceptor> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("reading {cert}"))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("reading {cert}"))?;
    let key = PrivateKeyDer::from_pem_file(key).with_context(|| format!("reading {key}"))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

async fn serve_tls(listener: TcpListener, acceptor: tokio_rustls::TlsAcceptor, proxy: Arc<Proxy>) {
    loop {
        let Ok((conn, _)) = listener.accept().await else {
            continue;
        };
        let _ = conn.set_nodelay(true);
        let (acceptor, proxy) = (acceptor.clone(), proxy.clone());
        tokio::spawn(async move {
            let result = match acceptor.accept(conn).await {
                Ok(tls) => proxy.serve(tls).await,
                Err(e) => Err(e.into()),
            };
            if let Err(e) = result {
                eprintln!("TLS connection: {e:#}");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_are_parsed_only_when_whole() {
        assert!(parse_head(b"GET /b/k HTTP/1.1\r\nHost: x\r\n")
            .unwrap()
            .is_none());
        let h = parse_head(b"PUT /b/k HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello")
            .unwrap()
            .unwrap();
        assert_eq!((h.method.as_str(), h.target.as_str()), ("PUT", "/b/k"));
        assert_eq!((h.len, h.content_length, h.chunked), (40, 5, false));
        assert!(parse_head(&vec![b'a'; MAX_HEAD + 1]).is_err());
    }

    #[test]
    fn prefixes_are_bucket_and_first_key_segment() {
        assert_eq!(prefix("/b/a/b/c?x=1"), "/b/a");
        assert_eq!(prefix("/b/key"), "/b/key");
        assert_eq!(prefix("/b"), "/b");
        assert_eq!(prefix("/b/?list-type=2"), "/b/");
    }

    #[test]
    fn the_rate_limit_refuses_past_a_second_of_burst_per_prefix() {
        let l = Limits::default();
        let now = std::time::Instant::now();
        assert!((0..1000).all(|_| l.admit("/b/a/x", now)), "off by default");
        l.set(0.0, 10.0);
        assert_eq!((0..20).filter(|_| l.admit("/b/a/x", now)).count(), 10);
        assert!(
            l.admit("/b/other/x", now),
            "another prefix has its own bucket"
        );
        assert!(
            l.admit("/b/a/y", now + Duration::from_millis(150)),
            "refills"
        );
    }

    #[test]
    fn the_pacer_holds_a_connection_to_its_rate() {
        let mut p = Pacer::new();
        assert_eq!(p.take(1 << 20, 0), Duration::ZERO, "unlimited");
        let mut p = Pacer::new();
        let rate = 10 << 20;
        let waited: Duration = (0..40).map(|_| p.take(256 << 10, rate)).max().unwrap();
        // 10 MiB at 10 MiB/s, less the burst: the last slice waits most of a second.
        assert!(waited > Duration::from_millis(900), "{waited:?}");
    }

    #[test]
    fn latency_stays_within_delay_jitter_and_tail() {
        let l = Latency::default();
        l.set(20.0, 30.0, 0.5, 200.0);
        let mut rng = Rng(42);
        let samples: Vec<Duration> = (0..2000).map(|_| l.sample(&mut rng)).collect();
        let ms = |d: &Duration| d.as_secs_f64() * 1e3;
        assert!(samples.iter().all(|d| (20.0..=250.0).contains(&ms(d))));
        let tail = samples.iter().filter(|d| ms(d) > 50.0).count();
        assert!((800..1200).contains(&tail), "{tail} of 2000 in the tail");
    }
}
