//! What travels between replicas besides block bytes: an object's metadata at the head of an
//! open's answer, and errors.
//!
//! An open's body is a 4-byte little-endian length, that many bytes of JSON metadata, then the
//! block's bytes. An error is a non-2xx status with a JSON body saying whether the upstream
//! answered (the asker must pass that answer on, not retry it) or the peer itself failed (the
//! asker falls back to S3).

use std::time::{Duration, UNIX_EPOCH};

use base64::Engine as _;
use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};

use crate::model::{ObjectMeta, UpstreamError};

/// Metadata as it travels, with how long ago the owner had it from the upstream.
#[derive(Debug, Serialize, Deserialize)]
struct WireMeta {
    size: u64,
    etag: String,
    last_modified: Option<(u64, u32)>,
    version_id: Option<String>,
    /// Header names and base64 values (a value need not be UTF-8).
    headers: Vec<(String, String)>,
    /// The object's checksums, as `headers` (absent from a replica that predates them).
    #[serde(default)]
    checksums: Vec<(String, String)>,
    /// Whether `checksums` is all the upstream stores (`ObjectMeta::checksums_known`; `false`
    /// from a replica that predates it, which then costs the asker one HEAD if a client asks
    /// for them).
    #[serde(default)]
    checksums_known: bool,
    age_ms: u64,
}

/// Most bytes of metadata accepted in an open's answer.
pub const MAX_META: usize = 64 * 1024;

/// The frame heading an open's body: `meta` known for `age`.
pub fn encode_meta(meta: &ObjectMeta, age: Duration) -> Bytes {
    let wire = WireMeta {
        size: meta.size,
        etag: meta.etag.to_string(),
        last_modified: meta.last_modified.and_then(|t| {
            let d = t.duration_since(UNIX_EPOCH).ok()?;
            Some((d.as_secs(), d.subsec_nanos()))
        }),
        version_id: meta.version_id.clone(),
        headers: encode_headers(&meta.headers),
        checksums: encode_headers(&meta.checksums),
        checksums_known: meta.checksums_known,
        // Rounded up: an asker must never take metadata for younger than it is (it weighs the
        // age against when it learnt of a change).
        age_ms: u64::try_from(age.as_micros().div_ceil(1000)).unwrap_or(u64::MAX),
    };
    // Plain strings and numbers: serialising cannot fail.
    let json = serde_json::to_vec(&wire).unwrap_or_default();
    let mut out = BytesMut::with_capacity(4 + json.len());
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&json);
    out.freeze()
}

/// Why a metadata frame was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    /// More bytes are needed.
    #[error("incomplete")]
    Incomplete,
    /// The frame cannot be read.
    #[error("bad metadata frame: {0}")]
    Bad(String),
}

