//! Configuration: defaults < TOML file (`--config`) < `LARDER_*` environment < command-line flags.
//!
//! Every option is documented here with its default and in `docs/configuration.md`; a test keeps
//! the two in step.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::auth::{AuthMode, KeyPolicy};
use crate::telemetry::traces::{LogFormat, TraceOptions};

/// Larder's whole configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address of the S3 listener. Default: `127.0.0.1:9000`.
    pub listen: SocketAddr,
    /// Address of the admin listener (`/healthz`, `/readyz`, `/metrics`). Default: `127.0.0.1:9001`.
    pub admin_listen: SocketAddr,
    /// Most client connections the S3 listener holds open at once; further clients wait in the
    /// listen backlog until one closes. Default: `4096`.
    pub max_connections: usize,
    /// Longest a client may take to send a request's headers before its connection is closed
    /// (guards against slowloris clients). Default: `10s`.
    pub client_header_timeout: HumanDuration,
    /// Longest a client connection (HTTP/1 or HTTP/2) may stay open with no bytes moving either
    /// way; a connection that sends no first request within `client_header_timeout` is closed
    /// too, so idle connections cannot hold every `max_connections` slot. Default: `60s`.
    pub client_idle_timeout: HumanDuration,
    /// Most requests one HTTP/2 connection may have in flight at once. Default: `256`.
    pub client_max_streams: u32,
    /// File holding the bearer token that the admin listener's mutating and revealing routes
    /// (`/warm`, `/fleet`) require (`Authorization: Bearer <token>`). Without it those routes
    /// answer only on a loopback admin listener; metrics, health and the status page stay
    /// open. Default: none.
    pub admin_token_file: Option<std::path::PathBuf>,
    /// How clients authenticate: `sigv4` (every request signed with AWS Signature Version 4 by a
    /// key in `auth_credentials`) or `none` (anyone who reaches the listener reads and writes
    /// through Larder's upstream credentials; logged as a warning). Default: `sigv4`.
    pub auth: AuthMode,
    /// File of client keys, one `access_key_id:secret_access_key` per line, `#` comments.
    /// Required with `auth = "sigv4"`. Default: none.
    pub auth_credentials: Option<std::path::PathBuf>,
    /// Per-key policies: the buckets a key may use and what it may do there (`read-only`,
    /// `read-write` for object writes, `admin` for bucket administration too). TOML only, e.g.
    /// `[[auth_policies]] access_key = "analytics", buckets = ["lake", "logs-*"],
    /// access = "read-only"`. Keys without a policy may do everything. Default: none.
    pub auth_policies: Vec<KeyPolicy>,
    /// PEM certificate chain for TLS on the S3 listener; with `tls_key`, the listener speaks
    /// HTTPS only. Both files are re-read when they change. Default: none (plain HTTP).
    pub tls_cert: Option<std::path::PathBuf>,
    /// PEM private key for `tls_cert`. Default: none.
    pub tls_key: Option<std::path::PathBuf>,
    /// Base domain for virtual-hosted-style requests (`bucket.<base_domain>`). Default: none, so
    /// only path-style requests (`/bucket/key`) are understood.
    pub base_domain: Option<String>,
    /// The upstream S3 endpoint URL. Default: none, meaning AWS S3 for the region.
    pub upstream_endpoint: Option<String>,
    /// The upstream region. Default: `us-east-1`.
    pub upstream_region: String,
    /// Address upstream buckets path-style (needed by MinIO and most S3-compatible servers).
    /// Default: `false`.
    pub upstream_path_style: bool,
    /// Bytes of block data the memory tier holds. Default: `512MiB`.
    pub memory_capacity: ByteSize,
    /// Size of the blocks objects are cut into. Default: `8MiB`.
    pub block_size: ByteSize,
    /// How long object metadata (size, ETag, headers) is trusted before it is fetched again; an
    /// object overwritten upstream is served with its old contents for at most this long.
    /// `0s` revalidates on every request. Metadata of a named version (`versionId`) expires
    /// too: its bytes never change, but it can be deleted. Writes through Larder drop what they
    /// change at once.
    /// Default: `60s`.
    pub metadata_ttl: HumanDuration,
    /// Most object-metadata entries held; as many object names are also remembered as read
    /// before, so that they revalidate with a HEAD (an object not remembered is opened with a
    /// GET of its first needed block, which brings the metadata too). Default: `100000`.
    pub metadata_capacity: u64,
    /// Blocks a single response fetches ahead of the one it is sending. Default: `4`.
    pub read_window: usize,
    /// Most bytes of blocks all responses in flight hold at once: each holds the block it is
    /// sending and those opened ahead of it, which may have left the memory tier. A response
    /// whose next block would go over waits (counted). At least one block. Default: `1GiB`.
    pub response_buffer: ByteSize,
    /// Longest wait for the next piece of an upstream body before the fetch fails. Default: `30s`.
    pub upstream_idle_timeout: HumanDuration,
    /// Most block fetches running upstream at once, across all requests; further fetches wait
    /// their turn. Bounds the memory of fetches in flight to this many blocks. Default: `64`.
    pub upstream_concurrency: usize,
    /// Cache file or raw block device of the disk tier. Default: none, so Larder caches in
    /// memory only.
    pub disk_path: Option<std::path::PathBuf>,
    /// Bytes of the device the disk tier uses; a file is created and preallocated to this size.
    /// Default: `10GiB`.
    pub disk_capacity: ByteSize,
    /// Region size: the disk tier's unit of append and eviction, 1MiB to 256MiB in whole MiB,
    /// and larger than a block. Default: `64MiB`.
    pub disk_region_size: ByteSize,
    /// I/O engine of the disk tier: `psync` (pread/pwrite on threads) or `uring` (io_uring,
    /// falling back to psync where the kernel refuses it). Default: `psync`: on our VMs it read as
    /// fast as io_uring with a lower p99, while io_uring filled faster (docs/benchmarks.md).
    pub io_engine: IoEngineKind,
    /// Which fetched blocks are written to disk: `always`, or `second-hit` (only blocks fetched
    /// twice within the admission window, so one-off scans do not churn the disk). Default:
    /// `always`.
    pub disk_admission: DiskAdmission,
    /// Most bytes per second written to the disk tier; blocks over it are dropped (and counted).
    /// `0` means no limit. Default: `512MiB`, a quarter of a typical NVMe device's write rate,
    /// leaving the rest for reads.
    pub disk_write_rate: ByteSize,
    /// Bytes of blocks accepted for a disk write and not yet written, per partition; beyond it
    /// blocks are dropped (and counted), so a slow disk never grows memory. Default: `64MiB`.
    pub disk_write_buffer: ByteSize,
    /// What to do with the disk tier's contents at start: `none` (start empty), `quiet` (recover
    /// what verifies, reformat on a format change), `strict` (recover, but refuse to start on a
    /// format change or damaged region metadata). Default: `quiet`.
    pub disk_recovery: DiskRecovery,
    /// When blocks reach the disk tier: `on-insert` (as soon as they are fetched, so a restart
    /// keeps them) or `on-evict` (when memory lets them go). Default: `on-insert`.
    pub disk_write_policy: DiskWritePolicy,
    /// Named disk partitions, each with its own capacity and the buckets cached in it; other
    /// buckets use the partition `default` (the capacity left over). TOML only, e.g.
    /// `[[disk_partitions]] name = "tables", capacity = "100GiB", buckets = ["lake"]`.
    /// Default: none (one partition).
    pub disk_partitions: Vec<DiskPartition>,
    /// Longest wait to connect to the upstream. Default: `5s`.
    pub upstream_connect_timeout: HumanDuration,
    /// Longest wait for an upstream response's headers, per attempt. Default: `30s`.
    pub upstream_first_byte_timeout: HumanDuration,
    /// Attempts per upstream request (block GETs and HEADs) on 5xx, SlowDown, throttling and
    /// connection faults, with exponential backoff and jitter; 1 disables retries. Default: `3`.
    pub upstream_max_attempts: u32,
    /// Times a block body that breaks or stalls mid-stream is resumed from the byte where it
    /// stopped (a new ranged GET pinned to the same ETag); 0 fails the read instead. Default: `3`.
    pub upstream_max_resumes: u32,
    /// Hedge a block GET that has not answered within this quantile (0 to 1, e.g. `0.95`) of
    /// recent upstream first-byte latencies: send a second, keep the first to answer, cancel
    /// the other. `0` is off. Default: `0`.
    pub upstream_hedge_quantile: f64,
    /// When the upstream fails (5xx, timeout, unreachable) while refreshing expired metadata,
    /// keep serving what is cached if the metadata expired at most this long ago, marked
    /// `X-Cache: stale-*`. `0s` is off. Default: `0s`.
    pub serve_stale_on_error: HumanDuration,
    /// Read-ahead across ranged GETs: `auto` (readers that read an object in order get the
    /// next blocks fetched before they ask) or `off`. Default: `auto`.
    pub prefetch: PrefetchMode,
    /// Blocks fetched ahead when an in-order reader is first seen. Default: `2`.
    pub prefetch_min_window: u64,
    /// Most blocks fetched ahead of one reader; the window doubles up to it while the reader
    /// keeps reading in order. Default: `16`.
    pub prefetch_max_window: u64,
    /// Most read-ahead fetches at once across all readers (each holds a block in flight).
    /// Read-ahead also only uses upstream slots that are free, so demand fetches go first.
    /// Default: `16`.
    pub prefetch_max_inflight: usize,
    /// Blocks a warm-up job fetches at once. Default: `4`.
    pub warm_concurrency: usize,
    /// Most bytes per second a warm-up job fetches. Default: `256MiB`.
    pub warm_rate: ByteSize,
    /// Log line format on stderr: `text` or `json` (one object per line). Default: `text`.
    pub log_format: LogFormat,
    /// Base URL of an OpenTelemetry collector's OTLP/HTTP receiver (e.g. `http://otel:4318`);
    /// metrics are pushed to `<url>/v1/metrics` and traces to `<url>/v1/traces`. Default: none
    /// (metrics on the admin `/metrics` only, no traces).
    pub otlp_endpoint: Option<String>,
    /// How often metrics are pushed by OTLP. Default: `10s`.
    pub otlp_interval: HumanDuration,
    /// Requests that take at least this long (headers to last byte) have their whole trace
    /// exported by OTLP; faster ones are dropped unless sampled. Default: `1s`.
    pub trace_slow_threshold: HumanDuration,
    /// Share (0 to 1) of the faster requests whose traces are exported too. Default: `0`.
    pub trace_sample_ratio: f64,
    /// Buckets whose name appears in a `bucket` label on the request, bytes and cost metrics;
    /// other buckets are counted as `other`. Empty leaves the label out, so an unbounded set of
    /// bucket names never reaches the metrics. Default: none.
    pub metrics_buckets: Vec<String>,
    /// Dollars per 1,000 GET-class requests (GET, HEAD and all others not listed below), for the
    /// cost metrics. Default: `0.0004` (S3 Standard, us-east-1).
    pub price_get_per_1000: f64,
    /// Dollars per 1,000 PUT-class requests (PUT, COPY, POST, LIST). Default: `0.005`.
    pub price_put_per_1000: f64,
    /// Dollars per GB (10^9 bytes) leaving S3 for the internet. Default: `0.09`.
    pub price_internet_per_gb: f64,
    /// Dollars per GB from S3 to another AWS region. Default: `0.02`.
    pub price_cross_region_per_gb: f64,
    /// Dollars per GB crossing availability zones. Default: `0.01`.
    pub price_cross_az_per_gb: f64,
    /// Where bytes from S3 travel to reach Larder (and would travel to reach the clients
    /// directly), choosing the per-GB price: `same-region` (free), `cross-az`, `cross-region`
    /// or `internet`. Default: `same-region`.
    pub upstream_transfer: TransferKind,
    /// Fleet members as a fixed list of peer addresses (`host:port` of each replica's
    /// `fleet_listen`, this replica's own among them). Setting one of `fleet_peers`,
    /// `fleet_peers_file` or `fleet_peers_dns` makes this replica part of a fleet: each block
    /// is owned by one replica, and the others ask it instead of S3. Default: none (alone).
    pub fleet_peers: Vec<String>,
    /// A file of fleet members (`host:port`, whitespace or comma separated, `#` comments),
    /// re-read every `fleet_refresh`. Default: none.
    pub fleet_peers_file: Option<std::path::PathBuf>,
    /// A DNS name and port whose addresses are the fleet members, re-resolved every
    /// `fleet_refresh`: on Kubernetes, the headless Service of the StatefulSet
    /// (`larder-peers.ns.svc.cluster.local:9002`). Default: none.
    pub fleet_peers_dns: Option<String>,
    /// Address of the peer listener, where the other replicas ask for blocks. Default:
    /// `127.0.0.1:9002` (the Helm chart listens on all addresses).
    pub fleet_listen: SocketAddr,
    /// This replica's name in the member list, until a probe finds which listed name answers
    /// with its own id. Default: none (`fleet_listen`).
    pub fleet_advertise: Option<String>,
    /// File holding the secret every replica signs peer requests with (at least 16 bytes).
    /// Required in a fleet. Default: none.
    pub fleet_secret_file: Option<std::path::PathBuf>,
    /// This replica's zone (on Kubernetes, the node's `topology.kubernetes.io/zone`).
    /// Default: none.
    pub fleet_zone: Option<String>,
    /// Which replicas may own a block for this one: `zone` (those in its zone: a block leaves
    /// S3 once per zone, and no block crosses zones) or `fleet` (all: once per fleet, crossing
    /// zones). Default: `zone`.
    pub fleet_scope: FleetScope,
    /// How often the member list is read and every member probed. Default: `5s`.
    pub fleet_refresh: HumanDuration,
    /// How long a peer has to start answering before this replica asks S3 itself (and counts
    /// a fallback). Default: `2s`.
    pub fleet_peer_timeout: HumanDuration,
    /// Bytes of blocks fetched from their owners kept in this replica's memory for its next
    /// readers (TinyLFU keeps the hot ones), apart from the memory tier. `0` keeps none.
    /// Default: `64MiB`.
    pub fleet_copy_capacity: ByteSize,
    /// How long a block fetched from its owner is kept here. Default: `30s`.
    pub fleet_copy_ttl: HumanDuration,
}

