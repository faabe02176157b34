//! Reloads of a real daemon: SIGHUP sent by hand, and `taskgate reload`
//! (what the unit's `ExecReload=` runs) over the real admin socket, which
//! waits for the outcome and exits with it. The reload protocol
//! (RELOADING=1, then READY=1) comes through the harness's notify socket;
//! what the reload did is seen through MCP (tools/list, calls, a running
//! task), in what `taskgate reload` prints and, for the refusals that are
//! the behaviour under test, in the log line that names them.
//!
//! What this file proves: SIGHUP to a real daemon (RELOADING=1 … READY=1): a
//! changed tool applies while a running task goes on and completes; an invalid
//! file keeps the old configuration; a changed startup-only key is refused by
//! name. `taskgate reload` over the real admin socket: a redefined tool answers
//! at once and what changed is printed; an invalid or unparsable file exits 78
//! naming the key while the old settings serve on; a kept startup-only key is
//! listed; 69 with no daemon; `[log] filter` made more verbose by a reload lets
//! a debug event into the log, an invalid one is refused (78) and the filter in
//! force stays, `TASKGATE_LOG` overrides the file

mod common;

use std::path::PathBuf;
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::{Value, json};

use common::*;

const STEP: Duration = Duration::from_secs(15);

/// `hold` writes to the `started` FIFO once it runs, then waits until the
/// test writes a line into the `release` FIFO, and prints it: a task that
/// runs exactly as long as the test wants, with no sleep anywhere.
fn hold_tool() -> Tool {
    Tool::new("hold")
        .description("Runs until released.")
        .script(HOLD_SCRIPT)
        .args(&["{started}", "{release}"])
        .unconfined("its files sit beside the state directory")
        .task("optional")
        .timeout_secs(120)
        .required("started", "string")
        .required("release", "string")
}

const HOLD_SCRIPT: &str = r#"echo started > "$0"; read line < "$1"; printf "released %s" "$line""#;

fn echo_tool() -> Tool {
    Tool::new("echo")
        .description("Prints its text.")
        .argv(&["/bin/echo", "{text}"])
        .task("optional")
        .required("text", "string")
}

struct Fixture {
    dir: tempfile::TempDir,
    config: PathBuf,
    state: PathBuf,
}

impl Fixture {
    fn new(config: &str) -> Fixture {
        let dir = private_dir();
        let state = state_dir(dir.path());
        let f = Fixture {
            config: dir.path().join("taskgate.toml"),
            dir,
            state,
        };
        f.rewrite(config);
        f
    }

    /// Replaces the file in one rename, as an editor or a package does.
    fn rewrite(&self, text: &str) {
        let tmp = self.path("taskgate.toml.new");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &self.config).unwrap();
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn start(&self) -> Daemon {
        Daemon::builder()
            .config(&self.config)
            .state_dir(&self.state)
            .start()
    }
}

/// SIGHUP, then the reload protocol: RELOADING=1 (with MONOTONIC_USEC),
/// then READY=1 with the STATUS= line, which is returned.
fn reload(d: &mut Daemon) -> String {
    d.signal(Signal::SIGHUP);
    let reloading = d.wait_for("RELOADING=1", STEP);
    assert!(
        reloading.contains("MONOTONIC_USEC="),
        "RELOADING=1 without MONOTONIC_USEC: {reloading:?}"
    );
    let ready = d.wait_for("READY=1", STEP);
    ready
        .lines()
        .find_map(|l| l.strip_prefix("STATUS="))
        .unwrap_or_else(|| panic!("READY=1 after a reload came without STATUS=: {ready:?}"))
        .to_string()
}

