//! The operator's side of the admin socket: `taskgate status`,
//! `taskgate backup --online` and `taskgate reload`.

use std::fs;
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::{Answer, Request, Status};
use crate::config::{Config, Overrides};
use crate::exit::{ExitClass, Refusal};
use crate::state_dir;

/// How long `status` waits for its answer.
const STATUS_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `reload` waits for the daemon's outcome: reading the file and
/// compiling its tools, possibly behind another reload.
const RELOAD_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest answer line read (a status is well under 4 KiB).
const MAX_ANSWER_BYTES: u64 = 1 << 20;

/// Longest answer read for one upstream's capabilities (each tool's whole
/// description, up to `max_tools` of them).
const MAX_UPSTREAM_ANSWER_BYTES: u64 = 64 << 20;
/// Names of the snapshots `--into` makes: `taskgate-<UTC time>`, which sort
/// by age.
const SNAPSHOT_PREFIX: &str = "taskgate-";
const STAMP_FORMAT: &str = "%Y%m%dT%H%M%SZ";
const STAMP_LEN: usize = 16;

/// Where to reach the daemon serving a state directory.
pub struct Target {
    pub socket: PathBuf,
    /// The state directory the operator named (resolved), when the socket
    /// was found from it: the daemon's answer must name the same one.
    pub state_dir: Option<PathBuf>,
    /// The admin key its daemon recorded in `tasks.lock`, presented with
    /// every request (never printed).
    key: Option<String>,
}

/// Makes this process not dumpable before it reads the admin key: a
/// client run as the service user (the unit's `ExecReload=`) must not
/// hand the key to a tool that reads its memory through /proc.
fn protect_client() {
    // SAFETY: prctl(2) on this process only.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
}

/// Finds the admin socket of the daemon serving the configured state
/// directory (`--config`, `$TASKGATE_CONFIG`, `--state-dir`, else the
/// packaged service's configuration when it exists): `--socket` when
/// given; else the path that daemon recorded in `tasks.lock`; else where
/// `serve` would put it with this environment.
pub fn locate(overrides: &Overrides, socket: Option<&Path>) -> Result<Target, Refusal> {
    locate_with(overrides, socket, false)
}

/// [`locate`]; with `lenient`, a configuration that does not load (the
/// very file a reload is about) still finds the daemon when the state
/// directory is known without it: `--state-dir`, systemd's
/// `$STATE_DIRECTORY` under the unit, or the packaged service's.
fn locate_with(
    overrides: &Overrides,
    socket: Option<&Path>,
    lenient: bool,
) -> Result<Target, Refusal> {
    protect_client();
    // Like `call` and `task`: with nothing named, an operator on a host
    // with the packaged service means that daemon.
    let mut overrides = overrides.clone();
    if overrides.config_path.is_none()
        && overrides.state_dir.is_none()
        && std::env::var_os(crate::config::ENV_CONFIG_PATH).is_none()
        && Path::new(crate::config::PACKAGE_CONFIG_PATH).exists()
    {
        overrides.config_path = Some(crate::config::PACKAGE_CONFIG_PATH.into());
    }
    if let Some(s) = socket {
        return Ok(Target {
            socket: s.to_path_buf(),
            state_dir: None,
            key: key_for_socket(&overrides, s),
        });
    }
    let state_dir = match Config::load(&overrides) {
        Ok(config) => config.state_dir,
        Err(e) if lenient => match state_dir_without_config(&overrides) {
            Some(dir) => dir,
            None => {
                return Err(Refusal::new(
                    ExitClass::Config,
                    format!(
                        "{e}; no daemon was asked, as its state directory comes from this file (name it with --state-dir or --socket to ask the daemon anyway)"
                    ),
                ));
            }
        },
        Err(e) => return Err(e.into()),
    };
    let dir = fs::canonicalize(&state_dir).unwrap_or(state_dir);
    let (socket, key) = match state_dir::recorded_admin(&dir) {
        Ok(recorded) => (
            recorded.socket.unwrap_or_else(|| super::socket_path(&dir)),
            recorded.key,
        ),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            return Err(Refusal::new(
                ExitClass::Protocol,
                format!(
                    "permission denied reading {}: only root and the service user may ask the daemon; run as one of them (sudo taskgate …)",
                    dir.join(state_dir::LOCK_FILE).display()
                ),
            ));
        }
        Err(_) => (super::socket_path(&dir), None),
    };
    Ok(Target {
        socket,
        state_dir: Some(dir),
        key,
    })
}

