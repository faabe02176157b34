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

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};
use thiserror::Error;

use crate::config::{Config, Overrides};
use crate::exit::{Classify, ExitClass, Refusal};
use crate::state_dir::{self, Actor, StateDir};
use crate::store::{self, CheckReport, StoreId};

pub const MANIFEST: &str = "MANIFEST.sha256";

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

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> BackupError + '_ {
    move |source| BackupError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The files a snapshot may hold, relative to the state directory.
fn snapshot_files(dir: &Path) -> Result<Vec<PathBuf>, BackupError> {
    let mut files = Vec::new();
    for name in [state_dir::DB_FILE, state_dir::WAL_FILE] {
        if dir.join(name).is_file() {
            files.push(PathBuf::from(name));
        }
    }
    let artifacts = dir.join(state_dir::ARTIFACTS_DIR);
    if artifacts.is_dir() {
        let mut names: Vec<_> = fs::read_dir(&artifacts)
            .map_err(io_err(&artifacts))?
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .map(|e| e.file_name())
            .filter(|n| n.to_string_lossy().ends_with(".json"))
            .collect();
        names.sort();
        for n in names {
            files.push(Path::new(state_dir::ARTIFACTS_DIR).join(n));
        }
    }
    Ok(files)
}

fn sha256_of(path: &Path) -> Result<String, BackupError> {
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
    Ok(store::Digest(h.finalize().into()).to_hex())
}

/// Copies one file privately and durably; returns its sha256.
fn copy_private(from: &Path, to: &Path, owner: Owner) -> Result<String, BackupError> {
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
    Ok(store::Digest(h.finalize().into()).to_hex())
}

/// Who restored files belong to: the state directory's user and group.
type Owner = Option<(u32, u32)>;

fn give(path: &Path, owner: Owner) {
    if let Some((uid, gid)) = owner {
        let _ = nix::unistd::chown(
            path,
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
        );
    }
}

fn sync_dir(dir: &Path) -> Result<(), BackupError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}

fn make_private_dir(path: &Path, owner: Owner) -> Result<(), BackupError> {
    fs::DirBuilder::new()
        .mode(0o700)
        .create(path)
        .map_err(io_err(path))?;
    give(path, owner);
    Ok(())
}

/// Opens the state directory named by the configuration, as an operator.
fn operator_dir(overrides: &Overrides) -> Result<(Config, StateDir), Refusal> {
    let config = Config::load(overrides)?;
    let dir = StateDir::open_as(&config.state_dir, false, Actor::Operator)?;
    dir.check_files()?;
    Ok((config, dir))
}

fn describe(report: &CheckReport) -> String {
    match report {
        CheckReport::Valid {
            version,
            retained,
            unexpired,
            ..
        } => format!("schema {version}, integrity ok, {retained} tasks ({unexpired} unexpired)"),
        CheckReport::Pristine => "an empty database".into(),
        CheckReport::Missing => "no database".into(),
    }
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
    if !dir.db_path().is_file() {
        return Err(BackupError::Empty {
            path: dir.path().into(),
        }
        .into());
    }

    make_private_dir(&real_dest, None)?;
    let files = snapshot_files(dir.path())?;
    let sealed = seal(
        dir.path(),
        &real_dest,
        &files,
        &[],
        config.store.max_db_pages,
    )?;
    Ok(sealed.lines(dir.path(), &real_dest))
}

/// A snapshot written and checked.
pub struct Sealed {
    pub files: usize,
    pub bytes: u64,
    pub manifest: PathBuf,
    pub report: CheckReport,
}

impl Sealed {
    /// What `backup` prints.
    pub fn lines(&self, state_dir: &Path, dest: &Path) -> Vec<String> {
        vec![
            format!("backed up {} to {}", state_dir.display(), dest.display()),
            format!(
                "{} files, {} bytes; manifest {}",
                self.files,
                self.bytes,
                self.manifest.display()
            ),
            format!("copy verified: {}", describe(&self.report)),
        ]
    }
}

