//! `taskgate bench --tasks 1000` at its documented defaults (concurrency
//! 32) runs to the end on this machine and writes well-formed outputs,
//! with the daemon configured for the load it drives. The figures
//! themselves are not judged here: a benchmark is never a pass/fail timing
//! test.
//!
//! What this file proves: `taskgate bench --tasks 1000` at its default
//! concurrency writes well-formed outputs, records the daemon configuration
//! sized for that load, and meets no busy answer (figures are not judged); the
//! bare rmcp floor always measured (the test builds the example beside the
//! binary; a `--bare-rmcp` that does not exist is reported, not fatal); daemons
//! requiring a static token and a JWT (both refusing a create without it) each
//! complete the same creations, with their CPU per create; the early polls of
//! each poll phase come from the daemon's own `status --json` counters and the
//! peak RSS and early-poll targets are present; `--compare` drives a second
//! real daemon with the same no-op load, finds its process by its listening
//! socket and reports the ratios; a `--compare` URL beyond loopback (an
//! address, a name, https) and a concurrency past the keys' ranges are usage
//! errors, refused before anything is created

mod common;

use common::*;
use serde_json::Value;

/// Builds the bare rmcp example beside the binary under test (where the
/// benchmark looks for it), with the cargo running this test and the
/// profile that built the binary; a whole `cargo test` has built it
/// already, and then this changes nothing.
fn build_bare_rmcp() {
    let bin = std::path::Path::new(BIN);
    let profile_dir = bin.parent().unwrap();
    let profile = match profile_dir.file_name().unwrap().to_str().unwrap() {
        "debug" => "dev".to_string(),
        other => other.to_string(),
    };
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = std::process::Command::new(&cargo);
    build
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["build", "--locked", "--example", "bare_rmcp", "--profile"])
        .arg(&profile);
    // What cargo set for this test process only: a build script that
    // watches one of them (ring's watches CARGO_MANIFEST_DIR) would
    // otherwise be rebuilt here, and again by the next cargo outside.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if ["CARGO_PKG_", "CARGO_BIN_", "CARGO_MANIFEST_"]
            .iter()
            .any(|p| name.starts_with(p))
            || [
                "CARGO_CRATE_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "CARGO_RUSTC_CURRENT_DIR",
                "OUT_DIR",
            ]
            .contains(&name.as_ref())
        {
            build.env_remove(name.as_ref());
        }
    }
    let out = build
        .output()
        .unwrap_or_else(|e| panic!("run {cargo}: {e}"));
    assert!(
        out.status.success(),
        "cargo build --example bare_rmcp --profile {profile} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let built = profile_dir.join("examples/bare_rmcp");
    assert!(
        built.is_file(),
        "cargo built bare_rmcp, but not at {} beside the binary under test",
        built.display()
    );
}

