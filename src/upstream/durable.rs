//! An upstream's own Tasks, as durable routes use them: which capabilities
//! may be routed, and the three requests a route sends (the submission,
//! `tasks/get`, `tasks/cancel`), each on one named session only.
//!
//! Nothing here decides what an answer means for a route: it reports what
//! was sent and what came back, and whether anything was sent at all. A
//! request is only ever sent on the session the caller names; when that
//! session is no longer the upstream's current one, nothing is sent.

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CancelTaskParams, CancelTaskRequest, ClientRequest,
    GetTaskParams, GetTaskRequest, MetaObject, RequestMetaObject, ServerResult,
};
use rmcp::service::{PeerRequestOptions, ServiceError};
use serde_json::{Map, Value, json};

use super::Upstreams;
use super::source::{Session, Shared, State};
use super::tool::{Capability, PinState};
use crate::config::{Effect, RouteEcho};
use crate::tools::ArgumentError;

/// The `_meta` key of the execution envelope sent with a submission and
/// echoed by the provider.
pub const EXECUTION_META_KEY: &str = "dev.taskgate/taskExecution";

/// The Tasks extension, as a client declares it on one request.
const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";

/// The protocol revision a routable upstream must have negotiated.
pub const ROUTABLE_PROTOCOL: &str = "2026-07-28";

/// A capability a durable route may use now.
#[derive(Debug, Clone)]
pub struct Routable {
    /// `alias.tool`.
    pub name: String,
    pub upstream: String,
    pub remote: String,
    /// Its pinned digest: what a submission's `providerInterfaceVersion`
    /// must equal.
    pub schema_digest: String,
    /// The operator's effect for it.
    pub effect: Effect,
    pub input_schema: Value,
    pub description: String,
    /// The upstream's configuration and this capability as discovered, so
    /// that a route notices when either changed under it.
    pub source_digest: [u8; 32],
    /// The session it is reachable on now.
    pub session: String,
    /// The upstream's `request_timeout_secs`.
    pub timeout: Duration,
    /// Which of its answers must carry the envelope back.
    pub echo: RouteEcho,
}

/// What a submission got back.
#[derive(Debug, Clone)]
pub enum Answer {
    /// The upstream created a task.
    Task {
        id: String,
        status: String,
        poll_interval_ms: Option<u64>,
        echo: Option<Value>,
    },
    /// It answered at once with a tool result (`_meta` taken out).
    Result {
        value: Value,
        echo: Option<Value>,
        bytes: usize,
    },
    /// It answered the request with a JSON-RPC error.
    Error { code: i64, message: String },
}

/// Why a request got no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Nothing was sent (not connected, another session now, no free
    /// request slot).
    NotSent(String),
    /// It was sent; what happened there is unknown (a timeout, a broken
    /// connection, an answer of the wrong kind).
    Unknown(String),
}

/// A `tasks/get` answer.
#[derive(Debug, Clone)]
pub struct RemoteTask {
    /// The task the answer is about, as the upstream names it: a route
    /// takes it only when it is the route's bound upstream task.
    pub task_id: String,
    pub status: String,
    pub status_message: Option<String>,
    pub poll_interval_ms: Option<u64>,
    /// The inlined result (completed) or error (failed).
    pub result: Option<Value>,
    pub error: Option<Value>,
    pub echo: Option<Value>,
    pub bytes: usize,
}

/// A `tasks/get` or `tasks/cancel` outcome that is not an answer.
#[derive(Debug, Clone)]
pub enum PollFailure {
    /// The session named is not the upstream's current one: nothing sent.
    SessionChanged,
    Failed(Failure),
    /// The upstream answered with a JSON-RPC error (an unknown task, say).
    Error {
        code: i64,
        message: String,
    },
}

fn source_digest(shared: &Shared, cap: &Capability, session: &Session) -> [u8; 32] {
    use sha2::Digest as _;
    let config = shared.config();
    let mut h = sha2::Sha256::new();
    for part in [
        b"taskgate-source".as_slice(),
        format!("{:?}", config.transport).as_bytes(),
        format!("{:?}", config.limits).as_bytes(),
        config.alias.as_bytes(),
        config.route_echo.as_str().as_bytes(),
        cap.digest.as_bytes(),
        format!("{:?} {:?}", cap.effect, cap.task).as_bytes(),
        session.version.as_bytes(),
        session.server.as_deref().unwrap_or("").as_bytes(),
    ] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    h.finalize().into()
}

