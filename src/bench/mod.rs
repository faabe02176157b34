//! `taskgate bench`: the capacity benchmark an operator runs on the host
//! that will serve.
//!
//! It measures the disk first (raw SQLite commits with the production
//! pragmas, [`crate::store::baseline`]), then starts a real daemon (this
//! binary, `serve --bench-tool`) on a fresh private scratch directory on
//! the same filesystem and drives tasks through the real MCP HTTP path:
//!
//! 1. serial: tasks created one after another by one client, for the
//!    latency of one creation against one raw commit;
//! 2. throughput: N creations by C concurrent clients;
//! 3. completion: every task polled until it ended (all must complete);
//! 4. retained: polls of random tasks with all N retained.
//!
//! The no-op floor is also measured, in the same run, on the bare rmcp
//! service ([`reference`]): what taskgate's HTTP and MCP layers cost
//! beyond the library they are built on. With `--compare URL` the same
//! load runs on another MCP server on this host, for an operator to read
//! taskgate's figures as ratios to an alternative's.
//!
//! Then the cost of authentication: two more daemons, one requiring a
//! static token and one a JWT ([`credentials`]), each given the same
//! creations, in alternating rounds so that the host's noise falls on both.
//!
//! The daemon is configured for the load the benchmark drives
//! ([`sizing`]), and that configuration is recorded with the results. A
//! busy answer is sent again after the wait it asks for, a bounded number
//! of times, and counted per phase.
//!
//! The WAL size is sampled throughout and the daemon's peak RSS read at
//! the end. Results go to `bench.json`, `bench.md` and `latency.svg`.
//!
//! Owns `taskgate bench`. Starts a real daemon (`serve --bench-tool`) on a
//! scratch directory, learns its readiness and port from READY=1/STATUS= on its
//! own notify socket, and drives it with `client::Client` (busy answers retried
//! a bounded number of times and counted per phase); the disk baseline is
//! `store::baseline`. `sizing.rs` sizes the daemon's request, connection,
//! queue, slot and live-task bounds from the concurrency and task count
//! (refusing, as a usage error, a load a key's range cannot serve) and writes
//! its config file. `reference.rs` finds and starts the bare rmcp server
//! (`examples/bare_rmcp.rs`, rmcp's `StreamableHttpService` with one no-op
//! tool, stateless JSON answers; `--bare-rmcp`, else `examples/bare_rmcp`
//! beside the executable) that the same no-op load runs on, its CPU per request
//! read the same way; one that cannot be found or started is reported as not
//! measured, never a failed run. It also checks a `--compare` URL (plain
//! `http://` to a loopback address only, else a usage refusal before anything
//! starts) and finds the process serving it (`--compare-pid`, else the owner of
//! the listening socket, from /proc/net/tcp and the processes' descriptors) so
//! the same no-op load can be run on it and read as ratios. `credentials.rs`
//! makes the authenticated phases' credentials for each run (a static token
//! from `auth::tokens`, its hash in a private tokens file; an Ed25519 key from
//! the OS random source, its public half as a JWKS file, and one EdDSA access
//! token signed with jsonwebtoken) and the `[auth]` section requiring them; two
//! more daemons so configured get the same creations in alternating rounds,
//! with their CPU per create. `routed.rs` starts one more daemon with one stdio
//! `[[upstream]]` (this binary, `serve --stdio --bench-tool`), pins and reloads
//! with the operator commands, and sends `taskgate_submit` under one lease one
//! at a time and at the run's concurrency (submissions built with
//! `route::input_digest` and `SUBMISSION_SCHEMA`), following one route to
//! completion. `report.rs` renders bench.json (serde, with that configuration),
//! bench.md, latency.svg. The bench names no rmcp type: the bare server is a
//! separate program.

mod credentials;
mod reference;
mod report;
mod routed;
mod sizing;

use std::io::Write as _;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::client::{Client, ClientError};
use crate::config::{Config, Overrides};
use crate::exit::{ExitClass, Refusal};
use crate::store::baseline;
use crate::tools::builtin::BENCH_TOOL;
use crate::wire;

pub use report::Summary;
pub use sizing::Sizing;

/// Commits of the single-row baseline.
const BASELINE_SINGLES: usize = 400;
/// Commits of the batched baseline.
const BASELINE_BATCHES: usize = 60;
/// Tasks of the serial phase, at most.
const SERIAL_TASKS: usize = 500;
/// Polls of the retained phase, at most.
const RETAINED_POLLS: usize = 5000;
/// No-op requests (`tools/list`) of the floor phase at concurrency C, at
/// least: enough that the daemon's CPU per request is steady within a
/// run.
const NOOP_REQUESTS: usize = 5000;
/// How often the WAL size is sampled.
const WAL_SAMPLE: Duration = Duration::from_millis(10);
/// The poll interval the benchmark daemon advertises.
const BENCH_POLL_INTERVAL_MS: u64 = 50;
/// Rounds of the authenticated create phases: each daemon's creations
/// come in this many chunks, the two daemons taking turns.
const AUTH_ROUNDS: usize = 4;
/// Creations on each authenticated daemon before the counted ones, at
/// most: its first requests (and the first verification of the JWT) are
/// not what a serving daemon spends.
const AUTH_WARMUP: usize = 200;
/// How many times one request is sent again after a busy answer
/// (`TG_SERVER_BUSY`) before the run fails. The daemon is sized so that
/// none should come; a few are retried and counted rather than end a run.
const BENCH_BUSY_RETRIES: u32 = 5;

