//! The benchmark's outputs: the terminal table, `bench.json`, `bench.md`
//! and `latency.svg` (latency distributions a person can look at).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use crate::exit::{ExitClass, Refusal};
use crate::store::baseline::{BATCH_ROWS, Baseline};

/// Percentiles of a latency sample, in milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Summary {
    pub n: usize,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl Summary {
    pub fn of(sample: &[Duration]) -> Summary {
        if sample.is_empty() {
            return Summary::default();
        }
        let mut v: Vec<f64> = sample.iter().copied().map(ms).collect();
        v.sort_by(|a, b| a.total_cmp(b));
        // Nearest-rank percentiles.
        let pct =
            |p: f64| v[(((p / 100.0) * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Summary {
            n: v.len(),
            p50_ms: pct(50.0),
            p95_ms: pct(95.0),
            p99_ms: pct(99.0),
            max_ms: v[v.len() - 1],
            mean_ms: v.iter().sum::<f64>() / v.len() as f64,
        }
    }
}

/// One phase: its latencies, duration, rate and refusals.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct PhaseFigures {
    pub latency: Summary,
    pub elapsed_s: f64,
    pub per_sec: f64,
    /// Polls refused as too soon (`TG_TASK_POLL_TOO_SOON`).
    #[serde(rename = "refused_too_soon")]
    pub refused: u64,
    /// Busy answers (`TG_SERVER_BUSY`), each sent again after the wait it
    /// asked for; not counted in `latency`, whose samples span the retries.
    pub busy_answers: u64,
}

impl PhaseFigures {
    pub fn of(sample: &[Duration], elapsed: Duration, refused: u64, busy: u64) -> PhaseFigures {
        let s = elapsed.as_secs_f64().max(1e-9);
        PhaseFigures {
            latency: Summary::of(sample),
            elapsed_s: s,
            per_sec: sample.len() as f64 / s,
            refused,
            busy_answers: busy,
        }
    }
}

/// What the measurements ran on.
#[derive(Debug, Clone, Serialize)]
pub struct HostFacts {
    pub kernel: String,
    pub filesystem: String,
    pub cpus: usize,
    pub memory_kib: u64,
    /// Reported at the top level of bench.json, as `taskgate_version`.
    #[serde(skip)]
    pub version: &'static str,
}

impl HostFacts {
    pub fn of(dir: &Path) -> HostFacts {
        let kernel = nix::sys::utsname::uname()
            .map(|u| {
                format!(
                    "{} {} {}",
                    u.sysname().to_string_lossy(),
                    u.release().to_string_lossy(),
                    u.machine().to_string_lossy()
                )
            })
            .unwrap_or_default();
        let filesystem = nix::sys::statfs::statfs(dir)
            .map(|s| fs_name(s.filesystem_type().0 as u64))
            .unwrap_or_else(|_| "unknown".into());
        let memory_kib = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find_map(|l| l.strip_prefix("MemTotal:"))
                    .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
            })
            .unwrap_or(0);
        HostFacts {
            kernel,
            filesystem,
            cpus: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            memory_kib,
            version: env!("CARGO_PKG_VERSION"),
        }
    }
}

fn fs_name(magic: u64) -> String {
    match magic {
        0xEF53 => "ext4".into(),
        0x5846_5342 => "xfs".into(),
        0x9123_683E => "btrfs".into(),
        0x0102_1994 => "tmpfs".into(),
        0x794C_7630 => "overlayfs".into(),
        0x2FC1_2FC1 => "zfs".into(),
        0x6969 => "nfs".into(),
        other => format!("0x{other:x}"),
    }
}

pub struct Report {
    pub tasks: usize,
    pub concurrency: usize,
    pub dir: PathBuf,
    pub host: HostFacts,
    /// The benchmark daemon's configuration, sized from the load.
    pub daemon_config: super::Sizing,
    pub baseline: Baseline,
    /// The floor: no-op requests (`tools/list`) one at a time and at the
    /// run's concurrency.
    pub noop_serial: PhaseFigures,
    pub noop: PhaseFigures,
    /// The daemon's CPU per request of the no-op, create and poll phases.
    pub cpu_per_request: CpuPerRequest,
    /// The same no-op load at the run's concurrency on the bare rmcp
    /// service, or why it was not measured.
    pub bare_rmcp: Result<Reference, String>,
    /// The same load on the server named by `--compare`, if any.
    pub compare: Option<Compare>,
    /// Creations on daemons requiring a static token and a JWT, or why
    /// they were not measured.
    pub auth: Result<AuthCost, String>,
    /// Durable submissions routed to a local upstream, or why they were not
    /// measured.
    pub routed: Result<RoutedCost, String>,
    /// The daemon's early-poll counters over each poll phase; None when
    /// its status could not be read.
    pub early_polls: Option<EarlyPolls>,
    pub serial: PhaseFigures,
    pub create: PhaseFigures,
    pub complete: PhaseFigures,
    pub retained: PhaseFigures,
    /// Calls that ran synchronously because the daemon could not take them
    /// as tasks at that moment.
    pub synchronous: usize,
    /// During the create phase: host CPU busy %, daemon and client CPU %
    /// (100 = one CPU).
    pub create_cpu: (f64, f64, f64),
    pub peak_wal_bytes: u64,
    pub db_bytes: u64,
    pub peak_rss_kib: Option<u64>,
    pub create_latencies: Vec<Duration>,
    pub poll_latencies: Vec<Duration>,
    pub serial_latencies: Vec<Duration>,
}

