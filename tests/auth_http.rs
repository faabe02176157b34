//! Authentication and tenancy over HTTP, against the real daemon on a real
//! socket: bearer challenges byte for byte, the scope matrix, two tenants
//! that cannot see each other's tasks, per-owner limits, revocation by
//! reload while a task keeps running, the protected resource metadata, JWTs
//! signed here (every bad one refused like an unknown token), no credential
//! on disk or in the debug log, and `serve` refusing an exposed listener.
//!
//! Invariant 5a of the map: With credentials configured, no `/mcp` request acts
//! without a caller: no or a bad credential is a 401 with the same challenge
//! whatever the reason, a missing scope a 403 naming all the operation needs,
//! and an HTTP request that reaches the handler without a caller is refused
//! rather than made local. Guarded by: `tests/auth_http.rs`
//! (`missing_and_invalid_credentials_get_the_exact_challenges`,
//! `every_missing_scope_is_named_in_one_challenge`,
//! `a_legacy_session_is_scope_checked_too`,
//! `revoking_by_reload_needs_no_restart_and_spares_running_tasks`,
//! `every_bad_jwt_is_refused_like_an_unknown_token_and_a_good_one_owns_its_task`);
//! `mcp::handler` refuses a caller-less HTTP request by construction
//! (`Handler::for_http`); only a request without any `Authorization` header may
//! be the local caller
//! (`a_malformed_authorization_header_is_refused_not_taken_for_none`), and only
//! from a loopback peer
//! (`without_credentials_a_peer_that_is_not_loopback_is_refused`, in a network
//! namespace of its own); a legacy session answers only its opener's owner,
//! every method against every kind of stranger
//! (`a_legacy_session_answers_only_the_caller_that_opened_it`); a foreign
//! `Origin` is refused before authentication
//! (`a_foreign_origin_is_refused_on_every_method`)
//!
//! What this file proves: authentication and tenancy over HTTP against the real
//! daemon: the exact challenges, the scope matrix, tenants that cannot see each
//! other's tasks, per-owner limits, revocation by reload, protected resource
//! metadata, every bad JWT answered like an unknown token, no credential on
//! disk or in the log, the exposed-listener refusal; a malformed
//! `Authorization` header refused rather than taken for none; no credential
//! from a peer that is not loopback refused; legacy sessions answering only
//! their opener; foreign `Origin`s refused

mod common;

use std::net::{Ipv4Addr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use taskgate::wire;

/// A static secret of the shape taskgate issues, distinct per `seed`.
fn secret(seed: char) -> String {
    format!("tgk_{}", seed.to_string().repeat(43))
}

fn hash(secret: &str) -> String {
    let d = Sha256::digest(secret.as_bytes());
    let hex: String = d.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

struct Token {
    id: &'static str,
    seed: char,
    tenant: &'static str,
    subject: &'static str,
    scopes: &'static [&'static str],
    extra: &'static str,
}

const ALL: &[&str] = &[
    "tools:call",
    "tasks:read",
    "tasks:cancel",
    "taskgate:effect:idempotent-write",
];

/// Alice and Bob of tenant acme, Carol of tenant globex, and tokens that
/// must all fail alike.
const TOKENS: &[Token] = &[
    Token {
        id: "alice",
        seed: 'a',
        tenant: "acme",
        subject: "alice",
        scopes: ALL,
        extra: "",
    },
    Token {
        id: "alice2",
        seed: 'A',
        tenant: "acme",
        subject: "alice",
        scopes: ALL,
        extra: "",
    },
    Token {
        id: "carol",
        seed: 'c',
        tenant: "globex",
        subject: "carol",
        scopes: ALL,
        extra: "",
    },
    Token {
        id: "reader",
        seed: 'r',
        tenant: "acme",
        subject: "reader",
        scopes: &["tasks:read"],
        extra: "",
    },
    Token {
        id: "caller",
        seed: 'k',
        tenant: "acme",
        subject: "caller",
        scopes: &["tools:call"],
        extra: "",
    },
    Token {
        id: "nobody",
        seed: 'n',
        tenant: "acme",
        subject: "nobody",
        scopes: &[],
        extra: "",
    },
    Token {
        id: "old",
        seed: 'o',
        tenant: "acme",
        subject: "old",
        scopes: ALL,
        extra: "expires = \"2020-01-01T00:00:00Z\"\n",
    },
    Token {
        id: "gone",
        seed: 'g',
        tenant: "acme",
        subject: "gone",
        scopes: ALL,
        extra: "revoked = true\n",
    },
    Token {
        id: "boss",
        seed: 'b',
        tenant: "acme",
        subject: "boss",
        scopes: &["admin"],
        extra: "",
    },
];

fn tokens_file(path: &Path, revoke: &[&str]) {
    tokens_file_with(path, revoke, "");
}

/// `tokens_file` with more `[[token]]` entries appended as they are.
fn tokens_file_with(path: &Path, revoke: &[&str], extra: &str) {
    let mut text = String::new();
    for t in TOKENS {
        let scopes: Vec<String> = t.scopes.iter().map(|s| format!("{s:?}")).collect();
        text += &format!(
            "[[token]]\nid = {:?}\nhash = {:?}\ntenant = {:?}\nsubject = {:?}\nscopes = [{}]\n{}",
            t.id,
            hash(&secret(t.seed)),
            t.tenant,
            t.subject,
            scopes.join(", "),
            t.extra
        );
        if revoke.contains(&t.id) {
            text += "revoked = true\n";
        }
        text += "\n";
    }
    text += extra;
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

struct Fixture {
    root: tempfile::TempDir,
    daemon: Daemon,
    cfg: PathBuf,
    state: PathBuf,
    tokens: PathBuf,
    release: PathBuf,
}

fn start(auth: &str, tasks: &str) -> Fixture {
    start_with(auth, tasks, "", None)
}

/// `start` with more `[[token]]` entries and, when given, a log filter.
fn start_with(auth: &str, tasks: &str, extra_tokens: &str, log_level: Option<&str>) -> Fixture {
    let root = private_dir();
    let state = state_dir(root.path());
    let tokens = root.path().join("tokens.toml");
    tokens_file_with(&tokens, &[], extra_tokens);
    let release = root.path().join("release");
    let cfg = write_config(
        root.path(),
        &format!(
            "[auth]\ntokens_file = \"{}\"\n{auth}\n[tasks]\npoll_interval_ms = 50\n{tasks}\n",
            tokens.display()
        ),
        &[
            Tool::new("nap")
                .script("printf rested")
                .task("optional")
                .input(),
            Tool::new("wait")
                .script(&format!(
                    "while [ ! -e {} ]; do sleep 0.05; done; printf released",
                    release.display()
                ))
                .unconfined("it waits for a file beside the state directory")
                .task("required")
                .input(),
            Tool::new("put")
                .script("printf stored")
                .effect("idempotent_write")
                .task("optional")
                .input(),
        ],
    );
    let mut builder = Daemon::builder()
        .config(&cfg)
        .state_dir(&state)
        .log(&root.path().join("log"));
    if let Some(level) = log_level {
        builder = builder.env("TASKGATE_LOG", level);
    }
    let daemon = builder.start();
    Fixture {
        root,
        daemon,
        cfg,
        state,
        tokens,
        release,
    }
}

/// One HTTP exchange's outcome.
#[derive(Debug)]
struct Reply {
    status: u16,
    challenge: Option<String>,
    body: Value,
    raw: String,
}

impl Reply {
    fn code(&self) -> i64 {
        self.body["error"]["code"].as_i64().unwrap_or(0)
    }
}

/// Sends one request on a fresh connection and reads the whole answer.
fn exchange(port: u16, request: &str) -> Reply {
    exchange_on(TcpStream::connect(("127.0.0.1", port)).unwrap(), request)
}

/// Sends one request on the connection `s` and reads the whole answer; an
/// answer that is not HTTP (or none) is status 0.
fn exchange_on(s: TcpStream, request: &str) -> Reply {
    match http::exchange_on(s, request.as_bytes(), Duration::from_secs(30)) {
        http::Outcome::Answer(r) => Reply {
            status: r.status,
            challenge: r.header("www-authenticate").map(str::to_string),
            body: serde_json::from_str(r.text().trim()).unwrap_or(Value::Null),
            raw: r.to_string(),
        },
        http::Outcome::Closed(got) | http::Outcome::Hang(got) => Reply {
            status: 0,
            challenge: None,
            body: Value::Null,
            raw: String::from_utf8_lossy(&got).into_owned(),
        },
    }
}

/// A 2026-07-28 request with the Tasks extension declared.
fn rpc(port: u16, token: Option<&str>, method: &str, params: Value) -> Reply {
    exchange(port, &rpc_request(port, token, method, params))
}

/// The request [`rpc`] sends.
fn rpc_request(port: u16, token: Option<&str>, method: &str, params: Value) -> String {
    let mut params = params;
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities":
            {"extensions": {"io.modelcontextprotocol/tasks": {}}}
    });
    let name = params["name"]
        .as_str()
        .or(params["taskId"].as_str())
        .map(|n| format!("Mcp-Name: {n}\r\n"))
        .unwrap_or_default();
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params}).to_string();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\nMcp-Method: {method}\r\n{name}{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

fn port(f: &Fixture) -> u16 {
    f.daemon.port
}

/// Creates a task of `tool` as the holder of `token`; its ID.
fn create(port: u16, token: &str, tool: &str) -> String {
    let r = rpc(
        port,
        Some(token),
        "tools/call",
        json!({"name": tool, "arguments": {}}),
    );
    let id = r.body["result"]["task"]["taskId"]
        .as_str()
        .or(r.body["result"]["taskId"].as_str());
    id.unwrap_or_else(|| panic!("no task from {tool}: {}", r.raw))
        .to_string()
}

/// The task's status. Polling in a loop needs no pause: the daemon holds a
/// poll that comes before the task's interval (50 ms here) until it is due.
fn status_of(port: u16, token: &str, id: &str) -> String {
    let r = rpc(port, Some(token), "tasks/get", json!({"taskId": id}));
    r.body["result"]["status"]
        .as_str()
        .or(r.body["result"]["task"]["status"].as_str())
        .unwrap_or_else(|| panic!("no status: {}", r.raw))
        .to_string()
}

const BARE: &str = r#"Bearer realm="taskgate""#;
const INVALID: &str = r#"Bearer realm="taskgate", error="invalid_token", error_description="the bearer token is not valid here: unknown, malformed, expired or revoked""#;

/// A request without any credential: 401 with the bare challenge and the
/// unauthenticated code.
fn assert_bare_challenge(r: &Reply) {
    assert_eq!(
        (r.status, r.challenge.as_deref()),
        (401, Some(BARE)),
        "{}",
        r.raw
    );
    assert_eq!(r.code(), wire::UNAUTHENTICATED.code, "{}", r.raw);
}

#[test]
fn missing_and_invalid_credentials_get_the_exact_challenges() {
    let f = start("local_owner = \"never\"", "");
    let port = port(&f);
    assert_bare_challenge(&rpc(port, None, "tools/list", json!({})));

    // Unknown, expired, revoked, malformed and not-our-shape tokens read
    // the same, byte for byte.
    let unknown = rpc(port, Some(&secret('z')), "tools/list", json!({}));
    assert_eq!(
        (unknown.status, unknown.challenge.as_deref()),
        (401, Some(INVALID)),
        "{}",
        unknown.raw
    );
    for token in [
        secret('o'),
        secret('g'),
        "tgk_short".into(),
        "a.b.c".into(),
        "xyz".into(),
    ] {
        let r = rpc(port, Some(&token), "tools/list", json!({}));
        assert_eq!(r.status, 401, "{token}: {}", r.raw);
        assert_eq!(r.challenge, unknown.challenge, "{token}");
        assert_eq!(r.body, unknown.body, "{token}");
    }
    // A good token works.
    let ok = rpc(port, Some(&secret('a')), "tools/list", json!({}));
    assert_eq!(ok.status, 200, "{}", ok.raw);
    assert!(ok.body["result"]["tools"].is_array(), "{}", ok.raw);
    // No token's text reaches the log.
    let log = f.daemon.log_text();
    for t in TOKENS {
        assert!(
            !log.contains(&secret(t.seed)),
            "the secret of {} is in the log",
            t.id
        );
    }
}

#[test]
fn loopback_without_credentials_is_the_local_owner_only_where_allowed() {
    let f = start("local_owner = \"loopback\"", "");
    let port = port(&f);
    let r = rpc(
        port,
        None,
        "tools/call",
        json!({"name": "nap", "arguments": {}}),
    );
    assert_eq!(r.status, 200, "{}", r.raw);
    // A token that is presented is checked even on loopback.
    let r = rpc(port, Some(&secret('z')), "tools/list", json!({}));
    assert_eq!(r.status, 401, "{}", r.raw);
}

/// A documentation address (TEST-NET-1, RFC 5737): local in the test's
/// own network namespace, and not loopback.
const NOT_LOOPBACK: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);

