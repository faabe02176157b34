//! One configuration, layered: embedded defaults → TOML file → `TASKGATE_*`
//! environment → command-line flags.
//!
//! Every key is defined once, in [`keys`], as a field of the struct its
//! section fills ([`settings`] says how): [`Config::load_from`] reads every
//! section from the layers, then holds the keys to the rules between them
//! (a flag over the layers, the state directory's precedence, TLS and its
//! files, one bound under another), and the starter file, the docs'
//! reference table and the man page are rendered from the same
//! definitions. A reload loads the whole configuration again the same way;
//! [`Config::changes`] says which keys differ, and their definitions say
//! which of them may apply without a restart. Unknown keys, relative paths
//! and out-of-range bounds refuse the start (exit 78) naming the key and
//! where it came from. The state directory has its own precedence (flag,
//! then systemd's `$STATE_DIRECTORY`, then the layered `[store] directory`,
//! then the XDG default) because systemd owns the directory when it runs
//! the unit.
//!
//! What a value is for is not decided here: which tools may run in the
//! background and which names are the daemon's own are `tools`' rules, and
//! whether a listener may leave loopback is `http`'s.
//!
//! Owns `Config`. Every key is defined once, in `keys.rs` (see *`config/`*
//! below): its doc line, its constant, name, kind (type, default, range, unit),
//! when it applies, its flag or variable if any, and the typed field it fills
//! in its section's struct (`ServerSettings`, `StoreSettings`, `TaskSettings`,
//! `ToolsSettings`, `LogSettings`, `AuthSettings`) or its repeated table's
//! (`ToolLimits` for `[[tool]]`, `JwtLimits` for `[[auth.jwt]]`,
//! `UpstreamLimits` for `[[upstream]]`). The loader, the environment variables,
//! a reload's comparison, `taskgate init`, the packaged conffile, the reference
//! table in operations.md and taskgate.toml(5) are all derived from the
//! definitions. Layering defaults → file → `TASKGATE_*` env → flags, with the
//! origin of every value remembered for messages; `Config::load_from` reads
//! every section, then holds the keys to the rules between them (the `--listen`
//! flag, `store.directory`'s precedence, `server.tls = "on"` and its files,
//! `tasks.max_running_per_owner` under `tasks.max_running`, `[auth]` only with
//! credentials). Knows nothing of what the values are used for: which names and
//! effects a tool may have is `tools`' to decide, whether a listener may leave
//! loopback is `http::exposure`'s.
//!
//! `keys.rs`: The definitions: every key of every section and repeated table,
//! each once, and the vocabulary they are written in (`KeySpec`, `Kind`,
//! `Unit`, `Applies`, `TextRule`, the kind helpers `count`, `bytes`, `secs`,
//! `millis`, `pages`, `choice`, …); `KEYS` (the settings, in documented order),
//! `TOOL_KEYS`, `JWT_KEYS`, `UPSTREAM_KEYS`.
//!
//! `settings.rs`: The `settings!` macro, which turns the definitions into the
//! `KeySpec` constants, the structs (with `Default`, `load` and `shown`) and
//! the lists; `Read`, how a field's type is read and checked from its key
//! (`u64`, `usize`, `Duration` in seconds or milliseconds as the key's unit
//! says, filters, text, paths, origins, addresses, `choice!` enums); `Layers`,
//! the values the file and the environment gave (or one repeated table's), with
//! their origins.
//!
//! `mod.rs`: `Config` and `Config::load_from`: the layering (file,
//! environment), every section read, the rules between keys, the `[[tool]]`
//! tables' shape (serde, so an unknown key or a wrong type is named by its
//! line; their bounded keys read through `ToolLimits`, a limit left out taking
//! its `[tools]` setting through `default_from`), a reload's comparison
//! (`Config::changes`).
//!
//! `auth.rs`: `[[auth.jwt]]` tables (shape, algorithms, tenant, audiences;
//! bounds through `JwtLimits`) and `[auth]` counting only with credentials.
//!
//! `upstream.rs`: `[[upstream]]` tables (an alias without a dot, exactly one of
//! `command` and `url` with only the keys that go with it, `http://` only to
//! loopback, no task for a `non_idempotent_write` tool, per-tool
//! `[upstream.tools.NAME]` tables; bounds through `UpstreamLimits`), where the
//! pins file is (beside the configuration file), and a `[[tool]]` whose name an
//! upstream's alias would shadow.
//!
//! `render.rs`: The starter file, the reference tables of operations.md and
//! taskgate.toml(5), from the definitions.
//!
//! A definition, in `keys.rs`:
//!
//! ```text
//! /// `[store]`: the task store.
//! pub struct StoreSettings in Store {
//!     /// Commands waiting for the store thread; more are refused as busy at once.
//!     #[key(STORE_QUEUE_DEPTH, "queue_depth", count(128, 1..=4096))]
//!     pub queue_depth: usize,
//!     …
//! }
//! ```
//!
//! The doc line is the key's one line of documentation (and the field's
//! rustdoc); the options after the kind (`applies: RELOAD`, `flag:
//! Some("--listen")`, `env: Some("TASKGATE_LOG")`, `default_from:
//! Some(&TOOLS_MAX_PROCESSES)`) are the `KeySpec` fields that differ from the
//! usual (at start, no flag, `TASKGATE_SECTION_KEY`, a default of its own); a
//! key resolved by the rules between keys instead of a field
//! (`store.directory`) is written `by_rules`. Adding a setting is one
//! definition and the code that uses its field; the files rendered from the
//! definitions and checked in are then regenerated (the table in
//! docs/operations.md with `taskgate man --reference`, packaging/taskgate.toml
//! with `taskgate init --state-dir /var/lib/taskgate`), and a bounded key gets
//! its row in `tests/bounds.rs` (the tests that enforce it, or why it is a
//! tunable). `StoreOptions` holds `StoreSettings` and a tool its `ToolLimits`:
//! a module that needs a section takes its struct, never a copy of its fields.

mod auth;
pub mod keys;
mod render;
mod settings;
mod upstream;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use thiserror::Error;

use crate::exit::{Classify, ExitClass};
use keys::{KeySpec, Kind, Section};
use settings::{Layers, Read};

pub use auth::{JwtAlgorithm, JwtIssuer, LocalOwner, STATIC_ISSUER, ScopeClaim, TenantSource};
pub use keys::{
    ApprovalSettings, AuthSettings, JwtLimits, LogSettings, PACKAGE_STATE_DIR, ServerSettings,
    StoreSettings, TaskSettings, ToolLimits, ToolsSettings, UpstreamLimits, starter_config,
};
pub use upstream::{
    MAX_ALIAS_LEN, MAX_UPSTREAMS, PINS_FILE_NAME, RouteEcho, UpstreamConfig, UpstreamToolSettings,
    UpstreamTransport, pins_file, valid_alias,
};

/// Environment variables with the `TASKGATE_` prefix that are not settings.
pub const ENV_CONFIG_PATH: &str = "TASKGATE_CONFIG";
/// The variable of `log.filter` (read by the logger before any
/// configuration is, so that startup itself is logged as asked).
pub const ENV_LOG: &str = match keys::LOG_FILTER.env {
    Some(var) => var,
    None => panic!("log.filter has its own variable"),
};
/// `log.filter`'s default.
pub const DEFAULT_LOG_FILTER: &str = match keys::LOG_FILTER.kind {
    Kind::Filter { default } => default,
    _ => panic!("log.filter is a filter"),
};
/// The operator client's own variables (`taskgate call`, `taskgate task`):
/// the bearer token to send, or a file holding it. Not settings: the
/// configuration layer passes over them.
pub const ENV_CLIENT_TOKEN: &str = "TASKGATE_TOKEN";
pub const ENV_CLIENT_TOKEN_FILE: &str = "TASKGATE_TOKEN_FILE";
const ENV_PREFIX: &str = "TASKGATE_";
const ENV_RESERVED_PREFIX: &str = "TASKGATE_TEST_";

