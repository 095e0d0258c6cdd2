//! Which blocks of which object versions responses are reading now, so that a block fetched for
//! one of them is known to be wanted by the others too.
//!
//! A herd reading one large object (a checkpoint loaded by many workers, each a little behind
//! the one before) shares a block's fetch only among the readers that reach the block while it
//! is fetched. The readers behind come after, and find the block where the cache put it: in
//! memory if its admission took it, else on disk if the disk's `second-hit` admission did. That
//! admission writes a block read again, and a block fetched for one reader with the others
//! still to come looked read once: it was turned away, and each reader behind fetched it a
//! second time (docs/benchmarks.md, "A herd's blocks count as read again"). A block some other
//! response in progress will also read is read again, and is committed as such.
//!
//! Only responses of more than one block register: a lock and a map entry each, nothing for the
//! small hits whose cost per request is counted in nanoseconds. The map holds one entry per
//! response in progress, dropped with the response.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::model::ObjectId;

/// An object version: the object and its ETag.
type Version = (ObjectId, Arc<str>);
/// Each response's id and the blocks (indexes) it covers.
type Covering = Vec<(u64, Range<u64>)>;

/// Responses in progress by object version: each one's id and the blocks it covers.
#[derive(Default)]
pub(super) struct Reading {
    responses: Mutex<HashMap<Version, Covering>>,
    next: AtomicU64,
}

/// A response's place in [`Reading`], given up when dropped (with the response's stream).
pub(super) struct Entered {
    reading: Arc<Reading>,
    version: Version,
    id: u64,
}

impl Reading {
    /// Note that a response reads `blocks` (indexes) of `object` at `etag` until the returned
    /// guard is dropped.
    pub(super) fn enter(
        self: &Arc<Self>,
        object: &ObjectId,
        etag: &Arc<str>,
        blocks: Range<u64>,
    ) -> Entered {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let version = (object.clone(), etag.clone());
        self.responses
            .lock()
            .entry(version.clone())
            .or_default()
            .push((id, blocks));
        Entered {
            reading: self.clone(),
            version,
            id,
        }
    }

    /// Whether more than one response in progress covers block `index` of `object` at `etag`:
    /// the block is read again, whichever of them it was fetched for.
    pub(super) fn shared(&self, object: &ObjectId, etag: &Arc<str>, index: u64) -> bool {
        let responses = self.responses.lock();
        // The key is cloned to look it up (three `Arc`s and the ETag's): cheaper to write than
        // a borrowed key type, and paid once per block fetched, not per hit.
        let Some(readers) = responses.get(&(object.clone(), etag.clone())) else {
            return false;
        };
        readers
            .iter()
            .filter(|(_, blocks)| blocks.contains(&index))
            .nth(1)
            .is_some()
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        let mut responses = self.reading.responses.lock();
        if let Some(readers) = responses.get_mut(&self.version) {
            readers.retain(|(id, _)| *id != self.id);
            if readers.is_empty() {
                responses.remove(&self.version);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_shared_while_two_responses_of_its_version_cover_it() {
        let reading = Arc::new(Reading::default());
        let (ckpt, etag) = (ObjectId::in_test_bucket("ckpt"), Arc::<str>::from("e1"));
        let first = reading.enter(&ckpt, &etag, 0..64);
        assert!(!reading.shared(&ckpt, &etag, 10), "one reader");
        let second = reading.enter(&ckpt, &etag, 0..64);
        assert!(reading.shared(&ckpt, &etag, 10));
        // Another version, another object, a block neither covers: not shared.
        assert!(!reading.shared(&ckpt, &Arc::from("e2"), 10));
        assert!(!reading.shared(&ObjectId::in_test_bucket("other"), &etag, 10));
        assert!(!reading.shared(&ckpt, &etag, 64));
        // Two ranges that do not overlap (two queries' column chunks) share nothing.
        drop(second);
        let _far = reading.enter(&ckpt, &etag, 40..48);
        assert!(!reading.shared(&ckpt, &etag, 10));
        assert!(reading.shared(&ckpt, &etag, 41));
        drop(first);
        assert!(!reading.shared(&ckpt, &etag, 41));
        drop(_far);
        assert!(reading.responses.lock().is_empty(), "nothing left behind");
    }
}
