//! The approval journal: the authoritative, append-only record of every
//! approval decision, kept in its own private directory (never the task
//! store's).
//!
//! It is a crate of its own so that the compiler holds the rule that the
//! journal knows nothing of tasks, tools, the store or the protocol: a
//! record is any JSON value (taskgate's approval events are written and
//! read by `taskgate::approvals`), and what an error means to an operator
//! (an exit class, a wire code) is decided there too. This crate depends on
//! no taskgate crate.
//!
//! A journal is a sequence of segment files `journal-NNNNNN.log`. A segment
//! starts with the 8 bytes [`FORMAT_MAGIC`]; then come frames: an 8-byte
//! little-endian payload length, 8 bytes checking that length (the start of
//! a SHA-256 over it), the payload (one record as canonical JSON, RFC
//! 8785), zero padding to a multiple of 8 bytes, and the SHA-256 of the
//! previous frame's hash, the length and the payload: every frame vouches
//! for all before it. The first frame of each segment is a segment record
//! naming the journal's identity, the segment's number, the hash the
//! previous segment ended with and the format, so a segment that is
//! missing, reordered or taken from another journal breaks the chain.
//!
//! An append is written and synced (the file, and the directory when it
//! starts a segment) before it returns: nothing is acknowledged that a
//! crash could take back. At opening the chain is verified from the first
//! segment. The only thing taken for a crash in the middle of an append
//! (never acknowledged) is a prefix of one frame at the very end of the
//! last segment: fewer bytes than a frame header, or a header whose length
//! passes its own check and runs past the end of the file. Such a torn tail
//! is copied aside (`journal-NNNNNN-at-OFFSET.torn`, synced) before it is
//! cut off. Anything else (a changed byte anywhere, a length that fails its
//! check, a missing, reordered or foreign segment, a cut inside an earlier
//! segment) refuses the journal, naming the segment and the offset, and
//! leaves every file as it is for investigation.
//!
//! Segments written before lengths were checked (format 1: no magic, no
//! length check) are still read, but a frame of theirs running past the end
//! of the file cannot be told from an altered length and is refused as
//! damage; a journal whose last segment is of format 1 goes on in a new
//! segment. The hashes are integrity checks, not signatures: whoever can
//! rewrite the files can also compute the hashes again.

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
/// The length's own check, after the length.
const CHECK_BYTES: usize = 8;
/// A frame's header in the current format: the length and its check.
const HEADER_BYTES: usize = LEN_BYTES + CHECK_BYTES;
/// The first bytes of every segment in the current format (2). A segment
/// of format 1 starts with a frame length of at most 64 KiB, whose high
/// bytes are zero; these are not, whichever one byte of them is changed.
pub const FORMAT_MAGIC: [u8; 8] = *b"TGJRNL02";
/// The format segments are written in.
const FORMAT: u32 = 2;
/// Evidence files of torn tails that may share one segment and offset
/// (each a crash at that very place) before opening refuses to add more.
const MAX_TORN_COPIES: u32 = 100;
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
    /// The segment's frame format (absent in format 1), so that the chain
    /// vouches for the magic the segment starts with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    format: Option<u32>,
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
    /// Bytes of an unfinished final frame that were cut away (by
    /// [`Journal::verify`]: that a start would cut away).
    pub truncated: u64,
    /// The file in the journal's directory those bytes were copied to
    /// before they were cut (by [`Journal::verify`]: the segment and offset
    /// they are at).
    pub kept_as: Option<String>,
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
    /// The syncs a test hook makes fail.
    faults: SyncFaults,
}

/// A sync of the journal a test can make fail ([`SyncFaults`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncPoint {
    /// An appended record's.
    Append,
    /// `journal.base`'s, before old segments are removed.
    Base,
}

impl SyncPoint {
    /// The word that names this sync in a fault file.
    pub const fn word(self) -> &'static str {
        match self {
            SyncPoint::Append => "append",
            SyncPoint::Base => "base",
        }
    }
}

/// Sync faults injected by whoever opens the journal, for tests: while the
/// file exists, the syncs whose [`SyncPoint::word`] it names fail with EIO
/// after their write, as a disk that lost what it was given would. The
/// journal never looks for such a file of its own accord: the daemon passes
/// one only from its test hooks, which a shipped build does not compile
/// in, so there it is always [`SyncFaults::none`].
#[derive(Debug, Clone, Default)]
pub struct SyncFaults(Option<PathBuf>);

impl SyncFaults {
    /// No fault: every sync is real.
    pub fn none() -> SyncFaults {
        SyncFaults(None)
    }

