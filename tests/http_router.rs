//! The HTTP application in process: `/healthz`, `/readyz` and the 503
//! paths, driven with `tower::ServiceExt::oneshot` against the real router
//! over a real store opened by the real startup path.

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

use taskgate::config::{Config, Effect, Overrides, TaskMode};
use taskgate::http::App;
use taskgate::tasks::{Limits, TaskService};
use taskgate::tools::{ArgumentError, Registry, RunError, RunFuture, Runner, ToolSpec};

struct Fixture {
    _root: tempfile::TempDir,
    svc: Arc<TaskService>,
    app: App,
    /// Notified when the `hold` tool has started a call.
    started: Arc<Notify>,
}

/// A built-in tool that announces each call and then runs until it is
/// cancelled, so a test knows a request is in flight.
#[derive(Debug)]
struct Hold {
    spec: ToolSpec,
    started: Arc<Notify>,
}

impl Runner for Hold {
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
            self.started.notify_one();
            cancel.cancelled().await;
            Err(RunError::Cancelled)
        })
    }
}

/// A daemon's pieces without its process, opened by the real startup path;
/// one request at a time may be in flight.
fn fixture() -> Fixture {
    let root = common::private_dir();
    let state = common::state_dir(root.path());
    let config_path = root.path().join("taskgate.toml");
    std::fs::write(
        &config_path,
        "[server]\nmax_concurrent_requests = 1\n[tasks]\npoll_interval_ms = 200\n",
    )
    .unwrap_or_else(|e| panic!("{}: {e}", config_path.display()));
    let overrides = Overrides {
        config_path: Some(config_path),
        state_dir: Some(state),
        listen: None,
    };
    let env = [("HOME".to_string(), "/nonexistent".to_string())]
        .into_iter()
        .collect();
    let config = Config::load_from(&overrides, &env).unwrap_or_else(|e| panic!("{e}"));
    let serving = taskgate::startup::open_serving(&config).unwrap_or_else(|e| panic!("{e:?}"));
    let started = Arc::new(Notify::new());
    let hold: Arc<dyn Runner> = Arc::new(Hold {
        spec: ToolSpec {
            name: "hold".into(),
            description: "runs until cancelled".into(),
            input_schema: json!({"type": "object"}),
            effect: Effect::ReadOnly,
            task: TaskMode::Never,
        },
        started: started.clone(),
    });
    // The same, as a task.
    let linger: Arc<dyn Runner> = Arc::new(Hold {
        spec: ToolSpec {
            name: "linger".into(),
            description: "runs until cancelled, as a task".into(),
            input_schema: json!({"type": "object"}),
            effect: Effect::ReadOnly,
            task: TaskMode::Optional,
        },
        started: Arc::new(Notify::new()),
    });
    let tools =
        Registry::build(&config.tools, &[], vec![hold, linger]).unwrap_or_else(|e| panic!("{e}"));
    let svc = TaskService::new(
        serving.store.clone(),
        tools,
        serving.artifacts,
        config.tasks.clone(),
        Limits {
            max_polls_tracked: 1000,
            max_sync_calls: 8,
            max_held_polls: 4,
        },
    );
    // The lifetime lock stays held for the rest of the test process.
    std::mem::forget(serving.claimed);
    let app = App::new(svc.clone(), &config.server);
    Fixture {
        _root: root,
        svc,
        app,
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
        self.svc
            .store()
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

/// Ten clients poll one task every 20 ms for a second, without `Mcp-Name`
/// and without knowing any of taskgate's codes: every poll is answered with
/// the task, never an error, and the store is read about once per
/// `pollIntervalMs` (200 ms), however fast they poll.
#[tokio::test]
async fn early_polls_are_paced_never_refused_and_the_store_is_read_once_per_interval() {
    let fx = fixture();
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
    // first polls at the same instant would each read once).
    let first = json_body(
        fx.send(tasks_request("tasks/get", json!({"taskId": id})))
            .await,
    )
    .await;
    assert_eq!(first["result"]["status"], "working", "{first}");
    let reads_before = fx.svc.store().task_reads();
    let started = tokio::time::Instant::now();
    let window = Duration::from_secs(1);
    let pollers: Vec<_> = (0..10)
        .map(|_| {
            let router = fx.app.router.clone();
            let id = id.clone();
            tokio::spawn(async move {
                let mut answered = 0u32;
                while started.elapsed() < window {
                    let request = tasks_request("tasks/get", json!({"taskId": id}));
                    let response = router
                        .clone()
                        .oneshot(request)
                        .await
                        .unwrap_or_else(|e| panic!("{e}"));
                    let status = response.status();
                    let body = json_body(response).await;
                    assert_eq!(status, StatusCode::OK, "{body}");
                    assert_eq!(body["result"]["taskId"], id.as_str(), "{body}");
                    assert_eq!(body["result"]["status"], "working", "{body}");
                    answered += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                answered
            })
        })
        .collect();
    let mut polls = 0;
    for poller in pollers {
        polls += poller.await.unwrap_or_else(|e| panic!("{e}"));
    }
    let elapsed = started.elapsed();
    let reads = fx.svc.store().task_reads() - reads_before;
    let intervals = elapsed.as_millis() as u64 / 200;
    eprintln!("{polls} polls in {elapsed:?}: {reads} store reads ({intervals} intervals)");
    assert!(
        reads <= intervals + 2,
        "{reads} store reads for {polls} polls in {elapsed:?}: more than one per 200 ms interval"
    );
    assert!(
        polls as u64 > 2 * reads,
        "only {polls} polls: the pollers did not poll faster than the store was read"
    );
    fx.svc.stop_running(Duration::from_secs(10)).await;
    fx.close().await;
}
