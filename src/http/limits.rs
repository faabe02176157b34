//! What a `/mcp` request passes before the protocol layer: its body read
//! whole within its time and size bounds and screened, then a slot of its
//! budget (`tools/call`, or everything else).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::Semaphore;

use crate::mcp::screen::{self, Kind, Refused};

use crate::tasks::TaskService;
use crate::wire;

use super::respond;

/// One bound on concurrent `/mcp` requests.
#[derive(Clone)]
pub(super) struct Budget {
    pub(super) permits: Arc<Semaphore>,
    pub(super) max: usize,
    /// The config key that sets it, for the refusal's message.
    pub(super) key: &'static str,
}

impl Budget {
    pub(super) fn new(max: usize, key: &'static str) -> Budget {
        Budget {
            permits: Arc::new(Semaphore::new(max)),
            max,
            key,
        }
    }
}

#[derive(Clone)]
pub(super) struct Limits {
    /// `tools/call`, and every request not known to be something else.
    pub(super) calls: Budget,
    /// Polls, cancels, updates, listings: never taken by a call.
    pub(super) control: Budget,
    /// Whether a refusal is "stopping" rather than "busy".
    pub(super) svc: Arc<TaskService>,
}

impl Limits {
    /// The budget a request counts against, from what the screen found in
    /// its body: a `tools/call` counts as a call, any other message as
    /// control. A request without a body (GET and DELETE, which hold their
    /// slot only until the response starts) is control; a POST the screen
    /// did not mark cannot reach here, and would count as a call.
    fn budget_of(&self, request: &Request) -> &Budget {
        match request.extensions().get::<Kind>() {
            Some(kind) if kind.is_call() => &self.calls,
            Some(_) => &self.control,
            None if request.method() == axum::http::Method::POST => &self.calls,
            None => &self.control,
        }
    }

    /// Why `/mcp` cannot admit a request of some kind right now, if so.
    pub(super) fn saturated(&self) -> Option<String> {
        [&self.calls, &self.control]
            .into_iter()
            .find(|b| b.permits.available_permits() == 0 && !b.permits.is_closed())
            .map(|b| format!("every request slot is in use ({} = {})", b.key, b.max))
    }
}

/// What a `/mcp` POST needs before it may take a request slot: its whole
/// body, in time and within the size bound.
#[derive(Clone)]
pub(super) struct Intake {
    pub(super) max_request_bytes: usize,
    pub(super) body_read_timeout: Duration,
}
pub(super) async fn limit_requests(
    State(limits): State<Limits>,
    request: Request,
    next: Next,
) -> Response {
    let budget = limits.budget_of(&request);
    let Ok(_permit) = budget.permits.clone().try_acquire_owned() else {
        // A request that reaches a stopping daemon (its slots are closed or
        // being drained) is told so, not that the server is busy.
        let (w, message) = if limits.svc.is_stopping() || budget.permits.is_closed() {
            (
                wire::STOPPING,
                "the server is stopping and admits no new requests; retry once it is back"
                    .to_string(),
            )
        } else {
            (
                wire::SERVER_BUSY,
                format!(
                    "too many concurrent requests ({} = {}); retry shortly",
                    budget.key, budget.max
                ),
            )
        };
        return respond::refused(&Refused::new(w, message, serde_json::Value::Null));
    };
    next.run(request).await
}

