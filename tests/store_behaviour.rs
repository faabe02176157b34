//! The store's contract, exercised in-process on real SQLite files: the
//! bounded queue, expiry, the live-task limit, creation references, the
//! once-only terminal transition, cancel intent and restart recovery.
//!
//! Time-dependent tests run the store on a manual clock and move it forward
//! instead of waiting: the store's timers (the once-a-second sweep) run on
//! that clock too, at the latest after the batch of the next command.
//!
//! Invariant 5 of the map: Unknown, expired and another owner's task IDs give
//! the same answer. Guarded by:
//! `tests/store_behaviour.rs::unknown_expired_and_foreign_ids_look_the_same`;
//! on the wire, byte for byte:
//! `tests/mcp_transports.rs::{http,stdio}_foreign_expired_and_unknown_ids_get_identical_errors`
//! (the expired task is held from the sweep and read back as a row after the
//! daemon stops, so it was expired, not gone, when asked for); across tenants
//! with real tokens (get, cancel, update, `artifact_read`):
//! `tests/auth_http.rs::another_tenants_task_reads_exactly_like_an_unknown_one`
//!
//! What this file proves: queue, expiry and retention by the manual clock (a
//! sweep skipping tables with nothing due never hides an expired row, also
//! after a restart), a run's outcome sharing the next creation's commit,
//! limits, references, once-only completion, cancel intent, recovery, an
//! opening given up before recovery, spans into the store thread

mod common;

use std::time::Duration;

use common::*;
use taskgate::store::{
    CapacityKind, Clock, Created, Digest, ManualClock, NewTask, Outcome, SWEEP_BATCH,
    SWEEP_INTERVAL, Store, StoreError, StoreOptions, TERMINAL_RETENTION_MS, TaskStatus,
};

/// Where manual clocks start: 2026-01-01T00:00:00Z.
const EPOCH_MS: i64 = 1_767_225_600_000;

fn open_with(dir: &std::path::Path, f: impl FnOnce(&mut StoreOptions)) -> Store {
    let mut o = StoreOptions::new(dir.join("tasks.db"));
    f(&mut o);
    Store::open(o).unwrap().0
}

/// A store on a manual clock, and the hand that moves it.
fn open_manual(dir: &std::path::Path, f: impl FnOnce(&mut StoreOptions)) -> (Store, ManualClock) {
    let (clock, hand) = Clock::manual(EPOCH_MS);
    let store = open_with(dir, |o| {
        o.clock = clock;
        f(o);
    });
    (store, hand)
}

/// Creates a task for the test owner and returns its record.
async fn created(store: &Store, ttl_ms: i64) -> taskgate::store::TaskRecord {
    store
        .create(new_task(ttl_ms))
        .await
        .unwrap()
        .record()
        .clone()
}

