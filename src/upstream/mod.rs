//! Upstream MCP servers as sources of tools. Each `[[upstream]]` gets a
//! supervisor ([`source`]) that connects as an MCP client (rmcp; the
//! 2026-07-28 discovery, falling back to a legacy `initialize`), lists its
//! tools and keeps the connection; its tools are served as `alias.tool`
//! ([`tool`]), forwarded synchronously or run as taskgate tasks exactly as
//! command tools are, since they are [`crate::tools::Runner`]s too.
//! Each tool's description has a digest ([`digest`]); the operator pins the
//! digests they reviewed ([`pins`]), and a tool whose live digest differs
//! from its pin is withheld.
//!
//! This module knows nothing of tasks, owners, the store or the HTTP
//! listener: it is a [`ToolSource`] the registry asks, and a status it
//! reports.
//!
//! Owns upstream MCP servers as sources of tools. `Upstreams` is the
//! `tools::ToolSource` the `Registry` asks; `tools` knows nothing of it. It
//! uses `tools` (the runner, the shim, the confinement), `auth` (an upstream's
//! credential file is read under the rules of taskgate's own: private, 77
//! otherwise), `config`, `wire` and `exit`; it is used by `service` (holds the
//! upstreams, applies them at start and on reload, stops them), `startup`
//! (reads the pins, checks a stdio upstream's confinement), `admin` (their
//! status, the `upstreams` request), `main` (`taskgate upstream`) and `route`
//! (durable routes, through `durable.rs`). `source.rs`: one supervisor per
//! `[[upstream]]`, which connects as an MCP client (rmcp: the 2026-07-28
//! `server/discover`, falling back to a 2025-11-25 `initialize`) within
//! `connect_timeout_secs`, lists the tools page by page (refused whole past
//! `max_tools`), and publishes a `Snapshot` (state `connecting`, `ready`,
//! `unavailable` or `stopped`, since when, a random session id per connection,
//! the protocol version, whether Tasks was advertised, the catalog, the last
//! error) that calls and `status` read without ever waiting for a connection; a
//! lost or refused connection is made again after a backoff of 1 s doubling to
//! 60 s; the tools are listed again on `notifications/tools/list_changed` and
//! every 5 minutes, with rmcp's response cache off (each listing is the
//! upstream's now); a reload's new settings and pins and the supervisor's news
//! are published under one lock, so neither overwrites the other; the paths no
//! stdio upstream may reach are read at each connection (a reload that protects
//! more reconnects every stdio upstream). `tool.rs`: each listed tool is a
//! `Capability` (its digest, its pin state, the effect and task mode the
//! operator gave in `[[upstream]]`, never the upstream's annotation hints;
//! withheld when its digest differs from its pin, or its name or input schema
//! cannot be served) and, when callable, an `UpstreamTool` runner named
//! `alias.tool`: arguments validated against its schema, then forwarded on the
//! current connection under `max_concurrent_requests` (past it
//! `TG_UPSTREAM_BUSY`, nothing sent), `request_timeout_secs` and
//! `max_response_bytes`; the result's `_meta` dropped; every failure a
//! `RunError` with its `TG_UPSTREAM_*` code; `starts_process()` is false, so it
//! holds no running slot. A tool its `[upstream.tools.NAME]` marks `approval =
//! "required"` carries an `ApprovalRule` whose definition digest binds the
//! alias, transport, bounds, the tool's (pinned) digest, effect and task, so
//! `tasks` holds it at the command tools' gate; an `approval_preview` field its
//! schema lacks withholds it, re-checked at every catalog rebuild, and
//! `durable.rs` never routes it. A tool marked `task = "optional"|"required"`
//! runs as a task like any runner: `tasks` commits it before answering and
//! never runs it again after a restart. `transport.rs`: a stdio upstream starts
//! through the shim with a command tool's confinement and process limits (its
//! own table's, else `[tools]`'; `tools::process::Server`), and its stdout
//! reaches rmcp only as whole lines, each at most `max_response_bytes` and
//! JSON, a tool list longer than `max_tools` refused before it is parsed;
//! anything else closes the connection, which is then made again. HTTP goes
//! through reqwest on the daemon's rustls stack: no redirects, no proxy from
//! the environment, the system's trust roots or `ca_file`, the bearer
//! credential read from `bearer_token_file` at each connection, and checked by
//! a start, `check` and a reload (`config` allows `http://` only to loopback).
//! `digest.rs`: sha256 over the RFC 8785 canonical JSON of a tool's name,
//! description, input and output schema and annotations. `pins.rs`:
//! `upstream-pins.toml` beside the configuration file, read strictly at start
//! and on reload (78; writable by anyone but its owner, 77), written whole by
//! `taskgate upstream pin` (never writable by others). `diff.rs`: what changed
//! since the pin, as JSON-pointer lines. `Upstreams::apply`, at start and on
//! each reload: new upstreams connect in the background, removed ones retire
//! once their calls in flight end, a changed connection setting connects again,
//! changed tool settings or pins keep the connection. `durable.rs`: what
//! durable routes use of an upstream's own Tasks. `routable()` and
//! `routable_named()` give the capabilities a route may use now (a pinned, not
//! withheld tool of a `ready` upstream that negotiated 2026-07-28 and
//! advertised Tasks), each with its pin digest (the submission's
//! `providerInterfaceVersion`), the operator's effect, a source digest over the
//! upstream's configuration and the tool as discovered, and the current
//! session, or why not; `submit`, `get_task` and `cancel_task` each go out on
//! the one session the caller names, and on no other (when it is no longer
//! current nothing is sent), declaring Tasks on that request only and carrying
//! the execution envelope (`dev.taskgate/taskExecution`) with a submission;
//! they report what came back (`Answer`, `RemoteTask`) or whether anything was
//! sent at all (`Failure::NotSent` or `Unknown`, `PollFailure`), and decide
//! nothing about a route. Knows nothing of tasks, owners, the store or the HTTP
//! listener: a run gets the arguments and a cancellation token, never the
//! caller, so a caller's identity and credential cannot reach an upstream.

