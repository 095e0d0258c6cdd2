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

use std::sync::Arc;
use std::time::Duration;

use crate::model::{ObjectId, PartNumber, PartSpan};

/// Most parts whose place is remembered (about 200 bytes each, so at most some 13 MiB).
pub const PARTS_REMEMBERED: u64 = 65_536;

/// How long a part's place is kept unread: an hour, as a job that reads an object by its
/// parts reads them all within minutes.
const PARTS_IDLE: Duration = Duration::from_secs(3600);

/// The parts learnt, by object (and version) and part number; bounded and evicted by moka.
pub struct PartLayouts {
    spans: moka::sync::Cache<(ObjectId, PartNumber), Arc<PartSpan>>,
}

impl Default for PartLayouts {
    fn default() -> Self {
        Self::new(PARTS_REMEMBERED)
    }
}

impl PartLayouts {
    /// A store of at most `capacity` parts.
    pub fn new(capacity: u64) -> Self {
        Self {
            spans: moka::sync::Cache::builder()
                .max_capacity(capacity)
                .time_to_idle(PARTS_IDLE)
                .build(),
        }
    }

    /// Where part `part` of `id` lay when last read, if remembered. Check it against the
    /// object's metadata ([`PartSpan::fits`]) before reading by it.
    pub fn get(&self, id: &ObjectId, part: PartNumber) -> Option<Arc<PartSpan>> {
        self.spans.get(&(id.clone(), part))
    }

    /// Remember where the upstream said part `part` of `id` lies.
    pub fn learn(&self, id: ObjectId, part: PartNumber, span: PartSpan) {
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
}