/// Runs `f` on a thread of its own in a new network namespace whose
/// loopback interface also carries `extra`. What the thread starts (the
/// daemon) shares the namespace; the rest of the test process does not.
/// The daemon can then be reached from an address that is not loopback,
/// whatever interfaces the machine has.
fn in_a_network_namespace<T: Send>(extra: Ipv4Addr, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // SAFETY: unshare takes no pointer; a new network namespace
                // moves only the calling thread.
                let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
                assert_eq!(
                    rc,
                    0,
                    "unshare(CLONE_NEWNET): {}",
                    std::io::Error::last_os_error()
                );
                let with_prefix = format!("{extra}/32");
                for args in [
                    &["link", "set", "lo", "up"][..],
                    &["address", "add", &with_prefix, "dev", "lo"][..],
                ] {
                    let out = std::process::Command::new("ip")
                        .args(args)
                        .output()
                        .unwrap();
                    assert!(out.status.success(), "ip {args:?}: {out:?}");
                }
                f()
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// A connection to the daemon's loopback port from `source`, a local
/// address that is not loopback: the daemon sees `source` as its peer.
fn connect_from(source: Ipv4Addr, port: u16) -> TcpStream {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    rt.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind((source, 0).into()).unwrap();
        let stream = socket
            .connect((Ipv4Addr::LOCALHOST, port).into())
            .await
            .unwrap()
            .into_std()
            .unwrap();
        stream.set_nonblocking(false).unwrap();
        stream
    })
}

/// `local_owner = "loopback"` makes a request without credentials the
/// local caller only when its peer is a loopback address: from any other
/// address the same request gets the bare challenge, as it would with
/// `local_owner = "never"`, while a token still works from there.
#[test]
fn without_credentials_a_peer_that_is_not_loopback_is_refused() {
    prereq::require_root("a network namespace with an address that is not loopback");
    prereq::require_tool("ip");
    in_a_network_namespace(NOT_LOOPBACK, || {
        let f = start("local_owner = \"loopback\"", "");
        let port = port(&f);
        let call = json!({"name": "nap", "arguments": {}});
        let local = rpc(port, None, "tools/call", call.clone());
        assert_eq!(local.status, 200, "{}", local.raw);
        let request = rpc_request(port, None, "tools/call", call);
        assert_bare_challenge(&exchange_on(connect_from(NOT_LOOPBACK, port), &request));
        let request = rpc_request(port, Some(&secret('a')), "tools/list", json!({}));
        let ok = exchange_on(connect_from(NOT_LOOPBACK, port), &request);
        assert_eq!(ok.status, 200, "{}", ok.raw);
        assert!(ok.body["result"]["tools"].is_array(), "{}", ok.raw);
    });
}

