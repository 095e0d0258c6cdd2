//! How far a cold read's first GET runs past its first block, and the body it runs in.
//!
//! A read of an object nothing is known of, to its end (no `Range`, or `bytes=N-`), learns the
//! object's size only from its first GET's answer, a round trip in. Only then are the further
//! blocks asked for, and their bytes start a round trip after that. Where one connection
//! carries more than a block per round trip (an upstream near the cache: MinIO or Ceph on the
//! same network), the first GET's own connection would have brought the next blocks sooner: it
//! is already streaming. So that GET asks for as many blocks past its first as its connection
//! is expected to bring within one round trip, judged by the round trip and the per-connection
//! rate measured on earlier cold GETs ([`Pace`]), and those blocks are filled from its body in
//! turn ([`Carve`]). Where a connection brings less than a block per round trip (S3, at about
//! 90 MB/s per connection, for 8 MiB blocks), that is none: every further block has a GET of
//! its own, all sent at once, as before. An object smaller than the GET asks is simply all of
//! it (a range past an object's end is cut to it), so asking more costs nothing there.
//!
//! That rule assumes the further GETs each bring what one connection does. Where the upstream
//! was seen to bring less with several bodies at once than that ([`super::gain`]), the run goes
//! further: past the blocks a round trip brings, a block gets a GET of its own only if the
//! rest would come sooner that way, and where parallel GETs gained nothing, never.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::stream::{Stream, StreamExt};
use parking_lot::Mutex;

use super::gain::Gain;
use crate::model::{BodyStream, UpstreamError};

/// Blocks shorter than this do not measure a connection's rate: their bytes arrive in a few
/// packets, and the time between those says little.
const MEASURED_FROM: u64 = 1 << 20;

/// Below this gain ([`Gain`]), parallel GETs are taken to bring nothing more than one: a
/// tenth more is within what one run of the same upstream measures apart from the next.
const NO_GAIN: f64 = 1.1;

/// The round trip and per-connection rate of the upstream, as cold GETs found them: moving
/// averages (each new measurement weighs a quarter), 0 until measured; and what it gains from
/// several bodies at once.
#[derive(Default)]
pub(super) struct Pace {
    /// From sending a cold GET to its answer's headers, in microseconds.
    round_trip_us: AtomicU64,
    /// Bytes per second one connection brought a cold GET's first block at, once it started.
    rate: AtomicU64,
    /// Every upstream body a block fetch reads is counted here.
    pub(super) gain: Gain,
}

/// A moving average that falls at once: a lower sample replaces it, a higher one weighs a
/// quarter. Both estimates err low, toward no run (what S3 gets): a run planned on a rate the
/// connection no longer has holds its blocks back, where a run too short costs a round trip.
fn average(into: &AtomicU64, sample: u64) {
    // Racing updates may lose one sample; an estimate does not need them all.
    let old = into.load(Ordering::Relaxed);
    let new = if old == 0 || sample < old {
        sample
    } else {
        old - old / 4 + sample / 4
    };
    into.store(new.max(1), Ordering::Relaxed);
}

impl Pace {
    /// A cold GET answered (headers) `took` after it was sent.
    pub(super) fn answered(&self, took: Duration) {
        average(&self.round_trip_us, took.as_micros() as u64);
    }

    /// A cold GET's connection brought `bytes` in `took`, after its first bytes.
    fn streamed(&self, bytes: u64, took: Duration) {
        let secs = took.as_secs_f64();
        if secs > 0.0 {
            average(&self.rate, (bytes as f64 / secs) as u64);
        }
    }

    /// Whether a run whose first block came at `rate` bytes a second goes on for `remaining`
    /// more blocks of `block_size`: only if they would come within twice the [`Pace::horizon`]
    /// (two round trips where parallel GETs gain fully). A run planned on a rate the
    /// connection turned out not to have (the upstream got slower, or caps each connection as
    /// S3 does) stops after the block following its first (whose bytes are already on their
    /// way), and the rest are asked for at once, each with a GET of its own.
    pub(super) fn keeps(&self, rate: Option<f64>, remaining: u64, block_size: u64) -> bool {
        let Some(rate) = rate else {
            return true;
        };
        (remaining * block_size) as f64 <= 2.0 * self.horizon(rate) * rate
    }

