//! Tools: what a call runs. A [`Runner`] describes itself ([`ToolSpec`]),
//! checks its arguments and runs one call under a cancellation token. Two
//! kinds exist today: command tools from `[[tool]]` configuration
//! ([`command`], run as bounded child processes by [`process`] under the
//! [`shim`]) and built-ins of the daemon ([`builtin`]). Tools that come
//! and go while the daemon runs (those of upstream MCP servers) are found
//! through a [`ToolSource`] the registry asks after its own tools.
//!
//! This module knows nothing of tasks, owners, the store or the protocol
//! library: a run produces the tool result's JSON (the shape of MCP's
//! `CallToolResult`) or a [`RunError`] that knows its wire code.
//!
//! Owns what a call runs. The `Runner` trait (spec, validate, run under a
//! cancellation token, and `starts_process()`, false only for the bench no-op)
//! and the `Registry` (duplicate names refused, 78). `command.rs`: `[[tool]]`
//! compiled once (schema, argv template), refusing (78) a name of the daemon's
//! own tools (`RESERVED_TOOL_NAMES`: `artifact_read`, which `tasks` serves) and
//! a `non_idempotent_write` tool that would run as a background task (a restart
//! would leave its effect unknown); `process.rs`: no shell, allow-listed
//! environment, arguments on stdin, own process group, output caps, timeout,
//! SIGTERM → grace → SIGKILL to the group, never started when already
//! cancelled; `shim.rs`: `taskgate exec-tool` (hidden) kills the tool's group
//! when the daemon dies, even by SIGKILL. `builtin.rs`: the benchmark's no-op
//! tool. `RunError` knows its wire code. Knows nothing of tasks, owners or the
//! store, nor of upstream MCP servers: tools that come and go while the daemon
//! runs are found through a `ToolSource` the `Registry` asks for a name none of
//! its own tools has and for its listing at each `tools/list` (`Lookup`:
//! unknown, found, or refused with the source's `RunError`). `process::Server`
//! starts a long-running program that talks on its stdin and stdout under the
//! same shim and confinement (a stdio upstream). The shim (`taskgate exec-tool
//! --policy JSON`) confines every command tool before `exec` and owns its whole
//! process tree: `confine.rs` works out, once per tool, the Landlock grants
//! (read/execute: `/usr /bin /sbin /lib* /etc`, a few devices, the program,
//! `read_paths`; write: the working directory or the run's 0700 scratch
//! directory, `write_paths`) and refuses (78) a declared path overlapping the
//! state directory or the config file, and a confined tool on a kernel without
//! Landlock unless it says `sandbox = "unconfined"`; `shim.rs` makes itself
//! non-dumpable first (the daemon's `exec` made it dumpable again; the daemon
//! itself is made non-dumpable by `confine::protect_daemon` before `serve`), is
//! a child subreaper running the tool in its own process group with
//! `PR_SET_PDEATHSIG`, `PR_SET_NO_NEW_PRIVS`, per-process rlimits (set with
//! `prlimit`, since the unit's filter blocks `setrlimit`) and the ruleset
//! applied after fork; it counts descendants every 100 ms and, whenever the run
//! ends (exit, SIGTERM and grace, SIGUSR2, the daemon's death), kills and reaps
//! every descendant, `setsid` ones included; the limit that ended a tool comes
//! back on fd 3 as its `[[tool]]` key and becomes `TG_TOOL_LIMIT`.
//! `confine::Confinement` is what is in force (Landlock ABI or unavailable,
//! subreaper kill, no_new_privs, each tool's sandbox and limits, as
//! `Registry::confinement()`): `check` prints its lines, `status` carries it,
//! and `Registry::log_confinement` logs it with the tools' warnings (option
//! injection, at warn) at start and after each reload. Limits come from
//! `[tools]` unless a `[[tool]]` sets its own (resolved in `config`). Rules:
//! nothing here opens the store; the shim is single-threaded and uses no
//! runtime; no tool ever gets a path inside the state directory.

pub mod builtin;
pub mod command;
pub mod confine;
pub mod process;
pub mod shim;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};
use thiserror::Error;
use tokio_util::sync::CancellationToken;

use crate::config::{Effect, TaskMode, ToolConfig};
use crate::exit::{Classify, ExitClass};
use crate::wire::{self, WireCode};

pub use command::CommandTool;

