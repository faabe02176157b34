//! The store thread: the only owner of the SQLite connection.
//!
//! It takes commands from the bounded queue in batches. Reads are answered
//! at once. Writes of one batch share one transaction (group commit), each
//! under its own savepoint so one failure does not fail the others, and
//! every writer is answered only after COMMIT returned. An uncertain I/O
//! error or corruption latches the service disabled: nothing is retried and
//! nothing afterwards is acknowledged. While it executes a command the
//! thread is inside that command's span, so what it logs belongs to the
//! request that asked for it.

use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::time::Duration;

use rusqlite::backup::{Backup, StepResult};
use rusqlite::config::DbConfig;
use rusqlite::{Connection, ErrorCode, OpenFlags};

use super::schema::{self, OpenReport};
use super::{
    CapacityKind, CheckpointReport, Command, Created, Envelope, MAX_BATCH, NewTask, OpenError,
    Reply, SNAPSHOT_STEP_PAGES, SWEEP_BATCH, SWEEP_INTERVAL, Shared, SnapshotReport, StoreError,
    StoreId, StoreOptions, StoreStats, TaskId, TaskRecord, records,
};

/// Pages of headroom below `max_page_count` within which SQLITE_FULL is
/// blamed on the page cap rather than the filesystem: more than the largest
/// batch can need (256 terminal payloads of 16 KiB plus index pages).
const PAGE_CAP_MARGIN: u64 = 2048;

/// What the store thread tells the opener, in order.
pub(super) enum Stage {
    /// Validated and migrated; these tasks are about to be ended by
    /// recovery. The thread waits for the opener's go-ahead.
    Prepared(Vec<TaskId>, StoreId),
    Recovered(OpenReport),
}