/// What the operator asked for.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub tasks: usize,
    pub concurrency: usize,
    /// Where the scratch directory is created (the disk under test).
    pub dir: Option<PathBuf>,
    /// Where the reports go.
    pub out: Option<PathBuf>,
    pub config: Option<PathBuf>,
    /// Keep the scratch directory (database included) afterwards.
    pub keep: bool,
    /// The bare rmcp server to measure the no-op floor on; by default the
    /// example beside this executable.
    pub bare_rmcp: Option<PathBuf>,
    /// Another MCP server (loopback only) to drive with the same no-op load.
    pub compare: Option<String>,
    /// Its process, for its CPU per request; by default the owner of the
    /// socket listening on the URL's port, when it can be found.
    pub compare_pid: Option<u32>,
}

fn refusal(class: ExitClass, msg: impl Into<String>) -> Refusal {
    Refusal::new(class, msg)
}

/// Latencies and counters of one phase.
#[derive(Debug, Default)]
struct Phase {
    latencies: Vec<Duration>,
    elapsed: Duration,
    refused: u64,
    /// Busy answers received (and retried).
    busy: u64,
}

/// What the workers of one concurrent phase did.
struct Run {
    latencies: Vec<Duration>,
    /// (index, task ID) of the calls that created a task, by index.
    ids: Vec<(usize, String)>,
    refused: u64,
    busy: u64,
    elapsed: Duration,
}

/// A benchmark client: it retries busy answers, a bounded number of times,
/// and sends `token` as its bearer credential when given one.
fn bench_client(url: &str, token: Option<&str>) -> Result<Client, Refusal> {
    Ok(Client::new(url, true)
        .map_err(client_refusal)?
        .with_busy_retries(BENCH_BUSY_RETRIES)
        .with_token(token.map(String::from)))
}

/// A running benchmark daemon; killed if dropped.
struct BenchDaemon {
    child: Child,
    url: String,
}

