//! Approval-held calls: the parts that exist so far.
//!
//! [`journal`] is the authoritative, append-only record of approval
//! decisions, in a private directory of its own beside the task store
//! (never inside it), each append synced before it is acknowledged and
//! every frame chained to the one before. [`Event`] is what it records;
//! [`proposals`] what the events mean (each proposal's state and the rules
//! for moving it on); [`gate`] holds a call until an administrator
//! approved that exact call and lets it through once, one journal append
//! per change under one lock, reads never waiting for an append. The tasks
//! that project a proposal and the administrator's interface build on
//! these.
//!
//! Knows nothing of tasks, the store, tools or the protocol.
//!
//! Owns the approval journal (the first part of approval-held calls).
//! `journal.rs`: the authoritative, append-only record of approval decisions,
//! in a private directory of its own (never the task store's): segment files
//! `journal-NNNNNN.log` (0600) starting with the magic `TGJRNL02`, then frames
//! (an 8-byte little-endian length and 8 bytes of SHA-256 checking it, the
//! record as RFC 8785 JSON, zero padding to 8 bytes, SHA-256 over the previous
//! frame's hash, the length and the record), each segment opening with a record
//! naming the journal's random identity, its number, the hash the previous
//! segment ended with and its format; an append is written and synced (the
//! directory too when it starts a segment) before it returns, and one that
//! fails is cut back and latches the gate disabled until restart; records ≤ 64
//! KiB, segments ≥ 64 KiB and rotated when full. Opening verifies the whole
//! chain: only a prefix of one frame at the end of the last segment (a partial
//! header, or a checked length running past the end) is torn, copied to
//! `journal-NNNNNN-at-OFFSET.torn` (synced) and then cut; anything else (a
//! changed byte including a length, a missing, reordered or foreign segment, a
//! cut inside an earlier segment) is `JournalError::Damaged` naming the segment
//! and offset, and nothing is changed. Format-1 segments (no magic) are still
//! read, a frame of theirs past the end is damage, and appends go on in a new
//! segment. `Journal::verify` does the same read-only and gives the
//! `Checkpoint` (identity, records, segments, bytes, head hash) two copies are
//! compared by. `Journal::remove_before` removes closed segments whose records
//! all precede a sequence, after writing and syncing `journal.base` (the
//! journal's identity, the first segment kept, the hash the removed ones ended
//! with, that segment's first sequence); opening and `verify` start the chain
//! there, so a journal that lost its first segments without a base is still
//! damaged, and segments below the base (a removal a crash interrupted) are
//! removed at opening and passed over by `verify`; each segment record names
//! its first sequence, so sequence numbers survive removals. `proposals.rs`:
//! what the events mean, each proposal's state (pending, approved, rejected,
//! expired, consumed, cancelled) and the rules for moving it on (an approval or
//! rejection only of a pending proposal before its decision deadline, an expiry
//! only after it, a consumption only of an approval within its execution
//! window, a call cancellation only by the proposal's owner while pending); the
//! journal is replayed through them at opening, and one that holds an
//! impossible sequence is refused. `gate.rs`: `Gate::admit` spends an approval
//! of the exact call (journaled as consumed, once), joins a waiting proposal of
//! it, refuses it while its rejection stands (until the proposal's deadline),
//! or makes a new proposal within its bounds (waiting at once and per owner;
//! kept at once and per owner, where a kept proposal is one not yet forgotten —
//! see below); `approve` (refused for the proposal's own owner when
//! self-approval is forbidden), `reject` (reason ≤ 512 bytes), `cancel` (the
//! owner only; a decision that came first stands) and `expire_due`; a pending
//! proposal past its deadline is journaled expired before anything else is
//! decided about it; every change is checked against the proposals and appended
//! under one lock, so of racing decisions the first appended wins, and the
//! proposals sit behind a lock of their own, so a status read never waits for
//! an append. At most once a minute, at a held call, proposals decided and past
//! their decision deadline by `GateSettings::retain_ms` (the longest an
//! approval task waiting on them can live) are forgotten, and the segments
//! before the oldest proposal kept are removed (never while `hold_segments`'
//! guard, taken by an online backup, lives); a journal replayed from past
//! segment 1 passes over events about proposals it no longer holds. The counts
//! per owner are kept as events are applied, never by scanning. `mod.rs`:
//! `Event`, what the journal records (proposal created, approved, rejected with
//! a reason ≤ 512 bytes, expired, consumed, call cancellation), and `call_key`,
//! the exact-call key (SHA-256 over the principal's issuer, tenant and subject,
//! the tool, the canonical arguments and the tool definition's digest, each
//! part length-prefixed). Integrity, not authenticity: whoever can rewrite the
//! files can compute the hashes again. `Gate::open_dir` creates the journal's
//! directory 0700 when missing, refuses one another uid owns or others may
//! enter, and holds an exclusive `flock` on its `journal.lock` so one process
//! appends. `HeldCall` is what the gate keeps of a call: owner digest,
//! exact-call key, tool, the principal as the administrator reads it, the
//! arguments' SHA-256 and the preview (the values of the tool's
//! `approval_preview` fields, each ≤ 256 bytes of JSON or shown by its size
//! only) — no other argument value. Knows nothing of tasks, the store, tools or
//! the protocol.

pub mod gate;
pub mod journal;
pub mod proposals;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use gate::{Admission, Gate, GateError, GateSettings};
pub use journal::{Checkpoint, Entry, Journal, JournalError, MAX_RECORD_BYTES, Opened};
pub use proposals::{Proposal, Proposals, Refusal, State};

