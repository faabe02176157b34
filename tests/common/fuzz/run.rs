//! Sending a run's cases and judging what came back: the run fails on a
//! hang, on a well-formed request closed without an answer, on a 5xx other
//! than a 503 that says when to retry, on an unmutated request not served,
//! and on a panic in the daemon's log; a non-2xx answer to `POST /mcp`
//! without a JSON-RPC error is tallied apart for its own check.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::Path;

use serde_json::{Value, json};

use super::super::http::{self, Outcome, Response};
use super::request::{Case, Req};
use super::{LEGACY, Learnt, RESPONSE_TIMEOUT};

/// An answer the daemon is known to get wrong: an open defect, matched on
/// the status and the start of the body. The run counts it apart instead
/// of failing on it; a full run with the default seed fails once it no
/// longer occurs, so that its entry goes when the defect is fixed.
pub struct KnownDefect {
    pub status: u16,
    pub body_starts: &'static str,
    pub why: &'static str,
}

/// The entry of `list` this answer is, if any.
pub fn known(list: &[KnownDefect], a: &Response) -> Option<usize> {
    list.iter()
        .position(|k| k.status == a.status && a.body.starts_with(k.body_starts.as_bytes()))
}

/// How the answer to `case` is read: an event stream only until it carries
/// its answer, a GET's stream only its head.
pub fn reading(case: &Case) -> http::Reading {
    http::Reading::within(RESPONSE_TIMEOUT)
        .head_only(case.head_only)
        .stream(case.stream)
        .until_answer()
}

/// Bytes shown escaped, cut to `max`.
pub fn show(bytes: &[u8], max: usize) -> String {
    let cut = &bytes[..bytes.len().min(max)];
    let mut s = cut.escape_ascii().to_string();
    if bytes.len() > max {
        s.push_str(&format!("… ({} bytes in all)", bytes.len()));
    }
    s
}

/// What a run sent and what came of it.
#[derive(Default)]
pub struct Tally {
    pub sent: u64,
    pub follow_ups: u64,
    pub by_class: BTreeMap<String, u64>,
    pub by_status: BTreeMap<u16, u64>,
    pub by_code: BTreeMap<i64, u64>,
    pub results: u64,
    pub connections: u64,
    pub reopened: u64,
    pub raw: u64,
    pub tasks_learnt: u64,
    pub sessions_learnt: u64,
    /// Failures by kind: how many, and the first of each described in full.
    pub failures: BTreeMap<String, (u64, String)>,
    /// Non-2xx answers to `POST /mcp` without a JSON-RPC error body, by
    /// status and the start of the body: how many, and the first of each.
    pub not_json_rpc: BTreeMap<String, (u64, String)>,
    /// Unmutated stateless requests sent (each must be served).
    pub controls: u64,
    /// Answers that are known defects, by entry of the run's lists of
    /// known 5xx and plain-text answers.
    pub known_5xx: BTreeMap<usize, u64>,
    pub known_plain_text: BTreeMap<usize, u64>,
}

impl Tally {
    pub fn fail(&mut self, kind: String, description: String) {
        let entry = self.failures.entry(kind).or_insert_with(|| {
            eprintln!("{description}");
            (0, description)
        });
        entry.0 += 1;
    }

    pub fn failure_count(&self) -> u64 {
        self.failures.values().map(|(n, _)| n).sum()
    }

    /// What was sent and what came back, on stderr.
    pub fn report(&self) {
        eprintln!(
            "requests sent {} ({} unmutated controls, {} on bare connections) + {} follow-up initialized notifications",
            self.sent, self.controls, self.raw, self.follow_ups
        );
        eprintln!("by class: {:?}", self.by_class);
        eprintln!("by status: {:?}", self.by_status);
        eprintln!(
            "JSON-RPC results {}; errors by code: {:?}",
            self.results, self.by_code
        );
        eprintln!(
            "connections opened {} (reopened {}); tasks created {}, legacy sessions opened {}",
            self.connections, self.reopened, self.tasks_learnt, self.sessions_learnt
        );
        eprintln!(
            "non-2xx POST /mcp answers without a JSON-RPC error body: {}",
            self.not_json_rpc.values().map(|(n, _)| n).sum::<u64>()
        );
        for (kind, (n, first)) in &self.not_json_rpc {
            eprintln!(
                "  {n:6}  HTTP {kind}\n          first: {}",
                first_request(first)
            );
        }
    }

    /// Fails the test on any failure, showing the first of each kind.
    pub fn assert_no_failures(&self) {
        for (kind, (n, _)) in &self.failures {
            eprintln!("FAILED {n:6}  {kind}");
        }
        assert_eq!(
            self.failure_count(),
            0,
            "{} fuzz failures; the first of each kind:\n{}",
            self.failure_count(),
            self.failures
                .values()
                .map(|(_, d)| d.as_str())
                .collect::<Vec<_>>()
                .join("\n\n")
        );
    }

