//! Tool containment against the real kernel: every descendant of a tool
//! dies with its task (cancel, and SIGKILL of the daemon), resource limits
//! end runaway tools with the limit named, and Landlock keeps a tool away
//! from the state directory, other tasks' results and the daemon.
//!
//! These tests start real processes that misbehave on purpose (a `setsid`
//! grandchild, a fork bomb, a large file write, a memory hog); they scan
//! /proc for the processes they started.
//!
//! Invariant 13 of the map: No admin operation is reachable from a tool or
//! anything it starts: every admin request must carry the start's key, which
//! lives only in the state directory (never granted to a confined tool) and in
//! the memory of non-dumpable processes (daemon, shim, admin client); an
//! unconfined tool and a daemon running as root are outside this guarantee.
//! Guarded by:
//! `tests/tool_confinement.rs::a_tool_cannot_use_the_admin_socket_at_its_real_path`
//! (the probe also tries as the key every run of 64 hex digits in its
//! environment and its own and its shim's command line, and none may be there),
//! `tests/admin.rs::requests_without_this_starts_admin_key_are_refused_alike`,
//! `tests/tool_confinement.rs::a_tool_cannot_read_the_daemon_or_its_shim_through_proc`
//!
//! What this file proves: slow: a `setsid` grandchild dies with cancel and with
//! `kill -9` of the daemon; fork bomb, 10 GiB write, memory hog and CPU spinner
//! each end `TG_TOOL_LIMIT` naming the key while `/healthz` answers; a confined
//! tool gets EACCES for the store, another task's artifact, the daemon's
//! environ and undeclared paths (and the same probes succeed unconfined); a
//! confined tool connecting to the admin socket by its real path (runtime
//! directory and state directory) is refused `status`, `snapshot` and `reload`
//! and no snapshot appears; run as an unprivileged service user (`useradd`, a
//! private copy of the binary), a tool granted `/proc`, confined or not, gets
//! EACCES for the daemon's and the shim's environ, mem and maps; `[tools]`
//! limits apply to a tool that leaves them out and a tool's own value overrides
//! them; `[tools]` values out of range (file or environment), relative or
//! overlapping the state directory refuse with 78 naming the key; `check`,
//! `status` (text and `--json`) and the log say which confinement is in force,
//! and the option-injection warning reaches the log at warn

mod common;

use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use taskgate::wire;

/// A root with the state directory and a separate directory for the
/// tools' files (FIFOs, declared paths): a tool may be granted `io/` but
/// never the state directory.
struct Fixture {
    root: tempfile::TempDir,
    state: PathBuf,
    io: PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        let root = private_dir();
        let state = state_dir(root.path());
        let io = root.path().join("io");
        std::fs::create_dir(&io).unwrap();
        Fixture { root, state, io }
    }

    /// A configuration of `sections` (after this file's `[tasks]`) and `tools`.
    fn config(&self, sections: &str, tools: &[Tool]) -> PathBuf {
        write_config(
            self.root.path(),
            &format!("[tasks]\npoll_interval_ms = 50\ncancel_grace_ms = 300\n{sections}"),
            tools,
        )
    }

    fn daemon(&self, sections: &str, tools: &[Tool]) -> Daemon {
        let cfg = self.config(sections, tools);
        Daemon::start(&cfg, &self.state, &self.root.path().join("log"))
    }
}

/// Pids of processes whose argv is exactly `argv`.
fn processes(argv: &[&str]) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            (args == argv).then_some(pid)
        })
        .collect()
}

