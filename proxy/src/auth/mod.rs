//! Client authentication and authorisation: who sent a request (SigV4), and whether their key's
//! policy lets them do it.
//!
//! Why not s3s's verifiers: in s3s 0.14 (a dependency of the demo only) SigV4, SigV2 and
//! `aws-chunked` verification are private modules (`mod sig_v4`, `mod sig_v2`) run inside its
//! `S3Service`, which dispatches each request to an `S3` trait method with the body already
//! parsed into typed input. A pass-through proxy must instead forward the request as signed,
//! stream its body untouched, and know which headers the signature covered; none of that is
//! reachable from outside s3s. So Larder verifies itself: the canonical request is built in
//! [`sigv4`] from the request as the client signed it, and checked against the AWS SDK's own
//! signer (`aws-sigv4`) by a property test over random requests.

pub mod chunked;
pub mod keys;
pub mod live;
pub mod post_policy;
pub mod signed;
mod signing_key;
pub mod sigv2;
pub mod sigv4;

use std::sync::Arc;
use std::time::SystemTime;

use http::request::Parts;
use http::{HeaderMap, Method};

pub use keys::{Access, KeyPolicy, KeyStore};
pub use live::LiveKeys;
pub use signed::Signed;
pub use sigv4::Payload;

use crate::qos::Limits;
use crate::s3::copy_source::CopySource;
use crate::s3::query::Query;
use crate::s3::request::{self, Target};
use crate::s3::S3Error;
use crate::telemetry::metrics::KeyTally;

/// How clients are authenticated.
pub enum Authenticator {
    /// Every request must carry a valid SigV4 signature by one of these keys (as the
    /// credentials file says now).
    SigV4(Arc<LiveKeys>),
    /// No authentication: anyone who reaches the listener uses Larder's upstream credentials.
    None,
}

/// How clients authenticate (the `auth` option).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum AuthMode {
    /// AWS Signature Version 4 (and SigV2 presigned URLs), against the client keys.
    #[default]
    Sigv4,
    /// No authentication.
    None,
}

/// Who sent a request, and how its body is protected.
#[derive(Debug)]
pub struct Principal {
    /// The access key, when authenticated.
    pub access_key: Option<String>,
    /// What the key may do; `None`: everything.
    pub policy: Option<KeyPolicy>,
    /// What the key may take (`crate::qos`); `None`: no limit.
    pub limits: Option<Arc<Limits>>,
    /// What the key's requests asked and were saved (`larder_key_*`); `None`: no key.
    pub tally: Option<Arc<KeyTally>>,
    /// How the body is protected.
    pub payload: Payload,
    /// Which headers the signature covers: only those (and the standard ones S3 takes unsigned)
    /// are forwarded.
    pub signed: Signed,
}

impl Authenticator {
    /// The authenticator for `mode`, loading the client keys from `credentials` (required for
    /// SigV4) with their `policies`, which are read again from the configuration file
    /// `config` (if there is one) when it changes.
    pub fn load(
        mode: AuthMode,
        credentials: Option<&std::path::Path>,
        config: Option<&std::path::Path>,
        policies: &[KeyPolicy],
    ) -> Result<Self, keys::KeysError> {
        match (mode, credentials) {
            (AuthMode::Sigv4, Some(path)) => Ok(Authenticator::SigV4(Arc::new(LiveKeys::load(
                path.to_owned(),
                config.map(ToOwned::to_owned),
                policies.to_vec(),
            )?))),
            (AuthMode::Sigv4, None) => Err(keys::KeysError::Empty("auth_credentials".into())),
            (AuthMode::None, _) => Ok(Authenticator::None),
        }
    }

    /// Authenticate a request whose query is `query` (its own, parsed); `base_domain` tells a
    /// virtual-hosted request's bucket, which a SigV2 presigned URL signs. A request carrying
    /// an `x-amz-*` header its signature does not cover is refused, as S3 refuses it.
    pub fn authenticate(
        &self,
        parts: &Parts,
        query: &Query<'_>,
        base_domain: Option<&str>,
    ) -> Result<Principal, S3Error> {
        let principal = match self {
            Authenticator::SigV4(keys)
                if sigv2::is_presigned_v2(query)
                    && !parts.headers.contains_key(http::header::AUTHORIZATION) =>
            {
                // The bucket signed is the bucket routed: both come from the same host.
                let host = request::host(parts)?;
                let resource = match request::virtual_bucket(host, base_domain) {
                    Some(bucket) => format!("/{bucket}{}", parts.uri.path()),
                    None => parts.uri.path().to_owned(),
                };
                let (access_key, key) =
                    sigv2::verify(parts, query, &resource, &keys.current(), SystemTime::now())?;
                Principal {
                    access_key: Some(access_key),
                    policy: key.policy,
                    limits: key.limits,
                    tally: Some(key.tally),
                    payload: Payload::Unsigned,
                    signed: Signed::AllAmz,
                }
            }
            Authenticator::SigV4(keys) => {
                let v = sigv4::verify(parts, query, &keys.current(), SystemTime::now())?;
                Principal {
                    access_key: Some(v.access_key),
                    policy: v.key.policy,
                    limits: v.key.limits,
                    tally: Some(v.key.tally),
                    payload: v.payload,
                    signed: v.signed,
                }
            }
            Authenticator::None => {
                return Ok(Principal {
                    access_key: None,
                    policy: None,
                    limits: None,
                    tally: None,
                    payload: sigv4::payload_of(parts)?,
                    signed: Signed::Unchecked,
                })
            }
        };
        principal.signed.check(&parts.headers)?;
        Ok(principal)
    }
}

