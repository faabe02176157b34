//! The engine alone, driven through a kind of record of its own making
//! (notes with an owner, an expiry and an "open" flag that restart
//! recovery clears): what any application's kinds rely on, without one.

use std::sync::Arc;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

use crate::open::{check_identified, check_read_only};
use crate::{
    Clock, EngineError, Handle, Hooks, NextExpiry, OpError, OpenError, Options, RecordKind, Report,
    Step, StoreId, Tx, Unobserved, kinds,
};

/// Notes one store holds at most.
const MAX_NOTES: u64 = 3;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum Refusal {
    #[error("{MAX_NOTES} notes held already")]
    Full,
}

fn create_notes(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "CREATE TABLE notes (
            id TEXT PRIMARY KEY NOT NULL,
            body TEXT NOT NULL,
            open INTEGER NOT NULL,
            expires_ms INTEGER NOT NULL
         ) STRICT;
         CREATE INDEX notes_expires ON notes (expires_ms);",
    )
}

const STEPS: &[Step] = &[Step {
    version: 1,
    what: "the notes table",
    apply: create_notes,
}];

struct ToyOptions;

struct Notes {
    expiry: NextExpiry,
}

impl Notes {
    fn new(_: &ToyOptions) -> Notes {
        Notes {
            expiry: NextExpiry::unknown(),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Closed(u64);

impl Report for Closed {
    fn lines(&self) -> Vec<String> {
        (self.0 > 0)
            .then(|| format!("{} notes open at the last stop are closed", self.0))
            .into_iter()
            .collect()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Held(u64);

impl Report for Held {}

fn count(conn: &Connection, sql: &str) -> rusqlite::Result<u64> {
    conn.query_row(sql, [], |r| r.get::<_, i64>(0))
        .map(|n| n as u64)
}

impl RecordKind for Notes {
    type Recovery = Closed;
    type Status = Held;

    fn name(&self) -> &'static str {
        "note"
    }
    fn since(&self) -> i64 {
        1
    }
    fn verify_shape(&self, conn: &Connection, _version: i64) -> rusqlite::Result<()> {
        conn.prepare("SELECT id, body, open, expires_ms FROM notes LIMIT 0")
            .map(|_| ())
    }
    fn decode_all(&self, conn: &Connection) -> rusqlite::Result<Result<u64, (String, String)>> {
        let bad: Option<String> = conn
            .query_row("SELECT id FROM notes WHERE body = ''", [], |r| r.get(0))
            .optional()?;
        match bad {
            Some(id) => Ok(Err((id, "an empty body".into()))),
            None => Ok(Ok(count(conn, "SELECT count(*) FROM notes")?)),
        }
    }
    fn ensure(&self, _conn: &Connection) -> rusqlite::Result<()> {
        Ok(())
    }
    fn pending_recovery(&self, conn: &Connection, _version: i64) -> rusqlite::Result<Closed> {
        Ok(Closed(count(
            conn,
            "SELECT count(*) FROM notes WHERE open = 1",
        )?))
    }
    fn recover(&mut self, conn: &Connection, _now: i64) -> rusqlite::Result<()> {
        conn.execute("UPDATE notes SET open = 0", []).map(|_| ())
    }
    fn status(&self, conn: &Connection, _version: i64, now: i64) -> rusqlite::Result<Held> {
        conn.query_row(
            "SELECT count(*) FROM notes WHERE expires_ms > ?1",
            [now],
            |r| r.get::<_, i64>(0),
        )
        .map(|n| Held(n as u64))
    }
    fn load(&mut self, conn: &Connection, _now: i64) -> rusqlite::Result<()> {
        self.expiry.load(conn, "notes")
    }
    fn sweep(&mut self, conn: &Connection, now: i64, limit: u32) -> rusqlite::Result<u64> {
        if !self.expiry.is_due(now) {
            return Ok(0);
        }
        let n = conn.execute(
            "DELETE FROM notes WHERE rowid IN
               (SELECT rowid FROM notes WHERE expires_ms <= ?1 ORDER BY expires_ms LIMIT ?2)",
            params![now, limit],
        )? as u64;
        self.expiry.swept(conn, "notes")?;
        Ok(n)
    }
    fn sweep_undone(&mut self) {
        self.expiry.rolled_back();
    }
    fn committed(&mut self) {
        self.expiry.committed();
    }
    fn rolled_back(&mut self) {
        self.expiry.rolled_back();
    }
}

kinds! {
    struct Toy;
    recovery ToyRecovery; status ToyStatus;
    options ToyOptions; refusal Refusal; steps STEPS;
    notes: Notes,
}

const EPOCH_MS: i64 = 1_767_225_600_000;

fn options(path: &std::path::Path, clock: Clock) -> Options {
    Options {
        db_path: path.to_path_buf(),
        queue_depth: 16,
        max_db_pages: 4096,
        checkpoint_interval: Duration::from_secs(3600),
        clock,
        expected_identity: None,
        identity_recorded_in: "notes.id".into(),
        outcome_linger: crate::OUTCOME_LINGER,
        hooks: Hooks::default(),
        observer: Arc::new(Unobserved),
    }
}

fn add(tx: &mut Tx<'_, Toy>, id: &str, ttl_ms: i64) -> Result<(), OpError<Refusal>> {
    if count(tx.conn, "SELECT count(*) FROM notes")? >= MAX_NOTES {
        return Err(OpError::Refused(Refusal::Full));
    }
    let expires = tx.now + ttl_ms;
    tx.conn.execute(
        "INSERT INTO notes (id, body, open, expires_ms) VALUES (?1, 'hello', 1, ?2)",
        params![id, expires],
    )?;
    tx.kinds.notes.expiry.added(expires);
    Ok(())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn a_kind_of_its_own_is_migrated_written_refused_swept_checked_and_recovered() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.db");
    let (clock, hand) = Clock::manual(EPOCH_MS);
    let opening = Handle::begin_open(options(&path, clock.clone()), Toy::new(&ToyOptions)).unwrap();
    assert_eq!(opening.recovery().notes, Closed(0));
    let identity = opening.identity().clone();
    let (store, report) = opening.recover().unwrap();
    assert!(report.initialized);
    runtime().block_on(async {
        // Three writes in flight at once share the store; a fourth is the
        // kind's refusal, carried as it was given, and the others stand.
        let writes: Vec<_> = ["a", "b", "c"]
            .into_iter()
            .map(|id| {
                let store = store.clone();
                tokio::spawn(async move {
                    store
                        .write_op("adding a note", true, move |tx| add(tx, id, 60_000))
                        .await
                })
            })
            .collect();
        for w in writes {
            w.await.unwrap().unwrap();
        }
        let refused = store
            .write_op("adding a note", true, |tx| add(tx, "d", 60_000))
            .await;
        assert_eq!(refused, Err(EngineError::Refused(Refusal::Full)));
        let held = store
            .read_op("counting notes", |cx| {
                Ok(count(cx.conn, "SELECT count(*) FROM notes")?)
            })
            .await
            .unwrap();
        assert_eq!(held, 3);
        // Expired at the clock's "now": the sweep removes them all.
        hand.advance(Duration::from_secs(61));
        assert_eq!(store.sweep_now().await.unwrap(), 3);
        store
            .write_op("adding a note", true, |tx| add(tx, "e", 60_000))
            .await
            .unwrap();
        store.shutdown().await.unwrap();
    });

    // Read-only: what recovery would end and what the kind holds.
    let (checked, found) = check_identified(
        &path,
        4096,
        &clock,
        &Toy::new(&ToyOptions),
        Some(&identity),
        "notes.id",
    )
    .unwrap();
    assert_eq!(found.as_ref(), Some(&identity));
    match &checked {
        crate::CheckReport::Valid {
            version,
            recovery,
            status,
        } => {
            assert_eq!(*version, 1);
            assert_eq!(recovery.notes, Closed(1));
            assert_eq!(
                recovery.lines(),
                ["1 notes open at the last stop are closed"]
            );
            assert_eq!(status.notes, Held(1));
        }
        other => panic!("{other:?}"),
    }
    // Another store's identity is refused, naming where it was recorded.
    let other = StoreId::generate().unwrap();
    let refused = check_identified(
        &path,
        4096,
        &clock,
        &Toy::new(&ToyOptions),
        Some(&other),
        "notes.id",
    )
    .unwrap_err();
    assert!(matches!(refused, OpenError::Replaced { .. }), "{refused}");
    assert!(
        refused.to_string().contains("(recorded in notes.id)"),
        "{refused}"
    );

    // Opening again runs the kind's recovery, once.
    let (store, report) = Handle::begin_open(options(&path, clock.clone()), Toy::new(&ToyOptions))
        .unwrap()
        .recover()
        .unwrap();
    assert_eq!(report.recovery.notes, Closed(1));
    assert_eq!(report.status.notes, Held(1));
    runtime().block_on(store.shutdown()).unwrap();
    let again = check_read_only(&path, 4096, &clock, &Toy::new(&ToyOptions)).unwrap();
    assert!(
        matches!(&again, crate::CheckReport::Valid { recovery, .. } if recovery.notes == Closed(0)),
        "{again:?}"
    );
}

#[test]
fn a_database_newer_than_the_steps_is_refused_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.db");
    {
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA user_version = 2; CREATE TABLE x (y);",
        )
        .unwrap();
    }
    let before = std::fs::read(&path).unwrap();
    let refused = Handle::begin_open(options(&path, Clock::system()), Toy::new(&ToyOptions))
        .err()
        .expect("a newer database is refused");
    assert!(
        matches!(
            refused,
            OpenError::FutureVersion {
                found: 2,
                supported: 1,
                ..
            }
        ),
        "{refused}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), before);
}
