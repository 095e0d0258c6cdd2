//! The S3 front: every request is authenticated and authorised; GetObject and HeadObject go
//! through the block cache; everything else passes through to the upstream, re-signed.
//!
//! A cached GET goes: [`handle`] → [`crate::auth`] → address and query
//! ([`crate::s3::request`]) → metadata ([`MetadataCache`]) → conditionals and range
//! ([`crate::s3`]) → bytes ([`BlockStore::read`]). Anything else goes to [`Forwarder::send`],
//! and a write that succeeds forgets what was cached of its object.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use futures::{StreamExt, TryStreamExt};
use http::request::Parts;
use http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use parking_lot::Mutex;
use tracing::Instrument;

use crate::auth::chunked::{self, ChunkError, Decoder};
use crate::auth::{Authenticator, Payload, Principal};
use crate::model::{
    range::{self, ByteRange, Resolved},
    ObjectId, UpstreamError, UpstreamOutcome,
};
use crate::read::blocks::{BlockStore, CacheResult};
use crate::read::metadata::{MetadataCache, Source};
use crate::s3::conditional::{self, Outcome};
use crate::s3::copy_source::CopySource;
use crate::s3::headers::object_headers;
use crate::s3::request::{self, ObjectQuery, Target};
use crate::s3::S3Error;
use crate::telemetry::metrics::Metrics;
use crate::upstream::forward::{Forward, ForwardError, Forwarder, Reshaped, SignedBody};
use crate::upstream::Upstream;

/// What the S3 front needs.
pub struct AppState {
    /// Base domain for virtual-hosted-style requests.
    pub base_domain: Option<String>,
    /// Who may send requests.
    pub auth: Authenticator,
    /// Object metadata.
    pub metadata: Arc<MetadataCache>,
    /// Block data.
    pub blocks: Arc<BlockStore>,
    /// The upstream, for the rare request the caches cannot answer (explaining a 404).
    pub origin: Arc<dyn Upstream>,
    /// The upstream, for every request that is not a cacheable read.
    pub forwarder: Forwarder,
    /// Metrics.
    pub metrics: Arc<Metrics>,
}

/// The S3 router.
pub fn router(state: Arc<AppState>) -> axum::Router {
    axum::Router::new().fallback(handle).with_state(state)
}

/// Every S3 request lands here.
pub async fn handle(State(app): State<Arc<AppState>>, req: Request) -> Response {
    let started = Instant::now();
    let request_id = request_id();
    let (req, body) = req.into_parts();
    let method = req.method.clone();
    let resource = req.uri.path().to_owned();
    let parsed = app.parse(&req);
    let span = tracing::info_span!(
        "request",
        otel.name = parsed.2,
        otel.kind = "server",
        http.request.method = %method,
        s3.bucket = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
        larder.cache = tracing::field::Empty,
        larder.request_id = %request_id,
    );
    let (operation, bucket, result) = app
        .dispatch(req, body, parsed)
        .instrument(span.clone())
        .await;
    let (mut response, cache) = match result {
        Ok((response, cache)) => (response, cache),
        Err(e) => {
            if e.status().is_server_error() {
                span.in_scope(|| {
                    tracing::warn!(%method, %resource, code = e.code(), error = %e, "request failed")
                });
            }
            (e.into_response(&method, &resource, &request_id), "error")
        }
    };
    let headers = response.headers_mut();
    if !headers.contains_key("x-amz-request-id") {
        if let Ok(v) = HeaderValue::from_str(&request_id) {
            headers.insert("x-amz-request-id", v);
        }
    }
    headers.insert("x-cache", HeaderValue::from_static(cache));
    let status = response.status().as_u16();
    span.record("http.response.status_code", i64::from(status));
    span.record("larder.cache", cache);
    if let Some(b) = &bucket {
        span.record("s3.bucket", b.as_str());
    }
    app.metrics.request(
        operation,
        bucket.as_deref(),
        status,
        cache,
        started.elapsed(),
    );
    let done = ResponseDone {
        metrics: app.metrics.clone(),
        operation,
        started,
    };
    response.map(|body| Body::new(TimedBody::new(body, span, done)))
}

/// Records a response's whole duration when its body ends or the client goes away.
struct ResponseDone {
    metrics: Arc<Metrics>,
    operation: &'static str,
    started: Instant,
}

