//! Calls that wait for an administrator: what the approval gate says to a
//! call, the approval-status task that projects a proposal, and how such a
//! task catches up with the journal when it is read or cancelled.
//!
//! The journal decides; a task row only mirrors it. A proposal is journaled
//! before its task is committed, and a decision before its projection, so
//! a crash between the two leaves a task that the next read brings level.
//! A task the journal cannot vouch for (approvals disabled, the proposal
//! unknown, the journal shorter than the sequence the task recorded) is
//! unavailable, never guessed. Terminal tasks are receipts and never ask
//! the gate.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};

/// A proposal as the journal made it (what administrators list and show).
pub use crate::approvals::Proposal;
use crate::approvals::{
    self, Admission, Gate, GateError, GateSettings, HeldCall, Principal, State,
};
use crate::auth::Caller;
use crate::config::{ApprovalSettings, SelfApproval};
use crate::store::{Digest, Outcome, ProposalRef, TaskRecord, TaskStatus};
use crate::tools::ApprovalRule;

use super::TaskError;

/// How long an approval task stays readable beyond the latest moment its
/// proposal can still change (an approval used at the end of its window).
const RECEIPT_MARGIN_MS: i64 = 3_600_000;

/// How long past its decision deadline a decided proposal is kept: an
/// approval task is made at the latest at that deadline (a joined call) and
/// lives [`Approvals::ttl_ms`] from then, at most the default time to live
/// or the execution window and the receipt margin.
fn retain_ms(default_ttl_ms: i64, execution_window_ms: i64) -> i64 {
    default_ttl_ms.max(execution_window_ms.saturating_add(RECEIPT_MARGIN_MS))
}

/// The approval gate as the task service uses it, or why there is none.
pub struct Approvals {
    gate: Result<Arc<Gate>, String>,
    directory: PathBuf,
    poll_interval: Duration,
    execution_window_ms: i64,
    /// The `[[tool]]` run to tell an administrator of a new proposal.
    notify_tool: Option<String>,
}

/// What the gate decided for a call.
pub(super) enum Verdict {
    /// An approval of this exact call was spent on it: admit it.
    Proceed { proposal: String },
    /// It waits for a decision.
    Held {
        proposal: String,
        seq: u64,
        decision_deadline_ms: i64,
        joined: bool,
    },
}

/// What an administrator decides about a proposal.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum Decision {
    /// The identical call may run once, within `valid_for_ms` (at most the
    /// execution window, which is also the default).
    Approve {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        valid_for_ms: Option<i64>,
    },
    /// Refused; the reason stays in the journal, never shown to the caller.
    Reject { reason: String },
}

/// Who decides: a name for the record, and the identity compared with the
/// caller's when self-approval is forbidden (an MCP caller's owner digest,
/// or `uid:N` for an account on the admin socket).
#[derive(Debug, Clone)]
pub struct Decider {
    pub name: String,
    pub identity: String,
}

impl Decider {
    /// An administrator who presented an MCP credential.
    pub fn of(caller: &Caller) -> Decider {
        let (_, shown) = principal_of(caller);
        Decider {
            name: shown,
            identity: super::owner_of(caller).to_hex(),
        }
    }
}

/// Why an administrator's request about approvals was refused.
#[derive(Debug, thiserror::Error)]
pub enum AdminRefusal {
    #[error("approvals are disabled ({0}); `taskgate status` says why")]
    Disabled(String),
    #[error("no proposal {0} in the approval journal")]
    Unknown(String),
    /// A decision the journal's rules refuse (already decided, too late,
    /// self-approval, a reason too long).
    #[error("{0}")]
    Refused(String),
    #[error("the approval journal could not record the decision: {0}")]
    Failed(String),
}

/// The most proposals one listing shows.
pub const MAX_LISTED_PROPOSALS: usize = 500;

