//! Every configuration key, defined once: section, name, type, default,
//! range, one line of documentation and when a change takes effect.
//!
//! The loader validates against this table, and everything an operator
//! reads about a key is rendered from it: the starter file `taskgate init`
//! writes (which is also the packaged conffile), the reference table in
//! docs/operations.md and the taskgate.toml(5) man page. Adding a key here
//! and a field in [`super::Config`] is the whole change.

use std::fmt::Write as _;
use std::ops::RangeInclusive;

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
        }
    }

    /// The sections that hold settings, in the order they are documented.
    pub const SETTINGS: [Section; 6] = [
        Section::Server,
        Section::Store,
        Section::Tasks,
        Section::Tools,
        Section::Log,
        Section::Auth,
    ];

    /// Sections of repeated tables, whose keys have no environment variable.
    const fn repeated(self) -> bool {
        matches!(self, Section::Tool | Section::AuthJwt)
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
    pub at_most: Option<&'static str>,
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
        }
    }

    const fn label(self) -> &'static str {
        match self {
            TextRule::Uri => "absolute http(s) URI",
            TextRule::Realm => "1–64 printable characters",
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
    pub default_from: Option<&'static str>,
}

impl KeySpec {
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
    fn applies_text(&self) -> &'static str {
        match self.applies {
            Applies::AtStart => "Applied at start; a reload keeps the old value.",
            Applies::Reload => "Applied on reload.",
        }
    }
}

const fn int(
    section: Section,
    name: &'static str,
    default: u64,
    range: (u64, u64),
    unit: Unit,
    doc: &'static str,
) -> KeySpec {
    KeySpec {
        section,
        name,
        kind: Kind::Int(IntSpec {
            default,
            min: range.0,
            max: range.1,
            unit,
            at_most: None,
        }),
        doc,
        flag: None,
        applies: Applies::AtStart,
        env: None,
        default_from: None,
    }
}

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;
const DAY: u64 = 86_400;

pub const SERVER_LISTEN: KeySpec = KeySpec {
    section: Section::Server,
    name: "listen",
    kind: Kind::Address {
        default: "127.0.0.1:8765",
    },
    doc: "Address of the HTTP endpoint (`/mcp`, `/healthz`, `/readyz`). A non-loopback address is refused unless `[auth]` configures credentials and `server.tls` is `on` (or `terminated-upstream`).",
    flag: Some("--listen"),
    applies: Applies::AtStart,
    env: None,
    default_from: None,
};
pub const SERVER_MAX_CONNECTIONS: KeySpec = int(
    Section::Server,
    "max_connections",
    256,
    (1, 65_536),
    Unit::Count,
    "Open HTTP connections; past it a new connection gets `503 too many connections` and is closed.",
);
pub const SERVER_MAX_CONCURRENT_REQUESTS: KeySpec = int(
    Section::Server,
    "max_concurrent_requests",
    64,
    (1, 4096),
    Unit::Count,
    "`tools/call` requests in flight on `/mcp` (and synchronous tool calls on stdio); past it a request gets 503 or `TG_SERVER_BUSY` at once.",
);
pub const SERVER_RESERVED_CONTROL_REQUESTS: KeySpec = int(
    Section::Server,
    "reserved_control_requests",
    16,
    (1, 1024),
    Unit::Count,
    "`/mcp` requests other than `tools/call` (polls, cancels, listings) in flight, counted apart from `max_concurrent_requests` so long calls cannot starve them; at most half of them wait in early polls held until due.",
);
pub const SERVER_MAX_REQUEST_BYTES: KeySpec = int(
    Section::Server,
    "max_request_bytes",
    MIB,
    (4 * KIB, 16 * MIB),
    Unit::Bytes,
    "Largest request body on `/mcp` (and longest line on stdio); a larger one gets `413` with `TG_REQUEST_TOO_LARGE` (on stdio, the error alone). Bodies are read whole before a request slot is taken, so up to `max_connections` of them may be held at once.",
);
pub const SERVER_HEADER_READ_TIMEOUT_MS: KeySpec = int(
    Section::Server,
    "header_read_timeout_ms",
    10_000,
    (100, 600_000),
    Unit::Millis,
    "Time a connection gets to send a whole request head, counted from when it opens or its previous response ended; past it the connection is closed, so idle keep-alive and slow connections free their slot.",
);
pub const SERVER_BODY_READ_TIMEOUT_MS: KeySpec = int(
    Section::Server,
    "body_read_timeout_ms",
    10_000,
    (100, 600_000),
    Unit::Millis,
    "Time a request gets to send its whole body once its head has arrived; past it the request gets `408` with `TG_REQUEST_TIMEOUT` and the connection is closed. No request slot is taken until the body is in.",
);
pub const SERVER_MAX_SESSIONS: KeySpec = int(
    Section::Server,
    "max_sessions",
    256,
    (1, 65_536),
    Unit::Count,
    "Open legacy (`initialize`) sessions; past it an `initialize` gets 503 with `TG_SESSIONS_FULL` at once.",
);
pub const SERVER_ALLOWED_ORIGINS: KeySpec = KeySpec {
    section: Section::Server,
    name: "allowed_origins",
    kind: Kind::Origins,
    doc: "Web origins (`https://console.example:8443`) whose pages may call `/mcp` from a browser. A request whose `Origin` header is neither one of these nor the daemon's own origin gets `403` (DNS rebinding defence); a request without `Origin`, as non-browser clients send, is not affected.",
    flag: None,
    applies: Applies::AtStart,
    env: None,
    default_from: None,
};
pub const SERVER_SESSION_IDLE_SECS: KeySpec = int(
    Section::Server,
    "session_idle_secs",
    120,
    (1, DAY),
    Unit::Seconds,
    "Seconds a legacy session may go without a request before it is closed and its slot freed.",
);

