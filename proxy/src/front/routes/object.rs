//! GetObject and HeadObject from the caches: metadata, conditionals and range, then the bytes
//! from the block store; a 404 or other failure explained as S3 would have answered.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt;
use http::request::Parts;
use http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use parking_lot::Mutex;

use crate::model::{
    range::{self, ByteRange, Resolved},
    BodyStream, ObjectId, ObjectMeta, PartNumber, PartSpan, UpstreamError,
};
use crate::read::blocks::{CacheResult, Cut, InMemory};
use crate::read::metadata::Source;
use crate::s3::conditional::{self, Outcome};
use crate::s3::headers::{has_any, names, never_indexed, object_headers, wants_checksums};
use crate::s3::request::{ObjectQuery, REQUEST_PAYER};
use crate::s3::S3Error;
use crate::telemetry::labels::XCache;

use super::{AppState, Handled};

impl AppState {
    pub(super) async fn object(
        &self,
        req: &Parts,
        bucket: Arc<str>,
        key: Arc<str>,
        query: &ObjectQuery,
        head: bool,
        reader: Option<&str>,
    ) -> Handled {
        let id = object_id(bucket, key, query);
        // Without a part, every read is answered here.
        self.answer(&req.headers, &id, query, head, None, reader)
            .await
            .unwrap_or(Err(S3Error::InternalError))
    }

    /// A GET or HEAD of `id` from the caches, of the range its headers ask for or of part
    /// `part`, by the client key `reader`. `Err(NotThisPart)`: the object does not fit the
    /// part's span (nothing was sent).
    pub(super) async fn answer(
        &self,
        headers: &HeaderMap,
        id: &ObjectId,
        query: &ObjectQuery,
        head: bool,
        part: Option<PartRead<'_>>,
        reader: Option<&str>,
    ) -> Result<Handled, NotThisPart> {
        // One retry: if the object changed upstream after its metadata was cached, the first block
        // fetch says so (If-Match) before anything was sent, and we start over with fresh metadata.
        let mut retried = false;
        loop {
            match self
                .object_once(headers, id, query, head, part, reader)
                .await
            {
                Err(Again::Changed) if !retried => {
                    retried = true;
                    // Boxed: a path a hit never takes (see `MetadataCache::lookup_once`).
                    Box::pin(self.metadata.invalidate(id)).await;
                }
                Err(Again::Changed) => {
                    return Ok(Err(S3Error::ServiceUnavailable(
                        "the object kept changing while it was read".into(),
                    )))
                }
                Err(Again::NotThisPart) => return Err(NotThisPart),
                Ok(handled) => return Ok(handled),
            }
        }
    }

