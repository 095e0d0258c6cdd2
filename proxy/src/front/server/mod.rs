//! Wiring: build the caches from the configuration, bind both listeners, serve until shut down.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cache_core::BlockLayout;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::auth::live::Reload;
use crate::auth::Authenticator;
use crate::config::Config;
use crate::config::{ColdRanges, PrefetchMode};
use crate::fleet::auth::PeerSecret;
use crate::fleet::client::{Info, PeerClient};
use crate::fleet::membership::{MemberSource, Membership};
use crate::fleet::ring::{Member, View};
use crate::fleet::tls::{PeerCa, PeerTls};
use crate::fleet::{CopyLimits, Fleet};
use crate::freshness::heartbeat::Heartbeat;
use crate::freshness::sns::SnsConfirmer;
use crate::freshness::sqs::{SqsConsumer, SqsError};
use crate::freshness::Freshness;
use crate::front::admin::{self, AdminAccess, AdminState};
use crate::front::peer::PeerState;
use crate::front::routes::{self, AppState};
use crate::front::tls::{TlsConfig, TlsError};
use crate::read::blocks::{BlockStore, BlockStoreConfig};
use crate::read::listing::ListingCache;
use crate::read::metadata::MetadataCache;
use crate::read::parts::{PartLayouts, PARTS_BYTES};
use crate::read::policy::{Defaults, EventFallback, Policy, Rule};
use crate::read::prefetch::PrefetchConfig;
use crate::telemetry::metrics::{FleetGauges, Metrics, MetricsError, MetricsOptions};
use crate::upstream::resume::ResumePolicy;
use crate::upstream::Clients;
use crate::warm::profile::Profiler;
use crate::warm::{WarmLimits, Warmer};
use cache_core::disk::PartitionConfig;
use cache_core::disk::{DeviceKey, Encryption, DEVICE_KEY_LEN};
use cache_core::{DiskCache, DiskConfig};

mod connections;
mod gather;
mod inline;
mod lend;

use connections::{serve_clients, ClientLimits};
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
    blocks: Arc<BlockStore>,
}

/// Longest a shutdown spends writing the memory tier down to disk (writes on evict), well
/// inside the chart's 60 s grace period: at the measured ~1 GB/s of disk writes, several GiB.
const SPILL_WITHIN: std::time::Duration = std::time::Duration::from_secs(20);

/// Longest a shutdown waits, before that, for block fetches still running to land: read-ahead,
/// or a fetch whose readers already have all its bytes and which is caching the block. Their
/// bytes are paid for; an 8 MiB block takes about 0.1 s from S3.
const FETCHES_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

/// Why Larder did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A listener could not be bound.
    #[error("binding listeners: {0}")]
    Bind(#[from] std::io::Error),
    /// The disk tier could not be opened.
    #[error(transparent)]
    Disk(#[from] cache_core::disk::DiskError),
    /// The disk tier's encryption key could not be read.
    #[error("{option} {path}: {why}")]
    DiskKey {
        /// The option naming the file.
        option: &'static str,
        /// The configured path.
        path: std::path::PathBuf,
        /// What is wrong with it.
        why: String,
    },
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
    /// The S3 event queue could not be set up.
    #[error(transparent)]
    Sqs(#[from] SqsError),
    /// The client that confirms SNS subscriptions could not be built.
    #[error("SNS subscription client: {0}")]
    Sns(String),
}

/// The disk tier's configuration from Larder's.
fn disk_config(config: &Config, path: &std::path::Path) -> Result<DiskConfig, StartError> {
    let mut d = DiskConfig::new(path, config.disk_capacity.0);
    if let Some(key) = &config.disk_encryption_key_file {
        let previous = config.disk_encryption_previous_key_file.as_deref();
        d.encryption = Some(Encryption {
            key: read_disk_key("disk_encryption_key_file", key)?,
            previous: previous
                .map(|p| read_disk_key("disk_encryption_previous_key_file", p))
                .transpose()?,
        });
    }
    d.region_size = config.disk_region_size.0;
    d.engine = config.io_engine;
    d.page_cache = config.disk_page_cache;
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
    Ok(d)
}

/// The disk tier's key from `disk_encryption_key_file`: 64 hexadecimal digits and nothing else
/// but whitespace, so a truncated or mistyped key stops the start instead of sealing the cache
/// with a weaker one.
fn read_disk_key(option: &'static str, path: &std::path::Path) -> Result<DeviceKey, StartError> {
    let err = |why: String| StartError::DiskKey {
        option,
        path: path.to_owned(),
        why,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    let digits = text.trim();
    if digits.len() != 2 * DEVICE_KEY_LEN || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(err(format!(
            "must hold {} random bytes as {} hexadecimal digits (openssl rand -hex {}), \
             found {} characters",
            DEVICE_KEY_LEN,
            2 * DEVICE_KEY_LEN,
            DEVICE_KEY_LEN,
            digits.len()
        )));
    }
    let mut key = [0u8; DEVICE_KEY_LEN];
    for (i, byte) in key.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&digits[2 * i..2 * i + 2], 16).expect("checked hex digits");
    }
    Ok(DeviceKey::new(&key))
}

