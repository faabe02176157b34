//! What makes tasks durable, through the real daemon over HTTP: a crash
//! never re-runs a command, large results survive restarts, a repeated
//! creation returns the same task, and raw arguments never reach the disk.
//!
//! Invariant 3 of the map: After a restart nothing is replayed: a nonterminal
//! task becomes failed with an interruption error (cancelled if its cancel was
//! committed), and what is served matches what was committed. Guarded by:
//! `tests/mcp_durability.rs::a_crash_fails_the_running_task_keeps_the_finished_one_and_never_reruns`,
//! `tests/store_behaviour.rs::restart_fails_running_tasks_and_keeps_finished_ones`,
//! `tests/store_behaviour.rs::a_committed_cancel_ends_cancelled_after_a_restart`,
//! `tests/crash_recovery.rs` (both artifact crash points),
//! `tests/migration.rs::v1_fixture_migrates_with_rows_intact`
//!
//! Invariant 4 of the map: Raw tool arguments, tokens and credentials are never
//! stored; references and owners are sha256 digests. Guarded by:
//! `tests/mcp_durability.rs::raw_arguments_and_operation_ids_never_reach_the_disk`,
//! `tests/mcp_durability.rs::raw_arguments_and_operation_ids_never_reach_the_log_at_debug`
//! and
//! `tests/mcp_durability.rs::raw_arguments_and_operation_ids_never_reach_the_log_at_trace`
//! (every file of the state directory — database, WAL, `-shm`, `tasks.lock`,
//! artifacts — and the log scanned for marker strings carried by tasks, failing
//! tasks, synchronous calls, and calls refused for their schema, for an
//! operation ID reused with other arguments and for their size; the log must
//! hold events of the level asked for: the store thread's `store batch` event
//! is the trace level's); static secrets and JWTs, whole and in parts, after
//! calls, polls, cancels, refusals and a reload, and the arguments of a call
//! refused for its scope, in every file of the state directory and the debug
//! and trace logs:
//! `tests/auth_http.rs::no_secret_or_jwt_reaches_the_disk_or_the_debug_log`,
//! `tests/auth_http.rs::no_secret_or_jwt_reaches_the_log_at_trace`; by type,
//! the store API takes only `Digest` for owners, references and requests; logs
//! carry an 8-digit owner tag at most; for durable routes,
//! `tests/durable_routes.rs::a_submission_is_routed_once_and_found_again_by_its_key_and_its_id`
//! (the routes' bindings and reasons in the database, and `routes show`, hold
//! no argument value)
//!
//! What this file proves: kill -9 mid-task and nothing re-run after it (the
//! restarted daemon's own count of runs started, `status --json`, is 0 once
//! READY=1 came; the tool's marker read after a clean stop that waited for
//! every run), spilled results across a restart, operation references, no raw
//! argument on disk

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};
use taskgate::client::{Client, ClientError};
use taskgate::wire;

/// The `[tasks]` section every test here runs with.
const TASKS: &str = "[tasks]\npoll_interval_ms = 50\ncancel_grace_ms = 500\n";

/// A shell tool of the task mode `task`, given one string argument as `$0`,
/// with room for large results.
fn tool(name: &str, script: &str, task: &str) -> Tool {
    Tool::new(name)
        .script(script)
        .args(&["{arg}"])
        .unconfined("its files sit beside the state directory")
        .task(task)
        .timeout_secs(120)
        .extra("max_stdout_bytes = 1048576")
        .param("arg", "string")
}

async fn poll_until_terminal(client: &Client, id: &str, limit: Duration) -> Value {
    let deadline = Instant::now() + limit;
    loop {
        match client.get_task(id).await {
            Ok(t) => {
                if matches!(
                    t["status"].as_str(),
                    Some("completed" | "failed" | "cancelled")
                ) {
                    return t;
                }
            }
            Err(ClientError::Rpc { code, .. }) if code == wire::POLL_TOO_SOON.code => {}
            Err(e) => panic!("tasks/get {id}: {e}"),
        }
        assert!(Instant::now() < deadline, "task {id} did not end");
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
}

fn task_id(created: &Value) -> String {
    assert_eq!(created["resultType"], "task", "{created}");
    created["taskId"].as_str().unwrap().to_string()
}

/// Running, as opposed to gone or a zombie awaiting its reaper.
fn process_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
        Err(_) => false,
    }
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