pub mod diff;
pub mod digest;
mod durable;
pub mod pins;
mod source;
mod tool;
mod transport;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::config::{TaskMode, UpstreamConfig};
use crate::tools::{Lookup, RunError, ToolSource, ToolSpec};
use crate::wire;

pub use pins::{PINS_FILE_NAME, Pins, PinsError};

/// Checks each HTTP upstream's credential file as a start, `check` and a
/// reload must: present, private (77 otherwise) and holding one usable
/// line (78). A connection reads it again.
pub fn check_credentials(configs: &[UpstreamConfig]) -> Result<(), crate::auth::AuthError> {
    for c in configs {
        if let crate::config::UpstreamTransport::Http {
            bearer_token_file: Some(file),
            ..
        } = &c.transport
        {
            transport::bearer(file, &c.alias)?;
        }
    }
    Ok(())
}
pub use durable::{
    Answer, EXECUTION_META_KEY, Failure, PollFailure, ROUTABLE_PROTOCOL, RemoteTask, Routable,
};
pub use source::State;
pub use tool::PinState;

/// Every upstream of the daemon, by alias; changed whole by a reload.
#[derive(Debug)]
pub struct Upstreams {
    sources: Mutex<BTreeMap<String, Arc<source::Source>>>,
    /// The paths no stdio upstream may reach (as for command tools); a
    /// reload replaces them, and each connection reads them anew.
    protected: Arc<std::sync::RwLock<Arc<Vec<PathBuf>>>>,
    /// Cancelled when the daemon stops: every supervisor's stop descends
    /// from it.
    stop: CancellationToken,
    /// Removed upstreams whose calls in flight are finishing.
    retiring: tokio_util::task::TaskTracker,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a reload did to the upstreams, for its report.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Applied {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    /// Connection settings changed: connected again.
    pub restarted: Vec<String>,
    /// Only the tool settings or pins changed: the connection kept.
    pub updated: Vec<String>,
}

impl Upstreams {
    pub fn new(protected: Vec<PathBuf>, stop: CancellationToken) -> Arc<Upstreams> {
        Arc::new(Upstreams {
            sources: Mutex::new(BTreeMap::new()),
            protected: Arc::new(std::sync::RwLock::new(Arc::new(protected))),
            stop,
            retiring: tokio_util::task::TaskTracker::new(),
        })
    }