/// The configuration file of the packaged service (its unit's `--config`).
pub const PACKAGE_CONFIG_PATH: &str = "/etc/taskgate/taskgate.toml";

pub const DEFAULT_LISTEN: &str = match keys::SERVER_LISTEN.kind {
    Kind::Address { default } => default,
    _ => panic!("server.listen is an address"),
};

/// Most tools a configuration may declare.
const MAX_TOOLS: usize = 1024;

/// Where a value no layer set comes from.
const EMBEDDED: &str = "the embedded default";

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error(
        "{path}: cannot read the configuration file: {source}; check the path given to --config"
    )]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{origin}: {message}; fix or remove that key (see `taskgate init` for every key)")]
    Invalid { origin: String, message: String },
    #[error(
        "{key} = {value} (from {origin}) is out of range {min}..={max}; choose a value in range"
    )]
    OutOfRange {
        key: String,
        value: u64,
        origin: String,
        min: u64,
        max: u64,
    },
    #[error("{key} = {value:?} (from {origin}) is a relative path; give an absolute path")]
    RelativePath {
        key: String,
        value: PathBuf,
        origin: String,
    },
    #[error("{key} = {value:?} (from {origin}) is not a socket address like 127.0.0.1:8765")]
    BadAddress {
        key: String,
        value: String,
        origin: String,
    },
    #[error(
        "no state directory: neither --state-dir, $STATE_DIRECTORY, [store] directory, $XDG_STATE_HOME nor $HOME is set; pass --state-dir"
    )]
    NoStateDir,
    /// The unit's `StateDirectory=` and the configured directory disagree:
    /// one of them would be ignored without a word.
    #[error(
        "store.directory = {configured:?} (from {origin}) contradicts systemd's StateDirectory= ($STATE_DIRECTORY={systemd:?}), which the service would use instead; set store.directory to {systemd:?} or remove it, or move the service with a StateDirectory= drop-in (systemctl edit taskgate)"
    )]
    StateDirContradiction {
        configured: PathBuf,
        origin: String,
        systemd: PathBuf,
    },
}

impl Classify for ConfigError {
    fn exit_class(&self) -> ExitClass {
        ExitClass::Config
    }
}

/// What the command line contributes.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub config_path: Option<PathBuf>,
    pub state_dir: Option<PathBuf>,
    pub listen: Option<String>,
}

/// Where the state directory choice came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateDirSource {
    Flag,
    SystemdStateDirectory,
    Configured(String),
    /// The XDG default; the only directory taskgate creates itself.
    Default,
}

/// `from …`, as `check` prints it and `serve` logs it, so that the
/// precedence is never a surprise.
impl std::fmt::Display for StateDirSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StateDirSource::Flag => write!(f, "from --state-dir"),
            StateDirSource::SystemdStateDirectory => {
                write!(f, "from systemd's StateDirectory= ($STATE_DIRECTORY)")
            }
            StateDirSource::Configured(origin) => write!(f, "from store.directory in {origin}"),
            StateDirSource::Default => write!(f, "the default, $XDG_STATE_HOME/taskgate"),
        }
    }
}

/// What a tool does to the world, declared by the operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    ReadOnly,
    IdempotentWrite,
    NonIdempotentWrite,
}

/// Whether a tool runs as a background task when the client negotiated Tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskMode {
    Never,
    Optional,
    Required,
}

settings::choice! {
    /// Whether an administrator may approve a call of their own
    /// (`approvals.self_approval`).
    pub enum SelfApproval {
        Forbid = "forbid",
        Allow = "allow",
    }
}

settings::choice! {
    /// How the HTTP listener is protected in transit (`server.tls`).
    pub enum TlsMode {
        /// Plain HTTP: loopback only.
        Off = "off",
        /// TLS terminated by taskgate.
        On = "on",
        /// Plain HTTP forwarded by the operator's TLS-terminating proxy.
        TerminatedUpstream = "terminated-upstream",
    }
}

impl ServerSettings {
    /// The PEM certificate chain and key, when `tls` is `on` (the rules
    /// between keys refuse `on` without both).
    pub fn tls_files(&self) -> Option<(&Path, &Path)> {
        match (self.tls, &self.tls_cert_file, &self.tls_key_file) {
            (TlsMode::On, Some(cert), Some(key)) => Some((cert, key)),
            _ => None,
        }
    }
}

/// A command tool, validated as a table; what may run how is `tools`'
/// to decide when it compiles the tool.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolConfig {
    pub name: String,
    pub description: String,
    pub argv: Vec<String>,
    pub input_schema: serde_json::Value,
    pub working_dir: Option<PathBuf>,
    pub env: Vec<String>,
    pub effect: Effect,
    pub task: TaskMode,
    /// Whether a call waits for an administrator's approval of that exact
    /// call.
    pub approval: Approval,
    /// Argument fields whose values an administrator sees with a held
    /// call (kept in the approval journal only); no other argument value
    /// is kept anywhere.
    pub approval_preview: Vec<String>,
    /// Its bounded keys; a confinement limit it leaves out is `[tools]`'.
    pub limits: ToolLimits,
    pub confinement: ToolConfinement,
    /// Where it was declared (the configuration file), as a refusal of
    /// the tool names it.
    pub origin: String,
}

/// Whether a tool's calls wait for an administrator (`[[tool]] approval`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Approval {
    #[default]
    Never,
    /// Each exact call waits until an administrator approves it, and an
    /// approval lets the identical call run once.
    Required,
}

/// The most argument fields a tool may list in `approval_preview`.
pub const MAX_APPROVAL_PREVIEW_FIELDS: usize = 8;

/// Whether a tool's filesystem is confined (Landlock).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sandbox {
    #[default]
    Landlock,
    /// Written out by the operator; the resource limits still apply.
    Unconfined,
}

/// A command tool's filesystem confinement (its resource limits are in
/// [`ToolLimits`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ToolConfinement {
    pub sandbox: Sandbox,
    /// Read and execute, beside the default set.
    pub read_paths: Vec<PathBuf>,
    /// Read and write, beside its working directory.
    pub write_paths: Vec<PathBuf>,
}

#[derive(Debug, Clone)]
pub struct Config {
    /// The file read (from `--config` or `$TASKGATE_CONFIG`), if any.
    pub file: Option<PathBuf>,
    pub state_dir: PathBuf,
    pub state_dir_source: StateDirSource,
    pub server: ServerSettings,
    pub store: StoreSettings,
    pub tasks: TaskSettings,
    pub log: LogSettings,
    pub tools: Vec<ToolConfig>,
    /// The `[[upstream]]` MCP servers whose tools are offered too.
    pub upstreams: Vec<UpstreamConfig>,
    /// `[auth]`, present only when credentials are configured (a tokens
    /// file or a JWT issuer): see [`Config::auth_enabled`].
    pub auth: Option<AuthSettings>,
    /// `[tools]`: what each tool started from.
    pub tool_defaults: ToolsSettings,
    /// `[approvals]`, with the journal's directory in force.
    pub approvals: ApprovalSettings,
    /// Every setting's effective value as text, by dotted key: what a
    /// reload compares to find the keys that changed.
    values: BTreeMap<String, String>,
}

