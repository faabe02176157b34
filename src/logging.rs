//! Logging: structured fields to journald when stderr is the journal,
//! plain lines on stderr otherwise. `TASKGATE_LOG` sets the filter.

use std::os::unix::fs::MetadataExt;

use tracing_subscriber::EnvFilter;
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

pub fn init() {
    let filter =
        || EnvFilter::try_from_env(ENV_LOG).unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    if stderr_is_journal()
        && let Ok(layer) = tracing_journald::layer()
    {
        let _ = tracing_subscriber::registry()
            .with(filter())
            .with(layer.with_syslog_identifier("taskgate".into()))
            .try_init();
        return;
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter())
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}
