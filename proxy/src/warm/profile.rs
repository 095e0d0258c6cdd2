//! Access profiles: the byte ranges clients read while a recording ran, kept so a later warm-up
//! can fetch exactly those again (`larder warm --profile`), ahead of the next run of the same
//! job, on a new replica, or after a restart that started empty.
//!
//! A prefix warm fetches every byte under the prefix; a job that reads the footers and a few
//! column chunks of each Parquet file reads a small share of that. The profile holds what was
//! read, per object in the order objects were first read, so a warm-up from it fetches the
//! blocks under those ranges and nothing else, the job's first objects first.
//!
//! Bounded by construction: at most [`MAX_OBJECTS`] objects, and per object at most
//! [`MAX_RANGES`] ranges (past that the two closest are merged, so the profile covers more than
//! was read, never less). Reads of objects past the first limit are counted as not recorded.
//! While nothing records, a read costs one relaxed atomic load.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::{WarmObject, WarmRequest, MAX_KEYS};
use crate::model::range::ByteRange;

/// Most objects one profile holds.
pub const MAX_OBJECTS: usize = 50_000;
/// Most ranges one object's entry holds (and a warm request may give one object).
pub const MAX_RANGES: usize = 32;

/// The recorder the S3 front reports each object read to.
#[derive(Default)]
pub struct Profiler {
    on: AtomicBool,
    recording: Mutex<Recording>,
}

#[derive(Default)]
struct Recording {
    /// Which start this is: a timed recording's timer stops only its own.
    start: u64,
    /// Only this client key's reads, if set.
    access_key: Option<String>,
    started: Option<SystemTime>,
    stopped: Option<SystemTime>,
    index: HashMap<(Arc<str>, Arc<str>), usize>,
    objects: Vec<Recorded>,
    reads: u64,
    not_recorded: u64,
}

struct Recorded {
    bucket: Arc<str>,
    key: Arc<str>,
    ranges: Vec<Range<u64>>,
}

/// A profile as the admin API reports it; `warm` is what `POST /warm` takes, one request per
/// bucket (and per [`MAX_KEYS`] objects).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProfileReport {
    /// Whether reads are being recorded now.
    pub recording: bool,
    /// Only this client key's reads are recorded.
    pub access_key: Option<String>,
    /// When the recording started, seconds since the Unix epoch.
    pub started: Option<u64>,
    /// When it stopped.
    pub stopped: Option<u64>,
    /// Object reads recorded.
    pub reads: u64,
    /// Object reads not recorded: their object would have been past [`MAX_OBJECTS`].
    pub not_recorded: u64,
    /// Objects in the profile.
    pub objects: usize,
    /// The warm-up requests that fetch what was read.
    pub warm: Vec<WarmRequest>,
}

