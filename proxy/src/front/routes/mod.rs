//! The S3 front: every request is authenticated and authorised; GetObject and HeadObject go
//! through the block cache; everything else passes through to the upstream, re-signed.
//!
//! A cached GET goes: [`handle`] → [`crate::auth`] → address and query
//! ([`crate::s3::request`]) → metadata ([`MetadataCache`]) → conditionals and range
//! ([`crate::s3`]) → bytes ([`BlockStore::read`]). Anything else goes to [`Forwarder::send`],
//! and a write that succeeds forgets what was cached of its object.
//!
//! This file takes a request in, names its operation ([`crate::s3::operation`]), authenticates
//! it and dispatches it; `object` answers cached reads, `pass_through` everything else, and
//! `timed` records each response's duration when its body ends.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use futures::FutureExt;
use http::request::Parts;
use http::{HeaderValue, Method};
use tracing::Instrument;

use crate::auth::Authenticator;
use crate::freshness::Freshness;
use crate::front::handler::Handler;
use crate::qos::Paced;
use crate::read::blocks::BlockStore;
use crate::read::listing::ListingCache;
use crate::read::metadata::MetadataCache;
use crate::read::parts::PartLayouts;
use crate::s3::copy_source::CopySource;
use crate::s3::headers::names;
use crate::s3::operation::{self, Operation};
use crate::s3::query::Query;
use crate::s3::request::{self, ObjectQuery, Target};
use crate::s3::S3Error;
use crate::telemetry::labels::XCache;
use crate::telemetry::metrics::{KeyTally, Metrics};
use crate::upstream::forward::Forwarder;
use crate::upstream::Upstream;
use crate::warm::profile::Profiler;

mod listing;
mod object;
mod part;
mod pass_through;
mod timed;

use object::{cacheable, cacheable_part, declares_kms};
use timed::{ResponseDone, TimedBody};

/// A request's answer and its `X-Cache` value, or its S3 error.
type Handled = Result<(Response, XCache), S3Error>;

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
    /// Where the parts of multipart uploads lie, as `partNumber` reads found them.
    pub parts: PartLayouts,
    /// Listing pages (`list_ttl`), when any may be cached.
    pub listings: Option<Arc<ListingCache>>,
    /// What a write through Larder drops, here and in the fleet.
    pub freshness: Arc<Freshness>,
    /// The upstream, for the rare request the caches cannot answer (explaining a 404).
    pub origin: Arc<dyn Upstream>,
    /// The upstream, for every request that is not a cacheable read.
    pub forwarder: Arc<Forwarder>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Larder's own upstream requests say it pays for them (`upstream_requester_pays`), so
    /// reads that say so too may be answered from the cache.
    pub larder_pays: bool,
    /// Records the byte ranges clients read while an access profile is recorded (`/profile`).
    pub profile: Arc<Profiler>,
}

/// The S3 front's service: every request to [`handle`].
pub fn service(state: Arc<AppState>) -> Handler<AppState, impl Future<Output = Response> + Send> {
    Handler::new(state, handle)
}

