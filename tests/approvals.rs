//! Approval-held calls through the real daemon: a tool with `approval =
//! "required"` runs only after an administrator approved that exact call
//! with `taskgate approvals`, once, on the identical re-issue. A marker
//! file the tool appends to is the proof of what ran.
//!
//! Invariant 22 of the map: An approval never runs anything by itself, and an
//! approval runs the exact call it was given for at most once: caller (issuer,
//! tenant, subject), tool, canonical arguments and the tool's definition are
//! bound by the exact-call key, and spending it is journaled before the tool
//! starts. Guarded by:
//! `tests/approvals.rs::a_held_call_runs_once_on_the_identical_reissue_after_approval`
//! (a marker file: nothing after approval, one line after the re-issue, a
//! second re-issue held again, other arguments another proposal),
//! `tests/approvals.rs::an_approval_does_not_cover_the_call_once_the_tool_definition_changed`,
//! `tests/approvals_http.rs` (other subjects and tenants),
//! `src/approvals/gate.rs` unit tests (consumption once after reopen, the
//! approve × cancel race)
//!
//! Invariant 23 of the map: The approval journal decides and a task only
//! mirrors it: a waiting approval task is projected from the journal, and when
//! the journal cannot vouch for it (disabled, damaged, shorter than the task
//! recorded) it is unavailable, while terminal receipts stay readable from the
//! task store alone. Guarded by:
//! `tests/approvals.rs::a_waiting_task_survives_a_restart_and_completes_from_the_journal`,
//! `tests/approvals.rs::a_damaged_journal_disables_approvals_and_keeps_receipts_readable`,
//! `tests/approvals.rs::a_spent_approvals_record_with_a_changed_length_is_damage_and_never_runs_again`,
//! `src/approvals/journal.rs` sweeps (every byte of a journal of every event
//! kind changed: damaged at check and start; a cut at every offset: only the
//! unfinished final frame goes, kept aside),
//! `tests/approvals.rs::a_journal_cut_below_a_tasks_record_leaves_that_task_unavailable`
//!
//! What this file proves: approval-held calls through the real daemon and
//! `taskgate approvals` as an administrator runs it: a held call's
//! `approval_required` result and the preview without the unlisted argument;
//! approval running nothing, the identical re-issue running once (marker file),
//! a second re-issue held again; an approval not covering the call once a
//! reload changed the tool's definition; a Tasks client's approval task (status
//! message, poll interval, TTL, retry finding the same task) completing with
//! the receipt; rejection refusing the identical call with its reason never
//! shown; cancel releasing the hold; a waiting task surviving restarts and
//! reconciling a decision taken before one; a flipped journal byte disabling
//! approvals (status, `approvals verify`, held tool refused, waiting task
//! unavailable, receipt readable); no unlisted argument or reason in the task
//! store, WAL or log (at trace level); crashes at the proposal/task,
//! decision/projection and consumption/run boundaries recovered with nothing
//! run twice or lost; a journal cut below a task's record; backup (offline and
//! online) and restore carrying the journal; a notify tool told of each new
//! proposal without its arguments; an approval task outliving a short task TTL;
//! a full task store answering `approval_required` with the proposal; a reload
//! adding the first held tool opening the journal; a confined tool unable to
//! read or append to the journal, and one declaring a path that reaches it
//! refused; a real crash between an expiry and its projection (the daemon
//! restarted an hour later by the clock-skew hook) reconciled

mod common;

use std::path::{Path, PathBuf};

use common::*;
use serde_json::{Value, json};

/// The value of an argument the preview does not list: it must appear
/// nowhere the daemon writes.
const SECRET: &str = "hunter2-never-stored";
/// A reviewer's reason: kept in the approval journal only.
const REASON: &str = "not-during-the-freeze-7c1d";

struct Setup {
    root: tempfile::TempDir,
    state: PathBuf,
    daemon: Daemon,
}

impl Setup {
    fn start() -> Setup {
        let root = private_dir();
        let state = state_dir(root.path());
        let cfg = config(root.path());
        Setup::serve(root, state, &cfg, &[])
    }

    /// A daemon on `root` and `state` with the configuration `cfg` and
    /// the test hooks `hooks` in its environment.
    fn serve(root: tempfile::TempDir, state: PathBuf, cfg: &Path, hooks: &[(&str, &str)]) -> Setup {
        let mut builder = Daemon::builder()
            .config(cfg)
            .state_dir(&state)
            .log(&root.path().join("daemon.log"));
        for (key, value) in hooks {
            builder = builder.env(key, value);
        }
        let daemon = builder.start();
        Setup {
            root,
            state,
            daemon,
        }
    }

    /// A clean stop; what the next daemon serves.
    fn stop(self) -> (tempfile::TempDir, PathBuf) {
        let Setup {
            root,
            state,
            daemon,
        } = self;
        assert!(daemon.stop().success(), "a clean stop");
        (root, state)
    }

    /// The same directories served again with the default configuration.
    fn again(root: tempfile::TempDir, state: PathBuf) -> Setup {
        let cfg = config(root.path());
        Setup::serve(root, state, &cfg, &[])
    }

    fn restart(self) -> Setup {
        let (root, state) = self.stop();
        Setup::again(root, state)
    }

    /// Restarts the daemon (cleanly) with a test hook that aborts it at
    /// `crash_point`.
    fn arm(self, crash_point: &str) -> Setup {
        let (root, state) = self.stop();
        let cfg = config(root.path());
        Setup::serve(
            root,
            state,
            &cfg,
            &[(taskgate::testhooks::CRASH_AT_ENV, crash_point)],
        )
    }