    /// The faults `file` names, read at each sync (none without a file).
    pub fn from_file(file: Option<PathBuf>) -> SyncFaults {
        SyncFaults(file)
    }

    fn injected(&self, at: SyncPoint) -> std::io::Result<()> {
        let Some(file) = &self.0 else {
            return Ok(());
        };
        match std::fs::read_to_string(file) {
            Ok(text) if text.split_whitespace().any(|w| w == at.word()) => {
                Err(std::io::Error::from_raw_os_error(libc::EIO))
            }
            _ => Ok(()),
        }
    }

    /// Syncs `file`'s data (and its metadata too with `all`): the one way
    /// the journal syncs a file it must not lose, so a hook sits on each.
    fn sync(&self, file: &File, at: SyncPoint, all: bool) -> std::io::Result<()> {
        self.injected(at)?;
        if all {
            file.sync_all()
        } else {
            file.sync_data()
        }
    }
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

/// The file a torn tail of segment `n` at `offset` is copied to (`copy`
/// from 1; later copies only when a crash tore that very place again).
fn torn_name(n: u32, offset: u64, copy: u32) -> String {
    if copy <= 1 {
        format!("journal-{n:06}-at-{offset}.torn")
    } else {
        format!("journal-{n:06}-at-{offset}.{copy}.torn")
    }
}

/// Whether a file in the journal's directory is a torn tail's evidence.
pub fn is_torn_evidence(name: &str) -> bool {
    name.starts_with("journal-") && name.ends_with(".torn")
}

/// The check of a frame's length: a changed length byte (or check byte)
/// makes them disagree, so it is never taken for a frame a crash cut.
fn length_check(len: u64) -> [u8; CHECK_BYTES] {
    let mut h = Sha256::new();
    h.update(b"taskgate journal frame length");
    h.update(len.to_le_bytes());
    let digest: [u8; HASH_BYTES] = h.finalize().into();
    let mut out = [0u8; CHECK_BYTES];
    out.copy_from_slice(&digest[..CHECK_BYTES]);
    out
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

/// The bytes of one frame (in the current format).
fn frame(previous: &[u8; HASH_BYTES], payload: &[u8]) -> (Vec<u8>, [u8; HASH_BYTES]) {
    let hash = frame_hash(previous, payload);
    let len = payload.len() as u64;
    let mut out = Vec::with_capacity(frame_size(payload.len()));
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&length_check(len));
    out.extend_from_slice(payload);
    out.resize(HEADER_BYTES + padded(payload.len()), 0);
    out.extend_from_slice(&hash);
    (out, hash)
}

/// The bytes a frame of a `len`-byte payload takes (current format).
fn frame_size(len: usize) -> usize {
    HEADER_BYTES + padded(len) + HASH_BYTES
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

/// The hash `text` spells in lower-case hex (the only way the journal
/// writes one: an upper-case digit is a changed byte, not the same hash).
fn unhex(text: &str) -> Option<[u8; HASH_BYTES]> {
    let mut out = [0u8; HASH_BYTES];
    if text.len() != HASH_BYTES * 2 || !text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
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

/// Creates `path` new and private (0600), writes `bytes` and syncs them with
/// `sync`.
fn write_private(
    path: &Path,
    bytes: &[u8],
    sync: impl FnOnce(&File) -> std::io::Result<()>,
) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)?;
    sync(&f)
}

/// Writes the base file whole (a temporary file synced, then renamed and
/// the directory synced).
fn write_base(dir: &Path, base: &Base, faults: &SyncFaults) -> Result<(), JournalError> {
    let value = serde_json::to_value(base).unwrap_or(Value::Null);
    let bytes = canonical(&value)?;
    let tmp = dir.join(format!("{BASE_FILE}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    write_private(&tmp, &bytes, |f| faults.sync(f, SyncPoint::Base, true))
        .map_err(io(&tmp, "writing the journal's base"))?;
    std::fs::rename(&tmp, dir.join(BASE_FILE)).map_err(io(&tmp, "renaming the journal's base"))?;
    sync_dir(dir)
}

/// Reads one segment's frames, checking the chain from `previous`. Returns
/// the records, the hash it ends with, its valid length, whether its final
/// frame was cut short, and its format.
struct Scanned {
    records: Vec<Value>,
    head: [u8; HASH_BYTES],
    valid: u64,
    torn: bool,
    format: u32,
}

fn scan(path: &Path, previous: [u8; HASH_BYTES]) -> Result<Scanned, (u64, String)> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|e| (0, format!("unreadable: {e}")))?;
    scan_bytes(&bytes, previous)
}

/// [`scan`] of a segment's bytes. A frame is torn (a crash cut it) only
/// when it is the last thing in the file and either its header is not all
/// there or its length passes its check and runs past the end; a segment
/// holding no whole frame is torn from its start.
fn scan_bytes(bytes: &[u8], previous: [u8; HASH_BYTES]) -> Result<Scanned, (u64, String)> {
    let (format, header, mut at) = if bytes.starts_with(&FORMAT_MAGIC) {
        (FORMAT, HEADER_BYTES, FORMAT_MAGIC.len())
    } else {
        (1, LEN_BYTES, 0)
    };
    if bytes.len() < FORMAT_MAGIC.len() {
        // Created, and the crash came before its magic (or, by an earlier
        // version, its first length) was all written.
        at = bytes.len();
    }
    let mut head = previous;
    let mut records = Vec::new();
    let mut torn = false;
    while at < bytes.len() {
        let rest = bytes.len() - at;
        if rest < header {
            torn = true;
            break;
        }
        let len = u64::from_le_bytes(bytes[at..at + LEN_BYTES].try_into().unwrap_or([0; 8]));
        if format == FORMAT && bytes[at + LEN_BYTES..at + HEADER_BYTES] != length_check(len) {
            return Err((
                at as u64,
                "its length does not match the length's check (altered)".into(),
            ));
        }
        if len as usize > MAX_RECORD_BYTES {
            return Err((at as u64, format!("a frame claims {len} bytes")));
        }
        let len = len as usize;
        let body = header + padded(len);
        if rest < body + HASH_BYTES {
            if format == FORMAT {
                torn = true;
                break;
            }
            return Err((
                at as u64,
                "its frame runs past the end of the file; in a segment of format 1 (written before frame lengths were checked) a cut append cannot be told from an altered length".into(),
            ));
        }
        let payload = &bytes[at + header..at + header + len];
        if bytes[at + header + len..at + body].iter().any(|b| *b != 0) {
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
    if records.is_empty() {
        // Not even the segment record is whole: the segment holds nothing
        // (the magic goes with the first frame).
        return Ok(Scanned {
            records,
            head,
            valid: 0,
            torn: !bytes.is_empty(),
            format,
        });
    }
    Ok(Scanned {
        records,
        head,
        valid: at as u64,
        torn,
        format,
    })
}

/// A journal's chain as read from its files, before anything is repaired.
/// Where an opened journal's appends go on.
enum Tail {
    /// At the end of the last segment, opened for writing.
    Append(File),
    /// In a new segment of this number, chained to what was read.
    NewSegment(u32),
}

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
    /// The last segment's format.
    tail_format: u32,
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
        tail_format: FORMAT,
    };
    let mut newest_format = 1;
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
        // A segment holding no whole frame has no format to speak of.
        if scanned.valid > 0 && scanned.format < newest_format {
            return Err(damaged(
                segment_name(n),
                0,
                format!(
                    "it is of format {} but follows a segment of format {newest_format}",
                    scanned.format
                ),
            ));
        }
        if scanned.valid > 0 {
            newest_format = scanned.format;
        }
        let format_named = (scanned.format != 1).then_some(scanned.format);
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
                    && s.format == format_named
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
            chain.tail_format = scanned.format;
            chain.tail_size = std::fs::metadata(&path)
                .map_err(io(&path, "reading a segment's size"))?
                .len();
        }
    }
    Ok(chain)
}

