//! The independent check of what a qualification run left, and the cleanup
//! of what it owns.
//!
//! [`check`] trusts neither the worker's exit status nor its line on
//! stdout: it opens the output directory again without following a link,
//! reads the manifest under a bound, and holds everything to what the
//! caller expected: the identity field by field, every listed file's size
//! and sha256, `result.json`'s own identity and its normalised input
//! (whose digest the caller computed from the original input with
//! [`normalized_digest`], not from anything the worker wrote), and that the
//! directory holds nothing the manifest does not list. The first
//! discrepancy is the [`Finding`].
//!
//! [`remove_owned`] removes only the regular files the manifest lists, then
//! the manifest and the directory; anything else stays where it is and is
//! named.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use nix::dir::Dir;
use nix::errno::Errno;
use nix::sys::stat::{SFlag, fstat};
use nix::unistd::{UnlinkatFlags, fsync, unlinkat};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{
    Identity, MANIFEST_FILE, Manifest, RESULT_FILE, at, canonical, is_plain_component,
    is_sha256_hex, sha256_hex,
};

/// The largest manifest read.
pub const MAX_MANIFEST_BYTES: u64 = 64 * 1024;
/// The most files a manifest may list.
pub const MAX_LISTED_FILES: usize = 16;
/// The most bytes read from the listed files, all together.
pub const MAX_LISTED_BYTES: u64 = 8 * 1024 * 1024;

/// What the run must have produced: who it was for, and the sha256 of the
/// canonical form of its normalised input ([`normalized_digest`] of the
/// original input).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    pub identity: Identity,
    pub normalized_digest: String,
}

impl Expected {
    /// What a run of `identity` over `input` must leave.
    pub fn for_input(identity: Identity, input: &Map<String, Value>) -> Expected {
        Expected {
            identity,
            normalized_digest: normalized_digest(input),
        }
    }
}

/// sha256 of the canonical form of `input` normalised: every string value
/// trimmed, keys as they are (the canonical form sorts them). Computed
/// here, independently of the worker.
pub fn normalized_digest(input: &Map<String, Value>) -> String {
    let mut normalized = Map::new();
    for (key, value) in input {
        let value = match value.as_str() {
            Some(s) => Value::String(s.trim().to_string()),
            None => value.clone(),
        };
        normalized.insert(key.clone(), value);
    }
    sha256_hex(&canonical(&Value::Object(normalized)))
}

/// The first way the artifacts differ from what was expected. Paths are
/// relative to the root.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Finding {
    #[error("{path}: missing")]
    Missing { path: String },
    #[error("{path}: {actual} bytes where the manifest lists {expected}")]
    Truncated {
        path: String,
        expected: u64,
        actual: u64,
    },
    #[error("{path}: not the content expected (swapped or altered)")]
    DigestMismatch { path: String },
    #[error("identity changed: {field} is not the expected one")]
    IdentityChanged { field: String },
    #[error("{path}: not listed in the manifest")]
    Unlisted { path: String },
    #[error("{path}: a symbolic link; refused, not followed")]
    Symlink { path: String },
    #[error("{path}: malformed: {reason}")]
    Malformed { path: String, reason: String },
    /// The tree could not be read or changed (permissions, I/O).
    #[error("{path}: {reason}")]
    Io { path: String, reason: String },
}

/// One file as it was checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileEvidence {
    /// Relative to the root.
    pub path: String,
    pub bytes: u64,
    pub sha256: String,
}

/// What [`check`] checked, for a report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Evidence {
    pub output: String,
    /// The identity, equal in the manifest, in `result.json` and to the
    /// one expected.
    pub identity: Identity,
    pub manifest: FileEvidence,
    /// Every listed file, its size and digest as read.
    pub files: Vec<FileEvidence>,
    /// sha256 of `result.json`, as read and as the manifest says.
    pub result_digest: String,
    /// sha256 of the canonical normalised input, equal to the expected one.
    pub normalized_digest: String,
}

