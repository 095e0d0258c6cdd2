//! SigV4's canonical request and string to sign, built from a request exactly as the client
//! sent it, and hashed as it is written: no intermediate string, one allocation for the
//! header list, one for the query's pairs, and one per name or value that encoding changes.
//!
//! Why Larder builds this itself rather than calling `aws-sigv4`'s `sign`: that function also
//! derives the signing key (four HMACs) and builds a `HeaderMap`, a `Uri` and an identity per
//! call, which was most of a small hit's verification cost (docs/benchmarks.md, "SigV4
//! verification"). Its output is still the reference: the tests sign random requests with
//! `aws-sigv4` and check that this module agrees, byte for byte, on every one.
//!
//! The rules (AWS's "Create a canonical request for Signature Version 4"):
//! - the method, then the path as the caller chooses it (see `candidate_paths`);
//! - the query: every parameter decoded, then each name and value percent-encoded (all but
//!   `A-Z a-z 0-9 - . _ ~`), sorted by encoded name then value, `name=value` joined by `&`;
//! - each signed header, sorted by name: `name:value`, its values trimmed, runs of spaces
//!   made one, several values joined by `,`;
//! - the signed header names joined by `;`, then the payload hash.

use std::borrow::Cow;

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use sha2::{Digest, Sha256};

/// Bytes SigV4 percent-encodes in a query name or value: all but the unreserved characters.
const QUERY: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A signed header: its lowercase name and every value the request carries for it, in order.
#[derive(Debug)]
pub(super) struct Header<'a> {
    pub(super) name: &'a str,
    pub(super) values: Vec<&'a str>,
}

/// The parts of a canonical request that do not depend on which path is tried.
#[derive(Debug)]
pub(super) struct Canonical<'a> {
    pub(super) method: &'a str,
    /// Encoded `(name, value)` pairs, sorted; borrowed where encoding changes nothing.
    query: Vec<(Cow<'a, str>, Cow<'a, str>)>,
    /// Sorted by name, each name once.
    headers: Vec<Header<'a>>,
    /// The names of `headers` joined by `;`.
    signed_headers: String,
    pub(super) payload_hash: &'a str,
}

impl<'a> Canonical<'a> {
    /// `query` holds the parameters decoded (as [`crate::s3::query::Query`] gives them);
    /// `headers` must have distinct names, in any order.
    pub(super) fn new(
        method: &'a str,
        query: impl IntoIterator<Item = (&'a str, &'a str)>,
        mut headers: Vec<Header<'a>>,
        payload_hash: &'a str,
    ) -> Self {
        let mut query: Vec<_> = query
            .into_iter()
            .map(|(k, v)| (encode(k), encode(v)))
            .collect();
        query.sort_unstable();
        headers.sort_unstable_by(|a, b| a.name.cmp(b.name));
        let signed_headers = signed_header_names(headers.iter().map(|h| h.name));
        Self {
            method,
            query,
            headers,
            signed_headers,
            payload_hash,
        }
    }

    /// Write the canonical request for `path` into `out`.
    pub(super) fn write(&self, path: &str, out: &mut impl Sink) {
        out.put(self.method.as_bytes());
        out.put(b"\n");
        out.put(path.as_bytes());
        out.put(b"\n");
        for (i, (name, value)) in self.query.iter().enumerate() {
            if i > 0 {
                out.put(b"&");
            }
            out.put(name.as_bytes());
            out.put(b"=");
            out.put(value.as_bytes());
        }
        out.put(b"\n");
        for header in &self.headers {
            out.put(header.name.as_bytes());
            out.put(b":");
            for (i, value) in header.values.iter().enumerate() {
                if i > 0 {
                    out.put(b",");
                }
                // Trimmed, and each run of spaces made one (spaces only, not other white space).
                for (j, word) in value.split(' ').filter(|w| !w.is_empty()).enumerate() {
                    if j > 0 {
                        out.put(b" ");
                    }
                    out.put(word.as_bytes());
                }
            }
            out.put(b"\n");
        }
        out.put(b"\n");
        out.put(self.signed_headers.as_bytes());
        out.put(b"\n");
        out.put(self.payload_hash.as_bytes());
    }