/// Who a call is from, as an exact-call key binds it.
#[derive(Debug, Clone, Copy)]
pub struct Principal<'a> {
    pub issuer: &'a str,
    pub tenant: &'a str,
    pub subject: &'a str,
}

/// The exact-call key: SHA-256 (lower-case hex) over the principal, the
/// tool, its arguments in canonical form (RFC 8785) and the digest of the
/// tool's definition when the call was proposed, each part length-prefixed.
/// An approval covers exactly this: the same arguments after the operator
/// changed what the tool runs are another call.
pub fn call_key(
    who: Principal<'_>,
    tool: &str,
    arguments: &serde_json::Value,
    definition: &str,
) -> String {
    use sha2::Digest as _;
    let canonical =
        serde_jcs::to_vec(arguments).unwrap_or_else(|_| arguments.to_string().into_bytes());
    let mut h = sha2::Sha256::new();
    for part in [
        b"taskgate-exact-call".as_slice(),
        who.issuer.as_bytes(),
        who.tenant.as_bytes(),
        who.subject.as_bytes(),
        tool.as_bytes(),
        &canonical,
        definition.as_bytes(),
    ] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// A call that needs approval, as the gate sees it: no argument value
/// beyond the preview the operator chose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldCall {
    /// The caller's identity digest (hex): who may cancel it.
    pub owner: String,
    /// The exact-call key ([`call_key`]).
    pub call: String,
    pub tool: String,
    /// Who called, as the administrator reads it.
    pub principal: String,
    /// SHA-256 (hex) of the canonical arguments.
    pub arguments: String,
    pub preview: BTreeMap<String, serde_json::Value>,
}

/// The longest preview value kept; a longer one is shown by its size only.
pub const MAX_PREVIEW_VALUE_BYTES: usize = 256;

/// The preview of `arguments`: the listed fields present, each value kept
/// only if its JSON is at most [`MAX_PREVIEW_VALUE_BYTES`].
pub fn preview(
    arguments: &serde_json::Map<String, serde_json::Value>,
    fields: &[String],
) -> BTreeMap<String, serde_json::Value> {
    fields
        .iter()
        .filter_map(|f| {
            let v = arguments.get(f)?;
            let len = v.to_string().len();
            let shown = if len <= MAX_PREVIEW_VALUE_BYTES {
                v.clone()
            } else {
                serde_json::Value::String(format!("({len} bytes, not shown)"))
            };
            Some((f.clone(), shown))
        })
        .collect()
}

/// SHA-256 (hex) of arguments in canonical form (RFC 8785).
pub fn arguments_digest(arguments: &serde_json::Value) -> String {
    use sha2::Digest as _;
    let canonical =
        serde_jcs::to_vec(arguments).unwrap_or_else(|_| arguments.to_string().into_bytes());
    sha2::Sha256::digest(&canonical)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

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
        /// Who called, for the administrator: subject, tenant and issuer.
        principal: String,
        /// SHA-256 of the canonical arguments (the values are never kept).
        arguments: String,
        /// The values of the tool's `approval_preview` fields, bounded.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        preview: BTreeMap<String, serde_json::Value>,
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

    /// The event's kind, as `taskgate_approval_events_total` labels it.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::ProposalCreated { .. } => "proposed",
            Event::Approved { .. } => "approved",
            Event::Rejected { .. } => "rejected",
            Event::Expired { .. } => "expired",
            Event::Consumed { .. } => "consumed",
            Event::CallCancellation { .. } => "cancelled",
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_exact_call_key_changes_with_every_part_and_not_with_key_order() {
        let who = Principal {
            issuer: "https://id.example",
            tenant: "acme",
            subject: "alice",
        };
        let base = call_key(who, "deploy", &json!({"a": 1, "b": "x"}), "sha256:d1");
        assert_eq!(base.len(), 64);
        assert_eq!(
            base,
            call_key(who, "deploy", &json!({"b": "x", "a": 1}), "sha256:d1")
        );
        let other = Principal {
            subject: "bob",
            ..who
        };
        let tenant = Principal {
            tenant: "other",
            ..who
        };
        let issuer = Principal {
            issuer: "https://other.example",
            ..who
        };
        for changed in [
            call_key(other, "deploy", &json!({"a": 1, "b": "x"}), "sha256:d1"),
            call_key(tenant, "deploy", &json!({"a": 1, "b": "x"}), "sha256:d1"),
            call_key(issuer, "deploy", &json!({"a": 1, "b": "x"}), "sha256:d1"),
            call_key(who, "deploy2", &json!({"a": 1, "b": "x"}), "sha256:d1"),
            call_key(who, "deploy", &json!({"a": 2, "b": "x"}), "sha256:d1"),
            call_key(who, "deploy", &json!({"a": 1, "b": "x"}), "sha256:d2"),
        ] {
            assert_ne!(changed, base);
        }
        // Parts cannot be shifted into each other.
        let split = Principal {
            tenant: "acmeal",
            subject: "ice",
            ..who
        };
        assert_ne!(
            call_key(split, "deploy", &json!({"a": 1, "b": "x"}), "sha256:d1"),
            base
        );
    }

    #[test]
    fn events_round_trip_and_bound_the_reason() {
        let e = Event::Rejected {
            proposal: "p".into(),
            decider: "admin".into(),
            at_ms: 1,
            reason: "no".into(),
        };
        let r = e.to_record().unwrap();
        assert_eq!(r["kind"], "rejected");
        assert_eq!(Event::from_record(&r).unwrap(), e);
        let long = Event::Rejected {
            proposal: "p".into(),
            decider: "admin".into(),
            at_ms: 1,
            reason: "x".repeat(MAX_REASON_BYTES + 1),
        };
        assert!(long.to_record().is_err());
    }
}
