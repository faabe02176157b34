//! The kinds of record the store holds, and what each must provide.
//!
//! A kind of record is one module of `store/` that owns its tables' DDL
//! (as steps of [`super::migrate`]), its SQL, its record types, its
//! operations (built as [`super::engine::ReadOp`]s and
//! [`super::engine::WriteOp`]s from methods on `Store`), its expiry sweep and
//! its restart recovery. The engine and the opening code reach every kind
//! only through [`RecordKind`], by walking [`Kinds`]; a new kind is
//! registered by one line in the `kinds!` list below.

use rusqlite::Connection;

use super::StoreOptions;

/// What the engine and the opening code ask of every kind of record. Each
/// method runs on the store thread.
pub(super) trait RecordKind {
    /// What one record is called in messages ("task").
    fn name(&self) -> &'static str;

    /// The schema version whose migration step created the kind's tables:
    /// a database older than that is validated without it.
    fn since(&self) -> i64;

    /// Fails unless the kind's tables have the columns this build reads at
    /// schema `version` (a database is validated before it is migrated).
    fn verify_shape(&self, conn: &Connection, version: i64) -> rusqlite::Result<()>;

    /// Decodes every record strictly: the first that does not decode is
    /// named with the reason (the database is then refused). Returns how
    /// many records there are.
    fn decode_all(&self, conn: &Connection) -> rusqlite::Result<Result<u64, (String, String)>>;

    /// Schema objects that need no version of their own (an index older
    /// builds of the same version neither read nor mind), created if
    /// missing at every start, in one transaction with the other kinds'.
    fn ensure(&self, conn: &Connection) -> rusqlite::Result<()>;

    /// Restart recovery, inside the recovery transaction: whatever was in
    /// flight when the last process stopped ends, and nothing is run again.
    fn recover(&mut self, conn: &Connection, now: i64) -> rusqlite::Result<()>;

    /// Reads what the kind keeps counted on the store thread, once
    /// recovery has committed.
    fn load(&mut self, conn: &Connection, now: i64) -> rusqlite::Result<()>;

    /// Deletes up to `limit` expired records, oldest expiry first, inside
    /// the caller's transaction (the sweep timer's own, or a savepoint in a
    /// batch); what it changes in the kind's counters counts once that
    /// commits. A kind whose [`NextExpiry`] says nothing is due yet runs no
    /// statement.
    fn sweep(&mut self, conn: &Connection, now: i64, limit: u32) -> rusqlite::Result<u64>;

    /// A sweep of this or another kind failed, and the caller undoes every
    /// kind's deletions: what this kind's sweep learned is forgotten and
    /// the rows it deleted count again (the rest of the transaction, a
    /// batch's writes, may still commit).
    fn sweep_undone(&mut self);

    /// The transaction the kind's pending counter changes belong to
    /// committed: they count from now on.
    fn committed(&mut self);

    /// That transaction was rolled back: its pending changes are forgotten.
    fn rolled_back(&mut self);
}

/// Declares the registered kinds: one `field: Type` line each, `Type`
/// being the kind's store-thread state, made by `Type::new(&StoreOptions)`.
macro_rules! kinds {
    ($($field:ident: $kind:ty,)+) => {
        /// Every kind of record's state on the store thread.
        pub(super) struct Kinds {
            $(pub(super) $field: $kind,)+
        }

        impl Kinds {
            pub(super) fn new(options: &StoreOptions) -> Kinds {
                Kinds { $($field: <$kind>::new(options),)+ }
            }

            /// Every kind, in registration order.
            pub(super) fn all(&self) -> Vec<&dyn RecordKind> {
                vec![$(&self.$field as &dyn RecordKind,)+]
            }

            /// The kinds a database at schema `version` holds.
            pub(super) fn at(&self, version: i64) -> Vec<&dyn RecordKind> {
                let mut kinds = self.all();
                kinds.retain(|kind| kind.since() <= version);
                kinds
            }

            fn all_mut(&mut self) -> Vec<&mut dyn RecordKind> {
                vec![$(&mut self.$field as &mut dyn RecordKind,)+]
            }
        }
    };
}

kinds! {
    tasks: super::tasks::Tasks,
    routes: super::routes::Routes,
}

impl Kinds {
    /// Every kind's bounded sweep; the total deleted.
    pub(super) fn sweep(
        &mut self,
        conn: &Connection,
        now: i64,
        limit: u32,
    ) -> rusqlite::Result<u64> {
        let mut deleted = 0;
        for kind in self.all_mut() {
            let n = match kind.sweep(conn, now, limit) {
                Ok(n) => n,
                Err(e) => {
                    self.all_mut()
                        .into_iter()
                        .for_each(|kind| kind.sweep_undone());
                    return Err(e);
                }
            };
            if n > 0 {
                tracing::debug!(deleted = n, "{n} expired {}s swept", kind.name());
            }
            deleted += n;
        }
        Ok(deleted)
    }

