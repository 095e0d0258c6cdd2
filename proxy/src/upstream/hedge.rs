//! When to hedge: a second request for the same block once the first has waited longer than a
//! chosen percentile of recent upstream first-byte latencies.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

/// Latencies remembered.
const WINDOW: usize = 1024;
/// Latencies needed before hedging starts: a percentile of a handful is noise.
const MIN_SAMPLES: usize = 64;
/// The percentile is recomputed every this many samples.
const RECOMPUTE_EVERY: u64 = 32;

/// Tracks recent first-byte latencies and says how long to wait before hedging.
#[derive(Debug)]
pub struct HedgePolicy {
    quantile: Option<f64>,
    recent: Mutex<VecDeque<Duration>>,
    recorded: AtomicU64,
    /// The current threshold in nanoseconds; 0 while there are too few samples.
    threshold_ns: AtomicU64,
}

impl HedgePolicy {
    /// Hedge after the `quantile` (e.g. 0.95) of recent latencies; `None` never hedges.
    pub fn new(quantile: Option<f64>) -> Self {
        Self {
            quantile,
            recent: Mutex::new(VecDeque::with_capacity(WINDOW)),
            recorded: AtomicU64::new(0),
            threshold_ns: AtomicU64::new(0),
        }
    }

    /// How long the first request may wait before a second is sent; `None` to not hedge.
    pub fn delay(&self) -> Option<Duration> {
        self.quantile?;
        match self.threshold_ns.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }

    /// A request's time to its response headers.
    pub fn record(&self, latency: Duration) {
        let Some(q) = self.quantile else { return };
        let n = {
            let mut recent = self.recent.lock();
            if recent.len() == WINDOW {
                recent.pop_front();
            }
            recent.push_back(latency);
            recent.len()
        };
        let count = self.recorded.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= MIN_SAMPLES && count.is_multiple_of(RECOMPUTE_EVERY) {
            let mut sorted: Vec<Duration> = self.recent.lock().iter().copied().collect();
            sorted.sort_unstable();
            let at = ((sorted.len() as f64 - 1.0) * q).round() as usize;
            let ns = sorted[at.min(sorted.len() - 1)].as_nanos().max(1) as u64;
            self.threshold_ns.store(ns, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_for_enough_samples_then_tracks_the_percentile() {
        let h = HedgePolicy::new(Some(0.9));
        for ms in 1..=63 {
            h.record(Duration::from_millis(ms));
        }
        assert_eq!(h.delay(), None, "too few samples");
        for ms in 64..=128 {
            h.record(Duration::from_millis(ms));
        }
        let d = h.delay().unwrap();
        assert!(
            (Duration::from_millis(105)..=Duration::from_millis(120)).contains(&d),
            "{d:?}"
        );
        let off = HedgePolicy::new(None);
        for ms in 1..=200 {
            off.record(Duration::from_millis(ms));
        }
        assert_eq!(off.delay(), None);
    }
}
