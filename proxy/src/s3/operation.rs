//! Which S3 operation a request is, by method, address and query: a fixed set of names, so
//! the metrics' label cardinality stays bounded.

use http::{HeaderMap, Method};

use crate::s3::headers::names;
use crate::s3::request::{ObjectQuery, Target};

/// Declares [`Operation`]: each variant named as S3 names the operation.
macro_rules! operations {
    ($($(#[$doc:meta])* $name:ident,)+) => {
        /// The S3 operation, for metrics and spans: a fixed set, so label cardinality stays
        /// bounded, and each one a small number, so metrics can find its series without
        /// hashing its name.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Operation {
            $($(#[$doc])* $name,)+
        }

        impl Operation {
            /// Every operation, in declaration order.
            pub const ALL: &[Operation] = &[$(Operation::$name,)+];

            /// The name, as S3 spells it.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Operation::$name => stringify!($name),)+
                }
            }

            /// The operation's place in [`Self::ALL`], to find its metric series without
            /// hashing its name.
            pub const fn index(self) -> usize {
                self as usize
            }
        }
    };
}

operations! {
    ListBuckets,
    ListObjectsV2,
    ListMultipartUploads,
    ListObjectVersions,
    ListObjects,
    HeadBucket,
    CreateBucket,
    DeleteBucket,
    DeleteObjects,
    /// Any other request to a bucket or the service.
    BucketOther,
    GetObjectAttributes,
    ListParts,
    GetObject,
    HeadObject,
    UploadPartCopy,
    UploadPart,
    CopyObject,
    PutObject,
    CreateMultipartUpload,
    CompleteMultipartUpload,
    AbortMultipartUpload,
    DeleteObject,
    /// Any other request to an object.
    ObjectOther,
    /// A browser-form upload (POST to a bucket with a policy).
    PostObject,
    /// A request whose signature or credentials were refused.
    Unauthenticated,
    /// A request whose address names no bucket or object Larder can route.
    Unknown,
}

/// Which operation a request to `target` is.
pub fn name(
    method: &Method,
    target: &Target,
    query: &ObjectQuery,
    headers: &HeaderMap,
) -> Operation {
    let has = |p: &str| query.other.iter().any(|o| o == p);
    match (method, target) {
        (&Method::GET, Target::Service) => Operation::ListBuckets,
        (&Method::GET, Target::Bucket(_)) if has("list-type") => Operation::ListObjectsV2,
        (&Method::GET, Target::Bucket(_)) if has("uploads") => Operation::ListMultipartUploads,
        (&Method::GET, Target::Bucket(_)) if has("versions") => Operation::ListObjectVersions,
        (&Method::GET, Target::Bucket(_))
            if query.other.iter().all(|o| {
                matches!(
                    o.as_str(),
                    "prefix" | "delimiter" | "marker" | "max-keys" | "encoding-type"
                )
            }) =>
        {
            Operation::ListObjects
        }
        (&Method::HEAD, Target::Bucket(_)) => Operation::HeadBucket,
        (&Method::PUT, Target::Bucket(_)) if query.other.is_empty() => Operation::CreateBucket,
        (&Method::DELETE, Target::Bucket(_)) if query.other.is_empty() => Operation::DeleteBucket,
        (&Method::POST, Target::Bucket(_)) if has("delete") => Operation::DeleteObjects,
        (_, Target::Bucket(_) | Target::Service) => Operation::BucketOther,
        (&Method::GET, Target::Object { .. }) if has("attributes") => {
            Operation::GetObjectAttributes
        }
        (&Method::GET, Target::Object { .. }) if has("uploadId") => Operation::ListParts,
        (&Method::GET, Target::Object { .. }) if query.other.is_empty() => Operation::GetObject,
        (&Method::HEAD, Target::Object { .. }) => Operation::HeadObject,
        (&Method::PUT, Target::Object { .. }) if has("uploadId") => {
            if headers.contains_key(names::X_AMZ_COPY_SOURCE) {
                Operation::UploadPartCopy
            } else {
                Operation::UploadPart
            }
        }
        (&Method::PUT, Target::Object { .. }) if query.other.is_empty() => {
            if headers.contains_key(names::X_AMZ_COPY_SOURCE) {
                Operation::CopyObject
            } else {
                Operation::PutObject
            }
        }
        (&Method::POST, Target::Object { .. }) if has("uploads") => {
            Operation::CreateMultipartUpload
        }
        (&Method::POST, Target::Object { .. }) if has("uploadId") => {
            Operation::CompleteMultipartUpload
        }
        (&Method::DELETE, Target::Object { .. }) if has("uploadId") => {
            Operation::AbortMultipartUpload
        }
        (&Method::DELETE, Target::Object { .. }) if query.other.is_empty() => {
            Operation::DeleteObject
        }
        _ => Operation::ObjectOther,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_are_named_as_s3_names_them() {
        assert_eq!(Operation::GetObject.as_str(), "GetObject");
        assert_eq!(Operation::ListObjectsV2.as_str(), "ListObjectsV2");
        let names: std::collections::HashSet<_> =
            Operation::ALL.iter().map(|o| o.as_str()).collect();
        assert_eq!(names.len(), Operation::ALL.len());
    }
}