/// See [`Config::fleet_scope`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum FleetScope {
    /// Owners within this replica's zone.
    #[default]
    Zone,
    /// Owners anywhere in the fleet.
    Fleet,
}

/// See [`Config::prefetch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum PrefetchMode {
    /// Read ahead of in-order readers.
    #[default]
    Auto,
    /// No read-ahead.
    Off,
}

/// See [`Config::upstream_transfer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum TransferKind {
    /// Within one region: S3 charges nothing.
    #[default]
    SameRegion,
    /// Across availability zones.
    CrossAz,
    /// To another region.
    CrossRegion,
    /// To the internet.
    Internet,
}

/// One disk partition and the buckets it caches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskPartition {
    /// Name, 1 to 32 bytes.
    pub name: String,
    /// Bytes of the device it holds.
    pub capacity: ByteSize,
    /// Buckets cached in it.
    #[serde(default)]
    pub buckets: Vec<String>,
}

/// See [`Config::io_engine`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum IoEngineKind {
    /// pread/pwrite on threads.
    #[default]
    Psync,
    /// io_uring.
    Uring,
}

/// See [`Config::disk_admission`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum DiskAdmission {
    /// Every block.
    #[default]
    Always,
    /// Blocks offered twice.
    SecondHit,
}

/// See [`Config::disk_recovery`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum DiskRecovery {
    /// Start empty.
    None,
    /// Recover what verifies.
    #[default]
    Quiet,
    /// Recover, refuse damage.
    Strict,
}

