//! Wiring: build the caches from the configuration, bind both listeners, serve until shut down.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;

use cache_core::BlockLayout;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::auth::Authenticator;
use crate::config::Config;
use crate::config::PrefetchMode;
use crate::fleet::auth::PeerSecret;
use crate::fleet::client::{Info, PeerClient};
use crate::fleet::membership::{MemberSource, Membership};
use crate::fleet::ring::{Member, View};
use crate::fleet::{CopyLimits, Fleet};
use crate::front::admin::{self, AdminAccess, AdminState};
use crate::front::peer::PeerState;
use crate::front::routes::{self, AppState};
use crate::front::tls::{TlsConfig, TlsError};
use crate::read::blocks::{BlockStore, BlockStoreConfig};
use crate::read::metadata::MetadataCache;
use crate::read::prefetch::PrefetchConfig;
use crate::telemetry::metrics::{FleetGauges, Metrics, MetricsError, MetricsOptions};
use crate::upstream::Clients;
use crate::warm::{WarmLimits, Warmer};
use cache_core::disk::PartitionConfig;
use cache_core::{DiskCache, DiskConfig};

/// A running Larder.
pub struct Running {
    /// Where the S3 listener is bound.
    pub s3_addr: SocketAddr,
    /// Where the admin listener is bound.
    pub admin_addr: SocketAddr,
    /// Where the peer listener is bound, in a fleet.
    pub peer_addr: Option<SocketAddr>,
    /// Its metrics.
    pub metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<std::io::Result<()>>>,
    disk: Option<DiskCache>,
}

