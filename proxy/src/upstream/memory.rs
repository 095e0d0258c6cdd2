//! An upstream held in memory, for tests of any size: the unit tests, the in-process
//! integration tests under `tests/`, and the conformance suite that holds it and the real S3
//! client to the same behaviour. One namespace of keys (the bucket is not looked at), each
//! object replaceable, bodies served in 1,000-byte chunks; it counts requests and the most GET
//! bodies open at once, and can be told to fail (an outage, bodies that break part-way).

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::{self, StreamExt};
use parking_lot::Mutex;

use super::Upstream;
use crate::model::{
    BodyStream, ByteRange, ObjectId, ObjectMeta, PartNumber, PartSpan, UpstreamError,
};

/// The in-memory upstream. Its counters and fault switches are public for tests to read and set.
#[derive(Default)]
pub struct MemoryUpstream {
    objects: Mutex<HashMap<String, (Bytes, String)>>,
    pub heads: AtomicUsize,
    pub gets: AtomicUsize,
    open_bodies: Arc<AtomicUsize>,
    pub most_open_bodies: Arc<AtomicUsize>,
    pub chunk_delay: Duration,
    /// How long each GET takes to answer, as a distant upstream's round trip.
    pub round_trip: Duration,
    /// While set, every request fails with 503.
    pub outage: AtomicBool,
    /// The next this many bodies break (a transport error) after `break_at` bytes.
    pub breaks_left: AtomicUsize,
    pub break_at: AtomicUsize,
    /// Every object's parts, for `partNumber` reads: as if uploaded in parts of this many
    /// bytes (the last shorter); `0`, uploaded whole (one part).
    pub part_size: u64,
}

impl MemoryUpstream {
    pub fn with_delay(chunk_delay: Duration) -> Self {
        Self {
            chunk_delay,
            ..Self::default()
        }
    }

    /// This upstream, each of its GETs answering `round_trip` after it is asked.
    pub fn with_round_trip(self, round_trip: Duration) -> Self {
        Self { round_trip, ..self }
    }

    /// This upstream, its objects read by `partNumber` as if uploaded in parts of `part_size`
    /// bytes.
    pub fn with_parts(self, part_size: u64) -> Self {
        Self { part_size, ..self }
    }

    /// Store (or replace) `key` with `data` under `etag`.
    pub fn put(&self, key: &str, data: Bytes, etag: &str) {
        self.objects
            .lock()
            .insert(key.to_owned(), (data, etag.to_owned()));
    }

    /// Delete `key`.
    pub fn delete(&self, key: &str) {
        self.objects.lock().remove(key);
    }

    fn lookup(&self, object: &ObjectId) -> Result<(Bytes, String), UpstreamError> {
        if self.outage.load(Ordering::SeqCst) {
            return Err(UpstreamError::Service {
                status: 503,
                code: "ServiceUnavailable".into(),
                message: "outage".into(),
            });
        }
        self.objects
            .lock()
            .get(object.key.as_ref())
            .cloned()
            .ok_or_else(|| UpstreamError::Service {
                status: 404,
                code: "NoSuchKey".into(),
                message: "The specified key does not exist.".into(),
            })
    }
}

/// What this upstream says of an object of `size` bytes at `etag`.
fn meta(size: u64, etag: &str) -> ObjectMeta {
    ObjectMeta {
        size,
        etag: etag.into(),
        last_modified: None,
        version_id: None,
        headers: vec![],
        checksums: vec![],
        checksums_known: false,
        response_headers: Default::default(),
    }
}

/// Counts a body as open until the stream carrying it is dropped.
struct OpenBody(Arc<AtomicUsize>);

impl Drop for OpenBody {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[async_trait::async_trait]
impl Upstream for MemoryUpstream {
    async fn head(&self, object: &ObjectId) -> Result<ObjectMeta, UpstreamError> {
        self.heads.fetch_add(1, Ordering::SeqCst);
        let (data, etag) = self.lookup(object)?;
        let mut meta = meta(data.len() as u64, &etag);
        // As S3's: a HEAD asks for the checksums (this upstream stores none).
        meta.checksums_known = true;
        Ok(meta)
    }

