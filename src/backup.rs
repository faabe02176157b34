//! Offline backup and restore of a state directory.
//!
//! Both take the state directory's lifetime lock, so they refuse while a
//! daemon serves it (75). A backup is a private directory holding the
//! database, its WAL if one was left, the spilled artifacts, and a
//! `MANIFEST.sha256` that `sha256sum -c` understands; its integrity is
//! checked before it is reported good. A restore verifies a snapshot
//! completely before it touches anything, keeps everything it replaces in
//! an evidence directory beside the state directory, and never leaves the
//! state directory without a database (which would let a start create an
//! empty one under existing task handles).
//!
//! Owns offline backup and restore. Walks the durable parts
//! (`parts::Parts::all`): a backup copies every part's files into its folder of
//! the snapshot and `seal` writes the manifest (each part named by a `# part
//! NAME` line before its files) and verifies each part's copy; an online
//! snapshot seals the same way around what the serving process wrote itself.
//! Takes the lifetime lock (so it refuses while a daemon serves); verifies only
//! through each part's read-only `Part::verify`; a restore verifies the
//! snapshot completely (every file listed, summed and held by its part, nothing
//! unlisted, each part's copy valid) before touching anything, then stages
//! every file beside the state directory and lets each part swap its copy in
//! (`Part::swap`), keeping what it replaced as evidence; the task store never
//! leaves the directory without a database. Root may act for the directory's
//! owner.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::config::{Config, Overrides};
use crate::exit::{ExitClass, Refusal};
use crate::parts::{
    self, Listed, MANIFEST, Owner, Part, Parts, copy_private, io_err, make_parents,
    make_private_dir, sha256_of, sync_dir,
};
use crate::state_dir::{self, Actor, StateDir};
use crate::store::StoreId;

pub use crate::parts::BackupError;

/// Opens the state directory named by the configuration, as an operator.
fn operator_dir(overrides: &Overrides) -> Result<(Config, StateDir), Refusal> {
    let config = Config::load(overrides)?;
    let dir = StateDir::open_as(&config.state_dir, false, Actor::Operator)?;
    dir.check_files()?;
    Ok((config, dir))
}

/// Checks a backup destination: new, under parents only root or this user
/// can change, and apart from the state directory. Returns the resolved
/// destination and its parent. Runs before the lock is taken, so that
/// `taskgate-backup` learns of a bad destination before it stops anything.
fn check_destination(dir: &StateDir, dest: &Path) -> Result<(PathBuf, PathBuf), Refusal> {
    let dest = absolute(dest)?;
    Ok(destination_checked(dir.path(), &dest)?)
}

/// Checks a new snapshot destination (an absolute path) against the state
/// directory, before anything is written: it must be new, its parent must
/// be trusted (owned by root or this user, not writable by others), and it
/// must be neither inside nor around the state directory. Returns the real
/// destination and its parent.
fn destination_checked(state_dir: &Path, dest: &Path) -> Result<(PathBuf, PathBuf), BackupError> {
    let dest = dest.to_path_buf();
    if !dest.is_absolute() || dest.file_name().is_none() {
        return Err(BackupError::Destination {
            path: dest,
            problem: "the backup destination must be an absolute path naming a new directory"
                .into(),
        });
    }
    if fs::symlink_metadata(&dest).is_ok() {
        return Err(BackupError::Destination {
            path: dest,
            problem: "the backup destination already exists; choose a new destination (a backup never overwrites)".into(),
        });
    }
    let parent = dest.parent().unwrap_or(Path::new("/"));
    let parent = fs::canonicalize(parent).map_err(|e| BackupError::Destination {
        path: dest.clone(),
        problem: format!(
            "the backup destination's parent {} is not usable: {e}",
            parent.display()
        ),
    })?;
    let me = nix::unistd::geteuid().as_raw();
    if let Err(e) = state_dir::check_trusted_chain(&parent, me) {
        let why = match e {
            state_dir::PathError::UntrustedAncestor { path, why } => {
                format!("{} ({why})", path.display())
            }
            other => other.to_string(),
        };
        return Err(BackupError::Destination {
            path: dest,
            problem: format!(
                "the backup destination is not private: its parent {why}; choose a destination whose every parent is owned by root or this user and not writable by others"
            ),
        });
    }
    let real_dest = parent.join(dest.file_name().unwrap_or_default());
    if real_dest.starts_with(state_dir) || state_dir.starts_with(&real_dest) {
        return Err(BackupError::Destination {
            path: dest,
            problem: format!(
                "the backup destination is inside or contains the state directory {}; back up elsewhere",
                state_dir.display()
            ),
        });
    }
    Ok((real_dest, parent))
}