    /// Blocks of `block_size` past its first that a cold GET's connection is expected to bring
    /// within the [`Pace::horizon`]: at most `most`, and none until a round trip and a rate
    /// were measured.
    pub(super) fn blocks_past(&self, block_size: u64, most: u64) -> u64 {
        let rate = self.rate.load(Ordering::Relaxed) as f64;
        if rate == 0.0 {
            return 0;
        }
        // An infinite horizon saturates to `u64::MAX`.
        ((self.horizon(rate) * rate / block_size as f64) as u64).min(most)
    }

    /// Seconds of a connection's bytes that a run brings as soon as GETs of their own would.
    /// The rest `R` of a run at `r` bytes a second is whole after `R / r`; asked of parallel
    /// GETs when the run's answer came, it is whole a round trip later plus `R / (g r)`, where
    /// `g` is what several bodies bring over one ([`Gain`]). Those GETs are sooner only for
    /// `R / r` past `round trip × g / (g − 1)`: one round trip where they gain fully (and
    /// while `g` is not known for a connection at `rate`, as on S3), and never where they
    /// gain nothing.
    fn horizon(&self, rate: f64) -> f64 {
        let round_trip = self.round_trip_us.load(Ordering::Relaxed) as f64 / 1e6;
        match self.gain.gain_for(rate) {
            Some(g) if g < NO_GAIN => f64::INFINITY,
            Some(g) => round_trip * g / (g - 1.0),
            None => round_trip,
        }
    }

    #[cfg(test)]
    pub(super) fn measured(&self) -> (Duration, u64) {
        let round_trip = Duration::from_micros(self.round_trip_us.load(Ordering::Relaxed));
        (round_trip, self.rate.load(Ordering::Relaxed))
    }

    #[cfg(test)]
    pub(super) fn set(&self, round_trip: Duration, rate: u64) {
        self.round_trip_us
            .store(round_trip.as_micros() as u64, Ordering::Relaxed);
        self.rate.store(rate, Ordering::Relaxed);
    }
}

/// One GET's body cut into consecutive blocks, each a body of its own ([`Carve::next`]), read
/// one after another: the bytes of a chunk that straddles two blocks go to each.
pub(super) struct Carve {
    shared: Arc<Mutex<Carving>>,
}

struct Carving {
    body: BodyStream,
    /// Bytes of the last chunk past the block it came in.
    left: Option<Bytes>,
    /// Bytes still owed to the block being read.
    owed: u64,
    /// Bytes of the body not yet read from it.
    unread: u64,
    /// The body failed or ended early: nothing more can come of it.
    broken: bool,
    /// The body was seen to end after its last byte.
    ended: bool,
    /// The first block's length, when its first bytes came (and how many), and once it was
    /// whole, what it measured.
    first_len: Option<u64>,
    first_bytes: Option<(Instant, usize)>,
    first_done: bool,
    measured: Option<(u64, Duration)>,
}

impl Carve {
    /// `body`, of `len` bytes.
    pub(super) fn new(body: BodyStream, len: u64) -> Self {
        Self {
            shared: Arc::new(Mutex::new(Carving {
                body,
                left: None,
                owed: 0,
                unread: len,
                broken: false,
                ended: false,
                first_len: None,
                first_bytes: None,
                first_done: false,
                measured: None,
            })),
        }
    }

    /// The body of the next `len` bytes. The one before it must have been read to its end
    /// ([`Carve::whole`]).
    pub(super) fn next(&self, len: u64) -> BodyStream {
        let mut c = self.shared.lock();
        c.owed = len;
        c.first_len.get_or_insert(len);
        Piece {
            shared: self.shared.clone(),
        }
        .boxed()
    }

    /// Whether the last body handed out was read to its end, so the next can follow.
    pub(super) fn whole(&self) -> bool {
        let c = self.shared.lock();
        !c.broken && c.owed == 0
    }

