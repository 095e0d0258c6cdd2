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
use std::sync::Arc;

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
        BlockId {
            part: Some((span.start, span.end)),
            ..self.block(object, etag, index)
        }
    }

    /// How objects are cut into blocks.
    pub fn layout(&self) -> &BlockLayout {
        &self.layout
    }
}

/// The cache key of one block of one version of an object.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
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
        Self {
            bucket: object.bucket.clone(),
            key: object.key.clone(),
            etag: etag.clone(),
            index,
            block_size: layout.block_size(),
            partition,
            part: None,
        }
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
}
