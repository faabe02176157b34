//! Durable routes: one bounded submission to a Tasks-capable upstream,
//! recoverable by its public task ID after a lost answer or a restart, and
//! never sent twice.
//!
//! The meta-tools (`taskgate_describe`, `taskgate_lease`, `taskgate_submit`)
//! and `tasks/get`, `tasks/cancel`, `tasks/update` for a route's public ID
//! (`tgr-…`) are answered here. A submission is checked whole (shape,
//! bounds, input digest, lease, capability, schema digest, effect, scopes)
//! before anything is stored; then every step is committed before the step
//! that depends on it: the route and its binding (prepared), the session it
//! goes out on (dispatching), the upstream's task ID (routed, written
//! once). An answer taskgate cannot trust, or none at all, leaves the route
//! in reconciliation: it is never sent again. A route is polled upstream
//! only on the exact session it was dispatched on.
//!
//! This module knows the store's routes, the upstreams' sessions and the
//! caller's identity digest; it knows nothing of the protocol library.
//!
//! Owns durable routes to upstream tasks. `Router` answers the meta-tools
//! (`taskgate_describe`, `taskgate_lease`, `taskgate_submit`, listed only while
//! a capability is routable) and `tasks/get`, `tasks/cancel` and `tasks/update`
//! for a `tgr-` task ID; `tasks` hands it both and knows nothing more of
//! routes. `submission.rs`: `taskgate.task-submission/1` read strictly, its
//! bounds (64 KiB of canonical input and of accepted output, 30 s declared
//! runtime, 8 MiB declared artifacts, one hour of retention and deadline,
//! exactly one attempt, cleanup required, `non_idempotent_write` as the
//! permitted effect), the input digest (SHA-256 of the RFC 8785 form of the
//! arguments) and the binding (every identity and declaration of the
//! submission, no argument value; what it was bound to upstream is the route's
//! source digest, kept beside it); `lease.rs`: what `taskgate_describe` shows
//! and the leases (the effects must include each capability's own and
//! `non_idempotent_write`; the expiry an absolute Unix-millisecond time);
//! `error.rs`: `RouteError` and the `Check` named in `data.check`, each knowing
//! its wire code. Rules: a submission seen before (the same caller and key) is
//! answered by its route, the same binding getting the same task and another a
//! conflict, before anything but its input's size and digest is checked, so
//! recovery lasts the route's retention; a new one is checked whole before
//! anything is stored; every step is committed before the step that depends on
//! it (the route and its binding, then the session it goes out on, then the
//! upstream's task ID, written once; a cancel's intent before the cancel);
//! nothing is ever sent twice: an answer that is lost, late, of the wrong kind,
//! or whose echo of the execution envelope differs in any identity leaves the
//! route `reconciliation_required`, and only an answer that proves nothing was
//! sent ends it not dispatched; a route is polled and cancelled only on the
//! exact upstream session it was dispatched on, and a changed session,
//! configuration or capability makes it reconciliation-only; the upstream is
//! polled at most once per poll interval; a `tasks/get` answer is taken only
//! when its task ID is the bound one and its echo matches whole (a missing echo
//! only under the upstream's explicit `route_echo = "creation_only"`), anything
//! else is reconciliation; a cancel attempt is counted in the route before it
//! is sent and one per route is in flight (`CancelSlot`), two in the route's
//! life, and an unacknowledged one leaves the route `cancel_requested`,
//! reported as needing reconciliation; a route in reconciliation whose upstream
//! task is bound and whose session is current is still polled (never
//! resubmitted) and reads `working` until a verified terminal answer ends it,
//! and one whose session or configuration is gone is detached (its session
//! forgotten) and final; a poll past the deadline commits a cancel first;
//! callers get the binding in the submit's answer and never the provider's task
//! ID; dispatch waits at most the smaller of `request_timeout_secs` and 30 s, a
//! poll or a cancel the smaller of it and 10 s; provider completion is kept
//! apart from acceptance and verification in a result's
//! `_meta["dev.taskgate/route"]`; a dispatch runs on its own tracked task, so a
//! caller who leaves does not cut it between two commits. Knows the store's
//! routes and leases, the upstreams' routable capabilities and sessions
//! (through `upstream::Upstreams`), the auth scopes and the caller's owner
//! digest; speaks no type of the MCP SDK (`upstream::durable` does) and must not know the
//! protocol library or HTTP.

mod error;
mod lease;
mod submission;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio_util::task::TaskTracker;

use crate::auth::{self, Caller};
use crate::config::{Effect, RouteEcho, TaskMode};
use crate::ids::{CoordinatorId, LeaseId};
use crate::store::{
    Advanced, Decider, Digest, ErrorBody, LeaseRecord, NewRoute, Outcome, Prepared, RouteChange,
    RouteId, RoutePhase, RouteRecord, Store, TaskId, TaskRecord, TaskStatus,
};
use crate::tools::{Shown, ToolSpec};
use crate::upstream::{Answer, Failure, PollFailure, Routable, Upstreams};
use crate::{testhooks, wire};

pub use error::{Check, RouteError, store_wire};
pub use lease::{DEFAULT_LEASE_MS, Lease, MAX_LEASE_MS};
pub use submission::{
    CONSERVATIVE_EFFECT, MAX_ARTIFACT_BYTES, MAX_IO_BYTES, MAX_RETENTION_MS, MAX_RUNTIME_MS,
    SUBMISSION_SCHEMA, Submission, input_digest,
};

pub const DESCRIBE_TOOL: &str = "taskgate_describe";
pub const LEASE_TOOL: &str = "taskgate_lease";
pub const SUBMIT_TOOL: &str = "taskgate_submit";

/// The `_meta` key of a routed result's route metadata.
pub const ROUTE_META_KEY: &str = "dev.taskgate/route";

