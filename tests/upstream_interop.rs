//! Upstreams taskgate did not write are the judge of its client side:
//! FastMCP (fastmcp-tasks 4.1.4 from PyPI) and the official TypeScript SDK
//! (@modelcontextprotocol/sdk from npm), each over stdio and over HTTP
//! (scripts/upstream-servers.sh), and another taskgate over stdio. Their
//! tools are listed, called synchronously, called as taskgate tasks,
//! cancelled, and their failures come back named. A tool of an upstream
//! that knows nothing of Tasks, marked as a taskgate task, survives a
//! `kill -9` of taskgate as failed/interrupted and ran exactly once; and
//! tenancy holds across the hop, the caller's token never reaching the
//! upstream.
//!
//! Invariant 16 of the map: A caller's identity and credential never reach an
//! upstream: taskgate calls it as itself, with its own credential from
//! `bearer_token_file`, and another owner's task of an upstream tool answers
//! exactly like an unknown one. Guarded by:
//! `tests/upstream_interop.rs::tenancy_holds_across_the_hop_and_the_callers_token_never_reaches_the_upstream`
//! (every header the upstream received, scanned for the callers' secrets and
//! any part of them)
//!
//! Invariant 17 of the map: A task of an upstream tool is committed before its
//! handle is returned and never sent to the upstream again: after a `kill -9`
//! it reads `failed` with `TG_TASK_INTERRUPTED`, and the upstream ran it once.
//! Guarded by:
//! `tests/upstream_interop.rs::a_marked_tool_of_an_upstream_without_tasks_survives_kill_9_as_interrupted_and_ran_once`
//! (a 2025-11-25 TypeScript SDK server with no Tasks of its own; its marker
//! file, read after a round trip on the new connection)
//!
//! What this file proves: upstreams taskgate did not write: FastMCP (PyPI) and
//! the TypeScript SDK (npm), each over stdio and HTTP, and another taskgate
//! over stdio and over HTTPS (its authority's certificate in `ca_file`,
//! taskgate's bearer credential from `bearer_token_file`; without `ca_file`,
//! never connected, the certificate named in `last_error`), listed, called
//! synchronously and as taskgate tasks, cancelled (the cancellation reaching
//! the server where it stops on one), failed, a spilled result read back; a
//! marked tool of a 2025-11-25 server surviving `kill -9` as interrupted and
//! run once; tenancy across the hop, the callers' tokens never in the headers
//! the upstream received; needs python3-venv, node and npm
//! (`scripts/upstream-servers.sh install`)

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::upstream::*;
use common::*;
use serde_json::{Value, json};
use taskgate::client::Client;

/// The SDK servers start an interpreter and may install on first use.
const SETTLE: Duration = Duration::from_secs(300);

/// Every upstream tool here is read-only as far as taskgate is told, and
/// runs as a taskgate task when the caller asks for one.
const MARKED: &str = "effect = \"read_only\"\ntask = \"optional\"";

