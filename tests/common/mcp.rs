//! What an MCP client puts in its requests: the protocol versions, the
//! Tasks extension's name, and the `_meta` of a 2026-07-28 request.

use serde_json::{Value, json};

/// The stateless protocol version.
pub const V2026: &str = "2026-07-28";
/// The session protocol version before it.
pub const LEGACY: &str = "2025-11-25";
pub const TASKS_EXT: &str = "io.modelcontextprotocol/tasks";

/// `_meta` of a 2026-07-28 request from the client named `client`, with or
/// without the Tasks extension.
pub fn meta(client: &str, tasks: bool) -> Value {
    let mut extensions = serde_json::Map::new();
    if tasks {
        extensions.insert(TASKS_EXT.into(), json!({}));
    }
    json!({
        "io.modelcontextprotocol/protocolVersion": V2026,
        "io.modelcontextprotocol/clientCapabilities": {"extensions": extensions},
        "io.modelcontextprotocol/clientInfo": {"name": client, "version": "1"},
    })
}