    /// SHA-256 of the canonical request for `path`, in lowercase hex.
    pub(super) fn hash(&self, path: &str) -> [u8; 64] {
        let mut hasher = Sha256::new();
        self.write(path, &mut hasher);
        let mut hex = [0u8; 64];
        hex::encode_to_slice(hasher.finalize(), &mut hex).expect("64 hex digits for 32 bytes");
        hex
    }
}

/// Where a canonical request is written: a hasher, or a buffer in tests.
pub(super) trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for Sha256 {
    fn put(&mut self, bytes: &[u8]) {
        self.update(bytes);
    }
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// The string to sign: `AWS4-HMAC-SHA256`, the request's `YYYYMMDDTHHMMSSZ`, the credential
/// scope and the canonical request's hash, one per line.
pub(super) fn string_to_sign(
    date_time: &str,
    date: &str,
    region: &str,
    canonical_hash: &[u8; 64],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + date_time.len() + region.len() + 64);
    for part in [
        "AWS4-HMAC-SHA256\n",
        date_time,
        "\n",
        date,
        "/",
        region,
        "/s3/aws4_request\n",
    ] {
        out.extend_from_slice(part.as_bytes());
    }
    out.extend_from_slice(canonical_hash);
    out
}

/// Header names joined by `;`.
pub(super) fn signed_header_names<'n>(names: impl Iterator<Item = &'n str>) -> String {
    let mut out = String::new();
    for (i, name) in names.enumerate() {
        if i > 0 {
            out.push(';');
        }
        out.push_str(name);
    }
    out
}

fn encode(s: &str) -> Cow<'_, str> {
    utf8_percent_encode(s, QUERY).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_canonical_request_of_the_aws_example_get() {
        // "GET Object" in AWS's "Signature Calculations for the Authorization Header".
        let headers = vec![
            Header {
                name: "x-amz-date",
                values: vec!["20130524T000000Z"],
            },
            Header {
                name: "host",
                values: vec!["examplebucket.s3.amazonaws.com"],
            },
            Header {
                name: "range",
                values: vec!["  bytes=0-9  "],
            },
            Header {
                name: "x-amz-content-sha256",
                values: vec!["e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"],
            },
        ];
        let hash = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        let canonical = Canonical::new("GET", [], headers, hash);
        let mut text = Vec::new();
        canonical.write("/test.txt", &mut text);
        assert_eq!(
            String::from_utf8(text).unwrap(),
            "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\n\
             x-amz-content-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n\
             x-amz-date:20130524T000000Z\n\nhost;range;x-amz-content-sha256;x-amz-date\n\
             e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            &canonical.hash("/test.txt"),
            b"7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972"
        );
    }

    #[test]
    fn query_parameters_are_decoded_encoded_and_sorted_and_values_normalised() {
        let query = crate::s3::query::Query::parse(Some("b=2&a=x+y%2Fz&a=%41~&flag&&c=%E2%82%AC"));
        let headers = vec![Header {
            name: "x-amz-meta-a",
            values: vec![" one  two ", "three\tfour"],
        }];
        let canonical = Canonical::new("PUT", query.iter(), headers, "UNSIGNED-PAYLOAD");
        let mut text = Vec::new();
        canonical.write("/k", &mut text);
        assert_eq!(
            String::from_utf8(text).unwrap(),
            "PUT\n/k\na=A~&a=x%20y%2Fz&b=2&c=%E2%82%AC&flag=\n\
             x-amz-meta-a:one two,three\tfour\n\nx-amz-meta-a\nUNSIGNED-PAYLOAD"
        );
    }
}
