//! Wiring: build the caches from the configuration, bind both listeners, serve until shut down.

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;

use cache_core::BlockLayout;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::admin::{self, AdminState};
use crate::auth::Authenticator;
use crate::blocks::{BlockStore, BlockStoreConfig};
use crate::config::Config;
use crate::config::{
    DiskAdmission, DiskRecovery, DiskWritePolicy, FleetScope, IoEngineKind, PrefetchMode,
};
use crate::fleet::auth::PeerSecret;
use crate::fleet::client::{Info, PeerClient};
use crate::fleet::membership::{MemberSource, Membership};
use crate::fleet::ring::{Member, Scope, View};
use crate::fleet::server::PeerState;
use crate::fleet::{self, CopyLimits, Fleet};
use crate::metadata::MetadataCache;
use crate::metrics::{Metrics, MetricsError, MetricsOptions};
use crate::origin::forward::{ForwardError, Forwarder};
use crate::origin::s3::{S3Origin, S3OriginConfig};
use crate::origin::Origin;
use crate::prefetch::PrefetchConfig;
use crate::routes::{self, AppState};
use crate::tls::{TlsConfig, TlsError};
use crate::warm::{WarmLimits, Warmer};
use cache_core::disk::{Admission, EngineKind, PartitionConfig, Recovery};
use cache_core::{DiskCache, DiskConfig, WritePolicy};

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
}

/// The upstream, as the cache reads it and as requests pass through to it.
pub struct Upstream {
    /// Object reads (HEAD and ranged GETs) for the cache.
    pub origin: Arc<dyn Origin>,
    /// Every other request.
    pub forwarder: Forwarder,
}

impl Upstream {
    /// Both clients of an S3 upstream, signing with the same credentials; `first_byte_timeout`
    /// bounds the wait for a pass-through answer.
    pub async fn s3(config: &S3OriginConfig) -> Result<Self, ForwardError> {
        let origin = S3Origin::new(config).await;
        let forwarder = Forwarder::new(
            config.endpoint.as_deref(),
            &config.region,
            config.path_style,
            origin.credentials(),
            config.first_byte_timeout,
        )?;
        Ok(Self {
            origin: Arc::new(origin),
            forwarder,
        })
    }
}

/// The disk tier's configuration from Larder's.
fn disk_config(config: &Config, path: &std::path::Path) -> DiskConfig {
    let mut d = DiskConfig::new(path, config.disk_capacity.0);
    d.region_size = config.disk_region_size.0;
    d.engine = match config.io_engine {
        IoEngineKind::Psync => EngineKind::Psync,
        IoEngineKind::Uring => EngineKind::Uring,
    };
    d.admission = match config.disk_admission {
        DiskAdmission::Always => Admission::Always,
        DiskAdmission::SecondHit => Admission::SecondHit,
    };
    d.write_rate = config.disk_write_rate.0;
    d.write_buffer = config.disk_write_buffer.0;
    d.recovery = match config.disk_recovery {
        DiskRecovery::None => Recovery::None,
        DiskRecovery::Quiet => Recovery::Quiet,
        DiskRecovery::Strict => Recovery::Strict,
    };
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
    let scope = match config.fleet_scope {
        FleetScope::Zone => Scope::Zone,
        FleetScope::Fleet => Scope::Fleet,
    };
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
    metrics.observe_fleet(fleet.clone());
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
    upstream: Upstream,
    auth: Authenticator,
) -> Result<Running, StartError> {
    let Upstream { origin, forwarder } = upstream;
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
    let block_config = BlockStoreConfig {
        layout: BlockLayout::new(config.block_size.0),
        memory_capacity: config.memory_capacity.0,
        read_window: config.read_window,
        idle_timeout: config.upstream_idle_timeout.0,
        upstream_concurrency: config.upstream_concurrency,
        disk: disk.clone(),
        write_policy: match config.disk_write_policy {
            DiskWritePolicy::OnInsert => WritePolicy::OnInsert,
            DiskWritePolicy::OnEvict => WritePolicy::OnEvict,
        },
        bucket_partitions: config
            .disk_partitions
            .iter()
            .flat_map(|p| p.buckets.iter().map(|b| (b.clone(), p.name.clone())))
            .collect(),
        max_resumes: config.upstream_max_resumes,
        hedge_quantile: (config.upstream_hedge_quantile > 0.0)
            .then_some(config.upstream_hedge_quantile),
        prefetch: PrefetchConfig {
            enabled: config.prefetch == PrefetchMode::Auto,
            min_window: config.prefetch_min_window,
            max_window: config.prefetch_max_window,
            max_inflight: config.prefetch_max_inflight,
        },
        fleet: fleet.as_ref().map(|f| f.fleet.clone()),
    };
    let blocks = Arc::new(BlockStore::new(
        block_config,
        origin.clone(),
        metrics.clone(),
    ));
    metrics.observe_memory(blocks.memory().clone());
    metrics.observe_retries(origin.clone());
    let metadata = Arc::new(MetadataCache::new(
        origin.clone(),
        config.metadata_ttl.0,
        config.serve_stale_on_error.0,
        config.metadata_capacity,
        metrics.clone(),
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
            header_timeout: config.client_header_timeout.0,
        };
        tasks.push(tokio::spawn(serve_clients(
            listener,
            fleet::server::router(state),
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
        tokio::spawn(
            axum::serve(
                admin_listener,
                admin::router(admin_state.clone()).into_make_service(),
            )
            .with_graceful_shutdown(shutdown.clone().cancelled_owned())
            .into_future(),
        ),
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

/// What one client may hold of the S3 listener.
#[derive(Debug, Clone, Copy)]
struct ClientLimits {
    max_connections: usize,
    header_timeout: Duration,
}

impl From<&Config> for ClientLimits {
    fn from(config: &Config) -> Self {
        Self {
            max_connections: config.max_connections,
            header_timeout: config.client_header_timeout.0,
        }
    }
}

/// The S3 listener's accept loop. Unlike `axum::serve` it caps open connections (a permit per
/// connection, taken before accepting, so at the cap new clients wait in the backlog), closes
/// connections whose TLS handshake or headers do not arrive in time, and terminates TLS.
async fn serve_clients(
    listener: TcpListener,
    router: axum::Router,
    limits: ClientLimits,
    tls: Option<TlsConfig>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    let mut http = ConnBuilder::new(TokioExecutor::new());
    http.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    // HTTP/2 has no header timeout of its own: bound streams per connection, and ping idle
    // connections so dead peers give their slot back.
    http.http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(256)
        .max_header_list_size(64 * 1024)
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(limits.header_timeout);
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
        let service = TowerToHyperService::new(router.clone());
        let Some(tls) = &tls else {
            let conn = graceful.watch(
                http.serve_connection(TokioIo::new(socket), service)
                    .into_owned(),
            );
            tokio::spawn(async move {
                let _ = conn.await;
                drop(permit);
            });
            continue;
        };
        let acceptor = tokio_rustls::TlsAcceptor::from(tls.current());
        let (http, watcher) = (http.clone(), graceful.watcher());
        tokio::spawn(async move {
            let handshake = tokio::time::timeout(limits.header_timeout, acceptor.accept(socket));
            let stream = match handshake.await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => return,
            };
            let conn = http
                .serve_connection(TokioIo::new(stream), service)
                .into_owned();
            let _ = watcher.watch(conn).await;
            drop(permit);
        });
    }
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(Duration::from_secs(30)) => tracing::warn!("responses still running after 30s; closing them"),
    }
    Ok(())
}
