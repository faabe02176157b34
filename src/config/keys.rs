//! Every configuration key, defined once: section, name, type, default,
//! range, one line of documentation, environment variable, when a change
//! takes effect, and the typed field its value fills.
//!
//! The definitions below are the whole of a key: [`settings!`] makes each
//! one a [`KeySpec`] constant, a field of its section's struct and the code
//! that reads and checks it, and everything an operator reads about a key
//! is rendered from them ([`super::render`]): the starter file `taskgate
//! init` writes (which is also the packaged conffile), the reference table
//! in docs/operations.md and the taskgate.toml(5) man page. Adding a key is
//! one definition here and the code that uses its field. A key that other
//! keys constrain (`server.listen` and the `--listen` flag, `store.directory`
//! and its precedence, `server.tls` and its files) is read here like any
//! other and then held to the rules between keys in `Config::load_from`.
//!
//! The per-tool process limits are the exception: each is defined once
//! with the tools that enforce it (`crate::process_limits`), and
//! `tool_settings!` makes it here the `[tools]` key and the `[[tool]]` key
//! over it.

use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::time::Duration;

use super::settings::{Choice, settings};
use super::{JwtIssuer, LocalOwner, SelfApproval, TlsMode};
use crate::process_limits::{Bound, ProcessLimits, Unit as LimitUnit, for_each_limit};

pub use super::render::{
    PACKAGE_STATE_DIR, REFERENCE_BEGIN, REFERENCE_END, man_page, reference_markdown, starter_config,
};

/// A `[section]` of the file, or the per-tool `[[tool]]` tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    Server,
    Store,
    Tasks,
    Log,
    /// Authentication: who may call, and with which credentials.
    Auth,
    /// Defaults for every `[[tool]]` table.
    Tools,
    /// Keys of each `[[tool]]` table; not settable from the environment.
    Tool,
    /// Keys of each `[[auth.jwt]]` table (a trusted JWT issuer); not
    /// settable from the environment either.
    AuthJwt,
    /// Keys of each `[[upstream]]` table (an upstream MCP server); not
    /// settable from the environment either.
    Upstream,
    /// Calls held until an administrator approves them.
    Approvals,
}

impl Section {
    pub const fn name(self) -> &'static str {
        match self {
            Section::Server => "server",
            Section::Store => "store",
            Section::Tasks => "tasks",
            Section::Log => "log",
            Section::Auth => "auth",
            Section::Tools => "tools",
            Section::Tool => "tool",
            Section::AuthJwt => "auth.jwt",
            Section::Upstream => "upstream",
            Section::Approvals => "approvals",
        }
    }

    /// The sections that hold settings, in the order they are documented.
    pub const SETTINGS: [Section; 7] = [
        Section::Server,
        Section::Store,
        Section::Tasks,
        Section::Tools,
        Section::Log,
        Section::Auth,
        Section::Approvals,
    ];

    /// Sections of repeated tables, whose keys have no environment variable.
    pub(super) const fn repeated(self) -> bool {
        matches!(self, Section::Tool | Section::AuthJwt | Section::Upstream)
    }
}

/// What an integer counts, for rendering its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Count,
    Bytes,
    Seconds,
    Millis,
    /// SQLite pages of 4 KiB.
    Pages,
}

/// A bounded integer key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntSpec {
    pub default: u64,
    pub min: u64,
    pub max: u64,
    pub unit: Unit,
    /// A key whose value is a further upper bound on this one.
    pub at_most: Option<&'static KeySpec>,
}

impl IntSpec {
    pub const fn range(&self) -> RangeInclusive<u64> {
        RangeInclusive::new(self.min, self.max)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A socket address such as 127.0.0.1:8765.
    Address {
        default: &'static str,
    },
    /// An absolute path; no embedded default (the state directory has its
    /// own precedence, see [`super::StateDirSource`]).
    Path,
    /// A list of absolute paths, empty by default; in the environment the
    /// paths are joined with `:`.
    Paths,
    /// A list of web origins (`scheme://host[:port]`), empty by default; in
    /// the environment they are separated by commas.
    Origins,
    Int(IntSpec),
    /// A tracing filter (`info,taskgate::tasks=debug`), checked as the
    /// logger would read it.
    Filter {
        default: &'static str,
    },
    /// One word out of a fixed list.
    Choice {
        default: &'static str,
        choices: &'static [&'static str],
    },
    /// Free text checked by a rule; `example` is what the starter file
    /// shows when there is no default.
    Text {
        default: Option<&'static str>,
        example: &'static str,
        rule: TextRule,
    },
    /// An absolute path to a file the daemon reads; no default.
    File {
        example: &'static str,
    },
}

/// What a text key must look like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextRule {
    /// An absolute `https://` or `http://` URI without a fragment (RFC 8707
    /// resource indicators).
    Uri,
    /// Text that can stand inside a quoted HTTP header parameter: printable
    /// ASCII without `"` or `\`, 1–64 characters.
    Realm,
    /// The name of a `[[tool]]`: 1–64 ASCII letters, digits, `_`, `-`, `.`.
    ToolName,
}

