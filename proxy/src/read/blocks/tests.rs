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
            && store.classify(&id, &etag, range.clone(), size).result != CacheResult::HitMemory
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        if store.classify(&id, &etag, range.clone(), size).result == CacheResult::HitMemory {
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
        store
            .classify(&id, &etag, BLOCK..2 * BLOCK, 2 * BLOCK)
            .result,
        CacheResult::HitMemory,
        "the block was cached before its reader was given its last bytes"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while store
        .classify(&id, &etag, BLOCK..2 * BLOCK, 2 * BLOCK)
        .result
        != CacheResult::HitMemory
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(
        store
            .classify(&id, &etag, BLOCK..2 * BLOCK, 2 * BLOCK)
            .result,
        CacheResult::HitMemory
    );
}

/// A store of 4 KiB blocks over `origin` holding `data` as `k`, with a window of 8 blocks.
fn cold_store(origin: &Arc<MemoryUpstream>, data: &Bytes) -> Arc<BlockStore> {
    origin.put("k", data.clone(), "\"e1\"");
    let config = BlockStoreConfig {
        read_window: 8,
        upstream_concurrency: 8,
        ..BlockStoreConfig::for_tests()
    };
    Arc::new(BlockStore::new(config, origin.clone(), Arc::default()))
}

/// [`cold_store`] with range-first reads (`cold_ranges = "exact"`) of `origin`, whose `k` is
/// `data`.
fn exact_store(origin: &Arc<MemoryUpstream>, data: &Bytes) -> Arc<BlockStore> {
    origin.put("k", data.clone(), "\"e1\"");
    let config = BlockStoreConfig {
        read_window: 8,
        upstream_concurrency: 8,
        exact_ranges: true,
        ..BlockStoreConfig::for_tests()
    };
    Arc::new(BlockStore::new(config, origin.clone(), Arc::default()))
}

/// A cold read of bytes `asked` of `k`, as a client's ranged GET: opened, then read.
async fn read_cold_range(store: &Arc<BlockStore>, asked: Range<u64>) -> Vec<u8> {
    let id = crate::upstream::memory::fixtures::object();
    let range = crate::model::ByteRange::bytes(asked.clone());
    let (meta, _) = store
        .open_cold(id.clone(), range, None)
        .await
        .unwrap()
        .unwrap();
    store
        .read(id, meta.etag.clone(), asked, meta.size)
        .map_ok(|b| b.to_vec())
        .try_concat()
        .await
        .unwrap()
}

/// All `size` bytes of `key` at `etag`, read through `store` (no cold open first).
async fn read_whole(store: &Arc<BlockStore>, key: &str, etag: &str, size: u64) -> Vec<u8> {
    let id = ObjectId {
        key: key.into(),
        ..crate::upstream::memory::fixtures::object()
    };
    store
        .read(id, etag.into(), 0..size, size)
        .map_ok(|b| b.to_vec())
        .try_concat()
        .await
        .unwrap()
}

/// A cold read of `k` to its end, as a client's GET without a range: opened, then read.
async fn read_cold_to_end(store: &Arc<BlockStore>) -> Result<Vec<u8>, UpstreamError> {
    let id = crate::upstream::memory::fixtures::object();
    let asked = crate::model::ByteRange::FromTo {
        first: 0,
        last: None,
    };
    let (meta, _) = store
        .open_cold(id.clone(), asked, None)
        .await?
        .expect("found");
    let etag: Arc<str> = meta.etag.clone();
    store
        .read(id, etag, 0..meta.size, meta.size)
        .map_ok(|b| b.to_vec())
        .try_concat()
        .await
}

