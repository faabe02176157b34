//! Durable routes to Tasks-capable upstreams, against the real daemon and a
//! real upstream process (tests/interop/upstream_tasks.py, in the mode each
//! case needs): a submission is routed once and found again by its key and
//! its public ID; every refusal names its rule and sends nothing; an
//! answer that was lost, or one taskgate cannot trust, leaves the route in
//! reconciliation and nothing is sent again; a new upstream session (the
//! upstream restarted, or taskgate did) is never asked about an old task;
//! a cancel is retried once; a poll past the deadline cancels.
//! Each case counts what reached the upstream from its own message log.
//!
//! Invariant 18 of the map: A durable submission is never sent twice
//! automatically: once a route may have reached its upstream, a lost, late or
//! untrusted answer, a crash or a restart leaves it `reconciliation_required`,
//! and resubmitting its key returns the same route and sends nothing. Guarded
//! by:
//! `tests/durable_routes.rs::a_lost_answer_leaves_the_route_in_reconciliation_and_nothing_is_sent_again`,
//! `tests/durable_routes.rs::a_crash_at_each_dispatch_step_is_recovered_without_a_second_send`
//! (a crash after the prepared commit, after the dispatching commit and after
//! the upstream's answer, each recovered by the same key with no second call
//! reaching the upstream),
//! `tests/route_store.rs::recovery_ends_what_was_not_sent_and_reconciles_what_may_have_been`
//!
//! Invariant 20 of the map: An upstream task is only ever asked about on the
//! session it was created on: after a reconnect of the upstream or a restart of
//! taskgate, its route needs reconciliation and the new session never hears its
//! ID. Guarded by:
//! `tests/durable_routes.rs::a_new_upstream_session_is_never_asked_about_an_old_task`
//! (the upstream's own log of `tasks/get` requests, unchanged after a provider
//! restart and after a taskgate restart)
//!
//! Invariant 21 of the map: An answer taskgate cannot trust is never success: a
//! missing echo of the execution envelope, or one that differs in the public
//! ID, the request digest or the binding, or a poll answered for another task
//! ID, leaves the route in reconciliation, never completed; a route gets at
//! most two cancels, counted before they are sent. Guarded by:
//! `tests/durable_routes.rs::an_echo_that_does_not_match_is_never_taken_for_success`,
//! `tests/durable_routes.rs::a_poll_answer_for_another_task_or_with_a_wrong_or_missing_echo_never_ends_a_route`
//! (mutation: drop the task-ID check in `route::answer_problem` → the route
//! completes with the other task's result),
//! `tests/durable_routes.rs::overlapping_polls_send_one_cancel_at_a_time_and_two_in_all`
//! (mutation: drop `cancel_slot` → a second cancel while the first is in
//! flight; the previous code, counting after sending, sent six),
//! `route::tests::an_echo_must_match_in_every_identity`
//!
//! What this file proves: durable routes against the real daemon and a real
//! Tasks-capable upstream (tests/interop/upstream_tasks.py in the mode each
//! case needs, Landlock-confined), counting what reached it from its own
//! message log: routed once and found again by idempotency key and public ID
//! (one effect, the envelope echoed), a changed input under the same key
//! refused, `tasks/update` refused; every refusal named by its rule with
//! nothing sent (schema, lease, capability, provider interface, effect, bounds,
//! input digest, arguments, Tasks not negotiated; 64 KiB of input and of output
//! at and one byte past the bound); a lost answer (the upstream created the
//! task and died) and an echo that does not match reconcile and are never sent
//! again; a new upstream session, and a restart of taskgate, never asked about
//! an old task; a lease expired across a restart stays expired; a cancel
//! committed then retried once; a poll past the deadline cancels; a crash at
//! each dispatch step (prepared, dispatching, answered) recovered without a
//! second send, and one after a cancel attempt was counted leaving it counted
//! with nothing sent; taskgate routed to another taskgate over stdio (echoing
//! on every answer); liars: a poll answered for another task, with a changed or
//! missing echo (and the weaker `creation_only` rule), overlapping polls during
//! a cancel that never answers, a poll error followed by the verified result;
//! the binding returned on submit and the provider's task ID never shown

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::route::*;
use common::upstream::*;
use common::*;
use serde_json::{Value, json};

const SETTLE: Duration = Duration::from_secs(60);
const TASKS_SERVER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/interop/upstream_tasks.py"
);

/// One upstream_tasks.py behind a wrapper that records its pid and gives
/// it its logs.
struct Upstream {
    alias: String,
    effects: PathBuf,
    messages: PathBuf,
    out: PathBuf,
}

impl Upstream {
    fn table(
        place: &Place,
        alias: &str,
        mode: &str,
        env: &[(&str, &str)],
        extra: &str,
    ) -> (Upstream, String) {
        let effects = place.out.join(format!("{alias}.effects"));
        let messages = place.out.join(format!("{alias}.messages"));
        let mut script = String::from("#!/bin/sh\n");
        script += &format!("echo $$ > {}/{alias}.pid\n", place.out.display());
        script += &format!("export UPSTREAM_TASKS_EFFECT_LOG='{}'\n", effects.display());
        script += &format!(
            "export UPSTREAM_TASKS_MESSAGE_LOG='{}'\n",
            messages.display()
        );
        for (k, v) in env {
            script += &format!("export {k}='{v}'\n");
        }
        script += &format!("exec /usr/bin/python3 {TASKS_SERVER} {mode} stdio\n");
        let wrapper = place.bin.join(format!("{alias}.sh"));
        std::fs::write(&wrapper, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
        let table = format!(
            "[[upstream]]\nalias = \"{alias}\"\ncommand = [\"/bin/sh\", \"{}\"]\nread_paths = [\"{}\", \"{INTEROP}\"]\nwrite_paths = [\"{}\"]\neffect = \"idempotent_write\"\n{extra}\n",
            wrapper.display(),
            place.bin.display(),
            place.out.display()
        );
        (
            Upstream {
                alias: alias.into(),
                effects,
                messages,
                out: place.out.clone(),
            },
            table,
        )
    }

    /// Effect lines (tool runs) recorded so far.
    fn effects(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.effects)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with('{'))
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// Messages of `method` the upstream received so far.
    fn received(&self, method: &str) -> Vec<Value> {
        std::fs::read_to_string(&self.messages)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|m| m["method"] == method)
            .collect()
    }

    fn pid(&self) -> i32 {
        std::fs::read_to_string(self.out.join(format!("{}.pid", self.alias)))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }
}