    /// Waits for the armed daemon to abort, then starts it unarmed.
    fn after_crash(self) -> Setup {
        let Setup {
            root,
            state,
            mut daemon,
        } = self;
        let status = daemon.wait_exit(std::time::Duration::from_secs(30));
        assert!(!status.success(), "the daemon aborted at its crash point");
        Setup::again(root, state)
    }

    /// The ID of the approval task a Tasks request for `target` gets.
    fn task_of(&self, target: &str) -> String {
        let handle = self.call(true, target);
        handle["taskId"]
            .as_str()
            .unwrap_or_else(|| panic!("no approval task: {handle}"))
            .to_string()
    }

    /// The newest proposal listed: its ID and state.
    fn newest_proposal(&self) -> (String, String) {
        let listed = self.approvals_json(&["list"]);
        let p = &listed["proposals"][0];
        (
            p["id"].as_str().unwrap_or_default().to_string(),
            p["state"].as_str().unwrap_or_default().to_string(),
        )
    }

    fn proposals(&self) -> usize {
        self.approvals_json(&["list"])["proposals"]
            .as_array()
            .map(Vec::len)
            .unwrap_or(0)
    }

    /// A call that must fail because the daemon aborts while serving it.
    fn call_cut(&self, tasks: bool, target: &str) {
        let cut = runtime().block_on(self.daemon.client(tasks).call_tool(
            "deploy",
            json!({"target": target, "token": SECRET}),
            None,
        ));
        assert!(cut.is_err(), "the daemon aborted before answering: {cut:?}");
    }

    fn marker(&self) -> Vec<String> {
        std::fs::read_to_string(self.root.path().join("out/marker"))
            .map(|t| t.lines().map(str::to_string).collect())
            .unwrap_or_default()
    }

    fn call(&self, tasks: bool, target: &str) -> Value {
        runtime()
            .block_on(self.daemon.client(tasks).call_tool(
                "deploy",
                json!({"target": target, "token": SECRET}),
                None,
            ))
            .unwrap_or_else(|e| panic!("call deploy: {e}"))
    }

    fn call_err(&self, tasks: bool, target: &str) -> Value {
        match runtime().block_on(self.daemon.client(tasks).call_tool(
            "deploy",
            json!({"target": target, "token": SECRET}),
            None,
        )) {
            Err(taskgate::client::ClientError::Rpc { error, .. }) => error,
            other => panic!("expected an error, got {other:?}"),
        }
    }

    fn get(&self, id: &str) -> Result<Value, Value> {
        match runtime().block_on(self.daemon.client(true).get_task(id)) {
            Ok(v) => Ok(v),
            Err(taskgate::client::ClientError::Rpc { error, .. }) => Err(error),
            Err(e) => panic!("tasks/get: {e}"),
        }
    }

    fn cli(&self, args: &[&str]) -> std::process::Output {
        let mut all: Vec<&str> = args.to_vec();
        let state = self.state.to_string_lossy().into_owned();
        all.extend(["--state-dir", &state]);
        taskgate(&all, &[])
    }

    fn approvals_json(&self, args: &[&str]) -> Value {
        let mut all = vec!["approvals"];
        all.extend(args);
        all.push("--json");
        let out = self.cli(&all);
        assert!(out.status.success(), "taskgate {all:?}: {out:?}");
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"))
    }

    fn decide(&self, verb: &str, id: &str, extra: &[&str]) -> std::process::Output {
        let mut all = vec!["approvals", verb, id];
        all.extend(extra);
        self.cli(&all)
    }

    fn journal_dir(&self) -> PathBuf {
        self.root.path().join("state-approvals")
    }
}

fn config(root: &Path) -> PathBuf {
    config_with(root, false, "")
}

/// The configuration; with `notify`, a tool `page` that tells of new
/// proposals by writing what it is given into the FIFO `out/notified`.
fn config_with(root: &Path, notify: bool, sections: &str) -> PathBuf {
    let out = root.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let mut tools =
        vec![Tool::new("deploy")
        .script(&format!(
            "printf '%s\\n' \"$0\" >> {}/marker; printf deployed",
            out.display()
        ))
        .args(&["{target}"])
        .param("target", "string")
        .param("token", "string")
        .extra(&format!(
            "approval = \"required\"\napproval_preview = [\"target\"]\nwrite_paths = [\"{}\"]",
            out.display()
        ))];
    let mut sections = format!("{sections}[approvals]\npoll_interval_ms = 5000\n");
    if notify {
        sections.push_str("notify_tool = \"page\"\n");
        tools.push(
            Tool::new("page")
                .script(&format!("cat > {}/notified", out.display()))
                .param("proposal", "string")
                .param("tool", "string")
                .param("principal", "string")
                .param("decisionDeadlineMs", "integer")
                .effect("idempotent_write")
                .extra(&format!("write_paths = [\"{}\"]", out.display())),
        );
    }
    write_config(root, &sections, &tools)
}

/// The proposal an `approval_required` result names.
fn proposal_of(result: &Value) -> String {
    assert_eq!(result["isError"], true, "{result}");
    assert_eq!(
        result["structuredContent"]["status"], "approval_required",
        "{result}"
    );
    let id = result["structuredContent"]["proposal"]
        .as_str()
        .unwrap_or_else(|| panic!("no proposal in {result}"))
        .to_string();
    assert!(id.starts_with("tgp-") && id.len() == 36, "{id}");
    id
}

