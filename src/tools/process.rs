//! Running one command tool as a bounded child process.
//!
//! The child gets the argv built from its template (never a shell), an
//! environment made only of the allow-listed variables, the call's JSON
//! arguments on stdin, its own process group, and `PR_SET_PDEATHSIG` so it
//! dies with the daemon. Output beyond a cap, a timeout, or a cancellation
//! ends the whole group; the group is also killed once the main process has
//! exited, so nothing a tool started outlives its call.

use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use super::RunError;

/// This very binary, even if its file was replaced by an upgrade since.
const SELF_EXE: &str = "/proc/self/exe";

/// Refuses a program that cannot be executed, before anything starts: the
/// shim would otherwise report it only as exit status 126.
fn check_executable(program: &str) -> Result<(), RunError> {
    nix::unistd::access(program, nix::unistd::AccessFlags::X_OK).map_err(|errno| RunError::Spawn {
        program: program.into(),
        source: std::io::Error::from(errno),
    })
}

/// What a finished process produced.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Finished {
    pub fn signal(&self) -> Option<i32> {
        self.status.signal()
    }
}

/// The fully resolved invocation of one call.
#[derive(Debug, Clone)]
pub struct Invocation {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub working_dir: Option<std::path::PathBuf>,
    pub stdin: Vec<u8>,
    pub timeout: Duration,
    pub max_stdout: u64,
    pub max_stderr: u64,
    /// Between SIGTERM and SIGKILL on cancellation.
    pub grace: Duration,
}

fn signal_group(pgid: i32, sig: Signal) {
    // ESRCH: the group is already gone, which is what we want.
    let _ = killpg(Pid::from_raw(pgid), sig);
}

async fn read_capped<R: AsyncRead + Unpin>(
    reader: Option<R>,
    limit: u64,
    stream: &'static str,
) -> Result<Vec<u8>, RunError> {
    let Some(reader) = reader else {
        return Ok(Vec::new());
    };
    let mut buf = Vec::new();
    // One byte past the cap tells "exactly the cap" from "over it".
    reader
        .take(limit + 1)
        .read_to_end(&mut buf)
        .await
        .map_err(RunError::Io)?;
    if buf.len() as u64 > limit {
        return Err(RunError::OutputLimit { stream, limit });
    }
    Ok(buf)
}

/// Runs the invocation to completion, timeout, output overflow or
/// cancellation.
pub async fn run(inv: &Invocation, cancel: &CancellationToken) -> Result<Finished, RunError> {
    // A call stopped before it began (the daemon is stopping) never starts
    // its program: starting it only to signal it would be a partial run.
    if cancel.is_cancelled() {
        return Err(RunError::Cancelled);
    }
    let program = inv.argv.first().cloned().unwrap_or_default();
    check_executable(&program)?;
    // The shim (this binary, `exec-tool`) runs the tool in this new process
    // group and kills the group if the daemon dies; see `shim.rs`.
    let mut cmd = tokio::process::Command::new(SELF_EXE);
    cmd.arg("exec-tool")
        .arg("--parent")
        .arg(std::process::id().to_string())
        .arg("--")
        .args(&inv.argv)
        .env_clear()
        .envs(inv.env.iter().map(|(k, v)| (k, v)))
        .current_dir(
            inv.working_dir
                .as_deref()
                .unwrap_or(std::path::Path::new("/")),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|source| RunError::Spawn {
        program: program.clone(),
        source,
    })?;
    let pgid = child.id().map(|p| p as i32).unwrap_or(0);

    let stdin = child.stdin.take();
    let input = inv.stdin.clone();
    let feed = async move {
        if let Some(mut stdin) = stdin {
            // A tool that does not read its input closes the pipe: fine.
            let _ = stdin.write_all(&input).await;
            let _ = stdin.shutdown().await;
        }
    };
    let out = read_capped(child.stdout.take(), inv.max_stdout, "stdout");
    let err = read_capped(child.stderr.take(), inv.max_stderr, "stderr");
    let work = async {
        // The first stream past its cap ends the run at once: a tool that
        // keeps the other stream open (a background child holding stderr)
        // must not turn an output overflow into a wait for its timeout.
        let feed = async {
            feed.await;
            Ok::<(), RunError>(())
        };
        let ((), stdout, stderr) = tokio::try_join!(feed, out, err)?;
        let status = child.wait().await.map_err(RunError::Io)?;
        Ok::<_, RunError>(Finished {
            status,
            stdout,
            stderr,
        })
    };

    let outcome = tokio::select! {
        r = work => r,
        _ = tokio::time::sleep(inv.timeout) => Err(RunError::Timeout(inv.timeout)),
        _ = cancel.cancelled() => Err(RunError::Cancelled),
    };
    if pgid > 0 {
        if matches!(outcome, Err(RunError::Cancelled)) {
            // Ask politely first, and give the main process its grace.
            signal_group(pgid, Signal::SIGTERM);
            let _ = tokio::time::timeout(inv.grace, child.wait()).await;
        }
        // Whatever happened, nothing of this call outlives it.
        signal_group(pgid, Signal::SIGKILL);
        let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
    }
    outcome
}
