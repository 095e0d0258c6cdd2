//! Larder's cache engine.
//!
//! This crate knows bytes, keys and devices; it knows nothing of HTTP or S3. An application
//! names immutable pieces of data with a [`CacheKey`] (the proxy: bucket, key, ETag, block size
//! and index) and reads them through one type:
//!
//! - [`HybridCache`]: memory, then disk, then one fetch per key however many callers want it.
//!   [`HybridCache::get_or_fetch`] for whole values; [`HybridCache::join`] for streaming: a miss
//!   gives its fetcher a [`Fill`] that hands each chunk to every waiter as it arrives, then
//!   stores the value (or not) as the fetcher decides. Errors are the application's own type.
//!   `examples/hybrid.rs` is a whole program.
//!
//! Its parts are public for applications that compose their own:
//!
//! - [`BlockLayout`]: how an object of a given size is cut into fixed-size blocks, and which
//!   slices of which blocks make up a byte range;
//! - [`MemoryTier`]: a byte-weighted in-memory cache (moka, TinyLFU admission);
//! - [`SingleFlight`]: the one-fetch-per-key table under [`HybridCache::join`];
//! - [`disk`]: the disk tier, a block engine on a file or raw device that survives restarts and
//!   verifies every byte it reads, with its I/O engine behind a trait ([`disk::IoEngine`]).
//!
//! Feature `serde`: the configuration enums (engine, admission, recovery, write policy)
//! serialize and deserialize with kebab-case names.
#![warn(missing_docs)]

mod block;
pub mod buffers;
pub mod disk;
mod hybrid;
mod memory;
mod single_flight;

pub use block::{BlockLayout, BlockSlice};
pub use disk::{DiskCache, DiskConfig};
pub use hybrid::{CacheKey, FetchError, Fill, HybridCache, Miss, Tier, WritePolicy};
pub use memory::{EvictionHook, MemoryTier, MemoryTierStats};
pub use single_flight::{Abandoned, FlightReader, FlightWriter, Joined, SingleFlight};