#[test]
fn a_crash_fails_the_running_task_keeps_the_finished_one_and_never_reruns() {
    let root = private_dir();
    let state = state_dir(root.path());
    let marker = root.path().join("started");
    let running = Fifo::new(&root.path().join("running"));
    let grandchild = root.path().join("grandchild.pid");
    let config = write_config(
        root.path(),
        TASKS,
        &[
            tool("quick", "printf 'quick result'", "optional"),
            tool(
                "slow",
                &format!(
                    "sleep 60 & echo $! > {}; echo started >> {}; echo > {}; wait",
                    grandchild.display(),
                    marker.display(),
                    running.path.display()
                ),
                "optional",
            ),
        ],
    );
    let rt = runtime();
    let daemon = Daemon::start(&config, &state, &root.path().join("log1"));
    let (done_id, running_id) = rt.block_on(async {
        let c = daemon.client(true);
        let done = task_id(&c.call_tool("quick", json!({}), None).await.unwrap());
        let t = poll_until_terminal(&c, &done, Duration::from_secs(20)).await;
        assert_eq!(t["status"], "completed");
        let slow = task_id(&c.call_tool("slow", json!({}), None).await.unwrap());
        running.read(Duration::from_secs(20));
        (done, slow)
    });
    daemon.kill();
    // Nothing the tool started outlives the daemon, even a SIGKILLed one.
    let pid: i32 = std::fs::read_to_string(&grandchild)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while process_alive(pid) {
        assert!(
            Instant::now() < deadline,
            "the tool's child {pid} outlived the daemon"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let daemon = Daemon::start(&config, &state, &root.path().join("log2"));
    rt.block_on(async {
        let c = daemon.client(true);
        let done = c.get_task(&done_id).await.unwrap();
        assert_eq!(done["status"], "completed");
        assert_eq!(done["result"]["content"][0]["text"], "quick result");
        let interrupted = c.get_task(&running_id).await.unwrap();
        assert_eq!(interrupted["status"], "failed", "{interrupted}");
        assert_eq!(interrupted["error"]["code"], wire::TASK_INTERRUPTED.code);
        assert!(interrupted.get("result").is_none());
    });
    // Recovery ends before READY=1, and every run this process starts,
    // however it is started, goes through the task service's count: the
    // daemon's own zero, read after READY and after the interrupted task
    // was read back, says nothing was started, not that nothing was seen
    // within some wait.
    let status = admin_status(&state);
    assert_eq!(
        status["runs_started"], 0,
        "a run started after the restart: {status}"
    );
    assert_eq!(status["running"], 0, "{status}");
    assert!(daemon.stop().success());
    // A clean stop returns only once every run has recorded its outcome, so
    // a run started behind the count's back would have had its chance to
    // write the marker by now.
    assert_eq!(lines(&marker), 1, "the interrupted command ran again");
}

#[test]
fn a_large_result_is_spilled_and_read_back_after_a_restart() {
    let root = private_dir();
    let state = state_dir(root.path());
    let config = write_config(
        root.path(),
        TASKS,
        &[tool(
            "big",
            "head -c 102400 /dev/zero | tr '\\0' 'a'",
            "optional",
        )],
    );
    let rt = runtime();
    let daemon = Daemon::start(&config, &state, &root.path().join("log1"));
    let id = rt.block_on(async {
        let c = daemon.client(true);
        let id = task_id(&c.call_tool("big", json!({}), None).await.unwrap());
        let t = poll_until_terminal(&c, &id, Duration::from_secs(20)).await;
        assert_eq!(t["status"], "completed", "{t}");
        let pointer = &t["result"]["structuredContent"]["artifact"];
        assert_eq!(pointer["taskId"], id.as_str());
        // What the tool wrote, not the stored JSON around it.
        assert_eq!(pointer["bytes"], 102_400, "{pointer}");
        assert!(
            pointer["storedBytes"].as_u64().unwrap() > 102_400,
            "{pointer}"
        );
        let note = t["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_default();
        assert!(note.contains("(102400 bytes)"), "{note}");
        let whole = c
            .call_tool("artifact_read", json!({"taskId": id}), None)
            .await
            .unwrap();
        let text = whole["content"][0]["text"].as_str().unwrap();
        assert_eq!(text.len(), 102_400);
        assert!(text.bytes().all(|b| b == b'a'));
        id
    });
    let artifact = state.join("artifacts").join(format!("{id}.json"));
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&artifact).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
    assert!(daemon.stop().success());

    let daemon = Daemon::start(&config, &state, &root.path().join("log2"));
    rt.block_on(async {
        let c = daemon.client(false);
        let whole = c
            .call_tool("artifact_read", json!({"taskId": id}), None)
            .await
            .unwrap();
        assert_eq!(whole["content"][0]["text"].as_str().unwrap().len(), 102_400);
        // An unknown task has no artifact, and says so the same way.
        let unknown = taskgate::store::TaskId::generate().unwrap();
        let err = c
            .call_tool("artifact_read", json!({"taskId": unknown.as_str()}), None)
            .await
            .unwrap_err();
        assert!(
            matches!(err, ClientError::Rpc { code, .. } if code == wire::ARTIFACT_UNAVAILABLE.code),
            "{err}"
        );
    });
    assert!(daemon.stop().success());
}

#[test]
fn a_repeated_creation_returns_the_same_task_and_runs_once() {
    let root = private_dir();
    let state = state_dir(root.path());
    let marker = root.path().join("runs");
    let config = write_config(
        root.path(),
        TASKS,
        &[tool(
            "once",
            &format!("echo ran >> {}; sleep 1; printf 'did $0'", marker.display()),
            "optional",
        )],
    );
    let rt = runtime();
    let daemon = Daemon::start(&config, &state, &root.path().join("log"));
    rt.block_on(async {
        let c = daemon.client(true);
        let first = task_id(
            &c.call_tool("once", json!({"arg": "x"}), Some("op-42"))
                .await
                .unwrap(),
        );
        // The client lost the reply and retries: same operation, same task.
        let retry = task_id(
            &c.call_tool("once", json!({"arg": "x"}), Some("op-42"))
                .await
                .unwrap(),
        );
        assert_eq!(first, retry);
        // Same reference, different arguments: refused, nothing runs.
        let err = c
            .call_tool("once", json!({"arg": "y"}), Some("op-42"))
            .await
            .unwrap_err();
        assert!(
            matches!(err, ClientError::Rpc { code, .. } if code == wire::IDEMPOTENCY_CONFLICT.code),
            "{err}"
        );
        let t = poll_until_terminal(&c, &first, Duration::from_secs(20)).await;
        assert_eq!(t["status"], "completed");
        // After completion the retry still answers with the same task.
        let late = task_id(
            &c.call_tool("once", json!({"arg": "x"}), Some("op-42"))
                .await
                .unwrap(),
        );
        assert_eq!(late, first);
        // A new operation is a new task.
        let other = task_id(
            &c.call_tool("once", json!({"arg": "x"}), Some("op-43"))
                .await
                .unwrap(),
        );
        assert_ne!(other, first);
        poll_until_terminal(&c, &other, Duration::from_secs(20)).await;
    });
    assert_eq!(lines(&marker), 2, "op-42 ran once, op-43 once");
    assert!(daemon.stop().success());
}

/// Every byte of every file in the state directory (database, WAL, its
/// shared-memory index, the lock file, artifacts), and their names.
fn state_bytes(state: &Path) -> Vec<u8> {
    fn walk(dir: &Path, all: &mut Vec<u8>, seen: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = e.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            all.extend(e.file_name().as_encoded_bytes());
            if meta.is_dir() {
                walk(&path, all, seen);
            } else if meta.is_file() {
                seen.push(e.file_name().to_string_lossy().into_owned());
                all.extend(std::fs::read(&path).unwrap_or_default());
            }
        }
    }
    let (mut all, mut seen) = (Vec::new(), Vec::new());
    walk(state, &mut all, &mut seen);
    assert!(
        seen.iter().any(|n| n == "tasks.db") && seen.iter().any(|n| n == "tasks.lock"),
        "the scan sees the database and the lock file: {seen:?}"
    );
    all
}

/// `server.max_request_bytes` in the marker scan: small, so a request
/// past it is cheap to send.
const MAX_REQUEST: usize = 8192;

/// Calls that carry the markers and are refused, each with the answer it
/// must get (so the scan covers the refusal paths, not a transport error).
async fn refused_calls_carrying(c: &Client, arg_marker: &str, op_marker: &str) {
    // Arguments the tool's schema refuses: a schema error must not quote
    // the value it refused.
    let err = c
        .call_tool(
            "quiet",
            json!({"arg": [format!("{arg_marker}-schema")]}),
            Some(&format!("{op_marker}-schema")),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::Rpc { code, .. } if *code == wire::INVALID_PARAMS.code),
        "schema-invalid call: {err}"
    );
    // The operation ID of the first call again, with other arguments.
    let err = c
        .call_tool(
            "quiet",
            json!({"arg": format!("{arg_marker}-conflict")}),
            Some(&format!("{op_marker}-0")),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::Rpc { code, .. } if *code == wire::IDEMPOTENCY_CONFLICT.code),
        "reused operation ID: {err}"
    );
    // A request past `server.max_request_bytes`, markers at both ends.
    let padding = "p".repeat(MAX_REQUEST);
    let err = c
        .call_tool(
            "quiet",
            json!({"arg": format!("{arg_marker}-oversize {padding} {arg_marker}-oversize")}),
            Some(&format!("{op_marker}-oversize")),
        )
        .await
        .unwrap_err();
    let too_large = match &err {
        ClientError::Status { status, .. } => *status == 413,
        ClientError::Rpc { code, error, .. } => {
            *code == wire::REQUEST_TOO_LARGE.code
                && error.to_string().contains("TG_REQUEST_TOO_LARGE")
        }
        _ => false,
    };
    assert!(too_large, "oversize request: {err}");
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[test]
fn raw_arguments_and_operation_ids_never_reach_the_disk() {
    marker_scan(None);
}

