//! The task records: the `tasks` table's DDL (as migration steps), its
//! SQL, the record types, the task operations of [`Store`], the per-owner
//! and global live-task limits, the expiry sweep and restart recovery.
//! Functions here run on the store thread only; the `Store` methods at the
//! end turn each operation into a command for it.

use std::sync::LazyLock;
use std::sync::atomic::Ordering;

use rusqlite::types::Type;
use rusqlite::{Connection, OptionalExtension, Row, named_params, params};
use taskgate_store_engine::{Holds, NextExpiry, RecordKind, Report, Tx};

use super::digest::Digest;
use super::error::{CapacityKind, StoreError};
use super::handle::{Registry, Store, StoreOptions};
use super::outcome::{Outcome, TaskStatus};
use super::table::Table;
use crate::testhooks;

type OpError = taskgate_store_engine::OpError<StoreError>;

/// Largest encoded terminal payload a record may hold (16 KiB); larger
/// results are spilled to artifacts.
pub const MAX_PAYLOAD_BYTES: usize = 16 * 1024;
/// A terminal task stays readable at least this long after it finished.
pub const TERMINAL_RETENTION_MS: i64 = 3_600_000;

/// Counts reported in systemd's STATUS= line and by `/readyz`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreStats {
    pub retained: u64,
    pub unexpired: u64,
}

pub use crate::ids::TaskId;

/// A task as stored, without the digests it is looked up by.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskRecord {
    pub id: TaskId,
    pub status: TaskStatus,
    pub status_message: Option<String>,
    pub created_ms: i64,
    pub updated_ms: i64,
    pub expires_ms: i64,
    pub poll_interval_ms: i64,
    pub outcome: Option<Outcome>,
    pub cancel_requested: bool,
    /// For a task that waits on an approval: the proposal and the journal
    /// sequence it last projected.
    pub proposal: Option<ProposalRef>,
}

/// The approval proposal a task projects, and how far into the approval
/// journal its projection reaches: a journal shorter than that is missing
/// evidence the task was built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProposalRef {
    pub id: String,
    pub seq: u64,
}

impl TaskRecord {
    /// Time to live as the protocol reports it: relative to creation.
    pub fn ttl_ms(&self) -> i64 {
        self.expires_ms - self.created_ms
    }
}

/// What a creation asks for.
#[derive(Debug, Clone)]
pub struct NewTask {
    pub owner: Digest,
    /// The creation reference (an operation identity chosen by the client).
    pub reference: Option<Digest>,
    /// The identity of the request (tool and canonical arguments): a repeat
    /// of `reference` with another request is a conflict.
    pub request: Option<Digest>,
    pub ttl_ms: i64,
    pub poll_interval_ms: i64,
    /// A task that waits on this approval proposal (one per owner and
    /// proposal: a repeat returns the existing task).
    pub proposal: Option<ProposalRef>,
}

/// The answer to a creation.
#[derive(Debug, Clone, PartialEq)]
pub enum Created {
    New(TaskRecord),
    /// The owner already created a task under this reference: its handle.
    Existing(TaskRecord),
}

impl Created {
    pub fn record(&self) -> &TaskRecord {
        match self {
            Created::New(r) | Created::Existing(r) => r,
        }
    }
}

// ------------------------------------------------------------------ schema --

/// Migration step 1: generic tasks with an optional creation reference.
pub(super) fn create_table(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "CREATE TABLE tasks (
    id               TEXT    PRIMARY KEY NOT NULL,
    owner            BLOB    NOT NULL CHECK (length(owner) = 32),
    reference        BLOB    CHECK (reference IS NULL OR length(reference) = 32),
    request          BLOB    CHECK (request IS NULL OR length(request) = 32),
    status           TEXT    NOT NULL CHECK (status IN ('working','input_required','completed','failed','cancelled')),
    status_message   TEXT,
    created_ms       INTEGER NOT NULL,
    updated_ms       INTEGER NOT NULL,
    expires_ms       INTEGER NOT NULL,
    poll_interval_ms INTEGER NOT NULL,
    payload          BLOB,
    cancel_requested INTEGER NOT NULL DEFAULT 0
) STRICT;
CREATE UNIQUE INDEX tasks_owner_reference ON tasks (owner, reference) WHERE reference IS NOT NULL;
CREATE INDEX tasks_expires ON tasks (expires_ms);",
    )
}

