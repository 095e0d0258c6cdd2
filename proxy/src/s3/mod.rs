//! The S3 protocol as Larder speaks it to clients: addressing, ranges, conditionals, headers and
//! errors. Nothing here talks to the network.

pub mod conditional;
pub mod copy_source;
pub mod error;
pub mod form;
pub mod headers;
pub mod range;
pub mod request;

pub use error::S3Error;
