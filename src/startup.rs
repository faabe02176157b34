//! Opening a state directory, for `serve` and for `check`: the private
//! directory and its files, the lifetime lock (startup steps 3–4, listed
//! below), then the artifacts and the store (steps 5–9:
//! inspection, validation, opening for writing, artifacts, recovery).
//!
//! A refused start leaves every file as it was: everything that can refuse
//! runs read-only before the first file is created or written (the state
//! directory's files, the lock, the database's validation, the artifacts
//! directory); after the first write only an I/O error can stop a start,
//! and every write step is a transaction or a cleanup the next start
//! repeats.
//!
//! Step 1, the effective settings, is one function ([`effective`]) for
//! `serve`, `check`, `check --config-only` and a reload: what one accepts
//! the others accept.
//!
//! Owns opening a state directory. `open_serving` for `serve` (claim, then open
//! the durable parts: `parts::task_store::open_serving` inspects the artifacts
//! directory and validates the database read-only, opens for writing, removes
//! the artifacts' crash leftovers, recovers) and `check` for the read-only path
//! (every part's `Part::check`). A refused start changes no file.
//!
//! The startup order, step by step (what; where; the exit code of a refusal):
//!
//! - Step 0: SIGTERM/SIGINT handlers (`service/control.rs`; 74 (cannot
//!   install)).
//!
//! - Step 1: configuration, exposure policy, tools compiled, stdio upstreams'
//!   confinement checked, upstream pins read (`config/`, `http/exposure.rs`,
//!   `tools/`, `upstream/pins.rs`; 78).
//!
//! - Step 2: bind the listener (HTTP) (`service/mod.rs`; 74).
//!
//! - Step 3: state directory, ancestors, files (`state_dir.rs`; 77).
//!
//! - Step 4: lifetime lock (`state_dir.rs`; 75 (77 if the lock file is
//!   unsafe)).
//!
//! - Step 5: artifacts directory inspected, read-only: ours, private, listable
//!   and writable by this process (a read-only mount is refused), bytes in use
//!   counted (`artifacts.rs`; 77 (74 on I/O)).
//!
//! - Step 6: store identity against `tasks.lock`, pragmas, schema version,
//!   `integrity_check`, every kind's shape and records, all read-only
//!   (the store engine's `open.rs`; 65 (74 on I/O)).
//!
//! - Step 7: first write — open for writing: initialise, or run the missing
//!   migration steps; the store recorded in `tasks.lock` (the engine's `open.rs`,
//!   `store/migrate.rs`, `state_dir.rs`; 74).
//!
//! - Step 8: artifacts: created if missing, temporaries and results of
//!   unfinished tasks removed (`artifacts.rs`; 74).
//!
//! - Step 9: recovery, every kind's in one transaction: a nonterminal task →
//!   failed (interrupted) or cancelled (the engine's `open.rs`, `store/tasks.rs`; 74).
//!
//! - Step 10: serve: upstreams start connecting in the background (none delays
//!   READY; until one answers, its tools are absent), READY=1 + STATUS=
//!   (`service/mod.rs`, `service/chores.rs`, `upstream/`; —).
//!
//! Every refusal but an I/O error comes before step 7, so a refused start
//! writes nothing; from step 7 on, each write is a transaction or a cleanup the
//! next start repeats.
//!
//! `check` runs 1, 3–6 with a read-only connection and says what recovery would
//! do.

use std::collections::HashMap;
use std::sync::Arc;

use crate::artifacts::Artifacts;
use crate::config::{Config, Overrides, StateDirSource};
use crate::exit::Refusal;
use crate::parts::{Parts, task_store};
use crate::state_dir::{Actor, LifetimeLock, StateDir};
use crate::store::{Clock, OpenReport, Store, StoreId};
use crate::tools::{Registry, Runner};

/// The settings a start would run with, every one validated.
pub struct Effective {
    pub config: Config,
    /// The configured tools compiled (schemas, argv templates), with the
    /// built-ins beside them.
    pub tools: Registry,
    /// The credentials, read and validated; `None` when none are configured.
    pub auth: Option<crate::auth::Authenticator>,
    /// The TLS certificate and key, read and validated, when `server.tls = "on"`.
    pub tls: Option<crate::http::tls::Tls>,
    /// The reviewed digests of upstream tools (none without upstreams).
    pub pins: crate::upstream::Pins,
    /// The paths no tool or stdio upstream may reach.
    pub protected: Vec<std::path::PathBuf>,
}

/// Step 1: the configuration layered and checked key by key, the rules
/// between keys, the exposure rule (a listen address off loopback, from
/// any layer, needs credentials and TLS: `http::exposure`), the credential
/// files of `[auth]`, and the tools compiled under `tools`' rules (no
/// reserved name, no background non-idempotent write). Reads only the configuration file and the files it names; writes
/// nothing. `builtins` are the tools served beside the
/// configured ones (the benchmark's no-op).
pub fn effective(
    overrides: &Overrides,
    builtins: Vec<Arc<dyn Runner>>,
) -> Result<Effective, Refusal> {
    let env: HashMap<String, String> = std::env::vars().collect();
    effective_in(overrides, &env, builtins)
}

