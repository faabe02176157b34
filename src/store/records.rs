//! SQL on the `tasks` table. Called only from the store thread.

use std::sync::LazyLock;

use rusqlite::types::Type;
use rusqlite::{Connection, OptionalExtension, Row, named_params, params};

use super::{
    Digest, MAX_PAYLOAD_BYTES, NewTask, Outcome, TERMINAL_RETENTION_MS, TaskId, TaskRecord,
    TaskStatus,
};

/// Columns every schema version has, in the order `decode_row` reads them.
pub(crate) const COLUMNS: &str = "id, status, status_message, created_ms, updated_ms, expires_ms, poll_interval_ms, payload, cancel_requested";

const NONTERMINAL: &str = "('working','input_required')";

fn conversion(col: usize, t: Type, msg: String) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(col, t, msg.into())
}

/// Reads one row, decoding status and payload; an inconsistent row is an
/// error, which at startup refuses the database.
pub(crate) fn decode_row(row: &Row<'_>) -> rusqlite::Result<TaskRecord> {
    let id_text: String = row.get(0)?;
    let id = TaskId::parse(&id_text)
        .ok_or_else(|| conversion(0, Type::Text, format!("malformed task id {id_text:?}")))?;
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
    Ok(TaskRecord {
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

pub(crate) fn insert(
    conn: &Connection,
    id: &TaskId,
    new: &NewTask,
    now: i64,
) -> rusqlite::Result<TaskRecord> {
    let expires = now.saturating_add(new.ttl_ms);
    conn.prepare_cached(
        "INSERT INTO tasks (id, owner, reference, request, status, status_message, created_ms, updated_ms, expires_ms, poll_interval_ms, payload, cancel_requested)
         VALUES (?1, ?2, ?3, ?4, 'working', NULL, ?5, ?5, ?6, ?7, NULL, 0)",
    )?
    .execute(params![
        id.as_str(),
        &new.owner.0[..],
        new.reference.as_ref().map(|d| d.0.to_vec()),
        new.request.as_ref().map(|d| d.0.to_vec()),
        now,
        expires,
        new.poll_interval_ms,
    ])?;
    Ok(TaskRecord {
        id: id.clone(),
        status: TaskStatus::Working,
        status_message: None,
        created_ms: now,
        updated_ms: now,
        expires_ms: expires,
        poll_interval_ms: new.poll_interval_ms,
        outcome: None,
        cancel_requested: false,
    })
}

/// The owner's unexpired task.
pub(crate) fn find_owned(
    conn: &Connection,
    id: &TaskId,
    owner: &Digest,
    now: i64,
) -> rusqlite::Result<Option<TaskRecord>> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!("SELECT {COLUMNS} FROM tasks WHERE id = ?1 AND owner = ?2 AND expires_ms > ?3")
    });
    conn.prepare_cached(&SQL)?
        .query_row(params![id.as_str(), &owner.0[..], now], decode_row)
        .optional()
}

/// An unexpired task by ID alone (the executor's own view).
pub(crate) fn find_unexpired(
    conn: &Connection,
    id: &TaskId,
    now: i64,
) -> rusqlite::Result<Option<TaskRecord>> {
    static SQL: LazyLock<String> =
        LazyLock::new(|| format!("SELECT {COLUMNS} FROM tasks WHERE id = ?1 AND expires_ms > ?2"));
    conn.prepare_cached(&SQL)?
        .query_row(params![id.as_str(), now], decode_row)
        .optional()
}

/// A task found by its creation reference.
pub(crate) struct ByReference {
    pub record: TaskRecord,
    /// The request digest the task was created for.
    pub request: Option<Vec<u8>>,
    pub expired: bool,
}

