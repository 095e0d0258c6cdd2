//! The client keys and their policies as the files say now: read again whenever they change,
//! so a key is revoked, rotated or added, or its policy narrowed, widened or its rates changed,
//! without restarting Larder (a Kubernetes Secret or ConfigMap mounted as a directory is
//! updated in place; an operator rotating keys, revoking a leaked one or taking write access
//! from a team should not have to roll every replica and lose what their memory tiers held).
//!
//! Both files are read every [`RELOAD_CHECK`] and compared with what was read last: the
//! credentials file, and the configuration file, of which only `auth_policies` is applied
//! (other settings changed in it are logged as waiting for a restart). A file that does not
//! load (half written, a bad line, no key at all, bad TOML, a policy that is not one) is
//! logged and what is in force is kept. A key taken out of the credentials file is revoked
//! whether or not a policy names it. A policy that newly names a key the credentials file does
//! not define is refused, as at start, where it would be a typo leaving the key meant without
//! its policy; it is tried again when the credentials file changes (a ConfigMap may reach the
//! pod before the Secret naming its new key). A reloaded key keeps what it had shared with its
//! requests: its tally, its limits' state while its rates are unchanged, and, with its secret
//! unchanged, its derived signing keys.
//!
//! Requests read the keys through an [`ArcSwap`]: a load is a few atomic operations, no lock,
//! and a request verified against the old keys finishes with them.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio_util::sync::CancellationToken;

use super::keys::{check_policies, KeyPolicy, KeyStore, KeysError, PolicyError};
use crate::reload::WatchedFile;
use crate::telemetry::labels::AuthFile;

/// The client keys in force, and where they come from.
pub struct LiveKeys {
    current: ArcSwap<KeyStore>,
    /// `None`: keys given once, never reloaded (the demo's).
    files: Option<Files>,
    /// Whether each file ([`AuthFile`]) as it is now was refused: what is in force is older
    /// than it.
    refused: [AtomicBool; 2],
}

/// The files keys and policies are read from, and what they said last.
struct Files {
    credentials: WatchedFile,
    /// The configuration file the policies come from; `None`: there is none, and the policies
    /// given at start are never reloaded.
    config: Option<WatchedFile>,
    last: parking_lot::Mutex<Last>,
}

/// What the files said when they last loaded.
struct Last {
    /// The keys the credentials file defined, without their policies.
    keys: KeyStore,
    /// The configuration file's settings other than the policies, to tell a change a restart
    /// would apply.
    settings: Option<toml::Table>,
    /// The policies in force.
    policies: Vec<KeyPolicy>,
    /// Whether the configuration file as it is now was refused for naming a key the
    /// credentials file does not define yet: tried again when that file changes.
    waiting: bool,
}

/// What a check of one file did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reload {
    /// The file is as it was.
    Unchanged,
    /// The file changed and what it says is now in force (for the configuration file: its
    /// policies, whether or not they changed).
    Applied,
    /// The file changed but did not load; what was in force was kept.
    Refused,
}

/// What a check of both files did, by [`AuthFile`].
pub type Checked = [Reload; 2];

impl LiveKeys {
    /// Load `credentials` with `policies` (the configuration's), refusing a policy that names
    /// a key the file does not define. The policies are read again from `config` whenever it
    /// changes.
    pub fn load(
        credentials: PathBuf,
        config: Option<PathBuf>,
        policies: Vec<KeyPolicy>,
    ) -> Result<Self, KeysError> {
        let text = read(&credentials)?;
        let keys = KeyStore::parse_keys(&String::from_utf8_lossy(&text), &name(&credentials))?;
        let store = keys.clone().with_policies(policies.iter())?;
        // The file as the configuration was loaded from: a later change of it is a reload.
        let config_text = config.as_deref().and_then(|p| std::fs::read(p).ok());
        let settings = config_text
            .as_deref()
            .and_then(|t| read_policies(t, "").ok())
            .map(|(_, s)| s);
        Ok(Self {
            current: ArcSwap::from_pointee(store),
            files: Some(Files {
                credentials: WatchedFile::new(credentials, Some(text)),
                config: config.map(|path| WatchedFile::new(path, config_text)),
                last: parking_lot::Mutex::new(Last {
                    keys,
                    settings,
                    policies,
                    waiting: false,
                }),
            }),
            refused: Default::default(),
        })
    }

    /// Keys given once, not read from a file and never reloaded.
    pub fn fixed(store: KeyStore) -> Self {
        Self {
            current: ArcSwap::from_pointee(store),
            files: None,
            refused: Default::default(),
        }
    }

    /// The keys in force.
    pub fn current(&self) -> arc_swap::Guard<Arc<KeyStore>> {
        self.current.load()
    }

