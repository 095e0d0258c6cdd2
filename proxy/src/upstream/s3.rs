//! The origin: credentials from the standard AWS chain (environment, profile, web identity /
//! IRSA, ECS, IMDS), requests signed with Larder's own credentials. Object reads (GET, HEAD),
//! the requests a miss waits for, are one signed request each on a plain HTTP client (the
//! pass-through's, [`Forwarder`]); listings, rare and paged in XML, go through aws-sdk-s3.
//! The SDK's machinery around each request (interceptors, endpoint rules, runtime plugins,
//! output parsing) cost a cold read about 0.3 ms before its GET left and after its answer came
//! (docs/benchmarks.md, "A miss's own time").

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_s3::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region, StalledStreamProtectionConfig};
use aws_sdk_s3::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_s3::types::RequestPayer;
use aws_sdk_s3::Client;
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::context::InterceptorContext;
use aws_smithy_runtime_api::client::retries::classifiers::{
    ClassifyRetry, RetryAction, RetryClassifierPriority,
};
use aws_smithy_runtime_api::client::retries::RequestAttempts;
use axum::body::Body;
use bytes::Bytes;
use futures::StreamExt;
use http::{header, HeaderMap, HeaderName, HeaderValue, Method, Response};
use http_body_util::BodyExt;
use percent_encoding::utf8_percent_encode;

use super::forward::{
    tls_failure, transport_error, Forward, ForwardError, Forwarder, Reshaped, SignedBody,
};
use super::roots::ExtraRoots;
use super::Upstream;
use crate::model::{
    is_throttling_status, BodyStream, ByteRange, ObjectId, ObjectMeta, PartNumber, PartSpan,
    UpstreamError,
};
use crate::s3::headers::{checksums, names, part_span};
use crate::s3::request::Target;

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
    /// Say on every request of Larder's own that Larder pays for it
    /// (`x-amz-request-payer: requester`), so that Requester Pays buckets can be read.
    pub requester_pays: bool,
    /// CA certificates trusted for the upstream's TLS besides the system's
    /// (`upstream_ca_file`).
    pub extra_roots: Option<ExtraRoots>,
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
            requester_pays: false,
            extra_roots: None,
        }
    }
}

/// The upstream S3 API.
pub struct S3Upstream {
    /// Listings.
    client: Client,
    /// Object reads, and (shared) the pass-through.
    objects: Arc<Forwarder>,
    credentials: Option<aws_credential_types::provider::SharedCredentialsProvider>,
    /// Retries of both, since start.
    retries: Arc<AtomicU64>,
    max_attempts: u32,
    /// `x-amz-request-payer: requester` on every request of Larder's own.
    requester_pays: bool,
    /// What object reads may still spend on retries.
    budget: RetryBudget,
    first_byte_timeout: Duration,
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
    /// Build the clients, loading credentials from the standard AWS chain.
    pub async fn new(config: &S3UpstreamConfig) -> Result<Self, ForwardError> {
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .region(Region::new(config.region.clone()));
        if let Some(endpoint) = &config.endpoint {
            loader = loader.endpoint_url(endpoint);
        }
        if let Some(credentials) = &config.credentials {
            loader = loader.credentials_provider(credentials.clone());
        }
        if let Some(extra) = &config.extra_roots {
            // The SDK's own client (warm-up's listings) trusts the same certificates as the
            // object client: the system's and these.
            loader = loader.http_client(
                extra
                    .sdk_http_client()
                    .map_err(|e| ForwardError::Build(format!("upstream TLS: {e}")))?,
            );
        }
        let shared = loader.load().await;
        let retries = Arc::new(AtomicU64::new(0));
        let s3 = aws_sdk_s3::config::Builder::from(&shared)
            .interceptor(CountRetries(retries.clone()))
            .retry_classifier(LeaveThrottlingToTheLayer)
            .force_path_style(config.path_style)
            // Listings only (object reads do the same in `object_request`): standard retries
            // (backoff with jitter) cover 5xx and resets before the first byte, and SlowDown
            // is left to the throttle layer (`LeaveThrottlingToTheLayer`).
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
        let credentials = shared.credentials_provider();
        // The endpoint as the SDK resolved it (`AWS_ENDPOINT_URL` or a profile's, if the
        // configuration names none), so that object reads and listings go to one place.
        let endpoint = shared.endpoint_url().map(str::to_owned);
        let objects = Arc::new(Forwarder::new(
            endpoint.as_deref(),
            &config.region,
            config.path_style,
            credentials.clone(),
            (config.connect_timeout, config.first_byte_timeout),
            config.extra_roots.as_ref(),
        )?);
        Ok(Self {
            client: Client::from_conf(s3),
            objects,
            credentials,
            retries,
            max_attempts: config.max_attempts.max(1),
            requester_pays: config.requester_pays,
            budget: RetryBudget::default(),
            first_byte_timeout: config.first_byte_timeout,
        })
    }

