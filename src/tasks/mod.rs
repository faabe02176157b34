//! The task domain: admission of tool calls, background running, polls,
//! cancellation, the built-in `artifact_read`, and stopping. Shared by
//! every transport and every per-request protocol handler; it speaks plain
//! values (`serde_json::Value`, store records, [`TaskError`]) and no
//! protocol library's types.
//!
//! Order of a background call: admission (not stopping, tool exists,
//! arguments valid, a running slot free) → the task row is committed → only
//! then the tool starts. A store that is busy, full or disabled makes a call
//! to an `optional` tool run synchronously instead (logged and counted by
//! reason, see [`Fallbacks`]); a `required` tool gets the refusal itself,
//! never a synchronous run. A creation reference already used by the owner
//! returns the existing task and runs nothing.
//!
//! `tasks.max_running` bounds every run that starts a process, background
//! or synchronous: a synchronous run holds a slot of the same semaphore, so
//! there are never more tool processes than the bound. With every slot
//! taken a call is refused at once (`TG_TASK_SLOTS_BUSY` for a `required`
//! tool, `TG_RUN_SLOTS_BUSY` otherwise), never queued. Only the benchmark's
//! no-op, which starts nothing, may still fall back to a synchronous run
//! without a slot.
//!
//! Owns the task domain. Every operation acts as an `auth::Caller`; the owner
//! its tasks are stored under is `owner_of(caller)`: the local owner, or sha256
//! over (issuer, tenant, subject), so two credentials of one subject share
//! tasks and nothing else does, and another owner's task answers exactly like
//! an unknown one. `scopes_needed(operation)` is the scope table (`tools:call`
//! plus the tool's effect scope; `tasks:read` for `tasks/get` and
//! `artifact_read`; `tasks:cancel` for cancel and update; `admin` implies all),
//! checked at admission before anything else (`TG_FORBIDDEN`). Per-owner
//! bounds: `tasks.max_running_per_owner` (an in-memory count per owner, whose
//! entries go with the owner's last run) and `store.max_live_tasks_per_owner`
//! (counted by the store in the creating transaction); past either,
//! `TG_OWNER_LIMIT` for that owner only, never a synchronous run instead.
//! `TaskService`: admission (stopping, scopes, tool, arguments, Tasks required,
//! operation reference, owner's slot, slot) → commit → start; every run,
//! background or synchronous, holds one of `tasks.max_running` slots (only a
//! built-in that starts no process, the bench no-op, may run without one): with
//! none free a call is refused at once (`TG_TASK_SLOTS_BUSY` for a `required`
//! tool, `TG_RUN_SLOTS_BUSY` otherwise); when the store cannot take a task
//! (busy, at capacity, disabled) a `required` tool gets that error
//! (`TG_STORE_*`) and an `optional` one runs synchronously on the slot it
//! already holds, each fallback logged with its reason and counted
//! (`fallbacks()`, shown in STATUS) — except a call that carries an operation
//! ID, which is never run synchronously on a store failure (it may be the retry
//! of a committed call whose answer was lost) and gets the store's error marked
//! retryable (`TaskError::StoreUnsettled`); a call with an operation ID that
//! meets a busy slot or its owner's running limit is looked up by its reference
//! first (`Store::find_reference`), so a retry gets its task whatever the
//! bounds say and only a new call is refused; poll pacing (`polls.rs`, the one
//! piece of task state held only in memory: a poll before its task's next read
//! is due is held until then, at most half of
//! `server.reserved_control_requests` at once, and past that answered with the
//! record the owner was last told while the task had no result (a finished
//! task's record is not kept in memory, so an early poll of it past the bound
//! reads the store); an early poll is never refused, and the store is read
//! about once per `pollIntervalMs` per task; bounded by the live-task limit;
//! held polls and those answered from memory are counted since the start,
//! `TaskService::early_polls`, for `status`); cancel (intent committed first);
//! the built-in `artifact_read`; request identity digests (`request.rs`);
//! stopping (`stop_admitting`, then `stop_running` waits for every run's
//! outcome). `TaskError` names each refusal and its wire code. Speaks
//! `serde_json::Value`, store records and `TaskError`: **no type of the MCP SDK**.
//! `approval.rs`: calls to a tool with `approval = "required"` pass
//! authentication, scopes, argument validation and the task-mode check, then
//! the gate (after which a spent approval goes on through normal admission,
//! synchronous or background): a held call gets an approval-status task (a
//! store row with the proposal and the journal sequence it projected, a status
//! message naming the proposal, which the create and `tasks/get` answers also
//! carry in `_meta["dev.taskgate/proposal"]`, and `approvals.poll_interval_ms`,
//! TTL at least an hour past the last moment its proposal can change) when the
//! request negotiated Tasks, else — and whenever that row cannot be committed —
//! the `approval_required` result with the proposal ID. The journal is appended
//! first, the row second; `tasks/get` and `tasks/cancel` of a waiting row read
//! the proposal (its expiry journaled first when due; a cancel journals
//! `call_cancellation` and projects whatever the journal then says) and project
//! it; a row whose proposal the journal does not hold, whose recorded sequence
//! is past the journal's head, or whose journal is disabled is
//! `TG_APPROVAL_EVIDENCE_MISSING`, never guessed; terminal rows never ask the
//! gate. Restart recovery leaves waiting approval rows alone (they are not
//! interrupted work).

mod approval;
mod artifact_read;
mod echoes;
mod error;
mod polls;
mod request;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use serde_json::{Map, Value};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::artifacts::Artifacts;
use crate::auth::{self, Caller};
use crate::config::{Effect, TaskMode, TaskSettings};
use crate::route::{self, MetaAnswer, Router};
use crate::store::{
    CapacityKind, Created, Digest, MAX_PAYLOAD_BYTES, NewTask, Outcome, ProposalRef, Store,
    StoreError, TaskId, TaskRecord, TaskStatus,
};
use crate::testhooks;
use crate::tools::{Lookup, Registry, RunError, Runner, ToolSpec};