    async fn object_once(
        &self,
        headers: &HeaderMap,
        id: &ObjectId,
        query: &ObjectQuery,
        head: bool,
        part: Option<PartRead<'_>>,
        reader: Option<&str>,
    ) -> Result<Handled, Again> {
        // Parsed once; `None` is no header or one S3 ignores (the whole object). A part is the
        // range it was learnt to be (a read of a part has no Range header: S3 refuses both).
        let range = match part.map(|p| p.span) {
            Some(span) => Some(ByteRange::FromTo {
                first: span.bytes.start,
                last: Some(span.bytes.end - 1),
            }),
            None => headers
                .get(header::RANGE)
                .and_then(|v| v.to_str().ok())
                .and_then(ByteRange::parse),
        };
        // A part's first read: its blocks are this request's own GET's.
        let opened = AtomicBool::new(part.is_some_and(|p| p.opened));
        let tail = Mutex::new(None);
        // A hit asks the metadata cache once; what a miss needs is only asked on a miss (which
        // then looks in the cache again, inside the lookup that fetches). Boxed: a hit's
        // request future need not hold room for the miss path (docs/benchmarks.md, "Request
        // futures").
        let fetched = match self.metadata.cached(id).await {
            Some(meta) => Ok((meta, Source::Cached)),
            None => Box::pin(self.fetch_meta(id, head, range, &opened, &tail)).await,
        };
        let (meta, source) = match fetched {
            Ok(m) => m,
            Err((e, from_head)) => {
                return Ok(Err(Box::pin(self.explain(e, id, head, from_head)).await))
            }
        };
        // A part is read from the cache only from the object it was learnt from.
        let part = part.map(|p| p.span);
        if part.is_some_and(|span| !span.fits(&meta)) {
            return Err(Again::NotThisPart);
        }
        // For answers without a body, X-Cache says where the metadata came from.
        let meta_cache = match source {
            Source::Cached => XCache::HitMemory,
            Source::Fetched => XCache::Miss,
            Source::Stale => XCache::Stale,
        };
        let mut out = object_headers(&meta, &query.overrides);
        match conditional::evaluate(headers, &meta) {
            Outcome::Proceed => {}
            Outcome::NotModified => {
                let mut response = Response::new(Body::empty());
                *response.status_mut() = StatusCode::NOT_MODIFIED;
                for name in [header::ETAG, header::LAST_MODIFIED] {
                    if let Some(v) = out.remove(&name) {
                        response.headers_mut().insert(name, v);
                    }
                }
                return Ok(Ok((response, meta_cache)));
            }
            Outcome::PreconditionFailed => return Ok(Err(S3Error::PreconditionFailed)),
        }
        // A part is answered as S3 answers it: a 206 with its range, even when it is the whole
        // object (an object uploaded in one part), and the upload's number of parts.
        let resolved = match part {
            Some(span) => {
                if let Some(n) = span.parts_count {
                    out.insert(names::X_AMZ_MP_PARTS_COUNT, HeaderValue::from(n));
                }
                Resolved::Partial {
                    start: span.bytes.start,
                    end: span.bytes.end,
                }
            }
            None => range::resolve_parsed(range, meta.size),
        };
        let (status, start, end) = match resolved {
            Resolved::Whole => (StatusCode::OK, 0, meta.size),
            Resolved::Partial { start, end } => {
                let v = format!("bytes {}-{}/{}", start, end - 1, meta.size);
                // Digits, a dash and a slash: always a valid header value. Nearly every range
                // is another: never indexed.
                if let Ok(v) = HeaderValue::from_str(&v) {
                    out.insert(header::CONTENT_RANGE, never_indexed(v));
                }
                (StatusCode::PARTIAL_CONTENT, start, end)
            }
            Resolved::Unsatisfiable => return Ok(Err(S3Error::InvalidRange { size: meta.size })),
        };
        out.insert(header::CONTENT_LENGTH, HeaderValue::from(end - start));
        // As S3 answers: the stored checksums with the whole object (or a part's with the
        // part), when asked. The client's SDK then checks the bytes served here against them.
        let checksums: &[_] = match part {
            Some(span) => &span.checksums,
            None if status == StatusCode::OK => &meta.checksums,
            None => &[],
        };
        if !checksums.is_empty() && wants_checksums(headers) {
            for (name, value) in checksums {
                out.insert(name.clone(), value.clone());
            }
        }
        // Asked with the whole object, from metadata a cold open's GET brought, which cannot
        // carry them: with `learn_checksums`, a HEAD behind this read brings them for the
        // next. Not on the read that opened the object (an object read once costs no HEAD),
        // nor for a range, which S3 answers without them. Boxed: a path few hits take.
        if self.metadata.learns_checksums()
            && !meta.checksums_known
            && part.is_none()
            && status == StatusCode::OK
            && source == Source::Cached
            && wants_checksums(headers)
        {
            Box::pin(self.metadata.learn_checksums(id)).await;
        }
        // Called once, on whichever path answers: the headers move into the response.
        let respond = move |body: Body, cache: XCache| {
            let mut response = Response::new(body);
            *response.status_mut() = status;
            *response.headers_mut() = out;
            Ok(Ok((response, cache)))
        };
        if head || start == end {
            return respond(Body::empty(), meta_cache);
        }
        // An access profile holds the current version's bytes read, for a warm-up to fetch
        // again; a read of an older version is not one a later job makes.
        if self.profile.recording() && id.version_id.is_none() {
            self.profile.record(reader, &id.bucket, &id.key, start..end);
        }
        let etag = meta.etag.clone();
        // This request's own suffix GET: its bytes go to the client as they arrive, and the
        // blocks under them are fetched behind it for the next reader.
        if let Some(body) = tail.lock().take() {
            self.blocks.fetch_behind(id, &etag, start..end, meta.size);
            return respond(Body::from_stream(body), XCache::Miss);
        }
        // A part's blocks are cut as its spans: every later read of it asks for the same ones.
        let cut = if part.is_some() {
            Cut::Parts
        } else {
            Cut::Ranges
        };
        let mut found = self
            .blocks
            .classify_by(id, &etag, start..end, meta.size, cut);
        found.fetched_here = opened.load(Ordering::Relaxed);
        let cache = label(found.result, found.fetched_here);
        let cache = cache.label(source == Source::Stale);
        // Not for a part: a client reading by parts asks for the next ones itself (the SDKs'
        // multipart downloads keep several in flight), and a part read first is Larder's own
        // GET of the part, which read-ahead of its blocks would only duplicate.
        if part.is_none() {
            self.blocks.read_ahead(id, &etag, start..end, meta.size);
        }
        // Bytes that one block here holds need no stream of blocks opened ahead, and no wait
        // for a first chunk that cannot fail: one buffer (docs/architecture.md).
        if matches!(found.result, CacheResult::HitMemory | CacheResult::HitDisk) {
            let held = self
                .blocks
                .read_in_one(id, start..end, meta.size, found)
                .await;
            if let Some(held) = held {
                return respond(Body::new(InMemoryBody(held)), cache);
            }
        }
        let body = self
            .blocks
            .read_by(id.clone(), etag, start..end, meta.size, cut);
        let mut body = Box::pin(body);
        // Wait for the first bytes before answering, so an upstream failure (or a changed object)
        // becomes a proper S3 error instead of a broken body.
        let first = match body.next().await {
            Some(Ok(first)) => first,
            Some(Err(UpstreamError::Changed)) => return Err(Again::Changed),
            Some(Err(e)) => return Ok(Err(Box::pin(self.explain(e, id, head, false)).await)),
            None => return Ok(Err(S3Error::InternalError)),
        };
        let stream =
            futures::stream::once(async move { Ok::<_, UpstreamError>(first) }).chain(body);
        respond(Body::from_stream(stream), cache)
    }