/// See [`Config::disk_write_policy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum DiskWritePolicy {
    /// Write when fetched.
    #[default]
    OnInsert,
    /// Write when evicted from memory.
    OnEvict,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 9000)),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 9001)),
            max_connections: 4096,
            client_header_timeout: HumanDuration(Duration::from_secs(10)),
            client_idle_timeout: HumanDuration(Duration::from_secs(60)),
            client_max_streams: 256,
            admin_token_file: None,
            auth: AuthMode::default(),
            auth_credentials: None,
            auth_policies: Vec::new(),
            tls_cert: None,
            tls_key: None,
            base_domain: None,
            upstream_endpoint: None,
            upstream_region: "us-east-1".to_owned(),
            upstream_path_style: false,
            memory_capacity: ByteSize(512 << 20),
            block_size: ByteSize(8 << 20),
            metadata_ttl: HumanDuration(Duration::from_secs(60)),
            metadata_capacity: 100_000,
            read_window: 4,
            response_buffer: ByteSize(1 << 30),
            upstream_idle_timeout: HumanDuration(Duration::from_secs(30)),
            upstream_concurrency: 64,
            disk_path: None,
            disk_capacity: ByteSize(10 << 30),
            disk_region_size: ByteSize(64 << 20),
            io_engine: IoEngineKind::default(),
            disk_admission: DiskAdmission::default(),
            disk_write_rate: ByteSize(512 << 20),
            disk_write_buffer: ByteSize(64 << 20),
            disk_recovery: DiskRecovery::default(),
            disk_write_policy: DiskWritePolicy::default(),
            disk_partitions: Vec::new(),
            upstream_connect_timeout: HumanDuration(Duration::from_secs(5)),
            upstream_first_byte_timeout: HumanDuration(Duration::from_secs(30)),
            upstream_max_attempts: 3,
            upstream_max_resumes: 3,
            upstream_hedge_quantile: 0.0,
            serve_stale_on_error: HumanDuration(Duration::ZERO),
            prefetch: PrefetchMode::default(),
            prefetch_min_window: 2,
            prefetch_max_window: 16,
            prefetch_max_inflight: 16,
            warm_concurrency: 4,
            warm_rate: ByteSize(256 << 20),
            log_format: LogFormat::default(),
            otlp_endpoint: None,
            otlp_interval: HumanDuration(Duration::from_secs(10)),
            trace_slow_threshold: HumanDuration(Duration::from_secs(1)),
            trace_sample_ratio: 0.0,
            metrics_buckets: Vec::new(),
            price_get_per_1000: 0.0004,
            price_put_per_1000: 0.005,
            price_internet_per_gb: 0.09,
            price_cross_region_per_gb: 0.02,
            price_cross_az_per_gb: 0.01,
            upstream_transfer: TransferKind::default(),
            fleet_peers: Vec::new(),
            fleet_peers_file: None,
            fleet_peers_dns: None,
            fleet_listen: SocketAddr::from(([127, 0, 0, 1], 9002)),
            fleet_advertise: None,
            fleet_secret_file: None,
            fleet_zone: None,
            fleet_scope: FleetScope::default(),
            fleet_refresh: HumanDuration(Duration::from_secs(5)),
            fleet_peer_timeout: HumanDuration(Duration::from_secs(2)),
            fleet_copy_capacity: ByteSize(64 << 20),
            fleet_copy_ttl: HumanDuration(Duration::from_secs(30)),
        }
    }
}