/// The longest a submission waits for the upstream's answer, whatever the
/// upstream's `request_timeout_secs` says.
pub const MAX_DISPATCH_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest a poll or a cancel waits for the upstream.
pub const MAX_POLL_TIMEOUT: Duration = Duration::from_secs(10);
/// Cancels forwarded for one route: the first, and one retry at a later poll.
pub const MAX_CANCEL_ATTEMPTS: i64 = 2;
/// Longest upstream status message passed on.
const MAX_STATUS_MESSAGE: usize = 256;

/// Whether a tool name is one of the route's meta-tools.
pub fn is_meta_tool(name: &str) -> bool {
    matches!(name, DESCRIBE_TOOL | LEASE_TOOL | SUBMIT_TOOL)
}

/// Whether a task ID is a route's.
pub fn is_route_id(id: &str) -> bool {
    RouteId::claims(id)
}

/// What a meta-tool call gives back.
#[derive(Debug)]
pub enum MetaAnswer {
    /// A tool result (the JSON shape of `CallToolResult`).
    Result(Value),
    /// The route's public task, and what the caller is given of the route
    /// itself (its binding as committed, and the digests).
    Task { task: TaskRecord, route: Value },
}

pub struct Router {
    store: Store,
    upstreams: Arc<Upstreams>,
    /// This coordinator instance: minted at each start, recorded with each
    /// dispatch.
    coordinator: String,
    poll_interval: Duration,
    /// When each route was last asked of its upstream, so that an eager
    /// caller does not turn into an eager poller upstream (bounded by the
    /// route limit).
    polled: Mutex<HashMap<RouteId, i64>>,
    /// Routes with a cancel in flight upstream: at most one each, however
    /// many callers poll or cancel meanwhile (bounded by the route limit).
    cancelling: Mutex<HashSet<RouteId>>,
    /// Dispatches in flight: they finish even when the caller goes away.
    dispatches: TaskTracker,
}

/// A route's one cancel slot, released when the attempt is over.
struct CancelSlot<'a> {
    held: &'a Mutex<HashSet<RouteId>>,
    id: RouteId,
}

