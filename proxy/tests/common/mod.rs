//! What the in-process tests share.

use std::time::Duration;

use larder::upstream::forward::Forwarder;

/// A pass-through to a loopback port nothing listens on (the discard port): for tests that send
/// only cacheable reads, so a request passed through by mistake fails instead of reaching
/// anything.
pub(crate) fn forwarder_to_nowhere() -> Forwarder {
    Forwarder::new(
        Some("http://127.0.0.1:9"),
        "us-east-1",
        true,
        None,
        (Duration::from_secs(1), Duration::from_secs(1)),
        None,
    )
    .expect("a forwarder to a loopback URL builds")
}