#[test]
fn every_missing_scope_is_named_in_one_challenge() {
    let f = start("local_owner = \"never\"", "");
    let port = port(&f);
    let id = create(port, &secret('a'), "nap");
    // (token, method, params, scopes the operation needs, missing)
    let cases: Vec<(char, &str, Value, &str, &str)> = vec![
        (
            'r',
            "tools/call",
            json!({"name": "nap", "arguments": {}}),
            "tools:call",
            "tools:call",
        ),
        (
            'n',
            "tools/call",
            json!({"name": "put", "arguments": {}}),
            "tools:call taskgate:effect:idempotent-write",
            "tools:call, taskgate:effect:idempotent-write",
        ),
        (
            'k',
            "tools/call",
            json!({"name": "put", "arguments": {}}),
            "tools:call taskgate:effect:idempotent-write",
            "taskgate:effect:idempotent-write",
        ),
        (
            'k',
            "tasks/get",
            json!({"taskId": id}),
            "tasks:read",
            "tasks:read",
        ),
        (
            'k',
            "tasks/cancel",
            json!({"taskId": id}),
            "tasks:cancel",
            "tasks:cancel",
        ),
        (
            'r',
            "tasks/update",
            json!({"taskId": id, "inputResponses": {}}),
            "tasks:cancel",
            "tasks:cancel",
        ),
        (
            'k',
            "tools/call",
            json!({"name": "artifact_read", "arguments": {"taskId": id}}),
            "tasks:read",
            "tasks:read",
        ),
    ];
    for (seed, method, params, needed, missing) in cases {
        let r = rpc(port, Some(&secret(seed)), method, params.clone());
        assert_eq!(r.status, 403, "{method} {params}: {}", r.raw);
        let described = if missing.contains(',') {
            format!(
                "this credential lacks the scopes {missing} needed here; ask for a token that grants them"
            )
        } else {
            format!(
                "this credential lacks the scope {missing} needed here; ask for a token that grants it"
            )
        };
        assert_eq!(
            r.challenge.as_deref(),
            Some(format!(r#"Bearer realm="taskgate", error="insufficient_scope", scope="{needed}", error_description="{described}""#).as_str()),
            "{method}"
        );
        assert_eq!(r.code(), wire::FORBIDDEN.code, "{}", r.raw);
        assert_eq!(r.body["id"], 7, "{}", r.raw);
    }
    // admin implies every scope.
    let r = rpc(
        port,
        Some(&secret('b')),
        "tools/call",
        json!({"name": "put", "arguments": {}}),
    );
    assert_eq!(r.status, 200, "{}", r.raw);
}

#[test]
fn a_legacy_session_is_scope_checked_too() {
    let f = start("local_owner = \"never\"", "");
    let port = port(&f);
    let token = secret('r');
    let session = open_session(port, Some(&token), "2025-06-18");
    // No Mcp-Method header: only the body says this is a tools/call.
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "nap", "arguments": {}}})
    .to_string();
    let r = exchange(
        port,
        &format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMcp-Session-Id: {session}\r\nMCP-Protocol-Version: 2025-06-18\r\nAuthorization: Bearer {token}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{call}",
            call.len()
        ),
    );
    assert_eq!(r.status, 403, "{}", r.raw);
    assert_eq!(r.code(), wire::FORBIDDEN.code, "{}", r.raw);
}

#[test]
fn another_tenants_task_reads_exactly_like_an_unknown_one() {
    let f = start("local_owner = \"never\"", "");
    let port = port(&f);
    let (alice, alice2, carol) = (secret('a'), secret('A'), secret('c'));
    let id = create(port, &alice, "nap");
    // Another credential of the same subject sees it.
    assert!(["working", "completed"].contains(&status_of(port, &alice2, &id).as_str()));
    let unknown = "tg-0123456789abcdef0123456789abcdef";
    for (method, params) in [
        ("tasks/get", json!({"taskId": "ID"})),
        ("tasks/cancel", json!({"taskId": "ID"})),
        (
            "tasks/update",
            json!({"taskId": "ID", "inputResponses": {}}),
        ),
    ] {
        let with = |task: &str| {
            let p: Value = serde_json::from_str(&params.to_string().replace("ID", task)).unwrap();
            rpc(port, Some(&carol), method, p)
        };
        let (foreign, nothing) = (with(&id), with(unknown));
        // Two broken answers would compare equal too: the answer must be
        // the one for an unknown task.
        assert_eq!(
            nothing.code(),
            wire::UNKNOWN_TASK.code,
            "{method}: {}",
            nothing.raw
        );
        assert_eq!(
            nothing.body["error"]["data"]["name"],
            wire::UNKNOWN_TASK.name,
            "{method}: {}",
            nothing.raw
        );
        assert_eq!(foreign.status, nothing.status, "{method}");
        assert_eq!(
            foreign.body.to_string().replace(&id, "ID"),
            nothing.body.to_string().replace(unknown, "ID"),
            "{method}: {} vs {}",
            foreign.raw,
            nothing.raw
        );
    }
    let read = |task: &str| {
        rpc(
            port,
            Some(&carol),
            "tools/call",
            json!({"name": "artifact_read", "arguments": {"taskId": task}}),
        )
    };
    let nothing = read(unknown);
    assert_eq!(
        nothing.body["error"]["data"]["name"],
        wire::ARTIFACT_UNAVAILABLE.name,
        "{}",
        nothing.raw
    );
    assert_eq!(
        read(&id).body.to_string().replace(&id, "ID"),
        nothing.body.to_string().replace(unknown, "ID")
    );
    // And Alice's task was not touched by Carol's cancel.
    assert_ne!(status_of(port, &alice, &id), "cancelled");
}

#[test]
fn per_owner_limits_refuse_only_the_owner_at_its_limit() {
    let f = start("local_owner = \"never\"", "max_running_per_owner = 1");
    let port = port(&f);
    let (alice, carol) = (secret('a'), secret('c'));
    let first = create(port, &alice, "wait");
    let second = rpc(
        port,
        Some(&alice),
        "tools/call",
        json!({"name": "wait", "arguments": {}}),
    );
    assert_eq!(second.code(), wire::OWNER_LIMIT.code, "{}", second.raw);
    assert!(
        second.body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("tasks.max_running_per_owner"),
        "{}",
        second.raw
    );
    let other = create(port, &carol, "wait");
    std::fs::write(&f.release, "").unwrap();
    for (token, id) in [(&alice, &first), (&carol, &other)] {
        let deadline = Instant::now() + Duration::from_secs(20);
        while status_of(port, token, id) != "completed" {
            assert!(Instant::now() < deadline, "{id} did not complete");
        }
    }
    // Its place is free again.
    create(port, &alice, "wait");
}

#[test]
fn revoking_by_reload_needs_no_restart_and_spares_running_tasks() {
    let mut f = start("local_owner = \"never\"", "");
    let port = port(&f);
    let alice = secret('a');
    let running = create(port, &alice, "wait");
    tokens_file(&f.tokens, &["alice"]);
    let pid = f.daemon.pid();
    f.daemon.signal(Signal::SIGHUP);
    // The reload is applied when the daemon says so (READY=1 after RELOADING=1).
    f.daemon.wait_for("RELOADING=1", Duration::from_secs(20));
    f.daemon.wait_for("READY=1", Duration::from_secs(20));
    let r = rpc(port, Some(&alice), "tasks/get", json!({"taskId": running}));
    assert_eq!(
        (r.status, r.challenge.as_deref()),
        (401, Some(INVALID)),
        "{}",
        r.raw
    );
    // The same subject's other credential still reads the task, which
    // completes: the daemon did not restart.
    std::fs::write(&f.release, "").unwrap();
    let alice2 = secret('A');
    let deadline = Instant::now() + Duration::from_secs(20);
    while status_of(port, &alice2, &running) != "completed" {
        assert!(
            Instant::now() < deadline,
            "the running task did not complete"
        );
    }
    assert_eq!(f.daemon.pid(), pid);
    // Revoked across a restart as well.
    assert_eq!(f.daemon.stop().code(), Some(0));
    let again = Daemon::start(&f.cfg, &f.state, &f.root.path().join("log2"));
    let port = again.port;
    let r = rpc(port, Some(&alice), "tasks/get", json!({"taskId": running}));
    assert_eq!(
        (r.status, r.challenge.as_deref()),
        (401, Some(INVALID)),
        "{}",
        r.raw
    );
    assert_eq!(status_of(port, &alice2, &running), "completed");
}

mod tls {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
    use tokio_rustls::rustls::{ClientConfig, RootCertStore};

    /// The authority's and the server's certificates, as the tests below
    /// use them.
    fn issue(
        dir: &Path,
        tag: &str,
    ) -> (
        PathBuf,
        PathBuf,
        CertificateDer<'static>,
        CertificateDer<'static>,
    ) {
        let i = common::tls::issue(dir, tag);
        (i.cert, i.key, i.ca, i.leaf)
    }

