//! What an S3 request addresses: bucket, key, and the query parameters Larder acts on.

use std::sync::Arc;

use percent_encoding::percent_decode_str;

use super::error::S3Error;
use super::query::Query;
use crate::model::PartNumber;

/// Longest key S3 accepts, in bytes of UTF-8.
pub const MAX_KEY_LEN: usize = 1024;
/// The query parameters that carry a presigned URL's SigV4 signature, in the order parsed: the
/// verifier reads them, the forwarder strips them.
pub const PRESIGNED_PARAMS: [&str; 6] = [
    "X-Amz-Algorithm",
    "X-Amz-Credential",
    "X-Amz-Date",
    "X-Amz-Expires",
    "X-Amz-SignedHeaders",
    "X-Amz-Signature",
];

/// The target of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `/`: the service (ListBuckets).
    Service,
    /// A bucket (ListObjects and bucket sub-resources).
    Bucket(Arc<str>),
    /// An object. Shared text: the object's id, the metrics' bucket label and the span take
    /// these, not copies.
    Object {
        /// Bucket name.
        bucket: Arc<str>,
        /// Decoded key.
        key: Arc<str>,
    },
}

impl Target {
    /// The bucket addressed; `None` for the service.
    pub fn bucket(&self) -> Option<&Arc<str>> {
        match self {
            Target::Service => None,
            Target::Bucket(b) | Target::Object { bucket: b, .. } => Some(b),
        }
    }
}

/// Work out the target from the `Host` header and the still-encoded path.
///
/// With `base_domain` set, a host `<bucket>.<base_domain>` selects virtual-hosted style, where
/// the whole path is the key; otherwise the first path segment is the bucket (path style).
pub fn target(
    host: Option<&str>,
    raw_path: &str,
    base_domain: Option<&str>,
) -> Result<Target, S3Error> {
    let path = raw_path.strip_prefix('/').unwrap_or(raw_path);
    let (bucket, raw_key) = match virtual_bucket(host, base_domain) {
        Some(bucket) => (Arc::from(bucket), Some(path)),
        None => {
            if path.is_empty() {
                return Ok(Target::Service);
            }
            match path.split_once('/') {
                Some((b, k)) => (decode(b)?, Some(k)),
                None => (decode(path)?, None),
            }
        }
    };
    validate_bucket(&bucket)?;
    match raw_key {
        None | Some("") => Ok(Target::Bucket(bucket)),
        Some(raw) => {
            let key = decode(raw)?;
            if key.len() > MAX_KEY_LEN {
                return Err(S3Error::KeyTooLong);
            }
            Ok(Target::Object { bucket, key })
        }
    }
}

/// The host a request is addressed to: its `Host` header, or the URI's authority (HTTP/2's
/// `:authority`, an absolute-form HTTP/1 target). The one value both routing and signature
/// checks read, so the bucket verified is the bucket routed; a request naming two different
/// hosts is refused.
pub fn host(parts: &http::request::Parts) -> Result<Option<&str>, S3Error> {
    let header = match parts.headers.get(http::header::HOST) {
        Some(v) => Some(
            v.to_str()
                .map_err(|_| S3Error::InvalidRequest("the Host header is not ASCII".into()))?,
        ),
        None => None,
    };
    match (header, parts.uri.authority()) {
        (Some(h), Some(a)) if !h.eq_ignore_ascii_case(a.as_str()) => Err(S3Error::InvalidRequest(
            "the Host header and the request target name different hosts".into(),
        )),
        (Some(h), _) => Ok(Some(h)),
        (None, a) => Ok(a.map(|a| a.as_str())),
    }
}

/// The bucket a virtual-hosted-style `host` names (`<bucket>.<base_domain>`), if any.
pub fn virtual_bucket<'a>(host: Option<&'a str>, base_domain: Option<&str>) -> Option<&'a str> {
    let (host, domain) = (host?, base_domain?);
    strip_port(host)
        .strip_suffix(domain)
        .and_then(|b| b.strip_suffix('.'))
        .filter(|b| !b.is_empty())
}

/// Percent-encode decoded path bytes as S3 canonicalises a path: every byte but the unreserved
/// characters and `/`. Used to address the upstream and to check signatures on the path.
pub fn encode_path(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        // An IPv6 literal is never a virtual-hosted bucket; leave it whole so it does not match.
        return host;
    }
    host.rsplit_once(':').map_or(host, |(h, _)| h)
}