/// The daemon's CPU per request (µs), from its process CPU clock.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct CpuPerRequest {
    pub noop_us: f64,
    pub create_us: f64,
    pub poll_us: f64,
}

/// The no-op load on another server: its figures and, when its process
/// is known, its CPU per request (µs).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Reference {
    pub noop: PhaseFigures,
    pub cpu_us: Option<f64>,
}

/// Polls of one phase and what the daemon's pacing did with them, from its
/// own counters (`taskgate status --json`).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct PollCounters {
    /// Polls the benchmark sent.
    pub polls: u64,
    /// Came before their task's next read was due and were held until it.
    pub held: u64,
    /// Came early when no place to hold them was free, and were answered
    /// with what the owner was last told.
    pub from_memory: u64,
    /// Task reads the store served.
    pub store_reads: u64,
}

impl PollCounters {
    /// The counts between `before` and `self`, for `polls` polls sent.
    pub fn since(self, before: PollCounters, polls: u64) -> PollCounters {
        PollCounters {
            polls,
            held: self.held.saturating_sub(before.held),
            from_memory: self.from_memory.saturating_sub(before.from_memory),
            store_reads: self.store_reads.saturating_sub(before.store_reads),
        }
    }

    fn early(&self) -> u64 {
        self.held + self.from_memory
    }
}

/// Early polls in the two poll phases.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct EarlyPolls {
    pub complete: PollCounters,
    pub retained: PollCounters,
}

/// Creations with a credential: the same number on each daemon.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct AuthCost {
    pub creates: usize,
    /// Creations on each daemon before the counted ones.
    pub warmup: usize,
    pub static_token: AuthMode,
    pub jwt: AuthMode,
}

/// The creations of one authenticated daemon.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct AuthMode {
    pub create: PhaseFigures,
    /// The daemon's CPU per create (µs), from its process CPU clock.
    pub cpu_us_per_create: f64,
    /// Calls that ran synchronously (no free slot or store busy).
    pub synchronous: usize,
    #[serde(skip)]
    pub elapsed: Duration,
    #[serde(skip)]
    pub busy: u64,
}

/// Durable submissions (`taskgate_submit`) to a local upstream's task.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct RoutedCost {
    /// One at a time.
    pub serial: PhaseFigures,
    /// At the run's concurrency.
    pub concurrent: PhaseFigures,
    /// Submissions of the concurrent phase.
    pub submits: usize,
    /// The routing daemon's CPU per submission of the concurrent phase (µs).
    pub cpu_us_per_submit: f64,
}

/// The routed phase in bench.json.
#[derive(Serialize)]
struct RoutedJson {
    measured: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    cost: Option<RoutedCost>,
    #[serde(skip_serializing_if = "Option::is_none")]
    submit_cpu_to_create_cpu: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    submit_cpu_to_noop_cpu: Option<f64>,
}

/// The authenticated phases in bench.json.
#[derive(Serialize)]
struct AuthJson {
    measured: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    cost: Option<AuthCost>,
    #[serde(skip_serializing_if = "Option::is_none")]
    jwt_cpu_to_static_cpu: Option<f64>,
}

impl AuthCost {
    fn jwt_to_static(&self) -> f64 {
        self.jwt.cpu_us_per_create / self.static_token.cpu_us_per_create.max(1e-9)
    }
}

/// The server named by `--compare` and what its no-op load gave.
pub struct Compare {
    pub target: super::reference::Compared,
    pub result: Result<Reference, String>,
}

/// `--compare` in bench.json: the server, how its process was found, its
/// figures and taskgate's ratios to them.
#[derive(Serialize)]
struct CompareJson {
    url: String,
    pid: Option<u32>,
    pid_found_by: String,
    #[serde(flatten)]
    figures: ReferenceJson,
}

/// A reference server in bench.json: measured, with its figures and
/// taskgate's ratios to them, or not, with the reason.
#[derive(Serialize)]
struct ReferenceJson {
    measured: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    noop: Option<PhaseFigures>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu_us_per_noop: Option<f64>,
    /// taskgate's figure over the reference's.
    #[serde(skip_serializing_if = "Option::is_none")]
    daemon_cpu_to_reference_cpu: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    noop_throughput_to_reference: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    noop_p50_to_reference: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    noop_p99_to_reference: Option<f64>,
}

impl ReferenceJson {
    fn of(r: &Result<Reference, String>, noop: &PhaseFigures, cpu_us: f64) -> ReferenceJson {
        match r {
            Ok(r) => ReferenceJson {
                measured: true,
                reason: None,
                noop: Some(r.noop),
                cpu_us_per_noop: r.cpu_us,
                daemon_cpu_to_reference_cpu: r.cpu_us.map(|c| cpu_us / c.max(1e-9)),
                noop_throughput_to_reference: Some(noop.per_sec / r.noop.per_sec.max(1e-9)),
                noop_p50_to_reference: Some(noop.latency.p50_ms / r.noop.latency.p50_ms.max(1e-9)),
                noop_p99_to_reference: Some(noop.latency.p99_ms / r.noop.latency.p99_ms.max(1e-9)),
            },
            Err(why) => ReferenceJson {
                measured: false,
                reason: Some(why.clone()),
                noop: None,
                cpu_us_per_noop: None,
                daemon_cpu_to_reference_cpu: None,
                noop_throughput_to_reference: None,
                noop_p50_to_reference: None,
                noop_p99_to_reference: None,
            },
        }
    }
}