/// `taskgate backup --to DEST --dry-run`: every check a backup makes before
/// it copies (the state directory, its files, the destination), without
/// the lock, so it works while the daemon serves.
pub fn check_backup(overrides: &Overrides, dest: &Path) -> Result<Vec<String>, Refusal> {
    let (_config, dir) = operator_dir(overrides)?;
    let (real_dest, _) = check_destination(&dir, dest)?;
    Ok(vec![format!(
        "ok: {} can be backed up to {} (nothing copied)",
        dir.path().display(),
        real_dest.display()
    )])
}

/// Checks a new snapshot destination and creates it, empty and private;
/// returns its real path. Every check runs before anything is written.
pub fn create_destination(dest: &Path, state_dir: &Path) -> Result<PathBuf, BackupError> {
    let (real_dest, _) = destination_checked(state_dir, dest)?;
    make_private_dir(&real_dest, None)?;
    Ok(real_dest)
}

/// `taskgate backup --to DEST`: returns the lines to print.
pub fn backup(overrides: &Overrides, dest: &Path) -> Result<Vec<String>, Refusal> {
    let (config, dir) = operator_dir(overrides)?;
    let (real_dest, _) = check_destination(&dir, dest)?;
    let mut lock = dir.lock()?;
    lock.record_holder();
    let parts = Parts::new();
    if !parts.task_store.present(dir.path()) {
        return Err(BackupError::Empty {
            path: dir.path().into(),
        }
        .into());
    }

    make_private_dir(&real_dest, None)?;
    let mut copies = Vec::new();
    for part in parts.all() {
        let live = part.live_dir(dir.path(), &config);
        copies.push(PartCopy {
            part,
            copy: part.files(&live)?,
            present: Vec::new(),
            live,
        });
    }
    let sealed = seal(&real_dest, &copies, &config)?;
    Ok(sealed.lines(dir.path(), &real_dest))
}

/// What a snapshot takes of one part.
pub struct PartCopy<'p> {
    pub part: &'p dyn Part,
    /// Its live directory, where `copy` is copied from.
    pub live: PathBuf,
    /// Files copied here, relative to the part's live directory and to its
    /// folder in the snapshot.
    pub copy: Vec<PathBuf>,
    /// Files the serving process has already written into the snapshot.
    pub present: Vec<PathBuf>,
}

/// A snapshot written and checked.
pub struct Sealed {
    pub files: usize,
    pub bytes: u64,
    pub manifest: PathBuf,
    /// Each part's name and what its copy holds.
    pub verified: Vec<(&'static str, String)>,
}

impl Sealed {
    /// What `backup` prints.
    pub fn lines(&self, state_dir: &Path, dest: &Path) -> Vec<String> {
        let mut lines = vec![
            format!("backed up {} to {}", state_dir.display(), dest.display()),
            format!(
                "{} files, {} bytes; manifest {}",
                self.files,
                self.bytes,
                self.manifest.display()
            ),
        ];
        for (_, description) in &self.verified {
            lines.push(format!("copy verified: {description}"));
        }
        lines
    }
}

/// Completes a snapshot in `dest`: for every part, copies its `copy` files
/// into its folder, takes its `present` files as already written there,
/// writes the manifest naming each part before its files, syncs
/// everything, and verifies each part's copy. The same format whether the
/// daemon was stopped (every file copied) or serving (the database written
/// by the store, the artifacts copied here), so `restore` takes either.
pub fn seal(dest: &Path, copies: &[PartCopy<'_>], config: &Config) -> Result<Sealed, BackupError> {
    let mut entries = Vec::new();
    let mut bytes = 0u64;
    for c in copies {
        let folder = dest.join(c.part.snapshot_dir());
        let mut files = Vec::new();
        for rel in &c.present {
            let path = folder.join(rel);
            File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(io_err(&path))?;
            files.push((
                sha256_of(&path)?,
                Path::new(c.part.snapshot_dir()).join(rel),
            ));
            bytes += fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        }
        for rel in &c.copy {
            let to = folder.join(rel);
            make_parents(dest, &Path::new(c.part.snapshot_dir()).join(rel), None)?;
            let from = c.live.join(rel);
            let sum = match copy_private(&from, &to, None) {
                Ok(sum) => sum,
                Err(BackupError::Io { path, source })
                    if path == from
                        && source.kind() == io::ErrorKind::NotFound
                        && c.part.may_vanish(rel) =>
                {
                    continue;
                }
                Err(e) => return Err(e),
            };
            bytes += fs::metadata(&to).map(|m| m.len()).unwrap_or(0);
            files.push((sum, Path::new(c.part.snapshot_dir()).join(rel)));
        }
        entries.push((c.part, files));
    }
    let manifest = parts::manifest_text(&entries);
    let manifest_path = dest.join(MANIFEST);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&manifest_path)
        .map_err(io_err(&manifest_path))?;
    f.write_all(manifest.as_bytes())
        .and_then(|_| f.sync_all())
        .map_err(io_err(&manifest_path))?;
    sync_tree(dest)?;
    if let Some(parent) = dest.parent() {
        sync_dir(parent)?;
    }
    let mut verified = Vec::new();
    for (part, _) in &entries {
        let v = part
            .verify(&dest.join(part.snapshot_dir()), config)
            .map_err(|e| BackupError::BadSnapshot {
                path: dest.to_path_buf(),
                problem: format!("the copy failed its check: {e}"),
            })?;
        verified.push((part.name(), v.description));
    }
    Ok(Sealed {
        files: entries.iter().map(|(_, f)| f.len()).sum(),
        bytes,
        manifest: manifest_path,
        verified,
    })
}

/// Syncs a snapshot's folders, deepest first.
fn sync_tree(dir: &Path) -> Result<(), BackupError> {
    for entry in fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        if entry.file_type().map_err(io_err(&entry.path()))?.is_dir() {
            sync_tree(&entry.path())?;
        }
    }
    sync_dir(dir)
}

