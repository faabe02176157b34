//! MCP serving: the protocol handler ([`handler`]) and the conversions
//! between the task domain and the protocol library's types ([`convert`]).
//! The protocol library's types stop here; `tasks/` never sees them.

pub mod convert;
pub mod handler;

pub use handler::Handler;
