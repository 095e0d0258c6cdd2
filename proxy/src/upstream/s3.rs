//! The origin on aws-sdk-s3: credentials from the standard AWS chain (environment, profile,
//! web identity / IRSA, ECS, IMDS), requests signed with Larder's own credentials.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_sdk_s3::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region, StalledStreamProtectionConfig};
use aws_sdk_s3::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_s3::operation::head_object::HeadObjectOutput;
use aws_sdk_s3::Client;
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::context::InterceptorContext;
use aws_smithy_runtime_api::client::retries::classifiers::{
    ClassifyRetry, RetryAction, RetryClassifierPriority,
};
use aws_smithy_runtime_api::client::retries::RequestAttempts;
use futures::StreamExt;
use http::{HeaderName, HeaderValue};

use super::Upstream;
use crate::model::{
    is_throttling_status, BodyStream, ByteRange, ObjectId, ObjectMeta, UpstreamError,
};

/// How to reach the upstream.
#[derive(Debug, Clone)]
pub struct S3UpstreamConfig {
    /// Endpoint URL; `None` for AWS S3.
    pub endpoint: Option<String>,
    /// Region.
    pub region: String,
    /// Path-style addressing.
    pub path_style: bool,
    /// Fixed credentials; `None` to use the standard AWS chain.
    pub credentials: Option<Credentials>,
    /// Longest wait to connect.
    pub connect_timeout: Duration,
    /// Longest wait for response headers, per attempt.
    pub first_byte_timeout: Duration,
    /// Attempts per request (standard retries: backoff with jitter).
    pub max_attempts: u32,
}

impl Default for S3UpstreamConfig {
    fn default() -> Self {
        Self {
            endpoint: None,
            region: "us-east-1".into(),
            path_style: false,
            credentials: None,
            connect_timeout: Duration::from_secs(5),
            first_byte_timeout: Duration::from_secs(30),
            max_attempts: 3,
        }
    }
}

/// The upstream S3 API through aws-sdk-s3.
pub struct S3Upstream {
    client: Client,
    credentials: Option<aws_credential_types::provider::SharedCredentialsProvider>,
    retries: Arc<AtomicU64>,
}

/// Counts the SDK's retries: every attempt after an operation's first.
#[derive(Debug)]
struct CountRetries(Arc<AtomicU64>);

impl Intercept for CountRetries {
    fn name(&self) -> &'static str {
        "CountRetries"
    }

    fn read_before_attempt(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if cfg
            .load::<RequestAttempts>()
            .is_some_and(|a| a.attempts() > 1)
        {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// Leaves throttling answers (503, 429) to the per-prefix throttle layer (`throttle.rs`): the
/// client's own backoff is per request, so it would keep every other request of the prefix
/// coming, and it would hide from the layer that the prefix was throttled at all. Runs after
/// the SDK's classifiers, so its verdict is the last word.
#[derive(Debug)]
struct LeaveThrottlingToTheLayer;

impl ClassifyRetry for LeaveThrottlingToTheLayer {
    fn name(&self) -> &'static str {
        "LeaveThrottlingToTheLayer"
    }

    fn classify_retry(&self, ctx: &InterceptorContext) -> RetryAction {
        match ctx.response() {
            Some(r) if is_throttling_status(r.status().as_u16()) => RetryAction::RetryForbidden,
            _ => RetryAction::NoActionIndicated,
        }
    }

    fn priority(&self) -> RetryClassifierPriority {
        RetryClassifierPriority::run_after(RetryClassifierPriority::transient_error_classifier())
    }
}

impl S3Upstream {
    /// Build a client, loading credentials from the standard AWS chain.
    pub async fn new(config: &S3UpstreamConfig) -> Self {
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .region(Region::new(config.region.clone()));
        if let Some(endpoint) = &config.endpoint {
            loader = loader.endpoint_url(endpoint);
        }
        if let Some(credentials) = &config.credentials {
            loader = loader.credentials_provider(credentials.clone());
        }
        let shared = loader.load().await;
        let retries = Arc::new(AtomicU64::new(0));
        let s3 = aws_sdk_s3::config::Builder::from(&shared)
            .interceptor(CountRetries(retries.clone()))
            .retry_classifier(LeaveThrottlingToTheLayer)
            .force_path_style(config.path_style)
            // Standard retries (backoff with jitter) cover 5xx and resets before the first
            // byte; a body that breaks later is resumed by the block store, and SlowDown is
            // left to the throttle layer (`LeaveThrottlingToTheLayer`).
            .retry_config(RetryConfig::standard().with_max_attempts(config.max_attempts))
            // A body that stalls is the resume layer's to time (`upstream_idle_timeout`, every
            // block GET is pinned and ranged) and to continue where it stopped. The SDK's own
            // stalled-stream protection was a second clock: it cut any body silent for about 5 s
            // (its default grace period), whatever `upstream_idle_timeout` said, and timed every
            // chunk of every body.
            .stalled_stream_protection(StalledStreamProtectionConfig::disabled())
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(config.connect_timeout)
                    .operation_attempt_timeout(config.first_byte_timeout)
                    .build(),
            )
            .build();
        Self {
            client: Client::from_conf(s3),
            credentials: shared.credentials_provider(),
            retries,
        }
    }

    /// The credentials this origin signs with, for the pass-through to sign with too.
    pub fn credentials(&self) -> Option<aws_credential_types::provider::SharedCredentialsProvider> {
        self.credentials.clone()
    }
}

