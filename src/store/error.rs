//! The store's runtime errors as taskgate's callers see them: every
//! refusal of the engine (busy, disabled, uncertain, full) and of a kind
//! (a bound, a conflict), each with the text and the wire code it always
//! had. Refusals of opening are the engine's [`OpenError`], classified here.

use taskgate_store_engine::{EngineError, FullKind, OpenError};
use thiserror::Error;

use crate::exit::{Classify, ExitClass};

/// Why a creation hit a capacity bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CapacityKind {
    /// `store.max_live_tasks` unexpired rows exist.
    LiveTasks { limit: u64 },
    /// The owner holds `store.max_live_tasks_per_owner` unexpired tasks.
    OwnerTasks { limit: u64 },
    /// SQLite reached `max_page_count` (cleanup still works).
    PageCap { pages: u64 },
    /// The filesystem is full (cleanup may need space too).
    DiskFull,
}

impl std::fmt::Display for CapacityKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CapacityKind::LiveTasks { limit } => {
                write!(f, "{limit} unexpired tasks retained (store.max_live_tasks)")
            }
            CapacityKind::OwnerTasks { limit } => {
                write!(
                    f,
                    "this caller already holds {limit} unexpired tasks (store.max_live_tasks_per_owner); wait until some expire"
                )
            }
            CapacityKind::PageCap { pages } => {
                write!(
                    f,
                    "database page cap of {pages} pages reached (store.max_db_pages)"
                )
            }
            CapacityKind::DiskFull => {
                f.write_str("the filesystem under the state directory is full")
            }
        }
    }
}

/// Errors of store operations after a successful open.
#[derive(Debug, Clone, Error, PartialEq)]
pub enum StoreError {
    #[error("task store busy: its queue of {depth} commands is full; retry shortly")]
    Busy { depth: usize },
    #[error("task store at capacity: {0}")]
    Capacity(CapacityKind),
    #[error("task store disabled until restart: {reason}")]
    Disabled { reason: String },
    #[error("task store write outcome unknown ({detail}); the store is now disabled until restart")]
    Uncertain { detail: String },
    #[error("operation reference reused with a different request")]
    Conflict,
    #[error("{}", route_capacity(*limit, *per_caller))]
    RouteCapacity { limit: u64, per_caller: bool },
    #[error("payload of {size} bytes exceeds the {limit}-byte record limit")]
    PayloadTooLarge { size: usize, limit: usize },
    #[error("invalid task parameters: {0}")]
    Invalid(String),
    #[error("task store stopped")]
    Stopped,
    #[error("task store error: {0}")]
    Internal(String),
}

fn route_capacity(limit: u64, per_caller: bool) -> String {
    if per_caller {
        format!(
            "this caller already holds {limit} unexpired routes or leases; wait until some expire"
        )
    } else {
        format!("{limit} route or lease records are held in all; wait until some expire")
    }
}

impl From<EngineError<StoreError>> for StoreError {
    fn from(e: EngineError<StoreError>) -> StoreError {
        match e {
            EngineError::Busy { depth } => StoreError::Busy { depth },
            EngineError::Full(FullKind::PageCap { pages }) => {
                StoreError::Capacity(CapacityKind::PageCap { pages })
            }
            EngineError::Full(FullKind::DiskFull) => StoreError::Capacity(CapacityKind::DiskFull),
            EngineError::Disabled { reason } => StoreError::Disabled { reason },
            EngineError::Uncertain { detail } => StoreError::Uncertain { detail },
            EngineError::Stopped => StoreError::Stopped,
            EngineError::Internal(detail) => StoreError::Internal(detail),
            EngineError::Refused(e) => e,
        }
    }
}

/// Errors that refuse opening the store (startup steps 4–7): 74 on I/O,
/// 65 for a database taskgate will not serve.
impl Classify for OpenError {
    fn exit_class(&self) -> ExitClass {
        match self {
            OpenError::Io { .. } | OpenError::Thread(_) => ExitClass::Io,
            _ => ExitClass::DatabaseInvalid,
        }
    }
}
