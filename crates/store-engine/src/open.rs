//! Opening the database: pragmas and their read-back, schema versions and
//! migrations ([`crate::migrate`]), the integrity check, every record
//! kind's shape and strict decoding, the store's identity, and restart
//! recovery (each kind's own).
//!
//! Nothing here writes to a database it is about to refuse: an existing
//! database is validated through the read-only path `taskgate check` uses
//! before it is opened for writing (which would create its -wal and -shm
//! files), pragmas that persist in the file are only set on a pristine
//! file, and checkpoint-on-close is off so closing a refused database
//! cannot move WAL frames into it.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Duration;

use rusqlite::config::DbConfig;
use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension};

use crate::kind::Kinds;
use crate::migrate::{self, schema_version};
use crate::{Clock, OpenError, Options, StoreId};

/// The page size of every database the engine writes.
pub const PAGE_SIZE: i64 = 4096;
pub const WAL_AUTOCHECKPOINT_PAGES: i64 = 256;
pub const JOURNAL_SIZE_LIMIT_BYTES: i64 = 1024 * 1024;

/// The store's identity (see [`StoreId`]): one row, written when the
/// database is initialised, or by the first start of this version on a
/// store made before it. Older builds of the same schema version never
/// read it, so adding it needs no version of its own.
const IDENTITY_DDL: &str = "
CREATE TABLE IF NOT EXISTS store_identity (
    one INTEGER PRIMARY KEY NOT NULL CHECK (one = 1),
    id  TEXT    NOT NULL CHECK (length(id) = 32)
) STRICT;
";

/// What opening for service did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenReport<R, S> {
    /// A pristine file was initialised.
    pub initialized: bool,
    pub migrated_from: Option<i64>,
    /// What restart recovery ended, every kind's ([`crate::Kinds::Recovery`]).
    pub recovery: R,
    /// Every kind's counts once recovery committed.
    pub status: S,
}

/// What a read-only check found, without writing anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckReport<R, S> {
    /// No database file yet: serve will create it.
    Missing,
    /// An empty file (an interrupted first start): serve will initialise it.
    Pristine,
    /// A valid database; serve would migrate it when `version` is older.
    Valid {
        version: i64,
        /// What restart recovery would end, every kind's.
        recovery: R,
        /// Every kind's counts.
        status: S,
    },
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    Serve,
    ReadOnly,
}

/// Maps an SQLite error met at startup to its refusal class.
fn refusal(path: &Path, during: &'static str, version: i64, e: rusqlite::Error) -> OpenError {
    let path = path.to_path_buf();
    let code = e.sqlite_error_code();
    match code {
        Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => OpenError::Corrupt {
            path,
            detail: e.to_string(),
        },
        Some(
            ErrorCode::SystemIoFailure
            | ErrorCode::DiskFull
            | ErrorCode::CannotOpen
            | ErrorCode::ReadOnly
            | ErrorCode::PermissionDenied
            | ErrorCode::DatabaseBusy
            | ErrorCode::DatabaseLocked
            | ErrorCode::OutOfMemory,
        ) => OpenError::Io {
            path,
            during,
            detail: e.to_string(),
        },
        _ => OpenError::SchemaMismatch {
            path,
            version,
            detail: format!("{during}: {e}"),
        },
    }
}

fn pragma_mismatch(
    path: &Path,
    name: &'static str,
    expected: impl ToString,
    found: impl ToString,
    hint: &'static str,
) -> OpenError {
    OpenError::Pragma {
        path: path.to_path_buf(),
        name,
        expected: expected.to_string(),
        found: found.to_string(),
        hint,
    }
}

