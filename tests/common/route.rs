//! A daemon with durable routes for tests: the configuration written,
//! its upstreams ready and pinned, and the caller's side of a route
//! (describe, lease, submit, poll) over the real HTTP client; the
//! submissions and the errors they get.

#![allow(dead_code)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sha2::Digest as _;
use taskgate::client::{Client, ClientError};

use super::upstream::{is_ready, wait_upstream};
use super::{Daemon, Tool, runtime, state_dir, taskgate, write_config};

/// The daemon with its configuration, its upstreams ready and pinned.
pub struct Setup {
    /// How long upstreams may take to be ready, and tasks to end.
    pub settle: Duration,
    pub root: tempfile::TempDir,
    pub cfg: PathBuf,
    pub state: PathBuf,
    pub log: PathBuf,
    pub daemon: Option<Daemon>,
    /// The bearer token requests carry, if any.
    token: std::cell::RefCell<Option<String>>,
}

impl Setup {
    /// The daemon on `sections`, with the upstreams `pin` names pinned
    /// once ready (each given `settle`).
    pub fn start(root: tempfile::TempDir, sections: &str, pin: &[&str], settle: Duration) -> Setup {
        Setup::start_with_tools(root, sections, &[], pin, settle)
    }

    /// [`Setup::start`] with command tools beside the upstreams.
    pub fn start_with_tools(
        root: tempfile::TempDir,
        sections: &str,
        tools: &[Tool],
        pin: &[&str],
        settle: Duration,
    ) -> Setup {
        let state = state_dir(root.path());
        let cfg = write_config(root.path(), sections, tools);
        let log = root.path().join("taskgate.log");
        let daemon = Daemon::start(&cfg, &state, &log);
        let s = Setup {
            settle,
            root,
            cfg,
            state,
            log,
            daemon: Some(daemon),
            token: std::cell::RefCell::new(None),
        };
        for alias in pin {
            wait_upstream(&s.state, alias, settle, is_ready);
            let out = s.admin(&["upstream", "pin", alias]);
            assert!(out.status.success(), "{out:?}");
        }
        if !pin.is_empty() {
            let out = s.admin(&["reload"]);
            assert!(out.status.success(), "{out:?}");
            for alias in pin {
                wait_upstream(&s.state, alias, settle, |u| {
                    is_ready(u) && u["withheld"] == 0 && u["unpinned"] == 0
                });
            }
        }
        s
    }

    /// The names `tools/list` shows this caller.
    pub fn tool_names(&self) -> Vec<String> {
        let listed = runtime()
            .block_on(self.client().request("tools/list", json!({}), None, None))
            .unwrap();
        listed["tools"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t["name"].as_str().map(str::to_string))
            .collect()
    }

    pub fn daemon(&self) -> &Daemon {
        self.daemon.as_ref().unwrap()
    }

    pub fn admin(&self, head: &[&str]) -> std::process::Output {
        let (c, s) = (self.cfg.to_string_lossy(), self.state.to_string_lossy());
        let mut args: Vec<&str> = head.to_vec();
        args.extend(["--config", &c, "--state-dir", &s]);
        taskgate(&args, &[])
    }

    pub fn restart(&mut self) {
        let old = self.daemon.take().unwrap();
        assert!(old.stop().success());
        self.daemon = Some(Daemon::start(&self.cfg, &self.state, &self.log));
    }

    /// Restarts the daemon with the crash point `at` armed.
    pub fn restart_crashing_at(&mut self, at: &str) {
        let old = self.daemon.take().unwrap();
        assert!(old.stop().success());
        self.daemon = Some(
            Daemon::builder()
                .config(&self.cfg)
                .state_dir(&self.state)
                .log(&self.log)
                .env(taskgate::testhooks::CRASH_AT_ENV, at)
                .start(),
        );
    }

    /// Waits for the daemon to die (at its crash point) and starts it again.
    pub fn recover_from_crash(&mut self) {
        let mut crashed = self.daemon.take().unwrap();
        let status = crashed.wait_exit(self.settle);
        assert!(!status.success(), "{status:?}");
        self.daemon = Some(Daemon::start(&self.cfg, &self.state, &self.log));
    }

