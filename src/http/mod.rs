//! The HTTP face of the daemon: MCP streamable HTTP at `/mcp`, `/healthz`
//! (the process answers) and `/readyz` (the task store is open and not
//! latched disabled, the daemon is not stopping, and `/mcp` has a free
//! request slot of each kind). Connections and concurrent requests are
//! bounded; past either bound a client gets a clear 503 at once. Requests
//! have two budgets: `tools/call` (which may run a tool for as long as it
//! takes) and everything else (polls, cancels, listings), so that long
//! calls can never starve the requests a client needs to follow or stop
//! its tasks.
//!
//! Every connection has a header-read timeout: a connection that has not
//! sent a whole request head within `server.header_read_timeout_ms` of
//! opening, or of its previous response, is closed, so idle and slow
//! connections cannot hold the connection bound. A `/mcp` POST body is read
//! whole, within `server.body_read_timeout_ms` and `server.max_request_bytes`,
//! and passes [`screen`](crate::mcp::screen) before it takes a request
//! slot: a client dribbling its body holds only its own connection, and a
//! malformed message gets a JSON-RPC error rather than the protocol
//! library's plain-text one. The screened message, not a header, says which
//! budget it counts against. Legacy (`initialize`) sessions are bounded by
//! `server.max_sessions` and expire after `server.session_idle_secs`
//! without a request.
//!
//! Authentication comes first of all (see [`auth`]): a request without a
//! valid credential is answered 401 before its body is read.
//!
//! Stopping is in two steps the service drives: [`Drain::idle`] waits for
//! every request to have its answer, and only then [`Drain::end_streams`]
//! ends SSE streams and sessions. Ending them first would cut in-flight
//! requests off with an empty 500.

pub mod auth;
pub mod exposure;
pub mod origin;
pub mod respond;
pub mod tls;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures_core::Stream;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError,
};
use rmcp::transport::streamable_http_server::session::{
    ServerSseMessage, SessionId, SessionManager,
};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::auth::Authenticator;
use crate::config::ServerSettings;
use crate::mcp::Handler;
use crate::mcp::screen::{self, Kind, Refused};
use crate::tasks::TaskService;
use crate::wire;

/// How often an idle SSE stream gets a keep-alive comment.
const SSE_KEEP_ALIVE: Duration = Duration::from_secs(15);

/// One bound on concurrent `/mcp` requests.
#[derive(Clone)]
struct Budget {
    permits: Arc<Semaphore>,
    max: usize,
    /// The config key that sets it, for the refusal's message.
    key: &'static str,
}

impl Budget {
    fn new(max: usize, key: &'static str) -> Budget {
        Budget {
            permits: Arc::new(Semaphore::new(max)),
            max,
            key,
        }
    }
}

#[derive(Clone)]
struct Limits {
    /// `tools/call`, and every request not known to be something else.
    calls: Budget,
    /// Polls, cancels, updates, listings: never taken by a call.
    control: Budget,
    /// Whether a refusal is "stopping" rather than "busy".
    svc: Arc<TaskService>,
}

impl Limits {
    /// The budget a request counts against, from what the screen found in
    /// its body: a `tools/call` counts as a call, any other message as
    /// control. A request without a body (GET and DELETE, which hold their
    /// slot only until the response starts) is control; a POST the screen
    /// did not mark cannot reach here, and would count as a call.
    fn budget_of(&self, request: &Request) -> &Budget {
        match request.extensions().get::<Kind>() {
            Some(kind) if kind.is_call() => &self.calls,
            Some(_) => &self.control,
            None if request.method() == axum::http::Method::POST => &self.calls,
            None => &self.control,
        }
    }

    /// Why `/mcp` cannot admit a request of some kind right now, if so.
    fn saturated(&self) -> Option<String> {
        [&self.calls, &self.control]
            .into_iter()
            .find(|b| b.permits.available_permits() == 0 && !b.permits.is_closed())
            .map(|b| format!("every request slot is in use ({} = {})", b.key, b.max))
    }
}

/// What a `/mcp` POST needs before it may take a request slot: its whole
/// body, in time and within the size bound.
#[derive(Clone)]
struct Intake {
    max_request_bytes: usize,
    body_read_timeout: Duration,
}