/// Names of every option, as TOML keys. `docs/configuration.md` must document each.
pub const OPTION_NAMES: &[&str] = &[
    "listen",
    "admin_listen",
    "max_connections",
    "client_header_timeout",
    "client_idle_timeout",
    "client_max_streams",
    "admin_token_file",
    "auth",
    "auth_credentials",
    "auth_policies",
    "tls_cert",
    "tls_key",
    "base_domain",
    "upstream_endpoint",
    "upstream_region",
    "upstream_path_style",
    "memory_capacity",
    "block_size",
    "metadata_ttl",
    "metadata_capacity",
    "read_window",
    "response_buffer",
    "upstream_idle_timeout",
    "upstream_concurrency",
    "disk_path",
    "disk_capacity",
    "disk_region_size",
    "io_engine",
    "disk_admission",
    "disk_write_rate",
    "disk_write_buffer",
    "disk_recovery",
    "disk_write_policy",
    "disk_partitions",
    "upstream_connect_timeout",
    "upstream_first_byte_timeout",
    "upstream_max_attempts",
    "upstream_max_resumes",
    "upstream_hedge_quantile",
    "serve_stale_on_error",
    "prefetch",
    "prefetch_min_window",
    "prefetch_max_window",
    "prefetch_max_inflight",
    "warm_concurrency",
    "warm_rate",
    "log_format",
    "otlp_endpoint",
    "otlp_interval",
    "trace_slow_threshold",
    "trace_sample_ratio",
    "metrics_buckets",
    "price_get_per_1000",
    "price_put_per_1000",
    "price_internet_per_gb",
    "price_cross_region_per_gb",
    "price_cross_az_per_gb",
    "upstream_transfer",
    "fleet_peers",
    "fleet_peers_file",
    "fleet_peers_dns",
    "fleet_listen",
    "fleet_advertise",
    "fleet_secret_file",
    "fleet_zone",
    "fleet_scope",
    "fleet_refresh",
    "fleet_peer_timeout",
    "fleet_copy_capacity",
    "fleet_copy_ttl",
];

