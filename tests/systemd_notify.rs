//! The service-manager protocol observed for real: a unix datagram socket
//! stands in for systemd as NOTIFY_SOCKET while the real binary serves.
//! READY=1 and STATUS= after startup, WATCHDOG=1 while the store thread
//! answers and, while it hangs, none but a STATUS= notice for each ping
//! withheld, STOPPING=1 on SIGTERM, then exit 0.
//!
//! What this file proves: READY/STATUS/WATCHDOG/STOPPING on a real datagram
//! socket; a hung store thread stops the pings: consecutive `WATCHDOG WITHHELD`
//! notices with no WATCHDOG=1 and no other STATUS= between them (the socket's
//! order, no time window), then pings and the counts back once it answers

mod common;

use std::time::Duration;

use common::*;
use nix::sys::signal::Signal;

/// The STATUS= notice of a withheld watchdog ping.
const WITHHELD: &str = "STATUS=WATCHDOG WITHHELD:";

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

    // Pings (every 200 ms) while the store thread answers; a deadline only
    // fails a daemon that stopped pinging.
    for _ in 0..4 {
        daemon.wait_for("WATCHDOG=1", Duration::from_secs(10));
    }

    // Hang the store thread: each ping the watchdog then withholds is a
    // STATUS= notice saying so. Between consecutive notices no WATCHDOG=1
    // and no other STATUS= may come: the order on the socket, not a time
    // window, shows the pings stopped and the counts did not hide it.
    std::fs::write(&stall, "").unwrap();
    let (first, _) = daemon.wait_for_collecting(WITHHELD, Duration::from_secs(10));
    assert!(
        first.contains("the task store has not answered")
            && first.contains("check the disk holding the state directory")
            && first.contains(dir.to_str().unwrap()),
        "{first}"
    );
    for _ in 0..5 {
        let (_, between) = daemon.wait_for_collecting(WITHHELD, Duration::from_secs(10));
        assert_eq!(
            watchdogs(&between),
            0,
            "pinged while the store thread hung: {between:?}"
        );
        assert!(
            !between.iter().any(|m| m.contains("STATUS=")),
            "another status replaced the withheld notice: {between:?}"
        );
    }
    // The process itself still answers.
    assert!(http_get(port, "/healthz").starts_with("HTTP/1.1 200"));

    // Released, it answers again: the pings resume and the counts replace
    // the notice.
    std::fs::remove_file(&stall).unwrap();
    daemon.wait_for("WATCHDOG=1", Duration::from_secs(10));
    let (back, between) = daemon.wait_for_collecting("STATUS=", Duration::from_secs(10));
    assert!(
        back.contains("STATUS=serving on") && back.contains("retained 3, unexpired 3"),
        "{back} (after {between:?})"
    );

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
