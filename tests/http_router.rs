//! The HTTP application in process: `/healthz`, `/readyz` and the 503
//! paths, driven with `tower::ServiceExt::oneshot` against the router of a
//! daemon opened in process by the real startup path
//! (`service::Daemon::start`), over a real store.
//!
//! What this file proves: `/healthz`, `/readyz` (ready, stopping) and the 503
//! paths, in process with `oneshot`; ten clients polling every 20 ms on tokio's
//! paused clock are paced, never refused, and the store is read exactly once
//! per 200 ms interval (`Store::task_reads` counted at every round and every
//! due read; no timer is pending while the store thread reads, so the clock
//! never moves during one); `service::run`, the in-process entry point, serves
//! a real client over a listener the test bound and stops cleanly when its
//! shutdown future resolves

mod common;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Map, Value, json};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use taskgate::config::{Effect, Overrides, TaskMode};
use taskgate::http::App;
use taskgate::service::{Daemon, Options};
use taskgate::tasks::TaskService;
use taskgate::tools::{ArgumentError, RunError, RunFuture, Runner, ToolSpec};

struct Fixture {
    _root: tempfile::TempDir,
    /// Holds the state directory's lock until the test ends.
    _daemon: Daemon,
    svc: Arc<TaskService>,
    store: taskgate::store::Store,
    app: App,
    /// Notified when the `hold` tool has started a call.
    started: Arc<Notify>,
}

/// What a built-in tool of these tests does with a call.
#[derive(Debug)]
enum Behaviour {
    /// Announces the call, then runs until it is cancelled, so a test
    /// knows a request is in flight.
    Hold(Arc<Notify>),
    /// Answers at once.
    Quick,
}

#[derive(Debug)]
struct TestTool {
    spec: ToolSpec,
    behaviour: Behaviour,
}

fn test_tool(name: &str, task: TaskMode, behaviour: Behaviour) -> Arc<dyn Runner> {
    Arc::new(TestTool {
        spec: ToolSpec {
            name: name.into(),
            description: format!("{behaviour:?}"),
            input_schema: json!({"type": "object"}),
            effect: Effect::ReadOnly,
            task,
            shown: Default::default(),
        },
        behaviour,
    })
}

impl Runner for TestTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn validate(&self, _args: &Value) -> Result<(), ArgumentError> {
        Ok(())
    }

    fn run<'a>(
        &'a self,
        _args: &'a Map<String, Value>,
        _grace: Duration,
        cancel: &'a CancellationToken,
    ) -> RunFuture<'a> {
        Box::pin(async move {
            match &self.behaviour {
                Behaviour::Hold(started) => {
                    started.notify_one();
                    cancel.cancelled().await;
                    Err(RunError::Cancelled)
                }
                Behaviour::Quick => Ok(json!({"content": [{"type": "text", "text": "done"}]})),
            }
        })
    }
}

