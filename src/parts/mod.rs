//! The daemon's durable parts: the sets of files that must survive a
//! restart, and that are checked, backed up, verified and restored
//! together, at one maintenance boundary (the state directory's lifetime
//! lock).
//!
//! The list holds the task store (the database with its spilled
//! artifacts, [`task_store`]) and then the approval journal
//! ([`approval_journal`], in its own directory beside the state
//! directory): copied after the store, so a snapshot's journal holds every
//! decision its tasks projected. A part names its files, says which
//! paths of a snapshot may be its files, validates itself read-only (what a
//! start would refuse, `check`'s lines), verifies a copy, and swaps a
//! staged copy in for its live files during a restore, keeping what it
//! replaced as evidence. `check`, `backup`, `backup --online`, `restore`
//! and `restore --verify-only` walk the list ([`Parts::all`]); a new part
//! is one module and one line of the `parts!` list.
//!
//! In a snapshot each part's files sit under its own folder
//! ([`Part::snapshot_dir`]; the task store's is the snapshot's root, as it
//! has always been), and the manifest names the part before its files
//! with a `# part NAME` line, which `sha256sum -c` skips as a comment. A
//! manifest without such lines was written before parts existed: every
//! file in it is the task store's.
//!
//! Owns the durable parts. `Part`: what every durable part provides (its name
//! in the manifest, its folder in a snapshot, its live directory, `check`'s
//! read-only validation, the files an offline backup and an online snapshot
//! copy, which snapshot paths it may hold, verifying a copy, swapping a staged
//! copy in, and what it holds on disk for `status`: `Part::footprint`), and the
//! registration list (`parts!`: one line per part). `task_store.rs`: the task
//! store (`tasks.db`, a WAL a crash left, `artifacts/`; at the snapshot's
//! root), and its opening for `serve` (`open_serving`). `approval_journal.rs`:
//! the approval journal's segment files (and `journal.base`, copied last) in
//! `approvals.directory` (under `approvals/` in a snapshot), registered after
//! the task store so a copy's journal holds every decision its tasks projected;
//! its check is a line (a damaged journal disables approvals, it does not
//! refuse a start), its verification `Journal::verify`, a snapshot without it
//! restores to no journal. The file helpers a snapshot needs (private copies
//! with their sha256, directory syncs) and `BackupError`. A manifest without
//! part lines is the task store's (written before parts). Knows nothing of the
//! protocol or the task domain.

pub mod approval_journal;
pub mod task_store;

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};
use thiserror::Error;

use crate::config::Config;
use crate::exit::{Classify, ExitClass, Refusal};
use crate::state_dir::{LifetimeLock, StateDir};
use crate::store::StoreId;

/// The manifest of a snapshot, in `sha256sum -c` format.
pub const MANIFEST: &str = "MANIFEST.sha256";
/// The manifest line that names the part whose files follow.
const PART_LINE: &str = "# part ";

#[derive(Debug, Error)]
pub enum BackupError {
    #[error("{path}: {problem}")]
    Destination { path: PathBuf, problem: String },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path}: snapshot rejected: {problem}; the live state directory was not touched")]
    BadSnapshot { path: PathBuf, problem: String },
    #[error("{path}: no database in the state directory; nothing to back up")]
    Empty { path: PathBuf },
}

impl Classify for BackupError {
    fn exit_class(&self) -> ExitClass {
        match self {
            BackupError::Destination { .. } => ExitClass::UnsafePath,
            BackupError::Io { .. } => ExitClass::Io,
            BackupError::BadSnapshot { .. } => ExitClass::DatabaseInvalid,
            BackupError::Empty { .. } => ExitClass::Io,
        }
    }
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(io::Error) -> BackupError + '_ {
    move |source| BackupError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What a part's copy (in a snapshot, or a fresh backup) holds.
pub struct Verified {
    /// One line for the operator ("schema 2, integrity ok, 3 tasks …").
    pub description: String,
    /// The store identity the copy carries: recorded in `tasks.lock` once
    /// the copy is installed.
    pub store_identity: Option<StoreId>,
}

/// A part's files on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Footprint {
    pub files: u64,
    pub bytes: u64,
}