/// Lists, calls, runs as tasks, cancels and fails the four tools of the
/// test servers behind `alias`. `cancel_reaches`: the server is known to
/// stop its tool on `notifications/cancelled`.
fn exercise(daemon: &Daemon, state: &Path, alias: &str, out: &Path, cancel_reaches: bool) {
    let u = wait_upstream(state, alias, SETTLE, is_ready);
    eprintln!(
        "{alias}: protocol {}, tasks advertised {}, server {}",
        u["protocol_version"], u["tasks_advertised"], u["server"]
    );
    // The four test tools (another taskgate adds its artifact_read).
    assert!(u["tools"].as_u64().unwrap() >= 4, "{u}");
    let rt = runtime();
    let sync = daemon.client(false);
    let tasks = daemon.client(true);
    let name = |t: &str| format!("{alias}.{t}");

    let listed = rt
        .block_on(sync.request("tools/list", json!({}), None, None))
        .unwrap();
    let echo = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name("echo"))
        .unwrap_or_else(|| panic!("{alias}.echo is not listed: {listed}"))
        .clone();
    assert!(
        echo["inputSchema"]["properties"]["text"].is_object(),
        "{echo}"
    );
    // The operator's effect, not the upstream's hints.
    assert_eq!(echo["annotations"]["readOnlyHint"], true, "{echo}");

    // Synchronous.
    let got = rt
        .block_on(sync.call_tool(&name("echo"), json!({"text": "hi there"}), None))
        .unwrap();
    assert_eq!(text(&got), "hi there", "{got}");
    assert!(
        got.get("_meta")
            .is_none_or(|m| m.get("io.modelcontextprotocol/serverInfo").is_none()),
        "{got}"
    );
    // Checked against the upstream's own schema before anything is sent.
    let e = rt
        .block_on(sync.call_tool(&name("echo"), json!({"text": 5}), None))
        .unwrap_err();
    assert_eq!(error_name(&e), "TG_INVALID_ARGUMENTS", "{e}");
    // The tool's failure is its result, as the upstream gave it.
    let got = rt
        .block_on(sync.call_tool(&name("fail"), json!({"message": "no such file"}), None))
        .unwrap();
    assert_eq!(got["isError"], true, "{got}");
    assert!(text(&got).contains("no such file"), "{got}");

    // As a taskgate task, to its end.
    let marker = out.join(format!("{alias}-slow"));
    let m = marker.to_string_lossy().to_string();
    let handle = rt
        .block_on(tasks.call_tool(&name("slow"), json!({"seconds": 0.3, "marker": m}), None))
        .unwrap();
    let id = task_id(&handle);
    let done = rt.block_on(tasks.wait_task(&id, &handle)).unwrap();
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(text(&done["result"]), "slept", "{done}");
    let marks = std::fs::read_to_string(&marker).unwrap();
    assert_eq!(marks.matches("started").count(), 1, "{marks}");

    // Cancelled while it runs.
    let marker = out.join(format!("{alias}-cancelled"));
    let m = marker.to_string_lossy().to_string();
    let handle = rt
        .block_on(tasks.call_tool(&name("slow"), json!({"seconds": 60, "marker": m}), None))
        .unwrap();
    let id = task_id(&handle);
    wait_text(&marker, "started", SETTLE);
    rt.block_on(tasks.cancel_task(&id)).unwrap();
    let done = rt.block_on(tasks.wait_task(&id, &handle)).unwrap();
    assert_eq!(done["status"], "cancelled", "{done}");
    if cancel_reaches {
        wait_text(&marker, "cancelled", Duration::from_secs(30));
    }

    // A result past 16 KiB is spilled and read back whole.
    let handle = rt
        .block_on(tasks.call_tool(&name("big"), json!({"bytes": 40_000}), None))
        .unwrap();
    let id = task_id(&handle);
    let done = rt.block_on(tasks.wait_task(&id, &handle)).unwrap();
    assert_eq!(done["status"], "completed", "{done}");
    let whole = rt
        .block_on(sync.call_tool("artifact_read", json!({"taskId": id}), None))
        .unwrap();
    assert_eq!(text(&whole).len(), 40_000, "{}", &whole.to_string()[..200]);
    assert!(healthy(daemon.port));
}

fn start(root: &Path, sections: &str) -> (Daemon, std::path::PathBuf) {
    let state = state_dir(root);
    let cfg = write_config(root, sections, &[]);
    let daemon = Daemon::start(&cfg, &state, &root.join("taskgate.log"));
    (daemon, state)
}

fn stop(daemon: Daemon) {
    let text = daemon.log_text();
    assert!(daemon.stop().success(), "{text}");
}

#[test]
fn fastmcp_over_stdio_is_listed_called_run_as_tasks_cancelled_and_failed() {
    let root = private_dir();
    let place = Place::new(root.path());
    let (daemon, state) = start(root.path(), &sdk_stdio_table("fast", "fastmcp", MARKED));
    exercise(&daemon, &state, "fast", &place.out, true);
    assert_eq!(upstreams(&state)[0]["protocol_version"], "2026-07-28");
    stop(daemon);
}

#[test]
fn fastmcp_over_http_is_listed_called_run_as_tasks_cancelled_and_failed() {
    let root = private_dir();
    let place = Place::new(root.path());
    let server = HttpServer::start(&["fastmcp"], &[]);
    let table = format!(
        "[[upstream]]\nalias = \"fast\"\nurl = \"{}\"\n{MARKED}\n",
        server.url()
    );
    let (daemon, state) = start(root.path(), &table);
    // Over HTTP FastMCP stops a tool when its request's connection closes,
    // not on notifications/cancelled.
    exercise(&daemon, &state, "fast", &place.out, false);
    stop(daemon);
}