/// Why a named capability cannot be routed now, or it.
fn routable_of(shared: &Arc<Shared>, name: &str) -> Result<Routable, String> {
    let snapshot = shared.snapshot();
    let alias = shared.config().alias.clone();
    let Some(session) = snapshot.session.clone() else {
        return Err(format!(
            "upstream {alias} is not connected ({})",
            snapshot.state.as_str()
        ));
    };
    if snapshot.state != State::Ready {
        return Err(format!("upstream {alias} is {}", snapshot.state.as_str()));
    }
    if session.version != ROUTABLE_PROTOCOL {
        return Err(format!(
            "upstream {alias} negotiated protocol {}, and durable routes need {ROUTABLE_PROTOCOL}",
            session.version
        ));
    }
    if !session.tasks {
        return Err(format!(
            "upstream {alias} does not advertise the {TASKS_EXTENSION} extension"
        ));
    }
    let Some(cap) = snapshot.catalog.get(name) else {
        return Err(format!("upstream {alias} lists no tool named {name:?}"));
    };
    if let Some(why) = &cap.withheld {
        return Err(format!("{name} is withheld: {why}"));
    }
    // A route carries no approval: routing it would run it unapproved.
    if cap.approval.is_some() {
        return Err(format!(
            "{name} needs an administrator's approval of each call (approval = \"required\"), which a durable route does not carry; call it as a tool"
        ));
    }
    if cap.pin != PinState::Pinned {
        return Err(format!(
            "{name} is not pinned: only a capability the operator reviewed and pinned (taskgate upstream pin {alias}) is routed"
        ));
    }
    let d = &cap.described;
    Ok(Routable {
        name: cap.name.clone(),
        upstream: alias,
        remote: cap.remote.clone(),
        schema_digest: cap.digest.clone(),
        effect: cap.effect,
        input_schema: d
            .get("inputSchema")
            .cloned()
            .unwrap_or(json!({"type": "object"})),
        description: d
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        source_digest: source_digest(shared, cap, &session),
        session: session.id.clone(),
        timeout: shared.config().limits.request_timeout,
        echo: shared.config().route_echo,
    })
}

fn meta_of(meta: Option<&MetaObject>) -> Option<Value> {
    meta.and_then(|m| m.0.get(EXECUTION_META_KEY).cloned())
}

fn describe_failure(e: &ServiceError) -> String {
    let mut detail = format!("{e}");
    if detail.len() > 256 {
        let mut cut = 256;
        while !detail.is_char_boundary(cut) {
            cut -= 1;
        }
        detail.truncate(cut);
    }
    detail
}

impl Upstreams {
    fn shared_of(&self, alias: &str) -> Option<Arc<Shared>> {
        super::lock(&self.sources)
            .get(alias)
            .map(|s| s.shared.clone())
    }

    /// Every capability a durable route may use now, by name.
    pub fn routable(&self) -> Vec<Routable> {
        let mut out = Vec::new();
        for source in self.sources() {
            let snapshot = source.shared.snapshot();
            let mut names: Vec<&String> = snapshot.catalog.keys().collect();
            names.sort();
            for name in names {
                if let Ok(r) = routable_of(&source.shared, name) {
                    out.push(r);
                }
            }
        }
        out
    }

    /// Whether any capability may be routed now (cheaper than
    /// [`Upstreams::routable`]: nothing is digested, and it stops at the
    /// first).
    pub fn any_routable(&self) -> bool {
        self.sources().iter().any(|source| {
            let snapshot = source.shared.snapshot();
            snapshot.state == State::Ready
                && snapshot
                    .session
                    .as_ref()
                    .is_some_and(|s| s.version == ROUTABLE_PROTOCOL && s.tasks)
                && snapshot.catalog.values().any(|cap| {
                    cap.withheld.is_none() && cap.pin == PinState::Pinned && cap.approval.is_none()
                })
        })
    }