/// The key for a socket named with `--socket`: the one recorded in the
/// configured state directory's `tasks.lock`, only when that file records
/// this very socket, so that the key never goes to a socket its daemon
/// did not make. Without it the daemon refuses the request.
fn key_for_socket(overrides: &Overrides, socket: &Path) -> Option<String> {
    let dir = Config::load(overrides)
        .ok()
        .map(|c| c.state_dir)
        .or_else(|| state_dir_without_config(overrides))?;
    let dir = fs::canonicalize(&dir).unwrap_or(dir);
    let recorded = state_dir::recorded_admin(&dir).ok()?;
    let same = |a: &Path, b: &Path| {
        a == b || matches!((fs::canonicalize(a), fs::canonicalize(b)), (Ok(x), Ok(y)) if x == y)
    };
    match recorded.socket {
        Some(s) if same(&s, socket) => recorded.key,
        _ => None,
    }
}

/// The state directory as `serve` would resolve it before the file:
/// the flag, then systemd's `$STATE_DIRECTORY` (its first entry); for the
/// packaged configuration, the packaged service's directory (its unit's
/// `StateDirectory=`, which the conffile may only repeat).
fn state_dir_without_config(overrides: &Overrides) -> Option<PathBuf> {
    let packaged =
        overrides.config_path.as_deref() == Some(Path::new(crate::config::PACKAGE_CONFIG_PATH));
    overrides
        .state_dir
        .clone()
        .or_else(|| {
            std::env::var("STATE_DIRECTORY")
                .ok()
                .and_then(|v| v.split(':').next().map(PathBuf::from))
        })
        .or_else(|| packaged.then(|| PathBuf::from(crate::config::PACKAGE_STATE_DIR)))
        .filter(|p| p.is_absolute())
}

fn unreachable(target: &Target, why: &str) -> Refusal {
    let what = match &target.state_dir {
        Some(d) => format!("no daemon is serving {}", d.display()),
        None => "no daemon answers".to_string(),
    };
    Refusal::new(
        ExitClass::Unreachable,
        format!(
            "{what} ({why} on {}); start it (systemctl start taskgate) or name its state directory with --config/--state-dir",
            target.socket.display()
        ),
    )
}

/// Sends one request and reads the answer; `wait` bounds the wait for it
/// (`None`: as long as the daemon takes, for a snapshot).
pub fn ask(target: &Target, request: &Request, wait: Option<Duration>) -> Result<Answer, Refusal> {
    let mut stream = UnixStream::connect(&target.socket).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => unreachable(target, "no admin socket"),
        io::ErrorKind::ConnectionRefused => unreachable(target, "nothing listening"),
        io::ErrorKind::PermissionDenied => Refusal::new(
            ExitClass::Protocol,
            format!(
                "permission denied on {}: only root and the service user may use the admin socket",
                target.socket.display()
            ),
        ),
        _ => unreachable(target, &e.to_string()),
    })?;
    let io_fail = |e: io::Error| {
        if matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ) {
            Refusal::new(
                ExitClass::Unreachable,
                format!(
                    "the daemon did not answer on {} in time",
                    target.socket.display()
                ),
            )
        } else {
            Refusal::new(
                ExitClass::Unreachable,
                format!("the admin connection broke: {e}"),
            )
        }
    };
    stream.set_read_timeout(wait).map_err(io_fail)?;
    stream
        .set_write_timeout(Some(super::REQUEST_READ_TIMEOUT))
        .map_err(io_fail)?;
    let line = super::keyed_request(request, target.key.as_deref())
        .map_err(|e| Refusal::new(ExitClass::Io, e.to_string()))?;
    match stream.write_all(&line) {
        // A daemon that refuses a connection answers and closes before
        // reading: its answer is still there to read.
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
            ) => {}
        r => r.map_err(io_fail)?,
    }
    let mut answer = String::new();
    let limit = match request {
        Request::Upstreams { alias: Some(_) } => MAX_UPSTREAM_ANSWER_BYTES,
        _ => MAX_ANSWER_BYTES,
    };
    BufReader::new(io::Read::take(stream, limit))
        .read_line(&mut answer)
        .map_err(io_fail)?;
    if answer.is_empty() {
        return Err(Refusal::new(
            ExitClass::Unreachable,
            format!(
                "the daemon closed {} without an answer",
                target.socket.display()
            ),
        ));
    }
    let answer: Answer = serde_json::from_str(&answer).map_err(|e| {
        Refusal::new(
            ExitClass::Protocol,
            format!("the daemon's answer is not understood: {e}"),
        )
    })?;
    match answer {
        Answer::Error(e) => Err(Refusal::new(e.class(), e.message)),
        a => Ok(a),
    }
}

