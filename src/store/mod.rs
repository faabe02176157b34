//! The durable store: the only code that touches SQLite.
//!
//! [`Store`] is a cheap, cloneable async handle. Every operation becomes a
//! command on a bounded queue to one dedicated thread ([`engine`]) that owns
//! the only connection. A full queue is refused at once ([`StoreError::Busy`]);
//! an admitted command is answered only after its transaction committed.
//! Each command carries its caller's tracing span, which the thread enters
//! while it executes it. Every "now" comes from the store's [`Clock`].
//!
//! The engine knows no schema. Each kind of record is a module of its own
//! (today [`tasks`]) that owns its tables, SQL, record types, operations,
//! sweep and recovery, registered in [`kinds`]; the schema's history is the
//! ordered list of steps in [`migrate`].
//!
//! Opening runs every startup validation on that thread before the handle is
//! returned ([`open`]), in two steps ([`Store::begin_open`], then
//! [`Opening::recover`]) so that whatever was derived from the tasks restart
//! recovery ends can be removed before recovery commits.
//!
//! Owns the only code that touches SQLite. Knows tasks only as
//! records and digests; nothing of tools, protocols or owners beyond a digest.
//!
//! `mod.rs`: The handle: `Store` (cheap `Clone`; sends commands, waits for
//! answers), `StoreError` (runtime), `OpenError` (refusals 65/74),
//! `StoreOptions` (the `[store]` settings as `config::StoreSettings`, with the
//! path, the clock, the expected identity and the test hooks), `StoreId` and
//! `Digest`, the named bounds (`MAX_PAYLOAD_BYTES`, `SWEEP_BATCH`,
//! `SWEEP_INTERVAL`, `TERMINAL_RETENTION_MS`, `MAX_BATCH`), the one hex
//! encoder; the record types are re-exported from their kind.
//!
//! `engine.rs`: The store thread, which knows no schema: the queue, batches,
//! group commit with a savepoint per write, error severity and the disabled
//! latch, the sweep and checkpoint timers (run at the time their turn of the
//! loop began, so never at a time a caller saw only after its answer: a manual
//! clock moved between answers cannot race them), online snapshots, clean
//! close. It runs what the kinds build: a `ReadOp` (answered at once; its SQL
//! error mapped by severity) or a `WriteOp` (applied inside the batch's
//! transaction, answered only once that transaction's fate is known); `Read`
//! and `Write` make either from a closure. Each command runs inside the span
//! its caller sent with it.
//!
//! `kinds.rs`: `RecordKind`, what every kind of record provides (shape check,
//! strict decoding of every record, unversioned schema objects, restart
//! recovery, counters loaded after recovery, a bounded expiry sweep, and
//! commit/rollback of its pending counter changes), and the registration list
//! (`kinds!`: one line per kind).
//!
//! `migrate.rs`: The schema's history: an ordered list of versioned steps
//! (`STEPS`; step N takes version N − 1 to N and sets `user_version` in the
//! same transaction); `SCHEMA_VERSION` is the last step's. A pristine file runs
//! every step and records the identity in one transaction; an older database
//! runs each missing step in a transaction of its own; a newer one is refused
//! (65).
//!
//! `open.rs`: Opening: pragmas and their read-back, version classification, the
//! integrity check, every kind's shape check and decoding, migration, the
//! store's identity (a one-row `store_identity` table, compared with the one
//! recorded in `tasks.lock` before anything is written), restart recovery
//! (every kind's, one transaction), and the read-only variant for `check`; the
//! `file:` URI percent-encodes the path's bytes.
//!
//! `tasks.rs`: The tasks kind: the `tasks` table's migration steps and its
//! unversioned owner index, its SQL (row decoding is strict), the record types
//! (`TaskId`, `TaskRecord`, `Outcome`, …), the task operations of `Store`
//! (`create`, `get`, `finish`, `request_cancel`, …), the global and per-owner
//! live-task limits (the row count kept on the store thread spares a count per
//! creation), expiry and restart recovery.
//!
//! `routes.rs`: The routes kind (migration step 3): the `routes` and `leases`
//! tables, with a trigger that refuses a second upstream task ID; strict row
//! decoding (the binding must match its digest and be JSON, the phase must fit
//! the terminal fields); `RouteId` (`tgr-` and 128 random bits), `RoutePhase`,
//! `RouteChange` applied only from the phases the caller names
//! (`advance_route`); `prepare_route`: the caller's route for the same key and
//! binding, `Conflict` for another binding, else a new `prepared` route within
//! `MAX_ROUTES` (4,096 in all) and `MAX_ROUTES_PER_OWNER` (256 unexpired),
//! counted in the transaction after removing at most `ROUTE_SWEEP_ON_SUBMIT`
//! (128) expired routes oldest first; leases within `MAX_LEASES` and
//! `MAX_LEASES_PER_OWNER`; a binding of at most 8 KiB and a bounded terminal
//! payload; counts by phase for `status` and the operator's listing; restart
//! recovery (`prepared` ends failed with `TG_ROUTE_NOT_DISPATCHED`,
//! `dispatching` needs reconciliation, `routed` and `cancel_requested` keep
//! their session). The idempotency key and the owner are digests; raw arguments
//! are never stored, only the canonical binding that carries their digest.
//!
//! Adding a kind of record (routes, approval projections) is one module beside
//! `tasks.rs` implementing `RecordKind` with its operations on `Store`, one
//! step appended to `migrate::STEPS`, and one line in the `kinds!` list; the
//! engine, the opening code and the migration runner do not change.
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
//!   be due: `kinds::NextExpiry` keeps a lower bound on the table's earliest
//!   expiry (read at opening, lowered by every insert at once, raised only by a
//!   sweep whose transaction committed; an expiry is otherwise only ever
//!   raised), so a creation's batch runs no sweep statement while nothing has
//!   expired
//!   (`kinds::tests::the_expiry_bound_rises_only_with_a_committed_sweep_and_never_past_an_added_row`,
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
mod clock;
mod engine;
mod kinds;
mod migrate;
mod open;
mod routes;
mod tasks;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use sha2::{Digest as _, Sha256};
use thiserror::Error;
use tokio::sync::oneshot;

