//! Testing a configuration the way the daemon would use it, through the
//! real binary: `check --config-only` while a daemon serves, the state
//! directory's precedence made visible or refused, the operator client
//! finding the configured daemon, and what the unit and the package do
//! with all of it.
//!
//! What this file proves: `check --config-only` while a daemon serves and
//! without touching the state directory, `[store] directory` against
//! `StateDirectory=` refused, `call`/`task` find the configured daemon, the
//! unit's `ExecStartPre=`/start limit and the postinst's check before the
//! restart

mod common;

use std::path::{Path, PathBuf};

use common::*;

const ECHO_TOOL: &str = r#"
[[tool]]
name = "echo"
description = "Prints its text."
argv = ["/bin/echo", "{text}"]
effect = "read_only"
[tool.input_schema]
type = "object"
required = ["text"]
[tool.input_schema.properties.text]
type = "string"
"#;

struct Fixture {
    dir: tempfile::TempDir,
    state: PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = private_dir();
        let state = state_dir(dir.path());
        Fixture { dir, state }
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    fn state_s(&self) -> &str {
        self.state.to_str().unwrap()
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// `check --config-only` takes no lock and opens no state: it passes while
/// a daemon serves (where a full `check` is refused by the lock), and
/// refuses an invalid file with the one-line 78 refusal, leaving the
/// daemon serving.
#[test]
fn config_only_checks_while_the_daemon_serves() {
    let f = Fixture::new();
    let cfg = f.write("taskgate.toml", ECHO_TOOL);
    let d = Daemon::builder().config(&cfg).state_dir(&f.state).start();

    let full = taskgate(
        &["check", "--config", s(&cfg), "--state-dir", f.state_s()],
        &[],
    );
    assert_eq!(full.status.code(), Some(75), "{full:?}");

    let out = taskgate(
        &[
            "check",
            "--config-only",
            "--config",
            s(&cfg),
            "--state-dir",
            f.state_s(),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = stdout(&out);
    assert!(
        text.contains(&format!("ok: configuration {}: 1 tools", cfg.display())),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "state directory {} (from --state-dir); not opened",
            f.state_s()
        )),
        "{text}"
    );

    // An invalid file: refused as serve would refuse it, in one line.
    let bad = f.write("bad.toml", "[tasks]\npoll_interval_ms = 5\n");
    let home = [("HOME", "/nonexistent")];
    let out = taskgate(&["check", "--config-only", "--config", s(&bad)], &home);
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    let line = one_line_stderr(&out);
    assert!(
        line.starts_with("taskgate: refused: ")
            && line.contains("tasks.poll_interval_ms = 5")
            && line.contains("(exit 78)"),
        "{line}"
    );
    // A tool that does not compile is a configuration error too.
    let bad_tool = f.write("tool.toml", &ECHO_TOOL.replace("{text}\"]", "{nosuch}\"]"));
    let out = taskgate(&["check", "--config-only", "--config", s(&bad_tool)], &home);
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert!(one_line_stderr(&out).contains("nosuch"));

    // The daemon never noticed.
    assert!(http_get(d.port, "/readyz").starts_with("HTTP/1.1 200"));
    assert!(d.stop().success());
}

/// The state directory is never read by `--config-only`: a directory that
/// does not exist, or is unsafe, does not matter to it.
#[test]
fn config_only_never_opens_the_state_directory() {
    let f = Fixture::new();
    let missing = f.dir.path().join("missing");
    let out = taskgate(&["check", "--config-only", "--state-dir", s(&missing)], &[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(!missing.exists());
    assert!(stdout(&out).contains("no file (the embedded defaults)"));
}

/// Under the unit, systemd's `StateDirectory=` ($STATE_DIRECTORY) and a
/// `[store] directory` that names another directory: refused by serve, by
/// check and by `check --config-only` alike, naming both, instead of one of
/// them being ignored in silence. The same directory is fine, and `check`
/// says where the choice came from.
#[test]
fn a_configured_directory_contradicting_state_directory_is_refused() {
    let f = Fixture::new();
    let other = state_dir(&f.dir.path().join("o").tap_mkdir());
    let cfg = f.write(
        "c.toml",
        &format!("[store]\ndirectory = {:?}\n", other.to_str().unwrap()),
    );
    for args in [
        vec!["check", "--config", s(&cfg)],
        vec!["check", "--config-only", "--config", s(&cfg)],
        vec!["serve", "--listen", "127.0.0.1:0", "--config", s(&cfg)],
    ] {
        let out = taskgate(&args, &[("STATE_DIRECTORY", f.state_s())]);
        assert_eq!(out.status.code(), Some(78), "{args:?}: {out:?}");
        let line = one_line_stderr(&out);
        assert!(
            line.contains(&format!("store.directory = {:?}", other.to_str().unwrap()))
                && line.contains("StateDirectory=")
                && line.contains(f.state_s())
                && line.contains("c.toml: line 2"),
            "{args:?}: {line}"
        );
    }
    // Agreeing: check runs and names systemd as the source.
    let same = f.write(
        "same.toml",
        &format!("[store]\ndirectory = \"{}/\"\n", f.state_s()),
    );
    let out = taskgate(
        &["check", "--config", s(&same)],
        &[("STATE_DIRECTORY", f.state_s())],
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        stdout(&out).contains(&format!(
            "state directory {} (from systemd's StateDirectory= ($STATE_DIRECTORY))",
            f.state_s()
        )),
        "{}",
        stdout(&out)
    );
    // Without systemd, the configured directory is used, and said so.
    let out = taskgate(&["check", "--config", s(&cfg)], &[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        stdout(&out).contains(&format!(
            "(from store.directory in {}: line 2",
            cfg.display()
        )),
        "{}",
        stdout(&out)
    );
}

trait TapMkdir {
    fn tap_mkdir(self) -> PathBuf;
}

impl TapMkdir for PathBuf {
    fn tap_mkdir(self) -> PathBuf {
        std::fs::create_dir(&self).unwrap();
        self
    }
}

/// `taskgate call` and `taskgate task` find the daemon at the configured
/// `server.listen` (`--config` or `$TASKGATE_CONFIG`); `--url` overrides.
#[test]
fn the_operator_client_finds_the_configured_daemon() {
    let f = Fixture::new();
    let cfg = f.write("taskgate.toml", ECHO_TOOL);
    let d = Daemon::builder().config(&cfg).state_dir(&f.state).start();
    // The file the client reads names the daemon's (ephemeral) port.
    let client_cfg = f.write(
        "client.toml",
        &format!("[server]\nlisten = \"127.0.0.1:{}\"\n{ECHO_TOOL}", d.port),
    );
    let call = |extra: &[&str], env: &[(&str, &str)]| {
        let mut args = vec!["call", "echo", "--args", r#"{"text":"hi"}"#];
        args.extend(extra);
        taskgate(&args, env)
    };
    let out = call(&["--config", s(&client_cfg)], &[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(stdout(&out).contains("hi"), "{}", stdout(&out));
    let out = call(&[], &[("TASKGATE_CONFIG", s(&client_cfg))]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");

    // --url wins over the configuration.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    let url = format!("http://127.0.0.1:{closed_port}/mcp");
    let out = call(&["--config", s(&client_cfg), "--url", &url], &[]);
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains(&url));

    // task get reads the same configuration: an unknown task is a refusal
    // from the daemon (76), not an unreachable one (69).
    let out = taskgate(
        &["task", "get", "tg-unknown", "--config", s(&client_cfg)],
        &[],
    );
    assert_eq!(out.status.code(), Some(76), "{out:?}");

    // An invalid configuration is refused like serve refuses it.
    let bad = f.write("bad.toml", "[server]\nlisten = \"nowhere\"\n");
    let out = call(&["--config", s(&bad)], &[]);
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("server.listen"));
    assert!(d.stop().success());
}

fn unit_values(unit: &str, key: &str) -> Vec<String> {
    unit.lines()
        .filter_map(|l| l.strip_prefix(&format!("{key}=")))
        .map(str::to_string)
        .collect()
}

fn seconds(value: &str) -> u64 {
    value
        .trim_end_matches('s')
        .parse()
        .unwrap_or_else(|_| panic!("{value:?} is not in seconds"))
}

/// The unit tests the configuration before every start, reloads through
/// the daemon's own answer,
/// and its start limit never locks out an operator's ordinary restarts
/// while still ending a crash loop.
#[test]
fn the_unit_checks_the_configuration_and_its_start_limit_fits_restarts() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let unit = std::fs::read_to_string(root.join("systemd/taskgate.service")).unwrap();
    let check = "/usr/bin/taskgate check --config-only --config /etc/taskgate/taskgate.toml";
    // Its failure is left to serve's own 78, which is never retried.
    assert_eq!(
        unit_values(&unit, "ExecStartPre"),
        vec![format!("-{check}")]
    );
    // A reload waits for the daemon's own outcome, and fails with it.
    assert_eq!(
        unit_values(&unit, "ExecReload"),
        vec!["/usr/bin/taskgate reload --config /etc/taskgate/taskgate.toml".to_string()]
    );
    let one = |key: &str| {
        let v = unit_values(&unit, key);
        assert_eq!(v.len(), 1, "{key}: {v:?}");
        v[0].clone()
    };
    let burst: u64 = one("StartLimitBurst").parse().unwrap();
    let interval = seconds(&one("StartLimitIntervalSec"));
    let restart_sec = seconds(&one("RestartSec"));
    // An operator may restart ten times in the interval…
    assert!(burst >= 10, "StartLimitBurst={burst}");
    // …and a start that fails at once still reaches the limit inside it.
    assert!(
        burst * restart_sec < interval,
        "a crash loop never reaches the limit: {burst} x {restart_sec}s >= {interval}s"
    );
}

/// The package's postinst tests the configuration with the new binary
/// before debhelper's restart, and stops (leaving the old daemon serving)
/// when it is refused.
#[test]
fn the_postinst_checks_the_configuration_before_the_restart() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let postinst =
        std::fs::read_to_string(root.join("packaging/maintainer-scripts/postinst")).unwrap();
    let check = postinst
        .find("/usr/bin/taskgate check")
        .expect("postinst runs taskgate check");
    let restart = postinst.find("#DEBHELPER#").expect("#DEBHELPER#");
    assert!(check < restart, "the check must come before the restart");
    assert!(postinst[check..restart].contains("--config-only"));
    assert!(postinst[check..restart].contains("exit 1"));
    let sh = std::process::Command::new("sh")
        .arg("-n")
        .arg(root.join("packaging/maintainer-scripts/postinst"))
        .output()
        .unwrap();
    assert!(sh.status.success(), "{sh:?}");
}
