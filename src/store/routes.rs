//! The routes kind: durable routes of a submission to a Tasks-capable
//! upstream, and the capability leases a submission is made under. Its
//! tables (schema version 3), its SQL, its records, its operations of
//! [`Store`], its bounds, its expiry sweep and its restart recovery.
//!
//! A route is the public task of a routed submission. Its phase says how
//! far dispatch got, and every change of phase is committed before the
//! step that depends on it: the binding before the upstream is contacted,
//! the upstream session before the request is sent, the cancel intent
//! before the cancel is forwarded. The upstream's task ID is written once
//! (a trigger refuses a second value). Raw tool arguments are never stored:
//! only the canonical binding, which carries their digest.

use std::sync::LazyLock;

use rusqlite::types::Type;
use rusqlite::{Connection, OptionalExtension, Row, named_params, params};
use serde_json::Value;
use taskgate_store_engine::{Holds, NextExpiry, RecordKind, Report, Tx};

use super::digest::Digest;
use super::error::StoreError;
use super::handle::{Registry, Store, StoreOptions};
use super::outcome::{ErrorBody, Outcome, TaskStatus};
use super::table::Table;

type OpError = taskgate_store_engine::OpError<StoreError>;

/// Route records held in all, expired ones included until swept.
pub const MAX_ROUTES: u64 = 4096;
/// Unexpired routes one caller may hold.
pub const MAX_ROUTES_PER_OWNER: u64 = 256;
/// Expired routes a submission removes before it counts, oldest first.
pub const ROUTE_SWEEP_ON_SUBMIT: u32 = 128;
/// Longest canonical submission binding kept with a route.
pub const MAX_BINDING_BYTES: usize = 8 * 1024;
/// Longest terminal payload kept with a route: an accepted output of 64
/// KiB and the envelope around it.
pub const MAX_ROUTE_OUTCOME_BYTES: usize = 64 * 1024 + 4 * 1024;
/// Leases held in all, expired ones included until swept.
pub const MAX_LEASES: u64 = 4096;
/// Unexpired leases one caller may hold.
pub const MAX_LEASES_PER_OWNER: u64 = 256;
/// Longest text kept for a reason (reconciliation, cancel, rejection).
const MAX_REASON_BYTES: usize = 512;

pub use crate::ids::RouteId;

/// How far a route got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RoutePhase {
    /// The submission is durable; nothing was sent.
    Prepared,
    /// The request is (or was) on its way on one upstream session.
    Dispatching,
    /// The upstream accepted it: its task ID is bound to the route.
    Routed,
    /// The cancel intent is durable; the cancel may or may not have reached
    /// the upstream.
    CancelRequested,
    /// What the upstream did is unknown; never resubmitted.
    ReconciliationRequired,
    /// A bounded provider result or taskgate's own rejection is kept.
    Terminal,
}

impl RoutePhase {
    pub const ALL: [RoutePhase; 6] = [
        RoutePhase::Prepared,
        RoutePhase::Dispatching,
        RoutePhase::Routed,
        RoutePhase::CancelRequested,
        RoutePhase::ReconciliationRequired,
        RoutePhase::Terminal,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RoutePhase::Prepared => "prepared",
            RoutePhase::Dispatching => "dispatching",
            RoutePhase::Routed => "routed",
            RoutePhase::CancelRequested => "cancel_requested",
            RoutePhase::ReconciliationRequired => "reconciliation_required",
            RoutePhase::Terminal => "terminal",
        }
    }

    pub fn parse(s: &str) -> Option<RoutePhase> {
        RoutePhase::ALL.into_iter().find(|p| p.as_str() == s)
    }
}

/// Who decided a terminal route's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decider {
    /// The upstream's own result (bounded, as it gave it).
    Provider,
    /// taskgate refused or ended the route itself.
    Broker,
}

impl Decider {
    pub fn as_str(self) -> &'static str {
        match self {
            Decider::Provider => "provider",
            Decider::Broker => "broker",
        }
    }

    fn parse(s: &str) -> Option<Decider> {
        match s {
            "provider" => Some(Decider::Provider),
            "broker" => Some(Decider::Broker),
            _ => None,
        }
    }
}

/// What a submission commits before anything is sent.
#[derive(Debug, Clone)]
pub struct NewRoute {
    pub owner: Digest,
    /// sha256 of the caller's idempotency key (scoped by `owner`).
    pub idempotency: Digest,
    /// The canonical submission binding (RFC 8785 JSON, no raw arguments).
    pub binding: Vec<u8>,
    /// The digest of the request sent upstream (tool and canonical
    /// arguments), echoed by the provider.
    pub request_digest: Digest,
    pub upstream: String,
    /// The name callers use (`alias.tool`).
    pub capability: String,
    /// The pinned schema digest (`providerInterfaceVersion`).
    pub schema_digest: String,
    /// The upstream's configuration and discovered snapshot the binding was
    /// made against.
    pub source_digest: Digest,
    pub deadline_ms: i64,
    pub expires_ms: i64,
    pub poll_interval_ms: i64,
}

