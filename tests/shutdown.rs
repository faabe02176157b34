//! Stopping, through the real binary, real sockets and real signals:
//! a SIGTERM at any moment after READY=1 is a clean stop (STOPPING=1, the
//! final checkpoint, exit 0); once stopping has begun no new call is
//! admitted and the client is told so, while the task already running is
//! waited for and its end recorded; under load every in-flight call gets
//! its real answer, so no task is committed whose handle never reached its
//! client; and an answer still being sent when the listener closes is sent
//! whole.
//!
//! `TASKGATE_SHUTDOWN_ROUNDS` sets the SIGTERM-upon-READY rounds (default
//! 30); `TASKGATE_SHUTDOWN_LOAD_ROUNDS` the stops under load (default 3).
//!
//! Invariant 9 of the map: A stop is clean whenever it comes: no call is
//! admitted once stopping began, and every admitted call gets its real answer.
//! Guarded by: `tests/shutdown.rs` (SIGTERM the moment READY arrives, 30
//! rounds; a call after stopping began runs nothing, and the task running when
//! it began is recorded failed before the exit; a stop under load loses no
//! handle; an answer still being sent when the listener closes is sent whole),
//! `tests/http_router.rs::a_call_while_stopping_is_refused_with_the_stopping_error`
//! (bounded: an admitted call fails it, never hangs it)
//!
//! What this file proves: defects that stopping had: SIGTERM at READY, calls
//! admitted while stopping, in-flight calls cut off under load; a stop that
//! does not wait for running tasks, an answer cut off when the listener closes

mod common;

use std::collections::{BTreeSet, HashSet};
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use taskgate::client::{Client, ClientError};
use taskgate::wire;

const ROUNDS_ENV: &str = "TASKGATE_SHUTDOWN_ROUNDS";
const DEFAULT_ROUNDS: u32 = 30;
const LOAD_ROUNDS_ENV: &str = "TASKGATE_SHUTDOWN_LOAD_ROUNDS";
const DEFAULT_LOAD_ROUNDS: u32 = 3;
/// Longest a stop may take here (the tools' grace included).
const STOP_LIMIT: Duration = Duration::from_secs(30);

/// Rounds from `var`, else `default`. Zero is refused: a run with no
/// rounds would pass having tested nothing.
fn rounds(var: &str, default: u32) -> u32 {
    let n = match std::env::var(var) {
        Ok(s) => s
            .parse()
            .unwrap_or_else(|_| panic!("{var} must be a number")),
        Err(_) => default,
    };
    assert!(
        n >= 1,
        "{var}={n}: at least one round, or this test tests nothing"
    );
    n
}

fn stopping_notified(notes: &[String]) -> bool {
    notes.iter().any(|m| m.lines().any(|l| l == "STOPPING=1"))
}

/// What a state directory holds after a clean stop: the database and the
/// lock, and at most an empty artifacts directory; no WAL or shared-memory
/// sidecar (the final TRUNCATE checkpoint removed them).
fn unclean_leftovers(state: &Path) -> Vec<String> {
    let mut odd = Vec::new();
    let mut names = BTreeSet::new();
    for e in std::fs::read_dir(state).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().to_string();
        if name == "artifacts" {
            let inside = std::fs::read_dir(e.path()).unwrap().count();
            if inside != 0 {
                odd.push(format!("artifacts/ holds {inside} entries"));
            }
        } else if name != "tasks.db" && name != "tasks.lock" {
            odd.push(name.clone());
        }
        names.insert(name);
    }
    for want in ["tasks.db", "tasks.lock"] {
        if !names.contains(want) {
            odd.push(format!("no {want}"));
        }
    }
    odd
}

