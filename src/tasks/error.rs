//! Why a task request was refused. Each variant knows its registered wire
//! code, so the protocol layer converts every refusal the same way and no
//! code is chosen anywhere else.

use serde_json::{Value, json};
use thiserror::Error;

pub use crate::route::store_wire;
use crate::store::{ErrorBody, StoreError};
use crate::tools::{ArgumentError, RunError};
use crate::wire::{self, WireCode};

use super::{MAX_OPERATION_ID_BYTES, OPERATION_ID_META_KEY};

#[derive(Debug, Error)]
pub enum TaskError {
    #[error("unknown tool {0:?}")]
    UnknownTool(String),
    #[error("{0}")]
    InvalidArguments(ArgumentError),
    #[error(
        "tool {0:?} runs only as a task: declare the io.modelcontextprotocol/tasks extension on protocol 2026-07-28"
    )]
    TasksRequired(String),
    #[error(
        "_meta[{OPERATION_ID_META_KEY:?}] must be a string of 1-{MAX_OPERATION_ID_BYTES} bytes"
    )]
    InvalidOperationId,
    #[error("this operation reference was already used for a call with different arguments")]
    IdempotencyConflict,
    /// Unknown, expired and another owner's IDs: one answer for all three.
    #[error("task not found")]
    UnknownTask,
    /// The caller's credential lacks scopes this operation needs.
    #[error(
        "this credential lacks the scope{} {} needed here; ask for a token that grants {}",
        if missing.len() == 1 { "" } else { "s" },
        missing.join(", "),
        if missing.len() == 1 { "it" } else { "them" }
    )]
    Forbidden { missing: Vec<String> },
    /// The caller is at one of its own limits (the message names it).
    #[error("{0}")]
    OwnerLimit(String),
    #[error("too many calls in flight; retry shortly")]
    ServerBusy,
    /// Every running slot is taken and the tool runs only as a task.
    #[error(
        "all {max_running} background task slots are busy (tasks.max_running); this tool runs only as a task, retry shortly"
    )]
    SlotsBusy { max_running: usize },
    /// Every running slot is taken, and the call would have run the tool
    /// synchronously: a synchronous run counts against the same bound.
    #[error(
        "all {max_running} running slots are busy (tasks.max_running); the tool was not started, retry shortly"
    )]
    RunSlotsBusy { max_running: usize },
    #[error("the server is stopping and admits no new calls; retry against the restarted server")]
    Stopping,
    #[error("no stored result for this task")]
    ArtifactUnavailable,
    #[error("artifact_read needs {{\"taskId\": \"tg-…\"}}")]
    ArtifactArguments,
    /// The task store refused (busy, at capacity, disabled).
    #[error("{0}")]
    Store(StoreError),
    /// The task store refused a call that carries an operation ID. Such a
    /// call is never run synchronously instead: it may be the retry of a
    /// call whose task was committed and whose answer was lost. Nothing
    /// ran; the same call with the same operation ID may be sent again.
    #[error("{0}; nothing was run: retry with the same operation ID")]
    StoreUnsettled(StoreError),
    /// A synchronous run ended without a result (timeout, signal, …).
    #[error("{message}")]
    Run {
        code: WireCode,
        message: String,
        /// Fields of the run's own for the error's `data`.
        data: Option<Value>,
    },
    /// A stored or encoded result could not be turned into a reply.
    #[error("{0}")]
    Internal(String),
    /// A durable route's refusal (it knows its own code).
    #[error("{0}")]
    Route(crate::route::RouteError),
    #[error(
        "tool {tool:?} needs an administrator's approval, and approvals are unavailable here: {reason}; nothing was run or proposed"
    )]
    ApprovalsUnavailable { tool: String, reason: String },
    #[error(
        "an administrator rejected this exact call (proposal {proposal}); the identical call is refused until {until_ms} (Unix ms); nothing was run"
    )]
    ApprovalRejected { proposal: String, until_ms: i64 },
    /// The journal is at one of its bounds (the reason names it and what
    /// to do).
    #[error("{reason}; nothing was run or proposed")]
    ApprovalsFull { reason: String },
    #[error(
        "this task waits on approval proposal {proposal}, which the approval journal cannot vouch for now: {reason}; its status is not guessed"
    )]
    ApprovalEvidenceMissing { proposal: String, reason: String },
}