/// Sets the per-connection pragmas and reads every one back.
fn apply_pragmas(
    conn: &Connection,
    path: &Path,
    pristine: bool,
    max_pages: u64,
    immutable: bool,
) -> Result<(), OpenError> {
    let err = |e| refusal(path, "setting pragmas", 0, e);
    // Closing a database we refuse must not checkpoint WAL frames into it;
    // a clean shutdown turns this back off after its own checkpoint.
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)
        .map_err(err)?;
    if pristine {
        // These two persist in the file, so they are set only on an empty one.
        conn.pragma_update(None, "page_size", PAGE_SIZE)
            .map_err(err)?;
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(err)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(pragma_mismatch(path, "journal_mode", "wal", mode, ""));
        }
    }
    // An immutable (read-only, lock-free) connection reports "delete";
    // the file header is the truth there.
    let mode: String = if immutable {
        // Reading the schema first makes a file that is not a database
        // fail as such (NOTADB), not as a wrong journal mode.
        conn.query_row("SELECT count(*) FROM sqlite_schema", [], |r| {
            r.get::<_, i64>(0)
        })
        .map_err(err)?;
        header_journal_mode(path)
    } else {
        conn.query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .map_err(err)?
    };
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(pragma_mismatch(
            path,
            "journal_mode",
            "wal",
            mode,
            " (taskgate only writes WAL databases)",
        ));
    }
    let page_size: i64 = conn
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .map_err(err)?;
    if page_size != PAGE_SIZE {
        return Err(pragma_mismatch(path, "page_size", PAGE_SIZE, page_size, ""));
    }

    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(err)?;
    let sync: i64 = conn
        .query_row("PRAGMA synchronous", [], |r| r.get(0))
        .map_err(err)?;
    if sync != 2 {
        return Err(pragma_mismatch(path, "synchronous", "2 (FULL)", sync, ""));
    }

    let pages: i64 = conn
        .query_row(&format!("PRAGMA max_page_count = {max_pages}"), [], |r| {
            r.get(0)
        })
        .map_err(err)?;
    let read: i64 = conn
        .query_row("PRAGMA max_page_count", [], |r| r.get(0))
        .map_err(err)?;
    if pages != max_pages as i64 || read != max_pages as i64 {
        return Err(pragma_mismatch(
            path,
            "max_page_count",
            max_pages,
            read,
            " (the database is larger than store.max_db_pages allows; raise it)",
        ));
    }

    conn.pragma_update(None, "wal_autocheckpoint", WAL_AUTOCHECKPOINT_PAGES)
        .map_err(err)?;
    let ac: i64 = conn
        .query_row("PRAGMA wal_autocheckpoint", [], |r| r.get(0))
        .map_err(err)?;
    if ac != WAL_AUTOCHECKPOINT_PAGES {
        return Err(pragma_mismatch(
            path,
            "wal_autocheckpoint",
            WAL_AUTOCHECKPOINT_PAGES,
            ac,
            "",
        ));
    }

    let jsl: i64 = conn
        .query_row(
            &format!("PRAGMA journal_size_limit = {JOURNAL_SIZE_LIMIT_BYTES}"),
            [],
            |r| r.get(0),
        )
        .map_err(err)?;
    if jsl != JOURNAL_SIZE_LIMIT_BYTES {
        return Err(pragma_mismatch(
            path,
            "journal_size_limit",
            JOURNAL_SIZE_LIMIT_BYTES,
            jsl,
            "",
        ));
    }

    // Zero busy waiting: the lifetime lock means no other writer exists, so
    // a busy database is an error to report, not a reason to wait.
    conn.busy_timeout(Duration::ZERO).map_err(err)?;
    let bt: i64 = conn
        .query_row("PRAGMA busy_timeout", [], |r| r.get(0))
        .map_err(err)?;
    if bt != 0 {
        return Err(pragma_mismatch(path, "busy_timeout", 0, bt, ""));
    }

    // Hardening with no effect on the file: no functions from the schema,
    // and stricter cell checks so corruption is found rather than followed.
    conn.pragma_update(None, "trusted_schema", false)
        .map_err(err)?;
    conn.pragma_update(None, "cell_size_check", true)
        .map_err(err)?;
    Ok(())
}

/// The journal mode recorded in the database header: bytes 18 and 19 are 2
/// for WAL.
fn header_journal_mode(path: &Path) -> String {
    let mut header = [0u8; 20];
    let read =
        std::fs::File::open(path).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut header));
    match read {
        Ok(()) if header[18] == 2 && header[19] == 2 => "wal".into(),
        Ok(()) => "delete".into(),
        Err(_) => "unreadable".into(),
    }
}

