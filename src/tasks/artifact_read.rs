//! The built-in `artifact_read`: the whole result of one of the caller's
//! tasks whose result was too large for its record. It needs the store and
//! the caller's identity, which is why it lives here and not in `tools/`.

use serde_json::{Map, Value, json};

use super::TaskError;
use crate::artifacts::Artifacts;
use crate::config::{Effect, TaskMode};
use crate::store::{Digest, Store, TaskId};
use crate::tools::{ToolSpec, result_json};

/// The built-in tool that returns a spilled result to its owner.
pub const ARTIFACT_READ_TOOL: &str = crate::tools::ARTIFACT_READ;

pub fn spec() -> ToolSpec {
    ToolSpec {
        name: ARTIFACT_READ_TOOL.into(),
        description:
            "Returns the whole result of one of your tasks whose result was too large to inline."
                .into(),
        input_schema: json!({
            "type": "object",
            "properties": {"taskId": {"type": "string", "description": "the task whose stored result to read"}},
            "required": ["taskId"]
        }),
        effect: Effect::ReadOnly,
        task: TaskMode::Never,
        shown: Default::default(),
    }
}

/// The result a spilled task keeps: where the whole result is. `output`
/// is what the tool wrote (the text of the result's content), the size a
/// client can relate to its call; `stored` is the size of the stored JSON,
/// which also carries the structured copy of a JSON output.
pub fn pointer(id: &TaskId, output: u64, stored: u64, is_error: bool) -> Value {
    result_json(
        format!(
            "The tool's output ({output} bytes) is larger than a task record holds and was stored whole; call the {ARTIFACT_READ_TOOL} tool with {{\"taskId\": \"{id}\"}} to read it."
        ),
        Some(json!({"artifact": {"taskId": id.as_str(), "bytes": output, "storedBytes": stored}})),
        is_error,
    )
}

/// Bytes of text in a result's content: what the tool wrote.
pub fn output_bytes(result: &Value) -> u64 {
    result["content"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|c| c["text"].as_str())
                .map(|t| t.len() as u64)
                .sum()
        })
        .unwrap_or(0)
}

/// The stored result, while the task is visible to `owner`: an expired
/// task's artifact is gone at once, whether or not the sweep has deleted
/// its file yet.
pub async fn run(
    store: &Store,
    artifacts: &Artifacts,
    arguments: Option<Map<String, Value>>,
    owner: Digest,
) -> Result<Value, TaskError> {
    let id = arguments
        .as_ref()
        .and_then(|a| a.get("taskId"))
        .and_then(Value::as_str)
        .ok_or(TaskError::ArtifactArguments)?;
    let id = TaskId::parse(id).map_err(|_| TaskError::ArtifactUnavailable)?;
    if store.get(&id, &owner).await?.is_none() {
        return Err(TaskError::ArtifactUnavailable);
    }
    match artifacts.read(&id, &owner) {
        Ok(Some(v)) => Ok(v),
        Ok(None) => Err(TaskError::ArtifactUnavailable),
        Err(e) => {
            tracing::error!(task = %id, error = %e, "reading the artifact of {id} failed: {e}");
            Err(TaskError::ArtifactUnavailable)
        }
    }
}
