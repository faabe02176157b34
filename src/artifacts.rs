//! Spilled results: a terminal result larger than the 16 KiB record limit
//! is written whole to `artifacts/<task-id>.json` in the state directory
//! (0600, fsynced, renamed into place) and the task's stored result points
//! to it. Artifacts are bound to the task's owner, survive restarts, and go
//! when their task has expired. Their total size is bounded.
//!
//! The file is written before the task's outcome commits, so a crash can
//! leave a temporary file, or a whole artifact for a task that never
//! committed its result. Opening removes the temporaries, and startup
//! removes the artifacts of the tasks restart recovery ends
//! ([`Artifacts::discard`]), so what is served matches the committed state.
//!
//! Owns spilled results. `artifacts/<task-id>.json`, 0600, written to a
//! temporary file, fsynced, renamed, directory fsynced; bound to the owner's
//! digest; total bytes bounded. At open, leftover temporaries and the artifacts
//! of tasks recovery ends are removed, so what is served always matches the
//! committed state.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::exit::{Classify, ExitClass};
use crate::store::{Digest, TaskId};
use crate::testhooks;

pub const DIR_NAME: &str = crate::state_dir::ARTIFACTS_DIR;
/// A write in progress is `.<task-id>.tmp` until it is renamed into place.
const TMP_PREFIX: &str = ".";
const TMP_SUFFIX: &str = ".tmp";

fn is_temporary(name: &std::ffi::OsStr) -> bool {
    let name = name.to_string_lossy();
    name.strip_prefix(TMP_PREFIX)
        .and_then(|rest| rest.strip_suffix(TMP_SUFFIX))
        .and_then(TaskId::parse)
        .is_some()
}

#[derive(Debug, Error)]
pub enum ArtifactError {
    #[error("{path}: {problem}")]
    Unsafe { path: PathBuf, problem: String },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error(
        "{path}: this process cannot list and write it ({source}); serving writes results there: make it writable by uid {uid} (mode 0700, on a file system mounted read-write)"
    )]
    Unwritable {
        path: PathBuf,
        uid: u32,
        source: nix::errno::Errno,
    },
    #[error(
        "result of {size} bytes exceeds the {limit}-byte artifact limit (tasks.artifact_max_bytes)"
    )]
    TooLarge { size: u64, limit: u64 },
    #[error(
        "artifact space exhausted: {used} of {limit} bytes in use (tasks.artifacts_max_total_bytes)"
    )]
    Full { used: u64, limit: u64 },
}

impl Classify for ArtifactError {
    fn exit_class(&self) -> ExitClass {
        match self {
            ArtifactError::Unsafe { .. } | ArtifactError::Unwritable { .. } => {
                ExitClass::UnsafePath
            }
            _ => ExitClass::Io,
        }
    }
}

/// The file format: the owner it belongs to and the whole result.
#[derive(Serialize, Deserialize)]
struct Stored {
    owner: String,
    result: serde_json::Value,
}

#[derive(Debug)]
pub struct Artifacts {
    dir: PathBuf,
    max_one: u64,
    max_total: u64,
    used: Mutex<u64>,
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> ArtifactError + '_ {
    move |source| ArtifactError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What opening the artifacts directory will find and do, learnt without
/// writing anything: startup inspects before the database is first written,
/// so a directory that would refuse the start refuses it while every file is
/// still as it was.
#[derive(Debug)]
pub struct Inspection {
    dir: PathBuf,
    exists: bool,
    used: u64,
    /// Temporary files of writes a crash interrupted, removed by
    /// [`Inspection::open`].
    temporaries: Vec<PathBuf>,
    max_one: u64,
    max_total: u64,
}

impl Inspection {
    /// Creates the directory (0700) when it was missing, removes the
    /// temporaries of interrupted writes (nothing refers to them: they
    /// were never renamed into place), durably, and starts counting.
    pub fn open(self) -> Result<Artifacts, ArtifactError> {
        let dir = self.dir;
        if !self.exists {
            fs::DirBuilder::new()
                .mode(0o700)
                .create(&dir)
                .map_err(io_err(&dir))?;
        }
        for path in &self.temporaries {
            fs::remove_file(path).map_err(io_err(path))?;
        }
        if !self.temporaries.is_empty() {
            File::open(&dir)
                .and_then(|d| d.sync_all())
                .map_err(io_err(&dir))?;
            let removed = self.temporaries.len();
            tracing::info!(
                removed,
                "removed {removed} temporary artifact files left by an interrupted write"
            );
        }
        Ok(Artifacts {
            dir,
            max_one: self.max_one,
            max_total: self.max_total,
            used: Mutex::new(self.used),
        })
    }
}

impl Artifacts {
    /// Opens the artifacts directory inside an already checked state
    /// directory: [`Artifacts::inspect`], then [`Inspection::open`].
    pub fn open(
        state_dir: &Path,
        max_one: u64,
        max_total: u64,
    ) -> Result<Artifacts, ArtifactError> {
        let me = nix::unistd::geteuid().as_raw();
        Self::inspect(state_dir, me, max_one, max_total)?.open()
    }

