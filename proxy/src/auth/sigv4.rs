//! AWS Signature Version 4 verification, header form and presigned URLs.
//!
//! The canonical request and signature are computed by `aws-sigv4`, the AWS SDK's own signer,
//! fed the request exactly as the client signed it: its method, path, query, the headers named
//! in `SignedHeaders`, its payload hash, date and credential scope. Verifying is then signing
//! again with the key's secret and comparing in constant time. Chunk and trailer signatures of
//! streamed uploads use the SDK's key derivation and HMAC ([`ChunkSigner`]).

use std::borrow::Cow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    sign, PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest,
    SignatureLocation, SigningSettings, UriPathNormalizationMode,
};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use http::request::Parts;
use subtle::ConstantTimeEq;

use super::keys::{Key, KeyStore};
use super::signed::Signed;
use crate::s3::request::PRESIGNED_PARAMS;
use crate::s3::S3Error;

/// How far a request's date may be from Larder's clock, as S3 allows.
pub const MAX_SKEW: Duration = Duration::from_secs(15 * 60);
/// Longest validity of a presigned URL, as S3 allows (7 days).
pub const MAX_PRESIGNED_EXPIRY: u64 = 7 * 24 * 3600;
const ALGORITHM: &str = "AWS4-HMAC-SHA256";
const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// How the request's body is protected.
#[derive(Debug, Clone)]
pub enum Payload {
    /// Not signed: `UNSIGNED-PAYLOAD`, or a presigned URL.
    Unsigned,
    /// The body's SHA-256 (lowercase hex) as signed; the upstream checks the body against it.
    Sha256(String),
    /// `aws-chunked` with a signature per chunk (`STREAMING-AWS4-HMAC-SHA256-PAYLOAD[-TRAILER]`).
    /// `signer` is `None` when authentication is off: the framing is still removed.
    SignedChunks {
        /// Whether signed trailing headers follow the last chunk.
        trailer: bool,
        /// Verifies each chunk against the chain started by the request's signature.
        signer: Option<ChunkSigner>,
    },
    /// `aws-chunked` without signatures, with trailing checksum headers
    /// (`STREAMING-UNSIGNED-PAYLOAD-TRAILER`).
    UnsignedTrailer,
}

/// A request whose signature verified.
#[derive(Debug)]
pub struct Verified {
    /// The client's access key id.
    pub access_key: String,
    /// The key's entry.
    pub key: Key,
    /// How the body is protected.
    pub payload: Payload,
    /// The headers the signature covers.
    pub signed: Signed,
}

/// Verifies the signatures of an `aws-chunked` body: each chunk's signature chains from the
/// previous one, starting at the request's own signature.
#[derive(Clone)]
pub struct ChunkSigner {
    signing_key: Vec<u8>,
    date_time: String,
    scope: String,
    previous: String,
}

impl std::fmt::Debug for ChunkSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkSigner")
            .field("scope", &self.scope)
            .finish()
    }
}

impl ChunkSigner {
    /// Check the signature of a chunk whose SHA-256 is `chunk_sha256` (hex).
    pub fn verify_chunk(&mut self, chunk_sha256: &str, signature: &str) -> bool {
        let to_sign = format!(
            "AWS4-HMAC-SHA256-PAYLOAD\n{}\n{}\n{}\n{EMPTY_SHA256}\n{chunk_sha256}",
            self.date_time, self.scope, self.previous
        );
        self.check(&to_sign, signature)
    }

    /// Check the signature of the trailing headers, given the SHA-256 (hex) of their canonical
    /// form (`name:value\n` each, sorted).
    pub fn verify_trailer(&mut self, trailer_sha256: &str, signature: &str) -> bool {
        let to_sign = format!(
            "AWS4-HMAC-SHA256-TRAILER\n{}\n{}\n{}\n{trailer_sha256}",
            self.date_time, self.scope, self.previous
        );
        self.check(&to_sign, signature)
    }

    fn check(&mut self, to_sign: &str, signature: &str) -> bool {
        let expected = v4::calculate_signature(&self.signing_key, to_sign.as_bytes());
        let ok = equal(&expected, signature);
        self.previous = expected;
        ok
    }
}

