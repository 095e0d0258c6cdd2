//! Pieces: a GET of a range of a known version (`If-Match`) sent as several ranged GETs at
//! once, their bodies handed on in order, as a layer around the upstream ([`Pieces`]).
//!
//! S3 serves one connection at roughly 80-100 MB/s, so an 8 MiB block takes about 90 ms to
//! arrive however close the cache is; four 2 MiB GETs at once bring it in a quarter of that.
//! The price is requests: each block fetched from the upstream costs up to `pieces` GETs
//! instead of one, which is why it is off unless `upstream_fetch_pieces` says otherwise.
//!
//! The first piece's body is handed on as it arrives; each later one is read at once, in a
//! task of its own, into memory (at most its own length: all of them together are at most the
//! range, the block the fetch already holds room for) and handed on when the reader gets to
//! it. Every piece is pinned to the same ETag, so the pieces cannot mix versions. The layer
//! sits above the resuming one: a piece that breaks is resumed from its byte on its own,
//! leaving the others be; one that fails for good hands on the bytes it got, then the error,
//! and nothing after it. Dropping the body cancels the pieces still running. The GET of an
//! object nothing is known of (`get_with_meta`) asks for its first piece alone: the other
//! pieces follow a round trip later, pinned to the ETag (and clipped to the size) that answer
//! names.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::{self, StreamExt};

use super::Upstream;
use crate::model::{
    BodyStream, ByteRange, ObjectId, ObjectMeta, PartNumber, PartSpan, UpstreamError,
};

/// Pieces are at least this long: below it, a GET's round trip costs more than its bytes.
const MIN_PIECE: u64 = 1 << 20;
/// Piece boundaries fall on multiples of this, as block boundaries do.
const PIECE_ALIGN: u64 = 64 << 10;

/// The layer: `inner`'s pinned, ranged GETs split into up to `pieces` GETs sent at once.
pub struct Pieces {
    inner: Arc<dyn Upstream>,
    pieces: u64,
}

impl Pieces {
    /// `inner`, splitting each pinned range into up to `pieces` (1: never).
    pub fn new(inner: Arc<dyn Upstream>, pieces: u32) -> Self {
        Self {
            inner,
            pieces: u64::from(pieces.max(1)),
        }
    }

    /// `range` cut into pieces of at least [`MIN_PIECE`], at most `pieces` of them.
    fn split(&self, range: &Range<u64>) -> Vec<Range<u64>> {
        let len = range.end - range.start;
        let n = (len / MIN_PIECE).clamp(1, self.pieces);
        let step = len.div_ceil(n).next_multiple_of(PIECE_ALIGN);
        (range.start..range.end)
            .step_by(step as usize)
            .map(|start| start..(start + step).min(range.end))
            .collect()
    }

    /// Start reading each of `pieces` (pinned to `etag`), each in a task of its own.
    fn start(
        &self,
        object: &ObjectId,
        etag: &str,
        pieces: &[Range<u64>],
    ) -> VecDeque<AbortOnDrop<Read>> {
        pieces
            .iter()
            .map(|piece| {
                let task = read_piece(
                    self.inner.clone(),
                    object.clone(),
                    etag.to_owned(),
                    piece.clone(),
                );
                AbortOnDrop(tokio::spawn(task))
            })
            .collect()
    }
}

/// A later piece's bytes as they were read, and the error that ended it early, if one did.
type Read = (Vec<Bytes>, Option<UpstreamError>);

/// Read all of `piece` (pinned to `etag`) into memory: at most its length is kept.
async fn read_piece(
    inner: Arc<dyn Upstream>,
    object: ObjectId,
    etag: String,
    piece: Range<u64>,
) -> Read {
    let expected = piece.end - piece.start;
    let mut body = match inner.get(&object, Some(&etag), Some(piece)).await {
        Ok(body) => body,
        Err(e) => return (Vec::new(), Some(e)),
    };
    let (mut chunks, mut got) = (Vec::new(), 0u64);
    while let Some(chunk) = body.next().await {
        match chunk {
            Ok(chunk) if got + chunk.len() as u64 > expected => {
                return (
                    chunks,
                    Some(UpstreamError::BodyLength {
                        got: got + chunk.len() as u64,
                        expected,
                    }),
                );
            }
            Ok(chunk) => {
                got += chunk.len() as u64;
                chunks.push(chunk);
            }
            Err(e) => return (chunks, Some(e)),
        }
    }
    let short = (got < expected).then_some(UpstreamError::BodyLength { got, expected });
    (chunks, short)
}

