//! The store thread: the only owner of the SQLite connection. It knows no
//! schema: what it runs are operations a record kind built ([`ReadOp`],
//! [`WriteOp`]) and the kinds' own sweep and counters ([`crate::Kinds`]).
//!
//! It takes commands from the bounded queue in batches. Reads are answered
//! at once. Writes of one batch share one transaction (group commit), each
//! under its own savepoint so one failure does not fail the others, and
//! every writer is answered only after COMMIT returned. An uncertain I/O
//! error or corruption latches the service disabled: nothing is retried and
//! nothing afterwards is acknowledged; the writer whose COMMIT failed hears
//! `Uncertain`. While it executes a command the thread is inside that
//! command's span, so what it logs belongs to the request that asked for it.

use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use rusqlite::backup::{Backup, StepResult};
use rusqlite::config::DbConfig;
use rusqlite::{Connection, ErrorCode, OpenFlags};

use crate::handle::{Reply, Shared};
use crate::kind::Kinds;
use crate::open::{self, OpenReport};
use crate::{
    CheckpointReport, EngineError, FullKind, MAX_BATCH, OpenError, Options, SNAPSHOT_STEP_PAGES,
    SWEEP_BATCH, SWEEP_INTERVAL, SnapshotReport, StoreId,
};

/// Pages of headroom below `max_page_count` within which SQLITE_FULL is
/// blamed on the page cap rather than the filesystem: more than the largest
/// batch can need (256 terminal payloads of 16 KiB plus index pages).
const PAGE_CAP_MARGIN: u64 = 2048;

/// Why an operation failed on the store thread.
pub enum OpError<R> {
    /// A refusal a kind decided (a bound, a conflict). Inside a batch the
    /// write's savepoint is rolled back and the batch goes on.
    Refused(R),
    Sql(rusqlite::Error),
}

impl<R> From<rusqlite::Error> for OpError<R> {
    fn from(e: rusqlite::Error) -> Self {
        OpError::Sql(e)
    }
}

/// What a read gets: the connection outside any transaction, the store's
/// "now", and the kinds' counters.
pub struct ReadCx<'a, K> {
    pub conn: &'a Connection,
    pub now: i64,
    pub kinds: &'a K,
}

/// What a write gets: the connection inside the batch's transaction (its
/// own savepoint open), the batch's "now", and the kinds' counters, whose
/// changes count once the transaction commits.
pub struct Tx<'a, K> {
    pub conn: &'a Connection,
    pub now: i64,
    pub kinds: &'a mut K,
}

type Error<K> = EngineError<<K as Kinds>::Refusal>;