/// Every S3 request lands here.
async fn handle(app: Arc<AppState>, req: Request) -> Response {
    let started = Instant::now();
    let request_id = RequestId::next();
    let (req, body) = req.into_parts();
    let method = req.method.clone();
    // The URI's text is shared, not copied, so its path and query outlive `req`, which the
    // dispatch takes. The query is parsed once, here, for authentication and routing alike.
    let uri = req.uri.clone();
    let resource = uri.path();
    let query = Query::parse(uri.query());
    let parsed = app.parse(&req, &query);
    let span = tracing::info_span!(
        "request",
        otel.name = parsed.2.as_str(),
        otel.kind = "server",
        http.request.method = %method,
        s3.bucket = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
        larder.cache = tracing::field::Empty,
        larder.request_id = %request_id,
    );
    // Boxed: the dispatch's future (4.7 KB, most of it the object path's) is copied once, into
    // its box, instead of with each move of this future (axum boxes it, `instrument` wraps
    // it): 1.9 % of a small hit's instructions (docs/benchmarks.md, "One block key per
    // small hit").
    let named = parsed.2;
    let dispatched = AssertUnwindSafe(
        Box::pin(app.dispatch(req, body, &query, parsed)).instrument(span.clone()),
    )
    .catch_unwind()
    .await;
    let (operation, bucket, tally, result) = dispatched.unwrap_or_else(|_| {
        // A bug, not the client's doing. Answered as S3 answers its own faults (500
        // InternalError, which SDKs retry), counted and logged as any failed request, so the
        // client gets an answer and its connection goes on; left to unwind, the panic would
        // end the HTTP/1.1 connection, or reset the HTTP/2 stream, with no answer. Unwind
        // safety: the dispatch's future is dropped and nothing it held is read here; shared
        // state is left as a panic in a task of its own would leave it. The message went to
        // the panic hook (stderr).
        span.in_scope(
            || tracing::error!(%method, %resource, %request_id, "the request's handler panicked"),
        );
        (named, None, None, Err(S3Error::InternalError))
    });
    let (mut response, cache) = match result {
        Ok((response, cache)) => (response, cache),
        Err(e) => {
            // A key's refusals past its rate are its own doing, counted by key, not logged.
            if e.status().is_server_error() && !matches!(e, S3Error::SlowDown) {
                span.in_scope(|| {
                    tracing::warn!(%method, %resource, %request_id, code = e.code(), error = %e, "request failed")
                });
            }
            (
                e.into_response(&method, resource, request_id.as_str()),
                XCache::Error,
            )
        }
    };
    let headers = response.headers_mut();
    if !headers.contains_key(names::X_AMZ_REQUEST_ID) {
        if let Some(v) = crate::s3::headers::request_id(request_id.as_str()) {
            headers.insert(names::X_AMZ_REQUEST_ID, v);
        }
    }
    headers.insert(names::X_CACHE, HeaderValue::from_static(cache.as_str()));
    let status = response.status().as_u16();
    span.record("http.response.status_code", i64::from(status));
    span.record("larder.cache", cache.as_str());
    if let Some(b) = &bucket {
        span.record("s3.bucket", &**b);
    }
    app.metrics.request(
        operation,
        bucket.as_deref(),
        status,
        cache,
        started.elapsed(),
    );
    if let Some(tally) = &tally {
        tally.request(operation, cache);
    }
    let done = ResponseDone {
        metrics: app.metrics.clone(),
        operation,
        started,
        // A GET's object bytes are counted to its key as they are sent.
        tally: tally
            .filter(|_| operation == Operation::GetObject)
            .map(|t| (t, cache)),
    };
    response.map(|body| Body::new(TimedBody::new(body, span, done)))
}

impl AppState {
    /// What a request addresses and which operation it is. Computed before authentication only
    /// to name the request's span; nothing is answered from it until the client is known.
    fn parse(
        &self,
        req: &Parts,
        query: &Query<'_>,
    ) -> (Result<Target, S3Error>, ObjectQuery, Operation) {
        let target = request::host(req)
            .and_then(|host| request::target(host, req.uri.path(), self.base_domain.as_deref()));
        let query = ObjectQuery::of(query);
        let operation = match &target {
            Ok(t) => operation::name(&req.method, t, &query, &req.headers),
            Err(_) => Operation::Unknown,
        };
        (target, query, operation)
    }