/// A task aborted when its handle is dropped: a body dropped half-way stops its pieces.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The body handed on: the first piece as it arrives, then each later one in turn.
struct Body {
    head: Option<BodyStream>,
    head_got: u64,
    head_len: u64,
    later: VecDeque<AbortOnDrop<Read>>,
    /// The piece being handed on (its chunks, then its error if it had one).
    ready: VecDeque<Result<Bytes, UpstreamError>>,
    /// An error was handed on: nothing follows it.
    ended: bool,
}

impl Body {
    /// `head` (the first piece, `head_len` bytes) handed on as it arrives, then `later`'s.
    fn stream(head: BodyStream, head_len: u64, later: VecDeque<AbortOnDrop<Read>>) -> BodyStream {
        let state = Body {
            head: Some(head),
            head_got: 0,
            head_len,
            later,
            ready: VecDeque::new(),
            ended: false,
        };
        stream::unfold(state, |mut state| async move {
            let item = state.next_item().await?;
            Some((item, state))
        })
        .boxed()
    }

    async fn next_item(&mut self) -> Option<Result<Bytes, UpstreamError>> {
        loop {
            if self.ended {
                return None;
            }
            if let Some(item) = self.ready.pop_front() {
                self.ended = item.is_err();
                return Some(item);
            }
            if let Some(head) = self.head.as_mut() {
                let item = match head.next().await {
                    Some(Ok(chunk)) => {
                        self.head_got += chunk.len() as u64;
                        if self.head_got > self.head_len {
                            Err(self.head_length())
                        } else {
                            Ok(chunk)
                        }
                    }
                    Some(Err(e)) => Err(e),
                    // The first piece must end where the next begins: short is an error, not
                    // a gap in the body.
                    None if self.head_got < self.head_len => Err(self.head_length()),
                    None => {
                        self.head = None;
                        continue;
                    }
                };
                self.ended = item.is_err();
                return Some(item);
            }
            let mut task = self.later.pop_front()?;
            let (chunks, error) = match (&mut task.0).await {
                Ok(read) => read,
                Err(e) => (Vec::new(), Some(UpstreamError::Transport(e.to_string()))),
            };
            self.ready = chunks.into_iter().map(Ok).chain(error.map(Err)).collect();
        }
    }

    fn head_length(&self) -> UpstreamError {
        UpstreamError::BodyLength {
            got: self.head_got,
            expected: self.head_len,
        }
    }
}

#[async_trait::async_trait]
impl Upstream for Pieces {
    async fn head(&self, object: &ObjectId) -> Result<ObjectMeta, UpstreamError> {
        self.inner.head(object).await
    }

    async fn get(
        &self,
        object: &ObjectId,
        if_match: Option<&str>,
        range: Option<Range<u64>>,
    ) -> Result<BodyStream, UpstreamError> {
        // Without a version to pin, pieces could come from two versions; without a range,
        // there is nothing to cut.
        let (Some(etag), Some(whole)) = (if_match, range.clone()) else {
            return self.inner.get(object, if_match, range).await;
        };
        let pieces = self.split(&whole);
        let Some((first, later)) = pieces.split_first().filter(|(_, l)| !l.is_empty()) else {
            return self.inner.get(object, if_match, range).await;
        };
        // Every piece is asked for at once; the answer waits only for the first one's.
        let later = self.start(object, etag, later);
        let head = self
            .inner
            .get(object, if_match, Some(first.clone()))
            .await?;
        Ok(Body::stream(head, first.end - first.start, later))
    }

