//! The tool shim: `taskgate exec-tool --parent PID [--policy JSON] -- ARGV…`,
//! run by the daemon in place of the tool itself.
//!
//! It exists so that nothing a tool starts outlives its call or the daemon,
//! and so that the tool is confined before its program runs:
//!
//! - The shim is a child subreaper (`PR_SET_CHILD_SUBREAPER`): whatever the
//!   tool starts stays below the shim, even a grandchild that calls
//!   `setsid` and leaves the tool's process group, and an orphan is
//!   reparented to the shim rather than to init. When the tool ends, is
//!   cancelled (SIGTERM from the daemon, then SIGKILL after the grace), is
//!   stopped at once (SIGUSR2: timeout, output cap) or the daemon dies
//!   (`PR_SET_PDEATHSIG`, even a SIGKILL of the daemon), the shim kills
//!   every remaining descendant, found in /proc by parent links, and reaps
//!   them before it exits.
//! - The tool runs in a process group of its own, so a group kill reaches
//!   a fork bomb's processes at once (the kernel delivers a group signal
//!   to children forked meanwhile too).
//! - Before `exec` the child gets `PR_SET_NO_NEW_PRIVS`, resource limits
//!   (address space, open files, processes, file size, CPU seconds, no core
//!   files) and a Landlock ruleset: read and execute only where granted,
//!   write only where granted, no signals to processes outside the tool's
//!   own domain (the daemon included). Landlock is applied in the child
//!   after `fork`, so the shim keeps reading /proc and signalling.
//! - It watches the tool's descendants (about every 100 ms): past
//!   `max_processes` of them everything is killed. When the tool ends it
//!   tells the daemon which limit, if any, ended it, as one line on the
//!   report descriptor: `limit max_processes`.
//!
//! It passes everything else through: stdin, stdout, stderr, environment,
//! working directory, and the tool's exit status.

use std::collections::HashMap;
use std::io::Write as _;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{
    SaFlags, SigAction, SigHandler, SigSet, Signal, kill, killpg, raise, sigaction,
};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::process_limits::{Enforce, ProcessLimits, names};

/// The signal the kernel sends the shim when the daemon dies.
const PARENT_DEATH: Signal = Signal::SIGUSR1;
/// The signal the daemon sends the shim to end the tool at once (timeout,
/// output cap): no grace.
pub const STOP_NOW: Signal = Signal::SIGUSR2;
/// Exit status when the tool could not be started (as a shell would).
pub const CANNOT_EXECUTE: i32 = 126;
/// How often the shim looks for ended processes and for its flags.
const TICK: Duration = Duration::from_millis(20);
/// How often it counts the tool's descendants (a /proc scan).
const SCAN_EVERY: u32 = 5;
/// RLIMIT_NPROC counts threads as well as processes: a tool's headroom
/// under it is this many tasks per allowed process, so that a
/// multi-threaded program (a JVM, a Go binary) can start its threads while
/// a fork bomb still meets a hard stop.
const NPROC_PER_PROCESS: u64 = 8;
/// Rounds of kill-and-reap before the shim gives up on a process that
/// will not go (one in uninterruptible sleep); each round waits a little.
const KILL_ROUNDS: u32 = 500;

/// What the tool may reach of the filesystem (Landlock).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Paths {
    /// Read and execute beneath these.
    pub read: Vec<PathBuf>,
    /// Read, write, create and remove beneath these.
    pub write: Vec<PathBuf>,
}

/// Everything the daemon tells the shim, as one JSON argument.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// Between SIGTERM and SIGKILL on cancellation.
    pub grace_ms: u64,
    pub limits: Option<ProcessLimits>,
    /// `None`: no filesystem confinement (`sandbox = "unconfined"`).
    pub paths: Option<Paths>,
    /// The descriptor the shim writes its one-line report to.
    pub report_fd: Option<i32>,
}

/// Which limit ended a tool, by the name of its `[[tool]]` key: one the
/// shim may report (its definition says so).
pub fn limit_of_report(report: &str) -> Option<&'static str> {
    let name = report.lines().find_map(|l| l.strip_prefix("limit "))?;
    ProcessLimits::LIMITS
        .iter()
        .find(|l| l.reported && l.name == name.trim())
        .map(|l| l.name)
}