#[test]
fn a_submission_is_routed_once_and_found_again_by_its_key_and_its_id() {
    prereq::require_tool("python3");
    let root = private_dir();
    let place = Place::new(root.path());
    let (up, table) = Upstream::table(
        &place,
        "up",
        "echo",
        &[("UPSTREAM_TASKS_WORK_MS", "300")],
        "",
    );
    let s = Setup::start(root, &table, &["up"], SETTLE);

    let described = s.describe();
    let cap = &described["capabilities"][0];
    assert_eq!(cap["name"], "up.work", "{described}");
    assert_eq!(cap["effect"], "idempotent_write");
    assert_eq!(cap["taskCeiling"], "non_idempotent_write");
    assert!(cap["schemaDigest"].as_str().unwrap().starts_with("sha256:"));

    let args = json!({"value": "hello"});
    let sub = s.submission("up.work", "key-1", &args, Duration::from_secs(600));
    let handle = s.submit(&sub, &args).unwrap();
    let id = task_id(&handle);
    assert!(id.starts_with("tgr-"), "{handle}");
    let done = s.wait(&id);
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(text(&done["result"]), "done hello", "{done}");
    let meta = &done["result"]["_meta"]["dev.taskgate/route"];
    assert_eq!(meta["providerCompleted"], true, "{done}");
    assert_eq!(meta["verified"], false);
    assert!(meta["policyAccepted"].is_null());

    // One effect, carrying the envelope with the public ID.
    let effects = up.effects();
    assert_eq!(effects.len(), 1, "{effects:?}");
    assert_eq!(effects[0]["envelope"]["publicTaskId"], id.as_str());

    // The same key and submission: the same task, nothing sent again.
    let again = s.submit(&sub, &args).unwrap();
    assert_eq!(task_id(&again), id);
    assert_eq!(up.effects().len(), 1);
    assert_eq!(up.received("tools/call").len(), 1);

    // The same key with other input: a conflict, nothing sent.
    let other = json!({"value": "other"});
    let mut changed = sub.clone();
    changed["inputDigest"] = json!(canonical_digest(&other));
    let (name, _) = error_of(s.submit(&changed, &other));
    assert_eq!(name, "TG_TASK_IDEMPOTENCY_CONFLICT");
    assert_eq!(up.received("tools/call").len(), 1);

    // tasks/update is refused for a route; an unknown route ID is unknown.
    let (name, _) = error_of(runtime().block_on(s.client().request(
        "tasks/update",
        json!({"taskId": id, "inputResponses": {}}),
        Some(&id),
        None,
    )));
    assert_eq!(name, "TG_TASK_UPDATE_UNSUPPORTED_DURABLE");
    let unknown = format!("tgr-{}", "0".repeat(32));
    assert_eq!(error_of(s.get(&unknown)).0, "TG_TASK_NOT_FOUND");

    // Found again by its key after its lease expired and its deadline
    // passed: recovery lasts as long as the route is retained.
    let described = s.describe();
    let short = s
        .lease(
            "up.work",
            &["idempotent_write", "non_idempotent_write"],
            Some(1000),
        )
        .unwrap();
    let quick_args = json!({"value": "quick"});
    let quick = submission_for(
        &short,
        &described["capabilities"][0],
        "key-short",
        &quick_args,
        Duration::from_millis(1500),
    );
    let quick_id = task_id(&s.submit(&quick, &quick_args).unwrap());
    std::thread::sleep(Duration::from_millis(2000));
    assert_eq!(task_id(&s.submit(&quick, &quick_args).unwrap()), quick_id);
    assert_eq!(up.received("tools/call").len(), 2);

    // The operator sees the route, and never its arguments.
    let out = s.admin(&["routes", "show", &id]);
    assert!(out.status.success(), "{out:?}");
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("terminal") && shown.contains("up.work"),
        "{shown}"
    );
    assert!(!shown.contains("hello"), "arguments leaked: {shown}");
    // Nor does the store keep them: every column of the routes but the
    // provider's own result (which says "done hello") is free of them.
    let db = rusqlite::Connection::open_with_flags(
        s.state.join("tasks.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let leaked: i64 = db
        .query_row(
            "SELECT count(*) FROM routes WHERE instr(CAST(binding AS TEXT), 'hello') > 0
                OR instr(coalesce(reason, ''), 'hello') > 0 OR instr(coalesce(cancel_reason, ''), 'hello') > 0",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(leaked, 0, "a route's binding or reason holds an argument");
    let bindings: i64 = db
        .query_row("SELECT count(*) FROM routes", [], |r| r.get(0))
        .unwrap();
    assert!(bindings >= 2);
}

#[test]
fn every_refusal_names_its_rule_and_sends_nothing() {
    prereq::require_tool("python3");
    let root = private_dir();
    let place = Place::new(root.path());
    let (up, table) = Upstream::table(&place, "up", "echo", &[], "");
    let (_, unpinned) = Upstream::table(&place, "raw", "echo", &[], "");
    let s = Setup::start(root, &format!("{table}{unpinned}"), &["up"], SETTLE);
    wait_upstream(&s.state, "raw", SETTLE, is_ready);
    let args = json!({"value": "x"});
    let good = s.submission("up.work", "k", &args, Duration::from_secs(600));
    let check = |sub: &Value, args: &Value| -> String {
        let (name, error) = error_of(s.submit(sub, args));
        format!("{name}/{}", error["data"]["check"].as_str().unwrap_or(""))
    };
    let with = |key: &str, value: Value| {
        let mut v = good.clone();
        v[key] = value;
        v
    };
    assert_eq!(
        check(&with("schema", json!("taskgate.task-submission/2")), &args),
        "TG_ROUTE_REFUSED/schema"
    );
    assert_eq!(
        check(&with("leaseId", json!("tgl-unknown")), &args),
        "TG_ROUTE_REFUSED/lease"
    );
    assert_eq!(
        check(&with("capability", json!("raw.work")), &args),
        "TG_ROUTE_REFUSED/capability"
    );
    assert_eq!(
        check(&with("providerInterfaceVersion", json!("sha256:00")), &args),
        "TG_ROUTE_REFUSED/provider_interface"
    );
    assert_eq!(
        check(&with("permittedEffect", json!("idempotent_write")), &args),
        "TG_ROUTE_REFUSED/effect"
    );
    assert_eq!(
        check(&with("attempt", json!(2)), &args),
        "TG_ROUTE_REFUSED/bounds"
    );
    assert_eq!(
        check(&with("cleanupRequired", json!(false)), &args),
        "TG_ROUTE_REFUSED/bounds"
    );
    assert_eq!(
        check(&with("inputDigest", json!("0".repeat(64))), &args),
        "TG_ROUTE_REFUSED/input_digest"
    );
    assert_eq!(
        check(&good, &json!({"value": 7})),
        "TG_ROUTE_REFUSED/input_digest"
    );
    let wrong_type = json!({"value": 7});
    assert_eq!(
        check(
            &with("inputDigest", json!(canonical_digest(&wrong_type))),
            &wrong_type
        ),
        "TG_INVALID_ARGUMENTS/arguments"
    );
    // 64 KiB of canonical input passes the bound; one byte more does not.
    let big = |n: usize| json!({"value": "x".repeat(n)});
    let over = big(64 * 1024 - 11);
    assert_eq!(serde_jcs::to_vec(&over).unwrap().len(), 64 * 1024 + 1);
    assert_eq!(
        check(&with("inputDigest", json!(canonical_digest(&over))), &over),
        "TG_ROUTE_REFUSED/bounds"
    );
    // A lease without the conservative effect is refused as it is asked for.
    let (name, error) = error_of(s.lease("up.work", &["idempotent_write"], None));
    assert_eq!(
        (name.as_str(), &error["data"]["check"]),
        ("TG_ROUTE_REFUSED", &json!("effect"))
    );
    let (name, _) = error_of(s.lease(
        "raw.work",
        &["idempotent_write", "non_idempotent_write"],
        None,
    ));
    assert_eq!(name, "TG_ROUTE_REFUSED");
    // A submission without Tasks negotiated is refused.
    let plain = s.daemon().client(false);
    let r = runtime().block_on(plain.call_tool(
        "taskgate_submit",
        json!({"submission": good, "arguments": args}),
        None,
    ));
    assert_eq!(error_of(r).0, "TG_TASKS_REQUIRED");
    assert!(up.received("tools/call").is_empty(), "something was sent");
    // An input of exactly 64 KiB is sent; its output ("done " and the
    // input) is over 64 KiB: the provider completed, the output is not
    // accepted.
    let at = big(64 * 1024 - 12);
    assert_eq!(serde_jcs::to_vec(&at).unwrap().len(), 64 * 1024);
    let sub = s.submission("up.work", "big-in", &at, Duration::from_secs(600));
    let id = task_id(&s.submit(&sub, &at).unwrap());
    let t = s.wait(&id);
    assert_eq!(failed_name(&t), "TG_UPSTREAM_RESPONSE_TOO_LARGE", "{t}");
    assert_eq!(t["error"]["data"]["providerCompleted"], true, "{t}");
    assert_eq!(t["error"]["data"]["accepted"], false, "{t}");
    assert_eq!(up.effects().len(), 1);
    // An output of exactly 64 KiB is accepted, one byte more is not.
    let around = serde_json::to_vec(
        &json!({"content": [{"type": "text", "text": "done "}], "isError": false}),
    )
    .unwrap()
    .len();
    for (key, extra, accepted) in [("out-at", 0, true), ("out-over", 1, false)] {
        let v = json!({"value": "y".repeat(64 * 1024 - around + extra)});
        let sub = s.submission("up.work", key, &v, Duration::from_secs(600));
        let id = task_id(&s.submit(&sub, &v).unwrap());
        let t = s.wait(&id);
        assert_eq!(
            t["status"] == "completed",
            accepted,
            "{key}: {}",
            t["status"]
        );
    }
}

#[test]
fn a_lost_answer_leaves_the_route_in_reconciliation_and_nothing_is_sent_again() {
    prereq::require_tool("python3");
    let root = private_dir();
    let place = Place::new(root.path());
    let (up, table) = Upstream::table(&place, "up", "lost", &[], "");
    let s = Setup::start(root, &table, &["up"], SETTLE);
    let args = json!({"value": "once"});
    let sub = s.submission("up.work", "lost-1", &args, Duration::from_secs(600));
    let handle = s.submit(&sub, &args).unwrap();
    let id = task_id(&handle);
    let t = s.get(&id).unwrap();
    assert_eq!(t["status"], "failed", "{t}");
    assert_eq!(failed_name(&t), "TG_TASK_RECONCILIATION_REQUIRED", "{t}");
    assert_eq!(up.effects().len(), 1, "exactly one upstream effect");
    // The supervisor connects again; the same submission gets the same
    // task and is not sent again.
    wait_upstream(&s.state, "up", SETTLE, is_ready);
    let again = s.submit(&sub, &args).unwrap();
    assert_eq!(task_id(&again), id);
    assert_eq!(s.get(&id).unwrap()["status"], "failed");
    assert_eq!(up.received("tools/call").len(), 1, "sent again");
    let out = s.admin(&["routes", "show", &id]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("reconciliation_required"), "{shown}");
}

#[test]
fn an_echo_that_does_not_match_is_never_taken_for_success() {
    prereq::require_tool("python3");
    let root = private_dir();
    let place = Place::new(root.path());
    let (wrong, t1) = Upstream::table(&place, "wrong", "wrongid", &[], "");
    let (none, t2) = Upstream::table(&place, "none", "noecho", &[], "");
    let (sync, t3) = Upstream::table(&place, "sync", "sync", &[], "");
    let s = Setup::start(
        root,
        &format!("{t1}{t2}{t3}"),
        &["wrong", "none", "sync"],
        SETTLE,
    );
    for (up, cap) in [(&wrong, "wrong.work"), (&none, "none.work")] {
        let args = json!({"value": "v"});
        let sub = s.submission(cap, cap, &args, Duration::from_secs(600));
        let id = task_id(&s.submit(&sub, &args).unwrap());
        let t = s.get(&id).unwrap();
        assert_eq!(
            failed_name(&t),
            "TG_TASK_RECONCILIATION_REQUIRED",
            "{cap}: {t}"
        );
        assert_eq!(up.received("tools/call").len(), 1);
        assert!(up.received("tasks/get").is_empty(), "{cap} was polled");
    }
    // A synchronous answer with the right echo completes at once.
    let args = json!({"value": "now"});
    let sub = s.submission("sync.work", "sync", &args, Duration::from_secs(600));
    let handle = s.submit(&sub, &args).unwrap();
    let t = s.get(&task_id(&handle)).unwrap();
    assert_eq!(t["status"], "completed", "{t}");
    assert_eq!(sync.effects().len(), 1);
}

#[test]
fn a_new_upstream_session_is_never_asked_about_an_old_task() {
    prereq::require_tool("python3");
    let root = private_dir();
    let place = Place::new(root.path());
    let (up, table) = Upstream::table(&place, "up", "forever", &[], "");
    let mut s = Setup::start(root, &table, &["up"], SETTLE);
    let args = json!({"value": "long"});
    let sub = s.submission("up.work", "drift", &args, Duration::from_secs(600));
    let id = task_id(&s.submit(&sub, &args).unwrap());
    let t = s.get(&id).unwrap();
    assert_eq!(t["status"], "working", "{t}");
    let before = wait_upstream(&s.state, "up", SETTLE, is_ready);
    // The provider restarts: a new session.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(up.pid()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_upstream(&s.state, "up", SETTLE, |u| {
        is_ready(u) && u["session"] != before["session"]
    });
    let gets_before = up.received("tasks/get").len();
    std::thread::sleep(Duration::from_millis(
        t["pollIntervalMs"].as_u64().unwrap_or(1000),
    ));
    let t = s.get(&id).unwrap();
    assert_eq!(failed_name(&t), "TG_TASK_RECONCILIATION_REQUIRED", "{t}");
    assert_eq!(
        up.received("tasks/get").len(),
        gets_before,
        "the new session was asked about the old task"
    );

    // The same after a taskgate restart: a route that was routed is never
    // polled on the new session.
    let sub = s.submission("up.work", "restart", &args, Duration::from_secs(600));
    let id = task_id(&s.submit(&sub, &args).unwrap());
    assert_eq!(s.get(&id).unwrap()["status"], "working");
    // A lease that expires across the restart stays expired.
    let lease = s
        .lease(
            "up.work",
            &["idempotent_write", "non_idempotent_write"],
            Some(1500),
        )
        .unwrap();
    s.restart();
    wait_upstream(&s.state, "up", SETTLE, is_ready);
    let gets_before = up.received("tasks/get").len();
    let t = s.get(&id).unwrap();
    assert_eq!(failed_name(&t), "TG_TASK_RECONCILIATION_REQUIRED", "{t}");
    assert_eq!(up.received("tasks/get").len(), gets_before);
    while now_ms() <= lease["expiresAtUnixMs"].as_i64().unwrap() {
        std::thread::sleep(Duration::from_millis(100));
    }
    let described = s.describe();
    let mut late = submission_for(
        &lease,
        &described["capabilities"][0],
        "late",
        &args,
        Duration::from_secs(600),
    );
    late["leaseId"] = lease["leaseId"].clone();
    let (name, error) = error_of(s.submit(&late, &args));
    assert_eq!(
        (name.as_str(), &error["data"]["check"]),
        ("TG_ROUTE_REFUSED", &json!("lease"))
    );
}

