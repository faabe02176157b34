//! The private admin socket: `taskgate status`, online snapshots and
//! `taskgate reload`.
//!
//! The serving daemon listens on a Unix socket, `admin.sock`, in systemd's
//! `$RUNTIME_DIRECTORY` when it is set (the unit's `RuntimeDirectory=`,
//! 0700), else in the state directory itself: the one directory that is
//! already known to be private to the service user, and whose path every
//! operator command resolves the same way (`--config`, `--state-dir`). The
//! daemon records the socket's path in `tasks.lock`, so a client that names
//! the state directory finds it wherever it is.
//!
//! The socket is 0600, and each connection's peer credentials are checked
//! (SO_PEERCRED) before anything is read: only the daemon's own uid and
//! root are served; anyone else gets one refusal line and is closed.
//!
//! The uid check alone would let in every command tool, which runs as the
//! service user, and Landlock (at the ABIs these hosts run) does not
//! mediate `connect` on a pathname socket. So every request also carries
//! the daemon's admin key ([`AdminKey`]): 32 random bytes made at each
//! start, held in the daemon's memory (which is not dumpable) and written
//! only into `tasks.lock` in the state directory, which no confined tool
//! may ever be granted. A request without the right key gets one refusal
//! line, the same for a missing and a wrong key, before its operation is
//! looked at. The admin client reads the key from `tasks.lock`, so it
//! works for whoever may read the state directory: root and the service
//! user.
//!
//! Why a key and not the peer's ancestry (refusing a peer that descends
//! from the daemon or from a tool shim): the ancestry is read from /proc
//! after the fact, by a pid the peer may no longer own, and a tool's
//! process can leave it (an orphan whose shim died is reparented to
//! init), so such a check would be escapable and racy; refusing what it
//! catches adds nothing the key does not already refuse. The key holds
//! however the peer was started, and costs one comparison.
//!
//! The protocol is one JSON request line, one JSON answer line, then the
//! daemon closes. Every bound is a named constant: a request longer than
//! [`MAX_REQUEST_BYTES`] or slower than [`REQUEST_READ_TIMEOUT`] is refused
//! and closed, and at most [`MAX_CONNECTIONS`] connections are served at
//! once (the next is told so and closed), so a hostile neighbour that
//! idles, dribbles or floods holds nothing but its own connection.
//!
//! Owns the private admin socket. `mod.rs`: the protocol (one JSON request
//! line, one answer line per connection), its named bounds (16 KiB request, 3 s
//! read and write timeouts, 8 connections) and where the socket lives
//! (`$RUNTIME_DIRECTORY/admin.sock`, else the state directory; an `admin
//! <path>` line in `tasks.lock` tells clients) and the admin key (`AdminKey`:
//! 32 random bytes made at each start, kept in memory and on the `admin-key`
//! line of `tasks.lock` only, compared in constant time; `split_request` takes
//! it out of a request line, `keyed_request` puts it in). `server.rs`: bound
//! only once the lifetime lock is held (a dead socket of ours is replaced,
//! anything else left alone), served from READY until the store closes, removed
//! at a clean stop (a stop waits 10 s for connections; a snapshot still copying
//! then is abandoned by the closing store, and the stop waits, bounded, for its
//! connection to remove `DEST` before the process ends); peer credentials
//! checked before anything is read (own uid or root), then the request's key
//! before its operation is looked at (a tool runs as the service user and
//! passes the uid check; a missing or wrong key gets one refusal line, the same
//! for both, logged at warn without the key); status built from `TaskService`
//! and `Store` handles (counts included: tool runs started since the start,
//! `TaskService::runs_started`, and task reads asked of the store,
//! `Store::task_reads`, and the early polls held or answered from memory,
//! `TaskService::early_polls`), a stat of the WAL and the current tools'
//! `tools::confine::Confinement`, never from SQLite; an online snapshot is
//! destination checks → `Store::snapshot` (SQLite's backup API on the store
//! thread, 256 pages per step with the queue served between steps; a snapshot
//! error never disables the store) → `backup::seal`; a `reload` request is
//! handed to the serving process on a bounded channel (`ReloadReply`, a oneshot
//! for the outcome) and answered with what that reload did, or with the
//! refusal's class; an `upstreams` request is answered with every upstream's
//! status (one upstream's with each tool's digest, pin and description, for
//! `taskgate upstream show` and `pin`). `client.rs`: `taskgate status`, `backup
//! --online`, `taskgate reload` and the upstreams, exit classes 1/69/76/77/78;
//! makes itself non-dumpable, reads the key from `tasks.lock` and sends it only
//! to the socket recorded beside it. Knows no rmcp, opens no SQLite.