/// What `/readyz` looks at.
#[derive(Clone)]
struct Readiness {
    svc: Arc<TaskService>,
    limits: Limits,
}

/// The application (`/mcp`, `/healthz`, `/readyz`) and what stopping it
/// needs.
pub struct App {
    pub router: Router,
    limits: Limits,
    streams: CancellationToken,
    sessions: Arc<BoundedSessions>,
}

impl App {
    /// The application without credentials: every caller is the local one
    /// (the listener is loopback-only then).
    pub fn new(svc: Arc<TaskService>, settings: &ServerSettings) -> App {
        App::with_auth(svc, settings, None)
    }

    /// The application; with `auth`, every `/mcp` request is authenticated
    /// and scope-checked.
    pub fn with_auth(
        svc: Arc<TaskService>,
        settings: &ServerSettings,
        auth: Option<Arc<Authenticator>>,
    ) -> App {
        let gate = auth::Gate {
            auth: auth.clone(),
            svc: svc.clone(),
        };
        let streams = CancellationToken::new();
        let hosts = allowed_hosts(settings, auth.as_deref());
        let origins = origin::OriginPolicy::new(&settings.allowed_origins, &hosts);
        let config = StreamableHttpServerConfig::default()
            .with_allowed_hosts(hosts)
            // Plain JSON bodies when nothing is streamed: simpler for clients.
            .with_json_response(true)
            .with_sse_keep_alive(Some(SSE_KEEP_ALIVE))
            .with_max_request_body_bytes(settings.max_request_bytes)
            .with_cancellation_token(streams.clone());
        let factory_svc = svc.clone();
        let sessions = Arc::new(BoundedSessions::new(
            settings.max_sessions,
            settings.session_idle,
        ));
        let mcp = StreamableHttpService::new(
            move || Ok(Handler::for_http(factory_svc.clone())),
            sessions.clone(),
            config,
        );
        let session_door = SessionDoor {
            sessions: sessions.clone(),
            turn: Arc::new(tokio::sync::Mutex::new(())),
        };
        let intake = Intake {
            max_request_bytes: settings.max_request_bytes,
            body_read_timeout: settings.body_read_timeout,
        };
        let limits = Limits {
            calls: Budget::new(
                settings.max_concurrent_requests,
                "server.max_concurrent_requests",
            ),
            control: Budget::new(
                settings.reserved_control_requests,
                "server.reserved_control_requests",
            ),
            svc: svc.clone(),
        };
        let readiness = Readiness {
            svc,
            limits: limits.clone(),
        };
        // Layers run outermost last-added: the body is read and screened,
        // then the session bound is checked (an `initialize` waits its turn
        // there holding no request slot, so a flood of them cannot starve
        // polls), then a request slot is taken.
        // Before all of them the caller is authenticated (a request
        // without a valid credential is refused before its body is read);
        // its scopes are checked once the screen has told the method.
        let mut router = Router::new()
            .route_service("/mcp", mcp)
            .layer(middleware::from_fn_with_state(
                sessions.clone(),
                bind_sessions,
            ))
            .layer(middleware::from_fn_with_state(
                limits.clone(),
                limit_requests,
            ))
            .layer(middleware::from_fn_with_state(
                session_door,
                refuse_sessions_past_the_bound,
            ))
            .layer(middleware::from_fn_with_state(
                gate.clone(),
                auth::check_scopes,
            ))
            .layer(middleware::from_fn_with_state(intake, read_and_screen))
            .layer(middleware::from_fn_with_state(gate, auth::authenticate))
            // First of all: a browser page from a foreign origin is refused
            // before it can be taken for the local caller.
            .layer(middleware::from_fn_with_state(
                origins,
                origin::check_origin,
            ));
        if let Some(authenticator) = &auth {
            let settings = authenticator.settings();
            if let Some(path) = auth::metadata_path(&settings) {
                // The document follows reloads; its location is fixed at start.
                let current = authenticator.clone();
                let serve = move || {
                    let document = auth::metadata(&current.settings()).to_string();
                    async move { ([(header::CONTENT_TYPE, "application/json")], document) }
                };
                // Clients try the path-inserted location and then the root.
                router = router.route(&path, get(serve.clone()));
                if path != "/.well-known/oauth-protected-resource" {
                    router = router.route("/.well-known/oauth-protected-resource", get(serve));
                }
            }
        }
        let router = router
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz))
            .with_state(readiness);
        App {
            router,
            limits,
            streams,
            sessions,
        }
    }

    /// The legacy sessions, for the chores that watch them.
    pub fn sessions(&self) -> Arc<BoundedSessions> {
        self.sessions.clone()
    }

    pub fn drain(&self) -> Drain {
        Drain {
            limits: self.limits.clone(),
            streams: self.streams.clone(),
        }
    }
}

