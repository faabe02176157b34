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
//! for `fuzz::RESPONSE_TIMEOUT`, grows its RSS by more than `RSS_GROWTH_BOUND`, or
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
//!
//! What this file proves: a seeded, replayable fuzzer: mutated requests against
//! the real daemon; no panic, no unexplained 5xx, no hang, bounded RSS

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::fuzz::{self, BaseRequest, KnownDefect, LEGACY, Learnt, Req, Rng, V2026};
use common::http::Outcome;
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
/// Requests sent before the baseline RSS is read: sessions, tasks, the
/// allocator's arenas and SQLite's page cache have all been touched by then.
const WARM_UP: u64 = 1_000;
/// RSS growth allowed between the end of warm-up and the end of the run.
/// What legitimately grows is bounded well below it: at most
/// `MAX_SESSIONS` legacy sessions (some 50 KiB each), the task rows and
/// results the store caches, and allocator fragmentation. A leak of 4 KiB a
/// request (76 MiB over the 19,000 requests after warm-up) fails it.
const RSS_GROWTH_BOUND: u64 = 64 * 1024 * 1024;
/// Few legacy sessions, which never expire during a run: the table fills
/// and `DELETE /mcp` empties it again, so which requests find it full
/// depends on the seed alone, not on how fast the machine is.
const MAX_SESSIONS: usize = 32;

/// 5xx answers that are open defects.
const KNOWN_5XX: &[KnownDefect] = &[];

/// Non-2xx answers to `POST /mcp` in plain text that are open defects.
const KNOWN_PLAIN_TEXT: &[KnownDefect] = &[];

/// `echo` runs as a task when the request declares Tasks, otherwise now;
/// `must` only ever runs as a task. Both end at once. Short header and
/// body timeouts end the requests the fuzzer leaves unfinished on purpose.
fn config(dir: &std::path::Path) -> std::path::PathBuf {
    write_config(
        dir,
        &format!(
            "[server]\nmax_request_bytes = {}\nheader_read_timeout_ms = 1000\n\
             body_read_timeout_ms = 1000\nmax_sessions = {MAX_SESSIONS}\nsession_idle_secs = 3600\n\n\
             [tasks]\npoll_interval_ms = 50\ncancel_grace_ms = 200\n",
            fuzz::MAX_REQUEST_BYTES
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
// The base requests: valid requests of every kind a client sends, which
// the framework mutates.

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
            request("tools/list", json!({"_meta": fuzz::meta(false)})),
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
                    json!({"name": tool, "arguments": args, "_meta": fuzz::meta(base != Base::CallNow)}),
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
            params["_meta"] = fuzz::meta(true);
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

/// A base request of the HTTP run: drawn by weight from [`BASES`].
fn base_request(rng: &mut Rng, id: u64, learnt: &Learnt) -> BaseRequest {
    let base = pick_base(rng);
    let (message, req) = base_message(base, id, learnt, rng);
    BaseRequest {
        label: format!("{base:?}"),
        message,
        req,
        stateless: !matches!(
            base,
            Base::Initialize | Base::Initialized | Base::InSession | Base::GetMcp | Base::DeleteMcp
        ),
    }
}

/// A base request of the stdio run: a message a stdio client sends (no
/// HTTP verbs, no sessions).
fn line_base(rng: &mut Rng, id: u64, learnt: &Learnt) -> BaseRequest {
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
    let (message, req) = base_message(base, id, learnt, rng);
    // A line is the message alone: the request around it goes unused.
    BaseRequest {
        label: format!("{base:?}"),
        message,
        req,
        stateless: false,
    }
}

// ---------------------------------------------------------------------------
// The HTTP run.

#[test]
fn mutated_http_requests_never_crash_hang_or_bloat_the_daemon() {
    let seed = fuzz::number_from(SEED_ENV, DEFAULT_SEED);
    let count = fuzz::number_from(REQUESTS_ENV, DEFAULT_REQUESTS);
    // One request alone, to look at a failure again.
    let only = std::env::var(ONLY_ENV).ok().map(|s| {
        fuzz::parse_u64(&s).unwrap_or_else(|| panic!("{ONLY_ENV} must be a number, got {s:?}"))
    });
    let root = private_dir();
    let state = state_dir(root.path());
    let cfg = config(root.path());
    let log = root.path().join("daemon.log");
    let daemon = Daemon::start(&cfg, &state, &log);
    let pid = daemon.pid().as_raw();
    eprintln!("fuzzing with {SEED_ENV}={seed:#x} {REQUESTS_ENV}={count}");
    let started = Instant::now();
    let replay = fuzz::Replay {
        command: format!(
            "{SEED_ENV}={seed:#x} {REQUESTS_ENV}={count} cargo test --test fuzz_requests mutated_http"
        ),
        only_env: ONLY_ENV,
    };
    let mut run = fuzz::Run::new(replay, daemon.port, pid, &log, KNOWN_5XX, KNOWN_PLAIN_TEXT);
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
        let case = fuzz::make_case(seed, index, &run.learnt, base_request);
        let out = run.exchange(&case);
        if trace {
            let what = match &out {
                Outcome::Answer(a) => format!("HTTP {} {}", a.status, fuzz::show(&a.body, 60)),
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
    t.report();
    eprintln!(
        "RSS after warm-up {}, at the end {}, peak {} (bound: +{} MiB)",
        kib(rss_before),
        kib(rss_after),
        kib(peak),
        RSS_GROWTH_BOUND >> 20
    );
    eprintln!("wall time {:.1} s", elapsed.as_secs_f64());
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

    t.assert_no_failures();
    if only.is_none() {
        t.assert_reached_past_the_door(count);
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
fn every_known_defect_still_occurs(t: &fuzz::Tally) {
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
fn every_non_2xx_post_mcp_answer_is_a_json_rpc_error(t: &fuzz::Tally) {
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

#[test]
fn mutated_stdio_lines_never_crash_or_hang_the_daemon() {
    let seed = fuzz::number_from(SEED_ENV, DEFAULT_SEED);
    let count = fuzz::number_from(LINES_ENV, DEFAULT_LINES);
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
        let (line, label) = fuzz::make_line(seed, index, &learnt, line_base);
        let fail = |what: &str| -> String {
            format!(
                "STDIO FUZZ FAILURE: {what}\n  replay: {SEED_ENV}={seed:#x} {LINES_ENV}={count} cargo test --test fuzz_requests stdio\n  line #{index} [{label}] {} bytes: {}",
                line.len(),
                fuzz::show(&line, 2048)
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
        let ping = json!({"jsonrpc": "2.0", "id": sentinel, "method": "tools/list", "params": {"_meta": fuzz::meta(false)}});
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
        let deadline = Instant::now() + fuzz::RESPONSE_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(v) = lines.recv_timeout(left) else {
                let why = if fuzz::alive(pid) {
                    format!(
                        "no answer to the sentinel within {:?}",
                        fuzz::RESPONSE_TIMEOUT
                    )
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
        let new = fuzz::log_since(&log, &mut log_offset);
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
