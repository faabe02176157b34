//! Bounds of the serving side, enforced for real: connections, concurrent
//! requests, running tasks, and the expiry of spilled results.
//!
//! Invariant 12 of the map: A client holds request slots only while its request
//! is served: not while it sends its head (header-read timeout), nor its body
//! (read before a slot is taken, with its own timeout), nor while idle; legacy
//! sessions are bounded and give their memory back when they expire. Guarded
//! by:
//! `tests/mcp_limits.rs::{silent_slow_and_idle_connections_are_closed_after_the_header_read_timeout,
//! dribbled_bodies_hold_no_request_slot_and_are_cut_off_after_the_body_read_timeout,
//! legacy_sessions_past_the_bound_get_a_json_rpc_503_until_idle_ones_expire,
//! memory_taken_by_legacy_sessions_is_returned_after_they_expire}`
//!
//! What this file proves: connections, concurrent requests, running slots
//! (synchronous runs hold them too; polls and cancels have their own request
//! budget), header-read timeout on silent, slow and idle connections, dribbled
//! bodies (no slot held; 408 after the body timeout; `/readyz` truthful), the
//! legacy session bound and memory returned after expiry, required tools at
//! capacity and counted fallbacks, output caps ending a call at once; spilled
//! results go when their task expires; the client's bounded retry of busy
//! answers (the wait each answer asks for is proven on a paused clock in
//! `client::tests`); "at once" shown by events, not elapsed time: a refusal
//! arrives while the tool holding the slot waits on a pipe the test never (or
//! only later) writes, a capped call answers while its tool would wait on such
//! a pipe for good, and no process of it is left; a retry with its operation ID
//! gets its task with every slot busy or its owner at its limit (forty at once
//! too), and never runs synchronously while the store is busy
//! (`TASKGATE_TEST_BUSY_FILE`)

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use taskgate::client::ClientError;
use taskgate::wire;

fn config(dir: &std::path::Path, extra: &str) -> std::path::PathBuf {
    let hold = format!(
        "echo started > {}; cat {} > /dev/null; printf rested",
        started_fifo(dir).display(),
        release_fifo(dir).display()
    );
    write_config(
        dir,
        extra,
        &[
            Tool::new("nap")
                .script("sleep $0; printf rested")
                .args(&["{seconds}"])
                .task("optional")
                .timeout_secs(60)
                .param("seconds", "number"),
            Tool::new("hold")
                .script(&hold)
                .unconfined("its files sit beside the state directory")
                .task("optional")
                .timeout_secs(600)
                .input(),
        ],
    )
}

/// A daemon serving [`config`] with `extra` from a fresh private directory
/// (its state and log inside), which the returned guard keeps.
fn limits_daemon(extra: &str) -> (tempfile::TempDir, Daemon) {
    let root = private_dir();
    let state = state_dir(root.path());
    let cfg = config(root.path(), extra);
    let daemon = Daemon::start(&cfg, &state, &root.path().join("log"));
    (root, daemon)
}

/// Where the `hold` tool says it has started (made by `Fifo::new`).
fn started_fifo(dir: &std::path::Path) -> std::path::PathBuf {
    dir.join("started")
}

/// What the `hold` tool waits on after it started: it runs until the test
/// writes to this pipe (or it is killed), so the slot it holds is held
/// for as long as the test has not released it, however slow the machine.
fn release_fifo(dir: &std::path::Path) -> std::path::PathBuf {
    dir.join("release")
}

/// How long a call that must answer may take before the test fails: a
/// guard against a hang, never what makes a test pass.
const HANG: Duration = Duration::from_secs(60);

/// `fut`, which must end within [`HANG`]; `what` names it when it does not.
async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(HANG, fut)
        .await
        .unwrap_or_else(|_| panic!("{what} did not answer within {HANG:?}"))
}

/// A keep-alive GET whose whole response is read: the server has accepted
/// the connection and keeps it (and its permit) open.
fn held_connection(port: u16) -> TcpStream {
    let mut c = http::Connection::open(port);
    let r = c.send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    assert_eq!(r.status, 200, "{r}");
    c.into_stream()
}

#[test]
fn connections_past_the_bound_get_a_clear_503() {
    let (_root, daemon) = limits_daemon("[server]\nmax_connections = 2\n");
    let a = held_connection(daemon.port);
    let b = held_connection(daemon.port);
    // Refused before it sends anything.
    let mut c = TcpStream::connect(("127.0.0.1", daemon.port)).unwrap();
    let reply =
        http::read_to_close(&mut c, &http::Reading::within(Duration::from_secs(5))).answer();
    assert_eq!(reply.status, 503, "{reply}");
    assert!(
        reply.to_string().contains("server.max_connections = 2"),
        "{reply}"
    );
    drop((a, b));
    // Capacity is back once the server has seen the others go; until then
    // (a moment) it still answers 503.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let ok = http_get(daemon.port, "/healthz");
        if ok.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(ok.starts_with("HTTP/1.1 503"), "{ok:?}");
        assert!(
            Instant::now() < deadline,
            "capacity not back 5 s after the connections closed"
        );
    }
    assert!(daemon.stop().success());
}