/// A daemon opened in process by the real startup path, with two built-in
/// tools; one `tools/call` at a time may be in flight.
fn fixture() -> Fixture {
    let root = common::private_dir();
    let state = common::state_dir(root.path());
    let config_path = root.path().join("taskgate.toml");
    std::fs::write(
        &config_path,
        "[server]\nmax_concurrent_requests = 1\n[tasks]\npoll_interval_ms = 200\n",
    )
    .unwrap_or_else(|e| panic!("{}: {e}", config_path.display()));
    let started = Arc::new(Notify::new());
    let hold = test_tool("hold", TaskMode::Never, Behaviour::Hold(started.clone()));
    // The same, as a task.
    let linger = test_tool(
        "linger",
        TaskMode::Optional,
        Behaviour::Hold(Arc::new(Notify::new())),
    );
    let daemon = Daemon::start(Options {
        overrides: Overrides {
            config_path: Some(config_path),
            state_dir: Some(state),
            listen: None,
        },
        builtins: vec![hold, linger],
        clock: None,
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("{e:?}"));
    Fixture {
        _root: root,
        svc: daemon.service().clone(),
        store: daemon.store().clone(),
        app: daemon.app(),
        _daemon: daemon,
        started,
    }
}

/// The whole body of a response, as text.
async fn text(response: axum::response::Response) -> String {
    let body = response
        .into_body()
        .collect()
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .to_bytes();
    String::from_utf8_lossy(&body).into_owned()
}

/// The whole body of a response, as JSON.
async fn json_body(response: axum::response::Response) -> Value {
    let text = text(response).await;
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

impl Fixture {
    /// One request through a clone of the real router.
    async fn send(&self, request: Request<Body>) -> axum::response::Response {
        self.app
            .router
            .clone()
            .oneshot(request)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Closes the store cleanly, as a stopping daemon does.
    async fn close(self) {
        self.store
            .shutdown()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

async fn get(app: &App, path: &str) -> (StatusCode, String) {
    let response = app
        .router
        .clone()
        .oneshot(
            Request::get(path)
                .body(Body::empty())
                .unwrap_or_else(|e| panic!("{e}")),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    (response.status(), text(response).await)
}

/// A 2026-07-28 request with the Tasks extension declared, as a client
/// that sends `Mcp-Method` but no `Mcp-Name` would.
fn tasks_request(method: &str, mut params: Value) -> Request<Body> {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "router-test", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": {
            "extensions": {"io.modelcontextprotocol/tasks": {}}
        }
    });
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params});
    let mut request = Request::post("/mcp")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, text/event-stream")
        .header(header::HOST, "127.0.0.1")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method);
    if let Some(name) = params["name"].as_str() {
        request = request.header("mcp-name", name);
    }
    request
        .body(Body::from(body.to_string()))
        .unwrap_or_else(|e| panic!("{e}"))
}

fn mcp_call(tool: &str) -> Request<Body> {
    let body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": tool, "arguments": {}, "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "router-test", "version": "0"},
            "io.modelcontextprotocol/clientCapabilities": {"extensions": {}}
        }}
    });
    Request::post("/mcp")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, text/event-stream")
        .header(header::HOST, "127.0.0.1")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", tool)
        .body(Body::from(body.to_string()))
        .unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test]
async fn healthz_answers_and_readyz_follows_the_service() {
    let fx = fixture();
    assert_eq!(
        get(&fx.app, "/healthz").await,
        (StatusCode::OK, "ok\n".into())
    );
    assert_eq!(
        get(&fx.app, "/readyz").await,
        (StatusCode::OK, "ready\n".into())
    );
    fx.svc.stop_admitting();
    let (status, body) = get(&fx.app, "/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.contains("stopping"), "{body}");
    // The process still answers while it stops.
    assert_eq!(get(&fx.app, "/healthz").await.0, StatusCode::OK);
    fx.close().await;
}

#[tokio::test]
async fn a_request_past_the_concurrency_bound_gets_a_json_rpc_503() {
    let fx = fixture();
    let router = fx.app.router.clone();
    let mut held = tokio::spawn(async move { router.oneshot(mcp_call("hold")).await });
    // The tool says it started: the one request slot is taken.
    tokio::select! {
        _ = fx.started.notified() => {}
        r = &mut held => {
            let response = r.unwrap_or_else(|e| panic!("{e}")).unwrap_or_else(|e| panic!("{e}"));
            let status = response.status();
            panic!("the held call ended before its tool started: {status} {}", text(response).await);
        }
    }
    let response = fx.send(mcp_call("hold")).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        response
            .headers()
            .get(header::RETRY_AFTER)
            .map(|v| v.as_bytes()),
        Some(&b"1"[..])
    );
    let body = json_body(response).await;
    assert_eq!(body["error"]["code"], taskgate::wire::SERVER_BUSY.code);
    assert_eq!(
        body["error"]["data"]["name"],
        taskgate::wire::SERVER_BUSY.name
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("server.max_concurrent_requests = 1")),
        "{body}"
    );

    // Stopping the service ends the held call with its interruption error.
    fx.svc.stop_running(Duration::from_secs(10)).await;
    let response = held
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|e| panic!("{e}"));
    let body = json_body(response).await;
    assert_eq!(
        body["error"]["data"]["name"],
        taskgate::wire::TASK_INTERRUPTED.name,
        "{body}"
    );
    fx.close().await;
}