/// What [`remove_owned`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Removed {
    pub output: String,
    /// Listed files removed, then the manifest (relative to the root).
    pub files: Vec<String>,
    /// Listed files that were already gone.
    pub absent: Vec<String>,
    /// Whether the directory itself was removed.
    pub dir: bool,
}

/// Why [`remove_owned`] did not finish.
#[derive(Debug, thiserror::Error)]
pub enum CleanupError {
    /// The directory or its manifest cannot be trusted: nothing removed.
    #[error("{0}; nothing removed")]
    Refused(Finding),
    /// Something the manifest does not list is there: it, the manifest and
    /// the directory were left.
    #[error(
        "{}: left in place with {} (not listed in its manifest, so not ours to remove); removed {}",
        removed.output,
        remaining.join(", "),
        if removed.files.is_empty() { "nothing".to_string() } else { removed.files.join(", ") }
    )]
    Leftover {
        removed: Box<Removed>,
        remaining: Vec<String>,
    },
    /// Removing failed part way.
    #[error(
        "{path}: {reason}; removed {}",
        if removed.files.is_empty() { "nothing".to_string() } else { removed.files.join(", ") }
    )]
    Failed {
        path: String,
        reason: String,
        removed: Box<Removed>,
    },
}

/// Checks the artifacts of one run under `root/output` against
/// `expected`; see the module's documentation.
pub fn check(root: &Path, output: &str, expected: &Expected) -> Result<Evidence, Finding> {
    let dir = RunDir::open(root, output)?;
    let (manifest, manifest_evidence) = dir.manifest()?;
    same_identity(&manifest.identity, &expected.identity)?;

    let mut files = Vec::with_capacity(manifest.files.len());
    let mut result = None;
    let mut budget = MAX_LISTED_BYTES;
    for listed in &manifest.files {
        let path = dir.path(&listed.path);
        if listed.bytes > budget {
            return Err(Finding::Malformed {
                path: dir.path(MANIFEST_FILE),
                reason: format!("its files add up to more than {MAX_LISTED_BYTES} bytes"),
            });
        }
        budget -= listed.bytes;
        let bytes = dir.read(&listed.path, listed.bytes, listed.bytes)?;
        if bytes.len() as u64 != listed.bytes {
            return Err(Finding::Truncated {
                path,
                expected: listed.bytes,
                actual: bytes.len() as u64,
            });
        }
        let sha256 = sha256_hex(&bytes);
        if sha256 != listed.sha256 {
            return Err(Finding::DigestMismatch { path });
        }
        if listed.path == RESULT_FILE {
            result = Some(bytes);
        }
        files.push(FileEvidence {
            path,
            bytes: listed.bytes,
            sha256,
        });
    }
    let listed: BTreeSet<&str> = manifest.files.iter().map(|f| f.path.as_str()).collect();
    if let Some(stranger) = dir
        .names()?
        .into_iter()
        .find(|n| n != MANIFEST_FILE && !listed.contains(n.as_str()))
    {
        return Err(Finding::Unlisted {
            path: dir.path(&stranger),
        });
    }

    let result_path = dir.path(RESULT_FILE);
    let result = result.ok_or_else(|| Finding::Missing {
        path: result_path.clone(),
    })?;
    let malformed = |reason: String| Finding::Malformed {
        path: result_path.clone(),
        reason,
    };
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct ResultFile {
        identity: Identity,
        normalized: Map<String, Value>,
    }
    let value: Value = serde_json::from_slice(&result).map_err(|e| malformed(e.to_string()))?;
    if canonical(&value) != result {
        return Err(malformed("not in RFC 8785 canonical form".into()));
    }
    let parsed: ResultFile = serde_json::from_value(value).map_err(|e| malformed(e.to_string()))?;
    same_identity(&parsed.identity, &expected.identity)?;
    let normalized = sha256_hex(&canonical(&Value::Object(parsed.normalized)));
    if normalized != expected.normalized_digest {
        return Err(Finding::DigestMismatch { path: result_path });
    }

    Ok(Evidence {
        output: output.to_string(),
        identity: manifest.identity,
        manifest: manifest_evidence,
        files,
        result_digest: manifest.result_digest,
        normalized_digest: normalized,
    })
}

