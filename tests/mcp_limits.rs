//! Bounds of the serving side, enforced for real: connections, concurrent
//! requests, running tasks, and the expiry of spilled results.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::*;
use serde_json::json;
use taskgate::client::ClientError;

fn config(dir: &std::path::Path, extra: &str) -> std::path::PathBuf {
    let p = dir.join("taskgate.toml");
    std::fs::write(
        &p,
        format!(
            r#"{extra}
[[tool]]
name = "nap"
argv = ["/bin/sh", "-c", "sleep $0; printf rested", "{{seconds}}"]
effect = "read_only"
task = "optional"
timeout_secs = 60
[tool.input_schema]
type = "object"
[tool.input_schema.properties.seconds]
type = "number"
"#
        ),
    )
    .unwrap();
    p
}

#[test]
fn connections_past_the_bound_get_a_clear_503() {
    let root = private_dir();
    let state = state_dir(root.path());
    let cfg = config(root.path(), "[server]\nmax_connections = 2\n");
    let daemon = Daemon::start(&cfg, &state, &root.path().join("log"));
    let _a = TcpStream::connect(("127.0.0.1", daemon.port)).unwrap();
    let _b = TcpStream::connect(("127.0.0.1", daemon.port)).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let mut c = TcpStream::connect(("127.0.0.1", daemon.port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut reply = String::new();
    let _ = c.read_to_string(&mut reply);
    assert!(reply.starts_with("HTTP/1.1 503"), "{reply:?}");
    assert!(reply.contains("server.max_connections = 2"), "{reply:?}");
    drop((_a, _b));
    std::thread::sleep(Duration::from_millis(200));
    // Capacity is back once the others have gone.
    let mut d = TcpStream::connect(("127.0.0.1", daemon.port)).unwrap();
    d.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        d,
        "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut ok = String::new();
    let _ = d.read_to_string(&mut ok);
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok:?}");
    assert!(daemon.stop().success());
}

#[test]
fn concurrent_requests_and_running_tasks_are_bounded() {
    let root = private_dir();
    let state = state_dir(root.path());
    let cfg = config(
        root.path(),
        "[server]\nmax_concurrent_requests = 1\n[tasks]\nmax_running = 1\npoll_interval_ms = 50\n",
    );
    let daemon = Daemon::start(&cfg, &state, &root.path().join("log"));
    let rt = runtime();
    rt.block_on(async {
        // One slow synchronous call holds the only request slot.
        let url = daemon.url();
        let slow = tokio::spawn(async move {
            taskgate::client::Client::new(&url, false)
                .unwrap()
                .call_tool("nap", json!({"seconds": 1.5}), None)
                .await
        });
        tokio::time::sleep(Duration::from_millis(400)).await;
        let refused = daemon
            .client(false)
            .call_tool("nap", json!({"seconds": 0}), None)
            .await;
        match refused {
            Err(ClientError::Rpc { code, message, .. }) => {
                assert_eq!(code, taskgate::wire::SERVER_BUSY.code);
                assert!(message.contains("max_concurrent_requests = 1"), "{message}");
            }
            other => panic!("expected a busy refusal, got {other:?}"),
        }
        let done = slow.await.unwrap().unwrap();
        assert_eq!(done["content"][0]["text"], "rested");

        // One background slot: the first call becomes a task, the second
        // (slots full) runs synchronously and still answers.
        let c = daemon.client(true);
        let first = c
            .call_tool("nap", json!({"seconds": 2}), None)
            .await
            .unwrap();
        assert_eq!(first["resultType"], "task");
        let second = c
            .call_tool("nap", json!({"seconds": 0}), None)
            .await
            .unwrap();
        assert_eq!(second["resultType"], "complete", "{second}");
        assert_eq!(second["content"][0]["text"], "rested");
    });
    assert!(daemon.stop().success());
}

#[test]
fn spilled_results_go_when_their_task_expires() {
    use taskgate::artifacts::Artifacts;
    use taskgate::store::{Store, StoreOptions};
    let root = private_dir();
    let state = state_dir(root.path());
    let rt = runtime();
    rt.block_on(async {
        let (store, _) = Store::open(StoreOptions::new(state.join("tasks.db"))).unwrap();
        let artifacts = Artifacts::open(&state, 1 << 20, 1 << 24).unwrap();
        let owner = common::owner();
        let short = store
            .create(new_task(300))
            .await
            .unwrap()
            .record()
            .id
            .clone();
        let long = store
            .create(new_task(600_000))
            .await
            .unwrap()
            .record()
            .id
            .clone();
        for id in [&short, &long] {
            artifacts
                .write(id, &owner, &json!({"content": []}))
                .unwrap();
        }
        let used = artifacts.used_bytes();
        assert!(used > 0);
        let settings = taskgate::config::Config::load_from(
            &Default::default(),
            &[("HOME".to_string(), "/nonexistent".to_string())]
                .into_iter()
                .collect(),
        )
        .unwrap()
        .tasks;
        let svc = taskgate::mcp::TaskService::new(
            store.clone(),
            taskgate::exec::Registry::default(),
            artifacts,
            settings,
            1000,
            8,
        );
        svc.sweep_artifacts(64).await;
        assert!(
            state
                .join("artifacts")
                .join(format!("{short}.json"))
                .exists()
        );
        tokio::time::sleep(Duration::from_millis(400)).await;
        svc.sweep_artifacts(64).await;
        assert!(
            !state
                .join("artifacts")
                .join(format!("{short}.json"))
                .exists()
        );
        assert!(
            state
                .join("artifacts")
                .join(format!("{long}.json"))
                .exists()
        );
        store.shutdown().await.unwrap();
    });
}