#[test]
fn concurrent_requests_and_running_tasks_are_bounded() {
    let (root, daemon) = limits_daemon(
        "[server]\nmax_concurrent_requests = 1\n[tasks]\nmax_running = 1\npoll_interval_ms = 50\n",
    );
    let rt = runtime();
    rt.block_on(async {
        // One held synchronous call takes the only request slot.
        let url = daemon.url();
        let started = Fifo::new(&started_fifo(root.path()));
        let release = Fifo::new(&release_fifo(root.path()));
        let slow = tokio::spawn(async move {
            taskgate::client::Client::new(&url, false)
                .unwrap()
                .call_tool("hold", json!({}), None)
                .await
        });
        // The tool runs: the call holds the slot until it is released.
        started.read(HANG);
        let refused = within(
            "a call past max_concurrent_requests",
            daemon
                .client(false)
                .call_tool("nap", json!({"seconds": 0}), None),
        )
        .await;
        match refused {
            Err(ClientError::Rpc { code, message, .. }) => {
                assert_eq!(code, taskgate::wire::SERVER_BUSY.code);
                assert!(message.contains("max_concurrent_requests = 1"), "{message}");
            }
            other => panic!("expected a busy refusal, got {other:?}"),
        }
        // Answered while the slot was held: nothing had released it yet.
        assert!(!slow.is_finished(), "the held call ended unreleased");
        release.write("go", HANG);
        let done = within("the released call", slow).await.unwrap().unwrap();
        assert_eq!(done["content"][0]["text"], "rested");

        // One running slot: the first call becomes a task, the second
        // (slots full) cannot run synchronously either and is refused at
        // once, while the task still holds its slot.
        let c = daemon.client(true);
        let first = c.call_tool("hold", json!({}), None).await.unwrap();
        assert_eq!(first["resultType"], "task");
        let id = first["taskId"].as_str().unwrap();
        started.read(HANG);
        let error = assert_refused(
            within(
                "a call past max_running",
                c.call_tool("nap", json!({"seconds": 0}), None),
            )
            .await,
            wire::RUN_SLOTS_BUSY,
        );
        assert_eq!(error["data"]["maxRunning"], 1, "{error}");
        assert_eq!(c.get_task(id).await.unwrap()["status"], "working");
        release.write("go", HANG);
        let done = within("the released task", c.wait_task(id, &first))
            .await
            .unwrap();
        assert_eq!(done["status"], "completed", "{done}");
    });
    assert!(daemon.stop().success());
}

/// A client told to retry busy answers sends the refused request again
/// (after the wait the answer asks for: `client::tests` proves the wait on a
/// paused clock), counts every busy answer, and gives up after its bound
/// with an error that says so; one told nothing is refused at once, as
/// before; one with retries to spare gets through once the slot is free.
#[test]
fn busy_answers_are_retried_after_their_hint_a_bounded_number_of_times() {
    let (root, daemon) = limits_daemon(
        "[server]\nmax_concurrent_requests = 1\n[tasks]\nmax_running = 2\npoll_interval_ms = 50\n",
    );
    let rt = runtime();
    rt.block_on(async {
        // One held synchronous call takes the only request slot until the
        // test releases it: every answer below until then is given while
        // the slot is provably held.
        let url = daemon.url();
        let started = Fifo::new(&started_fifo(root.path()));
        let release = Fifo::new(&release_fifo(root.path()));
        let slow = tokio::spawn(async move {
            taskgate::client::Client::new(&url, false)
                .unwrap()
                .call_tool("hold", json!({}), None)
                .await
        });
        started.read(HANG);

        let plain = daemon.client(false);
        assert_refused_busy(
            within(
                "a busy call",
                plain.call_tool("nap", json!({"seconds": 0}), None),
            )
            .await,
        );
        assert_eq!(plain.busy_answers(), 1);

        // One retry: a second busy answer, then it gives up.
        let once = daemon.client(false).with_busy_retries(1);
        match within(
            "a call retried once",
            once.call_tool("nap", json!({"seconds": 0}), None),
        )
        .await
        {
            Err(ClientError::StillBusy { answers, last }) => {
                assert_eq!(answers, 2);
                assert_refused_busy(Err(*last));
            }
            other => panic!("expected the client to give up, got {other:?}"),
        }
        assert_eq!(once.busy_answers(), 2);

        // Retries enough to outlast the held call: refused while it holds
        // the slot, it goes through once the slot is released.
        let patient = std::sync::Arc::new(daemon.client(false).with_busy_retries(10));
        let call = {
            let patient = patient.clone();
            tokio::spawn(async move { patient.call_tool("nap", json!({"seconds": 0}), None).await })
        };
        let deadline = Instant::now() + HANG;
        while patient.busy_answers() == 0 {
            if call.is_finished() {
                panic!(
                    "the patient call ended while the slot was held: {:?}",
                    call.await
                );
            }
            assert!(
                Instant::now() < deadline,
                "the patient client got no busy answer within {HANG:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(!slow.is_finished(), "the held call ended unreleased");
        release.write("go", HANG);
        let slow = within("the released call", slow).await.unwrap().unwrap();
        assert_eq!(slow["content"][0]["text"], "rested");
        let done = within("the patient call", call).await.unwrap().unwrap();
        assert_eq!(done["content"][0]["text"], "rested");
        assert!(patient.busy_answers() >= 1, "{}", patient.busy_answers());
    });
    assert!(daemon.stop().success());
}

fn assert_refused_busy(r: Result<serde_json::Value, ClientError>) {
    match r {
        Err(ClientError::Rpc { code, message, .. }) => {
            assert_eq!(code, wire::SERVER_BUSY.code);
            assert!(message.contains("max_concurrent_requests = 1"), "{message}");
        }
        other => panic!("expected a busy refusal, got {other:?}"),
    }
}

/// A built-in tool whose result (40 KiB) is spilled to an artifact.
#[derive(Debug)]
struct Big {
    spec: taskgate::tools::ToolSpec,
}

impl taskgate::tools::Runner for Big {
    fn spec(&self) -> &taskgate::tools::ToolSpec {
        &self.spec
    }

    fn validate(&self, _: &serde_json::Value) -> Result<(), taskgate::tools::ArgumentError> {
        Ok(())
    }

    fn run<'a>(
        &'a self,
        _: &'a serde_json::Map<String, serde_json::Value>,
        _: Duration,
        _: &'a tokio_util::sync::CancellationToken,
    ) -> taskgate::tools::RunFuture<'a> {
        Box::pin(async move {
            Ok(json!({"content": [{"type": "text", "text": "b".repeat(40 * 1024)}]}))
        })
    }
}