use crate::config::StoreSettings;
use crate::exit::{Classify, ExitClass};
use engine::{Command, Envelope};

pub use clock::{Clock, ManualClock};
pub use migrate::SCHEMA_VERSION;
pub use open::{CheckReport, OpenReport, check_identified, check_read_only};
pub use routes::{
    Advanced, Decider, LeaseRecord, MAX_LEASES, MAX_LEASES_PER_OWNER, MAX_ROUTES,
    MAX_ROUTES_PER_OWNER, NewRoute, Prepared, ROUTE_SWEEP_ON_SUBMIT, RouteChange, RouteCounts,
    RouteId, RoutePhase, RouteRecord,
};
pub use tasks::{
    Created, ErrorBody, NewTask, Outcome, ProposalRef, TaskId, TaskRecord, TaskStatus,
    waiting_for_approval,
};

/// Largest encoded terminal payload a record may hold (16 KiB); larger
/// results are spilled to artifacts.
pub const MAX_PAYLOAD_BYTES: usize = 16 * 1024;
/// Expired rows deleted per sweep, and per creation batch.
pub const SWEEP_BATCH: u32 = 128;
/// How often the store thread sweeps expired rows.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(1);
/// A terminal task stays readable at least this long after it finished.
pub const TERMINAL_RETENTION_MS: i64 = 3_600_000;
/// Most commands the store thread takes into one group commit.
pub const MAX_BATCH: usize = 256;
/// How long a batch holding only runs' outcomes waits for a write that a
/// client waits on (the next creation, usually), so that both share one
/// commit. Never delays such a write; delays an outcome's commit at most
/// this much.
pub const OUTCOME_LINGER: Duration = Duration::from_millis(1);
/// Pages an online snapshot copies per step (1 MiB at the 4 KiB page
/// size). Between two steps the store thread serves every command that is
/// waiting, so a snapshot delays a create by at most one step's copy.
pub const SNAPSHOT_STEP_PAGES: i32 = 256;

pub use crate::ids::StoreId;

