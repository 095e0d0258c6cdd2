//! The read path: how a cached GET finds its bytes, whichever front asked.
//!
//! - [`metadata`]: what the object is (size, ETag, headers), from a cache trusted for
//!   `metadata_ttl`, else one HEAD (or the first GET's own headers, for a cold read).
//! - [`blocks`]: the bytes, block by block: the memory tier, the disk tier, a fetch already in
//!   flight (single-flight), the block's owner in the fleet, or the upstream, pinned to the ETag.
//! - [`prefetch`]: which blocks an in-order reader will want next, read ahead of it.
//! - [`parts`]: where the parts of multipart uploads lie, learnt from `partNumber` reads.
//!
//! Keys come from [`crate::cache_key`]; bytes from outside come from [`crate::upstream`] and
//! [`crate::fleet`].

pub mod blocks;
pub mod listing;
pub mod metadata;
pub mod parts;
pub mod policy;
pub mod prefetch;
