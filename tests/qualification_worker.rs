//! The qualification worker as the durable route will run it: the real
//! binary as a child process, its request on stdin, judged afterwards by
//! the independent check and never by its exit status alone.
//!
//! What this file proves: the real `taskgate qualification-worker` run as a
//! child process: its artifacts pass the independent check and are removed by
//! `remove_owned`; a run with `fault: "change-identity"` exits 0 and is still
//! rejected; `fault: "escape"` and a request past 64 KiB are refused with one
//! line on stderr, their exit class, and nothing written; the ledger counts
//! every process (a second run that left nothing, a request refused unread);
//! declared artifact and runtime bounds are the worker's own refusals; each
//! `--liar` really lies

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::{Map, Value, json};
use taskgate::exit::ExitClass;
use taskgate::verify::{self, Expected, Finding, Identity};

const BIN: &str = env!("CARGO_BIN_EXE_taskgate");

fn input() -> Map<String, Value> {
    let Value::Object(m) = json!({"title": "  qualify me ", "size": 12.5, "urgent": true}) else {
        unreachable!()
    };
    m
}

fn identity(correlation_id: &str) -> Identity {
    Identity {
        correlation_id: correlation_id.into(),
        logical_task_id: "logical-7".into(),
        attempt: 3,
        input_digest: verify::input_digest(&input()),
    }
}

fn request(correlation_id: &str, output: &str, fault: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "identity": identity(correlation_id),
        "input": input(),
        "output": output,
        "fault": fault,
    }))
    .unwrap()
}

/// Runs `taskgate qualification-worker --root ROOT` with `stdin`.
fn worker(root: &Path, stdin: &[u8]) -> Output {
    run(
        Command::new(BIN)
            .args(["qualification-worker", "--root"])
            .arg(root),
        stdin,
    )
}

/// Runs the worker `command` describes, `stdin` written to it.
fn run(command: &mut Command, stdin: &[u8]) -> Output {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A worker that refuses early may close its stdin before all of it is
    // written: that is its answer, not the test's failure.
    let _ = child.stdin.take().unwrap().write_all(stdin);
    child.wait_with_output().unwrap()
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn the_real_worker_writes_artifacts_the_independent_check_accepts_and_cleanup_removes() {
    let root = tempfile::tempdir().unwrap();
    let out = worker(root.path(), &request("public-1", "run-1", "none"));
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().count(), 1, "{text:?}");
    let line: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(line["manifest"], "run-1/manifest.json");

    let expected = Expected::for_input(identity("public-1"), &input());
    let evidence = verify::check(root.path(), "run-1", &expected).unwrap();
    assert_eq!(line["resultDigest"], json!(evidence.result_digest));
    assert_eq!(
        line["bytes"],
        json!(evidence.manifest.bytes + evidence.files[0].bytes)
    );
    let removed = verify::remove_owned(root.path(), "run-1").unwrap();
    assert!(removed.dir);
    assert!(names(root.path()).is_empty());
}

#[test]
fn a_fault_run_that_exits_zero_is_still_rejected() {
    let root = tempfile::tempdir().unwrap();
    let out = worker(
        root.path(),
        &request("public-1", "run-1", "change-identity"),
    );
    assert!(out.status.success(), "{:?}", out.status);
    let expected = Expected::for_input(identity("public-1"), &input());
    assert_eq!(
        verify::check(root.path(), "run-1", &expected),
        Err(Finding::IdentityChanged {
            field: "correlationId".into()
        })
    );
}

#[test]
fn refusals_are_one_line_with_their_exit_class_and_write_nothing() {
    let base = tempfile::tempdir().unwrap();
    let root = base.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let mut oversized = request("public-1", "big", "none");
    oversized.resize(64 * 1024 + 1, b' ');
    let mut mismatched: Value = serde_json::from_slice(&request("public-1", "m", "none")).unwrap();
    mismatched["input"]["size"] = json!(13);
    for (stdin, class, says) in [
        (
            request("public-1", "run-1", "escape"),
            ExitClass::UnsafePath,
            "refused as traversal",
        ),
        (
            request("public-1", "a/b", "none"),
            ExitClass::UnsafePath,
            "refused as traversal",
        ),
        (oversized, ExitClass::Usage, "larger than 65536 bytes"),
        (
            serde_json::to_vec(&mismatched).unwrap(),
            ExitClass::Usage,
            "digest mismatch",
        ),
    ] {
        let out = worker(&root, &stdin);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(class.code().into()), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr:?}");
        assert!(stderr.contains(says), "{stderr}");
        assert!(out.stdout.is_empty());
    }
    assert_eq!(names(base.path()), ["root"]);
    assert!(names(&root).is_empty());
}

/// Runs the worker with `--ledger LEDGER` (and `extra` flags).
fn worker_with(root: &Path, ledger: &Path, extra: &[&str], stdin: &[u8]) -> Output {
    run(
        Command::new(BIN)
            .args(["qualification-worker", "--root"])
            .arg(root)
            .arg("--ledger")
            .arg(ledger)
            .args(extra),
        stdin,
    )
}

fn ledger_ids(ledger: &Path) -> Vec<Value> {
    std::fs::read_to_string(ledger)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["correlationId"].clone())
        .collect()
}

fn parsed(correlation_id: &str, output: &str, fault: &str) -> Value {
    serde_json::from_slice(&request(correlation_id, output, fault)).unwrap()
}