use approval::Verdict;
pub use approval::{
    AdminRefusal, Approvals, ApprovalsStatus, Decider, Decision, MAX_LISTED_PROPOSALS, Proposal,
};
pub use artifact_read::ARTIFACT_READ_TOOL;
pub use error::{TaskError, store_wire};

/// The `_meta` key under which a client names the operation a call belongs
/// to, so that a retry after a lost reply returns the same task.
pub const OPERATION_ID_META_KEY: &str = "dev.taskgate/operationId";
/// The `_meta` key under which a task that waits on an approval names its
/// proposal, for the caller to give an administrator.
pub const PROPOSAL_META_KEY: &str = "dev.taskgate/proposal";
/// Longest operation reference accepted.
pub const MAX_OPERATION_ID_BYTES: usize = 256;
/// The extension a request declares to get tasks.
pub const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";
/// Room left in a record for the pointer that replaces a spilled result.
const SPILL_MARGIN: usize = 512;

/// The owner of the local caller's tasks: stdio, and loopback HTTP without
/// credentials where `[auth]` allows it (and everyone when no credentials
/// are configured).
pub fn local_owner() -> Digest {
    Digest::of_parts(&[b"taskgate-owner", b"local"])
}

/// The digest a caller's tasks are stored under. An authenticated caller
/// is its (issuer, tenant, subject): two credentials of one subject share
/// its tasks, and nothing else does. Stored only as this digest.
pub fn owner_of(caller: &Caller) -> Digest {
    match caller {
        Caller::Local => local_owner(),
        Caller::Authenticated(p) => Digest::of_parts(&[
            b"taskgate-owner",
            b"principal",
            p.issuer.as_bytes(),
            p.tenant.as_bytes(),
            p.subject.as_bytes(),
        ]),
    }
}

/// What a request asks of the task service, for its scope check.
#[derive(Debug, Clone, Copy)]
pub enum Operation<'a> {
    Call { tool: &'a str },
    Get,
    Cancel,
    Update,
}

/// The first bytes of an owner digest, enough to follow one caller through
/// the log without writing its identity there.
fn owner_tag(owner: &Digest) -> String {
    owner.to_hex()[..8].to_string()
}

/// One `tools/call`, as the protocol layer understood it.
pub struct Call {
    pub tool: String,
    pub arguments: Option<Map<String, Value>>,
    pub caller: Caller,
    /// This very request declared the Tasks extension on 2026-07-28 or later.
    pub negotiated: bool,
    pub operation_id: Option<String>,
    /// Cancelled when the client goes away or cancels the request.
    pub client_cancel: CancellationToken,
}

/// How the result of a call is delivered.
#[derive(Debug)]
pub enum Delivery {
    /// The tool result (the JSON shape of MCP's `CallToolResult`).
    Now(Value),
    /// The committed task the client polls.
    Task(TaskRecord),
    /// A durable route's committed task, with the `_meta` entries its
    /// answer carries (under `dev.taskgate/route`: the submission binding as
    /// committed, and its digests).
    Routed {
        task: TaskRecord,
        meta: serde_json::Map<String, Value>,
    },
}

/// Bounds the task service enforces at admission.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Poll budgets tracked at most (the live-task limit).
    pub max_polls_tracked: usize,
    /// Synchronous calls in flight (stdio has no HTTP-level limit).
    pub max_sync_calls: usize,
    /// Early polls held until their read is due; past it an early poll is
    /// answered from memory.
    pub max_held_polls: usize,
}

/// Why a call that asked for a task could not become one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FallbackReason {
    /// Every `tasks.max_running` slot was taken.
    SlotsBusy,
    /// The store's queue was full.
    StoreBusy,
    /// The live-task limit, the page cap or a full disk.
    StoreCapacity,
    /// The store is disabled (or failed otherwise).
    StoreUnavailable,
}

impl FallbackReason {
    pub const ALL: [FallbackReason; 4] = [
        FallbackReason::StoreCapacity,
        FallbackReason::SlotsBusy,
        FallbackReason::StoreBusy,
        FallbackReason::StoreUnavailable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FallbackReason::SlotsBusy => "slots_busy",
            FallbackReason::StoreBusy => "store_busy",
            FallbackReason::StoreCapacity => "store_capacity",
            FallbackReason::StoreUnavailable => "store_unavailable",
        }
    }

    /// The short word in the status line.
    fn word(self) -> &'static str {
        match self {
            FallbackReason::SlotsBusy => "slots",
            FallbackReason::StoreBusy => "store busy",
            FallbackReason::StoreCapacity => "capacity",
            FallbackReason::StoreUnavailable => "store unavailable",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    fn of(e: &StoreError) -> FallbackReason {
        match e {
            StoreError::Busy { .. } => FallbackReason::StoreBusy,
            StoreError::Capacity(_) => FallbackReason::StoreCapacity,
            _ => FallbackReason::StoreUnavailable,
        }
    }
}

/// Calls to `optional` tools that asked for a task and ran synchronously
/// instead, by reason, since the daemon started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fallbacks {
    pub slots_busy: u64,
    pub store_busy: u64,
    pub store_capacity: u64,
    pub store_unavailable: u64,
}

impl Fallbacks {
    pub fn get(&self, reason: FallbackReason) -> u64 {
        match reason {
            FallbackReason::SlotsBusy => self.slots_busy,
            FallbackReason::StoreBusy => self.store_busy,
            FallbackReason::StoreCapacity => self.store_capacity,
            FallbackReason::StoreUnavailable => self.store_unavailable,
        }
    }

    pub fn total(&self) -> u64 {
        FallbackReason::ALL.iter().map(|r| self.get(*r)).sum()
    }
}

/// `fallbacks 3 (capacity 2, slots 1)`: only the non-zero reasons; nothing
/// at all while there were none.
impl std::fmt::Display for Fallbacks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let total = self.total();
        if total == 0 {
            return Ok(());
        }
        let parts: Vec<String> = FallbackReason::ALL
            .iter()
            .filter(|r| self.get(**r) > 0)
            .map(|r| format!("{} {}", r.word(), self.get(*r)))
            .collect();
        write!(f, "fallbacks {total} ({})", parts.join(", "))
    }
}

