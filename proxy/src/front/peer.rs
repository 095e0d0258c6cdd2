//! The peer listener: what a replica serves the others, on a port of its own, to signed
//! requests only.
//!
//! - `GET /v1/info`: the replica's id, zone and block size (membership probes).
//! - `GET /v1/block?bucket&key[&version]&etag&start&end&bs&size`: one block's bytes, read as for
//!   a client of this replica (memory, disk, single-flight, upstream) but never from a third
//!   replica. Fetched for an object this replica has no metadata for, it is fetched by a GET
//!   that brings the metadata too ([`open_with_block`]).
//! - `GET /v1/open?bucket&key[&version]&index&bs[&changed_us]`: an object this replica's asker
//!   knows nothing of: its metadata (with its age) and then block `index`, usually from one
//!   upstream GET that serves every replica asking. `changed_us`: the asker learnt that many
//!   microseconds ago that the object changed; what this replica cached before then is
//!   dropped first, and a fetch it began before then is not joined (the change's notice may
//!   not have reached it yet).
//!
//! - `POST /v1/changed?bucket[&key][&event=1]`: an object (or any object of a bucket) changed,
//!   learnt by the sender from a write through it or an S3 event (which also shows this
//!   replica the event stream is alive): drop what is held of it
//!   ([`crate::fleet::notify`]). A replayed notice (within the signature's five minutes) only
//!   costs a refetch.
//! - `POST /v1/part?bucket&key[&version]&bs&part&etag&size&start&end[&count][&x-amz-checksum-*]`:
//!   where part `part` of an object of that ETag and size lies (bytes `start..end`), as the
//!   upstream answered the sender: this replica reads that part from the fleet's blocks while
//!   its object keeps that ETag and size (`read::parts`), instead of passing its first read
//!   through. Like a block, it is taken on the fleet secret's word.
//!
//! Like the S3 front, an answer waits for its first bytes, so a failure is a status and not a
//! broken body.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use bytes::Bytes;
use futures::{stream, StreamExt};
use http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};

use crate::fleet::auth::{PeerSecret, HEADER};
use crate::fleet::client::Info;
use crate::fleet::seal;
use crate::fleet::wire::{self, WireError};
use crate::freshness::{Freshness, Learnt};
use crate::front::handler::Handler;
use crate::model::{ObjectId, PartNumber, PartSpan, UpstreamError};
use crate::read::blocks::BlockStore;
use crate::read::metadata::{MetadataCache, Source};
use crate::read::parts::PartLayouts;
use crate::telemetry::labels::NoticeOutcome;
use crate::telemetry::metrics::Metrics;

/// What the peer listener needs.
pub struct PeerState {
    /// The blocks, read for peers.
    pub blocks: Arc<BlockStore>,
    /// Object metadata, for opens.
    pub metadata: Arc<MetadataCache>,
    /// What a change told by another replica drops.
    pub freshness: Arc<Freshness>,
    /// Where parts of multipart uploads lie, as other replicas tell this one.
    pub parts: PartLayouts,
    /// The fleet's shared secret.
    pub secret: PeerSecret,
    /// What this replica says about itself.
    pub info: Info,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The objects being opened here for peers now, and the block each open fetches.
    pub opening: Opening,
}

/// The objects an open for a peer (`/v1/open`, or a block request's [`open_with_block`]) is
/// learning the metadata of now, each with the block its GET brings. A block request for that
/// very block joins the open (the block's fetch is joined when its GET answers, so a fetch of
/// its own would ask the upstream for the block twice); one for another block fetches it
/// straight away instead of waiting for the metadata. An entry lives as long as the request
/// that added it.
#[derive(Default)]
pub struct Opening(parking_lot::Mutex<HashMap<ObjectId, u64>>);

/// An object in [`Opening`], taken out when dropped (the request answered or gone).
struct Opened<'a>(&'a Opening, ObjectId);

impl Opening {
    /// Note that `object` is opened with block `index`; or the block an open under way brings.
    fn start(&self, object: &ObjectId, index: u64) -> Result<Opened<'_>, u64> {
        match self.0.lock().entry(object.clone()) {
            std::collections::hash_map::Entry::Occupied(open) => Err(*open.get()),
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(index);
                Ok(Opened(self, object.clone()))
            }
        }
    }
}

impl Drop for Opened<'_> {
    fn drop(&mut self) {
        self.0 .0.lock().remove(&self.1);
    }
}

/// The peer front's service: every request to [`handle`].
pub fn service(state: Arc<PeerState>) -> Handler<PeerState, impl Future<Output = Response> + Send> {
    Handler::new(state, handle)
}

type Params = HashMap<String, String>;

