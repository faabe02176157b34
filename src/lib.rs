//! taskgate: a durable MCP Tasks daemon backed by SQLite.
//!
//! See docs/ARCHITECTURE.md for the map of modules and their rules.

pub mod admin;
pub mod approvals;
pub mod artifacts;
pub mod auth;
pub mod backup;
pub mod bench;
pub mod cli;
pub mod client;
pub mod config;
pub mod events;
pub mod exit;
pub mod http;
pub mod logging;
pub mod mcp;
pub mod metrics;
pub mod ops;
pub mod parts;
pub mod route;
pub mod service;
pub mod startup;
pub mod state_dir;
pub mod store;
pub mod tasks;
pub mod testhooks;
pub mod tools;
pub mod upstream;
pub mod verify;
pub mod wire;