    pub(super) fn recover(&mut self, conn: &Connection, now: i64) -> rusqlite::Result<()> {
        self.all_mut()
            .into_iter()
            .try_for_each(|kind| kind.recover(conn, now))
    }

    pub(super) fn load(&mut self, conn: &Connection, now: i64) -> rusqlite::Result<()> {
        self.all_mut()
            .into_iter()
            .try_for_each(|kind| kind.load(conn, now))
    }

    pub(super) fn committed(&mut self) {
        self.all_mut().into_iter().for_each(|kind| kind.committed());
    }

    pub(super) fn rolled_back(&mut self) {
        self.all_mut()
            .into_iter()
            .for_each(|kind| kind.rolled_back());
    }
}

/// A lower bound on the earliest expiry among one table's rows, kept on
/// the store thread so that a sweep with nothing due runs no statement
/// (the sweep that rides in every batch holding a creation would
/// otherwise probe every table each time).
///
/// It stays a lower bound because expiries only change in two ways: a
/// row is inserted with its expiry (noted at once with [`added`], even if
/// that insert is later rolled back: a bound too low costs one empty
/// sweep), and a retained row's expiry is only ever raised. A sweep
/// reads the earliest expiry left ([`swept`]), which counts only once its
/// transaction commits; a rollback, or a sweep that failed, keeps the old
/// bound.
///
/// [`added`]: NextExpiry::added
/// [`swept`]: NextExpiry::swept
pub(super) struct NextExpiry {
    /// No row expires before this (Unix ms); `i64::MIN` until known.
    due: i64,
    /// What the sweep of the transaction in progress found.
    swept: Option<i64>,
}

impl NextExpiry {
    /// Nothing known yet: every sweep runs until the first [`load`].
    ///
    /// [`load`]: NextExpiry::load
    pub(super) fn unknown() -> NextExpiry {
        NextExpiry {
            due: i64::MIN,
            swept: None,
        }
    }

    /// Whether a row may have expired at `now`.
    pub(super) fn is_due(&self, now: i64) -> bool {
        now >= self.due
    }

    /// The earliest expiry of `table` (`i64::MAX` when empty), read at
    /// startup once recovery has committed.
    pub(super) fn load(&mut self, conn: &Connection, table: &str) -> rusqlite::Result<()> {
        self.due = earliest(conn, table)?;
        self.swept = None;
        Ok(())
    }

    /// A row expiring at `expires_ms` was inserted.
    pub(super) fn added(&mut self, expires_ms: i64) {
        self.due = self.due.min(expires_ms);
        if let Some(s) = &mut self.swept {
            *s = (*s).min(expires_ms);
        }
    }

    /// `table` was swept in the transaction in progress: the earliest
    /// expiry left counts once it commits.
    pub(super) fn swept(&mut self, conn: &Connection, table: &str) -> rusqlite::Result<()> {
        self.swept = Some(earliest(conn, table)?);
        Ok(())
    }

    pub(super) fn committed(&mut self) {
        if let Some(s) = self.swept.take() {
            self.due = s;
        }
    }

    pub(super) fn rolled_back(&mut self) {
        self.swept = None;
    }
}

/// The earliest `expires_ms` of `table` (from its expiry index), or
/// `i64::MAX` when it has no row.
fn earliest(conn: &Connection, table: &str) -> rusqlite::Result<i64> {
    conn.prepare_cached(&format!("SELECT min(expires_ms) FROM {table}"))?
        .query_row([], |r| r.get::<_, Option<i64>>(0))
        .map(|m| m.unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_expiry_bound_rises_only_with_a_committed_sweep_and_never_past_an_added_row() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE t (expires_ms INTEGER NOT NULL);
             INSERT INTO t VALUES (100), (200);",
        )
        .unwrap();
        let mut e = NextExpiry::unknown();
        assert!(e.is_due(i64::MIN), "unknown: every sweep runs");
        e.load(&conn, "t").unwrap();
        assert!(!e.is_due(99));
        assert!(e.is_due(100));

        // A sweep whose transaction is rolled back (or whose savepoint
        // failed) teaches nothing: its deletion is undone.
        conn.execute("DELETE FROM t WHERE expires_ms <= 100", [])
            .unwrap();
        e.swept(&conn, "t").unwrap();
        assert!(e.is_due(100), "not counted before the commit");
        e.rolled_back();
        assert!(e.is_due(100));

        // Committed, the bound rises to what is left, but never past a row
        // added in the same transaction after the sweep looked.
        e.swept(&conn, "t").unwrap();
        e.added(150);
        e.committed();
        assert!(!e.is_due(149));
        assert!(e.is_due(150));

        // An empty table: nothing is due until a row is added.
        conn.execute("DELETE FROM t", []).unwrap();
        e.swept(&conn, "t").unwrap();
        e.committed();
        assert!(!e.is_due(i64::MAX - 1));
        e.added(300);
        assert!(e.is_due(300));
    }
}