/// A target of the capacity requirements, judged as information only;
/// `met` is null when it could not be measured (`value` says why).
#[derive(Serialize)]
struct Target {
    name: String,
    goal: String,
    value: String,
    met: Option<bool>,
}

impl Target {
    fn verdict(&self) -> &'static str {
        match self.met {
            Some(true) => "met",
            Some(false) => "not met",
            None => "not measured",
        }
    }
}

/// bench.json: every figure of a run, for machines.
#[derive(Serialize)]
struct BenchJson<'a> {
    taskgate_version: &'a str,
    generated_at: String,
    parameters: Parameters,
    /// The configuration the benchmark daemon ran with, by section.
    daemon_config: serde_json::Value,
    host: &'a HostFacts,
    baseline: BaselineJson,
    noop_serial: PhaseFigures,
    noop: PhaseFigures,
    daemon_cpu_per_request: CpuPerRequest,
    /// The no-op load on the bare rmcp service.
    bare_rmcp: ReferenceJson,
    /// The no-op load on the `--compare` server; null without one.
    compare: Option<CompareJson>,
    /// Creations with a static token and with a JWT.
    auth: AuthJson,
    /// Durable submissions to a local upstream.
    routed: RoutedJson,
    /// What the daemon's poll pacing did in each poll phase; null when its
    /// status could not be read.
    early_polls: Option<EarlyPolls>,
    serial_create: PhaseFigures,
    create: PhaseFigures,
    complete_polls: PhaseFigures,
    retained_polls: PhaseFigures,
    synchronous_fallbacks: usize,
    create_phase_cpu: CpuJson,
    peak_wal_bytes: u64,
    final_db_bytes: u64,
    daemon_peak_rss_kib: Option<u64>,
    ratios: Ratios,
    targets: Vec<Target>,
}

#[derive(Serialize)]
struct Parameters {
    tasks: usize,
    concurrency: usize,
    directory: String,
    /// How many times one request is sent again after a busy answer.
    busy_retries_per_request: u32,
}

#[derive(Serialize)]
struct BaselineJson {
    single_row: SingleRow,
    batch: Batch,
}

#[derive(Serialize)]
struct SingleRow {
    commit: Summary,
    commits_per_sec: f64,
}

#[derive(Serialize)]
struct Batch {
    rows_per_transaction: usize,
    commit: Summary,
    rows_per_sec: f64,
}

#[derive(Serialize)]
struct CpuJson {
    host_busy_percent: f64,
    daemon_percent_of_one_cpu: f64,
    client_percent_of_one_cpu: f64,
}

#[derive(Serialize)]
struct Ratios {
    serial_create_p50_to_commit_p50: f64,
    create_throughput_to_single_commit_rate: f64,
    create_throughput_to_batch_row_rate: f64,
    serial_create_p50_to_noop_plus_commit_p50: f64,
    create_throughput_to_noop_throughput: f64,
    create_cpu_to_noop_cpu: f64,
    poll_cpu_to_noop_cpu: f64,
}

/// Ratios to the floor: (create p50 / (no-op p50 + commit p50), create
/// rate / no-op rate, create CPU / no-op CPU, poll CPU / no-op CPU).
type FloorRatios = (f64, f64, f64, f64);

impl Report {
    fn single(&self) -> Summary {
        Summary::of(&self.baseline.single_commits)
    }

    fn ratios(&self) -> (f64, f64, f64) {
        let base = self.single();
        (
            self.serial.latency.p50_ms / base.p50_ms.max(1e-9),
            self.create.per_sec / self.baseline.single_commits_per_sec().max(1e-9),
            self.create.per_sec / self.baseline.batch_rows_per_sec().max(1e-9),
        )
    }

    fn floor(&self) -> FloorRatios {
        let cpu = &self.cpu_per_request;
        let noop_cpu = cpu.noop_us.max(1e-9);
        (
            self.serial.latency.p50_ms
                / (self.noop_serial.latency.p50_ms + self.single().p50_ms).max(1e-9),
            self.create.per_sec / self.noop.per_sec.max(1e-9),
            cpu.create_us / noop_cpu,
            cpu.poll_us / noop_cpu,
        )
    }

