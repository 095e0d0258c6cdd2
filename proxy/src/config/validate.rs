//! Range checks on a loaded configuration: each names the offending option.

use super::{Config, ConfigError};
use crate::auth::AuthMode;

impl Config {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field, problem: &str| {
            Err(ConfigError::Invalid {
                field,
                problem: problem.to_owned(),
            })
        };
        if self.block_size.0 < 4096 || self.block_size.0 > (1 << 30) {
            return invalid("block_size", "must be between 4KiB and 1GiB");
        }
        // From 256 MiB up, a sixteenth of the tier holds blocks its main part let go, and the
        // rest must hold a block.
        if cache_core::MemoryTier::<()>::largest_value(self.memory_capacity.0) < self.block_size.0 {
            return invalid(
                "memory_capacity",
                "must hold at least one block (block_size), in fifteen sixteenths of it from 256MiB up",
            );
        }
        if self.read_window == 0 || self.read_window > 64 {
            return invalid("read_window", "must be between 1 and 64");
        }
        if self.response_buffer.0 < self.block_size.0 {
            return invalid(
                "response_buffer",
                "must hold at least one block (block_size)",
            );
        }
        if self.max_connections == 0 {
            return invalid("max_connections", "must be positive");
        }
        if self.client_header_timeout.0.is_zero() {
            return invalid("client_header_timeout", "must be positive");
        }
        if self.client_idle_timeout.0.is_zero() {
            return invalid("client_idle_timeout", "must be positive");
        }
        if self.client_max_streams == 0 {
            return invalid("client_max_streams", "must be positive");
        }
        if self.upstream_concurrency == 0 || self.upstream_concurrency > 4096 {
            return invalid("upstream_concurrency", "must be between 1 and 4096");
        }
        if self.metadata_capacity == 0 {
            return invalid("metadata_capacity", "must be positive");
        }
        if self.upstream_idle_timeout.0.is_zero() {
            return invalid("upstream_idle_timeout", "must be positive");
        }
        let region = self.disk_region_size.0;
        if !((1 << 20)..=(256 << 20)).contains(&region) || !region.is_multiple_of(1 << 20) {
            return invalid("disk_region_size", "must be 1MiB to 256MiB in whole MiB");
        }
        if self.disk_encryption_key_file.is_some() && self.disk_path.is_none() {
            return invalid(
                "disk_encryption_key_file",
                "is set but there is no disk tier to encrypt (disk_path)",
            );
        }
        if self.disk_encryption_previous_key_file.is_some()
            && self.disk_encryption_key_file.is_none()
        {
            return invalid(
                "disk_encryption_previous_key_file",
                "is set but there is no key to rotate to (disk_encryption_key_file)",
            );
        }
        if self.disk_path.is_some() && region <= self.block_size.0 {
            return invalid("disk_region_size", "must be larger than block_size");
        }
        if self.disk_path.is_some() && self.disk_capacity.0 < (1 << 20) + 2 * region {
            return invalid("disk_capacity", "must hold at least 2 regions plus 1MiB");
        }
        if self.disk_path.is_some() && self.disk_write_buffer.0 < 2 * self.block_size.0 {
            return invalid(
                "disk_write_buffer",
                "must hold at least two blocks (block_size)",
            );
        }
        if let Some(beat) = &self.events_heartbeat {
            if !self.expects_events() {
                return invalid(
                    "events_heartbeat",
                    "needs events_token_file or events_sqs_queue_url",
                );
            }
            if !beat
                .split_once('/')
                .is_some_and(|(b, k)| !b.is_empty() && !k.is_empty())
            {
                return invalid("events_heartbeat", "must be bucket/key");
            }
        }
        if let Some(url) = &self.events_sqs_queue_url {
            let queue = url.parse::<http::Uri>().ok().filter(|u| {
                matches!(u.scheme_str(), Some("http" | "https"))
                    && u.host().is_some()
                    && u.path().len() > 1
            });
            if queue.is_none() {
                return invalid(
                    "events_sqs_queue_url",
                    "must be http(s)://host/account/queue",
                );
            }
        }
        if self.events_max_silence.0.is_zero() {
            return invalid("events_max_silence", "must be positive");
        }
        if self.list_capacity.0 == 0 {
            return invalid("list_capacity", "must be positive");
        }
        if self.rules.iter().any(|r| r.bucket.is_empty()) {
            return invalid("rules", "every rule needs a bucket");
        }
        let mut seen = std::collections::HashSet::new();
        for p in &self.disk_partitions {
            for b in &p.buckets {
                if !seen.insert(b.as_str()) {
                    return invalid(
                        "disk_partitions",
                        &format!("bucket {b:?} is mapped to two partitions"),
                    );
                }
            }
        }
        let sources = usize::from(!self.fleet_peers.is_empty())
            + usize::from(self.fleet_peers_file.is_some())
            + usize::from(self.fleet_peers_dns.is_some());
        if sources > 1 {
            return invalid(
                "fleet_peers",
                "fleet_peers, fleet_peers_file and fleet_peers_dns are alternatives: set one",
            );
        }
        if sources == 1 && self.fleet_secret_file.is_none() {
            return invalid(
                "fleet_secret_file",
                "is required in a fleet: replicas sign their requests to each other with it",
            );
        }
        let fleet_tls = [
            &self.fleet_tls_cert,
            &self.fleet_tls_key,
            &self.fleet_tls_ca,
        ]
        .iter()
        .filter(|f| f.is_some())
        .count();
        if fleet_tls != 0 && fleet_tls != 3 {
            return invalid(
                "fleet_tls_cert",
                "fleet_tls_cert, fleet_tls_key and fleet_tls_ca must be set together",
            );
        }
        if self.fleet_tls_name.is_some() && fleet_tls == 0 {
            return invalid(
                "fleet_tls_name",
                "needs fleet_tls_cert, fleet_tls_key and fleet_tls_ca",
            );
        }
        if fleet_tls != 0 && sources == 0 {
            return invalid(
                "fleet_tls_cert",
                "is set but this replica is not in a fleet (fleet_peers, fleet_peers_file or fleet_peers_dns)",
            );
        }
        if self.fleet_refresh.0 < std::time::Duration::from_millis(100) {
            return invalid("fleet_refresh", "must be at least 100ms");
        }
        if self.fleet_peer_timeout.0.is_zero() {
            return invalid("fleet_peer_timeout", "must be positive");
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return invalid("tls_cert", "and tls_key must be set together");
        }
        if self.auth == AuthMode::Sigv4 && self.auth_credentials.is_none() {
            return invalid(
                "auth_credentials",
                "is required with auth = \"sigv4\" (the default): give a file of access_key_id:secret_access_key lines, or choose auth = \"none\" explicitly",
            );
        }
        if self.auth == AuthMode::None && !self.auth_policies.is_empty() {
            return invalid("auth_policies", "need auth = \"sigv4\"");
        }
        if let Err(e) = crate::auth::keys::check_policies(&self.auth_policies) {
            return invalid("auth_policies", &e.to_string());
        }
        if self.upstream_connect_timeout.0.is_zero() {
            return invalid("upstream_connect_timeout", "must be positive");
        }
        if self.upstream_first_byte_timeout.0.is_zero() {
            return invalid("upstream_first_byte_timeout", "must be positive");
        }
        if !(1..=10).contains(&self.upstream_max_attempts) {
            return invalid("upstream_max_attempts", "must be between 1 and 10");
        }
        if !(1..=16).contains(&self.upstream_fetch_pieces) {
            return invalid("upstream_fetch_pieces", "must be between 1 and 16");
        }
        if self.upstream_max_resumes > 100 {
            return invalid("upstream_max_resumes", "must be at most 100");
        }
        if !(0.0..1.0).contains(&self.upstream_hedge_quantile) {
            return invalid(
                "upstream_hedge_quantile",
                "must be at least 0 (off) and below 1",
            );
        }
        if self.prefetch_min_window == 0 || self.prefetch_min_window > self.prefetch_max_window {
            return invalid(
                "prefetch_min_window",
                "must be at least 1 and at most prefetch_max_window",
            );
        }
        if self.prefetch_max_window > 1024 {
            return invalid("prefetch_max_window", "must be at most 1024 blocks");
        }
        if self.prefetch_max_inflight == 0 {
            return invalid("prefetch_max_inflight", "must be positive");
        }
        if self.warm_concurrency == 0 || self.warm_concurrency > 256 {
            return invalid("warm_concurrency", "must be between 1 and 256");
        }
        if self.warm_rate.0 == 0 {
            return invalid("warm_rate", "must be positive");
        }
        if let Some(url) = &self.otlp_endpoint {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return invalid("otlp_endpoint", "must be an http:// or https:// URL");
            }
        }
        if self.otlp_interval.0.is_zero() {
            return invalid("otlp_interval", "must be positive");
        }
        if !(0.0..=1.0).contains(&self.trace_sample_ratio) {
            return invalid("trace_sample_ratio", "must be between 0 and 1");
        }
        let prices = [
            ("price_get_per_1000", self.price_get_per_1000),
            ("price_put_per_1000", self.price_put_per_1000),
            ("price_internet_per_gb", self.price_internet_per_gb),
            ("price_cross_region_per_gb", self.price_cross_region_per_gb),
            ("price_cross_az_per_gb", self.price_cross_az_per_gb),
        ];
        for (field, price) in prices {
            if !(price.is_finite() && price >= 0.0) {
                return invalid(field, "must be a price of zero or more");
            }
        }
        if let Some(url) = &self.upstream_endpoint {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return invalid("upstream_endpoint", "must be an http:// or https:// URL");
            }
        }
        Ok(())
    }
}