pub const STORE_DIRECTORY: KeySpec = KeySpec {
    section: Section::Store,
    name: "directory",
    kind: Kind::Path,
    doc: "Private state directory: an absolute path, mode 0700, owned by the service user. `--state-dir` and systemd's `$STATE_DIRECTORY` take precedence; without any, `$XDG_STATE_HOME/taskgate`, created on first start.",
    flag: Some("--state-dir"),
    applies: Applies::AtStart,
    env: None,
    default_from: None,
};
pub const STORE_QUEUE_DEPTH: KeySpec = int(
    Section::Store,
    "queue_depth",
    128,
    (1, 4096),
    Unit::Count,
    "Commands waiting for the store thread; more are refused as busy at once.",
);
pub const STORE_MAX_LIVE_TASKS: KeySpec = int(
    Section::Store,
    "max_live_tasks",
    100_000,
    (1, 1_000_000),
    Unit::Count,
    "Unexpired tasks retained at most; creation beyond it is refused (capacity). Lowering it keeps existing tasks readable.",
);
pub const STORE_MAX_LIVE_TASKS_PER_OWNER: KeySpec = int(
    Section::Store,
    "max_live_tasks_per_owner",
    1_000_000,
    (1, 1_000_000),
    Unit::Count,
    "Unexpired tasks one owner (one issuer, tenant and subject) may hold; never more than `store.max_live_tasks`, which the default leaves as the only bound. Past it that owner's new tasks are refused with `TG_OWNER_LIMIT` until some expire; other owners go on.",
);
pub const STORE_CHECKPOINT_INTERVAL_SECS: KeySpec = int(
    Section::Store,
    "checkpoint_interval_secs",
    60,
    (1, DAY),
    Unit::Seconds,
    "Seconds between `wal_checkpoint(TRUNCATE)` runs (one also runs at a clean stop).",
);
/// 1,048,576 pages of 4 KiB: a 4 GiB ceiling, room for 100,000 full
/// 16 KiB results plus rows and indexes.
pub const STORE_MAX_DB_PAGES: KeySpec = int(
    Section::Store,
    "max_db_pages",
    1_048_576,
    (64, 1_048_576),
    Unit::Pages,
    "SQLite page cap in 4 KiB pages (the default is 4 GiB); at the cap new tasks are refused (capacity).",
);

pub const TASKS_DEFAULT_TTL_SECS: KeySpec = int(
    Section::Tasks,
    "default_ttl_secs",
    DAY,
    (60, 30 * DAY),
    Unit::Seconds,
    "How long a task stays readable after creation (`ttlMs`); a finished task stays at least one hour after it finished.",
);
pub const TASKS_POLL_INTERVAL_MS: KeySpec = KeySpec {
    applies: Applies::Reload,
    ..int(
        Section::Tasks,
        "poll_interval_ms",
        1000,
        (50, 60_000),
        Unit::Millis,
        "Advertised `pollIntervalMs`. A task is read from the store at most once per interval for each client: an earlier poll is never refused, it is held until its read is due (or, when half of `server.reserved_control_requests` already wait, answered with what that client was last told). A reload applies it to tasks created afterwards and to the pacing of later polls.",
    )
};
pub const TASKS_MAX_RUNNING: KeySpec = int(
    Section::Tasks,
    "max_running",
    8,
    (1, 1024),
    Unit::Count,
    "Tool runs at once, background or synchronous; when all are busy a call is refused at once (`TG_TASK_SLOTS_BUSY` or `TG_RUN_SLOTS_BUSY`).",
);
pub const TASKS_MAX_RUNNING_PER_OWNER: KeySpec = int(
    Section::Tasks,
    "max_running_per_owner",
    1024,
    (1, 1024),
    Unit::Count,
    "Background tasks one owner (one issuer, tenant and subject) may have running at once; never more than `tasks.max_running`, which the default leaves as the only bound. Past it that owner's calls are refused with `TG_OWNER_LIMIT`; other owners' go on.",
);
pub const TASKS_CANCEL_GRACE_MS: KeySpec = int(
    Section::Tasks,
    "cancel_grace_ms",
    5000,
    (0, 60_000),
    Unit::Millis,
    "Time between SIGTERM and SIGKILL when a task is cancelled or the daemon stops.",
);
pub const TASKS_ARTIFACTS_MAX_TOTAL_BYTES: KeySpec = int(
    Section::Tasks,
    "artifacts_max_total_bytes",
    GIB,
    (MIB, 64 * GIB),
    Unit::Bytes,
    "Disk space for results over 16 KiB, kept in `artifacts/`; when full, a task whose result would not fit fails.",
);
pub const TASKS_ARTIFACT_MAX_BYTES: KeySpec = KeySpec {
    kind: Kind::Int(IntSpec {
        default: 16 * MIB,
        min: 16 * KIB,
        max: GIB,
        unit: Unit::Bytes,
        at_most: Some("tasks.artifacts_max_total_bytes"),
    }),
    ..int(
        Section::Tasks,
        "artifact_max_bytes",
        0,
        (0, 0),
        Unit::Bytes,
        "Largest single result kept in `artifacts/`.",
    )
};