#[test]
fn a_cancel_is_committed_first_and_retried_once_and_a_late_poll_cancels() {
    prereq::require_tool("python3");
    let root = private_dir();
    let place = Place::new(root.path());
    let (hang, t1) = Upstream::table(
        &place,
        "hang",
        "hangcancel",
        &[("UPSTREAM_TASKS_WORK_MS", "600000")],
        "request_timeout_secs = 2",
    );
    let (late, t2) = Upstream::table(&place, "late", "forever", &[], "");
    let s = Setup::start(root, &format!("{t1}{t2}"), &["hang", "late"], SETTLE);
    let args = json!({"value": "c"});
    let sub = s.submission("hang.work", "cancel", &args, Duration::from_secs(600));
    let id = task_id(&s.submit(&sub, &args).unwrap());
    s.cancel(&id).unwrap();
    assert_eq!(hang.received("tasks/cancel").len(), 1);
    let out = s.admin(&["routes", "show", &id]);
    let shown = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        shown.contains("cancel_requested") && shown.contains("1 forwarded, not acknowledged"),
        "{shown}"
    );
    // The next poll retries once; unacknowledged again, the route stays
    // cancel_requested and reads as needing reconciliation; later polls
    // send no more cancels, but still ask for the task's outcome on the
    // session it went out on.
    let t = s.get(&id).unwrap();
    assert_eq!(hang.received("tasks/cancel").len(), 2);
    assert_unconfirmed_cancel(&t);
    let gets = hang.received("tasks/get").len();
    for _ in 0..2 {
        std::thread::sleep(Duration::from_millis(
            t["pollIntervalMs"].as_u64().unwrap_or(1000),
        ));
        assert_unconfirmed_cancel(&s.get(&id).unwrap());
    }
    assert_eq!(hang.received("tasks/cancel").len(), 2);
    assert!(
        hang.received("tasks/get").len() > gets,
        "a route whose cancel is unconfirmed was not asked about any more"
    );
    let out = s.admin(&["routes", "show", &id]);
    let shown = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        shown.contains("cancel_requested")
            && shown.contains("working (reconciliation required)")
            && shown.contains("2 forwarded, not acknowledged"),
        "{shown}"
    );

    // A poll past the deadline sends the deadline's cancel.
    let sub = s.submission("late.work", "deadline", &args, Duration::from_secs(2));
    let id = task_id(&s.submit(&sub, &args).unwrap());
    assert_eq!(s.get(&id).unwrap()["status"], "working");
    std::thread::sleep(Duration::from_millis(2500));
    let t = s.wait(&id);
    assert_eq!(t["status"], "cancelled", "{t}");
    assert_eq!(late.received("tasks/cancel").len(), 1);
}

