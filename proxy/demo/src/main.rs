//! `larder-demo`: Larder's main job on an embedded default, with no AWS account.
//!
//! It starts an S3-compatible origin (s3s-fs over a temporary directory, with a simulated S3
//! first-byte latency), loads sample objects into it, starts Larder in front of it, and runs the
//! same concurrent read workload three times: straight at the origin, through a cold Larder,
//! and through a warm one. Every response is checked byte for byte against what was uploaded.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::Client;
use bytes::Bytes;
use hdrhistogram::Histogram;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use rand::{Rng, SeedableRng};
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use larder::auth::{Authenticator, KeyStore, LiveKeys};
use larder::config::{ByteSize, Config, HumanDuration};
use larder::telemetry::metrics::Metrics;
use larder::upstream::s3::S3UpstreamConfig;
use larder::upstream::Clients;

const BUCKET: &str = "demo-bucket";
const ACCESS_KEY: &str = "larder-demo";
const SECRET_KEY: &str = "larder-demo-secret";
/// The key the demo's clients sign with; Larder re-signs with the origin's key.
const CLIENT_KEY: &str = "demo-client";
const CLIENT_SECRET: &str = "demo-client-secret";

/// Run Larder in front of an embedded S3 origin with a sample workload, print what it saved, and
/// exit. Needs no AWS account.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "larder-demo", version)]
struct DemoArgs {
    /// Concurrent clients.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Requests each client makes per phase.
    #[arg(long, default_value_t = 25)]
    requests: usize,
    /// Latency added to every origin request, standing in for S3's first-byte latency.
    #[arg(long, default_value = "20ms")]
    origin_latency: HumanDuration,
}

struct Sample {
    key: String,
    data: Bytes,
}

fn main() -> anyhow::Result<()> {
    let args = <DemoArgs as clap::Parser>::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let _telemetry = larder::telemetry::traces::init(&Config::default().traces())?;
    runtime.block_on(run(args))
}

/// Run the demo and print its table.
async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let dir = tempfile::tempdir().context("creating the origin's directory")?;
    let shutdown = CancellationToken::new();
    let origin_addr = start_origin(dir.path(), args.origin_latency.0, shutdown.clone()).await?;
    let origin_url = format!("http://{origin_addr}");
    let direct = client(&origin_url, ACCESS_KEY, SECRET_KEY);

    direct
        .create_bucket()
        .bucket(BUCKET)
        .send()
        .await
        .context("creating the demo bucket")?;
    let samples = sample_objects();
    for s in &samples {
        direct
            .put_object()
            .bucket(BUCKET)
            .key(&s.key)
            .content_type("application/octet-stream")
            .body(ByteStream::from(s.data.clone()))
            .send()
            .await
            .with_context(|| format!("uploading {}", s.key))?;
    }
    let total: usize = samples.iter().map(|s| s.data.len()).sum();

    let config = Config {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        admin_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        upstream_endpoint: Some(origin_url.clone()),
        upstream_path_style: true,
        memory_capacity: ByteSize(256 << 20),
        ..Config::default()
    };
    let upstream = Clients::s3(&S3UpstreamConfig {
        endpoint: config.upstream_endpoint.clone(),
        region: config.upstream_region.clone(),
        path_style: true,
        credentials: Some(Credentials::new(
            ACCESS_KEY,
            SECRET_KEY,
            None,
            None,
            "larder-demo",
        )),
        ..Default::default()
    })
    .await?;
    // Clients hold their own key, which Larder verifies; only Larder holds the origin's.
    let auth = Authenticator::SigV4(Arc::new(LiveKeys::fixed(KeyStore::from_pairs([(
        CLIENT_KEY,
        CLIENT_SECRET,
    )]))));
    let larder = larder::front::server::start(&config, upstream, auth)
        .await
        .context("starting larder")?;
    let through = client(
        &format!("http://{}", larder.s3_addr),
        CLIENT_KEY,
        CLIENT_SECRET,
    );
    let samples = Arc::new(samples);

    println!(
        "Larder demo: {} objects ({:.0} MiB) in an embedded S3 origin (s3s-fs, {} added latency per request);",
        samples.len(),
        total as f64 / 1048576.0,
        args.origin_latency
    );
    println!(
        "{} clients x {} reads per phase (whole objects and random ranges), every byte verified; block size {}.\n",
        args.clients, args.requests, config.block_size
    );
    let mut rows = Vec::new();
    rows.push((
        "direct to origin",
        phase(&direct, &samples, &args, 1).await?,
        None,
    ));
    for (name, seed) in [("larder, cold", 1), ("larder, warm", 2)] {
        let before = Snapshot::take(&larder.metrics);
        let lat = phase(&through, &samples, &args, seed).await?;
        let after = Snapshot::take(&larder.metrics);
        rows.push((name, lat, Some(after.minus(&before))));
    }
    print_table(&rows);
    let snap = larder.metrics.snapshot();
    let direct = snap.sum("larder_cost_direct_dollars_total", &[]);
    let upstream = snap.sum("larder_cost_upstream_dollars_total", &[]);
    println!(
        "\nAt S3 Standard request prices: the clients' {} requests through larder would have cost ${direct:.6} sent to S3;\nlarder's upstream requests cost ${upstream:.6}, a saving of ${:.6} ({:.0} %). Transfer in one region is free.",
        2 * args.clients * args.requests,
        direct - upstream,
        if direct > 0.0 { 100.0 * (direct - upstream) / direct } else { 0.0 },
    );
    println!(
        "\nlarder's status page and metrics were at http://{0}/ and http://{0}/metrics while the demo ran.",
        larder.admin_addr
    );

    larder.shutdown().await;
    shutdown.cancel();
    Ok(())
}