impl TextRule {
    /// Why `value` breaks the rule, if it does.
    pub fn check(self, value: &str) -> Result<(), &'static str> {
        match self {
            TextRule::Uri => {
                let rest = value
                    .strip_prefix("https://")
                    .or_else(|| value.strip_prefix("http://"));
                match rest {
                    None => Err("must be an absolute http:// or https:// URI"),
                    Some(r) if r.is_empty() || r.starts_with('/') => Err("must name a host"),
                    Some(_) if value.contains('#') => Err("must not have a fragment (RFC 8707)"),
                    Some(_)
                        if value.len() > 2048 || value.chars().any(|c| !c.is_ascii_graphic()) =>
                    {
                        Err("must be at most 2048 printable ASCII characters without spaces")
                    }
                    Some(_) => Ok(()),
                }
            }
            TextRule::Realm => {
                if value.is_empty()
                    || value.len() > 64
                    || value
                        .chars()
                        .any(|c| !(c == ' ' || c.is_ascii_graphic()) || c == '"' || c == '\\')
                {
                    Err(
                        "must be 1-64 printable ASCII characters without a double quote or backslash",
                    )
                } else {
                    Ok(())
                }
            }
            TextRule::ToolName => {
                if value.is_empty()
                    || value.len() > 64
                    || !value
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
                {
                    Err("must be a tool's name: 1-64 ASCII letters, digits, _, - or .")
                } else {
                    Ok(())
                }
            }
        }
    }

    pub(super) const fn label(self) -> &'static str {
        match self {
            TextRule::Uri => "absolute http(s) URI",
            TextRule::Realm => "1–64 printable characters",
            TextRule::ToolName => "a [[tool]] name",
        }
    }
}

/// When a changed value takes effect.
///
/// A reload (SIGHUP, `systemctl reload taskgate`) applies the `Reload` keys
/// to new calls; a changed `AtStart` key is refused by the reload, which
/// names it in the log and keeps the old value until a restart. A key is
/// `Reload` only when changing it cannot touch what already runs: the
/// listener, the store and the bounds the running daemon was sized by stay
/// as they were started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applies {
    AtStart,
    Reload,
}

impl Applies {
    pub const fn label(self) -> &'static str {
        match self {
            Applies::AtStart => "at start",
            Applies::Reload => "on reload",
        }
    }
}

/// One configuration key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeySpec {
    pub section: Section,
    pub name: &'static str,
    pub kind: Kind,
    /// One line; `code` spans in backquotes are rendered per medium.
    pub doc: &'static str,
    /// The command-line flag that overrides the key, if any.
    pub flag: Option<&'static str>,
    pub applies: Applies,
    /// The environment variable, when it is not `TASKGATE_SECTION_NAME`
    /// (a name operators knew before the key existed).
    pub env: Option<&'static str>,
    /// For a `[[tool]]` key: the `[tools]` setting that gives its default
    /// (`tools.max_processes`), so the docs name it instead of a number.
    pub default_from: Option<&'static KeySpec>,
}

impl KeySpec {
    /// A key applied at start, without a flag, with the variable its
    /// section and name give and a default of its own: what a definition's
    /// options (`applies`, `flag`, `env`, `default_from`) change. `doc` is
    /// the definition's doc line, whose leading space is dropped.
    pub const fn new(
        section: Section,
        name: &'static str,
        kind: Kind,
        doc: &'static str,
    ) -> KeySpec {
        KeySpec {
            section,
            name,
            kind,
            doc: doc.trim_ascii_start(),
            flag: None,
            applies: Applies::AtStart,
            env: None,
            default_from: None,
        }
    }

    /// `section.name`, as error messages and the docs name the key.
    pub fn dotted(&self) -> String {
        format!("{}.{}", self.section.name(), self.name)
    }

    /// `TASKGATE_SECTION_NAME` unless the key names another; tool keys
    /// have none.
    pub fn env_var(&self) -> Option<String> {
        if let Some(var) = self.env {
            return Some(var.to_string());
        }
        (!self.section.repeated()).then(|| {
            format!(
                "TASKGATE_{}_{}",
                self.section.name().to_ascii_uppercase(),
                self.name.to_ascii_uppercase()
            )
        })
    }

    /// The integer spec; only for keys the table declares as integers
    /// (a const so that a wrong use fails the build, not a start).
    pub const fn int(&self) -> IntSpec {
        match self.kind {
            Kind::Int(spec) => spec,
            _ => panic!("not an integer key"),
        }
    }

    pub fn is_startup_only(&self) -> bool {
        self.applies == Applies::AtStart
    }

    /// The sentence the starter file and the man page add to the key's doc.
    pub(super) fn applies_text(&self) -> &'static str {
        match self.applies {
            Applies::AtStart => "Applied at start; a reload keeps the old value.",
            Applies::Reload => "Applied on reload.",
        }
    }
}

