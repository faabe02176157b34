//! The operator surfaces render one operations layer: the admin socket
//! (`taskgate status`, `taskgate approvals`), `/admin/v1` and `/metrics`
//! show the same status and approvals of one daemon, number for number and
//! ID for ID, and a refusal is the same refusal on the socket and over
//! HTTP (its wire code, HTTP status and exit class from the one table in
//! `ops`). Run on the real binary, as an operator and a monitor meet it.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::tokens::{Token, secret, tokens_file};
use common::*;
use serde_json::{Value, json};
use taskgate::ops::OpsError;

/// (id, seed, tenant, subject, scopes)
const TOKENS: &[Token] = &[
    (
        "caller",
        'c',
        "acme",
        "caller",
        &[
            "tools:call",
            "taskgate:effect:non-idempotent-write",
            "tasks:read",
        ],
    ),
    (
        "ops",
        'o',
        "acme",
        "ops",
        &["approvals:read", "approvals:decide", "metrics:read"],
    ),
];

struct Fixture {
    _root: tempfile::TempDir,
    state: PathBuf,
    daemon: Daemon,
}

/// A daemon with credentials, a tool held for approval and a tool that
/// runs as a task.
fn start() -> Fixture {
    let root = private_dir();
    let (tokens, out) = (root.path().join("tokens.toml"), root.path().join("out"));
    tokens_file(&tokens, TOKENS);
    std::fs::create_dir_all(&out).unwrap();
    let auth = format!(
        "[auth]\ntokens_file = \"{}\"\n[approvals]\npoll_interval_ms = 5000\n",
        tokens.display()
    );
    let tools = [
        Tool::held_deploy(&out),
        Tool::new("ok").script("printf done").task("optional"),
    ];
    let cfg = write_config(root.path(), &auth, &tools);
    let state = state_dir(root.path());
    let daemon = Daemon::start(&cfg, &state, &root.path().join("daemon.log"));
    Fixture {
        _root: root,
        state,
        daemon,
    }
}

impl Fixture {
    fn client(&self, tasks: bool) -> taskgate::client::Client {
        self.daemon.client(tasks).with_token(Some(secret('c')))
    }

    /// One HTTP request as the administrator: (status, body).
    fn http(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        let port = self.daemon.port;
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            secret('o'),
            body.len()
        );
        let r = http::exchange_on(
            std::net::TcpStream::connect(("127.0.0.1", port)).unwrap(),
            request.as_bytes(),
            Duration::from_secs(30),
        )
        .answer();
        (r.status, r.text())
    }

    fn http_json(&self, method: &str, path: &str, body: &str) -> (u16, Value) {
        let (status, text) = self.http(method, path, body);
        let v = serde_json::from_str(text.trim())
            .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {text}"));
        (status, v)
    }

    /// `taskgate ARGS --state-dir STATE`, over the admin socket.
    fn cli(&self, args: &[&str]) -> std::process::Output {
        let mut all: Vec<&str> = args.to_vec();
        let state = self.state.to_string_lossy().into_owned();
        all.extend(["--state-dir", &state]);
        taskgate(&all, &[])
    }

    /// The `/metrics` exposition, as the monitor reads it.
    fn metrics(&self) -> prometheus_parse::Scrape {
        let (status, text) = self.http("GET", "/metrics", "");
        assert_eq!(status, 200, "{text}");
        prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
            .expect("a Prometheus exposition")
    }
}

/// The value of the one sample `name` with `labels`.
fn sample(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    let found: Vec<_> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .collect();
    assert_eq!(found.len(), 1, "{name}{labels:?}: {found:?}");
    match &found[0].value {
        prometheus_parse::Value::Gauge(v)
        | prometheus_parse::Value::Counter(v)
        | prometheus_parse::Value::Untyped(v) => *v,
        other => panic!("{name}: {other:?}"),
    }
}

