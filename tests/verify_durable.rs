//! `taskgate verify --durable-tasks` as an operator runs it: the real
//! binary, its embedded provider and worker as real child processes, and
//! its own temporary directory, which must be gone when it reports.

mod common;

use std::process::Command;

use common::*;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_taskgate");

/// The checks the issue names; each must be in the result, passed.
const CHECKS: &[&str] = &[
    "provider_negotiated_tasks",
    "describe",
    "lease_absolute_expiry",
    "schema_lease_capability_effect_refusals",
    "discarded_acknowledgement_recovered_after_router_reopen",
    "one_observed_worker_effect_verified",
    "changed_input_key_reuse_refused",
    "exit_zero_invalid_output_rejected",
    "missing_truncated_swapped_artifacts_detected",
    "traversal_and_symlink_refused",
    "update_unsupported",
    "poll_driven_deadline_cancellation",
    "owned_resources_cleaned_up",
    "nothing_left_behind",
];

#[test]
fn the_qualification_passes_names_every_check_and_leaves_nothing_behind() {
    let tmp = private_dir();
    let out = Command::new(BIN)
        .args(["verify", "--durable-tasks"])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("TMPDIR", tmp.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{out:?}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["result"], "PASS", "{report:#}");
    let checks = report["checks"].as_array().unwrap();
    for name in CHECKS {
        let c = checks
            .iter()
            .find(|c| c["name"] == *name)
            .unwrap_or_else(|| panic!("{name} missing from {report:#}"));
        assert_eq!(c["pass"], true, "{c:#}");
        assert!(!c["evidence"].is_null(), "{name} has no evidence");
    }
    // Evidence that means something: the same ID and session across the
    // reopen, and the independent verifier's rejection of the fault run.
    let recovered = checks
        .iter()
        .find(|c| c["name"] == "discarded_acknowledgement_recovered_after_router_reopen")
        .unwrap();
    let e = &recovered["evidence"];
    assert_eq!(e["publicTaskId"], e["recoveredTaskId"]);
    assert_eq!(e["sessionBeforeReopen"], e["sessionAfterReopen"]);
    let fault = checks
        .iter()
        .find(|c| c["name"] == "exit_zero_invalid_output_rejected")
        .unwrap();
    assert!(
        fault["evidence"]["verifier"]
            .as_str()
            .unwrap()
            .contains("identity changed"),
        "{fault:#}"
    );
    // The human summary is on stderr, one line per check and the verdict.
    assert!(
        stderr.contains("durable-tasks qualification: PASS"),
        "{stderr}"
    );
    assert_eq!(
        stderr.lines().filter(|l| l.starts_with("pass  ")).count(),
        checks.len()
    );
    // Nothing left in its temporary directory.
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn it_must_be_named_and_an_unusable_temporary_directory_is_refused() {
    let out = Command::new(BIN).arg("verify").output().unwrap();
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    let out = Command::new(BIN)
        .args(["verify", "--durable-tasks"])
        .env("TMPDIR", "/nonexistent/taskgate-verify")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(74), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("/nonexistent/taskgate-verify"), "{stderr}");
    assert!(out.stdout.is_empty());
}
