//! What the daemon writes to its log, through the real binary: requests a
//! client got wrong are the client's errors, not warnings in our log, and
//! the messages an operator reads carry their values in the text (the
//! journal shows only the text unless asked for every field).
//!
//! What this file proves: client mistakes leave no warning in the log; start
//! and ready messages carry their values in the text

mod common;

use common::*;
use serde_json::json;

/// One refused request used to leave one rmcp WARN line with a Debug dump
/// of the error ("response error"), so a client polling an unknown task
/// wrote a warning into the journal at every poll.
#[test]
fn refused_requests_leave_no_warning_in_the_log() {
    let root = private_dir();
    let state = state_dir(root.path());
    let d = Daemon::builder().state_dir(&state).start();
    let rt = runtime();
    rt.block_on(async {
        let c = d.client(true);
        for i in 0..5 {
            let e = c.get_task(&format!("tg-unknown-{i}")).await;
            assert!(e.is_err(), "an unknown task is refused");
        }
        let e = c.call_tool("no-such-tool", json!({}), None).await;
        assert!(e.is_err(), "an unknown tool is refused");
    });
    let log = d.log_text();
    assert!(d.stop().success());
    for line in log.lines() {
        assert!(
            !line.contains(" WARN ") && !line.contains(" ERROR "),
            "a client's mistake logged as a warning: {line}"
        );
    }
    assert!(!log.contains("response error"), "{log}");
}

/// The start and ready lines name the state directory, the counts and the
/// address in their text, not only in fields.
#[test]
fn start_and_ready_messages_carry_their_values_in_the_text() {
    let root = private_dir();
    let state = state_dir(root.path());
    populate(&state, 3);
    let d = Daemon::builder().state_dir(&state).start();
    let url = d.url();
    let log = d.log_text();
    assert!(d.stop().success());
    let canonical = std::fs::canonicalize(&state).unwrap();
    let open = format!(
        "task store open in {}: 3 tasks retained (3 unexpired)",
        canonical.display()
    );
    assert!(log.contains(&open), "{open:?} not in {log}");
    let ready = format!("serving MCP over HTTP at {url}");
    assert!(log.contains(&ready), "{ready:?} not in {log}");
    // The journal's message ID is for the journal; it stays out of a
    // plain-text log.
    assert!(!log.contains("message_id"), "{log}");
}

/// `journalctl` shows a message's text, not its fields: an event at info
/// or above that carries an error or a path as a field must also carry it
/// in its text. A scan of the source, so that a new event cannot forget.
#[test]
fn events_that_carry_an_error_or_a_path_say_it_in_their_text() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    let mut dirs = vec![src];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    let mut bad = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for macro_ in ["tracing::info!(", "tracing::warn!(", "tracing::error!("] {
            for (at, _) in text.match_indices(macro_) {
                // The event's arguments: up to the matching parenthesis.
                let rest = &text[at + macro_.len()..];
                let mut depth = 1;
                let end = rest
                    .char_indices()
                    .find(|(_, c)| {
                        match c {
                            '(' => depth += 1,
                            ')' => depth -= 1,
                            _ => {}
                        }
                        depth == 0
                    })
                    .map(|(i, _)| i)
                    .unwrap_or(rest.len());
                let args = &rest[..end];
                let carries = ["error = %", "socket = %", "dest = %", "path = %"]
                    .iter()
                    .any(|f| args.contains(f));
                let message = args
                    .rsplit_once('"')
                    .and_then(|(head, _)| head.rsplit_once('"'));
                let said = message.is_some_and(|(_, m)| m.contains('{')) || args.contains("\"{");
                if carries && !said {
                    let line = text[..at].lines().count() + 1;
                    bad.push(format!("{}:{line}", f.display()));
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "values only in fields, not in the text: {bad:?}"
    );
}