#[async_trait::async_trait]
impl Upstream for S3Upstream {
    fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    async fn list(
        &self,
        bucket: &str,
        prefix: &str,
        token: Option<String>,
    ) -> Result<(Vec<(String, u64)>, Option<String>), UpstreamError> {
        let out = self
            .client
            .list_objects_v2()
            .bucket(bucket)
            .prefix(prefix)
            .set_continuation_token(token)
            .send()
            .await
            .map_err(map_error)?;
        let objects = out
            .contents()
            .iter()
            .filter_map(|o| Some((o.key()?.to_owned(), o.size().unwrap_or(0).max(0) as u64)))
            .collect();
        let next = match out.is_truncated() {
            Some(true) => out.next_continuation_token().map(str::to_owned),
            _ => None,
        };
        Ok((objects, next))
    }

    async fn head(&self, object: &ObjectId) -> Result<ObjectMeta, UpstreamError> {
        let out = self
            .client
            .head_object()
            .bucket(object.bucket.as_ref())
            .key(object.key.as_ref())
            .set_version_id(object.version_id.as_deref().map(str::to_owned))
            .send()
            .await
            .map_err(map_error)?;
        meta_from_head(out)
    }

    async fn get(
        &self,
        object: &ObjectId,
        if_match: Option<&str>,
        range: Option<Range<u64>>,
    ) -> Result<BodyStream, UpstreamError> {
        let expected = range.as_ref().map(|r| r.end - r.start);
        let out = self
            .client
            .get_object()
            .bucket(object.bucket.as_ref())
            .key(object.key.as_ref())
            .set_version_id(object.version_id.as_deref().map(str::to_owned))
            .set_if_match(if_match.map(str::to_owned))
            .set_range(
                range
                    .filter(|r| r.end > r.start)
                    .map(|r| format!("bytes={}-{}", r.start, r.end - 1)),
            )
            .send()
            .await
            .map_err(|e| match map_error(e) {
                UpstreamError::Service { status: 412, .. } if if_match.is_some() => {
                    UpstreamError::Changed
                }
                other => other,
            })?;
        if let (Some(expected), Some(len)) = (expected, out.content_length) {
            if u64::try_from(len).ok() != Some(expected) {
                return Err(UpstreamError::BodyLength {
                    got: len.max(0) as u64,
                    expected,
                });
            }
        }
        Ok(body_stream(out.body))
    }

    async fn get_with_meta(
        &self,
        object: &ObjectId,
        span: ByteRange,
    ) -> Result<Option<(ObjectMeta, BodyStream)>, UpstreamError> {
        let result = self
            .client
            .get_object()
            .bucket(object.bucket.as_ref())
            .key(object.key.as_ref())
            .set_version_id(object.version_id.as_deref().map(str::to_owned))
            .range(span.header())
            .send()
            .await;
        let mut out = match result {
            Ok(out) => out,
            Err(e) => {
                return match map_error(e) {
                    // Past the end, or an empty object: only a HEAD says which.
                    UpstreamError::Service { status: 416, .. } => Ok(None),
                    other => Err(other),
                };
            }
        };
        let Some(size) = out
            .content_range
            .as_deref()
            .and_then(total_of_content_range)
        else {
            return Ok(None);
        };
        let within = span.within(size);
        let expected = within.end - within.start;
        if out.content_length.and_then(|l| u64::try_from(l).ok()) != Some(expected) {
            return Err(UpstreamError::BodyLength {
                got: out.content_length.unwrap_or(0).max(0) as u64,
                expected,
            });
        }
        let body = std::mem::take(&mut out.body);
        let meta = object_meta!(out, size, "GET")?;
        Ok(Some((meta, body_stream(body))))
    }
}