/// The production pragmas on a fresh database (a disk baseline measured
/// as the engine would write), with a cap of `max_pages`.
pub fn apply_production_pragmas(
    conn: &Connection,
    path: &Path,
    max_pages: u64,
) -> Result<(), OpenError> {
    apply_pragmas(conn, path, true, max_pages, false)
}

/// `(user_version, number of schema objects)`.
fn classify(conn: &Connection, path: &Path) -> Result<(i64, i64), OpenError> {
    let err = |e| refusal(path, "reading the schema version", 0, e);
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(err)?;
    let objects: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
        .map_err(err)?;
    Ok((version, objects))
}

fn integrity_check(conn: &Connection, path: &Path, version: i64) -> Result<(), OpenError> {
    let mut stmt = conn
        .prepare("PRAGMA integrity_check(3)")
        .map_err(|e| refusal(path, "checking integrity", version, e))?;
    let lines: Vec<String> = stmt
        .query_map([], |r| r.get(0))
        .and_then(|rows| rows.collect())
        .map_err(|e| refusal(path, "checking integrity", version, e))?;
    if lines.len() == 1 && lines[0] == "ok" {
        Ok(())
    } else {
        Err(OpenError::Corrupt {
            path: path.to_path_buf(),
            detail: format!("integrity_check: {}", lines.join("; ")),
        })
    }
}

/// Checks that every kind's tables have the columns this version must
/// have.
fn verify_shape<K: Kinds>(
    conn: &Connection,
    kinds: &K,
    path: &Path,
    version: i64,
) -> Result<(), OpenError> {
    kinds.at(version).into_iter().try_for_each(|kind| {
        kind.verify_shape(conn, version)
            .map_err(|e| refusal(path, "checking the schema", version, e))
    })
}

/// Decodes every record of every kind.
fn decode_all<K: Kinds>(
    conn: &Connection,
    kinds: &K,
    path: &Path,
    version: i64,
) -> Result<(), OpenError> {
    for kind in kinds.at(version) {
        match kind
            .decode_all(conn)
            .map_err(|e| refusal(path, "decoding payloads", version, e))?
        {
            Ok(_) => {}
            Err((record, detail)) => {
                return Err(OpenError::Undecodable {
                    path: path.to_path_buf(),
                    kind: kind.name(),
                    record,
                    detail,
                });
            }
        }
    }
    Ok(())
}

fn in_transaction(
    conn: &Connection,
    path: &Path,
    during: &'static str,
    version: i64,
    body: impl FnOnce(&Connection) -> rusqlite::Result<()>,
) -> Result<(), OpenError> {
    let run = || -> rusqlite::Result<()> {
        conn.execute_batch("BEGIN IMMEDIATE")?;
        body(conn)?;
        conn.execute_batch("COMMIT")
    };
    run().map_err(|e| {
        if !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        refusal(path, during, version, e)
    })
}

fn new_identity(path: &Path) -> Result<StoreId, OpenError> {
    StoreId::generate().map_err(|e| OpenError::Io {
        path: path.to_path_buf(),
        during: "choosing the store identity",
        detail: e.to_string(),
    })
}

fn insert_identity(conn: &Connection, id: &StoreId) -> rusqlite::Result<()> {
    conn.execute_batch(IDENTITY_DDL)?;
    conn.execute(
        "INSERT INTO store_identity (one, id) VALUES (1, ?1) ON CONFLICT DO NOTHING",
        [id.as_str()],
    )
    .map(|_| ())
}

/// The identity the database holds; `None` for a store made before
/// identities existed.
fn read_identity(
    conn: &Connection,
    path: &Path,
    version: i64,
) -> Result<Option<StoreId>, OpenError> {
    let err = |e| refusal(path, "reading the store identity", version, e);
    let tables: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'store_identity'",
            [],
            |r| r.get(0),
        )
        .map_err(err)?;
    if tables == 0 {
        return Ok(None);
    }
    let id: Option<String> = conn
        .query_row("SELECT id FROM store_identity WHERE one = 1", [], |r| {
            r.get(0)
        })
        .optional()
        .map_err(err)?;
    match id {
        None => Ok(None),
        Some(s) => StoreId::parse(&s)
            .map(Some)
            .ok_or_else(|| OpenError::SchemaMismatch {
                path: path.to_path_buf(),
                version,
                detail: format!("store_identity holds a malformed id {s:?}"),
            }),
    }
}

