//! The values metric labels take, as types: each enum is one label's whole vocabulary, declared
//! once with the text Prometheus shows, so a call site cannot misspell a value or invent one the
//! dashboards do not know.

/// Declares a label enum: each variant with the text it is exported as.
macro_rules! label {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident => $text:literal,)+ }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vdoc])* $variant,)+
        }

        impl $name {
            /// Every value, in declaration order (counters start at zero for each).
            pub const ALL: &[$name] = &[$($name::$variant,)+];

            /// The label's value, as exported.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }

            /// The value's place in [`Self::ALL`], to find its bound series without hashing.
            pub const fn index(self) -> usize {
                self as usize
            }
        }
    };
}

label! {
    /// A file of client keys or their policies, read again when it changes.
    AuthFile {
        /// `auth_credentials`: the client keys.
        Credentials => "credentials",
        /// The configuration file, of which a reload applies `auth_policies`.
        Policies => "policies",
    }
}

impl AuthFile {
    /// The counter of the file's reloads, and the gauge of whether it is refused as it is now.
    pub const fn metric_names(self) -> (&'static str, &'static str) {
        match self {
            AuthFile::Credentials => (
                "larder.auth.credentials.reloads",
                "larder.auth.credentials.refused",
            ),
            AuthFile::Policies => (
                "larder.auth.policies.reloads",
                "larder.auth.policies.refused",
            ),
        }
    }
}

label! {
    /// Where a response's bytes (or, without a body, its metadata) were found: the `X-Cache`
    /// header and the `cache` label of `larder_requests_total`.
    XCache {
        /// Every block was in memory (or, without a body, the metadata was cached).
        HitMemory => "hit-memory",
        /// Every block was in memory or on disk, at least one on disk.
        HitDisk => "hit-disk",
        /// Some blocks were here, others fetched.
        Partial => "partial",
        /// The first missing block was already being fetched by another request.
        Coalesced => "coalesced",
        /// Fetched from the upstream (or, without a body, the metadata was).
        Miss => "miss",
        /// The first missing block is owned by another replica, which was asked.
        Peer => "peer",
        /// As `hit-memory`, with the object's metadata served stale (the upstream failing).
        StaleHitMemory => "stale-hit-memory",
        /// As `hit-disk`, with stale metadata.
        StaleHitDisk => "stale-hit-disk",
        /// As `partial`, with stale metadata.
        StalePartial => "stale-partial",
        /// As `coalesced`, with stale metadata.
        StaleCoalesced => "stale-coalesced",
        /// As `miss`, with stale metadata.
        StaleMiss => "stale-miss",
        /// As `peer`, with stale metadata.
        StalePeer => "stale-peer",
        /// An answer without a body from metadata served stale.
        Stale => "stale",
        /// Not cacheable: sent to the upstream as it came.
        Pass => "pass",
        /// Answered with an error.
        Error => "error",
    }
}

label! {
    /// Where the bytes of a block sent to a client came from (`tier` of
    /// `larder_served_bytes_total`).
    Source {
        /// The memory tier (or a flight that found the block there).
        Memory => "memory",
        /// The disk tier.
        Disk => "disk",
        /// The replica owning the block.
        Peer => "peer",
        /// The upstream.
        Upstream => "upstream",
    }
}

label! {
    /// A tier a block is looked up in (`tier` of `larder_cache_lookups_total`).
    Lookup {
        /// The memory tier.
        Memory => "memory",
        /// The brief copies of blocks fetched from their owner.
        PeerCopy => "peer-copy",
        /// The disk tier.
        Disk => "disk",
        /// Parts of blocks fetched on their own (a cold range much smaller than its block),
        /// in memory or on disk: a miss is a part fetched.
        Part => "part",
        /// Blocks nothing held whole, assembled from the pieces held here that tile them (an
        /// object read by its parts, then whole or by ranges): a hit only.
        Pieces => "pieces",
    }
}

