//! ListObjectsV2 and ListObjects from the listing cache (`list_ttl`, off by default): a kept
//! page is answered with S3's exact bytes; a missing one passes through, and its body is kept
//! as it streams to the client.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use futures::Stream;
use http::request::Parts;
use http::{header, HeaderMap, HeaderValue, Method, StatusCode};

use crate::auth::Principal;
use crate::read::listing::{ListQuery, ListingCache, Ticket, MAX_PAGE};
use crate::s3::operation::Operation;
use crate::s3::request::Target;
use crate::telemetry::labels::XCache;

use super::{AppState, Handled};

/// Headers of a listing kept with its body (the rest are per request).
const KEPT_HEADERS: [&str; 2] = ["content-type", "x-amz-bucket-region"];

impl AppState {
    /// The listing cache's view of a request: `Some` for a GET listing it may answer.
    pub(super) fn listing(&self, req: &Parts, target: &Target) -> Option<ListQuery> {
        let (Some(listings), Target::Bucket(bucket)) = (&self.listings, target) else {
            return None;
        };
        // Headers S3 checks against the bucket or the caller, or that change the page: S3
        // must see such a request.
        let checked = [
            "x-amz-expected-bucket-owner",
            "x-amz-request-payer",
            "x-amz-optional-object-attributes",
        ];
        if req.method != Method::GET || checked.iter().any(|h| req.headers.contains_key(*h)) {
            return None;
        }
        listings.query(bucket, req.uri.query())
    }

    /// Answer a listing from the cache, or pass it through and keep the page.
    pub(super) async fn list(
        &self,
        req: Parts,
        body: Body,
        target: Target,
        principal: Principal,
        operation: Operation,
        query: ListQuery,
    ) -> Handled {
        let Some(listings) = self.listings.clone() else {
            return self
                .pass_through(req, body, target, principal, None, operation)
                .await;
        };
        if let Some(page) = listings.get(&query) {
            let mut response = Response::new(Body::from(page.body.clone()));
            *response.headers_mut() = page.headers.clone();
            response
                .headers_mut()
                .insert(header::CONTENT_LENGTH, HeaderValue::from(page.body.len()));
            return Ok((response, XCache::HitMemory));
        }
        let ticket = listings.ticket(query);
        let (response, _) = self
            .pass_through(req, body, target, principal, None, operation)
            .await?;
        if response.status() != StatusCode::OK {
            return Ok((response, XCache::Pass));
        }
        let mut kept = HeaderMap::new();
        for name in KEPT_HEADERS {
            if let Some(v) = response.headers().get(name) {
                kept.insert(name, v.clone());
            }
        }
        let length = response
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        let response = response.map(|body| {
            Body::from_stream(Keep {
                inner: body.into_data_stream(),
                page: BytesMut::new(),
                length,
                keep: Some((listings, ticket, kept)),
            })
        });
        Ok((response, XCache::Miss))
    }
}

/// A listing's body on its way to the client, kept once it has all arrived (and not at all
/// if it breaks or outgrows [`MAX_PAGE`]). With a `Content-Length`, "all" is that many bytes:
/// the server stops polling a body once it has sent what the header announced.
struct Keep<S> {
    inner: S,
    page: BytesMut,
    length: Option<usize>,
    keep: Option<(Arc<ListingCache>, Ticket, HeaderMap)>,
}

impl<S> Keep<S> {
    fn done(&mut self) {
        if let Some((listings, ticket, headers)) = self.keep.take() {
            let page = std::mem::take(&mut self.page).freeze();
            listings.insert(ticket, headers, page);
        }
    }
}

impl<S, E> Stream for Keep<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
{
    type Item = Result<Bytes, E>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let next = Pin::new(&mut this.inner).poll_next(cx);
        match &next {
            Poll::Ready(Some(Ok(chunk))) if this.keep.is_some() => {
                if this.page.len() + chunk.len() > MAX_PAGE {
                    this.keep = None;
                    this.page = BytesMut::new();
                } else {
                    this.page.extend_from_slice(chunk);
                    if this.length == Some(this.page.len()) {
                        this.done();
                    }
                }
            }
            Poll::Ready(Some(Err(_))) => this.keep = None,
            Poll::Ready(None) => this.done(),
            _ => {}
        }
        next
    }
}