    /// One request over TLS trusting `ca`; the answer and the certificate
    /// the server showed.
    fn over_tls(port: u16, ca: &CertificateDer<'static>, request: &str) -> (String, Vec<u8>) {
        runtime().block_on(async {
            let mut roots = RootCertStore::empty();
            roots.add(ca.clone()).unwrap();
            let provider =
                std::sync::Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
            let config = ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
            let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
            let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .unwrap();
            let name = ServerName::try_from("127.0.0.1").unwrap();
            let mut tls = connector.connect(name, tcp).await.expect("TLS handshake");
            let shown = tls.get_ref().1.peer_certificates().unwrap()[0].to_vec();
            tls.write_all(request.as_bytes()).await.unwrap();
            let mut raw = Vec::new();
            let _ = tls.read_to_end(&mut raw).await;
            (String::from_utf8_lossy(&raw).to_string(), shown)
        })
    }

    #[test]
    fn tls_serves_authenticated_callers_and_a_renewed_certificate_needs_no_restart() {
        let root = private_dir();
        let state = state_dir(root.path());
        let tokens = root.path().join("tokens.toml");
        tokens_file(&tokens, &[]);
        let (cert, key, ca, leaf) = issue(root.path(), "first");
        let cfg = root.path().join("taskgate.toml");
        std::fs::write(
            &cfg,
            format!(
                "[server]\ntls = \"on\"\ntls_cert_file = \"{}\"\ntls_key_file = \"{}\"\n[auth]\nlocal_owner = \"never\"\ntokens_file = \"{}\"\n",
                cert.display(),
                key.display(),
                tokens.display()
            ),
        )
        .unwrap();
        let mut daemon = Daemon::start(&cfg, &state, &root.path().join("log"));
        let port = daemon.port;
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}}}})
        .to_string();
        let request = |token: &str| {
            format!(
                "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/list\r\nAuthorization: Bearer {token}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
        };
        let (answer, shown) = over_tls(port, &ca, &request(&secret('a')));
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.contains("\"tools\""), "{answer}");
        assert_eq!(shown, leaf.to_vec());
        let (answer, _) = over_tls(port, &ca, &request(&secret('z')));
        assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
        // Plain HTTP on the TLS port gets no HTTP answer.
        let plain = exchange(port, &request(&secret('a')));
        assert_eq!(plain.status, 0, "{}", plain.raw);

        // A renewed pair (a new authority, even) is read at reload.
        let (_, _, ca2, leaf2) = issue(root.path(), "second");
        daemon.signal(Signal::SIGHUP);
        daemon.wait_for("RELOADING=1", Duration::from_secs(20));
        daemon.wait_for("READY=1", Duration::from_secs(20));
        let (answer, shown) = over_tls(port, &ca2, &request(&secret('a')));
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert_eq!(shown, leaf2.to_vec());
        assert_eq!(daemon.stop().code(), Some(0));
    }
}

#[test]
fn a_non_loopback_listener_needs_credentials_and_tls() {
    let root = private_dir();
    let tokens = root.path().join("tokens.toml");
    tokens_file(&tokens, &[]);
    let state = state_dir(root.path());
    let check = |extra: &str| {
        let cfg = root.path().join("taskgate.toml");
        std::fs::write(
            &cfg,
            format!("[server]\nlisten = \"0.0.0.0:8765\"\n{extra}"),
        )
        .unwrap();
        taskgate(
            &[
                "check",
                "--config-only",
                "--config",
                cfg.to_str().unwrap(),
                "--state-dir",
                state.to_str().unwrap(),
            ],
            &[],
        )
    };
    let auth = format!("[auth]\ntokens_file = \"{}\"\n", tokens.display());
    for (extra, ok) in [
        (String::new(), false),
        (auth.clone(), false),
        (format!("tls = \"terminated-upstream\"\n{auth}"), true),
        ("tls = \"terminated-upstream\"\n".to_string(), false),
        (format!("tls = \"on\"\n{auth}"), false),
    ] {
        let out = check(&extra);
        assert_eq!(
            out.status.success(),
            ok,
            "{extra}: {}",
            one_line_stderr(&out)
        );
        if !ok {
            assert_eq!(out.status.code(), Some(78), "{extra}");
        }
    }
}