/// The `Host` header values the protocol library accepts (its guard
/// against DNS rebinding): the loopback names, the listen address when it
/// names one, and the host of `auth.resource`, the name clients reach this
/// server by off loopback.
fn allowed_hosts(settings: &ServerSettings, auth: Option<&Authenticator>) -> Vec<String> {
    let mut hosts = vec!["localhost".to_string(), "127.0.0.1".into(), "::1".into()];
    let ip = settings.listen.ip();
    if !ip.is_unspecified() && !ip.is_loopback() {
        hosts.push(ip.to_string());
    }
    if let Some(resource) = auth.and_then(|a| a.settings().resource.clone())
        && let Some((_, rest)) = resource.split_once("://")
    {
        let authority = rest.split(['/', '?']).next().unwrap_or_default();
        if !authority.is_empty() {
            hosts.push(authority.to_string());
        }
    }
    hosts
}

/// The two steps of stopping the HTTP side.
pub struct Drain {
    limits: Limits,
    streams: CancellationToken,
}

impl Drain {
    /// Waits until no `/mcp` request awaits its answer (an SSE stream counts
    /// only until its headers are sent); `false` if `limit` passed first.
    /// Requests that arrive meanwhile, or later on a connection still open,
    /// are refused with `TG_SERVER_STOPPING`.
    pub async fn idle(&self, limit: Duration) -> bool {
        let (calls, control) = (&self.limits.calls, &self.limits.control);
        let both = async {
            let calls = calls.permits.acquire_many(calls.max as u32).await.ok()?;
            let control = control
                .permits
                .acquire_many(control.max as u32)
                .await
                .ok()?;
            Some((calls, control))
        };
        let held = tokio::time::timeout(limit, both).await.ok().flatten();
        // Released permits would let a request through to a service whose
        // streams are about to end, and it would get an empty 500.
        calls.permits.close();
        control.permits.close();
        held.is_some()
    }

    /// Ends SSE streams and legacy sessions, so that connections close.
    pub fn end_streams(&self) {
        self.streams.cancel();
    }
}

async fn limit_requests(State(limits): State<Limits>, request: Request, next: Next) -> Response {
    let budget = limits.budget_of(&request);
    let Ok(_permit) = budget.permits.clone().try_acquire_owned() else {
        // A request that reaches a stopping daemon (its slots are closed or
        // being drained) is told so, not that the server is busy.
        let (w, message) = if limits.svc.is_stopping() || budget.permits.is_closed() {
            (
                wire::STOPPING,
                "the server is stopping and admits no new requests; retry once it is back"
                    .to_string(),
            )
        } else {
            (
                wire::SERVER_BUSY,
                format!(
                    "too many concurrent requests ({} = {}); retry shortly",
                    budget.key, budget.max
                ),
            )
        };
        return respond::refused(&Refused::new(w, message, serde_json::Value::Null));
    };
    next.run(request).await
}