/// What `status` shows of approvals.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ApprovalsStatus {
    pub directory: PathBuf,
    /// Proposals waiting for a decision.
    pub pending: usize,
    pub records: u64,
    pub bytes: u64,
    pub head: String,
    /// Why approvals are disabled, when they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled: Option<String>,
    /// When the journal ends before a record waiting approval tasks
    /// reached (it is older than the task store): what that means.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale: Option<String>,
}

impl Approvals {
    /// Opens the journal `settings` name. A journal that cannot be opened
    /// (damaged, locked, badly owned) disables approvals with the reason;
    /// the daemon serves everything else.
    ///
    /// `default_ttl` is the tasks' default time to live: with the
    /// execution window it says how long a decided proposal must be kept
    /// for the approval tasks that wait on it.
    pub fn open(settings: &ApprovalSettings, default_ttl: Duration) -> Approvals {
        let execution_window_ms = settings.execution_window.as_millis() as i64;
        let gate_settings = GateSettings {
            decision_window_ms: settings.decision_window.as_millis() as i64,
            execution_window_ms,
            segment_max_bytes: settings.segment_max_bytes,
            max_pending: settings.max_pending,
            max_pending_per_owner: settings.max_pending_per_owner,
            max_proposals: settings.max_proposals,
            max_proposals_per_owner: settings.max_proposals_per_owner,
            retain_ms: retain_ms(default_ttl.as_millis() as i64, execution_window_ms),
            forbid_self_approval: settings.self_approval == SelfApproval::Forbid,
        };
        let gate = match Gate::open_dir(&settings.directory, gate_settings) {
            Ok((gate, opened)) => {
                if opened.truncated > 0 {
                    let kept = opened.kept_as.as_deref().unwrap_or("");
                    tracing::warn!(
                        bytes = opened.truncated,
                        kept_as = kept,
                        "the approval journal ended in an unfinished record ({} bytes, never acknowledged); it was cut away and kept as {kept} in the journal's directory",
                        opened.truncated
                    );
                }
                Ok(Arc::new(gate))
            }
            Err(e) => {
                tracing::error!(error = %e,
                    "approvals are disabled: {e}; held tools refuse their calls and waiting approval tasks are unavailable until this is fixed and the daemon restarted");
                Err(e.to_string())
            }
        };
        Approvals {
            gate,
            directory: settings.directory.clone(),
            poll_interval: settings.poll_interval,
            execution_window_ms: settings.execution_window.as_millis() as i64,
            notify_tool: settings.notify_tool.clone(),
        }
    }

    /// The tool that tells an administrator of a new proposal, if any.
    pub(super) fn notify_tool(&self) -> Option<&str> {
        self.notify_tool.as_deref()
    }

    /// What the notification tool is given about `proposal`: never the
    /// call's arguments.
    pub(super) fn notification(&self, proposal: &str) -> Option<Map<String, Value>> {
        let p = self.gate()?.proposal(proposal)?;
        match json!({
            "proposal": p.id,
            "tool": p.tool,
            "principal": p.principal,
            "decisionDeadlineMs": p.decision_deadline_ms,
        }) {
            Value::Object(m) => Some(m),
            _ => None,
        }
    }

    /// The gate, while approvals are enabled (it opened, and no append of
    /// its has failed since).
    pub fn gate(&self) -> Option<&Arc<Gate>> {
        self.gate.as_ref().ok().filter(|g| g.disabled().is_none())
    }

    /// Why approvals are disabled, when they are.
    fn disabled(&self) -> Option<String> {
        match &self.gate {
            Ok(gate) => gate.disabled().map(str::to_string),
            Err(reason) => Some(reason.clone()),
        }
    }