#[test]
fn typescript_sdk_over_stdio_is_listed_called_run_as_tasks_cancelled_and_failed() {
    let root = private_dir();
    let place = Place::new(root.path());
    let (daemon, state) = start(root.path(), &sdk_stdio_table("ts", "ts", MARKED));
    exercise(&daemon, &state, "ts", &place.out, true);
    // A 2025-11-25 server: it never gets task routing, yet its tools run
    // as taskgate tasks.
    let u = &upstreams(&state)[0];
    assert_eq!(u["protocol_version"], "2025-11-25", "{u}");
    assert_eq!(u["tasks_advertised"], false, "{u}");
    stop(daemon);
}

#[test]
fn typescript_sdk_over_http_is_listed_called_run_as_tasks_cancelled_and_failed() {
    let root = private_dir();
    let place = Place::new(root.path());
    let server = HttpServer::start(&["ts"], &[]);
    let table = format!(
        "[[upstream]]\nalias = \"ts\"\nurl = \"{}\"\n{MARKED}\n",
        server.url()
    );
    let (daemon, state) = start(root.path(), &table);
    exercise(&daemon, &state, "ts", &place.out, true);
    stop(daemon);
}

#[test]
fn taskgate_is_another_taskgates_upstream() {
    let root = private_dir();
    let place = Place::new(root.path());
    // The inner taskgate serves the same four tools as command tools.
    let inner = root.path().join("inner");
    std::fs::create_dir_all(&inner).unwrap();
    let inner_state = inner.join("state");
    std::fs::create_dir_all(&inner_state).unwrap();
    std::fs::set_permissions(&inner_state, std::fs::Permissions::from_mode(0o700)).unwrap();
    let inner_cfg = write_config(
        &inner,
        "",
        &[
            Tool::new("echo").script("printf %s \"$0\"").args(&["{text}"]).required("text", "string"),
            Tool::new("slow")
                .script("echo started $$ >> \"$1\"; trap 'echo cancelled >> \"$1\"; exit 1' TERM; sleep \"$0\" & wait; echo finished >> \"$1\"; printf slept")
                .args(&["{seconds}", "{marker}"])
                .required("seconds", "number")
                .required("marker", "string")
                .unconfined("writes its marker anywhere"),
            Tool::new("fail").script("printf %s \"$0\" >&2; exit 3").args(&["{message}"]).required("message", "string"),
            Tool::new("big").script("head -c \"$0\" /dev/zero | tr '\\\\0' x").args(&["{bytes}"]).required("bytes", "integer"),
        ],
    );
    let table = format!(
        "[[upstream]]\nalias = \"inner\"\ncommand = [\"{BIN}\", \"serve\", \"--stdio\", \"--config\", \"{}\", \"--state-dir\", \"{}\"]\nsandbox = \"unconfined\"\n{MARKED}\n",
        inner_cfg.display(),
        inner_state.display()
    );
    let (daemon, state) = start(root.path(), &table);
    exercise(&daemon, &state, "inner", &place.out, true);
    let u = &upstreams(&state)[0];
    assert_eq!(u["protocol_version"], "2026-07-28", "{u}");
    assert_eq!(u["tasks_advertised"], true, "{u}");
    stop(daemon);
}

#[test]
fn a_marked_tool_of_an_upstream_without_tasks_survives_kill_9_as_interrupted_and_ran_once() {
    let root = private_dir();
    let place = Place::new(root.path());
    let state = state_dir(root.path());
    let cfg = write_config(root.path(), &sdk_stdio_table("ts", "ts", MARKED), &[]);
    let log = root.path().join("taskgate.log");
    let daemon = Daemon::start(&cfg, &state, &log);
    let first = wait_upstream(&state, "ts", SETTLE, is_ready);
    assert_eq!(first["tasks_advertised"], false, "{first}");
    let marker = place.out.join("once");
    let m = marker.to_string_lossy().to_string();
    let rt = runtime();
    let handle = rt
        .block_on(daemon.client(true).call_tool(
            "ts.slow",
            json!({"seconds": 120, "marker": m}),
            None,
        ))
        .unwrap();
    let id = task_id(&handle);
    let marks = wait_text(&marker, "started", SETTLE);
    let upstream_pid: i32 = marks
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {marks:?}"));
    daemon.kill();
    // The upstream dies with taskgate (its shim's parent-death signal).
    let start = Instant::now();
    while Path::new(&format!("/proc/{upstream_pid}")).exists() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "upstream {upstream_pid} outlived taskgate"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let daemon = Daemon::start(&cfg, &state, &log);
    let again = wait_upstream(&state, "ts", SETTLE, is_ready);
    assert_ne!(again["session"], first["session"], "{again}");
    let task = rt.block_on(daemon.client(true).get_task(&id)).unwrap();
    assert_eq!(task["status"], "failed", "{task}");
    assert_eq!(
        task["error"]["data"]["name"], "TG_TASK_INTERRUPTED",
        "{task}"
    );
    // A round trip through the new connection, then the marker: the call
    // was made once and never sent again.
    let echo = rt
        .block_on(
            daemon
                .client(false)
                .call_tool("ts.echo", json!({"text": "still here"}), None),
        )
        .unwrap();
    assert_eq!(text(&echo), "still here");
    let marks = std::fs::read_to_string(&marker).unwrap();
    assert_eq!(marks.matches("started").count(), 1, "{marks}");
    assert!(!marks.contains("finished"), "{marks}");
    stop(daemon);
}

