//! What a command tool may reach: the paths its Landlock ruleset grants
//! and the limits the shim sets, worked out once when the tool is
//! compiled, and the startup refusals that keep the state directory and
//! the configuration out of any tool's reach.
//!
//! Landlock only ever grants: a path below a granted directory cannot be
//! taken back. So a default directory that holds a protected path (the
//! configuration file under `/etc`) is granted entry by entry around it,
//! and a path the operator declares that overlaps a protected one is
//! refused at startup (78).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::shim::{self, Paths};
use crate::config::{Sandbox, ToolConfig};
use crate::process_limits::ProcessLimits;

/// Read and execute for every confined tool: the system's programs,
/// libraries and configuration. Not /proc: on the kernel tried (6.18,
/// Landlock ABI 7) a Landlock domain does not stop a process reading
/// another same-user process's `/proc/PID/environ`, so /proc is reachable
/// only when a tool declares it in `read_paths` (and the daemon is not
/// dumpable either, see [`protect_daemon`]).
pub const DEFAULT_READ: &[&str] = &[
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
];
/// Written by many programs as a matter of course.
pub const DEFAULT_WRITE: &[&str] = &["/dev/null", "/dev/full"];

/// The paths no tool may reach: the state directory, the configuration
/// file and the upstream pins file beside it, as given and resolved.
pub fn protected(state_dir: &Path, config_file: Option<&Path>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let pins = config_file.map(crate::config::pins_file);
    for p in std::iter::once(state_dir)
        .chain(config_file)
        .chain(pins.as_deref())
    {
        out.push(p.to_path_buf());
        if let Ok(real) = std::fs::canonicalize(p)
            && real != p
        {
            out.push(real);
        }
    }
    out
}

/// Whether one path holds the other (or they are the same).
fn overlaps(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// `root`, or, when it holds a protected path, its entries except the
/// ones on the way to that path, recursively.
fn grant_around(root: &Path, protected: &[PathBuf], out: &mut Vec<PathBuf>) {
    if protected.iter().any(|p| root.starts_with(p)) {
        return;
    }
    if !protected.iter().any(|p| p.starts_with(root)) {
        out.push(root.to_path_buf());
        return;
    }
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        grant_around(&e.path(), protected, out);
    }
}

/// The first protected path `path` overlaps, resolved or as written.
fn touches<'a>(path: &Path, protected: &'a [PathBuf]) -> Option<&'a PathBuf> {
    let real = std::fs::canonicalize(path).ok();
    protected
        .iter()
        .find(|p| overlaps(path, p) || real.as_deref().is_some_and(|r| overlaps(r, p)))
}

/// A declared path that reaches a protected one, as `(path, protected)`.
pub fn refused_path(tool: &ToolConfig, protected: &[PathBuf]) -> Option<(PathBuf, PathBuf)> {
    let c = &tool.confinement;
    tool.working_dir
        .iter()
        .chain(&c.read_paths)
        .chain(&c.write_paths)
        .chain(
            tool.argv
                .first()
                .map(Path::new)
                .map(Path::to_path_buf)
                .as_ref(),
        )
        .find_map(|p| touches(p, protected).map(|hit| (p.clone(), hit.clone())))
}

/// The Landlock grants of a confined tool (its working directory, or the
/// run's scratch directory, is added per run); `None` when unconfined.
pub fn paths(tool: &ToolConfig, protected: &[PathBuf]) -> Option<Paths> {
    let c = &tool.confinement;
    if c.sandbox == Sandbox::Unconfined {
        return None;
    }
    let mut read = Vec::new();
    for root in DEFAULT_READ {
        grant_around(Path::new(root), protected, &mut read);
    }
    read.extend(c.read_paths.iter().cloned());
    let mut write: Vec<PathBuf> = DEFAULT_WRITE.iter().map(PathBuf::from).collect();
    write.extend(c.write_paths.iter().cloned());
    Some(Paths { read, write })
}

/// The resource limits of a tool.
pub fn limits(tool: &ToolConfig) -> ProcessLimits {
    tool.limits.process()
}

/// The Landlock ABI of the running kernel, 0 when it has none.
pub fn landlock_abi() -> i32 {
    shim::landlock_abi()
}

