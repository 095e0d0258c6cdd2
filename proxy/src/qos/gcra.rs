//! A rate as the generic cell rate algorithm keeps it: one atomic, the time at which
//! everything taken so far is paid for (its "theoretical arrival time"). Taking `n` units
//! moves that time on by `n` units' cost, from now if it lies in the past; the rate allows
//! the take while that time lies no more than the burst ahead of now. No timer, no refill
//! task, no lock: many requests of one key on many threads take from it at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// `per_second` units a second, with bursts of up to `burst` worth of them at once.
#[derive(Debug)]
pub(super) struct Gcra {
    origin: Instant,
    per_second: u64,
    burst: u64,
    /// Nanoseconds after `origin` at which all taken so far is paid for.
    paid_until: AtomicU64,
}

impl Gcra {
    /// A rate of `per_second` (at least 1) with bursts of `burst`.
    pub(super) fn new(per_second: u64, burst: Duration) -> Self {
        Self {
            origin: Instant::now(),
            per_second: per_second.max(1),
            burst: nanos(burst),
            paid_until: AtomicU64::new(0),
        }
    }

    /// What `n` units cost, in nanoseconds.
    fn cost(&self, n: u64) -> u64 {
        let ns = u128::from(n) * 1_000_000_000 / u128::from(self.per_second);
        u64::try_from(ns).unwrap_or(u64::MAX)
    }

    fn since_origin(&self, now: Instant) -> u64 {
        nanos(now.saturating_duration_since(self.origin))
    }

    /// Take `n` units at `now` if the burst has room for them; otherwise take nothing.
    pub(super) fn try_take(&self, n: u64, now: Instant) -> bool {
        let now = self.since_origin(now);
        let cost = self.cost(n);
        self.paid_until
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |paid| {
                let after = paid.max(now).saturating_add(cost);
                (after - now <= self.burst.max(cost)).then_some(after)
            })
            .is_ok()
    }

    /// Take `n` units at `now` whatever is owed already, and say how long to wait before using
    /// them: zero while within the burst. Callers that wait are served in the order they took.
    pub(super) fn take(&self, n: u64, now: Instant) -> Duration {
        let now = self.since_origin(now);
        let cost = self.cost(n);
        let paid = self
            .paid_until
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |paid| {
                Some(paid.max(now).saturating_add(cost))
            })
            .unwrap_or_else(|paid| paid);
        let after = paid.max(now).saturating_add(cost);
        Duration::from_nanos((after - now).saturating_sub(self.burst))
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_burst_is_allowed_then_one_unit_per_interval() {
        let rate = Gcra::new(10, Duration::from_secs(1));
        let t0 = rate.origin + Duration::from_secs(5);
        assert_eq!((0..15).filter(|_| rate.try_take(1, t0)).count(), 10);
        // One more every 100 ms.
        assert!(!rate.try_take(1, t0 + 99 * MS));
        assert!(rate.try_take(1, t0 + 100 * MS));
        assert!(!rate.try_take(1, t0 + 150 * MS));
        // Idle time refills up to the burst, never beyond it.
        let later = t0 + Duration::from_secs(60);
        assert_eq!((0..15).filter(|_| rate.try_take(1, later)).count(), 10);
    }

    #[test]
    fn a_refused_take_costs_nothing() {
        let rate = Gcra::new(1, Duration::from_secs(1));
        let t0 = rate.origin + Duration::from_secs(5);
        assert!(rate.try_take(1, t0));
        for _ in 0..100 {
            assert!(!rate.try_take(1, t0 + 500 * MS));
        }
        assert!(rate.try_take(1, t0 + Duration::from_secs(1)));
    }

    #[test]
    fn takes_larger_than_the_burst_still_pass_one_at_a_time() {
        let rate = Gcra::new(1000, 10 * MS);
        let t0 = rate.origin + Duration::from_secs(5);
        assert!(rate.try_take(500, t0));
        assert!(!rate.try_take(500, t0));
        assert!(rate.try_take(500, t0 + 500 * MS));
    }

    #[test]
    fn waits_add_up_to_the_rate() {
        // 1 MB/s with a 100 ms burst: 3 MB taken at once waits for all but the burst.
        let rate = Gcra::new(1_000_000, 100 * MS);
        let t0 = rate.origin + Duration::from_secs(5);
        let waits: Vec<Duration> = (0..30).map(|_| rate.take(100_000, t0)).collect();
        assert_eq!(waits[0], Duration::ZERO);
        assert_eq!(waits[1], 100 * MS);
        assert_eq!(waits[29], 2900 * MS);
        assert!(waits.windows(2).all(|w| w[0] <= w[1]));
        // Time that has passed is paid for.
        assert_eq!(
            rate.take(100_000, t0 + Duration::from_secs(10)),
            Duration::ZERO
        );
    }
}
