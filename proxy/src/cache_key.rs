//! The cache-key schema, in one place: which bytes a cached block may be served for.
//!
//! A block is cached under (bucket, key, ETag, block size, index). A part of a block fetched on
//! its own (a cold range much smaller than its block) is cached under its block's key and its
//! span within the block. The ETag names the bytes
//! (every upstream fetch carries `If-Match: <ETag>`, so a block only ever holds bytes of the
//! version its key names); the block size names the geometry (block 3 of 4 MiB blocks is other
//! bytes than block 3 of 8 MiB blocks). The disk partition a bucket is cached in is decided
//! here too. A wrong key is cache poisoning, so nothing else builds one.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::sync::{Arc, OnceLock};

use cache_core::{BlockLayout, CacheKey};

use crate::model::ObjectId;

/// The partition of buckets no rule names.
const DEFAULT_PARTITION: &str = "default";

/// Builds every block's key: the layout objects are cut by and the disk partition of each
/// bucket.
#[derive(Debug, Clone)]
pub struct KeySchema {
    layout: BlockLayout,
    bucket_partitions: HashMap<String, Arc<str>>,
    default_partition: Arc<str>,
}

impl KeySchema {
    /// Keys for blocks cut by `layout`, with `bucket_partitions` (bucket → disk partition;
    /// other buckets go to `default`).
    pub fn new(layout: BlockLayout, bucket_partitions: HashMap<String, String>) -> Self {
        Self {
            layout,
            bucket_partitions: bucket_partitions
                .into_iter()
                .map(|(b, p)| (b, Arc::from(p)))
                .collect(),
            default_partition: Arc::from(DEFAULT_PARTITION),
        }
    }

    /// The key of block `index` of `object` at `etag`.
    pub fn block(&self, object: &ObjectId, etag: &Arc<str>, index: u64) -> BlockId {
        let partition = self
            .bucket_partitions
            .get(object.bucket.as_ref())
            .unwrap_or(&self.default_partition)
            .clone();
        BlockId::new(object, etag, &self.layout, index, partition)
    }

    /// The key of bytes `span` (relative to the block's start) of block `index` of `object` at
    /// `etag`: a part fetched on its own, never served for any other span.
    pub fn part(
        &self,
        object: &ObjectId,
        etag: &Arc<str>,
        index: u64,
        span: std::ops::Range<u64>,
    ) -> BlockId {
        let block = self.block(object, etag, index);
        BlockId::keyed(BlockId {
            part: Some((span.start, span.end)),
            ..block
        })
    }

    /// How objects are cut into blocks.
    pub fn layout(&self) -> &BlockLayout {
        &self.layout
    }
}

/// The cache key of one block of one version of an object.
///
/// Its hash is computed once, when the id is made: a hit looks its id up several times (where
/// the block is, then its bytes; each hashes the id), and hashing the bucket, key and ETag each
/// time cost about 2 % of a small memory hit's instructions. The hash is SipHash with this
/// process's random keys over every field the id is compared by, so what a client names cannot
/// steer ids into one bucket of a table, and equal ids always hash alike.
#[derive(Debug, Clone)]
pub struct BlockId {
    bucket: Arc<str>,
    key: Arc<str>,
    etag: Arc<str>,
    index: u64,
    /// The block size the object was cut by: block `index` of 4 MiB blocks is other bytes than
    /// block `index` of 8 MiB blocks, so a disk tier kept across a change of `block_size` must
    /// never answer one for the other.
    block_size: u64,
    /// Disk partition of the bucket (a function of `bucket`, so it changes nothing in equality).
    partition: Arc<str>,
    /// For a part of the block, its span within the block; `None` for the whole block.
    part: Option<(u64, u64)>,
    /// The hash of the fields above but `partition` (a function of `bucket`); set by
    /// [`BlockId::keyed`], which every constructor ends with.
    hash: u64,
}

/// The keys of every id's hash, drawn once per process.
fn id_hasher() -> &'static RandomState {
    static KEYS: OnceLock<RandomState> = OnceLock::new();
    KEYS.get_or_init(RandomState::new)
}

impl BlockId {
    /// The key of block `index` of `object` at `etag`, cut by `layout`, cached in disk
    /// partition `partition`. The version id is deliberately not part of the key: an ETag names
    /// the bytes, and `If-Match` pins every fetch to it.
    fn new(
        object: &ObjectId,
        etag: &Arc<str>,
        layout: &BlockLayout,
        index: u64,
        partition: Arc<str>,
    ) -> Self {
        Self::keyed(Self {
            bucket: object.bucket.clone(),
            key: object.key.clone(),
            etag: etag.clone(),
            index,
            block_size: layout.block_size(),
            partition,
            part: None,
            hash: 0,
        })
    }