/// `artifact_read`: the built-in that reads a result too large for its
/// task record (served by `tasks`, which knows artifacts and owners).
pub const ARTIFACT_READ: &str = "artifact_read";

/// The names the daemon's own tools take, which no `[[tool]]` may declare:
/// `artifact_read` and the durable route's meta-tools (served by `route`).
pub const RESERVED_TOOL_NAMES: &[&str] = &[
    ARTIFACT_READ,
    "taskgate_describe",
    "taskgate_lease",
    "taskgate_submit",
];

/// What `tools/list` shows of a tool, and how the task layer treats it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// A JSON Schema object for the arguments.
    pub input_schema: Value,
    pub effect: Effect,
    /// Whether a call runs as a background task when the client negotiated
    /// the Tasks extension.
    pub task: TaskMode,
    /// What `tools/list` shows beside the above, as the tool's source gave
    /// it (an upstream server's tool): its title, output schema and
    /// annotations. The behaviour hints of the annotations are always
    /// taken from `effect`, never from here.
    pub shown: Shown,
}

/// The optional parts of a tool's listing.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Shown {
    pub title: Option<String>,
    pub output_schema: Option<Value>,
    /// A JSON object of MCP tool annotations.
    pub annotations: Option<Value>,
}

/// The future of one run: the tool result as JSON, or why there is none.
pub type RunFuture<'a> = Pin<Box<dyn Future<Output = Result<Value, RunError>> + Send + 'a>>;

/// Something a tool call can run.
pub trait Runner: Send + Sync + std::fmt::Debug {
    fn spec(&self) -> &ToolSpec;

    /// Checks the arguments before anything is committed or started. An
    /// error names the offending location, never the value.
    fn validate(&self, args: &Value) -> Result<(), ArgumentError>;

    /// Runs one call with validated arguments. `grace` is how long a
    /// cancelled run may take to stop before it is killed.
    fn run<'a>(
        &'a self,
        args: &'a Map<String, Value>,
        grace: Duration,
        cancel: &'a CancellationToken,
    ) -> RunFuture<'a>;

    /// Whether a run starts a process. Such runs, synchronous ones too,
    /// hold a `tasks.max_running` slot; a built-in that only computes its
    /// answer in the daemon does not need one to run synchronously.
    fn starts_process(&self) -> bool {
        true
    }

    /// Configuration that works but deserves the operator's attention
    /// (shown by `taskgate check`).
    fn warnings(&self) -> Vec<String> {
        Vec::new()
    }

    /// The confinement a run gets, for a runner that starts a tool's
    /// process; `None` for built-ins that run inside the daemon.
    fn confinement(&self) -> Option<confine::ToolState> {
        None
    }

    /// How its calls wait for an administrator, when they do.
    fn approval(&self) -> Option<&ApprovalRule> {
        None
    }
}

/// A tool whose every exact call waits for an administrator's approval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalRule {
    /// SHA-256 (hex) of what the tool runs: its argv, schema, working
    /// directory, environment, effect, task mode, limits and confinement.
    /// An approval binds it, so a changed definition needs a new one.
    pub definition: String,
    /// Argument fields whose values the administrator sees.
    pub preview: Vec<String>,
}

/// A tool definition that cannot be served (exit 78 at startup).
#[derive(Debug, Error)]
pub enum RegistryError {
    #[error("tool {tool:?}: input_schema is not a valid JSON Schema: {detail}; fix the schema")]
    BadSchema { tool: String, detail: String },
    #[error(
        "tool {tool:?}: argv placeholder {{{name}}} names no property of input_schema; declare it under properties or remove it"
    )]
    UnknownPlaceholder { tool: String, name: String },
    #[error(
        "tool {tool:?}: argv element {element:?} has an unclosed '{{'; write '{{{{' for a literal brace"
    )]
    BadTemplate { tool: String, element: String },
    #[error("tool {tool:?} is declared twice; tool names must be unique")]
    Duplicate { tool: String },
    #[error(
        "{origin}: [[tool]] {tool:?}: this name is reserved for a built-in tool; fix or remove that key (see `taskgate init` for every key)"
    )]
    Reserved { tool: String, origin: String },
    #[error(
        "{origin}: [[tool]] {tool:?}: a non-idempotent write cannot run as a background task (a restart would leave its effect unknown); declare effect = \"read_only\" or \"idempotent_write\" if that is true, or set task = \"never\"; fix or remove that key (see `taskgate init` for every key)"
    )]
    BackgroundWrite { tool: String, origin: String },
    #[error(
        "tool {tool:?}: {path:?} overlaps {protected:?}, which no tool may reach (the state directory or the configuration); declare another path"
    )]
    Protected {
        tool: String,
        path: std::path::PathBuf,
        protected: std::path::PathBuf,
    },
    #[error(
        "tool {tool:?}: this kernel has no Landlock, so the tool cannot be confined to its paths; use a kernel with Landlock, or write sandbox = \"unconfined\" for this tool to run it without filesystem confinement"
    )]
    NoLandlock { tool: String },
}