    /// The first piece of an object nothing is known of is asked for alone; its answer names
    /// the version and the size, and the other pieces follow, pinned to it, a round trip later.
    async fn get_with_meta(
        &self,
        object: &ObjectId,
        span: ByteRange,
    ) -> Result<Option<(ObjectMeta, BodyStream)>, UpstreamError> {
        // Only a closed range can be cut before the size is known.
        let ByteRange::FromTo {
            first,
            last: Some(last),
        } = span
        else {
            return self.inner.get_with_meta(object, span).await;
        };
        let pieces = self.split(&(first..last.saturating_add(1)));
        if pieces.len() < 2 {
            return self.inner.get_with_meta(object, span).await;
        }
        let head_span = ByteRange::FromTo {
            first,
            last: Some(pieces[0].end - 1),
        };
        let Some((meta, head)) = self.inner.get_with_meta(object, head_span).await? else {
            return Ok(None);
        };
        if meta.etag.is_empty() {
            // Nothing to pin the other pieces to: the whole span in one GET after all.
            drop(head);
            return self.inner.get_with_meta(object, span).await;
        }
        let end = span.within(meta.size).end;
        let later: Vec<Range<u64>> = pieces[1..]
            .iter()
            .filter(|p| p.start < end)
            .map(|p| p.start..p.end.min(end))
            .collect();
        let later = self.start(object, &meta.etag, &later);
        let head_len = pieces[0].end.min(end).saturating_sub(first);
        Ok(Some((meta, Body::stream(head, head_len, later))))
    }

    async fn get_part(
        &self,
        object: &ObjectId,
        part: PartNumber,
    ) -> Result<Option<(ObjectMeta, PartSpan, BodyStream)>, UpstreamError> {
        // Where the part lies is known only from the answer: one GET.
        self.inner.get_part(object, part).await
    }

    async fn list(
        &self,
        bucket: &str,
        prefix: &str,
        token: Option<String>,
    ) -> Result<(Vec<(String, u64)>, Option<String>), UpstreamError> {
        self.inner.list(bucket, prefix, token).await
    }