pub const TOOL_TIMEOUT_SECS: KeySpec = KeySpec {
    applies: Applies::Reload,
    ..int(
        Section::Tool,
        "timeout_secs",
        300,
        (1, 7 * DAY),
        Unit::Seconds,
        "Seconds a call may run; then the tool's process group is killed and the call fails.",
    )
};
pub const TOOL_MAX_STDOUT_BYTES: KeySpec = KeySpec {
    applies: Applies::Reload,
    ..int(
        Section::Tool,
        "max_stdout_bytes",
        MIB,
        (1, GIB),
        Unit::Bytes,
        "Largest output the tool may write; more is an error, never a truncated result.",
    )
};
pub const TOOL_MAX_STDERR_BYTES: KeySpec = KeySpec {
    applies: Applies::Reload,
    ..int(
        Section::Tool,
        "max_stderr_bytes",
        64 * KIB,
        (0, 64 * MIB),
        Unit::Bytes,
        "Largest error output the tool may write; more is an error.",
    )
};

// A tool's confinement limits, per process of the tool (`setrlimit(2)`),
// except `max_processes`, which counts all of its processes. Each is set
// once in `[tools]` and may be overridden by a `[[tool]]` table, whose key
// has the same range; the defaults below are the `[tools]` ones.

/// `[tools] read_paths`: what every confined tool may read beside the
/// built-in set, unless its own table says otherwise.
pub const TOOLS_READ_PATHS: KeySpec = KeySpec {
    section: Section::Tools,
    name: "read_paths",
    kind: Kind::Paths,
    doc: "Absolute paths every confined tool may read and execute beside the built-in set (`/usr`, `/bin`, `/sbin`, `/lib*`, `/etc` and a few devices) and its working directory; a tool's own `read_paths` replaces this list. A path that overlaps the state directory or the configuration file refuses the start.",
    flag: None,
    applies: Applies::Reload,
    env: None,
    default_from: None,
};
pub const TOOLS_MAX_ADDRESS_SPACE_BYTES: KeySpec = KeySpec {
    applies: Applies::Reload,
    ..int(
        Section::Tools,
        "max_address_space_bytes",
        4 * GIB,
        (16 * MIB, 1024 * GIB),
        Unit::Bytes,
        "Virtual memory of each of a tool's processes (RLIMIT_AS); an allocation past it fails, and a tool that fails after using half of it is reported as stopped by this limit (`TG_TOOL_LIMIT`).",
    )
};
pub const TOOLS_MAX_OPEN_FILES: KeySpec = KeySpec {
    applies: Applies::Reload,
    ..int(
        Section::Tools,
        "max_open_files",
        1024,
        (16, 1_048_576),
        Unit::Count,
        "Open file descriptors of each of a tool's processes (RLIMIT_NOFILE).",
    )
};
pub const TOOLS_MAX_PROCESSES: KeySpec = KeySpec {
    applies: Applies::Reload,
    ..int(
        Section::Tools,
        "max_processes",
        128,
        (1, 65_536),
        Unit::Count,
        "Processes a tool may run at once, itself included; past it every one of them is killed and the call fails with `TG_TOOL_LIMIT` (RLIMIT_NPROC, which counts threads too, is set to the service user's count at the start plus eight times this).",
    )
};
pub const TOOLS_MAX_FILE_BYTES: KeySpec = KeySpec {
    applies: Applies::Reload,
    ..int(
        Section::Tools,
        "max_file_bytes",
        GIB,
        (KIB, 1024 * GIB),
        Unit::Bytes,
        "Largest file a tool may write (RLIMIT_FSIZE); a write past it ends the tool with SIGXFSZ and the call fails with `TG_TOOL_LIMIT`.",
    )
};
pub const TOOLS_MAX_CPU_SECS: KeySpec = KeySpec {
    applies: Applies::Reload,
    ..int(
        Section::Tools,
        "max_cpu_secs",
        300,
        (1, 7 * DAY),
        Unit::Seconds,
        "CPU seconds of each of a tool's processes (RLIMIT_CPU); past it the process gets SIGXCPU (SIGKILL a second later) and the call fails with `TG_TOOL_LIMIT`.",
    )
};

/// The log filter: taskgate's own events at info; the protocol libraries
/// only when something is wrong (rmcp reports every finished stateless
/// request at info, which would flood the journal). Its environment
/// variable is `TASKGATE_LOG`, the name it had before it was a key; like
/// every key's variable it overrides the file.
pub const LOG_FILTER: KeySpec = KeySpec {
    section: Section::Log,
    name: "filter",
    kind: Kind::Filter {
        default: "info,rmcp=warn,hyper=warn,axum=warn,tower=warn",
    },
    doc: "Which events are logged, as a tracing filter: a default level, then `target=level` pairs, e.g. `info,taskgate::tasks=debug`. The protocol libraries stay at warn or above whatever it says (their debug events carry request bodies). `TASKGATE_LOG` in the environment overrides it (the variable takes precedence, as for every key); a reload applies a changed file only when the variable is not set. An invalid filter is refused (78); a reload that meets one keeps the filter in force.",
    flag: None,
    applies: Applies::Reload,
    env: Some("TASKGATE_LOG"),
    default_from: None,
};

