//! MCP serving: the protocol handler ([`handler`]), the task service it
//! drives ([`tasks`]), and the conversions between store records, process
//! outcomes and protocol shapes ([`convert`]).

pub mod convert;
pub mod handler;
pub mod tasks;

pub use handler::Handler;
pub use tasks::TaskService;