/// Spilled results go when their task expires: a daemon opened in process
/// on the store's manual clock, two tasks spilled 2000 s apart (a finished
/// task is kept an hour), the artifact sweep run once the first has
/// expired.
#[test]
fn spilled_results_go_when_their_task_expires() {
    use taskgate::service::{Daemon, Options};
    use taskgate::store::{Clock, TaskId, TaskStatus};
    use taskgate::tasks::{Call, Delivery};
    let root = private_dir();
    let state = state_dir(root.path());
    let cfg = root.path().join("taskgate.toml");
    std::fs::write(&cfg, "[tasks]\ndefault_ttl_secs = 1000\n").unwrap();
    let (clock, hand) = Clock::manual(Clock::system().now_ms());
    let big: std::sync::Arc<dyn taskgate::tools::Runner> = std::sync::Arc::new(Big {
        spec: taskgate::tools::ToolSpec {
            name: "big".into(),
            description: "a large result".into(),
            input_schema: json!({"type": "object"}),
            effect: taskgate::config::Effect::ReadOnly,
            task: taskgate::config::TaskMode::Required,
            shown: Default::default(),
        },
    });
    let daemon = Daemon::start(Options {
        overrides: taskgate::config::Overrides {
            config_path: Some(cfg),
            state_dir: Some(state.clone()),
            listen: None,
        },
        builtins: vec![big],
        clock: Some(clock),
        ..Default::default()
    })
    .unwrap();
    let svc = daemon.service().clone();
    let rt = runtime();
    rt.block_on(async {
        let spill = || async {
            let call = Call {
                tool: "big".into(),
                arguments: None,
                caller: taskgate::auth::Caller::Local,
                negotiated: true,
                operation_id: None,
                client_cancel: Default::default(),
            };
            let Ok(Delivery::Task(task)) = svc.call(call).await else {
                panic!("no task");
            };
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let t = svc
                    .get(task.id.as_str(), &taskgate::auth::Caller::Local)
                    .await
                    .unwrap();
                if t.status == TaskStatus::Completed {
                    break task.id;
                }
                assert!(Instant::now() < deadline, "{t:?}");
                tokio::task::yield_now().await;
            }
        };
        let artifact = |id: &TaskId| state.join("artifacts").join(format!("{id}.json"));
        let short = spill().await;
        hand.advance(Duration::from_secs(2000));
        let long = spill().await;
        assert!(artifact(&short).exists() && artifact(&long).exists());
        svc.sweep_artifacts(64).await;
        assert!(artifact(&short).exists(), "swept before its task expired");
        // The first task expires (an hour after it finished), the second
        // has 2000 s left.
        hand.advance(Duration::from_secs(2000));
        svc.sweep_artifacts(64).await;
        assert!(!artifact(&short).exists(), "kept after its task expired");
        assert!(artifact(&long).exists(), "swept while its task lives");
        daemon.store().shutdown().await.unwrap();
    });
    drop(daemon);
}

/// A quick tool, `required` or `optional`, plus one that holds its running
/// slot until cancelled: it waits on [`release_fifo`], which no test writes.
fn task_mode_config(dir: &std::path::Path, extra: &str) -> std::path::PathBuf {
    let tool = |name: &str, script: &str, task: &str| {
        Tool::new(name)
            .script(script)
            .unconfined("linger's pipe sits beside the state directory")
            .task(task)
            .timeout_secs(600)
            .input()
    };
    let linger = format!("cat {}", release_fifo(dir).display());
    write_config(
        dir,
        &format!("{extra}\n[tasks]\npoll_interval_ms = 50\ncancel_grace_ms = 200\n"),
        &[
            tool("must", "printf done", "required"),
            tool("may", "printf done", "optional"),
            tool("linger", &linger, "required"),
        ],
    )
}

/// The JSON-RPC error a call got, which must be the registered `expected`.
fn assert_refused(
    got: Result<serde_json::Value, ClientError>,
    expected: wire::WireCode,
) -> serde_json::Value {
    match got {
        Err(ClientError::Rpc { code, error, .. }) => {
            assert_eq!(code, expected.code, "{error}");
            assert_eq!(error["data"]["name"], expected.name, "{error}");
            error
        }
        other => panic!("expected {}, got {other:?}", expected.name),
    }
}

#[test]
fn a_required_tool_at_the_live_task_limit_gets_the_capacity_error_and_an_optional_one_falls_back_counted()
 {
    let root = private_dir();
    let state = state_dir(root.path());
    let cfg = task_mode_config(root.path(), "[store]\nmax_live_tasks = 1\n");
    let mut daemon = Daemon::start(&cfg, &state, &root.path().join("log"));
    assert!(!daemon.status.contains("fallbacks"), "{}", daemon.status);
    let rt = runtime();
    rt.block_on(async {
        let c = daemon.client(true);
        // The one live task the store may hold, for a day (the default
        // ttl): nothing in this test frees its place.
        let first = c.call_tool("must", json!({}), None).await.unwrap();
        assert_eq!(first["resultType"], "task", "{first}");
        // At the limit a required tool gets the capacity error, while the
        // limit still holds: a call queued for a place would still wait.
        assert_refused(
            within(
                "a required call at the live-task limit",
                c.call_tool("must", json!({}), None),
            )
            .await,
            wire::STORE_CAPACITY,
        );
        let id = first["taskId"].as_str().unwrap();
        let live = c.get_task(id).await;
        assert_eq!(live.unwrap()["taskId"], id, "the live task went");
        // ...and an optional one still answers, synchronously.
        let now = c.call_tool("may", json!({}), None).await.unwrap();
        assert_eq!(now["resultType"], "complete", "{now}");
        assert_eq!(now["content"][0]["text"], "done");
    });
    // The fallback is counted where the operator looks.
    let status = daemon.wait_for("fallbacks 1 (capacity 1)", Duration::from_secs(5));
    assert!(status.contains("STATUS=serving on"), "{status}");
    let log = daemon.log_text();
    assert!(
        log.contains("reason=\"store_capacity\"") || log.contains("reason=store_capacity"),
        "{log}"
    );
    assert!(daemon.stop().success());
}