#[test]
fn protected_resource_metadata_is_served_and_named_in_every_challenge() {
    let root = private_dir();
    let state = state_dir(root.path());
    // The Ed25519 public key of RFC 8037's examples: this test signs nothing.
    let jwks = root.path().join("jwks.json");
    std::fs::write(
        &jwks,
        json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "k1",
            "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]})
        .to_string(),
    )
    .unwrap();
    let cfg = root.path().join("taskgate.toml");
    std::fs::write(
        &cfg,
        format!(
            "[auth]\nlocal_owner = \"never\"\nresource = \"https://tasks.example.internal/mcp\"\n[[auth.jwt]]\nissuer = \"https://idp.example.internal/acme\"\njwks_file = \"{}\"\nalgorithms = [\"EdDSA\"]\ntenant = \"acme\"\nadvertise = true\n",
            jwks.display()
        ),
    )
    .unwrap();
    let daemon = Daemon::start(&cfg, &state, &root.path().join("log"));
    let port = daemon.port;
    let url = "https://tasks.example.internal/.well-known/oauth-protected-resource/mcp";
    let r = rpc(port, None, "tools/list", json!({}));
    assert_eq!(
        r.challenge.as_deref(),
        Some(format!(r#"Bearer realm="taskgate", resource_metadata="{url}""#).as_str()),
        "{}",
        r.raw
    );
    let r = rpc(port, Some("a.b.c"), "tools/list", json!({}));
    assert!(
        r.challenge
            .as_deref()
            .unwrap_or("")
            .ends_with(&format!(r#", resource_metadata="{url}""#)),
        "{}",
        r.raw
    );
    for path in [
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-protected-resource",
    ] {
        let r = exchange(
            port,
            &format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"),
        );
        assert_eq!(r.status, 200, "{path}: {}", r.raw);
        assert_eq!(r.body["resource"], "https://tasks.example.internal/mcp");
        assert_eq!(
            r.body["authorization_servers"],
            json!(["https://idp.example.internal/acme"])
        );
        assert_eq!(r.body["bearer_methods_supported"], json!(["header"]));
        assert!(
            r.body["scopes_supported"]
                .as_array()
                .is_some_and(|s| s.contains(&json!("tools:call"))),
            "{}",
            r.raw
        );
    }
}

#[test]
fn the_operator_client_sends_a_token_from_a_file_or_the_environment() {
    let f = start("local_owner = \"never\"", "");
    let url = f.daemon.url();
    let token_file = f.root.path().join("my.token");
    std::fs::write(&token_file, format!("{}\n", secret('a'))).unwrap();
    let call = |extra: &[&str], env: &[(&str, &str)]| {
        let mut args = vec!["call", "nap", "--url", url.as_str()];
        args.extend_from_slice(extra);
        taskgate(&args, env)
    };
    let out = call(&["--token-file", token_file.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("rested"));
    let out = call(&[], &[("TASKGATE_TOKEN", &secret('a'))]);
    assert!(out.status.success(), "{out:?}");
    // Found through a configuration's server.listen instead of --url, the
    // client's own variables are still the client's: the configuration
    // layer does not take them for settings.
    let client_cfg = f.root.path().join("client.toml");
    std::fs::write(
        &client_cfg,
        format!("[server]\nlisten = \"127.0.0.1:{}\"\n", f.daemon.port),
    )
    .unwrap();
    let by_config = |env: &[(&str, &str)]| {
        taskgate(
            &["call", "nap", "--config", client_cfg.to_str().unwrap()],
            env,
        )
    };
    for env in [
        ("TASKGATE_TOKEN", secret('a')),
        (
            "TASKGATE_TOKEN_FILE",
            token_file.to_string_lossy().into_owned(),
        ),
    ] {
        let out = by_config(&[(env.0, env.1.as_str())]);
        assert!(out.status.success(), "{}: {out:?}", env.0);
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("rested"),
            "{out:?}"
        );
    }
    // Without a token the daemon refuses, and the client says so.
    let out = call(&[], &[]);
    assert_eq!(out.status.code(), Some(76), "{out:?}");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("bearer token"), "{out:?}");
}

/// JWTs over HTTP: signed here with keys generated for this run, checked by
/// the daemon against JWKS files written here.
mod jwt {
    use super::*;
    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;

    pub const RESOURCE: &str = "https://tasks.example.test/mcp";
    pub const ISSUER: &str = "https://idp.example.test/realms/acme";
    pub const RSA_ISSUER: &str = "https://rsa.example.test";

    pub fn b64(bytes: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(bytes)
    }

    /// A compact JWS from a header, claims and a signing function.
    pub fn jws(header: &Value, claims: &Value, sign: impl Fn(&[u8]) -> Vec<u8>) -> String {
        let input = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let sig = sign(input.as_bytes());
        format!("{input}.{}", b64(&sig))
    }

    /// The daemon checks `exp`, `nbf` and `iat` against its own clock.
    pub fn now() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0)
    }

    /// Good claims for `sub` of tenant acme; every token gets its own `jti`.
    pub fn claims(sub: &str) -> Value {
        let mut jti = [0u8; 12];
        getrandom::fill(&mut jti).unwrap();
        let now = now();
        json!({
            "iss": ISSUER, "sub": sub, "aud": RESOURCE, "tid": "acme",
            "iat": now - 10, "nbf": now - 10, "exp": now + 600,
            "jti": b64(&jti), "scope": "tools:call tasks:read tasks:cancel",
        })
    }

    pub fn with(mut c: Value, key: &str, v: Value) -> Value {
        c[key] = v;
        c
    }

    pub fn without(mut c: Value, key: &str) -> Value {
        if let Some(o) = c.as_object_mut() {
            o.remove(key);
        }
        c
    }

    /// The Ed25519 issuer's key, a key nobody trusts, and the RSA issuer's.
    pub struct Keys {
        ed: ed25519_dalek::SigningKey,
        stranger: ed25519_dalek::SigningKey,
        rsa: rsa::PrivateKey,
    }

    impl Keys {
        pub fn generate() -> Keys {
            let ed_key = || {
                let mut seed = [0u8; 32];
                getrandom::fill(&mut seed).unwrap();
                ed25519_dalek::SigningKey::from_bytes(&seed)
            };
            use rsa::Generate as _;
            Keys {
                ed: ed_key(),
                stranger: ed_key(),
                rsa: rsa::PrivateKey::generate(),
            }
        }

        /// Writes both issuers' JWKS files and a revocations file (the jti
        /// `stolen`; everything subject `agent-9` was issued before 2099)
        /// into `dir`; the `[auth]` lines that trust them.
        pub fn site(&self, dir: &Path) -> String {
            use rsa::traits::PublicKeyParts as _;
            let public = self.rsa.to_public_key();
            let files = [
                (
                    "ed.json",
                    json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "ed1", "alg": "EdDSA",
                        "use": "sig", "x": b64(self.ed.verifying_key().as_bytes())}]})
                    .to_string(),
                ),
                (
                    "rsa.json",
                    json!({"keys": [{"kty": "RSA", "kid": "rsa1", "alg": "RS256", "use": "sig",
                        "n": b64(&public.n_bytes()), "e": b64(&public.e_bytes())}]})
                    .to_string(),
                ),
                (
                    "revocations.toml",
                    format!(
                        "[[revoke]]\nissuer = \"{ISSUER}\"\njti = \"stolen\"\nuntil = \"2099-01-01T00:00:00Z\"\n\n[[revoke]]\nissuer = \"{ISSUER}\"\nsubject = \"agent-9\"\nissued_before = \"2099-01-01T00:00:00Z\"\n"
                    ),
                ),
            ];
            for (name, text) in files {
                std::fs::write(dir.join(name), text).unwrap();
                std::fs::set_permissions(dir.join(name), std::fs::Permissions::from_mode(0o644))
                    .unwrap();
            }
            format!(
                r#"local_owner = "never"
resource = "{RESOURCE}"
revocations_file = "{revocations}"

[[auth.jwt]]
issuer = "{ISSUER}"
jwks_file = "{ed}"
algorithms = ["EdDSA"]
tenant_claim = "tid"
max_token_lifetime_secs = 3600
leeway_secs = 30
advertise = true

[[auth.jwt]]
issuer = "{RSA_ISSUER}"
jwks_file = "{rsa}"
algorithms = ["RS256"]
tenant = "rsa-tenant"
"#,
                revocations = dir.join("revocations.toml").display(),
                ed = dir.join("ed.json").display(),
                rsa = dir.join("rsa.json").display(),
            )
        }

        pub fn sign_ed(&self, claims: &Value) -> String {
            self.sign_ed_with(
                &json!({"alg": "EdDSA", "typ": "at+jwt", "kid": "ed1"}),
                claims,
            )
        }

        pub fn sign_ed_with(&self, header: &Value, claims: &Value) -> String {
            use ed25519_dalek::Signer as _;
            jws(header, claims, |m| self.ed.sign(m).to_bytes().to_vec())
        }

        pub fn sign_stranger(&self, claims: &Value) -> String {
            use ed25519_dalek::Signer as _;
            jws(
                &json!({"alg": "EdDSA", "typ": "at+jwt", "kid": "ed1"}),
                claims,
                |m| self.stranger.sign(m).to_bytes().to_vec(),
            )
        }

        pub fn sign_rsa(&self, claims: &Value) -> String {
            jws(
                &json!({"alg": "RS256", "typ": "at+jwt", "kid": "rsa1"}),
                claims,
                |m| {
                    self.rsa
                        .pkcs1v15_sign::<rsa::sha2::Sha256>(m)
                        .unwrap()
                        .to_vec()
                },
            )
        }

        /// HS256 "signed" with the RSA issuer's public key (PEM) as the
        /// HMAC secret: the algorithm-confusion forgery.
        pub fn confused(&self, claims: &Value) -> String {
            use hmac::{KeyInit as _, Mac as _};
            use rsa::pkcs8::EncodePublicKey as _;
            let pem = self
                .rsa
                .to_public_key()
                .to_public_key_pem(rsa::pkcs8::LineEnding::LF)
                .unwrap();
            jws(
                &json!({"alg": "HS256", "typ": "at+jwt", "kid": "rsa1"}),
                claims,
                |m| {
                    let mut mac = hmac::Hmac::<Sha256>::new_from_slice(pem.as_bytes()).unwrap();
                    mac.update(m);
                    mac.finalize().into_bytes().to_vec()
                },
            )
        }
    }

    /// Good claims for the RSA issuer.
    pub fn rsa_claims(sub: &str) -> Value {
        with(
            with(claims(sub), "iss", json!(RSA_ISSUER)),
            "scope",
            json!("tools:call tasks:read"),
        )
    }
}