    /// The named capability if a durable route may use it now; otherwise
    /// why not.
    pub fn routable_named(&self, name: &str) -> Result<Routable, String> {
        let Some((alias, _)) = name.split_once('.') else {
            return Err(format!(
                "{name:?} names no upstream capability (they are named ALIAS.TOOL)"
            ));
        };
        let Some(shared) = self.shared_of(alias) else {
            return Err(format!(
                "no upstream is configured under the alias {alias:?}"
            ));
        };
        routable_of(&shared, name)
    }

    /// Checks `args` against the named capability's input schema, with the
    /// validator compiled when its catalog was built (naming the first
    /// offending location, never the value).
    pub fn check_arguments(&self, name: &str, args: &Value) -> Result<(), ArgumentError> {
        let tool = name
            .split_once('.')
            .and_then(|(alias, _)| self.shared_of(alias))
            .and_then(|shared| shared.snapshot().catalog.get(name).cloned())
            .and_then(|cap| cap.tool.clone());
        match tool {
            Some(tool) => crate::tools::Runner::validate(tool.as_ref(), args),
            None => Err(ArgumentError {
                tool: name.to_string(),
                location: "arguments".into(),
                problem: "the capability is not callable now".into(),
            }),
        }
    }

    /// The echo rule of the upstream configured as `alias`, if one is.
    pub fn route_echo(&self, alias: &str) -> Option<RouteEcho> {
        self.shared_of(alias).map(|s| s.config().route_echo)
    }

    /// Whether `session` is the current session of `alias`.
    pub fn session_is(&self, alias: &str, session: &str) -> bool {
        self.session_if(alias, session).is_some()
    }

    /// The session of `alias` if it is still `session`.
    fn session_if(&self, alias: &str, session: &str) -> Option<Arc<Session>> {
        let shared = self.shared_of(alias)?;
        let snapshot = shared.snapshot();
        snapshot.session.clone().filter(|s| s.id == session)
    }

    /// Sends the submission on `routable.session` only, declaring Tasks on
    /// this request and carrying the execution envelope.
    pub async fn submit(
        &self,
        routable: &Routable,
        arguments: Map<String, Value>,
        envelope: Value,
        timeout: Duration,
    ) -> Result<Answer, Failure> {
        let Some(session) = self.session_if(&routable.upstream, &routable.session) else {
            return Err(Failure::NotSent(format!(
                "upstream {} is no longer on the session the route was bound to",
                routable.upstream
            )));
        };
        let Ok(_permit) = session.requests.clone().try_acquire_owned() else {
            return Err(Failure::NotSent(format!(
                "upstream {} already has as many requests in flight as it may (max_concurrent_requests)",
                routable.upstream
            )));
        };
        let mut meta = tasks_meta();
        meta.0.0.insert(EXECUTION_META_KEY.into(), envelope);
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(
            CallToolRequestParams::new(routable.remote.clone()).with_arguments(arguments),
        ));
        let answer = send(&session, request, meta, timeout).await?;
        Ok(match answer {
            Ok(ServerResult::CreateTaskResult(r)) => Answer::Task {
                id: r.task.task_id.clone(),
                status: serde_json::to_value(r.task.status)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
                poll_interval_ms: r.task.poll_interval_ms,
                echo: meta_of(r.meta.as_ref()),
            },
            Ok(ServerResult::CallToolResult(r)) => {
                let echo = meta_of(r.meta.as_ref());
                let mut value = serde_json::to_value(&r).unwrap_or(Value::Null);
                if let Some(o) = value.as_object_mut() {
                    o.remove("_meta");
                }
                let bytes = serde_json::to_vec(&value).map(|v| v.len()).unwrap_or(0);
                Answer::Result { value, echo, bytes }
            }
            Ok(_) => {
                return Err(Failure::Unknown(
                    "the upstream answered the submission with something other than a task or a tool result".into(),
                ));
            }
            Err((code, message)) => Answer::Error { code, message },
        })
    }

    /// `tasks/get` for `upstream_id`, on `session` only.
    pub async fn get_task(
        &self,
        alias: &str,
        session: &str,
        upstream_id: &str,
        timeout: Duration,
    ) -> Result<RemoteTask, PollFailure> {
        let Some(session) = self.session_if(alias, session) else {
            return Err(PollFailure::SessionChanged);
        };
        let request =
            ClientRequest::GetTaskRequest(GetTaskRequest::new(GetTaskParams::new(upstream_id)));
        match send(&session, request, tasks_meta(), timeout).await {
            Err(f) => Err(PollFailure::Failed(f)),
            Ok(Err((code, message))) => Err(PollFailure::Error { code, message }),
            Ok(Ok(ServerResult::GetTaskResult(r))) => {
                let echo = meta_of(r.meta.as_ref());
                let value = serde_json::to_value(&r.task).unwrap_or(Value::Null);
                let bytes = serde_json::to_vec(&value).map(|v| v.len()).unwrap_or(0);
                let field = |k: &str| value.get(k).cloned();
                Ok(RemoteTask {
                    task_id: r.task.task.task_id.clone(),
                    status: value
                        .get("status")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string(),
                    status_message: value
                        .get("statusMessage")
                        .and_then(Value::as_str)
                        .map(str::to_string),
                    poll_interval_ms: r.task.task.poll_interval_ms,
                    result: field("result"),
                    error: field("error"),
                    echo,
                    bytes,
                })
            }
            Ok(Ok(_)) => Err(PollFailure::Failed(Failure::Unknown(
                "the upstream answered tasks/get with something other than a task".into(),
            ))),
        }
    }

    /// `tasks/cancel` for `upstream_id`, on `session` only.
    pub async fn cancel_task(
        &self,
        alias: &str,
        session: &str,
        upstream_id: &str,
        timeout: Duration,
    ) -> Result<(), PollFailure> {
        let Some(session) = self.session_if(alias, session) else {
            return Err(PollFailure::SessionChanged);
        };
        let request = ClientRequest::CancelTaskRequest(CancelTaskRequest::new(
            CancelTaskParams::new(upstream_id),
        ));
        match send(&session, request, tasks_meta(), timeout).await {
            Err(f) => Err(PollFailure::Failed(f)),
            Ok(Err((code, message))) => Err(PollFailure::Error { code, message }),
            Ok(Ok(ServerResult::TaskAckResult(_) | ServerResult::EmptyResult(_))) => Ok(()),
            Ok(Ok(_)) => Err(PollFailure::Failed(Failure::Unknown(
                "the upstream answered tasks/cancel with something other than an acknowledgement"
                    .into(),
            ))),
        }
    }
}