/// Refuses a database that is not the store the state directory recorded:
/// a missing or empty file, another store's database, or one without an
/// identity where one was recorded. Nothing recorded (a directory never
/// served by this version, or a pristine first provisioning) refuses
/// nothing.
fn verify_identity<R, S>(
    path: &Path,
    report: &CheckReport<R, S>,
    found: Option<&StoreId>,
    recorded: Option<&StoreId>,
    recorded_in: &str,
) -> Result<(), OpenError> {
    let Some(expected) = recorded else {
        return Ok(());
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    let found = match (found, report) {
        (Some(id), _) if id == expected => return Ok(()),
        (Some(id), _) => format!("{name} is another store ({id})"),
        (None, CheckReport::Missing) => format!("{name} is missing"),
        (None, CheckReport::Pristine) => format!("{name} is empty"),
        (None, CheckReport::Valid { .. }) => format!("{name} has no store identity"),
    };
    Err(OpenError::Replaced {
        path: path.to_path_buf(),
        expected: expected.clone(),
        found,
        recorded_in: recorded_in.to_string(),
    })
}

/// A pristine file: every migration step and the identity in one
/// transaction.
fn initialize<K: Kinds>(conn: &Connection, path: &Path) -> Result<(), OpenError> {
    let id = new_identity(path)?;
    in_transaction(conn, path, "initialising the schema", 0, |c| {
        migrate::all_after(c, K::STEPS, 0)?;
        insert_identity(c, &id)
    })
}

/// An older database: each missing step in a transaction of its own.
fn migrate<K: Kinds>(conn: &Connection, path: &Path, from: i64) -> Result<(), OpenError> {
    for step in migrate::pending(K::STEPS, from) {
        in_transaction(conn, path, step.what, step.version - 1, |c| {
            migrate::apply(c, step)
        })?;
    }
    Ok(())
}

/// Refuses versions this build cannot serve.
fn check_version<K: Kinds>(path: &Path, version: i64, objects: i64) -> Result<(), OpenError> {
    let supported = schema_version(K::STEPS);
    if version == 0 && objects > 0 {
        return Err(OpenError::Unversioned {
            path: path.to_path_buf(),
        });
    }
    if !(0..=supported).contains(&version) {
        return Err(OpenError::FutureVersion {
            path: path.to_path_buf(),
            found: version,
            supported,
        });
    }
    Ok(())
}

fn open_connection(path: &Path, access: Access) -> Result<Connection, OpenError> {
    let flags = match access {
        Access::Serve => OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
        Access::ReadOnly => OpenFlags::SQLITE_OPEN_READ_ONLY,
    } | OpenFlags::SQLITE_OPEN_NOFOLLOW
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    Connection::open_with_flags(path, flags).map_err(|e| refusal(path, "opening", 0, e))
}

/// Creates the empty database file 0600 before SQLite sees it: SQLite gives
/// its -wal and -shm files the database file's mode.
fn create_private_file(path: &Path) -> Result<(), OpenError> {
    let io = |e: std::io::Error| OpenError::Io {
        path: path.to_path_buf(),
        during: "creating the database file",
        detail: e.to_string(),
    };
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .and_then(|f| f.sync_all())
        .map_err(io)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io)?;
    }
    Ok(())
}

fn file_len(path: &Path) -> Option<u64> {
    std::fs::symlink_metadata(path).ok().map(|m| m.len())
}

/// A database validated, initialised or migrated, and not yet recovered.
pub(crate) struct Prepared<K: Kinds> {
    pub(crate) conn: Connection,
    pub(crate) initialized: bool,
    pub(crate) migrated_from: Option<i64>,
    /// What restart recovery is about to end, every kind's.
    pub(crate) recovery: K::Recovery,
    pub(crate) identity: StoreId,
}

