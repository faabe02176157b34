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
