//! The HTTP face of the daemon: MCP streamable HTTP at `/mcp`, `/healthz`
//! (the process answers) and `/readyz` (the task store is open and not
//! latched disabled, and the daemon is not stopping). Connections and
//! concurrent requests are bounded; past either bound a client gets a clear
//! 503 at once.
//!
//! Stopping is in two steps the service drives: [`Drain::idle`] waits for
//! every request to have its answer, and only then [`Drain::end_streams`]
//! ends SSE streams and sessions. Ending them first would cut in-flight
//! requests off with an empty 500.

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
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::config::ServerSettings;
use crate::mcp::Handler;
use crate::tasks::TaskService;
use crate::wire;

/// How often an idle SSE stream gets a keep-alive comment.
const SSE_KEEP_ALIVE: Duration = Duration::from_secs(15);

#[derive(Clone)]
struct Limits {
    requests: Arc<Semaphore>,
    max_requests: usize,
    /// Whether a refusal is "stopping" rather than "busy".
    svc: Arc<TaskService>,
}

/// The application (`/mcp`, `/healthz`, `/readyz`) and what stopping it
/// needs.
pub struct App {
    pub router: Router,
    limits: Limits,
    streams: CancellationToken,
}

impl App {
    pub fn new(svc: Arc<TaskService>, settings: &ServerSettings) -> App {
        let streams = CancellationToken::new();
        let config = StreamableHttpServerConfig::default()
            // Plain JSON bodies when nothing is streamed: simpler for clients.
            .with_json_response(true)
            .with_sse_keep_alive(Some(SSE_KEEP_ALIVE))
            .with_max_request_body_bytes(settings.max_request_bytes)
            .with_cancellation_token(streams.clone());
        let factory_svc = svc.clone();
        let mcp = StreamableHttpService::new(
            move || Ok(Handler::new(factory_svc.clone())),
            Arc::new(LocalSessionManager::default()),
            config,
        );
        let limits = Limits {
            requests: Arc::new(Semaphore::new(settings.max_concurrent_requests)),
            max_requests: settings.max_concurrent_requests,
            svc: svc.clone(),
        };
        let router = Router::new()
            .route_service("/mcp", mcp)
            .layer(middleware::from_fn_with_state(
                limits.clone(),
                limit_requests,
            ))
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz))
            .with_state(svc);
        App {
            router,
            limits,
            streams,
        }
    }

    pub fn drain(&self) -> Drain {
        Drain {
            limits: self.limits.clone(),
            streams: self.streams.clone(),
        }
    }
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
        let all = self.limits.max_requests as u32;
        let idle = matches!(
            tokio::time::timeout(limit, self.limits.requests.acquire_many(all)).await,
            Ok(Ok(_))
        );
        // Released permits would let a request through to a service whose
        // streams are about to end, and it would get an empty 500.
        self.limits.requests.close();
        idle
    }

    /// Ends SSE streams and legacy sessions, so that connections close.
    pub fn end_streams(&self) {
        self.streams.cancel();
    }
}

async fn limit_requests(State(limits): State<Limits>, request: Request, next: Next) -> Response {
    let Ok(_permit) = limits.requests.clone().try_acquire_owned() else {
        // A request that reaches a stopping daemon (its slots are closed or
        // being drained) is told so, not that the server is busy.
        let (w, message) = if limits.svc.is_stopping() || limits.requests.is_closed() {
            (
                wire::STOPPING,
                "the server is stopping and admits no new requests; retry once it is back"
                    .to_string(),
            )
        } else {
            (
                wire::SERVER_BUSY,
                format!(
                    "too many concurrent requests (server.max_concurrent_requests = {}); retry shortly",
                    limits.max_requests
                ),
            )
        };
        let body = serde_json::json!({
            "jsonrpc": "2.0",
            "id": null,
            "error": {
                "code": w.code,
                "message": message,
                "data": w.data(),
            }
        });
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [
                (header::RETRY_AFTER, "1"),
                (header::CONTENT_TYPE, "application/json"),
            ],
            body.to_string(),
        )
            .into_response();
    };
    next.run(request).await
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(svc): State<Arc<TaskService>>) -> (StatusCode, String) {
    if svc.is_stopping() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: stopping\n".into(),
        );
    }
    match svc.store().disabled_reason() {
        None => (StatusCode::OK, "ready\n".into()),
        Some(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: task store disabled until restart: {reason}\n"),
        ),
    }
}

/// A TCP listener that holds one permit per open connection. Past the
/// bound, a connection is answered with a 503 and closed.
pub struct LimitedListener {
    inner: TcpListener,
    permits: Arc<Semaphore>,
    max: usize,
}

impl LimitedListener {
    pub fn new(inner: TcpListener, max: usize) -> LimitedListener {
        LimitedListener {
            inner,
            permits: Arc::new(Semaphore::new(max)),
            max,
        }
    }
}

/// A connection and the permit it holds until it closes.
pub struct Limited {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
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
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            match self.permits.clone().try_acquire_owned() {
                Ok(permit) => {
                    // Request/response traffic: send each response at once.
                    let _ = stream.set_nodelay(true);
                    return (
                        Limited {
                            stream,
                            _permit: permit,
                        },
                        addr,
                    );
                }
                Err(_) => {
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
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// Serves `router` until `shutdown` resolves, then lets in-flight requests
/// finish.
pub async fn run(
    listener: LimitedListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router.into_make_service())
        .with_graceful_shutdown(shutdown)
        .await
}