async fn handle(peer: Arc<PeerState>, req: Request) -> Response {
    let path_and_query = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let signature = req
        .headers()
        .get(HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|h| peer.secret.verify(h, req.method().as_str(), path_and_query))
        .map(str::to_owned);
    let Some(signature) = signature else {
        peer.metrics
            .peer_request("served", "unknown", "refused", None);
        return refuse(StatusCode::FORBIDDEN, "not signed with the fleet secret");
    };
    let (parts, _) = req.into_parts();
    let response = answer(&peer, &parts).await;
    authenticate(&peer.secret, &signature, response).await
}

/// Seal an answer for the request signed by `signature`: a successful body is sent as
/// authenticated frames ([`seal`]), an error body (small JSON) with its MAC in a header.
async fn authenticate(secret: &PeerSecret, signature: &str, response: Response) -> Response {
    let (mut parts, body) = response.into_parts();
    if parts.status.is_success() {
        let sealed = seal::seal(secret.clone(), signature.to_owned(), body_stream(body));
        return Response::from_parts(parts, Body::from_stream(sealed));
    }
    let bytes = axum::body::to_bytes(body, 64 * 1024)
        .await
        .unwrap_or_default();
    let mac = secret.answer_mac(signature, seal::ERROR_SEQ, &bytes);
    if let Ok(v) = header::HeaderValue::from_str(&hex::encode(mac)) {
        parts.headers.insert(seal::MAC_HEADER, v);
    }
    Response::from_parts(parts, Body::from(bytes))
}

fn body_stream(body: Body) -> stream::BoxStream<'static, Result<Bytes, UpstreamError>> {
    body.into_data_stream()
        .map(|r| r.map_err(|e| UpstreamError::Transport(e.to_string())))
        .boxed()
}

async fn answer(peer: &PeerState, req: &http::request::Parts) -> Response {
    let params: Params = form_urlencoded::parse(req.uri.query().unwrap_or("").as_bytes())
        .into_owned()
        .collect();
    match (&req.method, req.uri.path()) {
        (&Method::POST, "/v1/changed") => return changed(peer, &params).await,
        (&Method::POST, "/v1/part") => return part(peer, &params),
        (&Method::GET, _) => {}
        _ => {
            return refuse(
                StatusCode::METHOD_NOT_ALLOWED,
                "GET, or POST /v1/changed or /v1/part",
            )
        }
    }
    match req.uri.path() {
        "/v1/info" => json(&peer.info),
        "/v1/block" => {
            let response = block(peer, &params).await;
            peer.metrics
                .peer_request("served", "block", outcome(&response), None);
            response
        }
        "/v1/open" => {
            let response = open(peer, &params).await;
            peer.metrics
                .peer_request("served", "open", outcome(&response), None);
            response
        }
        _ => refuse(StatusCode::NOT_FOUND, "no such peer endpoint"),
    }
}

/// Another replica says an object (or a bucket) changed.
async fn changed(peer: &PeerState, params: &Params) -> Response {
    let Some(bucket) = params.get("bucket").filter(|b| !b.is_empty()) else {
        return refuse(StatusCode::BAD_REQUEST, "bucket is required");
    };
    if params.contains_key("event") {
        peer.freshness.heard();
    }
    match params.get("key") {
        Some(key) => {
            let id = ObjectId {
                bucket: bucket.as_str().into(),
                key: key.as_str().into(),
                version_id: None,
            };
            peer.freshness.object_changed(&id, Learnt::Peer).await;
        }
        None => peer.freshness.bucket_changed(bucket, Learnt::Peer).await,
    }
    Response::new(Body::empty())
}

/// Another replica says where a part lies.
fn part(peer: &PeerState, params: &Params) -> Response {
    let told = (|| {
        let object = object(peer, params)?;
        let part = PartNumber::parse(&text(params, "part")?)
            .ok_or_else(|| bad("part is not a part number".into()))?;
        let (size, start, end) = (
            number(params, "size")?,
            number(params, "start")?,
            number(params, "end")?,
        );
        if start >= end || end > size {
            return Err(bad(format!(
                "no part lies at {start}..{end} of {size} bytes"
            )));
        }
        let parts_count = match params.get("count") {
            Some(_) => Some(
                u32::try_from(number(params, "count")?)
                    .map_err(|_| bad("count is out of range".into()))?,
            ),
            None => None,
        };
        let span = PartSpan {
            etag: text(params, "etag")?,
            size,
            bytes: start..end,
            parts_count,
            checksums: told_checksums(params),
        };
        Ok::<_, WireError>((object, part, span))
    })();
    match told {
        Ok((object, part, span)) => {
            peer.parts.learn_from_peer(object, part, span);
            peer.metrics.notice(NoticeOutcome::Received);
            Response::new(Body::empty())
        }
        Err(e) => error(&e),
    }
}