/// A static secret of the shape taskgate issues.
fn secret(seed: char) -> String {
    format!("tgk_{}", seed.to_string().repeat(43))
}

fn hash(secret: &str) -> String {
    use sha2::{Digest as _, Sha256};
    let d = Sha256::digest(secret.as_bytes());
    let hex: String = d.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

#[test]
fn tenancy_holds_across_the_hop_and_the_callers_token_never_reaches_the_upstream() {
    let root = private_dir();
    let place = Place::new(root.path());
    let state = state_dir(root.path());
    let headers = place.out.join("headers.jsonl");
    let server = HttpServer::start(
        &["ts"],
        &[("UPSTREAM_HEADER_LOG", &headers.to_string_lossy())],
    );
    let (alice, carol) = (secret('a'), secret('c'));
    let tokens = root.path().join("tokens.toml");
    let mut text_ = String::new();
    for (id, s, tenant) in [("alice", &alice, "acme"), ("carol", &carol, "globex")] {
        text_ += &format!(
            "[[token]]\nid = \"{id}\"\nhash = \"{}\"\ntenant = \"{tenant}\"\nsubject = \"{id}\"\nscopes = [\"tools:call\", \"tasks:read\", \"tasks:cancel\"]\n\n",
            hash(s)
        );
    }
    std::fs::write(&tokens, text_).unwrap();
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600)).unwrap();
    let credential = root.path().join("upstream.token");
    std::fs::write(&credential, "upstream-credential-of-taskgate\n").unwrap();
    std::fs::set_permissions(&credential, std::fs::Permissions::from_mode(0o600)).unwrap();
    let cfg = write_config(
        root.path(),
        &format!(
            "[auth]\ntokens_file = \"{}\"\nlocal_owner = \"never\"\n[[upstream]]\nalias = \"ts\"\nurl = \"{}\"\nbearer_token_file = \"{}\"\n{MARKED}\n",
            tokens.display(),
            server.url(),
            credential.display()
        ),
        &[],
    );
    let daemon = Daemon::start(&cfg, &state, &root.path().join("taskgate.log"));
    wait_upstream(&state, "ts", SETTLE, is_ready);
    let rt = runtime();
    let as_ = |s: &str| {
        Client::new(&daemon.url(), true)
            .unwrap()
            .with_token(Some(s.to_string()))
    };
    let m = place.out.join("tenancy").to_string_lossy().to_string();
    let handle = rt
        .block_on(as_(&alice).call_tool("ts.slow", json!({"seconds": 1, "marker": m}), None))
        .unwrap();
    let id = task_id(&handle);
    // Another owner's task answers exactly like an unknown one.
    let unknown = format!("tg-{}", "0".repeat(32));
    let foreign = rt.block_on(as_(&carol).get_task(&id)).unwrap_err();
    let missing = rt.block_on(as_(&carol).get_task(&unknown)).unwrap_err();
    assert_eq!(error_name(&foreign), "TG_TASK_NOT_FOUND", "{foreign}");
    assert_eq!(foreign.to_string(), missing.to_string());
    let foreign = rt.block_on(as_(&carol).cancel_task(&id)).unwrap_err();
    assert_eq!(error_name(&foreign), "TG_TASK_NOT_FOUND", "{foreign}");
    let done = rt.block_on(as_(&alice).wait_task(&id, &handle)).unwrap();
    assert_eq!(done["status"], "completed", "{done}");
    // A synchronous call too, for carol.
    let sync = Client::new(&daemon.url(), false)
        .unwrap()
        .with_token(Some(carol.clone()));
    let echo = rt
        .block_on(sync.call_tool("ts.echo", json!({"text": "x"}), None))
        .unwrap();
    assert_eq!(text(&echo), "x");

    // Every request the upstream received carried taskgate's credential,
    // and none a caller's.
    let seen = std::fs::read_to_string(&headers).unwrap();
    let lines: Vec<Value> = seen
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(lines.len() >= 3, "{seen}");
    for l in &lines {
        assert_eq!(
            l["headers"]["authorization"], "Bearer upstream-credential-of-taskgate",
            "{l}"
        );
    }
    for s in [&alice, &carol] {
        assert!(
            !seen.contains(s.as_str()),
            "a caller's token reached the upstream"
        );
        assert!(
            !seen.contains(&s[4..20]),
            "part of a caller's token reached the upstream"
        );
    }
    stop(daemon);
}

