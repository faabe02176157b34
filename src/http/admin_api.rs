//! `/admin/v1/approvals`: the administrator's approval interface over HTTP,
//! served only when `[auth]` configures credentials. A caller presents an
//! MCP credential: `approvals:read` lists and shows proposals,
//! `approvals:decide` approves and rejects them, and the decider recorded
//! is that caller's identity (so `approvals.self_approval = "forbid"`
//! refuses an approval of one's own call). A loopback request without a
//! credential, which `/mcp` may take for the local owner, is never an
//! administrator here: any local process could send one. Refusals are the
//! same 401 and 403 challenges as on `/mcp`.
//!
//! Routes: `GET /admin/v1/approvals[?pending=true]`, `GET
//! /admin/v1/approvals/{id}`, `POST /admin/v1/approvals/{id}/approve`
//! (optional body `{"validForSecs": N}`) and `POST
//! /admin/v1/approvals/{id}/reject` (body `{"reason": "…"}`).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router, middleware};
use serde::Deserialize;
use serde_json::{Value, json};

use super::auth::{self, Challenge};
use super::respond;
use crate::auth::{Caller, SCOPE_APPROVALS_DECIDE, SCOPE_APPROVALS_READ};
use crate::mcp::screen::Refused;
use crate::ops::{Listing, Ops, OpsError};
use crate::tasks::{Decider, Decision};

/// The largest request body the API reads (a rejection reason is at most
/// 512 bytes).
const MAX_BODY_BYTES: usize = 8 * 1024;

#[derive(Clone)]
struct Api {
    gate: auth::Gate,
    /// Every request is an operation; this API only renders its result.
    ops: Arc<Ops>,
    body_read_timeout: Duration,
}

/// The routes, behind the same authentication as `/mcp`.
pub(super) fn routes<S: Clone + Send + Sync + 'static>(
    gate: auth::Gate,
    ops: Arc<Ops>,
    body_read_timeout: Duration,
) -> Router<S> {
    let api = Api {
        gate: gate.clone(),
        ops,
        body_read_timeout,
    };
    Router::new()
        .route("/admin/v1/approvals", get(list))
        .route("/admin/v1/approvals/{id}", get(show))
        .route("/admin/v1/approvals/{id}/approve", post(approve))
        .route("/admin/v1/approvals/{id}/reject", post(reject))
        .with_state(api)
        .layer(middleware::from_fn_with_state(gate, auth::authenticate))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ApproveBody {
    valid_for_secs: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RejectBody {
    reason: String,
}

/// A refusal, in the registry's error body (as `/mcp`'s refusals are),
/// with the wire code and HTTP status ops decided for it.
fn error(e: &OpsError) -> Response {
    let r = e.respond();
    let status = StatusCode::from_u16(r.http).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    respond::from_library(&Refused::new(r.wire, e.to_string(), Value::Null), status)
}

/// Whether the caller holds `scope`; else the refusal.
fn admit(api: &Api, caller: &Caller, scope: &'static str) -> Result<(), Box<Response>> {
    let Some(authenticator) = &api.gate.auth else {
        return Err(Box::new(error(&OpsError::NoCredentials)));
    };
    let settings = authenticator.settings();
    let Caller::Authenticated(principal) = caller else {
        return Err(Box::new(auth::challenge(
            &settings,
            Challenge::Missing,
            Value::Null,
        )));
    };
    let missing = principal.missing(&[scope]);
    if !missing.is_empty() {
        return Err(Box::new(auth::challenge(
            &settings,
            Challenge::InsufficientScope {
                needed: vec![scope.to_string()],
                missing: missing.iter().map(|s| s.to_string()).collect(),
            },
            Value::Null,
        )));
    }
    api.ops.approvals_set_up().map_err(|e| Box::new(error(&e)))
}

/// The answer to a listing or a decision: the proposals and the journal's
/// state, or the refusal.
fn answer(result: Result<Listing, OpsError>) -> Response {
    match result {
        Ok(l) => Json(json!({"proposals": l.proposals, "journal": l.journal})).into_response(),
        Err(e) => error(&e),
    }
}

async fn list(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    RawQuery(query): RawQuery,
) -> Response {
    if let Err(r) = admit(&api, &caller, SCOPE_APPROVALS_READ) {
        return *r;
    }
    let pending = match query.as_deref() {
        None | Some("") => false,
        Some("pending" | "pending=true" | "pending=1") => true,
        Some("pending=false" | "pending=0") => false,
        Some(other) => {
            return error(&OpsError::BadRequest(format!(
                "unknown query {other:?}; the one parameter is pending=true"
            )));
        }
    };
    // A disabled journal is refused here rather than listed as empty.
    answer(
        api.ops
            .approvals(None, pending)
            .and_then(Listing::require_enabled),
    )
}

async fn show(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Response {
    if let Err(r) = admit(&api, &caller, SCOPE_APPROVALS_READ) {
        return *r;
    }
    answer(api.ops.approvals(Some(&id), false))
}

/// The body of a decision, read within the body timeout and bound.
async fn body<T: for<'de> Deserialize<'de> + Default>(
    api: &Api,
    request: Request<Body>,
    required: bool,
) -> Result<T, OpsError> {
    let read = tokio::time::timeout(
        api.body_read_timeout,
        axum::body::to_bytes(request.into_body(), MAX_BODY_BYTES),
    )
    .await;
    let bytes = match read {
        Err(_) => return Err(OpsError::RequestTimeout("the body took too long".into())),
        Ok(Err(_)) => {
            return Err(OpsError::RequestTooLarge(format!(
                "the body is longer than {MAX_BODY_BYTES} bytes"
            )));
        }
        Ok(Ok(b)) => b,
    };
    if bytes.is_empty() && !required {
        return Ok(T::default());
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| OpsError::BadRequest(format!("the body is not valid: {e}")))
}

async fn approve(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    request: Request<Body>,
) -> Response {
    decision(&api, &caller, &id, request, false, |b: ApproveBody| {
        Decision::Approve {
            valid_for_ms: b
                .valid_for_secs
                .map(|s| s.saturating_mul(1000).min(i64::MAX as u64) as i64),
        }
    })
    .await
}

async fn reject(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    request: Request<Body>,
) -> Response {
    decision(&api, &caller, &id, request, true, |b: RejectBody| {
        Decision::Reject { reason: b.reason }
    })
    .await
}

/// A decision's request: `approvals:decide`, then its body (`required`
/// or not), then the decision it makes; the decider is the caller.
async fn decision<B: for<'de> Deserialize<'de> + Default>(
    api: &Api,
    caller: &Caller,
    id: &str,
    request: Request<Body>,
    required: bool,
    make: impl FnOnce(B) -> Decision,
) -> Response {
    if let Err(r) = admit(api, caller, SCOPE_APPROVALS_DECIDE) {
        return *r;
    }
    match body(api, request, required).await {
        Ok(b) => answer(api.ops.decide(id, make(b), Decider::of(caller)).await),
        Err(e) => error(&e),
    }
}
