//! An upstream's tool as taskgate serves it: a [`Capability`] (its digest,
//! its pin, whether callers may see it) and, when they may, an
//! [`UpstreamTool`], the runner that forwards a call.

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResponse};
use rmcp::service::ServiceError;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::digest;
use super::source::Shared;
use super::transport::Refused;
use crate::config::{Effect, TaskMode, UpstreamConfig};
use crate::tools::{ApprovalRule, ArgumentError, RunError, RunFuture, Runner, Shown, ToolSpec};
use crate::wire;

/// Longest tool name MCP allows.
const MAX_TOOL_NAME: usize = 128;

/// Longest part of an upstream's error message passed on.
const MAX_UPSTREAM_MESSAGE: usize = 1024;

/// How a capability stands against the pins file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PinState {
    /// No pin: callable, and runs as a taskgate task when the operator
    /// marked it so; never routed to the upstream's own Tasks.
    Unpinned,
    /// Its live digest is the pinned one.
    Pinned,
    /// The upstream changed it since it was pinned: withheld.
    Differs { pinned: String },
}

/// One tool an upstream lists.
#[derive(Debug)]
pub struct Capability {
    /// The upstream's own name.
    pub remote: String,
    /// The name callers use: `alias.remote`.
    pub name: String,
    pub digest: String,
    pub pin: PinState,
    /// Why callers do not get it, if they do not.
    pub withheld: Option<String>,
    pub effect: Effect,
    pub task: TaskMode,
    /// How its calls wait for an administrator, when the operator said so.
    pub approval: Option<ApprovalRule>,
    /// Its description as listed (for `upstream show`).
    pub described: Value,
    /// The runner, when it is callable.
    pub tool: Option<Arc<UpstreamTool>>,
}

/// What an approval of a call to an upstream's tool binds beside the
/// caller and the arguments: the upstream's identity and how it is reached
/// and bounded, the tool's digest (the pinned one, when it is pinned: a
/// changed description is a new digest, pinned again a new definition)
/// and the operator's effect and task mode for it.
fn approval_definition(
    config: &UpstreamConfig,
    digest: &str,
    effect: Effect,
    task: TaskMode,
) -> String {
    use sha2::Digest as _;
    let what = format!(
        "upstream|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}",
        config.alias, config.transport, config.limits, digest, effect, task,
    );
    sha2::Sha256::digest(what.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Why a tool held for approval cannot be served with the preview the
/// operator asked for: a field its input schema does not declare. The
/// administrator would decide without what the operator wanted shown (and
/// an upstream could rename a field to keep it out of sight), so the tool
/// is withheld rather than held with less.
fn missing_preview(config: &UpstreamConfig, remote: &str, input: &Value) -> Option<String> {
    let preview = config.tool_approval(remote)?;
    let properties = input.get("properties").and_then(Value::as_object);
    let field = preview
        .iter()
        .find(|f| !properties.is_some_and(|p| p.contains_key(f.as_str())))?;
    Some(format!(
        "approval_preview names {field:?}, which is not a property of its inputSchema, so a held call could not show it; review the tool with `taskgate upstream show {}` and fix [upstream.tools.{remote}] approval_preview",
        config.alias
    ))
}

fn valid_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_TOOL_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

impl Capability {
    pub fn new(config: &UpstreamConfig, tool: &rmcp::model::Tool, pinned: Option<&str>) -> Self {
        let input = Value::Object((*tool.input_schema).clone());
        let output = tool
            .output_schema
            .as_ref()
            .map(|s| Value::Object((**s).clone()));
        let annotations = tool
            .annotations
            .as_ref()
            .and_then(|a| serde_json::to_value(a).ok());
        let digest = digest::capability(
            &tool.name,
            tool.title.as_deref(),
            tool.description.as_deref(),
            &input,
            output.as_ref(),
            annotations.as_ref(),
        );
        let name = format!("{}.{}", config.alias, tool.name);
        let pin = match pinned {
            None => PinState::Unpinned,
            Some(p) if p == digest => PinState::Pinned,
            Some(p) => PinState::Differs {
                pinned: p.to_string(),
            },
        };
        let (effect, task) = config.tool_settings(&tool.name);
        let withheld = if !valid_tool_name(&name) {
            Some(format!(
                "its name {name:?} is not a valid MCP tool name (1-{MAX_TOOL_NAME} characters of A-Z a-z 0-9 _ - .)"
            ))
        } else if let PinState::Differs { pinned } = &pin {
            Some(format!(
                "its description changed since it was pinned ({pinned}, now {digest}); review it with `taskgate upstream show {}` and pin it again",
                config.alias
            ))
        } else if input.get("type").and_then(Value::as_str) != Some("object") {
            Some("its inputSchema does not describe an object".into())
        } else if jsonschema::validator_for(&input).is_err() {
            Some("its inputSchema is not a valid JSON Schema".into())
        } else {
            missing_preview(config, &tool.name, &input)
        };
        let approval = config
            .tool_approval(&tool.name)
            .map(|preview| ApprovalRule {
                definition: approval_definition(config, &digest, effect, task),
                preview: preview.to_vec(),
            });
        Capability {
            remote: tool.name.to_string(),
            name,
            digest,
            pin,
            withheld,
            effect,
            task,
            approval,
            described: super::source::described(tool),
            tool: None,
        }
    }
}

/// A callable upstream tool: forwards each call on the upstream's current
/// connection, bounded in time, size and concurrency, with taskgate's own
/// credential (the caller's never leaves taskgate).
pub struct UpstreamTool {
    spec: ToolSpec,
    remote: String,
    validator: jsonschema::Validator,
    upstream: Arc<Shared>,
    approval: Option<ApprovalRule>,
}

impl std::fmt::Debug for UpstreamTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamTool")
            .field("name", &self.spec.name)
            .finish_non_exhaustive()
    }
}