    /// Makes the running upstreams those of `configs` under `pins`: new
    /// ones start connecting (in the background: nothing here waits for
    /// an upstream), removed ones stop, ones whose connection settings
    /// changed connect again, and the others keep their connection with
    /// the new tool settings and pins.
    /// `protected` are the paths no stdio upstream may reach now: when they
    /// changed, every stdio upstream connects again under them.
    pub async fn apply(
        &self,
        configs: &[UpstreamConfig],
        pins: &Pins,
        protected: Vec<PathBuf>,
    ) -> Applied {
        let pins = Arc::new(pins.clone());
        let mut applied = Applied::default();
        let mut stopping = Vec::new();
        let mut kept = Vec::new();
        let protection_changed = {
            let mut current = self.protected.write().unwrap_or_else(|p| p.into_inner());
            let changed = **current != protected;
            *current = Arc::new(protected);
            changed
        };
        {
            let mut sources = lock(&self.sources);
            let wanted: BTreeMap<&str, &UpstreamConfig> =
                configs.iter().map(|c| (c.alias.as_str(), c)).collect();
            let gone: Vec<String> = sources
                .keys()
                .filter(|a| !wanted.contains_key(a.as_str()))
                .cloned()
                .collect();
            for alias in gone {
                if let Some(s) = sources.remove(&alias) {
                    stopping.push(s);
                }
                applied.removed.push(alias);
            }
            for (alias, config) in wanted {
                let config = Arc::new(config.clone());
                let stdio = matches!(config.transport, crate::config::UpstreamTransport::Stdio(_));
                match sources.get(alias) {
                    Some(running)
                        if same_connection(&running.shared.config(), &config)
                            && !(stdio && protection_changed) =>
                    {
                        kept.push((running.clone(), config));
                    }
                    Some(_) => {
                        if let Some(old) = sources.remove(alias) {
                            stopping.push(old);
                        }
                        sources.insert(alias.to_string(), Arc::new(self.start(config, &pins)));
                        applied.restarted.push(alias.to_string());
                    }
                    None => {
                        sources.insert(alias.to_string(), Arc::new(self.start(config, &pins)));
                        applied.added.push(alias.to_string());
                    }
                }
            }
        }
        // Outside the lock: rebuilding a catalog compiles every schema, and
        // lookups must not wait for that.
        for (running, config) in kept {
            let alias = config.alias.clone();
            if running.shared.adopt(config, pins.clone()) {
                applied.updated.push(alias);
            }
        }
        // Their calls in flight finish first; the reload does not wait.
        for s in stopping {
            self.retiring.spawn(async move { s.retire().await });
        }
        applied
    }

    fn start(&self, config: Arc<UpstreamConfig>, pins: &Arc<Pins>) -> source::Source {
        source::Source::start(
            config,
            pins.clone(),
            self.protected.clone(),
            self.stop.child_token(),
        )
    }

    /// Stops every upstream, retiring ones too (the daemon is stopping;
    /// its calls were stopped before).
    pub async fn stop_all(&self) {
        self.stop.cancel();
        let all: Vec<Arc<source::Source>> = std::mem::take(&mut *lock(&self.sources))
            .into_values()
            .collect();
        for s in all {
            s.stop().await;
        }
        self.retiring.close();
        self.retiring.wait().await;
    }

    fn sources(&self) -> Vec<Arc<source::Source>> {
        lock(&self.sources).values().cloned().collect()
    }

    /// Every upstream as `status` shows it; with each capability when
    /// `capabilities` (for `taskgate upstream show`).
    pub fn status(&self, capabilities: bool) -> Vec<UpstreamStatus> {
        self.sources()
            .iter()
            .map(|s| status_of(&s.shared, capabilities))
            .collect()
    }
}

/// Whether two settings of one upstream reach it the same way: only the
/// tool settings differ, so the connection can be kept.
fn same_connection(a: &UpstreamConfig, b: &UpstreamConfig) -> bool {
    a.transport == b.transport && a.limits == b.limits
}

impl ToolSource for Upstreams {
    fn lookup(&self, name: &str) -> Lookup {
        let Some((alias, _)) = name.split_once('.') else {
            return Lookup::Unknown;
        };
        let Some(source) = lock(&self.sources).get(alias).cloned() else {
            return Lookup::Unknown;
        };
        let snapshot = source.shared.snapshot();
        match snapshot.catalog.get(name) {
            Some(cap) => match (&cap.tool, &cap.withheld) {
                (Some(tool), _) => Lookup::Found(tool.clone()),
                (None, why) => Lookup::Refused(RunError::Remote {
                    code: wire::UPSTREAM_TOOL_WITHHELD,
                    detail: format!(
                        "{name} is withheld: {}",
                        why.as_deref().unwrap_or("it cannot be served")
                    ),
                    data: Some(json!({"retryable": false, "sent": false})),
                }),
            },
            // Not connected: its tools are unknown until it answers, and a
            // call that names one is told to come back.
            None if snapshot.session.is_none() => Lookup::Refused(RunError::Remote {
                code: wire::UPSTREAM_UNAVAILABLE,
                detail: format!(
                    "upstream {alias} is not connected ({}); nothing was sent",
                    snapshot.state.as_str()
                ),
                data: Some(json!({"retryable": true, "sent": false})),
            }),
            None => Lookup::Unknown,
        }
    }