    /// The client object reads are sent on, for the pass-through to send on too: the same
    /// endpoint, credentials, timeouts and connections.
    pub fn forwarder(&self) -> Arc<Forwarder> {
        self.objects.clone()
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
            .set_request_payer(self.requester_pays.then_some(RequestPayer::Requester))
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
        // The object's checksums come only when asked for; a GET's answer, always ranged here,
        // never carries them.
        let headers = asking_for_checksums();
        let answer = self
            .object_request(Method::HEAD, object, None, headers)
            .await?;
        let size = content_length(answer.headers()).ok_or_else(|| UpstreamError::Service {
            status: 502,
            code: "InternalError".into(),
            message: "upstream HEAD had no Content-Length".into(),
        })?;
        let mut meta = object_meta(answer.headers(), size, "HEAD")?;
        meta.checksums_known = true;
        Ok(meta)
    }

    async fn get(
        &self,
        object: &ObjectId,
        if_match: Option<&str>,
        range: Option<Range<u64>>,
    ) -> Result<BodyStream, UpstreamError> {
        let range = range.filter(|r| r.end > r.start);
        let mut headers = HeaderMap::new();
        if let Some(etag) = if_match {
            headers.insert(header::IF_MATCH, header_value(etag)?);
        }
        if let Some(r) = &range {
            let asked = ByteRange::bytes(r.clone()).header();
            headers.insert(header::RANGE, header_value(&asked)?);
        }
        let answer = match self
            .object_request(Method::GET, object, None, headers)
            .await
        {
            Err(UpstreamError::Service { status: 412, .. }) if if_match.is_some() => {
                return Err(UpstreamError::Changed)
            }
            other => other?,
        };
        if let (Some(r), Some(len)) = (&range, content_length(answer.headers())) {
            let expected = r.end - r.start;
            if len != expected {
                return Err(UpstreamError::BodyLength { got: len, expected });
            }
        }
        Ok(body_stream(answer.into_body()))
    }