impl UpstreamTool {
    /// The runner of a capability callers may use; `None` for a withheld one.
    pub fn new(cap: &Capability, upstream: Arc<Shared>) -> Option<UpstreamTool> {
        if cap.withheld.is_some() {
            return None;
        }
        let d = &cap.described;
        let input_schema = d
            .get("inputSchema")
            .cloned()
            .unwrap_or(json!({"type": "object"}));
        let validator = jsonschema::validator_for(&input_schema).ok()?;
        Some(UpstreamTool {
            spec: ToolSpec {
                name: cap.name.clone(),
                description: d
                    .get("description")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                input_schema,
                effect: cap.effect,
                task: cap.task,
                shown: Shown {
                    title: d.get("title").and_then(Value::as_str).map(str::to_string),
                    output_schema: d.get("outputSchema").cloned(),
                    annotations: d.get("annotations").cloned(),
                },
            },
            remote: cap.remote.clone(),
            validator,
            upstream,
            approval: cap.approval.clone(),
        })
    }

    fn alias(&self) -> String {
        self.upstream.config().alias.clone()
    }

    async fn forward(
        &self,
        args: &Map<String, Value>,
        cancel: &CancellationToken,
    ) -> Result<Value, RunError> {
        let config = self.upstream.config();
        let alias = &config.alias;
        let snapshot = self.upstream.snapshot();
        if self
            .upstream
            .retiring
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(remote(
                wire::UPSTREAM_UNAVAILABLE,
                format!("upstream {alias} was removed by a reload; nothing was sent"),
                Some(json!({"retryable": false, "sent": false})),
            ));
        }
        let Some(session) = snapshot.session.clone() else {
            return Err(remote(
                wire::UPSTREAM_UNAVAILABLE,
                format!(
                    "upstream {alias} is not connected ({}); nothing was sent",
                    snapshot.state.as_str()
                ),
                Some(json!({"retryable": true, "sent": false})),
            ));
        };
        let Ok(_permit) = session.requests.clone().try_acquire_owned() else {
            return Err(remote(
                wire::UPSTREAM_BUSY,
                format!(
                    "upstream {alias} already has {} requests in flight (max_concurrent_requests); nothing was sent",
                    config.limits.max_concurrent_requests
                ),
                Some(json!({"retryable": true, "sent": false})),
            ));
        };
        if cancel.is_cancelled() {
            return Err(RunError::Cancelled);
        }
        let params = CallToolRequestParams::new(self.remote.clone()).with_arguments(args.clone());
        let timeout = config.limits.request_timeout;
        // Dropping the call (cancelled, or past its time) makes rmcp send
        // notifications/cancelled for it: a hint to the upstream, never a
        // proof that nothing happened there.
        let answer = tokio::select! {
            _ = cancel.cancelled() => return Err(RunError::Cancelled),
            r = tokio::time::timeout(timeout, session.peer.call_tool_once(params)) => r,
        };
        let limit = config.limits.max_response_bytes;
        match answer {
            Err(_) => Err(remote(
                wire::UPSTREAM_TIMEOUT,
                format!(
                    "upstream {alias} did not answer within request_timeout_secs = {}; the call was cancelled there, and its effect there is unknown",
                    timeout.as_secs()
                ),
                None,
            )),
            Ok(Ok(CallToolResponse::Complete(result))) => {
                let mut value = serde_json::to_value(&result).map_err(|e| {
                    remote(
                        wire::UPSTREAM_CONNECTION_LOST,
                        format!("upstream {alias} answered a result taskgate cannot encode: {e}"),
                        None,
                    )
                })?;
                // The caller's server is taskgate: what the upstream says
                // of itself in the result's metadata stays here.
                if let Some(result) = value.as_object_mut() {
                    result.remove("_meta");
                }
                let size = serde_json::to_vec(&value)
                    .map(|v| v.len())
                    .unwrap_or(usize::MAX);
                if size as u64 > limit {
                    return Err(too_large(alias, limit));
                }
                Ok(value)
            }
            Ok(Ok(_)) => Err(remote(
                wire::UPSTREAM_CONNECTION_LOST,
                format!(
                    "upstream {alias} answered with a task or an input request, which taskgate did not ask for"
                ),
                None,
            )),
            Ok(Err(ServiceError::McpError(e))) => {
                let mut message = e.message.to_string();
                if message.len() > MAX_UPSTREAM_MESSAGE {
                    let mut cut = MAX_UPSTREAM_MESSAGE;
                    while !message.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    message.truncate(cut);
                }
                Err(remote(
                    wire::UPSTREAM_ERROR,
                    format!("upstream {alias} refused the call: {message}"),
                    Some(json!({"upstreamCode": e.code.0, "upstreamMessage": message})),
                ))
            }
            Ok(Err(e)) => Err(lost(alias, &session.refusal, &e.to_string(), limit)),
        }
    }
}