#[tokio::test]
async fn a_call_while_stopping_is_refused_with_the_stopping_error() {
    let fx = fixture();
    // A call admitted by mistake runs `hold` until it is cancelled: a
    // bounded wait makes that a failure that says so, not a hung test.
    let refused = |request| async {
        tokio::time::timeout(Duration::from_secs(10), fx.send(request))
            .await
            .unwrap_or_else(|_| {
                panic!("a call while stopping was admitted: its tool ran instead of being refused")
            })
    };
    fx.svc.stop_admitting();
    let response = refused(mcp_call("hold")).await;
    let body = json_body(response).await;
    assert_eq!(
        body["error"]["code"],
        taskgate::wire::STOPPING.code,
        "{body}"
    );
    assert_eq!(body["error"]["data"]["name"], taskgate::wire::STOPPING.name);

    // Once the HTTP side has drained, a request on a connection still open
    // never reaches the protocol layer: it is told the server is stopping.
    let drain = fx.app.drain();
    assert!(drain.idle(Duration::from_secs(5)).await);
    let response = refused(mcp_call("hold")).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body = json_body(response).await;
    assert_eq!(
        body["error"]["code"],
        taskgate::wire::STOPPING.code,
        "{body}"
    );
    assert_eq!(body["error"]["data"]["name"], taskgate::wire::STOPPING.name);
    fx.close().await;
}

/// Ten clients poll one task every 20 ms, without `Mcp-Name` and without
/// knowing any of taskgate's codes, for five poll intervals (200 ms): every
/// poll is answered with the task, never an error, and the store is read
/// exactly once per interval, however fast they poll.
///
/// On tokio's paused clock: the clients' rounds fall at 10 ms past each
/// 20 ms step, between the instants a read is due (every 200 ms from the
/// first), and the clock moves only to the next timer once everything
/// that can answer has answered. While the store thread reads, no timer is
/// pending, so no read is stretched across a clock step: the count per
/// interval is exact, not a rate over a measured time.
#[tokio::test(start_paused = true)]
async fn early_polls_are_paced_never_refused_and_the_store_is_read_once_per_interval() {
    const CLIENTS: usize = 10;
    const INTERVAL: Duration = Duration::from_millis(200);
    const ROUND: Duration = Duration::from_millis(20);
    // The daemon holds at most half of `server.reserved_control_requests`
    // (16 by default) early polls at once, and one owner half of those.
    const HELD_PER_OWNER: usize = 16 / 2 / 2;
    let fx = fixture();
    // A failure guard in real time (a paused clock's timer would fire the
    // moment the runtime waits for the store thread).
    let hang = CancellationToken::new();
    {
        let hang = hang.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(60));
            hang.cancel();
        });
    }
    let created = json_body(
        fx.send(tasks_request(
            "tools/call",
            json!({"name": "linger", "arguments": {}}),
        ))
        .await,
    )
    .await;
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    assert_eq!(created["result"]["pollIntervalMs"], 200, "{created}");
    let id = created["result"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("no taskId: {created}"))
        .to_string();

    // One poll first: the task's pacing starts with the first answer (ten
    // first polls at the same instant would each read once). The next read
    // is due one interval from this instant.
    let start = tokio::time::Instant::now();
    let first = json_body(
        fx.send(tasks_request("tasks/get", json!({"taskId": id})))
            .await,
    )
    .await;
    assert_eq!(first["result"]["status"], "working", "{first}");
    assert_eq!(
        tokio::time::Instant::now(),
        start,
        "the clock moved during a read"
    );
    let reads_before = fx.store.task_reads();

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, StatusCode, Value)>();
    // A client polls again only once its last poll was answered.
    let mut waiting = [false; CLIENTS];
    let (mut fired, mut answered) = (0usize, 0usize);
    let mut answer = async |waiting: &mut [bool; CLIENTS], answered: &mut usize| {
        let (client, status, body) = tokio::select! {
            got = rx.recv() => got.unwrap_or_else(|| panic!("the pollers went away")),
            _ = hang.cancelled() => panic!("polls unanswered after 60 s: {waiting:?}"),
        };
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["result"]["taskId"], id.as_str(), "{body}");
        assert_eq!(body["result"]["status"], "working", "{body}");
        waiting[client] = false;
        *answered += 1;
    };
    for interval in 1..=5u32 {
        let due = start + INTERVAL * interval;
        for round in 0..10u32 {
            tokio::time::sleep_until(due - INTERVAL + ROUND / 2 + ROUND * round).await;
            for (client, busy) in waiting.iter_mut().enumerate() {
                if *busy {
                    continue;
                }
                *busy = true;
                fired += 1;
                let (router, id, tx) = (fx.app.router.clone(), id.clone(), tx.clone());
                tokio::spawn(async move {
                    let response = router
                        .oneshot(tasks_request("tasks/get", json!({"taskId": id})))
                        .await
                        .unwrap_or_else(|e| panic!("{e}"));
                    let status = response.status();
                    let _ = tx.send((client, status, json_body(response).await));
                });
            }
            // Early: every poll but the held ones is answered from memory
            // at once, and none reads the store.
            while answered < fired - HELD_PER_OWNER {
                answer(&mut waiting, &mut answered).await;
            }
            assert_eq!(
                fx.store.task_reads() - reads_before,
                u64::from(interval) - 1,
                "a poll read the store early, round {round} of interval {interval}"
            );
        }
        // The read falls due: the held polls wake, one of them reads.
        tokio::time::sleep_until(due).await;
        while answered < fired {
            answer(&mut waiting, &mut answered).await;
        }
        assert_eq!(
            fx.store.task_reads() - reads_before,
            u64::from(interval),
            "interval {interval}: not one store read"
        );
        // The read took no time on the clock (the timer wheel's
        // millisecond at most).
        assert!(tokio::time::Instant::now() - due < Duration::from_millis(1));
    }
    // Each interval: a round of every client (four of them held until the
    // read is due), then nine rounds of the others, each answered from
    // memory.
    let per_interval = CLIENTS + 9 * (CLIENTS - HELD_PER_OWNER);
    assert_eq!(answered, 5 * per_interval, "{answered} polls answered");
    fx.svc.stop_running(Duration::from_secs(10)).await;
    fx.close().await;
}