pub mod client;
pub mod server;

pub use crate::ops::{
    Fallbacks, MAX_LISTED_ROUTES, PartStatus, Queue, Reloaded, RouteStatus, SnapshotDone,
    TaskCounts,
};
pub use crate::tasks::{ApprovalsStatus, Decision};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::exit::ExitClass;

/// The socket's file name, in the runtime or the state directory.
pub const SOCKET_NAME: &str = "admin.sock";
/// The longest request line accepted, newline included: room for a
/// destination path of PATH_MAX bytes, JSON-escaped.
pub const MAX_REQUEST_BYTES: usize = 16 * 1024;
/// How long a connection has to send its whole request line.
pub const REQUEST_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);
/// How long the daemon waits for a peer to take its answer.
pub const ANSWER_WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);
/// Admin connections served at once.
pub const MAX_CONNECTIONS: usize = 8;

/// The admin key's length in bytes (64 hex digits in `tasks.lock` and in
/// a request).
pub const KEY_BYTES: usize = 32;
/// The request field that carries the key.
pub const KEY_FIELD: &str = "key";

/// The key a connection must present. Never printed, logged or put into
/// an error: it has no `Debug` or `Display`.
pub struct AdminKey {
    hex: String,
}

impl AdminKey {
    /// A new random key, from the kernel's generator.
    pub fn generate() -> Result<AdminKey, getrandom::Error> {
        let mut bytes = [0u8; KEY_BYTES];
        getrandom::fill(&mut bytes)?;
        let hex = bytes.iter().map(|b| format!("{b:02x}")).collect();
        bytes.fill(0);
        Ok(AdminKey { hex })
    }

    /// The text written into `tasks.lock`.
    pub fn as_hex(&self) -> &str {
        &self.hex
    }

    /// Whether `presented` is this key, in time that depends only on its
    /// length (which is public: always 64).
    pub fn matches(&self, presented: &str) -> bool {
        let (a, b) = (self.hex.as_bytes(), presented.as_bytes());
        if a.len() != b.len() {
            return false;
        }
        let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
        std::hint::black_box(diff) == 0
    }
}

/// Splits a request line into the key it presents and the request
/// itself: `None` for the key when there is none (the line is not a JSON
/// object, or has no string `key`), and the request's own parse result
/// for the rest. The key is checked before the request is looked at.
pub fn split_request(line: &[u8]) -> (Option<String>, Result<Request, serde_json::Error>) {
    let mut value: serde_json::Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(e) => return (None, Err(e)),
    };
    let key = value
        .as_object_mut()
        .and_then(|o| o.remove(KEY_FIELD))
        .and_then(|k| match k {
            serde_json::Value::String(s) => Some(s),
            _ => None,
        });
    (key, serde_json::from_value(value))
}

/// A request line as the client sends it: the request's fields and the
/// key.
pub fn keyed_request(request: &Request, key: Option<&str>) -> Result<Vec<u8>, serde_json::Error> {
    let mut value = serde_json::to_value(request)?;
    if let (Some(o), Some(key)) = (value.as_object_mut(), key) {
        o.insert(KEY_FIELD.into(), serde_json::Value::String(key.into()));
    }
    let mut line = serde_json::to_vec(&value)?;
    line.push(b'\n');
    Ok(line)
}

/// Where the serving daemon puts its admin socket: `$RUNTIME_DIRECTORY`
/// (the first, if systemd lists several) when set and absolute, else the
/// state directory.
pub fn socket_path(state_dir: &Path) -> PathBuf {
    let runtime = std::env::var_os("RUNTIME_DIRECTORY")
        .map(PathBuf::from)
        .and_then(|v| {
            v.to_str()
                .and_then(|s| s.split(':').next())
                .map(PathBuf::from)
        })
        .filter(|p| p.is_absolute());
    runtime
        .unwrap_or_else(|| state_dir.to_path_buf())
        .join(SOCKET_NAME)
}

/// One request line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    Status,
    /// Write an online snapshot into `to`, a new absolute path.
    Snapshot {
        to: PathBuf,
    },
    /// Re-read the configuration, as SIGHUP does, and answer with what
    /// the reload did once it is done.
    Reload,
    /// The upstreams; one of them with each of its capabilities when
    /// `alias` names it.
    Upstreams {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        alias: Option<String>,
    },
    /// Durable routes, newest first (only the nonterminal ones when
    /// `open`), or the one route `id` names.
    Routes {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        #[serde(default)]
        open: bool,
    },
    /// Approval proposals, newest first (only those waiting when
    /// `pending`), or the one `id` names; with the journal's state.
    Approvals {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        #[serde(default)]
        pending: bool,
    },
    /// An administrator's decision on proposal `id`.
    Decide {
        id: String,
        decision: Decision,
    },
}