#[test]
fn a_required_tool_with_every_slot_busy_gets_a_clear_error_at_once() {
    let root = private_dir();
    let state = state_dir(root.path());
    let cfg = task_mode_config(root.path(), "");
    let cfg_text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        cfg_text.replace("[tasks]\n", "[tasks]\nmax_running = 1\n"),
    )
    .unwrap();
    let daemon = Daemon::start(&cfg, &state, &root.path().join("log"));
    let rt = runtime();
    rt.block_on(async {
        let c = daemon.client(true);
        // Holds the only running slot until cancelled: nothing ever
        // releases it, so a call queued for the slot would wait for good.
        let _release = Fifo::new(&release_fifo(root.path()));
        let held = c.call_tool("linger", json!({}), None).await.unwrap();
        assert_eq!(held["resultType"], "task", "{held}");
        let held = held["taskId"].as_str().unwrap();
        let error = assert_refused(
            within(
                "a required call with every slot busy",
                c.call_tool("must", json!({}), None),
            )
            .await,
            wire::TASK_SLOTS_BUSY,
        );
        assert_eq!(error["data"]["maxRunning"], 1, "{error}");
        // An optional tool would need the same slot to run synchronously:
        // refused at once as well, with the error that says so.
        let error = assert_refused(
            within(
                "an optional call with every slot busy",
                c.call_tool("may", json!({}), None),
            )
            .await,
            wire::RUN_SLOTS_BUSY,
        );
        assert_eq!(error["data"]["maxRunning"], 1, "{error}");
        // Both answers came while the slot was taken.
        assert_eq!(c.get_task(held).await.unwrap()["status"], "working");
        c.cancel_task(held).await.unwrap();
    });
    assert!(daemon.stop().success());
}

/// A tool past its stdout cap that keeps stderr open (it then waits, stdout
/// and stderr open, on a pipe nobody writes) is stopped at once with the
/// output-limit error, not at its end (never) or its timeout (longer than
/// the test waits), and nothing of it is left.
#[test]
fn an_output_cap_ends_the_call_at_once_while_stderr_stays_open() {
    let root = private_dir();
    let state = state_dir(root.path());
    let release = Fifo::new(&release_fifo(root.path()));
    let p = write_config(
        root.path(),
        "",
        &[Tool::new("spew")
            .script(&format!(
                "head -c 200000 /dev/zero; exec cat {}",
                release.path.display()
            ))
            .unconfined("its pipe sits beside the state directory")
            .task("optional")
            .timeout_secs(10 * HANG.as_secs())
            .extra("max_stdout_bytes = 1024")
            .input()],
    );
    let daemon = Daemon::start(&p, &state, &root.path().join("log"));
    let rt = runtime();
    rt.block_on(async {
        assert_refused(
            within(
                "a call past its output cap",
                daemon.client(false).call_tool("spew", json!({}), None),
            )
            .await,
            wire::TOOL_OUTPUT_LIMIT,
        );
    });
    // The answer comes once the tool's processes are gone: none is left
    // waiting for the release that never came.
    assert!(!release.has_reader(), "the capped tool is still running");
    assert!(daemon.stop().success());
}

/// Reads until the server closes `s`; `None` if it was still open after
/// `limit`.
fn closed_within(s: &mut TcpStream, limit: Duration) -> Option<String> {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut got = Vec::new();
    match s.read_to_end(&mut got) {
        Ok(_) => Some(String::from_utf8_lossy(&got).into_owned()),
        // A reset is the server closing too.
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
            Some(String::from_utf8_lossy(&got).into_owned())
        }
        Err(_) => None,
    }
}

#[test]
fn silent_slow_and_idle_connections_are_closed_after_the_header_read_timeout() {
    let (_root, daemon) =
        limits_daemon("[server]\nmax_connections = 3\nheader_read_timeout_ms = 500\n");
    // The connection limit filled three ways: a connection that sends
    // nothing, one that stops half-way through its request head, and a
    // keep-alive connection idle after its first answer.
    let mut silent = TcpStream::connect(("127.0.0.1", daemon.port)).unwrap();
    let mut half = TcpStream::connect(("127.0.0.1", daemon.port)).unwrap();
    write!(half, "GET /healthz HTTP/1.1\r\nHost: 127.0").unwrap();
    let mut idle = held_connection(daemon.port);

    let started = Instant::now();
    for (what, s) in [
        ("silent", &mut silent),
        ("half a header", &mut half),
        ("idle keep-alive", &mut idle),
    ] {
        let left = Duration::from_secs(5).saturating_sub(started.elapsed());
        assert!(
            closed_within(s, left).is_some(),
            "the {what} connection is still open {:?} after the 500 ms header-read timeout",
            started.elapsed()
        );
    }
    // Their slots are free again: a fresh client is answered.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let ok = http_get(daemon.port, "/healthz");
        if ok.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no 200 from /healthz 2 s after the held connections were closed: {ok:?}"
        );
    }
    assert!(daemon.stop().success());
}

/// A `/mcp` POST that announces a 100,000-byte body, waits until the
/// server asks for it (`100 Continue`: the server is reading the body), then
/// sends one byte and stalls.
fn dribbling_post(port: u16) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nExpect: 100-continue\r\nContent-Length: 100000\r\n\r\n"
    )
    .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    while !String::from_utf8_lossy(&got).contains("\r\n\r\n") {
        let n = s
            .read(&mut buf)
            .expect("the server answers the body's Expect");
        assert!(n > 0, "closed before asking for the body: {got:?}");
        got.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&got);
    assert!(
        head.starts_with("HTTP/1.1 100"),
        "a POST that has not sent its body yet was answered: {head:?}"
    );
    s.write_all(b"{").unwrap();
    s
}

