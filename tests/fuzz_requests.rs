//! A seeded, replayable request fuzzer against the real daemon: valid
//! requests of every kind a client sends (2026-07-28 stateless requests, a
//! legacy session, `GET`/`DELETE /mcp`, `/healthz`, `/readyz`) are mutated
//! (methods, parameter types, ids, the JSON-RPC version, the MCP headers,
//! content type and accept, bodies, framing) and sent as raw HTTP/1.1 over
//! loopback keep-alive connections, with the odd burst of garbage on a bare
//! TCP connection. A shorter run sends mutated lines to `serve --stdio`.
//!
//! The run fails when the daemon exits or logs a panic, answers with a 5xx
//! other than a 503 that says when to retry, leaves a request unanswered
//! for `RESPONSE_TIMEOUT`, grows its RSS by more than `RSS_GROWTH_BOUND`, or
//! cannot serve `/healthz`, a tool call and a poll afterwards; and, checked
//! on its own, when a non-2xx answer to a `POST /mcp` carries no JSON-RPC
//! error.
//!
//! Every request is a function of the seed and its index alone (task and
//! session IDs learnt from earlier answers are filled in when it is sent),
//! and requests go one at a time, so a failure printed with its seed and
//! index replays: `TASKGATE_FUZZ_SEED` sets the seed (CI runs with a fixed
//! one), `TASKGATE_FUZZ_REQUESTS` the number of HTTP requests,
//! `TASKGATE_FUZZ_LINES` the number of stdio lines; `TASKGATE_FUZZ_ONLY=N`
//! sends HTTP request N alone and `TASKGATE_FUZZ_TRACE=1` prints every
//! request with what came of it.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::http::{Outcome, Response};
use common::*;
use serde_json::{Value, json};

const SEED_ENV: &str = "TASKGATE_FUZZ_SEED";
const REQUESTS_ENV: &str = "TASKGATE_FUZZ_REQUESTS";
const LINES_ENV: &str = "TASKGATE_FUZZ_LINES";
const ONLY_ENV: &str = "TASKGATE_FUZZ_ONLY";
const TRACE_ENV: &str = "TASKGATE_FUZZ_TRACE";
/// The seed CI runs with; any other is taken from `SEED_ENV`.
const DEFAULT_SEED: u64 = 0x7a5c_9a7e_2026_0728;
const DEFAULT_REQUESTS: u64 = 20_000;
const DEFAULT_LINES: u64 = 2_000;
/// Longest wait for one answer while the connection is open. Every tool in
/// the configuration ends at once, so only a stuck daemon takes this long.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);
/// Requests sent before the baseline RSS is read: sessions, tasks, the
/// allocator's arenas and SQLite's page cache have all been touched by then.
const WARM_UP: u64 = 1_000;
/// RSS growth allowed between the end of warm-up and the end of the run.
/// What legitimately grows is bounded well below it: at most
/// `MAX_SESSIONS` legacy sessions (some 50 KiB each), the task rows and
/// results the store caches, and allocator fragmentation. A leak of 4 KiB a
/// request (76 MiB over the 19,000 requests after warm-up) fails it.
const RSS_GROWTH_BOUND: u64 = 64 * 1024 * 1024;
/// The body bound the daemon runs with: small, so that bodies on both sides
/// of it stay cheap to send and to parse.
const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// Few legacy sessions, which never expire during a run: the table fills
/// and `DELETE /mcp` empties it again, so which requests find it full
/// depends on the seed alone, not on how fast the machine is.
const MAX_SESSIONS: usize = 32;

/// An answer the daemon is known to get wrong: an open defect, matched on
/// the status and the start of the body. The run counts it apart instead
/// of failing on it; a full run with the default seed fails once it no
/// longer occurs, so that its entry goes when the defect is fixed.
struct KnownDefect {
    status: u16,
    body_starts: &'static str,
    why: &'static str,
}

/// 5xx answers that are open defects.
const KNOWN_5XX: &[KnownDefect] = &[];

/// Non-2xx answers to `POST /mcp` in plain text that are open defects.
const KNOWN_PLAIN_TEXT: &[KnownDefect] = &[];

/// The entry of `list` this answer is, if any.
fn known(list: &[KnownDefect], a: &Response) -> Option<usize> {
    list.iter()
        .position(|k| k.status == a.status && a.body.starts_with(k.body_starts.as_bytes()))
}

const V2026: &str = "2026-07-28";
const LEGACY: &str = "2025-11-25";
const TASKS_EXT: &str = "io.modelcontextprotocol/tasks";

/// `echo` runs as a task when the request declares Tasks, otherwise now;
/// `must` only ever runs as a task. Both end at once. Short header and
/// body timeouts end the requests the fuzzer leaves unfinished on purpose.
fn config(dir: &std::path::Path) -> std::path::PathBuf {
    write_config(
        dir,
        &format!(
            "[server]\nmax_request_bytes = {MAX_REQUEST_BYTES}\nheader_read_timeout_ms = 1000\n\
             body_read_timeout_ms = 1000\nmax_sessions = {MAX_SESSIONS}\nsession_idle_secs = 3600\n\n\
             [tasks]\npoll_interval_ms = 50\ncancel_grace_ms = 200\n"
        ),
        &[
            Tool::new("echo")
                .argv(&["/bin/echo", "{text}"])
                .task("optional")
                .timeout_secs(10)
                .required("text", "string"),
            Tool::new("must")
                .argv(&["/bin/echo", "done"])
                .task("required")
                .timeout_secs(10)
                .input(),
        ],
    )
}

// ---------------------------------------------------------------------------
// Randomness: splitmix64, one stream per request so that each request is a
// function of (seed, index) alone.

struct Rng(u64);

