//! One configuration, layered: embedded defaults → TOML file → `TASKGATE_*`
//! environment → command-line flags.
//!
//! Every setting here is read once at startup; nothing reloads. Unknown keys,
//! relative paths and out-of-range bounds refuse the start (exit 78) naming
//! the key and where it came from. The state directory has its own
//! precedence (flag, then systemd's `$STATE_DIRECTORY`, then the layered
//! `[store] directory`, then the XDG default) because systemd owns the
//! directory when it runs the unit.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use thiserror::Error;

use crate::exit::{Classify, ExitClass};

/// Environment variables with the `TASKGATE_` prefix that are not settings.
pub const ENV_CONFIG_PATH: &str = "TASKGATE_CONFIG";
pub const ENV_LOG: &str = "TASKGATE_LOG";
const ENV_PREFIX: &str = "TASKGATE_";
const ENV_RESERVED_PREFIX: &str = "TASKGATE_TEST_";

pub const DEFAULT_LISTEN: &str = "127.0.0.1:8765";

/// The store bounds an operator may set, with their defaults and ranges.
pub mod bounds {
    use std::ops::RangeInclusive;
    pub const QUEUE_DEPTH_DEFAULT: u64 = 128;
    pub const QUEUE_DEPTH: RangeInclusive<u64> = 1..=4096;
    pub const MAX_LIVE_TASKS_DEFAULT: u64 = 100_000;
    pub const MAX_LIVE_TASKS: RangeInclusive<u64> = 1..=1_000_000;
    pub const CHECKPOINT_INTERVAL_SECS_DEFAULT: u64 = 60;
    pub const CHECKPOINT_INTERVAL_SECS: RangeInclusive<u64> = 1..=86_400;
    /// 1,048,576 pages of 4 KiB: a 4 GiB ceiling, room for 100,000 full
    /// 16 KiB results plus rows and indexes.
    pub const MAX_DB_PAGES_DEFAULT: u64 = 1_048_576;
    pub const MAX_DB_PAGES: RangeInclusive<u64> = 64..=1_048_576;

    pub const MAX_CONNECTIONS_DEFAULT: u64 = 256;
    pub const MAX_CONNECTIONS: RangeInclusive<u64> = 1..=65_536;
    pub const MAX_CONCURRENT_REQUESTS_DEFAULT: u64 = 64;
    pub const MAX_CONCURRENT_REQUESTS: RangeInclusive<u64> = 1..=4096;
    pub const MAX_REQUEST_BYTES_DEFAULT: u64 = 1024 * 1024;
    pub const MAX_REQUEST_BYTES: RangeInclusive<u64> = 4096..=16 * 1024 * 1024;

    pub const DEFAULT_TTL_SECS_DEFAULT: u64 = 86_400;
    pub const DEFAULT_TTL_SECS: RangeInclusive<u64> = 60..=30 * 86_400;
    pub const POLL_INTERVAL_MS_DEFAULT: u64 = 1000;
    pub const POLL_INTERVAL_MS: RangeInclusive<u64> = 50..=60_000;
    pub const MAX_RUNNING_DEFAULT: u64 = 8;
    pub const MAX_RUNNING: RangeInclusive<u64> = 1..=1024;
    pub const CANCEL_GRACE_MS_DEFAULT: u64 = 5000;
    pub const CANCEL_GRACE_MS: RangeInclusive<u64> = 0..=60_000;
    pub const ARTIFACTS_MAX_TOTAL_BYTES_DEFAULT: u64 = 1024 * 1024 * 1024;
    pub const ARTIFACTS_MAX_TOTAL_BYTES: RangeInclusive<u64> =
        1024 * 1024..=64 * 1024 * 1024 * 1024;
    pub const ARTIFACT_MAX_BYTES_DEFAULT: u64 = 16 * 1024 * 1024;
    pub const ARTIFACT_MAX_BYTES: RangeInclusive<u64> = 16 * 1024..=1024 * 1024 * 1024;

