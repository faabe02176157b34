//! Legacy (`initialize`) sessions: bounded, expired when idle, and bound to
//! the owner of the caller that opened them.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_core::Stream;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError,
};
use rmcp::transport::streamable_http_server::session::{
    ServerSseMessage, SessionId, SessionManager,
};

use crate::mcp::screen::{Kind, Refused};

use crate::wire;

use super::respond;

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

/// What `status` and `/metrics` count of the legacy sessions.
impl crate::ops::SessionCount for BoundedSessions {
    fn open(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = usize> + Send + '_>> {
        Box::pin(BoundedSessions::open(self))
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
pub(super) async fn bind_sessions(
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
pub(super) struct SessionDoor {
    pub(super) sessions: Arc<BoundedSessions>,
    /// Held from the count to the session's creation, so that two
    /// `initialize` requests racing for the last slot cannot both pass the
    /// door (the loser would get the library's plain-text 500).
    pub(super) turn: Arc<tokio::sync::Mutex<()>>,
}

/// Past `server.max_sessions`, a legacy `initialize` gets a JSON-RPC 503
/// here. rmcp would turn the session manager's refusal (which keeps the
/// bound hard when two arrive at once) into a plain-text 500.
pub(super) async fn refuse_sessions_past_the_bound(
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