fn text_of(result: &Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn a_held_call_runs_once_on_the_identical_reissue_after_approval() {
    let s = Setup::start();
    let first = s.call(false, "prod-eu");
    let proposal = proposal_of(&first);
    assert!(s.marker().is_empty(), "nothing runs while held");

    // An identical call joins the waiting proposal.
    assert_eq!(proposal_of(&s.call(false, "prod-eu")), proposal);

    // The administrator sees the tool, the caller, the argument digest and
    // the preview, never the unlisted argument.
    let listed = s.approvals_json(&["list", "--pending"]);
    let shown = &listed["proposals"][0];
    assert_eq!(shown["id"], proposal.as_str(), "{listed}");
    assert_eq!(shown["tool"], "deploy");
    assert_eq!(shown["preview"]["target"], "prod-eu", "{listed}");
    assert_eq!(shown["arguments"].as_str().map(str::len), Some(64));
    assert!(!listed.to_string().contains(SECRET), "{listed}");
    assert_eq!(listed["journal"]["pending"], 1, "{listed}");

    let approved = s.decide("approve", &proposal, &[]);
    assert!(approved.status.success(), "{approved:?}");
    assert!(
        s.marker().is_empty(),
        "an approval never runs anything by itself"
    );

    // Not covered: other arguments.
    let other = proposal_of(&s.call(false, "prod-us"));
    assert_ne!(other, proposal);

    // The identical re-issue runs, once.
    let ran = s.call(false, "prod-eu");
    assert_eq!(ran["isError"], false, "{ran}");
    assert_eq!(text_of(&ran), "deployed", "{ran}");
    assert_eq!(s.marker(), vec!["prod-eu".to_string()]);

    // A second re-issue needs a new approval.
    let again = proposal_of(&s.call(false, "prod-eu"));
    assert_ne!(again, proposal);
    assert_eq!(s.marker().len(), 1, "the approval was spent");

    let shown = s.approvals_json(&["show", &proposal]);
    assert_eq!(shown["proposals"][0]["state"], "consumed", "{shown}");
    assert!(
        shown["proposals"][0]["decider"]
            .as_str()
            .is_some_and(|d| d.starts_with("uid ")),
        "{shown}"
    );
}

#[test]
fn an_approval_does_not_cover_the_call_once_the_tool_definition_changed() {
    let s = Setup::start();
    let proposal = proposal_of(&s.call(false, "prod-eu"));
    assert!(s.decide("approve", &proposal, &[]).status.success());
    // The operator changes what the tool runs; the approval was given for
    // the old definition.
    let cfg = config(s.root.path());
    let text = std::fs::read_to_string(&cfg).unwrap();
    assert!(text.contains("printf deployed"), "{text}");
    std::fs::write(&cfg, text.replace("printf deployed", "printf redeployed")).unwrap();
    let reloaded = s.cli(&["reload", "--config", cfg.to_str().unwrap()]);
    assert!(reloaded.status.success(), "{reloaded:?}");
    let asked = proposal_of(&s.call(false, "prod-eu"));
    assert_ne!(asked, proposal, "the changed tool asks afresh");
    assert!(s.marker().is_empty(), "nothing ran on the old approval");
    let old = s.approvals_json(&["show", &proposal]);
    assert_eq!(old["proposals"][0]["state"], "approved", "{old}");
    // Approved for the new definition, the identical call runs it once.
    assert!(s.decide("approve", &asked, &[]).status.success());
    assert_eq!(text_of(&s.call(false, "prod-eu")), "redeployed");
    assert_eq!(s.marker(), vec!["prod-eu".to_string()]);
}

#[test]
fn a_tasks_client_polls_an_approval_task_to_its_receipt() {
    let s = Setup::start();
    let handle = s.call(true, "prod-eu");
    assert_eq!(handle["resultType"], "task", "{handle}");
    assert_eq!(handle["status"], "working", "{handle}");
    assert_eq!(handle["pollIntervalMs"], 5000, "{handle}");
    assert!(
        handle["statusMessage"]
            .as_str()
            .is_some_and(|m| m.contains("administrator")),
        "{handle}"
    );
    let task = handle["taskId"].as_str().unwrap().to_string();
    // Its time to live reaches past the proposal's expiry.
    assert!(handle["ttlMs"].as_i64().unwrap() >= 86_400_000, "{handle}");

    // The same call again (a retry) finds the same task.
    assert_eq!(s.call(true, "prod-eu")["taskId"], task.as_str());

    let waiting = s.get(&task).expect("poll");
    assert_eq!(waiting["status"], "working", "{waiting}");
    // tasks/update is acknowledged (unknown keys too) and approves nothing.
    runtime()
        .block_on(s.daemon.client(true).request(
            "tasks/update",
            json!({"taskId": task, "inputResponses": {"approve": {"decision": "approved"}}}),
            Some(&task),
            None,
        ))
        .expect("tasks/update is acknowledged");
    let listed = s.approvals_json(&["list", "--pending"]);
    assert_eq!(listed["proposals"][0]["state"], "pending", "{listed}");
    let proposal = listed["proposals"][0]["id"].as_str().unwrap().to_string();

    assert!(
        s.decide("approve", &proposal, &["--valid-for", "10m"])
            .status
            .success()
    );
    let done = s.get(&task).expect("poll");
    assert_eq!(done["status"], "completed", "{done}");
    let result = &done["result"];
    assert_eq!(result["isError"], false, "{done}");
    assert_eq!(result["structuredContent"]["proposal"], proposal.as_str());
    assert_eq!(
        result["structuredContent"]["status"], "approval_recorded",
        "{done}"
    );
    assert!(result["structuredContent"]["approvalExpiresAtMs"].is_i64());
    assert!(s.marker().is_empty(), "the receipt ran nothing");

    // The re-issue (this tool runs synchronously) runs once.
    let ran = s.call(true, "prod-eu");
    assert_eq!(text_of(&ran), "deployed", "{ran}");
    assert_eq!(s.marker().len(), 1);
    // The receipt stays what it was.
    assert_eq!(s.get(&task).expect("poll")["status"], "completed");
}

#[test]
fn a_rejection_refuses_the_identical_call_and_never_shows_its_reason() {
    let s = Setup::start();
    let handle = s.call(true, "prod-eu");
    let task = handle["taskId"].as_str().unwrap().to_string();
    let proposal = s.newest_proposal().0;
    let rejected = s.decide("reject", &proposal, &["--reason", REASON]);
    assert!(rejected.status.success(), "{rejected:?}");

    let done = s.get(&task).expect("poll");
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["isError"], true, "{done}");
    assert!(!done.to_string().contains(REASON), "{done}");

    let refused = s.call_err(false, "prod-eu");
    assert_eq!(refused["code"], -32078, "{refused}");
    assert_eq!(refused["data"]["proposal"], proposal.as_str(), "{refused}");
    assert!(!refused.to_string().contains(REASON), "{refused}");
    // Other arguments are another call.
    proposal_of(&s.call(false, "prod-us"));
    assert!(s.marker().is_empty());

    // A decided proposal cannot be decided again.
    let twice = s.decide("approve", &proposal, &[]);
    assert_eq!(twice.status.code(), Some(1), "{twice:?}");
}

