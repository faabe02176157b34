//! The task service: admission of tool calls, background execution,
//! polling, cancellation and shutdown. Shared by every transport and every
//! per-request protocol handler.
//!
//! Order of a background call: admission (tool exists, arguments valid, a
//! running slot free) → the task row is committed → only then the process
//! starts. A store that is busy, full or disabled makes the call run
//! synchronously instead; a creation reference already used by the owner
//! returns the existing task and runs nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{CallToolResult, CreateTaskResult, ErrorData, GetTaskResult};
use serde_json::{Map, Value, json};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::convert;
use crate::artifacts::Artifacts;
use crate::config::TaskSettings;
use crate::exec::{Registry, RunError, Tool, process};
use crate::store::{
    Created, Digest, MAX_PAYLOAD_BYTES, NewTask, Outcome, Store, StoreError, TaskId, TaskRecord,
    TaskStatus,
};
use crate::wire;

/// The `_meta` key under which a client names the operation a call belongs
/// to, so that a retry after a lost reply returns the same task.
pub const OPERATION_ID_META_KEY: &str = "dev.taskgate/operationId";
/// Longest operation reference accepted.
pub const MAX_OPERATION_ID_BYTES: usize = 256;
/// The built-in tool that returns a spilled result to its owner.
pub const ARTIFACT_READ_TOOL: &str = "artifact_read";
/// The benchmark's built-in tool: only present in a daemon started by
/// `taskgate bench` (`serve --bench-tool`). It completes at once and runs
/// nothing, so the benchmark measures taskgate, not a tool.
pub const BENCH_TOOL: &str = "taskgate_bench_noop";
/// Polls a client may make in quick succession (right after creation, right
/// after completion) before the advertised interval is enforced.
pub const POLL_BURST: f64 = 3.0;
/// How long shutdown waits for background tasks to stop, beyond the grace.
const SHUTDOWN_SLACK: Duration = Duration::from_secs(5);

/// The owner of every task until authentication arrives: whoever can reach
/// the loopback listener or the stdio pipe.
pub fn local_owner() -> Digest {
    Digest::of_parts(&[b"taskgate-owner", b"local"])
}

/// A background task running in this process.
struct Running {
    token: CancellationToken,
    /// The owner asked to cancel (as opposed to the daemon stopping).
    cancel_requested: AtomicBool,
}

/// A token bucket: [`POLL_BURST`] polls at once, refilled at one per
/// advertised poll interval.
#[derive(Clone, Copy)]
struct PollBudget {
    tokens: f64,
    at: Instant,
}

impl PollBudget {
    fn refilled(self, interval: Duration) -> PollBudget {
        let earned = self.at.elapsed().as_secs_f64() / interval.as_secs_f64().max(1e-3);
        PollBudget {
            tokens: (self.tokens + earned).min(POLL_BURST),
            at: Instant::now(),
        }
    }
}

/// What a background task runs.
enum Work {
    Command {
        tool: Arc<Tool>,
        args: Map<String, Value>,
    },
    Bench,
}

impl Work {
    fn name(&self) -> &str {
        match self {
            Work::Command { tool, .. } => tool.name(),
            Work::Bench => BENCH_TOOL,
        }
    }

    fn args(&self) -> Map<String, Value> {
        match self {
            Work::Command { args, .. } => args.clone(),
            Work::Bench => Map::new(),
        }
    }
}

fn bench_result() -> Value {
    json!({"resultType": "complete", "content": [{"type": "text", "text": "ok"}], "isError": false})
}

/// How the result of a call is delivered.
pub enum Delivery {
    Now(CallToolResult),
    Task(CreateTaskResult),
}

