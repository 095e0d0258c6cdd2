//! How long what the upstream said may be trusted: one owner for every freshness decision
//! (object metadata, listings, "no such key"), by bucket and key prefix, and whether the
//! stream of S3 events that lets Larder trust longer is healthy right now.
//!
//! A rule names a bucket and a key prefix; the longest prefix matching a key wins, and what a
//! rule leaves unset comes from the defaults (`metadata_ttl`, `list_ttl`, `negative_ttl`). An
//! immutable prefix (a table format's data files, which are written once and never changed)
//! is never revalidated: its metadata stays until evicted or until an event or a write through
//! Larder says the object changed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// What a rule sets; `None` leaves the default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rule {
    /// The bucket it applies to.
    pub bucket: String,
    /// The key prefix it applies to (empty: the whole bucket).
    pub prefix: String,
    /// How long object metadata is trusted.
    pub metadata_ttl: Option<Duration>,
    /// Objects here never change once written: their metadata is never revalidated.
    pub immutable: bool,
    /// How long a listing of a prefix under this one is kept (zero: not cached).
    pub list_ttl: Option<Duration>,
    /// How long a 404 for a key here is remembered (zero: not remembered).
    pub negative_ttl: Option<Duration>,
}

/// The TTLs used where no rule says otherwise.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Defaults {
    /// `metadata_ttl`.
    pub metadata: Duration,
    /// `list_ttl`.
    pub list: Duration,
    /// `negative_ttl`.
    pub negative: Duration,
}

/// How far metadata may be trusted while S3 events are expected but not arriving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventFallback {
    /// The TTL metadata falls back to (`events_fallback_ttl`).
    pub ttl: Duration,
}

/// The freshness policy.
#[derive(Debug, Default)]
pub struct Policy {
    defaults: Defaults,
    /// Longest prefix first, so the first match is the most specific.
    rules: Vec<Rule>,
    /// Set when events are configured: while the stream is not healthy, nothing mutable is
    /// trusted longer than the fallback TTL.
    fallback: Option<EventFallback>,
    healthy: AtomicBool,
}

/// How long one object's metadata is trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trust {
    /// Its TTL.
    pub ttl: Duration,
    /// Never revalidated (an immutable prefix).
    pub immutable: bool,
}

/// An entry kept "forever": until evicted for room or dropped by a change.
const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

impl Policy {
    /// A policy of `defaults` and `rules`; with `fallback`, S3 events are expected (and the
    /// stream starts unhealthy until the first one arrives).
    pub fn new(defaults: Defaults, mut rules: Vec<Rule>, fallback: Option<EventFallback>) -> Self {
        rules.sort_by_key(|r| std::cmp::Reverse(r.prefix.len()));
        Self {
            defaults,
            rules,
            fallback,
            healthy: AtomicBool::new(false),
        }
    }

    /// Only the defaults: no rules, no events.
    pub fn defaults(defaults: Defaults) -> Self {
        Self::new(defaults, Vec::new(), None)
    }

    fn rule(&self, bucket: &str, key: &str) -> Option<&Rule> {
        self.rules
            .iter()
            .find(|r| r.bucket == bucket && key.starts_with(r.prefix.as_str()))
    }

    /// How long metadata of `key` in `bucket` is trusted when it is cached.
    pub fn metadata(&self, bucket: &str, key: &str) -> Trust {
        let rule = self.rule(bucket, key);
        if rule.is_some_and(|r| r.immutable) {
            return Trust {
                ttl: FOREVER,
                immutable: true,
            };
        }
        Trust {
            ttl: rule
                .and_then(|r| r.metadata_ttl)
                .unwrap_or(self.defaults.metadata),
            immutable: false,
        }
    }

    /// The age past which metadata trusted with `trust` must be revalidated now: its TTL, or
    /// less while S3 events are expected and not arriving.
    pub fn max_age(&self, trust: Trust) -> Duration {
        match self.fallback {
            Some(f) if !trust.immutable && !self.healthy.load(Ordering::Relaxed) => {
                trust.ttl.min(f.ttl)
            }
            _ => trust.ttl,
        }
    }

    /// How long a listing of `prefix` in `bucket` is kept.
    pub fn list_ttl(&self, bucket: &str, prefix: &str) -> Duration {
        let ttl = self
            .rule(bucket, prefix)
            .and_then(|r| r.list_ttl)
            .unwrap_or(self.defaults.list);
        self.bounded(ttl)
    }

