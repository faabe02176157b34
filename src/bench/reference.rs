//! The servers the benchmark holds taskgate against, in the same run: the
//! bare rmcp service (`examples/bare_rmcp.rs`: rmcp's
//! `StreamableHttpService` with one no-op tool and nothing else), started
//! here as a child process.
//!
//! A reference that cannot be found or started is never a failed run: the
//! report says "not measured" and why.

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
