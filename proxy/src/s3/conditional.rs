//! Conditional requests (If-Match, If-None-Match, If-Modified-Since, If-Unmodified-Since),
//! answered from cached metadata as S3 answers them (RFC 7232 precedence):
//! - If-Match false → 412; otherwise If-Unmodified-Since is considered only without If-Match;
//! - If-None-Match true → 304; otherwise If-Modified-Since is considered only without
//!   If-None-Match.

use std::time::SystemTime;

use http::header::{self, HeaderName};
use http::HeaderMap;

use crate::model::ObjectMeta;
use crate::s3::headers::has_any;

/// The outcome of evaluating a request's conditions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Serve the object.
    Proceed,
    /// 304 Not Modified.
    NotModified,
    /// 412 Precondition Failed.
    PreconditionFailed,
}

/// The headers that make a read conditional.
static CONDITIONS: [HeaderName; 4] = [
    header::IF_MATCH,
    header::IF_NONE_MATCH,
    header::IF_MODIFIED_SINCE,
    header::IF_UNMODIFIED_SINCE,
];

/// Evaluate the request's conditional headers against the object.
pub fn evaluate(headers: &HeaderMap, meta: &ObjectMeta) -> Outcome {
    // Most reads have no conditions: one pass over the request's names says so, where the
    // rules below would look each of the four up.
    if !has_any(headers, &CONDITIONS) {
        return Outcome::Proceed;
    }
    let text = |name: HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    let date = |name: HeaderName| text(name).and_then(|v| httpdate::parse_http_date(v).ok());
    // HTTP dates have one-second resolution; compare at that resolution.
    let modified = meta.last_modified.map(truncate);

    if let Some(if_match) = text(header::IF_MATCH) {
        if !etag_list_matches(if_match, &meta.etag) {
            return Outcome::PreconditionFailed;
        }
    } else if let (Some(since), Some(modified)) = (date(header::IF_UNMODIFIED_SINCE), modified) {
        if modified > since {
            return Outcome::PreconditionFailed;
        }
    }
    if let Some(if_none_match) = text(header::IF_NONE_MATCH) {
        if etag_list_matches(if_none_match, &meta.etag) {
            return Outcome::NotModified;
        }
    } else if let (Some(since), Some(modified)) = (date(header::IF_MODIFIED_SINCE), modified) {
        if modified <= since {
            return Outcome::NotModified;
        }
    }
    Outcome::Proceed
}

fn truncate(t: SystemTime) -> SystemTime {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs)
}

/// Whether a comma-separated list of entity tags (or `*`) names `etag`. Weak tags compare by
/// their opaque part; quotes are optional, as some clients omit them.
fn etag_list_matches(list: &str, etag: &str) -> bool {
    let bare = |t: &str| {
        t.trim()
            .trim_start_matches("W/")
            .trim_matches('"')
            .to_owned()
    };
    let ours = bare(etag);
    list.split(',').any(|t| t.trim() == "*" || bare(t) == ours)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn meta() -> ObjectMeta {
        ObjectMeta {
            size: 1,
            etag: "\"abc\"".into(),
            last_modified: Some(UNIX_EPOCH + Duration::from_millis(1_700_000_000_500)),
            version_id: None,
            headers: vec![],
            checksums: vec![],
            checksums_known: false,
            response_headers: Default::default(),
        }
    }

    fn eval(pairs: &[(&'static str, &str)]) -> Outcome {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        evaluate(&h, &meta())
    }

    #[test]
    fn s3_precedence() {
        let at = "Tue, 14 Nov 2023 22:13:20 GMT";
        let before = "Tue, 14 Nov 2023 22:13:19 GMT";
        assert_eq!(eval(&[]), Outcome::Proceed);
        assert_eq!(eval(&[("if-match", "\"abc\"")]), Outcome::Proceed);
        assert_eq!(eval(&[("if-match", "abc")]), Outcome::Proceed);
        assert_eq!(eval(&[("if-match", "\"x\", \"abc\"")]), Outcome::Proceed);
        assert_eq!(eval(&[("if-match", "*")]), Outcome::Proceed);
        assert_eq!(eval(&[("if-match", "\"x\"")]), Outcome::PreconditionFailed);
        assert_eq!(eval(&[("if-none-match", "\"abc\"")]), Outcome::NotModified);
        assert_eq!(eval(&[("if-none-match", "\"x\"")]), Outcome::Proceed);
        assert_eq!(eval(&[("if-modified-since", at)]), Outcome::NotModified);
        assert_eq!(eval(&[("if-modified-since", before)]), Outcome::Proceed);
        assert_eq!(
            eval(&[("if-unmodified-since", before)]),
            Outcome::PreconditionFailed
        );
        assert_eq!(eval(&[("if-unmodified-since", at)]), Outcome::Proceed);
        // If-Match true wins over If-Unmodified-Since false.
        assert_eq!(
            eval(&[("if-match", "\"abc\""), ("if-unmodified-since", before)]),
            Outcome::Proceed
        );
        // RFC 7232: If-Modified-Since is ignored when If-None-Match is present.
        assert_eq!(
            eval(&[("if-none-match", "\"x\""), ("if-modified-since", at)]),
            Outcome::Proceed
        );
        // An unparseable date is ignored.
        assert_eq!(
            eval(&[("if-modified-since", "yesterday")]),
            Outcome::Proceed
        );
    }
}