/// Migration step 2: the optional approval-proposal reference (for tasks
/// that wait on an administrator's approval). A crash between its two
/// statements must leave version 1 (the step's transaction).
pub(super) fn add_proposal(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch("ALTER TABLE tasks ADD COLUMN proposal TEXT")?;
    testhooks::crash_point(testhooks::CRASH_MID_MIGRATION);
    conn.execute_batch(
        "CREATE UNIQUE INDEX tasks_owner_proposal ON tasks (owner, proposal) WHERE proposal IS NOT NULL",
    )
}

/// Migration step 4: the approval-journal sequence an approval task last
/// projected.
pub(super) fn add_proposal_seq(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch("ALTER TABLE tasks ADD COLUMN proposal_seq INTEGER")
}

/// Tasks by owner and expiry, for the per-owner limit. It needs no schema
/// version: older builds of this version neither read nor mind it.
const OWNER_INDEX_DDL: &str =
    "CREATE INDEX IF NOT EXISTS tasks_owner_expires ON tasks (owner, expires_ms)";

// ------------------------------------------------------------ the kind --

/// The tasks kind's state on the store thread: the limits creation
/// enforces and the row count that spares counting on every creation.
pub struct Tasks {
    max_live: u64,
    max_live_per_owner: u64,
    /// Rows in the table as of the last commit.
    rows: u64,
    /// Rows added (or, negative, deleted) by the transaction in progress.
    pending: i64,
    /// Rows the sweep of the transaction in progress deleted (part of
    /// `pending`, given back if that sweep is undone).
    swept: u64,
    /// When the next row can expire, so that sweeps with nothing due are
    /// skipped.
    expiry: NextExpiry,
}

impl Tasks {
    pub(super) fn new(options: &StoreOptions) -> Tasks {
        Tasks {
            max_live: options.settings.max_live_tasks,
            max_live_per_owner: options.settings.max_live_tasks_per_owner,
            rows: 0,
            pending: 0,
            swept: 0,
            expiry: NextExpiry::unknown(),
        }
    }

    /// Rows in the table as the transaction in progress sees it.
    fn rows_now(&self) -> u64 {
        (self.rows as i64 + self.pending).max(0) as u64
    }
}

/// What restart recovery ends of the tasks kind (or, for `check`, would).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskRecovery {
    /// Tasks that were working when the last process stopped: each ends
    /// failed (interrupted) or cancelled, none is run again.
    pub unfinished: Vec<TaskId>,
    /// Of those, the ones whose cancel was committed: they end cancelled.
    pub cancel_requested: u64,
    /// Approval tasks still waiting on the approval journal (recovery
    /// leaves them to it).
    pub awaiting_approval: u64,
    /// The highest journal sequence one of them recorded.
    pub approval_seq: u64,
}

impl Report for TaskRecovery {
    fn lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        let nonterminal = self.unfinished.len() as u64;
        if nonterminal > 0 {
            lines.push(format!(
                "note: {nonterminal} tasks were running at the last stop; serve ends them and never re-runs them: {} failed (interrupted), {} cancelled (their cancel had been acknowledged)",
                nonterminal - self.cancel_requested,
                self.cancel_requested
            ));
        }
        if self.awaiting_approval > 0 {
            lines.push(format!(
                "note: {} approval tasks wait on the approval journal (they recorded it up to record {})",
                self.awaiting_approval, self.approval_seq
            ));
        }
        lines
    }

    fn ended(&self) -> Vec<String> {
        let ended = self.unfinished.len() as u64;
        if ended == 0 {
            return Vec::new();
        }
        vec![format!(
            "{ended} tasks running at the last stop ended: {} failed (interrupted), {} cancelled (their cancel had been committed); none was re-run",
            ended - self.cancel_requested,
            self.cancel_requested
        )]
    }
}

/// The tasks a store holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TaskCounts {
    pub retained: u64,
    pub unexpired: u64,
}

impl Report for TaskCounts {}

impl RecordKind for Tasks {
    type Recovery = TaskRecovery;
    type Status = TaskCounts;