/// Copies the torn tail of segment `n` (its bytes from `offset`) into a
/// file of its own beside the segments, synced, before it is cut: what a
/// crash left is evidence. A copy made before (a crash between copying and
/// cutting) is kept as it is. Returns the file's name.
fn keep_torn(dir: &Path, n: u32, offset: u64) -> Result<String, JournalError> {
    let path = dir.join(segment_name(n));
    let mut tail = Vec::new();
    File::open(&path)
        .and_then(|mut f| {
            f.seek(SeekFrom::Start(offset))?;
            f.read_to_end(&mut tail)
        })
        .map_err(io(&path, "reading a torn final frame"))?;
    for copy in 1..=MAX_TORN_COPIES {
        let name = torn_name(n, offset, copy);
        let target = dir.join(&name);
        match std::fs::read(&target) {
            Ok(existing) if existing == tail => return Ok(name),
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&target, "reading a torn tail's copy")(e)),
        }
        write_private(&target, &tail, |f| f.sync_all())
            .map_err(io(&target, "keeping a torn final frame"))?;
        sync_dir(dir)?;
        return Ok(name);
    }
    Err(JournalError::Invalid {
        dir: dir.to_path_buf(),
        reason: format!(
            "{MAX_TORN_COPIES} copies of torn final frames of {} at byte {offset} are kept already; look at the journal-*.torn files and remove them",
            segment_name(n)
        ),
    })
}