    /// `id` with its hash computed from its fields.
    fn keyed(mut id: Self) -> Self {
        id.hash = id_hasher().hash_one((
            &*id.bucket,
            &*id.key,
            &*id.etag,
            id.index,
            id.block_size,
            id.part,
        ));
        id
    }
}

impl PartialEq for BlockId {
    /// The hash first: ids that differ almost always differ there, without comparing text.
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash
            && self.index == other.index
            && self.block_size == other.block_size
            && self.part == other.part
            && self.etag == other.etag
            && self.key == other.key
            && self.bucket == other.bucket
    }
}

impl Eq for BlockId {}

impl Hash for BlockId {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl CacheKey for BlockId {
    /// Length-prefixed fields, so no choice of bucket, key or ETag can make two ids collide.
    fn disk_key(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(40 + self.bucket.len() + self.key.len() + self.etag.len());
        // Schema 2 adds the block size; entries of schema 1 (no geometry) are never matched.
        // A part has a schema tag of its own and its span after the index.
        out.extend_from_slice(if self.part.is_some() {
            b"s3p2"
        } else {
            b"s3b2"
        });
        for part in [&self.bucket, &self.key, &self.etag] {
            out.extend_from_slice(&(part.len() as u32).to_le_bytes());
            out.extend_from_slice(part.as_bytes());
        }
        out.extend_from_slice(&self.block_size.to_le_bytes());
        out.extend_from_slice(&self.index.to_le_bytes());
        if let Some((from, to)) = self.part {
            out.extend_from_slice(&from.to_le_bytes());
            out.extend_from_slice(&to.to_le_bytes());
        }
        out
    }

    fn partition(&self) -> &str {
        &self.partition
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(block_size: u64) -> KeySchema {
        KeySchema::new(BlockLayout::new(block_size), HashMap::new())
    }

    fn object() -> ObjectId {
        ObjectId {
            bucket: "b".into(),
            key: "k".into(),
            version_id: None,
        }
    }

    #[test]
    fn a_part_is_never_its_block_nor_another_part() {
        let (s, o, etag): (_, _, Arc<str>) = (schema(4096), object(), "\"e\"".into());
        let block = s.block(&o, &etag, 1);
        let part = s.part(&o, &etag, 1, 0..100);
        let keys = [
            block.disk_key(),
            part.disk_key(),
            s.part(&o, &etag, 1, 0..101).disk_key(),
            s.part(&o, &etag, 1, 1..100).disk_key(),
            s.part(&o, &etag, 2, 0..100).disk_key(),
            s.part(&o, &"\"f\"".into(), 1, 0..100).disk_key(),
            schema(8192).part(&o, &etag, 1, 0..100).disk_key(),
        ];
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_ne!(block, part);
        assert_eq!(part, s.part(&o, &etag, 1, 0..100));
        assert_eq!(part.partition(), block.partition());
    }

    /// The hash is made once per id: equal ids must hash alike, and a part (made from its
    /// block's id) must get a hash of its own, or every part of a block would share one slot.
    #[test]
    fn ids_hash_by_every_field_they_are_compared_by() {
        let (s, o, etag): (_, _, Arc<str>) = (schema(4096), object(), "\"e\"".into());
        let hasher = RandomState::new();
        let h = |id: &BlockId| hasher.hash_one(id);
        let other_key = ObjectId {
            key: "k2".into(),
            ..object()
        };
        let ids = [
            s.block(&o, &etag, 1),
            s.block(&o, &etag, 2),
            s.block(&o, &"\"f\"".into(), 1),
            s.block(&other_key, &etag, 1),
            schema(8192).block(&o, &etag, 1),
            s.part(&o, &etag, 1, 0..100),
            s.part(&o, &etag, 1, 0..101),
        ];
        for (i, a) in ids.iter().enumerate() {
            assert_eq!(h(a), h(&a.clone()));
            for b in &ids[i + 1..] {
                assert_ne!(a, b);
                assert_ne!(h(a), h(b), "{a:?} and {b:?}");
            }
        }
        assert_eq!(h(&s.block(&o, &etag, 1)), h(&ids[0]));
        assert_eq!(h(&s.part(&o, &etag, 1, 0..100)), h(&ids[5]));
    }
}
