//! The daemon's side of the admin socket: the connection's checks (peer
//! uid, the admin key, the request's bounds), then each request is an
//! operation of [`crate::ops`], whose result or refusal (with the exit
//! class ops decided) is the answer line.

use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener as StdListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{
    ANSWER_WRITE_TIMEOUT, AdminError, AdminKey, Answer, MAX_CONNECTIONS, MAX_REQUEST_BYTES,
    REQUEST_READ_TIMEOUT, ReloadReply, Request, Status,
};
use crate::ops::{Listing, Ops, OpsError, Serving, StatusReport, StoreState, View};
use crate::state_dir::LifetimeLock;

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
    pub fn bind(lock: &mut LifetimeLock, state_dir: &Path) -> Admin {
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

    /// Starts serving the socket (inside the runtime), and tells `ops`
    /// that the daemon serves on `listen`. A `reload` request is passed to
    /// the serving process through `reloads`.
    pub fn start(&mut self, ops: Arc<Ops>, listen: String, reloads: mpsc::Sender<ReloadReply>) {
        let socket = match &self.bound {
            Some(b) => b.socket.path.clone(),
            None => PathBuf::new(),
        };
        ops.serve(Serving {
            listen,
            admin_socket: socket,
            reloads,
        });
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
            ops,
            euid: nix::unistd::geteuid().as_raw(),
            key: bound.key,
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
    /// Every request is an operation; this socket only renders its result.
    ops: Arc<Ops>,
    euid: u32,
    /// What every request must present (see the module `admin`).
    key: AdminKey,
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
                    let e = OpsError::Busy(format!(
                        "the daemon is serving {MAX_CONNECTIONS} admin connections already; try again"
                    ));
                    refuse_now(&stream, &AdminError::from(&e));
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
            let e = OpsError::Denied(format!(
                "permission denied: uid {} may not use the admin socket; run as root or as the service user",
                cred.uid()
            ));
            refuse_now(&stream, &AdminError::from(&e));
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
    let ops = &ctx.ops;
    let refused = |e: OpsError| Answer::Error(AdminError::from(&e));
    let answer = match request {
        Err(_) => refused(OpsError::RequestTimeout(format!(
            "no whole request within {} s; closed",
            REQUEST_READ_TIMEOUT.as_secs()
        ))),
        Ok(Err(ReadError::TooLarge)) => refused(OpsError::RequestTooLarge(format!(
            "request longer than {MAX_REQUEST_BYTES} bytes; closed"
        ))),
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
                refused(OpsError::Denied(
                    "permission denied: the request did not carry this daemon's admin key; ask with `taskgate status`, `taskgate reload` or `taskgate backup --online` as root or the service user, naming the state directory (--config/--state-dir) so the client can read the key from its tasks.lock".into(),
                ))
            }
            (_, Ok(Request::Status)) => {
                Answer::Status(Box::new(render_status(&ops.status(View::Operator).await)))
            }
            (_, Ok(Request::Snapshot { to })) => answer(ops.snapshot(to).await, Answer::Snapshot),
            (_, Ok(Request::Reload)) => answer(ops.reload(&stop).await, Answer::Reload),
            (_, Ok(Request::Upstreams { alias })) => {
                answer(ops.upstreams(alias.as_deref()), |upstreams| {
                    Answer::Upstreams { upstreams }
                })
            }
            (_, Ok(Request::Routes { id, open })) => {
                answer(ops.routes(id.as_deref(), open).await, |routes| {
                    Answer::Routes { routes }
                })
            }
            (_, Ok(Request::Approvals { id, pending })) => {
                answer(ops.approvals(id.as_deref(), pending), approvals)
            }
            (_, Ok(Request::Decide { id, decision })) => {
                // The decider is the peer's uid.
                let uid = stream.peer_cred().map(|c| c.uid()).unwrap_or(u32::MAX);
                let decider = crate::tasks::Decider {
                    name: format!("uid {uid} (admin socket)"),
                    identity: format!("uid:{uid}"),
                };
                answer(ops.decide(&id, decision, decider).await, approvals)
            }
            (_, Err(e)) => refused(OpsError::BadRequest(format!("malformed request: {e}"))),
        },
    };
    // An answer that cannot be encoded is told as such, never as an empty line.
    let mut line = serde_json::to_vec(&answer).unwrap_or_else(|e| {
        tracing::error!(error = %e, "cannot encode an admin answer: {e}");
        serde_json::to_vec(&Answer::Error(AdminError::from(&OpsError::Internal(
            format!("the daemon could not encode its answer: {e}"),
        ))))
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

/// The proposals and the journal's state, as the socket answers them.
fn approvals(l: Listing) -> Answer {
    Answer::Approvals {
        proposals: l.proposals,
        journal: l.journal,
    }
}

/// The socket's answer to an ops result: its value, or the refusal with
/// the exit class ops decided.
fn answer<T>(result: Result<T, OpsError>, make: impl FnOnce(T) -> Answer) -> Answer {
    match result {
        Ok(v) => make(v),
        Err(e) => Answer::Error(AdminError::from(&e)),
    }
}

/// What `taskgate status` shows, rendered from the ops status.
pub fn render_status(r: &StatusReport) -> Status {
    Status {
        version: r.version.to_string(),
        pid: r.pid,
        started: rfc3339(r.started),
        uptime_secs: r.uptime.as_secs(),
        state_dir: r.state_dir.clone(),
        listen: r.listen.clone(),
        admin_socket: r.admin_socket.clone(),
        store: r.store.as_str().to_string(),
        disabled_reason: match &r.store {
            StoreState::Disabled(reason) => Some(reason.clone()),
            _ => None,
        },
        tasks: r.tasks,
        running: r.running,
        runs_started: r.runs_started,
        task_reads: r.task_reads,
        polls_held: r.polls_held,
        polls_answered_from_memory: r.polls_answered_from_memory,
        queue: r.queue,
        wal_bytes: r.wal_bytes,
        last_checkpoint: r
            .last_checkpoint_ms
            .map(|ms| rfc3339(SystemTime::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64))),
        fallbacks: r.fallbacks,
        legacy_sessions: r.legacy_sessions,
        snapshot_running: r.snapshot_running,
        confinement: Some(r.confinement.clone()),
        parts: r.parts.clone(),
        upstreams: r.upstreams.clone(),
        recovered: r.recovered.clone(),
        // Shown only when some are held.
        routes: r.routes.clone().filter(|c| c.total() > 0),
        approvals: r.approvals.as_ref().map(|a| a.journal.clone()),
    }
}

fn rfc3339(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t)
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}
