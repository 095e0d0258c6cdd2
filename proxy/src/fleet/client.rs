//! Asking another replica for a block: HTTP/2, over TLS when the fleet has certificates
//! ([`super::tls`]) and over plain TCP (h2c) otherwise, one multiplexed connection per peer,
//! every request signed ([`super::auth`]).
//!
//! A peer that cannot be reached, or has not started answering within the deadline, is a
//! [`PeerError::Unavailable`]: the caller fetches from S3 itself. An answer the owner relays from
//! S3 (no such key, object changed) is a [`PeerError::Answer`]: asking S3 again would only get
//! the same answer.

use std::ops::Range;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::stream::{self, StreamExt, TryStreamExt};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_rustls::{FixedServerNameResolver, HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use serde::{Deserialize, Serialize};

use super::auth::{PeerSecret, HEADER};
use super::notify::ChangeNotice;
use super::seal;
use super::tls::PeerTls;
use super::wire::{self, FrameError, WireError};
use crate::model::{
    error_chain, BodyStream, ObjectId, ObjectMeta, PartNumber, PartSpan, UpstreamError,
};

/// A request to `peer` (at `scheme`) carrying `signature` ([`HEADER`]).
///
/// The signature is marked never to be indexed by HTTP/2's header compression (HPACK), as `h2`
/// already treats `Authorization`: it is new in every request (its time and path change), so
/// indexed, each request's value went into the connection's header table, and each next one
/// was compared with the old ones before being added too (the request ids' cost in
/// docs/benchmarks.md, "The request id never indexed"). A secret-derived value is also what
/// RFC 7541 (7.1.3) says an encoder should keep out of the table.
fn signed_request(
    method: http::Method,
    scheme: &str,
    peer: &str,
    path_and_query: &str,
    signature: &str,
) -> Result<Request<Empty<Bytes>>, http::Error> {
    let mut value = http::HeaderValue::from_str(signature)?;
    value.set_sensitive(true);
    Request::builder()
        .method(method)
        .uri(format!("{scheme}://{peer}{path_and_query}"))
        .header(HEADER, value)
        .body(Empty::new())
}

/// What a replica says about itself at `/v1/info`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Info {
    /// A random number chosen at start: a replica that reaches itself knows it.
    pub id: u64,
    /// Its zone.
    pub zone: Option<String>,
    /// Its block size: replicas with another one cannot share blocks.
    pub block_size: u64,
}

/// Why a peer did not deliver.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PeerError {
    /// The owner relayed the upstream's answer: pass it on.
    #[error("the owner relayed: {0}")]
    Answer(UpstreamError),
    /// The peer could not be used; `reason` is a metric label.
    #[error("peer unavailable ({reason}): {message}")]
    Unavailable {
        /// `unreachable`, `timeout` or `error`.
        reason: &'static str,
        /// What happened.
        message: String,
    },
}

impl PeerError {
    fn unavailable(reason: &'static str, message: impl ToString) -> Self {
        PeerError::Unavailable {
            reason,
            message: message.to_string(),
        }
    }
}

/// An open's answer: the metadata, how old the owner's copy of it is, and the block's bytes.
pub type Opened = (ObjectMeta, Duration, BodyStream);

/// Largest error body read from a peer.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// The client every replica uses to reach the others.
pub struct PeerClient {
    http: Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
    /// `https` with the fleet's TLS, `http` without.
    scheme: &'static str,
    secret: PeerSecret,
    deadline: Duration,
    block_size: u64,
}

impl PeerClient {
    /// A client signing with `secret` that gives a peer `deadline` to start answering; it
    /// announces `block_size` so an owner cutting blocks differently refuses. With `tls` it
    /// reaches peers over TLS only; without, over plain TCP only.
    pub fn new(
        secret: PeerSecret,
        deadline: Duration,
        block_size: u64,
        tls: Option<PeerTls>,
    ) -> Self {
        let mut tcp = HttpConnector::new();
        tcp.set_nodelay(true);
        tcp.set_connect_timeout(Some(deadline));
        // The connector takes every scheme; which one is used is this client's choice below.
        tcp.enforce_http(false);
        let scheme = if tls.is_some() { "https" } else { "http" };
        let connector = match tls {
            Some(PeerTls { config, name, .. }) => {
                let builder = HttpsConnectorBuilder::new()
                    .with_tls_config(config)
                    .https_only();
                match name {
                    Some(name) => builder
                        .with_server_name_resolver(FixedServerNameResolver::new(name))
                        .enable_http2()
                        .wrap_connector(tcp),
                    None => builder.enable_http2().wrap_connector(tcp),
                }
            }
            // Never used for TLS: every URI this client makes is `http://`.
            None => HttpsConnectorBuilder::new()
                .with_tls_config(cleartext_only())
                .https_or_http()
                .enable_http2()
                .wrap_connector(tcp),
        };
        let http = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            // Blocks are megabytes: windows big enough that one stream is not held to 64 KiB
            // per round trip.
            .http2_initial_stream_window_size(8u32 << 20)
            .http2_initial_connection_window_size(32u32 << 20)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .http2_keep_alive_timeout(Duration::from_secs(10))
            .pool_idle_timeout(Duration::from_secs(90))
            .build(connector);
        Self {
            http,
            scheme,
            secret,
            deadline,
            block_size,
        }
    }

