//! Qualifying the durable route: a harmless worker to run as a task, and an
//! independent check of what it wrote.
//!
//! Qualifying the durable route needs a real child process that takes a
//! task's identity and a small input, does a little deterministic work and
//! leaves files behind, so that a crash, a retry or a lost answer can be
//! judged by what is on disk. [`worker`] is that process (`taskgate
//! qualification-worker --root DIR`, hidden): it reads one bounded JSON
//! request on stdin, checks that the input is the one the identity names
//! (sha256 of its RFC 8785 canonical form), writes the input normalised
//! (strings trimmed, canonical) as `result.json` and a `manifest.json`
//! listing it, and prints one line. It is a fixture, not an execution
//! service: it runs nothing it is given, reaches no network and creates only
//! two new files in one directory under its root.
//!
//! [`artifacts`] never trusts the worker or its exit status: it opens the
//! directory again without following a link, reads the manifest under a
//! bound and checks the identity, every listed file's size and digest, the
//! normalised input against the one the caller expected, and that nothing
//! else is there; [`artifacts::remove_owned`] removes only what the
//! manifest lists. The worker can be told to misbehave (`fault`): to write
//! a manifest under another identity while exiting 0, or to try an output
//! outside its root, so that both the verifier's rejection and the worker's
//! own refusal can be exercised.
//!
//! Both treat the tree as hostile: every path below the root is one plain
//! component opened relative to a directory descriptor with `O_NOFOLLOW`,
//! files are created with `O_EXCL` and mode 0600, and every read and write
//! is bounded by a named constant.
//!
//! Owns the qualification of the durable route. A harmless fixture, not an
//! execution service: it runs nothing it is given and reaches no network.
//! `worker.rs` is `taskgate qualification-worker --root DIR` (hidden): one JSON
//! request on stdin (at most 64 KiB; unknown fields refused) naming a task's
//! identity (`correlationId`, `logicalTaskId`, `attempt`, `inputDigest`), a
//! flat `input` (at most 32 members; keys 1 to 64 bytes; strings of at most 1
//! KiB, numbers, booleans, null) whose RFC 8785 canonical form must hash to
//! `inputDigest`, and an `output` that must be one plain path component (else
//! refused as traversal); it writes `result.json` (the identity and the input
//! with its strings trimmed, canonical) and `manifest.json` (the identity, each
//! file's size and sha256, `resultDigest`) as new files in that directory under
//! the root (created unless it is there), at most 8 MiB in all, and prints one
//! JSON line. The tree is hostile: the root and the directory are opened
//! `O_DIRECTORY|O_NOFOLLOW`, files created `O_CREAT|O_EXCL|O_NOFOLLOW` mode
//! 0600 through the directory's descriptor and fsynced with it; a link anywhere
//! is refused, never followed. A `fault` makes it misbehave on purpose (a
//! manifest under another `correlationId` with exit 0; an output outside the
//! root, which its own check refuses; a stall its declared runtime ends). It
//! keeps the `limits` the caller declares (`runtimeMs`, `artifactBytes`), and
//! with `--ledger` appends one line per process before any check; `--liar`
//! (test hooks only) makes it dishonest. `durable.rs` runs the daemon through
//! `service::run` on upstream connections given in `Options`, so a restart
//! keeps the provider's session. Refusals are one line with an exit class (64
//! the request, 77 the tree, 74 I/O). `artifacts.rs` checks a run independently
//! of the worker and its exit status: the directory reopened without following
//! links, the manifest read under a bound, the identity field by field, every
//! listed file's size and sha256, `result.json`'s identity and its normalised
//! input against the digest the caller computed from the original input,
//! nothing unlisted; the first discrepancy is a `Finding`. `remove_owned`
//! removes only the regular files the manifest lists, then the manifest and the
//! directory (`unlinkat`), and leaves and names anything else. Knows nothing of
//! tasks, the store, tools or the daemon: the route that starts the worker and
//! keeps the identity is not here.

pub mod artifacts;
pub mod durable;
pub mod worker;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

pub use artifacts::{
    CleanupError, Evidence, Expected, FileEvidence, Finding, Removed, check, remove_owned,
};
pub use worker::{Fault, Liar, WorkerError, WorkerOptions, run_with, run_worker};

/// The name of the normalised result in an output directory.
pub const RESULT_FILE: &str = "result.json";
/// The name of the manifest in an output directory.
pub const MANIFEST_FILE: &str = "manifest.json";
/// The longest output directory name.
pub const MAX_OUTPUT_NAME_BYTES: usize = 64;
/// The longest task ID in an identity.
pub const MAX_ID_BYTES: usize = 256;