impl Classify for RegistryError {
    fn exit_class(&self) -> ExitClass {
        ExitClass::Config
    }
}

/// Arguments that do not satisfy the tool's schema.
#[derive(Debug, Error, Clone, PartialEq)]
#[error("invalid arguments for {tool}: {location}: {problem}")]
pub struct ArgumentError {
    pub tool: String,
    /// JSON pointer of the offending value, e.g. `arguments/seconds`.
    pub location: String,
    pub problem: String,
}

/// Checks `args` against a tool's compiled input schema, naming the first
/// offending location and never the value (command tools and upstream
/// tools alike).
pub fn check_arguments(
    validator: &jsonschema::Validator,
    tool: &str,
    args: &Value,
) -> Result<(), ArgumentError> {
    match validator.iter_errors(args).next() {
        None => Ok(()),
        Some(e) => {
            let location = e.instance_path().to_string();
            Err(ArgumentError {
                tool: tool.to_string(),
                location: if location.is_empty() {
                    "arguments".into()
                } else {
                    format!("arguments{location}")
                },
                problem: e.masked().to_string(),
            })
        }
    }
}

/// Why a run produced no result.
#[derive(Debug, Error)]
pub enum RunError {
    #[error("cannot start {program}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("timed out after {0:?}; the process group was killed")]
    Timeout(Duration),
    #[error("{stream} exceeded its cap of {limit} bytes; the process group was killed")]
    OutputLimit { stream: &'static str, limit: u64 },
    #[error("cancelled; the process group was stopped")]
    Cancelled,
    #[error("I/O error talking to the process: {0}")]
    Io(std::io::Error),
    #[error("killed by signal {signal}")]
    Killed { signal: i32 },
    /// Ended by a resource limit, named by its `[[tool]]` key.
    #[error("stopped by its resource limit {limit}")]
    Limit { limit: &'static str },
    /// A tool served by another MCP server that failed there, or could not
    /// be reached: the source names the code.
    #[error("{detail}")]
    Remote {
        code: WireCode,
        detail: String,
        /// What the client gets as the error's `data`.
        data: Option<Value>,
    },
}

impl RunError {
    /// The registered code a client sees for this end of a run.
    pub fn wire(&self) -> WireCode {
        match self {
            RunError::Spawn { .. } => wire::TOOL_START_FAILED,
            RunError::Timeout(_) => wire::TOOL_TIMEOUT,
            RunError::OutputLimit { .. } => wire::TOOL_OUTPUT_LIMIT,
            RunError::Cancelled => wire::TASK_INTERRUPTED,
            RunError::Io(_) => wire::TOOL_IO,
            RunError::Killed { .. } => wire::TOOL_KILLED,
            RunError::Limit { .. } => wire::TOOL_LIMIT,
            RunError::Remote { code, .. } => *code,
        }
    }

    /// The message a client reads, naming the tool.
    pub fn message(&self, tool: &str) -> String {
        match self {
            RunError::Timeout(d) => format!("{tool} timed out after {} s", d.as_secs()),
            RunError::Cancelled => format!("{tool} was stopped before it finished"),
            RunError::Killed { signal } => format!("{tool} was killed by signal {signal}"),
            RunError::Limit { limit } => format!(
                "{tool} was stopped by its resource limit {limit} (ask the operator to raise {limit} in the tool's [[tool]] table, or in [tools] for every tool)"
            ),
            other => format!("{tool}: {other}"),
        }
    }
}

/// A tool result as JSON, in the shape of MCP's `CallToolResult`: the text,
/// the structured content when there is one, and whether it is an error
/// result (the tool ran and reported failure).
pub fn result_json(text: String, structured: Option<Value>, is_error: bool) -> Value {
    let mut v = json!({
        "resultType": "complete",
        "content": [{"type": "text", "text": text}],
        "isError": is_error,
    });
    if let Some(s) = structured {
        v["structuredContent"] = s;
    }
    v
}

/// What a [`ToolSource`] says of a tool name.
pub enum Lookup {
    /// Not one of its tools.
    Unknown,
    /// One of its tools, callable now.
    Found(Arc<dyn Runner>),
    /// One of its tools that cannot be called now, and why (a retryable
    /// unavailability, or a withheld tool).
    Refused(RunError),
}

/// Tools that come and go while the daemon runs: asked for a name the
/// registry's own tools do not have, and for its listing at each
/// `tools/list`.
pub trait ToolSource: Send + Sync + std::fmt::Debug {
    fn lookup(&self, name: &str) -> Lookup;
    /// The specs of the tools callable now.
    fn specs(&self) -> Vec<ToolSpec>;
}

/// Every tool this daemon serves through the registry, by name.
#[derive(Debug, Default, Clone)]
pub struct Registry {
    tools: BTreeMap<String, Arc<dyn Runner>>,
    source: Option<Arc<dyn ToolSource>>,
}

impl Registry {
    /// Compiles the configured command tools, then adds `builtins`.
    /// `protected` are the paths no tool may reach (see
    /// [`confine::protected`]).
    pub fn build(
        configs: &[ToolConfig],
        protected: &[std::path::PathBuf],
        builtins: Vec<Arc<dyn Runner>>,
    ) -> Result<Registry, RegistryError> {
        let mut registry = Registry::default();
        for c in configs {
            registry.add(Arc::new(CommandTool::build_protected(
                c.clone(),
                protected,
            )?))?;
        }
        for b in builtins {
            registry.add(b)?;
        }
        Ok(registry)
    }

    fn add(&mut self, runner: Arc<dyn Runner>) -> Result<(), RegistryError> {
        let name = runner.spec().name.clone();
        if self.tools.contains_key(&name) {
            return Err(RegistryError::Duplicate { tool: name });
        }
        self.tools.insert(name, runner);
        Ok(())
    }

    /// The registry with `source` asked for the names it lacks.
    pub fn with_source(mut self, source: Arc<dyn ToolSource>) -> Registry {
        self.source = Some(source);
        self
    }

    pub fn get(&self, name: &str) -> Option<Arc<dyn Runner>> {
        match self.lookup(name) {
            Lookup::Found(tool) => Some(tool),
            _ => None,
        }
    }

    /// The tool `name`: one of the registry's own, or what its source says.
    pub fn lookup(&self, name: &str) -> Lookup {
        if let Some(tool) = self.tools.get(name) {
            return Lookup::Found(tool.clone());
        }
        match &self.source {
            Some(source) => source.lookup(name),
            None => Lookup::Unknown,
        }
    }

    /// Every tool's warnings, for `taskgate check`.
    pub fn warnings(&self) -> Vec<String> {
        self.tools.values().flat_map(|r| r.warnings()).collect()
    }

    /// The registry's own tools (configured and built-in), without its
    /// source's.
    pub fn own_specs(&self) -> impl Iterator<Item = &ToolSpec> {
        self.tools.values().map(|r| r.spec())
    }

    /// Every tool callable now: the registry's own, then its source's.
    pub fn specs(&self) -> Vec<ToolSpec> {
        let mut specs: Vec<ToolSpec> = self.own_specs().cloned().collect();
        if let Some(source) = &self.source {
            specs.extend(source.specs());
        }
        specs
    }

    /// The confinement in force for these tools on this kernel.
    pub fn confinement(&self) -> confine::Confinement {
        confine::Confinement::new(
            self.tools
                .values()
                .filter_map(|r| r.confinement())
                .collect(),
        )
    }

    /// Logs what `taskgate check` prints about the tools: the confinement
    /// in force (info) and each warning, such as an argv placeholder open
    /// to option injection (warn), so that a daemon started without a
    /// `check` still says it. Called at start and after each reload.
    pub fn log_confinement(&self) {
        for line in self.confinement().lines() {
            tracing::info!("{line}");
        }
        for w in self.warnings() {
            tracing::warn!("tool configuration: {w}");
        }
    }
}