impl Drop for BenchDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts a benchmark daemon and returns once it is ready. Readiness and
/// the port come the way systemd learns them: `READY=1` and `STATUS=serving
/// on 127.0.0.1:PORT; …` on a NOTIFY_SOCKET this process owns. `suffix`
/// names its files apart from another's: `state{suffix}` (which must
/// exist), `daemon{suffix}.log`, `notify{suffix}.sock`.
fn start_daemon(scratch: &Path, suffix: &str, config: &Path) -> Result<BenchDaemon, Refusal> {
    let state = scratch.join(format!("state{suffix}"));
    let log_path = scratch.join(format!("daemon{suffix}.log"));
    let io = |p: &Path, e: std::io::Error| refusal(ExitClass::Io, format!("{}: {e}", p.display()));
    let log = std::fs::File::create(&log_path).map_err(|e| io(&log_path, e))?;
    let sock_path = scratch.join(format!("notify{suffix}.sock"));
    let sock = UnixDatagram::bind(&sock_path).map_err(|e| io(&sock_path, e))?;
    // Short waits, so that a daemon that exits before READY=1 is noticed.
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .map_err(|e| io(&sock_path, e))?;
    let child = Command::new("/proc/self/exe")
        .args([
            "serve",
            "--bench-tool",
            "--listen",
            "127.0.0.1:0",
            "--config",
        ])
        .arg(config)
        .arg("--state-dir")
        .arg(&state)
        .env("TASKGATE_LOG", "warn,taskgate=info")
        .env("NOTIFY_SOCKET", &sock_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|e| {
            refusal(
                ExitClass::Io,
                format!("cannot start the benchmark daemon: {e}"),
            )
        })?;
    let mut d = BenchDaemon {
        child,
        url: String::new(),
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match sock.recv(&mut buf) {
            Ok(n) => {
                let note = String::from_utf8_lossy(&buf[..n]);
                if note.lines().any(|l| l == "READY=1") {
                    let port = note
                        .lines()
                        .find_map(|l| l.strip_prefix("STATUS=serving on 127.0.0.1:"))
                        .and_then(|r| r.split(';').next())
                        .and_then(|p| p.parse::<u16>().ok())
                        .ok_or_else(|| {
                            refusal(
                                ExitClass::Io,
                                format!("the benchmark daemon named no port: {note}"),
                            )
                        })?;
                    d.url = format!("http://127.0.0.1:{port}/mcp");
                    return Ok(d);
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(io(&sock_path, e)),
        }
        if let Ok(Some(status)) = d.child.try_wait() {
            let text = std::fs::read_to_string(&log_path).unwrap_or_default();
            return Err(refusal(
                ExitClass::Io,
                format!("the benchmark daemon exited ({status}): {}", text.trim()),
            ));
        }
        if Instant::now() > deadline {
            return Err(refusal(
                ExitClass::Io,
                "the benchmark daemon was not ready within 60 s",
            ));
        }
    }
}

/// CPU time used so far: the whole host (busy, total jiffies), this
/// process (jiffies) and the measured server ([`cpu_ns`]).
#[derive(Clone, Copy, Default)]
struct CpuClock {
    host_busy: u64,
    host_total: u64,
    client: u64,
    daemon_ns: u64,
}

/// CPU time a process has used, in nanoseconds: its process CPU clock
/// (every thread's, those that have exited included, to the nanosecond);
/// the kernel's 10 ms ticks from /proc when that clock cannot be read.
fn cpu_ns(pid: u32) -> u64 {
    let clock = nix::time::clock_getcpuclockid(nix::unistd::Pid::from_raw(pid as i32))
        .and_then(nix::time::clock_gettime);
    match clock {
        Ok(t) => (t.tv_sec().max(0) as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(t.tv_nsec().max(0) as u64),
        Err(_) => proc_jiffies(&pid.to_string()).saturating_mul(10_000_000),
    }
}

fn proc_jiffies(pid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let rest = s
                .rsplit_once(") ")?
                .1
                .split_whitespace()
                .collect::<Vec<_>>();
            // utime and stime are fields 14 and 15; rest starts at field 3.
            Some(rest.get(11)?.parse::<u64>().ok()? + rest.get(12)?.parse::<u64>().ok()?)
        })
        .unwrap_or(0)
}

impl CpuClock {
    /// The daemon's CPU per request since `before`, in microseconds.
    fn daemon_us_per_request(self, before: CpuClock, requests: usize) -> f64 {
        self.daemon_ns.saturating_sub(before.daemon_ns) as f64 / 1000.0 / requests.max(1) as f64
    }

    fn now(daemon: u32) -> CpuClock {
        let (mut busy, mut total) = (0, 0);
        if let Some(line) = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| s.lines().next().map(String::from))
        {
            let v: Vec<u64> = line
                .split_whitespace()
                .skip(1)
                .filter_map(|x| x.parse().ok())
                .collect();
            total = v.iter().sum();
            // idle and iowait are the 4th and 5th fields.
            busy = total - v.get(3).copied().unwrap_or(0) - v.get(4).copied().unwrap_or(0);
        }
        CpuClock {
            host_busy: busy,
            host_total: total,
            client: proc_jiffies("self"),
            daemon_ns: cpu_ns(daemon),
        }
    }

    /// (host busy %, daemon % of one CPU, client % of one CPU) since `before`.
    fn since(self, before: CpuClock, wall: Duration) -> (f64, f64, f64) {
        let ticks = 100.0 * wall.as_secs_f64().max(1e-9);
        let host = (self.host_busy - before.host_busy) as f64
            / (self.host_total - before.host_total).max(1) as f64
            * 100.0;
        (
            host,
            self.daemon_ns.saturating_sub(before.daemon_ns) as f64
                / (wall.as_secs_f64().max(1e-9) * 1e9)
                * 100.0,
            (self.client - before.client) as f64 / ticks * 100.0,
        )
    }
}

/// The benchmark daemon's poll counters since its start, from `taskgate
/// status --json` over its admin socket: (polls held until due, early polls
/// answered from memory, task reads from the store). None when the status
/// cannot be had (then held polls are reported as not measured).
fn poll_counters(state: &Path) -> Option<report::PollCounters> {
    let out = Command::new("/proc/self/exe")
        .args(["status", "--json", "--state-dir"])
        .arg(state)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    Some(report::PollCounters {
        polls: 0,
        held: v.get("polls_held")?.as_u64()?,
        from_memory: v.get("polls_answered_from_memory")?.as_u64()?,
        store_reads: v.get("task_reads")?.as_u64()?,
    })
}

/// Peak resident set of a process, from /proc (KiB).
fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

fn task_id_of(created: &Value) -> Option<String> {
    (created.get("resultType").and_then(Value::as_str) == Some("task"))
        .then(|| {
            created
                .get("taskId")
                .and_then(Value::as_str)
                .map(String::from)
        })
        .flatten()
}

/// Progress on stderr: a bar when it is a terminal, phase lines otherwise.
struct Progress {
    tty: bool,
}

impl Progress {
    fn show(&self, phase: &str, done: usize, total: usize) {
        if !self.tty {
            return;
        }
        let width = 30;
        let filled = (done * width).checked_div(total).unwrap_or(width);
        let _ = write!(
            std::io::stderr(),
            "\r{phase:<12} [{}{}] {done}/{total}   ",
            "#".repeat(filled),
            " ".repeat(width - filled)
        );
    }

    fn done(&self, line: &str) {
        if self.tty {
            let _ = write!(std::io::stderr(), "\r{:<70}\r", "");
        }
        let _ = writeln!(std::io::stderr(), "{line}");
    }
}