    /// Reads the artifacts directory without changing it: it must be a
    /// private directory of ours that we can list and write (serving writes
    /// results and removes what a crash left); its bytes in use are
    /// counted and the temporaries of interrupted writes listed. A missing
    /// directory is fine: opening creates it. `owner` is the uid the state
    /// directory belongs to (an operator's `check` may run as root).
    pub fn inspect(
        state_dir: &Path,
        owner: u32,
        max_one: u64,
        max_total: u64,
    ) -> Result<Inspection, ArtifactError> {
        let dir = state_dir.join(DIR_NAME);
        let mut inspection = Inspection {
            dir,
            exists: false,
            used: 0,
            temporaries: Vec::new(),
            max_one,
            max_total,
        };
        let dir = &inspection.dir;
        let meta = match fs::symlink_metadata(dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(inspection),
            Err(e) => return Err(io_err(dir)(e)),
            Ok(meta) => meta,
        };
        let me = owner;
        if !meta.is_dir() || meta.file_type().is_symlink() {
            return Err(ArtifactError::Unsafe {
                path: dir.clone(),
                problem: "not a directory (a symlink or a file); remove it".into(),
            });
        }
        if meta.uid() != me || meta.mode() & 0o077 != 0 {
            return Err(ArtifactError::Unsafe {
                path: dir.clone(),
                problem: format!(
                    "must be owned by uid {me} with mode 0700 (found uid {}, mode {:04o})",
                    meta.uid(),
                    meta.mode() & 0o7777
                ),
            });
        }
        // Permission bits alone do not say it (root passes them; a
        // read-only mount does not): ask the kernel, as this process.
        nix::unistd::faccessat(
            nix::fcntl::AT_FDCWD,
            dir,
            nix::unistd::AccessFlags::R_OK
                | nix::unistd::AccessFlags::W_OK
                | nix::unistd::AccessFlags::X_OK,
            nix::fcntl::AtFlags::AT_EACCESS,
        )
        .map_err(|source| ArtifactError::Unwritable {
            path: dir.clone(),
            uid: me,
            source,
        })?;
        let mut used = 0;
        let mut temporaries = Vec::new();
        for entry in fs::read_dir(dir).map_err(io_err(dir))? {
            let entry = entry.map_err(io_err(dir))?;
            let path = entry.path();
            let m = entry.metadata().map_err(io_err(&path))?;
            if !m.is_file() {
                continue;
            }
            if is_temporary(&entry.file_name()) {
                temporaries.push(path);
            } else {
                used += m.len();
            }
        }
        inspection.exists = true;
        inspection.used = used;
        inspection.temporaries = temporaries;
        Ok(inspection)
    }

    fn path_of(&self, id: &TaskId) -> PathBuf {
        self.dir.join(format!("{}.json", id.as_str()))
    }