/// The shape of a `[[tool]]` table, deserialised from the file's text so
/// that an unknown key or a value of the wrong type is named with its
/// line. Its bounded keys ([`keys::TOOL_KEYS`]) are read from the table
/// through their definitions ([`ToolLimits`]); they are listed here only
/// so that the shape accepts them, checks their type and names them among
/// the table's keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTool {
    name: String,
    description: Option<String>,
    argv: Vec<String>,
    input_schema: Option<toml::Table>,
    working_dir: Option<PathBuf>,
    env: Option<Vec<String>>,
    #[allow(dead_code, reason = "read through TOOL_TIMEOUT_SECS")]
    timeout_secs: Option<u64>,
    #[allow(dead_code, reason = "read through TOOL_MAX_STDOUT_BYTES")]
    max_stdout_bytes: Option<u64>,
    #[allow(dead_code, reason = "read through TOOL_MAX_STDERR_BYTES")]
    max_stderr_bytes: Option<u64>,
    effect: Option<Effect>,
    task: Option<TaskMode>,
    approval: Option<Approval>,
    approval_preview: Option<Vec<String>>,
    sandbox: Option<Sandbox>,
    read_paths: Option<Vec<PathBuf>>,
    write_paths: Option<Vec<PathBuf>>,
    #[allow(dead_code, reason = "read through TOOL_MAX_ADDRESS_SPACE_BYTES")]
    max_address_space_bytes: Option<u64>,
    #[allow(dead_code, reason = "read through TOOL_MAX_OPEN_FILES")]
    max_open_files: Option<u64>,
    #[allow(dead_code, reason = "read through TOOL_MAX_PROCESSES")]
    max_processes: Option<u64>,
    #[allow(dead_code, reason = "read through TOOL_MAX_FILE_BYTES")]
    max_file_bytes: Option<u64>,
    #[allow(dead_code, reason = "read through TOOL_MAX_CPU_SECS")]
    max_cpu_secs: Option<u64>,
}

/// Only the `[[tool]]` tables of a file, deserialised from its text so
/// that an error in one points at its line.
#[derive(Debug, Default, Deserialize)]
struct RawTools {
    #[serde(default)]
    tool: Vec<RawTool>,
}

impl Config {
    /// Loads the configuration from the real process environment.
    pub fn load(overrides: &Overrides) -> Result<Config, ConfigError> {
        let env: HashMap<String, String> = std::env::vars().collect();
        Config::load_from(overrides, &env)
    }

    /// Loads the configuration from the given environment snapshot: every
    /// section read from the layers, then the rules between keys.
    pub fn load_from(
        overrides: &Overrides,
        env: &HashMap<String, String>,
    ) -> Result<Config, ConfigError> {
        let Layered {
            layers,
            file,
            tables,
        } = Layered::read(overrides, env)?;
        let mut server = ServerSettings::load(&layers)?;
        let store = StoreSettings::load(&layers)?;
        let mut tasks = TaskSettings::load(&layers)?;
        let log = LogSettings::load(&layers)?;
        let tool_defaults = ToolsSettings::load(&layers)?;
        let auth = AuthSettings::load(&layers)?;
        let mut approvals = ApprovalSettings::load(&layers)?;

        // ---- rules between keys ----

        // `--listen` overrides every layer, whose value was still checked.
        (server.listen, server.listen_sources) = listen(&layers, overrides)?;
        if server.tls == TlsMode::On && server.tls_files().is_none() {
            return Err(ConfigError::Invalid {
                origin: layers.origin_of(&keys::SERVER_TLS),
                message: format!(
                    "{} = \"on\" needs both {} and {}",
                    keys::SERVER_TLS.dotted(),
                    keys::SERVER_TLS_CERT_FILE.dotted(),
                    keys::SERVER_TLS_KEY_FILE.dotted()
                ),
            });
        }
        // `store.directory` has no field: the state directory in force
        // comes from its precedence.
        let configured_dir = <Option<PathBuf>>::read(&layers, &keys::STORE_DIRECTORY)?
            .map(|dir| (dir, layers.origin_of(&keys::STORE_DIRECTORY)));
        let (state_dir, state_dir_source) = resolve_state_dir(overrides, env, configured_dir)?;

        // What a reload compares: each key as the operator set it, or, for
        // a key a flag or a precedence decides, the value in force.
        let mut values: BTreeMap<String, String> = [
            server.shown(),
            store.shown(),
            tasks.shown(),
            tool_defaults.shown(),
            log.shown(),
            auth.shown(),
            approvals.shown(),
        ]
        .into_iter()
        .flatten()
        .map(|(key, value)| (key.dotted(), value))
        .collect();
        values.insert(
            keys::STORE_DIRECTORY.dotted(),
            state_dir.display().to_string(),
        );

        approvals.directory = approvals_dir(&layers, &state_dir)?;
        values.insert(
            keys::APPROVALS_DIRECTORY.dotted(),
            approvals.directory.display().to_string(),
        );

        // An owner never runs more than everyone together may.
        tasks.max_running_per_owner = tasks.max_running_per_owner.min(tasks.max_running);
        approvals.max_pending_per_owner =
            approvals.max_pending_per_owner.min(approvals.max_pending);
        approvals.max_proposals_per_owner = approvals
            .max_proposals_per_owner
            .min(approvals.max_proposals);

        let tools = tool_settings(tables.tools, &tables.origin, &layers, &tool_defaults)?;
        let upstreams =
            upstream::settings(tables.upstreams, &tables.origin, &layers, &tool_defaults)?;
        if let Some((tool, upstream)) = tools
            .iter()
            .find_map(|t| upstream::shadowed(&t.name, &upstreams).map(|u| (t, u)))
        {
            return Err(ConfigError::Invalid {
                origin: format!("{}: [[tool]] {:?}", tool.origin, tool.name),
                message: format!(
                    "the name begins with the alias of [[upstream]] {:?}, whose tools are offered as {}.TOOL; rename the tool or the upstream",
                    upstream.alias, upstream.alias
                ),
            });
        }
        if let Some(name) = &approvals.notify_tool {
            let refuse = |why: &str| ConfigError::Invalid {
                origin: layers.origin_of(&keys::APPROVALS_NOTIFY_TOOL),
                message: format!("{} = {name:?} {why}", keys::APPROVALS_NOTIFY_TOOL.dotted()),
            };
            match tools.iter().find(|t| &t.name == name) {
                None => return Err(refuse("names no [[tool]] of this file")),
                Some(t) if t.approval == Approval::Required => {
                    return Err(refuse(
                        "names a tool that itself needs approval; a notification must run at once",
                    ));
                }
                Some(_) => {}
            }
        }
        // `[auth]` counts only with credentials, its issuers from their tables.
        let auth = auth::settings(auth, tables.jwt, &tables.origin)?;

        Ok(Config {
            file,
            values,
            state_dir,
            state_dir_source,
            server,
            store,
            tasks,
            log,
            tools,
            upstreams,
            auth,
            tool_defaults,
            approvals,
        })
    }

    /// Whether callers must authenticate: true when `[auth]` configures
    /// credentials (a tokens file or a JWT issuer). Without, every caller
    /// is the one local owner, as before authentication existed.
    pub fn auth_enabled(&self) -> bool {
        self.auth.is_some()
    }
}

/// The repeated tables of a file, each as its shape and its raw values
/// (the same table parsed twice), and where they came from.
struct Tables {
    tools: Vec<(RawTool, toml::Table)>,
    jwt: Vec<(auth::RawJwt, toml::Table)>,
    upstreams: Vec<(upstream::RawUpstream, toml::Table)>,
    origin: String,
}

/// The file and environment layers of a load, before any value is used.
struct Layered {
    layers: Layers,
    file: Option<PathBuf>,
    tables: Tables,
}

impl Layered {
    fn read(overrides: &Overrides, env: &HashMap<String, String>) -> Result<Layered, ConfigError> {
        let mut layers = Layers::default();
        let file = overrides
            .config_path
            .clone()
            .or_else(|| env.get(ENV_CONFIG_PATH).map(PathBuf::from));
        let mut tables = Tables {
            tools: Vec::new(),
            jwt: Vec::new(),
            upstreams: Vec::new(),
            origin: EMBEDDED.to_string(),
        };
        if let Some(path) = &file {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.clone(),
                source,
            })?;
            let origin = path.display().to_string();
            tables = file_layer(&mut layers, &origin, &text)?;
        }
        env_layer(&mut layers, env)?;
        Ok(Layered {
            layers,
            file,
            tables,
        })
    }
}

