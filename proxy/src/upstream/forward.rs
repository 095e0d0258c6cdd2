//! Pass-through: every request the cache does not answer goes upstream as it came, re-signed with
//! Larder's own credentials, its body and the response streamed both ways.

use std::time::{Duration, Instant, SystemTime};

use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_sigv4::http_request::{
    sign, PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings,
    UriPathNormalizationMode,
};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use axum::body::Body;
use http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, Response, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tracing::Instrument;

use super::roots::ExtraRoots;

use crate::model::{error_chain, UpstreamOutcome};
use crate::s3::operation::Operation;
use crate::s3::request::{encode_path, Target, PRESIGNED_PARAMS};
use crate::telemetry::metrics::Metrics;

/// Query parameters of a presigned URL besides SigV4's own ([`PRESIGNED_PARAMS`]): the client's
/// session token and SigV2's signature, not to be sent upstream.
const PRESIGN_EXTRA: &[&str] = &[
    "X-Amz-Security-Token",
    "AWSAccessKeyId",
    "Signature",
    "Expires",
];

/// Request headers never forwarded: connection-level (RFC 9110 §7.6.1), the client's own
/// signature, and `expect` (the upstream connection does its own flow control).
const DROPPED: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "authorization",
    "x-amz-date",
    "x-amz-content-sha256",
    "x-amz-security-token",
    "expect",
];

/// Response headers not passed back (connection-level).
const DROPPED_RESPONSE: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Why a request could not be passed upstream.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// Larder's own credentials could not be loaded.
    #[error("loading upstream credentials: {0}")]
    Credentials(String),
    /// The request could not be built or signed.
    #[error("building the upstream request: {0}")]
    Build(String),
    /// The upstream could not be reached, or the exchange broke.
    #[error("upstream request failed: {0}")]
    Transport(String),
    /// TLS with the upstream failed (see [`tls_failure`]).
    #[error("upstream TLS failed: {0}")]
    Tls(String),
    /// No response in time.
    #[error("upstream did not answer within {0:?}")]
    Timeout(Duration),
}

/// Where and how to forward.
pub struct Forwarder {
    client: Client<HttpsConnector<HttpConnector>, Body>,
    scheme: String,
    authority: String,
    path_style: bool,
    region: String,
    credentials: Option<SharedCredentialsProvider>,
    /// The last credentials loaded: providers such as IMDS or web identity make a network call
    /// per load, so they are reused until shortly before they expire.
    cached: parking_lot::Mutex<Option<aws_credential_types::Credentials>>,
    first_byte_timeout: Duration,
}

/// An HTTP(S) client over the system's CA certificates and `extra` (`upstream_ca_file`), for
/// the upstream and anything else Larder calls out to (SNS subscription confirmation, with no
/// `extra`), giving up on a connection not made within `connect_timeout`.
pub fn https_client<B>(
    connect_timeout: Duration,
    extra: Option<&ExtraRoots>,
) -> Result<Client<HttpsConnector<HttpConnector>, B>, String>
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
{
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(connect_timeout));
    http.set_nodelay(true);
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let tls = match extra {
        Some(extra) => {
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .with_root_certificates(extra.with_system_roots())
                .with_no_client_auth();
            hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config)
        }
        None => match hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(provider.clone())
        {
            Ok(builder) => builder,
            Err(e) => {
                // A minimal image may have no CA bundle; plain-HTTP upstreams still work.
                tracing::warn!(error = %e, "no system CA certificates: TLS connections (upstream, SNS) will fail");
                let config = rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .map_err(|e| e.to_string())?
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth();
                hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config)
            }
        },
    };
    let https = tls.https_or_http().enable_http1().wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(https))
}

/// Credentials are renewed this long before they expire.
const CREDENTIALS_MARGIN: Duration = Duration::from_secs(300);

/// A request to pass upstream.
pub struct Forward {
    /// Method.
    pub method: Method,
    /// What it addresses.
    pub target: Target,
    /// The client's raw query string.
    pub query: Option<String>,
    /// The client's headers.
    pub headers: HeaderMap,
    /// The body to send.
    pub body: Body,
    /// What the client's signature said of the body; decides the upstream payload hash.
    pub payload: SignedBody,
    /// What Larder did to the body on the way.
    pub reshaped: Reshaped,
}

/// What the client's signature said of the body, as far as the upstream request's own signature
/// goes (the front decides it from what it verified).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignedBody {
    /// The body's SHA-256 (lowercase hex) as the client signed it: the upstream checks the body
    /// against it.
    Sha256(String),
    /// `aws-chunked` with unsigned trailing checksums, passed on as it came.
    UnsignedTrailer,
    /// Not covered by a hash of the whole body: unsigned, presigned, or signed chunk by chunk
    /// (each chunk checked by the front).
    Unsigned,
}