/// Opening for service, first half: validates without writing, then
/// initialises or migrates. A database that is refused is left exactly as
/// it was: every validation runs through the read-only path `taskgate check`
/// uses before the file is opened for writing (which creates the -wal and
/// -shm files).
pub(crate) fn prepare<K: Kinds>(options: &Options, kinds: &K) -> Result<Prepared<K>, OpenError> {
    let path = options.db_path.as_path();
    let len = file_len(path);
    let (report, found) = check_read_only_at(path, options.max_db_pages, &options.clock, kinds)?;
    verify_identity(
        path,
        &report,
        found.as_ref(),
        options.expected_identity.as_ref(),
        &options.identity_recorded_in,
    )?;
    let validated = matches!(report, CheckReport::Valid { .. });
    if len.is_none() {
        create_private_file(path)?;
    }
    let empty_file = len.unwrap_or(0) == 0;
    let conn = open_connection(path, Access::Serve)?;
    apply_pragmas(&conn, path, empty_file, options.max_db_pages, false)?;
    let (version, objects) = classify(&conn, path)?;
    check_version::<K>(path, version, objects)?;
    let latest = schema_version(K::STEPS);

    let mut initialized = false;
    let mut migrated_from = None;
    if version == 0 {
        // Pristine: no schema objects at all. Left by an interrupted first
        // start; we hold the lifetime lock, so finishing it is safe.
        initialize::<K>(&conn, path)?;
        initialized = true;
    } else {
        if !validated {
            // Unreachable in practice (a non-empty versioned file was
            // validated above); kept so no path serves an unchecked file.
            integrity_check(&conn, path, version)?;
            verify_shape(&conn, kinds, path, version)?;
            decode_all(&conn, kinds, path, version)?;
        }
        if version < latest {
            migrate::<K>(&conn, path, version)?;
            migrated_from = Some(version);
        }
    }
    verify_shape(&conn, kinds, path, latest)?;
    let recorded = read_identity(&conn, path, latest)?;
    // A store made before identities existed gets one now; it is recorded
    // beside the database once opening succeeds.
    let identity = match &recorded {
        Some(id) => id.clone(),
        None => new_identity(path)?,
    };
    in_transaction(
        &conn,
        path,
        "creating unversioned schema objects",
        latest,
        |c| {
            if recorded.is_none() {
                insert_identity(c, &identity)?;
            }
            kinds.all().into_iter().try_for_each(|kind| kind.ensure(c))
        },
    )?;
    let recovery = kinds
        .pending_recovery(&conn, latest)
        .map_err(|e| refusal(path, "listing unfinished work", latest, e))?;
    Ok(Prepared {
        conn,
        initialized,
        migrated_from,
        recovery,
        identity,
    })
}

/// Opening for service, second half: restart recovery, every kind's in one
/// transaction (each kind decides what ends and how; nothing is run
/// again). Then the kinds load their counters and report their counts.
pub(crate) fn recover<K: Kinds>(
    prepared: &Prepared<K>,
    options: &Options,
    kinds: &mut K,
) -> Result<OpenReport<K::Recovery, K::Status>, OpenError> {
    let path = options.db_path.as_path();
    let conn = &prepared.conn;
    let now = options.clock.now_ms();
    let latest = schema_version(K::STEPS);
    in_transaction(conn, path, "recovering interrupted work", latest, |c| {
        kinds.recover(c, now)
    })?;
    kinds
        .load(conn, now)
        .map_err(|e| refusal(path, "counting records", latest, e))?;
    let status = kinds
        .status(conn, latest, now)
        .map_err(|e| refusal(path, "counting records", latest, e))?;
    Ok(OpenReport {
        initialized: prepared.initialized,
        migrated_from: prepared.migrated_from,
        recovery: prepared.recovery.clone(),
        status,
    })
}

/// The path part of an SQLite `file:` URI. SQLite decodes `%HH` escapes
/// back to bytes, so every byte other than an unreserved ASCII character or
/// `/` is escaped: the path's bytes, whatever their encoding, reach the
/// file system unchanged.
fn uri_path(path: &Path) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    for &b in path.as_os_str().as_encoded_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'/' | b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The counts and pending recovery of every kind, for the application's
/// read-only check.
pub type Checked<K> = CheckReport<<K as Kinds>::Recovery, <K as Kinds>::Status>;