    /// Turn an origin failure into what S3 would have answered. `from_head` says the failure came
    /// from the metadata HEAD.
    async fn explain(
        &self,
        error: UpstreamError,
        id: &ObjectId,
        head: bool,
        from_head: bool,
    ) -> S3Error {
        // A HEAD error has no body, so no code: a 404 does not say whether the key or the bucket
        // is missing, a 403 not whether the key is unknown or the signature wrong. A client's HEAD
        // gets the bare status, as from S3; for a GET, a one-byte GET asks the upstream for the
        // code S3 would have sent.
        if let (
            UpstreamError::Service {
                status: 400..=499, ..
            },
            true,
            false,
        ) = (&error, from_head, head)
        {
            if let Err(refined @ UpstreamError::Service { .. }) =
                self.origin.get(id, None, Some(0..1)).await
            {
                // Remembered with its code, so the next GET needs no upstream request either.
                if refined.is_not_found() {
                    self.metadata
                        .remember_missing(id, refined.clone(), false)
                        .await;
                }
                return refined.into();
            }
        }
        let message = error.to_string();
        let answer = S3Error::from(error);
        if answer == S3Error::InternalError {
            tracing::error!(object = %id, error = %message, "cannot read from the upstream");
        }
        answer
    }

    /// The metadata of `id`, which the cache did not hold: fetched with the first block the read
    /// needs when nothing is known of the object (`opened` then set, and a suffix read's body
    /// put in `tail`), or with a HEAD.
    async fn fetch_meta(
        &self,
        id: &ObjectId,
        head: bool,
        range: Option<ByteRange>,
        opened: &AtomicBool,
        tail: &Mutex<Option<BodyStream>>,
    ) -> Result<(Arc<ObjectMeta>, Source), (UpstreamError, bool)> {
        // A GET of an object nothing is known of fetches its metadata together with the first
        // block it needs (or the bytes asked of it, or for a suffix range those last bytes): one
        // upstream round trip before the first byte instead of two.
        let cold = match (head, range) {
            (true, _) => None,
            (false, None) => Some(Cold::Range(ByteRange::FromTo {
                first: 0,
                last: None,
            })),
            (false, Some(r @ ByteRange::FromTo { .. })) => Some(Cold::Range(r)),
            (false, Some(r @ ByteRange::Suffix(n))) if n > 0 => {
                Some(if self.blocks.opens_suffixes_as_parts() {
                    Cold::Range(r)
                } else {
                    Cold::Tail(n)
                })
            }
            (false, Some(ByteRange::Suffix(_))) => None,
        }
        .filter(|_| self.metadata.is_unknown(id) && !self.blocks.known_on_disk(id));
        match cold {
            Some(Cold::Range(asked)) => {
                let open = async {
                    opened.store(true, Ordering::Relaxed);
                    let changed = self.metadata.since_change(id);
                    self.blocks.open_cold(id.clone(), asked, changed).await
                };
                self.metadata.get_or_open(id, open).await
            }
            Some(Cold::Tail(len)) => {
                let open = async {
                    opened.store(true, Ordering::Relaxed);
                    Ok(self.blocks.open_tail(id, len).await?.map(|(meta, body)| {
                        *tail.lock() = Some(body);
                        (meta, std::time::Duration::ZERO)
                    }))
                };
                self.metadata.get_or_open(id, open).await
            }
            None => self.metadata.get(id).await.map_err(|e| (e, true)),
        }
    }
}

