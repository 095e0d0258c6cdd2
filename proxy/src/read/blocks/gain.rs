//! What the upstream gains from bodies streaming at once: its bytes per second while several of
//! Larder's GETs stream, over its bytes per second while one does.
//!
//! Parallel GETs are how a cache beats a client's single stream on S3, which serves each
//! connection at about 90 MB/s and many of them side by side: eight GETs bring nearly eight
//! times one. An upstream that is short of something other than per-connection bandwidth (its
//! CPU, its disks, a link already full) brings no more with eight bodies streaming than with
//! one, and there the extra GETs only cost requests and the work of each. A cold read of an
//! object near the cache, on this project's 2-core benchmark machine where MinIO shares the
//! cores, took 122 ms with one GET per block and 113 ms with one GET for all eight
//! (docs/benchmarks.md, "Parallel GETs only where they pay").
//!
//! [`Gain`] watches every upstream body a block fetch reads: time is split by how many were
//! streaming (between a body's first chunk and its end), one or several, and each chunk's bytes
//! go to the share they arrived in. The ratio of the two rates is the gain
//! ([`Gain::gain`]); `pace` turns it into how far a cold GET runs on before the blocks past it
//! are asked of GETs of their own. Each share fades with time (by `e` every [`FADE`]), so the
//! estimate follows an upstream that changes, and one not added to for long enough to fall
//! under what a rate needs ([`LEAST_TIME`], [`LEAST_BYTES`]) no longer counts: reads that
//! stopped fanning out because it did not pay fan out again within a minute or so, and so
//! measure again.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// The time over which a share fades by `e`: its rate follows the last half minute or so.
const FADE: Duration = Duration::from_secs(10);

/// The least streaming time and bytes a share needs before its rate is believed: a few
/// chunks say little about a connection's rate.
const LEAST_TIME: Duration = Duration::from_millis(20);
const LEAST_BYTES: f64 = 4.0 * 1024.0 * 1024.0;

/// Bytes and streaming seconds of one kind (one body streaming, or several), faded to the
/// time `at`.
#[derive(Default, Clone, Copy)]
struct Share {
    secs: f64,
    bytes: f64,
    at: Option<Instant>,
}

impl Share {
    /// What is left of the share at `now`, as a factor.
    fn faded(&self, now: Instant) -> f64 {
        self.at.map_or(0.0, |at| {
            (-now.saturating_duration_since(at).as_secs_f64() / FADE.as_secs_f64()).exp()
        })
    }

    fn add(&mut self, secs: f64, bytes: u64, now: Instant) {
        let left = self.faded(now);
        self.secs = self.secs * left + secs;
        self.bytes = self.bytes * left + bytes as f64;
        self.at = Some(now);
    }

    /// Bytes per second, when there is enough of it left to say.
    fn rate(&self, now: Instant) -> Option<f64> {
        let left = self.faded(now);
        let enough =
            self.secs * left >= LEAST_TIME.as_secs_f64() && self.bytes * left >= LEAST_BYTES;
        enough.then(|| self.bytes / self.secs)
    }
}

#[derive(Default)]
struct Watch {
    /// Bodies between their first chunk and their end.
    streaming: u32,
    /// When the last chunk came or a body started or ended.
    last: Option<Instant>,
    one: Share,
    several: Share,
}

impl Watch {
    /// The time since the last event goes to the share of as many bodies as streamed in it,
    /// with the `bytes` that arrived at its end.
    fn tick(&mut self, now: Instant, bytes: u64) {
        if let Some(last) = self.last {
            let secs = now.saturating_duration_since(last).as_secs_f64();
            match self.streaming {
                0 => {}
                1 => self.one.add(secs, bytes, now),
                _ => self.several.add(secs, bytes, now),
            }
        }
        self.last = Some(now);
    }
}

/// The upstream's bytes per second with several bodies streaming over those with one.
#[derive(Default)]
pub(super) struct Gain {
    watch: Mutex<Watch>,
}