/// `server.listen` in force (the `--listen` flag's, else the layered one,
/// else the default), and every address given for it with its origin: the
/// layered value is checked even when the flag overrides it (a wrong file
/// is wrong, whatever this one process was started with), and whether any
/// of them may leave loopback is the exposure rule's to decide.
fn listen(
    layers: &Layers,
    overrides: &Overrides,
) -> Result<(SocketAddr, Vec<(SocketAddr, String)>), ConfigError> {
    let key = &keys::SERVER_LISTEN;
    let layered = SocketAddr::read(layers, key)?;
    let mut sources = Vec::new();
    if layers.get(key).is_some() {
        sources.push((layered, layers.origin_of(key)));
    }
    let effective = match &overrides.listen {
        Some(flag) => (
            settings::address(key, flag, "flag --listen".to_string())?,
            "flag --listen".to_string(),
        ),
        None => (layered, layers.origin_of(key)),
    };
    sources.push(effective.clone());
    Ok((effective.0, sources))
}

/// The address a daemon started with this configuration listens on: for
/// the operator client, which needs no state directory. The file and the
/// environment are checked key by key as for `serve`.
pub fn configured_listen(overrides: &Overrides) -> Result<SocketAddr, ConfigError> {
    let env: HashMap<String, String> = std::env::vars().collect();
    let layered = Layered::read(overrides, &env)?;
    listen(&layered.layers, overrides).map(|(addr, _)| addr)
}

/// The `[auth]` settings of a configuration, for the operator's `taskgate
/// token` commands, which need no state directory. The file and the
/// environment are checked key by key as for `serve`.
pub fn configured_auth(overrides: &Overrides) -> Result<Option<AuthSettings>, ConfigError> {
    let env: HashMap<String, String> = std::env::vars().collect();
    let Layered { layers, tables, .. } = Layered::read(overrides, &env)?;
    auth::settings(AuthSettings::load(&layers)?, tables.jwt, &tables.origin)
}
/// One setting that differs between two configurations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub key: &'static KeySpec,
    pub old: String,
    pub new: String,
}

impl Config {
    /// Whether some tool's calls wait for an administrator: a `[[tool]]`,
    /// or an upstream's tool its `[upstream.tools.NAME]` table holds.
    pub fn needs_approvals(&self) -> bool {
        self.tools.iter().any(|t| t.approval == Approval::Required)
            || self
                .upstreams
                .iter()
                .any(|u| u.tools.values().any(|t| t.approval == Approval::Required))
    }

    /// The settings whose effective value differs in `new`, in table order.
    pub fn changes(&self, new: &Config) -> Vec<Change> {
        keys::KEYS
            .iter()
            .filter_map(|key| {
                let dotted = key.dotted();
                let (old, new) = (self.values.get(&dotted)?, new.values.get(&dotted)?);
                (old != new).then(|| Change {
                    key,
                    old: old.clone(),
                    new: new.clone(),
                })
            })
            .collect()
    }
}

