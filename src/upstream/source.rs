//! One upstream: a supervisor that connects (the discover lifecycle,
//! falling back to a legacy `initialize`), lists the tools, publishes what
//! it found as a [`Snapshot`], watches the connection and makes it again
//! with backoff when it is lost. Calls read the snapshot; they never wait
//! for a connection.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use rmcp::model::{
    ClientCapabilities, ClientConfig as ClientInfo, Implementation, PaginatedRequestParams,
    ProtocolVersion,
};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt, Peer, RoleClient};
use serde_json::Value;
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;

use super::pins::Pins;
use super::tool::{Capability, PinState, UpstreamTool};
use super::transport::{self, Refusal, Refused};
use crate::config::{UpstreamConfig, UpstreamTransport};

/// The first wait after a failed connection; it doubles to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// How often a connected upstream's tools are listed again even when it
/// says nothing of a change: an upstream that changes a tool without
/// `notifications/tools/list_changed` is found out within this time.
const RELIST_INTERVAL: Duration = Duration::from_secs(300);

/// Most pages of a tool list read (an upstream that pages forever, or
/// one tool a page, meets `max_tools` or this).
const MAX_LIST_PAGES: usize = 1024;

/// Where an upstream stands, as `status` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Making the first connection, or again after one was lost.
    Connecting,
    /// Connected and listed: its tools are served.
    Ready,
    /// The last attempt failed; the next is due after the backoff.
    Unavailable,
    /// Removed by a reload, or the daemon is stopping.
    Stopped,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Connecting => "connecting",
            State::Ready => "ready",
            State::Unavailable => "unavailable",
            State::Stopped => "stopped",
        }
    }
}

/// One connection that answered: the session its tools are called on.
pub struct Session {
    /// Random, minted per connection (2026-07-28 has no session id of
    /// its own): a reconnect is a new session.
    pub id: String,
    pub peer: Peer<RoleClient>,
    /// The protocol version negotiated.
    pub version: String,
    /// Whether the upstream advertised the Tasks extension.
    pub tasks: bool,
    pub server: Option<String>,
    /// The tools as listed, before the operator's settings and pins.
    listed: Vec<rmcp::model::Tool>,
    /// Why taskgate closed it, if it did.
    pub refusal: Arc<Refusal>,
    /// `max_concurrent_requests`.
    pub requests: Arc<Semaphore>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.id)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

/// What an upstream offers now, as calls and `status` read it.
#[derive(Debug)]
pub struct Snapshot {
    pub state: State,
    pub session: Option<Arc<Session>>,
    /// Its capabilities under the operator's settings and pins, by the name
    /// a caller uses (`alias.tool`).
    pub catalog: HashMap<String, Arc<Capability>>,
    pub last_error: Option<String>,
    /// When `state` last changed.
    pub since: SystemTime,
}

/// The part of an upstream its supervisor, its tools and `status` share.
#[derive(Debug)]
pub struct Shared {
    config: RwLock<Arc<UpstreamConfig>>,
    pins: RwLock<Arc<Pins>>,
    snapshot: RwLock<Arc<Snapshot>>,
    /// Held from reading the old snapshot to writing the new one, so that
    /// the supervisor's news and a reload's settings never overwrite each
    /// other (nothing is awaited under it).
    publishing: Mutex<()>,
    /// Set once a reload removed the upstream: calls still holding one of
    /// its tools are told so rather than that it is busy.
    pub retiring: std::sync::atomic::AtomicBool,
}

fn read<T: Clone>(lock: &RwLock<T>) -> T {
    lock.read().unwrap_or_else(|p| p.into_inner()).clone()
}

fn write<T>(lock: &RwLock<T>, value: T) {
    *lock.write().unwrap_or_else(|p| p.into_inner()) = value;
}

impl Shared {
    pub fn config(&self) -> Arc<UpstreamConfig> {
        read(&self.config)
    }

