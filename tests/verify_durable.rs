//! `taskgate verify --durable-tasks` as an operator runs it: the real
//! binary, its embedded provider and worker as real child processes, and
//! its own temporary directory, which must be gone when it reports. And
//! against lying workers (the test hook `TASKGATE_TEST_LYING_WORKER`):
//! each lie must fail the check that names what it breaks, and the
//! command must exit non-zero.
//!
//! What this file proves: `taskgate verify --durable-tasks` as an operator runs
//! it (the real binary, its embedded provider and worker as child processes,
//! `TMPDIR` private): exit 0 with a PASS result naming every check with its
//! evidence (the same public ID and provider session across the router's
//! reopen, the verifier's rejection of the exit-zero fault run, the provider's
//! counts), the summary on stderr; each lying worker fails the check that names
//! its lie, nothing left in the temporary directory; without `--durable-tasks`
//! a usage error, and an unusable temporary directory refused (74) with nothing
//! on stdout

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
    "effect_scopes_enforced_over_http",
    "discarded_acknowledgement_recovered_after_router_reopen",
    "one_observed_worker_effect_verified",
    "changed_input_key_reuse_refused",
    "exit_zero_invalid_output_rejected",
    "missing_truncated_swapped_artifacts_detected",
    "input_over_64_kib_refused",
    "output_over_8_mib_refused",
    "run_past_declared_runtime_ended",
    "traversal_and_symlink_refused",
    "update_unsupported",
    "poll_driven_deadline_cancellation",
    "owned_resources_cleaned_up",
    "every_worker_run_was_received",
    "nothing_left_behind",
];

/// Runs `taskgate verify --durable-tasks` with `env` in a private
/// temporary directory; its output, its result and that directory.
fn verify(env: &[(&str, &str)]) -> (std::process::Output, Value, tempfile::TempDir) {
    let tmp = private_dir();
    let mut command = Command::new(BIN);
    command
        .args(["verify", "--durable-tasks"])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("TMPDIR", tmp.path());
    for (k, v) in env {
        command.env(k, v);
    }
    let out = command.output().unwrap();
    let report: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    (out, report, tmp)
}

fn check<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("{name} missing from {report:#}"))
}

#[test]
fn the_qualification_passes_names_every_check_and_leaves_nothing_behind() {
    let (out, report, tmp) = verify(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{out:?}");
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
    // What reached the provider was counted, and it was one run.
    let effect = &check(&report, "one_observed_worker_effect_verified")["evidence"];
    assert_eq!(effect["providerTasksCreated"], 1, "{effect:#}");
    assert_eq!(effect["providerToolRunsStarted"], 1, "{effect:#}");
    assert_eq!(effect["workerProcessesInLedger"], 1, "{effect:#}");
    assert_eq!(effect["worker"]["exitStatus"], 0, "{effect:#}");
    assert_eq!(
        fault["evidence"]["worker"]["exitStatus"], 0,
        "the fault run must have exited 0: {fault:#}"
    );
    // The worker's own refusals, with its exit status and words.
    let refused = &check(&report, "traversal_and_symlink_refused")["evidence"];
    for case in ["traversal", "symlink"] {
        assert_eq!(refused[case]["exitStatus"], 77, "{refused:#}");
    }
    let scopes = &check(&report, "effect_scopes_enforced_over_http")["evidence"];
    assert_eq!(scopes["withoutToken"], "TG_UNAUTHENTICATED", "{scopes:#}");
    assert_eq!(
        scopes["withoutNonIdempotentWriteScope"], "TG_FORBIDDEN",
        "{scopes:#}"
    );
    assert_eq!(
        check(&report, "update_unsupported")["evidence"]["answer"],
        "TG_TASK_UPDATE_UNSUPPORTED_DURABLE"
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

/// Each lie of the worker, and the check that must catch it: a worker
/// that runs twice (the second run fails at its files and leaves no
/// output directory of its own), one that exits 1 after writing valid
/// output, one that follows a symbolic link (which the sandbox would stop
/// anyway, so only the worker's own refusal passes).
#[test]
fn each_lying_worker_fails_the_check_that_names_its_lie_and_the_command_fails() {
    for (lie, failed) in [
        ("runs-twice", "one_observed_worker_effect_verified"),
        ("exit-nonzero", "exit_zero_invalid_output_rejected"),
        ("follows-symlinks", "traversal_and_symlink_refused"),
    ] {
        let (out, report, tmp) = verify(&[("TASKGATE_TEST_LYING_WORKER", lie)]);
        assert_eq!(out.status.code(), Some(1), "{lie}: {out:?}");
        assert_eq!(report["result"], "FAIL", "{lie}: {report:#}");
        let c = check(&report, failed);
        assert_eq!(c["pass"], false, "{lie}: {c:#}");
        let e = &c["evidence"];
        match lie {
            "runs-twice" => assert_eq!(e["workerProcessesInLedger"], 2, "{e:#}"),
            "exit-nonzero" => assert_eq!(e["worker"]["exitStatus"], 1, "{e:#}"),
            _ => assert_ne!(e["symlink"]["exitStatus"], 77, "{e:#}"),
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!("FAIL  {failed}")),
            "{lie}: {stderr}"
        );
        assert!(
            stderr.contains("durable-tasks qualification: FAIL"),
            "{lie}: {stderr}"
        );
        let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
        assert!(left.is_empty(), "{lie}: left behind: {left:?}");
    }
}

/// The operator's `TASKGATE_*` variables are not the qualification's: ones
/// that no daemon would start with change nothing it qualifies.
#[test]
fn the_operators_taskgate_variables_do_not_change_what_is_qualified() {
    let (out, report, _tmp) = verify(&[
        ("TASKGATE_STORE_QUEUE_DEPTH", "0"),
        ("TASKGATE_SERVER_LISTEN", "0.0.0.0:9"),
        ("TASKGATE_TASKS_POLL_INTERVAL_MS", "nonsense"),
    ]);
    assert!(out.status.success(), "{report:#}");
    assert_eq!(report["result"], "PASS");
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
