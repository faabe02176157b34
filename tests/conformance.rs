//! The official MCP conformance suite's Tasks scenarios against the real
//! daemon (scripts/conformance.sh; Node 22 and the suite come from the npm
//! registry into target/conformance). Every check must pass except those
//! listed, with reasons, in tests/conformance/expected-failures.yaml.

mod common;

use common::*;

#[test]
fn official_conformance_suite_tasks_scenarios() {
    prereq::require_tool("npm");
    let root = env!("CARGO_MANIFEST_DIR");
    let dir = private_dir();
    let state = state_dir(dir.path());
    let daemon = Daemon::builder()
        .config(&std::path::Path::new(root).join("examples/conformance.toml"))
        .state_dir(&state)
        .log(&dir.path().join("taskgate.log"))
        .start();
    let out = std::process::Command::new("bash")
        .arg(format!("{root}/scripts/conformance.sh"))
        .arg(BIN)
        .env("TASKGATE_CONFORMANCE_URL", daemon.url())
        .output()
        .expect("run scripts/conformance.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    let log = daemon.log_text();
    assert!(daemon.stop().success(), "daemon log:\n{log}");
    assert!(
        out.status.success(),
        "conformance failures:\n{stdout}\n{stderr}"
    );
    assert_eq!(stdout.matches("PASS ").count(), 10, "{stdout}");
}
