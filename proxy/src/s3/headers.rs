//! The headers of a GET or HEAD response, built from cached object metadata.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::StatusCode;

use crate::model::{ObjectMeta, PartSpan};

/// The S3 headers every read looks for or sets, named once. A lookup by `&str` parses and
/// checks the name on every call; a `HeaderName` is parsed here, at compile time.
pub mod names {
    use http::header::HeaderName;

    pub const X_AMZ_REQUEST_ID: HeaderName = HeaderName::from_static("x-amz-request-id");
    pub const X_AMZ_VERSION_ID: HeaderName = HeaderName::from_static("x-amz-version-id");
    pub const X_AMZ_CHECKSUM_MODE: HeaderName = HeaderName::from_static("x-amz-checksum-mode");
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
    /// How many parts a multipart upload has, with a `partNumber` read's answer.
    pub const X_AMZ_MP_PARTS_COUNT: HeaderName = HeaderName::from_static("x-amz-mp-parts-count");
    /// Where Larder found the bytes (`hit-memory`, `miss`, ...).
    pub const X_CACHE: HeaderName = HeaderName::from_static("x-cache");
}

/// `value`, marked never to be indexed by HTTP/2's header compression (HPACK), for values new
/// in nearly every response: request ids, `Content-Range`. Indexed, each response's new value
/// went into the connection's header table: the table filled with old ones (about 60 request
/// ids in its 4 KiB), each response compared its value with all of them before adding its
/// own, and the stable headers (ETag, `x-cache`, ...) were pushed out. HTTP/1.1 ignores the
/// mark.
pub fn never_indexed(mut value: HeaderValue) -> HeaderValue {
    value.set_sensitive(true);
    value
}

/// The `x-amz-request-id` value of a response ([`never_indexed`]).
pub fn request_id(id: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(id).ok().map(never_indexed)
}

/// Where the part lies that the upstream answered a `partNumber` GET or HEAD with: a 206 whose
/// `Content-Range` (`bytes <first>-<last>/<size>`) names the part's bytes, with the object's
/// ETag and, for a multipart object, `x-amz-mp-parts-count`; and the part's checksums when
/// the read asked for them and the upload stored them. `None` for any other answer
/// (an error, a 200, a malformed or empty range, a length that disagrees with it).
pub fn part_span(status: StatusCode, headers: &HeaderMap) -> Option<PartSpan> {
    if status != StatusCode::PARTIAL_CONTENT {
        return None;
    }
    let text = |name| {
        headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
    };
    let (first, rest) = text(header::CONTENT_RANGE)?
        .strip_prefix("bytes ")?
        .split_once('-')?;
    let (last, size) = rest.split_once('/')?;
    let number = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| s.parse().ok())?
    };
    let (first, last, size): (u64, u64, u64) = (number(first)?, number(last)?, number(size)?);
    if first > last || last >= size {
        return None;
    }
    let bytes = first..last + 1;
    if text(header::CONTENT_LENGTH).is_some_and(|v| v.parse() != Ok(bytes.end - bytes.start)) {
        return None;
    }
    let parts_count = match text(names::X_AMZ_MP_PARTS_COUNT) {
        Some(v) => Some(v.parse().ok()?),
        None => None,
    };
    Some(PartSpan {
        etag: Arc::from(text(header::ETAG)?),
        size,
        bytes,
        parts_count,
        checksums: checksums(headers),
    })
}