    async fn get_with_meta(
        &self,
        object: &ObjectId,
        span: ByteRange,
    ) -> Result<Option<(ObjectMeta, BodyStream)>, UpstreamError> {
        let mut headers = HeaderMap::new();
        headers.insert(header::RANGE, header_value(&span.header())?);
        let answer = match self
            .object_request(Method::GET, object, None, headers)
            .await
        {
            Ok(answer) => answer,
            // Past the end, or an empty object: only a HEAD says which.
            Err(UpstreamError::Service { status: 416, .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let Some(size) = answer
            .headers()
            .get(header::CONTENT_RANGE)
            .and_then(|v| v.to_str().ok())
            .and_then(total_of_content_range)
        else {
            return Ok(None);
        };
        let within = span.within(size);
        let expected = within.end - within.start;
        let len = content_length(answer.headers());
        if len != Some(expected) {
            return Err(UpstreamError::BodyLength {
                got: len.unwrap_or(0),
                expected,
            });
        }
        let meta = object_meta(answer.headers(), size, "GET")?;
        Ok(Some((meta, body_stream(answer.into_body()))))
    }

    async fn get_part(
        &self,
        object: &ObjectId,
        part: PartNumber,
    ) -> Result<Option<(ObjectMeta, PartSpan, BodyStream)>, UpstreamError> {
        // The part's checksums come only when asked for, as an object's do.
        let headers = asking_for_checksums();
        let answer = self
            .object_request(Method::GET, object, Some(part), headers)
            .await?;
        let Some(span) = part_span(answer.status(), answer.headers()) else {
            return Ok(None);
        };
        let mut meta = object_meta(answer.headers(), span.size, "GET")?;
        // The part's, not the object's.
        meta.checksums.clear();
        Ok(Some((meta, span, body_stream(answer.into_body()))))
    }
}

impl S3Upstream {
    /// A GET or HEAD of `object` with `headers`, signed and sent on the object client, and sent
    /// again after a transient failure the way the SDK's standard retries do (a connection
    /// that broke or timed out before the answer, 500, 502 or 504; `max_attempts` in all,
    /// full-jitter exponential backoff, within the [`RetryBudget`]), each retry counted.
    /// Throttling (503, 429) is left to the throttle layer, as with
    /// [`LeaveThrottlingToTheLayer`]. An answer that is not a success is the S3 error it
    /// carries. With `requester_pays`, the request says Larder pays for it.
    async fn object_request(
        &self,
        method: Method,
        object: &ObjectId,
        part: Option<PartNumber>,
        mut headers: HeaderMap,
    ) -> Result<Response<Body>, UpstreamError> {
        if self.requester_pays {
            // Signed with the rest: S3 takes an `x-amz-*` header only when it is.
            headers.insert(
                names::X_AMZ_REQUEST_PAYER,
                HeaderValue::from_static("requester"),
            );
        }
        let version = object
            .version_id
            .as_deref()
            .map(|v| format!("versionId={}", utf8_percent_encode(v, QUERY_VALUE)));
        let part = part.map(|n| format!("partNumber={}", n.get()));
        let query = match (version, part) {
            (Some(v), Some(p)) => Some(format!("{p}&{v}")),
            (v, p) => v.or(p),
        };
        let (mut attempt, mut spent) = (1, None);
        loop {
            let answer = self
                .objects
                .send(Forward {
                    method: method.clone(),
                    target: Target::Object {
                        bucket: object.bucket.clone(),
                        key: object.key.clone(),
                    },
                    query: query.clone(),
                    headers: headers.clone(),
                    body: Body::empty(),
                    payload: SignedBody::Sha256(EMPTY_SHA256.to_owned()),
                    reshaped: Reshaped::AsSent,
                })
                .await;
            // What sending it again would cost the budget; `None`: not sent again.
            let retry_cost = match &answer {
                Ok(a) if matches!(a.status().as_u16(), 500 | 502 | 504) => Some(RETRY_COST),
                Err(ForwardError::Transport(_) | ForwardError::Tls(_)) => Some(RETRY_COST),
                Err(ForwardError::Timeout(_)) => Some(RETRY_TIMEOUT_COST),
                _ => None,
            }
            .filter(|_| attempt < self.max_attempts);
            if !retry_cost.is_some_and(|cost| self.budget.take(cost)) {
                return match answer {
                    Ok(a) if a.status().is_success() => {
                        self.budget.give_back(spent.unwrap_or(NO_RETRY_INCREMENT));
                        Ok(a)
                    }
                    Ok(a) => Err(self.service_error(a).await),
                    Err(e) => Err(upstream_error(e)),
                };
            }
            spent = retry_cost;
            self.retries.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(retry_backoff(attempt)).await;
            attempt += 1;
        }
    }

    /// The S3 error an answer that is not a success carries: the `Code` and `Message` of its
    /// XML body, or (a HEAD's answer has no body) the code S3 uses for its status.
    async fn service_error(&self, answer: Response<Body>) -> UpstreamError {
        let status = answer.status().as_u16();
        // Bounded in size and time: an error document is a few hundred bytes.
        let read = http_body_util::Limited::new(answer.into_body(), ERROR_BODY_LIMIT).collect();
        let body = match tokio::time::timeout(self.first_byte_timeout, read).await {
            Ok(Ok(collected)) => collected.to_bytes(),
            _ => Bytes::new(),
        };
        let doc = String::from_utf8_lossy(&body);
        let code = xml_text(&doc, "Code").unwrap_or_else(|| code_for_status(status).to_owned());
        let message = xml_text(&doc, "Message").unwrap_or_else(|| code.clone());
        UpstreamError::Service {
            status,
            code,
            message,
        }
    }
}

/// Headers asking the upstream for the stored checksums (`x-amz-checksum-mode: ENABLED`).
fn asking_for_checksums() -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        names::X_AMZ_CHECKSUM_MODE,
        HeaderValue::from_static("ENABLED"),
    );
    headers
}

/// The SHA-256 of an empty payload: what a GET or HEAD signs as its body.
const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// The most of an error answer's body read for its code and message.
const ERROR_BODY_LIMIT: usize = 64 * 1024;

/// What is escaped in a query parameter's value: all but RFC 3986's unreserved characters.
const QUERY_VALUE: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// How long to wait before attempt `attempt + 1`: the SDK's standard retry backoff, a random
/// share of 1 s doubled per attempt, at most 20 s.
fn retry_backoff(attempt: u32) -> Duration {
    let ceiling = Duration::from_secs(1 << attempt.saturating_sub(1).min(4)).min(MAX_BACKOFF);
    ceiling.mul_f64(rand::random::<f64>())
}

/// The longest wait between attempts, as the SDK's standard retries.
const MAX_BACKOFF: Duration = Duration::from_secs(20);

/// The SDK standard retry strategy's budget, shared by every object read: a retry takes
/// [`RETRY_COST`] tokens ([`RETRY_TIMEOUT_COST`] after a timeout) and a read that then succeeds
/// gives them back; a first attempt that succeeds adds [`NO_RETRY_INCREMENT`], up to
/// [`RETRY_QUOTA`]. With the budget spent, a failure is answered at once: an upstream that is
/// down is asked once per read, not `max_attempts` times.
struct RetryBudget(std::sync::atomic::AtomicU32);

const RETRY_QUOTA: u32 = 500;
const RETRY_COST: u32 = 5;
const RETRY_TIMEOUT_COST: u32 = 10;
const NO_RETRY_INCREMENT: u32 = 1;

impl Default for RetryBudget {
    fn default() -> Self {
        Self(RETRY_QUOTA.into())
    }
}

impl RetryBudget {
    /// Whether `cost` tokens were there, taken if so.
    fn take(&self, cost: u32) -> bool {
        self.0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                t.checked_sub(cost)
            })
            .is_ok()
    }

    fn give_back(&self, tokens: u32) {
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some((t + tokens).min(RETRY_QUOTA))
            });
    }
}

