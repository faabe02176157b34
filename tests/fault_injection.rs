//! Faults injected for real, below SQLite, by strace attached to the
//! store thread (every SQLite call is made there: invariant 1).
//!
//! - `inject=fsync:error=EIO` on the COMMIT of a create, of a finish and of
//!   a cancel: that writer hears `Uncertain` (its write may or may not be
//!   on disk), the store latches disabled, and nothing afterwards is
//!   acknowledged, reads included.
//! - `inject=pwrite64:error=ENOSPC`: writes are capacity errors, reads keep
//!   working, the store stays enabled and writes again once the fault is
//!   gone.
//! - A real full filesystem (a 3 MiB tmpfs in a private mount namespace):
//!   the same.
//! - The page cap (`max_db_pages`): capacity errors, reads keep working and
//!   the expiry sweep frees room for new tasks.
//!
//! The bundled SQLite writes with `pwrite64` and syncs with `fsync` (no
//! `fdatasync`, no plain `write`): checked with `strace -f` on a child under
//! load. `fdatasync`, `pwritev` and `pwritev2` are injected as well in case a
//! later build switches.
//!
//! Invariant 7 of the map: An uncertain I/O error or corruption disables the
//! task service until restart; a possibly committed write is never retried and
//! its writer hears `Uncertain`; SQLITE_FULL is a capacity error and reads and
//! cleanup keep working. Guarded by: `tests/fault_injection.rs` (the store;
//! strace on its thread alone): EIO on the one sync of the COMMIT of a create,
//! a finish and a cancel
//! (`fsync_eio_on_a_creates_commit_is_uncertain_and_disables_the_store`,
//! `fsync_eio_on_a_finishs_commit_is_uncertain_and_disables_the_store`,
//! `fsync_eio_on_a_cancels_commit_is_uncertain_and_disables_the_store`: exactly
//! one fault, on the WAL; that writer hears `Uncertain`, every later command
//! `Disabled`, reads included), ENOSPC, a full tmpfs and the page cap as
//! capacity errors; at the daemon, `tests/daemon_disk_faults.rs`:
//! `fsync_eio_on_a_creates_commit_disables_the_task_service_and_a_restart_recovers`
//! (the fault lands during the call, on its COMMIT: no handle, the `required`
//! tool never runs, `/readyz`, task requests and `status` say disabled, a
//! restart serves again) and
//! `corruption_met_while_serving_disables_the_task_service_and_the_restart_refuses_it`
//! (pages overwritten under the running daemon: the read meeting them disables
//! the service, nothing more is written, the restart refuses with 65)
//!
//! What this file proves: strace on the store thread: EIO on the COMMIT of a
//! create, a finish and a cancel (that writer hears `Uncertain`), ENOSPC; a
//! real full tmpfs, the page cap; needs root

mod common;

use std::collections::HashSet;
use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::strace::Strace;
use common::*;
use rusqlite::{Connection, OpenFlags};
use taskgate::config::StoreSettings;
use taskgate::store::{
    CapacityKind, Clock, Outcome, Store, StoreError, StoreOptions, TERMINAL_RETENTION_MS, TaskId,
    TaskStatus,
};

/// The child's mode; its presence makes `fault_child` run.
const CHILD_ENV: &str = "TASKGATE_FAULT_CHILD";
/// The directory the child makes its private state directory in.
const DIR_ENV: &str = "TASKGATE_FAULT_DIR";
const CHILD_TEST: &str = "fault_child";
/// Any single step of a child taking longer than this fails the test.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);
const LONG_TTL_MS: i64 = 86_400_000;
/// Tasks the child creates before the fault.
const BEFORE_FAULT: usize = 3;

// ---------------------------------------------------------------- child --

