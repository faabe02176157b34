//! The approval journal as the daemon opens it. Its file format (framing,
//! the hash chain, torn tails told from damage, the base, verification)
//! is the `taskgate-journal` crate, which knows nothing of tasks; this
//! module re-exports it and adds what only the daemon knows: its test
//! hook for failing syncs ([`crate::testhooks::JOURNAL_SYNC_FAULT_FILE_ENV`]).

use std::path::Path;

pub use taskgate_journal::{
    BASE_FILE, Checkpoint, Entry, FORMAT_MAGIC, Journal, JournalError, MAX_RECORD_BYTES,
    MAX_SEGMENTS, MIN_SEGMENT_BYTES, Opened, SyncFaults, SyncPoint, is_torn_evidence,
    segment_number,
};

/// Opens the journal in `dir` as [`Journal::open`] does, with the syncs the
/// test hook names made to fail (never in a shipped build, where
/// [`crate::testhooks::journal_sync_fault_file`] is always `None`).
pub fn open(
    dir: &Path,
    max_segment_bytes: u64,
) -> Result<(Journal, Vec<Entry>, Opened), JournalError> {
    let faults = SyncFaults::from_file(crate::testhooks::journal_sync_fault_file());
    Journal::open_with_faults(dir, max_segment_bytes, faults)
}
