//! `/metrics` read the way a monitoring system reads it: after a known
//! workload on the real binary, parsed by a Prometheus text parser and
//! checked by `promtool`, with every count matching what was done; who may
//! read it when credentials are configured; and the shipped alert rules and
//! dashboard, which must parse and name only metrics the daemon exposes.
//!
//! What this file proves: `/metrics` after a known workload (synchronous calls,
//! tasks polled to the end, an `isError` result, an unknown tool), parsed by a
//! Prometheus text parser and checked by `promtool check metrics`, every count
//! matching what was done, no task ID or unconfigured name in it, only known
//! label names; OpenMetrics when asked for; with credentials: 401 without one,
//! 403 without `metrics:read`, each refusal counted by reason;
//! `docs/monitoring/`'s alert rules pass `promtool check rules`; after
//! approvals (proposed, approved, spent, rejected, waiting, cancelled),
//! upstream calls (one upstream dying mid-call) and a durable route, the
//! approval, upstream and route series hold exact values and the rules and
//! dashboard name only metrics that scrape exposes (none added by hand)

mod common;

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::prereq::require_tool;
use common::tokens::secret;
use common::upstream::{INTEROP, Place, error_name, is_ready, task_id, text, wait_upstream};
use common::*;
use prometheus_parse::{Sample, Scrape, Value as Metric};
use serde_json::{Value, json};

/// One GET of `/metrics`: (status, content type, body).
fn scrape_raw(port: u16, headers: &str) -> (u16, String, String) {
    let request = format!(
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{headers}Connection: close\r\n\r\n"
    );
    let r = http::exchange_on(
        std::net::TcpStream::connect(("127.0.0.1", port)).unwrap(),
        request.as_bytes(),
        Duration::from_secs(30),
    )
    .answer();
    (
        r.status,
        r.header("content-type").unwrap_or_default().to_string(),
        r.text(),
    )
}

fn parse(text: &str) -> Scrape {
    Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("a Prometheus exposition")
}

/// The value of the one sample named `name` whose labels include `labels`.
fn value(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    let found: Vec<&Sample> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "{name}{labels:?}: {} samples: {found:?}",
        found.len()
    );
    match &found[0].value {
        Metric::Counter(v) | Metric::Gauge(v) | Metric::Untyped(v) => *v,
        Metric::Histogram(buckets) => buckets.last().map_or(0.0, |b| b.count),
        other => panic!("{name}: {other:?}"),
    }
}

