//! The application: `/mcp` behind its middlewares, `/healthz`, `/readyz`,
//! and the two steps of stopping it.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::middleware::{self};
use axum::routing::get;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use crate::auth::Authenticator;
use crate::config::ServerSettings;
use crate::mcp::Handler;
use crate::ops::Ops;

use super::limits::*;
use super::sessions::*;
use super::{admin_api, metrics_api};
use crate::tasks::TaskService;

use super::{auth, origin};

/// How often an idle SSE stream gets a keep-alive comment.
const SSE_KEEP_ALIVE: Duration = Duration::from_secs(15);
/// What `/readyz` looks at.
#[derive(Clone)]
struct Readiness {
    pub(super) ops: Arc<Ops>,
    pub(super) limits: Limits,
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
    /// The application; with `auth`, every `/mcp` request is authenticated
    /// and scope-checked. `/admin/v1`, `/metrics` and `/readyz` render what
    /// `ops` answers.
    pub fn with_auth(
        svc: Arc<TaskService>,
        ops: Arc<Ops>,
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
        let (admin_gate, admin_origins) = (gate.clone(), origins.clone());
        let (metrics_gate, metrics_origins) = (gate.clone(), origins.clone());
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
        ops.count_sessions(sessions.clone());
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
            ops: ops.clone(),
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
        if auth.is_some() {
            router = router.merge(
                admin_api::routes(admin_gate, ops.clone(), settings.body_read_timeout).layer(
                    middleware::from_fn_with_state(admin_origins, origin::check_origin),
                ),
            );
        }
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
        let router =
            router
                .merge(metrics_api::routes(metrics_gate, ops).layer(
                    middleware::from_fn_with_state(metrics_origins, origin::check_origin),
                ))
                .route("/healthz", get(healthz))
                .route("/readyz", get(readyz))
                .with_state(readiness)
                .layer(middleware::from_fn(metrics_api::count_requests));
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
    if ready.ops.is_stopping() {
        return not_ready("stopping".into());
    }
    if let Some(reason) = ready.ops.store_disabled() {
        return not_ready(format!("task store disabled until restart: {reason}"));
    }
    if let Some(why) = ready.limits.saturated() {
        return not_ready(why);
    }
    (StatusCode::OK, "ready\n".into())
}
