//! The private state directory: its safety checks and the lifetime lock.
//!
//! The directory is resolved once, so a configured path may pass through a
//! symlink an administrator chose (a state directory moved to another
//! disk, say); after that no symlink is followed. Everything here refuses
//! with exit 77, except a lock held by another process (75).
//!
//! Owns the private directory and `tasks.lock`. Resolves the directory once
//! (systemd's `StateDirectory=` may be a symlink), then never follows a link:
//! ancestors trusted (root or us, not group/other-writable unless root-owned
//! sticky), directory ours and private, files regular/one link/ours/private
//! (77). The lifetime lock is `flock` on `tasks.lock`, non-blocking (75); the
//! file is never deleted. Its holder line is written by `serve` only once the
//! database has validated, and by backup and restore once they hold the lock;
//! `check` never writes it. Its second line records the identity of the store
//! the directory holds (`store <id>`), so that an emptied, removed or swapped
//! `tasks.db` is refused (65, "database replaced") instead of being served as a
//! new store. Then the serving process's admin socket (`admin <path>`) and its
//! admin key (`admin-key <hex>`): no tool may ever be granted the state
//! directory, so this is where a secret tools must not learn is kept.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::exit::{Classify, ExitClass};

pub const DB_FILE: &str = "tasks.db";
pub const WAL_FILE: &str = "tasks.db-wal";
pub const SHM_FILE: &str = "tasks.db-shm";
pub const LOCK_FILE: &str = "tasks.lock";
/// The folder of spilled results; see `artifacts.rs`.
pub const ARTIFACTS_DIR: &str = "artifacts";
/// The files whose safety is checked before anything is opened.
pub const CHECKED_FILES: [&str; 4] = [DB_FILE, WAL_FILE, SHM_FILE, LOCK_FILE];

const GROUP_OTHER_BITS: u32 = 0o077;
const GROUP_OTHER_WRITE: u32 = 0o022;
const STICKY: u32 = 0o1000;

#[derive(Debug, Error)]
pub enum PathError {
    #[error(
        "{path}: the state directory does not exist; provision it with `install -d -m 700 {path}` owned by the service user"
    )]
    Missing { path: PathBuf },
    #[error(
        "{path}: cannot inspect: {source}; check that the path exists and is reachable by this user"
    )]
    Inspect { path: PathBuf, source: io::Error },
    #[error("{path}: cannot create the default state directory: {source}")]
    Create { path: PathBuf, source: io::Error },
    #[error("{path}: not a directory; point the state directory at a private directory")]
    NotADirectory { path: PathBuf },
    #[error(
        "{path}: owned by uid {found}, not by this process's uid {expected}; chown it to the service user"
    )]
    WrongOwner {
        path: PathBuf,
        found: u32,
        expected: u32,
    },
    #[error(
        "{path}: belongs to {owner} (uid {uid}) and this process runs as root; a store is served by its owner, never by root: start the service with `systemctl start taskgate`, or run it by hand as its owner with `runuser -u {owner} -- taskgate serve …` (do not chown the directory to root)"
    )]
    RootIsNotOwner {
        path: PathBuf,
        owner: String,
        uid: u32,
    },
    #[error("{path}: mode {mode:04o} gives group/other access; run `chmod {fix:o} {path}`")]
    GroupOtherAccess { path: PathBuf, mode: u32, fix: u32 },
    #[error(
        "{path}: untrusted ancestor of the state directory ({why}); use a directory whose every parent is owned by root or this user and not writable by others"
    )]
    UntrustedAncestor { path: PathBuf, why: String },
    #[error("{path}: is a symbolic link; the store's files must be regular files, never links")]
    Symlink { path: PathBuf },
    #[error("{path}: not a regular file; remove it or move the state directory")]
    NotRegular { path: PathBuf },
    #[error(
        "{path}: has {links} hard links; the store's files must have exactly one, so copy it to a fresh file (cp --no-preserve=links) and remove the other links"
    )]
    HardLinked { path: PathBuf, links: u64 },
}

impl Classify for PathError {
    fn exit_class(&self) -> ExitClass {
        ExitClass::UnsafePath
    }
}