/// Whether a GET or HEAD of an object can be answered from the cache: no sub-resource
/// (`?tagging`, `?acl`, `?attributes`...), no `partNumber` (parts are addressed by the upload's
/// layout: see [`cacheable_part`]), and no SSE-C (the key must reach S3, and the bytes must
/// never be stored).
///
/// Nor when the request carries a header that S3 checks against the bucket or the caller
/// (`x-amz-expected-bucket-owner`; `x-amz-request-payer` unless [`pays_as_larder_does`]): a
/// cached answer would skip the check, so S3 must see the request.
///
/// Nor a key made only of white space: the upstream client library refuses to build a request
/// for it, so it goes through the pass-through, which addresses any key.
///
/// `larder_pays`: Larder's own requests say it pays for them (`upstream_requester_pays`).
pub(super) fn cacheable(
    key: &str,
    query: &ObjectQuery,
    headers: &HeaderMap,
    larder_pays: bool,
) -> bool {
    query.part_number.is_none() && cacheable_but_for_the_part(key, query, headers, larder_pays)
}

/// The part a `partNumber` GET or HEAD reads, when the cache may answer it once it knows where
/// the part lies (`read::parts`): as [`cacheable`] but for the part, one number in its canonical
/// spelling ([`ObjectQuery::part`]), and no `Range`, which S3 refuses beside a part number (and is
/// left to say so).
pub(super) fn cacheable_part(
    key: &str,
    query: &ObjectQuery,
    headers: &HeaderMap,
    larder_pays: bool,
) -> Option<PartNumber> {
    let part = query.part()?;
    (!headers.contains_key(header::RANGE)
        && cacheable_but_for_the_part(key, query, headers, larder_pays))
    .then_some(part)
}

fn cacheable_but_for_the_part(
    key: &str,
    query: &ObjectQuery,
    headers: &HeaderMap,
    larder_pays: bool,
) -> bool {
    !key.trim().is_empty()
        && query.other.iter().all(|p| p == REQUEST_PAYER)
        && !has_any(headers, &NOT_CACHED)
        && pays_as_larder_does(query, headers, larder_pays)
}