fn body_stream(body: aws_sdk_s3::primitives::ByteStream) -> BodyStream {
    futures::stream::unfold(body, |mut body| async move {
        match body.next().await {
            None => None,
            Some(Ok(bytes)) => Some((Ok(bytes), body)),
            Some(Err(e)) => Some((
                Err(UpstreamError::Transport(
                    DisplayErrorContext(&e).to_string(),
                )),
                body,
            )),
        }
    })
    .boxed()
}

/// The object size in a Content-Range (`bytes 0-99/1234`); `None` for `*` or garbage.
fn total_of_content_range(v: &str) -> Option<u64> {
    v.strip_prefix("bytes ")?.split_once('/')?.1.parse().ok()
}

fn map_error<E>(err: SdkError<E, aws_sdk_s3::config::http::HttpResponse>) -> UpstreamError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match &err {
        SdkError::ServiceError(se) => {
            let status = se.raw().status().as_u16();
            let code = se
                .err()
                .code()
                .map(str::to_owned)
                .unwrap_or_else(|| code_for_status(status).to_owned());
            let message = se
                .err()
                .message()
                .map(str::to_owned)
                .unwrap_or_else(|| code.clone());
            UpstreamError::Service {
                status,
                code,
                message,
            }
        }
        SdkError::TimeoutError(_) => UpstreamError::Timeout(DisplayErrorContext(&err).to_string()),
        SdkError::ConstructionFailure(_) => {
            UpstreamError::Internal(DisplayErrorContext(&err).to_string())
        }
        _ => UpstreamError::Transport(DisplayErrorContext(&err).to_string()),
    }
}

/// HEAD errors carry no body, so no code: name them as S3 would for the status.
fn code_for_status(status: u16) -> &'static str {
    match status {
        304 => "NotModified",
        400 => "BadRequest",
        403 => "AccessDenied",
        404 => "NotFound",
        412 => "PreconditionFailed",
        416 => "InvalidRange",
        500 => "InternalError",
        503 => "SlowDown",
        _ => "UpstreamError",
    }
}

fn meta_from_head(out: HeadObjectOutput) -> Result<ObjectMeta, UpstreamError> {
    let size = out
        .content_length
        .and_then(|l| u64::try_from(l).ok())
        .ok_or_else(|| UpstreamError::Service {
            status: 502,
            code: "InternalError".into(),
            message: "upstream HEAD had no Content-Length".into(),
        })?;
    object_meta!(out, size, "HEAD")
}