impl Authenticator {
    /// Who signed a browser-form upload of `key` to `bucket`, and the file sizes its policy
    /// allows ([`post_policy`]). With authentication off, anyone, any size S3 takes.
    pub fn form_upload(
        &self,
        head: &crate::s3::form::FormHead,
        bucket: &str,
        key: &str,
    ) -> Result<(Principal, post_policy::LengthRange), S3Error> {
        match self {
            Authenticator::SigV4(keys) => {
                post_policy::verify(head, bucket, key, &keys.current(), SystemTime::now())
            }
            Authenticator::None => Ok((
                Principal {
                    access_key: None,
                    policy: None,
                    limits: None,
                    tally: None,
                    payload: Payload::Unsigned,
                    signed: Signed::Unchecked,
                },
                post_policy::LengthRange {
                    min: 0,
                    max: post_policy::MAX_OBJECT,
                },
            )),
        }
    }
}

impl Principal {
    /// Whether the key's requests a second (`crate::qos`) leave room for this request:
    /// `SlowDown` otherwise, counted. Asked once per request, before any work for it; the
    /// clock is read only for a key with limits.
    pub fn admit(&self) -> Result<(), S3Error> {
        match &self.limits {
            Some(limits) if !limits.admit(std::time::Instant::now()) => Err(S3Error::SlowDown),
            _ => Ok(()),
        }
    }

    /// Whether the key's policy allows `method` on `target` with these headers and query
    /// sub-resources (`query_other`); `copy_source` is the object a copy reads, whose bucket
    /// must be readable too.
    pub fn authorize(
        &self,
        method: &Method,
        target: &Target,
        query_other: &[String],
        headers: &HeaderMap,
        copy_source: Option<&CopySource>,
    ) -> Result<(), S3Error> {
        let Some(policy) = &self.policy else {
            return Ok(());
        };
        let denied = |why: &str| Err(S3Error::AccessDenied(format!("Access Denied: {why}")));
        let needed = access_needed(method, target, query_other, headers);
        if needed > policy.access {
            return denied(match needed {
                Access::Admin => {
                    "this access key may not administer buckets, set ACLs or grants, or lock objects"
                }
                _ => "this access key is read-only",
            });
        }
        match target {
            Target::Service if !policy.all_buckets() => {
                return denied("this access key may not list every bucket")
            }
            Target::Service => {}
            Target::Bucket(b) | Target::Object { bucket: b, .. } => {
                if !policy.allows_bucket(b) {
                    return denied("this access key may not use this bucket");
                }
            }
        }
        if let Some(source) = copy_source {
            if !policy.allows_bucket(&source.bucket) {
                return denied("this access key may not read the copy source's bucket");
            }
        }
        Ok(())
    }
}

/// Object sub-resources whose writes are administration: they can make data public or
/// impossible to delete.
const ADMIN_OBJECT_SUBRESOURCES: &[&str] = &["acl", "retention", "legal-hold"];
/// Headers that do the same on an upload or copy.
const ADMIN_HEADERS: &[&str] = &[
    "x-amz-acl",
    "x-amz-grant-full-control",
    "x-amz-grant-read",
    "x-amz-grant-read-acp",
    "x-amz-grant-write",
    "x-amz-grant-write-acp",
    "x-amz-object-lock-mode",
    "x-amz-object-lock-retain-until-date",
    "x-amz-object-lock-legal-hold",
    "x-amz-bypass-governance-retention",
];

