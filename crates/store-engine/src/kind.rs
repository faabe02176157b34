//! The kinds of record a store holds, and what each must provide.
//!
//! A kind of record owns its tables' DDL (as migration [`Step`]s), its SQL,
//! its record types, its operations (built as reads and writes a
//! [`crate::Handle`] sends), its expiry sweep and its restart recovery. The
//! engine reaches every kind only through [`AnyKind`], by walking the
//! application's registry ([`Kinds`]), which [`kinds!`] declares in one
//! line per kind.

use rusqlite::Connection;

use crate::migrate::Step;

/// Lines for the operator about a report (a kind's recovery or status).
/// The defaults say nothing.
pub trait Report {
    /// What a read-only check prints: for a recovery report, what opening
    /// would end; for a status, what the kind holds.
    fn lines(&self) -> Vec<String> {
        Vec::new()
    }

    /// For a recovery report: what opening ended, told once it has (a
    /// running store's status).
    fn ended(&self) -> Vec<String> {
        Vec::new()
    }
}

impl Report for () {}

/// The first record that did not decode: its ID and the reason.
pub type Undecodable = (String, String);

/// What the engine and the opening code ask of every kind of record, with
/// what the kind tells about itself: its restart recovery ([`Self::Recovery`],
/// found before recovery runs, so the application can act on it first) and
/// its counts ([`Self::Status`]). Each method runs on the store thread.
pub trait RecordKind: Send + 'static {
    /// What restart recovery is about to do (or, for `check`, would do).
    type Recovery: Report + Clone + std::fmt::Debug + Default + PartialEq + Eq + Send + 'static;
    /// What the kind holds, counted.
    type Status: Report + Clone + std::fmt::Debug + Default + PartialEq + Eq + Send + 'static;

    /// What one record is called in messages.
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
    fn decode_all(&self, conn: &Connection) -> rusqlite::Result<Result<u64, Undecodable>>;

    /// Schema objects that need no version of their own (an index older
    /// builds of the same version neither read nor mind), created if
    /// missing at every start, in one transaction with the other kinds'.
    fn ensure(&self, conn: &Connection) -> rusqlite::Result<()>;

    /// What restart recovery would end in a database at `version`, read
    /// without writing.
    fn pending_recovery(&self, conn: &Connection, version: i64)
    -> rusqlite::Result<Self::Recovery>;

    /// Restart recovery, inside the recovery transaction: whatever was in
    /// flight when the last process stopped ends, and nothing is run again.
    fn recover(&mut self, conn: &Connection, now: i64) -> rusqlite::Result<()>;

    /// The kind's counts in a database at `version`, at `now`.
    fn status(&self, conn: &Connection, version: i64, now: i64) -> rusqlite::Result<Self::Status>;

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
    /// the records it deleted count again (the rest of the transaction, a
    /// batch's writes, may still commit).
    fn sweep_undone(&mut self);

    /// The transaction the kind's pending counter changes belong to
    /// committed: they count from now on.
    fn committed(&mut self);

    /// That transaction was rolled back: its pending changes are forgotten.
    fn rolled_back(&mut self);
}

/// [`RecordKind`] without its associated types, so that the engine can
/// walk every kind of a registry in turn. Implemented for every kind.
pub trait AnyKind {
    fn name(&self) -> &'static str;
    fn since(&self) -> i64;
    fn verify_shape(&self, conn: &Connection, version: i64) -> rusqlite::Result<()>;
    fn decode_all(&self, conn: &Connection) -> rusqlite::Result<Result<u64, Undecodable>>;
    fn ensure(&self, conn: &Connection) -> rusqlite::Result<()>;
    fn recover(&mut self, conn: &Connection, now: i64) -> rusqlite::Result<()>;
    fn load(&mut self, conn: &Connection, now: i64) -> rusqlite::Result<()>;
    fn sweep(&mut self, conn: &Connection, now: i64, limit: u32) -> rusqlite::Result<u64>;
    fn sweep_undone(&mut self);
    fn committed(&mut self);
    fn rolled_back(&mut self);
}

