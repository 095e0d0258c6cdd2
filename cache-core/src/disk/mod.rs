//! The disk tier: a block engine on a preallocated file or raw device.
//!
//! [`DiskCache::open`] formats or recovers the device and returns the cache; [`DiskCache::partition`]
//! gives the named [`Partition`]s it was split into, each with its own regions, index and
//! eviction, so that one tenant's scan cannot evict another's working set. The format is in
//! `docs/disk-format.md`.

mod admission;
mod device;
mod format;
mod index;
mod io;
#[cfg(target_os = "linux")]
mod page_cache;
mod recovery;
mod sealing;
mod stats;
mod store;
#[cfg(target_os = "linux")]
mod uring;

use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use thiserror::Error;

pub use admission::Admission;
pub use format::FormatError;
pub use io::{AlignedBuf, IoEngine, Priority, PsyncEngine};
pub use sealing::{DeviceKey, Encryption, KEY_LEN as DEVICE_KEY_LEN};
pub use stats::{DiskStats, DropReason};
pub use store::{ReadFailed, ValueStream};
#[cfg(target_os = "linux")]
pub use uring::UringEngine;

use admission::Offer;
use format::{PartitionExtent, Superblock, DATA_START, FORMAT_VERSION, MAX_REGION_SIZE, PAGE};
use sealing::{DataKey, CHECK_LEN, WRAPPED_LEN};
use stats::PageCacheCounters;
use store::{Store, StoreConfig};

/// Which I/O engine drives the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "kebab-case")
)]
pub enum EngineKind {
    /// pread/pwrite on dedicated threads.
    #[default]
    Psync,
    /// io_uring (tokio-uring) on dedicated threads; falls back to psync where the kernel refuses.
    Uring,
}

/// What to do with what is on the device at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "kebab-case")
)]
pub enum Recovery {
    /// Start empty: bump the generation, which invalidates every region without touching it.
    None,
    /// Recover whatever verifies; reformat silently (with a warning) on a format or geometry
    /// change; skip damaged regions.
    #[default]
    Quiet,
    /// Recover whatever verifies, but refuse to start on a format or geometry change or on any
    /// damaged region header or summary.
    Strict,
}

/// One named partition and its share of the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionConfig {
    /// Name, up to 32 bytes.
    pub name: String,
    /// Bytes of regions (rounded down to whole regions; at least 2 regions).
    pub capacity: u64,
}

/// How to open the disk tier. [`DiskConfig::new`] fills in the defaults.
#[derive(Debug, Clone)]
pub struct DiskConfig {
    /// Cache file or block device.
    pub path: PathBuf,
    /// Bytes of the device to use.
    pub capacity: u64,
    /// Region size: the unit of append and eviction. Default 65 MiB (eight 8 MiB blocks and
    /// their headers), at most 256 MiB.
    pub region_size: u64,
    /// I/O engine. Default psync: same read throughput as io_uring on our VMs with a lower p99
    /// (docs/benchmarks.md).
    pub engine: EngineKind,
    /// I/O threads. Default 4.
    pub io_threads: usize,
    /// Requests in flight per class (demand reads, background work). Default 64.
    pub io_depth: usize,
    /// Use O_DIRECT where the filesystem allows it. Default true.
    pub direct: bool,
    /// Serve demand reads through the kernel's page cache (a second, buffered handle), inline
    /// when every page is cached; writes and background reads stay O_DIRECT. Default true.
    /// See `page_cache.rs`.
    pub page_cache: bool,
    /// Admission policy. Default [`Admission::Always`].
    pub admission: Admission,
    /// Write-rate limit in bytes/s, 0 for none. Default 0 here; the proxy sets its own.
    pub write_rate: u64,
    /// Bytes of entries accepted and not yet written, per partition. Default 64 MiB.
    pub write_buffer: u64,
    /// Largest value written. Default: whatever fits a region.
    pub max_entry: u64,
    /// Start-up behaviour. Default [`Recovery::Quiet`].
    pub recovery: Recovery,
    /// Partitions; empty means one partition `default` over the whole device. Capacity left over
    /// after the listed partitions goes to `default` if none is listed.
    pub partitions: Vec<PartitionConfig>,
    /// Seal (encrypt and authenticate) every entry, under a data key wrapped with these keys.
    /// A device whose data key neither key unwraps (or a plain one) is started empty
    /// (reformatted; `strict` refuses instead). Default: none.
    pub encryption: Option<Encryption>,
}

