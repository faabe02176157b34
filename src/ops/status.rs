//! The daemon's status: one report that `taskgate status` (the admin
//! socket) and `/metrics` both render.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};

use super::Ops;
use crate::parts::Parts;
use crate::store::{RouteCounts, StoreError, StoreStats};
use crate::tasks::{ApprovalsStatus, FallbackReason};

/// How long the status waits for each count the store thread makes; past
/// it the count is left out rather than delaying the answer.
const STORE_READ_LIMIT: Duration = Duration::from_secs(1);

/// A scrape reads the store's counts at most once per this interval,
/// however often (and however many at once) it is asked for: a local
/// process hammering `/metrics` cannot keep the store thread busy counting.
const SCRAPE_COUNTS_EVERY: Duration = Duration::from_secs(1);

/// Who asks, which decides what is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    /// `taskgate status`: the store's counts read now, and each durable
    /// part's files measured on disk.
    Operator,
    /// A `/metrics` scrape: the store's counts at most a second old, no
    /// walk of the disk.
    Scrape,
}

/// Where the task store stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreState {
    Serving,
    Stopping,
    /// Latched disabled after a disk error, until a restart (the reason).
    Disabled(String),
}

impl StoreState {
    pub fn as_str(&self) -> &'static str {
        match self {
            StoreState::Serving => "serving",
            StoreState::Stopping => "stopping",
            StoreState::Disabled(_) => "disabled",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskCounts {
    pub retained: u64,
    pub unexpired: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Queue {
    /// Commands waiting for the store thread.
    pub depth: usize,
    /// `store.queue_depth`.
    pub capacity: usize,
}

/// Calls that asked for a task and ran synchronously, by reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fallbacks {
    pub total: u64,
    pub slots_busy: u64,
    pub store_busy: u64,
    pub store_capacity: u64,
    pub store_unavailable: u64,
}

/// A durable part as `status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartStatus {
    pub name: String,
    /// Where its files are kept.
    pub dir: PathBuf,
    /// Its files an offline backup would copy, and their bytes.
    pub files: u64,
    pub bytes: u64,
}

/// The approval gate's state in a status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalsReport {
    /// The journal (told when it is older than the task store).
    pub journal: ApprovalsStatus,
    /// When the oldest proposal still waiting was made (Unix ms).
    pub oldest_pending_ms: Option<i64>,
    /// The store clock's time the report was made at.
    pub now_ms: i64,
}

impl ApprovalsReport {
    /// Whether approvals can be decided now.
    pub fn enabled(&self) -> bool {
        self.journal.disabled.is_none()
    }

    /// How long the oldest waiting proposal has waited (0 when none).
    pub fn oldest_pending_secs(&self) -> f64 {
        self.oldest_pending_ms
            .map_or(0.0, |o| (self.now_ms - o).max(0) as f64 / 1000.0)
    }
}