/// Completes a snapshot in `dest`: copies `copy` (paths relative to the
/// state directory) into it, takes `present` as already written there,
/// writes the manifest of both, syncs everything, and checks the copied
/// database. The same format whether the daemon was stopped (every file
/// copied) or serving (the database written by the store, the artifacts
/// copied here), so `restore` takes either.
pub fn seal(
    state_dir: &Path,
    dest: &Path,
    copy: &[PathBuf],
    present: &[PathBuf],
    max_db_pages: u64,
) -> Result<Sealed, BackupError> {
    let mut manifest = String::new();
    let mut bytes = 0u64;
    for rel in present {
        let path = dest.join(rel);
        File::open(&path)
            .and_then(|f| f.sync_all())
            .map_err(io_err(&path))?;
        manifest.push_str(&format!("{}  {}\n", sha256_of(&path)?, rel.display()));
        bytes += fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    }
    for rel in copy {
        let to = dest.join(rel);
        if let Some(p) = to.parent()
            && !p.exists()
        {
            make_private_dir(p, None)?;
        }
        let from = state_dir.join(rel);
        let sum = match copy_private(&from, &to, None) {
            Ok(sum) => sum,
            // While a daemon serves, the artifact of a task that expired
            // since the listing may go; the copied database (taken
            // first) holds no live task for it.
            Err(BackupError::Io { path, source })
                if path == from
                    && source.kind() == io::ErrorKind::NotFound
                    && rel.starts_with(state_dir::ARTIFACTS_DIR) =>
            {
                continue;
            }
            Err(e) => return Err(e),
        };
        bytes += fs::metadata(&to).map(|m| m.len()).unwrap_or(0);
        manifest.push_str(&format!("{sum}  {}\n", rel.display()));
    }
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
    if dest.join(state_dir::ARTIFACTS_DIR).is_dir() {
        sync_dir(&dest.join(state_dir::ARTIFACTS_DIR))?;
    }
    sync_dir(dest)?;
    if let Some(parent) = dest.parent() {
        sync_dir(parent)?;
    }
    let report =
        store::check_read_only(&dest.join(state_dir::DB_FILE), max_db_pages).map_err(|e| {
            BackupError::BadSnapshot {
                path: dest.to_path_buf(),
                problem: format!("the copy failed its check: {e}"),
            }
        })?;
    let files = manifest.lines().count();
    Ok(Sealed {
        files,
        bytes,
        manifest: manifest_path,
        report,
    })
}

