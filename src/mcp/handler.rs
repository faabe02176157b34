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
use crate::config::{Effect, TaskMode};
use crate::store::Digest;
use crate::tasks::{Call, Delivery, OPERATION_ID_META_KEY, TaskService, local_owner};
use crate::tools::ToolSpec;
use crate::wire;

/// One protocol handler: per stdio connection, per legacy HTTP session, or
/// per stateless HTTP request. All share the task service.
pub struct Handler {
    svc: Arc<TaskService>,
    /// Set by `initialize`: this session speaks a pre-2026-07-28 protocol.
    legacy: AtomicBool,
}

impl Handler {
    pub fn new(svc: Arc<TaskService>) -> Handler {
        Handler {
            svc,
            legacy: AtomicBool::new(false),
        }
    }

    fn is_legacy(&self) -> bool {
        self.legacy.load(Ordering::Relaxed)
    }

    /// The owner of this request's tasks. Until authentication exists,
    /// everyone who can reach the daemon is the local owner.
    fn owner(&self, _context: &RequestContext<RoleServer>) -> Digest {
        local_owner()
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
    let mut annotations = ToolAnnotations::default();
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
    WireTool::new(spec.name.clone(), spec.description.clone(), schema)
        .with_annotations(annotations)
        .with_meta(meta)
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
        self.legacy.store(true, Ordering::Relaxed);
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.wire_tools()))
    }

    async fn call_tool(
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
            owner: self.owner(&context),
            negotiated: self.negotiated(&context),
            operation_id,
            client_cancel: context.ct.clone(),
        };
        match self.svc.call(call).await.map_err(convert::error)? {
            Delivery::Now(result) => convert::tool_result(result).map(CallToolResponse::Complete),
            Delivery::Task(record) => Ok(CallToolResponse::Task(CreateTaskResult::new(
                convert::task(&record),
            ))),
        }
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        self.refuse_legacy("tasks/get")?;
        let record = self
            .svc
            .get(&request.task_id, self.owner(&context))
            .await
            .map_err(convert::error)?;
        Ok(GetTaskResult::new(convert::detailed(&record)))
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.refuse_legacy("tasks/cancel")?;
        self.svc
            .cancel(&request.task_id, self.owner(&context))
            .await
            .map_err(convert::error)
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.refuse_legacy("tasks/update")?;
        self.svc
            .update(&request.task_id, self.owner(&context))
            .await
            .map_err(convert::error)
    }
}
