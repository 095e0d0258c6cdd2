//! Who owns a block: rendezvous (highest random weight) hashing over the members a replica
//! currently sees.
//!
//! Every member scores every block key; the highest score owns it. A member that joins takes
//! over exactly the keys it now scores highest on (about 1/N of them), and one that leaves
//! hands each of its keys to that key's runner-up: no other key moves, and there is no ring of
//! virtual nodes to tune.

use std::sync::Arc;

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// One replica of the fleet, as this replica sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its peer address (`host:port`), exactly as the membership source names it: every
    /// replica must name a member the same way, since the name is what is hashed.
    pub name: Arc<str>,
    /// Its zone, as it reports it; `None` if it has none.
    pub zone: Option<Arc<str>>,
    seed: u64,
}

impl Member {
    /// A member called `name` in `zone`.
    pub fn new(name: &str, zone: Option<&str>) -> Self {
        Self {
            name: name.into(),
            zone: zone.map(Arc::from),
            seed: xxh3_64(name.as_bytes()),
        }
    }

    fn score(&self, key: u64) -> u64 {
        xxh3_64_with_seed(&key.to_le_bytes(), self.seed)
    }
}

/// The hash a block is owned by: bucket, key and block index, not the ETag, so that a replica
/// that has not yet learnt an object's ETag (a cold read) still knows where to ask. Versions of
/// one key share owners; the owner's cache key still names the ETag.
pub fn block_key(bucket: &str, key: &str, index: u64) -> u64 {
    let mut buf = Vec::with_capacity(16 + bucket.len() + key.len());
    for part in [bucket, key] {
        buf.extend_from_slice(&(part.len() as u32).to_le_bytes());
        buf.extend_from_slice(part.as_bytes());
    }
    buf.extend_from_slice(&index.to_le_bytes());
    xxh3_64(&buf)
}

/// Which members may own a block for this replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scope {
    /// Members in this replica's zone: blocks never cross zones (each zone fetches a block from
    /// S3 once), since cross-zone traffic is billed and S3 in-region is not.
    #[default]
    Zone,
    /// Every member: each block leaves S3 once per fleet, at the price of cross-zone traffic.
    Fleet,
}

/// The members this replica sees, itself included, and which of them it is.
#[derive(Debug, Clone)]
pub struct View {
    /// Candidates for ownership, in name order, this replica among them.
    candidates: Vec<Member>,
    /// Every member seen (all zones), in name order.
    members: Vec<Member>,
    me: Arc<str>,
}

impl View {
    /// The view of `me` among `others` (`me` may be among them too), owning within `scope`.
    pub fn new(me: Member, others: impl IntoIterator<Item = Member>, scope: Scope) -> Self {
        let mut members: Vec<Member> = others.into_iter().filter(|m| m.name != me.name).collect();
        members.push(me.clone());
        members.sort_by(|a, b| a.name.cmp(&b.name));
        let candidates = members
            .iter()
            .filter(|m| scope == Scope::Fleet || m.zone == me.zone)
            .cloned()
            .collect();
        Self {
            candidates,
            members,
            me: me.name,
        }
    }

    /// The member owning `key`, or `None` when it is this replica.
    pub fn owner(&self, key: u64) -> Option<&Member> {
        let best = self
            .candidates
            .iter()
            .max_by_key(|m| (m.score(key), std::cmp::Reverse(&m.name)))?;
        (best.name != self.me).then_some(best)
    }

    /// This replica's name.
    pub fn me(&self) -> &str {
        &self.me
    }

    /// Every member seen, this replica included.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// Members that may own blocks for this replica.
    pub fn candidates(&self) -> usize {
        self.candidates.len()
    }

    /// Whether `other` would place any key differently: same candidates, same owners.
    pub fn same_owners(&self, other: &View) -> bool {
        self.me == other.me
            && self.candidates.len() == other.candidates.len()
            && self
                .candidates
                .iter()
                .zip(&other.candidates)
                .all(|(a, b)| a.name == b.name)
    }

