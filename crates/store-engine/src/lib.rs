//! The store engine: one thread that owns the only SQLite connection, and
//! knows no schema.
//!
//! What it owns: the bounded queue a [`Handle`] sends commands on (a full
//! queue is refused at once), batches of commands with their writes in one
//! transaction (group commit, a savepoint per write), the severity of an
//! SQLite error and the latch that disables the store on an uncertain I/O
//! error or corruption, the expiry-sweep and checkpoint timers, online
//! snapshots in steps (`sqlite3_backup_*`), opening (pragmas, versions,
//! integrity, identity) and migrations as an ordered list of steps.
//!
//! What it must not know: any record. Every table, statement, record type,
//! expiry rule and recovery rule belongs to a kind of record
//! ([`RecordKind`]), which the application registers in its own registry
//! ([`Kinds`], usually declared with [`kinds!`]); every type here is generic
//! over that registry, so this crate cannot name what it stores. A kind's
//! refusals travel through [`EngineError::Refused`].

mod clock;
mod handle;
mod kind;
mod migrate;
mod open;
mod thread;
#[cfg(test)]
mod toy;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;

pub use clock::{Clock, ManualClock};
pub use handle::{Handle, Opening};
pub use kind::{AnyKind, Holds, Kinds, NextExpiry, RecordKind, Report, Undecodable};
pub use migrate::{Step, schema_version};
pub use open::{
    CheckReport, JOURNAL_SIZE_LIMIT_BYTES, OpenReport, PAGE_SIZE, WAL_AUTOCHECKPOINT_PAGES,
    apply_production_pragmas, check_identified, check_read_only,
};
pub use thread::{OpError, ReadCx, Tx};

// The kinds and the [`kinds!`] registry speak rusqlite; this is the one
// they and the engine share.
pub use rusqlite;

/// Expired records deleted per kind per sweep, and per batch that adds
/// records.
pub const SWEEP_BATCH: u32 = 128;
/// How often the store thread sweeps expired records.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(1);
/// Most commands the store thread takes into one group commit.
pub const MAX_BATCH: usize = 256;
/// How long a batch holding only writes nobody waits on waits for a write
/// that somebody does wait on, so that both share one commit. Never delays
/// such a write; delays the lingering ones at most this much.
pub const OUTCOME_LINGER: Duration = Duration::from_millis(1);
/// Pages an online snapshot copies per step (1 MiB at the 4 KiB page
/// size). Between two steps the store thread serves every command that is
/// waiting, so a snapshot delays a write by at most one step's copy.
pub const SNAPSHOT_STEP_PAGES: i32 = 256;

/// A store's identity: 128 random bits, hex, chosen when its database is
/// initialised and kept in it for life. The application records it beside
/// the database, so an empty or replaced database is recognised and
/// refused rather than served as a new, empty store.
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

/// Lower-case hex of `bytes`: the one encoder identities and digests use.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Why SQLite said the database is full.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FullKind {
    /// SQLite reached `max_page_count` (cleanup still works).
    #[error("database page cap of {pages} pages reached (store.max_db_pages)")]
    PageCap { pages: u64 },
    /// The filesystem is full (cleanup may need space too).
    #[error("the filesystem under the state directory is full")]
    DiskFull,
}

/// The engine's own refusals, and a kind's (`Refused`). The application
/// turns them into its errors; the texts are the application's own for
/// the same refusals, so the engine's log lines read as they always did.
#[derive(Debug, Clone, Error, PartialEq)]
pub enum EngineError<R> {
    #[error("task store busy: its queue of {depth} commands is full; retry shortly")]
    Busy { depth: usize },
    #[error("task store at capacity: {0}")]
    Full(FullKind),
    #[error("task store disabled until restart: {reason}")]
    Disabled { reason: String },
    #[error("task store write outcome unknown ({detail}); the store is now disabled until restart")]
    Uncertain { detail: String },
    #[error("task store stopped")]
    Stopped,
    #[error("task store error: {0}")]
    Internal(String),
    /// A refusal a kind of record decided (a bound, a conflict).
    #[error("{0}")]
    Refused(R),
}

/// Errors that refuse opening the store.
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
        /// The kind of record ([`RecordKind::name`]).
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
        "{path}: database replaced: {found}, but this state directory held store {expected} (recorded in {recorded_in}); restore the store's snapshot or move the directory aside"
    )]
    Replaced {
        path: PathBuf,
        expected: StoreId,
        found: String,
        /// The file the application recorded the identity in.
        recorded_in: String,
    },
    #[error("the store thread could not start: {0}")]
    Thread(String),
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

/// What the application learns from the store thread as it works: timings
/// for its metrics, and the moment the store latched disabled (logged by
/// the application, with its own message ID). Every method runs on the
/// store thread and must not block.
pub trait Observer: Send + Sync + 'static {
    /// A group commit of `batch` commands took `secs`.
    fn committed(&self, _batch: usize, _secs: f64) {}
    /// A TRUNCATE checkpoint took `secs`.
    fn checkpointed(&self, _secs: f64) {}
    /// The store latched disabled, once, for `reason`.
    fn disabled(&self, _reason: &str) {}
}

/// An observer that observes nothing.
pub struct Unobserved;

impl Observer for Unobserved {}

/// Files whose existence changes what the store thread does, for tests of
/// the application. The application fills them from its own test hooks
/// (and leaves them empty in a release build without them): the engine
/// itself reads no environment.
#[derive(Debug, Clone, Default)]
pub struct Hooks {
    /// While this file exists the store thread takes no command.
    pub stall_file: Option<PathBuf>,
    /// While this file exists every command is refused as busy.
    pub busy_file: Option<PathBuf>,
    /// While this file exists no expired record is deleted.
    pub hold_sweep_file: Option<PathBuf>,
}

/// How to open and run a store.
#[derive(Clone)]
pub struct Options {
    pub db_path: PathBuf,
    /// Commands waiting for the store thread; more are refused as busy.
    pub queue_depth: usize,
    /// `max_page_count`: SQLite's own cap on the database's size.
    pub max_db_pages: u64,
    /// How often a TRUNCATE checkpoint runs.
    pub checkpoint_interval: Duration,
    /// Where every "now" of the store comes from.
    pub clock: Clock,
    /// The identity the application recorded for its store, if any: a
    /// database that is not that store (missing, empty, another store's or
    /// one without an identity) is refused before anything is written.
    pub expected_identity: Option<StoreId>,
    /// The file that identity was recorded in, for the refusal's text.
    pub identity_recorded_in: String,
    /// How long a batch of lingering writes waits for company
    /// ([`OUTCOME_LINGER`]).
    pub outcome_linger: Duration,
    pub hooks: Hooks,
    pub observer: Arc<dyn Observer>,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("db_path", &self.db_path)
            .field("queue_depth", &self.queue_depth)
            .field("max_db_pages", &self.max_db_pages)
            .field("checkpoint_interval", &self.checkpoint_interval)
            .field("expected_identity", &self.expected_identity)
            .field("hooks", &self.hooks)
            .finish_non_exhaustive()
    }
}
