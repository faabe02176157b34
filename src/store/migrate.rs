//! The schema's history: an ordered list of versioned steps. Step N takes a
//! database at version N - 1 to version N and sets `user_version` to N in
//! the same transaction, so a migration interrupted anywhere leaves a
//! database at a version this build (and the one before) can open.
//!
//! A pristine file runs every step and records the store's identity in one
//! transaction: a first start either completes or leaves the file pristine.
//! An older database runs each missing step in a transaction of its own. A
//! database newer than the last step is refused (65): this build does not
//! know what it holds. A kind of record adds its tables by appending one
//! step here; a step, once released, never changes.

use rusqlite::Connection;

use super::{routes, tasks};

/// One schema change.
pub(super) struct Step {
    /// The version the database is at once the step has run.
    pub(super) version: i64,
    /// What the step does, for messages.
    pub(super) what: &'static str,
    pub(super) apply: fn(&Connection) -> rusqlite::Result<()>,
}

/// Every step, oldest first; `STEPS[i].version == i + 1`.
pub(super) const STEPS: &[Step] = &[
    Step {
        version: 1,
        what: "the tasks table",
        apply: tasks::create_table,
    },
    Step {
        version: 2,
        what: "tasks may wait on an approval proposal",
        apply: tasks::add_proposal,
    },
    Step {
        version: 3,
        what: "durable routes to upstream tasks, and their leases",
        apply: routes::create_tables,
    },
    Step {
        version: 4,
        what: "approval tasks record the journal sequence they projected",
        apply: tasks::add_proposal_seq,
    },
];

/// The schema version this build writes and serves: the last step's.
pub const SCHEMA_VERSION: i64 = STEPS.len() as i64;

/// Runs the steps after `from` inside the caller's transaction.
pub(super) fn all_after(conn: &Connection, from: i64) -> rusqlite::Result<()> {
    for step in pending(from) {
        apply(conn, step)?;
    }
    Ok(())
}

/// The steps a database at `from` has not run, in order.
pub(super) fn pending(from: i64) -> impl Iterator<Item = &'static Step> {
    STEPS.iter().filter(move |s| s.version > from)
}

/// Runs one step and records its version, inside the caller's transaction.
pub(super) fn apply(conn: &Connection, step: &Step) -> rusqlite::Result<()> {
    (step.apply)(conn)?;
    conn.pragma_update(None, "user_version", step.version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_numbered_in_order_from_one() {
        for (i, step) in STEPS.iter().enumerate() {
            assert_eq!(step.version, i as i64 + 1, "{}", step.what);
        }
    }

    #[test]
    fn every_step_runs_on_the_one_before() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("BEGIN").unwrap();
        all_after(&conn, 0).unwrap();
        conn.execute_batch("COMMIT").unwrap();
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
    }
}
