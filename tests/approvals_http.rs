//! Approvals with credentials, attacked the way a caller with a valid token
//! of their own would: the HTTP admin interface's 401 and 403, another
//! owner's approval task reading like an unknown one, holds partitioned by
//! subject and tenant, and an administrator who may not approve their own
//! call.
//!
//! What this file proves: approvals with credentials, attacked with valid
//! tokens of one's own: `/admin/v1/approvals` refusing no credential (401, the
//! loopback caller is never an administrator there) and a missing
//! `approvals:read`/`approvals:decide` (403 naming it), a malformed body (400),
//! an unknown proposal (404), an oversized body (413), a second decision (409),
//! `validForSecs` bounding the approval; another subject's or tenant's
//! `tasks/get` and `tasks/cancel` of an approval task answering exactly like an
//! unknown task; identical calls of other subjects and tenants held as
//! proposals of their own and not covered by another's approval; an
//! administrator refused approving their own call; an approval task naming its
//! proposal (status message and `_meta`) in the create and `tasks/get` answers
//! to its owner and to no one else, the store holding that ID and no argument

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::tokens::{Token, secret, tokens_file};
use common::*;
use serde_json::{Value, json};

const CALL: &[&str] = &[
    "tools:call",
    "taskgate:effect:non-idempotent-write",
    "tasks:read",
    "tasks:cancel",
];

/// (id, seed, tenant, subject, scopes)
const TOKENS: &[Token] = &[
    ("alice", 'a', "acme", "alice", CALL),
    ("mallory", 'm', "acme", "mallory", CALL),
    ("alice-elsewhere", 'e', "other", "alice", CALL),
    (
        "ops",
        'o',
        "acme",
        "ops",
        &["approvals:read", "approvals:decide"],
    ),
    ("auditor", 'r', "acme", "auditor", &["approvals:read"]),
    // alice's own identity, with the right to decide.
    (
        "alice-admin",
        'x',
        "acme",
        "alice",
        &["approvals:decide", "approvals:read"],
    ),
];

struct Fixture {
    root: tempfile::TempDir,
    daemon: Daemon,
    port: u16,
}

fn start() -> Fixture {
    let root = private_dir();
    let state = state_dir(root.path());
    let tokens = root.path().join("tokens.toml");
    tokens_file(&tokens, TOKENS);
    let out = root.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let cfg: PathBuf = write_config(
        root.path(),
        &format!(
            "[auth]\ntokens_file = \"{}\"\n[approvals]\npoll_interval_ms = 5000\n",
            tokens.display()
        ),
        &[Tool::held_deploy(&out)],
    );
    let daemon = Daemon::start(&cfg, &state, &root.path().join("daemon.log"));
    let port = daemon.port;
    Fixture { root, daemon, port }
}

impl Fixture {
    fn client(&self, who: char, tasks: bool) -> taskgate::client::Client {
        self.daemon.client(tasks).with_token(Some(secret(who)))
    }

    fn call(&self, who: char, tasks: bool, target: &str) -> Result<Value, Value> {
        match runtime().block_on(self.client(who, tasks).call_tool(
            "deploy",
            json!({"target": target}),
            None,
        )) {
            Ok(v) => Ok(v),
            Err(taskgate::client::ClientError::Rpc { error, .. }) => Err(error),
            Err(e) => panic!("call: {e}"),
        }
    }

    fn task_op(&self, who: char, method: &str, id: &str) -> Result<Value, Value> {
        let c = self.client(who, true);
        let r = runtime().block_on(async {
            match method {
                "get" => c.get_task(id).await,
                _ => c.cancel_task(id).await,
            }
        });
        match r {
            Ok(v) => Ok(v),
            Err(taskgate::client::ClientError::Rpc { error, .. }) => Err(error),
            Err(e) => panic!("{method}: {e}"),
        }
    }

    /// One admin request: (status, WWW-Authenticate, JSON body).
    fn admin(
        &self,
        who: Option<char>,
        method: &str,
        path: &str,
        body: &str,
    ) -> (u16, String, Value) {
        let auth = who
            .map(|w| format!("Authorization: Bearer {}\r\n", secret(w)))
            .unwrap_or_default();
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.port,
            body.len()
        );
        let r = http::exchange_on(
            std::net::TcpStream::connect(("127.0.0.1", self.port)).unwrap(),
            request.as_bytes(),
            Duration::from_secs(30),
        )
        .answer();
        (
            r.status,
            r.header("www-authenticate").unwrap_or_default().to_string(),
            serde_json::from_str(r.text().trim()).unwrap_or(Value::Null),
        )
    }

    fn marker(&self) -> usize {
        std::fs::read_to_string(self.root.path().join("out/marker"))
            .map(|t| t.lines().count())
            .unwrap_or(0)
    }
}

