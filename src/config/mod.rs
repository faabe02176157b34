//! One configuration, layered: embedded defaults → TOML file → `TASKGATE_*`
//! environment → command-line flags.
//!
//! Every key is defined once, in [`keys`]: the loader validates against
//! that table, and the starter file, the docs' reference table and the man
//! page are rendered from it. A reload loads the whole configuration again
//! the same way; [`Config::changes`] says which keys differ, and the table
//! says which of them may apply without a restart. Unknown keys, relative
//! paths and out-of-range bounds refuse the start (exit 78) naming the key
//! and where it came from. The
//! state directory has its own precedence (flag, then systemd's
//! `$STATE_DIRECTORY`, then the layered `[store] directory`, then the XDG
//! default) because systemd owns the directory when it runs the unit.

pub mod keys;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use thiserror::Error;

use crate::exit::{Classify, ExitClass};
use keys::{KeySpec, Kind, Section};

mod auth;
pub use auth::{
    AuthSettings, JwtAlgorithm, JwtIssuer, LocalOwner, STATIC_ISSUER, ScopeClaim, TenantSource,
};

pub use keys::{PACKAGE_STATE_DIR, starter_config};

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
const ENV_PREFIX: &str = "TASKGATE_";
const ENV_RESERVED_PREFIX: &str = "TASKGATE_TEST_";

/// The configuration file of the packaged service (its unit's `--config`).
pub const PACKAGE_CONFIG_PATH: &str = "/etc/taskgate/taskgate.toml";

pub const DEFAULT_LISTEN: &str = match keys::SERVER_LISTEN.kind {
    Kind::Address { default } => default,
    _ => panic!("server.listen is an address"),
};

/// The bounds an operator may set, with their defaults and ranges, as named
/// constants for code that needs them without a configuration (the store's
/// defaults, tests). They are read from [`keys`], never written here.
pub mod bounds {
    use super::keys::*;
    use std::ops::RangeInclusive;

    pub const QUEUE_DEPTH_DEFAULT: u64 = STORE_QUEUE_DEPTH.int().default;
    pub const QUEUE_DEPTH: RangeInclusive<u64> = STORE_QUEUE_DEPTH.int().range();
    pub const MAX_LIVE_TASKS_DEFAULT: u64 = STORE_MAX_LIVE_TASKS.int().default;
    pub const MAX_LIVE_TASKS: RangeInclusive<u64> = STORE_MAX_LIVE_TASKS.int().range();
    pub const CHECKPOINT_INTERVAL_SECS_DEFAULT: u64 = STORE_CHECKPOINT_INTERVAL_SECS.int().default;
    pub const CHECKPOINT_INTERVAL_SECS: RangeInclusive<u64> =
        STORE_CHECKPOINT_INTERVAL_SECS.int().range();
    pub const MAX_DB_PAGES_DEFAULT: u64 = STORE_MAX_DB_PAGES.int().default;
    pub const MAX_DB_PAGES: RangeInclusive<u64> = STORE_MAX_DB_PAGES.int().range();

    pub const MAX_CONNECTIONS_DEFAULT: u64 = SERVER_MAX_CONNECTIONS.int().default;
    pub const MAX_CONNECTIONS: RangeInclusive<u64> = SERVER_MAX_CONNECTIONS.int().range();
    pub const MAX_CONCURRENT_REQUESTS_DEFAULT: u64 = SERVER_MAX_CONCURRENT_REQUESTS.int().default;
    pub const MAX_CONCURRENT_REQUESTS: RangeInclusive<u64> =
        SERVER_MAX_CONCURRENT_REQUESTS.int().range();
    pub const MAX_REQUEST_BYTES_DEFAULT: u64 = SERVER_MAX_REQUEST_BYTES.int().default;
    pub const MAX_REQUEST_BYTES: RangeInclusive<u64> = SERVER_MAX_REQUEST_BYTES.int().range();

