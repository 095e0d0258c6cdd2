//! disk-bench: the disk tier against the device it runs on.
//!
//! `cargo run --release -p cache-core --example disk-bench -- --path /var/tmp/bench.cache`
//!
//! Phases (all by default, or `--phase ceiling|fill|read|recovery`):
//! - ceiling: plain O_DIRECT 1 MiB sequential writes and random reads through the raw I/O
//!   engine, the most this device gives;
//! - fill: the engine under an offered write load `--overload` times the ceiling (default 10×),
//!   reporting bytes written per second, drops by reason and peak RSS;
//! - read: random `get`s of resident entries (uniform or Zipf keys), throughput and latency;
//! - recovery: fill `--recovery-size` of cache, close, and time the reopen.
//!
//! Each of ceiling/fill/read runs once per engine in `--engines` (default `psync,uring`).
//! `--sealed` encrypts every entry (as `disk_encryption_key_file` does), for its cost.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cache_core::disk::{
    AlignedBuf, DeviceKey, DiskCache, DiskConfig, DropReason, Encryption, EngineKind, IoEngine,
    Priority, PsyncEngine, Recovery, UringEngine,
};
use clap::Parser;
use rand::{Rng, SeedableRng};

#[derive(Parser, Debug, Clone)]
struct Args {
    /// Cache file (created; removed at the end).
    #[arg(long, default_value = "/var/tmp/larder-disk-bench.cache")]
    path: std::path::PathBuf,
    /// Device bytes for ceiling/fill/read.
    #[arg(long, default_value_t = 8 << 30)]
    capacity: u64,
    /// Entry size.
    #[arg(long, default_value_t = 1 << 20)]
    entry: usize,
    /// Seconds per timed phase.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Engines to compare.
    #[arg(long, default_value = "psync,uring")]
    engines: String,
    /// Phase to run: all, ceiling, fill, read, recovery.
    #[arg(long, default_value = "all")]
    phase: String,
    /// Offered write load as a multiple of the measured write ceiling.
    #[arg(long, default_value_t = 10.0)]
    overload: f64,
    /// Key distribution for reads: uniform or zipf.
    #[arg(long, default_value = "uniform")]
    keys: String,
    /// I/O threads (psync workers or io_uring rings), for the ceiling and the engine alike.
    #[arg(long, default_value_t = 4)]
    io_threads: usize,
    /// Requests in flight for ceiling and read phases.
    #[arg(long, default_value_t = 32)]
    depth: usize,
    /// Cache size for the recovery phase.
    #[arg(long, default_value_t = 20 << 30)]
    recovery_size: u64,
    /// Entry size for the recovery phase (smaller entries: more entries to recover).
    #[arg(long, default_value_t = 1 << 20)]
    recovery_entry: usize,
    /// Seal every entry (encryption at rest) with a random key, to measure what it costs.
    #[arg(long)]
    sealed: bool,
}

fn rss_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn gbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}

fn open_direct(path: &std::path::Path, len: u64) -> std::fs::File {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .expect("open O_DIRECT");
    f.set_len(len).expect("set_len");
    // Preallocated, as the engine's own device file is: block allocation is not in the ceiling.
    let _ = rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::KEEP_SIZE, 0, len);
    f
}

fn engine(kind: &str, file: std::fs::File, threads: usize) -> Arc<dyn IoEngine> {
    match kind {
        "uring" => Arc::new(UringEngine::new(file, threads, 64).expect("io_uring")),
        _ => Arc::new(PsyncEngine::new(file, threads, 64).expect("psync")),
    }
}

