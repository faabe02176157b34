//! The physical baseline for `taskgate bench`: raw SQLite commits on the
//! disk under test, with exactly the production pragmas, so taskgate's own
//! figures can be read as ratios to what the disk allows.

use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags, params};

use taskgate_store_engine::{OpenError, apply_production_pragmas};

/// Bytes of payload per row: about a task row (ID, digests, timestamps).
const ROW_BYTES: usize = 192;
/// Rows per transaction in the batched measurement.
pub const BATCH_ROWS: usize = 32;

/// What the disk did.
#[derive(Debug, Clone)]
pub struct Baseline {
    /// One row per transaction: the latency of each commit.
    pub single_commits: Vec<Duration>,
    pub single_elapsed: Duration,
    /// `BATCH_ROWS` rows per transaction: the latency of each commit.
    pub batch_commits: Vec<Duration>,
    pub batch_elapsed: Duration,
}

impl Baseline {
    pub fn single_commits_per_sec(&self) -> f64 {
        self.single_commits.len() as f64 / self.single_elapsed.as_secs_f64().max(1e-9)
    }

    pub fn batch_rows_per_sec(&self) -> f64 {
        (self.batch_commits.len() * BATCH_ROWS) as f64 / self.batch_elapsed.as_secs_f64().max(1e-9)
    }
}

fn sql(path: &Path, e: rusqlite::Error) -> OpenError {
    OpenError::Io {
        path: path.to_path_buf(),
        during: "measuring the baseline",
        detail: e.to_string(),
    }
}

/// Measures `singles` one-row commits and `batches` commits of
/// [`BATCH_ROWS`] rows in a new database in `dir`, then removes it.
pub fn measure(dir: &Path, singles: usize, batches: usize) -> Result<Baseline, OpenError> {
    let path = dir.join("baseline.db");
    let conn = Connection::open_with_flags(
        &path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| sql(&path, e))?;
    apply_production_pragmas(
        &conn,
        &path,
        crate::config::keys::STORE_MAX_DB_PAGES.int().default,
    )?;
    conn.execute_batch("CREATE TABLE t (id TEXT PRIMARY KEY, payload BLOB NOT NULL) STRICT")
        .map_err(|e| sql(&path, e))?;
    let payload = vec![0x5au8; ROW_BYTES];
    let mut n = 0u64;
    let mut insert = |conn: &Connection| -> rusqlite::Result<()> {
        n += 1;
        conn.prepare_cached("INSERT INTO t VALUES (?1, ?2)")?
            .execute(params![format!("row-{n:016}"), &payload])
            .map(|_| ())
    };

    let mut single_commits = Vec::with_capacity(singles);
    let start = Instant::now();
    for _ in 0..singles {
        let t = Instant::now();
        conn.execute_batch("BEGIN IMMEDIATE")
            .map_err(|e| sql(&path, e))?;
        insert(&conn).map_err(|e| sql(&path, e))?;
        conn.execute_batch("COMMIT").map_err(|e| sql(&path, e))?;
        single_commits.push(t.elapsed());
    }
    let single_elapsed = start.elapsed();

    let mut batch_commits = Vec::with_capacity(batches);
    let start = Instant::now();
    for _ in 0..batches {
        let t = Instant::now();
        conn.execute_batch("BEGIN IMMEDIATE")
            .map_err(|e| sql(&path, e))?;
        for _ in 0..BATCH_ROWS {
            insert(&conn).map_err(|e| sql(&path, e))?;
        }
        conn.execute_batch("COMMIT").map_err(|e| sql(&path, e))?;
        batch_commits.push(t.elapsed());
    }
    let batch_elapsed = start.elapsed();
    drop(conn);
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(p);
    }
    Ok(Baseline {
        single_commits,
        single_elapsed,
        batch_commits,
        batch_elapsed,
    })
}