pub(super) fn run(
    options: StoreOptions,
    rx: Receiver<Envelope>,
    shared: Arc<Shared>,
    ready: mpsc::Sender<Result<Stage, OpenError>>,
    go: Receiver<()>,
) {
    let prepared = match schema::prepare(&options) {
        Ok(p) => p,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let ids = prepared.unfinished.iter().map(|u| u.id.clone()).collect();
    let _ = ready.send(Ok(Stage::Prepared(ids, prepared.identity.clone())));
    if go.recv().is_err() {
        // The opener gave up: close without recovering (checkpoint-on-close
        // is still off, so the file is left as migration left it).
        return;
    }
    let (report, rows) = match schema::recover(&prepared, &options) {
        Ok(r) => r,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let _ = ready.send(Ok(Stage::Recovered(report)));
    let now = options.clock.monotonic();
    let mut worker = Worker {
        conn: Some(Rc::new(prepared.conn)),
        rows,
        next_sweep: now + SWEEP_INTERVAL,
        next_checkpoint: now + options.checkpoint_interval,
        options,
        shared,
    };
    worker.serve(rx);
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

/// The reply channel of a write, whatever it returns.
enum WriteReply {
    Create(Reply<Created>),
    Record(Reply<Option<TaskRecord>>),
}

enum WriteOk {
    Create(Created),
    Record(Option<TaskRecord>),
}

impl WriteReply {
    fn fail(self, e: StoreError) {
        match self {
            WriteReply::Create(r) => drop(r.send(Err(e))),
            WriteReply::Record(r) => drop(r.send(Err(e))),
        }
    }

    fn answer(self, ok: WriteOk) {
        match (self, ok) {
            (WriteReply::Create(r), WriteOk::Create(c)) => drop(r.send(Ok(c))),
            (WriteReply::Record(r), WriteOk::Record(t)) => drop(r.send(Ok(t))),
            (reply, _) => reply.fail(StoreError::Internal("mismatched reply".into())),
        }
    }
}

/// A write command's work, separated from its reply channel.
enum Write {
    Create(NewTask),
    Finish {
        id: TaskId,
        status: super::TaskStatus,
        payload: Option<Vec<u8>>,
    },
    RequestCancel {
        id: TaskId,
        owner: super::Digest,
    },
}

/// Why one write inside the batch failed.
enum ApplyError {
    /// A refusal decided by taskgate (capacity, conflict): the savepoint is
    /// rolled back and the batch goes on.
    Refused(StoreError),
    Sql(rusqlite::Error),
}

impl From<rusqlite::Error> for ApplyError {
    fn from(e: rusqlite::Error) -> Self {
        ApplyError::Sql(e)
    }
}

/// An online snapshot asked for by a command.
struct SnapshotJob {
    span: tracing::Span,
    dest: std::path::PathBuf,
    reply: Reply<SnapshotReport>,
}

/// What one batch left for the loop to do after it.
#[derive(Default)]
struct AfterBatch {
    shutdown: Option<Reply<()>>,
    snapshot: Option<SnapshotJob>,
}

/// The store thread's state. It is made on the store thread and is not
/// `Send` (the connection is behind an `Rc`), so the compiler keeps the
/// connection on that thread: invariant 1 ([`WORKER_STAYS_ON_ITS_THREAD`]).
struct Worker {
    /// `None` only after close. Shared (on this thread only) so that a
    /// snapshot's backup can borrow it while the worker goes on serving
    /// commands between the snapshot's steps.
    conn: Option<Rc<Connection>>,
    /// Rows in the table as of the last commit.
    rows: u64,
    /// Timer deadlines on the clock's monotonic scale.
    next_sweep: Duration,
    next_checkpoint: Duration,
    options: StoreOptions,
    shared: Arc<Shared>,
}

/// Fails to compile if `Worker` becomes `Send` (say, the `Rc` around the
/// connection were dropped, or it were held in a `Mutex`): the
/// two blanket impls make `some_item` ambiguous for a `Send` type only.
#[allow(dead_code)]
const WORKER_STAYS_ON_ITS_THREAD: fn() = || {
    trait AmbiguousIfSend<A> {
        fn some_item() {}
    }
    impl<T: ?Sized> AmbiguousIfSend<()> for T {}
    impl<T: ?Sized + Send> AmbiguousIfSend<u8> for T {}
    let _ = <Worker as AmbiguousIfSend<_>>::some_item;
};

impl Worker {
    /// Runs one statement from the statement cache: the transaction and
    /// savepoint statements run several times per batch.
    fn exec(&self, sql: &str) -> rusqlite::Result<()> {
        self.conn().prepare_cached(sql)?.execute([]).map(|_| ())
    }

    fn now_ms(&self) -> i64 {
        self.options.clock.now_ms()
    }

    fn conn(&self) -> &Connection {
        // Only `close` takes the connection, and it ends the loop.
        self.conn.as_deref().expect("connection used after close")
    }

    fn serve(&mut self, rx: Receiver<Envelope>) {
        loop {
            self.wait_while_stalled();
            let deadline = self.next_sweep.min(self.next_checkpoint);
            let wait = deadline.saturating_sub(self.options.clock.monotonic());
            let mut batch = Vec::new();
            match rx.recv_timeout(wait) {
                Ok(cmd) => {
                    batch.push(cmd);
                    self.fill(&rx, &mut batch);
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    self.close(None);
                    return;
                }
            }
            let mut after = self.process(batch);
            self.run_timers();
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
                let _ = job.reply.send(Err(StoreError::Stopped));
            }
            if let Some(reply) = after.shutdown {
                self.close(Some(reply));
                return;
            }
        }
    }

    /// Adds what is waiting in the queue to `batch`, up to [`MAX_BATCH`],
    /// without blocking.
    fn fill(&self, rx: &Receiver<Envelope>, batch: &mut Vec<Envelope>) {
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(cmd) => batch.push(cmd),
                Err(_) => break,
            }
        }
        self.shared
            .queued
            .fetch_sub(batch.len() as i64, Ordering::Relaxed);
    }

    /// Writes an online snapshot in steps, serving the queue between them.
    /// Returns the shutdown request that arrived meanwhile, if any (the
    /// snapshot is then abandoned), or `Err` when every handle is gone.
    fn snapshot(
        &mut self,
        rx: &Receiver<Envelope>,
        job: SnapshotJob,
    ) -> Result<Option<Reply<()>>, Disconnected> {
        let SnapshotJob { span, dest, reply } = job;
        if let Some(e) = self.disabled() {
            let _ = reply.send(Err(e));
            return Ok(None);
        }
        let failed = |e: rusqlite::Error, during: &str| {
            // Never latches the store: the error may be the destination's
            // (a full backup disk); a fault of the live database shows on
            // the next command that touches it.
            StoreError::Internal(format!("snapshot {during}: {e}"))
        };
        let mut dst = match span.in_scope(|| open_snapshot_destination(&dest)) {
            Ok(c) => c,
            Err(e) => {
                let _ = reply.send(Err(failed(e, "opening the destination")));
                return Ok(None);
            }
        };
        // A handle of our own: the backup borrows it, not `self`, so the
        // worker stays free to serve commands between steps.
        let src = match &self.conn {
            Some(c) => Rc::clone(c),
            None => {
                let _ = reply.send(Err(StoreError::Stopped));
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
            match rx.try_recv() {
                Ok(cmd) => {
                    batch.push(cmd);
                    self.fill(rx, &mut batch);
                }
                Err(TryRecvError::Empty) => {}
                Err(TryRecvError::Disconnected) => {
                    break Err(StoreError::Stopped);
                }
            }
            let had_commands = !batch.is_empty();
            let after = self.process(batch);
            if had_commands {
                report.batches_between += 1;
            }
            self.run_timers();
            self.shared.progress.fetch_add(1, Ordering::Relaxed);
            if let Some(job) = after.snapshot {
                let _ = job.reply.send(Err(StoreError::Internal(
                    "a snapshot is already being written".into(),
                )));
            }
            if after.shutdown.is_some() {
                shutdown = after.shutdown;
                break Err(StoreError::Stopped);
            }
        };
        report.pages = backup.progress().pagecount.max(0) as u64;
        drop(backup);
        let disconnected = matches!(outcome, Err(StoreError::Stopped)) && shutdown.is_none();
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
        if let Some(file) = &self.options.stall_file {
            while file.exists() {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    fn disabled(&self) -> Option<StoreError> {
        self.shared
            .disabled_reason()
            .map(|reason| StoreError::Disabled { reason })
    }

    /// Latches the service disabled and returns the error for the caller
    /// whose operation met it.
    fn latch(&self, e: &rusqlite::Error, during: &str, uncertain: bool) -> StoreError {
        let reason = format!("{during}: {e}");
        self.shared.latch(reason.clone());
        if uncertain {
            StoreError::Uncertain { detail: reason }
        } else {
            StoreError::Disabled { reason }
        }
    }

    /// Maps an SQLite error met outside a write transaction.
    fn fail(&self, e: rusqlite::Error, during: &str) -> StoreError {
        match severity(&e) {
            Severity::Full => StoreError::Capacity(self.full_kind()),
            Severity::Fatal => self.latch(&e, during, false),
            Severity::Other => StoreError::Internal(format!("{during}: {e}")),
        }
    }

    /// Both a full filesystem and the page cap give SQLITE_FULL; only at the
    /// page cap is cleanup sure to keep working, so tell them apart: it is
    /// the page cap only when the database is near `max_page_count` and the
    /// filesystem still has room for the largest batch.
    fn full_kind(&self) -> CapacityKind {
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
        if near_cap && room >= PAGE_CAP_MARGIN * schema::PAGE_SIZE as u64 {
            CapacityKind::PageCap {
                pages: self.options.max_db_pages,
            }
        } else {
            CapacityKind::DiskFull
        }
    }

    fn process(&mut self, batch: Vec<Envelope>) -> AfterBatch {
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
                Command::Get { id, owner, reply } => {
                    let r = match self.disabled() {
                        Some(e) => Err(e),
                        None => records::find_owned(self.conn(), &id, &owner, self.now_ms())
                            .map_err(|e| self.fail(e, "reading a task")),
                    };
                    let _ = reply.send(r);
                }
                Command::FindReference {
                    owner,
                    reference,
                    request,
                    reply,
                } => {
                    let r = match self.disabled() {
                        Some(e) => Err(e),
                        None => records::find_by_reference(
                            self.conn(),
                            &owner,
                            &reference,
                            self.now_ms(),
                        )
                        .map_err(|e| self.fail(e, "reading a task by its reference"))
                        .and_then(|found| match found {
                            Some(f) if !f.expired => {
                                if f.request.as_deref() == request.as_ref().map(|d| &d.0[..]) {
                                    Ok(Some(f.record))
                                } else {
                                    Err(StoreError::Conflict)
                                }
                            }
                            _ => Ok(None),
                        }),
                    };
                    let _ = reply.send(r);
                }
                Command::Stats { reply } => {
                    let _ = reply.send(self.stats());
                }
                Command::Unexpired { ids, reply } => {
                    let r = match self.disabled() {
                        Some(e) => Err(e),
                        None => {
                            let now = self.now_ms();
                            ids.iter()
                                .map(|id| {
                                    records::find_unexpired(self.conn(), id, now)
                                        .map(|r| r.is_some())
                                })
                                .collect::<rusqlite::Result<Vec<bool>>>()
                                .map_err(|e| self.fail(e, "reading tasks"))
                        }
                    };
                    let _ = reply.send(r);
                }
                Command::Create { new, reply } => {
                    writes.push((span.clone(), Write::Create(new), WriteReply::Create(reply)))
                }
                Command::Finish {
                    id,
                    status,
                    payload,
                    reply,
                } => writes.push((
                    span.clone(),
                    Write::Finish {
                        id,
                        status,
                        payload,
                    },
                    WriteReply::Record(reply),
                )),
                Command::RequestCancel { id, owner, reply } => writes.push((
                    span.clone(),
                    Write::RequestCancel { id, owner },
                    WriteReply::Record(reply),
                )),
                cmd @ (Command::Sweep { .. } | Command::Checkpoint { .. }) => {
                    maintenance.push((span.clone(), cmd))
                }
                Command::Snapshot { dest, reply } => {
                    if after.snapshot.is_some() {
                        let _ = reply.send(Err(StoreError::Internal(
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
                    let _ = reply.send(self.sweep());
                }
                Command::Checkpoint { reply } => {
                    let _ = reply.send(self.checkpoint());
                }
                _ => {}
            }
        }
        after
    }

    fn stats(&self) -> Result<StoreStats, StoreError> {
        if let Some(e) = self.disabled() {
            return Err(e);
        }
        let expired = records::count_expired(self.conn(), self.now_ms())
            .map_err(|e| self.fail(e, "counting tasks"))?;
        Ok(StoreStats {
            retained: self.rows,
            unexpired: self.rows.saturating_sub(expired),
        })
    }

    /// One group commit: every write of the batch in one transaction.
    fn commit(&mut self, writes: Vec<(tracing::Span, Write, WriteReply)>) {
        if let Some(e) = self.disabled() {
            writes.into_iter().for_each(|(_, _, r)| r.fail(e.clone()));
            return;
        }
        let now = self.now_ms();
        if let Err(e) = self.exec("BEGIN IMMEDIATE") {
            let err = self.fail(e, "beginning a transaction");
            writes.into_iter().for_each(|(_, _, r)| r.fail(err.clone()));
            return;
        }
        let mut delta: i64 = 0;
        let mut done: Vec<(WriteReply, WriteOk)> = Vec::with_capacity(writes.len());

        if writes.iter().any(|(_, w, _)| matches!(w, Write::Create(_))) && !self.sweep_held() {
            // Creation clears some expired rows on the way (bounded).
            match self.in_savepoint(|c| records::delete_expired(c, now, SWEEP_BATCH)) {
                Ok(n) => delta -= n as i64,
                Err(e) => {
                    if let Some(err) = self.abort_if_lost(&e, "clearing expired tasks") {
                        writes.into_iter().for_each(|(_, _, r)| r.fail(err.clone()));
                        return;
                    }
                }
            }
        }

        let mut rest = writes.into_iter();
        while let Some((span, write, reply)) = rest.next() {
            let _entered = span.enter();
            let outcome = self.in_savepoint_apply(&write, now, self.rows as i64 + delta);
            match outcome {
                Ok((ok, d)) => {
                    delta += d;
                    done.push((reply, ok));
                }
                Err(ApplyError::Refused(e)) => reply.fail(e),
                Err(ApplyError::Sql(e)) => {
                    if let Some(err) = self.abort_if_lost(&e, "writing a task") {
                        // The whole transaction is gone: nobody in it may
                        // hear success.
                        reply.fail(err.clone());
                        done.into_iter().for_each(|(r, _)| r.fail(err.clone()));
                        rest.for_each(|(_, _, r)| r.fail(err.clone()));
                        return;
                    }
                    reply.fail(match severity(&e) {
                        Severity::Full => StoreError::Capacity(self.full_kind()),
                        _ => StoreError::Internal(format!("writing a task: {e}")),
                    });
                }
            }
        }

        match self.exec("COMMIT") {
            Ok(()) => {
                self.rows = (self.rows as i64 + delta).max(0) as u64;
                done.into_iter().for_each(|(r, ok)| r.answer(ok));
            }
            Err(e) => {
                let err = match severity(&e) {
                    // COMMIT itself failed with an I/O error: it may or may
                    // not be on disk. Never retried, never a success.
                    Severity::Fatal => self.latch(&e, "committing", true),
                    Severity::Full => StoreError::Capacity(self.full_kind()),
                    Severity::Other => StoreError::Internal(format!("committing: {e}")),
                };
                if !self.conn().is_autocommit()
                    && let Err(rb) = self.conn().execute_batch("ROLLBACK")
                    && matches!(severity(&rb), Severity::Fatal)
                {
                    self.latch(&rb, "rolling back", true);
                }
                done.into_iter().for_each(|(r, _)| r.fail(err.clone()));
            }
        }
    }

    /// After a failed statement inside the batch transaction: when the error
    /// is fatal, or SQLite rolled the whole transaction back, returns the
    /// error every member of the batch gets. `None` means only the failed
    /// savepoint is lost.
    fn abort_if_lost(&self, e: &rusqlite::Error, during: &str) -> Option<StoreError> {
        let conn = self.conn();
        match severity(e) {
            Severity::Fatal => {
                let err = self.latch(e, during, false);
                if !conn.is_autocommit() {
                    let _ = conn.execute_batch("ROLLBACK");
                }
                Some(err)
            }
            _ if conn.is_autocommit() => Some(match severity(e) {
                Severity::Full => StoreError::Capacity(self.full_kind()),
                _ => StoreError::Internal(format!("{during}: {e}")),
            }),
            _ => None,
        }
    }

    /// Runs `body` under a savepoint, rolling back to it on error.
    fn in_savepoint<T>(
        &self,
        body: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> rusqlite::Result<T> {
        self.exec("SAVEPOINT w")?;
        match body(self.conn()) {
            Ok(v) => {
                self.exec("RELEASE w")?;
                Ok(v)
            }
            Err(e) => {
                if !self.conn().is_autocommit() {
                    let _ = self.exec("ROLLBACK TO w");
                    let _ = self.exec("RELEASE w");
                }
                Err(e)
            }
        }
    }

    fn in_savepoint_apply(
        &self,
        write: &Write,
        now: i64,
        rows: i64,
    ) -> Result<(WriteOk, i64), ApplyError> {
        let mut refusal = None;
        let result = self.in_savepoint(|c| match self.apply(c, write, now, rows) {
            Ok(v) => Ok(Some(v)),
            Err(ApplyError::Refused(e)) => {
                refusal = Some(e);
                // Any error rolls the savepoint back; this one is ours.
                Err(rusqlite::Error::QueryReturnedNoRows)
            }
            Err(ApplyError::Sql(e)) => Err(e),
        });
        match (result, refusal) {
            (_, Some(e)) => Err(ApplyError::Refused(e)),
            (Ok(Some(v)), None) => Ok(v),
            (Ok(None), None) => Err(ApplyError::Refused(StoreError::Internal(
                "write produced no answer".into(),
            ))),
            (Err(e), None) => Err(ApplyError::Sql(e)),
        }
    }

    fn apply(
        &self,
        c: &Connection,
        write: &Write,
        now: i64,
        rows: i64,
    ) -> Result<(WriteOk, i64), ApplyError> {
        match write {
            Write::Create(new) => self.create(c, new, now, rows),
            Write::Finish {
                id,
                status,
                payload,
            } => {
                let r = records::finish(c, id, *status, payload.as_deref(), now)?;
                Ok((WriteOk::Record(r), 0))
            }
            Write::RequestCancel { id, owner } => {
                let r = records::request_cancel(c, id, owner, now)?;
                Ok((WriteOk::Record(r), 0))
            }
        }
    }

    fn create(
        &self,
        c: &Connection,
        new: &NewTask,
        now: i64,
        rows: i64,
    ) -> Result<(WriteOk, i64), ApplyError> {
        let mut delta = 0;
        let existing = match &new.reference {
            Some(reference) => records::find_by_reference(c, &new.owner, reference, now)?,
            None => None,
        };
        if let Some(found) = existing {
            if !found.expired {
                let same = found.request.as_deref() == new.request.as_ref().map(|d| &d.0[..]);
                return if same {
                    Ok((WriteOk::Create(Created::Existing(found.record)), 0))
                } else {
                    Err(ApplyError::Refused(StoreError::Conflict))
                };
            }
            // An expired task no longer holds its reference.
            records::delete(c, &found.record.id)?;
            delta -= 1;
        }
        let limit = self.options.max_live_tasks;
        let rows = (rows + delta).max(0) as u64;
        if rows >= limit {
            // Expired rows awaiting cleanup do not count against the limit.
            let live = rows.saturating_sub(records::count_expired(c, now)?);
            if live >= limit {
                return Err(ApplyError::Refused(StoreError::Capacity(
                    CapacityKind::LiveTasks { limit },
                )));
            }
        }
        let per_owner = self.options.max_live_tasks_per_owner;
        if per_owner < limit && records::count_live_of(c, &new.owner, now)? >= per_owner {
            return Err(ApplyError::Refused(StoreError::Capacity(
                CapacityKind::OwnerTasks { limit: per_owner },
            )));
        }
        let id = TaskId::generate().map_err(|e| {
            ApplyError::Refused(StoreError::Internal(format!("random source: {e}")))
        })?;
        let record = records::insert(c, &id, new, now)?;
        Ok((WriteOk::Create(Created::New(record)), delta + 1))
    }

    /// Test hook: expired rows are kept while the hold file exists.
    fn sweep_held(&self) -> bool {
        self.options
            .hold_sweep_file
            .as_ref()
            .is_some_and(|f| f.exists())
    }

    fn sweep(&mut self) -> Result<u64, StoreError> {
        if let Some(e) = self.disabled() {
            return Err(e);
        }
        if self.sweep_held() {
            return Ok(0);
        }
        match records::delete_expired(self.conn(), self.now_ms(), SWEEP_BATCH) {
            Ok(n) => {
                self.rows = self.rows.saturating_sub(n);
                if n > 0 {
                    tracing::debug!(deleted = n, "{n} expired tasks swept");
                }
                Ok(n)
            }
            Err(e) => Err(self.fail(e, "sweeping expired tasks")),
        }
    }

    fn checkpoint(&self) -> Result<CheckpointReport, StoreError> {
        if let Some(e) = self.disabled() {
            return Err(e);
        }
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
        if !report.busy {
            self.shared
                .last_checkpoint_ms
                .store(self.now_ms().max(1), Ordering::Relaxed);
        }
        Ok(report)
    }

    fn run_timers(&mut self) {
        let now = self.options.clock.monotonic();
        if now >= self.next_sweep {
            self.next_sweep = now + SWEEP_INTERVAL;
            if self.disabled().is_none()
                && let Err(e) = self.sweep()
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
    fn close(&mut self, reply: Option<Reply<()>>) {
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
