//! Opening a state directory, for `serve` and for `check`: the private
//! directory and its files, the lifetime lock (startup steps 3–4 in
//! docs/ARCHITECTURE.md), then the artifacts and the store (steps 5–9:
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

use std::sync::Arc;

use crate::artifacts::Artifacts;
use crate::config::{Config, Overrides, StateDirSource};
use crate::exit::Refusal;
use crate::state_dir::{Actor, LifetimeLock, StateDir};
use crate::store::{self, CheckReport, OpenReport, Store, StoreId, StoreOptions};
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
}

/// Step 1: the configuration layered and checked key by key (a listen
/// address that is not loopback included, from any layer), the rules
/// between keys, the credential files of `[auth]`, and the tools compiled.
/// Reads only the configuration file and the files it names; writes
/// nothing. `builtins` are the tools served beside the
/// configured ones (the benchmark's no-op).
pub fn effective(
    overrides: &Overrides,
    builtins: Vec<Arc<dyn Runner>>,
) -> Result<Effective, Refusal> {
    let config = Config::load(overrides)?;
    // The credential files are configuration too: a start, `check` and a
    // reload read and validate them the same way (78 for content, 77 for
    // permissions) before anything is served.
    let auth = crate::auth::Authenticator::from_config(&config)?;
    let tls = match &config.server.tls_files {
        Some((cert, key)) => Some(crate::http::tls::Tls::load(cert, key)?),
        None => None,
    };
    let protected = crate::tools::confine::protected(&config.state_dir, config.file.as_deref());
    let tools = Registry::build(&config.tools, &protected, builtins)?;
    Ok(Effective {
        config,
        tools,
        auth,
        tls,
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
    /// the database. A malformed record counts as none: it can only come
    /// from a hand-edited lock file, and the database is still validated.
    pub fn recorded_store(&self) -> Option<StoreId> {
        self.lock.recorded_store().and_then(|s| StoreId::parse(&s))
    }
}

/// Everything `serve` needs from the state directory.
pub struct Serving {
    pub claimed: Claimed,
    pub store: Store,
    pub artifacts: Artifacts,
    pub report: OpenReport,
}

/// Steps 3–8 for `serve`: claim the directory, validate the database
/// without writing, then open it for writing, open the artifacts (removing
/// what a crash left half-done) and run restart recovery.
pub fn open_serving(config: &Config) -> Result<Serving, Refusal> {
    let mut claimed = claim(config)?;
    let mut options = StoreOptions::from_settings(&claimed.dir.db_path(), &config.store);
    // A directory that held a store serves that store only: an empty or
    // replaced tasks.db is refused before anything is written.
    options.expected_identity = claimed.recorded_store();
    // Read-only, like the database's validation inside `begin_open`: an
    // artifacts directory that would refuse the start refuses it before
    // the database is initialised or migrated and before the lock file
    // records the store. Past this point only an I/O error stops a start.
    let artifacts = Artifacts::inspect(
        claimed.dir.path(),
        claimed.dir.owner(),
        config.tasks.artifact_max_bytes,
        config.tasks.artifacts_max_total_bytes,
    )?;
    let opening = Store::begin_open(options)?;
    // Validated: from here on this process serves the directory, and the
    // directory records which store it holds (the first start after an
    // upgrade records an identity the database has just been given).
    claimed
        .lock
        .record_store(Some(opening.identity().as_str()))?;
    let artifacts = artifacts.open()?;
    // Before recovery commits: a task it ends never committed a result, so
    // a result spilled for it must not be served. Removed first, a crash in
    // between leaves the task unfinished and this runs again.
    artifacts.discard(opening.unfinished())?;
    let (store, report) = opening.recover()?;
    Ok(Serving {
        claimed,
        store,
        artifacts,
        report,
    })
}

/// What `taskgate check` reports.
pub enum CheckOutcome {
    /// The default directory does not exist yet; serve would create it.
    NotCreatedYet(std::path::PathBuf),
    Checked(StateDir, CheckReport),
}

/// Steps 1 and 3–5 without writing to the database; also says where the
/// state directory choice came from.
pub fn check(overrides: &Overrides) -> Result<(StateDirSource, CheckOutcome), Refusal> {
    let config = effective(overrides, Vec::new())?.config;
    let source = config.state_dir_source.clone();
    if config.state_dir_source == StateDirSource::Default && !StateDir::exists(&config.state_dir) {
        return Ok((source, CheckOutcome::NotCreatedYet(config.state_dir)));
    }
    let claimed = claim_as(&config, Actor::Operator)?;
    // What serve would refuse, check refuses: the artifacts directory too.
    Artifacts::inspect(
        claimed.dir.path(),
        claimed.dir.owner(),
        config.tasks.artifact_max_bytes,
        config.tasks.artifacts_max_total_bytes,
    )?;
    let (report, _) = store::check_identified(
        &claimed.dir.db_path(),
        config.store.max_db_pages,
        claimed.recorded_store().as_ref(),
    )?;
    Ok((source, CheckOutcome::Checked(claimed.dir, report)))
}
