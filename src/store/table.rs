//! What every kind's tables share, written once: rows keyed by a text `id`,
//! scoped by an `owner` digest, and ending at `expires_ms`. A lookup by ID
//! for its owner (another owner's row answers exactly like an unknown one),
//! a lookup by ID alone, the bounded deletion of expired rows oldest first,
//! and the strict decoding of every row at opening, whose first failure
//! names the record.

use rusqlite::{Connection, OptionalExtension, Row, params};

use super::digest::Digest;

/// Decodes one row strictly (the columns a table's kind selects).
pub(super) type Decode<T> = fn(&Row<'_>) -> rusqlite::Result<T>;

/// One table's shared statements, built once.
pub(super) struct Table {
    owned: String,
    unexpired: String,
    delete_expired: String,
    all: String,
}

impl Table {
    /// The statements of `table`, reading `served` (the columns a lookup
    /// decodes) and, at opening, `decoded` (the columns every schema
    /// version has).
    pub(super) fn new(table: &str, served: &str, decoded: &str) -> Table {
        Table {
            owned: format!(
                "SELECT {served} FROM {table} WHERE id = ?1 AND owner = ?2 AND expires_ms > ?3"
            ),
            unexpired: format!("SELECT {served} FROM {table} WHERE id = ?1 AND expires_ms > ?2"),
            delete_expired: format!(
                "DELETE FROM {table} WHERE rowid IN
           (SELECT rowid FROM {table} WHERE expires_ms <= ?1 ORDER BY expires_ms LIMIT ?2)"
            ),
            all: format!("SELECT {decoded} FROM {table}"),
        }
    }

    /// The owner's unexpired row `id`: `None` for unknown, expired and
    /// another owner's alike.
    pub(super) fn find_owned<T>(
        &self,
        conn: &Connection,
        id: &str,
        owner: &Digest,
        now: i64,
        decode: Decode<T>,
    ) -> rusqlite::Result<Option<T>> {
        conn.prepare_cached(&self.owned)?
            .query_row(params![id, &owner.0[..], now], decode)
            .optional()
    }

    /// An unexpired row by ID alone, whoever owns it.
    pub(super) fn find_unexpired<T>(
        &self,
        conn: &Connection,
        id: &str,
        now: i64,
        decode: Decode<T>,
    ) -> rusqlite::Result<Option<T>> {
        conn.prepare_cached(&self.unexpired)?
            .query_row(params![id, now], decode)
            .optional()
    }

    /// Deletes up to `limit` expired rows, oldest expiry first.
    pub(super) fn delete_expired(
        &self,
        conn: &Connection,
        now: i64,
        limit: u32,
    ) -> rusqlite::Result<u64> {
        conn.prepare_cached(&self.delete_expired)?
            .execute(params![now, limit])
            .map(|n| n as u64)
    }

    /// Decodes every row; the first failure names its record (the first
    /// column, its ID) and why. Returns how many rows there are.
    pub(super) fn decode_all<T>(
        &self,
        conn: &Connection,
        decode: Decode<T>,
    ) -> rusqlite::Result<Result<u64, (String, String)>> {
        let mut stmt = conn.prepare(&self.all)?;
        let mut rows = stmt.query([])?;
        let mut n = 0u64;
        while let Some(row) = rows.next()? {
            if let Err(e) = decode(row) {
                let id = row
                    .get::<_, String>(0)
                    .unwrap_or_else(|_| "<unreadable id>".into());
                return Ok(Err((id, e.to_string())));
            }
            n += 1;
        }
        Ok(Ok(n))
    }
}