/// Records the file's settings in `layers` and returns its repeated
/// tables. Every key is checked against its definition, and an error names
/// its line.
fn file_layer(layers: &mut Layers, origin: &str, text: &str) -> Result<Tables, ConfigError> {
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| invalid_toml(origin, text, &e))?;
    let sections = || {
        Section::SETTINGS
            .iter()
            .map(|s| format!("[{}]", s.name()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut tool_tables = None;
    let mut jwt_tables = Vec::new();
    let mut upstream_tables = Vec::new();
    for (top, value) in table {
        if top == "tool" {
            tool_tables = Some(tables_of(&value));
            continue;
        }
        if top == "upstream" {
            upstream_tables = tables_of(&value);
            continue;
        }
        let at = line_origin(origin, text, &[&top]);
        let Some(section) = Section::SETTINGS.iter().find(|s| s.name() == top) else {
            return Err(ConfigError::Invalid {
                origin: at,
                message: format!(
                    "unknown section `{top}`; the sections are {}, [[tool]], [[upstream]] and [[auth.jwt]]",
                    sections()
                ),
            });
        };
        let toml::Value::Table(inner) = value else {
            return Err(ConfigError::Invalid {
                origin: at,
                message: format!("`{top}` must be a table, [{top}]"),
            });
        };
        for (name, value) in inner {
            // `[[auth.jwt]]` tables are read apart, like `[[tool]]`.
            if *section == Section::Auth && name == "jwt" {
                jwt_tables = tables_of(&value);
                continue;
            }
            let at = line_origin(origin, text, &[&top, &name]);
            let Some(key) = keys::find(section.name(), &name) else {
                let known: Vec<&str> = keys::KEYS
                    .iter()
                    .filter(|k| k.section == *section)
                    .map(|k| k.name)
                    .collect();
                return Err(ConfigError::Invalid {
                    origin: at,
                    message: format!(
                        "unknown key `{name}` in [{top}]; its keys are {}",
                        known.join(", ")
                    ),
                });
            };
            layers.set(key, value, at);
        }
    }
    // Their shapes, from the text so that an error names its line; each
    // is zipped with its own table (one entry per table of the array).
    let (tools, tool_tables) = match tool_tables {
        None => (Vec::new(), Vec::new()),
        Some(tables) => (
            toml::from_str::<RawTools>(text)
                .map_err(|e| invalid_toml(origin, text, &e))?
                .tool,
            tables,
        ),
    };
    let jwt = auth::raw_issuers(origin, text)?;
    let upstreams = upstream::raw_upstreams(origin, text)?;
    Ok(Tables {
        tools: tools.into_iter().zip(tool_tables).collect(),
        jwt: jwt.into_iter().zip(jwt_tables).collect(),
        upstreams: upstreams.into_iter().zip(upstream_tables).collect(),
        origin: origin.to_string(),
    })
}

/// The tables of an array of tables (anything else has none: the shape's
/// deserialisation refuses it, naming its line).
fn tables_of(value: &toml::Value) -> Vec<toml::Table> {
    match value {
        toml::Value::Array(items) => items.iter().filter_map(|v| v.as_table().cloned()).collect(),
        _ => Vec::new(),
    }
}

/// Records `TASKGATE_<SECTION>_<KEY>` settings in `layers`.
fn env_layer(layers: &mut Layers, env: &HashMap<String, String>) -> Result<(), ConfigError> {
    let mut names: Vec<&String> = env.keys().collect();
    names.sort();
    for name in names {
        if !name.starts_with(ENV_PREFIX)
            || name == ENV_CONFIG_PATH
            || name == ENV_CLIENT_TOKEN
            || name == ENV_CLIENT_TOKEN_FILE
            || name.starts_with(ENV_RESERVED_PREFIX)
        {
            continue;
        }
        let Some(key) = keys::by_env_var(name) else {
            return Err(ConfigError::Invalid {
                origin: format!("environment variable {name}"),
                message: "not a setting; settings are named TASKGATE_<SECTION>_<KEY>, for example TASKGATE_STORE_QUEUE_DEPTH".into(),
            });
        };
        // Text: paths need no quoting, and integers are parsed per key; a
        // list of paths is joined with `:`, as in $PATH.
        let value = match key.kind {
            Kind::Paths => toml::Value::Array(
                env[name]
                    .split(':')
                    .filter(|p| !p.is_empty())
                    .map(|p| toml::Value::String(p.to_string()))
                    .collect(),
            ),
            Kind::Origins => toml::Value::Array(
                env[name]
                    .split(',')
                    .map(str::trim)
                    .filter(|o| !o.is_empty())
                    .map(|o| toml::Value::String(o.to_string()))
                    .collect(),
            ),
            _ => toml::Value::String(env[name].clone()),
        };
        layers.set(key, value, format!("environment variable {name}"));
    }
    Ok(())
}

/// `origin: line N `the line``, naming the key at `path` in the file's
/// text; only `origin` when the key cannot be located.
fn line_origin(origin: &str, text: &str, path: &[&str]) -> String {
    match key_line(text, path) {
        Some(line) => {
            let quoted = text.lines().nth(line - 1).unwrap_or("").trim();
            format!("{origin}: line {line} `{quoted}`")
        }
        None => origin.to_string(),
    }
}

fn key_line(text: &str, path: &[&str]) -> Option<usize> {
    use toml::de::{DeTable, DeValue};
    let doc = DeTable::parse(text).ok()?;
    let mut table = doc.get_ref();
    let mut start = None;
    for (i, segment) in path.iter().enumerate() {
        let (key, value) = table
            .iter()
            .find(|(k, _)| k.get_ref().as_ref() == *segment)?;
        start = Some(key.span().start);
        if i + 1 < path.len() {
            match value.get_ref() {
                DeValue::Table(inner) => table = inner,
                _ => return None,
            }
        }
    }
    let start = start?.min(text.len());
    Some(text[..start].matches('\n').count() + 1)
}

fn resolve_state_dir(
    overrides: &Overrides,
    env: &HashMap<String, String>,
    configured: Option<(PathBuf, String)>,
) -> Result<(PathBuf, StateDirSource), ConfigError> {
    if let Some(dir) = &overrides.state_dir {
        require_absolute("--state-dir".into(), dir, "the command line".into())?;
        return Ok((dir.clone(), StateDirSource::Flag));
    }
    if let Some(list) = env.get("STATE_DIRECTORY").filter(|s| !s.is_empty()) {
        // systemd joins several StateDirectory= entries with ':'; ours is the first.
        let first = PathBuf::from(list.split(':').next().unwrap_or(list));
        require_absolute("$STATE_DIRECTORY".into(), &first, "the environment".into())?;
        // Under the unit the directory is systemd's: a configured one that
        // differs would be ignored in silence, while `check` run by hand
        // (without $STATE_DIRECTORY) would look at it. Refused instead.
        if let Some((dir, origin)) = configured
            && !same_directory(&dir, &first)
        {
            return Err(ConfigError::StateDirContradiction {
                configured: dir,
                origin,
                systemd: first,
            });
        }
        return Ok((first, StateDirSource::SystemdStateDirectory));
    }
    if let Some((dir, origin)) = configured {
        return Ok((dir, StateDirSource::Configured(origin)));
    }
    let base = match env.get("XDG_STATE_HOME").map(PathBuf::from) {
        // The XDG spec says to ignore a relative XDG_STATE_HOME.
        Some(p) if p.is_absolute() => p,
        _ => match env.get("HOME").map(PathBuf::from) {
            Some(home) if home.is_absolute() => home.join(".local").join("state"),
            _ => return Err(ConfigError::NoStateDir),
        },
    };
    Ok((base.join("taskgate"), StateDirSource::Default))
}

/// The same directory: equal paths (`/var/lib/taskgate/` is
/// `/var/lib/taskgate`), or two names that resolve to one directory.
fn same_directory(a: &Path, b: &Path) -> bool {
    if a == b {
        return true;
    }
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

fn valid_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// Refuses more repeated tables of one kind than a configuration may hold.
fn at_most(n: usize, max: usize, what: &str, origin: &str) -> Result<(), ConfigError> {
    if n > max {
        return Err(ConfigError::Invalid {
            origin: origin.to_string(),
            message: format!("{n} {what} declared; at most {max} are allowed"),
        });
    }
    Ok(())
}

/// The keys of a program taskgate starts, shared by a `[[tool]]` and a
/// command `[[upstream]]`.
struct Program<'a> {
    /// What the table calls its argv (`argv`, `command`).
    argv_key: &'static str,
    argv: &'a [String],
    working_dir: &'a Option<PathBuf>,
    env: &'a Option<Vec<String>>,
    read_paths: &'a Option<Vec<PathBuf>>,
    write_paths: &'a Option<Vec<PathBuf>>,
}

impl Program<'_> {
    /// Well-formed: an absolute program (no shell, no `PATH` lookup),
    /// absolute paths, variable names in `env`.
    fn check(&self) -> Result<(), String> {
        let key = self.argv_key;
        match self.argv.first() {
            Some(program) if Path::new(program).is_absolute() => {}
            Some(_) => {
                return Err(format!(
                    "{key}[0] must be an absolute path to the program (no shell, no PATH lookup)"
                ));
            }
            None => return Err(format!("{key} must name the program to run")),
        }
        if let Some(dir) = self.working_dir
            && !dir.is_absolute()
        {
            return Err(format!(
                "working_dir {dir:?} is a relative path; give an absolute path"
            ));
        }
        if let Some(name) = self.env.iter().flatten().find(|n| !valid_env_name(n)) {
            return Err(format!("env entry {name:?} is not a variable name"));
        }
        let mut declared = self.read_paths.iter().chain(self.write_paths).flatten();
        if let Some(p) = declared.find(|p| !p.is_absolute()) {
            return Err(format!(
                "read_paths/write_paths entry {p:?} is a relative path; give an absolute path"
            ));
        }
        Ok(())
    }
}

fn valid_env_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// The `[[tool]]` tables, each well-formed; its bounded keys are read
/// through their definitions, a confinement limit it leaves out taking
/// the `[tools]` value (`defaults`, read from `layers`).
fn tool_settings(
    raw: Vec<(RawTool, toml::Table)>,
    origin: &str,
    layers: &Layers,
    defaults: &ToolsSettings,
) -> Result<Vec<ToolConfig>, ConfigError> {
    at_most(raw.len(), MAX_TOOLS, "[[tool]] tables", origin)?;
    let mut seen = std::collections::HashSet::new();
    let mut tools = Vec::with_capacity(raw.len());
    for (t, table) in raw {
        let bad = |message: String| ConfigError::Invalid {
            origin: format!("{origin}: [[tool]] {:?}", t.name),
            message,
        };
        if !valid_tool_name(&t.name) {
            return Err(bad(
                "name must be 1-64 characters of A-Z a-z 0-9 _ - .".into()
            ));
        }
        if !seen.insert(t.name.clone()) {
            return Err(bad("declared twice; tool names must be unique".into()));
        }
        let program = Program {
            argv_key: "argv",
            argv: &t.argv,
            working_dir: &t.working_dir,
            env: &t.env,
            read_paths: &t.read_paths,
            write_paths: &t.write_paths,
        };
        program.check().map_err(bad)?;
        let env = t.env.clone().unwrap_or_default();
        let input_schema = match t.input_schema.clone() {
            Some(table) => {
                serde_json::to_value(table).map_err(|e| bad(format!("input_schema: {e}")))?
            }
            None => serde_json::json!({"type": "object"}),
        };
        if input_schema.get("type").and_then(|v| v.as_str()) != Some("object") {
            return Err(bad(
                "input_schema must describe an object (type = \"object\")".into(),
            ));
        }
        let approval = t.approval.unwrap_or_default();
        let approval_preview = t.approval_preview.clone().unwrap_or_default();
        if !approval_preview.is_empty() && approval != Approval::Required {
            return Err(bad(
                "approval_preview is shown with a held call; it needs approval = \"required\""
                    .into(),
            ));
        }
        if approval_preview.len() > MAX_APPROVAL_PREVIEW_FIELDS {
            return Err(bad(format!(
                "approval_preview lists {} fields; at most {MAX_APPROVAL_PREVIEW_FIELDS}",
                approval_preview.len()
            )));
        }
        let properties = input_schema.get("properties").and_then(|p| p.as_object());
        for field in &approval_preview {
            if !properties.is_some_and(|p| p.contains_key(field)) {
                return Err(bad(format!(
                    "approval_preview names {field:?}, which is not a property of input_schema"
                )));
            }
        }
        let limits = ToolLimits::load(&Layers::table(
            keys::TOOL_KEYS,
            &table,
            layers,
            origin,
            format!("tool.{}.", t.name),
        ))?;
        let confinement = ToolConfinement {
            sandbox: t.sandbox.unwrap_or_default(),
            read_paths: t.read_paths.unwrap_or_else(|| defaults.read_paths.clone()),
            write_paths: t.write_paths.unwrap_or_default(),
        };
        tools.push(ToolConfig {
            description: t.description.unwrap_or_default(),
            name: t.name,
            argv: t.argv,
            input_schema,
            working_dir: t.working_dir,
            env,
            effect: t.effect.unwrap_or(Effect::NonIdempotentWrite),
            task: t.task.unwrap_or(TaskMode::Never),
            approval,
            approval_preview,
            limits,
            confinement,
            origin: origin.to_string(),
        });
    }
    Ok(tools)
}

/// The approval journal's directory: `approvals.directory`, or the state
/// directory's sibling named after it with `-approvals`. Never inside the
/// state directory, nor holding it: the two are separate durable parts.
fn approvals_dir(layers: &Layers, state_dir: &Path) -> Result<PathBuf, ConfigError> {
    let configured = <Option<PathBuf>>::read(layers, &keys::APPROVALS_DIRECTORY)?;
    let dir = match &configured {
        Some(dir) => dir.clone(),
        None => {
            let name = state_dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "taskgate".into());
            state_dir
                .parent()
                .unwrap_or(Path::new("/"))
                .join(format!("{name}-approvals"))
        }
    };
    if dir.starts_with(state_dir) || state_dir.starts_with(&dir) {
        return Err(ConfigError::Invalid {
            origin: layers.origin_of(&keys::APPROVALS_DIRECTORY),
            message: format!(
                "{} {} overlaps the state directory {}; the approval journal and the task store are separate durable parts, so give it a directory of its own beside it",
                keys::APPROVALS_DIRECTORY.dotted(),
                dir.display(),
                state_dir.display()
            ),
        });
    }
    Ok(dir)
}