#[test]
fn routes_through_taskgate_to_another_taskgate() {
    // The upstream is taskgate itself over stdio, with a command tool that
    // runs only as a task: it echoes the envelope as a provider must.
    let root = private_dir();
    let inner_state = root.path().join("inner-state");
    std::fs::create_dir_all(&inner_state).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&inner_state, std::fs::Permissions::from_mode(0o700)).unwrap();
    let inner_cfg = root.path().join("inner.toml");
    std::fs::write(
        &inner_cfg,
        config_text(
            "",
            &[Tool::new("shout")
                .script("printf LOUD")
                .effect("idempotent_write")
                .task("required")],
        ),
    )
    .unwrap();
    let bin = env!("CARGO_BIN_EXE_taskgate");
    let table = format!(
        "[[upstream]]\nalias = \"inner\"\ncommand = [\"{bin}\", \"serve\", \"--stdio\", \"--config\", \"{}\", \"--state-dir\", \"{}\"]\nsandbox = \"unconfined\"\neffect = \"idempotent_write\"\n",
        inner_cfg.display(),
        inner_state.display()
    );
    let s = Setup::start(root, &table, &["inner"], SETTLE);
    let args = json!({});
    let sub = s.submission("inner.shout", "nested", &args, Duration::from_secs(600));
    let id = task_id(&s.submit(&sub, &args).unwrap());
    let t = s.wait(&id);
    assert_eq!(t["status"], "completed", "{t}");
    assert_eq!(text(&t["result"]), "LOUD");
    let _ = Path::new("");
}

