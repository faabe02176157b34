//! The MCP Tasks extension through the real binary over both transports:
//! streamable HTTP on loopback and stdio on pipes. For each transport:
//! a task is created, polled (at its advertised interval) and completes
//! with the tool's output; a cancelled task ends `cancelled` and its whole
//! process group is gone; a legacy (`initialize`) client never sees the
//! extension; a client without Tasks runs optional tools synchronously and
//! is refused required ones; and another owner's, an expired and an unknown
//! task ID get byte-for-byte the same error.
//!
//! Every process runs behind a timeout and is killed when its guard drops.
//!
//! Invariant 11 of the map: Malformed input gets a JSON-RPC error with the code
//! the specification fixes, on every transport, and loses nothing: the
//! connection or session goes on. Guarded by:
//! `tests/mcp_transports.rs::{http,stdio}_malformed_messages_get_json_rpc_errors`
//! (over HTTP also all of them, then a good request, on one keep-alive
//! connection that none may close), `mcp::screen::tests`, `mcp::stdio::tests`;
//! the seeded fuzzer `tests/fuzz_requests.rs`
//!
//! What this file proves: HTTP and stdio: lifecycle, cancel kills the group,
//! legacy sessions, clients without Tasks, identical unknown/foreign/expired
//! answers, JSON-RPC errors for malformed messages

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::ChildStdin;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;
use serde_json::{Value, json};
use taskgate::store::{Clock, Digest, NewTask, Store, StoreOptions};
use taskgate::wire;

use common::mcp::{LEGACY, V2026};
/// Longest wait for any one response, startup or exit.
const STEP: Duration = Duration::from_secs(15);
/// The poll interval the test configuration advertises.
const POLL_MS: u64 = 200;