/// A route as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteRecord {
    pub id: RouteId,
    pub owner: Digest,
    pub binding: Vec<u8>,
    pub binding_digest: Digest,
    pub request_digest: Digest,
    pub upstream: String,
    pub capability: String,
    pub schema_digest: String,
    pub source_digest: Digest,
    pub phase: RoutePhase,
    /// The coordinator instance that dispatched it.
    pub coordinator: Option<String>,
    /// The upstream session it was dispatched on.
    pub session: Option<String>,
    pub upstream_task_id: Option<String>,
    /// Why it needs reconciliation, or why it was refused or ended.
    pub reason: Option<String>,
    /// Cancel requests forwarded so far.
    pub cancel_attempts: i64,
    /// The upstream acknowledged a cancel.
    pub cancel_acknowledged: bool,
    pub cancel_reason: Option<String>,
    pub deadline_ms: i64,
    pub expires_ms: i64,
    pub created_ms: i64,
    pub updated_ms: i64,
    pub poll_interval_ms: i64,
    /// Set once terminal.
    pub status: Option<TaskStatus>,
    pub outcome: Option<Outcome>,
    pub decider: Option<Decider>,
}

impl RouteRecord {
    /// The binding as JSON (it was checked to decode when read).
    pub fn binding_json(&self) -> Value {
        serde_json::from_slice(&self.binding).unwrap_or(Value::Null)
    }
}

/// The answer to a submission.
#[derive(Debug, Clone, PartialEq)]
pub enum Prepared {
    New(RouteRecord),
    /// The caller already submitted under this key with the same binding.
    Existing(RouteRecord),
}

/// A change of phase, applied only from the phases the caller names.
#[derive(Debug, Clone)]
pub enum RouteChange {
    Dispatching {
        coordinator: String,
        session: String,
    },
    /// The upstream's task ID; a cancel requested meanwhile stays requested.
    Routed {
        upstream_task_id: String,
        poll_interval_ms: i64,
    },
    Terminal {
        status: TaskStatus,
        outcome: Option<Outcome>,
        decider: Decider,
        reason: Option<String>,
    },
    /// The outcome is unknown. With `detach`, the route forgets the
    /// session it went out on (named in the reason instead), so that it is
    /// never asked about again even if the same configuration came back.
    Reconcile {
        reason: String,
        detach: bool,
    },
    CancelRequested {
        reason: String,
    },
    /// One more cancel is about to be sent: counted before it leaves, and
    /// only while fewer than `max_attempts` were and none was acknowledged
    /// (otherwise the route stands as it was).
    CancelAttempt {
        max_attempts: i64,
    },
    /// The upstream acknowledged a cancel.
    CancelAcknowledged,
}

impl RouteChange {
    fn target(&self) -> Option<RoutePhase> {
        Some(match self {
            RouteChange::Dispatching { .. } => RoutePhase::Dispatching,
            RouteChange::Routed { .. } => RoutePhase::Routed,
            RouteChange::Terminal { .. } => RoutePhase::Terminal,
            RouteChange::Reconcile { .. } => RoutePhase::ReconciliationRequired,
            RouteChange::CancelRequested { .. } => RoutePhase::CancelRequested,
            RouteChange::CancelAttempt { .. } | RouteChange::CancelAcknowledged => return None,
        })
    }
}

/// What a change found.
#[derive(Debug, Clone, PartialEq)]
pub enum Advanced {
    /// Applied; the route as it now stands.
    Changed(RouteRecord),
    /// The route was in another phase: it stands as it was.
    Unchanged(RouteRecord),
    /// No such unexpired route.
    Missing,
}

/// A capability lease as stored: its body is the canonical JSON the caller
/// was given.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseRecord {
    pub id: String,
    pub owner: Digest,
    pub body: Vec<u8>,
    pub expires_ms: i64,
}

/// Routes by phase, for `status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RouteCounts {
    pub prepared: u64,
    pub dispatching: u64,
    pub routed: u64,
    pub cancel_requested: u64,
    pub reconciliation_required: u64,
    pub terminal: u64,
}

impl RouteCounts {
    fn add(&mut self, phase: RoutePhase, n: u64) {
        let slot = match phase {
            RoutePhase::Prepared => &mut self.prepared,
            RoutePhase::Dispatching => &mut self.dispatching,
            RoutePhase::Routed => &mut self.routed,
            RoutePhase::CancelRequested => &mut self.cancel_requested,
            RoutePhase::ReconciliationRequired => &mut self.reconciliation_required,
            RoutePhase::Terminal => &mut self.terminal,
        };
        *slot += n;
    }

    /// Each phase with its count, as `/metrics` labels them.
    pub fn by_phase(&self) -> Vec<(&'static str, u64)> {
        vec![
            (RoutePhase::Prepared.as_str(), self.prepared),
            (RoutePhase::Dispatching.as_str(), self.dispatching),
            (RoutePhase::Routed.as_str(), self.routed),
            (RoutePhase::CancelRequested.as_str(), self.cancel_requested),
            (
                RoutePhase::ReconciliationRequired.as_str(),
                self.reconciliation_required,
            ),
            (RoutePhase::Terminal.as_str(), self.terminal),
        ]
    }

    pub fn total(&self) -> u64 {
        self.prepared
            + self.dispatching
            + self.routed
            + self.cancel_requested
            + self.reconciliation_required
            + self.terminal
    }
}

// ------------------------------------------------------------------ schema --