/// The spilled artifacts of a state directory, relative to it: what an
/// online snapshot copies beside the database the store wrote.
pub fn artifact_files(dir: &Path) -> Result<Vec<PathBuf>, BackupError> {
    Ok(snapshot_files(dir)?
        .into_iter()
        .filter(|p| p.starts_with(state_dir::ARTIFACTS_DIR))
        .collect())
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
/// list: any file, directory, link or other object besides the manifest
/// and the `artifacts/` folder. Every entry is looked at, not only the
/// names a backup would write, so nothing rides along unchecked.
fn unlisted_entry(snapshot: &Path, listed: &[PathBuf]) -> Result<Option<PathBuf>, BackupError> {
    let names = |dir: &Path| -> Result<Vec<(std::ffi::OsString, fs::FileType)>, BackupError> {
        let mut out = Vec::new();
        for entry in fs::read_dir(dir).map_err(io_err(dir))? {
            let entry = entry.map_err(io_err(dir))?;
            let kind = entry.file_type().map_err(io_err(&entry.path()))?;
            out.push((entry.file_name(), kind));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    };
    for (name, kind) in names(snapshot)? {
        let rel = PathBuf::from(&name);
        if name == MANIFEST && kind.is_file() {
            continue;
        }
        if name == state_dir::ARTIFACTS_DIR && kind.is_dir() {
            for (inner, _) in names(&snapshot.join(&name))? {
                let rel = rel.join(inner);
                if !listed.contains(&rel) {
                    return Ok(Some(rel));
                }
            }
            continue;
        }
        if !listed.contains(&rel) {
            return Ok(Some(rel));
        }
    }
    Ok(None)
}

/// Reads and checks a snapshot's manifest against its files.
fn verify_snapshot(
    snapshot: &Path,
    max_pages: u64,
) -> Result<(Vec<PathBuf>, CheckReport, Option<StoreId>), BackupError> {
    let bad = |problem: String| BackupError::BadSnapshot {
        path: snapshot.to_path_buf(),
        problem,
    };
    let manifest = snapshot.join(MANIFEST);
    let file = File::open(&manifest).map_err(|e| bad(format!("no readable {MANIFEST}: {e}")))?;
    let mut listed = Vec::new();
    for line in io::BufReader::new(file).lines() {
        let line = line.map_err(|e| bad(format!("{MANIFEST}: {e}")))?;
        if line.trim().is_empty() {
            continue;
        }
        let (sum, rel) = line
            .split_once("  ")
            .ok_or_else(|| bad(format!("{MANIFEST}: malformed line {line:?}")))?;
        let rel = PathBuf::from(rel);
        let allowed = rel == Path::new(state_dir::DB_FILE)
            || rel == Path::new(state_dir::WAL_FILE)
            || (rel.parent() == Some(Path::new(state_dir::ARTIFACTS_DIR))
                && rel.extension().is_some_and(|e| e == "json"));
        if !allowed || rel.components().count() > 2 {
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
        let actual = sha256_of(&snapshot.join(&rel))?;
        if actual != sum {
            return Err(bad(format!(
                "{} does not match its checksum",
                rel.display()
            )));
        }
        listed.push(rel);
    }
    if let Some(extra) = unlisted_entry(snapshot, &listed)? {
        return Err(bad(format!(
            "{} is not in the manifest; a snapshot holds only the files backup listed",
            extra.display()
        )));
    }
    if !listed.iter().any(|p| p == Path::new(state_dir::DB_FILE)) {
        return Err(bad("the manifest lists no tasks.db".into()));
    }
    let (report, identity) =
        store::check_identified(&snapshot.join(state_dir::DB_FILE), max_pages, None)
            .map_err(|e| bad(format!("it fails validation: {e}")))?;
    Ok((listed, report, identity))
}

/// `taskgate restore --from SNAPSHOT --verify-only`.
pub fn verify(overrides: &Overrides, snapshot: &Path) -> Result<Vec<String>, Refusal> {
    let config = Config::load(overrides)?;
    let snapshot = absolute(snapshot)?;
    let (files, report, _) = verify_snapshot(&snapshot, config.store.max_db_pages)?;
    Ok(vec![
        format!(
            "snapshot {} verified: {} files match the manifest",
            snapshot.display(),
            files.len()
        ),
        format!("snapshot: {}", describe(&report)),
    ])
}

/// `taskgate restore --from SNAPSHOT`: returns the lines to print.
pub fn restore(overrides: &Overrides, snapshot: &Path) -> Result<Vec<String>, Refusal> {
    let (config, dir) = operator_dir(overrides)?;
    let snapshot = absolute(snapshot)?;
    let (files, report, identity) = verify_snapshot(&snapshot, config.store.max_db_pages)?;
    let mut lock = dir.lock()?;
    // The directory is about to hold the snapshot's store: no identity is
    // recorded during the swap (a crash in it leaves either database
    // servable), and the snapshot's is recorded once it is installed.
    lock.record_store(None)?;
    let owner = if nix::unistd::geteuid().is_root() && dir.owner() != 0 {
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
    //    so the swap below is made of renames).
    make_private_dir(&staging, owner)?;
    for rel in &files {
        let to = staging.join(rel);
        if let Some(p) = to.parent()
            && !p.exists()
        {
            make_private_dir(p, owner)?;
        }
        copy_private(&snapshot.join(rel), &to, owner)?;
    }
    sync_dir(&staging)?;

    // 2. Keep what is replaced as evidence: the database by a second link
    //    (so tasks.db never disappears), its sidecars and artifacts moved.
    make_private_dir(&evidence, owner)?;
    let live = dir.path();
    if live.join(state_dir::DB_FILE).exists() {
        fs::hard_link(
            live.join(state_dir::DB_FILE),
            evidence.join(state_dir::DB_FILE),
        )
        .map_err(io_err(&evidence))?;
    }
    for name in [
        state_dir::WAL_FILE,
        state_dir::SHM_FILE,
        state_dir::ARTIFACTS_DIR,
    ] {
        if fs::symlink_metadata(live.join(name)).is_ok() {
            fs::rename(live.join(name), evidence.join(name)).map_err(io_err(&live.join(name)))?;
        }
    }
    sync_dir(&evidence)?;

    // 3. Install the snapshot; the database last, replacing the old one in
    //    one rename.
    for name in [state_dir::WAL_FILE, state_dir::ARTIFACTS_DIR] {
        if fs::symlink_metadata(staging.join(name)).is_ok() {
            fs::rename(staging.join(name), live.join(name)).map_err(io_err(&live.join(name)))?;
        }
    }
    fs::rename(
        staging.join(state_dir::DB_FILE),
        live.join(state_dir::DB_FILE),
    )
    .map_err(io_err(&live.join(state_dir::DB_FILE)))?;
    sync_dir(live)?;
    let _ = fs::remove_dir(staging.join(state_dir::ARTIFACTS_DIR));
    let _ = fs::remove_dir(&staging);
    sync_dir(&parent)?;
    lock.record_store(identity.as_ref().map(StoreId::as_str))?;

    let after = store::check_read_only(&dir.db_path(), config.store.max_db_pages)?;
    Ok(vec![
        format!("restored {} from {}", live.display(), snapshot.display()),
        format!("snapshot: {}", describe(&report)),
        format!("now: {}", describe(&after)),
        format!("the replaced files are kept in {}", evidence.display()),
    ])
}
