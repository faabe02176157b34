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
use crate::tasks::{AdminRefusal, Approvals, Decider, Decision, TaskService};
use crate::wire;

/// The largest request body the API reads (a rejection reason is at most
/// 512 bytes).
const MAX_BODY_BYTES: usize = 8 * 1024;

#[derive(Clone)]
struct Api {
    gate: auth::Gate,
    body_read_timeout: Duration,
}

/// The routes, behind the same authentication as `/mcp`.
pub(super) fn routes<S: Clone + Send + Sync + 'static>(
    gate: auth::Gate,
    body_read_timeout: Duration,
) -> Router<S> {
    let api = Api {
        gate: gate.clone(),
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
/// with the HTTP status that says what kind it is.
fn error(status: StatusCode, message: impl Into<String>) -> Response {
    let code = match status {
        StatusCode::PAYLOAD_TOO_LARGE => wire::REQUEST_TOO_LARGE,
        StatusCode::REQUEST_TIMEOUT => wire::REQUEST_TIMEOUT,
        StatusCode::SERVICE_UNAVAILABLE => wire::APPROVALS_UNAVAILABLE,
        StatusCode::INTERNAL_SERVER_ERROR => wire::INTERNAL,
        _ => wire::INVALID_PARAMS,
    };
    respond::from_library(&Refused::new(code, message, Value::Null), status)
}

/// The approvals, for a caller holding `scope`; else the refusal.
fn admit(api: &Api, caller: &Caller, scope: &'static str) -> Result<Arc<Approvals>, Box<Response>> {
    let Some(authenticator) = &api.gate.auth else {
        return Err(Box::new(error(
            StatusCode::NOT_FOUND,
            "the HTTP admin interface needs credentials ([auth]); use `taskgate approvals` over the admin socket",
        )));
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
    approvals_of(&api.gate.svc)
}

fn approvals_of(svc: &TaskService) -> Result<Arc<Approvals>, Box<Response>> {
    svc.approvals().cloned().ok_or_else(|| {
        Box::new(error(
            StatusCode::NOT_FOUND,
            "approvals are not set up in this daemon: no [[tool]] or [upstream.tools.NAME] has approval = \"required\"",
        ))
    })
}

fn refused(e: AdminRefusal) -> Response {
    let status = match &e {
        AdminRefusal::Unknown(_) => StatusCode::NOT_FOUND,
        AdminRefusal::Refused(_) => StatusCode::CONFLICT,
        AdminRefusal::Disabled(_) => StatusCode::SERVICE_UNAVAILABLE,
        AdminRefusal::Failed(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(status, e.to_string())
}

fn now(api: &Api) -> i64 {
    api.gate.svc.store().clock().now_ms()
}

fn answer(approvals: &Approvals, proposals: Vec<crate::tasks::Proposal>, now: i64) -> Response {
    Json(json!({"proposals": proposals, "journal": approvals.status(now)})).into_response()
}

async fn list(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    RawQuery(query): RawQuery,
) -> Response {
    let approvals = match admit(&api, &caller, SCOPE_APPROVALS_READ) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let pending = match query.as_deref() {
        None | Some("") => false,
        Some("pending" | "pending=true" | "pending=1") => true,
        Some("pending=false" | "pending=0") => false,
        Some(other) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("unknown query {other:?}; the one parameter is pending=true"),
            );
        }
    };
    let now = now(&api);
    match approvals.proposals(None, pending, now) {
        Ok(p) => answer(&approvals, p, now),
        Err(e) => refused(e),
    }
}

async fn show(
    State(api): State<Api>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Response {
    let approvals = match admit(&api, &caller, SCOPE_APPROVALS_READ) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let now = now(&api);
    match approvals.proposals(Some(&id), false, now) {
        Ok(p) => answer(&approvals, p, now),
        Err(e) => refused(e),
    }
}

/// The body of a decision, read within the body timeout and bound.
async fn body<T: for<'de> Deserialize<'de> + Default>(
    api: &Api,
    request: Request<Body>,
    required: bool,
) -> Result<T, Response> {
    let read = tokio::time::timeout(
        api.body_read_timeout,
        axum::body::to_bytes(request.into_body(), MAX_BODY_BYTES),
    )
    .await;
    let bytes = match read {
        Err(_) => return Err(error(StatusCode::REQUEST_TIMEOUT, "the body took too long")),
        Ok(Err(_)) => {
            return Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the body is longer than {MAX_BODY_BYTES} bytes"),
            ));
        }
        Ok(Ok(b)) => b,
    };
    if bytes.is_empty() && !required {
        return Ok(T::default());
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            format!("the body is not valid: {e}"),
        )
    })
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
/// or not), then the decision it makes.
async fn decision<B: for<'de> Deserialize<'de> + Default>(
    api: &Api,
    caller: &Caller,
    id: &str,
    request: Request<Body>,
    required: bool,
    make: impl FnOnce(B) -> Decision,
) -> Response {
    let approvals = match admit(api, caller, SCOPE_APPROVALS_DECIDE) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    match body(api, request, required).await {
        Ok(b) => decide(api, &approvals, caller, id, make(b)).await,
        Err(r) => r,
    }
}

async fn decide(
    api: &Api,
    approvals: &Approvals,
    caller: &Caller,
    id: &str,
    decision: Decision,
) -> Response {
    let now = now(api);
    match approvals
        .decide(id, decision, Decider::of(caller), now)
        .await
    {
        Ok(p) => answer(approvals, vec![p], now),
        Err(e) => refused(e),
    }
}
