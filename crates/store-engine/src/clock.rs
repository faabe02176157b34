//! The store's source of time. Every "now" the store writes or compares
//! (creation, expiry, retention, recovery, the sweep) and the cadence of its
//! timers come from one [`Clock`], so tests can move time forward instead of
//! waiting for it.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A cheap, cloneable source of time.
#[derive(Clone, Debug)]
pub struct Clock(Source);

#[derive(Clone, Debug)]
enum Source {
    /// Wall time for records; a monotonic clock for timers, so that a wall
    /// clock step neither bursts nor stalls the sweep. `skew_ms` is 0 but
    /// when an application's test moves its wall clock ([`Clock::skewed`]).
    System { started: Instant, skew_ms: i64 },
    /// Milliseconds since the Unix epoch, moved only by [`ManualClock`].
    Manual(Arc<AtomicI64>),
}

impl Clock {
    /// The operating system's clocks.
    pub fn system() -> Clock {
        Clock::skewed(0)
    }

    /// The operating system's clocks, the wall clock read `skew_ms` later
    /// than it is (for tests of a real process that must start later
    /// without waiting).
    pub fn skewed(skew_ms: i64) -> Clock {
        Clock(Source::System {
            started: Instant::now(),
            skew_ms,
        })
    }

    /// A clock that stands still at `start_ms` (milliseconds since the Unix
    /// epoch) until its [`ManualClock`] moves it.
    pub fn manual(start_ms: i64) -> (Clock, ManualClock) {
        let now = Arc::new(AtomicI64::new(start_ms));
        (Clock(Source::Manual(now.clone())), ManualClock(now))
    }

    /// Milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> i64 {
        match &self.0 {
            Source::System { skew_ms, .. } => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0)
                .saturating_add(*skew_ms),
            Source::Manual(now) => now.load(Ordering::SeqCst),
        }
    }

    /// Time that only moves forward, for scheduling the store's timers.
    pub fn monotonic(&self) -> Duration {
        match &self.0 {
            Source::System { started, .. } => started.elapsed(),
            Source::Manual(now) => Duration::from_millis(now.load(Ordering::SeqCst).max(0) as u64),
        }
    }
}

impl Default for Clock {
    fn default() -> Clock {
        Clock::system()
    }
}

/// The hand that moves a manual [`Clock`].
#[derive(Clone, Debug)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    /// Moves the clock forward. The store's timers (the expiry sweep, the
    /// checkpoint) see it in the first turn of the store thread's loop that
    /// begins after the move: at the latest the one that takes the next
    /// command sent after it, or the turn right after that one when the
    /// command joined a batch already begun.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_millis() as i64, Ordering::SeqCst);
    }

    pub fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_advanced() {
        let (clock, hand) = Clock::manual(1_000);
        assert_eq!(clock.now_ms(), 1_000);
        let copy = clock.clone();
        hand.advance(Duration::from_millis(250));
        assert_eq!(copy.now_ms(), 1_250);
        assert_eq!(clock.monotonic(), Duration::from_millis(1_250));
    }
}
