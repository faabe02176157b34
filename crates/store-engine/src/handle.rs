//! The handle to a store: cheap to clone, it sends commands to the store
//! thread over the bounded queue and waits for their answers. A full queue
//! is refused at once; a dropped answer is never a success.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use tokio::sync::oneshot;

use crate::kind::Kinds;
use crate::open::OpenReport;
use crate::thread::{self, Command, Envelope, OpError, ReadCx, Stage, Tx};
use crate::{
    CheckpointReport, Clock, EngineError, Observer, OpenError, Options, SnapshotReport, StoreId,
};

pub(crate) type Reply<T, R> = oneshot::Sender<Result<T, EngineError<R>>>;

type Error<K> = EngineError<<K as Kinds>::Refusal>;

/// State shared between the handles and the store thread.
pub(crate) struct Shared {
    pub(crate) depth: usize,
    /// The database's write-ahead log.
    wal_path: PathBuf,
    /// Test hook: while this file exists every command is refused as busy.
    busy_file: Option<PathBuf>,
    /// Set once, never cleared: the reason the store latched disabled.
    disabled: Mutex<Option<String>>,
    /// Incremented every time the store thread finishes a loop: a
    /// watchdog's evidence of progress when the queue is too full to ping.
    pub(crate) progress: AtomicU64,
    /// Commands sent and not yet taken by the store thread. Counted before
    /// the send (and given back when it fails), so it never goes below
    /// zero for long; readers clamp it.
    pub(crate) queued: AtomicI64,
    /// Wall-clock ms of the last TRUNCATE checkpoint that completed; 0
    /// before the first.
    pub(crate) last_checkpoint_ms: AtomicI64,
    thread: Mutex<Option<JoinHandle<()>>>,
    observer: Arc<dyn Observer>,
}

impl Shared {
    pub(crate) fn disabled_reason(&self) -> Option<String> {
        self.disabled.lock().ok().and_then(|g| g.clone())
    }

    pub(crate) fn latch(&self, reason: String) {
        if let Ok(mut g) = self.disabled.lock()
            && g.is_none()
        {
            self.observer.disabled(&reason);
            *g = Some(reason);
        }
    }
}

/// The async handle to a store whose kinds are `K`. Cloning is cheap.
pub struct Handle<K: Kinds> {
    tx: SyncSender<Envelope<K>>,
    shared: Arc<Shared>,
    clock: Clock,
}

impl<K: Kinds> Clone for Handle<K> {
    fn clone(&self) -> Self {
        Handle {
            tx: self.tx.clone(),
            shared: self.shared.clone(),
            clock: self.clock.clone(),
        }
    }
}

impl<K: Kinds> Handle<K> {
    /// Opens the store up to restart recovery: the store thread validates
    /// (a refused database is left exactly as it was), initialises or
    /// migrates, and reports what recovery is about to end, so that what
    /// the application derived from it can go first.
    pub fn begin_open(options: Options, kinds: K) -> Result<Opening<K>, OpenError> {
        let (tx, rx) = mpsc::sync_channel(options.queue_depth);
        let clock = options.clock.clone();
        let mut wal_path = options.db_path.clone().into_os_string();
        wal_path.push("-wal");
        let shared = Arc::new(Shared {
            depth: options.queue_depth,
            wal_path: PathBuf::from(wal_path),
            busy_file: options.hooks.busy_file.clone(),
            disabled: Mutex::new(None),
            progress: AtomicU64::new(0),
            queued: AtomicI64::new(0),
            last_checkpoint_ms: AtomicI64::new(0),
            thread: Mutex::new(None),
            observer: options.observer.clone(),
        });
        let (ready_tx, ready) = mpsc::channel();
        let (go, go_rx) = mpsc::channel();
        let thread_shared = shared.clone();
        let handle = std::thread::Builder::new()
            .name("taskgate-store".into())
            .spawn(move || thread::run(options, kinds, rx, thread_shared, ready_tx, go_rx))
            .map_err(|e| OpenError::Thread(e.to_string()))?;
        let (recovery, identity) = match ready.recv() {
            Ok(Ok(Stage::Prepared(recovery, identity))) => (recovery, identity),
            Ok(Ok(Stage::Recovered(_))) => {
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
            store: Handle { tx, shared, clock },
            ready,
            go,
            handle: Some(handle),
            recovery,
            identity,
        })
    }