#[test]
fn cancelling_an_approval_task_releases_the_hold() {
    let s = Setup::start();
    let handle = s.call(true, "prod-eu");
    let task = handle["taskId"].as_str().unwrap().to_string();
    let proposal = s.newest_proposal().0;
    runtime()
        .block_on(s.daemon.client(true).cancel_task(&task))
        .expect("cancel");
    assert_eq!(s.get(&task).expect("poll")["status"], "cancelled");
    let shown = s.approvals_json(&["show", &proposal]);
    assert_eq!(shown["proposals"][0]["state"], "cancelled", "{shown}");
    // The cancelled proposal cannot be approved any more ...
    let late = s.decide("approve", &proposal, &[]);
    assert_eq!(late.status.code(), Some(1), "{late:?}");
    // ... and the identical call asks afresh.
    let fresh = proposal_of(&s.call(false, "prod-eu"));
    assert_ne!(fresh, proposal);
    assert!(s.marker().is_empty());
}

#[test]
fn a_waiting_task_survives_a_restart_and_completes_from_the_journal() {
    let s = Setup::start();
    let handle = s.call(true, "prod-eu");
    let task = handle["taskId"].as_str().unwrap().to_string();
    let s = s.restart();
    assert_eq!(s.get(&task).expect("poll")["status"], "working");
    let proposal = s.approvals_json(&["list", "--pending"])["proposals"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(s.decide("approve", &proposal, &[]).status.success());
    // Decided, not yet projected: the next start reconciles it.
    let s = s.restart();
    let done = s.get(&task).expect("poll");
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["isError"], false, "{done}");
    let ran = s.call(false, "prod-eu");
    assert_eq!(text_of(&ran), "deployed", "{ran}");
    assert_eq!(s.marker().len(), 1);
}

#[test]
fn a_damaged_journal_disables_approvals_and_keeps_receipts_readable() {
    let s = Setup::start();
    // One receipt (rejected), one task still waiting.
    let receipt = s.task_of("prod-eu");
    let first = s.newest_proposal().0;
    assert!(
        s.decide("reject", &first, &["--reason", REASON])
            .status
            .success()
    );
    assert_eq!(s.get(&receipt).expect("poll")["status"], "completed");
    let waiting = s.task_of("prod-us");
    let (root, state) = s.stop();

    // One flipped byte in the middle of the first segment.
    let segment = root.path().join("state-approvals/journal-000001.log");
    let mut bytes = std::fs::read(&segment).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x01;
    std::fs::write(&segment, &bytes).unwrap();

    let s = Setup::again(root, state);
    let status = admin_status(&s.state);
    assert!(
        status["approvals"]["disabled"]
            .as_str()
            .is_some_and(|r| r.contains("journal-000001.log")),
        "{status}"
    );
    let verify = s.cli(&["approvals", "verify"]);
    assert_eq!(verify.status.code(), Some(65), "{verify:?}");
    // The JSON form says the same, and exits the same.
    let verify = s.cli(&["approvals", "verify", "--json"]);
    assert_eq!(verify.status.code(), Some(65), "{verify:?}");
    let said: serde_json::Value = serde_json::from_slice(&verify.stdout).expect("JSON");
    assert!(said["disabled"].is_string(), "{said}");
    // `check` names it too (with the daemon stopped, below).
    // The receipt is read from the task store alone.
    assert_eq!(s.get(&receipt).expect("poll")["status"], "completed");
    // The waiting task is not guessed.
    let unavailable = s.get(&waiting).expect_err("evidence missing");
    assert_eq!(unavailable["code"], -32059, "{unavailable}");
    // A held tool refuses; nothing runs.
    let refused = s.call_err(false, "prod-eu");
    assert_eq!(refused["code"], -32077, "{refused}");
    assert!(s.marker().is_empty());
    assert!(
        segment_kept(&s.journal_dir()),
        "the damaged segment is kept for investigation"
    );
    let (root, state) = s.stop();
    let check = check_stopped(root.path(), &state);
    let text = String::from_utf8_lossy(&check.stdout);
    assert!(
        text.contains("DAMAGED") && text.contains("journal-000001.log"),
        "{check:?}"
    );
}

