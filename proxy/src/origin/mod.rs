//! The origin: where bytes come from when no cache tier holds them.
//!
//! [`Origin`] is the seam between Larder's read path and the upstream S3 API: the real
//! implementation is [`s3::S3Origin`] (aws-sdk-s3); unit tests plug in fakes.

#[cfg(test)]
pub(crate) mod fake;
pub mod forward;
pub mod hedge;
pub mod s3;

use std::ops::Range;

use crate::model::{BodyStream, ObjectId, ObjectMeta, OriginError, Span};

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