/// The task created under the owner's reference, expired or not.
pub(crate) fn find_by_reference(
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

pub(crate) fn delete(conn: &Connection, id: &TaskId) -> rusqlite::Result<usize> {
    conn.prepare_cached("DELETE FROM tasks WHERE id = ?1")?
        .execute(params![id.as_str()])
}

/// Keeps the original expiry unless the task would expire less than
/// [`TERMINAL_RETENTION_MS`] after finishing; never revives an expired row.
const RETAIN: &str = "expires_ms = CASE WHEN expires_ms > :now THEN MAX(expires_ms, :now + :retain) ELSE expires_ms END";

/// The conditional terminal transition. Returns the task as it stands.
pub(crate) fn finish(
    conn: &Connection,
    id: &TaskId,
    status: TaskStatus,
    payload: Option<&[u8]>,
    now: i64,
) -> rusqlite::Result<Option<TaskRecord>> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "UPDATE tasks SET status = :status, payload = :payload, updated_ms = :now, {RETAIN}
             WHERE id = :id AND status IN {NONTERMINAL} AND expires_ms > :now
             RETURNING {COLUMNS}"
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
pub(crate) fn request_cancel(
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

/// Deletes up to `limit` expired rows, oldest expiry first.
pub(crate) fn delete_expired(conn: &Connection, now: i64, limit: u32) -> rusqlite::Result<u64> {
    conn.prepare_cached(
        "DELETE FROM tasks WHERE rowid IN
           (SELECT rowid FROM tasks WHERE expires_ms <= ?1 ORDER BY expires_ms LIMIT ?2)",
    )?
    .execute(params![now, limit])
    .map(|n| n as u64)
}

pub(crate) fn count_all(conn: &Connection) -> rusqlite::Result<u64> {
    conn.query_row("SELECT count(*) FROM tasks", [], |r| r.get::<_, i64>(0))
        .map(|n| n as u64)
}

pub(crate) fn count_expired(conn: &Connection, now: i64) -> rusqlite::Result<u64> {
    conn.prepare_cached("SELECT count(*) FROM tasks WHERE expires_ms <= ?1")?
        .query_row(params![now], |r| r.get::<_, i64>(0))
        .map(|n| n as u64)
}

/// Unexpired tasks of one owner (read from `tasks_owner_expires`).
pub(crate) fn count_live_of(conn: &Connection, owner: &Digest, now: i64) -> rusqlite::Result<u64> {
    conn.prepare_cached("SELECT count(*) FROM tasks WHERE owner = ?1 AND expires_ms > ?2")?
        .query_row(params![&owner.0[..], now], |r| r.get::<_, i64>(0))
        .map(|n| n as u64)
}

/// `(nonterminal tasks, of which their cancel was committed)`.
pub(crate) fn count_nonterminal(conn: &Connection) -> rusqlite::Result<(u64, u64)> {
    conn.query_row(
        &format!(
            "SELECT count(*), coalesce(sum(cancel_requested != 0), 0) FROM tasks WHERE status IN {NONTERMINAL}"
        ),
        [],
        |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64)),
    )
}

/// A task that was working when the last process stopped.
pub(crate) struct Unfinished {
    pub id: TaskId,
    pub cancel_requested: bool,
}

pub(crate) fn unfinished(conn: &Connection) -> rusqlite::Result<Vec<Unfinished>> {
    let mut stmt = conn.prepare(&format!(
        "SELECT id, cancel_requested FROM tasks WHERE status IN {NONTERMINAL} ORDER BY id"
    ))?;
    let rows = stmt.query_map([], |row| {
        let text: String = row.get(0)?;
        let id = TaskId::parse(&text)
            .ok_or_else(|| conversion(0, Type::Text, format!("malformed task id {text:?}")))?;
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
pub(crate) fn end_unfinished(conn: &Connection, now: i64) -> rusqlite::Result<()> {
    conn.execute(
        &format!(
            "UPDATE tasks SET status = 'cancelled', status_message = 'cancelled as requested; the daemon stopped before the tool ended', payload = NULL, updated_ms = :now, {RETAIN}
             WHERE status IN {NONTERMINAL} AND cancel_requested = 1"
        ),
        named_params! { ":now": now, ":retain": TERMINAL_RETENTION_MS },
    )?;
    let payload = Outcome::interrupted().encode();
    conn.execute(
        &format!(
            "UPDATE tasks SET status = 'failed', status_message = 'interrupted by a restart; not run again', payload = :payload, updated_ms = :now, {RETAIN}
             WHERE status IN {NONTERMINAL}"
        ),
        named_params! { ":payload": payload, ":now": now, ":retain": TERMINAL_RETENTION_MS },
    )?;
    Ok(())
}

/// Decodes every row; the first failure names the task.
pub(crate) fn decode_all(conn: &Connection) -> rusqlite::Result<Result<u64, (String, String)>> {
    let mut stmt = conn.prepare(&format!("SELECT {COLUMNS} FROM tasks"))?;
    let mut rows = stmt.query([])?;
    let mut n = 0u64;
    while let Some(row) = rows.next()? {
        if let Err(e) = decode_row(row) {
            let id = row
                .get::<_, String>(0)
                .unwrap_or_else(|_| "<unreadable id>".into());
            return Ok(Err((id, e.to_string())));
        }
        n += 1;
    }
    Ok(Ok(n))
}
