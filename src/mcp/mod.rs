//! MCP serving: the protocol handler ([`handler`]), the conversions
//! between the task domain and the protocol library's types ([`convert`]),
//! the screen every incoming message passes first ([`screen`]), and stdio
//! served through it ([`stdio`]).
//! The protocol library's types stop here; `tasks/` never sees them.
//!
//! A tool call's path: over HTTP the body is read whole (bounded in size and
//! time) and screened (`mcp::screen`: one well-formed JSON-RPC message whose
//! parameters fit the method) before it takes a request slot; over stdio each
//! line passes the same screen. Then rmcp decodes the request and creates an
//! `mcp::Handler` (one per stdio connection, per legacy HTTP session, or per
//! stateless 2026-07-28 HTTP request) → the handler decides whether this
//! request negotiated Tasks and who the owner is, and builds a `tasks::Call` →
//! `tasks::TaskService::call` refuses it while stopping, finds the
//! `tools::Runner`, validates the arguments, takes a running slot (a
//! synchronous run holds one too; with none free the call is refused at once,
//! never queued), commits the task (`store`), and only then spawns the run on
//! its `TaskTracker`; the reply is the committed record, which `mcp::convert`
//! turns into the task handle. The run writes the terminal outcome once
//! (`store::Store::finish`), spilling a large result to `artifacts/` first. Any
//! refusal on the way is a `tasks::TaskError`, which knows its wire code;
//! `mcp::convert::error` is the one conversion to the protocol's error. A tool
//! of an upstream MCP server takes the same path: the `tools::Registry` finds
//! it through its `ToolSource` (`upstream::Upstreams`), and its run forwards
//! the call on that upstream's connection instead of starting a process.
//!
//! Owns the protocol. `handler.rs` is the rmcp `ServerHandler`: Tasks
//! advertised to 2026-07-28 requests (also after a disk error disabled the
//! store: then `tasks/*` answer `TG_STORE_UNAVAILABLE`), a session opened with
//! legacy `initialize` never sees the extension and gets `TG_METHOD_NOT_FOUND`
//! from `tasks/*`; decides per request whether Tasks was negotiated and who the
//! caller is: over stdio the local caller, over HTTP the `Caller` the
//! authentication middleware put into the request (its absence is refused,
//! never taken as local). `convert.rs` turns records and results into protocol
//! shapes and is **the one place a protocol error value is built**, always from
//! a `wire` entry (the only other JSON-RPC error bodies are the screen's
//! refusals and the HTTP middlewares' 503/408/413s: busy or stopping, legacy
//! sessions full, body late or too large; all from `wire` entries). `screen.rs`
//! looks at every incoming message before rmcp does, because rmcp misreports
//! malformed input (plain-text 415, silence on stdio, -32601 for a known method
//! with bad parameters): not JSON → -32700, a batch or broken envelope →
//! -32600, a request for a method taskgate does not serve → -32601 whatever its
//! parameters (rmcp would first refuse an array or missing `params`, or a
//! 2026-07-28 request without `_meta`, with -32602), parameters of a served
//! method that do not deserialize into the handler's types → -32602; what
//! passes is tagged with its `Kind` (a `tools/call` or not). The served methods
//! are listed in the screen; `initialize` and `ping` only to a legacy request:
//! one whose `_meta` version (else, over HTTP, its `MCP-Protocol-Version`
//! header) names 2026-07-28 or later gets -32601 for them, while the version
//! offered inside a legacy `initialize`'s params is negotiated down as before;
//! before answering -32601 in rmcp's place the screen checks the mirrored HTTP
//! headers as rmcp does (`Mcp-Method` for a 2026-07-28 request,
//! `MCP-Protocol-Version` against the `_meta` version): -32020
//! `TG_HEADER_MISMATCH`. `stdio.rs` is a line pump between the process's stdio
//! and rmcp: lines bounded by `server.max_request_bytes`, screened, refusals
//! written as whole lines between rmcp's. No business logic.

pub mod convert;
pub mod handler;
pub mod screen;
pub mod stdio;

pub use handler::Handler;
