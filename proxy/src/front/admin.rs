//! The admin listener: `/healthz`, `/readyz`, `/metrics`, and a live status page at `/` fed by
//! `/status.json`; warm-up, access-profile, log-filter and fleet routes behind the admin token;
//! S3 event notifications (`POST /v1/events`, [`crate::freshness::events`]) behind the events
//! token.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse};
use axum::routing::get;
use serde::Serialize;
use subtle::ConstantTimeEq;

use crate::freshness::events::Notification;
use crate::freshness::sns::{SnsConfirmer, SnsError};
use crate::freshness::Freshness;
use crate::read::blocks::BlockStore;
use crate::telemetry::labels::EventOutcome;
use crate::telemetry::metrics::{Metrics, Snapshot, UpstreamHealth};
use crate::telemetry::traces::LogFilter;
use crate::units::HumanDuration;
use crate::warm::profile::Profiler;
use crate::warm::{Progress, WarmError, WarmRequest, Warmer};

/// What the admin endpoints report on.
pub struct AdminState {
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Blocks, for tier gauges.
    pub blocks: Arc<BlockStore>,
    /// Warm-up jobs.
    pub warmer: Arc<Warmer>,
    /// The access profile `/profile` records (the S3 front reports each read to it).
    pub profile: Arc<Profiler>,
    /// The fleet, if this replica is part of one.
    pub fleet: Option<Arc<crate::fleet::Fleet>>,
    /// Set once the S3 listener accepts connections.
    pub ready: AtomicBool,
    /// Who may use the routes that act or reveal.
    pub access: AdminAccess,
    /// What S3 events drop, and the event stream's health.
    pub freshness: Arc<Freshness>,
    /// The token S3 event notifications must carry; `None` refuses them all.
    pub events: Option<AdminAccess>,
    /// Confirms SNS subscriptions to the events route.
    pub sns: SnsConfirmer,
    /// The log filter `/log` changes; `None` where this process installed no logger (tests).
    pub log: Option<LogFilter>,
}

/// Who may call the admin routes that act or reveal: warm-up jobs (which fetch, list buckets
/// and cancel other jobs), the access profile (the keys and ranges clients read), the log
/// filter and the fleet's view.
#[derive(Clone)]
pub enum AdminAccess {
    /// Callers must present this bearer token.
    Token(Arc<[u8]>),
    /// No token is configured: only a loopback admin listener serves these routes.
    LoopbackOnly {
        /// Whether the admin listener is bound to a loopback address.
        loopback: bool,
    },
}

/// Shortest admin token accepted.
pub const MIN_TOKEN_LEN: usize = 16;

impl AdminAccess {
    /// The token from `path` (surrounding whitespace trimmed, at least [`MIN_TOKEN_LEN`] bytes).
    pub fn from_file(path: &std::path::Path) -> Result<Self, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        let token = bytes.trim_ascii();
        if token.len() < MIN_TOKEN_LEN {
            return Err(format!(
                "{}: the token must be at least {MIN_TOKEN_LEN} bytes",
                path.display()
            ));
        }
        Ok(AdminAccess::Token(token.into()))
    }

    fn allows(&self, headers: &http::HeaderMap) -> Result<(), (StatusCode, &'static str)> {
        match self {
            AdminAccess::LoopbackOnly { loopback: true } => Ok(()),
            AdminAccess::LoopbackOnly { loopback: false } => Err((
                StatusCode::FORBIDDEN,
                "this route needs admin_token_file when the admin listener is not on loopback",
            )),
            AdminAccess::Token(token) => match presented(headers) {
                Some(p) if p.len() == token.len() && bool::from(p.ct_eq(token)) => Ok(()),
                _ => Err((StatusCode::UNAUTHORIZED, "a valid bearer token is required")),
            },
        }
    }
}

/// The token a request presents: `Authorization: Bearer <token>`, or HTTP Basic credentials
/// whose password is the token (the user is not checked), which is how SNS authenticates to
/// an HTTPS subscription whose URL carries them.
fn presented(headers: &http::HeaderMap) -> Option<Vec<u8>> {
    use base64::Engine;
    let value = headers.get(header::AUTHORIZATION)?.as_bytes();
    if let Some(token) = value.strip_prefix(b"Bearer ") {
        return Some(token.to_vec());
    }
    let encoded = value.strip_prefix(b"Basic ")?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    let colon = decoded.iter().position(|&b| b == b':')?;
    Some(decoded[colon + 1..].to_vec())
}

