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
    /// the caller's transaction or as one statement of its own; what it
    /// changes in the kind's counters counts once that commits.
    fn sweep(&mut self, conn: &Connection, now: i64, limit: u32) -> rusqlite::Result<u64>;

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
            let n = kind.sweep(conn, now, limit)?;
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