impl TaskError {
    /// The registered code this refusal goes out with.
    pub fn wire(&self) -> WireCode {
        match self {
            TaskError::UnknownTool(_) => wire::UNKNOWN_TOOL,
            TaskError::InvalidArguments(_) | TaskError::ArtifactArguments => {
                wire::INVALID_ARGUMENTS
            }
            TaskError::TasksRequired(_) => wire::TASKS_REQUIRED,
            TaskError::InvalidOperationId => wire::INVALID_PARAMS,
            TaskError::IdempotencyConflict => wire::IDEMPOTENCY_CONFLICT,
            TaskError::UnknownTask => wire::UNKNOWN_TASK,
            TaskError::ServerBusy => wire::SERVER_BUSY,
            TaskError::Forbidden { .. } => wire::FORBIDDEN,
            TaskError::OwnerLimit(_) => wire::OWNER_LIMIT,
            TaskError::SlotsBusy { .. } => wire::TASK_SLOTS_BUSY,
            TaskError::RunSlotsBusy { .. } => wire::RUN_SLOTS_BUSY,
            TaskError::Stopping => wire::STOPPING,
            TaskError::ArtifactUnavailable => wire::ARTIFACT_UNAVAILABLE,
            TaskError::Store(e) | TaskError::StoreUnsettled(e) => store_wire(e),
            TaskError::Run { code, .. } => *code,
            TaskError::Internal(_) => wire::INTERNAL,
            TaskError::Route(e) => e.wire(),
            TaskError::ApprovalsUnavailable { .. } => wire::APPROVALS_UNAVAILABLE,
            TaskError::ApprovalRejected { .. } => wire::APPROVAL_REJECTED,
            TaskError::ApprovalsFull { .. } => wire::APPROVALS_FULL,
            TaskError::ApprovalEvidenceMissing { .. } => wire::APPROVAL_EVIDENCE_MISSING,
        }
    }

    /// What the client reads. A disabled store says only that it is
    /// unavailable: the disk error's detail is for the operator's log.
    pub fn message(&self) -> String {
        match self {
            TaskError::Store(
                StoreError::Disabled { .. } | StoreError::Uncertain { .. } | StoreError::Stopped,
            ) => "the task store is unavailable".into(),
            TaskError::StoreUnsettled(
                StoreError::Disabled { .. } | StoreError::Uncertain { .. } | StoreError::Stopped,
            ) => "the task store is unavailable; nothing was run: retry with the same operation ID once it is back".into(),
            TaskError::Route(e) => e.message(),
            other => other.to_string(),
        }
    }

    /// Fields added to the registered `data` (name and help).
    pub fn data(&self) -> Option<Value> {
        match self {
            TaskError::InvalidArguments(e) => Some(json!({"location": e.location})),
            TaskError::ArtifactArguments => Some(json!({"location": "arguments/taskId"})),
            TaskError::SlotsBusy { max_running } | TaskError::RunSlotsBusy { max_running } => {
                Some(json!({"maxRunning": max_running}))
            }
            TaskError::Forbidden { missing } => Some(json!({"missingScopes": missing})),
            TaskError::StoreUnsettled(_) => Some(json!({"retryable": true, "ran": false})),
            TaskError::TasksRequired(_) => Some(json!({
                "requiredCapabilities": {"extensions": {super::TASKS_EXTENSION: {}}}
            })),
            TaskError::Run { data, .. } => data.clone(),
            TaskError::Route(e) => e.data(),
            TaskError::ApprovalRejected { proposal, until_ms } => {
                Some(json!({"proposal": proposal, "untilMs": until_ms, "ran": false}))
            }
            TaskError::ApprovalEvidenceMissing { proposal, .. } => {
                Some(json!({"proposal": proposal}))
            }
            TaskError::ApprovalsUnavailable { .. } | TaskError::ApprovalsFull { .. } => {
                Some(json!({"ran": false}))
            }
            _ => None,
        }
    }

    pub fn run(tool: &str, e: &RunError) -> TaskError {
        TaskError::Run {
            code: e.wire(),
            message: e.message(tool),
            data: match e {
                RunError::Remote { data, .. } => data.clone(),
                _ => None,
            },
        }
    }

    /// The error body a failed task keeps in the store.
    pub fn body(&self) -> ErrorBody {
        let code = self.wire();
        ErrorBody {
            code: code.code,
            message: self.message(),
            data: Some(match self.data() {
                Some(extra) => code.data_with(extra),
                None => code.data(),
            }),
        }
    }
}

impl From<StoreError> for TaskError {
    fn from(e: StoreError) -> TaskError {
        TaskError::Store(e)
    }
}