/// A call that asked for a task and could not get one: `error` is what a
/// `required` tool answers with; `slot` is the running slot it had already
/// taken, which a synchronous run then holds.
struct Fallback {
    reason: FallbackReason,
    error: TaskError,
    slot: Option<OwnedSemaphorePermit>,
}

/// One of an owner's `tasks.max_running_per_owner` running places, given
/// back when the run ends.
struct OwnerSlot {
    counts: Arc<Mutex<HashMap<Digest, usize>>>,
    owner: Digest,
}

impl OwnerSlot {
    fn take(
        counts: &Arc<Mutex<HashMap<Digest, usize>>>,
        owner: Digest,
        max: usize,
    ) -> Option<OwnerSlot> {
        let mut map = lock(counts);
        let n = map.entry(owner).or_insert(0);
        if *n >= max {
            if *n == 0 {
                map.remove(&owner);
            }
            return None;
        }
        *n += 1;
        Some(OwnerSlot {
            counts: counts.clone(),
            owner,
        })
    }
}

impl Drop for OwnerSlot {
    fn drop(&mut self) {
        let mut map = lock(&self.counts);
        if let Some(n) = map.get_mut(&self.owner) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(&self.owner);
            }
        }
    }
}

/// A background task running in this process.
struct Running {
    token: CancellationToken,
    /// The owner asked to cancel (as opposed to the daemon stopping).
    cancel_requested: AtomicBool,
}

pub struct TaskService {
    store: Store,
    /// Tools and poll interval for calls admitted from now on; a reload
    /// replaces them whole (see [`TaskService::reload`]).
    live: RwLock<Arc<Live>>,
    artifacts: Artifacts,
    settings: TaskSettings,
    /// `tasks.max_running`: held by every run that starts a process.
    slots: Arc<Semaphore>,
    sync_slots: Arc<Semaphore>,
    running: Mutex<HashMap<TaskId, Arc<Running>>>,
    /// Background tasks running per owner, for `tasks.max_running_per_owner`
    /// (an owner's entry goes when its last run ends, so this holds at most
    /// `tasks.max_running` entries).
    owner_running: Arc<Mutex<HashMap<Digest, usize>>>,
    polls: polls::Polls,
    stopping: AtomicBool,
    /// Cancelled when the daemon stops: every run's token descends from it.
    stop: CancellationToken,
    /// Every background run, so that stopping can wait for their outcomes.
    tracker: TaskTracker,
    /// Tool runs started since the daemon started, background and
    /// synchronous: what an operator (and a restart's test) reads to know
    /// whether anything ran at all.
    runs_started: AtomicU64,
    /// Synchronous fallbacks by [`FallbackReason`].
    fallbacks: [AtomicU64; 4],
    /// Wakes the status line when a fallback was counted.
    fallback_noted: Notify,
    /// Durable routes to upstream tasks, once the daemon attached them.
    router: std::sync::OnceLock<Arc<Router>>,
    /// The approval gate, once the daemon attached it (only when a tool
    /// needs approval).
    approvals: std::sync::OnceLock<Arc<Approvals>>,
    /// Execution envelopes of routed submissions taskgate serves as a
    /// provider, echoed on their tasks' answers.
    echoes: echoes::Echoes,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a configuration reload may change, swapped as one value: a call
/// reads it at admission and keeps the `Arc<dyn Runner>` it found, so a
/// running task goes on with the tool definition it started with.
struct Live {
    tools: Registry,
    poll_interval: Duration,
}

impl TaskService {
    pub fn new(
        store: Store,
        tools: Registry,
        artifacts: Artifacts,
        settings: TaskSettings,
        limits: Limits,
    ) -> Arc<TaskService> {
        Arc::new(TaskService {
            slots: Arc::new(Semaphore::new(settings.max_running)),
            sync_slots: Arc::new(Semaphore::new(limits.max_sync_calls)),
            polls: polls::Polls::new(limits.max_polls_tracked, limits.max_held_polls),
            live: RwLock::new(Arc::new(Live {
                tools,
                poll_interval: settings.poll_interval,
            })),
            store,
            artifacts,
            settings,
            running: Mutex::new(HashMap::new()),
            owner_running: Arc::default(),
            stopping: AtomicBool::new(false),
            stop: CancellationToken::new(),
            tracker: TaskTracker::new(),
            runs_started: AtomicU64::new(0),
            fallbacks: Default::default(),
            fallback_noted: Notify::new(),
            router: std::sync::OnceLock::new(),
            approvals: std::sync::OnceLock::new(),
            echoes: echoes::Echoes::default(),
        })
    }

    /// The execution envelopes received with routed submissions, by task.
    pub fn echoes(&self) -> &echoes::Echoes {
        &self.echoes
    }

    /// Serves durable routes (the meta-tools and `tgr-` task IDs) through
    /// `router` from now on; a second router is ignored.
    pub fn attach_router(&self, router: Arc<Router>) {
        let _ = self.router.set(router);
    }

    pub fn router(&self) -> Option<&Arc<Router>> {
        self.router.get()
    }

    /// Holds calls to tools that need approval at `approvals`' gate from
    /// now on; a second one is ignored.
    pub fn attach_approvals(&self, approvals: Arc<Approvals>) {
        let _ = self.approvals.set(approvals);
    }

    pub fn approvals(&self) -> Option<&Arc<Approvals>> {
        self.approvals.get()
    }