/// Reads a `/mcp` POST's whole body (within `server.body_read_timeout_ms`
/// and `server.max_request_bytes`) and screens it, before the request may
/// take a slot. What passes goes on with its [`Kind`] attached; what does
/// not gets its JSON-RPC error here.
async fn read_and_screen(State(intake): State<Intake>, request: Request, next: Next) -> Response {
    if request.method() != axum::http::Method::POST {
        return next.run(request).await;
    }
    let (mut parts, body) = request.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let too_large = || {
        let refusal = Refused::new(
            wire::REQUEST_TOO_LARGE,
            format!(
                "the request body is larger than server.max_request_bytes = {}",
                intake.max_request_bytes
            ),
            serde_json::Value::Null,
        );
        // The rest of the body is never read: the connection closes.
        respond::refused(&refusal)
    };
    if let Some(n) = declared.filter(|n| *n > intake.max_request_bytes as u64) {
        // A client still sending when the connection closes gets a reset
        // instead of this answer. Up to one more request's worth of body is
        // read and dropped (within the body timeout) so that it reads the
        // 413; a larger body is cut off unread.
        if n <= 2 * intake.max_request_bytes as u64 {
            let _ = tokio::time::timeout(intake.body_read_timeout, drain(body, n)).await;
        }
        return too_large();
    }
    let limited = http_body_util::Limited::new(body, intake.max_request_bytes);
    let read = tokio::time::timeout(
        intake.body_read_timeout,
        http_body_util::BodyExt::collect(limited),
    )
    .await;
    let bytes = match read {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => return too_large(),
        Ok(Err(e)) => {
            // The client broke off mid-body; nobody is left to answer.
            tracing::debug!(error = %e, "request body ended early");
            return StatusCode::BAD_REQUEST.into_response();
        }
        Err(_elapsed) => {
            let refusal = Refused::new(
                wire::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within server.body_read_timeout_ms = {}",
                    intake.body_read_timeout.as_millis()
                ),
                serde_json::Value::Null,
            );
            return respond::refused(&refusal);
        }
    };
    let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok());
    let mirrored = screen::Mirrored {
        version: header("mcp-protocol-version"),
        method: header("mcp-method"),
    };
    match screen::screen(&bytes, Some(&mirrored)) {
        Ok(kind) => {
            name_the_task(&mut parts.headers, &kind);
            let id = match &kind {
                Kind::Request { id, .. } => id.clone(),
                _ => serde_json::Value::Null,
            };
            parts.extensions.insert(kind);
            let response = next
                .run(Request::from_parts(parts, axum::body::Body::from(bytes)))
                .await;
            as_json_rpc(response, id).await
        }
        Err(refusal) => respond::refused(&refusal),
    }
}

/// Reads and drops at most `limit` bytes of a body nobody will use.
async fn drain(mut body: axum::body::Body, limit: u64) {
    let mut seen = 0u64;
    while seen <= limit {
        match http_body_util::BodyExt::frame(&mut body).await {
            Some(Ok(frame)) => {
                seen += frame.data_ref().map_or(0, |d| d.len() as u64);
            }
            _ => return,
        }
    }
}

/// Longest plain-text refusal body from the protocol library that is
/// carried over into a JSON-RPC error message.
const MAX_REFUSAL_TEXT: usize = 4 * 1024;

/// The protocol library refuses some requests from their headers or the
/// session table (wrong Accept or Content-Type, no Host, an unknown
/// session) with a plain-text body a JSON-RPC client cannot read. Such an
/// answer keeps its status and gets a JSON-RPC error body carrying the
/// library's words and the request's id.
async fn as_json_rpc(response: Response, id: serde_json::Value) -> Response {
    let json_already = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("application/json") || c.starts_with("text/event-stream"));
    if response.status().is_success() || json_already {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = match axum::body::to_bytes(body, MAX_REFUSAL_TEXT).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).trim().to_string(),
        Err(_) => String::new(),
    };
    let message = match text.is_empty() {
        true => parts
            .status
            .canonical_reason()
            .unwrap_or("refused")
            .to_string(),
        false => text,
    };
    let refusal = Refused::new(wire::HTTP_REFUSED, message, id);
    let mut wrapped = respond::from_library(&refusal, parts.status);
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            wrapped.headers_mut().insert(name.clone(), value.clone());
        }
    }
    wrapped
}

