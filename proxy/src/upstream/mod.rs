//! The upstream: where bytes come from when no cache tier holds them.
//!
//! [`Upstream`] is the seam between Larder's read path and the upstream S3 API: the real
//! implementation is [`s3::S3Upstream`] (S3 over HTTP, signed); unit tests plug in fakes. Concerns of
//! every request are layers implementing the same trait, each in its own file and composed in
//! [`layered`]: [`instrument`] (spans and metrics), [`throttle`] (per-prefix back-off on
//! `SlowDown`), [`hedge`], [`resume`] and [`pieces`]. The in-memory
//! upstream ([`memory`]) stands in for S3 in tests; `tests/upstream_conformance.rs` holds both
//! to one behaviour. Everything the
//! cache does not serve passes through [`forward::Forwarder`], re-signed. [`Clients`] holds both,
//! signing with the same credentials.

pub mod forward;
pub mod hedge;
pub mod instrument;
pub mod memory;
pub mod pieces;
pub mod resume;
pub mod roots;
pub mod s3;
pub mod throttle;

use std::ops::Range;

use std::sync::Arc;

use crate::model::{
    BodyStream, ByteRange, ObjectId, ObjectMeta, PartNumber, PartSpan, UpstreamError,
};
use crate::telemetry::metrics::Metrics;
use forward::{ForwardError, Forwarder};
use s3::{S3Upstream, S3UpstreamConfig};

/// The stack the read path reads through, in one place: `inner` (S3) traced and counted
/// ([`instrument::Instrumented`], so every request, each throttled attempt too, is one metric
/// sample); then paced per prefix once the upstream throttles it, a throttled request sent again
/// up to `max_attempts` times in all ([`throttle::Throttled`]: below the hedge, so a hedge waits
/// for its prefix's pace like any request); then, for block GETs, hedged ([`hedge::Hedged`],
/// each attempt counted) after the `hedge_quantile` of recent latencies (`None`: never); then
/// bodies pinned to a version resumed where they break ([`resume::Resuming`]: each resume a
/// request through the layers below, counted and hedged like any other); then block GETs sent
/// as up to `pieces` ranged GETs at once ([`pieces::Pieces`]; with 1, no such layer), each
/// piece hedged, and resumed where it breaks, on its own.
pub fn layered(
    inner: Arc<dyn Upstream>,
    max_attempts: u32,
    hedge_quantile: Option<f64>,
    pieces: u32,
    resume: resume::ResumePolicy,
    metrics: Arc<Metrics>,
) -> Arc<dyn Upstream> {
    let counted = Arc::new(instrument::Instrumented::new(inner, metrics.clone()));
    let paced = Arc::new(throttle::Throttled::new(
        counted,
        max_attempts,
        metrics.clone(),
    ));
    let hedged = Arc::new(hedge::Hedged::new(
        paced,
        hedge::HedgePolicy::new(hedge_quantile),
        metrics.clone(),
    ));
    let resumed = Arc::new(resume::Resuming::new(hedged, resume, metrics));
    // One piece is the whole GET: the layer would only pass it through.
    if pieces <= 1 {
        return resumed;
    }
    Arc::new(pieces::Pieces::new(resumed, pieces))
}

/// The upstream S3 API, as much of it as the read path needs.
#[async_trait::async_trait]
pub trait Upstream: Send + Sync + 'static {
    /// HeadObject.
    async fn head(&self, object: &ObjectId) -> Result<ObjectMeta, UpstreamError>;

    /// GetObject of `range` (or the whole object), failing with [`UpstreamError::Changed`] if the
    /// object's ETag is no longer `if_match`.
    async fn get(
        &self,
        object: &ObjectId,
        if_match: Option<&str>,
        range: Option<Range<u64>>,
    ) -> Result<BodyStream, UpstreamError>;

    /// GetObject of `span` of an object nothing is known of yet: the answer's headers stand in
    /// for a HEAD (Content-Range gives the size), so a cold read costs one round trip, not two.
    /// `Ok(None)` when they cannot (no Content-Range, or the range starts past the end): the
    /// caller asks with HEAD instead. The default always says so.
    async fn get_with_meta(
        &self,
        _object: &ObjectId,
        _span: ByteRange,
    ) -> Result<Option<(ObjectMeta, BodyStream)>, UpstreamError> {
        Ok(None)
    }

    /// GetObject of part `part` of a multipart upload (`?partNumber=N`), whose place in the
    /// object only the answer says: the object's metadata (without the part's checksums, which
    /// are not the object's), where the part lies (with its checksums, asked for), and its
    /// bytes. `Ok(None)` when the answer cannot be read so (not a 206 naming its range): the
    /// caller passes the read through. The default always says so.
    async fn get_part(
        &self,
        _object: &ObjectId,
        _part: PartNumber,
    ) -> Result<Option<(ObjectMeta, PartSpan, BodyStream)>, UpstreamError> {
        Ok(None)
    }

    /// One page of ListObjectsV2 under `prefix`: keys with their sizes, and the token for the
    /// next page (`None` on the last).
    async fn list(
        &self,
        bucket: &str,
        prefix: &str,
        token: Option<String>,
    ) -> Result<(Vec<(String, u64)>, Option<String>), UpstreamError>;

    /// Requests the client library sent again after a failed attempt, since start (each one a
    /// billed request upstream).
    fn retries(&self) -> u64 {
        0
    }
}

/// The upstream, as the cache reads it and as requests pass through to it.
pub struct Clients {
    /// Object reads (HEAD and ranged GETs) for the cache.
    pub origin: Arc<dyn Upstream>,
    /// Every other request (on the object reads' client and connections).
    pub forwarder: Arc<Forwarder>,
    /// The credentials both sign with (`None`: unsigned), for Larder's other AWS calls (SQS).
    pub credentials: Option<aws_credential_types::provider::SharedCredentialsProvider>,
    /// The CA certificates both trust besides the system's (`upstream_ca_file`), for the same
    /// calls.
    pub extra_roots: Option<roots::ExtraRoots>,
}

impl Clients {
    /// Both clients of an S3 upstream, signing with the same credentials; `first_byte_timeout`
    /// bounds the wait for a pass-through answer.
    pub async fn s3(config: &S3UpstreamConfig) -> Result<Self, ForwardError> {
        let origin = S3Upstream::new(config).await?;
        Ok(Self {
            credentials: origin.credentials(),
            extra_roots: config.extra_roots.clone(),
            forwarder: origin.forwarder(),
            origin: Arc::new(origin),
        })
    }
}