/// Where one connection brings several blocks per round trip, a cold read to the object's end
/// asks them of its first GET, whose body fills each in turn (chunks of 1,000 bytes straddle
/// the 4 KiB blocks), instead of one GET per block a round trip later.
#[tokio::test]
async fn a_cold_read_to_the_end_runs_its_first_get_on_as_far_as_a_round_trip_brings() {
    let data = crate::upstream::memory::fixtures::data(5 * 4096 + 100);
    let origin = Arc::new(MemoryUpstream::default());
    let store = cold_store(&origin, &data);
    // Nothing measured yet: one GET per block, as on S3.
    assert_eq!(read_cold_to_end(&store).await.unwrap(), data);
    assert!(store.settled(Duration::from_secs(5)).await);
    assert_eq!(origin.gets.load(Ordering::SeqCst), 6);

    let origin = Arc::new(MemoryUpstream::default());
    let store = cold_store(&origin, &data);
    // 30 ms and 1 MB/s: 30 KB per round trip, the whole window of 4 KiB blocks.
    store.pace.set(Duration::from_millis(30), 1_000_000);
    assert_eq!(read_cold_to_end(&store).await.unwrap(), data);
    assert!(store.settled(Duration::from_secs(5)).await);
    assert_eq!(
        origin.gets.load(Ordering::SeqCst),
        1,
        "one GET for all six blocks"
    );
    let s = store.metrics.snapshot();
    assert_eq!(s.sum("larder_upstream_run_blocks_total", &[]), 5.0);
    // And each block was cached as its own.
    let (id, etag) = (crate::upstream::memory::fixtures::object(), "\"e1\"".into());
    for i in 0..6 {
        let block = i * 4096..((i + 1) * 4096).min(data.len() as u64);
        let found = store.classify(&id, &etag, block, data.len() as u64).result;
        assert_eq!(found, CacheResult::HitMemory, "block {i}");
    }
}

/// Where parallel GETs were seen to bring no more than one, a cold read to the object's end
/// asks its first GET for every block of the window, though a round trip brings only the next.
#[tokio::test]
async fn a_cold_read_to_the_end_is_one_get_where_parallel_gets_gained_nothing() {
    let data = crate::upstream::memory::fixtures::data(5 * 4096 + 100);
    for (gain, gets) in [(None, 5), (Some((150e3, 146e3)), 1)] {
        let origin = Arc::new(MemoryUpstream::default());
        let store = cold_store(&origin, &data);
        // 30 ms and 150 kB/s: 4.5 kB per round trip, one 4 KiB block past the first.
        store.pace.set(Duration::from_millis(30), 150_000);
        if let Some((one, several)) = gain {
            store.pace.gain.set(one, several);
        }
        assert_eq!(read_cold_to_end(&store).await.unwrap(), data);
        assert!(store.settled(Duration::from_secs(5)).await);
        // Gain unknown: blocks 0 and 1 in one GET, the other four each in its own. None
        // gained: one GET for all six.
        assert_eq!(origin.gets.load(Ordering::SeqCst), gets, "gain {gain:?}");
    }
}

/// A cold range spanning blocks, where one connection brings several blocks per round trip:
/// one GET from its first byte to its end, whose body fills its first block's tail (fetched
/// tail first, the head asked behind it) and each block after, instead of one GET per block.
#[tokio::test]
async fn a_cold_range_spanning_blocks_is_one_get_where_a_round_trip_brings_them() {
    let data = crate::upstream::memory::fixtures::data(6 * 4096);
    let (id, size) = (
        crate::upstream::memory::fixtures::object(),
        data.len() as u64,
    );
    // From inside block 0 to inside block 3.
    let asked = 1000..3 * 4096 + 2000;
    for (paced, gets) in [(false, 5), (true, 2)] {
        let origin = Arc::new(MemoryUpstream::default());
        let store = exact_store(&origin, &data);
        if paced {
            // 30 ms and 1 MB/s: 30 KB per round trip, more than the range's four blocks.
            store.pace.set(Duration::from_millis(30), 1_000_000);
        }
        let got = read_cold_range(&store, asked.clone()).await;
        assert_eq!(got, &data[asked.start as usize..asked.end as usize]);
        assert!(store.settled(Duration::from_secs(5)).await);
        // Unpaced: the tail of block 0, its head, blocks 1 and 2, the part of block 3 asked.
        // Paced: the range, and the head of block 0.
        assert_eq!(origin.gets.load(Ordering::SeqCst), gets, "paced: {paced}");
        for i in 0..3 {
            let block = i * 4096..(i + 1) * 4096;
            let found = store.classify(&id, &"\"e1\"".into(), block, size).result;
            assert_eq!(found, CacheResult::HitMemory, "block {i}, paced: {paced}");
        }
    }
}