    fn targets(&self) -> Vec<Target> {
        let (lat, vs_single, vs_batch) = self.ratios();
        let (floor_lat, floor_rate, create_cpu, poll_cpu) = self.floor();
        let bare = match &self.bare_rmcp {
            Ok(Reference {
                cpu_us: Some(bare), ..
            }) => {
                let r = self.cpu_per_request.noop_us / bare.max(1e-9);
                (format!("{r:.2}×"), Some(r <= 1.2))
            }
            Ok(_) => (
                "not measured: the bare server's CPU was not read".into(),
                None,
            ),
            Err(why) => (format!("not measured: {why}"), None),
        };
        let jwt = match &self.auth {
            Ok(a) => {
                let r = a.jwt_to_static();
                (format!("{r:.2}×"), Some(r <= 1.1))
            }
            Err(why) => (format!("not measured: {why}"), None),
        };
        vec![
            Target {
                name: "daemon CPU per create, JWT vs static token".into(),
                goal: "≤ 1.1×".into(),
                value: jwt.0,
                met: jwt.1,
            },
            Target {
                name: format!(
                    "daemon CPU per no-op vs bare rmcp's (concurrency {})",
                    self.concurrency
                ),
                goal: "≤ 1.2×".into(),
                value: bare.0,
                met: bare.1,
            },
            Target {
                name: "create p50 at concurrency 1 vs no-op p50 + commit p50".into(),
                goal: "≤ 1.3×".into(),
                value: format!("{floor_lat:.2}×"),
                met: Some(floor_lat <= 1.3),
            },
            Target {
                name: format!(
                    "create throughput vs no-op throughput (concurrency {})",
                    self.concurrency
                ),
                goal: "≥ 0.6×".into(),
                value: format!("{floor_rate:.2}×"),
                met: Some(floor_rate >= 0.6),
            },
            Target {
                name: "daemon CPU per create vs per no-op".into(),
                goal: "≤ 1.5×".into(),
                value: format!("{create_cpu:.2}×"),
                met: Some(create_cpu <= 1.5),
            },
            Target {
                name: "daemon CPU per poll vs per no-op".into(),
                goal: "≤ 1.2×".into(),
                value: format!("{poll_cpu:.2}×"),
                met: Some(poll_cpu <= 1.2),
            },
            Target {
                name: "create p50 at concurrency 1 vs one-row commit p50".into(),
                goal: "≤ 1.3×".into(),
                value: format!("{lat:.2}×"),
                met: Some(lat <= 1.3),
            },
            Target {
                name: "create throughput vs one-row serial commit rate".into(),
                goal: "≥ 5×".into(),
                value: format!("{vs_single:.2}×"),
                met: Some(vs_single >= 5.0),
            },
            Target {
                name: format!("create throughput vs {BATCH_ROWS}-row transactions"),
                goal: "≥ 0.5×".into(),
                value: format!("{vs_batch:.2}×"),
                met: Some(vs_batch >= 0.5),
            },
            Target {
                name: "poll p99 with all tasks retained".into(),
                goal: "≤ 2 ms".into(),
                value: format!("{:.3} ms", self.retained.latency.p99_ms),
                met: Some(self.retained.latency.p99_ms <= 2.0),
            },
            Target {
                name: "peak WAL".into(),
                goal: "< 4 MiB".into(),
                value: format!("{:.2} MiB", self.peak_wal_bytes as f64 / 1048576.0),
                met: Some(self.peak_wal_bytes < 4 * 1024 * 1024),
            },
            match self.peak_rss_kib {
                Some(k) => Target {
                    name: "daemon peak RSS".into(),
                    goal: "< 32 MiB".into(),
                    value: format!("{:.1} MiB", k as f64 / 1024.0),
                    met: Some(k < 32 * 1024),
                },
                None => Target {
                    name: "daemon peak RSS".into(),
                    goal: "< 32 MiB".into(),
                    value: "not measured: /proc gave no VmHWM".into(),
                    met: None,
                },
            },
            match &self.early_polls {
                Some(e) => {
                    let early = e.complete.early() + e.retained.early();
                    Target {
                        name: "early polls held or answered from memory".into(),
                        goal: "0 (the client waits pollIntervalMs)".into(),
                        value: format!("{early} of {}", e.complete.polls + e.retained.polls),
                        met: Some(early == 0),
                    }
                }
                None => Target {
                    name: "early polls held or answered from memory".into(),
                    goal: "0 (the client waits pollIntervalMs)".into(),
                    value: "not measured: the daemon's status could not be read".into(),
                    met: None,
                },
            },
        ]
    }