/// Refuse callers [`AdminAccess`] does not allow.
async fn guard(
    State(s): State<Arc<AdminState>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    match s.access.allows(request.headers()) {
        Ok(()) => next.run(request).await,
        Err((status, message)) => refused(status, message),
    }
}

/// A caller refused: the error, and what to present next time.
fn refused(status: StatusCode, message: &str) -> axum::response::Response {
    let mut response = json_error(status, message.to_owned());
    if status == StatusCode::UNAUTHORIZED {
        // Basic too: SNS sends the credentials of a subscription URL only when challenged.
        let headers = response.headers_mut();
        headers.insert(
            header::WWW_AUTHENTICATE,
            http::HeaderValue::from_static("Bearer"),
        );
        headers.append(
            header::WWW_AUTHENTICATE,
            http::HeaderValue::from_static("Basic realm=\"larder\""),
        );
    }
    response
}

/// The admin router: health, metrics and status open to whoever reaches the listener; warm-up
/// and fleet routes behind [`AdminAccess`].
pub fn router(state: Arc<AdminState>) -> axum::Router {
    let guarded = axum::Router::new()
        .route("/warm", get(warm_list).post(warm_start))
        .route("/warm/{id}", get(warm_get).delete(warm_cancel))
        .route("/fleet", get(fleet))
        .route("/fleet/owner", get(fleet_owner))
        .route("/log", get(log_get).put(log_set).delete(log_reset))
        .route(
            "/profile",
            get(profile_get).put(profile_start).delete(profile_stop),
        )
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), guard));
    axum::Router::new()
        .route("/", get(|| async { Html(STATUS_PAGE) }))
        .route("/status.json", get(status))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/v1/events", axum::routing::post(events))
        .merge(guarded)
        .with_state(state)
}

/// The log filter in force and the one at start.
async fn log_get(State(s): State<Arc<AdminState>>) -> axum::response::Response {
    match &s.log {
        Some(log) => json(
            StatusCode::OK,
            &serde_json::json!({ "filter": log.current(), "at_start": log.initial() }),
        ),
        None => no_log_filter(),
    }
}

/// Longest a temporary log filter (`PUT /log?for=`) or a timed profile recording may last.
const MAX_FOR: Duration = Duration::from_secs(7 * 24 * 3600);

/// The `for` of a query (`for=10m`): how long a change lasts, if given; 1 s to 7 days.
fn lasting(query: &[(String, String)]) -> Result<Option<Duration>, String> {
    query
        .iter()
        .find(|(name, _)| name == "for")
        .map(|(_, value)| match value.parse::<HumanDuration>() {
            Ok(HumanDuration(d)) if !d.is_zero() && d <= MAX_FOR => Ok(d),
            _ => Err(format!(
                "for={value}: give a duration from 1s to 7d, such as 10m"
            )),
        })
        .transpose()
}