#[test]
fn bench_writes_json_markdown_and_svg() {
    build_bare_rmcp();
    let root = private_dir();
    let out = root.path().join("out");
    let output = taskgate(
        &[
            "bench",
            "--tasks",
            "1000",
            "--dir",
            root.path().to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
        &[("HOME", "/nonexistent")],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    assert!(
        stdout.contains("baseline: 1-row commit") && stdout.contains("peak WAL"),
        "{stdout}"
    );
    assert!(stdout.contains("busy answers (TG_SERVER_BUSY"), "{stdout}");

    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("bench.json")).unwrap()).unwrap();
    assert_eq!(json["parameters"]["tasks"], 1000);
    // The default of --concurrency.
    assert_eq!(json["parameters"]["concurrency"], 32);
    assert!(
        json["parameters"]["busy_retries_per_request"]
            .as_u64()
            .unwrap()
            > 0
    );
    // The daemon was configured for 32 requests at once: every bound such a
    // request passes admits them all (polls too, which count apart from
    // calls), and the store keeps every task.
    let cfg = &json["daemon_config"];
    for (section, key) in [
        ("server", "max_connections"),
        ("server", "max_concurrent_requests"),
        ("server", "reserved_control_requests"),
        ("store", "queue_depth"),
    ] {
        let v = cfg[section][key].as_u64().unwrap_or(0);
        assert!(v >= 32, "{section}.{key} = {v}: {cfg}");
    }
    assert!(
        cfg["store"]["max_live_tasks"].as_u64().unwrap() >= 1500,
        "{cfg}"
    );
    assert!(cfg["tasks"]["max_running"].as_u64().unwrap() >= 1, "{cfg}");
    assert_eq!(cfg["tasks"]["poll_interval_ms"], 50, "{cfg}");
    for key in ["kernel", "filesystem", "cpus"] {
        assert!(!json["host"][key].is_null(), "host.{key}");
    }
    for phase in [
        "noop_serial",
        "noop",
        "serial_create",
        "create",
        "complete_polls",
        "retained_polls",
    ] {
        for p in ["p50_ms", "p95_ms", "p99_ms", "max_ms"] {
            assert!(json[phase]["latency"][p].as_f64().is_some(), "{phase}.{p}");
        }
        // Counted, and none came: no client ever had more than one
        // request in flight, and the daemon admits them all.
        assert_eq!(
            json[phase]["busy_answers"].as_u64(),
            Some(0),
            "{phase}: {}",
            json[phase]
        );
    }
    assert!(
        json["baseline"]["single_row"]["commits_per_sec"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    assert!(json["baseline"]["batch"]["rows_per_sec"].as_f64().unwrap() > 0.0);
    assert!(
        json["ratios"]["create_throughput_to_single_commit_rate"]
            .as_f64()
            .is_some()
    );
    assert!(json["peak_wal_bytes"].as_u64().is_some());
    assert!(json["final_db_bytes"].as_u64().unwrap() > 0);
    let targets = json["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 13);
    // Each target is met, not met, or (null) not measured, saying why.
    for t in targets {
        assert!(t["met"].is_boolean() || t["met"].is_null(), "{t}");
        if t["met"].is_null() {
            assert!(
                t["value"].as_str().unwrap().starts_with("not measured: "),
                "{t}"
            );
        }
    }
    // The bare rmcp server, built beside the binary before the run, is
    // always measured: a floor that could not be measured fails the test.
    let bare = &json["bare_rmcp"];
    assert_eq!(bare["measured"].as_bool(), Some(true), "{bare}");
    let bare_target = targets
        .iter()
        .find(|t| t["name"].as_str().unwrap().contains("bare rmcp"))
        .unwrap();
    assert!(
        bare["cpu_us_per_noop"].as_f64().is_some_and(|v| v > 0.0),
        "{bare}"
    );
    assert!(
        bare["daemon_cpu_to_reference_cpu"].as_f64().is_some(),
        "{bare}"
    );
    assert!(
        bare["noop"]["latency"]["n"].as_u64().unwrap() >= 5000,
        "{bare}"
    );
    assert_eq!(bare["noop"]["busy_answers"], 0, "{bare}");
    assert!(bare_target["met"].is_boolean(), "{bare_target}");
    // The floor: the daemon's CPU per request of each phase was measured
    // (5,000 no-op requests at least), and the ratios to it are reported.
    let cpu = &json["daemon_cpu_per_request"];
    for key in ["noop_us", "create_us", "poll_us"] {
        assert!(cpu[key].as_f64().is_some_and(|v| v > 0.0), "{key}: {cpu}");
    }
    assert!(json["noop"]["latency"]["n"].as_u64().unwrap() >= 5000);
    for key in [
        "serial_create_p50_to_noop_plus_commit_p50",
        "create_throughput_to_noop_throughput",
        "create_cpu_to_noop_cpu",
        "poll_cpu_to_noop_cpu",
    ] {
        assert!(
            json["ratios"][key].as_f64().is_some_and(|v| v > 0.0),
            "{key}"
        );
    }
    assert!(stdout.contains("daemon CPU per request: no-op"), "{stdout}");
    // Every task created was completed (the run would have failed otherwise).
    let created = json["create"]["latency"]["n"].as_u64().unwrap();
    let synchronous = json["synchronous_fallbacks"].as_u64().unwrap();
    assert_eq!(created, 1000);
    assert!(synchronous < 1000);

    // Authentication's cost: the same creations on a daemon requiring a
    // static token and on one requiring a JWT, all of them tasks.
    let auth = &json["auth"];
    assert_eq!(auth["measured"], true, "{auth}");
    assert_eq!(auth["creates"], 1000, "{auth}");
    for mode in ["static_token", "jwt"] {
        assert!(
            auth[mode]["cpu_us_per_create"]
                .as_f64()
                .is_some_and(|v| v > 0.0),
            "{mode}: {auth}"
        );
        assert_eq!(auth[mode]["create"]["latency"]["n"], 1000, "{mode}: {auth}");
        assert_eq!(auth[mode]["create"]["busy_answers"], 0, "{mode}: {auth}");
    }
    assert!(auth["jwt_cpu_to_static_cpu"].as_f64().is_some(), "{auth}");
    assert!(
        targets
            .iter()
            .any(|t| t["name"].as_str().unwrap().contains("JWT") && t["met"].is_boolean()),
        "{targets:?}"
    );

    // A durable submission to a local upstream's task: every submission
    // answered with a route's task (one followed to completion), one at a
    // time and at the run's concurrency, with the routing daemon's CPU.
    let routed = &json["routed"];
    assert_eq!(routed["measured"], true, "{routed}");
    assert_eq!(routed["serial"]["latency"]["n"], 60, "{routed}");
    assert_eq!(routed["concurrent"]["latency"]["n"], 180, "{routed}");
    assert!(
        routed["cpu_us_per_submit"]
            .as_f64()
            .is_some_and(|v| v > 0.0),
        "{routed}"
    );
    assert!(
        routed["submit_cpu_to_create_cpu"].as_f64().is_some(),
        "{routed}"
    );
    let routed_md = std::fs::read_to_string(out.join("bench.md")).unwrap();
    assert!(routed_md.contains("routed submit"), "{routed_md}");

    // What the daemon's poll pacing did in each poll phase, from its own
    // counters: every poll sent is accounted for.
    let early = &json["early_polls"];
    assert_eq!(
        early["complete"]["polls"], json["complete_polls"]["latency"]["n"],
        "{early}"
    );
    assert_eq!(early["retained"]["polls"], 1000, "{early}");
    for phase in ["complete", "retained"] {
        for key in ["held", "from_memory", "store_reads"] {
            assert!(
                early[phase][key].as_u64().is_some(),
                "{phase}.{key}: {early}"
            );
        }
    }
    for name in [
        "daemon peak RSS",
        "early polls held or answered from memory",
    ] {
        let t = targets.iter().find(|t| t["name"] == name).unwrap();
        assert!(t["met"].is_boolean(), "{t}");
    }
    assert!(
        stdout.contains("early polls (before pollIntervalMs"),
        "{stdout}"
    );

    let md = std::fs::read_to_string(out.join("bench.md")).unwrap();
    assert!(md.starts_with("# taskgate bench"));
    assert!(md.contains("| create, JWT, conc. 32 |"), "{md}");
    assert!(md.contains("| baseline: 1-row commit |"));
    assert!(md.contains("| no-op (tools/list), conc. 1 |"), "{md}");
    assert!(md.contains("![latency distribution](latency.svg)"));
    let reserved = cfg["server"]["reserved_control_requests"].as_u64().unwrap();
    assert!(
        md.contains("The benchmark daemon was configured for this load: ")
            && md.contains(&format!("server.reserved_control_requests = {reserved}")),
        "{md}"
    );
    assert!(md.contains("Busy answers (TG_SERVER_BUSY"), "{md}");
    assert!(md.contains("| bare rmcp no-op, conc. 32 |"), "{md}");

    let svg = std::fs::read_to_string(out.join("latency.svg")).unwrap();
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert!(svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("<polyline").count(), 3);
    // Every element that opens either closes itself or is closed.
    let opens = svg.matches("<text").count();
    assert_eq!(opens, svg.matches("</text>").count());

    // The scratch directory (its database included) is gone afterwards.
    let left: Vec<_> = std::fs::read_dir(root.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("taskgate-bench-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// A bare rmcp server that cannot be started is a target not measured, with
/// the reason, never a failed run.
#[test]
fn bench_reports_a_bare_rmcp_it_cannot_start_as_not_measured() {
    let root = private_dir();
    let out = root.path().join("out");
    let missing = root.path().join("no-such-bare-rmcp");
    let output = taskgate(
        &[
            "bench",
            "--tasks",
            "10",
            "--concurrency",
            "2",
            "--bare-rmcp",
            missing.to_str().unwrap(),
            "--dir",
            root.path().to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
        &[("HOME", "/nonexistent")],
    );
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("not measured"), "{stdout}");
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("bench.json")).unwrap()).unwrap();
    let bare = &json["bare_rmcp"];
    assert_eq!(bare["measured"], false, "{bare}");
    assert!(
        bare["reason"]
            .as_str()
            .unwrap()
            .contains("no-such-bare-rmcp"),
        "{bare}"
    );
    let md = std::fs::read_to_string(out.join("bench.md")).unwrap();
    assert!(md.contains("| not measured |"), "{md}");
}

/// `--compare URL` drives another MCP server on this host (here a second
/// real daemon) with the same no-op load, finds its process by the socket
/// it listens on, and reports taskgate's figures as ratios to its.
#[test]
fn bench_compares_with_another_server_on_loopback() {
    let root = private_dir();
    let state = state_dir(root.path());
    let cfg = write_config(root.path(), "", &[Tool::new("echo").script("printf hi")]);
    let other = Daemon::start(&cfg, &state, &root.path().join("other.log"));
    let work = root.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let out = root.path().join("out");
    let url = other.url();
    let output = taskgate(
        &[
            "bench",
            "--tasks",
            "10",
            "--concurrency",
            "2",
            "--compare",
            &url,
            "--dir",
            work.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
        &[("HOME", "/nonexistent")],
    );
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains(&format!("compared with {url}")), "{stdout}");
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("bench.json")).unwrap()).unwrap();
    let compare = &json["compare"];
    assert_eq!(compare["url"], url.as_str(), "{compare}");
    assert_eq!(compare["measured"], true, "{compare}");
    assert_eq!(compare["pid"], other.child.id(), "{compare}");
    assert!(
        compare["cpu_us_per_noop"].as_f64().is_some_and(|v| v > 0.0),
        "{compare}"
    );
    assert!(compare["noop"]["latency"]["n"].as_u64().unwrap() >= 5000);
    for key in [
        "daemon_cpu_to_reference_cpu",
        "noop_throughput_to_reference",
        "noop_p50_to_reference",
        "noop_p99_to_reference",
    ] {
        assert!(
            compare[key].as_f64().is_some_and(|v| v > 0.0),
            "{key}: {compare}"
        );
    }
    let md = std::fs::read_to_string(out.join("bench.md")).unwrap();
    assert!(md.contains("| compare no-op, conc. 2 |"), "{md}");
    assert!(md.contains(&format!("Compared with {url}")), "{md}");
}

/// A `--compare` URL beyond loopback is refused as a usage error before
/// anything is created: the benchmark sends nothing off this host.
#[test]
fn bench_refuses_to_compare_with_a_server_beyond_loopback() {
    let root = private_dir();
    let out = root.path().join("out");
    for url in [
        "http://192.0.2.1:8765/mcp",
        "http://[2001:db8::1]:8765/mcp",
        "http://localhost:8765/mcp",
        "https://127.0.0.1:8765/mcp",
    ] {
        let output = taskgate(
            &[
                "bench",
                "--tasks",
                "10",
                "--compare",
                url,
                "--dir",
                root.path().to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
            ],
            &[("HOME", "/nonexistent")],
        );
        assert_eq!(output.status.code(), Some(64), "{url}: {output:?}");
        let stderr = one_line_stderr(&output);
        assert!(stderr.contains(&format!("--compare {url}")), "{stderr}");
        assert!(!out.exists());
        assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0);
    }
}

/// A concurrency the daemon's ranges cannot serve is a usage error naming
/// the key and the flag's range, refused before anything is created.
#[test]
fn bench_refuses_a_concurrency_the_daemon_cannot_serve() {
    let root = private_dir();
    let out = root.path().join("out");
    let output = taskgate(
        &[
            "bench",
            "--tasks",
            "10",
            "--concurrency",
            "1025",
            "--dir",
            root.path().to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
        &[("HOME", "/nonexistent")],
    );
    assert_eq!(output.status.code(), Some(64), "{output:?}");
    let stderr = one_line_stderr(&output);
    assert!(
        stderr.contains("server.reserved_control_requests")
            && stderr.contains("at most 1024")
            && stderr.contains("--concurrency 1..=1024"),
        "{stderr}"
    );
    assert!(!out.exists());
    assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0);
}