// ---- kinds, for the definitions ----------------------------------------

pub(super) const KIB: u64 = 1024;
pub(super) const MIB: u64 = 1024 * KIB;
pub(super) const GIB: u64 = 1024 * MIB;
const DAY: u64 = 86_400;

const fn int(unit: Unit, default: u64, range: RangeInclusive<u64>) -> Kind {
    Kind::Int(IntSpec {
        default,
        min: *range.start(),
        max: *range.end(),
        unit,
        at_most: None,
    })
}

/// A count of things.
const fn count(default: u64, range: RangeInclusive<u64>) -> Kind {
    int(Unit::Count, default, range)
}

const fn bytes(default: u64, range: RangeInclusive<u64>) -> Kind {
    int(Unit::Bytes, default, range)
}

/// Seconds; a `Duration` field reads them as seconds.
const fn secs(default: u64, range: RangeInclusive<u64>) -> Kind {
    int(Unit::Seconds, default, range)
}

/// Milliseconds; a `Duration` field reads them as milliseconds.
const fn millis(default: u64, range: RangeInclusive<u64>) -> Kind {
    int(Unit::Millis, default, range)
}

/// SQLite pages of 4 KiB.
const fn pages(default: u64, range: RangeInclusive<u64>) -> Kind {
    int(Unit::Pages, default, range)
}

/// A socket address.
const fn address(default: &'static str) -> Kind {
    Kind::Address { default }
}

/// One word of the enum `T` (see `choice!`).
const fn choice<T: Choice>(default: &'static str) -> Kind {
    Kind::Choice {
        default,
        choices: T::WORDS,
    }
}

const fn file(example: &'static str) -> Kind {
    Kind::File { example }
}

impl Kind {
    /// An integer kind bounded from above by `other`'s value too.
    const fn at_most(self, other: &'static KeySpec) -> Kind {
        match self {
            Kind::Int(mut spec) => {
                spec.at_most = Some(other);
                Kind::Int(spec)
            }
            kind => kind,
        }
    }
}

const RELOAD: Applies = Applies::Reload;

// ---- the keys ------------------------------------------------------------