/// `taskgate status`: the lines to print and the exit class (`None`: 0;
/// `CallFailed` when the daemon answered but its store is disabled).
pub fn status(
    overrides: &Overrides,
    socket: Option<&Path>,
    json: bool,
) -> Result<(Vec<String>, Option<ExitClass>), Refusal> {
    let target = locate(overrides, socket)?;
    let status = match ask(&target, &Request::Status, Some(STATUS_TIMEOUT))? {
        Answer::Status(s) => s,
        _ => {
            return Err(Refusal::new(
                ExitClass::Protocol,
                "the daemon answered something else than a status",
            ));
        }
    };
    check_same_dir(&target, &status.state_dir)?;
    let class = (status.store == "disabled").then_some(ExitClass::CallFailed);
    let lines = if json {
        vec![serde_json::to_string_pretty(&status).unwrap_or_default()]
    } else {
        render(&status)
    };
    Ok((lines, class))
}

/// `taskgate upstream list` and `show`: the daemon's upstreams, or the one
/// named with each of its capabilities.
pub fn upstreams(
    overrides: &Overrides,
    socket: Option<&Path>,
    alias: Option<&str>,
) -> Result<Vec<crate::upstream::UpstreamStatus>, Refusal> {
    let target = locate(overrides, socket)?;
    let request = Request::Upstreams {
        alias: alias.map(str::to_string),
    };
    match ask(&target, &request, Some(STATUS_TIMEOUT))? {
        Answer::Upstreams { upstreams } => Ok(upstreams),
        _ => Err(Refusal::new(
            ExitClass::Protocol,
            "the daemon answered something else than its upstreams",
        )),
    }
}

/// The durable routes (the nonterminal ones when `open`), or the one `id`
/// names.
pub fn routes(
    overrides: &Overrides,
    socket: Option<&Path>,
    id: Option<&str>,
    open: bool,
) -> Result<Vec<super::RouteStatus>, Refusal> {
    let target = locate(overrides, socket)?;
    let request = Request::Routes {
        id: id.map(str::to_string),
        open,
    };
    match ask(&target, &request, Some(STATUS_TIMEOUT))? {
        Answer::Routes { routes } => Ok(routes),
        Answer::Error(e) => Err(Refusal::new(e.class(), e.message)),
        _ => Err(Refusal::new(
            ExitClass::Protocol,
            "the daemon answered something else than its routes",
        )),
    }
}

/// Asks the daemon about approvals, or for a decision: the proposals it
/// answers with and the journal's state.
pub fn approvals(
    overrides: &Overrides,
    socket: Option<&Path>,
    request: Request,
) -> Result<
    (
        Vec<crate::approvals::Proposal>,
        crate::tasks::ApprovalsStatus,
    ),
    Refusal,
> {
    let target = locate(overrides, socket)?;
    match ask(&target, &request, Some(STATUS_TIMEOUT))? {
        Answer::Approvals { proposals, journal } => Ok((proposals, journal)),
        Answer::Error(e) => Err(Refusal::new(e.class(), e.message)),
        _ => Err(Refusal::new(
            ExitClass::Protocol,
            "the daemon answered something else than its approvals",
        )),
    }
}

/// A socket found from `$RUNTIME_DIRECTORY` may belong to the daemon of
/// another state directory: say so rather than report on the wrong one.
fn check_same_dir(target: &Target, served: &Path) -> Result<(), Refusal> {
    match &target.state_dir {
        Some(dir) if dir != served => Err(Refusal::new(
            ExitClass::Protocol,
            format!(
                "the daemon on {} serves {}, not {}; name the right one with --config/--state-dir or --socket",
                target.socket.display(),
                served.display(),
                dir.display()
            ),
        )),
        _ => Ok(()),
    }
}

