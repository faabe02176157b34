//! The accept loop and the connection bound: taskgate's own loop on
//! hyper's HTTP/1 server, with the header-read timeout, and a listener that
//! displaces a connection that has not yet sent a request when every slot
//! is taken.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{auth, tls};

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
    pub(super) queue: Arc<std::sync::Mutex<std::collections::VecDeque<(u64, CancellationToken)>>>,
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

    pub(super) fn admit(&mut self, stream: TcpStream, permit: OwnedSemaphorePermit) -> Limited {
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