    pub fn status(&self, now: i64) -> ApprovalsStatus {
        match &self.gate {
            Ok(gate) => {
                let c = gate.checkpoint();
                ApprovalsStatus {
                    directory: self.directory.clone(),
                    pending: gate.pending(now),
                    records: c.records,
                    bytes: c.bytes,
                    head: c.head,
                    disabled: gate.disabled().map(str::to_string),
                    stale: None,
                }
            }
            Err(reason) => ApprovalsStatus {
                directory: self.directory.clone(),
                pending: 0,
                records: 0,
                bytes: 0,
                head: String::new(),
                disabled: Some(reason.clone()),
                stale: None,
            },
        }
    }

    fn open_gate(&self) -> Result<Arc<Gate>, AdminRefusal> {
        match (self.gate(), self.disabled()) {
            (Some(g), _) => Ok(g.clone()),
            (None, reason) => Err(AdminRefusal::Disabled(reason.unwrap_or_default())),
        }
    }

    /// [`Approvals::status`], told when the journal ends before the
    /// record the waiting approval tasks reached (`needed`).
    pub fn status_against(&self, now: i64, needed: u64) -> ApprovalsStatus {
        let mut status = self.status(now);
        if status.disabled.is_none() && status.records < needed {
            status.stale = Some(format!(
                "the journal ends at record {}, before record {needed} that waiting approval tasks reached: it is older than the task store (restored without it?); those tasks are unavailable until the journal taken with this task store is restored",
                status.records
            ));
        }
        status
    }

    /// Proposals newest first (those waiting when `pending`, at most
    /// [`MAX_LISTED_PROPOSALS`]), or the one `id` names.
    pub fn proposals(
        &self,
        id: Option<&str>,
        pending: bool,
        now: i64,
    ) -> Result<Vec<Proposal>, AdminRefusal> {
        let gate = self.open_gate()?;
        if let Some(id) = id {
            return gate
                .proposal(id)
                .map(|p| vec![p])
                .ok_or_else(|| AdminRefusal::Unknown(id.to_string()));
        }
        Ok(gate
            .list()
            .into_iter()
            .filter(|p| !pending || (p.state == State::Pending && now <= p.decision_deadline_ms))
            .take(MAX_LISTED_PROPOSALS)
            .collect())
    }

    /// Journals an administrator's decision and logs it.
    pub async fn decide(
        &self,
        id: &str,
        decision: Decision,
        decider: Decider,
        now: i64,
    ) -> Result<Proposal, AdminRefusal> {
        let gate = self.open_gate()?;
        let id = id.to_string();
        let done = tokio::task::spawn_blocking(move || match decision {
            Decision::Approve { valid_for_ms } => {
                gate.approve_for(&id, &decider.name, &decider.identity, now, valid_for_ms)
            }
            Decision::Reject { reason } => gate.reject(&id, &decider.name, &reason, now),
        })
        .await
        .map_err(|e| AdminRefusal::Failed(format!("the approval gate stopped: {e}")))?;
        match done {
            Ok(p) => {
                tracing::info!(
                    message_id = crate::events::APPROVAL_DECIDED,
                    proposal = %p.id,
                    tool = %p.tool,
                    state = p.state.as_str(),
                    decider = p.decider.as_deref().unwrap_or(""),
                    "proposal {} for {} is {} by {}",
                    p.id,
                    p.tool,
                    p.state.as_str(),
                    p.decider.as_deref().unwrap_or("-")
                );
                Ok(p)
            }
            Err(GateError::Refused(approvals::Refusal::Unknown(id))) => {
                Err(AdminRefusal::Unknown(id))
            }
            Err(
                e @ (GateError::Refused(_) | GateError::SelfApproval | GateError::ReasonTooLong),
            ) => Err(AdminRefusal::Refused(e.to_string())),
            Err(GateError::Disabled { reason }) => Err(AdminRefusal::Disabled(reason)),
            Err(e) => Err(AdminRefusal::Failed(e.to_string())),
        }
    }

