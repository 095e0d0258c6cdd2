//! What one client key may take of a shared Larder (`auth_policies`): requests a second,
//! refused past the limit with `503 SlowDown` as S3 refuses a prefix's excess, and bytes a
//! second sent to it, paced rather than refused.
//!
//! One Larder serves many teams' jobs. Without limits, one job's scan or retry storm takes
//! the listener, the upstream budget and the network from all the others. S3 limits by prefix,
//! not by caller, so it cannot tell the jobs apart behind one proxy; Larder can, by the key
//! that signed each request. Every AWS SDK retries `SlowDown` with backoff, so a client over
//! its rate slows down rather than fails. A paced client reads as a slow client does: its
//! blocks wait in the responses' bounded buffer, and other keys' reads go on.
//!
//! Limits hold per replica: behind a load balancer over `n` replicas a key may take `n` times
//! its rate.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod gcra;
mod paced;

use gcra::Gcra;
pub use paced::Paced;

/// How many requests beyond the steady rate may arrive at once: a second's worth, so that
/// "N requests a second" admits N sent together.
const REQUEST_BURST: Duration = Duration::from_secs(1);

/// How far a paced key's bytes may run ahead of its rate: a tenth of a second's worth, so a
/// response's throughput, seen over a second, is the rate's.
const BYTE_BURST: Duration = Duration::from_millis(100);

/// A paced response's slices: a tenth of a second's bytes, within these bounds. Below 4 KiB a
/// slice would cost more in wake-ups than it carries; above 1 MiB a fast key's responses would
/// go in bursts. At the lowest rate allowed (1 KiB/s) a slice is 4 s apart, within any SDK's
/// read timeout.
const SLICE_BOUNDS: (u64, u64) = (4 << 10, 1 << 20);

/// One key's limits, and what they held back.
#[derive(Debug)]
pub struct Limits {
    requests: Option<Gcra>,
    bytes: Option<Gcra>,
    slice: usize,
    refused: AtomicU64,
    paced_nanos: AtomicU64,
}

impl Limits {
    /// The limits of a key allowed `requests_per_second` and `bytes_per_second` (each
    /// unlimited when `None`); `None` when neither is set.
    pub fn new(
        requests_per_second: Option<NonZeroU32>,
        bytes_per_second: Option<u64>,
    ) -> Option<Self> {
        if requests_per_second.is_none() && bytes_per_second.is_none() {
            return None;
        }
        Some(Self {
            requests: requests_per_second.map(|r| Gcra::new(r.get().into(), REQUEST_BURST)),
            bytes: bytes_per_second.map(|b| Gcra::new(b, BYTE_BURST)),
            slice: bytes_per_second.map_or(SLICE_BOUNDS.1, |b| {
                (b / 10).clamp(SLICE_BOUNDS.0, SLICE_BOUNDS.1)
            }) as usize,
            refused: AtomicU64::new(0),
            paced_nanos: AtomicU64::new(0),
        })
    }

    /// Add what `was` counted to these limits' counts: a key whose rates changed keeps its
    /// counters going instead of starting them again.
    pub fn continue_counts(&self, was: &Limits) {
        for (now, before) in [
            (&self.refused, &was.refused),
            (&self.paced_nanos, &was.paced_nanos),
        ] {
            now.fetch_add(before.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// Whether a request may be served now; a refusal is counted.
    pub fn admit(&self, now: Instant) -> bool {
        let admitted = self.requests.as_ref().is_none_or(|r| r.try_take(1, now));
        if !admitted {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        admitted
    }

    /// The most a paced response sends between two takes from the byte rate.
    pub fn slice(&self) -> usize {
        self.slice
    }

    /// Whether responses are paced.
    pub fn paces(&self) -> bool {
        self.bytes.is_some()
    }

    /// Take `n` bytes of the key's rate: how long to hold them first. The wait is counted.
    fn take_bytes(&self, n: u64, now: Instant) -> Duration {
        let wait = self
            .bytes
            .as_ref()
            .map_or(Duration::ZERO, |b| b.take(n, now));
        if !wait.is_zero() {
            let nanos = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
            self.paced_nanos.fetch_add(nanos, Ordering::Relaxed);
        }
        wait
    }

    /// Requests refused so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Seconds response slices waited for the byte rate so far, summed over slices.
    pub fn paced_seconds(&self) -> f64 {
        self.paced_nanos.load(Ordering::Relaxed) as f64 / 1e9
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_limit_set_means_no_limits() {
        assert!(Limits::new(None, None).is_none());
        let bytes_only = Limits::new(None, Some(1 << 20)).unwrap();
        assert!(bytes_only.paces());
        assert!((0..10_000).all(|_| bytes_only.admit(Instant::now())));
        let slice = |rate| Limits::new(None, Some(rate)).unwrap().slice();
        assert_eq!(
            (slice(1024), slice(1 << 20), slice(100 << 20)),
            (4096, 104_857, 1 << 20)
        );
        let requests_only = Limits::new(NonZeroU32::new(5), None).unwrap();
        assert!(!requests_only.paces());
        assert_eq!(
            requests_only.take_bytes(1 << 30, Instant::now()),
            Duration::ZERO
        );
    }

    #[test]
    fn refusals_are_counted() {
        let limits = Limits::new(NonZeroU32::new(5), None).unwrap();
        let now = Instant::now();
        let admitted = (0..8).filter(|_| limits.admit(now)).count();
        assert_eq!((admitted, limits.refused()), (5, 3));
    }
}
