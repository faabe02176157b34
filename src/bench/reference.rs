//! The servers the benchmark holds taskgate against, in the same run: the
//! bare rmcp service (`examples/bare_rmcp.rs`: rmcp's
//! `StreamableHttpService` with one no-op tool and nothing else), started
//! here as a child process, and any MCP server an operator names with
//! `--compare URL` on a loopback address.
//!
//! A reference that cannot be found, started or driven is never a failed
//! run: the report says "not measured" and why. Only a `--compare` URL
//! that is not loopback is refused, before anything starts.

use std::io::BufRead as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long the bare server may take to print its address.
const START_WAIT: Duration = Duration::from_secs(30);

/// Where cargo puts the example beside the binary it builds
/// (`target/<profile>/examples/bare_rmcp`).
const BESIDE_EXE: &str = "examples/bare_rmcp";

/// A reference server this run started; killed when dropped.
pub struct Started {
    child: Child,
    pub url: String,
}

impl Started {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The bare rmcp binary: `explicit` (`--bare-rmcp`), else the example
/// beside the running executable. `Err` says why there is none.
pub fn bare_rmcp_path(explicit: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    let exe = std::env::current_exe()
        .map_err(|e| format!("the running executable's path is unknown ({e})"))?;
    let dir = exe
        .parent()
        .ok_or_else(|| format!("{} has no directory", exe.display()))?;
    let p = dir.join(BESIDE_EXE);
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!(
            "no bare rmcp server: {} does not exist (build it with `cargo build --release \
             --examples`, or name it with --bare-rmcp PATH)",
            p.display()
        ))
    }
}

/// Starts the bare rmcp server on an ephemeral loopback port, its stderr
/// into `log`, and returns once it has printed its address.
pub fn start_bare(path: &Path, log: &Path) -> Result<Started, String> {
    let log_file = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let mut child = Command::new(path)
        .arg("0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log_file)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", path.display()))?;
    let Some(stdout) = child.stdout.take() else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(format!("{}: no stdout", path.display()));
    };
    let mut started = Started {
        child,
        url: String::new(),
    };
    // The line is read on a thread so that a server that never prints is
    // given up on; the thread ends when the child does (killed on drop).
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let read = std::io::BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(read.map(|_| line));
    });
    let line = match rx.recv_timeout(START_WAIT) {
        Ok(Ok(line)) => line,
        Ok(Err(e)) => return Err(format!("{}: reading its address: {e}", path.display())),
        Err(_) => {
            return Err(format!(
                "{} printed no address within {} s",
                path.display(),
                START_WAIT.as_secs()
            ));
        }
    };
    let addr: SocketAddr = line.trim().parse().map_err(|_| {
        let detail = std::fs::read_to_string(log).unwrap_or_default();
        format!(
            "{} printed {:?}, not an address{}",
            path.display(),
            line.trim(),
            if detail.trim().is_empty() {
                String::new()
            } else {
                format!(": {}", detail.trim())
            }
        )
    })?;
    if !addr.ip().is_loopback() {
        return Err(format!(
            "{} listens on {addr}, not on loopback",
            path.display()
        ));
    }
    started.url = format!("http://{addr}/mcp");
    Ok(started)
}

/// A server named by `--compare`: its URL, and the process whose CPU is
/// read (given, or found as the owner of the listening socket).
#[derive(Debug, Clone)]
pub struct Compared {
    pub url: String,
    pub pid: Option<u32>,
    /// How the process was found, or why it was not.
    pub pid_note: String,
}

/// Checks a `--compare` URL: plain `http://` to a loopback address only,
/// since the benchmark never sends traffic beyond this host. `Err` is the
/// usage refusal's text.
pub fn compare_target(url: &str, pid: Option<u32>) -> Result<Compared, String> {
    let uri: hyper::Uri = url
        .parse()
        .map_err(|_| format!("--compare {url}: not an http://HOST:PORT/PATH URL"))?;
    if uri.scheme_str() != Some("http") {
        return Err(format!(
            "--compare {url}: only plain http:// to a loopback address is driven"
        ));
    }
    let host = uri
        .host()
        .ok_or_else(|| format!("--compare {url}: no host"))?;
    let port = uri
        .port_u16()
        .ok_or_else(|| format!("--compare {url}: no port"))?;
    // An address, never a name: a name could resolve beyond this host.
    // An IPv6 address comes in brackets.
    let loopback = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback());
    if !loopback {
        return Err(format!(
            "--compare {url}: {host} is not a loopback address (127.0.0.0/8 or [::1], as an \
             address, not a name); the benchmark never sends traffic beyond this host"
        ));
    }
    let (pid, pid_note) = match pid {
        Some(p) if Path::new(&format!("/proc/{p}/stat")).is_file() => {
            (Some(p), format!("process {p}, as given by --compare-pid"))
        }
        Some(p) => return Err(format!("--compare-pid {p}: no such process")),
        None => match listener_pid(port) {
            Some(p) => (
                Some(p),
                format!("process {p}, the owner of the socket listening on port {port}"),
            ),
            None => (
                None,
                format!(
                    "no process of this user listens on port {port} (name it with --compare-pid)"
                ),
            ),
        },
    };
    Ok(Compared {
        url: url.to_string(),
        pid,
        pid_note,
    })
}

/// The process holding the socket that listens on loopback `port`, when
/// this user may read its descriptors: the socket's inode from
/// /proc/net/tcp{,6}, then the process with a descriptor on it.
fn listener_pid(port: u16) -> Option<u32> {
    // State 0A is LISTEN; the local address is hex `ADDR:PORT`.
    let want = format!(":{port:04X}");
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() > 9 && f[1].ends_with(&want) && f[3] == "0A" {
                inodes.push(format!("socket:[{}]", f[9]));
            }
        }
    }
    if inodes.is_empty() {
        return None;
    }
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path())
                && inodes.iter().any(|i| target.as_os_str() == i.as_str())
            {
                return Some(pid);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_accepts_loopback_addresses_only() {
        for ok in [
            "http://127.0.0.1:9/mcp",
            "http://127.1.2.3:9/mcp",
            "http://[::1]:9/mcp",
        ] {
            let c = compare_target(ok, None).unwrap_or_else(|e| panic!("{ok}: {e}"));
            assert_eq!(c.url, ok);
        }
        for refused in [
            "http://10.0.0.1:9/mcp",
            "http://example.com:9/mcp",
            "http://localhost:9/mcp",
            "http://[2001:db8::1]:9/mcp",
            "http://[::ffff:10.0.0.1]:9/mcp",
            "https://127.0.0.1:9/mcp",
            "http://127.0.0.1/mcp",
            "not a url",
        ] {
            assert!(compare_target(refused, None).is_err(), "{refused}");
        }
    }

    #[test]
    fn the_owner_of_a_listening_socket_is_found() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert_eq!(listener_pid(port), Some(std::process::id()));
        let c = compare_target(&format!("http://127.0.0.1:{port}/mcp"), None).unwrap();
        assert_eq!(c.pid, Some(std::process::id()));
    }
}