#[test]
fn a_crash_at_each_dispatch_step_is_recovered_without_a_second_send() {
    prereq::require_tool("python3");
    let root = private_dir();
    let place = Place::new(root.path());
    let (up, table) = Upstream::table(&place, "up", "forever", &[], "");
    let mut s = Setup::start(root, &table, &["up"], SETTLE);
    let args = json!({"value": "crash"});
    // (crash point, what the caller reads after the restart, effects the
    // upstream recorded from that submission)
    let cases = [
        (
            taskgate::testhooks::CRASH_ROUTE_PREPARED,
            "TG_ROUTE_NOT_DISPATCHED",
            0,
        ),
        (
            taskgate::testhooks::CRASH_ROUTE_DISPATCHING,
            "TG_TASK_RECONCILIATION_REQUIRED",
            0,
        ),
        (
            taskgate::testhooks::CRASH_ROUTE_ANSWERED,
            "TG_TASK_RECONCILIATION_REQUIRED",
            1,
        ),
    ];
    for (at, reads, effects) in cases {
        let sub = s.submission("up.work", at, &args, Duration::from_secs(600));
        let calls_before = up.received("tools/call").len();
        let effects_before = up.effects().len();
        s.restart_crashing_at(at);
        wait_upstream(&s.state, "up", SETTLE, is_ready);
        // The answer is lost with the process.
        let lost = s.submit(&sub, &args);
        assert!(lost.is_err(), "{at}: answered {lost:?}");
        s.recover_from_crash();
        wait_upstream(&s.state, "up", SETTLE, is_ready);
        // The caller recovers by the same key: the same route, never sent
        // again.
        let handle = s.submit(&sub, &args).unwrap();
        let t = s.get(&task_id(&handle)).unwrap();
        assert_eq!(failed_name(&t), reads, "{at}: {t}");
        assert_eq!(up.effects().len() - effects_before, effects, "{at}");
        assert_eq!(
            up.received("tools/call").len() - calls_before,
            effects,
            "{at}"
        );
    }
    // Killed once routed: the route keeps its upstream ID and is never asked
    // about on the new session.
    let sub = s.submission("up.work", "killed", &args, Duration::from_secs(600));
    let id = task_id(&s.submit(&sub, &args).unwrap());
    assert_eq!(s.get(&id).unwrap()["status"], "working");
    s.daemon.take().unwrap().kill();
    s.daemon = Some(Daemon::start(&s.cfg, &s.state, &s.log));
    wait_upstream(&s.state, "up", SETTLE, is_ready);
    let gets = up.received("tasks/get").len();
    let t = s.get(&id).unwrap();
    assert_eq!(failed_name(&t), "TG_TASK_RECONCILIATION_REQUIRED", "{t}");
    assert_eq!(up.received("tasks/get").len(), gets);
    let out = s.admin(&["routes", "list"]);
    let listed = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        listed.contains(&id) && listed.contains("reconciliation"),
        "{listed}"
    );
    let status = admin_status(&s.state);
    assert_eq!(status["routes"]["reconciliation_required"], 3, "{status}");

    // Killed once a cancel attempt was counted, before it was sent: the
    // attempt stays counted, and nothing reached the upstream.
    s.restart_crashing_at(taskgate::testhooks::CRASH_ROUTE_CANCEL_COUNTED);
    wait_upstream(&s.state, "up", SETTLE, is_ready);
    let sub = s.submission("up.work", "cancel-crash", &args, Duration::from_secs(600));
    let id = task_id(&s.submit(&sub, &args).unwrap());
    let cancels = up.received("tasks/cancel").len();
    assert!(
        s.cancel(&id).is_err(),
        "the daemon answered past its crash point"
    );
    s.recover_from_crash();
    let out = s.admin(&["routes", "show", &id]);
    let shown = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        shown.contains("cancel_requested") && shown.contains("1 forwarded, not acknowledged"),
        "{shown}"
    );
    assert_eq!(
        up.received("tasks/cancel").len(),
        cancels,
        "a cancel was sent"
    );
}

