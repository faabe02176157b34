//! The service-manager protocol observed for real: a unix datagram socket
//! stands in for systemd as NOTIFY_SOCKET while the real binary serves.
//! READY=1 and STATUS= after startup, WATCHDOG=1 while the store thread
//! answers and none while it hangs, STOPPING=1 on SIGTERM, then exit 0.

mod common;

use std::time::Duration;

use common::*;
use nix::sys::signal::Signal;

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
    let stall = root.path().join("stall");
    let mut daemon = Daemon::builder()
        .state_dir(&dir)
        .env("WATCHDOG_USEC", "400000")
        .env("TASKGATE_TEST_STALL_FILE", &stall)
        .start();

    let status = daemon.status.clone();
    assert!(status.contains(dir.to_str().unwrap()), "{status}");
    assert!(status.contains("retained 3, unexpired 3"), "{status}");
    let port = daemon.port;
    assert!(http_get(port, "/healthz").starts_with("HTTP/1.1 200"));
    assert!(http_get(port, "/readyz").starts_with("HTTP/1.1 200"));

    // Pings every 200 ms while the store thread answers.
    let healthy = daemon.collect_for(Duration::from_secs(2));
    assert!(watchdogs(&healthy) >= 4, "{healthy:?}");

    // Hang the store thread: the pings stop, the process stays alive.
    std::fs::write(&stall, "").unwrap();
    let _grace = daemon.collect_for(Duration::from_millis(800));
    let hung = daemon.collect_for(Duration::from_secs(2));
    assert_eq!(
        watchdogs(&hung),
        0,
        "pinged while the store thread hung: {hung:?}"
    );
    assert!(http_get(port, "/healthz").starts_with("HTTP/1.1 200"));

    // Released, it answers again and the pings resume.
    std::fs::remove_file(&stall).unwrap();
    daemon.wait_for("WATCHDOG=1", Duration::from_secs(5));

    daemon.signal(Signal::SIGTERM);
    daemon.wait_for("STOPPING=1", Duration::from_secs(10));
    let status = daemon.wait_exit(Duration::from_secs(30));
    assert_eq!(status.code(), Some(0));
    assert!(!dir.join("tasks.db-wal").exists(), "clean stop checkpoints");
}

#[test]
fn a_refused_start_leaves_its_reason_in_status() {
    let root = private_dir();
    let dir = state_dir(root.path());
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut daemon = Daemon::builder().state_dir(&dir).spawn();
    let status = daemon.wait_exit(Duration::from_secs(30));
    assert_eq!(status.code(), Some(77));
    let notes = daemon.notifications().to_vec();
    let m = notes
        .iter()
        .find(|m| m.contains("STATUS="))
        .unwrap_or_else(|| panic!("no STATUS= among {notes:?}"));
    assert!(m.contains("unsafe path") && m.contains("chmod 700"), "{m}");
    assert!(
        !notes.iter().any(|m| m.contains("READY=1")),
        "a refused start sent READY=1: {notes:?}"
    );
}