pub const AUTH_LOCAL_OWNER: KeySpec = KeySpec {
    section: Section::Auth,
    name: "local_owner",
    kind: Kind::Choice {
        default: "loopback",
        choices: &["loopback", "never"],
    },
    doc: "Who may call without a credential once credentials are configured: `loopback` lets HTTP requests from a loopback address that carry no `Authorization` header at all act as the one local owner with every scope, as before authentication was configured (a present header that is not a bearer credential is refused, never taken as none); `never` makes loopback requests present a credential too.",
    flag: None,
    applies: Applies::Reload,
    env: None,
    default_from: None,
};
pub const AUTH_RESOURCE: KeySpec = KeySpec {
    section: Section::Auth,
    name: "resource",
    kind: Kind::Text {
        default: None,
        example: "https://tasks.example.internal/mcp",
        rule: TextRule::Uri,
    },
    doc: "Canonical URI of this server's MCP endpoint (RFC 8707): the audience a JWT must name unless its issuer lists `audiences`, and the `resource` of the protected resource metadata. Required when a `[[auth.jwt]]` issuer is configured.",
    flag: None,
    applies: Applies::Reload,
    env: None,
    default_from: None,
};
pub const AUTH_REALM: KeySpec = KeySpec {
    section: Section::Auth,
    name: "realm",
    kind: Kind::Text {
        default: Some("taskgate"),
        example: "taskgate",
        rule: TextRule::Realm,
    },
    doc: "The `realm` of the `WWW-Authenticate: Bearer` challenge.",
    flag: None,
    applies: Applies::Reload,
    env: None,
    default_from: None,
};
pub const SERVER_TLS: KeySpec = KeySpec {
    section: Section::Server,
    name: "tls",
    kind: Kind::Choice {
        default: "off",
        choices: &["off", "on", "terminated-upstream"],
    },
    doc: "`off`: plain HTTP, and `server.listen` must be a loopback address. `on`: TLS with `tls_cert_file` and `tls_key_file` (re-read on reload). `terminated-upstream`: plain HTTP that a TLS-terminating reverse proxy you run forwards. A non-loopback `server.listen` needs `on` or `terminated-upstream`, and credentials in `[auth]`.",
    flag: None,
    applies: Applies::AtStart,
    env: None,
    default_from: None,
};
pub const SERVER_TLS_CERT_FILE: KeySpec = KeySpec {
    section: Section::Server,
    name: "tls_cert_file",
    kind: Kind::File {
        example: "/run/credentials/taskgate.service/tls.crt",
    },
    doc: "PEM certificate chain (leaf first) for `server.tls = \"on\"`; under systemd, pass it with `LoadCredential=` and name it under `$CREDENTIALS_DIRECTORY`. A reload reads it again (a renewed certificate needs no restart).",
    flag: None,
    applies: Applies::Reload,
    env: None,
    default_from: None,
};
pub const SERVER_TLS_KEY_FILE: KeySpec = KeySpec {
    section: Section::Server,
    name: "tls_key_file",
    kind: Kind::File {
        example: "/run/credentials/taskgate.service/tls.key",
    },
    doc: "PEM private key (PKCS#8, PKCS#1 or SEC1) matching `tls_cert_file`; re-read on reload like it.",
    flag: None,
    applies: Applies::Reload,
    env: None,
    default_from: None,
};
pub const AUTH_TOKENS_FILE: KeySpec = KeySpec {
    section: Section::Auth,
    name: "tokens_file",
    kind: Kind::File {
        example: "/etc/taskgate/tokens.toml",
    },
    doc: "Static API tokens, as `[[token]]` tables holding only the `sha256:` hash of each secret (`taskgate token new` prints one). Must not be readable by other users (0640 root:taskgate). Setting it, or declaring an `[[auth.jwt]]` issuer, turns authentication on; turning it on or off takes a restart, while a reload re-reads the file.",
    flag: None,
    applies: Applies::Reload,
    env: None,
    default_from: None,
};
pub const AUTH_REVOCATIONS_FILE: KeySpec = KeySpec {
    section: Section::Auth,
    name: "revocations_file",
    kind: Kind::File {
        example: "/etc/taskgate/revocations.toml",
    },
    doc: "Revoked credentials, as `[[revoke]]` tables: a static token by `token` id, a JWT by `issuer` and `jti`, or everything an `issuer` gave a `subject` before `issued_before`. Re-read on reload, so a revocation needs no restart.",
    flag: None,
    applies: Applies::Reload,
    env: None,
    default_from: None,
};

pub const JWT_MAX_TOKEN_LIFETIME_SECS: KeySpec = KeySpec {
    applies: Applies::Reload,
    ..int(
        Section::AuthJwt,
        "max_token_lifetime_secs",
        3600,
        (60, 7 * DAY),
        Unit::Seconds,
        "Longest lifetime a token of this issuer may have, `exp` minus `iat` (or minus now, without `iat`); a longer-lived token is refused.",
    )
};
pub const JWT_LEEWAY_SECS: KeySpec = KeySpec {
    applies: Applies::Reload,
    ..int(
        Section::AuthJwt,
        "leeway_secs",
        30,
        (0, 300),
        Unit::Seconds,
        "Clock skew allowed when checking `exp`, `nbf` and `iat`.",
    )
};

