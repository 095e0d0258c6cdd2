//! Object metadata, cached for `metadata_ttl`, with concurrent misses coalesced into one HEAD.

use std::sync::Arc;
use std::time::Duration;

use moka::future::Cache;

use crate::metrics::Metrics;
use crate::origin::{ObjectId, ObjectMeta, Origin, OriginError};

/// Cached HeadObject answers.
pub struct MetadataCache {
    cache: Option<Cache<ObjectId, Arc<ObjectMeta>>>,
    origin: Arc<dyn Origin>,
    metrics: Arc<Metrics>,
}

impl MetadataCache {
    /// A cache trusting metadata for `ttl` (zero: never cached), holding at most `capacity`
    /// entries.
    pub fn new(
        origin: Arc<dyn Origin>,
        ttl: Duration,
        capacity: u64,
        metrics: Arc<Metrics>,
    ) -> Self {
        let cache = (!ttl.is_zero()).then(|| {
            Cache::builder()
                .max_capacity(capacity)
                .time_to_live(ttl)
                .support_invalidation_closures()
                .build()
        });
        Self {
            cache,
            origin,
            metrics,
        }
    }

    /// The object's metadata, and whether it came from the cache.
    pub async fn get(&self, id: &ObjectId) -> Result<(Arc<ObjectMeta>, bool), OriginError> {
        let Some(cache) = &self.cache else {
            return self.head(id).await.map(|m| (m, false));
        };
        if let Some(meta) = cache.get(id).await {
            return Ok((meta, true));
        }
        cache
            .try_get_with(id.clone(), self.head(id))
            .await
            .map(|m| (m, false))
            .map_err(|e| (*e).clone())
    }

    /// Forget what is known of `id` (it changed upstream).
    pub async fn invalidate(&self, id: &ObjectId) {
        if let Some(cache) = &self.cache {
            cache.invalidate(id).await;
        }
    }

    /// Forget every object of `bucket` (a write that names its keys only in its body).
    pub fn invalidate_bucket(&self, bucket: &str) {
        if let Some(cache) = &self.cache {
            let bucket: Arc<str> = bucket.into();
            // Fails only if closures were not enabled at build time, which they are.
            let _ = cache.invalidate_entries_if(move |id, _| id.bucket == bucket);
        }
    }

    async fn head(&self, id: &ObjectId) -> Result<Arc<ObjectMeta>, OriginError> {
        let result = self.origin.head(id).await;
        let outcome = if result.is_ok() { "ok" } else { "error" };
        self.metrics
            .upstream_requests
            .get_or_create(&vec![("operation", "HeadObject"), ("outcome", outcome)])
            .inc();
        result.map(Arc::new)
    }
}