/// A sha256 digest. Owners, creation references and request identities are
/// stored only in this form, never raw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    pub fn of(bytes: &[u8]) -> Digest {
        Digest(Sha256::digest(bytes).into())
    }

    /// A digest of several parts, each length-prefixed so that
    /// ("ab","c") and ("a","bc") differ.
    pub fn of_parts(parts: &[&[u8]]) -> Digest {
        let mut h = Sha256::new();
        for p in parts {
            h.update((p.len() as u64).to_be_bytes());
            h.update(p);
        }
        Digest(h.finalize().into())
    }

    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Why a creation hit a capacity bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CapacityKind {
    /// `store.max_live_tasks` unexpired rows exist.
    LiveTasks { limit: u64 },
    /// The owner holds `store.max_live_tasks_per_owner` unexpired tasks.
    OwnerTasks { limit: u64 },
    /// SQLite reached `max_page_count` (cleanup still works).
    PageCap { pages: u64 },
    /// The filesystem is full (cleanup may need space too).
    DiskFull,
}

impl std::fmt::Display for CapacityKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CapacityKind::LiveTasks { limit } => {
                write!(f, "{limit} unexpired tasks retained (store.max_live_tasks)")
            }
            CapacityKind::OwnerTasks { limit } => {
                write!(
                    f,
                    "this caller already holds {limit} unexpired tasks (store.max_live_tasks_per_owner); wait until some expire"
                )
            }
            CapacityKind::PageCap { pages } => {
                write!(
                    f,
                    "database page cap of {pages} pages reached (store.max_db_pages)"
                )
            }
            CapacityKind::DiskFull => {
                f.write_str("the filesystem under the state directory is full")
            }
        }
    }
}

/// Errors of store operations after a successful open.
#[derive(Debug, Clone, Error, PartialEq)]
pub enum StoreError {
    #[error("task store busy: its queue of {depth} commands is full; retry shortly")]
    Busy { depth: usize },
    #[error("task store at capacity: {0}")]
    Capacity(CapacityKind),
    #[error("task store disabled until restart: {reason}")]
    Disabled { reason: String },
    #[error("task store write outcome unknown ({detail}); the store is now disabled until restart")]
    Uncertain { detail: String },
    #[error("operation reference reused with a different request")]
    Conflict,
    #[error("{}", route_capacity(*limit, *per_caller))]
    RouteCapacity { limit: u64, per_caller: bool },
    #[error("payload of {size} bytes exceeds the {limit}-byte record limit")]
    PayloadTooLarge { size: usize, limit: usize },
    #[error("invalid task parameters: {0}")]
    Invalid(String),
    #[error("task store stopped")]
    Stopped,
    #[error("task store error: {0}")]
    Internal(String),
}

/// Errors that refuse opening the store (startup steps 4–7).
fn route_capacity(limit: u64, per_caller: bool) -> String {
    if per_caller {
        format!(
            "this caller already holds {limit} unexpired routes or leases; wait until some expire"
        )
    } else {
        format!("{limit} route or lease records are held in all; wait until some expire")
    }
}

#[derive(Debug, Error)]
pub enum OpenError {
    #[error(
        "{path}: pragma {name} reads back {found}, expected {expected}{hint}; restore a known-good snapshot or fix the setting"
    )]
    Pragma {
        path: PathBuf,
        name: &'static str,
        expected: String,
        found: String,
        hint: &'static str,
    },
    #[error(
        "{path}: schema version {found} is newer than this taskgate supports ({supported}); run the newer taskgate or restore a snapshot made by this version"
    )]
    FutureVersion {
        path: PathBuf,
        found: i64,
        supported: i64,
    },
    #[error(
        "{path}: a non-empty database without a taskgate schema version; it is not a taskgate store: move it out of the state directory"
    )]
    Unversioned { path: PathBuf },
    #[error(
        "{path}: database is corrupt ({detail}); stop, keep this file as evidence and restore a known-good snapshot (never replace it with an empty one)"
    )]
    Corrupt { path: PathBuf, detail: String },
    #[error(
        "{path}: {kind} {record} has an undecodable payload ({detail}); keep this file as evidence and restore a known-good snapshot"
    )]
    Undecodable {
        path: PathBuf,
        /// The kind of record ("task").
        kind: &'static str,
        record: String,
        detail: String,
    },
    #[error(
        "{path}: schema does not match version {version} ({detail}); keep this file as evidence and restore a known-good snapshot"
    )]
    SchemaMismatch {
        path: PathBuf,
        version: i64,
        detail: String,
    },
    #[error(
        "{path}: I/O error while {during}: {detail}; check the disk (dmesg, free space) before starting again"
    )]
    Io {
        path: PathBuf,
        during: &'static str,
        detail: String,
    },
    #[error(
        "{path}: database replaced: {found}, but this state directory held store {expected} (recorded in tasks.lock); restore the store's snapshot or move the directory aside"
    )]
    Replaced {
        path: PathBuf,
        expected: StoreId,
        found: String,
    },
    #[error("the store thread could not start: {0}")]
    Thread(String),
}