/// Why Larder did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A listener could not be bound.
    #[error("binding listeners: {0}")]
    Bind(#[from] std::io::Error),
    /// The disk tier could not be opened.
    #[error(transparent)]
    Disk(#[from] cache_core::disk::DiskError),
    /// The TLS certificate or key could not be loaded.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The metrics exporter could not be set up.
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    /// The fleet could not be joined.
    #[error("joining the fleet: {0}")]
    Fleet(String),
    /// The admin token could not be loaded.
    #[error("admin token: {0}")]
    Admin(String),
}

/// The disk tier's configuration from Larder's.
fn disk_config(config: &Config, path: &std::path::Path) -> DiskConfig {
    let mut d = DiskConfig::new(path, config.disk_capacity.0);
    d.region_size = config.disk_region_size.0;
    d.engine = config.io_engine;
    d.admission = config.disk_admission;
    d.write_rate = config.disk_write_rate.0;
    d.write_buffer = config.disk_write_buffer.0;
    d.recovery = config.disk_recovery;
    d.partitions = config
        .disk_partitions
        .iter()
        .map(|p| PartitionConfig {
            name: p.name.clone(),
            capacity: p.capacity.0,
        })
        .collect();
    d
}

/// This replica's place in a fleet, before its listener starts.
struct Joined {
    fleet: Arc<Fleet>,
    membership: Membership,
    secret: PeerSecret,
    info: Info,
}

/// Join the fleet `config` names: read the shared secret, and start seeing only this replica
/// until the first membership refresh.
fn join_fleet(config: &Config, metrics: &Arc<Metrics>) -> Result<Joined, StartError> {
    let path = config
        .fleet_secret_file
        .as_ref()
        .ok_or_else(|| StartError::Fleet("fleet_secret_file is not set".into()))?;
    let secret = std::fs::read(path)
        .map_err(|e| StartError::Fleet(format!("reading {}: {e}", path.display())))
        .and_then(|bytes| {
            PeerSecret::new(&bytes)
                .map_err(|e| StartError::Fleet(format!("{}: {e}", path.display())))
        })?;
    let source = match (&config.fleet_peers_file, &config.fleet_peers_dns) {
        (Some(file), _) => MemberSource::File(file.clone()),
        (None, Some(dns)) => MemberSource::Dns(dns.clone()),
        (None, None) => MemberSource::Static(config.fleet_peers.clone()),
    };
    let scope = config.fleet_scope;
    let info = Info {
        id: rand::random(),
        // An empty zone (the chart's pod label missing) is no zone.
        zone: config.fleet_zone.clone().filter(|z| !z.is_empty()),
        block_size: config.block_size.0,
    };
    let advertise = config
        .fleet_advertise
        .clone()
        .unwrap_or_else(|| config.fleet_listen.to_string());
    let client = PeerClient::new(
        secret.clone(),
        config.fleet_peer_timeout.0,
        config.block_size.0,
    );
    let alone = View::new(Member::new(&advertise, info.zone.as_deref()), [], scope);
    let copies = CopyLimits {
        capacity: config.fleet_copy_capacity.0,
        ttl: config.fleet_copy_ttl.0,
    };
    let fleet = Arc::new(Fleet::new(alone, client, copies, metrics.clone()));
    let observed = fleet.clone();
    metrics.observe_fleet(move || {
        let view = observed.view();
        FleetGauges {
            members: view.members().len() as u64,
            owners: view.candidates() as u64,
            moved: observed.last_moved(),
        }
    });
    let membership = Membership::new(
        fleet.clone(),
        source,
        info.clone(),
        advertise,
        scope,
        config.fleet_refresh.0,
    );
    Ok(Joined {
        fleet,
        membership,
        secret,
        info,
    })
}

/// Open the disk tier, if configured, then bind the listeners and start serving in front of
/// `upstream` to the clients `auth` lets in.
pub async fn start(
    config: &Config,
    upstream: Clients,
    auth: Authenticator,
) -> Result<Running, StartError> {
    let Clients { origin, forwarder } = upstream;
    let tls = match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => Some(TlsConfig::load(cert, key)?),
        _ => None,
    };
    let disk = match &config.disk_path {
        Some(path) => Some(DiskCache::open(disk_config(config, path)).await?),
        None => None,
    };
    let metrics = Arc::new(Metrics::new(MetricsOptions {
        prices: config.prices(),
        buckets: config.metrics_buckets.clone(),
        otlp: config
            .otlp_endpoint
            .clone()
            .map(|url| (url, config.otlp_interval.0)),
    })?);
    if let Some(d) = &disk {
        metrics.observe_disk(d.clone());
    }
    let fleet = if config.in_fleet() {
        Some(join_fleet(config, &metrics)?)
    } else {
        None
    };
    let origin = crate::upstream::layered(
        origin,
        (config.upstream_hedge_quantile > 0.0).then_some(config.upstream_hedge_quantile),
        metrics.clone(),
    );
    let block_config = BlockStoreConfig {
        layout: BlockLayout::new(config.block_size.0),
        memory_capacity: config.memory_capacity.0,
        read_window: config.read_window,
        response_buffer: config.response_buffer.0,
        idle_timeout: config.upstream_idle_timeout.0,
        upstream_concurrency: config.upstream_concurrency,
        disk: disk.clone(),
        write_policy: config.disk_write_policy,
        bucket_partitions: config
            .disk_partitions
            .iter()
            .flat_map(|p| p.buckets.iter().map(|b| (b.clone(), p.name.clone())))
            .collect(),
        max_resumes: config.upstream_max_resumes,
        prefetch: PrefetchConfig {
            enabled: config.prefetch == PrefetchMode::Auto,
            min_window: config.prefetch_min_window,
            max_window: config.prefetch_max_window,
            max_inflight: config.prefetch_max_inflight,
            unused_after: crate::read::prefetch::UNUSED_AFTER,
        },
        fleet: fleet.as_ref().map(|f| f.fleet.clone()),
    };
    let blocks = Arc::new(BlockStore::new(
        block_config,
        origin.clone(),
        metrics.clone(),
    ));
    metrics.observe_memory(blocks.memory().clone());
    let pinned = blocks.clone();
    metrics.observe_response_buffer(move || pinned.response_buffer());
    let counted = origin.clone();
    metrics.observe_retries(move || counted.retries());
    let metadata = Arc::new(MetadataCache::new(
        origin.clone(),
        config.metadata_ttl.0,
        config.serve_stale_on_error.0,
        config.metadata_capacity,
    ));
    let warmer = Arc::new(Warmer::new(
        blocks.clone(),
        metadata.clone(),
        origin.clone(),
        metrics.clone(),
        WarmLimits {
            concurrency: config.warm_concurrency,
            rate: config.warm_rate.0,
        },
    ));
    let app = Arc::new(AppState {
        base_domain: config.base_domain.clone(),
        auth,
        forwarder,
        metadata: metadata.clone(),
        blocks: blocks.clone(),
        origin,
        metrics: metrics.clone(),
    });
    let admin_state = Arc::new(AdminState {
        metrics: metrics.clone(),
        blocks: blocks.clone(),
        warmer,
        fleet: fleet.as_ref().map(|f| f.fleet.clone()),
        ready: AtomicBool::new(false),
        access: match &config.admin_token_file {
            Some(path) => AdminAccess::from_file(path).map_err(StartError::Admin)?,
            None => AdminAccess::LoopbackOnly {
                loopback: config.admin_listen.ip().is_loopback(),
            },
        },
    });

    let s3_listener = TcpListener::bind(config.listen).await?;
    let admin_listener = TcpListener::bind(config.admin_listen).await?;
    let (s3_addr, admin_addr) = (s3_listener.local_addr()?, admin_listener.local_addr()?);
    let shutdown = CancellationToken::new();
    if let Some(tls) = &tls {
        tokio::spawn(tls.clone().watch(shutdown.clone()));
    }
    let mut tasks = Vec::new();
    let mut peer_addr = None;
    if let Some(joined) = fleet {
        let listener = TcpListener::bind(config.fleet_listen).await?;
        peer_addr = Some(listener.local_addr()?);
        let state = Arc::new(PeerState {
            blocks: blocks.clone(),
            metadata: metadata.clone(),
            secret: joined.secret,
            info: joined.info,
            metrics: metrics.clone(),
        });
        // Peers are few and hold long-lived HTTP/2 connections; the cap only stops a runaway.
        let limits = ClientLimits {
            max_connections: 1024,
            ..ClientLimits::from(config)
        };
        tasks.push(tokio::spawn(serve_clients(
            listener,
            super::peer::router(state),
            limits,
            None,
            shutdown.clone(),
        )));
        // Started once the peer listener is up, so the first probe finds this replica too.
        tokio::spawn(joined.membership.run(shutdown.clone()));
    }
    tasks.extend([
        tokio::spawn(serve_clients(
            s3_listener,
            routes::router(app),
            ClientLimits::from(config),
            tls,
            shutdown.clone(),
        )),
        // Operators and scrapers: a small cap, the same timeouts as clients.
        tokio::spawn(serve_clients(
            admin_listener,
            admin::router(admin_state.clone()),
            ClientLimits {
                max_connections: 256,
                ..ClientLimits::from(config)
            },
            None,
            shutdown.clone(),
        )),
    ]);
    admin_state.ready.store(true, Ordering::Release);
    tracing::info!(%s3_addr, %admin_addr, block_size = %config.block_size, memory_capacity = %config.memory_capacity, "larder is serving");
    Ok(Running {
        s3_addr,
        admin_addr,
        peer_addr,
        metrics,
        shutdown,
        tasks,
        disk,
    })
}