/// A read a record kind asks of the store thread; it answers its caller.
pub(crate) trait ReadOp<K: Kinds>: Send {
    fn run(self: Box<Self>, cx: &ReadCx<'_, K>, engine: &Engine<K>);
    /// The store is disabled: the reader hears so, nothing is read.
    fn refuse(self: Box<Self>, e: Error<K>);
}

/// A write a record kind asks of the store thread: applied inside the
/// batch's transaction, answered only once that transaction's fate is
/// known.
pub(crate) trait WriteOp<K: Kinds>: Send {
    /// Whether the batch should first sweep a bounded number of expired
    /// records (a write that adds records makes room for them).
    fn makes_room(&self) -> bool;
    /// Whether nobody waits on this write to answer a client (a run's
    /// outcome), so that its batch may wait for one that somebody does.
    fn lingers(&self) -> bool;
    /// What the write does, for messages and the disabled reason.
    fn during(&self) -> &'static str;
    fn apply(&mut self, tx: &mut Tx<'_, K>) -> Result<(), OpError<K::Refusal>>;
    /// COMMIT returned: the writer hears what `apply` produced.
    fn committed(self: Box<Self>);
    fn failed(self: Box<Self>, e: Error<K>);
}

/// A read from a closure: its SQL error is mapped by the engine (a fatal one
/// latches the service disabled).
pub(crate) struct Read<T, F, R> {
    pub(crate) during: &'static str,
    pub(crate) body: F,
    pub(crate) reply: Reply<T, R>,
}

impl<K, T, F> ReadOp<K> for Read<T, F, K::Refusal>
where
    K: Kinds,
    T: Send,
    F: FnOnce(&ReadCx<'_, K>) -> Result<T, OpError<K::Refusal>> + Send,
{
    fn run(self: Box<Self>, cx: &ReadCx<'_, K>, engine: &Engine<K>) {
        let Read {
            during,
            body,
            reply,
        } = *self;
        let result = body(cx).map_err(|e| match e {
            OpError::Refused(e) => EngineError::Refused(e),
            OpError::Sql(e) => engine.fail(e, during),
        });
        let _ = reply.send(result);
    }

    fn refuse(self: Box<Self>, e: Error<K>) {
        let _ = self.reply.send(Err(e));
    }
}

/// A write from a closure, holding its answer until COMMIT.
pub(crate) struct Write<T, F, R> {
    pub(crate) during: &'static str,
    pub(crate) makes_room: bool,
    pub(crate) lingers: bool,
    pub(crate) body: F,
    pub(crate) reply: Reply<T, R>,
    pub(crate) done: Option<T>,
}

impl<K, T, F> WriteOp<K> for Write<T, F, K::Refusal>
where
    K: Kinds,
    T: Send,
    F: FnMut(&mut Tx<'_, K>) -> Result<T, OpError<K::Refusal>> + Send,
{
    fn makes_room(&self) -> bool {
        self.makes_room
    }

    fn lingers(&self) -> bool {
        self.lingers
    }

    fn during(&self) -> &'static str {
        self.during
    }

    fn apply(&mut self, tx: &mut Tx<'_, K>) -> Result<(), OpError<K::Refusal>> {
        self.done = Some((self.body)(tx)?);
        Ok(())
    }

    fn committed(self: Box<Self>) {
        let answer = self
            .done
            .ok_or_else(|| EngineError::Internal("write produced no answer".into()));
        let _ = self.reply.send(answer);
    }

    fn failed(self: Box<Self>, e: Error<K>) {
        let _ = self.reply.send(Err(e));
    }
}

/// What the store thread is asked to do.
pub(crate) enum Command<K: Kinds> {
    Read(Box<dyn ReadOp<K>>),
    Write(Box<dyn WriteOp<K>>),
    Ping {
        reply: Reply<(), K::Refusal>,
    },
    Sweep {
        reply: Reply<u64, K::Refusal>,
    },
    Checkpoint {
        reply: Reply<CheckpointReport, K::Refusal>,
    },
    /// Copy the database to a new file at `dest` (which must exist, empty).
    Snapshot {
        dest: PathBuf,
        reply: Reply<SnapshotReport, K::Refusal>,
    },
    Shutdown {
        reply: Reply<(), K::Refusal>,
    },
}

impl<K: Kinds> Command<K> {
    /// A write nobody waits on to answer a client: its batch may wait for
    /// company ([`Engine::linger`]).
    fn lingers(&self) -> bool {
        matches!(self, Command::Write(w) if w.lingers())
    }
}

/// A command with the caller's tracing span: the store thread enters it
/// while it executes the command, so what it logs joins the request that
/// asked for it.
pub(crate) struct Envelope<K: Kinds> {
    pub(crate) span: tracing::Span,
    pub(crate) cmd: Command<K>,
}

impl<K: Kinds> Envelope<K> {
    pub(crate) fn new(cmd: Command<K>) -> Envelope<K> {
        Envelope {
            span: tracing::Span::current(),
            cmd,
        }
    }
}

/// What the store thread tells the opener, in order.
pub(crate) enum Stage<K: Kinds> {
    /// Validated and migrated; this is what recovery is about to end. The
    /// thread waits for the opener's go-ahead.
    Prepared(K::Recovery, StoreId),
    Recovered(OpenReport<K::Recovery, K::Status>),
}

pub(crate) fn run<K: Kinds>(
    options: Options,
    mut kinds: K,
    rx: Receiver<Envelope<K>>,
    shared: Arc<Shared>,
    ready: mpsc::Sender<Result<Stage<K>, OpenError>>,
    go: Receiver<()>,
) {
    let prepared = match open::prepare(&options, &kinds) {
        Ok(p) => p,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let _ = ready.send(Ok(Stage::Prepared(
        prepared.recovery.clone(),
        prepared.identity.clone(),
    )));
    if go.recv().is_err() {
        // The opener gave up: close without recovering (checkpoint-on-close
        // is still off, so the file is left as migration left it).
        return;
    }
    let report = match open::recover(&prepared, &options, &mut kinds) {
        Ok(r) => r,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let _ = ready.send(Ok(Stage::Recovered(report)));
    let now = options.clock.monotonic();
    let mut engine = Engine {
        conn: Some(Rc::new(prepared.conn)),
        kinds,
        next_sweep: now + SWEEP_INTERVAL,
        next_checkpoint: now + options.checkpoint_interval,
        options,
        shared,
    };
    engine.serve(rx);
}

/// When a turn of the store thread's loop began (see [`Engine::woke`]).
#[derive(Clone, Copy)]
struct Woke {
    /// For scheduling the timers.
    monotonic: Duration,
    /// Unix ms, for what the timers' sweep finds expired.
    now_ms: i64,
}

/// The engine's connection, borrowed apart from its other fields. Only
/// `close` takes it, and that ends the loop: no command runs after.
fn open_connection(conn: &Option<Rc<Connection>>) -> &Connection {
    conn.as_deref().expect("connection used after close")
}

/// Every store handle is gone: the thread closes the database and ends.
struct Disconnected;

/// Opens a snapshot's destination: the new, empty file the caller made.
/// Nothing in it counts until the snapshot is complete and checked, so it
/// is written without a journal and without syncs (the caller syncs the
/// finished file): the store thread never waits on the backup disk's
/// fsync.
fn open_snapshot_destination(dest: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        dest,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.pragma_update(None, "journal_mode", "OFF")?;
    conn.pragma_update(None, "synchronous", "OFF")?;
    Ok(conn)
}

/// How a failed SQLite call is treated.
enum Severity {
    /// SQLITE_FULL: a capacity error; reads and cleanup go on.
    Full,
    /// I/O error or corruption: the service latches disabled.
    Fatal,
    /// Anything else: that command fails.
    Other,
}

fn severity(e: &rusqlite::Error) -> Severity {
    match e.sqlite_error_code() {
        Some(ErrorCode::DiskFull) => Severity::Full,
        Some(ErrorCode::SystemIoFailure | ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => {
            Severity::Fatal
        }
        _ => Severity::Other,
    }
}

/// An online snapshot asked for by a command.
struct SnapshotJob<R> {
    span: tracing::Span,
    dest: PathBuf,
    reply: Reply<SnapshotReport, R>,
}

/// What one batch left for the loop to do after it.
struct AfterBatch<R> {
    shutdown: Option<Reply<(), R>>,
    snapshot: Option<SnapshotJob<R>>,
}

impl<R> Default for AfterBatch<R> {
    fn default() -> Self {
        AfterBatch {
            shutdown: None,
            snapshot: None,
        }
    }
}

/// The store thread's state. It is made on the store thread and is not
/// `Send` (the connection is behind an `Rc`), so the compiler keeps the
/// connection on that thread: invariant 1 ([`ENGINE_STAYS_ON_ITS_THREAD`]).
pub(crate) struct Engine<K: Kinds> {
    /// `None` only after close. Shared (on this thread only) so that a
    /// snapshot's backup can borrow it while the engine goes on serving
    /// commands between the snapshot's steps.
    conn: Option<Rc<Connection>>,
    /// The record kinds' state on this thread (counters that spare a
    /// query), changed only as transactions commit.
    kinds: K,
    /// Timer deadlines on the clock's monotonic scale.
    next_sweep: Duration,
    next_checkpoint: Duration,
    options: Options,
    shared: Arc<Shared>,
}

/// Fails to compile if `Engine` becomes `Send` (say, the `Rc` around the
/// connection were dropped, or it were held in a `Mutex`): the two blanket
/// impls make `some_item` ambiguous for a `Send` type only.
#[allow(dead_code)]
const ENGINE_STAYS_ON_ITS_THREAD: fn() = || {
    trait AmbiguousIfSend<A> {
        fn some_item() {}
    }
    impl<T: ?Sized> AmbiguousIfSend<()> for T {}
    impl<T: ?Sized + Send> AmbiguousIfSend<u8> for T {}
    let _ = <Engine<NoKinds> as AmbiguousIfSend<_>>::some_item;
};

/// A registry of no kind, to name an engine in the check above.
#[allow(dead_code)]
struct NoKinds;

impl Kinds for NoKinds {
    type Refusal = String;
    type Recovery = ();
    type Status = ();
    const STEPS: &'static [crate::Step] = &[];
    fn all(&self) -> Vec<&dyn crate::AnyKind> {
        Vec::new()
    }
    fn all_mut(&mut self) -> Vec<&mut dyn crate::AnyKind> {
        Vec::new()
    }
    fn pending_recovery(&self, _: &Connection, _: i64) -> rusqlite::Result<()> {
        Ok(())
    }
    fn status(&self, _: &Connection, _: i64, _: i64) -> rusqlite::Result<()> {
        Ok(())
    }
}

impl<K: Kinds> Engine<K> {
    /// Runs one statement from the statement cache: the transaction and
    /// savepoint statements run several times per batch.
    fn exec(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
        conn.prepare_cached(sql)?.execute([]).map(|_| ())
    }

    fn now_ms(&self) -> i64 {
        self.options.clock.now_ms()
    }

    fn conn(&self) -> &Connection {
        open_connection(&self.conn)
    }

    fn serve(&mut self, rx: Receiver<Envelope<K>>) {
        loop {
            self.wait_while_stalled();
            let deadline = self.next_sweep.min(self.next_checkpoint);
            let wait = deadline.saturating_sub(self.options.clock.monotonic());
            let mut batch = Vec::new();
            let received = rx.recv_timeout(wait);
            let woke = self.woke();
            match received {
                Ok(cmd) => {
                    self.start(&rx, &mut batch, cmd);
                    self.linger(&rx, &mut batch);
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    self.close(None);
                    return;
                }
            }
            let mut after = self.process(batch);
            self.run_timers(woke);
            self.shared.progress.fetch_add(1, Ordering::Relaxed);
            if after.shutdown.is_none()
                && let Some(job) = after.snapshot.take()
            {
                match self.snapshot(&rx, job) {
                    Ok(shutdown) => after.shutdown = shutdown,
                    Err(Disconnected) => {
                        self.close(None);
                        return;
                    }
                }
            }
            if let Some(job) = after.snapshot {
                let _ = job.reply.send(Err(EngineError::Stopped));
            }
            if let Some(reply) = after.shutdown {
                self.close(Some(reply));
                return;
            }
        }
    }

    /// `cmd`, just received, starts `batch`, which takes what else is
    /// waiting in the queue, up to [`MAX_BATCH`], without blocking.
    fn start(&self, rx: &Receiver<Envelope<K>>, batch: &mut Vec<Envelope<K>>, cmd: Envelope<K>) {
        self.took(batch, cmd);
        self.fill(rx, batch);
    }

    /// A command left the queue for `batch`.
    fn took(&self, batch: &mut Vec<Envelope<K>>, cmd: Envelope<K>) {
        batch.push(cmd);
        self.shared.queued.fetch_sub(1, Ordering::Relaxed);
    }

    /// Adds what is waiting in the queue to `batch`, up to [`MAX_BATCH`],
    /// without blocking.
    fn fill(&self, rx: &Receiver<Envelope<K>>, batch: &mut Vec<Envelope<K>>) {
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(cmd) => self.took(batch, cmd),
                Err(_) => break,
            }
        }
    }

    /// A batch of nothing but lingering writes (writes nobody waits on to
    /// answer a client) waits up to `outcome_linger`
    /// ([`crate::OUTCOME_LINGER`]) for a command that someone does wait on,
    /// and takes it into the same commit: a client writing one record after
    /// another otherwise waits for the previous lingering write to be
    /// synced before its own can be, two commits instead of one. The wait
    /// ends as soon as such a command arrives, so it never delays one; a
    /// lingering write is committed at most that much later (until then it
    /// is not on disk, and reads do not see it).
    fn linger(&self, rx: &Receiver<Envelope<K>>, batch: &mut Vec<Envelope<K>>) {
        if !batch.iter().all(|e| e.cmd.lingers()) {
            return;
        }
        let until = Instant::now() + self.options.outcome_linger;
        while batch.len() < MAX_BATCH {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            // A disconnected queue is seen by the next wait of `serve`.
            let Ok(cmd) = rx.recv_timeout(left) else {
                return;
            };
            let lingers = cmd.cmd.lingers();
            self.took(batch, cmd);
            if !lingers {
                self.fill(rx, batch);
                return;
            }
        }
    }

    /// Writes an online snapshot in steps, serving the queue between them.
    /// Returns the shutdown request that arrived meanwhile, if any (the
    /// snapshot is then abandoned), or `Err` when every handle is gone.
    fn snapshot(
        &mut self,
        rx: &Receiver<Envelope<K>>,
        job: SnapshotJob<K::Refusal>,
    ) -> Result<Option<Reply<(), K::Refusal>>, Disconnected> {
        let SnapshotJob { span, dest, reply } = job;
        if let Some(e) = self.disabled() {
            let _ = reply.send(Err(e));
            return Ok(None);
        }
        let failed = |e: rusqlite::Error, during: &str| {
            // Never latches the store: the error may be the destination's
            // (a full backup disk); a fault of the live database shows on
            // the next command that touches it.
            EngineError::Internal(format!("snapshot {during}: {e}"))
        };
        let mut dst = match span.in_scope(|| open_snapshot_destination(&dest)) {
            Ok(c) => c,
            Err(e) => {
                let _ = reply.send(Err(failed(e, "opening the destination")));
                return Ok(None);
            }
        };
        // A handle of our own: the backup borrows it, not `self`, so the
        // engine stays free to serve commands between steps.
        let src = match &self.conn {
            Some(c) => Rc::clone(c),
            None => {
                let _ = reply.send(Err(EngineError::Stopped));
                return Ok(None);
            }
        };
        let backup = match Backup::new(&src, &mut dst) {
            Ok(b) => b,
            Err(e) => {
                let _ = reply.send(Err(failed(e, "starting")));
                return Ok(None);
            }
        };
        let mut report = SnapshotReport {
            pages: 0,
            steps: 0,
            batches_between: 0,
        };
        let mut shutdown = None;
        let outcome = loop {
            self.wait_while_stalled();
            let step = span.in_scope(|| backup.step(SNAPSHOT_STEP_PAGES));
            report.steps += 1;
            match step {
                Ok(StepResult::Done) => break Ok(()),
                // Busy and Locked cannot come from this connection between
                // batches; like More, they mean "step again".
                Ok(_) => {}
                Err(e) => break Err(failed(e, "copying")),
            }
            let mut batch = Vec::new();
            let woke = self.woke();
            match rx.try_recv() {
                Ok(cmd) => self.start(rx, &mut batch, cmd),
                Err(TryRecvError::Empty) => {}
                Err(TryRecvError::Disconnected) => {
                    break Err(EngineError::Stopped);
                }
            }
            let had_commands = !batch.is_empty();
            let after = self.process(batch);
            if had_commands {
                report.batches_between += 1;
            }
            self.run_timers(woke);
            self.shared.progress.fetch_add(1, Ordering::Relaxed);
            if let Some(job) = after.snapshot {
                let _ = job.reply.send(Err(EngineError::Internal(
                    "a snapshot is already being written".into(),
                )));
            }
            if after.shutdown.is_some() {
                shutdown = after.shutdown;
                break Err(EngineError::Stopped);
            }
        };
        report.pages = backup.progress().pagecount.max(0) as u64;
        drop(backup);
        let disconnected = matches!(outcome, Err(EngineError::Stopped)) && shutdown.is_none();
        let outcome = outcome.and_then(|()| {
            dst.close()
                .map_err(|(_, e)| failed(e, "closing the destination"))
        });
        span.in_scope(|| match &outcome {
            Ok(()) => tracing::info!(
                pages = report.pages,
                steps = report.steps,
                batches = report.batches_between,
                "online snapshot of the database written"
            ),
            Err(e) => tracing::warn!(error = %e, "online snapshot failed: {e}"),
        });
        let _ = reply.send(outcome.map(|()| report));
        if disconnected {
            return Err(Disconnected);
        }
        Ok(shutdown)
    }

    fn wait_while_stalled(&self) {
        if let Some(file) = &self.options.hooks.stall_file {
            while file.exists() {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    fn disabled(&self) -> Option<Error<K>> {
        self.shared
            .disabled_reason()
            .map(|reason| EngineError::Disabled { reason })
    }

    /// Latches the service disabled and returns the error for the caller
    /// whose operation met it.
    fn latch(&self, e: &rusqlite::Error, during: &str, uncertain: bool) -> Error<K> {
        let reason = format!("{during}: {e}");
        self.shared.latch(reason.clone());
        if uncertain {
            EngineError::Uncertain { detail: reason }
        } else {
            EngineError::Disabled { reason }
        }
    }

    /// Maps an SQLite error met outside a write transaction.
    pub(crate) fn fail(&self, e: rusqlite::Error, during: &str) -> Error<K> {
        match severity(&e) {
            Severity::Full => EngineError::Full(self.full_kind()),
            Severity::Fatal => self.latch(&e, during, false),
            Severity::Other => EngineError::Internal(format!("{during}: {e}")),
        }
    }

    /// Both a full filesystem and the page cap give SQLITE_FULL; only at the
    /// page cap is cleanup sure to keep working, so tell them apart: it is
    /// the page cap only when the database is near `max_page_count` and the
    /// filesystem still has room for the largest batch.
    fn full_kind(&self) -> FullKind {
        let pages = self
            .conn()
            .query_row("PRAGMA page_count", [], |r| r.get::<_, i64>(0))
            .unwrap_or(0)
            .max(0) as u64;
        let near_cap = pages + PAGE_CAP_MARGIN >= self.options.max_db_pages;
        let room = self
            .options
            .db_path
            .parent()
            .and_then(|dir| nix::sys::statvfs::statvfs(dir).ok())
            .map(|v| v.blocks_available().saturating_mul(v.fragment_size()))
            .unwrap_or(0);
        if near_cap && room >= PAGE_CAP_MARGIN * open::PAGE_SIZE as u64 {
            FullKind::PageCap {
                pages: self.options.max_db_pages,
            }
        } else {
            FullKind::DiskFull
        }
    }

    fn process(&mut self, batch: Vec<Envelope<K>>) -> AfterBatch<K::Refusal> {
        // The store's event at trace level: how many commands each batch
        // held (never what they carry), to watch group commit at work.
        tracing::trace!(commands = batch.len(), "store batch");
        let mut writes = Vec::new();
        let mut maintenance = Vec::new();
        let mut after = AfterBatch::default();
        for Envelope { span, cmd } in batch {
            let _entered = span.enter();
            match cmd {
                Command::Ping { reply } => drop(reply.send(Ok(()))),
                Command::Read(op) => match self.disabled() {
                    Some(e) => op.refuse(e),
                    None => {
                        let cx = ReadCx {
                            conn: self.conn(),
                            now: self.now_ms(),
                            kinds: &self.kinds,
                        };
                        op.run(&cx, self);
                    }
                },
                Command::Write(op) => writes.push((span.clone(), op)),
                cmd @ (Command::Sweep { .. } | Command::Checkpoint { .. }) => {
                    maintenance.push((span.clone(), cmd))
                }
                Command::Snapshot { dest, reply } => {
                    if after.snapshot.is_some() {
                        let _ = reply.send(Err(EngineError::Internal(
                            "a snapshot is already being written".into(),
                        )));
                    } else {
                        after.snapshot = Some(SnapshotJob {
                            span: span.clone(),
                            dest,
                            reply,
                        });
                    }
                }
                Command::Shutdown { reply } => after.shutdown = Some(reply),
            }
        }
        if !writes.is_empty() {
            self.commit(writes);
        }
        for (span, cmd) in maintenance {
            let _entered = span.enter();
            match cmd {
                Command::Sweep { reply } => {
                    let _ = reply.send(self.sweep(self.now_ms()));
                }
                Command::Checkpoint { reply } => {
                    let _ = reply.send(self.checkpoint());
                }
                _ => {}
            }
        }
        after
    }

    /// One group commit: every write of the batch in one transaction.
    fn commit(&mut self, writes: Vec<(tracing::Span, Box<dyn WriteOp<K>>)>) {
        if let Some(e) = self.disabled() {
            writes.into_iter().for_each(|(_, w)| w.failed(e.clone()));
            return;
        }
        let (started, batch) = (std::time::Instant::now(), writes.len());
        if let Err(e) = Self::exec(self.conn(), "BEGIN IMMEDIATE") {
            let err = self.fail(e, "beginning a transaction");
            writes.into_iter().for_each(|(_, w)| w.failed(err.clone()));
            return;
        }
        let mut done: Vec<Box<dyn WriteOp<K>>> = Vec::with_capacity(writes.len());

        if writes.iter().any(|(_, w)| w.makes_room()) && !self.sweep_held() {
            // A write that adds records clears some expired ones on the
            // way (bounded per kind).
            if let Err(e) = self.in_savepoint(|tx| tx.kinds.sweep(tx.conn, tx.now, SWEEP_BATCH))
                && let Some(err) = self.abort_if_lost(&e, "clearing expired records")
            {
                writes.into_iter().for_each(|(_, w)| w.failed(err.clone()));
                return;
            }
        }

        let mut rest = writes.into_iter();
        while let Some((span, mut write)) = rest.next() {
            let _entered = span.enter();
            let mut refusal = None;
            let outcome = self.in_savepoint(|tx| match write.apply(tx) {
                Ok(()) => Ok(()),
                Err(OpError::Refused(e)) => {
                    refusal = Some(e);
                    // Any error rolls the savepoint back; this one is ours.
                    Err(rusqlite::Error::QueryReturnedNoRows)
                }
                Err(OpError::Sql(e)) => Err(e),
            });
            match (outcome, refusal) {
                (_, Some(e)) => write.failed(EngineError::Refused(e)),
                (Ok(()), None) => done.push(write),
                (Err(e), None) => {
                    if let Some(err) = self.abort_if_lost(&e, write.during()) {
                        // The whole transaction is gone: nobody in it may
                        // hear success.
                        write.failed(err.clone());
                        done.into_iter().for_each(|w| w.failed(err.clone()));
                        rest.for_each(|(_, w)| w.failed(err.clone()));
                        return;
                    }
                    let err = match severity(&e) {
                        Severity::Full => EngineError::Full(self.full_kind()),
                        _ => EngineError::Internal(format!("{}: {e}", write.during())),
                    };
                    write.failed(err);
                }
            }
        }

        match Self::exec(self.conn(), "COMMIT") {
            Ok(()) => {
                self.options
                    .observer
                    .committed(batch, started.elapsed().as_secs_f64());
                self.kinds.committed();
                done.into_iter().for_each(|w| w.committed());
            }
            Err(e) => {
                self.kinds.rolled_back();
                let err = match severity(&e) {
                    // COMMIT itself failed with an I/O error: it may or may
                    // not be on disk. Never retried, never a success.
                    Severity::Fatal => self.latch(&e, "committing", true),
                    Severity::Full => EngineError::Full(self.full_kind()),
                    Severity::Other => EngineError::Internal(format!("committing: {e}")),
                };
                if !self.conn().is_autocommit()
                    && let Err(rb) = self.conn().execute_batch("ROLLBACK")
                    && matches!(severity(&rb), Severity::Fatal)
                {
                    self.latch(&rb, "rolling back", true);
                }
                done.into_iter().for_each(|w| w.failed(err.clone()));
            }
        }
    }

    /// After a failed statement inside the batch transaction: when the error
    /// is fatal, or SQLite rolled the whole transaction back, returns the
    /// error every member of the batch gets (and the kinds forget what the
    /// batch changed). `None` means only the failed savepoint is lost.
    fn abort_if_lost(&mut self, e: &rusqlite::Error, during: &str) -> Option<Error<K>> {
        let lost = match severity(e) {
            Severity::Fatal => {
                let err = self.latch(e, during, false);
                if !self.conn().is_autocommit() {
                    let _ = self.conn().execute_batch("ROLLBACK");
                }
                Some(err)
            }
            _ if self.conn().is_autocommit() => Some(match severity(e) {
                Severity::Full => EngineError::Full(self.full_kind()),
                _ => EngineError::Internal(format!("{during}: {e}")),
            }),
            _ => None,
        };
        if lost.is_some() {
            self.kinds.rolled_back();
        }
        lost
    }

    /// Runs `body` under a savepoint, rolling back to it on error.
    fn in_savepoint<T>(
        &mut self,
        body: impl FnOnce(&mut Tx<'_, K>) -> rusqlite::Result<T>,
    ) -> rusqlite::Result<T> {
        let now = self.now_ms();
        let Engine { conn, kinds, .. } = self;
        let conn = open_connection(conn);
        Self::exec(conn, "SAVEPOINT w")?;
        let mut tx = Tx { conn, now, kinds };
        match body(&mut tx) {
            Ok(v) => {
                Self::exec(conn, "RELEASE w")?;
                Ok(v)
            }
            Err(e) => {
                // A savepoint that cannot be rolled back would leave its
                // changes in the batch while the kinds forget them: the
                // whole transaction goes instead (the caller then finds the
                // connection outside it and fails the batch).
                if !conn.is_autocommit()
                    && Self::exec(conn, "ROLLBACK TO w")
                        .and_then(|()| Self::exec(conn, "RELEASE w"))
                        .is_err()
                {
                    let _ = conn.execute_batch("ROLLBACK");
                }
                Err(e)
            }
        }
    }

    /// Test hook: expired records are kept while the hold file exists.
    fn sweep_held(&self) -> bool {
        self.options
            .hooks
            .hold_sweep_file
            .as_ref()
            .is_some_and(|f| f.exists())
    }

    /// Deletes up to [`SWEEP_BATCH`] records of each kind expired at `now`, every
    /// kind's deletion in one transaction: when one kind's fails, the
    /// others' are undone with it, so what each kind counts stays what the
    /// file holds.
    fn sweep(&mut self, now: i64) -> Result<u64, Error<K>> {
        if let Some(e) = self.disabled() {
            return Err(e);
        }
        if self.sweep_held() {
            return Ok(0);
        }
        let Engine { conn, kinds, .. } = self;
        let conn = open_connection(conn);
        let swept = Self::exec(conn, "BEGIN IMMEDIATE")
            .and_then(|()| kinds.sweep(conn, now, SWEEP_BATCH))
            .and_then(|n| Self::exec(conn, "COMMIT").map(|()| n));
        match swept {
            Ok(n) => {
                self.kinds.committed();
                Ok(n)
            }
            Err(e) => {
                self.kinds.rolled_back();
                let err = self.fail(e, "sweeping expired records");
                // As after a failed batch: a transaction that cannot be
                // rolled back leaves the connection unusable.
                if !self.conn().is_autocommit()
                    && let Err(rb) = self.conn().execute_batch("ROLLBACK")
                    && matches!(severity(&rb), Severity::Fatal)
                {
                    self.latch(&rb, "rolling back", true);
                }
                Err(err)
            }
        }
    }

    fn checkpoint(&self) -> Result<CheckpointReport, Error<K>> {
        if let Some(e) = self.disabled() {
            return Err(e);
        }
        let started = std::time::Instant::now();
        let report = self
            .conn()
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                Ok(CheckpointReport {
                    busy: r.get::<_, i64>(0)? != 0,
                    wal_frames: r.get(1)?,
                    checkpointed_frames: r.get(2)?,
                })
            })
            .map_err(|e| self.fail(e, "checkpointing"))?;
        self.options
            .observer
            .checkpointed(started.elapsed().as_secs_f64());
        if !report.busy {
            self.shared
                .last_checkpoint_ms
                .store(self.now_ms().max(1), Ordering::Relaxed);
        }
        Ok(report)
    }

    /// The time a turn of the loop began, before it took any command: the
    /// turn's timers run at that time, never at one that a caller could
    /// only have seen after its answer (with a manual clock, a test moves
    /// time between answers, and timers that read the clock after
    /// answering raced with it).
    fn woke(&self) -> Woke {
        Woke {
            monotonic: self.options.clock.monotonic(),
            now_ms: self.now_ms(),
        }
    }

    fn run_timers(&mut self, woke: Woke) {
        let now = woke.monotonic;
        if now >= self.next_sweep {
            self.next_sweep = now + SWEEP_INTERVAL;
            if self.disabled().is_none()
                && let Err(e) = self.sweep(woke.now_ms)
            {
                tracing::warn!(error = %e, "expiry sweep failed: {e}");
            }
        }
        if now >= self.next_checkpoint {
            self.next_checkpoint = now + self.options.checkpoint_interval;
            if self.disabled().is_none()
                && let Err(e) = self.checkpoint()
            {
                tracing::warn!(error = %e, "periodic checkpoint failed: {e}");
            }
        }
    }

    /// Clean close: a TRUNCATE checkpoint, then closing with
    /// checkpoint-on-close back on so the -wal and -shm files go away. A
    /// disabled store is closed without touching the file again.
    fn close(&mut self, reply: Option<Reply<(), K::Refusal>>) {
        let mut result = Ok(());
        if self.disabled().is_none() {
            match self.checkpoint() {
                Ok(r) => tracing::info!(
                    wal_frames = r.wal_frames,
                    checkpointed = r.checkpointed_frames,
                    "final checkpoint done: {} of {} WAL frames written back",
                    r.checkpointed_frames,
                    r.wal_frames
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "final checkpoint failed: {e}");
                    result = Err(e);
                }
            }
            if result.is_ok() {
                let _ = self
                    .conn()
                    .set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, false);
            }
        }
        // Every snapshot has dropped its handle by now: the connection is
        // ours alone again.
        if let Some(conn) = self.conn.take().and_then(|c| Rc::try_unwrap(c).ok())
            && let Err((_, e)) = conn.close()
        {
            tracing::warn!(error = %e, "closing the database failed: {e}");
        }
        if let Some(reply) = reply {
            let _ = reply.send(result);
        }
    }
}
