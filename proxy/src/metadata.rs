//! Object metadata, cached for `metadata_ttl`, with concurrent misses coalesced into one HEAD.

use std::sync::Arc;
use std::time::Duration;

use moka::future::Cache;

use crate::metrics::{Metrics, UpstreamStatus};
use crate::origin::{ObjectId, ObjectMeta, Origin, OriginError};
use tracing::Instrument;

/// Metadata of a named version never changes (S3 versions are immutable), so it stays until
/// evicted for space or the version is deleted through Larder; everything else expires after the
/// TTL.
struct VersionsKeep {
    ttl: Duration,
}

impl moka::Expiry<ObjectId, Arc<ObjectMeta>> for VersionsKeep {
    fn expire_after_create(
        &self,
        id: &ObjectId,
        _meta: &Arc<ObjectMeta>,
        _created_at: std::time::Instant,
    ) -> Option<Duration> {
        match id.version_id {
            Some(_) => None,
            None => Some(self.ttl),
        }
    }
}

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
                .expire_after(VersionsKeep { ttl })
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
        let started = std::time::Instant::now();
        let result = self
            .origin
            .head(id)
            .instrument(tracing::info_span!(
                "upstream",
                otel.name = "HeadObject",
                otel.kind = "client"
            ))
            .await;
        let status = match &result {
            Ok(_) => UpstreamStatus::Http(200),
            Err(e) => {
                if !e.is_not_found() {
                    self.metrics.upstream_failed(e);
                }
                e.into()
            }
        };
        self.metrics
            .upstream("HeadObject", status, started.elapsed());
        result.map(Arc::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::origin::fake::FakeOrigin;
    use std::sync::atomic::Ordering;

    #[tokio::test]
    async fn a_named_version_outlives_the_ttl_and_the_latest_does_not() {
        let origin = Arc::new(FakeOrigin::default());
        origin.put("k", bytes::Bytes::from_static(b"data"), "\"e\"");
        let cache = MetadataCache::new(
            origin.clone(),
            Duration::from_millis(50),
            100,
            Arc::new(Metrics::default()),
        );
        let id = |version: Option<&str>| ObjectId {
            bucket: "b".into(),
            key: "k".into(),
            version_id: version.map(Arc::from),
        };
        for v in [None, Some("v1")] {
            assert!(!cache.get(&id(v)).await.unwrap().1);
            assert!(cache.get(&id(v)).await.unwrap().1);
        }
        assert_eq!(origin.heads.load(Ordering::SeqCst), 2);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            cache.get(&id(Some("v1"))).await.unwrap().1,
            "a version is immutable"
        );
        assert!(!cache.get(&id(None)).await.unwrap().1, "the latest expires");
        assert_eq!(origin.heads.load(Ordering::SeqCst), 3);
        cache.invalidate(&id(Some("v1"))).await;
        assert!(!cache.get(&id(Some("v1"))).await.unwrap().1);
        cache.invalidate_bucket("b");
        assert!(!cache.get(&id(None)).await.unwrap().1);
    }
}