    /// Sends a command and waits for its answer.
    async fn call<T>(
        &self,
        make: impl FnOnce(Reply<T, K::Refusal>) -> Command<K>,
    ) -> Result<T, Error<K>> {
        if let Some(reason) = self.shared.disabled_reason() {
            return Err(EngineError::Disabled { reason });
        }
        let (reply, answer) = oneshot::channel();
        self.try_send(Envelope::new(make(reply)))?;
        // A dropped reply means the thread ended without answering: never a
        // success.
        answer.await.map_err(|_| EngineError::Stopped)?
    }

    /// A read a kind of record asks for: answered at once on the store
    /// thread; its SQL error is mapped by severity (a fatal one latches the
    /// store disabled).
    pub async fn read_op<T: Send + 'static>(
        &self,
        during: &'static str,
        body: impl FnOnce(&ReadCx<'_, K>) -> Result<T, OpError<K::Refusal>> + Send + 'static,
    ) -> Result<T, Error<K>> {
        self.call(move |reply| {
            Command::Read(Box::new(thread::Read {
                during,
                body,
                reply,
            }))
        })
        .await
    }

    /// A write a kind of record asks for, applied inside the batch's
    /// transaction under its own savepoint and answered once that
    /// transaction's fate is known; `makes_room` for one that adds a record
    /// (its batch first sweeps a bounded number of expired ones).
    pub async fn write_op<T: Send + 'static>(
        &self,
        during: &'static str,
        makes_room: bool,
        body: impl FnMut(&mut Tx<'_, K>) -> Result<T, OpError<K::Refusal>> + Send + 'static,
    ) -> Result<T, Error<K>> {
        self.write_with(during, makes_room, false, body).await
    }

    /// A write nobody waits on to answer a client: its batch may wait up to
    /// [`crate::OUTCOME_LINGER`] for a write somebody does wait on, to share
    /// its commit.
    pub async fn lingering_write_op<T: Send + 'static>(
        &self,
        during: &'static str,
        body: impl FnMut(&mut Tx<'_, K>) -> Result<T, OpError<K::Refusal>> + Send + 'static,
    ) -> Result<T, Error<K>> {
        self.write_with(during, false, true, body).await
    }