fn query_of(uri: &axum::http::Uri) -> Vec<(String, String)> {
    form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

/// Put the filter of the body (`RUST_LOG`'s syntax) in force; one that does not parse is
/// refused (400) and the one in force kept. With `?for=10m`, the filter at start comes back
/// after that long, unless another change came first: debug lines left on by a forgotten
/// session cost CPU on every request.
async fn log_set(
    State(s): State<Arc<AdminState>>,
    uri: axum::http::Uri,
    body: String,
) -> axum::response::Response {
    let Some(log) = &s.log else {
        return no_log_filter();
    };
    match lasting(&query_of(&uri)) {
        Ok(lasting) => set_log_filter(log, body.trim(), lasting),
        Err(e) => json_error(StatusCode::BAD_REQUEST, e),
    }
}

/// The access profile recorded so far; its `warm` is what `POST /warm` (and `larder warm
/// --profile`) takes.
async fn profile_get(State(s): State<Arc<AdminState>>) -> axum::response::Response {
    json(StatusCode::OK, &s.profile.report())
}

/// Start recording an access profile, dropping the one before. `?for=1h` stops it after that
/// long (unless another start came first); `?access_key=K` records that client key's reads
/// only. Any other parameter is refused: a misspelt filter would record every key's reads.
async fn profile_start(
    State(s): State<Arc<AdminState>>,
    uri: axum::http::Uri,
) -> axum::response::Response {
    let query = query_of(&uri);
    if let Some((name, _)) = query
        .iter()
        .find(|(name, _)| name != "for" && name != "access_key")
    {
        return json_error(
            StatusCode::BAD_REQUEST,
            format!("unknown parameter {name:?}: take for and access_key"),
        );
    }
    let lasting = match lasting(&query) {
        Ok(lasting) => lasting,
        Err(e) => return json_error(StatusCode::BAD_REQUEST, e),
    };
    let access_key = query
        .into_iter()
        .find(|(name, _)| name == "access_key")
        .map(|(_, key)| key);
    let start = s.profile.start(access_key.clone());
    tracing::info!(access_key = ?access_key, lasting = ?lasting, "access profile recording started");
    if let Some(lasting) = lasting {
        let profile = s.profile.clone();
        tokio::spawn(async move {
            tokio::time::sleep(lasting).await;
            if profile.stop_if(start) {
                tracing::info!("access profile recording ran out");
            }
        });
    }
    json(StatusCode::OK, &s.profile.report())
}

/// Stop recording; the profile is kept (and returned) until the next start.
async fn profile_stop(State(s): State<Arc<AdminState>>) -> axum::response::Response {
    if s.profile.stop() {
        tracing::info!("access profile recording stopped");
    }
    json(StatusCode::OK, &s.profile.report())
}

/// Put the filter at start back in force.
async fn log_reset(State(s): State<Arc<AdminState>>) -> axum::response::Response {
    match &s.log {
        Some(log) => set_log_filter(log, log.initial(), None),
        None => no_log_filter(),
    }
}

fn set_log_filter(
    log: &LogFilter,
    filter: &str,
    lasting: Option<Duration>,
) -> axum::response::Response {
    let (was, change) = match log.set(filter) {
        Ok(changed) => changed,
        Err(e) => return json_error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    // At warn, so that the change shows whatever the new filter lets through.
    tracing::warn!(filter, was, lasting = ?lasting, "log filter changed");
    if let Some(lasting) = lasting {
        let log = log.clone();
        tokio::spawn(async move {
            tokio::time::sleep(lasting).await;
            if log.reset_after(change) {
                tracing::warn!(
                    filter = log.initial(),
                    "log filter ran out; back to the one at start"
                );
            }
        });
    }
    let lasting = lasting.map(|d| HumanDuration(d).to_string());
    json(
        StatusCode::OK,
        &serde_json::json!({ "filter": filter, "was": was, "for": lasting }),
    )
}

fn no_log_filter() -> axum::response::Response {
    json_error(
        StatusCode::NOT_FOUND,
        "this process installed no log filter".to_owned(),
    )
}

fn json(status: StatusCode, value: &impl Serialize) -> axum::response::Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_string(value).unwrap_or_default(),
    )
        .into_response()
}

fn json_error(status: StatusCode, message: String) -> axum::response::Response {
    json(status, &serde_json::json!({ "error": message }))
}

/// An S3 event notification (MinIO's webhook, S3 through SNS): drop what it says changed, or
/// confirm the SNS subscription it asks for. The body is at most axum's default 2 MB.
async fn events(
    State(s): State<Arc<AdminState>>,
    headers: http::HeaderMap,
    body: axum::body::Bytes,
) -> axum::response::Response {
    let Some(access) = &s.events else {
        let message = "S3 events need events_token_file";
        return json_error(StatusCode::FORBIDDEN, message.to_owned());
    };
    if let Err((status, message)) = access.allows(&headers) {
        return refused(status, message);
    }
    match crate::freshness::events::parse(&body) {
        Ok(Notification::Changes(changes)) => {
            s.freshness.apply(&changes).await;
            json(
                StatusCode::OK,
                &serde_json::json!({ "changes": changes.len() }),
            )
        }
        Ok(Notification::ConfirmSubscription {
            topic,
            subscribe_url,
        }) => match s.sns.confirm(&subscribe_url).await {
            Ok(()) => {
                tracing::info!(%topic, "confirmed the SNS subscription");
                json(StatusCode::OK, &serde_json::json!({ "confirmed": topic }))
            }
            Err(e) => {
                tracing::warn!(%topic, error = %e, "SNS subscription not confirmed");
                let status = match e {
                    SnsError::Refused(_) => StatusCode::FORBIDDEN,
                    SnsError::Failed(_) => StatusCode::BAD_GATEWAY,
                };
                json_error(status, e.to_string())
            }
        },
        Err(e) => {
            s.metrics
                .event(EventOutcome::Malformed, std::time::Duration::ZERO);
            json_error(StatusCode::BAD_REQUEST, e.to_string())
        }
    }
}

