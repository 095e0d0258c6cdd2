//! What requests and bytes cost: S3's billing classes and the prices the cost counters use.

use crate::s3::operation::Operation;

/// The S3 billing classes a request falls in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestClass {
    /// GET, HEAD, SELECT and every request not named below.
    Get,
    /// PUT, COPY, POST and LIST.
    Put,
    /// DELETE and CANCEL (AbortMultipartUpload) are free, as are requests Larder refuses.
    Free,
}

impl RequestClass {
    /// The class `operation` is billed in.
    pub fn of(operation: Operation) -> Self {
        use Operation as O;
        match operation {
            O::GetObject
            | O::HeadObject
            | O::HeadBucket
            | O::GetObjectAttributes
            | O::BucketOther
            | O::ObjectOther => RequestClass::Get,
            O::ListBuckets
            | O::ListObjectsV2
            | O::ListMultipartUploads
            | O::ListObjectVersions
            | O::ListObjects
            | O::ListParts
            | O::CreateBucket
            | O::PutObject
            | O::PostObject
            | O::CopyObject
            | O::UploadPart
            | O::UploadPartCopy
            | O::CreateMultipartUpload
            | O::CompleteMultipartUpload => RequestClass::Put,
            O::DeleteBucket
            | O::DeleteObjects
            | O::DeleteObject
            | O::AbortMultipartUpload
            | O::Unauthenticated
            | O::Unknown => RequestClass::Free,
        }
    }
}

/// What S3 charges, for the cost metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prices {
    /// Dollars per GET-class request.
    pub get_request: f64,
    /// Dollars per PUT-class request.
    pub put_request: f64,
    /// Dollars per byte moved between S3 and its reader.
    pub transfer_byte: f64,
}

impl Prices {
    pub(super) fn request(&self, class: RequestClass) -> f64 {
        match class {
            RequestClass::Get => self.get_request,
            RequestClass::Put => self.put_request,
            RequestClass::Free => 0.0,
        }
    }
}

impl Default for Prices {
    /// S3 Standard in us-east-1, transfer within the region (free); see docs/observability.md.
    fn default() -> Self {
        Self {
            get_request: 0.0004 / 1000.0,
            put_request: 0.005 / 1000.0,
            transfer_byte: 0.0,
        }
    }
}
