//! The durable task store: the only code that touches SQLite.
//!
//! [`Store`] is a cheap, cloneable async handle. Every operation becomes a
//! command on a bounded queue to one dedicated thread ([`worker`]) that owns
//! the only connection. A full queue is refused at once ([`StoreError::Busy`]);
//! an admitted command is answered only after its transaction committed.
//! Each command carries its caller's tracing span, which the thread enters
//! while it executes it. Every "now" comes from the store's [`Clock`].
//!
//! Opening runs every startup validation on that thread before the handle is
//! returned ([`schema`]), in two steps ([`Store::begin_open`], then
//! [`Opening::recover`]) so that whatever was derived from the tasks restart
//! recovery ends can be removed before recovery commits.

pub mod baseline;
mod clock;
mod records;
mod schema;
mod worker;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use thiserror::Error;
use tokio::sync::oneshot;

use crate::config::StoreSettings;
use crate::exit::{Classify, ExitClass};

pub use clock::{Clock, ManualClock};
pub use schema::{CheckReport, OpenReport, SCHEMA_VERSION, check_identified, check_read_only};

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
/// Pages an online snapshot copies per step (1 MiB at the 4 KiB page
/// size). Between two steps the store thread serves every command that is
/// waiting, so a snapshot delays a create by at most one step's copy.
pub const SNAPSHOT_STEP_PAGES: i32 = 256;

/// A public task identifier: 128 random bits, hex, with a `tg-` prefix.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId(String);

impl TaskId {
    const PREFIX: &'static str = "tg-";

