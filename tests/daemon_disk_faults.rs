//! Disk faults under the real daemon.
//!
//! - fsync fails with EIO (injected with strace into the running daemon's
//!   store thread) on the COMMIT of a task's creation: the handle is never
//!   returned, the task service disables itself until restart, and the
//!   daemon says so everywhere an operator or client looks: /readyz, every
//!   task request, `taskgate status`. A restart (the operator's remedy)
//!   checks the database and serves again.
//! - Corruption met while serving (pages of `tasks.db` overwritten under
//!   the running daemon): the read that meets it disables the service the
//!   same way, and the restart refuses the database (65) without changing
//!   it.
//!
//! What this file proves: EIO injected into the running daemon's store thread
//! on a creation's COMMIT; corruption met while serving; needs root

mod common;

use std::io::{Seek, SeekFrom, Write};
use std::time::Duration;

use common::strace::Strace;
use common::*;
use serde_json::{Value, json};
use taskgate::client::{Client, ClientError};
use taskgate::store::{Outcome, Store, StoreOptions, TaskStatus};

async fn poll_until_terminal(c: &Client, id: &str) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let t = c.get_task(id).await.unwrap();
        if matches!(
            t["status"].as_str(),
            Some("completed" | "failed" | "cancelled")
        ) {
            return t;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "task {id} did not end: {t}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn is_store_unavailable(e: &ClientError) -> bool {
    matches!(e, ClientError::Rpc { code, .. } if *code == taskgate::wire::STORE_UNAVAILABLE.code)
}

