//! The fronts: what listens, and what each listener answers.
//!
//! - [`server`]: the listeners (S3, admin, peer) with their connection bounds, and the start-up
//!   that builds the read path, the upstream and the fleet and hands them to the routes.
//! - [`routes`]: the S3 API: authenticate, then a cached GET/HEAD through the read path, or a
//!   pass-through to the upstream; [`form_upload`]: browser-form POST uploads.
//! - [`admin`]: metrics, health, the status page, warm-up and fleet routes.
//! - [`peer`]: what this replica serves the other replicas of its fleet.
//! - [`tls`]: certificates for the S3 listener, reloaded as they change.
//! - [`handler`]: the service that hands each request of the S3 and peer listeners to their
//!   one handler.

pub mod admin;
pub mod form_upload;
pub mod handler;
pub mod peer;
pub mod routes;
pub mod server;
pub mod tls;