/// Migration step 3: routes and leases.
pub(super) fn create_tables(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "CREATE TABLE routes (
    id               TEXT    PRIMARY KEY NOT NULL,
    owner            BLOB    NOT NULL CHECK (length(owner) = 32),
    idempotency      BLOB    NOT NULL CHECK (length(idempotency) = 32),
    binding          BLOB    NOT NULL CHECK (length(binding) <= 8192),
    binding_digest   BLOB    NOT NULL CHECK (length(binding_digest) = 32),
    request_digest   BLOB    NOT NULL CHECK (length(request_digest) = 32),
    upstream         TEXT    NOT NULL,
    capability       TEXT    NOT NULL,
    schema_digest    TEXT    NOT NULL,
    source_digest    BLOB    NOT NULL CHECK (length(source_digest) = 32),
    phase            TEXT    NOT NULL CHECK (phase IN ('prepared','dispatching','routed','cancel_requested','reconciliation_required','terminal')),
    coordinator      TEXT,
    session          TEXT,
    upstream_task_id TEXT,
    reason           TEXT,
    cancel_attempts  INTEGER NOT NULL DEFAULT 0,
    cancel_acknowledged INTEGER NOT NULL DEFAULT 0,
    cancel_reason    TEXT,
    deadline_ms      INTEGER NOT NULL,
    expires_ms       INTEGER NOT NULL,
    created_ms       INTEGER NOT NULL,
    updated_ms       INTEGER NOT NULL,
    poll_interval_ms INTEGER NOT NULL,
    status           TEXT    CHECK (status IS NULL OR status IN ('completed','failed','cancelled')),
    outcome          BLOB,
    decider          TEXT    CHECK (decider IS NULL OR decider IN ('provider','broker'))
) STRICT;
CREATE UNIQUE INDEX routes_owner_idempotency ON routes (owner, idempotency);
CREATE INDEX routes_expires ON routes (expires_ms);
CREATE INDEX routes_owner_expires ON routes (owner, expires_ms);
CREATE TRIGGER routes_upstream_task_id_once BEFORE UPDATE OF upstream_task_id ON routes
  WHEN OLD.upstream_task_id IS NOT NULL AND NEW.upstream_task_id IS NOT OLD.upstream_task_id
  BEGIN SELECT RAISE(ABORT, 'an upstream task id is written once'); END;
CREATE TABLE leases (
    id          TEXT    PRIMARY KEY NOT NULL,
    owner       BLOB    NOT NULL CHECK (length(owner) = 32),
    body        BLOB    NOT NULL CHECK (length(body) <= 16384),
    expires_ms  INTEGER NOT NULL
) STRICT;
CREATE INDEX leases_expires ON leases (expires_ms);
CREATE INDEX leases_owner_expires ON leases (owner, expires_ms);",
    )
}

// ------------------------------------------------------------ the kind --

/// The routes kind on the store thread: it keeps no counters (a count of
/// at most [`MAX_ROUTES`] rows is cheap where it is needed).
/// The routes kind's state on the store thread: when the next route and
/// the next lease can expire, so that sweeps with nothing due are skipped.
pub struct Routes {
    routes: NextExpiry,
    leases: NextExpiry,
}

impl Routes {
    pub(super) fn new(_options: &StoreOptions) -> Routes {
        Routes {
            routes: NextExpiry::unknown(),
            leases: NextExpiry::unknown(),
        }
    }
}

/// What restart recovery ends of the routes kind (or, for `check`,
/// would): counted over every route, expired ones too.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RouteRecovery {
    /// Prepared and never sent: they end failed (not dispatched).
    pub not_sent: u64,
    /// Being sent when the process stopped: whether the upstream created a
    /// task is unknown, so they need reconciliation (never resent).
    pub in_flight: u64,
    /// Cancelled before they were sent: they end cancelled.
    pub cancelled_unsent: u64,
}

impl RouteRecovery {
    /// Each count with what `check` says of it before recovery and what
    /// `status` says once recovery ran.
    fn told(&self) -> [(u64, &'static str, &'static str); 3] {
        [
            (
                self.not_sent,
                "routes were prepared but not sent at the last stop; serve ends them failed (not dispatched: nothing reached the upstream)",
                "routes prepared but not sent at the last stop ended failed (not dispatched)",
            ),
            (
                self.in_flight,
                "routes were being sent at the last stop; serve marks them as needing reconciliation (whether the upstream created a task is unknown; they are never sent again)",
                "routes in flight at the last stop need reconciliation (never sent again)",
            ),
            (
                self.cancelled_unsent,
                "routes were cancelled before they were sent; serve ends them cancelled",
                "routes cancelled before they were sent ended cancelled",
            ),
        ]
    }
}

impl Report for RouteRecovery {
    fn lines(&self) -> Vec<String> {
        self.told()
            .into_iter()
            .filter(|(n, ..)| *n > 0)
            .map(|(n, pending, _)| format!("note: {n} {pending}"))
            .collect()
    }

    fn ended(&self) -> Vec<String> {
        self.told()
            .into_iter()
            .filter(|(n, ..)| *n > 0)
            .map(|(n, _, ended)| format!("{n} {ended}"))
            .collect()
    }
}

impl Report for RouteCounts {
    fn lines(&self) -> Vec<String> {
        if self.total() == 0 {
            return Vec::new();
        }
        let phases: Vec<String> = self
            .by_phase()
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(phase, n)| format!("{n} {phase}"))
            .collect();
        vec![format!(
            "note: {} unexpired routes ({})",
            self.total(),
            phases.join(", ")
        )]
    }
}

impl RecordKind for Routes {
    type Recovery = RouteRecovery;
    type Status = RouteCounts;