/// A range's GET run on over several blocks, whose first block is fetched tail first: the
/// blocks after it take the body's bytes as soon as the tail has read its own, without
/// waiting the round trip of the head's GET.
#[tokio::test(start_paused = true)]
async fn a_run_does_not_wait_for_the_head_of_its_first_block() {
    let data = crate::upstream::memory::fixtures::data(4 * 4096);
    let round_trip = Duration::from_millis(30);
    // A millisecond per 1,000 bytes: the reader finds the tail still coming.
    let origin =
        Arc::new(MemoryUpstream::with_delay(Duration::from_millis(1)).with_round_trip(round_trip));
    let store = exact_store(&origin, &data);
    store.pace.set(round_trip, 1_000_000);
    let asked = 1000..4 * 4096;
    let start = tokio::time::Instant::now();
    let got = read_cold_range(&store, asked.clone()).await;
    assert_eq!(got, &data[asked.start as usize..]);
    // One round trip for the range's GET; waiting for the head's would make it two.
    assert!(start.elapsed() < 2 * round_trip, "{:?}", start.elapsed());
    assert_eq!(
        origin.gets.load(Ordering::SeqCst),
        2,
        "the range and the head"
    );
}

/// A run's body that breaks part-way fails the block it broke in (no resume layer here), and
/// the blocks it had not reached are fetched on their own: no block holds a wrong byte.
#[tokio::test]
async fn a_run_broken_part_way_leaves_its_later_blocks_to_gets_of_their_own() {
    let data = crate::upstream::memory::fixtures::data(6 * 4096);
    let origin = Arc::new(MemoryUpstream::default());
    let store = cold_store(&origin, &data);
    store.pace.set(Duration::from_millis(30), 1_000_000);
    origin.break_at.store(2 * 4096 + 500, Ordering::SeqCst);
    origin.breaks_left.store(1, Ordering::SeqCst);
    assert!(read_cold_to_end(&store).await.is_err());
    assert!(store.settled(Duration::from_secs(5)).await);
    // The run, then blocks 3 to 5 alone.
    assert_eq!(origin.gets.load(Ordering::SeqCst), 4);
    let s = store.metrics.snapshot();
    assert_eq!(
        s.sum("larder_upstream_run_blocks_total", &[]),
        1.0,
        "block 1"
    );
    // Block 2 again, and every byte right.
    let (id, size) = (
        crate::upstream::memory::fixtures::object(),
        data.len() as u64,
    );
    let got: Vec<u8> = store
        .read(id, "\"e1\"".into(), 0..size, size)
        .map_ok(|b| b.to_vec())
        .try_concat()
        .await
        .unwrap();
    assert_eq!(got, data);
    assert_eq!(origin.gets.load(Ordering::SeqCst), 5);
}

/// A cold GET of a block of 1 MiB or more teaches the store the upstream's round trip and
/// per-connection rate.
#[tokio::test]
async fn cold_gets_measure_the_round_trip_and_rate() {
    let data = crate::upstream::memory::fixtures::data(2 << 20);
    let origin = Arc::new(MemoryUpstream::default());
    origin.put("k", data.clone(), "\"e1\"");
    let config = BlockStoreConfig {
        layout: BlockLayout::new(1 << 20),
        memory_capacity: 4 << 20,
        ..BlockStoreConfig::for_tests()
    };
    let store = Arc::new(BlockStore::new(config, origin, Arc::default()));
    assert_eq!(store.pace.measured(), (Duration::ZERO, 0));
    assert_eq!(read_cold_to_end(&store).await.unwrap(), data);
    assert!(store.settled(Duration::from_secs(5)).await);
    let (round_trip, rate) = store.pace.measured();
    assert!(
        round_trip > Duration::ZERO && rate > 0,
        "{round_trip:?} {rate}"
    );
}

