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
//! This file only declares and re-exports: every other file imports what
//! it needs from the file that defines it, so no two files of `store/`
//! import each other.

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