    pub fn client(&self) -> Client {
        self.daemon()
            .client(true)
            .with_token(self.token.borrow().clone())
    }

    /// Requests from now on carry `token`.
    pub fn acting_as(&self, token: Option<&str>) {
        *self.token.borrow_mut() = token.map(str::to_string);
    }

    pub fn call(&self, tool: &str, args: Value) -> Result<Value, ClientError> {
        runtime().block_on(self.client().call_tool(tool, args, None))
    }

    pub fn get(&self, id: &str) -> Result<Value, ClientError> {
        runtime().block_on(self.client().get_task(id))
    }

    pub fn cancel(&self, id: &str) -> Result<Value, ClientError> {
        runtime().block_on(self.client().cancel_task(id))
    }

    /// The routable capability `name` as `taskgate_describe` shows it.
    pub fn capability(&self, name: &str) -> Value {
        let described = self.describe();
        described["capabilities"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("{name} not routable: {described}"))
            .clone()
    }

    pub fn describe(&self) -> Value {
        let r = self.call("taskgate_describe", json!({})).unwrap();
        r["structuredContent"].clone()
    }

    pub fn lease(
        &self,
        capability: &str,
        effects: &[&str],
        ttl_ms: Option<u64>,
    ) -> Result<Value, ClientError> {
        let mut args = json!({"capabilities": [capability], "effects": effects});
        if let Some(t) = ttl_ms {
            args["ttlMs"] = json!(t);
        }
        self.call("taskgate_lease", args)
            .map(|r| r["structuredContent"].clone())
    }

    /// A lease on `capability` and a valid submission of `arguments` under
    /// `key`, due in `deadline`.
    pub fn submission(
        &self,
        capability: &str,
        key: &str,
        arguments: &Value,
        deadline: Duration,
    ) -> Value {
        let described = self.describe();
        let cap = described["capabilities"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == capability)
            .unwrap_or_else(|| panic!("{capability} not routable: {described}"))
            .clone();
        let lease = self
            .lease(
                capability,
                &[cap["effect"].as_str().unwrap(), "non_idempotent_write"],
                None,
            )
            .unwrap();
        submission_for(&lease, &cap, key, arguments, deadline)
    }

    pub fn submit(&self, submission: &Value, arguments: &Value) -> Result<Value, ClientError> {
        self.call(
            "taskgate_submit",
            json!({"submission": submission, "arguments": arguments}),
        )
    }

    /// Polls until the task is terminal, at its poll interval.
    pub fn wait(&self, id: &str) -> Value {
        let start = Instant::now();
        loop {
            let t = self.get(id).unwrap();
            if matches!(
                t["status"].as_str(),
                Some("completed" | "failed" | "cancelled")
            ) {
                return t;
            }
            assert!(start.elapsed() < self.settle, "{id} never ended: {t}");
            let ms = t["pollIntervalMs"].as_u64().unwrap_or(100);
            std::thread::sleep(Duration::from_millis(ms));
        }
    }
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

pub fn canonical_digest(v: &Value) -> String {
    let bytes = serde_jcs::to_vec(v).unwrap();
    sha2::Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub fn submission_for(
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

pub fn error_of(r: Result<Value, ClientError>) -> (String, Value) {
    match r {
        Err(ClientError::Rpc { error, .. }) => (
            error["data"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            error,
        ),
        other => panic!("expected a JSON-RPC error, got {other:?}"),
    }
}

pub fn failed_name(task: &Value) -> String {
    task["error"]["data"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// A static secret of the shape taskgate issues, distinct per `seed`, and
/// its `[[token]]` entry.
pub fn token_entry(id: &str, seed: char, tenant: &str, scopes: &[&str]) -> (String, String) {
    let secret = format!("tgk_{}", seed.to_string().repeat(43));
    let hash: String = sha2::Sha256::digest(secret.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let scopes: Vec<String> = scopes.iter().map(|s| format!("{s:?}")).collect();
    (
        secret,
        format!(
            "[[token]]\nid = {id:?}\nhash = \"sha256:{hash}\"\ntenant = {tenant:?}\nsubject = \"{id}@{tenant}\"\nscopes = [{}]\n\n",
            scopes.join(", ")
        ),
    )
}