    fn json(&self) -> BenchJson<'_> {
        let (lat, vs_single, vs_batch) = self.ratios();
        let (floor_lat, floor_rate, create_cpu, poll_cpu) = self.floor();
        BenchJson {
            taskgate_version: self.host.version,
            generated_at: chrono::Utc::now().to_rfc3339(),
            parameters: Parameters {
                tasks: self.tasks,
                concurrency: self.concurrency,
                directory: self.dir.display().to_string(),
                busy_retries_per_request: super::BENCH_BUSY_RETRIES,
            },
            daemon_config: self.daemon_config.json(),
            host: &self.host,
            baseline: BaselineJson {
                single_row: SingleRow {
                    commit: self.single(),
                    commits_per_sec: self.baseline.single_commits_per_sec(),
                },
                batch: Batch {
                    rows_per_transaction: BATCH_ROWS,
                    commit: Summary::of(&self.baseline.batch_commits),
                    rows_per_sec: self.baseline.batch_rows_per_sec(),
                },
            },
            noop_serial: self.noop_serial,
            noop: self.noop,
            daemon_cpu_per_request: self.cpu_per_request,
            bare_rmcp: ReferenceJson::of(&self.bare_rmcp, &self.noop, self.cpu_per_request.noop_us),
            compare: self.compare.as_ref().map(|c| CompareJson {
                url: c.target.url.clone(),
                pid: c.target.pid,
                pid_found_by: c.target.pid_note.clone(),
                figures: ReferenceJson::of(&c.result, &self.noop, self.cpu_per_request.noop_us),
            }),
            early_polls: self.early_polls,
            auth: match &self.auth {
                Ok(a) => AuthJson {
                    measured: true,
                    reason: None,
                    cost: Some(*a),
                    jwt_cpu_to_static_cpu: Some(a.jwt_to_static()),
                },
                Err(why) => AuthJson {
                    measured: false,
                    reason: Some(why.clone()),
                    cost: None,
                    jwt_cpu_to_static_cpu: None,
                },
            },
            routed: match &self.routed {
                Ok(r) => RoutedJson {
                    measured: true,
                    reason: None,
                    cost: Some(*r),
                    submit_cpu_to_create_cpu: Some(
                        r.cpu_us_per_submit / self.cpu_per_request.create_us.max(1e-9),
                    ),
                    submit_cpu_to_noop_cpu: Some(
                        r.cpu_us_per_submit / self.cpu_per_request.noop_us.max(1e-9),
                    ),
                },
                Err(why) => RoutedJson {
                    measured: false,
                    reason: Some(why.clone()),
                    cost: None,
                    submit_cpu_to_create_cpu: None,
                    submit_cpu_to_noop_cpu: None,
                },
            },
            serial_create: self.serial,
            create: self.create,
            complete_polls: self.complete,
            retained_polls: self.retained,
            synchronous_fallbacks: self.synchronous,
            create_phase_cpu: CpuJson {
                host_busy_percent: self.create_cpu.0,
                daemon_percent_of_one_cpu: self.create_cpu.1,
                client_percent_of_one_cpu: self.create_cpu.2,
            },
            peak_wal_bytes: self.peak_wal_bytes,
            final_db_bytes: self.db_bytes,
            daemon_peak_rss_kib: self.peak_rss_kib,
            ratios: Ratios {
                serial_create_p50_to_commit_p50: lat,
                create_throughput_to_single_commit_rate: vs_single,
                create_throughput_to_batch_row_rate: vs_batch,
                serial_create_p50_to_noop_plus_commit_p50: floor_lat,
                create_throughput_to_noop_throughput: floor_rate,
                create_cpu_to_noop_cpu: create_cpu,
                poll_cpu_to_noop_cpu: poll_cpu,
            },
            targets: self.targets(),
        }
    }

    fn rows(&self) -> Vec<[String; 7]> {
        let row = |name: &str, s: &Summary, rate: String| {
            [
                name.to_string(),
                s.n.to_string(),
                format!("{:.3}", s.p50_ms),
                format!("{:.3}", s.p95_ms),
                format!("{:.3}", s.p99_ms),
                format!("{:.3}", s.max_ms),
                rate,
            ]
        };
        let mut rows = vec![
            row(
                "baseline: 1-row commit",
                &self.single(),
                format!("{:.0} commits/s", self.baseline.single_commits_per_sec()),
            ),
            row(
                &format!("baseline: {BATCH_ROWS}-row commit"),
                &Summary::of(&self.baseline.batch_commits),
                format!("{:.0} rows/s", self.baseline.batch_rows_per_sec()),
            ),
            row(
                "no-op (tools/list), conc. 1",
                &self.noop_serial.latency,
                format!("{:.0} requests/s", self.noop_serial.per_sec),
            ),
            row(
                &format!("no-op, concurrency {}", self.concurrency),
                &self.noop.latency,
                format!("{:.0} requests/s", self.noop.per_sec),
            ),
        ];
        if let Ok(r) = &self.bare_rmcp {
            rows.push(row(
                &format!("bare rmcp no-op, conc. {}", self.concurrency),
                &r.noop.latency,
                format!("{:.0} requests/s", r.noop.per_sec),
            ));
        }
        if let Some(Compare { result: Ok(r), .. }) = &self.compare {
            rows.push(row(
                &format!("compare no-op, conc. {}", self.concurrency),
                &r.noop.latency,
                format!("{:.0} requests/s", r.noop.per_sec),
            ));
        }
        rows.extend([
            row(
                "create, concurrency 1",
                &self.serial.latency,
                format!("{:.0} tasks/s", self.serial.per_sec),
            ),
            row(
                &format!("create, concurrency {}", self.concurrency),
                &self.create.latency,
                format!("{:.0} tasks/s", self.create.per_sec),
            ),
            row(
                "poll until completed",
                &self.complete.latency,
                format!("{:.0} polls/s", self.complete.per_sec),
            ),
            row(
                &format!("poll, {} retained", self.tasks),
                &self.retained.latency,
                format!("{:.0} polls/s", self.retained.per_sec),
            ),
        ]);
        if let Ok(a) = &self.auth {
            for (name, m) in [("static token", &a.static_token), ("JWT", &a.jwt)] {
                rows.push(row(
                    &format!("create, {name}, conc. {}", self.concurrency),
                    &m.create.latency,
                    format!("{:.0} tasks/s", m.create.per_sec),
                ));
            }
        }
        if let Ok(r) = &self.routed {
            rows.push(row(
                "routed submit, one at a time",
                &r.serial.latency,
                format!("{:.0} routes/s", r.serial.per_sec),
            ));
            rows.push(row(
                &format!("routed submit, conc. {}", self.concurrency),
                &r.concurrent.latency,
                format!("{:.0} routes/s", r.concurrent.per_sec),
            ));
        }
        rows
    }

    /// The daemon's CPU per request, as one line.
    fn cpu_line(&self) -> String {
        let c = &self.cpu_per_request;
        let bare = match &self.bare_rmcp {
            Ok(Reference {
                cpu_us: Some(us), ..
            }) => format!("{us:.0} µs"),
            _ => "not measured".into(),
        };
        let auth = match &self.auth {
            Ok(a) => format!(
                "; create with a static token {:.0} µs, with a JWT {:.0} µs",
                a.static_token.cpu_us_per_create, a.jwt.cpu_us_per_create
            ),
            Err(_) => String::new(),
        };
        let routed = match &self.routed {
            Ok(r) => format!(
                "; routed submit {:.0} µs ({:.2}× a create)",
                r.cpu_us_per_submit,
                r.cpu_us_per_submit / c.create_us.max(1e-9)
            ),
            Err(_) => String::new(),
        };
        format!(
            "daemon CPU per request: no-op {:.0} µs, create {:.0} µs, poll {:.0} µs; bare rmcp per no-op {bare}{auth}{routed}",
            c.noop_us, c.create_us, c.poll_us
        )
    }

    /// taskgate's no-op figures as ratios to the `--compare` server's, as
    /// one line.
    fn compare_line(&self) -> Option<String> {
        let c = self.compare.as_ref()?;
        Some(match &c.result {
            Ok(r) => {
                let cpu = match r.cpu_us {
                    Some(us) => format!(
                        "; daemon CPU per no-op {:.2}× its {us:.0} µs ({})",
                        self.cpu_per_request.noop_us / us.max(1e-9),
                        c.target.pid_note
                    ),
                    None => format!("; its CPU not measured: {}", c.target.pid_note),
                };
                format!(
                    "compared with {} (no-op at concurrency {}): taskgate's throughput {:.2}×, p50 {:.2}×, p99 {:.2}× its{cpu}",
                    c.target.url,
                    self.concurrency,
                    self.noop.per_sec / r.noop.per_sec.max(1e-9),
                    self.noop.latency.p50_ms / r.noop.latency.p50_ms.max(1e-9),
                    self.noop.latency.p99_ms / r.noop.latency.p99_ms.max(1e-9),
                )
            }
            Err(why) => format!("compared with {}: not measured: {why}", c.target.url),
        })
    }

    /// What the daemon's poll pacing did, as one line.
    fn early_polls_line(&self) -> String {
        match &self.early_polls {
            Some(e) => {
                let phase = |name: &str, p: &PollCounters| {
                    format!(
                        "{name} {} held, {} answered from memory, {} store reads for {} polls",
                        p.held, p.from_memory, p.store_reads, p.polls
                    )
                };
                format!(
                    "early polls (before pollIntervalMs; held by design): {}; {}",
                    phase("complete", &e.complete),
                    phase("retained", &e.retained)
                )
            }
            None => "early polls: not measured (the daemon's status could not be read)".into(),
        }
    }

    /// Busy answers per phase, as one line.
    fn busy_line(&self) -> String {
        format!(
            "busy answers (TG_SERVER_BUSY, each retried after the wait it asked for, at most {} times): \
             serial {}, create {}, complete {}, poll {}",
            super::BENCH_BUSY_RETRIES,
            self.serial.busy_answers,
            self.create.busy_answers,
            self.complete.busy_answers,
            self.retained.busy_answers
        )
    }

    /// The table printed on the terminal.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<32} {:>7} {:>9} {:>9} {:>9} {:>9}  rate",
            "latency (ms)", "n", "p50", "p95", "p99", "max"
        );
        for r in self.rows() {
            let _ = writeln!(
                s,
                "{:<32} {:>7} {:>9} {:>9} {:>9} {:>9}  {}",
                r[0], r[1], r[2], r[3], r[4], r[5], r[6]
            );
        }
        if self.synchronous > 0 {
            let _ = writeln!(
                s,
                "{} calls ran synchronously (no free slot or store busy at that moment)",
                self.synchronous
            );
        }
        let _ = writeln!(s, "{}", self.busy_line());
        let _ = writeln!(s, "{}", self.early_polls_line());
        let _ = writeln!(
            s,
            "create phase CPU: host {:.0}% busy; daemon {:.0}%, bench client {:.0}% of one CPU ({} CPUs)",
            self.create_cpu.0, self.create_cpu.1, self.create_cpu.2, self.host.cpus
        );
        let _ = writeln!(s, "{}", self.cpu_line());
        if let Some(line) = self.compare_line() {
            let _ = writeln!(s, "{line}");
        }
        let _ = writeln!(
            s,
            "peak WAL {:.2} MiB, final database {:.2} MiB, daemon peak RSS {}",
            self.peak_wal_bytes as f64 / 1048576.0,
            self.db_bytes as f64 / 1048576.0,
            self.peak_rss_kib
                .map(|k| format!("{:.1} MiB", k as f64 / 1024.0))
                .unwrap_or_else(|| "unknown".into())
        );
        for t in self.targets() {
            let _ = writeln!(
                s,
                "{:<12} {:<56} {:>10} (target {})",
                t.verdict(),
                t.name,
                t.value,
                t.goal
            );
        }
        s
    }

    fn markdown(&self) -> String {
        let mut s = String::new();
        let h = &self.host;
        let _ = writeln!(s, "# taskgate bench\n");
        let _ = writeln!(
            s,
            "taskgate {}, {} tasks at concurrency {}, on `{}` ({}); {}, {} CPUs, {:.1} GiB RAM.\n",
            h.version,
            self.tasks,
            self.concurrency,
            self.dir.display(),
            h.filesystem,
            h.kernel,
            h.cpus,
            h.memory_kib as f64 / 1048576.0
        );
        let _ = writeln!(
            s,
            "The baseline rows are raw SQLite commits on the same directory with taskgate's pragmas \
             (WAL, synchronous=FULL, 4 KiB pages); read taskgate's rows as ratios to them: on a shared \
             host absolute times alone vary several-fold between runs.\n"
        );
        let _ = writeln!(
            s,
            "The benchmark daemon was configured for this load: {}.\n",
            self.daemon_config.line()
        );
        let _ = writeln!(s, "| latency (ms) | n | p50 | p95 | p99 | max | rate |");
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---|");
        for r in self.rows() {
            let _ = writeln!(s, "| {} |", r.join(" | "));
        }
        let _ = writeln!(
            s,
            "\nPeak WAL {:.2} MiB (sampled every 10 ms); final database {:.2} MiB; daemon peak RSS {}.\n",
            self.peak_wal_bytes as f64 / 1048576.0,
            self.db_bytes as f64 / 1048576.0,
            self.peak_rss_kib
                .map(|k| format!("{:.1} MiB", k as f64 / 1024.0))
                .unwrap_or_else(|| "unknown".into())
        );
        let _ = writeln!(
            s,
            "During the create phase the host's CPUs were {:.0}% busy: the daemon used {:.0}% and the \
             benchmark client {:.0}% of one CPU ({} CPUs). Near 100% busy, the figures measure the CPU, \
             not the disk.\n",
            self.create_cpu.0, self.create_cpu.1, self.create_cpu.2, self.host.cpus
        );
        let _ = writeln!(
            s,
            "The no-op rows are the floor: `tools/list`, which touches no task, on the same clients. \
             {}; the targets below read create and poll as ratios to it.\n",
            upper_first(&self.cpu_line())
        );
        let _ = writeln!(
            s,
            "{}\n",
            match &self.bare_rmcp {
                Ok(_) => "The bare rmcp row is the same no-op load, in the same run, on rmcp's \
                          `StreamableHttpService` serving one no-op tool and nothing else \
                          (`examples/bare_rmcp.rs`: stateless, JSON answers, no authentication, \
                          no bounds, no store): what taskgate's own layers cost beyond it."
                    .to_string(),
                Err(why) => format!("The bare rmcp service was not measured: {why}."),
            }
        );
        let _ = writeln!(
            s,
            "{}\n",
            match &self.auth {
                Ok(a) => format!(
                    "The authenticated create rows come from two more daemons configured as the first \
                     plus `[auth]` with `local_owner = \"never\"`: one requiring a static token, one \
                     a JWT (EdDSA, a key generated for the run, its public half in a JWKS file); {} \
                     creations each, in {} rounds taking turns, after {} not counted. Every request carries the same \
                     credential, as a client reusing its access token does.",
                    a.creates,
                    super::AUTH_ROUNDS.min(a.creates).max(1),
                    a.warmup
                ),
                Err(why) => format!("The authenticated creates were not measured: {why}."),
            }
        );
        let _ = writeln!(
            s,
            "{}\n",
            match &self.routed {
                Ok(r) => format!(
                    "The routed submit rows come from one more daemon configured as the first plus \
                     one `[[upstream]]`: this binary serving the benchmark's no-op tool over stdio, \
                     confined as any stdio upstream, its tool pinned and leased once. Each \
                     `taskgate_submit` carries a new idempotency key and commits its route three \
                     times (prepared, dispatching, routed) around the upstream's own task creation; \
                     {} one at a time, then {} at concurrency {}. The CPU is the routing daemon's \
                     alone (the upstream is another process).",
                    super::routed::SERIAL_SUBMITS,
                    r.submits,
                    self.concurrency
                ),
                Err(why) => format!("The routed submissions were not measured: {why}."),
            }
        );
        if let Some(line) = self.compare_line() {
            let _ = writeln!(
                s,
                "{}; the same requests (`tools/list` of protocol 2026-07-28, no session) at the \
                 same concurrency, in the same run.\n",
                upper_first(&line)
            );
        }
        let _ = writeln!(s, "{}.\n", upper_first(&self.busy_line()));
        let _ = writeln!(
            s,
            "{}. The benchmark's client waits the advertised pollIntervalMs between polls of a \
             task, so none should be early; the daemon holds a poll that comes sooner until the \
             task's read is due (or, with every place to hold one taken, answers it with what \
             the owner was last told), by design.\n",
            upper_first(&self.early_polls_line())
        );
        let _ = writeln!(s, "| target | goal | measured | |\n|---|---|---|---|");
        for t in self.targets() {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} |",
                t.name,
                t.goal,
                t.value,
                t.verdict()
            );
        }
        let _ = writeln!(s, "\n![latency distribution](latency.svg)");
        s
    }

    /// Cumulative distributions of create and poll latency, log-scale.
    fn svg(&self) -> String {
        let (w, h) = (720.0, 420.0);
        let (left, right, top, bottom) = (70.0, 20.0, 40.0, 60.0);
        let all: Vec<f64> = self
            .create_latencies
            .iter()
            .chain(&self.poll_latencies)
            .chain(&self.serial_latencies)
            .map(|d| ms(*d))
            .filter(|v| *v > 0.0)
            .collect();
        let lo = all.iter().copied().fold(f64::MAX, f64::min).max(1e-3);
        let hi = all.iter().copied().fold(0.0, f64::max).max(lo * 10.0);
        let (lmin, lmax) = (lo.log10().floor(), hi.log10().ceil());
        let x = |v: f64| left + (v.max(lo).log10() - lmin) / (lmax - lmin) * (w - left - right);
        let y = |p: f64| top + (1.0 - p) * (h - top - bottom);
        let mut s = format!(
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{tx}" y="22" font-size="15" text-anchor="middle">taskgate bench: latency distribution ({n} tasks, concurrency {c})</text>
"#,
            tx = w / 2.0,
            n = self.tasks,
            c = self.concurrency
        );
        // Grid and axes.
        let mut d = lmin;
        while d <= lmax {
            let v = 10f64.powf(d);
            let gx = x(v);
            let _ = writeln!(
                s,
                r##"<line x1="{gx:.1}" y1="{top}" x2="{gx:.1}" y2="{yb}" stroke="#ddd"/><text x="{gx:.1}" y="{ty}" text-anchor="middle">{v}</text>"##,
                yb = h - bottom,
                ty = h - bottom + 16.0,
                v = if v < 1.0 {
                    format!("{v}")
                } else {
                    format!("{v:.0}")
                }
            );
            d += 1.0;
        }
        for p in [0.0, 0.25, 0.5, 0.75, 0.9, 1.0] {
            let gy = y(p);
            let _ = writeln!(
                s,
                r##"<line x1="{left}" y1="{gy:.1}" x2="{xr}" y2="{gy:.1}" stroke="#eee"/><text x="{tx}" y="{ty:.1}" text-anchor="end">{p}</text>"##,
                xr = w - right,
                tx = left - 6.0,
                ty = gy + 4.0
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{tx}" y="{ty}" text-anchor="middle">latency (ms, log scale)</text><text x="16" y="{my}" transform="rotate(-90 16 {my})" text-anchor="middle">fraction of requests at or below</text>"#,
            tx = (left + w - right) / 2.0,
            ty = h - 18.0,
            my = (top + h - bottom) / 2.0
        );
        // The disk's own one-row commit, for reference.
        let commit = self.single().p50_ms;
        if commit > 0.0 {
            let cx = x(commit);
            let _ = writeln!(
                s,
                r##"<line x1="{cx:.1}" y1="{top}" x2="{cx:.1}" y2="{yb}" stroke="#555" stroke-dasharray="4 3"/><text x="{tx:.1}" y="{ty}" fill="#555">raw commit p50</text>"##,
                yb = h - bottom,
                tx = cx + 4.0,
                ty = h - bottom - 6.0
            );
        }
        let series: [(&str, &str, &[Duration]); 3] = [
            (
                "#1f77b4",
                &format!("create (concurrency {})", self.concurrency),
                &self.create_latencies,
            ),
            ("#d62728", "poll (all retained)", &self.poll_latencies),
            ("#2ca02c", "create (concurrency 1)", &self.serial_latencies),
        ];
        for (i, (color, label, sample)) in series.iter().enumerate() {
            let mut v: Vec<f64> = sample.iter().map(|d| ms(*d)).collect();
            v.sort_by(|a, b| a.total_cmp(b));
            if v.is_empty() {
                continue;
            }
            let step = (v.len() / 400).max(1);
            let mut pts = String::new();
            for (k, val) in v.iter().enumerate().step_by(step) {
                let _ = write!(
                    pts,
                    "{:.1},{:.1} ",
                    x(*val),
                    y((k + 1) as f64 / v.len() as f64)
                );
            }
            let _ = write!(pts, "{:.1},{:.1}", x(v[v.len() - 1]), y(1.0));
            let _ = writeln!(
                s,
                r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{pts}"/>"#
            );
            // The legend sits bottom right: slow and rare, where the
            // cumulative curves are not.
            let ly = h - bottom - 60.0 + i as f64 * 16.0;
            let left = w - right - 230.0;
            let _ = writeln!(
                s,
                r#"<line x1="{lx}" y1="{ly}" x2="{lx2}" y2="{ly}" stroke="{color}" stroke-width="3"/><text x="{tx}" y="{ty}">{label}</text>"#,
                lx = left + 12.0,
                lx2 = left + 36.0,
                tx = left + 42.0,
                ty = ly + 4.0
            );
        }
        let _ = writeln!(
            s,
            r#"<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="black"/></svg>"#,
            pw = w - left - right,
            ph = h - top - bottom
        );
        s
    }

    pub fn write(&self, out: &Path) -> Result<(), Refusal> {
        let io = |p: &Path, e: std::io::Error| {
            Refusal::new(ExitClass::Io, format!("{}: {e}", p.display()))
        };
        let json = serde_json::to_string_pretty(&self.json())
            .map_err(|e| Refusal::new(ExitClass::Io, format!("cannot encode bench.json: {e}")))?;
        let files = [
            ("bench.json", json),
            ("bench.md", self.markdown()),
            ("latency.svg", self.svg()),
        ];
        for (name, text) in files {
            let p = out.join(name);
            std::fs::write(&p, text).map_err(|e| io(&p, e))?;
        }
        Ok(())
    }
}

fn upper_first(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        let s = Summary::of(&v);
        assert_eq!(s.p50_ms, 50.0);
        assert_eq!(s.p99_ms, 99.0);
        assert_eq!(s.max_ms, 100.0);
        assert_eq!(Summary::of(&[]).n, 0);
    }
}
