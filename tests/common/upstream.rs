//! Upstream MCP servers for tests: the misbehaving stdlib server
//! (tests/interop/upstream_hostile.py) behind a wrapper script that gives
//! it its environment and records its pid, the independent SDK servers of
//! scripts/upstream-servers.sh, `[[upstream]]` tables for them, and waiting
//! for the daemon to say where each upstream stands.

#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const HOSTILE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/interop/upstream_hostile.py"
);
pub const INTEROP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop");
pub const SERVERS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/upstream-servers.sh");

/// Where a test's upstream wrappers and their outputs live: `bin/` (read
/// and executed by the confined upstream) and `out/` (written by it), apart
/// from the state directory, which no upstream may reach.
pub struct Place {
    pub bin: PathBuf,
    pub out: PathBuf,
}

impl Place {
    pub fn new(root: &Path) -> Place {
        let bin = root.join("bin");
        let out = root.join("out");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::create_dir_all(&out).unwrap();
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777)).unwrap();
        Place { bin, out }
    }

    /// A wrapper that records its pid in `out/NAME.pid`, sets `env` and
    /// runs the hostile server in `mode` over stdio.
    pub fn hostile(&self, name: &str, mode: &str, env: &[(&str, &str)]) -> PathBuf {
        let mut script = String::from("#!/bin/sh\n");
        script += &format!("echo $$ > {}/{name}.pid\n", self.out.display());
        for (k, v) in env {
            script += &format!("export {k}='{v}'\n");
        }
        script += &format!("exec /usr/bin/python3 {HOSTILE} {mode} stdio\n");
        let path = self.bin.join(format!("{name}.sh"));
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    /// The `[[upstream]]` table of a hostile server, confined by Landlock
    /// to its wrapper, the server's directory and `out/`.
    pub fn hostile_table(
        &self,
        alias: &str,
        mode: &str,
        env: &[(&str, &str)],
        extra: &str,
    ) -> String {
        let wrapper = self.hostile(alias, mode, env);
        format!(
            "[[upstream]]\nalias = \"{alias}\"\ncommand = [\"/bin/sh\", \"{}\"]\nread_paths = [\"{}\", \"{INTEROP}\"]\nwrite_paths = [\"{}\"]\n{extra}\n",
            wrapper.display(),
            self.bin.display(),
            self.out.display()
        )
    }

    /// The pid the wrapper of `name` recorded.
    pub fn pid(&self, name: &str) -> i32 {
        std::fs::read_to_string(self.out.join(format!("{name}.pid")))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }
}

/// An SDK server over stdio (`fastmcp` or `ts`), as an `[[upstream]]`
/// table. It runs unconfined: its interpreter and packages live in the
/// build tree, which the script installs into on first use. Node reserves
/// tens of GiB of address space for WebAssembly, past the 4 GiB default of
/// `max_address_space_bytes`.
pub fn sdk_stdio_table(alias: &str, sdk: &str, extra: &str) -> String {
    format!(
        "[[upstream]]\nalias = \"{alias}\"\ncommand = [\"/bin/bash\", \"{SERVERS}\", \"{sdk}\", \"stdio\"]\nenv = [\"PATH\", \"HOME\"]\nsandbox = \"unconfined\"\nmax_address_space_bytes = 68719476736\n{extra}\n"
    )
}

/// An HTTP upstream server started by the test, killed when dropped.
pub struct HttpServer {
    pub child: Child,
    pub port: u16,
}

impl HttpServer {
    /// `scripts/upstream-servers.sh ARGS… http 0`, waiting for its
    /// `LISTENING <port>` line.
    pub fn start(args: &[&str], env: &[(&str, &str)]) -> HttpServer {
        let mut cmd = Command::new("/bin/bash");
        cmd.arg(SERVERS)
            .args(args)
            .args(["http", "0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("start the upstream server");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if let Some(port) = line.strip_prefix("LISTENING ") {
                    let _ = tx.send(port.trim().parse::<u16>().unwrap_or(0));
                }
            }
        });
        let port = rx
            .recv_timeout(Duration::from_secs(180))
            .expect("the upstream server printed no LISTENING line within 180 s");
        HttpServer { child, port }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The daemon's status of each upstream, by alias.
pub fn upstreams(state: &Path) -> Vec<Value> {
    super::admin_status(state)["upstreams"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Waits until `done` holds of the upstream `alias` as `status` shows it;
/// that status.
pub fn wait_upstream(
    state: &Path,
    alias: &str,
    limit: Duration,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let start = Instant::now();
    loop {
        let all = upstreams(state);
        if let Some(u) = all.iter().find(|u| u["alias"] == alias)
            && done(u)
        {
            return u.clone();
        }
        assert!(
            start.elapsed() < limit,
            "upstream {alias} did not get there within {limit:?}: {all:#?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until the file at `path` holds `needle`; its text then.
pub fn wait_text(path: &Path, needle: &str, limit: Duration) -> String {
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(needle) {
            return text;
        }
        assert!(
            start.elapsed() < limit,
            "{} never held {needle:?} within {limit:?}: {text:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The task id of a `tools/call` answer that made a task.
pub fn task_id(handle: &Value) -> String {
    handle["task"]["taskId"]
        .as_str()
        .or(handle["taskId"].as_str())
        .unwrap_or_else(|| panic!("not a task: {handle}"))
        .to_string()
}

pub fn is_ready(u: &Value) -> bool {
    u["state"] == "ready"
}

/// The registered name of a JSON-RPC error a call got.
pub fn error_name(e: &taskgate::client::ClientError) -> String {
    match e {
        taskgate::client::ClientError::Rpc { error, .. } => error["data"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        other => format!("not a JSON-RPC error: {other}"),
    }
}

/// The text of a tool result.
pub fn text(result: &Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// `GET /healthz` answers 200.
pub fn healthy(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    if s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.1 200")
}
