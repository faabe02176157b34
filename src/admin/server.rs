//! The daemon's side of the admin socket.

use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixListener as StdListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{
    ANSWER_WRITE_TIMEOUT, AdminError, AdminKey, Answer, Fallbacks, MAX_CONNECTIONS,
    MAX_LISTED_ROUTES, MAX_REQUEST_BYTES, PartStatus, Queue, REQUEST_READ_TIMEOUT, ReloadReply,
    Request, RouteStatus, SnapshotDone, Status, TaskCounts,
};
use crate::backup::{self, BackupError};
use crate::config::Config;
use crate::exit::{Classify, ExitClass};
use crate::http::BoundedSessions;
use crate::parts::{self, Parts};
use crate::state_dir::{self, LifetimeLock};
use crate::store::RoutePhase;
use crate::tasks::TaskService;
use crate::upstream::Upstreams;

/// The longest path a Unix socket address holds (sun_path, NUL included).
const SUN_PATH_MAX: usize = 108;
/// How long a stop waits for admin connections (a snapshot being sealed)
/// before it goes on without them.
const STOP_LIMIT: Duration = Duration::from_secs(10);
/// How long, once the store has closed, the connections still open get to
/// end: a snapshot the closing store abandoned removes its unfinished copy
/// and tells its caller, which takes moments; the runtime must not end
/// before, or the copy would stay behind half-written.
const ABANDON_LIMIT: Duration = Duration::from_secs(5);
/// How long `status` waits for the store's counts before showing none.
const STATS_LIMIT: Duration = Duration::from_secs(1);
/// Pause after a failed accept (out of file descriptors), so the loop does
/// not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The admin socket of a serving process: bound during startup, served
/// from READY=1 until the store closes, removed at a clean stop. A socket
/// that cannot be made is logged and the daemon serves without one:
/// operators lose `status`, clients lose nothing.
#[derive(Default)]
pub struct Admin {
    bound: Option<Bound>,
    running: Option<Running>,
    /// Connections still served when [`Admin::stop`] gave up waiting.
    leftover: Option<TaskTracker>,
}

struct Bound {
    listener: StdListener,
    socket: Socket,
    key: AdminKey,
    state_dir: PathBuf,
    config: Arc<Config>,
    /// What restart recovery ended at this start, every kind's.
    recovered: Vec<String>,
}

/// The socket file this process made (by device and inode, so a stop
/// never removes a file someone else put there since).
#[derive(Clone)]
struct Socket {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

struct Running {
    stop: CancellationToken,
    tracker: TaskTracker,
    socket: Socket,
}

impl Admin {
    /// Binds the admin socket. Runs once the lifetime lock is held, so a
    /// socket file left at the path is a killed daemon's and is replaced,
    /// but only if it is a socket of ours that nobody answers on.
    pub fn bind(lock: &mut LifetimeLock, state_dir: &Path, config: &Config) -> Admin {
        let path = super::socket_path(state_dir);
        let key = match AdminKey::generate() {
            Ok(k) => k,
            Err(e) => {
                let _ = lock.record_admin(None);
                tracing::error!(error = %e,
                    "no admin socket: cannot make its key ({e}); serving without `taskgate status` and online snapshots");
                return Admin::default();
            }
        };
        match bind_socket(&path) {
            Ok((listener, socket)) => {
                if let Err(e) = lock.record_admin(Some((&path, key.as_hex()))) {
                    tracing::warn!(error = %e, "cannot record the admin socket in the lock file ({e}); `taskgate status` needs --socket");
                }
                tracing::info!(socket = %path.display(), "admin socket at {}", path.display());
                Admin {
                    bound: Some(Bound {
                        listener,
                        socket,
                        key,
                        state_dir: state_dir.to_path_buf(),
                        config: Arc::new(config.clone()),
                        recovered: Vec::new(),
                    }),
                    running: None,
                    leftover: None,
                }
            }
            Err(e) => {
                let _ = lock.record_admin(None);
                tracing::error!(socket = %path.display(), error = %e,
                    "no admin socket at {}: {e}; serving without `taskgate status` and online snapshots", path.display());
                Admin::default()
            }
        }
    }

    /// What restart recovery ended at this start, for `status`.
    pub fn recovered(&mut self, lines: Vec<String>) {
        if let Some(bound) = &mut self.bound {
            bound.recovered = lines;
        }
    }