/// What became of a client's signed `aws-chunked` body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reshaped {
    /// Sent as it came.
    AsSent,
    /// Decoded to plain data of this length.
    Decoded(u64),
    /// Re-framed as unsigned `aws-chunked` with its trailer, this many bytes long.
    Reframed(u64),
}

impl Forwarder {
    /// A forwarder to `endpoint` (`None`: AWS S3 in `region`) signing with `credentials`
    /// (`None`: requests go unsigned, for anonymous upstreams), waiting at most
    /// `connect_timeout` for a connection and `first_byte_timeout` for the answer to a request
    /// without a body.
    pub fn new(
        endpoint: Option<&str>,
        region: &str,
        path_style: bool,
        credentials: Option<SharedCredentialsProvider>,
        (connect_timeout, first_byte_timeout): (Duration, Duration),
        extra_roots: Option<&ExtraRoots>,
    ) -> Result<Self, ForwardError> {
        let endpoint = endpoint
            .map(str::to_owned)
            .unwrap_or_else(|| format!("https://s3.{region}.amazonaws.com"));
        let uri: Uri = endpoint
            .parse()
            .map_err(|e| ForwardError::Build(format!("upstream endpoint {endpoint}: {e}")))?;
        let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
            return Err(ForwardError::Build(format!(
                "upstream endpoint {endpoint} needs a scheme and host"
            )));
        };
        let client = https_client(connect_timeout, extra_roots).map_err(ForwardError::Build)?;
        Ok(Self {
            client,
            scheme: scheme.to_owned(),
            authority: authority.as_str().to_owned(),
            path_style,
            region: region.to_owned(),
            credentials,
            cached: parking_lot::Mutex::new(None),
            first_byte_timeout,
        })
    }

    /// [`Self::send`] as `operation`: in a client span, timed, counted in `metrics` and priced
    /// to its bucket, its failure kept as the last upstream error. The way every request sent
    /// through the forwarder is counted (pass-through, form uploads, the events heartbeat),
    /// except the block reads, which the read path's own upstream counts (`Instrumented`).
    pub async fn send_counted(
        &self,
        request: Forward,
        operation: Operation,
        metrics: &Metrics,
    ) -> Result<Response<Body>, ForwardError> {
        let bucket = request.target.bucket().cloned();
        let started = Instant::now();
        let result = self
            .send(request)
            .instrument(tracing::info_span!(
                "upstream",
                otel.name = operation.as_str(),
                otel.kind = "client"
            ))
            .await;
        let status = match &result {
            Ok(r) => UpstreamOutcome::Http(r.status().as_u16()),
            Err(e) => e.outcome(),
        };
        metrics.upstream(operation, bucket.as_deref(), status, started.elapsed());
        if let Err(e) = &result {
            metrics.upstream_failed(e);
        }
        result
    }

    /// Send `request` upstream and return the upstream's response, its body still streaming.
    pub async fn send(&self, request: Forward) -> Result<Response<Body>, ForwardError> {
        let bodiless = matches!(request.method, Method::GET | Method::HEAD | Method::DELETE);
        let upstream = self.build(request).await?;
        let pending = self.client.request(upstream);
        let response = if bodiless {
            tokio::time::timeout(self.first_byte_timeout, pending)
                .await
                .map_err(|_| ForwardError::Timeout(self.first_byte_timeout))?
        } else {
            // An upload's answer comes after its whole body, which takes as long as the client
            // takes to send it.
            pending.await
        }
        .map_err(|e| transport_error(&e))?;
        let (mut parts, body) = response.into_parts();
        for name in DROPPED_RESPONSE {
            parts.headers.remove(*name);
        }
        Ok(Response::from_parts(parts, Body::new(body)))
    }

    fn uri(&self, target: &Target, query: Option<&str>) -> (String, String) {
        let (authority, path) = match target {
            Target::Service => (self.authority.clone(), "/".to_owned()),
            Target::Bucket(b) if self.virtual_host(b) => {
                (format!("{b}.{}", self.authority), "/".to_owned())
            }
            Target::Bucket(b) => (
                self.authority.clone(),
                format!("/{}", encode_path(b.as_bytes())),
            ),
            Target::Object { bucket, key } if self.virtual_host(bucket) => (
                format!("{bucket}.{}", self.authority),
                format!("/{}", encode_path(key.as_bytes())),
            ),
            Target::Object { bucket, key } => (
                self.authority.clone(),
                format!(
                    "/{}/{}",
                    encode_path(bucket.as_bytes()),
                    encode_path(key.as_bytes())
                ),
            ),
        };
        let query = strip_presign(query.unwrap_or(""));
        let uri = if query.is_empty() {
            format!("{}://{authority}{path}", self.scheme)
        } else {
            format!("{}://{authority}{path}?{query}", self.scheme)
        };
        (uri, authority)
    }

    fn virtual_host(&self, bucket: &str) -> bool {
        // Dotted names do not fit a TLS wildcard certificate; S3 takes them path-style.
        !self.path_style && !bucket.contains('.')
    }

    async fn build(&self, request: Forward) -> Result<Request<Body>, ForwardError> {
        let (uri, authority) = self.uri(&request.target, request.query.as_deref());
        let mut headers = HeaderMap::with_capacity(request.headers.len() + 4);
        for (name, value) in &request.headers {
            if !DROPPED.contains(&name.as_str()) {
                headers.append(name.clone(), value.clone());
            }
        }
        let payload_hash = match (&request.payload, request.reshaped) {
            (SignedBody::Sha256(h), _) => h.clone(),
            (SignedBody::UnsignedTrailer, _) => "STREAMING-UNSIGNED-PAYLOAD-TRAILER".to_owned(),
            (_, Reshaped::Decoded(length)) => {
                strip_aws_chunked(&mut headers);
                headers.remove("x-amz-decoded-content-length");
                headers.remove("x-amz-trailer");
                headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
                "UNSIGNED-PAYLOAD".to_owned()
            }
            (_, Reshaped::Reframed(length)) => {
                headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
                "STREAMING-UNSIGNED-PAYLOAD-TRAILER".to_owned()
            }
            (SignedBody::Unsigned, Reshaped::AsSent) => "UNSIGNED-PAYLOAD".to_owned(),
        };
        if let Ok(v) = HeaderValue::from_str(&authority) {
            headers.insert(header::HOST, v);
        }
        if let Some(provider) = &self.credentials {
            let credentials = self.credentials(provider).await?;
            self.sign(
                &request.method,
                &uri,
                &mut headers,
                &payload_hash,
                credentials,
            )?;
        }
        let mut builder = Request::builder().method(request.method).uri(&uri);
        if let Some(h) = builder.headers_mut() {
            *h = headers;
        }
        builder
            .body(request.body)
            .map_err(|e| ForwardError::Build(e.to_string()))
    }

    async fn credentials(
        &self,
        provider: &SharedCredentialsProvider,
    ) -> Result<aws_credential_types::Credentials, ForwardError> {
        let fresh = |c: &aws_credential_types::Credentials| {
            c.expiry()
                .is_none_or(|e| e > SystemTime::now() + CREDENTIALS_MARGIN)
        };
        if let Some(c) = self.cached.lock().as_ref().filter(|c| fresh(c)) {
            return Ok(c.clone());
        }
        let credentials = provider
            .provide_credentials()
            .await
            .map_err(|e| ForwardError::Credentials(error_chain(&e)))?;
        *self.cached.lock() = Some(credentials.clone());
        Ok(credentials)
    }

    fn sign(
        &self,
        method: &Method,
        uri: &str,
        headers: &mut HeaderMap,
        payload_hash: &str,
        credentials: aws_credential_types::Credentials,
    ) -> Result<(), ForwardError> {
        let identity: Identity = credentials.into();
        let mut settings = SigningSettings::default();
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name("s3")
            .time(SystemTime::now())
            .settings(settings)
            .build()
            .map_err(|e| ForwardError::Build(e.to_string()))?
            .into();
        let pairs: Vec<(String, String)> = headers
            .iter()
            .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
            .collect();
        // Headers that are not visible ASCII cannot be signed; S3 would refuse them anyway.
        let signable = SignableRequest::new(
            method.as_str(),
            uri,
            pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            SignableBody::Precomputed(payload_hash.to_owned()),
        )
        .map_err(|e| ForwardError::Build(error_chain(&e)))?;
        let (instructions, _) = sign(signable, &params)
            .map_err(|e| ForwardError::Build(error_chain(&e)))?
            .into_parts();
        let (signing_headers, _) = instructions.into_parts();
        for h in signing_headers {
            let name = HeaderName::from_static(h.name());
            let value =
                HeaderValue::from_str(h.value()).map_err(|e| ForwardError::Build(e.to_string()))?;
            headers.insert(name, value);
        }
        Ok(())
    }
}

