//! The `larder` command: `serve` runs the proxy; `demo` runs it in front of an embedded origin.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use larder::auth::Authenticator;
use larder::config::Config;
use larder::upstream::s3::S3UpstreamConfig;
use larder::upstream::Clients;
use serde::Serialize;

#[derive(Parser)]
#[command(
    name = "larder",
    version,
    about = "An S3-compatible read-through caching proxy"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve S3 clients, caching reads from the upstream.
    Serve(Box<ServeArgs>),
    /// Run Larder in front of an embedded S3 origin with a sample workload, print what it saved,
    /// and exit. Needs no AWS account.
    #[cfg(feature = "demo")]
    Demo(larder::demo::DemoArgs),
    /// Warm an object, a prefix or byte ranges into a running Larder's disk tier, through its
    /// admin API, with a progress bar. Exits 0 when every object was warmed.
    Warm(larder::warm::cli::WarmArgs),
}

/// Flags for `serve`. Each overrides the TOML file and `LARDER_*` variables; see
/// docs/configuration.md for defaults.
#[derive(Args, Serialize)]
struct ServeArgs {
    /// TOML configuration file.
    #[arg(long)]
    #[serde(skip)]
    config: Option<PathBuf>,
    /// Load and check the configuration, print it, and exit without serving.
    #[arg(long)]
    #[serde(skip)]
    check_config: bool,
    /// Address of the S3 listener [default: 127.0.0.1:9000].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    listen: Option<String>,
    /// Address of the admin listener [default: 127.0.0.1:9001].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    admin_listen: Option<String>,
    /// Most client connections held open at once [default: 4096].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    max_connections: Option<usize>,
    /// Longest a client may take to send request headers, e.g. 10s [default: 10s].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    client_header_timeout: Option<String>,
    /// Longest a client connection may stay open with nothing moving, e.g. 60s [default: 60s].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    client_idle_timeout: Option<String>,
    /// Most requests in flight on one HTTP/2 connection [default: 256].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    client_max_streams: Option<u32>,
    /// File holding the bearer token the admin listener's /warm and /fleet routes require.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    admin_token_file: Option<PathBuf>,
    /// Client authentication: sigv4 or none [default: sigv4].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    auth: Option<String>,
    /// File of client keys, one access_key_id:secret_access_key per line.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    auth_credentials: Option<PathBuf>,
    /// PEM certificate chain for TLS on the S3 listener.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_key: Option<PathBuf>,
    /// Base domain for virtual-hosted-style requests.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    base_domain: Option<String>,
    /// Upstream S3 endpoint URL [default: AWS S3].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_endpoint: Option<String>,
    /// Upstream region [default: us-east-1].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_region: Option<String>,
    /// Address upstream buckets path-style.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_path_style: Option<bool>,
    /// Memory tier capacity, e.g. 512MiB [default: 512MiB].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    memory_capacity: Option<String>,
    /// Block size, e.g. 8MiB [default: 8MiB].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    block_size: Option<String>,
    /// How long object metadata is trusted, e.g. 60s [default: 60s].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata_ttl: Option<String>,
    /// Most object-metadata entries held [default: 100000].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata_capacity: Option<u64>,
    /// Blocks a response fetches ahead of the one it sends [default: 4].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    read_window: Option<usize>,
    /// Most bytes of blocks all responses hold at once, e.g. 1GiB [default: 1GiB].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    response_buffer: Option<String>,
    /// Longest wait for upstream body bytes, e.g. 30s [default: 30s].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_idle_timeout: Option<String>,
    /// Most block fetches running upstream at once [default: 64].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_concurrency: Option<usize>,
    /// Cache file or block device of the disk tier [default: none, memory only].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    disk_path: Option<PathBuf>,
    /// Bytes of the device the disk tier uses, e.g. 100GiB [default: 10GiB].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    disk_capacity: Option<String>,
    /// Disk region size, e.g. 64MiB [default: 64MiB].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    disk_region_size: Option<String>,
    /// Disk I/O engine: psync or uring [default: psync].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    io_engine: Option<String>,
    /// Disk admission: always or second-hit [default: always].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    disk_admission: Option<String>,
    /// Most bytes per second written to disk, 0 for no limit [default: 512MiB].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    disk_write_rate: Option<String>,
    /// Bytes of blocks waiting for a disk write, per partition [default: 64MiB].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    disk_write_buffer: Option<String>,
    /// Disk recovery at start: none, quiet or strict [default: quiet].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    disk_recovery: Option<String>,
    /// When blocks reach disk: on-insert or on-evict [default: on-insert].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    disk_write_policy: Option<String>,
    /// Longest wait to connect upstream, e.g. 5s [default: 5s].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_connect_timeout: Option<String>,
    /// Longest wait for upstream response headers, e.g. 30s [default: 30s].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_first_byte_timeout: Option<String>,
    /// Attempts per upstream GET/HEAD, with backoff and jitter [default: 3].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_max_attempts: Option<u32>,
    /// Times a broken upstream body is resumed [default: 3].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_max_resumes: Option<u32>,
    /// Hedge block GETs slower than this quantile of recent ones, e.g. 0.95 [default: 0, off].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_hedge_quantile: Option<f64>,
    /// Serve cached data this long past its TTL when the upstream fails, e.g. 10m [default: 0s, off].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    serve_stale_on_error: Option<String>,
    /// Read-ahead across ranged GETs: auto or off [default: auto].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    prefetch: Option<String>,
    /// Blocks read ahead when a sequence starts [default: 2].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    prefetch_min_window: Option<u64>,
    /// Most blocks read ahead of one reader [default: 16].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    prefetch_max_window: Option<u64>,
    /// Most read-ahead fetches at once [default: 16].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    prefetch_max_inflight: Option<usize>,
    /// Blocks a warm-up job fetches at once [default: 4].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    warm_concurrency: Option<usize>,
    /// Most bytes per second a warm-up job fetches, e.g. 256MiB [default: 256MiB].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    warm_rate: Option<String>,
    /// Log format: text or json [default: text].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    log_format: Option<String>,
    /// OTLP/HTTP collector base URL for metrics and traces, e.g. http://127.0.0.1:4318.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    otlp_endpoint: Option<String>,
    /// How often metrics are pushed by OTLP, e.g. 10s [default: 10s].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    otlp_interval: Option<String>,
    /// Export traces of requests at least this slow, e.g. 1s [default: 1s].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    trace_slow_threshold: Option<String>,
    /// Share of faster requests whose traces are exported too, 0 to 1 [default: 0].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    trace_sample_ratio: Option<f64>,
    /// Buckets named in the metrics' bucket label, comma-separated [default: none].
    #[arg(long, value_delimiter = ',')]
    #[serde(skip_serializing_if = "Option::is_none")]
    metrics_buckets: Option<Vec<String>>,
    /// Dollars per 1,000 GET-class requests [default: 0.0004].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    price_get_per_1000: Option<f64>,
    /// Dollars per 1,000 PUT-class requests [default: 0.005].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    price_put_per_1000: Option<f64>,
    /// Dollars per GB to the internet [default: 0.09].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    price_internet_per_gb: Option<f64>,
    /// Dollars per GB to another region [default: 0.02].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    price_cross_region_per_gb: Option<f64>,
    /// Dollars per GB across availability zones [default: 0.01].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    price_cross_az_per_gb: Option<f64>,
    /// Where S3's bytes travel: same-region, cross-az, cross-region or internet [default: same-region].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_transfer: Option<String>,
    /// Fleet members' peer addresses, comma-separated host:port [default: none, alone].
    #[arg(long, value_delimiter = ',')]
    #[serde(skip_serializing_if = "Option::is_none")]
    fleet_peers: Option<Vec<String>>,
    /// File of fleet members, re-read every --fleet-refresh [default: none].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    fleet_peers_file: Option<PathBuf>,
    /// DNS name:port whose addresses are the fleet members (a headless Service) [default: none].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    fleet_peers_dns: Option<String>,
    /// Address of the peer listener [default: 127.0.0.1:9002].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    fleet_listen: Option<String>,
    /// This replica's name in the member list [default: the peer listener's address].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    fleet_advertise: Option<String>,
    /// File with the secret replicas sign peer requests with (required in a fleet).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    fleet_secret_file: Option<PathBuf>,
    /// This replica's zone [default: none].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    fleet_zone: Option<String>,
    /// Owners within the zone or across the fleet: zone or fleet [default: zone].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    fleet_scope: Option<String>,
    /// How often members are listed and probed, e.g. 5s [default: 5s].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    fleet_refresh: Option<String>,
    /// How long a peer has to start answering before S3 is asked, e.g. 2s [default: 2s].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    fleet_peer_timeout: Option<String>,
    /// Bytes of peers' blocks kept in memory here, e.g. 64MiB; 0 for none [default: 64MiB].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    fleet_copy_capacity: Option<String>,
    /// How long a peer's block is kept here, e.g. 30s [default: 30s].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    fleet_copy_ttl: Option<String>,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Runtime::new().context("starting the tokio runtime")?;
    match cli.command {
        Command::Serve(args) => {
            let config = Config::load(args.config.as_deref(), &args)?;
            if args.check_config {
                print!(
                    "{}",
                    toml::to_string(&config).context("printing the configuration")?
                );
                eprintln!("configuration OK");
                return Ok(());
            }
            // Logs (and traces) are set up before anything runs, and flushed after it stops.
            let _telemetry = larder::telemetry::traces::init(&config.traces())?;
            runtime.block_on(serve(config))
        }
        #[cfg(feature = "demo")]
        Command::Demo(args) => {
            let _telemetry = larder::telemetry::traces::init(&Config::default().traces())?;
            runtime.block_on(larder::demo::run(args))
        }
        Command::Warm(args) => {
            let code = runtime.block_on(larder::warm::cli::run(args))?;
            std::process::exit(code)
        }
    }
}

async fn serve(config: Config) -> anyhow::Result<()> {
    let auth = Authenticator::load(
        config.auth,
        config.auth_credentials.as_deref(),
        &config.auth_policies,
    )?;
    match &auth {
        Authenticator::None => tracing::warn!("auth = none: any client that reaches the S3 listener reads and writes through Larder's upstream credentials"),
        Authenticator::SigV4(keys) => tracing::info!(keys = keys.len(), "clients must sign requests (SigV4)"),
    }
    let upstream = Clients::s3(&S3UpstreamConfig {
        endpoint: config.upstream_endpoint.clone(),
        region: config.upstream_region.clone(),
        path_style: config.upstream_path_style,
        credentials: None,
        connect_timeout: config.upstream_connect_timeout.0,
        first_byte_timeout: config.upstream_first_byte_timeout.0,
        max_attempts: config.upstream_max_attempts,
    })
    .await?;
    let running = larder::front::server::start(&config, upstream, auth)
        .await
        .with_context(|| {
            format!(
                "starting larder on {} and {}",
                config.listen, config.admin_listen
            )
        })?;
    let token = running.shutdown_token();
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutting down");
        token.cancel();
    });
    running.wait().await;
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