pub struct TaskService {
    store: Store,
    tools: Registry,
    artifacts: Artifacts,
    settings: TaskSettings,
    max_polls_tracked: usize,
    slots: Arc<Semaphore>,
    /// Synchronous calls in flight (stdio has no HTTP-level limit).
    sync_slots: Arc<Semaphore>,
    running: Mutex<HashMap<TaskId, Arc<Running>>>,
    /// Poll budget per (owner, task): only authorised, retained IDs.
    polls: Mutex<HashMap<(Digest, TaskId), PollBudget>>,
    stopping: AtomicBool,
    /// Serve [`BENCH_TOOL`] (only under `taskgate bench`).
    bench_tool: AtomicBool,
    /// Cancelled when the daemon stops: every run's token descends from it.
    stop: CancellationToken,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl TaskService {
    pub fn new(
        store: Store,
        tools: Registry,
        artifacts: Artifacts,
        settings: TaskSettings,
        max_live_tasks: u64,
        max_concurrent_requests: usize,
    ) -> Arc<TaskService> {
        Arc::new(TaskService {
            slots: Arc::new(Semaphore::new(settings.max_running)),
            sync_slots: Arc::new(Semaphore::new(max_concurrent_requests)),
            store,
            tools,
            artifacts,
            settings,
            max_polls_tracked: max_live_tasks as usize,
            running: Mutex::new(HashMap::new()),
            polls: Mutex::new(HashMap::new()),
            stopping: AtomicBool::new(false),
            bench_tool: AtomicBool::new(false),
            stop: CancellationToken::new(),
        })
    }

    /// Adds the benchmark's built-in tool (`serve --bench-tool`).
    pub fn enable_bench_tool(&self) {
        self.bench_tool.store(true, Ordering::Relaxed);
    }

    pub fn bench_tool_enabled(&self) -> bool {
        self.bench_tool.load(Ordering::Relaxed)
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn tools(&self) -> &Registry {
        &self.tools
    }

    pub fn running_count(&self) -> usize {
        lock(&self.running).len()
    }

    /// Whether the Tasks extension can be offered right now.
    pub fn tasks_available(&self) -> bool {
        self.store.disabled_reason().is_none() && !self.stopping.load(Ordering::Relaxed)
    }

    /// Admits and runs one tool call. `negotiated`: this request declared
    /// the Tasks extension on protocol 2026-07-28 or later.
    pub async fn call(
        self: &Arc<Self>,
        name: &str,
        arguments: Option<Map<String, Value>>,
        owner: Digest,
        negotiated: bool,
        operation_id: Option<String>,
        client_cancel: CancellationToken,
    ) -> Result<Delivery, ErrorData> {
        if name == ARTIFACT_READ_TOOL {
            return self
                .artifact_read(arguments, owner)
                .await
                .map(Delivery::Now);
        }
        if name == BENCH_TOOL && self.bench_tool_enabled() {
            if negotiated
                && self.tasks_available()
                && let Some(created) = self
                    .try_background(Work::Bench, owner, operation_id)
                    .await?
            {
                return Ok(Delivery::Task(created));
            }
            return serde_json::from_value::<CallToolResult>(bench_result())
                .map(Delivery::Now)
                .map_err(|e| ErrorData::internal_error(e.to_string(), None));
        }
        let Some(tool) = self.tools.get(name) else {
            return Err(convert::error(
                wire::UNKNOWN_TOOL,
                format!("unknown tool {name:?}"),
                None,
            ));
        };
        let args = arguments.unwrap_or_default();
        let args_value = Value::Object(args.clone());
        tool.validate(&args_value).map_err(|e| {
            convert::error(
                wire::INVALID_ARGUMENTS,
                e.to_string(),
                Some(json!({"location": e.location})),
            )
        })?;
        let mode = tool.task_mode();
        if mode == crate::config::TaskMode::Required && !negotiated {
            return Err(ErrorData::missing_required_client_capability(
                rmcp::model::ClientCapabilities::builder()
                    .enable_tasks()
                    .build(),
            ));
        }
        if let Some(op) = &operation_id
            && (op.is_empty() || op.len() > MAX_OPERATION_ID_BYTES)
        {
            return Err(ErrorData::invalid_params(
                format!(
                    "_meta[{OPERATION_ID_META_KEY:?}] must be 1-{MAX_OPERATION_ID_BYTES} bytes"
                ),
                None,
            ));
        }
        if negotiated && mode != crate::config::TaskMode::Never && self.tasks_available() {
            // `None`: the store or the slots said no; run it now instead.
            let work = Work::Command {
                tool: tool.clone(),
                args: args.clone(),
            };
            if let Some(created) = self.try_background(work, owner, operation_id).await? {
                return Ok(Delivery::Task(created));
            }
        }
        self.run_now(&tool, &args, client_cancel)
            .await
            .map(Delivery::Now)
    }

    /// Creates the task and starts it; `None` means "run synchronously".
    async fn try_background(
        self: &Arc<Self>,
        work: Work,
        owner: Digest,
        operation_id: Option<String>,
    ) -> Result<Option<CreateTaskResult>, ErrorData> {
        let Ok(permit) = self.slots.clone().try_acquire_owned() else {
            tracing::info!(
                tool = work.name(),
                max_running = self.settings.max_running,
                "all background slots busy; running the call synchronously"
            );
            return Ok(None);
        };
        let request = Digest::of(
            convert::canonical_json(&json!({"tool": work.name(), "arguments": work.args()}))
                .as_bytes(),
        );
        let reference = operation_id.map(|op| Digest::of_parts(&[b"operation", op.as_bytes()]));
        let new = NewTask {
            owner,
            reference,
            request: Some(request),
            ttl_ms: self.settings.default_ttl.as_millis() as i64,
            poll_interval_ms: self.settings.poll_interval.as_millis() as i64,
            status_message: None,
        };
        match self.store.create(new).await {
            Ok(Created::New(record)) => {
                let running = Arc::new(Running {
                    token: self.stop.child_token(),
                    cancel_requested: AtomicBool::new(false),
                });
                lock(&self.running).insert(record.id.clone(), running.clone());
                tracing::debug!(task = %record.id, tool = work.name(), "task created; starting it");
                let svc = self.clone();
                let id = record.id.clone();
                tokio::spawn(async move {
                    svc.run_background(id, owner, work, running, permit).await;
                });
                Ok(Some(CreateTaskResult::new(convert::task(&record))))
            }
            Ok(Created::Existing(record)) => {
                tracing::info!(task = %record.id, tool = work.name(),
                    "operation reference already used: returning the existing task, running nothing");
                Ok(Some(CreateTaskResult::new(convert::task(&record))))
            }
            Err(StoreError::Conflict) => Err(convert::error(
                wire::IDEMPOTENCY_CONFLICT,
                "this operation reference was already used for a call with different arguments",
                None,
            )),
            Err(e) => {
                tracing::warn!(tool = work.name(), error = %e,
                    "task store cannot take the task; running the call synchronously");
                Ok(None)
            }
        }
    }

    async fn run_now(
        &self,
        tool: &Arc<Tool>,
        args: &Map<String, Value>,
        client_cancel: CancellationToken,
    ) -> Result<CallToolResult, ErrorData> {
        let Ok(_slot) = self.sync_slots.try_acquire() else {
            return Err(convert::error(
                wire::SERVER_BUSY,
                "too many calls in flight; retry shortly",
                None,
            ));
        };
        // Stopped by the client's cancellation or by the daemon stopping.
        let token = self.stop.child_token();
        let watch = {
            let token = token.clone();
            tokio::spawn(async move {
                client_cancel.cancelled().await;
                token.cancel();
            })
        };
        let inv = tool.invocation(args, self.settings.cancel_grace);
        let run = process::run(&inv, &token).await;
        watch.abort();
        match convert::outcome_of(tool.name(), run) {
            Outcome::Result(v) => serde_json::from_value::<CallToolResult>(v)
                .map_err(|e| ErrorData::internal_error(format!("result encoding: {e}"), None)),
            Outcome::Error(body) => Err(convert::error_data(&body)),
        }
    }

    async fn run_background(
        self: Arc<Self>,
        id: TaskId,
        owner: Digest,
        work: Work,
        running: Arc<Running>,
        _permit: OwnedSemaphorePermit,
    ) {
        let (status, outcome) = match &work {
            Work::Bench => (TaskStatus::Completed, Some(Outcome::Result(bench_result()))),
            Work::Command { tool, args } => {
                let inv = tool.invocation(args, self.settings.cancel_grace);
                match process::run(&inv, &running.token).await {
                    Err(RunError::Cancelled) if running.cancel_requested.load(Ordering::SeqCst) => {
                        (TaskStatus::Cancelled, None)
                    }
                    Err(RunError::Cancelled) => (TaskStatus::Failed, Some(Outcome::interrupted())),
                    other => match convert::outcome_of(tool.name(), other) {
                        o @ Outcome::Result(_) => (TaskStatus::Completed, Some(o)),
                        o @ Outcome::Error(_) => (TaskStatus::Failed, Some(o)),
                    },
                }
            }
        };
        let (status, outcome) = self.fit_in_record(&id, &owner, status, outcome);
        match self.store.finish(&id, status, None, outcome).await {
            Ok(Some(r)) => tracing::debug!(task = %id, status = r.status.as_str(), "task finished"),
            Ok(None) => tracing::info!(task = %id, "task expired before it finished"),
            Err(e) => tracing::error!(task = %id, error = %e,
                "could not record the task's outcome; a restart will mark it failed"),
        }
        lock(&self.running).remove(&id);
    }

    /// A result too large for the record is spilled to an artifact; if that
    /// fails the task fails rather than keep a truncated result.
    fn fit_in_record(
        &self,
        id: &TaskId,
        owner: &Digest,
        status: TaskStatus,
        outcome: Option<Outcome>,
    ) -> (TaskStatus, Option<Outcome>) {
        let Some(Outcome::Result(result)) = &outcome else {
            return (status, outcome);
        };
        let size = serde_json::to_vec(&outcome)
            .map(|v| v.len())
            .unwrap_or(usize::MAX);
        if size <= MAX_PAYLOAD_BYTES - 512 {
            return (status, outcome);
        }
        let is_error = result
            .get("isError")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        match self.artifacts.write(id, owner, result) {
            Ok(bytes) => (
                status,
                Some(Outcome::Result(convert::spilled_pointer(
                    id.as_str(),
                    bytes,
                    is_error,
                ))),
            ),
            Err(e) => {
                tracing::error!(task = %id, error = %e, "spilling a large result failed; the task fails");
                (
                    TaskStatus::Failed,
                    Some(Outcome::Error(convert::error_body(
                        wire::RESULT_TOO_LARGE,
                        format!("the result could not be stored: {e}"),
                    ))),
                )
            }
        }
    }

    /// The whole result of one of the owner's tasks, while the task is
    /// visible: an expired task's artifact is gone at once, whether or not
    /// the sweep has deleted its file yet.
    async fn artifact_read(
        &self,
        arguments: Option<Map<String, Value>>,
        owner: Digest,
    ) -> Result<CallToolResult, ErrorData> {
        let unavailable = || {
            convert::error(
                wire::ARTIFACT_UNAVAILABLE,
                "no stored result for this task",
                None,
            )
        };
        let id = arguments
            .as_ref()
            .and_then(|a| a.get("taskId"))
            .and_then(Value::as_str)
            .ok_or_else(|| {
                convert::error(
                    wire::INVALID_ARGUMENTS,
                    "artifact_read needs {\"taskId\": \"tg-…\"}",
                    Some(json!({"location": "arguments/taskId"})),
                )
            })?;
        let id = TaskId::parse(id).ok_or_else(unavailable)?;
        match self.store.get(&id, &owner).await {
            Ok(Some(_)) => {}
            Ok(None) => return Err(unavailable()),
            Err(e) => return Err(self.store_error(e)),
        }
        match self.artifacts.read(&id, &owner) {
            Ok(Some(v)) => serde_json::from_value::<CallToolResult>(v)
                .map_err(|e| ErrorData::internal_error(format!("artifact encoding: {e}"), None)),
            Ok(None) => Err(unavailable()),
            Err(e) => {
                tracing::error!(task = %id, error = %e, "reading an artifact failed");
                Err(unavailable())
            }
        }
    }

    fn unknown_task(&self) -> ErrorData {
        convert::error(wire::UNKNOWN_TASK, "task not found", None)
    }

    fn store_error(&self, e: StoreError) -> ErrorData {
        match e {
            StoreError::Busy { .. } => convert::error(wire::STORE_BUSY, e.to_string(), None),
            StoreError::Capacity(_) => convert::error(wire::STORE_CAPACITY, e.to_string(), None),
            StoreError::Disabled { .. } | StoreError::Uncertain { .. } | StoreError::Stopped => {
                convert::error(
                    wire::STORE_UNAVAILABLE,
                    "the task store is unavailable",
                    None,
                )
            }
            other => ErrorData::internal_error(other.to_string(), None),
        }
    }

    /// Looks up the owner's task; `None` for unknown, expired and foreign
    /// IDs alike.
    async fn owned(&self, id: &str, owner: &Digest) -> Result<TaskRecord, ErrorData> {
        let Some(id) = TaskId::parse(id) else {
            return Err(self.unknown_task());
        };
        match self.store.get(&id, owner).await {
            Ok(Some(r)) => Ok(r),
            Ok(None) => Err(self.unknown_task()),
            Err(e) => Err(self.store_error(e)),
        }
    }

    /// `tasks/get`, with the advertised poll interval enforced per task: a
    /// short burst is allowed, a sustained faster rate is refused before it
    /// reaches the store.
    pub async fn get(&self, id: &str, owner: Digest) -> Result<GetTaskResult, ErrorData> {
        let interval = self.settings.poll_interval;
        if let Some(parsed) = TaskId::parse(id)
            && let Some(budget) = lock(&self.polls).get(&(owner, parsed))
        {
            let budget = budget.refilled(interval);
            if budget.tokens < 1.0 {
                let wait = ((1.0 - budget.tokens) * interval.as_secs_f64() * 1000.0).ceil() as u64;
                return Err(convert::error(
                    wire::POLL_TOO_SOON,
                    format!("polled faster than pollIntervalMs; poll again in {wait} ms"),
                    Some(json!({"retryAfterMs": wait})),
                ));
            }
        }
        let record = self.owned(id, &owner).await?;
        self.spend_poll(owner, record.id.clone());
        Ok(GetTaskResult::new(convert::detailed(&record)))
    }

    fn spend_poll(&self, owner: Digest, id: TaskId) {
        let interval = self.settings.poll_interval;
        let mut polls = lock(&self.polls);
        if let Some(b) = polls.get_mut(&(owner, id.clone())) {
            let mut next = b.refilled(interval);
            next.tokens -= 1.0;
            *b = next;
            return;
        }
        if polls.len() >= self.max_polls_tracked {
            // A full bucket restrains nothing: forget those.
            let full_after = interval.mul_f64(POLL_BURST);
            polls.retain(|_, b| b.at.elapsed() < full_after);
        }
        if polls.len() < self.max_polls_tracked {
            polls.insert(
                (owner, id),
                PollBudget {
                    tokens: POLL_BURST - 1.0,
                    at: Instant::now(),
                },
            );
        }
    }

    /// `tasks/cancel`: commit the intent, then stop the process. A finished
    /// task is acknowledged unchanged.
    pub async fn cancel(&self, id: &str, owner: Digest) -> Result<(), ErrorData> {
        let Some(parsed) = TaskId::parse(id) else {
            return Err(self.unknown_task());
        };
        let record = match self.store.request_cancel(&parsed, &owner).await {
            Ok(Some(r)) => r,
            Ok(None) => return Err(self.unknown_task()),
            Err(e) => return Err(self.store_error(e)),
        };
        if record.status.is_terminal() {
            return Ok(());
        }
        let running = lock(&self.running).get(&parsed).cloned();
        match running {
            Some(r) => {
                r.cancel_requested.store(true, Ordering::SeqCst);
                r.token.cancel();
                tracing::info!(task = %parsed, "cancellation requested; stopping the process group");
            }
            None => {
                // Not running here (it finished meanwhile): nothing to stop.
                let _ = self
                    .store
                    .finish(&parsed, TaskStatus::Cancelled, None, None)
                    .await;
            }
        }
        Ok(())
    }

    /// `tasks/update`: input is never requested, so nothing is retained;
    /// ownership is checked and the update acknowledged.
    pub async fn update(&self, id: &str, owner: Digest) -> Result<(), ErrorData> {
        self.owned(id, &owner).await.map(|_| ())
    }

    /// Stops admitting background work and stops everything that runs: a
    /// synchronous call gets an interruption error, a background task ends
    /// `failed` with the interruption error, never to be re-run. Returns
    /// once every background task has recorded its end (or the grace and
    /// some slack have passed).
    pub async fn shutdown(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.stop.cancel();
        let count = self.running_count();
        if count == 0 {
            return;
        }
        tracing::info!(
            count,
            "stopping background tasks; they end failed (interrupted)"
        );
        let deadline = Instant::now() + self.settings.cancel_grace + SHUTDOWN_SLACK;
        while self.running_count() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Deletes artifacts whose task has expired or gone (called periodically).
    pub async fn sweep_artifacts(&self, batch: usize) {
        let Ok(ids) = self.artifacts.list(batch) else {
            return;
        };
        if ids.is_empty() {
            return;
        }
        let Ok(alive) = self.store.unexpired(ids.clone()).await else {
            return;
        };
        for (id, alive) in ids.iter().zip(alive) {
            if !alive
                && !lock(&self.running).contains_key(id)
                && let Err(e) = self.artifacts.remove(id)
            {
                tracing::warn!(task = %id, error = %e, "could not delete an expired artifact");
            }
        }
    }
}