    fn name(&self) -> &'static str {
        "route"
    }

    fn since(&self) -> i64 {
        3
    }

    fn verify_shape(&self, conn: &Connection, _version: i64) -> rusqlite::Result<()> {
        conn.prepare(&format!("SELECT {COLUMNS} FROM routes LIMIT 0"))?;
        conn.prepare(&format!("SELECT {LEASE_COLUMNS} FROM leases LIMIT 0"))
            .map(|_| ())
    }

    fn decode_all(&self, conn: &Connection) -> rusqlite::Result<Result<u64, (String, String)>> {
        ROUTES.decode_all(conn, decode_row)
    }

    fn pending_recovery(
        &self,
        conn: &Connection,
        _version: i64,
    ) -> rusqlite::Result<RouteRecovery> {
        conn.query_row(
            "SELECT
                coalesce(sum(phase = 'prepared'), 0),
                coalesce(sum(phase = 'dispatching'
                    OR (phase = 'cancel_requested' AND upstream_task_id IS NULL AND session IS NOT NULL)), 0),
                coalesce(sum(phase = 'cancel_requested' AND upstream_task_id IS NULL AND session IS NULL), 0)
             FROM routes",
            [],
            |r| {
                Ok(RouteRecovery {
                    not_sent: r.get::<_, i64>(0)?.max(0) as u64,
                    in_flight: r.get::<_, i64>(1)?.max(0) as u64,
                    cancelled_unsent: r.get::<_, i64>(2)?.max(0) as u64,
                })
            },
        )
    }

    fn status(&self, conn: &Connection, _version: i64, now: i64) -> rusqlite::Result<RouteCounts> {
        counts(conn, now)
    }

    fn ensure(&self, _conn: &Connection) -> rusqlite::Result<()> {
        Ok(())
    }

    fn recover(&mut self, conn: &Connection, now: i64) -> rusqlite::Result<()> {
        recover(conn, now)
    }

    fn load(&mut self, conn: &Connection, _now: i64) -> rusqlite::Result<()> {
        self.routes.load(conn, "routes")?;
        self.leases.load(conn, "leases")
    }

    fn sweep(&mut self, conn: &Connection, now: i64, limit: u32) -> rusqlite::Result<u64> {
        let mut deleted = 0;
        if self.routes.is_due(now) {
            deleted += ROUTES.delete_expired(conn, now, limit)?;
            self.routes.swept(conn, "routes")?;
        }
        if self.leases.is_due(now) {
            deleted += LEASES.delete_expired(conn, now, limit)?;
            self.leases.swept(conn, "leases")?;
        }
        Ok(deleted)
    }

    fn sweep_undone(&mut self) {
        self.routes.rolled_back();
        self.leases.rolled_back();
    }

    fn committed(&mut self) {
        self.routes.committed();
        self.leases.committed();
    }

    fn rolled_back(&mut self) {
        self.routes.rolled_back();
        self.leases.rolled_back();
    }
}

// ------------------------------------------------------------- records --

const COLUMNS: &str = "id, owner, binding, binding_digest, request_digest, upstream, capability, schema_digest, source_digest, phase, coordinator, session, upstream_task_id, reason, cancel_attempts, cancel_acknowledged, cancel_reason, deadline_ms, expires_ms, created_ms, updated_ms, poll_interval_ms, status, outcome, decider";

const NONTERMINAL: &str =
    "('prepared','dispatching','routed','cancel_requested','reconciliation_required')";

const LEASE_COLUMNS: &str = "id, owner, body, expires_ms";

/// The statements the routes and leases tables share with every kind's.
static ROUTES: LazyLock<Table> = LazyLock::new(|| Table::new("routes", COLUMNS, COLUMNS));
static LEASES: LazyLock<Table> =
    LazyLock::new(|| Table::new("leases", LEASE_COLUMNS, LEASE_COLUMNS));

fn conversion(col: usize, t: Type, msg: String) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(col, t, msg.into())
}

fn digest_at(row: &Row<'_>, col: usize) -> rusqlite::Result<Digest> {
    let bytes: Vec<u8> = row.get(col)?;
    let array: [u8; 32] = bytes
        .try_into()
        .map_err(|_| conversion(col, Type::Blob, "a digest is not 32 bytes".into()))?;
    Ok(Digest(array))
}

