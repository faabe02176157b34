//! A durable route through taskgate to a provider written with an
//! independent SDK: FastMCP with fastmcp-tasks 4.1.4 from PyPI, unpatched
//! (tests/interop/upstream_fastmcp_tasks.py, run by
//! scripts/upstream-servers.sh in its venv). It negotiates 2026-07-28 and
//! advertises the Tasks extension; its one tool runs only as a task, and a
//! FastMCP middleware (the SDK's public hook) echoes the execution envelope
//! on the CreateTaskResult that fastmcp-tasks makes. The route is described,
//! leased, submitted and polled to completion, and a resubmission finds
//! the same task with nothing sent again. The same server without the echo
//! is fastmcp-tasks as it comes: its task is never taken for success.
//! Each case counts what reached the server from its own logs.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::upstream::*;
use common::*;
use serde_json::{Value, json};
use sha2::Digest as _;
use taskgate::client::{Client, ClientError};

/// The SDK server starts an interpreter and may install on first use.
const SETTLE: Duration = Duration::from_secs(300);

/// upstream_fastmcp_tasks.py behind a wrapper that gives it its logs.
struct Upstream {
    effects: PathBuf,
    messages: PathBuf,
}

impl Upstream {
    /// The server as `alias`, echoing the envelope or not, and its
    /// `[[upstream]]` table. It runs unconfined, as the other SDK servers
    /// do: its interpreter and packages live in the build tree.
    fn table(place: &Place, alias: &str, echo: bool) -> (Upstream, String) {
        let effects = place.out.join(format!("{alias}.effects"));
        let messages = place.out.join(format!("{alias}.messages"));
        let mut script = String::from("#!/bin/sh\n");
        script += &format!("export UPSTREAM_TASKS_EFFECT_LOG='{}'\n", effects.display());
        script += &format!(
            "export UPSTREAM_TASKS_MESSAGE_LOG='{}'\n",
            messages.display()
        );
        script += &format!(
            "export UPSTREAM_FASTMCP_TASKS_ECHO={}\n",
            if echo { 1 } else { 0 }
        );
        script += &format!("exec /bin/bash {SERVERS} fastmcp-tasks stdio\n");
        let wrapper = place.bin.join(format!("{alias}.sh"));
        std::fs::write(&wrapper, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
        let table = format!(
            "[[upstream]]\nalias = \"{alias}\"\ncommand = [\"/bin/sh\", \"{}\"]\nenv = [\"PATH\", \"HOME\"]\nsandbox = \"unconfined\"\neffect = \"idempotent_write\"\n",
            wrapper.display()
        );
        (Upstream { effects, messages }, table)
    }

    fn lines(path: &PathBuf) -> Vec<Value> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .collect()
    }

    /// Runs of the tool body so far.
    fn effects(&self) -> Vec<Value> {
        Upstream::lines(&self.effects)
    }

    /// The `tools/call` requests that reached the server so far.
    fn calls(&self) -> Vec<Value> {
        Upstream::lines(&self.messages)
    }
}

/// The daemon with its upstreams ready and pinned.
struct Setup {
    _root: tempfile::TempDir,
    cfg: PathBuf,
    state: PathBuf,
    daemon: Daemon,
}

impl Setup {
    fn start(root: tempfile::TempDir, sections: &str, pin: &[&str]) -> Setup {
        let state = state_dir(root.path());
        let cfg = write_config(root.path(), sections, &[]);
        let daemon = Daemon::start(&cfg, &state, &root.path().join("taskgate.log"));
        let s = Setup {
            _root: root,
            cfg,
            state,
            daemon,
        };
        for alias in pin {
            let u = wait_upstream(&s.state, alias, SETTLE, is_ready);
            // A durable-route provider as taskgate's client sees it.
            assert_eq!(u["protocol_version"], "2026-07-28", "{u}");
            assert_eq!(u["tasks_advertised"], true, "{u}");
            let out = s.admin(&["upstream", "pin", alias]);
            assert!(out.status.success(), "{out:?}");
        }
        let out = s.admin(&["reload"]);
        assert!(out.status.success(), "{out:?}");
        for alias in pin {
            wait_upstream(&s.state, alias, SETTLE, |u| {
                is_ready(u) && u["withheld"] == 0 && u["unpinned"] == 0
            });
        }
        s
    }

    fn admin(&self, head: &[&str]) -> std::process::Output {
        let (c, s) = (self.cfg.to_string_lossy(), self.state.to_string_lossy());
        let mut args: Vec<&str> = head.to_vec();
        args.extend(["--config", &c, "--state-dir", &s]);
        taskgate(&args, &[])
    }

    fn client(&self) -> Client {
        self.daemon.client(true)
    }

    fn call(&self, tool: &str, args: Value) -> Result<Value, ClientError> {
        runtime().block_on(self.client().call_tool(tool, args, None))
    }

    fn get(&self, id: &str) -> Result<Value, ClientError> {
        runtime().block_on(self.client().get_task(id))
    }

    /// The routable capability `name` as taskgate_describe shows it.
    fn described(&self, name: &str) -> Value {
        let r = self.call("taskgate_describe", json!({})).unwrap();
        let described = r["structuredContent"].clone();
        described["capabilities"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("{name} not routable: {described}"))
            .clone()
    }

    /// A lease on `cap` and a valid submission of `arguments` under `key`.
    fn submission(&self, cap: &Value, key: &str, arguments: &Value) -> Value {
        let lease = self
            .call(
                "taskgate_lease",
                json!({
                    "capabilities": [cap["name"]],
                    "effects": [cap["effect"], "non_idempotent_write"],
                }),
            )
            .unwrap()["structuredContent"]
            .clone();
        assert!(
            lease["leaseId"].as_str().is_some_and(|l| !l.is_empty()),
            "{lease}"
        );
        submission_for(&lease, cap, key, arguments, Duration::from_secs(600))
    }