/// `taskgate reload`: asks the daemon serving the state directory to
/// re-read its configuration (exactly as SIGHUP does) and returns what it
/// did, line by line. A refused file is a refusal of the class the daemon
/// refused it with (78 for an invalid configuration); the daemon goes on
/// with its previous settings.
pub fn reload(overrides: &Overrides, socket: Option<&Path>) -> Result<Vec<String>, Refusal> {
    let target = locate_with(overrides, socket, true)?;
    // Its own status first: the right daemon.
    match ask(&target, &Request::Status, Some(STATUS_TIMEOUT))? {
        Answer::Status(s) => check_same_dir(&target, &s.state_dir)?,
        _ => {
            return Err(Refusal::new(
                ExitClass::Protocol,
                "the daemon answered something else than a status",
            ));
        }
    }
    match ask(&target, &Request::Reload, Some(RELOAD_TIMEOUT))? {
        Answer::Reload(done) => Ok(done.lines),
        _ => Err(Refusal::new(
            ExitClass::Protocol,
            "the daemon answered something else than a reload",
        )),
    }
}

fn duration(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m {s}s"),
        (0, _, _) => format!("{h}h {m}m"),
        _ => format!("{d}d {h}h"),
    }
}

fn bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} bytes"),
    }
}

/// The one screen an operator reads.
pub fn render(s: &Status) -> Vec<String> {
    let store = match &s.disabled_reason {
        Some(reason) => format!("DISABLED until restart: {reason}"),
        None => s.store.clone(),
    };
    let tasks = match s.tasks {
        Some(t) => format!(
            "{} retained, {} unexpired, {} running",
            t.retained, t.unexpired, s.running
        ),
        None => format!("counts unavailable, {} running", s.running),
    };
    let checkpoint = match &s.last_checkpoint {
        Some(t) => format!("last checkpoint {t}"),
        None => "no checkpoint since start".into(),
    };
    let f = &s.fallbacks;
    let fallbacks = if f.total == 0 {
        "none".to_string()
    } else {
        let parts: Vec<String> = [
            ("slots busy", f.slots_busy),
            ("store busy", f.store_busy),
            ("store capacity", f.store_capacity),
            ("store unavailable", f.store_unavailable),
        ]
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(w, n)| format!("{w} {n}"))
        .collect();
        format!("{} ({})", f.total, parts.join(", "))
    };
    let mut lines = vec![
        format!(
            "taskgate {}, pid {}, up {} (since {})",
            s.version,
            s.pid,
            duration(s.uptime_secs),
            s.started
        ),
        format!("state directory  {}", s.state_dir.display()),
        format!("listening on     {}", s.listen),
        format!("admin socket     {}", s.admin_socket.display()),
        format!("task store       {store}"),
        format!("tasks            {tasks}"),
        format!(
            "since start      {} tool runs started, {} task reads from the store",
            s.runs_started, s.task_reads
        ),
        format!("store queue      {} of {}", s.queue.depth, s.queue.capacity),
        format!("WAL              {}; {checkpoint}", bytes(s.wal_bytes)),
        format!("fallbacks        {fallbacks} (calls that asked for a task and ran synchronously)"),
    ];
    if let Some(n) = s.legacy_sessions {
        lines.push(format!("legacy sessions  {n} open"));
    }
    if s.snapshot_running {
        lines.push("snapshot         an online snapshot is being written".into());
    }
    for p in &s.parts {
        lines.push(format!(
            "durable part     {}: {} files, {} in {}",
            p.name,
            p.files,
            bytes(p.bytes),
            p.dir.display()
        ));
    }
    for u in &s.upstreams {
        let mut line = format!(
            "upstream         {}: {} since {}, {} tools ({} available, {} withheld, {} unpinned)",
            u.alias, u.state, u.since, u.tools, u.available, u.withheld, u.unpinned
        );
        if let Some(v) = &u.protocol_version {
            line.push_str(&format!(", protocol {v}"));
        }
        if u.route_echo == crate::config::RouteEcho::CreationOnly.as_str() {
            line.push_str(", routes trust polls without an echo (route_echo = creation_only)");
        }
        if let Some(e) = &u.last_error {
            line.push_str(&format!("; last error: {e}"));
        }
        lines.push(line);
        for w in &u.withheld_tools {
            lines.push(format!("  withheld       {}: {}", w.name, w.reason));
        }
        if u.withheld > u.withheld_tools.len() {
            lines.push(format!(
                "  withheld       and {} more (taskgate upstream show {})",
                u.withheld - u.withheld_tools.len(),
                u.alias
            ));
        }
    }
    for line in &s.recovered {
        lines.push(format!("recovered        {line}"));
    }
    if let Some(r) = &s.routes {
        lines.push(format!(
            "routes           {} unexpired: {} prepared, {} dispatching, {} routed, {} cancel requested, {} need reconciliation, {} terminal",
            r.total(),
            r.prepared,
            r.dispatching,
            r.routed,
            r.cancel_requested,
            r.reconciliation_required,
            r.terminal
        ));
    }
    if let Some(a) = &s.approvals {
        lines.push(match &a.disabled {
            Some(reason) => format!(
                "approvals        DISABLED: {reason}; held tools refuse their calls (journal {})",
                a.directory.display()
            ),
            None => format!(
                "approvals        {} pending; journal {}: {} records, {} bytes, head {}",
                a.pending,
                a.directory.display(),
                a.records,
                a.bytes,
                &a.head[..a.head.len().min(16)]
            ),
        });
        if let Some(stale) = &a.stale {
            lines.push(format!("approvals        STALE: {stale}"));
        }
    }
    if let Some(c) = &s.confinement {
        lines.extend(c.lines());
    }
    lines
}

