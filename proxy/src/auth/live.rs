//! The client keys as the credentials file says now: read again whenever the file changes, so
//! a key is revoked, rotated or added without restarting Larder (a Kubernetes Secret mounted as
//! a directory is updated in place; an operator rotating keys, or revoking a leaked one, should
//! not have to roll every replica and lose what their memory tiers held).
//!
//! The file is read every [`RELOAD_CHECK`] and compared with what was read last. A file that
//! does not load (half written, a bad line, no key at all) is logged and the keys in force are
//! kept. A reloaded key keeps what it had shared with its requests: its tally and its limits'
//! state, and, with its secret unchanged, its derived signing keys. Policies come from the
//! configuration and are not reloaded; one naming a key the file no longer defines applies to
//! nothing until the key comes back (at start, such a policy is refused as a typo).
//!
//! Requests read the keys through an [`ArcSwap`]: a load is a few atomic operations, no lock,
//! and a request verified against the old keys finishes with them.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio_util::sync::CancellationToken;

use super::keys::{KeyPolicy, KeyStore, KeysError};

/// How often the credentials file is checked: a revoked key is refused at most this long (and
/// however long the file takes to reach the pod) after the file changes.
pub const RELOAD_CHECK: Duration = Duration::from_secs(5);

/// The client keys in force, and where they come from.
pub struct LiveKeys {
    current: ArcSwap<KeyStore>,
    /// The credentials file; `None`: keys given once, never reloaded (the demo's).
    path: Option<PathBuf>,
    policies: Vec<KeyPolicy>,
    /// The file's text when last read (`None`: it could not be read), to tell a change.
    last: parking_lot::Mutex<Option<Vec<u8>>>,
    /// Whether the file as it is now was refused: the keys in force are older than it.
    refused: AtomicBool,
}

/// What a check of the credentials file did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reload {
    /// The file is as it was.
    Unchanged,
    /// The file changed and its keys are now in force.
    Applied,
    /// The file changed but did not load; the keys in force were kept.
    Refused,
}

impl LiveKeys {
    /// Load `path` with `policies`, refusing a policy that names a key the file does not
    /// define.
    pub fn load(path: PathBuf, policies: Vec<KeyPolicy>) -> Result<Self, KeysError> {
        let text = read(&path)?;
        let store = KeyStore::parse(&String::from_utf8_lossy(&text), &name(&path), &policies)?;
        Ok(Self {
            current: ArcSwap::from_pointee(store),
            path: Some(path),
            policies,
            last: parking_lot::Mutex::new(Some(text)),
            refused: AtomicBool::new(false),
        })
    }

    /// Keys given once, not read from a file and never reloaded.
    pub fn fixed(store: KeyStore) -> Self {
        Self {
            current: ArcSwap::from_pointee(store),
            path: None,
            policies: Vec::new(),
            last: parking_lot::Mutex::default(),
            refused: AtomicBool::new(false),
        }
    }

    /// The keys in force.
    pub fn current(&self) -> arc_swap::Guard<Arc<KeyStore>> {
        self.current.load()
    }

    /// Read the file again and, if it changed and loads, put its keys in force.
    pub fn check(&self) -> Reload {
        let Some(path) = &self.path else {
            return Reload::Unchanged;
        };
        let mut last = self.last.lock();
        // A Secret being swapped may be missing for a moment: counted as one change, refused
        // (the keys stay), until it is back.
        let read = read(path);
        let text = read.as_ref().ok();
        if text == last.as_ref() {
            return Reload::Unchanged;
        }
        *last = text.cloned();
        let old = self.current.load_full();
        // A key taken out of the file is revoked whether or not a policy names it.
        let store = read.and_then(|text| {
            KeyStore::parse_leniently(&String::from_utf8_lossy(&text), &name(path), &self.policies)
        });
        let outcome = match store {
            Ok(store) => {
                let store = store.carried_over_from(&old);
                tracing::info!(
                    keys = store.len(),
                    was = old.len(),
                    file = %path.display(),
                    "client credentials reloaded"
                );
                self.current.store(Arc::new(store));
                Reload::Applied
            }
            Err(e) => {
                tracing::warn!(error = %e, "client credentials not reloaded; keeping the keys in force");
                Reload::Refused
            }
        };
        self.refused
            .store(outcome == Reload::Refused, Ordering::Relaxed);
        outcome
    }

    /// Whether the credentials file as it is now was refused, so that the keys in force are
    /// older than it (a revocation written to a broken file has not happened).
    pub fn file_refused(&self) -> bool {
        self.refused.load(Ordering::Relaxed)
    }

    /// Check the file every [`RELOAD_CHECK`] until `stop`, telling `reloaded` what each change
    /// came to.
    pub async fn watch(self: Arc<Self>, stop: CancellationToken, reloaded: impl Fn(Reload)) {
        if self.path.is_none() {
            return;
        }
        loop {
            tokio::select! {
                () = tokio::time::sleep(RELOAD_CHECK) => {}
                () = stop.cancelled() => return,
            }
            let this = self.clone();
            // A file read: off the runtime's threads.
            let Ok(outcome) = tokio::task::spawn_blocking(move || this.check()).await else {
                continue;
            };
            if outcome != Reload::Unchanged {
                reloaded(outcome);
            }
        }
    }
}

fn name(path: &std::path::Path) -> String {
    path.display().to_string()
}

fn read(path: &std::path::Path) -> Result<Vec<u8>, KeysError> {
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
        let live = LiveKeys::load(path.clone(), vec![policy("reader")]).unwrap();
        assert_eq!(live.check(), Reload::Unchanged);
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
        assert_eq!(live.check(), Reload::Applied);
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
            assert_eq!(live.check(), Reload::Refused);
            assert!(live.current().get("newcomer").is_some());
        }
        assert!(live.file_refused());
        std::fs::remove_file(&path).unwrap();
        assert_eq!(live.check(), Reload::Refused);
        // Missing is one change, not one refusal per check.
        assert_eq!(live.check(), Reload::Unchanged);
        assert!(live.current().get("newcomer").is_some());

        // The reader taken out of the file is revoked though its policy names it; back in
        // the file, its policy applies again.
        std::fs::write(&path, "newcomer:three\n").unwrap();
        assert_eq!(live.check(), Reload::Applied);
        assert!(!live.file_refused());
        assert!(live.current().get("reader").is_none());
        std::fs::write(&path, "newcomer:three\nreader:again\n").unwrap();
        assert_eq!(live.check(), Reload::Applied);
        let keys = live.current();
        assert_eq!(keys.get("reader").unwrap().policy, Some(policy("reader")));
    }

    #[test]
    fn at_start_a_policy_for_a_key_the_file_lacks_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("credentials");
        std::fs::write(&path, "writer:two\n").unwrap();
        assert!(matches!(
            LiveKeys::load(path, vec![policy("reader")]),
            Err(KeysError::UnknownPolicyKey(_))
        ));
    }
}