    /// The share of keys whose owner differs between `self` and `other`, over `samples` keys
    /// spread evenly through the hash space.
    pub fn moved_fraction(&self, other: &View, samples: u64) -> f64 {
        if samples == 0 {
            return 0.0;
        }
        let owner = |v: &View, k: u64| v.owner(k).map_or_else(|| v.me.clone(), |m| m.name.clone());
        let step = u64::MAX / samples;
        let moved = (0..samples)
            .map(|i| xxh3_64(&(i.wrapping_mul(step)).to_le_bytes()))
            .filter(|&k| owner(self, k) != owner(other, k))
            .count();
        moved as f64 / samples as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(i: usize, zone: &str) -> Member {
        Member::new(&format!("10.0.0.{i}:9002"), Some(zone))
    }

    fn view_of(me: usize, n: usize, scope: Scope) -> View {
        View::new(member(me, "a"), (0..n).map(|i| member(i, "a")), scope)
    }

    #[test]
    fn every_replica_agrees_on_the_owner() {
        let views: Vec<View> = (0..5).map(|me| view_of(me, 5, Scope::Zone)).collect();
        for k in 0..2000u64 {
            let key = block_key("b", "k", k);
            let named: Vec<String> = views
                .iter()
                .map(|v| {
                    v.owner(key)
                        .map_or_else(|| v.me().to_owned(), |m| m.name.to_string())
                })
                .collect();
            assert!(named.windows(2).all(|w| w[0] == w[1]), "{named:?}");
        }
    }

    #[test]
    fn keys_spread_evenly_and_a_join_moves_about_one_in_n() {
        let three = view_of(0, 3, Scope::Zone);
        let mut counts = std::collections::HashMap::new();
        for k in 0..30_000u64 {
            let owner = three
                .owner(block_key("bucket", "object", k))
                .map_or_else(|| three.me().to_owned(), |m| m.name.to_string());
            *counts.entry(owner).or_insert(0usize) += 1;
        }
        assert_eq!(counts.len(), 3);
        for (name, n) in &counts {
            assert!((9_000..11_000).contains(n), "{name} owns {n} of 30000");
        }
        let four = view_of(0, 4, Scope::Zone);
        let moved = three.moved_fraction(&four, 20_000);
        assert!((0.22..0.28).contains(&moved), "moved {moved}");
        // Only keys the newcomer took moved: every other key kept its owner.
        for k in 0..5_000u64 {
            let key = block_key("b", "k", k);
            let before = three.owner(key).map(|m| m.name.clone());
            let after = four.owner(key).map(|m| m.name.clone());
            if before != after {
                assert_eq!(after.as_deref(), Some("10.0.0.3:9002"));
            }
        }
        assert!(four.moved_fraction(&four, 1000) == 0.0);
    }

    #[test]
    fn a_leave_moves_only_the_leavers_keys() {
        let four = view_of(0, 4, Scope::Zone);
        let three = View::new(
            member(0, "a"),
            [0, 1, 3].into_iter().map(|i| member(i, "a")),
            Scope::Zone,
        );
        for k in 0..5_000u64 {
            let key = block_key("b", "k", k);
            let before = four.owner(key).map(|m| m.name.to_string());
            if before.as_deref() != Some("10.0.0.2:9002") {
                assert_eq!(before, three.owner(key).map(|m| m.name.to_string()));
            }
        }
    }

    #[test]
    fn zone_scope_keeps_blocks_in_the_zone_and_fleet_scope_does_not() {
        let others = [member(1, "a"), member(2, "b"), member(3, "b")];
        let zoned = View::new(member(0, "a"), others.clone(), Scope::Zone);
        let fleet = View::new(member(0, "a"), others, Scope::Fleet);
        assert_eq!(zoned.candidates(), 2);
        assert_eq!(fleet.candidates(), 4);
        assert_eq!(zoned.members().len(), 4);
        let mut crossed = 0;
        for k in 0..2_000u64 {
            let key = block_key("b", "k", k);
            if let Some(m) = zoned.owner(key) {
                assert_eq!(m.zone.as_deref(), Some("a"));
            }
            crossed += usize::from(
                fleet
                    .owner(key)
                    .is_some_and(|m| m.zone.as_deref() == Some("b")),
            );
        }
        assert!(crossed > 500, "fleet scope uses the other zone: {crossed}");
    }

    #[test]
    fn alone_a_replica_owns_everything() {
        let v = View::new(member(0, "a"), [], Scope::Zone);
        assert!(v.owner(block_key("b", "k", 0)).is_none());
        assert!(v.same_owners(&view_of(0, 1, Scope::Zone)));
        assert!(!v.same_owners(&view_of(0, 2, Scope::Zone)));
    }

    #[test]
    fn the_owner_key_separates_fields() {
        assert_ne!(block_key("ab", "c", 0), block_key("a", "bc", 0));
        assert_ne!(block_key("a", "b", 0), block_key("a", "b", 1));
    }
}
