//! The kinds of record taskgate's store holds, registered with the engine
//! in one line each, and what opening and checking that store report.
//!
//! A kind of record is one module of `store/` that owns its tables' DDL (as
//! steps of [`super::migrate`]), its SQL, its record types, its operations
//! on [`Store`], its expiry sweep and its restart recovery, implementing
//! the engine's `RecordKind`. The engine reaches every kind only through
//! the registry below.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use taskgate_store_engine::{self as engine, Report};

use super::error::StoreError;
use super::handle::{IDENTITY_RECORDED_IN, Registry, Store, StoreOptions, system_clock};
use super::migrate;
use super::routes::Routes;
use super::tasks::{TaskId, Tasks};
use taskgate_store_engine::{OpenError, StoreId};

taskgate_store_engine::kinds! {
    /// Every kind of record's state on the store thread.
    pub struct Registered;
    recovery Recovery; status Status;
    options StoreOptions; refusal StoreError; steps migrate::STEPS;
    tasks: Tasks,
    routes: Routes,
}

impl Registry for Registered {
    fn for_options(options: &StoreOptions) -> Registered {
        Registered::new(options)
    }
}

/// What `taskgate check` found, without writing anything: every kind's
/// pending recovery and counts.
pub type CheckReport = engine::CheckReport<Recovery, Status>;

/// What opening for service did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenReport {
    /// A pristine file was initialised.
    pub initialized: bool,
    pub migrated_from: Option<i64>,
    /// Tasks that were working when the last process stopped, all ended by
    /// restart recovery (none is run again).
    pub recovered: u64,
    /// Of those, the ones whose cancel had been committed: they ended
    /// cancelled; the others failed as interrupted.
    pub cancelled: u64,
    /// The IDs of the recovered tasks.
    pub recovered_ids: Vec<TaskId>,
    pub retained: u64,
    pub unexpired: u64,
    /// What every kind's recovery ended.
    pub recovery: Recovery,
}

impl OpenReport {
    fn from(report: engine::OpenReport<Recovery, Status>) -> OpenReport {
        let tasks = &report.recovery.tasks;
        OpenReport {
            initialized: report.initialized,
            migrated_from: report.migrated_from,
            recovered: tasks.unfinished.len() as u64,
            cancelled: tasks.cancel_requested,
            recovered_ids: tasks.unfinished.clone(),
            retained: report.status.tasks.retained,
            unexpired: report.status.tasks.unexpired,
            recovery: report.recovery,
        }
    }

    /// Lines for the operator about what recovery ended, every kind's in
    /// registration order (none when nothing was in flight).
    pub fn recovery_lines(&self) -> Vec<String> {
        self.recovery.ended()
    }
}

impl Store<Registered> {
    /// Opens the store: starts the store thread, which validates, migrates
    /// and recovers the database, and returns once it is ready to serve.
    pub fn open(options: StoreOptions) -> Result<(Store<Registered>, OpenReport), OpenError> {
        Store::begin_open(options)?.recover()
    }

    /// Opens the store up to restart recovery: validated (a refused
    /// database is left exactly as it was), initialised or migrated, with
    /// the tasks recovery is about to end known, so that what was derived
    /// from them can go first (see [`Opening::unfinished`]).
    pub fn begin_open(options: StoreOptions) -> Result<Opening, OpenError> {
        let kinds = Registered::for_options(&options);
        Ok(Opening(engine::Handle::begin_open(
            options.engine(),
            kinds,
        )?))
    }
}

/// A store between validation and restart recovery; see
/// [`Store::begin_open`]. Dropping it closes the database unrecovered.
pub struct Opening(engine::Opening<Registered>);

impl Opening {
    /// The tasks that were working when the last process stopped: recovery
    /// ends every one of them (cancelled or failed), so nothing derived from
    /// a run that never committed (a spilled result) may outlive this.
    pub fn unfinished(&self) -> &[TaskId] {
        &self.0.recovery().tasks.unfinished
    }

    /// The identity of the opened store (chosen now if the database had
    /// none): the state directory records it beside the database.
    pub fn identity(&self) -> &StoreId {
        self.0.identity()
    }

    /// Runs restart recovery and returns the serving store.
    pub fn recover(self) -> Result<(Store<Registered>, OpenReport), OpenError> {
        let (engine, report) = self.0.recover()?;
        Ok((
            Store {
                engine,
                task_reads: Arc::new(AtomicU64::new(0)),
            },
            OpenReport::from(report),
        ))
    }
}

/// Runs every validation of opening without writing: for `taskgate check`
/// and for verifying backups. No file is created or changed.
pub fn check_read_only(db_path: &Path, max_db_pages: u64) -> Result<CheckReport, OpenError> {
    engine::check_read_only(
        db_path,
        max_db_pages,
        &system_clock(),
        &Registered::new(&StoreOptions::new(db_path)),
    )
}

/// [`check_read_only`] that also returns the database's identity, and
/// refuses, as `serve` would, a database that is not the store `recorded`
/// names (what the state directory recorded beside it).
pub fn check_identified(
    db_path: &Path,
    max_db_pages: u64,
    recorded: Option<&StoreId>,
) -> Result<(CheckReport, Option<StoreId>), OpenError> {
    engine::check_identified(
        db_path,
        max_db_pages,
        &system_clock(),
        &Registered::new(&StoreOptions::new(db_path)),
        recorded,
        IDENTITY_RECORDED_IN,
    )
}