/// Options that are lists of tables, set in the TOML file only (no flag).
pub const TOML_ONLY: &[&str] = &["disk_partitions", "auth_policies"];

/// Why a configuration was refused. The message names the offending field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A source could not be read or a value did not parse.
    #[error("invalid configuration: {0}")]
    Source(#[from] Box<figment::Error>),
    /// A value parsed but is out of range.
    #[error("invalid configuration: `{field}` {problem}")]
    Invalid {
        /// The offending field.
        field: &'static str,
        /// What is wrong with it.
        problem: String,
    },
}

impl Config {
    /// Whether this replica is part of a fleet.
    pub fn in_fleet(&self) -> bool {
        !self.fleet_peers.is_empty()
            || self.fleet_peers_file.is_some()
            || self.fleet_peers_dns.is_some()
    }

    /// Load from defaults, then `file` (if given), then `LARDER_*` variables, then `overrides`
    /// (the command-line flags that were set), and validate.
    pub fn load(
        file: Option<&std::path::Path>,
        overrides: impl Serialize,
    ) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = file {
            if !path.exists() {
                return Err(ConfigError::Invalid {
                    field: "config",
                    problem: format!("file {} does not exist", path.display()),
                });
            }
            figment = figment.merge(Toml::file(path));
        }
        let config: Config = figment
            .merge(Env::prefixed("LARDER_"))
            .merge(Serialized::defaults(overrides))
            .extract()
            .map_err(Box::new)?;
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field, problem: &str| {
            Err(ConfigError::Invalid {
                field,
                problem: problem.to_owned(),
            })
        };
        if self.block_size.0 < 4096 || self.block_size.0 > (1 << 30) {
            return invalid("block_size", "must be between 4KiB and 1GiB");
        }
        if self.memory_capacity.0 < self.block_size.0 {
            return invalid(
                "memory_capacity",
                "must hold at least one block (block_size)",
            );
        }
        if self.read_window == 0 || self.read_window > 64 {
            return invalid("read_window", "must be between 1 and 64");
        }
        if self.response_buffer.0 < self.block_size.0 {
            return invalid(
                "response_buffer",
                "must hold at least one block (block_size)",
            );
        }
        if self.max_connections == 0 {
            return invalid("max_connections", "must be positive");
        }
        if self.client_header_timeout.0.is_zero() {
            return invalid("client_header_timeout", "must be positive");
        }
        if self.client_idle_timeout.0.is_zero() {
            return invalid("client_idle_timeout", "must be positive");
        }
        if self.client_max_streams == 0 {
            return invalid("client_max_streams", "must be positive");
        }
        if self.upstream_concurrency == 0 || self.upstream_concurrency > 4096 {
            return invalid("upstream_concurrency", "must be between 1 and 4096");
        }
        if self.metadata_capacity == 0 {
            return invalid("metadata_capacity", "must be positive");
        }
        if self.upstream_idle_timeout.0.is_zero() {
            return invalid("upstream_idle_timeout", "must be positive");
        }
        let region = self.disk_region_size.0;
        if !((1 << 20)..=(256 << 20)).contains(&region) || !region.is_multiple_of(1 << 20) {
            return invalid("disk_region_size", "must be 1MiB to 256MiB in whole MiB");
        }
        if self.disk_path.is_some() && region <= self.block_size.0 {
            return invalid("disk_region_size", "must be larger than block_size");
        }
        if self.disk_path.is_some() && self.disk_capacity.0 < (1 << 20) + 2 * region {
            return invalid("disk_capacity", "must hold at least 2 regions plus 1MiB");
        }
        if self.disk_path.is_some() && self.disk_write_buffer.0 < 2 * self.block_size.0 {
            return invalid(
                "disk_write_buffer",
                "must hold at least two blocks (block_size)",
            );
        }
        let mut seen = std::collections::HashSet::new();
        for p in &self.disk_partitions {
            for b in &p.buckets {
                if !seen.insert(b.as_str()) {
                    return invalid(
                        "disk_partitions",
                        &format!("bucket {b:?} is mapped to two partitions"),
                    );
                }
            }
        }
        let sources = usize::from(!self.fleet_peers.is_empty())
            + usize::from(self.fleet_peers_file.is_some())
            + usize::from(self.fleet_peers_dns.is_some());
        if sources > 1 {
            return invalid(
                "fleet_peers",
                "fleet_peers, fleet_peers_file and fleet_peers_dns are alternatives: set one",
            );
        }
        if sources == 1 && self.fleet_secret_file.is_none() {
            return invalid(
                "fleet_secret_file",
                "is required in a fleet: replicas sign their requests to each other with it",
            );
        }
        if self.fleet_refresh.0 < Duration::from_millis(100) {
            return invalid("fleet_refresh", "must be at least 100ms");
        }
        if self.fleet_peer_timeout.0.is_zero() {
            return invalid("fleet_peer_timeout", "must be positive");
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return invalid("tls_cert", "and tls_key must be set together");
        }
        if self.auth == AuthMode::Sigv4 && self.auth_credentials.is_none() {
            return invalid(
                "auth_credentials",
                "is required with auth = \"sigv4\" (the default): give a file of access_key_id:secret_access_key lines, or choose auth = \"none\" explicitly",
            );
        }
        if self.auth == AuthMode::None && !self.auth_policies.is_empty() {
            return invalid("auth_policies", "need auth = \"sigv4\"");
        }
        if self.upstream_connect_timeout.0.is_zero() {
            return invalid("upstream_connect_timeout", "must be positive");
        }
        if self.upstream_first_byte_timeout.0.is_zero() {
            return invalid("upstream_first_byte_timeout", "must be positive");
        }
        if !(1..=10).contains(&self.upstream_max_attempts) {
            return invalid("upstream_max_attempts", "must be between 1 and 10");
        }
        if self.upstream_max_resumes > 100 {
            return invalid("upstream_max_resumes", "must be at most 100");
        }
        if !(0.0..1.0).contains(&self.upstream_hedge_quantile) {
            return invalid(
                "upstream_hedge_quantile",
                "must be at least 0 (off) and below 1",
            );
        }
        if self.prefetch_min_window == 0 || self.prefetch_min_window > self.prefetch_max_window {
            return invalid(
                "prefetch_min_window",
                "must be at least 1 and at most prefetch_max_window",
            );
        }
        if self.prefetch_max_window > 1024 {
            return invalid("prefetch_max_window", "must be at most 1024 blocks");
        }
        if self.prefetch_max_inflight == 0 {
            return invalid("prefetch_max_inflight", "must be positive");
        }
        if self.warm_concurrency == 0 || self.warm_concurrency > 256 {
            return invalid("warm_concurrency", "must be between 1 and 256");
        }
        if self.warm_rate.0 == 0 {
            return invalid("warm_rate", "must be positive");
        }
        if let Some(url) = &self.otlp_endpoint {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return invalid("otlp_endpoint", "must be an http:// or https:// URL");
            }
        }
        if self.otlp_interval.0.is_zero() {
            return invalid("otlp_interval", "must be positive");
        }
        if !(0.0..=1.0).contains(&self.trace_sample_ratio) {
            return invalid("trace_sample_ratio", "must be between 0 and 1");
        }
        let prices = [
            ("price_get_per_1000", self.price_get_per_1000),
            ("price_put_per_1000", self.price_put_per_1000),
            ("price_internet_per_gb", self.price_internet_per_gb),
            ("price_cross_region_per_gb", self.price_cross_region_per_gb),
            ("price_cross_az_per_gb", self.price_cross_az_per_gb),
        ];
        for (field, price) in prices {
            if !(price.is_finite() && price >= 0.0) {
                return invalid(field, "must be a price of zero or more");
            }
        }
        if let Some(url) = &self.upstream_endpoint {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return invalid("upstream_endpoint", "must be an http:// or https:// URL");
            }
        }
        Ok(())
    }
}

