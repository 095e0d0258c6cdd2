//! Files read again when they change, so that what they hold (client keys and policies, TLS
//! certificates, the fleet's CA) is renewed, rotated or revoked without a restart: a Kubernetes
//! Secret or ConfigMap mounted as a directory is updated in place, and a restart would cost the
//! replica its memory tier.
//!
//! Files are polled, every [`RELOAD_CHECK`], off the runtime's threads; each owner decides what
//! a changed file means and keeps what is in force when the new one does not load.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// How often watched files are checked: a change is in force at most this long (and however
/// long the file takes to reach the pod) after it is written.
pub const RELOAD_CHECK: Duration = Duration::from_secs(5);

/// A file, and its contents when last read, to tell a change.
#[derive(Debug)]
pub struct WatchedFile {
    path: PathBuf,
    /// `None`: it could not be read.
    last: parking_lot::Mutex<Option<Vec<u8>>>,
}

impl WatchedFile {
    /// `path`, whose contents were last read as `last` (`None`: not read, or not readable).
    pub fn new(path: PathBuf, last: Option<Vec<u8>>) -> Self {
        Self {
            path,
            last: parking_lot::Mutex::new(last),
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Read the file: whether its contents differ from the last read, and what it read. A
    /// file that cannot be read is one change, however many reads fail after it (a Secret
    /// being swapped may be missing for a moment).
    pub fn read(&self) -> (bool, io::Result<Vec<u8>>) {
        let read = std::fs::read(&self.path);
        let mut last = self.last.lock();
        let changed = read.as_ref().ok() != last.as_ref();
        if changed {
            *last = read.as_ref().ok().cloned();
        }
        (changed, read)
    }
}

/// Run `check` every [`RELOAD_CHECK`] until `stop`, on a blocking thread (it reads files),
/// handing what it found to `then`.
pub async fn poll<T: Send + 'static>(
    stop: CancellationToken,
    check: impl Fn() -> T + Send + Sync + 'static,
    then: impl Fn(T),
) {
    let check = Arc::new(check);
    loop {
        tokio::select! {
            () = tokio::time::sleep(RELOAD_CHECK) => {}
            () = stop.cancelled() => return,
        }
        let check = check.clone();
        if let Ok(found) = tokio::task::spawn_blocking(move || check()).await {
            then(found);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_and_a_missing_file_are_told_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, "one").unwrap();
        let file = WatchedFile::new(path.clone(), Some(b"one".to_vec()));
        assert!(matches!(file.read(), (false, Ok(t)) if t == b"one"));
        std::fs::write(&path, "two").unwrap();
        assert!(matches!(file.read(), (true, Ok(t)) if t == b"two"));
        assert!(!file.read().0);
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(file.read(), (true, Err(_))));
        assert!(matches!(file.read(), (false, Err(_))));
        std::fs::write(&path, "two").unwrap();
        assert!(matches!(file.read(), (true, Ok(_))));
    }
}