/// The child's main, run by the fault tests in a process of its own
/// (`--ignored --exact fault_child`); a no-op unless the parent set
/// `CHILD_ENV`. Ignored so that a plain run never counts it as a test.
#[test]
#[ignore = "child entry point: run by the EIO, ENOSPC and full-filesystem tests"]
fn fault_child() {
    let Ok(mode) = std::env::var(CHILD_ENV) else {
        return;
    };
    // libtest has printed "test fault_child ... " without a newline.
    say("");
    let base = PathBuf::from(std::env::var_os(DIR_ENV).expect("TASKGATE_FAULT_DIR"));
    let rt = runtime();
    rt.block_on(async move {
        match mode.as_str() {
            "eio-create" => child_fsync_eio(&base, FaultedWrite::Create).await,
            "eio-finish" => child_fsync_eio(&base, FaultedWrite::Finish).await,
            "eio-cancel" => child_fsync_eio(&base, FaultedWrite::Cancel).await,
            "enospc" => child_enospc(&base).await,
            "fullfs" => child_full_filesystem(&base).await,
            other => panic!("unknown child mode {other}"),
        }
    });
}

/// One protocol line to the parent, flushed at once.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .expect("write to the parent");
}

/// Blocks until the parent sends `expected` on stdin.
fn hear(expected: &str) {
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .expect("read from the parent");
    assert_eq!(line.trim_end(), expected, "unexpected line from the parent");
}

/// A terminal payload of about 15 KiB, so finishing writes overflow pages.
fn big_outcome(tag: usize) -> Outcome {
    Outcome::Result(serde_json::json!({
        "content": [{"type": "text", "text": format!("{tag:06} {}", "p".repeat(15 * 1024))}]
    }))
}

/// Creates a task and finishes it with a 15 KiB payload. The error names
/// the step that failed.
async fn create_finished(
    store: &Store,
    tag: usize,
) -> Result<TaskId, (&'static str, Option<TaskId>, StoreError)> {
    let created = store
        .create(new_task(LONG_TTL_MS))
        .await
        .map_err(|e| ("create", None, e))?;
    let id = created.record().id.clone();
    let rec = store
        .finish(&id, TaskStatus::Completed, Some(big_outcome(tag)))
        .await
        .map_err(|e| ("finish", Some(id.clone()), e))?;
    let rec = rec.expect("a task just created is there to finish");
    assert_eq!(rec.outcome, Some(big_outcome(tag)));
    Ok(id)
}

/// Every listed task reads back with its payload.
async fn read_back(store: &Store, ids: &[(usize, TaskId)]) -> Result<(), String> {
    for (tag, id) in ids {
        match store.get(id, &owner()).await {
            Ok(Some(rec)) if rec.outcome == Some(big_outcome(*tag)) => {}
            other => return Err(format!("get {id}: {other:?}")),
        }
    }
    Ok(())
}

/// Opens the child's store (a checkpoint timer of a day: no timer syncs
/// the database file while a fault is armed) and creates and finishes
/// [`BEFORE_FAULT`] tasks, each announced to the parent.
async fn open_and_seed(base: &Path) -> (Store, Vec<(usize, TaskId)>) {
    let dir = state_dir(base);
    let options = StoreOptions {
        settings: StoreSettings {
            checkpoint_interval: Duration::from_secs(86_400),
            ..StoreSettings::default()
        },
        ..StoreOptions::new(dir.join("tasks.db"))
    };
    let (store, _) = Store::open(options).expect("open");
    let mut ids = Vec::new();
    for tag in 0..BEFORE_FAULT {
        let id = create_finished(&store, tag)
            .await
            .expect("create before the fault");
        say(&format!("created {id}"));
        ids.push((tag, id));
    }
    (store, ids)
}

/// The write that meets the injected fault, named by the child's mode.
#[derive(Clone, Copy, Debug)]
enum FaultedWrite {
    Create,
    Finish,
    Cancel,
}

impl FaultedWrite {
    fn mode(self) -> &'static str {
        match self {
            FaultedWrite::Create => "eio-create",
            FaultedWrite::Finish => "eio-finish",
            FaultedWrite::Cancel => "eio-cancel",
        }
    }
}

