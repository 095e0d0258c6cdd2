//! The headers of a GET or HEAD response, built from cached object metadata.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::model::ObjectMeta;

/// The S3 headers every read looks for or sets, named once. A lookup by `&str` parses and
/// checks the name on every call; a `HeaderName` is parsed here, at compile time.
pub mod names {
    use http::header::HeaderName;

    pub const X_AMZ_REQUEST_ID: HeaderName = HeaderName::from_static("x-amz-request-id");
    pub const X_AMZ_VERSION_ID: HeaderName = HeaderName::from_static("x-amz-version-id");
    pub const X_AMZ_COPY_SOURCE: HeaderName = HeaderName::from_static("x-amz-copy-source");
    pub const X_AMZ_CONTENT_SHA256: HeaderName = HeaderName::from_static("x-amz-content-sha256");
    pub const X_AMZ_DATE: HeaderName = HeaderName::from_static("x-amz-date");
    pub const X_AMZ_SSE: HeaderName = HeaderName::from_static("x-amz-server-side-encryption");
    pub const X_AMZ_SSE_KMS_KEY_ID: HeaderName =
        HeaderName::from_static("x-amz-server-side-encryption-aws-kms-key-id");
    pub const X_AMZ_SSE_CUSTOMER_ALGORITHM: HeaderName =
        HeaderName::from_static("x-amz-server-side-encryption-customer-algorithm");
    pub const X_AMZ_EXPECTED_BUCKET_OWNER: HeaderName =
        HeaderName::from_static("x-amz-expected-bucket-owner");
    pub const X_AMZ_REQUEST_PAYER: HeaderName = HeaderName::from_static("x-amz-request-payer");
    /// Where Larder found the bytes (`hit-memory`, `miss`, ...).
    pub const X_CACHE: HeaderName = HeaderName::from_static("x-cache");
}

/// Headers describing the object itself (not the range): ETag, Last-Modified, Accept-Ranges,
/// version, and everything S3 stored with the object; then the client's `response-*` overrides.
pub fn object_headers(meta: &ObjectMeta, overrides: &[(&'static str, String)]) -> HeaderMap {
    let mut h = HeaderMap::with_capacity(meta.headers.len() + 8);
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    if let Ok(v) = HeaderValue::from_str(&meta.etag) {
        h.insert(header::ETAG, v);
    }
    if let Some(t) = meta.last_modified {
        if let Ok(v) = HeaderValue::from_str(&httpdate::fmt_http_date(t)) {
            h.insert(header::LAST_MODIFIED, v);
        }
    }
    if let Some(v) = meta
        .version_id
        .as_deref()
        .and_then(|v| HeaderValue::from_str(v).ok())
    {
        h.insert(names::X_AMZ_VERSION_ID, v);
    }
    for (name, value) in &meta.headers {
        h.append(name.clone(), value.clone());
    }
    for (name, value) in overrides {
        if let Ok(v) = HeaderValue::from_str(value) {
            h.insert(HeaderName::from_static(name), v);
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn maps_metadata_and_overrides() {
        let meta = ObjectMeta {
            size: 5,
            etag: "\"abc\"".into(),
            last_modified: Some(UNIX_EPOCH + Duration::from_secs(1_700_000_000)),
            version_id: Some("v1".into()),
            headers: vec![
                (
                    HeaderName::from_static("content-type"),
                    HeaderValue::from_static("text/plain"),
                ),
                (
                    HeaderName::from_static("x-amz-meta-colour"),
                    HeaderValue::from_static("blue"),
                ),
            ],
        };
        let h = object_headers(
            &meta,
            &[
                ("content-disposition", "attachment".into()),
                ("content-type", "x/y".into()),
            ],
        );
        assert_eq!(h[header::ETAG], "\"abc\"");
        assert_eq!(h[header::LAST_MODIFIED], "Tue, 14 Nov 2023 22:13:20 GMT");
        assert_eq!(h["x-amz-version-id"], "v1");
        assert_eq!(h["x-amz-meta-colour"], "blue");
        assert_eq!(h[header::CONTENT_TYPE], "x/y");
        assert_eq!(h[header::CONTENT_DISPOSITION], "attachment");
        assert_eq!(h[header::ACCEPT_RANGES], "bytes");
    }
}
