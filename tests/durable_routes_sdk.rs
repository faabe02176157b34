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
//!
//! What this file proves: a durable route to a provider written with an
//! independent SDK: FastMCP with fastmcp-tasks 4.1.4 from PyPI, unpatched
//! (tests/interop/upstream_fastmcp_tasks.py via scripts/upstream-servers.sh,
//! unconfined), which negotiates 2026-07-28 and advertises Tasks; its task-only
//! tool's CreateTaskResult carries the echoed envelope, put there by a FastMCP
//! middleware (fastmcp-tasks gives that result no `_meta`): described, leased,
//! submitted, polled to completion, one call and one run counted from its own
//! logs, a resubmission the same task with nothing sent again; the same server
//! without the middleware (fastmcp-tasks as it comes) ends in reconciliation,
//! never success, asked once

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::route::*;
use common::upstream::*;
use common::*;
use serde_json::{Value, json};

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
        // The FastMCP recipe echoes the envelope on the task handle only
        // (its tasks/get answers are the package's own): routable only
        // under the weaker echo rule, said so in the table.
        let table = format!(
            "[[upstream]]\nalias = \"{alias}\"\ncommand = [\"/bin/sh\", \"{}\"]\nenv = [\"PATH\", \"HOME\"]\nsandbox = \"unconfined\"\neffect = \"idempotent_write\"\n{}",
            wrapper.display(),
            if echo {
                "route_echo = \"creation_only\"\n"
            } else {
                ""
            }
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

/// A durable-route provider as taskgate's client sees it.
fn provides_tasks(s: &Setup, alias: &str) {
    let u = wait_upstream(&s.state, alias, SETTLE, is_ready);
    assert_eq!(u["protocol_version"], "2026-07-28", "{u}");
    assert_eq!(u["tasks_advertised"], true, "{u}");
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
    let s = Setup::start(root, &table, &["fast"], SETTLE);
    provides_tasks(&s, "fast");

    let cap = s.capability("fast.work");
    assert_eq!(cap["effect"], "idempotent_write", "{cap}");
    assert!(cap["schemaDigest"].as_str().unwrap().starts_with("sha256:"));
    let args = json!({"value": "hello"});
    let sub = s.submission("fast.work", "sdk-1", &args, Duration::from_secs(600));
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
    let s = Setup::start(root, &table, &["plain"], SETTLE);
    provides_tasks(&s, "plain");

    let args = json!({"value": "unechoed"});
    let sub = s.submission("plain.work", "plain-1", &args, Duration::from_secs(600));
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