fn remote(code: wire::WireCode, detail: String, data: Option<Value>) -> RunError {
    RunError::Remote { code, detail, data }
}

fn too_large(alias: &str, limit: u64) -> RunError {
    remote(
        wire::UPSTREAM_RESPONSE_TOO_LARGE,
        format!(
            "upstream {alias} answered more than max_response_bytes = {limit} bytes; the answer was refused"
        ),
        None,
    )
}

/// A call whose connection failed under it: the reader's refusal says
/// more than the closed connection.
fn lost(alias: &str, refusal: &super::transport::Refusal, error: &str, limit: u64) -> RunError {
    match refusal.get() {
        Some(Refused::Oversized) => too_large(alias, limit),
        Some(Refused::NotJson) => remote(
            wire::UPSTREAM_CONNECTION_LOST,
            format!(
                "upstream {alias} sent something that is not JSON-RPC; the connection was closed (it is made again) and the call's effect there is unknown"
            ),
            None,
        ),
        Some(Refused::TooManyTools) => remote(
            wire::UPSTREAM_CONNECTION_LOST,
            format!(
                "upstream {alias}'s tool list grew past max_tools; the connection was closed and the call's effect there is unknown"
            ),
            None,
        ),
        // reqwest's body limit, over HTTP.
        None if error.contains("too large") || error.contains("exceed") => too_large(alias, limit),
        None => {
            // The library's words name its own types and may quote what
            // the upstream sent: the log gets them, escaped and cut; the
            // caller gets what happened.
            let mut detail = format!("{error:?}");
            if detail.len() > 512 {
                let mut cut = 512;
                while !detail.is_char_boundary(cut) {
                    cut -= 1;
                }
                detail.truncate(cut);
            }
            tracing::warn!(upstream = %alias, "a call to upstream {alias} failed in flight: {detail}");
            remote(
                wire::UPSTREAM_CONNECTION_LOST,
                format!(
                    "the exchange with upstream {alias} failed while the call was in flight (the connection broke, or the answer was not MCP); its effect there is unknown"
                ),
                None,
            )
        }
    }
}

impl Runner for UpstreamTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn validate(&self, args: &Value) -> Result<(), ArgumentError> {
        crate::tools::check_arguments(&self.validator, &self.spec.name, args)
    }

    fn run<'a>(
        &'a self,
        args: &'a Map<String, Value>,
        _grace: Duration,
        cancel: &'a CancellationToken,
    ) -> RunFuture<'a> {
        let span =
            tracing::debug_span!("upstream_call", upstream = %self.alias(), tool = %self.remote);
        Box::pin(self.forward(args, cancel).instrument(span))
    }

    /// It starts no process of taskgate's: its bound is the upstream's
    /// `max_concurrent_requests`.
    fn starts_process(&self) -> bool {
        false
    }

    /// The same gate as a command tool's: the task service holds the call
    /// before anything is sent upstream.
    fn approval(&self) -> Option<&ApprovalRule> {
        self.approval.as_ref()
    }
}
