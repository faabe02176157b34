//! An independent client is the judge: FastMCP's client with
//! fastmcp-tasks 4.1.4 (from PyPI, unpatched; scripts/interop-fastmcp.sh)
//! calls a tool as a task over HTTP and over stdio and lets its library
//! drive the task to the end. That library polls from 20 ms upwards and
//! knows none of taskgate's codes; it omits `Mcp-Name` on `tasks/get`. It
//! must get the task's result, and the store must be read about once per
//! `pollIntervalMs`, however fast it polls (counted from the daemon's
//! debug events for reads of that task).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::Value;

/// `pollIntervalMs` the daemon advertises.
const INTERVAL_MS: u64 = 250;

fn config(dir: &Path) -> PathBuf {
    let p = dir.join("taskgate.toml");
    std::fs::write(
        &p,
        format!(
            r#"[tasks]
poll_interval_ms = {INTERVAL_MS}

[[tool]]
name = "nap"
description = "Sleeps, then says so."
argv = ["/bin/sh", "-c", "sleep $0; printf rested", "{{seconds}}"]
effect = "read_only"
task = "optional"
timeout_secs = 60
[tool.input_schema]
type = "object"
required = ["seconds"]
[tool.input_schema.properties.seconds]
type = "number"
"#
        ),
    )
    .unwrap();
    p
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

/// Reads of `task` the daemon made from its store, from its debug events.
fn store_reads(log: &str, task: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("task read from the store") && l.contains(task))
        .count()
}

fn assert_paced(got: &Value, log: &str) {
    let task = got["taskId"].as_str().unwrap_or_default();
    assert!(task.starts_with("tg-"), "{got}");
    assert_eq!(got["text"], "rested", "{got}");
    assert_eq!(got["isError"], false, "{got}");
    let seconds = got["seconds"].as_f64().unwrap_or_default();
    let intervals = (seconds * 1000.0) as usize / INTERVAL_MS as usize;
    let reads = store_reads(log, task);
    eprintln!(
        "{} polls in {seconds} s; {reads} store reads of {task} ({intervals} intervals of {INTERVAL_MS} ms)",
        got["polls"]
    );
    assert!(reads >= 1, "no store read of {task} was logged:\n{log}");
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
        .env("TASKGATE_LOG", "debug")
        .start();
    let got = client(&["http", &daemon.url(), "nap", "1.5"]);
    let log = daemon.log_text();
    assert!(daemon.stop().success(), "daemon log:\n{log}");
    assert_paced(&got, &log);
}

#[test]
fn fastmcp_over_stdio_gets_its_result_and_is_paced() {
    let dir = private_dir();
    let state = state_dir(dir.path());
    let cfg = config(dir.path());
    // The client starts the daemon itself; its stderr (the log) goes to
    // the client's stderr, which the script passes on.
    let log_path = dir.path().join("taskgate.log");
    let wrapper = dir.path().join("taskgate-logged.sh");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nTASKGATE_LOG=debug exec {BIN} \"$@\" 2>>{}\n",
            log_path.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let got = client(&[
        "stdio",
        wrapper.to_str().unwrap(),
        cfg.to_str().unwrap(),
        state.to_str().unwrap(),
        "nap",
        "1.5",
    ]);
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert_paced(&got, &log);
}