    pub const DEFAULT_TTL_SECS_DEFAULT: u64 = TASKS_DEFAULT_TTL_SECS.int().default;
    pub const DEFAULT_TTL_SECS: RangeInclusive<u64> = TASKS_DEFAULT_TTL_SECS.int().range();
    pub const POLL_INTERVAL_MS_DEFAULT: u64 = TASKS_POLL_INTERVAL_MS.int().default;
    pub const POLL_INTERVAL_MS: RangeInclusive<u64> = TASKS_POLL_INTERVAL_MS.int().range();
    pub const MAX_RUNNING_DEFAULT: u64 = TASKS_MAX_RUNNING.int().default;
    pub const MAX_RUNNING: RangeInclusive<u64> = TASKS_MAX_RUNNING.int().range();
    pub const CANCEL_GRACE_MS_DEFAULT: u64 = TASKS_CANCEL_GRACE_MS.int().default;
    pub const CANCEL_GRACE_MS: RangeInclusive<u64> = TASKS_CANCEL_GRACE_MS.int().range();
    pub const ARTIFACTS_MAX_TOTAL_BYTES_DEFAULT: u64 =
        TASKS_ARTIFACTS_MAX_TOTAL_BYTES.int().default;
    pub const ARTIFACTS_MAX_TOTAL_BYTES: RangeInclusive<u64> =
        TASKS_ARTIFACTS_MAX_TOTAL_BYTES.int().range();
    pub const ARTIFACT_MAX_BYTES_DEFAULT: u64 = TASKS_ARTIFACT_MAX_BYTES.int().default;
    pub const ARTIFACT_MAX_BYTES: RangeInclusive<u64> = TASKS_ARTIFACT_MAX_BYTES.int().range();

    pub const TOOL_TIMEOUT_SECS_DEFAULT: u64 = TOOL_TIMEOUT_SECS.int().default;
    pub const TOOL_MAX_STDOUT_BYTES_DEFAULT: u64 = TOOL_MAX_STDOUT_BYTES.int().default;
    pub const TOOL_MAX_STDERR_BYTES_DEFAULT: u64 = TOOL_MAX_STDERR_BYTES.int().default;
    /// Most tools a configuration may declare.
    pub const MAX_TOOLS: usize = 1024;
}

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
    /// Authentication arrives later; until then only loopback is served.
    #[error(
        "{key} = {value} (from {origin}) is not a loopback address, which needs credentials in [auth] and server.tls = \"on\" (or \"terminated-upstream\" behind a TLS proxy you run); otherwise listen on 127.0.0.1 or ::1"
    )]
    NotLoopback {
        key: String,
        value: SocketAddr,
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

#[derive(Debug, Clone)]
pub struct StoreSettings {
    pub queue_depth: usize,
    pub max_live_tasks: u64,
    /// Unexpired tasks one owner may hold.
    pub max_live_tasks_per_owner: u64,
    pub checkpoint_interval: Duration,
    pub max_db_pages: u64,
}

#[derive(Debug, Clone)]
pub struct ServerSettings {
    pub listen: SocketAddr,
    pub tls: TlsMode,
    /// The PEM certificate chain and key, when `tls` is `On`.
    pub tls_files: Option<(PathBuf, PathBuf)>,
    pub max_connections: usize,
    pub max_concurrent_requests: usize,
    /// `/mcp` requests that are not `tools/call`, bounded apart.
    pub reserved_control_requests: usize,
    pub max_request_bytes: usize,
    pub header_read_timeout: Duration,
    /// Time a request body may take to arrive once its head is in.
    pub body_read_timeout: Duration,
    pub max_sessions: usize,
    pub session_idle: Duration,
    /// `server.allowed_origins`, each in the form [`normalize_origin`] gives.
    pub allowed_origins: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct LogSettings {
    /// A tracing filter, already known to parse.
    pub filter: String,
}

#[derive(Debug, Clone)]
pub struct TaskSettings {
    pub default_ttl: Duration,
    pub poll_interval: Duration,
    pub max_running: usize,
    /// Background tasks one owner may run at once (at most `max_running`).
    pub max_running_per_owner: usize,
    pub cancel_grace: Duration,
    pub artifacts_max_total_bytes: u64,
    pub artifact_max_bytes: u64,
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

/// How the HTTP listener is protected in transit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// Plain HTTP: loopback only.
    Off,
    /// TLS terminated by taskgate.
    On,
    /// Plain HTTP forwarded by the operator's TLS-terminating proxy.
    TerminatedUpstream,
}

/// A command tool, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolConfig {
    pub name: String,
    pub description: String,
    pub argv: Vec<String>,
    pub input_schema: serde_json::Value,
    pub working_dir: Option<PathBuf>,
    pub env: Vec<String>,
    pub timeout: Duration,
    pub max_stdout_bytes: u64,
    pub max_stderr_bytes: u64,
    pub effect: Effect,
    pub task: TaskMode,
    pub confinement: ToolConfinement,
}

/// Whether a tool's filesystem is confined (Landlock).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sandbox {
    #[default]
    Landlock,
    /// Written out by the operator; the resource limits still apply.
    Unconfined,
}

/// A command tool's confinement: its paths and resource limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolConfinement {
    pub sandbox: Sandbox,
    /// Read and execute, beside the default set.
    pub read_paths: Vec<PathBuf>,
    /// Read and write, beside its working directory.
    pub write_paths: Vec<PathBuf>,
    pub max_address_space_bytes: u64,
    pub max_open_files: u64,
    pub max_processes: u64,
    pub max_file_bytes: u64,
    pub max_cpu_secs: u64,
}

