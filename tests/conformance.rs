//! The official MCP conformance suite's Tasks scenarios against the real
//! daemon (scripts/conformance.sh; Node 22 and the suite come from the npm
//! registry into target/conformance). Every check must pass except those
//! listed, with reasons, in tests/conformance/expected-failures.yaml.

#[test]
fn official_conformance_suite_tasks_scenarios() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = std::process::Command::new("bash")
        .arg(format!("{root}/scripts/conformance.sh"))
        .arg(env!("CARGO_BIN_EXE_taskgate"))
        .output()
        .expect("run scripts/conformance.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(
        out.status.success(),
        "conformance failures:\n{stdout}\n{stderr}"
    );
    assert_eq!(stdout.matches("PASS ").count(), 10, "{stdout}");
}