fn tool_names(rt: &tokio::runtime::Runtime, d: &Daemon) -> Vec<String> {
    let list = rt
        .block_on(d.client(true).request("tools/list", json!({}), None, None))
        .unwrap();
    let mut names: Vec<String> = list["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

fn status(task: &Value) -> &str {
    task["status"].as_str().unwrap_or("")
}

/// The reload adds a tool visible in tools/list and callable at once,
/// removes one, and applies the new poll interval to new tasks, while a
/// long task started before it keeps running on the definition it started
/// with (its tool is gone from the new file) and then completes.
#[test]
fn a_reload_changes_the_tools_while_a_running_task_goes_on_and_completes() {
    let f = Fixture::new(&config_text(
        "[tasks]\npoll_interval_ms = 200\n",
        &[hold_tool()],
    ));
    let mut d = f.start();
    let rt = runtime();
    let client = d.client(true);
    assert_eq!(tool_names(&rt, &d), ["artifact_read", "hold"]);

    let started = Fifo::new(&f.path("started"));
    let release = f.path("release");
    nix::unistd::mkfifo(&release, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let task = rt
        .block_on(client.call_tool(
            "hold",
            json!({"started": started.path, "release": release}),
            None,
        ))
        .unwrap();
    let id = task["taskId"].as_str().unwrap().to_string();
    assert_eq!(task["pollIntervalMs"], 200, "{task}");
    assert_eq!(started.read(STEP).trim(), "started");

    // New file: `hold` gone, `echo` added, a slower poll interval.
    f.rewrite(&config_text(
        "[tasks]\npoll_interval_ms = 300\n",
        &[echo_tool()],
    ));
    let line = reload(&mut d);
    assert!(line.contains("; reload 1 applied"), "{line}");
    assert!(!line.contains("startup-only"), "{line}");

    assert_eq!(tool_names(&rt, &d), ["artifact_read", "echo"]);
    let echoed = rt
        .block_on(client.call_tool("echo", json!({"text": "new tool"}), None))
        .unwrap();
    assert_eq!(echoed["pollIntervalMs"], 300, "{echoed}");
    let echoed = rt
        .block_on(client.wait_task(echoed["taskId"].as_str().unwrap(), &echoed))
        .unwrap();
    assert_eq!(status(&echoed), "completed", "{echoed}");
    assert!(echoed.to_string().contains("new tool"), "{echoed}");
    let gone = rt.block_on(client.call_tool(
        "hold",
        json!({"started": "/nonexistent", "release": "/nonexistent"}),
        None,
    ));
    assert!(
        gone.is_err(),
        "a removed tool is refused for new calls: {gone:?}"
    );

    // The task started before the reload is still running, and ends with
    // the result of the tool it started with.
    let now = rt.block_on(client.get_task(&id)).unwrap();
    assert_eq!(status(&now), "working", "{now}");
    std::fs::write(&release, "after the reload\n").unwrap();
    let done = rt.block_on(client.wait_task(&id, &now)).unwrap();
    assert_eq!(status(&done), "completed", "{done}");
    assert!(
        done.to_string().contains("released after the reload"),
        "{done}"
    );
    assert!(d.stop().success());
}

/// An invalid file (a bad key, or a tool that does not compile) changes
/// nothing: the old tools are served, the error is logged with its reason.
#[test]
fn an_invalid_file_on_reload_keeps_the_old_configuration() {
    let f = Fixture::new(&echo_tool().to_string());
    let mut d = f.start();
    let rt = runtime();

    f.rewrite(&config_text(
        "[tasks]\npoll_interval_ms = 7\n",
        &[echo_tool()],
    ));
    let line = reload(&mut d);
    assert!(
        line.contains("; reload 1 refused (invalid configuration"),
        "{line}"
    );
    let log = d.log_text();
    let refusal = log
        .lines()
        .find(|l| l.contains("configuration reload refused"))
        .unwrap_or_else(|| panic!("no refusal logged:\n{log}"));
    assert!(
        refusal.contains("ERROR")
            && refusal.contains("tasks.poll_interval_ms = 7")
            && refusal.contains("still running on the previous configuration"),
        "{refusal}"
    );

    // A tool whose template names no property, with another tool added:
    // nothing of it is applied.
    f.rewrite(&config_text(
        "",
        &[
            echo_tool(),
            hold_tool()
                .script(HOLD_SCRIPT)
                .args(&["{started}", "{nosuch}"]),
        ],
    ));
    reload(&mut d);
    assert_eq!(tool_names(&rt, &d), ["artifact_read", "echo"]);
    let echoed = rt
        .block_on(
            d.client(false)
                .call_tool("echo", json!({"text": "still"}), None),
        )
        .unwrap();
    assert!(echoed.to_string().contains("still"), "{echoed}");
    assert!(d.log_text().contains("nosuch"));
    assert!(d.stop().success());
}

/// A changed startup-only key is not applied; one log line names it, with
/// both values, at every reload until a restart; the rest of the file is
/// applied.
#[test]
fn a_changed_startup_only_key_is_refused_by_name_and_the_rest_applied() {
    let f = Fixture::new("[server]\nmax_connections = 64\n");
    let mut d = f.start();
    let rt = runtime();

    f.rewrite(&config_text(
        "[server]\nmax_connections = 100\n",
        &[echo_tool()],
    ));
    let line = reload(&mut d);
    assert!(
        line.contains(
            "; reload 1 applied, except startup-only server.max_connections (restart to apply)"
        ),
        "{line}"
    );
    assert_eq!(tool_names(&rt, &d), ["artifact_read", "echo"]);
    let refused = |log: &str| {
        log.lines()
            .filter(|l| {
                l.contains("server.max_connections = 100")
                    && l.contains("applies at start only; keeping 64 until a restart")
            })
            .count()
    };
    assert_eq!(refused(&d.log_text()), 1, "{}", d.log_text());
    // Said again at the next reload: the running value is still the old one.
    assert!(reload(&mut d).contains("; reload 2 applied, except startup-only"));
    assert_eq!(refused(&d.log_text()), 2, "{}", d.log_text());
    assert!(d.stop().success());
}

/// `taskgate reload --config … --state-dir …`, as the unit runs it.
fn reload_command(f: &Fixture) -> std::process::Output {
    taskgate(
        &[
            "reload",
            "--config",
            f.config.to_str().unwrap(),
            "--state-dir",
            f.state.to_str().unwrap(),
        ],
        &[],
    )
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// What a call of `echo` prints, and the poll interval its task was given.
fn echo(rt: &tokio::runtime::Runtime, d: &Daemon, text: &str) -> (String, Value) {
    let client = d.client(true);
    let task = rt
        .block_on(client.call_tool("echo", json!({ "text": text }), None))
        .unwrap();
    let interval = task["pollIntervalMs"].clone();
    let done = rt
        .block_on(client.wait_task(task["taskId"].as_str().unwrap(), &task))
        .unwrap();
    assert_eq!(status(&done), "completed", "{done}");
    (done.to_string(), interval)
}

/// `taskgate reload` returns once the daemon has applied the file, and
/// says what changed: a redefined tool answers with its new definition at
/// once, the new poll interval is given to new tasks, and the reload went
/// through the same protocol as SIGHUP (RELOADING=1 … READY=1, numbered).
#[test]
fn taskgate_reload_applies_a_changed_tool_and_says_what_changed() {
    let f = Fixture::new(&config_text(
        "[tasks]\npoll_interval_ms = 200\n",
        &[echo_tool()],
    ));
    let mut d = f.start();
    let rt = runtime();
    let (before, interval) = echo(&rt, &d, "one");
    assert!(before.contains("one") && !before.contains("v2"), "{before}");
    assert_eq!(interval, 200);

    f.rewrite(&config_text(
        "[tasks]\npoll_interval_ms = 300\n",
        &[echo_tool().argv(&["/bin/echo", "v2", "{text}"])],
    ));
    let out = reload_command(&f);
    let printed = stdout(&out);
    assert!(out.status.success(), "{out:?}");
    assert!(printed.starts_with("reload 1: applied\n"), "{printed}");
    assert!(
        printed.contains("changed: tasks.poll_interval_ms 200 -> 300"),
        "{printed}"
    );
    assert!(
        printed.contains("changed: tools (added: none; removed: none; redefined: echo)"),
        "{printed}"
    );
    assert!(!printed.contains("startup-only"), "{printed}");
    // Applied before the command returned: no waiting, no retry.
    let (after, interval) = echo(&rt, &d, "two");
    assert!(after.contains("v2 two"), "{after}");
    assert_eq!(interval, 300);
    // The same reload protocol as SIGHUP, and the STATUS line numbers it.
    d.wait_for("RELOADING=1", STEP);
    let ready = d.wait_for("READY=1", STEP);
    assert!(ready.contains("; reload 1 applied"), "{ready}");

    // Nothing changed: said so, still exit 0; a SIGHUP by hand is the
    // same reload, numbered after it.
    let out = reload_command(&f);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout(&out).contains("no reloadable setting or tool changed"),
        "{out:?}"
    );
    assert!(d.wait_for("READY=1", STEP).contains("; reload 2 applied"));
    let line = reload(&mut d);
    assert!(line.contains("; reload 3 applied"), "{line}");
    assert!(d.stop().success());
}

/// An invalid file: `taskgate reload` exits 78 with one line naming the
/// key, the file and that the daemon goes on with its previous settings,
/// which it does: the old tool and the old poll interval are served.
#[test]
fn taskgate_reload_of_an_invalid_file_exits_78_and_the_daemon_keeps_its_settings() {
    let f = Fixture::new(&config_text(
        "[tasks]\npoll_interval_ms = 200\n",
        &[echo_tool()],
    ));
    let d = f.start();
    let rt = runtime();

    f.rewrite(&config_text(
        "[tasks]\npoll_interval_ms = 7\n",
        &[hold_tool()],
    ));
    let out = reload_command(&f);
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    let line = one_line_stderr(&out);
    assert!(
        line.contains("invalid configuration (exit 78)")
            && line.contains("reload 1 refused")
            && line.contains("tasks.poll_interval_ms = 7")
            && line.contains(f.config.to_str().unwrap())
            && line.contains("goes on with its previous configuration"),
        "{line}"
    );
    assert!(out.stdout.is_empty(), "{out:?}");
    assert_eq!(tool_names(&rt, &d), ["artifact_read", "echo"]);
    let (text, interval) = echo(&rt, &d, "still here");
    assert!(text.contains("still here"), "{text}");
    assert_eq!(interval, 200);

    // A file that does not parse at all is refused the same way (the
    // client itself cannot read it, and asks the daemon named by
    // --state-dir anyway).
    f.rewrite("[tasks\n");
    let out = reload_command(&f);
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    let line = one_line_stderr(&out);
    assert!(line.contains("reload 2 refused"), "{line}");
    assert_eq!(tool_names(&rt, &d), ["artifact_read", "echo"]);
    assert!(d.stop().success());
}

/// A changed startup-only key is named with both values and kept; the
/// rest of the file applies and the command exits 0.
#[test]
fn taskgate_reload_names_a_kept_startup_only_key_and_applies_the_rest() {
    let f = Fixture::new("[server]\nmax_connections = 64\n");
    let d = f.start();
    let rt = runtime();

    f.rewrite(&config_text(
        "[server]\nmax_connections = 100\n",
        &[echo_tool()],
    ));
    let out = reload_command(&f);
    assert!(out.status.success(), "{out:?}");
    let printed = stdout(&out);
    assert!(
        printed.starts_with(
            "reload 1: applied, except startup-only server.max_connections (restart to apply)\n"
        ),
        "{printed}"
    );
    assert!(
        printed.contains(
            "not applied: server.max_connections = 100 applies at start only; the daemon keeps 64 until a restart"
        ),
        "{printed}"
    );
    assert!(printed.contains("added: echo"), "{printed}");
    assert_eq!(tool_names(&rt, &d), ["artifact_read", "echo"]);
    assert!(d.stop().success());
}

/// No daemon: 69, and one line saying so.
#[test]
fn taskgate_reload_without_a_daemon_exits_69() {
    let f = Fixture::new(&echo_tool().to_string());
    let out = reload_command(&f);
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    assert!(
        one_line_stderr(&out).contains("no daemon is serving"),
        "{out:?}"
    );
}

/// The debug event a created task logs; absent at info.
const DEBUG_EVENT: &str = "task created; starting it";

fn debug_events(d: &Daemon) -> usize {
    d.log_text().matches(DEBUG_EVENT).count()
}

/// `[log] filter` is applied on reload: after `taskgate reload` with a more
/// verbose filter a debug event appears in the log (the daemon's stderr),
/// where before it did not. An invalid filter is refused (78, naming the
/// key) by the reload, which keeps the filter in force, and by `check`.
#[test]
fn a_reload_applies_a_more_verbose_log_filter_and_refuses_an_invalid_one() {
    let f = Fixture::new(&config_text("[log]\nfilter = \"info\"\n", &[echo_tool()]));
    let d = f.start();
    let rt = runtime();
    echo(&rt, &d, "quiet");
    assert_eq!(debug_events(&d), 0, "{}", d.log_text());

    f.rewrite(&config_text(
        "[log]\nfilter = \"info,taskgate=debug\"\n",
        &[echo_tool()],
    ));
    let out = reload_command(&f);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout(&out).contains("changed: log.filter info -> info,taskgate=debug"),
        "{out:?}"
    );
    echo(&rt, &d, "verbose");
    assert_eq!(debug_events(&d), 1, "{}", d.log_text());

    // An invalid filter: refused by name, and the verbose one stays.
    f.rewrite(&config_text(
        "[log]\nfilter = \"info,taskgate=loud\"\n",
        &[echo_tool()],
    ));
    let out = reload_command(&f);
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    let line = one_line_stderr(&out);
    assert!(
        line.contains("log.filter = \"info,taskgate=loud\" is not a log filter"),
        "{line}"
    );
    let check = taskgate(
        &[
            "check",
            "--config-only",
            "--config",
            f.config.to_str().unwrap(),
            "--state-dir",
            f.state.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(check.status.code(), Some(78), "{check:?}");
    assert!(one_line_stderr(&check).contains("log.filter"), "{check:?}");
    echo(&rt, &d, "still verbose");
    assert_eq!(debug_events(&d), 2, "{}", d.log_text());
    assert!(d.stop().success());
}

/// `TASKGATE_LOG` overrides the file, as every key's variable does: with it
/// set, a changed filter in the file is not a change, and no debug event
/// appears; an invalid `TASKGATE_LOG` refuses the start with 78.
#[test]
fn taskgate_log_in_the_environment_overrides_the_file_filter() {
    let f = Fixture::new(&config_text("[log]\nfilter = \"info\"\n", &[echo_tool()]));
    let d = Daemon::builder()
        .config(&f.config)
        .state_dir(&f.state)
        .env("TASKGATE_LOG", "info")
        .start();
    let rt = runtime();
    f.rewrite(&config_text("[log]\nfilter = \"debug\"\n", &[echo_tool()]));
    let out = reload_command(&f);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout(&out).contains("no reloadable setting or tool changed"),
        "{out:?}"
    );
    echo(&rt, &d, "quiet");
    assert_eq!(debug_events(&d), 0, "{}", d.log_text());
    assert!(d.stop().success());

    let out = taskgate(
        &[
            "check",
            "--config-only",
            "--config",
            f.config.to_str().unwrap(),
            "--state-dir",
            f.state.to_str().unwrap(),
        ],
        &[("TASKGATE_LOG", "info,=nonsense=")],
    );
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    let line = one_line_stderr(&out);
    assert!(
        line.contains("environment variable TASKGATE_LOG") && line.contains("log.filter"),
        "{line}"
    );
}
