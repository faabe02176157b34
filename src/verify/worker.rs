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
//! the worker's own checks, which refuse it.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

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
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    identity: Identity,
    input: Value,
    output: String,
    #[serde(default)]
    fault: Option<Fault>,
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
            WorkerError::Read(_) | WorkerError::Io { .. } | WorkerError::Stdout(_) => ExitClass::Io,
        }
    }
}

/// Runs one request: reads it from `stdin`, writes its files under
/// `root`, prints its line on `stdout`.
pub fn run_worker(root: &Path, stdin: impl Read, stdout: impl Write) -> Result<(), WorkerError> {
    run_bounded(root, stdin, stdout, MAX_WRITE_BYTES)
}

fn run_bounded(
    root: &Path,
    stdin: impl Read,
    mut stdout: impl Write,
    write_limit: u64,
) -> Result<(), WorkerError> {
    let request = read_request(stdin)?;
    let fault = request.fault.unwrap_or_default();
    let output = match fault {
        Fault::Escape => ESCAPE_OUTPUT,
        Fault::None | Fault::ChangeIdentity => request.output.as_str(),
    };
    if !is_plain_component(output) {
        return Err(WorkerError::Traversal {
            output: output.to_string(),
        });
    }
    check_identity(&request.identity)?;
    let input = check_input(&request.input)?;
    let actual = input_digest(input);
    if actual != request.identity.input_digest {
        return Err(WorkerError::DigestMismatch {
            claimed: request.identity.input_digest.clone(),
            actual,
        });
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
    let manifest = Manifest {
        identity,
        files: vec![ManifestFile {
            path: RESULT_FILE.to_string(),
            bytes: result.len() as u64,
            sha256: result_digest.clone(),
        }],
        result_digest: result_digest.clone(),
    };
    let manifest =
        canonical(
            &serde_json::to_value(&manifest).map_err(|e| WorkerError::Malformed {
                reason: e.to_string(),
            })?,
        );
    let bytes = (result.len() + manifest.len()) as u64;
    if bytes > write_limit {
        return Err(WorkerError::TooLarge {
            bytes,
            limit: write_limit,
        });
    }

    let dir = OutputDir::create(root, output)?;
    dir.write_new(RESULT_FILE, &result)?;
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

fn read_request(stdin: impl Read) -> Result<Request, WorkerError> {
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
    serde_json::from_slice(&bytes).map_err(|e| WorkerError::Malformed {
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
    /// link there is refused) and opens it without following a link.
    fn create(root: &Path, name: &str) -> Result<OutputDir, WorkerError> {
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
        let dir = at::open_dir(&root_fd, name).map_err(|e| match e {
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
}
