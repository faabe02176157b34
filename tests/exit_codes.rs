//! Exit codes are a contract with systemd and with operators' scripts: the
//! unit's `RestartPreventExitStatus=` is exactly the set of classes that
//! prevent a restart, the operator commands exit with their documented
//! codes, and a reader that goes away (`| head`) ends the output quietly.
//!
//! What this file proves: operator exit codes, the unit's
//! `RestartPreventExitStatus=`, a closed stdout

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::*;
use taskgate::exit::ExitClass;

fn code(class: ExitClass) -> Option<i32> {
    Some(class.code().into())
}

/// The operator commands' codes are documented (README.md,
/// docs/operations.md, `taskgate call --help`): they never change.
#[test]
fn operator_codes_are_the_documented_ones() {
    assert_eq!(
        [
            ExitClass::CallFailed,
            ExitClass::Usage,
            ExitClass::Unreachable,
            ExitClass::Protocol
        ]
        .map(code),
        [Some(1), Some(64), Some(69), Some(76)]
    );
}

#[test]
fn restart_prevent_exit_status_lists_exactly_the_non_retryable_classes() {
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/taskgate.service"),
    )
    .unwrap();
    let lines: Vec<&str> = unit
        .lines()
        .filter_map(|l| l.trim().strip_prefix("RestartPreventExitStatus="))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "one RestartPreventExitStatus= line: {lines:?}"
    );
    let listed: BTreeSet<u8> = lines[0]
        .split_whitespace()
        .map(|c| c.parse().unwrap_or_else(|_| panic!("not a code: {c}")))
        .collect();
    let expected: BTreeSet<u8> = ExitClass::ALL
        .iter()
        .filter(|c| c.prevents_restart())
        .map(|c| c.code())
        .collect();
    assert_eq!(listed, expected);
    assert!(!expected.is_empty());

    // Each class has its own code, and none is 0 (success).
    let codes: BTreeSet<u8> = ExitClass::ALL.iter().map(|c| c.code()).collect();
    assert_eq!(
        codes.len(),
        ExitClass::ALL.len(),
        "two classes share a code"
    );
    assert!(!codes.contains(&0));
}

/// Every class has a row in the README's exit-code table.
#[test]
fn every_exit_class_is_documented() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    for class in ExitClass::ALL {
        let code = class.code();
        assert!(
            readme.contains(&format!("\n| {code} |")),
            "README.md has no row for exit {code} ({class})"
        );
    }
}

#[test]
fn call_to_a_port_where_nothing_listens_is_unreachable() {
    // A port that was free a moment ago and has no listener now.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/mcp");
    let out = taskgate(&["call", "anything", "--url", &url], &[]);
    assert_eq!(out.status.code(), code(ExitClass::Unreachable), "{out:?}");
    assert!(one_line_stderr(&out).contains("cannot reach"), "{out:?}");

    let out = taskgate(&["task", "get", "tg-x", "--url", &url], &[]);
    assert_eq!(out.status.code(), Some(69), "{out:?}");

    let out = taskgate(&["call", "anything", "--url", "ftp://x/"], &[]);
    assert_eq!(out.status.code(), code(ExitClass::Usage), "{out:?}");
    let out = taskgate(&["call", "anything", "--args", "[1]", "--url", &url], &[]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(one_line_stderr(&out).contains("--args"), "{out:?}");
}

const TOOLS: &str = r#"
[[tool]]
name = "hello"
argv = ["/bin/echo", "hello"]

[[tool]]
name = "fails"
argv = ["/bin/false"]
"#;

#[test]
fn operator_commands_exit_with_their_documented_codes() {
    let root = private_dir();
    let state = state_dir(root.path());
    let config = root.path().join("c.toml");
    std::fs::write(&config, TOOLS).unwrap();
    let daemon = Daemon::start(&config, &state, &root.path().join("log"));
    let url = daemon.url();

    let out = taskgate(&["call", "hello", "--url", &url], &[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("hello"));

    // The tool ran and exited non-zero: a result with isError.
    let out = taskgate(&["call", "fails", "--url", &url], &[]);
    assert_eq!(out.status.code(), code(ExitClass::CallFailed), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"isError\": true"));

    // A JSON-RPC error: printed as {"error": …} on stdout.
    let out = taskgate(&["call", "no_such_tool", "--url", &url], &[]);
    assert_eq!(out.status.code(), code(ExitClass::Protocol), "{out:?}");
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(printed["error"]["code"].is_i64(), "{printed}");

    let out = taskgate(&["task", "get", "tg-unknown", "--url", &url], &[]);
    assert_eq!(out.status.code(), Some(76), "{out:?}");
    daemon.stop();
}

/// Runs the binary with stdout a pipe whose read end is already closed, as
/// `taskgate … | head` is once head has exited.
fn with_closed_stdout(args: &[&str]) -> Output {
    let (read, write) = nix::unistd::pipe().unwrap();
    drop(read);
    Command::new(BIN)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", "/nonexistent")
        .stdin(Stdio::null())
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

fn assert_quiet(out: &Output, code: i32) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
        "{stderr}"
    );
    assert_eq!(out.status.code(), Some(code), "{stderr}");
}

/// Defect 10: `taskgate call … | head` panicked with "failed printing to
/// stdout: Broken pipe".
#[test]
fn a_closed_stdout_ends_the_output_quietly() {
    let root = private_dir();
    let state = state_dir(root.path());
    assert_quiet(
        &with_closed_stdout(&["check", "--state-dir", state.to_str().unwrap()]),
        0,
    );
    assert_quiet(&with_closed_stdout(&["init"]), 0);

    let config = root.path().join("c.toml");
    std::fs::write(&config, TOOLS).unwrap();
    let daemon = Daemon::start(&config, &state, &root.path().join("log"));
    let url = daemon.url();
    assert_quiet(&with_closed_stdout(&["call", "hello", "--url", &url]), 0);
    // The exit status is still the call's own.
    assert_quiet(
        &with_closed_stdout(&["call", "fails", "--url", &url]),
        ExitClass::CallFailed.code().into(),
    );
    daemon.stop();
}

/// Scripts read taskgate's own JSON-RPC codes from `taskgate wire-codes`
/// (the system test does): it lists exactly the registry, as JSON and as
/// tab-separated lines.
#[test]
fn wire_codes_lists_the_registry() {
    let out = taskgate(&["wire-codes", "--json"], &[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let expected: Vec<serde_json::Value> = taskgate::wire::ALL
        .iter()
        .map(|w| serde_json::json!({"code": w.code, "name": w.name, "help": w.help}))
        .collect();
    assert_eq!(listed, serde_json::Value::from(expected));
    let out = taskgate(&["wire-codes"], &[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), taskgate::wire::ALL.len());
    for (line, w) in lines.iter().zip(taskgate::wire::ALL) {
        assert_eq!(*line, format!("{}\t{}\t{}", w.code, w.name, w.help));
    }
}
