//! Logging: structured fields to journald when stderr is the journal,
//! plain lines on stderr otherwise.
//!
//! The filter is the `log.filter` key. The logger starts before any
//! configuration is read, with `TASKGATE_LOG` (that key's variable) or the
//! default, so that startup itself is logged as asked; `serve` then applies
//! the configured filter ([`apply_filter`]) as soon as its configuration is
//! validated, and again on every reload. The filter sits behind a reload
//! layer; the cap on the protocol libraries ([`CAPPED_TARGETS`]) is a layer
//! of its own that no filter lifts.
//!
//! Journal hygiene: every message's text carries its values (an address,
//! a path, counts), because `journalctl` shows only the text unless asked
//! for `-o verbose`; the events an operator or a monitor looks for carry a
//! stable `MESSAGE_ID` ([`crate::events`]) explained in the journal catalog the
//! package ships (`packaging/taskgate.catalog`); a refused start is an
//! error (priority 3), so `journalctl -p err` finds it; a request a client
//! got wrong is the client's error, never a warning in our journal.
//!
//! Owns log sink. journald with structured fields when stderr *is* the journal,
//! else stderr; fields without a prefix (`MESSAGE_ID=`, `STATE_DIR=`, …); a
//! refusal that ends the process goes through `logging::refused` (an
//! error-priority event with its `MESSAGE_ID` under the journal, one stderr
//! line otherwise); rmcp's `service` and HTTP-transport targets are held at
//! error, because their warnings are about a client's request
//! (`tests/journal_hygiene.rs`, which also checks that message text carries its
//! values). The filter is the `log.filter` key (its variable `TASKGATE_LOG`
//! overrides the file): the logger starts with the variable or the default
//! before any configuration is read, then `service` applies the effective
//! filter through a `tracing_subscriber` reload layer (`logging::apply_filter`)
//! at start and on every reload; rmcp, hyper, axum and tower are held at warn
//! whatever it says (a separate cap layer no filter lifts), because their debug
//! and trace events carry raw requests (invariant 4). Spans: `call` (tool,
//! owner tag), `task` (task ID, tool, owner tag), `poll`, `cancel`; the owner
//! tag is the first 8 hex digits of the owner digest, never the identity. The
//! store thread runs each command inside its caller's span, so one request can
//! be followed into the store.

use std::os::unix::fs::MetadataExt;
use std::sync::{Mutex, OnceLock};

use thiserror::Error;

use tracing::level_filters::LevelFilter;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::reload;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::{DEFAULT_LOG_FILTER, ENV_LOG};
use crate::events as ids;

/// systemd sets `JOURNAL_STREAM=dev:ino` for a stderr connected to the
/// journal; a child that inherited the variable but not the stream must
/// not write to journald, so compare with our own stderr.
fn stderr_is_journal() -> bool {
    let Ok(value) = std::env::var("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = value.split_once(':') else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    match std::fs::metadata("/proc/self/fd/2") {
        Ok(m) => m.dev() == dev && m.ino() == ino,
        Err(_) => false,
    }
}

/// The default filter (`log.filter`'s default): taskgate's own events at
/// info; the protocol libraries only when something is wrong.
pub const DEFAULT_FILTER: &str = DEFAULT_LOG_FILTER;

#[derive(Debug, Error)]
pub enum LogError {
    #[error("{filter:?} is not a log filter: {reason}")]
    Invalid { filter: String, reason: String },
    #[error("the logger was not installed; the filter cannot change")]
    NotInstalled,
    #[error("the log filter could not be replaced: {0}")]
    Reload(String),
}

/// The installed filter's reload handle, and the text it was built from.
struct Filter {
    handle: reload::Handle<EnvFilter, tracing_subscriber::Registry>,
    text: Mutex<String>,
}

/// Set once by [`init`] when its subscriber was installed.
static FILTER: OnceLock<Filter> = OnceLock::new();

fn parse(text: &str) -> Result<EnvFilter, LogError> {
    EnvFilter::builder()
        .parse(text)
        .map_err(|e| LogError::Invalid {
            filter: text.to_string(),
            reason: e.to_string(),
        })
}

