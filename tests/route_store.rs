//! The routes kind of the store on real SQLite files, on a manual clock:
//! its bounds, its idempotency, its sweep, its phase changes and its
//! restart recovery (what a crash at each phase boundary leaves).
//!
//! Invariant 19 of the map: A route's binding is committed before the upstream
//! is contacted, and raw arguments are never stored: the store keeps the
//! canonical binding with the arguments' digest, and the same caller, key and
//! binding find the committed route again. Guarded by:
//! `tests/route_store.rs::idempotency_is_per_caller_and_bound_to_the_binding`,
//! `tests/durable_routes.rs::a_submission_is_routed_once_and_found_again_by_its_key_and_its_id`
//! (one effect upstream, the envelope it received naming the public ID, `routes
//! show` without the argument's value)
//!
//! What this file proves: the routes kind on a real SQLite file: 4,096 routes
//! in all and 256 unexpired per caller (the next refused as route capacity), a
//! submission sweeping at most 128 expired routes oldest first, expired routes
//! unreadable, another caller's route indistinguishable from an unknown one,
//! the upstream task ID written once, a cancel intent kept when the upstream's
//! ID arrives, restart recovery at each phase (prepared ends not dispatched,
//! dispatching needs reconciliation, routed keeps its session), and a failed
//! route sweep that leaves the live-task count as the file holds

mod common;

use common::*;
use taskgate::store::{
    Advanced, CapacityKind, CheckReport, Clock, Decider, Digest, MAX_ROUTES, MAX_ROUTES_PER_OWNER,
    ManualClock, NewRoute, Outcome, Prepared, Report, RouteChange, RouteId, RoutePhase,
    RouteRecord, RouteRecovery, Store, StoreError, StoreOptions, TaskStatus, check_read_only,
};

const EPOCH_MS: i64 = 1_767_225_600_000;

fn open(dir: &std::path::Path) -> (Store, ManualClock) {
    open_with(dir, |_| {})
}

fn open_with(dir: &std::path::Path, f: impl FnOnce(&mut StoreOptions)) -> (Store, ManualClock) {
    let (clock, hand) = Clock::manual(EPOCH_MS);
    let mut o = StoreOptions::new(dir.join("tasks.db"));
    o.clock = clock;
    f(&mut o);
    (Store::open(o).unwrap().0, hand)
}

fn caller(n: u32) -> Digest {
    Digest::of(format!("caller-{n}").as_bytes())
}

fn route(owner: Digest, key: &str, retention_ms: i64) -> NewRoute {
    NewRoute {
        owner,
        idempotency: Digest::of(key.as_bytes()),
        binding: format!("{{\"idempotencyKey\":\"{key}\"}}").into_bytes(),
        request_digest: Digest::of(b"request"),
        upstream: "up".into(),
        capability: "up.work".into(),
        schema_digest: "sha256:00".into(),
        source_digest: Digest::of(b"source"),
        deadline_ms: EPOCH_MS + retention_ms / 2,
        expires_ms: EPOCH_MS + retention_ms,
        poll_interval_ms: 1000,
    }
}

/// Moves a prepared route to dispatching on session s1.
async fn dispatch(store: &Store, id: &RouteId) {
    store
        .advance_route(
            id,
            &[RoutePhase::Prepared],
            RouteChange::Dispatching {
                coordinator: "c1".into(),
                session: "s1".into(),
            },
        )
        .await
        .unwrap();
}

/// The caller's cancel of a route not yet routed.
async fn cancel(store: &Store, id: &RouteId) {
    store
        .advance_route(
            id,
            &[RoutePhase::Prepared, RoutePhase::Dispatching],
            RouteChange::CancelRequested {
                reason: "requested by the caller".into(),
            },
        )
        .await
        .unwrap();
}

async fn prepared(store: &Store, new: NewRoute) -> RouteRecord {
    match store.prepare_route(new).await.unwrap() {
        Prepared::New(r) => r,
        other => panic!("not new: {other:?}"),
    }
}

