//! The upstream, traced and counted: every request the read path sends gets a client span and
//! one `larder_upstream_requests_total` sample (operation, status or failure, duration, price),
//! and a failure other than "not found" becomes the status page's last upstream error. One layer,
//! so no caller repeats the span, the timer and the counter.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use tracing::Instrument;

use super::Upstream;
use crate::model::{BodyStream, ByteRange, ObjectId, ObjectMeta, UpstreamError, UpstreamOutcome};
use crate::telemetry::metrics::Metrics;

/// An upstream whose requests are traced and counted.
pub struct Instrumented {
    inner: Arc<dyn Upstream>,
    metrics: Arc<Metrics>,
}

impl Instrumented {
    /// `inner`, with its requests recorded in `metrics`.
    pub fn new(inner: Arc<dyn Upstream>, metrics: Arc<Metrics>) -> Self {
        Self { inner, metrics }
    }

    /// Record a request of `operation` that ended as `outcome` (or failed with `error`).
    fn record(
        &self,
        operation: &'static str,
        outcome: UpstreamOutcome,
        error: Option<&UpstreamError>,
        started: Instant,
    ) {
        self.metrics.upstream(operation, outcome, started.elapsed());
        if let Some(e) = error.filter(|e| !e.is_not_found()) {
            self.metrics.upstream_failed(e);
        }
    }
}

fn span(operation: &'static str) -> tracing::Span {
    tracing::info_span!("upstream", otel.name = operation, otel.kind = "client")
}

#[async_trait::async_trait]
impl Upstream for Instrumented {
    async fn head(&self, object: &ObjectId) -> Result<ObjectMeta, UpstreamError> {
        let started = Instant::now();
        let result = self.inner.head(object).instrument(span("HeadObject")).await;
        match &result {
            Ok(_) => self.record("HeadObject", UpstreamOutcome::Http(200), None, started),
            Err(e) => self.record("HeadObject", e.outcome(), Some(e), started),
        }
        result
    }

    async fn get(
        &self,
        object: &ObjectId,
        if_match: Option<&str>,
        range: Option<Range<u64>>,
    ) -> Result<BodyStream, UpstreamError> {
        let started = Instant::now();
        let status = if range.is_some() { 206 } else { 200 };
        let result = self
            .inner
            .get(object, if_match, range)
            .instrument(span("GetObject"))
            .await;
        match &result {
            Ok(_) => self.record("GetObject", UpstreamOutcome::Http(status), None, started),
            Err(e) => self.record("GetObject", e.outcome(), Some(e), started),
        }
        result
    }

    async fn get_with_meta(
        &self,
        object: &ObjectId,
        range: ByteRange,
    ) -> Result<Option<(ObjectMeta, BodyStream)>, UpstreamError> {
        let started = Instant::now();
        let result = self
            .inner
            .get_with_meta(object, range)
            .instrument(span("GetObject"))
            .await;
        match &result {
            Ok(Some(_)) => self.record("GetObject", UpstreamOutcome::Http(206), None, started),
            Ok(None) => self.record("GetObject", UpstreamOutcome::Http(416), None, started),
            Err(e) => self.record("GetObject", e.outcome(), Some(e), started),
        }
        result
    }

    async fn list(
        &self,
        bucket: &str,
        prefix: &str,
        token: Option<String>,
    ) -> Result<(Vec<(String, u64)>, Option<String>), UpstreamError> {
        let started = Instant::now();
        let result = self
            .inner
            .list(bucket, prefix, token)
            .instrument(span("ListObjectsV2"))
            .await;
        match &result {
            Ok(_) => self.record("ListObjectsV2", UpstreamOutcome::Http(200), None, started),
            Err(e) => self.record("ListObjectsV2", e.outcome(), Some(e), started),
        }
        result
    }

    fn retries(&self) -> u64 {
        self.inner.retries()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::fake::FakeUpstream;

    fn object(key: &str) -> ObjectId {
        ObjectId {
            bucket: "b".into(),
            key: key.into(),
            version_id: None,
        }
    }

    #[tokio::test]
    async fn every_request_is_one_sample_with_its_outcome() {
        let fake = Arc::new(FakeUpstream::default());
        fake.put("k", bytes::Bytes::from_static(b"0123456789"), "\"e\"");
        let metrics = Arc::new(Metrics::default());
        let upstream = Instrumented::new(fake.clone(), metrics.clone());
        upstream.head(&object("k")).await.unwrap();
        upstream.head(&object("missing")).await.unwrap_err();
        let _body = upstream
            .get(&object("k"), Some("\"e\""), Some(0..4))
            .await
            .unwrap();
        upstream.list("b", "", None).await.unwrap();
        let s = metrics.snapshot();
        let count = |op: &str, status: &str| {
            s.sum(
                "larder_upstream_requests_total",
                &[("operation", op), ("status", status)],
            )
        };
        assert_eq!(count("HeadObject", "200"), 1.0);
        assert_eq!(count("HeadObject", "404"), 1.0);
        assert_eq!(count("GetObject", "206"), 1.0);
        assert_eq!(count("ListObjectsV2", "200"), 1.0);
        assert_eq!(s.sum("larder_upstream_requests_total", &[]), 4.0);
        // A missing key is an answer, not the upstream failing.
        assert!(metrics.upstream_health().last_error.is_none());
        fake.outage.store(true, std::sync::atomic::Ordering::SeqCst);
        upstream.head(&object("k")).await.unwrap_err();
        assert!(metrics.upstream_health().last_error.is_some());
    }
}