    /// The deadline a peer has to start answering.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Ask `peer`; a successful answer comes back with its body already checked frame by frame
    /// ([`seal::unseal`]): only bytes the owner sent for this very request get through.
    async fn send(
        &self,
        peer: &str,
        path_and_query: String,
    ) -> Result<(StatusCode, BodyStream), PeerError> {
        self.send_as(http::Method::GET, peer, path_and_query).await
    }

    async fn send_as(
        &self,
        method: http::Method,
        peer: &str,
        path_and_query: String,
    ) -> Result<(StatusCode, BodyStream), PeerError> {
        let signature = self.secret.sign(method.as_str(), &path_and_query);
        let request = signed_request(method, self.scheme, peer, &path_and_query, &signature)
            .map_err(|e| PeerError::unavailable("error", e))?;
        let response = match tokio::time::timeout(self.deadline, self.http.request(request)).await {
            Err(_) => return Err(PeerError::unavailable("timeout", "no answer in time")),
            Ok(Err(e)) => return Err(PeerError::unavailable("unreachable", error_chain(&e))),
            Ok(Ok(r)) => r,
        };
        let status = response.status();
        if status.is_success() {
            let body = seal::unseal(
                self.secret.clone(),
                signature,
                body_stream(response.into_body()),
            );
            return Ok((status, body));
        }
        let mac = response
            .headers()
            .get(seal::MAC_HEADER)
            .and_then(|v| hex::decode(v.as_bytes()).ok());
        let body = Limited::new(response.into_body(), MAX_ERROR_BODY).collect();
        let body = match tokio::time::timeout(self.deadline, body).await {
            Ok(Ok(b)) => b.to_bytes(),
            _ => Bytes::new(),
        };
        // An error answer is acted on (relayed to the client) only if the owner signed it.
        let genuine = mac.is_some_and(|mac| {
            self.secret
                .verify_answer(&signature, seal::ERROR_SEQ, &body, &mac)
        });
        if !genuine {
            return Err(PeerError::unavailable(
                "error",
                format!("peer answered {status} without a valid MAC"),
            ));
        }
        match serde_json::from_slice::<WireError>(&body) {
            Ok(error) => match error.into_answer() {
                Some(answer) => Err(PeerError::Answer(answer)),
                None => Err(PeerError::unavailable(
                    "error",
                    format!("peer answered {status}"),
                )),
            },
            Err(_) => Err(PeerError::unavailable(
                "error",
                format!("peer answered {status}"),
            )),
        }
    }

    /// `range` of `object` (`size` bytes) at `etag`: one whole block, which the owner checks
    /// against the size and caches, as it arrives.
    pub async fn block(
        &self,
        peer: &str,
        object: &ObjectId,
        etag: &str,
        range: Range<u64>,
        size: u64,
    ) -> Result<BodyStream, PeerError> {
        let (start, end, size) = (
            range.start.to_string(),
            range.end.to_string(),
            size.to_string(),
        );
        let query = self.query(
            object,
            &[
                ("etag", etag),
                ("start", &start),
                ("end", &end),
                ("size", &size),
            ],
        );
        let (_, body) = self.send(peer, format!("/v1/block?{query}")).await?;
        Ok(body)
    }

    /// Metadata and block `index` of an object this replica knows nothing of, from its owner,
    /// which reads them as it would for a client of its own (usually one GET upstream, shared
    /// with everyone else asking). `changed`: how long ago this replica learnt that the object
    /// changed (`changed_us`): the owner drops what it cached before then, which the change's
    /// notice may not have reached yet. `Ok(None)`: the answer cannot stand for a HEAD.
    pub async fn open(
        &self,
        peer: &str,
        object: &ObjectId,
        index: u64,
        changed: Option<Duration>,
    ) -> Result<Option<Opened>, PeerError> {
        let index = index.to_string();
        let changed = changed.map(|d| d.as_micros().to_string());
        let mut extra = vec![("index", index.as_str())];
        if let Some(us) = &changed {
            extra.push(("changed_us", us));
        }
        let query = self.query(object, &extra);
        let (status, mut body) = self.send(peer, format!("/v1/open?{query}")).await?;
        if status == StatusCode::NO_CONTENT {
            return Ok(None);
        }
        let mut buf = BytesMut::new();
        let (meta, age) = loop {
            match wire::decode_meta(&mut buf) {
                Ok(found) => break found,
                Err(FrameError::Bad(e)) => return Err(PeerError::unavailable("error", e)),
                Err(FrameError::Incomplete) => {}
            }
            match tokio::time::timeout(self.deadline, body.next()).await {
                Ok(Some(Ok(chunk))) => buf.extend_from_slice(&chunk),
                Ok(Some(Err(e))) => return Err(PeerError::unavailable("error", e)),
                Ok(None) => return Err(PeerError::unavailable("error", "metadata cut short")),
                Err(_) => return Err(PeerError::unavailable("timeout", "metadata late")),
            }
        };
        let rest = buf.freeze();
        let body = stream::iter((!rest.is_empty()).then_some(Ok(rest)))
            .chain(body)
            .boxed();
        Ok(Some((meta, age, body)))
    }