#[test]
fn routes_are_bounded_in_all_and_per_caller() {
    let root = private_dir();
    let (store, _) = open(root.path());
    runtime().block_on(async {
        // 256 for one caller; the 257th is refused for that caller only.
        for i in 0..MAX_ROUTES_PER_OWNER {
            prepared(&store, route(caller(0), &format!("k{i}"), 600_000)).await;
        }
        let e = store
            .prepare_route(route(caller(0), "k-over", 600_000))
            .await
            .unwrap_err();
        assert_eq!(
            e,
            StoreError::RouteCapacity {
                limit: MAX_ROUTES_PER_OWNER,
                per_caller: true
            }
        );
        // Other callers fill the rest up to 4,096; the 4,097th is refused.
        let mut n = MAX_ROUTES_PER_OWNER;
        let mut who = 1;
        while n < MAX_ROUTES {
            for i in 0..MAX_ROUTES_PER_OWNER.min(MAX_ROUTES - n) {
                prepared(&store, route(caller(who), &format!("k{i}"), 600_000)).await;
                n += 1;
            }
            who += 1;
        }
        let e = store
            .prepare_route(route(caller(9999), "k", 600_000))
            .await
            .unwrap_err();
        assert_eq!(
            e,
            StoreError::RouteCapacity {
                limit: MAX_ROUTES,
                per_caller: false
            }
        );
        // The same key and binding again is no new route, even at the bound.
        let again = store
            .prepare_route(route(caller(0), "k0", 600_000))
            .await
            .unwrap();
        assert!(matches!(again, Prepared::Existing(_)));
    });
}

#[test]
fn a_submission_sweeps_at_most_128_expired_routes_oldest_first() {
    let root = private_dir();
    // The timed sweep is held, so that only the submission's own sweep
    // deletes anything.
    let hold = root.path().join("hold");
    std::fs::write(&hold, b"").unwrap();
    let (store, hand) = open_with(root.path(), |o| o.hold_sweep_file = Some(hold.clone()));
    runtime().block_on(async {
        let mut old = Vec::new();
        for i in 0..200 {
            // Expiring one millisecond apart, oldest first.
            let mut r = route(caller(i % 8), &format!("old{i}"), 60_000);
            r.expires_ms += i as i64;
            old.push(prepared(&store, r).await);
        }
        hand.advance(std::time::Duration::from_secs(120));
        // Expired routes are not readable, by ID or by key.
        assert_eq!(
            store.get_route(&old[0].id, &old[0].owner).await.unwrap(),
            None
        );
        prepared(&store, route(caller(100), "fresh", 600_000)).await;
        let left: Vec<bool> = {
            let c = rusqlite::Connection::open(root.path().join("tasks.db")).unwrap();
            old.iter()
                .map(|r| {
                    c.query_row(
                        "SELECT count(*) FROM routes WHERE id = ?1",
                        [r.id.as_str()],
                        |row| row.get::<_, i64>(0),
                    )
                    .unwrap()
                        == 1
                })
                .collect()
        };
        let gone = left.iter().filter(|l| !**l).count();
        assert_eq!(gone, 128, "{gone} swept");
        assert!(left[..gone].iter().all(|l| !l), "not oldest first");
        assert!(left[gone..].iter().all(|l| *l));
    });
}