/// Headers describing the object itself (not the range): ETag, Last-Modified, Accept-Ranges,
/// version, and everything S3 stored with the object; then the client's `response-*` overrides.
/// The first four and S3's are made once per metadata entry and copied for each response.
pub fn object_headers(meta: &ObjectMeta, overrides: &[(&'static str, String)]) -> HeaderMap {
    let mut h = meta
        .response_headers
        .get_or_make(|| stored_headers(meta))
        .clone();
    for (name, value) in overrides {
        if let Ok(v) = HeaderValue::from_str(value) {
            h.insert(HeaderName::from_static(name), v);
        }
    }
    h
}

/// The headers a response answered from `meta` starts with, whatever the request asked.
fn stored_headers(meta: &ObjectMeta) -> HeaderMap {
    // Room for what each response adds (length, range, request id, X-Cache, overrides): a
    // copy keeps the hash table's size, so adding them does not rebuild it.
    let mut h = HeaderMap::with_capacity(meta.headers.len() + 8);
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    if let Ok(v) = HeaderValue::from_str(&meta.etag) {
        h.insert(header::ETAG, v);
    }
    if let Some(v) = meta.last_modified.and_then(http_date) {
        h.insert(header::LAST_MODIFIED, v);
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
    // Kept as a copy: a copy's entries take only the room they fill (about 110 bytes each),
    // where the map made with room for the additions holds room for 12 or more. Every cached
    // entry keeps one once it has answered (docs/operations.md).
    h.clone()
}

/// The checksums S3 stores and sends back when asked (`x-amz-checksum-mode`), with the kind of
/// checksum they are (`FULL_OBJECT` or `COMPOSITE`, a multipart upload's).
const CHECKSUM_HEADERS: [HeaderName; 6] = [
    HeaderName::from_static("x-amz-checksum-crc32"),
    HeaderName::from_static("x-amz-checksum-crc32c"),
    HeaderName::from_static("x-amz-checksum-crc64nvme"),
    HeaderName::from_static("x-amz-checksum-sha1"),
    HeaderName::from_static("x-amz-checksum-sha256"),
    HeaderName::from_static("x-amz-checksum-type"),
];

/// The checksum headers of an upstream answer ([`CHECKSUM_HEADERS`]): of the whole object with
/// a whole object, of the part with a part.
pub fn checksums(headers: &HeaderMap) -> Vec<(HeaderName, HeaderValue)> {
    CHECKSUM_HEADERS
        .iter()
        .filter_map(|name| Some((name.clone(), headers.get(name)?.clone())))
        .collect()
}

/// Whether a GET or HEAD asks for the object's checksums (`x-amz-checksum-mode: ENABLED`, the
/// one value S3 defines), which S3 then sends with the whole object, never with a range.
pub fn wants_checksums(headers: &HeaderMap) -> bool {
    // One pass over the request's few names, as [`has_any`]: a lookup by name hashes this
    // long one first (249 instructions of a small hit; docs/benchmarks.md).
    headers
        .iter()
        .any(|(name, value)| *name == names::X_AMZ_CHECKSUM_MODE && value == "ENABLED")
}

/// Whether `headers` has any of `names`. One pass over the request's names, compared as they
/// are: a request carries a handful, and looking each of `names` up would hash every one of
/// them (some as long as `x-amz-server-side-encryption-customer-algorithm`) on every hit.
pub fn has_any(headers: &HeaderMap, names: &[HeaderName]) -> bool {
    headers.keys().any(|name| names.contains(name))
}

/// `at` as an HTTP date (IMF-fixdate: `Sun, 06 Nov 1994 08:49:37 GMT`), written straight into
/// its header value. It is written on every response; `httpdate`'s `Display` through a
/// `String`, then copied into the value, cost about three times as much (docs/benchmarks.md).
/// `None` outside the years 1970 to 9999, which an HTTP date cannot say (`httpdate` panics).
pub fn http_date(at: SystemTime) -> Option<HeaderValue> {
    const WEEKDAYS: [&[u8; 3]; 7] = [b"Thu", b"Fri", b"Sat", b"Sun", b"Mon", b"Tue", b"Wed"];
    const MONTHS: [&[u8; 3]; 12] = [
        b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
        b"Dec",
    ];
    let secs = at.duration_since(UNIX_EPOCH).ok()?.as_secs();
    if secs > 253_402_300_799 {
        return None;
    }
    let days = secs / 86_400;
    let (year, month, day) = civil_from_days(days);
    let in_day = secs % 86_400;
    let mut out = *b"Thu, 01 Jan 1970 00:00:00 GMT";
    // 1970-01-01 was a Thursday.
    out[0..3].copy_from_slice(WEEKDAYS[(days % 7) as usize]);
    digits(&mut out[5..7], day);
    out[8..11].copy_from_slice(MONTHS[month as usize - 1]);
    digits(&mut out[12..16], year);
    digits(&mut out[17..19], in_day / 3600);
    digits(&mut out[20..22], in_day / 60 % 60);
    digits(&mut out[23..25], in_day % 60);
    HeaderValue::from_bytes(&out).ok()
}

/// `n`'s last `to.len()` decimal digits, zero-padded.
fn digits(to: &mut [u8], mut n: u64) {
    for d in to.iter_mut().rev() {
        *d = b'0' + (n % 10) as u8;
        n /= 10;
    }
}

/// Year, month (1 to 12) and day (1 to 31) of the day `days` after 1970-01-01, in the proleptic
/// Gregorian calendar (Howard Hinnant's `civil_from_days`, for days on or after the epoch).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn answer(pairs: &[(&str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(n, v)| {
                (
                    HeaderName::from_bytes(n.as_bytes()).expect("a header name"),
                    HeaderValue::from_str(v).expect("a header value"),
                )
            })
            .collect()
    }

    #[test]
    fn checksums_are_wanted_only_when_the_mode_is_enabled() {
        let asked = |pairs: &[(&str, &str)]| wants_checksums(&answer(pairs));
        assert!(asked(&[("x-amz-checksum-mode", "ENABLED")]));
        assert!(asked(&[
            ("host", "h"),
            ("range", "bytes=0-1"),
            ("x-amz-checksum-mode", "ENABLED"),
            ("x-amz-date", "20261203T000000Z"),
        ]));
        assert!(!asked(&[("host", "h"), ("x-amz-date", "20261203T000000Z")]));
        // The one value S3 defines, as it spells it.
        assert!(!asked(&[("x-amz-checksum-mode", "DISABLED")]));
        assert!(!asked(&[("x-amz-checksum-mode", "enabled")]));
        assert!(!asked(&[("x-amz-checksum-type", "ENABLED")]));
    }

    #[test]
    fn a_part_is_where_the_upstreams_206_puts_it() {
        let part = [
            ("content-range", "bytes 5242880-10485759/12582912"),
            ("content-length", "5242880"),
            ("etag", "\"ee16-3\""),
            ("x-amz-mp-parts-count", "3"),
        ];
        let span = part_span(StatusCode::PARTIAL_CONTENT, &answer(&part)).expect("a part");
        assert_eq!(span.bytes, 5_242_880..10_485_760);
        assert_eq!((span.size, span.parts_count), (12_582_912, Some(3)));
        assert_eq!(&*span.etag, "\"ee16-3\"");
        assert!(span.checksums.is_empty());
        // The part's own checksum, when the read asked for it.
        let mut summed = answer(&part);
        summed.insert("x-amz-checksum-crc32", HeaderValue::from_static("y9qhSw=="));
        let span = part_span(StatusCode::PARTIAL_CONTENT, &summed).expect("a part");
        assert_eq!(span.checksums.len(), 1);
        assert_eq!(span.checksums[0].1, "y9qhSw==");
        // An object uploaded whole: its one part, and no count.
        let whole = [("content-range", "bytes 0-999/1000"), ("etag", "\"e\"")];
        let span = part_span(StatusCode::PARTIAL_CONTENT, &answer(&whole)).expect("a part");
        assert_eq!((span.bytes, span.parts_count), (0..1000, None));
        assert_eq!(part_span(StatusCode::OK, &answer(&part)), None);
        for (name, bad) in [
            ("content-range", "bytes 10-9/100"),
            ("content-range", "bytes 0-100/100"),
            ("content-range", "bytes 0--1/0"),
            ("content-range", "bytes */100"),
            ("content-range", "bytes +0-9/100"),
            ("content-length", "5242881"),
            ("x-amz-mp-parts-count", "three"),
        ] {
            let mut headers = answer(&part);
            headers.insert(
                HeaderName::from_bytes(name.as_bytes()).expect("a header name"),
                HeaderValue::from_static(bad),
            );
            assert_eq!(
                part_span(StatusCode::PARTIAL_CONTENT, &headers),
                None,
                "{bad}"
            );
        }
        let mut no_etag = answer(&part);
        no_etag.remove(header::ETAG);
        assert_eq!(part_span(StatusCode::PARTIAL_CONTENT, &no_etag), None);
    }

    /// Unmarked, HTTP/2 would add every response's id to its connection's header table.
    #[test]
    fn request_ids_are_never_indexed() {
        let v = request_id("0123456789ABCDEF").expect("hex digits are a header value");
        assert!(v.is_sensitive());
        assert_eq!(v, "0123456789ABCDEF");
    }

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
            checksums: vec![],
            checksums_known: false,
            response_headers: Default::default(),
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

        // The headers made once are the object's own: one response's overrides do not stay
        // for the next.
        let again = object_headers(&meta, &[]);
        assert_eq!(again[header::CONTENT_TYPE], "text/plain");
        assert!(!again.contains_key(header::CONTENT_DISPOSITION));
        assert_eq!(again, object_headers(&meta, &[]));
        // A copy with other fields answers with its own, not with what its original made.
        let changed = ObjectMeta {
            etag: "\"def\"".into(),
            ..meta.clone()
        };
        assert_eq!(object_headers(&changed, &[])[header::ETAG], "\"def\"");
        assert_eq!(object_headers(&meta, &[])[header::ETAG], "\"abc\"");
    }

    #[test]
    fn http_dates_are_written_as_httpdate_writes_them() {
        let mut secs: u64 = 0;
        let mut checked = 0;
        // Edges (leap days, centuries, the last second of 9999), then a walk over the range
        // with a stride that lands on every time of day and day of the week.
        let edges = [
            0,
            68_169_599,
            951_782_400,
            951_868_799,
            4_107_542_400,
            4_107_628_799,
            253_402_300_799,
        ];
        for at in edges.into_iter().chain(std::iter::from_fn(|| {
            secs += 7_919_993;
            (secs <= 253_402_300_799).then_some(secs)
        })) {
            let t = UNIX_EPOCH + Duration::from_secs(at);
            assert_eq!(
                http_date(t).unwrap(),
                httpdate::fmt_http_date(t).as_str(),
                "{at}"
            );
            checked += 1;
        }
        assert!(checked > 30_000, "{checked}");
        assert_eq!(
            http_date(UNIX_EPOCH + Duration::from_secs(253_402_300_800)),
            None
        );
        assert_eq!(http_date(UNIX_EPOCH - Duration::from_secs(1)), None);
    }
}
