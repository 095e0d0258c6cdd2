//! An in-memory origin for unit tests: one object per key, replaceable, served in small chunks,
//! counting requests and the most GET bodies open at once.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::{self, StreamExt};
use parking_lot::Mutex;

use super::{BodyStream, ObjectId, ObjectMeta, Origin, OriginError};

#[derive(Default)]
pub(crate) struct FakeOrigin {
    objects: Mutex<HashMap<String, (Bytes, String)>>,
    pub(crate) heads: AtomicUsize,
    pub(crate) gets: AtomicUsize,
    open_bodies: Arc<AtomicUsize>,
    pub(crate) most_open_bodies: Arc<AtomicUsize>,
    pub(crate) chunk_delay: Duration,
}

impl FakeOrigin {
    pub(crate) fn with_delay(chunk_delay: Duration) -> Self {
        Self {
            chunk_delay,
            ..Self::default()
        }
    }

    /// Store (or replace) `key` with `data` under `etag`.
    pub(crate) fn put(&self, key: &str, data: Bytes, etag: &str) {
        self.objects
            .lock()
            .insert(key.to_owned(), (data, etag.to_owned()));
    }

    fn lookup(&self, object: &ObjectId) -> Result<(Bytes, String), OriginError> {
        self.objects
            .lock()
            .get(object.key.as_ref())
            .cloned()
            .ok_or_else(|| OriginError::Service {
                status: 404,
                code: "NoSuchKey".into(),
                message: "The specified key does not exist.".into(),
            })
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
impl Origin for FakeOrigin {
    async fn head(&self, object: &ObjectId) -> Result<ObjectMeta, OriginError> {
        self.heads.fetch_add(1, Ordering::SeqCst);
        let (data, etag) = self.lookup(object)?;
        Ok(ObjectMeta {
            size: data.len() as u64,
            etag,
            last_modified: None,
            version_id: None,
            headers: vec![],
        })
    }

    async fn get(
        &self,
        object: &ObjectId,
        if_match: Option<&str>,
        range: Option<Range<u64>>,
    ) -> Result<BodyStream, OriginError> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        let (data, etag) = self.lookup(object)?;
        if if_match.is_some_and(|e| e != etag) {
            return Err(OriginError::Changed);
        }
        let r = range.unwrap_or(0..data.len() as u64);
        let body = data.slice(r.start as usize..r.end as usize);
        let chunks: Vec<Bytes> = body.chunks(1000).map(Bytes::copy_from_slice).collect();
        let open = self.open_bodies.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_open_bodies.fetch_max(open, Ordering::SeqCst);
        let guard = Arc::new(OpenBody(self.open_bodies.clone()));
        let delay = self.chunk_delay;
        Ok(stream::iter(chunks)
            .then(move |c| {
                let _held = guard.clone();
                async move {
                    tokio::time::sleep(delay).await;
                    Ok(c)
                }
            })
            .boxed())
    }
}
