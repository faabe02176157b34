//! `[[upstream]]`: the MCP servers whose tools taskgate offers as its own.
//! The settings only: connecting, listing and calling are `upstream`'s;
//! here a table is only well-formed and consistent with itself.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::keys::{self, ToolLimits, ToolsSettings, UpstreamLimits};
use super::settings::{Layers, with_limit_fields};
use super::{
    Approval, ConfigError, Effect, MAX_APPROVAL_PREVIEW_FIELDS, Sandbox, TaskMode, ToolConfig,
    ToolConfinement, invalid_toml,
};
use crate::process_limits::{ProcessLimits, for_each_limit};

/// The name of the pins file, in the configuration file's directory (see
/// `upstream::pins`).
pub const PINS_FILE_NAME: &str = "upstream-pins.toml";

/// The pins file that goes with a configuration file: beside it.
pub fn pins_file(config_file: &Path) -> PathBuf {
    config_file
        .parent()
        .unwrap_or(Path::new("/"))
        .join(PINS_FILE_NAME)
}

/// Most `[[upstream]]` tables a configuration may declare.
pub const MAX_UPSTREAMS: usize = 64;

/// Longest alias: the alias, a dot and the upstream's tool name make the
/// name a caller sees, which MCP bounds at 128 characters.
pub const MAX_ALIAS_LEN: usize = 32;

/// Most per-tool tables under one upstream.
const MAX_TOOL_OVERRIDES: usize = 1024;

/// How taskgate reaches an upstream.
#[derive(Debug, Clone, PartialEq)]
pub enum UpstreamTransport {
    /// A child process speaking MCP on its stdin and stdout, started
    /// through the same shim and confinement as a command tool (whose
    /// table keys it shares: argv, env, working_dir, sandbox, read_paths,
    /// write_paths; its resource limits are the `[tools]` ones).
    Stdio(Box<ToolConfig>),
    /// A streamable-HTTP endpoint.
    Http {
        url: String,
        /// A file holding the bearer credential taskgate presents (never
        /// the caller's); read at each connection, never from this text.
        bearer_token_file: Option<PathBuf>,
        /// PEM certificates to trust for an `https` URL instead of the
        /// system's.
        ca_file: Option<PathBuf>,
    },
}

/// What the operator says of one tool of an upstream.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UpstreamToolSettings {
    pub effect: Option<Effect>,
    pub task: Option<TaskMode>,
    /// Whether each exact call waits for an administrator, as for a
    /// `[[tool]]`.
    pub approval: Approval,
    /// Argument fields an administrator sees with a held call. The
    /// upstream's schema is only known once it is listed: a field it does
    /// not have withholds the tool (see `upstream::tool`).
    pub approval_preview: Vec<String>,
}

/// Which answers of a provider must carry the execution envelope back for a
/// durable route to trust them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RouteEcho {
    /// The task's creation and every `tasks/get` answer: an answer without
    /// the echo, or with any part of it changed, never ends a route.
    #[default]
    EveryAnswer,
    /// The creation only; a `tasks/get` answer without an echo is taken
    /// when its task ID is the bound one (an echo that is present must
    /// still match). Weaker: for providers that cannot echo on a poll.
    CreationOnly,
}

impl RouteEcho {
    /// As the configuration file, `upstream list`, `routes show` and
    /// `status` write it.
    pub fn as_str(self) -> &'static str {
        match self {
            RouteEcho::EveryAnswer => "every_answer",
            RouteEcho::CreationOnly => "creation_only",
        }
    }
}

/// One `[[upstream]]` table.
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamConfig {
    pub alias: String,
    pub transport: UpstreamTransport,
    /// The effect of its tools unless a tool's own table says otherwise;
    /// never taken from the upstream's annotation hints.
    pub effect: Effect,
    /// Whether its tools run as taskgate tasks, unless a tool's own table
    /// says otherwise.
    pub task: TaskMode,
    /// Per-tool settings, by the upstream's own tool name.
    pub tools: BTreeMap<String, UpstreamToolSettings>,
    pub limits: UpstreamLimits,
    /// Which of its answers must echo a durable route's envelope.
    pub route_echo: RouteEcho,
    /// Where it was declared.
    pub origin: String,
}

