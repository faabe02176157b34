//! Approval-held calls: the parts that exist so far.
//!
//! [`journal`] is the authoritative, append-only record of approval
//! decisions, in a private directory of its own beside the task store
//! (never inside it), each append synced before it is acknowledged and
//! every frame chained to the one before. [`Event`] is what it records.
//! The gate that holds a call until an administrator approved that exact
//! call, the tasks that project a proposal, and the administrator's
//! interface build on these.
//!
//! Knows nothing of tasks, the store, tools or the protocol.

pub mod journal;

use serde::{Deserialize, Serialize};

pub use journal::{Checkpoint, Entry, Journal, JournalError, MAX_RECORD_BYTES, Opened};

/// The longest rejection reason kept (in the journal only; never shown to
/// the caller).
pub const MAX_REASON_BYTES: usize = 512;

/// One thing that happened to a proposal, as the journal records it.
/// Digests are lower-case hex SHA-256; times are Unix milliseconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Event {
    /// A call that needs approval was held, as a new proposal.
    ProposalCreated {
        proposal: String,
        /// The caller's identity digest.
        owner: String,
        /// The exact-call key: caller, tool, canonical arguments and the
        /// tool's definition at proposal time.
        call: String,
        tool: String,
        created_ms: i64,
        decision_deadline_ms: i64,
    },
    Approved {
        proposal: String,
        /// Who decided (an administrator's identity, or a local uid).
        decider: String,
        at_ms: i64,
        execution_deadline_ms: i64,
    },
    Rejected {
        proposal: String,
        decider: String,
        at_ms: i64,
        /// At most [`MAX_REASON_BYTES`].
        reason: String,
    },
    /// Nobody decided before the decision deadline.
    Expired { proposal: String, at_ms: i64 },
    /// The approved call was re-issued and ran: the approval is spent.
    Consumed {
        proposal: String,
        request: String,
        at_ms: i64,
    },
    /// The exact owner cancelled the approval task: the hold is released.
    CallCancellation {
        proposal: String,
        owner: String,
        at_ms: i64,
    },
}

impl Event {
    /// The proposal the event is about.
    pub fn proposal(&self) -> &str {
        match self {
            Event::ProposalCreated { proposal, .. }
            | Event::Approved { proposal, .. }
            | Event::Rejected { proposal, .. }
            | Event::Expired { proposal, .. }
            | Event::Consumed { proposal, .. }
            | Event::CallCancellation { proposal, .. } => proposal,
        }
    }

    /// Reads a journal record back as an event.
    pub fn from_record(record: &serde_json::Value) -> Result<Event, String> {
        serde_json::from_value(record.clone()).map_err(|e| e.to_string())
    }

    /// The record to append, refusing a reason past its bound.
    pub fn to_record(&self) -> Result<serde_json::Value, String> {
        if let Event::Rejected { reason, .. } = self
            && reason.len() > MAX_REASON_BYTES
        {
            return Err(format!(
                "a rejection reason is at most {MAX_REASON_BYTES} bytes"
            ));
        }
        serde_json::to_value(self).map_err(|e| e.to_string())
    }
}