impl Journal {
    /// Opens the journal in `dir` (a private directory that exists),
    /// creating its first segment when the directory holds none. Returns it
    /// with every record kept, in order.
    pub fn open(
        dir: &Path,
        max_segment_bytes: u64,
    ) -> Result<(Journal, Vec<Entry>, Opened), JournalError> {
        Journal::open_with_faults(dir, max_segment_bytes, SyncFaults::none())
    }

    /// [`Journal::open`] with sync faults injected (tests only).
    pub fn open_with_faults(
        dir: &Path,
        max_segment_bytes: u64,
        faults: SyncFaults,
    ) -> Result<(Journal, Vec<Entry>, Opened), JournalError> {
        if max_segment_bytes < MIN_SEGMENT_BYTES {
            return Err(JournalError::Invalid {
                dir: dir.to_path_buf(),
                reason: format!("segments must be at least {MIN_SEGMENT_BYTES} bytes"),
            });
        }
        Journal::open_sized(dir, max_segment_bytes, faults)
    }

    /// [`Journal::open`] without the lower bound on segments (tests use
    /// small ones to hold many segments in few bytes).
    fn open_sized(
        dir: &Path,
        max_segment_bytes: u64,
        faults: SyncFaults,
    ) -> Result<(Journal, Vec<Entry>, Opened), JournalError> {
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
        let mut opened = Opened::default();
        if chain.torn {
            opened.kept_as = Some(keep_torn(dir, chain.last, chain.tail_valid)?);
            opened.truncated = chain.tail_size - chain.tail_valid;
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
                faults,
            )?;
            return Ok((journal, Vec::new(), opened));
        };
        let records = chain.base_seq + chain.read;
        let path = dir.join(segment_name(chain.last));
        // Where appends go on: the end of the last segment, or a new
        // segment chained to what was read.
        let tail = if chain.tail_valid == 0 {
            // The last segment's own first record was cut short: write it
            // again.
            std::fs::remove_file(&path).map_err(io(&path, "removing an empty segment"))?;
            Tail::NewSegment(chain.last)
        } else {
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(io(&path, "opening the last segment"))?;
            if chain.torn {
                file.set_len(chain.tail_valid)
                    .and_then(|_| file.sync_all())
                    .map_err(io(&path, "truncating an unfinished final frame"))?;
            }
            if chain.tail_format != FORMAT {
                // Written by an earlier version: appends go on in a segment
                // of the current format, chained to it.
                Tail::NewSegment(chain.last + 1)
            } else {
                file.seek(SeekFrom::End(0))
                    .map_err(io(&path, "seeking the end of the last segment"))?;
                Tail::Append(file)
            }
        };
        let journal = match tail {
            Tail::NewSegment(n) => Journal::start_segment(
                dir,
                identity,
                max_segment_bytes,
                n,
                chain.head,
                records,
                chain.kept,
                faults,
            )?,
            Tail::Append(file) => Journal {
                dir: dir.to_path_buf(),
                identity,
                max_segment_bytes,
                segment: chain.last,
                file,
                offset: chain.tail_valid,
                head: chain.head,
                records,
                kept: chain.kept,
                faults,
            },
        };
        Ok((journal, chain.entries, opened))
    }

    /// Creates segment `n`, chained to `previous`, and syncs it and the
    /// directory.
    #[allow(clippy::too_many_arguments)]
    fn start_segment(
        dir: &Path,
        identity: String,
        max_segment_bytes: u64,
        n: u32,
        previous: [u8; HASH_BYTES],
        records: u64,
        mut kept: Vec<SegmentStart>,
        faults: SyncFaults,
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
            format: Some(FORMAT),
        })
        .unwrap_or(Value::Null);
        let (first, head) = frame(&previous, &canonical(&record)?);
        let mut bytes = FORMAT_MAGIC.to_vec();
        bytes.extend_from_slice(&first);
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
            faults,
        })
    }

    /// Appends one record and syncs it before returning its sequence
    /// number. A segment that would grow past the configured size is closed
    /// first and the next one started.
    pub fn append(&mut self, record: &Value) -> Result<u64, JournalError> {
        let payload = canonical(record)?;
        let size = frame_size(payload.len()) as u64;
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
                self.faults.clone(),
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
            .and_then(|_| self.faults.sync(&self.file, SyncPoint::Append, false));
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
            &self.faults,
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

    /// Injects sync faults into this journal alone from now on (tests
    /// share a process, so the environment cannot be theirs).
    pub fn set_sync_faults(&mut self, faults: SyncFaults) {
        self.faults = faults;
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
            kept_as: chain
                .torn
                .then(|| format!("{} at byte {}", segment_name(chain.last), chain.tail_valid)),
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
    /// A sweep's counts, written straight to the test process's stderr:
    /// the harness captures only the print macros, so the line shows in
    /// every run's log, passing or not.
    fn report(line: &str) {
        use std::io::Write as _;
        let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
    }

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
            // What creating a segment writes: its magic, then its record.
            let mut bytes = FORMAT_MAGIC.to_vec();
            bytes.extend_from_slice(&frame(&ZERO_HASH, b"{}").0);
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

    /// The record of the `i`-th event of a cycle through the six kinds of
    /// event taskgate's approval gate journals, about proposal `p`, shaped
    /// as the gate writes them (`taskgate::approvals::Event`): records of
    /// real kinds and sizes, whose meaning the journal never reads.
    fn event(p: u64, i: u64) -> Value {
        let proposal = format!("tgp-{p:032x}");
        let at_ms = 1_700_000_000_000 + (p * 6 + i) as i64;
        match i % 6 {
            0 => json!({
                "kind": "proposal_created",
                "proposal": proposal,
                "owner": "a".repeat(64),
                "call": "c".repeat(64),
                "tool": "deploy",
                "principal": "the local caller",
                "arguments": "d".repeat(64),
                "preview": {"target": "prod-eu"},
                "created_ms": at_ms,
                "decision_deadline_ms": at_ms + 3_600_000,
            }),
            1 => json!({
                "kind": "approved",
                "proposal": proposal,
                "decider": "uid 1000",
                "at_ms": at_ms,
                "execution_deadline_ms": at_ms + 900_000,
            }),
            2 => json!({
                "kind": "consumed",
                "proposal": proposal,
                "request": "c".repeat(64),
                "at_ms": at_ms,
            }),
            3 => json!({
                "kind": "rejected",
                "proposal": proposal,
                "decider": "uid 1000",
                "at_ms": at_ms,
                "reason": "not now",
            }),
            4 => json!({"kind": "expired", "proposal": proposal, "at_ms": at_ms}),
            _ => json!({
                "kind": "call_cancellation",
                "proposal": proposal,
                "owner": "a".repeat(64),
                "at_ms": at_ms,
            }),
        }
    }

    /// A journal of small segments holding every event kind in its two
    /// kept segments, the one before them removed behind its base.
    fn journal_of_every_kind() -> tempfile::TempDir {
        let d = dir();
        let (mut j, _, _) = Journal::open_sized(d.path(), 3072, SyncFaults::default()).unwrap();
        let mut n = 0;
        while j.kept.len() < 3 {
            j.append(&event(n / 6, n % 6)).unwrap();
            n += 1;
        }
        let second = j.kept[1].first_seq;
        assert_eq!(j.remove_before(second).unwrap(), 1);
        drop(j);
        let (_, entries, _) = Journal::open(d.path(), SEGMENT).unwrap();
        let kinds: std::collections::BTreeSet<&str> = entries
            .iter()
            .filter_map(|e| e.record["kind"].as_str())
            .collect();
        assert_eq!(kinds.len(), 6, "every event kind is kept: {kinds:?}");
        assert!(d.path().join(BASE_FILE).exists() && !seg(d.path(), 1).exists());
        assert!(seg(d.path(), 2).exists() && seg(d.path(), 3).exists());
        d
    }

    /// Every file of a journal directory, by name.
    fn files_of(d: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
        std::fs::read_dir(d)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read(e.path()).unwrap(),
                )
            })
            .collect()
    }

    fn put_files(d: &Path, files: &std::collections::BTreeMap<String, Vec<u8>>) {
        for (name, bytes) in files {
            std::fs::write(d.join(name), bytes).unwrap();
        }
    }

    #[test]
    fn a_length_changed_to_run_past_the_end_is_damage_not_a_torn_tail() {
        // The last frame of the last segment (say, the `consumed` record of
        // a spent approval) with its length raised past the end of the
        // file: it was acknowledged, so cutting it would run the call again.
        let d = dir();
        let (mut j, _, _) = Journal::open(d.path(), SEGMENT).unwrap();
        fill(&mut j, 1, 11);
        let last_at = j.offset as usize;
        j.append(&event(0, 2)).unwrap();
        drop(j);
        let path = seg(d.path(), 1);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[last_at + 1] = bytes[last_at + 1].wrapping_add(1);
        std::fs::write(&path, &bytes).unwrap();
        let (segment, offset, reason) = damaged(d.path());
        assert_eq!(
            (segment.as_str(), offset),
            ("journal-000001.log", last_at as u64),
            "{reason}"
        );
        assert!(matches!(
            Journal::verify(d.path()),
            Err(JournalError::Damaged { .. })
        ));
        assert_eq!(
            std::fs::read(&path).unwrap(),
            bytes,
            "the evidence was changed"
        );
    }

    #[test]
    fn every_changed_byte_of_every_file_is_damage_at_check_and_at_start() {
        let d = journal_of_every_kind();
        let pristine = files_of(d.path());
        let (mut cases, mut refused) = (0u64, 0u64);
        let mut accepted = Vec::new();
        for (name, bytes) in &pristine {
            for at in 0..bytes.len() {
                let b = bytes[at];
                let mut values = vec![b ^ 0x01, b ^ 0x20, b ^ 0xff];
                values.push(if b == 0 { 0x20 } else { 0 });
                for v in values {
                    let mut changed = bytes.clone();
                    changed[at] = v;
                    std::fs::write(d.path().join(name), &changed).unwrap();
                    let mut expected = pristine.clone();
                    expected.insert(name.clone(), changed);
                    cases += 1;
                    let checked = Journal::verify(d.path());
                    let started = Journal::open(d.path(), SEGMENT);
                    let unchanged = files_of(d.path()) == expected;
                    match (&checked, &started) {
                        (Err(JournalError::Damaged { .. }), Err(JournalError::Damaged { .. }))
                            if unchanged =>
                        {
                            refused += 1
                        }
                        _ => {
                            accepted.push(format!(
                                "{name} byte {at} {b:#04x} -> {v:#04x}: check {:?}, start {:?}, files unchanged {unchanged}",
                                checked.map(|c| c.1),
                                started.map(|s| s.2)
                            ));
                            put_files(d.path(), &expected);
                        }
                    }
                }
            }
            std::fs::write(d.path().join(name), bytes).unwrap();
        }
        report(&format!(
            "journal byte sweep: {cases} cases, {refused} damaged, {} accepted",
            accepted.len()
        ));
        assert!(accepted.is_empty(), "{accepted:#?}");
        assert!(cases > 10_000, "{cases}");
        // The untouched journal still opens whole.
        assert_eq!(files_of(d.path()), pristine);
        assert!(Journal::open(d.path(), SEGMENT).is_ok());
    }

    /// Where each frame of a segment ends (the magic goes with the first).
    fn frame_ends(bytes: &[u8]) -> Vec<usize> {
        let mut at = FORMAT_MAGIC.len();
        let mut ends = Vec::new();
        while at < bytes.len() {
            let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
            at += frame_size(len);
            ends.push(at);
        }
        assert_eq!(at, bytes.len());
        ends
    }

    #[test]
    fn a_cut_anywhere_takes_only_the_unfinished_final_frame_and_keeps_it() {
        let d = journal_of_every_kind();
        let pristine = files_of(d.path());
        let records = Journal::verify(d.path()).unwrap().0.records;
        let last = segment_name(3);
        let tail = &pristine[&last];
        let ends = frame_ends(tail);
        let in_last = ends.len() as u64 - 1;
        let (mut cases, mut cut, mut whole, mut refused) = (0u64, 0u64, 0u64, 0u64);
        // The last segment cut at every length short of its own.
        for x in 0..tail.len() {
            cases += 1;
            let t = dir();
            let mut files = pristine.clone();
            files.insert(last.clone(), tail[..x].to_vec());
            put_files(t.path(), &files);
            // The whole frames before the cut, and where they end (the
            // segment's first frame is written again when it is cut too).
            let whole_frames = ends.iter().filter(|e| **e <= x).count() as u64;
            let boundary = ends.iter().copied().filter(|e| *e <= x).max().unwrap_or(0);
            let expected_records = records - in_last + whole_frames.saturating_sub(1);
            let (check, found) = Journal::verify(t.path()).unwrap();
            assert_eq!(check.records, expected_records, "cut at {x}");
            assert_eq!(found.truncated, (x - boundary) as u64, "cut at {x}");
            assert_eq!(
                files_of(t.path()),
                files,
                "verify changed a file (cut at {x})"
            );
            let (mut j, entries, opened) = Journal::open(t.path(), SEGMENT).unwrap();
            assert_eq!(
                entries.last().map_or(0, |e| e.seq),
                expected_records,
                "cut at {x}"
            );
            assert_eq!(opened.truncated, (x - boundary) as u64, "cut at {x}");
            let after = files_of(t.path());
            assert_eq!(
                after[&last],
                tail[..boundary.max(ends[0])],
                "the segment after a cut at {x}"
            );
            if x > boundary {
                let kept = torn_name(3, boundary as u64, 1);
                assert_eq!(opened.kept_as.as_deref(), Some(kept.as_str()));
                assert_eq!(after[&kept], tail[boundary..x], "the torn tail at {x}");
                cut += 1;
            } else {
                assert!(after.keys().all(|n| !is_torn_evidence(n)), "cut at {x}");
                whole += 1;
            }
            assert_eq!(j.append(&record(0)).unwrap(), expected_records + 1);
            drop(j);
            assert_eq!(
                Journal::open(t.path(), SEGMENT).unwrap().1.len(),
                entries.len() + 1,
                "appends go on after a cut at {x}"
            );
        }
        // An earlier segment or the base cut anywhere: damage, nothing changed.
        for name in [segment_name(2), BASE_FILE.to_string()] {
            let bytes = &pristine[&name];
            for x in 0..bytes.len() {
                cases += 1;
                let t = dir();
                let mut files = pristine.clone();
                files.insert(name.clone(), bytes[..x].to_vec());
                put_files(t.path(), &files);
                assert!(
                    matches!(Journal::verify(t.path()), Err(JournalError::Damaged { .. })),
                    "{name} cut at {x}"
                );
                assert!(
                    matches!(
                        Journal::open(t.path(), SEGMENT),
                        Err(JournalError::Damaged { .. })
                    ),
                    "{name} cut at {x}"
                );
                assert_eq!(files_of(t.path()), files, "{name} cut at {x}");
                refused += 1;
            }
        }
        report(&format!(
            "journal truncation sweep: {cases} cases: {cut} cut only the unfinished final frame (kept aside), {whole} at a frame boundary, {refused} damaged (an earlier segment or the base cut)"
        ));
        assert_eq!(cases, cut + whole + refused);
    }

    #[test]
    fn a_torn_tail_cut_twice_at_one_place_keeps_both_copies() {
        let d = dir();
        let (mut j, _, _) = Journal::open(d.path(), SEGMENT).unwrap();
        fill(&mut j, 1, 4);
        let at = j.offset;
        drop(j);
        let path = seg(d.path(), 1);
        for (round, text) in [(1u32, "first"), (2, "second")] {
            let (bytes, _) = frame(&ZERO_HASH, &canonical(&json!({"x": text})).unwrap());
            let mut f = OpenOptions::new().append(true).open(&path).unwrap();
            f.write_all(&bytes[..20]).unwrap();
            drop(f);
            let (_, entries, opened) = Journal::open(d.path(), SEGMENT).unwrap();
            assert_eq!(entries.len(), 3);
            let kept = torn_name(1, at, round);
            assert_eq!(opened.kept_as.as_deref(), Some(kept.as_str()));
            assert_eq!(std::fs::read(d.path().join(&kept)).unwrap(), bytes[..20]);
        }
        // The evidence is no segment: the journal verifies beside it.
        assert_eq!(Journal::verify(d.path()).unwrap().0.records, 3);
    }

    /// A frame as segments of format 1 held it (no length check).
    fn frame_v1(previous: &[u8; HASH_BYTES], payload: &[u8]) -> (Vec<u8>, [u8; HASH_BYTES]) {
        let hash = frame_hash(previous, payload);
        let mut out = (payload.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(payload);
        out.resize(LEN_BYTES + padded(payload.len()), 0);
        out.extend_from_slice(&hash);
        (out, hash)
    }

    /// A journal of format 1: one segment of `n` records.
    fn journal_v1(d: &Path, n: u64) -> Vec<u8> {
        let segment = json!({"kind": "segment", "journal": "ab".repeat(16), "segment": 1,
            "previous": hex(&ZERO_HASH), "first_seq": 1});
        let (mut bytes, mut head) = frame_v1(&ZERO_HASH, &canonical(&segment).unwrap());
        for i in 1..=n {
            let (f, h) = frame_v1(&head, &canonical(&record(i)).unwrap());
            bytes.extend_from_slice(&f);
            head = h;
        }
        std::fs::write(seg(d, 1), &bytes).unwrap();
        bytes
    }

    #[test]
    fn a_journal_of_the_first_format_still_opens_and_goes_on_in_the_new_one() {
        let d = dir();
        journal_v1(d.path(), 5);
        let (c, _) = Journal::verify(d.path()).unwrap();
        assert_eq!(c.records, 5);
        let (mut j, entries, _) = Journal::open(d.path(), SEGMENT).unwrap();
        assert_eq!(entries.len(), 5);
        // Appends go on in a segment of the current format.
        assert_eq!(j.append(&record(6)).unwrap(), 6);
        drop(j);
        let second = std::fs::read(seg(d.path(), 2)).unwrap();
        assert!(second.starts_with(&FORMAT_MAGIC));
        let (_, entries, _) = Journal::open(d.path(), SEGMENT).unwrap();
        assert!(
            entries
                .iter()
                .map(|e| e.record["n"].as_u64())
                .eq((1..=6).map(Some))
        );

        // Its last frame cut (or its length raised): refused, since format 1
        // cannot tell the two apart; nothing is changed.
        let d = dir();
        let bytes = journal_v1(d.path(), 5);
        std::fs::write(seg(d.path(), 1), &bytes[..bytes.len() - 3]).unwrap();
        let (_, _, reason) = damaged(d.path());
        assert!(reason.contains("format 1"), "{reason}");
        assert_eq!(
            std::fs::read(seg(d.path(), 1)).unwrap().len(),
            bytes.len() - 3
        );

        // A segment of format 1 after one of format 2: refused.
        let d = dir();
        let (mut j, _, _) = Journal::open_sized(d.path(), 1024, SyncFaults::default()).unwrap();
        fill(&mut j, 1, 20);
        assert!(j.kept.len() >= 2);
        drop(j);
        let path = seg(d.path(), 2);
        let second = std::fs::read(&path).unwrap();
        std::fs::write(&path, &second[FORMAT_MAGIC.len()..]).unwrap();
        assert_eq!(damaged(d.path()).0, "journal-000002.log");
    }

    /// A test hook's fault file in `d` naming `point`.
    fn fault(d: &Path, point: &str) -> SyncFaults {
        let file = d.join("fault");
        std::fs::write(&file, point).unwrap();
        SyncFaults(Some(file))
    }

    #[test]
    fn an_append_whose_sync_fails_is_not_acknowledged_and_not_kept() {
        let d = dir();
        let faults_dir = dir();
        let (mut j, _, _) = Journal::open(d.path(), SEGMENT).unwrap();
        fill(&mut j, 1, 4);
        let good = j.checkpoint();
        j.faults = fault(faults_dir.path(), SyncPoint::Append.word());
        assert!(matches!(
            j.append(&record(4)),
            Err(JournalError::Io {
                during: "appending a record",
                ..
            })
        ));
        assert_eq!(j.checkpoint(), good);
        drop(j);
        let (_, entries, opened) = Journal::open(d.path(), SEGMENT).unwrap();
        assert_eq!((entries.len(), opened.truncated), (3, 0));
    }

    #[test]
    fn the_base_is_synced_before_any_segment_is_removed() {
        let d = dir();
        let faults_dir = dir();
        let (mut j, _, _) = Journal::open_sized(d.path(), 1024, SyncFaults::default()).unwrap();
        fill(&mut j, 1, 40);
        assert!(j.kept.len() >= 4);
        let third = j.kept[2].first_seq;
        let before = files_of(d.path());
        let good = j.checkpoint();
        // The base's sync fails: no segment may go.
        j.faults = fault(faults_dir.path(), SyncPoint::Base.word());
        assert!(matches!(
            j.remove_before(third),
            Err(JournalError::Io {
                during: "writing the journal's base",
                ..
            })
        ));
        let after = files_of(d.path());
        for (name, bytes) in before.iter().filter(|(n, _)| segment_number(n).is_some()) {
            assert_eq!(
                after.get(name),
                Some(bytes),
                "{name} was removed or changed"
            );
        }
        assert!(!after.contains_key(BASE_FILE), "{:?}", after.keys());
        assert_eq!(j.checkpoint(), good);
        // Once the sync works, they go.
        j.faults = SyncFaults::default();
        assert_eq!(j.remove_before(third).unwrap(), 2);
        drop(j);
        let (_, entries, _) = Journal::open(d.path(), SEGMENT).unwrap();
        assert_eq!(entries.first().map(|e| e.seq), Some(third));
    }
}