impl DiskConfig {
    /// Defaults for a device at `path` of `capacity` bytes.
    pub fn new(path: impl Into<PathBuf>, capacity: u64) -> Self {
        Self {
            path: path.into(),
            capacity,
            region_size: 65 << 20,
            engine: EngineKind::default(),
            io_threads: 4,
            io_depth: 64,
            direct: true,
            page_cache: true,
            admission: Admission::default(),
            write_rate: 0,
            write_buffer: 64 << 20,
            max_entry: u64::MAX,
            recovery: Recovery::default(),
            partitions: Vec::new(),
            encryption: None,
        }
    }
}

/// Why the disk tier did not open.
#[derive(Debug, Error)]
pub enum DiskError {
    /// The device could not be opened, sized or read.
    #[error("disk cache device {path}: {source}")]
    Device {
        /// The configured path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The configuration cannot describe a valid layout.
    #[error("disk cache configuration: {0}")]
    Config(String),
    /// `strict` recovery found something it will not silently discard.
    #[error("disk cache recovery (strict): {0}")]
    Strict(String),
}

/// What start-up found and how long it took.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Whether the device was (re)formatted instead of recovered.
    pub formatted: bool,
    /// Why it was formatted, if it was.
    pub format_reason: Option<String>,
    /// Regions holding data.
    pub regions: u64,
    /// Entries recovered into the index.
    pub entries: u64,
    /// Regions that were open at a crash and were scanned.
    pub scanned_regions: u64,
    /// Regions skipped as damaged.
    pub damaged_regions: u64,
    /// Wall time of the whole open.
    pub duration: Duration,
    /// The engine in use.
    pub engine: &'static str,
    /// Whether O_DIRECT is in effect.
    pub direct: bool,
    /// Whether demand reads go through the page cache.
    pub page_cache: bool,
    /// Whether entries are sealed (encrypted and authenticated).
    pub sealed: bool,
    /// Whether the device's data key was opened with [`Encryption::previous`] and is now
    /// wrapped under [`Encryption::key`]: a key rotation, contents kept.
    pub rekeyed: bool,
    /// The configured key's [`DeviceKey::fingerprint`], if entries are sealed.
    pub key_fingerprint: Option<String>,
}

struct Shared {
    partitions: Vec<(String, Arc<Store>)>,
    reclaimers: parking_lot::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    report: RecoveryReport,
    region_size: u64,
    page_cache: Arc<PageCacheCounters>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        for (_, store) in &self.partitions {
            store.closed.store(true, Ordering::Relaxed);
            store.wake();
        }
    }
}

/// The disk tier. Cheap to clone; the last clone dropped stops background work.
#[derive(Clone)]
pub struct DiskCache {
    shared: Arc<Shared>,
}

/// One partition of a [`DiskCache`]. Cheap to clone.
///
/// Keys are opaque bytes that must name immutable values: the same key always means the same
/// bytes (the proxy puts the object's ETag in the key). That is what makes a removal safe to
/// forget at a restart and two copies of a key interchangeable.
#[derive(Clone)]
pub struct Partition {
    store: Arc<Store>,
}