/// A `tasks/*` request without `Mcp-Name` gets one, mirrored from the
/// body's `taskId`, before the protocol library (which requires it) sees
/// it. The core specification requires the header only for requests that
/// name a tool, resource or prompt, and a widely used client leaves it out
/// on `tasks/*`; the body has already passed the screen and is the
/// authority. A header that is present is left alone, so a mismatch is
/// still refused.
fn name_the_task(headers: &mut axum::http::HeaderMap, kind: &Kind) {
    let Kind::Request {
        method,
        target: Some(task),
        ..
    } = kind
    else {
        return;
    };
    if !method.starts_with("tasks/") || headers.contains_key("mcp-name") {
        return;
    }
    if let Ok(value) = axum::http::HeaderValue::from_str(task) {
        headers.insert("mcp-name", value);
    }
}

async fn healthz() -> &'static str {
    "ok\n"
}

/// Ready means a new request would be admitted: not stopping, the store
/// serving, and a free `/mcp` slot of each kind. Busy running slots do not
/// make the daemon unready: polls and cancels of its tasks, which only it
/// can answer, still get through, and a call that finds no running slot is
/// told so at once.
async fn readyz(State(ready): State<Readiness>) -> (StatusCode, String) {
    let not_ready = |why: String| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        )
    };
    if ready.svc.is_stopping() {
        return not_ready("stopping".into());
    }
    if let Some(reason) = ready.svc.store().disabled_reason() {
        return not_ready(format!("task store disabled until restart: {reason}"));
    }
    if let Some(why) = ready.limits.saturated() {
        return not_ready(why);
    }
    (StatusCode::OK, "ready\n".into())
}

/// How long a new connection at the limit waits for the slot of the
/// connection it displaced to come free.
const DISPLACE_WAIT: Duration = Duration::from_millis(500);

/// Connections that have not yet sent a whole request head, oldest first.
/// At the connection limit a newcomer takes the slot of the oldest of them:
/// a client that connects and sends its request at once is served even
/// while an attacker keeps opening connections that send nothing, or send
/// a head byte by byte. A connection that has sent a request keeps its
/// slot (until its header-read timeout, when idle).
#[derive(Clone, Default)]
struct Unproven {
    queue: Arc<std::sync::Mutex<std::collections::VecDeque<(u64, CancellationToken)>>>,
}

impl Unproven {
    fn queue(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::VecDeque<(u64, CancellationToken)>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn add(&self, id: u64, displace: CancellationToken) {
        self.queue().push_back((id, displace));
    }

    /// The connection sent a request head, or ended.
    fn forget(&self, id: u64) {
        let mut queue = self.queue();
        if let Some(at) = queue.iter().position(|(i, _)| *i == id) {
            queue.remove(at);
        }
    }

    /// Tells the oldest connection that has sent nothing whole to close;
    /// `false` when there is none.
    fn displace_oldest(&self) -> bool {
        match self.queue().pop_front() {
            Some((_, displace)) => {
                displace.cancel();
                true
            }
            None => false,
        }
    }
}

/// A TCP listener that holds one permit per open connection. At the bound,
/// a new connection displaces the oldest one that has not yet sent a whole
/// request head; when there is none, it is answered with a 503 and closed.
pub struct LimitedListener {
    inner: TcpListener,
    permits: Arc<Semaphore>,
    max: usize,
    unproven: Unproven,
    next_id: u64,
}

impl LimitedListener {
    pub fn new(inner: TcpListener, max: usize) -> LimitedListener {
        LimitedListener {
            inner,
            permits: Arc::new(Semaphore::new(max)),
            max,
            unproven: Unproven::default(),
            next_id: 0,
        }
    }