    fn specs(&self) -> Vec<ToolSpec> {
        let mut out = Vec::new();
        for source in self.sources() {
            let snapshot = source.shared.snapshot();
            let mut tools: Vec<&ToolSpec> = snapshot
                .catalog
                .values()
                .filter_map(|c| c.tool.as_ref())
                .map(|t| crate::tools::Runner::spec(t.as_ref()))
                .collect();
            tools.sort_by(|a, b| a.name.cmp(&b.name));
            out.extend(tools.into_iter().cloned());
        }
        out
    }
}

/// One upstream as `status` and `taskgate upstream` show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpstreamStatus {
    pub alias: String,
    /// `stdio` or `http`.
    pub transport: String,
    /// The program, or the URL.
    pub target: String,
    /// `connecting`, `ready`, `unavailable` or `stopped`.
    pub state: String,
    /// When it entered that state (RFC 3339, UTC).
    pub since: String,
    /// The current connection's id (random per connection).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol_version: Option<String>,
    /// Whether it advertised the Tasks extension.
    #[serde(default)]
    pub tasks_advertised: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// Which of its answers must echo a durable route's envelope:
    /// `every_answer`, or the weaker `creation_only`.
    #[serde(default)]
    pub route_echo: String,
    /// Tools it lists, those callers get, and those withheld.
    pub tools: usize,
    pub available: usize,
    pub withheld: usize,
    /// Listed tools with no pin.
    pub unpinned: usize,
    /// The withheld tools, each with why (by name; at most
    /// [`MAX_WITHHELD_NAMED`], the count says how many there are).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub withheld_tools: Vec<WithheldTool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Each capability (only for `taskgate upstream show`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<CapabilityStatus>,
}

/// The most withheld tools `status` names one by one: a status answer
/// stays bounded when an upstream lists many that fail the same way.
pub const MAX_WITHHELD_NAMED: usize = 32;

/// A tool callers do not get, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WithheldTool {
    pub name: String,
    pub reason: String,
}

/// One capability of an upstream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapabilityStatus {
    /// The upstream's own name.
    pub tool: String,
    /// The name callers use.
    pub name: String,
    pub digest: String,
    /// `pinned`, `unpinned` or `differs`.
    pub pin: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned_digest: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub withheld: Option<String>,
    pub effect: String,
    pub task: String,
    /// Whether each exact call waits for an administrator's approval.
    #[serde(default)]
    pub approval: bool,
    /// The description as listed.
    pub described: Value,
}

fn rfc3339(t: std::time::SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t)
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn status_of(shared: &Arc<source::Shared>, capabilities: bool) -> UpstreamStatus {
    let config = shared.config();
    let snapshot = shared.snapshot();
    let caps: Vec<&Arc<tool::Capability>> = {
        let mut v: Vec<_> = snapshot.catalog.values().collect();
        v.sort_by(|a, b| a.remote.cmp(&b.remote));
        v
    };
    let session = snapshot.session.as_ref();
    UpstreamStatus {
        alias: config.alias.clone(),
        transport: config.kind().to_string(),
        target: config.target(),
        state: snapshot.state.as_str().to_string(),
        since: rfc3339(snapshot.since),
        session: session.map(|s| s.id.clone()),
        protocol_version: session.map(|s| s.version.clone()),
        tasks_advertised: session.is_some_and(|s| s.tasks),
        server: session.and_then(|s| s.server.clone()),
        route_echo: config.route_echo.as_str().to_string(),
        tools: caps.len(),
        available: caps.iter().filter(|c| c.tool.is_some()).count(),
        withheld: caps.iter().filter(|c| c.tool.is_none()).count(),
        unpinned: caps.iter().filter(|c| c.pin == PinState::Unpinned).count(),
        withheld_tools: caps
            .iter()
            .filter_map(|c| {
                c.withheld.as_ref().map(|why| WithheldTool {
                    name: c.name.clone(),
                    reason: why.clone(),
                })
            })
            .take(MAX_WITHHELD_NAMED)
            .collect(),
        last_error: snapshot.last_error.clone(),
        capabilities: if capabilities {
            caps.iter()
                .map(|c| CapabilityStatus {
                    tool: c.remote.clone(),
                    name: c.name.clone(),
                    digest: c.digest.clone(),
                    pin: match c.pin {
                        PinState::Pinned => "pinned",
                        PinState::Unpinned => "unpinned",
                        PinState::Differs { .. } => "differs",
                    }
                    .to_string(),
                    pinned_digest: match &c.pin {
                        PinState::Differs { pinned } => Some(pinned.clone()),
                        PinState::Pinned => Some(c.digest.clone()),
                        PinState::Unpinned => None,
                    },
                    withheld: c.withheld.clone(),
                    effect: effect_name(c.effect).to_string(),
                    task: task_name(c.task).to_string(),
                    approval: c.approval.is_some(),
                    described: c.described.clone(),
                })
                .collect()
        } else {
            Vec::new()
        },
    }
}

pub fn effect_name(e: crate::config::Effect) -> &'static str {
    match e {
        crate::config::Effect::ReadOnly => "read_only",
        crate::config::Effect::IdempotentWrite => "idempotent_write",
        crate::config::Effect::NonIdempotentWrite => "non_idempotent_write",
    }
}

pub fn task_name(t: TaskMode) -> &'static str {
    match t {
        TaskMode::Never => "never",
        TaskMode::Optional => "optional",
        TaskMode::Required => "required",
    }
}