/// A task's status as the file says, read beside the store.
fn status_on_disk(dir: &std::path::Path, id: &taskgate::store::TaskId) -> String {
    rusqlite::Connection::open_with_flags(
        dir.join("tasks.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap()
    .query_row(
        "SELECT status FROM tasks WHERE id = ?1",
        [id.as_str()],
        |r| r.get(0),
    )
    .unwrap()
}

fn physical_rows(dir: &std::path::Path) -> i64 {
    let c = rusqlite::Connection::open_with_flags(
        dir.join("tasks.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    c.query_row("SELECT count(*) FROM tasks", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn a_full_queue_is_refused_at_once_and_queued_commits_survive_their_callers() {
    let root = private_dir();
    let dir = state_dir(root.path());
    let stall = root.path().join("stall");
    std::fs::write(&stall, "").unwrap();
    let rt = runtime();
    rt.block_on(async {
        let store = open_with(&dir, |o| {
            o.settings.queue_depth = 8;
            o.stall_file = Some(stall.clone());
        });
        // The store thread is stalled: 8 commands fit, the rest are refused.
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..20 {
            let s = store.clone();
            set.spawn(async move { s.create(new_task(60_000)).await });
        }
        let mut busy = 0;
        // Busy answers arrive while the thread is still stalled: nobody
        // waited for queue space.
        while busy < 12 {
            match tokio::time::timeout(Duration::from_secs(10), set.join_next()).await {
                Ok(Some(Ok(Err(StoreError::Busy { depth: 8 })))) => busy += 1,
                other => panic!("expected an immediate Busy, got {other:?}"),
            }
        }
        assert!(stall.exists());
        assert_eq!(
            set.len(),
            8,
            "eight admitted callers still wait for their commit"
        );

        // Callers that go away do not stop or poison their queued commits.
        set.abort_all();
        while set.join_next().await.is_some() {}
        std::fs::remove_file(&stall).unwrap();
        // The queue drains once the thread resumes.
        let created = loop {
            match store.create(new_task(60_000)).await {
                Err(StoreError::Busy { .. }) => tokio::time::sleep(Duration::from_millis(10)).await,
                other => break other.unwrap(),
            }
        };
        assert!(matches!(created, Created::New(_)));
        let stats = store.stats().await.unwrap();
        assert_eq!(stats.retained, 9, "8 abandoned + 1 new, all committed");
        assert!(store.disabled_reason().is_none());
        store.shutdown().await.unwrap();
    });
}

#[test]
fn concurrent_creations_are_all_committed_and_readable() {
    let root = private_dir();
    let dir = state_dir(root.path());
    let rt = runtime();
    rt.block_on(async {
        let store = open_with(&dir, |_| {});
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..64 {
            let s = store.clone();
            set.spawn(async move {
                let mut ids = Vec::new();
                for _ in 0..10 {
                    ids.push(
                        s.create(new_task(60_000))
                            .await
                            .unwrap()
                            .record()
                            .id
                            .clone(),
                    );
                }
                ids
            });
        }
        let mut all = Vec::new();
        while let Some(r) = set.join_next().await {
            all.extend(r.unwrap());
        }
        assert_eq!(all.len(), 640);
        for id in &all {
            assert!(store.get(id, &owner()).await.unwrap().is_some());
        }
        store.shutdown().await.unwrap();
    });
    assert_eq!(physical_rows(&dir), 640);
}

#[test]
fn expired_tasks_are_invisible_before_the_sweep() {
    let root = private_dir();
    let dir = state_dir(root.path());
    let rt = runtime();
    rt.block_on(async {
        let (store, clock) = open_manual(&dir, |_| {});
        let t = created(&store, 200).await;
        assert!(store.get(&t.id, &owner()).await.unwrap().is_some());
        clock.advance(Duration::from_millis(199));
        assert!(store.get(&t.id, &owner()).await.unwrap().is_some());
        clock.advance(Duration::from_millis(1));
        // Expired at its expiry time: no longer visible, no longer live,
        // but still in the file, since no sweep has run (the timer's
        // second has not passed).
        assert_eq!(store.get(&t.id, &owner()).await.unwrap(), None);
        let stats = store.stats().await.unwrap();
        assert_eq!(stats.unexpired, 0);
        assert_eq!(stats.retained, 1);
        assert_eq!(physical_rows(&dir), 1);
        assert_eq!(store.sweep_now().await.unwrap(), 1);
        assert_eq!(store.stats().await.unwrap().retained, 0);
        assert_eq!(physical_rows(&dir), 0);
        store.shutdown().await.unwrap();
    });
}

#[test]
fn a_sweep_deletes_at_most_128_rows_and_the_timer_clears_the_rest() {
    let root = private_dir();
    let dir = state_dir(root.path());
    let rt = runtime();
    rt.block_on(async {
        let (store, clock) = open_manual(&dir, |_| {});
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..30 {
            let s = store.clone();
            set.spawn(async move {
                for _ in 0..20 {
                    s.create(new_task(500)).await.unwrap();
                }
            });
        }
        while set.join_next().await.is_some() {}
        // Past their expiry, short of the sweep timer's first beat.
        clock.advance(Duration::from_millis(600));
        let before = store.stats().await.unwrap();
        assert_eq!(before.unexpired, 0, "expired rows do not count as live");
        assert_eq!(before.retained, 600, "no sweep has run yet");
        let swept = store.sweep_now().await.unwrap();
        assert_eq!(
            swept, SWEEP_BATCH as u64,
            "one sweep deletes exactly its bound"
        );
        let mut left = store.stats().await.unwrap().retained;
        assert_eq!(left, 600 - 128);
        // The timer deletes the rest, one batch per beat.
        while left > 0 {
            clock.advance(SWEEP_INTERVAL);
            // The store runs its timers once it sees the new time: at the
            // latest right after the batch this ping arrives in, so the
            // stats command sent after the answer sees the sweep.
            store.ping().await.unwrap();
            let now = store.stats().await.unwrap().retained;
            assert_eq!(now, left.saturating_sub(128), "one sweep per beat");
            left = now;
        }
        store.shutdown().await.unwrap();
    });
    assert_eq!(physical_rows(&dir), 0);
}

/// A sweep skips a table with nothing due (the store keeps a lower bound
/// on its earliest expiry), but that bound never hides an expired row: a
/// short-lived task created after a long-lived one is swept as soon as it
/// expires, by the timer's sweep and by the one riding in a creation's
/// batch, and after a restart the bound is read from the file.
#[test]
fn a_task_expiring_before_every_other_is_still_swept_on_time() {
    let root = private_dir();
    let dir = state_dir(root.path());
    let rt = runtime();
    rt.block_on(async {
        let (store, clock) = open_manual(&dir, |_| {});
        created(&store, 3_600_000).await;
        assert_eq!(store.sweep_now().await.unwrap(), 0);
        created(&store, 100).await;
        clock.advance(Duration::from_millis(99));
        assert_eq!(store.sweep_now().await.unwrap(), 0);
        clock.advance(Duration::from_millis(1));
        assert_eq!(store.sweep_now().await.unwrap(), 1, "the 100 ms task");
        assert_eq!(physical_rows(&dir), 1);

        created(&store, 50).await;
        clock.advance(Duration::from_millis(50));
        // The creation's batch sweeps first.
        created(&store, 60_000).await;
        assert_eq!(physical_rows(&dir), 2, "the 50 ms task went with it");
        store.shutdown().await.unwrap();
    });
    rt.block_on(async {
        let (store, clock) = open_manual(&dir, |_| {});
        // Restart recovery ended both tasks (interrupted), which keeps them
        // a while longer: the earliest expiry is the file's. The clock
        // starts over at the same epoch.
        let (earliest, at_earliest): (i64, i64) = rusqlite::Connection::open_with_flags(
            dir.join("tasks.db"),
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .unwrap()
        .query_row(
            "SELECT expires_ms, count(*) FROM tasks
             WHERE expires_ms = (SELECT min(expires_ms) FROM tasks)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
        clock.advance(Duration::from_millis((earliest - EPOCH_MS - 1) as u64));
        assert_eq!(store.sweep_now().await.unwrap(), 0);
        clock.advance(Duration::from_millis(1));
        assert_eq!(
            store.sweep_now().await.unwrap(),
            at_earliest as u64,
            "the earliest tasks"
        );
        assert_eq!(physical_rows(&dir), 2 - at_earliest);
        store.shutdown().await.unwrap();
    });
}

/// A run's outcome, which no client waits on, waits for company: the
/// creation that comes after it shares its commit, so a client creating
/// tasks one after another pays one commit per task, not two. The wait is
/// lengthened here so that it is certain; a creation never waits for it,
/// and an outcome alone is committed all the same once it ends.
#[test]
fn a_runs_outcome_waits_for_the_next_creation_and_shares_its_commit() {
    let root = private_dir();
    let dir = state_dir(root.path());
    let rt = runtime();
    rt.block_on(async {
        let (store, _clock) = open_manual(&dir, |o| o.outcome_linger = Duration::from_secs(600));
        let first = created(&store, 60_000).await;
        let outcome = Some(Outcome::Result(serde_json::json!({"content": []})));
        let mut finishing = Box::pin(store.finish_run(&first.id, TaskStatus::Completed, outcome));
        // Polled once, the outcome is queued (its answer is awaited below).
        std::future::poll_fn(|cx| {
            assert!(finishing.as_mut().poll(cx).is_pending());
            std::task::Poll::Ready(())
        })
        .await;
        // The store thread has taken it and waits with it: not answered,
        // not on disk.
        while store.queued() > 0 {
            tokio::task::yield_now().await;
        }
        assert!(
            tokio::time::timeout(Duration::from_millis(100), finishing.as_mut())
                .await
                .is_err(),
            "the outcome was committed alone"
        );
        assert_eq!(status_on_disk(&dir, &first.id), "working");
        let batches = store.progress();
        let started = std::time::Instant::now();
        let second = created(&store, 60_000).await;
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the creation did not wait out the outcome's linger"
        );
        let finished = finishing.await.unwrap().unwrap();
        assert_eq!(finished.status, TaskStatus::Completed);
        assert!(store.progress() <= batches + 1, "one batch for both");
        assert_eq!(status_on_disk(&dir, &first.id), "completed");
        assert!(store.get(&second.id, &owner()).await.unwrap().is_some());
        store.shutdown().await.unwrap();
    });
    rt.block_on(async {
        // At its default length, an outcome with no creation after it is
        // committed alone.
        let (store, _clock) = open_manual(&dir, |_| {});
        let t = created(&store, 60_000).await;
        let done = store
            .finish_run(
                &t.id,
                TaskStatus::Completed,
                Some(Outcome::Result(serde_json::json!({"content": []}))),
            )
            .await
            .unwrap()
            .unwrap();
        assert_eq!(done.status, TaskStatus::Completed);
        store.shutdown().await.unwrap();
    });
}

#[test]
fn the_live_limit_refuses_creation_until_tasks_expire() {
    let root = private_dir();
    let dir = state_dir(root.path());
    let rt = runtime();
    rt.block_on(async {
        let (store, clock) = open_manual(&dir, |o| o.settings.max_live_tasks = 10);
        for _ in 0..10 {
            store.create(new_task(800)).await.unwrap();
        }
        let refused = store.create(new_task(800)).await.unwrap_err();
        assert_eq!(
            refused,
            StoreError::Capacity(CapacityKind::LiveTasks { limit: 10 })
        );
        clock.advance(Duration::from_millis(799));
        assert_eq!(
            store.create(new_task(800)).await.unwrap_err(),
            StoreError::Capacity(CapacityKind::LiveTasks { limit: 10 })
        );
        clock.advance(Duration::from_millis(1));
        // Expired rows awaiting cleanup do not hold capacity.
        store.create(new_task(60_000)).await.unwrap();
        store.shutdown().await.unwrap();
    });
}

/// `store.max_live_tasks_per_owner`: an owner at its bound is refused
/// (naming it), any other owner goes on, and the owner gets room back as
/// its tasks expire; finished tasks count until then.
#[test]
fn the_per_owner_live_limit_refuses_only_that_owner_until_its_tasks_expire() {
    let root = private_dir();
    let dir = state_dir(root.path());
    let rt = runtime();
    rt.block_on(async {
        let (store, clock) = open_manual(&dir, |o| o.settings.max_live_tasks_per_owner = 3);
        let of = |who: &[u8], ttl| NewTask {
            proposal: None,
            owner: Digest::of(who),
            ..new_task(ttl)
        };
        let mut first = None;
        for _ in 0..3 {
            let Created::New(t) = store.create(of(b"alice", 800)).await.unwrap() else {
                panic!("a new task")
            };
            first.get_or_insert(t.id);
        }
        // Finished, it still holds its place until it expires.
        let first = first.unwrap();
        store
            .finish(
                &first,
                TaskStatus::Completed,
                Some(Outcome::Result(serde_json::json!({"content": []}))),
            )
            .await
            .unwrap()
            .unwrap();
        let refused = store.create(of(b"alice", 800)).await.unwrap_err();
        assert_eq!(
            refused,
            StoreError::Capacity(CapacityKind::OwnerTasks { limit: 3 })
        );
        assert!(
            refused
                .to_string()
                .contains("store.max_live_tasks_per_owner"),
            "{refused}"
        );
        for _ in 0..3 {
            store.create(of(b"bob", 800)).await.unwrap();
        }
        clock.advance(Duration::from_millis(799));
        assert_eq!(
            store.create(of(b"alice", 800)).await.unwrap_err(),
            StoreError::Capacity(CapacityKind::OwnerTasks { limit: 3 })
        );
        clock.advance(Duration::from_millis(1));
        store.create(of(b"alice", 60_000)).await.unwrap();
        store.shutdown().await.unwrap();
    });
}

#[test]
fn lowering_the_limit_keeps_existing_records_readable() {
    let root = private_dir();
    let dir = state_dir(root.path());
    let rt = runtime();
    rt.block_on(async {
        let store = open_with(&dir, |_| {});
        let mut ids = Vec::new();
        for _ in 0..20 {
            ids.push(created(&store, 60_000).await.id);
        }
        store.shutdown().await.unwrap();

        let store = open_with(&dir, |o| o.settings.max_live_tasks = 5);
        for id in &ids {
            let t = store.get(id, &owner()).await.unwrap().unwrap();
            // Restart recovery failed the working tasks; still readable.
            assert_eq!(t.status, TaskStatus::Failed);
        }
        assert_eq!(
            store.create(new_task(60_000)).await.unwrap_err(),
            StoreError::Capacity(CapacityKind::LiveTasks { limit: 5 })
        );
        store.shutdown().await.unwrap();
    });
}

#[test]
fn creation_references_deduplicate_per_owner_and_conflict_on_other_requests() {
    let root = private_dir();
    let dir = state_dir(root.path());
    let rt = runtime();
    rt.block_on(async {
        let (store, clock) = open_manual(&dir, |_| {});
        let with = |owner: &[u8], reference: &[u8], request: &[u8], ttl| NewTask {
            proposal: None,
            owner: Digest::of(owner),
            reference: Some(Digest::of(reference)),
            request: Some(Digest::of(request)),
            ..new_task(ttl)
        };
        let first = store
            .create(with(b"a", b"op-1", b"req", 60_000))
            .await
            .unwrap();
        let Created::New(first) = first else { panic!() };
        let again = store
            .create(with(b"a", b"op-1", b"req", 60_000))
            .await
            .unwrap();
        assert_eq!(again, Created::Existing(first.clone()));
        assert_eq!(
            store
                .create(with(b"a", b"op-1", b"other", 60_000))
                .await
                .unwrap_err(),
            StoreError::Conflict
        );
        let other_owner = store
            .create(with(b"b", b"op-1", b"req", 60_000))
            .await
            .unwrap();
        assert!(matches!(other_owner, Created::New(ref r) if r.id != first.id));

        // An expired task releases its reference.
        let short = store
            .create(with(b"a", b"op-2", b"req", 150))
            .await
            .unwrap();
        clock.advance(Duration::from_millis(150));
        let fresh = store
            .create(with(b"a", b"op-2", b"other", 60_000))
            .await
            .unwrap();
        assert!(matches!(fresh, Created::New(ref r) if r.id != short.record().id));
        store.shutdown().await.unwrap();
    });
}

#[test]
fn the_terminal_transition_happens_once_and_extends_retention() {
    let root = private_dir();
    let dir = state_dir(root.path());
    let rt = runtime();
    rt.block_on(async {
        let (store, clock) = open_manual(&dir, |_| {});
        let t = created(&store, 5_000).await;
        clock.advance(Duration::from_millis(1_000));
        let result = Outcome::Result(serde_json::json!({"content": []}));
        let done = store
            .finish(&t.id, TaskStatus::Completed, Some(result.clone()))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(done.status, TaskStatus::Completed);
        assert_eq!(done.updated_ms, EPOCH_MS + 1_000);
        assert_eq!(
            done.expires_ms,
            done.updated_ms + TERMINAL_RETENTION_MS,
            "kept an hour after completion"
        );
        assert_eq!(done.ttl_ms(), done.expires_ms - done.created_ms);
        // A later cancel or failure does not replace the first outcome.
        let late = store
            .finish(&t.id, TaskStatus::Cancelled, None)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(late.status, TaskStatus::Completed);
        assert_eq!(late.outcome, Some(result));

        // Past its original expiry it is still readable, until the hour
        // after completion has passed.
        clock.advance(Duration::from_millis(5_000));
        assert!(store.get(&t.id, &owner()).await.unwrap().is_some());
        clock.advance(Duration::from_millis(TERMINAL_RETENTION_MS as u64 - 5_001));
        assert!(store.get(&t.id, &owner()).await.unwrap().is_some());
        clock.advance(Duration::from_millis(1));
        assert_eq!(store.get(&t.id, &owner()).await.unwrap(), None);

        let big = Outcome::Result(serde_json::json!("z".repeat(17 * 1024)));
        let t2 = created(&store, 60_000).await;
        assert!(matches!(
            store.finish(&t2.id, TaskStatus::Completed, Some(big)).await,
            Err(StoreError::PayloadTooLarge { .. })
        ));
        store.shutdown().await.unwrap();
    });
}

#[test]
fn cancel_intent_is_owner_scoped_and_ignores_terminal_tasks() {
    let root = private_dir();
    let dir = state_dir(root.path());
    let rt = runtime();
    rt.block_on(async {
        let store = open_with(&dir, |_| {});
        let t = created(&store, 60_000).await;
        assert_eq!(
            store
                .request_cancel(&t.id, &Digest::of(b"stranger"))
                .await
                .unwrap(),
            None
        );
        let marked = store
            .request_cancel(&t.id, &owner())
            .await
            .unwrap()
            .unwrap();
        assert!(marked.cancel_requested);
        assert_eq!(marked.status, TaskStatus::Working);

        let done = created(&store, 60_000).await;
        store
            .finish(&done.id, TaskStatus::Failed, Some(Outcome::interrupted()))
            .await
            .unwrap();
        let after = store
            .request_cancel(&done.id, &owner())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(after.status, TaskStatus::Failed);
        assert!(!after.cancel_requested);
        store.shutdown().await.unwrap();
    });
}

#[test]
fn unknown_expired_and_foreign_ids_look_the_same() {
    let root = private_dir();
    let dir = state_dir(root.path());
    let rt = runtime();
    rt.block_on(async {
        let (store, clock) = open_manual(&dir, |_| {});
        let mine = created(&store, 60_000).await.id;
        let expiring = created(&store, 100).await.id;
        clock.advance(Duration::from_millis(100));
        let unknown = taskgate::store::TaskId::generate().unwrap();
        let foreign = store.get(&mine, &Digest::of(b"stranger")).await;
        let expired = store.get(&expiring, &owner()).await;
        let missing = store.get(&unknown, &owner()).await;
        assert_eq!(foreign, Ok(None));
        assert_eq!(expired, Ok(None));
        assert_eq!(missing, Ok(None));
        store.shutdown().await.unwrap();
    });
}

#[test]
fn restart_fails_running_tasks_and_keeps_finished_ones() {
    let root = private_dir();
    let dir = state_dir(root.path());
    let rt = runtime();
    rt.block_on(async {
        let store = open_with(&dir, |_| {});
        let running = created(&store, 60_000).await;
        let finished = created(&store, 60_000).await;
        let result =
            Outcome::Result(serde_json::json!({"content": [{"type": "text", "text": "done"}]}));
        store
            .finish(&finished.id, TaskStatus::Completed, Some(result.clone()))
            .await
            .unwrap();
        store.shutdown().await.unwrap();

        let (store, report) = Store::open(StoreOptions::new(dir.join("tasks.db"))).unwrap();
        assert_eq!(report.recovered, 1);
        let r = store.get(&running.id, &owner()).await.unwrap().unwrap();
        assert_eq!(r.status, TaskStatus::Failed);
        assert_eq!(r.outcome, Some(Outcome::interrupted()));
        assert!(r.expires_ms >= r.updated_ms + 3_600_000);
        let f = store.get(&finished.id, &owner()).await.unwrap().unwrap();
        assert_eq!(f.outcome, Some(result));
        let ck = store.checkpoint_now().await.unwrap();
        assert!(!ck.busy);
        store.shutdown().await.unwrap();
    });
}

#[test]
fn a_committed_cancel_ends_cancelled_after_a_restart() {
    let root = private_dir();
    let dir = state_dir(root.path());
    let rt = runtime();
    rt.block_on(async {
        let (store, clock) = open_manual(&dir, |_| {});
        let cancelled = created(&store, 60_000).await;
        let running = created(&store, 60_000).await;
        let marked = store
            .request_cancel(&cancelled.id, &owner())
            .await
            .unwrap()
            .unwrap();
        assert!(marked.cancel_requested);
        // The process stops before the tool ends: nothing finishes either
        // task, so both rows are still working when the store next opens.
        store.shutdown().await.unwrap();

        clock.advance(Duration::from_millis(10_000));
        let (clock2, _) = Clock::manual(clock.now_ms());
        let (store, report) = Store::open(StoreOptions {
            clock: clock2,
            ..StoreOptions::new(dir.join("tasks.db"))
        })
        .unwrap();
        assert_eq!(report.recovered, 2);
        assert_eq!(report.cancelled, 1);
        let mut ids = report.recovered_ids.clone();
        ids.sort();
        let mut want = vec![cancelled.id.clone(), running.id.clone()];
        want.sort();
        assert_eq!(ids, want);

        let c = store.get(&cancelled.id, &owner()).await.unwrap().unwrap();
        assert_eq!(c.status, TaskStatus::Cancelled, "{c:?}");
        assert_eq!(c.outcome, None);
        assert_eq!(c.updated_ms, EPOCH_MS + 10_000);
        assert!(c.expires_ms >= c.updated_ms + TERMINAL_RETENTION_MS);
        let r = store.get(&running.id, &owner()).await.unwrap().unwrap();
        assert_eq!(r.status, TaskStatus::Failed);
        assert_eq!(r.outcome, Some(Outcome::interrupted()));
        store.shutdown().await.unwrap();
    });
}

/// A writer the test's tracing subscriber appends to.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn the_store_thread_logs_inside_the_callers_span() {
    use tracing::Instrument;
    let captured = Captured::default();
    let writer = captured.clone();
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish(),
    )
    .expect("the only test of this binary that installs a subscriber");
    let root = private_dir();
    let dir = state_dir(root.path());
    let rt = runtime();
    rt.block_on(async {
        let (store, clock) = open_manual(&dir, |_| {});
        created(&store, 10).await;
        clock.advance(Duration::from_millis(10));
        let swept = store
            .sweep_now()
            .instrument(tracing::info_span!("request", marker = "sweep-span-7f3a"))
            .await
            .unwrap();
        assert_eq!(swept, 1);
        store.shutdown().await.unwrap();
    });
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    // Other tests of this binary log too; this one's sweep is the line in
    // its span.
    let sweeps: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("expired tasks swept"))
        .collect();
    assert!(
        sweeps
            .iter()
            .any(|l| l.contains(r#"request{marker="sweep-span-7f3a"}"#)),
        "no sweep logged inside the caller's span: {sweeps:#?}"
    );
}

#[test]
fn an_opening_given_up_before_recovery_recovers_nothing() {
    let root = private_dir();
    let dir = state_dir(root.path());
    let rt = runtime();
    rt.block_on(async {
        let store = open_with(&dir, |_| {});
        let running = created(&store, 60_000).await;
        store.shutdown().await.unwrap();

        // What startup does when opening the artifacts fails: the store is
        // validated, knows the unfinished task, and is dropped unrecovered.
        let opening = Store::begin_open(StoreOptions::new(dir.join("tasks.db"))).unwrap();
        assert_eq!(opening.unfinished(), std::slice::from_ref(&running.id));
        drop(opening);

        let (store, report) = Store::open(StoreOptions::new(dir.join("tasks.db"))).unwrap();
        assert_eq!(report.recovered_ids, vec![running.id.clone()]);
        let r = store.get(&running.id, &owner()).await.unwrap().unwrap();
        assert_eq!(r.status, TaskStatus::Failed);
        store.shutdown().await.unwrap();
    });
}
