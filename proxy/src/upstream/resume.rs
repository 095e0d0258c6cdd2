//! Resuming: a body pinned to a version (`If-Match`) over a known range that breaks, comes up
//! short or stalls for `idle_timeout` part-way is continued from the byte where it stopped, by a
//! new ranged GET pinned to the same ETag, up to `max_resumes` times, as a layer around the
//! upstream ([`Resuming`]). Readers see one uninterrupted body; an object that changed meanwhile
//! fails the resume (412, [`UpstreamError::Changed`]) rather than mixing versions.
//!
//! Only a body that started and broke is resumed: a request that failed outright was already
//! retried by the client library (`upstream_max_attempts`).

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{self, StreamExt};

use super::Upstream;
use crate::model::{
    BodyStream, ByteRange, ObjectId, ObjectMeta, PartNumber, PartSpan, UpstreamError,
};
use crate::telemetry::metrics::Metrics;

/// How bodies are resumed.
#[derive(Debug, Clone, Copy)]
pub struct ResumePolicy {
    /// Times one body is resumed before its error stands; 0 never resumes.
    pub max_resumes: u32,
    /// Longest wait for the next piece of a body before it counts as broken.
    pub idle_timeout: Duration,
}

/// The layer: `inner`'s versioned, ranged bodies, resumed as [`ResumePolicy`] says.
pub struct Resuming {
    inner: Arc<dyn Upstream>,
    policy: ResumePolicy,
    metrics: Arc<Metrics>,
}

impl Resuming {
    /// `inner`, resuming as `policy` says and counting each resume in `metrics`.
    pub fn new(inner: Arc<dyn Upstream>, policy: ResumePolicy, metrics: Arc<Metrics>) -> Self {
        Self {
            inner,
            policy,
            metrics,
        }
    }

    /// `body`, the answer to a GET of `range` of `object` at `etag`, resumed where it breaks.
    fn resumable(
        &self,
        object: &ObjectId,
        etag: &str,
        range: Range<u64>,
        body: BodyStream,
    ) -> BodyStream {
        let state = Body {
            inner: self.inner.clone(),
            policy: self.policy,
            metrics: self.metrics.clone(),
            object: object.clone(),
            etag: etag.to_owned(),
            range: range.clone(),
            next: range.start,
            body: Some(body),
            resumes: 0,
        };
        stream::unfold(Some(state), |state| async move {
            let mut state = state?;
            match state.next_chunk().await {
                Some(Ok(chunk)) => Some((Ok(chunk), Some(state))),
                Some(Err(e)) => Some((Err(e), None)),
                None => None,
            }
        })
        .boxed()
    }
}

/// One resumable body: where it is, and the request that continues it.
struct Body {
    inner: Arc<dyn Upstream>,
    policy: ResumePolicy,
    metrics: Arc<Metrics>,
    object: ObjectId,
    etag: String,
    range: Range<u64>,
    /// The next byte of the object to arrive.
    next: u64,
    /// The body being read; `None` once it broke and before the resume's answer.
    body: Option<BodyStream>,
    resumes: u32,
}

impl Body {
    /// The next chunk; the error that ends the body (after resumes ran out, or one that cannot
    /// be resumed); or `None` once the whole range has arrived.
    async fn next_chunk(&mut self) -> Option<Result<bytes::Bytes, UpstreamError>> {
        loop {
            let failure = match self.body.as_mut() {
                None => {
                    let rest = self.next..self.range.end;
                    match self
                        .inner
                        .get(&self.object, Some(&self.etag), Some(rest))
                        .await
                    {
                        Ok(body) => {
                            self.body = Some(body);
                            continue;
                        }
                        // The resume's own request failed outright (and was retried): it
                        // stands, like any failed request.
                        Err(e) => return Some(Err(e)),
                    }
                }
                Some(body) => {
                    let idle = self.policy.idle_timeout;
                    if self.next == self.range.end {
                        // Every byte arrived. One more look lets the connection see its end
                        // and go back to the pool; whatever it says changes nothing.
                        let _ = tokio::time::timeout(idle, body.next()).await;
                        self.body = None;
                        return None;
                    }
                    match tokio::time::timeout(idle, body.next()).await {
                        Ok(Some(Ok(chunk))) => {
                            let end = self.next + chunk.len() as u64;
                            if end > self.range.end {
                                return Some(Err(UpstreamError::BodyLength {
                                    got: end - self.range.start,
                                    expected: self.range.end - self.range.start,
                                }));
                            }
                            self.next = end;
                            return Some(Ok(chunk));
                        }
                        Ok(Some(Err(e))) => e,
                        Ok(None) => UpstreamError::BodyLength {
                            got: self.next - self.range.start,
                            expected: self.range.end - self.range.start,
                        },
                        Err(_) => UpstreamError::Timeout(format!("no body bytes for {idle:?}")),
                    }
                }
            };
            let started = self.next > self.range.start;
            if !(started && failure.is_resumable()) || self.resumes >= self.policy.max_resumes {
                return Some(Err(failure));
            }
            self.resumes += 1;
            self.body = None;
            self.metrics.resumed();
            tracing::info!(object = %self.object, at = self.next, error = %failure, "resuming a broken upstream body");
        }
    }
}

