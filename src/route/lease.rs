//! `taskgate_describe` and `taskgate_lease`: what may be routed now, and an
//! exact capability lease a submission is made under. A lease's expiry is
//! an absolute Unix-millisecond time, kept in the store: a restart gives it
//! no more life.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::error::{Check, RouteError};
use super::submission::{CONSERVATIVE_EFFECT, MAX_RETENTION_MS};
use crate::config::Effect;
use crate::upstream::Routable;

/// Capabilities one lease may name.
pub const MAX_LEASE_CAPABILITIES: usize = 16;
/// A lease's life when the caller names none.
pub const DEFAULT_LEASE_MS: u64 = 600_000;
/// The longest life a lease may ask for.
pub const MAX_LEASE_MS: u64 = MAX_RETENTION_MS;

pub fn effect_name(e: Effect) -> &'static str {
    match e {
        Effect::ReadOnly => "read_only",
        Effect::IdempotentWrite => "idempotent_write",
        Effect::NonIdempotentWrite => "non_idempotent_write",
    }
}

const EFFECT_NAMES: [&str; 3] = ["read_only", "idempotent_write", "non_idempotent_write"];

/// One capability as `taskgate_describe` shows it.
pub fn described(r: &Routable) -> Value {
    json!({
        "name": r.name,
        "upstream": r.upstream,
        "tool": r.remote,
        "description": r.description,
        "inputSchema": r.input_schema,
        "schemaDigest": r.schema_digest,
        "effect": effect_name(r.effect),
        "taskCeiling": CONSERVATIVE_EFFECT,
    })
}

/// A leased capability: its name and the schema digest it was leased at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Leased {
    pub name: String,
    pub schema_digest: String,
}

/// A lease's body: what the caller is given and the store keeps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Lease {
    pub lease_id: String,
    pub capabilities: Vec<Leased>,
    pub effects: Vec<String>,
    pub expires_at_unix_ms: i64,
}

/// The arguments of `taskgate_lease`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeaseRequest {
    pub capabilities: Vec<String>,
    pub effects: Vec<String>,
    #[serde(default)]
    pub ttl_ms: Option<u64>,
}

impl LeaseRequest {
    pub fn parse(args: &Value) -> Result<LeaseRequest, RouteError> {
        let r: LeaseRequest = serde_json::from_value(args.clone()).map_err(|e| {
            RouteError::refused(
                Check::Schema,
                format!(
                    "taskgate_lease takes {{\"capabilities\": [\"ALIAS.TOOL\"…], \"effects\": […], \"ttlMs\": N}}: {e}"
                ),
            )
        })?;
        if r.capabilities.is_empty() || r.capabilities.len() > MAX_LEASE_CAPABILITIES {
            return Err(RouteError::refused(
                Check::Schema,
                format!("a lease names 1-{MAX_LEASE_CAPABILITIES} capabilities"),
            ));
        }
        if let Some(unknown) = r
            .effects
            .iter()
            .find(|e| !EFFECT_NAMES.contains(&e.as_str()))
        {
            return Err(RouteError::refused(
                Check::Effect,
                format!(
                    "unknown effect {unknown:?}; effects are read_only, idempotent_write and non_idempotent_write"
                ),
            ));
        }
        if let Some(ttl) = r.ttl_ms
            && (ttl == 0 || ttl > MAX_LEASE_MS)
        {
            return Err(RouteError::refused(
                Check::Bounds,
                format!("ttlMs must be 1-{MAX_LEASE_MS}"),
            ));
        }
        Ok(r)
    }

    /// Checks the effects against the capabilities found, and makes the
    /// lease. A lease must carry each capability's descriptive effect and
    /// the conservative class every durable submission runs under.
    pub fn grant(
        &self,
        found: &[Routable],
        lease_id: String,
        now_ms: i64,
    ) -> Result<Lease, RouteError> {
        let effects: BTreeSet<&str> = self.effects.iter().map(String::as_str).collect();
        for r in found {
            let needed = effect_name(r.effect);
            if !effects.contains(needed) {
                return Err(RouteError::refused(
                    Check::Effect,
                    format!(
                        "the lease's effects lack {needed:?}, the effect of {}; a lease carries every leased capability's effect",
                        r.name
                    ),
                ));
            }
        }
        if !effects.contains(CONSERVATIVE_EFFECT) {
            return Err(RouteError::refused(
                Check::Effect,
                format!(
                    "the lease's effects lack {CONSERVATIVE_EFFECT:?}: a durable submission is always treated as a non-idempotent write"
                ),
            ));
        }
        let ttl = self.ttl_ms.unwrap_or(DEFAULT_LEASE_MS);
        Ok(Lease {
            lease_id,
            capabilities: found
                .iter()
                .map(|r| Leased {
                    name: r.name.clone(),
                    schema_digest: r.schema_digest.clone(),
                })
                .collect(),
            effects: effects.into_iter().map(str::to_string).collect(),
            expires_at_unix_ms: now_ms.saturating_add(ttl as i64),
        })
    }
}

impl Lease {
    /// Whether this lease covers `routable` at `schema_digest` for a durable
    /// submission.
    pub fn covers(&self, routable: &Routable, schema_digest: &str) -> Result<(), RouteError> {
        if !self
            .capabilities
            .iter()
            .any(|c| c.name == routable.name && c.schema_digest == schema_digest)
        {
            return Err(RouteError::refused(
                Check::Lease,
                format!(
                    "lease {} does not cover {} at schema digest {schema_digest}; take a new lease with taskgate_lease",
                    self.lease_id, routable.name
                ),
            ));
        }
        for needed in [effect_name(routable.effect), CONSERVATIVE_EFFECT] {
            if !self.effects.iter().any(|e| e == needed) {
                return Err(RouteError::refused(
                    Check::Effect,
                    format!("lease {} lacks the effect {needed:?}", self.lease_id),
                ));
            }
        }
        Ok(())
    }
}