/// Tools: `slow_echo` (optional task: prints its text after 0.4 s),
/// `must_task` (required task) and `hang` (optional task: writes
/// "<shell pid> <background sleep pid>" to the marker file, then waits
/// on a 60 s background sleep).
fn tools() -> [common::Tool; 3] {
    use common::Tool;
    [
        Tool::new("slow_echo")
            .description("Prints its text after a moment.")
            .script(r#"/bin/sleep 0.4; printf "%s" "$0""#)
            .args(&["{text}"])
            .task("optional")
            .timeout_secs(30)
            .required("text", "string"),
        Tool::new("must_task")
            .description("Only runs as a task.")
            .argv(&["/bin/echo", "{text}"])
            .task("required")
            .timeout_secs(30)
            .required("text", "string"),
        Tool::new("hang")
            .description("Records its pids and waits on a background sleep.")
            .script(r#"/bin/sleep 60 & echo "$$ $!" > "$0"; wait"#)
            .args(&["{marker}"])
            .unconfined("its files sit beside the state directory")
            .task("optional")
            .timeout_secs(120)
            .required("marker", "string"),
    ]
}

// ---------------------------------------------------------------------------
// Scaffolding: a private directory with a config and a state dir.

struct Fixture {
    dir: tempfile::TempDir,
    config: PathBuf,
    state: PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = common::private_dir();
        let state = common::state_dir(dir.path());
        let config = common::write_config(
            dir.path(),
            &format!("[tasks]\npoll_interval_ms = {POLL_MS}\ncancel_grace_ms = 1000\n"),
            &tools(),
        );
        Fixture { dir, config, state }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// The real daemon with this fixture's config and state directory.
fn daemon(fx: &Fixture, log_name: &str, stdio: bool) -> common::Daemon {
    let mut opts = common::Daemon::builder()
        .config(&fx.config)
        .state_dir(&fx.state)
        .log(&fx.path(log_name))
        .env(
            taskgate::testhooks::HOLD_SWEEP_FILE_ENV,
            fx.path(HOLD_SWEEP_FILE),
        )
        .ready_within(STEP);
    if stdio {
        opts = opts.stdio();
    }
    opts.start()
}

/// One JSON-RPC response: its exact text and its parsed form.
#[derive(Debug)]
struct Reply {
    raw: String,
    msg: Value,
}

impl Reply {
    fn new(raw: String) -> Reply {
        let msg = serde_json::from_str(&raw)
            .unwrap_or_else(|e| panic!("response is not JSON ({e}): {raw}"));
        Reply { raw, msg }
    }

    fn result(&self) -> &Value {
        assert!(
            self.msg.get("error").is_none(),
            "expected a result, got: {}",
            self.raw
        );
        self.msg
            .get("result")
            .unwrap_or_else(|| panic!("response has no result: {}", self.raw))
    }

    fn error(&self) -> &Value {
        self.msg
            .get("error")
            .unwrap_or_else(|| panic!("expected an error, got: {}", self.raw))
    }

    fn code(&self) -> Option<i64> {
        self.msg.pointer("/error/code").and_then(Value::as_i64)
    }

    /// The `error` member exactly as the server serialised it.
    fn raw_error(&self) -> &str {
        raw_member(&self.raw, "error")
            .unwrap_or_else(|| panic!("no top-level error member in: {}", self.raw))
    }
}

/// End (exclusive) of the JSON value that starts at `i`.
fn value_end(b: &[u8], mut i: usize) -> usize {
    let (mut depth, mut in_str, mut esc) = (0usize, false, false);
    while i < b.len() {
        let c = b[i];
        if in_str {
            if esc {
                esc = false;
            } else if c == b'\\' {
                esc = true;
            } else if c == b'"' {
                in_str = false;
                if depth == 0 {
                    return i + 1;
                }
            }
        } else {
            match c {
                b'"' => in_str = true,
                b'{' | b'[' => depth += 1,
                b'}' | b']' => {
                    if depth == 0 {
                        return i;
                    }
                    depth -= 1;
                    if depth == 0 {
                        return i + 1;
                    }
                }
                b',' if depth == 0 => return i,
                _ => {}
            }
        }
        i += 1;
    }
    i
}

/// The raw text of a top-level member of a JSON object.
fn raw_member<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let b = text.as_bytes();
    let skip_ws = |mut i: usize| {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    };
    let mut i = skip_ws(0);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i += 1;
    let wanted = serde_json::to_string(key).unwrap();
    loop {
        i = skip_ws(i);
        if b.get(i) != Some(&b'"') {
            return None;
        }
        let key_end = value_end(b, i);
        let name = &text[i..key_end];
        i = skip_ws(key_end);
        if b.get(i) != Some(&b':') {
            return None;
        }
        let start = skip_ws(i + 1);
        let end = value_end(b, start);
        if name == wanted {
            return Some(text[start..end].trim_end());
        }
        i = skip_ws(end);
        if b.get(i) != Some(&b',') {
            return None;
        }
        i += 1;
    }
}

#[test]
fn raw_member_returns_a_member_exactly_as_written() {
    let text = r#"{"jsonrpc":"2.0","id":7,"error":{"code":-32602,"message":"a \"quoted\" }, value","data":{"x":[1,{"y":2}]}}}"#;
    assert_eq!(
        raw_member(text, "error"),
        Some(r#"{"code":-32602,"message":"a \"quoted\" }, value","data":{"x":[1,{"y":2}]}}"#)
    );
    assert_eq!(raw_member(text, "id"), Some("7"));
    assert_eq!(raw_member(text, "jsonrpc"), Some(r#""2.0""#));
    assert_eq!(raw_member(text, "result"), None);
}

/// `_meta` of a 2026-07-28 request, with or without the Tasks extension.
fn meta(tasks: bool) -> Value {
    common::mcp::meta("mcp-transports-test", tasks)
}

/// A way to talk to one daemon.
trait Wire {
    /// Sends a request and returns the response with the same id.
    fn send(&mut self, msg: Value) -> Reply;
    /// Sends a notification.
    fn notify(&mut self, msg: Value);
    fn next_id(&mut self) -> u64;
    /// Sends `text` exactly as given and returns the error answering it
    /// (whose id is `id`), with the HTTP status where there is one.
    fn send_text(&mut self, text: &str, id: &Value) -> (Option<u16>, Reply);
    /// As [`Wire::send_text`], over HTTP with `Mcp-Method: method` too.
    fn send_text_as(&mut self, text: &str, id: &Value, method: &str) -> (Option<u16>, Reply);
    /// Sends a request as [`Wire::send`] does and returns the response with
    /// the HTTP status where there is one.
    fn exchange(&mut self, msg: Value) -> (Option<u16>, Reply);
    fn log(&self) -> String;
    fn daemon_pid(&self) -> i32;

    /// A 2026-07-28 request (no session, no initialize).
    fn call(&mut self, method: &str, mut params: Value, tasks: bool) -> Reply {
        params["_meta"] = meta(tasks);
        let id = self.next_id();
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
    }

    /// A legacy request (after `initialize`): no `_meta`.
    fn legacy(&mut self, method: &str, params: Value) -> Reply {
        let id = self.next_id();
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
    }
}

// ---------------------------------------------------------------------------
// stdio: newline-delimited JSON-RPC on the child's stdin and stdout.

struct StdioWire {
    proc: common::Daemon,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    /// Responses that arrived while another was awaited.
    early: HashMap<String, String>,
    next: u64,
}

impl StdioWire {
    fn start(fx: &Fixture, log_name: &str) -> StdioWire {
        let mut proc = daemon(fx, log_name, true);
        let stdin = proc.child.stdin.take();
        let stdout = proc.child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        StdioWire {
            proc,
            stdin,
            lines,
            early: HashMap::new(),
            next: 1,
        }
    }

    fn write(&mut self, msg: &Value) {
        let stdin = self.stdin.as_mut().expect("stdin already closed");
        let mut line = serde_json::to_string(msg).unwrap();
        line.push('\n');
        stdin.write_all(line.as_bytes()).unwrap();
        stdin.flush().unwrap();
    }

    /// Closes stdin: the daemon must stop cleanly with exit 0.
    fn close_and_expect_clean_exit(mut self) {
        drop(self.stdin.take());
        let status = self.proc.wait_exit(STEP);
        assert_eq!(
            status.code(),
            Some(0),
            "closing stdin must stop the daemon cleanly ({status}); log:\n{}",
            self.proc.log_text()
        );
        let log = self.proc.log_text();
        assert!(log.contains("stopped cleanly"), "log:\n{log}");
    }
}

impl Wire for StdioWire {
    fn send(&mut self, msg: Value) -> Reply {
        let id = msg["id"].to_string();
        self.write(&msg);
        if let Some(raw) = self.early.remove(&id) {
            return Reply::new(raw);
        }
        let deadline = Instant::now() + STEP;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match self.lines.recv_timeout(left) {
                Ok(line) => line,
                Err(e) => panic!(
                    "no stdio response to {msg} ({e}); log:\n{}",
                    self.proc.log_text()
                ),
            };
            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                panic!("stdout carried a line that is not JSON: {line:?}");
            };
            // Notifications and server requests carry a method: ignore them.
            if v.get("method").is_some() || v.get("id").is_none() {
                continue;
            }
            let got = v["id"].to_string();
            if got == id {
                return Reply::new(line);
            }
            self.early.insert(got, line);
        }
    }

    fn notify(&mut self, msg: Value) {
        self.write(&msg);
    }

    fn send_text(&mut self, text: &str, id: &Value) -> (Option<u16>, Reply) {
        let stdin = self.stdin.as_mut().expect("stdin already closed");
        stdin.write_all(format!("{text}\n").as_bytes()).unwrap();
        stdin.flush().unwrap();
        let deadline = Instant::now() + STEP;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.lines.recv_timeout(left).unwrap_or_else(|e| {
                panic!(
                    "no stdio answer to {text:?} ({e}); log:\n{}",
                    self.proc.log_text()
                )
            });
            let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| {
                panic!("stdout carried a line that is not JSON ({e}): {line:?}")
            });
            if v.get("error").is_some() && &v["id"] == id {
                return (None, Reply::new(line));
            }
            if v.get("method").is_none() && v.get("id").is_some() {
                self.early.insert(v["id"].to_string(), line);
            }
        }
    }

    fn send_text_as(&mut self, text: &str, id: &Value, _method: &str) -> (Option<u16>, Reply) {
        self.send_text(text, id)
    }

    fn exchange(&mut self, msg: Value) -> (Option<u16>, Reply) {
        (None, self.send(msg))
    }

    fn next_id(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    fn log(&self) -> String {
        self.proc.log_text()
    }

    fn daemon_pid(&self) -> i32 {
        self.proc.pid().as_raw()
    }
}

// ---------------------------------------------------------------------------
// HTTP: one connection per POST to /mcp; JSON bodies or SSE streams.

struct HttpWire {
    proc: common::Daemon,
    port: u16,
    rt: tokio::runtime::Runtime,
    /// Set by a legacy `initialize`: the `Mcp-Session-Id` to send back.
    session: Option<String>,
    next: u64,
}

/// What one POST returned.
struct HttpReply {
    status: u16,
    session: Option<String>,
    /// The JSON-RPC message answering the request, if it was a request.
    message: Option<String>,
}

impl HttpWire {
    fn start(fx: &Fixture, log_name: &str) -> HttpWire {
        let proc = daemon(fx, log_name, false);
        let port = proc.port;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        HttpWire {
            proc,
            port,
            rt,
            session: None,
            next: 1,
        }
    }

    /// The headers streamable HTTP asks of this message.
    fn headers(&self, msg: &Value) -> Vec<(&'static str, String)> {
        let method = msg["method"].as_str().unwrap_or_default().to_string();
        let params = &msg["params"];
        let mut h = vec![
            ("content-type", "application/json".to_string()),
            ("accept", "application/json, text/event-stream".to_string()),
        ];
        let per_request = params
            .pointer("/_meta/io.modelcontextprotocol~1protocolVersion")
            .and_then(Value::as_str);
        if let Some(version) = per_request {
            h.push(("mcp-protocol-version", version.to_string()));
            let name = match method.as_str() {
                "tools/call" => params["name"].as_str(),
                m if m.starts_with("tasks/") => params["taskId"].as_str(),
                _ => None,
            };
            h.push(("mcp-method", method));
            if let Some(name) = name {
                h.push(("mcp-name", name.to_string()));
            }
        } else if method != "initialize" {
            h.push(("mcp-protocol-version", LEGACY.to_string()));
            if let Some(s) = &self.session {
                h.push(("mcp-session-id", s.clone()));
            }
        }
        h
    }

    fn post(&mut self, msg: &Value) -> HttpReply {
        let headers = self.headers(msg);
        let id = msg.get("id").cloned();
        let port = self.port;
        let body = serde_json::to_string(msg).unwrap();
        let exchange = post(port, headers, body, id);
        match self
            .rt
            .block_on(async { tokio::time::timeout(STEP, exchange).await })
        {
            Ok(r) => r,
            Err(_) => panic!(
                "no HTTP response to {msg} within {STEP:?}; log:\n{}",
                self.proc.log_text()
            ),
        }
    }

    /// Posts `text` as it is with `MCP-Protocol-Version: 2026-07-28` (and
    /// `Mcp-Method` when given) and returns the error answering it.
    fn post_text(&mut self, text: &str, id: &Value, method: Option<&str>) -> (Option<u16>, Reply) {
        let mut headers = vec![
            ("content-type", "application/json".to_string()),
            ("accept", "application/json, text/event-stream".to_string()),
            ("mcp-protocol-version", V2026.to_string()),
        ];
        if let Some(m) = method {
            headers.push(("mcp-method", m.to_string()));
        }
        let exchange = post(self.port, headers, text.to_string(), Some(id.clone()));
        let r = match self
            .rt
            .block_on(async { tokio::time::timeout(STEP, exchange).await })
        {
            Ok(r) => r,
            Err(_) => panic!("no HTTP response to {text:?} within {STEP:?}"),
        };
        let raw = r
            .message
            .unwrap_or_else(|| panic!("HTTP {} with no JSON-RPC body to {text:?}", r.status));
        (Some(r.status), Reply::new(raw))
    }

    /// SIGTERM: the daemon must stop cleanly with exit 0.
    fn stop_and_expect_clean_exit(mut self) {
        self.proc.signal(Signal::SIGTERM);
        let status = self.proc.wait_exit(STEP);
        assert_eq!(
            status.code(),
            Some(0),
            "SIGTERM must stop the daemon cleanly ({status}); log:\n{}",
            self.proc.log_text()
        );
        let log = self.proc.log_text();
        assert!(log.contains("stopped cleanly"), "log:\n{log}");
    }
}

/// An HTTP/1.1 connection to the daemon, driven by hyper's client.
async fn connect(port: u16) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect to taskgate");
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("HTTP handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender
}

async fn post(
    port: u16,
    headers: Vec<(&'static str, String)>,
    body: String,
    id: Option<Value>,
) -> HttpReply {
    let mut sender = connect(port).await;
    let mut req = Request::post("/mcp").header("host", format!("127.0.0.1:{port}"));
    for (k, v) in headers {
        req = req.header(k, v);
    }
    let req = req.body(Full::new(Bytes::from(body))).unwrap();
    let resp = sender.send_request(req).await.expect("HTTP request");
    let status = resp.status().as_u16();
    let session = resp
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let sse = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("text/event-stream"));
    let mut body = resp.into_body();
    let mut text = String::new();
    // An SSE stream may stay open after the answer: stop reading once it
    // has arrived.
    loop {
        if sse
            && let Some(id) = &id
            && let Some(m) = sse_message(&text, id)
        {
            return HttpReply {
                status,
                session,
                message: Some(m),
            };
        }
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    text.push_str(&String::from_utf8_lossy(data));
                }
            }
            Some(Err(e)) => panic!("reading the HTTP body: {e}; so far: {text}"),
            None => break,
        }
    }
    let message = if sse {
        id.as_ref().and_then(|id| sse_message(&text, id))
    } else if text.trim().is_empty() {
        None
    } else {
        Some(text.trim().to_string())
    };
    assert!(
        id.is_none() || message.is_some(),
        "HTTP {status} without a JSON-RPC response: {text:?}"
    );
    HttpReply {
        status,
        session,
        message,
    }
}