/// One durable part. Every method but [`Part::swap`] is read-only.
pub trait Part: Sync {
    /// Its name in the manifest and in messages.
    fn name(&self) -> &'static str;

    /// Its folder in a snapshot, relative to the snapshot's root ("" for
    /// the root itself).
    fn snapshot_dir(&self) -> &'static str;

    /// Its live directory: where its files are kept for the state
    /// directory `state_dir` under `config`.
    fn live_dir(&self, state_dir: &Path, config: &Config) -> PathBuf;

    /// Everything a start would refuse, checked without writing, in a
    /// directory whose lock the caller holds: the lines `taskgate check`
    /// prints for it.
    fn check(
        &self,
        dir: &StateDir,
        lock: &LifetimeLock,
        config: &Config,
    ) -> Result<Vec<String>, Refusal>;

    /// Whether the part holds anything to back up.
    fn present(&self, live: &Path) -> bool;

    /// The files an offline backup copies, relative to its live directory
    /// (and to its folder in the snapshot).
    fn files(&self, live: &Path) -> Result<Vec<PathBuf>, BackupError>;

    /// The files the serving process writes into an online snapshot
    /// itself (the task store's database, copied by its own thread).
    fn written_live(&self) -> &'static [&'static str];

    /// The files an online snapshot copies as files, beside those.
    fn files_beside_live_copy(&self, live: &Path) -> Result<Vec<PathBuf>, BackupError>;

    /// Whether a file that goes missing while it is being copied (the
    /// daemon serving) may be left out: the part's own copy, taken first,
    /// no longer needs it.
    fn may_vanish(&self, rel: &Path) -> bool;

    /// Whether `rel` (relative to its folder in a snapshot) may be one of
    /// its files.
    fn holds(&self, rel: &Path) -> bool;

    /// The folders a copy of it may hold, empty or not, relative to its
    /// folder in a snapshot.
    fn folders(&self) -> &'static [&'static str];

    /// The files a copy of it cannot be without.
    fn required(&self) -> &'static [&'static str];

    /// Validates a copy of it (its folder in a snapshot), read-only.
    fn verify(&self, copy: &Path, config: &Config) -> Result<Verified, BackupError>;

    /// What the part holds on disk now, for `taskgate status`: its files
    /// (those an offline backup would copy) and their bytes.
    fn footprint(&self, live: &Path) -> Footprint {
        let files = self.files(live).unwrap_or_default();
        Footprint {
            files: files.len() as u64,
            bytes: files
                .iter()
                .filter_map(|f| fs::symlink_metadata(live.join(f)).ok())
                .map(|m| m.len())
                .sum(),
        }
    }

    /// Restore: moves what `live` holds of the part into `evidence` and
    /// installs the staged copy from `staged`, so that the live directory is
    /// never left without the file a start checks for.
    fn swap(&self, live: &Path, staged: &Path, evidence: &Path) -> Result<(), BackupError>;
}

/// Declares the registered parts: one `field: Type` line each.
macro_rules! parts {
    ($($field:ident: $part:ty,)+) => {
        /// Every durable part of the daemon, in the order they are checked,
        /// copied and restored.
        pub struct Parts {
            $(pub $field: $part,)+
        }

        impl Parts {
            pub fn new() -> Parts {
                Parts { $($field: <$part>::default(),)+ }
            }

            /// Every part, in registration order.
            pub fn all(&self) -> Vec<&dyn Part> {
                vec![$(&self.$field as &dyn Part,)+]
            }
        }
    };
}

parts! {
    task_store: task_store::TaskStore,
    approval_journal: approval_journal::ApprovalJournal,
}

impl Default for Parts {
    fn default() -> Self {
        Parts::new()
    }
}

/// A file of a snapshot: its part and its path under the part's folder.
pub struct Listed<'p> {
    pub part: &'p dyn Part,
    pub rel: PathBuf,
}

impl Listed<'_> {
    /// Its path relative to the snapshot's root.
    pub fn in_snapshot(&self) -> PathBuf {
        Path::new(self.part.snapshot_dir()).join(&self.rel)
    }
}

/// A part with its files in a snapshot: each file's sha256 and its path
/// relative to the snapshot's root.
pub type PartFiles<'p> = (&'p dyn Part, Vec<(String, PathBuf)>);