/// The filter before any configuration is read: `TASKGATE_LOG` if it is
/// set and valid, else the default. An invalid variable is refused when
/// the configuration is loaded (exit 78); until then the default applies.
fn initial() -> (EnvFilter, String) {
    if let Ok(text) = std::env::var(ENV_LOG)
        && let Ok(filter) = parse(&text)
    {
        return (filter, text);
    }
    let filter = parse(DEFAULT_FILTER).unwrap_or_else(|_| EnvFilter::new("info"));
    (filter, DEFAULT_FILTER.to_string())
}

/// Replaces the filter with `text` (already validated by the
/// configuration, and parsed again here). Returns whether it changed; an
/// invalid filter leaves the old one in place.
pub fn apply_filter(text: &str) -> Result<bool, LogError> {
    let installed = FILTER.get().ok_or(LogError::NotInstalled)?;
    let mut current = installed.text.lock().unwrap_or_else(|p| p.into_inner());
    if *current == text {
        return Ok(false);
    }
    let filter = parse(text)?;
    installed
        .handle
        .reload(filter)
        .map_err(|e| LogError::Reload(e.to_string()))?;
    *current = text.to_string();
    Ok(true)
}

/// The filter in force now.
pub fn current_filter() -> Option<String> {
    FILTER
        .get()
        .map(|f| f.text.lock().unwrap_or_else(|p| p.into_inner()).clone())
}

/// Libraries whose debug and trace events carry request and response
/// bodies (rmcp logs every received request with its tool arguments, and
/// every result) or raw protocol bytes. Raw arguments, results, tokens and
/// operation references never reach the log at any level, so these are
/// held at warn whatever `log.filter` asks for.
pub const CAPPED_TARGETS: &[&str] = &[
    "rmcp",
    "hyper",
    "hyper_util",
    "h2",
    "axum",
    "axum_core",
    "tower",
    "tower_http",
];

/// rmcp modules whose warnings are about a peer's request, not about
/// taskgate: `rmcp::service` logs every request the handler refused
/// ("response error", with a Debug dump of the error: one line per refused
/// poll) and every request refused before it (`rejected peer request`);
/// `rmcp::service::server` a failed version negotiation; the streamable
/// HTTP transport a bad Host, Origin or protocol header. The client got
/// the error in its answer; in our journal these are held at error, so a
/// warning there is always about the daemon itself. taskgate's own targets
/// are not touched.
pub const CLIENT_CAUSED_TARGETS: &[&str] =
    &["rmcp::service", "rmcp::transport::streamable_http_server"];

/// The cap applied after the operator's filter: an event must pass both.
fn cap() -> Targets {
    let capped = CAPPED_TARGETS.iter().fold(
        Targets::new().with_default(LevelFilter::TRACE),
        |t, name| t.with_target(*name, LevelFilter::WARN),
    );
    CLIENT_CAUSED_TARGETS
        .iter()
        .fold(capped, |t, name| t.with_target(*name, LevelFilter::ERROR))
}

/// Whether a field is the first one written: each event's (and span's)
/// field visitor gets a fresh clone of the formatter, so a fresh flag.
struct First(std::sync::atomic::AtomicBool);

impl Default for First {
    fn default() -> Self {
        First(std::sync::atomic::AtomicBool::new(true))
    }
}

impl Clone for First {
    fn clone(&self) -> Self {
        First::default()
    }
}

impl First {
    fn take(&self) -> bool {
        self.0.swap(false, std::sync::atomic::Ordering::Relaxed)
    }
}

/// Whether events go to the journal (set once by [`init`]).
static TO_JOURNAL: OnceLock<bool> = OnceLock::new();

/// Reports a refusal that ends the process: one line on stderr, as every
/// command does; under systemd (stderr is the journal) it is an error
/// event instead, with [`ids::REFUSED`] and the exit status, because a
/// line on the journal's stderr stream is stored at info priority and
/// `journalctl -p err` would miss it.
pub fn refused(line: &str, exit_status: u8) {
    use std::io::Write as _;
    if TO_JOURNAL.get().copied().unwrap_or(false) {
        tracing::error!(message_id = ids::REFUSED, exit_status, "{line}");
        // journald learns which unit a message came from by reading the
        // sender's /proc entry when the datagram arrives; a process that
        // is already gone leaves the line without its unit, and
        // `journalctl -u taskgate` would not show it. A refusing process
        // has nothing else to do: give journald a moment.
        std::thread::sleep(std::time::Duration::from_millis(200));
    } else {
        let _ = writeln!(std::io::stderr(), "{line}");
    }
}