impl Running {
    /// Stop accepting connections, let responses in progress finish, and return.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        self.wait().await;
    }

    /// Serve until shut down (or a listener fails).
    pub async fn wait(self) {
        for task in self.tasks {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::error!(error = %e, "listener failed"),
                Err(e) => tracing::error!(error = %e, "listener task panicked"),
            }
        }
        self.metrics.flush();
        // Finish the disk writes already accepted, so the next start finds them (a crash would
        // only lose them, never corrupt anything).
        if let Some(disk) = self.disk {
            disk.close().await;
        }
    }

    /// A handle that shuts this Larder down when cancelled.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }
}

/// What one client may hold of a listener.
#[derive(Debug, Clone, Copy)]
struct ClientLimits {
    max_connections: usize,
    /// Longest wait for a request's headers, and for a connection's first request.
    header_timeout: Duration,
    /// Longest a connection may stay with no bytes moving either way.
    idle_timeout: Duration,
    /// Most requests in flight on one HTTP/2 connection.
    max_streams: u32,
}

impl From<&Config> for ClientLimits {
    fn from(config: &Config) -> Self {
        Self {
            max_connections: config.max_connections,
            header_timeout: config.client_header_timeout.0,
            idle_timeout: config.client_idle_timeout.0,
            max_streams: config.client_max_streams,
        }
    }
}

