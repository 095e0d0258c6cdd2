//! Client credentials: the access keys Larder accepts, their secrets, and what each may do.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::signing_key::{SigningKey, SigningKeys};
use crate::qos::Limits;
use crate::telemetry::metrics::KeyTally;
use crate::units::ByteSize;

/// Access a key's policy grants. Each level includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Access {
    /// GET and HEAD only (reads and listings).
    ReadOnly,
    /// Reads, and writes of objects: uploads, copies, deletes, tagging.
    #[default]
    ReadWrite,
    /// Also bucket administration (create, delete, policy, ACLs, lifecycle, CORS... anything
    /// written to a bucket itself) and what can make data public or undeletable: ACLs and
    /// grants on objects, object-lock retention and legal holds.
    Admin,
}

/// What one access key may do. Keys without a policy may do everything on every bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyPolicy {
    /// The access key id this policy is for.
    pub access_key: String,
    /// Buckets the key may use: exact names, or a prefix ending in `*`; `["*"]` for all.
    #[serde(default = "all_buckets")]
    pub buckets: Vec<String>,
    /// `read-only`, `read-write` or `admin`.
    #[serde(default)]
    pub access: Access,
    /// Requests a second the key may send (a second's worth at once); beyond it, `503
    /// SlowDown`. Unset: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_second: Option<NonZeroU32>,
    /// Bytes a second of responses sent to the key, all its responses together; they are
    /// paced, not refused. Unset: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_second: Option<ByteSize>,
}

fn all_buckets() -> Vec<String> {
    vec!["*".to_owned()]
}

impl KeyPolicy {
    /// Whether the policy lets the key use `bucket`.
    pub fn allows_bucket(&self, bucket: &str) -> bool {
        self.buckets
            .iter()
            .any(|pattern| match pattern.strip_suffix('*') {
                Some(prefix) => bucket.starts_with(prefix),
                None => pattern == bucket,
            })
    }

    /// Whether the policy covers every bucket (so listing all buckets reveals nothing withheld).
    pub fn all_buckets(&self) -> bool {
        self.buckets.iter().any(|b| b == "*")
    }
}

/// A known access key.
#[derive(Clone)]
pub struct Key {
    secret: Arc<str>,
    /// What the key may do; `None`: everything.
    pub policy: Option<KeyPolicy>,
    /// What the key may take (its policy's rates), shared by all its requests; `None`: no limit.
    pub limits: Option<Arc<Limits>>,
    /// What the key's requests asked, and what the cache saved them; shared by all of them.
    pub tally: Arc<KeyTally>,
    /// SigV4 signing keys derived from `secret`. Owned with it, so they cannot outlive it.
    signing: Arc<SigningKeys>,
}

impl Key {
    /// A key with this secret and no policy.
    pub fn new(secret: &str) -> Self {
        Self {
            secret: secret.into(),
            policy: None,
            limits: None,
            tally: Arc::default(),
            signing: Arc::default(),
        }
    }

    /// The secret access key.
    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// The SigV4 signing key for `date` (`YYYYMMDD`) and `region`: derived once per day and
    /// region, then kept.
    pub(crate) fn signing_key(&self, date: &str, region: &str) -> SigningKey {
        self.signing.get(&self.secret, date, region)
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key")
            .field("secret", &"** redacted **")
            .field("policy", &self.policy)
            .finish()
    }
}

/// Every access key Larder accepts.
#[derive(Debug, Clone, Default)]
pub struct KeyStore {
    keys: HashMap<String, Key>,
}

/// Why a credentials file was refused.
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A line is not `access_key_id:secret_access_key`.
    #[error("{path}:{line}: {problem}")]
    Line {
        /// The file.
        path: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong (never the secret itself).
        problem: &'static str,
    },
    /// A policy names a key the file does not define.
    #[error("auth_policies names access key {0:?}, which the credentials file does not define")]
    UnknownPolicyKey(String),
    /// No key at all: every request would be refused.
    #[error("{0} defines no access keys")]
    Empty(String),
}