    /// The gate's answer to a call of `tool` with `args` from `caller`.
    pub(super) async fn admit(
        &self,
        caller: &Caller,
        owner: Digest,
        tool: &str,
        rule: &ApprovalRule,
        args: &Map<String, Value>,
        now: i64,
    ) -> Result<Verdict, TaskError> {
        let Some(gate) = self.gate().cloned() else {
            return Err(TaskError::ApprovalsUnavailable {
                tool: tool.to_string(),
                reason: match &self.gate {
                    Ok(_) => "an append to the approval journal failed".into(),
                    Err(_) => "the approval journal failed its check".into(),
                },
            });
        };
        let arguments = Value::Object(args.clone());
        let (principal, shown) = principal_of(caller);
        let held = HeldCall {
            owner: owner.to_hex(),
            call: approvals::call_key(principal, tool, &arguments, &rule.definition),
            tool: tool.to_string(),
            principal: shown,
            arguments: approvals::arguments_digest(&arguments),
            preview: approvals::preview(args, &rule.preview),
        };
        let admitted = {
            let gate = gate.clone();
            tokio::task::spawn_blocking(move || gate.admit(&held, now))
                .await
                .map_err(|e| TaskError::Internal(format!("the approval gate stopped: {e}")))?
        };
        match admitted.map_err(|e| gate_error(tool, e))? {
            Admission::Proceed { proposal } => Ok(Verdict::Proceed { proposal }),
            Admission::Refused { proposal, until_ms } => {
                Err(TaskError::ApprovalRejected { proposal, until_ms })
            }
            Admission::Held {
                proposal,
                decision_deadline_ms,
                joined,
            } => {
                let seq = gate.proposal(&proposal).map(|p| p.seq).unwrap_or(0);
                Ok(Verdict::Held {
                    proposal,
                    seq,
                    decision_deadline_ms,
                    joined,
                })
            }
        }
    }

    /// The advertised poll interval of an approval task.
    pub(super) fn poll_interval_ms(&self) -> i64 {
        self.poll_interval.as_millis() as i64
    }

    /// An approval task's time to live: at least `default_ttl_ms`, and at
    /// least an hour past the last moment its proposal can change.
    pub(super) fn ttl_ms(&self, default_ttl_ms: i64, decision_deadline_ms: i64, now: i64) -> i64 {
        let last_change = decision_deadline_ms.saturating_add(self.execution_window_ms);
        default_ttl_ms.max(
            last_change
                .saturating_add(RECEIPT_MARGIN_MS)
                .saturating_sub(now),
        )
    }

    /// Where a waiting approval task stands according to the journal: the
    /// proposal (its expiry journaled first if it is due), or why the
    /// journal cannot say.
    pub(super) async fn evidence(
        &self,
        task: &ProposalRef,
        now: i64,
    ) -> Result<Proposal, TaskError> {
        let missing = |reason: &str| TaskError::ApprovalEvidenceMissing {
            proposal: task.id.clone(),
            reason: reason.to_string(),
        };
        let Some(gate) = self.gate().cloned() else {
            return Err(missing("approvals are disabled"));
        };
        if gate.head_seq() < task.seq {
            return Err(missing(
                "the journal is shorter than what this task already recorded",
            ));
        }
        let Some(p) = gate.proposal(&task.id) else {
            return Err(missing("the journal holds no such proposal"));
        };
        if p.state != State::Pending || now <= p.decision_deadline_ms {
            return Ok(p);
        }
        let id = task.id.clone();
        tokio::task::spawn_blocking(move || gate.observe(&id, now))
            .await
            .map_err(|e| TaskError::Internal(format!("the approval gate stopped: {e}")))?
            .map_err(|e| gate_error("", e))
    }

