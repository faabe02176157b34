//! Logging: structured fields to journald when stderr is the journal,
//! plain lines on stderr otherwise. `TASKGATE_LOG` sets the filter.

use std::os::unix::fs::MetadataExt;

use tracing::level_filters::LevelFilter;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::ENV_LOG;

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

/// The default filter: taskgate's own events at info; the protocol
/// libraries only when something is wrong (rmcp reports every finished
/// stateless request at info, which would flood the journal).
pub const DEFAULT_FILTER: &str = "info,rmcp=warn,hyper=warn,axum=warn,tower=warn";

/// Libraries whose debug and trace events carry request and response
/// bodies (rmcp logs every received request with its tool arguments, and
/// every result) or raw protocol bytes. Raw arguments, results, tokens and
/// operation references never reach the log at any level, so these are
/// held at warn whatever `TASKGATE_LOG` asks for.
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

/// The cap applied after the operator's filter: an event must pass both.
fn cap() -> Targets {
    CAPPED_TARGETS.iter().fold(
        Targets::new().with_default(LevelFilter::TRACE),
        |t, name| t.with_target(*name, LevelFilter::WARN),
    )
}

pub fn init() {
    let filter =
        || EnvFilter::try_from_env(ENV_LOG).unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    if stderr_is_journal()
        && let Ok(layer) = tracing_journald::layer()
    {
        let _ = tracing_subscriber::registry()
            .with(filter())
            .with(cap())
            .with(layer.with_syslog_identifier("taskgate".into()))
            .try_init();
        return;
    }
    let _ = tracing_subscriber::registry()
        .with(filter())
        .with(cap())
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_target(false)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
        )
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;

    #[test]
    fn the_cap_holds_protocol_libraries_at_warn_and_lets_taskgate_through() {
        let cap = cap();
        for name in CAPPED_TARGETS {
            let sub = format!("{name}::service");
            for target in [*name, sub.as_str()] {
                assert!(cap.would_enable(target, &Level::WARN), "{target}");
                assert!(!cap.would_enable(target, &Level::INFO), "{target}");
                assert!(!cap.would_enable(target, &Level::DEBUG), "{target}");
                assert!(!cap.would_enable(target, &Level::TRACE), "{target}");
            }
        }
        assert!(cap.would_enable("taskgate::tasks", &Level::TRACE));
    }
}