/// Why a set of policies was refused.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The configuration file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The configuration file is not TOML, or its `auth_policies` do not parse.
    #[error("{path}: {source}")]
    Toml {
        /// The file.
        path: String,
        /// What the parser said.
        source: toml::de::Error,
    },
    /// Two policies for one key.
    #[error("name access key {0:?} twice; give it one policy")]
    Twice(String),
    /// A byte rate a paced response could not keep to.
    #[error("set bytes_per_second below 1KiB for access key {0:?}; it must be at least 1KiB")]
    TooSlow(String),
    /// A policy newly names a key the credentials file does not define: a typo would leave
    /// the key meant unrestricted.
    #[error("name access key {0:?}, which the credentials file does not define")]
    UnknownKey(String),
}

/// Check policies for what makes them unusable whatever the keys: two for one key, a byte
/// rate too low to pace by.
pub fn check_policies(policies: &[KeyPolicy]) -> Result<(), PolicyError> {
    for (i, policy) in policies.iter().enumerate() {
        if policies[..i]
            .iter()
            .any(|p| p.access_key == policy.access_key)
        {
            return Err(PolicyError::Twice(policy.access_key.clone()));
        }
        // Below this a paced response's slices (4 KiB at least) would come more than 4 s apart.
        if policy.bytes_per_second.is_some_and(|b| b.0 < 1024) {
            return Err(PolicyError::TooSlow(policy.access_key.clone()));
        }
    }
    Ok(())
}

impl KeyStore {
    /// Parse the text of a credentials file, `access_key_id:secret_access_key` lines (`#`
    /// starts a comment), and attach policies; `name` is used in errors. A policy naming a key
    /// the text does not define is refused.
    pub fn parse(text: &str, name: &str, policies: &[KeyPolicy]) -> Result<Self, KeysError> {
        Self::parse_keys(text, name)?.with_policies(policies.iter())
    }

    /// These keys with the policies of the keys they define: a policy naming another key
    /// applies to nothing. For a reload, where taking a key out of the file must revoke it
    /// whether or not a policy names it.
    pub(super) fn with_defined_policies(self, policies: &[KeyPolicy]) -> Self {
        let defined: Vec<&KeyPolicy> = policies
            .iter()
            .filter(|p| self.keys.contains_key(&p.access_key))
            .collect();
        self.with_policies(defined.into_iter())
            .expect("every policy names a defined key")
    }

    /// Whether the keys define `access_key`.
    pub(super) fn defines(&self, access_key: &str) -> bool {
        self.keys.contains_key(access_key)
    }