/// A web origin (RFC 6454) in one spelling: `http://` or `https://`, the
/// host in lower case (an IPv6 address in brackets), and the port always
/// written out (80 or 443 when the text leaves it out). `None` for anything
/// else: another scheme, a path, user information, an empty host, a bad
/// port. `server.allowed_origins` and every `Origin` header pass through
/// this, so they compare as plain strings.
pub fn normalize_origin(text: &str) -> Option<String> {
    let (scheme, rest) = text.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    if rest.is_empty() || rest.contains(['/', '?', '#', '@', ' ']) {
        return None;
    }
    let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
        let (addr, after) = v6.split_once(']')?;
        addr.parse::<std::net::Ipv6Addr>().ok()?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?),
        };
        (format!("[{}]", addr.to_ascii_lowercase()), port)
    } else {
        match rest.split_once(':') {
            Some((h, p)) => (h.to_ascii_lowercase(), Some(p)),
            None => (rest.to_ascii_lowercase(), None),
        }
    };
    let host_ok = !host.is_empty()
        && (host.starts_with('[')
            || host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.'));
    if !host_ok {
        return None;
    }
    let port = match port {
        None => default_port,
        Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
            p.parse::<u16>().ok()?
        }
        Some(_) => return None,
    };
    Some(format!("{scheme}://{host}:{port}"))
}

fn require_absolute(key: String, path: &Path, origin: String) -> Result<(), ConfigError> {
    if path.is_absolute() {
        Ok(())
    } else {
        Err(ConfigError::RelativePath {
            key,
            value: path.to_path_buf(),
            origin,
        })
    }
}