/// rmcp logs every request it receives (tool arguments, `_meta`) and every
/// result at debug and trace: the log stays clean at every level.
#[test]
fn raw_arguments_and_operation_ids_never_reach_the_log_at_debug() {
    marker_scan(Some("debug"));
}

#[test]
fn raw_arguments_and_operation_ids_never_reach_the_log_at_trace() {
    marker_scan(Some("trace"));
}

/// Calls tools with markers in the arguments and the operation reference
/// (as tasks, failing and not, and synchronously), and has calls carrying
/// them refused (arguments the schema refuses, an operation ID reused with
/// other arguments, a request past the size bound), then scans the log
/// and every file of the state directory for them.
fn marker_scan(level: Option<&str>) {
    let root = private_dir();
    let state = state_dir(root.path());
    let config = write_config(
        root.path(),
        &format!("[server]\nmax_request_bytes = {MAX_REQUEST}\n{TASKS}"),
        &[
            tool("quiet", "printf 'no echo'", "optional"),
            tool("failing", "exit 3", "optional"),
        ],
    );
    let arg_marker = "RAW-ARGUMENT-MARKER-7f3a";
    let op_marker = "RAW-OPERATION-MARKER-9c1e";
    let rt = runtime();
    let log_path = root.path().join("log");
    let mut builder = Daemon::builder()
        .config(&config)
        .state_dir(&state)
        .log(&log_path);
    if let Some(level) = level {
        builder = builder.env("TASKGATE_LOG", level);
    }
    let daemon = builder.start();
    rt.block_on(async {
        let c = daemon.client(true);
        for (i, name) in ["quiet", "failing"].iter().enumerate() {
            let id = task_id(
                &c.call_tool(
                    name,
                    json!({"arg": format!("{arg_marker}-{i}")}),
                    Some(&format!("{op_marker}-{i}")),
                )
                .await
                .unwrap(),
            );
            poll_until_terminal(&c, &id, Duration::from_secs(20)).await;
        }
        // Synchronous calls too.
        Client::new(&daemon.url(), false)
            .unwrap()
            .call_tool("quiet", json!({"arg": arg_marker}), None)
            .await
            .unwrap();
        refused_calls_carrying(&c, arg_marker, op_marker).await;
        // While serving: the WAL holds the recent writes.
        let live = state_bytes(&state);
        assert!(contains(&live, "no echo"), "the scan sees stored results");
        assert!(
            !contains(&live, arg_marker),
            "a raw argument reached the disk"
        );
        assert!(
            !contains(&live, op_marker),
            "a raw operation ID reached the disk"
        );
    });
    assert!(daemon.stop().success());
    let log = std::fs::read_to_string(&log_path).unwrap();
    if let Some(level) = level {
        // The scan means something only if the level took effect.
        let shown = level.to_uppercase();
        assert!(
            log.lines().any(|l| l.contains(&format!(" {shown} "))),
            "no {level} events in the log:\n{log}"
        );
    }
    let after = state_bytes(&state);
    assert!(!contains(&after, arg_marker) && !contains(&after, op_marker));
    let leaked: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(arg_marker) || l.contains(op_marker))
        .take(3)
        .collect();
    assert!(
        leaked.is_empty(),
        "raw values in the log at {level:?}: {leaked:#?}"
    );
}

