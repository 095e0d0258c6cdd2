//! A response body that records the whole response's duration when it ends or the client
//! goes away, and the object bytes it sent to its key's tally.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;

use crate::s3::operation::Operation;
use crate::telemetry::labels::XCache;
use crate::telemetry::metrics::{KeyTally, Metrics};

/// Records a response's whole duration when its body ends or the client goes away.
pub(super) struct ResponseDone {
    pub(super) metrics: Arc<Metrics>,
    pub(super) operation: Operation,
    pub(super) started: Instant,
    /// The tally of the key a GET's object bytes are counted to, and how it was answered.
    pub(super) tally: Option<(Arc<KeyTally>, XCache)>,
}

impl ResponseDone {
    /// The response ended after `sent` body bytes.
    fn record(self, sent: u64) {
        self.metrics
            .response_done(self.operation, self.started.elapsed());
        if let Some((tally, cache)) = self.tally {
            tally.object_bytes(cache, sent);
        }
    }
}

/// A response body that streams inside its request's span (blocks opened while streaming are
/// fetched beneath it) and keeps the span open until the last byte.
pub(super) struct TimedBody {
    inner: Body,
    span: tracing::Span,
    done: Option<ResponseDone>,
    /// Body bytes sent so far.
    sent: u64,
}

impl TimedBody {
    pub(super) fn new(inner: Body, span: tracing::Span, done: ResponseDone) -> Self {
        Self {
            inner,
            span,
            done: Some(done),
            sent: 0,
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
        match &polled {
            std::task::Poll::Ready(Some(Ok(frame))) => {
                this.sent += frame.data_ref().map_or(0, |d| d.len() as u64);
            }
            std::task::Poll::Ready(None | Some(Err(_))) => {
                if let Some(done) = this.done.take() {
                    done.record(this.sent);
                }
            }
            std::task::Poll::Pending => {}
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
            done.record(self.sent);
        }
    }
}
