//! What an operator or administrator does to a serving daemon, as typed
//! queries and commands: its status (the task, route, upstream and
//! approval counts with it), its upstreams and pins, its durable routes,
//! approvals (list, show, approve, reject, the journal's check), a
//! configuration reload and an online snapshot. Each returns a typed
//! result or one [`OpsError`], which decides in one place the wire code,
//! the HTTP status and the exit class it goes out with.
//!
//! The surfaces only render: the admin socket (`admin::server`, which the
//! command-line client reads), `/admin/v1` (`http::admin_api`) and
//! `/metrics` (`http::metrics_api`) ask these queries and turn their
//! results into their own formats, so a number or an ID shows the same on
//! each, and a refusal is the same refusal on each. A new surface (a
//! console) renders the same results again and decides nothing of its own.
//!
//! Rules: ops knows the task service, the store's public reads, the
//! upstreams, the approval journal through the task service, and the
//! backup format; it knows no transport (no socket, no HTTP, no JSON-RPC
//! body): what a surface is (its listen address, its socket path, its
//! open sessions) is handed to it by the serving process.

mod approvals;
mod error;
mod routes;
mod snapshot;
mod status;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::time::{Instant, SystemTime};

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::store::Store;
use crate::tasks::TaskService;
use crate::upstream::{UpstreamStatus, Upstreams};

pub use approvals::Listing;
pub use error::{Code, Exit, Kind, OpsError, Respond};
pub use routes::{MAX_LISTED_ROUTES, RouteStatus};
pub use snapshot::SnapshotDone;
pub use status::{
    ApprovalsReport, Fallbacks, PartStatus, Queue, StatusReport, StoreState, TaskCounts, View,
};

/// A reload that was applied (a refused one is an
/// [`OpsError::ReloadRefused`] of the class the file was refused with, 78
/// for an invalid configuration).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reloaded {
    /// The daemon's reload count, as its STATUS= line numbers them.
    pub number: u64,
    /// Startup-only keys that differ in the file and keep their running
    /// value until a restart, by dotted name.
    pub kept: Vec<String>,
    /// What `taskgate reload` prints, line by line: what changed, what was
    /// kept.
    pub lines: Vec<String>,
}

/// How a reload is asked of the serving process: it runs it (the same
/// code as for SIGHUP) and answers here.
pub type ReloadReply = oneshot::Sender<Result<Reloaded, OpsError>>;

/// Open legacy sessions, counted by the transport that holds them.
pub trait SessionCount: Send + Sync {
    fn open(&self) -> Pin<Box<dyn Future<Output = usize> + Send + '_>>;
}

/// What the serving process tells ops once it serves: where, and how a
/// reload reaches it.
pub struct Serving {
    /// `127.0.0.1:8765`, or `stdio`.
    pub listen: String,
    pub admin_socket: PathBuf,
    pub reloads: mpsc::Sender<ReloadReply>,
}

struct Served {
    serving: Serving,
    started: SystemTime,
    started_mono: Instant,
}

/// The operations of one daemon.
pub struct Ops {
    svc: Arc<TaskService>,
    store: Store,
    upstreams: Arc<Upstreams>,
    state_dir: PathBuf,
    /// The settings the daemon started with: what a snapshot's parts are
    /// checked against.
    config: Arc<Config>,
    served: OnceLock<Served>,
    sessions: OnceLock<Arc<dyn SessionCount>>,
    snapshot_running: AtomicBool,
    counts: status::CountsCache,
    /// What restart recovery ended at this start, every kind's.
    recovered: OnceLock<Vec<String>>,
}

impl Ops {
    pub fn new(
        svc: Arc<TaskService>,
        store: Store,
        upstreams: Arc<Upstreams>,
        state_dir: &Path,
        config: &Config,
    ) -> Arc<Ops> {
        Arc::new(Ops {
            svc,
            store,
            upstreams,
            state_dir: state_dir.to_path_buf(),
            config: Arc::new(config.clone()),
            served: OnceLock::new(),
            sessions: OnceLock::new(),
            snapshot_running: AtomicBool::new(false),
            counts: status::CountsCache::default(),
            recovered: OnceLock::new(),
        })
    }

    /// What restart recovery ended at this start (the first call counts).
    pub fn recovered(&self, lines: Vec<String>) {
        let _ = self.recovered.set(lines);
    }

    /// The daemon serves from now on (the first call counts).
    pub fn serve(&self, serving: Serving) {
        let _ = self.served.set(Served {
            serving,
            started: SystemTime::now(),
            started_mono: Instant::now(),
        });
    }

    /// The transport's legacy sessions (the first call counts: one
    /// listener per daemon).
    pub fn count_sessions(&self, sessions: Arc<dyn SessionCount>) {
        let _ = self.sessions.set(sessions);
    }

    /// Why the task store is disabled, when it is (until a restart).
    pub fn store_disabled(&self) -> Option<String> {
        self.store.disabled_reason()
    }

    /// Whether the daemon is stopping (it admits no new calls).
    pub fn is_stopping(&self) -> bool {
        self.svc.is_stopping()
    }

    /// The upstreams; the one `alias` names with each of its capabilities.
    pub fn upstreams(&self, alias: Option<&str>) -> Result<Vec<UpstreamStatus>, OpsError> {
        match alias {
            None => Ok(self.upstreams.status(false)),
            Some(alias) => {
                let one: Vec<_> = self
                    .upstreams
                    .status(true)
                    .into_iter()
                    .filter(|u| u.alias == alias)
                    .collect();
                if one.is_empty() {
                    Err(OpsError::UnknownUpstream(alias.to_string()))
                } else {
                    Ok(one)
                }
            }
        }
    }

    /// Asks the serving process for a reload and waits for its outcome. The
    /// process runs one reload at a time, SIGHUP's and these alike; once it
    /// stops (or `stop` is cancelled), a request still waiting is answered
    /// that nothing was reloaded.
    pub async fn reload(&self, stop: &CancellationToken) -> Result<Reloaded, OpsError> {
        let stopping = || OpsError::Stopping {
            then: "nothing was reloaded (a start reads the file anyway)",
        };
        if self.svc.is_stopping() {
            return Err(stopping());
        }
        let Some(served) = self.served.get() else {
            return Err(stopping());
        };
        let (reply, outcome) = oneshot::channel();
        if served.serving.reloads.send(reply).await.is_err() {
            return Err(stopping());
        }
        tokio::select! {
            _ = stop.cancelled() => Err(stopping()),
            outcome = outcome => match outcome {
                Ok(done) => done,
                Err(_) => Err(stopping()),
            },
        }
    }

    fn now_ms(&self) -> i64 {
        self.store.clock().now_ms()
    }
}