/// Reads one row strictly: the binding must decode and match its digest,
/// the phase and the terminal fields must agree.
fn decode_row(row: &Row<'_>) -> rusqlite::Result<RouteRecord> {
    let id_text: String = row.get(0)?;
    let id = RouteId::parse(&id_text)
        .map_err(|_| conversion(0, Type::Text, format!("malformed route id {id_text:?}")))?;
    let binding: Vec<u8> = row.get(2)?;
    let binding_digest = digest_at(row, 3)?;
    if Digest::of(&binding) != binding_digest {
        return Err(conversion(
            2,
            Type::Blob,
            "the binding does not match its digest".into(),
        ));
    }
    if serde_json::from_slice::<Value>(&binding).is_err() {
        return Err(conversion(2, Type::Blob, "the binding is not JSON".into()));
    }
    let phase_text: String = row.get(9)?;
    let phase = RoutePhase::parse(&phase_text)
        .ok_or_else(|| conversion(9, Type::Text, format!("unknown phase {phase_text:?}")))?;
    let status: Option<String> = row.get(22)?;
    let status = match status {
        None => None,
        Some(s) => Some(
            TaskStatus::parse(&s)
                .ok_or_else(|| conversion(22, Type::Text, format!("unknown status {s:?}")))?,
        ),
    };
    let outcome: Option<Vec<u8>> = row.get(23)?;
    let outcome = match outcome {
        None => None,
        Some(bytes) => {
            if bytes.len() > MAX_ROUTE_OUTCOME_BYTES {
                return Err(conversion(
                    22,
                    Type::Blob,
                    format!("outcome of {} bytes exceeds the route limit", bytes.len()),
                ));
            }
            Some(
                serde_json::from_slice::<Outcome>(&bytes)
                    .map_err(|e| conversion(23, Type::Blob, e.to_string()))?,
            )
        }
    };
    let decider: Option<String> = row.get(24)?;
    let decider = match decider {
        None => None,
        Some(d) => Some(
            Decider::parse(&d)
                .ok_or_else(|| conversion(24, Type::Text, format!("unknown decider {d:?}")))?,
        ),
    };
    let terminal = phase == RoutePhase::Terminal;
    if terminal != status.is_some() || terminal != decider.is_some() {
        return Err(conversion(
            9,
            Type::Text,
            format!("phase {phase_text} does not fit its terminal fields"),
        ));
    }
    let consistent = matches!(
        (status, &outcome),
        (None, None)
            | (Some(TaskStatus::Completed), Some(Outcome::Result(_)))
            | (Some(TaskStatus::Failed), Some(Outcome::Error(_)))
            | (Some(TaskStatus::Cancelled), _)
    );
    if !consistent {
        return Err(conversion(
            22,
            Type::Blob,
            "the outcome does not fit the status".into(),
        ));
    }
    Ok(RouteRecord {
        id,
        owner: digest_at(row, 1)?,
        binding,
        binding_digest,
        request_digest: digest_at(row, 4)?,
        upstream: row.get(5)?,
        capability: row.get(6)?,
        schema_digest: row.get(7)?,
        source_digest: digest_at(row, 8)?,
        phase,
        coordinator: row.get(10)?,
        session: row.get(11)?,
        upstream_task_id: row.get(12)?,
        reason: row.get(13)?,
        cancel_attempts: row.get(14)?,
        cancel_acknowledged: row.get::<_, i64>(15)? != 0,
        cancel_reason: row.get(16)?,
        deadline_ms: row.get(17)?,
        expires_ms: row.get(18)?,
        created_ms: row.get(19)?,
        updated_ms: row.get(20)?,
        poll_interval_ms: row.get(21)?,
        status,
        outcome,
        decider,
    })
}

fn cut(reason: &str) -> String {
    let mut s = reason.to_string();
    if s.len() > MAX_REASON_BYTES {
        let mut at = MAX_REASON_BYTES;
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
    }
    s
}

fn find_owned(
    conn: &Connection,
    id: &RouteId,
    owner: &Digest,
    now: i64,
) -> rusqlite::Result<Option<RouteRecord>> {
    ROUTES.find_owned(conn, id.as_str(), owner, now, decode_row)
}

fn find_unexpired(
    conn: &Connection,
    id: &RouteId,
    now: i64,
) -> rusqlite::Result<Option<RouteRecord>> {
    ROUTES.find_unexpired(conn, id.as_str(), now, decode_row)
}

fn count(conn: &Connection, sql: &str, p: impl rusqlite::Params) -> rusqlite::Result<u64> {
    conn.prepare_cached(sql)?
        .query_row(p, |r| r.get::<_, i64>(0))
        .map(|n| n as u64)
}

/// Restart recovery. A prepared route was never sent: it ends as taskgate's
/// own rejection (cancelled, if its caller cancelled it). A dispatching one
/// (also one cancelled while it was being sent) may or may not have reached
/// the upstream: it needs reconciliation and is never sent again. Routed and
/// cancel_requested routes keep their upstream session: it is no longer
/// current, which the router sees at the next poll.
fn recover(conn: &Connection, now: i64) -> rusqlite::Result<()> {
    let not_sent = Outcome::Error(ErrorBody {
        code: crate::wire::ROUTE_NOT_DISPATCHED.code,
        message: "taskgate stopped before the submission was sent; nothing reached the upstream"
            .into(),
        data: Some(crate::wire::ROUTE_NOT_DISPATCHED.data()),
    });
    let payload = serde_json::to_vec(&not_sent).unwrap_or_default();
    conn.execute(
        "UPDATE routes SET phase = 'terminal', status = 'failed', outcome = :payload, decider = 'broker',
            reason = 'not dispatched: taskgate stopped before contacting the upstream', updated_ms = :now
         WHERE phase = 'prepared'",
        named_params! { ":payload": payload, ":now": now },
    )?;
    conn.execute(
        "UPDATE routes SET phase = 'reconciliation_required',
            reason = 'taskgate stopped while the submission was in flight; whether the upstream created a task is unknown', updated_ms = :now
         WHERE phase = 'dispatching'
            OR (phase = 'cancel_requested' AND upstream_task_id IS NULL AND session IS NOT NULL)",
        named_params! { ":now": now },
    )?;
    // Cancelled before it was ever sent.
    conn.execute(
        "UPDATE routes SET phase = 'terminal', status = 'cancelled', outcome = NULL, decider = 'broker',
            reason = 'cancelled before it was sent; nothing reached the upstream', updated_ms = :now
         WHERE phase = 'cancel_requested' AND upstream_task_id IS NULL AND session IS NULL",
        named_params! { ":now": now },
    )?;
    Ok(())
}