    /// Removes the artifacts of tasks whose result never committed (restart
    /// recovery is about to end them), durably.
    pub fn discard(&self, ids: &[TaskId]) -> Result<(), ArtifactError> {
        let mut removed = 0;
        for id in ids {
            if fs::symlink_metadata(self.path_of(id)).is_ok() {
                self.remove(id)?;
                removed += 1;
            }
        }
        if removed > 0 {
            File::open(&self.dir)
                .and_then(|d| d.sync_all())
                .map_err(io_err(&self.dir))?;
            tracing::info!(
                removed,
                "removed {removed} results spilled by tasks that never committed them"
            );
        }
        Ok(())
    }

    /// Writes the result durably; an error means nothing usable was kept.
    pub fn write(
        &self,
        id: &TaskId,
        owner: &Digest,
        result: &serde_json::Value,
    ) -> Result<u64, ArtifactError> {
        let bytes = serde_json::to_vec(&Stored {
            owner: owner.to_hex(),
            result: result.clone(),
        })
        .unwrap_or_default();
        let size = bytes.len() as u64;
        if size > self.max_one {
            return Err(ArtifactError::TooLarge {
                size,
                limit: self.max_one,
            });
        }
        {
            let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
            if *used + size > self.max_total {
                return Err(ArtifactError::Full {
                    used: *used,
                    limit: self.max_total,
                });
            }
            // Reserve before writing so concurrent writers cannot overshoot.
            *used += size;
        }
        let written = self.write_file(id, &bytes);
        if written.is_err() {
            let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
            *used = used.saturating_sub(size);
        }
        written.map(|()| size)
    }

    fn write_file(&self, id: &TaskId, bytes: &[u8]) -> Result<(), ArtifactError> {
        let final_path = self.path_of(id);
        let tmp = self
            .dir
            .join(format!("{TMP_PREFIX}{}{TMP_SUFFIX}", id.as_str()));
        let _ = fs::remove_file(&tmp);
        let result = (|| -> io::Result<()> {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()?;
            testhooks::crash_point(testhooks::CRASH_AFTER_ARTIFACT_TEMP);
            fs::rename(&tmp, &final_path)?;
            File::open(&self.dir)?.sync_all()?;
            testhooks::crash_point(testhooks::CRASH_AFTER_ARTIFACT_RENAME);
            Ok(())
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result.map_err(io_err(&final_path))
    }

    /// The owner's spilled result, if this owner's artifact exists.
    pub fn read(
        &self,
        id: &TaskId,
        owner: &Digest,
    ) -> Result<Option<serde_json::Value>, ArtifactError> {
        let path = self.path_of(id);
        let file = match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err(&path)(e)),
        };
        let stored: Stored = match serde_json::from_reader(io::BufReader::new(file)) {
            Ok(s) => s,
            Err(e) => {
                return Err(ArtifactError::Io {
                    path,
                    source: io::Error::new(io::ErrorKind::InvalidData, e),
                });
            }
        };
        Ok((stored.owner == owner.to_hex()).then_some(stored.result))
    }

    /// Task IDs with an artifact on disk, at most `limit`, for expiry checks.
    pub fn list(&self, limit: usize) -> Result<Vec<TaskId>, ArtifactError> {
        let mut ids = Vec::new();
        for entry in fs::read_dir(&self.dir).map_err(io_err(&self.dir))? {
            let entry = entry.map_err(io_err(&self.dir))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if let Some(id) = name.strip_suffix(".json").and_then(TaskId::parse) {
                ids.push(id);
                if ids.len() >= limit {
                    break;
                }
            }
        }
        Ok(ids)
    }

    /// Deletes the artifact of a task that no longer exists.
    pub fn remove(&self, id: &TaskId) -> Result<(), ArtifactError> {
        let path = self.path_of(id);
        let size = fs::symlink_metadata(&path).map(|m| m.len()).unwrap_or(0);
        match fs::remove_file(&path) {
            Ok(()) => {
                let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
                *used = used.saturating_sub(size);
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err(&path)(e)),
        }
    }

    pub fn used_bytes(&self) -> u64 {
        *self.used.lock().unwrap_or_else(|p| p.into_inner())
    }
}
