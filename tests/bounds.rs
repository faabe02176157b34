//! Every bound in the configuration reference is enforced by a test at the
//! bound and one past it. [`GUARDS`] names, for each bounded key of the
//! key table (`[server]` … `[auth]`, `[[tool]]`, `[[auth.jwt]]`,
//! `[[upstream]]`), the tests that do so (a test file's `file::name`, or a
//! unit test's `src/….rs::name` or `crates/NAME/src/….rs::name`), or why the key is a tunable rather than a limit on
//! what a client or a tool may do; a key added to the table without a row
//! here fails `every_bounded_key_names_the_tests_that_enforce_it`, and so
//! does a row naming a test that does not exist.
//!
//! The bounds no other test exercised are tested here: a spilled result at
//! `tasks.artifact_max_bytes` and one byte past it, the artifact space of
//! `tasks.artifacts_max_total_bytes` filled to the byte, a tool's stderr at
//! `max_stderr_bytes` and one byte past it, and `store.max_live_tasks_per_owner`
//! as a client sees it (the store's side is in `tests/store_behaviour.rs`).
//!
//! Invariant 6 of the map: Every bound is a named constant or a config value,
//! enforced at admission with a clear error. Guarded by:
//! `tests/bounds.rs::every_bounded_key_names_the_tests_that_enforce_it` (the
//! table of bounded keys and their tests, checked against the key table), with
//! the bounds no other test reached: `tests/bounds.rs`
//! (`tasks.artifact_max_bytes`, `tasks.artifacts_max_total_bytes`,
//! `max_stdout_bytes`, `max_stderr_bytes`, `timeout_secs`,
//! `store.max_live_tasks_per_owner` on the wire),
//! `tests/store_behaviour.rs::the_per_owner_live_limit_refuses_only_that_owner_until_its_tasks_expire`,
//! `tests/auth_credentials.rs::jwt_lifetime_and_leeway_are_enforced_at_their_bounds`;
//! `config::tests::every_ranged_key_refuses_both_sides_of_its_range`,
//! `config::tests::every_key_in_the_table_is_read`; `tests/store_behaviour.rs`
//! (queue, live limit, sweep batch); `tests/mcp_limits.rs` and
//! `tests/http_router.rs::a_request_past_the_concurrency_bound_gets_a_json_rpc_503`
//! (connections, requests, running slots, legacy sessions, the header-read
//! timeout); `tasks::polls` unit tests (pacing table and held polls bounded)
//!
//! What this file proves: every bounded key of the key table names the tests
//! that enforce it at and past its limit (or why it is a tunable); a new bound
//! without a row fails; the artifact bounds to the byte, stdout, stderr and the
//! tool timeout at and past their bounds, the per-owner live bound as a client
//! sees it

mod common;

use std::path::Path;

use common::*;
use serde_json::{Value, json};
use taskgate::artifacts::{ArtifactError, Artifacts};
use taskgate::client::ClientError;
use taskgate::config::keys::{JWT_KEYS, KEYS, KeySpec, Kind, TOOL_KEYS, UPSTREAM_KEYS};
use taskgate::store::TaskId;
use taskgate::wire;

/// How a bounded key is guarded.
enum Guard {
    /// Tests that exercise it at the bound and past it: `file::name` for a
    /// test of `tests/file.rs`, `src/path.rs::name` (or
    /// `crates/NAME/src/path.rs::name`) for a unit test.
    Enforced(&'static [&'static str]),
    /// Not a limit on input: a period, a default or a grace, with why.
    Tunable(&'static str),
}
use Guard::*;

