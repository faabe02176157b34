//! What finished work is, for every kind whose records end like an MCP
//! task: the five states of the MCP Tasks extension and the terminal
//! payload (a result, or a JSON-RPC error). Tasks and routes both keep
//! them; neither kind owns them.

use serde::{Deserialize, Serialize};

/// The five task states of the MCP Tasks extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    Working,
    InputRequired,
    Completed,
    Failed,
    Cancelled,
}

impl TaskStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Working => "working",
            TaskStatus::InputRequired => "input_required",
            TaskStatus::Completed => "completed",
            TaskStatus::Failed => "failed",
            TaskStatus::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<TaskStatus> {
        Some(match s {
            "working" => TaskStatus::Working,
            "input_required" => TaskStatus::InputRequired,
            "completed" => TaskStatus::Completed,
            "failed" => TaskStatus::Failed,
            "cancelled" => TaskStatus::Cancelled,
            _ => return None,
        })
    }

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskStatus::Completed | TaskStatus::Failed | TaskStatus::Cancelled
        )
    }
}

/// A JSON-RPC error as kept in a failed task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorBody {
    pub code: i64,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
}

/// The terminal payload of a task: the tool's result, or a JSON-RPC error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum Outcome {
    Result(serde_json::Value),
    Error(ErrorBody),
}

impl Outcome {
    /// The payload every task interrupted by a restart carries.
    pub fn interrupted() -> Outcome {
        let w = crate::wire::TASK_INTERRUPTED;
        Outcome::Error(ErrorBody {
            code: w.code,
            message: "task interrupted: the daemon stopped while it ran; it was not run again"
                .into(),
            data: Some(w.data()),
        })
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        // Serialising a Value-based enum cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_round_trips() {
        let o = Outcome::interrupted();
        let back: Outcome = serde_json::from_slice(&o.encode()).unwrap();
        assert_eq!(o, back);
    }
}