#[test]
fn every_bad_jwt_is_refused_like_an_unknown_token_and_a_good_one_owns_its_task() {
    use jwt::*;
    let site = private_dir();
    let keys = Keys::generate();
    let f = start(&keys.site(site.path()), "");
    let port = port(&f);
    let now = now();
    let good = claims("agent-7");
    let none = |alg: &str| {
        format!(
            "{}.{}.",
            b64(json!({"alg": alg, "typ": "at+jwt"}).to_string().as_bytes()),
            b64(good.to_string().as_bytes())
        )
    };
    let cases: Vec<(&str, String)> = vec![
        (
            "wrong audience",
            keys.sign_ed(&with(
                good.clone(),
                "aud",
                json!("https://elsewhere.test/mcp"),
            )),
        ),
        (
            "missing audience",
            keys.sign_ed(&without(good.clone(), "aud")),
        ),
        (
            "expired beyond the leeway",
            keys.sign_ed(&with(
                with(
                    with(good.clone(), "iat", json!(now - 700)),
                    "nbf",
                    json!(now - 700),
                ),
                "exp",
                json!(now - 120),
            )),
        ),
        (
            "future nbf",
            keys.sign_ed(&with(good.clone(), "nbf", json!(now + 120))),
        ),
        (
            "unknown key id",
            keys.sign_ed_with(
                &json!({"alg": "EdDSA", "typ": "at+jwt", "kid": "ed9"}),
                &good,
            ),
        ),
        ("a key the JWKS does not hold", keys.sign_stranger(&good)),
        (
            "wrong issuer",
            keys.sign_ed(&with(good.clone(), "iss", json!("https://evil.test"))),
        ),
        ("alg none", none("none")),
        ("alg None", none("None")),
        (
            "HS256 signed with the RSA public key",
            keys.confused(&rsa_claims("svc")),
        ),
        (
            "typ JWT where at+jwt is required",
            keys.sign_ed_with(&json!({"alg": "EdDSA", "typ": "JWT", "kid": "ed1"}), &good),
        ),
        (
            "lifetime over the cap",
            keys.sign_ed(&with(good.clone(), "exp", json!(now - 10 + 3601))),
        ),
        (
            "revoked jti",
            keys.sign_ed(&with(good.clone(), "jti", json!("stolen"))),
        ),
        (
            "issued before the subject's revocation",
            keys.sign_ed(&with(good.clone(), "sub", json!("agent-9"))),
        ),
    ];
    let call = json!({"name": "nap", "arguments": {}});
    for (method, params) in [("tools/list", json!({})), ("tools/call", call.clone())] {
        let unknown = rpc(port, Some(&secret('z')), method, params.clone());
        assert_eq!(unknown.status, 401, "{}", unknown.raw);
        assert_eq!(
            unknown.code(),
            wire::UNAUTHENTICATED.code,
            "{}",
            unknown.raw
        );
        assert!(
            unknown
                .challenge
                .as_deref()
                .unwrap_or("")
                .starts_with(r#"Bearer realm="taskgate", error="invalid_token""#),
            "{}",
            unknown.raw
        );
        for (what, token) in &cases {
            let r = rpc(port, Some(token), method, params.clone());
            assert_eq!(r.status, 401, "{what} ({method}): {}", r.raw);
            assert_eq!(r.challenge, unknown.challenge, "{what} ({method})");
            assert_eq!(r.body, unknown.body, "{what} ({method})");
        }
    }

    // A good token works: its task belongs to its issuer, tenant and subject.
    let token = keys.sign_ed(&good);
    let id = create(port, &token, "nap");
    assert!(["working", "completed"].contains(&status_of(port, &token, &id).as_str()));
    // Another token of the same subject sees it.
    let again = keys.sign_ed(&claims("agent-7"));
    assert!(["working", "completed"].contains(&status_of(port, &again, &id).as_str()));
    // Another subject, the same subject in another tenant, the same names
    // from another issuer, and a static token: each reads it like an
    // unknown ID.
    let strangers = [
        ("another subject", keys.sign_ed(&claims("agent-8"))),
        (
            "another tenant",
            keys.sign_ed(&with(claims("agent-7"), "tid", json!("globex"))),
        ),
        ("another issuer", keys.sign_rsa(&rsa_claims("agent-7"))),
        ("a static token", secret('a')),
    ];
    let unknown = "tg-0123456789abcdef0123456789abcdef";
    for (who, token) in &strangers {
        let get = |task: &str| rpc(port, Some(token), "tasks/get", json!({"taskId": task}));
        let (foreign, nothing) = (get(&id), get(unknown));
        assert_eq!(foreign.status, nothing.status, "{who}");
        assert_eq!(
            foreign.body.to_string().replace(&id, "ID"),
            nothing.body.to_string().replace(unknown, "ID"),
            "{who}: {} vs {}",
            foreign.raw,
            nothing.raw
        );
        assert!(foreign.body["error"].is_object(), "{who}: {}", foreign.raw);
    }
    // The RSA issuer's properly signed token works: the confused one above
    // was refused for its algorithm, not its claims.
    let rsa = keys.sign_rsa(&rsa_claims("svc"));
    let r = rpc(port, Some(&rsa), "tools/list", json!({}));
    assert_eq!(r.status, 200, "{}", r.raw);
}

/// Every file under `dir`, recursively, read whole (a file that vanished
/// meanwhile reads empty).
fn every_file(dir: &Path, out: &mut Vec<(PathBuf, Vec<u8>)>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = e.path();
        if path.is_dir() {
            every_file(&path, out);
        } else {
            out.push((path.clone(), std::fs::read(&path).unwrap_or_default()));
        }
    }
}