/// The `data:` line of a complete SSE event carrying the response to `id`.
fn sse_message(text: &str, id: &Value) -> Option<String> {
    let complete = &text[..text.rfind('\n')? + 1];
    complete.lines().find_map(|line| {
        let data = line.strip_prefix("data:")?.trim();
        let v: Value = serde_json::from_str(data).ok()?;
        (v.get("id") == Some(id) && (v.get("result").is_some() || v.get("error").is_some()))
            .then(|| data.to_string())
    })
}

impl Wire for HttpWire {
    fn send(&mut self, msg: Value) -> Reply {
        let r = self.post(&msg);
        if msg["method"] == "initialize" {
            assert!(
                r.session.is_some(),
                "a legacy initialize must open a session (Mcp-Session-Id)"
            );
            self.session = r.session.clone();
        }
        let raw = r.message.unwrap_or_else(|| {
            panic!(
                "HTTP {} with no JSON-RPC response to {msg}; log:\n{}",
                r.status,
                self.proc.log_text()
            )
        });
        Reply::new(raw)
    }

    fn send_text(&mut self, text: &str, id: &Value) -> (Option<u16>, Reply) {
        self.post_text(text, id, None)
    }

    fn send_text_as(&mut self, text: &str, id: &Value, method: &str) -> (Option<u16>, Reply) {
        self.post_text(text, id, Some(method))
    }