#[tokio::test(start_paused = true)]
async fn slow_readers_hold_beyond_their_next_blocks_only_room_the_buffer_can_spare() {
    // A responses' buffer of sixteen 4 KiB blocks and a window of eight. Two slow clients of
    // large objects each hold the block they are sent and the next, and blocks further ahead
    // only as room to spare, at most half the buffer between them: the first takes its seven,
    // the second one. A third reader's one block then finds room at once. (Before, the two
    // held all sixteen, and it waited until the slow readers gave a block back.) Upstream
    // slots are plenty: only the buffer binds. Time is paused (each 1,000-byte chunk takes
    // 100 ms of it; the slow clients take a chunk every 40 ms), so the times below are exact.
    use crate::upstream::memory::fixtures;
    use futures::StreamExt;
    let origin = Arc::new(MemoryUpstream::with_delay(Duration::from_millis(100)));
    let (big, small) = (fixtures::data(16 * 4096), fixtures::data(1000));
    for (key, data, etag) in [
        ("k", &big, "\"e1\""),
        ("k2", &big, "\"e1\""),
        ("small", &small, "\"e2\""),
    ] {
        origin.put(key, data.clone(), etag);
    }
    let config = BlockStoreConfig {
        read_window: 8,
        upstream_concurrency: 64,
        response_buffer: 16 * 4096,
        ..BlockStoreConfig::for_tests()
    };
    let store = Arc::new(BlockStore::new(config, origin.clone(), Arc::default()));
    let size = big.len() as u64;
    let mut slow = Vec::new();
    for key in ["k", "k2"] {
        let id = ObjectId {
            key: key.into(),
            ..fixtures::object()
        };
        let mut body = store.read(id, "\"e1\"".into(), 0..size, size);
        slow.push(tokio::spawn(async move {
            let mut got = 0;
            while let Some(bytes) = body.next().await {
                got += bytes.unwrap().len();
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            got
        }));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        store.response_buffer(),
        (12 * 4096, 16 * 4096),
        "the slow readers' nine and three"
    );
    let start = tokio::time::Instant::now();
    assert_eq!(read_whole(&store, "small", "\"e2\"", 1000).await, small[..]);
    // Its one chunk's 100 ms, and no wait for room.
    let took = start.elapsed();
    assert!(took < Duration::from_millis(200), "{took:?}");
    for reader in slow {
        assert_eq!(reader.await.unwrap(), big.len());
    }
    assert_eq!(store.response_buffer().0, 0, "all given back");
}

#[tokio::test(start_paused = true)]
async fn a_responses_blocks_get_their_room_in_order_though_first_blocks_go_first() {
    // A responses' buffer of one block. Four one-block readers hold it in turn (each keeps
    // its block 100 ms), and a reader of two blocks queues behind them. Were its second block
    // (a block ahead) let to ask for room before its first had it, the fourth hand-out, which
    // goes to a block ahead while first blocks wait, would give the buffer to that second
    // block: it can only be sent after the first, which then never gets room, and the
    // response (and every one after it) would stall.
    use crate::upstream::memory::fixtures;
    use futures::StreamExt;
    let origin = Arc::new(MemoryUpstream::default());
    let config = BlockStoreConfig {
        response_buffer: 4096,
        ..BlockStoreConfig::for_tests()
    };
    let store = Arc::new(BlockStore::new(config, origin.clone(), Arc::default()));
    let id = |key: &str| ObjectId {
        key: key.into(),
        ..fixtures::object()
    };
    let mut holders = Vec::new();
    for key in ["a", "b", "c", "d"] {
        origin.put(key, fixtures::data(4096), "\"e\"");
        let mut body = store.read(id(key), "\"e\"".into(), 0..4096, 4096);
        holders.push(tokio::spawn(async move {
            let mut got = body.next().await.unwrap().unwrap().len();
            tokio::time::sleep(Duration::from_millis(100)).await;
            while let Some(bytes) = body.next().await {
                got += bytes.unwrap().len();
            }
            got
        }));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let two = fixtures::data(8192);
    origin.put("two", two.clone(), "\"e\"");
    let read = read_whole(&store, "two", "\"e\"", 8192);
    let got = tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("the two-block response stalled");
    assert_eq!(got, two[..]);
    for holder in holders {
        assert_eq!(holder.await.unwrap(), 4096);
    }
}

#[tokio::test(start_paused = true)]
async fn a_new_readers_first_block_does_not_wait_behind_blocks_others_opened_ahead() {
    // Eight upstream slots and a window of eight: a reader of a large cold object holds every
    // slot, and a second one queues eight more fetches (its first block and seven ahead). A
    // third reader's one block must take the next slot freed, not wait behind the second
    // reader's blocks ahead. Time is paused (each 1,000-byte chunk takes 100 ms of it, a 4 KiB
    // block 500 ms), so the times below are exact.
    use crate::upstream::memory::fixtures;
    let origin = Arc::new(MemoryUpstream::with_delay(Duration::from_millis(100)));
    let (big, small) = (fixtures::data(16 * 4096), fixtures::data(1000));
    let store = cold_store(&origin, &big);
    origin.put("k2", big.clone(), "\"e1\"");
    origin.put("small", small.clone(), "\"e2\"");
    let start = tokio::time::Instant::now();
    let readers: Vec<_> = ["k", "k2"]
        .into_iter()
        .map(|key| {
            let store = store.clone();
            let (id, size) = (
                ObjectId {
                    key: key.into(),
                    ..fixtures::object()
                },
                big.len() as u64,
            );
            let reader = tokio::spawn(async move {
                let body = store.read(id, "\"e1\"".into(), 0..size, size);
                body.map_ok(|b| b.len()).try_collect::<Vec<_>>().await
            });
            reader
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(origin.gets.load(Ordering::SeqCst), 8, "the first reader's");
    assert_eq!(store.upstream_slots.available(), 0);
    assert_eq!(read_whole(&store, "small", "\"e2\"", 1000).await, small[..]);
    // A slot came free at 500 ms and the chunk took 100: waiting behind the second reader's
    // blocks too, it would have been 1,100.
    let took = start.elapsed();
    assert!(took < Duration::from_millis(800), "{took:?}");
    for reader in readers {
        let sizes = reader.await.unwrap().unwrap();
        assert_eq!(sizes.iter().sum::<usize>(), big.len());
    }
}

#[tokio::test]
async fn a_read_within_one_block_in_memory_is_its_bytes_holding_their_room() {
    // The fast path of a small hit: the bytes asked, found in the one block under them, with
    // that block's room in the responses' buffer held until they are dropped, and counted as
    // served from memory. A read over two blocks, or of a block not in memory, is left to
    // `read` with nothing counted.
    let data = crate::upstream::memory::fixtures::data(3 * 4096);
    let origin = Arc::new(MemoryUpstream::default());
    let store = cold_store(&origin, &data);
    let (id, etag, size) = (
        crate::upstream::memory::fixtures::object(),
        Arc::<str>::from("\"e1\""),
        data.len() as u64,
    );
    let served = |store: &BlockStore| {
        let snapshot = store.metrics.snapshot();
        snapshot.sum("larder_served_bytes_total", &[("tier", "memory")])
    };
    // Told that block `index` is in memory, whether it is or not.
    let told = |index| Found {
        result: CacheResult::HitMemory,
        block: Some(store.id(&id, &etag, index)),
        fetched_here: false,
    };
    assert!(store
        .read_in_one(&id, 100..200, size, told(0))
        .await
        .is_none());
    assert_eq!(read_whole(&store, "k", "\"e1\"", 4096).await, data[..4096]);
    let before = served(&store);
    let held = store.read_in_one(&id, 100..4000, size, told(0)).await;
    let held = held.expect("in memory");
    assert_eq!(held.bytes, data[100..4000]);
    assert_eq!(store.response_buffer().0, 4096, "the block's room is held");
    assert_eq!(served(&store) - before, 3900.0);
    drop(held);
    assert_eq!(store.response_buffer().0, 0, "and given back");
    // The first block is in memory; the second is not, and the third not at all read.
    assert!(store
        .read_in_one(&id, 4000..4200, size, told(0))
        .await
        .is_none());
    assert!(store
        .read_in_one(&id, 8192..8300, size, told(2))
        .await
        .is_none());
    assert_eq!(served(&store) - before, 3900.0, "nothing counted for those");
    // What `classify` finds names the block only for a read inside one block that is here.
    let found = store.classify(&id, &etag, 100..4000, size);
    assert_eq!(found.block, Some(store.id(&id, &etag, 0)));
    let held = store.read_in_one(&id, 100..4000, size, found).await;
    assert_eq!(held.expect("in memory").bytes, data[100..4000]);
    assert_eq!(store.classify(&id, &etag, 4000..4200, size).block, None);
    assert_eq!(store.classify(&id, &etag, 8192..8300, size).block, None);
}
