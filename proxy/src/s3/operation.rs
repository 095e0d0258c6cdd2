//! Which S3 operation a request is, by method, address and query: a fixed set of names, so
//! the metrics' label cardinality stays bounded.

use http::{HeaderMap, Method};

use crate::s3::headers::names;
use crate::s3::request::{ObjectQuery, Target};

/// The S3 operation, for metrics: a fixed set of names, so label cardinality stays bounded.
pub fn name(
    method: &Method,
    target: &Target,
    query: &ObjectQuery,
    headers: &HeaderMap,
) -> &'static str {
    let has = |p: &str| query.other.iter().any(|o| o == p);
    match (method, target) {
        (&Method::GET, Target::Service) => "ListBuckets",
        (&Method::GET, Target::Bucket(_)) if has("list-type") => "ListObjectsV2",
        (&Method::GET, Target::Bucket(_)) if has("uploads") => "ListMultipartUploads",
        (&Method::GET, Target::Bucket(_)) if has("versions") => "ListObjectVersions",
        (&Method::GET, Target::Bucket(_))
            if query.other.iter().all(|o| {
                matches!(
                    o.as_str(),
                    "prefix" | "delimiter" | "marker" | "max-keys" | "encoding-type"
                )
            }) =>
        {
            "ListObjects"
        }
        (&Method::HEAD, Target::Bucket(_)) => "HeadBucket",
        (&Method::PUT, Target::Bucket(_)) if query.other.is_empty() => "CreateBucket",
        (&Method::DELETE, Target::Bucket(_)) if query.other.is_empty() => "DeleteBucket",
        (&Method::POST, Target::Bucket(_)) if has("delete") => "DeleteObjects",
        (_, Target::Bucket(_) | Target::Service) => "BucketOther",
        (&Method::GET, Target::Object { .. }) if has("attributes") => "GetObjectAttributes",
        (&Method::GET, Target::Object { .. }) if has("uploadId") => "ListParts",
        (&Method::GET, Target::Object { .. }) if query.other.is_empty() => "GetObject",
        (&Method::HEAD, Target::Object { .. }) => "HeadObject",
        (&Method::PUT, Target::Object { .. }) if has("uploadId") => {
            if headers.contains_key(names::X_AMZ_COPY_SOURCE) {
                "UploadPartCopy"
            } else {
                "UploadPart"
            }
        }
        (&Method::PUT, Target::Object { .. }) if query.other.is_empty() => {
            if headers.contains_key(names::X_AMZ_COPY_SOURCE) {
                "CopyObject"
            } else {
                "PutObject"
            }
        }
        (&Method::POST, Target::Object { .. }) if has("uploads") => "CreateMultipartUpload",
        (&Method::POST, Target::Object { .. }) if has("uploadId") => "CompleteMultipartUpload",
        (&Method::DELETE, Target::Object { .. }) if has("uploadId") => "AbortMultipartUpload",
        (&Method::DELETE, Target::Object { .. }) if query.other.is_empty() => "DeleteObject",
        _ => "ObjectOther",
    }
}