/// The freshness policy from the configuration.
fn freshness_policy(config: &Config) -> Policy {
    let defaults = Defaults {
        metadata: config.metadata_ttl.0,
        list: config.list_ttl.0,
        negative: config.negative_ttl.0,
    };
    let rules = config
        .rules
        .iter()
        .map(|r| Rule {
            bucket: r.bucket.clone(),
            prefix: r.prefix.clone(),
            metadata_ttl: r.metadata_ttl.map(|d| d.0),
            immutable: r.immutable,
            list_ttl: r.list_ttl.map(|d| d.0),
            negative_ttl: r.negative_ttl.map(|d| d.0),
        })
        .collect();
    let fallback = config.expects_events().then_some(EventFallback {
        ttl: config.events_fallback_ttl.0,
    });
    Policy::new(defaults, rules, fallback)
}

/// This replica's place in a fleet, before its listener starts.
struct Joined {
    fleet: Arc<Fleet>,
    membership: Membership,
    secret: PeerSecret,
    info: Info,
    /// The peer listener's certificate, with `fleet_tls_cert`.
    tls: Option<TlsConfig>,
    /// The CA peers are checked against, with `fleet_tls_ca`.
    peer_ca: Option<Arc<PeerCa>>,
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
    // Validation has checked that the three files come together.
    let (tls, peer_tls) = match (
        &config.fleet_tls_cert,
        &config.fleet_tls_key,
        &config.fleet_tls_ca,
    ) {
        (Some(cert), Some(key), Some(ca)) => (
            Some(TlsConfig::load(cert, key)?),
            Some(
                PeerTls::load(ca, config.fleet_tls_name.as_deref())
                    .map_err(|e| StartError::Fleet(e.to_string()))?,
            ),
        ),
        _ => (None, None),
    };
    let peer_ca = peer_tls.as_ref().map(|t| t.ca.clone());
    let client = PeerClient::new(
        secret.clone(),
        config.fleet_peer_timeout.0,
        config.block_size.0,
        peer_tls,
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
        tls,
        peer_ca,
    })
}

/// Most bytes of idle large buffers kept for reuse: a quarter of what responses may hold at
/// once. The pool then covers the blocks a few large reads hold (a 64 MiB object read whole
/// holds nine 8 MiB buffers at the defaults), so their disk reads and fills stop paying to zero
/// and fault in fresh memory; the fixed 64 MiB it had before held seven (docs/benchmarks.md,
/// "Disk hits of large objects: buffers the pool kept"). It is memory those reads held at their
/// peak, kept instead of given back.
fn buffer_pool_limit(response_buffer: u64) -> usize {
    usize::try_from(response_buffer / 4).unwrap_or(usize::MAX)
}