/// Creations one after another from one client: the latency of one
/// creation against one raw commit.
async fn serial_phase(url: &str, n: usize, progress: &Progress) -> Result<Phase, Refusal> {
    let client = bench_client(url, None)?;
    let mut phase = Phase::default();
    let start = Instant::now();
    for i in 0..n {
        let t = Instant::now();
        let created = client
            .call_tool(BENCH_TOOL, json!({}), None)
            .await
            .map_err(client_refusal)?;
        phase.latencies.push(t.elapsed());
        task_id_of(&created)
            .ok_or_else(|| refusal(ExitClass::Io, format!("no task was created: {created}")))?;
        progress.show("serial", i + 1, n);
    }
    phase.elapsed = start.elapsed();
    phase.busy = client.busy_answers();
    Ok(phase)
}

/// The floor: `n` no-op requests (`tools/list`, which reads nothing from
/// the store) on `c` clients, and the server's CPU per request when its
/// process is known.
async fn noop_phase(
    url: &str,
    n: usize,
    c: usize,
    pid: Option<u32>,
    progress: &Progress,
    name: &str,
) -> Result<(Phase, Option<f64>), Refusal> {
    let count = Arc::new(AtomicUsize::new(0));
    let before = pid.map(CpuClock::now);
    let run = with_progress(
        progress,
        name,
        n,
        count.clone(),
        concurrent(url, None, n, c, count, |client, _| async move {
            let t = Instant::now();
            client.request("tools/list", json!({}), None, None).await?;
            Ok((vec![t.elapsed()], None, 0))
        }),
    )
    .await?;
    let cpu = pid
        .zip(before)
        .map(|(pid, before)| CpuClock::now(pid).daemon_us_per_request(before, n));
    Ok((
        Phase {
            latencies: run.latencies,
            elapsed: run.elapsed,
            refused: 0,
            busy: run.busy,
        },
        cpu,
    ))
}

/// One creation of the benchmark's tool: its latency and task ID.
async fn create_one(
    client: Arc<Client>,
    _: usize,
) -> Result<(Vec<Duration>, Option<String>, u64), ClientError> {
    let t = Instant::now();
    let created = client.call_tool(BENCH_TOOL, json!({}), None).await?;
    Ok((vec![t.elapsed()], task_id_of(&created), 0))
}

/// A daemon requiring a credential, and that credential.
struct AuthDaemon {
    daemon: BenchDaemon,
    token: String,
    name: &'static str,
}

/// The cost of authentication: a daemon requiring a static token and one
/// requiring a JWT, each configured as the main one was plus its `[auth]`,
/// each given `n` creations at concurrency `c` in [`AUTH_ROUNDS`] chunks,
/// the two taking turns (and which goes first), with the daemon's CPU read
/// around each chunk. `Err` is why it was not measured: none of this
/// fails the run.
fn auth_cost(
    rt: &tokio::runtime::Runtime,
    sizing: &Sizing,
    scratch: &Path,
    n: usize,
    c: usize,
    progress: &Progress,
) -> Result<report::AuthCost, String> {
    let mut daemons = Vec::new();
    for (suffix, name) in [("-static", "static token"), ("-jwt", "JWT")] {
        let credential = if suffix == "-static" {
            credentials::static_token(scratch)?
        } else {
            credentials::jwt(scratch)?
        };
        let config = scratch.join(format!("bench{suffix}.toml"));
        std::fs::write(&config, format!("{}{}", sizing.toml(), credential.toml))
            .map_err(|e| format!("{}: {e}", config.display()))?;
        private_dir(&scratch.join(format!("state{suffix}"))).map_err(|e| e.to_string())?;
        let daemon = start_daemon(scratch, suffix, &config)
            .map_err(|e| format!("the daemon requiring a {name}: {e}"))?;
        daemons.push(AuthDaemon {
            daemon,
            token: credential.token,
            name,
        });
    }
    rt.block_on(async {
        // Without its credential a create must be refused, or the phase
        // would not be measuring authentication at all.
        for d in &daemons {
            let anonymous = bench_client(&d.daemon.url, None).map_err(|e| e.to_string())?;
            if anonymous.call_tool(BENCH_TOOL, json!({}), None).await.is_ok() {
                return Err(format!(
                    "the daemon requiring a {} created a task without it",
                    d.name
                ));
            }
        }
        let warmup = AUTH_WARMUP.min(n);
        for d in &daemons {
            let count = Arc::new(AtomicUsize::new(0));
            concurrent(&d.daemon.url, Some(&d.token), warmup, c, count, create_one)
                .await
                .map_err(|e| format!("creating with a {}: {e}", d.name))?;
        }
        let mut modes = vec![report::AuthMode::default(); daemons.len()];
        let mut cpu = vec![0u64; daemons.len()];
        let mut latencies = vec![Vec::new(); daemons.len()];
        let rounds = AUTH_ROUNDS.min(n).max(1);
        for round in 0..rounds {
            let chunk = n / rounds + usize::from(round < n % rounds);
            for k in 0..daemons.len() {
                let i = (k + round) % daemons.len();
                let d = &daemons[i];
                let pid = d.daemon.child.id();
                let count = Arc::new(AtomicUsize::new(0));
                let before = cpu_ns(pid);
                let run = with_progress(
                    progress,
                    &format!("create, {}", d.name),
                    chunk,
                    count.clone(),
                    concurrent(&d.daemon.url, Some(&d.token), chunk, c, count, create_one),
                )
                .await
                .map_err(|e| format!("creating with a {}: {e}", d.name))?;
                cpu[i] += cpu_ns(pid).saturating_sub(before);
                let m = &mut modes[i];
                m.synchronous += chunk - run.ids.len();
                m.busy += run.busy;
                m.elapsed += run.elapsed;
                latencies[i].extend(run.latencies);
            }
        }
        for (i, m) in modes.iter_mut().enumerate() {
            m.create = report::PhaseFigures::of(&latencies[i], m.elapsed, 0, m.busy);
            m.cpu_us_per_create = cpu[i] as f64 / 1000.0 / n.max(1) as f64;
        }
        let cost = report::AuthCost {
            creates: n,
            warmup,
            static_token: modes[0],
            jwt: modes[1],
        };
        progress.done(&format!(
            "auth: {n} creates each; daemon CPU per create {:.0} µs with a static token, {:.0} µs with a JWT",
            cost.static_token.cpu_us_per_create, cost.jwt.cpu_us_per_create
        ));
        Ok(cost)
    })
}

