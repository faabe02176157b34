//! The schema's history: the ordered list of versioned steps every kind of
//! record contributes its tables to (the engine runs them; see
//! `taskgate_store_engine::Step`). Step N takes version N - 1 to N and sets
//! `user_version` in the same transaction; a pristine file runs every step
//! and records the identity in one transaction; an older database runs
//! each missing step in a transaction of its own; a newer one is refused
//! (65). A kind adds its tables by appending one step here; a step, once
//! released, never changes.

use taskgate_store_engine::{Step, schema_version};

use super::{routes, tasks};

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
pub const SCHEMA_VERSION: i64 = schema_version(STEPS);

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::Connection;

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
        for step in STEPS {
            (step.apply)(&conn).unwrap();
            conn.pragma_update(None, "user_version", step.version)
                .unwrap();
        }
        conn.execute_batch("COMMIT").unwrap();
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
    }
}