label! {
    /// What became of a block read ahead could be (`outcome` of `larder_prefetch_blocks_total`).
    PrefetchBlock {
        /// Fetched ahead of the reader.
        Issued => "issued",
        /// Not fetched: `prefetch_max_inflight` read-aheads were running.
        SkippedBudget => "skipped_budget",
        /// Not fetched: every upstream slot was taken (demand reads come first).
        SkippedBusy => "skipped_busy",
    }
}

label! {
    /// What became of bytes read ahead (`outcome` of `larder_prefetch_bytes_total`).
    PrefetchBytes {
        /// Read by a client.
        Used => "used",
        /// Expired or evicted before anyone read them.
        Wasted => "wasted",
    }
}

label! {
    /// Why a fetched block was not written to the cache (`reason` of
    /// `larder_cache_writes_dropped_total`, beside the disk tier's own reasons).
    WriteDropped {
        /// A warm-up block the disk tier refused.
        WarmRejected => "warm_rejected",
        /// Begun by a peer, finished from S3: never checked whole against S3's bytes.
        MixedSource => "mixed_source",
        /// The fetch failed before the block was whole.
        FetchFailed => "fetch_failed",
    }
}

label! {
    /// Why a block found in a tier was refused (`reason` of `larder_cache_blocks_rejected_total`).
    Rejected {
        /// Not as long as the object's size and the block size say it must be.
        Length => "length",
    }
}

label! {
    /// What the per-prefix throttle did (`event` of `larder_upstream_throttle_total`).
    ThrottleEvent {
        /// A prefix was throttled for the first time (since its limit was last lifted): its
        /// requests are paced from now on.
        Limited => "limited",
        /// A paced prefix was throttled again: its rate was cut.
        Cut => "cut",
        /// A paced prefix grew to twice the rate it was throttled at: no longer paced.
        Lifted => "lifted",
        /// A request waited for its prefix's pace before it was sent.
        Delayed => "delayed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn distinct(values: impl IntoIterator<Item = &'static str>) -> bool {
        let values: Vec<_> = values.into_iter().collect();
        values.len() == values.iter().collect::<HashSet<_>>().len()
    }

    #[test]
    fn each_label_names_its_values_apart() {
        assert!(distinct(XCache::ALL.iter().map(|v| v.as_str())));
        assert!(distinct(Source::ALL.iter().map(|v| v.as_str())));
        assert!(distinct(Lookup::ALL.iter().map(|v| v.as_str())));
        assert!(distinct(PrefetchBlock::ALL.iter().map(|v| v.as_str())));
        assert!(distinct(PrefetchBytes::ALL.iter().map(|v| v.as_str())));
        assert!(distinct(WriteDropped::ALL.iter().map(|v| v.as_str())));
        assert!(distinct(ThrottleEvent::ALL.iter().map(|v| v.as_str())));
        assert_eq!(PrefetchBlock::ALL.len(), 3);
        assert_eq!(Source::Upstream.as_str(), "upstream");
    }
}

label! {
    /// What an S3 event notification did (`outcome` of `larder_events_total`).
    EventOutcome {
        /// Dropped cached metadata the event made stale.
        Applied => "applied",
        /// Larder already held the version the event announces.
        Unchanged => "unchanged",
        /// Nothing of the object was cached.
        NotCached => "not_cached",
        /// The notification was refused: its body was not an S3 event message.
        Malformed => "malformed",
    }
}

label! {
    /// What became of a change told to (or by) another replica (`outcome` of
    /// `larder_fleet_notices_total`).
    NoticeOutcome {
        /// Sent to a peer, which applied it.
        Sent => "sent",
        /// A peer could not be told (unreachable, refused): it falls back on its TTLs.
        Failed => "failed",
        /// Not sent: the queue of changes to tell was full.
        Dropped => "dropped",
        /// Received from a peer and applied here.
        Received => "received",
    }
}