/// `service::run`, the in-process entry point: a daemon serving a listener
/// bound by the caller answers a real client over HTTP, and stops cleanly
/// (its store checkpointed and closed) when its shutdown future resolves.
#[test]
fn run_serves_a_listener_in_process_until_its_shutdown() {
    let root = common::private_dir();
    let state = common::state_dir(root.path());
    let quick = test_tool("quick", TaskMode::Never, Behaviour::Quick);
    let options = Options {
        overrides: Overrides {
            config_path: None,
            state_dir: Some(state.clone()),
            listen: None,
        },
        builtins: vec![quick],
        clock: None,
        ..Default::default()
    };
    let rt = common::runtime();
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let port = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("{e}"))
            .port();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(taskgate::service::run(listener, options, async move {
            let _ = stopped.await;
        }));
        let client = taskgate::client::Client::new(&format!("http://127.0.0.1:{port}/mcp"), false)
            .unwrap_or_else(|e| panic!("{e}"));
        // The daemon opens its store after the listener is bound: the first
        // call may arrive before it serves, and is answered once it does.
        let answer = client
            .call_tool("quick", json!({}), None)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(answer["content"][0]["text"], "done", "{answer}");
        let _ = stop.send(());
        let ended = tokio::time::timeout(Duration::from_secs(30), server)
            .await
            .unwrap_or_else(|_| panic!("run did not return after its shutdown"));
        assert!(matches!(ended, Ok(Ok(()))), "{ended:?}");
    });
    assert!(
        !state.join("tasks.db-wal").exists(),
        "the stop did not checkpoint and close the store"
    );
    assert!(state.join("tasks.db").exists());
}