impl<T: RecordKind> AnyKind for T {
    fn name(&self) -> &'static str {
        RecordKind::name(self)
    }
    fn since(&self) -> i64 {
        RecordKind::since(self)
    }
    fn verify_shape(&self, conn: &Connection, version: i64) -> rusqlite::Result<()> {
        RecordKind::verify_shape(self, conn, version)
    }
    fn decode_all(&self, conn: &Connection) -> rusqlite::Result<Result<u64, Undecodable>> {
        RecordKind::decode_all(self, conn)
    }
    fn ensure(&self, conn: &Connection) -> rusqlite::Result<()> {
        RecordKind::ensure(self, conn)
    }
    fn recover(&mut self, conn: &Connection, now: i64) -> rusqlite::Result<()> {
        RecordKind::recover(self, conn, now)
    }
    fn load(&mut self, conn: &Connection, now: i64) -> rusqlite::Result<()> {
        RecordKind::load(self, conn, now)
    }
    fn sweep(&mut self, conn: &Connection, now: i64, limit: u32) -> rusqlite::Result<u64> {
        RecordKind::sweep(self, conn, now, limit)
    }
    fn sweep_undone(&mut self) {
        RecordKind::sweep_undone(self)
    }
    fn committed(&mut self) {
        RecordKind::committed(self)
    }
    fn rolled_back(&mut self) {
        RecordKind::rolled_back(self)
    }
}