static TERMINATE: AtomicBool = AtomicBool::new(false);
static ORPHANED: AtomicBool = AtomicBool::new(false);
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_terminate(_: libc::c_int) {
    TERMINATE.store(true, Ordering::SeqCst);
}
extern "C" fn on_parent_death(_: libc::c_int) {
    ORPHANED.store(true, Ordering::SeqCst);
}
extern "C" fn on_stop(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn handle(signal: Signal, handler: extern "C" fn(libc::c_int)) {
    // No SA_RESTART: a flag set interrupts the tick's wait early.
    let action = SigAction::new(
        SigHandler::Handler(handler),
        SaFlags::empty(),
        SigSet::empty(),
    );
    // SAFETY: the handlers only store to an atomic.
    let _ = unsafe { sigaction(signal, &action) };
}

fn reset(signal: Signal) {
    let action = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    // SAFETY: restoring the default disposition.
    let _ = unsafe { sigaction(signal, &action) };
}

/// A descriptor that becomes readable when `pid` exits (`pidfd_open(2)`,
/// Linux 5.3), or `None` on a kernel without it.
fn pidfd(pid: Pid) -> Option<OwnedFd> {
    // SAFETY: a plain system call; the descriptor it returns is owned here.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0) };
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Waits one tick, or less: until the tool exits (its pidfd is readable)
/// or a signal sets a flag (poll(2) is never restarted). Without a pidfd a
/// tool's exit is noticed at the next tick, up to 20 ms late, which every
/// synchronous call would pay.
fn wait_tick(exited: Option<&OwnedFd>) {
    use std::os::fd::AsRawFd;
    let Some(fd) = exited else {
        std::thread::sleep(TICK);
        return;
    };
    let mut poll = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let _ = unsafe { libc::poll(&mut poll, 1, TICK.as_millis() as libc::c_int) };
}

/// One process as /proc shows it.
struct Proc {
    ppid: i32,
    /// Virtual size in bytes.
    vsize: u64,
}

/// Every process on the host, by pid. A process that ends during the scan
/// is simply missing.
fn scan() -> HashMap<i32, Proc> {
    let mut procs = HashMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return procs;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // The command name may hold spaces and parentheses: the fields
        // start after the last ')'.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let (Some(ppid), Some(vsize)) = (
            fields.get(1).and_then(|f| f.parse().ok()),
            fields.get(20).and_then(|f| f.parse().ok()),
        ) else {
            continue;
        };
        procs.insert(pid, Proc { ppid, vsize });
    }
    procs
}

/// The pids below `root` in `procs`.
fn descendants(procs: &HashMap<i32, Proc>, root: i32) -> Vec<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for (pid, p) in procs {
        children.entry(p.ppid).or_default().push(*pid);
    }
    let mut found = Vec::new();
    let mut next = vec![root];
    while let Some(p) = next.pop() {
        if let Some(kids) = children.get(&p) {
            for k in kids {
                found.push(*k);
                next.push(*k);
            }
        }
    }
    found
}

/// What the shim learnt of the tool while it ran.
#[derive(Default)]
struct Watch {
    tool: Option<WaitStatus>,
    /// The largest virtual size seen of any descendant.
    peak_vsize: u64,
    exceeded: Option<&'static str>,
}

/// Reaps every ended child (the tool, and orphans reparented to the shim),
/// keeping the tool's status. Returns false once the shim has no child.
fn reap(tool: Pid, watch: &mut Watch) -> bool {
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => return true,
            Ok(status) => {
                if status.pid() == Some(tool) {
                    watch.tool = Some(status);
                }
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return false,
        }
    }
}

/// Sends `sig` to the tool's group and to every descendant (those that
/// left the group with `setsid` included).
fn signal_all(me: i32, tool: Pid, sig: Signal) {
    let _ = killpg(tool, sig);
    for pid in descendants(&scan(), me) {
        let _ = kill(Pid::from_raw(pid), sig);
    }
}