fn decode(raw: &str) -> Result<Arc<str>, S3Error> {
    // A '%' must start a valid escape; percent_decode_str would pass a stray one through.
    let bytes = raw.as_bytes();
    let mut escaped = false;
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'%' {
            let ok = bytes
                .get(i + 1..i + 3)
                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit));
            if !ok {
                return Err(S3Error::InvalidUri);
            }
            escaped = true;
        }
    }
    // Most keys carry no escape: then the text is the name, already UTF-8 (it is a `str`).
    if !escaped {
        return Ok(raw.into());
    }
    percent_decode_str(raw)
        .decode_utf8()
        .map(|s| s.into())
        .map_err(|_| S3Error::InvalidUri)
}

/// Bucket names as S3 accepts them, including legacy us-east-1 names (upper case, `_`, up to
/// 255 characters).
pub fn validate_bucket(bucket: &str) -> Result<(), S3Error> {
    let ok = (3..=255).contains(&bucket.len())
        && bucket
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-' | b'_'))
        && bucket
            .bytes()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(S3Error::InvalidBucketName)
    }
}

/// The query parameters of an object GET or HEAD that Larder acts on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectQuery {
    /// `versionId`.
    pub version_id: Option<String>,
    /// `partNumber`.
    pub part_number: Option<String>,
    /// The first `x-amz-request-payer`'s value (a presigned URL's form of the header). The
    /// name stays in `other` too: it is a header hoisted into the query, which only a cached
    /// read with `upstream_requester_pays` may set aside.
    pub request_payer: Option<String>,
    /// `response-*` overrides, as (response header name, value).
    pub overrides: Vec<(&'static str, String)>,
    /// Any other parameter: a sub-resource (`acl`, `tagging`, `attributes`, ...), which is not a
    /// plain GetObject.
    pub other: Vec<String>,
}

/// The query form of `x-amz-request-payer`.
pub const REQUEST_PAYER: &str = "x-amz-request-payer";

const OVERRIDES: &[(&str, &str)] = &[
    ("response-content-type", "content-type"),
    ("response-content-language", "content-language"),
    ("response-expires", "expires"),
    ("response-cache-control", "cache-control"),
    ("response-content-disposition", "content-disposition"),
    ("response-content-encoding", "content-encoding"),
];

impl ObjectQuery {
    /// Parse a raw query string.
    pub fn parse(query: Option<&str>) -> Self {
        Self::of(&Query::parse(query))
    }

    /// The parameters of an already parsed query.
    pub fn of(query: &Query<'_>) -> Self {
        let mut q = ObjectQuery::default();
        for (name, value) in query.iter() {
            match name {
                // Named twice, the request is left to S3 to read (it passes through as
                // signed): the cache would act on one value, and a part's layout learnt from
                // S3's answer must be the part S3 read.
                "versionId" | "partNumber" if q.taken(name).is_some() => {
                    q.other.push(name.to_owned())
                }
                "versionId" => q.version_id = Some(value.to_owned()),
                "partNumber" => q.part_number = Some(value.to_owned()),
                // Added by the AWS SDKs for routing; not a sub-resource.
                "x-id" => {}
                // A presigned URL's own signature. Any other `x-amz-*` parameter is a header
                // hoisted into the query (SSE-C, request payer, expected owner...): it changes
                // what S3 answers, so such a request is not a plain GetObject.
                "X-Amz-Algorithm"
                | "X-Amz-Credential"
                | "X-Amz-Date"
                | "X-Amz-Expires"
                | "X-Amz-SignedHeaders"
                | "X-Amz-Signature"
                | "X-Amz-Security-Token" => {}
                // A SigV2 presigned URL's signature.
                "AWSAccessKeyId" | "Signature" | "Expires" => {}
                n => match OVERRIDES.iter().find(|(p, _)| *p == n) {
                    Some((_, header)) => q.overrides.push((header, value.to_owned())),
                    None => {
                        if n == REQUEST_PAYER && q.request_payer.is_none() {
                            q.request_payer = Some(value.to_owned());
                        }
                        q.other.push(n.to_owned())
                    }
                },
            }
        }
        q
    }

    /// The value of `versionId` or `partNumber` already taken.
    fn taken(&self, name: &str) -> Option<&str> {
        match name {
            "versionId" => self.version_id.as_deref(),
            _ => self.part_number.as_deref(),
        }
    }