/// EIO on the one fsync of `target`'s COMMIT: the first fsync the store
/// thread makes after "go" is that COMMIT's (no checkpoint timer fires).
async fn child_fsync_eio(base: &Path, target: FaultedWrite) {
    let (store, ids) = open_and_seed(base).await;
    // A task still running, for the finish and the cancel to act on.
    let pending = store
        .create(new_task(LONG_TTL_MS))
        .await
        .expect("create the pending task")
        .record()
        .id
        .clone();
    say(&format!("pending {pending}"));
    say(&format!("ready {}", std::process::id()));
    hear("go");

    let first = match target {
        FaultedWrite::Create => store
            .create(new_task(LONG_TTL_MS))
            .await
            .map(|c| c.record().id.to_string()),
        FaultedWrite::Finish => store
            .finish(&pending, TaskStatus::Completed, Some(big_outcome(99)))
            .await
            .map(|r| format!("{r:?}")),
        FaultedWrite::Cancel => store
            .request_cancel(&pending, &owner())
            .await
            .map(|r| format!("{r:?}")),
    };
    match first {
        Ok(r) => say(&format!("first ack {r}")),
        Err(e) => say(&format!("first err {e:?}")),
    }
    say(&format!("disabled {:?}", store.disabled_reason()));
    for _ in 0..5 {
        match store.create(new_task(LONG_TTL_MS)).await {
            Ok(c) => say(&format!("later ack {}", c.record().id)),
            Err(e) => say(&format!("later err {e:?}")),
        }
    }
    let (_, first) = &ids[0];
    match store.finish(first, TaskStatus::Cancelled, None).await {
        Ok(r) => say(&format!("later ack finish {r:?}")),
        Err(e) => say(&format!("later err finish {e:?}")),
    }
    match store.request_cancel(&pending, &owner()).await {
        Ok(r) => say(&format!("later ack cancel {r:?}")),
        Err(e) => say(&format!("later err cancel {e:?}")),
    }
    match store.get(first, &owner()).await {
        Ok(r) => say(&format!("later ack read {r:?}")),
        Err(e) => say(&format!("later err read {e:?}")),
    }
    say("done");

    hear("exit");
    say(&format!("shutdown {:?}", store.shutdown().await));
}

async fn child_enospc(base: &Path) {
    let (store, mut ids) = open_and_seed(base).await;
    say(&format!("ready {}", std::process::id()));
    hear("go");

    for tag in 100..103 {
        match create_finished(&store, tag).await {
            Ok(id) => say(&format!("write ack {id}")),
            Err((step, _, e)) => say(&format!("write err {step} {e:?}")),
        }
    }
    say(&format!("reads {:?}", read_back(&store, &ids).await));
    say(&format!("stats {:?}", store.stats().await));
    say(&format!("disabled {:?}", store.disabled_reason()));
    say("done");

    hear("resume");
    match create_finished(&store, 200).await {
        Ok(id) => {
            say(&format!("resumed {id}"));
            ids.push((200, id));
        }
        Err((step, _, e)) => say(&format!("resume err {step} {e:?}")),
    }
    say(&format!("reads {:?}", read_back(&store, &ids).await));
    say(&format!("disabled {:?}", store.disabled_reason()));
    say(&format!("shutdown {:?}", store.shutdown().await));
}

async fn child_full_filesystem(base: &Path) {
    // Refuse to fill anything but the small tmpfs the parent mounted.
    let fs = nix::sys::statfs::statfs(base).expect("statfs");
    let size = fs.blocks() * fs.block_size() as u64;
    assert_eq!(
        fs.filesystem_type(),
        nix::sys::statfs::TMPFS_MAGIC,
        "not a tmpfs"
    );
    assert!(size <= 4 << 20, "the tmpfs is {size} bytes");
    say(&format!("tmpfs {size}"));

    let dir = state_dir(base);
    let db = dir.join("tasks.db");
    // A page cap (1000 pages, 4 MB) just above the 3 MiB filesystem: the
    // database is "near the cap" when the disk fills, and the error must
    // still say the disk is full, not tell the operator to raise the cap.
    let options = StoreOptions {
        settings: StoreSettings {
            max_db_pages: 1000,
            ..StoreSettings::default()
        },
        ..StoreOptions::new(db.clone())
    };
    let (store, _) = Store::open(options).expect("open");
    let mut ids = Vec::new();
    let mut full = None;
    for tag in 0..10_000 {
        match create_finished(&store, tag).await {
            Ok(id) => ids.push((tag, id)),
            Err(e) => {
                full = Some(e);
                break;
            }
        }
    }
    say(&format!("filled {}", ids.len()));
    match full {
        Some((step, _, e)) => say(&format!("write err {step} {e:?}")),
        None => say("write never failed"),
    }
    // Still full: another attempt is refused the same way.
    match create_finished(&store, 9_999_999).await {
        Ok(id) => say(&format!("write ack {id}")),
        Err((step, _, e)) => say(&format!("write err {step} {e:?}")),
    }
    say(&format!("reads {:?}", read_back(&store, &ids).await));
    say(&format!("stats {:?}", store.stats().await));
    say(&format!("disabled {:?}", store.disabled_reason()));
    say(&format!("shutdown {:?}", store.shutdown().await));
    // The mount goes away with this process: check the file from here.
    say(&format!("integrity {:?}", integrity(&db)));
    let present = ids_in(&db);
    let lost = ids
        .iter()
        .filter(|(_, id)| !present.contains(id.as_str()))
        .count();
    say(&format!("lost {lost}"));
}

