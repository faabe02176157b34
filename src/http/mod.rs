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
//!
//! Owns HTTP endpoints. `admin_api.rs`: `/admin/v1/approvals` (list, show,
//! approve, reject), served only with credentials, behind the same
//! authentication and origin check as `/mcp`; an administrator is an
//! authenticated caller holding `approvals:read` or `approvals:decide` (never
//! the loopback local owner), the decider recorded is that caller, bodies ≤ 8
//! KiB read within `server.body_read_timeout_ms`; it calls `tasks::Approvals`,
//! the same code the admin socket's `taskgate approvals` calls. `exposure.rs`:
//! the exposure policy, applied by `startup::effective` to every address a
//! layer or `--listen` gave `server.listen`: off loopback only with credentials
//! in `[auth]` and `server.tls` `on` or `terminated-upstream` (else 78).
//! `origin.rs` runs first of all on every `/mcp` request: a present `Origin`
//! that is neither the daemon's own (the authority the request was addressed
//! to, when its host is one the daemon answers to) nor listed in
//! `server.allowed_origins` gets 403 `TG_ORIGIN_NOT_ALLOWED` before
//! authentication, so a browser page on a rebound name is never the local
//! caller. `auth.rs` runs next: the bearer token (RFC 6750) becomes the
//! request's `Caller` through `auth::Authenticator`, or the request gets 401
//! with a challenge before its body is read (no credentials: a bare `Bearer
//! realm=…`; a token that is unknown, malformed, expired or revoked:
//! `error="invalid_token"` in one wording for all, the reason only in the debug
//! log); loopback without an `Authorization` header at all is the local caller
//! only while `auth.local_owner = "loopback"` (a present header that is not one
//! well-formed bearer credential is 401 `error="invalid_request"`, never "no
//! credential") (the peer address comes from the accept loop); after the
//! screen, `check_scopes` answers 403 `error="insufficient_scope"` with every
//! scope the operation needs in one challenge (the task service's check at
//! admission is the one that decides; this one exists to give the right status,
//! also to legacy sessions, whose requests carry no `Mcp-Method`); RFC 9728
//! metadata at the path-inserted well-known location and the root when
//! `auth.resource` is set and a JWT issuer is advertised, named by
//! `resource_metadata=` in every challenge. `metrics_api.rs` — `/metrics`,
//! behind the same origin check and authentication as `/mcp`: without `[auth]`
//! every (loopback) caller reads it; with it a credential needs `metrics:read`
//! (or `admin`), and a loopback request without one is served only while
//! `auth.local_owner = "loopback"`; OpenMetrics to a scraper that asks for it,
//! the classic text format otherwise; each store count waits at most 1 s and is
//! left out of that scrape past it; the outermost layer of the whole router
//! counts every response (`taskgate_http_requests_total` by method, path class
//! and status). `router.rs` — `App`: `/mcp` (rmcp's `StreamableHttpService`),
//! `/healthz`, `/readyz`, `/metrics` (503 while stopping, disabled, or while
//! every request slot of one kind is in use; busy running slots do not make it
//! unready, since only this daemon can answer polls of its tasks);
//! `listener.rs` — `LimitedListener` bounds connections: at
//! `server.max_connections` a newcomer displaces the oldest connection that has
//! not yet sent a whole request head (so an attacker reopening silent or
//! slowloris connections cannot lock clients out), and only when every slot
//! holds a connection that has sent a request is it refused with 503;
//! `limits.rs` — the outermost `/mcp` middleware reads a POST body whole within
//! `server.body_read_timeout_ms` and `server.max_request_bytes` (408
//! `TG_REQUEST_TIMEOUT` / 413 `TG_REQUEST_TOO_LARGE`, connection closed; a
//! declared body of up to twice the bound is read and dropped first, so a
//! client still sending reads the 413 instead of a reset) and screens it (the
//! screen's JSON-RPC error with 400; method-not-found with 404 to a 2026-07-28
//! request, as the stateless binding requires, and 200 to a legacy one, as rmcp
//! answers a session) **before any request slot is taken**, so a dribbled body
//! holds only its own connection; a `tasks/*` request without `Mcp-Name` gets
//! it from the body's `taskId` (the core specification requires it only where a
//! tool, resource or prompt is named; FastMCP's client omits it), and a
//! plain-text refusal from rmcp (Accept, Content-Type, Host, unknown session)
//! is rewrapped as a JSON-RPC `TG_HTTP_REFUSED` body with the same status; the
//! session door comes next (a legacy `initialize` waits its turn there holding
//! no request slot), then a middleware bounds concurrent `/mcp` requests with
//! two budgets, chosen from the screened `Kind`, never from a header, so long
//! calls can never starve polls: `tools/call` against
//! `server.max_concurrent_requests`, everything else (polls, cancels, listings,
//! GET and DELETE) against `server.reserved_control_requests`; past either, a
//! JSON-RPC `TG_SERVER_BUSY` with 503. `Drain::idle` drains and closes both.
//! `sessions.rs` — `BoundedSessions` wraps rmcp's session manager and records
//! each legacy session's opener (the owner digest of the caller whose
//! `initialize` answer carried the id); the innermost middleware,
//! `bind_sessions`, passes a request carrying a session id from any other owner
//! on with an id rmcp never issues, so a stranger's POST, stream GET
//! (standalone or `Last-Event-ID` resume) and DELETE get exactly the
//! unknown-session answer (404; a legacy DELETE of a session that is not the
//! caller's, which rmcp would answer 202, gets rmcp's 404 words); the openers
//! of closed sessions are pruned whenever one is added. It keeps at most
//! `server.max_sessions` legacy sessions, expired after
//! `server.session_idle_secs` idle; a legacy `initialize` past the bound gets a
//! JSON-RPC `TG_SESSIONS_FULL` 503 from a middleware, which holds one turn from
//! the count to the session's creation so racing `initialize` requests cannot
//! overshoot into rmcp's 500; it remembers the peak count for the memory chore.
//! `Drain` stops it in two steps: wait until every request has its answer, then
//! end SSE streams and sessions. `listener.rs` — `run(listener, router,
//! header_read_timeout, tls, shutdown)` is taskgate's own accept loop on
//! hyper's HTTP/1 server with a Tokio timer: a connection that has not sent a
//! whole request head within `server.header_read_timeout_ms` of opening or of
//! its last response is closed (this is also the keep-alive idle bound);
//! graceful shutdown waits for every connection on a `TaskTracker`. Tests drive
//! the router in process with `oneshot`. `respond.rs` is the one mapping from a
//! refusal (`mcp::screen::Refused`: a wire entry, a message, the request's id)
//! to its HTTP answer: the wire entry decides the status, whether the
//! connection closes and whether `Retry-After: 1` is sent (401 and the origin's
//! 403 close; 408 and 413 close; `TG_SERVER_BUSY`, `TG_STOPPING`,
//! `TG_SESSIONS_FULL` are 503 with `Retry-After`; an unserved method is 404 or
//! 200 as above; the rest of the screen's refusals 400); the challenges add
//! their `WWW-Authenticate`, and a plain-text refusal of rmcp keeps rmcp's
//! status.

mod admin_api;
pub mod auth;
pub mod exposure;
mod limits;
mod listener;
mod metrics_api;
pub mod origin;
pub mod respond;
mod router;
mod sessions;
pub mod tls;

pub use listener::{Limited, LimitedListener, run};
pub use router::{App, Drain};
pub use sessions::{BoundedSessions, SessionsError};