impl Drop for CancelSlot<'_> {
    fn drop(&mut self) {
        lock(self.held).remove(&self.id);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn cut(text: &str, max: usize) -> String {
    let mut s = text.to_string();
    if s.len() > max {
        let mut at = max;
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
    }
    s
}

fn text_result(value: Value) -> Value {
    json!({
        "content": [{"type": "text", "text": value.to_string()}],
        "structuredContent": value,
        "isError": false,
    })
}

fn error_outcome(code: wire::WireCode, message: String, extra: Option<Value>) -> Outcome {
    Outcome::Error(ErrorBody {
        code: code.code,
        message,
        data: Some(match extra {
            Some(e) => code.data_with(e),
            None => code.data(),
        }),
    })
}

impl Router {
    pub fn new(store: Store, upstreams: Arc<Upstreams>, poll_interval: Duration) -> Arc<Router> {
        Arc::new(Router {
            store,
            upstreams,
            coordinator: CoordinatorId::generate()
                .map(CoordinatorId::into_string)
                .unwrap_or_else(|_| "unrandom".into()),
            poll_interval,
            polled: Mutex::new(HashMap::new()),
            cancelling: Mutex::new(HashSet::new()),
            dispatches: TaskTracker::new(),
        })
    }

    fn now(&self) -> i64 {
        self.store.clock().now_ms()
    }

    /// The meta-tools, listed while at least one capability is routable.
    pub fn specs(&self) -> Vec<ToolSpec> {
        if !self.upstreams.any_routable() {
            return Vec::new();
        }
        let spec = |name: &str, description: &str, schema: Value, effect, task| ToolSpec {
            name: name.into(),
            description: description.into(),
            input_schema: schema,
            effect,
            task,
            shown: Shown::default(),
        };
        vec![
            spec(
                DESCRIBE_TOOL,
                "Lists the upstream capabilities a durable task may be submitted to now: each with its schemaDigest (copy it into providerInterfaceVersion), its descriptive effect and the task ceiling.",
                json!({"type": "object", "properties": {"upstream": {"type": "string"}}, "additionalProperties": false}),
                Effect::ReadOnly,
                TaskMode::Never,
            ),
            spec(
                LEASE_TOOL,
                "Leases exact capabilities for durable submission: name them and list effects that include each one's effect and non_idempotent_write. The lease expires at an absolute Unix-millisecond time.",
                json!({"type": "object", "required": ["capabilities", "effects"], "properties": {
                    "capabilities": {"type": "array", "items": {"type": "string"}},
                    "effects": {"type": "array", "items": {"type": "string"}},
                    "ttlMs": {"type": "integer", "minimum": 1}
                }, "additionalProperties": false}),
                Effect::ReadOnly,
                TaskMode::Never,
            ),
            spec(
                SUBMIT_TOOL,
                "Submits one bounded operation to a leased upstream capability as a durable task (taskgate.task-submission/1). Poll tasks/get with the returned task ID; the same idempotencyKey and submission return the same task and never send it twice.",
                json!({"type": "object", "required": ["submission", "arguments"], "properties": {
                    "submission": {"type": "object"},
                    "arguments": {"type": "object"}
                }, "additionalProperties": false}),
                Effect::NonIdempotentWrite,
                TaskMode::Required,
            ),
        ]
    }

    /// Runs a meta-tool for `caller` (whose stored identity is `owner`).
    pub async fn call(
        self: &Arc<Self>,
        tool: &str,
        arguments: Option<Map<String, Value>>,
        caller: &Caller,
        owner: Digest,
        negotiated: bool,
    ) -> Result<MetaAnswer, RouteError> {
        authorize(caller, &[auth::SCOPE_TOOLS_CALL])?;
        let args = Value::Object(arguments.unwrap_or_default());
        match tool {
            DESCRIBE_TOOL => self.describe(&args).map(MetaAnswer::Result),
            LEASE_TOOL => self.lease(&args, owner).await.map(MetaAnswer::Result),
            SUBMIT_TOOL => {
                if !negotiated {
                    return Err(RouteError::TasksRequired);
                }
                let task = self.submit(&args, caller, owner).await?;
                let route = match RouteId::parse(task.id.as_str()) {
                    Ok(id) => self.store.route(&id).await?.map(|r| submitted(&r)),
                    Err(_) => None,
                };
                Ok(MetaAnswer::Task {
                    task,
                    route: route.unwrap_or(Value::Null),
                })
            }
            other => Err(RouteError::Internal(format!("{other} is not a meta-tool"))),
        }
    }

    fn describe(&self, args: &Value) -> Result<Value, RouteError> {
        let only = match args.get("upstream") {
            None => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => {
                return Err(RouteError::refused(
                    Check::Schema,
                    "taskgate_describe takes {\"upstream\": \"ALIAS\"} or nothing",
                ));
            }
        };
        if let Some(extra) = args
            .as_object()
            .and_then(|o| o.keys().find(|k| *k != "upstream"))
        {
            return Err(RouteError::refused(
                Check::Schema,
                format!("taskgate_describe has no argument {extra:?}"),
            ));
        }
        let capabilities: Vec<Value> = self
            .upstreams
            .routable()
            .iter()
            .filter(|r| only.as_ref().is_none_or(|u| &r.upstream == u))
            .map(lease::described)
            .collect();
        Ok(text_result(json!({
            "submissionSchema": SUBMISSION_SCHEMA,
            "capabilities": capabilities,
        })))
    }

    async fn lease(&self, args: &Value, owner: Digest) -> Result<Value, RouteError> {
        let request = lease::LeaseRequest::parse(args)?;
        let mut found = Vec::new();
        for name in &request.capabilities {
            found.push(
                self.upstreams
                    .routable_named(name)
                    .map_err(|why| RouteError::refused(Check::Capability, why))?,
            );
        }
        let id = LeaseId::generate()
            .map_err(|e| RouteError::Internal(format!("random source: {e}")))?
            .into_string();
        let lease = request.grant(&found, id, self.now())?;
        let body = serde_json::to_value(&lease)
            .map_err(|e| RouteError::Internal(format!("encoding a lease: {e}")))?;
        self.store
            .create_lease(LeaseRecord {
                id: lease.lease_id.clone(),
                owner,
                body: submission::canonical(&body),
                expires_ms: lease.expires_at_unix_ms,
            })
            .await?;
        Ok(text_result(body))
    }

    async fn submit(
        self: &Arc<Self>,
        args: &Value,
        caller: &Caller,
        owner: Digest,
    ) -> Result<TaskRecord, RouteError> {
        let submission = Submission::parse(args.get("submission"))?;
        let arguments = match args.get("arguments") {
            Some(Value::Object(m)) => m.clone(),
            _ => {
                return Err(RouteError::refused(
                    Check::Schema,
                    "taskgate_submit needs an \"arguments\" object: the capability's arguments",
                ));
            }
        };
        // A submission seen before is answered by its route, whatever has
        // changed since: the same binding gets the same task, another one a
        // conflict, and nothing is sent either way.
        submission.check_input(&arguments)?;
        let binding_bytes = submission::canonical(&submission.binding());
        let idempotency = Digest::of_parts(&[
            b"taskgate-idempotency",
            submission.idempotency_key.as_bytes(),
        ]);
        if let Some(existing) = self.store.find_route_by_key(&owner, &idempotency).await? {
            return if existing.binding_digest == Digest::of(&binding_bytes) {
                Ok(self.view(&existing))
            } else {
                Err(RouteError::IdempotencyConflict)
            };
        }
        let now = self.now();
        submission.check(&arguments, now)?;
        let stored = self
            .store
            .get_lease(&submission.lease_id, &owner)
            .await?
            .ok_or_else(|| {
                RouteError::refused(
                    Check::Lease,
                    format!(
                        "lease {} is unknown or expired; take a new one with taskgate_lease",
                        submission.lease_id
                    ),
                )
            })?;
        let lease: Lease = serde_json::from_slice(&stored.body)
            .map_err(|e| RouteError::Internal(format!("a stored lease does not decode: {e}")))?;
        let routable = self
            .upstreams
            .routable_named(&submission.capability)
            .map_err(|why| RouteError::refused(Check::Capability, why))?;
        if submission.provider_interface_version != routable.schema_digest {
            return Err(RouteError::refused(
                Check::ProviderInterface,
                format!(
                    "providerInterfaceVersion is not the schema digest of {} now ({}); describe it again, review the change and lease it anew",
                    routable.name, routable.schema_digest
                ),
            ));
        }
        lease.covers(&routable, &submission.provider_interface_version)?;
        let mut scopes = vec![auth::SCOPE_EFFECT_NON_IDEMPOTENT_WRITE];
        if routable.effect == Effect::IdempotentWrite {
            scopes.push(auth::SCOPE_EFFECT_IDEMPOTENT_WRITE);
        }
        authorize(caller, &scopes)?;
        if let Err(e) = self
            .upstreams
            .check_arguments(&routable.name, &Value::Object(arguments.clone()))
        {
            return Err(RouteError::refused(
                Check::Arguments,
                format!(
                    "the arguments do not fit {}'s input schema at {}: {}",
                    routable.name, e.location, e.problem
                ),
            ));
        }
        let source = Digest(routable.source_digest);
        let request = submission::request_digest(&routable.remote, &arguments);
        let prepared = self
            .store
            .prepare_route(NewRoute {
                owner,
                idempotency,
                binding: binding_bytes,
                request_digest: request,
                upstream: routable.upstream.clone(),
                capability: routable.name.clone(),
                schema_digest: routable.schema_digest.clone(),
                source_digest: source,
                deadline_ms: submission.deadline_unix_ms,
                expires_ms: now.saturating_add(submission.retention_ms as i64),
                poll_interval_ms: self.poll_interval.as_millis().max(1) as i64,
            })
            .await?;
        let record = match prepared {
            // The same submission again: its task, and nothing is sent.
            Prepared::Existing(record) => return Ok(self.view(&record)),
            Prepared::New(record) => record,
        };
        tracing::info!(route = %record.id, upstream = %record.upstream, capability = %record.capability, "route {} prepared for {}", record.id, record.capability);
        // The dispatch runs on its own task: a caller who goes away does not
        // stop it between two of its commits.
        testhooks::crash_point(testhooks::CRASH_ROUTE_PREPARED);
        let router = self.clone();
        let handle = self
            .dispatches
            .spawn(async move { router.dispatch(record, routable, arguments).await });
        match handle.await {
            Ok(r) => r,
            Err(e) => Err(RouteError::Internal(format!("a dispatch failed: {e}"))),
        }
    }

    /// Sends a prepared route once, and commits what came of it.
    async fn dispatch(
        &self,
        record: RouteRecord,
        bound: Routable,
        arguments: Map<String, Value>,
    ) -> Result<TaskRecord, RouteError> {
        let id = record.id.clone();
        // What the upstream offers may have changed since the checks: then
        // nothing is sent.
        let current = match self.upstreams.routable_named(&record.capability) {
            Ok(r) if r.source_digest == bound.source_digest => r,
            Ok(_) => {
                return self
                    .not_dispatched(&id, "the upstream's configuration or the capability changed before the submission was sent".into())
                    .await;
            }
            Err(why) => return self.not_dispatched(&id, why).await,
        };
        let dispatching = self
            .store
            .advance_route(
                &id,
                &[RoutePhase::Prepared],
                RouteChange::Dispatching {
                    coordinator: self.coordinator.clone(),
                    session: current.session.clone(),
                },
            )
            .await?;
        if !matches!(dispatching, Advanced::Changed(_)) {
            return self.current_view(&id).await;
        }
        testhooks::crash_point(testhooks::CRASH_ROUTE_DISPATCHING);
        // What goes out is what was committed: the same envelope every
        // later answer is checked against.
        let envelope = envelope_of(&record);
        let timeout = MAX_DISPATCH_TIMEOUT.min(current.timeout);
        let answer = self
            .upstreams
            .submit(&current, arguments, envelope.clone(), timeout)
            .await;
        testhooks::crash_point(testhooks::CRASH_ROUTE_ANSWERED);
        let from = [RoutePhase::Dispatching, RoutePhase::CancelRequested];
        let change = match answer {
            Err(Failure::NotSent(why)) => {
                return self.not_dispatched(&id, why).await;
            }
            Err(Failure::Unknown(why)) => RouteChange::Reconcile {
                reason: format!("the submission was sent and its answer is unknown: {why}"),
                detach: false,
            },
            Ok(Answer::Task {
                id: upstream_id,
                poll_interval_ms,
                echo,
                ..
            }) => match echo_problem(echo.as_ref(), &envelope) {
                Some(problem) => RouteChange::Reconcile {
                    reason: format!(
                        "the upstream created task {:?} but {problem}",
                        cut(&upstream_id, 128)
                    ),
                    detach: false,
                },
                None if upstream_id.is_empty() || upstream_id.len() > 256 => {
                    RouteChange::Reconcile {
                        reason: "the upstream answered with an unusable task ID".into(),
                        detach: false,
                    }
                }
                None => RouteChange::Routed {
                    upstream_task_id: upstream_id,
                    poll_interval_ms: poll_interval_ms.unwrap_or(0).min(60_000) as i64,
                },
            },
            Ok(Answer::Result { value, echo, bytes }) => {
                match echo_problem(echo.as_ref(), &envelope) {
                    Some(problem) => RouteChange::Reconcile {
                        reason: format!("the upstream answered at once but {problem}"),
                        detach: false,
                    },
                    None => self.completed(&record, value, bytes as u64),
                }
            }
            Ok(Answer::Error { code, message }) => RouteChange::Terminal {
                status: TaskStatus::Failed,
                outcome: Some(error_outcome(
                    wire::UPSTREAM_ERROR,
                    format!(
                        "upstream {} refused the submission: {message}",
                        record.upstream
                    ),
                    Some(json!({"upstreamCode": code, "upstreamMessage": message})),
                )),
                decider: Decider::Provider,
                reason: Some("the upstream refused the submission".into()),
            },
        };
        if let RouteChange::Reconcile { reason, .. } = &change {
            tracing::warn!(route = %id, upstream = %record.upstream, "route {id} needs reconciliation: {reason}");
        }
        self.store.advance_route(&id, &from, change).await?;
        self.current_view(&id).await
    }

    /// The route ends as taskgate's own refusal: nothing was sent.
    async fn not_dispatched(&self, id: &RouteId, why: String) -> Result<TaskRecord, RouteError> {
        let change = RouteChange::Terminal {
            status: TaskStatus::Failed,
            outcome: Some(error_outcome(
                wire::ROUTE_NOT_DISPATCHED,
                format!("the submission was not sent: {why}"),
                Some(json!({"sent": false})),
            )),
            decider: Decider::Broker,
            reason: Some(format!("not dispatched: {why}")),
        };
        let done = self
            .store
            .advance_route(id, &[RoutePhase::Prepared, RoutePhase::Dispatching], change)
            .await?;
        // The caller cancelled while it was being sent, and it never was:
        // it ends cancelled.
        if let Advanced::Unchanged(r) = done
            && r.phase == RoutePhase::CancelRequested
            && r.upstream_task_id.is_none()
        {
            self.store
                .advance_route(
                    id,
                    &[RoutePhase::CancelRequested],
                    RouteChange::Terminal {
                        status: TaskStatus::Cancelled,
                        outcome: None,
                        decider: Decider::Broker,
                        reason: Some(format!(
                            "cancelled before it was sent; nothing reached the upstream ({why})"
                        )),
                    },
                )
                .await?;
        }
        self.current_view(id).await
    }

    /// A provider's result, accepted when it fits the declared output bound.
    fn completed(&self, record: &RouteRecord, mut value: Value, bytes: u64) -> RouteChange {
        let binding = record.binding_json();
        let limit = binding["limits"]["outputBytes"]
            .as_u64()
            .unwrap_or(MAX_IO_BYTES)
            .min(MAX_IO_BYTES);
        if bytes > limit {
            return RouteChange::Terminal {
                status: TaskStatus::Failed,
                outcome: Some(error_outcome(
                    wire::UPSTREAM_RESPONSE_TOO_LARGE,
                    format!(
                        "the upstream completed the task with {bytes} bytes of output, more than the {limit} the submission declared (limits.outputBytes); the output was not accepted"
                    ),
                    Some(json!({"providerCompleted": true, "accepted": false})),
                )),
                decider: Decider::Broker,
                reason: Some("the provider's output exceeded the declared bound".into()),
            };
        }
        if let Some(o) = value.as_object_mut() {
            o.insert(
                "_meta".into(),
                json!({ROUTE_META_KEY: {
                    "publicTaskId": record.id.as_str(),
                    "upstream": record.upstream,
                    "capability": record.capability,
                    "providerCompleted": true,
                    "policyAccepted": Value::Null,
                    "verified": false,
                    "acceptancePolicyDigest": binding["acceptancePolicyDigest"],
                    "artifactScopeDigest": binding["artifactScopeDigest"],
                }}),
            );
        }
        RouteChange::Terminal {
            status: TaskStatus::Completed,
            outcome: Some(Outcome::Result(value)),
            decider: Decider::Provider,
            reason: None,
        }
    }

    async fn current_view(&self, id: &RouteId) -> Result<TaskRecord, RouteError> {
        match self.store.route(id).await? {
            Some(r) => Ok(self.view(&r)),
            None => Err(RouteError::UnknownTask),
        }
    }

    /// Whether a route may still learn its outcome from its upstream: its
    /// upstream task was bound after a verified echo, and the connection it
    /// went out on is the upstream's current one, unchanged.
    fn may_poll(&self, r: &RouteRecord) -> bool {
        matches!(self.reachable(r), Ok(Some(_)))
    }

    /// The route as the caller's task.
    fn view(&self, r: &RouteRecord) -> TaskRecord {
        let (status, message, outcome) = match r.phase {
            RoutePhase::Terminal => (
                r.status.unwrap_or(TaskStatus::Failed),
                r.reason.clone(),
                r.outcome.clone(),
            ),
            RoutePhase::Prepared => (
                TaskStatus::Working,
                Some(format!(
                    "submitted; not yet sent to upstream {}",
                    r.upstream
                )),
                None,
            ),
            RoutePhase::Dispatching => (
                TaskStatus::Working,
                Some(format!("being sent to upstream {}", r.upstream)),
                None,
            ),
            RoutePhase::Routed => (
                TaskStatus::Working,
                Some(format!("running at upstream {}", r.upstream)),
                None,
            ),
            RoutePhase::CancelRequested if cancel_unconfirmed(r) => (
                TaskStatus::Working,
                Some(format!(
                    "cancel_requested ({}); reconciliation required: upstream {} has not acknowledged the cancel ({} of {MAX_CANCEL_ATTEMPTS} attempts), so whether the task stops is unknown; {}",
                    r.cancel_reason.as_deref().unwrap_or("by the caller"),
                    r.upstream,
                    r.cancel_attempts,
                    if r.cancel_attempts < MAX_CANCEL_ATTEMPTS {
                        "the next poll sends it once more and asks for the task's outcome"
                    } else {
                        "no more cancels are sent; polls still ask for the task's outcome"
                    }
                )),
                None,
            ),
            RoutePhase::CancelRequested => (
                TaskStatus::Working,
                Some(format!(
                    "cancel_requested ({}); waiting for upstream {} to confirm",
                    r.cancel_reason.as_deref().unwrap_or("by the caller"),
                    r.upstream
                )),
                None,
            ),
            // Still asked about, never sent again: not final for the caller
            // while a verified answer can end it.
            RoutePhase::ReconciliationRequired if self.may_poll(r) => (
                TaskStatus::Working,
                Some(format!(
                    "reconciliation required: {}; taskgate asks upstream {} about its task on the connection it was sent on, and never sends it again",
                    caller_reason(r)
                        .as_deref()
                        .unwrap_or("the upstream's outcome is unknown"),
                    r.upstream
                )),
                None,
            ),
            RoutePhase::ReconciliationRequired => {
                let reason = caller_reason(r).unwrap_or_default();
                (
                    TaskStatus::Failed,
                    Some("reconciliation required: the upstream's outcome is unknown; not sent again".into()),
                    Some(error_outcome(
                        wire::RECONCILIATION_REQUIRED,
                        format!(
                            "what upstream {} did with this task is unknown ({reason}); it was not sent again",
                            r.upstream
                        ),
                        Some(json!({"phase": r.phase.as_str(), "upstream": r.upstream})),
                    )),
                )
            }
        };
        TaskRecord {
            id: TaskId::of_route(&r.id),
            status,
            status_message: message,
            created_ms: r.created_ms,
            updated_ms: r.updated_ms,
            expires_ms: r.expires_ms,
            poll_interval_ms: r.poll_interval_ms,
            outcome,
            cancel_requested: r.phase == RoutePhase::CancelRequested,
            proposal: None,
        }
    }

    /// What an operator is told the caller reads, and whether the route is
    /// reported as needing reconciliation (`routes show`, `routes list`).
    pub fn reads_as(&self, r: &RouteRecord) -> (TaskStatus, bool) {
        let needs = r.phase == RoutePhase::ReconciliationRequired
            || (r.phase == RoutePhase::CancelRequested && cancel_unconfirmed(r));
        (self.view(r).status, needs)
    }

    async fn owned(&self, id: &str, owner: &Digest) -> Result<RouteRecord, RouteError> {
        let id = RouteId::parse(id).map_err(|_| RouteError::UnknownTask)?;
        self.store
            .get_route(&id, owner)
            .await?
            .ok_or(RouteError::UnknownTask)
    }

    /// Whether the route may be asked of its upstream now: its upstream task
    /// is known and its session is the upstream's current one. `Err` is the
    /// reason it never may again.
    fn reachable(&self, r: &RouteRecord) -> Result<Option<Routable>, String> {
        let (Some(_), Some(session)) = (&r.upstream_task_id, &r.session) else {
            return Ok(None);
        };
        match self.upstreams.routable_named(&r.capability) {
            Ok(now) if &now.session != session => Err(SESSION_CHANGED.into()),
            Ok(now) if now.source_digest != r.source_digest.0 => {
                Err("the upstream's configuration or the capability changed since dispatch".into())
            }
            Ok(now) => Ok(Some(now)),
            Err(why) if self.upstreams.session_is(&r.upstream, session) => {
                Err(format!("the capability cannot be routed any more: {why}"))
            }
            Err(_) => Err(SESSION_CHANGED.into()),
        }
    }

    /// The route needs reconciliation, for `reason`; with `detach`, its
    /// upstream is never asked about it again (the connection or the
    /// configuration it was sent under is gone).
    async fn reconcile(
        &self,
        r: &RouteRecord,
        reason: String,
        detach: bool,
    ) -> Result<TaskRecord, RouteError> {
        tracing::warn!(route = %r.id, upstream = %r.upstream, "route {} needs reconciliation: {reason}", r.id);
        self.store
            .advance_route(
                &r.id,
                &[
                    RoutePhase::Routed,
                    RoutePhase::CancelRequested,
                    RoutePhase::ReconciliationRequired,
                ],
                RouteChange::Reconcile { reason, detach },
            )
            .await?;
        self.current_view(&r.id).await
    }

    /// `tasks/get` for a route.
    pub async fn get(
        &self,
        id: &str,
        caller: &Caller,
        owner: &Digest,
    ) -> Result<TaskRecord, RouteError> {
        authorize(caller, &[auth::SCOPE_TASKS_READ])?;
        let r = self.owned(id, owner).await?;
        // A route in reconciliation is asked about only as the protocol
        // allows: its upstream task is known (bound after a verified echo)
        // and the exact session it went out on is still current. It is
        // never sent again.
        let pollable = match r.phase {
            RoutePhase::Routed | RoutePhase::CancelRequested => true,
            RoutePhase::ReconciliationRequired => {
                r.upstream_task_id.is_some() && r.session.is_some()
            }
            _ => false,
        };
        if !pollable {
            return Ok(self.view(&r));
        }
        let routable = match self.reachable(&r) {
            Ok(Some(now)) => now,
            Ok(None) => return Ok(self.view(&r)),
            Err(reason) => return self.reconcile(&r, reason, true).await,
        };
        let now = self.now();
        // An eager poller is answered from the store: the upstream is asked
        // about once per poll interval.
        {
            let mut polled = lock(&self.polled);
            if let Some(last) = polled.get(&r.id)
                && now < last + r.poll_interval_ms
            {
                return Ok(self.view(&r));
            }
            if polled.len() >= crate::store::MAX_ROUTES as usize {
                polled.clear();
            }
            polled.insert(r.id.clone(), now);
        }
        let upstream_id = r.upstream_task_id.clone().unwrap_or_default();
        let session = r.session.clone().unwrap_or_default();
        let timeout = MAX_POLL_TIMEOUT.min(routable.timeout);
        // Past the deadline the task is cancelled (intent first), once.
        let mut r = r;
        if now >= r.deadline_ms
            && r.phase == RoutePhase::Routed
            && let Advanced::Changed(after) = self
                .store
                .advance_route(
                    &r.id,
                    &[RoutePhase::Routed],
                    RouteChange::CancelRequested {
                        reason: "the submission's deadline passed".into(),
                    },
                )
                .await?
        {
            r = after;
        }
        if r.phase == RoutePhase::CancelRequested {
            self.forward_cancel(&r, &routable, timeout).await?;
            match self.store.route(&r.id).await? {
                Some(now) => r = now,
                None => return Err(RouteError::UnknownTask),
            }
        }
        let task = match self
            .upstreams
            .get_task(&r.upstream, &session, &upstream_id, timeout)
            .await
        {
            Ok(task) => task,
            Err(PollFailure::SessionChanged) => {
                return self.reconcile(&r, SESSION_CHANGED.into(), true).await;
            }
            Err(PollFailure::Error { code, message }) => {
                return self
                    .reconcile(
                        &r,
                        format!(
                            "the upstream answered tasks/get for its task with an error ({code}: {})",
                            cut(&message, 200)
                        ),
                        false,
                    )
                    .await;
            }
            Err(PollFailure::Failed(f)) => {
                let why = match f {
                    Failure::NotSent(w) | Failure::Unknown(w) => w,
                };
                let mut view = self.view(&r);
                view.status_message = Some(format!(
                    "{}; the last poll of the upstream failed: {}",
                    view.status_message.unwrap_or_default(),
                    cut(&why, 200)
                ));
                return Ok(view);
            }
        };
        // Only an answer about the bound task, carrying the envelope back
        // as the upstream's echo rule requires, says anything of the route.
        if let Some(problem) = answer_problem(&r, &upstream_id, &task, routable.echo) {
            return self.reconcile(&r, problem, false).await;
        }
        let from = [
            RoutePhase::Routed,
            RoutePhase::CancelRequested,
            RoutePhase::ReconciliationRequired,
        ];
        let change = match task.status.as_str() {
            "completed" => Some(
                self.completed(
                    &r,
                    task.result.clone().unwrap_or(json!({})),
                    task.result
                        .as_ref()
                        .and_then(|v| serde_json::to_vec(v).ok())
                        .map(|v| v.len() as u64)
                        .unwrap_or(0),
                ),
            ),
            "failed" => {
                let error = task.error.clone().unwrap_or(json!({}));
                let message = error
                    .get("message")
                    .and_then(Value::as_str)
                    .map(|m| cut(m, 512))
                    .unwrap_or_else(|| "the upstream task failed".into());
                Some(RouteChange::Terminal {
                    status: TaskStatus::Failed,
                    outcome: Some(error_outcome(
                        wire::UPSTREAM_ERROR,
                        format!("the upstream task failed: {message}"),
                        Some(
                            json!({"upstreamCode": error.get("code"), "upstreamMessage": message}),
                        ),
                    )),
                    decider: Decider::Provider,
                    reason: None,
                })
            }
            "cancelled" => Some(RouteChange::Terminal {
                status: TaskStatus::Cancelled,
                outcome: None,
                decider: Decider::Provider,
                reason: Some(format!("cancelled at upstream {}", r.upstream)),
            }),
            "working" | "input_required" => None,
            other => {
                return self
                    .reconcile(
                        &r,
                        format!(
                            "the upstream reports an unknown status {:?}",
                            cut(other, 32)
                        ),
                        false,
                    )
                    .await;
            }
        };
        match change {
            Some(change) => {
                self.store.advance_route(&r.id, &from, change).await?;
                self.current_view(&r.id).await
            }
            None => {
                let mut view = self.view(&r);
                if let Some(m) = task.status_message {
                    view.status_message = Some(format!(
                        "{}: {}",
                        view.status_message.unwrap_or_default(),
                        cut(&m, MAX_STATUS_MESSAGE)
                    ));
                }
                if let Some(p) = task.poll_interval_ms {
                    view.poll_interval_ms = view.poll_interval_ms.max(p.min(60_000) as i64);
                }
                Ok(view)
            }
        }
    }

    /// Takes the route's one cancel slot, unless a cancel of it is in
    /// flight already.
    fn cancel_slot(&self, id: &RouteId) -> Option<CancelSlot<'_>> {
        let mut held = lock(&self.cancelling);
        if !held.insert(id.clone()) {
            return None;
        }
        Some(CancelSlot {
            held: &self.cancelling,
            id: id.clone(),
        })
    }

    /// Sends the route's cancel upstream, at most [`MAX_CANCEL_ATTEMPTS`]
    /// times in the route's life and never two at once: each attempt is
    /// counted durably before it is sent, so neither overlapping polls nor
    /// a restart can add one. An attempt not acknowledged leaves the route
    /// `cancel_requested`, reported as needing reconciliation.
    async fn forward_cancel(
        &self,
        r: &RouteRecord,
        routable: &Routable,
        timeout: Duration,
    ) -> Result<(), RouteError> {
        let (Some(upstream_id), Some(session)) = (&r.upstream_task_id, &r.session) else {
            return Ok(());
        };
        if r.cancel_acknowledged || r.cancel_attempts >= MAX_CANCEL_ATTEMPTS {
            return Ok(());
        }
        let Some(_slot) = self.cancel_slot(&r.id) else {
            return Ok(());
        };
        let counted = self
            .store
            .advance_route(
                &r.id,
                &[RoutePhase::CancelRequested],
                RouteChange::CancelAttempt {
                    max_attempts: MAX_CANCEL_ATTEMPTS,
                },
            )
            .await?;
        if !matches!(counted, Advanced::Changed(_)) {
            return Ok(());
        }
        testhooks::crash_point(testhooks::CRASH_ROUTE_CANCEL_COUNTED);
        let acknowledged = match self
            .upstreams
            .cancel_task(&routable.upstream, session, upstream_id, timeout)
            .await
        {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(route = %r.id, upstream = %r.upstream, "a cancel of route {} was not acknowledged: {e:?}", r.id);
                false
            }
        };
        if acknowledged {
            self.store
                .advance_route(
                    &r.id,
                    &[RoutePhase::CancelRequested],
                    RouteChange::CancelAcknowledged,
                )
                .await?;
        }
        Ok(())
    }

    /// `tasks/cancel` for a route: the intent is committed, then forwarded
    /// when the upstream task is known on the current session.
    pub async fn cancel(
        &self,
        id: &str,
        caller: &Caller,
        owner: &Digest,
    ) -> Result<(), RouteError> {
        authorize(caller, &[auth::SCOPE_TASKS_CANCEL])?;
        let r = self.owned(id, owner).await?;
        if !matches!(
            r.phase,
            RoutePhase::Prepared | RoutePhase::Dispatching | RoutePhase::Routed
        ) {
            return Ok(());
        }
        let after = self
            .store
            .advance_route(
                &r.id,
                &[
                    RoutePhase::Prepared,
                    RoutePhase::Dispatching,
                    RoutePhase::Routed,
                ],
                RouteChange::CancelRequested {
                    reason: "requested by the caller".into(),
                },
            )
            .await?;
        let Advanced::Changed(r) = after else {
            return Ok(());
        };
        match self.reachable(&r) {
            Ok(Some(routable)) => {
                let timeout = MAX_POLL_TIMEOUT.min(routable.timeout);
                self.forward_cancel(&r, &routable, timeout).await
            }
            // Not sent yet, or sent on a session that is gone: the intent
            // stands and the next poll says what became of the route.
            Ok(None) | Err(_) => Ok(()),
        }
    }

    /// `tasks/update` for a route: always refused (an owned route), or
    /// unknown.
    pub async fn update(
        &self,
        id: &str,
        caller: &Caller,
        owner: &Digest,
    ) -> Result<(), RouteError> {
        authorize(caller, &[auth::SCOPE_TASKS_CANCEL])?;
        self.owned(id, owner).await?;
        Err(RouteError::UpdateUnsupported)
    }

    /// Waits for dispatches in flight (at a stop).
    pub async fn finish(&self) {
        self.dispatches.close();
        self.dispatches.wait().await;
    }
}

