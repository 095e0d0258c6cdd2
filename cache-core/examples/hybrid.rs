//! Using cache-core in-process: a memory tier over a disk tier, with single-flight fetches.
//!
//! `cargo run -p cache-core --example hybrid` — creates a 64 MiB cache file in a temporary
//! directory, fetches "pages" through the cache, restarts it and reads them back from disk.

use std::time::{Duration, Instant};

use bytes::Bytes;
use cache_core::{CacheKey, DiskCache, DiskConfig, HybridCache, WritePolicy};

#[derive(Clone, Hash, PartialEq, Eq)]
struct Page(u64);

impl CacheKey for Page {
    fn disk_key(&self) -> Vec<u8> {
        format!("page/{}", self.0).into_bytes()
    }
}

/// Stands in for a slow backing store.
async fn slow_fetch(page: u64) -> Result<Bytes, std::io::Error> {
    tokio::time::sleep(Duration::from_millis(20)).await;
    Ok(Bytes::from(vec![page as u8; 256 * 1024]))
}

fn config(path: &std::path::Path) -> DiskConfig {
    let mut cfg = DiskConfig::new(path, 64 << 20);
    cfg.region_size = 4 << 20;
    cfg
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("pages.larder");

    let disk = DiskCache::open(config(&path)).await?;
    let cache = HybridCache::new(8 << 20, Some(disk.clone()), WritePolicy::OnInsert);
    let started = Instant::now();
    for page in 0..32 {
        let (bytes, tier) = cache
            .get_or_fetch(Page(page), move || slow_fetch(page))
            .await?;
        assert_eq!(bytes[0], page as u8);
        if page == 0 {
            println!("page 0: {tier:?}");
        }
    }
    println!("32 cold pages in {:?}", started.elapsed());
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
    let started = Instant::now();
    for page in 0..32 {
        let (bytes, tier) = cache
            .get_or_fetch(Page(page), move || slow_fetch(page))
            .await?;
        assert_eq!(bytes[0], page as u8);
        if page == 0 {
            println!("page 0 after restart: {tier:?}");
        }
    }
    println!("32 pages after restart in {:?}", started.elapsed());
    let s = disk.stats();
    println!(
        "disk: {} hits, {} writes, {} corrupt",
        s.hits, s.writes, s.corrupt
    );
    Ok(())
}
