//! Larder: an S3-compatible read-through caching proxy.
//!
//! Dependencies run one way, from the fronts down to the shared model:
//!
//! ```text
//! front/     listeners and what they answer: S3 routes, form uploads, admin, the fleet's peer port
//!   ├─ auth/       who sent a request and what its signature covers
//!   │    └─ qos/       what one key may take: requests a second, bytes a second
//!   ├─ warm/       warm-up jobs (and the `larder warm` command)
//!   └─ read/       the read path: metadata, then blocks from memory | disk | flight | peer | upstream
//!        ├─ cache_key   the cache-key schema, in one place
//!        ├─ fleet/      which replica owns a block, and the client that asks it
//!        └─ upstream/   the upstream S3 API (signed HTTP), hedging, and the pass-through forwarder
//! s3/        the S3 protocol: addressing, ranges, conditionals, headers, errors
//! telemetry/ metrics (with dollar costs), logs and traces
//! model/     object identity, metadata, spans and upstream errors: depends on nothing here
//! config     every option, with its default
//! units      sizes and durations as people write them: depends on nothing here
//! ```
//!
//! A cached GET: [`front::routes`] authenticates ([`auth`]) and parses the request ([`s3`]), asks
//! [`read::metadata`] for the object's size and ETag, then streams [`read::blocks`], which finds
//! each block under its [`cache_key`] in `cache_core`'s tiers or fetches it once from the
//! block's owner ([`fleet`]) or the [`upstream`].
#![forbid(unsafe_code)]

pub mod auth;
pub mod cache_key;
pub mod config;
pub mod fleet;
pub mod freshness;
pub mod front;
pub mod model;
pub mod qos;
pub mod read;
pub mod reload;
pub mod s3;
pub mod telemetry;
pub mod trust;
pub mod units;
pub mod upstream;
pub mod warm;
