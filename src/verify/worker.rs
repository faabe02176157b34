//! The qualification worker (`taskgate qualification-worker --root DIR`):
//! one bounded JSON request on stdin, two new files in one directory under
//! the root (created unless it is there), one JSON line on stdout.
//!
//! The request:
//!
//! ```json
//! {"identity": {"correlationId": "…", "logicalTaskId": "…", "attempt": 1,
//!               "inputDigest": "<sha256 of the input's RFC 8785 form>"},
//!  "input": {"name": " value ", "n": 3},
//!  "output": "run-1",
//!  "fault": "none"}
//! ```
//!
//! `input` is a flat object of at most [`MAX_INPUT_MEMBERS`] members whose
//! values are strings, numbers, booleans or null. The worker writes
//! `<root>/<output>/result.json` (`{"identity", "normalized"}`: the input
//! with its strings trimmed, canonical) and `manifest.json` (the identity,
//! each file with its size and sha256, and `resultDigest`, the sha256 of
//! `result.json`), both canonical, then prints
//! `{"resultDigest", "manifest": "<output>/manifest.json", "bytes"}` where
//! `bytes` is everything the run wrote. Any refusal writes nothing more
//! and ends the run.
//!
//! `fault` makes the worker misbehave on purpose: `change-identity` writes
//! the manifest under another `correlationId` and still succeeds, so a
//! verifier that trusted the exit status would accept a run that is not
//! the one asked for; `escape` asks for an output outside the root through
//! the worker's own checks, which refuse it; `stall` waits (up to
//! [`MAX_STALL`]) before writing, so that its declared runtime ends it.
//!
//! `limits` (optional) are the bounds the caller declared for the run:
//! `runtimeMs` (1 to [`MAX_RUNTIME_MS`], default the maximum) and
//! `artifactBytes` (at most [`MAX_WRITE_BYTES`], the default). The worker
//! enforces them itself, as a remote worker must: a run past its runtime
//! ends with [`WorkerError::RuntimeExceeded`] before writing anything, a
//! run that would write more than its artifact bound is refused with
//! [`WorkerError::TooLarge`]. `fill` (optional, bytes) adds a listed file
//! `fill.bin` of that many zero bytes, so that the artifact bound can be
//! reached with a small input.
//!
//! With `--ledger FILE`, every run appends one line to FILE as soon as it
//! has read its request, before any check (`{"pid", "correlationId",
//! "output"}`, `correlationId` null when the request did not parse): a
//! count of the processes that ran, which no output directory can give (a
//! second run of the same request is refused at its files and leaves
//! nothing of its own).
//!
//! `--liar` (honoured only in builds with test hooks) makes the worker
//! itself dishonest, so that tests can show the qualification catches it:
//! see [`Liar`].

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::stat::{Mode, SFlag, mkdirat};
use nix::unistd::fsync;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{
    Identity, MANIFEST_FILE, MAX_ID_BYTES, MAX_OUTPUT_NAME_BYTES, Manifest, ManifestFile,
    RESULT_FILE, at, canonical, input_digest, is_plain_component, is_sha256_hex, sha256_hex,
};
use crate::exit::{Classify, ExitClass};

/// The largest request read from stdin; one byte more is refused.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;
/// The most members `input` may have.
pub const MAX_INPUT_MEMBERS: usize = 32;
/// The longest key of `input`.
pub const MAX_KEY_BYTES: usize = 64;
/// The longest string value of `input`.
pub const MAX_STRING_BYTES: usize = 1024;
/// The most bytes one run writes, all files together.
pub const MAX_WRITE_BYTES: u64 = 8 * 1024 * 1024;
/// The longest runtime a run may declare (the durable route's bound).
pub const MAX_RUNTIME_MS: u64 = 30_000;
/// How long the `stall` fault waits at most, whatever its runtime.
pub const MAX_STALL: Duration = Duration::from_secs(60);
/// The name of the `fill` file in an output directory.
pub const FILL_FILE: &str = "fill.bin";
/// How often a stalled run looks at its deadline.
const STALL_STEP: Duration = Duration::from_millis(10);
/// The longest ledger line: one `write` of at most this many bytes to a
/// file opened for appending is never interleaved with another's.
const MAX_LEDGER_LINE: usize = 512;

/// The output the `escape` fault asks for.
const ESCAPE_OUTPUT: &str = "../escape";
/// What the `change-identity` fault appends to the manifest's
/// `correlationId`.
const CHANGED_SUFFIX: &str = "-changed";

/// How a run is told to misbehave, for qualifying what judges it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// Behave.
    #[default]
    None,
    /// Write the manifest under another `correlationId`, and exit 0.
    ChangeIdentity,
    /// Ask for an output outside the root (refused by the worker).
    Escape,
    /// Wait before writing, until the declared runtime ends the run.
    Stall,
}