/// Plain O_DIRECT: sequential 1 MiB writes, then random 1 MiB reads, `depth` in flight.
async fn ceiling(args: &Args, kind: &str) -> (f64, f64) {
    let io = engine(
        kind,
        open_direct(&args.path, args.capacity),
        args.io_threads,
    );
    let unit = 1u64 << 20;
    let units = args.capacity / unit;
    let next = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    // Writes at the engine's own background depth (64), so fill is compared like for like.
    for _ in 0..64 {
        let (io, next) = (io.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= units || Instant::now() > deadline {
                    break;
                }
                let mut buf = AlignedBuf::zeroed(unit as usize);
                buf.as_mut_slice()[..8].copy_from_slice(&i.to_le_bytes());
                io.write(i * unit, buf).await.expect("write");
            }
        }));
    }
    for t in tasks {
        t.await.expect("writer");
    }
    let written = next.load(Ordering::Relaxed).min(units);
    let write = gbps(written * unit, started.elapsed());
    let read_bytes = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..args.depth {
        let (io, read_bytes) = (io.clone(), read_bytes.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64);
            while Instant::now() < deadline {
                let i = rng.gen_range(0..written.max(1));
                io.read(i * unit, unit as usize, Priority::Demand)
                    .await
                    .expect("read");
                read_bytes.fetch_add(unit, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.expect("reader");
    }
    let read = gbps(read_bytes.load(Ordering::Relaxed), started.elapsed());
    drop(io);
    (write, read)
}

fn config(args: &Args, kind: &str, capacity: u64) -> DiskConfig {
    let mut cfg = DiskConfig::new(&args.path, capacity);
    cfg.engine = if kind == "uring" {
        EngineKind::Uring
    } else {
        EngineKind::Psync
    };
    cfg.recovery = Recovery::None;
    cfg.io_threads = args.io_threads;
    if args.sealed {
        cfg.encryption = Some(Encryption {
            key: DeviceKey::new(&rand::random()),
            previous: None,
        });
    }
    cfg
}

struct Fill {
    gbps: f64,
    offered_gbps: f64,
    dropped: Vec<(DropReason, u64)>,
    peak_rss_mib: u64,
    offered: u64,
    /// Keys accepted, in insertion order.
    keys: Vec<u64>,
}

/// Offer entries at `overload` × the write ceiling for `seconds`; measure what reaches disk.
async fn fill(args: &Args, disk: &DiskCache, ceiling_write: f64) -> Fill {
    let p = disk.partition("default").expect("default");
    let value = Bytes::from(
        (0..args.entry)
            .map(|i| (i * 7 + 3) as u8)
            .collect::<Vec<u8>>(),
    );
    let offered_rate = ceiling_write * 1e9 * args.overload;
    let per_ms = (offered_rate / 1000.0 / args.entry as f64).max(1.0);
    let before = disk.stats();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.seconds);
    let (mut key, mut offered, mut accepted) = (0u64, 0f64, Vec::new());
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    while Instant::now() < deadline {
        tick.tick().await;
        // Catch up to the offered rate for the time elapsed.
        let due = started.elapsed().as_secs_f64() * 1000.0 * per_ms;
        while offered < due {
            offered += 1.0;
            key += 1;
            if p.insert(&key.to_le_bytes(), value.clone()).is_ok() {
                accepted.push(key);
            }
        }
    }
    let elapsed = started.elapsed();
    disk.flush().await;
    let after = disk.stats();
    Fill {
        gbps: gbps(after.written_bytes - before.written_bytes, elapsed),
        offered_gbps: offered * args.entry as f64 / elapsed.as_secs_f64() / 1e9,
        offered: key,
        keys: accepted,
        dropped: DropReason::ALL
            .iter()
            .map(|r| (*r, after.dropped(*r) - before.dropped(*r)))
            .filter(|(_, n)| *n > 0)
            .collect(),
        peak_rss_mib: rss_kib("VmHWM:") / 1024,
    }
}

struct Read {
    gbps: f64,
    hits: u64,
    misses: u64,
    p: [f64; 5],
}