/// The application's registry of kinds: every kind's state on the store
/// thread, the schema's history, and what the kinds report together.
/// Declare it with [`kinds!`].
pub trait Kinds: Send + 'static {
    /// The kinds' refusals (a bound, a conflict), carried to the caller
    /// through [`crate::EngineError::Refused`].
    type Refusal: Clone + std::fmt::Debug + std::fmt::Display + Send + 'static;
    /// Every kind's [`RecordKind::Recovery`].
    type Recovery: Report + Clone + std::fmt::Debug + Default + PartialEq + Eq + Send + 'static;
    /// Every kind's [`RecordKind::Status`].
    type Status: Report + Clone + std::fmt::Debug + Default + PartialEq + Eq + Send + 'static;

    /// Every migration step, oldest first; `STEPS[i].version == i + 1`.
    const STEPS: &'static [Step];

    /// Every kind, in registration order.
    fn all(&self) -> Vec<&dyn AnyKind>;
    fn all_mut(&mut self) -> Vec<&mut dyn AnyKind>;

    /// Every kind's pending recovery in a database at `version` (a kind
    /// the database does not hold yet reports its default).
    fn pending_recovery(&self, conn: &Connection, version: i64)
    -> rusqlite::Result<Self::Recovery>;

    /// Every kind's status in a database at `version`.
    fn status(&self, conn: &Connection, version: i64, now: i64) -> rusqlite::Result<Self::Status>;

    /// The kinds a database at schema `version` holds.
    fn at(&self, version: i64) -> Vec<&dyn AnyKind> {
        let mut kinds = self.all();
        kinds.retain(|kind| kind.since() <= version);
        kinds
    }

    /// Every kind's bounded sweep, one after the other inside the caller's
    /// transaction; the total deleted. When one fails every kind forgets
    /// its sweep (the caller undoes them all).
    fn sweep(&mut self, conn: &Connection, now: i64, limit: u32) -> rusqlite::Result<u64> {
        let mut deleted = 0;
        let mut failed = None;
        for kind in self.all_mut() {
            match kind.sweep(conn, now, limit) {
                Ok(n) => {
                    if n > 0 {
                        tracing::debug!(deleted = n, "{n} expired {}s swept", kind.name());
                    }
                    deleted += n;
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        match failed {
            None => Ok(deleted),
            Some(e) => {
                self.all_mut()
                    .into_iter()
                    .for_each(|kind| kind.sweep_undone());
                Err(e)
            }
        }
    }

    fn recover(&mut self, conn: &Connection, now: i64) -> rusqlite::Result<()> {
        self.all_mut()
            .into_iter()
            .try_for_each(|kind| kind.recover(conn, now))
    }

    fn load(&mut self, conn: &Connection, now: i64) -> rusqlite::Result<()> {
        self.all_mut()
            .into_iter()
            .try_for_each(|kind| kind.load(conn, now))
    }

    fn committed(&mut self) {
        self.all_mut().into_iter().for_each(|kind| kind.committed());
    }

    fn rolled_back(&mut self) {
        self.all_mut()
            .into_iter()
            .for_each(|kind| kind.rolled_back());
    }
}

/// A registry that holds a kind `T`: how a kind's operations reach its own
/// state on the store thread without naming the registry.
pub trait Holds<T> {
    fn kind(&self) -> &T;
    fn kind_mut(&mut self) -> &mut T;
}

/// Declares a registry of kinds: a struct with one field per kind (made by
/// `Kind::new(&options)`), the structs of their recoveries and statuses
/// (one field each, rendered in registration order), and its [`Kinds`] and
/// [`Holds`] impls.
///
/// ```text
/// kinds! {
///     pub struct Registered;
///     recovery Recovery; status Status;
///     options StoreOptions; refusal MyError; steps STEPS;
///     things: Things,
/// }
/// ```
#[macro_export]
macro_rules! kinds {
    (
        $(#[$meta:meta])* $vis:vis struct $name:ident;
        recovery $recovery:ident; status $status:ident;
        options $options:ty; refusal $refusal:ty; steps $steps:expr;
        $($field:ident: $kind:ty,)+
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $(pub $field: $kind,)+
        }

        /// Every kind's restart recovery, in registration order.
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        $vis struct $recovery {
            $(pub $field: <$kind as $crate::RecordKind>::Recovery,)+
        }

        /// Every kind's counts, in registration order.
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        $vis struct $status {
            $(pub $field: <$kind as $crate::RecordKind>::Status,)+
        }

        impl $crate::Report for $recovery {
            fn lines(&self) -> Vec<String> {
                let mut lines = Vec::new();
                $(lines.extend($crate::Report::lines(&self.$field));)+
                lines
            }

            fn ended(&self) -> Vec<String> {
                let mut lines = Vec::new();
                $(lines.extend($crate::Report::ended(&self.$field));)+
                lines
            }
        }

        impl $crate::Report for $status {
            fn lines(&self) -> Vec<String> {
                let mut lines = Vec::new();
                $(lines.extend($crate::Report::lines(&self.$field));)+
                lines
            }
        }

        impl $name {
            $vis fn new(options: &$options) -> $name {
                $name { $($field: <$kind>::new(options),)+ }
            }
        }

        impl $crate::Kinds for $name {
            type Refusal = $refusal;
            type Recovery = $recovery;
            type Status = $status;

            const STEPS: &'static [$crate::Step] = $steps;

            fn all(&self) -> Vec<&dyn $crate::AnyKind> {
                vec![$(&self.$field as &dyn $crate::AnyKind,)+]
            }

            fn all_mut(&mut self) -> Vec<&mut dyn $crate::AnyKind> {
                vec![$(&mut self.$field as &mut dyn $crate::AnyKind,)+]
            }

            fn pending_recovery(
                &self,
                conn: &$crate::rusqlite::Connection,
                version: i64,
            ) -> $crate::rusqlite::Result<$recovery> {
                Ok($recovery {
                    $($field: if $crate::RecordKind::since(&self.$field) <= version {
                        $crate::RecordKind::pending_recovery(&self.$field, conn, version)?
                    } else {
                        Default::default()
                    },)+
                })
            }

            fn status(
                &self,
                conn: &$crate::rusqlite::Connection,
                version: i64,
                now: i64,
            ) -> $crate::rusqlite::Result<$status> {
                Ok($status {
                    $($field: if $crate::RecordKind::since(&self.$field) <= version {
                        $crate::RecordKind::status(&self.$field, conn, version, now)?
                    } else {
                        Default::default()
                    },)+
                })
            }
        }

        $(impl $crate::Holds<$kind> for $name {
            fn kind(&self) -> &$kind {
                &self.$field
            }
            fn kind_mut(&mut self) -> &mut $kind {
                &mut self.$field
            }
        })+
    };
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
pub struct NextExpiry {
    /// No row expires before this (Unix ms); `i64::MIN` until known.
    due: i64,
    /// What the sweep of the transaction in progress found.
    swept: Option<i64>,
}

impl NextExpiry {
    /// Nothing known yet: every sweep runs until the first [`load`].
    ///
    /// [`load`]: NextExpiry::load
    pub fn unknown() -> NextExpiry {
        NextExpiry {
            due: i64::MIN,
            swept: None,
        }
    }

    /// Whether a row may have expired at `now`.
    pub fn is_due(&self, now: i64) -> bool {
        now >= self.due
    }

    /// The earliest expiry of `table` (`i64::MAX` when empty), read at
    /// startup once recovery has committed.
    pub fn load(&mut self, conn: &Connection, table: &str) -> rusqlite::Result<()> {
        self.due = earliest(conn, table)?;
        self.swept = None;
        Ok(())
    }

    /// A row expiring at `expires_ms` was inserted.
    pub fn added(&mut self, expires_ms: i64) {
        self.due = self.due.min(expires_ms);
        if let Some(s) = &mut self.swept {
            *s = (*s).min(expires_ms);
        }
    }

    /// `table` was swept in the transaction in progress: the earliest
    /// expiry left counts once it commits.
    pub fn swept(&mut self, conn: &Connection, table: &str) -> rusqlite::Result<()> {
        self.swept = Some(earliest(conn, table)?);
        Ok(())
    }

    pub fn committed(&mut self) {
        if let Some(s) = self.swept.take() {
            self.due = s;
        }
    }

    pub fn rolled_back(&mut self) {
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
