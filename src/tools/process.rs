//! Running one command tool as a bounded child process.
//!
//! The child gets the argv built from its template (never a shell), an
//! environment made only of the allow-listed variables, the call's JSON
//! arguments on stdin, its own process group, and `PR_SET_PDEATHSIG` so it
//! dies with the daemon. Output beyond a cap, a timeout, or a cancellation
//! ends the whole group; the group is also killed once the main process has
//! exited, so nothing a tool started outlives its call. The shim (see
//! [`super::shim`]) does the killing of everything below it, confines the
//! tool (Landlock, resource limits, no new privileges) and reports on a
//! pipe of its own which limit, if any, ended the tool. A tool without a
//! working directory runs in a private scratch directory made for the run
//! and removed after it.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use super::RunError;
use super::shim::{self, Paths, Policy};
use crate::process_limits::ProcessLimits;

/// The descriptor on which the shim reports (see `shim.rs`).
const REPORT_FD: i32 = 3;

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
    /// Resource limits; `None` runs the tool with the daemon's own.
    pub limits: Option<ProcessLimits>,
    /// Filesystem confinement; `None` when the tool is unconfined. The
    /// working directory (or the scratch directory) is added to its
    /// writable paths.
    pub paths: Option<Paths>,
}

/// A private directory for one run, removed with everything in it when
/// the run is over.
struct Scratch(PathBuf);

/// Where scratch directories are made: the service's runtime directory
/// (systemd's `RuntimeDirectory=`), else `$XDG_RUNTIME_DIR`, else the
/// temporary directory.
fn scratch_base() -> PathBuf {
    ["RUNTIME_DIRECTORY", "XDG_RUNTIME_DIR"]
        .iter()
        .filter_map(std::env::var_os)
        .map(PathBuf::from)
        .find(|p| p.is_absolute() && p.is_dir())
        .unwrap_or_else(std::env::temp_dir)
}