fn invalid_toml(origin: &str, text: &str, e: &toml::de::Error) -> ConfigError {
    let origin = match e.span() {
        Some(span) => {
            let start = span.start.min(text.len());
            let line = text[..start].matches('\n').count() + 1;
            // Quote the line so the key is named even in a type error.
            let quoted = text.lines().nth(line - 1).unwrap_or("").trim();
            format!("{origin}: line {line} `{quoted}`")
        }
        None => origin.to_string(),
    };
    ConfigError::Invalid {
        origin,
        message: e.message().trim().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_use_xdg_state_home() {
        let c = Config::load_from(
            &Overrides::default(),
            &env(&[("XDG_STATE_HOME", "/x/state")]),
        )
        .unwrap();
        assert_eq!(c.state_dir, PathBuf::from("/x/state/taskgate"));
        assert_eq!(c.state_dir_source, StateDirSource::Default);
        assert_eq!(c.store.queue_depth, 128);
        assert_eq!(c.store.max_db_pages, 1_048_576);
        assert_eq!(c.server.listen.to_string(), DEFAULT_LISTEN);
    }

    #[test]
    fn the_clients_own_variables_are_not_settings_and_nothing_else_is_waved_through() {
        for var in [ENV_CLIENT_TOKEN, ENV_CLIENT_TOKEN_FILE] {
            assert!(keys::by_env_var(var).is_none(), "{var} names a setting");
            let loaded = Config::load_from(
                &Overrides::default(),
                &env(&[("HOME", "/home/u"), (var, "tgk_whatever")]),
            );
            assert!(loaded.is_ok(), "{var}: {loaded:?}");
        }
        let refused = Config::load_from(
            &Overrides::default(),
            &env(&[("HOME", "/home/u"), ("TASKGATE_TOKENS", "x")]),
        );
        assert!(refused.is_err(), "a near miss was taken: {refused:?}");
    }

    #[test]
    fn relative_xdg_is_ignored_for_home() {
        let c = Config::load_from(
            &Overrides::default(),
            &env(&[("XDG_STATE_HOME", "rel"), ("HOME", "/home/u")]),
        )
        .unwrap();
        assert_eq!(c.state_dir, PathBuf::from("/home/u/.local/state/taskgate"));
    }

    #[test]
    fn layering_env_over_file_and_flags_over_env() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            "[store]\nqueue_depth = 10\nmax_live_tasks = 5\n[server]\nlisten = \"127.0.0.1:1\"\n",
        )
        .unwrap();
        let over = Overrides {
            config_path: Some(file),
            listen: Some("127.0.0.1:3".into()),
            ..Default::default()
        };
        let c = Config::load_from(
            &over,
            &env(&[
                ("HOME", "/h"),
                ("TASKGATE_STORE_QUEUE_DEPTH", "20"),
                ("TASKGATE_SERVER_LISTEN", "127.0.0.1:2"),
            ]),
        )
        .unwrap();
        assert_eq!(c.store.queue_depth, 20);
        assert_eq!(c.store.max_live_tasks, 5);
        assert_eq!(c.server.listen.port(), 3);
    }

    #[test]
    fn unknown_keys_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "[store]\nqueue_dept = 10\n").unwrap();
        let over = Overrides {
            config_path: Some(file),
            ..Default::default()
        };
        let e = Config::load_from(&over, &env(&[("HOME", "/h")])).unwrap_err();
        let s = e.to_string();
        assert!(s.contains("queue_dept") && s.contains("line 2"), "{s}");

        let e = Config::load_from(
            &Overrides::default(),
            &env(&[("HOME", "/h"), ("TASKGATE_STORE_QUEUEDEPTH", "3")]),
        )
        .unwrap_err();
        assert!(e.to_string().contains("TASKGATE_STORE_QUEUEDEPTH"), "{e}");
    }

    #[test]
    fn bounds_and_paths_are_checked_with_origin() {
        let e = Config::load_from(
            &Overrides::default(),
            &env(&[("HOME", "/h"), ("TASKGATE_STORE_QUEUE_DEPTH", "0")]),
        )
        .unwrap_err();
        let s = e.to_string();
        assert!(
            s.contains("store.queue_depth") && s.contains("TASKGATE_STORE_QUEUE_DEPTH"),
            "{s}"
        );

        let e = Config::load_from(
            &Overrides::default(),
            &env(&[("HOME", "/h"), ("TASKGATE_STORE_DIRECTORY", "rel/dir")]),
        )
        .unwrap_err();
        assert!(matches!(e, ConfigError::RelativePath { .. }), "{e}");
    }

    #[test]
    fn state_directory_precedence() {
        let over = Overrides::default();
        let c = Config::load_from(
            &over,
            &env(&[
                ("STATE_DIRECTORY", "/var/lib/taskgate"),
                ("TASKGATE_STORE_DIRECTORY", "/var/lib/taskgate/"),
            ]),
        )
        .unwrap();
        assert_eq!(c.state_dir, PathBuf::from("/var/lib/taskgate"));
        assert_eq!(c.state_dir_source, StateDirSource::SystemdStateDirectory);
        // systemd's directory and another configured one: refused, naming both.
        let e = Config::load_from(
            &over,
            &env(&[
                ("STATE_DIRECTORY", "/var/lib/taskgate"),
                ("TASKGATE_STORE_DIRECTORY", "/srv/tg"),
            ]),
        )
        .unwrap_err();
        let s = e.to_string();
        assert!(
            s.contains("/srv/tg")
                && s.contains("TASKGATE_STORE_DIRECTORY")
                && s.contains("StateDirectory=")
                && s.contains("/var/lib/taskgate"),
            "{s}"
        );
        let over = Overrides {
            state_dir: Some("/flag".into()),
            ..Default::default()
        };
        let c =
            Config::load_from(&over, &env(&[("STATE_DIRECTORY", "/var/lib/taskgate")])).unwrap();
        assert_eq!(c.state_dir_source, StateDirSource::Flag);
    }

    /// What a reload compares: effective values, key by key, so a flag
    /// that overrides the file hides the file's change of that key.
    #[test]
    fn changes_name_the_keys_whose_effective_value_differs() {
        let base = env(&[("HOME", "/h")]);
        let old = Config::load_from(&Overrides::default(), &base).unwrap();
        let mut changed = base.clone();
        changed.insert("TASKGATE_SERVER_MAX_CONNECTIONS".into(), "100".into());
        changed.insert("TASKGATE_TASKS_POLL_INTERVAL_MS".into(), "300".into());
        changed.insert("TASKGATE_SERVER_LISTEN".into(), "127.0.0.1:9".into());
        let new = Config::load_from(&Overrides::default(), &changed).unwrap();
        let got: Vec<(String, bool, String, String)> = old
            .changes(&new)
            .into_iter()
            .map(|c| (c.key.dotted(), c.key.is_startup_only(), c.old, c.new))
            .collect();
        assert_eq!(
            got,
            [
                (
                    "server.listen".into(),
                    true,
                    DEFAULT_LISTEN.into(),
                    "127.0.0.1:9".into()
                ),
                (
                    "server.max_connections".into(),
                    true,
                    "256".into(),
                    "100".into()
                ),
                (
                    "tasks.poll_interval_ms".into(),
                    false,
                    "1000".into(),
                    "300".into()
                ),
            ]
        );
        let flag = Overrides {
            listen: Some("127.0.0.1:0".into()),
            ..Default::default()
        };
        let (a, b) = (
            Config::load_from(&flag, &base).unwrap(),
            Config::load_from(&flag, &changed).unwrap(),
        );
        assert!(a.changes(&b).iter().all(|c| c.key.name != "listen"));
        assert!(old.changes(&old).is_empty());
    }

    #[test]
    fn starter_config_parses_to_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, starter_config(None)).unwrap();
        let over = Overrides {
            config_path: Some(file.clone()),
            ..Default::default()
        };
        let c = Config::load_from(&over, &env(&[("HOME", "/h")])).unwrap();
        assert_eq!(c.store.queue_depth, 128);
        assert_eq!(c.tasks.max_running, 8);
        assert_eq!(c.state_dir, PathBuf::from("/h/.local/state/taskgate"));
        std::fs::write(&file, starter_config(Some(PACKAGE_STATE_DIR))).unwrap();
        let c = Config::load_from(&over, &env(&[("HOME", "/h")])).unwrap();
        assert_eq!(c.state_dir, PathBuf::from(PACKAGE_STATE_DIR));
    }

    #[test]
    fn a_flag_does_not_hide_a_wrong_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "[server]\nlisten = 5\n").unwrap();
        let over = Overrides {
            config_path: Some(file),
            listen: Some("127.0.0.1:0".into()),
            ..Default::default()
        };
        let e = Config::load_from(&over, &env(&[("HOME", "/h")])).unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
    }

    /// The loader reads every key of the table: a bad value for any of
    /// them refuses the load, naming that key.
    #[test]
    fn every_key_in_the_table_is_read() {
        for key in keys::KEYS {
            let bad = match key.kind {
                Kind::Address { .. } => "not an address".to_string(),
                Kind::Path | Kind::Paths | Kind::File { .. } => "relative/path".to_string(),
                Kind::Origins => "ftp://files.example".to_string(),
                Kind::Int(spec) => (spec.max + 1).to_string(),
                Kind::Filter { .. } => "info,taskgate=loud".to_string(),
                Kind::Choice { .. } => "sometimes".to_string(),
                Kind::Text { .. } => "\"quoted\" #fragment".to_string(),
            };
            let var = key.env_var().unwrap();
            let e = Config::load_from(
                &Overrides::default(),
                &env(&[("HOME", "/h"), (var.as_str(), bad.as_str())]),
            )
            .unwrap_err();
            let s = e.to_string();
            assert!(s.contains(&key.dotted()) && s.contains(&var), "{s}");
        }
    }

    /// Invariant 6 at its source: every ranged key refuses a value just
    /// below its minimum as well as just above its maximum.
    #[test]
    fn every_ranged_key_refuses_both_sides_of_its_range() {
        for key in keys::KEYS {
            let Kind::Int(spec) = key.kind else { continue };
            let var = key.env_var().unwrap();
            let mut outside = vec![(spec.max + 1).to_string()];
            if spec.min > 0 {
                outside.push((spec.min - 1).to_string());
            }
            for bad in outside {
                let e = Config::load_from(
                    &Overrides::default(),
                    &env(&[("HOME", "/h"), (var.as_str(), bad.as_str())]),
                )
                .expect_err(&format!("{var}={bad} must be refused"));
                assert!(e.to_string().contains(&key.dotted()), "{e}");
            }
        }
    }

    /// `[tools]` gives every tool its limits and read paths; a tool's own
    /// value overrides them, and each is checked against the same range.
    #[test]
    fn approval_settings_are_held_to_their_rules() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        let write = |text: &str| {
            std::fs::write(&file, text).unwrap();
            Config::load_from(
                &Overrides {
                    config_path: Some(file.clone()),
                    state_dir: Some(PathBuf::from("/srv/tg/state")),
                    ..Default::default()
                },
                &env(&[("HOME", "/h")]),
            )
        };
        let tool = |extra: &str| {
            format!(
                "[[tool]]\nname = \"deploy\"\nargv = [\"/bin/true\", \"{{target}}\"]\n{extra}\n\
                 [tool.input_schema]\ntype = \"object\"\nproperties.target = {{ type = \"string\" }}\n"
            )
        };
        // The journal's directory defaults to the state directory's sibling.
        let c = write(&tool(
            "approval = \"required\"\napproval_preview = [\"target\"]",
        ))
        .unwrap();
        assert_eq!(
            c.approvals.directory,
            PathBuf::from("/srv/tg/state-approvals")
        );
        assert_eq!(c.tools[0].approval, Approval::Required);
        assert_eq!(c.tools[0].approval_preview, ["target"]);
        let refused = |text: &str, needle: &str| {
            let e = write(text).expect_err(text).to_string();
            assert!(e.contains(needle), "{text}: {e}");
        };
        refused(
            &format!(
                "[approvals]\ndirectory = \"/srv/tg/state/journal\"\n{}",
                tool("")
            ),
            "overlaps the state directory",
        );
        refused(
            &tool("approval_preview = [\"target\"]"),
            "needs approval = \"required\"",
        );
        refused(
            &tool("approval = \"required\"\napproval_preview = [\"nope\"]"),
            "not a property of input_schema",
        );
        refused(
            &format!("[approvals]\nnotify_tool = \"page\"\n{}", tool("")),
            "names no [[tool]]",
        );
        refused(
            &format!(
                "[approvals]\nnotify_tool = \"deploy\"\n{}",
                tool("approval = \"required\"")
            ),
            "itself needs approval",
        );
        refused(
            "[approvals]\nnotify_tool = \"a b\"\n",
            "must be a tool's name",
        );
    }

    #[test]
    fn tools_defaults_apply_unless_a_tool_sets_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        let write = |text: &str| {
            std::fs::write(&file, text).unwrap();
            Config::load_from(
                &Overrides {
                    config_path: Some(file.clone()),
                    ..Default::default()
                },
                &env(&[("HOME", "/h")]),
            )
        };
        let c = write(
            "[tools]\nmax_processes = 16\nmax_cpu_secs = 9\nread_paths = [\"/opt/shared\"]\n\
             [[tool]]\nname = \"a\"\nargv = [\"/bin/true\"]\n\
             [[tool]]\nname = \"b\"\nargv = [\"/bin/true\"]\nmax_processes = 4\nread_paths = [\"/opt/b\"]\n",
        )
        .unwrap();
        let (a, b) = (&c.tools[0], &c.tools[1]);
        assert_eq!((a.limits.max_processes, a.limits.max_cpu_secs), (16, 9));
        assert_eq!(a.confinement.read_paths, [PathBuf::from("/opt/shared")]);
        assert_eq!((b.limits.max_processes, b.limits.max_cpu_secs), (4, 9));
        assert_eq!(b.confinement.read_paths, [PathBuf::from("/opt/b")]);
        assert_eq!(
            a.limits.max_open_files,
            keys::TOOLS_MAX_OPEN_FILES.int().default,
            "untouched keys keep the table's default"
        );
        assert_eq!(c.tool_defaults.max_processes, 16);

        let e = write("[tools]\nmax_processes = 0\n").unwrap_err();
        assert!(
            matches!(&e, ConfigError::OutOfRange { key, .. } if key == "tools.max_processes"),
            "{e}"
        );
        assert_eq!(e.exit_class(), ExitClass::Config);
        let e = write("[tools]\nread_paths = \"/opt\"\n").unwrap_err();
        assert!(e.to_string().contains("tools.read_paths"), "{e}");
        let e = write(
            "[tools]\nmax_processes = 16\n[[tool]]\nname = \"a\"\nargv = [\"/bin/true\"]\nmax_processes = 0\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("tool.a.max_processes"), "{e}");
        // The environment gives a `:`-joined list.
        let c = Config::load_from(
            &Overrides::default(),
            &env(&[
                ("HOME", "/h"),
                ("TASKGATE_TOOLS_READ_PATHS", "/opt/x:/srv/y"),
            ]),
        )
        .unwrap();
        assert_eq!(
            c.tool_defaults.read_paths,
            [PathBuf::from("/opt/x"), PathBuf::from("/srv/y")]
        );
    }

    /// Each definition's kind fits its field's type: every struct reads
    /// from empty layers, each field at its key's default.
    #[test]
    fn every_struct_reads_its_defaults() {
        let none = Layers::default();
        assert_eq!(
            ServerSettings::load(&none).unwrap(),
            ServerSettings::default()
        );
        assert_eq!(
            StoreSettings::load(&none).unwrap(),
            StoreSettings::default()
        );
        assert_eq!(TaskSettings::load(&none).unwrap(), TaskSettings::default());
        assert_eq!(
            ToolsSettings::load(&none).unwrap(),
            ToolsSettings::default()
        );
        assert_eq!(LogSettings::load(&none).unwrap(), LogSettings::default());
        assert_eq!(AuthSettings::load(&none).unwrap(), AuthSettings::default());
        assert_eq!(ToolLimits::load(&none).unwrap(), ToolLimits::default());
        assert_eq!(JwtLimits::load(&none).unwrap(), JwtLimits::default());
        assert_eq!(ServerSettings::default().listen.to_string(), DEFAULT_LISTEN);
    }

    /// Every word a `Choice` key documents is one its enum reads.
    #[test]
    fn every_choice_word_is_read() {
        for key in keys::KEYS {
            let Kind::Choice { choices, .. } = key.kind else {
                continue;
            };
            for word in choices {
                let mut layers = Layers::default();
                layers.set(key, toml::Value::String(word.to_string()), "test".into());
                let read = ServerSettings::load(&layers)
                    .and(AuthSettings::load(&layers))
                    .map(|_| ());
                assert!(read.is_ok(), "{} = {word}: {read:?}", key.dotted());
            }
        }
    }

    /// The shape of each repeated table accepts every key its definitions
    /// list (the shape's own list is where a new bounded key would be
    /// forgotten).
    #[test]
    fn repeated_tables_accept_every_defined_key() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        let mut text = String::from(
            "[auth]\nresource = \"https://x.test/mcp\"\n[[auth.jwt]]\nissuer = \"i\"\njwks_file = \"/k.json\"\ntenant = \"t\"\n",
        );
        for key in keys::JWT_KEYS {
            text.push_str(&format!("{} = {}\n", key.name, key.int().default));
        }
        text.push_str("[[tool]]\nname = \"a\"\nargv = [\"/bin/true\"]\n");
        for key in keys::TOOL_KEYS {
            text.push_str(&format!("{} = {}\n", key.name, key.int().default));
        }
        std::fs::write(&file, &text).unwrap();
        let over = Overrides {
            config_path: Some(file),
            ..Default::default()
        };
        let c = Config::load_from(&over, &env(&[("HOME", "/h")])).unwrap();
        assert_eq!(c.tools[0].limits, ToolLimits::default());
        let jwt = &c.auth.as_ref().unwrap().jwt[0];
        assert_eq!(jwt.limits, JwtLimits::default());
    }

    #[test]
    fn an_upper_bound_may_be_another_key() {
        let e = Config::load_from(
            &Overrides::default(),
            &env(&[
                ("HOME", "/h"),
                ("TASKGATE_TASKS_ARTIFACTS_MAX_TOTAL_BYTES", "2097152"),
                ("TASKGATE_TASKS_ARTIFACT_MAX_BYTES", "4194304"),
            ]),
        )
        .unwrap_err();
        assert!(
            matches!(&e, ConfigError::OutOfRange { key, max: 2097152, .. } if key == "tasks.artifact_max_bytes"),
            "{e}"
        );
        let e = Config::load_from(
            &Overrides::default(),
            &env(&[("HOME", "/h"), ("TASKGATE_STORE_QUEUE_DEPTH", "many")]),
        )
        .unwrap_err();
        assert!(e.to_string().contains("TASKGATE_STORE_QUEUE_DEPTH"), "{e}");
    }
}
