//! The qualification worker as the durable route will run it: the real
//! binary as a child process, its request on stdin, judged afterwards by
//! the independent check and never by its exit status alone.

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
    let mut child = Command::new(BIN)
        .args(["qualification-worker", "--root"])
        .arg(root)
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