    fn name(&self) -> &'static str {
        "task"
    }

    fn since(&self) -> i64 {
        1
    }

    fn verify_shape(&self, conn: &Connection, version: i64) -> rusqlite::Result<()> {
        let extra = match version {
            ..=1 => "",
            2..=3 => ", proposal",
            _ => ", proposal, proposal_seq",
        };
        conn.prepare(&format!(
            "SELECT {COLUMNS}, owner, reference, request{extra} FROM tasks LIMIT 0"
        ))
        .map(|_| ())
    }

    fn decode_all(&self, conn: &Connection) -> rusqlite::Result<Result<u64, (String, String)>> {
        TABLE.decode_all(conn, decode_row)
    }

    fn ensure(&self, conn: &Connection) -> rusqlite::Result<()> {
        conn.execute_batch(OWNER_INDEX_DDL)
    }

    fn pending_recovery(&self, conn: &Connection, version: i64) -> rusqlite::Result<TaskRecovery> {
        let unfinished = unfinished(conn, version)?;
        let waiting = count_nonterminal(conn, version)?;
        Ok(TaskRecovery {
            cancel_requested: unfinished.iter().filter(|u| u.cancel_requested).count() as u64,
            unfinished: unfinished.into_iter().map(|u| u.id).collect(),
            awaiting_approval: waiting.awaiting_approval,
            approval_seq: waiting.approval_seq,
        })
    }

    fn recover(&mut self, conn: &Connection, now: i64) -> rusqlite::Result<()> {
        end_unfinished(conn, now)
    }

    fn status(&self, conn: &Connection, _version: i64, now: i64) -> rusqlite::Result<TaskCounts> {
        let (retained, unexpired) = counts(conn, now)?;
        Ok(TaskCounts {
            retained,
            unexpired,
        })
    }

    fn load(&mut self, conn: &Connection, _now: i64) -> rusqlite::Result<()> {
        self.rows = count_all(conn)?;
        self.pending = 0;
        self.swept = 0;
        self.expiry.load(conn, "tasks")
    }

    fn sweep(&mut self, conn: &Connection, now: i64, limit: u32) -> rusqlite::Result<u64> {
        if !self.expiry.is_due(now) {
            return Ok(0);
        }
        let n = TABLE.delete_expired(conn, now, limit)?;
        self.pending -= n as i64;
        self.swept += n;
        self.expiry.swept(conn, "tasks")?;
        Ok(n)
    }

    fn sweep_undone(&mut self) {
        self.pending += std::mem::take(&mut self.swept) as i64;
        self.expiry.rolled_back();
    }

    fn committed(&mut self) {
        self.rows = self.rows_now();
        self.pending = 0;
        self.swept = 0;
        self.expiry.committed();
    }

    fn rolled_back(&mut self) {
        self.pending = 0;
        self.swept = 0;
        self.expiry.rolled_back();
    }
}

// ------------------------------------------------------------- records --

/// Columns every schema version has, in the order `decode_row` reads them.
const COLUMNS: &str = "id, status, status_message, created_ms, updated_ms, expires_ms, poll_interval_ms, payload, cancel_requested";

/// [`COLUMNS`] and the approval proposal, for reads of a serving store
/// (always at the latest schema).
const SERVED: &str = "id, status, status_message, created_ms, updated_ms, expires_ms, poll_interval_ms, payload, cancel_requested, proposal, proposal_seq";

const NONTERMINAL: &str = "('working','input_required')";

/// The statements the tasks table shares with every kind's.
static TABLE: LazyLock<Table> = LazyLock::new(|| Table::new("tasks", SERVED, COLUMNS));

fn conversion(col: usize, t: Type, msg: String) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(col, t, msg.into())
}

