//! Helpers shared by the integration tests: real directories, the real
//! binary, real SQLite files.
#![allow(dead_code)]

pub mod strace;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sha2::{Digest as _, Sha256};
use taskgate::store::{Digest, NewTask, Store, StoreOptions};

pub const BIN: &str = env!("CARGO_BIN_EXE_taskgate");

/// A private (0700) directory under the system temp dir, which is a
/// root-owned sticky directory and so a trusted ancestor.
pub fn private_dir() -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix("taskgate-test-")
        .tempdir()
        .expect("tempdir");
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    d
}

/// A private state directory inside a fresh private temp dir.
pub fn state_dir(root: &Path) -> PathBuf {
    let p = root.join("state");
    std::fs::create_dir(&p).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700)).unwrap();
    p
}

pub fn sha256_file(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_default();
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub fn owner() -> Digest {
    Digest::of(b"test-owner")
}

pub fn new_task(ttl_ms: i64) -> NewTask {
    NewTask {
        owner: owner(),
        reference: None,
        request: None,
        ttl_ms,
        poll_interval_ms: 500,
        status_message: None,
    }
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Creates a valid, cleanly closed database with `n` tasks in `dir`,
/// half of them completed.
pub fn populate(dir: &Path, n: usize) -> Vec<String> {
    let rt = runtime();
    rt.block_on(async {
        let (store, _) = Store::open(StoreOptions::new(dir.join("tasks.db"))).unwrap();
        let mut ids = Vec::new();
        for i in 0..n {
            let created = store.create(new_task(86_400_000)).await.unwrap();
            let id = created.record().id.clone();
            if i % 2 == 0 {
                store
                    .finish(
                        &id,
                        taskgate::store::TaskStatus::Completed,
                        None,
                        Some(taskgate::store::Outcome::Result(
                            serde_json::json!({"content":[{"type":"text","text":format!("result {i} {}", "x".repeat(200))}]}),
                        )),
                    )
                    .await
                    .unwrap();
            }
            ids.push(id.to_string());
        }
        store.shutdown().await.unwrap();
        ids
    })
}

/// Runs the real binary with a clean, predictable environment; a run that
/// has not ended after 60 s is killed and fails the test.
pub fn taskgate(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let child = cmd.spawn().expect("run taskgate");
    let pid = child.id();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if done_rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .is_err()
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            return true;
        }
        false
    });
    let out = child.wait_with_output().expect("wait for taskgate");
    let _ = done_tx.send(());
    let timed_out = watchdog.join().unwrap_or(false);
    assert!(!timed_out, "taskgate {args:?} did not finish within 60 s");
    out
}

/// The refusal line of a failed run: asserts there is exactly one line.
pub fn one_line_stderr(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "expected one stderr line, got: {text:?}");
    lines[0].to_string()
}

/// A real `taskgate serve` over HTTP on an ephemeral loopback port, with
/// its stderr in a file. Killed (SIGKILL) when dropped unless stopped.
pub struct Daemon {
    pub child: std::process::Child,
    pub port: u16,
    pub log: PathBuf,
}

impl Daemon {
    pub fn start(config: &Path, state: &Path, log: &Path) -> Daemon {
        let err = std::fs::File::create(log).unwrap();
        let child = Command::new(BIN)
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(config)
            .arg("--state-dir")
            .arg(state)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .stdout(std::process::Stdio::null())
            .stderr(err)
            .spawn()
            .expect("start taskgate");
        let mut d = Daemon {
            child,
            port: 0,
            log: log.to_path_buf(),
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            if let Some(p) = text
                .split("listen=127.0.0.1:")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .and_then(|p| p.parse().ok())
            {
                d.port = p;
                return d;
            }
            if let Ok(Some(status)) = d.child.try_wait() {
                panic!("taskgate exited early ({status}): {text}");
            }
            assert!(
                std::time::Instant::now() < deadline,
                "taskgate did not start: {text}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    pub fn client(&self, tasks: bool) -> taskgate::client::Client {
        taskgate::client::Client::new(&self.url(), tasks).unwrap()
    }

    /// SIGTERM and wait: a clean stop.
    pub fn stop(mut self) -> std::process::ExitStatus {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let status = wait_timeout(&mut self.child, std::time::Duration::from_secs(30));
        std::mem::forget(self);
        status
    }

    /// SIGKILL and reap: a crash.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::mem::forget(self);
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn wait_timeout(
    child: &mut std::process::Child,
    limit: std::time::Duration,
) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("process did not exit within {limit:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A plain HTTP GET on loopback; the whole response, status line first.
pub fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text
}