#[derive(Debug, Error)]
pub enum LockError {
    #[error(
        "{path}: the lifetime lock is held by another process{holder}; only one process may serve a state directory: stop the other one (never delete the lock file)"
    )]
    Held { path: PathBuf, holder: String },
    #[error(transparent)]
    Unsafe(#[from] PathError),
    #[error("{path}: cannot open or lock: {source}")]
    Io { path: PathBuf, source: io::Error },
}

impl Classify for LockError {
    fn exit_class(&self) -> ExitClass {
        match self {
            LockError::Held { .. } => ExitClass::LockHeld,
            LockError::Unsafe(_) => ExitClass::UnsafePath,
            LockError::Io { .. } => ExitClass::Io,
        }
    }
}

/// Who may act on a state directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Actor {
    /// The serving process: the directory must be its own.
    Owner,
    /// An operator command (`check`, `backup`, `restore`): as root it acts
    /// on behalf of whoever owns the directory, and files it creates are
    /// given to that owner; otherwise it is the owner.
    Operator,
}

/// A state directory whose path was resolved once and found private.
#[derive(Debug, Clone)]
pub struct StateDir {
    path: PathBuf,
    /// The uid every file in it must belong to.
    owner: u32,
}

fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

fn lstat(path: &Path) -> Result<fs::Metadata, PathError> {
    fs::symlink_metadata(path).map_err(|source| PathError::Inspect {
        path: path.to_path_buf(),
        source,
    })
}

impl StateDir {
    /// Resolves `requested` once and checks it and its ancestors.
    ///
    /// With `create_if_missing` (the XDG default only) a missing directory is
    /// created with mode 0700, parents included.
    pub fn open(requested: &Path, create_if_missing: bool) -> Result<StateDir, PathError> {
        StateDir::open_as(requested, create_if_missing, Actor::Owner)
    }