/// One answer line.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum Answer {
    Status(Box<Status>),
    Snapshot(SnapshotDone),
    Reload(Reloaded),
    /// A struct variant: an internally tagged enum cannot carry a bare list.
    Upstreams {
        upstreams: Vec<crate::upstream::UpstreamStatus>,
    },
    Routes {
        routes: Vec<RouteStatus>,
    },
    Approvals {
        proposals: Vec<crate::approvals::Proposal>,
        journal: crate::tasks::ApprovalsStatus,
    },
    Error(AdminError),
}

/// A refusal or failure, with the exit code the client ends with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdminError {
    pub exit: u8,
    pub message: String,
}

/// A refusal of ops, with the exit class ops decided for it.
impl From<&crate::ops::OpsError> for AdminError {
    fn from(e: &crate::ops::OpsError) -> AdminError {
        AdminError::new(e.respond().exit, e.to_string())
    }
}

impl AdminError {
    pub fn new(class: ExitClass, message: impl Into<String>) -> AdminError {
        AdminError {
            exit: class.code(),
            message: message.into(),
        }
    }

    /// The class the client exits with; an unknown code (a newer daemon)
    /// is a failed request.
    pub fn class(&self) -> ExitClass {
        ExitClass::ALL
            .into_iter()
            .find(|c| c.code() == self.exit)
            .unwrap_or(ExitClass::CallFailed)
    }
}

/// What `taskgate status` shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub version: String,
    pub pid: u32,
    /// RFC 3339, UTC.
    pub started: String,
    pub uptime_secs: u64,
    pub state_dir: PathBuf,
    /// `127.0.0.1:8765`, or `stdio`.
    pub listen: String,
    pub admin_socket: PathBuf,
    /// `serving`, `disabled` or `stopping`.
    pub store: String,
    /// Why the store is disabled (until a restart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled_reason: Option<String>,
    /// Rows in the store and those not yet expired; absent when the store
    /// could not count them (disabled, or its queue full).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks: Option<TaskCounts>,
    /// Tool runs holding a running slot.
    pub running: usize,
    /// Tool runs started since the daemon started, background and
    /// synchronous (absent from, and so 0 for, a daemon older than this
    /// field).
    #[serde(default)]
    pub runs_started: u64,
    /// Task reads asked of the store since the daemon started: polls (and
    /// other lookups of one task) that reached it; a poll held or answered
    /// from memory by the pacing is not one. Absent from, and so 0 for, a
    /// daemon older than this field.
    #[serde(default)]
    pub task_reads: u64,
    /// Polls that came before their task's next read was due and were held
    /// until it was, since the daemon started (absent from, and so 0 for,
    /// a daemon older than this field).
    #[serde(default)]
    pub polls_held: u64,
    /// Early polls answered from memory with what the owner was last told,
    /// when too many were held already (0 for an older daemon).
    #[serde(default)]
    pub polls_answered_from_memory: u64,
    pub queue: Queue,
    /// Size of `tasks.db-wal` now.
    pub wal_bytes: u64,
    /// The last TRUNCATE checkpoint since this start (RFC 3339, UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_checkpoint: Option<String>,
    pub fallbacks: Fallbacks,
    /// Open legacy (2025 protocol) sessions; HTTP only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub legacy_sessions: Option<usize>,
    /// Whether an online snapshot is being written now.
    pub snapshot_running: bool,
    /// The confinement the tools of new calls get (absent from a daemon
    /// older than this field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confinement: Option<crate::tools::confine::Confinement>,
    /// Each durable part and what it holds on disk (empty from a daemon
    /// older than this field).
    #[serde(default)]
    pub parts: Vec<PartStatus>,
    /// Each upstream MCP server and where it stands (empty from a daemon
    /// older than this field).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub upstreams: Vec<crate::upstream::UpstreamStatus>,
    /// What restart recovery ended at this start, every kind of record's,
    /// one line each (empty when nothing was in flight, and from a daemon
    /// older than this field).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recovered: Vec<String>,
    /// Unexpired durable routes by phase; absent when none are held or
    /// the store could not count them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routes: Option<crate::store::RouteCounts>,
    /// The approval gate, when this daemon holds calls for approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approvals: Option<crate::tasks::ApprovalsStatus>,
}

/// How the admin socket asks the serving process for a reload.
pub use crate::ops::ReloadReply;
