//! The task store as a durable part: `tasks.db` (with the WAL a crash may
//! have left) and the spilled results in `artifacts/`, in the state
//! directory itself. In a snapshot its files sit at the root, as they did
//! before parts existed.
//!
//! Serving opens it through [`open_serving`]: everything that can refuse a
//! start runs read-only first (the artifacts directory inspected, the
//! database validated), then the database is opened for writing, the
//! directory records which store it holds, the artifacts of tasks restart
//! recovery is about to end are removed, and recovery commits.

use std::fs;
use std::path::{Path, PathBuf};

use super::{BackupError, Part, Verified, io_err, sync_dir};
use crate::artifacts::Artifacts;
use crate::config::Config;
use crate::exit::Refusal;
use crate::state_dir::{self, LifetimeLock, StateDir};
use crate::store::{
    self, CheckReport, Clock, OpenReport, Report, SCHEMA_VERSION, Store, StoreId, StoreOptions,
};

/// The task store part.
#[derive(Default)]
pub struct TaskStore;

/// The store identity a directory recorded beside its database. A malformed
/// record counts as none: it can only come from a hand-edited lock file,
/// and the database is still validated.
pub fn recorded_store(lock: &LifetimeLock) -> Option<StoreId> {
    lock.recorded_store().and_then(|s| StoreId::parse(&s))
}

/// The task store, opened for serving.
pub struct Opened {
    pub store: Store,
    pub artifacts: Artifacts,
    pub report: OpenReport,
}

/// Opens the task store of a claimed directory for serving (startup steps
/// 5–9): a refused start changes no file.
pub fn open_serving(
    dir: &StateDir,
    lock: &mut LifetimeLock,
    config: &Config,
    clock: Clock,
) -> Result<Opened, Refusal> {
    let mut options = StoreOptions::from_settings(&dir.db_path(), &config.store);
    options.clock = clock;
    // A directory that held a store serves that store only: an empty or
    // replaced tasks.db is refused before anything is written.
    options.expected_identity = recorded_store(lock);
    // Read-only, like the database's validation inside `begin_open`: an
    // artifacts directory that would refuse the start refuses it before
    // the database is initialised or migrated and before the lock file
    // records the store. Past this point only an I/O error stops a start.
    let artifacts = inspect_artifacts(dir, config)?;
    let opening = Store::begin_open(options)?;
    // Validated: from here on this process serves the directory, and the
    // directory records which store it holds (the first start after an
    // upgrade records an identity the database has just been given).
    lock.record_store(Some(opening.identity().as_str()))?;
    let artifacts = artifacts.open()?;
    // Before recovery commits: a task it ends never committed a result, so
    // a result spilled for it must not be served. Removed first, a crash in
    // between leaves the task unfinished and this runs again.
    artifacts.discard(opening.unfinished())?;
    let (store, report) = opening.recover()?;
    Ok(Opened {
        store,
        artifacts,
        report,
    })
}

fn inspect_artifacts(
    dir: &StateDir,
    config: &Config,
) -> Result<crate::artifacts::Inspection, Refusal> {
    Ok(Artifacts::inspect(
        dir.path(),
        dir.owner(),
        config.tasks.artifact_max_bytes,
        config.tasks.artifacts_max_total_bytes,
    )?)
}

/// One line for the operator about a checked database.
pub fn describe(report: &CheckReport) -> String {
    match report {
        CheckReport::Valid {
            version, status, ..
        } => format!(
            "schema {version}, integrity ok, {} tasks ({} unexpired)",
            status.tasks.retained, status.tasks.unexpired
        ),
        CheckReport::Pristine => "an empty database".into(),
        CheckReport::Missing => "no database".into(),
    }
}

/// What `check` prints about a checked database in the directory `d`: its
/// schema and tasks, then what every kind's restart recovery would end and
/// what every kind holds, each kind's own lines in registration order.
fn check_lines(d: &str, report: &CheckReport, journal: &Path) -> Vec<String> {
    match report {
        CheckReport::Missing => vec![format!(
            "ok: {d} is private; no database yet (serve creates it)"
        )],
        CheckReport::Pristine => vec![format!(
            "ok: {d} is private; tasks.db is empty (an interrupted first start); serve initialises it"
        )],
        CheckReport::Valid {
            version,
            recovery,
            status,
        } => {
            let mut lines = vec![format!(
                "ok: {d}: schema {version}, integrity ok, {} tasks retained ({} unexpired)",
                status.tasks.retained, status.tasks.unexpired
            )];
            if *version < SCHEMA_VERSION {
                lines.push(format!(
                    "note: serve will migrate schema {version} to {SCHEMA_VERSION}"
                ));
            }
            lines.extend(recovery.lines());
            lines.extend(status.lines());
            if recovery.tasks.awaiting_approval > 0 {
                lines.extend(stale_journal(journal, recovery.tasks.approval_seq));
            }
            lines
        }
    }
}

/// A line when the approval journal in `dir` ends before `needed`, the
/// record waiting approval tasks reached: a journal older than the task
/// store, whose tasks will be unavailable.
fn stale_journal(dir: &Path, needed: u64) -> Option<String> {
    let records = match crate::approvals::Journal::verify(dir) {
        Ok((c, _)) => c.records,
        // A damaged journal is the journal part's line to tell.
        Err(crate::approvals::JournalError::Damaged { .. }) => return None,
        Err(_) => 0,
    };
    (records < needed).then(|| {
        format!(
            "STALE: the approval journal in {} ends at record {records}, before the record {needed} waiting approval tasks reached: it is older than the task store (restored without it?); those tasks stay unavailable until the journal taken with this task store is restored",
            dir.display()
        )
    })
}

