//! The schema's history: an ordered list of versioned steps, which the
//! application's registry lists ([`crate::Kinds::STEPS`]). Step N takes a
//! database at version N - 1 to version N and sets `user_version` to N in
//! the same transaction, so a migration interrupted anywhere leaves a
//! database at a version this build (and the one before) can open.
//!
//! A pristine file runs every step and records the store's identity in one
//! transaction: a first start either completes or leaves the file pristine.
//! An older database runs each missing step in a transaction of its own. A
//! database newer than the last step is refused (65): this build does not
//! know what it holds. A kind of record adds its tables by appending one
//! step; a step, once released, never changes.

use rusqlite::Connection;

/// One schema change.
pub struct Step {
    /// The version the database is at once the step has run.
    pub version: i64,
    /// What the step does, for messages.
    pub what: &'static str,
    pub apply: fn(&Connection) -> rusqlite::Result<()>,
}

/// The schema version a build with `steps` writes and serves: the last
/// step's.
pub const fn schema_version(steps: &[Step]) -> i64 {
    steps.len() as i64
}

/// Runs the steps after `from` inside the caller's transaction.
pub(crate) fn all_after(conn: &Connection, steps: &[Step], from: i64) -> rusqlite::Result<()> {
    for step in pending(steps, from) {
        apply(conn, step)?;
    }
    Ok(())
}

/// The steps a database at `from` has not run, in order.
pub(crate) fn pending(steps: &[Step], from: i64) -> impl Iterator<Item = &Step> {
    steps.iter().filter(move |s| s.version > from)
}

/// Runs one step and records its version, inside the caller's transaction.
pub(crate) fn apply(conn: &Connection, step: &Step) -> rusqlite::Result<()> {
    (step.apply)(conn)?;
    conn.pragma_update(None, "user_version", step.version)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(conn: &Connection) -> rusqlite::Result<()> {
        conn.execute_batch("CREATE TABLE a (x INTEGER) STRICT")
    }

    fn two(conn: &Connection) -> rusqlite::Result<()> {
        conn.execute_batch("ALTER TABLE a ADD COLUMN y INTEGER")
    }

    const STEPS: &[Step] = &[
        Step {
            version: 1,
            what: "a",
            apply: one,
        },
        Step {
            version: 2,
            what: "a.y",
            apply: two,
        },
    ];

    #[test]
    fn the_missing_steps_run_in_order_and_record_their_version() {
        let conn = Connection::open_in_memory().unwrap();
        all_after(&conn, &STEPS[..1], 0).unwrap();
        let version = |c: &Connection| -> i64 {
            c.query_row("PRAGMA user_version", [], |r| r.get(0))
                .unwrap()
        };
        assert_eq!(version(&conn), 1);
        assert_eq!(pending(STEPS, 1).count(), 1);
        all_after(&conn, STEPS, 1).unwrap();
        assert_eq!(version(&conn), schema_version(STEPS));
        conn.prepare("SELECT x, y FROM a").unwrap();
    }
}