    /// Starts serving the socket (inside the runtime). A `reload` request
    /// is passed to the serving process through `reloads`.
    pub fn start(
        &mut self,
        svc: Arc<TaskService>,
        listen: String,
        sessions: Option<Arc<BoundedSessions>>,
        reloads: mpsc::Sender<ReloadReply>,
        upstreams: Arc<Upstreams>,
    ) {
        let Some(bound) = self.bound.take() else {
            return;
        };
        let listener = match UnixListener::from_std(bound.listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "cannot serve the admin socket: {e}");
                remove_socket(&bound.socket);
                return;
            }
        };
        let ctx = Arc::new(Context {
            upstreams,
            svc,
            listen,
            sessions,
            state_dir: bound.state_dir,
            socket: bound.socket.path.clone(),
            config: bound.config,
            started: SystemTime::now(),
            started_mono: Instant::now(),
            snapshot_running: AtomicBool::new(false),
            euid: nix::unistd::geteuid().as_raw(),
            key: bound.key,
            reloads,
            recovered: bound.recovered,
        });
        let stop = CancellationToken::new();
        let tracker = TaskTracker::new();
        tracker.spawn(accept_loop(listener, ctx, stop.clone(), tracker.clone()));
        self.running = Some(Running {
            stop,
            tracker,
            socket: bound.socket,
        });
    }

    /// Stops accepting, waits (bounded) for the connections being served,
    /// and removes the socket file. A connection still served after
    /// [`STOP_LIMIT`] (a snapshot still copying) is left to
    /// [`Admin::after_store_closed`].
    pub async fn stop(&mut self) {
        if let Some(bound) = self.bound.take() {
            remove_socket(&bound.socket);
        }
        let Some(running) = self.running.take() else {
            return;
        };
        running.stop.cancel();
        running.tracker.close();
        if tokio::time::timeout(STOP_LIMIT, running.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                "admin connections still open after {STOP_LIMIT:?}; closing anyway (a snapshot still being written is abandoned and its copy removed)"
            );
            self.leftover = Some(running.tracker);
        }
        remove_socket(&running.socket);
    }

    /// Once the store has closed, a snapshot still being written has been
    /// abandoned by it: waits (bounded) for its connection to remove the
    /// unfinished copy and answer, so that no half-written snapshot is
    /// left when the process ends.
    pub async fn after_store_closed(&mut self) {
        let Some(tracker) = self.leftover.take() else {
            return;
        };
        if tokio::time::timeout(ABANDON_LIMIT, tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                "an admin connection did not end {ABANDON_LIMIT:?} after the store closed; a snapshot destination may be left unfinished (it has no manifest: restore refuses it)"
            );
        }
    }
}

impl Drop for Admin {
    /// A serve that ends before the socket was started (a failed start
    /// after binding) leaves no socket file either.
    fn drop(&mut self) {
        if let Some(bound) = self.bound.take() {
            remove_socket(&bound.socket);
        }
    }
}