/// The access an operation needs. Reads (GET, HEAD) need `read-only`. Writes to a bucket
/// itself (create, delete, policy, ACL, lifecycle...) need `admin`, except DeleteObjects and a
/// browser-form upload (POST to the bucket), which write objects. Object writes need
/// `read-write`, or `admin` when they set ACLs, grants or object lock.
pub fn access_needed(
    method: &Method,
    target: &Target,
    query_other: &[String],
    headers: &HeaderMap,
) -> Access {
    if matches!(*method, Method::GET | Method::HEAD) {
        return Access::ReadOnly;
    }
    let has = |p: &str| query_other.iter().any(|o| o == p);
    match target {
        Target::Service => Access::Admin,
        Target::Bucket(_)
            if *method == Method::POST && (has("delete") || query_other.is_empty()) =>
        {
            Access::ReadWrite
        }
        Target::Bucket(_) => Access::Admin,
        Target::Object { .. }
            if ADMIN_OBJECT_SUBRESOURCES.iter().any(|s| has(s))
                || ADMIN_HEADERS.iter().any(|h| headers.contains_key(*h)) =>
        {
            Access::Admin
        }
        Target::Object { .. } => Access::ReadWrite,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(access: Access, buckets: &[&str]) -> Principal {
        Principal {
            access_key: Some("k".into()),
            policy: Some(KeyPolicy {
                access_key: "k".into(),
                buckets: buckets.iter().map(|b| b.to_string()).collect(),
                access,
                requests_per_second: None,
                bytes_per_second: None,
            }),
            limits: None,
            tally: None,
            payload: Payload::Unsigned,
            signed: Signed::Unchecked,
        }
    }

    fn obj(b: &str) -> Target {
        Target::Object {
            bucket: b.into(),
            key: "k".into(),
        }
    }

    fn check(p: &Principal, method: Method, target: &Target, query: &[&str]) -> bool {
        let query: Vec<String> = query.iter().map(|q| q.to_string()).collect();
        p.authorize(&method, target, &query, &HeaderMap::new(), None)
            .is_ok()
    }

    #[test]
    fn policies_limit_buckets_and_writes() {
        let reader = principal(Access::ReadOnly, &["lake", "logs-*"]);
        assert!(check(&reader, Method::GET, &obj("lake"), &[]));
        assert!(check(&reader, Method::HEAD, &obj("logs-1"), &[]));
        assert!(check(
            &reader,
            Method::GET,
            &Target::Bucket("logs-x".into()),
            &[]
        ));
        for (method, target) in [
            (Method::PUT, obj("lake")),
            (Method::DELETE, obj("lake")),
            (Method::POST, Target::Bucket("lake".into())),
            (Method::GET, obj("other")),
            (Method::GET, Target::Service),
        ] {
            let e = reader
                .authorize(&method, &target, &[], &HeaderMap::new(), None)
                .unwrap_err();
            assert_eq!(e.code(), "AccessDenied", "{method} {target:?}");
        }
        let writer = principal(Access::ReadWrite, &["lake"]);
        assert!(check(&writer, Method::PUT, &obj("lake"), &[]));
        let secret = CopySource::parse(b"secret/k").unwrap();
        assert!(writer
            .authorize(
                &Method::PUT,
                &obj("lake"),
                &[],
                &HeaderMap::new(),
                Some(&secret)
            )
            .is_err());
        let all = principal(Access::ReadWrite, &["*"]);
        assert!(check(&all, Method::GET, &Target::Service, &[]));
        let open = Principal {
            access_key: None,
            policy: None,
            limits: None,
            tally: None,
            payload: Payload::Unsigned,
            signed: Signed::Unchecked,
        };
        assert!(check(&open, Method::DELETE, &obj("x"), &[]));
    }

    #[test]
    fn bucket_administration_is_apart_from_object_writes() {
        let writer = principal(Access::ReadWrite, &["lake"]);
        let bucket = Target::Bucket("lake".into());
        // Object writes, DeleteObjects and form uploads: read-write.
        assert!(check(
            &writer,
            Method::PUT,
            &obj("lake"),
            &["uploadId", "partNumber"]
        ));
        assert!(check(&writer, Method::PUT, &obj("lake"), &["tagging"]));
        assert!(check(&writer, Method::POST, &bucket, &["delete"]));
        assert!(check(&writer, Method::POST, &bucket, &[]));
        // Bucket administration and what makes data public or undeletable: admin.
        for (method, target, query) in [
            (Method::PUT, &bucket, &["policy"][..]),
            (Method::PUT, &bucket, &["acl"][..]),
            (Method::PUT, &bucket, &[][..]),
            (Method::DELETE, &bucket, &[][..]),
            (Method::DELETE, &bucket, &["policy"][..]),
            (Method::PUT, &obj("lake"), &["acl"][..]),
            (Method::PUT, &obj("lake"), &["retention"][..]),
            (Method::PUT, &obj("lake"), &["legal-hold"][..]),
        ] {
            assert!(
                !check(&writer, method.clone(), target, query),
                "{method} {query:?}"
            );
        }
        let mut public = HeaderMap::new();
        public.insert("x-amz-acl", "public-read".parse().unwrap());
        assert!(writer
            .authorize(&Method::PUT, &obj("lake"), &[], &public, None)
            .is_err());
        let admin = principal(Access::Admin, &["lake"]);
        assert!(check(&admin, Method::PUT, &bucket, &["policy"]));
        assert!(admin
            .authorize(&Method::PUT, &obj("lake"), &[], &public, None)
            .is_ok());
        assert!(!check(
            &admin,
            Method::PUT,
            &Target::Bucket("other".into()),
            &["policy"]
        ));
    }
}