fn layout(cfg: &DiskConfig, regions_total: u64) -> Result<Vec<PartitionExtent>, DiskError> {
    let mut out = Vec::new();
    let mut next = 0u64;
    let min = 2u64;
    for p in &cfg.partitions {
        if p.name.is_empty() || p.name.len() > format::MAX_PARTITION_NAME {
            return Err(DiskError::Config(format!(
                "partition name {:?} must be 1 to 32 bytes",
                p.name
            )));
        }
        if out.iter().any(|e: &PartitionExtent| e.name == p.name) {
            return Err(DiskError::Config(format!(
                "partition {:?} listed twice",
                p.name
            )));
        }
        let regions = p.capacity / cfg.region_size;
        if regions < min {
            return Err(DiskError::Config(format!(
                "partition {:?} needs at least 2 regions ({} bytes)",
                p.name,
                2 * cfg.region_size
            )));
        }
        out.push(PartitionExtent {
            name: p.name.clone(),
            first_region: next as u32,
            regions: regions as u32,
        });
        next += regions;
    }
    if next > regions_total {
        return Err(DiskError::Config(format!(
            "partitions need {next} regions; the device holds {regions_total}"
        )));
    }
    if !out.iter().any(|e| e.name == "default") && regions_total - next >= min {
        out.push(PartitionExtent {
            name: "default".into(),
            first_region: next as u32,
            regions: (regions_total - next) as u32,
        });
    }
    if out.is_empty() {
        return Err(DiskError::Config(format!(
            "capacity {} holds fewer than 2 regions of {} bytes",
            cfg.capacity, cfg.region_size
        )));
    }
    if out.len() > format::MAX_PARTITIONS {
        return Err(DiskError::Config("more than 64 partitions".into()));
    }
    Ok(out)
}

fn engine(cfg: &DiskConfig, file: &std::fs::File) -> Result<Arc<dyn IoEngine>, std::io::Error> {
    #[cfg(target_os = "linux")]
    if cfg.engine == EngineKind::Uring {
        match UringEngine::new(file.try_clone()?, cfg.io_threads, cfg.io_depth) {
            Ok(e) => return Ok(Arc::new(e)),
            Err(e) => {
                tracing::warn!(error = %e, "io_uring unavailable; falling back to the psync engine")
            }
        }
    }
    Ok(Arc::new(PsyncEngine::new(
        file.try_clone()?,
        cfg.io_threads,
        cfg.io_depth,
    )?))
}