fn promtool_check_metrics(text: &str) {
    require_tool("promtool");
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_scrape_after_a_known_workload_counts_what_was_done() {
    let root = private_dir();
    let state = state_dir(root.path());
    let cfg = write_config(
        root.path(),
        "",
        &[
            Tool::new("ok").script("printf done").task("optional"),
            Tool::new("refuses")
                .script("echo no >&2; exit 3")
                .task("never"),
        ],
    );
    let daemon = Daemon::start(&cfg, &state, &root.path().join("daemon.log"));
    let port = daemon.port;
    let rt = runtime();

    // Three synchronous calls, two background tasks polled to the end, one
    // call whose tool answers isError, one of a tool nobody configured.
    let plain = daemon.client(false);
    for _ in 0..3 {
        let r = rt.block_on(plain.call_tool("ok", json!({}), None)).unwrap();
        assert_eq!(r["isError"], json!(false), "{r}");
    }
    let tasks = daemon.client(true);
    let mut ids = Vec::new();
    for _ in 0..2 {
        let handle = rt.block_on(tasks.call_tool("ok", json!({}), None)).unwrap();
        let id = handle["taskId"]
            .as_str()
            .unwrap_or_else(|| panic!("no task: {handle}"))
            .to_string();
        let done = rt.block_on(tasks.wait_task(&id, &handle)).unwrap();
        assert_eq!(done["status"], "completed", "{done}");
        ids.push(id);
    }
    let r = rt
        .block_on(plain.call_tool("refuses", json!({}), None))
        .unwrap();
    assert_eq!(r["isError"], json!(true), "{r}");
    let unknown = rt.block_on(plain.call_tool("no-such-tool-x", json!({}), None));
    assert!(unknown.is_err(), "{unknown:?}");

    // As Prometheus asks: OpenMetrics, ending in # EOF.
    let (status, content_type, open) = scrape_raw(
        port,
        "Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n",
    );
    assert_eq!(status, 200, "{open}");
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    assert!(open.ends_with("# EOF\n"), "{open}");

    // As anything else asks: the classic text format, which promtool and
    // a Prometheus text parser both read.
    let (status, content_type, text) = scrape_raw(port, "");
    assert_eq!(status, 200);
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    promtool_check_metrics(&text);
    let s = parse(&text);

    assert_eq!(value(&s, "taskgate_tasks_created_total", &[]), 2.0);
    assert_eq!(value(&s, "taskgate_tasks", &[("status", "completed")]), 2.0);
    assert_eq!(value(&s, "taskgate_tasks", &[("status", "working")]), 0.0);
    assert_eq!(value(&s, "taskgate_tasks_retained", &[]), 2.0);
    assert_eq!(
        value(&s, "taskgate_tool_results_total", &[("result", "success")]),
        5.0
    );
    assert_eq!(
        value(
            &s,
            "taskgate_tool_results_total",
            &[("result", "tool_error")]
        ),
        1.0
    );
    assert_eq!(value(&s, "taskgate_tool_runs_started_total", &[]), 6.0);
    assert_eq!(
        value(&s, "taskgate_errors_total", &[("code", "TG_UNKNOWN_TOOL")]),
        1.0
    );
    let calls = |tool: &str, error: &str| {
        value(
            &s,
            "mcp_server_operation_duration_seconds_count",
            &[
                ("mcp_method_name", "tools/call"),
                ("gen_ai_tool_name", tool),
                ("error_type", error),
            ],
        )
    };
    assert_eq!(calls("ok", ""), 5.0);
    assert_eq!(calls("refuses", "tool_error"), 1.0);
    // The name nobody configured is not a label value.
    assert_eq!(calls("other", "TG_UNKNOWN_TOOL"), 1.0);
    assert!(!text.contains("no-such-tool-x"));
    // Two creations and two completions, however they were batched.
    let rows: f64 = s
        .samples
        .iter()
        .filter(|x| x.metric == "taskgate_store_commit_batch_rows_sum")
        .map(|x| match x.value {
            Metric::Untyped(v) | Metric::Counter(v) | Metric::Gauge(v) => v,
            _ => 0.0,
        })
        .sum();
    assert_eq!(rows, 4.0, "{text}");
    assert_eq!(value(&s, "taskgate_store_disabled", &[]), 0.0);
    assert_eq!(value(&s, "taskgate_tools_running", &[]), 0.0);
    assert!(value(&s, "process_resident_memory_bytes", &[]) > 1e6);
    assert!(value(&s, "process_open_fds", &[]) >= 3.0);
    // Every /mcp POST so far was answered 200 (an unknown tool is a
    // JSON-RPC error inside a 200): 3 + 1 + 1 calls, 2 creations and at
    // least one poll each.
    let posts = value(
        &s,
        "taskgate_http_requests_total",
        &[("method", "POST"), ("path", "/mcp"), ("code", "200")],
    );
    assert!(posts >= 9.0, "{posts}");
    // No task ID, owner or argument is a label.
    for id in &ids {
        assert!(!text.contains(id.as_str()), "{id} in the exposition");
        assert!(!open.contains(id.as_str()));
    }
    for sample in &s.samples {
        for (k, _) in sample.labels.iter() {
            assert!(
                [
                    "status",
                    "result",
                    "code",
                    "reason",
                    "method",
                    "path",
                    "mcp_method_name",
                    "gen_ai_tool_name",
                    "error_type",
                    "phase",
                    "event",
                    "upstream",
                    "version",
                    "le",
                ]
                .contains(&k.as_str()),
                "unexpected label {k} on {}",
                sample.metric
            );
        }
    }
    // The scrape itself was counted by the time of the next one.
    let again = parse(&scrape_raw(port, "").2);
    assert!(
        value(
            &again,
            "taskgate_http_requests_total",
            &[("method", "GET"), ("path", "/metrics"), ("code", "200")]
        ) >= 2.0
    );
}

/// Tokens of one tenant, each its own subject: (id, seed, scopes).
fn tokens_file(path: &Path, tokens: &[(&str, char, &[&str])]) {
    let all: Vec<common::tokens::Token> = tokens
        .iter()
        .map(|(id, seed, scopes)| (*id, *seed, "acme", *id, *scopes))
        .collect();
    common::tokens::tokens_file(path, &all);
}

#[test]
fn with_credentials_metrics_need_their_scope() {
    let root = private_dir();
    let state = state_dir(root.path());
    let tokens = root.path().join("tokens.toml");
    tokens_file(
        &tokens,
        &[
            ("caller", 'c', &["tools:call", "tasks:read"]),
            ("monitor", 'm', &["metrics:read"]),
        ],
    );
    let cfg: PathBuf = write_config(
        root.path(),
        &format!(
            "[auth]\ntokens_file = \"{}\"\nlocal_owner = \"never\"\n",
            tokens.display()
        ),
        &[Tool::new("ok").script("printf done")],
    );
    let daemon = Daemon::start(&cfg, &state, &root.path().join("daemon.log"));
    let port = daemon.port;
    let bearer = |seed: char| format!("Authorization: Bearer {}\r\n", secret(seed));

    // No credential, a caller's credential, a token nobody issued: refused,
    // and nothing of the exposition in the answer.
    let (status, _, body) = scrape_raw(port, "");
    assert_eq!(status, 401, "{body}");
    assert!(!body.contains("taskgate_"), "{body}");
    let (status, _, body) = scrape_raw(port, &bearer('c'));
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("metrics:read"), "{body}");
    assert!(!body.contains("taskgate_tasks"), "{body}");
    let (status, _, _) = scrape_raw(port, &bearer('z'));
    assert_eq!(status, 401);

    // The monitor reads it, and each refusal above is counted by reason.
    let (status, _, text) = scrape_raw(port, &bearer('m'));
    assert_eq!(status, 200, "{text}");
    let s = parse(&text);
    for reason in ["missing", "insufficient_scope", "unknown_token"] {
        assert_eq!(
            value(&s, "taskgate_auth_failures_total", &[("reason", reason)]),
            1.0,
            "{reason}"
        );
    }
    assert!(!text.contains(&secret('m')));
    assert!(!text.contains("monitor"), "a token's id is not a label");
}