#[test]
fn idempotency_is_per_caller_and_bound_to_the_binding() {
    let root = private_dir();
    let (store, _) = open(root.path());
    runtime().block_on(async {
        let a = prepared(&store, route(caller(1), "key", 600_000)).await;
        let same = store
            .prepare_route(route(caller(1), "key", 600_000))
            .await
            .unwrap();
        assert_eq!(same, Prepared::Existing(a.clone()));
        let mut changed = route(caller(1), "key", 600_000);
        changed.binding = b"{\"idempotencyKey\":\"key\",\"inputDigest\":\"other\"}".to_vec();
        assert_eq!(
            store.prepare_route(changed).await.unwrap_err(),
            StoreError::Conflict
        );
        // Another caller's key is its own, and another caller's route
        // reads exactly like an unknown one.
        let b = prepared(&store, route(caller(2), "key", 600_000)).await;
        assert_ne!(a.id, b.id);
        assert_eq!(store.get_route(&a.id, &caller(2)).await.unwrap(), None);
        let unknown = RouteId::parse(&format!("tgr-{}", "0".repeat(32))).unwrap();
        assert_eq!(store.get_route(&unknown, &caller(2)).await.unwrap(), None);
        // The raw key is not stored: only its digest (and the binding the
        // caller wrote, which names it).
        let c = rusqlite::Connection::open(root.path().join("tasks.db")).unwrap();
        let idem: Vec<u8> = c
            .query_row(
                "SELECT idempotency FROM routes WHERE id = ?1",
                [a.id.as_str()],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(idem.len(), 32);
    });
}

#[test]
fn the_upstream_task_id_is_written_once_and_a_cancel_intent_survives_it() {
    let root = private_dir();
    let (store, _) = open(root.path());
    runtime().block_on(async {
        let r = prepared(&store, route(caller(1), "k", 600_000)).await;
        let dispatching = RouteChange::Dispatching {
            coordinator: "c1".into(),
            session: "s1".into(),
        };
        store
            .advance_route(&r.id, &[RoutePhase::Prepared], dispatching)
            .await
            .unwrap();
        // The caller cancels while the submission is in flight.
        let Advanced::Changed(c) = store
            .advance_route(
                &r.id,
                &[RoutePhase::Dispatching],
                RouteChange::CancelRequested {
                    reason: "requested by the caller".into(),
                },
            )
            .await
            .unwrap()
        else {
            panic!("not changed")
        };
        assert_eq!(c.phase, RoutePhase::CancelRequested);
        let routed = |id: &str| RouteChange::Routed {
            upstream_task_id: id.into(),
            poll_interval_ms: 5000,
        };
        let Advanced::Changed(after) = store
            .advance_route(
                &r.id,
                &[RoutePhase::Dispatching, RoutePhase::CancelRequested],
                routed("up-1"),
            )
            .await
            .unwrap()
        else {
            panic!("not changed")
        };
        assert_eq!(
            after.phase,
            RoutePhase::CancelRequested,
            "the intent was lost"
        );
        assert_eq!(after.upstream_task_id.as_deref(), Some("up-1"));
        assert_eq!(after.poll_interval_ms, 5000);
        // A second upstream ID is refused by the schema itself.
        let e = store
            .advance_route(&r.id, &[RoutePhase::CancelRequested], routed("up-2"))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("written once"), "{e}");
        let now = store.get_route(&r.id, &caller(1)).await.unwrap().unwrap();
        assert_eq!(now.upstream_task_id.as_deref(), Some("up-1"));
        // A change from a phase the route is not in changes nothing.
        let unchanged = store
            .advance_route(
                &r.id,
                &[RoutePhase::Prepared],
                RouteChange::Reconcile {
                    reason: "x".into(),
                    detach: false,
                },
            )
            .await
            .unwrap();
        assert!(matches!(unchanged, Advanced::Unchanged(_)));
    });
}

