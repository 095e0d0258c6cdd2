//! The `larder` command: `serve` runs the proxy; `warm` warms a running one. (The demo, in front
//! of an embedded origin, is a program of its own: `larder-demo`, in `proxy/demo/`.)
#![forbid(unsafe_code)]

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use larder::auth::Authenticator;
use larder::config::Config;
use larder::upstream::roots::ExtraRoots;
use larder::upstream::s3::S3UpstreamConfig;
use larder::upstream::Clients;

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
    /// Warm an object, a prefix or byte ranges into a running Larder's disk tier, through its
    /// admin API, with a progress bar. Exits 0 when every object was warmed.
    Warm(larder::warm::cli::WarmArgs),
}

/// Flags for `serve`. Each option's flag overrides the TOML file and `LARDER_*` variables; see
/// docs/configuration.md.
#[derive(Args)]
struct ServeArgs {
    /// TOML configuration file.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Load and check the configuration, print it, and exit without serving.
    #[arg(long)]
    check_config: bool,
    #[command(flatten)]
    options: larder::config::Flags,
}

fn runtime(worker_threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if worker_threads > 0 {
        builder.worker_threads(worker_threads);
    }
    builder
        .enable_all()
        .build()
        .context("starting the tokio runtime")
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            let config = Config::load(args.config.as_deref(), &args.options)?;
            let runtime = runtime(config.worker_threads)?;
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
            runtime.block_on(serve(config, args.config))
        }
        Command::Warm(args) => {
            let code = runtime(0)?.block_on(larder::warm::cli::run(args))?;
            std::process::exit(code)
        }
    }
}

/// Serve `config`, loaded from `file` (whose `auth_policies` are read again when it changes).
async fn serve(config: Config, file: Option<PathBuf>) -> anyhow::Result<()> {
    tracing::info!(
        worker_threads = tokio::runtime::Handle::current().metrics().num_workers(),
        "request threads started"
    );
    raise_open_files();
    let auth = Authenticator::load(
        config.auth,
        config.auth_credentials.as_deref(),
        file.as_deref(),
        &config.auth_policies,
    )?;
    match &auth {
        Authenticator::None => tracing::warn!("auth = none: any client that reaches the S3 listener reads and writes through Larder's upstream credentials"),
        Authenticator::SigV4(keys) => tracing::info!(keys = keys.current().len(), "clients must sign requests (SigV4)"),
    }
    let upstream = Clients::s3(&S3UpstreamConfig {
        endpoint: config.upstream_endpoint.clone(),
        region: config.upstream_region.clone(),
        path_style: config.upstream_path_style,
        credentials: None,
        connect_timeout: config.upstream_connect_timeout.0,
        first_byte_timeout: config.upstream_first_byte_timeout.0,
        max_attempts: config.upstream_max_attempts,
        requester_pays: config.upstream_requester_pays,
        extra_roots: config
            .upstream_ca_file
            .as_deref()
            .map(ExtraRoots::load)
            .transpose()?,
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

/// Raise the soft limit on open files to the hard one, as nginx's `worker_rlimit_nofile` and
/// most servers do: a shell's default soft limit (often 1,024) is below what `max_connections`
/// (4,096) needs, and a cleartext connection that has sent a large body holds a pipe as well
/// (two more descriptors; `front/server/lend.rs`). Accepting fails, and is retried, when
/// descriptors run out; a connection that cannot get a pipe copies.
fn raise_open_files() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    let (soft, hard) = (limit.current, limit.maximum);
    if soft < hard {
        limit.current = hard;
        match setrlimit(Resource::Nofile, limit) {
            Ok(()) => tracing::debug!(?soft, ?hard, "open files limit raised"),
            Err(e) => {
                tracing::warn!(error = %e, ?soft, ?hard, "could not raise the open files limit")
            }
        }
    }
}