/// Whether what a read says of who pays for it (`x-amz-request-payer`, as a header or a
/// presigned URL's parameter) is what Larder's own request for it will say: nothing, or, when
/// Larder says it pays (`larder_pays`), `requester` (the one value S3 takes), said once in
/// each place it is said. Anything else is S3's to read: the request passes through as
/// signed, and a Larder that does not pay never answers a read that says it would.
fn pays_as_larder_does(query: &ObjectQuery, headers: &HeaderMap, larder_pays: bool) -> bool {
    let header: Vec<&HeaderValue> = headers.get_all(names::X_AMZ_REQUEST_PAYER).iter().collect();
    let params = query.other.iter().filter(|p| *p == REQUEST_PAYER).count();
    if header.is_empty() && params == 0 {
        return true;
    }
    larder_pays
        && header.len() <= 1
        && header.iter().all(|v| v.as_bytes() == b"requester")
        && params <= 1
        && (params == 0 || query.request_payer.as_deref() == Some("requester"))
}

/// Headers that make a read go to S3: see [`cacheable`].
static NOT_CACHED: [HeaderName; 2] = [
    names::X_AMZ_SSE_CUSTOMER_ALGORITHM,
    names::X_AMZ_EXPECTED_BUCKET_OWNER,
];

/// Headers that declare SSE-KMS.
static KMS: [HeaderName; 2] = [names::X_AMZ_SSE, names::X_AMZ_SSE_KMS_KEY_ID];

/// A read that declares SSE-KMS: S3 refuses it (400), as the encryption is chosen on write.
pub(super) fn declares_kms(headers: &HeaderMap) -> bool {
    has_any(headers, &KMS)
}

/// How a GET of an object nothing is known of fetches its metadata.
enum Cold {
    /// With the bytes asked (or the blocks under them), the way the block store opens them.
    Range(ByteRange),
    /// With the last this many bytes (a suffix range), streamed to the client as they arrive,
    /// the blocks under them fetched behind.
    Tail(u64),
}

/// A body of bytes in one buffer: one frame. The room they hold in the responses' buffer is
/// given back when the body is dropped (ended, or the client gone), as a streamed block's is.
struct InMemoryBody(InMemory);

impl http_body::Body for InMemoryBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        // Never empty until sent: an empty read is answered before it gets here.
        let bytes = std::mem::take(&mut self.0.bytes);
        std::task::Poll::Ready((!bytes.is_empty()).then(|| Ok(http_body::Frame::data(bytes))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.bytes.is_empty()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.0.bytes.len() as u64)
    }
}

/// Why a read from the caches starts over, or stops before answering.
enum Again {
    /// The object changed upstream between reading its metadata and its first block.
    Changed,
    /// The object is not the one a part's span was learnt from.
    NotThisPart,
}

/// A part's span does not fit the object as it is now: the read must pass through.
pub(super) struct NotThisPart;

/// A part read from the caches: where it lies, and whether this request's own GET of the
/// part just said so (its blocks then came from the upstream for it: a miss).
#[derive(Clone, Copy)]
pub(super) struct PartRead<'a> {
    pub span: &'a PartSpan,
    pub opened: bool,
}

/// The object (or version) a GET or HEAD names.
pub(super) fn object_id(bucket: Arc<str>, key: Arc<str>, query: &ObjectQuery) -> ObjectId {
    ObjectId {
        bucket,
        key,
        version_id: query.version_id.as_deref().map(Arc::from),
    }
}