fn ids(proposals: &Value) -> Vec<String> {
    proposals
        .as_array()
        .unwrap_or_else(|| panic!("no proposals: {proposals}"))
        .iter()
        .map(|p| p["id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_socket_the_http_admin_interface_and_metrics_show_one_status_and_its_approvals() {
    let f = start();
    let rt = runtime();

    // Two tasks run to their end, and two calls held for approval.
    let tasks = f.client(true);
    for _ in 0..2 {
        let handle = rt.block_on(tasks.call_tool("ok", json!({}), None)).unwrap();
        let id = handle["taskId"].as_str().unwrap().to_string();
        let done = rt.block_on(tasks.wait_task(&id, &handle)).unwrap();
        assert_eq!(done["status"], "completed", "{done}");
    }
    let plain = f.client(false);
    let mut held = Vec::new();
    for target in ["prod", "staging"] {
        let r = rt
            .block_on(plain.call_tool("deploy", json!({"target": target}), None))
            .unwrap();
        assert_eq!(r["structuredContent"]["status"], "approval_required", "{r}");
        held.push(
            r["structuredContent"]["proposal"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    // One of them decided over HTTP, so the journal has a decision too.
    let (status, body) = f.http_json(
        "POST",
        &format!("/admin/v1/approvals/{}/reject", held[1]),
        "{\"reason\": \"not today\"}",
    );
    assert_eq!(status, 200, "{body}");

    // The three surfaces, read with nothing happening in between.
    let status = admin_status(&f.state);
    let out = f.cli(&["approvals", "list", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let socket: Value = serde_json::from_slice(&out.stdout).unwrap();
    let (code, http) = f.http_json("GET", "/admin/v1/approvals", "");
    assert_eq!(code, 200, "{http}");
    let (code, http_pending) = f.http_json("GET", "/admin/v1/approvals?pending=true", "");
    assert_eq!(code, 200, "{http_pending}");
    let m = f.metrics();

    // Tasks: what the store counts, shown alike.
    let retained = status["tasks"]["retained"].as_u64().unwrap();
    let unexpired = status["tasks"]["unexpired"].as_u64().unwrap();
    assert!(retained >= 2, "{status}");
    assert_eq!(sample(&m, "taskgate_tasks_retained", &[]), retained as f64);
    let by_status: f64 = m
        .samples
        .iter()
        .filter(|s| s.metric == "taskgate_tasks")
        .map(|s| match s.value {
            prometheus_parse::Value::Gauge(v) | prometheus_parse::Value::Untyped(v) => v,
            _ => 0.0,
        })
        .sum();
    assert_eq!(
        by_status, unexpired as f64,
        "tasks by status against {status}"
    );
    assert_eq!(
        sample(&m, "taskgate_tasks", &[("status", "completed")]),
        2.0
    );
    // Runs, the store's queue, its state.
    assert_eq!(
        sample(&m, "taskgate_tool_runs_started_total", &[]),
        status["runs_started"].as_u64().unwrap() as f64
    );
    assert_eq!(
        sample(&m, "taskgate_tools_running", &[]),
        status["running"].as_u64().unwrap() as f64
    );
    assert_eq!(
        sample(&m, "taskgate_store_queue_capacity", &[]),
        status["queue"]["capacity"].as_u64().unwrap() as f64
    );
    assert_eq!(status["store"], "serving");
    assert_eq!(sample(&m, "taskgate_store_disabled", &[]), 0.0);

    // Approvals: the same journal, the same waiting count, the same IDs.
    let journal = &status["approvals"];
    assert_eq!(journal["pending"], 1, "{status}");
    for (surface, other) in [("socket", &socket["journal"]), ("http", &http["journal"])] {
        for field in ["directory", "pending", "records", "bytes", "head"] {
            assert_eq!(
                other[field], journal[field],
                "{surface}: journal.{field}: {other} against the status's {journal}"
            );
        }
    }
    assert_eq!(
        sample(&m, "taskgate_approvals_pending", &[]),
        journal["pending"].as_u64().unwrap() as f64
    );
    assert_eq!(sample(&m, "taskgate_approvals_disabled", &[]), 0.0);
    let listed = ids(&socket["proposals"]);
    assert_eq!(listed, ids(&http["proposals"]), "socket against HTTP");
    let mut sorted = listed.clone();
    sorted.sort();
    let mut want = held.clone();
    want.sort();
    assert_eq!(sorted, want);
    // The waiting one, by ID, on both; the rejected one on neither.
    assert_eq!(ids(&http_pending["proposals"]), vec![held[0].clone()]);
    let out = f.cli(&["approvals", "list", "--pending", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let socket_pending: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(ids(&socket_pending["proposals"]), vec![held[0].clone()]);
    // Field by field, one proposal as each surface shows it.
    for id in &held {
        let out = f.cli(&["approvals", "show", id, "--json"]);
        assert!(out.status.success(), "{out:?}");
        let one: Value = serde_json::from_slice(&out.stdout).unwrap();
        let (code, over_http) = f.http_json("GET", &format!("/admin/v1/approvals/{id}"), "");
        assert_eq!(code, 200, "{over_http}");
        assert_eq!(one["proposals"], over_http["proposals"], "{id}");
    }
}

/// What a surface answered for a refusal, next to what the one table
/// says it must be.
fn assert_same_refusal(
    f: &Fixture,
    socket_args: &[&str],
    method: &str,
    path: &str,
    body: &str,
    want: &OpsError,
) {
    let r = want.respond();
    let out = f.cli(socket_args);
    let line = one_line_stderr(&out);
    assert_eq!(
        out.status.code(),
        Some(i32::from(r.exit.code())),
        "the socket's exit for {want:?}: {line}"
    );
    let (status, body) = f.http_json(method, path, body);
    assert_eq!(status, r.http, "HTTP status for {want:?}: {body}");
    assert_eq!(body["error"]["code"], r.wire.code, "{body}");
    assert_eq!(body["error"]["data"]["name"], r.wire.name, "{body}");
    // The same words on both.
    let message = body["error"]["message"].as_str().unwrap();
    assert_eq!(message, want.to_string(), "{body}");
    assert!(line.ends_with(message), "{line:?} against {message:?}");
}

/// The table's row for `e`: (exit code, HTTP status, wire name), which is
/// what clients have always seen for it.
fn assert_row(e: &OpsError, row: (u8, u16, &str)) {
    let r = e.respond();
    assert_eq!((r.exit.code(), r.http, r.wire.name), row, "{e:?}");
}

#[test]
fn a_refusal_is_the_same_on_the_admin_socket_and_over_http() {
    let f = start();
    let rt = runtime();
    let unknown = "tgp-00000000000000000000000000000000";

    // An unknown proposal, approved: the table's row, and what clients
    // have always seen (exit 1; 404 TG_INVALID_PARAMS).
    let want = OpsError::UnknownProposal(unknown.into());
    assert_row(&want, (1, 404, "TG_INVALID_PARAMS"));
    assert_same_refusal(
        &f,
        &["approvals", "approve", unknown],
        "POST",
        &format!("/admin/v1/approvals/{unknown}/approve"),
        "",
        &want,
    );

    // A proposal decided over HTTP, decided again through both.
    let held = rt
        .block_on(
            f.client(false)
                .call_tool("deploy", json!({"target": "prod"}), None),
        )
        .unwrap();
    let id = held["structuredContent"]["proposal"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, body) = f.http_json(
        "POST",
        &format!("/admin/v1/approvals/{id}/reject"),
        "{\"reason\": \"no\"}",
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = f.http_json("POST", &format!("/admin/v1/approvals/{id}/approve"), "");
    assert_eq!(status, 409, "{body}");
    let message = body["error"]["message"].as_str().unwrap().to_string();
    let want = OpsError::DecisionRefused(message);
    assert_row(&want, (1, 409, "TG_INVALID_PARAMS"));
    assert_same_refusal(
        &f,
        &["approvals", "approve", &id],
        "POST",
        &format!("/admin/v1/approvals/{id}/approve"),
        "",
        &want,
    );
}
