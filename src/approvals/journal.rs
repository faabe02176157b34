//! The approval journal: the authoritative, append-only record of every
//! approval decision, kept in its own private directory (never the task
//! store's).
//!
//! A journal is a sequence of segment files `journal-NNNNNN.log`. Each
//! frame is an 8-byte little-endian payload length, the payload (one
//! record as canonical JSON, RFC 8785), zero padding to a multiple of 8
//! bytes, and the SHA-256 of the previous frame's hash, the length and the
//! payload: every frame vouches for all before it. The first frame of each
//! segment is a segment record naming the journal's identity, the segment's
//! number and the hash the previous segment ended with, so a segment that
//! is missing, reordered or taken from another journal breaks the chain.
//!
//! An append is written and synced (the file, and the directory when it
//! starts a segment) before it returns: nothing is acknowledged that a
//! crash could take back. At opening the chain is verified from the first
//! segment: a final frame cut short (a crash in the middle of an append,
//! never acknowledged) is truncated away; any other mismatch refuses the
//! journal, naming the segment and the offset, and leaves every file as it
//! is for investigation. The hashes are integrity checks, not signatures:
//! whoever can rewrite the files can also compute the hashes again.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest as _, Sha256};
use thiserror::Error;

/// The longest record a frame may hold.
pub const MAX_RECORD_BYTES: usize = 64 * 1024;
/// The smallest segment size a journal may be configured with.
pub const MIN_SEGMENT_BYTES: u64 = 64 * 1024;
/// Segments one journal may hold (the name has six digits).
pub const MAX_SEGMENTS: u32 = 999_999;
const HASH_BYTES: usize = 32;
const LEN_BYTES: usize = 8;
const ZERO_HASH: [u8; HASH_BYTES] = [0; HASH_BYTES];

#[derive(Debug, Error)]
pub enum JournalError {
    /// The chain does not hold: approvals stay off until an operator has
    /// looked. Nothing was changed.
    #[error(
        "approval journal {dir}: segment {segment} is damaged at byte {offset}: {reason}; approvals are disabled; keep the directory as evidence and restore the journal from a backup"
    )]
    Damaged {
        dir: PathBuf,
        segment: String,
        offset: u64,
        reason: String,
    },
    #[error("approval journal {path}: {during}: {source}")]
    Io {
        path: PathBuf,
        during: &'static str,
        source: std::io::Error,
    },
    #[error("an approval record of {size} bytes exceeds the {MAX_RECORD_BYTES}-byte frame limit")]
    RecordTooLarge { size: usize },
    #[error("approval journal {dir}: {reason}")]
    Invalid { dir: PathBuf, reason: String },
}

fn io(path: &Path, during: &'static str) -> impl FnOnce(std::io::Error) -> JournalError {
    let path = path.to_path_buf();
    move |source| JournalError::Io {
        path,
        during,
        source,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The first record of every segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SegmentRecord {
    kind: String,
    journal: String,
    segment: u32,
    previous: String,
}

/// One record read back: its sequence number (from 1, segment records not
/// counted) and its JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub seq: u64,
    pub record: Value,
}

/// What an operator compares between two copies of a journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Checkpoint {
    /// The journal's identity (random, made when it was created).
    pub journal: String,
    /// Records appended so far.
    pub records: u64,
    /// Segments and their bytes in all.
    pub segments: u32,
    pub bytes: u64,
    /// The hash the last frame ends with.
    pub head: String,
}

/// What opening found beside the records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Opened {
    /// Bytes of an unfinished final frame that were cut away.
    pub truncated: u64,
}

/// An open journal: where the next frame goes and what it chains to.
#[derive(Debug)]
pub struct Journal {
    dir: PathBuf,
    identity: String,
    max_segment_bytes: u64,
    segment: u32,
    file: File,
    offset: u64,
    head: [u8; HASH_BYTES],
    records: u64,
    /// Bytes of the segments before the current one.
    earlier_bytes: u64,
}

