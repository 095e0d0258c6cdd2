//! What Larder tells about itself: [`metrics`] (OpenTelemetry instruments on a Prometheus
//! endpoint and OTLP, with the dollar figures) and [`traces`] (logs and slow-request traces).
//!
//! A leaf of the crate: it depends on the shared model's types (for labels) and on nothing that
//! serves requests; what it observes of the fleet, the upstream or the tiers is handed to it as
//! callbacks by whoever composes them.

pub mod labels;
pub mod metrics;
pub mod traces;