    pub fn snapshot(&self) -> Arc<Snapshot> {
        read(&self.snapshot)
    }

    /// Publishes a new state, the catalog rebuilt from `session`.
    fn publish(
        self: &Arc<Self>,
        state: State,
        session: Option<Arc<Session>>,
        error: Option<String>,
    ) {
        let _one_at_a_time = self.publishing.lock().unwrap_or_else(|p| p.into_inner());
        let catalog = match &session {
            Some(s) => self.catalog(s),
            None => HashMap::new(),
        };
        let old = self.snapshot();
        let since = if old.state == state {
            old.since
        } else {
            SystemTime::now()
        };
        let alias = &self.config().alias;
        crate::metrics::get().upstream_state(alias, state == State::Ready);
        if error.is_some() {
            crate::metrics::get().upstream_error(alias);
        }
        write(
            &self.snapshot,
            Arc::new(Snapshot {
                state,
                session,
                catalog,
                last_error: error.or_else(|| old.last_error.clone()),
                since,
            }),
        );
    }

    /// The settings and pins changed without the connection changing
    /// (a reload): the catalog is rebuilt, the session kept.
    /// Returns whether anything that decides its tools changed.
    pub fn adopt(self: &Arc<Self>, config: Arc<UpstreamConfig>, pins: Arc<Pins>) -> bool {
        let alias = config.alias.clone();
        let changed = *self.config() != *config || read(&self.pins).of(&alias) != pins.of(&alias);
        write(&self.config, config);
        write(&self.pins, pins);
        if changed {
            // Under the same lock as the supervisor's publications: the
            // session current now is the one the catalog is built from.
            let _one_at_a_time = self.publishing.lock().unwrap_or_else(|p| p.into_inner());
            let old = self.snapshot();
            let catalog = match &old.session {
                Some(s) => self.catalog(s),
                None => HashMap::new(),
            };
            write(
                &self.snapshot,
                Arc::new(Snapshot {
                    state: old.state,
                    session: old.session.clone(),
                    catalog,
                    last_error: old.last_error.clone(),
                    since: old.since,
                }),
            );
        }
        changed
    }

    /// Every listed tool under the operator's settings and the pins.
    fn catalog(self: &Arc<Self>, session: &Arc<Session>) -> HashMap<String, Arc<Capability>> {
        let config = self.config();
        let pins = read(&self.pins);
        let mut out = HashMap::new();
        for tool in &session.listed {
            let cap = Capability::new(&config, tool, pins.get(&config.alias, &tool.name));
            if let PinState::Differs { pinned } = &cap.pin {
                tracing::warn!(
                    upstream = %config.alias,
                    tool = %tool.name,
                    "upstream {} changed its tool {} since it was pinned (pinned {pinned}, now {}): withheld from callers until the operator reviews it (taskgate upstream show {}) and pins it again",
                    config.alias, tool.name, cap.digest, config.alias
                );
            }
            let runner = UpstreamTool::new(&cap, self.clone());
            let cap = Arc::new(Capability {
                tool: runner.map(Arc::new),
                ..cap
            });
            out.insert(cap.name.clone(), cap);
        }
        out
    }
}

/// The client side of one connection: who taskgate says it is, and a
/// nudge to the supervisor when the upstream's tool list changed.
#[derive(Clone)]
struct Client {
    info: ClientInfo,
    changed: Arc<Notify>,
}

impl ClientHandler for Client {
    fn get_info(&self) -> ClientInfo {
        self.info.clone()
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.changed.notify_one();
    }
}

fn client_info() -> ClientInfo {
    let mut info = ClientInfo::default();
    info.client_info = Implementation::new("taskgate", env!("CARGO_PKG_VERSION"));
    // Calls are plain tool calls: taskgate makes a task of them itself
    // when the operator asks; it asks no upstream for one (yet).
    info.capabilities = ClientCapabilities::default();
    info
}