fn segment_name(n: u32) -> String {
    format!("journal-{n:06}.log")
}

fn frame_hash(previous: &[u8; HASH_BYTES], payload: &[u8]) -> [u8; HASH_BYTES] {
    let mut h = Sha256::new();
    h.update(previous);
    h.update((payload.len() as u64).to_le_bytes());
    h.update(payload);
    h.finalize().into()
}

fn padded(len: usize) -> usize {
    len.div_ceil(8) * 8
}

/// The bytes of one frame.
fn frame(previous: &[u8; HASH_BYTES], payload: &[u8]) -> (Vec<u8>, [u8; HASH_BYTES]) {
    let hash = frame_hash(previous, payload);
    let mut out = Vec::with_capacity(LEN_BYTES + padded(payload.len()) + HASH_BYTES);
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(payload);
    out.resize(LEN_BYTES + padded(payload.len()), 0);
    out.extend_from_slice(&hash);
    (out, hash)
}

fn canonical(record: &Value) -> Result<Vec<u8>, JournalError> {
    let bytes = serde_jcs::to_vec(record).map_err(|e| JournalError::Invalid {
        dir: PathBuf::new(),
        reason: format!("a record is not canonical JSON: {e}"),
    })?;
    if bytes.len() > MAX_RECORD_BYTES {
        return Err(JournalError::RecordTooLarge { size: bytes.len() });
    }
    Ok(bytes)
}

fn sync_dir(dir: &Path) -> Result<(), JournalError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir, "syncing the directory"))
}

/// The segment numbers present, in order, checked to run from 1 without a
/// gap.
fn segments(dir: &Path) -> Result<Vec<u32>, JournalError> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io(dir, "listing the journal"))? {
        let entry = entry.map_err(io(dir, "listing the journal"))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(n) = name
            .strip_prefix("journal-")
            .and_then(|r| r.strip_suffix(".log"))
            .filter(|d| d.len() == 6 && d.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|d| d.parse::<u32>().ok())
        {
            found.push(n);
        }
    }
    found.sort_unstable();
    for (i, n) in found.iter().enumerate() {
        if *n != i as u32 + 1 {
            return Err(JournalError::Damaged {
                dir: dir.to_path_buf(),
                segment: segment_name(i as u32 + 1),
                offset: 0,
                reason: "missing: the segments do not run from 1 without a gap".into(),
            });
        }
    }
    Ok(found)
}

/// Reads one segment's frames, checking the chain from `previous`. Returns
/// the records, the hash it ends with, its valid length, and whether its
/// final frame was cut short.
struct Scanned {
    records: Vec<Value>,
    head: [u8; HASH_BYTES],
    valid: u64,
    torn: bool,
}

fn scan(path: &Path, previous: [u8; HASH_BYTES]) -> Result<Scanned, (u64, String)> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|e| (0, format!("unreadable: {e}")))?;
    let mut at = 0usize;
    let mut head = previous;
    let mut records = Vec::new();
    while at < bytes.len() {
        let rest = bytes.len() - at;
        if rest < LEN_BYTES {
            return Ok(Scanned {
                records,
                head,
                valid: at as u64,
                torn: true,
            });
        }
        let len = u64::from_le_bytes(bytes[at..at + LEN_BYTES].try_into().unwrap_or([0; 8]));
        if len as usize > MAX_RECORD_BYTES {
            return Err((at as u64, format!("a frame claims {len} bytes")));
        }
        let len = len as usize;
        let body = LEN_BYTES + padded(len);
        if rest < body + HASH_BYTES {
            return Ok(Scanned {
                records,
                head,
                valid: at as u64,
                torn: true,
            });
        }
        let payload = &bytes[at + LEN_BYTES..at + LEN_BYTES + len];
        if bytes[at + LEN_BYTES + len..at + body]
            .iter()
            .any(|b| *b != 0)
        {
            return Err((at as u64, "padding is not zero".into()));
        }
        let stored: [u8; HASH_BYTES] = bytes[at + body..at + body + HASH_BYTES]
            .try_into()
            .unwrap_or(ZERO_HASH);
        let expected = frame_hash(&head, payload);
        if stored != expected {
            return Err((
                at as u64,
                "its hash does not follow from the frames before it (altered, reordered or from another journal)".into(),
            ));
        }
        let record: Value = serde_json::from_slice(payload)
            .map_err(|e| (at as u64, format!("its record is not JSON: {e}")))?;
        records.push(record);
        head = stored;
        at += body + HASH_BYTES;
    }
    Ok(Scanned {
        records,
        head,
        valid: at as u64,
        torn: false,
    })
}