/// Reads one row, decoding status and payload; an inconsistent row is an
/// error, which at startup refuses the database.
fn decode_row(row: &Row<'_>) -> rusqlite::Result<TaskRecord> {
    let id_text: String = row.get(0)?;
    let id = TaskId::parse(&id_text)
        .map_err(|_| conversion(0, Type::Text, format!("malformed task id {id_text:?}")))?;
    let status_text: String = row.get(1)?;
    let status = TaskStatus::parse(&status_text)
        .ok_or_else(|| conversion(1, Type::Text, format!("unknown status {status_text:?}")))?;
    let payload: Option<Vec<u8>> = row.get(7)?;
    let outcome = match payload {
        None => None,
        Some(bytes) => {
            if bytes.len() > MAX_PAYLOAD_BYTES {
                return Err(conversion(
                    7,
                    Type::Blob,
                    format!("payload of {} bytes exceeds the record limit", bytes.len()),
                ));
            }
            Some(
                serde_json::from_slice::<Outcome>(&bytes)
                    .map_err(|e| conversion(7, Type::Blob, e.to_string()))?,
            )
        }
    };
    let consistent = matches!(
        (status, &outcome),
        (TaskStatus::Working | TaskStatus::InputRequired, None)
            | (TaskStatus::Completed, Some(Outcome::Result(_)))
            | (TaskStatus::Failed, Some(Outcome::Error(_)))
            | (TaskStatus::Cancelled, _)
    );
    if !consistent {
        return Err(conversion(
            7,
            Type::Blob,
            format!("payload does not fit status {}", status.as_str()),
        ));
    }
    let proposal = if row.as_ref().column_name(9).ok() == Some("proposal") {
        match (
            row.get::<_, Option<String>>(9)?,
            row.get::<_, Option<i64>>(10)?,
        ) {
            (Some(id), seq) => Some(ProposalRef {
                id,
                seq: seq.unwrap_or(0).max(0) as u64,
            }),
            (None, _) => None,
        }
    } else {
        None
    };
    Ok(TaskRecord {
        proposal,
        id,
        status,
        status_message: row.get(2)?,
        created_ms: row.get(3)?,
        updated_ms: row.get(4)?,
        expires_ms: row.get(5)?,
        poll_interval_ms: row.get(6)?,
        outcome,
        cancel_requested: row.get::<_, i64>(8)? != 0,
    })
}

/// What an approval task says while it waits: the proposal it waits on is
/// named, so that its caller can tell an administrator what to approve (a
/// proposal ID says nothing of the call's arguments).
pub fn waiting_for_approval(proposal: &str) -> String {
    format!(
        "waiting for an administrator to approve this exact call as proposal {proposal}; nothing has run"
    )
}

fn insert(conn: &Connection, id: &TaskId, new: &NewTask, now: i64) -> rusqlite::Result<TaskRecord> {
    let expires = now.saturating_add(new.ttl_ms);
    let status_message = new.proposal.as_ref().map(|p| waiting_for_approval(&p.id));
    conn.prepare_cached(
        "INSERT INTO tasks (id, owner, reference, request, status, status_message, created_ms, updated_ms, expires_ms, poll_interval_ms, payload, cancel_requested, proposal, proposal_seq)
         VALUES (?1, ?2, ?3, ?4, 'working', ?8, ?5, ?5, ?6, ?7, NULL, 0, ?9, ?10)",
    )?
    .execute(params![
        id.as_str(),
        &new.owner.0[..],
        new.reference.as_ref().map(|d| d.0.to_vec()),
        new.request.as_ref().map(|d| d.0.to_vec()),
        now,
        expires,
        new.poll_interval_ms,
        status_message.as_deref(),
        new.proposal.as_ref().map(|p| p.id.as_str()),
        new.proposal.as_ref().map(|p| p.seq as i64),
    ])?;
    Ok(TaskRecord {
        proposal: new.proposal.clone(),
        id: id.clone(),
        status: TaskStatus::Working,
        status_message,
        created_ms: now,
        updated_ms: now,
        expires_ms: expires,
        poll_interval_ms: new.poll_interval_ms,
        outcome: None,
        cancel_requested: false,
    })
}

/// The owner's unexpired task.
fn find_owned(
    conn: &Connection,
    id: &TaskId,
    owner: &Digest,
    now: i64,
) -> rusqlite::Result<Option<TaskRecord>> {
    TABLE.find_owned(conn, id.as_str(), owner, now, decode_row)
}

/// An unexpired task by ID alone (the executor's own view).
fn find_unexpired(
    conn: &Connection,
    id: &TaskId,
    now: i64,
) -> rusqlite::Result<Option<TaskRecord>> {
    TABLE.find_unexpired(conn, id.as_str(), now, decode_row)
}

/// The owner's unexpired task waiting on `proposal`.
fn find_by_proposal(
    conn: &Connection,
    owner: &Digest,
    proposal: &str,
    now: i64,
) -> rusqlite::Result<Option<TaskRecord>> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!("SELECT {SERVED} FROM tasks WHERE owner = ?1 AND proposal = ?2 AND expires_ms > ?3")
    });
    conn.prepare_cached(&SQL)?
        .query_row(params![&owner.0[..], proposal, now], decode_row)
        .optional()
}

/// A task found by its creation reference.
struct ByReference {
    record: TaskRecord,
    /// The request digest the task was created for.
    request: Option<Vec<u8>>,
    expired: bool,
}