impl Default for ToolConfinement {
    fn default() -> Self {
        ToolConfinement {
            sandbox: Sandbox::default(),
            read_paths: Vec::new(),
            write_paths: Vec::new(),
            max_address_space_bytes: keys::TOOL_MAX_ADDRESS_SPACE_BYTES.int().default,
            max_open_files: keys::TOOL_MAX_OPEN_FILES.int().default,
            max_processes: keys::TOOL_MAX_PROCESSES.int().default,
            max_file_bytes: keys::TOOL_MAX_FILE_BYTES.int().default,
            max_cpu_secs: keys::TOOL_MAX_CPU_SECS.int().default,
        }
    }
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
    /// `[auth]`, present only when credentials are configured (a tokens
    /// file or a JWT issuer): see [`Config::auth_enabled`].
    pub auth: Option<AuthSettings>,
    /// The `[tools]` defaults each tool started from (sandbox aside: it is
    /// never a default).
    pub tool_defaults: ToolConfinement,
    /// Every setting's effective value as text, by dotted key: what a
    /// reload compares to find the keys that changed.
    values: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTool {
    name: String,
    description: Option<String>,
    argv: Vec<String>,
    input_schema: Option<toml::Table>,
    working_dir: Option<PathBuf>,
    env: Option<Vec<String>>,
    timeout_secs: Option<u64>,
    max_stdout_bytes: Option<u64>,
    max_stderr_bytes: Option<u64>,
    effect: Option<Effect>,
    task: Option<TaskMode>,
    sandbox: Option<Sandbox>,
    read_paths: Option<Vec<PathBuf>>,
    write_paths: Option<Vec<PathBuf>>,
    max_address_space_bytes: Option<u64>,
    max_open_files: Option<u64>,
    max_processes: Option<u64>,
    max_file_bytes: Option<u64>,
    max_cpu_secs: Option<u64>,
}

/// Only the `[[tool]]` tables of a file, deserialised from its text so
/// that an error in one points at its line.
#[derive(Debug, Default, Deserialize)]
struct RawTools {
    #[serde(default)]
    tool: Vec<RawTool>,
}

/// A value one layer set, and where it came from.
struct Setting {
    value: toml::Value,
    origin: String,
}

/// The settings the file and the environment gave, by dotted key; a later
/// layer replaces an earlier one's value.
#[derive(Default)]
struct Layers(BTreeMap<String, Setting>);

const EMBEDDED: &str = "the embedded default";

impl Layers {
    fn set(&mut self, key: &KeySpec, value: toml::Value, origin: String) {
        self.0.insert(key.dotted(), Setting { value, origin });
    }

    /// An integer key, checked against its range (and against the key that
    /// bounds it from above, if any).
    fn int(&self, key: &KeySpec) -> Result<u64, ConfigError> {
        let spec = key.int();
        let Some(set) = self.0.get(&key.dotted()) else {
            return Ok(spec.default);
        };
        let value = match &set.value {
            toml::Value::Integer(i) => u64::try_from(*i).ok(),
            // The environment gives text.
            toml::Value::String(s) => s.trim().parse::<u64>().ok(),
            _ => None,
        };
        let Some(value) = value else {
            return Err(ConfigError::Invalid {
                origin: set.origin.clone(),
                message: format!(
                    "{} must be a whole number in {}..={}",
                    key.dotted(),
                    spec.min,
                    spec.max
                ),
            });
        };
        let mut max = spec.max;
        if let Some(other) = spec.at_most.and_then(|o| {
            let (section, name) = o.split_once('.')?;
            keys::find(section, name)
        }) {
            max = max.min(self.int(other)?);
        }
        if (spec.min..=max).contains(&value) {
            Ok(value)
        } else {
            Err(ConfigError::OutOfRange {
                key: key.dotted(),
                value,
                origin: set.origin.clone(),
                min: spec.min,
                max,
            })
        }
    }

    /// Where a key's value came from (the embedded default when no layer set it).
    fn origin_of(&self, key: &KeySpec) -> String {
        self.0
            .get(&key.dotted())
            .map(|s| s.origin.clone())
            .unwrap_or_else(|| EMBEDDED.to_string())
    }

    fn text(&self, key: &KeySpec) -> Result<Option<(String, String)>, ConfigError> {
        match self.0.get(&key.dotted()) {
            None => Ok(None),
            Some(Setting {
                value: toml::Value::String(s),
                origin,
            }) => Ok(Some((s.clone(), origin.clone()))),
            Some(set) => Err(ConfigError::Invalid {
                origin: set.origin.clone(),
                message: format!("{} must be a string", key.dotted()),
            }),
        }
    }