fn client(endpoint: &str, key: &str, secret: &str) -> Client {
    let config = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .force_path_style(true)
        .credentials_provider(Credentials::new(key, secret, None, None, "larder-demo"))
        .build();
    Client::from_conf(config)
}

/// Objects shaped like a data lake's: small files read whole, big files read in ranges.
fn sample_objects() -> Vec<Sample> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut make = |key: String, len: usize| {
        let mut data = vec![0u8; len];
        rng.fill(&mut data[..]);
        Sample {
            key,
            data: data.into(),
        }
    };
    let mut out = Vec::new();
    for i in 0..8 {
        out.push(make(format!("small/part-{i:04}.parquet"), 1 << 20));
    }
    for i in 0..2 {
        out.push(make(format!("large/shard-{i}.bin"), 40 << 20));
    }
    out
}

/// One phase of the workload; returns client-side latencies in microseconds.
async fn phase(
    client: &Client,
    samples: &Arc<Vec<Sample>>,
    args: &DemoArgs,
    seed: u64,
) -> anyhow::Result<Histogram<u64>> {
    let mut tasks = Vec::new();
    for c in 0..args.clients {
        let (client, samples, n) = (client.clone(), samples.clone(), args.requests);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed * 1000 + c as u64);
        tasks.push(tokio::spawn(async move {
            let mut lat = Histogram::<u64>::new(3)?;
            for _ in 0..n {
                let s = &samples[rng.gen_range(0..samples.len())];
                let range = if s.data.len() > (8 << 20) {
                    let len = rng.gen_range(1..=(4 << 20));
                    let start = rng.gen_range(0..s.data.len() - len);
                    Some((start, start + len))
                } else {
                    None
                };
                let started = Instant::now();
                let mut req = client.get_object().bucket(BUCKET).key(&s.key);
                if let Some((a, b)) = range {
                    req = req.range(format!("bytes={a}-{}", b - 1));
                }
                let out = req.send().await.with_context(|| format!("GET {}", s.key))?;
                let body = out.body.collect().await?.into_bytes();
                lat.record(started.elapsed().as_micros() as u64)?;
                let (a, b) = range.unwrap_or((0, s.data.len()));
                if body != s.data.slice(a..b) {
                    bail!("wrong bytes for {} range {a}..{b}", s.key);
                }
            }
            anyhow::Ok(lat)
        }));
    }
    let mut all = Histogram::<u64>::new(3)?;
    for t in tasks {
        all.add(t.await??)?;
    }
    Ok(all)
}