/// The task created under the owner's reference, expired or not.
fn find_by_reference(
    conn: &Connection,
    owner: &Digest,
    reference: &Digest,
    now: i64,
) -> rusqlite::Result<Option<ByReference>> {
    conn.prepare_cached(&format!(
        "SELECT {COLUMNS}, request, expires_ms <= ?3 FROM tasks WHERE owner = ?1 AND reference = ?2"
    ))?
    .query_row(params![&owner.0[..], &reference.0[..], now], |row| {
        Ok(ByReference {
            record: decode_row(row)?,
            request: row.get(9)?,
            expired: row.get(10)?,
        })
    })
    .optional()
}

fn delete(conn: &Connection, id: &TaskId) -> rusqlite::Result<usize> {
    conn.prepare_cached("DELETE FROM tasks WHERE id = ?1")?
        .execute(params![id.as_str()])
}

/// Keeps the original expiry unless the task would expire less than
/// [`TERMINAL_RETENTION_MS`] after finishing; never revives an expired row.
const RETAIN: &str = "expires_ms = CASE WHEN expires_ms > :now THEN MAX(expires_ms, :now + :retain) ELSE expires_ms END";

/// The conditional terminal transition. Returns the task as it stands.
fn finish(
    conn: &Connection,
    id: &TaskId,
    status: TaskStatus,
    payload: Option<&[u8]>,
    seq: Option<u64>,
    now: i64,
) -> rusqlite::Result<Option<TaskRecord>> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "UPDATE tasks SET status = :status, payload = :payload, updated_ms = :now, {RETAIN},
               status_message = CASE WHEN proposal IS NULL THEN status_message ELSE NULL END,
               proposal_seq = coalesce(:seq, proposal_seq)
             WHERE id = :id AND status IN {NONTERMINAL} AND expires_ms > :now
             RETURNING {SERVED}"
        )
    });
    let updated = conn
        .prepare_cached(&SQL)?
        .query_row(
            named_params! {
                ":status": status.as_str(),
                ":payload": payload,
                ":now": now,
                ":retain": TERMINAL_RETENTION_MS,
                ":id": id.as_str(),
                ":seq": seq.map(|s| s as i64),
            },
            decode_row,
        )
        .optional()?;
    match updated {
        Some(record) => Ok(Some(record)),
        // Already terminal (or expired): the stored outcome stands.
        None => find_unexpired(conn, id, now),
    }
}

/// Records the cancel intent on the owner's nonterminal task.
fn request_cancel(
    conn: &Connection,
    id: &TaskId,
    owner: &Digest,
    now: i64,
) -> rusqlite::Result<Option<TaskRecord>> {
    conn.prepare_cached(&format!(
        "UPDATE tasks SET cancel_requested = 1, updated_ms = ?3
         WHERE id = ?1 AND owner = ?2 AND expires_ms > ?3 AND status IN {NONTERMINAL} AND cancel_requested = 0"
    ))?
    .execute(params![id.as_str(), &owner.0[..], now])?;
    find_owned(conn, id, owner, now)
}

fn count_all(conn: &Connection) -> rusqlite::Result<u64> {
    conn.query_row("SELECT count(*) FROM tasks", [], |r| r.get::<_, i64>(0))
        .map(|n| n as u64)
}

fn count_expired(conn: &Connection, now: i64) -> rusqlite::Result<u64> {
    conn.prepare_cached("SELECT count(*) FROM tasks WHERE expires_ms <= ?1")?
        .query_row(params![now], |r| r.get::<_, i64>(0))
        .map(|n| n as u64)
}

/// Unexpired tasks of one owner (read from `tasks_owner_expires`).
fn count_live_of(conn: &Connection, owner: &Digest, now: i64) -> rusqlite::Result<u64> {
    conn.prepare_cached("SELECT count(*) FROM tasks WHERE owner = ?1 AND expires_ms > ?2")?
        .query_row(params![&owner.0[..], now], |r| r.get::<_, i64>(0))
        .map(|n| n as u64)
}

/// The tasks that were not finished at the last stop, as `check` tells them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Nonterminal {
    /// Tasks restart recovery ends (approval tasks are not among them).
    pub ended: u64,
    /// Of those, the ones whose cancel was committed.
    pub cancel_requested: u64,
    /// Approval tasks still waiting on the approval journal.
    pub awaiting_approval: u64,
    /// The highest journal sequence a waiting approval task recorded: a
    /// journal that ends before it is older than the task store.
    pub approval_seq: u64,
}