/// Clients that announce a body and dribble it hold only their own
/// connections: no request slot is taken until a body is in, so polls and
/// calls are admitted and `/readyz` says ready; each dribbler gets a
/// JSON-RPC 408 after `server.body_read_timeout_ms` and is closed.
#[test]
fn dribbled_bodies_hold_no_request_slot_and_are_cut_off_after_the_body_read_timeout() {
    let (_root, daemon) = limits_daemon(
        "[server]\nmax_concurrent_requests = 2\nreserved_control_requests = 2\nbody_read_timeout_ms = 1500\n",
    );
    // Twice as many dribblers as there are request slots of both kinds.
    let mut dribblers: Vec<TcpStream> = (0..8).map(|_| dribbling_post(daemon.port)).collect();
    let ready = http_get(daemon.port, "/readyz");
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    let rt = runtime();
    rt.block_on(async {
        let c = daemon.client(true);
        let unknown = c.get_task("no-such-task").await;
        assert_refused(unknown, wire::UNKNOWN_TASK);
        let done = daemon
            .client(false)
            .call_tool("nap", json!({"seconds": 0}), None)
            .await
            .unwrap();
        assert_eq!(done["content"][0]["text"], "rested", "{done}");
    });
    for (n, s) in dribblers.iter_mut().enumerate() {
        let reply = closed_within(s, Duration::from_secs(10))
            .unwrap_or_else(|| panic!("dribbler {n} is still open 10 s into a 1.5 s body timeout"));
        let reply = http::parse(reply.as_bytes()).answer();
        assert_eq!(reply.status, 408, "dribbler {n}: {reply}");
        let error: serde_json::Value = serde_json::from_slice(&reply.body)
            .unwrap_or_else(|e| panic!("dribbler {n}: the 408 body is not JSON ({e}): {reply}"));
        assert_eq!(
            error["error"]["code"],
            wire::REQUEST_TIMEOUT.code,
            "{error}"
        );
        let message = error["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("server.body_read_timeout_ms"), "{message}");
    }
    assert!(daemon.stop().success());
}

/// An attacker keeps every connection slot filled with connections that
/// send nothing (or half a head), reopening as they are closed: a client
/// that connects and sends its request at once is still served, because at
/// the limit a newcomer displaces the oldest connection that has sent no
/// whole request. Connections that have sent requests are never displaced.
#[test]
fn a_newcomer_at_the_limit_displaces_the_oldest_connection_that_sent_nothing() {
    let (_root, daemon) =
        limits_daemon("[server]\nmax_connections = 4\nheader_read_timeout_ms = 60000\n");
    let silent = |port| {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s
    };
    let mut attackers: Vec<TcpStream> = (0..4).map(|_| silent(daemon.port)).collect();
    for round in 0..20 {
        // The attacker opens two more, one of them half a head.
        attackers.push(silent(daemon.port));
        let mut half = silent(daemon.port);
        write!(half, "GET /healthz HTTP/1.1\r\nHost: 1").unwrap();
        attackers.push(half);
        let probe = http_get(daemon.port, "/healthz");
        assert!(
            probe.starts_with("HTTP/1.1 200"),
            "round {round}: a client that sent its request at once was refused while the slots held connections that sent nothing: {probe:?}"
        );
    }
    // The first attacker connection was displaced long ago: closed, unanswered.
    let first = closed_within(&mut attackers[0], Duration::from_secs(5));
    assert_eq!(
        first.as_deref(),
        Some(""),
        "the oldest silent connection is still open"
    );
    // Slots held by connections that have sent requests are never taken.
    // Each of these four displaces one of the silent connections still
    // open; a displaced connection's slot comes free once its task has
    // seen the displacement, which a loaded machine may delay past the
    // newcomer's wait, and the newcomer is then told to retry (503 with
    // Retry-After), as a client would be: it does.
    let held: Vec<TcpStream> = (0..4)
        .map(|_| {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let mut c = http::Connection::open(daemon.port);
                let r = c.send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
                if r.status == 200 {
                    break c.into_stream();
                }
                assert_eq!(r.status, 503, "{r}");
                assert!(
                    Instant::now() < deadline,
                    "no slot came free within 30 s: {r}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        })
        .collect();
    let full = http_get(daemon.port, "/healthz");
    assert!(full.starts_with("HTTP/1.1 503"), "{full:?}");
    drop(held);
    assert!(daemon.stop().success());
}

/// A legacy `initialize` as one raw HTTP/1.1 POST on a fresh connection:
/// the status, the `Mcp-Session-Id` if one was given, and the body.
fn legacy_initialize(port: u16, id: u64) -> (u16, Option<String>, String) {
    let body = json!({
        "jsonrpc": "2.0",
        "id": id,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "legacy-client", "version": "1"},
        },
    })
    .to_string();
    let r = http::exchange(
        port,
        format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    );
    let session = r.header("mcp-session-id").map(str::to_string);
    (r.status, session, r.text())
}

/// One request on a keep-alive connection; its answer.
fn keep_alive_post(c: &mut http::Connection, body: &str) -> http::Response {
    // One write: several small ones would wait on delayed ACKs.
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    c.send(request.as_bytes())
}

/// 2,000 legacy sessions opened at once (on one keep-alive connection)
/// grow the daemon by tens of MiB; once they expire, that memory goes back
/// to the system rather than staying with the process.
#[test]
fn memory_taken_by_legacy_sessions_is_returned_after_they_expire() {
    const SESSIONS: u64 = 2000;
    let (_root, daemon) = limits_daemon(&format!(
        "[server]\nmax_sessions = {SESSIONS}\nsession_idle_secs = 1\n"
    ));
    let before = rss_kib(daemon.pid().as_raw()).expect("the daemon's VmRSS");
    let mut c = http::Connection::open(daemon.port);
    for id in 0..SESSIONS {
        let body = json!({
            "jsonrpc": "2.0",
            "id": id,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "legacy-client", "version": "1"},
            },
        })
        .to_string();
        let reply = keep_alive_post(&mut c, &body);
        assert_eq!(reply.status, 200, "initialize {id}: {reply}");
    }
    drop(c);
    let peak = rss_kib(daemon.pid().as_raw()).expect("the daemon's VmRSS");
    let grown = peak.saturating_sub(before);
    assert!(
        grown > 16 * 1024,
        "{SESSIONS} sessions grew the daemon by only {grown} KiB ({before} -> {peak}); the test proves nothing"
    );
    // Sessions expire after 1 s idle; then the memory chore runs.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut now = peak;
    while now > before + grown / 4 {
        assert!(
            Instant::now() < deadline,
            "20 s after {SESSIONS} sessions went idle the daemon still holds {now} KiB (before {before}, peak {peak})"
        );
        std::thread::sleep(Duration::from_millis(200));
        now = rss_kib(daemon.pid().as_raw()).expect("the daemon's VmRSS");
    }
    eprintln!(
        "RSS before {before} KiB, with {SESSIONS} sessions {peak} KiB, after expiry {now} KiB"
    );
    assert!(daemon.stop().success());
}

