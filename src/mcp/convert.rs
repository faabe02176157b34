//! Between the task domain and the protocol library's types: records become
//! `Task`/`DetailedTask`, tool results `CallToolResult`, and every refusal
//! an `ErrorData` built from its registered wire code. This file is the one
//! place taskgate constructs a JSON-RPC error.

use rmcp::model::{
    CallToolResult, DetailedTask, ErrorCode, ErrorData, JsonObject, MetaObject, Task, TaskPayload,
    TaskStatus as WireStatus,
};
use serde_json::Value;

use crate::store::{Outcome, TaskRecord, TaskStatus};
use crate::tasks::{PROPOSAL_META_KEY, TaskError};
use crate::wire::{self, WireCode};

/// RFC 3339 UTC with milliseconds, as the protocol's timestamps are.
pub fn timestamp(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn wire_status(s: TaskStatus) -> WireStatus {
    match s {
        TaskStatus::Working => WireStatus::Working,
        TaskStatus::InputRequired => WireStatus::InputRequired,
        TaskStatus::Completed => WireStatus::Completed,
        TaskStatus::Failed => WireStatus::Failed,
        TaskStatus::Cancelled => WireStatus::Cancelled,
    }
}

/// The `_meta` of an answer carrying the task `r`: the proposal a task of
/// an approval-held call waits on (or waited on), so that its owner can
/// name it to an administrator. Only the owner is ever shown a record.
pub fn task_meta(r: &TaskRecord) -> Option<MetaObject> {
    let proposal = r.proposal.as_ref()?;
    let mut meta = MetaObject::default();
    meta.0
        .insert(PROPOSAL_META_KEY.into(), Value::String(proposal.id.clone()));
    Some(meta)
}

/// The task metadata every task response carries.
pub fn task(r: &TaskRecord) -> Task {
    let mut t = Task::new(
        r.id.as_str(),
        wire_status(r.status),
        timestamp(r.created_ms),
        timestamp(r.updated_ms),
    )
    .with_ttl_ms(r.ttl_ms().max(1) as u64)
    .with_poll_interval_ms(r.poll_interval_ms.max(1) as u64);
    if let Some(m) = &r.status_message {
        t = t.with_status_message(m.clone());
    }
    t
}

fn object(v: Value) -> JsonObject {
    match v {
        Value::Object(m) => m,
        other => {
            let mut m = JsonObject::new();
            m.insert("value".into(), other);
            m
        }
    }
}

/// `tasks/get`'s detailed view: status with its inlined result or error
/// (moved out of the record, not copied: a result may be large).
pub fn detailed(mut r: TaskRecord) -> DetailedTask {
    let payload = match (r.status, r.outcome.take()) {
        (TaskStatus::Completed, Some(Outcome::Result(v))) => {
            TaskPayload::Completed { result: object(v) }
        }
        (TaskStatus::Failed, Some(Outcome::Error(e))) => TaskPayload::Failed {
            error: object(serde_json::to_value(e).unwrap_or_default()),
        },
        (TaskStatus::Cancelled, _) => TaskPayload::Cancelled,
        // Input is never requested: an input_required record cannot exist,
        // and a record without its payload reads as still working.
        _ => TaskPayload::Working,
    };
    DetailedTask::new(task(&r), payload)
}

/// A tool result in the protocol's shape.
pub fn tool_result(v: Value) -> Result<CallToolResult, ErrorData> {
    serde_json::from_value::<CallToolResult>(v).map_err(|e| {
        tracing::error!(error = %e, "a tool result does not have the protocol's shape: {e}");
        from_code(
            wire::INTERNAL,
            "the tool's result could not be encoded",
            None,
        )
    })
}

/// A JSON-RPC error from a registered code, with extra `data` fields.
pub fn from_code(code: WireCode, message: impl Into<String>, extra: Option<Value>) -> ErrorData {
    crate::metrics::get().error(code.name);
    let data = match extra {
        Some(e) => code.data_with(e),
        None => code.data(),
    };
    ErrorData::new(ErrorCode(code.code as i32), message.into(), Some(data))
}

/// The one conversion of a domain refusal to the wire.
pub fn error(e: TaskError) -> ErrorData {
    from_code(e.wire(), e.message(), e.data())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(timestamp(0), "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn every_domain_error_carries_its_registered_name() {
        let e = error(TaskError::RunSlotsBusy { max_running: 4 });
        assert_eq!(e.code.0 as i64, wire::RUN_SLOTS_BUSY.code);
        let data = e.data.unwrap_or_default();
        assert_eq!(data["name"], wire::RUN_SLOTS_BUSY.name);
        assert_eq!(data["maxRunning"], 4);
        let e = error(TaskError::Stopping);
        assert_eq!(e.code.0 as i64, wire::STOPPING.code);
    }
}
