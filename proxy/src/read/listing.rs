//! Listings (ListObjectsV2 and ListObjects pages) kept for `list_ttl` (off by default), so a
//! dataset scan repeated through a warm Larder sends no LIST upstream, and dropped the moment a
//! write through any path could change them.
//!
//! A page is kept per bucket and canonical query (the parameters sorted, so two clients
//! ordering them differently share it), with S3's exact body. A change to a key must drop
//! every page that could show it: those whose `prefix` the key starts with. Rather than scan
//! the pages, each change bumps a counter for every `/`-ended ancestor of the key (`""`,
//! `a/`, `a/b/`), and a page remembers, when its fetch began, the counter of the longest
//! `/`-ended piece of its own prefix (which is an ancestor of every key the page can show):
//! a page is served only while that counter has not moved. Counters live in a fixed table
//! (bounded whatever the key count); keys sharing a slot only cost each other a refetch.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::policy::Policy;

/// The query parameters of a plain listing; a request with any other is not cached.
const PARAMS: &[&str] = &[
    "list-type",
    "prefix",
    "delimiter",
    "max-keys",
    "continuation-token",
    "start-after",
    "fetch-owner",
    "encoding-type",
    "marker",
];

/// Slots of the change table.
const SLOTS: usize = 4096;

/// The largest page kept: S3 pages hold at most 1,000 keys of at most 1 KiB, a few hundred
/// KiB of XML; anything bigger is not a plain page.
pub const MAX_PAGE: usize = 8 << 20;

/// One listing request, as the cache knows it.
#[derive(Debug, Clone)]
pub struct ListQuery {
    key: (Arc<str>, String),
    /// The longest `/`-ended piece of the page's prefix.
    dir: String,
    ttl: Duration,
}

/// A kept page: what S3 answered.
#[derive(Debug)]
pub struct Listing {
    /// `Content-Type`, and `x-amz-bucket-region` when S3 sent it.
    pub headers: http::HeaderMap,
    /// The XML, byte for byte.
    pub body: Bytes,
    fetched: Instant,
    ttl: Duration,
    seen: (u64, u64),
}

/// The counters a page's fetch saw before it began: it is kept only as valid from then.
#[derive(Debug)]
pub struct Ticket {
    query: ListQuery,
    seen: (u64, u64),
}

/// The listing cache.
pub struct ListingCache {
    pages: moka::sync::Cache<(Arc<str>, String), Arc<Listing>>,
    policy: Arc<Policy>,
    changes: Box<[AtomicU64]>,
    hasher: std::collections::hash_map::RandomState,
}

struct PageTtl;

impl moka::Expiry<(Arc<str>, String), Arc<Listing>> for PageTtl {
    fn expire_after_create(
        &self,
        _key: &(Arc<str>, String),
        page: &Arc<Listing>,
        _created_at: Instant,
    ) -> Option<Duration> {
        Some(page.ttl)
    }
}

impl ListingCache {
    /// A cache of at most `capacity` bytes of pages, kept as `policy` says.
    pub fn new(policy: Arc<Policy>, capacity: u64) -> Self {
        let pages = moka::sync::Cache::builder()
            .max_capacity(capacity)
            .weigher(|k: &(Arc<str>, String), v: &Arc<Listing>| {
                u32::try_from(v.body.len() + k.1.len() + 256).unwrap_or(u32::MAX)
            })
            .expire_after(PageTtl)
            .build();
        Self {
            pages,
            policy,
            changes: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            hasher: Default::default(),
        }
    }

    /// The request as a cacheable listing of `bucket`, or `None` if it is not one (another
    /// sub-resource, or listings of that prefix are not cached).
    pub fn query(&self, bucket: &str, query: Option<&str>) -> Option<ListQuery> {
        let mut pairs: Vec<(String, String)> =
            form_urlencoded::parse(query.unwrap_or("").as_bytes())
                .into_owned()
                .collect();
        if pairs.iter().any(|(k, _)| !PARAMS.contains(&k.as_str())) {
            return None;
        }
        pairs.sort();
        pairs.dedup_by(|a, b| a.0 == b.0);
        let prefix = pairs
            .iter()
            .find(|(k, _)| k == "prefix")
            .map_or("", |(_, v)| v.as_str());
        let ttl = self.policy.list_ttl(bucket, prefix);
        if ttl.is_zero() {
            return None;
        }
        let dir = prefix[..prefix.rfind('/').map_or(0, |i| i + 1)].to_owned();
        let canonical = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(&pairs)
            .finish();
        Some(ListQuery {
            key: (bucket.into(), canonical),
            dir,
            ttl,
        })
    }

    fn slot(&self, bucket: &str, dir: Option<&str>) -> &AtomicU64 {
        let hash = self.hasher.hash_one((bucket, dir));
        &self.changes[hash as usize % SLOTS]
    }

    fn counters(&self, query: &ListQuery) -> (u64, u64) {
        let bucket = &query.key.0;
        (
            self.slot(bucket, Some(&query.dir)).load(Ordering::Acquire),
            self.slot(bucket, None).load(Ordering::Acquire),
        )
    }