/// Runs every validation of opening without writing: for a read-only check
/// and for verifying backups. No file is created or changed: without WAL
/// frames the database is opened immutable; with frames (a crash left
/// them) SQLite needs a -shm index, and any -shm or -wal it creates for
/// that is removed afterwards.
pub fn check_read_only<K: Kinds>(
    db_path: &Path,
    max_db_pages: u64,
    clock: &Clock,
    kinds: &K,
) -> Result<Checked<K>, OpenError> {
    check_read_only_at(db_path, max_db_pages, clock, kinds).map(|(report, _)| report)
}

/// [`check_read_only`] that also returns the database's identity, and
/// refuses, as opening would, a database that is not the store `recorded`
/// names (what the application recorded beside it, in `recorded_in`).
pub fn check_identified<K: Kinds>(
    db_path: &Path,
    max_db_pages: u64,
    clock: &Clock,
    kinds: &K,
    recorded: Option<&StoreId>,
    recorded_in: &str,
) -> Result<(Checked<K>, Option<StoreId>), OpenError> {
    let (report, found) = check_read_only_at(db_path, max_db_pages, clock, kinds)?;
    verify_identity(db_path, &report, found.as_ref(), recorded, recorded_in)?;
    Ok((report, found))
}

fn check_read_only_at<K: Kinds>(
    db_path: &Path,
    max_db_pages: u64,
    clock: &Clock,
    kinds: &K,
) -> Result<(Checked<K>, Option<StoreId>), OpenError> {
    match file_len(db_path) {
        None => return Ok((CheckReport::Missing, None)),
        Some(0) => return Ok((CheckReport::Pristine, None)),
        Some(_) => {}
    }
    let sidecar = |suffix: &str| {
        let mut p = db_path.as_os_str().to_owned();
        p.push(suffix);
        std::path::PathBuf::from(p)
    };
    let (wal, shm) = (sidecar("-wal"), sidecar("-shm"));
    let wal_existed = file_len(&wal);
    let shm_existed = file_len(&shm).is_some();
    let immutable = wal_existed.unwrap_or(0) == 0;
    let result = if immutable {
        let uri = format!("file:{}?immutable=1", uri_path(db_path));
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NOFOLLOW
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        Connection::open_with_flags(&uri, flags)
            .map_err(|e| refusal(db_path, "opening", 0, e))
            .and_then(|conn| validate_read_only(&conn, db_path, max_db_pages, true, clock, kinds))
    } else {
        open_connection(db_path, Access::ReadOnly)
            .and_then(|conn| validate_read_only(&conn, db_path, max_db_pages, false, clock, kinds))
    };
    if wal_existed.is_none() && file_len(&wal) == Some(0) {
        let _ = std::fs::remove_file(&wal);
    }
    if !shm_existed {
        let _ = std::fs::remove_file(&shm);
    }
    result
}

fn validate_read_only<K: Kinds>(
    conn: &Connection,
    db_path: &Path,
    max_db_pages: u64,
    immutable: bool,
    clock: &Clock,
    kinds: &K,
) -> Result<(Checked<K>, Option<StoreId>), OpenError> {
    apply_pragmas(conn, db_path, false, max_db_pages, immutable)?;
    let (version, objects) = classify(conn, db_path)?;
    check_version::<K>(db_path, version, objects)?;
    if version == 0 {
        return Ok((CheckReport::Pristine, None));
    }
    integrity_check(conn, db_path, version)?;
    verify_shape(conn, kinds, db_path, version)?;
    decode_all(conn, kinds, db_path, version)?;
    let recovery = kinds
        .pending_recovery(conn, version)
        .map_err(|e| refusal(db_path, "counting records", version, e))?;
    let status = kinds
        .status(conn, version, clock.now_ms())
        .map_err(|e| refusal(db_path, "counting records", version, e))?;
    let identity = read_identity(conn, db_path, version)?;
    Ok((
        CheckReport::Valid {
            version,
            recovery,
            status,
        },
        identity,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uri_paths_escape_bytes_not_characters() {
        assert_eq!(
            uri_path(Path::new("/tmp/ü/a b?#%/store.db")),
            "/tmp/%C3%BC/a%20b%3F%23%25/store.db"
        );
    }
}
