//! Which object a request names and what the upstream says about it: the identity every cache
//! key, metadata entry and upstream request is built from.

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

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

impl ObjectId {
    /// The same object's current version (itself, when it names none).
    pub fn latest(&self) -> ObjectId {
        ObjectId {
            version_id: None,
            ..self.clone()
        }
    }
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
