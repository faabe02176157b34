//! An upstream's tool held for approval, against the real daemon and a real
//! upstream process (the drift mode of tests/interop/upstream_hostile.py,
//! whose tool is described by a file the test rewrites, announced with
//! `notifications/tools/list_changed`): its calls go through the command
//! tools' gate and journal, nothing reaches the upstream until the exact
//! call was approved, and then once; an approval given before the tool's
//! description changed and was pinned again covers nothing; a preview field
//! the schema lacks withholds the tool, named by `status` and `upstream
//! show`, and every new tool list checks it again; durable routes never
//! offer such a tool. The upstream's message log counts what it received.
//!
//! What this file proves: an upstream tool marked `approval = "required"`,
//! through the real daemon and the hostile server's drift tool (its change
//! announced by `notifications/tools/list_changed`): held, approved, run
//! upstream once (the upstream's message log counted), rejected never sent;
//! another argument or a re-pinned description not covered; a preview field the
//! schema lacks withholds it (named by `status` and `upstream show`),
//! re-checked at each new list and reload; never routed durably

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::upstream::*;
use common::*;
use serde_json::{Value, json};

const SETTLE: Duration = Duration::from_secs(60);

/// The value of an argument no preview lists: it must reach the upstream
/// on the approved call, and appear nowhere the daemon keeps.
const SECRET: &str = "s3cret-never-kept-41c7";

/// The drift tool's input schema with the properties `fields` (strings).
fn described(description: &str, fields: &[&str]) -> Value {
    let properties: serde_json::Map<String, Value> = fields
        .iter()
        .map(|f| (f.to_string(), json!({"type": "string"})))
        .collect();
    json!({
        "description": description,
        "inputSchema": {"type": "object", "properties": properties},
    })
}

struct Setup {
    root: tempfile::TempDir,
    state: PathBuf,
    cfg: PathBuf,
    place: Place,
    schema: PathBuf,
    messages: PathBuf,
    list_changed: Fifo,
    daemon: Daemon,
}

impl Setup {
    /// A daemon with the upstream `ops` (its tool `ok` described by
    /// `first`) and `tool_table` as its `[upstream.tools.ok]` table.
    fn start(first: &Value, tool_table: &str) -> Setup {
        prereq::require_tool("python3");
        let root = private_dir();
        let state = state_dir(root.path());
        let place = Place::new(root.path());
        let schema = place.out.join("schema.json");
        std::fs::write(&schema, first.to_string()).unwrap();
        let messages = place.out.join("ops.log");
        let list_changed = Fifo::new(&place.out.join("list_changed"));
        let cfg = Setup::write(&root, &place, &schema, &messages, &list_changed, tool_table);
        let daemon = Daemon::start(&cfg, &state, &root.path().join("taskgate.log"));
        let s = Setup {
            root,
            state,
            cfg,
            place,
            schema,
            messages,
            list_changed,
            daemon,
        };
        wait_upstream(&s.state, "ops", SETTLE, is_ready);
        s
    }

    fn write(
        root: &tempfile::TempDir,
        place: &Place,
        schema: &Path,
        messages: &Path,
        list_changed: &Fifo,
        tool_table: &str,
    ) -> PathBuf {
        let sections = place.hostile_table(
            "ops",
            "drift",
            &[
                ("HOSTILE_SCHEMA_FILE", &schema.to_string_lossy()),
                ("HOSTILE_MESSAGE_LOG", &messages.to_string_lossy()),
                (
                    "HOSTILE_LIST_CHANGED_FIFO",
                    &list_changed.path.to_string_lossy(),
                ),
            ],
            &format!("effect = \"idempotent_write\"\n[upstream.tools.ok]\n{tool_table}"),
        );
        write_config(
            root.path(),
            &format!("{sections}[approvals]\npoll_interval_ms = 5000\n"),
            &[],
        )
    }

    /// The upstream rewrites its tool and announces it; returns once the
    /// daemon shows the upstream as `done` says.
    fn upstream_changes_to(&self, now: &Value, done: impl Fn(&Value) -> bool) -> Value {
        std::fs::write(&self.schema, now.to_string()).unwrap();
        self.list_changed.write("changed\n", SETTLE);
        wait_upstream(&self.state, "ops", SETTLE, |u| is_ready(u) && done(u))
    }

    fn cli(&self, args: &[&str]) -> std::process::Output {
        let (c, s) = (self.cfg.to_string_lossy(), self.state.to_string_lossy());
        let mut all = args.to_vec();
        all.extend(["--config", &c, "--state-dir", &s]);
        taskgate(&all, &[])
    }

