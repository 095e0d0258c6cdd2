//! One workload, two engines: Larder's disk tier (`cache_core::HybridCache` over `DiskCache`)
//! and foyer's `HybridCache` with its block engine, same entry size, device size, region size,
//! memory budget and I/O engine. Run once per engine (each in its own process, so peak RSS is
//! its own):
//!
//! `cargo run --release --manifest-path cache-core/bench-foyer/Cargo.toml -- --engine foyer`
//!
//! Fill: entries offered at `--offered` GB/s for `--seconds`; device bytes written are read from
//! /proc/self/io for both engines. Read: random gets of the newest resident keys at depth 32.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use rand::{Rng, SeedableRng};

#[derive(Parser, Debug)]
struct Args {
    /// larder or foyer.
    #[arg(long)]
    engine: String,
    /// I/O engine for both: uring or psync.
    #[arg(long, default_value = "uring")]
    io: String,
    #[arg(long, default_value = "/var/tmp/larder-foyer-bench.cache")]
    path: std::path::PathBuf,
    #[arg(long, default_value_t = 8 << 30)]
    capacity: u64,
    #[arg(long, default_value_t = 1 << 20)]
    entry: usize,
    #[arg(long, default_value_t = 64 << 20)]
    memory: usize,
    #[arg(long, default_value_t = 64 << 20)]
    region: usize,
    /// Offered write load, GB/s.
    #[arg(long, default_value_t = 20.0)]
    offered: f64,
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Stop the fill if RSS passes this many MiB (foyer's submit queue is unbounded).
    #[arg(long, default_value_t = 8192)]
    rss_cap_mib: u64,
}

fn proc_field(file: &str, field: &str) -> u64 {
    std::fs::read_to_string(file)
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn rss_mib() -> u64 {
    proc_field("/proc/self/status", "VmRSS:") / 1024
}

fn written() -> u64 {
    proc_field("/proc/self/io", "write_bytes:")
}

#[derive(Clone)]
enum Engine {
    Larder(Arc<cache_core::HybridCache<Key>>),
    Foyer(foyer::HybridCache<u64, Bytes>),
}

#[derive(Clone, Hash, PartialEq, Eq)]
struct Key(u64);
impl cache_core::CacheKey for Key {
    fn disk_key(&self) -> Vec<u8> {
        self.0.to_le_bytes().to_vec()
    }
}

impl Engine {
    async fn open(a: &Args) -> Self {
        let _ = std::fs::remove_file(&a.path);
        match a.engine.as_str() {
            "larder" => {
                let mut cfg = cache_core::DiskConfig::new(&a.path, a.capacity);
                cfg.region_size = a.region as u64;
                cfg.engine = if a.io == "uring" {
                    cache_core::disk::EngineKind::Uring
                } else {
                    cache_core::disk::EngineKind::Psync
                };
                let disk = cache_core::DiskCache::open(cfg).await.expect("larder");
                Engine::Larder(Arc::new(cache_core::HybridCache::new(
                    a.memory as u64,
                    Some(disk),
                    cache_core::WritePolicy::OnInsert,
                )))
            }
            _ => {
                use foyer::{
                    BlockEngineConfig, DeviceBuilder, FileDeviceBuilder, HybridCacheBuilder,
                    HybridCachePolicy, PsyncIoEngineConfig, UringIoEngineConfig,
                };
                let device = FileDeviceBuilder::new(&a.path)
                    .with_capacity(a.capacity as usize)
                    .with_direct(true)
                    .build()
                    .expect("device");
                let builder = HybridCacheBuilder::new()
                    .with_policy(HybridCachePolicy::WriteOnInsertion)
                    .memory(a.memory)
                    .with_weighter(|_k: &u64, v: &Bytes| v.len())
                    .storage();
                let builder = if a.io == "uring" {
                    builder.with_io_engine_config(Box::new(UringIoEngineConfig::new()) as Box<dyn foyer::IoEngineConfig>)
                } else {
                    builder.with_io_engine_config(PsyncIoEngineConfig::new())
                };
                let cache = builder
                    .with_engine_config(BlockEngineConfig::new(device).with_block_size(a.region))
                    .build()
                    .await
                    .expect("foyer");
                Engine::Foyer(cache)
            }
        }
    }

    async fn insert(&self, key: u64, value: Bytes) {
        match self {
            Engine::Larder(c) => c.insert(Key(key), value).await,
            Engine::Foyer(c) => {
                c.insert(key, value);
            }
        }
    }

    async fn get(&self, key: u64) -> Option<usize> {
        match self {
            Engine::Larder(c) => c.get(&Key(key)).await.map(|(v, _)| v.len()),
            Engine::Foyer(c) => c.get(&key).await.ok().flatten().map(|e| e.value().len()),
        }
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let a = Args::parse();
    let engine = Engine::open(&a).await;
    let value = Bytes::from((0..a.entry).map(|i| (i * 7 + 3) as u8).collect::<Vec<u8>>());
    let per_ms = a.offered * 1e9 / 1000.0 / a.entry as f64;
    let w0 = written();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(a.seconds);
    let (mut key, mut offered, mut peak, mut aborted) = (0u64, 0f64, 0u64, false);
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    while Instant::now() < deadline {
        tick.tick().await;
        let due = started.elapsed().as_secs_f64() * 1000.0 * per_ms;
        while offered < due {
            offered += 1.0;
            key += 1;
            engine.insert(key, value.clone()).await;
        }
        if key % 64 == 0 {
            peak = peak.max(rss_mib());
            if peak > a.rss_cap_mib {
                aborted = true;
                break;
            }
        }
    }
    let fill_time = started.elapsed();
    let fill_written = written() - w0;
    peak = peak.max(rss_mib());
    println!(
        "| {} ({}) | fill | offered {:.1} GB/s | written {:.2} GB/s | {} entries offered{} | peak RSS {} MiB |",
        a.engine,
        a.io,
        key as f64 * a.entry as f64 / fill_time.as_secs_f64() / 1e9,
        fill_written as f64 / fill_time.as_secs_f64() / 1e9,
        key,
        if aborted { ", ABORTED at the RSS cap" } else { "" },
        peak
    );
    // Let queued writes land before reading.
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Which keys each engine kept is its own business (both drop under overload), so find the
    // resident ones first and read only those: every read below is a disk (or memory) hit.
    let candidates = (3 * a.capacity / a.entry as u64).min(key);
    let mut scans = Vec::new();
    for t in 0..32u64 {
        let engine = engine.clone();
        scans.push(tokio::spawn(async move {
            let mut found = Vec::new();
            let mut k = key - t;
            while k + candidates > key && k > 0 {
                if engine.get(k).await.is_some() {
                    found.push(k);
                }
                k = k.saturating_sub(32);
            }
            found
        }));
    }
    let mut resident = Vec::new();
    for s in scans {
        resident.extend(s.await.expect("scan"));
    }
    let resident: Arc<[u64]> = resident.into();
    let deadline = Instant::now() + Duration::from_secs(a.seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..32u64 {
        let (engine, resident) = (engine.clone(), resident.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(t);
            let mut hist = hdrhistogram::Histogram::<u64>::new(3).expect("hist");
            let (mut bytes, mut hits, mut misses) = (0u64, 0u64, 0u64);
            while Instant::now() < deadline && !resident.is_empty() {
                let k = resident[rng.gen_range(0..resident.len())];
                let t0 = Instant::now();
                match engine.get(k).await {
                    Some(n) => {
                        bytes += n as u64;
                        hits += 1;
                    }
                    None => misses += 1,
                }
                let _ = hist.record(t0.elapsed().as_micros() as u64);
            }
            (bytes, hits, misses, hist)
        }));
    }
    let mut total = hdrhistogram::Histogram::<u64>::new(3).expect("hist");
    let (mut bytes, mut hits, mut misses) = (0, 0, 0);
    for t in tasks {
        let (b, h, m, hist) = t.await.expect("reader");
        bytes += b;
        hits += h;
        misses += m;
        total.add(hist).expect("merge");
    }
    let q = |x: f64| total.value_at_quantile(x) as f64 / 1000.0;
    println!(
        "| {} ({}) | read | {:.2} GB/s | {} resident of the last {} offered; {} hits, {} misses | p50 {:.1} p99 {:.1} p99.99 {:.1} ms | peak RSS {} MiB |",
        a.engine,
        a.io,
        bytes as f64 / started.elapsed().as_secs_f64() / 1e9,
        resident.len(),
        candidates,
        hits,
        misses,
        q(0.5),
        q(0.99),
        q(0.9999),
        proc_field("/proc/self/status", "VmHWM:") / 1024
    );
    let _ = std::fs::remove_file(&a.path);
}
