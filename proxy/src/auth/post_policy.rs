//! Browser-form uploads: the POST policy and its signature, verified as S3 verifies them.
//!
//! A form carries a base64 policy document (an expiry and conditions on the form's fields) and a
//! signature over it: SigV4 (`x-amz-algorithm`, `x-amz-credential`, `x-amz-date`,
//! `x-amz-signature`, the signing key derived as for any SigV4 request) or SigV2
//! (`AWSAccessKeyId`, `signature`: HMAC-SHA1). Larder checks the signature with the client key,
//! the expiry, every condition, and that every field the form sends is covered by a condition
//! (S3's rule), then uploads the file as a PutObject signed with its own credentials, so
//! nothing the policy did not allow reaches the upstream.

use std::time::SystemTime;

use base64::Engine;
use hmac::{KeyInit, Mac};

use super::keys::KeyStore;
use super::signed::Signed;
use super::sigv4::{equal, parse_amz_date, parse_credential, sign, Payload};
use super::Principal;
use crate::s3::form::FormHead;
use crate::s3::S3Error;

/// Largest object a form may upload, as S3 allows (5 GB).
pub const MAX_OBJECT: u64 = 5 * 1000 * 1000 * 1000;

/// What a verified policy allows of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LengthRange {
    /// Fewest bytes.
    pub min: u64,
    /// Most bytes.
    pub max: u64,
}

fn denied(why: &str) -> S3Error {
    S3Error::AccessDenied(format!("Invalid according to Policy: {why}"))
}

/// Fields that are not covered by conditions: the signature, the policy itself, the file.
fn exempt(name: &str) -> bool {
    matches!(
        name,
        "x-amz-signature" | "signature" | "awsaccesskeyid" | "policy" | "file"
    ) || name.starts_with("x-ignore-")
}

/// Verify `head`'s policy and signature for an upload of `key` (after `${filename}`) to
/// `bucket`, at `now`: who signed it, and the file sizes it allows.
pub fn verify(
    head: &FormHead,
    bucket: &str,
    key: &str,
    keys: &KeyStore,
    now: SystemTime,
) -> Result<(Principal, LengthRange), S3Error> {
    let policy_b64 = head.field("policy").ok_or_else(|| {
        S3Error::AccessDenied(
            "Access Denied: anonymous form uploads are not accepted; sign a POST policy".into(),
        )
    })?;
    let access_key = check_signature(head, policy_b64, keys)?;
    let key_entry = keys.get(&access_key).ok_or(S3Error::InvalidAccessKeyId)?;
    let document = base64::engine::general_purpose::STANDARD
        .decode(policy_b64.trim())
        .map_err(|_| S3Error::InvalidArgument("Invalid Policy: Invalid Base64".into()))?;
    let policy: serde_json::Value = serde_json::from_slice(&document)
        .map_err(|_| S3Error::InvalidArgument("Invalid Policy: Invalid JSON.".into()))?;
    let expiration = policy
        .get("expiration")
        .and_then(|e| e.as_str())
        .and_then(parse_iso8601)
        .ok_or_else(|| {
            S3Error::InvalidArgument("Invalid Policy: Policy missing expiration.".into())
        })?;
    if now > expiration {
        return Err(denied("Policy expired."));
    }
    let conditions = policy
        .get("conditions")
        .and_then(|c| c.as_array())
        .ok_or_else(|| {
            S3Error::InvalidArgument("Invalid Policy: Policy missing conditions.".into())
        })?;
    let value_of = |field: &str| -> Option<String> {
        match field {
            "bucket" => Some(bucket.to_owned()),
            "key" => Some(key.to_owned()),
            f => head.field(f).map(str::to_owned),
        }
    };
    let mut covered: Vec<String> = Vec::new();
    let mut range = LengthRange {
        min: 0,
        max: MAX_OBJECT,
    };
    for condition in conditions {
        if let Some(object) = condition.as_object() {
            for (name, want) in object {
                let name = name.to_ascii_lowercase();
                let want = want
                    .as_str()
                    .ok_or_else(|| denied("a condition is not a string"))?;
                if value_of(&name).as_deref() != Some(want) {
                    return Err(denied(&format!(
                        "Policy Condition failed: [\"eq\", \"${name}\", \"{want}\"]"
                    )));
                }
                covered.push(name);
            }
            continue;
        }
        let items = condition
            .as_array()
            .ok_or_else(|| denied("a condition is neither an object nor a list"))?;
        match items
            .first()
            .and_then(|o| o.as_str())
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            Some("content-length-range") => {
                let bound = |i: usize| items.get(i).and_then(serde_json::Value::as_u64);
                let (Some(min), Some(max)) = (bound(1), bound(2)) else {
                    return Err(denied("content-length-range needs two whole numbers"));
                };
                range = LengthRange {
                    min,
                    max: max.min(MAX_OBJECT),
                };
            }
            Some(op @ ("eq" | "starts-with")) => {
                let field = items.get(1).and_then(|f| f.as_str()).unwrap_or("");
                let want = items.get(2).and_then(|w| w.as_str()).unwrap_or("");
                let name = field
                    .strip_prefix('$')
                    .ok_or_else(|| denied("a condition's field must start with $"))?
                    .to_ascii_lowercase();
                let got = value_of(&name).unwrap_or_default();
                let ok = if op == "eq" {
                    got == want
                } else {
                    got.starts_with(want)
                };
                if !ok {
                    return Err(denied(&format!(
                        "Policy Condition failed: [\"{op}\", \"${name}\", \"{want}\"]"
                    )));
                }
                covered.push(name);
            }
            _ => return Err(denied("an unknown condition")),
        }
    }
    for (name, _) in &head.fields {
        if !exempt(name) && !covered.iter().any(|c| c == name) {
            return Err(denied(&format!("Extra input fields: {name}")));
        }
    }
    Ok((
        Principal {
            access_key: Some(access_key),
            policy: key_entry.policy.clone(),
            limits: key_entry.limits.clone(),
            tally: Some(key_entry.tally.clone()),
            payload: Payload::Unsigned,
            // The upstream request is built from the verified fields only.
            signed: Signed::Unchecked,
        },
        range,
    ))
}