impl Config {
    /// The prices the cost metrics use.
    pub fn traces(&self) -> TraceOptions {
        TraceOptions {
            log_format: self.log_format,
            otlp_endpoint: self.otlp_endpoint.clone(),
            slow_threshold: self.trace_slow_threshold.0,
            sample_ratio: self.trace_sample_ratio,
        }
    }

    /// What the metrics price requests and bytes at.
    pub fn prices(&self) -> crate::telemetry::metrics::Prices {
        let per_gb = match self.upstream_transfer {
            TransferKind::SameRegion => 0.0,
            TransferKind::CrossAz => self.price_cross_az_per_gb,
            TransferKind::CrossRegion => self.price_cross_region_per_gb,
            TransferKind::Internet => self.price_internet_per_gb,
        };
        crate::telemetry::metrics::Prices {
            get_request: self.price_get_per_1000 / 1000.0,
            put_request: self.price_put_per_1000 / 1000.0,
            transfer_byte: per_gb / 1e9,
        }
    }
}

/// A size in bytes, written as an integer or with a unit: `512MiB`, `8 MiB`, `1GB`, `4096`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl FromStr for ByteSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (digits, unit) = s.split_at(split);
        let n: u64 = digits
            .parse()
            .map_err(|_| format!("`{s}` is not a size (expected e.g. 512MiB)"))?;
        let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" => 1_000,
            "kib" => 1 << 10,
            "m" | "mb" => 1_000_000,
            "mib" => 1 << 20,
            "g" | "gb" => 1_000_000_000,
            "gib" => 1 << 30,
            "t" | "tb" => 1_000_000_000_000,
            "tib" => 1 << 40,
            other => return Err(format!("unknown size unit `{other}` in `{s}`")),
        };
        n.checked_mul(mult)
            .map(ByteSize)
            .ok_or_else(|| format!("size `{s}` is too large"))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(u64, &str); 4] = [
            (1 << 40, "TiB"),
            (1 << 30, "GiB"),
            (1 << 20, "MiB"),
            (1 << 10, "KiB"),
        ];
        for (mult, unit) in UNITS {
            if self.0 >= mult && self.0.is_multiple_of(mult) {
                return write!(f, "{}{unit}", self.0 / mult);
            }
        }
        write!(f, "{}", self.0)
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        int_or_text(d, ByteSize)
    }
}