/// A dishonest worker, for showing that the qualification notices one
/// (`--liar`, honoured only in builds with test hooks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Liar {
    /// After a good run, runs the same request once more as a second
    /// process (which the ledger counts; its output is refused, as the
    /// files exist).
    RunsTwice,
    /// Writes valid output, prints its line, and exits 1.
    ExitNonzero,
    /// Follows a symbolic link at the output directory instead of refusing
    /// it.
    FollowsSymlinks,
}

/// The declared bounds of one run.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Limits {
    #[serde(default = "default_runtime_ms")]
    runtime_ms: u64,
    #[serde(default = "default_artifact_bytes")]
    artifact_bytes: u64,
}

fn default_runtime_ms() -> u64 {
    MAX_RUNTIME_MS
}

fn default_artifact_bytes() -> u64 {
    MAX_WRITE_BYTES
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            runtime_ms: MAX_RUNTIME_MS,
            artifact_bytes: MAX_WRITE_BYTES,
        }
    }
}

/// How the worker process was started (`qualification-worker`'s flags).
#[derive(Debug, Clone, Default)]
pub struct WorkerOptions {
    pub root: PathBuf,
    /// Where every run appends its line.
    pub ledger: Option<PathBuf>,
    pub liar: Option<Liar>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    identity: Identity,
    input: Value,
    output: String,
    #[serde(default)]
    fault: Option<Fault>,
    #[serde(default)]
    limits: Option<Limits>,
    #[serde(default)]
    fill: u64,
}

/// Why a run was refused or failed. Each refusal is one line and maps to
/// an exit class: the request's content to 64, the tree to 77, I/O to 74.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("cannot read the request from standard input: {0}")]
    Read(#[source] io::Error),
    #[error("the request is larger than {limit} bytes; refused")]
    RequestTooLarge { limit: usize },
    #[error("the request is not valid: {reason}")]
    Malformed { reason: String },
    #[error("input refused: {reason}")]
    Input { reason: String },
    #[error(
        "input digest mismatch: identity.inputDigest is {claimed} but the input's canonical form hashes to {actual}; refused"
    )]
    DigestMismatch { claimed: String, actual: String },
    #[error(
        "output {output:?} is not one plain path component (1 to {MAX_OUTPUT_NAME_BYTES} bytes of A-Z a-z 0-9 _ - ., not . or ..); refused as traversal"
    )]
    Traversal { output: String },
    #[error("{path}: a symbolic link; refused, not followed")]
    Symlink { path: String },
    #[error("{path}: already exists; a run writes only files it creates")]
    Exists { path: String },
    #[error("{path}: not a directory")]
    NotADirectory { path: String },
    #[error("the run would write {bytes} bytes, more than its bound of {limit}; refused")]
    TooLarge { bytes: u64, limit: u64 },
    #[error("the run passed its declared runtime of {limit_ms} ms; ended before writing anything")]
    RuntimeExceeded { limit_ms: u64 },
    #[error("{ledger}: cannot record the run: {source}")]
    Ledger {
        ledger: String,
        #[source]
        source: io::Error,
    },
    #[error("test hook: a lying worker exits 1 after a good run")]
    Lied,
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot write to standard output: {0}")]
    Stdout(#[source] io::Error),
}

impl Classify for WorkerError {
    fn exit_class(&self) -> ExitClass {
        match self {
            WorkerError::RequestTooLarge { .. }
            | WorkerError::Malformed { .. }
            | WorkerError::Input { .. }
            | WorkerError::DigestMismatch { .. }
            | WorkerError::TooLarge { .. } => ExitClass::Usage,
            WorkerError::Traversal { .. }
            | WorkerError::Symlink { .. }
            | WorkerError::Exists { .. }
            | WorkerError::NotADirectory { .. } => ExitClass::UnsafePath,
            WorkerError::Read(_)
            | WorkerError::Io { .. }
            | WorkerError::Stdout(_)
            | WorkerError::Ledger { .. } => ExitClass::Io,
            WorkerError::RuntimeExceeded { .. } | WorkerError::Lied => ExitClass::CallFailed,
        }
    }
}

/// Runs one request: reads it from `stdin`, writes its files under
/// `root`, prints its line on `stdout`.
pub fn run_worker(root: &Path, stdin: impl Read, stdout: impl Write) -> Result<(), WorkerError> {
    let options = WorkerOptions {
        root: root.to_path_buf(),
        ..WorkerOptions::default()
    };
    run_with(&options, stdin, stdout)
}