/// Sixteen `initialize` requests race for one session slot, twenty times
/// over: each time exactly one gets the session and every other one the
/// JSON-RPC 503, never the protocol library's plain-text 500.
#[test]
fn initializes_racing_for_the_last_session_slot_get_one_session_and_clean_refusals() {
    let (_root, daemon) = limits_daemon("[server]\nmax_sessions = 1\n");
    let port = daemon.port;
    for round in 0..20u64 {
        let racers: Vec<_> = (0..16u64)
            .map(|n| std::thread::spawn(move || legacy_initialize(port, round * 100 + n)))
            .collect();
        let answers: Vec<_> = racers.into_iter().map(|r| r.join().unwrap()).collect();
        let mut sessions = Vec::new();
        for (status, session, body) in &answers {
            if *status == 200 {
                sessions.push(session.clone().expect("a 200 initialize opens a session"));
                continue;
            }
            assert_eq!(*status, 503, "round {round}: {body}");
            let v: serde_json::Value = serde_json::from_str(body)
                .unwrap_or_else(|e| panic!("round {round}: not JSON-RPC ({e}): {body}"));
            assert_eq!(v["error"]["code"], wire::SESSIONS_FULL.code, "{body}");
        }
        assert_eq!(sessions.len(), 1, "round {round}: {answers:?}");
        // Free the slot for the next round.
        let request = format!(
            "DELETE /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nMcp-Session-Id: {}\r\nMCP-Protocol-Version: 2025-11-25\r\n\r\n",
            sessions[0]
        );
        let reply = http::exchange(port, request.as_bytes());
        assert!(
            (200..300).contains(&reply.status),
            "DELETE of the session: {reply}"
        );
    }
    assert!(daemon.stop().success());
}

#[test]
fn legacy_sessions_past_the_bound_get_a_json_rpc_503_until_idle_ones_expire() {
    let (_root, daemon) = limits_daemon("[server]\nmax_sessions = 2\nsession_idle_secs = 1\n");
    for id in 1..=2 {
        let (status, session, body) = legacy_initialize(daemon.port, id);
        assert_eq!(status, 200, "{body}");
        assert!(
            session.is_some(),
            "initialize {id} opened no session: {body}"
        );
    }
    let (status, session, body) = legacy_initialize(daemon.port, 3);
    assert_eq!(status, 503, "{body}");
    assert_eq!(session, None);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["id"], 3, "{body}");
    assert_eq!(v["error"]["code"], wire::SESSIONS_FULL.code, "{body}");
    assert_eq!(
        v["error"]["data"]["name"],
        wire::SESSIONS_FULL.name,
        "{body}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("server.max_sessions = 2"),
        "{body}"
    );
    // A 2026-07-28 client needs no session and is still served.
    let client = daemon.client(true);
    let rt = runtime();
    let tools = rt.block_on(client.request("tools/list", json!({}), None, None));
    assert!(tools.is_ok(), "{tools:?}");
    // The two sessions see no request for a second: they close and their
    // slots take new sessions.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, session, body) = legacy_initialize(daemon.port, 4);
        if status == 200 {
            assert!(session.is_some(), "{body}");
            break;
        }
        assert_eq!(status, 503, "{body}");
        assert!(
            Instant::now() < deadline,
            "no session slot freed 10 s after the sessions went idle (session_idle_secs = 1)"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(daemon.stop().success());
}

/// `block` announces itself on `started-<n>` and then holds its process
/// until it is cancelled or the daemon stops (opening `hold`, a FIFO nobody
/// writes, blocks the shell itself: no child whose copy of the command line
/// would be counted twice); `optional`, so a client with Tasks gets a task
/// and one without runs it synchronously.
/// A daemon serving `block` with two running slots and
/// `max_concurrent_requests` call slots, and the FIFOs on which its first
/// `fifos` calls announce themselves.
fn blocking_daemon(
    root: &std::path::Path,
    max_concurrent_requests: u32,
    fifos: usize,
) -> (Daemon, Vec<Fifo>) {
    let state = state_dir(root);
    let cfg = blocking_config(
        root,
        &format!(
            "[server]\nmax_concurrent_requests = {max_concurrent_requests}\n[tasks]\nmax_running = 2\npoll_interval_ms = 50\ncancel_grace_ms = 200\n"
        ),
    );
    let daemon = Daemon::builder()
        .config(&cfg)
        .state_dir(&state)
        .log(&root.join("log"))
        .start();
    let fifos = (0..fifos)
        .map(|n| Fifo::new(&root.join(format!("started-{n}"))))
        .collect();
    (daemon, fifos)
}

