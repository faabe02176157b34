//! The advertised poll interval, enforced per (owner, task) with a token
//! bucket: a short burst is allowed (clients poll right after creating and
//! right after a task ends), a sustained faster rate is refused before it
//! reaches the store.
//!
//! This is the one piece of task state held only in memory: losing it on a
//! restart costs a client at most one burst. It is bounded by the live-task
//! limit, and buckets that have refilled completely are the first to go.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::store::{Digest, TaskId};

/// Polls a client may make in quick succession before the advertised
/// interval is enforced.
pub const POLL_BURST: f64 = 3.0;

#[derive(Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn refilled(self, interval: Duration, now: Instant) -> Bucket {
        let earned =
            now.saturating_duration_since(self.at).as_secs_f64() / interval.as_secs_f64().max(1e-3);
        Bucket {
            tokens: (self.tokens + earned).min(POLL_BURST),
            at: now,
        }
    }
}

pub struct Polls {
    interval: Duration,
    max_tracked: usize,
    buckets: Mutex<HashMap<(Digest, TaskId), Bucket>>,
}

impl Polls {
    pub fn new(interval: Duration, max_tracked: usize) -> Polls {
        Polls {
            interval,
            max_tracked,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    fn buckets(&self) -> std::sync::MutexGuard<'_, HashMap<(Digest, TaskId), Bucket>> {
        self.buckets.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `Err(ms)`: this poll comes too soon; the client may poll again after
    /// `ms` milliseconds.
    pub fn admit(&self, owner: &Digest, id: &TaskId) -> Result<(), u64> {
        let key = (*owner, id.clone());
        if let Some(bucket) = self.buckets().get(&key) {
            let bucket = bucket.refilled(self.interval, Instant::now());
            if bucket.tokens < 1.0 {
                let wait = (1.0 - bucket.tokens) * self.interval.as_secs_f64() * 1000.0;
                return Err(wait.ceil() as u64);
            }
        }
        Ok(())
    }

    /// Records an answered poll of a task the owner may see.
    pub fn spend(&self, owner: Digest, id: TaskId) {
        let now = Instant::now();
        let mut buckets = self.buckets();
        if let Some(b) = buckets.get_mut(&(owner, id.clone())) {
            let mut next = b.refilled(self.interval, now);
            next.tokens -= 1.0;
            *b = next;
            return;
        }
        if buckets.len() >= self.max_tracked {
            // A full bucket restrains nothing: forget those.
            let full_after = self.interval.mul_f64(POLL_BURST);
            buckets.retain(|_, b| now.saturating_duration_since(b.at) < full_after);
        }
        if buckets.len() < self.max_tracked {
            buckets.insert(
                (owner, id),
                Bucket {
                    tokens: POLL_BURST - 1.0,
                    at: now,
                },
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> TaskId {
        TaskId::generate().unwrap_or_else(|e| panic!("no task id: {e}"))
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_then_one_poll_per_interval() {
        let polls = Polls::new(Duration::from_millis(1000), 16);
        let (owner, id) = (Digest::of(b"owner"), id());
        for _ in 0..POLL_BURST as usize {
            assert_eq!(polls.admit(&owner, &id), Ok(()));
            polls.spend(owner, id.clone());
        }
        assert_eq!(polls.admit(&owner, &id), Err(1000));
        tokio::time::advance(Duration::from_millis(400)).await;
        assert_eq!(polls.admit(&owner, &id), Err(600));
        tokio::time::advance(Duration::from_millis(600)).await;
        assert_eq!(polls.admit(&owner, &id), Ok(()));
        // Another owner's budget is its own.
        assert_eq!(polls.admit(&Digest::of(b"other"), &id), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn the_table_is_bounded_and_drops_full_buckets_first() {
        let polls = Polls::new(Duration::from_millis(100), 2);
        let owner = Digest::of(b"owner");
        let ids: Vec<TaskId> = (0..3).map(|_| id()).collect();
        polls.spend(owner, ids[0].clone());
        polls.spend(owner, ids[1].clone());
        // Both buckets are still refilling: the third task is not tracked.
        polls.spend(owner, ids[2].clone());
        assert_eq!(polls.buckets().len(), 2);
        tokio::time::advance(Duration::from_millis(300)).await;
        polls.spend(owner, ids[2].clone());
        assert_eq!(polls.buckets().len(), 1);
    }
}