#[test]
fn another_callers_route_reads_like_an_unknown_one_and_the_effect_scopes_are_enforced() {
    prereq::require_tool("python3");
    let root = private_dir();
    let place = Place::new(root.path());
    let (up, table) = Upstream::table(&place, "up", "forever", &[], "");
    let all = [
        "tools:call",
        "tasks:read",
        "tasks:cancel",
        "taskgate:effect:idempotent-write",
        "taskgate:effect:non-idempotent-write",
    ];
    let (alice, a) = token_entry("alice", 'a', "acme", &all);
    let (bob, b) = token_entry("bob", 'b', "other", &all);
    let (carol, c) = token_entry("carol", 'c', "acme", &all[..4]);
    let tokens = root.path().join("tokens.toml");
    std::fs::write(&tokens, format!("{a}{b}{c}")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600)).unwrap();
    let auth = format!(
        "[auth]\ntokens_file = \"{}\"\nlocal_owner = \"never\"\n",
        tokens.display()
    );
    let s = Setup::start(root, &format!("{auth}{table}"), &["up"], SETTLE);
    let args = json!({"value": "mine"});

    s.acting_as(Some(&alice));
    let sub = s.submission("up.work", "shared-key", &args, Duration::from_secs(600));
    let alices = task_id(&s.submit(&sub, &args).unwrap());

    // Bob: Alice's route and an unknown one answer alike, to reads and
    // cancels; her lease is not his; the same key is his own.
    s.acting_as(Some(&bob));
    let unknown = format!("tgr-{}", "0".repeat(32));
    let (hers, hers_error) = error_of(s.get(&alices));
    let (none, none_error) = error_of(s.get(&unknown));
    assert_eq!(
        (hers.as_str(), none.as_str()),
        ("TG_TASK_NOT_FOUND", "TG_TASK_NOT_FOUND")
    );
    // The whole error, byte for byte.
    assert_eq!(hers_error, none_error);
    assert_eq!(error_of(s.cancel(&alices)).0, "TG_TASK_NOT_FOUND");
    assert!(up.received("tasks/cancel").is_empty());
    let (name, error) = error_of(s.submit(&sub, &args));
    assert_eq!(
        (name.as_str(), &error["data"]["check"]),
        ("TG_ROUTE_REFUSED", &json!("lease"))
    );
    let his_sub = s.submission("up.work", "shared-key", &args, Duration::from_secs(600));
    let his = task_id(&s.submit(&his_sub, &args).unwrap());
    assert_ne!(his, alices);

    // Carol may write idempotently only: a durable submission is a
    // non-idempotent write whatever the capability's effect.
    s.acting_as(Some(&carol));
    let carols = s.submission("up.work", "carol", &args, Duration::from_secs(600));
    let (name, error) = error_of(s.submit(&carols, &args));
    assert_eq!(name, "TG_FORBIDDEN", "{error}");
    assert_eq!(
        error["data"]["missingScopes"],
        json!(["taskgate:effect:non-idempotent-write"])
    );
    assert_eq!(
        up.received("tools/call").len(),
        2,
        "Carol's submission was sent"
    );

    // Alice still reads hers.
    s.acting_as(Some(&alice));
    assert_eq!(s.get(&alices).unwrap()["status"], "working");
}

