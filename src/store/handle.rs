//! The handle taskgate holds: [`Store`], the engine's handle with
//! taskgate's errors, options, test hooks, metrics and log events. Each
//! kind adds its operations to it in its own module (`impl<K> Store<K>`
//! where the registry holds the kind), so this file knows no kind.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use taskgate_store_engine::{self as engine, Kinds, OpError, ReadCx, Tx};

use super::error::StoreError;
use crate::config::StoreSettings;
pub use taskgate_store_engine::{CheckpointReport, Clock, OUTCOME_LINGER, SnapshotReport};

/// The file a state directory records its store's identity in.
pub(crate) const IDENTITY_RECORDED_IN: &str = "tasks.lock";

/// The clock of a serving store: the system's, moved by the clock-skew
/// test hook when it is compiled in.
pub fn system_clock() -> Clock {
    Clock::skewed(crate::testhooks::clock_skew_ms())
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
    pub expected_identity: Option<engine::StoreId>,
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
            clock: system_clock(),
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
            clock: system_clock(),
            expected_identity: None,
            stall_file: crate::testhooks::stall_file(),
            busy_file: crate::testhooks::busy_file(),
            hold_sweep_file: crate::testhooks::hold_sweep_file(),
            outcome_linger: OUTCOME_LINGER,
        }
    }

    /// What the engine is given: the settings it runs by, the test hooks
    /// (empty in a release build without them), and taskgate's metrics and
    /// log events as its observer.
    pub(crate) fn engine(&self) -> engine::Options {
        engine::Options {
            db_path: self.db_path.clone(),
            queue_depth: self.settings.queue_depth,
            max_db_pages: self.settings.max_db_pages,
            checkpoint_interval: self.settings.checkpoint_interval,
            clock: self.clock.clone(),
            expected_identity: self.expected_identity.clone(),
            identity_recorded_in: IDENTITY_RECORDED_IN.to_string(),
            outcome_linger: self.outcome_linger,
            hooks: engine::Hooks {
                stall_file: self.stall_file.clone(),
                busy_file: self.busy_file.clone(),
                hold_sweep_file: self.hold_sweep_file.clone(),
            },
            observer: Arc::new(Observed),
        }
    }
}

/// taskgate's view of the store thread: commit and checkpoint timings for
/// `/metrics`, and the journal event of a store that latched disabled.
struct Observed;

impl engine::Observer for Observed {
    fn committed(&self, batch: usize, secs: f64) {
        crate::metrics::get().commit(batch, secs);
    }

    fn checkpointed(&self, secs: f64) {
        crate::metrics::get().checkpoint(secs);
    }

    fn disabled(&self, reason: &str) {
        tracing::error!(
            message_id = crate::events::STORE_DISABLED,
            reason = %reason,
            "task store disabled until restart: {reason}"
        );
    }
}

/// A registry of kinds taskgate can open a store with.
pub trait Registry: Kinds<Refusal = StoreError> {
    fn for_options(options: &StoreOptions) -> Self;
}

/// The async handle to the store, over the kinds `K` (taskgate's are
/// `kinds::Registered`; see `store::Store`). Cloning is cheap.
pub struct Store<K: Kinds> {
    pub(super) engine: engine::Handle<K>,
    /// Task reads asked of the store thread, for pacing evidence.
    pub(super) task_reads: Arc<AtomicU64>,
}

impl<K: Kinds> Clone for Store<K> {
    fn clone(&self) -> Self {
        Store {
            engine: self.engine.clone(),
            task_reads: self.task_reads.clone(),
        }
    }
}

impl<K: Registry> Store<K> {
    /// A read a kind of record asks for: answered at once on the store
    /// thread.
    pub(super) async fn read_op<T: Send + 'static>(
        &self,
        during: &'static str,
        body: impl FnOnce(&ReadCx<'_, K>) -> Result<T, OpError<StoreError>> + Send + 'static,
    ) -> Result<T, StoreError> {
        Ok(self.engine.read_op(during, body).await?)
    }

    /// A write a kind of record asks for, applied inside the batch's
    /// transaction and answered once that transaction's fate is known;
    /// `makes_room` for one that adds a row.
    pub(super) async fn write_op<T: Send + 'static>(
        &self,
        during: &'static str,
        makes_room: bool,
        body: impl FnMut(&mut Tx<'_, K>) -> Result<T, OpError<StoreError>> + Send + 'static,
    ) -> Result<T, StoreError> {
        Ok(self.engine.write_op(during, makes_room, body).await?)
    }

    /// A write nobody waits on to answer a client (a run's outcome): its
    /// batch may wait up to [`OUTCOME_LINGER`] for a write somebody does
    /// wait on, to share its commit.
    pub(super) async fn lingering_write_op<T: Send + 'static>(
        &self,
        during: &'static str,
        body: impl FnMut(&mut Tx<'_, K>) -> Result<T, OpError<StoreError>> + Send + 'static,
    ) -> Result<T, StoreError> {
        Ok(self.engine.lingering_write_op(during, body).await?)
    }

    /// Answers when the store thread takes commands (the watchdog's probe).
    pub async fn ping(&self) -> Result<(), StoreError> {
        Ok(self.engine.ping().await?)
    }

    /// Runs one expiry sweep now (the timer does this every second);
    /// returns the number of rows deleted, at most [`engine::SWEEP_BATCH`]
    /// of each kind.
    pub async fn sweep_now(&self) -> Result<u64, StoreError> {
        Ok(self.engine.sweep_now().await?)
    }

    /// Runs `wal_checkpoint(TRUNCATE)` now.
    pub async fn checkpoint_now(&self) -> Result<CheckpointReport, StoreError> {
        Ok(self.engine.checkpoint_now().await?)
    }

    /// Writes a consistent copy of the database to `dest`, a new empty file
    /// the caller created, while the store goes on serving (see
    /// [`engine::Handle::snapshot`]). The copy is not synced: the caller
    /// syncs it with the rest of the snapshot.
    pub async fn snapshot(&self, dest: &Path) -> Result<SnapshotReport, StoreError> {
        Ok(self.engine.snapshot(dest).await?)
    }

    /// Commands waiting in the store's queue now.
    pub fn queued(&self) -> usize {
        self.engine.queued()
    }

    /// The database's write-ahead log file.
    pub fn wal_path(&self) -> &Path {
        self.engine.wal_path()
    }

    /// The bound on the store's queue (`store.queue_depth`).
    pub fn queue_capacity(&self) -> usize {
        self.engine.queue_capacity()
    }

    /// When the last TRUNCATE checkpoint completed (wall-clock ms), if one
    /// has since this process opened the store.
    pub fn last_checkpoint_ms(&self) -> Option<i64> {
        self.engine.last_checkpoint_ms()
    }

    /// The clock the store reads "now" from, for callers that must agree
    /// with it.
    pub fn clock(&self) -> &Clock {
        self.engine.clock()
    }

    /// Why the service latched disabled, if it did.
    pub fn disabled_reason(&self) -> Option<String> {
        self.engine.disabled_reason()
    }

    /// A counter the store thread advances as it works.
    pub fn progress(&self) -> u64 {
        self.engine.progress()
    }

    /// Final TRUNCATE checkpoint, close, and join the store thread. Commands
    /// queued before this are answered first.
    pub async fn shutdown(&self) -> Result<(), StoreError> {
        Ok(self.engine.shutdown().await?)
    }
}
