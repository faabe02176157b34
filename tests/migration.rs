//! The committed v1 fixture migrates to v2 with its rows intact, and a crash
//! between the migration's statements leaves v1 intact.
//!
//! What this file proves: the committed v1 fixture migrates; a crash
//! mid-migration leaves v1

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};

use common::*;
use taskgate::store::{
    Created, Digest, NewTask, Outcome, SCHEMA_VERSION, Store, StoreOptions, TaskId, TaskStatus,
};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/v1.db");

fn fixture_copy(root: &Path) -> PathBuf {
    let dir = state_dir(root);
    let db = dir.join("tasks.db");
    std::fs::copy(FIXTURE, &db).unwrap();
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o600)).unwrap();
    dir
}

fn schema_of(db: &Path) -> (i64, bool, i64) {
    let c = rusqlite::Connection::open(db).unwrap();
    let version: i64 = c
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    let has_proposal = c.prepare("SELECT proposal FROM tasks").is_ok();
    let rows: i64 = c
        .query_row("SELECT count(*) FROM tasks", [], |r| r.get(0))
        .unwrap();
    let ok: String = c
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
    (version, has_proposal, rows)
}

fn id(n: u32) -> TaskId {
    TaskId::parse(&format!("tg-{n:032x}")).unwrap()
}

#[test]
fn v1_fixture_migrates_with_rows_intact() {
    let root = private_dir();
    let dir = fixture_copy(root.path());
    let db = dir.join("tasks.db");
    assert_eq!(schema_of(&db), (1, false, 4));

    // check reports the pending migration and writes nothing.
    let before = sha256_file(&db);
    let out = taskgate(&["check", "--state-dir", dir.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("schema 1") && stdout.contains("migrate"),
        "{stdout}"
    );
    assert!(stdout.contains("1 tasks were running"), "{stdout}");
    assert_eq!(sha256_file(&db), before);

    let rt = runtime();
    rt.block_on(async {
        let (store, report) = Store::open(StoreOptions::new(&db)).unwrap();
        assert_eq!(report.migrated_from, Some(1));
        assert_eq!(report.recovered, 1, "the working v1 task is failed, not re-run");
        assert_eq!(report.retained, 4);
        let owner = owner();

        let t1 = store.get(&id(1), &owner).await.unwrap().unwrap();
        assert_eq!(t1.status, TaskStatus::Completed);
        assert_eq!(t1.created_ms, 1767225600000);
        match t1.outcome {
            Some(Outcome::Result(v)) => assert_eq!(v["content"][0]["text"], "v1 completed result"),
            other => panic!("{other:?}"),
        }
        let t2 = store.get(&id(2), &owner).await.unwrap().unwrap();
        assert_eq!(t2.status, TaskStatus::Failed);
        assert_eq!(t2.status_message.as_deref(), Some("tool timed out"));
        let t3 = store.get(&id(3), &owner).await.unwrap().unwrap();
        assert_eq!(t3.status, TaskStatus::Failed);
        assert!(matches!(t3.outcome, Some(Outcome::Error(ref e)) if e.code == taskgate::wire::TASK_INTERRUPTED.code));

        // The v1 creation reference still deduplicates after migration.
        let again = store
            .create(NewTask {
                proposal: None,
                reference: Some(Digest::of(b"operation-1")),
                request: Some(Digest::of(b"request-1")),
                ..new_task(60_000)
            })
            .await
            .unwrap();
        assert!(matches!(again, Created::Existing(ref r) if r.id == id(4)), "{again:?}");
        // The routes kind came with the migration, empty.
        assert_eq!(store.route_counts().await.unwrap().total(), 0);
        store.shutdown().await.unwrap();
    });
    assert_eq!(schema_of(&db), (SCHEMA_VERSION, true, 4));
    let c = rusqlite::Connection::open(&db).unwrap();
    for table in ["routes", "leases"] {
        let n: i64 = c
            .query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 0, "{table}");
    }
}

#[test]
fn crash_between_migration_statements_leaves_v1_intact() {
    let root = private_dir();
    let dir = fixture_copy(root.path());
    let db = dir.join("tasks.db");
    let out = taskgate(
        &[
            "serve",
            "--state-dir",
            dir.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ],
        &[("TASKGATE_TEST_CRASH_AT", "mid-migration")],
    );
    assert_eq!(out.status.signal(), Some(libc::SIGABRT), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("crash point mid-migration"));
    // The migration's first statement was in the WAL, uncommitted: gone.
    assert_eq!(schema_of(&db), (1, false, 4));

    // A normal start then migrates.
    let rt = runtime();
    rt.block_on(async {
        let (store, report) = Store::open(StoreOptions::new(&db)).unwrap();
        assert_eq!(report.migrated_from, Some(1));
        store.shutdown().await.unwrap();
    });
    assert_eq!(schema_of(&db), (SCHEMA_VERSION, true, 4));
}
