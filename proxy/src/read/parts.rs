//! Where the parts of multipart uploads lie, learnt from the upstream's answers to `partNumber`
//! reads, so that the next read of a part is answered from the cache as the range it is.
//!
//! A `partNumber` GET or HEAD (the AWS SDK for Java's multipart download, any SDK's
//! `PartNumber`) names its bytes by the upload's layout, which neither the object's metadata
//! nor a plain HEAD describes. The first read of a part passes through to the upstream as the
//! client signed it, and the answer says where the part lies (`s3::headers::part_span`): its
//! bytes, the object's ETag and size, the number of parts. A later read of that part, while the
//! object's metadata has the same ETag and size, is a ranged read through the block store;
//! otherwise it passes through again, and the answer is learnt anew. A span is never trusted
//! beyond the object it was learnt from, so a layout forgotten or outdated costs one read
//! passed through, never a wrong byte.
//!
//! In a fleet, where a first read of a part passes through, a place learnt from the upstream
//! is told to the other replicas (`fleet::notify`): each would otherwise pass its own first
//! read of the part through, and the part's bytes would leave the upstream once per replica
//! before the fleet's blocks held them once.

use std::sync::Arc;
use std::time::Duration;

use crate::fleet::notify::Notice;
use crate::fleet::Fleet;
use crate::model::{ObjectId, PartNumber, PartSpan};

/// Most bytes the places of parts take, counted by [`footprint`]: some 100,000 parts of
/// objects with keys of 50 bytes.
pub const PARTS_BYTES: u64 = 16 << 20;

/// How long a part's place is kept unread: an hour, as a job that reads an object by its
/// parts reads them all within minutes.
const PARTS_IDLE: Duration = Duration::from_secs(3600);

/// The parts learnt, by object (and version) and part number; bounded and evicted by moka.
/// Clones share the parts.
#[derive(Clone)]
pub struct PartLayouts {
    spans: moka::sync::Cache<(ObjectId, PartNumber), Arc<PartSpan>>,
    /// The other replicas, told of the parts learnt from the upstream, in a fleet.
    fleet: Option<Arc<Fleet>>,
}

impl Default for PartLayouts {
    fn default() -> Self {
        Self::new(PARTS_BYTES, None)
    }
}

/// What one remembered part takes: its object's names, ETag and the part's checksums, and
/// about 100 bytes of bookkeeping (the span, the entry, moka's own). Keys may be 1,024 bytes
/// long, so a bound on entries alone would not bound the memory.
fn footprint(id: &ObjectId, span: &PartSpan) -> u32 {
    let names = id.bucket.len() + id.key.len() + id.version_id.as_ref().map_or(0, |v| v.len());
    let sums: usize = span
        .checksums
        .iter()
        .map(|(n, v)| n.as_str().len() + v.len())
        .sum();
    u32::try_from(names + span.etag.len() + sums + 100).unwrap_or(u32::MAX)
}

impl PartLayouts {
    /// A store of parts taking at most `bytes` ([`footprint`]), telling `fleet` of the parts
    /// learnt from the upstream.
    pub fn new(bytes: u64, fleet: Option<Arc<Fleet>>) -> Self {
        Self {
            fleet,
            spans: moka::sync::Cache::builder()
                .max_capacity(bytes)
                .weigher(|(id, _), span: &Arc<PartSpan>| footprint(id, span))
                .time_to_idle(PARTS_IDLE)
                .build(),
        }
    }

    /// Where part `part` of `id` lay when last read, if remembered. Check it against the
    /// object's metadata ([`PartSpan::fits`]) before reading by it.
    pub fn get(&self, id: &ObjectId, part: PartNumber) -> Option<Arc<PartSpan>> {
        self.spans.get(&(id.clone(), part))
    }

    /// Remember where the upstream said part `part` of `id` lies, and tell the fleet.
    pub fn learn(&self, id: ObjectId, part: PartNumber, span: PartSpan) {
        let span = Arc::new(span);
        if let Some(fleet) = &self.fleet {
            fleet.notify(Notice::Part {
                object: id.clone(),
                part,
                span: span.clone(),
            });
        }
        self.spans.insert((id, part), span);
    }

    /// Remember where another replica said part `part` of `id` lies (told, not to be told on).
    pub fn learn_from_peer(&self, id: ObjectId, part: PartNumber, span: PartSpan) {
        self.spans.insert((id, part), Arc::new(span));
    }

    /// Forget part `part` of `id` (its object no longer fits it).
    pub fn forget(&self, id: &ObjectId, part: PartNumber) {
        self.spans.invalidate(&(id.clone(), part));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(key: &str) -> ObjectId {
        ObjectId {
            bucket: "b".into(),
            key: key.into(),
            version_id: None,
        }
    }

    #[test]
    fn a_part_is_found_by_its_object_and_number_until_forgotten() {
        let layouts = PartLayouts::default();
        let two = PartNumber::parse("2").expect("a part number");
        let span = PartSpan {
            etag: "\"e-3\"".into(),
            size: 12,
            bytes: 5..10,
            parts_count: Some(3),
            checksums: Vec::new(),
        };
        layouts.learn(id("k"), two, span.clone());
        assert_eq!(layouts.get(&id("k"), two).as_deref(), Some(&span));
        assert_eq!(layouts.get(&id("other"), two), None);
        let one = PartNumber::parse("1").expect("a part number");
        assert_eq!(layouts.get(&id("k"), one), None);
        let version = ObjectId {
            version_id: Some("v1".into()),
            ..id("k")
        };
        assert_eq!(layouts.get(&version, two), None);
        layouts.forget(&id("k"), two);
        assert_eq!(layouts.get(&id("k"), two), None);
    }

    #[test]
    fn long_keys_take_their_length_of_the_bound() {
        let span = PartSpan {
            etag: "\"e-2\"".into(),
            size: 10,
            bytes: 0..5,
            parts_count: Some(2),
            checksums: Vec::new(),
        };
        let (short, long) = (id("k"), id(&"k".repeat(1024)));
        assert_eq!(footprint(&short, &span), 1 + 1 + 5 + 100);
        assert_eq!(footprint(&long, &span), 1 + 1024 + 5 + 100);
        // A bound of 20 KiB holds about 180 parts of short keys, and fewer than 20 of long ones.
        let layouts = PartLayouts::new(20 << 10, None);
        let one = PartNumber::parse("1").expect("a part number");
        for i in 0..100 {
            layouts.learn(id(&format!("{i:0>1024}")), one, span.clone());
        }
        layouts.spans.run_pending_tasks();
        assert!(layouts.spans.weighted_size() <= 20 << 10);
        assert!(
            layouts.spans.entry_count() < 20,
            "{}",
            layouts.spans.entry_count()
        );
    }
}