impl ResponseDone {
    fn record(self) {
        self.metrics
            .response_done(self.operation, self.started.elapsed());
    }
}

/// A response body that streams inside its request's span (blocks opened while streaming are
/// fetched beneath it) and keeps the span open until the last byte.
struct TimedBody {
    inner: Body,
    span: tracing::Span,
    done: Option<ResponseDone>,
}

impl TimedBody {
    fn new(inner: Body, span: tracing::Span, done: ResponseDone) -> Self {
        Self {
            inner,
            span,
            done: Some(done),
        }
    }
}

impl http_body::Body for TimedBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let polled = {
            let _entered = this.span.enter();
            std::pin::Pin::new(&mut this.inner).poll_frame(cx)
        };
        if let std::task::Poll::Ready(None | Some(Err(_))) = &polled {
            if let Some(done) = this.done.take() {
                done.record();
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for TimedBody {
    fn drop(&mut self) {
        if let Some(done) = self.done.take() {
            done.record();
        }
    }
}

type Handled = Result<(Response, &'static str), S3Error>;

impl AppState {
    /// What a request addresses and which operation it is. Computed before authentication only
    /// to name the request's span; nothing is answered from it until the client is known.
    fn parse(&self, req: &Parts) -> (Result<Target, S3Error>, ObjectQuery, &'static str) {
        let target = request::host(req)
            .and_then(|host| request::target(host, req.uri.path(), self.base_domain.as_deref()));
        let query = ObjectQuery::parse(req.uri.query());
        let operation = match &target {
            Ok(t) => operation_name(&req.method, t, &query, &req.headers),
            Err(_) => "Unknown",
        };
        (target, query, operation)
    }

    /// The operation's name (for metrics), its bucket and the answer.
    async fn dispatch(
        &self,
        req: Parts,
        body: Body,
        (target, query, operation): (Result<Target, S3Error>, ObjectQuery, &'static str),
    ) -> (&'static str, Option<String>, Handled) {
        // A browser-form upload carries its signature in the form: verified there.
        if let Ok(t @ Target::Bucket(bucket)) = &target {
            if crate::front::form_upload::is_form_upload(&req, t) {
                let bucket = bucket.clone();
                let uploader = crate::front::form_upload::Uploader {
                    auth: &self.auth,
                    metadata: &self.metadata,
                    forwarder: &self.forwarder,
                };
                let result =
                    crate::front::form_upload::upload(uploader, req, body, bucket.clone()).await;
                return ("PostObject", Some(bucket), result.map(|r| (r, "pass")));
            }
        }
        // Authenticate before looking at anything else, so an unknown client learns nothing.
        let principal = match self.auth.authenticate(&req, self.base_domain.as_deref()) {
            Ok(p) => p,
            Err(e) => return ("Unauthenticated", None, Err(e)),
        };
        let target = match target {
            Ok(t) => t,
            Err(e) => return (operation, None, Err(e)),
        };
        let bucket = match &target {
            Target::Service => None,
            Target::Bucket(b) | Target::Object { bucket: b, .. } => Some(b.clone()),
        };
        // The copy source is authorised and forwarded as one parse, never as the client's text.
        let copy_source = match req.headers.get("x-amz-copy-source") {
            Some(v) => match CopySource::parse(v.as_bytes()) {
                Ok(source) => Some(source),
                Err(e) => return (operation, bucket, Err(e)),
            },
            None => None,
        };
        if let Err(e) = principal.authorize(
            &req.method,
            &target,
            &query.other,
            &req.headers,
            copy_source.as_ref(),
        ) {
            return (operation, bucket, Err(e));
        }
        let result = match (&req.method, &target) {
            (&Method::GET | &Method::HEAD, Target::Object { .. })
                if declares_kms(&req.headers) =>
            {
                Err(S3Error::InvalidArgument(
                    "Server Side Encryption with AWS KMS managed key requires no x-amz-server-side-encryption headers on a read"
                        .into(),
                ))
            }
            (&Method::GET | &Method::HEAD, Target::Object { bucket, key })
                if cacheable(key, &query, &req.headers) =>
            {
                let head = req.method == Method::HEAD;
                self.object(&req, bucket.clone(), key.clone(), &query, head)
                    .await
            }
            _ => {
                self.pass_through(req, body, target, principal, copy_source, operation)
                    .await
            }
        };
        (operation, bucket, result)
    }

    /// Send the request upstream as it is, re-signed, and stream the answer back.
    async fn pass_through(
        &self,
        req: Parts,
        body: Body,
        target: Target,
        principal: Principal,
        copy_source: Option<CopySource>,
        operation: &'static str,
    ) -> Handled {
        let write = !matches!(req.method, Method::GET | Method::HEAD);
        let stale = if write {
            stale_ids(&target, req.uri.query())
        } else {
            Vec::new()
        };
        // Forget before (readers revalidate while the write runs) and after (anything cached
        // from the old version in between).
        self.forget(&stale, &target, &req).await;
        let failure = Arc::new(Mutex::new(None::<ChunkError>));
        let (body, reshaped) = match &principal.payload {
            Payload::SignedChunks { trailer, signer } => {
                let header = |name: &str| req.headers.get(name).and_then(|v| v.to_str().ok());
                let length = header("x-amz-decoded-content-length")
                    .and_then(|v| v.parse::<u64>().ok())
                    .ok_or(S3Error::MissingContentLength)?;
                let mut decoder = Decoder::new(signer.clone(), *trailer, length);
                let reshaped = if *trailer {
                    let names = header("x-amz-trailer")
                        .and_then(chunked::trailer_names)
                        .ok_or_else(|| {
                            S3Error::InvalidRequest(
                                "x-amz-trailer must name x-amz-checksum-* headers".into(),
                            )
                        })?;
                    let framed = chunked::framed_length(length, &names);
                    decoder = decoder.reframed(names);
                    Reshaped::Reframed(framed)
                } else {
                    Reshaped::Decoded(length)
                };
                let slot = failure.clone();
                let stream = chunked::decode(body.into_data_stream(), decoder).map_err(move |e| {
                    *slot.lock() = Some(e.clone());
                    std::io::Error::other(e)
                });
                (Body::from_stream(stream), reshaped)
            }
            _ => (body, Reshaped::AsSent),
        };
        // Only what the client signed (and the standard headers S3 takes unsigned) goes on
        // under Larder's signature.
        let mut headers = principal.signed.forwardable(&req.headers);
        if let Some(source) = &copy_source {
            // Visible ASCII: the parse re-encodes every other byte.
            if let Ok(v) = HeaderValue::from_str(&source.header_value()) {
                headers.insert("x-amz-copy-source", v);
            }
        }
        let forward = Forward {
            method: req.method.clone(),
            target: target.clone(),
            query: req.uri.query().map(str::to_owned),
            headers,
            body,
            payload: (&principal.payload).into(),
            reshaped,
        };
        let started = Instant::now();
        let result = self
            .forwarder
            .send(forward)
            .instrument(tracing::info_span!(
                "upstream",
                otel.name = operation,
                otel.kind = "client"
            ))
            .await;
        let status = match &result {
            Ok(r) => UpstreamOutcome::Http(r.status().as_u16()),
            Err(ForwardError::Timeout(_)) => UpstreamOutcome::Failed("timeout"),
            Err(ForwardError::Transport(_)) => UpstreamOutcome::Failed("transport"),
            Err(_) => UpstreamOutcome::Failed("internal"),
        };
        self.metrics.upstream(operation, status, started.elapsed());
        if let Err(e) = &result {
            self.metrics.upstream_failed(e);
        }
        match result {
            Ok(response) => {
                if write && response.status().is_success() {
                    self.forget(&stale, &target, &req).await;
                }
                Ok((response, "pass"))
            }
            Err(e) => {
                if let Some(chunk_error) = failure.lock().take() {
                    return Err(match chunk_error {
                        ChunkError::Signature => S3Error::SignatureDoesNotMatch,
                        other => S3Error::IncompleteBody(other.to_string()),
                    });
                }
                Err(match e {
                    ForwardError::Transport(m) => {
                        S3Error::ServiceUnavailable(format!("upstream unavailable: {m}"))
                    }
                    ForwardError::Timeout(_) => S3Error::ServiceUnavailable(e.to_string()),
                    ForwardError::Credentials(_) | ForwardError::Build(_) => {
                        tracing::error!(error = %e, "cannot pass a request upstream");
                        S3Error::InternalError
                    }
                })
            }
        }
    }

    /// Drop cached metadata a write makes stale. Blocks need no dropping: they are keyed by
    /// ETag, and a changed object has a new one.
    async fn forget(&self, stale: &[ObjectId], target: &Target, req: &Parts) {
        for id in stale {
            self.metadata.invalidate(id).await;
        }
        // DeleteObjects names its keys in the body, which streams upstream unread; DeleteBucket
        // empties nothing but is rare. Both forget the whole bucket.
        if let Target::Bucket(bucket) = target {
            if req.method == Method::DELETE
                || (req.method == Method::POST && has_param(req.uri.query(), "delete"))
            {
                self.metadata.invalidate_bucket(bucket);
            }
        }
    }

    async fn object(
        &self,
        req: &Parts,
        bucket: String,
        key: String,
        query: &ObjectQuery,
        head: bool,
    ) -> Handled {
        let id = ObjectId {
            bucket: bucket.into(),
            key: key.into(),
            version_id: query.version_id.as_deref().map(Arc::from),
        };
        // One retry: if the object changed upstream after its metadata was cached, the first block
        // fetch says so (If-Match) before anything was sent, and we start over with fresh metadata.
        let mut retried = false;
        loop {
            match self.object_once(&req.headers, &id, query, head).await {
                Err(Retry) if !retried => {
                    retried = true;
                    self.metadata.invalidate(&id).await;
                }
                Err(Retry) => {
                    return Err(S3Error::ServiceUnavailable(
                        "the object kept changing while it was read".into(),
                    ))
                }
                Ok(handled) => return handled,
            }
        }
    }

    async fn object_once(
        &self,
        headers: &HeaderMap,
        id: &ObjectId,
        query: &ObjectQuery,
        head: bool,
    ) -> Result<Handled, Retry> {
        // Parsed once; `None` is no header or one S3 ignores (the whole object).
        let range = headers
            .get(header::RANGE)
            .and_then(|v| v.to_str().ok())
            .and_then(ByteRange::parse);
        // A GET of an object nothing is known of fetches its metadata together with the first
        // block it needs (or, for a suffix range, with those last bytes): one upstream round
        // trip before the first byte instead of two.
        let cold = match (head, range) {
            (true, _) => None,
            (false, None) => Some(Cold::Block(0)),
            (false, Some(ByteRange::FromTo { first, .. })) => {
                Some(Cold::Block(first / self.blocks.layout().block_size()))
            }
            (false, Some(ByteRange::Suffix(n))) => (n > 0).then_some(Cold::Tail(n)),
        }
        .filter(|_| self.metadata.is_unknown(id) && !self.blocks.known_on_disk(id));
        let opened = AtomicBool::new(false);
        let tail = Mutex::new(None);
        let fetched = match cold {
            Some(Cold::Block(index)) => {
                let open = async {
                    opened.store(true, Ordering::Relaxed);
                    self.blocks.open_cold(id.clone(), index).await
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
        };
        let (meta, source) = match fetched {
            Ok(m) => m,
            Err((e, from_head)) => return Ok(Err(self.explain(e, id, head, from_head).await)),
        };
        // For answers without a body, X-Cache says where the metadata came from.
        let meta_cache = match source {
            Source::Cached => "hit-memory",
            Source::Fetched => "miss",
            Source::Stale => "stale",
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
        let (status, start, end) = match range::resolve_parsed(range, meta.size) {
            Resolved::Whole => (StatusCode::OK, 0, meta.size),
            Resolved::Partial { start, end } => {
                let v = format!("bytes {}-{}/{}", start, end - 1, meta.size);
                // Digits, a dash and a slash: always a valid header value.
                if let Ok(v) = HeaderValue::from_str(&v) {
                    out.insert(header::CONTENT_RANGE, v);
                }
                (StatusCode::PARTIAL_CONTENT, start, end)
            }
            Resolved::Unsatisfiable => return Ok(Err(S3Error::InvalidRange { size: meta.size })),
        };
        out.insert(header::CONTENT_LENGTH, HeaderValue::from(end - start));
        let respond = |body: Body, cache: &'static str| {
            let mut response = Response::new(body);
            *response.status_mut() = status;
            *response.headers_mut() = out.clone();
            Ok(Ok((response, cache)))
        };
        if head || start == end {
            return respond(Body::empty(), meta_cache);
        }
        let etag: Arc<str> = meta.etag.as_str().into();
        // This request's own suffix GET: its bytes go to the client as they arrive, and the
        // blocks under them are fetched behind it for the next reader.
        if let Some(body) = tail.lock().take() {
            self.blocks.fetch_behind(id, &etag, start..end, meta.size);
            return respond(Body::from_stream(body), CacheResult::Miss.as_str());
        }
        let cache = match self.blocks.classify(id, &etag, start..end, meta.size) {
            // This request's own GET is the flight it finds.
            CacheResult::Coalesced if opened.load(Ordering::Relaxed) => CacheResult::Miss,
            other => other,
        };
        self.blocks.read_ahead(id, &etag, start..end, meta.size);
        let mut body = Box::pin(self.blocks.read(id.clone(), etag, start..end, meta.size));
        // Wait for the first bytes before answering, so an upstream failure (or a changed object)
        // becomes a proper S3 error instead of a broken body.
        let first = match body.next().await {
            Some(Ok(first)) => first,
            Some(Err(UpstreamError::Changed)) => return Err(Retry),
            Some(Err(e)) => return Ok(Err(self.explain(e, id, head, false).await)),
            None => return Ok(Err(S3Error::InternalError)),
        };
        let stream =
            futures::stream::once(async move { Ok::<_, UpstreamError>(first) }).chain(body);
        let cache = if source == Source::Stale {
            cache.as_stale_str()
        } else {
            cache.as_str()
        };
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
}

/// Whether a GET or HEAD of an object can be answered from the cache: no sub-resource
/// (`?tagging`, `?acl`, `?attributes`...), no `partNumber` (parts are addressed by the upload's
/// layout, which the cache does not know), and no SSE-C (the key must reach S3, and the bytes must
/// never be stored).
///
/// Nor when the request carries a header that S3 checks against the bucket or the caller
/// (`x-amz-expected-bucket-owner`, `x-amz-request-payer`): a cached answer would skip the
/// check, so S3 must see the request.
///
/// Nor a key made only of white space: the upstream client library refuses to build a request
/// for it, so it goes through the pass-through, which addresses any key.
fn cacheable(key: &str, query: &ObjectQuery, headers: &HeaderMap) -> bool {
    !key.trim().is_empty()
        && query.other.is_empty()
        && query.part_number.is_none()
        && ![
            "x-amz-server-side-encryption-customer-algorithm",
            "x-amz-expected-bucket-owner",
            "x-amz-request-payer",
        ]
        .iter()
        .any(|h| headers.contains_key(*h))
}

/// A read that declares SSE-KMS: S3 refuses it (400), as the encryption is chosen on write.
fn declares_kms(headers: &HeaderMap) -> bool {
    headers.contains_key("x-amz-server-side-encryption")
        || headers.contains_key("x-amz-server-side-encryption-aws-kms-key-id")
}

fn has_param(query: Option<&str>, name: &str) -> bool {
    form_urlencoded::parse(query.unwrap_or("").as_bytes()).any(|(k, _)| k == name)
}

/// The cached metadata a write to `target` makes stale: the object, and the version it names.
fn stale_ids(target: &Target, query: Option<&str>) -> Vec<ObjectId> {
    let Target::Object { bucket, key } = target else {
        return Vec::new();
    };
    let id = |version: Option<Arc<str>>| ObjectId {
        bucket: bucket.as_str().into(),
        key: key.as_str().into(),
        version_id: version,
    };
    let mut ids = vec![id(None)];
    let version = form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .find(|(k, _)| k == "versionId")
        .map(|(_, v)| Arc::from(v.as_ref()));
    if version.is_some() {
        ids.push(id(version));
    }
    ids
}

/// The S3 operation, for metrics: a fixed set of names, so label cardinality stays bounded.
fn operation_name(
    method: &Method,
    target: &Target,
    query: &ObjectQuery,
    headers: &HeaderMap,
) -> &'static str {
    let has = |p: &str| query.other.iter().any(|o| o == p);
    match (method, target) {
        (&Method::GET, Target::Service) => "ListBuckets",
        (&Method::GET, Target::Bucket(_)) if has("list-type") => "ListObjectsV2",
        (&Method::GET, Target::Bucket(_)) if has("uploads") => "ListMultipartUploads",
        (&Method::GET, Target::Bucket(_)) if has("versions") => "ListObjectVersions",
        (&Method::GET, Target::Bucket(_))
            if query.other.iter().all(|o| {
                matches!(
                    o.as_str(),
                    "prefix" | "delimiter" | "marker" | "max-keys" | "encoding-type"
                )
            }) =>
        {
            "ListObjects"
        }
        (&Method::HEAD, Target::Bucket(_)) => "HeadBucket",
        (&Method::PUT, Target::Bucket(_)) if query.other.is_empty() => "CreateBucket",
        (&Method::DELETE, Target::Bucket(_)) if query.other.is_empty() => "DeleteBucket",
        (&Method::POST, Target::Bucket(_)) if has("delete") => "DeleteObjects",
        (_, Target::Bucket(_) | Target::Service) => "BucketOther",
        (&Method::GET, Target::Object { .. }) if has("attributes") => "GetObjectAttributes",
        (&Method::GET, Target::Object { .. }) if has("uploadId") => "ListParts",
        (&Method::GET, Target::Object { .. }) if query.other.is_empty() => "GetObject",
        (&Method::HEAD, Target::Object { .. }) => "HeadObject",
        (&Method::PUT, Target::Object { .. }) if has("uploadId") => {
            if headers.contains_key("x-amz-copy-source") {
                "UploadPartCopy"
            } else {
                "UploadPart"
            }
        }
        (&Method::PUT, Target::Object { .. }) if query.other.is_empty() => {
            if headers.contains_key("x-amz-copy-source") {
                "CopyObject"
            } else {
                "PutObject"
            }
        }
        (&Method::POST, Target::Object { .. }) if has("uploads") => "CreateMultipartUpload",
        (&Method::POST, Target::Object { .. }) if has("uploadId") => "CompleteMultipartUpload",
        (&Method::DELETE, Target::Object { .. }) if has("uploadId") => "AbortMultipartUpload",
        (&Method::DELETE, Target::Object { .. }) if query.other.is_empty() => "DeleteObject",
        _ => "ObjectOther",
    }
}

/// How a GET of an object nothing is known of fetches its metadata.
enum Cold {
    /// With the block of this index.
    Block(u64),
    /// With the last this many bytes (a suffix range).
    Tail(u64),
}

/// The object changed upstream between reading its metadata and its first block.
struct Retry;

fn request_id() -> String {
    format!("{:016X}", rand::random::<u64>())
}

/// What the forwarder signs for a body the client protected so: a whole-body hash passes on;
/// signed chunks have been checked here and go on unsigned (or decoded).
impl From<&Payload> for SignedBody {
    fn from(payload: &Payload) -> Self {
        match payload {
            Payload::Sha256(h) => SignedBody::Sha256(h.clone()),
            Payload::UnsignedTrailer => SignedBody::UnsignedTrailer,
            Payload::Unsigned | Payload::SignedChunks { .. } => SignedBody::Unsigned,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read::blocks::BlockStoreConfig;
    use crate::upstream::fake::FakeUpstream;
    use bytes::Bytes;
    use http_body_util::BodyExt;
    use std::time::Duration;

    fn app(origin: Arc<FakeUpstream>) -> Arc<AppState> {
        let metrics = Arc::new(Metrics::default());
        let config = BlockStoreConfig {
            read_window: 2,
            upstream_concurrency: 8,
            ..BlockStoreConfig::for_tests()
        };
        Arc::new(AppState {
            base_domain: None,
            auth: Authenticator::None,
            // Nothing listens there: these tests never pass a request through.
            forwarder: Forwarder::new(
                Some("http://127.0.0.1:9"),
                "us-east-1",
                true,
                None,
                Duration::from_secs(1),
            )
            .unwrap(),
            metadata: Arc::new(MetadataCache::new(
                origin.clone(),
                Duration::from_secs(3600),
                Duration::ZERO,
                100,
            )),
            blocks: Arc::new(BlockStore::new(config, origin.clone(), metrics.clone())),
            origin,
            metrics,
        })
    }

    async fn get(app: &Arc<AppState>, range: &str) -> (StatusCode, HeaderMap, Bytes) {
        let req = Request::builder()
            .uri("/bucket/k")
            .header(header::RANGE, range)
            .body(Body::empty())
            .unwrap();
        let response = handle(State(app.clone()), req).await;
        let (parts, body) = response.into_parts();
        (
            parts.status,
            parts.headers,
            body.collect().await.unwrap().to_bytes(),
        )
    }

    #[tokio::test]
    async fn an_object_changed_under_cached_metadata_is_served_whole_from_the_new_version() {
        let v1: Bytes = vec![1u8; 3 * 4096].into();
        let v2: Bytes = vec![2u8; 3 * 4096].into();
        let origin = Arc::new(FakeUpstream::default());
        origin.put("k", v1.clone(), "\"v1\"");
        let app = app(origin.clone());
        let (status, headers, body) = get(&app, "bytes=0-9").await;
        assert_eq!(
            (status, &body[..]),
            (StatusCode::PARTIAL_CONTENT, &v1[..10])
        );
        assert_eq!(headers[header::ETAG], "\"v1\"");

        // Overwritten upstream while v1's metadata is still trusted; block 2 was never fetched.
        origin.put("k", v2.clone(), "\"v2\"");
        let (status, headers, body) = get(&app, "bytes=8192-8201").await;
        assert_eq!(
            (status, &body[..]),
            (StatusCode::PARTIAL_CONTENT, &v2[8192..8202])
        );
        assert_eq!(
            headers[header::ETAG],
            "\"v2\"",
            "headers and bytes come from the same version"
        );
        // Both times nothing was known, so metadata came with a block GET: 1 for v1's block 0,
        // 1 refused (If-Match v1), 1 for v2's block 2.
        assert_eq!(origin.heads.load(Ordering::SeqCst), 0);
        assert_eq!(origin.gets.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_cold_get_brings_metadata_and_its_block_in_one_request() {
        let data: Bytes = (0..3 * 4096)
            .map(|i| (i % 251) as u8)
            .collect::<Vec<u8>>()
            .into();
        let origin = Arc::new(FakeUpstream::default());
        origin.put("k", data.clone(), "\"v1\"");
        let app = app(origin.clone());
        let (status, headers, body) = get(&app, "bytes=5000-5009").await;
        assert_eq!(
            (status, &body[..]),
            (StatusCode::PARTIAL_CONTENT, &data[5000..5010])
        );
        assert_eq!(headers[header::CONTENT_RANGE], "bytes 5000-5009/12288");
        assert_eq!(headers["x-cache"], "miss");
        assert_eq!(origin.heads.load(Ordering::SeqCst), 0);
        assert_eq!(origin.gets.load(Ordering::SeqCst), 1, "one GET, of block 1");
        let (_, headers, body) = get(&app, "bytes=4096-8191").await;
        assert_eq!(&body[..], &data[4096..8192]);
        // The block may still be arriving for the first reader's fetch: joined, not fetched again.
        assert!(["hit-memory", "coalesced"].contains(&headers["x-cache"].to_str().unwrap()));
        assert_eq!(origin.gets.load(Ordering::SeqCst), 1);

        // A suffix range asks for just those bytes, and gets the metadata with them. An empty
        // object refuses a ranged GET: HEAD then.
        origin.put("s", data.clone(), "\"s1\"");
        origin.put("e", Bytes::new(), "\"e1\"");
        for (key, range, want) in [
            ("s", Some("bytes=-10"), &data[12278..]),
            ("e", None, &[][..]),
        ] {
            let mut req = Request::builder().uri(format!("/bucket/{key}"));
            if let Some(range) = range {
                req = req.header(header::RANGE, range);
            }
            let req = req.body(Body::empty()).unwrap();
            let response = handle(State(app.clone()), req).await;
            let body = response.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(&body[..], want, "{key}");
        }
        assert_eq!(origin.heads.load(Ordering::SeqCst), 1, "the empty object's");
        // "s": one GET of its last 10 bytes; "e": one refused ranged GET.
        assert_eq!(origin.gets.load(Ordering::SeqCst), 1 + 1 + 1);
    }

    #[tokio::test]
    async fn errors_are_s3_xml_with_a_request_id() {
        let app = app(Arc::new(FakeUpstream::default()));
        let (status, headers, body) = get(&app, "bytes=0-1").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(!headers["x-amz-request-id"].is_empty());
        assert_eq!(headers["x-cache"], "error");
        assert!(std::str::from_utf8(&body)
            .unwrap()
            .contains("<Code>NoSuchKey</Code>"));
    }
}