settings! {
    /// The settings of `[server]`, `[store]` and `[tasks]`, in documented
    /// order.
    pub const KEYS_BEFORE_TOOLS;

    /// `[server]`: the HTTP endpoint and the bounds of what it serves.
    pub struct ServerSettings in Server {
        /// Address of the HTTP endpoint (`/mcp`, `/healthz`, `/readyz`). A non-loopback address is refused unless `[auth]` configures credentials and `server.tls` is `on` (or `terminated-upstream`).
        #[key(SERVER_LISTEN, "listen", address("127.0.0.1:8765"), flag: Some("--listen"))]
        pub listen: SocketAddr,
        /// Open HTTP connections; past it a new connection gets `503 too many connections` and is closed.
        #[key(SERVER_MAX_CONNECTIONS, "max_connections", count(256, 1..=65_536))]
        pub max_connections: usize,
        /// `tools/call` requests in flight on `/mcp` (and synchronous tool calls on stdio); past it a request gets 503 or `TG_SERVER_BUSY` at once.
        #[key(SERVER_MAX_CONCURRENT_REQUESTS, "max_concurrent_requests", count(64, 1..=4096))]
        pub max_concurrent_requests: usize,
        /// `/mcp` requests other than `tools/call` (polls, cancels, listings) in flight, counted apart from `max_concurrent_requests` so long calls cannot starve them; at most half of them wait in early polls held until due.
        #[key(SERVER_RESERVED_CONTROL_REQUESTS, "reserved_control_requests", count(16, 1..=1024))]
        pub reserved_control_requests: usize,
        /// Largest request body on `/mcp` (and longest line on stdio); a larger one gets `413` with `TG_REQUEST_TOO_LARGE` (on stdio, the error alone). Bodies are read whole before a request slot is taken, so up to `max_connections` of them may be held at once.
        #[key(SERVER_MAX_REQUEST_BYTES, "max_request_bytes", bytes(MIB, 4 * KIB..=16 * MIB))]
        pub max_request_bytes: usize,
        /// Time a connection gets to send a whole request head, counted from when it opens or its previous response ended; past it the connection is closed, so idle keep-alive and slow connections free their slot.
        #[key(SERVER_HEADER_READ_TIMEOUT_MS, "header_read_timeout_ms", millis(10_000, 100..=600_000))]
        pub header_read_timeout: Duration,
        /// Time a request gets to send its whole body once its head has arrived; past it the request gets `408` with `TG_REQUEST_TIMEOUT` and the connection is closed. No request slot is taken until the body is in.
        #[key(SERVER_BODY_READ_TIMEOUT_MS, "body_read_timeout_ms", millis(10_000, 100..=600_000))]
        pub body_read_timeout: Duration,
        /// Open legacy (`initialize`) sessions; past it an `initialize` gets 503 with `TG_SESSIONS_FULL` at once.
        #[key(SERVER_MAX_SESSIONS, "max_sessions", count(256, 1..=65_536))]
        pub max_sessions: usize,
        /// Seconds a legacy session may go without a request before it is closed and its slot freed.
        #[key(SERVER_SESSION_IDLE_SECS, "session_idle_secs", secs(120, 1..=DAY))]
        pub session_idle: Duration,
        /// Web origins (`https://console.example:8443`) whose pages may call `/mcp` from a browser. A request whose `Origin` header is neither one of these nor the daemon's own origin gets `403` (DNS rebinding defence); a request without `Origin`, as non-browser clients send, is not affected.
        #[key(SERVER_ALLOWED_ORIGINS, "allowed_origins", Kind::Origins)]
        pub allowed_origins: Vec<String>,
        /// `off`: plain HTTP, and `server.listen` must be a loopback address. `on`: TLS with `tls_cert_file` and `tls_key_file` (re-read on reload). `terminated-upstream`: plain HTTP that a TLS-terminating reverse proxy you run forwards. A non-loopback `server.listen` needs `on` or `terminated-upstream`, and credentials in `[auth]`.
        #[key(SERVER_TLS, "tls", choice::<TlsMode>("off"))]
        pub tls: TlsMode,
        /// PEM certificate chain (leaf first) for `server.tls = "on"`; under systemd, pass it with `LoadCredential=` and name it under `$CREDENTIALS_DIRECTORY`. A reload reads it again (a renewed certificate needs no restart).
        #[key(SERVER_TLS_CERT_FILE, "tls_cert_file", file("/run/credentials/taskgate.service/tls.crt"), applies: RELOAD)]
        pub tls_cert_file: Option<PathBuf>,
        /// PEM private key (PKCS#8, PKCS#1 or SEC1) matching `tls_cert_file`; re-read on reload like it.
        #[key(SERVER_TLS_KEY_FILE, "tls_key_file", file("/run/credentials/taskgate.service/tls.key"), applies: RELOAD)]
        pub tls_key_file: Option<PathBuf>,
        not_a_key
        /// Every address given for `server.listen` with where it came from:
        /// the layered one (file or environment), then the one in force
        /// (the `--listen` flag's, the layered one or the default). The
        /// exposure rule (off loopback only with credentials and TLS) holds
        /// each of them to it.
        pub listen_sources: Vec<(SocketAddr, String)>,
    }

    /// `[store]`: the task store.
    pub struct StoreSettings in Store {
        /// Private state directory: an absolute path, mode 0700, owned by the service user. `--state-dir` and systemd's `$STATE_DIRECTORY` take precedence; without any, `$XDG_STATE_HOME/taskgate`, created on first start.
        #[key(STORE_DIRECTORY, "directory", Kind::Path, flag: Some("--state-dir"))]
        by_rules,
        /// Commands waiting for the store thread; more are refused as busy at once.
        #[key(STORE_QUEUE_DEPTH, "queue_depth", count(128, 1..=4096))]
        pub queue_depth: usize,
        /// Unexpired tasks retained at most; creation beyond it is refused (capacity). Lowering it keeps existing tasks readable.
        #[key(STORE_MAX_LIVE_TASKS, "max_live_tasks", count(100_000, 1..=1_000_000))]
        pub max_live_tasks: u64,
        /// Unexpired tasks one owner (one issuer, tenant and subject) may hold; never more than `store.max_live_tasks`, which the default leaves as the only bound. Past it that owner's new tasks are refused with `TG_OWNER_LIMIT` until some expire; other owners go on.
        #[key(STORE_MAX_LIVE_TASKS_PER_OWNER, "max_live_tasks_per_owner", count(1_000_000, 1..=1_000_000))]
        pub max_live_tasks_per_owner: u64,
        /// Seconds between `wal_checkpoint(TRUNCATE)` runs (one also runs at a clean stop).
        #[key(STORE_CHECKPOINT_INTERVAL_SECS, "checkpoint_interval_secs", secs(60, 1..=DAY))]
        pub checkpoint_interval: Duration,
        // 1,048,576 pages of 4 KiB: a 4 GiB ceiling, room for 100,000 full
        // 16 KiB results plus rows and indexes.
        /// SQLite page cap in 4 KiB pages (the default is 4 GiB); at the cap new tasks are refused (capacity).
        #[key(STORE_MAX_DB_PAGES, "max_db_pages", pages(1_048_576, 64..=1_048_576))]
        pub max_db_pages: u64,
    }

    /// `[tasks]`: how tasks live and run.
    pub struct TaskSettings in Tasks {
        /// How long a task stays readable after creation (`ttlMs`); a finished task stays at least one hour after it finished.
        #[key(TASKS_DEFAULT_TTL_SECS, "default_ttl_secs", secs(DAY, 60..=30 * DAY))]
        pub default_ttl: Duration,
        /// Advertised `pollIntervalMs`. A task is read from the store at most once per interval for each client: an earlier poll is never refused, it is held until its read is due (or, when half of `server.reserved_control_requests` already wait, answered with what that client was last told). A reload applies it to tasks created afterwards and to the pacing of later polls.
        #[key(TASKS_POLL_INTERVAL_MS, "poll_interval_ms", millis(1000, 50..=60_000), applies: RELOAD)]
        pub poll_interval: Duration,
        /// Tool runs at once, background or synchronous; when all are busy a call is refused at once (`TG_TASK_SLOTS_BUSY` or `TG_RUN_SLOTS_BUSY`).
        #[key(TASKS_MAX_RUNNING, "max_running", count(8, 1..=1024))]
        pub max_running: usize,
        /// Background tasks one owner (one issuer, tenant and subject) may have running at once; never more than `tasks.max_running`, which the default leaves as the only bound. Past it that owner's calls are refused with `TG_OWNER_LIMIT`; other owners' go on.
        #[key(TASKS_MAX_RUNNING_PER_OWNER, "max_running_per_owner", count(1024, 1..=1024))]
        pub max_running_per_owner: usize,
        /// Time between SIGTERM and SIGKILL when a task is cancelled or the daemon stops.
        #[key(TASKS_CANCEL_GRACE_MS, "cancel_grace_ms", millis(5000, 0..=60_000))]
        pub cancel_grace: Duration,
        /// Disk space for results over 16 KiB, kept in `artifacts/`; when full, a task whose result would not fit fails.
        #[key(TASKS_ARTIFACTS_MAX_TOTAL_BYTES, "artifacts_max_total_bytes", bytes(GIB, MIB..=64 * GIB))]
        pub artifacts_max_total_bytes: u64,
        /// Largest single result kept in `artifacts/`.
        #[key(TASKS_ARTIFACT_MAX_BYTES, "artifact_max_bytes", bytes(16 * MIB, 16 * KIB..=GIB).at_most(&TASKS_ARTIFACTS_MAX_TOTAL_BYTES))]
        pub artifact_max_bytes: u64,
    }
}