/// The `X-Cache` answer of a read whose blocks were found as `found`; `opened`: this request's
/// own GETs brought the object's metadata with its first blocks. Then what it finds of those
/// (still arriving, landed, or landed with the blocks past them still to fetch) came from the
/// upstream for it: a miss, whichever the look saw. (A block left in memory after its
/// object's metadata was forgotten would be a hit labelled a miss: rare, and on the side of
/// claiming less.)
fn label(found: CacheResult, opened: bool) -> CacheResult {
    match found {
        CacheResult::Coalesced
        | CacheResult::HitMemory
        | CacheResult::HitDisk
        | CacheResult::Partial
            if opened =>
        {
            CacheResult::Miss
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_that_s3_must_see_are_told_apart_by_their_headers() {
        let query = ObjectQuery::default();
        let mut headers = HeaderMap::new();
        headers.insert(header::RANGE, HeaderValue::from_static("bytes=0-9"));
        headers.insert("x-amz-date", HeaderValue::from_static("20261129T000000Z"));
        assert!(cacheable("k", &query, &headers, false));
        assert!(!declares_kms(&headers));
        for name in &NOT_CACHED {
            let mut with = headers.clone();
            with.insert(name.clone(), HeaderValue::from_static("x"));
            assert!(!cacheable("k", &query, &with, false), "{name}");
            assert!(!cacheable("k", &query, &with, true), "{name}");
        }
        for name in [
            "X-Amz-Server-Side-Encryption",
            "x-amz-server-side-encryption-aws-kms-key-id",
        ] {
            let mut with = headers.clone();
            with.insert(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_static("aws:kms"),
            );
            assert!(declares_kms(&with), "{name}");
        }
        assert!(!cacheable(" ", &query, &headers, false));
    }

    #[test]
    fn a_read_that_says_it_pays_is_cached_only_where_larder_says_so_too() {
        let payer = names::X_AMZ_REQUEST_PAYER;
        let says = |value: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(payer.clone(), HeaderValue::from_static(value));
            h
        };
        let none = HeaderMap::new();
        let plain = ObjectQuery::default();
        let param = |q: &str| ObjectQuery::parse(Some(q));
        // Saying nothing: cached either way.
        assert!(cacheable("k", &plain, &none, false));
        assert!(cacheable("k", &plain, &none, true));
        // `requester`, in the header, the query or both: cached only when Larder pays.
        let presigned = param("x-amz-request-payer=requester");
        for (query, headers) in [
            (&plain, &says("requester")),
            (&presigned, &none),
            (&presigned, &says("requester")),
        ] {
            assert!(
                !cacheable("k", query, headers, false),
                "{query:?} {headers:?}"
            );
            assert!(
                cacheable("k", query, headers, true),
                "{query:?} {headers:?}"
            );
        }
        // Any other value, or a name said twice, is S3's to read.
        let mut twice = says("requester");
        twice.append(payer.clone(), HeaderValue::from_static("requester"));
        for (query, headers) in [
            (&plain, says("Requester")),
            (&plain, says("bucket-owner")),
            (&plain, twice),
            (&param("x-amz-request-payer=owner"), none.clone()),
            (
                &param("x-amz-request-payer=requester&x-amz-request-payer=requester"),
                none.clone(),
            ),
            (&presigned, says("other")),
        ] {
            assert!(
                !cacheable("k", query, &headers, true),
                "{query:?} {headers:?}"
            );
        }
        // It sets aside no other parameter.
        let tagging = param("x-amz-request-payer=requester&tagging");
        assert!(!cacheable("k", &tagging, &none, true));
        // A part's read follows the same rule.
        let part = param("partNumber=1&x-amz-request-payer=requester");
        assert!(cacheable_part("k", &part, &none, true).is_some());
        assert!(cacheable_part("k", &part, &none, false).is_none());
    }

    #[test]
    fn a_read_that_brought_its_own_first_blocks_is_a_miss_however_far_they_had_landed() {
        use CacheResult::*;
        for found in [Coalesced, HitMemory, HitDisk, Partial, Miss, Peer] {
            // Known objects: what is here is what earlier reads left.
            assert_eq!(label(found, false), found);
            // Its first blocks still arriving, landed (with or without the rest), or, in a
            // fleet, asked of their owner: from this request's own GETs.
            let want = if found == Peer { Peer } else { Miss };
            assert_eq!(label(found, true), want, "{found:?}");
        }
    }
}
