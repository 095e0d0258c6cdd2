//! Using cache-core in-process: a memory tier over a disk tier, with single-flight fetches.
//!
//! `cargo run -p cache-core --example hybrid` — creates a 64 MiB cache file in a temporary
//! directory, fetches "pages" through the cache, restarts it and reads them back from disk.

use std::time::{Duration, Instant};

use bytes::Bytes;
use cache_core::{Abandoned, CacheKey, DiskCache, DiskConfig, HybridCache, WritePolicy};

#[derive(Clone, Hash, PartialEq, Eq)]
struct Page(u64);

impl CacheKey for Page {
    fn disk_key(&self) -> Vec<u8> {
        format!("page/{}", self.0).into_bytes()
    }
}

/// The application's own error: every caller waiting on a failed fetch gets a clone of it, so it
/// must be `Clone`, and `From<Abandoned>` for a fetch whose task died.
#[derive(Debug, Clone, thiserror::Error)]
enum StoreError {
    #[error("page {0} is not in the backing store")]
    NoSuchPage(u64),
    #[error(transparent)]
    Abandoned(#[from] Abandoned),
}

/// Stands in for a slow backing store.
async fn slow_fetch(page: u64) -> Result<Bytes, StoreError> {
    if page >= 1 << 20 {
        return Err(StoreError::NoSuchPage(page));
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    Ok(Bytes::from(vec![page as u8; 256 * 1024]))
}

fn config(path: &std::path::Path) -> DiskConfig {
    let mut cfg = DiskConfig::new(path, 64 << 20);
    cfg.region_size = 4 << 20;
    cfg
}

/// Read pages 0..32 through `cache`, checking each; prints where page 0 came from.
async fn read_pages(
    cache: &HybridCache<Page, StoreError>,
    label: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    for page in 0..32 {
        let (bytes, tier) = cache
            .get_or_fetch(Page(page), move || slow_fetch(page))
            .await?;
        assert_eq!(bytes[0], page as u8);
        if page == 0 {
            println!("{label}: page 0 from {tier:?}");
        }
    }
    println!("{label}: 32 pages in {:?}", started.elapsed());
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("pages.larder");

    let disk = DiskCache::open(config(&path)).await?;
    let cache = HybridCache::new(8 << 20, Some(disk.clone()), WritePolicy::OnInsert);
    read_pages(&cache, "cold").await?;
    disk.close().await;
    drop((cache, disk));

    // A new process would do the same: open the file again and find the pages on disk.
    let disk = DiskCache::open(config(&path)).await?;
    println!(
        "recovered {} entries in {:?}",
        disk.recovery().entries,
        disk.recovery().duration
    );
    let cache = HybridCache::new(8 << 20, Some(disk.clone()), WritePolicy::OnInsert);
    read_pages(&cache, "after restart").await?;
    let s = disk.stats();
    println!(
        "disk: {} hits, {} writes, {} corrupt",
        s.hits, s.writes, s.corrupt
    );
    Ok(())
}
