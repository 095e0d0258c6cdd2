//! The upstream, traced and counted: every request the read path sends gets a client span and
//! one `larder_upstream_requests_total` sample (operation, status or failure, duration, price),
//! and a failure other than "not found" becomes the status page's last upstream error. One layer,
//! so no caller repeats the span, the timer and the counter.

use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use tracing::Instrument;

use super::Upstream;
use crate::model::{
    BodyStream, ByteRange, ObjectId, ObjectMeta, PartNumber, PartSpan, UpstreamError,
    UpstreamOutcome,
};
use crate::s3::operation::Operation;
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

    /// Send `request` for `bucket` as `operation`: in its span, timed, counted with its status
    /// (`ok` gives it from an answer) and priced to its bucket, and its failure, unless "not
    /// found", kept as the last error.
    async fn counted<T: Send>(
        &self,
        operation: Operation,
        bucket: &str,
        ok: impl FnOnce(&T) -> u16 + Send,
        request: impl Future<Output = Result<T, UpstreamError>> + Send,
    ) -> Result<T, UpstreamError> {
        let started = Instant::now();
        let result = request.instrument(span(operation)).await;
        let outcome = match &result {
            Ok(answer) => UpstreamOutcome::Http(ok(answer)),
            Err(e) => e.outcome(),
        };
        self.metrics
            .upstream(operation, Some(bucket), outcome, started.elapsed());
        if let Err(e) = &result {
            if !e.is_not_found() {
                self.metrics.upstream_failed(e);
            }
        }
        result
    }
}

fn span(operation: Operation) -> tracing::Span {
    tracing::info_span!(
        "upstream",
        otel.name = operation.as_str(),
        otel.kind = "client"
    )
}

#[async_trait::async_trait]
impl Upstream for Instrumented {
    async fn head(&self, object: &ObjectId) -> Result<ObjectMeta, UpstreamError> {
        self.counted(
            Operation::HeadObject,
            &object.bucket,
            |_| 200,
            self.inner.head(object),
        )
        .await
    }

    async fn get(
        &self,
        object: &ObjectId,
        if_match: Option<&str>,
        range: Option<Range<u64>>,
    ) -> Result<BodyStream, UpstreamError> {
        let status = if range.is_some() { 206 } else { 200 };
        self.counted(
            Operation::GetObject,
            &object.bucket,
            |_| status,
            self.inner.get(object, if_match, range),
        )
        .await
    }

    async fn get_with_meta(
        &self,
        object: &ObjectId,
        range: ByteRange,
    ) -> Result<Option<(ObjectMeta, BodyStream)>, UpstreamError> {
        // 416: the answer could not stand for a HEAD (see `Upstream::get_with_meta`).
        let status = |answer: &Option<_>| if answer.is_some() { 206 } else { 416 };
        self.counted(
            Operation::GetObject,
            &object.bucket,
            status,
            self.inner.get_with_meta(object, range),
        )
        .await
    }

    async fn get_part(
        &self,
        object: &ObjectId,
        part: PartNumber,
    ) -> Result<Option<(ObjectMeta, PartSpan, BodyStream)>, UpstreamError> {
        // 206 for an answer read as a part's; otherwise as the upstream answered, which the
        // caller's pass-through asks again.
        let status = |answer: &Option<_>| if answer.is_some() { 206 } else { 200 };
        self.counted(
            Operation::GetObject,
            &object.bucket,
            status,
            self.inner.get_part(object, part),
        )
        .await
    }

    async fn list(
        &self,
        bucket: &str,
        prefix: &str,
        token: Option<String>,
    ) -> Result<(Vec<(String, u64)>, Option<String>), UpstreamError> {
        self.counted(
            Operation::ListObjectsV2,
            bucket,
            |_| 200,
            self.inner.list(bucket, prefix, token),
        )
        .await
    }

    fn retries(&self) -> u64 {
        self.inner.retries()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::memory::MemoryUpstream;

    #[tokio::test]
    async fn every_request_is_one_sample_with_its_outcome() {
        let fake = Arc::new(MemoryUpstream::default());
        fake.put("k", bytes::Bytes::from_static(b"0123456789"), "\"e\"");
        let metrics = Arc::new(Metrics::default());
        let upstream = Instrumented::new(fake.clone(), metrics.clone());
        upstream.head(&ObjectId::in_test_bucket("k")).await.unwrap();
        upstream
            .head(&ObjectId::in_test_bucket("missing"))
            .await
            .unwrap_err();
        let _body = upstream
            .get(&ObjectId::in_test_bucket("k"), Some("\"e\""), Some(0..4))
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
        upstream
            .head(&ObjectId::in_test_bucket("k"))
            .await
            .unwrap_err();
        assert!(metrics.upstream_health().last_error.is_some());
    }
}
