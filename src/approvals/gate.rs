//! The gate: holds a call that needs approval until an administrator has
//! approved that exact call, and lets it through once.
//!
//! Every change is one journal append, made under one lock, checked
//! against the proposals first: of two racing decisions (an approval and a
//! cancel, an approval and the deadline) the first one appended wins and
//! the other is refused with what happened. The proposals are also kept
//! behind a reader-writer lock of their own, updated after each append, so
//! a status read never waits for an append to be synced.

use std::sync::{Mutex, RwLock};

use thiserror::Error;

use super::journal::{self, Checkpoint, Journal, JournalError, Opened};
use super::proposals::{Proposal, Proposals, Refusal, State};
use super::{Event, HeldCall, MAX_REASON_BYTES};

/// The bounds and windows of the gate.
#[derive(Debug, Clone, Copy)]
pub struct GateSettings {
    /// How long a proposal waits for a decision.
    pub decision_window_ms: i64,
    /// How long an approval may be used, from the moment it was given.
    pub execution_window_ms: i64,
    /// Largest journal segment.
    pub segment_max_bytes: u64,
    /// Proposals pending at once; past it new calls are refused.
    pub max_pending: usize,
    /// Proposals one owner may have pending at once.
    pub max_pending_per_owner: usize,
    /// Proposals kept at once (pending, or decided and not yet forgotten).
    pub max_proposals: usize,
    /// Proposals one owner may have kept at once.
    pub max_proposals_per_owner: usize,
    /// How long past its decision deadline a decided proposal is kept: the
    /// longest an approval task waiting on it can live. Then it is
    /// forgotten, and journal segments holding only forgotten proposals
    /// are removed.
    pub retain_ms: i64,
    /// Whether an administrator may approve a call of their own.
    pub forbid_self_approval: bool,
}

/// What the gate says to a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// An approval of this exact call was spent on it: it proceeds.
    Proceed { proposal: String },
    /// It waits for a decision; `joined` when an identical call was
    /// already waiting and this one joined its proposal.
    Held {
        proposal: String,
        decision_deadline_ms: i64,
        joined: bool,
    },
    /// An administrator rejected this exact call: refused until then.
    Refused { proposal: String, until_ms: i64 },
}

#[derive(Debug, Error)]
pub enum GateError {
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The journal holds an event that cannot follow the ones before it.
    #[error(
        "the approval journal holds an impossible event at record {seq}: {refusal}; approvals are disabled"
    )]
    Inconsistent { seq: u64, refusal: Refusal },
    /// The journal holds a record that is not an event.
    #[error(
        "the approval journal's record {seq} is not an approval event: {reason}; approvals are disabled"
    )]
    Unreadable { seq: u64, reason: String },
    #[error("{0}")]
    Refused(Refusal),
    #[error(
        "an administrator may not approve a call of their own (approvals.self_approval = \"forbid\"); another administrator must decide it"
    )]
    SelfApproval,
    #[error(
        "{limit} calls already wait for an administrator (approvals.max_pending); retry once some are decided"
    )]
    TooManyPending { limit: usize },
    /// The journal keeps as many proposals as it may.
    #[error(
        "the approval journal keeps {limit} proposals (approvals.max_proposals) until each is decided and its tasks' lifetime has passed; retry once older ones are forgotten"
    )]
    TooManyKept { limit: usize },
    /// This caller is at one of its own bounds (the message names it).
    #[error("this caller already has {count} {what}; {then}")]
    OwnerLimit {
        count: usize,
        what: &'static str,
        then: &'static str,
    },
    #[error("a rejection reason is at most {MAX_REASON_BYTES} bytes")]
    ReasonTooLong,
    /// An append failed earlier (its record may or may not be on disk):
    /// the gate decides nothing more until the journal is opened again.
    #[error(
        "approvals are disabled until the daemon is restarted: {reason}; nothing was decided or run"
    )]
    Disabled { reason: String },
}

pub struct Gate {
    journal: Mutex<Journal>,
    view: RwLock<Proposals>,
    settings: GateSettings,
    /// When settled proposals are next looked for (Unix ms).
    next_forget_ms: std::sync::atomic::AtomicI64,
    /// Held while segments may not be removed (an online backup copying
    /// them).
    segments: Mutex<()>,
    /// The last sequence appended: read without the journal's lock.
    head_seq: std::sync::atomic::AtomicU64,
    /// The journal directory's lock, held while the gate is open (see
    /// [`Gate::open_dir`]).
    _lock: Option<nix::fcntl::Flock<std::fs::File>>,
    /// Why the gate stopped deciding: an append that failed, whose record
    /// the disk may or may not hold (set once, never cleared).
    failed: std::sync::OnceLock<String>,
}

/// How often settled proposals are looked for (at the next new call).
const FORGET_EVERY_MS: i64 = 60_000;

/// The lock file in the journal's directory: one process appends at a time.
pub const LOCK_FILE: &str = "journal.lock";

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn random_id() -> Result<String, GateError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| {
        GateError::Journal(JournalError::Invalid {
            dir: Default::default(),
            reason: format!("no random source: {e}"),
        })
    })?;
    Ok(format!(
        "tgp-{}",
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    ))
}