/// Removes what the run under `root/output` owns: the regular files its
/// manifest lists, then the manifest and the directory, never following a
/// link. Anything else there (a file the manifest does not list, a link or
/// a directory under a listed name) is left, with the manifest and the
/// directory, and named; a later call finishes once it is gone.
pub fn remove_owned(root: &Path, output: &str) -> Result<Removed, CleanupError> {
    let dir = RunDir::open(root, output).map_err(CleanupError::Refused)?;
    let (manifest, _) = dir.manifest().map_err(CleanupError::Refused)?;
    let mut removed = Removed {
        output: output.to_string(),
        ..Removed::default()
    };
    let mut remaining = Vec::new();
    for listed in &manifest.files {
        let path = dir.path(&listed.path);
        match at::kind(&dir.fd, &listed.path) {
            Ok(SFlag::S_IFREG) => {
                match unlinkat(&dir.fd, listed.path.as_str(), UnlinkatFlags::NoRemoveDir) {
                    Ok(()) => removed.files.push(path),
                    Err(Errno::ENOENT) => removed.absent.push(path),
                    Err(e) => return Err(failed(path, e, removed)),
                }
            }
            Ok(_) => remaining.push(path),
            Err(Errno::ENOENT) => removed.absent.push(path),
            Err(e) => return Err(failed(path, e, removed)),
        }
    }
    let listed: BTreeSet<&str> = manifest.files.iter().map(|f| f.path.as_str()).collect();
    let strangers = |dir: &RunDir| -> Result<Vec<String>, Finding> {
        Ok(dir
            .names()?
            .into_iter()
            .filter(|n| n != MANIFEST_FILE && !listed.contains(n.as_str()))
            .map(|n| dir.path(&n))
            .collect())
    };
    let found = strangers(&dir).map_err(|f| failed_with(f, removed.clone()))?;
    remaining.extend(found);
    if !remaining.is_empty() {
        let _ = fsync(dir.fd.as_fd());
        return Err(CleanupError::Leftover {
            removed: Box::new(removed),
            remaining,
        });
    }
    let manifest_path = dir.path(MANIFEST_FILE);
    match unlinkat(&dir.fd, MANIFEST_FILE, UnlinkatFlags::NoRemoveDir) {
        Ok(()) => removed.files.push(manifest_path),
        Err(e) => return Err(failed(manifest_path, e, removed)),
    }
    match unlinkat(&dir.root, output, UnlinkatFlags::RemoveDir) {
        Ok(()) => removed.dir = true,
        Err(Errno::ENOTEMPTY | Errno::EEXIST) => {
            // Something arrived since the directory was read.
            let remaining = strangers(&dir).map_err(|f| failed_with(f, removed.clone()))?;
            return Err(CleanupError::Leftover {
                removed: Box::new(removed),
                remaining,
            });
        }
        Err(e) => return Err(failed(output.to_string(), e, removed)),
    }
    fsync(dir.root.as_fd()).map_err(|e| failed(dir.root_shown.clone(), e, removed.clone()))?;
    Ok(removed)
}

fn failed(path: String, e: Errno, removed: Removed) -> CleanupError {
    CleanupError::Failed {
        path,
        reason: std::io::Error::from(e).to_string(),
        removed: Box::new(removed),
    }
}

fn failed_with(finding: Finding, removed: Removed) -> CleanupError {
    CleanupError::Failed {
        path: removed.output.clone(),
        reason: finding.to_string(),
        removed: Box::new(removed),
    }
}

/// The first field of `found` that differs from `expected`.
fn same_identity(found: &Identity, expected: &Identity) -> Result<(), Finding> {
    let field = if found.correlation_id != expected.correlation_id {
        "correlationId"
    } else if found.logical_task_id != expected.logical_task_id {
        "logicalTaskId"
    } else if found.attempt != expected.attempt {
        "attempt"
    } else if found.input_digest != expected.input_digest {
        "inputDigest"
    } else {
        return Ok(());
    };
    Err(Finding::IdentityChanged {
        field: field.to_string(),
    })
}

