//! A heartbeat through the event stream: with `events_heartbeat` set, Larder writes a small
//! object (the time, as text) to that bucket and key every third of `events_max_silence`.
//! The bucket's notifications bring each write back as an event, which proves the whole path
//! (bucket → notification target or queue → Larder) works even when nothing else is written;
//! if the event stops coming, the stream is declared unhealthy and Larder falls back to
//! `events_fallback_ttl` by itself. The write goes upstream with Larder's own credentials,
//! which therefore need `s3:PutObject` on that key.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{HeaderMap, Method};
use sha2::Digest;
use tokio_util::sync::CancellationToken;

use crate::s3::request::Target;
use crate::upstream::forward::{Forward, Forwarder, Reshaped, SignedBody};

/// Where the heartbeat is written, and how often.
pub struct Heartbeat {
    /// The upstream.
    pub forwarder: Arc<Forwarder>,
    /// The bucket.
    pub bucket: String,
    /// The key.
    pub key: String,
    /// Between writes.
    pub every: Duration,
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
        let forward = Forward {
            method: Method::PUT,
            target: Target::Object {
                bucket: self.bucket.as_str().into(),
                key: self.key.as_str().into(),
            },
            query: None,
            headers: HeaderMap::new(),
            body: Body::from(body),
            payload: SignedBody::Sha256(hash),
            reshaped: Reshaped::AsSent,
        };
        let response = self
            .forwarder
            .send(forward)
            .await
            .map_err(|e| e.to_string())?;
        if response.status().is_success() {
            Ok(())
        } else {
            Err(format!("upstream answered {}", response.status()))
        }
    }
}