#[test]
fn recovery_ends_what_was_not_sent_and_reconciles_what_may_have_been() {
    let root = private_dir();
    let dir = root.path().to_path_buf();
    let (
        prepared_id,
        dispatching_id,
        routed_id,
        terminal_id,
        cancelled_prepared,
        cancelled_dispatching,
    ) = {
        let (store, _) = open(&dir);
        runtime().block_on(async {
            let p = prepared(&store, route(caller(1), "p", 600_000)).await;
            let d = prepared(&store, route(caller(1), "d", 600_000)).await;
            let r = prepared(&store, route(caller(1), "r", 600_000)).await;
            let t = prepared(&store, route(caller(1), "t", 600_000)).await;
            // Cancelled before it was sent, and while it was being sent.
            let cp = prepared(&store, route(caller(1), "cp", 600_000)).await;
            let cd = prepared(&store, route(caller(1), "cd", 600_000)).await;
            dispatch(&store, &cd.id).await;
            for id in [&cp.id, &cd.id] {
                cancel(&store, id).await;
            }
            for id in [&d.id, &r.id, &t.id] {
                dispatch(&store, id).await;
            }
            store
                .advance_route(
                    &r.id,
                    &[RoutePhase::Dispatching],
                    RouteChange::Routed {
                        upstream_task_id: "up-1".into(),
                        poll_interval_ms: 0,
                    },
                )
                .await
                .unwrap();
            let done = Outcome::Result(serde_json::json!({"content": [], "isError": false}));
            store
                .advance_route(
                    &t.id,
                    &[RoutePhase::Dispatching],
                    RouteChange::Terminal {
                        status: TaskStatus::Completed,
                        outcome: Some(done),
                        decider: Decider::Provider,
                        reason: None,
                    },
                )
                .await
                .unwrap();
            // Recovery runs at every opening, after a clean stop as after
            // a crash: what was in flight ends the same way.
            store.shutdown().await.unwrap();
            (p.id, d.id, r.id, t.id, cp.id, cd.id)
        })
    };
    let (store, _) = open(&dir);
    runtime().block_on(async {
        let get = |id: RouteId| {
            let store = store.clone();
            async move { store.get_route(&id, &caller(1)).await.unwrap().unwrap() }
        };
        let p = get(prepared_id).await;
        assert_eq!(p.phase, RoutePhase::Terminal);
        assert_eq!(p.decider, Some(Decider::Broker));
        assert_eq!(p.status, Some(TaskStatus::Failed));
        match &p.outcome {
            Some(Outcome::Error(e)) => {
                assert_eq!(e.code, taskgate::wire::ROUTE_NOT_DISPATCHED.code)
            }
            other => panic!("{other:?}"),
        }
        let d = get(dispatching_id).await;
        assert_eq!(d.phase, RoutePhase::ReconciliationRequired);
        assert!(d.reason.unwrap().contains("unknown"));
        let r = get(routed_id).await;
        assert_eq!(r.phase, RoutePhase::Routed);
        assert_eq!(r.session.as_deref(), Some("s1"));
        assert_eq!(r.upstream_task_id.as_deref(), Some("up-1"));
        let t = get(terminal_id).await;
        assert_eq!(t.phase, RoutePhase::Terminal);
        assert_eq!(t.status, Some(TaskStatus::Completed));
        let cp = get(cancelled_prepared).await;
        assert_eq!(
            (cp.phase, cp.status, cp.decider),
            (
                RoutePhase::Terminal,
                Some(TaskStatus::Cancelled),
                Some(Decider::Broker)
            )
        );
        let cd = get(cancelled_dispatching).await;
        assert_eq!(cd.phase, RoutePhase::ReconciliationRequired);
        let counts = store.route_counts().await.unwrap();
        assert_eq!(
            (
                counts.terminal,
                counts.reconciliation_required,
                counts.routed
            ),
            (3, 2, 1)
        );
    });
}