    /// The kept page for `query`, if nothing changed under its prefix since it was fetched.
    pub fn get(&self, query: &ListQuery) -> Option<Arc<Listing>> {
        let page = self.pages.get(&query.key)?;
        // The TTL as of now: shorter than when kept if the event stream has gone quiet since.
        (page.seen == self.counters(query) && page.fetched.elapsed() < query.ttl).then_some(page)
    }

    /// Taken before fetching `query` upstream: a change after this point is not missed.
    pub fn ticket(&self, query: ListQuery) -> Ticket {
        Ticket {
            seen: self.counters(&query),
            query,
        }
    }

    /// Keep the page fetched under `ticket` (a page bigger than [`MAX_PAGE`] is not kept).
    pub fn insert(&self, ticket: Ticket, headers: http::HeaderMap, body: Bytes) {
        if body.len() > MAX_PAGE {
            return;
        }
        let page = Arc::new(Listing {
            headers,
            body,
            fetched: Instant::now(),
            ttl: ticket.query.ttl,
            seen: ticket.seen,
        });
        self.pages.insert(ticket.query.key, page);
    }

    /// `key` in `bucket` was created, overwritten or deleted: every page that could show it
    /// is dropped.
    pub fn changed(&self, bucket: &str, key: &str) {
        self.slot(bucket, Some("")).fetch_add(1, Ordering::AcqRel);
        for (i, _) in key.match_indices('/') {
            self.slot(bucket, Some(&key[..=i]))
                .fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Anything in `bucket` may have changed (a multi-object delete): every page of it goes.
    pub fn bucket_changed(&self, bucket: &str) {
        self.slot(bucket, None).fetch_add(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read::policy::Defaults;

    fn cache(ttl: Duration) -> ListingCache {
        let policy = Policy::defaults(Defaults {
            list: ttl,
            ..Defaults::default()
        });
        ListingCache::new(Arc::new(policy), 1 << 20)
    }

    fn keep(cache: &ListingCache, query: &ListQuery, body: &'static str) {
        let ticket = cache.ticket(query.clone());
        cache.insert(
            ticket,
            http::HeaderMap::new(),
            Bytes::from_static(body.as_bytes()),
        );
    }

    #[test]
    fn only_plain_listings_are_cached_and_parameter_order_does_not_matter() {
        let c = cache(Duration::from_secs(60));
        assert!(c.query("b", Some("list-type=2&versions")).is_none());
        assert!(c.query("b", Some("uploads")).is_none());
        let a = c
            .query("b", Some("list-type=2&prefix=x%2F&delimiter=%2F"))
            .unwrap();
        let b = c
            .query("b", Some("delimiter=%2F&prefix=x%2F&list-type=2"))
            .unwrap();
        assert_eq!(a.key, b.key);
        assert_eq!(a.dir, "x/");
        keep(&c, &a, "<ListBucketResult/>");
        assert_eq!(&c.get(&b).unwrap().body[..], b"<ListBucketResult/>");
        assert!(cache(Duration::ZERO).query("b", None).is_none(), "off");
    }

    #[test]
    fn a_change_drops_exactly_the_pages_that_could_show_it() {
        let c = cache(Duration::from_secs(60));
        let q = |prefix: &str| {
            c.query("b", Some(&format!("list-type=2&prefix={prefix}")))
                .unwrap()
        };
        let pages = [q(""), q("a/"), q("a/b/part-"), q("c/"), q("a/bz")];
        for p in &pages {
            keep(&c, p, "page");
        }
        c.changed("b", "a/b/part-7");
        let kept: Vec<bool> = pages.iter().map(|p| c.get(p).is_some()).collect();
        // "" / "a/" / "a/b/part-" could show the key; "c/" could not; "a/bz" shares the
        // ancestor "a/" with the key, so it is dropped too (conservative, never stale).
        assert_eq!(kept, [false, false, false, true, false]);
        c.changed("other", "c/x");
        assert!(c.get(&pages[3]).is_some(), "another bucket");
        c.bucket_changed("b");
        assert!(c.get(&pages[3]).is_none());
    }

    #[test]
    fn a_page_fetched_across_a_change_is_not_served() {
        let c = cache(Duration::from_secs(60));
        let q = c.query("b", Some("prefix=d%2F")).unwrap();
        let ticket = c.ticket(q.clone());
        c.changed("b", "d/new");
        c.insert(ticket, http::HeaderMap::new(), Bytes::from_static(b"old"));
        assert!(c.get(&q).is_none());
    }

    #[test]
    fn a_page_expires_with_its_ttl() {
        let c = cache(Duration::from_millis(50));
        let q = c.query("b", None).unwrap();
        keep(&c, &q, "page");
        assert!(c.get(&q).is_some());
        std::thread::sleep(Duration::from_millis(80));
        assert!(c.get(&q).is_none());
    }
}