impl Classify for OpenError {
    fn exit_class(&self) -> ExitClass {
        match self {
            OpenError::Io { .. } | OpenError::Thread(_) => ExitClass::Io,
            _ => ExitClass::DatabaseInvalid,
        }
    }
}

/// Counts reported in systemd's STATUS= line and by `/readyz`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreStats {
    pub retained: u64,
    pub unexpired: u64,
}

/// The outcome of `wal_checkpoint(TRUNCATE)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointReport {
    pub busy: bool,
    pub wal_frames: i64,
    pub checkpointed_frames: i64,
}

/// What an online snapshot copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotReport {
    /// Database pages in the copy.
    pub pages: u64,
    /// Steps it took; command batches were served between them.
    pub steps: u64,
    /// Batches of commands served while it was written.
    pub batches_between: u64,
}

/// Settings of an opened store.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub db_path: PathBuf,
    /// `[store]`: its queue, its live-task bounds, its checkpoints and its
    /// page cap.
    pub settings: StoreSettings,
    /// Where every "now" of the store comes from.
    pub clock: Clock,
    /// The identity the state directory recorded for its store, if any: a
    /// database that is not that store (missing, empty, another store's or
    /// one without an identity) is refused before anything is written.
    pub expected_identity: Option<StoreId>,
    /// Test hook: while this file exists the store thread takes no command.
    #[doc(hidden)]
    pub stall_file: Option<PathBuf>,
    /// Test hook: while this file exists every command is refused as busy.
    #[doc(hidden)]
    pub busy_file: Option<PathBuf>,
    /// Test hook: while this file exists no expired row is deleted.
    #[doc(hidden)]
    pub hold_sweep_file: Option<PathBuf>,
    /// How long a batch of runs' outcomes waits for company
    /// ([`OUTCOME_LINGER`]; tests lengthen it to make the wait certain).
    #[doc(hidden)]
    pub outcome_linger: Duration,
}

impl StoreOptions {
    /// A store at `db_path` with every `[store]` key at its default.
    pub fn new(db_path: impl Into<PathBuf>) -> StoreOptions {
        StoreOptions {
            db_path: db_path.into(),
            settings: StoreSettings::default(),
            clock: Clock::system(),
            expected_identity: None,
            stall_file: None,
            busy_file: None,
            hold_sweep_file: None,
            outcome_linger: OUTCOME_LINGER,
        }
    }

    pub fn from_settings(db_path: &Path, s: &StoreSettings) -> StoreOptions {
        StoreOptions {
            db_path: db_path.to_path_buf(),
            settings: s.clone(),
            clock: Clock::system(),
            expected_identity: None,
            stall_file: crate::testhooks::stall_file(),
            busy_file: crate::testhooks::busy_file(),
            hold_sweep_file: crate::testhooks::hold_sweep_file(),
            outcome_linger: OUTCOME_LINGER,
        }
    }
}