#[derive(Default)]
struct Snapshot(HashMap<&'static str, u64>);

impl Snapshot {
    fn take(m: &Metrics) -> Self {
        let snap = m.snapshot();
        let count = |name: &str, labels: &[(&str, &str)]| snap.sum(name, labels) as u64;
        let mut s = HashMap::new();
        for cache in ["hit-memory", "partial", "coalesced", "miss", "error"] {
            s.insert(
                cache,
                count(
                    "larder_requests_total",
                    &[("operation", "GetObject"), ("cache", cache)],
                ),
            );
        }
        s.insert(
            "upstream_gets",
            count(
                "larder_upstream_requests_total",
                &[("operation", "GetObject"), ("status", "206")],
            ),
        );
        s.insert(
            "upstream_heads",
            count(
                "larder_upstream_requests_total",
                &[("operation", "HeadObject"), ("status", "200")],
            ),
        );
        s.insert(
            "upstream_bytes",
            count("larder_upstream_received_bytes_total", &[]),
        );
        s.insert(
            "served_memory",
            count("larder_served_bytes_total", &[("tier", "memory")]),
        );
        s.insert(
            "served_upstream",
            count("larder_served_bytes_total", &[("tier", "upstream")]),
        );
        Snapshot(s)
    }

    fn minus(&self, before: &Snapshot) -> Snapshot {
        Snapshot(
            self.0
                .iter()
                .map(|(k, v)| (*k, v - before.0.get(k).copied().unwrap_or(0)))
                .collect(),
        )
    }

    fn get(&self, k: &str) -> u64 {
        self.0.get(k).copied().unwrap_or(0)
    }
}

fn print_table(rows: &[(&str, Histogram<u64>, Option<Snapshot>)]) {
    println!(
        "{:<17} {:>8} {:>10} {:>8} {:>10} {:>6} {:>10} {:>12} {:>12} {:>12} {:>9} {:>9}",
        "phase",
        "requests",
        "hit-memory",
        "partial",
        "coalesced",
        "miss",
        "upstream",
        "upstream",
        "served",
        "avoided",
        "p50",
        "p99"
    );
    println!(
        "{:<17} {:>8} {:>10} {:>8} {:>10} {:>6} {:>10} {:>12} {:>12} {:>12} {:>9} {:>9}",
        "", "", "", "", "", "", "GETs", "MiB", "MiB", "MiB", "ms", "ms"
    );
    let mib = |b: u64| format!("{:.1}", b as f64 / 1048576.0);
    let ms = |us: u64| format!("{:.1}", us as f64 / 1000.0);
    for (name, lat, snap) in rows {
        let requests = lat.len();
        let (p50, p99) = (
            ms(lat.value_at_quantile(0.5)),
            ms(lat.value_at_quantile(0.99)),
        );
        match snap {
            None => println!(
                "{:<17} {:>8} {:>10} {:>8} {:>10} {:>6} {:>10} {:>12} {:>12} {:>12} {:>9} {:>9}",
                name, requests, "-", "-", "-", "-", requests, "-", "-", "-", p50, p99
            ),
            Some(s) => {
                let served = s.get("served_memory") + s.get("served_upstream");
                println!(
                    "{:<17} {:>8} {:>10} {:>8} {:>10} {:>6} {:>10} {:>12} {:>12} {:>12} {:>9} {:>9}",
                    name,
                    requests,
                    s.get("hit-memory"),
                    s.get("partial"),
                    s.get("coalesced"),
                    s.get("miss"),
                    s.get("upstream_gets"),
                    mib(s.get("upstream_bytes")),
                    mib(served),
                    mib(served.saturating_sub(s.get("upstream_bytes"))),
                    p50,
                    p99
                );
            }
        }
    }
    println!("\n'avoided' is bytes served to clients that did not come from the origin at that moment (memory hits and shared fetches).");
}

async fn start_origin(
    root: &std::path::Path,
    latency: Duration,
    shutdown: CancellationToken,
) -> anyhow::Result<SocketAddr> {
    let fs = s3s_fs::FileSystem::new(root).map_err(|e| anyhow::anyhow!("s3s-fs: {e:?}"))?;
    let mut builder = S3ServiceBuilder::new(fs);
    builder.set_auth(SimpleAuth::from_single(ACCESS_KEY, SECRET_KEY));
    let service = builder.build();
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let http = ConnBuilder::new(TokioExecutor::new());
        loop {
            let socket = tokio::select! {
                r = listener.accept() => match r { Ok((s, _)) => s, Err(_) => continue },
                () = shutdown.cancelled() => return,
            };
            let service = service.clone();
            let delayed = hyper::service::service_fn(move |req| {
                let service = service.clone();
                async move {
                    tokio::time::sleep(latency).await;
                    hyper::service::Service::call(&service, req).await
                }
            });
            let conn = http
                .serve_connection(TokioIo::new(socket), delayed)
                .into_owned();
            tokio::spawn(async move {
                let _ = conn.await;
            });
        }
    });
    Ok(addr)
}