impl Rng {
    fn for_case(seed: u64, stream: u64, index: u64) -> Rng {
        let mut r = Rng(seed ^ stream.wrapping_mul(0xd1b5_4a32_d192_ed03));
        r.0 ^= r
            .next()
            .wrapping_add(index.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        r
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// True `percent` times in a hundred.
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

fn seed() -> u64 {
    match std::env::var(SEED_ENV) {
        Ok(s) => parse_u64(&s).unwrap_or_else(|| panic!("{SEED_ENV} must be a u64, got {s:?}")),
        Err(_) => DEFAULT_SEED,
    }
}

fn parse_u64(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(&hex.replace('_', ""), 16).ok(),
        None => s.replace('_', "").parse().ok(),
    }
}

fn count_from(key: &str, default: u64) -> u64 {
    match std::env::var(key) {
        Ok(s) => parse_u64(&s).unwrap_or_else(|| panic!("{key} must be a number, got {s:?}")),
        Err(_) => default,
    }
}

// ---------------------------------------------------------------------------
// What is learnt from answers and filled into later requests.

#[derive(Default)]
struct Learnt {
    tasks: Vec<String>,
    sessions: Vec<String>,
}

impl Learnt {
    fn task(&self, rng: &mut Rng) -> String {
        if self.tasks.is_empty() || rng.chance(10) {
            // Looks like an ID, names nothing.
            return "00000000000000000000000000".into();
        }
        self.tasks[self.tasks.len() - 1 - rng.below(self.tasks.len().min(8))].clone()
    }

    fn session(&self, rng: &mut Rng) -> Option<String> {
        if self.sessions.is_empty() {
            return None;
        }
        // Mostly the newest session, which is likeliest still open.
        let back = if rng.chance(70) {
            0
        } else {
            rng.below(self.sessions.len())
        };
        Some(self.sessions[self.sessions.len() - 1 - back].clone())
    }

    fn remember(list: &mut Vec<String>, id: String) {
        if !list.contains(&id) {
            list.push(id);
            if list.len() > 32 {
                list.remove(0);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// One request, as structure until it is rendered to the bytes sent.

#[derive(Clone, Copy, PartialEq, Debug)]
enum Framing {
    Length,
    /// No `Content-Length` and no chunking: the body is not a body.
    NoLength,
    /// `Content-Length` more than is sent; the client then closes its side.
    Longer(usize),
    /// `Content-Length` more than is sent, and the connection left open:
    /// the body-read timeout must end the request.
    Stalled(usize),
    /// `Content-Length` less than is sent: the rest is a next "request".
    Shorter(usize),
    Chunked,
    /// Chunked and a `Content-Length`, as request smuggling does.
    ChunkedAndLength,
    /// A chunk size that is not hex.
    BadChunk,
    /// `Content-Length` that is not a number.
    BadLength(&'static str),
    /// Two different `Content-Length` headers.
    TwoLengths,
}

struct Req {
    method: String,
    target: String,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
    framing: Framing,
    /// A well-formed HTTP request that reaches the application (as opposed
    /// to framing and head garbage that hyper deals with itself).
    well_formed: bool,
}

impl Req {
    fn new(method: &str, target: &str) -> Req {
        Req {
            method: method.into(),
            target: target.into(),
            headers: vec![("Host".into(), b"127.0.0.1".to_vec())],
            body: Vec::new(),
            framing: Framing::Length,
            well_formed: true,
        }
    }

    fn header(mut self, k: &str, v: &str) -> Req {
        self.headers.push((k.into(), v.as_bytes().to_vec()));
        self
    }

    fn remove(&mut self, k: &str) {
        self.headers.retain(|(h, _)| !h.eq_ignore_ascii_case(k));
    }

    fn set(&mut self, k: &str, v: &[u8]) {
        self.remove(k);
        self.headers.push((k.into(), v.to_vec()));
        // hyper refuses a head with a control character in a value (obs-text
        // above 0x7f passes): such a request never reaches the application.
        if v.iter().any(|&b| b == 0x7f || (b < 0x20 && b != b'\t')) {
            self.well_formed = false;
        }
    }

    fn get(&self, k: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(h, _)| h.eq_ignore_ascii_case(k))
            .map(|(_, v)| v.as_slice())
    }

    fn is_mcp_post(&self) -> bool {
        self.method == "POST" && self.target == "/mcp"
    }

    fn render(&self, rng_chunks: u64) -> Vec<u8> {
        let mut out = format!("{} {} HTTP/1.1\r\n", self.method, self.target).into_bytes();
        for (k, v) in &self.headers {
            out.extend_from_slice(k.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(v);
            out.extend_from_slice(b"\r\n");
        }
        let len = self.body.len();
        let mut body = self.body.clone();
        match self.framing {
            Framing::Length => {
                out.extend_from_slice(format!("Content-Length: {len}\r\n").as_bytes())
            }
            Framing::NoLength => {}
            Framing::Longer(n) | Framing::Stalled(n) => {
                out.extend_from_slice(format!("Content-Length: {}\r\n", len + n).as_bytes())
            }
            Framing::Shorter(n) => out.extend_from_slice(
                format!("Content-Length: {}\r\n", len.saturating_sub(n)).as_bytes(),
            ),
            Framing::Chunked | Framing::ChunkedAndLength | Framing::BadChunk => {
                out.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
                if self.framing == Framing::ChunkedAndLength {
                    out.extend_from_slice(format!("Content-Length: {len}\r\n").as_bytes());
                }
                body = chunked(&self.body, rng_chunks, self.framing == Framing::BadChunk);
            }
            Framing::BadLength(v) => {
                out.extend_from_slice(format!("Content-Length: {v}\r\n").as_bytes())
            }
            Framing::TwoLengths => out.extend_from_slice(
                format!("Content-Length: {len}\r\nContent-Length: {}\r\n", len + 1).as_bytes(),
            ),
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&body);
        out
    }
}

/// `body` in chunks of sizes drawn from `seed`.
fn chunked(body: &[u8], seed: u64, bad: bool) -> Vec<u8> {
    let mut rng = Rng(seed);
    let mut out = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let n = (1 + rng.below(4096)).min(rest.len());
        if bad && rng.chance(50) {
            out.extend_from_slice(b"zz\r\n");
        } else {
            out.extend_from_slice(format!("{n:x}\r\n").as_bytes());
        }
        out.extend_from_slice(&rest[..n]);
        out.extend_from_slice(b"\r\n");
        rest = &rest[n..];
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

/// What goes on the wire for one fuzz case.
struct Case {
    index: u64,
    /// The base request and the mutations applied, for reports.
    label: String,
    bytes: Vec<u8>,
    /// Sent alone on a fresh connection whose sending side is then closed
    /// (garbage and bodies shorter than announced): any answer, or none.
    raw: bool,
    /// The connection cannot carry another request after this one.
    last_on_connection: bool,
    /// A `POST /mcp` that reaches the application.
    mcp_post: bool,
    well_formed: bool,
    head_only: bool,
    /// A GET that may open a server-sent event stream that stays open.
    stream: bool,
    /// A raw case whose sending side stays open: the server must end it
    /// itself (an answer, or the header-read timeout).
    leave_open: bool,
    /// An unmutated stateless request: it must be served (2xx).
    control: bool,
    /// A body past `MAX_REQUEST_BYTES`: the server may answer before it has
    /// read it all and close, and the unread rest then resets the
    /// connection, which can discard the answer on the client's side.
    oversize: bool,
}

fn meta(tasks: bool) -> Value {
    let mut extensions = serde_json::Map::new();
    if tasks {
        extensions.insert(TASKS_EXT.into(), json!({}));
    }
    json!({
        "io.modelcontextprotocol/protocolVersion": V2026,
        "io.modelcontextprotocol/clientCapabilities": {"extensions": extensions},
        "io.modelcontextprotocol/clientInfo": {"name": "fuzz-requests", "version": "1"},
    })
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Base {
    ToolsList,
    CallNow,
    CallTask,
    CallRequired,
    TasksGet,
    TasksCancel,
    TasksUpdate,
    Initialize,
    Initialized,
    InSession,
    GetMcp,
    DeleteMcp,
    Healthz,
    Readyz,
}

/// Weighted: mostly the requests with the most to get wrong.
const BASES: &[(Base, usize)] = &[
    (Base::ToolsList, 8),
    (Base::CallNow, 12),
    (Base::CallTask, 10),
    (Base::CallRequired, 4),
    (Base::TasksGet, 12),
    (Base::TasksCancel, 6),
    (Base::TasksUpdate, 6),
    (Base::Initialize, 4),
    (Base::Initialized, 2),
    (Base::InSession, 8),
    (Base::GetMcp, 3),
    (Base::DeleteMcp, 2),
    (Base::Healthz, 3),
    (Base::Readyz, 3),
];

fn pick_base(rng: &mut Rng) -> Base {
    let total: usize = BASES.iter().map(|(_, w)| w).sum();
    let mut n = rng.below(total);
    for (b, w) in BASES {
        if n < *w {
            return *b;
        }
        n -= w;
    }
    unreachable!("weights sum to total")
}

/// The JSON-RPC message of a base request and the headers streamable HTTP
/// asks for it.
fn base_message(base: Base, id: u64, learnt: &Learnt, rng: &mut Rng) -> (Value, Req) {
    let post = || {
        Req::new("POST", "/mcp")
            .header("Content-Type", "application/json")
            .header("Accept", "application/json, text/event-stream")
    };
    let stateless = |method: &str, name: Option<&str>| {
        let r = post()
            .header("MCP-Protocol-Version", V2026)
            .header("Mcp-Method", method);
        match name {
            Some(n) => r.header("Mcp-Name", n),
            None => r,
        }
    };
    let request = |method: &str, params: Value| json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    let text = format!("fuzz {id}");
    match base {
        Base::ToolsList => (
            request("tools/list", json!({"_meta": meta(false)})),
            stateless("tools/list", None),
        ),
        Base::CallNow | Base::CallTask | Base::CallRequired => {
            let (tool, args) = if base == Base::CallRequired {
                ("must", json!({}))
            } else {
                ("echo", json!({"text": text}))
            };
            (
                request(
                    "tools/call",
                    json!({"name": tool, "arguments": args, "_meta": meta(base != Base::CallNow)}),
                ),
                stateless("tools/call", Some(tool)),
            )
        }
        Base::TasksGet | Base::TasksCancel | Base::TasksUpdate => {
            let task = learnt.task(rng);
            let (method, mut params) = match base {
                Base::TasksGet => ("tasks/get", json!({"taskId": task})),
                Base::TasksCancel => ("tasks/cancel", json!({"taskId": task})),
                _ => (
                    "tasks/update",
                    json!({"taskId": task, "inputResponses": {}}),
                ),
            };
            params["_meta"] = meta(true);
            (request(method, params), stateless(method, Some(&task)))
        }
        Base::Initialize => (
            request(
                "initialize",
                json!({
                    "protocolVersion": LEGACY,
                    "capabilities": {},
                    "clientInfo": {"name": "fuzz-legacy", "version": "1"},
                }),
            ),
            post(),
        ),
        Base::Initialized | Base::InSession => {
            let mut r = post().header("MCP-Protocol-Version", LEGACY);
            if let Some(s) = learnt.session(rng) {
                r = r.header("Mcp-Session-Id", &s);
            }
            let msg = match base {
                Base::Initialized => {
                    json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
                }
                _ if rng.chance(50) => request("tools/list", json!({})),
                _ => request(
                    "tools/call",
                    json!({"name": "echo", "arguments": {"text": text}}),
                ),
            };
            (msg, r)
        }
        Base::GetMcp | Base::DeleteMcp => {
            let verb = if base == Base::GetMcp {
                "GET"
            } else {
                "DELETE"
            };
            let mut r = Req::new(verb, "/mcp")
                .header("Accept", "text/event-stream")
                .header("MCP-Protocol-Version", LEGACY);
            if let Some(s) = learnt.session(rng) {
                r = r.header("Mcp-Session-Id", &s);
            }
            (Value::Null, r)
        }
        Base::Healthz => (Value::Null, Req::new("GET", "/healthz")),
        Base::Readyz => (Value::Null, Req::new("GET", "/readyz")),
    }
}

/// Raw JSON text spliced in where a placeholder string stands: numbers and
/// nesting `serde_json::Value` cannot hold.
struct Splices(Vec<Vec<u8>>);

impl Splices {
    fn add(&mut self, raw: Vec<u8>) -> Value {
        self.0.push(raw);
        Value::String(format!("@@splice{}@@", self.0.len() - 1))
    }

    fn render(&self, v: &Value) -> Vec<u8> {
        let mut out = serde_json::to_vec(v).unwrap();
        for (i, raw) in self.0.iter().enumerate().rev() {
            let marker = format!("\"@@splice{i}@@\"");
            if let Some(at) = find(&out, marker.as_bytes()) {
                out.splice(at..at + marker.len(), raw.iter().copied());
            }
        }
        out
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

const METHODS: &[&str] = &[
    "tools/list",
    "tools/call",
    "tasks/get",
    "tasks/cancel",
    "tasks/update",
    "tasks/list",
    "tasks/result",
    "initialize",
    "notifications/initialized",
    "notifications/cancelled",
    "ping",
    "server/discover",
    "resources/list",
    "prompts/get",
    "completion/complete",
    "logging/setLevel",
    "",
    "TOOLS/LIST",
    "tools/list ",
    "tools/call\u{0}",
    "rpc.discover",
    "tasks/",
    "$/cancelRequest",
];

/// A value of a random JSON type, now and then a large or deep one.
fn any_value(rng: &mut Rng, splices: &mut Splices) -> Value {
    match rng.below(16) {
        0 => Value::Null,
        1 => json!(true),
        2 => json!(0),
        3 => json!(-1),
        4 => json!(1.5),
        5 => json!(""),
        6 => json!("x"),
        7 => json!([]),
        8 => json!({}),
        9 => json!([1, "two", null]),
        10 => json!({"a": {"b": [1]}}),
        11 => huge_string(rng),
        12 => deep(rng, splices),
        13 => splices.add(rng.pick(RAW_NUMBERS).as_bytes().to_vec()),
        14 => json!("\u{0}\u{1f}\u{202e}\u{fffd}"),
        _ => splices.add(rng.pick(RAW_STRINGS).as_bytes().to_vec()),
    }
}

const RAW_NUMBERS: &[&str] = &[
    "123456789012345678901234567890",
    "18446744073709551616",
    "-9223372036854775809",
    "1e999",
    "-1e999",
    "-0",
    "0.000000000000000000000000000001",
    "9007199254740993",
    "1E+2",
    "4.0",
];

/// String literals serde_json must refuse or decode carefully.
const RAW_STRINGS: &[&str] = &[
    r#""\ud800""#,
    r#""\udc00\ud800""#,
    r#""\u0000""#,
    r#""\uZZZZ""#,
    r#""\x41""#,
    "\"tab\there\"",
    "\"\u{7f}\"",
];

fn huge_string(rng: &mut Rng) -> Value {
    // Inside the body bound, at its edge, and past it.
    let n = *rng.pick(&[1_000, 16_000, MAX_REQUEST_BYTES - 600, 70_000, 200_000]);
    let unit = *rng.pick(&["a", "é", "\u{1f600}", "\\", "\""]);
    Value::String(unit.repeat(n / unit.len()))
}

/// Nesting around the serde_json recursion limit (128), and far past it
/// within the body bound.
fn deep(rng: &mut Rng, splices: &mut Splices) -> Value {
    let depth = *rng.pick(&[64, 127, 128, 129, 500, 5_000, 30_000]);
    let raw = if rng.chance(50) {
        format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
    } else {
        format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth))
    };
    splices.add(raw.into_bytes())
}

/// The paths inside params worth breaking for each method.
fn param_paths(msg: &Value) -> Vec<Vec<&'static str>> {
    let mut paths = vec![vec!["_meta"]];
    let method = msg["method"].as_str().unwrap_or_default();
    match method {
        "tools/call" => {
            paths.extend([vec!["name"], vec!["arguments"], vec!["arguments", "text"]]);
        }
        "tasks/get" | "tasks/cancel" | "tasks/update" => {
            paths.extend([vec!["taskId"], vec!["inputResponses"]]);
        }
        "initialize" => {
            paths.extend([
                vec!["protocolVersion"],
                vec!["capabilities"],
                vec!["clientInfo"],
                vec!["clientInfo", "name"],
            ]);
        }
        _ => {}
    }
    if msg["params"].get("_meta").is_some() {
        paths.extend([
            vec!["_meta", "io.modelcontextprotocol/protocolVersion"],
            vec!["_meta", "io.modelcontextprotocol/clientCapabilities"],
            vec![
                "_meta",
                "io.modelcontextprotocol/clientCapabilities",
                "extensions",
            ],
            vec![
                "_meta",
                "io.modelcontextprotocol/clientCapabilities",
                "extensions",
                TASKS_EXT,
            ],
            vec!["_meta", "dev.taskgate/operationId"],
        ]);
    }
    paths
}

/// Sets (or with `None` removes) `params.<path>`, creating objects on the
/// way when they are missing.
fn set_param(msg: &mut Value, path: &[&str], v: Option<Value>) {
    let Some(obj) = msg.as_object_mut() else {
        return;
    };
    let mut cur = obj.entry("params").or_insert_with(|| json!({}));
    for key in &path[..path.len() - 1] {
        if !cur.is_object() {
            return;
        }
        cur = cur
            .as_object_mut()
            .unwrap()
            .entry(*key)
            .or_insert_with(|| json!({}));
    }
    let Some(last) = cur.as_object_mut() else {
        return;
    };
    let key = path[path.len() - 1];
    match v {
        Some(v) => {
            last.insert(key.into(), v);
        }
        None => {
            last.remove(key);
        }
    }
}

/// One mutation of the JSON-RPC message; returns its label.
fn mutate_message(msg: &mut Value, rng: &mut Rng, splices: &mut Splices) -> String {
    match rng.below(9) {
        0 => {
            let m = *rng.pick(METHODS);
            if rng.chance(85) {
                msg["method"] = json!(m);
                format!("method={m:?}")
            } else {
                msg["method"] = any_value(rng, splices);
                "method:type".into()
            }
        }
        1 => {
            let choice = rng.below(12);
            let v = match choice {
                0 => Value::Null,
                1 => json!({"a": 1}),
                2 => json!([1]),
                3 => json!(1.5),
                4 => json!(-1),
                5 => json!(""),
                6 => json!(true),
                7 => json!("x".repeat(10_000)),
                8 => splices.add(rng.pick(RAW_NUMBERS).as_bytes().to_vec()),
                9 => json!(u64::MAX),
                10 => json!(i64::MIN),
                _ => {
                    if let Some(o) = msg.as_object_mut() {
                        o.remove("id");
                    }
                    return "id:removed".into();
                }
            };
            msg["id"] = v;
            format!("id:{choice}")
        }
        2 => {
            let choices = [
                json!("1.0"),
                json!("2"),
                json!(2.0),
                json!(2),
                Value::Null,
                json!("2.0 "),
                json!("3.0"),
                json!(""),
            ];
            let v = rng.pick(&choices).clone();
            if rng.chance(20) {
                if let Some(o) = msg.as_object_mut() {
                    o.remove("jsonrpc");
                }
                "jsonrpc:removed".into()
            } else {
                msg["jsonrpc"] = v.clone();
                format!("jsonrpc={v}")
            }
        }
        3 => {
            if rng.chance(30) {
                if let Some(o) = msg.as_object_mut() {
                    o.remove("params");
                }
                "params:removed".into()
            } else {
                let choices = [json!([]), json!("x"), json!(1), Value::Null, json!(true)];
                let v = rng.pick(&choices);
                msg["params"] = v.clone();
                format!("params={v}")
            }
        }
        4..=6 => {
            let paths = param_paths(msg);
            let path = rng.pick(&paths).clone();
            if rng.chance(30) {
                set_param(msg, &path, None);
                format!("params.{}:removed", path.join("."))
            } else {
                let v = any_value(rng, splices);
                set_param(msg, &path, Some(v));
                format!("params.{}:replaced", path.join("."))
            }
        }
        7 => {
            let v = any_value(rng, splices);
            let key = *rng.pick(&["extra", "__proto__", "", "_meta", "params", "result"]);
            if let Some(o) = msg.as_object_mut() {
                o.insert(key.into(), v);
            }
            format!("member {key:?} added")
        }
        _ => {
            let version = *rng.pick(&[LEGACY, "2099-01-01", "", "2026-07-28\u{0}", "2026-7-28"]);
            set_param(
                msg,
                &["_meta", "io.modelcontextprotocol/protocolVersion"],
                Some(json!(version)),
            );
            format!("protocolVersion={version:?}")
        }
    }
}

const MCP_HEADERS: &[&str] = &["Mcp-Method", "Mcp-Name", "MCP-Protocol-Version"];

/// One mutation of the headers; returns its label.
fn mutate_headers(req: &mut Req, rng: &mut Rng) -> String {
    match rng.below(10) {
        0 => {
            let h = *rng.pick(MCP_HEADERS);
            req.remove(h);
            format!("{h}:removed")
        }
        1 => {
            let h = *rng.pick(MCP_HEADERS);
            let v = *rng.pick(&[
                "tools/call",
                "tools/list",
                "tasks/get",
                "initialize",
                "echo",
                "nope",
                LEGACY,
                V2026,
                "2099-01-01",
                "",
                "garbage\u{7f}",
            ]);
            req.set(h, v.as_bytes());
            format!("{h}={v:?}")
        }
        2 => {
            let h = *rng.pick(MCP_HEADERS);
            let v = req
                .get(h)
                .map(<[u8]>::to_vec)
                .unwrap_or_else(|| b"tools/call".to_vec());
            let v = if rng.chance(50) {
                v
            } else {
                b"tasks/cancel".to_vec()
            };
            req.headers.push((h.into(), v));
            format!("{h}:duplicated")
        }
        3 => {
            let v = *rng.pick(&[
                "",
                "text/plain",
                "application/json; charset=utf-8",
                "application/jsonx",
                "APPLICATION/JSON",
                "multipart/form-data; boundary=x",
                "application/json, text/plain",
            ]);
            if rng.chance(25) {
                req.remove("Content-Type");
                "content-type:removed".into()
            } else {
                req.set("Content-Type", v.as_bytes());
                format!("content-type={v:?}")
            }
        }
        4 => {
            let v = *rng.pick(&[
                "application/json",
                "text/event-stream",
                "*/*",
                "application/json, text/event-stream;q=0",
                "text/html",
                "",
            ]);
            if rng.chance(25) {
                req.remove("Accept");
                "accept:removed".into()
            } else {
                req.set("Accept", v.as_bytes());
                format!("accept={v:?}")
            }
        }
        5 => {
            let v: Vec<u8> = match rng.below(5) {
                0 => b"bogus".to_vec(),
                1 => b"".to_vec(),
                2 => "a".repeat(8_000).into_bytes(),
                3 => b"\xff\xfe session".to_vec(),
                _ => b"0123456789abcdef0123456789abcdef".to_vec(),
            };
            req.set("Mcp-Session-Id", &v);
            "bogus session id".into()
        }
        6 => {
            req.headers
                .push(("Expect".into(), b"100-continue".to_vec()));
            "expect:100-continue".into()
        }
        7 => {
            req.remove("Host");
            "host:removed".into()
        }
        8 => {
            // Past hyper's head limits: answered by hyper, not the app.
            req.well_formed = false;
            if rng.chance(50) {
                req.headers
                    .push(("X-Big".into(), "b".repeat(200_000).into_bytes()));
                "header:huge".into()
            } else {
                for i in 0..150 {
                    req.headers.push((format!("X-H{i}"), b"1".to_vec()));
                }
                "headers:150".into()
            }
        }
        _ => {
            let (m, t) = *rng.pick(&[
                ("PUT", "/mcp"),
                ("PATCH", "/mcp"),
                ("OPTIONS", "/mcp"),
                ("HEAD", "/mcp"),
                ("POST", "/mcp/"),
                ("POST", "/MCP"),
                ("POST", "/mcp?x=1"),
                ("POST", "//mcp"),
                ("POST", "/healthz"),
                ("GET", "/"),
                ("POST", "http://127.0.0.1/mcp"),
                ("GET", "/readyz?verbose"),
                ("TRACE", "/mcp"),
            ]);
            req.method = m.into();
            req.target = t.into();
            format!("{m} {t}")
        }
    }
}

/// One mutation of the body bytes; returns its label.
fn mutate_body(body: &mut Vec<u8>, rng: &mut Rng) -> String {
    match rng.below(9) {
        0 => {
            let at = rng.below(body.len());
            body.truncate(at);
            format!("body:truncated@{at}")
        }
        1 => {
            let choices: [&[u8]; 6] = [
                b"\xff",
                b"\xc3\x28",
                b"\xed\xa0\x80",
                b"\xf4\x90\x80\x80",
                b"\xc0\xaf",
                b"\x00",
            ];
            let bad = *rng.pick(&choices);
            // Inside a string value, where serde_json checks UTF-8.
            let at = match find(body, b"\"fuzz") {
                Some(i) if rng.chance(70) => i + 1,
                _ => rng.below(body.len() + 1),
            };
            body.splice(at..at, bad.iter().copied());
            "body:invalid-utf8".into()
        }
        2 => {
            let choices: [&[u8]; 12] = [
                b"hello",
                b"<?xml version=\"1.0\"?><a/>",
                b"{'jsonrpc': '2.0'}",
                b"nul",
                b"\x00\x00\x00\x00",
                b"{",
                b"}",
                b"\"string\"",
                b"42",
                b"null",
                b"{}",
                b"{\"jsonrpc\":\"2.0\"}",
            ];
            *body = rng.pick(&choices).to_vec();
            "body:not-json-rpc".into()
        }
        3 => {
            let one = body.clone();
            body.clear();
            body.push(b'[');
            let n = rng.below(3);
            for i in 0..n {
                if i > 0 {
                    body.push(b',');
                }
                body.extend_from_slice(&one);
            }
            body.push(b']');
            format!("body:batch of {n}")
        }
        4 => {
            body.clear();
            "body:empty".into()
        }
        5 => {
            let choices: [&[u8]; 4] = [b"}", b" garbage", b"\n{}", b"\x00"];
            let tail = *rng.pick(&choices);
            body.extend_from_slice(tail);
            "body:trailing bytes".into()
        }
        6 => {
            let mut v = b"\xef\xbb\xbf".to_vec();
            v.extend_from_slice(body);
            *body = v;
            "body:BOM".into()
        }
        7 => {
            let n = rng.below(body.len().max(1));
            for _ in 0..1 + rng.below(8) {
                if !body.is_empty() {
                    let at = rng.below(body.len());
                    body[at] = (rng.next() & 0xff) as u8;
                }
            }
            format!("body:bytes flipped near {n}")
        }
        _ => {
            let mut v = vec![b' '; rng.below(2_000)];
            v.extend_from_slice(body);
            v.extend(std::iter::repeat_n(b'\n', rng.below(100)));
            *body = v;
            "body:whitespace".into()
        }
    }
}

/// Garbage on a bare connection.
fn raw_garbage(rng: &mut Rng) -> (Vec<u8>, String) {
    match rng.below(12) {
        0 => {
            let n = 1 + rng.below(4096);
            ((0..n).map(|_| (rng.next() & 0xff) as u8).collect(), format!("raw:{n} random bytes"))
        }
        1 => (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec(), "raw:h2 preface".into()),
        2 => (b"GET /healthz HTTP/1.0\r\n\r\n".to_vec(), "raw:http/1.0".into()),
        3 => (b"GET /healthz HTTP/9.9\r\nHost: x\r\n\r\n".to_vec(), "raw:http/9.9".into()),
        4 => (b"\r\n\r\n\r\n\r\n".to_vec(), "raw:blank lines".into()),
        5 => (
            format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(70_000)).into_bytes(),
            "raw:huge uri".into(),
        ),
        6 => (
            b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".to_vec(),
            "raw:head cut short".into(),
        ),
        7 => (b"BREW /mcp HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), "raw:BREW".into()),
        8 => (
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nX: a\r\n b\r\n\r\n".to_vec(),
            "raw:folded header".into(),
        ),
        9 => (
            b"CONNECT 127.0.0.1:1 HTTP/1.1\r\nHost: 127.0.0.1:1\r\n\r\n".to_vec(),
            "raw:CONNECT".into(),
        ),
        10 => (
            b"GET /healthz HTTP/1.1\nHost: x\n\n".to_vec(),
            "raw:bare LF".into(),
        ),
        _ => (
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
                .to_vec(),
            "raw:CL+TE".into(),
        ),
    }
}

/// Request `index` of the run with `seed`.
fn make_case(seed: u64, index: u64, learnt: &Learnt) -> Case {
    let mut rng = Rng::for_case(seed, 1, index);
    if rng.chance(2) {
        let (bytes, mut label) = raw_garbage(&mut rng);
        // Rarely: each such case costs up to the header-read timeout.
        let leave_open = rng.chance(3);
        if leave_open {
            label.push_str(" (left open)");
        }
        return Case {
            index,
            label,
            bytes,
            raw: true,
            last_on_connection: true,
            mcp_post: false,
            well_formed: false,
            head_only: false,
            stream: false,
            leave_open,
            control: false,
            oversize: false,
        };
    }
    let base = pick_base(&mut rng);
    let (mut msg, mut req) = base_message(base, index + 1, learnt, &mut rng);
    let mut labels = vec![format!("{base:?}")];
    let mut splices = Splices(Vec::new());
    let has_body = !msg.is_null();
    // One request in eight stays valid: the control that proves the
    // daemon still does its job between the broken ones.
    let mutations = if rng.chance(12) { 0 } else { 1 + rng.below(3) };
    let mut body_mutations = Vec::new();
    for _ in 0..mutations {
        match rng.below(10) {
            0..=4 if has_body => labels.push(mutate_message(&mut msg, &mut rng, &mut splices)),
            5..=7 => labels.push(mutate_headers(&mut req, &mut rng)),
            _ if has_body => body_mutations.push(rng.next()),
            _ => labels.push(mutate_headers(&mut req, &mut rng)),
        }
    }
    if has_body {
        req.body = splices.render(&msg);
        for s in body_mutations {
            labels.push(mutate_body(&mut req.body, &mut Rng(s)));
        }
    }
    let mut raw = false;
    let mut last = false;
    // Rarely, as each costs `server.body_read_timeout_ms`: a request whose
    // body stops short on an open connection, which the server must answer
    // (408) and close.
    if mutations > 0 && rng.below(1000) == 0 {
        let framing = Framing::Stalled(1 + rng.below(1000));
        req.framing = framing;
        labels.push(format!("framing:{framing:?}"));
        last = true;
    } else if mutations > 0 && rng.chance(8) {
        let (longer, shorter) = (1 + rng.below(100_000), 1 + rng.below(20));
        let framing = *rng.pick(&[
            Framing::NoLength,
            Framing::Longer(longer),
            Framing::Shorter(shorter),
            Framing::Chunked,
            Framing::Chunked,
            Framing::ChunkedAndLength,
            Framing::BadChunk,
            Framing::BadLength("abc"),
            Framing::BadLength("-1"),
            Framing::BadLength("99999999999999999999999"),
            Framing::TwoLengths,
        ]);
        req.framing = framing;
        labels.push(format!("framing:{framing:?}"));
        match framing {
            Framing::Chunked => {}
            // The body bytes follow a request that has none: the server
            // reads them as the next request.
            Framing::NoLength => last = true,
            Framing::Longer(_) | Framing::BadChunk => {
                // A body that never completes is followed by the end of
                // the connection: without it the server would rightly
                // wait for the rest.
                raw = true;
                last = true;
                req.well_formed = false;
            }
            _ => {
                last = true;
                req.well_formed = false;
            }
        }
    }
    let huge_head = labels.iter().any(|l| l.starts_with("header"));
    let bytes = req.render(rng.next());
    let stateless = !matches!(
        base,
        Base::Initialize | Base::Initialized | Base::InSession | Base::GetMcp | Base::DeleteMcp
    );
    Case {
        index,
        label: labels.join(" "),
        bytes,
        raw,
        last_on_connection: last || huge_head,
        mcp_post: req.is_mcp_post() && req.well_formed,
        well_formed: req.well_formed,
        head_only: req.method == "HEAD",
        stream: req.method == "GET" && req.target == "/mcp",
        leave_open: false,
        control: mutations == 0 && req.framing == Framing::Length && stateless,
        oversize: req.body.len() > MAX_REQUEST_BYTES,
    }
}

// ---------------------------------------------------------------------------
// Reading on raw connections.

/// How the answer to `case` is read: an event stream only until it carries
/// its answer, a GET's stream only its head.
fn reading(case: &Case) -> http::Reading {
    http::Reading::within(RESPONSE_TIMEOUT)
        .head_only(case.head_only)
        .stream(case.stream)
        .until_answer()
}

/// Bytes shown escaped, cut to `max`.
fn show(bytes: &[u8], max: usize) -> String {
    let cut = &bytes[..bytes.len().min(max)];
    let mut s = cut.escape_ascii().to_string();
    if bytes.len() > max {
        s.push_str(&format!("… ({} bytes in all)", bytes.len()));
    }
    s
}

// ---------------------------------------------------------------------------
// The HTTP run.

#[derive(Default)]
struct Tally {
    sent: u64,
    follow_ups: u64,
    by_class: BTreeMap<String, u64>,
    by_status: BTreeMap<u16, u64>,
    by_code: BTreeMap<i64, u64>,
    results: u64,
    connections: u64,
    reopened: u64,
    raw: u64,
    tasks_learnt: u64,
    sessions_learnt: u64,
    /// Failures by kind: how many, and the first of each described in full.
    failures: BTreeMap<String, (u64, String)>,
    /// Non-2xx answers to `POST /mcp` without a JSON-RPC error body, by
    /// status and the start of the body: how many, and the first of each.
    not_json_rpc: BTreeMap<String, (u64, String)>,
    /// Unmutated stateless requests sent (each must be served).
    controls: u64,
    /// Answers that are known defects, by entry of `KNOWN_5XX` and
    /// `KNOWN_PLAIN_TEXT`.
    known_5xx: BTreeMap<usize, u64>,
    known_plain_text: BTreeMap<usize, u64>,
}

impl Tally {
    fn fail(&mut self, kind: String, description: String) {
        let entry = self.failures.entry(kind).or_insert_with(|| {
            eprintln!("{description}");
            (0, description)
        });
        entry.0 += 1;
    }

    fn failure_count(&self) -> u64 {
        self.failures.values().map(|(n, _)| n).sum()
    }
}

fn describe(seed: u64, count: u64, case: &Case, what: &str, got: &[u8]) -> String {
    format!(
        "FUZZ FAILURE: {what}\n  replay: {SEED_ENV}={seed:#x} {REQUESTS_ENV}={count} cargo test --test fuzz_requests mutated_http (or {ONLY_ENV}={} for this request alone)\n  request #{} [{}] {} bytes: {}\n  answer: {}",
        case.index,
        case.index,
        case.label,
        case.bytes.len(),
        show(&case.bytes, 2048),
        show(got, 1024)
    )
}

/// The request line of a failure description, cut short: enough to pick
/// it out for a replay.
fn first_request(description: &str) -> String {
    let line = description
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("request "))
        .unwrap_or_default();
    line.chars().take(160).collect()
}

/// Whether `body` is a JSON-RPC error object.
fn is_json_rpc_error(body: &[u8]) -> bool {
    serde_json::from_slice::<Value>(body).is_ok_and(|v| {
        v["jsonrpc"] == "2.0" && v["error"]["code"].is_i64() && v["error"]["message"].is_string()
    })
}

/// Alive and not a zombie.
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("State:"))
            .is_some_and(|st| !st.trim_start().starts_with('Z'))
    })
}

/// New lines of the daemon's log since `offset`.
fn log_since(path: &std::path::Path, offset: &mut u64) -> String {
    use std::io::Seek;
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    if len <= *offset {
        return String::new();
    }
    let _ = f.seek(std::io::SeekFrom::Start(*offset));
    let mut bytes = Vec::new();
    let _ = f.take(len - *offset).read_to_end(&mut bytes);
    *offset = len;
    String::from_utf8_lossy(&bytes).into_owned()
}

struct Run<'a> {
    seed: u64,
    count: u64,
    port: u16,
    pid: i32,
    log: &'a std::path::Path,
    log_offset: u64,
    conn: Option<TcpStream>,
    learnt: Learnt,
    tally: Tally,
}

impl Run<'_> {
    /// Sends a case and returns what came back; a keep-alive connection the
    /// server closed before the request arrived is retried once on a fresh
    /// one, as any HTTP client does.
    fn exchange(&mut self, case: &Case) -> Outcome {
        if case.raw {
            let mut s = http::connect(self.port, RESPONSE_TIMEOUT);
            self.tally.connections += 1;
            self.tally.raw += 1;
            let _ = s.write_all(&case.bytes);
            if !case.leave_open {
                let _ = s.shutdown(Shutdown::Write);
            }
            return http::read_response(&mut s, &reading(case));
        }
        for attempt in 0..2 {
            let reused = self.conn.is_some();
            let mut s = match self.conn.take() {
                Some(s) => s,
                None => {
                    self.tally.connections += 1;
                    if self.tally.sent > 0 {
                        self.tally.reopened += 1;
                    }
                    http::connect(self.port, RESPONSE_TIMEOUT)
                }
            };
            let out = http::send_on(&mut s, &case.bytes, &reading(case));
            match out {
                Outcome::Closed(ref got) if got.is_empty() && reused && attempt == 0 => continue,
                Outcome::Answer(ref a) if !a.closes && !case.last_on_connection => {
                    self.conn = Some(s);
                    return out;
                }
                _ => return out,
            }
        }
        unreachable!("the second attempt always returns")
    }

    fn learn(&mut self, answer: &Response, index: u64) {
        if let Some(id) = answer.header("mcp-session-id")
            && (200..300).contains(&answer.status)
        {
            let id = id.to_string();
            if !self.learnt.sessions.contains(&id) {
                self.tally.sessions_learnt += 1;
                Learnt::remember(&mut self.learnt.sessions, id.clone());
                self.initialized(&id, index);
            }
        }
        for m in answer.messages() {
            if let Some(code) = m.pointer("/error/code").and_then(Value::as_i64) {
                *self.tally.by_code.entry(code).or_default() += 1;
            } else if m.get("result").is_some() {
                self.tally.results += 1;
            }
            if let Some(t) = m.pointer("/result/taskId").and_then(Value::as_str)
                && !self.learnt.tasks.iter().any(|x| x == t)
            {
                self.tally.tasks_learnt += 1;
                Learnt::remember(&mut self.learnt.tasks, t.to_string());
            }
        }
    }

    /// The `notifications/initialized` a legacy client sends after its
    /// `initialize`, so later requests in the session are served.
    fn initialized(&mut self, session: &str, after: u64) {
        let body = json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string();
        let mut req = Req::new("POST", "/mcp")
            .header("Content-Type", "application/json")
            .header("Accept", "application/json, text/event-stream")
            .header("MCP-Protocol-Version", LEGACY)
            .header("Mcp-Session-Id", session);
        req.body = body.into_bytes();
        let case = Case {
            index: after,
            label: "notifications/initialized following this request's session".into(),
            bytes: req.render(0),
            raw: false,
            last_on_connection: false,
            mcp_post: true,
            well_formed: true,
            head_only: false,
            stream: false,
            leave_open: false,
            control: false,
            oversize: false,
        };
        self.tally.follow_ups += 1;
        let out = self.exchange(&case);
        self.check(&case, out);
    }

    fn check(&mut self, case: &Case, out: Outcome) {
        let (seed, count) = (self.seed, self.count);
        match out {
            Outcome::Hang(got) => {
                *self.tally.by_class.entry("hang".into()).or_default() += 1;
                self.tally.fail(
                    "hang".into(),
                    describe(
                        seed,
                        count,
                        case,
                        &format!("no answer within {RESPONSE_TIMEOUT:?} on an open connection"),
                        &got,
                    ),
                );
            }
            Outcome::Closed(got) => {
                *self
                    .tally
                    .by_class
                    .entry("closed without answer".into())
                    .or_default() += 1;
                // Malformed framing may be dropped; a well-formed request
                // on a fresh connection must be answered.
                if case.well_formed && !case.raw && !case.oversize {
                    self.tally.fail(
                        "closed without an answer".into(),
                        describe(
                            seed,
                            count,
                            case,
                            "connection closed without an answer to a well-formed request",
                            &got,
                        ),
                    );
                }
            }
            Outcome::Answer(a) => {
                *self
                    .tally
                    .by_class
                    .entry(format!("{}xx", a.status / 100))
                    .or_default() += 1;
                *self.tally.by_status.entry(a.status).or_default() += 1;
                // Counted once, as a 5xx, should it be plain text too.
                let known_5xx = known(KNOWN_5XX, &a);
                if a.status >= 500 {
                    let documented = a.status == 503
                        && (a.header("retry-after").is_some() || is_json_rpc_error(&a.body));
                    if let Some(k) = known_5xx {
                        *self.tally.known_5xx.entry(k).or_default() += 1;
                    } else if !documented {
                        let start = &a.body[..a.body.len().min(40)];
                        let kind = format!("HTTP {} {}", a.status, start.escape_ascii());
                        self.tally.fail(kind, describe(
                            seed,
                            count,
                            case,
                            &format!(
                                "HTTP {} (only a 503 with Retry-After or a JSON-RPC error is allowed)",
                                a.status
                            ),
                            &a.body,
                        ));
                    }
                }
                let plain = case.mcp_post
                    && !(200..300).contains(&a.status)
                    && !is_json_rpc_error(&a.body)
                    && known_5xx.is_none();
                if let Some(k) = known(KNOWN_PLAIN_TEXT, &a).filter(|_| plain) {
                    *self.tally.known_plain_text.entry(k).or_default() += 1;
                } else if plain {
                    // Status and the start of the body: one entry per kind.
                    let start = &a.body[..a.body.len().min(40)];
                    let key = format!("{} {}", a.status, start.escape_ascii());
                    let what = format!(
                        "HTTP {} to POST /mcp without a JSON-RPC error body",
                        a.status
                    );
                    let entry = self
                        .tally
                        .not_json_rpc
                        .entry(key)
                        .or_insert_with(|| (0, describe(seed, count, case, &what, &a.body)));
                    entry.0 += 1;
                }
                if case.control {
                    self.tally.controls += 1;
                    if !(200..300).contains(&a.status) {
                        let kind = format!("HTTP {} to a valid request", a.status);
                        self.tally.fail(
                            kind,
                            describe(
                                seed,
                                count,
                                case,
                                &format!("HTTP {} to a valid request", a.status),
                                &a.body,
                            ),
                        );
                    }
                }
                self.learn(&a, case.index);
            }
        }
    }

    /// Fails the run at once if the daemon has died, and records a panic
    /// in its log against the request just answered.
    fn watch(&mut self, case: &Case) {
        let new = log_since(self.log, &mut self.log_offset);
        if new.contains("panicked") {
            let what = format!("the daemon logged a panic at or before this request:\n{new}");
            let description = describe(self.seed, self.count, case, &what, b"");
            self.tally.fail("panic".into(), description);
        }
        if !alive(self.pid) {
            let what = "the daemon exited at or after this request".to_string();
            panic!(
                "{}\nlog:\n{}",
                describe(self.seed, self.count, case, &what, b""),
                std::fs::read_to_string(self.log).unwrap_or_default()
            );
        }
    }
}

#[test]
fn mutated_http_requests_never_crash_hang_or_bloat_the_daemon() {
    let seed = seed();
    let count = count_from(REQUESTS_ENV, DEFAULT_REQUESTS);
    // One request alone, to look at a failure again.
    let only = std::env::var(ONLY_ENV)
        .ok()
        .map(|s| parse_u64(&s).unwrap_or_else(|| panic!("{ONLY_ENV} must be a number, got {s:?}")));
    let root = private_dir();
    let state = state_dir(root.path());
    let cfg = config(root.path());
    let log = root.path().join("daemon.log");
    let daemon = Daemon::start(&cfg, &state, &log);
    let pid = daemon.pid().as_raw();
    eprintln!("fuzzing with {SEED_ENV}={seed:#x} {REQUESTS_ENV}={count}");
    let started = Instant::now();
    let mut run = Run {
        seed,
        count,
        port: daemon.port,
        pid,
        log: &log,
        log_offset: 0,
        conn: None,
        learnt: Learnt::default(),
        tally: Tally::default(),
    };
    let mut rss_before = None;
    // A line for every request and what came of it.
    let trace = std::env::var_os(TRACE_ENV).is_some();
    let indexes = match only {
        Some(i) => i..i + 1,
        None => 0..count,
    };
    for index in indexes {
        if index == WARM_UP.min(count / 2) {
            rss_before = rss_kib(pid);
        }
        let case = make_case(seed, index, &run.learnt);
        let out = run.exchange(&case);
        if trace {
            let what = match &out {
                Outcome::Answer(a) => format!("HTTP {} {}", a.status, show(&a.body, 60)),
                Outcome::Closed(_) => "closed".into(),
                Outcome::Hang(_) => "hang".into(),
            };
            eprintln!("#{index} [{}] -> {what}", case.label);
        }
        run.tally.sent += 1;
        run.check(&case, out);
        run.watch(&case);
    }
    let elapsed = started.elapsed();
    // The server side of the last connection may still hold buffers.
    run.conn = None;
    let rss_after = rss_kib(pid);
    let peak = peak_rss_kib(pid);

    // The daemon still does its job.
    let health = http_get(daemon.port, "/healthz");
    let rt = runtime();
    let after = rt.block_on(async {
        let c = daemon.client(true);
        let now = daemon
            .client(false)
            .call_tool("echo", json!({"text": "still here"}), None)
            .await;
        let task = c.call_tool("must", json!({}), None).await;
        let polled = match &task {
            Ok(t) => match t["taskId"].as_str() {
                Some(id) => Some(c.get_task(id).await),
                None => None,
            },
            Err(_) => None,
        };
        (now, task, polled)
    });

    let t = &run.tally;
    let kib = |r: Option<u64>| r.map_or("?".into(), |r| format!("{r} KiB"));
    eprintln!("--- fuzz_requests (HTTP) seed {seed:#x} ---");
    eprintln!(
        "requests sent {} ({} unmutated controls, {} on bare connections) + {} follow-up initialized notifications",
        t.sent, t.controls, t.raw, t.follow_ups
    );
    eprintln!("by class: {:?}", t.by_class);
    eprintln!("by status: {:?}", t.by_status);
    eprintln!(
        "JSON-RPC results {}; errors by code: {:?}",
        t.results, t.by_code
    );
    eprintln!(
        "connections opened {} (reopened {}); tasks created {}, legacy sessions opened {}",
        t.connections, t.reopened, t.tasks_learnt, t.sessions_learnt
    );
    eprintln!(
        "RSS after warm-up {}, at the end {}, peak {} (bound: +{} MiB)",
        kib(rss_before),
        kib(rss_after),
        kib(peak),
        RSS_GROWTH_BOUND >> 20
    );
    eprintln!("wall time {:.1} s", elapsed.as_secs_f64());
    eprintln!(
        "non-2xx POST /mcp answers without a JSON-RPC error body: {}",
        t.not_json_rpc.values().map(|(n, _)| n).sum::<u64>()
    );
    for (kind, (n, first)) in &t.not_json_rpc {
        eprintln!(
            "  {n:6}  HTTP {kind}\n          first: {}",
            first_request(first)
        );
    }
    for (list, seen, what) in [
        (KNOWN_5XX, &t.known_5xx, "5xx"),
        (KNOWN_PLAIN_TEXT, &t.known_plain_text, "plain text"),
    ] {
        for (i, k) in list.iter().enumerate() {
            eprintln!(
                "known defect ({what}) seen {:5}x: HTTP {} {:?}",
                seen.get(&i).copied().unwrap_or(0),
                k.status,
                k.body_starts
            );
        }
    }

    for (kind, (n, _)) in &t.failures {
        eprintln!("FAILED {n:6}  {kind}");
    }
    assert_eq!(
        t.failure_count(),
        0,
        "{} fuzz failures; the first of each kind:\n{}",
        t.failure_count(),
        t.failures
            .values()
            .map(|(_, d)| d.as_str())
            .collect::<Vec<_>>()
            .join("\n\n")
    );
    if only.is_none() {
        // The run reached past the door: valid requests were served, tasks
        // and sessions were made and then poked at.
        assert!(
            t.controls > count / 20 && t.results > count / 20,
            "too few requests were served ({} controls, {} results): the fuzzer only bounced off the door",
            t.controls,
            t.results
        );
        assert!(
            t.tasks_learnt > 0 && t.sessions_learnt > 0,
            "no task ({}) or no legacy session ({}) was ever created",
            t.tasks_learnt,
            t.sessions_learnt
        );
        let (before, after_rss) = (
            rss_before.expect("read VmRSS after warm-up"),
            rss_after.expect("read VmRSS at the end"),
        );
        assert!(
            after_rss.saturating_sub(before) * 1024 <= RSS_GROWTH_BOUND,
            "RSS grew from {before} KiB to {after_rss} KiB over the run (seed {seed:#x}), past the {} MiB bound",
            RSS_GROWTH_BOUND >> 20
        );
    }
    assert!(
        health.starts_with("HTTP/1.1 200"),
        "/healthz after the run: {health:?}"
    );
    let (now, task, polled) = after;
    let now = now.unwrap_or_else(|e| panic!("a tool call after the run failed: {e}"));
    assert_eq!(now["content"][0]["text"], "still here\n", "{now}");
    let task = task.unwrap_or_else(|e| panic!("a task call after the run failed: {e}"));
    assert_eq!(task["resultType"], "task", "{task}");
    let polled = polled
        .expect("the task has an id")
        .unwrap_or_else(|e| panic!("tasks/get after the run failed: {e}"));
    assert_eq!(polled["taskId"], task["taskId"], "{polled}");
    assert!(
        daemon.stop().success(),
        "the daemon did not stop cleanly after the run"
    );
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !log_text.contains("panicked"),
        "the daemon logged a panic (seed {seed:#x}):\n{log_text}"
    );