// --------------------------------------------------------------- parent --

/// A child test process speaking the line protocol; killed when dropped.
struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr: Option<JoinHandle<Vec<u8>>>,
    seen: Vec<String>,
}

impl Proc {
    fn spawn(mut cmd: Command) -> Proc {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the child");
        let stdout = child.stdout.take().unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = stderr.read_to_end(&mut buf);
            buf
        });
        Proc {
            stdin: child.stdin.take(),
            child,
            lines,
            stderr: Some(stderr),
            seen: Vec::new(),
        }
    }

    fn child_command(mode: &str, dir: &Path) -> Command {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(child_args())
            .env(CHILD_ENV, mode)
            .env(DIR_ENV, dir);
        cmd
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Kills the child and fails with everything it said.
    fn fail(&mut self, why: String) -> ! {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let err = self
            .stderr
            .take()
            .map(|h| String::from_utf8_lossy(&h.join().unwrap_or_default()).to_string())
            .unwrap_or_default();
        panic!(
            "{why}\nchild stdout:\n{}\nchild stderr:\n{err}",
            self.seen.join("\n")
        );
    }

    /// The protocol lines up to and including the first starting with
    /// `prefix` (lines from the test harness included).
    fn until(&mut self, prefix: &str) -> Vec<String> {
        let deadline = Instant::now() + STEP_TIMEOUT;
        let mut got = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    let done = line.starts_with(prefix);
                    got.push(line);
                    if done {
                        return got;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    self.fail(format!("no {prefix:?} line within {STEP_TIMEOUT:?}"))
                }
                Err(RecvTimeoutError::Disconnected) => {
                    self.fail(format!("the child ended before a {prefix:?} line"))
                }
            }
        }
    }

    fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        if writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .is_err()
        {
            self.fail(format!("the child did not take {line:?}"));
        }
    }

    /// The remaining lines and the exit status.
    fn finish(&mut self) -> (Vec<String>, ExitStatus) {
        drop(self.stdin.take());
        let deadline = Instant::now() + STEP_TIMEOUT;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() >= deadline {
                self.fail(format!("the child did not end within {STEP_TIMEOUT:?}"));
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let rest: Vec<String> = self.lines.iter().collect();
        self.seen.extend(rest.iter().cloned());
        if !status.success() {
            self.fail(format!("the child failed: {status:?}"));
        }
        (rest, status)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn child_args() -> [&'static str; 5] {
    [
        "--ignored",
        "--exact",
        CHILD_TEST,
        "--nocapture",
        "--test-threads=1",
    ]
}

fn integrity(db: &Path) -> Result<Vec<String>, rusqlite::Error> {
    let conn = Connection::open_with_flags(
        db,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    let mut stmt = conn.prepare("PRAGMA integrity_check")?;
    stmt.query_map([], |r| r.get(0))?.collect()
}

fn ids_in(db: &Path) -> HashSet<String> {
    let conn = Connection::open_with_flags(
        db,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .unwrap();
    conn.prepare("SELECT id FROM tasks")
        .unwrap()
        .query_map([], |r| r.get::<_, String>(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn assert_integrity(db: &Path) {
    assert_eq!(
        integrity(db).expect("integrity_check runs"),
        vec!["ok".to_string()],
        "integrity_check of {}",
        db.display()
    );
}

/// The value after `prefix` in the one line that has it.
fn field<'a>(lines: &'a [String], prefix: &str) -> &'a str {
    let found: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.strip_prefix(prefix))
        .collect();
    assert_eq!(found.len(), 1, "one {prefix:?} line expected in {lines:#?}");
    found[0]
}

/// Startup passes on the file the child left, and its tasks read back.
fn reopen(db: &Path, ids: &[String]) {
    runtime().block_on(async {
        let (store, report) = Store::open(StoreOptions::new(db)).expect("startup after the fault");
        for id in ids {
            let id = TaskId::parse(id).unwrap();
            let rec = store.get(&id, &owner()).await.unwrap();
            assert!(rec.is_some(), "{id} not readable after restart");
        }
        store.shutdown().await.unwrap();
        println!("reopened: {report:?}");
    });
}

fn created_ids(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix("created "))
        .map(str::to_string)
        .collect()
}

/// EIO on the fsync of one write's COMMIT: that writer hears `Uncertain`
/// (the COMMIT may or may not be on disk), never success and never the
/// plain `Disabled` the writers after it hear; the store latches disabled
/// and acknowledges nothing afterwards, reads included; every task
/// acknowledged before is intact and the store opens again.
fn fsync_eio_on_the_commit_of(target: FaultedWrite) {
    prereq::require_tool("strace");
    let root = private_dir();
    let mut proc = Proc::spawn(Proc::child_command(target.mode(), root.path()));
    let before = proc.until("ready ");
    let ids = created_ids(&before);
    assert_eq!(ids.len(), BEFORE_FAULT, "{before:#?}");
    let pending = field(&before, "pending ").to_string();
    let pid = proc.pid();
    assert_eq!(field(&before, "ready "), pid.to_string());

    let strace = Strace::attach_store_thread(
        pid,
        &root.path().join("strace.log"),
        "fsync,fdatasync",
        "fsync,fdatasync:error=EIO",
    );
    proc.send("go");
    let lines = proc.until("done");
    let injected = strace.injected_lines();
    let count = strace.detach();
    proc.send("exit");
    let (rest, _) = proc.finish();
    println!("{target:?}: {lines:#?}\n{rest:#?}\ninjected {injected:#?}");

    // Exactly one fault, on the write-ahead log: the COMMIT's sync. After
    // it the store touches the file no more.
    assert_eq!(count, 1, "injected faults: {injected:#?}");
    assert!(
        injected[0].starts_with("fsync(") && injected[0].contains("tasks.db-wal>"),
        "the fault did not land on the WAL's sync: {injected:#?}"
    );
    let first = field(&lines, "first ");
    assert!(
        first.starts_with("err Uncertain { detail: \"committing: "),
        "the {target:?} whose COMMIT met EIO: {first}"
    );
    let reason = field(&lines, "disabled ");
    assert!(
        reason.starts_with("Some(\"committing: "),
        "not disabled: {reason}"
    );
    // Nothing after the first error is acknowledged, and every later
    // command hears that the store is disabled.
    let later: Vec<&String> = lines.iter().filter(|l| l.starts_with("later ")).collect();
    assert_eq!(later.len(), 8, "{lines:#?}");
    for l in &later {
        assert!(
            [
                "later err Disabled",
                "later err finish Disabled",
                "later err cancel Disabled",
                "later err read Disabled"
            ]
            .iter()
            .any(|p| l.starts_with(p)),
            "after the fault: {l}"
        );
    }
    assert_eq!(field(&rest, "shutdown "), "Ok(())");

    let db = root.path().join("state/tasks.db");
    assert_integrity(&db);
    let present = ids_in(&db);
    for id in ids.iter().chain([&pending]) {
        assert!(
            present.contains(id),
            "{id} acknowledged before the fault is gone"
        );
    }
    // A failed create's own row may or may not have reached the file.
    let expected = ids.len() + 1;
    println!(
        "{target:?}: {} rows of {expected} acknowledged",
        present.len()
    );
    assert!(present.len() <= expected + 1, "{present:?}");
    reopen(&db, &ids);
}

#[test]
fn fsync_eio_on_a_creates_commit_is_uncertain_and_disables_the_store() {
    fsync_eio_on_the_commit_of(FaultedWrite::Create);
}

#[test]
fn fsync_eio_on_a_finishs_commit_is_uncertain_and_disables_the_store() {
    fsync_eio_on_the_commit_of(FaultedWrite::Finish);
}

#[test]
fn fsync_eio_on_a_cancels_commit_is_uncertain_and_disables_the_store() {
    fsync_eio_on_the_commit_of(FaultedWrite::Cancel);
}

#[test]
fn enospc_on_writes_is_a_capacity_error_and_reads_go_on() {
    prereq::require_tool("strace");
    let root = private_dir();
    let mut proc = Proc::spawn(Proc::child_command("enospc", root.path()));
    let before = proc.until("ready ");
    let mut ids = created_ids(&before);
    assert_eq!(ids.len(), BEFORE_FAULT, "{before:#?}");
    let pid = proc.pid();

    let strace = Strace::attach_store_thread(
        pid,
        &root.path().join("strace.log"),
        "pwrite64,pwritev,pwritev2",
        "pwrite64,pwritev,pwritev2:error=ENOSPC",
    );
    proc.send("go");
    let lines = proc.until("done");
    let injected = strace.detach();
    println!("{lines:#?}\ninjected {injected} ENOSPC");
    assert!(injected >= 1, "strace injected nothing");

    let writes: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("write "))
        .collect();
    assert_eq!(writes.len(), 3, "{lines:#?}");
    for w in &writes {
        assert_eq!(
            *w, "err create Capacity(DiskFull)",
            "a write while every pwrite64 fails with ENOSPC"
        );
    }
    assert_eq!(field(&lines, "reads "), "Ok(())");
    assert!(field(&lines, "stats ").starts_with("Ok("), "{lines:#?}");
    assert_eq!(field(&lines, "disabled "), "None");

    proc.send("resume");
    let (rest, _) = proc.finish();
    println!("{rest:#?}");
    let resumed = field(&rest, "resumed ").to_string();
    assert_eq!(field(&rest, "reads "), "Ok(())");
    assert_eq!(field(&rest, "disabled "), "None");
    assert_eq!(field(&rest, "shutdown "), "Ok(())");

    let db = root.path().join("state/tasks.db");
    assert_integrity(&db);
    ids.push(resumed);
    let present = ids_in(&db);
    assert_eq!(
        present,
        ids.iter().cloned().collect(),
        "rows after the fault"
    );
    reopen(&db, &ids);
}

#[test]
fn a_full_filesystem_is_a_capacity_error_and_reads_go_on() {
    prereq::require_root("mounts a tmpfs in a private mount namespace");
    let root = private_dir();
    let mnt = root.path().join("fs");
    std::fs::create_dir(&mnt).unwrap();
    let mut cmd = Command::new("/usr/bin/unshare");
    cmd.args(["-m", "--propagation", "private", "/bin/sh", "-c"])
        .arg(r#"mount -t tmpfs -o size=3m,mode=0700 tmpfs "$1" || exit 97; shift; exec "$0" "$@""#)
        .arg(std::env::current_exe().unwrap())
        .arg(&mnt)
        .args(child_args())
        .env(CHILD_ENV, "fullfs")
        .env(DIR_ENV, &mnt);
    let mut proc = Proc::spawn(cmd);
    let (lines, _) = proc.finish();
    println!("{lines:#?}");

    let size: u64 = field(&lines, "tmpfs ").parse().unwrap();
    assert!(size <= 4 << 20, "{size}");
    let filled: usize = field(&lines, "filled ").parse().unwrap();
    assert!(filled >= 10, "only {filled} tasks fit in 3 MiB");
    let writes: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("write "))
        .collect();
    assert_eq!(writes.len(), 2, "{lines:#?}");
    for w in &writes {
        assert!(
            w.starts_with("err ") && w.ends_with(" Capacity(DiskFull)"),
            "a write on a full filesystem: {w}"
        );
    }
    assert_eq!(field(&lines, "reads "), "Ok(())");
    assert!(field(&lines, "stats ").starts_with("Ok("), "{lines:#?}");
    assert_eq!(field(&lines, "disabled "), "None");
    let shutdown = field(&lines, "shutdown ");
    assert!(
        shutdown == "Ok(())" || shutdown == "Err(Capacity(DiskFull))",
        "shutdown on a full filesystem: {shutdown}"
    );
    assert_eq!(field(&lines, "integrity "), r#"Ok(["ok"])"#);
    assert_eq!(field(&lines, "lost "), "0");
    // The mount was private to the child.
    assert!(std::fs::read_dir(&mnt).unwrap().next().is_none());
}

#[test]
fn the_page_cap_is_a_capacity_error_and_the_sweep_makes_room() {
    // The store runs on a manual clock: the short-lived tasks expire when
    // the test moves it, however long filling the database took.
    const SHORT_TTL_MS: i64 = 2_500;
    const SHORT: usize = 40;
    let root = private_dir();
    let dir = state_dir(root.path());
    let db = dir.join("tasks.db");
    runtime().block_on(async {
        let (clock, hand) = Clock::manual(1_767_225_600_000);
        let options = StoreOptions {
            settings: StoreSettings {
                max_db_pages: 64,
                ..StoreSettings::default()
            },
            clock,
            ..StoreOptions::new(db.clone())
        };
        let (store, _) = Store::open(options).expect("open");

        // Short-lived tasks, each finished with a 1000-byte result: kept
        // for the retention hour after finishing, then they all expire.
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..SHORT {
            let store = store.clone();
            set.spawn(async move {
                let id = store
                    .create(new_task(SHORT_TTL_MS))
                    .await?
                    .record()
                    .id
                    .clone();
                let result = Outcome::Result(serde_json::json!("s".repeat(1000)));
                store
                    .finish(&id, TaskStatus::Completed, Some(result))
                    .await
                    .map(|_| id)
            });
        }
        let mut short = Vec::new();
        while let Some(r) = set.join_next().await {
            short.push(r.unwrap().expect("short-lived task"));
        }

        // Then finished 15 KiB tasks until the page cap refuses.
        let mut long = Vec::new();
        let mut refused = None;
        for tag in 0..100 {
            match create_finished(&store, tag).await {
                Ok(id) => long.push((tag, id)),
                Err(e) => {
                    refused = Some(e);
                    break;
                }
            }
        }
        let (step, half_done, err) = refused.expect("the page cap never refused a write");
        println!(
            "page cap: {} short + {} finished tasks; {step} refused: {err:?}",
            short.len(),
            long.len()
        );
        assert_eq!(
            err,
            StoreError::Capacity(CapacityKind::PageCap { pages: 64 })
        );
        assert!(!long.is_empty(), "not one finished task fit");

        // Reads keep working, the store stays enabled, and it still refuses.
        assert_eq!(store.disabled_reason(), None);
        read_back(&store, &long).await.unwrap();
        for id in &short {
            assert!(store.get(id, &owner()).await.unwrap().is_some());
        }
        let stats = store.stats().await.unwrap();
        assert_eq!(
            stats.retained as usize,
            short.len() + long.len() + usize::from(half_done.is_some())
        );
        let again = create_finished(&store, 1000).await.map(|_| ());
        assert!(
            matches!(
                &again,
                Err((_, _, StoreError::Capacity(CapacityKind::PageCap { .. })))
            ),
            "{again:?}"
        );
        let half_done =
            usize::from(half_done.is_some()) + usize::from(matches!(again, Err(("finish", _, _))));

        // Once the short-lived tasks expired, the sweep deletes them at the
        // page cap and new tasks fit again. (The once-a-second timer runs the
        // same sweep; whichever comes first deletes them.)
        hand.advance(Duration::from_millis(
            (TERMINAL_RETENTION_MS + SHORT_TTL_MS) as u64,
        ));
        println!("before sweep_now: {:?}", store.stats().await);
        let mut swept = 0;
        loop {
            let n = store.sweep_now().await.expect("sweep at the page cap");
            swept += n;
            if n == 0 {
                break;
            }
        }
        let stats = store.stats().await.unwrap();
        println!("sweep_now deleted {swept}; {stats:?}");
        assert_eq!(stats.retained as usize, long.len() + half_done);
        let conn = Connection::open_with_flags(&db, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        let rows: i64 = conn
            .query_row("SELECT count(*) FROM tasks", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows as usize, long.len() + half_done, "expired rows left");
        drop(conn);

        let id = create_finished(&store, 2000)
            .await
            .expect("a create after the sweep at the page cap");
        long.push((2000, id));
        read_back(&store, &long).await.unwrap();
        assert_eq!(store.disabled_reason(), None);
        store.shutdown().await.unwrap();
    });
    assert_integrity(&db);
}