fn holds(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// Static secrets and JWTs (whole, and the parts of them that carry the
/// secret or the signature) are used for calls, polls and cancels, refused
/// when bad, and a reload revokes one; then every file of the state
/// directory (database, WAL, artifacts) and the debug log are scanned for
/// them.
#[test]
fn no_secret_or_jwt_reaches_the_disk_or_the_debug_log() {
    credential_marker_scan("debug");
}

/// rmcp logs requests and results at trace: the log stays clean there too.
#[test]
fn no_secret_or_jwt_reaches_the_log_at_trace() {
    credential_marker_scan("trace");
}

fn credential_marker_scan(level: &str) {
    use jwt::*;
    use taskgate::auth::tokens::{hash_text, new_secret};
    let site = private_dir();
    let keys = Keys::generate();
    let (good, unknown) = (new_secret().unwrap(), new_secret().unwrap());
    let entry = format!(
        "[[token]]\nid = \"marker\"\nhash = \"{}\"\ntenant = \"acme\"\nsubject = \"marker\"\nscopes = [\"tools:call\", \"tasks:read\", \"tasks:cancel\"]\n",
        hash_text(&good)
    );
    let mut f = start_with(&keys.site(site.path()), "", &entry, Some(level));
    let port = port(&f);
    let jwt_good = keys.sign_ed(&claims("agent-7"));
    let jwt_forged = keys.sign_stranger(&claims("agent-7"));
    let jwt_doomed = keys.sign_ed(&claims("agent-5"));
    let mut markers: Vec<(String, &str)> = Vec::new();
    for (what, secret) in [
        ("static secret", &good),
        ("unknown static secret", &unknown),
    ] {
        let body = &secret["tgk_".len()..];
        markers.push((secret.clone(), what));
        markers.push((body.to_string(), what));
        markers.push((body[..12].to_string(), what));
        markers.push((body[body.len() - 12..].to_string(), what));
    }
    for (what, token) in [
        ("good JWT", &jwt_good),
        ("forged JWT", &jwt_forged),
        ("revoked JWT", &jwt_doomed),
    ] {
        let parts: Vec<&str> = token.split('.').collect();
        markers.push((token.clone(), what));
        // The claims and the signature; the header is the same for every
        // token and carries nothing.
        markers.push((parts[1].to_string(), what));
        markers.push((parts[2].to_string(), what));
        markers.push((parts[2][..16].to_string(), what));
    }

    // Calls (a task each, and one cancelled while it runs), polls, artifact
    // reads, cancels.
    for token in [&good, &jwt_good, &jwt_doomed] {
        let id = create(port, token, "nap");
        let deadline = Instant::now() + Duration::from_secs(20);
        while status_of(port, token, &id) != "completed" {
            assert!(Instant::now() < deadline, "{id} did not complete");
        }
        let r = rpc(
            port,
            Some(token),
            "tools/call",
            json!({"name": "artifact_read", "arguments": {"taskId": id}}),
        );
        assert_eq!(r.status, 200, "{}", r.raw);
        let running = create(port, token, "wait");
        let r = rpc(
            port,
            Some(token),
            "tasks/cancel",
            json!({"taskId": running}),
        );
        assert_eq!(r.status, 200, "{}", r.raw);
        status_of(port, token, &running);
    }
    // A call refused for its scope (the reader may only read), its
    // arguments carrying a marker.
    let reader = secret(TOKENS.iter().find(|t| t.id == "reader").unwrap().seed);
    let refused_arg = "REFUSED-SCOPE-ARGUMENT-MARKER-41d2";
    markers.push((
        refused_arg.to_string(),
        "argument of a call refused for its scope",
    ));
    let r = rpc(
        port,
        Some(&reader),
        "tools/call",
        json!({"name": "nap", "arguments": {"note": refused_arg}}),
    );
    assert_eq!(r.status, 403, "{}", r.raw);
    // Refused tokens.
    for token in [&unknown, &jwt_forged] {
        let r = rpc(port, Some(token), "tools/list", json!({}));
        assert_eq!(r.status, 401, "{}", r.raw);
    }
    // A reload that revokes one JWT's subject, which is then refused.
    let revocations = site.path().join("revocations.toml");
    let text = std::fs::read_to_string(&revocations).unwrap();
    std::fs::write(
        &revocations,
        format!("{text}\n[[revoke]]\nissuer = \"{ISSUER}\"\nsubject = \"agent-5\"\nissued_before = \"2099-01-01T00:00:00Z\"\n"),
    )
    .unwrap();
    f.daemon.signal(Signal::SIGHUP);
    f.daemon.wait_for("RELOADING=1", Duration::from_secs(20));
    f.daemon.wait_for("READY=1", Duration::from_secs(20));
    let r = rpc(port, Some(&jwt_doomed), "tools/list", json!({}));
    assert_eq!(r.status, 401, "{}", r.raw);
    let r = rpc(port, Some(&jwt_good), "tools/list", json!({}));
    assert_eq!(r.status, 200, "{}", r.raw);

    let scan = |files: &[(PathBuf, Vec<u8>)]| {
        for (path, bytes) in files {
            for (marker, what) in &markers {
                assert!(
                    !holds(bytes, marker),
                    "part of the {what} ({marker}) is in {}",
                    path.display()
                );
            }
        }
    };
    // While serving, the WAL holds the recent writes.
    let mut live = Vec::new();
    every_file(&f.state, &mut live);
    assert!(
        live.iter()
            .any(|(p, b)| p.ends_with("tasks.db-wal") && !b.is_empty()),
        "the scan sees the WAL: {:?}",
        live.iter().map(|(p, _)| p).collect::<Vec<_>>()
    );
    assert!(
        live.iter().any(|(_, b)| holds(b, "rested")),
        "the scan sees stored results"
    );
    scan(&live);
    let log_path = f.root.path().join("log");
    let Fixture { daemon, state, .. } = f;
    assert!(daemon.stop().success());
    let mut after = Vec::new();
    every_file(&state, &mut after);
    after.push((log_path.clone(), std::fs::read(&log_path).unwrap()));
    let log = String::from_utf8_lossy(&after[after.len() - 1].1).to_string();
    // The scan means something only if the level took effect.
    let shown = format!(" {} ", level.to_uppercase());
    assert!(
        log.lines().any(|l| l.contains(&shown)),
        "no {level} events in the log:\n{log}"
    );
    scan(&after);
}

/// `serve`, like `check`, refuses a non-loopback listener without
/// credentials or without TLS, before it touches the state directory:
/// neither a fresh one nor one in use changes.
#[test]
fn serve_refuses_a_non_loopback_listener_without_auth_or_tls_and_changes_nothing() {
    let root = private_dir();
    let tokens = root.path().join("tokens.toml");
    tokens_file(&tokens, &[]);
    let fresh = state_dir(root.path());
    // A state directory in use: a daemon made its database and stopped.
    let used = root.path().join("used");
    std::fs::create_dir(&used).unwrap();
    std::fs::set_permissions(&used, std::fs::Permissions::from_mode(0o700)).unwrap();
    let plain = root.path().join("plain.toml");
    std::fs::write(&plain, "").unwrap();
    let d = Daemon::start(&plain, &used, &root.path().join("log"));
    assert!(d.stop().success());
    let snapshot = |dir: &Path| {
        let mut files = Vec::new();
        every_file(dir, &mut files);
        let mut out: Vec<(PathBuf, u32, Vec<u8>, Option<std::time::SystemTime>)> = files
            .into_iter()
            .map(|(p, b)| {
                let meta = std::fs::metadata(&p).ok();
                (
                    p,
                    meta.as_ref().map(|m| m.permissions().mode()).unwrap_or(0),
                    b,
                    meta.and_then(|m| m.modified().ok()),
                )
            })
            .collect();
        out.sort();
        let mode = std::fs::metadata(dir).map(|m| m.permissions().mode()).ok();
        (mode, out)
    };
    assert!(
        !snapshot(&used).1.is_empty(),
        "the used state directory holds files"
    );
    let auth = format!("[auth]\ntokens_file = \"{}\"\n", tokens.display());
    for (extra, why) in [
        (String::new(), "neither credentials nor TLS"),
        (auth.clone(), "credentials without TLS"),
        (
            "tls = \"terminated-upstream\"\n".to_string(),
            "TLS without credentials",
        ),
    ] {
        let cfg = root.path().join("taskgate.toml");
        std::fs::write(&cfg, format!("[server]\nlisten = \"0.0.0.0:0\"\n{extra}")).unwrap();
        for state in [&fresh, &used] {
            let before = snapshot(state);
            let out = taskgate(
                &[
                    "serve",
                    "--config",
                    cfg.to_str().unwrap(),
                    "--state-dir",
                    state.to_str().unwrap(),
                ],
                &[],
            );
            assert_eq!(
                out.status.code(),
                Some(78),
                "{why}, {}: {}",
                state.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            let said = one_line_stderr(&out);
            assert!(said.contains("0.0.0.0"), "{why}: {said}");
            assert!(
                snapshot(state) == before,
                "{why}: the state directory changed"
            );
        }
    }
    // `--listen` on the command line is held to the same rule.
    let out = taskgate(
        &[
            "serve",
            "--config",
            plain.to_str().unwrap(),
            "--state-dir",
            fresh.to_str().unwrap(),
            "--listen",
            "0.0.0.0:0",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert!(
        snapshot(&fresh).1.is_empty(),
        "a fresh state directory got files"
    );
}

/// A tool for legacy sessions (it runs synchronously there): says it has
/// started on the FIFO `started`, then holds its call until `release`
/// exists. Given to [`start`] in place of extra `[tasks]` lines, as TOML.
fn holding_tool(started: &Path, release: &Path) -> String {
    Tool::new("hold")
        .script(&format!(
            "echo started > {}; while [ ! -e {} ]; do sleep 0.05; done; printf held",
            started.display(),
            release.display()
        ))
        .unconfined("its files sit beside the state directory")
        .task("optional")
        .input()
        .to_string()
}

/// One raw `/mcp` request of a legacy session (protocol 2025-11-25 unless
/// `extra_headers` names another).
fn legacy(
    port: u16,
    verb: &str,
    token: Option<&str>,
    session: Option<&str>,
    extra_headers: &str,
    body: &str,
) -> Reply {
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let session = session
        .map(|s| format!("Mcp-Session-Id: {s}\r\n"))
        .unwrap_or_default();
    // 2025-11-25 unless the extra headers name the version.
    let version = match extra_headers.contains("MCP-Protocol-Version") {
        true => "",
        false => "MCP-Protocol-Version: 2025-11-25\r\n",
    };
    exchange(
        port,
        &format!(
            "{verb} /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n{version}{auth}{session}{extra_headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
}

/// Opens a session of protocol `version` (before 2026-07-28) as the holder
/// of `token` (the local caller when `None`); its id.
fn open_session(port: u16, token: Option<&str>, version: &str) -> String {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": version, "capabilities": {},
        "clientInfo": {"name": "old", "version": "1"}}})
    .to_string();
    let r = exchange(
        port,
        &format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n{}Content-Length: {}\r\nConnection: close\r\n\r\n{init}",
            token
                .map(|t| format!("Authorization: Bearer {t}\r\n"))
                .unwrap_or_default(),
            init.len()
        ),
    );
    assert_eq!(r.status, 200, "{}", r.raw);
    let session = r
        .raw
        .lines()
        .find_map(|l| {
            l.split_once(':')
                .filter(|(k, _)| k.eq_ignore_ascii_case("mcp-session-id"))
        })
        .map(|(_, v)| v.trim().to_string())
        .expect("session id");
    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string();
    let r = legacy(
        port,
        "POST",
        token,
        Some(&session),
        &format!("MCP-Protocol-Version: {version}\r\n"),
        &note,
    );
    assert_eq!(r.status, 202, "{}", r.raw);
    session
}

/// A legacy session belongs to the caller that opened it. Anyone else
/// carrying its id (another subject, another tenant, another issuer with
/// the same tenant and subject, or the local caller on a loopback daemon)
/// gets exactly what an unknown session id gets, on every method: POST,
/// the GET that resumes the opener's in-flight answer, the GET of a
/// standalone stream, and DELETE. The opener's call goes on and gets its
/// answer; its session is still there afterwards.
#[test]
fn a_legacy_session_answers_only_the_caller_that_opened_it() {
    use jwt::*;
    let site = private_dir();
    let keys = Keys::generate();
    let started = Fifo::new(&site.path().join("started"));
    let release = site.path().join("release");
    let f = start(
        &keys
            .site(site.path())
            .replace("local_owner = \"never\"", "local_owner = \"loopback\""),
        &holding_tool(&started.path, &release),
    );
    let port = port(&f);
    let alice = secret('a');
    let session = open_session(port, Some(&alice), "2025-11-25");

    // Alice's synchronous call is in flight while the strangers try.
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "hold", "arguments": {}}})
    .to_string();
    let in_flight = {
        let (alice, session, call) = (alice.clone(), session.clone(), call.clone());
        std::thread::spawn(move || legacy(port, "POST", Some(&alice), Some(&session), "", &call))
    };
    assert_eq!(started.read(Duration::from_secs(20)).trim(), "started");

    let same_names_other_issuer = keys.sign_ed(&with(claims("alice"), "scope", json!("admin")));
    let strangers: [(&str, Option<String>); 5] = [
        ("another subject", Some(secret('b'))),
        ("another tenant", Some(secret('c'))),
        ("another issuer", Some(same_names_other_issuer)),
        ("the local caller", None),
        // The same subject's other token is not a stranger: checked below.
        ("nobody at all", Some(secret('n'))),
    ];
    let unknown = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b";
    let list = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {}}).to_string();
    for (who, token) in &strangers {
        let token = token.as_deref();
        let attempts: [(&str, &str, String, &str); 6] = [
            ("POST tools/call", "POST", String::new(), &call),
            ("POST tools/list", "POST", String::new(), &list),
            ("GET resume", "GET", "Last-Event-ID: 0/0\r\n".into(), ""),
            ("GET resume", "GET", "Last-Event-ID: 0/1\r\n".into(), ""),
            ("GET standalone", "GET", String::new(), ""),
            ("DELETE", "DELETE", String::new(), ""),
        ];
        for (what, verb, headers, body) in &attempts {
            let theirs = legacy(port, verb, token, Some(&session), headers, body);
            let nothing = legacy(port, verb, token, Some(unknown), headers, body);
            if *who == "nobody at all" && *verb == "POST" && body.contains("tools/call") {
                // No scope at all: refused for that first, alike.
                assert_eq!(theirs.status, 403, "{who} {what}: {}", theirs.raw);
            } else {
                assert_eq!(theirs.status, 404, "{who} {what}: {}", theirs.raw);
            }
            assert_eq!(
                theirs.status, nothing.status,
                "{who} {what}: {}",
                theirs.raw
            );
            assert_eq!(theirs.body, nothing.body, "{who} {what}: {}", theirs.raw);
        }
    }
    // For each kind of stranger, resuming other counters gets nothing either.
    for n in 2..8 {
        let r = legacy(
            port,
            "GET",
            Some(&secret('b')),
            Some(&session),
            &format!("Last-Event-ID: 0/{n}\r\n"),
            "",
        );
        assert_eq!(r.status, 404, "0/{n}: {}", r.raw);
    }

    // Alice's call was never handed to anyone: it answers her.
    std::fs::write(&release, "").unwrap();
    let answer = in_flight.join().unwrap();
    assert_eq!(answer.status, 200, "{}", answer.raw);
    assert!(answer.raw.contains("held"), "{}", answer.raw);
    // Her session survived every DELETE; her other token (same subject)
    // may use it, and she may end it.
    let r = legacy(port, "POST", Some(&secret('A')), Some(&session), "", &list);
    assert_eq!(r.status, 200, "{}", r.raw);
    assert!(r.raw.contains("\"tools\""), "{}", r.raw);
    let r = legacy(port, "DELETE", Some(&alice), Some(&session), "", "");
    assert!(r.status == 200 || r.status == 202, "{}", r.raw);
    let r = legacy(port, "POST", Some(&alice), Some(&session), "", &list);
    assert_eq!(r.status, 404, "{}", r.raw);
}