    /// The part a `partNumber` read asks for, as S3 reads it: 1 to 10,000, in plain digits
    /// (no sign, no leading zero, so the number the cache acts on is the one S3 read).
    /// `None` without one, or for any other spelling, which S3 is left to answer.
    pub fn part(&self) -> Option<PartNumber> {
        PartNumber::parse(self.part_number.as_deref()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(b: &str, k: &str) -> Target {
        Target::Object {
            bucket: b.into(),
            key: k.into(),
        }
    }

    #[test]
    fn path_style() {
        assert_eq!(target(None, "/", None), Ok(Target::Service));
        assert_eq!(target(None, "/bkt", None), Ok(Target::Bucket("bkt".into())));
        assert_eq!(
            target(None, "/bkt/", None),
            Ok(Target::Bucket("bkt".into()))
        );
        assert_eq!(
            target(None, "/bkt/a/b.txt", None),
            Ok(obj("bkt", "a/b.txt"))
        );
        assert_eq!(
            target(None, "/bkt/with%20space+plus", None),
            Ok(obj("bkt", "with space+plus"))
        );
        assert_eq!(
            target(None, "/bkt//double//slash", None),
            Ok(obj("bkt", "/double//slash"))
        );
        assert_eq!(
            target(None, "/bkt/%E2%9C%93%25", None),
            Ok(obj("bkt", "✓%"))
        );
        assert_eq!(
            target(Some("localhost:9000"), "/bkt/k", Some("s3.local")),
            Ok(obj("bkt", "k"))
        );
    }

    #[test]
    fn virtual_hosted_style() {
        let d = Some("s3.local");
        assert_eq!(
            target(Some("bkt.s3.local:9000"), "/a/b", d),
            Ok(obj("bkt", "a/b"))
        );
        assert_eq!(
            target(Some("my.dotted.bkt.s3.local"), "/k", d),
            Ok(obj("my.dotted.bkt", "k"))
        );
        assert_eq!(
            target(Some("bkt.s3.local"), "/", d),
            Ok(Target::Bucket("bkt".into()))
        );
        assert_eq!(target(Some("s3.local"), "/bkt/k", d), Ok(obj("bkt", "k")));
    }

    #[test]
    fn bad_input() {
        assert_eq!(target(None, "/bkt/%zz", None), Err(S3Error::InvalidUri));
        assert_eq!(target(None, "/bkt/%", None), Err(S3Error::InvalidUri));
        assert_eq!(target(None, "/bkt/%ff%fe", None), Err(S3Error::InvalidUri));
        assert_eq!(target(None, "/b/k", None), Err(S3Error::InvalidBucketName));
        assert_eq!(
            target(None, "/-bkt/k", None),
            Err(S3Error::InvalidBucketName)
        );
        assert_eq!(
            target(None, "/bk!t/k", None),
            Err(S3Error::InvalidBucketName)
        );
        let long = format!("/bkt/{}", "a".repeat(1025));
        assert_eq!(target(None, &long, None), Err(S3Error::KeyTooLong));
        let max = format!("/bkt/{}", "a".repeat(1024));
        assert!(target(None, &max, None).is_ok());
    }

    #[test]
    fn query() {
        let q = ObjectQuery::parse(Some(
            "versionId=v%201&x-id=GetObject&response-content-type=text%2Fplain&X-Amz-Date=1",
        ));
        assert_eq!(q.version_id.as_deref(), Some("v 1"));
        assert_eq!(q.overrides, vec![("content-type", "text/plain".to_owned())]);
        assert!(q.other.is_empty());
        let q = ObjectQuery::parse(Some("tagging"));
        assert_eq!(q.other, vec!["tagging".to_owned()]);
        let q = ObjectQuery::parse(Some("x-amz-request-payer=requester"));
        assert_eq!(q.other, vec!["x-amz-request-payer".to_owned()]);
        assert_eq!(q.request_payer.as_deref(), Some("requester"));
        // Named twice: both names stay, and the first value is the one kept.
        let q = ObjectQuery::parse(Some("x-amz-request-payer=a&x-amz-request-payer=requester"));
        assert_eq!(q.other.len(), 2);
        assert_eq!(q.request_payer.as_deref(), Some("a"));
    }

    #[test]
    fn a_parameter_the_cache_acts_on_named_twice_is_left_to_s3() {
        for query in ["partNumber=1&partNumber=2", "versionId=a&versionId=b"] {
            let q = ObjectQuery::parse(Some(query));
            assert_eq!(q.other.len(), 1, "{query}");
        }
        let q = ObjectQuery::parse(Some("partNumber=2&versionId=a"));
        assert!(q.other.is_empty());
        assert_eq!(q.part().map(PartNumber::get), Some(2));
    }
}