// `[tools]` and the bounds of a `[[tool]]` table: the process limits come
// from their one definition (`process_limits`), each a `[tools]` key and
// the `[[tool]]` key over it, with the same range. A `[[tool]]` table's
// other bounds are how long one call may run and how much it may write.
macro_rules! tool_settings {
    (
        {}
        $(
            #[doc = $doc:literal]
            $field:ident ($TOOLS:ident, $TOOL:ident) $label:literal:
                $bound:expr, $enforce:expr, $reported:literal;
        )*
    ) => {
        settings! {
            /// The settings of `[tools]`, in documented order.
            pub const TOOLS_SECTION_KEYS;

            /// `[tools]`: what every command tool gets unless its own table says
            /// otherwise.
            pub struct ToolsSettings in Tools {
                /// Absolute paths every confined tool may read and execute beside the built-in set (`/usr`, `/bin`, `/sbin`, `/lib*`, `/etc` and a few devices) and its working directory; a tool's own `read_paths` replaces this list. A path that overlaps the state directory or the configuration file refuses the start.
                #[key(TOOLS_READ_PATHS, "read_paths", Kind::Paths, applies: RELOAD)]
                pub read_paths: Vec<PathBuf>,
                $(
                    #[doc = $doc]
                    #[key($TOOLS, stringify!($field), limit_kind($bound), applies: RELOAD)]
                    pub $field: u64,
                )*
            }
        }

        settings! {
            /// The bounded keys of each `[[tool]]` table (the others are described in
            /// the man page's prose: they have no default to speak of).
            pub const TOOL_KEYS;

            /// A command tool's bounds, from its `[[tool]]` table; a confinement
            /// limit it leaves out is the `[tools]` one.
            pub struct ToolLimits in Tool {
                /// Seconds a call may run; then the tool's process group is killed and the call fails.
                #[key(TOOL_TIMEOUT_SECS, "timeout_secs", secs(300, 1..=7 * DAY), applies: RELOAD)]
                pub timeout: Duration,
                /// Largest output the tool may write; more is an error, never a truncated result.
                #[key(TOOL_MAX_STDOUT_BYTES, "max_stdout_bytes", bytes(MIB, 1..=GIB), applies: RELOAD)]
                pub max_stdout_bytes: u64,
                /// Largest error output the tool may write; more is an error.
                #[key(TOOL_MAX_STDERR_BYTES, "max_stderr_bytes", bytes(64 * KIB, 0..=64 * MIB), applies: RELOAD)]
                pub max_stderr_bytes: u64,
                $(
                    #[doc = concat!("Overrides `tools.", stringify!($field), "` for this tool.")]
                    #[key($TOOL, stringify!($field), $TOOLS.kind, applies: RELOAD, default_from: Some(&$TOOLS))]
                    pub $field: u64,
                )*
            }
        }

        impl ToolLimits {
            /// The process limits in force for this tool.
            pub fn process(&self) -> ProcessLimits {
                ProcessLimits {
                    $($field: self.$field,)*
                }
            }
        }
    };
}
for_each_limit!(tool_settings! {});