/// A 2026-07-28 `tools/list` body.
fn modern_list() -> String {
    json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {}
    }}})
    .to_string()
}

const INVALID_REQUEST: &str = r#"Bearer realm="taskgate", error="invalid_request", error_description="the Authorization header is not a bearer credential: send Authorization: Bearer <token>, or no Authorization header to act as the local owner where that is allowed""#;

/// On a daemon that lets loopback callers without a credential act as the
/// local owner, only a request with no `Authorization` header at all does:
/// a header that is not one well-formed bearer credential is refused with
/// `invalid_request`, never taken for "no credential".
#[test]
fn a_malformed_authorization_header_is_refused_not_taken_for_none() {
    let f = start("local_owner = \"loopback\"", "");
    let port = port(&f);
    let list = modern_list();
    let with_header = |header: &str| {
        exchange(
            port,
            &format!(
                "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/list\r\n{header}Content-Length: {}\r\nConnection: close\r\n\r\n{list}",
                list.len()
            ),
        )
    };
    // No header: the local owner, as configured.
    let local = with_header("");
    assert_eq!(local.status, 200, "{}", local.raw);
    let good = secret('a');
    for header in [
        "Authorization: Basic YWxpY2U6c2VjcmV0\r\n".to_string(),
        format!("Authorization: Token {good}\r\n"),
        format!("Authorization: Bearer\t{good}\r\n"),
        "Authorization: Bearer\r\n".into(),
        "Authorization: \r\n".into(),
        "Authorization: Bearer tok en!\r\n".into(),
        format!("Authorization: Bearer {good}\r\nAuthorization: Bearer {good}\r\n"),
    ] {
        let r = with_header(&header);
        assert_eq!(r.status, 401, "{header:?}: {}", r.raw);
        assert_eq!(r.challenge.as_deref(), Some(INVALID_REQUEST), "{header:?}");
        assert_eq!(
            r.code(),
            wire::UNAUTHENTICATED.code,
            "{header:?}: {}",
            r.raw
        );
        assert!(r.body["result"].is_null(), "{header:?}: {}", r.raw);
    }
    // A well-formed bearer credential is still checked as a token.
    let r = with_header("Authorization: Bearer tgk_short\r\n");
    assert_eq!(r.challenge.as_deref(), Some(INVALID), "{}", r.raw);
    let r = with_header(&format!("Authorization: bearer {good}\r\n"));
    assert_eq!(r.status, 200, "{}", r.raw);
}

/// A request carrying `Origin` is served only from the daemon's own
/// origin or one listed in `server.allowed_origins`; anything else gets
/// 403 with a JSON-RPC body on every method, before it could be taken for
/// the local caller. Requests without `Origin` are not affected.
#[test]
fn a_foreign_origin_is_refused_on_every_method() {
    let f = start(
        "local_owner = \"loopback\"\n[server]\nallowed_origins = [\"https://Console.Example:8443\"]",
        "",
    );
    let port = port(&f);
    let list = modern_list();
    let request = |verb: &str, origin: &str| {
        let body = if verb == "POST" { list.as_str() } else { "" };
        exchange(
            port,
            &format!(
                "{verb} /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/list\r\n{origin}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            ),
        )
    };
    for verb in ["POST", "GET", "DELETE"] {
        for origin in [
            "Origin: http://evil.example\r\n".to_string(),
            format!("Origin: http://evil.example:{port}\r\n"),
            "Origin: null\r\n".into(),
            format!("Origin: http://127.0.0.1:{}\r\n", port.wrapping_add(1)),
            format!("Origin: http://127.0.0.1:{port}\r\nOrigin: http://127.0.0.1:{port}\r\n"),
        ] {
            let r = request(verb, &origin);
            assert_eq!(r.status, 403, "{verb} {origin:?}: {}", r.raw);
            assert_eq!(r.code(), wire::ORIGIN_NOT_ALLOWED.code, "{}", r.raw);
            assert_eq!(
                r.body["error"]["data"]["name"],
                wire::ORIGIN_NOT_ALLOWED.name,
                "{}",
                r.raw
            );
            assert!(r.body["id"].is_null(), "{}", r.raw);
        }
    }
    // The daemon's own origin, a listed one and none at all are served.
    for origin in [
        format!("Origin: http://127.0.0.1:{port}\r\n"),
        "Origin: https://console.example:8443\r\n".into(),
        String::new(),
    ] {
        let r = request("POST", &origin);
        assert_eq!(r.status, 200, "{origin:?}: {}", r.raw);
        assert!(r.body["result"]["tools"].is_array(), "{}", r.raw);
    }
}