/// What a device's superblock says of the configured keys.
enum Unlock {
    /// A plain device, and no key configured.
    Plain,
    /// Its data key opened; `rewrapped` holds it wrapped under the current key if it opened
    /// only with the previous one.
    Open {
        data: Arc<DataKey>,
        rewrapped: Option<[u8; WRAPPED_LEN]>,
    },
    /// It cannot be read as configured: why.
    Refused(&'static str),
}

fn unlock(sb: &Superblock, encryption: Option<&Encryption>) -> Unlock {
    let plain = sb.sealing == [0u8; CHECK_LEN];
    let Some(enc) = encryption else {
        return if plain {
            Unlock::Plain
        } else {
            Unlock::Refused("encryption turned off")
        };
    };
    if plain {
        return Unlock::Refused("encryption turned on");
    }
    // A wrapped key that authenticates under a key, and whose check matches, is the device's.
    let open = |key: &DeviceKey| {
        key.unwrap(&sb.wrapped)
            .map(|bytes| (bytes, Arc::new(DataKey::new(&bytes))))
            .filter(|(_, data)| data.check() == sb.sealing)
    };
    if let Some((_, data)) = open(&enc.key) {
        return Unlock::Open {
            data,
            rewrapped: None,
        };
    }
    match enc.previous.as_ref().and_then(open) {
        Some((bytes, data)) => Unlock::Open {
            data,
            rewrapped: Some(enc.key.wrap(&bytes)),
        },
        None => Unlock::Refused("encryption key changed"),
    }
}

fn fresh_generation(old: u64) -> u64 {
    // Above every generation this device has seen (old + 1) and, after a wipe of the superblock,
    // unlikely to match any stale region header (the clock).
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    (old + 1).max(now)
}

impl DiskCache {
    /// Open (formatting or recovering) the device. Must be called within a Tokio runtime: writes
    /// and reclaim run as tasks on it.
    pub async fn open(cfg: DiskConfig) -> Result<Self, DiskError> {
        let started = Instant::now();
        let dev_err = |source| DiskError::Device {
            path: cfg.path.clone(),
            source,
        };
        if !cfg.region_size.is_multiple_of(1 << 20)
            || cfg.region_size == 0
            || cfg.region_size > MAX_REGION_SIZE
        {
            return Err(DiskError::Config(format!(
                "region size {} must be a multiple of 1 MiB, at most 256 MiB",
                cfg.region_size
            )));
        }
        let path = cfg.path.clone();
        let (capacity, direct, page_cache) = (cfg.capacity, cfg.direct, cfg.page_cache);
        let device = tokio::task::spawn_blocking(move || {
            device::open_device(&path, capacity, direct, page_cache)
        })
        .await
        .map_err(|e| dev_err(std::io::Error::other(e)))?
        .map_err(dev_err)?;
        let regions_total = device.capacity.saturating_sub(DATA_START) / cfg.region_size;
        if regions_total > index::MAX_REGIONS {
            return Err(DiskError::Config("more than 2^24 regions".into()));
        }
        let extents = layout(&cfg, regions_total)?;
        let page_cache_counters = Arc::new(PageCacheCounters::default());
        let page_cache = device.buffered.is_some();
        let mut io = engine(&cfg, &device.file).map_err(dev_err)?;
        #[cfg(target_os = "linux")]
        if let Some(buffered) = device.buffered {
            let reads = engine(&cfg, &buffered).map_err(dev_err)?;
            io = Arc::new(page_cache::PageCached::new(
                buffered,
                reads,
                io,
                page_cache_counters.clone(),
            ));
        }
        let first = io
            .read(0, PAGE, Priority::Background)
            .await
            .map_err(dev_err)?;
        let found = Superblock::decode(first.as_slice());
        let keys = match &found {
            Ok(sb) => unlock(sb, cfg.encryption.as_ref()),
            Err(_) => Unlock::Refused("no superblock"),
        };
        let same_geometry =
            |sb: &Superblock| sb.region_size == cfg.region_size && sb.partitions == extents;
        let format_reason = match (&found, cfg.recovery, &keys) {
            (Ok(sb), Recovery::None, _) => Some(format!(
                "recovery is none: generation {} discarded",
                sb.generation
            )),
            (Ok(_), _, Unlock::Refused(why)) => Some((*why).to_owned()),
            (Ok(sb), _, _) if !same_geometry(sb) => {
                Some("region size or partitions changed".to_owned())
            }
            (Ok(_), _, _) => None,
            (Err(FormatError::Magic), _, _) => Some("no Larder cache on the device".to_owned()),
            (Err(e), _, _) => Some(format!("superblock unreadable: {e}")),
        };
        let fresh_device = matches!(found, Err(FormatError::Magic));
        if let (Some(reason), Recovery::Strict, false) =
            (&format_reason, cfg.recovery, fresh_device)
        {
            return Err(DiskError::Strict(format!(
                "{reason}; this build writes format version {FORMAT_VERSION}. Move the device \
                 aside or start with recovery quiet or none to reformat"
            )));
        }
        // The data key, and the superblock to write if it changes: a formatted device gets a
        // data key of its own; a rotation keeps it and wraps it anew.
        let (data_key, rewrite, generation, rekeyed) = match (&found, &format_reason, keys) {
            (Ok(sb), None, Unlock::Open { data, rewrapped }) => (
                Some(data),
                rewrapped.map(|wrapped| Superblock {
                    wrapped,
                    ..sb.clone()
                }),
                sb.generation,
                rewrapped.is_some(),
            ),
            (Ok(sb), None, _) => (None, None, sb.generation, false),
            (found, _, _) => {
                let generation = fresh_generation(found.as_ref().map_or(0, |sb| sb.generation));
                let (data, sealing, wrapped) = match &cfg.encryption {
                    Some(enc) => {
                        let bytes = DataKey::generate();
                        let data = Arc::new(DataKey::new(&bytes));
                        let check = data.check();
                        (Some(data), check, enc.key.wrap(&bytes))
                    }
                    None => (None, [0u8; CHECK_LEN], [0u8; WRAPPED_LEN]),
                };
                let sb = Superblock {
                    region_size: cfg.region_size,
                    generation,
                    partitions: extents.clone(),
                    sealing,
                    wrapped,
                };
                (data, Some(sb), generation, false)
            }
        };
        if let Some(reason) = &format_reason {
            if !fresh_device {
                tracing::warn!(path = %cfg.path.display(), reason, "formatting the disk cache");
            }
        }
        if rekeyed {
            tracing::warn!(
                path = %cfg.path.display(),
                "disk encryption key rotated: the device's data key is now wrapped under the new \
                 key, its contents kept; the previous key opens it no more"
            );
        }
        if let Some(sb) = rewrite {
            let mut buf = AlignedBuf::zeroed(PAGE);
            buf.as_mut_slice().copy_from_slice(&sb.encode());
            io.write(0, buf).await.map_err(dev_err)?;
        }
        let mut report = RecoveryReport {
            formatted: format_reason.is_some(),
            format_reason,
            engine: io.name(),
            direct: device.direct,
            page_cache,
            sealed: cfg.encryption.is_some(),
            rekeyed,
            key_fingerprint: cfg.encryption.as_ref().map(|e| e.key.fingerprint()),
            ..RecoveryReport::default()
        };
        let mut partitions = Vec::new();
        let mut reclaimers = Vec::new();
        for e in &extents {
            let store = Store::new(
                StoreConfig {
                    name: e.name.clone(),
                    base: DATA_START + e.first_region as u64 * cfg.region_size,
                    regions: e.regions,
                    region_size: cfg.region_size,
                    generation,
                    admission: cfg.admission,
                    write_rate: cfg.write_rate,
                    write_buffer: cfg.write_buffer,
                    max_entry: cfg.max_entry,
                    sealing: data_key.clone(),
                },
                io.clone(),
            );
            let found = recovery::recover(&store).await;
            if found.damaged > 0 && cfg.recovery == Recovery::Strict {
                return Err(DiskError::Strict(format!(
                    "partition {:?}: {} damaged region headers or summaries",
                    e.name, found.damaged
                )));
            }
            report.regions += found.regions;
            report.entries += found.entries;
            report.scanned_regions += found.scanned;
            report.damaged_regions += found.damaged;
            reclaimers.push(tokio::spawn(store.clone().reclaimer()));
            partitions.push((e.name.clone(), store));
        }
        report.duration = started.elapsed();
        tracing::info!(
            path = %cfg.path.display(),
            engine = report.engine,
            direct = report.direct,
            page_cache = report.page_cache,
            sealed = report.sealed,
            key = report.key_fingerprint.as_deref().unwrap_or("none"),
            rekeyed = report.rekeyed,
            entries = report.entries,
            regions = report.regions,
            scanned = report.scanned_regions,
            damaged = report.damaged_regions,
            formatted = report.formatted,
            ms = report.duration.as_millis() as u64,
            "disk cache open"
        );
        Ok(Self {
            shared: Arc::new(Shared {
                partitions,
                reclaimers: parking_lot::Mutex::new(reclaimers),
                report,
                region_size: cfg.region_size,
                page_cache: page_cache_counters,
            }),
        })
    }

