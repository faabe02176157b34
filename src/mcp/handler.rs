//! The rmcp `ServerHandler`: protocol negotiation and the mapping of MCP
//! requests onto the task service.
//!
//! rmcp does not tie Tasks to the protocol version, so this handler does:
//! a session that began with the legacy `initialize` never sees the
//! extension (it is stripped from the result and from later capability
//! checks, so `tasks/*` answer -32601), and a call creates a task only when
//! the request itself declared the extension on 2026-07-28 or later.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, CreateTaskResult, GetTaskParams,
    GetTaskResult, Implementation, InitializeRequestParams, InitializeResult, ListToolsResult,
    PaginatedRequestParams, ProtocolVersion, ServerCapabilities, ServerConfig, Tool as WireTool,
    ToolAnnotations, UpdateTaskParams,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{Value, json};

use super::convert;
use crate::auth::Caller;
use crate::config::{Effect, TaskMode};
use crate::tasks::{Call, Delivery, OPERATION_ID_META_KEY, TaskService};
use crate::tools::ToolSpec;
use crate::upstream::EXECUTION_META_KEY;
use crate::wire;

/// One protocol handler: per stdio connection, per legacy HTTP session, or
/// per stateless HTTP request. All share the task service.
pub struct Handler {
    svc: Arc<TaskService>,
    transport: Transport,
    /// Set by `initialize`: this session speaks a pre-2026-07-28 protocol.
    legacy: AtomicBool,
}

/// Where the handler's requests come from, which decides who they act as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    /// The process's own stdio: the local caller.
    Stdio,
    /// HTTP: the caller the authentication middleware attached to the
    /// request; a request without one is refused, never made local.
    Http,
}

impl Handler {
    /// A handler for the stdio pipe, whose caller is the local owner.
    pub fn for_stdio(svc: Arc<TaskService>) -> Handler {
        Handler::new(svc, Transport::Stdio)
    }

    /// A handler for HTTP requests, each carrying its authenticated caller.
    pub fn for_http(svc: Arc<TaskService>) -> Handler {
        Handler::new(svc, Transport::Http)
    }

    fn new(svc: Arc<TaskService>, transport: Transport) -> Handler {
        Handler {
            svc,
            transport,
            legacy: AtomicBool::new(false),
        }
    }

    fn is_legacy(&self) -> bool {
        self.legacy.load(Ordering::Relaxed)
    }

    /// Who this request acts as. Over HTTP the authentication middleware
    /// put the caller into the request; its absence is a fault, and fails
    /// closed.
    fn caller(&self, context: &RequestContext<RoleServer>) -> Result<Caller, ErrorData> {
        if self.transport == Transport::Stdio {
            return Ok(Caller::Local);
        }
        context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<Caller>())
            .cloned()
            .ok_or_else(|| {
                tracing::error!("an HTTP request reached the handler without its caller");
                convert::from_code(wire::INTERNAL, "the request has no caller", None)
            })
    }

    /// Did this very request negotiate Tasks?
    fn negotiated(&self, context: &RequestContext<RoleServer>) -> bool {
        !self.is_legacy()
            && context
                .protocol_version()
                .is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str())
            && context
                .client_capabilities()
                .is_some_and(|c| c.supports_tasks())
    }

    fn wire_tools(&self) -> Vec<WireTool> {
        self.svc.specs().iter().map(wire_tool).collect()
    }

    /// `tasks/*` do not exist for a session that began with `initialize`.
    fn refuse_legacy(&self, method: &str) -> Result<(), ErrorData> {
        if self.is_legacy() {
            return Err(convert::from_code(
                wire::METHOD_NOT_FOUND,
                format!("{method} is not available on a session opened with initialize"),
                None,
            ));
        }
        Ok(())
    }
}

/// What `mcp_server_operation_duration_seconds` calls an error: the
/// registered name taskgate sent, else the JSON-RPC code's meaning.
fn error_type(e: &ErrorData) -> &'static str {
    let name = e
        .data
        .as_ref()
        .and_then(|d| d.get("name"))
        .and_then(Value::as_str);
    if let Some(code) = name.and_then(|n| wire::ALL.iter().find(|c| c.name == n)) {
        return code.name;
    }
    // An error the protocol library made itself: the JSON-RPC meaning of
    // its code.
    let code = i64::from(e.code.0);
    [
        (wire::PARSE_ERROR, "parse_error"),
        (wire::INVALID_REQUEST, "invalid_request"),
        (wire::METHOD_NOT_FOUND, "method_not_found"),
        (wire::INVALID_PARAMS, "invalid_params"),
        (wire::INTERNAL, "internal_error"),
    ]
    .into_iter()
    .find(|(w, _)| w.code == code)
    .map_or(crate::metrics::OTHER, |(_, meaning)| meaning)
}