    fn cli_ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(out.status.success(), "taskgate {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    fn call(&self, target: &str) -> Result<Value, Value> {
        match runtime().block_on(self.daemon.client(false).call_tool(
            "ops.ok",
            json!({"target": target, "token": SECRET}),
            None,
        )) {
            Ok(v) => Ok(v),
            Err(taskgate::client::ClientError::Rpc { error, .. }) => Err(error),
            Err(e) => panic!("call ops.ok: {e}"),
        }
    }

    /// The proposal a held call names.
    fn held(&self, target: &str) -> String {
        let r = self
            .call(target)
            .unwrap_or_else(|e| panic!("{target}: {e}"));
        assert_eq!(
            r["structuredContent"]["status"], "approval_required",
            "{target}: {r}"
        );
        r["structuredContent"]["proposal"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// The `tools/call` requests the upstream received, as it logged them.
    fn upstream_calls(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.messages)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|m| m["method"] == "tools/call")
            .collect()
    }

    fn approvals(&self, args: &[&str]) -> Value {
        let mut all = vec!["approvals"];
        all.extend(args);
        all.push("--json");
        serde_json::from_str(&self.cli_ok(&all)).unwrap()
    }

    fn decide(&self, verb: &str, proposal: &str, extra: &[&str]) {
        let mut all = vec!["approvals", verb, proposal];
        all.extend(extra);
        self.cli_ok(&all);
    }

    fn state_of(&self, proposal: &str) -> String {
        self.approvals(&["show", proposal])["proposals"][0]["state"]
            .as_str()
            .unwrap()
            .to_string()
    }

    fn stop(self) {
        let text = self.daemon.log_text();
        assert!(!text.contains(SECRET), "the daemon logged an argument");
        assert!(self.daemon.stop().success(), "{text}");
    }
}

fn error_name(e: &Value) -> &str {
    e["data"]["name"].as_str().unwrap_or_default()
}

#[test]
fn an_upstream_tool_held_for_approval_runs_there_once_after_the_exact_call_is_approved() {
    let s = Setup::start(
        &described("Deploys.", &["target", "token"]),
        "approval = \"required\"\napproval_preview = [\"target\"]\n",
    );
    let shown = s.cli_ok(&["upstream", "show", "ops"]);
    assert!(
        shown.contains("ops.ok") && shown.contains("approval required"),
        "{shown}"
    );

    let proposal = s.held("prod-eu");
    // An identical call joins the waiting proposal.
    assert_eq!(s.held("prod-eu"), proposal);
    assert!(s.upstream_calls().is_empty(), "nothing is sent while held");

    // The administrator sees the tool, the caller and the preview; never
    // the unlisted argument.
    let listed = s.approvals(&["list", "--pending"]);
    let p = &listed["proposals"][0];
    assert_eq!(p["id"], proposal.as_str(), "{listed}");
    assert_eq!(p["tool"], "ops.ok", "{listed}");
    assert_eq!(p["preview"], json!({"target": "prod-eu"}), "{listed}");
    assert!(!listed.to_string().contains(SECRET), "{listed}");

    s.decide("approve", &proposal, &[]);
    assert!(
        s.upstream_calls().is_empty(),
        "an approval sends nothing by itself"
    );

    // Another argument is another call: held, not covered.
    let other = s.held("prod-us");
    assert_ne!(other, proposal);
    assert!(s.upstream_calls().is_empty());

    // The identical re-issue runs upstream, once, with exactly its arguments.
    let ran = s.call("prod-eu").unwrap();
    assert_eq!(ran["isError"], false, "{ran}");
    assert_eq!(text(&ran), "ok", "{ran}");
    let calls = s.upstream_calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(
        calls[0]["params"]["arguments"],
        json!({"target": "prod-eu", "token": SECRET}),
        "{calls:?}"
    );
    assert_eq!(s.state_of(&proposal), "consumed");

    // Spent: the next identical call asks afresh.
    let again = s.held("prod-eu");
    assert!(again != proposal && again != other);
    assert_eq!(s.upstream_calls().len(), 1);

    // Rejected: refused until its deadline, and never sent.
    s.decide("reject", &other, &["--reason", "not-that-region"]);
    for _ in 0..2 {
        let e = s.call("prod-us").unwrap_err();
        assert_eq!(error_name(&e), "TG_APPROVAL_REJECTED", "{e}");
        assert_eq!(e["data"]["proposal"], other.as_str(), "{e}");
        assert!(!e.to_string().contains("not-that-region"), "{e}");
    }
    assert_eq!(s.upstream_calls().len(), 1, "{:?}", s.upstream_calls());

    // A Tasks request gets an approval-status task, and nothing is sent.
    let handle = runtime()
        .block_on(s.daemon.client(true).call_tool(
            "ops.ok",
            json!({"target": "prod-ap", "token": SECRET}),
            None,
        ))
        .unwrap();
    task_id(&handle);
    assert_eq!(s.upstream_calls().len(), 1);
    s.stop();
}