    pub(super) fn parse_keys(text: &str, name: &str) -> Result<Self, KeysError> {
        let mut keys = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let bad = |problem| KeysError::Line {
                path: name.to_owned(),
                line: i + 1,
                problem,
            };
            let (id, secret) = line
                .split_once(':')
                .ok_or_else(|| bad("expected access_key_id:secret_access_key"))?;
            let (id, secret) = (id.trim(), secret.trim());
            if id.is_empty() || secret.is_empty() {
                return Err(bad("empty access key id or secret"));
            }
            if !id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            {
                return Err(bad(
                    "access key ids may hold only letters, digits, '-', '_' and '.'",
                ));
            }
            if keys.insert(id.to_owned(), Key::new(secret)).is_some() {
                return Err(bad("access key id defined twice"));
            }
        }
        if keys.is_empty() {
            return Err(KeysError::Empty(name.to_owned()));
        }
        Ok(Self { keys })
    }

    pub(super) fn with_policies<'a>(
        mut self,
        policies: impl Iterator<Item = &'a KeyPolicy>,
    ) -> Result<Self, KeysError> {
        for policy in policies {
            let key = self
                .keys
                .get_mut(&policy.access_key)
                .ok_or_else(|| KeysError::UnknownPolicyKey(policy.access_key.clone()))?;
            key.limits = Limits::new(
                policy.requests_per_second,
                policy.bytes_per_second.map(|b| b.0),
            )
            .map(Arc::new);
            key.policy = Some(policy.clone());
        }
        Ok(self)
    }

    /// These keys, each keeping what the same key of `old` shared with its requests: its
    /// tally, its limits' state if its policy's rates are unchanged (new rates start afresh,
    /// their counts going on), and its derived signing keys if its secret is unchanged.
    pub fn carried_over_from(mut self, old: &KeyStore) -> Self {
        let rates = |key: &Key| {
            key.policy
                .as_ref()
                .map(|p| (p.requests_per_second, p.bytes_per_second))
        };
        for (id, key) in &mut self.keys {
            let Some(was) = old.keys.get(id) else {
                continue;
            };
            key.tally = was.tally.clone();
            match (&key.limits, &was.limits) {
                (Some(_), Some(_)) if rates(key) == rates(was) => key.limits = was.limits.clone(),
                (Some(now), Some(before)) => now.continue_counts(before),
                _ => {}
            }
            if key.secret == was.secret {
                key.signing = was.signing.clone();
            }
        }
        self
    }

    /// A store of the given keys, without policies (tests and the demo).
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let keys = pairs
            .into_iter()
            .map(|(id, secret)| (id.to_owned(), Key::new(secret)))
            .collect();
        Self { keys }
    }

    /// The key with this id.
    pub fn get(&self, access_key: &str) -> Option<&Key> {
        self.keys.get(access_key)
    }

    /// The keys with limits, and their limits.
    pub fn limits(&self) -> Vec<(String, Arc<Limits>)> {
        self.keys
            .iter()
            .filter_map(|(id, key)| Some((id.clone(), key.limits.clone()?)))
            .collect()
    }

    /// Every key, and its tally.
    pub fn tallies(&self) -> Vec<(String, Arc<KeyTally>)> {
        self.keys
            .iter()
            .map(|(id, key)| (id.clone(), key.tally.clone()))
            .collect()
    }

    /// How many keys there are.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lines_comments_and_policies() {
        let text = "# clients\nreader:s3cr3t\n\n  writer : other:secret:with:colons # trailing\n";
        let policy = KeyPolicy {
            access_key: "reader".into(),
            buckets: vec!["lake".into(), "logs-*".into()],
            access: Access::ReadOnly,
            requests_per_second: None,
            bytes_per_second: None,
        };
        let store = KeyStore::parse(text, "f", &[policy]).unwrap();
        assert_eq!(store.len(), 2);
        assert_eq!(
            store.get("writer").unwrap().secret(),
            "other:secret:with:colons"
        );
        let reader = store.get("reader").unwrap().policy.clone().unwrap();
        assert!(reader.allows_bucket("lake"));
        assert!(reader.allows_bucket("logs-2026"));
        assert!(!reader.allows_bucket("lakehouse"));
        assert!(!reader.all_buckets());
        assert!(store.get("writer").unwrap().policy.is_none());
    }

    #[test]
    fn refuses_bad_files_without_echoing_secrets() {
        for (text, want) in [
            ("nocolon\n", "f:1: expected"),
            ("a:b\n:x\n", "f:2: empty"),
            ("a:b\na:c\n", "f:2: access key id defined twice"),
            ("a b:c\n", "f:1: access key ids"),
            ("# nothing\n", "defines no access keys"),
        ] {
            let err = KeyStore::parse(text, "f", &[]).unwrap_err().to_string();
            assert!(err.contains(want), "{text:?}: {err}");
            assert!(!err.contains(":c"), "{err}");
        }
        let policy = KeyPolicy {
            access_key: "ghost".into(),
            buckets: all_buckets(),
            access: Access::ReadWrite,
            requests_per_second: None,
            bytes_per_second: None,
        };
        assert!(matches!(
            KeyStore::parse("a:b", "f", &[policy]),
            Err(KeysError::UnknownPolicyKey(_))
        ));
    }

    #[test]
    fn debug_never_shows_a_secret() {
        let store = KeyStore::from_pairs([("id", "very-secret")]);
        assert!(!format!("{store:?}").contains("very-secret"));
    }
}