    /// A tracing filter key, parsed the way the logger parses it, so that
    /// a filter the logger would refuse (or half ignore) refuses the start
    /// or the reload instead.
    fn filter(&self, key: &KeySpec) -> Result<String, ConfigError> {
        let Kind::Filter { default } = key.kind else {
            return Err(ConfigError::Invalid {
                origin: EMBEDDED.into(),
                message: format!("{} is not a filter key", key.dotted()),
            });
        };
        let Some((text, origin)) = self.text(key)? else {
            return Ok(default.to_string());
        };
        match tracing_subscriber::EnvFilter::builder().parse(&text) {
            Ok(_) => Ok(text),
            Err(e) => Err(ConfigError::Invalid {
                origin,
                message: format!(
                    "{} = {text:?} is not a log filter ({e}); write a level, then target=level pairs, e.g. \"info,taskgate::tasks=debug\"",
                    key.dotted()
                ),
            }),
        }
    }

    /// A `Choice` key: its value, or the default.
    fn choice(&self, key: &KeySpec) -> Result<&'static str, ConfigError> {
        let Kind::Choice { default, choices } = key.kind else {
            return Ok("");
        };
        match self.text(key)? {
            None => Ok(default),
            Some((value, origin)) => {
                choices
                    .iter()
                    .find(|c| **c == value)
                    .copied()
                    .ok_or_else(|| ConfigError::Invalid {
                        origin,
                        message: format!(
                            "{} = {value:?} is not one of {}",
                            key.dotted(),
                            choices.join(", ")
                        ),
                    })
            }
        }
    }

    /// A `Text` key, checked by its rule: its value, or the default.
    fn checked_text(&self, key: &KeySpec) -> Result<Option<String>, ConfigError> {
        let Kind::Text { default, rule, .. } = key.kind else {
            return Ok(None);
        };
        match self.text(key)? {
            None => Ok(default.map(str::to_string)),
            Some((value, origin)) => match rule.check(&value) {
                Ok(()) => Ok(Some(value)),
                Err(why) => Err(ConfigError::Invalid {
                    origin,
                    message: format!("{} = {value:?} {why}", key.dotted()),
                }),
            },
        }
    }

    /// A `File` key: an absolute path, if set.
    fn file(&self, key: &KeySpec) -> Result<Option<PathBuf>, ConfigError> {
        match self.text(key)? {
            None => Ok(None),
            Some((value, origin)) => {
                let path = PathBuf::from(value);
                require_absolute(key.dotted(), &path, origin)?;
                Ok(Some(path))
            }
        }
    }

    /// A list of absolute paths (an array of strings); every entry must be
    /// absolute.
    fn paths(&self, key: &KeySpec) -> Result<Vec<PathBuf>, ConfigError> {
        let Some(set) = self.0.get(&key.dotted()) else {
            return Ok(Vec::new());
        };
        // The environment's list arrives split already (see `env_layer`).
        let texts: Option<Vec<String>> = match &set.value {
            toml::Value::Array(items) => items
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect(),
            _ => None,
        };
        let Some(texts) = texts else {
            return Err(ConfigError::Invalid {
                origin: set.origin.clone(),
                message: format!("{} must be a list of absolute paths", key.dotted()),
            });
        };
        let paths: Vec<PathBuf> = texts.into_iter().map(PathBuf::from).collect();
        for p in &paths {
            require_absolute(key.dotted(), p, set.origin.clone())?;
        }
        Ok(paths)
    }

    fn origins(&self, key: &KeySpec) -> Result<Vec<String>, ConfigError> {
        let Some(set) = self.0.get(&key.dotted()) else {
            return Ok(Vec::new());
        };
        let invalid = |what: String| ConfigError::Invalid {
            origin: set.origin.clone(),
            message: format!(
                "{} must be a list of web origins such as \"https://console.example:8443\" (scheme, host and optional port; no path): {what}",
                key.dotted()
            ),
        };
        let toml::Value::Array(items) = &set.value else {
            return Err(invalid("not a list".into()));
        };
        items
            .iter()
            .map(|v| {
                let text = v
                    .as_str()
                    .ok_or_else(|| invalid(format!("{v} is not text")))?;
                normalize_origin(text).ok_or_else(|| invalid(format!("{text:?} is not one")))
            })
            .collect()
    }

    fn duration_secs(&self, key: &KeySpec) -> Result<Duration, ConfigError> {
        self.int(key).map(Duration::from_secs)
    }

