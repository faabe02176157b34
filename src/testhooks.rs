//! Test-only fault hooks, read from the environment.
//!
//! Debug builds always honour them; release builds only when compiled with
//! the `test-hooks` feature, which no shipped package enables. They let the
//! system tests hang the store thread (to prove the watchdog stops) and crash
//! between migration statements (to prove the migration is atomic) or in the
//! middle of spilling a result (to prove recovery cleans up), without
//! touching the code paths a real run takes.
//!
//! Owns fault hooks for tests. A stall file for the store thread, a busy file
//! that refuses every store command as if its queue were full, a hold file
//! while which no expired row is swept by the timed sweep (a route submission's
//! own bounded sweep still runs), crash points inside the migration, around an
//! artifact's rename and at each step of a route's dispatch (prepared,
//! dispatching, answered) and at each boundary of an approval (proposed,
//! decided, consumed), and an EIO on the approval journal's append or base sync
//! (`TASKGATE_TEST_JOURNAL_SYNC_FAULT_FILE`), a crash point after a route's
//! cancel attempt is counted, and a skew of the store's wall clock
//! (`TASKGATE_TEST_CLOCK_SKEW_MS`) so that a test of the real binary can start
//! a daemon later without waiting. Compiled into debug builds, and into release
//! builds only with the `test-hooks` feature.

use std::path::PathBuf;

/// While this file exists, the store thread stops taking commands.
pub const STALL_FILE_ENV: &str = "TASKGATE_TEST_STALL_FILE";
/// While this file exists, every command sent to the store is refused as
/// if its queue were full (`StoreError::Busy`), without reaching the store
/// thread.
pub const BUSY_FILE_ENV: &str = "TASKGATE_TEST_BUSY_FILE";
/// While this file exists, the store deletes no expired row (neither the
/// timed sweep nor the one a creating batch does), so a test can be sure an
/// expired row is still there when its request arrives. A route
/// submission's own bounded sweep of expired routes is not held.
pub const HOLD_SWEEP_FILE_ENV: &str = "TASKGATE_TEST_HOLD_SWEEP_FILE";
/// Names a crash point at which the process aborts (SIGABRT, no cleanup).
pub const CRASH_AT_ENV: &str = "TASKGATE_TEST_CRASH_AT";
/// While this file exists, the approval journal's syncs it names (words
/// among [`JOURNAL_SYNC_APPEND`] and [`JOURNAL_SYNC_BASE`]) fail with EIO
/// after their write, as a disk that lost what it was given would.
pub const JOURNAL_SYNC_FAULT_FILE_ENV: &str = "TASKGATE_TEST_JOURNAL_SYNC_FAULT_FILE";
/// The sync of a record appended to the approval journal.
pub const JOURNAL_SYNC_APPEND: &str = taskgate_journal::SyncPoint::Append.word();
/// The sync of `journal.base`, written before old segments are removed.
pub const JOURNAL_SYNC_BASE: &str = taskgate_journal::SyncPoint::Base.word();
/// Milliseconds added to the wall clock the store reads, so that a test of
/// the real binary can start a daemon an hour later without waiting one.
pub const CLOCK_SKEW_MS_ENV: &str = "TASKGATE_TEST_CLOCK_SKEW_MS";

/// Names a lie of the qualification worker (`runs-twice`, `exit-nonzero`,
/// `follows-symlinks`): `taskgate verify --durable-tasks` runs its
/// qualification worker with that lie, so a test can show the check that
/// must catch it fail.
pub const LYING_WORKER_ENV: &str = "TASKGATE_TEST_LYING_WORKER";

/// The crash point between the two statements of the v1 → v2 migration.
pub const CRASH_MID_MIGRATION: &str = "mid-migration";
/// After a spilled result's temporary file is written and synced, before
/// it is renamed into place.
pub const CRASH_AFTER_ARTIFACT_TEMP: &str = "artifact-temp-written";
/// After a spilled result is renamed into place, before the task's outcome
/// is committed.
pub const CRASH_AFTER_ARTIFACT_RENAME: &str = "artifact-renamed";

/// A durable route's prepared phase is committed; nothing is dispatched.
pub const CRASH_ROUTE_PREPARED: &str = "route-prepared";
/// Its dispatching phase (session) is committed; nothing is sent yet.
pub const CRASH_ROUTE_DISPATCHING: &str = "route-dispatching";
/// The upstream answered the submission; nothing of it is committed.
pub const CRASH_ROUTE_ANSWERED: &str = "route-answered";
/// A cancel attempt of a durable route is counted; it is not sent yet.
pub const CRASH_ROUTE_CANCEL_COUNTED: &str = "route-cancel-counted";
/// A held call's proposal is journaled; its approval task is not committed.
pub const CRASH_APPROVAL_PROPOSED: &str = "approval-proposed";
/// An approval task's decision was read from the journal; its projection
/// is not committed.
pub const CRASH_APPROVAL_DECIDED: &str = "approval-decided";
/// An approval was journaled as spent on a call; the tool has not started.
pub const CRASH_APPROVAL_CONSUMED: &str = "approval-consumed";

pub const fn compiled_in() -> bool {
    cfg!(any(debug_assertions, feature = "test-hooks"))
}

/// The stall file named in the environment, when hooks are compiled in.
pub fn stall_file() -> Option<PathBuf> {
    if !compiled_in() {
        return None;
    }
    std::env::var_os(STALL_FILE_ENV).map(PathBuf::from)
}

/// The busy file named in the environment, when hooks are compiled in.
pub fn busy_file() -> Option<PathBuf> {
    if !compiled_in() {
        return None;
    }
    std::env::var_os(BUSY_FILE_ENV).map(PathBuf::from)
}

/// The sweep-hold file named in the environment, when hooks are compiled in.
pub fn hold_sweep_file() -> Option<PathBuf> {
    if !compiled_in() {
        return None;
    }
    std::env::var_os(HOLD_SWEEP_FILE_ENV).map(PathBuf::from)
}

/// The journal's sync-fault file named in the environment, when hooks are
/// compiled in.
pub fn journal_sync_fault_file() -> Option<PathBuf> {
    if !compiled_in() {
        return None;
    }
    std::env::var_os(JOURNAL_SYNC_FAULT_FILE_ENV).map(PathBuf::from)
}

/// The wall-clock skew the environment asks for, when hooks are compiled
/// in (0 otherwise, or when it is not a number).
pub fn clock_skew_ms() -> i64 {
    if !compiled_in() {
        return 0;
    }
    std::env::var(CLOCK_SKEW_MS_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The lie the environment asks the qualification worker to tell, when
/// hooks are compiled in.
pub fn lying_worker() -> Option<String> {
    if !compiled_in() {
        return None;
    }
    std::env::var(LYING_WORKER_ENV)
        .ok()
        .filter(|lie| !lie.is_empty())
}

/// Aborts the process when the environment names this crash point.
pub fn crash_point(name: &str) {
    if compiled_in() && std::env::var(CRASH_AT_ENV).is_ok_and(|v| v == name) {
        eprintln!("taskgate: test hook: aborting at crash point {name}");
        std::process::abort();
    }
}