    async fn get_with_meta(
        &self,
        object: &ObjectId,
        span: ByteRange,
    ) -> Result<Option<(ObjectMeta, BodyStream)>, UpstreamError> {
        let (data, etag) = self.lookup(object)?;
        let size = data.len() as u64;
        let within = span.within(size);
        if within.is_empty() {
            self.gets.fetch_add(1, Ordering::SeqCst);
            return Ok(None);
        }
        let body = self.get(object, None, Some(within)).await?;
        Ok(Some((meta(size, &etag), body)))
    }

    async fn get_part(
        &self,
        object: &ObjectId,
        part: PartNumber,
    ) -> Result<Option<(ObjectMeta, PartSpan, BodyStream)>, UpstreamError> {
        let (data, etag) = self.lookup(object)?;
        let size = data.len() as u64;
        let len = if self.part_size == 0 {
            size
        } else {
            self.part_size
        };
        let first = u64::from(part.get() - 1).saturating_mul(len);
        if first >= size {
            self.gets.fetch_add(1, Ordering::SeqCst);
            return Err(UpstreamError::Service {
                status: 416,
                code: "InvalidPartNumber".into(),
                message: "The requested partnumber is not satisfiable".into(),
            });
        }
        let bytes = first..first.saturating_add(len).min(size);
        let body = self.get(object, None, Some(bytes.clone())).await?;
        let span = PartSpan {
            etag: etag.as_str().into(),
            size,
            bytes,
            parts_count: (self.part_size > 0).then(|| size.div_ceil(len) as u32),
            checksums: vec![],
        };
        Ok(Some((meta(size, &etag), span, body)))
    }

    async fn list(
        &self,
        _bucket: &str,
        prefix: &str,
        token: Option<String>,
    ) -> Result<(Vec<(String, u64)>, Option<String>), UpstreamError> {
        // Pages of two keys, so paging is exercised.
        let mut keys: Vec<(String, u64)> = self
            .objects
            .lock()
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(k, (d, _))| (k.clone(), d.len() as u64))
            .collect();
        keys.sort();
        let start = token.map_or(0, |t| t.parse().unwrap_or(0));
        let page: Vec<_> = keys.iter().skip(start).take(2).cloned().collect();
        let next = (start + 2 < keys.len()).then(|| (start + 2).to_string());
        Ok((page, next))
    }

    async fn get(
        &self,
        object: &ObjectId,
        if_match: Option<&str>,
        range: Option<Range<u64>>,
    ) -> Result<BodyStream, UpstreamError> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        if !self.round_trip.is_zero() {
            tokio::time::sleep(self.round_trip).await;
        }
        let (data, etag) = self.lookup(object)?;
        if if_match.is_some_and(|e| e != etag) {
            return Err(UpstreamError::Changed);
        }
        let r = range.unwrap_or(0..data.len() as u64);
        let mut body = data.slice(r.start as usize..r.end as usize);
        let broken = self
            .breaks_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if broken {
            body = body.slice(..self.break_at.load(Ordering::SeqCst).min(body.len()));
        }
        let mut chunks: Vec<Result<Bytes, UpstreamError>> = body
            .chunks(1000)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        if broken {
            chunks.push(Err(UpstreamError::Transport("connection reset".into())));
        }
        let open = self.open_bodies.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_open_bodies.fetch_max(open, Ordering::SeqCst);
        let guard = Arc::new(OpenBody(self.open_bodies.clone()));
        let delay = self.chunk_delay;
        Ok(stream::iter(chunks)
            .then(move |c| {
                let _held = guard.clone();
                async move {
                    tokio::time::sleep(delay).await;
                    c
                }
            })
            .boxed())
    }
}

/// What the unit tests of the upstream's layers share: an object, its bytes, a body read whole.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;

    /// `len` bytes of a repeating pattern, so a byte out of place shows.
    pub(crate) fn data(len: usize) -> Bytes {
        (0..len).map(|i| (i % 251) as u8).collect::<Vec<_>>().into()
    }

    /// All of `body`, or its first error.
    pub(crate) async fn collect(body: BodyStream) -> Result<Vec<u8>, UpstreamError> {
        let mut out = Vec::new();
        futures::pin_mut!(body);
        while let Some(chunk) = body.next().await {
            out.extend_from_slice(&chunk?);
        }
        Ok(out)
    }

    /// Key `k` (the memory upstream ignores the bucket).
    pub(crate) fn object() -> ObjectId {
        ObjectId {
            bucket: "b".into(),
            key: "k".into(),
            version_id: None,
        }
    }
}