/// Everything the daemon tells of itself at one moment.
#[derive(Debug, Clone)]
pub struct StatusReport {
    pub version: &'static str,
    pub pid: u32,
    pub started: SystemTime,
    pub uptime: Duration,
    pub state_dir: PathBuf,
    /// `127.0.0.1:8765`, or `stdio`.
    pub listen: String,
    pub admin_socket: PathBuf,
    pub store: StoreState,
    /// Rows retained and those unexpired; `None` when the store could not
    /// count them (disabled, or its queue full).
    pub tasks: Option<TaskCounts>,
    /// Unexpired tasks by status; `None` when not counted.
    pub tasks_by_status: Option<Vec<(&'static str, u64)>>,
    /// Tool runs holding a running slot.
    pub running: usize,
    pub runs_started: u64,
    pub task_reads: u64,
    pub polls_held: u64,
    pub polls_answered_from_memory: u64,
    pub queue: Queue,
    /// Size of `tasks.db-wal` now.
    pub wal_bytes: u64,
    /// The last TRUNCATE checkpoint since this start (Unix ms).
    pub last_checkpoint_ms: Option<i64>,
    pub fallbacks: Fallbacks,
    /// Synchronous fallbacks by reason, every reason named.
    pub fallbacks_by_reason: Vec<(&'static str, u64)>,
    /// Open legacy sessions (HTTP only).
    pub legacy_sessions: Option<usize>,
    pub snapshot_running: bool,
    pub confinement: crate::tools::confine::Confinement,
    /// Each durable part's files ([`View::Operator`] only).
    pub parts: Vec<PartStatus>,
    pub upstreams: Vec<crate::upstream::UpstreamStatus>,
    /// What restart recovery ended at this start, every kind of record's,
    /// one line each (empty when nothing was in flight).
    pub recovered: Vec<String>,
    /// Unexpired durable routes by phase; `None` when not counted.
    pub routes: Option<RouteCounts>,
    /// The approval gate, when this daemon holds calls for approval.
    pub approvals: Option<ApprovalsReport>,
}

/// The store's counts, and when they were read.
#[derive(Debug, Clone, Default)]
struct StoreCounts {
    stats: Option<StoreStats>,
    by_status: Option<Vec<(&'static str, u64)>>,
    routes: Option<RouteCounts>,
    /// How far waiting approval tasks reached into the journal.
    approval_seq_needed: u64,
}

/// The last store counts; the lock also makes concurrent readers wait for
/// one read instead of each making its own.
#[derive(Default)]
pub(super) struct CountsCache(tokio::sync::Mutex<Option<(Instant, StoreCounts)>>);

/// A count from the store thread, or nothing when it does not come within
/// [`STORE_READ_LIMIT`].
async fn within<T>(count: impl std::future::Future<Output = Result<T, StoreError>>) -> Option<T> {
    tokio::time::timeout(STORE_READ_LIMIT, count)
        .await
        .ok()
        .and_then(Result::ok)
}

impl Ops {
    /// The store's counts, read afresh unless `max_age` allows the last.
    async fn store_counts(&self, max_age: Duration) -> StoreCounts {
        let mut last = self.counts.0.lock().await;
        if let Some((at, counts)) = last.as_ref()
            && at.elapsed() < max_age
        {
            return counts.clone();
        }
        let store = &self.store;
        let counts = StoreCounts {
            stats: within(store.stats()).await,
            by_status: within(store.status_counts()).await,
            routes: within(store.route_counts()).await,
            approval_seq_needed: match self.svc.approvals() {
                Some(_) => within(store.approval_seq_needed()).await.unwrap_or(0),
                None => 0,
            },
        };
        *last = Some((Instant::now(), counts.clone()));
        counts
    }

    /// The daemon's status, as `view` needs it.
    pub async fn status(&self, view: View) -> StatusReport {
        let svc = &self.svc;
        let store = &self.store;
        let disabled_reason = store.disabled_reason();
        let state = match disabled_reason {
            Some(reason) => StoreState::Disabled(reason),
            None if svc.is_stopping() => StoreState::Stopping,
            None => StoreState::Serving,
        };
        let counts = match (&state, view) {
            (StoreState::Disabled(_), _) => StoreCounts::default(),
            (_, View::Operator) => self.store_counts(Duration::ZERO).await,
            (_, View::Scrape) => self.store_counts(SCRAPE_COUNTS_EVERY).await,
        };
        let f = svc.fallbacks();
        let legacy_sessions = match self.sessions.get() {
            Some(s) => Some(s.open().await),
            None => None,
        };
        let (listen, admin_socket, started, uptime) = match self.served.get() {
            Some(s) => (
                s.serving.listen.clone(),
                s.serving.admin_socket.clone(),
                s.started,
                s.started_mono.elapsed(),
            ),
            None => (
                String::new(),
                PathBuf::new(),
                SystemTime::now(),
                Duration::ZERO,
            ),
        };
        let parts = match view {
            View::Scrape => Vec::new(),
            View::Operator => Parts::new()
                .all()
                .into_iter()
                .map(|part| {
                    let dir = part.live_dir(&self.state_dir, &self.config);
                    let footprint = part.footprint(&dir);
                    PartStatus {
                        name: part.name().to_string(),
                        dir,
                        files: footprint.files,
                        bytes: footprint.bytes,
                    }
                })
                .collect(),
        };
        let approvals = svc.approvals().map(|a| {
            let now_ms = self.now_ms();
            ApprovalsReport {
                journal: a.status_against(now_ms, counts.approval_seq_needed),
                oldest_pending_ms: a.gate().and_then(|g| g.pending_since(now_ms).1),
                now_ms,
            }
        });
        let (held, from_memory) = svc.early_polls();
        StatusReport {
            version: env!("CARGO_PKG_VERSION"),
            pid: std::process::id(),
            started,
            uptime,
            state_dir: self.state_dir.clone(),
            listen,
            admin_socket,
            store: state,
            tasks: counts.stats.map(|s| TaskCounts {
                retained: s.retained,
                unexpired: s.unexpired,
            }),
            tasks_by_status: counts.by_status,
            running: svc.running_count(),
            runs_started: svc.runs_started(),
            task_reads: store.task_reads(),
            polls_held: held,
            polls_answered_from_memory: from_memory,
            queue: Queue {
                depth: store.queued(),
                capacity: store.queue_capacity(),
            },
            wal_bytes: std::fs::symlink_metadata(store.wal_path()).map_or(0, |m| m.len()),
            last_checkpoint_ms: store.last_checkpoint_ms(),
            fallbacks: Fallbacks {
                total: f.total(),
                slots_busy: f.slots_busy,
                store_busy: f.store_busy,
                store_capacity: f.store_capacity,
                store_unavailable: f.store_unavailable,
            },
            fallbacks_by_reason: FallbackReason::ALL
                .into_iter()
                .map(|r| (r.as_str(), f.get(r)))
                .collect(),
            legacy_sessions,
            snapshot_running: self.snapshot_running.load(Ordering::Relaxed),
            confinement: svc.tools().confinement(),
            parts,
            upstreams: self.upstreams.status(false),
            recovered: self.recovered.get().cloned().unwrap_or_default(),
            routes: counts.routes,
            approvals,
        }
    }
}