settings! {
    /// The settings of `[log]`, `[auth]` and `[approvals]`, in documented
    /// order.
    pub const KEYS_AFTER_TOOLS;

    // The log filter: taskgate's own events at info; the protocol libraries
    // only when something is wrong (rmcp reports every finished stateless
    // request at info, which would flood the journal). Its environment
    // variable is `TASKGATE_LOG`, the name it had before it was a key; like
    // every key's variable it overrides the file.

    /// `[log]`.
    pub struct LogSettings in Log {
        /// Which events are logged, as a tracing filter: a default level, then `target=level` pairs, e.g. `info,taskgate::tasks=debug`. The protocol libraries stay at warn or above whatever it says (their debug events carry request bodies). `TASKGATE_LOG` in the environment overrides it (the variable takes precedence, as for every key); a reload applies a changed file only when the variable is not set. An invalid filter is refused (78); a reload that meets one keeps the filter in force.
        #[key(LOG_FILTER, "filter", Kind::Filter { default: "info,rmcp=warn,hyper=warn,axum=warn,tower=warn" }, applies: RELOAD, env: Some("TASKGATE_LOG"))]
        pub filter: String,
    }

    /// `[auth]`, when credentials are configured (see `Config::auth`).
    pub struct AuthSettings in Auth {
        /// Who may call without a credential once credentials are configured: `loopback` lets HTTP requests from a loopback address that carry no `Authorization` header at all act as the one local owner with every scope, as before authentication was configured (a present header that is not a bearer credential is refused, never taken as none); `never` makes loopback requests present a credential too.
        #[key(AUTH_LOCAL_OWNER, "local_owner", choice::<LocalOwner>("loopback"), applies: RELOAD)]
        pub local_owner: LocalOwner,
        /// Canonical URI of this server's MCP endpoint (RFC 8707): the audience a JWT must name unless its issuer lists `audiences`, and the `resource` of the protected resource metadata. Required when a `[[auth.jwt]]` issuer is configured.
        #[key(AUTH_RESOURCE, "resource", Kind::Text { default: None, example: "https://tasks.example.internal/mcp", rule: TextRule::Uri }, applies: RELOAD)]
        pub resource: Option<String>,
        /// The `realm` of the `WWW-Authenticate: Bearer` challenge.
        #[key(AUTH_REALM, "realm", Kind::Text { default: Some("taskgate"), example: "taskgate", rule: TextRule::Realm }, applies: RELOAD)]
        pub realm: String,
        /// Static API tokens, as `[[token]]` tables holding only the `sha256:` hash of each secret (`taskgate token new` prints one). Must not be readable by other users (0640 root:taskgate). Setting it, or declaring an `[[auth.jwt]]` issuer, turns authentication on; turning it on or off takes a restart, while a reload re-reads the file.
        #[key(AUTH_TOKENS_FILE, "tokens_file", file("/etc/taskgate/tokens.toml"), applies: RELOAD)]
        pub tokens_file: Option<PathBuf>,
        /// Revoked credentials, as `[[revoke]]` tables: a static token by `token` id, a JWT by `issuer` and `jti`, or everything an `issuer` gave a `subject` before `issued_before`. Re-read on reload, so a revocation needs no restart.
        #[key(AUTH_REVOCATIONS_FILE, "revocations_file", file("/etc/taskgate/revocations.toml"), applies: RELOAD)]
        pub revocations_file: Option<PathBuf>,
        not_a_key
        /// The trusted JWT issuers, each read from its `[[auth.jwt]]` table.
        pub jwt: Vec<JwtIssuer>,
    }

    /// `[approvals]`: calls to a `[[tool]]` (or an upstream's tool, in its
    /// `[upstream.tools.NAME]` table) with `approval = "required"` wait
    /// until an administrator approves that exact call.
    pub struct ApprovalSettings in Approvals {
        /// Private directory (0700) of the approval journal, a durable part of its own: never inside the state directory. Without it, the state directory's sibling named after it with `-approvals` (`/var/lib/taskgate-approvals` under the unit, its second `StateDirectory=`). Created and used only when some tool needs approval.
        #[key(APPROVALS_DIRECTORY, "directory", Kind::Path)]
        by_rules,
        /// Seconds a held call waits for a decision; then its proposal expires and an identical call asks afresh.
        #[key(APPROVALS_DECISION_WINDOW_SECS, "decision_window_secs", secs(3600, 60..=7 * DAY))]
        pub decision_window: Duration,
        /// Seconds an approval may be used from the moment it is given (`taskgate approvals approve --valid-for` may shorten it): the identical call re-issued within them runs once; afterwards a new approval is needed.
        #[key(APPROVALS_EXECUTION_WINDOW_SECS, "execution_window_secs", secs(900, 60..=DAY))]
        pub execution_window: Duration,
        /// Advertised `pollIntervalMs` of a task that waits for an approval: a decision takes a person, so polling it often only costs.
        #[key(APPROVALS_POLL_INTERVAL_MS, "poll_interval_ms", millis(30_000, 5_000..=600_000))]
        pub poll_interval: Duration,
        /// Largest journal segment file; the journal goes on in a new segment past it.
        #[key(APPROVALS_SEGMENT_MAX_BYTES, "segment_max_bytes", bytes(64 * MIB, 64 * KIB..=GIB))]
        pub segment_max_bytes: u64,
        /// Proposals waiting for a decision at once; past it a new held call is refused with `TG_APPROVALS_FULL` until some are decided or expire.
        #[key(APPROVALS_MAX_PENDING, "max_pending", count(1024, 1..=65_536))]
        pub max_pending: usize,
        /// Proposals one owner (one issuer, tenant and subject) may have waiting at once; never more than `approvals.max_pending`, which the default leaves as the only bound. Past it that owner's new held calls are refused with `TG_OWNER_LIMIT`; other owners go on.
        #[key(APPROVALS_MAX_PENDING_PER_OWNER, "max_pending_per_owner", count(1024, 1..=65_536))]
        pub max_pending_per_owner: usize,
        /// Proposals the journal keeps at once: waiting, or decided and still within the lifetime of the approval tasks that wait on them. A decided proposal is forgotten once that lifetime has passed (the journal's segments holding only forgotten proposals are removed); past the bound a new held call is refused with `TG_APPROVALS_FULL`.
        #[key(APPROVALS_MAX_PROPOSALS, "max_proposals", count(65_536, 1..=1_048_576))]
        pub max_proposals: usize,
        /// Proposals the journal keeps for one owner at once (see `approvals.max_proposals`), so that one caller proposing and cancelling in a loop cannot fill the journal for everyone; never more than `approvals.max_proposals`. Past it that owner's new held calls are refused with `TG_OWNER_LIMIT`.
        #[key(APPROVALS_MAX_PROPOSALS_PER_OWNER, "max_proposals_per_owner", count(4096, 1..=1_048_576))]
        pub max_proposals_per_owner: usize,
        /// `forbid`: an administrator whose identity is the caller's (the same issuer, tenant and subject) may not approve that call. `allow` lets them, for a single-person setup.
        #[key(APPROVALS_SELF_APPROVAL, "self_approval", choice::<SelfApproval>("forbid"))]
        pub self_approval: SelfApproval,
        /// A `[[tool]]` run when a call is held as a new proposal, so an administrator hears of it: confined and bounded like any tool, given `{"proposal", "tool", "principal", "decisionDeadlineMs"}` as its arguments (on stdin, and for `{placeholders}` in its argv), never the call's arguments. It must not need approval itself; its failure is logged and holds nothing up.
        #[key(APPROVALS_NOTIFY_TOOL, "notify_tool", Kind::Text { default: None, example: "page-oncall", rule: TextRule::ToolName })]
        pub notify_tool: Option<String>,
        not_a_key
        /// The journal's directory in force (configured, or the default
        /// beside the state directory).
        pub directory: std::path::PathBuf,
    }
}