fn blocking_config(dir: &std::path::Path, extra: &str) -> std::path::PathBuf {
    let p = write_config(
        dir,
        extra,
        &[Tool::new("block")
            .script("echo started > \"$1/started-$0\"; read x < \"$1/hold\"")
            .args(&["{n}", &dir.display().to_string()])
            .unconfined("its files sit beside the state directory")
            .task("optional")
            .timeout_secs(120)
            .required("n", "string")],
    );
    nix::unistd::mkfifo(
        &dir.join("hold"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    p
}

/// Tool processes of `block` under `dir` alive right now (the shell, not
/// the shim that starts it), read from /proc.
fn block_processes(dir: &std::path::Path) -> usize {
    let marker = dir.display().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|cmdline| {
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            args.first().is_some_and(|a| a == "/bin/sh")
                && args.iter().any(|a| a == &marker)
                && args.iter().any(|a| a.contains("started-"))
        })
        .count()
}

/// Synchronous runs hold running slots too: with both taken by tasks, six
/// concurrent synchronous calls are all refused at once with
/// `TG_RUN_SLOTS_BUSY`, and no more than `tasks.max_running` tool processes
/// ever exist.
#[test]
fn synchronous_calls_count_against_max_running_and_are_refused_at_once() {
    let root = private_dir();
    let (daemon, fifos) = blocking_daemon(root.path(), 16, 8);
    let rt = runtime();
    rt.block_on(async {
        let c = daemon.client(true);
        let mut tasks = Vec::new();
        for (n, started) in fifos.iter().enumerate().take(2) {
            let task = c
                .call_tool("block", json!({"n": n.to_string()}), None)
                .await
                .unwrap();
            assert_eq!(task["resultType"], "task", "{task}");
            started.read(Duration::from_secs(20));
            tasks.push(task["taskId"].as_str().unwrap().to_string());
        }
        assert_eq!(block_processes(root.path()), 2);
        // Both slots are taken: six synchronous calls at once.
        let calls: Vec<_> = (2..8)
            .map(|n| {
                let url = daemon.url();
                tokio::spawn(async move {
                    let c = taskgate::client::Client::new(&url, false).unwrap();
                    let call = c.call_tool("block", json!({"n": n.to_string()}), None);
                    tokio::time::timeout(Duration::from_secs(5), call).await
                })
            })
            .collect();
        for (n, call) in (2..8).zip(calls) {
            let Ok(got) = call.await.unwrap() else {
                panic!(
                    "call {n} was not refused within 5 s: it runs ({} tool processes with max_running = 2)",
                    block_processes(root.path())
                );
            };
            let error = assert_refused(got, wire::RUN_SLOTS_BUSY);
            assert_eq!(error["data"]["maxRunning"], 2, "{error}");
            let message = error["message"].as_str().unwrap_or_default();
            assert!(message.contains("tasks.max_running"), "{message}");
            assert!(message.contains("retry"), "{message}");
        }
        assert_eq!(block_processes(root.path()), 2);
        for id in &tasks {
            c.cancel_task(id).await.unwrap();
        }
    });
    assert!(daemon.stop().success());
}

/// A long synchronous call holds the only `tools/call` request slot and
/// the other running slot holds a task: another call is refused at the
/// door, but polling, listing and cancelling still answer, from their own
/// budget.
#[test]
fn polls_listings_and_cancels_get_through_while_long_calls_hold_every_request_slot() {
    let root = private_dir();
    let (daemon, fifos) = blocking_daemon(root.path(), 1, 2);
    let rt = runtime();
    rt.block_on(async {
        let c = daemon.client(true);
        let task = c.call_tool("block", json!({"n": "0"}), None).await.unwrap();
        assert_eq!(task["resultType"], "task", "{task}");
        let id = task["taskId"].as_str().unwrap().to_string();
        fifos[0].read(Duration::from_secs(20));
        // The synchronous call holds the one request slot for calls.
        let url = daemon.url();
        let long = tokio::spawn(async move {
            taskgate::client::Client::new(&url, false)
                .unwrap()
                .call_tool("block", json!({"n": "1"}), None)
                .await
        });
        fifos[1].read(Duration::from_secs(20));
        assert_refused(
            daemon
                .client(false)
                .call_tool("block", json!({"n": "2"}), None)
                .await,
            wire::SERVER_BUSY,
        );
        // /mcp cannot admit a call now, and /readyz says so.
        let ready = http_get(daemon.port, "/readyz");
        assert!(ready.starts_with("HTTP/1.1 503"), "{ready}");
        assert!(
            ready.contains("every request slot is in use (server.max_concurrent_requests = 1)"),
            "{ready}"
        );
        // Meanwhile the task can be followed and stopped.
        let got = c.get_task(&id).await.unwrap();
        assert_eq!(got["status"], "working", "{got}");
        let tools = c
            .request("tools/list", json!({}), None, None)
            .await
            .unwrap();
        assert!(
            tools["tools"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t["name"] == "block")),
            "{tools}"
        );
        c.cancel_task(&id).await.unwrap();
        let ended = c.wait_task(&id, &got).await.unwrap();
        assert_eq!(ended["status"], "cancelled", "{ended}");
        assert!(block_processes(root.path()) <= 2);
        assert!(!long.is_finished());
        // The long call ends; its slot is free and the daemon is ready again.
        std::fs::write(root.path().join("hold"), "go\n").unwrap();
        long.await.unwrap().unwrap();
        let ready = http_get(daemon.port, "/readyz");
        assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    });
    assert!(daemon.stop().success());
}