/// Remove `aws-chunked` from `Content-Encoding`, keeping any other coding.
fn strip_aws_chunked(headers: &mut HeaderMap) {
    let Some(v) = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
    else {
        return;
    };
    let rest: Vec<&str> = v
        .split(',')
        .map(str::trim)
        .filter(|c| !c.eq_ignore_ascii_case("aws-chunked") && !c.is_empty())
        .collect();
    if rest.is_empty() {
        headers.remove(header::CONTENT_ENCODING);
    } else if let Ok(v) = HeaderValue::from_str(&rest.join(",")) {
        headers.insert(header::CONTENT_ENCODING, v);
    }
}

/// The query without the client's presigned-URL signature.
fn strip_presign(query: &str) -> String {
    query
        .split('&')
        .filter(|pair| {
            let name = pair.split('=').next().unwrap_or("");
            !pair.is_empty() && !PRESIGNED_PARAMS.contains(&name) && !PRESIGN_EXTRA.contains(&name)
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// What became of an exchange that broke: [`ForwardError::Tls`] if TLS failed, else
/// [`ForwardError::Transport`], either with the whole chain of causes.
pub(crate) fn transport_error(e: &(dyn std::error::Error + 'static)) -> ForwardError {
    if tls_failure(e) {
        ForwardError::Tls(error_chain(e))
    } else {
        ForwardError::Transport(error_chain(e))
    }
}

/// Whether `e` or one of its causes is rustls's: a certificate refused (untrusted, for another
/// name, expired), a failed handshake, or a record that did not decrypt. rustls's errors reach
/// the HTTP clients wrapped in an `io::Error` (hyper-rustls wraps that one in another), and an
/// `io::Error`'s `source()` skips what it wraps, so the chain goes on through what each one
/// wraps instead.
pub(crate) fn tls_failure(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(e) = cause {
        if e.is::<rustls::Error>() {
            return true;
        }
        cause = match e.downcast_ref::<std::io::Error>() {
            Some(io) => io
                .get_ref()
                .map(|w| w as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    false
}

impl ForwardError {
    /// How the request ended, as the metrics label it.
    pub fn outcome(&self) -> UpstreamOutcome {
        match self {
            ForwardError::Transport(_) => UpstreamOutcome::Failed("transport"),
            ForwardError::Tls(_) => UpstreamOutcome::Failed("tls"),
            ForwardError::Timeout(_) => UpstreamOutcome::Failed("timeout"),
            ForwardError::Credentials(_) | ForwardError::Build(_) => {
                UpstreamOutcome::Failed("internal")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error wrapping an I/O error, as the HTTP clients' connect errors do.
    #[derive(Debug, thiserror::Error)]
    #[error("connecting")]
    struct Connecting(#[source] std::io::Error);

    #[test]
    fn a_certificate_refused_under_an_io_error_is_a_tls_failure_and_a_reset_is_not() {
        // As hyper-rustls hands it on: tokio-rustls's `io::Error` in one of its own.
        let refused = Connecting(std::io::Error::other(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        )));
        assert!(tls_failure(&refused));
        let e = transport_error(&refused);
        assert!(
            matches!(&e, ForwardError::Tls(m) if m.contains("UnknownIssuer")),
            "{e:?}"
        );
        assert_eq!(e.outcome(), UpstreamOutcome::Failed("tls"));

        let reset = Connecting(std::io::ErrorKind::ConnectionReset.into());
        assert!(!tls_failure(&reset));
        let e = transport_error(&reset);
        assert!(matches!(e, ForwardError::Transport(_)), "{e:?}");
        assert_eq!(e.outcome(), UpstreamOutcome::Failed("transport"));
    }

    fn forwarder(path_style: bool) -> Forwarder {
        Forwarder::new(
            Some("http://127.0.0.1:9000"),
            "us-east-1",
            path_style,
            None,
            (Duration::from_secs(1), Duration::from_secs(1)),
            None,
        )
        .unwrap()
    }

    #[test]
    fn addresses_path_and_virtual_style() {
        let obj = Target::Object {
            bucket: "bkt".into(),
            key: "a b/c+d~".into(),
        };
        let (uri, host) = forwarder(true).uri(&obj, Some("tagging&X-Amz-Signature=x"));
        assert_eq!(uri, "http://127.0.0.1:9000/bkt/a%20b/c%2Bd~?tagging");
        assert_eq!(host, "127.0.0.1:9000");
        let (uri, host) = forwarder(false).uri(&obj, None);
        assert_eq!(uri, "http://bkt.127.0.0.1:9000/a%20b/c%2Bd~");
        assert_eq!(host, "bkt.127.0.0.1:9000");
        let dotted = Target::Bucket("a.b.c".into());
        assert_eq!(
            forwarder(false).uri(&dotted, Some("list-type=2")).0,
            "http://127.0.0.1:9000/a.b.c?list-type=2"
        );
        assert_eq!(
            forwarder(true).uri(&Target::Service, None).0,
            "http://127.0.0.1:9000/"
        );
    }

    #[test]
    fn content_encoding_keeps_other_codings() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_ENCODING,
            HeaderValue::from_static("aws-chunked,gzip"),
        );
        strip_aws_chunked(&mut h);
        assert_eq!(h[header::CONTENT_ENCODING], "gzip");
        h.insert(
            header::CONTENT_ENCODING,
            HeaderValue::from_static("aws-chunked"),
        );
        strip_aws_chunked(&mut h);
        assert!(h.get(header::CONTENT_ENCODING).is_none());
    }
}