#[test]
fn fsync_eio_on_a_creates_commit_disables_the_task_service_and_a_restart_recovers() {
    prereq::require_tool("strace");
    let root = private_dir();
    let state = state_dir(root.path());
    let marker = root.path().join("ran");
    let kept = root.path().join("kept-ran");
    // No checkpoint timer fires during the test, and nothing expires: the
    // only write the store makes once the first task has ended is the
    // creation of the next one.
    let cfg = write_config(
        root.path(),
        "[store]\ncheckpoint_interval_secs = 86400\n[tasks]\npoll_interval_ms = 50\n",
        &[
            Tool::new("mark")
                .script(&format!("echo ran >> {}; printf marked", marker.display()))
                .unconfined("its files sit beside the state directory")
                .effect("idempotent_write")
                .task("optional"),
            Tool::new("kept")
                .script(&format!("echo ran >> {}; printf kept", kept.display()))
                .unconfined("its files sit beside the state directory")
                .effect("idempotent_write")
                .task("required"),
        ],
    );
    let daemon = Daemon::start(&cfg, &state, &root.path().join("log1"));
    let rt = runtime();
    let before = rt.block_on(async {
        let c = daemon.client(true);
        let t = c.call_tool("mark", json!({}), None).await.unwrap();
        assert_eq!(t["resultType"], "task");
        let id = t["taskId"].as_str().unwrap().to_string();
        // Its outcome is committed before the fault is armed.
        assert_eq!(poll_until_terminal(&c, &id).await["status"], "completed");
        id
    });
    assert!(http_get(daemon.port, "/readyz").starts_with("HTTP/1.1 200"));

    let strace = Strace::attach_store_thread(
        daemon.child.id() as i32,
        &root.path().join("strace.log"),
        "fsync,fdatasync",
        "fsync,fdatasync:error=EIO",
    );
    rt.block_on(async {
        let c = daemon.client(true);
        assert_eq!(strace.injected(), 0, "a fault before the call");
        // The creation's COMMIT meets the fault: no handle, and a tool that
        // needs a task is not run synchronously instead.
        let err = c.call_tool("kept", json!({}), None).await.unwrap_err();
        assert!(is_store_unavailable(&err), "{err}");
        let injected = strace.injected_lines();
        assert_eq!(
            injected.len(),
            1,
            "the call's COMMIT and nothing else met the fault: {injected:#?}"
        );
        assert!(
            injected[0].starts_with("fsync(") && injected[0].contains("tasks.db-wal>"),
            "{injected:#?}"
        );

        // An optional tool is answered synchronously, as the store cannot
        // take tasks, and its command runs exactly once.
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
        assert!(is_store_unavailable(&err), "{err}");
    });
    assert_eq!(
        strace.detach(),
        1,
        "the store synced nothing after the fault"
    );
    // The operator's status screen says so, with the reason (a COMMIT),
    // and exits 1; an online snapshot of a store in doubt is refused and
    // leaves nothing.
    let out = taskgate(&["status", "--state-dir", state.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("task store       DISABLED until restart: committing: disk I/O error"),
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
    assert!(!kept.exists(), "the tool whose task was not created ran");

    // The operator restarts: the database is checked and served again.
    let daemon = Daemon::start(&cfg, &state, &root.path().join("log2"));
    assert!(http_get(daemon.port, "/readyz").starts_with("HTTP/1.1 200"));
    rt.block_on(async {
        let t = daemon.client(true).get_task(&before).await.unwrap();
        assert_eq!(t["status"], "completed");
    });
    assert!(daemon.stop().success());
    assert!(!kept.exists(), "the restart ran the uncertain task");
}

/// Tasks whose results fill about 7 MiB of pages: more than SQLite's page
/// cache (2 MiB by default), so the daemon's startup checks leave the
/// first tasks' pages out of its cache and a later read of them goes to
/// the file.
const CORRUPTION_TASKS: usize = 480;

#[test]
fn corruption_met_while_serving_disables_the_task_service_and_the_restart_refuses_it() {
    let root = private_dir();
    let state = state_dir(root.path());
    let db = state.join("tasks.db");
    let rt = runtime();
    let ids = rt.block_on(async {
        let (store, _) = Store::open(StoreOptions::new(&db)).unwrap();
        let mut ids = Vec::new();
        for i in 0..CORRUPTION_TASKS {
            let new = taskgate::store::NewTask {
                proposal: None,
                owner: taskgate::tasks::local_owner(),
                ..new_task(86_400_000)
            };
            let id = store.create(new).await.unwrap().record().id.clone();
            let text = format!("{i:04} {}", "r".repeat(15 * 1024));
            let outcome = Outcome::Result(json!({"content": [{"type": "text", "text": text}]}));
            store
                .finish(&id, TaskStatus::Completed, Some(outcome))
                .await
                .unwrap();
            ids.push(id.to_string());
        }
        // A clean close: everything is in tasks.db, the WAL is empty.
        store.shutdown().await.unwrap();
        ids
    });
    let cfg = root.path().join("taskgate.toml");
    std::fs::write(&cfg, "[store]\ncheckpoint_interval_secs = 86400\n").unwrap();
    let daemon = Daemon::start(&cfg, &state, &root.path().join("log1"));
    rt.block_on(async {
        let t = daemon
            .client(true)
            .get_task(&ids[CORRUPTION_TASKS - 1])
            .await
            .unwrap();
        assert_eq!(t["status"], "completed", "{t}");
    });

    // The pages written first (page 1, the header and schema, and a few
    // after it left alone) are overwritten under the running daemon.
    let page = 4096u64;
    let mut f = std::fs::OpenOptions::new().write(true).open(&db).unwrap();
    let len = f.metadata().unwrap().len();
    assert!(len > 6 << 20, "the database is only {len} bytes");
    f.seek(SeekFrom::Start(8 * page)).unwrap();
    f.write_all(&vec![0xA5u8; 400 * page as usize]).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let corrupted = sha256_file(&db);

    rt.block_on(async {
        let c = daemon.client(true);
        // The first tasks live in the overwritten pages: reading one meets
        // the corruption and is refused, never answered from a guess.
        let err = c.get_task(&ids[1]).await.unwrap_err();
        assert!(is_store_unavailable(&err), "{err}");
        // From then on the service is disabled, for reads the cache could
        // still answer too, and for new tasks.
        let err = c.get_task(&ids[CORRUPTION_TASKS - 1]).await.unwrap_err();
        assert!(is_store_unavailable(&err), "{err}");
    });
    let ready = http_get(daemon.port, "/readyz");
    assert!(ready.starts_with("HTTP/1.1 503"), "{ready}");
    assert!(ready.contains("disabled until restart"), "{ready}");
    let out = taskgate(&["status", "--state-dir", state.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("task store       DISABLED until restart: reading a task: database disk image is malformed"),
        "{text}"
    );
    assert!(
        daemon.stop().success(),
        "a disabled daemon still stops cleanly"
    );
    assert_eq!(
        sha256_file(&db),
        corrupted,
        "a disabled store wrote to its database"
    );

    // The restart refuses the corrupt database and leaves it as it was.
    let mut again = Daemon::builder()
        .config(&cfg)
        .state_dir(&state)
        .log(&root.path().join("log2"))
        .spawn();
    let status = again.wait_exit(Duration::from_secs(60));
    assert_eq!(status.code(), Some(65), "{}", again.log_text());
    assert_eq!(
        sha256_file(&db),
        corrupted,
        "a refused start changed tasks.db"
    );
}