fn insert(
    conn: &Connection,
    id: &RouteId,
    new: &NewRoute,
    binding_digest: &Digest,
    now: i64,
) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO routes (id, owner, idempotency, binding, binding_digest, request_digest, upstream, capability, schema_digest, source_digest, phase, deadline_ms, expires_ms, created_ms, updated_ms, poll_interval_ms)
         VALUES (:id, :owner, :idem, :binding, :bd, :rd, :upstream, :capability, :schema, :source, 'prepared', :deadline, :expires, :now, :now, :poll)",
    )?
    .execute(named_params! {
        ":id": id.as_str(),
        ":owner": &new.owner.0[..],
        ":idem": &new.idempotency.0[..],
        ":binding": &new.binding,
        ":bd": &binding_digest.0[..],
        ":rd": &new.request_digest.0[..],
        ":upstream": &new.upstream,
        ":capability": &new.capability,
        ":schema": &new.schema_digest,
        ":source": &new.source_digest.0[..],
        ":deadline": new.deadline_ms,
        ":expires": new.expires_ms,
        ":now": now,
        ":poll": new.poll_interval_ms,
    })?;
    Ok(())
}

/// A submission: the caller's route for the same key (same binding), or a
/// conflict, or a new prepared route within the bounds.
fn prepare<K: Holds<Routes>>(tx: &mut Tx<'_, K>, new: &NewRoute) -> Result<Prepared, OpError> {
    let (c, now) = (tx.conn, tx.now);
    let binding_digest = Digest::of(&new.binding);
    let existing = c
        .prepare_cached(&format!(
            "SELECT {COLUMNS}, expires_ms <= ?3 FROM routes WHERE owner = ?1 AND idempotency = ?2"
        ))?
        .query_row(
            params![&new.owner.0[..], &new.idempotency.0[..], now],
            |row| Ok((decode_row(row)?, row.get::<_, bool>(25)?)),
        )
        .optional()?;
    if let Some((record, expired)) = existing {
        if !expired {
            return if record.binding_digest == binding_digest {
                Ok(Prepared::Existing(record))
            } else {
                Err(OpError::Refused(StoreError::Conflict))
            };
        }
        // An expired route no longer holds its key.
        c.prepare_cached("DELETE FROM routes WHERE id = ?1")?
            .execute(params![record.id.as_str()])?;
    }
    ROUTES.delete_expired(c, now, ROUTE_SWEEP_ON_SUBMIT)?;
    if count(c, "SELECT count(*) FROM routes", [])? >= MAX_ROUTES {
        return Err(OpError::Refused(StoreError::RouteCapacity {
            limit: MAX_ROUTES,
            per_caller: false,
        }));
    }
    if count(
        c,
        "SELECT count(*) FROM routes WHERE owner = ?1 AND expires_ms > ?2",
        params![&new.owner.0[..], now],
    )? >= MAX_ROUTES_PER_OWNER
    {
        return Err(OpError::Refused(StoreError::RouteCapacity {
            limit: MAX_ROUTES_PER_OWNER,
            per_caller: true,
        }));
    }
    let id = RouteId::generate()
        .map_err(|e| OpError::Refused(StoreError::Internal(format!("random source: {e}"))))?;
    insert(c, &id, new, &binding_digest, now)?;
    tx.kinds.kind_mut().routes.added(new.expires_ms);
    let record = find_unexpired(c, &id, now)?.ok_or_else(|| {
        OpError::Refused(StoreError::Internal(
            "a route vanished as it was written".into(),
        ))
    })?;
    Ok(Prepared::New(record))
}

