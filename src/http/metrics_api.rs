//! `/metrics`: the Prometheus exposition of [`crate::metrics`], with the
//! values only a scrape reads (tasks by status, the store's queue and WAL,
//! running tools, legacy sessions, approvals waiting, routes by phase).
//!
//! Who may read it: behind the same authentication as `/mcp`. Without
//! `[auth]` the listener is loopback-only and every caller is local; with
//! it, a credential needs the `metrics:read` scope (or `admin`), and a
//! loopback request without one is served only where `/mcp` would take it
//! for the local owner (`auth.local_owner = "loopback"`). Nothing exposed
//! names a task, an owner, a token or an argument.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};
use serde_json::Value;

use super::auth::{self, Challenge};
use super::sessions::BoundedSessions;
use crate::auth::{Caller, SCOPE_METRICS_READ};
use crate::metrics::{self, ApprovalsSnapshot, Snapshot};
use crate::tasks::FallbackReason;

/// How long a scrape waits for each count the store thread makes; past it
/// the count is left out of that scrape rather than delaying it.
const STORE_READ_LIMIT: Duration = Duration::from_secs(1);

/// The store's counts are read at most once per this interval, however
/// often (and however many at once) `/metrics` is asked for: a local
/// process hammering it cannot keep the store thread busy counting.
const STORE_COUNTS_EVERY: Duration = Duration::from_secs(1);

/// Counts read on the store thread, and when.
type StoreCounts = (
    Option<Vec<(&'static str, u64)>>,
    Option<u64>,
    Option<Vec<(&'static str, u64)>>,
);

#[derive(Clone)]
struct Scrape {
    gate: auth::Gate,
    sessions: Arc<BoundedSessions>,
    wal: std::path::PathBuf,
    /// The last store counts; the lock also makes concurrent scrapes wait
    /// for one read instead of each making its own.
    counts: Arc<tokio::sync::Mutex<Option<(Instant, StoreCounts)>>>,
}

/// The route, behind the same authentication as `/mcp`.
pub(super) fn routes<S: Clone + Send + Sync + 'static>(
    gate: auth::Gate,
    sessions: Arc<BoundedSessions>,
) -> Router<S> {
    let wal = gate.svc.store().wal_path().to_path_buf();
    let scrape = Scrape {
        gate: gate.clone(),
        sessions,
        wal,
        counts: Arc::default(),
    };
    Router::new()
        .route("/metrics", get(serve))
        .with_state(scrape)
        .layer(middleware::from_fn_with_state(gate, auth::authenticate))
}

async fn serve(
    State(s): State<Scrape>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
) -> Response {
    if let (Some(authenticator), Caller::Authenticated(principal)) = (&s.gate.auth, &caller) {
        let missing = principal.missing(&[SCOPE_METRICS_READ]);
        if !missing.is_empty() {
            return auth::challenge(
                &authenticator.settings(),
                Challenge::InsufficientScope {
                    needed: vec![SCOPE_METRICS_READ.to_string()],
                    missing: missing.iter().map(|m| m.to_string()).collect(),
                },
                Value::Null,
            );
        }
    }
    let text = metrics::get().render(snapshot(&s).await);
    // Prometheus asks for OpenMetrics; anything that does not gets the
    // classic text format it can parse.
    let openmetrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    match openmetrics {
        true => ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], text).into_response(),
        false => (
            [(header::CONTENT_TYPE, metrics::CLASSIC_CONTENT_TYPE)],
            metrics::classic_text(&text),
        )
            .into_response(),
    }
}

async fn snapshot(s: &Scrape) -> Snapshot {
    let svc = &s.gate.svc;
    let store = svc.store();
    let store_disabled = store.disabled_reason().is_some();
    let (tasks_by_status, tasks_retained, routes_by_phase) = if store_disabled {
        (None, None, None)
    } else {
        store_counts(s).await
    };
    let f = svc.fallbacks();
    let now = store.clock().now_ms();
    let approvals = svc.approvals().map(|a| match a.gate() {
        Some(gate) => {
            let (pending, oldest) = gate.pending_since(now);
            ApprovalsSnapshot {
                pending: pending as u64,
                oldest_pending_secs: oldest.map_or(0.0, |o| (now - o).max(0) as f64 / 1000.0),
                disabled: false,
            }
        }
        None => ApprovalsSnapshot {
            disabled: true,
            ..ApprovalsSnapshot::default()
        },
    });
    Snapshot {
        tasks_by_status,
        tasks_retained,
        store_disabled,
        queue_depth: store.queued() as u64,
        queue_capacity: store.queue_capacity() as u64,
        wal_bytes: std::fs::symlink_metadata(&s.wal).map_or(0, |m| m.len()),
        task_reads: store.task_reads(),
        polls_held: svc.early_polls().0,
        polls_answered_from_memory: svc.early_polls().1,
        tools_running: svc.running_count() as u64,
        runs_started: svc.runs_started(),
        fallbacks: FallbackReason::ALL
            .into_iter()
            .map(|r| (r.as_str(), f.get(r)))
            .collect(),
        legacy_sessions: Some(s.sessions.open().await as u64),
        approvals,
        routes_by_phase,
    }
}

/// Tasks by status, rows retained and routes by phase, read afresh only
/// when the last read is older than [`STORE_COUNTS_EVERY`].
async fn store_counts(s: &Scrape) -> StoreCounts {
    let mut last = s.counts.lock().await;
    if let Some((at, counts)) = last.as_ref()
        && at.elapsed() < STORE_COUNTS_EVERY
    {
        return counts.clone();
    }
    let store = s.gate.svc.store();
    let counts = (
        within_stats(store.status_counts()).await,
        within_stats(store.stats()).await.map(|s| s.retained),
        within_stats(store.route_counts())
            .await
            .map(|c| c.by_phase()),
    );
    *last = Some((Instant::now(), counts.clone()));
    counts
}

/// A count from the store thread, or nothing when it does not come within
/// [`STORE_READ_LIMIT`].
async fn within_stats<T, E>(count: impl std::future::Future<Output = Result<T, E>>) -> Option<T> {
    tokio::time::timeout(STORE_READ_LIMIT, count)
        .await
        .ok()
        .and_then(Result::ok)
}

/// Counts every HTTP response by method, path and status
/// (`taskgate_http_requests_total`); the outermost layer.
pub(super) async fn count_requests(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = metrics::path_class(request.uri().path());
    let response = next.run(request).await;
    metrics::get().http_request(method.as_str(), path, response.status().as_u16());
    response
}