fn equal(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// Verify the request's signature against `keys`; `now` is Larder's clock.
pub fn verify(parts: &Parts, keys: &KeyStore, now: SystemTime) -> Result<Verified, S3Error> {
    if let Some(auth) = parts.headers.get(http::header::AUTHORIZATION) {
        let auth = auth
            .to_str()
            .map_err(|_| malformed("the Authorization header is not ASCII"))?;
        return verify_header(parts, auth, keys, now);
    }
    let query = parts.uri.query().unwrap_or("");
    let presigned = form_urlencoded::parse(query.as_bytes())
        .any(|(k, _)| k == "X-Amz-Signature" || k == "X-Amz-Credential");
    if presigned {
        return verify_presigned(parts, query, keys, now);
    }
    Err(S3Error::AccessDenied(
        "Access Denied: anonymous requests are not accepted; sign with an access key Larder knows"
            .into(),
    ))
}

/// What a body's `x-amz-content-sha256` says about it, when signatures are not checked.
pub fn payload_of(parts: &Parts) -> Result<Payload, S3Error> {
    match parts.headers.get("x-amz-content-sha256") {
        None => Ok(Payload::Unsigned),
        Some(v) => parse_payload(v.to_str().unwrap_or(""), None),
    }
}

fn malformed(message: &str) -> S3Error {
    S3Error::AuthorizationHeaderMalformed(format!(
        "The authorization header is malformed; {message}."
    ))
}

fn query_error(message: &str) -> S3Error {
    S3Error::AuthorizationQueryParametersError(message.to_owned())
}

/// The parts of a credential scope: `AKID/20261122/us-east-1/s3/aws4_request`.
pub(crate) struct Credential<'a> {
    pub(crate) access_key: &'a str,
    pub(crate) date: &'a str,
    pub(crate) region: &'a str,
}

pub(crate) fn parse_credential(value: &str) -> Option<Credential<'_>> {
    let mut parts = value.rsplitn(5, '/');
    let terminator = parts.next()?;
    let service = parts.next()?;
    let region = parts.next()?;
    let date = parts.next()?;
    let access_key = parts.next()?;
    (terminator == "aws4_request"
        && service == "s3"
        && date.len() == 8
        && !region.is_empty()
        && !access_key.is_empty())
    .then_some(Credential {
        access_key,
        date,
        region,
    })
}