fn segment_kept(dir: &Path) -> bool {
    dir.join("journal-000001.log").exists()
}

#[test]
fn no_argument_value_or_reason_reaches_the_task_store_or_the_log() {
    // At the most verbose level taskgate has.
    let root = private_dir();
    let state = state_dir(root.path());
    let daemon = Daemon::builder()
        .config(&config(root.path()))
        .state_dir(&state)
        .log(&root.path().join("daemon.log"))
        .env("TASKGATE_LOG", "trace")
        .start();
    let s = Setup {
        root,
        state,
        daemon,
    };
    let task = s.task_of("prod-eu");
    let proposal = s.newest_proposal().0;
    assert!(
        s.decide("reject", &proposal, &["--reason", REASON])
            .status
            .success()
    );
    s.get(&task).expect("poll");
    proposal_of(&s.call(false, "prod-us"));
    let log = s.daemon.log_text();
    assert!(
        log.contains("task read from the store"),
        "the log holds debug events: {log}"
    );
    let (root, state) = s.stop();
    let mut store_bytes = Vec::new();
    for entry in std::fs::read_dir(&state).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            store_bytes.extend(std::fs::read(&path).unwrap());
        }
    }
    let journal: Vec<u8> = std::fs::read_dir(root.path().join("state-approvals"))
        .unwrap()
        .flat_map(|e| std::fs::read(e.unwrap().path()).unwrap_or_default())
        .collect();
    let has = |hay: &[u8], needle: &str| hay.windows(needle.len()).any(|w| w == needle.as_bytes());
    assert!(!has(&store_bytes, SECRET) && !has(&journal, SECRET) && !log.contains(SECRET));
    assert!(!has(&store_bytes, REASON) && !log.contains(REASON));
    // The preview and the reason are the journal's alone.
    assert!(has(&journal, REASON) && has(&journal, "prod-eu"));
    assert!(!has(&store_bytes, "prod-eu"));
}

#[test]
fn a_crash_between_the_proposal_and_its_task_loses_nothing_and_the_retry_reuses_it() {
    let s = Setup::start().arm(taskgate::testhooks::CRASH_APPROVAL_PROPOSED);
    s.call_cut(true, "prod-eu");
    let s = s.after_crash();
    // The proposal was journaled; no task handle was ever given out.
    let (proposal, state) = s.newest_proposal();
    assert_eq!(state, "pending");
    // The retry joins the same proposal and gets its task now.
    let handle = s.call(true, "prod-eu");
    assert_eq!(handle["status"], "working", "{handle}");
    assert_eq!(s.proposals(), 1, "the retry made no second proposal");
    assert!(s.decide("approve", &proposal, &[]).status.success());
    let task = handle["taskId"].as_str().unwrap();
    assert_eq!(s.get(task).expect("poll")["status"], "completed");
    assert!(s.marker().is_empty());
}

#[test]
fn a_crash_between_a_decision_and_its_projection_is_reconciled_on_the_next_read() {
    let s = Setup::start();
    let task = s.task_of("prod-eu");
    let s = s.arm(taskgate::testhooks::CRASH_APPROVAL_DECIDED);
    let (proposal, _) = s.newest_proposal();
    assert!(
        s.decide("reject", &proposal, &["--reason", REASON])
            .status
            .success()
    );
    // The read that would project the rejection aborts the daemon.
    assert!(
        runtime()
            .block_on(s.daemon.client(true).get_task(&task))
            .is_err()
    );
    let s = s.after_crash();
    let done = s.get(&task).expect("poll");
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["isError"], true, "{done}");
    assert_eq!(s.call_err(false, "prod-eu")["code"], -32078);
    assert!(s.marker().is_empty());
}

#[test]
fn a_crash_between_consuming_an_approval_and_the_run_never_runs_it_twice() {
    let s = Setup::start();
    let proposal = proposal_of(&s.call(false, "prod-eu"));
    assert!(s.decide("approve", &proposal, &[]).status.success());
    let s = s.arm(taskgate::testhooks::CRASH_APPROVAL_CONSUMED);
    s.call_cut(false, "prod-eu");
    let s = s.after_crash();
    // Spent, never run: at most once, and the caller asks afresh.
    assert_eq!(
        s.approvals_json(&["show", &proposal])["proposals"][0]["state"],
        "consumed"
    );
    assert!(s.marker().is_empty());
    let again = proposal_of(&s.call(false, "prod-eu"));
    assert_ne!(again, proposal);
    assert!(s.marker().is_empty());
}

