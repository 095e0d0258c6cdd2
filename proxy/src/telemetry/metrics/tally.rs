//! What each client key asked of Larder, and how much of it Larder answered without asking S3:
//! the savings split by key (`larder_key_*`), for teams sharing one Larder that want to know
//! what the cache saved each of them.
//!
//! A key's request is *answered from the cache* when Larder sent no upstream request of its own
//! for it: every block it read was in memory or on disk, it joined a fetch another request had
//! started (`coalesced`), or its listing page was cached. Its object bytes are from the cache on
//! the same terms. What the rest cost upstream is not split by key: one fetch serves every key
//! that reads the block after it, and Larder's own traffic (read-ahead, revalidation, the rest
//! of a block a range fell in) serves no key in particular. It is counted by bucket
//! (`larder_cost_upstream_dollars_total`), where every upstream request belongs.
//!
//! Counted on atomics the key holds (a request adds to at most four), and priced at collection:
//! a request's cost is its class's price, so counts times prices are the dollars.

use std::sync::atomic::{AtomicU64, Ordering};

use super::cost::{Prices, RequestClass};
use crate::s3::operation::Operation;
use crate::telemetry::labels::XCache;

/// One key's requests and object bytes, and how many were answered from the cache.
#[derive(Debug, Default)]
pub struct KeyTally {
    /// GET-class and PUT-class requests (free ones are not counted), each: all of them, and
    /// those answered from the cache.
    requests: [Split; 2],
    /// Object bytes sent in answer to GETs: all of them, and those from the cache.
    bytes: Split,
}

/// A count, and the part of it answered from the cache.
#[derive(Debug, Default)]
struct Split {
    all: AtomicU64,
    cached: AtomicU64,
}

impl Split {
    fn add(&self, n: u64, cached: bool) {
        self.all.fetch_add(n, Ordering::Relaxed);
        if cached {
            self.cached.fetch_add(n, Ordering::Relaxed);
        }
    }

    fn read(&self) -> Counts {
        Counts {
            all: self.all.load(Ordering::Relaxed),
            cached: self.cached.load(Ordering::Relaxed),
        }
    }
}

/// What a [`Split`] held when read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Counts {
    pub(super) all: u64,
    pub(super) cached: u64,
}

/// What a key's tally held when read, and its dollars at some prices.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct Read {
    pub(super) requests: Counts,
    pub(super) bytes: Counts,
    /// What the requests would have cost sent straight to S3: `[requests, transfer]`.
    pub(super) direct: [f64; 2],
    /// Of that, what Larder answered from the cache.
    pub(super) saved: [f64; 2],
}

/// Whether a response with this `X-Cache` was answered without an upstream request of its own.
fn from_cache(cache: XCache) -> bool {
    use XCache as X;
    match cache {
        X::HitMemory
        | X::HitDisk
        | X::Coalesced
        | X::StaleHitMemory
        | X::StaleHitDisk
        | X::StaleCoalesced
        | X::Stale => true,
        // A partial read fetched some of its blocks; a peer may have fetched for it; a pass
        // and an error are counted as S3 would have billed them, and saved nothing.
        X::Partial | X::Miss | X::Peer | X::StalePartial | X::StaleMiss | X::StalePeer => false,
        X::Pass | X::Error => false,
    }
}

impl KeyTally {
    /// A request of the key answered as `cache` says (its operation's billing class is what it
    /// would have cost).
    pub fn request(&self, operation: Operation, cache: XCache) {
        let class = match RequestClass::of(operation) {
            RequestClass::Get => 0,
            RequestClass::Put => 1,
            RequestClass::Free => return,
        };
        self.requests[class].add(1, from_cache(cache));
    }

    /// `n` object bytes sent to the key in a response answered as `cache` says. Only a cached
    /// read's bytes are counted (not a pass-through's, not an error's), as
    /// `larder_cost_direct_dollars_total` counts them.
    pub fn object_bytes(&self, cache: XCache, n: u64) {
        if !matches!(cache, XCache::Pass | XCache::Error) {
            self.bytes.add(n, from_cache(cache));
        }
    }

    /// The counts, and what they come to at `prices`.
    pub(super) fn read(&self, prices: &Prices) -> Read {
        let [get, put] = [self.requests[0].read(), self.requests[1].read()];
        let (get_price, put_price) = (
            prices.request(RequestClass::Get),
            prices.request(RequestClass::Put),
        );
        let requests = |n: fn(Counts) -> u64| n(get) as f64 * get_price + n(put) as f64 * put_price;
        let bytes = self.bytes.read();
        Read {
            requests: Counts {
                all: get.all + put.all,
                cached: get.cached + put.cached,
            },
            bytes,
            direct: [requests(|c| c.all), bytes.all as f64 * prices.transfer_byte],
            saved: [
                requests(|c| c.cached),
                bytes.cached as f64 * prices.transfer_byte,
            ],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prices() -> Prices {
        Prices {
            get_request: 1.0,
            put_request: 10.0,
            transfer_byte: 0.5,
        }
    }

    #[test]
    fn hits_and_joins_are_saved_and_the_rest_is_not() {
        let t = KeyTally::default();
        for cache in [
            XCache::HitMemory,
            XCache::HitDisk,
            XCache::Coalesced,
            XCache::Stale,
        ] {
            t.request(Operation::GetObject, cache);
        }
        for cache in [XCache::Miss, XCache::Partial, XCache::Peer, XCache::Error] {
            t.request(Operation::GetObject, cache);
        }
        // A cached listing page saves a PUT-class request; a pass-through write saves nothing.
        t.request(Operation::ListObjectsV2, XCache::HitMemory);
        t.request(Operation::PutObject, XCache::Pass);
        // Free requests are not counted at all.
        t.request(Operation::DeleteObject, XCache::Pass);
        t.object_bytes(XCache::HitMemory, 100);
        t.object_bytes(XCache::Partial, 30);
        t.object_bytes(XCache::Pass, 1_000);
        t.object_bytes(XCache::Error, 1_000);
        let r = t.read(&prices());
        assert_eq!(r.requests, Counts { all: 10, cached: 5 });
        assert_eq!(
            r.bytes,
            Counts {
                all: 130,
                cached: 100
            }
        );
        assert_eq!(r.direct, [8.0 + 20.0, 65.0]);
        assert_eq!(r.saved, [4.0 + 10.0, 50.0]);
    }
}
