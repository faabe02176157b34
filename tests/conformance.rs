//! The official MCP conformance suite's Tasks scenarios and its
//! `server-stateless` scenario, with `[auth]` off and on, and its
//! authorization scenarios with `[auth]` on, against the real daemon
//! (scripts/conformance.sh; Node 22 and the suite come from the npm
//! registry into target/conformance). Every check must pass except those
//! listed, with reasons, in tests/conformance/expected-failures.yaml and in
//! `AUTH_EXPECTED_FAILURES` below.

mod common;

use common::*;
use std::os::unix::fs::PermissionsExt;

/// One run of the suite at a time: the script installs the suite once and
/// writes each scenario's results to a fixed place under target/conformance.
static SUITE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The scenarios scripts/conformance.sh runs when it is not told which:
/// the ten Tasks scenarios and `server-stateless`.
const DEFAULT_SCENARIOS: usize = 11;

fn suite_lock() -> std::sync::MutexGuard<'static, ()> {
    // A test that failed while holding it leaves nothing half-done to guard.
    SUITE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The Tasks scenarios and `server-stateless` (the 2026-07-28 stateless
/// lifecycle: per-request `_meta`, discovery, version and header errors,
/// removed methods such as `initialize` answered 404 / -32601).
#[test]
fn official_conformance_suite_tasks_scenarios() {
    prereq::require_tool("npm");
    let _suite = suite_lock();
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
    assert!(stdout.contains("PASS server-stateless"), "{stdout}");
    assert_eq!(
        stdout.matches("PASS ").count(),
        DEFAULT_SCENARIOS,
        "{stdout}"
    );
}

/// Words that mark a server scenario of the suite as one about
/// authorization.
const AUTH_WORDS: &[&str] = &[
    "auth",
    "prm",
    "scope",
    "audience",
    "token",
    "www-authenticate",
    "unauthorized",
    "oauth",
    "dpop",
];

/// The suite's server-side authorization scenarios that exist upstream and
/// cannot pass against taskgate by design, with the reason. The pinned
/// version (0.2.0-alpha.12, also the newest published) ships none of them:
/// the suite's repository has them, unpublished. A listed scenario that
/// appears in the pin must fail; one that passes is reported, to be taken
/// off this list.
const AUTH_EXPECTED_FAILURES: &[(&str, &str)] = &[
    (
        "auth-token-audience-validation",
        "it signs tokens with a mock authorization server on 127.0.0.1:9797 and expects the \
         server to fetch that server's JWKS URL when it validates a token; taskgate reads each \
         issuer's JWKS from a local file only (auth.jwt.jwks_file), never from the network",
    ),
    (
        "sep-2350-server-scope-challenge",
        "it presents the fixed opaque tokens mcp-conformance-scope-low and \
         mcp-conformance-scope-full; taskgate's static tokens are its own tgk_ secrets kept as \
         sha256 hashes, so those strings are not credentials taskgate can be given, and its \
         fixtures (test_simple_text, resources, prompts) are not taskgate tools",
    ),
    // These test the authorization server the metadata names (its
    // metadata, PKCE, client ID metadata documents, grant types, dynamic
    // registration); taskgate is a resource server only and runs none.
    (
        "server/auth-as-pkce-support",
        "it tests an authorization server; taskgate is a resource server only",
    ),
    (
        "server/auth-as-cimd-supported",
        "it tests an authorization server; taskgate is a resource server only",
    ),
    (
        "server/auth-as-grant-types",
        "it tests an authorization server; taskgate is a resource server only",
    ),
    (
        "server/auth-dcr-endpoint-validation",
        "it tests an authorization server; taskgate is a resource server only",
    ),
];

/// The suite's authorization scenarios against an auth-enabled taskgate
/// (static tokens and an advertised JWT issuer; loopback without a token is
/// the local owner): every such scenario in the pinned suite is either
/// expected to pass or listed above with its reason, and the Tasks and
/// `server-stateless` scenarios still pass with authentication on.
#[test]
fn official_conformance_suite_authorization_scenarios() {
    prereq::require_tool("npm");
    let _suite = suite_lock();
    let root = env!("CARGO_MANIFEST_DIR");
    let script = format!("{root}/scripts/conformance.sh");
    let listed = std::process::Command::new("bash")
        .arg(&script)
        .arg(BIN)
        .env("TASKGATE_CONFORMANCE_LIST", "1")
        .output()
        .expect("run scripts/conformance.sh");
    let listing = String::from_utf8_lossy(&listed.stdout).to_string();
    assert!(listed.status.success(), "{listing}");
    // `list --server` prints client-facing ("Client scenarios") sections
    // after the server ones: only the server section counts here.
    let server_section = listing.split("Client scenarios").next().unwrap_or_default();
    let names: Vec<&str> = server_section
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(
        names.contains(&"tasks-lifecycle"),
        "the listing names no server scenarios: {listing}"
    );
    let auth: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| AUTH_WORDS.iter().any(|w| n.contains(w)))
        .collect();
    println!("authorization scenarios in the pinned suite: {auth:?}");

    let dir = private_dir();
    let state = state_dir(dir.path());
    let tokens = dir.path().join("tokens.toml");
    let secret = format!("tgk_{}", "c".repeat(43));
    std::fs::write(
        &tokens,
        format!(
            "[[token]]\nid = \"suite\"\nhash = \"{}\"\ntenant = \"conformance\"\nsubject = \"suite\"\nscopes = [\"admin\"]\n",
            taskgate::auth::tokens::hash_text(&secret)
        ),
    )
    .expect("write the tokens file");
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600))
        .expect("restrict the tokens file");
    // The Ed25519 public key of RFC 8037's examples: nothing is signed here.
    let jwks = dir.path().join("jwks.json");
    std::fs::write(
        &jwks,
        r#"{"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "k1", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}"#,
    )
    .expect("write the JWKS file");
    let base = std::fs::read_to_string(format!("{root}/examples/conformance.toml"))
        .expect("read examples/conformance.toml");
    let config = dir.path().join("taskgate.toml");
    std::fs::write(
        &config,
        format!(
            "{base}\n[auth]\nlocal_owner = \"loopback\"\nresource = \"https://tasks.example.test/mcp\"\ntokens_file = \"{}\"\n\n[[auth.jwt]]\nissuer = \"https://idp.example.test/acme\"\njwks_file = \"{}\"\nalgorithms = [\"EdDSA\"]\ntenant = \"acme\"\nadvertise = true\n",
            tokens.display(),
            jwks.display()
        ),
    )
    .expect("write the config");
    let daemon = Daemon::builder()
        .config(&config)
        .state_dir(&state)
        .log(&dir.path().join("taskgate.log"))
        .start();
    let run = |scenarios: Option<&str>| {
        let mut cmd = std::process::Command::new("bash");
        cmd.arg(&script)
            .arg(BIN)
            .env("TASKGATE_CONFORMANCE_URL", daemon.url());
        if let Some(s) = scenarios {
            cmd.env("TASKGATE_CONFORMANCE_SCENARIOS", s);
        }
        let out = cmd.output().expect("run scripts/conformance.sh");
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        println!("{stdout}");
        eprintln!("{}", String::from_utf8_lossy(&out.stderr));
        (out.status.success(), stdout)
    };

    let mut surprises = Vec::new();
    for name in &auth {
        let (_, said) = run(Some(name));
        let passed = said.contains(&format!("PASS {name}"));
        match AUTH_EXPECTED_FAILURES.iter().find(|(n, _)| n == name) {
            Some((_, why)) if passed => surprises.push(format!(
                "{name} now passes; take it off AUTH_EXPECTED_FAILURES (listed because {why})"
            )),
            None if !passed => surprises.push(format!("{name} fails:\n{said}")),
            _ => {}
        }
    }
    // With authentication on, the Tasks and server-stateless scenarios pass
    // as they do without.
    let (ok, stdout) = run(None);
    let log = daemon.log_text();
    assert!(daemon.stop().success(), "daemon log:\n{log}");
    assert!(surprises.is_empty(), "{surprises:#?}");
    assert!(ok, "conformance failures with [auth] on:\n{stdout}");
    assert!(stdout.contains("PASS server-stateless"), "{stdout}");
    assert_eq!(
        stdout.matches("PASS ").count(),
        DEFAULT_SCENARIOS,
        "{stdout}"
    );
}