    /// The owner cancels the call its approval task waits for: journaled
    /// first; a decision journaled before stands (the proposal as it is).
    pub(super) async fn cancel(
        &self,
        task: &ProposalRef,
        owner: Digest,
        now: i64,
    ) -> Result<Proposal, TaskError> {
        self.evidence(task, now).await?;
        let Some(gate) = self.gate().cloned() else {
            return Err(TaskError::ApprovalEvidenceMissing {
                proposal: task.id.clone(),
                reason: "approvals are disabled".into(),
            });
        };
        let id = task.id.clone();
        tokio::task::spawn_blocking(move || gate.cancel(&id, &owner.to_hex(), now))
            .await
            .map_err(|e| TaskError::Internal(format!("the approval gate stopped: {e}")))?
            .map_err(|e| match e {
                // Another owner's proposal answers like an unknown task.
                GateError::Refused(approvals::Refusal::Unknown(_)) => TaskError::UnknownTask,
                e => gate_error("", e),
            })
    }
}

fn gate_error(tool: &str, e: GateError) -> TaskError {
    match e {
        e @ (GateError::TooManyPending { .. } | GateError::TooManyKept { .. }) => {
            TaskError::ApprovalsFull {
                reason: e.to_string(),
            }
        }
        e @ GateError::OwnerLimit { .. } => TaskError::OwnerLimit(e.to_string()),
        e => {
            tracing::error!(error = %e, "the approval gate failed: {e}");
            TaskError::ApprovalsUnavailable {
                tool: tool.to_string(),
                reason: "the approval journal could not record the call".into(),
            }
        }
    }
}

/// The principal an exact-call key binds, and how the administrator reads
/// it. The local caller (stdio, loopback without credentials) is one
/// principal of its own.
fn principal_of(caller: &Caller) -> (Principal<'_>, String) {
    match caller {
        Caller::Local => (
            Principal {
                issuer: "taskgate:local",
                tenant: "",
                subject: "local",
            },
            "the local caller (stdio or loopback without a credential)".to_string(),
        ),
        Caller::Authenticated(p) => (
            Principal {
                issuer: &p.issuer,
                tenant: &p.tenant,
                subject: &p.subject,
            },
            format!(
                "subject {:?} of tenant {:?} from {}",
                p.subject, p.tenant, p.issuer
            ),
        ),
    }
}

/// The `approval_required` tool result: the call waits for an
/// administrator; the client re-issues the identical call once approved.
pub(super) fn approval_required(tool: &str, proposal: &str, decision_deadline_ms: i64) -> Value {
    let text = format!(
        "This call to {tool} needs an administrator's approval before it runs; nothing has run. \
         It is waiting as proposal {proposal}, to be decided before {decision_deadline_ms} (Unix ms). \
         Once it is approved, issue exactly the same call again: it then runs once."
    );
    json!({
        "content": [{"type": "text", "text": text}],
        "structuredContent": {
            "status": "approval_required",
            "proposal": proposal,
            "decisionDeadlineMs": decision_deadline_ms,
        },
        "isError": true,
    })
}

/// What a waiting approval task becomes once its proposal is decided:
/// `None` while it still waits.
pub(super) fn projection(p: &Proposal, now: i64) -> Option<(TaskStatus, Option<Outcome>)> {
    let text_result = |text: String, is_error: bool, extra: Value| {
        let mut structured = json!({"proposal": p.id});
        if let (Some(s), Value::Object(extra)) = (structured.as_object_mut(), extra) {
            s.extend(extra);
        }
        Outcome::Result(json!({
            "content": [{"type": "text", "text": text}],
            "structuredContent": structured,
            "isError": is_error,
        }))
    };
    match p.state {
        State::Pending => None,
        State::Approved if p.approval_lapsed(now) => Some(expired(p, text_result)),
        State::Approved | State::Consumed => {
            let until = p.execution_deadline_ms.unwrap_or(p.decision_deadline_ms);
            Some((
                TaskStatus::Completed,
                Some(text_result(
                    format!(
                        "Approval recorded for proposal {}. Issue the identical call again before {until} (Unix ms) to run it once; \
                         after that a new approval is required. This receipt does not say the approval is still unused.",
                        p.id
                    ),
                    false,
                    json!({"status": "approval_recorded", "approvalExpiresAtMs": until}),
                )),
            ))
        }
        State::Rejected => Some((
            TaskStatus::Completed,
            Some(text_result(
                format!(
                    "An administrator rejected proposal {}; the identical call is refused until {} (Unix ms). Nothing ran.",
                    p.id, p.decision_deadline_ms
                ),
                true,
                json!({"status": "rejected"}),
            )),
        )),
        State::Expired => Some(expired(p, text_result)),
        State::Cancelled => Some((TaskStatus::Cancelled, None)),
    }
}

