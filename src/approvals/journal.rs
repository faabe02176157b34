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
    /// The sequence of the segment's first record after this one (absent in
    /// segments written before old segments could be removed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    first_seq: Option<u64>,
}

/// Where a journal whose oldest segments were removed begins: written (and
/// synced) before any segment is removed, so that a journal starting past
/// segment 1 is told from one that lost its first segments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Base {
    journal: String,
    /// The first segment kept.
    segment: u32,
    /// The hash the removed segments ended with, which that segment's first
    /// record names.
    previous: String,
    /// The sequence of that segment's first record.
    first_seq: u64,
}

/// The file naming where a journal whose oldest segments were removed
/// begins.
pub const BASE_FILE: &str = "journal.base";

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
    /// Records appended so far (also those of removed segments).
    pub records: u64,
    /// Segments kept and their bytes in all.
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

/// Where one kept segment starts, and its bytes once it is closed.
#[derive(Debug, Clone)]
struct SegmentStart {
    n: u32,
    first_seq: u64,
    previous: [u8; HASH_BYTES],
    bytes: u64,
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
    /// The segments kept, oldest first; the last is the one appended to.
    kept: Vec<SegmentStart>,
}

fn segment_name(n: u32) -> String {
    format!("journal-{n:06}.log")
}

/// The number of a segment file's name.
pub fn segment_number(name: &str) -> Option<u32> {
    name.strip_prefix("journal-")
        .and_then(|r| r.strip_suffix(".log"))
        .filter(|d| d.len() == 6 && d.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|d| d.parse::<u32>().ok())
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

fn unhex(text: &str) -> Option<[u8; HASH_BYTES]> {
    let mut out = [0u8; HASH_BYTES];
    if text.len() != HASH_BYTES * 2 {
        return None;
    }
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(i * 2..i * 2 + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The base file, when the journal's oldest segments were removed.
fn read_base(dir: &Path) -> Result<Option<Base>, JournalError> {
    let path = dir.join(BASE_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(&path, "reading the journal's base")(e)),
    };
    let base: Base = serde_json::from_slice(&bytes).map_err(|e| JournalError::Damaged {
        dir: dir.to_path_buf(),
        segment: BASE_FILE.into(),
        offset: 0,
        reason: format!("it is not a journal base record: {e}"),
    })?;
    if unhex(&base.previous).is_none() || base.segment < 2 || base.first_seq < 1 {
        return Err(JournalError::Damaged {
            dir: dir.to_path_buf(),
            segment: BASE_FILE.into(),
            offset: 0,
            reason: "its segment, hash or sequence is out of range".into(),
        });
    }
    Ok(Some(base))
}

/// Writes the base file whole (a temporary file synced, then renamed and
/// the directory synced).
fn write_base(dir: &Path, base: &Base) -> Result<(), JournalError> {
    use std::os::unix::fs::OpenOptionsExt;
    let value = serde_json::to_value(base).unwrap_or(Value::Null);
    let bytes = canonical(&value)?;
    let tmp = dir.join(format!("{BASE_FILE}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io(&tmp, "writing the journal's base"))?;
    f.write_all(&bytes)
        .and_then(|_| f.sync_all())
        .map_err(io(&tmp, "writing the journal's base"))?;
    std::fs::rename(&tmp, dir.join(BASE_FILE)).map_err(io(&tmp, "renaming the journal's base"))?;
    sync_dir(dir)
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

/// A journal's chain as read from its files, before anything is repaired.
struct Chain {
    identity: Option<String>,
    /// Segments below the base, left by a removal a crash interrupted.
    leftovers: Vec<u32>,
    kept: Vec<SegmentStart>,
    entries: Vec<Entry>,
    /// Records before the first one read (those of removed segments).
    base_seq: u64,
    /// Records read.
    read: u64,
    head: [u8; HASH_BYTES],
    /// The last segment: its number, valid length, file size, and whether
    /// its final frame was cut short.
    last: u32,
    tail_valid: u64,
    tail_size: u64,
    torn: bool,
}

/// Reads and verifies every segment kept (from the base, or from segment
/// 1), keeping the records when `keep` is set.
fn read_chain(dir: &Path, keep: bool) -> Result<Chain, JournalError> {
    let damaged = |segment: String, offset: u64, reason: String| JournalError::Damaged {
        dir: dir.to_path_buf(),
        segment,
        offset,
        reason,
    };
    let base = read_base(dir)?;
    let mut numbers = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io(dir, "listing the journal"))? {
        let entry = entry.map_err(io(dir, "listing the journal"))?;
        if let Some(n) = segment_number(&entry.file_name().to_string_lossy()) {
            numbers.push(n);
        }
    }
    numbers.sort_unstable();
    let first = base.as_ref().map_or(1, |b| b.segment);
    let leftovers: Vec<u32> = numbers.iter().copied().filter(|n| *n < first).collect();
    numbers.retain(|n| *n >= first);
    for (i, n) in numbers.iter().enumerate() {
        if *n != first + i as u32 {
            return Err(damaged(
                segment_name(first + i as u32),
                0,
                format!("missing: the segments do not run from {first} without a gap"),
            ));
        }
    }
    if base.is_some() && numbers.is_empty() {
        return Err(damaged(
            segment_name(first),
            0,
            format!("missing: {BASE_FILE} says the journal begins there"),
        ));
    }
    let mut chain = Chain {
        identity: base.as_ref().map(|b| b.journal.clone()),
        leftovers,
        kept: Vec::new(),
        entries: Vec::new(),
        base_seq: base.as_ref().map_or(0, |b| b.first_seq - 1),
        read: 0,
        head: base
            .as_ref()
            .and_then(|b| unhex(&b.previous))
            .unwrap_or(ZERO_HASH),
        last: numbers.last().copied().unwrap_or(0),
        tail_valid: 0,
        tail_size: 0,
        torn: false,
    };
    for n in numbers.iter().copied() {
        let path = dir.join(segment_name(n));
        let scanned = scan(&path, chain.head)
            .map_err(|(offset, reason)| damaged(segment_name(n), offset, reason))?;
        if scanned.torn && n != chain.last {
            return Err(damaged(
                segment_name(n),
                scanned.valid,
                "cut short, but it is not the last segment".into(),
            ));
        }
        let next_seq = chain.base_seq + chain.read + 1;
        let mut records = scanned.records.into_iter();
        let seg: Option<SegmentRecord> = records
            .next()
            .as_ref()
            .and_then(|v| serde_json::from_value(v.clone()).ok());
        match seg {
            Some(s)
                if s.kind == "segment"
                    && s.segment == n
                    && s.previous == hex(&chain.head)
                    && s.first_seq.is_none_or(|f| f == next_seq)
                    && chain.identity.as_ref().is_none_or(|id| *id == s.journal) =>
            {
                chain.identity.get_or_insert(s.journal);
            }
            None if n == chain.last && scanned.valid == 0 => {
                // The crash came after the segment was created and before
                // its first frame was whole (the file empty or cut short):
                // the segment never held anything.
            }
            _ => {
                return Err(damaged(
                    segment_name(n),
                    0,
                    "its first record is not this journal's segment record for this place".into(),
                ));
            }
        }
        if scanned.valid > 0 {
            chain.kept.push(SegmentStart {
                n,
                first_seq: next_seq,
                previous: chain.head,
                bytes: scanned.valid,
            });
        }
        for record in records {
            chain.read += 1;
            if keep {
                chain.entries.push(Entry {
                    seq: chain.base_seq + chain.read,
                    record,
                });
            }
        }
        chain.head = scanned.head;
        if n == chain.last {
            chain.tail_valid = scanned.valid;
            chain.torn = scanned.torn;
            chain.tail_size = std::fs::metadata(&path)
                .map_err(io(&path, "reading a segment's size"))?
                .len();
        }
    }
    Ok(chain)
}

impl Journal {
    /// Opens the journal in `dir` (a private directory that exists),
    /// creating its first segment when the directory holds none. Returns it
    /// with every record kept, in order.
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
        let mut chain = read_chain(dir, true)?;
        // A removal of old segments that a crash interrupted: the base
        // already says they are gone.
        for n in &chain.leftovers {
            let path = dir.join(segment_name(*n));
            std::fs::remove_file(&path).map_err(io(&path, "removing a segment below the base"))?;
        }
        if !chain.leftovers.is_empty() {
            sync_dir(dir)?;
        }
        let Some(identity) = chain.identity.take() else {
            // No segment, or the only one never got its first record: the
            // journal is new, or was being created when the process stopped.
            // It holds nothing.
            if chain.last > 0 {
                let path = dir.join(segment_name(chain.last));
                std::fs::remove_file(&path).map_err(io(&path, "removing an empty segment"))?;
            }
            let mut id = [0u8; 16];
            getrandom::fill(&mut id).map_err(|e| JournalError::Invalid {
                dir: dir.to_path_buf(),
                reason: format!("no random source for the journal's identity: {e}"),
            })?;
            let journal = Journal::start_segment(
                dir,
                hex(&id),
                max_segment_bytes,
                1,
                ZERO_HASH,
                0,
                Vec::new(),
            )?;
            return Ok((journal, Vec::new(), Opened::default()));
        };
        let records = chain.base_seq + chain.read;
        let mut opened = Opened::default();
        let path = dir.join(segment_name(chain.last));
        if chain.tail_valid == 0 {
            // The last segment's own first record was cut short: write it
            // again.
            std::fs::remove_file(&path).map_err(io(&path, "removing an empty segment"))?;
            let journal = Journal::start_segment(
                dir,
                identity,
                max_segment_bytes,
                chain.last,
                chain.head,
                records,
                chain.kept,
            )?;
            opened.truncated = chain.tail_size;
            return Ok((journal, chain.entries, opened));
        }
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io(&path, "opening the last segment"))?;
        if chain.torn {
            file.set_len(chain.tail_valid)
                .and_then(|_| file.sync_all())
                .map_err(io(&path, "truncating an unfinished final frame"))?;
            opened.truncated = chain.tail_size - chain.tail_valid;
        }
        file.seek(SeekFrom::End(0))
            .map_err(io(&path, "seeking the end of the last segment"))?;
        Ok((
            Journal {
                dir: dir.to_path_buf(),
                identity,
                max_segment_bytes,
                segment: chain.last,
                file,
                offset: chain.tail_valid,
                head: chain.head,
                records,
                kept: chain.kept,
            },
            chain.entries,
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
        mut kept: Vec<SegmentStart>,
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
            first_seq: Some(records + 1),
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
        kept.retain(|s| s.n != n);
        kept.push(SegmentStart {
            n,
            first_seq: records + 1,
            previous,
            bytes: bytes.len() as u64,
        });
        Ok(Journal {
            dir: dir.to_path_buf(),
            identity,
            max_segment_bytes,
            segment: n,
            file,
            offset: bytes.len() as u64,
            head,
            records,
            kept,
        })
    }

    /// Appends one record and syncs it before returning its sequence
    /// number. A segment that would grow past the configured size is closed
    /// first and the next one started.
    pub fn append(&mut self, record: &Value) -> Result<u64, JournalError> {
        let payload = canonical(record)?;
        let size = (LEN_BYTES + padded(payload.len()) + HASH_BYTES) as u64;
        if self.offset + size > self.max_segment_bytes {
            let mut kept = std::mem::take(&mut self.kept);
            if let Some(current) = kept.last_mut() {
                current.bytes = self.offset;
            }
            match Journal::start_segment(
                &self.dir,
                self.identity.clone(),
                self.max_segment_bytes,
                self.segment + 1,
                self.head,
                self.records,
                kept.clone(),
            ) {
                Ok(next) => *self = next,
                Err(e) => {
                    self.kept = kept;
                    return Err(e);
                }
            }
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

    /// Removes the closed segments all of whose records come before `seq`
    /// (records nobody needs any more): the base file is written first, so
    /// the journal is known to begin at the first segment kept. The
    /// segment appended to is never removed. Returns how many went.
    pub fn remove_before(&mut self, seq: u64) -> Result<usize, JournalError> {
        // The newest segment whose first record is at or before `seq`: every
        // segment before it holds only records before `seq`.
        let Some(keep_from) = self
            .kept
            .iter()
            .rposition(|s| s.first_seq <= seq)
            .filter(|i| *i > 0)
        else {
            return Ok(0);
        };
        let first = &self.kept[keep_from];
        write_base(
            &self.dir,
            &Base {
                journal: self.identity.clone(),
                segment: first.n,
                previous: hex(&first.previous),
                first_seq: first.first_seq,
            },
        )?;
        for s in &self.kept[..keep_from] {
            let path = self.dir.join(segment_name(s.n));
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(&path, "removing an old segment")(e)),
            }
        }
        sync_dir(&self.dir)?;
        self.kept.drain(..keep_from);
        Ok(keep_from)
    }

    /// The sequence of the first record of the oldest segment kept (1 when
    /// none was removed).
    pub fn first_seq(&self) -> u64 {
        self.kept.first().map_or(1, |s| s.first_seq)
    }

    pub fn checkpoint(&self) -> Checkpoint {
        let closed: u64 = self
            .kept
            .iter()
            .filter(|s| s.n != self.segment)
            .map(|s| s.bytes)
            .sum();
        Checkpoint {
            journal: self.identity.clone(),
            records: self.records,
            segments: self.kept.len() as u32,
            bytes: closed + self.offset,
            head: hex(&self.head),
        }
    }

    /// Verifies a journal without changing it (a cut final frame is
    /// reported, not removed): its checkpoint.
    pub fn verify(dir: &Path) -> Result<(Checkpoint, Opened), JournalError> {
        let chain = read_chain(dir, false)?;
        let opened = Opened {
            truncated: chain.tail_size - chain.tail_valid,
        };
        Ok((
            Checkpoint {
                journal: chain.identity.unwrap_or_default(),
                records: chain.base_seq + chain.read,
                segments: chain.kept.len() as u32,
                bytes: chain.kept.iter().map(|s| s.bytes).sum(),
                head: hex(&chain.head),
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
    fn old_segments_go_behind_a_base_and_the_journal_still_verifies() {
        let d = dir();
        let (mut j, _, _) = Journal::open(d.path(), SEGMENT).unwrap();
        fill(&mut j, 1, 1501);
        let all = j.checkpoint();
        assert!(all.segments >= 4, "{all:?}");
        // Nothing before the first record: nothing goes.
        assert_eq!(j.remove_before(1).unwrap(), 0);
        let third = j.kept[2].first_seq;
        let second_bytes = std::fs::read(seg(d.path(), 2)).unwrap();
        // Records of segments 1 and 2 are no longer needed; the third's
        // first one is.
        assert_eq!(j.remove_before(third).unwrap(), 2);
        assert!(!seg(d.path(), 1).exists() && !seg(d.path(), 2).exists());
        let after = j.checkpoint();
        assert_eq!(
            (after.records, &after.head, after.segments),
            (all.records, &all.head, all.segments - 2)
        );
        assert!(after.bytes < all.bytes);
        assert_eq!(Journal::verify(d.path()).unwrap().0, after);
        drop(j);
        // Reopened: the records kept, with their sequence numbers, and
        // appends go on from the same sequence.
        let (mut j, entries, _) = Journal::open(d.path(), SEGMENT).unwrap();
        assert_eq!(entries.first().map(|e| e.seq), Some(third));
        assert_eq!(entries.len() as u64, 1500 - third + 1);
        assert!(entries.iter().all(|e| e.record["n"] == e.seq));
        assert_eq!(j.checkpoint(), after);
        assert_eq!(j.append(&record(1501)).unwrap(), 1501);
        // The segment appended to always stays.
        let current = j.checkpoint().segments;
        j.remove_before(u64::MAX).unwrap();
        assert_eq!(j.checkpoint().segments, 1, "of {current}");
        let kept = j.checkpoint();
        drop(j);
        assert_eq!(
            Journal::open(d.path(), SEGMENT).unwrap().0.checkpoint(),
            kept
        );

        // A removal a crash interrupted (the base written, an old segment
        // still there): verify passes it over, opening finishes it.
        let d = dir();
        let (mut j, _, _) = Journal::open(d.path(), SEGMENT).unwrap();
        fill(&mut j, 1, 1501);
        let third = j.kept[2].first_seq;
        j.remove_before(third).unwrap();
        let good = j.checkpoint();
        drop(j);
        std::fs::write(seg(d.path(), 2), &second_bytes).unwrap();
        assert_eq!(Journal::verify(d.path()).unwrap().0, good);
        assert!(seg(d.path(), 2).exists(), "verify changed the directory");
        assert_eq!(
            Journal::open(d.path(), SEGMENT).unwrap().0.checkpoint(),
            good
        );
        assert!(!seg(d.path(), 2).exists());

        // Without its base the journal lost its first segments: refused.
        let base = std::fs::read(d.path().join(BASE_FILE)).unwrap();
        std::fs::remove_file(d.path().join(BASE_FILE)).unwrap();
        assert!(damaged(d.path()).2.contains("missing"));
        // A base naming another place in the chain: refused at that segment.
        let mut wrong: Value = serde_json::from_slice(&base).unwrap();
        wrong["previous"] = Value::String("ab".repeat(32));
        std::fs::write(
            d.path().join(BASE_FILE),
            serde_json::to_vec(&wrong).unwrap(),
        )
        .unwrap();
        assert_eq!(damaged(d.path()).0, "journal-000003.log");
        // A base that is not one: refused, naming it.
        std::fs::write(d.path().join(BASE_FILE), b"{}").unwrap();
        assert_eq!(damaged(d.path()).0, BASE_FILE);
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
