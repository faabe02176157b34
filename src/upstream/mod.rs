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