/// The no-op load on another server: warmed up as taskgate's daemon was
/// (the no-op one at a time, not counted), then `n` requests on `c`
/// clients, its CPU per request read when its process is known.
async fn reference_noop(
    url: &str,
    n: usize,
    c: usize,
    pid: Option<u32>,
    progress: &Progress,
    name: &str,
) -> Result<report::Reference, Refusal> {
    noop_phase(url, SERIAL_TASKS, 1, None, progress, &format!("{name}, 1")).await?;
    let (phase, cpu) = noop_phase(url, n, c, pid, progress, name).await?;
    Ok(report::Reference {
        noop: report::PhaseFigures::of(&phase.latencies, phase.elapsed, 0, phase.busy),
        cpu_us: cpu,
    })
}

fn client_refusal(e: ClientError) -> Refusal {
    refusal(ExitClass::Io, format!("benchmark client: {e}"))
}

/// Runs `work` for every index in 0..n on `c` concurrent clients, each
/// sending `token` when given one.
async fn concurrent<F, Fut>(
    url: &str,
    token: Option<&str>,
    n: usize,
    c: usize,
    progress: Arc<AtomicUsize>,
    work: F,
) -> Result<Run, Refusal>
where
    F: Fn(Arc<Client>, usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(Vec<Duration>, Option<String>, u64), ClientError>>
        + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let work = Arc::new(work);
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..c.max(1) {
        let client = Arc::new(bench_client(url, token)?);
        let (next, work, progress) = (next.clone(), work.clone(), progress.clone());
        set.spawn(async move {
            let mut lat = Vec::new();
            let mut ids = Vec::new();
            let mut refused = 0;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let (l, id, r) = work(client.clone(), i).await?;
                lat.extend(l);
                refused += r;
                if let Some(id) = id {
                    ids.push((i, id));
                }
                progress.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, ClientError>((lat, ids, refused, client.busy_answers()))
        });
    }
    let mut run = Run {
        latencies: Vec::with_capacity(n),
        ids: Vec::with_capacity(n),
        refused: 0,
        busy: 0,
        elapsed: Duration::ZERO,
    };
    while let Some(r) = set.join_next().await {
        let (l, i, r, b) = r
            .map_err(|e| refusal(ExitClass::Io, format!("benchmark worker failed: {e}")))?
            .map_err(client_refusal)?;
        run.latencies.extend(l);
        run.ids.extend(i);
        run.refused += r;
        run.busy += b;
    }
    run.ids.sort();
    run.elapsed = start.elapsed();
    Ok(run)
}

/// Watches `what` while `fut` runs, drawing the progress bar.
async fn with_progress<T>(
    progress: &Progress,
    phase: &str,
    total: usize,
    counter: Arc<AtomicUsize>,
    fut: impl std::future::Future<Output = T>,
) -> T {
    let phase = phase.to_string();
    let tty = progress.tty;
    let stop = Arc::new(AtomicBool::new(false));
    let drawer = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let p = Progress { tty };
            while !stop.load(Ordering::Relaxed) {
                p.show(&phase, counter.load(Ordering::Relaxed), total);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let out = fut.await;
    stop.store(true, Ordering::Relaxed);
    let _ = drawer.await;
    out
}

fn base_dir(opts: &BenchOptions) -> Result<PathBuf, Refusal> {
    if let Some(d) = &opts.dir {
        return Ok(d.clone());
    }
    let config = Config::load(&Overrides {
        config_path: opts.config.clone(),
        ..Default::default()
    })?;
    // Beside the state directory: the disk that will serve.
    let parent = config
        .state_dir
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("/"));
    std::fs::create_dir_all(&parent)
        .map_err(|e| refusal(ExitClass::Io, format!("{}: {e}", parent.display())))?;
    Ok(parent)
}