    /// The partition named `name`.
    pub fn partition(&self, name: &str) -> Option<Partition> {
        self.shared
            .partitions
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, store)| Partition {
                store: store.clone(),
            })
    }

    /// Names of all partitions, in device order.
    pub fn partition_names(&self) -> Vec<String> {
        self.shared
            .partitions
            .iter()
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// What start-up found.
    pub fn recovery(&self) -> &RecoveryReport {
        &self.shared.report
    }

    /// Counters summed over every partition.
    pub fn stats(&self) -> DiskStats {
        let mut s = DiskStats::default();
        for (_, store) in &self.shared.partitions {
            stats_into(store, self.shared.region_size, &mut s);
        }
        s.page_cache_reads = self.shared.page_cache.inline.load(Ordering::Relaxed);
        s.io_thread_reads = self.shared.page_cache.engine.load(Ordering::Relaxed);
        s
    }

    /// Wait until every accepted write has reached the device.
    pub async fn flush(&self) {
        for (_, store) in &self.shared.partitions {
            store.drain().await;
        }
    }
}

impl DiskCache {
    /// Stop taking writes, finish the ones accepted and stop background work. Reads still work.
    /// Not needed for safety (a crash loses only writes in flight), but it lets the next start
    /// read a summary instead of scanning, and lets a test reopen the device in-process.
    pub async fn close(&self) {
        for (_, store) in &self.shared.partitions {
            store.closed.store(true, Ordering::Relaxed);
            store.wake();
        }
        let reclaimers = std::mem::take(&mut *self.shared.reclaimers.lock());
        for r in reclaimers {
            let _ = r.await;
        }
        self.flush().await;
        for (_, store) in &self.shared.partitions {
            store.seal_active().await;
        }
    }
}