impl Gain {
    /// A body of the upstream started streaming (its first chunk came; its bytes are not
    /// counted, as the time before them was the round trip's): count its later chunks on the
    /// [`Streaming`] returned, which ends it when dropped.
    pub(super) fn started(&self) -> Streaming<'_> {
        self.started_at(Instant::now());
        Streaming { gain: self }
    }

    fn started_at(&self, now: Instant) {
        let mut w = self.watch.lock();
        w.tick(now, 0);
        w.streaming += 1;
    }

    fn chunk_at(&self, now: Instant, bytes: u64) {
        self.watch.lock().tick(now, bytes);
    }

    fn ended_at(&self, now: Instant) {
        let mut w = self.watch.lock();
        w.tick(now, 0);
        w.streaming = w.streaming.saturating_sub(1);
    }

    /// Several bodies' rate over one's, while enough of both is left to say.
    pub(super) fn gain(&self) -> Option<f64> {
        self.gain_at(Instant::now(), None)
    }

    /// [`Gain::gain`], for a connection that brings `rate` bytes a second: none when that is
    /// under half what one body was measured to bring. The upstream is not what it was when
    /// the gain was measured (it began to cap each connection, say), and what was measured is
    /// forgotten, to be measured again. Kept, it would mix with what the changed upstream
    /// brings for tens of seconds, and the mix says neither: an upstream that brought 800
    /// MB/s however many bodies streamed, then capped each connection at 90 MB/s, measured a
    /// gain of 0.8 over its first capped second where four bodies brought four times one (the
    /// unit test below), and a gain that low has cold reads run one GET where eight pay.
    pub(super) fn gain_for(&self, rate: f64) -> Option<f64> {
        self.gain_at(Instant::now(), Some(rate))
    }

    fn gain_at(&self, now: Instant, rate: Option<f64>) -> Option<f64> {
        let mut w = self.watch.lock();
        let one = w.one.rate(now)?;
        if rate.is_some_and(|r| r < one / 2.0) {
            w.one = Share::default();
            w.several = Share::default();
            return None;
        }
        Some(w.several.rate(now)? / one)
    }

    /// As if one body had been seen to bring `one` bytes a second, and several together
    /// `several`, just now (over a long time: enough to measure at any rate).
    #[cfg(test)]
    pub(super) fn set(&self, one: f64, several: f64) {
        let now = Instant::now();
        let share = |rate: f64| Share {
            secs: 100.0,
            bytes: rate * 100.0,
            at: Some(now),
        };
        let mut w = self.watch.lock();
        w.one = share(one);
        w.several = share(several);
    }
}

/// One upstream body streaming, counted by [`Gain`] until dropped.
pub(super) struct Streaming<'a> {
    gain: &'a Gain,
}

impl Streaming<'_> {
    /// `bytes` more of the body came.
    pub(super) fn chunk(&mut self, bytes: u64) {
        self.gain.chunk_at(Instant::now(), bytes);
    }
}

