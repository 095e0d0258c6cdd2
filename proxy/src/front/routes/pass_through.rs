//! Everything that is not a cacheable read: sent upstream as the client signed it (re-signed
//! with Larder's credentials), streamed back; a write that succeeds forgets what was cached of
//! its object.

use std::sync::Arc;

use axum::body::Body;
use futures::TryStreamExt;
use http::request::Parts;
use http::{HeaderValue, Method};
use parking_lot::Mutex;

use crate::auth::chunked::{self, ChunkError, Decoder};
use crate::auth::{Payload, Principal};
use crate::freshness::Learnt;
use crate::model::ObjectId;
use crate::s3::copy_source::CopySource;
use crate::s3::headers::names;
use crate::s3::operation::Operation;
use crate::s3::request::Target;
use crate::s3::S3Error;
use crate::telemetry::labels::XCache;
use crate::upstream::forward::{Forward, ForwardError, Reshaped, SignedBody};

use super::{AppState, Handled};

impl AppState {
    /// Send the request upstream as it is, re-signed, and stream the answer back.
    pub(super) async fn pass_through(
        &self,
        req: Parts,
        body: Body,
        target: Target,
        principal: Principal,
        copy_source: Option<CopySource>,
        operation: Operation,
    ) -> Handled {
        let write = !matches!(req.method, Method::GET | Method::HEAD);
        let stale = if write {
            stale_ids(&target, req.uri.query())
        } else {
            Vec::new()
        };
        // Forget before (readers revalidate while the write runs) and after (anything cached
        // from the old version in between, here and in the fleet).
        for id in &stale {
            self.metadata.invalidate(id).await;
        }
        let failure = Arc::new(Mutex::new(None::<ChunkError>));
        let (body, reshaped) = match &principal.payload {
            Payload::SignedChunks { trailer, signer } => {
                let header = |name: &str| req.headers.get(name).and_then(|v| v.to_str().ok());
                let length = header("x-amz-decoded-content-length")
                    .and_then(|v| v.parse::<u64>().ok())
                    .ok_or(S3Error::MissingContentLength)?;
                let mut decoder = Decoder::new(signer.clone(), *trailer, length);
                let reshaped = if *trailer {
                    let names = header("x-amz-trailer")
                        .and_then(chunked::trailer_names)
                        .ok_or_else(|| {
                            S3Error::InvalidRequest(
                                "x-amz-trailer must name x-amz-checksum-* headers".into(),
                            )
                        })?;
                    let framed = chunked::framed_length(length, &names);
                    decoder = decoder.reframed(names);
                    Reshaped::Reframed(framed)
                } else {
                    Reshaped::Decoded(length)
                };
                let slot = failure.clone();
                let stream = chunked::decode(body.into_data_stream(), decoder).map_err(move |e| {
                    *slot.lock() = Some(e.clone());
                    std::io::Error::other(e)
                });
                (Body::from_stream(stream), reshaped)
            }
            _ => (body, Reshaped::AsSent),
        };
        // Only what the client signed (and the standard headers S3 takes unsigned) goes on
        // under Larder's signature.
        let mut headers = principal.signed.forwardable(&req.headers);
        if let Some(source) = &copy_source {
            // Visible ASCII: the parse re-encodes every other byte.
            if let Ok(v) = HeaderValue::from_str(&source.header_value()) {
                headers.insert(names::X_AMZ_COPY_SOURCE, v);
            }
        }
        let forward = Forward {
            method: req.method.clone(),
            target: target.clone(),
            query: req.uri.query().map(str::to_owned),
            headers,
            body,
            payload: (&principal.payload).into(),
            reshaped,
        };
        let result = self
            .forwarder
            .send_counted(forward, operation, &self.metrics)
            .await;
        match result {
            Ok(response) => {
                if write && response.status().is_success() {
                    self.forget(&stale, &target, &req).await;
                }
                Ok((response, XCache::Pass))
            }
            Err(e) => {
                if let Some(chunk_error) = failure.lock().take() {
                    return Err(match chunk_error {
                        ChunkError::Signature => S3Error::SignatureDoesNotMatch,
                        other => S3Error::IncompleteBody(other.to_string()),
                    });
                }
                Err(match e {
                    ForwardError::Transport(m) | ForwardError::Tls(m) => {
                        S3Error::ServiceUnavailable(format!("upstream unavailable: {m}"))
                    }
                    ForwardError::Timeout(_) => S3Error::ServiceUnavailable(e.to_string()),
                    ForwardError::Credentials(_) | ForwardError::Build(_) => {
                        tracing::error!(error = %e, "cannot pass a request upstream");
                        S3Error::InternalError
                    }
                })
            }
        }
    }

    /// Drop what a write made stale, here and in the fleet ([`crate::freshness::Freshness`]). Blocks need no
    /// dropping: they are keyed by ETag, and a changed object has a new one.
    async fn forget(&self, stale: &[ObjectId], target: &Target, req: &Parts) {
        for id in stale {
            self.freshness.object_changed(id, Learnt::Write).await;
        }
        // DeleteObjects names its keys in the body, which streams upstream unread; DeleteBucket
        // empties nothing but is rare. Both forget the whole bucket.
        if let Target::Bucket(bucket) = target {
            if req.method == Method::DELETE
                || (req.method == Method::POST && has_param(req.uri.query(), "delete"))
            {
                self.freshness.bucket_changed(bucket, Learnt::Write).await;
            }
        }
    }
}

fn has_param(query: Option<&str>, name: &str) -> bool {
    form_urlencoded::parse(query.unwrap_or("").as_bytes()).any(|(k, _)| k == name)
}

/// The cached metadata a write to `target` makes stale: the object, and the version it names.
fn stale_ids(target: &Target, query: Option<&str>) -> Vec<ObjectId> {
    let Target::Object { bucket, key } = target else {
        return Vec::new();
    };
    let id = |version: Option<Arc<str>>| ObjectId {
        bucket: bucket.clone(),
        key: key.clone(),
        version_id: version,
    };
    let mut ids = vec![id(None)];
    let version = form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .find(|(k, _)| k == "versionId")
        .map(|(_, v)| Arc::from(v.as_ref()));
    if version.is_some() {
        ids.push(id(version));
    }
    ids
}

/// What the forwarder signs for a body the client protected so: a whole-body hash passes on;
/// signed chunks have been checked here and go on unsigned (or decoded).
impl From<&Payload> for SignedBody {
    fn from(payload: &Payload) -> Self {
        match payload {
            Payload::Sha256(h) => SignedBody::Sha256(h.clone()),
            Payload::UnsignedTrailer => SignedBody::UnsignedTrailer,
            Payload::Unsigned | Payload::SignedChunks { .. } => SignedBody::Unsigned,
        }
    }
}