/// Removes the scratch directories a daemon left when it was killed
/// (those of a process that no longer exists); a running daemon's stay.
pub fn sweep_scratch() {
    let Ok(entries) = std::fs::read_dir(scratch_base()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("taskgate-run-"))
            .and_then(|n| n.split('-').next())
        else {
            continue;
        };
        let ours = e.metadata().is_ok_and(|m| {
            use std::os::unix::fs::MetadataExt;
            m.is_dir() && m.uid() == nix::unistd::getuid().as_raw()
        });
        if ours && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

impl Scratch {
    /// Under [`scratch_base`]; 0700, and a new name each time (never an
    /// existing one).
    fn create() -> std::io::Result<Scratch> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let base = scratch_base();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let mut last = None;
        for _ in 0..16 {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let path = base.join(format!(
                "taskgate-run-{}-{n}-{nanos:08x}",
                std::process::id()
            ));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => return Ok(Scratch(path)),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("no scratch directory")))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The pipe the shim reports on: the read end for the daemon, the write
/// end for the shim (moved to descriptor 3 in the child).
fn report_pipe() -> Result<(tokio::net::unix::pipe::Receiver, OwnedFd), RunError> {
    let (read, write) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)
            .map_err(|e| RunError::Io(e.into()))?;
    let read = tokio::net::unix::pipe::Receiver::from_owned_fd(read).map_err(RunError::Io)?;
    Ok((read, write))
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

/// The shim (this binary, `exec-tool`) running `inv.argv` below itself
/// under `policy`, in `dir`, with only the allow-listed environment, in a
/// process group of its own; stdout and stderr piped. The shim kills
/// everything the program started when it ends; see `shim.rs`.
fn shim_command(
    inv: &Invocation,
    dir: &Path,
    policy: &Policy,
) -> Result<tokio::process::Command, RunError> {
    let policy = serde_json::to_string(policy).map_err(|e| RunError::Io(e.into()))?;
    let mut cmd = tokio::process::Command::new(SELF_EXE);
    cmd.arg("exec-tool")
        .arg("--parent")
        .arg(std::process::id().to_string())
        .arg("--policy")
        .arg(policy)
        .arg("--")
        .args(&inv.argv)
        .env_clear()
        .envs(inv.env.iter().map(|(k, v)| (k, v)))
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    Ok(cmd)
}

/// What a start needs before the shim runs: the program (checked to be
/// executable), the run's scratch directory when it has no working
/// directory of its own, the directory it runs in, and its Landlock grants
/// with the program and that directory added.
fn prepare(
    inv: &Invocation,
) -> Result<(String, Option<Scratch>, PathBuf, Option<Paths>), RunError> {
    let program = inv.argv.first().cloned().unwrap_or_default();
    check_executable(&program)?;
    let scratch = match &inv.working_dir {
        Some(_) => None,
        None => Some(Scratch::create().map_err(|source| RunError::Spawn {
            program: program.clone(),
            source,
        })?),
    };
    let dir: PathBuf = match (&inv.working_dir, &scratch) {
        (Some(d), _) => d.clone(),
        (None, Some(s)) => s.0.clone(),
        (None, None) => PathBuf::from("/"),
    };
    let paths = inv.paths.clone().map(|mut p| {
        p.read.push(PathBuf::from(&program));
        p.write.push(dir.clone());
        p
    });
    Ok((program, scratch, dir, paths))
}

/// A long-running program under the shim that talks on its stdin and
/// stdout (an upstream MCP server): confined and limited like a tool's
/// run, ended with its whole process group by [`Server::stop`] or when
/// dropped.
pub struct Server {
    pub child: tokio::process::Child,
    pgid: i32,
    _scratch: Option<Scratch>,
}

impl Server {
    /// Starts `inv.argv` (its stdin, timeout and output caps are not
    /// used: the caller talks to it and bounds what it reads).
    pub fn spawn(inv: &Invocation) -> Result<Server, RunError> {
        let (program, scratch, dir, paths) = prepare(inv)?;
        let policy = Policy {
            grace_ms: inv.grace.as_millis() as u64,
            limits: inv.limits,
            paths,
            report_fd: None,
        };
        let mut cmd = shim_command(inv, &dir, &policy)?;
        cmd.stdin(Stdio::piped());
        let child = cmd
            .spawn()
            .map_err(|source| RunError::Spawn { program, source })?;
        let pgid = child.id().map(|p| p as i32).unwrap_or(0);
        Ok(Server {
            child,
            pgid,
            _scratch: scratch,
        })
    }

    /// Asks the program to stop (SIGTERM to its group, which the shim
    /// passes on), and kills what is left after `grace`.
    pub async fn stop(mut self, grace: Duration) {
        if self.pgid > 0 {
            signal_group(self.pgid, Signal::SIGTERM);
            if tokio::time::timeout(grace + Duration::from_secs(1), self.child.wait())
                .await
                .is_err()
            {
                signal_group(self.pgid, Signal::SIGKILL);
                let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Dropped without `stop` (the daemon is going): nothing of it may
        // outlive its connection.
        if self.pgid > 0 && matches!(self.child.try_wait(), Ok(None)) {
            signal_group(self.pgid, Signal::SIGKILL);
        }
    }
}

/// Runs the invocation to completion, timeout, output overflow or
/// cancellation.
pub async fn run(inv: &Invocation, cancel: &CancellationToken) -> Result<Finished, RunError> {
    // A call stopped before it began (the daemon is stopping) never starts
    // its program: starting it only to signal it would be a partial run.
    if cancel.is_cancelled() {
        return Err(RunError::Cancelled);
    }
    let (program, scratch, dir, paths) = prepare(inv)?;
    let dir: &Path = &dir;
    let (mut report, report_write) = report_pipe()?;
    let policy = Policy {
        grace_ms: inv.grace.as_millis() as u64,
        limits: inv.limits,
        paths,
        report_fd: Some(REPORT_FD),
    };
    let mut cmd = shim_command(inv, dir, &policy)?;
    cmd.stdin(Stdio::piped());
    let raw = report_write.as_raw_fd();
    // SAFETY: dup2(2) is async-signal-safe; the duplicate has no
    // close-on-exec flag, so the shim inherits it as descriptor 3.
    unsafe {
        cmd.pre_exec(move || {
            // dup2 onto itself keeps close-on-exec: clear it instead.
            let done = if raw == REPORT_FD {
                libc::fcntl(raw, libc::F_SETFD, 0)
            } else {
                libc::dup2(raw, REPORT_FD)
            };
            if done < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let spawned = cmd.spawn();
    drop(report_write);
    let mut child = spawned.map_err(|source| RunError::Spawn {
        program: program.clone(),
        source,
    })?;
    let pgid = child.id().map(|p| p as i32).unwrap_or(0);
    let reported = async move {
        let mut text = String::new();
        let _ = (&mut report).take(4096).read_to_string(&mut text).await;
        text
    };

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
        match outcome {
            // Ask politely first: the shim passes SIGTERM to every process
            // of the tool and kills what is left after the grace.
            Err(RunError::Cancelled) => signal_group(pgid, Signal::SIGTERM),
            // The tool has ended (the shim is killing what it left) or
            // must end now.
            Ok(_) => {}
            Err(_) => {
                let _ = kill(Pid::from_raw(pgid), shim::STOP_NOW);
            }
        }
        // The shim ends once every process below it is gone; only if it
        // does not (it was stopped, or is stuck) is it killed here, which
        // its tool follows (PR_SET_PDEATHSIG).
        let allowed = inv.grace + Duration::from_secs(5);
        if tokio::time::timeout(allowed, child.wait()).await.is_err() {
            signal_group(pgid, Signal::SIGKILL);
            let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
        }
    }
    drop(scratch);
    let report = tokio::time::timeout(Duration::from_secs(1), reported)
        .await
        .unwrap_or_default();
    match (shim::limit_of_report(&report), outcome) {
        // A limit explains a failure or a kill better than its symptom.
        (Some(limit), Ok(f)) if !f.status.success() => Err(RunError::Limit { limit }),
        (Some(limit), Err(RunError::Killed { .. } | RunError::OutputLimit { .. })) => {
            Err(RunError::Limit { limit })
        }
        (_, outcome) => outcome,
    }
}
