//! `/metrics`: the Prometheus exposition of [`crate::metrics`], with the
//! values read at the scrape (tasks by status, the store's queue and WAL,
//! running tools, legacy sessions, approvals waiting, routes by phase):
//! the daemon's status as `ops` reports it, the same report `taskgate
//! status` renders, never counted here.
//!
//! Who may read it: behind the same authentication as `/mcp`. Without
//! `[auth]` the listener is loopback-only and every caller is local; with
//! it, a credential needs the `metrics:read` scope (or `admin`), and a
//! loopback request without one is served only where `/mcp` would take it
//! for the local owner (`auth.local_owner = "loopback"`). Nothing exposed
//! names a task, an owner, a token or an argument.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};
use serde_json::Value;

use super::auth::{self, Challenge};
use crate::auth::{Caller, SCOPE_METRICS_READ};
use crate::metrics::{self, ApprovalsSnapshot, Snapshot};
use crate::ops::{Ops, StatusReport, StoreState, View};

#[derive(Clone)]
struct Scrape {
    gate: auth::Gate,
    /// The status every scrape renders (its store counts at most a second
    /// old: see `ops`).
    ops: Arc<Ops>,
}

/// The route, behind the same authentication as `/mcp`.
pub(super) fn routes<S: Clone + Send + Sync + 'static>(
    gate: auth::Gate,
    ops: Arc<Ops>,
) -> Router<S> {
    let scrape = Scrape {
        gate: gate.clone(),
        ops,
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
    let text = metrics::get().render(snapshot(&s.ops.status(View::Scrape).await));
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

/// The values a scrape shows, rendered from the ops status.
fn snapshot(r: &StatusReport) -> Snapshot {
    Snapshot {
        tasks_by_status: r.tasks_by_status.clone(),
        tasks_retained: r.tasks.map(|t| t.retained),
        store_disabled: matches!(r.store, StoreState::Disabled(_)),
        queue_depth: r.queue.depth as u64,
        queue_capacity: r.queue.capacity as u64,
        wal_bytes: r.wal_bytes,
        task_reads: r.task_reads,
        polls_held: r.polls_held,
        polls_answered_from_memory: r.polls_answered_from_memory,
        tools_running: r.running as u64,
        runs_started: r.runs_started,
        fallbacks: r.fallbacks_by_reason.clone(),
        legacy_sessions: r.legacy_sessions.map(|n| n as u64),
        // A disabled journal shows nothing waiting: nothing can be decided.
        approvals: r.approvals.as_ref().map(|a| ApprovalsSnapshot {
            pending: if a.enabled() {
                a.journal.pending as u64
            } else {
                0
            },
            oldest_pending_secs: a.oldest_pending_secs(),
            disabled: !a.enabled(),
        }),
        routes_by_phase: r.routes.as_ref().map(|c| c.by_phase()),
    }
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