#[test]
fn backup_and_restore_carry_the_journal_with_the_tasks() {
    let s = Setup::start();
    let task = s.task_of("prod-eu");
    let (proposal, _) = s.newest_proposal();
    // An online snapshot while serving holds the journal too.
    let online = s.root.path().join("online");
    let out = s.cli(&["backup", "--online", "--to", online.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    assert!(online.join("approvals/journal-000001.log").exists());

    let (root, state) = s.stop();
    let offline = root.path().join("offline");
    let st = state.to_string_lossy().into_owned();
    let offline_run = |command: &str, flag: &str| {
        taskgate(
            &[command, "--state-dir", &st, flag, offline.to_str().unwrap()],
            &[],
        )
    };
    let out = offline_run("backup", "--to");
    assert!(out.status.success(), "{out:?}");
    let manifest = std::fs::read_to_string(offline.join("MANIFEST.sha256")).unwrap();
    assert!(
        manifest.contains("# part approval-journal")
            && manifest.contains("approvals/journal-000001.log"),
        "{manifest}"
    );

    // After the backup the proposal is approved and the task completes.
    let s = Setup::again(root, state);
    assert!(s.decide("approve", &proposal, &[]).status.success());
    assert_eq!(s.get(&task).expect("poll")["status"], "completed");
    let (root, state) = s.stop();

    // Restoring both puts both back as they were at the backup: the task
    // waits again and the journal holds the proposal pending.
    let out = offline_run("restore", "--from");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("approval journal"), "{text}");
    let s = Setup::again(root, state);
    assert_eq!(s.get(&task).expect("poll")["status"], "working");
    assert_eq!(
        s.newest_proposal(),
        (proposal.clone(), "pending".to_string())
    );
    assert!(s.decide("approve", &proposal, &[]).status.success());
    assert_eq!(s.get(&task).expect("poll")["status"], "completed");
    assert!(s.marker().is_empty());
}

/// The byte length of a journal segment's magic and its first `n` frames
/// (each an 8-byte little-endian length, 8 bytes checking it, the record
/// padded to 8 bytes, a 32-byte hash).
fn frames_len(segment: &[u8], n: usize) -> usize {
    assert!(segment.starts_with(&taskgate::approvals::journal::FORMAT_MAGIC));
    let mut at = taskgate::approvals::journal::FORMAT_MAGIC.len();
    for _ in 0..n {
        let len = u64::from_le_bytes(segment[at..at + 8].try_into().unwrap()) as usize;
        at += 16 + len.div_ceil(8) * 8 + 32;
    }
    at
}

/// Where the last frame of a journal segment starts.
fn last_frame_at(segment: &[u8]) -> usize {
    let mut n = 0;
    while frames_len(segment, n + 1) < segment.len() {
        n += 1;
    }
    assert_eq!(frames_len(segment, n + 1), segment.len());
    frames_len(segment, n)
}

#[test]
fn a_spent_approvals_record_with_a_changed_length_is_damage_and_never_runs_again() {
    let s = Setup::start();
    let proposal = proposal_of(&s.call(false, "prod-eu"));
    assert!(s.decide("approve", &proposal, &[]).status.success());
    let ran = s.call(false, "prod-eu");
    assert_eq!(text_of(&ran), "deployed", "{ran}");
    assert_eq!(s.marker().len(), 1);
    let (root, state) = s.stop();

    // The last frame is the `consumed` record that spent the approval: one
    // byte of its length raised, so that it claims to run past the end of
    // the file, as a frame a crash cut short would.
    let segment = root.path().join("state-approvals/journal-000001.log");
    let mut bytes = std::fs::read(&segment).unwrap();
    let at = last_frame_at(&bytes);
    assert!(
        String::from_utf8_lossy(&bytes[at..]).contains("\"consumed\""),
        "the last record is the consumption"
    );
    bytes[at + 1] = bytes[at + 1].wrapping_add(1);
    std::fs::write(&segment, &bytes).unwrap();

    let s = Setup::again(root, state);
    let status = admin_status(&s.state);
    assert!(
        status["approvals"]["disabled"]
            .as_str()
            .is_some_and(|r| r.contains("journal-000001.log") && r.contains("length")),
        "an acknowledged record was taken for a torn one: {status}"
    );
    // The identical call is refused, and does not run a second time.
    let refused = s.call_err(false, "prod-eu");
    assert_eq!(refused["code"], -32077, "{refused}");
    assert_eq!(s.marker().len(), 1, "the spent approval ran again");
    assert_eq!(
        std::fs::read(&segment).unwrap(),
        bytes,
        "the evidence was changed"
    );
    let (root, state) = s.stop();
    let check = check_stopped(root.path(), &state);
    let text = String::from_utf8_lossy(&check.stdout);
    assert!(
        text.contains("DAMAGED") && text.contains("journal-000001.log"),
        "{check:?}"
    );
}

#[test]
fn a_decision_whose_journal_sync_fails_is_refused_and_disables_approvals_until_restart() {
    use taskgate::testhooks::{JOURNAL_SYNC_APPEND, JOURNAL_SYNC_FAULT_FILE_ENV};
    let root = private_dir();
    let state = state_dir(root.path());
    let cfg = config(root.path());
    let fault = root.path().join("journal-sync-fault");
    let fault_env = fault.to_string_lossy().into_owned();
    let s = Setup::serve(
        root,
        state,
        &cfg,
        &[(JOURNAL_SYNC_FAULT_FILE_ENV, &fault_env)],
    );
    let proposal = proposal_of(&s.call(false, "prod-eu"));
    let other = proposal_of(&s.call(false, "prod-us"));
    let records = admin_status(&s.state)["approvals"]["records"].clone();

    // The approval's record is written, its sync fails: never acknowledged.
    std::fs::write(&fault, JOURNAL_SYNC_APPEND).unwrap();
    let approved = s.decide("approve", &proposal, &[]);
    assert!(!approved.status.success(), "{approved:?}");
    let said = String::from_utf8_lossy(&approved.stderr);
    assert!(
        said.contains("could not record the decision"),
        "{approved:?}"
    );
    std::fs::remove_file(&fault).unwrap();

    // The gate is disabled until a restart, whatever the disk does now.
    let status = admin_status(&s.state);
    assert!(
        status["approvals"]["disabled"]
            .as_str()
            .is_some_and(|r| r.contains("append")),
        "{status}"
    );
    assert_eq!(status["approvals"]["records"], records, "{status}");
    let rejected = s.decide("reject", &other, &["--reason", REASON]);
    assert!(!rejected.status.success(), "{rejected:?}");
    assert!(
        String::from_utf8_lossy(&rejected.stderr).contains("disabled"),
        "{rejected:?}"
    );
    let refused = s.call_err(false, "prod-eu");
    assert_eq!(refused["code"], -32077, "{refused}");
    assert!(s.marker().is_empty());

    // After a restart neither is decided, and deciding works again.
    let s = s.restart();
    assert!(admin_status(&s.state)["approvals"]["disabled"].is_null());
    for id in [&proposal, &other] {
        let shown = s.approvals_json(&["show", id]);
        assert_eq!(shown["proposals"][0]["state"], "pending", "{shown}");
    }
    assert!(s.decide("approve", &proposal, &[]).status.success());
    assert_eq!(text_of(&s.call(false, "prod-eu")), "deployed");
    assert_eq!(s.marker(), vec!["prod-eu".to_string()]);
}

#[test]
fn a_journal_cut_below_a_tasks_record_leaves_that_task_unavailable() {
    let s = Setup::start();
    let first = s.task_of("prod-eu");
    let second = s.task_of("prod-us");
    let (root, state) = s.stop();
    // A journal that ends, at a frame boundary, after the first proposal:
    // an older copy of it. It chains, so only the tasks' records tell.
    let segment = root.path().join("state-approvals/journal-000001.log");
    let bytes = std::fs::read(&segment).unwrap();
    let keep = frames_len(&bytes, 2);
    assert!(keep < bytes.len());
    std::fs::write(&segment, &bytes[..keep]).unwrap();

    let s = Setup::again(root, state);
    let status = admin_status(&s.state);
    assert!(status["approvals"]["disabled"].is_null(), "{status}");
    // status names it: the journal is older than the task store.
    assert!(
        status["approvals"]["stale"]
            .as_str()
            .is_some_and(|m| m.contains("older than the task store")),
        "{status}"
    );
    assert_eq!(s.get(&first).expect("poll")["status"], "working");
    let missing = s.get(&second).expect_err("evidence missing");
    assert_eq!(missing["code"], -32059, "{missing}");
    assert!(
        missing["message"].as_str().unwrap().contains("shorter"),
        "{missing}"
    );
    // And check does, with the daemon stopped.
    let (root, state) = s.stop();
    let check = check_stopped(root.path(), &state);
    let text = String::from_utf8_lossy(&check.stdout);
    assert!(
        text.contains("STALE") && text.contains("2 approval tasks wait"),
        "{check:?}"
    );
}

#[test]
fn a_notify_tool_hears_of_each_new_proposal_without_its_arguments() {
    let root = private_dir();
    let state = state_dir(root.path());
    let cfg = config_with(root.path(), true, "");
    let fifo = Fifo::new(&root.path().join("out/notified"));
    let s = Setup::serve(root, state, &cfg, &[]);
    let proposal = proposal_of(&s.call(false, "prod-eu"));
    // A joining call is not a new proposal: no second notification (the
    // run counter counts a notification when it is started, before the
    // call is answered).
    assert_eq!(proposal_of(&s.call(false, "prod-eu")), proposal);
    assert_eq!(admin_status(&s.state)["runs_started"], 1);
    let told: Value = serde_json::from_str(&fifo.read(std::time::Duration::from_secs(20)))
        .expect("the notification as JSON");
    assert_eq!(told["proposal"], proposal.as_str(), "{told}");
    assert_eq!(told["tool"], "deploy", "{told}");
    assert!(
        told["principal"].as_str().unwrap().contains("local"),
        "{told}"
    );
    assert!(!told.to_string().contains(SECRET) && !told.to_string().contains("prod-eu"));
    assert!(s.marker().is_empty());
}

#[test]
fn an_approval_task_outlives_a_short_task_ttl() {
    let root = private_dir();
    let state = state_dir(root.path());
    let cfg = config_with(root.path(), false, "[tasks]\ndefault_ttl_secs = 60\n");
    let s = Setup::serve(root, state, &cfg, &[]);
    let handle = s.call(true, "prod-eu");
    // Decision window (1 h) + execution window (15 min) + an hour, not the
    // minute ordinary tasks get.
    let ttl = handle["ttlMs"].as_i64().unwrap();
    assert!(ttl >= (3600 + 900 + 3600) * 1000, "{handle}");
    assert!(ttl <= (3600 + 900 + 3600 + 60) * 1000, "{handle}");
}

#[test]
fn a_full_task_store_answers_approval_required_and_loses_no_proposal() {
    let root = private_dir();
    let state = state_dir(root.path());
    let cfg = config_with(root.path(), false, "[store]\nmax_live_tasks = 1\n");
    let s = Setup::serve(root, state, &cfg, &[]);
    // The first approval task takes the one live task the store holds.
    assert_eq!(s.call(true, "prod-eu")["resultType"], "task");
    // The next, though it asked for Tasks, gets the proposal in the
    // approval_required answer: the workflow is not lost.
    let fallback = s.call(true, "prod-us");
    let proposal = proposal_of(&fallback);
    assert_eq!(
        s.approvals_json(&["show", &proposal])["proposals"][0]["state"],
        "pending"
    );
    assert!(s.decide("approve", &proposal, &[]).status.success());
    let ran = s.call(false, "prod-us");
    assert_eq!(text_of(&ran), "deployed", "{ran}");
    assert_eq!(s.marker(), vec!["prod-us".to_string()]);
}

#[test]
fn a_reload_that_adds_the_first_held_tool_opens_the_journal() {
    let root = private_dir();
    let state = state_dir(root.path());
    // First without any tool that needs approval (and no journal yet).
    let cfg = write_config(root.path(), "", &[Tool::new("echo").script("printf hi")]);
    let daemon = Daemon::start(&cfg, &state, &root.path().join("daemon.log"));
    assert!(!root.path().join("state-approvals").exists());
    assert!(admin_status(&state)["approvals"].is_null());
    config(root.path());
    let s = Setup {
        root,
        state,
        daemon,
    };
    let reloaded = s.cli(&["reload", "--config", cfg.to_str().unwrap()]);
    assert!(reloaded.status.success(), "{reloaded:?}");
    let proposal = proposal_of(&s.call(false, "prod-eu"));
    assert!(s.journal_dir().join("journal-000001.log").exists());
    assert!(s.decide("approve", &proposal, &[]).status.success());
    assert_eq!(text_of(&s.call(false, "prod-eu")), "deployed");
}

#[test]
fn a_confined_tool_can_neither_read_nor_append_to_the_journal() {
    let root = private_dir();
    let state = state_dir(root.path());
    let journal = root.path().join("state-approvals");
    let mut cfg_text = std::fs::read_to_string(config(root.path())).unwrap();
    cfg_text.push_str(
        &Tool::new("snoop")
            .script(&format!(
                "cat {0}/journal-000001.log; printf forged >> {0}/journal-000001.log; ls {0}",
                journal.display()
            ))
            .effect("read_only")
            .to_string(),
    );
    let cfg = root.path().join("snoop.toml");
    std::fs::write(&cfg, cfg_text).unwrap();
    let s = Setup::serve(root, state, &cfg, &[]);
    proposal_of(&s.call(false, "prod-eu"));
    let before = std::fs::read(journal.join("journal-000001.log")).unwrap();
    let snooped = runtime()
        .block_on(s.daemon.client(false).call_tool("snoop", json!({}), None))
        .expect("the call is answered");
    assert_eq!(snooped["isError"], true, "{snooped}");
    let text = snooped.to_string();
    assert!(
        !text.contains("proposal_created") && !text.contains("journal.lock"),
        "{text}"
    );
    assert_eq!(
        std::fs::read(journal.join("journal-000001.log")).unwrap(),
        before
    );
    // A tool that declares a path reaching the journal is refused at start.
    let (root, state) = s.stop();
    let bad = root.path().join("bad.toml");
    let mut bad_text = std::fs::read_to_string(config(root.path())).unwrap();
    bad_text.push_str(
        &Tool::new("reach")
            .script("true")
            .extra(&format!("read_paths = [\"{}\"]", journal.display()))
            .to_string(),
    );
    std::fs::write(&bad, bad_text).unwrap();
    let out = taskgate(
        &[
            "check",
            "--config-only",
            "--config",
            bad.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
        ],
        &[],
    );
    assert!(!out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("state-approvals"),
        "{out:?}"
    );
}

#[test]
fn a_crash_between_an_expiry_and_its_projection_is_reconciled_after_it() {
    let s = Setup::start();
    let task = s.task_of("prod-eu");
    let (proposal, _) = s.newest_proposal();
    // Restarted an hour and a second later (the decision window is an
    // hour), armed to abort once a decision is read and before the task
    // shows it.
    let later = (3_601 * 1000).to_string();
    let (root, state) = s.stop();
    let cfg = config(root.path());
    let s = Setup::serve(
        root,
        state,
        &cfg,
        &[
            (taskgate::testhooks::CLOCK_SKEW_MS_ENV, &later),
            (
                taskgate::testhooks::CRASH_AT_ENV,
                taskgate::testhooks::CRASH_APPROVAL_DECIDED,
            ),
        ],
    );
    // The read journals the expiry, then the daemon aborts.
    assert!(
        runtime()
            .block_on(s.daemon.client(true).get_task(&task))
            .is_err()
    );
    let Setup {
        root,
        state,
        mut daemon,
    } = s;
    assert!(
        !daemon
            .wait_exit(std::time::Duration::from_secs(30))
            .success()
    );
    let s = Setup::serve(
        root,
        state,
        &cfg,
        &[(taskgate::testhooks::CLOCK_SKEW_MS_ENV, &later)],
    );
    // Journaled before the crash, projected by the next read.
    assert_eq!(
        s.approvals_json(&["show", &proposal])["proposals"][0]["state"],
        "expired"
    );
    let done = s.get(&task).expect("poll");
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["isError"], true, "{done}");
    assert!(text_of(&done["result"]).contains("expired"), "{done}");
    // The identical call asks afresh; nothing ran.
    assert_ne!(proposal_of(&s.call(false, "prod-eu")), proposal);
    assert!(s.marker().is_empty());
}

/// `taskgate check` on a stopped daemon's configuration and state.
fn check_stopped(root: &Path, state: &Path) -> std::process::Output {
    let cfg = config(root);
    taskgate(
        &[
            "check",
            "--config",
            cfg.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
        ],
        &[],
    )
}
