//! AWS Signature Version 4 verification, header form and presigned URLs.
//!
//! The canonical request is built from the request exactly as the client signed it: its method,
//! path, query, the headers named in `SignedHeaders`, its payload hash, date and credential
//! scope ([`canonical`]). Verifying is then signing it again with the key's signing key, derived
//! once per day and region ([`Key::signing_key`]), and comparing in constant time. Chunk and
//! trailer signatures of streamed uploads chain from the request's signature ([`ChunkSigner`]).

mod canonical;

use std::borrow::Cow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::request::Parts;
use subtle::ConstantTimeEq;

use self::canonical::{Canonical, Header};
use super::keys::{Key, KeyStore};
use super::signed::Signed;
use super::signing_key::{hmac, SigningKey};
use crate::s3::headers::names;
use crate::s3::query::Query;
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
    signing_key: SigningKey,
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
        let expected = sign(&self.signing_key, to_sign.as_bytes());
        let ok = equal(&expected, signature.as_bytes());
        self.previous = String::from_utf8_lossy(&expected).into_owned();
        ok
    }
}

/// The signature of `string_to_sign` under `signing_key`, in lowercase hex.
pub(crate) fn sign(signing_key: &SigningKey, string_to_sign: &[u8]) -> [u8; 64] {
    let mut hex = [0u8; 64];
    hex::encode_to_slice(hmac(signing_key, string_to_sign), &mut hex)
        .expect("64 hex digits for 32 bytes");
    hex
}

/// Whether two signatures are equal, in time that does not depend on where they differ.
/// Compared eight bytes at a time: `subtle` fences each comparison from the optimiser, and 64
/// of those (one per hex digit) were a tenth of a microsecond per request.
pub(crate) fn equal(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let word = |c: &[u8]| u64::from_ne_bytes(c.try_into().expect("8 bytes"));
    let (a_words, b_words) = (a.chunks_exact(8), b.chunks_exact(8));
    let same = a_words.remainder().ct_eq(b_words.remainder());
    let same = a_words
        .zip(b_words)
        .fold(same, |same, (x, y)| same & word(x).ct_eq(&word(y)));
    bool::from(same)
}

/// Verify the request's signature against `keys`; `query` is the request's query, parsed;
/// `now` is Larder's clock.
pub fn verify(
    parts: &Parts,
    query: &Query<'_>,
    keys: &KeyStore,
    now: SystemTime,
) -> Result<Verified, S3Error> {
    if let Some(auth) = parts.headers.get(http::header::AUTHORIZATION) {
        let auth = auth
            .to_str()
            .map_err(|_| malformed("the Authorization header is not ASCII"))?;
        return verify_header(parts, query, auth, keys, now);
    }
    if query.contains("X-Amz-Signature") || query.contains("X-Amz-Credential") {
        return verify_presigned(parts, query, keys, now);
    }
    Err(S3Error::AccessDenied(
        "Access Denied: anonymous requests are not accepted; sign with an access key Larder knows"
            .into(),
    ))
}