    fn exchange(&mut self, msg: Value) -> (Option<u16>, Reply) {
        let r = self.post(&msg);
        let raw = r.message.unwrap_or_else(|| {
            panic!(
                "HTTP {} with no JSON-RPC response to {msg}; log:\n{}",
                r.status,
                self.proc.log_text()
            )
        });
        (Some(r.status), Reply::new(raw))
    }

    fn notify(&mut self, msg: Value) {
        let r = self.post(&msg);
        assert!(
            (200..300).contains(&r.status),
            "notification refused with HTTP {}",
            r.status
        );
    }

    fn next_id(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    fn log(&self) -> String {
        self.proc.log_text()
    }

    fn daemon_pid(&self) -> i32 {
        self.proc.pid().as_raw()
    }
}

// ---------------------------------------------------------------------------
// Helpers shared by the scenarios.

/// Polls `tasks/get` at the advertised interval until the task is terminal.
fn poll_until_terminal(w: &mut dyn Wire, id: &str, limit: Duration) -> Value {
    let deadline = Instant::now() + limit;
    let mut wait = Duration::from_millis(POLL_MS);
    loop {
        std::thread::sleep(wait);
        let r = w.call("tasks/get", json!({"taskId": id}), true);
        let task = r.result().clone();
        assert_eq!(
            task["taskId"], id,
            "tasks/get answered another task: {task}"
        );
        if matches!(
            task["status"].as_str(),
            Some("completed" | "failed" | "cancelled")
        ) {
            return task;
        }
        assert_eq!(task["status"], "working", "unexpected status: {task}");
        wait = Duration::from_millis(task["pollIntervalMs"].as_u64().unwrap_or(POLL_MS));
        assert!(
            Instant::now() < deadline,
            "task {id} did not end within {limit:?}; log:\n{}",
            w.log()
        );
    }
}

/// Expects exactly the registered "no such task" error.
fn assert_unknown_task(r: &Reply, what: &str) {
    assert_eq!(r.code(), Some(wire::UNKNOWN_TASK.code), "{what}: {}", r.raw);
    assert_eq!(
        r.error().pointer("/data/name").and_then(Value::as_str),
        Some(wire::UNKNOWN_TASK.name),
        "{what}: {}",
        r.raw
    );
}

/// Expects `resultType: "task"` and returns the task ID.
fn created_task(r: &Reply) -> String {
    let res = r.result();
    assert_eq!(res["resultType"], "task", "expected a task: {}", r.raw);
    assert_eq!(res["status"], "working", "{}", r.raw);
    assert_eq!(res["pollIntervalMs"], POLL_MS, "{}", r.raw);
    let id = res["taskId"].as_str().expect("taskId").to_string();
    assert!(
        id.len() == 35 && id.starts_with("tg-"),
        "task ID has an unexpected shape: {id}"
    );
    id
}

// ---------------------------------------------------------------------------
// 1. create → poll → completed with the tool's output.

fn create_poll_complete(w: &mut dyn Wire, text: &str) {
    let r = w.call(
        "tools/call",
        json!({"name": "slow_echo", "arguments": {"text": text}}),
        true,
    );
    let id = created_task(&r);

    // Polling faster than pollIntervalMs is never refused: each early poll
    // is held until its read is due, so five back-to-back polls are all
    // answered and take at least four intervals.
    let started = Instant::now();
    for _ in 0..5 {
        let r = w.call("tasks/get", json!({"taskId": id}), true);
        assert_eq!(r.result()["taskId"], id.as_str(), "{}", r.raw);
    }
    assert!(
        started.elapsed() >= Duration::from_millis(4 * POLL_MS),
        "five back-to-back polls answered in {:?}: early polls were not held until due",
        started.elapsed()
    );

    let task = poll_until_terminal(w, &id, Duration::from_secs(10));
    assert_eq!(task["status"], "completed", "{task}");
    assert_eq!(task["result"]["content"][0]["type"], "text", "{task}");
    assert_eq!(task["result"]["content"][0]["text"], text, "{task}");
    assert_eq!(task["result"]["isError"], false, "{task}");
}

#[test]
fn http_task_is_created_polled_and_completes_with_the_result() {
    let fx = Fixture::new();
    let mut w = HttpWire::start(&fx, "http.log");
    create_poll_complete(&mut w, "hello over http");
    w.stop_and_expect_clean_exit();
}

#[test]
fn stdio_task_is_created_polled_and_completes_with_the_result() {
    let fx = Fixture::new();
    let mut w = StdioWire::start(&fx, "stdio.log");
    create_poll_complete(&mut w, "hello over stdio");
    w.close_and_expect_clean_exit();
}

// ---------------------------------------------------------------------------
// 2. cancel → cancelled, and the tool's whole process group is gone.

/// Makes this test process the reaper of orphaned descendants. The
/// background `sleep` of a killed tool is orphaned when its shell dies; if
/// nobody reaps it, it stays a zombie in its process group and
/// `kill(-pgid, 0)` keeps succeeding (PID 1 of some containers never
/// reaps). As the subreaper this process can reap exactly those pids.
fn become_subreaper() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| nix::sys::prctl::set_child_subreaper(true).expect("PR_SET_CHILD_SUBREAPER"));
}

/// Reaps `pid` if it became our (zombie) child; anything else is left alone.
fn reap(pid: i32) {
    let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
}