    fn duration_ms(&self, key: &KeySpec) -> Result<Duration, ConfigError> {
        self.int(key).map(Duration::from_millis)
    }

    fn size(&self, key: &KeySpec) -> Result<usize, ConfigError> {
        // Every range fits a usize on the 64-bit targets taskgate ships for.
        self.int(key)
            .map(|v| usize::try_from(v).unwrap_or(usize::MAX))
    }
}

impl Config {
    /// Loads the configuration from the real process environment.
    pub fn load(overrides: &Overrides) -> Result<Config, ConfigError> {
        let env: HashMap<String, String> = std::env::vars().collect();
        Config::load_from(overrides, &env)
    }

    /// Loads the configuration from the given environment snapshot.
    pub fn load_from(
        overrides: &Overrides,
        env: &HashMap<String, String>,
    ) -> Result<Config, ConfigError> {
        let Layered {
            layers,
            file: config_file,
            raw_tools,
            tools_origin,
            raw_jwt,
        } = Layered::read(overrides, env)?;
        let (listen, off_loopback) = layers.listen(overrides)?;
        let tls = match layers.choice(&keys::SERVER_TLS)? {
            "on" => TlsMode::On,
            "terminated-upstream" => TlsMode::TerminatedUpstream,
            _ => TlsMode::Off,
        };
        let tls_files = match (
            tls,
            layers.file(&keys::SERVER_TLS_CERT_FILE)?,
            layers.file(&keys::SERVER_TLS_KEY_FILE)?,
        ) {
            (TlsMode::On, Some(cert), Some(key)) => Some((cert, key)),
            (TlsMode::On, _, _) => {
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
            _ => None,
        };

        let store = StoreSettings {
            queue_depth: layers.size(&keys::STORE_QUEUE_DEPTH)?,
            max_live_tasks: layers.int(&keys::STORE_MAX_LIVE_TASKS)?,
            max_live_tasks_per_owner: layers.int(&keys::STORE_MAX_LIVE_TASKS_PER_OWNER)?,
            checkpoint_interval: layers.duration_secs(&keys::STORE_CHECKPOINT_INTERVAL_SECS)?,
            max_db_pages: layers.int(&keys::STORE_MAX_DB_PAGES)?,
        };
        let configured_dir = match layers.text(&keys::STORE_DIRECTORY)? {
            Some((dir, origin)) => {
                let dir = PathBuf::from(dir);
                require_absolute(keys::STORE_DIRECTORY.dotted(), &dir, origin.clone())?;
                Some((dir, origin))
            }
            None => None,
        };
        let (state_dir, state_dir_source) = resolve_state_dir(overrides, env, configured_dir)?;

        let server = ServerSettings {
            listen,
            tls,
            tls_files,
            max_connections: layers.size(&keys::SERVER_MAX_CONNECTIONS)?,
            max_concurrent_requests: layers.size(&keys::SERVER_MAX_CONCURRENT_REQUESTS)?,
            reserved_control_requests: layers.size(&keys::SERVER_RESERVED_CONTROL_REQUESTS)?,
            max_request_bytes: layers.size(&keys::SERVER_MAX_REQUEST_BYTES)?,
            header_read_timeout: layers.duration_ms(&keys::SERVER_HEADER_READ_TIMEOUT_MS)?,
            body_read_timeout: layers.duration_ms(&keys::SERVER_BODY_READ_TIMEOUT_MS)?,
            max_sessions: layers.size(&keys::SERVER_MAX_SESSIONS)?,
            session_idle: layers.duration_secs(&keys::SERVER_SESSION_IDLE_SECS)?,
            allowed_origins: layers.origins(&keys::SERVER_ALLOWED_ORIGINS)?,
        };
        let tasks = TaskSettings {
            default_ttl: layers.duration_secs(&keys::TASKS_DEFAULT_TTL_SECS)?,
            poll_interval: layers.duration_ms(&keys::TASKS_POLL_INTERVAL_MS)?,
            max_running: layers.size(&keys::TASKS_MAX_RUNNING)?,
            max_running_per_owner: layers
                .size(&keys::TASKS_MAX_RUNNING_PER_OWNER)?
                .min(layers.size(&keys::TASKS_MAX_RUNNING)?),
            cancel_grace: layers.duration_ms(&keys::TASKS_CANCEL_GRACE_MS)?,
            artifacts_max_total_bytes: layers.int(&keys::TASKS_ARTIFACTS_MAX_TOTAL_BYTES)?,
            artifact_max_bytes: layers.int(&keys::TASKS_ARTIFACT_MAX_BYTES)?,
        };
        let log = LogSettings {
            filter: layers.filter(&keys::LOG_FILTER)?,
        };
        let tool_defaults = ToolConfinement {
            sandbox: Sandbox::default(),
            read_paths: layers.paths(&keys::TOOLS_READ_PATHS)?,
            write_paths: Vec::new(),
            max_address_space_bytes: layers.int(&keys::TOOLS_MAX_ADDRESS_SPACE_BYTES)?,
            max_open_files: layers.int(&keys::TOOLS_MAX_OPEN_FILES)?,
            max_processes: layers.int(&keys::TOOLS_MAX_PROCESSES)?,
            max_file_bytes: layers.int(&keys::TOOLS_MAX_FILE_BYTES)?,
            max_cpu_secs: layers.int(&keys::TOOLS_MAX_CPU_SECS)?,
        };
        let tools = tool_settings(raw_tools, tools_origin.clone(), &tool_defaults)?;
        let auth = auth::settings(&layers, raw_jwt, &tools_origin)?;
        // Off loopback, every caller must prove who it is, over TLS (here or
        // in a proxy the operator runs).
        if let Some((value, origin)) = off_loopback
            && (auth.is_none() || tls == TlsMode::Off)
        {
            return Err(ConfigError::NotLoopback {
                key: keys::SERVER_LISTEN.dotted(),
                value,
                origin,
            });
        }

        let mut values = BTreeMap::new();
        for key in keys::KEYS {
            let value = match key.kind {
                Kind::Int(_) => layers.int(key)?.to_string(),
                // Debug form: exact for any path, `:` included.
                Kind::Paths => format!("{:?}", layers.paths(key)?),
                Kind::Origins => layers.origins(key)?.join(" "),
                // One key of each of these kinds; their effective values
                // are the ones resolved above (flags and precedence included).
                Kind::Address { .. } => listen.to_string(),
                Kind::Path => state_dir.display().to_string(),
                Kind::Filter { .. } => log.filter.clone(),
                Kind::Choice { .. } => layers.choice(key)?.to_string(),
                Kind::Text { .. } => layers.checked_text(key)?.unwrap_or_default(),
                Kind::File { .. } => layers
                    .file(key)?
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
            };
            values.insert(key.dotted(), value);
        }

        Ok(Config {
            file: config_file,
            values,
            state_dir,
            state_dir_source,
            server,
            store,
            tasks,
            log,
            tools,
            auth,
            tool_defaults,
        })
    }

    /// Whether callers must authenticate: true when `[auth]` configures
    /// credentials (a tokens file or a JWT issuer). Without, every caller
    /// is the one local owner, as before authentication existed.
    pub fn auth_enabled(&self) -> bool {
        self.auth.is_some()
    }
}

/// The file and environment layers of a load, before any value is used.
struct Layered {
    layers: Layers,
    file: Option<PathBuf>,
    raw_tools: Vec<RawTool>,
    tools_origin: String,
    raw_jwt: Vec<auth::RawJwt>,
}

impl Layered {
    fn read(overrides: &Overrides, env: &HashMap<String, String>) -> Result<Layered, ConfigError> {
        let mut layers = Layers::default();
        let file = overrides
            .config_path
            .clone()
            .or_else(|| env.get(ENV_CONFIG_PATH).map(PathBuf::from));
        let mut raw_tools = Vec::new();
        let mut tools_origin = EMBEDDED.to_string();
        let mut raw_jwt = Vec::new();
        if let Some(path) = &file {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.clone(),
                source,
            })?;
            let origin = path.display().to_string();
            raw_tools = file_layer(&mut layers, &origin, &text)?;
            raw_jwt = auth::raw_issuers(&origin, &text)?;
            tools_origin = origin;
        }
        env_layer(&mut layers, env)?;
        Ok(Layered {
            layers,
            file,
            raw_tools,
            tools_origin,
            raw_jwt,
        })
    }
}