/// What a body's `x-amz-content-sha256` says about it, when signatures are not checked.
pub fn payload_of(parts: &Parts) -> Result<Payload, S3Error> {
    match parts.headers.get(names::X_AMZ_CONTENT_SHA256) {
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
    query: &Query<'_>,
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
        .get(names::X_AMZ_DATE)
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
        .get(names::X_AMZ_CONTENT_SHA256)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| {
            S3Error::InvalidRequest(
                "Missing required header for this request: x-amz-content-sha256".into(),
            )
        })?;
    let mut payload = parse_payload(hash, None)?;
    // The signer always signs x-amz-date in this form, whether or not the client listed it.
    let mut headers = signed_header_values(parts, &names, "x-amz-date")?;
    headers.push(Header {
        name: "x-amz-date",
        values: vec![date_value],
    });
    let canonical = Canonical::new(parts.method.as_str(), query.iter(), headers, hash);
    let signing_key = key.signing_key(credential.date, credential.region);
    check(
        &canonical,
        parts.uri.path(),
        date_value,
        &credential,
        &signing_key,
        signature,
    )?;
    if let Payload::SignedChunks { signer, .. } = &mut payload {
        *signer = Some(ChunkSigner {
            signing_key,
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
    query: &Query<'_>,
    keys: &KeyStore,
    now: SystemTime,
) -> Result<Verified, S3Error> {
    let mut values: [Option<&str>; 6] = Default::default();
    for (name, value) in query.iter() {
        if let Some(i) = PRESIGNED_PARAMS.iter().position(|p| *p == name) {
            if values[i].replace(value).is_some() {
                return Err(query_error("a presigned URL parameter appears twice"));
            }
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
    // As sent: a credential that parses is exactly `<key>/<date>/<region>/s3/aws4_request`.
    let credential_value = credential;
    let credential = parse_credential(credential).ok_or_else(|| {
        query_error("X-Amz-Credential must be <key>/<yyyymmdd>/<region>/s3/aws4_request")
    })?;
    let time = parse_amz_date(date)
        .filter(|_| date.starts_with(credential.date))
        .ok_or_else(|| {
            query_error("X-Amz-Date must be in ISO8601 basic form and match the credential date")
        })?;
    // Digits only, without leading zeros: the form a signer writes, and so the value the
    // signature covers is the number read here (`+60` or `060` would parse to 60 too).
    let expires_value = expires;
    let expires: u64 = Some(expires)
        .filter(|e| e.bytes().all(|b| b.is_ascii_digit()))
        .filter(|e| *e == "0" || !e.starts_with('0'))
        .and_then(|e| e.parse().ok())
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
    let headers = signed_header_values(parts, &names, "")?;
    // The URL's own parameters, then the signature's (all but X-Amz-Signature), as the signer
    // wrote them. The signed header names sorted, as a signer lists them: a list sent in
    // another order is checked as if sorted (and so fails), as before.
    let sorted_names = if names.is_sorted() {
        Cow::Borrowed(signed_headers)
    } else {
        Cow::Owned(canonical::signed_header_names(sorted(&names).into_iter()))
    };
    let signature_params = [
        ("X-Amz-Algorithm", ALGORITHM),
        ("X-Amz-Credential", credential_value),
        ("X-Amz-Date", date),
        ("X-Amz-Expires", expires_value),
        ("X-Amz-SignedHeaders", &sorted_names),
    ];
    let own = query
        .iter()
        .filter(|(name, _)| !PRESIGNED_PARAMS.contains(name));
    let query = own.chain(signature_params);
    let canonical = Canonical::new(parts.method.as_str(), query, headers, "UNSIGNED-PAYLOAD");
    let signing_key = key.signing_key(credential.date, credential.region);
    check(
        &canonical,
        parts.uri.path(),
        date,
        &credential,
        &signing_key,
        signature,
    )?;
    Ok(Verified {
        access_key: credential.access_key.to_owned(),
        key: key.clone(),
        payload: Payload::Unsigned,
        signed: Signed::from_names(names),
    })
}

/// The signed headers' values, as the client sent them, but for `skip` (a header the caller
/// adds itself). `host` may come from the URI (HTTP/2 `:authority`). Each name must be
/// lowercase and listed once.
fn signed_header_values<'p>(
    parts: &'p Parts,
    names: &[&'p str],
    skip: &str,
) -> Result<Vec<Header<'p>>, S3Error> {
    let mut out = Vec::with_capacity(names.len() + 1);
    for (i, &name) in names.iter().enumerate() {
        if name.is_empty() || name.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(malformed("SignedHeaders must be lowercase header names"));
        }
        if names[..i].contains(&name) {
            return Err(malformed("SignedHeaders names a header twice"));
        }
        if name == skip {
            continue;
        }
        let mut values = parts
            .headers
            .get_all(name)
            .iter()
            .map(|v| v.to_str().map_err(|_| S3Error::SignatureDoesNotMatch))
            .collect::<Result<Vec<_>, _>>()?;
        if values.is_empty() && name == "host" {
            values.extend(parts.uri.authority().map(|a| a.as_str()));
        }
        if values.is_empty() {
            // A signed header that is not there cannot match.
            return Err(S3Error::SignatureDoesNotMatch);
        }
        out.push(Header { name, values });
    }
    Ok(out)
}

fn sorted<'n>(names: &[&'n str]) -> Vec<&'n str> {
    let mut names = names.to_vec();
    names.sort_unstable();
    names
}

/// Whether the client's `signature` is the one `canonical` has under `signing_key`, for the
/// path as sent or as S3 canonicalises it.
fn check(
    canonical: &Canonical<'_>,
    raw_path: &str,
    date_time: &str,
    credential: &Credential<'_>,
    signing_key: &SigningKey,
    signature: &str,
) -> Result<(), S3Error> {
    // Every candidate is computed and compared, so the time taken does not say which matched.
    let mut matched = false;
    for path in candidate_paths(raw_path) {
        let hash = canonical.hash(&path);
        let to_sign =
            canonical::string_to_sign(date_time, credential.date, credential.region, &hash);
        matched |= equal(&sign(signing_key, &to_sign), signature.as_bytes());
    }
    if matched {
        Ok(())
    } else {
        Err(S3Error::SignatureDoesNotMatch)
    }
}

/// The path as sent, and as S3 canonicalises it (decoded, then each byte but the unreserved
/// ones and `/` percent-encoded), when the two differ. Clients sign the latter; most send it too.
fn candidate_paths(raw: &str) -> impl Iterator<Item = Cow<'_, str>> {
    // Nothing to decode or encode in the usual path: its canonical form is the path as sent.
    let plain = raw
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._~/".contains(&b));
    let canonical = (!plain)
        .then(|| {
            let decoded = percent_encoding::percent_decode_str(raw).collect::<Vec<u8>>();
            crate::s3::request::encode_path(&decoded)
        })
        .filter(|canonical| canonical != raw);
    std::iter::once(Cow::Borrowed(raw)).chain(canonical.map(Cow::Owned))
}

#[cfg(test)]
mod tests;