/// A value written either as a bare integer (bytes, seconds) or as text with a unit.
fn int_or_text<'de, D, T>(d: D, from_int: fn(u64) -> T) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr<Err = String>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Int(u64),
        Text(String),
    }
    match Raw::deserialize(d)? {
        Raw::Int(n) => Ok(from_int(n)),
        Raw::Text(s) => s.parse().map_err(serde::de::Error::custom),
    }
}

/// A duration written with a unit: `30s`, `5m`, `250ms`, `1h`, `0s`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl FromStr for HumanDuration {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (digits, unit) = s.split_at(split);
        let n: u64 = digits
            .parse()
            .map_err(|_| format!("`{s}` is not a duration (expected e.g. 30s)"))?;
        let d = match unit.trim() {
            "ms" => Duration::from_millis(n),
            "s" | "" => Duration::from_secs(n),
            "m" => Duration::from_secs(n.saturating_mul(60)),
            "h" => Duration::from_secs(n.saturating_mul(3600)),
            other => {
                return Err(format!(
                    "unknown duration unit `{other}` in `{s}` (use ms, s, m or h)"
                ))
            }
        };
        Ok(HumanDuration(d))
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if !ms.is_multiple_of(1000) {
            write!(f, "{ms}ms")
        } else {
            write!(f, "{}s", ms / 1000)
        }
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        int_or_text(d, |secs| HumanDuration(Duration::from_secs(secs)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sizes_and_durations_parse() {
        assert_eq!("512MiB".parse::<ByteSize>().unwrap(), ByteSize(512 << 20));
        assert_eq!("8 MiB".parse::<ByteSize>().unwrap(), ByteSize(8 << 20));
        assert_eq!("1GB".parse::<ByteSize>().unwrap(), ByteSize(1_000_000_000));
        assert_eq!("4096".parse::<ByteSize>().unwrap(), ByteSize(4096));
        assert!("12 parsecs".parse::<ByteSize>().is_err());
        assert!("MiB".parse::<ByteSize>().is_err());
        assert_eq!(
            "30s".parse::<HumanDuration>().unwrap().0,
            Duration::from_secs(30)
        );
        assert_eq!(
            "250ms".parse::<HumanDuration>().unwrap().0,
            Duration::from_millis(250)
        );
        assert_eq!(
            "5m".parse::<HumanDuration>().unwrap().0,
            Duration::from_secs(300)
        );
        assert!("5 fortnights".parse::<HumanDuration>().is_err());
    }

    proptest! {
        #[test]
        fn byte_size_round_trips(n in 0u64..(1 << 50)) {
            let s = ByteSize(n).to_string();
            prop_assert_eq!(s.parse::<ByteSize>().unwrap(), ByteSize(n));
        }
    }

    #[derive(Serialize, Default)]
    struct Flags {
        #[serde(skip_serializing_if = "Option::is_none")]
        block_size: Option<String>,
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's closure must return figment's own error
    fn layers_apply_in_order_and_errors_name_the_field() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("LARDER_AUTH", "none");
            jail.create_file(
                "larder.toml",
                "block_size = \"1MiB\"\nmetadata_ttl = \"5s\"\nmemory_capacity = \"64MiB\"\n",
            )?;
            jail.set_env("LARDER_METADATA_TTL", "7s");
            let path = jail.directory().join("larder.toml");
            let c = Config::load(Some(&path), Flags::default()).expect("loads");
            assert_eq!(c.block_size, ByteSize(1 << 20));
            assert_eq!(c.metadata_ttl.0, Duration::from_secs(7));
            let c = Config::load(
                Some(&path),
                Flags {
                    block_size: Some("2MiB".into()),
                },
            )
            .expect("loads");
            assert_eq!(c.block_size, ByteSize(2 << 20));

            jail.set_env("LARDER_BLOCK_SIZE", "lots");
            let err = Config::load(Some(&path), Flags::default())
                .unwrap_err()
                .to_string();
            assert!(err.to_lowercase().contains("block_size"), "{err}");
            jail.set_env("LARDER_BLOCK_SIZE", "1KiB");
            let err = Config::load(Some(&path), Flags::default())
                .unwrap_err()
                .to_string();
            assert!(err.to_lowercase().contains("block_size"), "{err}");
            jail.set_env("LARDER_BLOCK_SIZE", "1MiB");
            jail.set_env("LARDER_NO_SUCH_OPTION", "1");
            let err = Config::load(Some(&path), Flags::default())
                .unwrap_err()
                .to_string();
            assert!(err.contains("no_such_option"), "{err}");
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's closure must return figment's own error
    fn disk_options_parse_from_toml_and_env() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("LARDER_AUTH", "none");
            jail.create_file(
                "larder.toml",
                r#"
disk_path = "/tmp/larder.cache"
disk_capacity = "20GiB"
io_engine = "psync"
disk_admission = "second-hit"
disk_write_policy = "on-evict"

[[disk_partitions]]
name = "tables"
capacity = "8GiB"
buckets = ["lake", "warehouse"]
"#,
            )?;
            jail.set_env("LARDER_DISK_RECOVERY", "strict");
            let path = jail.directory().join("larder.toml");
            let c = Config::load(Some(&path), Flags::default()).expect("loads");
            assert_eq!(c.disk_capacity, ByteSize(20 << 30));
            assert_eq!(c.io_engine, IoEngineKind::Psync);
            assert_eq!(c.disk_admission, DiskAdmission::SecondHit);
            assert_eq!(c.disk_write_policy, DiskWritePolicy::OnEvict);
            assert_eq!(c.disk_recovery, DiskRecovery::Strict);
            assert_eq!(c.disk_partitions[0].buckets, ["lake", "warehouse"]);

            jail.set_env("LARDER_IO_ENGINE", "spdk");
            let err = Config::load(Some(&path), Flags::default())
                .unwrap_err()
                .to_string();
            assert!(err.to_lowercase().contains("io_engine"), "{err}");
            jail.set_env("LARDER_IO_ENGINE", "uring");
            jail.create_file(
                "two.toml",
                "[[disk_partitions]]\nname = \"a\"\ncapacity = \"1GiB\"\nbuckets = [\"x\"]\n\
                 [[disk_partitions]]\nname = \"b\"\ncapacity = \"1GiB\"\nbuckets = [\"x\"]\n",
            )?;
            let err = Config::load(Some(&jail.directory().join("two.toml")), Flags::default())
                .unwrap_err()
                .to_string();
            assert!(err.contains("mapped to two partitions"), "{err}");
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's closure must return figment's own error
    fn auth_is_on_by_default_and_needs_keys() {
        figment::Jail::expect_with(|jail| {
            let err = Config::load(None, Flags::default())
                .unwrap_err()
                .to_string();
            assert!(err.contains("auth_credentials"), "{err}");
            jail.create_file(
                "larder.toml",
                r#"
auth_credentials = "/etc/larder/keys"
tls_cert = "/etc/larder/cert.pem"
tls_key = "/etc/larder/key.pem"

[[auth_policies]]
access_key = "analytics"
buckets = ["lake", "logs-*"]
access = "read-only"

[[auth_policies]]
access_key = "etl"
"#,
            )?;
            let path = jail.directory().join("larder.toml");
            let c = Config::load(Some(&path), Flags::default()).expect("loads");
            assert_eq!(c.auth, AuthMode::Sigv4);
            assert_eq!(c.auth_policies[0].access, crate::auth::Access::ReadOnly);
            assert_eq!(c.auth_policies[1].buckets, ["*"]);
            assert_eq!(c.auth_policies[1].access, crate::auth::Access::ReadWrite);
            jail.create_file("half.toml", "auth = \"none\"\ntls_cert = \"c.pem\"\n")?;
            let err = Config::load(Some(&jail.directory().join("half.toml")), Flags::default())
                .unwrap_err()
                .to_string();
            assert!(err.contains("tls_cert"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn every_option_is_listed_and_documented() {
        let serialized = toml::to_string(&Config {
            base_domain: Some("x".into()),
            upstream_endpoint: Some("http://x".into()),
            disk_path: Some("/x".into()),
            auth_credentials: Some("/x".into()),
            tls_cert: Some("/x".into()),
            tls_key: Some("/x".into()),
            otlp_endpoint: Some("http://x".into()),
            fleet_peers_file: Some("/x".into()),
            fleet_peers_dns: Some("x:1".into()),
            fleet_advertise: Some("x:1".into()),
            fleet_secret_file: Some("/x".into()),
            fleet_zone: Some("x".into()),
            admin_token_file: Some("/x".into()),
            ..Config::default()
        })
        .unwrap();
        let table: toml::Table = serialized.parse().unwrap();
        let mut keys: Vec<_> = table.keys().map(String::as_str).collect();
        let mut listed = OPTION_NAMES.to_vec();
        keys.sort_unstable();
        listed.sort_unstable();
        assert_eq!(keys, listed, "OPTION_NAMES is out of step with Config");
        let doc = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/configuration.md"
        ))
        .unwrap();
        for name in OPTION_NAMES {
            assert!(
                doc.contains(&format!("`{name}`")),
                "docs/configuration.md does not document `{name}`"
            );
            if TOML_ONLY.contains(name) {
                continue;
            }
            let flag = format!("--{}", name.replace('_', "-"));
            assert!(
                doc.contains(&flag),
                "docs/configuration.md does not document {flag}"
            );
        }
    }
}
