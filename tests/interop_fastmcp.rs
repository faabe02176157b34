//! An independent client is the judge: FastMCP's client with
//! fastmcp-tasks 4.1.4 (from PyPI, unpatched; scripts/interop-fastmcp.sh)
//! calls a tool as a task over HTTP and over stdio and lets its library
//! drive the task to the end. That library polls from 20 ms upwards and
//! knows none of taskgate's codes; it omits `Mcp-Name` on `tasks/get`. It
//! must get the task's result, and the store must be read about once per
//! `pollIntervalMs`, however fast it polls: the daemon's own count of task
//! reads (`taskgate status --json`), asked once the client has its result
//! and before the daemon stops, with that task the only one it holds.
//!
//! What this file proves: an independent client, FastMCP with fastmcp-tasks
//! 4.1.4 from PyPI (unpatched; it polls from 20 ms and omits `Mcp-Name` on
//! `tasks/get`), over HTTP and stdio: it gets its task's result and the store
//! is read about once per `pollIntervalMs` (the daemon's own `task_reads` from
//! `status --json`, asked once the client has its result and before the daemon
//! stops, with that task the only one it holds); needs python3-venv

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::Value;

/// `pollIntervalMs` the daemon advertises.
const INTERVAL_MS: u64 = 250;

fn config(dir: &Path) -> PathBuf {
    write_config(
        dir,
        &format!("[tasks]\npoll_interval_ms = {INTERVAL_MS}\n"),
        &[Tool::new("nap")
            .description("Sleeps, then says so.")
            .script("sleep $0; printf rested")
            .args(&["{seconds}"])
            .task("optional")
            .timeout_secs(60)
            .required("seconds", "number")],
    )
}

/// Runs the client; its one JSON line.
fn client(args: &[&str]) -> Value {
    prereq::require_tool("python3");
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new("bash")
        .arg(format!("{root}/scripts/interop-fastmcp.sh"))
        .args(args)
        .output()
        .expect("run scripts/interop-fastmcp.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the FastMCP client failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not the client's JSON ({e}): {stdout}"))
}

/// `status` is what the daemon reported after the client had its result:
/// every task read it asked of its store since it started, while holding
/// no task but this one.
fn assert_paced(got: &Value, status: &Value) {
    let task = got["taskId"].as_str().unwrap_or_default();
    assert!(task.starts_with("tg-"), "{got}");
    assert_eq!(got["text"], "rested", "{got}");
    assert_eq!(got["isError"], false, "{got}");
    assert_eq!(
        status["tasks"],
        serde_json::json!({"retained": 1, "unexpired": 1}),
        "{status}"
    );
    let seconds = got["seconds"].as_f64().unwrap_or_default();
    let intervals = (seconds * 1000.0) as u64 / INTERVAL_MS;
    let reads = status["task_reads"]
        .as_u64()
        .unwrap_or_else(|| panic!("no task_reads in {status}"));
    eprintln!(
        "{} polls in {seconds} s; {reads} store reads of {task} ({intervals} intervals of {INTERVAL_MS} ms)",
        got["polls"]
    );
    assert!(
        reads >= 1,
        "the daemon read {task} from its store never: {status}"
    );
    assert!(
        reads <= intervals + 2,
        "{reads} store reads of {task} in {seconds} s: more than one per {INTERVAL_MS} ms"
    );
}

#[test]
fn fastmcp_over_http_gets_its_result_and_is_paced() {
    let dir = private_dir();
    let state = state_dir(dir.path());
    let daemon = Daemon::builder()
        .config(&config(dir.path()))
        .state_dir(&state)
        .log(&dir.path().join("taskgate.log"))
        .start();
    let got = client(&["http", &daemon.url(), "nap", "1.5"]);
    let status = admin_status(&state);
    let log = daemon.log_text();
    assert!(daemon.stop().success(), "daemon log:\n{log}");
    assert_paced(&got, &status);
}

#[test]
fn fastmcp_over_stdio_gets_its_result_and_is_paced() {
    let dir = private_dir();
    let state = state_dir(dir.path());
    let cfg = config(dir.path());
    // The client starts the daemon itself and asks it for its status
    // before the session ends; the daemon's stderr goes to the client's.
    let got = client(&[
        "stdio",
        BIN,
        cfg.to_str().unwrap(),
        state.to_str().unwrap(),
        "nap",
        "1.5",
    ]);
    assert_paced(&got, &got["status"]);
}