    fn submit(&self, submission: &Value, arguments: &Value) -> Result<Value, ClientError> {
        self.call(
            "taskgate_submit",
            json!({"submission": submission, "arguments": arguments}),
        )
    }

    /// Polls until the task is terminal, at its poll interval.
    fn wait(&self, id: &str) -> Value {
        let start = Instant::now();
        loop {
            let t = self.get(id).unwrap();
            if matches!(
                t["status"].as_str(),
                Some("completed" | "failed" | "cancelled")
            ) {
                return t;
            }
            assert!(start.elapsed() < SETTLE, "{id} never ended: {t}");
            let ms = t["pollIntervalMs"].as_u64().unwrap_or(100);
            std::thread::sleep(Duration::from_millis(ms));
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn canonical_digest(v: &Value) -> String {
    let bytes = serde_jcs::to_vec(v).unwrap();
    sha2::Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn submission_for(
    lease: &Value,
    cap: &Value,
    key: &str,
    arguments: &Value,
    deadline: Duration,
) -> Value {
    json!({
        "schema": "taskgate.task-submission/1",
        "leaseId": lease["leaseId"],
        "capability": cap["name"],
        "logicalTaskId": format!("logical-{key}"),
        "attempt": 1,
        "correlationId": format!("corr-{key}"),
        "idempotencyKey": key,
        "inputDigest": canonical_digest(arguments),
        "acceptancePolicyDigest": "a".repeat(64),
        "artifactScopeDigest": "b".repeat(64),
        "providerInterfaceVersion": cap["schemaDigest"],
        "deadlineUnixMs": now_ms() + deadline.as_millis() as i64,
        "retentionMs": 3_600_000,
        "limits": {"runtimeMs": 30_000, "artifactBytes": 1024, "outputBytes": 65_536},
        "permittedEffect": "non_idempotent_write",
        "cleanupRequired": true,
    })
}

fn failed_name(task: &Value) -> String {
    task["error"]["data"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Waits until the upstream's tool body has run `n` times.
fn wait_effects(up: &Upstream, n: usize) -> Vec<Value> {
    let start = Instant::now();
    loop {
        let effects = up.effects();
        if effects.len() >= n {
            return effects;
        }
        assert!(
            start.elapsed() < SETTLE,
            "the tool ran {} times: {effects:?}",
            effects.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn routes_to_a_fastmcp_tasks_provider_once_and_finds_it_again_by_its_key() {
    prereq::require_tool("python3");
    let root = private_dir();
    let place = Place::new(root.path());
    let (up, table) = Upstream::table(&place, "fast", true);
    let s = Setup::start(root, &table, &["fast"]);

    let cap = s.described("fast.work");
    assert_eq!(cap["effect"], "idempotent_write", "{cap}");
    assert!(cap["schemaDigest"].as_str().unwrap().starts_with("sha256:"));
    let args = json!({"value": "hello"});
    let sub = s.submission(&cap, "sdk-1", &args);
    let handle = s.submit(&sub, &args).unwrap();
    let id = task_id(&handle);
    assert!(id.starts_with("tgr-"), "{handle}");
    let done = s.wait(&id);
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(text(&done["result"]), "done hello", "{done}");
    let meta = &done["result"]["_meta"]["dev.taskgate/route"];
    assert_eq!(meta["providerCompleted"], true, "{done}");

    // Exactly one call reached the server, carrying the envelope with the
    // public ID; the tool body ran once.
    let calls = up.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0]["name"], "work");
    assert_eq!(
        calls[0]["envelope"]["publicTaskId"],
        id.as_str(),
        "{calls:?}"
    );
    assert_eq!(up.effects(), vec![json!({"value": "hello"})]);

    // The same key and submission: the same task, nothing sent again.
    let again = s.submit(&sub, &args).unwrap();
    assert_eq!(task_id(&again), id, "{again}");
    assert_eq!(s.get(&id).unwrap()["status"], "completed");
    assert_eq!(up.calls().len(), 1, "sent again: {:?}", up.calls());
    assert_eq!(up.effects().len(), 1);
}

#[test]
fn fastmcp_tasks_as_it_comes_echoes_nothing_and_is_never_taken_for_success() {
    prereq::require_tool("python3");
    let root = private_dir();
    let place = Place::new(root.path());
    let (up, table) = Upstream::table(&place, "plain", false);
    let s = Setup::start(root, &table, &["plain"]);

    let cap = s.described("plain.work");
    let args = json!({"value": "unechoed"});
    let sub = s.submission(&cap, "plain-1", &args);
    let id = task_id(&s.submit(&sub, &args).unwrap());
    let t = s.get(&id).unwrap();
    assert_eq!(t["status"], "failed", "{t}");
    assert_eq!(failed_name(&t), "TG_TASK_RECONCILIATION_REQUIRED", "{t}");
    // The server made its task (it ran), and was asked once.
    wait_effects(&up, 1);
    assert_eq!(up.calls().len(), 1, "{:?}", up.calls());
    // Resubmitted: the same route, still failed, nothing sent again.
    let again = s.submit(&sub, &args).unwrap();
    assert_eq!(task_id(&again), id);
    assert_eq!(s.get(&id).unwrap()["status"], "failed");
    assert_eq!(up.calls().len(), 1, "sent again: {:?}", up.calls());
    assert_eq!(up.effects().len(), 1);
}