/// A random session id: 16 bytes as hex.
fn session_id() -> String {
    let mut bytes = [0u8; 16];
    if getrandom::fill(&mut bytes).is_err() {
        // Unique enough for a label when the kernel has no randomness to give.
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        bytes.copy_from_slice(&nanos.to_le_bytes());
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One live connection, with what must be stopped with it.
struct Connection {
    running: RunningService<RoleClient, Client>,
    server: Option<crate::tools::process::Server>,
    session: Arc<Session>,
}

async fn connect(
    config: &UpstreamConfig,
    protected: &[PathBuf],
    changed: Arc<Notify>,
) -> Result<Connection, String> {
    let client = Client {
        info: client_info(),
        changed,
    };
    let lifecycle = ClientLifecycleMode::Auto {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        legacy_version: Some(ProtocolVersion::V_2025_11_25),
    };
    let refusal = Arc::new(Refusal::default());
    let limit = usize::try_from(config.limits.max_response_bytes).unwrap_or(usize::MAX);
    let (running, server) = match &config.transport {
        UpstreamTransport::Stdio(_) => {
            let child = transport::spawn(config, protected, refusal.clone())?;
            let io =
                rmcp::transport::async_rw::AsyncRwTransport::new_client(child.stdout, child.stdin)
                    .with_max_line_length(limit.saturating_add(1));
            let running = client
                .serve_with_lifecycle(io, lifecycle)
                .await
                .map_err(|e| describe_init(&causes(&e), &refusal, config))?;
            (running, Some(child.server))
        }
        UpstreamTransport::Http {
            url,
            bearer_token_file,
            ca_file,
        } => {
            use rmcp::transport::streamable_http_client::{
                StreamableHttpClientTransport, StreamableHttpClientTransportConfig,
            };
            let http =
                transport::http_client(url, ca_file.as_deref(), config.limits.connect_timeout)?;
            let mut settings = StreamableHttpClientTransportConfig::with_uri(url.as_str());
            settings.max_concurrent_requests = config.limits.max_concurrent_requests;
            settings.max_json_response_size = limit;
            settings.max_sse_event_size = limit;
            settings.allow_stateless = true;
            settings.reinit_on_expired_session = false;
            if let Some(file) = bearer_token_file {
                settings.auth_header =
                    Some(transport::bearer(file, &config.alias).map_err(|e| e.to_string())?);
            }
            let io = StreamableHttpClientTransport::with_client(http.clone(), settings);
            let running = match client.serve_with_lifecycle(io, lifecycle).await {
                Ok(running) => running,
                Err(e) => {
                    let said = describe_init(&causes(&e), &refusal, config);
                    return Err(match unreachable_because(&http, url).await {
                        Some(why) => format!("{said} ({why})"),
                        None => said,
                    });
                }
            };
            (running, None)
        }
    };
    let peer = running.peer().clone();
    // rmcp would cache tool lists for the upstream's ttlMs (and serve a
    // stale one on error): each listing here must be the upstream's now.
    peer.set_response_cache_config(rmcp::ClientCacheConfig::disabled())
        .await;
    let info = peer.peer_info();
    let listed = list_tools(
        &peer,
        config.limits.max_tools,
        config.limits.max_response_bytes,
    )
    .await
    .map_err(|e| match refusal.get() {
        Some(_) => describe_init(&e, &refusal, config),
        None => e,
    })?;
    let session = Arc::new(Session {
        id: session_id(),
        version: info
            .as_ref()
            .map(|i| i.protocol_version.to_string())
            .unwrap_or_default(),
        tasks: info
            .as_ref()
            .is_some_and(|i| i.capabilities.supports_tasks()),
        server: info.as_ref().and_then(|i| {
            i.server_info
                .as_ref()
                .map(|s| format!("{} {}", s.name, s.version))
        }),
        peer,
        listed,
        refusal,
        requests: Arc::new(Semaphore::new(config.limits.max_concurrent_requests)),
    });
    Ok(Connection {
        running,
        server,
        session,
    })
}

/// An error and its causes, as one line for an operator: the client
/// library says "error sending request" and keeps why (a refused
/// connection, an unknown certificate issuer) in its sources. Its own type
/// names are left out.
fn causes(e: &dyn std::error::Error) -> String {
    let mut parts = vec![e.to_string()];
    let mut next = e.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if parts.last().is_none_or(|last| !last.contains(&text)) {
            parts.push(text);
        }
        next = cause.source();
        if parts.len() >= 8 {
            break;
        }
    }
    let line = parts.join(": ");
    // "Transport [rmcp::transport::worker::WorkerTransport<…>] error:" names
    // a type, not a cause.
    match (line.find("Transport ["), line.find("] error: ")) {
        (Some(start), Some(end)) if start < end => {
            format!("{}{}", &line[..start], &line[end + "] error: ".len()..])
        }
        _ => line,
    }
}

/// Why a failed handshake could not reach the server at all, when that is
/// what happened: the MCP client keeps only "error sending request", so a
/// plain request says what stood in the way (a refused connection, a
/// certificate no trusted authority signed).
async fn unreachable_because(http: &reqwest::Client, url: &str) -> Option<String> {
    let probe = http.get(url).header("accept", "text/event-stream").send();
    match tokio::time::timeout(Duration::from_secs(3), probe).await {
        Ok(Err(e)) => {
            let why = causes(&e);
            Some(match why.find(": ") {
                // reqwest's first words repeat the URL; its causes do not.
                Some(i) if why.starts_with("error sending request") => why[i + 2..].to_string(),
                _ => why,
            })
        }
        _ => None,
    }
}

fn describe_init(error: &str, refusal: &Refusal, config: &UpstreamConfig) -> String {
    match refusal.get() {
        Some(Refused::Oversized) => format!(
            "an answer to the handshake or the tool list was larger than max_response_bytes = {}",
            config.limits.max_response_bytes
        ),
        Some(Refused::NotJson) => "the upstream wrote something that is not JSON-RPC".into(),
        Some(Refused::TooManyTools) => too_many_tools(config.limits.max_tools),
        None => format!("handshake failed: {error}"),
    }
}

fn too_many_tools(max_tools: usize) -> String {
    format!(
        "it lists more than max_tools = {max_tools} tools; none of them is served (raise max_tools in its [[upstream]] table if that many are expected)"
    )
}

/// Every tool, page by page, refused whole past `max_tools`, or when the
/// tools listed come to more than `max_bytes` (`max_response_bytes`) in
/// all: each page is bounded by it on the wire, and so is the whole list,
/// so that many small pages cannot add up to what one page may not be.
async fn list_tools(
    peer: &Peer<RoleClient>,
    max_tools: usize,
    max_bytes: u64,
) -> Result<Vec<rmcp::model::Tool>, String> {
    let mut tools = Vec::new();
    let mut bytes = 0u64;
    let mut cursor: Option<String> = None;
    for _ in 0..MAX_LIST_PAGES {
        let params = cursor.take().map(|c| {
            let mut p = PaginatedRequestParams::default();
            p.cursor = Some(c);
            p
        });
        let page = peer
            .list_tools(params)
            .await
            .map_err(|e| format!("tools/list failed: {e}"))?;
        bytes += serde_json::to_vec(&page.tools)
            .map(|v| v.len() as u64)
            .unwrap_or(u64::MAX);
        tools.extend(page.tools);
        if tools.len() > max_tools {
            return Err(too_many_tools(max_tools));
        }
        if bytes > max_bytes {
            return Err(format!(
                "its tool list comes to more than max_response_bytes = {max_bytes} bytes in all; none of its tools is served (raise max_response_bytes in its [[upstream]] table if a list that large is expected)"
            ));
        }
        match page.next_cursor {
            Some(next) if !next.is_empty() => cursor = Some(next),
            _ => return Ok(tools),
        }
    }
    Err(format!(
        "its tool list did not end within {MAX_LIST_PAGES} pages"
    ))
}

/// A running upstream: its shared part and the supervisor's stop.
#[derive(Debug)]
pub struct Source {
    pub shared: Arc<Shared>,
    stop: CancellationToken,
    done: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Source {
    /// Starts the supervisor; it connects in the background.
    pub fn start(
        config: Arc<UpstreamConfig>,
        pins: Arc<Pins>,
        protected: Arc<RwLock<Arc<Vec<PathBuf>>>>,
        stop: CancellationToken,
    ) -> Source {
        let shared = Arc::new(Shared {
            config: RwLock::new(config),
            pins: RwLock::new(pins),
            publishing: Mutex::new(()),
            retiring: std::sync::atomic::AtomicBool::new(false),
            snapshot: RwLock::new(Arc::new(Snapshot {
                state: State::Connecting,
                session: None,
                catalog: HashMap::new(),
                last_error: None,
                since: SystemTime::now(),
            })),
        });
        let task = tokio::spawn(supervise(shared.clone(), protected, stop.clone()));
        Source {
            shared,
            stop,
            done: Mutex::new(Some(task)),
        }
    }

    /// Lets the calls in flight finish (each within its request timeout),
    /// then stops: what a reload does to an upstream it removes, as a
    /// removed command tool's running calls finish too.
    pub async fn retire(&self) {
        self.shared
            .retiring
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let snapshot = self.shared.snapshot();
        if let Some(session) = &snapshot.session {
            let limits = self.shared.config().limits.clone();
            let all = u32::try_from(limits.max_concurrent_requests).unwrap_or(u32::MAX);
            tokio::select! {
                _ = tokio::time::timeout(limits.request_timeout, session.requests.acquire_many(all)) => {}
                _ = self.stop.cancelled() => {}
            }
        }
        self.stop().await;
    }

    /// Stops the supervisor and closes the connection; calls in flight on
    /// it end with a lost connection.
    pub async fn stop(&self) {
        self.stop.cancel();
        let task = self.done.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

async fn supervise(
    shared: Arc<Shared>,
    protected: Arc<RwLock<Arc<Vec<PathBuf>>>>,
    stop: CancellationToken,
) {
    let mut backoff = FIRST_BACKOFF;
    loop {
        let config = shared.config();
        // Read at each attempt: a reload may have protected more (a new
        // upstream's credential file).
        let protected = read(&protected);
        let alias = config.alias.clone();
        let changed = Arc::new(Notify::new());
        shared.publish(State::Connecting, None, None);
        // On a task of its own: a panic in the client libraries is one
        // failed attempt, never a dead supervisor.
        let mut attempt = tokio::spawn({
            let (config, protected, changed) = (config.clone(), protected.clone(), changed.clone());
            async move { connect(&config, &protected, changed).await }
        });
        let outcome = tokio::select! {
            _ = stop.cancelled() => {
                attempt.abort();
                break;
            }
            r = tokio::time::timeout(config.limits.connect_timeout, &mut attempt) => r,
        };
        let error = match outcome {
            Err(_) => {
                attempt.abort();
                format!(
                    "no answer to the handshake and tool list within connect_timeout_secs = {}",
                    config.limits.connect_timeout.as_secs()
                )
            }
            Ok(Err(join)) => {
                tracing::error!(upstream = %alias, "connecting to upstream {alias} failed inside taskgate: {join}");
                format!("connecting failed inside taskgate ({join}); see the daemon's log")
            }
            Ok(Ok(Err(e))) => e,
            Ok(Ok(Ok(conn))) => {
                backoff = FIRST_BACKOFF;
                let session = conn.session.clone();
                tracing::info!(
                    upstream = %alias,
                    session = %session.id,
                    version = %session.version,
                    tasks = session.tasks,
                    tools = session.listed.len(),
                    "upstream {alias} connected (session {}, protocol {}, {} tools{})",
                    session.id,
                    session.version,
                    session.listed.len(),
                    if session.tasks { ", advertises Tasks" } else { "" }
                );
                shared.publish(State::Ready, Some(session), None);
                let lost = serve(&shared, conn, &changed, &stop).await;
                match lost {
                    None => break,
                    Some(e) => e,
                }
            }
        };
        tracing::warn!(upstream = %alias, "upstream {alias} unavailable: {error}; trying again in {} s", backoff.as_secs());
        shared.publish(State::Unavailable, None, Some(error));
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
    shared.publish(State::Stopped, None, None);
}

/// Keeps a connection until it is lost (`Some(why)`) or the upstream is
/// stopped (`None`); a changed tool list is read again meanwhile.
async fn serve(
    shared: &Arc<Shared>,
    conn: Connection,
    changed: &Notify,
    stop: &CancellationToken,
) -> Option<String> {
    let Connection {
        running,
        server,
        session,
    } = conn;
    let cancel = running.cancellation_token();
    let mut waiting = tokio::spawn(running.waiting());
    let lost = loop {
        let relist = tokio::time::sleep(RELIST_INTERVAL);
        tokio::select! {
            _ = stop.cancelled() => break None,
            _ = &mut waiting => break Some(match session.refusal.get() {
                Some(Refused::Oversized) => "it sent a message larger than max_response_bytes; the connection was closed".to_string(),
                Some(Refused::NotJson) => "it sent something that is not JSON-RPC; the connection was closed".to_string(),
                Some(Refused::TooManyTools) => "its tool list grew past max_tools; the connection was closed".to_string(),
                None => "the connection ended".to_string(),
            }),
            _ = async { tokio::select! { _ = changed.notified() => {}, _ = relist => {} } } => {
                let config = shared.config();
                match tokio::time::timeout(
                    config.limits.connect_timeout,
                    list_tools(
                        &session.peer,
                        config.limits.max_tools,
                        config.limits.max_response_bytes,
                    ),
                ).await {
                    Ok(Ok(listed)) => {
                        let fresh = Arc::new(Session {
                            id: session.id.clone(),
                            peer: session.peer.clone(),
                            version: session.version.clone(),
                            tasks: session.tasks,
                            server: session.server.clone(),
                            listed,
                            refusal: session.refusal.clone(),
                            requests: session.requests.clone(),
                        });
                        shared.publish(State::Ready, Some(fresh), None);
                    }
                    Ok(Err(e)) => break Some(e),
                    Err(_) => break Some("its changed tool list did not arrive within connect_timeout_secs".into()),
                }
            }
        }
    };
    cancel.cancel();
    if !waiting.is_finished() {
        let _ = tokio::time::timeout(Duration::from_secs(5), &mut waiting).await;
        waiting.abort();
    }
    let mut lost = lost;
    if let Some(mut server) = server {
        // How the program ended says more than a closed pipe (a resource
        // limit's signal, a crash, an exit status).
        if let (Some(why), Ok(Some(status))) = (lost.as_mut(), server.child.try_wait()) {
            use std::os::unix::process::ExitStatusExt;
            match (status.code(), status.signal()) {
                (Some(code), _) => {
                    why.push_str(&format!("; the program exited with status {code}"))
                }
                (None, Some(sig)) => why.push_str(&format!(
                    "; the program was killed by signal {sig}{}",
                    match sig {
                        libc::SIGXCPU => " (max_cpu_secs)",
                        libc::SIGXFSZ => " (max_file_bytes)",
                        _ => "",
                    }
                )),
                _ => {}
            }
        }
        server.stop(Duration::from_secs(2)).await;
    }
    lost
}

/// The listed tool's description as JSON, for `upstream show`.
pub fn described(tool: &rmcp::model::Tool) -> Value {
    serde_json::to_value(tool).unwrap_or(Value::Null)
}
