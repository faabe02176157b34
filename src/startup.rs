//! Startup steps 1–3, shared by `serve` and `check`: configuration, the
//! private directory and its files, the lifetime lock. Steps 4–7 (pragmas,
//! schema, integrity, recovery) belong to the store.

use crate::config::{Config, Overrides, StateDirSource};
use crate::exit::Refusal;
use crate::state_dir::{Actor, LifetimeLock, StateDir};
use crate::store::{self, CheckReport};

/// A state directory found safe, with its lock held.
pub struct Claimed {
    pub dir: StateDir,
    pub lock: LifetimeLock,
}

/// Steps 2 and 3: check the directory and files, then take the lock.
pub fn claim(config: &Config) -> Result<Claimed, Refusal> {
    let create = config.state_dir_source == StateDirSource::Default;
    let dir = StateDir::open(&config.state_dir, create)?;
    dir.check_files()?;
    let lock = dir.lock()?;
    Ok(Claimed { dir, lock })
}

/// What `taskgate check` reports.
pub enum CheckOutcome {
    /// The default directory does not exist yet; serve would create it.
    NotCreatedYet(std::path::PathBuf),
    Checked(StateDir, CheckReport),
}

/// Steps 1–6 without writing to the database.
pub fn check(overrides: &Overrides) -> Result<CheckOutcome, Refusal> {
    let config = Config::load(overrides)?;
    crate::exec::Registry::build(&config.tools)?;
    if config.state_dir_source == StateDirSource::Default && !StateDir::exists(&config.state_dir) {
        return Ok(CheckOutcome::NotCreatedYet(config.state_dir));
    }
    let dir = StateDir::open_as(&config.state_dir, false, Actor::Operator)?;
    dir.check_files()?;
    let _lock = dir.lock()?;
    let report = store::check_read_only(&dir.db_path(), config.store.max_db_pages)?;
    Ok(CheckOutcome::Checked(dir, report))
}