fn is_artifact(rel: &Path) -> bool {
    rel.parent() == Some(Path::new(state_dir::ARTIFACTS_DIR))
        && rel.extension().is_some_and(|e| e == "json")
}

fn artifact_files(live: &Path) -> Result<Vec<PathBuf>, BackupError> {
    let artifacts = live.join(state_dir::ARTIFACTS_DIR);
    if !artifacts.is_dir() {
        return Ok(Vec::new());
    }
    let mut names: Vec<_> = fs::read_dir(&artifacts)
        .map_err(io_err(&artifacts))?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().ends_with(".json"))
        .collect();
    names.sort();
    Ok(names
        .into_iter()
        .map(|n| Path::new(state_dir::ARTIFACTS_DIR).join(n))
        .collect())
}

impl Part for TaskStore {
    fn name(&self) -> &'static str {
        "task-store"
    }

    fn snapshot_dir(&self) -> &'static str {
        ""
    }

    fn live_dir(&self, state_dir: &Path, _config: &Config) -> PathBuf {
        state_dir.to_path_buf()
    }

    fn check(
        &self,
        dir: &StateDir,
        lock: &LifetimeLock,
        config: &Config,
    ) -> Result<Vec<String>, Refusal> {
        // What serve would refuse, check refuses: the artifacts directory
        // too.
        inspect_artifacts(dir, config)?;
        let (report, _) = store::check_identified(
            &dir.db_path(),
            config.store.max_db_pages,
            recorded_store(lock).as_ref(),
        )?;
        Ok(check_lines(
            &dir.path().display().to_string(),
            &report,
            &config.approvals.directory,
        ))
    }

    fn present(&self, live: &Path) -> bool {
        live.join(state_dir::DB_FILE).is_file()
    }

    fn files(&self, live: &Path) -> Result<Vec<PathBuf>, BackupError> {
        let mut files = Vec::new();
        for name in [state_dir::DB_FILE, state_dir::WAL_FILE] {
            if live.join(name).is_file() {
                files.push(PathBuf::from(name));
            }
        }
        files.extend(artifact_files(live)?);
        Ok(files)
    }

    fn written_live(&self) -> &'static [&'static str] {
        &[state_dir::DB_FILE]
    }

    fn files_beside_live_copy(&self, live: &Path) -> Result<Vec<PathBuf>, BackupError> {
        artifact_files(live)
    }

    fn may_vanish(&self, rel: &Path) -> bool {
        // While a daemon serves, the artifact of a task that expired since
        // the listing may go; the database, copied first, holds no live
        // task for it.
        is_artifact(rel)
    }

    fn holds(&self, rel: &Path) -> bool {
        rel == Path::new(state_dir::DB_FILE)
            || rel == Path::new(state_dir::WAL_FILE)
            || (is_artifact(rel) && rel.components().count() == 2)
    }

    fn folders(&self) -> &'static [&'static str] {
        &[state_dir::ARTIFACTS_DIR]
    }

    fn required(&self) -> &'static [&'static str] {
        &[state_dir::DB_FILE]
    }

    fn verify(&self, copy: &Path, config: &Config) -> Result<Verified, BackupError> {
        let (report, identity) = store::check_identified(
            &copy.join(state_dir::DB_FILE),
            config.store.max_db_pages,
            None,
        )
        .map_err(|e| BackupError::BadSnapshot {
            path: copy.to_path_buf(),
            problem: format!("it fails validation: {e}"),
        })?;
        Ok(Verified {
            description: describe(&report),
            store_identity: identity,
        })
    }

    fn swap(&self, live: &Path, staged: &Path, evidence: &Path) -> Result<(), BackupError> {
        // What is replaced is kept: the database by a second link (so
        // tasks.db never disappears), its sidecars and artifacts moved.
        if live.join(state_dir::DB_FILE).exists() {
            fs::hard_link(
                live.join(state_dir::DB_FILE),
                evidence.join(state_dir::DB_FILE),
            )
            .map_err(io_err(evidence))?;
        }
        for name in [
            state_dir::WAL_FILE,
            state_dir::SHM_FILE,
            state_dir::ARTIFACTS_DIR,
        ] {
            if fs::symlink_metadata(live.join(name)).is_ok() {
                fs::rename(live.join(name), evidence.join(name))
                    .map_err(io_err(&live.join(name)))?;
            }
        }
        sync_dir(evidence)?;
        // The snapshot installed; the database last, replacing the old one
        // in one rename.
        for name in [state_dir::WAL_FILE, state_dir::ARTIFACTS_DIR] {
            if fs::symlink_metadata(staged.join(name)).is_ok() {
                fs::rename(staged.join(name), live.join(name)).map_err(io_err(&live.join(name)))?;
            }
        }
        fs::rename(
            staged.join(state_dir::DB_FILE),
            live.join(state_dir::DB_FILE),
        )
        .map_err(io_err(&live.join(state_dir::DB_FILE)))?;
        sync_dir(live)
    }
}