type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// State shared between the handles and the store thread.
struct Shared {
    depth: usize,
    /// The database's write-ahead log, whose size `/metrics` shows.
    wal_path: PathBuf,
    /// Test hook: while this file exists every command is refused as busy.
    busy_file: Option<PathBuf>,
    /// Set once, never cleared: the reason the service latched disabled.
    disabled: Mutex<Option<String>>,
    /// Incremented every time the store thread finishes a loop: the
    /// watchdog's evidence of progress when the queue is too full to ping.
    progress: AtomicU64,
    /// Task reads asked of the store thread (`get`), for pacing evidence.
    task_reads: AtomicU64,
    /// Commands sent and not yet taken by the store thread. Counted before
    /// the send (and given back when it fails), so it never goes below
    /// zero for long; readers clamp it.
    queued: AtomicI64,
    /// Wall-clock ms of the last TRUNCATE checkpoint that completed; 0
    /// before the first.
    last_checkpoint_ms: AtomicI64,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Shared {
    fn disabled_reason(&self) -> Option<String> {
        self.disabled.lock().ok().and_then(|g| g.clone())
    }

    fn latch(&self, reason: String) {
        if let Ok(mut g) = self.disabled.lock()
            && g.is_none()
        {
            tracing::error!(
                message_id = crate::events::STORE_DISABLED,
                reason = %reason,
                "task store disabled until restart: {reason}"
            );
            *g = Some(reason);
        }
    }
}

/// The async handle to the store. Cloning is cheap.
#[derive(Clone)]
pub struct Store {
    tx: SyncSender<Envelope>,
    shared: Arc<Shared>,
    clock: Clock,
}

impl Store {
    /// Opens the store: starts the store thread, which validates, migrates
    /// and recovers the database, and returns once it is ready to serve.
    pub fn open(options: StoreOptions) -> Result<(Store, OpenReport), OpenError> {
        Store::begin_open(options)?.recover()
    }

    /// Opens the store up to restart recovery: validated (a refused
    /// database is left exactly as it was), initialised or migrated, with
    /// the tasks recovery is about to end known, so that what was derived
    /// from them can go first (see [`Opening::unfinished`]).
    pub fn begin_open(options: StoreOptions) -> Result<Opening, OpenError> {
        let (tx, rx) = mpsc::sync_channel(options.settings.queue_depth);
        let clock = options.clock.clone();
        let mut wal_path = options.db_path.clone().into_os_string();
        wal_path.push("-wal");
        let shared = Arc::new(Shared {
            depth: options.settings.queue_depth,
            wal_path: PathBuf::from(wal_path),
            busy_file: options.busy_file.clone(),
            disabled: Mutex::new(None),
            progress: AtomicU64::new(0),
            task_reads: AtomicU64::new(0),
            queued: AtomicI64::new(0),
            last_checkpoint_ms: AtomicI64::new(0),
            thread: Mutex::new(None),
        });
        let (ready_tx, ready) = mpsc::channel();
        let (go, go_rx) = mpsc::channel();
        let thread_shared = shared.clone();
        let handle = std::thread::Builder::new()
            .name("taskgate-store".into())
            .spawn(move || engine::run(options, rx, thread_shared, ready_tx, go_rx))
            .map_err(|e| OpenError::Thread(e.to_string()))?;
        let (unfinished, identity) = match ready.recv() {
            Ok(Ok(engine::Stage::Prepared(ids, identity))) => (ids, identity),
            Ok(Ok(engine::Stage::Recovered(_))) => {
                let _ = handle.join();
                return Err(OpenError::Thread("the store thread skipped a stage".into()));
            }
            Ok(Err(e)) => {
                let _ = handle.join();
                return Err(e);
            }
            Err(_) => {
                let _ = handle.join();
                return Err(OpenError::Thread(
                    "the store thread ended during startup".into(),
                ));
            }
        };
        Ok(Opening {
            store: Store { tx, shared, clock },
            ready,
            go,
            handle: Some(handle),
            unfinished,
            identity,
        })
    }

    /// Sends a command and waits for its answer.
    async fn call<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, StoreError> {
        if let Some(reason) = self.shared.disabled_reason() {
            return Err(StoreError::Disabled { reason });
        }
        let (reply, answer) = oneshot::channel();
        self.try_send(Envelope::new(make(reply)))?;
        // A dropped reply means the thread ended without answering: never a
        // success.
        answer.await.map_err(|_| StoreError::Stopped)?
    }

