//! Larder: an S3-compatible read-through caching proxy.
//!
//! The path of a GET: [`routes`] (the S3 front) → [`s3`] (addressing, ranges, conditionals,
//! headers, errors) → [`metadata`] (cached HeadObject) → [`blocks`] (block-aligned reads over
//! `cache_core`'s memory tier and single-flight) → [`origin`] (aws-sdk-s3).

pub mod admin;
pub mod auth;
pub mod blocks;
pub mod config;
pub mod demo;
pub mod fleet;
pub mod form_upload;
pub mod metadata;
pub mod metrics;
pub mod origin;
pub mod prefetch;
pub mod routes;
pub mod s3;
pub mod server;
pub mod telemetry;
pub mod tls;
pub mod warm;
