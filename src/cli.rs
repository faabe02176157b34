//! Command-line definitions. The contract is stable: tests, docs and the
//! systemd unit rely on these names.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::Overrides;

#[derive(Debug, Parser)]
#[command(
    name = "taskgate",
    version,
    about = "Durable MCP Tasks daemon backed by SQLite",
    long_about = "taskgate serves the MCP Tasks extension (io.modelcontextprotocol/tasks, \
revision 2026-07-28) from a private SQLite store: a task a client was told exists is on disk, \
survives restarts, and is never run twice.\n\n\
Exit codes: 0 ok, 64 usage, 65 database validation failed, 74 I/O or recovery failure, \
75 ownership lock held, 77 unsafe path or permissions, 78 invalid configuration."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon: validate the state directory and database, recover,
    /// then serve until SIGTERM or SIGINT.
    Serve(ServeArgs),
    /// Run every startup validation read-only, print what was found, and
    /// exit with the code serve would refuse with. Serves nothing.
    Check(CommonArgs),
    /// Write a commented starter configuration (to stdout without --config).
    Init(InitArgs),
}

#[derive(Debug, Args)]
pub struct CommonArgs {
    /// Configuration file (TOML). Also $TASKGATE_CONFIG. Without one, the
    /// embedded defaults apply.
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// State directory (absolute). Overrides $STATE_DIRECTORY and
    /// [store] directory; the default is $XDG_STATE_HOME/taskgate.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// HTTP listen address, e.g. 127.0.0.1:8765 (loopback only).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
}

#[derive(Debug, Args)]
pub struct InitArgs {
    /// Where to write the starter configuration; refuses to overwrite.
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
}

impl CommonArgs {
    pub fn overrides(&self) -> Overrides {
        Overrides {
            config_path: self.config.clone(),
            state_dir: self.state_dir.clone(),
            listen: None,
        }
    }
}

impl ServeArgs {
    pub fn overrides(&self) -> Overrides {
        Overrides {
            listen: self.listen.clone(),
            ..self.common.overrides()
        }
    }
}