/// Metric names a PromQL expression refers to: identifiers that are not
/// functions, keywords, label names (inside braces or a `by (…)` list) or
/// `up`, which Prometheus makes itself.
fn names_in(expr: &str) -> BTreeSet<String> {
    const GROUPING: [&str; 6] = [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    const WORDS: [&str; 20] = [
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "inf",
        "nan",
        "up",
        "sum",
        "min",
        "max",
        "avg",
        "count",
        "group",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
    ];
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let (mut i, mut braces, mut group_next, mut in_group) = (0, 0, false, false);
    while i < chars.len() {
        let c = chars[i];
        if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += 1;
            }
            i += 1;
            continue;
        }
        if c.is_ascii_digit() || c == '$' {
            // A number, a duration such as 5m, or a dashboard variable.
            i += 1;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '.' || chars[i] == '_')
            {
                i += 1;
            }
            continue;
        }
        if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let next = chars[i..].iter().find(|c| !c.is_whitespace()).copied();
            if GROUPING.contains(&word.as_str()) {
                group_next = true;
            } else if braces == 0
                && !in_group
                && next != Some('(')
                && !WORDS.contains(&word.to_lowercase().as_str())
            {
                names.insert(word);
            }
            continue;
        }
        match c {
            '{' => braces += 1,
            '}' => braces -= 1,
            '(' if group_next => (group_next, in_group) = (false, true),
            ')' if in_group => in_group = false,
            _ => {}
        }
        i += 1;
    }
    names
}

/// The names a scrape exposes, with the suffixes PromQL may use.
fn exposed(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name = line.split(['{', ' ']).next().unwrap_or_default();
        names.insert(name.to_string());
    }
    names
}

/// The `[[upstream]]` table of tests/interop/upstream_tasks.py (Tasks
/// over stdio, the durable route's provider), confined to its wrapper,
/// the server's directory and `out/`.
fn tasks_upstream_table(place: &Place, alias: &str) -> String {
    let script = format!(
        "#!/bin/sh\nexport UPSTREAM_TASKS_WORK_MS=100\nexec /usr/bin/python3 {INTEROP}/upstream_tasks.py echo stdio\n"
    );
    let wrapper = place.bin.join(format!("{alias}.sh"));
    std::fs::write(&wrapper, script).unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    format!(
        "[[upstream]]\nalias = \"{alias}\"\ncommand = [\"/bin/sh\", \"{}\"]\nread_paths = [\"{}\", \"{INTEROP}\"]\nwrite_paths = [\"{}\"]\neffect = \"idempotent_write\"\n",
        wrapper.display(),
        place.bin.display(),
        place.out.display()
    )
}