/// Kills every descendant and reaps them all, until the shim has no child
/// left; a process forked meanwhile is found by the next round (its parent
/// was killed, so it was reparented to the shim). Returns the most
/// processes one round found.
fn kill_all(me: i32, tool: Pid, watch: &mut Watch) -> usize {
    // Counted before the group kill: what the tool left running.
    let mut most = descendants(&scan(), me).len();
    let _ = killpg(tool, Signal::SIGKILL);
    for _ in 0..KILL_ROUNDS {
        let found = descendants(&scan(), me);
        most = most.max(found.len());
        for pid in &found {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
        let _ = killpg(tool, Signal::SIGKILL);
        if !reap(tool, watch) && found.is_empty() {
            return most;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    most
}

/// Tasks (threads included) the real user of this process runs now: the
/// count RLIMIT_NPROC is compared with.
fn user_tasks() -> u64 {
    let uid = nix::unistd::getuid().as_raw().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut total = 0;
    for entry in entries.flatten() {
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let mut mine = false;
        let mut threads = 0;
        for line in status.lines() {
            if let Some(v) = line.strip_prefix("Uid:") {
                mine = v.split_whitespace().next() == Some(uid.as_str());
            } else if let Some(v) = line.strip_prefix("Threads:") {
                threads = v.trim().parse().unwrap_or(0);
            }
        }
        if mine {
            total += threads;
        }
    }
    total
}

fn set_limit(resource: libc::__rlimit_resource_t, soft: u64, hard: u64) -> std::io::Result<()> {
    // Never above the hard limit in force: raising it needs
    // CAP_SYS_RESOURCE, which a daemon under a limit of its own (another
    // shim, a container) lacks, and a tool gets no more than its daemon.
    let mut current = libc::rlimit {
        rlim_cur: 0,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: prlimit reading this process's limit into a valid struct.
    if unsafe { libc::prlimit(0, resource, std::ptr::null(), &mut current) } != 0 {
        current.rlim_max = libc::RLIM_INFINITY;
    }
    let lim = libc::rlimit {
        rlim_cur: soft.min(current.rlim_max),
        rlim_max: hard.min(current.rlim_max),
    };
    // prlimit(2) rather than setrlimit(2): the unit's system call filter
    // (`~@resources`) refuses setrlimit, while prlimit64 is allowed.
    // SAFETY: prlimit on this process with a valid struct; async-signal-safe.
    if unsafe { libc::prlimit(0, resource, &lim, std::ptr::null_mut()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The limits of the child, set after `fork`. RLIMIT_NPROC counts every
/// task (thread) of the user, so it is the user's count at the start plus
/// the tool's share; the shim's own count of descendants is the precise
/// bound.
fn apply_limits(limits: &ProcessLimits, nproc: u64) -> std::io::Result<()> {
    for (limit, value) in limits.values() {
        match limit.enforce {
            Enforce::Rlimit(resource) => set_limit(resource, value, value)?,
            // The soft limit's signal (SIGXCPU) ends a tool that does not
            // handle it; one that does is killed a unit later.
            Enforce::RlimitThenKill(resource) => set_limit(resource, value, value + 1)?,
            Enforce::Processes => set_limit(libc::RLIMIT_NPROC, nproc, nproc)?,
        }
    }
    // A tool's core file could hold what it read; none is written.
    set_limit(libc::RLIMIT_CORE, 0, 0)?;
    Ok(())
}

/// The Landlock ABI the running kernel offers (0: none).
pub fn landlock_abi() -> i32 {
    // SAFETY: landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
    // only returns the ABI version (or an error).
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            1u32,
        )
    };
    if v < 0 { 0 } else { v as i32 }
}

/// The ruleset for `paths`, built before `fork`. Rights the running kernel
/// does not know are left out (the crate's best effort), but a kernel with
/// no Landlock at all is refused: the daemon only asks for confinement
/// when it found Landlock at startup.
fn ruleset(paths: &Paths) -> Result<landlock::RulesetCreated, String> {
    use landlock::{
        ABI, Access, AccessFs, BitFlags, PathBeneath, PathFd, Ruleset, RulesetAttr,
        RulesetCreatedAttr, Scope,
    };
    let abi = ABI::V6;
    let all = AccessFs::from_all(abi);
    let read = AccessFs::from_read(abi);
    let file_only = AccessFs::from_file(abi);
    let created = Ruleset::default()
        .handle_access(all)
        .and_then(|r| r.scope(Scope::from_all(abi)))
        .and_then(|r| r.create())
        .map_err(|e| format!("cannot create the Landlock ruleset: {e}"))?;
    let mut rules = Vec::new();
    let granted = paths
        .read
        .iter()
        .map(|p| (p, read))
        .chain(paths.write.iter().map(|p| (p, all)));
    for (path, access) in granted {
        let fd = match PathFd::new(path) {
            Ok(fd) => fd,
            // A default path this host does not have (/lib64) grants nothing.
            Err(_) if !path.exists() => continue,
            Err(e) => return Err(format!("cannot open {}: {e}", path.display())),
        };
        // A file takes only the rights that apply to files.
        let access: BitFlags<AccessFs> = if path.is_dir() {
            access
        } else {
            access & file_only
        };
        rules.push(Ok::<_, landlock::RulesetError>(PathBeneath::new(
            fd, access,
        )));
    }
    created
        .add_rules(rules)
        .map_err(|e| format!("cannot grant the tool's paths: {e}"))
}

/// Runs the tool and returns the exit code to end with (a signal death is
/// re-raised instead, so the daemon sees the tool's own outcome).
pub fn run(parent: u32, policy: Option<&str>, argv: &[String]) -> i32 {
    let policy: Policy = match policy.map(serde_json::from_str).transpose() {
        Ok(p) => p.unwrap_or_default(),
        Err(e) => {
            eprintln!("taskgate exec-tool: unreadable policy: {e}");
            return CANNOT_EXECUTE;
        }
    };
    handle(PARENT_DEATH, on_parent_death);
    // SIGTERM is for the tool (the daemon signals the shim's group): the
    // shim forwards it to every descendant, gives them the grace, then
    // kills what is left.
    handle(Signal::SIGTERM, on_terminate);
    handle(STOP_NOW, on_stop);
    // SAFETY: plain prctl(2) calls on this process.
    unsafe {
        // The daemon's `exec` of this binary made the shim dumpable again:
        // not dumpable, its /proc files (environment, memory, maps,
        // descriptors) belong to root, out of reach of the tool it runs
        // as the same user. The tool's own `exec` makes the tool dumpable
        // again, which concerns only itself.
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
        libc::prctl(libc::PR_SET_PDEATHSIG, PARENT_DEATH as libc::c_int, 0, 0, 0);
    }
    if std::os::unix::process::parent_id() != parent {
        // The daemon died before the shim was ready.
        return CANNOT_EXECUTE;
    }
    // The report descriptor stays the shim's: the tool must not write it.
    let mut report = policy.report_fd.map(|fd| {
        // SAFETY: the daemon opened this descriptor for the shim alone.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let _ = nix::fcntl::fcntl(
            &fd,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        );
        std::fs::File::from(fd)
    });
    let Some((program, args)) = argv.split_first() else {
        eprintln!("taskgate exec-tool: no program given");
        return CANNOT_EXECUTE;
    };
    let mut ruleset = match policy.paths.as_ref().map(ruleset).transpose() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("taskgate exec-tool: {e}; the tool was not started");
            return CANNOT_EXECUTE;
        }
    };
    let limits = policy.limits;
    let nproc = limits
        .map(|l| user_tasks() + l.max_processes.saturating_mul(NPROC_PER_PROCESS))
        .unwrap_or(0);
    let mut cmd = Command::new(program);
    cmd.args(args).process_group(0);
    // SAFETY: the shim is single-threaded, so the child may allocate; each
    // step is a plain system call on the child itself.
    unsafe {
        cmd.pre_exec(move || {
            // The tool dies if the shim does.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(l) = &limits {
                apply_limits(l, nproc)?;
            }
            if let Some(r) = ruleset.take() {
                let status = r.restrict_self().map_err(std::io::Error::other)?;
                if status.ruleset == landlock::RulesetStatus::NotEnforced {
                    return Err(std::io::Error::other(
                        "Landlock is not enforced by this kernel",
                    ));
                }
            }
            Ok(())
        });
    }
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("taskgate exec-tool: cannot start {program}: {e}");
            return CANNOT_EXECUTE;
        }
    };
    let tool = Pid::from_raw(child.id() as i32);
    let me = std::process::id() as i32;
    let exited = pidfd(tool);
    let mut watch = Watch::default();
    let mut term_since: Option<Instant> = None;
    let mut ended_by_itself = false;
    let grace = Duration::from_millis(policy.grace_ms);
    let mut tick = 0u32;
    loop {
        reap(tool, &mut watch);
        if watch.tool.is_some() {
            ended_by_itself = true;
            break;
        }
        if ORPHANED.load(Ordering::SeqCst) || STOP.load(Ordering::SeqCst) {
            break;
        }
        if TERMINATE.load(Ordering::SeqCst) {
            match term_since {
                None => {
                    signal_all(me, tool, Signal::SIGTERM);
                    term_since = Some(Instant::now());
                }
                Some(t) if t.elapsed() >= grace => break,
                Some(_) => {}
            }
        }
        if tick.is_multiple_of(SCAN_EVERY) {
            let procs = scan();
            let mine = descendants(&procs, me);
            for pid in &mine {
                if let Some(p) = procs.get(pid) {
                    watch.peak_vsize = watch.peak_vsize.max(p.vsize);
                }
            }
            if let Some(l) = &limits
                && mine.len() as u64 > l.max_processes
            {
                watch.exceeded = Some(names::max_processes);
                break;
            }
        }
        tick = tick.wrapping_add(1);
        wait_tick(exited.as_ref());
    }
    // Whatever ended the wait, nothing the tool started outlives it.
    let left = kill_all(me, tool, &mut watch);
    if let Some(l) = &limits
        && left as u64 > l.max_processes
    {
        // A tool that ended leaving more processes than it may have (a
        // fork bomb whose first shell returned) failed all the same.
        watch.exceeded = Some(names::max_processes);
    }
    let status = match (watch.tool, watch.exceeded) {
        // A limit ended the run, whatever the tool's own status said.
        (Some(WaitStatus::Exited(_, 0)), Some(_)) => None,
        (status, _) => status,
    };
    if let (Some(l), None, true) = (&limits, watch.exceeded, ended_by_itself) {
        watch.exceeded = limit_hit(l, status, watch.peak_vsize);
    }
    if let (Some(r), Some(limit)) = (report.as_mut(), watch.exceeded) {
        let _ = writeln!(r, "limit {limit}");
    }
    drop(report);
    match status {
        Some(WaitStatus::Exited(_, code)) => code,
        Some(WaitStatus::Signaled(_, sig, _)) => {
            reset(sig);
            let _ = raise(sig);
            128 + sig as i32
        }
        // Stopped, cancelled or orphaned before the tool ended: it was
        // killed by the shim.
        _ => {
            reset(Signal::SIGKILL);
            let _ = raise(Signal::SIGKILL);
            128 + libc::SIGKILL
        }
    }
}