fn private_dir(path: &Path) -> Result<(), Refusal> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(path)
        .map_err(|e| refusal(ExitClass::Io, format!("{}: {e}", path.display())))
}

/// Runs the whole benchmark; returns the terminal table.
pub fn run(opts: &BenchOptions) -> Result<String, Refusal> {
    if opts.tasks == 0 || opts.tasks > 1_000_000 {
        return Err(refusal(ExitClass::Usage, "--tasks must be 1..=1000000"));
    }
    if opts.concurrency == 0 {
        return Err(refusal(
            ExitClass::Usage,
            format!("--concurrency must be 1..={}", sizing::max_concurrency()),
        ));
    }
    // Refused before anything is created: a server beyond this host, and
    // a load the daemon's ranges cannot serve.
    let compare = match &opts.compare {
        Some(url) => Some(
            reference::compare_target(url, opts.compare_pid)
                .map_err(|e| refusal(ExitClass::Usage, e))?,
        ),
        None if opts.compare_pid.is_some() => {
            return Err(refusal(
                ExitClass::Usage,
                "--compare-pid needs --compare URL",
            ));
        }
        None => None,
    };
    let sizing = Sizing::for_load(opts.concurrency, opts.tasks, SERIAL_TASKS.min(opts.tasks))?;
    let base = base_dir(opts)?;
    // The pid keeps two runs started in the same second apart.
    let stamp = format!(
        "{}-{}",
        chrono::Utc::now().format("%Y%m%dT%H%M%SZ"),
        std::process::id()
    );
    let scratch = base.join(format!("taskgate-bench-{stamp}"));
    private_dir(&scratch)?;
    private_dir(&scratch.join("state"))?;
    let out = opts
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("taskgate-bench-{stamp}")));
    std::fs::create_dir_all(&out)
        .map_err(|e| refusal(ExitClass::Io, format!("{}: {e}", out.display())))?;
    let result = run_in(opts, &sizing, compare, &scratch, &out);
    if !opts.keep {
        let _ = std::fs::remove_dir_all(&scratch);
    }
    result
}