/// What the workload below did, and the exposition scraped after it.
struct Workload {
    text: String,
    /// How long the one proposal still waiting had waited, at most.
    pending_for: Duration,
}

/// A known workload through the real daemon: approval-held calls
/// proposed, approved and spent, rejected, waiting and cancelled; an
/// upstream tool called synchronously; an upstream that dies mid-call and
/// is connected again; a durable route submitted and polled to its end;
/// a credential nobody issued; a tool nobody configured. Then one scrape.
fn run_workload() -> Workload {
    prereq::require_tool("python3");
    let root = private_dir();
    let place = Place::new(root.path());
    let out = place.out.clone();
    let tokens = root.path().join("tokens.toml");
    tokens_file(&tokens, &[("monitor", 'm', &["metrics:read"])]);
    let mut sections = format!(
        "[auth]\ntokens_file = \"{}\"\n[approvals]\npoll_interval_ms = 5000\n",
        tokens.display()
    );
    sections += &tasks_upstream_table(&place, "up");
    sections += &place.hostile_table("die", "die", &[], "");
    let deploy = Tool::held_deploy(&out);
    let s = route::Setup::start_with_tools(
        root,
        &sections,
        &[deploy],
        &["up"],
        Duration::from_secs(60),
    );
    wait_upstream(&s.state, "die", s.settle, is_ready);
    let rt = runtime();
    let plain = s.daemon().client(false);
    let tasks = s.daemon().client(true);
    let call = |client: &taskgate::client::Client, target: &str| {
        rt.block_on(client.call_tool("deploy", json!({"target": target}), None))
            .unwrap()
    };
    let proposal = |result: &Value| {
        assert_eq!(
            result["structuredContent"]["status"], "approval_required",
            "{result}"
        );
        result["structuredContent"]["proposal"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let decide = |args: &[&str]| {
        let mut all = vec!["approvals"];
        all.extend(args);
        let done = s.admin(&all);
        assert!(done.status.success(), "{all:?}: {done:?}");
    };

    // Approvals: proposed 4, approved 1, consumed 1, rejected 1,
    // cancelled 1; one left waiting.
    let approved = proposal(&call(&plain, "eu"));
    decide(&["approve", &approved]);
    assert_eq!(call(&plain, "eu")["isError"], false);
    let rejected = proposal(&call(&plain, "us"));
    decide(&["reject", &rejected, "--reason", "not today"]);
    let waiting_since = Instant::now();
    let waiting = call(&tasks, "asia");
    assert_eq!(waiting["status"], "working", "{waiting}");
    let cancelled = call(&tasks, "mars");
    let cancelled = cancelled["taskId"].as_str().unwrap().to_string();
    rt.block_on(tasks.cancel_task(&cancelled)).unwrap();
    assert_eq!(
        std::fs::read_to_string(out.join("marker")).unwrap(),
        "eu\n",
        "only the approved call ran"
    );

    // An upstream tool called synchronously; an upstream that dies with
    // a call in flight, connected again afterwards.
    let r = rt
        .block_on(plain.call_tool("up.work", json!({"value": "direct"}), None))
        .unwrap();
    assert_eq!(text(&r), "done direct", "{r}");
    let died = rt.block_on(plain.call_tool("die.die", json!({}), None));
    assert_eq!(
        error_name(&died.unwrap_err()),
        "TG_UPSTREAM_CONNECTION_LOST"
    );
    wait_upstream(&s.state, "die", s.settle, |u| {
        is_ready(u) && u["last_error"].is_string()
    });

    // A durable route, polled to its end.
    let args = json!({"value": "routed"});
    let sub = s.submission("up.work", "key-1", &args, Duration::from_secs(600));
    let handle = s.submit(&sub, &args).unwrap();
    let done = s.wait(&task_id(&handle));
    assert_eq!(done["status"], "completed", "{done}");

    // A credential nobody issued, and a tool nobody configured.
    let (status, _, _) = scrape_raw(
        s.daemon().port,
        &format!("Authorization: Bearer {}\r\n", secret('z')),
    );
    assert_eq!(status, 401);
    assert!(
        rt.block_on(plain.call_tool("no-such-tool-x", json!({}), None))
            .is_err()
    );

    let (status, _, text) = scrape_raw(s.daemon().port, "");
    assert_eq!(status, 200, "{text}");
    Workload {
        text,
        pending_for: waiting_since.elapsed(),
    }
}

/// Whether the scrape has any sample of `name` with `labels`.
fn has(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> bool {
    scrape
        .samples
        .iter()
        .any(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
}

#[test]
fn after_a_known_workload_the_route_approval_and_upstream_series_are_exact_and_the_shipped_rules_name_only_what_is_exposed()
 {
    require_tool("promtool");
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/monitoring");
    let rules = docs.join("taskgate-alerts.yml");
    let out = Command::new("promtool")
        .arg("check")
        .arg("rules")
        .arg(&rules)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let workload = run_workload();
    let text = &workload.text;
    promtool_check_metrics(text);
    let s = parse(text);

    // Approvals, event by event; the one still waiting.
    for (event, n) in [
        ("proposed", 4.0),
        ("approved", 1.0),
        ("consumed", 1.0),
        ("rejected", 1.0),
        ("cancelled", 1.0),
    ] {
        assert_eq!(
            value(&s, "taskgate_approval_events_total", &[("event", event)]),
            n,
            "approval events {event}"
        );
    }
    assert!(
        !has(
            &s,
            "taskgate_approval_events_total",
            &[("event", "expired")]
        ),
        "nothing expired"
    );
    assert_eq!(value(&s, "taskgate_approvals_pending", &[]), 1.0);
    assert_eq!(value(&s, "taskgate_approvals_disabled", &[]), 0.0);
    let age = value(&s, "taskgate_approvals_oldest_pending_age_seconds", &[]);
    assert!(
        (0.0..=workload.pending_for.as_secs_f64() + 1.0).contains(&age),
        "the oldest waiting proposal waited {age} s, at most {:?}",
        workload.pending_for
    );

    // Upstreams: both connected now; the one that died failed once.
    for alias in ["up", "die"] {
        assert_eq!(
            value(&s, "taskgate_upstream_up", &[("upstream", alias)]),
            1.0,
            "{alias}"
        );
    }
    assert_eq!(
        value(&s, "taskgate_upstream_errors_total", &[("upstream", "die")]),
        1.0
    );
    assert!(
        !has(&s, "taskgate_upstream_errors_total", &[("upstream", "up")]),
        "{text}"
    );
    assert_eq!(
        value(
            &s,
            "taskgate_errors_total",
            &[("code", "TG_UPSTREAM_CONNECTION_LOST")]
        ),
        1.0
    );

    // Routes: the one submitted, ended; no other phase holds one.
    for (phase, n) in [
        ("prepared", 0.0),
        ("dispatching", 0.0),
        ("routed", 0.0),
        ("cancel_requested", 0.0),
        ("reconciliation_required", 0.0),
        ("terminal", 1.0),
    ] {
        assert_eq!(
            value(&s, "taskgate_routes", &[("phase", phase)]),
            n,
            "routes in phase {phase}"
        );
    }
    assert_eq!(
        value(
            &s,
            "taskgate_auth_failures_total",
            &[("reason", "unknown_token")]
        ),
        1.0
    );
    assert_eq!(
        value(&s, "taskgate_errors_total", &[("code", "TG_UNKNOWN_TOOL")]),
        1.0
    );

    // The shipped rules and dashboard name only what this scrape exposes:
    // nothing is added by hand, so a rule naming a metric the daemon does
    // not expose (or exposes under another name) fails here.
    let have = exposed(text);
    let rules_text = std::fs::read_to_string(&rules).unwrap();
    let exprs: Vec<String> = rules_text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr:"))
        .map(|e| e.trim().trim_matches(['|', '>', '\'']).to_string())
        .collect();
    assert!(exprs.len() >= 6, "{exprs:?}");
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(docs.join("taskgate-dashboard.json")).unwrap(),
    )
    .expect("the dashboard is JSON");
    let mut panel_exprs = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            panel_exprs.push(target["expr"].as_str().unwrap_or_default().to_string());
        }
    }
    assert!(panel_exprs.len() >= 8, "{panel_exprs:?}");
    for expr in exprs.iter().chain(&panel_exprs) {
        for name in names_in(expr) {
            assert!(
                have.contains(&name),
                "{name} (in `{expr}`) is not a metric the daemon exposes"
            );
        }
    }
}