impl Profiler {
    /// Whether reads are being recorded: the one check a read makes while nothing records.
    pub fn recording(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Start a new recording, dropping the last one; the start's number, for [`stop_if`].
    ///
    /// [`stop_if`]: Self::stop_if
    pub fn start(&self, access_key: Option<String>) -> u64 {
        let mut r = self.recording.lock();
        let start = r.start + 1;
        *r = Recording {
            start,
            access_key,
            started: Some(SystemTime::now()),
            ..Default::default()
        };
        self.on.store(true, Ordering::Relaxed);
        start
    }

    /// Stop recording (what was recorded is kept); whether a recording was running.
    pub fn stop(&self) -> bool {
        let mut r = self.recording.lock();
        let was = self.on.swap(false, Ordering::Relaxed);
        if was {
            r.stopped = Some(SystemTime::now());
        }
        was
    }

    /// Stop the recording `start` began, if it is still the one running.
    pub fn stop_if(&self, start: u64) -> bool {
        // Checked and stopped under one lock: a start in between is not stopped by mistake.
        let mut r = self.recording.lock();
        if r.start != start || !self.on.swap(false, Ordering::Relaxed) {
            return false;
        }
        r.stopped = Some(SystemTime::now());
        true
    }

    /// Note a read of bytes `range` of `bucket`/`key` by `access_key`.
    pub fn record(
        &self,
        access_key: Option<&str>,
        bucket: &Arc<str>,
        key: &Arc<str>,
        range: Range<u64>,
    ) {
        if range.is_empty() {
            return;
        }
        let mut r = self.recording.lock();
        if !self.on.load(Ordering::Relaxed)
            || r.access_key
                .as_deref()
                .is_some_and(|k| Some(k) != access_key)
        {
            return;
        }
        let found = r.index.get(&(bucket.clone(), key.clone())).copied();
        let i = match found {
            Some(i) => i,
            None if r.objects.len() >= MAX_OBJECTS => {
                r.not_recorded += 1;
                return;
            }
            None => {
                let i = r.objects.len();
                r.objects.push(Recorded {
                    bucket: bucket.clone(),
                    key: key.clone(),
                    ranges: Vec::new(),
                });
                r.index.insert((bucket.clone(), key.clone()), i);
                i
            }
        };
        r.reads += 1;
        add(&mut r.objects[i].ranges, range);
    }

    /// The profile so far.
    pub fn report(&self) -> ProfileReport {
        let r = self.recording.lock();
        let secs = |t: Option<SystemTime>| {
            t.and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map(|d| d.as_secs())
        };
        // One request per bucket, buckets and objects in the order first read.
        let mut warm: Vec<WarmRequest> = Vec::new();
        let mut open: HashMap<&str, usize> = HashMap::new();
        for o in &r.objects {
            let at = match open.get(&*o.bucket) {
                Some(&i) if warm[i].objects.len() < MAX_KEYS => i,
                _ => {
                    warm.push(WarmRequest {
                        bucket: o.bucket.to_string(),
                        ..Default::default()
                    });
                    open.insert(&*o.bucket, warm.len() - 1);
                    warm.len() - 1
                }
            };
            warm[at].objects.push(WarmObject {
                key: o.key.to_string(),
                ranges: o
                    .ranges
                    .iter()
                    .map(|r| ByteRange::bytes(r.clone()).header())
                    .collect(),
            });
        }
        ProfileReport {
            recording: self.recording(),
            access_key: r.access_key.clone(),
            started: secs(r.started),
            stopped: secs(r.stopped),
            reads: r.reads,
            not_recorded: r.not_recorded,
            objects: r.objects.len(),
            warm,
        }
    }
}

/// Add `new` to sorted, disjoint, non-adjacent `ranges`, merging what it overlaps or touches;
/// past [`MAX_RANGES`], merge the two ranges with the smallest gap between them.
fn add(ranges: &mut Vec<Range<u64>>, new: Range<u64>) {
    // The first range that ends at or after the new one's start may touch it.
    let first = ranges.partition_point(|r| r.end < new.start);
    let mut merged = new;
    let mut last = first;
    while last < ranges.len() && ranges[last].start <= merged.end {
        merged.start = merged.start.min(ranges[last].start);
        merged.end = merged.end.max(ranges[last].end);
        last += 1;
    }
    ranges.splice(first..last, [merged]);
    if ranges.len() > MAX_RANGES {
        let i = (0..ranges.len() - 1)
            .min_by_key(|&i| ranges[i + 1].start - ranges[i].end)
            .expect("more than one range");
        ranges[i].end = ranges[i + 1].end;
        ranges.remove(i + 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ranges after adding `seq` in turn, as (start, end) pairs.
    fn added(seq: &[(u64, u64)]) -> Vec<(u64, u64)> {
        let mut ranges = Vec::new();
        for &(a, b) in seq {
            add(&mut ranges, a..b);
        }
        ranges.iter().map(|r| (r.start, r.end)).collect()
    }

    #[test]
    fn ranges_merge_where_they_overlap_or_touch_and_stay_sorted() {
        assert_eq!(added(&[(10, 20), (0, 5)]), [(0, 5), (10, 20)]);
        assert_eq!(added(&[(10, 20), (20, 30)]), [(10, 30)]);
        assert_eq!(added(&[(10, 20), (5, 10)]), [(5, 20)]);
        assert_eq!(added(&[(0, 5), (10, 20), (30, 40), (4, 31)]), [(0, 40)]);
        assert_eq!(added(&[(0, 5), (10, 20), (12, 15)]), [(0, 5), (10, 20)]);
        assert_eq!(
            added(&[(50, 60), (0, 5), (10, 20), (21, 22)]),
            [(0, 5), (10, 20), (21, 22), (50, 60)]
        );
    }

    #[test]
    fn past_the_limit_the_closest_ranges_merge_so_nothing_read_is_left_out() {
        // Ranges 100 apart, and one more only 10 past the last: that pair merges.
        let n = MAX_RANGES as u64;
        let mut seq: Vec<(u64, u64)> = (0..n).map(|i| (i * 110, i * 110 + 10)).collect();
        seq.push(((n - 1) * 110 + 20, (n - 1) * 110 + 30));
        let ranges = added(&seq);
        assert_eq!(ranges.len(), MAX_RANGES);
        assert_eq!(ranges[MAX_RANGES - 2], ((n - 2) * 110, (n - 2) * 110 + 10));
        assert_eq!(ranges[MAX_RANGES - 1], ((n - 1) * 110, (n - 1) * 110 + 30));
        // One more in the middle of a gap of 100: the closest pair it makes merges.
        seq.push((5 * 110 + 15, 5 * 110 + 20));
        let ranges = added(&seq);
        assert_eq!(ranges.len(), MAX_RANGES);
        assert_eq!(ranges[5], (5 * 110, 5 * 110 + 20));
        for (a, b) in seq {
            assert!(
                ranges.iter().any(|r| r.0 <= a && b <= r.1),
                "{a}..{b} left out"
            );
        }
    }

    fn id(s: &str) -> Arc<str> {
        s.into()
    }

    #[test]
    fn a_recording_holds_what_was_read_in_first_read_order_per_bucket() {
        let p = Profiler::default();
        let (lake, logs) = (id("lake"), id("logs"));
        // Nothing is recorded before a start.
        p.record(None, &lake, &id("early"), 0..10);
        p.start(None);
        p.record(Some("a"), &lake, &id("t/2.parquet"), 900..1000);
        p.record(Some("b"), &logs, &id("x"), 0..5);
        p.record(None, &lake, &id("t/1.parquet"), 0..100);
        p.record(None, &lake, &id("t/2.parquet"), 0..100);
        p.record(None, &lake, &id("t/2.parquet"), 50..60);
        p.record(None, &lake, &id("empty"), 7..7);
        assert!(p.stop());
        p.record(None, &lake, &id("late"), 0..10);
        let r = p.report();
        assert!(!r.recording && r.started.is_some() && r.stopped.is_some());
        assert_eq!((r.reads, r.objects, r.not_recorded), (5, 3, 0));
        let json = serde_json::to_value(&r.warm).unwrap();
        assert_eq!(
            json,
            serde_json::json!([
                {"bucket": "lake", "keys": [], "prefix": null, "range": null, "objects": [
                    {"key": "t/2.parquet", "ranges": ["bytes=0-99", "bytes=900-999"]},
                    {"key": "t/1.parquet", "ranges": ["bytes=0-99"]},
                ]},
                {"bucket": "logs", "keys": [], "prefix": null, "range": null, "objects": [
                    {"key": "x", "ranges": ["bytes=0-4"]},
                ]},
            ])
        );
        // A new start drops the last recording; a key filter records that key's reads only.
        p.start(Some("a".into()));
        p.record(Some("b"), &lake, &id("k"), 0..1);
        p.record(None, &lake, &id("k"), 0..1);
        p.record(Some("a"), &lake, &id("k"), 0..1);
        let r = p.report();
        assert_eq!((r.recording, r.reads, r.objects), (true, 1, 1));
        assert_eq!(r.access_key.as_deref(), Some("a"));
    }

    #[test]
    fn objects_past_the_limit_are_counted_not_held_and_requests_stay_within_theirs() {
        let p = Profiler::default();
        p.start(None);
        let b = id("b");
        for i in 0..MAX_OBJECTS + 3 {
            p.record(None, &b, &id(&format!("k{i}")), 0..1);
        }
        // A known object's reads are still recorded.
        p.record(None, &b, &id("k0"), 5..6);
        let r = p.report();
        assert_eq!(
            (r.objects, r.not_recorded, r.reads),
            (MAX_OBJECTS, 3, MAX_OBJECTS as u64 + 1)
        );
        assert_eq!(r.warm.len(), MAX_OBJECTS.div_ceil(MAX_KEYS));
        assert!(r
            .warm
            .iter()
            .all(|w| w.objects.len() <= MAX_KEYS && w.bucket == "b"));
        assert_eq!(r.warm[0].objects[0].ranges, ["bytes=0-0", "bytes=5-5"]);
    }

    #[test]
    fn a_timed_stop_stops_only_its_own_recording() {
        let p = Profiler::default();
        let first = p.start(None);
        let second = p.start(None);
        assert!(!p.stop_if(first));
        assert!(p.recording());
        assert!(p.stop_if(second));
        assert!(!p.recording());
        assert!(!p.stop_if(second));
    }
}
