//! Turning store records and process outcomes into protocol shapes.

use rmcp::model::{
    DetailedTask, ErrorData, JsonObject, Task, TaskPayload, TaskStatus as WireStatus,
};
use serde_json::{Value, json};

use crate::exec::{Finished, RunError};
use crate::store::{ErrorBody, Outcome, TaskRecord, TaskStatus};
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

/// `tasks/get`'s detailed view: status with its inlined result or error.
pub fn detailed(r: &TaskRecord) -> DetailedTask {
    let payload = match (r.status, &r.outcome) {
        (TaskStatus::Completed, Some(Outcome::Result(v))) => TaskPayload::Completed {
            result: object(v.clone()),
        },
        (TaskStatus::Failed, Some(Outcome::Error(e))) => TaskPayload::Failed {
            error: object(serde_json::to_value(e).unwrap_or_default()),
        },
        (TaskStatus::Cancelled, _) => TaskPayload::Cancelled,
        // Input is never requested: an input_required record cannot exist,
        // and a record without its payload reads as still working.
        _ => TaskPayload::Working,
    };
    DetailedTask::new(task(r), payload)
}

/// A JSON-RPC error from a registered code.
pub fn error(code: WireCode, message: impl Into<String>, extra: Option<Value>) -> ErrorData {
    let data = match extra {
        Some(e) => code.data_with(e),
        None => code.data(),
    };
    ErrorData::new(
        rmcp::model::ErrorCode(code.code as i32),
        message.into(),
        Some(data),
    )
}

/// The error body a failed task stores.
pub fn error_body(code: WireCode, message: impl Into<String>) -> ErrorBody {
    ErrorBody {
        code: code.code,
        message: message.into(),
        data: Some(code.data()),
    }
}

/// A tool result as JSON (the shape of `CallToolResult`): stdout as text,
/// and as structured content too when it is a JSON object.
fn tool_result(text: String, structured: Option<Value>, is_error: bool) -> Value {
    let mut v = json!({
        "resultType": "complete",
        "content": [{"type": "text", "text": text}],
        "isError": is_error,
    });
    if let Some(s) = structured {
        v["structuredContent"] = s;
    }
    v
}

/// What a run of a tool means for the protocol: a result (possibly an
/// error result) or a JSON-RPC error.
pub fn outcome_of(tool: &str, run: Result<Finished, RunError>) -> Outcome {
    match run {
        Ok(f) if f.status.success() => {
            let text = String::from_utf8_lossy(&f.stdout).into_owned();
            let structured = serde_json::from_slice::<Value>(&f.stdout)
                .ok()
                .filter(Value::is_object);
            Outcome::Result(tool_result(text, structured, false))
        }
        Ok(f) => match (f.status.code(), f.signal()) {
            (Some(code), _) => {
                let stderr = String::from_utf8_lossy(&f.stderr);
                let stdout = String::from_utf8_lossy(&f.stdout);
                let detail = if stderr.trim().is_empty() {
                    stdout
                } else {
                    stderr
                };
                let text = format!("{tool} exited with status {code}: {}", detail.trim_end());
                Outcome::Result(tool_result(text, None, true))
            }
            (None, sig) => Outcome::Error(error_body(
                wire::TOOL_KILLED,
                format!("{tool} was killed by signal {}", sig.unwrap_or(0)),
            )),
        },
        Err(RunError::Timeout(d)) => Outcome::Error(error_body(
            wire::TOOL_TIMEOUT,
            format!("{tool} timed out after {} s", d.as_secs()),
        )),
        Err(e @ RunError::OutputLimit { .. }) => {
            Outcome::Error(error_body(wire::TOOL_OUTPUT_LIMIT, format!("{tool}: {e}")))
        }
        Err(e @ RunError::Spawn { .. }) => {
            Outcome::Error(error_body(wire::TOOL_START_FAILED, format!("{tool}: {e}")))
        }
        Err(RunError::Cancelled) => Outcome::Error(error_body(
            wire::TASK_INTERRUPTED,
            format!("{tool} was stopped before it finished"),
        )),
        Err(e @ RunError::Io(_)) => {
            Outcome::Error(error_body(wire::TOOL_IO, format!("{tool}: {e}")))
        }
    }
}

/// The result a spilled task keeps: where the whole result is.
pub fn spilled_pointer(task_id: &str, bytes: u64, is_error: bool) -> Value {
    tool_result(
        format!(
            "The result ({bytes} bytes) is larger than a task record holds and was stored whole; call the artifact_read tool with {{\"taskId\": \"{task_id}\"}} to read it."
        ),
        Some(json!({"artifact": {"taskId": task_id, "bytes": bytes}})),
        is_error,
    )
}

/// Converts an error body into the protocol's error.
pub fn error_data(e: &ErrorBody) -> ErrorData {
    ErrorData::new(
        rmcp::model::ErrorCode(e.code as i32),
        e.message.clone(),
        e.data.clone(),
    )
}

/// Canonical JSON: object keys sorted at every depth, no whitespace. The
/// request identity hashes this, whatever order the client sent.
pub fn canonical_json(v: &Value) -> String {
    fn write(v: &Value, out: &mut String) {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                out.push('{');
                for (i, k) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String((*k).clone()).to_string());
                    out.push(':');
                    write(&m[*k], out);
                }
                out.push('}');
            }
            Value::Array(a) => {
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(x, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut s = String::new();
    write(v, &mut s);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_json_sorts_keys_at_every_depth() {
        let a: Value =
            serde_json::from_str(r#"{"b":1,"a":{"y":[1,{"d":2,"c":3}],"x":"s"}}"#).unwrap();
        assert_eq!(
            canonical_json(&a),
            r#"{"a":{"x":"s","y":[1,{"c":3,"d":2}]},"b":1}"#
        );
    }

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(timestamp(0), "1970-01-01T00:00:00.000Z");
    }
}
