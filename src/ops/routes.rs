//! Durable routes as the operator sees them: where each stands and why,
//! never its arguments (taskgate does not keep them).

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::{Ops, OpsError};
use crate::store::{RouteId, RoutePhase, RouteRecord};

/// Routes an operator listing holds at most.
pub const MAX_LISTED_ROUTES: u32 = 500;

/// A durable route as the operator sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouteStatus {
    pub id: String,
    /// The first 8 hex digits of the caller's identity digest.
    pub owner: String,
    pub upstream: String,
    pub capability: String,
    pub phase: String,
    /// What the caller reads: working, completed, failed or cancelled.
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coordinator: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_task_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel_reason: Option<String>,
    pub cancel_attempts: i64,
    pub cancel_acknowledged: bool,
    /// Whether the caller is told the route needs reconciliation (an
    /// unacknowledged cancel, or an unknown outcome).
    #[serde(default)]
    pub reconciliation_required: bool,
    /// The echo rule of its upstream now (`every_answer` or
    /// `creation_only`), when the upstream is still configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_echo: Option<String>,
    /// provider or broker, once terminal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    pub schema_digest: String,
    pub request_digest: String,
    pub binding_digest: String,
    /// RFC 3339, UTC.
    pub created: String,
    pub updated: String,
    pub deadline: String,
    pub expires: String,
    /// The submission binding (identifiers and digests only); in `show`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding: Option<serde_json::Value>,
}

/// RFC 3339, UTC, to the second.
pub(super) fn rfc3339(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t)
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn ms_rfc3339(ms: i64) -> String {
    rfc3339(SystemTime::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64))
}

impl Ops {
    /// The durable routes newest first (only the nonterminal ones when
    /// `open`, at most [`MAX_LISTED_ROUTES`]), or the one `id` names.
    pub async fn routes(&self, id: Option<&str>, open: bool) -> Result<Vec<RouteStatus>, OpsError> {
        let unavailable = |source| OpsError::StoreRead {
            what: "the routes",
            source,
        };
        match id {
            Some(id) => {
                let parsed =
                    RouteId::parse(id).ok_or_else(|| OpsError::NotARouteId(id.to_string()))?;
                match self.store.route(&parsed).await.map_err(unavailable)? {
                    Some(r) => Ok(vec![self.route_status(&r, true)]),
                    None => Err(OpsError::UnknownRoute(id.to_string())),
                }
            }
            None => Ok(self
                .store
                .list_routes(MAX_LISTED_ROUTES, open)
                .await
                .map_err(unavailable)?
                .iter()
                .map(|r| self.route_status(r, false))
                .collect()),
        }
    }

    /// A route as the operator sees it; `binding` only for one route.
    fn route_status(&self, r: &RouteRecord, binding: bool) -> RouteStatus {
        // What the caller reads comes from the router's own view, so the two
        // never disagree.
        let (status, reconciliation_required) = match self.svc.router() {
            Some(router) => {
                let (status, needs) = router.reads_as(r);
                (status.as_str(), needs)
            }
            None => match r.phase {
                RoutePhase::Terminal => (r.status.map(|s| s.as_str()).unwrap_or("failed"), false),
                RoutePhase::ReconciliationRequired => ("failed", true),
                _ => ("working", false),
            },
        };
        RouteStatus {
            id: r.id.to_string(),
            owner: r.owner.to_hex()[..8].to_string(),
            upstream: r.upstream.clone(),
            capability: r.capability.clone(),
            phase: r.phase.as_str().to_string(),
            status: status.to_string(),
            reason: r.reason.clone(),
            session: r.session.clone(),
            coordinator: r.coordinator.clone(),
            upstream_task_id: r.upstream_task_id.clone(),
            cancel_reason: r.cancel_reason.clone(),
            cancel_attempts: r.cancel_attempts,
            cancel_acknowledged: r.cancel_acknowledged,
            reconciliation_required,
            route_echo: self
                .upstreams
                .route_echo(&r.upstream)
                .map(|e| e.as_str().to_string()),
            decided_by: r.decider.map(|d| d.as_str().to_string()),
            schema_digest: r.schema_digest.clone(),
            request_digest: r.request_digest.to_hex(),
            binding_digest: r.binding_digest.to_hex(),
            created: ms_rfc3339(r.created_ms),
            updated: ms_rfc3339(r.updated_ms),
            deadline: ms_rfc3339(r.deadline_ms),
            expires: ms_rfc3339(r.expires_ms),
            binding: binding.then(|| r.binding_json()),
        }
    }
}