#[test]
fn the_meta_tools_are_listed_only_while_a_capability_is_routable() {
    prereq::require_tool("python3");
    let root = private_dir();
    let place = Place::new(root.path());
    let (_up, table) = Upstream::table(&place, "up", "echo", &[], "");
    let s = Setup::start(root, &table, &[], SETTLE);
    wait_upstream(&s.state, "up", SETTLE, is_ready);
    let meta = ["taskgate_describe", "taskgate_lease", "taskgate_submit"];
    // Connected, Tasks-capable, but nothing pinned: nothing to route.
    let names = s.tool_names();
    assert!(names.contains(&"up.work".to_string()), "{names:?}");
    assert!(
        meta.iter().all(|m| !names.contains(&m.to_string())),
        "{names:?}"
    );
    let described = s.describe();
    assert_eq!(described["capabilities"], json!([]), "{described}");
    // Pinned and reloaded: the meta-tools appear.
    assert!(s.admin(&["upstream", "pin", "up"]).status.success());
    assert!(s.admin(&["reload"]).status.success());
    wait_upstream(&s.state, "up", SETTLE, |u| {
        is_ready(u) && u["unpinned"] == 0
    });
    let names = s.tool_names();
    assert!(
        meta.iter().all(|m| names.contains(&m.to_string())),
        "{names:?}"
    );
}

/// A route whose cancel went unacknowledged: still `working` for the caller
/// (a verified answer can still end it), said to need reconciliation.
fn assert_unconfirmed_cancel(t: &Value) {
    assert_eq!(t["status"], "working", "{t}");
    let message = t["statusMessage"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("cancel_requested") && message.contains("reconciliation required"),
        "{t}"
    );
}

/// The route reads as needing reconciliation and has no result.
fn assert_reconciling(t: &Value, why: &str) {
    assert_eq!(t["status"], "working", "{why}: {t}");
    assert!(t.get("result").is_none(), "{why}: {t}");
    let message = t["statusMessage"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("reconciliation required") && message.contains(why),
        "{why}: {t}"
    );
}

#[test]
fn a_poll_answer_for_another_task_or_with_a_wrong_or_missing_echo_never_ends_a_route() {
    prereq::require_tool("python3");
    let root = private_dir();
    let place = Place::new(root.path());
    // Each liar echoes correctly at creation, so each route is routed;
    // then its tasks/get answers lie in one way each.
    let (other, t1) = Upstream::table(&place, "other", "othertask", &[], "");
    let (wrong, t2) = Upstream::table(&place, "wrong", "getwrongecho", &[], "");
    let (bare, t3) = Upstream::table(&place, "bare", "getnoecho", &[], "");
    // The weaker rule still never takes another task's answer ...
    let (weakother, t4) = Upstream::table(
        &place,
        "weakother",
        "othertask",
        &[],
        "route_echo = \"creation_only\"",
    );
    // ... and takes a poll without an echo only where it is configured.
    let (weak, t5) = Upstream::table(
        &place,
        "weak",
        "getnoecho",
        &[],
        "route_echo = \"creation_only\"",
    );
    let s = Setup::start(
        root,
        &format!("{t1}{t2}{t3}{t4}{t5}"),
        &["other", "wrong", "bare", "weakother", "weak"],
        SETTLE,
    );
    for (up, why) in [
        (&other, "about another task"),
        (&wrong, "echo carries another submission binding"),
        (&bare, "did not echo the execution envelope"),
        (&weakother, "about another task"),
    ] {
        let cap = format!("{}.work", up.alias);
        let args = json!({"value": "mine"});
        let sub = s.submission(&cap, &cap, &args, Duration::from_secs(600));
        let id = task_id(&s.submit(&sub, &args).unwrap());
        // Past the provider's work time, every poll still meets the lie.
        std::thread::sleep(Duration::from_millis(400));
        let t = s.get(&id).unwrap();
        assert_reconciling(&t, why);
        std::thread::sleep(Duration::from_millis(
            t["pollIntervalMs"].as_u64().unwrap_or(1000),
        ));
        let t = s.get(&id).unwrap();
        assert_reconciling(&t, why);
        assert!(!t.to_string().contains("another task's answer"), "{t}");
        // Neither the provider's task ID nor the one it answered for
        // reaches the caller; the operator reads both.
        let bound = up.effects()[0]["task"].as_str().unwrap().to_string();
        for provider_id in [bound.as_str(), "up-ffffffffffffffffffffffffffffffff"] {
            assert!(!t.to_string().contains(provider_id), "{t}");
        }
        assert_eq!(up.received("tools/call").len(), 1, "{cap} sent again");
        assert!(up.received("tasks/get").len() >= 2, "{cap} was not polled");
        let out = s.admin(&["routes", "show", &id]);
        let shown = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            shown.contains("reconciliation_required")
                && shown.contains("working (reconciliation required)")
                && shown.contains(why),
            "{shown}"
        );
    }
    let args = json!({"value": "weak"});
    let sub = s.submission("weak.work", "weak", &args, Duration::from_secs(600));
    let id = task_id(&s.submit(&sub, &args).unwrap());
    let t = s.wait(&id);
    assert_eq!(t["status"], "completed", "{t}");
    assert_eq!(text(&t["result"]), "done weak");
    assert_eq!(weak.received("tools/call").len(), 1);
    // The weaker rule is shown wherever the operator looks.
    let out = s.admin(&["upstream", "list"]);
    let listed = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        listed.contains("weak  ") && listed.contains("route echo creation_only (weaker"),
        "{listed}"
    );
    let out = s.admin(&["routes", "show", &id]);
    let shown = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        shown.contains("echo rule            creation_only (weaker"),
        "{shown}"
    );
    let out = s.admin(&["status"]);
    let status = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        status.contains("upstream         weak:") && status.contains("route_echo = creation_only"),
        "{status}"
    );
}