/// Every integer key of the key table, by `section.name` (`tool.` for a
/// `[[tool]]` key, `jwt.` for an `[[auth.jwt]]` one, `upstream.` for an
/// `[[upstream]]` one).
const GUARDS: &[(&str, Guard)] = &[
    (
        "approvals.decision_window_secs",
        Tunable(
            "how long a proposal waits for a decision: a period, not a limit on input (its expiry is tested by the gate's unit tests)",
        ),
    ),
    (
        "approvals.execution_window_secs",
        Tunable(
            "how long an approval may be used: a period (a lapsed approval is tested by the gate's unit tests)",
        ),
    ),
    (
        "approvals.poll_interval_ms",
        Tunable("the advertised poll interval of an approval task"),
    ),
    (
        "approvals.segment_max_bytes",
        Enforced(&[
            "crates/journal/src/lib.rs::records_come_back_in_order_across_segments_after_a_reopen",
            "crates/journal/src/lib.rs::records_past_the_frame_limit_are_refused_and_the_bounds_hold",
        ]),
    ),
    (
        "approvals.max_pending",
        Enforced(&["src/approvals/gate.rs::pending_proposals_are_bounded"]),
    ),
    (
        "approvals.max_pending_per_owner",
        Enforced(&["src/approvals/gate.rs::proposals_kept_are_bounded_per_owner_and_in_all"]),
    ),
    (
        "approvals.max_proposals",
        Enforced(&[
            "src/approvals/gate.rs::proposals_kept_are_bounded_per_owner_and_in_all",
            "src/approvals/gate.rs::settled_proposals_are_forgotten_and_only_their_segments_removed",
        ]),
    ),
    (
        "approvals.max_proposals_per_owner",
        Enforced(&["src/approvals/gate.rs::proposals_kept_are_bounded_per_owner_and_in_all"]),
    ),
    (
        "server.max_connections",
        Enforced(&[
            "mcp_limits::silent_slow_and_idle_connections_are_closed_after_the_header_read_timeout",
        ]),
    ),
    (
        "server.max_concurrent_requests",
        Enforced(&["http_router::a_request_past_the_concurrency_bound_gets_a_json_rpc_503"]),
    ),
    (
        "server.reserved_control_requests",
        Enforced(&[
            "mcp_limits::polls_listings_and_cancels_get_through_while_long_calls_hold_every_request_slot",
        ]),
    ),
    (
        "server.max_request_bytes",
        Enforced(&[
            "fuzz_requests::mutated_http_requests_never_crash_hang_or_bloat_the_daemon",
            "mcp_durability::raw_arguments_and_operation_ids_never_reach_the_disk",
        ]),
    ),
    (
        "server.header_read_timeout_ms",
        Enforced(&[
            "mcp_limits::silent_slow_and_idle_connections_are_closed_after_the_header_read_timeout",
        ]),
    ),
    (
        "server.body_read_timeout_ms",
        Enforced(&[
            "mcp_limits::dribbled_bodies_hold_no_request_slot_and_are_cut_off_after_the_body_read_timeout",
        ]),
    ),
    (
        "server.max_sessions",
        Enforced(&[
            "mcp_limits::legacy_sessions_past_the_bound_get_a_json_rpc_503_until_idle_ones_expire",
        ]),
    ),
    (
        "server.session_idle_secs",
        Enforced(&[
            "mcp_limits::legacy_sessions_past_the_bound_get_a_json_rpc_503_until_idle_ones_expire",
        ]),
    ),
    (
        "store.queue_depth",
        Enforced(&[
            "store_behaviour::a_full_queue_is_refused_at_once_and_queued_commits_survive_their_callers",
        ]),
    ),
    (
        "store.max_live_tasks",
        Enforced(&["store_behaviour::the_live_limit_refuses_creation_until_tasks_expire"]),
    ),
    (
        "store.max_live_tasks_per_owner",
        Enforced(&[
            "store_behaviour::the_per_owner_live_limit_refuses_only_that_owner_until_its_tasks_expire",
            "bounds::a_client_past_its_live_task_bound_is_told_which_bound",
        ]),
    ),
    (
        "store.checkpoint_interval_secs",
        Tunable(
            "how often the WAL is checkpointed; the WAL's size is what it bounds, measured by the benchmark",
        ),
    ),
    (
        "store.max_db_pages",
        Enforced(&["fault_injection::the_page_cap_is_a_capacity_error_and_the_sweep_makes_room"]),
    ),
    (
        "tasks.default_ttl_secs",
        Tunable("how long a task is kept; expiry itself is tested in store_behaviour"),
    ),
    (
        "tasks.poll_interval_ms",
        Tunable(
            "the pacing a client is asked to keep; held early polls are bounded in tasks::polls",
        ),
    ),
    (
        "tasks.max_running",
        Enforced(&[
            "mcp_limits::concurrent_requests_and_running_tasks_are_bounded",
            "mcp_limits::synchronous_calls_count_against_max_running_and_are_refused_at_once",
        ]),
    ),
    (
        "tasks.max_running_per_owner",
        Enforced(&["auth_http::per_owner_limits_refuse_only_the_owner_at_its_limit"]),
    ),
    (
        "tasks.cancel_grace_ms",
        Tunable("the time between SIGTERM and SIGKILL of a cancelled tool"),
    ),
    (
        "tasks.artifacts_max_total_bytes",
        Enforced(&[
            "bounds::the_artifact_space_is_filled_to_the_byte_and_no_further",
            "bounds::a_task_whose_result_does_not_fit_the_artifact_space_fails_naming_it",
        ]),
    ),
    (
        "tasks.artifact_max_bytes",
        Enforced(&[
            "bounds::an_artifact_at_its_bound_is_kept_and_one_byte_more_is_refused",
            "bounds::a_task_whose_result_does_not_fit_the_artifact_space_fails_naming_it",
        ]),
    ),
    (
        "tools.max_address_space_bytes",
        Enforced(&["tool_confinement::a_memory_hog_ends_with_the_address_space_limit_named"]),
    ),
    (
        "tools.max_open_files",
        Enforced(&["tool_confinement::tools_section_limits_apply_unless_a_tool_overrides_them"]),
    ),
    (
        "tools.max_processes",
        Enforced(&["tool_confinement::a_fork_bomb_ends_with_the_process_limit_named"]),
    ),
    (
        "tools.max_file_bytes",
        Enforced(&["tool_confinement::a_ten_gib_file_write_ends_with_the_file_size_limit_named"]),
    ),
    (
        "tools.max_cpu_secs",
        Enforced(&["tool_confinement::a_cpu_spinner_ends_with_the_cpu_limit_named"]),
    ),
    (
        "tool.timeout_secs",
        Enforced(&["bounds::output_at_its_bound_is_kept_and_one_byte_more_fails_the_call"]),
    ),
    (
        "tool.max_stdout_bytes",
        Enforced(&[
            "bounds::output_at_its_bound_is_kept_and_one_byte_more_fails_the_call",
            "mcp_limits::an_output_cap_ends_the_call_at_once_while_stderr_stays_open",
        ]),
    ),
    (
        "tool.max_stderr_bytes",
        Enforced(&["bounds::output_at_its_bound_is_kept_and_one_byte_more_fails_the_call"]),
    ),
    (
        "tool.max_address_space_bytes",
        Enforced(&["tool_confinement::a_memory_hog_ends_with_the_address_space_limit_named"]),
    ),
    (
        "tool.max_open_files",
        Enforced(&["tool_confinement::tools_section_limits_apply_unless_a_tool_overrides_them"]),
    ),
    (
        "tool.max_processes",
        Enforced(&["tool_confinement::a_fork_bomb_ends_with_the_process_limit_named"]),
    ),
    (
        "tool.max_file_bytes",
        Enforced(&["tool_confinement::a_ten_gib_file_write_ends_with_the_file_size_limit_named"]),
    ),
    (
        "tool.max_cpu_secs",
        Enforced(&["tool_confinement::a_cpu_spinner_ends_with_the_cpu_limit_named"]),
    ),
    (
        "jwt.max_token_lifetime_secs",
        Enforced(&["auth_credentials::jwt_lifetime_and_leeway_are_enforced_at_their_bounds"]),
    ),
    (
        "jwt.leeway_secs",
        Enforced(&["auth_credentials::jwt_lifetime_and_leeway_are_enforced_at_their_bounds"]),
    ),
    // A mute upstream with `connect_timeout_secs = 1` is unavailable past
    // it, naming the key, while the others connect within the default.
    (
        "upstream.connect_timeout_secs",
        Enforced(&[
            "upstream_sources::hostile_upstreams_end_in_bounded_named_errors_while_the_rest_keeps_working",
        ]),
    ),
    // A hanging call with `request_timeout_secs = 2` ends in
    // `TG_UPSTREAM_TIMEOUT` naming it; quick calls complete within it.
    (
        "upstream.request_timeout_secs",
        Enforced(&[
            "upstream_sources::hostile_upstreams_end_in_bounded_named_errors_while_the_rest_keeps_working",
        ]),
    ),
    // A 100 MiB answer refused at the default 16 MiB, naming the key; a
    // line exactly at the limit passes and a longer one ends the stream.
    (
        "upstream.max_response_bytes",
        Enforced(&[
            "upstream_sources::hostile_upstreams_end_in_bounded_named_errors_while_the_rest_keeps_working",
            "src/upstream/transport.rs::whole_json_lines_pass_and_anything_else_ends_the_stream",
        ]),
    ),
    // At `max_concurrent_requests = 1` one call is in flight; the next is
    // refused with `TG_UPSTREAM_BUSY` and nothing reaches the upstream.
    (
        "upstream.max_concurrent_requests",
        Enforced(&[
            "upstream_sources::the_concurrency_bound_refuses_past_it_sending_nothing_and_a_caller_leaving_cancels_upstream",
        ]),
    ),
    // One tool listed at `max_tools = 1` is served; 100,000 past the
    // default 1000 (paged, and in one page) are refused whole; in the
    // reader, a list at the bound passes and one past it is refused.
    (
        "upstream.max_tools",
        Enforced(&[
            "upstream_sources::hostile_upstreams_end_in_bounded_named_errors_while_the_rest_keeps_working",
            "src/upstream/transport.rs::whole_json_lines_pass_and_anything_else_ends_the_stream",
        ]),
    ),
];

