//! Client authentication and authorisation: who sent a request (SigV4), and whether their key's
//! policy lets them do it.

pub mod chunked;
pub mod keys;
pub mod sigv2;
pub mod sigv4;

use std::time::SystemTime;

use http::request::Parts;
use http::Method;

pub use keys::{Access, KeyPolicy, KeyStore};
pub use sigv4::Payload;

use crate::s3::request::{self, Target};
use crate::s3::S3Error;

/// How clients are authenticated.
pub enum Authenticator {
    /// Every request must carry a valid SigV4 signature by one of these keys.
    SigV4(KeyStore),
    /// No authentication: anyone who reaches the listener uses Larder's upstream credentials.
    None,
}

/// Who sent a request, and how its body is protected.
#[derive(Debug)]
pub struct Principal {
    /// The access key, when authenticated.
    pub access_key: Option<String>,
    /// What the key may do; `None`: everything.
    pub policy: Option<KeyPolicy>,
    /// How the body is protected.
    pub payload: Payload,
}

impl Authenticator {
    /// The authenticator the configuration asks for, loading the credentials file.
    pub fn from_config(config: &crate::config::Config) -> Result<Self, keys::KeysError> {
        match (&config.auth, &config.auth_credentials) {
            (crate::config::AuthMode::Sigv4, Some(path)) => Ok(Authenticator::SigV4(
                KeyStore::load(path, &config.auth_policies)?,
            )),
            (crate::config::AuthMode::Sigv4, None) => {
                Err(keys::KeysError::Empty("auth_credentials".into()))
            }
            (crate::config::AuthMode::None, _) => Ok(Authenticator::None),
        }
    }

    /// Authenticate a request; `base_domain` tells a virtual-hosted request's bucket, which a
    /// SigV2 presigned URL signs.
    pub fn authenticate(
        &self,
        parts: &Parts,
        base_domain: Option<&str>,
    ) -> Result<Principal, S3Error> {
        match self {
            Authenticator::SigV4(keys)
                if sigv2::is_presigned_v2(parts.uri.query().unwrap_or(""))
                    && !parts.headers.contains_key(http::header::AUTHORIZATION) =>
            {
                let host = parts
                    .headers
                    .get(http::header::HOST)
                    .and_then(|h| h.to_str().ok());
                let resource = match request::virtual_bucket(host, base_domain) {
                    Some(bucket) => format!("/{bucket}{}", parts.uri.path()),
                    None => parts.uri.path().to_owned(),
                };
                let (access_key, key) = sigv2::verify(parts, &resource, keys, SystemTime::now())?;
                Ok(Principal {
                    access_key: Some(access_key),
                    policy: key.policy,
                    payload: Payload::Unsigned,
                })
            }
            Authenticator::SigV4(keys) => {
                let v = sigv4::verify(parts, keys, SystemTime::now())?;
                Ok(Principal {
                    access_key: Some(v.access_key),
                    policy: v.key.policy,
                    payload: v.payload,
                })
            }
            Authenticator::None => Ok(Principal {
                access_key: None,
                policy: None,
                payload: sigv4::payload_of(parts)?,
            }),
        }
    }
}

impl Principal {
    /// Whether the key's policy allows `method` on `target`; `copy_source` is the bucket named
    /// by `x-amz-copy-source`, which must be readable too.
    pub fn authorize(
        &self,
        method: &Method,
        target: &Target,
        copy_source: Option<&str>,
    ) -> Result<(), S3Error> {
        let Some(policy) = &self.policy else {
            return Ok(());
        };
        let denied = |why: &str| Err(S3Error::AccessDenied(format!("Access Denied: {why}")));
        let read = matches!(*method, Method::GET | Method::HEAD);
        if !read && policy.access == Access::ReadOnly {
            return denied("this access key is read-only");
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
            if !policy.allows_bucket(source) {
                return denied("this access key may not read the copy source's bucket");
            }
        }
        Ok(())
    }
}

/// The bucket named by an `x-amz-copy-source` header (`bucket/key` or `/bucket/key`, encoded).
pub fn copy_source_bucket(value: &str) -> Option<String> {
    let value = value.strip_prefix('/').unwrap_or(value);
    let bucket = value.split('/').next()?;
    percent_encoding::percent_decode_str(bucket)
        .decode_utf8()
        .ok()
        .map(|b| b.into_owned())
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
            }),
            payload: Payload::Unsigned,
        }
    }

    fn obj(b: &str) -> Target {
        Target::Object {
            bucket: b.into(),
            key: "k".into(),
        }
    }

    #[test]
    fn policies_limit_buckets_and_writes() {
        let reader = principal(Access::ReadOnly, &["lake", "logs-*"]);
        assert!(reader.authorize(&Method::GET, &obj("lake"), None).is_ok());
        assert!(reader
            .authorize(&Method::HEAD, &obj("logs-1"), None)
            .is_ok());
        assert!(reader
            .authorize(&Method::GET, &Target::Bucket("logs-x".into()), None)
            .is_ok());
        for (method, target) in [
            (Method::PUT, obj("lake")),
            (Method::DELETE, obj("lake")),
            (Method::POST, Target::Bucket("lake".into())),
            (Method::GET, obj("other")),
            (Method::GET, Target::Service),
        ] {
            let e = reader.authorize(&method, &target, None).unwrap_err();
            assert_eq!(e.code(), "AccessDenied", "{method} {target:?}");
        }
        let writer = principal(Access::ReadWrite, &["lake"]);
        assert!(writer.authorize(&Method::PUT, &obj("lake"), None).is_ok());
        assert!(writer
            .authorize(&Method::PUT, &obj("lake"), Some("secret"))
            .is_err());
        let all = principal(Access::ReadWrite, &["*"]);
        assert!(all.authorize(&Method::GET, &Target::Service, None).is_ok());
        let open = Principal {
            access_key: None,
            policy: None,
            payload: Payload::Unsigned,
        };
        assert!(open.authorize(&Method::DELETE, &obj("x"), None).is_ok());
    }

    #[test]
    fn copy_sources() {
        assert_eq!(copy_source_bucket("/b/k%20x").as_deref(), Some("b"));
        assert_eq!(copy_source_bucket("b/k?versionId=1").as_deref(), Some("b"));
    }
}