/// Every process whose process group is `pgid` ("pid (comm) state ppid"),
/// for diagnostics.
fn members_of_group(pgid: i32) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid pgrp ...
        let Some(after) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
            continue;
        };
        let fields: Vec<&str> = after.split_whitespace().collect();
        if fields.get(2).and_then(|p| p.parse::<i32>().ok()) == Some(pgid) {
            let head = &stat[..stat.rfind(')').unwrap_or(0) + 1];
            out.push(format!("{head} {} ppid={}", fields[0], fields[1]));
        }
    }
    out
}

/// The "<shell pid> <background sleep pid>" the `hang` tool writes into
/// its marker, a FIFO: reading blocks until the tool has written.
fn read_marker(marker: &common::Fifo) -> (i32, i32) {
    let text = marker.read(STEP);
    let pids: Vec<i32> = text
        .split_whitespace()
        .map(|p| p.parse().expect("marker holds pids"))
        .collect();
    assert_eq!(pids.len(), 2, "marker: {text:?}");
    (pids[0], pids[1])
}

fn cancel_kills_the_group(w: &mut dyn Wire, marker: &Path) {
    become_subreaper();
    let marker = common::Fifo::new(marker);
    let r = w.call(
        "tools/call",
        json!({"name": "hang", "arguments": {"marker": marker.path.to_str().unwrap()}}),
        true,
    );
    let id = created_task(&r);
    let (shell, sleeper) = read_marker(&marker);

    // The tool runs in a process group of its own (led by the daemon's
    // exec-tool shim), and its background sleep is in that group too.
    let pgid_of = |pid: i32| {
        nix::unistd::getpgid(Some(Pid::from_raw(pid)))
            .unwrap_or_else(|e| panic!("getpgid({pid}): {e}"))
            .as_raw()
    };
    let pgid = pgid_of(shell);
    assert_ne!(
        pgid,
        pgid_of(w.daemon_pid()),
        "the tool shares the daemon's process group"
    );
    assert_eq!(
        pgid_of(sleeper),
        pgid,
        "the background sleep is not in the tool's process group"
    );
    assert_eq!(kill(Pid::from_raw(-pgid), None), Ok(()), "group not alive");

    let ack = w.call("tasks/cancel", json!({"taskId": id}), true);
    assert_eq!(
        ack.result(),
        &json!({"resultType": "complete"}),
        "{}",
        ack.raw
    );

    let task = poll_until_terminal(w, &id, Duration::from_secs(10));
    assert_eq!(task["status"], "cancelled", "{task}");

    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        for pid in [sleeper, shell, pgid] {
            reap(pid);
        }
        match kill(Pid::from_raw(-pgid), None) {
            Err(Errno::ESRCH) => break,
            other if Instant::now() >= deadline => {
                let members = members_of_group(pgid);
                // Leave nothing behind when the product did.
                let _ = kill(Pid::from_raw(-pgid), Signal::SIGKILL);
                panic!(
                    "process group {pgid} still exists 5 s after the task was cancelled (kill -> {other:?}); members: {members:?}; log:\n{}",
                    w.log()
                );
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn http_cancel_ends_the_task_cancelled_and_its_process_group() {
    let fx = Fixture::new();
    let mut w = HttpWire::start(&fx, "http.log");
    cancel_kills_the_group(&mut w, &fx.path("pids"));
    w.stop_and_expect_clean_exit();
}

#[test]
fn stdio_cancel_ends_the_task_cancelled_and_its_process_group() {
    let fx = Fixture::new();
    let mut w = StdioWire::start(&fx, "stdio.log");
    cancel_kills_the_group(&mut w, &fx.path("pids"));
    w.close_and_expect_clean_exit();
}

// ---------------------------------------------------------------------------
// 3. A legacy client never sees the extension; tasks/* are method-not-found for it.

const UNKNOWN_ID: &str = "tg-0123456789abcdef0123456789abcdef";

/// The same daemon speaks Tasks to a 2026-07-28 client: `tasks/get` exists
/// (an unknown ID is "not found", not method-not-found) and `server/discover`
/// advertises the extension. So what the legacy client sees below is the
/// negotiation, not a missing feature.
fn tasks_exist_for_2026(w: &mut dyn Wire) {
    let r = w.call("tasks/get", json!({"taskId": UNKNOWN_ID}), true);
    assert_unknown_task(
        &r,
        "tasks/get on 2026-07-28 must exist and not know this ID",
    );
    let r = w.call("server/discover", json!({}), true);
    let caps = &r.result()["capabilities"];
    assert!(
        caps.pointer("/extensions/io.modelcontextprotocol~1tasks")
            .is_some(),
        "2026-07-28 discovery does not advertise Tasks: {}",
        r.raw
    );
}

fn legacy_sees_no_tasks(w: &mut dyn Wire) {
    let id = w.next_id();
    let init = w.send(json!({
        "jsonrpc": "2.0",
        "id": id,
        "method": "initialize",
        "params": {
            "protocolVersion": LEGACY,
            "capabilities": {},
            "clientInfo": {"name": "legacy-client", "version": "1"},
        },
    }));
    let res = init.result();
    assert_eq!(res["protocolVersion"], LEGACY, "{}", init.raw);
    let caps = res
        .get("capabilities")
        .unwrap_or_else(|| panic!("no capabilities: {}", init.raw));
    assert!(
        caps.pointer("/extensions/io.modelcontextprotocol~1tasks")
            .is_none(),
        "a legacy InitializeResult must not offer Tasks: {}",
        init.raw
    );
    let instructions = res["instructions"].as_str().unwrap_or_default();
    assert!(
        !instructions.contains("tasks/get"),
        "a legacy session cannot poll, yet its instructions say to: {instructions}"
    );
    w.notify(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));

    for method in ["tasks/get", "tasks/cancel"] {
        let r = w.legacy(method, json!({"taskId": UNKNOWN_ID}));
        assert_eq!(
            r.code(),
            Some(wire::METHOD_NOT_FOUND.code),
            "{method} on a legacy session must be method-not-found: {}",
            r.raw
        );
    }
}

#[test]
fn http_legacy_client_sees_no_extension_and_no_tasks_methods() {
    let fx = Fixture::new();
    let mut w = HttpWire::start(&fx, "http.log");
    tasks_exist_for_2026(&mut w);
    legacy_sees_no_tasks(&mut w);
    w.stop_and_expect_clean_exit();
}

#[test]
fn stdio_legacy_client_sees_no_extension_and_no_tasks_methods() {
    let fx = Fixture::new();
    let mut w = StdioWire::start(&fx, "stdio.log");
    tasks_exist_for_2026(&mut w);
    w.close_and_expect_clean_exit();

    // A legacy client is a separate process: initialize comes first.
    let mut w = StdioWire::start(&fx, "stdio-legacy.log");
    legacy_sees_no_tasks(&mut w);
    w.close_and_expect_clean_exit();
}

/// A client that goes away before it sent a request that picks a
/// lifecycle (nothing at all, or only the `server/discover` probe) is
/// still a client going away: the daemon stops cleanly with exit 0.
#[test]
fn stdio_closing_stdin_before_a_lifecycle_request_stops_cleanly() {
    let fx = Fixture::new();
    let w = StdioWire::start(&fx, "stdio-silent.log");
    w.close_and_expect_clean_exit();

    let mut w = StdioWire::start(&fx, "stdio-discover.log");
    let r = w.call("server/discover", json!({}), true);
    assert!(
        r.result()
            .pointer("/capabilities/extensions/io.modelcontextprotocol~1tasks")
            .is_some(),
        "{}",
        r.raw
    );
    w.close_and_expect_clean_exit();
}

// ---------------------------------------------------------------------------
// 4. Without Tasks: optional runs synchronously, required is refused.

fn without_tasks(w: &mut dyn Wire, text: &str) {
    let r = w.call(
        "tools/call",
        json!({"name": "slow_echo", "arguments": {"text": text}}),
        false,
    );
    let res = r.result();
    assert_eq!(res["resultType"], "complete", "{}", r.raw);
    assert_eq!(res["content"][0]["type"], "text", "{}", r.raw);
    assert_eq!(res["content"][0]["text"], text, "{}", r.raw);
    assert!(res.get("taskId").is_none(), "{}", r.raw);

    let r = w.call(
        "tools/call",
        json!({"name": "must_task", "arguments": {"text": text}}),
        false,
    );
    assert_eq!(r.code(), Some(wire::TASKS_REQUIRED.code), "{}", r.raw);
    assert!(
        r.error()
            .pointer("/data/requiredCapabilities/extensions/io.modelcontextprotocol~1tasks")
            .is_some(),
        "the missing-Tasks error must name the Tasks extension in data.requiredCapabilities: {}",
        r.raw
    );
}

#[test]
fn http_client_without_tasks_runs_optional_now_and_is_refused_required() {
    let fx = Fixture::new();
    let mut w = HttpWire::start(&fx, "http.log");
    without_tasks(&mut w, "sync over http");
    w.stop_and_expect_clean_exit();
}

#[test]
fn stdio_client_without_tasks_runs_optional_now_and_is_refused_required() {
    let fx = Fixture::new();
    let mut w = StdioWire::start(&fx, "stdio.log");
    without_tasks(&mut w, "sync over stdio");
    w.close_and_expect_clean_exit();
}

// ---------------------------------------------------------------------------
// 5. Foreign, expired and unknown IDs get the identical error.

const TTL_MS: i64 = 300;

/// While this file exists in the fixture, the daemon sweeps no expired row
/// (a test hook): the expired task is still a row when it is asked for, so
/// "expired" cannot quietly become "unknown".
const HOLD_SWEEP_FILE: &str = "hold-sweep";

/// Holds the daemon's expiry sweep for the fixture.
fn hold_sweep(fx: &Fixture) {
    std::fs::write(fx.path(HOLD_SWEEP_FILE), "").unwrap();
}

/// After the daemon stopped: the expired task is still a row of the store
/// (read with the store's clock set to when it was seeded, before it
/// expired), so the daemon answered for an expired task, not a swept one.
fn assert_still_a_row(state: &Path, expired: &str, seeded_ms: i64) {
    let rt = common::runtime();
    rt.block_on(async {
        let (clock, _) = Clock::manual(seeded_ms);
        let (store, _) = Store::open(StoreOptions {
            clock,
            ..StoreOptions::new(state.join("tasks.db"))
        })
        .unwrap();
        let id = taskgate::store::TaskId::parse(expired).unwrap();
        let row = store
            .get(&id, &taskgate::tasks::local_owner())
            .await
            .unwrap();
        assert!(
            row.is_some(),
            "the expired task was swept before it was asked for: the test compared an unknown ID with itself"
        );
        store.shutdown().await.unwrap();
    });
}

/// Before the daemon runs: one task of another owner, and one short-lived
/// task of the daemon's own (local) owner created a minute ago, so that it
/// has expired when the daemon opens the store (restart recovery fails a
/// task that was running, and a failed task that has not yet expired is
/// kept for TERMINAL_RETENTION_MS, 1 h). Returns (foreign, expired).
fn seed_tasks(state: &Path) -> (String, String, i64) {
    let seeded_ms = Clock::system().now_ms() - 60_000;
    let rt = common::runtime();
    rt.block_on(async {
        let (clock, _) = Clock::manual(seeded_ms);
        let (store, _) = Store::open(StoreOptions {
            clock,
            ..StoreOptions::new(state.join("tasks.db"))
        })
        .unwrap();
        let new = |owner: Digest, ttl_ms: i64| NewTask {
            proposal: None,
            owner,
            reference: None,
            request: None,
            ttl_ms,
            poll_interval_ms: POLL_MS as i64,
        };
        let foreign = store
            .create(new(Digest::of(b"someone-else"), 86_400_000))
            .await
            .unwrap()
            .record()
            .id
            .to_string();
        let expiring = store
            .create(new(taskgate::tasks::local_owner(), TTL_MS))
            .await
            .unwrap()
            .record()
            .id
            .to_string();
        store.shutdown().await.unwrap();
        (foreign, expiring, seeded_ms)
    })
}

fn ids_look_the_same(w: &mut dyn Wire, foreign: &str, expired: &str) {
    let unknown = UNKNOWN_ID;
    assert!(unknown != foreign && unknown != expired);
    for method in ["tasks/get", "tasks/cancel"] {
        let replies: Vec<(&str, Reply)> = [
            ("foreign", foreign),
            ("expired", expired),
            ("unknown", unknown),
        ]
        .into_iter()
        .map(|(what, id)| (what, w.call(method, json!({"taskId": id}), true)))
        .collect();
        let (_, first) = &replies[0];
        assert_unknown_task(
            first,
            &format!("{method} on another owner's task must be an unknown ID's error"),
        );
        for (what, r) in &replies[1..] {
            assert_eq!(
                r.raw_error(),
                first.raw_error(),
                "{method}: the {what} ID's error differs from the foreign ID's"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Malformed messages: JSON-RPC errors with the codes the specification
// fixes, and the connection or session goes on.

/// Malformed messages, each with the id its error echoes and its code.
fn malformed_cases() -> Vec<(String, Value, i64)> {
    let mut meta_only = json!({});
    meta_only["_meta"] = meta(true);
    let with = |extra: Value| {
        let mut p = meta_only.clone();
        for (k, v) in extra.as_object().unwrap() {
            p[k] = v.clone();
        }
        p
    };
    vec![
        ("{\"jsonrpc\": \"2.0\", \"id\": 1, ".into(), Value::Null, -32700),
        ("not json at all".into(), Value::Null, -32700),
        (
            r#"[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]"#.into(),
            Value::Null,
            -32600,
        ),
        (r#"{"jsonrpc":"2.0","id":31}"#.into(), json!(31), -32600),
        (
            r#"{"jsonrpc":"2.0","id":{"a":1},"method":"tools/list"}"#.into(),
            Value::Null,
            -32600,
        ),
        (
            json!({"jsonrpc": "2.0", "id": 32, "method": "tasks/get", "params": with(json!({"taskId": 123}))}).to_string(),
            json!(32),
            -32602,
        ),
        (
            json!({"jsonrpc": "2.0", "id": 33, "method": "tasks/cancel", "params": meta_only.clone()}).to_string(),
            json!(33),
            -32602,
        ),
        (
            json!({"jsonrpc": "2.0", "id": 34, "method": "tools/call", "params": with(json!({"name": "slow_echo", "arguments": [1]}))}).to_string(),
            json!(34),
            -32602,
        ),
        (
            json!({"jsonrpc": "2.0", "id": "s", "method": "tools/list", "params": [1]}).to_string(),
            json!("s"),
            -32602,
        ),
    ]
}

fn malformed_messages_get_json_rpc_errors(w: &mut dyn Wire) {
    let cases = malformed_cases();
    for (text, id, code) in &cases {
        let (status, reply) = w.send_text(text, id);
        assert_eq!(reply.code(), Some(*code), "{text} -> {}", reply.raw);
        let error = reply.error();
        assert!(
            error["data"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("TG_")),
            "{}",
            reply.raw
        );
        assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()));
        if let Some(status) = status {
            assert_eq!(status, 400, "{text} -> {}", reply.raw);
        }
    }
    // One byte past the default bound (1 MiB): refused whole, unread.
    let pad = "x".repeat(1 << 20);
    let huge = json!({"jsonrpc": "2.0", "id": 36, "method": "tools/list", "params": {"pad": pad}});
    let (status, reply) = w.send_text(&huge.to_string(), &Value::Null);
    assert_eq!(
        reply.code(),
        Some(-32600),
        "{}",
        &reply.raw[..200.min(reply.raw.len())]
    );
    assert_eq!(reply.error()["data"]["name"], "TG_REQUEST_TOO_LARGE");
    if let Some(status) = status {
        assert_eq!(status, 413);
    }
    // Nothing was lost: the next well-formed request is served.
    let r = w.call(
        "tools/call",
        json!({"name": "slow_echo", "arguments": {"text": "still here"}}),
        false,
    );
    assert!(
        r.result()["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("still here")),
        "{}",
        r.raw
    );
}

/// Every malformed message, then a well-formed request, on one HTTP/1.1
/// keep-alive connection: each gets its error and none closes the
/// connection (the body was read whole, so nothing stands in the way of
/// the next request), and the last is served.
async fn one_connection_outlives_malformed_messages(port: u16) {
    let mut sender = connect(port).await;
    let mut good = json!({"jsonrpc": "2.0", "id": 40, "method": "tools/list", "params": {}});
    good["params"]["_meta"] = meta(false);
    let mut messages: Vec<(String, Option<&str>)> = malformed_cases()
        .into_iter()
        .map(|(text, ..)| (text, None))
        .collect();
    messages.push((good.to_string(), Some("tools/list")));
    let last = messages.len() - 1;
    for (n, (text, method)) in messages.into_iter().enumerate() {
        if let Err(e) = sender.ready().await {
            panic!("the connection was closed before message {n}, {text}: {e}");
        }
        let mut req = Request::post("/mcp")
            .header("host", format!("127.0.0.1:{port}"))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", V2026);
        if let Some(m) = method {
            req = req.header("mcp-method", m);
        }
        let req = req.body(Full::new(Bytes::from(text.clone()))).unwrap();
        let resp = sender
            .send_request(req)
            .await
            .unwrap_or_else(|e| panic!("message {n}, {text}, on the kept connection: {e}"));
        let status = resp.status().as_u16();
        let closes = resp
            .headers()
            .get("connection")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let body = String::from_utf8_lossy(&body);
        assert!(!closes, "{text} -> {status} closes the connection: {body}");
        if n == last {
            assert_eq!(status, 200, "{body}");
            assert!(body.contains("slow_echo"), "{body}");
        } else {
            assert_eq!(status, 400, "{text} -> {body}");
        }
    }
}

#[test]
fn http_malformed_messages_get_json_rpc_errors() {
    let fx = Fixture::new();
    let mut w = HttpWire::start(&fx, "http.log");
    malformed_messages_get_json_rpc_errors(&mut w);
    let port = w.port;
    w.rt.block_on(async {
        tokio::time::timeout(STEP, one_connection_outlives_malformed_messages(port))
            .await
            .unwrap_or_else(|_| panic!("no answers on one connection within {STEP:?}"))
    });
    w.stop_and_expect_clean_exit();
}

#[test]
fn stdio_malformed_messages_get_json_rpc_errors() {
    let fx = Fixture::new();
    let mut w = StdioWire::start(&fx, "stdio.log");
    malformed_messages_get_json_rpc_errors(&mut w);
    w.close_and_expect_clean_exit();
}

#[test]
fn http_foreign_expired_and_unknown_ids_get_identical_errors() {
    let fx = Fixture::new();
    let (foreign, expired, seeded_ms) = seed_tasks(&fx.state);
    hold_sweep(&fx);
    let mut w = HttpWire::start(&fx, "http.log");
    ids_look_the_same(&mut w, &foreign, &expired);
    w.stop_and_expect_clean_exit();
    assert_still_a_row(&fx.state, &expired, seeded_ms);
}

#[test]
fn stdio_foreign_expired_and_unknown_ids_get_identical_errors() {
    let fx = Fixture::new();
    let (foreign, expired, seeded_ms) = seed_tasks(&fx.state);
    hold_sweep(&fx);
    let mut w = StdioWire::start(&fx, "stdio.log");
    ids_look_the_same(&mut w, &foreign, &expired);
    w.close_and_expect_clean_exit();
    assert_still_a_row(&fx.state, &expired, seeded_ms);
}

// ---------------------------------------------------------------------------
// Methods taskgate does not serve are method-not-found whatever their
// parameters; for a 2026-07-28 request, initialize and ping are such
// methods (the stateless binding answers them 404 over HTTP). A legacy
// initialize keeps opening a legacy session.

fn assert_method_not_found(status: Option<u16>, r: &Reply, id: &Value, http: u16, what: &str) {
    assert_eq!(
        r.code(),
        Some(wire::METHOD_NOT_FOUND.code),
        "{what}: {}",
        r.raw
    );
    assert_eq!(
        r.error()["data"]["name"],
        wire::METHOD_NOT_FOUND.name,
        "{what}: {}",
        r.raw
    );
    assert_eq!(
        &r.msg["id"], id,
        "{what}: the error must echo the id: {}",
        r.raw
    );
    if let Some(status) = status {
        assert_eq!(status, http, "{what}: {}", r.raw);
    }
}

fn modern_requests_for_methods_not_served_are_method_not_found(w: &mut dyn Wire) {
    let mut legacy_shaped_with_meta = json!({
        "protocolVersion": LEGACY,
        "capabilities": {},
        "clientInfo": {"name": "c", "version": "1"},
    });
    legacy_shaped_with_meta["_meta"] = meta(false);
    let mut cases: Vec<(&str, Option<Value>)> = vec![
        // The conformance suite's probe of a removed method.
        ("initialize", Some(json!({"_meta": meta(false)}))),
        ("initialize", Some(legacy_shaped_with_meta)),
        ("ping", Some(json!({"_meta": meta(false)}))),
    ];
    for method in ["tasks/result", "tasks/list"] {
        for params in [
            Some(json!({"_meta": meta(true)})),
            Some(json!({"_meta": meta(true), "taskId": UNKNOWN_ID})),
            Some(json!({})),
            Some(json!([])),
            Some(json!([UNKNOWN_ID])),
            None,
        ] {
            cases.push((method, params));
        }
    }
    for (method, params) in cases {
        let id = json!(w.next_id());
        let mut msg = json!({"jsonrpc": "2.0", "id": id, "method": method});
        if let Some(p) = &params {
            msg["params"] = p.clone();
        }
        // Over HTTP with MCP-Protocol-Version: 2026-07-28 and Mcp-Method;
        // over stdio the _meta alone declares the version (or nothing does).
        let (status, r) = w.send_text_as(&msg.to_string(), &id, method);
        assert_method_not_found(status, &r, &id, 404, &msg.to_string());
        // Without Mcp-Method, an HTTP request's headers do not mirror its
        // body: that is refused first, as for any method.
        let (status, r) = w.send_text(&msg.to_string(), &id);
        if let Some(status) = status {
            assert_eq!((status, r.code()), (400, Some(-32020)), "{msg}: {}", r.raw);
        }
    }
    // The daemon goes on serving what it serves.
    let r = w.call("tools/list", json!({}), true);
    assert!(r.result()["tools"].is_array(), "{}", r.raw);
}

fn legacy_initialize_still_opens_a_session_and_unserved_methods_are_not_found(w: &mut dyn Wire) {
    // rmcp's own client offers its newest version, 2026-07-28, inside a
    // legacy initialize: that is the handshake's offer, answered with the
    // newest legacy revision.
    let id = w.next_id();
    let init = w.send(json!({
        "jsonrpc": "2.0",
        "id": id,
        "method": "initialize",
        "params": {
            "protocolVersion": V2026,
            "capabilities": {},
            "clientInfo": {"name": "legacy-client", "version": "1"},
        },
    }));
    assert_eq!(init.result()["protocolVersion"], LEGACY, "{}", init.raw);
    w.notify(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    for method in ["tasks/result", "tasks/list"] {
        for params in [Some(json!({})), Some(json!([])), None] {
            let id = json!(w.next_id());
            let mut msg = json!({"jsonrpc": "2.0", "id": id, "method": method});
            if let Some(p) = params {
                msg["params"] = p;
            }
            let what = msg.to_string();
            // A legacy session gets its errors in a 200, as the library
            // answers it: a 404 would tell it the session has gone.
            let (status, r) = w.exchange(msg);
            assert_method_not_found(status, &r, &id, 200, &what);
        }
    }
    let r = w.legacy("ping", json!({}));
    assert_eq!(r.result(), &json!({}), "{}", r.raw);
    let r = w.legacy("tools/list", json!({}));
    assert!(r.result()["tools"].is_array(), "{}", r.raw);
}

#[test]
fn http_methods_not_served_are_method_not_found_whatever_their_params() {
    let fx = Fixture::new();
    let mut w = HttpWire::start(&fx, "http.log");
    modern_requests_for_methods_not_served_are_method_not_found(&mut w);
    legacy_initialize_still_opens_a_session_and_unserved_methods_are_not_found(&mut w);
    w.stop_and_expect_clean_exit();
}

#[test]
fn stdio_methods_not_served_are_method_not_found_whatever_their_params() {
    let fx = Fixture::new();
    let mut w = StdioWire::start(&fx, "stdio.log");
    modern_requests_for_methods_not_served_are_method_not_found(&mut w);
    w.close_and_expect_clean_exit();

    // A legacy client is a separate process: initialize comes first.
    let mut w = StdioWire::start(&fx, "stdio-legacy.log");
    legacy_initialize_still_opens_a_session_and_unserved_methods_are_not_found(&mut w);
    w.close_and_expect_clean_exit();
}