fn dotted(prefix: Option<&str>, k: &KeySpec) -> String {
    match prefix {
        Some(p) => format!("{p}.{}", k.name),
        None => format!("{}.{}", k.section.name(), k.name),
    }
}

#[test]
fn every_bounded_key_names_the_tests_that_enforce_it() {
    let mut keys = Vec::new();
    for (prefix, table) in [
        (None, KEYS),
        (Some("tool"), TOOL_KEYS),
        (Some("jwt"), JWT_KEYS),
        (Some("upstream"), UPSTREAM_KEYS),
    ] {
        for k in table {
            if matches!(k.kind, Kind::Int(_)) {
                keys.push(dotted(prefix, k));
            }
        }
    }
    let mut problems = Vec::new();
    for key in &keys {
        match GUARDS.iter().filter(|(k, _)| k == key).count() {
            0 => problems.push(format!(
                "{key} is a bound in the key table with no row in GUARDS: name the tests that enforce it at and past its limit"
            )),
            1 => {}
            n => problems.push(format!("{key} has {n} rows in GUARDS")),
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (key, guard) in GUARDS {
        if !keys.iter().any(|k| k == key) {
            problems.push(format!("GUARDS lists {key}, which is no bounded key"));
        }
        match guard {
            Enforced(names) => {
                assert!(!names.is_empty(), "{key}: Enforced by no test");
                for name in *names {
                    let (file, test) = name.rsplit_once("::").unwrap();
                    // A unit test is named by its source file (in a
                    // crate of crates/ too), a test of tests/ by its
                    // file's stem.
                    let shown = if file.starts_with("src/") || file.starts_with("crates/") {
                        file.to_string()
                    } else {
                        format!("tests/{file}.rs")
                    };
                    let text = std::fs::read_to_string(root.join(&shown)).unwrap_or_default();
                    if !text.contains(&format!("fn {test}()")) {
                        problems.push(format!("{key}: {shown} has no test {test}"));
                    }
                }
            }
            Tunable(why) => assert!(!why.is_empty(), "{key}: say why it is not a bound"),
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

fn id() -> TaskId {
    TaskId::generate().unwrap()
}

/// A result of about `n` bytes.
fn result(n: usize) -> Value {
    json!({"content": [{"type": "text", "text": "r".repeat(n)}]})
}

/// The bytes an artifact of `r` takes, learnt from one written without
/// bounds.
fn stored_size(r: &Value) -> u64 {
    let root = private_dir();
    let a = Artifacts::open(root.path(), 1 << 30, 1 << 30).unwrap();
    a.write(&id(), &owner(), r).unwrap()
}

#[test]
fn an_artifact_at_its_bound_is_kept_and_one_byte_more_is_refused() {
    let r = result(20_000);
    let size = stored_size(&r);
    let root = private_dir();
    let at = Artifacts::open(root.path(), size, 1 << 30).unwrap();
    assert_eq!(at.write(&id(), &owner(), &r).unwrap(), size);
    let root = private_dir();
    let below = Artifacts::open(root.path(), size - 1, 1 << 30).unwrap();
    match below.write(&id(), &owner(), &r) {
        Err(e @ ArtifactError::TooLarge { .. }) => {
            assert!(e.to_string().contains("tasks.artifact_max_bytes"), "{e}");
        }
        other => panic!("one byte past the bound: {other:?}"),
    }
    assert_eq!(below.used_bytes(), 0, "a refused write holds no space");
    assert_eq!(
        std::fs::read_dir(root.path().join("artifacts"))
            .unwrap()
            .count(),
        0,
        "a refused write leaves no file"
    );
}

#[test]
fn the_artifact_space_is_filled_to_the_byte_and_no_further() {
    let r = result(20_000);
    let size = stored_size(&r);
    let root = private_dir();
    let a = Artifacts::open(root.path(), 1 << 30, 2 * size).unwrap();
    let first = id();
    a.write(&first, &owner(), &r).unwrap();
    a.write(&id(), &owner(), &r).unwrap();
    assert_eq!(a.used_bytes(), 2 * size);
    match a.write(&id(), &owner(), &result(1)) {
        Err(e @ ArtifactError::Full { .. }) => {
            assert!(
                e.to_string().contains("tasks.artifacts_max_total_bytes"),
                "{e}"
            );
        }
        other => panic!("past the full space: {other:?}"),
    }
    // Room comes back when an artifact goes (its task expired).
    a.remove(&first).unwrap();
    a.write(&id(), &owner(), &r).unwrap();
    assert_eq!(a.used_bytes(), 2 * size);
    // Counted again from disk at the next start.
    let again = Artifacts::open(root.path(), 1 << 30, 2 * size).unwrap();
    assert_eq!(again.used_bytes(), 2 * size);
}

/// The `[tasks]` section every daemon here runs with.
const TASKS: &str = "[tasks]\npoll_interval_ms = 50\n";

/// A shell tool that may run as a task, with `limits` (TOML lines).
fn tool(name: &str, script: &str, limits: &str) -> Tool {
    Tool::new(name)
        .script(script)
        .task("optional")
        .extra(limits)
}

/// Calls `name` as a task and returns its terminal state.
async fn run_task(c: &taskgate::client::Client, name: &str) -> Value {
    let first = c.call_tool(name, json!({}), None).await.unwrap();
    assert_eq!(first["resultType"], "task", "{first}");
    let id = first["taskId"].as_str().unwrap().to_string();
    c.wait_task(&id, &first).await.unwrap()
}

/// `max_stdout_bytes` and `max_stderr_bytes` (4096 here): exactly the
/// bound is kept, one byte more fails the call naming the stream and the
/// bound. `timeout_secs` (1 here): a tool that ends in time completes, one
/// still running at the bound is killed and fails naming it.
#[test]
fn output_at_its_bound_is_kept_and_one_byte_more_fails_the_call() {
    let root = private_dir();
    let state = state_dir(root.path());
    let limits = "max_stdout_bytes = 4096\nmax_stderr_bytes = 4096\ntimeout_secs = 1";
    let cfg = write_config(
        root.path(),
        TASKS,
        &[
            tool("out-at", "head -c 4096 /dev/zero | tr '\\0' a", limits),
            tool("out-past", "head -c 4097 /dev/zero | tr '\\0' a", limits),
            tool("err-at", "head -c 4096 /dev/zero >&2; printf done", limits),
            tool(
                "err-past",
                "head -c 4097 /dev/zero >&2; printf done",
                limits,
            ),
            tool("in-time", "printf done", limits),
            tool("too-slow", "sleep 30", limits),
        ],
    );
    let daemon = Daemon::start(&cfg, &state, &root.path().join("log"));
    let rt = runtime();
    rt.block_on(async {
        let c = daemon.client(true);
        for name in ["out-at", "err-at", "in-time"] {
            let done = run_task(&c, name).await;
            assert_eq!(done["status"], "completed", "{name}: {done}");
        }
        let out = run_task(&c, "out-at").await;
        let text = out.to_string();
        assert!(text.contains(&"a".repeat(4096)), "the whole output is kept");
        for (name, needles) in [
            ("out-past", [wire::TOOL_OUTPUT_LIMIT.name, "stdout", "4096"]),
            ("err-past", [wire::TOOL_OUTPUT_LIMIT.name, "stderr", "4096"]),
            ("too-slow", [wire::TOOL_TIMEOUT.name, "timed out", "1 s"]),
        ] {
            let failed = run_task(&c, name).await;
            assert_eq!(failed["status"], "failed", "{name}: {failed}");
            let text = failed.to_string();
            for n in needles {
                assert!(text.contains(n), "{name}: {n:?} not in {text}");
            }
        }
    });
    assert!(daemon.stop().success());
}

#[test]
fn a_task_whose_result_does_not_fit_the_artifact_space_fails_naming_it() {
    let root = private_dir();
    let state = state_dir(root.path());
    // Results of 600 KiB: one fits the 1 MiB space, a second does not; a
    // result of 1.1 MiB is past the single-artifact bound.
    let cfg = write_config(
        root.path(),
        &format!("{TASKS}artifacts_max_total_bytes = 1048576\nartifact_max_bytes = 1048576\n"),
        &[
            tool(
                "big",
                "head -c 614400 /dev/zero | tr '\\0' a",
                "max_stdout_bytes = 2097152",
            ),
            tool(
                "huge",
                "head -c 1153434 /dev/zero | tr '\\0' a",
                "max_stdout_bytes = 2097152",
            ),
        ],
    );
    let daemon = Daemon::start(&cfg, &state, &root.path().join("log"));
    let rt = runtime();
    rt.block_on(async {
        let c = daemon.client(true);
        let huge = run_task(&c, "huge").await;
        assert_eq!(huge["status"], "failed", "{huge}");
        let text = huge.to_string();
        assert!(text.contains(wire::RESULT_TOO_LARGE.name), "{text}");
        assert!(text.contains("tasks.artifact_max_bytes"), "{text}");
        let first = run_task(&c, "big").await;
        assert_eq!(first["status"], "completed", "{first}");
        let second = run_task(&c, "big").await;
        assert_eq!(second["status"], "failed", "{second}");
        let text = second.to_string();
        assert!(text.contains(wire::RESULT_TOO_LARGE.name), "{text}");
        assert!(text.contains("tasks.artifacts_max_total_bytes"), "{text}");
    });
    assert!(daemon.stop().success());
    // Only the one that fitted is on disk.
    let files = std::fs::read_dir(state.join("artifacts")).unwrap().count();
    assert_eq!(files, 1);
}

#[test]
fn a_client_past_its_live_task_bound_is_told_which_bound() {
    let root = private_dir();
    let state = state_dir(root.path());
    let cfg = write_config(
        root.path(),
        &format!("{TASKS}[store]\nmax_live_tasks_per_owner = 2\n"),
        &[tool("quick", "printf done", "")],
    );
    let daemon = Daemon::start(&cfg, &state, &root.path().join("log"));
    let rt = runtime();
    rt.block_on(async {
        let c = daemon.client(true);
        for _ in 0..2 {
            let done = run_task(&c, "quick").await;
            assert_eq!(done["status"], "completed", "{done}");
        }
        match c.call_tool("quick", json!({}), None).await {
            Err(ClientError::Rpc { code, message, .. }) => {
                assert_eq!(code, wire::OWNER_LIMIT.code);
                assert!(
                    message.contains("store.max_live_tasks_per_owner"),
                    "{message}"
                );
            }
            other => panic!("past the bound: {other:?}"),
        }
    });
    assert!(daemon.stop().success());
}
