//! The approval journal as a durable part: the segment files
//! `journal-NNNNNN.log` in `approvals.directory`, a private directory of its
//! own beside the state directory, and `journal.base` once old segments
//! were removed. In a snapshot they sit under `approvals/`.
//!
//! It is copied with the task store at the same boundary, after it: the
//! journal only grows, so a copy taken after the database holds at least
//! every decision the database projected (a journal older than the tasks
//! would leave waiting approval tasks without evidence). A snapshot
//! without the folder (taken before approvals existed, or on a host that
//! never held a call) restores to no journal.

use std::fs;
use std::path::{Path, PathBuf};

use super::{BackupError, Part, Verified, io_err, sync_dir};
use crate::approvals::{Journal, JournalError, journal};
use crate::config::Config;
use crate::exit::Refusal;
use crate::state_dir::{LifetimeLock, StateDir};

/// The approval journal part.
#[derive(Default)]
pub struct ApprovalJournal;

fn is_segment(name: &str) -> bool {
    journal::segment_number(name).is_some()
}

/// A file of the journal: a segment, or the base naming where it begins.
fn is_journal_file(name: &str) -> bool {
    is_segment(name) || name == journal::BASE_FILE
}

fn segment_files(live: &Path) -> Result<Vec<PathBuf>, BackupError> {
    let entries = match fs::read_dir(live) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(live)(e)),
    };
    let mut files = Vec::new();
    let mut base = None;
    for entry in entries {
        let name = entry.map_err(io_err(live))?.file_name();
        let name = name.to_string_lossy();
        if is_segment(&name) {
            files.push(PathBuf::from(name.as_ref()));
        } else if name == journal::BASE_FILE {
            base = Some(PathBuf::from(name.as_ref()));
        }
    }
    files.sort();
    // Segments first, the base last: its number is where the copied
    // segments begin.
    files.extend(base);
    Ok(files)
}

/// The copies of torn final frames a start kept (evidence of a crash,
/// never part of the journal nor of a backup).
fn torn_files(live: &Path) -> Result<Vec<PathBuf>, BackupError> {
    let entries = match fs::read_dir(live) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(live)(e)),
    };
    let mut files = Vec::new();
    for entry in entries {
        let name = entry.map_err(io_err(live))?.file_name();
        if journal::is_torn_evidence(&name.to_string_lossy()) {
            files.push(PathBuf::from(name));
        }
    }
    Ok(files)
}

/// One line about a journal copy or the live journal.
fn describe(dir: &Path) -> Result<String, JournalError> {
    if segment_files(dir).map(|f| f.is_empty()).unwrap_or(true) {
        return Ok("no approval journal".into());
    }
    let (c, opened) = Journal::verify(dir)?;
    let mut line = format!(
        "approval journal {}: {} records in {} segments ({} bytes), head {}",
        c.journal,
        c.records,
        c.segments,
        c.bytes,
        &c.head[..c.head.len().min(16)]
    );
    if opened.truncated > 0 {
        line.push_str(&format!(
            "; an unfinished final record ({} bytes, never acknowledged: a crash in the middle of an append) at {} is copied to a journal-*.torn file beside the segments and cut at the next start",
            opened.truncated,
            opened.kept_as.as_deref().unwrap_or("the end")
        ));
    }
    Ok(line)
}

impl Part for ApprovalJournal {
    fn name(&self) -> &'static str {
        "approval-journal"
    }

    fn snapshot_dir(&self) -> &'static str {
        "approvals"
    }

    fn live_dir(&self, _state_dir: &Path, config: &Config) -> PathBuf {
        config.approvals.directory.clone()
    }

    fn check(
        &self,
        _dir: &StateDir,
        _lock: &LifetimeLock,
        config: &Config,
    ) -> Result<Vec<String>, Refusal> {
        let live = &config.approvals.directory;
        if !live.exists() {
            return Ok(Vec::new());
        }
        // A damaged journal does not refuse a start (approvals are disabled
        // and everything else is served), so it is a line, not a refusal.
        Ok(vec![match describe(live) {
            Ok(line) => format!("ok: {line} in {}", live.display()),
            Err(e) => format!(
                "DAMAGED: {e}; the daemon will serve with approvals disabled until the journal is restored with the task store"
            ),
        }])
    }

    fn present(&self, live: &Path) -> bool {
        segment_files(live).is_ok_and(|f| !f.is_empty())
    }

    fn files(&self, live: &Path) -> Result<Vec<PathBuf>, BackupError> {
        segment_files(live)
    }

    fn written_live(&self) -> &'static [&'static str] {
        &[]
    }

    fn files_beside_live_copy(&self, live: &Path) -> Result<Vec<PathBuf>, BackupError> {
        segment_files(live)
    }

    fn may_vanish(&self, _rel: &Path) -> bool {
        false
    }

    fn holds(&self, rel: &Path) -> bool {
        rel.components().count() == 1 && rel.to_str().is_some_and(is_journal_file)
    }

    fn folders(&self) -> &'static [&'static str] {
        &[]
    }

    fn required(&self) -> &'static [&'static str] {
        &[]
    }

    fn verify(&self, copy: &Path, _config: &Config) -> Result<Verified, BackupError> {
        let description = describe(copy).map_err(|e| BackupError::BadSnapshot {
            path: copy.to_path_buf(),
            problem: e.to_string(),
        })?;
        Ok(Verified {
            description,
            store_identity: None,
        })
    }

    fn swap(&self, live: &Path, staged: &Path, evidence: &Path) -> Result<(), BackupError> {
        // What is replaced is kept; then the snapshot's segments go in. The
        // daemon is stopped (the caller holds the state directory's lock),
        // so nothing appends meanwhile.
        // Torn tails kept beside the replaced segments go with them.
        for rel in segment_files(live)?.into_iter().chain(torn_files(live)?) {
            fs::rename(live.join(&rel), evidence.join(&rel)).map_err(io_err(&live.join(&rel)))?;
        }
        sync_dir(evidence)?;
        let staged_files = segment_files(staged)?;
        if staged_files.is_empty() {
            return if live.exists() {
                sync_dir(live)
            } else {
                Ok(())
            };
        }
        if !live.exists() {
            super::make_private_dir(live, None)?;
        }
        for rel in staged_files {
            fs::rename(staged.join(&rel), live.join(&rel)).map_err(io_err(&live.join(&rel)))?;
        }
        sync_dir(live)
    }
}