/// [`ObjectMeta`] from a HeadObject or GetObject output (the SDK gives them the same fields,
/// but no common type).
macro_rules! object_meta {
    ($out:expr, $size:expr, $op:literal) => {{
        let out = $out;
        match out.e_tag.clone() {
            None => Err(UpstreamError::Service {
                status: 502,
                code: "InternalError".into(),
                message: concat!("upstream ", $op, " had no ETag").into(),
            }),
            Some(etag) => {
                let last_modified = out.last_modified.and_then(|t| SystemTime::try_from(t).ok());
                let mut headers = Vec::new();
                let mut add = |name: &str, value: Option<&str>| {
                    if let Some(v) = value {
                        if let (Ok(n), Ok(v)) =
                            (HeaderName::try_from(name), HeaderValue::from_str(v))
                        {
                            headers.push((n, v));
                        }
                    }
                };
                add("content-type", out.content_type.as_deref());
                add("content-encoding", out.content_encoding.as_deref());
                add("content-language", out.content_language.as_deref());
                add("content-disposition", out.content_disposition.as_deref());
                add("cache-control", out.cache_control.as_deref());
                add("expires", out.expires_string.as_deref());
                add(
                    "x-amz-storage-class",
                    out.storage_class.as_ref().map(|s| s.as_str()),
                );
                add(
                    "x-amz-server-side-encryption",
                    out.server_side_encryption.as_ref().map(|s| s.as_str()),
                );
                add(
                    "x-amz-server-side-encryption-aws-kms-key-id",
                    out.ssekms_key_id.as_deref(),
                );
                add(
                    "x-amz-website-redirect-location",
                    out.website_redirect_location.as_deref(),
                );
                add(
                    "x-amz-object-lock-mode",
                    out.object_lock_mode.as_ref().map(|s| s.as_str()),
                );
                add(
                    "x-amz-object-lock-legal-hold",
                    out.object_lock_legal_hold_status
                        .as_ref()
                        .map(|s| s.as_str()),
                );
                add(
                    "x-amz-replication-status",
                    out.replication_status.as_ref().map(|s| s.as_str()),
                );
                add("x-amz-restore", out.restore.as_deref());
                // The lifecycle rule's expiry, which S3 and MinIO send with GET and HEAD.
                add("x-amz-expiration", out.expiration.as_deref());
                let retain = out
                    .object_lock_retain_until_date
                    .and_then(|d| d.fmt(aws_smithy_types::date_time::Format::DateTime).ok());
                add("x-amz-object-lock-retain-until-date", retain.as_deref());
                let tag_count = out.tag_count.map(|n| n.to_string());
                add("x-amz-tagging-count", tag_count.as_deref());
                let missing = out.missing_meta.map(|n| n.to_string());
                add("x-amz-missing-meta", missing.as_deref());
                if let Some(meta) = &out.metadata {
                    let mut pairs: Vec<_> = meta.iter().collect();
                    pairs.sort();
                    for (k, v) in pairs {
                        add(&format!("x-amz-meta-{}", k.to_ascii_lowercase()), Some(v));
                    }
                }
                Ok(ObjectMeta {
                    size: $size,
                    etag,
                    last_modified,
                    version_id: out.version_id,
                    headers,
                })
            }
        }
    }};
}
use object_meta;

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server on loopback that answers `first` (a status line) to the first request and 200
    /// to the rest, `requests` in all.
    async fn flaky_server(
        first: &'static str,
        requests: usize,
    ) -> (String, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            for n in 0..requests {
                let (mut conn, _) = listener.accept().await.unwrap();
                let mut buf = vec![0u8; 8192];
                let _ = conn.read(&mut buf).await.unwrap();
                let reply = if n == 0 {
                    format!("HTTP/1.1 {first}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                } else {
                    "HTTP/1.1 200 OK\r\ncontent-length: 5\r\netag: \"abc\"\r\nconnection: close\r\n\r\n".to_owned()
                };
                conn.write_all(reply.as_bytes()).await.unwrap();
            }
        });
        (url, task)
    }

    async fn origin(url: String) -> S3Upstream {
        S3Upstream::new(&S3UpstreamConfig {
            endpoint: Some(url),
            region: "us-east-1".into(),
            path_style: true,
            credentials: Some(Credentials::new("k", "s", None, None, "test")),
            ..Default::default()
        })
        .await
    }

    fn id() -> ObjectId {
        ObjectId {
            bucket: "b".into(),
            key: "k".into(),
            version_id: None,
        }
    }

    /// How long a body may stall is `upstream_idle_timeout`'s to say (the resume layer), not a
    /// second clock in the client.
    #[tokio::test]
    async fn the_client_leaves_stalled_bodies_to_the_resume_layer() {
        let origin = origin("http://127.0.0.1:9".into()).await;
        let protection = origin.client.config().stalled_stream_protection();
        assert!(
            protection.is_some_and(|p| !p.is_enabled()),
            "{protection:?}"
        );
    }

    #[tokio::test]
    async fn retries_are_counted() {
        let (url, server) = flaky_server("500 Internal Server Error", 2).await;
        let origin = origin(url).await;
        let meta = origin.head(&id()).await.unwrap();
        assert_eq!((meta.size, meta.etag.as_str()), (5, "\"abc\""));
        assert_eq!(origin.retries(), 1);
        server.await.unwrap();
    }

    /// SlowDown is the throttle layer's to retry, per prefix: the client gives it back at once.
    #[tokio::test]
    async fn throttling_is_not_retried_by_the_client() {
        for status in ["503 Slow Down", "429 Too Many Requests"] {
            let (url, server) = flaky_server(status, 1).await;
            let origin = origin(url).await;
            let err = origin.head(&id()).await.unwrap_err();
            assert!(err.is_throttled(), "{status}: {err:?}");
            assert_eq!(origin.retries(), 0, "{status}");
            server.await.unwrap();
        }
    }
}