/// Which limit ended a tool that failed, from how it ended and what it
/// used. A death by SIGXFSZ or SIGXCPU (or a shell's report of one, exit
/// status 128 + the signal) names its limit; a tool that failed after its
/// processes used at least half of their address space is reported as
/// stopped by that limit (an allocation past RLIMIT_AS fails, and most
/// programs then exit or abort).
fn limit_hit(
    limits: &ProcessLimits,
    status: Option<WaitStatus>,
    peak_vsize: u64,
) -> Option<&'static str> {
    let code = match status? {
        WaitStatus::Exited(_, 0) => return None,
        WaitStatus::Exited(_, c) => c,
        WaitStatus::Signaled(_, s, _) => 128 + s as i32,
        _ => return None,
    };
    if code == 128 + libc::SIGXFSZ {
        return Some(names::max_file_bytes);
    }
    if code == 128 + libc::SIGXCPU {
        return Some(names::max_cpu_secs);
    }
    // SAFETY: getrusage(2) fills the struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let _ = unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    let cpu = usage.ru_utime.tv_sec as u64 + usage.ru_stime.tv_sec as u64;
    if code == 128 + libc::SIGKILL && cpu >= limits.max_cpu_secs {
        return Some(names::max_cpu_secs);
    }
    let peak = peak_vsize.max(usage.ru_maxrss.max(0) as u64 * 1024);
    if peak >= limits.max_address_space_bytes / 2 {
        return Some(names::max_address_space_bytes);
    }
    None
}
