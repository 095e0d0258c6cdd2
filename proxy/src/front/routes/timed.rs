//! A response body that records the whole response's duration when it ends or the client
//! goes away.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;

use crate::s3::operation::Operation;
use crate::telemetry::metrics::Metrics;

/// Records a response's whole duration when its body ends or the client goes away.
pub(super) struct ResponseDone {
    pub(super) metrics: Arc<Metrics>,
    pub(super) operation: Operation,
    pub(super) started: Instant,
}

impl ResponseDone {
    fn record(self) {
        self.metrics
            .response_done(self.operation, self.started.elapsed());
    }
}

/// A response body that streams inside its request's span (blocks opened while streaming are
/// fetched beneath it) and keeps the span open until the last byte.
pub(super) struct TimedBody {
    inner: Body,
    span: tracing::Span,
    done: Option<ResponseDone>,
}

impl TimedBody {
    pub(super) fn new(inner: Body, span: tracing::Span, done: ResponseDone) -> Self {
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
