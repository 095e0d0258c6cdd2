//! The origin: where bytes come from when no cache tier holds them.
//!
//! [`Origin`] is the seam between Larder's read path and the upstream S3 API: the real
//! implementation is [`s3::S3Origin`] (aws-sdk-s3); unit tests plug in fakes.

#[cfg(test)]
pub(crate) mod fake;
pub mod forward;
pub mod hedge;
pub mod s3;

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use futures::stream::BoxStream;
use http::{HeaderName, HeaderValue};

/// One object, or one version of it, upstream.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectId {
    /// Bucket name.
    pub bucket: Arc<str>,
    /// Object key.
    pub key: Arc<str>,
    /// A specific version (`versionId`), or the current one.
    pub version_id: Option<Arc<str>>,
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.bucket, self.key)?;
        if let Some(v) = &self.version_id {
            write!(f, "?versionId={v}")?;
        }
        Ok(())
    }
}

/// What the upstream says about an object, enough to answer GET and HEAD without it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    /// Size in bytes.
    pub size: u64,
    /// The entity tag, quoted as S3 sends it.
    pub etag: String,
    /// Last-Modified.
    pub last_modified: Option<SystemTime>,
    /// The version this metadata describes, for versioned buckets.
    pub version_id: Option<String>,
    /// Other headers S3 sends with the object (Content-Type, Cache-Control, `x-amz-meta-*`,
    /// storage class, ...), ready to send as they are.
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

/// The bytes a GET asks for before the object's size is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Span {
    /// `[start, end)`, cut short at the object's end.
    Bytes(Range<u64>),
    /// The last this many bytes (all of them in a smaller object).
    Last(u64),
}

impl Span {
    /// The `Range` header asking for it.
    pub fn header(&self) -> String {
        match self {
            Span::Bytes(r) => format!("bytes={}-{}", r.start, r.end.saturating_sub(1)),
            Span::Last(n) => format!("bytes=-{n}"),
        }
    }

    /// Its bytes within an object of `size` bytes.
    pub fn within(&self, size: u64) -> Range<u64> {
        match self {
            Span::Bytes(r) => r.start.min(size)..r.end.min(size),
            Span::Last(n) => size.saturating_sub(*n)..size,
        }
    }
}

/// A body arriving from the upstream.
pub type BodyStream = BoxStream<'static, Result<Bytes, OriginError>>;

/// Why the origin could not deliver.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OriginError {
    /// The upstream answered with an S3 error.
    #[error("upstream answered {status} {code}: {message}")]
    Service {
        /// HTTP status.
        status: u16,
        /// S3 error code (for HEAD, which has no body, derived from the status).
        code: String,
        /// Message.
        message: String,
    },
    /// An `If-Match` fetch found another ETag: the object changed since its metadata was read.
    #[error("the object changed upstream")]
    Changed,
    /// The upstream could not be reached, or the connection broke.
    #[error("upstream transport error: {0}")]
    Transport(String),
    /// The upstream did not answer, or stopped sending, within the configured time.
    #[error("upstream timed out: {0}")]
    Timeout(String),
    /// The upstream body was shorter or longer than announced.
    #[error("upstream body had {got} bytes, expected {expected}")]
    BodyLength {
        /// Bytes received.
        got: u64,
        /// Bytes expected.
        expected: u64,
    },
    /// The task fetching the bytes went away before finishing.
    #[error("the upstream fetch was abandoned")]
    Abandoned,
    /// Larder could not build the upstream request: a fault here, never the upstream's outage.
    #[error("could not build the upstream request: {0}")]
    Internal(String),
}

impl From<cache_core::Abandoned> for OriginError {
    fn from(_: cache_core::Abandoned) -> Self {
        OriginError::Abandoned
    }
}

impl OriginError {
    /// Whether the upstream said the object (or its bucket) does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, OriginError::Service { status: 404, .. })
    }
}

/// The upstream S3 API, as much of it as the read path needs.
#[async_trait::async_trait]
pub trait Origin: Send + Sync + 'static {
    /// HeadObject.
    async fn head(&self, object: &ObjectId) -> Result<ObjectMeta, OriginError>;

    /// GetObject of `range` (or the whole object), failing with [`OriginError::Changed`] if the
    /// object's ETag is no longer `if_match`.
    async fn get(
        &self,
        object: &ObjectId,
        if_match: Option<&str>,
        range: Option<Range<u64>>,
    ) -> Result<BodyStream, OriginError>;

    /// GetObject of `span` of an object nothing is known of yet: the answer's headers stand in
    /// for a HEAD (Content-Range gives the size), so a cold read costs one round trip, not two.
    /// `Ok(None)` when they cannot (no Content-Range, or the range starts past the end): the
    /// caller asks with HEAD instead. The default always says so.
    async fn get_with_meta(
        &self,
        _object: &ObjectId,
        _span: Span,
    ) -> Result<Option<(ObjectMeta, BodyStream)>, OriginError> {
        Ok(None)
    }

    /// One page of ListObjectsV2 under `prefix`: keys with their sizes, and the token for the
    /// next page (`None` on the last).
    async fn list(
        &self,
        bucket: &str,
        prefix: &str,
        token: Option<String>,
    ) -> Result<(Vec<(String, u64)>, Option<String>), OriginError>;

    /// Requests the client library sent again after a failed attempt, since start (each one a
    /// billed request upstream).
    fn retries(&self) -> u64 {
        0
    }
}