/// Take the metadata frame off the front of `buf`, returning the metadata and its age.
pub fn decode_meta(buf: &mut BytesMut) -> Result<(ObjectMeta, Duration), FrameError> {
    if buf.len() < 4 {
        return Err(FrameError::Incomplete);
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len > MAX_META {
        return Err(FrameError::Bad(format!("{len} bytes of metadata")));
    }
    if buf.len() < 4 + len {
        return Err(FrameError::Incomplete);
    }
    buf.advance(4);
    let json = buf.split_to(len);
    let wire: WireMeta =
        serde_json::from_slice(&json).map_err(|e| FrameError::Bad(e.to_string()))?;
    let headers = decode_headers(wire.headers)?;
    let checksums = decode_headers(wire.checksums)?;
    // Checked: `UNIX_EPOCH + secs` panics past what the clock can hold.
    let last_modified = match wire.last_modified {
        Some((s, n)) => Some(
            UNIX_EPOCH
                .checked_add(Duration::new(s, n.min(999_999_999)))
                .ok_or_else(|| FrameError::Bad("last modified".into()))?,
        ),
        None => None,
    };
    let meta = ObjectMeta {
        size: wire.size,
        etag: wire.etag.into(),
        last_modified,
        version_id: wire.version_id,
        headers,
        checksums,
        checksums_known: wire.checksums_known,
        response_headers: Default::default(),
    };
    Ok((meta, Duration::from_millis(wire.age_ms)))
}

/// Headers as they travel: names, and values in base64 (a value need not be UTF-8).
fn encode_headers(headers: &[(HeaderName, HeaderValue)]) -> Vec<(String, String)> {
    let b64 = base64::engine::general_purpose::STANDARD;
    headers
        .iter()
        .map(|(n, v)| (n.as_str().to_owned(), b64.encode(v.as_bytes())))
        .collect()
}

/// [`encode_headers`]'s output read back; a name or value that is not one is refused.
fn decode_headers(
    wire: Vec<(String, String)>,
) -> Result<Vec<(HeaderName, HeaderValue)>, FrameError> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut headers = Vec::with_capacity(wire.len());
    for (name, value) in wire {
        let name =
            HeaderName::from_bytes(name.as_bytes()).map_err(|e| FrameError::Bad(e.to_string()))?;
        let value = b64
            .decode(value)
            .ok()
            .and_then(|v| HeaderValue::from_bytes(&v).ok())
            .ok_or_else(|| FrameError::Bad(format!("header {name}")))?;
        headers.push((name, value));
    }
    Ok(headers)
}

/// An error as it travels.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum WireError {
    /// The upstream answered with an S3 error.
    Service {
        /// HTTP status.
        status: u16,
        /// S3 error code.
        code: String,
        /// Message.
        message: String,
    },
    /// The object's ETag is no longer the one asked for.
    Changed,
    /// The peer could not serve it (upstream unreachable, timed out, broke...): ask S3.
    Unavailable {
        /// What happened.
        message: String,
    },
    /// The request was not understood or not signed.
    Refused {
        /// Why.
        message: String,
    },
}

impl WireError {
    /// The status a peer answers with.
    pub fn status(&self) -> u16 {
        match self {
            WireError::Service { status, .. } => *status,
            WireError::Changed => 412,
            WireError::Unavailable { .. } => 503,
            WireError::Refused { .. } => 400,
        }
    }