/// Parse `YYYYMMDDTHHMMSSZ`.
pub fn parse_amz_date(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = s.get(r)?;
        part.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    let (y, mo, d) = (num(0..4)?, num(4..6)?, num(6..8)?);
    let (h, mi, sec) = (num(9..11)?, num(11..13)?, num(13..15)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + mi * 60 + sec;
    u64::try_from(secs)
        .ok()
        .map(|s| UNIX_EPOCH + Duration::from_secs(s))
}

fn skew(a: SystemTime, b: SystemTime) -> Duration {
    a.duration_since(b)
        .or_else(|_| b.duration_since(a))
        .unwrap_or_default()
}

fn parse_payload(value: &str, signer: Option<ChunkSigner>) -> Result<Payload, S3Error> {
    Ok(match value {
        "UNSIGNED-PAYLOAD" => Payload::Unsigned,
        "STREAMING-UNSIGNED-PAYLOAD-TRAILER" => Payload::UnsignedTrailer,
        "STREAMING-AWS4-HMAC-SHA256-PAYLOAD" => Payload::SignedChunks {
            trailer: false,
            signer,
        },
        "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER" => Payload::SignedChunks {
            trailer: true,
            signer,
        },
        v if v.len() == 64 && v.bytes().all(|c| c.is_ascii_hexdigit()) => {
            Payload::Sha256(v.to_ascii_lowercase())
        }
        _ => {
            return Err(S3Error::InvalidArgument(
                "x-amz-content-sha256 must be UNSIGNED-PAYLOAD, a STREAMING- value, or a SHA-256 in hex"
                    .into(),
            ))
        }
    })
}

fn verify_header(
    parts: &Parts,
    auth: &str,
    keys: &KeyStore,
    now: SystemTime,
) -> Result<Verified, S3Error> {
    let Some(fields) = auth
        .strip_prefix(ALGORITHM)
        .and_then(|r| r.strip_prefix(' '))
    else {
        return Err(if auth.starts_with("AWS ") {
            S3Error::AccessDenied(
                "Larder accepts AWS Signature Version 4 (and Version 2 only in presigned URLs)"
                    .into(),
            )
        } else {
            malformed("the algorithm must be AWS4-HMAC-SHA256")
        });
    };
    let (mut credential, mut signed_headers, mut signature) = (None, None, None);
    for field in fields.split(',') {
        let (name, value) = field
            .trim()
            .split_once('=')
            .ok_or_else(|| malformed("expected Credential=, SignedHeaders= and Signature="))?;
        let slot = match name {
            "Credential" => &mut credential,
            "SignedHeaders" => &mut signed_headers,
            "Signature" => &mut signature,
            _ => return Err(malformed("unknown field")),
        };
        if slot.replace(value).is_some() {
            return Err(malformed("a field appears twice"));
        }
    }
    let (Some(credential), Some(signed_headers), Some(signature)) =
        (credential, signed_headers, signature)
    else {
        return Err(malformed(
            "expected Credential=, SignedHeaders= and Signature=",
        ));
    };
    let credential = parse_credential(credential).ok_or_else(|| {
        malformed("the Credential must be <key>/<yyyymmdd>/<region>/s3/aws4_request")
    })?;
    let key = keys
        .get(credential.access_key)
        .ok_or(S3Error::InvalidAccessKeyId)?;
    let date_value = parts
        .headers
        .get("x-amz-date")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| {
            S3Error::AccessDenied("AWS authentication requires a valid x-amz-date header".into())
        })?;
    let time = parse_amz_date(date_value).ok_or_else(|| {
        S3Error::AccessDenied("AWS authentication requires a valid x-amz-date header".into())
    })?;
    if !date_value.starts_with(credential.date) {
        return Err(malformed(
            "the Credential date does not match the x-amz-date header",
        ));
    }
    if skew(now, time) > MAX_SKEW {
        return Err(S3Error::RequestTimeTooSkewed);
    }
    let names: Vec<&str> = signed_headers.split(';').collect();
    if !names.contains(&"host") {
        return Err(malformed("SignedHeaders must include host"));
    }
    let hash = parts
        .headers
        .get("x-amz-content-sha256")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| {
            S3Error::InvalidRequest(
                "Missing required header for this request: x-amz-content-sha256".into(),
            )
        })?;
    let mut payload = parse_payload(hash, None)?;
    let headers = signed_header_values(parts, &names)?;
    let settings = settings(SignatureLocation::Headers, None);
    let expected = candidate_paths(parts.uri.path())
        .into_iter()
        .map(|path| {
            let uri = match parts.uri.query() {
                Some(q) => format!("{path}?{q}"),
                None => path.into_owned(),
            };
            signature_for(
                parts.method.as_str(),
                &uri,
                &headers,
                hash,
                key,
                &credential,
                time,
                settings.clone(),
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    if !expected.iter().any(|e| equal(e, signature)) {
        return Err(S3Error::SignatureDoesNotMatch);
    }
    if let Payload::SignedChunks { signer, .. } = &mut payload {
        let signing_key = v4::generate_signing_key(&key.secret, time, credential.region, "s3");
        *signer = Some(ChunkSigner {
            signing_key: signing_key.as_ref().to_vec(),
            date_time: date_value.to_owned(),
            scope: format!("{}/{}/s3/aws4_request", credential.date, credential.region),
            previous: signature.to_owned(),
        });
    }
    Ok(Verified {
        access_key: credential.access_key.to_owned(),
        key: key.clone(),
        payload,
        signed: Signed::from_names(names),
    })
}

fn verify_presigned(
    parts: &Parts,
    query: &str,
    keys: &KeyStore,
    now: SystemTime,
) -> Result<Verified, S3Error> {
    let mut values: [Option<String>; 6] = Default::default();
    let mut rest = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let raw_name = pair.split('=').next().unwrap_or("");
        let name: String = form_urlencoded::parse(raw_name.as_bytes())
            .next()
            .map(|(k, _)| k.into_owned())
            .unwrap_or_default();
        match PRESIGNED_PARAMS.iter().position(|p| *p == name) {
            Some(i) => {
                let value = form_urlencoded::parse(pair.as_bytes())
                    .next()
                    .map(|(_, v)| v.into_owned())
                    .unwrap_or_default();
                if values[i].replace(value).is_some() {
                    return Err(query_error("a presigned URL parameter appears twice"));
                }
            }
            None => rest.push(pair),
        }
    }
    let [Some(algorithm), Some(credential), Some(date), Some(expires), Some(signed_headers), Some(signature)] =
        values
    else {
        return Err(query_error(
            "Query-string authentication version 4 requires the X-Amz-Algorithm, X-Amz-Credential, X-Amz-Signature, X-Amz-Date, X-Amz-SignedHeaders, and X-Amz-Expires parameters.",
        ));
    };
    if algorithm != ALGORITHM {
        return Err(query_error(
            "X-Amz-Algorithm only supports \"AWS4-HMAC-SHA256\"",
        ));
    }
    let credential = parse_credential(&credential).ok_or_else(|| {
        query_error("X-Amz-Credential must be <key>/<yyyymmdd>/<region>/s3/aws4_request")
    })?;
    let time = parse_amz_date(&date)
        .filter(|_| date.starts_with(credential.date))
        .ok_or_else(|| {
            query_error("X-Amz-Date must be in ISO8601 basic form and match the credential date")
        })?;
    let expires: u64 = expires
        .parse()
        .ok()
        .filter(|e| *e <= MAX_PRESIGNED_EXPIRY)
        .ok_or_else(|| {
            query_error("X-Amz-Expires must be a whole number of seconds from 0 to 604800")
        })?;
    let key = keys
        .get(credential.access_key)
        .ok_or(S3Error::InvalidAccessKeyId)?;
    if time > now + MAX_SKEW {
        return Err(S3Error::AccessDenied("Request is not valid yet".into()));
    }
    // A URL valid for 0 seconds has expired as it was made (S3 answers 403, not 400).
    if expires == 0 || now > time + Duration::from_secs(expires) {
        return Err(S3Error::AccessDenied("Request has expired".into()));
    }
    let names: Vec<&str> = signed_headers.split(';').collect();
    if !names.contains(&"host") {
        return Err(query_error("X-Amz-SignedHeaders must include host"));
    }
    let headers = signed_header_values(parts, &names)?;
    let rest = rest.join("&");
    let settings = settings(
        SignatureLocation::QueryParams,
        Some(Duration::from_secs(expires)),
    );
    let expected = candidate_paths(parts.uri.path())
        .into_iter()
        .map(|path| {
            let uri = if rest.is_empty() {
                path.into_owned()
            } else {
                format!("{path}?{rest}")
            };
            signature_for(
                parts.method.as_str(),
                &uri,
                &headers,
                "UNSIGNED-PAYLOAD",
                key,
                &credential,
                time,
                settings.clone(),
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    if !expected.iter().any(|e| equal(e, &signature)) {
        return Err(S3Error::SignatureDoesNotMatch);
    }
    Ok(Verified {
        access_key: credential.access_key.to_owned(),
        key: key.clone(),
        payload: Payload::Unsigned,
        signed: Signed::from_names(names),
    })
}

/// The values of the signed headers, as the client sent them. `host` may come from the URI
/// (HTTP/2 `:authority`).
fn signed_header_values(parts: &Parts, names: &[&str]) -> Result<Vec<(String, String)>, S3Error> {
    let mut out = Vec::with_capacity(names.len());
    for &name in names {
        if name.is_empty() || name.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(malformed("SignedHeaders must be lowercase header names"));
        }
        let mut found = false;
        for value in parts.headers.get_all(name) {
            let value = value.to_str().map_err(|_| S3Error::SignatureDoesNotMatch)?;
            out.push((name.to_owned(), value.to_owned()));
            found = true;
        }
        if !found && name == "host" {
            if let Some(authority) = parts.uri.authority() {
                out.push((name.to_owned(), authority.as_str().to_owned()));
                found = true;
            }
        }
        if !found {
            // A signed header that is not there cannot match.
            return Err(S3Error::SignatureDoesNotMatch);
        }
    }
    Ok(out)
}

/// The path as sent, and as S3 canonicalises it (decoded, then each byte but the unreserved
/// ones and `/` percent-encoded), when the two differ. Clients sign the latter; most send it too.
fn candidate_paths(raw: &str) -> Vec<Cow<'_, str>> {
    let mut out = vec![Cow::Borrowed(raw)];
    let decoded = percent_encoding::percent_decode_str(raw).collect::<Vec<u8>>();
    let canonical = crate::s3::request::encode_path(&decoded);
    if canonical != raw {
        out.push(Cow::Owned(canonical));
    }
    out
}

fn settings(location: SignatureLocation, expires_in: Option<Duration>) -> SigningSettings {
    let mut s = SigningSettings::default();
    s.percent_encoding_mode = PercentEncodingMode::Single;
    s.payload_checksum_kind = PayloadChecksumKind::NoHeader;
    s.signature_location = location;
    s.expires_in = expires_in;
    // Sign exactly the headers the client named, including any the SDK would leave out.
    s.excluded_headers = Some(Vec::new());
    s.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
    s
}

#[allow(clippy::too_many_arguments)]
fn signature_for(
    method: &str,
    uri: &str,
    headers: &[(String, String)],
    payload_hash: &str,
    key: &Key,
    credential: &Credential<'_>,
    time: SystemTime,
    settings: SigningSettings,
) -> Result<String, S3Error> {
    let identity: Identity = Credentials::new(
        credential.access_key,
        &key.secret,
        None,
        None,
        "larder-client",
    )
    .into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(credential.region)
        .name("s3")
        .time(time)
        .settings(settings)
        .build()
        .map_err(|_| S3Error::InternalError)?
        .into();
    let request = SignableRequest::new(
        method,
        uri,
        headers.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        SignableBody::Precomputed(payload_hash.to_owned()),
    )
    .map_err(|_| S3Error::SignatureDoesNotMatch)?;
    let output = sign(request, &params).map_err(|_| S3Error::SignatureDoesNotMatch)?;
    Ok(output.signature().to_owned())
}

#[cfg(test)]
mod tests;
