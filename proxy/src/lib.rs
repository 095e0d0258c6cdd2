//! Larder: an S3-compatible read-through caching proxy.
//!
//! The path of a GET: [`routes`] (the S3 front) → [`s3`] (addressing, ranges, conditionals,
//! headers, errors) → [`metadata`] (cached HeadObject) → [`blocks`] (block-aligned reads over
//! `cache_core`'s memory tier and single-flight) → [`origin`] (aws-sdk-s3).

pub mod auth;
pub mod blocks;
pub mod cache_key;
pub mod config;
pub mod demo;
pub mod fleet;
pub mod front;
pub mod metadata;
pub mod metrics;
pub mod model;
pub mod origin;
pub mod prefetch;
pub mod s3;
pub mod telemetry;
pub mod warm;
