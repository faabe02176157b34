//! The durable store: the only code that touches SQLite.
//!
//! The engine (the `taskgate-store-engine` crate) owns the store thread,
//! the bounded queue, group commit, the disabled latch, the timers,
//! opening, migrations and snapshots, and knows no schema. What taskgate
//! stores is here: each kind of record is a module of its own ([`tasks`],
//! [`routes`]) that owns its tables, SQL, record types, operations on
//! [`Store`], sweep and recovery, registered in [`kinds`]; the schema's
//! history is the ordered list of steps in [`migrate`].
//!
//! [`Store`] is a cheap, cloneable async handle ([`handle`]). Every
//! operation becomes a command on a bounded queue to the store thread; a
//! full queue is refused at once ([`StoreError::Busy`]); an admitted command
//! is answered only after its transaction committed. Every "now" comes
//! from the store's [`Clock`].
//!
//! Opening runs every startup validation on that thread before the handle
//! is returned, in two steps ([`Store::begin_open`], then
//! [`Opening::recover`]) so that whatever was derived from the tasks
//! restart recovery ends can be removed before recovery commits.
//!
//! Owns the only code that touches SQLite (with the engine it alone
//! reaches). Knows tasks only as records and digests; nothing of tools,
//! protocols or owners beyond a digest.
//!
//! This file only declares and re-exports: every other file imports what
//! it needs from the file that defines it, so no two files of `store/`
//! import each other (`tests/architecture.rs::the_store_s_files_import_each_other_in_no_circle`).
//!
//! `handle.rs`: `Store` over the engine's handle (cheap `Clone`; sends
//! commands, waits for answers) with taskgate's errors, `StoreOptions` (the
//! `[store]` settings as `config::StoreSettings`, with the path, the clock,
//! the expected identity and the test hooks, handed to the engine), the
//! engine's observer (commit and checkpoint timings for `/metrics`, the
//! disabled latch's journal event), and `system_clock` (the clock-skew test
//! hook). `error.rs`: `StoreError` (runtime, every text and wire code as
//! before the engine was a crate; the engine's refusals map into it) and
//! the exit classes of the engine's `OpenError` (65/74). `digest.rs`:
//! `Digest`. `outcome.rs`: `TaskStatus`, `Outcome`, `ErrorBody`, what both
//! kinds end with. `table.rs`: what every kind's table shares, written
//! once (owner-scoped and ID lookups, expiry deletion, the decode-all
//! loop).
//!
//! `kinds.rs`: the registration list (`kinds!`: one line per kind), the
//! concrete store's opening (`Store::open`, `begin_open`, `Opening`), the
//! `OpenReport` (the tasks' recovery as before, and every kind's), and
//! `check`'s `CheckReport` (every kind's pending recovery and counts).
//!
//! `migrate.rs`: the schema's history: an ordered list of versioned steps
//! (`STEPS`; step N takes version N − 1 to N and sets `user_version` in the
//! same transaction); `SCHEMA_VERSION` is the last step's. The engine runs
//! them: a pristine file runs every step and records the identity in one
//! transaction; an older database runs each missing step in a transaction
//! of its own; a newer one is refused (65).
//!
//! `tasks.rs`: the tasks kind: the `tasks` table's migration steps and its
//! unversioned owner index, its SQL (row decoding is strict), the record
//! types (`TaskId`, `TaskRecord`, …), the task operations of `Store`
//! (`create`, `get`, `finish`, `request_cancel`, …), the global and
//! per-owner live-task limits (the row count kept on the store thread
//! spares a count per creation), expiry, restart recovery and its report.
//!
//! `routes.rs`: the routes kind (migration step 3): the `routes` and
//! `leases` tables, with a trigger that refuses a second upstream task ID;
//! strict row decoding (the binding must match its digest and be JSON, the
//! phase must fit the terminal fields); `RouteId` (`tgr-` and 128 random
//! bits), `RoutePhase`, `RouteChange` applied only from the phases the
//! caller names (`advance_route`); `prepare_route`: the caller's route for
//! the same key and binding, `Conflict` for another binding, else a new
//! `prepared` route within `MAX_ROUTES` (4,096 in all) and
//! `MAX_ROUTES_PER_OWNER` (256 unexpired), counted in the transaction after
//! removing at most `ROUTE_SWEEP_ON_SUBMIT` (128) expired routes oldest
//! first; leases within `MAX_LEASES` and `MAX_LEASES_PER_OWNER`; a binding
//! of at most 8 KiB and a bounded terminal payload; counts by phase for
//! `status` and the operator's listing; restart recovery (`prepared` ends
//! failed with `TG_ROUTE_NOT_DISPATCHED`, `dispatching` needs
//! reconciliation, `routed` and `cancel_requested` keep their session) and
//! its report, which `check` and `status` show. The idempotency key and the
//! owner are digests; raw arguments are never stored, only the canonical
//! binding that carries their digest.
//!
//! Adding a kind of record (approval projections, say) is one module beside
//! `tasks.rs` implementing the engine's `RecordKind` with its operations on
//! `Store`, one step appended to `migrate::STEPS`, one `mod` line here and
//! one line in the `kinds!` list; nothing in the engine changes.
//!
//! Rules:
//!
//! - **One thread, one connection.** `Store::begin_open` spawns the thread; it
//!   opens, validates and migrates, reports back; recovery runs once the
//!   artifacts are consistent; then it loops. Handles talk to it over a
//!   `sync_channel` of `store.queue_depth` commands. `try_send` only: a full
//!   queue is `Busy` at once.
//!
//! - **Reads first, then one transaction for the writes.** A batch answers
//!   reads immediately, then runs every write in one `BEGIN IMMEDIATE`
//!   transaction, each under its own savepoint. Writers are answered only after
//!   `COMMIT` returned. A batch of nothing but runs' outcomes
//!   (`Store::finish_run`, which no client waits on) waits up to
//!   `OUTCOME_LINGER` (1 ms) for a command someone does wait on and takes it
//!   into the same commit, so a client creating tasks one after another pays
//!   one commit per task instead of two; the wait ends the moment such a
//!   command arrives, so it never delays one
//!   (`tests/store_behaviour.rs::a_runs_outcome_waits_for_the_next_creation_and_shares_its_commit`).
//!
//! - **Severity of an SQLite error.** `SQLITE_FULL` is capacity (page cap or
//!   full filesystem; reads and cleanup go on). `SQLITE_IOERR*`, `CORRUPT`,
//!   `NOTADB` latch the service disabled; a writer whose `COMMIT` failed hears
//!   `Uncertain`; nothing is retried.
//!
//! - **Nothing written to a database that will be refused.** Every validation
//!   runs read-only before the first write; `page_size` and `journal_mode` are
//!   set only on a pristine file; checkpoint-on-close stays off until a clean
//!   shutdown has done its own TRUNCATE checkpoint.
//!
//! - **Expiry.** Every read filters on expiry by the store's clock. A sweep
//!   deletes at most `SWEEP_BATCH` (128) records of each kind, once a second
//!   and once per batch holding a write that adds records
//!   (`WriteOp::makes_room`). Each table's sweep runs only when something can
//!   be due: `NextExpiry` (the engine's) keeps a lower bound on the table's earliest
//!   expiry (read at opening, lowered by every insert at once, raised only by a
//!   sweep whose transaction committed; an expiry is otherwise only ever
//!   raised), so a creation's batch runs no sweep statement while nothing has
//!   expired
//!   (the engine's `kind::tests::the_expiry_bound_rises_only_with_a_committed_sweep_and_never_past_an_added_row`,
//!   `tests/store_behaviour.rs::a_task_expiring_before_every_other_is_still_swept_on_time`).
//!   Every kind's sweep runs in one transaction (the timer's own, or a
//!   savepoint of the batch): when a later kind's deletion fails, the earlier
//!   kinds' are undone with it and their row counts give the deleted rows back,
//!   so the live limit always counts what the file holds
//!   (`tests/route_store.rs::a_failed_route_sweep_leaves_the_task_count_as_the_file_holds`).
//!
//! - **Recovery.** A task that was running ends `failed` with the interruption
//!   error, or `cancelled` when its cancel had been committed (that is what the
//!   client asked for, and the tool was being stopped). Nothing is re-run.