    /// [`StateDir::open`] for an operator command; see [`Actor`].
    pub fn open_as(
        requested: &Path,
        create_if_missing: bool,
        actor: Actor,
    ) -> Result<StateDir, PathError> {
        if create_if_missing && fs::symlink_metadata(requested).is_err() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(requested)
                .map_err(|source| PathError::Create {
                    path: requested.to_path_buf(),
                    source,
                })?;
        }
        let path = match fs::canonicalize(requested) {
            Ok(p) => p,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(PathError::Missing {
                    path: requested.to_path_buf(),
                });
            }
            Err(source) => {
                return Err(PathError::Inspect {
                    path: requested.to_path_buf(),
                    source,
                });
            }
        };
        let meta = lstat(&path)?;
        if !meta.is_dir() {
            return Err(PathError::NotADirectory { path });
        }
        let me = match actor {
            Actor::Operator if euid() == 0 => meta.uid(),
            _ => euid(),
        };
        if actor == Actor::Owner && me == 0 && meta.uid() != 0 {
            // Root serving someone else's store would create root-owned
            // files in it that the owner then cannot open; the owner's
            // name makes the advice a command to copy.
            let owner = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(meta.uid()))
                .ok()
                .flatten()
                .map(|u| u.name)
                .unwrap_or_else(|| meta.uid().to_string());
            return Err(PathError::RootIsNotOwner {
                path,
                owner,
                uid: meta.uid(),
            });
        }
        check_private_dir(&path, &meta, me)?;
        for ancestor in path.ancestors().skip(1) {
            check_ancestor(ancestor, me)?;
        }
        Ok(StateDir { path, owner: me })
    }

    /// A state directory that `check` found missing is not an error when
    /// `serve` would create it; this tells the two apart.
    pub fn exists(requested: &Path) -> bool {
        fs::symlink_metadata(requested).is_ok()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The uid the directory and its files belong to.
    pub fn owner(&self) -> u32 {
        self.owner
    }

    /// Gives a file root created on the owner's behalf to the owner.
    pub fn give_to_owner(&self, path: &Path) {
        if euid() == 0 && self.owner != 0 {
            let gid = fs::metadata(&self.path).map(|m| m.gid()).ok();
            let _ = nix::unistd::chown(
                path,
                Some(nix::unistd::Uid::from_raw(self.owner)),
                gid.map(nix::unistd::Gid::from_raw),
            );
        }
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    pub fn db_path(&self) -> PathBuf {
        self.file(DB_FILE)
    }

    /// Checks the store's files that exist: regular, one link, ours, private.
    pub fn check_files(&self) -> Result<(), PathError> {
        let me = self.owner;
        for name in CHECKED_FILES {
            let path = self.file(name);
            let meta = match fs::symlink_metadata(&path) {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(source) => return Err(PathError::Inspect { path, source }),
            };
            check_private_file(&path, &meta, me)?;
        }
        let path = self.file(ARTIFACTS_DIR);
        match fs::symlink_metadata(&path) {
            Ok(meta) => {
                if meta.file_type().is_symlink() {
                    return Err(PathError::Symlink { path });
                }
                if !meta.is_dir() {
                    return Err(PathError::NotADirectory { path });
                }
                check_private_dir(&path, &meta, me)?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(PathError::Inspect { path, source }),
        }
        Ok(())
    }

    /// Takes the exclusive lifetime lock on `tasks.lock`, without waiting.
    /// The file is created (empty, 0600) when missing; an existing one is
    /// not written here: a process records its pid
    /// ([`LifetimeLock::record_holder`]) only once it goes on to change the
    /// directory, so a refused start and `check` leave it as it was.
    pub fn lock(&self) -> Result<LifetimeLock, LockError> {
        let path = self.file(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|source| {
                if source.raw_os_error() == Some(libc::ELOOP) {
                    LockError::Unsafe(PathError::Symlink { path: path.clone() })
                } else {
                    LockError::Io {
                        path: path.clone(),
                        source,
                    }
                }
            })?;
        let mut meta = file.metadata().map_err(|source| LockError::Io {
            path: path.clone(),
            source,
        })?;
        if meta.uid() == 0 && self.owner != 0 && euid() == 0 {
            // Root, acting for the owner, just created it (or left it).
            self.give_to_owner(&path);
            meta = file.metadata().map_err(|source| LockError::Io {
                path: path.clone(),
                source,
            })?;
        }
        check_private_file(&path, &meta, self.owner)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                let holder = match read_holder(&meta) {
                    Some(h) => format!(" ({h})"),
                    None => {
                        // /proc/locks unreadable or silent (another pid
                        // namespace): the pid the last holder wrote is
                        // only a hint, and is said to be one.
                        let mut text = String::new();
                        let _ = file.read_to_string(&mut text);
                        match text.lines().next().unwrap_or("").trim().parse::<u32>() {
                            Ok(pid) => format!(
                                " (pid {pid} according to the file; the kernel did not say)"
                            ),
                            Err(_) => String::new(),
                        }
                    }
                };
                return Err(LockError::Held { path, holder });
            }
            Err(fs::TryLockError::Error(source)) => return Err(LockError::Io { path, source }),
        }
        Ok(LifetimeLock { file, path })
    }
}

/// The process that really holds the flock on the lock file, from the
/// kernel's table (`/proc/locks`), matched by device and inode: "pid N,
/// COMM". The pid written into the file names the last process that
/// recorded itself, which may be long gone while another (a copy of the
/// directory's old server, a `flock` by hand) holds the lock.
fn read_holder(meta: &fs::Metadata) -> Option<String> {
    let table = fs::read_to_string("/proc/locks").ok()?;
    let pid = holder_in(&table, meta.dev(), meta.ino())?;
    let comm = fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|c| c.trim().to_string())
        .filter(|c| !c.is_empty());
    Some(match comm {
        Some(comm) => format!("pid {pid}, {comm}"),
        None => format!("pid {pid}"),
    })
}