impl UpstreamConfig {
    /// The effect and task mode the operator gave the upstream's tool `name`.
    pub fn tool_settings(&self, name: &str) -> (Effect, TaskMode) {
        let own = self.tools.get(name);
        (
            own.and_then(|t| t.effect).unwrap_or(self.effect),
            own.and_then(|t| t.task).unwrap_or(self.task),
        )
    }

    /// The preview fields of the upstream's tool `name` when its calls
    /// wait for an administrator; `None` when they do not.
    pub fn tool_approval(&self, name: &str) -> Option<&[String]> {
        self.tools
            .get(name)
            .filter(|t| t.approval == Approval::Required)
            .map(|t| t.approval_preview.as_slice())
    }

    /// `stdio` or `http`, as `status` shows it.
    pub fn kind(&self) -> &'static str {
        match self.transport {
            UpstreamTransport::Stdio(_) => "stdio",
            UpstreamTransport::Http { .. } => "http",
        }
    }

    /// Where it is: the program, or the URL.
    pub fn target(&self) -> String {
        match &self.transport {
            UpstreamTransport::Stdio(tool) => tool.argv.first().cloned().unwrap_or_default(),
            UpstreamTransport::Http { url, .. } => url.clone(),
        }
    }
}

for_each_limit!(with_limit_fields! {
/// The shape of an `[[upstream]]` table, deserialised from the file's text
/// so that an unknown key or a value of the wrong type is named with its
/// line. Its bounded keys ([`keys::UPSTREAM_KEYS`]) are read from the
/// table through their definitions ([`UpstreamLimits`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawUpstream {
    alias: String,
    command: Option<Vec<String>>,
    env: Option<Vec<String>>,
    working_dir: Option<PathBuf>,
    sandbox: Option<Sandbox>,
    read_paths: Option<Vec<PathBuf>>,
    write_paths: Option<Vec<PathBuf>>,
    url: Option<String>,
    bearer_token_file: Option<PathBuf>,
    ca_file: Option<PathBuf>,
    effect: Option<Effect>,
    task: Option<TaskMode>,
    route_echo: Option<RouteEcho>,
    tools: Option<BTreeMap<String, RawUpstreamTool>>,
    #[allow(dead_code, reason = "read through UPSTREAM_CONNECT_TIMEOUT_SECS")]
    connect_timeout_secs: Option<u64>,
    #[allow(dead_code, reason = "read through UPSTREAM_REQUEST_TIMEOUT_SECS")]
    request_timeout_secs: Option<u64>,
    #[allow(dead_code, reason = "read through UPSTREAM_MAX_RESPONSE_BYTES")]
    max_response_bytes: Option<u64>,
    #[allow(dead_code, reason = "read through UPSTREAM_MAX_CONCURRENT_REQUESTS")]
    max_concurrent_requests: Option<u64>,
    #[allow(dead_code, reason = "read through UPSTREAM_MAX_TOOLS")]
    max_tools: Option<u64>,
    // Then a command upstream's resource limits, as a `[[tool]]` sets them.
}
});

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUpstreamTool {
    effect: Option<Effect>,
    task: Option<TaskMode>,
    approval: Option<Approval>,
    approval_preview: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
struct RawFile {
    #[serde(default)]
    upstream: Vec<RawUpstream>,
}

/// The `[[upstream]]` tables of a file, deserialised from its text so that
/// an error in one points at its line.
pub(super) fn raw_upstreams(origin: &str, text: &str) -> Result<Vec<RawUpstream>, ConfigError> {
    #[derive(Deserialize)]
    struct Loose {
        #[serde(default)]
        upstream: Option<toml::Value>,
    }
    // Only a file that has the tables pays for their shape.
    let loose: Loose = toml::from_str(text).map_err(|e| invalid_toml(origin, text, &e))?;
    if loose.upstream.is_none() {
        return Ok(Vec::new());
    }
    toml::from_str::<RawFile>(text)
        .map(|f| f.upstream)
        .map_err(|e| invalid_toml(origin, text, &e))
}

/// An alias: what prefixes its tools' names, so no dot in it.
pub fn valid_alias(alias: &str) -> bool {
    !alias.is_empty()
        && alias.len() <= MAX_ALIAS_LEN
        && alias
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
}

/// Whether an `http://` URL stays on this host: plain HTTP would carry the
/// credential and the calls in the clear anywhere else.
fn loopback_host(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if bare.eq_ignore_ascii_case("localhost") {
        return true;
    }
    bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The scheme and host of a URL this daemon may call, or why not.
fn check_url(url: &str) -> Result<(), String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| format!("url {url:?} is not an absolute http:// or https:// URL"))?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.is_empty() || authority.contains('@') {
        return Err(format!(
            "url {url:?} has no host, or carries user information (put a credential in bearer_token_file)"
        ));
    }
    let host = match authority.rfind(':') {
        Some(i) if !authority[i..].contains(']') => &authority[..i],
        _ => authority,
    };
    match scheme {
        "https" => Ok(()),
        "http" if loopback_host(host) => Ok(()),
        "http" => Err(format!(
            "url {url:?} is plain HTTP to another host; use https://, or an http:// URL on loopback (127.0.0.1, ::1, localhost)"
        )),
        other => Err(format!(
            "url {url:?} has scheme {other:?}; use http:// (loopback only) or https://"
        )),
    }
}