/// Counts one request served: its method, the tool (for a call of a tool
/// that exists), how long it took and how it ended.
fn observe<T>(
    method: &str,
    tool: Option<&str>,
    started: Instant,
    outcome: &Result<T, ErrorData>,
    tool_error: bool,
) {
    let error_type = match outcome {
        Err(e) => error_type(e),
        Ok(_) if tool_error => "tool_error",
        Ok(_) => "",
    };
    // A name nobody configured is not worth a series of its own.
    let tool = match error_type == wire::UNKNOWN_TOOL.name {
        true => tool.map(|_| crate::metrics::OTHER),
        false => tool,
    };
    crate::metrics::get().operation(method, tool, error_type, started.elapsed().as_secs_f64());
}

/// A tool as `tools/list` shows it: schema, behaviour hints, and whether it
/// runs as a task.
fn wire_tool(spec: &ToolSpec) -> WireTool {
    let schema = match &spec.input_schema {
        Value::Object(m) => m.clone(),
        _ => serde_json::Map::new(),
    };
    let (read_only, idempotent, destructive) = match spec.effect {
        Effect::ReadOnly => (true, true, false),
        Effect::IdempotentWrite => (false, true, true),
        Effect::NonIdempotentWrite => (false, false, true),
    };
    // A source's own annotations (an upstream's title, say) are kept; the
    // behaviour hints are always the operator's effect.
    let mut annotations = spec
        .shown
        .annotations
        .clone()
        .and_then(|a| serde_json::from_value::<ToolAnnotations>(a).ok())
        .unwrap_or_default();
    annotations.read_only_hint = Some(read_only);
    annotations.idempotent_hint = Some(idempotent);
    annotations.destructive_hint = Some(destructive);
    let task = match spec.task {
        TaskMode::Never => "never",
        TaskMode::Optional => "optional",
        TaskMode::Required => "required",
    };
    let mut meta = rmcp::model::MetaObject::default();
    meta.0
        .insert("dev.taskgate/taskSupport".into(), json!(task));
    let mut tool = WireTool::new(spec.name.clone(), spec.description.clone(), schema)
        .with_annotations(annotations)
        .with_meta(meta);
    tool.title = spec.shown.title.clone();
    if let Some(Value::Object(output)) = &spec.shown.output_schema {
        tool.output_schema = Some(Arc::new(output.clone()));
    }
    tool
}

impl ServerHandler for Handler {
    fn get_info(&self) -> ServerConfig {
        let builder = ServerCapabilities::builder().enable_tools();
        // Advertised to every 2026-07-28 request once the store opened (the
        // daemon does not serve otherwise), also after a disk error has
        // disabled it: then tasks/* answer TG_STORE_UNAVAILABLE, which says
        // what happened, rather than method-not-found, and calls run
        // synchronously.
        let capabilities = if !self.is_legacy() {
            builder.enable_tasks().build()
        } else {
            builder.build()
        };
        let mut info = ServerConfig::new(capabilities);
        info.server_info = Implementation::new("taskgate", env!("CARGO_PKG_VERSION"));
        // A legacy session cannot use tasks/*: its instructions do not
        // mention them.
        info.instructions = Some(if self.is_legacy() {
            "Tools run synchronously on this connection. Long-running tools can return a durable task that survives a lost connection only to clients of protocol 2026-07-28 that declare the io.modelcontextprotocol/tasks extension.".into()
        } else {
            "Long-running tools return a durable task when the request declares the io.modelcontextprotocol/tasks extension; poll tasks/get at pollIntervalMs (an earlier poll is held until due, never refused). Put an operation ID in _meta[\"dev.taskgate/operationId\"] to make a retried call return the same task.".into()
        });
        info
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        // A legacy session: the Tasks extension does not exist for it.
        let started = Instant::now();
        self.legacy.store(true, Ordering::Relaxed);
        context.peer.set_peer_info(request.clone());
        let outcome = self.negotiate_initialize(&request);
        observe("initialize", None, started, &outcome, false);
        outcome
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let started = Instant::now();
        let outcome = Ok(ListToolsResult::with_all_items(self.wire_tools()));
        observe("tools/list", None, started, &outcome, false);
        outcome
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let started = Instant::now();
        let tool = request.name.to_string();
        let outcome = self.call(request, context).await;
        let tool_error =
            matches!(&outcome, Ok(CallToolResponse::Complete(r)) if r.is_error == Some(true));
        observe("tools/call", Some(&tool), started, &outcome, tool_error);
        outcome
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let started = Instant::now();
        let outcome = self.get(request, context).await;
        observe("tasks/get", None, started, &outcome, false);
        outcome
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let started = Instant::now();
        let outcome = self.cancel(request, context).await;
        observe("tasks/cancel", None, started, &outcome, false);
        outcome
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let started = Instant::now();
        let outcome = self.update(request, context).await;
        observe("tasks/update", None, started, &outcome, false);
        outcome
    }
}

