//! `x-amz-copy-source` (CopyObject, UploadPartCopy): which object a write reads from.
//!
//! The source is both authorised (the key's policy must allow its bucket) and forwarded (the
//! upstream reads it), so the two must be the same thing. The header is parsed strictly here,
//! once: percent-decoded whole, then split into a valid bucket name and a key, and what goes
//! upstream is this parse re-encoded ([`CopySource::header_value`]), never the client's text, so
//! no spelling (a scheme, `%2F` in the bucket, dot segments, non-ASCII) can make the upstream
//! read another bucket than the one checked.

use percent_encoding::percent_decode;

use super::request::{encode_path, validate_bucket};
use super::S3Error;

/// A parsed `x-amz-copy-source`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopySource {
    /// The source bucket.
    pub bucket: String,
    /// The source key, decoded.
    pub key: String,
    /// The source version, if one is named.
    pub version_id: Option<String>,
}

fn invalid(what: &str) -> S3Error {
    S3Error::InvalidArgument(format!("Invalid copy source {what}"))
}

impl CopySource {
    /// Parse the header's raw bytes: `[/]bucket/key[?versionId=id]`, URL-encoded.
    pub fn parse(raw: &[u8]) -> Result<Self, S3Error> {
        if raw.iter().any(|b| !(0x21..0x7f).contains(b)) {
            return Err(invalid("encoding: it must be URL-encoded ASCII"));
        }
        // Visible ASCII only, checked above.
        let raw = std::str::from_utf8(raw).map_err(|_| invalid("encoding"))?;
        let (path, query) = match raw.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (raw, None),
        };
        let mut version_id = None;
        if let Some(query) = query {
            for (name, value) in form_urlencoded::parse(query.as_bytes()) {
                match name.as_ref() {
                    "versionId" if version_id.is_none() && !value.is_empty() => {
                        version_id = Some(value.into_owned())
                    }
                    _ => return Err(invalid("query: only versionId may follow the key")),
                }
            }
        }
        let decoded = percent_decode(path.as_bytes())
            .decode_utf8()
            .map_err(|_| invalid("encoding: the key is not UTF-8"))?;
        let decoded = decoded.strip_prefix('/').unwrap_or(&decoded);
        let (bucket, key) = decoded
            .split_once('/')
            .ok_or_else(|| invalid("format: it must be bucket/key"))?;
        validate_bucket(bucket).map_err(|_| invalid("bucket name"))?;
        if key.is_empty() || key.len() > super::request::MAX_KEY_LEN {
            return Err(invalid("object key"));
        }
        // S3 takes a key literally, but many S3-compatible servers and HTTP layers resolve
        // `.` and `..` segments, which could move the read into another bucket.
        if key
            .split('/')
            .any(|segment| segment == "." || segment == "..")
        {
            return Err(invalid("object key: it may not contain . or .. segments"));
        }
        Ok(Self {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            version_id,
        })
    }

    /// The header value to send upstream: this source, encoded unambiguously.
    pub fn header_value(&self) -> String {
        let mut out = format!(
            "/{}/{}",
            encode_path(self.bucket.as_bytes()),
            encode_path(self.key.as_bytes())
        );
        if let Some(v) = &self.version_id {
            out.push_str("?versionId=");
            out.extend(form_urlencoded::byte_serialize(v.as_bytes()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<CopySource, S3Error> {
        CopySource::parse(s.as_bytes())
    }

    #[test]
    fn the_forms_clients_send_parse_to_one_meaning() {
        for raw in ["logs-a/k%20x", "/logs-a/k%20x", "%2Flogs-a%2Fk%20x"] {
            let s = parse(raw).unwrap();
            assert_eq!(
                (s.bucket.as_str(), s.key.as_str()),
                ("logs-a", "k x"),
                "{raw}"
            );
            assert_eq!(s.header_value(), "/logs-a/k%20x");
        }
        let s = parse("b-1/dir/a%3Fb?versionId=v%2B1").unwrap();
        assert_eq!(s.key, "dir/a?b");
        assert_eq!(s.version_id.as_deref(), Some("v+1"));
        assert_eq!(s.header_value(), "/b-1/dir/a%3Fb?versionId=v%2B1");
    }

    #[test]
    fn spellings_that_name_another_bucket_are_refused() {
        for raw in [
            "logs-x:///secret/payroll.csv",
            "logs-a%2F..%2Fsecret/payroll.csv",
            "logs-a/../secret/payroll.csv",
            "logs-a/./k",
            "logs-a",
            "/logs-a/",
            "logs-a/k?versionId=1&x=2",
            "logs-a/k?acl",
            "http://secret/payroll.csv",
        ] {
            assert_eq!(parse(raw).unwrap_err().code(), "InvalidArgument", "{raw}");
        }
        assert!(CopySource::parse(b"logs-a/\xff").is_err());
        assert!(CopySource::parse(b"logs-a/k x").is_err());
    }
}