/// One tool's confinement as `taskgate check` and `taskgate status` show
/// it; the limits carry their `[[tool]]` key names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolState {
    pub name: String,
    /// `confined` (Landlock) or `unconfined` (`sandbox = "unconfined"`).
    pub sandbox: String,
    /// Each limit under its key's name.
    #[serde(flatten)]
    pub limits: ProcessLimits,
}

impl ToolState {
    pub fn of(tool: &ToolConfig) -> ToolState {
        ToolState {
            name: tool.name.clone(),
            sandbox: match tool.confinement.sandbox {
                Sandbox::Landlock => "confined",
                Sandbox::Unconfined => "unconfined",
            }
            .to_string(),
            limits: limits(tool),
        }
    }
}

/// The confinement in force for the configured tools, on this kernel and
/// for this process: what `taskgate check` prints, what `taskgate status`
/// shows (and carries as fields in `--json`), and what `serve` logs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Confinement {
    /// The kernel's Landlock ABI; 0 when it has none.
    pub landlock_abi: i32,
    /// What Landlock confines at that ABI, or `unavailable`.
    pub landlock: String,
    /// Every descendant of a tool is killed with its call: the shim is a
    /// child subreaper. Per-tool cgroups are not used.
    pub subreaper_kill: bool,
    /// `PR_SET_NO_NEW_PRIVS` before the tool's program runs.
    pub no_new_privs: bool,
    /// The daemon runs as root, which RLIMIT_NPROC does not bind: a tool's
    /// `max_processes` is then held only by the shim's count.
    pub root_exempt_from_nproc: bool,
    pub tools: Vec<ToolState>,
}

impl Confinement {
    pub fn new(tools: Vec<ToolState>) -> Confinement {
        let abi = landlock_abi();
        // Signal and abstract-socket scoping arrived with ABI 6; below it
        // the ruleset confines the filesystem only.
        let landlock = if abi >= 6 {
            "filesystem, signals, abstract sockets"
        } else if abi > 0 {
            "filesystem"
        } else {
            "unavailable"
        };
        Confinement {
            landlock_abi: abi,
            landlock: landlock.to_string(),
            subreaper_kill: true,
            no_new_privs: true,
            root_exempt_from_nproc: nix::unistd::geteuid().is_root(),
            tools,
        }
    }

    /// The report as lines: the first says what is in force for every
    /// tool, then one line per tool with its sandbox and limits.
    pub fn lines(&self) -> Vec<String> {
        let fs = if self.landlock_abi > 0 {
            format!("Landlock ABI {} ({})", self.landlock_abi, self.landlock)
        } else {
            "Landlock unavailable (this kernel has none)".to_string()
        };
        let mut first = format!("tool confinement: {fs}");
        if self.subreaper_kill {
            first.push_str("; subreaper kills every descendant (no per-tool cgroup)");
        }
        if self.no_new_privs {
            first.push_str("; no_new_privs");
        }
        let labels: Vec<&str> = ProcessLimits::LIMITS.iter().map(|l| l.label).collect();
        first.push_str(&format!("; rlimits ({})", labels.join(", ")));
        if self.root_exempt_from_nproc {
            first.push_str("; running as root: RLIMIT_NPROC does not apply, so max_processes is enforced only by the shim's count every 100 ms (run the service as its own user)");
        }
        let mut out = vec![first];
        for t in &self.tools {
            let sandbox = match t.sandbox.as_str() {
                "confined" => "confined (Landlock)",
                _ => "unconfined (sandbox = \"unconfined\": no filesystem confinement)",
            };
            let limits: Vec<String> = t
                .limits
                .values()
                .map(|(limit, value)| format!("{} {value}", limit.name))
                .collect();
            out.push(format!(
                "tool {:?}: {sandbox}; {}",
                t.name,
                limits.join(", ")
            ));
        }
        out
    }
}

/// Makes the serving process not dumpable (`PR_SET_DUMPABLE` 0): its
/// /proc files (environment, memory, descriptors) then belong to root, so
/// a tool running as the service user cannot read them even where /proc
/// is granted or the tool is unconfined, and no core file of the daemon,
/// which holds every caller's requests, is written.
pub fn protect_daemon() {
    // SAFETY: prctl(2) on this process only.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
}