/// The requests' work, which the trait's methods time and count.
impl Handler {
    async fn call(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let operation_id = match context.meta.0.get(OPERATION_ID_META_KEY) {
            None => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err(convert::error(crate::tasks::TaskError::InvalidOperationId)),
        };
        let call = Call {
            tool: request.name.to_string(),
            arguments: request.arguments,
            caller: self.caller(&context)?,
            negotiated: self.negotiated(&context),
            operation_id,
            client_cancel: context.ct.clone(),
        };
        // A router in front of taskgate sends an execution envelope: it is
        // echoed unchanged with the answer, so that the router can tell this
        // answer belongs to its submission.
        let envelope = context.meta.0.get(EXECUTION_META_KEY).cloned();
        let echo = |meta: Option<rmcp::model::MetaObject>| match &envelope {
            Some(e) => {
                let mut m = meta.unwrap_or_default();
                m.0.insert(EXECUTION_META_KEY.into(), e.clone());
                Some(m)
            }
            None => meta,
        };
        match self.svc.call(call).await.map_err(convert::error)? {
            Delivery::Now(result) => {
                let mut result = convert::tool_result(result)?;
                result.meta = echo(result.meta.take());
                Ok(CallToolResponse::Complete(result))
            }
            Delivery::Task(record) => {
                // Kept for the task's later answers: a router checks its
                // echo on each of them.
                if let Some(e) = &envelope {
                    self.svc.echoes().remember(&record.id, e);
                }
                let mut created = CreateTaskResult::new(convert::task(&record));
                created.meta = echo(convert::task_meta(&record));
                Ok(CallToolResponse::Task(created))
            }
            Delivery::Routed {
                task,
                meta: entries,
            } => {
                let mut created = CreateTaskResult::new(convert::task(&task));
                let mut meta = created.meta.take().unwrap_or_default();
                meta.0.extend(entries);
                created.meta = echo(Some(meta));
                Ok(CallToolResponse::Task(created))
            }
        }
    }

    async fn get(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        self.refuse_legacy("tasks/get")?;
        let record = self
            .svc
            .get(&request.task_id, &self.caller(&context)?)
            .await
            .map_err(convert::error)?;
        // The caller owns the task (or the get was refused above): the
        // envelope its router sent comes back with every answer, and the
        // proposal an approval task waits on is named to its owner.
        let echo = self.svc.echoes().of(&record.id);
        let mut meta = convert::task_meta(&record);
        let mut result = GetTaskResult::new(convert::detailed(record));
        if let Some(e) = echo {
            meta.get_or_insert_with(rmcp::model::MetaObject::default)
                .0
                .insert(EXECUTION_META_KEY.into(), e);
        }
        result.meta = meta;
        Ok(result)
    }

    async fn cancel(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.refuse_legacy("tasks/cancel")?;
        self.svc
            .cancel(&request.task_id, &self.caller(&context)?)
            .await
            .map_err(convert::error)
    }

    async fn update(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.refuse_legacy("tasks/update")?;
        self.svc
            .update(&request.task_id, &self.caller(&context)?)
            .await
            .map_err(convert::error)
    }
}