async fn warm_start(
    State(s): State<Arc<AdminState>>,
    body: axum::body::Bytes,
) -> impl IntoResponse {
    let request: WarmRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return json_error(
                StatusCode::BAD_REQUEST,
                format!("invalid warm request: {e}"),
            )
        }
    };
    match s.warmer.start(request) {
        Ok(progress) => json(StatusCode::ACCEPTED, &progress),
        Err(e @ WarmError::Invalid(_)) => json_error(StatusCode::BAD_REQUEST, e.to_string()),
        Err(e @ WarmError::Busy) => json_error(StatusCode::TOO_MANY_REQUESTS, e.to_string()),
    }
}

/// The fleet as this replica sees it.
async fn fleet(State(s): State<Arc<AdminState>>) -> impl IntoResponse {
    let Some(fleet) = &s.fleet else {
        return json_error(StatusCode::NOT_FOUND, "not part of a fleet".into());
    };
    let view = fleet.view();
    let members: Vec<_> = view
        .members()
        .iter()
        .map(|m| serde_json::json!({ "name": &*m.name, "zone": m.zone.as_deref() }))
        .collect();
    json(
        StatusCode::OK,
        &serde_json::json!({
            "me": view.me(),
            "members": members,
            "owners": view.candidates(),
            "changes": fleet.changes(),
            "last_moved": fleet.last_moved(),
            // Listed but not shared with, and why: what an operator needs when the members
            // above are fewer than the replicas (a refused certificate, a wrong secret).
            "absent": &*fleet.absent(),
        }),
    )
}

/// Which replica owns block `index` of `bucket`/`key` (`?bucket=&key=&index=`).
async fn fleet_owner(State(s): State<Arc<AdminState>>, uri: axum::http::Uri) -> impl IntoResponse {
    let Some(fleet) = &s.fleet else {
        return json_error(StatusCode::NOT_FOUND, "not part of a fleet".into());
    };
    let params: std::collections::HashMap<String, String> =
        form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
            .into_owned()
            .collect();
    let (Some(bucket), Some(key), Some(Ok(index))) = (
        params.get("bucket"),
        params.get("key"),
        params.get("index").map(|i| i.parse::<u64>()),
    ) else {
        return json_error(StatusCode::BAD_REQUEST, "give bucket, key and index".into());
    };
    let object = crate::model::ObjectId {
        bucket: bucket.as_str().into(),
        key: key.as_str().into(),
        version_id: None,
    };
    let view = fleet.view();
    let owner = fleet
        .owner(&object, index)
        .map_or_else(|| view.me().to_owned(), |o| o.to_string());
    json(StatusCode::OK, &serde_json::json!({ "owner": owner }))
}

async fn warm_list(State(s): State<Arc<AdminState>>) -> impl IntoResponse {
    json(StatusCode::OK, &s.warmer.list())
}