/// The unfinished tasks of a database at schema `version`.
fn count_nonterminal(conn: &Connection, version: i64) -> rusqlite::Result<Nonterminal> {
    let generic = if version >= 2 {
        "AND proposal IS NULL"
    } else {
        ""
    };
    let (ended, cancel_requested) = conn.query_row(
        &format!(
            "SELECT count(*), coalesce(sum(cancel_requested != 0), 0) FROM tasks WHERE status IN {NONTERMINAL} {generic}"
        ),
        [],
        |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64)),
    )?;
    let (awaiting_approval, approval_seq) = match version {
        ..=1 => (0, 0),
        2..=3 => (
            conn.query_row(
                &format!(
                    "SELECT count(*) FROM tasks WHERE status IN {NONTERMINAL} AND proposal IS NOT NULL"
                ),
                [],
                |r| r.get::<_, i64>(0),
            )? as u64,
            0,
        ),
        _ => conn.query_row(
            &format!(
                "SELECT count(*), coalesce(max(proposal_seq), 0) FROM tasks WHERE status IN {NONTERMINAL} AND proposal IS NOT NULL"
            ),
            [],
            |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)?.max(0) as u64)),
        )?,
    };
    Ok(Nonterminal {
        ended,
        cancel_requested,
        awaiting_approval,
        approval_seq,
    })
}

/// A task that was working when the last process stopped.
struct Unfinished {
    id: TaskId,
    cancel_requested: bool,
}

/// The tasks restart recovery ends in a database at `version` (approval
/// tasks are not among them).
fn unfinished(conn: &Connection, version: i64) -> rusqlite::Result<Vec<Unfinished>> {
    let generic = if version >= 2 {
        "AND proposal IS NULL"
    } else {
        ""
    };
    let mut stmt = conn.prepare(&format!(
        "SELECT id, cancel_requested FROM tasks WHERE status IN {NONTERMINAL} {generic} ORDER BY id"
    ))?;
    let rows = stmt.query_map([], |row| {
        let text: String = row.get(0)?;
        let id = TaskId::parse(&text)
            .map_err(|_| conversion(0, Type::Text, format!("malformed task id {text:?}")))?;
        Ok(Unfinished {
            id,
            cancel_requested: row.get::<_, i64>(1)? != 0,
        })
    })?;
    rows.collect()
}

/// Restart recovery: every nonterminal task ends and nothing is re-run. A
/// task whose cancel was committed ends cancelled, the rest fail with the
/// interruption error.
fn end_unfinished(conn: &Connection, now: i64) -> rusqlite::Result<()> {
    conn.execute(
        &format!(
            "UPDATE tasks SET status = 'cancelled', status_message = 'cancelled as requested; the daemon stopped before the tool ended', payload = NULL, updated_ms = :now, {RETAIN}
             WHERE status IN {NONTERMINAL} AND cancel_requested = 1 AND proposal IS NULL"
        ),
        named_params! { ":now": now, ":retain": TERMINAL_RETENTION_MS },
    )?;
    let payload = Outcome::interrupted().encode();
    conn.execute(
        &format!(
            "UPDATE tasks SET status = 'failed', status_message = 'interrupted by a restart; not run again', payload = :payload, updated_ms = :now, {RETAIN}
             WHERE status IN {NONTERMINAL} AND proposal IS NULL"
        ),
        named_params! { ":payload": payload, ":now": now, ":retain": TERMINAL_RETENTION_MS },
    )?;
    Ok(())
}

// --------------------------------------------------- reports at opening --

/// `(retained, unexpired)` tasks.
fn counts(conn: &Connection, now: i64) -> rusqlite::Result<(u64, u64)> {
    let retained = count_all(conn)?;
    let expired = count_expired(conn, now)?;
    Ok((retained, retained.saturating_sub(expired)))
}

// ----------------------------------------------------- the operations --