    every_non_2xx_post_mcp_answer_is_a_json_rpc_error(t);
    if only.is_none() && seed == DEFAULT_SEED && count == DEFAULT_REQUESTS {
        every_known_defect_still_occurs(t);
    }
}

/// A known defect the default run no longer meets has been fixed (or the
/// fuzzer no longer reaches it): its entry must go, so that it fails the
/// run again should it come back.
fn every_known_defect_still_occurs(t: &Tally) {
    for (list, seen) in [
        (KNOWN_5XX, &t.known_5xx),
        (KNOWN_PLAIN_TEXT, &t.known_plain_text),
    ] {
        for (i, k) in list.iter().enumerate() {
            assert!(
                seen.contains_key(&i),
                "the known defect HTTP {} {:?} ({}) no longer occurs with the default seed: remove its entry",
                k.status,
                k.body_starts,
                k.why
            );
        }
    }
}

/// Clients read errors from the JSON-RPC body: a malformed or refused
/// `POST /mcp` must get a JSON-RPC error, never a plain-text status alone
/// (the open defects in `KNOWN_PLAIN_TEXT` are counted apart).
fn every_non_2xx_post_mcp_answer_is_a_json_rpc_error(t: &Tally) {
    assert!(
        t.not_json_rpc.is_empty(),
        "{} non-2xx answers to POST /mcp had no JSON-RPC error body; one of each kind:\n{}",
        t.not_json_rpc.values().map(|(n, _)| n).sum::<u64>(),
        t.not_json_rpc
            .values()
            .map(|(_, d)| d.as_str())
            .collect::<Vec<_>>()
            .join("\n\n")
    );
}

