//! Browser-form uploads (POST Object, as S3 documents for HTML forms): the form's head is read
//! and its POST policy verified ([`crate::auth::post_policy`]), the key's bucket policy applied,
//! and the file uploaded as a PutObject signed with Larder's own credentials.
//!
//! The file streams through: its length is the request's `Content-Length` less the form's head
//! and the closing delimiter, so memory holds only the head (at most [`form::MAX_HEAD`]). The
//! file's last bytes are held back until the body's end is seen to be exactly that closing
//! delimiter, and the length is checked against the policy's `content-length-range` before a
//! byte goes up, so a malformed or oversized upload never completes upstream.

use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use futures::stream::{self, StreamExt};
use http::request::Parts;
use http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};

use crate::auth::Authenticator;
use crate::freshness::{Freshness, Learnt};
use crate::model::ObjectId;
use crate::s3::form::{self, FormHead};
use crate::s3::operation::Operation;
use crate::s3::request::{Target, MAX_KEY_LEN};
use crate::s3::S3Error;
use crate::telemetry::metrics::{KeyTally, Metrics};
use crate::upstream::forward::{Forward, Forwarder, Reshaped};

/// Whether a request is a browser-form upload: a POST of `multipart/form-data` to a bucket,
/// with no sub-resource and no signature of its own (the form carries it).
pub fn is_form_upload(parts: &Parts, target: &Target) -> bool {
    parts.method == Method::POST
        && matches!(target, Target::Bucket(_))
        && parts.uri.query().is_none_or(str::is_empty)
        && !parts.headers.contains_key(header::AUTHORIZATION)
        && parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(form::boundary)
            .is_some()
}

/// Form fields that become headers of the upstream PutObject, as S3 maps them.
fn header_of(field: &str) -> Option<&str> {
    match field {
        "content-type"
        | "cache-control"
        | "content-disposition"
        | "content-encoding"
        | "expires" => Some(field),
        "acl" => Some("x-amz-acl"),
        f if f.starts_with("x-amz-meta-")
            || f.starts_with("x-amz-server-side-encryption")
            || f.starts_with("x-amz-object-lock-")
            || f == "x-amz-storage-class"
            || f == "x-amz-website-redirect-location" =>
        {
            Some(f)
        }
        _ => None,
    }
}

/// What a form upload needs of the S3 front.
pub struct Uploader<'a> {
    /// Who may upload: verifies the form's policy.
    pub auth: &'a Authenticator,
    /// What to forget once the object is written.
    pub freshness: &'a Freshness,
    /// The upstream the file goes to.
    pub forwarder: &'a Forwarder,
    /// Where the upload's upstream request is counted.
    pub metrics: &'a Metrics,
}

/// Serve one form upload to `bucket`. Once the form's signature is verified, `signer` holds
/// its key's tally, to count the upload to the key whatever its answer.
pub async fn upload(
    app: Uploader<'_>,
    req: Parts,
    body: Body,
    bucket: String,
    signer: &mut Option<Arc<KeyTally>>,
) -> Result<Response, S3Error> {
    let boundary = req
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(form::boundary)
        .ok_or_else(|| S3Error::MalformedPostRequest("no multipart boundary".into()))?;
    let total: u64 = req
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .ok_or(S3Error::MissingContentLength)?;
    let mut body = body.into_data_stream();
    let mut buf = BytesMut::new();
    let head = loop {
        if let Some(head) = form::parse_head(&buf, &boundary)? {
            break head;
        }
        match body.next().await {
            Some(Ok(chunk)) => buf.extend_from_slice(&chunk),
            Some(Err(e)) => return Err(S3Error::IncompleteBody(e.to_string())),
            None => {
                return Err(S3Error::MalformedPostRequest(
                    "the form ends before its file".into(),
                ))
            }
        }
    };
    let raw_key = head.field("key").ok_or_else(|| {
        S3Error::InvalidArgument("Bucket POST must contain a field named 'key'.".into())
    })?;
    let key = raw_key.replace("${filename}", &head.file_name);
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(S3Error::KeyTooLong);
    }
    let (mut principal, range) = app.auth.form_upload(&head, &bucket, &key)?;
    *signer = principal.tally.take();
    principal.admit()?;
    let target = Target::Object {
        bucket: bucket.as_str().into(),
        key: key.as_str().into(),
    };
    let headers = upstream_headers(&head)?;
    // The same rules as a PutObject carrying these headers.
    principal.authorize(&Method::PUT, &target, &[], &headers, None)?;
    let closing = format!("\r\n--{boundary}--\r\n");
    let file_len = total
        .checked_sub((head.file_offset + closing.len()) as u64)
        .ok_or_else(|| {
            S3Error::MalformedPostRequest("Content-Length is shorter than the form".into())
        })?;
    if file_len < range.min {
        return Err(S3Error::EntitySize("smaller"));
    }
    if file_len > range.max {
        return Err(S3Error::EntitySize("larger"));
    }
    let rest = buf.split_off(head.file_offset).freeze();
    let file = file_stream(rest, body, file_len, boundary, closing);
    let mut headers = headers;
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(file_len));
    let id = ObjectId {
        bucket: bucket.as_str().into(),
        key: key.as_str().into(),
        version_id: None,
    };
    app.freshness.metadata().invalidate(&id).await;
    let forward = Forward {
        method: Method::PUT,
        target,
        query: None,
        headers,
        body: Body::from_stream(file),
        payload: (&principal.payload).into(),
        reshaped: Reshaped::AsSent,
    };
    let response = app
        .forwarder
        .send_counted(forward, Operation::PostObject, app.metrics)
        .await
        .map_err(|e| S3Error::ServiceUnavailable(format!("upstream unavailable: {e}")))?;
    if !response.status().is_success() {
        return Ok(response);
    }
    app.freshness.object_changed(&id, Learnt::Write).await;
    Ok(answer(
        &req,
        &head,
        &bucket,
        &key,
        response.headers().get(header::ETAG).cloned(),
    ))
}