    async fn write_with<T: Send + 'static>(
        &self,
        during: &'static str,
        makes_room: bool,
        lingers: bool,
        body: impl FnMut(&mut Tx<'_, K>) -> Result<T, OpError<K::Refusal>> + Send + 'static,
    ) -> Result<T, Error<K>> {
        self.call(move |reply| {
            Command::Write(Box::new(thread::Write {
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

    /// Answers when the store thread takes commands (a watchdog's probe).
    pub async fn ping(&self) -> Result<(), Error<K>> {
        let (reply, answer) = oneshot::channel();
        self.try_send(Envelope::new(Command::Ping { reply }))?;
        answer.await.map_err(|_| EngineError::Stopped)?
    }

    /// Queues a command without waiting: a full queue is `Busy` at once.
    fn try_send(&self, envelope: Envelope<K>) -> Result<(), Error<K>> {
        if self.shared.busy_file.as_ref().is_some_and(|f| f.exists()) {
            return Err(EngineError::Busy {
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
            Err(TrySendError::Full(_)) => Err(EngineError::Busy {
                depth: self.shared.depth,
            }),
            Err(TrySendError::Disconnected(_)) => Err(EngineError::Stopped),
        }
    }

    /// Runs one expiry sweep now (the timer does this every second);
    /// returns the number of records deleted, at most
    /// [`crate::SWEEP_BATCH`] per kind.
    pub async fn sweep_now(&self) -> Result<u64, Error<K>> {
        self.call(|reply| Command::Sweep { reply }).await
    }

    /// Runs `wal_checkpoint(TRUNCATE)` now.
    pub async fn checkpoint_now(&self) -> Result<CheckpointReport, Error<K>> {
        self.call(|reply| Command::Checkpoint { reply }).await
    }

    /// Writes a consistent copy of the database to `dest`, a new empty file
    /// the caller created, while the store goes on serving: the copy is
    /// made on the store thread in steps of [`crate::SNAPSHOT_STEP_PAGES`]
    /// pages, with the commands waiting served between steps. Writes made
    /// during the copy reach it too (SQLite's backup API updates the pages
    /// already copied when the same connection changes them), so the copy
    /// is the database as of the moment the last step finished. The copy is
    /// not synced: the caller syncs it with the rest of its snapshot.
    pub async fn snapshot(&self, dest: &Path) -> Result<SnapshotReport, Error<K>> {
        let dest = dest.to_path_buf();
        self.call(|reply| Command::Snapshot { dest, reply }).await
    }

    /// Commands waiting in the store's queue now.
    pub fn queued(&self) -> usize {
        self.shared.queued.load(Ordering::Relaxed).max(0) as usize
    }

    /// The database's write-ahead log file.
    pub fn wal_path(&self) -> &Path {
        &self.shared.wal_path
    }

    /// The bound on the store's queue.
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

    /// Why the store latched disabled, if it did.
    pub fn disabled_reason(&self) -> Option<String> {
        self.shared.disabled_reason()
    }

    /// A counter the store thread advances as it works.
    pub fn progress(&self) -> u64 {
        self.shared.progress.load(Ordering::Relaxed)
    }

    /// Final TRUNCATE checkpoint, close, and join the store thread. Commands
    /// queued before this are answered first.
    pub async fn shutdown(&self) -> Result<(), Error<K>> {
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
        .map_err(|e| EngineError::Internal(e.to_string()))?;
        let result = match sent {
            true => answer.await.unwrap_or(Err(EngineError::Stopped)),
            false => Err(EngineError::Stopped),
        };
        let handle = self.shared.thread.lock().ok().and_then(|mut g| g.take());
        if let Some(h) = handle {
            let _ = tokio::task::spawn_blocking(move || h.join()).await;
        }
        result
    }
}

/// A store between validation and restart recovery; see
/// [`Handle::begin_open`]. Dropping it closes the database unrecovered.
pub struct Opening<K: Kinds> {
    store: Handle<K>,
    ready: mpsc::Receiver<Result<Stage<K>, OpenError>>,
    go: mpsc::Sender<()>,
    handle: Option<JoinHandle<()>>,
    recovery: K::Recovery,
    identity: StoreId,
}

impl<K: Kinds> Opening<K> {
    /// What restart recovery is about to end, every kind's.
    pub fn recovery(&self) -> &K::Recovery {
        &self.recovery
    }

    /// The identity of the opened store (chosen now if the database had
    /// none): the application records it beside the database.
    pub fn identity(&self) -> &StoreId {
        &self.identity
    }

    /// Runs restart recovery and returns the serving store.
    #[allow(clippy::type_complexity)]
    pub fn recover(mut self) -> Result<(Handle<K>, OpenReport<K::Recovery, K::Status>), OpenError> {
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
            Ok(Ok(Stage::Recovered(report))) => {
                if let Ok(mut g) = self.store.shared.thread.lock() {
                    *g = handle;
                }
                Ok((self.store.clone(), report))
            }
            Ok(Ok(Stage::Prepared(..))) => {
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

impl<K: Kinds> Drop for Opening<K> {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            // Without the go-ahead the thread closes the database and ends.
            let (dead, _) = mpsc::channel();
            drop(std::mem::replace(&mut self.go, dead));
            let _ = h.join();
        }
    }
}