#[test]
fn overlapping_polls_send_one_cancel_at_a_time_and_two_in_all() {
    prereq::require_tool("python3");
    let root = private_dir();
    let place = Place::new(root.path());
    let (hang, table) = Upstream::table(
        &place,
        "hang",
        "hangcancel",
        &[("UPSTREAM_TASKS_WORK_MS", "600000")],
        "request_timeout_secs = 8",
    );
    let s = Setup::start(root, &table, &["hang"], SETTLE);
    let args = json!({"value": "c"});
    let sub = s.submission("hang.work", "overlap", &args, Duration::from_secs(600));
    let id = task_id(&s.submit(&sub, &args).unwrap());
    let interval = s.get(&id).unwrap()["pollIntervalMs"]
        .as_u64()
        .unwrap_or(1000);
    // One caller cancels (the provider never answers it, so it waits out
    // the request bound); meanwhile five polls arrive, each on its own
    // connection and each past the poll interval, so each reaches the
    // provider.
    let clients: Vec<_> = (0..6).map(|_| s.client()).collect();
    let polls_seen = runtime().block_on(async {
        let mut clients = clients.into_iter();
        let canceller = clients.next().unwrap();
        let cancel_id = id.clone();
        let cancel = tokio::spawn(async move { canceller.cancel_task(&cancel_id).await });
        let mut polls = Vec::new();
        for (n, c) in clients.enumerate() {
            let poll_id = id.clone();
            let after = Duration::from_millis((n as u64 + 1) * (interval + 100));
            polls.push(tokio::spawn(async move {
                tokio::time::sleep(after).await;
                c.get_task(&poll_id).await
            }));
        }
        let mut seen = Vec::new();
        for p in polls {
            seen.push(p.await.unwrap().unwrap());
        }
        let _ = cancel.await.unwrap();
        seen
    });
    assert_eq!(
        hang.received("tasks/cancel").len(),
        1,
        "polls during an unanswered cancel sent more cancels"
    );
    for t in &polls_seen {
        assert_eq!(t["status"], "working", "{t}");
    }
    assert!(
        hang.received("tasks/get").len() >= 5,
        "the polls did not reach the provider, so they proved nothing"
    );
    // The cancel timed out: the next poll sends the one retry, and no
    // poll after it sends another.
    let t = s.get(&id).unwrap();
    assert_unconfirmed_cancel(&t);
    assert_eq!(hang.received("tasks/cancel").len(), 2);
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(interval + 50));
        assert_unconfirmed_cancel(&s.get(&id).unwrap());
    }
    assert_eq!(
        hang.received("tasks/cancel").len(),
        2,
        "more than two cancels"
    );
    assert_eq!(hang.received("tools/call").len(), 1);
    // The attempts were counted before they were sent.
    let out = s.admin(&["routes", "show", &id]);
    let shown = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(shown.contains("2 forwarded, not acknowledged"), "{shown}");
}

#[test]
fn a_route_whose_poll_met_an_error_still_learns_its_verified_result() {
    prereq::require_tool("python3");
    let root = private_dir();
    let place = Place::new(root.path());
    let (up, table) = Upstream::table(&place, "flaky", "flakyget", &[], "");
    let s = Setup::start(root, &table, &["flaky"], SETTLE);
    let args = json!({"value": "late"});
    let sub = s.submission("flaky.work", "flaky", &args, Duration::from_secs(600));
    let id = task_id(&s.submit(&sub, &args).unwrap());
    // The first poll meets the provider's error: the outcome is unknown.
    let t = s.get(&id).unwrap();
    assert_reconciling(&t, "answered tasks/get for its task with an error");
    let out = s.admin(&["routes", "show", &id]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("reconciliation_required"),
        "{out:?}"
    );
    // Later polls on the same session learn the verified result; nothing
    // is sent again.
    let t = s.wait(&id);
    assert_eq!(t["status"], "completed", "{t}");
    assert_eq!(text(&t["result"]), "done late");
    assert_eq!(up.received("tools/call").len(), 1);
    assert!(up.received("tasks/get").len() >= 2);
}

#[test]
fn the_caller_gets_the_binding_and_never_the_providers_task_id() {
    prereq::require_tool("python3");
    let root = private_dir();
    let place = Place::new(root.path());
    let (up, table) = Upstream::table(&place, "up", "echo", &[], "");
    let s = Setup::start(root, &table, &["up"], SETTLE);
    let args = json!({"value": "b"});
    let sub = s.submission("up.work", "binding", &args, Duration::from_secs(600));
    let handle = s.submit(&sub, &args).unwrap();
    let id = task_id(&handle);
    let route = &handle["_meta"]["dev.taskgate/route"];
    assert_eq!(route["publicTaskId"], id.as_str(), "{handle}");
    // The binding as committed: the submission, field for field.
    assert_eq!(route["binding"], sub, "{handle}");
    assert_eq!(route["bindingDigest"], canonical_digest(&sub), "{handle}");
    // The same submission again gets the same binding back.
    let again = s.submit(&sub, &args).unwrap();
    assert_eq!(again["_meta"]["dev.taskgate/route"], *route);
    let done = s.wait(&id);
    assert_eq!(done["status"], "completed", "{done}");
    let upstream_id = up.effects()[0]["task"].as_str().unwrap().to_string();
    assert!(upstream_id.starts_with("up-"));
    for answer in [&handle, &done] {
        assert!(
            !answer.to_string().contains(&upstream_id),
            "the provider's task ID reached the caller: {answer}"
        );
    }
    assert!(
        done["result"]["_meta"]["dev.taskgate/route"]
            .get("upstreamTaskId")
            .is_none()
    );
    // The operator still reads it.
    let out = s.admin(&["routes", "show", &id]);
    assert!(String::from_utf8_lossy(&out.stdout).contains(&upstream_id));
}
