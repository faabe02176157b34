//! The advertised poll interval, enforced per (owner, task) without ever
//! failing a poll.
//!
//! The interval is a SHOULD for clients, and independent clients poll
//! sooner (one backs off from 20 ms). A poll that comes before its task's
//! next read is due is not refused: it is held until the read is due, and
//! then reads the store. Held polls are bounded; past that bound an early
//! poll is answered from memory with the record this owner was last given,
//! which is the last committed state read for it. Either way the store is
//! read at most about once per interval per task, however fast a client
//! polls, and no well-formed poll ever gets an error for its timing.
//!
//! This is the one piece of task state held only in memory: losing it on a
//! restart costs at most one early read per task. The table holds only
//! tasks a poll was answered for (authorised and retained when read), at
//! most `max_tracked` of them (the live-task limit); entries whose next read
//! is already due restrain nothing and are the first to go. Only a record
//! without a result (a task still working) is remembered: a finished task's
//! result can be large, a client stops polling once it has it, and keeping
//! every finished task's record cost about 2 KiB of memory per retained task
//! (19 MiB of a daemon's 52 MiB at 10,000 tasks). An early poll of a
//! finished task past the held bound reads the store.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::store::{Digest, TaskId, TaskRecord};

struct Entry {
    /// When this task may next be read for this owner.
    due: Instant,
    /// What this owner was last told, while the task has no result.
    last: Option<Arc<TaskRecord>>,
}

/// What to do with a poll.
pub enum Pace {
    /// Read the store now.
    Read,
    /// Too early: the next read is due after `wait`. `last` is what the
    /// owner was last told, for when the poll cannot be held.
    Early {
        wait: Duration,
        last: Option<Arc<TaskRecord>>,
    },
}

pub struct Polls {
    max_tracked: usize,
    max_held: usize,
    /// Held polls one owner may have: half of `max_held` (at least one),
    /// so that one owner polling early cannot take every held place.
    max_held_per_owner: usize,
    held: Arc<AtomicUsize>,
    /// Held polls by owner; an owner's entry goes with its last held poll,
    /// so this has at most `max_held` entries.
    held_by: Arc<Mutex<HashMap<Digest, usize>>>,
    entries: Mutex<HashMap<(Digest, TaskId), Entry>>,
    /// Early polls held until their read was due, since start.
    held_since_start: AtomicU64,
    /// Early polls answered from memory (no place to hold them), since
    /// start.
    remembered_since_start: AtomicU64,
}

/// One held poll; the counts go down when it is dropped.
pub struct Held {
    total: Arc<AtomicUsize>,
    by_owner: Arc<Mutex<HashMap<Digest, usize>>>,
    owner: Digest,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.total.fetch_sub(1, Ordering::SeqCst);
        let mut map = self.by_owner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get_mut(&self.owner) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(&self.owner);
            }
        }
    }
}

impl Polls {
    pub fn new(max_tracked: usize, max_held: usize) -> Polls {
        Polls {
            max_tracked,
            max_held,
            max_held_per_owner: (max_held / 2).max(1),
            held: Arc::new(AtomicUsize::new(0)),
            held_by: Arc::default(),
            entries: Mutex::new(HashMap::new()),
            held_since_start: AtomicU64::new(0),
            remembered_since_start: AtomicU64::new(0),
        }
    }

    /// Early polls held until their read was due, since start.
    pub fn held_since_start(&self) -> u64 {
        self.held_since_start.load(Ordering::Relaxed)
    }

    /// Early polls answered from memory, since start.
    pub fn remembered_since_start(&self) -> u64 {
        self.remembered_since_start.load(Ordering::Relaxed)
    }

    /// Counts an early poll answered from memory.
    pub fn answered_from_memory(&self) {
        self.remembered_since_start.fetch_add(1, Ordering::Relaxed);
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<(Digest, TaskId), Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a poll may read the store now. A poll that may reads claims
    /// the slot: a second poll of the same task at the same moment is early.
    pub fn pace(&self, owner: &Digest, id: &TaskId, interval: Duration) -> Pace {
        let now = Instant::now();
        let mut entries = self.entries();
        let Some(entry) = entries.get_mut(&(*owner, id.clone())) else {
            // Never answered (or forgotten): nothing to pace against.
            return Pace::Read;
        };
        if entry.due <= now {
            entry.due = now + interval;
            return Pace::Read;
        }
        Pace::Early {
            wait: entry.due - now,
            last: entry.last.clone(),
        }
    }

    /// A place to hold an early poll of `owner`'s, if fewer than the bound
    /// are held in all and fewer than the owner's share are its own.
    pub fn hold(&self, owner: &Digest) -> Option<Held> {
        let mut by_owner = self.held_by.lock().unwrap_or_else(|p| p.into_inner());
        let mine = by_owner.get(owner).copied().unwrap_or(0);
        if mine >= self.max_held_per_owner {
            return None;
        }
        let mut now = self.held.load(Ordering::SeqCst);
        loop {
            if now >= self.max_held {
                return None;
            }
            match self
                .held
                .compare_exchange(now, now + 1, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => break,
                Err(seen) => now = seen,
            }
        }
        by_owner.insert(*owner, mine + 1);
        self.held_since_start.fetch_add(1, Ordering::Relaxed);
        Some(Held {
            total: self.held.clone(),
            by_owner: self.held_by.clone(),
            owner: *owner,
        })
    }

    /// Records what a poll that read the store told the owner: the next read
    /// of this task is due one interval (the task's own) from now.
    pub fn answered(&self, owner: Digest, record: &TaskRecord) {
        let now = Instant::now();
        let interval = Duration::from_millis(record.poll_interval_ms.max(1) as u64);
        let last = remembered(record);
        let mut entries = self.entries();
        if let Some(entry) = entries.get_mut(&(owner, record.id.clone())) {
            entry.due = entry.due.max(now + interval);
            entry.last = last;
            return;
        }
        if entries.len() >= self.max_tracked {
            // An entry already due restrains nothing: forget those.
            entries.retain(|_, e| e.due > now);
        }
        if entries.len() < self.max_tracked {
            entries.insert(
                (owner, record.id.clone()),
                Entry {
                    due: now + interval,
                    last,
                },
            );
        }
    }

    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.entries().len()
    }
}