impl Layers {
    /// `server.listen`, the flag first. The layered value is checked even
    /// when the flag overrides it: a wrong file is wrong, whatever this one
    /// process was started with.
    /// The listen address, and the first non-loopback address any layer
    /// gave (with its origin), even one a later layer overrides: whether
    /// that may be is decided once `[auth]` and `server.tls` are known, and
    /// every layer is held to it.
    fn listen(
        &self,
        overrides: &Overrides,
    ) -> Result<(SocketAddr, Option<(SocketAddr, String)>), ConfigError> {
        let (effective, origin) = self.listen_layers(overrides)?;
        let file = match self.text(&keys::SERVER_LISTEN)? {
            Some((text, origin)) => text.parse::<SocketAddr>().ok().map(|a| (a, origin)),
            None => None,
        };
        let off_loopback = [file, Some((effective, origin))]
            .into_iter()
            .flatten()
            .find(|(a, _)| !a.ip().is_loopback());
        Ok((effective, off_loopback))
    }

    fn listen_layers(&self, overrides: &Overrides) -> Result<(SocketAddr, String), ConfigError> {
        let address = |text: &str, origin: String| {
            let key = keys::SERVER_LISTEN.dotted();
            match text.parse::<SocketAddr>() {
                Err(_) => Err(ConfigError::BadAddress {
                    key,
                    value: text.to_string(),
                    origin,
                }),
                Ok(addr) => Ok((addr, origin)),
            }
        };
        let layered = match self.text(&keys::SERVER_LISTEN)? {
            Some((text, origin)) => Some(address(&text, origin)?),
            None => None,
        };
        match &overrides.listen {
            Some(flag) => address(flag, "flag --listen".to_string()),
            None => match layered {
                Some(addr) => Ok(addr),
                None => address(DEFAULT_LISTEN, EMBEDDED.to_string()),
            },
        }
    }
}