    fn retries(&self) -> u64 {
        self.inner.retries()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::metrics::Metrics;
    use crate::upstream::memory::fixtures::{collect, data, object};
    use crate::upstream::memory::MemoryUpstream;
    use crate::upstream::resume::{ResumePolicy, Resuming};
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    const MIB: usize = 1 << 20;

    #[test]
    fn pieces_are_at_least_a_mebibyte_aligned_and_cover_the_range() {
        let up = Pieces::new(Arc::new(MemoryUpstream::default()), 4);
        let cut = |r: Range<u64>| up.split(&r);
        let m = MIB as u64;
        assert_eq!(
            cut(0..8 * m),
            vec![0..2 * m, 2 * m..4 * m, 4 * m..6 * m, 6 * m..8 * m]
        );
        assert_eq!(
            cut(8 * m..11 * m),
            vec![8 * m..9 * m, 9 * m..10 * m, 10 * m..11 * m]
        );
        assert_eq!(
            cut(0..m + 5),
            vec![0..m + 5],
            "two pieces would be under 1 MiB"
        );
        for r in [0..8 * m - 1, 3..5 * m + 7, 0..32 * m] {
            let pieces = cut(r.clone());
            assert!(pieces.len() <= 4);
            assert_eq!(pieces[0].start, r.start);
            assert_eq!(pieces.last().unwrap().end, r.end);
            assert!(pieces.windows(2).all(|w| w[0].end == w[1].start));
            assert!(pieces[1..]
                .iter()
                .all(|p| (p.start - r.start) % PIECE_ALIGN == 0));
        }
    }

    #[tokio::test]
    async fn a_pinned_range_is_fetched_in_pieces_at_once_and_handed_on_in_order() {
        let origin = Arc::new(MemoryUpstream::with_delay(Duration::from_micros(50)));
        origin.put("k", data(10 * MIB), "\"e1\"");
        let up = Pieces::new(origin.clone(), 4);
        let body = up
            .get(&object(), Some("\"e1\""), Some(MIB as u64..9 * MIB as u64))
            .await
            .unwrap();
        assert_eq!(collect(body).await.unwrap(), &data(10 * MIB)[MIB..9 * MIB]);
        assert_eq!(origin.gets.load(Ordering::SeqCst), 4);
        assert_eq!(
            origin.most_open_bodies.load(Ordering::SeqCst),
            4,
            "all at once"
        );

        // Unpinned, or too short to cut: one GET.
        for (etag, range) in [(None, 0..8 * MIB as u64), (Some("\"e1\""), 0..MIB as u64)] {
            let before = origin.gets.load(Ordering::SeqCst);
            let body = up.get(&object(), etag, Some(range.clone())).await.unwrap();
            let want = &data(10 * MIB)[range.start as usize..range.end as usize];
            assert_eq!(collect(body).await.unwrap(), want);
            assert_eq!(origin.gets.load(Ordering::SeqCst), before + 1);
        }
    }

    #[tokio::test]
    async fn a_cold_span_sends_its_first_piece_then_the_rest_pinned_to_the_answer() {
        let origin = Arc::new(MemoryUpstream::default());
        origin.put("k", data(5 * MIB + 7), "\"e1\"");
        let up = Pieces::new(origin.clone(), 4);
        // An 8 MiB span of a 5 MiB object: cut as if 8 MiB, clipped once the size is known.
        let span = ByteRange::FromTo {
            first: 0,
            last: Some(8 * MIB as u64 - 1),
        };
        let (meta, body) = up.get_with_meta(&object(), span).await.unwrap().unwrap();
        assert_eq!((meta.size, &*meta.etag), (5 * MIB as u64 + 7, "\"e1\""));
        assert_eq!(collect(body).await.unwrap(), &data(5 * MIB + 7)[..]);
        assert_eq!(
            origin.gets.load(Ordering::SeqCst),
            3,
            "pieces at 0, 2 and 4 MiB"
        );

        // An open span (a whole object) is sent whole.
        let open = ByteRange::FromTo {
            first: 0,
            last: None,
        };
        let (_, body) = up.get_with_meta(&object(), open).await.unwrap().unwrap();
        assert_eq!(collect(body).await.unwrap().len(), 5 * MIB + 7);
        assert_eq!(origin.gets.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn a_piece_of_another_version_fails_the_body_and_a_broken_one_is_resumed() {
        let origin = Arc::new(MemoryUpstream::default());
        origin.put("k", data(8 * MIB), "\"e1\"");
        // Every piece is pinned: asked for a version that is gone, the body fails.
        let up = Pieces::new(origin.clone(), 4);
        let stale = up
            .get(&object(), Some("\"e0\""), Some(0..8 * MIB as u64))
            .await;
        assert!(
            matches!(stale, Err(UpstreamError::Changed)),
            "{:?}",
            stale.err()
        );

        // One body breaks part-way (whichever piece it is): that piece alone is resumed from
        // the byte where it broke (the resuming layer sits below), and the body is exact.
        let metrics = Arc::new(Metrics::default());
        let policy = ResumePolicy {
            max_resumes: 3,
            idle_timeout: Duration::from_secs(5),
        };
        let up = Pieces::new(Arc::new(Resuming::new(origin.clone(), policy, metrics)), 4);
        origin.break_at.store(300_000, Ordering::SeqCst);
        origin.breaks_left.store(1, Ordering::SeqCst);
        let before = origin.gets.load(Ordering::SeqCst);
        let body = up
            .get(&object(), Some("\"e1\""), Some(0..8 * MIB as u64))
            .await
            .unwrap();
        assert_eq!(collect(body).await.unwrap(), &data(8 * MIB)[..]);
        let gets = origin.gets.load(Ordering::SeqCst) - before;
        assert_eq!(
            gets, 5,
            "4 pieces and 1 resume, not the pieces after it again"
        );
    }
}