fn bind_socket(path: &Path) -> io::Result<(StdListener, Socket)> {
    use std::os::unix::ffi::OsStrExt;
    if path.as_os_str().as_bytes().len() >= SUN_PATH_MAX {
        return Err(io::Error::other(format!(
            "the path is longer than a Unix socket address allows ({} bytes); use a shorter state directory or RuntimeDirectory=",
            SUN_PATH_MAX - 1
        )));
    }
    match fs::symlink_metadata(path) {
        Ok(meta) => {
            let me = nix::unistd::geteuid().as_raw();
            if !meta.file_type().is_socket() || meta.uid() != me {
                return Err(io::Error::other(
                    "something other than our own socket is in the way; remove it by hand",
                ));
            }
            // Ours; is anyone answering on it? Only a dead socket is
            // replaced (the lock says no daemon serves this state
            // directory, but the runtime directory could be shared).
            match std::os::unix::net::UnixStream::connect(path) {
                Ok(_) => {
                    return Err(io::Error::other(
                        "another process is listening on it; is a second daemon sharing the runtime directory?",
                    ));
                }
                Err(_) => {
                    fs::remove_file(path)?;
                    tracing::info!(socket = %path.display(), "replaced the stale admin socket {} of a daemon that did not stop cleanly", path.display());
                }
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = StdListener::bind(path)?;
    // The umask (077) made it 0700 already; 0600 says what it is for.
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
    listener.set_nonblocking(true)?;
    let meta = fs::symlink_metadata(path)?;
    Ok((
        listener,
        Socket {
            path: path.to_path_buf(),
            dev: meta.dev(),
            ino: meta.ino(),
        },
    ))
}

fn remove_socket(socket: &Socket) {
    if let Ok(meta) = fs::symlink_metadata(&socket.path)
        && meta.dev() == socket.dev
        && meta.ino() == socket.ino
    {
        let _ = fs::remove_file(&socket.path);
    }
}

/// What a connection is served from.
struct Context {
    svc: Arc<TaskService>,
    upstreams: Arc<Upstreams>,
    listen: String,
    sessions: Option<Arc<BoundedSessions>>,
    state_dir: PathBuf,
    socket: PathBuf,
    /// The settings the daemon started with: what a snapshot's parts are
    /// checked against.
    config: Arc<Config>,
    started: SystemTime,
    started_mono: Instant,
    snapshot_running: AtomicBool,
    euid: u32,
    /// What every request must present (see the module `admin`).
    key: AdminKey,
    /// To the serving process, which runs reloads one at a time.
    reloads: mpsc::Sender<ReloadReply>,
    /// What restart recovery ended at this start, every kind's.
    recovered: Vec<String>,
}

impl Context {
    /// The daemon's own user and root; nobody else.
    fn permitted(&self, uid: u32) -> bool {
        uid == self.euid || uid == 0
    }
}

async fn accept_loop(
    listener: UnixListener,
    ctx: Arc<Context>,
    stop: CancellationToken,
    tracker: TaskTracker,
) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((stream, _)) => match permits.clone().try_acquire_owned() {
                Ok(permit) => {
                    tracker.spawn(serve(stream, ctx.clone(), stop.clone(), permit));
                }
                Err(_) => {
                    let e = AdminError::new(
                        ExitClass::Unreachable,
                        format!(
                            "the daemon is serving {MAX_CONNECTIONS} admin connections already; try again"
                        ),
                    );
                    refuse_now(&stream, &e);
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, "admin socket: accept failed: {e}");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
}

/// Answers a connection that is not served with one line, without
/// waiting: a peer that does not read gets nothing.
fn refuse_now(stream: &UnixStream, e: &AdminError) {
    let mut line = serde_json::to_vec(&Answer::Error(e.clone())).unwrap_or_default();
    line.push(b'\n');
    let _ = stream.try_write(&line);
}

async fn serve(
    mut stream: UnixStream,
    ctx: Arc<Context>,
    stop: CancellationToken,
    _permit: tokio::sync::OwnedSemaphorePermit,
) {
    // Before anything is read: whose connection is this?
    match stream.peer_cred() {
        Ok(cred) if ctx.permitted(cred.uid()) => {}
        Ok(cred) => {
            tracing::info!(
                uid = cred.uid(),
                pid = cred.pid(),
                "admin connection from uid {} refused: only root and the service user may use the admin socket",
                cred.uid()
            );
            let e = AdminError::new(
                ExitClass::Protocol,
                format!(
                    "permission denied: uid {} may not use the admin socket; run as root or as the service user",
                    cred.uid()
                ),
            );
            refuse_now(&stream, &e);
            return;
        }
        Err(e) => {
            tracing::warn!(error = %e, "admin connection without peer credentials ({e}); closed");
            return;
        }
    }
    let request = tokio::select! {
        _ = stop.cancelled() => return,
        r = tokio::time::timeout(REQUEST_READ_TIMEOUT, read_request(&mut stream)) => r,
    };
    let answer = match request {
        Err(_) => Answer::Error(AdminError::new(
            ExitClass::Protocol,
            format!(
                "no whole request within {} s; closed",
                REQUEST_READ_TIMEOUT.as_secs()
            ),
        )),
        Ok(Err(ReadError::TooLarge)) => Answer::Error(AdminError::new(
            ExitClass::Protocol,
            format!("request longer than {MAX_REQUEST_BYTES} bytes; closed"),
        )),
        Ok(Err(ReadError::Io(_))) => return,
        Ok(Ok(line)) => match super::split_request(&line) {
            // The key first: without it nothing about the request is
            // looked at or told.
            (key, _) if !key.as_deref().is_some_and(|k| ctx.key.matches(k)) => {
                let (uid, pid) = match stream.peer_cred() {
                    Ok(c) => (c.uid(), c.pid().unwrap_or(0)),
                    Err(_) => (u32::MAX, 0),
                };
                tracing::warn!(
                    uid,
                    pid,
                    "admin request from uid {uid} pid {pid} refused: it did not present this start's admin key (a tool of the daemon, or a client that cannot read tasks.lock)"
                );
                Answer::Error(AdminError::new(
                    ExitClass::Protocol,
                    "permission denied: the request did not carry this daemon's admin key; ask with `taskgate status`, `taskgate reload` or `taskgate backup --online` as root or the service user, naming the state directory (--config/--state-dir) so the client can read the key from its tasks.lock",
                ))
            }
            (_, Ok(Request::Status)) => Answer::Status(Box::new(status(&ctx).await)),
            (_, Ok(Request::Snapshot { to })) => snapshot(&ctx, to).await,
            (_, Ok(Request::Reload)) => reload(&ctx, &stop).await,
            (_, Ok(Request::Upstreams { alias: None })) => Answer::Upstreams {
                upstreams: ctx.upstreams.status(false),
            },
            (_, Ok(Request::Upstreams { alias: Some(alias) })) => {
                let one: Vec<_> = ctx
                    .upstreams
                    .status(true)
                    .into_iter()
                    .filter(|u| u.alias == alias)
                    .collect();
                if one.is_empty() {
                    Answer::Error(AdminError::new(
                        ExitClass::Usage,
                        format!(
                            "no upstream {alias:?} is configured; `taskgate upstream list` shows them"
                        ),
                    ))
                } else {
                    Answer::Upstreams { upstreams: one }
                }
            }
            (_, Ok(Request::Routes { id, open })) => routes(&ctx, id, open).await,
            (_, Ok(Request::Approvals { id, pending })) => approvals(&ctx, id, pending),
            (_, Ok(Request::Decide { id, decision })) => {
                let uid = stream.peer_cred().map(|c| c.uid()).unwrap_or(u32::MAX);
                decide(&ctx, id, decision, uid).await
            }
            (_, Err(e)) => Answer::Error(AdminError::new(
                ExitClass::Protocol,
                format!("malformed request: {e}"),
            )),
        },
    };
    // An answer that cannot be encoded is told as such, never as an empty line.
    let mut line = serde_json::to_vec(&answer).unwrap_or_else(|e| {
        tracing::error!(error = %e, "cannot encode an admin answer: {e}");
        serde_json::to_vec(&Answer::Error(AdminError::new(
            ExitClass::Io,
            format!("the daemon could not encode its answer: {e}"),
        )))
        .unwrap_or_default()
    });
    line.push(b'\n');
    let _ = tokio::time::timeout(ANSWER_WRITE_TIMEOUT, async {
        stream.write_all(&line).await?;
        stream.shutdown().await
    })
    .await;
}

enum ReadError {
    TooLarge,
    Io(#[allow(dead_code)] io::Error),
}

/// Reads one request line (without its newline), at most
/// [`MAX_REQUEST_BYTES`] long; a peer that closes after its request
/// without a newline is served too.
async fn read_request(stream: &mut UnixStream) -> Result<Vec<u8>, ReadError> {
    let mut line = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await.map_err(ReadError::Io)?;
        if n == 0 {
            return if line.is_empty() {
                Err(ReadError::Io(io::ErrorKind::UnexpectedEof.into()))
            } else {
                Ok(line)
            };
        }
        line.extend_from_slice(&chunk[..n]);
        if let Some(end) = line.iter().position(|b| *b == b'\n') {
            if end + 1 > MAX_REQUEST_BYTES {
                return Err(ReadError::TooLarge);
            }
            line.truncate(end);
            return Ok(line);
        }
        if line.len() >= MAX_REQUEST_BYTES {
            return Err(ReadError::TooLarge);
        }
    }
}

fn rfc3339(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t)
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

async fn status(ctx: &Context) -> Status {
    let svc = &ctx.svc;
    let store = svc.store();
    let disabled_reason = store.disabled_reason();
    let state = if disabled_reason.is_some() {
        "disabled"
    } else if svc.is_stopping() {
        "stopping"
    } else {
        "serving"
    };
    let tasks = match disabled_reason {
        Some(_) => None,
        None => match tokio::time::timeout(STATS_LIMIT, store.stats()).await {
            Ok(Ok(s)) => Some(TaskCounts {
                retained: s.retained,
                unexpired: s.unexpired,
            }),
            _ => None,
        },
    };
    let f = svc.fallbacks();
    let legacy_sessions = match &ctx.sessions {
        Some(s) => Some(s.open().await),
        None => None,
    };
    Status {
        version: env!("CARGO_PKG_VERSION").to_string(),
        pid: std::process::id(),
        started: rfc3339(ctx.started),
        uptime_secs: ctx.started_mono.elapsed().as_secs(),
        state_dir: ctx.state_dir.clone(),
        listen: ctx.listen.clone(),
        admin_socket: ctx.socket.clone(),
        store: state.to_string(),
        disabled_reason,
        tasks,
        running: svc.running_count(),
        runs_started: svc.runs_started(),
        task_reads: store.task_reads(),
        polls_held: svc.early_polls().0,
        polls_answered_from_memory: svc.early_polls().1,
        queue: Queue {
            depth: store.queued(),
            capacity: store.queue_capacity(),
        },
        wal_bytes: fs::symlink_metadata(ctx.state_dir.join(state_dir::WAL_FILE))
            .map(|m| m.len())
            .unwrap_or(0),
        last_checkpoint: store
            .last_checkpoint_ms()
            .map(|ms| rfc3339(SystemTime::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64))),
        fallbacks: Fallbacks {
            total: f.total(),
            slots_busy: f.slots_busy,
            store_busy: f.store_busy,
            store_capacity: f.store_capacity,
            store_unavailable: f.store_unavailable,
        },
        legacy_sessions,
        snapshot_running: ctx.snapshot_running.load(Ordering::Relaxed),
        confinement: Some(svc.tools().confinement()),
        parts: Parts::new()
            .all()
            .into_iter()
            .map(|part| {
                let dir = part.live_dir(&ctx.state_dir, &ctx.config);
                let footprint = part.footprint(&dir);
                PartStatus {
                    name: part.name().to_string(),
                    dir,
                    files: footprint.files,
                    bytes: footprint.bytes,
                }
            })
            .collect(),
        upstreams: ctx.upstreams.status(false),
        recovered: ctx.recovered.clone(),
        routes: match store.disabled_reason() {
            Some(_) => None,
            None => match tokio::time::timeout(STATS_LIMIT, store.route_counts()).await {
                Ok(Ok(c)) if c.total() > 0 => Some(c),
                _ => None,
            },
        },
        approvals: match svc.approvals() {
            None => None,
            Some(a) => {
                // How far waiting approval tasks reached into the journal:
                // one ending before is older than the task store.
                let needed =
                    match tokio::time::timeout(STATS_LIMIT, store.approval_seq_needed()).await {
                        Ok(Ok(n)) => n,
                        _ => 0,
                    };
                Some(a.status_against(store.clock().now_ms(), needed))
            }
        },
    }
}

fn ms_rfc3339(ms: i64) -> String {
    rfc3339(SystemTime::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64))
}

/// A route as the operator sees it; `binding` only for one route.
fn route_status(ctx: &Context, r: &crate::store::RouteRecord, binding: bool) -> RouteStatus {
    // What the caller reads comes from the router's own view, so the two
    // never disagree.
    let (status, reconciliation_required) = match ctx.svc.router() {
        Some(router) => {
            let (status, needs) = router.reads_as(r);
            (status.as_str(), needs)
        }
        None => match r.phase {
            RoutePhase::Terminal => (r.status.map(|s| s.as_str()).unwrap_or("failed"), false),
            RoutePhase::ReconciliationRequired => ("failed", true),
            _ => ("working", false),
        },
    };
    RouteStatus {
        id: r.id.to_string(),
        owner: r.owner.to_hex()[..8].to_string(),
        upstream: r.upstream.clone(),
        capability: r.capability.clone(),
        phase: r.phase.as_str().to_string(),
        status: status.to_string(),
        reason: r.reason.clone(),
        session: r.session.clone(),
        coordinator: r.coordinator.clone(),
        upstream_task_id: r.upstream_task_id.clone(),
        cancel_reason: r.cancel_reason.clone(),
        cancel_attempts: r.cancel_attempts,
        cancel_acknowledged: r.cancel_acknowledged,
        reconciliation_required,
        route_echo: ctx
            .upstreams
            .route_echo(&r.upstream)
            .map(|e| e.as_str().to_string()),
        decided_by: r.decider.map(|d| d.as_str().to_string()),
        schema_digest: r.schema_digest.clone(),
        request_digest: r.request_digest.to_hex(),
        binding_digest: r.binding_digest.to_hex(),
        created: ms_rfc3339(r.created_ms),
        updated: ms_rfc3339(r.updated_ms),
        deadline: ms_rfc3339(r.deadline_ms),
        expires: ms_rfc3339(r.expires_ms),
        binding: binding.then(|| r.binding_json()),
    }
}

/// The durable routes, or the one `id` names.
async fn routes(ctx: &Context, id: Option<String>, open: bool) -> Answer {
    let store = ctx.svc.store();
    let unavailable = |e: crate::store::StoreError| {
        Answer::Error(AdminError::new(
            ExitClass::CallFailed,
            format!("the store could not read the routes: {e}"),
        ))
    };
    match id {
        Some(id) => {
            let Some(parsed) = crate::store::RouteId::parse(&id) else {
                return Answer::Error(AdminError::new(
                    ExitClass::Usage,
                    format!("{id:?} is not a route ID (tgr- and 32 hex digits)"),
                ));
            };
            match store.route(&parsed).await {
                Ok(Some(r)) => Answer::Routes {
                    routes: vec![route_status(ctx, &r, true)],
                },
                Ok(None) => Answer::Error(AdminError::new(
                    ExitClass::CallFailed,
                    format!("no unexpired route {id}"),
                )),
                Err(e) => unavailable(e),
            }
        }
        None => match store.list_routes(MAX_LISTED_ROUTES, open).await {
            Ok(all) => Answer::Routes {
                routes: all.iter().map(|r| route_status(ctx, r, false)).collect(),
            },
            Err(e) => unavailable(e),
        },
    }
}

fn no_approvals() -> Answer {
    Answer::Error(AdminError::new(
        ExitClass::Usage,
        "approvals are not set up in this daemon: no [[tool]] or [upstream.tools.NAME] has approval = \"required\" and no approval journal exists",
    ))
}

fn refused(e: crate::tasks::AdminRefusal) -> Answer {
    use crate::tasks::AdminRefusal as R;
    let class = match &e {
        R::Disabled(_) | R::Unknown(_) | R::Refused(_) => ExitClass::CallFailed,
        R::Failed(_) => ExitClass::Io,
    };
    Answer::Error(AdminError::new(class, e.to_string()))
}

/// The proposals (or the one `id` names) and the journal's state; with
/// approvals disabled, none and the reason.
fn approvals(ctx: &Context, id: Option<String>, pending: bool) -> Answer {
    let Some(approvals) = ctx.svc.approvals() else {
        return no_approvals();
    };
    let now = ctx.svc.store().clock().now_ms();
    let journal = approvals.status(now);
    match approvals.proposals(id.as_deref(), pending, now) {
        Ok(proposals) => Answer::Approvals { proposals, journal },
        Err(crate::tasks::AdminRefusal::Disabled(_)) if id.is_none() => Answer::Approvals {
            proposals: Vec::new(),
            journal,
        },
        Err(e) => refused(e),
    }
}

/// Journals an administrator's decision; the decider is the peer's uid.
async fn decide(ctx: &Context, id: String, decision: super::Decision, uid: u32) -> Answer {
    let Some(approvals) = ctx.svc.approvals() else {
        return no_approvals();
    };
    let now = ctx.svc.store().clock().now_ms();
    let decider = crate::tasks::Decider {
        name: format!("uid {uid} (admin socket)"),
        identity: format!("uid:{uid}"),
    };
    match approvals.decide(&id, decision, decider, now).await {
        Ok(p) => Answer::Approvals {
            proposals: vec![p],
            journal: approvals.status(now),
        },
        Err(e) => refused(e),
    }
}

/// Asks the serving process for a reload and waits for its outcome. The
/// process runs one reload at a time, SIGHUP's and these alike; once it
/// stops, a request still waiting is answered that nothing was reloaded.
async fn reload(ctx: &Context, stop: &CancellationToken) -> Answer {
    let stopping = || {
        Answer::Error(AdminError::new(
            ExitClass::Unreachable,
            "the daemon is stopping; nothing was reloaded (a start reads the file anyway)",
        ))
    };
    if ctx.svc.is_stopping() {
        return stopping();
    }
    let (reply, outcome) = oneshot::channel();
    if ctx.reloads.send(reply).await.is_err() {
        return stopping();
    }
    tokio::select! {
        _ = stop.cancelled() => stopping(),
        outcome = outcome => match outcome {
            Ok(Ok(done)) => Answer::Reload(done),
            Ok(Err(refused)) => Answer::Error(refused),
            Err(_) => stopping(),
        },
    }
}

/// Clears the running flag however the snapshot ends.
struct SnapshotFlag<'a>(&'a AtomicBool);