pub mod baseline;
mod digest;
mod error;
mod handle;
mod kinds;
mod migrate;
mod outcome;
mod routes;
mod table;
mod tasks;

pub use digest::Digest;
pub use error::{CapacityKind, StoreError};
pub use handle::{
    CheckpointReport, Clock, OUTCOME_LINGER, SnapshotReport, StoreOptions, system_clock,
};
pub use kinds::{
    CheckReport, OpenReport, Opening, Recovery, Registered, Status, check_identified,
    check_read_only,
};
pub use migrate::SCHEMA_VERSION;
pub use outcome::{ErrorBody, Outcome, TaskStatus};
pub use routes::{
    Advanced, Decider, LeaseRecord, MAX_LEASES, MAX_LEASES_PER_OWNER, MAX_ROUTES,
    MAX_ROUTES_PER_OWNER, NewRoute, Prepared, ROUTE_SWEEP_ON_SUBMIT, RouteChange, RouteCounts,
    RouteId, RoutePhase, RouteRecord, RouteRecovery,
};
pub use taskgate_store_engine::{
    MAX_BATCH, ManualClock, OpenError, Report, SNAPSHOT_STEP_PAGES, SWEEP_BATCH, SWEEP_INTERVAL,
    StoreId,
};
pub use tasks::{
    Created, MAX_PAYLOAD_BYTES, NewTask, ProposalRef, StoreStats, TERMINAL_RETENTION_MS,
    TaskCounts, TaskId, TaskRecord, TaskRecovery, waiting_for_approval,
};

/// The async handle to taskgate's store. Cloning is cheap.
pub type Store = handle::Store<Registered>;