    pub const TOOL_TIMEOUT_SECS_DEFAULT: u64 = 300;
    pub const TOOL_TIMEOUT_SECS: RangeInclusive<u64> = 1..=7 * 86_400;
    pub const TOOL_MAX_STDOUT_BYTES_DEFAULT: u64 = 1024 * 1024;
    pub const TOOL_MAX_STDOUT_BYTES: RangeInclusive<u64> = 1..=1024 * 1024 * 1024;
    pub const TOOL_MAX_STDERR_BYTES_DEFAULT: u64 = 64 * 1024;
    pub const TOOL_MAX_STDERR_BYTES: RangeInclusive<u64> = 0..=64 * 1024 * 1024;
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
        key: &'static str,
        value: u64,
        origin: String,
        min: u64,
        max: u64,
    },
    #[error("{key} = {value:?} (from {origin}) is a relative path; give an absolute path")]
    RelativePath {
        key: &'static str,
        value: PathBuf,
        origin: String,
    },
    #[error("{key} = {value:?} (from {origin}) is not a socket address like 127.0.0.1:8765")]
    BadAddress {
        key: &'static str,
        value: String,
        origin: String,
    },
    #[error(
        "no state directory: neither --state-dir, $STATE_DIRECTORY, [store] directory, $XDG_STATE_HOME nor $HOME is set; pass --state-dir"
    )]
    NoStateDir,
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

#[derive(Debug, Clone)]
pub struct StoreSettings {
    pub queue_depth: usize,
    pub max_live_tasks: u64,
    pub checkpoint_interval: Duration,
    pub max_db_pages: u64,
}

#[derive(Debug, Clone)]
pub struct ServerSettings {
    pub listen: SocketAddr,
    pub max_connections: usize,
    pub max_concurrent_requests: usize,
    pub max_request_bytes: usize,
}

#[derive(Debug, Clone)]
pub struct TaskSettings {
    pub default_ttl: Duration,
    pub poll_interval: Duration,
    pub max_running: usize,
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

/// A command tool, validated.
#[derive(Debug, Clone)]
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
}

