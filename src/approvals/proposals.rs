//! What the journal's events mean: each proposal's state, and the rules
//! for moving it on. The journal is replayed through [`Proposals::apply`]
//! at opening, and the gate checks every new event with
//! [`Proposals::check`] before it appends it, so the first valid event of a
//! race wins and a journal holding an impossible sequence is refused.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::Event;

/// Where a proposal stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Pending,
    Approved,
    Rejected,
    Expired,
    Consumed,
    Cancelled,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Approved => "approved",
            State::Rejected => "rejected",
            State::Expired => "expired",
            State::Consumed => "consumed",
            State::Cancelled => "cancelled",
        }
    }
}

/// One proposal as the journal made it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    pub id: String,
    pub owner: String,
    pub call: String,
    pub tool: String,
    pub principal: String,
    pub arguments: String,
    pub preview: std::collections::BTreeMap<String, serde_json::Value>,
    pub state: State,
    pub created_ms: i64,
    pub decision_deadline_ms: i64,
    /// Set once approved.
    pub execution_deadline_ms: Option<i64>,
    pub decider: Option<String>,
    pub decided_ms: Option<i64>,
    /// The journal sequence of the event that last changed it.
    pub seq: u64,
    /// The journal sequence of the event that made it.
    #[serde(default)]
    pub created_seq: u64,
}

impl Proposal {
    /// An approval first observed after its execution deadline is spent by
    /// time: it reads as expired, though the journal says approved.
    pub fn approval_lapsed(&self, now_ms: i64) -> bool {
        self.state == State::Approved && self.execution_deadline_ms.is_some_and(|d| now_ms > d)
    }
}

/// Why an event cannot follow what the journal holds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("no proposal {0}")]
    Unknown(String),
    #[error("proposal {0} exists already")]
    Exists(String),
    #[error("proposal {id} is {state}, not {wanted}")]
    WrongState {
        id: String,
        state: &'static str,
        wanted: &'static str,
    },
    #[error("proposal {id}'s {which} deadline passed")]
    Late { id: String, which: &'static str },
    #[error("proposal {id} is not this caller's")]
    NotOwner { id: String },
    #[error("a deadline before its proposal's creation")]
    Backwards,
}

/// How many proposals one owner has: waiting, and kept in all.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub pending: usize,
    pub kept: usize,
}

/// Every proposal the journal holds, and the proposals of each exact call.
#[derive(Debug, Default)]
pub struct Proposals {
    by_id: HashMap<String, Proposal>,
    /// Proposals of one exact-call key, oldest first.
    by_call: HashMap<String, Vec<String>>,
    /// Proposals in state pending (some may be past their deadline, not yet
    /// journaled expired).
    pending: usize,
    by_owner: HashMap<String, Held>,
    /// The journal's oldest segments were removed: an event about a
    /// proposal made in them (long settled) is passed over when replayed.
    begins_late: bool,
}

impl Proposals {
    /// A view to replay a journal into; `begins_late` when the journal's
    /// oldest segments were removed.
    pub fn replaying(begins_late: bool) -> Proposals {
        Proposals {
            begins_late,
            ..Proposals::default()
        }
    }

    /// Proposals in state pending, and kept in all.
    pub fn counts(&self) -> Held {
        Held {
            pending: self.pending,
            kept: self.by_id.len(),
        }
    }

    /// What `owner` has.
    pub fn of_owner(&self, owner: &str) -> Held {
        self.by_owner.get(owner).copied().unwrap_or_default()
    }

    /// Every proposal, in no order.
    pub fn iter(&self) -> impl Iterator<Item = &Proposal> {
        self.by_id.values()
    }

    /// The journal sequence of the oldest proposal kept.
    pub fn oldest_seq(&self) -> Option<u64> {
        self.by_id.values().map(|p| p.created_seq).min()
    }

    /// Forgets the proposals that can no longer change or matter: decided
    /// (not pending) and past their decision deadline by `retain_ms` (the
    /// longest an approval task waiting on them can live). Returns how many
    /// went.
    pub fn forget_settled(&mut self, now_ms: i64, retain_ms: i64) -> usize {
        let gone: Vec<String> = self
            .by_id
            .values()
            .filter(|p| {
                p.state != State::Pending
                    && now_ms > p.decision_deadline_ms.saturating_add(retain_ms)
            })
            .map(|p| p.id.clone())
            .collect();
        for id in &gone {
            let Some(p) = self.by_id.remove(id) else {
                continue;
            };
            if let Some(ids) = self.by_call.get_mut(&p.call) {
                ids.retain(|i| i != id);
                if ids.is_empty() {
                    self.by_call.remove(&p.call);
                }
            }
            if let Some(held) = self.by_owner.get_mut(&p.owner) {
                held.kept = held.kept.saturating_sub(1);
                if held.kept == 0 {
                    self.by_owner.remove(&p.owner);
                }
            }
        }
        gone.len()
    }