/// The `[[tool]]` key that overrides a `[tools]` limit: the same range,
/// its default taken from that setting.
const fn per_tool(defaults: KeySpec, doc: &'static str, dotted: &'static str) -> KeySpec {
    KeySpec {
        section: Section::Tool,
        doc,
        default_from: Some(dotted),
        ..defaults
    }
}

pub const TOOL_MAX_ADDRESS_SPACE_BYTES: KeySpec = per_tool(
    TOOLS_MAX_ADDRESS_SPACE_BYTES,
    "Overrides `tools.max_address_space_bytes` for this tool.",
    "tools.max_address_space_bytes",
);
pub const TOOL_MAX_OPEN_FILES: KeySpec = per_tool(
    TOOLS_MAX_OPEN_FILES,
    "Overrides `tools.max_open_files` for this tool.",
    "tools.max_open_files",
);
pub const TOOL_MAX_PROCESSES: KeySpec = per_tool(
    TOOLS_MAX_PROCESSES,
    "Overrides `tools.max_processes` for this tool.",
    "tools.max_processes",
);
pub const TOOL_MAX_FILE_BYTES: KeySpec = per_tool(
    TOOLS_MAX_FILE_BYTES,
    "Overrides `tools.max_file_bytes` for this tool.",
    "tools.max_file_bytes",
);
pub const TOOL_MAX_CPU_SECS: KeySpec = per_tool(
    TOOLS_MAX_CPU_SECS,
    "Overrides `tools.max_cpu_secs` for this tool.",
    "tools.max_cpu_secs",
);

/// The settings of `[server]`, `[store]`, `[tasks]`, `[tools]`, `[log]` and
/// `[auth]`, in documented order.
pub static KEYS: &[KeySpec] = &[
    SERVER_LISTEN,
    SERVER_MAX_CONNECTIONS,
    SERVER_MAX_CONCURRENT_REQUESTS,
    SERVER_RESERVED_CONTROL_REQUESTS,
    SERVER_MAX_REQUEST_BYTES,
    SERVER_HEADER_READ_TIMEOUT_MS,
    SERVER_BODY_READ_TIMEOUT_MS,
    SERVER_MAX_SESSIONS,
    SERVER_SESSION_IDLE_SECS,
    SERVER_ALLOWED_ORIGINS,
    SERVER_TLS,
    SERVER_TLS_CERT_FILE,
    SERVER_TLS_KEY_FILE,
    STORE_DIRECTORY,
    STORE_QUEUE_DEPTH,
    STORE_MAX_LIVE_TASKS,
    STORE_MAX_LIVE_TASKS_PER_OWNER,
    STORE_CHECKPOINT_INTERVAL_SECS,
    STORE_MAX_DB_PAGES,
    TASKS_DEFAULT_TTL_SECS,
    TASKS_POLL_INTERVAL_MS,
    TASKS_MAX_RUNNING,
    TASKS_MAX_RUNNING_PER_OWNER,
    TASKS_CANCEL_GRACE_MS,
    TASKS_ARTIFACTS_MAX_TOTAL_BYTES,
    TASKS_ARTIFACT_MAX_BYTES,
    TOOLS_READ_PATHS,
    TOOLS_MAX_ADDRESS_SPACE_BYTES,
    TOOLS_MAX_OPEN_FILES,
    TOOLS_MAX_PROCESSES,
    TOOLS_MAX_FILE_BYTES,
    TOOLS_MAX_CPU_SECS,
    LOG_FILTER,
    AUTH_LOCAL_OWNER,
    AUTH_RESOURCE,
    AUTH_REALM,
    AUTH_TOKENS_FILE,
    AUTH_REVOCATIONS_FILE,
];

/// The bounded keys of each `[[tool]]` table (the others are described in
/// the man page's prose: they have no default to speak of).
pub static TOOL_KEYS: &[KeySpec] = &[
    TOOL_TIMEOUT_SECS,
    TOOL_MAX_STDOUT_BYTES,
    TOOL_MAX_STDERR_BYTES,
    TOOL_MAX_ADDRESS_SPACE_BYTES,
    TOOL_MAX_OPEN_FILES,
    TOOL_MAX_PROCESSES,
    TOOL_MAX_FILE_BYTES,
    TOOL_MAX_CPU_SECS,
];

/// The bounded keys of each `[[auth.jwt]]` table (the others are described
/// in the man page's prose).
pub static JWT_KEYS: &[KeySpec] = &[JWT_MAX_TOKEN_LIFETIME_SECS, JWT_LEEWAY_SECS];

/// The setting `section.name`, if there is one.
pub fn find(section: &str, name: &str) -> Option<&'static KeySpec> {
    KEYS.iter()
        .find(|k| k.section.name() == section && k.name == name)
}

/// The setting an environment variable names, if any.
pub fn by_env_var(var: &str) -> Option<&'static KeySpec> {
    KEYS.iter().find(|k| k.env_var().as_deref() == Some(var))
}

// ---- rendering -------------------------------------------------------

/// How a medium writes the parts of a line.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Medium {
    /// Comments of the starter TOML file: plain ASCII.
    Toml,
    Markdown,
    Roff,
}