/// A run's directory, opened without following a link, with its root.
struct RunDir {
    root: OwnedFd,
    root_shown: String,
    fd: OwnedFd,
    output: String,
}

impl RunDir {
    fn open(root: &Path, output: &str) -> Result<RunDir, Finding> {
        let root_shown = root.display().to_string();
        if !is_plain_component(output) {
            return Err(Finding::Malformed {
                path: output.to_string(),
                reason: "not one plain path component".into(),
            });
        }
        let root_fd = at::open_root(root).map_err(|e| match e {
            Errno::ENOENT => Finding::Missing {
                path: root_shown.clone(),
            },
            Errno::ELOOP | Errno::ENOTDIR if at::root_is_symlink(root) => Finding::Symlink {
                path: root_shown.clone(),
            },
            Errno::ENOTDIR => Finding::Malformed {
                path: root_shown.clone(),
                reason: "not a directory".into(),
            },
            e => io_finding(&root_shown, e),
        })?;
        let fd = at::open_dir(&root_fd, output).map_err(|e| match e {
            Errno::ENOENT => Finding::Missing {
                path: output.to_string(),
            },
            Errno::ELOOP | Errno::ENOTDIR if at::is_symlink(&root_fd, output) => Finding::Symlink {
                path: output.to_string(),
            },
            Errno::ENOTDIR => Finding::Malformed {
                path: output.to_string(),
                reason: "not a directory".into(),
            },
            e => io_finding(output, e),
        })?;
        Ok(RunDir {
            root: root_fd,
            root_shown,
            fd,
            output: output.to_string(),
        })
    }

    /// `name` relative to the root.
    fn path(&self, name: &str) -> String {
        format!("{}/{name}", self.output)
    }

    /// Reads the regular file `name`: at most `limit` bytes (a longer file
    /// is `Truncated` against `expected`, without reading it all).
    fn read(&self, name: &str, expected: u64, limit: u64) -> Result<Vec<u8>, Finding> {
        let path = self.path(name);
        let fd = at::open_file(&self.fd, name).map_err(|e| match e {
            Errno::ENOENT => Finding::Missing { path: path.clone() },
            Errno::ELOOP => Finding::Symlink { path: path.clone() },
            e => io_finding(&path, e),
        })?;
        let st = fstat(&fd).map_err(|e| io_finding(&path, e))?;
        if SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) != SFlag::S_IFREG {
            return Err(Finding::Malformed {
                path,
                reason: "not a regular file".into(),
            });
        }
        let size = st.st_size as u64;
        if size > limit {
            return Err(Finding::Truncated {
                path,
                expected,
                actual: size,
            });
        }
        let mut bytes = Vec::with_capacity(size as usize);
        File::from(fd)
            .take(limit + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| Finding::Io {
                path: path.clone(),
                reason: e.to_string(),
            })?;
        if bytes.len() as u64 > limit {
            // It grew while being read.
            return Err(Finding::Truncated {
                path,
                expected,
                actual: bytes.len() as u64,
            });
        }
        Ok(bytes)
    }

    /// The manifest, read under its bound and checked for shape, with what
    /// was read of it.
    fn manifest(&self) -> Result<(Manifest, FileEvidence), Finding> {
        let path = self.path(MANIFEST_FILE);
        let bytes = match self.read(MANIFEST_FILE, MAX_MANIFEST_BYTES, MAX_MANIFEST_BYTES) {
            Err(Finding::Truncated { .. }) => {
                return Err(Finding::Malformed {
                    path,
                    reason: format!("larger than {MAX_MANIFEST_BYTES} bytes"),
                });
            }
            other => other?,
        };
        let malformed = |reason: String| Finding::Malformed {
            path: path.clone(),
            reason,
        };
        let manifest: Manifest =
            serde_json::from_slice(&bytes).map_err(|e| malformed(e.to_string()))?;
        if manifest.files.len() > MAX_LISTED_FILES {
            return Err(malformed(format!(
                "{} files listed, more than {MAX_LISTED_FILES}",
                manifest.files.len()
            )));
        }
        let mut seen = BTreeSet::new();
        for f in &manifest.files {
            if !is_plain_component(&f.path) || f.path == MANIFEST_FILE {
                return Err(malformed(format!(
                    "it lists {:?}, which is not a file of the run's directory",
                    f.path
                )));
            }
            if !seen.insert(f.path.as_str()) {
                return Err(malformed(format!("it lists {:?} twice", f.path)));
            }
            if !is_sha256_hex(&f.sha256) {
                return Err(malformed(format!("{:?} has no sha256", f.path)));
            }
        }
        let Some(result) = manifest.files.iter().find(|f| f.path == RESULT_FILE) else {
            return Err(malformed(format!("it does not list {RESULT_FILE}")));
        };
        if result.sha256 != manifest.result_digest {
            return Err(malformed(format!(
                "resultDigest is not the sha256 it lists for {RESULT_FILE}"
            )));
        }
        let evidence = FileEvidence {
            path,
            bytes: bytes.len() as u64,
            sha256: sha256_hex(&bytes),
        };
        Ok((manifest, evidence))
    }

    /// The names in the directory (`.` and `..` aside), however many.
    fn names(&self) -> Result<Vec<String>, Finding> {
        let io = |e: Errno| io_finding(&self.output, e);
        let mut dir = Dir::from_fd(at::open_dir(&self.fd, ".").map_err(io)?).map_err(io)?;
        let mut names = Vec::new();
        for entry in dir.iter() {
            let entry = entry.map_err(io)?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name != "." && name != ".." {
                names.push(name);
            }
        }
        Ok(names)
    }
}

