//! Presigned URLs in the legacy Signature Version 2 query form
//! (`?AWSAccessKeyId=&Expires=&Signature=`), which boto3's `generate_presigned_url` and
//! `aws s3 presign` still produce by default. Only this form is accepted: every current SDK signs
//! requests themselves with SigV4.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use hmac::{KeyInit, Mac};
use http::request::Parts;

use super::keys::{Key, KeyStore};
use super::sigv4::{equal, MAX_PRESIGNED_EXPIRY};
use crate::s3::query::Query;
use crate::s3::S3Error;

/// The query parameters that are part of the signed resource (as botocore's `HmacV1Auth` and
/// S3's SigV2 documentation list them).
const SUB_RESOURCES: &[&str] = &[
    "accelerate",
    "acl",
    "analytics",
    "cors",
    "defaultObjectAcl",
    "delete",
    "inventory",
    "lifecycle",
    "location",
    "logging",
    "metrics",
    "notification",
    "object-lock",
    "partNumber",
    "policy",
    "replication",
    "requestPayment",
    "response-cache-control",
    "response-content-disposition",
    "response-content-encoding",
    "response-content-language",
    "response-content-type",
    "response-expires",
    "restore",
    "select",
    "select-type",
    "storageClass",
    "tagging",
    "torrent",
    "uploadId",
    "uploads",
    "versionId",
    "versioning",
    "versions",
    "website",
];

/// Whether the query carries a SigV2 presigned signature.
pub fn is_presigned_v2(query: &Query<'_>) -> bool {
    query.contains("AWSAccessKeyId") && query.contains("Signature")
}