#[derive(Debug, Clone)]
pub struct Config {
    pub config_file: Option<PathBuf>,
    pub state_dir: PathBuf,
    pub state_dir_source: StateDirSource,
    pub server: ServerSettings,
    pub store: StoreSettings,
    pub tasks: TaskSettings,
    pub tools: Vec<ToolConfig>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    server: RawServer,
    #[serde(default)]
    store: RawStore,
    #[serde(default)]
    tasks: RawTasks,
    #[serde(default)]
    tool: Vec<RawTool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    listen: Option<String>,
    max_connections: Option<u64>,
    max_concurrent_requests: Option<u64>,
    max_request_bytes: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTasks {
    default_ttl_secs: Option<u64>,
    poll_interval_ms: Option<u64>,
    max_running: Option<u64>,
    cancel_grace_ms: Option<u64>,
    artifacts_max_total_bytes: Option<u64>,
    artifact_max_bytes: Option<u64>,
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
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStore {
    directory: Option<PathBuf>,
    queue_depth: Option<u64>,
    max_live_tasks: Option<u64>,
    checkpoint_interval_secs: Option<u64>,
    max_db_pages: Option<u64>,
}

/// Records, per dotted key, where its value came from.
#[derive(Default)]
struct Origins(BTreeMap<String, String>);

impl Origins {
    fn of(&self, key: &str) -> String {
        self.0
            .get(key)
            .cloned()
            .unwrap_or_else(|| "the embedded default".to_string())
    }

    fn record_table(&mut self, table: &toml::Table, origin: &str) {
        for (section, value) in table {
            match value.as_table() {
                Some(inner) => {
                    for key in inner.keys() {
                        self.0
                            .insert(format!("{section}.{key}"), origin.to_string());
                    }
                }
                None => {
                    self.0.insert(section.clone(), origin.to_string());
                }
            }
        }
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
        let mut origins = Origins::default();
        let config_file = overrides
            .config_path
            .clone()
            .or_else(|| env.get(ENV_CONFIG_PATH).map(PathBuf::from));

        let mut merged = toml::Table::new();
        if let Some(path) = &config_file {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.clone(),
                source,
            })?;
            let origin = path.display().to_string();
            // Deserialise the file alone first so an unknown key is blamed on
            // it, with its line.
            toml::from_str::<RawConfig>(&text).map_err(|e| invalid_toml(&origin, &text, &e))?;
            let table: toml::Table = text
                .parse()
                .map_err(|e: toml::de::Error| invalid_toml(&origin, &text, &e))?;
            origins.record_table(&table, &origin);
            merge_into(&mut merged, table);
        }

        let (env_table, env_origins) = env_overlay(env)?;
        origins.0.extend(env_origins);
        merge_into(&mut merged, env_table);

        let raw = RawConfig::deserialize(toml::Value::Table(merged)).map_err(|e| {
            ConfigError::Invalid {
                origin: "configuration".into(),
                message: e.message().to_string(),
            }
        })?;

        let listen_origin;
        let listen_text = match &overrides.listen {
            Some(l) => {
                listen_origin = "flag --listen".to_string();
                l.clone()
            }
            None => {
                listen_origin = origins.of("server.listen");
                raw.server
                    .listen
                    .clone()
                    .unwrap_or_else(|| DEFAULT_LISTEN.to_string())
            }
        };
        let listen: SocketAddr = listen_text.parse().map_err(|_| ConfigError::BadAddress {
            key: "server.listen",
            value: listen_text.clone(),
            origin: listen_origin,
        })?;

        let store = StoreSettings {
            queue_depth: bounded(
                "store.queue_depth",
                raw.store.queue_depth,
                bounds::QUEUE_DEPTH_DEFAULT,
                bounds::QUEUE_DEPTH,
                &origins,
            )? as usize,
            max_live_tasks: bounded(
                "store.max_live_tasks",
                raw.store.max_live_tasks,
                bounds::MAX_LIVE_TASKS_DEFAULT,
                bounds::MAX_LIVE_TASKS,
                &origins,
            )?,
            checkpoint_interval: Duration::from_secs(bounded(
                "store.checkpoint_interval_secs",
                raw.store.checkpoint_interval_secs,
                bounds::CHECKPOINT_INTERVAL_SECS_DEFAULT,
                bounds::CHECKPOINT_INTERVAL_SECS,
                &origins,
            )?),
            max_db_pages: bounded(
                "store.max_db_pages",
                raw.store.max_db_pages,
                bounds::MAX_DB_PAGES_DEFAULT,
                bounds::MAX_DB_PAGES,
                &origins,
            )?,
        };

        if let Some(dir) = &raw.store.directory {
            require_absolute("store.directory", dir, origins.of("store.directory"))?;
        }
        let (state_dir, state_dir_source) = resolve_state_dir(overrides, env, &raw, &origins)?;

        let server = ServerSettings {
            listen,
            max_connections: bounded(
                "server.max_connections",
                raw.server.max_connections,
                bounds::MAX_CONNECTIONS_DEFAULT,
                bounds::MAX_CONNECTIONS,
                &origins,
            )? as usize,
            max_concurrent_requests: bounded(
                "server.max_concurrent_requests",
                raw.server.max_concurrent_requests,
                bounds::MAX_CONCURRENT_REQUESTS_DEFAULT,
                bounds::MAX_CONCURRENT_REQUESTS,
                &origins,
            )? as usize,
            max_request_bytes: bounded(
                "server.max_request_bytes",
                raw.server.max_request_bytes,
                bounds::MAX_REQUEST_BYTES_DEFAULT,
                bounds::MAX_REQUEST_BYTES,
                &origins,
            )? as usize,
        };
        let tasks = task_settings(&raw.tasks, &origins)?;
        let tools = tool_settings(raw.tool, &origins)?;

        Ok(Config {
            config_file,
            state_dir,
            state_dir_source,
            server,
            store,
            tasks,
            tools,
        })
    }
}