    /// Read the files again and put in force what changed and loads.
    pub fn check(&self) -> Checked {
        let Some(files) = &self.files else {
            return [Reload::Unchanged; 2];
        };
        let mut last = files.last.lock();
        let credentials = files.check_credentials(&mut last);
        let policies = files.check_policies(&mut last, credentials == Reload::Applied);
        let checked = [credentials, policies];
        if checked.contains(&Reload::Applied) {
            let old = self.current.load_full();
            let store = last
                .keys
                .clone()
                .with_defined_policies(&last.policies)
                .carried_over_from(&old);
            tracing::info!(keys = store.len(), was = old.len(), "client keys reloaded");
            self.current.store(Arc::new(store));
        }
        for (refused, outcome) in self.refused.iter().zip(checked) {
            if outcome != Reload::Unchanged {
                refused.store(outcome == Reload::Refused, Ordering::Relaxed);
            }
        }
        checked
    }

    /// Whether `file`, as it is now, was refused, so that what is in force is older than it (a
    /// revocation written to a broken file has not happened).
    pub fn refused(&self, file: AuthFile) -> bool {
        self.refused[file.index()].load(Ordering::Relaxed)
    }

    /// Check the files every [`crate::reload::RELOAD_CHECK`] until `stop`, telling
    /// `reloaded` what each change came to.
    pub async fn watch(
        self: Arc<Self>,
        stop: CancellationToken,
        reloaded: impl Fn(AuthFile, Reload),
    ) {
        if self.files.is_none() {
            return;
        }
        let report = |checked: Checked| {
            for (&file, outcome) in AuthFile::ALL.iter().zip(checked) {
                if outcome != Reload::Unchanged {
                    reloaded(file, outcome);
                }
            }
        };
        crate::reload::poll(stop, move || self.check(), report).await;
    }
}

impl Files {
    /// Read the credentials file and, if it changed and loads, take its keys.
    fn check_credentials(&self, last: &mut Last) -> Reload {
        // A Secret being swapped may be missing for a moment: counted as one change, refused
        // (the keys stay), until it is back.
        let (changed, read) = self.credentials.read();
        if !changed {
            return Reload::Unchanged;
        }
        let path = self.credentials.path();
        let read = read.map_err(|source| KeysError::Read {
            path: name(path),
            source,
        });
        match read
            .and_then(|text| KeyStore::parse_keys(&String::from_utf8_lossy(&text), &name(path)))
        {
            Ok(keys) => {
                last.keys = keys;
                Reload::Applied
            }
            Err(e) => {
                tracing::warn!(error = %e, "client credentials not reloaded; keeping the keys in force");
                Reload::Refused
            }
        }
    }

    /// Read the configuration file and, if its policies changed and are usable with the keys
    /// in force, take them. `keys_changed`: the credentials file's keys were just taken, so a
    /// policy waiting for its key is tried again.
    fn check_policies(&self, last: &mut Last, keys_changed: bool) -> Reload {
        let Some(file) = &self.config else {
            return Reload::Unchanged;
        };
        let (changed, text) = file.read();
        // A policy waiting for its key is tried again when the keys change.
        let retry = last.waiting && keys_changed;
        if !(changed || retry) {
            return Reload::Unchanged;
        }
        let path = file.path();
        let loaded = text
            .map_err(|source| PolicyError::Read {
                path: name(path),
                source,
            })
            .and_then(|text| read_policies(&text, &name(path)))
            .and_then(|(policies, settings)| {
                check_policies(&policies)?;
                // A key no longer in the credentials file may keep its policy (it is revoked
                // either way); a key newly named must be defined.
                let unknown = policies.iter().find(|p| {
                    !last.keys.defines(&p.access_key)
                        && !last.policies.iter().any(|q| q.access_key == p.access_key)
                });
                match unknown {
                    Some(p) => Err(PolicyError::UnknownKey(p.access_key.clone())),
                    None => Ok((policies, settings)),
                }
            });
        last.waiting = matches!(loaded, Err(PolicyError::UnknownKey(_)));
        match loaded {
            Ok((policies, settings)) => {
                if last.settings.as_ref() != Some(&settings) {
                    tracing::warn!(
                        file = %path.display(),
                        "configuration file changed beyond auth_policies; those settings apply at the next start"
                    );
                    last.settings = Some(settings);
                }
                if policies != last.policies {
                    tracing::info!(
                        policies = policies.len(),
                        was = last.policies.len(),
                        file = %path.display(),
                        "auth_policies reloaded"
                    );
                    last.policies = policies;
                }
                // Applied even when only other settings changed: the file as it is now is in
                // force as far as a reload takes it.
                Reload::Applied
            }
            Err(e) => {
                tracing::warn!(error = %e, "auth_policies not reloaded; keeping the policies in force");
                Reload::Refused
            }
        }
    }
}