settings! {
    /// The bounded keys of each `[[auth.jwt]]` table (the others are described
    /// in the man page's prose).
    pub const JWT_KEYS;

    /// A JWT issuer's bounds, from its `[[auth.jwt]]` table.
    pub struct JwtLimits in AuthJwt {
        /// Longest lifetime a token of this issuer may have, `exp` minus `iat` (or minus now, without `iat`); a longer-lived token is refused.
        #[key(JWT_MAX_TOKEN_LIFETIME_SECS, "max_token_lifetime_secs", secs(3600, 60..=7 * DAY), applies: RELOAD)]
        pub max_token_lifetime_secs: u64,
        /// Clock skew allowed when checking `exp`, `nbf` and `iat`.
        #[key(JWT_LEEWAY_SECS, "leeway_secs", secs(30, 0..=300), applies: RELOAD)]
        pub leeway_secs: u64,
    }
}

settings! {
    /// The bounded keys of each `[[upstream]]` table (the others are described
    /// in the man page's prose).
    pub const UPSTREAM_KEYS;

    /// An upstream MCP server's bounds, from its `[[upstream]]` table.
    pub struct UpstreamLimits in Upstream {
        /// Seconds to connect and finish the protocol handshake and list the tools; past it the attempt counts as failed and is retried with backoff. A server that ignores the 2026-07-28 `server/discover` instead of refusing it gets the legacy `initialize` only after 10 s, so keep this above 10 for such servers.
        #[key(UPSTREAM_CONNECT_TIMEOUT_SECS, "connect_timeout_secs", secs(30, 1..=300), applies: RELOAD)]
        pub connect_timeout: Duration,
        /// Seconds one forwarded request may take (a tool call, synchronous or run as a task); past it the call is cancelled upstream and fails with `TG_UPSTREAM_TIMEOUT`.
        #[key(UPSTREAM_REQUEST_TIMEOUT_SECS, "request_timeout_secs", secs(300, 1..=7 * DAY), applies: RELOAD)]
        pub request_timeout: Duration,
        /// Largest answer taken from the upstream (a tool result, or one page of its tool list; its whole tool list, all pages together, is held to it too); a larger one fails with `TG_UPSTREAM_RESPONSE_TOO_LARGE` (over stdio the connection is closed and made again, since the rest of that answer cannot be skipped).
        #[key(UPSTREAM_MAX_RESPONSE_BYTES, "max_response_bytes", bytes(16 * MIB, 4 * KIB..=256 * MIB), applies: RELOAD)]
        pub max_response_bytes: u64,
        /// Requests forwarded to the upstream at once; past it a call is refused with `TG_UPSTREAM_BUSY` (retryable), never queued.
        #[key(UPSTREAM_MAX_CONCURRENT_REQUESTS, "max_concurrent_requests", count(16, 1..=1024), applies: RELOAD)]
        pub max_concurrent_requests: usize,
        /// Most tools taken from the upstream's list; an upstream that lists more is refused whole (status says so) rather than served in part.
        #[key(UPSTREAM_MAX_TOOLS, "max_tools", count(1000, 1..=10_000), applies: RELOAD)]
        pub max_tools: usize,
    }
}