    /// A read a kind of record asks for: answered at once on the store
    /// thread.
    async fn read_op<T: Send + 'static>(
        &self,
        during: &'static str,
        body: impl FnOnce(&engine::ReadCx<'_>) -> Result<T, engine::OpError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.call(move |reply| {
            Command::Read(Box::new(engine::Read {
                during,
                body,
                reply,
            }))
        })
        .await
    }

    /// A write a kind of record asks for, applied inside the batch's
    /// transaction and answered once that transaction's fate is known;
    /// `makes_room` for one that adds a row.
    async fn write_op<T: Send + 'static>(
        &self,
        during: &'static str,
        makes_room: bool,
        body: impl FnMut(&mut engine::Tx<'_>) -> Result<T, engine::OpError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.write_with(during, makes_room, false, body).await
    }

    /// A write nobody waits on to answer a client (a run's outcome): its
    /// batch may wait up to [`OUTCOME_LINGER`] for a write somebody does
    /// wait on, to share its commit.
    async fn lingering_write_op<T: Send + 'static>(
        &self,
        during: &'static str,
        body: impl FnMut(&mut engine::Tx<'_>) -> Result<T, engine::OpError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.write_with(during, false, true, body).await
    }

    async fn write_with<T: Send + 'static>(
        &self,
        during: &'static str,
        makes_room: bool,
        lingers: bool,
        body: impl FnMut(&mut engine::Tx<'_>) -> Result<T, engine::OpError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.call(move |reply| {
            Command::Write(Box::new(engine::Write {
                during,
                makes_room,
                lingers,
                body,
                reply,
                done: None,
            }))
        })
        .await
    }

    /// Answers when the store thread takes commands (the watchdog's probe).
    pub async fn ping(&self) -> Result<(), StoreError> {
        let (reply, answer) = oneshot::channel();
        self.try_send(Envelope::new(Command::Ping { reply }))?;
        answer.await.map_err(|_| StoreError::Stopped)?
    }

    /// Queues a command without waiting: a full queue is `Busy` at once.
    fn try_send(&self, envelope: Envelope) -> Result<(), StoreError> {
        if self.shared.busy_file.as_ref().is_some_and(|f| f.exists()) {
            return Err(StoreError::Busy {
                depth: self.shared.depth,
            });
        }
        self.shared.queued.fetch_add(1, Ordering::Relaxed);
        let sent = self.tx.try_send(envelope);
        if sent.is_err() {
            self.shared.queued.fetch_sub(1, Ordering::Relaxed);
        }
        match sent {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(StoreError::Busy {
                depth: self.shared.depth,
            }),
            Err(TrySendError::Disconnected(_)) => Err(StoreError::Stopped),
        }
    }

    /// Runs one expiry sweep now (the timer does this every second);
    /// returns the number of rows deleted, at most [`SWEEP_BATCH`].
    pub async fn sweep_now(&self) -> Result<u64, StoreError> {
        self.call(|reply| Command::Sweep { reply }).await
    }

    /// Runs `wal_checkpoint(TRUNCATE)` now.
    pub async fn checkpoint_now(&self) -> Result<CheckpointReport, StoreError> {
        self.call(|reply| Command::Checkpoint { reply }).await
    }

    /// Writes a consistent copy of the database to `dest`, a new empty file
    /// the caller created, while the store goes on serving: the copy is
    /// made on the store thread in steps of [`SNAPSHOT_STEP_PAGES`] pages,
    /// with the commands waiting served between steps. Writes made during
    /// the copy reach it too (SQLite's backup API updates the pages already
    /// copied when the same connection changes them), so the copy is the
    /// database as of the moment the last step finished. The copy is not
    /// synced: the caller syncs it with the rest of the snapshot.
    pub async fn snapshot(&self, dest: &Path) -> Result<SnapshotReport, StoreError> {
        let dest = dest.to_path_buf();
        self.call(|reply| Command::Snapshot { dest, reply }).await
    }

    /// Commands waiting in the store's queue now.
    pub fn queued(&self) -> usize {
        self.shared.queued.load(Ordering::Relaxed).max(0) as usize
    }

    /// The bound on the store's queue (`store.queue_depth`).
    /// The database's write-ahead log file.
    pub fn wal_path(&self) -> &Path {
        &self.shared.wal_path
    }

    pub fn queue_capacity(&self) -> usize {
        self.shared.depth
    }

    /// When the last TRUNCATE checkpoint completed (wall-clock ms), if one
    /// has since this process opened the store.
    pub fn last_checkpoint_ms(&self) -> Option<i64> {
        match self.shared.last_checkpoint_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(ms),
        }
    }

    /// The clock the store reads "now" from, for callers that must agree
    /// with it.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Why the service latched disabled, if it did.
    pub fn disabled_reason(&self) -> Option<String> {
        self.shared.disabled_reason()
    }

    /// A counter the store thread advances as it works.
    pub fn progress(&self) -> u64 {
        self.shared.progress.load(Ordering::Relaxed)
    }

    /// Final TRUNCATE checkpoint, close, and join the store thread. Commands
    /// queued before this are answered first.
    pub async fn shutdown(&self) -> Result<(), StoreError> {
        let (reply, answer) = oneshot::channel();
        // Shutdown waits for queue space: it must not be lost to a burst.
        let tx = self.tx.clone();
        let shared = self.shared.clone();
        let sent = tokio::task::spawn_blocking(move || {
            shared.queued.fetch_add(1, Ordering::Relaxed);
            let sent = tx.send(Envelope::new(Command::Shutdown { reply })).is_ok();
            if !sent {
                shared.queued.fetch_sub(1, Ordering::Relaxed);
            }
            sent
        })
        .await
        .map_err(|e| StoreError::Internal(e.to_string()))?;
        let result = match sent {
            true => answer.await.unwrap_or(Err(StoreError::Stopped)),
            false => Err(StoreError::Stopped),
        };
        let handle = self.shared.thread.lock().ok().and_then(|mut g| g.take());
        if let Some(h) = handle {
            let _ = tokio::task::spawn_blocking(move || h.join()).await;
        }
        result
    }
}