fn absolute(p: &Path) -> Result<PathBuf, Refusal> {
    if p.is_absolute() {
        return Ok(p.to_path_buf());
    }
    std::env::current_dir().map(|d| d.join(p)).map_err(|e| {
        Refusal::new(
            ExitClass::Io,
            format!("cannot resolve {}: {e}", p.display()),
        )
    })
}

/// `taskgate backup --online --to DEST`: asks the daemon for a snapshot.
pub fn online_backup(
    overrides: &Overrides,
    socket: Option<&Path>,
    dest: &Path,
) -> Result<Vec<String>, Refusal> {
    let dest = absolute(dest)?;
    // Checked here too, so the common mistake is told before the daemon
    // is asked; the daemon checks everything again as the one who writes.
    if fs::symlink_metadata(&dest).is_ok() {
        return Err(Refusal::new(
            ExitClass::UnsafePath,
            format!(
                "{}: already exists; choose a new destination (a backup never overwrites)",
                dest.display()
            ),
        ));
    }
    let target = locate(overrides, socket)?;
    // Its own status first: the right daemon, and one that can write.
    match ask(&target, &Request::Status, Some(STATUS_TIMEOUT))? {
        Answer::Status(s) => check_same_dir(&target, &s.state_dir)?,
        _ => {
            return Err(Refusal::new(
                ExitClass::Protocol,
                "the daemon answered something else than a status",
            ));
        }
    }
    match ask(&target, &Request::Snapshot { to: dest }, None)? {
        Answer::Snapshot(done) => Ok(done.lines),
        _ => Err(Refusal::new(
            ExitClass::Protocol,
            "the daemon answered something else than a snapshot",
        )),
    }
}

/// `taskgate backup --online --into DIR --keep N`: a snapshot named by the
/// time into DIR, then the oldest of DIR's snapshots beyond the newest N
/// are removed (only after the new one is verified).
pub fn online_backup_into(
    overrides: &Overrides,
    socket: Option<&Path>,
    dir: &Path,
    keep: usize,
) -> Result<Vec<String>, Refusal> {
    let dir = absolute(dir)?;
    let stamp = chrono::DateTime::<chrono::Utc>::from(SystemTime::now()).format(STAMP_FORMAT);
    let dest = dir.join(format!("{SNAPSHOT_PREFIX}{stamp}"));
    let mut lines = online_backup(overrides, socket, &dest)?;
    for old in prune(&dir, keep)? {
        lines.push(format!("removed the old snapshot {}", old.display()));
    }
    Ok(lines)
}

/// Removes the oldest snapshots in `dir` beyond the newest `keep`. Only
/// what `--into` makes is considered: directories (never links) named
/// `taskgate-<UTC time>` that hold a manifest.
fn prune(dir: &Path, keep: usize) -> Result<Vec<PathBuf>, Refusal> {
    let io = |e: io::Error| Refusal::new(ExitClass::Io, format!("{}: {e}", dir.display()));
    let mut snapshots: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(io)?
        .filter_map(|e| e.ok())
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.strip_prefix(SNAPSHOT_PREFIX).is_some_and(|stamp| {
                stamp.len() == STAMP_LEN
                    && chrono::NaiveDateTime::parse_from_str(stamp, STAMP_FORMAT).is_ok()
            })
        })
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .filter(|p| p.join(crate::parts::MANIFEST).is_file())
        .collect();
    snapshots.sort();
    let excess = snapshots.len().saturating_sub(keep);
    let mut removed = Vec::new();
    for old in snapshots.into_iter().take(excess) {
        fs::remove_dir_all(&old).map_err(|e| {
            Refusal::new(
                ExitClass::Io,
                format!("{}: cannot remove: {e}", old.display()),
            )
        })?;
        removed.push(old);
    }
    Ok(removed)
}