pub fn init() {
    let (filter, text) = initial();
    let (filter, handle) = reload::Layer::new(filter);
    let installed = || {
        let _ = FILTER.set(Filter {
            handle,
            text: Mutex::new(text),
        });
    };
    if stderr_is_journal()
        && let Ok(layer) = tracing_journald::layer()
    {
        // Fields keep their own names (STATE_DIR=, LISTEN=, TASK=), and
        // `message_id` becomes the journal's MESSAGE_ID=, which the
        // catalog matches on; the default "F_" prefix would hide it.
        let layer = layer
            .with_syslog_identifier("taskgate".into())
            .with_field_prefix(None);
        if tracing_subscriber::registry()
            .with(filter)
            .with(cap())
            .with(layer)
            .try_init()
            .is_ok()
        {
            let _ = TO_JOURNAL.set(true);
            installed();
        }
        return;
    }
    let _ = TO_JOURNAL.set(false);
    // The message ID is for the journal; on a terminal or in a file it is
    // noise. Every other field is printed as `name=value`.
    let first = First::default();
    let fields = tracing_subscriber::fmt::format::debug_fn(move |w, field, value| {
        if field.name() == "message_id" {
            return Ok(());
        }
        let sep = if first.take() { "" } else { " " };
        if field.name() == "message" {
            write!(w, "{sep}{value:?}")
        } else {
            write!(w, "{sep}{}={value:?}", field.name())
        }
    });
    if tracing_subscriber::registry()
        .with(filter)
        .with(cap())
        .with(
            tracing_subscriber::fmt::layer()
                .fmt_fields(fields)
                .with_writer(std::io::stderr)
                .with_target(false)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
        )
        .try_init()
        .is_ok()
    {
        installed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;

    #[test]
    fn the_cap_holds_protocol_libraries_at_warn_and_lets_taskgate_through() {
        let cap = cap();
        for name in CAPPED_TARGETS {
            let sub = format!("{name}::handler");
            for target in [*name, sub.as_str()] {
                assert!(cap.would_enable(target, &Level::WARN), "{target}");
                assert!(!cap.would_enable(target, &Level::INFO), "{target}");
                assert!(!cap.would_enable(target, &Level::DEBUG), "{target}");
                assert!(!cap.would_enable(target, &Level::TRACE), "{target}");
            }
        }
        assert!(cap.would_enable("taskgate::tasks", &Level::TRACE));
    }

    #[test]
    fn client_caused_rmcp_warnings_are_held_at_error_and_taskgate_warnings_pass() {
        let cap = cap();
        for target in [
            "rmcp::service",
            "rmcp::service::server",
            "rmcp::transport::streamable_http_server::tower",
        ] {
            assert!(!cap.would_enable(target, &Level::WARN), "{target}");
            assert!(cap.would_enable(target, &Level::ERROR), "{target}");
        }
        // Other rmcp modules keep their warnings.
        assert!(cap.would_enable("rmcp::transport::io", &Level::WARN));
        for target in ["taskgate", "taskgate::service", "taskgate::store::engine"] {
            assert!(cap.would_enable(target, &Level::WARN), "{target}");
        }
    }

    #[test]
    fn message_ids_are_distinct_128_bit_ids_and_each_has_a_catalog_entry() {
        let catalog = include_str!("../packaging/taskgate.catalog");
        let mut seen = std::collections::HashSet::new();
        for (name, id) in ids::ALL {
            assert_eq!(id.len(), 32, "{name}");
            assert!(
                id.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
                "{name}: {id}"
            );
            assert!(seen.insert(id), "{name} repeats {id}");
            let header = format!("-- {id}\n");
            assert!(catalog.contains(&header), "{name}: no catalog entry {id}");
        }
        // And no entry for an ID the code no longer has.
        for line in catalog.lines().filter(|l| l.starts_with("-- ")) {
            let id = line
                .trim_start_matches("-- ")
                .split_whitespace()
                .next()
                .unwrap_or("");
            assert!(
                seen.contains(id),
                "catalog entry {id} matches no ID in the code"
            );
        }
    }
}