/// Open the disk tier, if configured, then bind the listeners and start serving in front of
/// `upstream` to the clients `auth` lets in.
pub async fn start(
    config: &Config,
    upstream: Clients,
    auth: Authenticator,
) -> Result<Running, StartError> {
    let Clients {
        origin,
        forwarder,
        credentials,
        extra_roots,
    } = upstream;
    let tls = match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => Some(TlsConfig::load(cert, key)?),
        _ => None,
    };
    let disk = match &config.disk_path {
        Some(path) => Some(DiskCache::open(disk_config(config, path)?).await?),
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
        config.upstream_max_attempts,
        (config.upstream_hedge_quantile > 0.0).then_some(config.upstream_hedge_quantile),
        config.upstream_fetch_pieces,
        ResumePolicy {
            max_resumes: config.upstream_max_resumes,
            idle_timeout: config.upstream_idle_timeout.0,
        },
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
        prefetch: PrefetchConfig {
            enabled: config.prefetch == PrefetchMode::Auto,
            min_window: config.prefetch_min_window,
            max_window: config.prefetch_max_window,
            max_inflight: config.prefetch_max_inflight,
            unused_after: crate::read::prefetch::UNUSED_AFTER,
        },
        exact_ranges: config.cold_ranges == ColdRanges::Exact,
        complete_block_after: config.complete_block_after,
        fleet: fleet.as_ref().map(|f| f.fleet.clone()),
    };
    let blocks = Arc::new(BlockStore::new(
        block_config,
        origin.clone(),
        metrics.clone(),
    ));
    metrics.observe_memory(blocks.memory().clone());
    cache_core::buffers::set_pool_limit(buffer_pool_limit(config.response_buffer.0));
    metrics.observe_buffer_pool();
    let pinned = blocks.clone();
    metrics.observe_response_buffer(move || pinned.response_buffer());
    let paced = blocks.clone();
    metrics.observe_parallel_gain(move || paced.parallel_gain());
    let counted = origin.clone();
    metrics.observe_retries(move || counted.retries());
    let policy = Arc::new(freshness_policy(config));
    let metadata = Arc::new(
        MetadataCache::with_policy(
            origin.clone(),
            policy.clone(),
            config.serve_stale_on_error.0,
            config.metadata_capacity,
        )
        .refreshing_ahead(config.metadata_refresh_ahead)
        .learning_checksums(config.learn_checksums),
    );
    let refreshed = metadata.clone();
    metrics.observe_metadata_refreshes(move || refreshed.refreshes().map(|(r, n)| (r.as_str(), n)));
    let listings = policy
        .caches_listings()
        .then(|| Arc::new(ListingCache::new(policy.clone(), config.list_capacity.0)));
    let freshness = Arc::new(Freshness::new(
        metadata.clone(),
        listings.clone(),
        policy,
        fleet.as_ref().map(|f| f.fleet.clone()),
        metrics.clone(),
        config.events_max_silence.0,
    ));
    let observed = freshness.clone();
    if freshness.expects_events() {
        metrics.observe_events(move || {
            (
                observed.healthy(),
                observed.silence().map(|s| s.as_secs_f64()),
            )
        });
    }
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
    let parts = PartLayouts::new(PARTS_BYTES, fleet.as_ref().map(|f| f.fleet.clone()));
    if let Authenticator::SigV4(keys) = &auth {
        // Read from the keys in force at each collection: the credentials file and the
        // policies are reloaded, so a key without limits at start may have some later.
        let limited = keys.clone();
        metrics.observe_client_limits(move || limited.current().limits());
        if config.metrics_keys {
            let keys = keys.clone();
            metrics.observe_key_savings(move || keys.current().tallies());
        }
        let keys = keys.clone();
        metrics.observe_auth_files(move |file| keys.refused(file));
    }
    let profile = Arc::new(Profiler::default());
    let app = Arc::new(AppState {
        base_domain: config.base_domain.clone(),
        auth,
        forwarder: forwarder.clone(),
        metadata: metadata.clone(),
        blocks: blocks.clone(),
        parts: parts.clone(),
        listings,
        freshness: freshness.clone(),
        origin,
        metrics: metrics.clone(),
        larder_pays: config.upstream_requester_pays,
        profile: profile.clone(),
    });
    let admin_state = Arc::new(AdminState {
        metrics: metrics.clone(),
        blocks: blocks.clone(),
        warmer,
        profile,
        fleet: fleet.as_ref().map(|f| f.fleet.clone()),
        ready: AtomicBool::new(false),
        access: match &config.admin_token_file {
            Some(path) => AdminAccess::from_file(path).map_err(StartError::Admin)?,
            None => AdminAccess::LoopbackOnly {
                loopback: config.admin_listen.ip().is_loopback(),
            },
        },
        freshness: freshness.clone(),
        events: match &config.events_token_file {
            Some(path) => Some(AdminAccess::from_file(path).map_err(StartError::Admin)?),
            None => None,
        },
        sns: SnsConfirmer::new(config.events_sns_origins.clone()).map_err(StartError::Sns)?,
        log: crate::telemetry::traces::log_filter(),
    });
    let sqs = match &config.events_sqs_queue_url {
        Some(url) => Some(
            SqsConsumer::new(
                url,
                &config.upstream_region,
                credentials,
                extra_roots.as_ref(),
                freshness.clone(),
                metrics.clone(),
            )
            .await?,
        ),
        None => None,
    };

    let s3_listener = TcpListener::bind(config.listen).await?;
    let admin_listener = TcpListener::bind(config.admin_listen).await?;
    let (s3_addr, admin_addr) = (s3_listener.local_addr()?, admin_listener.local_addr()?);
    let shutdown = CancellationToken::new();
    if let Some(tls) = &tls {
        tokio::spawn(tls.clone().watch(shutdown.clone()));
    }
    tokio::spawn(freshness.clone().watch(shutdown.clone()));
    if let Authenticator::SigV4(keys) = &app.auth {
        let metrics = metrics.clone();
        let reloaded = move |file, r| metrics.auth_file_reloaded(file, r == Reload::Applied);
        tokio::spawn(keys.clone().watch(shutdown.clone(), reloaded));
    }
    if let Some(sqs) = sqs {
        tokio::spawn(sqs.run(shutdown.clone()));
    }
    if let Some((bucket, key)) = config
        .events_heartbeat
        .as_deref()
        .and_then(|b| b.split_once('/'))
    {
        let heartbeat = Heartbeat {
            forwarder: forwarder.clone(),
            metrics: metrics.clone(),
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            every: config.events_max_silence.0 / 3,
            requester_pays: config.upstream_requester_pays,
        };
        tokio::spawn(heartbeat.run(shutdown.clone()));
    }
    let mut tasks = Vec::new();
    let mut peer_addr = None;
    if let Some(joined) = fleet {
        let listener = TcpListener::bind(config.fleet_listen).await?;
        peer_addr = Some(listener.local_addr()?);
        let state = Arc::new(PeerState {
            blocks: blocks.clone(),
            metadata: metadata.clone(),
            freshness: freshness.clone(),
            parts,
            secret: joined.secret,
            info: joined.info,
            metrics: metrics.clone(),
            opening: Default::default(),
        });
        // Peers are few and hold long-lived HTTP/2 connections; the cap only stops a runaway.
        let limits = ClientLimits {
            max_connections: 1024,
            ..ClientLimits::from(config)
        };
        if let Some(tls) = &joined.tls {
            tokio::spawn(tls.clone().watch(shutdown.clone()));
        }
        if let Some(ca) = &joined.peer_ca {
            tokio::spawn(ca.clone().watch(shutdown.clone()));
        }
        tasks.push(tokio::spawn(serve_clients(
            listener,
            super::peer::service(state),
            limits,
            joined.tls,
            shutdown.clone(),
        )));
        // Started once the peer listener is up, so the first probe finds this replica too.
        tokio::spawn(joined.membership.run(shutdown.clone()));
        tokio::spawn(joined.fleet.clone().tell_peers(shutdown.clone()));
    }
    tasks.extend([
        tokio::spawn(serve_clients(
            s3_listener,
            routes::service(app),
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
        blocks,
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
        // Write down what only memory holds (writes on evict) and finish the disk writes
        // already accepted, so the next start finds them (a crash would only lose them, never
        // corrupt anything).
        if let Some(disk) = self.blocks.disk() {
            self.blocks.settled(FETCHES_WITHIN).await;
            let spilled = self.blocks.spill(SPILL_WITHIN).await;
            if spilled > 0 {
                tracing::info!(blocks = spilled, "wrote the memory tier down to disk");
            }
            disk.close().await;
        }
    }

    /// A handle that shuts this Larder down when cancelled.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disk_key_is_64_hex_digits_and_nothing_shorter_longer_or_else() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("disk.key");
        let hex = "00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF";
        std::fs::write(&path, format!("  {hex}\n")).expect("write");
        let key = read_disk_key("k", &path).expect("64 hex digits, whitespace around");
        let mut bytes = [0u8; DEVICE_KEY_LEN];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i % 16) as u8 * 0x11;
        }
        assert_eq!(
            format!("{key:?}"),
            format!("{:?}", DeviceKey::new(&bytes)),
            "the digits are the key's bytes"
        );
        for bad in [
            &hex[..62],
            &format!("{hex}00")[..],
            &hex.replace('0', "g")[..],
            "",
        ] {
            std::fs::write(&path, bad).expect("write");
            let err = read_disk_key("k", &path).expect_err("refused").to_string();
            assert!(
                err.contains("disk.key") && err.contains("64 hexadecimal digits"),
                "{err}"
            );
        }
        let missing = read_disk_key("k", &dir.path().join("none")).expect_err("refused");
        assert!(missing.to_string().contains("none"), "{missing}");
    }
}
