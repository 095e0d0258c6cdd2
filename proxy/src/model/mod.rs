//! The shared model of the read path: which object (and version) a request names, what the
//! upstream says about it, the bytes asked of it (and S3's rules for them), and why it failed.
//!
//! Everything else in the crate depends on these types; this module depends on nothing else in
//! the crate, so the upstream client, the S3 front, the fleet and the metrics can all share them
//! without reaching into each other.

mod error;
mod object;
pub mod range;

pub use error::{error_chain, is_throttling_status, BodyStream, UpstreamError, UpstreamOutcome};
pub use object::{ObjectId, ObjectMeta, PartNumber, PartSpan, ResponseHeaders};
pub use range::ByteRange;