    /// Tell `pace` the rate the first block came at, if it was long enough to say; that rate,
    /// in bytes a second.
    pub(super) fn measure(&self, pace: &Pace) -> Option<f64> {
        let c = self.shared.lock();
        let (bytes, took) = c.measured?;
        pace.streamed(bytes, took);
        let secs = took.as_secs_f64();
        (secs > 0.0).then(|| bytes as f64 / secs)
    }
}

struct Piece {
    shared: Arc<Mutex<Carving>>,
}

impl Stream for Piece {
    type Item = Result<Bytes, UpstreamError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        // Only one piece is read at a time: the lock is never contended.
        let mut c = self.shared.lock();
        if c.broken || c.ended {
            return Poll::Ready(None);
        }
        if c.owed == 0 {
            if c.unread > 0 || c.left.is_some() {
                return Poll::Ready(None);
            }
            // Every byte of the body was handed out: see it end, as a body read alone is, so
            // its connection goes back to the pool. More bytes than asked are handed on for
            // the block's fetch to refuse; an error after the last byte loses nothing.
            return match c.body.poll_next_unpin(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(end) => {
                    c.ended = true;
                    Poll::Ready(end)
                }
            };
        }
        let chunk = match c.left.take() {
            Some(left) => left,
            None => match c.body.poll_next_unpin(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(chunk))) => {
                    c.unread = c.unread.saturating_sub(chunk.len() as u64);
                    chunk
                }
                Poll::Ready(Some(Err(e))) => {
                    c.broken = true;
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => {
                    // Ended short: the block's fetch sees its length wrong and says so.
                    c.broken = true;
                    return Poll::Ready(None);
                }
            },
        };
        let now = Instant::now();
        let first = *c.first_bytes.get_or_insert((now, chunk.len()));
        let mut chunk = chunk;
        if chunk.len() as u64 > c.owed {
            c.left = Some(chunk.split_off(c.owed as usize));
        }
        c.owed -= chunk.len() as u64;
        if c.owed == 0 && !c.first_done {
            // The first block is whole: its bytes after the first chunk, over the time they took
            // (when most of them came after it: else there is no time to measure).
            c.first_done = true;
            let len = c.first_len.unwrap_or(0);
            if len >= MEASURED_FROM && first.1 as u64 <= len / 2 {
                c.measured = Some((len.saturating_sub(first.1 as u64), now - first.0));
            }
        }
        Poll::Ready(Some(Ok(chunk)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::stream;

    fn body(chunks: &[&'static [u8]]) -> BodyStream {
        let chunks: Vec<_> = chunks.iter().map(|c| Ok(Bytes::from_static(c))).collect();
        stream::iter(chunks).boxed()
    }

    async fn all(body: BodyStream) -> Vec<u8> {
        let chunks: Vec<_> = body.collect().await;
        chunks
            .into_iter()
            .flat_map(|c| c.unwrap().to_vec())
            .collect()
    }

    #[tokio::test]
    async fn a_body_is_cut_into_blocks_across_its_chunks() {
        // The body's last chunk read with the first block, most of it still to hand out.
        let carve = Carve::new(body(&[b"abcdefghij"]), 10);
        assert_eq!(all(carve.next(4)).await, b"abcd");
        assert!(carve.whole());
        assert_eq!(all(carve.next(6)).await, b"efghij");
        assert!(carve.whole());

        let carve = Carve::new(body(&[b"abc", b"defgh", b"ij"]), 10);
        assert_eq!(all(carve.next(4)).await, b"abcd");
        assert!(carve.whole());
        assert_eq!(all(carve.next(4)).await, b"efgh");
        assert!(carve.whole());
        assert_eq!(all(carve.next(2)).await, b"ij");
        assert!(carve.whole());
        // Asked past its end: what there is, and the carve says it is broken.
        let carve = Carve::new(body(&[b"abc"]), 4);
        assert_eq!(all(carve.next(4)).await, b"abc");
        assert!(!carve.whole());
    }

    #[tokio::test]
    async fn a_block_left_part_read_or_failed_stops_the_carve() {
        let carve = Carve::new(body(&[b"abcdef", b"gh"]), 8);
        let mut first = carve.next(4);
        assert_eq!(first.next().await.unwrap().unwrap(), "abcd");
        drop(first);
        assert!(carve.whole());
        let mut second = carve.next(4);
        assert_eq!(second.next().await.unwrap().unwrap(), "ef");
        drop(second);
        assert!(!carve.whole(), "half a block read");

        let failing = stream::iter([
            Ok(Bytes::from_static(b"ab")),
            Err(UpstreamError::Transport("reset".into())),
        ])
        .boxed();
        let carve = Carve::new(failing, 4);
        let got: Vec<_> = carve.next(4).collect().await;
        assert!(got[1].is_err());
        assert!(!carve.whole());
    }

    #[test]
    fn blocks_past_are_what_a_connection_brings_in_a_round_trip() {
        let pace = Pace::default();
        assert_eq!(pace.blocks_past(8 << 20, 7), 0, "nothing measured");
        // S3-like: 90 MB/s per connection, 30 ms: 2.7 MB per round trip, less than a block.
        pace.set(Duration::from_millis(30), 90_000_000);
        assert_eq!(pace.blocks_past(8 << 20, 7), 0);
        // Near: 1.2 GB/s, 30 ms: 36 MB, four 8 MiB blocks.
        pace.set(Duration::from_millis(30), 1_200_000_000);
        assert_eq!(pace.blocks_past(8 << 20, 7), 4);
        assert_eq!(pace.blocks_past(8 << 20, 2), 2, "at most `most`");
        // A lower measurement replaces the estimate; a higher one weighs a quarter.
        pace.answered(Duration::from_millis(10));
        assert_eq!(pace.round_trip_us.load(Ordering::Relaxed), 10_000);
        pace.answered(Duration::from_millis(30));
        assert_eq!(pace.round_trip_us.load(Ordering::Relaxed), 15_000);
    }

    #[test]
    fn a_run_stops_when_its_first_block_came_at_under_half_the_rate_it_was_planned_on() {
        let pace = Pace::default();
        // Planned at 1.2 GB/s and 30 ms: four blocks past the first.
        pace.set(Duration::from_millis(30), 1_200_000_000);
        let block = 8 << 20;
        assert!(pace.keeps(Some(1_200_000_000.0), 4, block));
        assert!(
            pace.keeps(Some(600_000_000.0), 4, block),
            "half the rate: within two round trips"
        );
        assert!(
            !pace.keeps(Some(90_000_000.0), 4, block),
            "S3's 90 MB/s: the rest at once"
        );
        assert!(pace.keeps(None, 4, block), "nothing measured: as planned");
    }

    #[test]
    fn runs_go_further_where_parallel_gets_gain_less() {
        let pace = Pace::default();
        let block = 8 << 20;
        // 30 ms and 600 MB/s: 18 MB per round trip, two 8 MiB blocks.
        pace.set(Duration::from_millis(30), 600_000_000);
        assert_eq!(pace.blocks_past(block, 7), 2, "gain not known: as on S3");
        // Eight bodies bring eight times one: the rule as if unknown, within a rounding.
        pace.gain.set(100e6, 800e6);
        assert_eq!(pace.blocks_past(block, 7), 2);
        assert!(!pace.keeps(Some(600e6), 7, block));
        // Twice one: GETs of their own pay only past two round trips' bytes.
        pace.gain.set(100e6, 200e6);
        assert_eq!(pace.blocks_past(block, 7), 4);
        assert!(pace.keeps(Some(600e6), 8, block), "72 MB in twice that");
        assert!(!pace.keeps(Some(600e6), 9, block));
        // Nothing gained (an upstream sharing its cores with the cache, or a full link): the
        // run takes every block it may, and keeps going at any rate.
        pace.gain.set(800e6, 760e6);
        assert_eq!(pace.blocks_past(block, 7), 7);
        assert!(pace.keeps(Some(600e6), 7, block));
        assert!(pace.keeps(Some(400e6), 7, block));
        // A first block at S3's 90 MB/s: not the upstream the gain was measured on, whose one
        // body brought 800 MB/s; the rest at once, as where the gain is not known.
        assert!(!pace.keeps(Some(90e6), 7, block));
        // A rate never measured still plans no run.
        let unmeasured = Pace::default();
        unmeasured.gain.set(800e6, 760e6);
        assert_eq!(unmeasured.blocks_past(block, 7), 0);
    }
}