fn absolute(key: &str, path: &Option<PathBuf>) -> Result<(), String> {
    match path {
        Some(p) if !p.is_absolute() => Err(format!(
            "{key} {p:?} is a relative path; give an absolute path"
        )),
        _ => Ok(()),
    }
}

/// The `[[upstream]]` tables, each well-formed: an alias, exactly one of
/// `command` and `url` with only the keys that go with it, and no task
/// for a tool whose effect is a non-idempotent write.
pub(super) fn settings(
    raw: Vec<(RawUpstream, toml::Table)>,
    origin: &str,
    layers: &Layers,
    defaults: &ToolsSettings,
) -> Result<Vec<UpstreamConfig>, ConfigError> {
    super::at_most(raw.len(), MAX_UPSTREAMS, "[[upstream]] tables", origin)?;
    let mut upstreams: Vec<UpstreamConfig> = Vec::with_capacity(raw.len());
    for (u, table) in raw {
        let at = format!("{origin}: [[upstream]] {:?}", u.alias);
        let bad = |message: String| ConfigError::Invalid {
            origin: at.clone(),
            message,
        };
        if !valid_alias(&u.alias) {
            return Err(bad(format!(
                "alias must be 1-{MAX_ALIAS_LEN} characters of A-Z a-z 0-9 _ - (no dot: its tools are offered as ALIAS.TOOL)"
            )));
        }
        if upstreams.iter().any(|o| o.alias == u.alias) {
            return Err(bad(
                "declared twice; each upstream has one table and its own alias".into(),
            ));
        }
        let transport = match (&u.command, &u.url) {
            (Some(_), Some(_)) | (None, None) => {
                return Err(bad(
                    "give exactly one of command (a program speaking MCP on stdio) and url (a streamable-HTTP endpoint)".into(),
                ));
            }
            (Some(argv), None) => {
                if u.bearer_token_file.is_some() || u.ca_file.is_some() {
                    return Err(bad(
                        "bearer_token_file and ca_file are for a url upstream; a command upstream has none".into(),
                    ));
                }
                super::Program {
                    argv_key: "command",
                    argv,
                    working_dir: &u.working_dir,
                    env: &u.env,
                    read_paths: &u.read_paths,
                    write_paths: &u.write_paths,
                }
                .check()
                .map_err(bad)?;
                let env = u.env.clone().unwrap_or_default();
                // The process is described as a command tool is, so that
                // it is confined by the same code; a resource limit its
                // table leaves out is the `[tools]` one.
                let own: toml::Table = table
                    .iter()
                    .filter(|(k, _)| ProcessLimits::named(k).is_some())
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                let limits = ToolLimits::load(&Layers::table(
                    keys::TOOL_KEYS,
                    &own,
                    layers,
                    &at,
                    String::new(),
                ))?;
                UpstreamTransport::Stdio(Box::new(ToolConfig {
                    name: u.alias.clone(),
                    description: String::new(),
                    argv: argv.clone(),
                    input_schema: serde_json::json!({"type": "object"}),
                    working_dir: u.working_dir.clone(),
                    env,
                    effect: Effect::NonIdempotentWrite,
                    task: TaskMode::Never,
                    approval: super::Approval::Never,
                    approval_preview: Vec::new(),
                    limits,
                    confinement: ToolConfinement {
                        sandbox: u.sandbox.unwrap_or_default(),
                        read_paths: u
                            .read_paths
                            .clone()
                            .unwrap_or_else(|| defaults.read_paths.clone()),
                        write_paths: u.write_paths.clone().unwrap_or_default(),
                    },
                    origin: origin.to_string(),
                }))
            }
            (None, Some(url)) => {
                if u.env.is_some()
                    || u.working_dir.is_some()
                    || u.sandbox.is_some()
                    || u.read_paths.is_some()
                    || u.write_paths.is_some()
                    || ProcessLimits::LIMITS
                        .iter()
                        .any(|l| table.contains_key(l.name))
                {
                    let limits: Vec<&str> = ProcessLimits::LIMITS.iter().map(|l| l.name).collect();
                    return Err(bad(format!(
                        "env, working_dir, sandbox, read_paths, write_paths and the process limits ({}) are for a command upstream; a url upstream has none",
                        limits.join(", ")
                    )));
                }
                check_url(url).map_err(bad)?;
                absolute("bearer_token_file", &u.bearer_token_file).map_err(bad)?;
                absolute("ca_file", &u.ca_file).map_err(bad)?;
                if u.ca_file.is_some() && !url.starts_with("https://") {
                    return Err(bad("ca_file is only for an https:// url".into()));
                }
                UpstreamTransport::Http {
                    url: url.clone(),
                    bearer_token_file: u.bearer_token_file.clone(),
                    ca_file: u.ca_file.clone(),
                }
            }
        };
        let raw_tools = u.tools.unwrap_or_default();
        if raw_tools.len() > MAX_TOOL_OVERRIDES {
            return Err(bad(format!(
                "{} tool tables; at most {MAX_TOOL_OVERRIDES} are allowed",
                raw_tools.len()
            )));
        }
        let mut tools: BTreeMap<String, UpstreamToolSettings> = BTreeMap::new();
        for (name, t) in raw_tools {
            let settings = tool_settings(t).map_err(|e| bad(format!("tools.{name}: {e}")))?;
            tools.insert(name, settings);
        }
        let effect = u.effect.unwrap_or(Effect::NonIdempotentWrite);
        let task = u.task.unwrap_or(TaskMode::Never);
        let limits = UpstreamLimits::load(&Layers::table(
            keys::UPSTREAM_KEYS,
            &table,
            &Layers::default(),
            &at,
            String::new(),
        ))?;
        let config = UpstreamConfig {
            alias: u.alias,
            transport,
            effect,
            task,
            tools,
            limits,
            route_echo: u.route_echo.unwrap_or_default(),
            origin: origin.to_string(),
        };
        // The same rule as for a command tool (`Effect::forbids`), for the
        // default and for each tool's own table.
        let background_write = |(effect, task): (Effect, TaskMode)| effect.forbids(task);
        if background_write((config.effect, config.task)) {
            return Err(bad(
                "task is optional or required for tools whose effect is non_idempotent_write (a restart would leave their effect unknown); set effect = \"read_only\" or \"idempotent_write\" if that is true, or task = \"never\"".into(),
            ));
        }
        if let Some(name) = config
            .tools
            .keys()
            .find(|name| background_write(config.tool_settings(name)))
        {
            return Err(bad(format!(
                "tools.{name}: a non_idempotent_write tool cannot run as a task (a restart would leave its effect unknown); set its effect to read_only or idempotent_write if that is true, or its task to never"
            )));
        }
        upstreams.push(config);
    }
    Ok(upstreams)
}