/// The pid holding a FLOCK on (`dev`, `ino`) in a `/proc/locks` table.
/// Lines look like `3: FLOCK  ADVISORY  WRITE 1234 08:02:131081 0 EOF`
/// (device major:minor in hex); waiters (`3: -> FLOCK …`) are skipped, and
/// a pid of 0 (a holder in a pid namespace we cannot see) says nothing. A
/// filesystem whose stat device differs from the lock table's (btrfs
/// subvolumes) is matched by inode when exactly one FLOCK has it.
fn holder_in(table: &str, dev: u64, ino: u64) -> Option<u32> {
    let (major, minor) = (libc::major(dev) as u64, libc::minor(dev) as u64);
    let mut by_inode = Vec::new();
    for line in table.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 6 || fields[1] != "FLOCK" {
            continue;
        }
        let Ok(pid) = fields[4].parse::<u32>() else {
            continue;
        };
        let mut id = fields[5].split(':');
        let (Some(ma), Some(mi), Some(i)) = (id.next(), id.next(), id.next()) else {
            continue;
        };
        let (Ok(ma), Ok(mi), Ok(i)) = (
            u64::from_str_radix(ma, 16),
            u64::from_str_radix(mi, 16),
            i.parse::<u64>(),
        ) else {
            continue;
        };
        if i != ino || pid == 0 {
            continue;
        }
        if (ma, mi) == (major, minor) {
            return Some(pid);
        }
        by_inode.push(pid);
    }
    match by_inode.as_slice() {
        [only] => Some(*only),
        _ => None,
    }
}

/// Checks that `path` and its ancestors could not be replaced by anyone but
/// root or `me` (used for backup destinations too).
pub fn check_trusted_chain(path: &Path, me: u32) -> Result<(), PathError> {
    for p in path.ancestors() {
        check_ancestor(p, me)?;
    }
    Ok(())
}

fn check_ancestor(path: &Path, me: u32) -> Result<(), PathError> {
    let meta = lstat(path)?;
    let uid = meta.uid();
    if uid != 0 && uid != me {
        return Err(PathError::UntrustedAncestor {
            path: path.to_path_buf(),
            why: format!("owned by uid {uid}"),
        });
    }
    let mode = meta.mode() & 0o7777;
    if mode & GROUP_OTHER_WRITE != 0 && !(uid == 0 && mode & STICKY != 0) {
        return Err(PathError::UntrustedAncestor {
            path: path.to_path_buf(),
            why: format!(
                "mode {mode:04o} is writable by group/other and not a root-owned sticky directory"
            ),
        });
    }
    Ok(())
}

/// A directory of the store: ours, no group/other bits.
fn check_private_dir(path: &Path, meta: &fs::Metadata, me: u32) -> Result<(), PathError> {
    if meta.uid() != me {
        return Err(PathError::WrongOwner {
            path: path.to_path_buf(),
            found: meta.uid(),
            expected: me,
        });
    }
    let mode = meta.mode() & 0o7777;
    if mode & GROUP_OTHER_BITS != 0 {
        return Err(PathError::GroupOtherAccess {
            path: path.to_path_buf(),
            mode,
            fix: 0o700,
        });
    }
    Ok(())
}

fn check_private_file(path: &Path, meta: &fs::Metadata, me: u32) -> Result<(), PathError> {
    let path = path.to_path_buf();
    if meta.file_type().is_symlink() {
        return Err(PathError::Symlink { path });
    }
    if !meta.is_file() {
        return Err(PathError::NotRegular { path });
    }
    if meta.nlink() != 1 {
        return Err(PathError::HardLinked {
            path,
            links: meta.nlink(),
        });
    }
    if meta.uid() != me {
        return Err(PathError::WrongOwner {
            path,
            found: meta.uid(),
            expected: me,
        });
    }
    let mode = meta.mode() & 0o7777;
    if mode & GROUP_OTHER_BITS != 0 {
        return Err(PathError::GroupOtherAccess {
            path,
            mode,
            fix: 0o600,
        });
    }
    Ok(())
}

/// The exclusive lock on `tasks.lock`, held until dropped (process exit).
/// The file itself is never deleted: deleting it would let a second process
/// lock a new inode while the first still serves.
#[derive(Debug)]
pub struct LifetimeLock {
    file: File,
    path: PathBuf,
}

/// The prefix of the line of `tasks.lock` that records the identity of the
/// store the directory holds (the pid is the first line).
const STORE_LINE: &str = "store ";
/// The prefix of the line that records where the serving process's admin
/// socket is, so that `taskgate status` finds it from the state directory.
const ADMIN_LINE: &str = "admin ";

/// The prefix of the line that records the serving process's admin key:
/// a new random key at every start, which a connection must present
/// before the daemon acts on its request. It is in this file because the
/// state directory is the one place no tool may ever be granted (see
/// `tools::confine`), while a tool runs as the service user and so passes
/// the socket's uid check.
const ADMIN_KEY_LINE: &str = "admin-key ";