fn run_in(
    opts: &BenchOptions,
    sizing: &Sizing,
    compare: Option<reference::Compared>,
    scratch: &Path,
    out: &Path,
) -> Result<String, Refusal> {
    let progress = Progress {
        tty: std::io::IsTerminal::is_terminal(&std::io::stderr()),
    };
    let n = opts.tasks;
    let c = opts.concurrency;
    let _ = writeln!(
        std::io::stderr(),
        "taskgate bench: {n} tasks, concurrency {c}, scratch {}",
        scratch.display()
    );

    // The disk first, before anything else loads it.
    let base = baseline::measure(scratch, BASELINE_SINGLES, BASELINE_BATCHES)?;
    progress.done(&format!(
        "baseline: one-row commit p50 {:.3} ms ({:.0} commits/s); {}-row commits {:.0} rows/s",
        Summary::of(&base.single_commits).p50_ms,
        base.single_commits_per_sec(),
        baseline::BATCH_ROWS,
        base.batch_rows_per_sec()
    ));

    let config = scratch.join("bench.toml");
    std::fs::write(&config, sizing.toml())
        .map_err(|e| refusal(ExitClass::Io, format!("{}: {e}", config.display())))?;
    progress.done(&format!("daemon: {}", sizing.line()));
    let daemon = start_daemon(scratch, "", &config)?;
    let wal_path = scratch.join("state").join("tasks.db-wal");
    let peak_wal = Arc::new(AtomicU64::new(0));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (peak, on, wal) = (peak_wal.clone(), sampling.clone(), wal_path.clone());
        std::thread::spawn(move || {
            while on.load(Ordering::Relaxed) {
                if let Ok(m) = std::fs::metadata(&wal) {
                    peak.fetch_max(m.len(), Ordering::Relaxed);
                }
                std::thread::sleep(WAL_SAMPLE);
            }
        })
    };

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| refusal(ExitClass::Io, format!("runtime: {e}")))?;
    let url = daemon.url.clone();
    let daemon_pid = daemon.child.id();
    // The bare rmcp service, for the same no-op load; its absence is
    // reported, never a failed run.
    let bare = reference::bare_rmcp_path(opts.bare_rmcp.as_deref())
        .and_then(|p| reference::start_bare(&p, &scratch.join("bare_rmcp.log")));
    let phases = rt.block_on(async {
        // The floor: what a request costs that does no task work at all.
        let (noop_serial, _) =
            noop_phase(&url, SERIAL_TASKS, 1, Some(daemon_pid), &progress, "no-op, 1").await?;
        let noop_n = NOOP_REQUESTS.max(n);
        let (noop, noop_cpu_us) =
            noop_phase(&url, noop_n, c, Some(daemon_pid), &progress, "no-op").await?;
        let noop_cpu_us = noop_cpu_us.unwrap_or(0.0);
        progress.done(&format!(
            "no-op (tools/list): p50 {:.3} ms one at a time; {noop_n} at concurrency {c} at {:.0}/s, daemon CPU {noop_cpu_us:.0} µs each",
            Summary::of(&noop_serial.latencies).p50_ms,
            noop_n as f64 / noop.elapsed.as_secs_f64().max(1e-9)
        ));
        // The same load on the bare rmcp service. A failure there is its
        // figure, not the run's.
        let bare = match &bare {
            Ok(server) => reference_noop(&server.url, noop_n, c, Some(server.pid()), &progress, "bare rmcp")
                .await
                .map_err(|e| format!("the no-op load on the bare rmcp server failed: {e}")),
            Err(why) => Err(why.clone()),
        };
        progress.done(&match &bare {
            Ok(r) => format!(
                "bare rmcp (tools/list): {noop_n} at concurrency {c} at {:.0}/s, CPU {:.0} µs each",
                r.noop.per_sec,
                r.cpu_us.unwrap_or(0.0)
            ),
            Err(why) => format!("bare rmcp: not measured: {why}"),
        });
        // The same load on the server the operator named.
        let compared = match compare {
            Some(target) => {
                let r = reference_noop(&target.url, noop_n, c, target.pid, &progress, "compare")
                    .await
                    .map_err(|e| format!("the no-op load on {} failed: {e}", target.url));
                progress.done(&match &r {
                    Ok(r) => format!(
                        "compare {} (tools/list): {noop_n} at concurrency {c} at {:.0}/s{}",
                        target.url,
                        r.noop.per_sec,
                        r.cpu_us.map(|us| format!(", CPU {us:.0} µs each")).unwrap_or_default()
                    ),
                    Err(why) => format!("compare: not measured: {why}"),
                });
                Some(report::Compare { target, result: r })
            }
            None => None,
        };
        let serial = serial_phase(&url, SERIAL_TASKS.min(n), &progress).await?;
        progress.done(&format!(
            "serial: {} tasks created one after another, p50 {:.3} ms",
            serial.latencies.len(),
            Summary::of(&serial.latencies).p50_ms
        ));

        let count = Arc::new(AtomicUsize::new(0));
        let cpu_before = CpuClock::now(daemon_pid);
        let create = with_progress(
            &progress,
            "create",
            n,
            count.clone(),
            concurrent(&url, None, n, c, count, create_one),
        )
        .await?;
        let create_elapsed = create.elapsed;
        let ids = create.ids;
        let cpu_after = CpuClock::now(daemon_pid);
        let create_cpu = cpu_after.since(cpu_before, create_elapsed);
        let create_cpu_us = cpu_after.daemon_us_per_request(cpu_before, n);
        // A call the daemon could not take as a task (slots or store busy)
        // ran synchronously: correct behaviour, reported as a figure.
        let synchronous = n - ids.len();
        if ids.is_empty() {
            return Err(refusal(ExitClass::Io, "no call created a task"));
        }
        progress.done(&format!(
            "create: {n} calls in {:.2} s ({:.0}/s), {synchronous} ran synchronously",
            create_elapsed.as_secs_f64(),
            n as f64 / create_elapsed.as_secs_f64()
        ));
        let n = ids.len();

        let ids: Arc<Vec<String>> = Arc::new(ids.into_iter().map(|(_, id)| id).collect());
        let count = Arc::new(AtomicUsize::new(0));
        let all = ids.clone();
        let state = scratch.join("state");
        let counters_before = poll_counters(&state);
        let complete = with_progress(
            &progress,
            "complete",
            n,
            count.clone(),
            concurrent(&url, None, n, c, count, move |client, i| {
                let id = all[i].clone();
                async move {
                    let mut lat = Vec::new();
                    let mut refused = 0;
                    loop {
                        let t = Instant::now();
                        match client.get_task(&id).await {
                            Ok(task) => {
                                lat.push(t.elapsed());
                                match task.get("status").and_then(Value::as_str) {
                                    Some("completed") => return Ok((lat, None, refused)),
                                    Some("failed" | "cancelled") => {
                                        return Err(ClientError::Decode(format!(
                                            "task {id} ended {task}"
                                        )));
                                    }
                                    _ => {}
                                }
                            }
                            Err(ClientError::Rpc { code, .. })
                                if code == wire::POLL_TOO_SOON.code =>
                            {
                                refused += 1
                            }
                            Err(e) => return Err(e),
                        }
                        tokio::time::sleep(Duration::from_millis(BENCH_POLL_INTERVAL_MS)).await;
                    }
                }
            }),
        )
        .await?;
        progress.done(&format!(
            "complete: all {n} tasks completed ({} polls, {} refused as too soon)",
            complete.latencies.len(),
            complete.refused
        ));
        let counters_between = poll_counters(&state);
        // A client that respects pollIntervalMs: the last tasks polled to
        // completion were read just now, and polling one of them again
        // sooner would be early (and held, by design).
        tokio::time::sleep(Duration::from_millis(BENCH_POLL_INTERVAL_MS)).await;

        let polls = RETAINED_POLLS.min(n);
        let mut order: Vec<usize> = (0..n).collect();
        shuffle(&mut order);
        let order = Arc::new(order);
        let count = Arc::new(AtomicUsize::new(0));
        let all = ids.clone();
        let poll_before = CpuClock::now(daemon_pid);
        let retained = with_progress(
            &progress,
            "poll",
            polls,
            count.clone(),
            concurrent(&url, None, polls, c, count, move |client, i| {
                let id = all[order[i]].clone();
                async move {
                    let t = Instant::now();
                    client.get_task(&id).await?;
                    Ok((vec![t.elapsed()], None, 0))
                }
            }),
        )
        .await?;
        let poll_cpu_us = CpuClock::now(daemon_pid).daemon_us_per_request(poll_before, polls);
        progress.done(&format!("poll: {polls} polls with {n} tasks retained"));
        // Early polls the daemon held (or answered from memory) in each
        // poll phase, from its own counters.
        let early_polls = counters_before
            .zip(counters_between)
            .zip(poll_counters(&state))
            .map(|((before, between), after)| report::EarlyPolls {
                complete: between.since(before, complete.latencies.len() as u64 + complete.refused),
                retained: after.since(between, polls as u64),
            });
        Ok::<_, Refusal>((
            (bare, compared, early_polls),
            report::CpuPerRequest {
                noop_us: noop_cpu_us,
                create_us: create_cpu_us,
                poll_us: poll_cpu_us,
            },
            noop_serial,
            noop,
            create_cpu,
            synchronous,
            serial,
            Phase {
                latencies: create.latencies,
                elapsed: create_elapsed,
                refused: 0,
                busy: create.busy,
            },
            Phase {
                latencies: complete.latencies,
                elapsed: complete.elapsed,
                refused: complete.refused,
                busy: complete.busy,
            },
            Phase {
                latencies: retained.latencies,
                elapsed: retained.elapsed,
                refused: 0,
                busy: retained.busy,
            },
        ))
    })?;
    let rss = peak_rss_kib(daemon.child.id());
    let mut daemon = daemon;
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = daemon.child.wait();
    sampling.store(false, Ordering::Relaxed);
    let _ = sampler.join();
    let db_bytes = std::fs::metadata(scratch.join("state").join("tasks.db"))
        .map(|m| m.len())
        .unwrap_or(0);
    // With the main daemon gone: what authentication costs a create.
    let auth = auth_cost(&rt, sizing, scratch, n, c, &progress);
    if let Err(why) = &auth {
        progress.done(&format!("auth: not measured: {why}"));
    }
    // And what a durable submission to an upstream's task costs.
    let routed = routed::measure(&rt, sizing, scratch, c, &progress);
    if let Err(why) = &routed {
        progress.done(&format!("routed: not measured: {why}"));
    }

    drop(bare);
    let (
        (bare_rmcp, compare, early_polls),
        cpu_per_request,
        noop_serial,
        noop,
        create_cpu,
        synchronous,
        serial,
        create,
        complete,
        retained,
    ) = phases;
    let facts = report::HostFacts::of(scratch);
    let r = report::Report {
        tasks: n,
        concurrency: c,
        dir: scratch.to_path_buf(),
        host: facts,
        baseline: base,
        daemon_config: sizing.clone(),
        noop_serial: report::PhaseFigures::of(
            &noop_serial.latencies,
            noop_serial.elapsed,
            0,
            noop_serial.busy,
        ),
        noop: report::PhaseFigures::of(&noop.latencies, noop.elapsed, 0, noop.busy),
        cpu_per_request,
        bare_rmcp,
        compare,
        auth,
        routed,
        early_polls,
        serial: report::PhaseFigures::of(&serial.latencies, serial.elapsed, 0, serial.busy),
        create: report::PhaseFigures::of(&create.latencies, create.elapsed, 0, create.busy),
        complete: report::PhaseFigures::of(
            &complete.latencies,
            complete.elapsed,
            complete.refused,
            complete.busy,
        ),
        retained: report::PhaseFigures::of(&retained.latencies, retained.elapsed, 0, retained.busy),
        synchronous,
        create_cpu,
        peak_wal_bytes: peak_wal.load(Ordering::Relaxed),
        db_bytes,
        peak_rss_kib: rss,
        create_latencies: create.latencies,
        poll_latencies: retained.latencies,
        serial_latencies: serial.latencies,
    };
    r.write(out)?;
    Ok(r.table())
}

/// A Fisher-Yates shuffle from the OS random source.
fn shuffle(v: &mut [usize]) {
    for i in (1..v.len()).rev() {
        let mut b = [0u8; 8];
        let _ = getrandom::fill(&mut b);
        let j = (u64::from_le_bytes(b) % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
}