fn human_bytes(v: u64) -> String {
    for (unit, size) in [("GiB", GIB), ("MiB", MIB), ("KiB", KIB)] {
        if v >= size && v.is_multiple_of(size) {
            return format!("{} {unit}", v / size);
        }
    }
    v.to_string()
}

fn value_text(spec: &IntSpec, v: u64) -> String {
    match spec.unit {
        Unit::Bytes => human_bytes(v),
        _ => v.to_string(),
    }
}

/// The default as a medium shows it (roff escaped).
fn default_text(key: &KeySpec, medium: Medium) -> String {
    if let Some(from) = key.default_from {
        return match medium {
            Medium::Markdown => format!("`{from}`"),
            Medium::Roff => format!("\\fB{}\\fR", roff_escape(from)),
            Medium::Toml => from.to_string(),
        };
    }
    let text = match key.kind {
        Kind::Address { default } | Kind::Filter { default } => default.to_string(),
        Kind::Path | Kind::Paths | Kind::Origins | Kind::File { .. } => "none".to_string(),
        Kind::Int(spec) => value_text(&spec, spec.default),
        Kind::Choice { default, .. } => default.to_string(),
        Kind::Text { default, .. } => default.unwrap_or("none").to_string(),
    };
    match medium {
        Medium::Roff => roff_escape(&text),
        _ => text,
    }
}

fn range_text(key: &KeySpec, medium: Medium) -> String {
    let dash = if medium == Medium::Toml { "-" } else { "–" };
    match key.kind {
        Kind::Address { .. } => "IP:port (loopback unless [auth] and server.tls)".to_string(),
        Kind::Path | Kind::File { .. } => "absolute path".to_string(),
        Kind::Filter { .. } => "tracing filter".to_string(),
        Kind::Choice { choices, .. } => choices.join(", "),
        Kind::Text { rule, .. } => rule.label().replace('–', dash),
        Kind::Paths => "absolute paths".to_string(),
        Kind::Origins => "origins (http[s]://host[:port])".to_string(),
        Kind::Int(spec) => {
            let mut s = format!(
                "{}{dash}{}",
                value_text(&spec, spec.min),
                value_text(&spec, spec.max)
            );
            if let Some(other) = spec.at_most {
                let _ = write!(s, ", at most {other}");
            }
            s
        }
    }
}

/// The doc line for a medium: backquoted spans become code, bold or plain.
fn doc_text(text: &str, medium: Medium) -> String {
    let mut out = String::new();
    for (i, part) in text.split('`').enumerate() {
        let code = i % 2 == 1;
        match medium {
            Medium::Markdown if code => {
                let _ = write!(out, "`{part}`");
            }
            Medium::Roff if code => {
                let _ = write!(out, "\\fB{}\\fR", roff_escape(part));
            }
            Medium::Roff => out.push_str(&roff_escape(part)),
            _ => out.push_str(part),
        }
    }
    out
}

/// Escapes text for the body of a roff line.
fn roff_escape(text: &str) -> String {
    text.replace('\\', "\\e")
        .replace('-', "\\-")
        .replace('–', "\\(en")
}

/// A roff text line, guarded against a leading control character.
fn roff_line(text: &str) -> String {
    if text.starts_with('.') || text.starts_with('\'') {
        format!("\\&{text}\n")
    } else {
        format!("{text}\n")
    }
}

fn wrap_comment(text: &str, out: &mut String) {
    let mut line = String::from("#");
    for word in text.split_whitespace() {
        if line.len() + 1 + word.len() > 78 && line.len() > 1 {
            out.push_str(&line);
            out.push('\n');
            line = String::from("#");
        }
        line.push(' ');
        line.push_str(word);
    }
    out.push_str(&line);
    out.push('\n');
}

/// The state directory of the packaged service (systemd's StateDirectory=).
pub const PACKAGE_STATE_DIR: &str = "/var/lib/taskgate";