/// Random gets of the newest `resident` accepted keys at `depth` in flight.
async fn read(args: &Args, disk: &DiskCache, keys: &[u64], resident: usize) -> Read {
    let p = disk.partition("default").expect("default");
    let keys: Arc<[u64]> = keys[keys.len().saturating_sub(resident)..].into();
    let zipf = args.keys == "zipf";
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..args.depth {
        let (p, keys) = (p.clone(), keys.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(100 + t as u64);
            let mut hist = hdrhistogram::Histogram::<u64>::new(3).expect("hist");
            let (mut bytes, mut hits, mut misses) = (0u64, 0u64, 0u64);
            let n = keys.len().max(1) as u64;
            while Instant::now() < deadline {
                let off = if zipf {
                    // Zipf-like (s≈1): rank by inverse CDF of a log-uniform draw.
                    let r = (n as f64).powf(rng.gen::<f64>()) as u64;
                    r.min(n - 1)
                } else {
                    rng.gen_range(0..n)
                };
                let key = keys[(n - 1 - off) as usize];
                let t0 = Instant::now();
                match p.get(&key.to_le_bytes()).await {
                    Some(v) => {
                        bytes += v.len() as u64;
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
    Read {
        gbps: gbps(bytes, started.elapsed()),
        hits,
        misses,
        p: [q(0.5), q(0.9), q(0.99), q(0.999), q(0.9999)],
    }
}

async fn recovery(args: &Args) {
    let mut cfg = config(args, "psync", args.recovery_size + (1 << 20));
    cfg.write_buffer = 256 << 20;
    let disk = DiskCache::open(cfg.clone()).await.expect("open");
    let p = disk.partition("default").expect("default");
    let value = Bytes::from(vec![0x5au8; args.recovery_entry]);
    let on_disk = (args.recovery_entry as u64).div_ceil(4096) * 4096 + 4096;
    // Regions also hold a header page and a summary, so fill a little short of capacity.
    let entries = args.recovery_size / on_disk * 95 / 100;
    let started = Instant::now();
    let mut key = 0u64;
    while key < entries {
        if p.insert(&key.to_le_bytes(), value.clone()).is_ok() {
            key += 1;
        } else {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    disk.close().await;
    let filled = started.elapsed();
    let stats = disk.stats();
    drop((p, disk));
    cfg.recovery = Recovery::Quiet;
    let started = Instant::now();
    let disk = DiskCache::open(cfg).await.expect("reopen");
    let took = started.elapsed();
    let r = disk.recovery();
    println!(
        "| recovery | {} KiB entries | {:.1} GiB cache, {} entries, {} regions (filled in {:.1} s) | reopen {:.0} ms | {} entries recovered, {:.1} B index/entry |",
        args.recovery_entry >> 10,
        stats.live_bytes as f64 / (1u64 << 30) as f64,
        stats.entries,
        r.regions,
        filled.as_secs_f64(),
        took.as_secs_f64() * 1000.0,
        r.entries,
        disk.stats().index_bytes_per_entry()
    );
    disk.close().await;
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args = Args::parse();
    let phase = args.phase.as_str();
    println!(
        "disk-bench: {} GiB at {}, entries {} KiB, {} s per phase, depth {}",
        args.capacity >> 30,
        args.path.display(),
        args.entry >> 10,
        args.seconds,
        args.depth
    );
    println!("| phase | engine | result | ratio to ceiling | detail |");
    println!("|---|---|---|---|---|");
    for kind in args.engines.split(',') {
        let _ = std::fs::remove_file(&args.path);
        let (cw, cr) = ceiling(&args, kind).await;
        if phase == "all" || phase == "ceiling" {
            println!("| ceiling | {kind} | write {cw:.2} GB/s, read {cr:.2} GB/s | 1.00 | O_DIRECT 1 MiB; writes sequential at depth 64, reads random at depth {} |", args.depth);
        }
        if !(phase == "all" || phase == "fill" || phase == "read") {
            continue;
        }
        let _ = std::fs::remove_file(&args.path);
        let mut cfg = config(&args, kind, args.capacity);
        cfg.write_rate = 0;
        let disk = DiskCache::open(cfg).await.expect("open");
        let f = fill(&args, &disk, cw).await;
        println!(
            "| fill | {kind} | {:.2} GB/s written (offered {:.1} GB/s) | {:.2} | accepted {} of {}, dropped {:?}, peak RSS {} MiB |",
            f.gbps,
            f.offered_gbps,
            f.gbps / cw,
            f.keys.len(),
            f.offered,
            f.dropped,
            f.peak_rss_mib
        );
        let resident = disk.stats().entries as usize;
        let r = read(&args, &disk, &f.keys, resident).await;
        println!(
            "| read ({}) | {kind} | {:.2} GB/s | {:.2} | {} hits, {} misses ({} corrupt, {} raced); latency ms p50 {:.2} p90 {:.2} p99 {:.2} p99.9 {:.2} p99.99 {:.2}; index {:.1} B/entry; peak RSS {} MiB |",
            args.keys,
            r.gbps,
            r.gbps / cr,
            r.hits,
            r.misses,
            disk.stats().corrupt,
            disk.stats().raced,
            r.p[0],
            r.p[1],
            r.p[2],
            r.p[3],
            r.p[4],
            disk.stats().index_bytes_per_entry(),
            rss_kib("VmHWM:") / 1024
        );
        disk.close().await;
    }
    if phase == "all" || phase == "recovery" {
        let _ = std::fs::remove_file(&args.path);
        recovery(&args).await;
    }
    let _ = std::fs::remove_file(&args.path);
}