    /// Tell `peer` of `change`, so it drops what it holds of the object (or bucket).
    pub async fn changed(&self, peer: &str, change: &ChangeNotice) -> Result<(), PeerError> {
        // Finished before the await: the serializer is not `Send`.
        let path = {
            let mut query = form_urlencoded::Serializer::new(String::new());
            query.append_pair("bucket", &change.bucket);
            if let Some(key) = &change.key {
                query.append_pair("key", key);
            }
            if change.from_event {
                query.append_pair("event", "1");
            }
            format!("/v1/changed?{}", query.finish())
        };
        self.post(peer, path).await
    }

    /// Tell `peer` where part `part` of `object` lies (`span`), so that it reads the part from
    /// the fleet's blocks instead of passing its first read through.
    pub async fn part(
        &self,
        peer: &str,
        object: &ObjectId,
        part: PartNumber,
        span: &PartSpan,
    ) -> Result<(), PeerError> {
        let numbers = [
            part.get().to_string(),
            span.size.to_string(),
            span.bytes.start.to_string(),
            span.bytes.end.to_string(),
        ];
        let count = span.parts_count.map(|c| c.to_string());
        let mut extra = vec![
            ("part", numbers[0].as_str()),
            ("etag", &*span.etag),
            ("size", &numbers[1]),
            ("start", &numbers[2]),
            ("end", &numbers[3]),
        ];
        if let Some(count) = &count {
            extra.push(("count", count));
        }
        // Each checksum named as its header is (`x-amz-checksum-crc32=...`).
        extra.extend(
            span.checksums
                .iter()
                .filter_map(|(name, value)| Some((name.as_str(), value.to_str().ok()?))),
        );
        let query = self.query(object, &extra);
        self.post(peer, format!("/v1/part?{query}")).await
    }

    /// A POST whose answer is empty; reading it to its end checks its seal.
    async fn post(&self, peer: &str, path_and_query: String) -> Result<(), PeerError> {
        let (_, body) = self
            .send_as(http::Method::POST, peer, path_and_query)
            .await?;
        let drained = body.try_for_each(|_| async { Ok(()) });
        match tokio::time::timeout(self.deadline, drained).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(PeerError::unavailable("error", e)),
            Err(_) => Err(PeerError::unavailable("timeout", "answer late")),
        }
    }

    /// What `peer` says about itself.
    pub async fn info(&self, peer: &str) -> Result<Info, PeerError> {
        let (_, body) = self.send(peer, "/v1/info".to_owned()).await?;
        let collect = async {
            let mut buf = Vec::new();
            let mut body = body;
            while let Some(chunk) = body.next().await {
                buf.extend_from_slice(&chunk.map_err(|e| PeerError::unavailable("error", e))?);
                if buf.len() > MAX_ERROR_BODY {
                    return Err(PeerError::unavailable("error", "info too long"));
                }
            }
            Ok(buf)
        };
        let body = tokio::time::timeout(self.deadline, collect)
            .await
            .map_err(|_| PeerError::unavailable("timeout", "info late"))??;
        serde_json::from_slice(&body).map_err(|e| PeerError::unavailable("error", e))
    }

    /// The query naming `object`, with `extra` pairs.
    fn query(&self, object: &ObjectId, extra: &[(&str, &str)]) -> String {
        let mut query = form_urlencoded::Serializer::new(String::new());
        query
            .append_pair("bucket", &object.bucket)
            .append_pair("key", &object.key)
            .append_pair("bs", &self.block_size.to_string());
        if let Some(v) = &object.version_id {
            query.append_pair("version", v);
        }
        query.extend_pairs(extra);
        query.finish()
    }
}

/// A TLS configuration trusting no one, for the connector of a fleet without TLS, which needs
/// one though it never makes a handshake.
fn cleartext_only() -> rustls::ClientConfig {
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("aws-lc-rs supports the default protocol versions")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth()
}

fn body_stream(body: hyper::body::Incoming) -> BodyStream {
    body.into_data_stream()
        .map_err(|e| UpstreamError::Transport(format!("peer body: {e}")))
        .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_requests_signature_is_never_indexed() {
        let secret = PeerSecret::new(b"a fleet secret of some length").unwrap();
        let signature = secret.sign("GET", "/v1/block?bucket=b&key=k");
        let request = signed_request(
            http::Method::GET,
            "http",
            "127.0.0.1:9000",
            "/v1/block?bucket=b&key=k",
            &signature,
        )
        .unwrap();
        let value = &request.headers()[HEADER];
        assert_eq!(value, signature.as_str());
        assert!(value.is_sensitive());
        assert_eq!(
            request.uri(),
            "http://127.0.0.1:9000/v1/block?bucket=b&key=k"
        );
    }
}