    /// A fresh identifier from the operating system's random source.
    pub fn generate() -> Result<TaskId, getrandom::Error> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes)?;
        Ok(TaskId(format!("{}{}", Self::PREFIX, hex(&bytes))))
    }

    /// Accepts only the exact shape `generate` produces, so a malformed ID is
    /// just another unknown ID.
    pub fn parse(s: &str) -> Option<TaskId> {
        let rest = s.strip_prefix(Self::PREFIX)?;
        (rest.len() == 32 && rest.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
            .then(|| TaskId(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for TaskId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A store's identity: 128 random bits, hex, chosen when its database is
/// initialised and kept in it for life. The state directory records it
/// beside the database (in `tasks.lock`), so an empty or replaced
/// `tasks.db` under existing task handles is recognised and refused rather
/// than served as a new, empty store.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StoreId(String);

impl StoreId {
    /// A fresh identity from the operating system's random source.
    pub fn generate() -> Result<StoreId, getrandom::Error> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes)?;
        Ok(StoreId(hex(&bytes)))
    }

    /// Accepts only the exact shape `generate` produces.
    pub fn parse(s: &str) -> Option<StoreId> {
        (s.len() == 32 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
            .then(|| StoreId(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for StoreId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

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

/// The five task states of the MCP Tasks extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    Working,
    InputRequired,
    Completed,
    Failed,
    Cancelled,
}

impl TaskStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Working => "working",
            TaskStatus::InputRequired => "input_required",
            TaskStatus::Completed => "completed",
            TaskStatus::Failed => "failed",
            TaskStatus::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<TaskStatus> {
        Some(match s {
            "working" => TaskStatus::Working,
            "input_required" => TaskStatus::InputRequired,
            "completed" => TaskStatus::Completed,
            "failed" => TaskStatus::Failed,
            "cancelled" => TaskStatus::Cancelled,
            _ => return None,
        })
    }

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskStatus::Completed | TaskStatus::Failed | TaskStatus::Cancelled
        )
    }
}

/// A JSON-RPC error as kept in a failed task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorBody {
    pub code: i64,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
}

/// The terminal payload of a task: the tool's result, or a JSON-RPC error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum Outcome {
    Result(serde_json::Value),
    Error(ErrorBody),
}

impl Outcome {
    /// The payload every task interrupted by a restart carries.
    pub fn interrupted() -> Outcome {
        let w = crate::wire::TASK_INTERRUPTED;
        Outcome::Error(ErrorBody {
            code: w.code,
            message: "task interrupted: the daemon stopped while it ran; it was not run again"
                .into(),
            data: Some(w.data()),
        })
    }

    fn encode(&self) -> Vec<u8> {
        // Serialising a Value-based enum cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// A task as stored, without the digests it is looked up by.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskRecord {
    pub id: TaskId,
    pub status: TaskStatus,
    pub status_message: Option<String>,
    pub created_ms: i64,
    pub updated_ms: i64,
    pub expires_ms: i64,
    pub poll_interval_ms: i64,
    pub outcome: Option<Outcome>,
    pub cancel_requested: bool,
}

impl TaskRecord {
    /// Time to live as the protocol reports it: relative to creation.
    pub fn ttl_ms(&self) -> i64 {
        self.expires_ms - self.created_ms
    }
}

/// What a creation asks for.
#[derive(Debug, Clone)]
pub struct NewTask {
    pub owner: Digest,
    /// The creation reference (an operation identity chosen by the client).
    pub reference: Option<Digest>,
    /// The identity of the request (tool and canonical arguments): a repeat
    /// of `reference` with another request is a conflict.
    pub request: Option<Digest>,
    pub ttl_ms: i64,
    pub poll_interval_ms: i64,
}

/// The answer to a creation.
#[derive(Debug, Clone, PartialEq)]
pub enum Created {
    New(TaskRecord),
    /// The owner already created a task under this reference: its handle.
    Existing(TaskRecord),
}

impl Created {
    pub fn record(&self) -> &TaskRecord {
        match self {
            Created::New(r) | Created::Existing(r) => r,
        }
    }
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
        "{path}: task {task} has an undecodable payload ({detail}); keep this file as evidence and restore a known-good snapshot"
    )]
    Undecodable {
        path: PathBuf,
        task: String,
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
    pub queue_depth: usize,
    pub max_live_tasks: u64,
    /// Unexpired tasks one owner may hold.
    pub max_live_tasks_per_owner: u64,
    pub checkpoint_interval: Duration,
    pub max_db_pages: u64,
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
}

impl StoreOptions {
    pub fn new(db_path: impl Into<PathBuf>) -> StoreOptions {
        use crate::config::bounds;
        StoreOptions {
            db_path: db_path.into(),
            queue_depth: bounds::QUEUE_DEPTH_DEFAULT as usize,
            max_live_tasks: bounds::MAX_LIVE_TASKS_DEFAULT,
            max_live_tasks_per_owner: bounds::MAX_LIVE_TASKS_DEFAULT,
            checkpoint_interval: Duration::from_secs(bounds::CHECKPOINT_INTERVAL_SECS_DEFAULT),
            max_db_pages: bounds::MAX_DB_PAGES_DEFAULT,
            clock: Clock::system(),
            expected_identity: None,
            stall_file: None,
            busy_file: None,
            hold_sweep_file: None,
        }
    }

    pub fn from_settings(db_path: &Path, s: &StoreSettings) -> StoreOptions {
        StoreOptions {
            db_path: db_path.to_path_buf(),
            queue_depth: s.queue_depth,
            max_live_tasks: s.max_live_tasks,
            max_live_tasks_per_owner: s.max_live_tasks_per_owner,
            checkpoint_interval: s.checkpoint_interval,
            max_db_pages: s.max_db_pages,
            clock: Clock::system(),
            expected_identity: None,
            stall_file: crate::testhooks::stall_file(),
            busy_file: crate::testhooks::busy_file(),
            hold_sweep_file: crate::testhooks::hold_sweep_file(),
        }
    }
}

type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// What the store thread is asked to do.
enum Command {
    Create {
        new: NewTask,
        reply: Reply<Created>,
    },
    Get {
        id: TaskId,
        owner: Digest,
        reply: Reply<Option<TaskRecord>>,
    },
    FindReference {
        owner: Digest,
        reference: Digest,
        request: Option<Digest>,
        reply: Reply<Option<TaskRecord>>,
    },
    Finish {
        id: TaskId,
        status: TaskStatus,
        payload: Option<Vec<u8>>,
        reply: Reply<Option<TaskRecord>>,
    },
    RequestCancel {
        id: TaskId,
        owner: Digest,
        reply: Reply<Option<TaskRecord>>,
    },
    Stats {
        reply: Reply<StoreStats>,
    },
    Unexpired {
        ids: Vec<TaskId>,
        reply: Reply<Vec<bool>>,
    },
    Ping {
        reply: Reply<()>,
    },
    Sweep {
        reply: Reply<u64>,
    },
    Checkpoint {
        reply: Reply<CheckpointReport>,
    },
    /// Copy the database to a new file at `dest` (which must exist, empty).
    Snapshot {
        dest: PathBuf,
        reply: Reply<SnapshotReport>,
    },
    Shutdown {
        reply: Reply<()>,
    },
}

/// A command with the caller's tracing span: the store thread enters it
/// while it executes the command, so what it logs joins the request that
/// asked for it.
struct Envelope {
    span: tracing::Span,
    cmd: Command,
}

impl Envelope {
    fn new(cmd: Command) -> Envelope {
        Envelope {
            span: tracing::Span::current(),
            cmd,
        }
    }
}

/// State shared between the handles and the store thread.
struct Shared {
    depth: usize,
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
        let (tx, rx) = mpsc::sync_channel(options.queue_depth);
        let clock = options.clock.clone();
        let shared = Arc::new(Shared {
            depth: options.queue_depth,
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
            .spawn(move || worker::run(options, rx, thread_shared, ready_tx, go_rx))
            .map_err(|e| OpenError::Thread(e.to_string()))?;
        let (unfinished, identity) = match ready.recv() {
            Ok(Ok(worker::Stage::Prepared(ids, identity))) => (ids, identity),
            Ok(Ok(worker::Stage::Recovered(_))) => {
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

    /// Creates a task, or returns the owner's existing task for the same
    /// creation reference.
    pub async fn create(&self, new: NewTask) -> Result<Created, StoreError> {
        if new.ttl_ms <= 0 || new.poll_interval_ms <= 0 {
            return Err(StoreError::Invalid(
                "ttl and poll interval must be positive".into(),
            ));
        }
        self.call(|reply| Command::Create { new, reply }).await
    }

    /// The owner's unexpired task, or `None` for unknown, expired and
    /// another owner's IDs alike.
    pub async fn get(&self, id: &TaskId, owner: &Digest) -> Result<Option<TaskRecord>, StoreError> {
        let (id, owner) = (id.clone(), *owner);
        self.shared.task_reads.fetch_add(1, Ordering::Relaxed);
        self.call(|reply| Command::Get { id, owner, reply }).await
    }

    /// The owner's unexpired task created under `reference`, read without
    /// creating anything: `None` when there is none, `Conflict` when it was
    /// created for another request. A retry is answered from this when the
    /// call could not be admitted as new (every slot busy, the owner at its
    /// limit), so that it still gets its task.
    pub async fn find_reference(
        &self,
        owner: &Digest,
        reference: &Digest,
        request: Option<&Digest>,
    ) -> Result<Option<TaskRecord>, StoreError> {
        let (owner, reference, request) = (*owner, *reference, request.copied());
        self.call(|reply| Command::FindReference {
            owner,
            reference,
            request,
            reply,
        })
        .await
    }

    /// How many task reads ([`Store::get`]) were asked of the store so far.
    pub fn task_reads(&self) -> u64 {
        self.shared.task_reads.load(Ordering::Relaxed)
    }

    /// Moves a nonterminal task to a terminal status, once: if it is already
    /// terminal the stored outcome stays and is returned.
    pub async fn finish(
        &self,
        id: &TaskId,
        status: TaskStatus,
        outcome: Option<Outcome>,
    ) -> Result<Option<TaskRecord>, StoreError> {
        if !status.is_terminal() {
            return Err(StoreError::Invalid(format!(
                "{} is not a terminal status",
                status.as_str()
            )));
        }
        let payload = outcome.as_ref().map(Outcome::encode);
        if let Some(p) = &payload
            && p.len() > MAX_PAYLOAD_BYTES
        {
            return Err(StoreError::PayloadTooLarge {
                size: p.len(),
                limit: MAX_PAYLOAD_BYTES,
            });
        }
        let id = id.clone();
        self.call(|reply| Command::Finish {
            id,
            status,
            payload,
            reply,
        })
        .await
    }

    /// Records the owner's intent to cancel a nonterminal task; returns the
    /// task as it now stands (`None` when unknown to this owner).
    pub async fn request_cancel(
        &self,
        id: &TaskId,
        owner: &Digest,
    ) -> Result<Option<TaskRecord>, StoreError> {
        let (id, owner) = (id.clone(), *owner);
        self.call(|reply| Command::RequestCancel { id, owner, reply })
            .await
    }

    /// For each ID, whether an unexpired task with it exists (any owner):
    /// how spilled artifacts learn that their task is gone.
    pub async fn unexpired(&self, ids: Vec<TaskId>) -> Result<Vec<bool>, StoreError> {
        self.call(|reply| Command::Unexpired { ids, reply }).await
    }

    pub async fn stats(&self) -> Result<StoreStats, StoreError> {
        self.call(|reply| Command::Stats { reply }).await
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
    ready: mpsc::Receiver<Result<worker::Stage, OpenError>>,
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
            Ok(Ok(worker::Stage::Recovered(report))) => {
                if let Ok(mut g) = self.store.shared.thread.lock() {
                    *g = handle;
                }
                Ok((self.store.clone(), report))
            }
            Ok(Ok(worker::Stage::Prepared(..))) => {
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
    fn task_ids_are_random_and_parse_strictly() {
        let a = TaskId::generate().unwrap();
        let b = TaskId::generate().unwrap();
        assert_ne!(a, b);
        assert_eq!(TaskId::parse(a.as_str()), Some(a.clone()));
        assert_eq!(TaskId::parse("tg-XYZ"), None);
        assert_eq!(TaskId::parse(&a.as_str().to_uppercase()), None);
    }

    #[test]
    fn digest_parts_are_unambiguous() {
        assert_ne!(
            Digest::of_parts(&[b"ab", b"c"]),
            Digest::of_parts(&[b"a", b"bc"])
        );
    }

    #[test]
    fn outcome_round_trips() {
        let o = Outcome::interrupted();
        let back: Outcome = serde_json::from_slice(&o.encode()).unwrap();
        assert_eq!(o, back);
    }
}