fn upstream_error(e: ForwardError) -> UpstreamError {
    match e {
        ForwardError::Transport(m) => UpstreamError::Transport(m),
        ForwardError::Tls(m) => UpstreamError::Tls(m),
        ForwardError::Timeout(_) => UpstreamError::Timeout(e.to_string()),
        ForwardError::Credentials(_) | ForwardError::Build(_) => {
            UpstreamError::Internal(e.to_string())
        }
    }
}

fn header_value(v: &str) -> Result<HeaderValue, UpstreamError> {
    HeaderValue::from_str(v).map_err(|e| UpstreamError::Internal(format!("header {v:?}: {e}")))
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// The text of the first `<tag>` element of an S3 error document, its five XML entities
/// unescaped; `None` if there is none.
fn xml_text(doc: &str, tag: &str) -> Option<String> {
    let open = format!("<{tag}>");
    let start = doc.find(&open)? + open.len();
    let len = doc[start..].find(&format!("</{tag}>"))?;
    Some(
        doc[start..start + len]
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&quot;", "\"")
            .replace("&apos;", "'")
            .replace("&amp;", "&"),
    )
}

fn body_stream(body: Body) -> BodyStream {
    body.into_data_stream()
        .map(|chunk| chunk.map_err(|e| upstream_error(transport_error(&e))))
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
        _ if tls_failure(&err) => UpstreamError::Tls(DisplayErrorContext(&err).to_string()),
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

/// The headers of an object S3 sends with GET and HEAD that a client may want, passed on as
/// they came (with every `x-amz-meta-*`, in name order).
const OBJECT_HEADERS: &[&str] = &[
    "content-type",
    "content-encoding",
    "content-language",
    "content-disposition",
    "cache-control",
    "expires",
    "x-amz-storage-class",
    "x-amz-server-side-encryption",
    "x-amz-server-side-encryption-aws-kms-key-id",
    "x-amz-website-redirect-location",
    "x-amz-object-lock-mode",
    "x-amz-object-lock-legal-hold",
    "x-amz-replication-status",
    "x-amz-restore",
    // The lifecycle rule's expiry, which S3 and MinIO send with GET and HEAD.
    "x-amz-expiration",
    "x-amz-object-lock-retain-until-date",
    "x-amz-tagging-count",
    "x-amz-missing-meta",
];

/// [`ObjectMeta`] from the headers of a GET's or HEAD's answer, the object `size` bytes long.
fn object_meta(headers: &HeaderMap, size: u64, op: &str) -> Result<ObjectMeta, UpstreamError> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let etag = text("etag").ok_or_else(|| UpstreamError::Service {
        status: 502,
        code: "InternalError".into(),
        message: format!("upstream {op} had no ETag"),
    })?;
    let mut kept: Vec<(HeaderName, HeaderValue)> = OBJECT_HEADERS
        .iter()
        .filter_map(|name| Some((HeaderName::from_static(name), headers.get(*name)?.clone())))
        .collect();
    let mut user: Vec<_> = headers
        .iter()
        .filter(|(name, _)| name.as_str().starts_with("x-amz-meta-"))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    user.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
    kept.extend(user);
    let checksums = checksums(headers);
    Ok(ObjectMeta {
        size,
        etag: etag.into(),
        last_modified: text("last-modified").and_then(|t| httpdate::parse_http_date(t).ok()),
        version_id: text("x-amz-version-id").map(str::to_owned),
        headers: kept,
        checksums,
        // Set by the caller that asked for them.
        checksums_known: false,
        response_headers: Default::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;
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
        .unwrap()
    }

    /// A server on loopback that answers each of `replies` (whole HTTP responses) to one
    /// request, on a connection of its own, and hands back the requests it read.
    async fn scripted_server(
        replies: Vec<String>,
    ) -> (String, tokio::task::JoinHandle<Vec<String>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let mut requests = Vec::new();
            for reply in replies {
                let (mut conn, _) = listener.accept().await.unwrap();
                let mut buf = vec![0u8; 8192];
                let n = conn.read(&mut buf).await.unwrap();
                requests.push(String::from_utf8_lossy(&buf[..n]).into_owned());
                conn.write_all(reply.as_bytes()).await.unwrap();
            }
            requests
        });
        (url, task)
    }

    fn answer(status: &str, headers: &str, body: &str) -> String {
        format!(
            "HTTP/1.1 {status}\r\n{headers}content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
    }

    /// A cold GET's answer stands for a HEAD: size from Content-Range, the version, the date,
    /// the object's headers as they came (user metadata in name order), nothing else; the
    /// request is signed, asks the range, and names the version.
    #[tokio::test]
    async fn a_ranged_get_brings_the_objects_metadata() {
        let headers = "content-range: bytes 2-4/10\r\netag: \"e1\"\r\n\
            last-modified: Wed, 21 Oct 2015 07:28:00 GMT\r\nx-amz-version-id: v/1\r\n\
            content-type: text/plain\r\nx-amz-meta-zeta: z\r\nx-amz-meta-alpha: a\r\n\
            x-amz-request-id: 42\r\n";
        let (url, server) =
            scripted_server(vec![answer("206 Partial Content", headers, "abc")]).await;
        let origin = origin(url).await;
        let mut id = id();
        id.version_id = Some("v/1".into());
        let (meta, body) = origin
            .get_with_meta(
                &id,
                ByteRange::FromTo {
                    first: 2,
                    last: Some(4),
                },
            )
            .await
            .unwrap()
            .unwrap();
        let bytes: Vec<Bytes> = body.map(Result::unwrap).collect().await;
        assert_eq!(bytes.concat(), b"abc");
        assert_eq!((meta.size, &*meta.etag), (10, "\"e1\""));
        assert_eq!(meta.version_id.as_deref(), Some("v/1"));
        // A range never brings the checksums: a client asking for them waits for a HEAD.
        assert!(!meta.checksums_known);
        assert_eq!(
            meta.last_modified,
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480))
        );
        let names: Vec<_> = meta
            .headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.to_str().unwrap()))
            .collect();
        assert_eq!(
            names,
            [
                ("content-type", "text/plain"),
                ("x-amz-meta-alpha", "a"),
                ("x-amz-meta-zeta", "z")
            ]
        );
        let request = &server.await.unwrap()[0];
        assert!(
            request.starts_with("GET /b/k?versionId=v%2F1 HTTP/1.1\r\n"),
            "{request}"
        );
        let lower = request.to_ascii_lowercase();
        assert!(lower.contains("\r\nrange: bytes=2-4\r\n"), "{request}");
        assert!(
            lower.contains("\r\nauthorization: aws4-hmac-sha256 credential=k/"),
            "{request}"
        );
    }

    /// A HEAD asks for the object's checksums, and keeps them apart from the headers every
    /// response carries.
    #[tokio::test]
    async fn a_head_asks_for_and_keeps_the_objects_checksums() {
        let headers = "etag: \"e1\"\r\ncontent-type: text/plain\r\n\
            x-amz-checksum-crc32: IKoeIg==\r\nx-amz-checksum-type: FULL_OBJECT\r\n";
        let head =
            format!("HTTP/1.1 200 OK\r\n{headers}content-length: 10\r\nconnection: close\r\n\r\n");
        let (url, server) = scripted_server(vec![head]).await;
        let meta = origin(url).await.head(&id()).await.unwrap();
        let pairs = |h: &[(HeaderName, HeaderValue)]| -> Vec<(String, String)> {
            h.iter()
                .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
                .collect()
        };
        assert_eq!(
            pairs(&meta.checksums),
            [
                ("x-amz-checksum-crc32".to_owned(), "IKoeIg==".to_owned()),
                ("x-amz-checksum-type".to_owned(), "FULL_OBJECT".to_owned())
            ]
        );
        assert_eq!(
            pairs(&meta.headers),
            [("content-type".to_owned(), "text/plain".to_owned())]
        );
        assert!(meta.checksums_known);
        let request = server.await.unwrap()[0].to_ascii_lowercase();
        assert!(request.starts_with("head /b/k http/1.1\r\n"), "{request}");
        assert!(
            request.contains("\r\nx-amz-checksum-mode: enabled\r\n"),
            "{request}"
        );
        // Signed, as S3 requires of every `x-amz-` header sent.
        assert!(request.contains("x-amz-checksum-mode;"), "{request}");
    }

    /// With `requester_pays`, each of Larder's own requests (HEAD, GET, a cold GET, a
    /// listing) says that Larder pays, signed; without it, none does.
    #[tokio::test]
    async fn a_larder_that_pays_says_so_in_every_request_of_its_own() {
        let list = answer(
            "200 OK",
            "content-type: application/xml\r\n",
            "<?xml version=\"1.0\"?><ListBucketResult><Name>b</Name>\
             <IsTruncated>false</IsTruncated></ListBucketResult>",
        );
        let replies = || {
            vec![
                answer("200 OK", "etag: \"e1\"\r\n", ""),
                answer(
                    "206 Partial Content",
                    "content-range: bytes 0-2/10\r\n",
                    "abc",
                ),
                answer(
                    "206 Partial Content",
                    "content-range: bytes 0-2/10\r\netag: \"e1\"\r\n",
                    "abc",
                ),
                list.clone(),
            ]
        };
        for pays in [true, false] {
            let (url, server) = scripted_server(replies()).await;
            let origin = S3Upstream::new(&S3UpstreamConfig {
                endpoint: Some(url),
                path_style: true,
                credentials: Some(Credentials::new("k", "s", None, None, "test")),
                requester_pays: pays,
                ..Default::default()
            })
            .await
            .unwrap();
            origin.head(&id()).await.unwrap();
            let body = origin.get(&id(), Some("\"e1\""), Some(0..3)).await.unwrap();
            let _: Vec<_> = body.collect().await;
            let range = ByteRange::FromTo {
                first: 0,
                last: Some(2),
            };
            let (_, body) = origin.get_with_meta(&id(), range).await.unwrap().unwrap();
            let _: Vec<_> = body.collect().await;
            origin.list("b", "p/", None).await.unwrap();
            let requests = server.await.unwrap();
            assert_eq!(requests.len(), 4);
            for request in requests {
                let lower = request.to_ascii_lowercase();
                let said = lower.contains("\r\nx-amz-request-payer: requester\r\n");
                let signed = lower
                    .split_once("signedheaders=")
                    .and_then(|(_, rest)| rest.split([',', '\r']).next())
                    .is_some_and(|names| names.split(';').any(|n| n == "x-amz-request-payer"));
                assert_eq!((said, signed), (pays, pays), "{request}");
            }
        }
    }

    /// An error answer is the S3 error its document names (entities unescaped); a HEAD's,
    /// which has no document, the code S3 uses for its status; a 412 to a GET pinned to an
    /// ETag is the object having changed; a range past the end asks for a HEAD instead.
    #[tokio::test]
    async fn error_answers_are_the_s3_errors_they_carry() {
        let doc = "<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code>\
            <Message>no &quot;k&quot; &amp; no other</Message></Error>";
        let (url, server) = scripted_server(vec![
            answer("404 Not Found", "content-type: application/xml\r\n", doc),
            "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".into(),
            answer(
                "412 Precondition Failed",
                "",
                "<Error><Code>PreconditionFailed</Code></Error>",
            ),
            answer(
                "416 Requested Range Not Satisfiable",
                "",
                "<Error><Code>InvalidRange</Code></Error>",
            ),
        ])
        .await;
        let origin = origin(url).await;
        match origin.get(&id(), None, None).await.map(|_| ()).unwrap_err() {
            UpstreamError::Service {
                status,
                code,
                message,
            } => {
                assert_eq!((status, code.as_str()), (404, "NoSuchKey"));
                assert_eq!(message, "no \"k\" & no other");
            }
            other => panic!("{other:?}"),
        }
        match origin.head(&id()).await.unwrap_err() {
            UpstreamError::Service { status, code, .. } => {
                assert_eq!((status, code.as_str()), (404, "NotFound"))
            }
            other => panic!("{other:?}"),
        }
        let changed = origin
            .get(&id(), Some("\"e0\""), Some(0..4))
            .await
            .map(|_| ());
        assert!(
            matches!(changed, Err(UpstreamError::Changed)),
            "{changed:?}"
        );
        let past = origin
            .get_with_meta(
                &id(),
                ByteRange::FromTo {
                    first: 99,
                    last: None,
                },
            )
            .await;
        assert!(matches!(past, Ok(None)));
        let requests = server.await.unwrap();
        assert!(
            requests[1].starts_with("HEAD /b/k HTTP/1.1"),
            "{}",
            requests[1]
        );
        assert!(
            requests[2]
                .to_ascii_lowercase()
                .contains("\r\nif-match: \"e0\"\r\n"),
            "{}",
            requests[2]
        );
        assert_eq!(origin.retries(), 0);
    }

    /// Retries draw from a shared budget that successes refill: once it is spent a failure is
    /// answered at once, and a success after a retry gives its cost back.
    #[test]
    fn retries_stop_when_the_budget_is_spent() {
        let budget = RetryBudget::default();
        let retries = (0..=RETRY_QUOTA)
            .take_while(|_| budget.take(RETRY_COST))
            .count();
        assert_eq!(retries as u32, RETRY_QUOTA / RETRY_COST);
        assert!(!budget.take(RETRY_TIMEOUT_COST));
        budget.give_back(RETRY_TIMEOUT_COST);
        assert!(budget.take(RETRY_TIMEOUT_COST));
        assert!(!budget.take(NO_RETRY_INCREMENT));
        for _ in 0..2 * RETRY_QUOTA {
            budget.give_back(NO_RETRY_INCREMENT);
        }
        assert!(budget.take(RETRY_QUOTA) && !budget.take(NO_RETRY_INCREMENT));
    }

    /// A range whose answer is not as long as asked is refused, not cached short.
    #[tokio::test]
    async fn a_short_answer_to_a_range_is_refused() {
        let (url, server) = scripted_server(vec![answer(
            "206 Partial Content",
            "content-range: bytes 0-2/10\r\netag: \"e1\"\r\n",
            "abc",
        )])
        .await;
        let origin = origin(url).await;
        let got = origin
            .get(&id(), Some("\"e1\""), Some(0..4))
            .await
            .map(|_| ());
        assert!(
            matches!(
                got,
                Err(UpstreamError::BodyLength {
                    got: 3,
                    expected: 4
                })
            ),
            "{got:?}"
        );
        server.await.unwrap();
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
        assert_eq!((meta.size, &*meta.etag), (5, "\"abc\""));
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
