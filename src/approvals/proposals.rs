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

/// Every proposal the journal holds, and the proposals of each exact call.
#[derive(Debug, Default)]
pub struct Proposals {
    by_id: HashMap<String, Proposal>,
    /// Proposals of one exact-call key, oldest first.
    by_call: HashMap<String, Vec<String>>,
}

impl Proposals {
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
                    },
                );
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
