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

use sha2::{Digest, Sha256};

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
        Self {
            method,
            query,
            headers,
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
        for (i, header) in self.headers.iter().enumerate() {
            if i > 0 {
                out.put(b";");
            }
            out.put(header.name.as_bytes());
        }
        out.put(b"\n");
        out.put(self.payload_hash.as_bytes());
    }

    /// SHA-256 of the canonical request for `path`, in lowercase hex.
    pub(super) fn hash(&self, path: &str) -> [u8; 64] {
        let mut hasher = Gathered {
            hasher: Sha256::new(),
            buf: [0; GATHERED],
            len: 0,
        };
        self.write(path, &mut hasher);
        hasher.flush();
        let mut hex = [0u8; 64];
        hex::encode_to_slice(hasher.hasher.finalize(), &mut hex)
            .expect("64 hex digits for 32 bytes");
        hex
    }
}

/// How many bytes of a canonical request are gathered before they are hashed.
const GATHERED: usize = 1024;

/// A hasher fed through a buffer on the stack: a canonical request is written in dozens of
/// pieces of a few bytes, and each `Sha256::update` costs more than copying them (in a
/// profile of small hits, the writes into the hasher took as long as its compressions).
struct Gathered {
    hasher: Sha256,
    buf: [u8; GATHERED],
    len: usize,
}

impl Gathered {
    fn flush(&mut self) {
        self.hasher.update(&self.buf[..self.len]);
        self.len = 0;
    }
}

impl Sink for Gathered {
    fn put(&mut self, bytes: &[u8]) {
        if self.len + bytes.len() > GATHERED {
            self.flush();
            if bytes.len() > GATHERED {
                self.hasher.update(bytes);
                return;
            }
        }
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }
}

/// Where a canonical request is written: a hasher, or a buffer in tests.
pub(super) trait Sink {
    fn put(&mut self, bytes: &[u8]);
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

/// Whether SigV4 percent-encodes `b` in a query name or value: all but the unreserved
/// characters `A-Z a-z 0-9 - . _ ~`.
fn escaped(b: u8) -> bool {
    !(b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'))
}

/// `s` with every byte [`escaped`] as `%XX` (uppercase hex), as `percent_encoding` gives it
/// (a unit test holds the two together), but in one buffer of the right size: that crate's
/// `Cow` grows its `String` chunk by chunk.
fn encode(s: &str) -> Cow<'_, str> {
    let n = s.bytes().filter(|&b| escaped(b)).count();
    if n == 0 {
        return Cow::Borrowed(s);
    }
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = Vec::with_capacity(s.len() + 2 * n);
    for b in s.bytes() {
        if escaped(b) {
            out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        } else {
            out.push(b);
        }
    }
    Cow::Owned(String::from_utf8(out).expect("ASCII"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SigV4's set for `percent_encoding`: all but the unreserved characters.
    const QUERY: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~');

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
    fn a_gathered_hash_is_the_hash_of_every_piece_in_order() {
        // Pieces that fill the buffer exactly, cross it, and exceed it.
        let pieces: Vec<Vec<u8>> = [0usize, 1, 1000, 23, 1024, 2500, 1, 1023, 1, 0]
            .iter()
            .enumerate()
            .map(|(i, &n)| (0..n).map(|j| (i * 31 + j) as u8).collect())
            .collect();
        let mut gathered = Gathered {
            hasher: Sha256::new(),
            buf: [0; GATHERED],
            len: 0,
        };
        for piece in &pieces {
            gathered.put(piece);
        }
        gathered.flush();
        assert_eq!(gathered.hasher.finalize(), Sha256::digest(pieces.concat()),);
    }

    proptest::proptest! {
        /// Any name or value, as `percent_encoding` encodes it with SigV4's set.
        #[test]
        fn names_and_values_encode_as_percent_encoding_does(s in "[a-zA-Z09 ~._%+/=&€é\u{0}-\u{7f}]{0,16}") {
            let theirs: Cow<'_, str> = percent_encoding::utf8_percent_encode(&s, QUERY).into();
            let ours = encode(&s);
            proptest::prop_assert_eq!(&ours, &theirs);
            // Borrowed exactly when nothing is escaped (one allocation otherwise).
            proptest::prop_assert_eq!(matches!(ours, Cow::Borrowed(_)), *ours == *s);
        }
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