async fn warm_get(
    State(s): State<Arc<AdminState>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> impl IntoResponse {
    match s.warmer.get(&id) {
        Some(p) => json(StatusCode::OK, &p),
        None => json_error(StatusCode::NOT_FOUND, format!("no warm-up job {id}")),
    }
}

async fn warm_cancel(
    State(s): State<Arc<AdminState>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> impl IntoResponse {
    match s.warmer.cancel(&id) {
        Some(p) => json(StatusCode::OK, &p),
        None => json_error(StatusCode::NOT_FOUND, format!("no warm-up job {id}")),
    }
}

/// The status page: self-contained HTML, CSS and script, no external resources.
const STATUS_PAGE: &str = include_str!("admin/status.html");

async fn readyz(State(s): State<Arc<AdminState>>) -> impl IntoResponse {
    if s.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting\n")
    }
}

async fn metrics(State(s): State<Arc<AdminState>>) -> impl IntoResponse {
    // moka updates its weighted size lazily; settle it so the gauges are exact.
    s.blocks.memory().sync().await;
    (
        [(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)],
        s.metrics.render(),
    )
}

/// The figures the status page shows, all read from the same metrics `/metrics` exports.
#[derive(Debug, Serialize)]
pub struct Status {
    uptime_seconds: u64,
    requests: u64,
    cacheable_requests: u64,
    request_hit_ratio: Option<f64>,
    served_bytes: u64,
    served_from_cache_bytes: u64,
    byte_hit_ratio: Option<f64>,
    coalesced: u64,
    ttfb_p50_ms: Option<f64>,
    ttfb_p99_ms: Option<f64>,
    dollars_direct: f64,
    dollars_upstream: f64,
    dollars_saved: f64,
    memory: Tier,
    disk: Option<Tier>,
    upstream_requests: u64,
    upstream_failures: u64,
    upstream_received_bytes: u64,
    upstream: UpstreamHealth,
    /// What each client key's requests would have cost and what the cache saved them
    /// (`larder_key_*`), the keys that saved the most first.
    keys: Vec<KeySaving>,
    /// Warm-up jobs still running.
    warm_jobs: Vec<Progress>,
    /// The S3 event stream, when events are expected.
    events: Option<EventStream>,
    /// The fleet, when this replica is part of one.
    fleet: Option<FleetStatus>,
}

/// The fleet as this replica sees it and what the others did for it: counts only, as the
/// replicas' addresses are for the token-guarded `/fleet`.
#[derive(Debug, Serialize)]
struct FleetStatus {
    /// Replicas answering this one's probes, itself included (`larder_fleet_members`).
    members: u64,
    /// Those that may own its blocks (`larder_fleet_owners`).
    owners: u64,
    /// Listed but left out at the last refresh: unreachable, refused, another block size.
    absent: u64,
    /// Blocks (and cold opens) owners answered this replica with, and their bytes.
    from_peers: u64,
    from_peers_bytes: u64,
    /// Those it answered the others with.
    to_peers: u64,
    to_peers_bytes: u64,
    /// Peer requests given up for S3 (`larder_peer_fallbacks_total`).
    fallbacks: u64,
}

impl FleetStatus {
    fn from_snapshot(snap: &Snapshot, absent: usize) -> Self {
        let peer = |direction: &str| {
            snap.sum(
                "larder_peer_requests_total",
                &[("direction", direction), ("outcome", "ok")],
            ) as u64
        };
        let bytes = |direction: &str| {
            snap.sum("larder_peer_bytes_total", &[("direction", direction)]) as u64
        };
        FleetStatus {
            members: snap.sum("larder_fleet_members", &[]) as u64,
            owners: snap.sum("larder_fleet_owners", &[]) as u64,
            absent: absent as u64,
            from_peers: peer("made"),
            from_peers_bytes: bytes("received"),
            to_peers: peer("served"),
            to_peers_bytes: bytes("sent"),
            fallbacks: snap.sum("larder_peer_fallbacks_total", &[]) as u64,
        }
    }
}

#[derive(Debug, Serialize)]
struct KeySaving {
    access_key: String,
    requests: u64,
    cached_requests: u64,
    dollars_direct: f64,
    dollars_saved: f64,
}

#[derive(Debug, Serialize)]
struct EventStream {
    /// Events arrive within `events_max_silence`.
    healthy: bool,
    /// Since the last event or heartbeat; `None` before the first.
    silence_seconds: Option<f64>,
}

#[derive(Debug, Serialize)]
struct Tier {
    capacity_bytes: u64,
    used_bytes: u64,
    entries: u64,
}

async fn status(State(s): State<Arc<AdminState>>) -> impl IntoResponse {
    s.blocks.memory().sync().await;
    let snap = s.metrics.snapshot();
    let running = s
        .warmer
        .list()
        .into_iter()
        .filter(|p| p.state == crate::warm::State::Running)
        .collect();
    let mut status = Status::from_snapshot(&snap, &s.metrics, s.blocks.disk().is_some(), running);
    status.events = s.freshness.expects_events().then(|| EventStream {
        healthy: s.freshness.healthy(),
        silence_seconds: s.freshness.silence().map(|d| d.as_secs_f64()),
    });
    status.fleet = s
        .fleet
        .as_ref()
        .map(|f| FleetStatus::from_snapshot(&snap, f.absent().len()));
    (
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_string(&status).unwrap_or_default(),
    )
}

fn ratio(part: f64, whole: f64) -> Option<f64> {
    (whole > 0.0).then(|| part / whole)
}

impl Status {
    fn from_snapshot(
        snap: &Snapshot,
        metrics: &Metrics,
        disk: bool,
        warm_jobs: Vec<Progress>,
    ) -> Self {
        let by_cache = snap.sum_by("larder_requests_total", "cache");
        let count = |results: &[&str]| -> f64 {
            results
                .iter()
                .map(|r| by_cache.get(*r).copied().unwrap_or(0.0))
                .sum()
        };
        let hits = count(&["hit-memory", "hit-disk"]);
        let cacheable = count(&["hit-memory", "hit-disk", "partial", "coalesced", "miss"]);
        let by_tier = snap.sum_by("larder_served_bytes_total", "tier");
        let tier = |t: &str| by_tier.get(t).copied().unwrap_or(0.0);
        let served = tier("memory") + tier("disk") + tier("upstream");
        let from_cache = tier("memory") + tier("disk");
        let by_status = snap.sum_by("larder_upstream_requests_total", "status");
        // Answers that are the upstream working as it should: success, not modified, not
        // found, precondition failed (the object changed), range not satisfiable.
        let failures: f64 = by_status
            .iter()
            .filter(|(code, _)| {
                !(code.starts_with('2') || matches!(code.as_str(), "304" | "404" | "412" | "416"))
            })
            .map(|(_, n)| n)
            .sum();
        let direct = snap.sum("larder_cost_direct_dollars_total", &[]);
        let upstream = snap.sum("larder_cost_upstream_dollars_total", &[]);
        let ms = |q| {
            snap.quantile("larder_request_ttfb_seconds", q)
                .map(|s| s * 1000.0)
        };
        let gauge = |name: &str| snap.sum(name, &[]) as u64;
        let by_key = |name: &str| snap.sum_by(name, "access_key");
        let (requests, cached) = (
            by_key("larder_key_requests_total"),
            by_key("larder_key_requests_cached_total"),
        );
        let (key_direct, key_saved) = (
            by_key("larder_key_cost_direct_dollars_total"),
            by_key("larder_key_cost_saved_dollars_total"),
        );
        let of =
            |m: &std::collections::BTreeMap<String, f64>, k: &str| m.get(k).copied().unwrap_or(0.0);
        let mut keys: Vec<KeySaving> = requests
            .keys()
            .map(|k| KeySaving {
                access_key: k.clone(),
                requests: of(&requests, k) as u64,
                cached_requests: of(&cached, k) as u64,
                dollars_direct: of(&key_direct, k),
                dollars_saved: of(&key_saved, k),
            })
            .collect();
        keys.sort_by(|a, b| b.dollars_saved.total_cmp(&a.dollars_saved));
        Status {
            uptime_seconds: metrics.uptime().as_secs(),
            requests: by_cache.values().sum::<f64>() as u64,
            cacheable_requests: cacheable as u64,
            request_hit_ratio: ratio(hits, cacheable),
            served_bytes: served as u64,
            served_from_cache_bytes: from_cache as u64,
            byte_hit_ratio: ratio(from_cache, served),
            coalesced: gauge("larder_singleflight_coalesced_total"),
            ttfb_p50_ms: ms(0.5),
            ttfb_p99_ms: ms(0.99),
            dollars_direct: direct,
            dollars_upstream: upstream,
            dollars_saved: direct - upstream,
            memory: Tier {
                capacity_bytes: gauge("larder_memory_capacity_bytes"),
                used_bytes: gauge("larder_memory_used_bytes"),
                entries: gauge("larder_memory_entries"),
            },
            disk: disk.then(|| Tier {
                capacity_bytes: gauge("larder_disk_capacity_bytes"),
                used_bytes: gauge("larder_disk_live_bytes"),
                entries: gauge("larder_disk_entries"),
            }),
            upstream_requests: by_status.values().sum::<f64>() as u64,
            upstream_failures: failures as u64,
            upstream_received_bytes: gauge("larder_upstream_received_bytes_total"),
            upstream: metrics.upstream_health(),
            keys,
            warm_jobs,
            events: None,
            fleet: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::UpstreamOutcome;
    use crate::s3::operation::Operation;
    use crate::telemetry::labels::{Source, XCache};
    use std::time::Duration;

    #[test]
    fn the_token_is_taken_as_a_bearer_token_or_a_basic_password_only() {
        use base64::Engine;
        let access = AdminAccess::Token(b"0123456789abcdef-token".as_slice().into());
        let with = |value: &str| {
            let mut headers = http::HeaderMap::new();
            headers.insert(header::AUTHORIZATION, value.parse().unwrap());
            access.allows(&headers).map_err(|(status, _)| status)
        };
        let basic = |credentials: &str| {
            let encoded = base64::engine::general_purpose::STANDARD.encode(credentials);
            with(&format!("Basic {encoded}"))
        };
        assert_eq!(with("Bearer 0123456789abcdef-token"), Ok(()));
        assert_eq!(basic("sns:0123456789abcdef-token"), Ok(()));
        // The password is what counts, with or without a user.
        assert_eq!(basic(":0123456789abcdef-token"), Ok(()));
        for refused in [
            basic("0123456789abcdef-token"),
            basic("0123456789abcdef-token:"),
            basic("sns:0123456789abcdef-toke"),
            with("Basic 0123456789abcdef-token"),
            with("Bearer 0123456789abcdef-toke"),
            with("0123456789abcdef-token"),
        ] {
            assert_eq!(refused, Err(StatusCode::UNAUTHORIZED));
        }
        assert_eq!(
            access.allows(&http::HeaderMap::new()).map_err(|(s, _)| s),
            Err(StatusCode::UNAUTHORIZED)
        );
    }

    #[test]
    fn status_figures_follow_the_metrics() {
        let m = Metrics::default();
        m.observe_memory(cache_core::MemoryTier::<u32>::new(1 << 20));
        let tallies: Vec<_> = ["quiet", "busy"]
            .into_iter()
            .map(|k| (k, Arc::new(crate::telemetry::metrics::KeyTally::default())))
            .collect();
        for cache in [XCache::HitMemory, XCache::HitMemory, XCache::Miss] {
            tallies[1].1.request(Operation::GetObject, cache);
        }
        tallies[0].1.request(Operation::GetObject, XCache::Miss);
        let observed = tallies.clone();
        m.observe_key_savings(move || {
            observed
                .iter()
                .map(|(k, t)| ((*k).to_owned(), t.clone()))
                .collect()
        });
        for _ in 0..3 {
            m.request(
                Operation::GetObject,
                None,
                200,
                XCache::HitMemory,
                Duration::from_millis(1),
            );
            m.served(Source::Memory, None, 100);
        }
        m.request(
            Operation::GetObject,
            None,
            200,
            XCache::Miss,
            Duration::from_millis(30),
        );
        m.served(Source::Upstream, None, 100);
        m.request(
            Operation::ListObjectsV2,
            None,
            200,
            XCache::Pass,
            Duration::from_millis(30),
        );
        m.upstream(
            Operation::GetObject,
            None,
            UpstreamOutcome::Http(206),
            Duration::ZERO,
        );
        m.upstream(
            Operation::GetObject,
            None,
            UpstreamOutcome::Http(503),
            Duration::ZERO,
        );
        m.upstream(
            Operation::HeadObject,
            None,
            UpstreamOutcome::Failed("timeout"),
            Duration::ZERO,
        );
        m.upstream(
            Operation::HeadObject,
            None,
            UpstreamOutcome::Http(404),
            Duration::ZERO,
        );
        let s = Status::from_snapshot(&m.snapshot(), &m, false, Vec::new());
        assert_eq!(s.requests, 5);
        assert_eq!(s.cacheable_requests, 4);
        assert_eq!(s.request_hit_ratio, Some(0.75));
        assert_eq!(s.byte_hit_ratio, Some(0.75));
        assert_eq!(s.upstream_requests, 4);
        assert_eq!(s.upstream_failures, 2);
        assert_eq!(s.memory.capacity_bytes, 1 << 20);
        // 4 GETs and a LIST asked of Larder; 2 GETs and 2 HEADs sent upstream.
        let expected = 4.0 * 0.0004 / 1000.0 + 0.005 / 1000.0 - 4.0 * 0.0004 / 1000.0;
        assert!(
            (s.dollars_saved - expected).abs() < 1e-12,
            "{}",
            s.dollars_saved
        );
        // The keys that saved the most first, each with its own figures.
        let keys: Vec<_> = s
            .keys
            .iter()
            .map(|k| (k.access_key.as_str(), k.requests, k.cached_requests))
            .collect();
        assert_eq!(keys, [("busy", 3, 2), ("quiet", 1, 0)]);
        assert!((s.keys[0].dollars_saved - 2.0 * 0.0004 / 1000.0).abs() < 1e-15);
        assert!((s.keys[1].dollars_direct - 0.0004 / 1000.0).abs() < 1e-15);
    }
}
