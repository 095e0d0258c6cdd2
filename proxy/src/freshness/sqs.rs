//! S3 events from an SQS queue (`events_sqs_queue_url`): S3 -> SQS, S3 -> SNS -> SQS, and
//! EventBridge -> SQS on AWS, where nothing can POST to Larder.
//!
//! One task long-polls the queue (up to [`BATCH`] messages, [`WAIT`] at a time), applies what
//! each message says through [`Freshness::apply`], then deletes the batch in one request. A
//! message is deleted only after it was applied, so a crash in between redelivers it (applying
//! an event twice is harmless); a message that is not an event is counted as malformed and
//! deleted too, since redelivering it would not make it readable. At most one batch is held at
//! a time: memory is bounded by SQS's own limits (10 messages of 256 KiB).
//!
//! In a fleet, every replica may poll the same queue: SQS hands each message to one of them,
//! and that replica tells the others (`fleet::notify`), as with a webhook.

use std::sync::Arc;
use std::time::Duration;

use aws_credential_types::provider::SharedCredentialsProvider;
use aws_sdk_sqs::config::{BehaviorVersion, Region};
use aws_sdk_sqs::error::DisplayErrorContext;
use aws_sdk_sqs::types::DeleteMessageBatchRequestEntry;
use http::Uri;
use tokio_util::sync::CancellationToken;

use super::events::{self, Notification};
use super::Freshness;
use crate::telemetry::labels::EventOutcome;
use crate::telemetry::metrics::Metrics;
use crate::upstream::roots::ExtraRoots;

/// Messages asked for per poll: SQS's maximum.
pub const BATCH: i32 = 10;
/// How long one poll waits for a message: SQS's longest long poll.
pub const WAIT: Duration = Duration::from_secs(20);
/// Longest pause after failed polls (doubling from one second).
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Why the queue could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SqsError {
    /// `events_sqs_queue_url` is not a queue URL.
    #[error("events_sqs_queue_url {0}: must be http(s)://host/account/queue")]
    Url(String),
    /// The client for an HTTPS queue could not be built.
    #[error("SQS TLS: {0}")]
    Tls(String),
    /// A request to SQS failed.
    #[error("SQS {0}")]
    Request(String),
}

/// Polls one queue for S3 events.
pub struct SqsConsumer {
    client: aws_sdk_sqs::Client,
    queue_url: String,
    freshness: Arc<Freshness>,
    metrics: Arc<Metrics>,
}