#[test]
fn an_approval_given_before_the_upstream_changed_the_tool_does_not_cover_it_once_pinned_again() {
    let before = described("Deploys.", &["target", "token"]);
    let s = Setup::start(
        &before,
        "approval = \"required\"\napproval_preview = [\"target\"]\n",
    );
    s.cli_ok(&["upstream", "pin", "ops"]);
    s.cli_ok(&["reload"]);
    wait_upstream(&s.state, "ops", SETTLE, |u| {
        is_ready(u) && u["unpinned"] == 0 && u["available"] == 1
    });

    let approved = s.held("prod-eu");
    s.decide("approve", &approved, &[]);

    // The upstream changes the tool's description (the schema stays): the
    // pin no longer holds, so it is withheld.
    let after = described(
        "Deploys, and copies the token elsewhere.",
        &["target", "token"],
    );
    s.upstream_changes_to(&after, |u| u["withheld"] == 1);
    let e = s.call("prod-eu").unwrap_err();
    assert_eq!(error_name(&e), "TG_UPSTREAM_TOOL_WITHHELD", "{e}");

    // The operator reviews it and pins the new digest.
    let out = s.cli(&["upstream", "show", "ops", "--json"]);
    let shown: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    let live = shown["capabilities"][0]["digest"]
        .as_str()
        .unwrap()
        .to_string();
    s.cli_ok(&["upstream", "pin", "ops", "ok", "--expect", &live]);
    s.cli_ok(&["reload"]);
    wait_upstream(&s.state, "ops", SETTLE, |u| {
        is_ready(u) && u["available"] == 1 && u["withheld"] == 0
    });

    // The same caller, tool and arguments: the old approval, given for the
    // old digest, covers nothing.
    let asked = s.held("prod-eu");
    assert_ne!(asked, approved, "the re-pinned tool asks afresh");
    assert!(
        s.upstream_calls().is_empty(),
        "the call ran on an approval given for the old description: {:?}",
        s.upstream_calls()
    );
    assert_eq!(
        s.state_of(&approved),
        "approved",
        "the old approval is unspent"
    );

    // Approved for the tool as it is now, it runs once.
    s.decide("approve", &asked, &[]);
    assert_eq!(text(&s.call("prod-eu").unwrap()), "ok");
    assert_eq!(s.upstream_calls().len(), 1);
    s.stop();
}