/// A creation inside the batch's transaction: the owner's existing task
/// for the same reference, or a new one within the live-task limits.
fn create<K: Holds<Tasks>>(tx: &mut Tx<'_, K>, new: &NewTask) -> Result<Created, OpError> {
    let (c, now) = (tx.conn, tx.now);
    let mut delta = 0;
    if let Some(p) = &new.proposal
        && let Some(record) = find_by_proposal(c, &new.owner, &p.id, now)?
    {
        return Ok(Created::Existing(record));
    }
    let existing = match &new.reference {
        Some(reference) => find_by_reference(c, &new.owner, reference, now)?,
        None => None,
    };
    if let Some(found) = existing {
        if !found.expired {
            let same = found.request.as_deref() == new.request.as_ref().map(|d| &d.0[..]);
            return if same {
                Ok(Created::Existing(found.record))
            } else {
                Err(OpError::Refused(StoreError::Conflict))
            };
        }
        // An expired task no longer holds its reference.
        delete(c, &found.record.id)?;
        delta -= 1;
    }
    let tasks = tx.kinds.kind_mut();
    let limit = tasks.max_live;
    let rows = (tasks.rows_now() as i64 + delta).max(0) as u64;
    if rows >= limit {
        // Expired rows awaiting cleanup do not count against the limit.
        let live = rows.saturating_sub(count_expired(c, now)?);
        if live >= limit {
            return Err(OpError::Refused(StoreError::Capacity(
                CapacityKind::LiveTasks { limit },
            )));
        }
    }
    let per_owner = tasks.max_live_per_owner;
    if per_owner < limit && count_live_of(c, &new.owner, now)? >= per_owner {
        return Err(OpError::Refused(StoreError::Capacity(
            CapacityKind::OwnerTasks { limit: per_owner },
        )));
    }
    let id = TaskId::generate()
        .map_err(|e| OpError::Refused(StoreError::Internal(format!("random source: {e}"))))?;
    let record = insert(c, &id, new, now)?;
    tasks.pending += delta + 1;
    tasks.expiry.added(record.expires_ms);
    Ok(Created::New(record))
}

impl<K: Registry + Holds<Tasks>> Store<K> {
    /// Creates a task, or returns the owner's existing task for the same
    /// creation reference.
    pub async fn create(&self, new: NewTask) -> Result<Created, StoreError> {
        if new.ttl_ms <= 0 || new.poll_interval_ms <= 0 {
            return Err(StoreError::Invalid(
                "ttl and poll interval must be positive".into(),
            ));
        }
        self.write_op("writing a task", true, move |tx| create(tx, &new))
            .await
    }

    /// The owner's unexpired task, or `None` for unknown, expired and
    /// another owner's IDs alike.
    pub async fn get(&self, id: &TaskId, owner: &Digest) -> Result<Option<TaskRecord>, StoreError> {
        let (id, owner) = (id.clone(), *owner);
        self.task_reads.fetch_add(1, Ordering::Relaxed);
        self.read_op("reading a task", move |cx| {
            Ok(find_owned(cx.conn, &id, &owner, cx.now)?)
        })
        .await
    }

    /// The owner's unexpired task created under `reference`, read without
    /// creating anything: `None` when there is none, `Conflict` when it was
    /// created for another request. A retry is answered from this when the
    /// call could not be admitted as new (every slot busy, the owner at its
    /// limit), so that it still gets its task.
    pub async fn find_reference(
        &self,
        owner: &Digest,
        reference: &Digest,
        request: Option<&Digest>,
    ) -> Result<Option<TaskRecord>, StoreError> {
        let (owner, reference, request) = (*owner, *reference, request.copied());
        self.read_op(
            "reading a task by its reference",
            move |cx| match find_by_reference(cx.conn, &owner, &reference, cx.now)? {
                Some(f) if !f.expired => {
                    if f.request.as_deref() == request.as_ref().map(|d| &d.0[..]) {
                        Ok(Some(f.record))
                    } else {
                        Err(OpError::Refused(StoreError::Conflict))
                    }
                }
                _ => Ok(None),
            },
        )
        .await
    }

    /// How many task reads ([`Store::get`]) were asked of the store so far.
    pub fn task_reads(&self) -> u64 {
        self.task_reads.load(Ordering::Relaxed)
    }

    /// Moves a nonterminal task to a terminal status, once: if it is already
    /// terminal the stored outcome stays and is returned.
    pub async fn finish(
        &self,
        id: &TaskId,
        status: TaskStatus,
        outcome: Option<Outcome>,
    ) -> Result<Option<TaskRecord>, StoreError> {
        self.finish_projecting(id, status, outcome, None).await
    }

    /// [`Store::finish`] for the outcome of a background run, which no
    /// client waits on: its commit may wait up to
    /// [`super::handle::OUTCOME_LINGER`]
    /// for a write a client does wait on (the next creation, usually), so
    /// that both share one commit.
    pub async fn finish_run(
        &self,
        id: &TaskId,
        status: TaskStatus,
        outcome: Option<Outcome>,
    ) -> Result<Option<TaskRecord>, StoreError> {
        self.finish_with(id, status, outcome, None, true).await
    }

