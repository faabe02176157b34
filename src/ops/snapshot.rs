//! Online snapshots: a consistent copy of every durable part, written
//! while the daemon serves, in the offline backup's format.

use std::fs;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::{Ops, OpsError};
use crate::backup::{self, BackupError};
use crate::parts::{self, Parts};
use crate::state_dir;

/// A finished online snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotDone {
    pub dest: PathBuf,
    /// What `backup` prints, line by line.
    pub lines: Vec<String>,
}

/// Clears the running flag however the snapshot ends.
struct SnapshotFlag<'a>(&'a AtomicBool);

impl Drop for SnapshotFlag<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

fn stopped(e: tokio::task::JoinError) -> OpsError {
    OpsError::Internal(e.to_string())
}

impl Ops {
    /// Writes an online snapshot into `to`, a new absolute path: the task
    /// store's database copied by the store's own thread while it serves,
    /// then every other part's files, sealed with a manifest. Nothing is
    /// kept of a snapshot that fails.
    pub async fn snapshot(&self, to: PathBuf) -> Result<SnapshotDone, OpsError> {
        if self
            .snapshot_running
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(OpsError::SnapshotRunning);
        }
        let _running = SnapshotFlag(&self.snapshot_running);
        if self.svc.is_stopping() {
            return Err(OpsError::Stopping {
                then: "take an offline backup (`taskgate backup`) once it has stopped",
            });
        }
        if let Some(reason) = self.store.disabled_reason() {
            return Err(OpsError::StoreDisabled(reason));
        }
        // Destination checks, then an empty private file for each file the
        // serving process writes itself: nothing else is done before they
        // pass.
        let state_dir = self.state_dir.clone();
        let dest = tokio::task::spawn_blocking(move || -> Result<PathBuf, BackupError> {
            let dest = backup::create_destination(&to, &state_dir)?;
            for part in Parts::new().all() {
                for name in part.written_live() {
                    let rel = Path::new(part.snapshot_dir()).join(name);
                    let file = dest.join(&rel);
                    let made = parts::make_parents(&dest, &rel, None).and_then(|()| {
                        fs::OpenOptions::new()
                            .write(true)
                            .create_new(true)
                            .mode(0o600)
                            .custom_flags(libc::O_NOFOLLOW)
                            .open(&file)
                            .map(drop)
                            .map_err(|source| BackupError::Io {
                                path: file.clone(),
                                source,
                            })
                    });
                    if let Err(e) = made {
                        let _ = fs::remove_dir_all(&dest);
                        return Err(e);
                    }
                }
            }
            Ok(dest)
        })
        .await
        .map_err(stopped)?
        .map_err(OpsError::Backup)?;
        let discard = |dest: &Path| {
            // Ours alone: made above, private, never handed out.
            if let Err(e) = fs::remove_dir_all(dest) {
                tracing::warn!(dest = %dest.display(), error = %e, "cannot remove the unfinished snapshot {}: {e}", dest.display());
            }
        };
        let started = Instant::now();
        let copied = match self.store.snapshot(&dest.join(state_dir::DB_FILE)).await {
            Ok(r) => r,
            Err(e) => {
                discard(&dest);
                return Err(OpsError::SnapshotFailed(e));
            }
        };
        let db_time = started.elapsed();
        let (state_dir, sealed_dest, config) =
            (self.state_dir.clone(), dest.clone(), self.config.clone());
        let gate = self.svc.approvals().and_then(|a| a.gate().cloned());
        let sealed = tokio::task::spawn_blocking(move || {
            // No journal segment is removed while the copy lists and reads them.
            let _segments = gate.as_ref().map(|g| g.hold_segments());
            let parts = Parts::new();
            let mut copies = Vec::new();
            for part in parts.all() {
                let live = part.live_dir(&state_dir, &config);
                copies.push(backup::PartCopy {
                    part,
                    copy: part.files_beside_live_copy(&live)?,
                    present: part.written_live().iter().map(PathBuf::from).collect(),
                    live,
                });
            }
            backup::seal(&sealed_dest, &copies, &config)
        })
        .await;
        match sealed {
            Ok(Ok(sealed)) => {
                let mut lines = sealed.lines(&self.state_dir, &dest);
                lines.insert(
                    1,
                    format!(
                        "online: database copied while serving, {} pages in {} steps ({} command batches served between them) in {} ms",
                        copied.pages,
                        copied.steps,
                        copied.batches_between,
                        db_time.as_millis()
                    ),
                );
                tracing::info!(dest = %dest.display(), pages = copied.pages, "online snapshot written to {}", dest.display());
                Ok(SnapshotDone { dest, lines })
            }
            Ok(Err(e)) => {
                discard(&dest);
                Err(OpsError::Backup(e))
            }
            Err(e) => {
                discard(&dest);
                Err(stopped(e))
            }
        }
    }
}