/// Applies `change` when the route is in one of `from`.
fn advance<K>(
    tx: &mut Tx<'_, K>,
    id: &RouteId,
    from: &[RoutePhase],
    change: &RouteChange,
) -> Result<Advanced, OpError> {
    let (c, now) = (tx.conn, tx.now);
    let Some(current) = find_unexpired(c, id, now)? else {
        return Ok(Advanced::Missing);
    };
    if !from.contains(&current.phase) {
        return Ok(Advanced::Unchanged(current));
    }
    if let RouteChange::CancelAttempt { max_attempts } = change
        && (current.cancel_acknowledged || current.cancel_attempts >= *max_attempts)
    {
        return Ok(Advanced::Unchanged(current));
    }
    let phase = change.target().unwrap_or(current.phase);
    let sql_id = id.as_str();
    match change {
        RouteChange::Dispatching {
            coordinator,
            session,
        } => {
            c.prepare_cached(
                "UPDATE routes SET phase = :phase, coordinator = :coordinator, session = :session, updated_ms = :now WHERE id = :id",
            )?
            .execute(named_params! {":phase": phase.as_str(), ":coordinator": coordinator, ":session": session, ":now": now, ":id": sql_id})?;
        }
        RouteChange::Routed {
            upstream_task_id,
            poll_interval_ms,
        } => {
            c.prepare_cached(
                "UPDATE routes SET phase = CASE WHEN phase = 'cancel_requested' THEN phase ELSE :phase END, upstream_task_id = :upstream, poll_interval_ms = max(poll_interval_ms, :poll), updated_ms = :now WHERE id = :id",
            )?
            .execute(named_params! {":phase": phase.as_str(), ":upstream": upstream_task_id, ":poll": poll_interval_ms, ":now": now, ":id": sql_id})?;
        }
        RouteChange::Terminal {
            status,
            outcome,
            decider,
            reason,
        } => {
            if !status.is_terminal() {
                return Err(OpError::Refused(StoreError::Invalid(format!(
                    "{} is not a terminal status",
                    status.as_str()
                ))));
            }
            let payload = outcome
                .as_ref()
                .map(|o| serde_json::to_vec(o).unwrap_or_default());
            if let Some(p) = &payload
                && p.len() > MAX_ROUTE_OUTCOME_BYTES
            {
                return Err(OpError::Refused(StoreError::PayloadTooLarge {
                    size: p.len(),
                    limit: MAX_ROUTE_OUTCOME_BYTES,
                }));
            }
            c.prepare_cached(
                "UPDATE routes SET phase = 'terminal', status = :status, outcome = :outcome, decider = :decider, reason = coalesce(:reason, reason), updated_ms = :now WHERE id = :id",
            )?
            .execute(named_params! {":status": status.as_str(), ":outcome": payload, ":decider": decider.as_str(), ":reason": reason.as_deref().map(cut), ":now": now, ":id": sql_id})?;
        }
        RouteChange::Reconcile { reason, detach } => {
            let reason = match (&current.session, detach) {
                (Some(session), true) => format!("{reason} (it went out on session {session})"),
                _ => reason.clone(),
            };
            c.prepare_cached(
                "UPDATE routes SET phase = :phase, reason = :reason, session = CASE WHEN :detach THEN NULL ELSE session END, updated_ms = :now WHERE id = :id",
            )?
            .execute(named_params! {":phase": phase.as_str(), ":reason": cut(&reason), ":detach": *detach, ":now": now, ":id": sql_id})?;
        }
        RouteChange::CancelRequested { reason } => {
            c.prepare_cached(
                "UPDATE routes SET phase = :phase, cancel_reason = :reason, updated_ms = :now WHERE id = :id",
            )?
            .execute(named_params! {":phase": phase.as_str(), ":reason": cut(reason), ":now": now, ":id": sql_id})?;
        }
        RouteChange::CancelAttempt { .. } => {
            c.prepare_cached(
                "UPDATE routes SET cancel_attempts = cancel_attempts + 1, updated_ms = :now WHERE id = :id",
            )?
            .execute(named_params! {":now": now, ":id": sql_id})?;
        }
        RouteChange::CancelAcknowledged => {
            c.prepare_cached(
                "UPDATE routes SET cancel_acknowledged = 1, updated_ms = :now WHERE id = :id",
            )?
            .execute(named_params! {":now": now, ":id": sql_id})?;
        }
    }
    let after = find_unexpired(c, id, now)?.ok_or_else(|| {
        OpError::Refused(StoreError::Internal(
            "a route vanished as it was changed".into(),
        ))
    })?;
    Ok(Advanced::Changed(after))
}

fn create_lease<K: Holds<Routes>>(tx: &mut Tx<'_, K>, lease: &LeaseRecord) -> Result<(), OpError> {
    let (c, now) = (tx.conn, tx.now);
    LEASES.delete_expired(c, now, ROUTE_SWEEP_ON_SUBMIT)?;
    if count(c, "SELECT count(*) FROM leases", [])? >= MAX_LEASES {
        return Err(OpError::Refused(StoreError::RouteCapacity {
            limit: MAX_LEASES,
            per_caller: false,
        }));
    }
    if count(
        c,
        "SELECT count(*) FROM leases WHERE owner = ?1 AND expires_ms > ?2",
        params![&lease.owner.0[..], now],
    )? >= MAX_LEASES_PER_OWNER
    {
        return Err(OpError::Refused(StoreError::RouteCapacity {
            limit: MAX_LEASES_PER_OWNER,
            per_caller: true,
        }));
    }
    c.prepare_cached("INSERT INTO leases (id, owner, body, expires_ms) VALUES (?1, ?2, ?3, ?4)")?
        .execute(params![
            &lease.id,
            &lease.owner.0[..],
            &lease.body,
            lease.expires_ms
        ])?;
    tx.kinds.kind_mut().leases.added(lease.expires_ms);
    Ok(())
}

/// Routes by phase, unexpired ones only.
fn counts(conn: &Connection, now: i64) -> rusqlite::Result<RouteCounts> {
    let mut stmt = conn.prepare_cached(
        "SELECT phase, count(*) FROM routes WHERE expires_ms > ?1 GROUP BY phase",
    )?;
    let mut rows = stmt.query(params![now])?;
    let mut counts = RouteCounts::default();
    while let Some(row) = rows.next()? {
        let phase: String = row.get(0)?;
        if let Some(p) = RoutePhase::parse(&phase) {
            counts.add(p, row.get::<_, i64>(1)? as u64);
        }
    }
    Ok(counts)
}

// ----------------------------------------------------- the operations --

impl<K: Registry + Holds<Routes>> Store<K> {
    /// Commits a prepared route, or returns the caller's existing route for
    /// the same key and binding (`Conflict` for another binding).
    pub async fn prepare_route(&self, new: NewRoute) -> Result<Prepared, StoreError> {
        if new.binding.len() > MAX_BINDING_BYTES {
            return Err(StoreError::Invalid(format!(
                "a submission binding of {} bytes exceeds {MAX_BINDING_BYTES}",
                new.binding.len()
            )));
        }
        if new.poll_interval_ms <= 0 {
            return Err(StoreError::Invalid("poll interval must be positive".into()));
        }
        self.write_op("writing a route", false, move |tx| prepare(tx, &new))
            .await
    }