/// The commented starter configuration written by `taskgate init` (and
/// shipped as the package's conffile); with a directory, `[store]
/// directory` is set to it, so that `taskgate check --config` run by an
/// operator looks where the service keeps its state.
pub fn starter_config(directory: Option<&str>) -> String {
    let mut s = String::from(
        "# taskgate configuration. Every key is optional; the values shown are the
# defaults. Settings are read at startup; `systemctl reload taskgate` (SIGHUP)
# re-reads this file and applies the tools and the keys marked \"Applied on
# reload\" to new calls, and refuses, naming it in the log, a change to any
# other key until a restart. Test the file with `taskgate check --config-only`.
# Any key can also be set in the environment as TASKGATE_<SECTION>_<KEY>, e.g.
# TASKGATE_STORE_QUEUE_DEPTH=256 (log.filter is TASKGATE_LOG); the environment
# overrides this file and command-line flags override both. See
# taskgate.toml(5).
",
    );
    for section in Section::SETTINGS {
        let _ = write!(s, "\n[{}]\n", section.name());
        for (i, key) in KEYS.iter().filter(|k| k.section == section).enumerate() {
            if i > 0 {
                s.push('\n');
            }
            let mut doc = doc_text(key.doc, Medium::Toml);
            if let Kind::Int(_) = key.kind {
                let _ = write!(doc, " Range {}.", range_text(key, Medium::Toml));
            }
            let _ = write!(doc, " {}", key.applies_text());
            wrap_comment(&doc, &mut s);
            let _ = match key.kind {
                Kind::Address { default } | Kind::Filter { default } => {
                    writeln!(s, "{} = {default:?}", key.name)
                }
                Kind::Path => match directory {
                    Some(d) => writeln!(s, "{} = {d:?}", key.name),
                    None => writeln!(s, "# {} = {PACKAGE_STATE_DIR:?}", key.name),
                },
                Kind::Paths | Kind::Origins => writeln!(s, "{} = []", key.name),
                Kind::Int(spec) => writeln!(s, "{} = {}", key.name, spec.default),
                Kind::Choice { default, .. }
                | Kind::Text {
                    default: Some(default),
                    ..
                } => writeln!(s, "{} = {default:?}", key.name),
                Kind::Text {
                    default: None,
                    example,
                    ..
                }
                | Kind::File { example } => writeln!(s, "# {} = {example:?}", key.name),
            };
        }
    }
    s.push_str(
        r#"
# A trusted issuer of JWT access tokens (RFC 9068), checked offline against
# its keys in a local JWKS file; see taskgate.toml(5) for every key.
#
# [[auth.jwt]]
# issuer = "https://idp.example.com/realms/acme"   # the exact `iss`
# jwks_file = "/etc/taskgate/jwks/acme.json"
# algorithms = ["EdDSA", "ES256", "RS256"]
# tenant_claim = "tid"          # or a fixed tenant = "acme"
# scope_claim = "scope"         # scope (space-separated) | scp (array)
"#,
    );
    s.push_str(
        r#"
# Tools are commands. This one would run `/usr/bin/date -u +FORMAT` as a
# background task for clients that negotiate Tasks; see taskgate.toml(5).
# Tools are applied on reload: new calls get the new definitions, running
# calls keep the one they started with.
#
# [[tool]]
# name = "utc_date"
# description = "Prints the current UTC date in the given strftime format."
# argv = ["/usr/bin/date", "-u", "+{format}"]
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
    );
    s
}

/// The first and last lines around the generated table in
/// docs/operations.md.
pub const REFERENCE_BEGIN: &str =
    "<!-- configuration keys: generated by `taskgate man --reference`; edit src/config/keys.rs -->";
pub const REFERENCE_END: &str = "<!-- end of configuration keys -->";

fn markdown_rows(keys: &[KeySpec], out: &mut String) {
    // Keys of repeated tables are named without their section.
    let _ = writeln!(out, "| key | default | range | applied | meaning |");
    let _ = writeln!(out, "|---|---|---|---|---|");
    for key in keys {
        let mut meaning = doc_text(key.doc, Medium::Markdown);
        if let Some(flag) = key.flag {
            let _ = write!(meaning, " Flag: `{flag}`.");
        }
        let name = if key.section.repeated() {
            key.name.to_string()
        } else {
            key.dotted()
        };
        let _ = writeln!(
            out,
            "| `{name}` | {} | {} | {} | {meaning} |",
            default_text(key, Medium::Markdown),
            range_text(key, Medium::Markdown),
            key.applies.label(),
        );
    }
}

/// The reference tables of docs/operations.md (settings, then the bounded
/// keys of a `[[tool]]`), markers included.
pub fn reference_markdown() -> String {
    let mut s = format!("{REFERENCE_BEGIN}\n");
    markdown_rows(KEYS, &mut s);
    s.push_str("\nBounded keys of each `[[tool]]` table (see *Tools* below):\n\n");
    markdown_rows(TOOL_KEYS, &mut s);
    s.push_str("\nBounded keys of each `[[auth.jwt]]` table (see *Credentials* below):\n\n");
    markdown_rows(JWT_KEYS, &mut s);
    s.push_str(REFERENCE_END);
    s.push('\n');
    s
}

fn roff_key(key: &KeySpec, out: &mut String) {
    out.push_str(".TP\n");
    let _ = writeln!(out, ".B {}", key.name);
    let mut text = doc_text(key.doc, Medium::Roff);
    let _ = write!(text, " Default {}", default_text(key, Medium::Roff));
    match key.kind {
        Kind::Int(_) => {
            let _ = write!(
                text,
                "; range {}",
                roff_escape(&range_text(key, Medium::Roff))
            );
        }
        Kind::Choice { .. } => {
            let _ = write!(
                text,
                "; one of {}",
                roff_escape(&range_text(key, Medium::Roff))
            );
        }
        _ => {}
    }
    text.push('.');
    let _ = write!(text, " {}", key.applies_text());
    if let Some(flag) = key.flag {
        let _ = write!(text, " Overridden by \\fB{}\\fR.", roff_escape(flag));
    }
    if let Some(var) = key.env_var() {
        let _ = write!(text, " Environment: {}.", roff_escape(&var));
    }
    out.push_str(&roff_line(&text));
}