fn authorize(caller: &Caller, needed: &[&'static str]) -> Result<(), RouteError> {
    let missing = caller.missing(needed);
    if missing.is_empty() {
        return Ok(());
    }
    Err(RouteError::Forbidden {
        missing: missing.iter().map(|s| s.to_string()).collect(),
    })
}

/// What the submitter is given of its route beside the task: the binding
/// as committed (and sent), and the digests its provider must echo.
fn submitted(r: &RouteRecord) -> Value {
    json!({
        "publicTaskId": r.id.as_str(),
        "binding": r.binding_json(),
        "bindingDigest": r.binding_digest.to_hex(),
        "requestDigest": r.request_digest.to_hex(),
    })
}

/// A route's reason as its caller reads it: the operator's reason without
/// the upstream's own task IDs (quoted, or the bound one wherever it
/// appears) or the session it went out on, which only `routes show` gives.
fn caller_reason(r: &RouteRecord) -> Option<String> {
    let reason = r.reason.as_deref()?;
    let reason = reason
        .split(" (it went out on session ")
        .next()
        .unwrap_or(reason);
    let mut out = String::with_capacity(reason.len());
    let mut quoted = false;
    for c in reason.chars() {
        match (c, quoted) {
            ('"', false) => {
                quoted = true;
                out.push('…');
            }
            ('"', true) => quoted = false,
            (_, true) => {}
            (c, false) => out.push(c),
        }
    }
    Some(match r.upstream_task_id.as_deref() {
        Some(bound) if !bound.is_empty() => out.replace(bound, "…"),
        _ => out,
    })
}

/// Why a route is never asked about on another connection.
const SESSION_CHANGED: &str = "the upstream's connection changed since dispatch (a reconnect or a restart); the task is never asked for on another connection";

/// Whether a cancel was sent and not (yet) acknowledged: its effect is
/// unknown.
fn cancel_unconfirmed(r: &RouteRecord) -> bool {
    r.cancel_attempts > 0 && !r.cancel_acknowledged
}

/// The execution envelope of a route: sent with its submission, and what
/// every answer that speaks of it must carry back.
fn envelope_of(r: &RouteRecord) -> Value {
    json!({
        "publicTaskId": r.id.as_str(),
        "requestDigest": r.request_digest.to_hex(),
        "bindingDigest": r.binding_digest.to_hex(),
        "binding": r.binding_json(),
    })
}

/// What is wrong with a `tasks/get` answer for a route, if anything: an
/// answer about another task is never taken, whatever the echo rule; an
/// echo that is present must match whole; a missing echo is taken only
/// from an upstream configured `route_echo = "creation_only"`.
fn answer_problem(
    r: &RouteRecord,
    bound: &str,
    task: &crate::upstream::RemoteTask,
    rule: RouteEcho,
) -> Option<String> {
    if task.task_id != bound {
        return Some(format!(
            "the upstream's tasks/get answer is about another task ({:?}, not the bound {:?})",
            cut(&task.task_id, 128),
            cut(bound, 128)
        ));
    }
    match (&task.echo, rule) {
        (None, RouteEcho::CreationOnly) => None,
        (echo, _) => {
            echo_problem(echo.as_ref(), &envelope_of(r)).map(|p| match p.strip_prefix("its ") {
                Some(rest) => format!("the upstream's tasks/get answer's {rest}"),
                None => format!("the upstream's tasks/get answer {p}"),
            })
        }
    }
}

/// What is wrong with a provider's echo of the envelope, if anything.
fn echo_problem(echo: Option<&Value>, envelope: &Value) -> Option<String> {
    let Some(echo) = echo else {
        return Some("did not echo the execution envelope (dev.taskgate/taskExecution)".into());
    };
    if echo.get("publicTaskId") != envelope.get("publicTaskId") {
        return Some("its echo names another public task ID".into());
    }
    if echo.get("requestDigest") != envelope.get("requestDigest") {
        return Some("its echo carries another request digest".into());
    }
    if echo.get("bindingDigest") != envelope.get("bindingDigest")
        || echo.get("binding") != envelope.get("binding")
    {
        return Some("its echo carries another submission binding".into());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_echo_must_match_in_every_identity() {
        let envelope = json!({"publicTaskId": "tgr-1", "requestDigest": "r", "bindingDigest": "b", "binding": {"k": 1}});
        assert_eq!(echo_problem(Some(&envelope), &envelope), None);
        assert!(echo_problem(None, &envelope).is_some());
        for (key, value) in [
            ("publicTaskId", json!("tgr-2")),
            ("requestDigest", json!("x")),
            ("bindingDigest", json!("x")),
            ("binding", json!({"k": 2})),
        ] {
            let mut echo = envelope.clone();
            echo[key] = value;
            assert!(echo_problem(Some(&echo), &envelope).is_some(), "{key}");
        }
    }
}
