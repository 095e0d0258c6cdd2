//! What only the store's insides can show: read-ahead waste, counted as blocks expire unread,
//! and when a fetched block is cached against when its reader gets its last bytes.
//! The block store's behaviour over the in-memory upstream is tested in process in
//! `proxy/tests/read_path.rs`.

use super::*;
use crate::upstream::memory::MemoryUpstream;
use futures::TryStreamExt;
use std::sync::atomic::Ordering;

#[tokio::test]
async fn in_order_ranged_reads_are_read_ahead_and_waste_is_counted() {
    let unused_after = Duration::from_millis(300);
    let size = 64 * 4096;
    let data: Bytes = (0..size)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<_>>()
        .into();
    let origin = Arc::new(MemoryUpstream::default());
    origin.put("k", data.clone(), "\"e1\"");
    let config = BlockStoreConfig {
        upstream_concurrency: 8,
        prefetch: PrefetchConfig {
            enabled: true,
            min_window: 2,
            max_window: 4,
            max_inflight: 8,
            unused_after,
        },
        ..BlockStoreConfig::for_tests()
    };
    let store = Arc::new(BlockStore::new(config, origin.clone(), Arc::default()));
    let (id, etag): (ObjectId, Arc<str>) = (
        ObjectId {
            bucket: "b".into(),
            key: "k".into(),
            version_id: None,
        },
        "\"e1\"".into(),
    );
    let size = size as u64;
    let mut hits = 0;
    for i in 0..8u64 {
        let range = i * 4096..(i + 1) * 4096;
        // Give the read-ahead of the reads before a generous while to land: waited for, not
        // slept on, so a loaded machine neither fails this nor lets a broken read-ahead pass
        // (it would never land, and the block below would be a miss).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while i >= 2
            && store.classify(&id, &etag, range.clone(), size) != CacheResult::HitMemory
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        if store.classify(&id, &etag, range.clone(), size) == CacheResult::HitMemory {
            hits += 1;
        }
        store.read_ahead(&id, &etag, range.clone(), size);
        let got: Vec<u8> = store
            .read(id.clone(), etag.clone(), range.clone(), size)
            .map_ok(|b| b.to_vec())
            .try_concat()
            .await
            .unwrap();
        assert_eq!(got, data[range.start as usize..range.end as usize]);
    }
    // Reads 0 and 1 establish the sequence; from read 2 on, each block was already there.
    assert_eq!(hits, 6);
    // Let the last read-ahead land (every fetch it issued finished), then count.
    let issued = || {
        store
            .metrics
            .snapshot()
            .sum("larder_prefetch_blocks_total", &[("outcome", "issued")])
    };
    // Yield first (a sleep runs every task already spawned, on this single-threaded
    // runtime), then check: the last read's read-ahead tasks may not have started yet.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let settled = store.cache.fetches() == 0
            && store.prefetch_slots.available_permits() == 8
            && origin.gets.load(Ordering::SeqCst) as f64 == 2.0 + issued();
        if settled || tokio::time::Instant::now() >= deadline {
            break;
        }
    }
    let s = store.metrics.snapshot();
    let issued = issued();
    assert!(issued >= 7.0, "{issued}");
    // Every block was fetched once: read-ahead replaced demand fetches, it did not add any
    // but the ones ahead of the last read.
    assert_eq!(origin.gets.load(Ordering::SeqCst) as f64, 2.0 + issued);
    assert_eq!(
        s.sum("larder_prefetch_bytes_total", &[("outcome", "used")]),
        6.0 * 4096.0
    );
    // The blocks read ahead of the last read were never read: once unread for
    // `unused_after`, exactly they are counted as wasted.
    assert_eq!(
        s.sum("larder_prefetch_bytes_total", &[("outcome", "wasted")]),
        0.0
    );
    let unread = (issued - 6.0) * 4096.0;
    assert!(unread > 0.0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let wasted = loop {
        store.prefetched.run_pending_tasks();
        let wasted = store
            .metrics
            .snapshot()
            .sum("larder_prefetch_bytes_total", &[("outcome", "wasted")]);
        if wasted >= unread || tokio::time::Instant::now() >= deadline {
            break wasted;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(wasted, unread);
}

/// A fetched block of 1 MiB or more is joined into one buffer (a copy of all of it) and cached
/// after the readers the last chunk woke have taken that chunk, not before: with 8 MiB blocks
/// the copy held the last bytes of every cold read back by milliseconds.
#[tokio::test]
async fn a_readers_last_bytes_go_out_before_its_block_is_joined_and_cached() {
    const BLOCK: u64 = 1 << 20;
    let data: Bytes = (0..2 * BLOCK)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<_>>()
        .into();
    let origin = Arc::new(MemoryUpstream::default());
    origin.put("k", data.clone(), "\"e1\"");
    let store = Arc::new(BlockStore::new(
        BlockStoreConfig {
            layout: BlockLayout::new(BLOCK),
            memory_capacity: 4 * BLOCK,
            ..BlockStoreConfig::for_tests()
        },
        origin,
        Arc::default(),
    ));
    let id = ObjectId {
        bucket: "b".into(),
        key: "k".into(),
        version_id: None,
    };
    let etag: Arc<str> = "\"e1\"".into();
    let got: Vec<u8> = store
        .read(id.clone(), etag.clone(), BLOCK..2 * BLOCK, 2 * BLOCK)
        .map_ok(|b| b.to_vec())
        .try_concat()
        .await
        .unwrap();
    assert_eq!(got, data[BLOCK as usize..]);
    // This runtime has one thread: the fetch's task has not run since it woke this reader.
    assert_ne!(
        store.classify(&id, &etag, BLOCK..2 * BLOCK, 2 * BLOCK),
        CacheResult::HitMemory,
        "the block was cached before its reader was given its last bytes"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while store.classify(&id, &etag, BLOCK..2 * BLOCK, 2 * BLOCK) != CacheResult::HitMemory
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(
        store.classify(&id, &etag, BLOCK..2 * BLOCK, 2 * BLOCK),
        CacheResult::HitMemory
    );
}