impl Drop for Streaming<'_> {
    fn drop(&mut self) {
        self.gain.ended_at(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1_000_000;

    /// `bodies` streaming side by side for `secs`, each bringing `rate` bytes a second in
    /// chunks every 10 ms, from `start`; returns the instant they ended.
    fn stream(gain: &Gain, start: Instant, bodies: u64, rate: u64, secs: f64) -> Instant {
        for _ in 0..bodies {
            gain.started_at(start);
        }
        let step = Duration::from_millis(10);
        let mut now = start;
        for _ in 0..(secs * 100.0).round() as u64 {
            now += step;
            for _ in 0..bodies {
                gain.chunk_at(now, rate / 100);
            }
        }
        for _ in 0..bodies {
            gain.ended_at(now);
        }
        now
    }

    fn near(got: Option<f64>, want: f64) -> bool {
        got.is_some_and(|g| (g - want).abs() < 0.05)
    }

    #[test]
    fn several_bodies_at_once_gain_what_they_bring_beyond_one() {
        // An upstream capping each connection, as S3 does: four bring four times one.
        let gain = Gain::default();
        let t0 = Instant::now();
        assert_eq!(gain.gain_at(t0, None), None, "nothing measured");
        let t1 = stream(&gain, t0, 1, 90 * MB, 1.0);
        assert_eq!(gain.gain_at(t1, None), None, "one kind measured only");
        let t2 = stream(&gain, t1, 4, 90 * MB, 1.0);
        assert!(
            near(gain.gain_at(t2, None), 4.0),
            "{:?}",
            gain.gain_at(t2, None)
        );

        // An upstream that shares 800 MB/s between however many bodies stream.
        let gain = Gain::default();
        let t1 = stream(&gain, t0, 1, 800 * MB, 1.0);
        let t2 = stream(&gain, t1, 4, 200 * MB, 1.0);
        assert!(
            near(gain.gain_at(t2, None), 1.0),
            "{:?}",
            gain.gain_at(t2, None)
        );
        // Idle time counts for neither.
        let t3 = stream(&gain, t2 + Duration::from_secs(5), 1, 800 * MB, 1.0);
        assert!(
            near(gain.gain_at(t3, None), 1.0),
            "{:?}",
            gain.gain_at(t3, None)
        );
    }

    #[test]
    fn the_gain_follows_the_upstream_and_is_forgotten_when_not_measured_again() {
        let gain = Gain::default();
        let t0 = Instant::now();
        let t1 = stream(&gain, t0, 1, 800 * MB, 1.0);
        let t2 = stream(&gain, t1, 4, 200 * MB, 1.0);
        assert!(near(gain.gain_at(t2, None), 1.0));
        // The upstream now caps each connection at 90 MB/s, as S3 does; reads fan out, and
        // see one body alone only briefly (here a tenth of the time): within half a minute
        // the estimate is two thirds of the way from one to the four that four bodies bring.
        let mut now = t2;
        for _ in 0..30 {
            now = stream(&gain, now, 1, 90 * MB, 0.1);
            now = stream(&gain, now, 4, 90 * MB, 0.9);
        }
        let g = gain.gain_at(now, None);
        assert!(g.is_some_and(|g| g > 2.8), "{g:?}");
        // A connection at the rate one body was measured at is judged by it.
        let one = gain.watch.lock().one.rate(now).unwrap();
        assert!(gain.gain_at(now, Some(one)).is_some());
        // Then only single bodies: the share of several fades, and after a minute and a half
        // (it held half a minute of fanning out) the gain is unknown again.
        let later = stream(&gain, now + Duration::from_secs(60), 1, 90 * MB, 30.0);
        assert_eq!(gain.gain_at(later, None), None);
    }

    #[test]
    fn a_connection_far_slower_than_one_body_was_has_the_gain_measured_afresh() {
        // Uncapped: eight hundred MB/s however many bodies stream.
        let gain = Gain::default();
        let t0 = Instant::now();
        let t1 = stream(&gain, t0, 1, 800 * MB, 1.0);
        let t2 = stream(&gain, t1, 4, 200 * MB, 1.0);
        assert!(near(gain.gain_at(t2, None), 1.0));
        // Then each connection capped at 90 MB/s: one body's rate says the upstream changed.
        assert_eq!(gain.gain_at(t2, Some(90.0 * MB as f64)), None);
        // What the capped upstream brings is all the gain knows: four bodies four times one,
        // from its first second, not a mix with the uncapped one's (which said 0.8 here).
        let t3 = stream(&gain, t2, 1, 90 * MB, 0.1);
        let t4 = stream(&gain, t3, 4, 90 * MB, 0.9);
        assert!(
            near(gain.gain_at(t4, Some(90.0 * MB as f64)), 4.0),
            "{:?}",
            gain.gain_at(t4, None)
        );
    }

    #[test]
    fn a_few_chunks_measure_nothing() {
        let gain = Gain::default();
        let t0 = Instant::now();
        // 10 ms of each: under the least time a share needs.
        gain.started_at(t0);
        gain.chunk_at(t0 + Duration::from_millis(10), 8 * MB);
        gain.started_at(t0 + Duration::from_millis(10));
        gain.chunk_at(t0 + Duration::from_millis(20), 8 * MB);
        assert_eq!(gain.gain_at(t0 + Duration::from_millis(20), None), None);
    }
}
