//! Why the upstream could not deliver, and the one place that decides what each failure means:
//! whether it is the upstream being unwell (an outage), whether a body that broke may be resumed,
//! and which label it carries in the metrics. Its S3 answer is decided by the S3 front
//! (`s3::error`), which depends on this module, never the reverse.

use bytes::Bytes;
use futures::stream::BoxStream;

/// A body arriving from the upstream.
pub type BodyStream = BoxStream<'static, Result<Bytes, UpstreamError>>;

/// Why the origin could not deliver.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpstreamError {
    /// The upstream answered with an S3 error.
    #[error("upstream answered {status} {code}: {message}")]
    Service {
        /// HTTP status.
        status: u16,
        /// S3 error code (for HEAD, which has no body, derived from the status).
        code: String,
        /// Message.
        message: String,
    },
    /// An `If-Match` fetch found another ETag: the object changed since its metadata was read.
    #[error("the object changed upstream")]
    Changed,
    /// The upstream could not be reached, or the connection broke.
    #[error("upstream transport error: {0}")]
    Transport(String),
    /// TLS with the upstream failed: its certificate was refused (untrusted, for another name,
    /// expired), the handshake failed, or a record did not decrypt. Handled as a transport
    /// failure (an outage; retried, resumed on a new connection), but labelled apart, so that
    /// a refused certificate shows as what it is.
    #[error("upstream TLS failed: {0}")]
    Tls(String),
    /// The upstream did not answer, or stopped sending, within the configured time.
    #[error("upstream timed out: {0}")]
    Timeout(String),
    /// The upstream body was shorter or longer than announced.
    #[error("upstream body had {got} bytes, expected {expected}")]
    BodyLength {
        /// Bytes received.
        got: u64,
        /// Bytes expected.
        expected: u64,
    },
    /// The task fetching the bytes went away before finishing.
    #[error("the upstream fetch was abandoned")]
    Abandoned,
    /// Larder could not build the upstream request: a fault here, never the upstream's outage.
    #[error("could not build the upstream request: {0}")]
    Internal(String),
}

impl From<cache_core::Abandoned> for UpstreamError {
    fn from(_: cache_core::Abandoned) -> Self {
        UpstreamError::Abandoned
    }
}

impl UpstreamError {
    /// Whether the upstream said the object (or its bucket) does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, UpstreamError::Service { status: 404, .. })
    }

    /// Whether the failure is the upstream being unwell (rather than answering): what
    /// `serve_stale_on_error` serves through.
    pub fn is_outage(&self) -> bool {
        match self {
            UpstreamError::Service { status, .. } => *status >= 500,
            UpstreamError::Transport(_) | UpstreamError::Tls(_) | UpstreamError::Timeout(_) => true,
            _ => false,
        }
    }

    /// Whether the upstream asked Larder to slow down: `503` (S3's `SlowDown`, and HEAD's
    /// bodiless 503) or `429` (S3-compatible stores that throttle with it). The throttle layer
    /// (`upstream::throttle`) backs off per prefix on these, and the S3 client leaves them to it.
    pub fn is_throttled(&self) -> bool {
        match self {
            UpstreamError::Service { status, .. } => is_throttling_status(*status),
            _ => false,
        }
    }

    /// Whether a body that broke this way may be asked for again from where it stopped (on the
    /// same ETag): the connection failed, not the upstream's answer.
    pub fn is_resumable(&self) -> bool {
        matches!(
            self,
            UpstreamError::Transport(_)
                | UpstreamError::Tls(_)
                | UpstreamError::Timeout(_)
                | UpstreamError::BodyLength { .. }
        )
    }

    /// How the upstream request ended, as the metrics label it: an HTTP status where the
    /// upstream answered, else the kind of failure.
    pub fn outcome(&self) -> UpstreamOutcome {
        match self {
            UpstreamError::Service { status, .. } => UpstreamOutcome::Http(*status),
            UpstreamError::Changed => UpstreamOutcome::Http(412),
            UpstreamError::Transport(_) => UpstreamOutcome::Failed("transport"),
            UpstreamError::Tls(_) => UpstreamOutcome::Failed("tls"),
            UpstreamError::Timeout(_) => UpstreamOutcome::Failed("timeout"),
            UpstreamError::BodyLength { .. } => UpstreamOutcome::Failed("truncated"),
            UpstreamError::Abandoned => UpstreamOutcome::Failed("abandoned"),
            UpstreamError::Internal(_) => UpstreamOutcome::Failed("internal"),
        }
    }
}

/// Whether an HTTP status from the upstream means "slow down" (see
/// [`UpstreamError::is_throttled`]).
pub fn is_throttling_status(status: u16) -> bool {
    matches!(status, 429 | 503)
}

/// How an upstream request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamOutcome {
    /// With an HTTP response of this status.
    Http(u16),
    /// Without a response: `transport`, `tls`, `timeout`, `truncated`, `abandoned`, `internal`.
    Failed(&'static str),
}

impl From<&UpstreamError> for UpstreamOutcome {
    fn from(e: &UpstreamError) -> Self {
        e.outcome()
    }
}

/// `e` and its causes, for a log line or an error message: an HTTP client's error alone says
/// only "client error (Connect)", its causes what failed (a refused certificate, a reset).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    s
}
