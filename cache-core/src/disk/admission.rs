//! What may be written to disk: the admission policy and the write-rate limit. Both answer
//! immediately; nothing here ever waits.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use parking_lot::Mutex;

/// Which blocks are worth a disk write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "kebab-case")
)]
pub enum Admission {
    /// Every block offered.
    #[default]
    Always,
    /// Only a block offered before (recently): one-off scans do not churn the disk tier.
    SecondHit,
}

/// Remembers recently offered keys in a fixed table (a "doorkeeper"): one hash per slot, newer
/// keys overwrite older ones. Fixed size, lock-free, so admission never allocates or blocks.
pub(crate) struct Doorkeeper {
    slots: Box<[AtomicU64]>,
}

impl Doorkeeper {
    pub(crate) fn new(slots: usize) -> Self {
        Self {
            slots: (0..slots.max(1)).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Whether `hash` was offered since its slot was last overwritten; records it either way.
    pub(crate) fn seen_before(&self, hash: u64) -> bool {
        let slot = &self.slots[(hash % self.slots.len() as u64) as usize];
        slot.swap(hash, Ordering::Relaxed) == hash
    }
}

/// A token bucket over bytes: refills at `rate` bytes/s and holds at most one second's worth.
/// A rate of 0 means unlimited.
pub(crate) struct RateLimit {
    rate: u64,
    state: Mutex<(f64, Instant)>,
}

impl RateLimit {
    pub(crate) fn new(rate: u64) -> Self {
        Self {
            rate,
            state: Mutex::new((rate as f64, Instant::now())),
        }
    }

    /// Take `bytes` tokens if available. An entry larger than the bucket passes when the bucket
    /// is full and leaves it in debt, so the long-run rate holds for any entry size.
    pub(crate) fn try_take(&self, bytes: u64) -> bool {
        if self.rate == 0 {
            return true;
        }
        let mut s = self.state.lock();
        let now = Instant::now();
        let rate = self.rate as f64;
        s.0 = (s.0 + now.duration_since(s.1).as_secs_f64() * rate).min(rate);
        s.1 = now;
        if s.0 >= (bytes as f64).min(rate) {
            s.0 -= bytes as f64;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doorkeeper_admits_on_second_offer() {
        let d = Doorkeeper::new(1024);
        assert!(!d.seen_before(42));
        assert!(d.seen_before(42));
        assert!(!d.seen_before(43));
    }

    #[test]
    fn rate_limit_allows_a_burst_then_refuses() {
        let r = RateLimit::new(1000);
        assert!(r.try_take(600));
        assert!(!r.try_take(600));
        assert!(RateLimit::new(0).try_take(u64::MAX));
        // An entry larger than one second's worth passes once the bucket is full, then the
        // debt holds the next one back.
        let big = RateLimit::new(10);
        assert!(big.try_take(5000));
        assert!(!big.try_take(1));
    }
}