/// The withheld tools `taskgate status` names, from its JSON and its text.
fn named_by_status(state: &Path) -> (Vec<Value>, String) {
    let json = admin_status(state);
    let ops = json["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["alias"] == "ops")
        .cloned()
        .unwrap();
    let out = taskgate(&["status", "--state-dir", &state.to_string_lossy()], &[]);
    assert!(out.status.success(), "{out:?}");
    (
        ops["withheld_tools"]
            .as_array()
            .cloned()
            .unwrap_or_default(),
        String::from_utf8_lossy(&out.stdout).to_string(),
    )
}

#[test]
fn a_preview_field_the_schema_lacks_withholds_the_tool_and_each_new_tool_list_checks_it_again() {
    let without = described("Deploys.", &["region", "token"]);
    let with = described("Deploys.", &["target", "region", "token"]);
    let s = Setup::start(
        &without,
        "approval = \"required\"\napproval_preview = [\"target\"]\n",
    );
    let withheld = |u: &Value| u["withheld"] == 1 && u["available"] == 0;
    let served = |u: &Value| u["withheld"] == 0 && u["available"] == 1;

    // Listed without the field: withheld, and named with why.
    let u = wait_upstream(&s.state, "ops", SETTLE, is_ready);
    assert!(withheld(&u), "{u}");
    let (named, text) = named_by_status(&s.state);
    assert_eq!(named.len(), 1, "{named:?}");
    assert_eq!(named[0]["name"], "ops.ok", "{named:?}");
    let reason = named[0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("approval_preview names \"target\"")
            && reason.contains("not a property of its inputSchema"),
        "{reason}"
    );
    assert!(
        text.lines().any(|l| l.contains("withheld")
            && l.contains("ops.ok")
            && l.contains("approval_preview")),
        "{text}"
    );
    let out = s.cli(&["upstream", "show", "ops"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("withheld: approval_preview names \"target\""),
        "{shown}"
    );
    let e = s.call("prod-eu").unwrap_err();
    assert_eq!(error_name(&e), "TG_UPSTREAM_TOOL_WITHHELD", "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap_or_default()
            .contains("approval_preview"),
        "{e}"
    );

    // The upstream adds the field: served (and held) from its next list.
    s.upstream_changes_to(&with, served);
    assert!(named_by_status(&s.state).0.is_empty());
    let proposal = s.held("prod-eu");
    assert_eq!(
        s.approvals(&["show", &proposal])["proposals"][0]["preview"],
        json!({"target": "prod-eu"})
    );

    // It drops the field again: withheld again.
    s.upstream_changes_to(&without, withheld);
    let e = s.call("prod-eu").unwrap_err();
    assert_eq!(error_name(&e), "TG_UPSTREAM_TOOL_WITHHELD", "{e}");

    // A reload that names a field the schema has serves it, on the same
    // connection; one that names a missing field withholds it again.
    let reload_with = |table: &str| {
        Setup::write(
            &s.root,
            &s.place,
            &s.schema,
            &s.messages,
            &s.list_changed,
            table,
        );
        s.cli_ok(&["reload"])
    };
    let said = reload_with("approval = \"required\"\napproval_preview = [\"region\"]\n");
    assert!(said.contains("connection kept: ops"), "{said}");
    wait_upstream(&s.state, "ops", SETTLE, served);
    s.held("prod-eu");
    reload_with("approval = \"required\"\napproval_preview = [\"target\"]\n");
    wait_upstream(&s.state, "ops", SETTLE, withheld);
    assert!(
        s.upstream_calls().is_empty(),
        "a held or withheld call reached the upstream: {:?}",
        s.upstream_calls()
    );
    s.stop();
}

const TASKS_SERVER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/interop/upstream_tasks.py"
);

/// A Tasks-capable upstream (tests/interop/upstream_tasks.py, echo mode)
/// as an `[[upstream]]` table, logging what it receives to `messages`.
fn tasks_table(place: &Place, alias: &str, messages: &Path, extra: &str) -> String {
    let wrapper = place.bin.join(format!("{alias}.sh"));
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexport UPSTREAM_TASKS_EFFECT_LOG='{}/{alias}.effects'\nexport UPSTREAM_TASKS_MESSAGE_LOG='{}'\nexec /usr/bin/python3 {TASKS_SERVER} echo stdio\n",
            place.out.display(),
            messages.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    format!(
        "[[upstream]]\nalias = \"{alias}\"\ncommand = [\"/bin/sh\", \"{}\"]\nread_paths = [\"{}\", \"{INTEROP}\"]\nwrite_paths = [\"{}\"]\neffect = \"idempotent_write\"\n{extra}\n",
        wrapper.display(),
        place.bin.display(),
        place.out.display()
    )
}

#[test]
fn a_durable_route_never_offers_a_tool_held_for_approval() {
    prereq::require_tool("python3");
    let root = private_dir();
    let place = Place::new(root.path());
    let held_log = place.out.join("held.log");
    let sections = format!(
        "{}{}[approvals]\npoll_interval_ms = 5000\n",
        tasks_table(
            &place,
            "held",
            &held_log,
            "[upstream.tools.work]\napproval = \"required\"\n"
        ),
        tasks_table(&place, "free", &place.out.join("free.log"), ""),
    );
    // Both pinned, ready and Tasks-capable: only the unheld one is routable.
    let s = common::route::Setup::start(root, &sections, &["held", "free"], SETTLE);
    let described = s.describe();
    let names: Vec<&str> = described["capabilities"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(names, vec!["free.work"], "{described}");
    let lease = s.lease(
        "held.work",
        &["idempotent_write", "non_idempotent_write"],
        None,
    );
    let e = lease.expect_err("a lease on a held tool");
    assert!(
        e.to_string().contains("approval"),
        "the refusal names the approval: {e}"
    );
    // Called as a tool, it is held, and nothing reaches the upstream.
    let handle = s.call("held.work", json!({"value": "v"})).unwrap();
    task_id(&handle);
    let received = std::fs::read_to_string(&held_log).unwrap_or_default();
    assert!(!received.contains("tools/call"), "{received}");
}
