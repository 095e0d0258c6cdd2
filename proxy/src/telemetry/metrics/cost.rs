//! What requests and bytes cost: S3's billing classes and the prices the cost counters use.

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
    /// The class of an operation, as the S3 front names it (`GetObject`, `ListObjectsV2`...).
    pub fn of(operation: &str) -> Self {
        const PUT: [&str; 7] = [
            "List",
            "Put",
            "Post",
            "Copy",
            "Create",
            "Complete",
            "UploadPart",
        ];
        if PUT.iter().any(|p| operation.starts_with(p)) {
            RequestClass::Put
        } else if operation.starts_with("Delete")
            || matches!(
                operation,
                "AbortMultipartUpload" | "Unauthenticated" | "Unknown"
            )
        {
            RequestClass::Free
        } else {
            RequestClass::Get
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