// ---------------------------------------------------------------------------
// stdio: mutated lines on `serve --stdio`, each followed by a sentinel
// request whose answer proves the daemon still reads and answers.

/// Line `index` of the stdio run: a mutated message on one line.
fn make_line(seed: u64, index: u64, learnt: &Learnt) -> (Vec<u8>, String) {
    let mut rng = Rng::for_case(seed, 2, index);
    let base = *rng.pick(&[
        Base::ToolsList,
        Base::CallNow,
        Base::CallTask,
        Base::CallRequired,
        Base::TasksGet,
        Base::TasksCancel,
        Base::TasksUpdate,
        Base::Initialize,
        Base::Initialized,
    ]);
    let (mut msg, _) = base_message(base, index + 1, learnt, &mut rng);
    let mut labels = vec![format!("{base:?}")];
    let mut splices = Splices(Vec::new());
    let mutations = if rng.chance(12) { 0 } else { 1 + rng.below(3) };
    let mut body_mutations = Vec::new();
    for _ in 0..mutations {
        if rng.chance(70) {
            labels.push(mutate_message(&mut msg, &mut rng, &mut splices));
        } else {
            body_mutations.push(rng.next());
        }
    }
    let mut line = splices.render(&msg);
    for s in body_mutations {
        labels.push(mutate_body(&mut line, &mut Rng(s)));
    }
    // One message a line: a newline inside would make two.
    for b in line.iter_mut() {
        if *b == b'\n' || *b == b'\r' {
            *b = b' ';
        }
    }
    line.push(b'\n');
    (line, labels.join(" "))
}