/// The access key whose signature over `policy_b64` the form carries.
fn check_signature(head: &FormHead, policy_b64: &str, keys: &KeyStore) -> Result<String, S3Error> {
    if let Some(algorithm) = head.field("x-amz-algorithm") {
        if algorithm != "AWS4-HMAC-SHA256" {
            return Err(S3Error::InvalidArgument(
                "Only AWS4-HMAC-SHA256 is supported for x-amz-algorithm".into(),
            ));
        }
        let (Some(credential), Some(date), Some(signature)) = (
            head.field("x-amz-credential"),
            head.field("x-amz-date"),
            head.field("x-amz-signature"),
        ) else {
            return Err(S3Error::InvalidArgument(
                "A SigV4 POST needs x-amz-credential, x-amz-date and x-amz-signature".into(),
            ));
        };
        let credential = parse_credential(credential).ok_or_else(|| {
            S3Error::InvalidArgument(
                "x-amz-credential must be <key>/<date>/<region>/s3/aws4_request".into(),
            )
        })?;
        // The date must be well formed and the credential's, as S3 requires; the policy's
        // own expiration is what bounds the form's life.
        parse_amz_date(date)
            .filter(|_| date.starts_with(credential.date))
            .ok_or_else(|| S3Error::InvalidArgument("x-amz-date is malformed".into()))?;
        let key = keys
            .get(credential.access_key)
            .ok_or(S3Error::InvalidAccessKeyId)?;
        let expected = sign(
            &key.signing_key(credential.date, credential.region),
            policy_b64.as_bytes(),
        );
        if !equal(&expected, signature.as_bytes()) {
            return Err(S3Error::SignatureDoesNotMatch);
        }
        return Ok(credential.access_key.to_owned());
    }
    let (Some(access_key), Some(signature)) =
        (head.field("awsaccesskeyid"), head.field("signature"))
    else {
        return Err(S3Error::AccessDenied(
            "Access Denied: a form upload must be signed (x-amz-signature or signature)".into(),
        ));
    };
    let key = keys.get(access_key).ok_or(S3Error::InvalidAccessKeyId)?;
    let mut mac = hmac::Hmac::<sha1::Sha1>::new_from_slice(key.secret().as_bytes())
        .map_err(|_| S3Error::InternalError)?;
    mac.update(policy_b64.as_bytes());
    let expected = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    if !equal(expected.as_bytes(), signature.as_bytes()) {
        return Err(S3Error::SignatureDoesNotMatch);
    }
    Ok(access_key.to_owned())
}