/// [`run_worker`] as the `qualification-worker` process runs it: the run
/// recorded in the ledger, and a liar's lie told when test hooks allow it.
pub fn run_with(
    options: &WorkerOptions,
    stdin: impl Read,
    mut stdout: impl Write,
) -> Result<(), WorkerError> {
    let started = Instant::now();
    // A run is recorded even when its request is refused unread (too
    // large) or unparsed.
    let bytes = read_bytes(stdin);
    let parsed = bytes.as_ref().ok().map(|b| parse_request(b));
    if let Some(ledger) = &options.ledger {
        record_run(ledger, parsed.as_ref().and_then(|p| p.as_ref().ok()))?;
    }
    let bytes = bytes?;
    let request = parsed.unwrap_or_else(|| parse_request(&bytes))?;
    let liar = options.liar.filter(|_| crate::testhooks::compiled_in());
    run_request(
        &options.root,
        &request,
        &mut stdout,
        MAX_WRITE_BYTES,
        started,
        liar,
    )?;
    match liar {
        Some(Liar::RunsTwice) => {
            run_again(options, &bytes);
            Ok(())
        }
        Some(Liar::ExitNonzero) => Err(WorkerError::Lied),
        _ => Ok(()),
    }
}

/// The lie of [`Liar::RunsTwice`]: this binary run once more on the same
/// request, its outcome ignored.
fn run_again(options: &WorkerOptions, request: &[u8]) {
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let mut command = std::process::Command::new(exe);
    command
        .arg("qualification-worker")
        .arg("--root")
        .arg(&options.root);
    if let Some(ledger) = &options.ledger {
        command.arg("--ledger").arg(ledger);
    }
    let child = command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    if let Ok(mut child) = child {
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(request);
        }
        let _ = child.wait();
    }
}

/// Appends this run's line to the ledger: one `write` to a file opened for
/// appending (never through a link), so concurrent runs' lines never mix.
fn record_run(ledger: &Path, request: Option<&Request>) -> Result<(), WorkerError> {
    use std::os::unix::fs::OpenOptionsExt;
    let line = serde_json::json!({
        "pid": std::process::id(),
        "correlationId": request.map(|r| r.identity.correlation_id.as_str()),
        "output": request.map(|r| r.output.as_str()),
    });
    let mut text = line.to_string();
    text.truncate(MAX_LEDGER_LINE - 1);
    text.push('\n');
    let shown = ledger.display().to_string();
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(ledger)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|source| WorkerError::Ledger {
            ledger: shown,
            source,
        })
}

#[cfg(test)]
fn run_bounded(
    root: &Path,
    stdin: impl Read,
    mut stdout: impl Write,
    write_limit: u64,
) -> Result<(), WorkerError> {
    let request = parse_request(&read_bytes(stdin)?)?;
    run_request(
        root,
        &request,
        &mut stdout,
        write_limit,
        Instant::now(),
        None,
    )
}

fn run_request(
    root: &Path,
    request: &Request,
    mut stdout: impl Write,
    write_limit: u64,
    started: Instant,
    liar: Option<Liar>,
) -> Result<(), WorkerError> {
    let fault = request.fault.unwrap_or_default();
    let output = match fault {
        Fault::Escape => ESCAPE_OUTPUT,
        Fault::None | Fault::ChangeIdentity | Fault::Stall => request.output.as_str(),
    };
    if !is_plain_component(output) {
        return Err(WorkerError::Traversal {
            output: output.to_string(),
        });
    }
    check_identity(&request.identity)?;
    let limits = check_limits(request.limits.unwrap_or_default())?;
    let write_limit = write_limit.min(limits.artifact_bytes);
    let deadline = started + Duration::from_millis(limits.runtime_ms);
    let input = check_input(&request.input)?;
    let actual = input_digest(input);
    if actual != request.identity.input_digest {
        return Err(WorkerError::DigestMismatch {
            claimed: request.identity.input_digest.clone(),
            actual,
        });
    }
    if fault == Fault::Stall {
        stall(deadline, limits.runtime_ms)?;
    }

    let result = canonical(&serde_json::json!({
        "identity": request.identity,
        "normalized": normalize(input),
    }));
    let result_digest = sha256_hex(&result);
    let mut identity = request.identity.clone();
    if fault == Fault::ChangeIdentity {
        identity.correlation_id.push_str(CHANGED_SUFFIX);
    }
    let mut files = vec![ManifestFile {
        path: RESULT_FILE.to_string(),
        bytes: result.len() as u64,
        sha256: result_digest.clone(),
    }];
    // The bound is checked before the fill is made: a fill of any size
    // costs nothing until it is admitted.
    let bytes_before_manifest = (result.len() as u64).saturating_add(request.fill);
    if bytes_before_manifest > write_limit {
        return Err(WorkerError::TooLarge {
            bytes: bytes_before_manifest,
            limit: write_limit,
        });
    }
    let fill = vec![0u8; request.fill as usize];
    if request.fill > 0 {
        files.push(ManifestFile {
            path: FILL_FILE.to_string(),
            bytes: request.fill,
            sha256: sha256_hex(&fill),
        });
    }
    let manifest = Manifest {
        identity,
        files,
        result_digest: result_digest.clone(),
    };
    let manifest =
        canonical(
            &serde_json::to_value(&manifest).map_err(|e| WorkerError::Malformed {
                reason: e.to_string(),
            })?,
        );
    let bytes = bytes_before_manifest + manifest.len() as u64;
    if bytes > write_limit {
        return Err(WorkerError::TooLarge {
            bytes,
            limit: write_limit,
        });
    }
    if Instant::now() >= deadline {
        return Err(WorkerError::RuntimeExceeded {
            limit_ms: limits.runtime_ms,
        });
    }

    let follow = liar == Some(Liar::FollowsSymlinks);
    let dir = OutputDir::create(root, output, follow)?;
    dir.write_new(RESULT_FILE, &result)?;
    if request.fill > 0 {
        dir.write_new(FILL_FILE, &fill)?;
    }
    dir.write_new(MANIFEST_FILE, &manifest)?;
    dir.sync()?;

    let line = serde_json::json!({
        "resultDigest": result_digest,
        "manifest": format!("{output}/{MANIFEST_FILE}"),
        "bytes": bytes,
    });
    writeln!(stdout, "{line}")
        .and_then(|()| stdout.flush())
        .map_err(WorkerError::Stdout)
}