    /// How long a 404 for `key` in `bucket` is remembered.
    pub fn negative_ttl(&self, bucket: &str, key: &str) -> Duration {
        let ttl = self
            .rule(bucket, key)
            .and_then(|r| r.negative_ttl)
            .unwrap_or(self.defaults.negative);
        self.bounded(ttl)
    }

    /// Whether any listing may be cached at all (so the cache is built).
    pub fn caches_listings(&self) -> bool {
        self.any_positive(self.defaults.list, |r| r.list_ttl)
    }

    /// Whether any 404 may be remembered at all.
    pub fn caches_misses(&self) -> bool {
        self.any_positive(self.defaults.negative, |r| r.negative_ttl)
    }

    /// Whether any metadata may be cached at all.
    pub fn caches_metadata(&self) -> bool {
        self.rules.iter().any(|r| r.immutable)
            || self.any_positive(self.defaults.metadata, |r| r.metadata_ttl)
    }

    fn any_positive(&self, default: Duration, ttl: fn(&Rule) -> Option<Duration>) -> bool {
        !default.is_zero() || self.rules.iter().any(|r| ttl(r) > Some(Duration::ZERO))
    }

    /// Listings and 404s are only ever learnt from the upstream: no event proves them fresh
    /// while the stream is down, so they are held to the fallback TTL then too.
    fn bounded(&self, ttl: Duration) -> Duration {
        match self.fallback {
            Some(f) if !self.healthy.load(Ordering::Relaxed) => ttl.min(f.ttl),
            _ => ttl,
        }
    }

    /// Whether S3 events are expected.
    pub fn expects_events(&self) -> bool {
        self.fallback.is_some()
    }

    /// Whether the event stream is healthy (events expected and arriving).
    pub fn events_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Record whether the event stream is healthy; returns whether that changed.
    pub fn set_events_healthy(&self, healthy: bool) -> bool {
        self.healthy.swap(healthy, Ordering::Relaxed) != healthy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn the_longest_matching_prefix_wins_and_unset_fields_take_the_defaults() {
        let defaults = Defaults {
            metadata: secs(60),
            list: Duration::ZERO,
            negative: secs(5),
        };
        let policy = Policy::new(
            defaults,
            vec![
                Rule {
                    bucket: "lake".into(),
                    list_ttl: Some(secs(10)),
                    ..Rule::default()
                },
                Rule {
                    bucket: "lake".into(),
                    prefix: "tables/data/".into(),
                    immutable: true,
                    ..Rule::default()
                },
            ],
            None,
        );
        assert_eq!(
            policy.metadata("lake", "tables/data/f.parquet").ttl,
            FOREVER
        );
        assert!(policy.metadata("lake", "tables/data/f.parquet").immutable);
        assert_eq!(policy.metadata("lake", "tables/meta.json").ttl, secs(60));
        assert_eq!(policy.metadata("other", "tables/data/x").ttl, secs(60));
        assert_eq!(policy.list_ttl("lake", "tables/"), secs(10));
        assert_eq!(policy.list_ttl("other", ""), Duration::ZERO);
        assert_eq!(policy.negative_ttl("lake", "x"), secs(5));
        assert!(policy.caches_listings() && policy.caches_misses() && policy.caches_metadata());
    }

    #[test]
    fn an_unhealthy_event_stream_holds_everything_mutable_to_the_fallback() {
        let defaults = Defaults {
            metadata: secs(3600),
            list: secs(3600),
            negative: secs(3600),
        };
        let rules = vec![Rule {
            bucket: "b".into(),
            prefix: "data/".into(),
            immutable: true,
            ..Rule::default()
        }];
        let policy = Policy::new(defaults, rules, Some(EventFallback { ttl: secs(60) }));
        let mutable = policy.metadata("b", "k");
        let immutable = policy.metadata("b", "data/k");
        assert!(!policy.events_healthy(), "unhealthy until the first event");
        assert_eq!(policy.max_age(mutable), secs(60));
        assert_eq!(policy.max_age(immutable), FOREVER);
        assert_eq!(policy.list_ttl("b", ""), secs(60));
        assert!(policy.set_events_healthy(true));
        assert!(!policy.set_events_healthy(true));
        assert_eq!(policy.max_age(mutable), secs(3600));
        assert_eq!(policy.negative_ttl("b", "k"), secs(3600));
    }
}