/// `2026-11-23T12:00:00Z` or `2026-11-23T12:00:00.000Z`.
fn parse_iso8601(s: &str) -> Option<SystemTime> {
    let (date, rest) = s.split_once('T')?;
    let time = rest.strip_suffix('Z')?;
    let time = time.split('.').next()?;
    let compact = format!("{}T{}Z", date.replace('-', ""), time.replace(':', ""));
    parse_amz_date(&compact)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn head(fields: &[(&str, &str)]) -> FormHead {
        FormHead {
            fields: fields
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            file_name: "a.txt".into(),
            file_content_type: None,
            file_offset: 0,
        }
    }

    fn keys() -> KeyStore {
        KeyStore::from_pairs([(
            "AKIAIOSFODNN7EXAMPLE",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        )])
    }

    fn signed_v2(policy: &serde_json::Value, extra: &[(&str, &str)]) -> FormHead {
        let b64 = base64::engine::general_purpose::STANDARD.encode(policy.to_string());
        let mut mac =
            hmac::Hmac::<sha1::Sha1>::new_from_slice(b"wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
                .unwrap();
        mac.update(b64.as_bytes());
        let sig = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
        let mut fields = vec![
            ("key", "uploads/a.txt"),
            ("awsaccesskeyid", "AKIAIOSFODNN7EXAMPLE"),
        ];
        fields.extend_from_slice(extra);
        let mut h = head(&fields);
        h.fields.push(("policy".into(), b64));
        h.fields.push(("signature".into(), sig));
        h
    }

    #[test]
    fn a_policy_allows_only_what_its_conditions_say() {
        let now = UNIX_EPOCH + Duration::from_secs(1_900_000_000);
        let policy = serde_json::json!({
            "expiration": "2030-03-17T17:46:40.000Z",
            "conditions": [{"bucket": "b"}, ["starts-with", "$key", "uploads/"],
                           ["content-length-range", 1, 100], {"content-type": "text/plain"}]
        });
        let ok = signed_v2(&policy, &[("content-type", "text/plain")]);
        let (p, range) = verify(&ok, "b", "uploads/a.txt", &keys(), now).unwrap();
        assert_eq!(p.access_key.as_deref(), Some("AKIAIOSFODNN7EXAMPLE"));
        assert_eq!(range, LengthRange { min: 1, max: 100 });
        // Another bucket, another key prefix, a field the policy does not cover, a changed
        // field value, after expiry, a tampered signature: all refused.
        assert!(verify(&ok, "other", "uploads/a.txt", &keys(), now).is_err());
        assert!(verify(&ok, "b", "elsewhere/a.txt", &keys(), now).is_err());
        let extra = signed_v2(
            &policy,
            &[("content-type", "text/plain"), ("acl", "public-read")],
        );
        assert!(verify(&extra, "b", "uploads/a.txt", &keys(), now).is_err());
        let changed = signed_v2(&policy, &[("content-type", "text/html")]);
        assert!(verify(&changed, "b", "uploads/a.txt", &keys(), now).is_err());
        let later = UNIX_EPOCH + Duration::from_secs(1_900_000_001);
        assert_eq!(
            verify(&ok, "b", "uploads/a.txt", &keys(), later)
                .unwrap_err()
                .code(),
            "AccessDenied"
        );
        let mut tampered = ok.clone();
        for (n, v) in &mut tampered.fields {
            if n == "signature" {
                v.replace_range(0..1, if v.starts_with('A') { "B" } else { "A" });
            }
        }
        assert_eq!(
            verify(&tampered, "b", "uploads/a.txt", &keys(), now).unwrap_err(),
            S3Error::SignatureDoesNotMatch
        );
        assert!(verify(&head(&[("key", "k")]), "b", "k", &keys(), now).is_err());
    }
}