    /// [`Store::finish`] for an approval task, recording the journal
    /// sequence of the decision it projects.
    pub async fn finish_projecting(
        &self,
        id: &TaskId,
        status: TaskStatus,
        outcome: Option<Outcome>,
        seq: Option<u64>,
    ) -> Result<Option<TaskRecord>, StoreError> {
        self.finish_with(id, status, outcome, seq, false).await
    }

    async fn finish_with(
        &self,
        id: &TaskId,
        status: TaskStatus,
        outcome: Option<Outcome>,
        seq: Option<u64>,
        lingers: bool,
    ) -> Result<Option<TaskRecord>, StoreError> {
        if !status.is_terminal() {
            return Err(StoreError::Invalid(format!(
                "{} is not a terminal status",
                status.as_str()
            )));
        }
        let payload = outcome.as_ref().map(Outcome::encode);
        if let Some(p) = &payload
            && p.len() > MAX_PAYLOAD_BYTES
        {
            return Err(StoreError::PayloadTooLarge {
                size: p.len(),
                limit: MAX_PAYLOAD_BYTES,
            });
        }
        let id = id.clone();
        let body = move |tx: &mut Tx<'_, K>| {
            Ok(finish(
                tx.conn,
                &id,
                status,
                payload.as_deref(),
                seq,
                tx.now,
            )?)
        };
        if lingers {
            self.lingering_write_op("writing a task", body).await
        } else {
            self.write_op("writing a task", false, body).await
        }
    }

    /// Records the owner's intent to cancel a nonterminal task; returns the
    /// task as it now stands (`None` when unknown to this owner).
    pub async fn request_cancel(
        &self,
        id: &TaskId,
        owner: &Digest,
    ) -> Result<Option<TaskRecord>, StoreError> {
        let (id, owner) = (id.clone(), *owner);
        self.write_op("writing a task", false, move |tx| {
            Ok(request_cancel(tx.conn, &id, &owner, tx.now)?)
        })
        .await
    }

    /// For each ID, whether an unexpired task with it exists (any owner):
    /// how spilled artifacts learn that their task is gone.
    pub async fn unexpired(&self, ids: Vec<TaskId>) -> Result<Vec<bool>, StoreError> {
        self.read_op("reading tasks", move |cx| {
            ids.iter()
                .map(|id| find_unexpired(cx.conn, id, cx.now).map(|r| r.is_some()))
                .collect::<rusqlite::Result<Vec<bool>>>()
                .map_err(OpError::from)
        })
        .await
    }

    /// The highest approval-journal sequence an unfinished approval task
    /// recorded (0 when none waits): a journal that ends before it is
    /// older than the store.
    pub async fn approval_seq_needed(&self) -> Result<u64, StoreError> {
        self.read_op("reading approval tasks", move |cx| {
            // A serving store is at the latest schema version.
            Ok(count_nonterminal(cx.conn, i64::MAX)?.approval_seq)
        })
        .await
    }

    /// Unexpired tasks by status, every status named (0 when none).
    pub async fn status_counts(&self) -> Result<Vec<(&'static str, u64)>, StoreError> {
        self.read_op("counting tasks by status", move |cx| {
            let mut counts: Vec<(&'static str, u64)> = [
                TaskStatus::Working,
                TaskStatus::InputRequired,
                TaskStatus::Completed,
                TaskStatus::Failed,
                TaskStatus::Cancelled,
            ]
            .into_iter()
            .map(|s| (s.as_str(), 0))
            .collect();
            let mut stmt = cx.conn.prepare_cached(
                "SELECT status, count(*) FROM tasks WHERE expires_ms > ?1 GROUP BY status",
            )?;
            let rows = stmt.query_map(params![cx.now], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
            })?;
            for row in rows {
                let (status, n) = row?;
                if let Some(slot) = counts.iter_mut().find(|(s, _)| *s == status) {
                    slot.1 = n as u64;
                }
            }
            Ok(counts)
        })
        .await
    }

    /// Tasks retained and unexpired.
    pub async fn stats(&self) -> Result<StoreStats, StoreError> {
        self.read_op("counting tasks", move |cx| {
            let retained = Holds::<Tasks>::kind(cx.kinds).rows;
            let expired = count_expired(cx.conn, cx.now)?;
            Ok(StoreStats {
                retained,
                unexpired: retained.saturating_sub(expired),
            })
        })
        .await
    }
}