#[async_trait::async_trait]
impl Upstream for Resuming {
    async fn head(&self, object: &ObjectId) -> Result<ObjectMeta, UpstreamError> {
        self.inner.head(object).await
    }

    async fn get(
        &self,
        object: &ObjectId,
        if_match: Option<&str>,
        range: Option<Range<u64>>,
    ) -> Result<BodyStream, UpstreamError> {
        let body = self.inner.get(object, if_match, range.clone()).await?;
        Ok(match (if_match, range) {
            (Some(etag), Some(range)) => self.resumable(object, etag, range, body),
            // Without a version to pin, a resume could splice two versions; without a range,
            // it could not say where the body ends.
            _ => body,
        })
    }

    async fn get_with_meta(
        &self,
        object: &ObjectId,
        span: ByteRange,
    ) -> Result<Option<(ObjectMeta, BodyStream)>, UpstreamError> {
        let Some((meta, body)) = self.inner.get_with_meta(object, span).await? else {
            return Ok(None);
        };
        // The answer names the version and the size: what is left of it can be asked for.
        let body = if meta.etag.is_empty() {
            body
        } else {
            self.resumable(object, &meta.etag, span.within(meta.size), body)
        };
        Ok(Some((meta, body)))
    }

    async fn get_part(
        &self,
        object: &ObjectId,
        part: PartNumber,
    ) -> Result<Option<(ObjectMeta, PartSpan, BodyStream)>, UpstreamError> {
        let Some((meta, span, body)) = self.inner.get_part(object, part).await? else {
            return Ok(None);
        };
        // The answer said where the part lies: what is left of it can be asked as a range.
        let body = self.resumable(object, &meta.etag, span.bytes.clone(), body);
        Ok(Some((meta, span, body)))
    }

    async fn list(
        &self,
        bucket: &str,
        prefix: &str,
        token: Option<String>,
    ) -> Result<(Vec<(String, u64)>, Option<String>), UpstreamError> {
        self.inner.list(bucket, prefix, token).await
    }

    fn retries(&self) -> u64 {
        self.inner.retries()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::memory::fixtures::{collect, data, object};
    use crate::upstream::memory::MemoryUpstream;
    use std::sync::atomic::Ordering;

    fn resuming(origin: &Arc<MemoryUpstream>, metrics: &Arc<Metrics>) -> Resuming {
        let policy = ResumePolicy {
            max_resumes: 3,
            idle_timeout: Duration::from_secs(5),
        };
        Resuming::new(origin.clone(), policy, metrics.clone())
    }

    #[tokio::test]
    async fn a_broken_body_is_resumed_where_it_broke_and_resumes_are_bounded() {
        let origin = Arc::new(MemoryUpstream::default());
        origin.put("k", data(10_000), "\"e1\"");
        let metrics = Arc::new(Metrics::default());
        let up = resuming(&origin, &metrics);
        origin.break_at.store(2500, Ordering::SeqCst);
        origin.breaks_left.store(2, Ordering::SeqCst);
        // Breaks at 2500, resumes, breaks again 2500 bytes later (past the range's end, so not
        // at all), and the bytes are exact.
        let body = up
            .get(&object(), Some("\"e1\""), Some(0..4096))
            .await
            .unwrap();
        assert_eq!(collect(body).await.unwrap(), &data(10_000)[..4096]);
        assert_eq!(origin.gets.load(Ordering::SeqCst), 2);
        let resumes = || metrics.snapshot().sum("larder_upstream_resumes_total", &[]);
        assert_eq!(resumes(), 1.0);

        // A body that keeps breaking fails once the resumes run out.
        origin.break_at.store(100, Ordering::SeqCst);
        origin.breaks_left.store(100, Ordering::SeqCst);
        let body = up
            .get(&object(), Some("\"e1\""), Some(4096..8192))
            .await
            .unwrap();
        let err = collect(body).await;
        assert!(matches!(err, Err(UpstreamError::Transport(_))), "{err:?}");
        assert_eq!(origin.gets.load(Ordering::SeqCst), 2 + 4, "1 + 3 resumes");
        assert_eq!(resumes(), 4.0);
    }

    #[tokio::test]
    async fn a_resume_never_mixes_versions_and_unpinned_bodies_are_not_resumed() {
        let origin = Arc::new(MemoryUpstream::default());
        origin.put("k", data(10_000), "\"e1\"");
        let metrics = Arc::new(Metrics::default());
        let up = resuming(&origin, &metrics);
        origin.break_at.store(1000, Ordering::SeqCst);
        origin.breaks_left.store(1, Ordering::SeqCst);
        let mut body = up
            .get(&object(), Some("\"e1\""), Some(0..4096))
            .await
            .unwrap();
        let first = body.next().await.unwrap().unwrap();
        assert_eq!(first.len(), 1000);
        // Overwritten while the first body was being read: the resume is refused.
        origin.put("k", data(9_999), "\"e2\"");
        let rest = collect(body).await;
        assert!(matches!(rest, Err(UpstreamError::Changed)), "{rest:?}");

        origin.breaks_left.store(1, Ordering::SeqCst);
        let unpinned = up.get(&object(), None, Some(0..4096)).await.unwrap();
        let err = collect(unpinned).await;
        assert!(matches!(err, Err(UpstreamError::Transport(_))), "{err:?}");
    }
}