/// [`effective`] with the configuration layered from `env` instead of the
/// process's environment.
pub fn effective_in(
    overrides: &Overrides,
    env: &HashMap<String, String>,
    builtins: Vec<Arc<dyn Runner>>,
) -> Result<Effective, Refusal> {
    let config = Config::load_from(overrides, env)?;
    // A listener off loopback needs credentials and TLS, from any layer.
    crate::http::exposure::check(&config)?;
    // The credential files are configuration too: a start, `check` and a
    // reload read and validate them the same way (78 for content, 77 for
    // permissions) before anything is served.
    let auth = crate::auth::Authenticator::from_config(&config)?;
    let tls = match config.server.tls_files() {
        Some((cert, key)) => Some(crate::http::tls::Tls::load(cert, key)?),
        None => None,
    };
    let mut protected = crate::tools::confine::protected(&config.state_dir, config.file.as_deref());
    // The approval journal is the daemon's to append, never a tool's.
    protected.push(config.approvals.directory.clone());
    // An upstream's credential is for taskgate to present, never for a
    // tool to read.
    for u in &config.upstreams {
        if let crate::config::UpstreamTransport::Http {
            bearer_token_file: Some(file),
            ..
        } = &u.transport
        {
            protected.push(file.clone());
            // And where it really is, as for the configuration file.
            if let Ok(real) = std::fs::canonicalize(file)
                && real != *file
            {
                protected.push(real);
            }
        }
    }
    let tools = Registry::build(&config.tools, &protected, builtins)?;
    for u in &config.upstreams {
        if let crate::config::UpstreamTransport::Stdio(process) = &u.transport {
            crate::tools::command::check_confinement(process, &protected)?;
        }
    }
    crate::upstream::check_credentials(&config.upstreams)?;
    // The pins go with the upstreams: without any, a pins file is not read.
    let pins = match &config.file {
        Some(file) if !config.upstreams.is_empty() => {
            crate::upstream::Pins::load(&crate::config::pins_file(file))?
        }
        _ => crate::upstream::Pins::default(),
    };
    Ok(Effective {
        config,
        tools,
        auth,
        tls,
        pins,
        protected,
    })
}

/// A state directory found safe, with its lock held.
pub struct Claimed {
    pub dir: StateDir,
    pub lock: LifetimeLock,
}

/// Steps 3 and 4 for the serving process: check the directory and files,
/// then take the lock. The default directory is created when missing.
pub fn claim(config: &Config) -> Result<Claimed, Refusal> {
    claim_as(config, Actor::Owner)
}

/// [`claim`] for the serving process or an operator command (which never
/// creates the directory).
pub fn claim_as(config: &Config, actor: Actor) -> Result<Claimed, Refusal> {
    let create = actor == Actor::Owner && config.state_dir_source == StateDirSource::Default;
    let dir = StateDir::open_as(&config.state_dir, create, actor)?;
    dir.check_files()?;
    let lock = dir.lock()?;
    Ok(Claimed { dir, lock })
}

impl Claimed {
    /// The identity of the store this directory held, as recorded beside
    /// the database.
    pub fn recorded_store(&self) -> Option<StoreId> {
        task_store::recorded_store(&self.lock)
    }
}

/// Everything `serve` needs from the state directory.
pub struct Serving {
    pub claimed: Claimed,
    pub store: Store,
    pub artifacts: Artifacts,
    pub report: OpenReport,
}

/// Steps 3–9 for `serve`: claim the directory, then open its durable
/// parts (today the task store: validated without writing, then opened for
/// writing, its artifacts opened with what a crash left half-done removed,
/// and restart recovery).
/// `clock` is the store's (the system's, unless a test moves its own).
pub fn open_serving(config: &Config, clock: Clock) -> Result<Serving, Refusal> {
    let mut claimed = claim(config)?;
    let opened = task_store::open_serving(&claimed.dir, &mut claimed.lock, config, clock)?;
    Ok(Serving {
        claimed,
        store: opened.store,
        artifacts: opened.artifacts,
        report: opened.report,
    })
}

/// What `taskgate check` reports.
pub enum CheckOutcome {
    /// The default directory does not exist yet; serve would create it.
    NotCreatedYet(std::path::PathBuf),
    /// The directory, and every durable part's lines.
    Checked(StateDir, Vec<String>),
}

/// Steps 1 and 3–6 without writing anything: every durable part checked as
/// a start would check it; also says where the state directory choice came
/// from.
pub fn check(overrides: &Overrides) -> Result<(StateDirSource, CheckOutcome), Refusal> {
    let config = effective(overrides, Vec::new())?.config;
    let source = config.state_dir_source.clone();
    if config.state_dir_source == StateDirSource::Default && !StateDir::exists(&config.state_dir) {
        return Ok((source, CheckOutcome::NotCreatedYet(config.state_dir)));
    }
    let claimed = claim_as(&config, Actor::Operator)?;
    let mut lines = Vec::new();
    for part in Parts::new().all() {
        lines.extend(part.check(&claimed.dir, &claimed.lock, &config)?);
    }
    Ok((source, CheckOutcome::Checked(claimed.dir, lines)))
}