/// Verify a SigV2 presigned URL whose query is `query` (the request's, parsed).
/// `bucket_path` is the signed resource's path: the raw path for path-style requests,
/// `/<bucket>` + the raw path for virtual-hosted ones.
pub fn verify(
    parts: &Parts,
    query: &Query<'_>,
    bucket_path: &str,
    keys: &KeyStore,
    now: SystemTime,
) -> Result<(String, Key), S3Error> {
    let (mut access_key, mut signature, mut expires) = (None, None, None);
    let mut sub = Vec::new();
    for (k, v) in query.iter() {
        match k {
            "AWSAccessKeyId" => access_key = Some(v),
            "Signature" => signature = Some(v),
            "Expires" => expires = Some(v),
            name if SUB_RESOURCES.contains(&name) => sub.push((k, v)),
            // The SDKs' routing hint; S3 and Larder ignore it.
            "x-id" => {}
            // SigV2 signs only the sub-resources above. Larder re-signs what it forwards with
            // SigV4, which covers the whole query, so an unsigned parameter would gain the
            // authority of Larder's signature: refuse it instead.
            name => {
                return Err(S3Error::AccessDenied(format!(
                    "Query parameter {name} is not covered by a Signature Version 2 signature; sign with Signature Version 4"
                )))
            }
        }
    }
    let (Some(access_key), Some(signature), Some(expires)) = (access_key, signature, expires)
    else {
        return Err(S3Error::AccessDenied(
            "Query-string authentication requires the Signature, Expires and AWSAccessKeyId parameters"
                .into(),
        ));
    };
    let expires_at: u64 = expires.parse().map_err(|_| {
        S3Error::AccessDenied("Invalid date (should be seconds since epoch)".into())
    })?;
    let key = keys.get(access_key).ok_or(S3Error::InvalidAccessKeyId)?;
    // As SigV4 caps a presigned URL's life at 7 days, so does Larder for SigV2. An expiry past
    // what the clock can hold is past that too: checked, since `UNIX_EPOCH + secs` panics.
    let too_late =
        || S3Error::AccessDenied("Request expiry is more than 7 days in the future".into());
    let expires_at = UNIX_EPOCH
        .checked_add(Duration::from_secs(expires_at))
        .ok_or_else(too_late)?;
    if now > expires_at {
        return Err(S3Error::AccessDenied("Request has expired".into()));
    }
    if expires_at > now + Duration::from_secs(MAX_PRESIGNED_EXPIRY) {
        return Err(too_late());
    }
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .trim()
            .to_owned()
    };
    // Every x-amz-* header is part of what SigV2 signs; one whose value cannot be put in the
    // string to sign would otherwise be forwarded unsigned.
    let mut amz = Vec::new();
    for (name, value) in &parts.headers {
        if name.as_str().starts_with("x-amz-") {
            let value = value.to_str().map_err(|_| {
                S3Error::AccessDenied(format!(
                    "There were headers present in the request which were not signed: {name}"
                ))
            })?;
            amz.push((name.as_str().to_owned(), value.trim().to_owned()));
        }
    }
    amz.sort();
    let mut to_sign = format!(
        "{}\n{}\n{}\n{expires}\n",
        parts.method,
        header("content-md5"),
        header("content-type")
    );
    for (name, value) in &amz {
        to_sign.push_str(&format!("{name}:{value}\n"));
    }
    to_sign.push_str(bucket_path);
    sub.sort();
    for (i, (k, v)) in sub.iter().enumerate() {
        to_sign.push(if i == 0 { '?' } else { '&' });
        to_sign.push_str(k);
        if !v.is_empty() {
            to_sign.push('=');
            to_sign.push_str(v);
        }
    }
    let mut mac = hmac::Hmac::<sha1::Sha1>::new_from_slice(key.secret().as_bytes())
        .map_err(|_| S3Error::InternalError)?;
    mac.update(to_sign.as_bytes());
    let expected = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    if !equal(expected.as_bytes(), signature.as_bytes()) {
        return Err(S3Error::SignatureDoesNotMatch);
    }
    Ok((access_key.to_owned(), key.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    // The example from the Amazon S3 developer guide, "Query string request authentication
    // alternative" (Signature Version 2).
    const URL: &str = "/johnsmith/photos/puppy.jpg?AWSAccessKeyId=AKIAIOSFODNN7EXAMPLE&Signature=NpgCjnDzrM%2BWFzoENXmpNDUsSn8%3D&Expires=1175139620";

    fn parts(uri: &str) -> Parts {
        http::Request::get(uri).body(()).unwrap().into_parts().0
    }

    /// Verify as the authenticator does, with the request's own query.
    fn verify(
        p: &Parts,
        bucket_path: &str,
        keys: &KeyStore,
        now: SystemTime,
    ) -> Result<(String, Key), S3Error> {
        super::verify(p, &Query::parse(p.uri.query()), bucket_path, keys, now)
    }

    fn keys() -> KeyStore {
        KeyStore::from_pairs([(
            "AKIAIOSFODNN7EXAMPLE",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        )])
    }

    #[test]
    fn the_aws_example_verifies_until_it_expires() {
        let p = parts(URL);
        assert!(is_presigned_v2(&Query::parse(p.uri.query())));
        let before = UNIX_EPOCH + Duration::from_secs(1_175_139_000);
        let (id, _) = verify(&p, p.uri.path(), &keys(), before).unwrap();
        assert_eq!(id, "AKIAIOSFODNN7EXAMPLE");
        let after = UNIX_EPOCH + Duration::from_secs(1_175_139_621);
        assert_eq!(
            verify(&p, p.uri.path(), &keys(), after)
                .unwrap_err()
                .to_string(),
            "Request has expired"
        );
        let other = parts(&URL.replace("puppy", "kitten"));
        assert_eq!(
            verify(&other, other.uri.path(), &keys(), before).unwrap_err(),
            S3Error::SignatureDoesNotMatch
        );
        // A parameter SigV2 does not sign is refused, not forwarded under Larder's signature.
        let extra = parts(&format!("{URL}&retention"));
        assert_eq!(
            verify(&extra, extra.uri.path(), &keys(), before)
                .unwrap_err()
                .code(),
            "AccessDenied"
        );
        // At most 7 days ahead.
        let long_ago = UNIX_EPOCH + Duration::from_secs(1_175_139_620 - 8 * 24 * 3600);
        assert_eq!(
            verify(&p, p.uri.path(), &keys(), long_ago)
                .unwrap_err()
                .to_string(),
            "Request expiry is more than 7 days in the future"
        );
        let mut non_ascii = parts(URL);
        non_ascii.headers.insert(
            "x-amz-meta-a",
            http::HeaderValue::from_bytes(b"\xff").unwrap(),
        );
        assert_eq!(
            verify(&non_ascii, non_ascii.uri.path(), &keys(), before)
                .unwrap_err()
                .code(),
            "AccessDenied"
        );
        let unknown = KeyStore::from_pairs([("someone", "x")]);
        assert_eq!(
            verify(&p, p.uri.path(), &unknown, before).unwrap_err(),
            S3Error::InvalidAccessKeyId
        );
    }

    /// Found by the `auth` fuzz target: an `Expires` past what the clock can hold panicked the
    /// request (the time was computed before it was compared), with only a known access key id
    /// and no valid signature needed.
    #[test]
    fn an_expiry_past_what_a_clock_holds_is_refused_not_a_panic() {
        for huge in ["18446744073709551615", "000018446744073709551615"] {
            let p = parts(&URL.replace("Expires=1175139620", &format!("Expires={huge}")));
            let now = UNIX_EPOCH + Duration::from_secs(1_175_139_000);
            assert_eq!(
                verify(&p, p.uri.path(), &keys(), now)
                    .unwrap_err()
                    .to_string(),
                "Request expiry is more than 7 days in the future"
            );
        }
    }
}