/// Reads a `/mcp` POST's whole body (within `server.body_read_timeout_ms`
/// and `server.max_request_bytes`) and screens it, before the request may
/// take a slot. What passes goes on with its [`Kind`] attached; what does
/// not gets its JSON-RPC error here.
pub(super) async fn read_and_screen(
    State(intake): State<Intake>,
    request: Request,
    next: Next,
) -> Response {
    if request.method() != axum::http::Method::POST {
        return next.run(request).await;
    }
    let (mut parts, body) = request.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let too_large = || {
        let refusal = Refused::new(
            wire::REQUEST_TOO_LARGE,
            format!(
                "the request body is larger than server.max_request_bytes = {}",
                intake.max_request_bytes
            ),
            serde_json::Value::Null,
        );
        // The rest of the body is never read: the connection closes.
        respond::refused(&refusal)
    };
    if let Some(n) = declared.filter(|n| *n > intake.max_request_bytes as u64) {
        // A client still sending when the connection closes gets a reset
        // instead of this answer. Up to one more request's worth of body is
        // read and dropped (within the body timeout) so that it reads the
        // 413; a larger body is cut off unread.
        if n <= 2 * intake.max_request_bytes as u64 {
            let _ = tokio::time::timeout(intake.body_read_timeout, drain(body, n)).await;
        }
        return too_large();
    }
    let limited = http_body_util::Limited::new(body, intake.max_request_bytes);
    let read = tokio::time::timeout(
        intake.body_read_timeout,
        http_body_util::BodyExt::collect(limited),
    )
    .await;
    let bytes = match read {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => return too_large(),
        Ok(Err(e)) => {
            // The client broke off mid-body; nobody is left to answer.
            tracing::debug!(error = %e, "request body ended early");
            return StatusCode::BAD_REQUEST.into_response();
        }
        Err(_elapsed) => {
            let refusal = Refused::new(
                wire::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within server.body_read_timeout_ms = {}",
                    intake.body_read_timeout.as_millis()
                ),
                serde_json::Value::Null,
            );
            return respond::refused(&refusal);
        }
    };
    let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok());
    let mirrored = screen::Mirrored {
        version: header("mcp-protocol-version"),
        method: header("mcp-method"),
    };
    match screen::screen(&bytes, Some(&mirrored)) {
        Ok(kind) => {
            name_the_task(&mut parts.headers, &kind);
            let id = match &kind {
                Kind::Request { id, .. } => id.clone(),
                _ => serde_json::Value::Null,
            };
            parts.extensions.insert(kind);
            let response = next
                .run(Request::from_parts(parts, axum::body::Body::from(bytes)))
                .await;
            as_json_rpc(response, id).await
        }
        Err(refusal) => respond::refused(&refusal),
    }
}

/// Reads and drops at most `limit` bytes of a body nobody will use.
pub(super) async fn drain(mut body: axum::body::Body, limit: u64) {
    let mut seen = 0u64;
    while seen <= limit {
        match http_body_util::BodyExt::frame(&mut body).await {
            Some(Ok(frame)) => {
                seen += frame.data_ref().map_or(0, |d| d.len() as u64);
            }
            _ => return,
        }
    }
}

/// Longest plain-text refusal body from the protocol library that is
/// carried over into a JSON-RPC error message.
const MAX_REFUSAL_TEXT: usize = 4 * 1024;

/// The protocol library refuses some requests from their headers or the
/// session table (wrong Accept or Content-Type, no Host, an unknown
/// session) with a plain-text body a JSON-RPC client cannot read. Such an
/// answer keeps its status and gets a JSON-RPC error body carrying the
/// library's words and the request's id.
async fn as_json_rpc(response: Response, id: serde_json::Value) -> Response {
    let json_already = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("application/json") || c.starts_with("text/event-stream"));
    if response.status().is_success() || json_already {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = match axum::body::to_bytes(body, MAX_REFUSAL_TEXT).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).trim().to_string(),
        Err(_) => String::new(),
    };
    let message = match text.is_empty() {
        true => parts
            .status
            .canonical_reason()
            .unwrap_or("refused")
            .to_string(),
        false => text,
    };
    let refusal = Refused::new(wire::HTTP_REFUSED, message, id);
    let mut wrapped = respond::from_library(&refusal, parts.status);
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            wrapped.headers_mut().insert(name.clone(), value.clone());
        }
    }
    wrapped
}

/// A `tasks/*` request without `Mcp-Name` gets one, mirrored from the
/// body's `taskId`, before the protocol library (which requires it) sees
/// it. The core specification requires the header only for requests that
/// name a tool, resource or prompt, and a widely used client leaves it out
/// on `tasks/*`; the body has already passed the screen and is the
/// authority. A header that is present is left alone, so a mismatch is
/// still refused.
fn name_the_task(headers: &mut axum::http::HeaderMap, kind: &Kind) {
    let Kind::Request {
        method,
        target: Some(task),
        ..
    } = kind
    else {
        return;
    };
    if !method.starts_with("tasks/") || headers.contains_key("mcp-name") {
        return;
    }
    if let Ok(value) = axum::http::HeaderValue::from_str(task) {
        headers.insert("mcp-name", value);
    }
}
