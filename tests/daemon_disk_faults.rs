//! A disk error under the real daemon: fsync fails with EIO (injected with
//! strace into the running process). The write that met it is never
//! reported as done, the task service disables itself until restart, and
//! the daemon says so everywhere an operator or client looks: /readyz and
//! every task request. A restart (the operator's remedy) checks the
//! database and serves again.

mod common;

use common::strace::Strace;
use common::*;
use serde_json::json;
use taskgate::client::ClientError;

#[test]
fn fsync_eio_disables_the_task_service_and_a_restart_recovers() {
    prereq::require_tool("strace");
    let root = private_dir();
    let state = state_dir(root.path());
    let marker = root.path().join("ran");
    let cfg = root.path().join("taskgate.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"[tasks]
poll_interval_ms = 50
[[tool]]
name = "mark"
argv = ["/bin/sh", "-c", "echo ran >> {}; printf marked"]
sandbox = "unconfined" # its files sit beside the state directory
effect = "idempotent_write"
task = "optional"
"#,
            marker.display()
        ),
    )
    .unwrap();
    let daemon = Daemon::start(&cfg, &state, &root.path().join("log1"));
    let rt = runtime();
    let before = rt.block_on(async {
        let c = daemon.client(true);
        let t = c.call_tool("mark", json!({}), None).await.unwrap();
        assert_eq!(t["resultType"], "task");
        t["taskId"].as_str().unwrap().to_string()
    });
    assert!(http_get(daemon.port, "/readyz").starts_with("HTTP/1.1 200"));

    let strace = Strace::attach(
        daemon.child.id() as i32,
        &root.path().join("strace.log"),
        &[
            "-e",
            "trace=fsync,fdatasync",
            "-e",
            "inject=fsync,fdatasync:error=EIO",
        ],
    );
    rt.block_on(async {
        let c = daemon.client(true);
        // The creation's commit fails: no task handle is returned. The call
        // is answered (synchronously, as the store cannot take tasks), and
        // its command ran exactly once.
        let r = c.call_tool("mark", json!({}), None).await.unwrap();
        assert_eq!(r["resultType"], "complete", "{r}");
        assert_eq!(r["content"][0]["text"], "marked");

        // Disabled until restart, and said so.
        let ready = http_get(daemon.port, "/readyz");
        assert!(ready.starts_with("HTTP/1.1 503"), "{ready}");
        assert!(ready.contains("disabled until restart"), "{ready}");
        // Tasks stay advertised (the store did open), but every task
        // request says the store is unavailable, reads included: nothing
        // is served from a store in doubt.
        let err = c.get_task(&before).await.unwrap_err();
        assert!(
            matches!(err, ClientError::Rpc { code, .. } if code == taskgate::wire::STORE_UNAVAILABLE.code),
            "{err}"
        );
    });
    assert!(strace.injected() >= 1, "no fsync was failed");
    drop(strace);
    // The operator's status screen says so, with the reason, and exits 1;
    // an online snapshot of a store in doubt is refused and leaves nothing.
    let out = taskgate(&["status", "--state-dir", state.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("task store       DISABLED until restart:"),
        "{text}"
    );
    let dest = root.path().join("snapshot");
    let out = taskgate(
        &[
            "backup",
            "--online",
            "--state-dir",
            state.to_str().unwrap(),
            "--to",
            dest.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        one_line_stderr(&out).contains("task store is disabled"),
        "{out:?}"
    );
    assert!(!dest.exists(), "a refused snapshot leaves nothing");
    assert!(
        daemon.stop().success(),
        "a disabled daemon still stops cleanly"
    );
    let runs = std::fs::read_to_string(&marker).unwrap().lines().count();
    assert_eq!(runs, 2, "each call ran its command once");

    // The operator restarts: the database is checked and served again.
    let daemon = Daemon::start(&cfg, &state, &root.path().join("log2"));
    assert!(http_get(daemon.port, "/readyz").starts_with("HTTP/1.1 200"));
    rt.block_on(async {
        let t = daemon.client(true).get_task(&before).await.unwrap();
        assert_eq!(t["status"], "completed");
    });
    assert!(daemon.stop().success());
}
