//! Upstream MCP servers as sources of tools, against the real daemon and
//! real upstream processes: servers that die mid-call, hang, answer 100 MiB
//! or garbage, refuse, list 100,000 tools or never answer the handshake
//! each end in a bounded, named error while the other tools and
//! `/healthz` keep working; the per-upstream bounds at and past their
//! limit; a tool changed after it was pinned is withheld until pinned
//! again; a reload adds, changes and removes upstreams while a call on a
//! removed one finishes. The upstreams here are the misbehaving stdlib
//! server (tests/interop/upstream_hostile.py), confined by Landlock as a
//! command tool is; the independent SDKs are in tests/upstream_interop.rs.

mod common;

use std::time::{Duration, Instant};

use common::upstream::*;
use common::*;
use serde_json::{Value, json};
use taskgate::client::ClientError;

const SETTLE: Duration = Duration::from_secs(60);

fn call(daemon: &Daemon, tool: &str, args: Value) -> Result<Value, ClientError> {
    let rt = runtime();
    let client = daemon.client(false);
    rt.block_on(client.call_tool(tool, args, None))
}

/// The good upstream and the command tool answer, and so does /healthz.
fn others_work(daemon: &Daemon, after: &str) {
    let ok = call(daemon, "good.ok", json!({}))
        .unwrap_or_else(|e| panic!("after {after}: good.ok: {e}"));
    assert_eq!(text(&ok), "ok", "after {after}: {ok}");
    let echo =
        call(daemon, "hello", json!({})).unwrap_or_else(|e| panic!("after {after}: hello: {e}"));
    assert_eq!(text(&echo), "hi", "after {after}: {echo}");
    assert!(
        healthy(daemon.port),
        "after {after}: /healthz did not answer 200"
    );
}

#[test]
fn hostile_upstreams_end_in_bounded_named_errors_while_the_rest_keeps_working() {
    prereq::require_tool("python3");
    let root = private_dir();
    let state = state_dir(root.path());
    let place = Place::new(root.path());
    let mut sections = String::new();
    // At its bound: one tool listed, max_tools = 1.
    sections += &place.hostile_table(
        "good",
        "normal",
        &[],
        "effect = \"read_only\"\nmax_tools = 1",
    );
    sections += &place.hostile_table("die", "die", &[], "");
    sections += &place.hostile_table("hang", "hang", &[], "request_timeout_secs = 2");
    sections += &place.hostile_table("huge", "huge", &[], "");
    sections += &place.hostile_table("garbage", "garbage", &[], "");
    sections += &place.hostile_table("refuse", "refuse", &[], "");
    // Past the bound: 100,000 tools in pages, and in one page.
    sections += &place.hostile_table("many", "many", &[], "");
    sections += &place.hostile_table("onepage", "many", &[("HOSTILE_ONE_PAGE", "1")], "");
    // Never answers the handshake: connect_timeout_secs.
    sections += "[[upstream]]\nalias = \"mute\"\ncommand = [\"/bin/sleep\", \"3600\"]\nconnect_timeout_secs = 1\n";
    let cfg = write_config(
        root.path(),
        &sections,
        &[Tool::new("hello").script("printf hi")],
    );
    let log = root.path().join("taskgate.log");
    let started = Instant::now();
    let daemon = Daemon::start(&cfg, &state, &log);
    let ready_after = started.elapsed();
    // READY did not wait for any upstream: nothing had answered yet, or
    // at most the quick ones.
    assert!(healthy(daemon.port));
    for alias in ["good", "die", "hang", "huge", "garbage", "refuse"] {
        wait_upstream(&state, alias, SETTLE, is_ready);
    }
    for alias in ["many", "onepage"] {
        let u = wait_upstream(&state, alias, SETTLE, |u| u["last_error"].is_string());
        let e = u["last_error"].as_str().unwrap();
        assert!(e.contains("max_tools = 1000"), "{alias}: {u}");
        assert_eq!(u["tools"], 0, "{u}");
    }
    let mute = wait_upstream(&state, "mute", SETTLE, |u| u["last_error"].is_string());
    assert!(
        mute["last_error"]
            .as_str()
            .unwrap()
            .contains("connect_timeout_secs = 1"),
        "{mute}"
    );
    eprintln!("READY after {ready_after:?}");
    others_work(&daemon, "start");

    // Its tools are absent while it is not connected, and a call names why.
    let listed: Vec<String> = {
        let rt = runtime();
        let tools = rt
            .block_on(
                daemon
                    .client(false)
                    .request("tools/list", json!({}), None, None),
            )
            .unwrap();
        tools["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert!(listed.contains(&"good.ok".to_string()), "{listed:?}");
    assert!(
        !listed
            .iter()
            .any(|n| n.starts_with("many.") || n.starts_with("mute.")),
        "{listed:?}"
    );
    for tool in ["many.tool_000001", "onepage.tool_000001", "mute.anything"] {
        let e = call(&daemon, tool, json!({})).unwrap_err();
        assert_eq!(error_name(&e), "TG_UPSTREAM_UNAVAILABLE", "{tool}: {e}");
        assert_eq!(
            match &e {
                ClientError::Rpc { error, .. } => error["data"]["retryable"].clone(),
                _ => Value::Null,
            },
            json!(true),
            "{e}"
        );
    }
    others_work(&daemon, "unavailable upstreams");

    let cases: &[(&str, &str, &str)] = &[
        (
            "die.die",
            "TG_UPSTREAM_CONNECTION_LOST",
            "ended while the call was in flight",
        ),
        (
            "hang.hang",
            "TG_UPSTREAM_TIMEOUT",
            "request_timeout_secs = 2",
        ),
        (
            "huge.huge",
            "TG_UPSTREAM_RESPONSE_TOO_LARGE",
            "max_response_bytes = 16777216",
        ),
        (
            "garbage.garbage",
            "TG_UPSTREAM_CONNECTION_LOST",
            "not JSON-RPC",
        ),
        ("refuse.refuse", "TG_UPSTREAM_ERROR", "quota exhausted"),
    ];
    for (tool, name, says) in cases {
        let t = Instant::now();
        let e = call(&daemon, tool, json!({})).unwrap_err();
        let took = t.elapsed();
        assert_eq!(error_name(&e), *name, "{tool}: {e}");
        assert!(e.to_string().contains(says), "{tool}: {e}");
        assert!(took < Duration::from_secs(30), "{tool} took {took:?}");
        eprintln!("{tool}: {name} after {took:?}");
        others_work(&daemon, tool);
    }
    // The refusal carries the upstream's own code.
    let e = call(&daemon, "refuse.refuse", json!({})).unwrap_err();
    let ClientError::Rpc { error, .. } = &e else {
        panic!("{e}")
    };
    assert_eq!(error["data"]["upstreamCode"], -32000, "{error}");

    // The ones whose connection was closed are connected again.
    for alias in ["die", "huge", "garbage"] {
        let u = wait_upstream(&state, alias, SETTLE, is_ready);
        assert!(u["last_error"].is_string(), "{alias}: {u}");
    }
    let rss = rss_kib(daemon.pid().as_raw()).unwrap_or(0);
    eprintln!("daemon RSS after the hostile upstreams: {rss} KiB");
    assert!(
        rss < 512 * 1024,
        "the daemon holds {rss} KiB after a 100 MiB answer"
    );
    let text = daemon.log_text();
    assert!(daemon.stop().success(), "{text}");
}