fn absolute(p: &Path) -> Result<PathBuf, Refusal> {
    if p.is_absolute() {
        Ok(p.to_path_buf())
    } else {
        std::env::current_dir().map(|d| d.join(p)).map_err(|e| {
            Refusal::new(
                ExitClass::Io,
                format!("cannot resolve {}: {e}", p.display()),
            )
        })
    }
}

/// The first entry of a snapshot directory that its manifest does not
/// list: any file, link or other object besides the manifest, and any
/// folder holding nothing listed. Every entry is looked at, not only the
/// names a backup would write, so nothing rides along unchecked.
fn unlisted_entry(
    snapshot: &Path,
    at: &Path,
    listed: &[PathBuf],
    folders: &[PathBuf],
) -> Result<Option<PathBuf>, BackupError> {
    let dir = snapshot.join(at);
    let mut entries = Vec::new();
    for entry in fs::read_dir(&dir).map_err(io_err(&dir))? {
        let entry = entry.map_err(io_err(&dir))?;
        let kind = entry.file_type().map_err(io_err(&entry.path()))?;
        entries.push((entry.file_name(), kind));
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, kind) in entries {
        let rel = at.join(&name);
        if at.as_os_str().is_empty() && name == MANIFEST && kind.is_file() {
            continue;
        }
        if kind.is_dir() && (folders.contains(&rel) || listed.iter().any(|l| l.starts_with(&rel))) {
            if let Some(found) = unlisted_entry(snapshot, &rel, listed, folders)? {
                return Ok(Some(found));
            }
            continue;
        }
        if !(kind.is_file() && listed.contains(&rel)) {
            return Ok(Some(rel));
        }
    }
    Ok(None)
}

/// A snapshot checked against its manifest, every part's copy verified.
struct Checked<'p> {
    files: Vec<Listed<'p>>,
    /// Each part's verification, in registration order.
    verified: Vec<(&'p dyn Part, parts::Verified)>,
}

/// Reads and checks a snapshot's manifest against its files, then verifies
/// each part's copy.
fn verify_snapshot<'p>(
    parts: &'p Parts,
    snapshot: &Path,
    config: &Config,
) -> Result<Checked<'p>, BackupError> {
    let bad = |problem: String| BackupError::BadSnapshot {
        path: snapshot.to_path_buf(),
        problem,
    };
    let mut files = Vec::new();
    for (sum, listed) in parts::read_manifest(parts, snapshot)? {
        let rel = listed.in_snapshot();
        if listed.rel.components().count() > 2 {
            return Err(bad(format!(
                "{MANIFEST} lists an unexpected file {}",
                rel.display()
            )));
        }
        let meta = fs::symlink_metadata(snapshot.join(&rel))
            .map_err(|e| bad(format!("{} is listed but unreadable: {e}", rel.display())))?;
        if !meta.is_file() {
            return Err(bad(format!("{} is not a regular file", rel.display())));
        }
        if sha256_of(&snapshot.join(&rel))? != sum {
            return Err(bad(format!(
                "{} does not match its checksum",
                rel.display()
            )));
        }
        files.push(listed);
    }
    let listed: Vec<PathBuf> = files.iter().map(Listed::in_snapshot).collect();
    let folders: Vec<PathBuf> = parts
        .all()
        .into_iter()
        .flat_map(|p| {
            let dir = Path::new(p.snapshot_dir());
            let mut all: Vec<PathBuf> = p.folders().iter().map(|f| dir.join(f)).collect();
            if !dir.as_os_str().is_empty() {
                all.push(dir.to_path_buf());
            }
            all
        })
        .collect();
    if let Some(extra) = unlisted_entry(snapshot, Path::new(""), &listed, &folders)? {
        return Err(bad(format!(
            "{} is not in the manifest; a snapshot holds only the files backup listed",
            extra.display()
        )));
    }
    let mut verified = Vec::new();
    for part in parts.all() {
        for required in part.required() {
            if !files
                .iter()
                .any(|f| f.part.name() == part.name() && f.rel == Path::new(required))
            {
                return Err(bad(format!("the manifest lists no {required}")));
            }
        }
        verified.push((
            part,
            part.verify(&snapshot.join(part.snapshot_dir()), config)?,
        ));
    }
    Ok(Checked { files, verified })
}