fn stats_into(store: &Store, region_size: u64, s: &mut DiskStats) {
    store.counters.add_to(s);
    let regions = store.cfg.regions as u64;
    s.capacity_bytes += regions * region_size;
    s.regions += regions;
    s.free_regions += store.alloc.lock().free.len() as u64;
    s.entries += store.index.len() as u64;
    s.inflight_entries += store.inflight_len() as u64;
    s.index_bytes += store.index.heap_bytes() as u64;
    s.live_bytes += store
        .regions
        .iter()
        .map(|r| r.live.load(Ordering::Relaxed))
        .sum::<u64>();
}

impl Partition {
    /// Offer `value` for a disk write; returns at once. `Err` says why it was dropped (also
    /// counted). An accepted entry is readable immediately, from memory until its write lands.
    pub fn insert(&self, key: &[u8], value: Bytes) -> Result<(), DropReason> {
        self.store.insert(key, value, Offer::New)
    }

    /// Like [`insert`](Self::insert), for a value known to be worth a write: read again since
    /// it was fetched (the memory tier letting go of a block it served), or asked for (a cache
    /// warm-up). [`Admission::SecondHit`] takes that as the second hit; the rate limit and the
    /// write buffer still apply.
    pub fn insert_proven(&self, key: &[u8], value: Bytes) -> Result<(), DropReason> {
        self.store.insert(key, value, Offer::Proven)
    }

    /// Write `value`, waiting for room in the write buffer rather than dropping it, past the
    /// admission filter and the rate limit: for values that must not be lost (the memory tier
    /// spilled at shutdown). `Err` only if it cannot be written at all (counted).
    pub async fn insert_waiting(&self, key: &[u8], value: Bytes) -> Result<(), DropReason> {
        self.store.insert_waiting(key, value).await
    }

    /// The value of `key`, verified against its checksums; `None` on a miss or on any fault.
    pub async fn get(&self, key: &[u8]) -> Option<Bytes> {
        self.store.get(key).await
    }

    /// Bytes `range` of the value of `key`, clamped to its length; only the 64 KiB chunks the
    /// range touches are read and verified.
    pub async fn get_range(&self, key: &[u8], range: Range<u64>) -> Option<Bytes> {
        self.store.get_range(key, range).await
    }

    /// The value of `key` as a stream of verified pieces, read a few at a time, so its first
    /// byte arrives after one small read instead of the whole value's; `None` on a miss or on a
    /// fault before the first byte. A fault later ends the stream with [`ReadFailed`].
    pub async fn stream(&self, key: &[u8]) -> Option<ValueStream> {
        store::stream(self.store.clone(), key).await
    }

    /// Whether `key` is (probably: by hash) held.
    pub fn contains(&self, key: &[u8]) -> bool {
        self.store.contains(key)
    }

    /// Whether `key` is (probably) held, counting a read of it served from a copy elsewhere
    /// (the memory tier), so that reclaim keeps what is hot, not only what the disk served.
    pub fn touch(&self, key: &[u8]) -> bool {
        self.store.touch(key)
    }

    /// The reads counted for `key` towards reclaim (saturating at three), if on disk.
    #[cfg(test)]
    pub(crate) fn reads_counted(&self, key: &[u8]) -> Option<u64> {
        self.store.reads_counted(key)
    }

    /// Forget `key`.
    pub fn remove(&self, key: &[u8]) {
        self.store.remove(key)
    }

    /// This partition's counters.
    pub fn stats(&self) -> DiskStats {
        let mut s = DiskStats::default();
        stats_into(&self.store, self.store.cfg.region_size, &mut s);
        s
    }

    /// The partition's name.
    pub fn name(&self) -> &str {
        &self.store.cfg.name
    }

    /// Wait until every accepted write has reached the device.
    pub async fn flush(&self) {
        self.store.drain().await
    }

    /// Reclaim the oldest region now, as if space were needed. For tests.
    #[doc(hidden)]
    pub async fn reclaim_one(&self) -> bool {
        self.store.reclaim_now().await
    }
}

#[cfg(test)]
mod tests;
