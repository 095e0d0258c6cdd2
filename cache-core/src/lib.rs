//! Larder's cache engine.
//!
//! This crate knows bytes, keys and devices; it knows nothing of HTTP or S3. The proxy
//! composes a cache key from whatever identifies an immutable piece of data (for S3: bucket, key,
//! ETag or version, block index) and uses three pieces from here:
//!
//! - [`BlockLayout`]: how an object of a given size is cut into fixed-size blocks, and which
//!   slices of which blocks make up a byte range;
//! - [`MemoryTier`]: a byte-weighted in-memory cache (moka, TinyLFU admission);
//! - [`SingleFlight`]: concurrent requests for the same missing key share one fetch, and every
//!   waiter receives the bytes as the fetch produces them;
//! - [`disk`]: the disk tier, a block engine on a file or raw device that survives restarts and
//!   verifies every byte it reads;
//! - [`HybridCache`]: memory, then disk, then a single-flight fetch, for in-process use (see
//!   `examples/hybrid.rs`).
#![warn(missing_docs)]

mod block;
pub mod disk;
mod hybrid;
mod memory;
mod single_flight;

pub use block::{BlockLayout, BlockSlice};
pub use disk::{DiskCache, DiskConfig};
pub use hybrid::{CacheKey, FetchError, Fill, HybridCache, Miss, Tier, WritePolicy};
pub use memory::{EvictionHook, MemoryTier, MemoryTierStats};
pub use single_flight::{Abandoned, FlightReader, FlightWriter, Joined, SingleFlight};
