//! The serving process's chores: STATUS= (one board every status goes
//! through), the watchdog, the artifact sweep, and giving memory back once
//! legacy sessions closed.

use std::sync::Arc;
use std::time::Duration;

use sd_notify::NotifyState;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{lock, notify};
use crate::http::BoundedSessions;
use crate::store::{Store, StoreError};
use crate::tasks::TaskService;

/// How often STATUS= is refreshed with current counts.
const STATUS_REFRESH: Duration = Duration::from_secs(10);
/// How often spilled artifacts of expired tasks are looked for.
const ARTIFACT_SWEEP_INTERVAL: Duration = Duration::from_secs(60);
/// Artifacts examined per sweep.
const ARTIFACT_SWEEP_BATCH: usize = 256;
/// How often (at most) the count of legacy sessions is looked at, to give
/// memory back after sessions closed; more often when they expire sooner.
pub(super) const MEMORY_CHORE_INTERVAL: Duration = Duration::from_secs(10);

/// Ticks every `period`, the first one `period` from now; a late tick
/// delays the next rather than bursting to catch up.
async fn ticker(period: Duration) -> tokio::time::Interval {
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    ticks
}

pub(super) async fn status_line(svc: &TaskService, store: &Store, where_: &str) -> String {
    // Calls that wanted a task and ran synchronously: said only when any did.
    let fallbacks = match svc.fallbacks() {
        f if f.total() == 0 => String::new(),
        f => format!("; {f}"),
    };
    if let Some(reason) = store.disabled_reason() {
        return format!(
            "DEGRADED: task store disabled until restart ({reason}); {where_}{fallbacks}"
        );
    }
    match store.stats().await {
        Ok(s) => format!(
            "{where_}; tasks retained {}, unexpired {}, running {}{fallbacks}",
            s.retained,
            s.unexpired,
            svc.running_count()
        ),
        Err(e) => format!("{where_}; task counts unavailable: {e}{fallbacks}"),
    }
}

pub(super) async fn refresh_status(
    svc: Arc<TaskService>,
    store: Store,
    board: Arc<StatusBoard>,
    describe: Arc<dyn Fn() -> String + Send + Sync>,
    stop: CancellationToken,
) {
    let mut ticks = ticker(STATUS_REFRESH).await;
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            // A fallback shows at once, not at the next tick.
            _ = svc.fallback_noted() => {}
            // So do the counts again once the watchdog's notice is over.
            _ = board.resumed.notified() => {}
            _ = stop.cancelled() => return,
        }
        let generation = board.generation();
        let line = status_line(&svc, &store, &describe()).await;
        board.publish(&line, generation);
    }
}

/// The one sender of STATUS= while serving. The refresh chore's counts and
/// the watchdog's notice both go through it, so that counts (built while
/// the store still answered, or saying it was too busy to count) never
/// replace the notice that pings are being withheld, and nothing replaces
/// STATUS=stopping.
#[derive(Default)]
pub(super) struct StatusBoard {
    state: std::sync::Mutex<BoardState>,
    /// Wakes the refresh chore when pings resume.
    resumed: Notify,
}

#[derive(Default)]
struct BoardState {
    /// The last STATUS= sent.
    last: String,
    /// The watchdog withholds its pings: its notice is the status.
    withheld: bool,
    /// Counts every start and end of a withheld stretch: a line built
    /// across one is stale.
    generation: u64,
    /// STOPPING=1 went out.
    stopping: bool,
}

impl StatusBoard {
    pub(super) fn generation(&self) -> u64 {
        lock(&self.state).generation
    }

    /// READY=1 with `status`, or alone while the watchdog's notice stands.
    pub(super) fn ready(&self, status: &str) {
        let mut state = lock(&self.state);
        if state.withheld || state.stopping {
            notify(&[NotifyState::Ready]);
        } else {
            notify(&[NotifyState::Ready, NotifyState::Status(status)]);
            state.last = status.to_string();
        }
    }

    /// A refreshed status line, built after `generation` was read.
    pub(super) fn publish(&self, line: &str, generation: u64) {
        let mut state = lock(&self.state);
        if state.withheld || state.stopping || state.generation != generation {
            return;
        }
        if state.last != line {
            notify(&[NotifyState::Status(line)]);
            state.last = line.to_string();
        }
    }