    fn admit(&mut self, stream: TcpStream, permit: OwnedSemaphorePermit) -> Limited {
        // Request/response traffic: send each response at once.
        let _ = stream.set_nodelay(true);
        self.next_id += 1;
        let displace = CancellationToken::new();
        self.unproven.add(self.next_id, displace.clone());
        Limited {
            stream,
            _permit: permit,
            id: self.next_id,
            displace,
        }
    }
}

/// A connection and the permit it holds until it closes.
pub struct Limited {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
    id: u64,
    /// Cancelled when a newcomer takes this connection's slot.
    displace: CancellationToken,
}

impl AsyncRead for Limited {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Limited {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

impl axum::serve::Listener for LimitedListener {
    type Io = Limited;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (mut stream, addr) = match self.inner.accept().await {
                Ok(pair) => pair,
                Err(e) => {
                    // Out of file descriptors and the like: back off briefly.
                    tracing::warn!(error = %e, "accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            if let Ok(permit) = self.permits.clone().try_acquire_owned() {
                return (self.admit(stream, permit), addr);
            }
            if self.unproven.displace_oldest() {
                let freed =
                    tokio::time::timeout(DISPLACE_WAIT, self.permits.clone().acquire_owned()).await;
                if let Ok(Ok(permit)) = freed {
                    return (self.admit(stream, permit), addr);
                }
            }
            let max = self.max;
            tokio::spawn(async move {
                let body = format!(
                    "too many connections (server.max_connections = {max}); retry shortly\n"
                );
                let reply = format!(
                    "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = tokio::time::timeout(Duration::from_secs(2), async {
                    let _ = stream.write_all(reply.as_bytes()).await;
                    let _ = stream.shutdown().await;
                })
                .await;
            });
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// Serves `router` until `shutdown` resolves; then stops accepting, lets
/// every connection finish the request it is serving (keep-alive ends) and
/// waits for them to close.
///
/// Each connection runs on hyper's HTTP/1 server with a timer, so its
/// header-read timeout applies: hyper starts it whenever the connection
/// waits for a request head, on a fresh connection and after each response
/// alike, which makes it the idle keep-alive bound too.
pub async fn run(
    mut listener: LimitedListener,
    router: Router,
    header_read_timeout: Duration,
    tls: Option<Arc<tls::Tls>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    let connections = TaskTracker::new();
    let closing = CancellationToken::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (io, addr) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = axum::serve::Listener::accept(&mut listener) => accepted,
        };
        let (id, displace) = (io.id, io.displace.clone());
        // The first request head proves the connection: it keeps its slot.
        let tower = TowerToHyperService::new(router.clone());
        let unproven = listener.unproven.clone();
        let service = hyper::service::service_fn(move |mut request: hyper::Request<_>| {
            unproven.forget(id);
            request.extensions_mut().insert(auth::Peer(addr));
            hyper::service::Service::call(&tower, request)
        });
        let closing = closing.clone();
        let unproven = listener.unproven.clone();
        let http = http.clone();
        let acceptor = tls.as_ref().map(|t| t.acceptor());
        connections.spawn(async move {
            let io = match acceptor {
                None => Either::Plain(io),
                // The handshake happens here, not in the accept loop, and
                // gets the header-read timeout: a client that stalls it
                // holds only its own (unproven, displaceable) slot.
                Some(acceptor) => {
                    let handshake = tokio::time::timeout(header_read_timeout, acceptor.accept(io));
                    tokio::select! {
                        done = handshake => match done {
                            Ok(Ok(stream)) => Either::Tls(Box::new(stream)),
                            Ok(Err(e)) => {
                                tracing::debug!(error = %e, "TLS handshake failed");
                                unproven.forget(id);
                                return;
                            }
                            Err(_) => {
                                tracing::debug!("TLS handshake timed out");
                                unproven.forget(id);
                                return;
                            }
                        },
                        _ = displace.cancelled() => { unproven.forget(id); return; }
                        _ = closing.cancelled() => { unproven.forget(id); return; }
                    }
                }
            };
            let conn = http.serve_connection(TokioIo::new(io), service);
            let mut conn = std::pin::pin!(conn);
            let ended = tokio::select! {
                ended = conn.as_mut() => ended,
                _ = closing.cancelled() => {
                    // Answers the request in flight, then closes.
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
                // A newcomer took the slot of this connection, which had
                // sent no whole request: it is closed unanswered.
                _ = displace.cancelled() => Ok(()),
            };
            unproven.forget(id);
            if let Err(e) = ended {
                // A timed-out head, a reset or a malformed request: the
                // client's doing, and the connection's end.
                tracing::debug!(error = %e, "HTTP connection ended");
            }
        });
    }
    // No new connection: the listening socket closes here.
    drop(listener);
    closing.cancel();
    connections.close();
    connections.wait().await;
    Ok(())
}

/// A connection, plain or inside TLS.
enum Either {
    Plain(Limited),
    Tls(Box<tokio_rustls::server::TlsStream<Limited>>),
}

impl AsyncRead for Either {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Either::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Either::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Either {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Either::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Either::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Either::Plain(s) => Pin::new(s).poll_flush(cx),
            Either::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Either::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Either::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// rmcp's in-memory session manager with a hard bound on open sessions and
/// a shorter idle expiry. A session's slot is freed when rmcp closes it
/// (DELETE, idle expiry, or the end of its worker).
pub struct BoundedSessions {
    inner: LocalSessionManager,
    max: usize,
    /// The owner digest of each session's opener: a request carrying the
    /// session's id from anyone else is answered as if the session did
    /// not exist. Entries of closed sessions are pruned whenever one is
    /// added, so this holds at most `max` + 1 entries.
    owners: std::sync::Mutex<std::collections::HashMap<String, String>>,
    /// Makes "count, then create" one step, so the bound is never passed.
    creating: tokio::sync::Mutex<()>,
    /// The most sessions open at once since [`BoundedSessions::take_peak`].
    peak: std::sync::atomic::AtomicUsize,
}

#[derive(Debug, thiserror::Error)]
pub enum SessionsError {
    #[error(
        "too many legacy sessions (server.max_sessions = {max}); close one or retry once idle ones expire"
    )]
    Full { max: usize },
    #[error(transparent)]
    Local(#[from] LocalSessionManagerError),
}

impl BoundedSessions {
    pub fn new(max: usize, idle: Duration) -> BoundedSessions {
        let mut inner = LocalSessionManager::default();
        inner.session_config.keep_alive = Some(idle);
        BoundedSessions {
            inner,
            max,
            owners: std::sync::Mutex::new(std::collections::HashMap::new()),
            creating: tokio::sync::Mutex::new(()),
            peak: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// The most sessions that were open at once since the last call, and
    /// how many are open now (which becomes the new peak).
    pub async fn take_peak(&self) -> (usize, usize) {
        let _one_at_a_time = self.creating.lock().await;
        let open = self.open().await;
        let peak = self
            .peak
            .swap(open, std::sync::atomic::Ordering::Relaxed)
            .max(open);
        (peak, open)
    }

    /// Open legacy sessions.
    pub async fn open(&self) -> usize {
        self.inner.sessions.read().await.len()
    }

    /// Records who opened session `id`; forgets the openers of sessions
    /// that have closed since.
    async fn bind(&self, id: &str, owner: String) {
        let open = self.inner.sessions.read().await;
        let mut owners = lock_owners(&self.owners);
        owners.retain(|known, _| open.contains_key(known.as_str()));
        owners.insert(id.to_string(), owner);
    }

    /// Whether `owner` opened session `id`. A session without a recorded
    /// opener belongs to nobody.
    fn opened_by(&self, id: &str, owner: &str) -> bool {
        lock_owners(&self.owners)
            .get(id)
            .is_some_and(|o| o == owner)
    }
}

fn lock_owners<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding this lock cannot leave the map half-updated.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A session id the session manager never issues (its ids are UUIDs): a
/// request for someone else's session is passed on with this one instead,
/// so it gets exactly the answer an unknown session gets.
const NO_SUCH_SESSION: &str = "not-a-session";

/// The protocol library's own words for an unknown session, which a DELETE
/// of one gets too.
const SESSION_NOT_FOUND: &str = "Not Found: Session not found";

/// Binds each legacy session to the owner of the caller that opened it.
/// The opener of a session is recorded from the `Mcp-Session-Id` of its
/// `initialize` answer. Any later request carrying that id (POST, the GET
/// of a standalone or resumed stream, DELETE) from a caller with another
/// owner (another subject, tenant or issuer, or the local owner) is
/// answered exactly as an unknown session is: the library never sees the
/// real id, so it can neither hand over the session's streams nor end it.
async fn bind_sessions(
    State(sessions): State<Arc<BoundedSessions>>,
    mut request: Request,
    next: Next,
) -> Response {
    let owner = request
        .extensions()
        .get::<crate::auth::Caller>()
        // The owner digest, as text: all this needs is to compare it.
        .map(|caller| crate::tasks::owner_of(caller).to_hex());
    let carried = request
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().map(str::to_string));
    match carried {
        Some(Ok(id)) => {
            let owned = owner.as_deref().is_some_and(|o| sessions.opened_by(&id, o));
            // The library answers a legacy DELETE of any id it does not
            // hold with 202; a session that is not the caller's, or no
            // longer open, is not found, as it is for every other method.
            // (A 2026-07-28 DELETE is refused by the library as a method
            // the new revision does not have.)
            let legacy = request
                .headers()
                .get("mcp-protocol-version")
                .is_none_or(|v| v.as_bytes() < b"2026-07-28".as_slice());
            if request.method() == axum::http::Method::DELETE
                && legacy
                && !(owned
                    && sessions
                        .inner
                        .has_session(&id.as_str().into())
                        .await
                        .unwrap_or(false))
            {
                return (StatusCode::NOT_FOUND, SESSION_NOT_FOUND).into_response();
            }
            if !owned {
                tracing::debug!(
                    "a request named a legacy session its caller did not open; answered as an unknown session"
                );
                request.headers_mut().insert(
                    "mcp-session-id",
                    axum::http::HeaderValue::from_static(NO_SUCH_SESSION),
                );
            }
            next.run(request).await
        }
        // Not text: the library reads it as no session id at all.
        Some(Err(_)) => next.run(request).await,
        None => {
            let response = next.run(request).await;
            let opened = response
                .headers()
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok());
            match (opened, owner) {
                (Some(id), Some(owner)) => sessions.bind(id, owner).await,
                (Some(_), None) => {
                    // Cannot happen (authentication always attaches the
                    // caller); a session without an opener answers every
                    // request as unknown.
                    tracing::error!("a legacy session was opened without a caller; it is unusable");
                }
                _ => {}
            }
            response
        }
    }
}

impl SessionManager for BoundedSessions {
    type Error = SessionsError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let _one_at_a_time = self.creating.lock().await;
        let open = self.open().await;
        if open >= self.max {
            return Err(SessionsError::Full { max: self.max });
        }
        let created = self.inner.create_session().await?;
        self.peak
            .fetch_max(open + 1, std::sync::atomic::Ordering::Relaxed);
        Ok(created)
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        Ok(self.inner.initialize_session(id, message).await?)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        Ok(self.inner.has_session(id).await?)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        Ok(self.inner.close_session(id).await?)
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.inner.create_stream(id, message).await?)
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        Ok(self.inner.accept_message(id, message).await?)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.inner.create_standalone_stream(id).await?)
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.inner.resume(id, last_event_id).await?)
    }
}

/// What the session door needs: the sessions, and a turn for each
/// session-less `initialize`.
#[derive(Clone)]
struct SessionDoor {
    sessions: Arc<BoundedSessions>,
    /// Held from the count to the session's creation, so that two
    /// `initialize` requests racing for the last slot cannot both pass the
    /// door (the loser would get the library's plain-text 500).
    turn: Arc<tokio::sync::Mutex<()>>,
}

/// Past `server.max_sessions`, a legacy `initialize` gets a JSON-RPC 503
/// here. rmcp would turn the session manager's refusal (which keeps the
/// bound hard when two arrive at once) into a plain-text 500.
async fn refuse_sessions_past_the_bound(
    State(door): State<SessionDoor>,
    request: Request,
    next: Next,
) -> Response {
    let id = match request.extensions().get::<Kind>() {
        Some(Kind::Request { method, id, .. }) if method == "initialize" => id.clone(),
        _ => return next.run(request).await,
    };
    // The library reads a session id that is not text as no session id.
    let in_session = request
        .headers()
        .get("mcp-session-id")
        .is_some_and(|v| v.to_str().is_ok());
    if in_session {
        return next.run(request).await;
    }
    let _turn = door.turn.lock().await;
    if door.sessions.open().await < door.sessions.max {
        // The answer's head comes once the session exists.
        return next.run(request).await;
    }
    respond::refused(&Refused::new(
        wire::SESSIONS_FULL,
        format!(
            "too many legacy sessions (server.max_sessions = {}); retry once one closes or expires",
            door.sessions.max
        ),
        id,
    ))
}
