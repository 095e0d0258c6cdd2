//! Which object a request names and what the upstream says about it: the identity every cache
//! key, metadata entry and upstream request is built from.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use http::{HeaderMap, HeaderName, HeaderValue};

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

    /// The current version of `key` in bucket `b`: the object unit tests name.
    #[cfg(test)]
    pub(crate) fn in_test_bucket(key: &str) -> ObjectId {
        ObjectId {
            bucket: "b".into(),
            key: key.into(),
            version_id: None,
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

/// The number of a part of a multipart upload, 1 to 10,000 (S3's limits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PartNumber(u16);

impl PartNumber {
    /// `text` as a part number, when it is one in its only canonical spelling.
    pub fn parse(text: &str) -> Option<Self> {
        // Digits only (`parse` would take a `+`), and no leading zero.
        if !text.bytes().all(|b| b.is_ascii_digit()) || text.starts_with('0') {
            return None;
        }
        let n: u16 = text.parse().ok()?;
        (1..=10_000).contains(&n).then_some(Self(n))
    }

    /// The number.
    pub fn get(self) -> u16 {
        self.0
    }
}

/// Where one part of a multipart upload lies in its object, as the upstream answered a
/// `partNumber` read of it. The upload fixed it, so it holds while the object keeps the ETag and
/// size it was learnt with ([`PartSpan::fits`]), and a read may then be answered from the
/// cache as the range it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartSpan {
    /// The object's ETag when the part was read.
    pub etag: Arc<str>,
    /// The object's size then.
    pub size: u64,
    /// The part's bytes in the object (never empty).
    pub bytes: std::ops::Range<u64>,
    /// How many parts the upload has (`x-amz-mp-parts-count`), when the upstream said.
    pub parts_count: Option<u32>,
    /// The part's own checksums as the upstream sent them (when the read asked, and the upload
    /// stored them), sent back on the same terms as an object's ([`ObjectMeta::checksums`]).
    pub checksums: Vec<(HeaderName, HeaderValue)>,
}

impl PartSpan {
    /// Whether the span describes the object `meta` describes.
    pub fn fits(&self, meta: &ObjectMeta) -> bool {
        self.size == meta.size && *self.etag == *meta.etag && self.bytes.end <= meta.size
    }
}

/// What the upstream says about an object, enough to answer GET and HEAD without it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    /// Size in bytes.
    pub size: u64,
    /// The entity tag, quoted as S3 sends it. Shared: every block key of the object holds it,
    /// and a hit would otherwise copy it into a key of its own.
    pub etag: Arc<str>,
    /// Last-Modified.
    pub last_modified: Option<SystemTime>,
    /// The version this metadata describes, for versioned buckets.
    pub version_id: Option<String>,
    /// Other headers S3 sends with the object (Content-Type, Cache-Control, `x-amz-meta-*`,
    /// storage class, ...), ready to send as they are.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The object's checksums as S3 stored them (`x-amz-checksum-crc32`, ..., and
    /// `x-amz-checksum-type`), when the answer this came from carried them. S3 sends them only
    /// with the whole object and only when asked (`x-amz-checksum-mode: ENABLED`), and a
    /// response sends them back on the same terms: an SDK then checks the bytes Larder served
    /// against what S3 stored. Not among [`Self::headers`], which every response carries.
    pub checksums: Vec<(HeaderName, HeaderValue)>,
    /// Whether the answer this came from was asked for the checksums, so [`Self::checksums`]
    /// is all the upstream stores (none, for an object stored without): a HEAD's was. A ranged
    /// GET's (a cold open's) cannot carry them, so `false` there, and a client asking for them
    /// gets them once a HEAD has been sent (`learn_checksums`).
    pub checksums_known: bool,
    /// The response headers made from the fields above, once (`s3::headers::object_headers`).
    /// Empty where an `ObjectMeta` is made: `Default::default()`.
    pub response_headers: ResponseHeaders,
}

/// A response's object headers, made from an [`ObjectMeta`]'s fields the first time one is
/// answered from it and copied for every response after. A hit's metadata is shared by every
/// response until it is fetched again, and making the map (hashing each name, parsing the
/// ETag, writing the date) was a twentieth of a small hit's instructions (docs/benchmarks.md).
///
/// Derived from the other fields, so it takes no part in comparing two `ObjectMeta`s, and a
/// clone starts empty: a copy whose fields are changed must not answer with the original's
/// headers.
#[derive(Default)]
pub struct ResponseHeaders(OnceLock<HeaderMap>);

impl ResponseHeaders {
    /// The map, made by `make` if this is the first time.
    pub fn get_or_make(&self, make: impl FnOnce() -> HeaderMap) -> &HeaderMap {
        self.0.get_or_init(make)
    }
}

impl Clone for ResponseHeaders {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl PartialEq for ResponseHeaders {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for ResponseHeaders {}

impl fmt::Debug for ResponseHeaders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "made"
        } else {
            "not made"
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_part_number_is_read_only_in_its_canonical_spelling() {
        for (text, want) in [("1", Some(1)), ("10000", Some(10_000)), ("347", Some(347))] {
            assert_eq!(PartNumber::parse(text).map(PartNumber::get), want, "{text}");
        }
        for text in ["0", "10001", "02", "+2", "-1", " 2", "2 ", "", "x", "65536"] {
            assert_eq!(PartNumber::parse(text), None, "{text}");
        }
    }
}
