//! Why a durable-route request was refused. Each variant knows its wire
//! code; the protocol layer converts them like every other refusal.

use serde_json::{Value, json};
use thiserror::Error;

use crate::store::StoreError;
use crate::wire::{self, WireCode};

/// The rule a refused submission, lease or description broke, named in
/// the error's `data.check`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// The request's shape or its submission schema.
    Schema,
    /// The lease: unknown, expired, or not covering the capability.
    Lease,
    /// The capability: unknown, not pinned, not Tasks-capable, disconnected.
    Capability,
    /// `providerInterfaceVersion` is not the capability's schema digest.
    ProviderInterface,
    /// The effect: the lease's effects or `permittedEffect`.
    Effect,
    /// A declared bound (attempt, cleanup, sizes, runtime, retention,
    /// deadline).
    Bounds,
    /// `inputDigest` is not the digest of the arguments.
    InputDigest,
    /// The arguments do not fit the capability's input schema.
    Arguments,
}

impl Check {
    pub fn as_str(self) -> &'static str {
        match self {
            Check::Schema => "schema",
            Check::Lease => "lease",
            Check::Capability => "capability",
            Check::ProviderInterface => "provider_interface",
            Check::Effect => "effect",
            Check::Bounds => "bounds",
            Check::InputDigest => "input_digest",
            Check::Arguments => "arguments",
        }
    }
}

#[derive(Debug, Error)]
pub enum RouteError {
    /// Nothing was stored or sent.
    #[error("{message}")]
    Refused { check: Check, message: String },
    #[error(
        "taskgate_submit creates a task: declare the io.modelcontextprotocol/tasks extension on protocol 2026-07-28"
    )]
    TasksRequired,
    #[error(
        "this idempotency key was already used by this caller for a different submission; use a new key for a new submission"
    )]
    IdempotencyConflict,
    #[error("task not found")]
    UnknownTask,
    #[error(
        "a routed task cannot be updated: taskgate keeps no durable record of an update, so it could not tell an unsent one from a lost acknowledgement"
    )]
    UpdateUnsupported,
    #[error(
        "this credential lacks the scope{} {} needed here; ask for a token that grants {}",
        if missing.len() == 1 { "" } else { "s" },
        missing.join(", "),
        if missing.len() == 1 { "it" } else { "them" }
    )]
    Forbidden { missing: Vec<String> },
    #[error("{0}")]
    Store(StoreError),
    #[error("{0}")]
    Internal(String),
}

impl RouteError {
    pub fn refused(check: Check, message: impl Into<String>) -> RouteError {
        RouteError::Refused {
            check,
            message: message.into(),
        }
    }

    pub fn wire(&self) -> WireCode {
        match self {
            RouteError::Refused {
                check: Check::Arguments,
                ..
            } => wire::INVALID_ARGUMENTS,
            RouteError::Refused { .. } => wire::ROUTE_REFUSED,
            RouteError::TasksRequired => wire::TASKS_REQUIRED,
            RouteError::IdempotencyConflict => wire::IDEMPOTENCY_CONFLICT,
            RouteError::UnknownTask => wire::UNKNOWN_TASK,
            RouteError::UpdateUnsupported => wire::UPDATE_UNSUPPORTED_DURABLE,
            RouteError::Forbidden { .. } => wire::FORBIDDEN,
            RouteError::Store(e) => store_wire(e),
            RouteError::Internal(_) => wire::INTERNAL,
        }
    }

    /// What the caller reads: a disabled store's detail is the operator's.
    pub fn message(&self) -> String {
        match self {
            RouteError::Store(
                StoreError::Disabled { .. } | StoreError::Uncertain { .. } | StoreError::Stopped,
            ) => "the task store is unavailable; nothing was sent".into(),
            RouteError::Store(e @ StoreError::RouteCapacity { .. }) => {
                format!("{e}; nothing was sent")
            }
            other => other.to_string(),
        }
    }

    pub fn data(&self) -> Option<Value> {
        match self {
            RouteError::Refused { check, .. } => {
                Some(json!({"check": check.as_str(), "sent": false}))
            }
            RouteError::Forbidden { missing } => Some(json!({"missingScopes": missing})),
            RouteError::TasksRequired => Some(json!({
                "requiredCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}
            })),
            RouteError::Store(StoreError::RouteCapacity { limit, per_caller }) => {
                Some(json!({"limit": limit, "perCaller": per_caller, "sent": false}))
            }
            _ => None,
        }
    }
}

/// The registered code a refusal of the store goes out with, wherever it
/// surfaces (a task's refusal, a route's, an operator's read): the one
/// place it is decided. It lives here, the deepest module above the store
/// that `tasks` and `ops` both reach.
pub fn store_wire(e: &StoreError) -> WireCode {
    match e {
        StoreError::Busy { .. } => wire::STORE_BUSY,
        StoreError::Capacity(_) => wire::STORE_CAPACITY,
        StoreError::RouteCapacity { .. } => wire::ROUTE_CAPACITY,
        StoreError::Disabled { .. } | StoreError::Uncertain { .. } | StoreError::Stopped => {
            wire::STORE_UNAVAILABLE
        }
        _ => wire::INTERNAL,
    }
}

impl From<StoreError> for RouteError {
    fn from(e: StoreError) -> RouteError {
        match e {
            StoreError::Conflict => RouteError::IdempotencyConflict,
            other => RouteError::Store(other),
        }
    }
}
