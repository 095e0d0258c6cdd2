//! The S3 protocol as Larder speaks it to clients: addressing, conditionals, headers and errors
//! (byte ranges are in [`crate::model::range`], shared with the upstream side). Nothing here
//! talks to the network.

pub mod conditional;
pub mod copy_source;
pub mod error;
pub mod form;
pub mod headers;
pub mod operation;
pub mod query;
pub mod request;

pub use error::S3Error;