/// What the process serving a directory recorded about its admin socket
/// (or the last one that did: connecting tells).
#[derive(Default)]
pub struct RecordedAdmin {
    pub socket: Option<PathBuf>,
    /// The admin key, as hex text. Never printed or logged.
    pub key: Option<String>,
}

/// The admin socket and key recorded in `dir`'s lock file. Reading it
/// needs the same rights as the admin socket itself: root or the
/// directory's owner.
pub fn recorded_admin(dir: &Path) -> io::Result<RecordedAdmin> {
    let mut text = String::new();
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir.join(LOCK_FILE))?
        .read_to_string(&mut text)?;
    let line = |prefix: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .map(str::to_string)
    };
    Ok(RecordedAdmin {
        socket: line(ADMIN_LINE).map(PathBuf::from),
        key: line(ADMIN_KEY_LINE).map(|k| k.trim().to_string()),
    })
}

impl LifetimeLock {
    /// The store identity recorded in the lock file, as written there (the
    /// store module says whether it is well formed). Reading changes
    /// nothing.
    pub fn recorded_store(&self) -> Option<String> {
        self.recorded(STORE_LINE).map(|id| id.trim().to_string())
    }

    fn recorded(&self, prefix: &str) -> Option<String> {
        let mut text = String::new();
        let mut file = &self.file;
        file.rewind().ok()?;
        file.read_to_string(&mut text).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .map(str::to_string)
    }

    /// Records where this process's admin socket listens and the key a
    /// connection must present (`None`: it has none), keeping the pid and
    /// the store identity. Only a UTF-8 path without a line break is
    /// recorded: anything else could not be read back line by line, and
    /// the store line must stay readable; without a path no key is kept
    /// either.
    pub fn record_admin(&mut self, admin: Option<(&Path, &str)>) -> Result<(), LockError> {
        let admin = admin
            .and_then(|(p, key)| p.to_str().map(|p| (p, key)))
            .filter(|(p, key)| !p.contains('\n') && !key.contains('\n'));
        let store = self.recorded_store();
        self.write_lines(store.as_deref(), admin)
            .map_err(|source| LockError::Io {
                path: self.path.clone(),
                source,
            })
    }

    /// Writes this process's pid into the lock file, keeping the recorded
    /// store identity: done by backup and restore. The pid is only a hint
    /// for the "held by" message; the lock is the flock.
    pub fn record_holder(&mut self) {
        let store = self.recorded_store();
        let _ = self.write(store.as_deref());
    }

    /// Writes this process's pid and the identity of the store the
    /// directory now holds (`None`: no identity recorded), and makes it
    /// durable: done by `serve` once its start is validated, and by
    /// restore around the swap. The content is overwritten in place and
    /// then cut to length, so it is never seen empty.
    pub fn record_store(&mut self, store: Option<&str>) -> Result<(), LockError> {
        self.write(store)
            .and_then(|_| self.file.sync_data())
            .map_err(|source| LockError::Io {
                path: self.path.clone(),
                source,
            })
    }

    fn write(&mut self, store: Option<&str>) -> io::Result<()> {
        let admin = self.recorded(ADMIN_LINE);
        let key = self.recorded(ADMIN_KEY_LINE).unwrap_or_default();
        self.write_lines(store, admin.as_deref().map(|a| (a, key.as_str())))
    }

    fn write_lines(&mut self, store: Option<&str>, admin: Option<(&str, &str)>) -> io::Result<()> {
        let mut text = format!("{}\n", std::process::id());
        if let Some(id) = store {
            text.push_str(&format!("{STORE_LINE}{id}\n"));
        }
        // After the store line, so that the bytes before it never change
        // when the admin line does.
        if let Some((path, key)) = admin {
            text.push_str(&format!("{ADMIN_LINE}{path}\n"));
            if !key.is_empty() {
                text.push_str(&format!("{ADMIN_KEY_LINE}{key}\n"));
            }
        }
        let file = &mut self.file;
        file.rewind()?;
        file.write_all(text.as_bytes())?;
        file.set_len(text.len() as u64)
    }
}