impl Gate {
    /// Opens the journal in `dir` and replays it: an event that cannot
    /// follow the ones before it refuses the journal.
    pub fn open(
        dir: &std::path::Path,
        settings: GateSettings,
    ) -> Result<(Gate, Opened), GateError> {
        let (journal, entries, opened) = journal::open(dir, settings.segment_max_bytes)?;
        let mut view = Proposals::replaying(journal.first_seq() > 1);
        let head_seq = journal.checkpoint().records;
        for entry in entries {
            let event =
                Event::from_record(&entry.record).map_err(|reason| GateError::Unreadable {
                    seq: entry.seq,
                    reason,
                })?;
            view.apply(&event, entry.seq)
                .map_err(|refusal| GateError::Inconsistent {
                    seq: entry.seq,
                    refusal,
                })?;
        }
        Ok((
            Gate {
                journal: Mutex::new(journal),
                view: RwLock::new(view),
                settings,
                next_forget_ms: i64::MIN.into(),
                segments: Mutex::new(()),
                head_seq: head_seq.into(),
                _lock: None,
                failed: std::sync::OnceLock::new(),
            },
            opened,
        ))
    }

    /// Opens the journal in its own private directory: created 0700 when
    /// missing (its parent must exist), refused when another user owns it
    /// or others may enter it, and locked so that a second process cannot
    /// append to it too.
    pub fn open_dir(
        dir: &std::path::Path,
        settings: GateSettings,
    ) -> Result<(Gate, Opened), GateError> {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
        let invalid = |reason: String| {
            GateError::Journal(JournalError::Invalid {
                dir: dir.to_path_buf(),
                reason,
            })
        };
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(dir)
                .map_err(|e| invalid(format!("cannot create it: {e}")))?;
        }
        let meta = std::fs::symlink_metadata(dir).map_err(|e| invalid(e.to_string()))?;
        if !meta.is_dir() {
            return Err(invalid("it is not a directory".into()));
        }
        let me = nix::unistd::geteuid().as_raw();
        if meta.uid() != me {
            return Err(invalid(format!(
                "it belongs to uid {}, not to this service's uid {me}",
                meta.uid()
            )));
        }
        if meta.mode() & 0o077 != 0 {
            return Err(invalid(format!(
                "its mode is {:o}; others may enter it (chmod 700 it)",
                meta.mode() & 0o777
            )));
        }
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(dir.join(LOCK_FILE))
            .map_err(|e| invalid(format!("cannot open {LOCK_FILE}: {e}")))?;
        let lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock)
            .map_err(|(_, e)| {
                invalid(format!(
                    "another process holds {LOCK_FILE} ({e}); one daemon appends to a journal"
                ))
            })?;
        let (mut gate, opened) = Gate::open(dir, settings)?;
        gate._lock = Some(lock);
        Ok((gate, opened))
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Proposals> {
        self.view.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends `event` (under the journal lock the caller holds) once it is
    /// checked, then shows it to readers.
    fn append(&self, journal: &mut Journal, event: &Event) -> Result<Proposal, GateError> {
        self.usable()?;
        self.read().check(event).map_err(GateError::Refused)?;
        let record = event.to_record().map_err(|_| GateError::ReasonTooLong)?;
        let seq = match journal.append(&record) {
            Ok(seq) => seq,
            Err(e @ JournalError::RecordTooLarge { .. }) => return Err(e.into()),
            Err(e) => {
                // Whether the record reached the disk is unknown (a failed
                // sync may have lost it, or a retry could write it twice):
                // never answer another decision from this journal.
                let reason = format!("the approval journal failed an append: {e}");
                tracing::error!(error = %e, "{reason}; approvals are disabled until the daemon is restarted");
                let _ = self.failed.set(reason);
                return Err(e.into());
            }
        };
        crate::metrics::get().approval_event(event.kind());
        self.head_seq
            .store(seq, std::sync::atomic::Ordering::SeqCst);
        let mut view = self.view.write().unwrap_or_else(|p| p.into_inner());
        view.apply(event, seq).map_err(GateError::Refused)?;
        view.get(event.proposal())
            .cloned()
            .ok_or_else(|| GateError::Refused(Refusal::Unknown(event.proposal().to_string())))
    }

    /// A pending proposal past its deadline is journaled expired before
    /// anything else is decided about it.
    fn expire_if_due(
        &self,
        journal: &mut Journal,
        p: &Proposal,
        now: i64,
    ) -> Result<Option<Proposal>, GateError> {
        if p.state == State::Pending && now > p.decision_deadline_ms {
            return self
                .append(
                    journal,
                    &Event::Expired {
                        proposal: p.id.clone(),
                        at_ms: now,
                    },
                )
                .map(Some);
        }
        Ok(None)
    }

    /// A call that needs approval: spend an approval of this exact call,
    /// join a proposal waiting for it, refuse it while its rejection
    /// stands, or make a new proposal.
    pub fn admit(&self, held: &HeldCall, now: i64) -> Result<Admission, GateError> {
        let call = held.call.as_str();
        let mut journal = lock(&self.journal);
        self.usable()?;
        if now
            >= self
                .next_forget_ms
                .load(std::sync::atomic::Ordering::Relaxed)
        {
            self.forget_settled(&mut journal, now);
        }
        let latest = self.read().of_call(call).first().map(|p| (*p).clone());
        if let Some(p) = latest {
            let p = self.expire_if_due(&mut journal, &p, now)?.unwrap_or(p);
            match p.state {
                State::Approved if !p.approval_lapsed(now) => {
                    self.append(
                        &mut journal,
                        &Event::Consumed {
                            proposal: p.id.clone(),
                            request: call.to_string(),
                            at_ms: now,
                        },
                    )?;
                    return Ok(Admission::Proceed { proposal: p.id });
                }
                State::Pending => {
                    return Ok(Admission::Held {
                        proposal: p.id,
                        decision_deadline_ms: p.decision_deadline_ms,
                        joined: true,
                    });
                }
                State::Rejected if now <= p.decision_deadline_ms => {
                    return Ok(Admission::Refused {
                        proposal: p.id,
                        until_ms: p.decision_deadline_ms,
                    });
                }
                _ => {}
            }
        }
        self.room_for(&mut journal, &held.owner, now)?;
        let id = random_id()?;
        let deadline = now.saturating_add(self.settings.decision_window_ms);
        self.append(
            &mut journal,
            &Event::ProposalCreated {
                proposal: id.clone(),
                owner: held.owner.clone(),
                call: call.to_string(),
                tool: held.tool.clone(),
                principal: held.principal.clone(),
                arguments: held.arguments.clone(),
                preview: held.preview.clone(),
                created_ms: now,
                decision_deadline_ms: deadline,
            },
        )?;
        Ok(Admission::Held {
            proposal: id,
            decision_deadline_ms: deadline,
            joined: false,
        })
    }

    /// Whether a new proposal of `owner` fits the bounds: pending ones past
    /// their deadline are journaled expired before a waiting bound refuses
    /// it. (Settled ones are forgotten at most once a minute, at the start
    /// of an admission: a caller refused at a bound cannot make the gate
    /// scan for them on every call.)
    fn room_for(&self, journal: &mut Journal, owner: &str, now: i64) -> Result<(), GateError> {
        let s = &self.settings;
        let pending_full = {
            let view = self.read();
            view.counts().pending >= s.max_pending
                || view.of_owner(owner).pending >= s.max_pending_per_owner
        };
        if pending_full {
            self.expire_overdue(journal, now)?;
        }
        let view = self.read();
        let (all, mine) = (view.counts(), view.of_owner(owner));
        if all.pending >= s.max_pending {
            return Err(GateError::TooManyPending {
                limit: s.max_pending,
            });
        }
        if mine.pending >= s.max_pending_per_owner {
            return Err(GateError::OwnerLimit {
                count: mine.pending,
                what: "calls waiting for an administrator (approvals.max_pending_per_owner)",
                then: "nothing was run or proposed; retry once some are decided",
            });
        }
        if all.kept >= s.max_proposals {
            return Err(GateError::TooManyKept {
                limit: s.max_proposals,
            });
        }
        if mine.kept >= s.max_proposals_per_owner {
            return Err(GateError::OwnerLimit {
                count: mine.kept,
                what: "proposals kept by the approval journal (approvals.max_proposals_per_owner)",
                then: "nothing was run or proposed; a decided proposal is forgotten once its tasks' lifetime has passed",
            });
        }
        Ok(())
    }

    /// Journals the expiry of every pending proposal past its deadline.
    fn expire_overdue(&self, journal: &mut Journal, now: i64) -> Result<Vec<String>, GateError> {
        let due: Vec<Proposal> = self
            .read()
            .iter()
            .filter(|p| p.state == State::Pending && now > p.decision_deadline_ms)
            .cloned()
            .collect();
        let mut done = Vec::new();
        for p in due {
            self.expire_if_due(journal, &p, now)?;
            done.push(p.id);
        }
        Ok(done)
    }

    /// Forgets the settled proposals (see [`GateSettings::retain_ms`]) and
    /// removes the journal segments that hold nothing else. A segment that
    /// cannot be removed stays (and is tried again later): approvals go on.
    fn forget_settled(&self, journal: &mut Journal, now: i64) {
        self.next_forget_ms.store(
            now.saturating_add(FORGET_EVERY_MS),
            std::sync::atomic::Ordering::Relaxed,
        );
        let oldest = {
            let mut view = self.view.write().unwrap_or_else(|p| p.into_inner());
            view.forget_settled(now, self.settings.retain_ms);
            view.oldest_seq()
        };
        let keep_from = oldest.unwrap_or(journal.checkpoint().records + 1);
        let Ok(_held) = self.segments.try_lock() else {
            return;
        };
        match journal.remove_before(keep_from) {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                segments = n,
                "removed {n} approval journal segments holding only proposals settled past their tasks' lifetime"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "cannot remove old approval journal segments: {e}")
            }
        }
    }

    /// Why the gate decides nothing more, once an append failed.
    pub fn disabled(&self) -> Option<&str> {
        self.failed.get().map(String::as_str)
    }

    fn usable(&self) -> Result<(), GateError> {
        match self.failed.get() {
            Some(reason) => Err(GateError::Disabled {
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Keeps journal segments from being removed while the guard lives (an
    /// online backup copies them).
    pub fn hold_segments(&self) -> std::sync::MutexGuard<'_, ()> {
        lock(&self.segments)
    }

    /// An administrator approves `id`; `decider_owner` is their identity
    /// digest, compared with the proposal's owner when self-approval is
    /// forbidden.
    pub fn approve(
        &self,
        id: &str,
        decider: &str,
        decider_owner: &str,
        now: i64,
    ) -> Result<Proposal, GateError> {
        self.approve_for(id, decider, decider_owner, now, None)
    }

    /// [`Gate::approve`], with the approval usable for `valid_for_ms` at
    /// most (never past the execution window).
    pub fn approve_for(
        &self,
        id: &str,
        decider: &str,
        decider_owner: &str,
        now: i64,
        valid_for_ms: Option<i64>,
    ) -> Result<Proposal, GateError> {
        let window = valid_for_ms
            .unwrap_or(self.settings.execution_window_ms)
            .clamp(0, self.settings.execution_window_ms);
        let mut journal = lock(&self.journal);
        self.usable()?;
        let p = self.current(&mut journal, id, now)?;
        if self.settings.forbid_self_approval && p.owner == decider_owner {
            return Err(GateError::SelfApproval);
        }
        self.append(
            &mut journal,
            &Event::Approved {
                proposal: id.to_string(),
                decider: decider.to_string(),
                at_ms: now,
                execution_deadline_ms: now.saturating_add(window),
            },
        )
    }

    /// An administrator rejects `id`; the reason stays in the journal.
    pub fn reject(
        &self,
        id: &str,
        decider: &str,
        reason: &str,
        now: i64,
    ) -> Result<Proposal, GateError> {
        if reason.len() > MAX_REASON_BYTES {
            return Err(GateError::ReasonTooLong);
        }
        let mut journal = lock(&self.journal);
        self.current(&mut journal, id, now)?;
        self.append(
            &mut journal,
            &Event::Rejected {
                proposal: id.to_string(),
                decider: decider.to_string(),
                at_ms: now,
                reason: reason.to_string(),
            },
        )
    }

    /// The exact owner cancels its waiting call: the hold is released. The
    /// proposal as it stands after (a decision that came first stands).
    pub fn cancel(&self, id: &str, owner: &str, now: i64) -> Result<Proposal, GateError> {
        let mut journal = lock(&self.journal);
        let p = self.current(&mut journal, id, now)?;
        if p.owner != owner {
            return Err(GateError::Refused(Refusal::Unknown(id.to_string())));
        }
        if p.state != State::Pending {
            return Ok(p);
        }
        self.append(
            &mut journal,
            &Event::CallCancellation {
                proposal: id.to_string(),
                owner: owner.to_string(),
                at_ms: now,
            },
        )
    }

    /// The proposal, journaled expired first when its deadline passed.
    fn current(&self, journal: &mut Journal, id: &str, now: i64) -> Result<Proposal, GateError> {
        self.usable()?;
        let p = self
            .read()
            .get(id)
            .cloned()
            .ok_or_else(|| GateError::Refused(Refusal::Unknown(id.to_string())))?;
        Ok(self.expire_if_due(journal, &p, now)?.unwrap_or(p))
    }

    /// Journals the expiry of every pending proposal past its deadline;
    /// the IDs expired.
    pub fn expire_due(&self, now: i64) -> Result<Vec<String>, GateError> {
        let mut journal = lock(&self.journal);
        self.usable()?;
        self.expire_overdue(&mut journal, now)
    }

    /// The proposal, its expiry journaled first when it is pending past
    /// its decision deadline (this waits for the journal).
    pub fn observe(&self, id: &str, now: i64) -> Result<Proposal, GateError> {
        let mut journal = lock(&self.journal);
        self.current(&mut journal, id, now)
    }

    /// The sequence of the last record the journal holds (0 when empty).
    pub fn head_seq(&self) -> u64 {
        self.head_seq.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Proposals waiting for a decision and not yet past their deadline.
    pub fn pending(&self, now: i64) -> usize {
        self.read()
            .iter()
            .filter(|p| p.state == State::Pending && now <= p.decision_deadline_ms)
            .count()
    }

    /// The proposals waiting and when the oldest of them was made.
    pub fn pending_since(&self, now: i64) -> (usize, Option<i64>) {
        let view = self.read();
        let waiting = view
            .iter()
            .filter(|p| p.state == State::Pending && now <= p.decision_deadline_ms);
        waiting.fold((0, None), |(n, oldest), p| {
            let o: Option<i64> = oldest;
            (n + 1, Some(o.map_or(p.created_ms, |o| o.min(p.created_ms))))
        })
    }

    /// A proposal as it stands: a read that never waits for an append.
    pub fn proposal(&self, id: &str) -> Option<Proposal> {
        self.read().get(id).cloned()
    }

    /// Every proposal, newest first.
    pub fn list(&self) -> Vec<Proposal> {
        self.read().all().into_iter().cloned().collect()
    }

    pub fn checkpoint(&self) -> Checkpoint {
        lock(&self.journal).checkpoint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60_000;
    /// Rounds of each race, each started by a barrier.
    const ROUNDS: usize = 100;

    /// Runs `a` and `b` at once (released together by a barrier).
    fn race<A: Send + 'static, B: Send + 'static>(
        a: impl FnOnce() -> A + Send + 'static,
        b: impl FnOnce() -> B + Send + 'static,
    ) -> (A, B) {
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
        let b1 = barrier.clone();
        let ta = std::thread::spawn(move || {
            b1.wait();
            a()
        });
        let tb = std::thread::spawn(move || {
            barrier.wait();
            b()
        });
        (ta.join().unwrap(), tb.join().unwrap())
    }

    fn call(owner: &str, key: &str, tool: &str) -> HeldCall {
        HeldCall {
            owner: owner.into(),
            call: key.into(),
            tool: tool.into(),
            principal: format!("{owner} (tenant t) from https://id.example"),
            arguments: "0".repeat(64),
            preview: Default::default(),
        }
    }

    fn settings() -> GateSettings {
        GateSettings {
            decision_window_ms: 10 * MIN,
            execution_window_ms: 5 * MIN,
            segment_max_bytes: super::super::journal::MIN_SEGMENT_BYTES,
            max_pending: 3,
            max_pending_per_owner: 3,
            max_proposals: 1000,
            max_proposals_per_owner: 1000,
            retain_ms: 60 * MIN,
            forbid_self_approval: true,
        }
    }

    fn open(dir: &std::path::Path) -> Gate {
        Gate::open(dir, settings()).unwrap().0
    }

    fn held(a: Admission) -> (String, bool) {
        match a {
            Admission::Held {
                proposal, joined, ..
            } => (proposal, joined),
            other => panic!("not held: {other:?}"),
        }
    }

    #[test]
    fn an_approval_is_spent_once_by_the_exact_call_and_survives_a_reopen() {
        let d = tempfile::tempdir().unwrap();
        let g = open(d.path());
        let (p, joined) = held(g.admit(&call("alice", "call-1", "deploy"), 0).unwrap());
        assert!(!joined);
        // An identical call joins; another call gets its own proposal.
        assert_eq!(
            held(g.admit(&call("alice", "call-1", "deploy"), 1).unwrap()),
            (p.clone(), true)
        );
        let (other, _) = held(g.admit(&call("alice", "call-2", "deploy"), 2).unwrap());
        assert_ne!(other, p);
        // Nobody approves their own call.
        assert!(matches!(
            g.approve(&p, "alice", "alice", 3),
            Err(GateError::SelfApproval)
        ));
        g.approve(&p, "admin", "admin-digest", 4).unwrap();
        drop(g);
        let g = open(d.path());
        assert_eq!(g.proposal(&p).unwrap().state, State::Approved);
        assert_eq!(
            g.admit(&call("alice", "call-1", "deploy"), 5).unwrap(),
            Admission::Proceed {
                proposal: p.clone()
            }
        );
        // Spent: the same call again asks anew.
        let (again, joined) = held(g.admit(&call("alice", "call-1", "deploy"), 6).unwrap());
        assert!(again != p && !joined);
        assert_eq!(g.proposal(&p).unwrap().state, State::Consumed);
    }

    #[test]
    fn a_rejection_refuses_until_the_deadline_and_expiry_is_journaled_first() {
        let d = tempfile::tempdir().unwrap();
        let g = open(d.path());
        let (p, _) = held(g.admit(&call("bob", "c", "t"), 0).unwrap());
        g.reject(&p, "admin", "not today", 1).unwrap();
        assert_eq!(
            g.admit(&call("bob", "c", "t"), 2).unwrap(),
            Admission::Refused {
                proposal: p.clone(),
                until_ms: 10 * MIN
            }
        );
        // After the deadline, a new proposal.
        let (q, _) = held(g.admit(&call("bob", "c", "t"), 10 * MIN + 1).unwrap());
        assert_ne!(q, p);
        // Left undecided past its deadline: an approval comes too late.
        let late = 10 * MIN + 1 + 10 * MIN + 1;
        assert!(matches!(
            g.approve(&q, "admin", "admin", late),
            Err(GateError::Refused(Refusal::WrongState { .. }))
        ));
        assert_eq!(g.proposal(&q).unwrap().state, State::Expired);
        assert!(matches!(
            g.reject(&p, "admin", &"x".repeat(MAX_REASON_BYTES + 1), 3),
            Err(GateError::ReasonTooLong)
        ));
    }

    #[test]
    fn an_approval_used_after_its_window_has_lapsed() {
        let d = tempfile::tempdir().unwrap();
        let g = open(d.path());
        let (p, _) = held(g.admit(&call("c", "k", "t"), 0).unwrap());
        g.approve(&p, "admin", "admin", MIN).unwrap();
        // First observed past the execution deadline: not spent, a new ask.
        let (q, _) = held(g.admit(&call("c", "k", "t"), MIN + 5 * MIN + 1).unwrap());
        assert_ne!(q, p);
        let lapsed = g.proposal(&p).unwrap();
        assert!(lapsed.approval_lapsed(MIN + 5 * MIN + 1));
    }

    #[test]
    fn only_the_owner_cancels_and_a_cancel_releases_the_hold() {
        let d = tempfile::tempdir().unwrap();
        let g = open(d.path());
        let (p, _) = held(g.admit(&call("alice", "k", "t"), 0).unwrap());
        assert!(matches!(
            g.cancel(&p, "mallory", 1),
            Err(GateError::Refused(Refusal::Unknown(_)))
        ));
        assert_eq!(g.cancel(&p, "alice", 2).unwrap().state, State::Cancelled);
        let (q, joined) = held(g.admit(&call("alice", "k", "t"), 3).unwrap());
        assert!(q != p && !joined);
        // A decision that came first stands: a cancel after it changes nothing.
        g.approve(&q, "admin", "admin", 4).unwrap();
        assert_eq!(g.cancel(&q, "alice", 5).unwrap().state, State::Approved);
    }

    #[test]
    fn pending_proposals_are_bounded() {
        let d = tempfile::tempdir().unwrap();
        let g = open(d.path());
        for i in 0..3 {
            held(g.admit(&call("a", &format!("k{i}"), "t"), 0).unwrap());
        }
        assert!(matches!(
            g.admit(&call("a", "k3", "t"), 0),
            Err(GateError::TooManyPending { limit: 3 })
        ));
        // Joining a waiting proposal is not a new one.
        assert!(held(g.admit(&call("a", "k0", "t"), 1).unwrap()).1);
        // Expired ones make room.
        assert_eq!(g.expire_due(10 * MIN + 1).unwrap().len(), 3);
        held(g.admit(&call("a", "k3", "t"), 10 * MIN + 2).unwrap());
    }

    #[test]
    fn of_an_approval_and_a_cancel_racing_exactly_one_wins() {
        for round in 0..ROUNDS {
            let d = tempfile::tempdir().unwrap();
            let g = std::sync::Arc::new(open(d.path()));
            let (p, _) = held(g.admit(&call("alice", "k", "t"), 0).unwrap());
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
            let (g1, b1, p1) = (g.clone(), barrier.clone(), p.clone());
            let approve = std::thread::spawn(move || {
                b1.wait();
                g1.approve(&p1, "admin", "admin", 1).is_ok()
            });
            let (g2, b2, p2) = (g.clone(), barrier.clone(), p.clone());
            let cancel = std::thread::spawn(move || {
                b2.wait();
                g2.cancel(&p2, "alice", 1).map(|p| p.state)
            });
            let approved = approve.join().unwrap();
            let after_cancel = cancel.join().unwrap().unwrap();
            let end = g.proposal(&p).unwrap().state;
            if approved {
                assert_eq!(
                    (end, after_cancel),
                    (State::Approved, State::Approved),
                    "round {round}"
                );
            } else {
                assert_eq!(
                    (end, after_cancel),
                    (State::Cancelled, State::Cancelled),
                    "round {round}"
                );
            }
            // The journal says the same after a reopen.
            drop(g);
            assert_eq!(open(d.path()).proposal(&p).unwrap().state, end);
        }
    }

    #[test]
    fn of_an_approval_and_an_expiry_racing_exactly_one_wins() {
        let deadline = settings().decision_window_ms;
        let (mut approved_wins, mut expiry_wins) = (0, 0);
        for round in 0..ROUNDS {
            let d = tempfile::tempdir().unwrap();
            let g = std::sync::Arc::new(open(d.path()));
            let (p, _) = held(g.admit(&call("alice", "k", "t"), 0).unwrap());
            let (ga, gb, pa) = (g.clone(), g.clone(), p.clone());
            // The approval comes at the last allowed moment; the expiry is
            // observed one millisecond later (an injected clock).
            let (approved, expired) = race(
                move || ga.approve(&pa, "admin", "admin", deadline).is_ok(),
                move || gb.expire_due(deadline + 1).unwrap(),
            );
            let end = g.proposal(&p).unwrap().state;
            match (approved, expired.is_empty()) {
                (true, true) => {
                    assert_eq!(end, State::Approved, "round {round}");
                    approved_wins += 1;
                }
                (false, false) => {
                    assert_eq!(end, State::Expired, "round {round}");
                    expiry_wins += 1;
                }
                other => panic!("round {round}: both or neither won: {other:?}"),
            }
            drop(g);
            assert_eq!(open(d.path()).proposal(&p).unwrap().state, end);
        }
        assert_eq!(approved_wins + expiry_wins, ROUNDS);
    }

    #[test]
    fn of_two_reissues_racing_for_one_approval_exactly_one_runs() {
        for round in 0..ROUNDS {
            let d = tempfile::tempdir().unwrap();
            let g = std::sync::Arc::new(open(d.path()));
            let (p, _) = held(g.admit(&call("alice", "k", "t"), 0).unwrap());
            g.approve(&p, "admin", "admin", 1).unwrap();
            let (ga, gb) = (g.clone(), g.clone());
            let (a, b) = race(
                move || ga.admit(&call("alice", "k", "t"), 2).unwrap(),
                move || gb.admit(&call("alice", "k", "t"), 2).unwrap(),
            );
            let proceeded = [&a, &b]
                .iter()
                .filter(|x| matches!(x, Admission::Proceed { .. }))
                .count();
            assert_eq!(proceeded, 1, "round {round}: {a:?} {b:?}");
            // The other asks afresh, as a new proposal.
            let other = if matches!(a, Admission::Proceed { .. }) {
                b
            } else {
                a
            };
            let (fresh, joined) = held(other);
            assert!(!joined && fresh != p, "round {round}");
            assert_eq!(g.proposal(&p).unwrap().state, State::Consumed);
            drop(g);
            let g = open(d.path());
            assert_eq!(g.proposal(&p).unwrap().state, State::Consumed);
            assert!(matches!(
                g.admit(&call("alice", "k", "t"), 3).unwrap(),
                Admission::Held { .. }
            ));
        }
    }

    #[test]
    fn status_reads_never_wait_for_an_append() {
        let d = tempfile::tempdir().unwrap();
        let g = std::sync::Arc::new(open(d.path()));
        let (p, _) = held(g.admit(&call("alice", "k", "t"), 0).unwrap());
        // The journal's lock held, as by an append stuck in fsync.
        let appending = lock(&g.journal);
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = g.clone();
        std::thread::spawn(move || {
            let _ = tx.send((
                reader.proposal(&p).map(|p| p.state),
                reader.pending(1),
                reader.head_seq(),
                reader.list().len(),
            ));
        });
        let read = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the reads answered while the journal was locked");
        assert_eq!(read, (Some(State::Pending), 1, 1, 1));
        drop(appending);
    }

    #[test]
    fn a_journal_holding_an_impossible_sequence_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let (mut j, _, _) = Journal::open(d.path(), settings().segment_max_bytes).unwrap();
        let created = Event::ProposalCreated {
            proposal: "tgp-1".into(),
            owner: "o".into(),
            call: "c".into(),
            tool: "t".into(),
            principal: "p".into(),
            arguments: "a".into(),
            preview: Default::default(),
            created_ms: 0,
            decision_deadline_ms: 10,
        };
        j.append(&created.to_record().unwrap()).unwrap();
        // Consumed without an approval: no gate would have written it.
        let consumed = Event::Consumed {
            proposal: "tgp-1".into(),
            request: "c".into(),
            at_ms: 1,
        };
        j.append(&consumed.to_record().unwrap()).unwrap();
        drop(j);
        assert!(matches!(
            Gate::open(d.path(), settings()),
            Err(GateError::Inconsistent { seq: 2, .. })
        ));
    }

    #[test]
    fn a_decision_whose_sync_failed_is_never_acknowledged_and_disables_the_gate() {
        let d = tempfile::tempdir().unwrap();
        let hooks = tempfile::tempdir().unwrap();
        let g = open(d.path());
        let (p, _) = held(g.admit(&call("alice", "call-1", "deploy"), 0).unwrap());
        let (q, _) = held(g.admit(&call("alice", "call-2", "deploy"), 0).unwrap());
        let fault = hooks.path().join("fault");
        std::fs::write(&fault, crate::testhooks::JOURNAL_SYNC_APPEND).unwrap();
        lock(&g.journal).set_sync_faults(journal::SyncFaults::from_file(Some(fault.clone())));
        let records = g.checkpoint().records;
        assert!(matches!(
            g.approve(&p, "bob", "bob", 1),
            Err(GateError::Journal(JournalError::Io { .. }))
        ));
        // Not decided, and nothing else is decided from now on, even once
        // the disk works again: the record may or may not be on it.
        assert_eq!(g.proposal(&p).unwrap().state, State::Pending);
        assert_eq!(g.checkpoint().records, records);
        assert!(
            g.disabled().is_some_and(|r| r.contains("append")),
            "{:?}",
            g.disabled()
        );
        std::fs::remove_file(&fault).unwrap();
        for refused in [
            g.reject(&q, "bob", "no", 2).map(|_| ()),
            g.approve(&p, "bob", "bob", 2).map(|_| ()),
            g.cancel(&q, "alice", 2).map(|_| ()),
            g.admit(&call("alice", "call-1", "deploy"), 2).map(|_| ()),
            g.observe(&p, 2).map(|_| ()),
            g.expire_due(2).map(|_| ()),
        ] {
            assert!(
                matches!(refused, Err(GateError::Disabled { .. })),
                "{refused:?}"
            );
        }
        assert_eq!(g.checkpoint().records, records);
        drop(g);
        // Opened again: the decision never happened, and one can be taken.
        let g = open(d.path());
        assert!(g.disabled().is_none());
        assert_eq!(g.proposal(&p).unwrap().state, State::Pending);
        assert_eq!(
            g.approve(&p, "bob", "bob", 3).unwrap().state,
            State::Approved
        );
    }

    fn segment_count(dir: &std::path::Path) -> usize {
        std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| {
                super::super::journal::segment_number(
                    &e.as_ref().unwrap().file_name().to_string_lossy(),
                )
                .is_some()
            })
            .count()
    }

    #[test]
    fn settled_proposals_are_forgotten_and_only_their_segments_removed() {
        let d = tempfile::tempdir().unwrap();
        let wide = GateSettings {
            max_pending: 1000,
            max_pending_per_owner: 1000,
            ..settings()
        };
        let g = Gate::open(d.path(), wide).unwrap().0;
        // One call left waiting from the start, then many proposed and
        // cancelled (each a pair of records): several segments.
        let (waiting, _) = held(g.admit(&call("w", "kept", "t"), 0).unwrap());
        for i in 0..600 {
            let (p, _) = held(
                g.admit(&call(&format!("o{}", i % 7), &format!("k{i}"), "t"), 1)
                    .unwrap(),
            );
            g.cancel(&p, &format!("o{}", i % 7), 2).unwrap();
        }
        let segments = segment_count(d.path());
        assert!(segments >= 4, "{segments}");
        let records = g.checkpoint().records;
        // Past every deadline and the retention: the cancelled ones are
        // forgotten, but the waiting one (never journaled expired yet) holds
        // the first segment, and with it every later one.
        let late = 10 * MIN + 60 * MIN + 10;
        held(g.admit(&call("n", "new-1", "t"), late).unwrap());
        assert_eq!(g.list().len(), 2, "the waiting proposal and the new one");
        assert_eq!(segment_count(d.path()), segments);
        // Its expiry journaled and its retention passed too: everything
        // before the newest proposal goes at the next look.
        g.expire_due(late).unwrap();
        let later = late + 10 * MIN + 60 * MIN + FORGET_EVERY_MS;
        held(g.admit(&call("n", "new-2", "t"), later).unwrap());
        assert!(g.proposal(&waiting).is_none());
        let kept = segment_count(d.path());
        assert!(kept < segments, "{kept} of {segments}");
        assert!(d.path().join(super::super::journal::BASE_FILE).exists());
        let before = g.checkpoint();
        assert_eq!(before.records, records + 3);
        assert_eq!(before.segments as usize, kept);
        drop(g);
        // Reopened: the same head and sequence; the events about forgotten
        // proposals still in the kept segments are passed over.
        let (g, _) = Gate::open(d.path(), wide).unwrap();
        assert_eq!(g.checkpoint(), before);
        assert_eq!(g.head_seq(), before.records);
        let ids: Vec<String> = g.list().into_iter().map(|p| p.tool + &p.call).collect();
        assert!(
            ids.contains(&"tnew-1".to_string()) && ids.contains(&"tnew-2".to_string()),
            "{ids:?}"
        );
        assert_eq!(Journal::verify(d.path()).unwrap().0, before);
    }

    #[test]
    fn proposals_kept_are_bounded_per_owner_and_in_all() {
        let d = tempfile::tempdir().unwrap();
        let bounds = GateSettings {
            max_pending: 100,
            max_pending_per_owner: 2,
            max_proposals: 5,
            max_proposals_per_owner: 3,
            ..settings()
        };
        let g = Gate::open(d.path(), bounds).unwrap().0;
        let (a1, _) = held(g.admit(&call("alice", "a1", "t"), 0).unwrap());
        held(g.admit(&call("alice", "a2", "t"), 0).unwrap());
        let waiting = g.admit(&call("alice", "a3", "t"), 0);
        assert!(
            matches!(waiting, Err(GateError::OwnerLimit { count: 2, .. })),
            "{waiting:?}"
        );
        // Cancelling makes room to wait, but the journal still keeps the
        // cancelled proposal for its tasks: proposing and cancelling in a
        // loop stops at the owner's bound.
        g.cancel(&a1, "alice", 1).unwrap();
        let (a3, _) = held(g.admit(&call("alice", "a3", "t"), 1).unwrap());
        g.cancel(&a3, "alice", 2).unwrap();
        let kept = g.admit(&call("alice", "a4", "t"), 2);
        let message = match kept {
            Err(e @ GateError::OwnerLimit { count: 3, .. }) => e.to_string(),
            other => panic!("{other:?}"),
        };
        assert!(
            message.contains("approvals.max_proposals_per_owner"),
            "{message}"
        );
        // Others go on, up to what the journal keeps in all.
        held(g.admit(&call("bob", "b1", "t"), 3).unwrap());
        held(g.admit(&call("bob", "b2", "t"), 3).unwrap());
        assert!(matches!(
            g.admit(&call("carol", "c1", "t"), 3),
            Err(GateError::TooManyKept { limit: 5 })
        ));
        // Once the cancelled ones are past their retention they are
        // forgotten and alice may propose again.
        let late = 10 * MIN + 60 * MIN + 10;
        held(g.admit(&call("alice", "a4", "t"), late).unwrap());
        assert!(g.proposal(&a1).is_none() && g.proposal(&a3).is_none());
    }
}