/// Invariant 2 at the daemon: every task handle a client received names a
/// committed row. Eight clients create tasks as fast as they can on a slow
/// disk (strace holds each of SQLite's writes 10 ms before it starts); the
/// daemon is SIGKILLed while they do; after a restart every handle any of
/// them received answers `tasks/get` with its task (interrupted or done),
/// never as unknown. A SIGKILL loses only what never reached the kernel: a
/// COMMIT whose WAL frames were written survives it, fsynced or not. So a
/// daemon that replied (or started the run) before its COMMIT is caught
/// only while the frames wait to be written; on a fast disk that window is
/// shorter than a reply takes to reach its client, here it is not.
#[test]
fn every_handle_a_client_received_names_a_committed_row_across_a_sigkill() {
    let root = private_dir();
    let state = state_dir(root.path());
    let cfg = write_config(
        root.path(),
        &format!("{TASKS}\n[store]\nmax_live_tasks = 100000\n"),
        &[tool("quick", "printf done", "required")],
    );
    prereq::require_tool("strace");
    let daemon = Daemon::start(&cfg, &state, &root.path().join("log"));
    let strace_log = root.path().join("strace.log");
    let strace = common::strace::Strace::attach_store_thread(
        daemon.child.id() as i32,
        &strace_log,
        "pwrite64,pwritev,pwritev2",
        "pwrite64,pwritev,pwritev2:delay_enter=10000",
    );
    let rt = runtime();
    let (handles, refused) = rt.block_on(async {
        let handles = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let enough = std::sync::Arc::new(tokio::sync::Notify::new());
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut clients = tokio::task::JoinSet::new();
        for _ in 0..8 {
            let (c, handles, enough, stop) = (
                daemon.client(true),
                handles.clone(),
                enough.clone(),
                stop.clone(),
            );
            clients.spawn(async move {
                let mut failed = 0u64;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    match c.call_tool("quick", json!({"arg": "x"}), None).await {
                        Ok(created) => {
                            let mut handles = handles.lock().unwrap();
                            handles.push(task_id(&created));
                            if handles.len() >= 300 {
                                enough.notify_one();
                            }
                        }
                        // Busy answers under load, and connections cut by the kill.
                        Err(_) => failed += 1,
                    }
                }
                failed
            });
        }
        // The kill lands while creates are in flight: after 300 handles,
        // with the clients still sending.
        enough.notified().await;
        daemon.kill();
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let mut refused = 0;
        while let Some(failed) = clients.join_next().await {
            refused += failed.unwrap();
        }
        let handles = handles.lock().unwrap().clone();
        (handles, refused)
    });
    drop(strace);
    let delayed = std::fs::read_to_string(&strace_log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("(DELAYED)"))
        .count();
    assert!(delayed >= 10, "only {delayed} writes were slowed");
    assert!(handles.len() >= 300, "only {} handles", handles.len());
    // The kill cut some requests off: it came while they were in flight.
    assert!(refused > 0, "no request was in flight at the kill");

    let daemon = Daemon::start(&cfg, &state, &root.path().join("log2"));
    rt.block_on(async {
        let c = daemon.client(true);
        let mut lost = Vec::new();
        for id in &handles {
            match c.get_task(id).await {
                Ok(t) => assert!(t["status"].is_string(), "{id}: {t}"),
                Err(ClientError::Rpc { code, .. }) if code == wire::UNKNOWN_TASK.code => {
                    lost.push(id.clone())
                }
                Err(e) => panic!("tasks/get {id}: {e}"),
            }
        }
        assert!(
            lost.is_empty(),
            "{} of {} handles the clients received name no task after the restart: {lost:?}",
            lost.len(),
            handles.len()
        );
    });
    assert!(daemon.stop().success());
}