    /// The run of `count` requests reached past the door: valid requests
    /// were served, tasks and sessions were made and then poked at. A run
    /// that only bounced off it would pass every other check.
    pub fn assert_reached_past_the_door(&self, count: u64) {
        assert!(
            self.controls > count / 20 && self.results > count / 20,
            "too few requests were served ({} controls, {} results): the fuzzer only bounced off the door",
            self.controls,
            self.results
        );
        assert!(
            self.tasks_learnt > 0 && self.sessions_learnt > 0,
            "no task ({}) or no legacy session ({}) was ever created",
            self.tasks_learnt,
            self.sessions_learnt
        );
    }
}

/// How a failure is sent again: printed with each one.
pub struct Replay {
    /// The command that runs the whole run again, its seed and count set.
    pub command: String,
    /// The variable that sends one request alone.
    pub only_env: &'static str,
}

pub fn describe(replay: &Replay, case: &Case, what: &str, got: &[u8]) -> String {
    format!(
        "FUZZ FAILURE: {what}\n  replay: {} (or {}={} for this request alone)\n  request #{} [{}] {} bytes: {}\n  answer: {}",
        replay.command,
        replay.only_env,
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
pub fn first_request(description: &str) -> String {
    let line = description
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("request "))
        .unwrap_or_default();
    line.chars().take(160).collect()
}

/// Whether `body` is a JSON-RPC error object.
pub fn is_json_rpc_error(body: &[u8]) -> bool {
    serde_json::from_slice::<Value>(body).is_ok_and(|v| {
        v["jsonrpc"] == "2.0" && v["error"]["code"].is_i64() && v["error"]["message"].is_string()
    })
}

/// Alive and not a zombie.
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("State:"))
            .is_some_and(|st| !st.trim_start().starts_with('Z'))
    })
}

/// New lines of the daemon's log since `offset`.
pub fn log_since(path: &Path, offset: &mut u64) -> String {
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

/// One HTTP run: its cases sent one at a time over keep-alive connections
/// (reopened when the server closes one), each answer judged and learnt
/// from, the daemon watched between them.
pub struct Run<'a> {
    replay: Replay,
    port: u16,
    pid: i32,
    log: &'a Path,
    log_offset: u64,
    /// The keep-alive connection the next case goes out on, if one is open.
    pub conn: Option<TcpStream>,
    pub learnt: Learnt,
    pub tally: Tally,
    /// Answers that are open defects, counted apart instead of failing the
    /// run: 5xx answers, and non-2xx answers to `POST /mcp` in plain text.
    known_5xx: &'static [KnownDefect],
    known_plain_text: &'static [KnownDefect],
}

impl<'a> Run<'a> {
    /// A run against the daemon `pid` serving on `port` and logging to `log`.
    pub fn new(
        replay: Replay,
        port: u16,
        pid: i32,
        log: &'a Path,
        known_5xx: &'static [KnownDefect],
        known_plain_text: &'static [KnownDefect],
    ) -> Run<'a> {
        Run {
            replay,
            port,
            pid,
            log,
            log_offset: 0,
            conn: None,
            learnt: Learnt::default(),
            tally: Tally::default(),
            known_5xx,
            known_plain_text,
        }
    }

    /// Sends a case and returns what came back; a keep-alive connection the
    /// server closed before the request arrived is retried once on a fresh
    /// one, as any HTTP client does.
    pub fn exchange(&mut self, case: &Case) -> Outcome {
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

    pub fn learn(&mut self, answer: &Response, index: u64) {
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
    pub fn initialized(&mut self, session: &str, after: u64) {
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

    pub fn check(&mut self, case: &Case, out: Outcome) {
        let replay = &self.replay;
        match out {
            Outcome::Hang(got) => {
                *self.tally.by_class.entry("hang".into()).or_default() += 1;
                self.tally.fail(
                    "hang".into(),
                    describe(
                        replay,
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
                            replay,
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
                let known_5xx = known(self.known_5xx, &a);
                if a.status >= 500 {
                    let documented = a.status == 503
                        && (a.header("retry-after").is_some() || is_json_rpc_error(&a.body));
                    if let Some(k) = known_5xx {
                        *self.tally.known_5xx.entry(k).or_default() += 1;
                    } else if !documented {
                        let start = &a.body[..a.body.len().min(40)];
                        let kind = format!("HTTP {} {}", a.status, start.escape_ascii());
                        self.tally.fail(kind, describe(replay,
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
                if let Some(k) = known(self.known_plain_text, &a).filter(|_| plain) {
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
                        .or_insert_with(|| (0, describe(replay, case, &what, &a.body)));
                    entry.0 += 1;
                }
                if case.control {
                    self.tally.controls += 1;
                    if !(200..300).contains(&a.status) {
                        let kind = format!("HTTP {} to a valid request", a.status);
                        self.tally.fail(
                            kind,
                            describe(
                                replay,
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
    pub fn watch(&mut self, case: &Case) {
        let new = log_since(self.log, &mut self.log_offset);
        if new.contains("panicked") {
            let what = format!("the daemon logged a panic at or before this request:\n{new}");
            let description = describe(&self.replay, case, &what, b"");
            self.tally.fail("panic".into(), description);
        }
        if !alive(self.pid) {
            let what = "the daemon exited at or after this request".to_string();
            panic!(
                "{}\nlog:\n{}",
                describe(&self.replay, case, &what, b""),
                std::fs::read_to_string(self.log).unwrap_or_default()
            );
        }
    }
}