/// The part's checksums told (each named as its header is), as the S3 front takes them from an
/// upstream answer: only the checksum headers S3 sends, and only values a header may carry.
fn told_checksums(params: &Params) -> Vec<(HeaderName, HeaderValue)> {
    let told: HeaderMap = params
        .iter()
        .filter_map(|(name, value)| {
            Some((
                HeaderName::from_bytes(name.as_bytes()).ok()?,
                HeaderValue::from_str(value).ok()?,
            ))
        })
        .collect();
    crate::s3::headers::checksums(&told)
}

fn outcome(response: &Response) -> &'static str {
    match response.status().as_u16() {
        200..=299 => "ok",
        503 => "unavailable",
        400 | 403 => "refused",
        _ => "answer",
    }
}

fn json(value: &impl serde::Serialize) -> Response {
    let mut response = Response::new(Body::from(serde_json::to_vec(value).unwrap_or_default()));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}

fn error(e: &WireError) -> Response {
    let mut response = json(e);
    *response.status_mut() = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_GATEWAY);
    response
}

fn refuse(status: StatusCode, message: &str) -> Response {
    let mut response = error(&WireError::Refused {
        message: message.to_owned(),
    });
    *response.status_mut() = status;
    response
}

fn unavailable(message: impl ToString) -> Response {
    error(&WireError::Unavailable {
        message: message.to_string(),
    })
}

fn bad(message: String) -> WireError {
    WireError::Refused { message }
}

fn number(params: &Params, name: &str) -> Result<u64, WireError> {
    params
        .get(name)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| bad(format!("`{name}` is missing or not a number")))
}

fn text(params: &Params, name: &str) -> Result<Arc<str>, WireError> {
    params
        .get(name)
        .filter(|v| !v.is_empty())
        .map(|v| Arc::from(v.as_str()))
        .ok_or_else(|| bad(format!("`{name}` is missing")))
}

/// The object named, after checking the asker cuts blocks as this replica does: block `i` must
/// mean the same bytes on both, or the cache would hold wrong ones.
fn object(peer: &PeerState, params: &Params) -> Result<ObjectId, WireError> {
    if number(params, "bs")? != peer.blocks.layout().block_size() {
        return Err(WireError::Unavailable {
            message: "this replica cuts objects into blocks of another size".into(),
        });
    }
    Ok(ObjectId {
        bucket: text(params, "bucket")?,
        key: text(params, "key")?,
        version_id: text(params, "version").ok(),
    })
}

async fn block(peer: &PeerState, params: &Params) -> Response {
    let parsed = (|| {
        Ok::<_, WireError>((
            object(peer, params)?,
            text(params, "etag")?,
            number(params, "start")?,
            number(params, "end")?,
        ))
    })();
    let (object, etag, start, end) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => return error(&e),
    };
    // The block's extent follows from the object's size, never from what the asker says: a
    // short `end` must not make this replica cache a truncated block under the real block's
    // name. An asker that does not send the size (an older replica) is told to use S3.
    let Ok(size) = number(params, "size") else {
        return unavailable("ask with the object's size");
    };
    let layout = peer.blocks.layout();
    let whole = layout
        .block(start / layout.block_size(), size)
        .map(|s| s.block_start..s.block_start + s.block_len);
    if whole != Some(start..end) {
        return error(&bad("not one whole block of an object of that size".into()));
    }
    let index = start / layout.block_size();
    if let Err(e) = open_with_block(peer, &object, &etag, index, size).await {
        return error(&e);
    }
    let body = peer.blocks.read_for_peer(object, etag, start..end, size);
    stream_after_first(peer, Bytes::new(), body.boxed()).await
}

/// A block this replica must fetch, of an object it has no metadata for, is fetched as an open
/// is: by a GET whose answer also brings the metadata, cached here. Otherwise this replica's own
/// clients' first read of the object, if it starts in a block this replica owns, would ask the
/// upstream again for what it already holds: that open is its own to make, and a block's key
/// needs the ETag, so the blocks cannot be found first. The GET is the one the block needed
/// anyway (one flight with it: the read that follows joins it), without `If-Match`; an answer
/// of another version (the object changed since the asker learnt it) is cached as that
/// version's, and the asker told the object changed, as a failed `If-Match` would tell it.
/// One open at a time ([`Opening`]): the others asked at once fetch their blocks meanwhile.
async fn open_with_block(
    peer: &PeerState,
    object: &ObjectId,
    etag: &Arc<str>,
    index: u64,
    size: u64,
) -> Result<(), WireError> {
    if !peer.metadata.is_unknown(object) || !peer.blocks.would_fetch(object, etag, index) {
        return Ok(());
    }
    // The open under way brings this block, or another: joined, or not waited for.
    let _opening = match peer.opening.start(object, index) {
        Ok(opening) => Some(opening),
        Err(opened) if opened == index => None,
        Err(_) => return Ok(()),
    };
    let open = peer.blocks.open_cold_for_peer(object.clone(), index);
    match peer.metadata.get_or_open_aged(object, open, None).await {
        Ok((meta, Source::Fetched | Source::Cached, _))
            if meta.etag != *etag || meta.size != size =>
        {
            Err(WireError::Changed)
        }
        Err((e, false)) => Err(WireError::from(&e)),
        // The block's own fetch asks again, and answers for itself: after a HEAD (which has no
        // error code), or stale metadata served while the upstream fails.
        _ => Ok(()),
    }
}

