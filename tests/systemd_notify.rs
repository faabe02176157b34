//! The service-manager protocol observed for real: a unix datagram socket
//! stands in for systemd as NOTIFY_SOCKET while the real binary serves.
//! READY=1 and STATUS= after startup, WATCHDOG=1 while the store thread
//! answers and none while it hangs, STOPPING=1 on SIGTERM, then exit 0.

mod common;

use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

struct Notifications {
    sock: UnixDatagram,
}

impl Notifications {
    /// Messages received until `until` passes.
    fn collect_for(&self, span: Duration) -> Vec<String> {
        let until = Instant::now() + span;
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while Instant::now() < until {
            let left = until
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1));
            self.sock.set_read_timeout(Some(left)).unwrap();
            if let Ok(n) = self.sock.recv(&mut buf) {
                out.push(String::from_utf8_lossy(&buf[..n]).to_string());
            }
        }
        out
    }

    /// Waits up to `limit` for a message containing `needle`.
    fn wait_for(&self, needle: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        let mut buf = [0u8; 4096];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "no notification containing {needle:?}");
            self.sock.set_read_timeout(Some(left)).unwrap();
            if let Ok(n) = self.sock.recv(&mut buf) {
                let m = String::from_utf8_lossy(&buf[..n]).to_string();
                if m.contains(needle) {
                    return m;
                }
            }
        }
    }
}

fn watchdogs(msgs: &[String]) -> usize {
    msgs.iter()
        .filter(|m| m.lines().any(|l| l == "WATCHDOG=1"))
        .count()
}

#[test]
fn ready_status_watchdog_and_stopping_reach_the_service_manager() {
    let root = private_dir();
    let dir = state_dir(root.path());
    populate(&dir, 3);
    let sock_path = root.path().join("notify.sock");
    let notes = Notifications {
        sock: UnixDatagram::bind(&sock_path).unwrap(),
    };
    let stall = root.path().join("stall");
    let mut child = Command::new(BIN)
        .args([
            "serve",
            "--state-dir",
            dir.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ])
        .env_clear()
        .env("NOTIFY_SOCKET", &sock_path)
        .env("WATCHDOG_USEC", "400000")
        .env("TASKGATE_TEST_STALL_FILE", &stall)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();

    let ready = notes.wait_for("READY=1", Duration::from_secs(30));
    let status = ready
        .lines()
        .find_map(|l| l.strip_prefix("STATUS="))
        .expect("READY comes with a STATUS line")
        .to_string();
    assert!(status.contains(dir.to_str().unwrap()), "{status}");
    assert!(status.contains("retained 3, unexpired 3"), "{status}");
    let port: u16 = status
        .split("serving on 127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split(';').next())
        .and_then(|p| p.parse().ok())
        .expect("status names the port");
    assert!(http_get(port, "/healthz").starts_with("HTTP/1.1 200"));
    assert!(http_get(port, "/readyz").starts_with("HTTP/1.1 200"));

    // Pings every 200 ms while the store thread answers.
    let healthy = notes.collect_for(Duration::from_secs(2));
    assert!(watchdogs(&healthy) >= 4, "{healthy:?}");

    // Hang the store thread: the pings stop, the process stays alive.
    std::fs::write(&stall, "").unwrap();
    let _grace = notes.collect_for(Duration::from_millis(800));
    let hung = notes.collect_for(Duration::from_secs(2));
    assert_eq!(
        watchdogs(&hung),
        0,
        "pinged while the store thread hung: {hung:?}"
    );
    assert!(http_get(port, "/healthz").starts_with("HTTP/1.1 200"));

    // Released, it answers again and the pings resume.
    std::fs::remove_file(&stall).unwrap();
    notes.wait_for("WATCHDOG=1", Duration::from_secs(5));

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    notes.wait_for("STOPPING=1", Duration::from_secs(10));
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    assert!(!dir.join("tasks.db-wal").exists(), "clean stop checkpoints");
}

#[test]
fn a_refused_start_leaves_its_reason_in_status() {
    let root = private_dir();
    let dir = state_dir(root.path());
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let sock_path = root.path().join("notify.sock");
    let notes = Notifications {
        sock: UnixDatagram::bind(&sock_path).unwrap(),
    };
    let out = Command::new(BIN)
        .args(["serve", "--state-dir", dir.to_str().unwrap()])
        .env_clear()
        .env("NOTIFY_SOCKET", &sock_path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(77));
    let m = notes.wait_for("STATUS=", Duration::from_secs(5));
    assert!(m.contains("unsafe path") && m.contains("chmod 700"), "{m}");
    assert!(!m.contains("READY=1"));
}