/// The headers of the upstream PutObject: the form fields S3 turns into headers, and the file
/// part's own content type unless a field named one.
fn upstream_headers(head: &FormHead) -> Result<HeaderMap, S3Error> {
    let mut headers = HeaderMap::new();
    if head.field("tagging").is_some() {
        return Err(S3Error::NotImplemented(
            "Larder does not take the tagging field of a form upload; tag the object after".into(),
        ));
    }
    for (name, value) in &head.fields {
        if let Some(h) = header_of(name) {
            let (Ok(n), Ok(v)) = (HeaderName::try_from(h), HeaderValue::from_str(value)) else {
                return Err(S3Error::InvalidArgument(format!(
                    "field {name} cannot be a header"
                )));
            };
            headers.insert(n, v);
        }
    }
    if !headers.contains_key(header::CONTENT_TYPE) {
        if let Some(v) = head
            .file_content_type
            .as_deref()
            .and_then(|v| HeaderValue::from_str(v).ok())
        {
            headers.insert(header::CONTENT_TYPE, v);
        }
    }
    Ok(headers)
}

/// What S3 answers a successful form upload: a redirect, or `success_action_status` (200, 201
/// with a `PostResponse` document, or 204, the default).
fn answer(
    req: &Parts,
    head: &FormHead,
    bucket: &str,
    key: &str,
    etag: Option<HeaderValue>,
) -> Response {
    let etag_text = etag
        .as_ref()
        .and_then(|e| e.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let host = req
        .headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let location = format!(
        "http://{host}/{bucket}/{}",
        crate::s3::request::encode_path(key.as_bytes())
    );
    let mut response = if let Some(redirect) = head
        .field("success_action_redirect")
        .filter(|r| !r.is_empty())
    {
        let query: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("bucket", bucket)
            .append_pair("key", key)
            .append_pair("etag", &etag_text)
            .finish();
        let sep = if redirect.contains('?') { '&' } else { '?' };
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::SEE_OTHER;
        if let Ok(v) = HeaderValue::from_str(&format!("{redirect}{sep}{query}")) {
            r.headers_mut().insert(header::LOCATION, v);
        }
        r
    } else {
        match head.field("success_action_status") {
            Some("200") => Response::new(Body::empty()),
            Some("201") => {
                let xml = format!(
                    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<PostResponse><Location>{}</Location><Bucket>{}</Bucket><Key>{}</Key><ETag>{}</ETag></PostResponse>",
                    escape(&location), escape(bucket), escape(key), escape(&etag_text)
                );
                let mut r = Response::new(Body::from(xml));
                *r.status_mut() = StatusCode::CREATED;
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/xml"),
                );
                r
            }
            _ => {
                let mut r = Response::new(Body::empty());
                *r.status_mut() = StatusCode::NO_CONTENT;
                r
            }
        }
    };
    if let Some(etag) = etag {
        response.headers_mut().insert(header::ETAG, etag);
    }
    if let Ok(v) = HeaderValue::from_str(&location) {
        response.headers_mut().entry(header::LOCATION).or_insert(v);
    }
    response
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The file's `len` bytes: `first` (already read) and then `rest`, cut before the closing
/// delimiter. The last piece is released only once the body is seen to end with exactly
/// `closing`, and a delimiter inside the file (a part after it) fails the stream, so the
/// upstream upload, which needs all `len` bytes, never completes with the wrong ones.
fn file_stream(
    first: Bytes,
    rest: impl futures::Stream<Item = Result<Bytes, axum::Error>> + Send + Unpin + 'static,
    len: u64,
    boundary: String,
    closing: String,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    struct St<S> {
        rest: S,
        pending: Bytes,
        left: u64,
        held: Option<Bytes>,
        tail: Vec<u8>,
        delimiter: Vec<u8>,
        closing: Vec<u8>,
        after: Vec<u8>,
        done: bool,
    }
    let fail = |why: &str| std::io::Error::other(format!("malformed form upload: {why}"));
    let st = St {
        rest,
        pending: first,
        left: len,
        held: None,
        tail: Vec::new(),
        delimiter: format!("\r\n--{boundary}").into_bytes(),
        closing: closing.into_bytes(),
        after: Vec::new(),
        done: false,
    };
    stream::unfold(st, move |mut st| async move {
        if st.done {
            return None;
        }
        loop {
            if st.pending.is_empty() {
                match st.rest.next().await {
                    Some(Ok(chunk)) => st.pending = chunk,
                    Some(Err(e)) => {
                        st.done = true;
                        return Some((Err(std::io::Error::other(e)), st));
                    }
                    None => {
                        st.done = true;
                        let ok = st.left == 0 && st.after == st.closing;
                        return match (ok, st.held.take()) {
                            (true, Some(last)) => Some((Ok(last), st)),
                            (true, None) => None,
                            (false, _) => Some((Err(fail("the body does not end with the closing delimiter where its length says")), st)),
                        };
                    }
                }
            }
            if st.left == 0 {
                st.after.extend_from_slice(&st.pending);
                st.pending = Bytes::new();
                if st.after.len() > st.closing.len() {
                    st.done = true;
                    return Some((Err(fail("bytes after the closing delimiter")), st));
                }
                continue;
            }
            let take = st
                .pending
                .len()
                .min(usize::try_from(st.left).unwrap_or(usize::MAX));
            let piece = st.pending.split_to(take);
            st.left -= take as u64;
            // A delimiter inside the file, even across pieces, means more parts: refused.
            let mut window = std::mem::take(&mut st.tail);
            window.extend_from_slice(&piece);
            if window
                .windows(st.delimiter.len())
                .any(|w| w == st.delimiter.as_slice())
            {
                st.done = true;
                return Some((Err(fail("a part after the file")), st));
            }
            let keep = window.len().min(st.delimiter.len() - 1);
            st.tail = window[window.len() - keep..].to_vec();
            if let Some(previous) = st.held.replace(piece) {
                return Some((Ok(previous), st));
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn run(parts: &[&[u8]], len: u64) -> (Vec<u8>, bool) {
        let chunks: Vec<Result<Bytes, axum::Error>> = parts[1..]
            .iter()
            .map(|p| Ok(Bytes::copy_from_slice(p)))
            .collect();
        let s = file_stream(
            Bytes::copy_from_slice(parts[0]),
            stream::iter(chunks),
            len,
            "XyZ".into(),
            "\r\n--XyZ--\r\n".into(),
        );
        let mut s = Box::pin(s);
        let mut got = Vec::new();
        while let Some(r) = s.next().await {
            match r {
                Ok(b) => got.extend_from_slice(&b),
                Err(_) => return (got, false),
            }
        }
        (got, true)
    }

    #[tokio::test]
    async fn the_file_streams_whole_only_when_the_form_ends_right() {
        let (got, ok) = run(&[b"hello ", b"world\r\n--Xy", b"Z--\r\n"], 11).await;
        assert!(ok);
        assert_eq!(got, b"hello world");
        // A part after the file, a wrong ending, a short body: refused, and the last piece of
        // the file is never released.
        for (parts, len) in [
            (&[&b"hello\r\n--XyZ\r\nx"[..], b"\r\n--XyZ--\r\n"][..], 16),
            (&[&b"hello world"[..], b"\r\n--XyZ--"][..], 11),
            (&[&b"hello"[..]][..], 11),
            (&[&b"hello world"[..], b"\r\n--XyZ--\r\nextra"][..], 11),
        ] {
            let (got, ok) = run(parts, len).await;
            assert!(!ok, "{parts:?}");
            assert!((got.len() as u64) < len, "{parts:?}: {got:?}");
        }
    }
}
