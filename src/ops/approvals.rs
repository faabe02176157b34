//! Approvals as an administrator sees them: the proposals, one proposal,
//! a decision, and the journal's state.

use super::{Ops, OpsError};
use crate::tasks::{AdminRefusal, ApprovalsStatus, Decider, Decision, Proposal};

/// Proposals and the journal's state they were read with.
#[derive(Debug, Clone)]
pub struct Listing {
    pub proposals: Vec<Proposal>,
    pub journal: ApprovalsStatus,
}

impl Listing {
    /// This listing, or the refusal of a disabled journal: for a surface
    /// that refuses a listing of nothing rather than show one.
    pub fn require_enabled(self) -> Result<Listing, OpsError> {
        match &self.journal.disabled {
            Some(reason) => Err(OpsError::ApprovalsDisabled(reason.clone())),
            None => Ok(self),
        }
    }
}

impl From<AdminRefusal> for OpsError {
    fn from(e: AdminRefusal) -> OpsError {
        match e {
            AdminRefusal::Disabled(reason) => OpsError::ApprovalsDisabled(reason),
            AdminRefusal::Unknown(id) => OpsError::UnknownProposal(id),
            AdminRefusal::Refused(why) => OpsError::DecisionRefused(why),
            AdminRefusal::Failed(why) => OpsError::JournalFailed(why),
        }
    }
}

impl Ops {
    /// Whether this daemon holds calls for approval at all.
    pub fn approvals_set_up(&self) -> Result<(), OpsError> {
        self.svc
            .approvals()
            .map(drop)
            .ok_or(OpsError::ApprovalsNotSetUp)
    }

    /// The proposals newest first (only those waiting when `pending`), or
    /// the one `id` names; with the journal's state. A disabled journal
    /// lists no proposal (its state says why) and shows none.
    pub fn approvals(&self, id: Option<&str>, pending: bool) -> Result<Listing, OpsError> {
        let approvals = self.svc.approvals().ok_or(OpsError::ApprovalsNotSetUp)?;
        let now = self.now_ms();
        let journal = approvals.status(now);
        match approvals.proposals(id, pending, now) {
            Ok(proposals) => Ok(Listing { proposals, journal }),
            Err(AdminRefusal::Disabled(_)) if id.is_none() => Ok(Listing {
                proposals: Vec::new(),
                journal,
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// Journals an administrator's decision on proposal `id`; the decided
    /// proposal, with the journal's state after it.
    pub async fn decide(
        &self,
        id: &str,
        decision: Decision,
        decider: Decider,
    ) -> Result<Listing, OpsError> {
        let approvals = self.svc.approvals().ok_or(OpsError::ApprovalsNotSetUp)?;
        let now = self.now_ms();
        let p = approvals.decide(id, decision, decider, now).await?;
        Ok(Listing {
            proposals: vec![p],
            journal: approvals.status(now),
        })
    }
}