/// A configuration file's `auth_policies`, and its other settings.
fn read_policies(text: &[u8], name: &str) -> Result<(Vec<KeyPolicy>, toml::Table), PolicyError> {
    let toml = |source| PolicyError::Toml {
        path: name.to_owned(),
        source,
    };
    let mut settings: toml::Table = toml::from_str(&String::from_utf8_lossy(text)).map_err(toml)?;
    let policies = match settings.remove("auth_policies") {
        Some(value) => value.try_into().map_err(toml)?,
        None => Vec::new(),
    };
    Ok((policies, settings))
}

fn name(path: &Path) -> String {
    path.display().to_string()
}

fn read(path: &Path) -> Result<Vec<u8>, KeysError> {
    std::fs::read(path).map_err(|source| KeysError::Read {
        path: name(path),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroU32;

    fn policy(key: &str) -> KeyPolicy {
        KeyPolicy {
            access_key: key.into(),
            buckets: vec!["lake".into()],
            access: super::super::Access::ReadOnly,
            requests_per_second: NonZeroU32::new(1),
            bytes_per_second: None,
        }
    }

    #[test]
    fn a_changed_file_revokes_rotates_and_adds_keys_and_a_bad_one_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("credentials");
        std::fs::write(&path, "reader:one\nwriter:two\n").unwrap();
        let live = LiveKeys::load(path.clone(), None, vec![policy("reader")]).unwrap();
        assert_eq!(live.check()[0], Reload::Unchanged);
        let keys = live.current();
        let reader = keys.get("reader").unwrap();
        // The reader's one request a second is taken: a carried-over limit refuses the next.
        assert!(reader
            .limits
            .as_ref()
            .unwrap()
            .admit(std::time::Instant::now()));
        let (tally, limits) = (reader.tally.clone(), reader.limits.clone().unwrap());
        drop(keys);

        // The writer is revoked, the reader's secret rotated, a new key added.
        std::fs::write(&path, "reader:rotated\nnewcomer:three\n").unwrap();
        assert_eq!(live.check()[0], Reload::Applied);
        let keys = live.current();
        assert!(keys.get("writer").is_none());
        assert_eq!(keys.get("newcomer").unwrap().secret(), "three");
        let reader = keys.get("reader").unwrap();
        assert_eq!(reader.secret(), "rotated");
        assert!(Arc::ptr_eq(&reader.tally, &tally));
        assert!(Arc::ptr_eq(reader.limits.as_ref().unwrap(), &limits));
        assert!(!limits.admit(std::time::Instant::now()));
        assert_eq!(reader.policy.as_ref().unwrap().access_key, "reader");
        assert!(keys.get("newcomer").unwrap().policy.is_none());
        drop(keys);

        // A bad line, an empty file, a missing file: the keys in force stay.
        for bad in ["reader rotated\n", "# nothing\n"] {
            std::fs::write(&path, bad).unwrap();
            assert_eq!(live.check()[0], Reload::Refused);
            assert!(live.current().get("newcomer").is_some());
        }
        assert!(live.refused(AuthFile::Credentials));
        std::fs::remove_file(&path).unwrap();
        assert_eq!(live.check()[0], Reload::Refused);
        // Missing is one change, not one refusal per check.
        assert_eq!(live.check()[0], Reload::Unchanged);
        assert!(live.current().get("newcomer").is_some());

        // The reader taken out of the file is revoked though its policy names it; back in
        // the file, its policy applies again.
        std::fs::write(&path, "newcomer:three\n").unwrap();
        assert_eq!(live.check()[0], Reload::Applied);
        assert!(!live.refused(AuthFile::Credentials));
        assert!(live.current().get("reader").is_none());
        std::fs::write(&path, "newcomer:three\nreader:again\n").unwrap();
        assert_eq!(live.check()[0], Reload::Applied);
        let keys = live.current();
        assert_eq!(keys.get("reader").unwrap().policy, Some(policy("reader")));
    }

    /// A configuration file holding `policies` (TOML) after one other setting.
    fn config(path: &std::path::Path, setting: &str, policies: &str) {
        std::fs::write(path, format!("{setting}\n{policies}")).unwrap();
    }

    const READER: &str =
        "[[auth_policies]]\naccess_key = \"reader\"\nbuckets = [\"lake\"]\naccess = \"read-only\"\nrequests_per_second = 1\n";

    #[test]
    fn a_changed_configuration_changes_the_policies_and_a_bad_one_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (keys, toml) = (
            dir.path().join("credentials"),
            dir.path().join("larder.toml"),
        );
        std::fs::write(&keys, "reader:one\nwriter:two\n").unwrap();
        config(&toml, "block_size = \"1MiB\"", READER);
        let live =
            LiveKeys::load(keys.clone(), Some(toml.clone()), vec![policy("reader")]).unwrap();
        let [unchanged, applied, refused] = [Reload::Unchanged, Reload::Applied, Reload::Refused];
        assert_eq!(live.check(), [unchanged, unchanged]);
        let policy_of = |key: &str| live.current().get(key).unwrap().policy.clone();
        let limits_of = |key: &str| live.current().get(key).unwrap().limits.clone().unwrap();
        let limits = limits_of("reader");
        assert!(limits.admit(std::time::Instant::now()));

        // A wider bucket list, same rates: applied, the limit's state kept.
        config(
            &toml,
            "block_size = \"1MiB\"",
            &READER.replace("[\"lake\"]", "[\"lake\", \"logs\"]"),
        );
        assert_eq!(live.check(), [unchanged, applied]);
        assert!(policy_of("reader").unwrap().allows_bucket("logs"));
        let now = limits_of("reader");
        assert!(Arc::ptr_eq(&now, &limits));
        // A new rate starts afresh, its count of refusals going on; the writer gets a policy.
        assert!(!limits.admit(std::time::Instant::now()));
        let both = format!(
            "{}[[auth_policies]]\naccess_key = \"writer\"\naccess = \"read-only\"\n",
            READER.replace("= 1\n", "= 5\n")
        );
        config(&toml, "block_size = \"1MiB\"", &both);
        assert_eq!(live.check(), [unchanged, applied]);
        let now = limits_of("reader");
        assert!(!Arc::ptr_eq(&now, &limits));
        assert!(now.admit(std::time::Instant::now()));
        assert_eq!((now.refused(), limits.refused()), (1, 1));
        assert_eq!(
            policy_of("writer").unwrap().access,
            super::super::Access::ReadOnly
        );
        // Another setting changed: the policies stay as they are (that setting waits).
        config(&toml, "block_size = \"2MiB\"", &both);
        assert_eq!(live.check(), [unchanged, applied]);
        assert!(policy_of("writer").is_some());

        // Bad TOML, two policies for a key, a byte rate too low, a key the credentials file
        // lacks, the file missing: refused, the policies in force kept.
        let twice = format!("{READER}{READER}");
        let slow = READER.replace("requests_per_second = 1", "bytes_per_second = \"512B\"");
        let stranger = READER.replace("\"reader\"", "\"readr\"");
        for bad in [
            "[[auth_policies]\n",
            twice.as_str(),
            slow.as_str(),
            stranger.as_str(),
        ] {
            config(&toml, "block_size = \"2MiB\"", bad);
            assert_eq!(live.check(), [unchanged, refused], "{bad}");
            assert!(live.refused(AuthFile::Policies));
            assert!(policy_of("writer").is_some());
        }
        std::fs::remove_file(&toml).unwrap();
        assert_eq!(live.check(), [unchanged, refused]);
        assert_eq!(live.check(), [unchanged, unchanged]);
        assert!(!live.refused(AuthFile::Credentials));

        // A policy for a key not yet in the credentials file waits for it, then applies.
        let newcomer = READER.replace("\"reader\"", "\"newcomer\"");
        config(&toml, "", &newcomer);
        assert_eq!(live.check(), [unchanged, refused]);
        std::fs::write(&keys, "reader:one\nwriter:two\nnewcomer:three\n").unwrap();
        assert_eq!(live.check(), [applied, applied]);
        assert!(!live.refused(AuthFile::Policies));
        assert!(policy_of("newcomer").unwrap().allows_bucket("lake"));
        // The reader, without a policy now, may do everything.
        assert!(policy_of("reader").is_none());

        // A key taken out of the credentials file is revoked; its policy may stay.
        std::fs::write(&keys, "reader:one\nwriter:two\n").unwrap();
        assert_eq!(live.check(), [applied, unchanged]);
        assert!(live.current().get("newcomer").is_none());
        config(&toml, "block_size = \"1MiB\"", &newcomer);
        assert_eq!(live.check(), [unchanged, applied]);
    }

    #[test]
    fn at_start_a_policy_for_a_key_the_file_lacks_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("credentials");
        std::fs::write(&path, "writer:two\n").unwrap();
        assert!(matches!(
            LiveKeys::load(path, None, vec![policy("reader")]),
            Err(KeysError::UnknownPolicyKey(_))
        ));
    }
}