impl Drop for SnapshotFlag<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

fn backup_error(e: BackupError) -> AdminError {
    let read_only = matches!(&e, BackupError::Io { source, .. }
        if matches!(source.raw_os_error(), Some(libc::EROFS | libc::EACCES)));
    let hint = if read_only {
        "; the service may write only where its unit allows (the packaged unit: under /var/backups/taskgate; elsewhere add ReadWritePaths= in a drop-in)"
    } else {
        ""
    };
    AdminError::new(e.exit_class(), format!("{e}{hint}"))
}

async fn snapshot(ctx: &Arc<Context>, to: PathBuf) -> Answer {
    if ctx
        .snapshot_running
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return Answer::Error(AdminError::new(
            ExitClass::Unreachable,
            "a snapshot is already being written; try again once it is done",
        ));
    }
    let _running = SnapshotFlag(&ctx.snapshot_running);
    if ctx.svc.is_stopping() {
        return Answer::Error(AdminError::new(
            ExitClass::Unreachable,
            "the daemon is stopping; take an offline backup (`taskgate backup`) once it has stopped",
        ));
    }
    if let Some(reason) = ctx.svc.store().disabled_reason() {
        return Answer::Error(AdminError::new(
            ExitClass::CallFailed,
            format!(
                "the task store is disabled ({reason}); stop the daemon and take an offline backup"
            ),
        ));
    }
    // Destination checks, then an empty private file for each file the
    // serving process writes itself: nothing else is done before they pass.
    let state_dir = ctx.state_dir.clone();
    let prepared = tokio::task::spawn_blocking(move || -> Result<PathBuf, BackupError> {
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
    .await;
    let dest = match prepared {
        Ok(Ok(dest)) => dest,
        Ok(Err(e)) => return Answer::Error(backup_error(e)),
        Err(e) => {
            return Answer::Error(AdminError::new(ExitClass::Io, e.to_string()));
        }
    };
    let discard = |dest: &Path| {
        // Ours alone: made above, private, never handed out.
        if let Err(e) = fs::remove_dir_all(dest) {
            tracing::warn!(dest = %dest.display(), error = %e, "cannot remove the unfinished snapshot {}: {e}", dest.display());
        }
    };
    let started = Instant::now();
    // The task store's database, copied by the store's own thread while it
    // serves.
    let copied = match ctx
        .svc
        .store()
        .snapshot(&dest.join(state_dir::DB_FILE))
        .await
    {
        Ok(r) => r,
        Err(e) => {
            discard(&dest);
            return Answer::Error(AdminError::new(
                ExitClass::CallFailed,
                format!("the snapshot failed: {e}; nothing was kept"),
            ));
        }
    };
    let db_time = started.elapsed();
    let (state_dir, sealed_dest, config) =
        (ctx.state_dir.clone(), dest.clone(), ctx.config.clone());
    let gate = ctx.svc.approvals().and_then(|a| a.gate().cloned());
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
            let mut lines = sealed.lines(&ctx.state_dir, &dest);
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
            Answer::Snapshot(SnapshotDone { dest, lines })
        }
        Ok(Err(e)) => {
            discard(&dest);
            Answer::Error(backup_error(e))
        }
        Err(e) => {
            discard(&dest);
            Answer::Error(AdminError::new(ExitClass::Io, e.to_string()))
        }
    }
}