/// Who a run is for: the task a client was handed, the logical task it
/// stands for, which attempt this is, and the digest of its input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Identity {
    pub correlation_id: String,
    pub logical_task_id: String,
    pub attempt: u32,
    /// sha256 of the input's RFC 8785 canonical form, 64 lowercase hex
    /// digits.
    pub input_digest: String,
}

/// One file a manifest lists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ManifestFile {
    pub path: String,
    pub bytes: u64,
    pub sha256: String,
}

/// `manifest.json`: who the run was for and what it wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Manifest {
    pub identity: Identity,
    pub files: Vec<ManifestFile>,
    /// sha256 of `result.json`'s bytes.
    pub result_digest: String,
}

/// sha256 of an input object's RFC 8785 canonical form, as
/// `identity.inputDigest` carries it.
pub fn input_digest(input: &serde_json::Map<String, serde_json::Value>) -> String {
    sha256_hex(&canonical(&serde_json::Value::Object(input.clone())))
}

/// The RFC 8785 canonical bytes of a JSON value.
pub(crate) fn canonical(value: &serde_json::Value) -> Vec<u8> {
    // A serde_json value always has a canonical form (its keys are strings
    // and its numbers finite); an impossible failure gives the plain text,
    // which no digest computed the canonical way will match.
    serde_jcs::to_vec(value).unwrap_or_else(|_| value.to_string().into_bytes())
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(64);
    for b in Sha256::digest(bytes) {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Whether `text` is a sha256 as these files write it.
pub(crate) fn is_sha256_hex(text: &str) -> bool {
    text.len() == 64
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Whether `name` is one plain path component an output may be: 1 to
/// [`MAX_OUTPUT_NAME_BYTES`] bytes of `[A-Za-z0-9_.-]`, not `.` or `..`.
/// Anything else (a slash, an absolute path, a parent) is traversal.
pub(crate) fn is_plain_component(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_OUTPUT_NAME_BYTES
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// Opening inside a hostile tree: every path is one component, relative to
/// a directory descriptor, and a symbolic link is never followed.
pub(crate) mod at {
    use std::os::fd::{AsFd, OwnedFd};
    use std::path::Path;

    use nix::errno::Errno;
    use nix::fcntl::{AtFlags, OFlag, open, openat};
    use nix::sys::stat::{Mode, SFlag, fstatat};

    const DIR: OFlag = OFlag::O_RDONLY
        .union(OFlag::O_DIRECTORY)
        .union(OFlag::O_NOFOLLOW)
        .union(OFlag::O_CLOEXEC);

    /// The root directory itself; a root that is a symbolic link is refused.
    pub fn open_root(root: &Path) -> Result<OwnedFd, Errno> {
        open(root, DIR, Mode::empty())
    }

    /// Whether the root itself is a symbolic link (`open_root` refused it
    /// with ELOOP or, as Linux does with `O_DIRECTORY`, ENOTDIR).
    pub fn root_is_symlink(root: &Path) -> bool {
        std::fs::symlink_metadata(root).is_ok_and(|m| m.file_type().is_symlink())
    }

    /// A directory inside `dir`.
    pub fn open_dir(dir: impl AsFd, name: &str) -> Result<OwnedFd, Errno> {
        openat(dir, name, DIR, Mode::empty())
    }

    /// A directory inside `dir`, following a link there: only a lying
    /// worker does this (`Liar::FollowsSymlinks`).
    pub fn open_dir_following(dir: impl AsFd, name: &str) -> Result<OwnedFd, Errno> {
        openat(
            dir,
            name,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
    }

    /// A file inside `dir`, for reading. Non-blocking, so a FIFO planted
    /// under a listed name cannot hold the reader; the caller checks that
    /// it is a regular file.
    pub fn open_file(dir: impl AsFd, name: &str) -> Result<OwnedFd, Errno> {
        openat(
            dir,
            name,
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
    }

    /// A new file inside `dir`: created here and now, mode 0600.
    pub fn create_file(dir: impl AsFd, name: &str) -> Result<OwnedFd, Errno> {
        openat(
            dir,
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
    }

    /// The type of `name` inside `dir`, without following it.
    pub fn kind(dir: impl AsFd, name: &str) -> Result<SFlag, Errno> {
        let st = fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)?;
        Ok(SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()))
    }

    /// Whether `name` inside `dir` is a symbolic link.
    pub fn is_symlink(dir: impl AsFd, name: &str) -> bool {
        kind(dir, name).is_ok_and(|k| k == SFlag::S_IFLNK)
    }
}