    /// The watchdog withheld a ping: `notice` is the status, sent for every
    /// ping withheld (it says for how long the store has been silent).
    pub(super) fn withhold(&self, notice: &str) {
        let mut state = lock(&self.state);
        if state.stopping {
            return;
        }
        if !state.withheld {
            state.withheld = true;
            state.generation += 1;
        }
        notify(&[NotifyState::Status(notice)]);
        state.last = notice.to_string();
    }

    /// Pings go out again: the refresh chore puts the counts back. True
    /// when pings had been withheld.
    pub(super) fn resume(&self) -> bool {
        let mut state = lock(&self.state);
        if !state.withheld {
            return false;
        }
        state.withheld = false;
        state.generation += 1;
        self.resumed.notify_one();
        true
    }

    pub(super) fn stopping(&self) {
        let mut state = lock(&self.state);
        state.stopping = true;
        notify(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
        state.last = "stopping".to_string();
    }
}

pub(super) async fn sweep_artifacts(svc: Arc<TaskService>, stop: CancellationToken) {
    let mut ticks = ticker(ARTIFACT_SWEEP_INTERVAL).await;
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stop.cancelled() => return,
        }
        svc.sweep_artifacts(ARTIFACT_SWEEP_BATCH).await;
    }
}

/// Gives memory back to the system once legacy sessions have closed.
///
/// glibc keeps what its per-thread arenas freed for reuse, so a burst of
/// sessions (up to `server.max_sessions`, tens of KiB each) would otherwise
/// keep the process at its peak size long after they expired. When fewer
/// sessions are open than at their peak since the last look, the free
/// memory is returned with `malloc_trim`.
pub(super) async fn return_memory_after_sessions(
    sessions: Arc<BoundedSessions>,
    every: Duration,
    stop: CancellationToken,
) {
    let mut ticks = ticker(every).await;
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stop.cancelled() => return,
        }
        let (peak, open) = sessions.take_peak().await;
        if open < peak {
            return_freed_memory();
            tracing::debug!(peak, open, "legacy sessions closed; free memory returned");
        }
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn return_freed_memory() {
    // SAFETY: malloc_trim takes no pointers; it only walks glibc's own free
    // lists, under the allocator's locks, and is safe from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn return_freed_memory() {}

/// Pings the watchdog at half its period, but only while the store thread
/// answers: a hung store thread lets systemd restart the daemon. Each ping
/// withheld replaces STATUS= with a notice saying so (`systemctl status`
/// then shows why the watchdog will fire); the counts come back with the
/// first ping after it.
pub(super) async fn watchdog(
    store: Store,
    board: Arc<StatusBoard>,
    describe: Arc<dyn Fn() -> String + Send + Sync>,
    period: Duration,
    stop: CancellationToken,
) {
    let interval = period / 2;
    let mut ticks = ticker(interval).await;
    let mut last_progress = store.progress();
    let mut answered = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stop.cancelled() => return,
        }
        let alive = match tokio::time::timeout(interval, store.ping()).await {
            Ok(Ok(())) => true,
            // A full queue is busy, not hung, if the thread moved since.
            Ok(Err(StoreError::Busy { .. })) => store.progress() != last_progress,
            _ => false,
        };
        last_progress = store.progress();
        if alive {
            let silent = answered.elapsed();
            answered = tokio::time::Instant::now();
            notify(&[NotifyState::Watchdog]);
            if board.resume() {
                tracing::warn!(
                    silent_ms = silent.as_millis() as u64,
                    "the store thread answers again after {:.1} s; watchdog pings resumed",
                    silent.as_secs_f64()
                );
            }
        } else {
            let silent = answered.elapsed();
            tracing::error!(
                silent_ms = silent.as_millis() as u64,
                "the store thread has not answered for {:.1} s; withholding the watchdog ping",
                silent.as_secs_f64()
            );
            board.withhold(&withheld_notice(silent, &describe()));
        }
    }
}

/// The STATUS= line while the watchdog withholds its pings.
fn withheld_notice(silent: Duration, where_: &str) -> String {
    format!(
        "WATCHDOG WITHHELD: the task store has not answered for {:.1} s, so no watchdog ping is sent and systemd restarts taskgate once WatchdogSec passes without one; check the disk holding the state directory (a hung or failing disk stalls the store) and the journal; {where_}",
        silent.as_secs_f64()
    )
}