    /// Moves a route to another phase, only from one of `from`.
    pub async fn advance_route(
        &self,
        id: &RouteId,
        from: &[RoutePhase],
        change: RouteChange,
    ) -> Result<Advanced, StoreError> {
        let (id, from) = (id.clone(), from.to_vec());
        self.write_op("writing a route", false, move |tx| {
            advance(tx, &id, &from, &change)
        })
        .await
    }

    /// The caller's unexpired route: `None` for unknown, expired and another
    /// caller's IDs alike.
    pub async fn get_route(
        &self,
        id: &RouteId,
        owner: &Digest,
    ) -> Result<Option<RouteRecord>, StoreError> {
        let (id, owner) = (id.clone(), *owner);
        self.read_op("reading a route", move |cx| {
            Ok(find_owned(cx.conn, &id, &owner, cx.now)?)
        })
        .await
    }

    /// The caller's unexpired route submitted under `idempotency`.
    pub async fn find_route_by_key(
        &self,
        owner: &Digest,
        idempotency: &Digest,
    ) -> Result<Option<RouteRecord>, StoreError> {
        let (owner, idempotency) = (*owner, *idempotency);
        self.read_op("reading a route by its key", move |cx| {
            Ok(cx
                .conn
                .prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM routes WHERE owner = ?1 AND idempotency = ?2 AND expires_ms > ?3"
                ))?
                .query_row(
                    params![&owner.0[..], &idempotency.0[..], cx.now],
                    decode_row,
                )
                .optional()?)
        })
        .await
    }

    /// An unexpired route whoever owns it (the operator's view).
    pub async fn route(&self, id: &RouteId) -> Result<Option<RouteRecord>, StoreError> {
        let id = id.clone();
        self.read_op("reading a route", move |cx| {
            Ok(find_unexpired(cx.conn, &id, cx.now)?)
        })
        .await
    }

    /// Unexpired routes, newest first, at most `limit`, optionally only the
    /// nonterminal ones (the operator's view).
    pub async fn list_routes(
        &self,
        limit: u32,
        open_only: bool,
    ) -> Result<Vec<RouteRecord>, StoreError> {
        self.read_op("listing routes", move |cx| {
            let filter = if open_only {
                format!("AND phase IN {NONTERMINAL}")
            } else {
                String::new()
            };
            let mut stmt = cx.conn.prepare(&format!(
                "SELECT {COLUMNS} FROM routes WHERE expires_ms > ?1 {filter} ORDER BY created_ms DESC, id LIMIT ?2"
            ))?;
            let rows = stmt.query_map(params![cx.now, limit], decode_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    /// Unexpired routes by phase.
    pub async fn route_counts(&self) -> Result<RouteCounts, StoreError> {
        self.read_op("counting routes", move |cx| Ok(counts(cx.conn, cx.now)?))
            .await
    }

    /// Commits a capability lease within the lease bounds.
    pub async fn create_lease(&self, lease: LeaseRecord) -> Result<(), StoreError> {
        self.write_op("writing a route", false, move |tx| create_lease(tx, &lease))
            .await
    }

    /// The caller's unexpired lease (`None` for unknown, expired and another
    /// caller's alike).
    pub async fn get_lease(
        &self,
        id: &str,
        owner: &Digest,
    ) -> Result<Option<LeaseRecord>, StoreError> {
        let (id, owner) = (id.to_string(), *owner);
        self.read_op("reading a lease", move |cx| {
            Ok(LEASES.find_owned(cx.conn, &id, &owner, cx.now, decode_lease)?)
        })
        .await
    }
}

fn decode_lease(row: &Row<'_>) -> rusqlite::Result<LeaseRecord> {
    Ok(LeaseRecord {
        id: row.get(0)?,
        owner: digest_at(row, 1)?,
        body: row.get(2)?,
        expires_ms: row.get(3)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_round_trip() {
        for p in RoutePhase::ALL {
            assert_eq!(RoutePhase::parse(p.as_str()), Some(p));
        }
    }

    #[test]
    fn the_upstream_task_id_is_written_once() {
        let conn = Connection::open_in_memory().unwrap();
        create_tables(&conn).unwrap();
        conn.execute(
            "INSERT INTO routes (id, owner, idempotency, binding, binding_digest, request_digest, upstream, capability, schema_digest, source_digest, phase, deadline_ms, expires_ms, created_ms, updated_ms, poll_interval_ms)
             VALUES ('r', zeroblob(32), zeroblob(32), x'7b7d', zeroblob(32), zeroblob(32), 'u', 'u.t', 's', zeroblob(32), 'routed', 1, 1, 1, 1, 1)",
            [],
        )
        .unwrap();
        conn.execute("UPDATE routes SET upstream_task_id = 'a'", [])
            .unwrap();
        conn.execute("UPDATE routes SET upstream_task_id = 'a'", [])
            .unwrap();
        let err = conn
            .execute("UPDATE routes SET upstream_task_id = 'b'", [])
            .unwrap_err();
        assert!(err.to_string().contains("written once"), "{err}");
    }
}