/// The ledger counts processes, not outputs: a second run of the same
/// request is refused at its files and leaves no directory of its own, and
/// a request refused unread or unparsed still ran.
#[test]
fn every_run_is_in_the_ledger_even_one_that_left_nothing_of_its_own() {
    let base = tempfile::tempdir().unwrap();
    let root = base.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let ledger = base.path().join("runs.jsonl");
    let good = request("public-1", "run-1", "none");
    assert!(worker_with(&root, &ledger, &[], &good).status.success());
    let again = worker_with(&root, &ledger, &[], &good);
    assert_eq!(
        again.status.code(),
        Some(ExitClass::UnsafePath.code().into())
    );
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));
    let mut oversized = request("public-2", "big", "none");
    oversized.resize(64 * 1024 + 1, b' ');
    let out = worker_with(&root, &ledger, &[], &oversized);
    assert_eq!(out.status.code(), Some(ExitClass::Usage.code().into()));
    let out = worker_with(&root, &ledger, &[], b"{\"identity\":");
    assert_eq!(out.status.code(), Some(ExitClass::Usage.code().into()));
    assert_eq!(names(&root), ["run-1"]);
    assert_eq!(
        ledger_ids(&ledger),
        [
            json!("public-1"),
            json!("public-1"),
            Value::Null,
            Value::Null
        ]
    );
}

/// The bounds a caller declares are the worker's to keep: its artifact
/// bytes (up to 8 MiB) refused before anything is written, its runtime
/// ending the run with its own error, and bounds past the route's refused.
#[test]
fn declared_limits_are_enforced_by_the_worker_itself() {
    let base = tempfile::tempdir().unwrap();
    let root = base.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let ledger = base.path().join("runs.jsonl");
    // A fill within the declared bound is written, listed and accepted.
    let mut within = parsed("public-1", "filled", "none");
    within["limits"] = json!({"artifactBytes": 65_536});
    within["fill"] = json!(1000);
    let within = serde_json::to_vec(&within).unwrap();
    let out = worker_with(&root, &ledger, &[], &within);
    assert!(out.status.success(), "{out:?}");
    let expected = Expected::for_input(identity("public-1"), &input());
    let evidence = verify::check(&root, "filled", &expected).unwrap();
    assert_eq!(evidence.files[1].path, "filled/fill.bin");
    assert_eq!(evidence.files[1].bytes, 1000);
    verify::remove_owned(&root, "filled").unwrap();

    let cases: Vec<(Value, Value, i32, String)> = vec![
        (
            json!({"artifactBytes": 4096}),
            json!(4096),
            ExitClass::Usage.code().into(),
            "more than its bound of 4096; refused".into(),
        ),
        (
            json!({"artifactBytes": 8 * 1024 * 1024}),
            json!(8 * 1024 * 1024),
            ExitClass::Usage.code().into(),
            "more than its bound of 8388608; refused".into(),
        ),
        (
            json!({"runtimeMs": 30_001}),
            json!(0),
            ExitClass::Usage.code().into(),
            "limits.runtimeMs must be 1 to 30000".into(),
        ),
        (
            json!({"artifactBytes": 8 * 1024 * 1024 + 1}),
            json!(0),
            ExitClass::Usage.code().into(),
            "limits.artifactBytes must be at most 8388608".into(),
        ),
    ];
    for (limits, fill, code, says) in cases {
        let mut body = parsed("public-1", "refused", "none");
        body["limits"] = limits;
        body["fill"] = fill;
        let out = worker_with(&root, &ledger, &[], &serde_json::to_vec(&body).unwrap());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{stderr}");
        assert!(stderr.contains(&says), "{says}: {stderr}");
        assert!(names(&root).is_empty(), "{says}");
    }
    // A run that stalls is ended at its declared runtime by the worker, long
    // before the stall (a minute) would end.
    let mut body = parsed("public-1", "stalled", "stall");
    body["limits"] = json!({"runtimeMs": 200});
    let started = std::time::Instant::now();
    let out = worker_with(&root, &ledger, &[], &serde_json::to_vec(&body).unwrap());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(ExitClass::CallFailed.code().into()),
        "{stderr}"
    );
    assert!(
        stderr.contains("passed its declared runtime of 200 ms; ended before writing anything"),
        "{stderr}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    assert!(names(&root).is_empty());
    assert_eq!(ledger_ids(&ledger).len(), 6);
}

/// The lies `verify --durable-tasks` must catch are real lies (a debug
/// build has the test hooks): a second process, a non-zero exit after
/// valid output, a link followed out of the root.
#[test]
fn a_lying_worker_tells_its_lie() {
    assert!(taskgate::testhooks::compiled_in());
    let base = tempfile::tempdir().unwrap();
    let root = base.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let ledger = base.path().join("runs.jsonl");
    let expected = Expected::for_input(identity("public-1"), &input());

    let out = worker_with(
        &root,
        &ledger,
        &["--liar", "runs-twice"],
        &request("public-1", "twice", "none"),
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(names(&root), ["twice"]);
    assert_eq!(ledger_ids(&ledger), [json!("public-1"), json!("public-1")]);
    verify::check(&root, "twice", &expected).unwrap();

    let out = worker_with(
        &root,
        &ledger,
        &["--liar", "exit-nonzero"],
        &request("public-1", "nonzero", "none"),
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    verify::check(&root, "nonzero", &expected).unwrap();

    let elsewhere = base.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, root.join("linked")).unwrap();
    let out = worker_with(
        &root,
        &ledger,
        &["--liar", "follows-symlinks"],
        &request("public-1", "linked", "none"),
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(names(&elsewhere), ["manifest.json", "result.json"]);
}