    fn live(&self) -> Arc<Live> {
        self.live.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// A configuration reload: calls admitted from now on find `tools`,
    /// tasks created from now on advertise `poll_interval`, and polls from
    /// now on are paced by it. Nothing that runs is touched: an admitted call already
    /// holds its tool.
    pub fn reload(&self, tools: Registry, poll_interval: Duration) {
        let live = Arc::new(Live {
            tools,
            poll_interval,
        });
        *self.live.write().unwrap_or_else(|p| p.into_inner()) = live;
    }

    /// The tools calls are admitted to now (without `artifact_read`).
    pub fn tools(&self) -> Registry {
        self.live().tools.clone()
    }

    /// Every tool a client may call: the registry's and `artifact_read`.
    pub fn specs(&self) -> Vec<ToolSpec> {
        let mut specs: Vec<ToolSpec> = self.live().tools.specs();
        specs.push(artifact_read::spec());
        if let Some(router) = self.router() {
            specs.extend(router.specs());
        }
        specs
    }

    pub fn running_count(&self) -> usize {
        lock(&self.running).len()
    }

    /// Tool runs started since the daemon started: every call that reached
    /// its tool, background or synchronous (a refused call is none).
    pub fn runs_started(&self) -> u64 {
        self.runs_started.load(Ordering::Relaxed)
    }

    /// Early polls held until their task's read was due, and those
    /// answered from memory instead, since the daemon started.
    pub fn early_polls(&self) -> (u64, u64) {
        (
            self.polls.held_since_start(),
            self.polls.remembered_since_start(),
        )
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Synchronous fallbacks of `optional` tools so far, by reason.
    pub fn fallbacks(&self) -> Fallbacks {
        let n = |r: FallbackReason| self.fallbacks[r.index()].load(Ordering::Relaxed);
        Fallbacks {
            slots_busy: n(FallbackReason::SlotsBusy),
            store_busy: n(FallbackReason::StoreBusy),
            store_capacity: n(FallbackReason::StoreCapacity),
            store_unavailable: n(FallbackReason::StoreUnavailable),
        }
    }

    /// Resolves after a fallback was counted (once for any number of them
    /// since the last wait), so the status line can show it promptly.
    pub async fn fallback_noted(&self) {
        self.fallback_noted.notified().await;
    }

    fn note_fallback(&self, tool: &str, fallback: &Fallback) {
        self.fallbacks[fallback.reason.index()].fetch_add(1, Ordering::Relaxed);
        self.fallback_noted.notify_one();
        tracing::info!(
            tool,
            reason = fallback.reason.as_str(),
            cause = %fallback.error,
            "a call to {tool} could not become a task ({}); running it synchronously",
            fallback.reason.as_str()
        );
    }

    /// Admits and runs one tool call.
    pub async fn call(self: &Arc<Self>, call: Call) -> Result<Delivery, TaskError> {
        let owner = owner_of(&call.caller);
        let span = tracing::info_span!("call", tool = %call.tool, owner = %owner_tag(&owner));
        self.admit_and_run(call, owner).instrument(span).await
    }

    /// The scopes an operation needs. Every caller needs them; the local
    /// caller holds them all. The HTTP layer asks too, to answer a missing
    /// scope with its challenge before the protocol library sees the
    /// request; the check here is the one that decides.
    pub fn scopes_needed(&self, op: Operation<'_>) -> Vec<&'static str> {
        match op {
            Operation::Call { tool } if tool == ARTIFACT_READ_TOOL => vec![auth::SCOPE_TASKS_READ],
            Operation::Call { tool } => {
                let mut needed = vec![auth::SCOPE_TOOLS_CALL];
                match self.live().tools.get(tool).map(|t| t.spec().effect) {
                    Some(Effect::IdempotentWrite) => {
                        needed.push(auth::SCOPE_EFFECT_IDEMPOTENT_WRITE)
                    }
                    Some(Effect::NonIdempotentWrite) => {
                        needed.push(auth::SCOPE_EFFECT_NON_IDEMPOTENT_WRITE)
                    }
                    Some(Effect::ReadOnly) | None => {}
                }
                needed
            }
            Operation::Get => vec![auth::SCOPE_TASKS_READ],
            Operation::Cancel | Operation::Update => vec![auth::SCOPE_TASKS_CANCEL],
        }
    }

    /// Refuses a caller that lacks a scope `op` needs, naming every one.
    fn authorize(&self, caller: &Caller, op: Operation<'_>) -> Result<(), TaskError> {
        let missing = caller.missing(&self.scopes_needed(op));
        if missing.is_empty() {
            return Ok(());
        }
        Err(TaskError::Forbidden {
            missing: missing.iter().map(|s| s.to_string()).collect(),
        })
    }

    async fn admit_and_run(
        self: &Arc<Self>,
        call: Call,
        owner: Digest,
    ) -> Result<Delivery, TaskError> {
        // Held until this call has spawned its run or answered: stopping
        // waits for it, so a call admitted just before stopping began cannot
        // spawn a run that nobody waits for.
        let _in_flight = self.tracker.token();
        if self.is_stopping() {
            return Err(TaskError::Stopping);
        }
        if route::is_meta_tool(&call.tool)
            && let Some(router) = self.router()
        {
            return match router
                .call(
                    &call.tool,
                    call.arguments,
                    &call.caller,
                    owner,
                    call.negotiated,
                )
                .await
                .map_err(TaskError::Route)?
            {
                MetaAnswer::Result(v) => Ok(Delivery::Now(v)),
                MetaAnswer::Task { task, route } => {
                    let mut meta = serde_json::Map::new();
                    meta.insert(route::ROUTE_META_KEY.into(), route);
                    Ok(Delivery::Routed { task, meta })
                }
            };
        }
        self.authorize(&call.caller, Operation::Call { tool: &call.tool })?;
        if call.tool == ARTIFACT_READ_TOOL {
            return artifact_read::run(&self.store, &self.artifacts, call.arguments, owner)
                .await
                .map(Delivery::Now);
        }
        let tool = match self.live().tools.lookup(&call.tool) {
            Lookup::Found(tool) => tool,
            Lookup::Unknown => return Err(TaskError::UnknownTool(call.tool)),
            Lookup::Refused(e) => return Err(TaskError::run(&call.tool, &e)),
        };
        let args = call.arguments.unwrap_or_default();
        tool.validate(&Value::Object(args.clone()))
            .map_err(TaskError::InvalidArguments)?;
        let mode = tool.spec().task;
        if mode == TaskMode::Required && !call.negotiated {
            return Err(TaskError::TasksRequired(call.tool));
        }
        if let Some(op) = &call.operation_id
            && (op.is_empty() || op.len() > MAX_OPERATION_ID_BYTES)
        {
            return Err(TaskError::InvalidOperationId);
        }
        if let Some(rule) = tool.approval() {
            let Some(approvals) = self.approvals() else {
                return Err(TaskError::ApprovalsUnavailable {
                    tool: call.tool,
                    reason: "approvals are not set up in this process".into(),
                });
            };
            let now = self.store.clock().now_ms();
            match approvals
                .admit(&call.caller, owner, &call.tool, rule, &args, now)
                .await?
            {
                Verdict::Proceed { proposal } => {
                    tracing::info!(proposal = %proposal,
                        "approval {proposal} of this exact call is spent on it; it runs once");
                    testhooks::crash_point(testhooks::CRASH_APPROVAL_CONSUMED);
                }
                Verdict::Held {
                    proposal,
                    seq,
                    decision_deadline_ms,
                    joined,
                } => {
                    if joined {
                        tracing::info!(proposal = %proposal,
                            "the call joins proposal {proposal}, which waits for an administrator");
                    } else {
                        tracing::info!(
                            message_id = crate::events::APPROVAL_PROPOSED,
                            proposal = %proposal,
                            tool = %call.tool,
                            "a call to {} waits for an administrator's approval as proposal {proposal}",
                            call.tool
                        );
                        self.notify(approvals, &proposal);
                    }
                    return Ok(self
                        .held(
                            &call.tool,
                            owner,
                            call.negotiated,
                            approvals,
                            (proposal, seq),
                            decision_deadline_ms,
                            now,
                        )
                        .await);
                }
            }
        }
        let mut slot = None;
        if call.negotiated && mode != TaskMode::Never {
            match self
                .try_background(&tool, &args, owner, call.operation_id)
                .await?
            {
                Ok(record) => return Ok(Delivery::Task(record)),
                // A required tool gets a task or a clear error, never a
                // synchronous run.
                Err(fallback) if mode == TaskMode::Required => return Err(fallback.error),
                // No slot for a task is no slot for a synchronous run either.
                Err(Fallback {
                    reason: FallbackReason::SlotsBusy,
                    ..
                }) if tool.starts_process() => {
                    return Err(TaskError::RunSlotsBusy {
                        max_running: self.settings.max_running,
                    });
                }
                Err(mut fallback) => {
                    self.note_fallback(&call.tool, &fallback);
                    slot = fallback.slot.take();
                }
            }
        }
        self.run_now(tool.as_ref(), &args, call.client_cancel, slot)
            .await
            .map(Delivery::Now)
    }

    /// The answer to a held call: an approval-status task for a request
    /// that negotiated Tasks, else (or when the task cannot be committed)
    /// the `approval_required` result. The proposal is already journaled,
    /// so the workflow is never lost; a retry joins the same proposal and
    /// finds the same task.
    #[allow(clippy::too_many_arguments)]
    async fn held(
        &self,
        tool: &str,
        owner: Digest,
        negotiated: bool,
        approvals: &Approvals,
        (proposal, seq): (String, u64),
        decision_deadline_ms: i64,
        now: i64,
    ) -> Delivery {
        testhooks::crash_point(testhooks::CRASH_APPROVAL_PROPOSED);
        if negotiated {
            let new = NewTask {
                owner,
                reference: None,
                request: None,
                ttl_ms: approvals.ttl_ms(
                    self.settings.default_ttl.as_millis() as i64,
                    decision_deadline_ms,
                    now,
                ),
                poll_interval_ms: approvals.poll_interval_ms(),
                proposal: Some(approval::reference(&proposal, seq)),
            };
            match self.store.create(new).await {
                Ok(created) => {
                    if matches!(created, Created::New(_)) {
                        crate::metrics::get().task_created();
                    }
                    return Delivery::Task(created.record().clone());
                }
                Err(e) => tracing::warn!(error = %e, proposal = %proposal,
                    "the approval task for proposal {proposal} could not be committed ({e}); answering approval_required with the proposal instead"),
            }
        }
        Delivery::Now(approval::approval_required(
            tool,
            &proposal,
            decision_deadline_ms,
        ))
    }

    /// Runs `approvals.notify_tool` about a new proposal, in the
    /// background and within `tasks.max_running`; a notification that
    /// cannot run is logged and skipped, never holding the call up.
    fn notify(self: &Arc<Self>, approvals: &Approvals, proposal: &str) {
        let Some(name) = approvals.notify_tool() else {
            return;
        };
        let skipped = |why: String| {
            tracing::warn!(
                proposal,
                tool = name,
                "the notification of proposal {proposal} by tool {name} was skipped: {why}"
            );
        };
        let Some(tool) = self.live().tools.get(name) else {
            return skipped("no such tool is served (a reload removed it?)".into());
        };
        let Some(args) = approvals.notification(proposal) else {
            return skipped("the proposal is not in the journal".into());
        };
        if let Err(e) = tool.validate(&Value::Object(args.clone())) {
            return skipped(format!(
                "its input_schema refuses the notification's fields: {e}"
            ));
        }
        let Ok(slot) = self.slots.clone().try_acquire_owned() else {
            return skipped(format!(
                "all {} running slots are busy (tasks.max_running)",
                self.settings.max_running
            ));
        };
        let (svc, proposal, name) = (self.clone(), proposal.to_string(), name.to_string());
        self.runs_started.fetch_add(1, Ordering::Relaxed);
        self.tracker.spawn(async move {
            let _slot = slot;
            let token = svc.stop.child_token();
            match tool.run(&args, svc.settings.cancel_grace, &token).await {
                Ok(_) => tracing::info!(proposal = %proposal, tool = %name,
                    "tool {name} was told of proposal {proposal}"),
                Err(e) => {
                    tracing::warn!(proposal = %proposal, tool = %name, error = %e.message(&name),
                    "tool {name} failed to tell of proposal {proposal}: {}", e.message(&name))
                }
            }
        });
    }

    /// Brings a waiting approval task level with the journal: its
    /// decision, once there is one, is projected (journal first, then the
    /// task), and evidence the journal cannot give leaves it unavailable.
    async fn reconcile(&self, record: TaskRecord) -> Result<TaskRecord, TaskError> {
        let Some(waiting) = approval::waiting(&record).cloned() else {
            return Ok(record);
        };
        let Some(approvals) = self.approvals() else {
            return Err(TaskError::ApprovalEvidenceMissing {
                proposal: waiting.id,
                reason: "approvals are not set up in this process".into(),
            });
        };
        let now = self.store.clock().now_ms();
        let proposal = approvals.evidence(&waiting, now).await?;
        let Some((status, outcome)) = approval::projection(&proposal, now) else {
            return Ok(record);
        };
        testhooks::crash_point(testhooks::CRASH_APPROVAL_DECIDED);
        Ok(self
            .store
            .finish_projecting(&record.id, status, outcome, Some(proposal.seq))
            .await?
            .unwrap_or(record))
    }

    /// Creates the task and starts it; `Ok(Err(_))` says why it could not
    /// become a task (the caller decides whether to run it synchronously).
    async fn try_background(
        self: &Arc<Self>,
        tool: &Arc<dyn Runner>,
        args: &Map<String, Value>,
        owner: Digest,
        operation_id: Option<String>,
    ) -> Result<Result<TaskRecord, Fallback>, TaskError> {
        let name = tool.spec().name.as_str();
        if self.is_stopping() {
            return Err(TaskError::Stopping);
        }
        let reference = operation_id.as_deref().map(request::reference);
        let identity = request::identity(name, args);
        if let Some(reason) = self.store.disabled_reason() {
            let error = StoreError::Disabled { reason };
            if reference.is_some() {
                return Err(TaskError::StoreUnsettled(error));
            }
            return Ok(Err(Fallback {
                reason: FallbackReason::StoreUnavailable,
                error: TaskError::Store(error),
                slot: None,
            }));
        }
        let Ok(permit) = self.slots.clone().try_acquire_owned() else {
            // Only a new call waits for a slot: a retry gets its task.
            if let Some(existing) = self.retried(owner, reference.as_ref(), &identity).await? {
                return Ok(Ok(existing));
            }
            return Ok(Err(Fallback {
                reason: FallbackReason::SlotsBusy,
                error: TaskError::SlotsBusy {
                    max_running: self.settings.max_running,
                },
                slot: None,
            }));
        };
        // The owner's own bound, within the global one: a full daemon says
        // so first, whoever asks.
        let Some(owner_slot) = OwnerSlot::take(
            &self.owner_running,
            owner,
            self.settings.max_running_per_owner,
        ) else {
            drop(permit);
            if let Some(existing) = self.retried(owner, reference.as_ref(), &identity).await? {
                return Ok(Ok(existing));
            }
            return Err(TaskError::OwnerLimit(format!(
                "this caller already has {} tasks running (tasks.max_running_per_owner); wait for one to finish",
                self.settings.max_running_per_owner
            )));
        };
        let new = NewTask {
            owner,
            reference,
            request: Some(identity),
            ttl_ms: self.settings.default_ttl.as_millis() as i64,
            poll_interval_ms: self.live().poll_interval.as_millis() as i64,
            proposal: None,
        };
        match self.store.create(new).await {
            Ok(Created::New(record)) => {
                crate::metrics::get().task_created();
                let running = Arc::new(Running {
                    token: self.stop.child_token(),
                    cancel_requested: AtomicBool::new(false),
                });
                lock(&self.running).insert(record.id.clone(), running.clone());
                let span = tracing::info_span!(parent: None, "task", task = %record.id,
                    tool = name, owner = %owner_tag(&owner));
                tracing::debug!(parent: &span, "task created; starting it");
                let run = self.clone().run_background(
                    record.id.clone(),
                    owner,
                    tool.clone(),
                    args.clone(),
                    running,
                    (permit, owner_slot),
                );
                self.tracker.spawn(run.instrument(span));
                Ok(Ok(record))
            }
            Ok(Created::Existing(record)) => {
                tracing::info!(task = %record.id,
                    "operation reference already used: returning the existing task {}, running nothing", record.id);
                Ok(Ok(record))
            }
            Err(StoreError::Conflict) => Err(TaskError::IdempotencyConflict),
            // The owner's own limit: running the tool synchronously instead
            // would let one owner past it.
            Err(StoreError::Capacity(kind @ CapacityKind::OwnerTasks { .. })) => {
                Err(TaskError::OwnerLimit(kind.to_string()))
            }
            // A call with an operation ID may be the retry of one whose
            // task was committed and whose answer was lost: run now, it
            // could run twice. It gets the store's error and retries.
            Err(e) if operation_id.is_some() => Err(TaskError::StoreUnsettled(e)),
            Err(e) => Ok(Err(Fallback {
                reason: FallbackReason::of(&e),
                error: TaskError::Store(e),
                slot: Some(permit),
            })),
        }
    }

    /// The task a retried call already has, for a call that could not be
    /// admitted as a new one: `None` for a call without an operation ID,
    /// or when the store has no task under it (or cannot say, in which
    /// case the refusal the caller was about to give stands; nothing runs).
    async fn retried(
        &self,
        owner: Digest,
        reference: Option<&Digest>,
        identity: &Digest,
    ) -> Result<Option<TaskRecord>, TaskError> {
        let Some(reference) = reference else {
            return Ok(None);
        };
        match self
            .store
            .find_reference(&owner, reference, Some(identity))
            .await
        {
            Ok(Some(record)) => {
                tracing::info!(task = %record.id,
                    "operation reference already used: returning the existing task {}, running nothing", record.id);
                Ok(Some(record))
            }
            Ok(None) => Ok(None),
            Err(StoreError::Conflict) => Err(TaskError::IdempotencyConflict),
            Err(e) => {
                tracing::debug!(error = %e, "looking up a retried call's task failed: {e}");
                Ok(None)
            }
        }
    }

    /// Runs the tool in this request. A tool that starts a process holds a
    /// running slot throughout (`slot`, or one taken now); none free is an
    /// immediate refusal, never a wait.
    async fn run_now(
        &self,
        tool: &dyn Runner,
        args: &Map<String, Value>,
        client_cancel: CancellationToken,
        slot: Option<OwnedSemaphorePermit>,
    ) -> Result<Value, TaskError> {
        let _running_slot = match slot {
            Some(slot) => Some(slot),
            None if tool.starts_process() => match self.slots.clone().try_acquire_owned() {
                Ok(slot) => Some(slot),
                Err(_) => {
                    return Err(TaskError::RunSlotsBusy {
                        max_running: self.settings.max_running,
                    });
                }
            },
            None => None,
        };
        let Ok(_slot) = self.sync_slots.try_acquire() else {
            return Err(TaskError::ServerBusy);
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
        self.runs_started.fetch_add(1, Ordering::Relaxed);
        let run = tool.run(args, self.settings.cancel_grace, &token).await;
        watch.abort();
        count_result(&run);
        run.map_err(|e| TaskError::run(&tool.spec().name, &e))
    }

    async fn run_background(
        self: Arc<Self>,
        id: TaskId,
        owner: Digest,
        tool: Arc<dyn Runner>,
        args: Map<String, Value>,
        running: Arc<Running>,
        _slot: (OwnedSemaphorePermit, OwnerSlot),
    ) {
        let name = tool.spec().name.clone();
        self.runs_started.fetch_add(1, Ordering::Relaxed);
        let run = tool
            .run(&args, self.settings.cancel_grace, &running.token)
            .await;
        count_result(&run);
        let (status, outcome) = match run {
            Err(RunError::Cancelled) if running.cancel_requested.load(Ordering::SeqCst) => {
                (TaskStatus::Cancelled, None)
            }
            Err(RunError::Cancelled) => (TaskStatus::Failed, Some(Outcome::interrupted())),
            Err(e) => (
                TaskStatus::Failed,
                Some(Outcome::Error(TaskError::run(&name, &e).body())),
            ),
            Ok(result) => (TaskStatus::Completed, Some(Outcome::Result(result))),
        };
        let (status, outcome) = self.fit_in_record(&id, &owner, status, outcome);
        match self.store.finish_run(&id, status, outcome).await {
            Ok(Some(r)) => tracing::debug!(
                status = r.status.as_str(),
                "task {id} finished {}",
                r.status.as_str()
            ),
            Ok(None) => tracing::info!("task {id} expired before it finished"),
            Err(e) => tracing::error!(error = %e,
                "could not record the outcome of task {id}; a restart will mark it failed: {e}"),
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
        if size <= MAX_PAYLOAD_BYTES - SPILL_MARGIN {
            return (status, outcome);
        }
        let is_error = result
            .get("isError")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        match self.artifacts.write(id, owner, result) {
            Ok(stored) => (
                status,
                Some(Outcome::Result(artifact_read::pointer(
                    id,
                    artifact_read::output_bytes(result),
                    stored,
                    is_error,
                ))),
            ),
            Err(e) => {
                tracing::error!(error = %e, "spilling a large result failed; the task fails: {e}");
                let body = TaskError::Run {
                    code: crate::wire::RESULT_TOO_LARGE,
                    message: format!("the result could not be stored: {e}"),
                    data: None,
                }
                .body();
                (TaskStatus::Failed, Some(Outcome::Error(body)))
            }
        }
    }

    /// Looks up the owner's task: unknown, expired and foreign IDs alike
    /// are [`TaskError::UnknownTask`].
    async fn owned(&self, id: &str, owner: &Digest) -> Result<TaskRecord, TaskError> {
        let id = TaskId::parse(id).map_err(|_| TaskError::UnknownTask)?;
        self.store
            .get(&id, owner)
            .await?
            .ok_or(TaskError::UnknownTask)
    }

    /// `tasks/get`, with the advertised poll interval enforced per task.
    pub async fn get(&self, id: &str, caller: &Caller) -> Result<TaskRecord, TaskError> {
        let owner = owner_of(caller);
        let span = tracing::debug_span!("poll", task = id, owner = %owner_tag(&owner));
        if route::is_route_id(id) {
            return match self.router() {
                Some(router) => router
                    .get(id, caller, &owner)
                    .instrument(span)
                    .await
                    .map_err(TaskError::Route),
                None => Err(TaskError::UnknownTask),
            };
        }
        self.authorize(caller, Operation::Get)?;
        self.poll(id, owner).instrument(span).await
    }

    /// An early poll is never refused: it waits until its task's next read
    /// is due (or the daemon stops), or, when too many already wait, gets
    /// what this owner was last told. See [`polls`].
    async fn poll(&self, id: &str, owner: Digest) -> Result<TaskRecord, TaskError> {
        let parsed = TaskId::parse(id).map_err(|_| TaskError::UnknownTask)?;
        let interval = self.live().poll_interval;
        if let polls::Pace::Early { wait, last } = self.polls.pace(&owner, &parsed, interval) {
            match self.polls.hold(&owner) {
                Some(_held) => {
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = self.stop.cancelled() => {}
                    }
                    if let polls::Pace::Early { last, .. } =
                        self.polls.pace(&owner, &parsed, interval)
                        && let Some(record) = self.unexpired(last)
                    {
                        // Another poll of the same task is reading it now.
                        return Ok(record);
                    }
                }
                None => {
                    if let Some(record) = self.unexpired(last) {
                        self.polls.answered_from_memory();
                        return Ok(record);
                    }
                }
            }
        }
        let record = self.owned(id, &owner).await?;
        let record = self.reconcile(record).await?;
        tracing::debug!(task = %record.id.as_str(), "task read from the store");
        self.polls.answered(owner, &record);
        Ok(record)
    }

    /// A remembered record, unless it has expired since (then only the
    /// store may answer, and it says "not found").
    fn unexpired(&self, last: Option<Arc<TaskRecord>>) -> Option<TaskRecord> {
        let now = self.store.clock().now_ms();
        last.filter(|r| r.expires_ms > now).map(|r| (*r).clone())
    }

    /// `tasks/cancel`: commit the intent, then stop the run. A finished task
    /// is acknowledged unchanged.
    pub async fn cancel(&self, id: &str, caller: &Caller) -> Result<(), TaskError> {
        let owner = owner_of(caller);
        let span = tracing::info_span!("cancel", task = id, owner = %owner_tag(&owner));
        if route::is_route_id(id) {
            return match self.router() {
                Some(router) => router
                    .cancel(id, caller, &owner)
                    .instrument(span)
                    .await
                    .map_err(TaskError::Route),
                None => Err(TaskError::UnknownTask),
            };
        }
        self.authorize(caller, Operation::Cancel)?;
        self.cancel_owned(id, owner).instrument(span).await
    }

    async fn cancel_owned(&self, id: &str, owner: Digest) -> Result<(), TaskError> {
        let parsed = TaskId::parse(id).map_err(|_| TaskError::UnknownTask)?;
        let found = self.owned(id, &owner).await?;
        if let Some(waiting) = approval::waiting(&found) {
            return self.cancel_approval(&found, waiting, owner).await;
        }
        let record = self
            .store
            .request_cancel(&parsed, &owner)
            .await?
            .ok_or(TaskError::UnknownTask)?;
        if record.status.is_terminal() {
            return Ok(());
        }
        let running = lock(&self.running).get(&parsed).cloned();
        match running {
            Some(r) => {
                r.cancel_requested.store(true, Ordering::SeqCst);
                r.token.cancel();
                tracing::info!(task = %parsed, "cancellation of {parsed} requested; stopping the run");
            }
            None => {
                // Not running here (it finished meanwhile): nothing to stop.
                if let Err(e) = self
                    .store
                    .finish(&parsed, TaskStatus::Cancelled, None)
                    .await
                {
                    tracing::warn!(task = %parsed, error = %e, "could not record the cancellation of {parsed}: {e}");
                }
            }
        }
        Ok(())
    }

    /// Cancels the call an approval task waits for: `call_cancellation` is
    /// journaled, then the task projects what the journal says (cancelled,
    /// or the decision that came first).
    async fn cancel_approval(
        &self,
        record: &TaskRecord,
        waiting: &ProposalRef,
        owner: Digest,
    ) -> Result<(), TaskError> {
        let Some(approvals) = self.approvals() else {
            return Err(TaskError::ApprovalEvidenceMissing {
                proposal: waiting.id.clone(),
                reason: "approvals are not set up in this process".into(),
            });
        };
        let now = self.store.clock().now_ms();
        let proposal = approvals.cancel(waiting, owner, now).await?;
        tracing::info!(proposal = %proposal.id, state = proposal.state.as_str(),
            "the owner cancelled its approval task {}; proposal {} is {}", record.id, proposal.id, proposal.state.as_str());
        if let Some((status, outcome)) = approval::projection(&proposal, now) {
            self.store
                .finish_projecting(&record.id, status, outcome, Some(proposal.seq))
                .await?;
        }
        Ok(())
    }

    /// `tasks/update`: input is never requested, so nothing is retained;
    /// ownership is checked and the update acknowledged.
    pub async fn update(&self, id: &str, caller: &Caller) -> Result<(), TaskError> {
        if route::is_route_id(id) {
            return match self.router() {
                Some(router) => router
                    .update(id, caller, &owner_of(caller))
                    .await
                    .map_err(TaskError::Route),
                None => Err(TaskError::UnknownTask),
            };
        }
        self.authorize(caller, Operation::Update)?;
        self.owned(id, &owner_of(caller)).await.map(|_| ())
    }

    /// The first step of stopping: from now on every call is refused with
    /// [`TaskError::Stopping`]; polls and cancels are still answered.
    pub fn stop_admitting(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    /// Stops everything that runs: a synchronous call gets an interruption
    /// error, a background task ends `failed` with the interruption error,
    /// never to be re-run. Returns once every background run has recorded
    /// its end, or after `limit`.
    pub async fn stop_running(&self, limit: Duration) {
        self.stop_admitting();
        self.stop.cancel();
        self.tracker.close();
        let count = self.tracker.len();
        if count > 0 {
            tracing::info!(
                count,
                "stopping {count} background tasks; they end failed (interrupted)"
            );
        }
        let routes = async {
            if let Some(router) = self.router() {
                router.finish().await;
            }
        };
        if tokio::time::timeout(limit, async { tokio::join!(self.tracker.wait(), routes) })
            .await
            .is_err()
        {
            let remaining = self.tracker.len();
            tracing::warn!(
                remaining,
                "{remaining} background tasks did not record their end in time; a restart marks them failed"
            );
        }
    }

    /// The longest [`TaskService::stop_running`] should need: the grace a
    /// tool gets, and time to kill it and record the outcome.
    pub fn stop_limit(&self) -> Duration {
        self.settings.cancel_grace + Duration::from_secs(10)
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
                tracing::warn!(task = %id, error = %e, "could not delete the expired artifact of {id}: {e}");
            }
        }
    }
}

/// Counts how a tool run ended (`taskgate_tool_results_total`).
fn count_result(run: &Result<Value, RunError>) {
    use crate::metrics::ToolResult;
    let result = match run {
        Ok(v) if v.get("isError").and_then(Value::as_bool) == Some(true) => ToolResult::ToolError,
        Ok(_) => ToolResult::Success,
        Err(RunError::Cancelled) => ToolResult::Cancelled,
        Err(_) => ToolResult::Failed,
    };
    crate::metrics::get().tool_result(result);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fallback_summary_names_only_the_reasons_that_happened() {
        assert_eq!(Fallbacks::default().to_string(), "");
        let f = Fallbacks {
            slots_busy: 1,
            store_capacity: 2,
            ..Fallbacks::default()
        };
        assert_eq!(f.total(), 3);
        assert_eq!(f.to_string(), "fallbacks 3 (capacity 2, slots 1)");
    }
}