/// The `stall` fault: waits up to [`MAX_STALL`], and ends the run at its
/// deadline.
fn stall(deadline: Instant, limit_ms: u64) -> Result<(), WorkerError> {
    let until = Instant::now() + MAX_STALL;
    while Instant::now() < until {
        if Instant::now() >= deadline {
            return Err(WorkerError::RuntimeExceeded { limit_ms });
        }
        std::thread::sleep(STALL_STEP);
    }
    Ok(())
}

/// The declared bounds, within the worker's own.
fn check_limits(limits: Limits) -> Result<Limits, WorkerError> {
    if limits.runtime_ms == 0 || limits.runtime_ms > MAX_RUNTIME_MS {
        return Err(WorkerError::Malformed {
            reason: format!("limits.runtimeMs must be 1 to {MAX_RUNTIME_MS}"),
        });
    }
    if limits.artifact_bytes > MAX_WRITE_BYTES {
        return Err(WorkerError::Malformed {
            reason: format!("limits.artifactBytes must be at most {MAX_WRITE_BYTES}"),
        });
    }
    Ok(limits)
}

fn read_bytes(stdin: impl Read) -> Result<Vec<u8>, WorkerError> {
    let mut bytes = Vec::new();
    stdin
        .take(MAX_REQUEST_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(WorkerError::Read)?;
    if bytes.len() > MAX_REQUEST_BYTES {
        return Err(WorkerError::RequestTooLarge {
            limit: MAX_REQUEST_BYTES,
        });
    }
    Ok(bytes)
}

fn parse_request(bytes: &[u8]) -> Result<Request, WorkerError> {
    serde_json::from_slice(bytes).map_err(|e| WorkerError::Malformed {
        reason: e.to_string(),
    })
}

fn check_identity(identity: &Identity) -> Result<(), WorkerError> {
    for (field, id) in [
        ("correlationId", &identity.correlation_id),
        ("logicalTaskId", &identity.logical_task_id),
    ] {
        if id.is_empty() || id.len() > MAX_ID_BYTES {
            return Err(WorkerError::Malformed {
                reason: format!(
                    "identity.{field} is {} bytes; it must be 1 to {MAX_ID_BYTES}",
                    id.len()
                ),
            });
        }
    }
    if !is_sha256_hex(&identity.input_digest) {
        return Err(WorkerError::Malformed {
            reason: "identity.inputDigest must be 64 lowercase hex digits (a sha256)".into(),
        });
    }
    Ok(())
}

/// `input` as the worker takes it: a flat object, bounded.
fn check_input(input: &Value) -> Result<&Map<String, Value>, WorkerError> {
    let refuse = |reason: String| Err(WorkerError::Input { reason });
    let Value::Object(members) = input else {
        return refuse("input must be a JSON object".into());
    };
    if members.len() > MAX_INPUT_MEMBERS {
        return refuse(format!(
            "{} members, more than {MAX_INPUT_MEMBERS}",
            members.len()
        ));
    }
    for (key, value) in members {
        if key.is_empty() || key.len() > MAX_KEY_BYTES {
            return refuse(format!(
                "a key of {} bytes; keys are 1 to {MAX_KEY_BYTES} bytes",
                key.len()
            ));
        }
        match value {
            Value::String(s) if s.len() > MAX_STRING_BYTES => {
                return refuse(format!(
                    "{key:?} is a string of {} bytes, more than {MAX_STRING_BYTES}",
                    s.len()
                ));
            }
            Value::String(_) | Value::Number(_) | Value::Bool(_) | Value::Null => {}
            Value::Array(_) | Value::Object(_) => {
                return refuse(format!("{key:?} is not a string, number, boolean or null"));
            }
        }
    }
    Ok(members)
}

/// The input with its strings trimmed; written canonically, its keys are
/// sorted.
fn normalize(input: &Map<String, Value>) -> Value {
    Value::Object(
        input
            .iter()
            .map(|(key, value)| {
                let value = match value {
                    Value::String(s) => Value::String(s.trim().to_string()),
                    other => other.clone(),
                };
                (key.clone(), value)
            })
            .collect(),
    )
}

/// The run's directory, held open: every file is created through it.
struct OutputDir {
    dir: OwnedFd,
    /// `<root>/<output>`, for messages.
    shown: String,
}

impl OutputDir {
    /// Creates `root/name` (a directory already there is used; a symbolic
    /// link there is refused) and opens it without following a link
    /// (`follow` is the lie of [`Liar::FollowsSymlinks`]).
    fn create(root: &Path, name: &str, follow: bool) -> Result<OutputDir, WorkerError> {
        let shown_root = root.display().to_string();
        let root_fd = at::open_root(root).map_err(|e| match e {
            Errno::ELOOP | Errno::ENOTDIR if at::root_is_symlink(root) => WorkerError::Symlink {
                path: shown_root.clone(),
            },
            Errno::ENOTDIR => WorkerError::NotADirectory {
                path: shown_root.clone(),
            },
            e => io_error(&shown_root, e),
        })?;
        let shown = format!("{shown_root}/{name}");
        match mkdirat(&root_fd, name, Mode::from_bits_truncate(0o700)) {
            Ok(()) => fsync(&root_fd).map_err(|e| io_error(&shown_root, e))?,
            Err(Errno::EEXIST) => {}
            Err(e) => return Err(io_error(&shown, e)),
        }
        let opened = if follow {
            at::open_dir_following(&root_fd, name)
        } else {
            at::open_dir(&root_fd, name)
        };
        let dir = opened.map_err(|e| match e {
            Errno::ELOOP | Errno::ENOTDIR if at::is_symlink(&root_fd, name) => {
                WorkerError::Symlink {
                    path: shown.clone(),
                }
            }
            Errno::ENOTDIR => WorkerError::NotADirectory {
                path: shown.clone(),
            },
            e => io_error(&shown, e),
        })?;
        Ok(OutputDir { dir, shown })
    }

    /// Creates `name` (it must not exist, as anything), writes `bytes` and
    /// syncs it.
    fn write_new(&self, name: &str, bytes: &[u8]) -> Result<(), WorkerError> {
        let path = format!("{}/{name}", self.shown);
        let fd = at::create_file(&self.dir, name).map_err(|e| match e {
            Errno::EEXIST | Errno::ELOOP => match at::kind(&self.dir, name) {
                Ok(SFlag::S_IFLNK) => WorkerError::Symlink { path: path.clone() },
                _ => WorkerError::Exists { path: path.clone() },
            },
            e => io_error(&path, e),
        })?;
        let mut file = File::from(fd);
        file.write_all(bytes)
            .and_then(|()| file.sync_all())
            .map_err(|source| WorkerError::Io { path, source })
    }

    /// Makes the new names durable.
    fn sync(&self) -> Result<(), WorkerError> {
        fsync(self.dir.as_fd()).map_err(|e| io_error(&self.shown, e))
    }
}

fn io_error(path: &str, e: Errno) -> WorkerError {
    WorkerError::Io {
        path: path.to_string(),
        source: e.into(),
    }
}

/// A request for `input` under `correlation_id`, with the right digest,
/// for tests here and in `artifacts`.
#[cfg(test)]
pub(super) fn request(correlation_id: &str, input: Value, output: &str, fault: &str) -> Vec<u8> {
    let Value::Object(members) = &input else {
        panic!("input must be an object");
    };
    serde_json::to_vec(&serde_json::json!({
        "identity": test_identity(correlation_id, members),
        "input": input,
        "output": output,
        "fault": fault,
    }))
    .unwrap()
}

#[cfg(test)]
pub(super) fn test_identity(correlation_id: &str, input: &Map<String, Value>) -> Identity {
    Identity {
        correlation_id: correlation_id.to_string(),
        logical_task_id: "logical-1".to_string(),
        attempt: 1,
        input_digest: input_digest(input),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{PermissionsExt, symlink};

    use serde_json::json;

    use super::*;

    fn run(root: &Path, stdin: &[u8]) -> Result<Value, WorkerError> {
        let mut out = Vec::new();
        run_worker(root, stdin, &mut out)?;
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.lines().count(), 1, "one line: {text:?}");
        Ok(serde_json::from_str(&text).unwrap())
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    fn sample() -> Value {
        json!({"name": "  Ada Lovelace ", "count": 3, "ok": true, "none": null})
    }

    #[test]
    fn a_valid_request_writes_a_canonical_result_and_its_manifest() {
        let root = tempfile::tempdir().unwrap();
        let line = run(root.path(), &request("task-1", sample(), "run-1", "none")).unwrap();
        let dir = root.path().join("run-1");
        assert_eq!(names(&dir), ["manifest.json", "result.json"]);
        let result = std::fs::read(dir.join("result.json")).unwrap();
        let Value::Object(input) = sample() else {
            unreachable!()
        };
        let expected = format!(
            r#"{{"identity":{{"attempt":1,"correlationId":"task-1","inputDigest":"{}","logicalTaskId":"logical-1"}},"normalized":{{"count":3,"name":"Ada Lovelace","none":null,"ok":true}}}}"#,
            input_digest(&input)
        );
        assert_eq!(String::from_utf8(result.clone()).unwrap(), expected);
        let manifest: Value =
            serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
        assert_eq!(manifest["files"][0]["path"], "result.json");
        assert_eq!(manifest["files"][0]["bytes"], result.len());
        assert_eq!(manifest["files"][0]["sha256"], sha256_hex(&result));
        assert_eq!(manifest["resultDigest"], sha256_hex(&result));
        assert_eq!(manifest["identity"]["correlationId"], "task-1");
        let written =
            result.len() as u64 + std::fs::metadata(dir.join("manifest.json")).unwrap().len();
        assert_eq!(
            line,
            json!({"resultDigest": sha256_hex(&result), "manifest": "run-1/manifest.json", "bytes": written})
        );
        for name in ["result.json", "manifest.json"] {
            let mode = std::fs::metadata(dir.join(name))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{name}");
        }
    }

    #[test]
    fn exactly_64_kib_is_read_and_one_byte_more_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let mut body = request("task-1", sample(), "exact", "none");
        body.resize(MAX_REQUEST_BYTES, b' ');
        run(root.path(), &body).unwrap();
        assert!(root.path().join("exact/result.json").exists());

        let mut body = request("task-1", sample(), "over", "none");
        body.resize(MAX_REQUEST_BYTES + 1, b' ');
        let e = run(root.path(), &body).unwrap_err();
        assert!(
            matches!(e, WorkerError::RequestTooLarge { limit } if limit == 65536),
            "{e}"
        );
        assert_eq!(e.exit_class(), ExitClass::Usage);
        assert!(!root.path().join("over").exists());
    }

    #[test]
    fn more_than_32_members_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let members = |n: usize| -> Value {
            Value::Object((0..n).map(|i| (format!("k{i}"), json!(i))).collect())
        };
        run(
            root.path(),
            &request("task-1", members(32), "at-bound", "none"),
        )
        .unwrap();
        let e = run(root.path(), &request("task-1", members(33), "past", "none")).unwrap_err();
        assert!(
            matches!(&e, WorkerError::Input { reason } if reason.contains("33 members")),
            "{e}"
        );
        assert!(!root.path().join("past").exists());
    }

    #[test]
    fn keys_and_values_past_their_bounds_or_of_another_kind_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let long = "x".repeat(MAX_STRING_BYTES);
        run(
            root.path(),
            &request("task-1", json!({"k".repeat(64): long}), "ok", "none"),
        )
        .unwrap();
        for (i, input) in [
            json!({"k".repeat(65): 1}),
            json!({"": 1}),
            json!({"s": "x".repeat(MAX_STRING_BYTES + 1)}),
            json!({"a": [1]}),
            json!({"o": {"p": 1}}),
        ]
        .into_iter()
        .enumerate()
        {
            let e = run(
                root.path(),
                &request("task-1", input, &format!("r{i}"), "none"),
            )
            .unwrap_err();
            assert!(matches!(e, WorkerError::Input { .. }), "{i}: {e}");
        }
        let body = br#"{"identity":{"correlationId":"t","logicalTaskId":"l","attempt":1,"inputDigest":"0000000000000000000000000000000000000000000000000000000000000000"},"input":[1],"output":"arr"}"#;
        assert!(matches!(
            run(root.path(), body),
            Err(WorkerError::Input { .. })
        ));
        assert_eq!(names(root.path()), ["ok"]);
    }

    #[test]
    fn an_input_whose_digest_is_not_the_identitys_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let mut body: Value =
            serde_json::from_slice(&request("task-1", sample(), "run", "none")).unwrap();
        body["input"]["count"] = json!(4);
        let e = run(root.path(), &serde_json::to_vec(&body).unwrap()).unwrap_err();
        assert!(matches!(e, WorkerError::DigestMismatch { .. }), "{e}");
        assert!(e.to_string().contains("digest mismatch"));
        body["identity"]["inputDigest"] = json!("ABC");
        let e = run(root.path(), &serde_json::to_vec(&body).unwrap()).unwrap_err();
        assert!(matches!(e, WorkerError::Malformed { .. }), "{e}");
        assert!(!root.path().join("run").exists());
    }

    #[test]
    fn unknown_fields_and_broken_json_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let mut body: Value =
            serde_json::from_slice(&request("task-1", sample(), "run", "none")).unwrap();
        body["extra"] = json!(1);
        let e = run(root.path(), &serde_json::to_vec(&body).unwrap()).unwrap_err();
        assert!(
            matches!(&e, WorkerError::Malformed { reason } if reason.contains("extra")),
            "{e}"
        );
        body.as_object_mut().unwrap().remove("extra");
        body["fault"] = json!("explode");
        assert!(matches!(
            run(root.path(), &serde_json::to_vec(&body).unwrap()),
            Err(WorkerError::Malformed { .. })
        ));
        assert!(matches!(
            run(root.path(), b"{\"identity\":"),
            Err(WorkerError::Malformed { .. })
        ));
        assert!(matches!(
            run(root.path(), b"{} {}"),
            Err(WorkerError::Malformed { .. })
        ));
        assert!(names(root.path()).is_empty());
    }

    #[test]
    fn outputs_that_are_not_one_plain_component_are_refused_as_traversal() {
        let base = tempfile::tempdir().unwrap();
        let root = base.path().join("root");
        std::fs::create_dir(&root).unwrap();
        let outside = base.path().join("abs");
        for output in [
            "..",
            ".",
            "",
            "a/b",
            "../escape",
            outside.to_str().unwrap(),
            "/tmp",
            "x".repeat(MAX_OUTPUT_NAME_BYTES + 1).as_str(),
            "sp ace",
            "nul\0",
        ] {
            let e = run(&root, &request("task-1", sample(), output, "none")).unwrap_err();
            assert!(
                matches!(e, WorkerError::Traversal { .. }),
                "{output:?}: {e}"
            );
            assert_eq!(e.exit_class(), ExitClass::UnsafePath);
        }
        run(
            &root,
            &request(
                "task-1",
                sample(),
                &"x".repeat(MAX_OUTPUT_NAME_BYTES),
                "none",
            ),
        )
        .unwrap();
        assert_eq!(names(base.path()), ["root"]);
        assert_eq!(names(&root), ["x".repeat(MAX_OUTPUT_NAME_BYTES)]);
    }

    #[test]
    fn the_escape_fault_is_refused_by_the_worker() {
        let base = tempfile::tempdir().unwrap();
        let root = base.path().join("root");
        std::fs::create_dir(&root).unwrap();
        let e = run(&root, &request("task-1", sample(), "run", "escape")).unwrap_err();
        assert!(
            matches!(&e, WorkerError::Traversal { output } if output == "../escape"),
            "{e}"
        );
        assert!(e.to_string().contains("refused as traversal"));
        assert_eq!(names(base.path()), ["root"]);
        assert!(names(&root).is_empty());
    }

    #[test]
    fn a_symlink_at_the_output_directory_is_refused_not_followed() {
        let base = tempfile::tempdir().unwrap();
        let root = base.path().join("root");
        let elsewhere = base.path().join("elsewhere");
        std::fs::create_dir(&root).unwrap();
        std::fs::create_dir(&elsewhere).unwrap();
        symlink(&elsewhere, root.join("run")).unwrap();
        let e = run(&root, &request("task-1", sample(), "run", "none")).unwrap_err();
        assert!(matches!(e, WorkerError::Symlink { .. }), "{e}");
        assert_eq!(e.exit_class(), ExitClass::UnsafePath);
        assert!(names(&elsewhere).is_empty());
        // A dangling link is refused too, and nothing is created at its target.
        symlink(base.path().join("nowhere"), root.join("dangling")).unwrap();
        let e = run(&root, &request("task-1", sample(), "dangling", "none")).unwrap_err();
        assert!(matches!(e, WorkerError::Symlink { .. }), "{e}");
        assert!(!base.path().join("nowhere").exists());
        // A root that is itself a link is refused.
        let linked_root = base.path().join("linked-root");
        symlink(&root, &linked_root).unwrap();
        let e = run(&linked_root, &request("task-1", sample(), "run2", "none")).unwrap_err();
        assert!(matches!(e, WorkerError::Symlink { .. }), "{e}");
        assert!(!root.join("run2").exists());
    }

    #[test]
    fn a_symlink_at_the_result_file_is_refused_not_followed() {
        let base = tempfile::tempdir().unwrap();
        let root = base.path().join("root");
        std::fs::create_dir_all(root.join("run")).unwrap();
        let target = base.path().join("target");
        std::fs::write(&target, "keep").unwrap();
        symlink(&target, root.join("run/result.json")).unwrap();
        let e = run(&root, &request("task-1", sample(), "run", "none")).unwrap_err();
        assert!(
            matches!(&e, WorkerError::Symlink { path } if path.ends_with("run/result.json")),
            "{e}"
        );
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        assert_eq!(names(&root.join("run")), ["result.json"]);
        // A regular file already there is not overwritten either.
        std::fs::create_dir(root.join("again")).unwrap();
        std::fs::write(root.join("again/result.json"), "theirs").unwrap();
        let e = run(&root, &request("task-1", sample(), "again", "none")).unwrap_err();
        assert!(matches!(e, WorkerError::Exists { .. }), "{e}");
        assert_eq!(
            std::fs::read_to_string(root.join("again/result.json")).unwrap(),
            "theirs"
        );
    }

    #[test]
    fn the_change_identity_fault_succeeds_under_another_correlation_id() {
        let root = tempfile::tempdir().unwrap();
        run(
            root.path(),
            &request("task-1", sample(), "run", "change-identity"),
        )
        .unwrap();
        let manifest: Value =
            serde_json::from_slice(&std::fs::read(root.path().join("run/manifest.json")).unwrap())
                .unwrap();
        assert_eq!(manifest["identity"]["correlationId"], "task-1-changed");
    }

    #[test]
    fn a_run_past_the_write_bound_is_refused_before_writing() {
        let root = tempfile::tempdir().unwrap();
        let e = run_bounded(
            root.path(),
            &request("task-1", sample(), "run", "none")[..],
            Vec::new(),
            100,
        )
        .unwrap_err();
        assert!(matches!(e, WorkerError::TooLarge { limit: 100, .. }), "{e}");
        assert!(names(root.path()).is_empty());
        assert_eq!(MAX_WRITE_BYTES, 8 << 20);
    }
    #[test]
    fn the_ledger_records_a_run_before_its_checks_refuse_it() {
        let base = tempfile::tempdir().unwrap();
        let root = base.path().join("root");
        std::fs::create_dir(&root).unwrap();
        let options = WorkerOptions {
            root: root.clone(),
            ledger: Some(base.path().join("runs.jsonl")),
            liar: None,
        };
        let e = run_with(
            &options,
            &request("task-1", sample(), "../x", "none")[..],
            Vec::new(),
        )
        .unwrap_err();
        assert!(matches!(e, WorkerError::Traversal { .. }), "{e}");
        let line: Value = serde_json::from_str(
            std::fs::read_to_string(base.path().join("runs.jsonl"))
                .unwrap()
                .trim_end(),
        )
        .unwrap();
        assert_eq!(line["correlationId"], "task-1");
        assert_eq!(line["output"], "../x");
        assert_eq!(line["pid"], std::process::id());
        // A ledger that is a symbolic link is not written through.
        let target = base.path().join("target");
        std::fs::write(&target, "keep").unwrap();
        let linked = base.path().join("linked.jsonl");
        symlink(&target, &linked).unwrap();
        let options = WorkerOptions {
            ledger: Some(linked),
            ..options
        };
        let e = run_with(
            &options,
            &request("task-1", sample(), "run", "none")[..],
            Vec::new(),
        )
        .unwrap_err();
        assert!(matches!(e, WorkerError::Ledger { .. }), "{e}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        assert!(names(&root).is_empty());
    }

    #[test]
    fn a_stalled_run_ends_at_its_declared_runtime_and_writes_nothing() {
        let root = tempfile::tempdir().unwrap();
        let mut body: Value =
            serde_json::from_slice(&request("task-1", sample(), "run", "stall")).unwrap();
        body["limits"] = json!({"runtimeMs": 50});
        let started = Instant::now();
        let e = run(root.path(), &serde_json::to_vec(&body).unwrap()).unwrap_err();
        assert!(
            matches!(e, WorkerError::RuntimeExceeded { limit_ms: 50 }),
            "{e}"
        );
        assert!(started.elapsed() < MAX_STALL);
        assert_eq!(e.exit_class(), ExitClass::CallFailed);
        assert!(names(root.path()).is_empty());
    }
}