/// One `[upstream.tools.NAME]` table, its approval keys held to the rules
/// of a `[[tool]]`'s (what can be checked before the upstream lists its
/// schema).
fn tool_settings(t: RawUpstreamTool) -> Result<UpstreamToolSettings, String> {
    let approval = t.approval.unwrap_or_default();
    let approval_preview = t.approval_preview.unwrap_or_default();
    if !approval_preview.is_empty() && approval != Approval::Required {
        return Err(
            "approval_preview is shown with a held call; it needs approval = \"required\"".into(),
        );
    }
    if approval_preview.len() > MAX_APPROVAL_PREVIEW_FIELDS {
        return Err(format!(
            "approval_preview lists {} fields; at most {MAX_APPROVAL_PREVIEW_FIELDS}",
            approval_preview.len()
        ));
    }
    Ok(UpstreamToolSettings {
        effect: t.effect,
        task: t.task,
        approval,
        approval_preview,
    })
}

/// The upstream whose alias prefixes a command tool's name, if any: a
/// `[[tool]]` named `files.search` would shadow, or be shadowed by, the
/// tool `search` of the upstream `files`.
pub(super) fn shadowed<'a>(
    tool: &str,
    upstreams: &'a [UpstreamConfig],
) -> Option<&'a UpstreamConfig> {
    let (prefix, _) = tool.split_once('.')?;
    upstreams.iter().find(|u| u.alias == prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_leave_loopback_only_over_tls() {
        for ok in [
            "http://127.0.0.1:8000/mcp",
            "http://localhost/mcp",
            "http://[::1]:9/mcp",
            "https://tools.example.internal/mcp",
            "http://127.0.0.2:1",
        ] {
            assert_eq!(check_url(ok), Ok(()), "{ok}");
        }
        for bad in [
            "http://10.0.0.1/mcp",
            "http://example.com/mcp",
            "ftp://127.0.0.1/",
            "127.0.0.1:80",
            "https://user:pw@h/mcp",
            "http://localhost.evil.test/mcp",
            "http:///mcp",
        ] {
            assert!(check_url(bad).is_err(), "{bad}");
        }
    }

    fn load(text: &str) -> Result<super::super::Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("taskgate.toml");
        std::fs::write(&file, text).unwrap();
        let over = super::super::Overrides {
            config_path: Some(file),
            ..Default::default()
        };
        let env = [("HOME".to_string(), "/h".to_string())]
            .into_iter()
            .collect();
        super::super::Config::load_from(&over, &env)
    }

    #[test]
    fn tables_are_refused_naming_what_to_change() {
        let stdio = "[[upstream]]\nalias = \"a\"\ncommand = [\"/bin/true\"]\n";
        let c = load(&format!("{stdio}effect = \"read_only\"\ntask = \"optional\"\nmax_cpu_secs = 9\n[upstream.tools.x]\neffect = \"idempotent_write\"\n")).unwrap();
        let u = &c.upstreams[0];
        assert_eq!(
            u.tool_settings("x"),
            (Effect::IdempotentWrite, TaskMode::Optional)
        );
        assert_eq!(u.tool_settings("y"), (Effect::ReadOnly, TaskMode::Optional));
        let UpstreamTransport::Stdio(process) = &u.transport else {
            panic!("{u:?}")
        };
        assert_eq!(process.limits.max_cpu_secs, 9);
        assert_eq!(u.limits, UpstreamLimits::default());
        for (text, says) in [
            ("[[upstream]]\nalias = \"a\"\n", "exactly one of command"),
            (
                "[[upstream]]\nalias = \"a\"\ncommand = [\"/bin/true\"]\nurl = \"http://127.0.0.1/mcp\"\n",
                "exactly one of command",
            ),
            (
                "[[upstream]]\nalias = \"a.b\"\ncommand = [\"/bin/true\"]\n",
                "no dot",
            ),
            (&format!("{stdio}{stdio}"), "declared twice"),
            (
                "[[upstream]]\nalias = \"a\"\ncommand = [\"true\"]\n",
                "absolute path",
            ),
            (
                "[[upstream]]\nalias = \"a\"\nurl = \"http://10.1.2.3/mcp\"\n",
                "https://",
            ),
            (
                "[[upstream]]\nalias = \"a\"\nurl = \"http://127.0.0.1/mcp\"\nread_paths = [\"/srv\"]\n",
                "for a command upstream",
            ),
            (
                "[[upstream]]\nalias = \"a\"\nurl = \"http://127.0.0.1/mcp\"\nmax_cpu_secs = 5\n",
                "for a command upstream",
            ),
            (
                &format!("{stdio}bearer_token_file = \"/t\"\n"),
                "for a url upstream",
            ),
            (
                &format!("{stdio}task = \"optional\"\n"),
                "non_idempotent_write",
            ),
            (
                &format!("{stdio}[upstream.tools.x]\ntask = \"required\"\n"),
                "tools.x: a non_idempotent_write tool",
            ),
            (&format!("{stdio}max_tools = 0\n"), "max_tools"),
            (&format!("{stdio}surprise = 1\n"), "surprise"),
            (
                &format!("{stdio}[[tool]]\nname = \"a.b\"\nargv = [\"/bin/true\"]\n"),
                "alias of [[upstream]] \"a\"",
            ),
        ] {
            let e = load(text).unwrap_err();
            assert!(e.to_string().contains(says), "{text}\n=> {e}");
            assert_eq!(
                crate::exit::Classify::exit_class(&e),
                crate::exit::ExitClass::Config
            );
        }
    }

    #[test]
    fn an_upstream_tools_approval_keys_follow_a_command_tools_rules() {
        let stdio = "[[upstream]]\nalias = \"a\"\ncommand = [\"/bin/true\"]\n";
        let c = load(&format!(
            "{stdio}[upstream.tools.x]\napproval = \"required\"\napproval_preview = [\"target\"]\n[upstream.tools.y]\neffect = \"read_only\"\n[upstream.tools.z]\napproval = \"required\"\n"
        ))
        .unwrap();
        let u = &c.upstreams[0];
        assert_eq!(u.tool_approval("x"), Some(&["target".to_string()][..]));
        assert_eq!(u.tool_approval("z"), Some(&[][..]));
        assert_eq!(u.tool_approval("y"), None);
        assert_eq!(u.tool_approval("unlisted"), None);
        assert!(c.needs_approvals());
        assert!(!load(stdio).unwrap().needs_approvals());
        let nine: Vec<String> = (0..=MAX_APPROVAL_PREVIEW_FIELDS)
            .map(|i| format!("\"f{i}\""))
            .collect();
        for (table, says) in [
            (
                "approval_preview = [\"target\"]\n".to_string(),
                "tools.x: approval_preview is shown with a held call; it needs approval = \"required\"",
            ),
            (
                "approval = \"never\"\napproval_preview = [\"target\"]\n".to_string(),
                "it needs approval = \"required\"",
            ),
            (
                format!(
                    "approval = \"required\"\napproval_preview = [{}]\n",
                    nine.join(", ")
                ),
                "approval_preview lists 9 fields; at most 8",
            ),
            ("approval = \"maybe\"\n".to_string(), "approval"),
        ] {
            let text = format!("{stdio}[upstream.tools.x]\n{table}");
            let e = load(&text).unwrap_err();
            assert!(e.to_string().contains(says), "{text}\n=> {e}");
        }
    }

    #[test]
    fn aliases_have_no_dot() {
        assert!(valid_alias("files"));
        assert!(valid_alias("a-b_c9"));
        assert!(!valid_alias("a.b"));
        assert!(!valid_alias(""));
        assert!(!valid_alias(&"a".repeat(MAX_ALIAS_LEN + 1)));
    }
}