/// The settings of `[server]`, `[store]`, `[tasks]`, `[tools]`, `[log]`,
/// `[auth]` and `[approvals]`, in documented order.
pub static KEYS: &[KeySpec] = &ALL_KEYS;

const ALL_KEYS: [KeySpec;
    KEYS_BEFORE_TOOLS.len() + TOOLS_SECTION_KEYS.len() + KEYS_AFTER_TOOLS.len()] =
    joined([KEYS_BEFORE_TOOLS, TOOLS_SECTION_KEYS, KEYS_AFTER_TOOLS]);

/// The keys of several lists, one after another.
const fn joined<const N: usize>(lists: [&[KeySpec]; 3]) -> [KeySpec; N] {
    let mut out = [lists[0][0]; N];
    let (mut at, mut list) = (0, 0);
    while list < lists.len() {
        let mut i = 0;
        while i < lists[list].len() {
            out[at] = lists[list][i];
            at += 1;
            i += 1;
        }
        list += 1;
    }
    assert!(at == N, "the lists fill the array exactly");
    out
}

/// The kind of a process limit's key (its bounds, from its definition).
const fn limit_kind(bound: Bound) -> Kind {
    let unit = match bound.unit {
        LimitUnit::Count => Unit::Count,
        LimitUnit::Bytes => Unit::Bytes,
        LimitUnit::Seconds => Unit::Seconds,
    };
    int(unit, bound.default, bound.min..=bound.max)
}

/// The setting `section.name`, if there is one.
pub fn find(section: &str, name: &str) -> Option<&'static KeySpec> {
    KEYS.iter()
        .find(|k| k.section.name() == section && k.name == name)
}

/// The setting an environment variable names, if any.
pub fn by_env_var(var: &str) -> Option<&'static KeySpec> {
    KEYS.iter().find(|k| k.env_var().as_deref() == Some(var))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_unique_and_defaults_in_range() {
        let all: Vec<&KeySpec> = KEYS
            .iter()
            .chain(TOOL_KEYS)
            .chain(JWT_KEYS)
            .chain(UPSTREAM_KEYS)
            .collect();
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert!(a.dotted() != b.dotted(), "{} twice", a.dotted());
            }
            if let Kind::Int(spec) = a.kind {
                assert!(spec.range().contains(&spec.default), "{}", a.dotted());
                if let Some(other) = spec.at_most {
                    assert!(
                        find(other.section.name(), other.name).is_some(),
                        "{} names {}",
                        a.dotted(),
                        other.dotted()
                    );
                }
            }
            if let Kind::Choice { default, choices } = a.kind {
                assert!(choices.contains(&default), "{}", a.dotted());
            }
            assert!(
                !a.doc.contains('\n') && a.doc.ends_with('.'),
                "{}",
                a.dotted()
            );
            assert_eq!(a.doc.matches('`').count() % 2, 0, "{}", a.dotted());
        }
        assert_eq!(
            by_env_var("TASKGATE_STORE_QUEUE_DEPTH"),
            Some(&STORE_QUEUE_DEPTH)
        );
        // The log filter keeps the variable it had before it was a key.
        assert_eq!(by_env_var("TASKGATE_LOG"), Some(&LOG_FILTER));
        assert_eq!(by_env_var("TASKGATE_LOG_FILTER"), None);
    }

    #[test]
    fn man_page_names_every_key_and_has_no_stray_requests() {
        let page = man_page();
        for key in KEYS
            .iter()
            .chain(TOOL_KEYS)
            .chain(JWT_KEYS)
            .chain(UPSTREAM_KEYS)
        {
            assert!(page.contains(&format!(".B {}\n", key.name)), "{}", key.name);
        }
        for line in page.lines() {
            assert!(
                !line.starts_with('.') || line.len() > 1,
                "empty request line in {line:?}"
            );
        }
    }
}
