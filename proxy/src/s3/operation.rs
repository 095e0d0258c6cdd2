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
    // A header hoisted into the query (`x-amz-request-payer=requester` in a presigned URL,
    // SSE-C's keys, ...) changes what S3 answers, not which operation it is: a presigned
    // Requester Pays GET is a GetObject. Only the rest are sub-resources.
    let sub_resources = || query.other.iter().filter(|o| !o.starts_with("x-amz-"));
    let has = |p: &str| sub_resources().any(|o| o == p);
    let plain = || sub_resources().next().is_none();
    match (method, target) {
        (&Method::GET, Target::Service) => Operation::ListBuckets,
        (&Method::GET, Target::Bucket(_)) if has("list-type") => Operation::ListObjectsV2,
        (&Method::GET, Target::Bucket(_)) if has("uploads") => Operation::ListMultipartUploads,
        (&Method::GET, Target::Bucket(_)) if has("versions") => Operation::ListObjectVersions,
        (&Method::GET, Target::Bucket(_))
            if sub_resources().all(|o| {
                matches!(
                    o.as_str(),
                    "prefix" | "delimiter" | "marker" | "max-keys" | "encoding-type"
                )
            }) =>
        {
            Operation::ListObjects
        }
        (&Method::HEAD, Target::Bucket(_)) => Operation::HeadBucket,
        (&Method::PUT, Target::Bucket(_)) if plain() => Operation::CreateBucket,
        (&Method::DELETE, Target::Bucket(_)) if plain() => Operation::DeleteBucket,
        (&Method::POST, Target::Bucket(_)) if has("delete") => Operation::DeleteObjects,
        (_, Target::Bucket(_) | Target::Service) => Operation::BucketOther,
        (&Method::GET, Target::Object { .. }) if has("attributes") => {
            Operation::GetObjectAttributes
        }
        (&Method::GET, Target::Object { .. }) if has("uploadId") => Operation::ListParts,
        (&Method::GET, Target::Object { .. }) if plain() => Operation::GetObject,
        (&Method::HEAD, Target::Object { .. }) => Operation::HeadObject,
        (&Method::PUT, Target::Object { .. }) if has("uploadId") => {
            if headers.contains_key(names::X_AMZ_COPY_SOURCE) {
                Operation::UploadPartCopy
            } else {
                Operation::UploadPart
            }
        }
        (&Method::PUT, Target::Object { .. }) if plain() => {
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
        (&Method::DELETE, Target::Object { .. }) if plain() => Operation::DeleteObject,
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

    #[test]
    fn a_header_hoisted_into_the_query_does_not_change_the_operation() {
        let object = Target::Object {
            bucket: "b".into(),
            key: "k".into(),
        };
        let named = |method: Method, query: &str| {
            name(
                &method,
                &object,
                &ObjectQuery::parse(Some(query)),
                &HeaderMap::new(),
            )
        };
        // A presigned Requester Pays read is a GetObject (it was named ObjectOther).
        assert_eq!(
            named(Method::GET, "x-amz-request-payer=requester"),
            Operation::GetObject
        );
        assert_eq!(
            named(
                Method::PUT,
                "x-amz-acl=private&x-amz-request-payer=requester"
            ),
            Operation::PutObject
        );
        assert_eq!(
            named(Method::DELETE, "x-amz-request-payer=requester"),
            Operation::DeleteObject
        );
        // A sub-resource still is one, whatever is hoisted beside it.
        assert_eq!(
            named(Method::GET, "tagging&x-amz-request-payer=requester"),
            Operation::ObjectOther
        );
        assert_eq!(
            named(Method::GET, "uploadId=u&x-amz-request-payer=requester"),
            Operation::ListParts
        );
        let bucket = Target::Bucket("b".into());
        let listed = name(
            &Method::GET,
            &bucket,
            &ObjectQuery::parse(Some("prefix=a&x-amz-request-payer=requester")),
            &HeaderMap::new(),
        );
        assert_eq!(listed, Operation::ListObjects);
    }
}