/// The taskgate.toml(5) man page.
pub fn man_page() -> String {
    let mut s = format!(
        ".TH TASKGATE.TOML 5 \"\" \"taskgate {}\" \"File Formats\"\n",
        env!("CARGO_PKG_VERSION")
    );
    s.push_str(
        r#".SH NAME
taskgate.toml \- configuration of the taskgate MCP Tasks daemon
.SH SYNOPSIS
.B /etc/taskgate/taskgate.toml
.SH DESCRIPTION
A TOML file read by
.BR taskgate (1)
at startup. Every key is optional; the embedded defaults apply to keys left out.
On
.B systemctl reload taskgate
(which runs
.BR "taskgate reload" ,
waiting for the outcome) or SIGHUP the daemon reads the file again: it applies the tools and the keys marked
\(lqApplied on reload\(rq to new calls (a running call keeps the tool it started with),
refuses a change to any other key with one log line naming it (that key keeps its
old value until a restart), and keeps every old setting when the new file is invalid.
.B taskgate check \-\-config\-only
tests a file without touching the state directory, also while the daemon serves.
Any key can also be given in the environment (see ENVIRONMENT), which overrides
the file; command\-line flags override both. Unknown keys, relative paths and values out of
range refuse the start with exit status 78, naming the key.
.B taskgate init
prints a commented file with every key and its default.
"#,
    );
    for section in Section::SETTINGS {
        let _ = writeln!(s, ".SH \"[{}]\"", section.name());
        for key in KEYS.iter().filter(|k| k.section == section) {
            roff_key(key, &mut s);
        }
    }
    s.push_str(
        r#".SH "[[tool]]"
Each table declares a command tool:
.BR name ,
.BR description ,
.B argv
(absolute program path, then arguments with
.BI { name }
placeholders filled from the call's arguments; never a shell),
.B input_schema
(JSON Schema of the arguments),
.B working_dir
(absolute),
.B env
(variable names passed through),
.B effect
(read_only, idempotent_write or non_idempotent_write, the default) and
.B task
(never, the default, optional or required). A non_idempotent_write tool cannot run as a task.
Its confinement:
.B read_paths
(absolute paths it may read and execute beside the built\-in set; replaces
.BR tools.read_paths ),
.B write_paths
(absolute paths it may also write, beside its working directory) and
.B sandbox
(landlock, the default, or unconfined: written for each tool that is to run without
filesystem confinement, never a default). The bounded keys; a limit left out is the
.B [tools]
one:
"#,
    );
    for key in TOOL_KEYS {
        roff_key(key, &mut s);
    }
    s.push_str(
        r#".SH "[[auth.jwt]]"
Each table trusts one issuer of JWT access tokens, checked offline:
.B issuer
(the exact
.B iss
claim; required),
.B jwks_file
(absolute path of the issuer's public keys as a JWKS document),
.B hmac_secret_file
(absolute path of a shared secret; the only way to allow HS256, HS384 or HS512),
.B audiences
(accepted
.B aud
values; default the
.B resource
of [auth]),
.B algorithms
(allow\-list among EdDSA, ES256, ES384, RS256, RS384, RS512, PS256, PS384, PS512 and, with a secret, HS256, HS384, HS512; default EdDSA, ES256, RS256;
.B none
is never accepted),
.B require_typ
(the header's
.BR typ ,
default at+jwt as RFC 9068 asks; an empty string accepts any),
.B tenant_claim
or
.B tenant
(the claim naming the tenant, or one fixed tenant; exactly one is required),
.B scope_claim
(scope, a space\-separated string, the default; or scp, an array) and
.B advertise
(list the issuer as an authorization server in the protected resource metadata; default false).
The bounded keys:
"#,
    );
    for key in JWT_KEYS {
        roff_key(key, &mut s);
    }
    s.push_str(
        r#".SH ENVIRONMENT
.TP
.BI TASKGATE_ SECTION _ KEY
Any key of [server], [store], [tasks] and [auth], for example
.BR TASKGATE_STORE_QUEUE_DEPTH=256 .
It overrides the file; a command\-line flag overrides it. A variable with this prefix
that names no key refuses the start (78). [[tool]] and [[auth.jwt]] keys have no variables.
.TP
.B TASKGATE_LOG
The log filter,
.BR "[log] filter" .
Set, it overrides the file, also on reload: a changed filter in the file is then
not applied.
.TP
.B TASKGATE_CONFIG
The configuration file, when
.B \-\-config
is not given.
.TP
.B STATE_DIRECTORY
Set by systemd's StateDirectory=: the state directory, ahead of
.BR "[store] directory" ,
which must then name the same directory or be left out.
.TP
.B XDG_STATE_HOME
Without any other choice the state directory is $XDG_STATE_HOME/taskgate
(~/.local/state/taskgate), created 0700.
.TP
.B RUNTIME_DIRECTORY
Set by systemd's RuntimeDirectory=: where the admin socket is made.
.SH FILES
.TP
.I /var/lib/taskgate
The state directory: tasks.db, its \-wal and \-shm files, tasks.lock and artifacts/.
.SH "SEE ALSO"
.BR taskgate (1),
.BR taskgate\-backup (8),
.BR taskgate\-restore (8),
/usr/share/doc/taskgate/operations.md
"#,
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_unique_and_defaults_in_range() {
        let all: Vec<&KeySpec> = KEYS.iter().chain(TOOL_KEYS).chain(JWT_KEYS).collect();
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert!(a.dotted() != b.dotted(), "{} twice", a.dotted());
            }
            if let Kind::Int(spec) = a.kind {
                assert!(spec.range().contains(&spec.default), "{}", a.dotted());
                if let Some(other) = spec.at_most {
                    let (s, n) = other.split_once('.').unwrap_or(("", other));
                    assert!(find(s, n).is_some(), "{} names {other}", a.dotted());
                }
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
        for key in KEYS.iter().chain(TOOL_KEYS).chain(JWT_KEYS) {
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
