//! Instruments bound to their label sets once, so that a measurement on the request path costs
//! an atomic add rather than hashing and comparing every label's text.
//!
//! OpenTelemetry finds a measurement's series by hashing its attributes (SipHash over each
//! key and value) under a lock: six such measurements were a tenth of a small hit's
//! instructions (docs/benchmarks.md). A [`Bound`] instrument keeps the SDK's bound handle for
//! each label set it has met, found by a number packed from the labels' indices ([`Key`]).
//! Bound and unbound measurements of one label set land in the same series, so the zeros
//! recorded at start-up and the rare unbound measurement add up with the bound ones.
//!
//! A key is made from Larder's own label vocabularies (operations, cache results, tiers, the
//! listed buckets) and a status code, never from what a client chooses, so the map stays as
//! small as those sets and a plain multiplicative hash cannot be steered into collisions.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use opentelemetry::metrics::{BoundCounter, BoundHistogram, Counter, Histogram};
use opentelemetry::KeyValue;
use parking_lot::RwLock;

/// An instrument that can be bound to a label set.
pub(super) trait Bind {
    /// What measurements of one label set go through.
    type Handle;
    /// The handle for `labels`.
    fn bind(&self, labels: &[KeyValue]) -> Self::Handle;
}

impl<T> Bind for Counter<T> {
    type Handle = BoundCounter<T>;
    fn bind(&self, labels: &[KeyValue]) -> BoundCounter<T> {
        Counter::bind(self, labels)
    }
}

impl<T> Bind for Histogram<T> {
    type Handle = BoundHistogram<T>;
    fn bind(&self, labels: &[KeyValue]) -> BoundHistogram<T> {
        Histogram::bind(self, labels)
    }
}

/// A label set, packed from its labels' indices: each label gets its own bits, so two
/// different sets never share a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Key(u64);

impl Key {
    /// No labels yet.
    pub(super) const fn new() -> Self {
        Key(0)
    }

    /// This set and one more label, whose value is `index` of at most `1 << bits` values.
    pub(super) const fn and(self, index: usize, bits: u32) -> Self {
        debug_assert!((index as u64) < 1 << bits && self.0 >> (64 - bits) == 0);
        Key(self.0 << bits | index as u64)
    }
}

/// Spreads a packed key over the hash's bits (Fibonacci hashing): every bit of the key moves
/// the high bits the table's probes use.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(self.0 << 8 | u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        let h = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ h >> 32;
    }
}

/// An instrument and its handles bound so far, one per label set met.
pub(super) struct Bound<I: Bind> {
    instrument: I,
    handles: RwLock<HashMap<Key, I::Handle, BuildHasherDefault<KeyHasher>>>,
}

impl<I: Bind> Bound<I> {
    pub(super) fn new(instrument: I) -> Self {
        Self {
            instrument,
            handles: RwLock::default(),
        }
    }

    /// The instrument itself, for measurements off the request path (the start-up zeros).
    pub(super) fn unbound(&self) -> &I {
        &self.instrument
    }

    /// Measure with the handle of the label set `key` stands for, bound from `labels` the
    /// first time that set is met. `labels` must be the same set whenever `key` is.
    pub(super) fn with(
        &self,
        key: Key,
        labels: impl FnOnce() -> Vec<KeyValue>,
        measure: impl FnOnce(&I::Handle),
    ) {
        if let Some(handle) = self.handles.read().get(&key) {
            return measure(handle);
        }
        let mut handles = self.handles.write();
        let handle = handles
            .entry(key)
            .or_insert_with(|| self.instrument.bind(&labels()));
        measure(handle);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::metrics::MeterProvider as _;
    use opentelemetry_sdk::metrics::SdkMeterProvider;

    #[test]
    fn keys_of_different_label_sets_differ() {
        let mut seen = std::collections::HashSet::new();
        for a in 0..4 {
            for b in 0..600 {
                for c in 0..16 {
                    assert!(seen.insert(Key::new().and(a, 2).and(b, 10).and(c, 4)));
                }
            }
        }
    }

    #[test]
    fn a_label_set_is_bound_once() {
        let provider = SdkMeterProvider::builder().build();
        let bound = Bound::new(provider.meter("t").u64_counter("c").build());
        let mut bindings = 0;
        for key in [1, 2, 1, 1, 2] {
            bound.with(
                Key::new().and(key, 2),
                || {
                    bindings += 1;
                    vec![KeyValue::new("tier", "memory")]
                },
                |h| h.add(1),
            );
        }
        assert_eq!(bindings, 2);
        assert_eq!(bound.handles.read().len(), 2);
    }
}