    pub fn get(&self, id: &str) -> Option<&Proposal> {
        self.by_id.get(id)
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Every proposal, newest first.
    pub fn all(&self) -> Vec<&Proposal> {
        let mut v: Vec<&Proposal> = self.by_id.values().collect();
        v.sort_by(|a, b| b.created_ms.cmp(&a.created_ms).then(a.id.cmp(&b.id)));
        v
    }

    /// The proposals of an exact call, newest first.
    pub fn of_call(&self, call: &str) -> Vec<&Proposal> {
        let mut v: Vec<&Proposal> = self
            .by_call
            .get(call)
            .map(|ids| ids.iter().filter_map(|id| self.by_id.get(id)).collect())
            .unwrap_or_default();
        v.reverse();
        v
    }

    fn in_state(&self, id: &str, wanted: State) -> Result<&Proposal, Refusal> {
        let p = self
            .by_id
            .get(id)
            .ok_or_else(|| Refusal::Unknown(id.to_string()))?;
        if p.state != wanted {
            return Err(Refusal::WrongState {
                id: id.to_string(),
                state: p.state.as_str(),
                wanted: wanted.as_str(),
            });
        }
        Ok(p)
    }

    /// Whether `event` may follow what is held.
    pub fn check(&self, event: &Event) -> Result<(), Refusal> {
        match event {
            Event::ProposalCreated {
                proposal,
                created_ms,
                decision_deadline_ms,
                ..
            } => {
                if self.by_id.contains_key(proposal) {
                    return Err(Refusal::Exists(proposal.clone()));
                }
                if decision_deadline_ms < created_ms {
                    return Err(Refusal::Backwards);
                }
                Ok(())
            }
            Event::Approved {
                proposal,
                at_ms,
                execution_deadline_ms,
                ..
            } => {
                let p = self.in_state(proposal, State::Pending)?;
                if *at_ms > p.decision_deadline_ms {
                    return Err(Refusal::Late {
                        id: proposal.clone(),
                        which: "decision",
                    });
                }
                if execution_deadline_ms < at_ms {
                    return Err(Refusal::Backwards);
                }
                Ok(())
            }
            Event::Rejected {
                proposal, at_ms, ..
            } => {
                let p = self.in_state(proposal, State::Pending)?;
                if *at_ms > p.decision_deadline_ms {
                    return Err(Refusal::Late {
                        id: proposal.clone(),
                        which: "decision",
                    });
                }
                Ok(())
            }
            Event::Expired { proposal, at_ms } => {
                let p = self.in_state(proposal, State::Pending)?;
                if *at_ms <= p.decision_deadline_ms {
                    return Err(Refusal::WrongState {
                        id: proposal.clone(),
                        state: "pending before its deadline",
                        wanted: "expired",
                    });
                }
                Ok(())
            }
            Event::Consumed {
                proposal, at_ms, ..
            } => {
                let p = self.in_state(proposal, State::Approved)?;
                if p.execution_deadline_ms.is_none_or(|d| *at_ms > d) {
                    return Err(Refusal::Late {
                        id: proposal.clone(),
                        which: "execution",
                    });
                }
                Ok(())
            }
            Event::CallCancellation {
                proposal, owner, ..
            } => {
                let p = self.in_state(proposal, State::Pending)?;
                if &p.owner != owner {
                    return Err(Refusal::NotOwner {
                        id: proposal.clone(),
                    });
                }
                Ok(())
            }
        }
    }

    /// Applies an event checked with [`Proposals::check`] (or replayed from
    /// the journal, which refuses it when it does not hold): `seq` is its
    /// journal sequence.
    pub fn apply(&mut self, event: &Event, seq: u64) -> Result<(), Refusal> {
        if self.begins_late
            && !matches!(event, Event::ProposalCreated { .. })
            && !self.by_id.contains_key(event.proposal())
        {
            return Ok(());
        }
        self.check(event)?;
        match event {
            Event::ProposalCreated {
                proposal,
                owner,
                call,
                tool,
                principal,
                arguments,
                preview,
                created_ms,
                decision_deadline_ms,
            } => {
                self.by_id.insert(
                    proposal.clone(),
                    Proposal {
                        id: proposal.clone(),
                        owner: owner.clone(),
                        call: call.clone(),
                        tool: tool.clone(),
                        principal: principal.clone(),
                        arguments: arguments.clone(),
                        preview: preview.clone(),
                        state: State::Pending,
                        created_ms: *created_ms,
                        decision_deadline_ms: *decision_deadline_ms,
                        execution_deadline_ms: None,
                        decider: None,
                        decided_ms: None,
                        seq,
                        created_seq: seq,
                    },
                );
                self.pending += 1;
                let held = self.by_owner.entry(owner.clone()).or_default();
                held.pending += 1;
                held.kept += 1;
                self.by_call
                    .entry(call.clone())
                    .or_default()
                    .push(proposal.clone());
            }
            other => {
                let Some(p) = self.by_id.get_mut(other.proposal()) else {
                    return Err(Refusal::Unknown(other.proposal().to_string()));
                };
                p.seq = seq;
                if p.state == State::Pending {
                    self.pending = self.pending.saturating_sub(1);
                    if let Some(held) = self.by_owner.get_mut(&p.owner) {
                        held.pending = held.pending.saturating_sub(1);
                    }
                }
                match other {
                    Event::Approved {
                        decider,
                        at_ms,
                        execution_deadline_ms,
                        ..
                    } => {
                        p.state = State::Approved;
                        p.decider = Some(decider.clone());
                        p.decided_ms = Some(*at_ms);
                        p.execution_deadline_ms = Some(*execution_deadline_ms);
                    }
                    Event::Rejected { decider, at_ms, .. } => {
                        p.state = State::Rejected;
                        p.decider = Some(decider.clone());
                        p.decided_ms = Some(*at_ms);
                    }
                    Event::Expired { at_ms, .. } => {
                        p.state = State::Expired;
                        p.decided_ms = Some(*at_ms);
                    }
                    Event::Consumed { .. } => p.state = State::Consumed,
                    Event::CallCancellation { at_ms, .. } => {
                        p.state = State::Cancelled;
                        p.decided_ms = Some(*at_ms);
                    }
                    Event::ProposalCreated { .. } => {}
                }
            }
        }
        Ok(())
    }
}