fn expired(
    p: &Proposal,
    text_result: impl Fn(String, bool, Value) -> Outcome,
) -> (TaskStatus, Option<Outcome>) {
    (
        TaskStatus::Completed,
        Some(text_result(
            format!(
                "Approval expired: proposal {} was not decided or its approval was not used in time. Nothing ran; an identical call asks afresh.",
                p.id
            ),
            true,
            json!({"status": "approval_expired"}),
        )),
    )
}

/// The reference a new approval task records.
pub(super) fn reference(proposal: &str, seq: u64) -> ProposalRef {
    ProposalRef {
        id: proposal.to_string(),
        seq,
    }
}

/// Whether a task waits on a proposal and still needs the journal.
pub(super) fn waiting(record: &TaskRecord) -> Option<&ProposalRef> {
    record
        .proposal
        .as_ref()
        .filter(|_| !record.status.is_terminal())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Overrides};

    const DAY_MS: i64 = 86_400_000;

    fn held(call: &str) -> HeldCall {
        HeldCall {
            owner: "o".repeat(64),
            call: call.into(),
            tool: "deploy".into(),
            principal: "the local caller".into(),
            arguments: "0".repeat(64),
            preview: Default::default(),
        }
    }

    /// Approvals in a fresh directory, with the tasks' default time to
    /// live `ttl_ms` and the execution window (and everything else) at its
    /// default.
    fn approvals(dir: &std::path::Path, ttl_ms: i64) -> Approvals {
        let env = [("XDG_STATE_HOME".to_string(), "/x/state".to_string())].into();
        let mut settings = Config::load_from(&Overrides::default(), &env)
            .unwrap()
            .approvals;
        settings.directory = dir.join("journal");
        Approvals::open(&settings, Duration::from_millis(ttl_ms as u64))
    }

    /// Whether a proposal approved at once is still kept when a new call
    /// first looks for settled ones `past_ms` after its decision deadline.
    fn kept(ttl_ms: i64, past_ms: i64) -> bool {
        let d = tempfile::tempdir().unwrap();
        let a = approvals(d.path(), ttl_ms);
        let gate = a.gate().unwrap();
        let Admission::Held {
            proposal,
            decision_deadline_ms,
            ..
        } = gate.admit(&held("first"), 0).unwrap()
        else {
            panic!("not held")
        };
        gate.approve(&proposal, "admin", "admin", 1).unwrap();
        gate.admit(&held("later"), decision_deadline_ms + past_ms)
            .unwrap();
        gate.proposal(&proposal).is_some()
    }

    #[test]
    fn a_decided_proposal_is_kept_exactly_as_long_as_its_longest_lived_task() {
        let window_ms = 900_000;
        // An approval task lives the default time to live or the execution
        // window and the receipt margin, whichever is longer: the proposal
        // is kept to the millisecond that longer one ends, and no longer.
        for (ttl_ms, longest) in [(DAY_MS, DAY_MS), (60_000, window_ms + RECEIPT_MARGIN_MS)] {
            assert_eq!(retain_ms(ttl_ms, window_ms), longest, "ttl {ttl_ms}");
            assert!(kept(ttl_ms, longest), "forgotten early (ttl {ttl_ms})");
            assert!(!kept(ttl_ms, longest + 1), "kept too long (ttl {ttl_ms})");
        }
    }
}