/// Defect 1: the signal handlers must be in place before READY=1 is sent,
/// or a service manager that stops the daemon right after startup kills it
/// by the default action, without STOPPING=1 and without the final
/// checkpoint.
#[test]
fn sigterm_the_moment_ready_arrives_is_a_clean_stop() {
    let rounds = rounds(ROUNDS_ENV, DEFAULT_ROUNDS);
    let mut failed = Vec::new();
    for round in 1..=rounds {
        let root = private_dir();
        let state = state_dir(root.path());
        let mut daemon = Daemon::builder().state_dir(&state).start();
        daemon.signal(Signal::SIGTERM);
        let status = daemon.wait_exit(STOP_LIMIT);
        let stopping = stopping_notified(daemon.notifications());
        let leftovers = unclean_leftovers(&state);
        if status.code() != Some(0) || !stopping || !leftovers.is_empty() {
            failed.push(format!(
                "round {round}: {status}, STOPPING=1 {}, left behind {leftovers:?}",
                if stopping { "sent" } else { "never sent" }
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {rounds} SIGTERMs sent upon READY=1 were not a clean stop:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

/// A tool that ignores SIGTERM (so a stop waits out the cancel grace) and
/// says when it runs, and a tool that leaves a mark when it runs.
fn stopping_config(dir: &Path, started: &Path, mark: &Path) -> std::path::PathBuf {
    write_config(
        dir,
        "[tasks]\npoll_interval_ms = 50\ncancel_grace_ms = 3000\n",
        &[
            Tool::new("stubborn")
                .script(&format!(
                    "trap '' TERM; echo started > {}; exec sleep 60",
                    started.display()
                ))
                .unconfined("its files sit beside the state directory")
                .task("optional")
                .timeout_secs(120),
            Tool::new("mark")
                .script(&format!("echo ran >> {}; printf marked", mark.display()))
                .unconfined("its files sit beside the state directory")
                .task("optional")
                .timeout_secs(60),
        ],
    )
}

/// Defect 2: once stopping has begun (STOPPING=1), a call that arrives is
/// refused with the registered "stopping" error and its tool never starts,
/// even while a stubborn task keeps the stop waiting.
#[test]
fn a_call_after_stopping_began_is_refused_and_runs_nothing() {
    let root = private_dir();
    let state = state_dir(root.path());
    let started = Fifo::new(&root.path().join("started"));
    let mark = root.path().join("mark");
    let config = stopping_config(root.path(), &started.path, &mark);
    let mut daemon = Daemon::builder()
        .config(&config)
        .state_dir(&state)
        .log(&root.path().join("log"))
        .start();
    let rt = runtime();
    let late = Client::new(&daemon.url(), false).unwrap();
    let stubborn = rt.block_on(async {
        let created = daemon
            .client(true)
            .call_tool("stubborn", json!({}), None)
            .await
            .unwrap();
        assert_eq!(created["resultType"], "task", "{created}");
        // The connection the late call will use is open before the signal.
        late.request("tools/list", json!({}), None, None)
            .await
            .unwrap();
        created["taskId"].as_str().unwrap().to_string()
    });
    started.read(Duration::from_secs(20));

    daemon.signal(Signal::SIGTERM);
    daemon.wait_for("STOPPING=1", Duration::from_secs(10));
    let answer = rt.block_on(async {
        tokio::time::timeout(STOP_LIMIT, late.call_tool("mark", json!({}), None)).await
    });
    let status = daemon.wait_exit(STOP_LIMIT);
    let ran = mark.exists();
    let refused_as_stopping = matches!(
        &answer,
        Ok(Err(ClientError::Rpc { code, error, .. }))
            if *code == wire::STOPPING.code
                && error.pointer("/data/name").and_then(Value::as_str) == Some(wire::STOPPING.name)
    );
    assert!(
        refused_as_stopping && !ran,
        "a call after STOPPING=1: answered {answer:?}; its tool ran: {ran}; daemon {status}; log:\n{}",
        daemon.log_text()
    );
    assert_eq!(status.code(), Some(0), "log:\n{}", daemon.log_text());
    // The stop waited for the running task (its grace, then the kill) and
    // recorded its end: nothing is left working for a restart to find.
    assert_eq!(
        row_status(&state, &stubborn),
        "failed",
        "the task running when the stop began; log:\n{}",
        daemon.log_text()
    );
}

/// A task's status in the database, read without changing the files.
fn row_status(state: &Path, id: &str) -> String {
    let conn = rusqlite::Connection::open_with_flags(
        state.join("tasks.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    conn.query_row("SELECT status FROM tasks WHERE id = ?1", [id], |r| r.get(0))
        .unwrap()
}

/// What one client saw during a stop under load.
#[derive(Default)]
struct Seen {
    /// Task handles received.
    handles: Vec<String>,
    /// Answers that are neither a JSON-RPC result nor a JSON-RPC error.
    broken: Vec<String>,
    /// JSON-RPC errors (e.g. "stopping").
    errors: usize,
    /// Connections closed before an answer arrived.
    closed: usize,
}

/// Most calls one client makes in a round.
const MAX_CALLS: usize = 2000;
/// Handles received before the SIGTERM.
const BEFORE_SIGNAL: usize = 40;

/// Creates tasks until the daemon no longer accepts connections.
fn load_client(url: String, acks: mpsc::Sender<()>) -> Seen {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = Client::new(&url, true).unwrap();
    let mut seen = Seen::default();
    let deadline = Instant::now() + STOP_LIMIT;
    for _ in 0..MAX_CALLS {
        if Instant::now() > deadline {
            break;
        }
        let answer = rt.block_on(async {
            tokio::time::timeout(
                Duration::from_secs(20),
                client.call_tool("quick", json!({}), None),
            )
            .await
        });
        match answer {
            Ok(Ok(result)) => {
                if let Some(id) = result.get("taskId").and_then(Value::as_str) {
                    seen.handles.push(id.to_string());
                    let _ = acks.send(());
                }
            }
            Ok(Err(ClientError::Rpc { .. })) => seen.errors += 1,
            // The listener is closed: the daemon is (nearly) gone.
            Ok(Err(ClientError::Connect { .. })) => break,
            Ok(Err(ClientError::Http { .. })) => seen.closed += 1,
            Ok(Err(e)) => seen.broken.push(e.to_string()),
            Err(_) => seen.broken.push("no answer within 20 s".into()),
        }
    }
    seen
}

/// Every task ID in the database, read without changing the files.
fn committed_ids(state: &Path) -> HashSet<String> {
    let conn = rusqlite::Connection::open_with_flags(
        state.join("tasks.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    conn.prepare("SELECT id FROM tasks")
        .unwrap()
        .query_map([], |r| r.get::<_, String>(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Defect 8: SIGTERM while four clients create tasks. Every call gets a
/// JSON-RPC answer (or finds the connection gone before it was taken), and
/// every task the database holds was handed to some client.
#[test]
fn a_stop_under_load_answers_every_call_and_loses_no_handle() {
    let rounds = rounds(LOAD_ROUNDS_ENV, DEFAULT_LOAD_ROUNDS);
    let mut failed = Vec::new();
    for round in 1..=rounds {
        let root = private_dir();
        let state = state_dir(root.path());
        let config = write_config(
            root.path(),
            "",
            &[Tool::new("quick")
                .script("printf ok")
                .task("optional")
                .timeout_secs(60)],
        );
        let mut daemon = Daemon::builder()
            .config(&config)
            .state_dir(&state)
            .log(&root.path().join("log"))
            .start();
        let (tx, acks) = mpsc::channel();
        let clients: Vec<_> = (0..4)
            .map(|_| {
                let (url, tx) = (daemon.url(), tx.clone());
                std::thread::spawn(move || load_client(url, tx))
            })
            .collect();
        drop(tx);
        for n in 0..BEFORE_SIGNAL {
            if let Err(e) = acks.recv_timeout(Duration::from_secs(20)) {
                panic!(
                    "round {round}: only {n} handles before the signal ({e}); log:\n{}",
                    daemon.log_text()
                );
            }
        }
        daemon.signal(Signal::SIGTERM);
        let status = daemon.wait_exit(STOP_LIMIT);
        let seen: Vec<Seen> = clients.into_iter().map(|c| c.join().unwrap()).collect();

        let handed: HashSet<String> = seen.iter().flat_map(|s| s.handles.clone()).collect();
        let committed = committed_ids(&state);
        let lost: Vec<&String> = committed.difference(&handed).collect();
        let broken: Vec<&String> = seen.iter().flat_map(|s| &s.broken).collect();
        let errors: usize = seen.iter().map(|s| s.errors).sum();
        let closed: usize = seen.iter().map(|s| s.closed).sum();
        println!(
            "round {round}: {status}, handles {}, committed {}, JSON-RPC errors {errors}, closed {closed}, broken {}, lost {}",
            handed.len(),
            committed.len(),
            broken.len(),
            lost.len()
        );
        if status.code() != Some(0) || !broken.is_empty() || !lost.is_empty() {
            failed.push(format!(
                "round {round}: {status}; {} answers neither result nor JSON-RPC error, e.g. {:?}; {} of {} committed tasks never reached a client, e.g. {:?}",
                broken.len(),
                broken.iter().take(2).collect::<Vec<_>>(),
                lost.len(),
                committed.len(),
                lost.iter().take(2).collect::<Vec<_>>()
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {rounds} stops under load broke calls:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

/// Bytes the `big` tool writes: more than the daemon's socket send buffer
/// can hold (its largest is `net.ipv4.tcp_wmem`'s maximum, 4 MiB by
/// default), so that part of the answer is still in the daemon's hands
/// while the client has not read it.
const BIG: usize = 8 << 20;

/// An answer the daemon is still sending when it stops taking connections
/// (a large result to a client that reads slowly) is sent whole before the
/// connection closes: the call was admitted before the stop, so it gets
/// its real answer, not a cut-off one.
#[test]
fn an_answer_still_being_sent_when_the_listener_closes_is_sent_whole() {
    let root = private_dir();
    let state = state_dir(root.path());
    let config = write_config(
        root.path(),
        "[tasks]\npoll_interval_ms = 50\n",
        &[Tool::new("big")
            .script(&format!("head -c {BIG} /dev/zero | tr '\\0' 'a'"))
            .task("optional")
            .extra(&format!("max_stdout_bytes = {BIG}"))],
    );
    let mut daemon = Daemon::builder()
        .config(&config)
        .state_dir(&state)
        .log(&root.path().join("log"))
        .start();
    let port = daemon.port;
    let rt = runtime();
    let id = rt.block_on(async {
        let c = daemon.client(true);
        let created = c.call_tool("big", json!({}), None).await.unwrap();
        let id = created["taskId"].as_str().unwrap().to_string();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match c.get_task(&id).await {
                Ok(t) if t["status"] == "completed" => break,
                Ok(t) if t["status"] == "working" => {}
                Ok(t) => panic!("the big task ended {t}"),
                Err(ClientError::Rpc { code, .. }) if code == wire::POLL_TOO_SOON.code => {}
                Err(e) => panic!("tasks/get {id}: {e}"),
            }
            assert!(Instant::now() < deadline, "the big task did not end");
            tokio::time::sleep(Duration::from_millis(60)).await;
        }
        id
    });

    // A client with a small receive buffer asks for the whole result and
    // reads nothing until the daemon has closed its listener.
    let mut stream = rt.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        socket
            .connect(([127, 0, 0, 1], port).into())
            .await
            .unwrap()
            .into_std()
            .unwrap()
    });
    stream.set_nonblocking(false).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "artifact_read", "arguments": {"taskId": id},
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}}}})
    .to_string();
    std::io::Write::write_all(
        &mut stream,
        format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: artifact_read\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .unwrap();
    // The answer has begun to arrive: the call was admitted and answered.
    let mut first = [0u8; 1];
    assert_eq!(stream.peek(&mut first).unwrap(), 1, "no answer began");

    daemon.signal(Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
        assert!(
            Instant::now() < deadline,
            "the listener did not close after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Time enough for a daemon that drops its connections to drop this one.
    std::thread::sleep(Duration::from_millis(300));

    let mut raw = Vec::new();
    let read = std::io::Read::read_to_end(&mut stream, &mut raw);
    let status = daemon.wait_exit(STOP_LIMIT);
    let (head, answer) = match http::parse(&raw) {
        http::Outcome::Answer(r) => (r.head.clone(), r.messages().into_iter().next()),
        _ => ("no whole answer".to_string(), None),
    };
    let answer: Value = answer.unwrap_or_else(|| {
        panic!(
            "the answer was cut off ({read:?}, {} bytes read); head: {head}",
            raw.len()
        )
    });
    let whole = answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no result text; head: {head}"));
    assert_eq!(whole.len(), BIG, "head: {head}");
    assert!(whole.bytes().all(|b| b == b'a'));
    assert_eq!(status.code(), Some(0), "log:\n{}", daemon.log_text());
}