/// `check` and the opening report tell the routes' recovery as they tell
/// the tasks': what a restart ends, counted before it runs, and nothing
/// once it has.
#[test]
fn check_and_opening_report_what_route_recovery_ends() {
    let root = private_dir();
    let dir = root.path().to_path_buf();
    {
        let (store, _) = open(&dir);
        runtime().block_on(async {
            prepared(&store, route(caller(1), "p", 600_000)).await;
            let d = prepared(&store, route(caller(1), "d", 600_000)).await;
            let c = prepared(&store, route(caller(1), "c", 600_000)).await;
            dispatch(&store, &d.id).await;
            cancel(&store, &c.id).await;
            store.shutdown().await.unwrap();
        });
    }
    let pending = RouteRecovery {
        not_sent: 1,
        in_flight: 1,
        cancelled_unsent: 1,
    };
    let db = dir.join("tasks.db");
    let max_pages = taskgate::config::StoreSettings::default().max_db_pages;
    // Recovery counts every route, expired by the wall clock or not.
    let CheckReport::Valid { recovery, .. } = check_read_only(&db, max_pages).unwrap() else {
        panic!("not a valid database")
    };
    assert_eq!(recovery.routes, pending);
    let lines = recovery.lines();
    for said in [
        "note: 1 routes were prepared but not sent at the last stop; serve ends them failed",
        "note: 1 routes were being sent at the last stop; serve marks them as needing reconciliation",
        "note: 1 routes were cancelled before they were sent; serve ends them cancelled",
    ] {
        assert!(
            lines.iter().any(|l| l.starts_with(said)),
            "{said}: {lines:#?}"
        );
    }
    let (clock, _hand) = Clock::manual(EPOCH_MS);
    let mut o = StoreOptions::new(&db);
    o.clock = clock;
    let (store, report) = Store::open(o).unwrap();
    assert_eq!(report.recovery.routes, pending);
    assert_eq!(report.recovered, 0, "no task was running");
    runtime().block_on(store.shutdown()).unwrap();
    let CheckReport::Valid { recovery, .. } = check_read_only(&db, max_pages).unwrap() else {
        panic!("not a valid database")
    };
    assert_eq!(recovery.routes, RouteRecovery::default());
}

/// A third live task is refused under a limit of two.
async fn refused_a_third(store: &Store) {
    let third = store.create(new_task(60_000)).await;
    assert!(
        matches!(
            third,
            Err(StoreError::Capacity(CapacityKind::LiveTasks { limit: 2 }))
        ),
        "a third live task: {third:?}"
    );
}

/// One sweep deletes expired tasks first, then routes and leases. When a
/// later kind's deletion fails (a trigger refuses it here, as a full disk
/// would), the tasks it had deleted are back in the file, and the live-task
/// limit goes on counting them as the file does: a creation batch's failed
/// sweep lets no creation past the limit, and the timer's failed sweep
/// leaves no deleted task counted.
#[test]
fn a_failed_route_sweep_leaves_the_task_count_as_the_file_holds() {
    let root = private_dir();
    let db = root.path().join("tasks.db");
    let (store, hand) = open_with(root.path(), |o| o.settings.max_live_tasks = 2);
    let tasks_in_file = |c: &rusqlite::Connection| -> i64 {
        c.query_row("SELECT count(*) FROM tasks", [], |r| r.get(0))
            .unwrap()
    };
    runtime().block_on(async {
        for _ in 0..2 {
            store.create(new_task(100)).await.unwrap();
        }
        prepared(&store, route(caller(0), "k", 100)).await;
        let side = rusqlite::Connection::open(&db).unwrap();
        side.execute_batch(
            "CREATE TRIGGER hold_routes BEFORE DELETE ON routes
             BEGIN SELECT RAISE(ABORT, 'routes held'); END;",
        )
        .unwrap();
        hand.advance(std::time::Duration::from_millis(100));

        // Both tasks and the route have expired. Each creation's batch
        // sweeps first; the routes' deletion fails and the tasks' is undone
        // with it. The two expired tasks do not count against the limit,
        // the two new ones do.
        for _ in 0..2 {
            store.create(new_task(60_000)).await.unwrap();
        }
        assert_eq!(tasks_in_file(&side), 4);
        refused_a_third(&store).await;

        // All four expired. The timer's sweep fails the same way (whichever
        // runs it, the beat or this call) and keeps the tasks it deleted.
        hand.advance(std::time::Duration::from_millis(60_000));
        let swept = store.sweep_now().await;
        assert!(swept.is_err(), "the routes are held: {swept:?}");
        assert_eq!(tasks_in_file(&side), 4);
        side.execute_batch("DROP TRIGGER hold_routes").unwrap();
        for _ in 0..2 {
            store.create(new_task(60_000)).await.unwrap();
        }
        assert_eq!(tasks_in_file(&side), 2, "the expired ones were swept");
        refused_a_third(&store).await;
    });
}
