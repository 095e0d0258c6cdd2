//! A heartbeat through the event stream: with `events_heartbeat` set, Larder writes a small
//! object (the time, as text) to that bucket and key every third of `events_max_silence`.
//! The bucket's notifications bring each write back as an event, which proves the whole path
//! (bucket → notification target or queue → Larder) works even when nothing else is written;
//! if the event stops coming, the stream is declared unhealthy and Larder falls back to
//! `events_fallback_ttl` by itself. The write goes upstream with Larder's own credentials,
//! which therefore need `s3:PutObject` on that key. With `upstream_requester_pays`, the write
//! says Larder pays for it, as every other request of Larder's own does.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{HeaderMap, HeaderValue, Method};
use sha2::Digest;
use tokio_util::sync::CancellationToken;

use crate::s3::headers::names;
use crate::s3::operation::Operation;
use crate::s3::request::Target;
use crate::telemetry::metrics::Metrics;
use crate::upstream::forward::{Forward, Forwarder, Reshaped, SignedBody};

/// Where the heartbeat is written, and how often.
pub struct Heartbeat {
    /// The upstream.
    pub forwarder: Arc<Forwarder>,
    /// Where each write is counted and priced, as every upstream request of Larder's own.
    pub metrics: Arc<Metrics>,
    /// The bucket.
    pub bucket: String,
    /// The key.
    pub key: String,
    /// Between writes.
    pub every: Duration,
    /// Say that Larder pays for the write (`x-amz-request-payer: requester`, signed), as
    /// `upstream_requester_pays` has every request of Larder's own do: a Requester Pays
    /// bucket refuses a write from anyone but its owner that does not.
    pub requester_pays: bool,
}

impl Heartbeat {
    /// Write the heartbeat every `every` until `shutdown`; a failed write is logged, and shows
    /// in the stream's health when its event does not come.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut interval = tokio::time::interval(self.every);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = interval.tick() => {}
                () = shutdown.cancelled() => return,
            }
            if let Err(e) = self.beat().await {
                tracing::warn!(bucket = %self.bucket, key = %self.key, error = %e, "events heartbeat write failed");
            }
        }
    }

    async fn beat(&self) -> Result<(), String> {
        let body = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
        let hash = hex::encode(sha2::Sha256::digest(body.as_bytes()));
        let mut headers = HeaderMap::new();
        if self.requester_pays {
            headers.insert(
                names::X_AMZ_REQUEST_PAYER,
                HeaderValue::from_static("requester"),
            );
        }
        let forward = Forward {
            method: Method::PUT,
            target: Target::Object {
                bucket: self.bucket.as_str().into(),
                key: self.key.as_str().into(),
            },
            query: None,
            headers,
            body: Body::from(body),
            payload: SignedBody::Sha256(hash),
            reshaped: Reshaped::AsSent,
        };
        let response = self
            .forwarder
            .send_counted(forward, Operation::PutObject, &self.metrics)
            .await
            .map_err(|e| e.to_string())?;
        if response.status().is_success() {
            Ok(())
        } else {
            Err(format!("upstream answered {}", response.status()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_credential_types::provider::SharedCredentialsProvider;
    use aws_credential_types::Credentials;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The heartbeat's PUT as the upstream reads it, `requester_pays` or not.
    async fn beat_as_read(requester_pays: bool) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 8192];
            let n = conn.read(&mut buf).await.unwrap();
            conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                .await
                .unwrap();
            String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase()
        });
        let credentials = Credentials::new("k", "s", None, None, "test");
        let forwarder = Forwarder::new(
            Some(&url),
            "us-east-1",
            true,
            Some(SharedCredentialsProvider::new(credentials)),
            (Duration::from_secs(5), Duration::from_secs(5)),
            None,
        )
        .unwrap();
        let metrics = Arc::new(Metrics::default());
        let heartbeat = Heartbeat {
            forwarder: Arc::new(forwarder),
            metrics: metrics.clone(),
            bucket: "b".to_owned(),
            key: ".larder/heartbeat".to_owned(),
            every: Duration::from_secs(1),
            requester_pays,
        };
        heartbeat.beat().await.unwrap();
        // Counted and priced like every upstream request of Larder's own.
        let s = metrics.snapshot();
        let puts = [("operation", "PutObject"), ("status", "200")];
        assert_eq!(s.sum("larder_upstream_requests_total", &puts), 1.0);
        assert!(s.sum("larder_cost_upstream_dollars_total", &[]) > 0.0);
        server.await.unwrap()
    }

    /// With `upstream_requester_pays` the heartbeat says Larder pays, and signs it (S3 takes
    /// an `x-amz-*` header only when it is signed); without it, it does not say so.
    #[tokio::test]
    async fn a_larder_that_pays_says_so_in_its_heartbeat() {
        for pays in [true, false] {
            let request = beat_as_read(pays).await;
            assert!(
                request.starts_with("put /b/.larder/heartbeat "),
                "{request}"
            );
            let said = request.contains("\r\nx-amz-request-payer: requester\r\n");
            let signed = request
                .split_once("signedheaders=")
                .and_then(|(_, rest)| rest.split([',', '\r']).next())
                .is_some_and(|names| names.split(';').any(|n| n == "x-amz-request-payer"));
            assert_eq!((said, signed), (pays, pays), "{request}");
        }
    }
}