/// A daemon whose `linger` and `once` tools are described by
/// [`retry_config`], with `extra` in `[tasks]`; `once` appends a line to
/// `runs` each time it starts, so a second run shows.
fn retry_daemon(extra: &str, env: &[(&str, &std::path::Path)]) -> (tempfile::TempDir, Daemon) {
    let root = private_dir();
    let state = state_dir(root.path());
    let runs = root.path().join("runs");
    let cfg = write_config(
        root.path(),
        &format!("[tasks]\npoll_interval_ms = 50\ncancel_grace_ms = 200\n{extra}\n"),
        &[
            Tool::new("linger")
                .script("sleep 60")
                .task("optional")
                .timeout_secs(90)
                .input(),
            Tool::new("once")
                .script(&format!("echo ran >> {}; printf done", runs.display()))
                .unconfined("it counts its runs in a file beside the state directory")
                .effect("idempotent_write")
                .task("optional")
                .input(),
        ],
    );
    let mut builder = Daemon::builder()
        .config(&cfg)
        .state_dir(&state)
        .log(&root.path().join("log"));
    for (k, v) in env {
        builder = builder.env(k, v);
    }
    (root, builder.start())
}

fn runs_of(root: &tempfile::TempDir) -> usize {
    std::fs::read_to_string(root.path().join("runs"))
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

/// A retry of a call whose task exists gets that task, whatever the running
/// slots and the owner's limit say; only a new call is refused. Forty
/// concurrent retries all get the one task.
#[test]
fn a_retry_gets_its_task_whatever_the_slots_and_the_owners_limit_say() {
    for (extra, refusal) in [
        ("max_running = 2", wire::RUN_SLOTS_BUSY),
        (
            "max_running = 3\nmax_running_per_owner = 2",
            wire::OWNER_LIMIT,
        ),
    ] {
        let (_root, daemon) = retry_daemon(extra, &[]);
        let rt = runtime();
        rt.block_on(async {
            let c = daemon.client(true);
            let first = c
                .call_tool("linger", json!({}), Some("op-first"))
                .await
                .unwrap();
            assert_eq!(first["resultType"], "task", "{first}");
            let second = c.call_tool("linger", json!({}), None).await.unwrap();
            assert_eq!(second["resultType"], "task", "{second}");
            // Every place this caller may run in is taken: a new call is
            // refused, with the error of the bound it met...
            assert_refused(c.call_tool("linger", json!({}), None).await, refusal);
            assert_refused(
                c.call_tool("linger", json!({}), Some("op-new")).await,
                refusal,
            );
            // ...and a retry of the first gets its task.
            let again = c
                .call_tool("linger", json!({}), Some("op-first"))
                .await
                .unwrap();
            assert_eq!(again["taskId"], first["taskId"], "{extra}: {again}");
            // Also forty at once.
            let mut calls = tokio::task::JoinSet::new();
            for _ in 0..40 {
                let c = daemon.client(true);
                calls
                    .spawn(async move { c.call_tool("linger", json!({}), Some("op-first")).await });
            }
            let mut same = 0;
            while let Some(answer) = calls.join_next().await {
                let answer = answer.unwrap().unwrap_or_else(|e| panic!("{extra}: {e:?}"));
                assert_eq!(answer["taskId"], first["taskId"], "{extra}: {answer}");
                same += 1;
            }
            assert_eq!(same, 40);
            // A retry with other arguments is still a conflict.
            assert_refused(
                c.call_tool("linger", json!({"x": 1}), Some("op-first"))
                    .await,
                wire::IDEMPOTENCY_CONFLICT,
            );
            for t in [&first, &second] {
                c.cancel_task(t["taskId"].as_str().unwrap()).await.unwrap();
            }
        });
        assert!(daemon.stop().success());
    }
}

/// A call with an operation ID never runs synchronously where the store
/// could not say whether its task exists: with the store busy, the retry
/// of a committed call gets the store's error, marked retryable, and the
/// tool does not run a second time. Once the store answers again, the
/// retry gets the task it had.
#[test]
fn a_call_with_an_operation_id_never_falls_back_to_a_synchronous_run() {
    let busy_dir = private_dir();
    let busy = busy_dir.path().join("busy");
    let (root, daemon) = retry_daemon("", &[("TASKGATE_TEST_BUSY_FILE", &busy)]);
    let rt = runtime();
    rt.block_on(async {
        let c = daemon.client(true);
        let first = c.call_tool("once", json!({}), Some("op-1")).await.unwrap();
        assert_eq!(first["resultType"], "task", "{first}");
        let done = c
            .wait_task(first["taskId"].as_str().unwrap(), &first)
            .await
            .unwrap();
        assert_eq!(done["status"], "completed", "{done}");
        assert_eq!(runs_of(&root), 1);

        std::fs::write(&busy, "").unwrap();
        // The reply was lost; the client retries while the store is busy.
        let error = assert_refused(
            c.call_tool("once", json!({}), Some("op-1")).await,
            wire::STORE_BUSY,
        );
        assert_eq!(error["data"]["retryable"], true, "{error}");
        assert_eq!(error["data"]["ran"], false, "{error}");
        // A new call with an operation ID is refused the same way...
        let error = assert_refused(
            c.call_tool("once", json!({}), Some("op-2")).await,
            wire::STORE_BUSY,
        );
        assert_eq!(error["data"]["retryable"], true, "{error}");
        assert_eq!(
            runs_of(&root),
            1,
            "a call with an operation ID ran synchronously"
        );
        // ...while a call without one may still run synchronously.
        let now = c.call_tool("once", json!({}), None).await.unwrap();
        assert_eq!(now["resultType"], "complete", "{now}");
        assert_eq!(runs_of(&root), 2);

        std::fs::remove_file(&busy).unwrap();
        let again = c.call_tool("once", json!({}), Some("op-1")).await.unwrap();
        assert_eq!(again["taskId"], first["taskId"], "{again}");
        assert_eq!(runs_of(&root), 2);
    });
    assert!(daemon.stop().success());
}
