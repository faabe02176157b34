//! Crashes in the middle of spilling a large result, through the real
//! daemon: the process aborts at a crash point (the test hooks), and the
//! next start serves exactly what was committed. A temporary file that was
//! never renamed is removed; an artifact renamed into place for a task whose
//! outcome never committed is removed with it, so `artifact_read` does not
//! hand out the result of a task that reads failed.
//!
//! What this file proves: the daemon aborted at the two crash points around an
//! artifact's rename: no leftover temporary, no artifact served for a task
//! recovery ended

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use serde_json::json;
use taskgate::client::ClientError;
use taskgate::testhooks;

/// A tool whose result (100 KiB) is larger than a record holds.
fn big_tool_config(dir: &Path) -> PathBuf {
    write_config(
        dir,
        "[tasks]\npoll_interval_ms = 50\n",
        &[Tool::new("big")
            .script("head -c 102400 /dev/zero | tr '\\0' 'a'")
            .task("optional")
            .extra("max_stdout_bytes = 1048576")
            .input()],
    )
}

/// Starts a daemon that aborts at `point` while spilling the result of the
/// one task it is asked to run; returns that task's ID once it has aborted.
fn crash_while_spilling(state: &Path, config: &Path, point: &str) -> String {
    let rt = runtime();
    let mut daemon = Daemon::builder()
        .config(config)
        .state_dir(state)
        .env(testhooks::CRASH_AT_ENV, point)
        .start();
    let client = daemon.client(true);
    // The answer may or may not arrive before the crash: the task is known
    // from the state directory afterwards.
    let _ = rt.block_on(client.call_tool("big", json!({}), None));
    let status = daemon.wait_exit(Duration::from_secs(30));
    assert_eq!(status.signal(), Some(libc::SIGABRT), "{status:?}");
    let stderr = daemon.log_text();
    assert!(stderr.contains(&format!("crash point {point}")), "{stderr}");
    let c = rusqlite::Connection::open_with_flags(
        state.join("tasks.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let (id, status): (String, String) = c
        .query_row("SELECT id, status FROM tasks", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!(status, "working", "the outcome must not have committed");
    id
}

fn artifact_names(state: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(state.join("artifacts"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// After the restart the task reads failed (interrupted) and has no
/// artifact: what is served matches what was committed.
fn assert_served_as_committed(state: &Path, config: &Path, id: &str) {
    let rt = runtime();
    let daemon = Daemon::builder().config(config).state_dir(state).start();
    rt.block_on(async {
        let c = daemon.client(true);
        let t = c.get_task(id).await.unwrap();
        assert_eq!(t["status"], "failed", "{t}");
        assert_eq!(t["error"]["code"], taskgate::wire::TASK_INTERRUPTED.code);
        match c
            .call_tool("artifact_read", json!({"taskId": id}), None)
            .await
        {
            Err(ClientError::Rpc { code, .. })
                if code == taskgate::wire::ARTIFACT_UNAVAILABLE.code => {}
            other => {
                let shown: String = format!("{other:?}").chars().take(160).collect();
                panic!("artifact_read of a task that reads failed answered {shown}…");
            }
        }
    });
    // Nothing left over either: the byte bound counts only what serves.
    assert_eq!(artifact_names(state), Vec::<String>::new());
    assert!(daemon.stop().success());
}

#[test]
fn a_crash_before_the_rename_leaves_no_temporary_file() {
    let root = private_dir();
    let state = state_dir(root.path());
    let config = big_tool_config(root.path());
    let id = crash_while_spilling(&state, &config, testhooks::CRASH_AFTER_ARTIFACT_TEMP);
    assert_eq!(artifact_names(&state), vec![format!(".{id}.tmp")]);
    assert_served_as_committed(&state, &config, &id);
}

#[test]
fn a_crash_after_the_rename_but_before_the_commit_serves_no_artifact() {
    let root = private_dir();
    let state = state_dir(root.path());
    let config = big_tool_config(root.path());
    let id = crash_while_spilling(&state, &config, testhooks::CRASH_AFTER_ARTIFACT_RENAME);
    assert_eq!(artifact_names(&state), vec![format!("{id}.json")]);
    assert_served_as_committed(&state, &config, &id);
}
