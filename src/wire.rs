//! The registry of error codes taskgate puts on the wire.
//!
//! Every JSON-RPC error taskgate itself produces has an entry here: its
//! numeric code, a stable name for logs and docs, and one line of help for
//! the client. JSON-RPC and the MCP specification fix a few codes (parse
//! error, invalid request, invalid params, method not found, internal
//! error, missing client capability), which several named errors share;
//! taskgate's own codes live in the JSON-RPC server range -32040..=-32079.
//! `tests/architecture.rs` fails when code outside this file and the one
//! conversion in `mcp::convert` makes up a code.
//!
//! Owns wire error codes. One registry: code, `TG_*` name, one line of help.
//! taskgate's own codes live in -32040..=-32079; the protocol's codes it sends
//! (-32700, -32600, -32602, -32601, -32603, -32021) have named entries too. No
//! other file writes a code as a number, and none writes a JSON-RPC error body:
//! `WireCode::error_response` does. `taskgate wire-codes [--json]` (hidden)
//! prints the registry for scripts.

/// One registered wire error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireCode {
    pub code: i64,
    pub name: &'static str,
    pub help: &'static str,
}

macro_rules! registry {
    ($( $(#[$doc:meta])* $ident:ident = ($code:expr, $name:expr, $help:expr); )*) => {
        $( $(#[$doc])* pub const $ident: WireCode = WireCode { code: $code, name: $name, help: $help }; )*
        /// Every registered code, in declaration order.
        pub const ALL: &[WireCode] = &[ $( $ident ),* ];
    };
}

registry! {
    /// Unknown, expired and another owner's task IDs: one answer for all three.
    UNKNOWN_TASK = (-32602, "TG_TASK_NOT_FOUND",
        "no such task for this caller; it may never have existed, may have expired, or belongs to someone else");
    /// The task was running when the daemon stopped; it was not re-run.
    TASK_INTERRUPTED = (-32040, "TG_TASK_INTERRUPTED",
        "the daemon restarted while this task ran; its outcome is unknown and it was not run again; check the tool's effect before calling it again");
    /// The store's bounded admission queue was full.
    STORE_BUSY = (-32041, "TG_STORE_BUSY",
        "the task store's queue is full; retry after a short delay");
    /// Creation refused at a capacity bound (row limit, page cap, full disk).
    STORE_CAPACITY = (-32042, "TG_STORE_CAPACITY",
        "the task store is at capacity; wait for tasks to expire or ask the operator to raise the limit or free disk space");
    /// The task service latched disabled after an uncertain I/O error or corruption.
    STORE_UNAVAILABLE = (-32043, "TG_STORE_UNAVAILABLE",
        "the task store is disabled after a disk error until the daemon is restarted; the operator must check the disk and the logs");
    /// A creation reference was reused with different tool arguments.
    IDEMPOTENCY_CONFLICT = (-32044, "TG_TASK_IDEMPOTENCY_CONFLICT",
        "this operation reference was already used for a different call; use a new reference for a new call");
    /// No longer sent: an early poll is held until due, never refused. The
    /// entry keeps the number from being reused with another meaning.
    POLL_TOO_SOON = (-32045, "TG_TASK_POLL_TOO_SOON",
        "not sent by this version (early polls are paced, not refused); older versions asked to retry after data.retryAfterMs");
    /// A terminal payload exceeded the record limit and could not be spilled.
    RESULT_TOO_LARGE = (-32046, "TG_TASK_RESULT_TOO_LARGE",
        "the tool's result could not be stored in full; the task failed rather than keep a truncated result");
    /// The tool ran past its configured timeout.
    TOOL_TIMEOUT = (-32047, "TG_TOOL_TIMEOUT",
        "the tool ran longer than its timeout and was killed; its effects are unknown");
    /// The tool wrote more than its configured output cap.
    TOOL_OUTPUT_LIMIT = (-32048, "TG_TOOL_OUTPUT_LIMIT",
        "the tool wrote more output than its cap allows and was killed; ask the operator to raise max_stdout_bytes or narrow the call");
    /// The tool's program could not be started.
    TOOL_START_FAILED = (-32049, "TG_TOOL_START_FAILED",
        "the tool's program could not be started; the operator must check its argv and permissions");
    /// The tool's process was killed by a signal.
    TOOL_KILLED = (-32050, "TG_TOOL_KILLED",
        "the tool's process died from a signal; its effects are unknown");
    /// The tool was ended by one of its resource limits.
    TOOL_LIMIT = (-32060, "TG_TOOL_LIMIT",
        "the tool was stopped by one of its resource limits (the message names the [[tool]] key); its effects are unknown; ask the operator to raise that limit or narrow the call");
    /// Talking to the tool's process failed.
    TOOL_IO = (-32051, "TG_TOOL_IO",
        "reading the tool's output failed; its effects are unknown");
    /// The daemon is shutting down and admits no new calls.
    STOPPING = (-32054, "TG_SERVER_STOPPING",
        "the server is stopping; calls already admitted finish, new ones are refused; retry once it is back");
    /// Every running slot is taken and the tool runs only as a task.
    TASK_SLOTS_BUSY = (-32055, "TG_TASK_SLOTS_BUSY",
        "every background task slot (tasks.max_running) is taken and this tool runs only as a task; retry after a short delay");
    /// Every running slot is taken: a call that would start a tool right away is not run.
    RUN_SLOTS_BUSY = (-32056, "TG_RUN_SLOTS_BUSY",
        "every running slot (tasks.max_running) is taken by a tool run, background or synchronous; this call ran nothing; retry after a short delay");
    /// Too many requests at once.
    SERVER_BUSY = (-32052, "TG_SERVER_BUSY",
        "the server is at its concurrency limit; retry after a short delay");
    /// Every legacy session slot is taken.
    SESSIONS_FULL = (-32058, "TG_SESSIONS_FULL",
        "the server holds as many legacy sessions as it allows (server.max_sessions); close a session with DELETE, retry after idle ones expire, or use protocol 2026-07-28 without a session");
    /// An artifact could not be read.
    ARTIFACT_UNAVAILABLE = (-32053, "TG_ARTIFACT_UNAVAILABLE",
        "no stored result for this task and caller; it may have expired or the task produced none");
    /// Arguments that do not satisfy the tool's input schema.
    INVALID_ARGUMENTS = (-32602, "TG_INVALID_ARGUMENTS",
        "the arguments do not match the tool's inputSchema; data.location names the offending field");
    /// A tool name the server does not serve.
    UNKNOWN_TOOL = (-32602, "TG_UNKNOWN_TOOL",
        "no tool by this name; call tools/list for the tools this server serves");
    /// Request parameters that are malformed (other than tool arguments).
    INVALID_PARAMS = (-32602, "TG_INVALID_PARAMS",
        "a request parameter is malformed; the message names it");
    /// A method taskgate does not serve, or not to this request's protocol
    /// era (`tasks/*` on a legacy session, `initialize` at 2026-07-28).
    METHOD_NOT_FOUND = (-32601, "TG_METHOD_NOT_FOUND",
        "this method does not exist for this request's protocol version or session; the message names the methods served; tasks/* need protocol 2026-07-28 with the tasks extension declared");
    /// HTTP headers that do not mirror the body: `Mcp-Method` missing or
    /// another method, `MCP-Protocol-Version` missing or another version
    /// than the request's `_meta` names.
    HEADER_MISMATCH = (-32020, "TG_HEADER_MISMATCH",
        "the Mcp-Method or MCP-Protocol-Version header is missing or does not match the request body; send headers that mirror the body's method and _meta version");
    /// A tool that runs only as a task, called without the Tasks extension.
    TASKS_REQUIRED = (-32021, "TG_TASKS_REQUIRED",
        "this tool runs only as a task; declare the io.modelcontextprotocol/tasks extension on protocol 2026-07-28");
    /// A message that is not JSON at all.
    PARSE_ERROR = (-32700, "TG_PARSE_ERROR",
        "the message is not valid JSON; send one JSON-RPC 2.0 object");
    /// JSON that is not one JSON-RPC 2.0 message (a batch, a bad id or version, no method).
    INVALID_REQUEST = (-32600, "TG_INVALID_REQUEST",
        "the message is not a single JSON-RPC 2.0 request, notification or response; the message says which part is wrong");
    /// An HTTP request refused by the transport before it reached MCP (a
    /// header, the session table).
    HTTP_REFUSED = (-32600, "TG_HTTP_REFUSED",
        "the HTTP request was refused before it reached MCP (its headers or its session); the message and the HTTP status say what to change");
    /// A request body past `server.max_request_bytes`.
    REQUEST_TOO_LARGE = (-32600, "TG_REQUEST_TOO_LARGE",
        "the request body is larger than the server accepts (server.max_request_bytes); send less, e.g. store large inputs elsewhere and pass a reference");
    /// A request body that did not arrive in time.
    REQUEST_TIMEOUT = (-32057, "TG_REQUEST_TIMEOUT",
        "the request body did not arrive within server.body_read_timeout_ms; send the whole body at once");
    /// No credential, or one that is unknown, expired, revoked or otherwise invalid.
    UNAUTHENTICATED = (-32061, "TG_UNAUTHENTICATED",
        "this request needs a valid bearer token (Authorization: Bearer …); the WWW-Authenticate header says which kind; a token that stopped working has expired or was revoked");
    /// A valid credential without every scope the operation needs.
    FORBIDDEN = (-32062, "TG_FORBIDDEN",
        "the credential is valid but lacks scopes this operation needs; data.missingScopes and the WWW-Authenticate header list them all; ask for a token that grants them");
    /// The caller is at one of its own bounds.
    OWNER_LIMIT = (-32063, "TG_OWNER_LIMIT",
        "this caller already holds as many tasks, running tools or approval proposals as it may (the message names the limit); wait for some to finish, be decided or expire, or ask the operator to raise it");
    /// A browser request from a web origin that may not call (DNS rebinding defence).
    ORIGIN_NOT_ALLOWED = (-32064, "TG_ORIGIN_NOT_ALLOWED",
        "the request's Origin header names a web origin that may not call this server; the operator can list it in server.allowed_origins");
    /// The upstream MCP server of an `alias.tool` is not connected now (not
    /// yet, or since it was lost); nothing was sent.
    UPSTREAM_UNAVAILABLE = (-32065, "TG_UPSTREAM_UNAVAILABLE",
        "the upstream server of this tool is not connected now and nothing was sent to it; retry after a short delay (the operator sees why in taskgate status)");
    /// An upstream tool whose live description differs from its pin.
    UPSTREAM_TOOL_WITHHELD = (-32066, "TG_UPSTREAM_TOOL_WITHHELD",
        "the upstream changed this tool's description since the operator pinned it, so it is withheld; the operator reviews it with taskgate upstream show and pins it again");
    /// A forwarded request that took longer than `request_timeout_secs`.
    UPSTREAM_TIMEOUT = (-32067, "TG_UPSTREAM_TIMEOUT",
        "the upstream did not answer within its request timeout; the call was cancelled upstream and its effect there is unknown");
    /// An upstream answer larger than `max_response_bytes`.
    UPSTREAM_RESPONSE_TOO_LARGE = (-32068, "TG_UPSTREAM_RESPONSE_TOO_LARGE",
        "the upstream's answer was larger than its max_response_bytes and was refused; narrow the call or ask the operator to raise the bound");
    /// Every forwarding slot of the upstream is taken.
    UPSTREAM_BUSY = (-32069, "TG_UPSTREAM_BUSY",
        "the upstream already has as many requests in flight as it may (max_concurrent_requests); nothing was sent; retry after a short delay");
    /// The upstream answered the call with a JSON-RPC error.
    UPSTREAM_ERROR = (-32070, "TG_UPSTREAM_ERROR",
        "the upstream server refused or failed the call with an error of its own; data.upstreamCode and the message carry it");
    /// The connection to the upstream broke, or it sent something that is
    /// not MCP, while the call was in flight.
    UPSTREAM_CONNECTION_LOST = (-32071, "TG_UPSTREAM_CONNECTION_LOST",
        "the connection to the upstream ended (or it sent something that is not MCP) while the call was in flight; its effect there is unknown; the connection is made again");
    /// Routes or leases at their bound (4,096 in all, 256 unexpired per caller).
    ROUTE_CAPACITY = (-32072, "TG_TASK_ROUTE_CAPACITY",
        "taskgate holds as many durable routes or leases as it may (in all, or for this caller); nothing was sent; wait until some expire, then submit again");
    /// `tasks/update` on a routed task.
    UPDATE_UNSUPPORTED_DURABLE = (-32073, "TG_TASK_UPDATE_UNSUPPORTED_DURABLE",
        "a routed task cannot be updated: taskgate keeps no durable record of an update, so it could not tell an unsent update from a lost acknowledgement; cancel it or let it finish");
    /// A routed task whose outcome at the upstream is unknown.
    RECONCILIATION_REQUIRED = (-32074, "TG_TASK_RECONCILIATION_REQUIRED",
        "what the upstream did with this task is unknown (a lost answer, a restart, a changed connection or a reply taskgate could not trust); it was not sent again; check the upstream before submitting anew (the operator sees the reason with taskgate routes show)");
    /// A submission, lease or describe request taskgate refused.
    ROUTE_REFUSED = (-32075, "TG_ROUTE_REFUSED",
        "taskgate refused this durable submission before sending anything; data.check names the rule (schema, lease, capability, provider_interface, effect, bounds, input_digest; arguments are TG_INVALID_ARGUMENTS) and the message what to change");
    /// A routed submission taskgate ended itself without sending it.
    ROUTE_NOT_DISPATCHED = (-32076, "TG_ROUTE_NOT_DISPATCHED",
        "taskgate ended this routed task before sending it to the upstream (it stopped, or the upstream's connection changed first); nothing reached the upstream; submit again with a new idempotency key");
    /// Approvals cannot be decided here now.
    APPROVALS_UNAVAILABLE = (-32077, "TG_APPROVALS_UNAVAILABLE",
        "this tool needs an administrator's approval, and approvals are unavailable (not configured, or the approval journal failed its check); nothing was run or proposed; the operator finds the reason in `taskgate status`");
    /// An administrator rejected this exact call.
    APPROVAL_REJECTED = (-32078, "TG_APPROVAL_REJECTED",
        "an administrator rejected this exact call; the identical call is refused until data.untilMs, then it may be proposed again; nothing was run");
    /// Too many proposals wait for a decision.
    APPROVALS_FULL = (-32079, "TG_APPROVALS_FULL",
        "the approval journal is at a bound (approvals.max_pending calls waiting, or approvals.max_proposals kept; the message names it); nothing was run or proposed; retry once some are decided or forgotten");
    /// An approval task's journal evidence is missing or uncertain.
    APPROVAL_EVIDENCE_MISSING = (-32059, "TG_APPROVAL_EVIDENCE_MISSING",
        "this task waits on an approval the approval journal cannot vouch for now (approvals disabled, the journal damaged or shorter than the task's record); its status is not guessed; the operator restores the journal with the task store, or the task expires");
    /// A fault inside taskgate that the client cannot fix.
    INTERNAL = (-32603, "TG_INTERNAL",
        "an internal error occurred; the operator finds the detail in the daemon's log");
}

/// Codes fixed by JSON-RPC or MCP, which several named errors may share.
pub const PROTOCOL_CODES: &[i64] = &[-32700, -32600, -32602, -32601, -32603, -32021, -32020];

impl WireCode {
    /// The `data` object every taskgate error carries: its name and help.
    pub fn data(&self) -> serde_json::Value {
        serde_json::json!({ "name": self.name, "help": self.help })
    }

    /// `data` with extra fields merged in.
    pub fn data_with(&self, extra: serde_json::Value) -> serde_json::Value {
        let mut d = self.data();
        if let (Some(d), serde_json::Value::Object(extra)) = (d.as_object_mut(), extra) {
            d.extend(extra);
        }
        d
    }

    /// A whole JSON-RPC error response answering `id` with this code: the
    /// one place such a body is written (rmcp writes the ones it sends
    /// itself, from the `ErrorData` that `mcp::convert` builds with the
    /// same `data`).
    pub fn error_response(
        &self,
        id: &serde_json::Value,
        message: &str,
        extra: Option<&serde_json::Value>,
    ) -> serde_json::Value {
        let data = match extra {
            Some(extra) => self.data_with(extra.clone()),
            None => self.data(),
        };
        serde_json::json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": { "code": self.code, "message": message, "data": data },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn codes_and_names_are_unique_and_in_range() {
        let mut codes = HashSet::new();
        let mut names = HashSet::new();
        for w in ALL {
            let protocol = PROTOCOL_CODES.contains(&w.code);
            assert!(
                protocol || codes.insert(w.code),
                "duplicate code {}",
                w.code
            );
            assert!(names.insert(w.name), "duplicate name {}", w.name);
            assert!(w.name.starts_with("TG_"), "{} lacks the TG_ prefix", w.name);
            assert!(
                protocol || (-32079..=-32040).contains(&w.code),
                "{} uses {} outside the reserved range",
                w.name,
                w.code
            );
            assert!(!w.help.is_empty());
        }
    }
}