impl Journal {
    /// Opens the journal in `dir` (a private directory that exists),
    /// creating its first segment when the directory holds none. Returns it
    /// with every record, in order.
    pub fn open(
        dir: &Path,
        max_segment_bytes: u64,
    ) -> Result<(Journal, Vec<Entry>, Opened), JournalError> {
        if max_segment_bytes < MIN_SEGMENT_BYTES {
            return Err(JournalError::Invalid {
                dir: dir.to_path_buf(),
                reason: format!("segments must be at least {MIN_SEGMENT_BYTES} bytes"),
            });
        }
        let numbers = segments(dir)?;
        if numbers.is_empty() {
            let mut id = [0u8; 16];
            getrandom::fill(&mut id).map_err(|e| JournalError::Invalid {
                dir: dir.to_path_buf(),
                reason: format!("no random source for the journal's identity: {e}"),
            })?;
            let journal =
                Journal::start_segment(dir, hex(&id), max_segment_bytes, 1, ZERO_HASH, 0, 0)?;
            return Ok((journal, Vec::new(), Opened::default()));
        }
        let damaged = |n: u32, offset: u64, reason: String| JournalError::Damaged {
            dir: dir.to_path_buf(),
            segment: segment_name(n),
            offset,
            reason,
        };
        let mut head = ZERO_HASH;
        let mut identity: Option<String> = None;
        let mut entries = Vec::new();
        let mut earlier_bytes = 0u64;
        let mut opened = Opened::default();
        let last = *numbers.last().unwrap_or(&1);
        let mut tail = (0u64, false);
        for n in numbers.iter().copied() {
            let path = dir.join(segment_name(n));
            let scanned =
                scan(&path, head).map_err(|(offset, reason)| damaged(n, offset, reason))?;
            if scanned.torn && n != last {
                return Err(damaged(
                    n,
                    scanned.valid,
                    "cut short, but it is not the last segment".into(),
                ));
            }
            let mut records = scanned.records.into_iter();
            let first = records.next();
            let seg: Option<SegmentRecord> = first
                .as_ref()
                .and_then(|v| serde_json::from_value(v.clone()).ok());
            match seg {
                Some(s)
                    if s.kind == "segment"
                        && s.segment == n
                        && s.previous == hex(&head)
                        && identity.as_ref().is_none_or(|id| *id == s.journal) =>
                {
                    identity.get_or_insert(s.journal);
                }
                None if n == last && scanned.valid == 0 => {
                    // The crash came after the segment was created and
                    // before its first frame was whole (the file empty or
                    // cut short): the segment never held anything.
                }
                _ => {
                    return Err(damaged(
                        n,
                        0,
                        "its first record is not this journal's segment record for this place"
                            .into(),
                    ));
                }
            }
            for record in records {
                entries.push(Entry {
                    seq: entries.len() as u64 + 1,
                    record,
                });
            }
            head = scanned.head;
            if n == last {
                tail = (scanned.valid, scanned.torn);
            } else {
                earlier_bytes += scanned.valid;
            }
        }
        let Some(identity) = identity else {
            // The only segment never got its first record: the journal was
            // being created when the process stopped. It holds nothing.
            let path = dir.join(segment_name(1));
            std::fs::remove_file(&path).map_err(io(&path, "removing an empty segment"))?;
            return Journal::open(dir, max_segment_bytes);
        };
        let path = dir.join(segment_name(last));
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io(&path, "opening the last segment"))?;
        let (valid, torn) = tail;
        if torn {
            let size = file
                .metadata()
                .map_err(io(&path, "reading the last segment's size"))?
                .len();
            file.set_len(valid)
                .and_then(|_| file.sync_all())
                .map_err(io(&path, "truncating an unfinished final frame"))?;
            opened.truncated = size - valid;
        }
        if valid == 0 {
            // Its segment record itself was cut short: write it again.
            drop(file);
            std::fs::remove_file(&path).map_err(io(&path, "removing an empty segment"))?;
            let journal = Journal::start_segment(
                dir,
                identity,
                max_segment_bytes,
                last,
                head,
                entries.len() as u64,
                earlier_bytes,
            )?;
            return Ok((journal, entries, opened));
        }
        file.seek(SeekFrom::End(0))
            .map_err(io(&path, "seeking the end of the last segment"))?;
        let records = entries.len() as u64;
        Ok((
            Journal {
                dir: dir.to_path_buf(),
                identity,
                max_segment_bytes,
                segment: last,
                file,
                offset: valid,
                head,
                records,
                earlier_bytes,
            },
            entries,
            opened,
        ))
    }

    /// Creates segment `n`, chained to `previous`, and syncs it and the
    /// directory.
    fn start_segment(
        dir: &Path,
        identity: String,
        max_segment_bytes: u64,
        n: u32,
        previous: [u8; HASH_BYTES],
        records: u64,
        earlier_bytes: u64,
    ) -> Result<Journal, JournalError> {
        if n > MAX_SEGMENTS {
            return Err(JournalError::Invalid {
                dir: dir.to_path_buf(),
                reason: format!("the journal holds {MAX_SEGMENTS} segments; start a new one"),
            });
        }
        let path = dir.join(segment_name(n));
        let record = serde_json::to_value(SegmentRecord {
            kind: "segment".into(),
            journal: identity.clone(),
            segment: n,
            previous: hex(&previous),
        })
        .unwrap_or(Value::Null);
        let (bytes, head) = frame(&previous, &canonical(&record)?);
        let mut file = {
            use std::os::unix::fs::OpenOptionsExt;
            OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(io(&path, "creating a segment"))?
        };
        file.write_all(&bytes)
            .and_then(|_| file.sync_all())
            .map_err(io(&path, "writing a segment's first record"))?;
        sync_dir(dir)?;
        Ok(Journal {
            dir: dir.to_path_buf(),
            identity,
            max_segment_bytes,
            segment: n,
            file,
            offset: bytes.len() as u64,
            head,
            records,
            earlier_bytes,
        })
    }

    /// Appends one record and syncs it before returning its sequence
    /// number. A segment that would grow past the configured size is closed
    /// first and the next one started.
    pub fn append(&mut self, record: &Value) -> Result<u64, JournalError> {
        let payload = canonical(record)?;
        let size = (LEN_BYTES + padded(payload.len()) + HASH_BYTES) as u64;
        if self.offset + size > self.max_segment_bytes {
            let next = Journal::start_segment(
                &self.dir,
                self.identity.clone(),
                self.max_segment_bytes,
                self.segment + 1,
                self.head,
                self.records,
                self.earlier_bytes + self.offset,
            )?;
            *self = next;
        }
        let (bytes, head) = frame(&self.head, &payload);
        let path = self.dir.join(segment_name(self.segment));
        let written = self
            .file
            .write_all(&bytes)
            .and_then(|_| self.file.sync_data());
        if let Err(source) = written {
            // What reached the disk is unknown: cut back to the last
            // acknowledged frame, or refuse everything from now on.
            let _ = self.file.set_len(self.offset);
            let _ = self.file.seek(SeekFrom::Start(self.offset));
            return Err(JournalError::Io {
                path,
                during: "appending a record",
                source,
            });
        }
        self.offset += bytes.len() as u64;
        self.head = head;
        self.records += 1;
        Ok(self.records)
    }

    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            journal: self.identity.clone(),
            records: self.records,
            segments: self.segment,
            bytes: self.earlier_bytes + self.offset,
            head: hex(&self.head),
        }
    }

    /// Verifies a journal without changing it (a cut final frame is
    /// reported, not removed): its checkpoint.
    pub fn verify(dir: &Path) -> Result<(Checkpoint, Opened), JournalError> {
        let numbers = segments(dir)?;
        let mut head = ZERO_HASH;
        let mut identity = None;
        let mut records = 0u64;
        let mut bytes = 0u64;
        let mut opened = Opened::default();
        let last = numbers.last().copied().unwrap_or(0);
        for n in numbers.iter().copied() {
            let path = dir.join(segment_name(n));
            let scanned = scan(&path, head).map_err(|(offset, reason)| JournalError::Damaged {
                dir: dir.to_path_buf(),
                segment: segment_name(n),
                offset,
                reason,
            })?;
            if scanned.torn {
                if n != last {
                    return Err(JournalError::Damaged {
                        dir: dir.to_path_buf(),
                        segment: segment_name(n),
                        offset: scanned.valid,
                        reason: "cut short, but it is not the last segment".into(),
                    });
                }
                let size = std::fs::metadata(&path)
                    .map_err(io(&path, "reading a segment's size"))?
                    .len();
                opened.truncated = size - scanned.valid;
            }
            let first: Option<SegmentRecord> = scanned
                .records
                .first()
                .and_then(|v| serde_json::from_value(v.clone()).ok());
            match first {
                Some(s)
                    if s.kind == "segment"
                        && s.segment == n
                        && s.previous == hex(&head)
                        && identity.as_ref().is_none_or(|id: &String| *id == s.journal) =>
                {
                    identity.get_or_insert(s.journal);
                }
                None if scanned.records.is_empty() && n == last => {}
                _ => {
                    return Err(JournalError::Damaged {
                        dir: dir.to_path_buf(),
                        segment: segment_name(n),
                        offset: 0,
                        reason:
                            "its first record is not this journal's segment record for this place"
                                .into(),
                    });
                }
            }
            records += scanned.records.len().saturating_sub(1) as u64;
            bytes += scanned.valid;
            head = scanned.head;
        }
        Ok((
            Checkpoint {
                journal: identity.unwrap_or_default(),
                records,
                segments: last,
                bytes,
                head: hex(&head),
            },
            opened,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SEGMENT: u64 = MIN_SEGMENT_BYTES;

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    fn record(i: u64) -> Value {
        json!({"kind": "test", "n": i, "text": "x".repeat(100)})
    }

    fn fill(j: &mut Journal, from: u64, to: u64) {
        for i in from..to {
            assert_eq!(j.append(&record(i)).unwrap(), i);
        }
    }

    fn seg(d: &Path, n: u32) -> PathBuf {
        d.join(segment_name(n))
    }

    #[test]
    fn records_come_back_in_order_across_segments_after_a_reopen() {
        let d = dir();
        let (mut j, entries, _) = Journal::open(d.path(), SEGMENT).unwrap();
        assert!(entries.is_empty());
        // ~1,500 records of ~150 bytes: several 64 KiB segments.
        fill(&mut j, 1, 1501);
        let before = j.checkpoint();
        assert!(before.segments >= 3, "{before:?}");
        drop(j);
        let (mut j, entries, opened) = Journal::open(d.path(), SEGMENT).unwrap();
        assert_eq!(opened, Opened::default());
        assert_eq!(entries.len(), 1500);
        assert!(
            entries
                .iter()
                .enumerate()
                .all(|(i, e)| e.seq == i as u64 + 1 && e.record["n"] == i as u64 + 1)
        );
        assert_eq!(j.checkpoint(), before);
        assert_eq!(Journal::verify(d.path()).unwrap().0, before);
        // Appends go on from where it was.
        assert_eq!(j.append(&record(1501)).unwrap(), 1501);
        assert_ne!(j.checkpoint().head, before.head);
        // Every segment is private.
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(seg(d.path(), 1))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn an_unfinished_final_frame_is_cut_away_and_appends_go_on() {
        let d = dir();
        let (mut j, _, _) = Journal::open(d.path(), SEGMENT).unwrap();
        fill(&mut j, 1, 11);
        let good = j.checkpoint();
        drop(j);
        let path = seg(d.path(), 1);
        let len = std::fs::metadata(&path).unwrap().len();
        // Half a frame, as a crash in the middle of an append leaves it.
        let (bytes, _) = frame(&ZERO_HASH, &canonical(&record(11)).unwrap());
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&bytes[..bytes.len() / 2]).unwrap();
        drop(f);
        let (check, found) = Journal::verify(d.path()).unwrap();
        assert_eq!(
            (check, found.truncated),
            (good.clone(), (bytes.len() / 2) as u64)
        );
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            len + (bytes.len() / 2) as u64,
            "verify changed the file"
        );
        let (mut j, entries, opened) = Journal::open(d.path(), SEGMENT).unwrap();
        assert_eq!(entries.len(), 10);
        assert_eq!(opened.truncated, (bytes.len() / 2) as u64);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), len);
        assert_eq!(j.append(&record(11)).unwrap(), 11);
        drop(j);
        assert_eq!(Journal::open(d.path(), SEGMENT).unwrap().1.len(), 11);
    }

    fn damaged(d: &Path) -> (String, u64, String) {
        match Journal::open(d, SEGMENT) {
            Err(JournalError::Damaged {
                segment,
                offset,
                reason,
                ..
            }) => (segment, offset, reason),
            other => panic!("not refused as damaged: {other:?}"),
        }
    }

    #[test]
    fn a_changed_byte_anywhere_refuses_the_journal_and_changes_nothing() {
        let d = dir();
        let (mut j, _, _) = Journal::open(d.path(), SEGMENT).unwrap();
        fill(&mut j, 1, 21);
        drop(j);
        let path = seg(d.path(), 1);
        let mut bytes = std::fs::read(&path).unwrap();
        // A byte inside the fifth record's text.
        let at = bytes.windows(7).position(|w| w == b"\"n\":5,\"").unwrap() + 7;
        bytes[at + 3] ^= 0x01;
        std::fs::write(&path, &bytes).unwrap();
        let (segment, offset, reason) = damaged(d.path());
        assert_eq!(segment, "journal-000001.log");
        assert!(offset > 0 && (offset as usize) < at, "{offset}");
        assert!(reason.contains("hash"), "{reason}");
        assert_eq!(
            std::fs::read(&path).unwrap(),
            bytes,
            "the evidence was changed"
        );
        assert!(matches!(
            Journal::verify(d.path()),
            Err(JournalError::Damaged { .. })
        ));
    }

    #[test]
    fn a_missing_reordered_or_foreign_segment_refuses_the_journal() {
        let make = || {
            let d = dir();
            let (mut j, _, _) = Journal::open(d.path(), SEGMENT).unwrap();
            fill(&mut j, 1, 1200);
            assert!(j.checkpoint().segments >= 3);
            d
        };
        // The middle segment removed.
        let d = make();
        std::fs::remove_file(seg(d.path(), 2)).unwrap();
        assert!(damaged(d.path()).2.contains("missing"));
        // Two segments swapped.
        let d = make();
        std::fs::rename(seg(d.path(), 2), d.path().join("x")).unwrap();
        std::fs::rename(seg(d.path(), 3), seg(d.path(), 2)).unwrap();
        std::fs::rename(d.path().join("x"), seg(d.path(), 3)).unwrap();
        assert_eq!(damaged(d.path()).0, "journal-000002.log");
        // The second segment of another journal put in its place.
        let d = make();
        let other = make();
        std::fs::copy(seg(other.path(), 2), seg(d.path(), 2)).unwrap();
        assert_eq!(damaged(d.path()).0, "journal-000002.log");
        // The last segment cut back to the end of a frame: a shorter journal
        // still chains, which only a projection that remembers its sequence
        // can tell; but a cut inside an earlier segment is damage.
        let d = make();
        let path = seg(d.path(), 1);
        let len = std::fs::metadata(&path).unwrap().len();
        OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(len - 10)
            .unwrap();
        assert!(damaged(d.path()).2.contains("not the last segment"));
    }

    #[test]
    fn records_past_the_frame_limit_are_refused_and_the_bounds_hold() {
        let d = dir();
        let (mut j, _, _) = Journal::open(d.path(), SEGMENT).unwrap();
        let big = json!({"kind": "test", "text": "x".repeat(MAX_RECORD_BYTES)});
        assert!(matches!(
            j.append(&big),
            Err(JournalError::RecordTooLarge { .. })
        ));
        let at_limit = json!({"k": "x".repeat(MAX_RECORD_BYTES - 8)});
        assert_eq!(canonical(&at_limit).unwrap().len(), MAX_RECORD_BYTES);
        assert_eq!(j.append(&at_limit).unwrap(), 1);
        // A record larger than what is left in a segment starts the next.
        assert_eq!(j.checkpoint().segments, 2);
        drop(j);
        assert_eq!(Journal::open(d.path(), SEGMENT).unwrap().1.len(), 1);
        assert!(matches!(
            Journal::open(d.path(), MIN_SEGMENT_BYTES - 1),
            Err(JournalError::Invalid { .. })
        ));
    }

    #[test]
    fn a_journal_whose_first_record_was_never_written_starts_afresh() {
        let d = dir();
        std::fs::write(seg(d.path(), 1), [7u8, 0, 0]).unwrap();
        let (j, entries, _) = Journal::open(d.path(), SEGMENT).unwrap();
        assert!(entries.is_empty());
        assert_eq!(j.checkpoint().records, 0);
    }

    #[test]
    fn a_segment_created_but_never_written_is_started_again() {
        // A crash between creating the next segment and writing its first
        // record leaves the file empty or cut short; nothing in it was ever
        // acknowledged, so the journal opens with every earlier record.
        for cut in [0usize, 5, 20] {
            let d = dir();
            let (mut j, _, _) = Journal::open(d.path(), SEGMENT).unwrap();
            fill(&mut j, 1, 401);
            let good = j.checkpoint();
            assert!(good.segments >= 1, "{good:?}");
            let next = good.segments + 1;
            drop(j);
            let (bytes, _) = frame(&ZERO_HASH, b"{}");
            std::fs::write(seg(d.path(), next), &bytes[..cut.min(bytes.len() - 1)]).unwrap();
            let (check, _) = Journal::verify(d.path()).unwrap();
            assert_eq!(check.records, good.records, "cut {cut}");
            let (mut j, entries, _) = Journal::open(d.path(), SEGMENT).unwrap();
            assert_eq!(entries.len(), 400, "cut {cut}");
            assert_eq!(j.append(&record(401)).unwrap(), 401);
            drop(j);
            let (_, entries, _) = Journal::open(d.path(), SEGMENT).unwrap();
            assert_eq!(entries.len(), 401, "cut {cut}");
        }
    }

    #[test]
    fn events_round_trip_and_bound_the_reason() {
        use crate::approvals::Event;
        let e = Event::Rejected {
            proposal: "p".into(),
            decider: "admin".into(),
            at_ms: 1,
            reason: "no".into(),
        };
        let r = e.to_record().unwrap();
        assert_eq!(r["kind"], "rejected");
        assert_eq!(Event::from_record(&r).unwrap(), e);
        let long = Event::Rejected {
            proposal: "p".into(),
            decider: "admin".into(),
            at_ms: 1,
            reason: "x".repeat(crate::approvals::MAX_REASON_BYTES + 1),
        };
        assert!(long.to_record().is_err());
    }
}