#[test]
fn mutated_stdio_lines_never_crash_or_hang_the_daemon() {
    let seed = seed();
    let count = count_from(LINES_ENV, DEFAULT_LINES);
    let root = private_dir();
    let state = state_dir(root.path());
    let cfg = config(root.path());
    let log = root.path().join("daemon.log");
    let mut daemon = Daemon::builder()
        .config(&cfg)
        .state_dir(&state)
        .log(&log)
        .stdio()
        .start();
    let pid = daemon.pid().as_raw();
    let mut stdin = daemon.child.stdin.take().expect("the daemon's stdin");
    let stdout = daemon.child.stdout.take().expect("the daemon's stdout");
    let (tx, lines) = mpsc::channel::<Value>();
    std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut line = Vec::new();
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let v = serde_json::from_slice(&line)
                        .unwrap_or_else(|_| json!({"unparsable": String::from_utf8_lossy(&line)}));
                    if tx.send(v).is_err() {
                        break;
                    }
                }
            }
        }
    });
    eprintln!("fuzzing stdio with {SEED_ENV}={seed:#x} {LINES_ENV}={count}");
    let started = Instant::now();
    let mut learnt = Learnt::default();
    let mut by_code: BTreeMap<i64, u64> = BTreeMap::new();
    let (mut results, mut unparsable, mut answered_lines) = (0u64, 0u64, 0u64);
    let mut log_offset = 0;
    for index in 0..count {
        let (line, label) = make_line(seed, index, &learnt);
        let fail = |what: &str| -> String {
            format!(
                "STDIO FUZZ FAILURE: {what}\n  replay: {SEED_ENV}={seed:#x} {LINES_ENV}={count} cargo test --test fuzz_requests stdio\n  line #{index} [{label}] {} bytes: {}",
                line.len(),
                show(&line, 2048)
            )
        };
        if stdin.write_all(&line).is_err() {
            panic!(
                "{}\nlog:\n{}",
                fail("the daemon closed its stdin"),
                daemon.log_text()
            );
        }
        let sentinel = format!("sentinel-{index}");
        let ping = json!({"jsonrpc": "2.0", "id": sentinel, "method": "tools/list", "params": {"_meta": meta(false)}});
        let mut ping = ping.to_string().into_bytes();
        ping.push(b'\n');
        if stdin.write_all(&ping).and_then(|()| stdin.flush()).is_err() {
            panic!(
                "{}\nlog:\n{}",
                fail("the daemon closed its stdin"),
                daemon.log_text()
            );
        }
        // Everything up to the sentinel's answer answers the fuzz line.
        let deadline = Instant::now() + RESPONSE_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(v) = lines.recv_timeout(left) else {
                let why = if alive(pid) {
                    format!("no answer to the sentinel within {RESPONSE_TIMEOUT:?}")
                } else {
                    "the daemon exited".into()
                };
                panic!("{}\nlog:\n{}", fail(&why), daemon.log_text());
            };
            if v["id"] == sentinel.as_str() {
                break;
            }
            answered_lines += 1;
            if v.get("unparsable").is_some() {
                unparsable += 1;
            } else if let Some(code) = v.pointer("/error/code").and_then(Value::as_i64) {
                *by_code.entry(code).or_default() += 1;
            } else if v.get("result").is_some() {
                results += 1;
            }
            if let Some(t) = v.pointer("/result/taskId").and_then(Value::as_str) {
                Learnt::remember(&mut learnt.tasks, t.to_string());
            }
        }
        let new = log_since(&log, &mut log_offset);
        assert!(
            !new.contains("panicked"),
            "{}\nlog:\n{new}",
            fail("the daemon logged a panic")
        );
    }
    eprintln!("--- fuzz_requests (stdio) seed {seed:#x} ---");
    eprintln!(
        "lines sent {count} (+{count} sentinels); answers {answered_lines}: results {results}, errors by code {by_code:?}, unparsable {unparsable}; wall time {:.1} s",
        started.elapsed().as_secs_f64()
    );
    // Closing stdin is the stdio client's goodbye: a clean exit.
    drop(stdin);
    let status = daemon.wait_exit(Duration::from_secs(30));
    assert!(
        status.success(),
        "stdio daemon ended {status} after the run; log:\n{}",
        daemon.log_text()
    );
}