/// Waits up to `limit` for every process with this argv to be gone; the
/// survivors' pids otherwise.
fn gone_within(argv: &[&str], limit: Duration) -> Result<(), Vec<i32>> {
    let deadline = Instant::now() + limit;
    loop {
        let left = processes(argv);
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(left);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A tool whose shell starts a grandchild that leaves the process group
/// and session with `setsid`, says so on a FIFO, and sleeps. The sleeps'
/// lengths tell this test's processes from any other.
fn spawner(fx: &Fixture, name: &str, grand: u32, child: u32) -> Tool {
    Tool::new(name)
        .script(&format!(
            "setsid sh -c 'exec sleep {grand}' & echo started > {}; sleep {child}",
            fx.io.join(name).display()
        ))
        .task("optional")
        .timeout_secs(600)
        .extra(&format!("write_paths = [\"{}\"]", fx.io.display()))
}

/// Waits for the spawner's FIFO line, then for both sleeps to exist.
fn started(fifo: &Fifo, grand: u32, child: u32) {
    fifo.read(Duration::from_secs(20));
    let (g, c) = (grand.to_string(), child.to_string());
    // The grandchild may need a moment to exec after the FIFO was
    // written, and the shell starts the child's sleep only after it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while (processes(&["sleep", &g]).is_empty() || processes(&["sleep", &c]).is_empty())
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        processes(&["sleep", &g]).len(),
        1,
        "the setsid grandchild runs"
    );
    assert_eq!(processes(&["sleep", &c]).len(), 1, "the child runs");
}

fn assert_gone(sleeps: [u32; 2], after: &str) {
    for n in sleeps {
        if let Err(left) = gone_within(&["sleep", &n.to_string()], Duration::from_secs(10)) {
            panic!("sleep {n} outlived {after}: pids {left:?}");
        }
    }
}

#[test]
fn a_setsid_grandchild_dies_when_its_task_is_cancelled() {
    let fx = Fixture::new();
    let (grand, child) = (98_501, 98_401);
    let fifo = Fifo::new(&fx.io.join("spawn"));
    let daemon = fx.daemon("", &[spawner(&fx, "spawn", grand, child)]);
    runtime().block_on(async {
        let c = daemon.client(true);
        let task = c.call_tool("spawn", json!({}), None).await.unwrap();
        assert_eq!(task["resultType"], "task", "{task}");
        started(&fifo, grand, child);
        let id = task["taskId"].as_str().unwrap();
        c.cancel_task(id).await.unwrap();
        let ended = c.wait_task(id, &task).await.unwrap();
        assert_eq!(ended["status"], "cancelled", "{ended}");
    });
    assert_gone([grand, child], "the cancelled task");
    assert!(daemon.stop().success());
}

#[test]
fn a_setsid_grandchild_dies_when_the_daemon_is_killed() {
    let fx = Fixture::new();
    let (grand, child) = (98_502, 98_402);
    let fifo = Fifo::new(&fx.io.join("spawn"));
    // The runs' scratch directories go in a directory of this test's own:
    // in the shared /tmp another test's daemon, starting meanwhile, would
    // sweep the killed run's directory before this test looks for it.
    let run = fx.root.path().join("run");
    std::fs::DirBuilder::new().mode(0o700).create(&run).unwrap();
    let cfg = fx.config("", &[spawner(&fx, "spawn", grand, child)]);
    let start = |log: &str| {
        Daemon::builder()
            .config(&cfg)
            .state_dir(&fx.state)
            .log(&fx.root.path().join(log))
            .env("XDG_RUNTIME_DIR", &run)
            .start()
    };
    let daemon = start("log");
    runtime().block_on(async {
        let task = daemon
            .client(true)
            .call_tool("spawn", json!({}), None)
            .await
            .unwrap();
        assert_eq!(task["resultType"], "task", "{task}");
        started(&fifo, grand, child);
    });
    let pid = daemon.pid().as_raw();
    daemon.kill();
    assert_gone([grand, child], "the daemon's SIGKILL");
    // The killed daemon could not remove the run's scratch directory; the
    // next start does.
    let scratch = || -> Vec<PathBuf> {
        std::fs::read_dir(&run)
            .map(|d| {
                d.flatten()
                    .map(|e| e.path())
                    .filter(|p| {
                        p.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.starts_with(&format!("taskgate-run-{pid}-")))
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(
        scratch().len(),
        1,
        "the killed run's scratch directory is left"
    );
    let again = start("log2");
    assert!(
        scratch().is_empty(),
        "{:?} outlived the next start",
        scratch()
    );
    assert!(again.stop().success());
}

/// `/healthz` polled every 50 ms on its own thread until `done`: the
/// answers that were not 200.
struct Health {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<(usize, Vec<String>)>,
}

impl Health {
    fn watch(port: u16) -> Health {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut bad = Vec::new();
            let mut n = 0;
            while !flag.load(std::sync::atomic::Ordering::SeqCst) {
                let reply = http_get(port, "/healthz");
                n += 1;
                if !reply.starts_with("HTTP/1.1 200") {
                    bad.push(reply);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            (n, bad)
        });
        Health { stop, thread }
    }

    fn done(self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let (n, bad) = self.thread.join().unwrap();
        assert!(n > 0, "healthz was never asked");
        assert!(
            bad.is_empty(),
            "healthz failed {} of {n} times: {bad:?}",
            bad.len()
        );
    }
}

fn limited_tool(name: &str, argv: &[&str], extra: &str) -> Tool {
    Tool::new(name).argv(argv).timeout_secs(120).extra(extra)
}

/// Calls `tool` synchronously and expects it to fail with `TG_TOOL_LIMIT`
/// naming `key`, while /healthz keeps answering.
fn ends_with_limit(fx: &Fixture, tool: &str, argv: &[&str], extra: &str, key: &str) {
    let daemon = fx.daemon("", &[limited_tool(tool, argv, extra)]);
    let health = Health::watch(daemon.port);
    let started = Instant::now();
    let got = runtime().block_on(daemon.client(false).call_tool(tool, json!({}), None));
    let took = started.elapsed();
    health.done();
    let err = match got {
        Err(taskgate::client::ClientError::Rpc { error, .. }) => error,
        other => panic!("{tool}: expected TG_TOOL_LIMIT, got {other:?}"),
    };
    assert_eq!(err["code"], wire::TOOL_LIMIT.code, "{tool}: {err}");
    let message = err["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(key),
        "{tool}: the error names {key}: {message}"
    );
    eprintln!("{tool}: ended by {key} after {took:?}: {message}");
    assert!(daemon.stop().success());
}

/// The bomb doubles at every level like the classic one, but stops after
/// ten levels (at most 1,023 shells, each with a `sleep`): run as root,
/// where RLIMIT_NPROC does not apply, an unbounded bomb that outran the
/// shim's count would take the host's whole pid space, and other work on
/// it with it. Under the service user RLIMIT_NPROC is the hard stop.
#[test]
fn a_fork_bomb_ends_with_the_process_limit_named() {
    let fx = Fixture::new();
    ends_with_limit(
        &fx,
        "bomb",
        &[
            "/bin/sh",
            "-c",
            "f() {{ if [ $1 -lt 9 ]; then f $(($1+1)) & f $(($1+1)) & fi; exec sleep 30; }}; f 0",
        ],
        "max_processes = 32",
        "max_processes",
    );
}

#[test]
fn a_ten_gib_file_write_ends_with_the_file_size_limit_named() {
    let fx = Fixture::new();
    ends_with_limit(
        &fx,
        "fill",
        &["/bin/sh", "-c", "exec head -c 10737418240 /dev/zero > big"],
        "max_file_bytes = 67108864",
        "max_file_bytes",
    );
}

#[test]
fn a_memory_hog_ends_with_the_address_space_limit_named() {
    let fx = Fixture::new();
    ends_with_limit(
        &fx,
        "hog",
        &["/usr/bin/tail", "/dev/zero"],
        "max_address_space_bytes = 268435456",
        "max_address_space_bytes",
    );
}

#[test]
fn a_cpu_spinner_ends_with_the_cpu_limit_named() {
    let fx = Fixture::new();
    ends_with_limit(
        &fx,
        "spin",
        &["/bin/sh", "-c", "while :; do :; done"],
        "max_cpu_secs = 1",
        "max_cpu_secs",
    );
}

/// Each probe runs a command and prints `NAME ok` or `NAME failed: ERROR`.
/// (Braces are doubled: the argv template reads `{{` as a literal brace.)
const PROBES: &str = r#"r() {{ n=$1; shift; if e=$("$@" 2>&1 >/dev/null); then echo "$n ok"; else echo "$n failed: $e"; fi; }}
r read_db cat "$1/tasks.db"
r list_state ls "$1"
r write_state touch "$1/stray"
r read_artifact cat "$2"
r read_daemon_environ cat "/proc/$3/environ"
r write_outside touch "$5"
r write_declared touch "$4/declared"
r write_scratch touch ./scratch-file
echo "scratch $(pwd) $(stat -c %a .)"
echo "secret [${{SECRET-}}]""#;

fn probe_tool(name: &str, fx: &Fixture) -> Tool {
    Tool::new(name)
        .script(PROBES)
        .args(&[
            "probe",
            "{state}",
            "{artifact}",
            "{pid}",
            "{io}",
            "{outside}",
        ])
        .timeout_secs(60)
        .extra(&format!("write_paths = [\"{}\"]", fx.io.display()))
        .param("state", "string")
        .param("artifact", "string")
        .param("pid", "string")
        .param("io", "string")
        .param("outside", "string")
}

/// The probes' lines by name.
fn probe_results(text: &str) -> std::collections::BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A confined tool is denied the state directory (the database, the
/// listing, a new file), another task's artifact, the daemon's
/// environment and any undeclared path, while it writes its scratch
/// directory and its declared path; the same probes run unconfined
/// succeed, so the denials are the confinement's doing. The daemon's
/// `SECRET` never reaches either tool.
#[test]
fn a_confined_tool_reaches_only_its_scratch_and_declared_paths() {
    let fx = Fixture::new();
    let cfg = fx.config(
        "",
        &[
            probe_tool("probe", &fx),
            probe_tool("probe_unconfined", &fx)
                .unconfined("the same probes, to show the denials are the sandbox's"),
            Tool::new("big")
                .script("head -c 102400 /dev/zero | tr '\\0' 'a'")
                .task("optional"),
        ],
    );
    let daemon = Daemon::builder()
        .config(&cfg)
        .state_dir(&fx.state)
        .log(&fx.root.path().join("log"))
        .env("SECRET", "x-daemon-secret")
        .start();
    let outside = fx.root.path().join("outside");
    let run = |tool: &str, artifact: &std::path::Path| -> String {
        let args = json!({
            "state": fx.state.display().to_string(),
            "artifact": artifact.display().to_string(),
            "pid": daemon.pid().as_raw().to_string(),
            "io": fx.io.display().to_string(),
            "outside": outside.display().to_string(),
        });
        let got = runtime()
            .block_on(daemon.client(false).call_tool(tool, args, None))
            .unwrap();
        got["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    // Another task's spilled result.
    let artifact = runtime().block_on(async {
        let c = daemon.client(true);
        let task = c.call_tool("big", json!({}), None).await.unwrap();
        let id = task["taskId"].as_str().unwrap().to_string();
        let done = c.wait_task(&id, &task).await.unwrap();
        assert_eq!(done["status"], "completed", "{done}");
        fx.state.join("artifacts").join(format!("{id}.json"))
    });
    assert!(
        artifact.is_file(),
        "the big result was spilled to {artifact:?}"
    );

    let confined = run("probe", &artifact);
    eprintln!("confined:\n{confined}");
    let got = probe_results(&confined);
    for denied in [
        "read_db",
        "list_state",
        "write_state",
        "read_artifact",
        "read_daemon_environ",
        "write_outside",
    ] {
        let line = got.get(denied).map(String::as_str).unwrap_or("missing");
        assert!(
            line.starts_with("failed:") && line.contains("Permission denied"),
            "{denied}: {line}\n{confined}"
        );
    }
    for allowed in ["write_declared", "write_scratch"] {
        assert_eq!(
            got.get(allowed).map(String::as_str),
            Some("ok"),
            "{allowed}\n{confined}"
        );
    }
    assert_eq!(
        got.get("secret").map(String::as_str),
        Some("[]"),
        "{confined}"
    );
    assert!(!fx.state.join("stray").exists());
    assert!(!outside.exists());
    assert!(fx.io.join("declared").exists());
    // The scratch directory was private to the run and is gone after it.
    let scratch = got.get("scratch").cloned().unwrap_or_default();
    let (dir, mode) = scratch.rsplit_once(' ').unwrap_or_default();
    assert_eq!(mode, "700", "{scratch}");
    assert!(!std::path::Path::new(dir).exists(), "{dir} was removed");

    // The same probes with the confinement off reach everything (this
    // test runs as root): the denials above are Landlock's.
    let open = run("probe_unconfined", &artifact);
    eprintln!("unconfined:\n{open}");
    let got = probe_results(&open);
    for name in [
        "read_db",
        "list_state",
        "write_state",
        "read_artifact",
        "read_daemon_environ",
        "write_outside",
    ] {
        assert_eq!(
            got.get(name).map(String::as_str),
            Some("ok"),
            "{name}\n{open}"
        );
    }
    assert_eq!(got.get("secret").map(String::as_str), Some("[]"), "{open}");
    let _ = std::fs::remove_file(fx.state.join("stray"));
    assert!(daemon.stop().success());
}

/// `taskgate check` says which confinement is in force on this kernel and
/// warns about a placeholder that fills a whole argv element unguarded;
/// a declared path that overlaps the state directory refuses the start
/// (78), as serve would.
#[test]
fn check_names_the_confinement_warns_of_option_injection_and_refuses_the_state_directory() {
    let fx = Fixture::new();
    let cfg = fx.config(
        "",
        &[
            Tool::new("lister")
                .argv(&["/bin/ls", "-l", "{path}"])
                .param("path", "string"),
            Tool::new("safe_lister")
                .argv(&["/bin/ls", "-l", "--", "{path}"])
                .param("path", "string"),
        ],
    );
    let (cfg_s, state_s) = (cfg.display().to_string(), fx.state.display().to_string());
    let out = taskgate(
        &[
            "check",
            "--config-only",
            "--config",
            &cfg_s,
            "--state-dir",
            &state_s,
        ],
        &[],
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let abi = text
        .lines()
        .find(|l| l.starts_with("tool confinement: "))
        .unwrap_or_else(|| panic!("no confinement line: {text}"));
    assert!(abi.contains("Landlock ABI "), "{abi}");
    eprintln!("{abi}");
    let warnings: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("warning: "))
        .collect();
    assert_eq!(warnings.len(), 1, "{text}");
    assert!(
        warnings[0].contains("\"lister\"") && warnings[0].contains("{path}"),
        "{text}"
    );

    // A declared path holding the state directory is refused, by check and serve.
    let bad = fx.config(
        &format!(
            "[[tool]]\nname = \"greedy\"\nargv = [\"/bin/true\"]\nwrite_paths = [\"{}\"]\n",
            fx.root.path().display()
        ),
        &[],
    );
    for command in ["check", "serve"] {
        let out = taskgate(
            &[
                command,
                "--config",
                &bad.display().to_string(),
                "--state-dir",
                &state_s,
            ],
            &[],
        );
        assert_eq!(out.status.code(), Some(78), "{command}: {out:?}");
        let line = one_line_stderr(&out);
        assert!(
            line.contains("greedy") && line.contains("no tool may reach"),
            "{line}"
        );
    }
}

/// A `[tools]` limit applies to every tool that does not set its own, and
/// a tool's own value overrides it: with `tools.max_file_bytes` at 1 MiB a
/// 2 MiB write ends the tool that leaves the key out (`TG_TOOL_LIMIT`
/// naming it), while the tool that sets 4 MiB writes the same file.
#[test]
fn tools_section_limits_apply_unless_a_tool_overrides_them() {
    let fx = Fixture::new();
    let write = &["/bin/sh", "-c", "exec head -c 2097152 /dev/zero > f"];
    let daemon = fx.daemon(
        "[tools]\nmax_file_bytes = 1048576\n",
        &[
            limited_tool("inherits", write, ""),
            limited_tool("overrides", write, "max_file_bytes = 4194304"),
        ],
    );
    let client = daemon.client(false);
    let got = runtime().block_on(client.call_tool("inherits", json!({}), None));
    let err = match got {
        Err(taskgate::client::ClientError::Rpc { error, .. }) => error,
        other => panic!("inherits: expected TG_TOOL_LIMIT, got {other:?}"),
    };
    assert_eq!(err["code"], wire::TOOL_LIMIT.code, "{err}");
    let message = err["message"].as_str().unwrap_or_default();
    assert!(message.contains("max_file_bytes"), "{message}");
    let got = runtime()
        .block_on(client.call_tool("overrides", json!({}), None))
        .unwrap_or_else(|e| panic!("overrides: the 2 MiB write under its own 4 MiB limit: {e:?}"));
    assert_eq!(got["isError"], false, "{got}");
    assert!(daemon.stop().success());
}

/// `[tools]` values are checked like every setting: out of range, from the
/// file or the environment, or a relative path, refuses the start with 78
/// naming the key; a default path that overlaps the state directory is
/// refused for the tools that inherit it.
#[test]
fn tools_section_values_out_of_range_are_refused_naming_the_key() {
    let fx = Fixture::new();
    let state_s = fx.state.display().to_string();
    let tool = limited_tool("plain", &["/bin/true"], "");
    // (file text, environment, what the refusal names)
    type Case<'a> = (String, &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case; 5] = [
        (
            format!("[tools]\nmax_processes = 0\n{tool}"),
            &[],
            "tools.max_processes",
        ),
        (
            format!("[tools]\nmax_address_space_bytes = 1024\n{tool}"),
            &[],
            "tools.max_address_space_bytes",
        ),
        (
            tool.to_string(),
            &[("TASKGATE_TOOLS_MAX_CPU_SECS", "0")],
            "TASKGATE_TOOLS_MAX_CPU_SECS",
        ),
        (
            format!("[tools]\nread_paths = [\"opt/x\"]\n{tool}"),
            &[],
            "tools.read_paths",
        ),
        (
            format!(
                "[tools]\nread_paths = [{:?}]\n{tool}",
                fx.state.display().to_string()
            ),
            &[],
            "no tool may reach",
        ),
    ];
    for (text, env, named) in cases {
        let cfg = fx.config(&text, &[]);
        for command in ["check", "serve"] {
            let out = taskgate(
                &[
                    command,
                    "--config",
                    &cfg.display().to_string(),
                    "--state-dir",
                    &state_s,
                ],
                env,
            );
            assert_eq!(out.status.code(), Some(78), "{command} {text}: {out:?}");
            let line = one_line_stderr(&out);
            assert!(line.contains(named), "{command}: {named} in {line}");
        }
    }
    // In range: accepted, and the tool that inherits it shows it.
    let cfg = fx.config("[tools]\nmax_processes = 7\n", &[tool]);
    let out = taskgate(
        &[
            "check",
            "--config-only",
            "--config",
            &cfg.display().to_string(),
            "--state-dir",
            &fx.state.display().to_string(),
        ],
        &[],
    );
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("tool \"plain\": confined (Landlock);") && text.contains("max_processes 7,"),
        "{text}"
    );
}

/// `taskgate check`, `taskgate status` (text and `--json`) and the serve
/// log all say which confinement is in force: the kernel's Landlock ABI,
/// each tool's sandbox and limits (a `[tools]` default and a tool's own
/// value), the subreaper; the option-injection warning reaches the log at
/// warn level as well as `check`.
#[test]
fn check_status_and_the_log_say_which_confinement_is_in_force() {
    let fx = Fixture::new();
    let sections = "\n[tools]\nmax_processes = 7\n";
    let tools = [
        Tool::new("boxed")
            .argv(&["/bin/ls", "-l", "{path}"])
            .param("path", "string"),
        Tool::new("loose")
            .argv(&["/bin/true"])
            .unconfined("for check and status to name")
            .extra("max_processes = 3"),
    ];
    let boxed = "tool \"boxed\": confined (Landlock); max_address_space_bytes 4294967296, max_open_files 1024, max_processes 7,";
    let loose = "tool \"loose\": unconfined (sandbox = \"unconfined\"";
    let cfg = fx.config(sections, &tools);
    let out = taskgate(
        &[
            "check",
            "--config-only",
            "--config",
            &cfg.display().to_string(),
            "--state-dir",
            &fx.state.display().to_string(),
        ],
        &[],
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{out:?}");
    let first = text
        .lines()
        .find(|l| l.starts_with("tool confinement: Landlock ABI "))
        .unwrap_or_else(|| panic!("no Landlock line (these kernels have ABI 7): {text}"));
    assert!(
        first.contains("subreaper kills every descendant"),
        "{first}"
    );
    assert!(text.contains(boxed), "{text}");
    assert!(
        text.contains(loose) && text.contains("max_processes 3,"),
        "{text}"
    );
    assert!(
        text.contains("warning: tool \"boxed\": argv element 2 starts with {path}"),
        "{text}"
    );

    let daemon = fx.daemon(sections, &tools);
    let state = fx.state.display().to_string();
    let out = taskgate(&["status", "--json", "--state-dir", &state], &[]);
    assert!(out.status.success(), "{out:?}");
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let c = &status["confinement"];
    let abi: i64 = first["tool confinement: Landlock ABI ".len()..]
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{first}"));
    assert_eq!(c["landlock_abi"], abi, "{c}");
    assert_eq!(c["subreaper_kill"], true, "{c}");
    assert_eq!(c["no_new_privs"], true, "{c}");
    let by_name = |n: &str| {
        c["tools"]
            .as_array()
            .and_then(|a| a.iter().find(|t| t["name"] == n))
            .cloned()
            .unwrap_or_else(|| panic!("{n} not in {c}"))
    };
    assert_eq!(by_name("boxed")["sandbox"], "confined");
    assert_eq!(by_name("boxed")["max_processes"], 7);
    assert_eq!(by_name("loose")["sandbox"], "unconfined");
    assert_eq!(by_name("loose")["max_processes"], 3);
    let out = taskgate(&["status", "--state-dir", &state], &[]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        text.contains(first) && text.contains(boxed) && text.contains(loose),
        "{text}"
    );

    let log = daemon.log_text();
    assert!(daemon.stop().success());
    assert!(log.contains(first), "{log}");
    let warned = log
        .lines()
        .any(|l| l.contains(" WARN ") && l.contains("argv element 2 starts with {path}"));
    assert!(
        warned,
        "the option-injection warning at warn level in the log: {log}"
    );
}

/// The admin socket probe: for each socket path given, connect and send
/// `status`, a `snapshot` into the tool's own scratch directory (where it
/// could read the copy) and into `io/`, and `reload`, printing each
/// answer line; then list any snapshot that appeared. Run by perl, which
/// every Debian system has (perl-base is essential).
const ADMIN_PROBE: &str = r#"use strict; use warnings; use IO::Socket::UNIX; use Cwd;
my $io = shift @ARGV;
# Every run of 64 hex digits (an admin key's form) the tool can see without
# the state directory: its environment, its own command line and its
# shim's. Each is tried as the key, besides no key at all.
my @seen = values %ENV;
for my $f ("/proc/self/cmdline", "/proc/" . getppid() . "/cmdline") {
  next unless open(my $fh, "<", $f);
  local $/;
  my $text = <$fh>;
  push @seen, split(/\0/, defined $text ? $text : "");
}
my %found = map { lc($_) => 1 } map { /([0-9a-fA-F]{64})/g } @seen;
print "key seen $_\n" for sort keys %found;
my @keys = ("", sort keys %found);
my $n = 0;
for my $sock (@ARGV) {
  for my $op ("status", "snapshot_scratch", "snapshot_io", "reload") {
   for my $key (@keys) {
    $n++;
    my $with = $key eq "" ? "" : ',"key":"' . $key . '"';
    my $req = $op eq "status" ? '{"op":"status"' . $with . '}'
      : $op eq "reload" ? '{"op":"reload"' . $with . '}'
      : $op eq "snapshot_scratch" ? '{"op":"snapshot","to":"' . getcwd() . "/snap$n" . '"' . $with . '}'
      : '{"op":"snapshot","to":"' . "$io/snap$n" . '"' . $with . '}';
    my $s = IO::Socket::UNIX->new(Type => SOCK_STREAM(), Peer => $sock);
    if (!$s) { print "$op $sock connect failed: $!\n"; next; }
    print $s "$req\n";
    my $answer = <$s>;
    $answer = "" unless defined $answer;
    chomp $answer;
    print "$op $sock answer $answer\n";
   }
  }
}
for my $f (glob("snap*"), glob("$io/snap*")) { print "found $f\n"; }
"#;

/// A tool runs as the daemon's user, so the admin socket's uid check lets
/// it connect, and Landlock does not mediate `connect` on a pathname
/// socket: a confined tool that connects to the socket by its real path,
/// in the runtime directory (`../admin.sock` beside its scratch directory,
/// as under the unit) or in the state directory, and asks for `status`, a
/// `snapshot` (into its scratch directory, where it could read the copy,
/// and elsewhere) and a `reload`, is refused each time, and no snapshot
/// appears and no reload happens: it cannot present the admin key, which
/// is only in the state directory's `tasks.lock`. Nothing the tool can see
/// outside it (its environment, its own and its shim's command line) holds
/// anything of a key's form: the probe would try it as the key.
#[test]
fn a_tool_cannot_use_the_admin_socket_at_its_real_path() {
    for runtime_dir in [true, false] {
        let fx = Fixture::new();
        let probe = fx.io.join("probe.pl");
        std::fs::write(&probe, ADMIN_PROBE).unwrap();
        let io = fx.io.display().to_string();
        let cfg = fx.config(
            "",
            &[Tool::new("admin_probe")
                .argv(&[
                    "/usr/bin/perl",
                    &probe.display().to_string(),
                    &io,
                    "../admin.sock",
                    "{socket}",
                ])
                .timeout_secs(60)
                .extra(&format!("read_paths = [\"{io}\"]"))
                .param("socket", "string")],
        );
        let run = fx.root.path().join("run");
        std::fs::DirBuilder::new().mode(0o700).create(&run).unwrap();
        let mut builder = Daemon::builder()
            .config(&cfg)
            .state_dir(&fx.state)
            .log(&fx.root.path().join("log"));
        if runtime_dir {
            builder = builder.env("RUNTIME_DIRECTORY", &run);
        }
        let mut daemon = builder.start();
        let socket = if runtime_dir {
            run.join("admin.sock")
        } else {
            fx.state.join("admin.sock")
        };
        assert!(socket.exists(), "{socket:?}");
        let got = runtime()
            .block_on(daemon.client(false).call_tool(
                "admin_probe",
                json!({"socket": socket.display().to_string()}),
                None,
            ))
            .unwrap();
        let text = got["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        eprintln!("runtime directory {runtime_dir}:\n{text}");
        assert!(
            !text.contains("key seen "),
            "the tool saw something of an admin key's form:\n{text}"
        );
        let answers: Vec<&str> = text.lines().filter(|l| l.contains(" answer ")).collect();
        // With the runtime directory both paths name the socket; without
        // it `../admin.sock` is nothing (the scratch directory is in /tmp).
        let expected = if runtime_dir { 8 } else { 4 };
        assert_eq!(answers.len(), expected, "{text}");
        for line in &answers {
            let answer = line.split_once(" answer ").map(|(_, a)| a).unwrap_or("");
            let answer: serde_json::Value = serde_json::from_str(answer)
                .unwrap_or_else(|e| panic!("{line}: not an answer line ({e})\n{text}"));
            assert_eq!(answer["answer"], "error", "{line}");
            assert!(
                answer["message"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("did not carry this daemon's admin key"),
                "{line}"
            );
        }
        assert!(!text.contains("found "), "a snapshot appeared:\n{text}");
        let left: Vec<_> = std::fs::read_dir(&fx.io)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .filter(|n| n.to_string_lossy().starts_with("snap"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        assert!(
            !daemon
                .notifications()
                .iter()
                .any(|n| n.contains("RELOADING=1")),
            "the tool made the daemon reload"
        );
        // The operator is still served.
        let out = taskgate(
            &["status", "--state-dir", &fx.state.display().to_string()],
            &[],
        );
        assert!(out.status.success(), "{out:?}");
        assert!(daemon.stop().success());
    }
}

/// The /proc probes of the service-user test: the daemon's (`$1`) and the
/// shim's (`$PPID`: the tool's parent) environment, memory and maps; the
/// command lines say which processes these are.
const PROC_PROBES: &str = r#"r() {{ n=$1; shift; if e=$("$@" 2>&1 >/dev/null); then echo "$n ok"; else echo "$n failed: $e"; fi; }}
r daemon_environ cat "/proc/$1/environ"
r daemon_mem cat "/proc/$1/mem"
r daemon_maps cat "/proc/$1/maps"
r shim_environ cat "/proc/$PPID/environ"
r shim_mem cat "/proc/$PPID/mem"
r shim_maps cat "/proc/$PPID/maps"
echo "daemon_cmdline $(tr '\0' ' ' < /proc/$1/cmdline)"
echo "shim_cmdline $(tr '\0' ' ' < /proc/$PPID/cmdline)"
echo "uid $(id -u)""#;

/// Run as an unprivileged service user (root would bypass all of this),
/// the daemon and the shim it runs each tool under are not dumpable: a
/// tool granted `/proc`, confined or not, reading as the same user gets
/// `Permission denied` for the daemon's and the shim's environment,
/// memory and maps. The daemon serves calls, its scratch directories and
/// `taskgate status` as that user all the same.
#[test]
fn a_tool_cannot_read_the_daemon_or_its_shim_through_proc() {
    prereq::require_root("creates a service user and runs the daemon as it");
    let user = service_user();
    let (uid, gid) = (user.uid.as_raw(), user.gid.as_raw());
    // A directory the service user can enter, holding the binary it runs,
    // its configuration and its state directory.
    let bin = binary_for_other_users();
    let state = bin.dir().join("state");
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&state)
        .unwrap();
    nix::unistd::chown(&state, Some(user.uid), Some(user.gid)).unwrap();
    let tool = |name: &str| {
        Tool::new(name)
            .script(PROC_PROBES)
            .args(&["probe", "{pid}"])
            .timeout_secs(60)
            .extra("read_paths = [\"/proc\"]")
            .param("pid", "string")
    };
    let cfg = write_config(
        bin.dir(),
        "",
        &[
            tool("proc_probe"),
            tool("proc_probe_unconfined").unconfined("the same probes without the sandbox"),
        ],
    );
    std::fs::set_permissions(&cfg, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let log = bin.dir().join("log");
    let daemon = Daemon::builder()
        .program(&bin.path)
        .user(uid, gid)
        .config(&cfg)
        .state_dir(&state)
        .log(&log)
        .env("SECRET", "x-daemon-secret")
        .start();
    let pid = daemon.pid().as_raw();
    for name in ["proc_probe", "proc_probe_unconfined"] {
        let got = runtime()
            .block_on(
                daemon
                    .client(false)
                    .call_tool(name, json!({"pid": pid.to_string()}), None),
            )
            .unwrap();
        let text = got["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        eprintln!("{name}:\n{text}");
        let got = probe_results(&text);
        assert_eq!(got.get("uid"), Some(&uid.to_string()), "{text}");
        assert!(
            got.get("daemon_cmdline")
                .is_some_and(|c| c.contains(" serve ")),
            "{text}"
        );
        assert!(
            got.get("shim_cmdline")
                .is_some_and(|c| c.contains(" exec-tool ")),
            "{text}"
        );
        for denied in [
            "daemon_environ",
            "daemon_mem",
            "daemon_maps",
            "shim_environ",
            "shim_mem",
            "shim_maps",
        ] {
            let line = got.get(denied).map(String::as_str).unwrap_or("missing");
            assert!(
                line.starts_with("failed:") && line.contains("Permission denied"),
                "{name}: {denied}: {line}\n{text}"
            );
        }
    }
    // The operator's view as the service user and as root.
    let out = std::process::Command::new(&bin.path)
        .args(["status", "--state-dir", &state.display().to_string()])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .current_dir("/")
        .uid(uid)
        .gid(gid)
        .output()
        .unwrap();
    assert!(out.status.success(), "status as the service user: {out:?}");
    let out = taskgate(
        &["status", "--state-dir", &state.display().to_string()],
        &[],
    );
    assert!(out.status.success(), "status as root: {out:?}");
    assert!(daemon.stop().success());
}