async fn open(peer: &PeerState, params: &Params) -> Response {
    let (id, index) = match (object(peer, params), number(params, "index")) {
        (Ok(id), Ok(index)) => (id, index),
        (Err(e), _) | (_, Err(e)) => return error(&e),
    };
    // The asker learnt that the object changed that long ago; this replica may not have been
    // told yet. Neither what it holds from before then nor a fetch begun before then answers.
    let mut changed_at = None;
    if let Ok(us) = number(params, "changed_us") {
        let ago = std::time::Duration::from_micros(us);
        peer.metadata.forget_older_than(&id, ago).await;
        changed_at = std::time::Instant::now().checked_sub(ago);
    }
    // As the S3 front does: an object nothing is known of is opened with a GET that brings a
    // block; one known before (or on disk) revalidates with a HEAD.
    let cold = peer.metadata.is_unknown(&id) && !peer.blocks.known_on_disk(&id);
    let opened = if cold {
        // Noted, so that a block request for this block joins it. Already noted: the open
        // under way is joined below, whichever block it brings.
        let _opening = peer.opening.start(&id, index).ok();
        let open = peer.blocks.open_cold_for_peer(id.clone(), index);
        peer.metadata.get_or_open_aged(&id, open, changed_at).await
    } else {
        let head = async { Ok::<_, UpstreamError>(None) };
        peer.metadata.get_or_open_aged(&id, head, changed_at).await
    };
    let (meta, age) = match opened {
        Ok((_, Source::Stale, _)) => return unavailable("the upstream is failing here"),
        Ok((meta, _, age)) => (meta, age),
        // A HEAD's error has no code: let the asker ask S3 and get the real one.
        Err((_, true)) => return unavailable("a HEAD failed"),
        Err((e, false)) => return error(&WireError::from(&e)),
    };
    let Some(slice) = peer.blocks.layout().block(index, meta.size) else {
        let mut response = Response::new(Body::empty());
        *response.status_mut() = StatusCode::NO_CONTENT;
        return response;
    };
    let range = slice.block_start..slice.block_start + slice.block_len;
    let etag = meta.etag.clone();
    let body = peer.blocks.read_for_peer(id, etag, range, meta.size);
    let head = wire::encode_meta(&meta, age);
    let response = stream_after_first(peer, head, body.boxed()).await;
    if response.status() == StatusCode::PRECONDITION_FAILED {
        // Changed between its metadata and its block: the asker starts over on its own.
        return unavailable("the object changed while it was opened");
    }
    response
}

/// `head`, then `body`, once the body's first bytes are in (or its failure, as a status).
async fn stream_after_first(
    peer: &PeerState,
    head: Bytes,
    mut body: stream::BoxStream<'static, Result<Bytes, UpstreamError>>,
) -> Response {
    let first = match body.next().await {
        Some(Ok(first)) => first,
        Some(Err(e)) => return error(&WireError::from(&e)),
        None => Bytes::new(),
    };
    let sent = peer.metrics.clone();
    // Block bytes only, as the asker counts them received: not `head` (an open's metadata).
    let block = stream::iter([Ok(first)]).chain(body).inspect(move |chunk| {
        if let Ok(b) = chunk {
            sent.peer_bytes("sent", b.len() as u64);
        }
    });
    let body = stream::iter([Ok(head)])
        .chain(block)
        .filter(|chunk| futures::future::ready(!matches!(chunk, Ok(b) if b.is_empty())));
    Response::new(Body::from_stream(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_told_part_keeps_only_the_checksums_s3_sends() {
        let params: Params = [
            ("x-amz-checksum-crc32", "AAAAAA=="),
            ("x-amz-checksum-type", "COMPOSITE"),
            ("x-amz-meta-owner", "someone"),
            ("x-amz-checksum-sha256", "bad\nvalue"),
            ("bucket", "b"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let mut told = told_checksums(&params);
        told.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
        assert_eq!(
            told,
            [
                (
                    HeaderName::from_static("x-amz-checksum-crc32"),
                    HeaderValue::from_static("AAAAAA==")
                ),
                (
                    HeaderName::from_static("x-amz-checksum-type"),
                    HeaderValue::from_static("COMPOSITE")
                ),
            ]
        );
    }
}