#[test]
fn taskgate_over_https_is_an_upstream_with_a_ca_file_and_a_bearer_credential() {
    let root = private_dir();
    // The inner taskgate: TLS with a certificate of a test authority, and
    // only bearer credentials admitted.
    let inner = root.path().join("inner");
    std::fs::create_dir_all(&inner).unwrap();
    let issued = common::tls::issue(&inner, "first");
    let (cert_path, key_path, ca_path) = (issued.cert, issued.key, issued.ca_pem);
    let outer_secret = secret('u');
    let tokens = inner.join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[[token]]\nid = \"outer\"\nhash = \"{}\"\ntenant = \"edge\"\nsubject = \"outer-taskgate\"\nscopes = [\"tools:call\"]\n",
            hash(&outer_secret)
        ),
    )
    .unwrap();
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600)).unwrap();
    let inner_cfg = write_config(
        &inner,
        &format!(
            "[server]\ntls = \"on\"\ntls_cert_file = \"{}\"\ntls_key_file = \"{}\"\n[auth]\nlocal_owner = \"never\"\ntokens_file = \"{}\"\n",
            cert_path.display(),
            key_path.display(),
            tokens.display()
        ),
        &[Tool::new("echo")
            .script("printf %s \"$0\"")
            .args(&["{text}"])
            .required("text", "string")],
    );
    let inner_state = state_dir(&inner);
    let inner_daemon = Daemon::start(&inner_cfg, &inner_state, &inner.join("taskgate.log"));
    let url = format!("https://127.0.0.1:{}/mcp", inner_daemon.port);

    let credential = root.path().join("inner.token");
    std::fs::write(&credential, format!("{outer_secret}\n")).unwrap();
    std::fs::set_permissions(&credential, std::fs::Permissions::from_mode(0o600)).unwrap();
    let table = |alias: &str, ca: Option<&Path>| {
        format!(
            "[[upstream]]\nalias = \"{alias}\"\nurl = \"{url}\"\nbearer_token_file = \"{}\"\n{}effect = \"read_only\"\nconnect_timeout_secs = 5\n",
            credential.display(),
            ca.map(|p| format!("ca_file = \"{}\"\n", p.display()))
                .unwrap_or_default()
        )
    };
    let sections = format!(
        "{}{}",
        table("inner", Some(&ca_path)),
        // Without the authority's certificate the system's roots do not
        // know this server: never connected, and said so.
        table("untrusted", None)
    );
    let (daemon, state) = start(root.path(), &sections);
    let u = wait_upstream(&state, "inner", SETTLE, is_ready);
    assert_eq!(u["protocol_version"], "2026-07-28", "{u}");
    let rt = runtime();
    let got = rt
        .block_on(
            daemon
                .client(false)
                .call_tool("inner.echo", json!({"text": "over tls"}), None),
        )
        .unwrap();
    assert_eq!(text(&got), "over tls", "{got}");
    let bad = wait_upstream(&state, "untrusted", SETTLE, |u| u["last_error"].is_string());
    assert_ne!(bad["state"], "ready", "{bad}");
    eprintln!("untrusted: {}", bad["last_error"]);
    assert!(
        bad["last_error"].as_str().unwrap().contains("certificate"),
        "the operator is not told why: {bad}"
    );
    let e = rt
        .block_on(
            daemon
                .client(false)
                .call_tool("untrusted.echo", json!({"text": "x"}), None),
        )
        .unwrap_err();
    assert_eq!(error_name(&e), "TG_UPSTREAM_UNAVAILABLE", "{e}");
    stop(daemon);
    let text = inner_daemon.log_text();
    assert!(inner_daemon.stop().success(), "{text}");
}