/// The record to keep for answering from memory: one without a result.
fn remembered(record: &TaskRecord) -> Option<Arc<TaskRecord>> {
    record.outcome.is_none().then(|| Arc::new(record.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Outcome, TaskStatus};

    fn record(interval_ms: i64) -> TaskRecord {
        TaskRecord {
            id: TaskId::generate().unwrap_or_else(|e| panic!("no task id: {e}")),
            status: TaskStatus::Working,
            status_message: None,
            created_ms: 0,
            updated_ms: 0,
            expires_ms: 60_000,
            poll_interval_ms: interval_ms,
            outcome: None,
            cancel_requested: false,
            proposal: None,
        }
    }

    fn is_read(p: Pace) -> bool {
        matches!(p, Pace::Read)
    }

    #[tokio::test(start_paused = true)]
    async fn one_read_per_interval_and_early_polls_learn_when_and_what() {
        let polls = Polls::new(16, 4);
        let owner = Digest::of(b"owner");
        let r = record(1000);
        let interval = Duration::from_millis(1000);
        assert!(is_read(polls.pace(&owner, &r.id, interval)));
        polls.answered(owner, &r);
        let Pace::Early { wait, last } = polls.pace(&owner, &r.id, interval) else {
            panic!("a second poll at once must be early");
        };
        assert_eq!(wait, interval);
        assert_eq!(last.as_deref(), Some(&r));
        tokio::time::advance(Duration::from_millis(400)).await;
        let Pace::Early { wait, .. } = polls.pace(&owner, &r.id, interval) else {
            panic!("still early");
        };
        assert_eq!(wait, Duration::from_millis(600));
        tokio::time::advance(Duration::from_millis(600)).await;
        assert!(is_read(polls.pace(&owner, &r.id, interval)));
        // That read claimed the slot: a simultaneous poll is early.
        assert!(!is_read(polls.pace(&owner, &r.id, interval)));
        // Another owner's pace is its own.
        assert!(is_read(polls.pace(&Digest::of(b"other"), &r.id, interval)));
    }

    #[tokio::test(start_paused = true)]
    async fn held_polls_are_bounded_in_all_and_per_owner() {
        let polls = Polls::new(16, 4);
        let (me, you, them) = (Digest::of(b"me"), Digest::of(b"you"), Digest::of(b"them"));
        let a = polls.hold(&me);
        let b = polls.hold(&me);
        assert!(a.is_some() && b.is_some());
        // Half of the places is one owner's share.
        assert!(polls.hold(&me).is_none());
        let c = polls.hold(&you);
        let d = polls.hold(&you);
        assert!(c.is_some() && d.is_some());
        // Every place is taken.
        assert!(polls.hold(&them).is_none());
        drop(a);
        assert!(polls.hold(&them).is_some());
        // The owner's count went down with its held poll.
        drop(b);
        assert_eq!(polls.held_by.lock().unwrap().get(&me), None);
        // Every place given was counted, and only those; answers from
        // memory are counted apart.
        assert_eq!(polls.held_since_start(), 5);
        polls.answered_from_memory();
        assert_eq!(
            (polls.held_since_start(), polls.remembered_since_start()),
            (5, 1)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_table_is_bounded_and_drops_due_entries_first() {
        let polls = Polls::new(2, 1);
        let owner = Digest::of(b"owner");
        let records: Vec<TaskRecord> = (0..3).map(|_| record(100)).collect();
        polls.answered(owner, &records[0]);
        polls.answered(owner, &records[1]);
        // Both are still pacing: the third task is not tracked.
        polls.answered(owner, &records[2]);
        assert_eq!(polls.tracked(), 2);
        tokio::time::advance(Duration::from_millis(300)).await;
        polls.answered(owner, &records[2]);
        assert_eq!(polls.tracked(), 1);
    }

    #[test]
    fn only_records_without_a_result_are_remembered() {
        let mut r = record(100);
        assert!(remembered(&r).is_some());
        r.status = TaskStatus::Completed;
        r.outcome = Some(Outcome::Result(serde_json::json!({"text": "short"})));
        assert!(remembered(&r).is_none());
        // The pacing itself goes on: the next read is still a due time.
        let polls = Polls::new(4, 2);
        let owner = Digest::of(b"owner");
        polls.answered(owner, &r);
        let interval = Duration::from_millis(100);
        assert!(matches!(
            polls.pace(&owner, &r.id, interval),
            Pace::Early { last: None, .. }
        ));
    }
}