impl SqsConsumer {
    /// A consumer of `queue_url`, signing with `credentials` (the upstream's; `None`: the
    /// standard AWS chain). The endpoint is the queue URL's own origin, so a queue on an
    /// SQS-compatible server works as one on AWS; the region is the URL's
    /// (`sqs.<region>.amazonaws.com`) or else `region`. Over HTTPS the queue's certificate is
    /// checked against the system's CA certificates and `extra_roots` (`upstream_ca_file`).
    pub async fn new(
        queue_url: &str,
        region: &str,
        credentials: Option<SharedCredentialsProvider>,
        extra_roots: Option<&ExtraRoots>,
        freshness: Arc<Freshness>,
        metrics: Arc<Metrics>,
    ) -> Result<Self, SqsError> {
        let uri: Uri = queue_url
            .parse()
            .map_err(|_| SqsError::Url(queue_url.into()))?;
        let (Some(scheme), Some(host)) = (uri.scheme_str(), uri.authority()) else {
            return Err(SqsError::Url(queue_url.into()));
        };
        let region = queue_region(host.host()).unwrap_or(region).to_owned();
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .region(Region::new(region))
            .endpoint_url(format!("{scheme}://{host}"));
        if let Some(credentials) = credentials {
            loader = loader.credentials_provider(credentials);
        }
        if let Some(extra) = extra_roots {
            loader = loader.http_client(extra.sdk_http_client().map_err(SqsError::Tls)?);
        }
        let shared = loader.load().await;
        let config = aws_sdk_sqs::config::Builder::from(&shared)
            // A long poll holds the request open for `WAIT`; the attempt may take that long.
            .timeout_config(
                aws_sdk_sqs::config::timeout::TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(5))
                    .operation_attempt_timeout(WAIT + Duration::from_secs(10))
                    .build(),
            )
            .build();
        Ok(Self {
            client: aws_sdk_sqs::Client::from_conf(config),
            queue_url: queue_url.to_owned(),
            freshness,
            metrics,
        })
    }

    /// Poll until `shutdown`, backing off while SQS fails (the event stream then falls silent
    /// and, past `events_max_silence`, Larder falls back to short TTLs by itself).
    pub async fn run(self, shutdown: CancellationToken) {
        let mut backoff = Duration::from_secs(1);
        loop {
            let polled = tokio::select! {
                polled = self.poll() => polled,
                () = shutdown.cancelled() => return,
            };
            match polled {
                Ok(_) => backoff = Duration::from_secs(1),
                Err(e) => {
                    tracing::warn!(error = %e, queue = %self.queue_url, retry_in = ?backoff, "polling the S3 event queue failed");
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = shutdown.cancelled() => return,
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    /// One long poll: apply what arrived and delete it. Returns the number of messages.
    pub async fn poll(&self) -> Result<usize, SqsError> {
        let received = self
            .client
            .receive_message()
            .queue_url(&self.queue_url)
            .max_number_of_messages(BATCH)
            .wait_time_seconds(WAIT.as_secs() as i32)
            .send()
            .await
            .map_err(|e| {
                SqsError::Request(format!("ReceiveMessage: {}", DisplayErrorContext(e)))
            })?;
        let messages = received.messages.unwrap_or_default();
        let mut done = Vec::with_capacity(messages.len());
        for (i, message) in messages.iter().enumerate() {
            let body = message.body.as_deref().unwrap_or_default();
            match events::parse(body.as_bytes()) {
                Ok(Notification::Changes(changes)) => self.freshness.apply(&changes).await,
                // SNS confirms an SQS subscription by itself; a confirmation request here means
                // an HTTP subscription's message was routed to the queue by mistake.
                Ok(Notification::ConfirmSubscription { topic, .. }) => {
                    tracing::warn!(%topic, "an SNS subscription confirmation arrived on the S3 event queue; ignored");
                }
                Err(e) => {
                    tracing::warn!(error = %e, "a message on the S3 event queue is not an S3 event; deleted");
                    self.metrics.event(EventOutcome::Malformed, Duration::ZERO);
                }
            }
            if let Some(handle) = &message.receipt_handle {
                let entry = DeleteMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(handle)
                    .build()
                    .map_err(|e| SqsError::Request(e.to_string()))?;
                done.push(entry);
            }
        }
        if !done.is_empty() {
            let deleted = self
                .client
                .delete_message_batch()
                .queue_url(&self.queue_url)
                .set_entries(Some(done))
                .send()
                .await
                .map_err(|e| {
                    SqsError::Request(format!("DeleteMessageBatch: {}", DisplayErrorContext(e)))
                })?;
            // Not deleted: it comes back after its visibility timeout and is applied again.
            if !deleted.failed.is_empty() {
                tracing::warn!(
                    failed = deleted.failed.len(),
                    "some S3 event messages could not be deleted; they will be applied again"
                );
            }
        }
        Ok(messages.len())
    }
}

/// The region of an AWS queue host: `sqs.<region>.amazonaws.com[.cn]` or the legacy
/// `<region>.queue.amazonaws.com`.
fn queue_region(host: &str) -> Option<&str> {
    if let Some(rest) = host.strip_prefix("sqs.") {
        return rest
            .strip_suffix(".amazonaws.com")
            .or_else(|| rest.strip_suffix(".amazonaws.com.cn"));
    }
    host.strip_suffix(".queue.amazonaws.com")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_region_comes_from_an_aws_queue_host() {
        assert_eq!(
            queue_region("sqs.eu-west-1.amazonaws.com"),
            Some("eu-west-1")
        );
        assert_eq!(
            queue_region("sqs.cn-north-1.amazonaws.com.cn"),
            Some("cn-north-1")
        );
        assert_eq!(
            queue_region("us-east-2.queue.amazonaws.com"),
            Some("us-east-2")
        );
        assert_eq!(queue_region("127.0.0.1"), None);
    }
}