fn resolve_state_dir(
    overrides: &Overrides,
    env: &HashMap<String, String>,
    raw: &RawConfig,
    origins: &Origins,
) -> Result<(PathBuf, StateDirSource), ConfigError> {
    if let Some(dir) = &overrides.state_dir {
        require_absolute("--state-dir", dir, "the command line".into())?;
        return Ok((dir.clone(), StateDirSource::Flag));
    }
    if let Some(list) = env.get("STATE_DIRECTORY").filter(|s| !s.is_empty()) {
        // systemd joins several StateDirectory= entries with ':'; ours is the first.
        let first = PathBuf::from(list.split(':').next().unwrap_or(list));
        require_absolute("$STATE_DIRECTORY", &first, "the environment".into())?;
        return Ok((first, StateDirSource::SystemdStateDirectory));
    }
    if let Some(dir) = &raw.store.directory {
        return Ok((
            dir.clone(),
            StateDirSource::Configured(origins.of("store.directory")),
        ));
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

fn task_settings(raw: &RawTasks, origins: &Origins) -> Result<TaskSettings, ConfigError> {
    let artifacts_max_total_bytes = bounded(
        "tasks.artifacts_max_total_bytes",
        raw.artifacts_max_total_bytes,
        bounds::ARTIFACTS_MAX_TOTAL_BYTES_DEFAULT,
        bounds::ARTIFACTS_MAX_TOTAL_BYTES,
        origins,
    )?;
    let artifact_max_bytes = bounded(
        "tasks.artifact_max_bytes",
        raw.artifact_max_bytes,
        bounds::ARTIFACT_MAX_BYTES_DEFAULT,
        bounds::ARTIFACT_MAX_BYTES.start().to_owned()..=artifacts_max_total_bytes,
        origins,
    )?;
    Ok(TaskSettings {
        default_ttl: Duration::from_secs(bounded(
            "tasks.default_ttl_secs",
            raw.default_ttl_secs,
            bounds::DEFAULT_TTL_SECS_DEFAULT,
            bounds::DEFAULT_TTL_SECS,
            origins,
        )?),
        poll_interval: Duration::from_millis(bounded(
            "tasks.poll_interval_ms",
            raw.poll_interval_ms,
            bounds::POLL_INTERVAL_MS_DEFAULT,
            bounds::POLL_INTERVAL_MS,
            origins,
        )?),
        max_running: bounded(
            "tasks.max_running",
            raw.max_running,
            bounds::MAX_RUNNING_DEFAULT,
            bounds::MAX_RUNNING,
            origins,
        )? as usize,
        cancel_grace: Duration::from_millis(bounded(
            "tasks.cancel_grace_ms",
            raw.cancel_grace_ms,
            bounds::CANCEL_GRACE_MS_DEFAULT,
            bounds::CANCEL_GRACE_MS,
            origins,
        )?),
        artifacts_max_total_bytes,
        artifact_max_bytes,
    })
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

fn tool_settings(raw: Vec<RawTool>, origins: &Origins) -> Result<Vec<ToolConfig>, ConfigError> {
    let origin = origins.of("tool");
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
        let key = |k: &str| format!("tool.{}.{k}", t.name);
        let range = |k: &'static str, v: Option<u64>, d: u64, r: RangeInclusive<u64>| {
            let value = v.unwrap_or(d);
            if r.contains(&value) {
                Ok(value)
            } else {
                Err(ConfigError::Invalid {
                    origin: origin.clone(),
                    message: format!(
                        "{} = {value} is out of range {}..={}",
                        key(k),
                        r.start(),
                        r.end()
                    ),
                })
            }
        };
        tools.push(ToolConfig {
            timeout: Duration::from_secs(range(
                "timeout_secs",
                t.timeout_secs,
                bounds::TOOL_TIMEOUT_SECS_DEFAULT,
                bounds::TOOL_TIMEOUT_SECS,
            )?),
            max_stdout_bytes: range(
                "max_stdout_bytes",
                t.max_stdout_bytes,
                bounds::TOOL_MAX_STDOUT_BYTES_DEFAULT,
                bounds::TOOL_MAX_STDOUT_BYTES,
            )?,
            max_stderr_bytes: range(
                "max_stderr_bytes",
                t.max_stderr_bytes,
                bounds::TOOL_MAX_STDERR_BYTES_DEFAULT,
                bounds::TOOL_MAX_STDERR_BYTES,
            )?,
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

fn require_absolute(key: &'static str, path: &Path, origin: String) -> Result<(), ConfigError> {
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

fn bounded(
    key: &'static str,
    value: Option<u64>,
    default: u64,
    range: RangeInclusive<u64>,
    origins: &Origins,
) -> Result<u64, ConfigError> {
    let v = value.unwrap_or(default);
    if range.contains(&v) {
        Ok(v)
    } else {
        Err(ConfigError::OutOfRange {
            key,
            value: v,
            origin: origins.of(key),
            min: *range.start(),
            max: *range.end(),
        })
    }
}

/// Turns `TASKGATE_<SECTION>_<KEY>=value` into `[section] key = value`.
fn env_overlay(
    env: &HashMap<String, String>,
) -> Result<(toml::Table, BTreeMap<String, String>), ConfigError> {
    let mut table = toml::Table::new();
    let mut origins = BTreeMap::new();
    let mut names: Vec<&String> = env.keys().collect();
    names.sort();
    for name in names {
        let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        if name == ENV_CONFIG_PATH || name == ENV_LOG || name.starts_with(ENV_RESERVED_PREFIX) {
            continue;
        }
        let Some((section, key)) = rest.split_once('_') else {
            return Err(ConfigError::Invalid {
                origin: format!("environment variable {name}"),
                message: "not a setting; settings are named TASKGATE_<SECTION>_<KEY>, for example TASKGATE_STORE_QUEUE_DEPTH".into(),
            });
        };
        let (section, key) = (section.to_ascii_lowercase(), key.to_ascii_lowercase());
        let raw = &env[name];
        // A value that parses as a TOML scalar (number, boolean) keeps that
        // type; anything else is a string, so paths need no quoting.
        let value = parse_scalar(raw).unwrap_or_else(|| toml::Value::String(raw.clone()));
        let mut one = toml::Table::new();
        let mut inner = toml::Table::new();
        inner.insert(key.clone(), value);
        one.insert(section.clone(), toml::Value::Table(inner));
        RawConfig::deserialize(toml::Value::Table(one.clone())).map_err(|e| {
            ConfigError::Invalid {
                origin: format!("environment variable {name}"),
                message: format!("[{section}] {key}: {}", e.message()),
            }
        })?;
        origins.insert(
            format!("{section}.{key}"),
            format!("environment variable {name}"),
        );
        merge_into(&mut table, one);
    }
    Ok((table, origins))
}

fn parse_scalar(raw: &str) -> Option<toml::Value> {
    let doc: toml::Table = format!("v = {raw}").parse().ok()?;
    match doc.get("v")? {
        v @ (toml::Value::Integer(_) | toml::Value::Boolean(_) | toml::Value::Float(_)) => {
            Some(v.clone())
        }
        _ => None,
    }
}

fn merge_into(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge_into(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
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

/// The state directory of the packaged service (systemd's StateDirectory=).
pub const PACKAGE_STATE_DIR: &str = "/var/lib/taskgate";

/// The commented starter configuration written by `taskgate init`; with a
/// directory, `[store] directory` is set to it (the packaged file sets the
/// service's, so that `taskgate check --config` run by an operator looks
/// where the service keeps its state).
pub fn starter_config(directory: Option<&str>) -> String {
    let directory = match directory {
        Some(d) => format!("directory = {:?}", d),
        None => format!("# directory = {PACKAGE_STATE_DIR:?}"),
    };
    format!(
        r#"# taskgate configuration. Every key is optional; the values shown are the
# defaults. Settings are read once at startup. Any key can also be set in the
# environment as TASKGATE_<SECTION>_<KEY>, e.g. TASKGATE_STORE_QUEUE_DEPTH=256;
# command-line flags override both. See taskgate.toml(5).

[server]
# Address of the HTTP endpoint (/mcp, /healthz, /readyz). Loopback only until
# authentication is configured.
listen = "{listen}"
# Open connections, and /mcp requests in flight; past either a client gets
# 503 at once.
max_connections = {conns}
max_concurrent_requests = {reqs}
# Largest request body in bytes.
max_request_bytes = {body}

[store]
# Private state directory (absolute path, mode 0700, owned by the service
# user). Under systemd $STATE_DIRECTORY takes precedence; when neither is
# set, $XDG_STATE_HOME/taskgate (~/.local/state/taskgate), created on first
# start.
{directory}

# Commands waiting for the store thread; more are refused at once as busy.
queue_depth = {queue}

# Unexpired tasks retained at most; creation beyond it is refused (capacity).
max_live_tasks = {live}

# Seconds between wal_checkpoint(TRUNCATE) runs (also run at clean shutdown).
checkpoint_interval_secs = {ckpt}

# SQLite page cap (4 KiB pages): 1048576 pages = 4 GiB.
max_db_pages = {pages}

[tasks]
# How long a task stays readable after creation; a finished task stays at
# least one hour after it finished.
default_ttl_secs = {ttl}
# The poll interval clients are told to keep; faster polling is refused.
poll_interval_ms = {poll}
# Background tasks running at once; past it a call runs synchronously.
max_running = {running}
# Between SIGTERM and SIGKILL when a task is cancelled or the daemon stops.
cancel_grace_ms = {grace}
# Disk space for results over 16 KiB, in total and per result.
artifacts_max_total_bytes = {art_total}
artifact_max_bytes = {art_one}

# Tools are commands. This one would run `/usr/bin/date -u +FORMAT` as a
# background task for clients that negotiate Tasks; see taskgate.toml(5).
#
# [[tool]]
# name = "utc_date"
# description = "Prints the current UTC date in the given strftime format."
# argv = ["/usr/bin/date", "-u", "+{{format}}"]
# effect = "read_only"          # read_only | idempotent_write | non_idempotent_write
# task = "optional"             # never | optional | required
# timeout_secs = 10
# [tool.input_schema]
# type = "object"
# required = ["format"]
# [tool.input_schema.properties.format]
# type = "string"
# maxLength = 64
"#,
        listen = DEFAULT_LISTEN,
        conns = bounds::MAX_CONNECTIONS_DEFAULT,
        reqs = bounds::MAX_CONCURRENT_REQUESTS_DEFAULT,
        body = bounds::MAX_REQUEST_BYTES_DEFAULT,
        queue = bounds::QUEUE_DEPTH_DEFAULT,
        live = bounds::MAX_LIVE_TASKS_DEFAULT,
        ckpt = bounds::CHECKPOINT_INTERVAL_SECS_DEFAULT,
        pages = bounds::MAX_DB_PAGES_DEFAULT,
        ttl = bounds::DEFAULT_TTL_SECS_DEFAULT,
        poll = bounds::POLL_INTERVAL_MS_DEFAULT,
        running = bounds::MAX_RUNNING_DEFAULT,
        grace = bounds::CANCEL_GRACE_MS_DEFAULT,
        art_total = bounds::ARTIFACTS_MAX_TOTAL_BYTES_DEFAULT,
        art_one = bounds::ARTIFACT_MAX_BYTES_DEFAULT,
    )
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
                ("TASKGATE_STORE_DIRECTORY", "/srv/tg"),
            ]),
        )
        .unwrap();
        assert_eq!(c.state_dir, PathBuf::from("/var/lib/taskgate"));
        let over = Overrides {
            state_dir: Some("/flag".into()),
            ..Default::default()
        };
        let c =
            Config::load_from(&over, &env(&[("STATE_DIRECTORY", "/var/lib/taskgate")])).unwrap();
        assert_eq!(c.state_dir_source, StateDirSource::Flag);
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
        // The commented tool example is a valid tool once uncommented.
        let tool: String = starter_config(None)
            .lines()
            .skip_while(|l| !l.starts_with("# [[tool]]"))
            .map(|l| {
                format!(
                    "{}\n",
                    l.trim_start_matches("# ").split("  #").next().unwrap_or("")
                )
            })
            .collect();
        std::fs::write(&file, tool).unwrap();
        let c = Config::load_from(&over, &env(&[("HOME", "/h")])).unwrap();
        assert_eq!(c.tools.len(), 1);
        crate::exec::Registry::build(&c.tools).unwrap();
    }
}