/// A store between validation and restart recovery; see
/// [`Store::begin_open`]. Dropping it closes the database unrecovered.
pub struct Opening {
    store: Store,
    ready: mpsc::Receiver<Result<engine::Stage, OpenError>>,
    go: mpsc::Sender<()>,
    handle: Option<JoinHandle<()>>,
    unfinished: Vec<TaskId>,
    identity: StoreId,
}

impl Opening {
    /// The tasks that were working when the last process stopped: recovery
    /// ends every one of them (cancelled or failed), so nothing derived from
    /// a run that never committed (a spilled result) may outlive this.
    pub fn unfinished(&self) -> &[TaskId] {
        &self.unfinished
    }

    /// The identity of the opened store (chosen now if the database had
    /// none): the state directory records it beside the database.
    pub fn identity(&self) -> &StoreId {
        &self.identity
    }

    /// Runs restart recovery and returns the serving store.
    pub fn recover(mut self) -> Result<(Store, OpenReport), OpenError> {
        let handle = self.handle.take();
        let join = |h: Option<JoinHandle<()>>| {
            if let Some(h) = h {
                let _ = h.join();
            }
        };
        if self.go.send(()).is_err() {
            join(handle);
            return Err(OpenError::Thread(
                "the store thread ended during startup".into(),
            ));
        }
        match self.ready.recv() {
            Ok(Ok(engine::Stage::Recovered(report))) => {
                if let Ok(mut g) = self.store.shared.thread.lock() {
                    *g = handle;
                }
                Ok((self.store.clone(), report))
            }
            Ok(Ok(engine::Stage::Prepared(..))) => {
                join(handle);
                Err(OpenError::Thread(
                    "the store thread repeated a stage".into(),
                ))
            }
            Ok(Err(e)) => {
                join(handle);
                Err(e)
            }
            Err(_) => {
                join(handle);
                Err(OpenError::Thread(
                    "the store thread ended during startup".into(),
                ))
            }
        }
    }
}

impl Drop for Opening {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            // Without the go-ahead the thread closes the database and ends.
            let (dead, _) = mpsc::channel();
            drop(std::mem::replace(&mut self.go, dead));
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_parts_are_unambiguous() {
        assert_ne!(
            Digest::of_parts(&[b"ab", b"c"]),
            Digest::of_parts(&[b"a", b"bc"])
        );
    }
}