    /// The JSON body.
    pub fn body(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The upstream's own answer, which the asker passes on as if it had asked S3 itself; `None`
    /// for the peer's failures, after which the asker asks S3.
    pub fn into_answer(self) -> Option<UpstreamError> {
        match self {
            WireError::Service {
                status,
                code,
                message,
            } => Some(UpstreamError::Service {
                status,
                code,
                message,
            }),
            WireError::Changed => Some(UpstreamError::Changed),
            WireError::Unavailable { .. } | WireError::Refused { .. } => None,
        }
    }
}

impl From<&UpstreamError> for WireError {
    fn from(e: &UpstreamError) -> Self {
        match e {
            UpstreamError::Service {
                status,
                code,
                message,
            } if *status < 500 => WireError::Service {
                status: *status,
                code: code.clone(),
                message: message.clone(),
            },
            UpstreamError::Changed => WireError::Changed,
            other => WireError::Unavailable {
                message: other.to_string(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> std::time::SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn metadata_round_trips_with_its_age_and_leaves_the_body() {
        let meta = ObjectMeta {
            size: 123,
            etag: "\"abc\"".into(),
            last_modified: Some(at(1_700_000_000)),
            version_id: Some("v1".into()),
            headers: vec![
                (
                    HeaderName::from_static("content-type"),
                    HeaderValue::from_static("text/plain"),
                ),
                (
                    HeaderName::from_static("x-amz-meta-raw"),
                    HeaderValue::from_bytes(b"\xe9t\xe9").unwrap(),
                ),
            ],
            checksums: vec![(
                HeaderName::from_static("x-amz-checksum-crc32"),
                HeaderValue::from_static("IKoeIg=="),
            )],
            checksums_known: true,
            response_headers: Default::default(),
        };
        let mut buf = BytesMut::from(&encode_meta(&meta, Duration::from_millis(1500))[..]);
        buf.extend_from_slice(b"block bytes");
        let mut partial = BytesMut::from(&buf[..buf.len() - 20]);
        assert_eq!(
            decode_meta(&mut partial).unwrap_err(),
            FrameError::Incomplete
        );
        let (back, age) = decode_meta(&mut buf).unwrap();
        assert_eq!(back, meta);
        assert_eq!(age, Duration::from_millis(1500));
        assert_eq!(&buf[..], b"block bytes");
        // A replica that predates checksums sends none: read as none, the rest as sent.
        let mut older: serde_json::Value =
            serde_json::from_slice(&encode_meta(&meta, Duration::ZERO)[4..]).unwrap();
        older.as_object_mut().unwrap().remove("checksums").unwrap();
        older
            .as_object_mut()
            .unwrap()
            .remove("checksums_known")
            .unwrap();
        let json = serde_json::to_vec(&older).unwrap();
        let mut frame = BytesMut::from(&(json.len() as u32).to_le_bytes()[..]);
        frame.extend_from_slice(&json);
        let (back, _) = decode_meta(&mut frame).unwrap();
        assert!(back.checksums.is_empty());
        // Nor does it say they are all there are: a client asking costs the asker a HEAD.
        assert!(!back.checksums_known);
        assert_eq!(back.headers, meta.headers);
        // A part of a millisecond counts as one: never younger than it is.
        let mut buf = BytesMut::from(&encode_meta(&meta, Duration::from_micros(1_500_001))[..]);
        assert_eq!(
            decode_meta(&mut buf).unwrap().1,
            Duration::from_millis(1501)
        );
    }

    #[test]
    fn oversized_or_garbled_frames_are_refused() {
        let mut huge = BytesMut::from(&((MAX_META as u32) + 1).to_le_bytes()[..]);
        assert!(matches!(decode_meta(&mut huge), Err(FrameError::Bad(_))));
        let mut garbled = BytesMut::from(&3u32.to_le_bytes()[..]);
        garbled.extend_from_slice(b"{x}");
        assert!(matches!(decode_meta(&mut garbled), Err(FrameError::Bad(_))));
        // A time past what the clock can hold is refused, not a panic.
        let meta = ObjectMeta {
            size: 1,
            etag: "\"e\"".into(),
            last_modified: Some(at(1_700_000_000)),
            version_id: None,
            headers: vec![],
            checksums: vec![],
            checksums_known: false,
            response_headers: Default::default(),
        };
        let json = String::from_utf8(encode_meta(&meta, Duration::ZERO)[4..].to_vec()).unwrap();
        let json = json.replace("1700000000", &u64::MAX.to_string());
        assert!(json.contains(&u64::MAX.to_string()), "{json}");
        let mut far = BytesMut::from(&(json.len() as u32).to_le_bytes()[..]);
        far.extend_from_slice(json.as_bytes());
        assert!(matches!(decode_meta(&mut far), Err(FrameError::Bad(_))));
    }

    #[test]
    fn upstream_answers_pass_on_and_peer_failures_fall_back() {
        let not_found = UpstreamError::Service {
            status: 404,
            code: "NoSuchKey".into(),
            message: "gone".into(),
        };
        let wire = WireError::from(&not_found);
        assert_eq!(wire.status(), 404);
        let back: WireError = serde_json::from_slice(&wire.body()).unwrap();
        assert_eq!(back.into_answer(), Some(not_found));
        assert_eq!(
            WireError::from(&UpstreamError::Changed).into_answer(),
            Some(UpstreamError::Changed)
        );
        let outage = UpstreamError::Service {
            status: 503,
            code: "SlowDown".into(),
            message: String::new(),
        };
        for e in [
            outage,
            UpstreamError::Timeout("t".into()),
            UpstreamError::Abandoned,
        ] {
            let wire = WireError::from(&e);
            assert_eq!(wire.status(), 503);
            assert_eq!(wire.into_answer(), None, "{e}");
        }
    }
}
