//! What may be written to disk: the admission policy and the write-rate limit. Both answer
//! immediately; nothing here ever waits.

use std::collections::{HashMap, VecDeque};
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
    /// S3-FIFO's rule: a block read again while the memory tier held it, or one offered again
    /// while the disk still remembers turning it away (a "ghost", remembered for about as many
    /// offers as the disk holds entries). A one-off read then costs memory for a while, never a
    /// disk write or disk space; while the disk still has never-used space everything is
    /// admitted.
    SecondHit,
}

/// How a block comes to be offered to the disk tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Offer {
    /// Nothing is known of its reuse (fetched, or let go by memory unread).
    New,
    /// Known to be worth a write: read again while the memory tier held it, or asked for (a
    /// cache warm-up).
    Proven,
    /// Moved by reclaim out of a region being freed, because it was read since written.
    Reinsert,
}

/// S3-FIFO's ghost queue: hashes of blocks turned away, the most recent `window` of them. A
/// block offered again while remembered would have been hit had it been admitted, so it is.
/// Holds at most `max` hashes whatever the window asks, so memory is bounded by construction.
pub(crate) struct Ghost {
    max: usize,
    inner: Mutex<GhostInner>,
}

#[derive(Default)]
struct GhostInner {
    /// Hashes in the order remembered, with the sequence number they were remembered under;
    /// an entry whose number no longer matches `live` was forgotten or remembered again since.
    order: VecDeque<(u64, u64)>,
    live: HashMap<u64, u64>,
    next: u64,
}

impl Ghost {
    pub(crate) fn new(max: usize) -> Self {
        Self {
            max: max.max(1),
            inner: Mutex::new(GhostInner::default()),
        }
    }

    /// Whether `hash` is remembered; if it is, it is forgotten (the block is being admitted).
    pub(crate) fn take(&self, hash: u64) -> bool {
        self.inner.lock().live.remove(&hash).is_some()
    }

    /// Remember `hash`, keeping the most recent `window` hashes (at most `max`).
    pub(crate) fn remember(&self, hash: u64, window: usize) {
        let window = window.clamp(1, self.max);
        let mut g = self.inner.lock();
        let seq = g.next;
        g.next += 1;
        g.live.insert(hash, seq);
        g.order.push_back((hash, seq));
        while g.live.len() > window || g.order.len() > 2 * window {
            let Some((old, at)) = g.order.pop_front() else {
                break;
            };
            if g.live.get(&old) == Some(&at) {
                g.live.remove(&old);
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().live.len()
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
    fn ghost_remembers_the_most_recent_window() {
        let g = Ghost::new(100);
        assert!(!g.take(42));
        g.remember(42, 3);
        assert!(g.take(42), "remembered");
        assert!(!g.take(42), "forgotten once taken");
        for h in 1..=5 {
            g.remember(h, 3);
        }
        assert_eq!(g.len(), 3);
        assert!(!g.take(1) && !g.take(2), "older than the window");
        assert!(g.take(3) && g.take(4) && g.take(5));
        // Remembered again: the newer remembrance counts, the older one expires harmlessly.
        g.remember(7, 2);
        g.remember(7, 2);
        g.remember(8, 2);
        assert!(g.take(7) && g.take(8));
        // The window never exceeds max.
        let small = Ghost::new(2);
        for h in 0..10 {
            small.remember(h, 1000);
        }
        assert_eq!(small.len(), 2);
        assert!(small.inner.lock().order.len() <= 4);
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
