//! What a client's signature covers, and so what Larder may forward on its behalf.
//!
//! Larder re-signs every forwarded request with its own credentials, so anything it forwards
//! gains the authority of Larder's signature. A header the client did not sign must therefore
//! never reach the upstream with more authority than S3 itself would give it: S3 refuses a
//! request carrying an `x-amz-*` header its signature does not cover (403 AccessDenied, "There
//! were headers present in the request which were not signed"), and Larder does the same. Of the
//! other headers, those S3 accepts unsigned (content type, conditionals, range...) go through as
//! S3 would take them; any other unsigned header is dropped.

use http::{HeaderMap, HeaderName};

use crate::s3::S3Error;

/// Headers S3 acts on without requiring them to be signed: they describe the body or make the
/// request conditional, as a browser or `curl` sends them with a presigned URL.
const UNSIGNED_STANDARD: &[&str] = &[
    "cache-control",
    "content-disposition",
    "content-encoding",
    "content-language",
    "content-length",
    "content-md5",
    "content-type",
    "expires",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-unmodified-since",
    "range",
];

/// The headers a client's signature covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signed {
    /// Authentication is off: nothing is signed and everything the client sent may go (the
    /// operator chose to let anyone use Larder's credentials).
    Unchecked,
    /// These header names (lowercase), as the signature lists them.
    Headers(Vec<HeaderName>),
    /// SigV2: every `x-amz-*` header, `content-md5` and `content-type`.
    AllAmz,
}

impl Signed {
    /// The signed set from SigV4's `SignedHeaders` names.
    pub fn from_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Self {
        Signed::Headers(
            names
                .into_iter()
                .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
                .collect(),
        )
    }

    fn covers(&self, name: &HeaderName) -> bool {
        match self {
            Signed::Unchecked => true,
            Signed::Headers(names) => names.contains(name),
            Signed::AllAmz => is_amz(name) || name == "content-md5" || name == "content-type",
        }
    }

    /// Refuse a request that carries an `x-amz-*` header its signature does not cover, as S3
    /// does.
    pub fn check(&self, headers: &HeaderMap) -> Result<(), S3Error> {
        let unsigned: Vec<&str> = headers
            .keys()
            .filter(|n| is_amz(n) && !self.covers(n))
            .map(HeaderName::as_str)
            .collect();
        if unsigned.is_empty() {
            Ok(())
        } else {
            Err(S3Error::AccessDenied(format!(
                "There were headers present in the request which were not signed: {}",
                unsigned.join(", ")
            )))
        }
    }

    /// The client's headers Larder may forward: those signed, and the standard ones S3 accepts
    /// unsigned. (Connection-level headers and the client's own signature are dropped later by
    /// the forwarder, which replaces them with its own.)
    pub fn forwardable(&self, headers: &HeaderMap) -> HeaderMap {
        let mut out = HeaderMap::with_capacity(headers.len());
        for (name, value) in headers {
            if self.covers(name) || UNSIGNED_STANDARD.contains(&name.as_str()) {
                out.append(name.clone(), value.clone());
            }
        }
        out
    }
}

fn is_amz(name: &HeaderName) -> bool {
    name.as_str().starts_with("x-amz-")
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn an_unsigned_amz_header_is_refused() {
        let h = headers(&[
            ("host", "x"),
            ("x-amz-date", "d"),
            ("x-amz-copy-source", "b/k"),
        ]);
        let signed = Signed::from_names(["host", "x-amz-date"]);
        let e = signed.check(&h).unwrap_err();
        assert_eq!(e.code(), "AccessDenied");
        assert!(e.to_string().contains("x-amz-copy-source"));
        assert!(
            Signed::from_names(["host", "x-amz-date", "x-amz-copy-source"])
                .check(&h)
                .is_ok()
        );
        assert!(Signed::AllAmz.check(&h).is_ok());
        assert!(Signed::Unchecked.check(&h).is_ok());
    }

    #[test]
    fn only_signed_and_standard_headers_are_forwarded() {
        let h = headers(&[
            ("host", "x"),
            ("content-type", "text/plain"),
            ("range", "bytes=0-1"),
            ("x-forwarded-for", "1.2.3.4"),
            ("cookie", "a=b"),
            ("x-custom", "signed"),
        ]);
        let out = Signed::from_names(["host", "x-custom"]).forwardable(&h);
        let names: Vec<&str> = out.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["host", "content-type", "range", "x-custom"]);
        assert_eq!(Signed::Unchecked.forwardable(&h).len(), h.len());
    }
}