/// `taskgate restore --from SNAPSHOT --verify-only`.
pub fn verify(overrides: &Overrides, snapshot: &Path) -> Result<Vec<String>, Refusal> {
    let config = Config::load(overrides)?;
    let snapshot = absolute(snapshot)?;
    let parts = Parts::new();
    let checked = verify_snapshot(&parts, &snapshot, &config)?;
    let mut lines = vec![format!(
        "snapshot {} verified: {} files match the manifest",
        snapshot.display(),
        checked.files.len()
    )];
    for (_, v) in &checked.verified {
        lines.push(format!("snapshot: {}", v.description));
    }
    Ok(lines)
}

/// `taskgate restore --from SNAPSHOT`: returns the lines to print.
pub fn restore(overrides: &Overrides, snapshot: &Path) -> Result<Vec<String>, Refusal> {
    let (config, dir) = operator_dir(overrides)?;
    let snapshot = absolute(snapshot)?;
    let parts = Parts::new();
    let checked = verify_snapshot(&parts, &snapshot, &config)?;
    let identity = checked
        .verified
        .iter()
        .find_map(|(_, v)| v.store_identity.clone());
    let mut lock = dir.lock()?;
    // The directory is about to hold the snapshot's store: no identity is
    // recorded during the swap (a crash in it leaves either database
    // servable), and the snapshot's is recorded once it is installed.
    lock.record_store(None)?;
    let owner: Owner = if nix::unistd::geteuid().is_root() && dir.owner() != 0 {
        use std::os::unix::fs::MetadataExt;
        let gid = fs::metadata(dir.path()).map(|m| m.gid()).unwrap_or(0);
        Some((dir.owner(), gid))
    } else {
        None
    };
    let parent = dir.path().parent().unwrap_or(Path::new("/")).to_path_buf();
    let name = dir
        .path()
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "state".into());
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%SZ");
    let staging = parent.join(format!(".{name}.restore-{stamp}"));
    let evidence = parent.join(format!("{name}.replaced-{stamp}"));

    // 1. Stage the snapshot next to the state directory (same filesystem,
    //    so the swaps below are made of renames).
    make_private_dir(&staging, owner)?;
    for listed in &checked.files {
        let rel = listed.in_snapshot();
        make_parents(&staging, &rel, owner)?;
        copy_private(&snapshot.join(&rel), &staging.join(&rel), owner)?;
    }
    sync_tree(&staging)?;

    // 2. Each part keeps what it replaces as evidence and installs its
    //    staged copy.
    make_private_dir(&evidence, owner)?;
    for part in parts.all() {
        let evidence = evidence.join(part.snapshot_dir());
        if !evidence.exists() {
            make_private_dir(&evidence, owner)?;
        }
        part.swap(
            &part.live_dir(dir.path(), &config),
            &staging.join(part.snapshot_dir()),
            &evidence,
        )?;
    }
    let _ = fs::remove_dir_all(&staging);
    sync_dir(&parent)?;
    lock.record_store(identity.as_ref().map(StoreId::as_str))?;

    let mut lines = vec![format!(
        "restored {} from {}",
        dir.path().display(),
        snapshot.display()
    )];
    for (part, v) in &checked.verified {
        let now = part.verify(&part.live_dir(dir.path(), &config), &config)?;
        lines.push(format!("snapshot: {}", v.description));
        lines.push(format!("now: {}", now.description));
    }
    lines.push(format!(
        "the replaced files are kept in {}",
        evidence.display()
    ));
    Ok(lines)
}