fn io_finding(path: &str, e: Errno) -> Finding {
    Finding::Io {
        path: path.to_string(),
        reason: std::io::Error::from(e).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;
    use std::path::PathBuf;

    use serde_json::json;

    use super::super::worker::{request, run_worker, test_identity};
    use super::*;

    fn input() -> Map<String, Value> {
        let Value::Object(m) = json!({"name": " Grace Hopper  ", "year": 1906, "on": false}) else {
            unreachable!()
        };
        m
    }

    fn expected(correlation_id: &str) -> Expected {
        Expected::for_input(test_identity(correlation_id, &input()), &input())
    }

    /// A root with one good run of `task-1` under `run`.
    fn good_run() -> (tempfile::TempDir, PathBuf) {
        let base = tempfile::tempdir().unwrap();
        let root = base.path().join("root");
        std::fs::create_dir(&root).unwrap();
        work(&root, "task-1", "run", "none");
        (base, root)
    }

    fn work(root: &Path, correlation_id: &str, output: &str, fault: &str) {
        let body = request(correlation_id, Value::Object(input()), output, fault);
        run_worker(root, &body[..], Vec::new()).unwrap();
    }

    /// Rewrites `result.json` to `result` and the manifest consistently
    /// with it, as a worker that lied carefully would.
    fn forge(root: &Path, result: &Value) {
        let bytes = canonical(result);
        std::fs::write(root.join("run/result.json"), &bytes).unwrap();
        let path = root.join("run/manifest.json");
        let mut manifest: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        manifest["files"][0]["bytes"] = json!(bytes.len());
        manifest["files"][0]["sha256"] = json!(sha256_hex(&bytes));
        manifest["resultDigest"] = json!(sha256_hex(&bytes));
        std::fs::write(&path, canonical(&manifest)).unwrap();
    }

    fn result_of(root: &Path) -> Value {
        serde_json::from_slice(&std::fs::read(root.join("run/result.json")).unwrap()).unwrap()
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_good_run_is_accepted_with_its_evidence() {
        let (_base, root) = good_run();
        let evidence = check(&root, "run", &expected("task-1")).unwrap();
        let result = std::fs::read(root.join("run/result.json")).unwrap();
        assert_eq!(evidence.identity, expected("task-1").identity);
        assert_eq!(
            evidence.files,
            [FileEvidence {
                path: "run/result.json".into(),
                bytes: result.len() as u64,
                sha256: sha256_hex(&result),
            }]
        );
        assert_eq!(evidence.result_digest, sha256_hex(&result));
        assert_eq!(evidence.manifest.path, "run/manifest.json");
        assert_eq!(
            evidence.normalized_digest,
            expected("task-1").normalized_digest
        );
        // The normalised input's digest is not the raw input's: strings
        // were trimmed.
        assert_ne!(evidence.normalized_digest, evidence.identity.input_digest);
        let shown = serde_json::to_value(&evidence).unwrap();
        assert_eq!(shown["resultDigest"], json!(sha256_hex(&result)));
        assert_eq!(shown["files"][0]["path"], "run/result.json");
    }

    #[test]
    fn a_missing_result_manifest_or_directory_is_missing() {
        let (_base, root) = good_run();
        assert_eq!(
            check(&root, "elsewhere", &expected("task-1")),
            Err(Finding::Missing {
                path: "elsewhere".into()
            })
        );
        std::fs::remove_file(root.join("run/result.json")).unwrap();
        assert_eq!(
            check(&root, "run", &expected("task-1")),
            Err(Finding::Missing {
                path: "run/result.json".into()
            })
        );
        std::fs::remove_file(root.join("run/manifest.json")).unwrap();
        assert_eq!(
            check(&root, "run", &expected("task-1")),
            Err(Finding::Missing {
                path: "run/manifest.json".into()
            })
        );
    }

    #[test]
    fn a_truncated_or_grown_result_is_truncated() {
        let (_base, root) = good_run();
        let path = root.join("run/result.json");
        let whole = std::fs::read(&path).unwrap();
        std::fs::write(&path, &whole[..whole.len() - 3]).unwrap();
        assert_eq!(
            check(&root, "run", &expected("task-1")),
            Err(Finding::Truncated {
                path: "run/result.json".into(),
                expected: whole.len() as u64,
                actual: whole.len() as u64 - 3,
            })
        );
        let mut longer = whole.clone();
        longer.extend_from_slice(b"   ");
        std::fs::write(&path, &longer).unwrap();
        assert!(matches!(
            check(&root, "run", &expected("task-1")),
            Err(Finding::Truncated { actual, .. }) if actual == whole.len() as u64 + 3
        ));
    }

    #[test]
    fn a_result_swapped_from_another_valid_run_is_a_digest_mismatch() {
        let (_base, root) = good_run();
        work(&root, "task-2", "other", "none");
        // Both are valid runs of their own: the other passes its own check.
        check(&root, "other", &expected("task-2")).unwrap();
        std::fs::rename(root.join("other/result.json"), root.join("run/result.json")).unwrap();
        assert_eq!(
            check(&root, "run", &expected("task-1")),
            Err(Finding::DigestMismatch {
                path: "run/result.json".into()
            })
        );
        // The other run's manifest and result together are still not this
        // run: its identity differs.
        std::fs::rename(
            root.join("other/manifest.json"),
            root.join("run/manifest.json"),
        )
        .unwrap();
        assert_eq!(
            check(&root, "run", &expected("task-1")),
            Err(Finding::IdentityChanged {
                field: "correlationId".into()
            })
        );
    }

    #[test]
    fn an_altered_normalized_input_is_a_digest_mismatch_even_when_the_manifest_agrees() {
        let (_base, root) = good_run();
        let mut result = result_of(&root);
        result["normalized"]["year"] = json!(1907);
        forge(&root, &result);
        assert_eq!(
            check(&root, "run", &expected("task-1")),
            Err(Finding::DigestMismatch {
                path: "run/result.json".into()
            })
        );
        // Untrimmed strings are not the normalised input either.
        let mut result = result_of(&root);
        result["normalized"] = Value::Object(input());
        forge(&root, &result);
        assert!(matches!(
            check(&root, "run", &expected("task-1")),
            Err(Finding::DigestMismatch { .. })
        ));
    }

    #[test]
    fn a_changed_identity_is_refused_though_the_worker_exited_zero() {
        let (_base, root) = good_run();
        // The worker succeeded (work() unwraps), and the run is still refused.
        work(&root, "task-1", "faulty", "change-identity");
        assert_eq!(
            check(&root, "faulty", &expected("task-1")),
            Err(Finding::IdentityChanged {
                field: "correlationId".into()
            })
        );
        // Another attempt, or result.json's own identity, are caught too.
        let mut other = expected("task-1");
        other.identity.attempt = 2;
        assert_eq!(
            check(&root, "run", &other),
            Err(Finding::IdentityChanged {
                field: "attempt".into()
            })
        );
        let mut result = result_of(&root);
        result["identity"]["logicalTaskId"] = json!("logical-2");
        forge(&root, &result);
        assert_eq!(
            check(&root, "run", &expected("task-1")),
            Err(Finding::IdentityChanged {
                field: "logicalTaskId".into()
            })
        );
    }

    #[test]
    fn an_unlisted_file_is_refused() {
        let (_base, root) = good_run();
        std::fs::write(root.join("run/extra.txt"), "x").unwrap();
        assert_eq!(
            check(&root, "run", &expected("task-1")),
            Err(Finding::Unlisted {
                path: "run/extra.txt".into()
            })
        );
        std::fs::remove_file(root.join("run/extra.txt")).unwrap();
        std::fs::create_dir(root.join("run/sub")).unwrap();
        assert_eq!(
            check(&root, "run", &expected("task-1")),
            Err(Finding::Unlisted {
                path: "run/sub".into()
            })
        );
    }

    #[test]
    fn a_symlinked_directory_or_file_is_refused() {
        let (base, root) = good_run();
        // The directory moved away and a link left in its place.
        std::fs::rename(root.join("run"), base.path().join("real")).unwrap();
        symlink(base.path().join("real"), root.join("run")).unwrap();
        assert_eq!(
            check(&root, "run", &expected("task-1")),
            Err(Finding::Symlink { path: "run".into() })
        );
        std::fs::remove_file(root.join("run")).unwrap();
        std::fs::rename(base.path().join("real"), root.join("run")).unwrap();
        check(&root, "run", &expected("task-1")).unwrap();
        // result.json moved away and linked: same bytes, still refused.
        std::fs::rename(
            root.join("run/result.json"),
            base.path().join("result.json"),
        )
        .unwrap();
        symlink(
            base.path().join("result.json"),
            root.join("run/result.json"),
        )
        .unwrap();
        assert_eq!(
            check(&root, "run", &expected("task-1")),
            Err(Finding::Symlink {
                path: "run/result.json".into()
            })
        );
        // So is a linked manifest.
        std::fs::remove_file(root.join("run/result.json")).unwrap();
        std::fs::rename(
            base.path().join("result.json"),
            root.join("run/result.json"),
        )
        .unwrap();
        std::fs::rename(root.join("run/manifest.json"), base.path().join("m.json")).unwrap();
        symlink(base.path().join("m.json"), root.join("run/manifest.json")).unwrap();
        assert_eq!(
            check(&root, "run", &expected("task-1")),
            Err(Finding::Symlink {
                path: "run/manifest.json".into()
            })
        );
    }

    #[test]
    fn a_malformed_manifest_or_output_is_malformed() {
        let (_base, root) = good_run();
        let path = root.join("run/manifest.json");
        let good: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let mut cases = Vec::new();
        let mut m = good.clone();
        m["files"][0]["path"] = json!("../result.json");
        cases.push(serde_json::to_vec(&m).unwrap());
        let mut m = good.clone();
        m["files"][0]["sha256"] = json!("nope");
        cases.push(serde_json::to_vec(&m).unwrap());
        let mut m = good.clone();
        m["resultDigest"] = json!("0".repeat(64));
        cases.push(serde_json::to_vec(&m).unwrap());
        let mut m = good.clone();
        m["extra"] = json!(true);
        cases.push(serde_json::to_vec(&m).unwrap());
        let mut m = good.clone();
        m["files"] = json!([]);
        cases.push(serde_json::to_vec(&m).unwrap());
        cases.push(b"{".to_vec());
        cases.push(vec![b' '; MAX_MANIFEST_BYTES as usize + 1]);
        for (i, bytes) in cases.into_iter().enumerate() {
            std::fs::write(&path, bytes).unwrap();
            assert!(
                matches!(
                    check(&root, "run", &expected("task-1")),
                    Err(Finding::Malformed { ref path, .. }) if path == "run/manifest.json"
                ),
                "case {i}"
            );
        }
        for output in ["..", "a/b", "/abs", ""] {
            assert!(matches!(
                check(&root, output, &expected("task-1")),
                Err(Finding::Malformed { .. })
            ));
        }
    }

    #[test]
    fn cleanup_removes_everything_it_owns_and_nothing_else() {
        let (base, root) = good_run();
        work(&root, "task-2", "other", "none");
        let removed = remove_owned(&root, "run").unwrap();
        assert_eq!(
            removed,
            Removed {
                output: "run".into(),
                files: vec!["run/result.json".into(), "run/manifest.json".into()],
                absent: vec![],
                dir: true,
            }
        );
        assert_eq!(names(&root), ["other"]);
        check(&root, "other", &expected("task-2")).unwrap();

        // A stranger in the directory, and a link under a listed name:
        // only the manifest's regular files go; the rest stays, named.
        let outside = base.path().join("outside");
        std::fs::write(&outside, "keep").unwrap();
        std::fs::write(root.join("other/stranger"), "theirs").unwrap();
        let e = remove_owned(&root, "other").unwrap_err();
        let CleanupError::Leftover { removed, remaining } = &e else {
            panic!("{e}");
        };
        assert_eq!(removed.files, ["other/result.json"]);
        assert!(!removed.dir);
        assert_eq!(remaining, &["other/stranger"]);
        assert!(e.to_string().contains("other/stranger"), "{e}");
        assert_eq!(names(&root.join("other")), ["manifest.json", "stranger"]);
        symlink(&outside, root.join("other/result.json")).unwrap();
        std::fs::remove_file(root.join("other/stranger")).unwrap();
        let e = remove_owned(&root, "other").unwrap_err();
        assert!(
            matches!(&e, CleanupError::Leftover { remaining, .. } if remaining == &["other/result.json"]),
            "{e}"
        );
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep");
        // Once the stranger is gone, a second call finishes.
        std::fs::remove_file(root.join("other/result.json")).unwrap();
        let removed = remove_owned(&root, "other").unwrap();
        assert_eq!(removed.absent, ["other/result.json"]);
        assert_eq!(removed.files, ["other/manifest.json"]);
        assert!(removed.dir);
        assert!(names(&root).is_empty());
        assert_eq!(names(base.path()), ["outside", "root"]);
    }

    #[test]
    fn cleanup_refuses_a_linked_directory_and_a_missing_manifest() {
        let (base, root) = good_run();
        std::fs::rename(root.join("run"), base.path().join("real")).unwrap();
        symlink(base.path().join("real"), root.join("run")).unwrap();
        let e = remove_owned(&root, "run").unwrap_err();
        assert!(
            matches!(&e, CleanupError::Refused(Finding::Symlink { path }) if path == "run"),
            "{e}"
        );
        assert_eq!(
            names(&base.path().join("real")),
            ["manifest.json", "result.json"]
        );
        std::fs::remove_file(root.join("run")).unwrap();
        std::fs::rename(base.path().join("real"), root.join("run")).unwrap();
        std::fs::remove_file(root.join("run/manifest.json")).unwrap();
        let e = remove_owned(&root, "run").unwrap_err();
        assert!(
            matches!(e, CleanupError::Refused(Finding::Missing { .. })),
            "{e}"
        );
        assert_eq!(names(&root.join("run")), ["result.json"]);
    }
}