/// Request metadata declaring Tasks: a 2026-07-28 server answers a
/// `tasks/*` request (and makes a task of a call) only for a request that
/// declares the extension.
fn tasks_meta() -> RequestMetaObject {
    let mut meta = RequestMetaObject::new();
    meta.0.0.insert(
        "io.modelcontextprotocol/clientCapabilities".into(),
        json!({"extensions": {TASKS_EXTENSION: {}}}),
    );
    meta
}

/// One request on one session, bounded in time. `Ok(Err)` is the
/// upstream's JSON-RPC error; `Err` is no answer (with whether it was sent).
async fn send(
    session: &Session,
    request: ClientRequest,
    meta: RequestMetaObject,
    timeout: Duration,
) -> Result<Result<ServerResult, (i64, String)>, Failure> {
    let options = PeerRequestOptions::with_timeout(timeout).with_meta(meta);
    let handle = match session
        .peer
        .send_request_with_option(request, options)
        .await
    {
        Ok(h) => h,
        // The transport refused to take it: it never left.
        Err(e) => {
            return Err(Failure::NotSent(format!(
                "the request could not be sent: {}",
                describe_failure(&e)
            )));
        }
    };
    match handle.await_response().await {
        Ok(result) => Ok(Ok(result)),
        Err(ServiceError::McpError(e)) => {
            let mut message = e.message.to_string();
            if message.len() > 512 {
                let mut cut = 512;
                while !message.is_char_boundary(cut) {
                    cut -= 1;
                }
                message.truncate(cut);
            }
            Ok(Err((e.code.0 as i64, message)))
        }
        Err(ServiceError::Timeout { timeout }) => Err(Failure::Unknown(format!(
            "no answer within {} ms",
            timeout.as_millis()
        ))),
        Err(e) => Err(Failure::Unknown(format!(
            "the exchange failed in flight: {}",
            describe_failure(&e)
        ))),
    }
}