fn proposal_of(result: &Value) -> String {
    assert_eq!(
        result["structuredContent"]["status"], "approval_required",
        "{result}"
    );
    result["structuredContent"]["proposal"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn the_http_admin_interface_needs_a_credential_with_its_scope() {
    let f = start();
    let proposal = proposal_of(&f.call('a', false, "prod").unwrap());
    let list = "/admin/v1/approvals?pending=true";

    // No credential: the loopback caller is never an administrator here.
    let (status, challenge, _) = f.admin(None, "GET", list, "");
    assert_eq!(status, 401);
    assert!(challenge.starts_with("Bearer "), "{challenge}");
    // A credential without the scope.
    let (status, challenge, _) = f.admin(Some('a'), "GET", list, "");
    assert_eq!(status, 403);
    assert!(
        challenge.contains("insufficient_scope") && challenge.contains("approvals:read"),
        "{challenge}"
    );
    // A reader reads, and may not decide.
    let (status, _, body) = f.admin(Some('r'), "GET", list, "");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["proposals"][0]["id"], proposal.as_str(), "{body}");
    let approve = format!("/admin/v1/approvals/{proposal}/approve");
    let (status, challenge, _) = f.admin(Some('r'), "POST", &approve, "");
    assert_eq!(status, 403);
    assert!(challenge.contains("approvals:decide"), "{challenge}");
    assert_eq!(f.marker(), 0);

    // Malformed bodies and unknown proposals are named.
    let (status, _, body) = f.admin(Some('o'), "POST", &approve, "{\"validFor\": 1}");
    assert_eq!(status, 400, "{body}");
    let (status, _, _) = f.admin(Some('o'), "GET", "/admin/v1/approvals/tgp-unknown", "");
    assert_eq!(status, 404);
    let big = format!("{{\"reason\": \"{}\"}}", "x".repeat(10_000));
    let reject = format!("/admin/v1/approvals/{proposal}/reject");
    let (status, _, _) = f.admin(Some('o'), "POST", &reject, &big);
    assert_eq!(status, 413);

    // The administrator approves; the decider is their identity.
    let (status, _, body) = f.admin(Some('o'), "POST", &approve, "{\"validForSecs\": 120}");
    assert_eq!(status, 200, "{body}");
    let p = &body["proposals"][0];
    assert_eq!(p["state"], "approved", "{body}");
    assert!(p["decider"].as_str().unwrap().contains("\"ops\""), "{body}");
    let window = p["execution_deadline_ms"].as_i64().unwrap() - p["decided_ms"].as_i64().unwrap();
    assert_eq!(window, 120_000, "{body}");
    // A decided proposal is not decided again.
    let (status, _, body) = f.admin(Some('o'), "POST", &reject, "{\"reason\": \"late\"}");
    assert_eq!(status, 409, "{body}");

    assert_eq!(f.call('a', false, "prod").unwrap()["isError"], false);
    assert_eq!(f.marker(), 1);
}

#[test]
fn another_owners_approval_task_and_approval_are_not_theirs() {
    let f = start();
    let handle = f.call('a', true, "prod").unwrap();
    let task = handle["taskId"].as_str().unwrap().to_string();
    let unknown = f
        .task_op('m', "get", "tg-00000000000000000000000000000000")
        .unwrap_err();

    // Mallory (same tenant, own token) and alice of another tenant read
    // and cancel alice's task exactly as an unknown one.
    for who in ['m', 'e'] {
        for op in ["get", "cancel"] {
            let e = f.task_op(who, op, &task).unwrap_err();
            assert_eq!(e["code"], unknown["code"], "{who} {op}: {e}");
            assert_eq!(e["message"], unknown["message"], "{who} {op}: {e}");
        }
    }
    assert_eq!(f.task_op('a', "get", &task).unwrap()["status"], "working");

    // Their identical calls are held apart, as proposals of their own.
    let alices = f.admin(Some('o'), "GET", "/admin/v1/approvals", "").2["proposals"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let mallorys = proposal_of(&f.call('m', false, "prod").unwrap());
    let elsewhere = proposal_of(&f.call('e', false, "prod").unwrap());
    assert!(mallorys != alices && elsewhere != alices && mallorys != elsewhere);

    // Alice may not approve her own call, even with the scope.
    let approve = format!("/admin/v1/approvals/{alices}/approve");
    let (status, _, body) = f.admin(Some('x'), "POST", &approve, "");
    assert_eq!(status, 409, "{body}");
    assert!(body.to_string().contains("self_approval"), "{body}");

    // Approved by ops, it covers alice's call only.
    assert_eq!(f.admin(Some('o'), "POST", &approve, "").0, 200);
    let still = f.call('m', false, "prod").unwrap();
    assert_eq!(proposal_of(&still), mallorys, "mallory's call still waits");
    proposal_of(&f.call('e', false, "prod").unwrap());
    assert_eq!(f.marker(), 0);
    assert_eq!(f.call('a', false, "prod").unwrap()["isError"], false);
    assert_eq!(f.marker(), 1);
}

/// The proposal an approval task names: in its status message and in
/// `_meta`, which must agree.
fn named_proposal(answer: &Value) -> String {
    let id = answer["_meta"]["dev.taskgate/proposal"]
        .as_str()
        .unwrap_or_else(|| panic!("no proposal in _meta: {answer}"))
        .to_string();
    let message = answer["statusMessage"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("proposal {id}")),
        "the status message names another proposal or none: {answer}"
    );
    id
}

#[test]
fn an_approval_task_names_its_proposal_to_its_owner_and_to_no_one_else() {
    let f = start();
    // A target value nobody may find in the task store.
    let target = "prod-4d1e9b";
    let alices_handle = f.call('a', true, target).unwrap();
    assert_eq!(alices_handle["status"], "working", "{alices_handle}");
    let alices = named_proposal(&alices_handle);
    let task = alices_handle["taskId"].as_str().unwrap().to_string();
    // It is the proposal the administrator sees waiting, and the only one.
    let (_, _, listed) = f.admin(Some('o'), "GET", "/admin/v1/approvals?pending=true", "");
    let pending: Vec<&str> = listed["proposals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_str().unwrap())
        .collect();
    assert_eq!(pending, vec![alices.as_str()], "{listed}");

    // Each poll while it waits names it again; a retry finds the same.
    let polled = f.task_op('a', "get", &task).unwrap();
    assert_eq!(polled["status"], "working", "{polled}");
    assert_eq!(named_proposal(&polled), alices);
    let retried = f.call('a', true, target).unwrap();
    assert_eq!(retried["taskId"], task.as_str(), "{retried}");
    assert_eq!(named_proposal(&retried), alices);

    // Mallory's identical call waits on a proposal of its own, and nothing
    // mallory is shown names alice's: not her own task, not alice's.
    let mallorys_handle = f.call('m', true, target).unwrap();
    let mallorys = named_proposal(&mallorys_handle);
    assert_ne!(mallorys, alices);
    let mallorys_task = mallorys_handle["taskId"].as_str().unwrap().to_string();
    let own = f.task_op('m', "get", &mallorys_task).unwrap();
    assert_eq!(named_proposal(&own), mallorys);
    for shown in [&mallorys_handle, &own] {
        assert!(!shown.to_string().contains(&alices), "{shown}");
    }
    for who in ['m', 'e'] {
        let refused = f.task_op(who, "get", &task).unwrap_err();
        assert!(!refused.to_string().contains(&alices), "{refused}");
    }

    // The administrator approves what alice's client was told: her task
    // completes with that proposal's receipt; mallory's still waits.
    let approve = format!("/admin/v1/approvals/{alices}/approve");
    assert_eq!(f.admin(Some('o'), "POST", &approve, "").0, 200);
    let done = f.task_op('a', "get", &task).unwrap();
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["result"]["structuredContent"]["proposal"],
        alices.as_str()
    );
    assert_eq!(
        done["_meta"]["dev.taskgate/proposal"],
        alices.as_str(),
        "{done}"
    );
    let still = f.task_op('m', "get", &mallorys_task).unwrap();
    assert_eq!(still["status"], "working", "{still}");
    assert_eq!(named_proposal(&still), mallorys);

    // The store holds the proposal IDs, never the call's arguments.
    let state = f.root.path().join("state");
    let mut stored = Vec::new();
    for name in ["tasks.db", "tasks.db-wal"] {
        stored.extend(std::fs::read(state.join(name)).unwrap_or_default());
    }
    assert!(!stored.is_empty());
    let holds = |needle: &str| stored.windows(needle.len()).any(|w| w == needle.as_bytes());
    assert!(
        holds(&alices) && holds(&mallorys),
        "the proposal IDs are stored"
    );
    assert!(!holds(target), "an argument value reached the task store");
    assert_eq!(f.marker(), 0, "nothing ran");
}