/// The address a daemon started with this configuration listens on: for
/// the operator client, which needs no state directory. The file and the
/// environment are checked key by key as for `serve`.
pub fn configured_listen(overrides: &Overrides) -> Result<SocketAddr, ConfigError> {
    let env: HashMap<String, String> = std::env::vars().collect();
    Layered::read(overrides, &env)?
        .layers
        .listen(overrides)
        .map(|(addr, _)| addr)
}

/// The `[auth]` settings of a configuration, for the operator's `taskgate
/// token` commands, which need no state directory. The file and the
/// environment are checked key by key as for `serve`.
pub fn configured_auth(overrides: &Overrides) -> Result<Option<AuthSettings>, ConfigError> {
    let env: HashMap<String, String> = std::env::vars().collect();
    let layered = Layered::read(overrides, &env)?;
    auth::settings(&layered.layers, layered.raw_jwt, &layered.tools_origin)
}

/// One setting that differs between two configurations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub key: &'static KeySpec,
    pub old: String,
    pub new: String,
}

impl Config {
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

/// Records the file's settings in `layers` and returns its tools. Every
/// key is checked against the table, and an error names its line.
fn file_layer(layers: &mut Layers, origin: &str, text: &str) -> Result<Vec<RawTool>, ConfigError> {
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
    let mut has_tools = false;
    for (top, value) in table {
        if top == "tool" {
            has_tools = true;
            continue;
        }
        let at = line_origin(origin, text, &[&top]);
        let Some(section) = Section::SETTINGS.iter().find(|s| s.name() == top) else {
            return Err(ConfigError::Invalid {
                origin: at,
                message: format!(
                    "unknown section `{top}`; the sections are {}, [[tool]] and [[auth.jwt]]",
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
    if !has_tools {
        return Ok(Vec::new());
    }
    toml::from_str::<RawTools>(text)
        .map(|t| t.tool)
        .map_err(|e| invalid_toml(origin, text, &e))
}

/// Records `TASKGATE_<SECTION>_<KEY>` settings in `layers`.
fn env_layer(layers: &mut Layers, env: &HashMap<String, String>) -> Result<(), ConfigError> {
    let mut names: Vec<&String> = env.keys().collect();
    names.sort();
    for name in names {
        if !name.starts_with(ENV_PREFIX)
            || name == ENV_CONFIG_PATH
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

/// Tool names the daemon itself serves.
pub const RESERVED_TOOL_NAMES: &[&str] = &["artifact_read"];

fn valid_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

fn valid_env_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// The `[[tool]]` tables validated; a key a table leaves out takes its
/// value from `defaults` (the `[tools]` section).
fn tool_settings(
    raw: Vec<RawTool>,
    origin: String,
    defaults: &ToolConfinement,
) -> Result<Vec<ToolConfig>, ConfigError> {
    if raw.len() > bounds::MAX_TOOLS {
        return Err(ConfigError::Invalid {
            origin,
            message: format!(
                "{} tools declared; at most {} are allowed",
                raw.len(),
                bounds::MAX_TOOLS
            ),
        });
    }
    let mut seen = std::collections::HashSet::new();
    let mut tools = Vec::with_capacity(raw.len());
    for t in raw {
        let bad = |message: String| ConfigError::Invalid {
            origin: format!("{origin}: [[tool]] {:?}", t.name),
            message,
        };
        if !valid_tool_name(&t.name) {
            return Err(bad(
                "name must be 1-64 characters of A-Z a-z 0-9 _ - .".into()
            ));
        }
        if RESERVED_TOOL_NAMES.contains(&t.name.as_str()) {
            return Err(bad("this name is reserved for a built-in tool".into()));
        }
        if !seen.insert(t.name.clone()) {
            return Err(bad("declared twice; tool names must be unique".into()));
        }
        match t.argv.first() {
            Some(program) if Path::new(program).is_absolute() => {}
            Some(_) => {
                return Err(bad(
                    "argv[0] must be an absolute path to the program (no shell, no PATH lookup)"
                        .into(),
                ));
            }
            None => return Err(bad("argv must name the program to run".into())),
        }
        if let Some(dir) = &t.working_dir
            && !dir.is_absolute()
        {
            return Err(bad(format!(
                "working_dir {dir:?} is a relative path; give an absolute path"
            )));
        }
        let env = t.env.clone().unwrap_or_default();
        if let Some(name) = env.iter().find(|n| !valid_env_name(n)) {
            return Err(bad(format!("env entry {name:?} is not a variable name")));
        }
        let effect = t.effect.unwrap_or(Effect::NonIdempotentWrite);
        let task = t.task.unwrap_or(TaskMode::Never);
        if task != TaskMode::Never && effect == Effect::NonIdempotentWrite {
            return Err(bad(
                "a non-idempotent write cannot run as a background task (a restart would leave its effect unknown); declare effect = \"read_only\" or \"idempotent_write\" if that is true, or set task = \"never\"".into(),
            ));
        }
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
        // A tool's bounds are per tool, so they are checked here rather
        // than through the settings' layers.
        // A value left out is the `[tools]` one (checked there already) or
        // the key's own default.
        let range = |key: &KeySpec, v: Option<u64>, default: u64| {
            let spec = key.int();
            let value = v.unwrap_or(default);
            if spec.range().contains(&value) {
                Ok(value)
            } else {
                Err(ConfigError::Invalid {
                    origin: origin.clone(),
                    message: format!(
                        "tool.{}.{} = {value} is out of range {}..={}",
                        t.name, key.name, spec.min, spec.max
                    ),
                })
            }
        };
        let mut declared = t.read_paths.iter().chain(&t.write_paths).flatten();
        if let Some(p) = declared.find(|p| !p.is_absolute()) {
            return Err(bad(format!(
                "read_paths/write_paths entry {p:?} is a relative path; give an absolute path"
            )));
        }
        let confinement = ToolConfinement {
            sandbox: t.sandbox.unwrap_or_default(),
            read_paths: t
                .read_paths
                .clone()
                .unwrap_or_else(|| defaults.read_paths.clone()),
            write_paths: t.write_paths.clone().unwrap_or_default(),
            max_address_space_bytes: range(
                &keys::TOOL_MAX_ADDRESS_SPACE_BYTES,
                t.max_address_space_bytes,
                defaults.max_address_space_bytes,
            )?,
            max_open_files: range(
                &keys::TOOL_MAX_OPEN_FILES,
                t.max_open_files,
                defaults.max_open_files,
            )?,
            max_processes: range(
                &keys::TOOL_MAX_PROCESSES,
                t.max_processes,
                defaults.max_processes,
            )?,
            max_file_bytes: range(
                &keys::TOOL_MAX_FILE_BYTES,
                t.max_file_bytes,
                defaults.max_file_bytes,
            )?,
            max_cpu_secs: range(
                &keys::TOOL_MAX_CPU_SECS,
                t.max_cpu_secs,
                defaults.max_cpu_secs,
            )?,
        };
        let own = |key: &KeySpec, v: Option<u64>| range(key, v, key.int().default);
        tools.push(ToolConfig {
            confinement,
            timeout: Duration::from_secs(own(&keys::TOOL_TIMEOUT_SECS, t.timeout_secs)?),
            max_stdout_bytes: own(&keys::TOOL_MAX_STDOUT_BYTES, t.max_stdout_bytes)?,
            max_stderr_bytes: own(&keys::TOOL_MAX_STDERR_BYTES, t.max_stderr_bytes)?,
            description: t.description.clone().unwrap_or_default(),
            name: t.name,
            argv: t.argv,
            input_schema,
            working_dir: t.working_dir,
            env,
            effect,
            task,
        });
    }
    Ok(tools)
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
        let (a, b) = (&c.tools[0].confinement, &c.tools[1].confinement);
        assert_eq!((a.max_processes, a.max_cpu_secs), (16, 9));
        assert_eq!(a.read_paths, [PathBuf::from("/opt/shared")]);
        assert_eq!((b.max_processes, b.max_cpu_secs), (4, 9));
        assert_eq!(b.read_paths, [PathBuf::from("/opt/b")]);
        assert_eq!(
            a.max_open_files,
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