    /// The operation's name (for metrics), its bucket and the answer.
    async fn dispatch(
        &self,
        req: Parts,
        body: Body,
        params: &Query<'_>,
        (target, query, operation): (Result<Target, S3Error>, ObjectQuery, Operation),
    ) -> (Operation, Option<Arc<str>>, Option<Arc<KeyTally>>, Handled) {
        // A browser-form upload carries its signature in the form: verified there.
        if let Ok(t @ Target::Bucket(bucket)) = &target {
            if crate::front::form_upload::is_form_upload(&req, t) {
                let bucket = bucket.clone();
                let uploader = crate::front::form_upload::Uploader {
                    auth: &self.auth,
                    freshness: &self.freshness,
                    forwarder: &self.forwarder,
                    metrics: &self.metrics,
                };
                let mut signer = None;
                let upload = crate::front::form_upload::upload(
                    uploader,
                    req,
                    body,
                    bucket.to_string(),
                    &mut signer,
                );
                let result = Box::pin(upload).await;
                return (
                    Operation::PostObject,
                    Some(bucket),
                    signer,
                    result.map(|r| (r, XCache::Pass)),
                );
            }
        }
        // Authenticate before looking at anything else, so an unknown client learns nothing.
        let mut principal = match self
            .auth
            .authenticate(&req, params, self.base_domain.as_deref())
        {
            Ok(p) => p,
            Err(e) => return (Operation::Unauthenticated, None, None, Err(e)),
        };
        // Taken, not cloned: nothing after this reads the principal's tally.
        let tally = principal.tally.take();
        let target = match target {
            Ok(t) => t,
            Err(e) => return (operation, None, tally, Err(e)),
        };
        let bucket = target.bucket().cloned();
        // A key over its requests a second is refused before any work is done for it.
        if let Err(e) = principal.admit() {
            return (operation, bucket, tally, Err(e));
        }
        let paced = principal.limits.clone().filter(|l| l.paces());
        // The copy source is authorised and forwarded as one parse, never as the client's text.
        let copy_source = match req.headers.get(names::X_AMZ_COPY_SOURCE) {
            Some(v) => match CopySource::parse(v.as_bytes()) {
                Ok(source) => Some(source),
                Err(e) => return (operation, bucket, tally, Err(e)),
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
            return (operation, bucket, tally, Err(e));
        }
        // The target is moved into what answers it: a read takes its bucket and key as they are.
        // A read of one part of a multipart upload, which the cache may answer.
        let part = match &target {
            Target::Object { key, .. } => {
                cacheable_part(key, &query, &req.headers, self.larder_pays)
            }
            _ => None,
        };
        let result = match (&req.method, target, part) {
            (&Method::GET | &Method::HEAD, Target::Object { .. }, _)
                if declares_kms(&req.headers) =>
            {
                Err(S3Error::InvalidArgument(
                    "Server Side Encryption with AWS KMS managed key requires no x-amz-server-side-encryption headers on a read"
                        .into(),
                ))
            }
            (&Method::GET | &Method::HEAD, Target::Object { bucket, key }, _)
                if cacheable(&key, &query, &req.headers, self.larder_pays) =>
            {
                let head = req.method == Method::HEAD;
                let reader = principal.access_key.as_deref();
                self.object(&req, bucket, key, &query, head, reader).await
            }
            (&Method::GET | &Method::HEAD, Target::Object { bucket, key }, Some(part)) => {
                let read =
                    self.object_part(req, body, bucket, key, &query, part, principal, operation);
                Box::pin(read).await
            }
            (_, target, _) => match self.listing(&req, &target) {
                Some(list) => {
                    Box::pin(self.list(req, body, target, principal, operation, list)).await
                }
                None => {
                    let pass =
                        self.pass_through(req, body, target, principal, copy_source, operation);
                    Box::pin(pass).await
                }
            },
        };
        let result = match paced {
            Some(limits) => result.map(|(response, cache)| {
                (
                    response.map(|body| Body::new(Paced::new(body, limits))),
                    cache,
                )
            }),
            None => result,
        };
        (operation, bucket, tally, result)
    }
}

/// A request's id, as S3 gives one: 16 upper-case hex digits of a random number, written without
/// `format!` (its allocation and formatting were most of the id's cost, about 1 % of a small
/// hit's CPU). Random, not counted: consecutive ids would tell any client how many requests
/// the others made between two of its own.
struct RequestId([u8; 16]);

impl RequestId {
    fn next() -> Self {
        Self::of(rand::random())
    }

    fn of(n: u64) -> Self {
        const HEX: &[u8; 16] = b"0123456789ABCDEF";
        let mut digits = [0u8; 16];
        for (i, d) in digits.iter_mut().enumerate() {
            *d = HEX[(n >> (60 - 4 * i) & 0xF) as usize];
        }
        Self(digits)
    }

    fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("hex digits are ASCII")
    }
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::RequestId;

    #[test]
    fn a_request_id_is_sixteen_hex_digits_and_the_next_is_another() {
        for n in [0, 1, 0x0123_4567_89AB_CDEF, u64::MAX, 0xF000_0000_0000_000A] {
            assert_eq!(RequestId::of(n).as_str(), format!("{n:016X}"));
        }
        let (a, b) = (RequestId::next(), RequestId::next());
        assert_ne!(a.as_str(), b.as_str());
    }
}
