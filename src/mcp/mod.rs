//! MCP serving: the protocol handler ([`handler`]), the conversions
//! between the task domain and the protocol library's types ([`convert`]),
//! the screen every incoming message passes first ([`screen`]), and stdio
//! served through it ([`stdio`]).
//! The protocol library's types stop here; `tasks/` never sees them.

pub mod convert;
pub mod handler;
pub mod screen;
pub mod stdio;

pub use handler::Handler;