/// Writes a manifest: for every part, its name line, then its files with
/// their sums.
pub fn manifest_text(entries: &[PartFiles<'_>]) -> String {
    let mut text = String::new();
    for (part, files) in entries {
        text.push_str(&format!("{PART_LINE}{}\n", part.name()));
        for (sum, rel) in files {
            text.push_str(&format!("{sum}  {}\n", rel.display()));
        }
    }
    text
}

/// Reads a manifest: each file with its sum and its part. A file before
/// any part line is the task store's (a manifest written before parts).
pub fn read_manifest<'p>(
    parts: &'p Parts,
    snapshot: &Path,
) -> Result<Vec<(String, Listed<'p>)>, BackupError> {
    let bad = |problem: String| BackupError::BadSnapshot {
        path: snapshot.to_path_buf(),
        problem,
    };
    let manifest = snapshot.join(MANIFEST);
    let file = File::open(&manifest).map_err(|e| bad(format!("no readable {MANIFEST}: {e}")))?;
    let mut part: &dyn Part = &parts.task_store;
    let mut out = Vec::new();
    for line in io::BufRead::lines(io::BufReader::new(file)) {
        let line = line.map_err(|e| bad(format!("{MANIFEST}: {e}")))?;
        if line.trim().is_empty() {
            continue;
        }
        if let Some(name) = line.strip_prefix(PART_LINE) {
            part = parts
                .all()
                .into_iter()
                .find(|p| p.name() == name)
                .ok_or_else(|| {
                    bad(format!(
                        "{MANIFEST} names a part this taskgate does not know: {name:?}"
                    ))
                })?;
            continue;
        }
        let (sum, path) = line
            .split_once("  ")
            .ok_or_else(|| bad(format!("{MANIFEST}: malformed line {line:?}")))?;
        let path = PathBuf::from(path);
        let rel = path
            .strip_prefix(part.snapshot_dir())
            .map(Path::to_path_buf)
            .ok()
            .filter(|rel| part.holds(rel))
            .ok_or_else(|| {
                bad(format!(
                    "{MANIFEST} lists an unexpected file {} for the {}",
                    path.display(),
                    part.name()
                ))
            })?;
        out.push((sum.to_string(), Listed { part, rel }));
    }
    Ok(out)
}

pub(crate) fn sha256_of(path: &Path) -> Result<String, BackupError> {
    let mut f = File::open(path).map_err(io_err(path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf).map_err(io_err(path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(crate::store::Digest(h.finalize().into()).to_hex())
}

/// Who restored files belong to: the state directory's user and group.
pub type Owner = Option<(u32, u32)>;

pub(crate) fn give(path: &Path, owner: Owner) {
    if let Some((uid, gid)) = owner {
        let _ = nix::unistd::chown(
            path,
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
        );
    }
}

/// Copies one file privately and durably; returns its sha256.
pub(crate) fn copy_private(from: &Path, to: &Path, owner: Owner) -> Result<String, BackupError> {
    let mut src = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(from)
        .map_err(io_err(from))?;
    let mut dst = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(to)
        .map_err(io_err(to))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = src.read(&mut buf).map_err(io_err(from))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        dst.write_all(&buf[..n]).map_err(io_err(to))?;
    }
    dst.sync_all().map_err(io_err(to))?;
    give(to, owner);
    Ok(crate::store::Digest(h.finalize().into()).to_hex())
}

pub(crate) fn sync_dir(dir: &Path) -> Result<(), BackupError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}

pub(crate) fn make_private_dir(path: &Path, owner: Owner) -> Result<(), BackupError> {
    fs::DirBuilder::new()
        .mode(0o700)
        .create(path)
        .map_err(io_err(path))?;
    give(path, owner);
    Ok(())
}

/// Makes the private folders above `rel` inside `root` that are missing.
pub(crate) fn make_parents(root: &Path, rel: &Path, owner: Owner) -> Result<(), BackupError> {
    let mut at = root.to_path_buf();
    if let Some(parent) = rel.parent() {
        for c in parent.components() {
            at.push(c);
            if !at.exists() {
                make_private_dir(&at, owner)?;
            }
        }
    }
    Ok(())
}