/// A listener's accept loop. Unlike `axum::serve` it caps open connections (a permit per
/// connection, taken before accepting, so at the cap new clients wait in the backlog), closes
/// connections whose TLS handshake or first request does not arrive in time or that sit idle
/// (HTTP/1 and HTTP/2 alike: see [`Activity`]), and terminates TLS.
async fn serve_clients(
    listener: TcpListener,
    router: axum::Router,
    limits: ClientLimits,
    tls: Option<TlsConfig>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut http = ConnBuilder::new(TokioExecutor::new());
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
        let (http, router, tls, shutdown) =
            (http.clone(), router.clone(), tls.clone(), shutdown.clone());
        tokio::spawn(async move {
            let activity = Arc::new(Activity::new());
            let seen = activity.clone();
            let service = TowerToHyperService::new(tower::ServiceExt::map_request(
                router,
                move |req: http::Request<hyper::body::Incoming>| {
                    seen.requested();
                    req
                },
            ));
            let io = Tracked::new(socket, activity.clone());
            match tls {
                None => serve_one(&http, io, service, &activity, limits, &shutdown).await,
                Some(tls) => {
                    let acceptor = tokio_rustls::TlsAcceptor::from(tls.current());
                    let handshake =
                        tokio::time::timeout(limits.header_timeout, acceptor.accept(io));
                    match handshake.await {
                        Ok(Ok(stream)) => {
                            serve_one(&http, stream, service, &activity, limits, &shutdown).await
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

/// Serve one connection until it ends, closing it gracefully (in-flight responses finish) on
/// shutdown, when no first request arrives within `header_timeout`, or when nothing has moved
/// for `idle_timeout`. A connection still open `header_timeout` after being asked to close is
/// dropped.
async fn serve_one<I, S>(
    http: &ConnBuilder<TokioExecutor>,
    io: I,
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
    let conn = http.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let tick = (limits.header_timeout.min(limits.idle_timeout) / 4).max(Duration::from_millis(50));
    let mut closing: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            _ = conn.as_mut() => return,
            () = shutdown.cancelled(), if closing.is_none() => {
                conn.as_mut().graceful_shutdown();
                closing = Some(tokio::time::Instant::now());
            }
            () = tokio::time::sleep(tick) => {
                match closing {
                    Some(since) if since.elapsed() > limits.header_timeout => return,
                    Some(_) => {}
                    None => if let Some(why) = activity.expired(limits) {
                        tracing::debug!(why, "closing a client connection");
                        conn.as_mut().graceful_shutdown();
                        closing = Some(tokio::time::Instant::now());
                    }
                }
            }
        }
    }
}

/// When a connection last moved bytes, and whether it ever sent a request.
struct Activity {
    opened: Instant,
    /// Milliseconds after `opened` of the last byte read or written.
    last: AtomicU64,
    requested: AtomicBool,
}

impl Activity {
    fn new() -> Self {
        Self {
            opened: Instant::now(),
            last: AtomicU64::new(0),
            requested: AtomicBool::new(false),
        }
    }

    fn moved(&self) {
        let ms = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(ms, Ordering::Relaxed);
    }

    fn requested(&self) {
        self.requested.store(true, Ordering::Relaxed);
    }

    /// Why the connection should close now, if it should.
    fn expired(&self, limits: ClientLimits) -> Option<&'static str> {
        let age = self.opened.elapsed();
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
