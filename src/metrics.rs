//! What `/metrics` shows, in the OpenMetrics text format (through the
//! Prometheus project's `prometheus-client`). A foundation module: every
//! layer that sees an event worth counting (the store's group commit, the
//! authentication middleware, the protocol handler) counts it here, and the
//! HTTP layer renders the counts together with the values read at the
//! moment of the scrape (tasks by status, queue depth, WAL size, process
//! figures), which it gathers into a [`Snapshot`].
//!
//! Rules: a label value is always one of a fixed set (a registered error
//! name, a method, a status, a reason) or a name the operator configured (a
//! tool, an upstream), and even those are capped at [`MAX_NAMED_SERIES`]
//! per family; never a task ID, an owner, a token or an argument. Counting
//! is an atomic add: nothing here blocks or allocates on a request's path
//! after a series exists.
//!
//! Owns what `/metrics` counts. The process-wide counters and histograms
//! (`metrics::get()`), counted where the event happens: the protocol handler
//! times every MCP request (`mcp_server_operation_duration_seconds` by method,
//! tool and error type, the OpenTelemetry MCP names), `mcp::convert` and
//! `http::respond` count every error body by its registered name, the task
//! service counts creations, tool results (`isError` apart from successes and
//! failures) and held polls, the store thread each group commit's rows and
//! latency and each checkpoint, `http::auth` refusals by reason, the approval
//! gate each journal event, `upstream` each session's state and errors.
//! `Metrics::render` adds what only a scrape reads (a `Snapshot` the HTTP layer
//! gathers: tasks by status, queue, WAL, running tools, fallbacks, legacy
//! sessions, approvals waiting and the oldest's age, routes by phase) and the
//! `process_*` figures from `/proc/self`; `classic_text` turns the OpenMetrics
//! text into Prometheus' 0.0.4 format for scrapers that do not ask for
//! OpenMetrics. Rules: a label value is a fixed word, a registered error name
//! or an operator-configured name (at most `MAX_NAMED_SERIES` per family, later
//! ones `other`), never a task ID, owner, token or argument; a tool name nobody
//! configured is `other`. Knows no other module: callers hand it `&'static
//! str`s.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

use prometheus_client::encoding::{EncodeLabelSet, text};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

/// Distinct tool or upstream names one family keeps as label values; later
/// names are counted under `other`.
pub const MAX_NAMED_SERIES: usize = 256;

/// The label value for a name past [`MAX_NAMED_SERIES`], or one that is
/// not configured.
pub const OTHER: &str = "other";

/// Latency buckets from 100 µs (a poll answered from memory) to five
/// minutes (a long synchronous tool).
const SECONDS_BUCKETS: [f64; 19] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Rows per group commit: one to the store's largest batch.
const BATCH_BUCKETS: [f64; 9] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    mcp_method_name: &'static str,
    gen_ai_tool_name: String,
    error_type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpLabels {
    method: &'static str,
    path: &'static str,
    code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabels {
    code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabels {
    event: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamLabels {
    upstream: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabels {
    status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: &'static str,
}

/// How a tool run ended, as `taskgate_tool_results_total` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolResult {
    /// A result without `isError`.
    Success,
    /// A result the tool marked `isError: true`.
    ToolError,
    /// No result: the run failed (start, limit, timeout, signal, I/O).
    Failed,
    Cancelled,
}

impl ToolResult {
    fn as_str(self) -> &'static str {
        match self {
            ToolResult::Success => "success",
            ToolResult::ToolError => "tool_error",
            ToolResult::Failed => "failed",
            ToolResult::Cancelled => "cancelled",
        }
    }
}

/// Names admitted as label values, at most [`MAX_NAMED_SERIES`].
#[derive(Default)]
struct Names(Mutex<HashSet<String>>);

impl Names {
    fn admit(&self, name: &str) -> String {
        let mut names = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if names.contains(name) {
            return name.to_string();
        }
        if names.len() < MAX_NAMED_SERIES {
            names.insert(name.to_string());
            return name.to_string();
        }
        OTHER.to_string()
    }
}

/// The process-wide counters.
pub struct Metrics {
    registry: Registry,
    operations: Family<OperationLabels, Histogram>,
    operation_tools: Names,
    http_requests: Family<HttpLabels, Counter>,
    errors: Family<CodeLabels, Counter>,
    tasks_created: Counter,
    tool_results: Family<ResultLabels, Counter>,
    commit_rows: Histogram,
    commit_seconds: Histogram,
    checkpoint_seconds: Histogram,
    auth_failures: Family<ReasonLabels, Counter>,
    approval_events: Family<EventLabels, Counter>,
    upstream_up: Family<UpstreamLabels, Gauge>,
    upstream_errors: Family<UpstreamLabels, Counter>,
    upstream_names: Names,
}

fn seconds_histogram() -> Histogram {
    Histogram::new(SECONDS_BUCKETS)
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::default();
        registry.register(
            "taskgate_build",
            "The running build: its version",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        let operations = Family::<OperationLabels, Histogram>::new_with_constructor(
            seconds_histogram as fn() -> Histogram,
        );
        registry.register_with_unit(
            "mcp_server_operation_duration",
            "MCP requests served, by method, tool and error type (OpenTelemetry MCP conventions)",
            Unit::Seconds,
            operations.clone(),
        );
        let http_requests = Family::<HttpLabels, Counter>::default();
        registry.register(
            "taskgate_http_requests",
            "HTTP requests answered, by method, path and status code",
            http_requests.clone(),
        );
        let errors = Family::<CodeLabels, Counter>::default();
        registry.register(
            "taskgate_errors",
            "Refusals and errors sent, by registered error name (JSON-RPC errors and HTTP refusal bodies)",
            errors.clone(),
        );
        let tasks_created = Counter::default();
        registry.register(
            "taskgate_tasks_created",
            "Tasks committed to the store (a retried creation that returned an existing task is not one)",
            tasks_created.clone(),
        );
        let tool_results = Family::<ResultLabels, Counter>::default();
        registry.register(
            "taskgate_tool_results",
            "Tool runs ended, background and synchronous: success, tool_error (isError), failed, cancelled",
            tool_results.clone(),
        );
        let commit_rows = Histogram::new(BATCH_BUCKETS);
        registry.register(
            "taskgate_store_commit_batch_rows",
            "Writes per group commit",
            commit_rows.clone(),
        );
        let commit_seconds = seconds_histogram();
        registry.register_with_unit(
            "taskgate_store_commit_duration",
            "Time from BEGIN to COMMIT of one group commit, fsync included",
            Unit::Seconds,
            commit_seconds.clone(),
        );
        let checkpoint_seconds = seconds_histogram();
        registry.register_with_unit(
            "taskgate_store_checkpoint_duration",
            "Time of one TRUNCATE checkpoint of the WAL",
            Unit::Seconds,
            checkpoint_seconds.clone(),
        );
        let auth_failures = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "taskgate_auth_failures",
            "Requests refused by authentication, by reason",
            auth_failures.clone(),
        );
        let approval_events = Family::<EventLabels, Counter>::default();
        registry.register(
            "taskgate_approval_events",
            "Approval journal events: proposed, approved, rejected, expired, consumed, cancelled",
            approval_events.clone(),
        );
        let upstream_up = Family::<UpstreamLabels, Gauge>::default();
        registry.register(
            "taskgate_upstream_up",
            "1 when the upstream MCP server's session is ready, else 0",
            upstream_up.clone(),
        );
        let upstream_errors = Family::<UpstreamLabels, Counter>::default();
        registry.register(
            "taskgate_upstream_errors",
            "Upstream sessions that failed or were lost",
            upstream_errors.clone(),
        );
        Metrics {
            registry,
            operations,
            operation_tools: Names::default(),
            http_requests,
            errors,
            tasks_created,
            tool_results,
            commit_rows,
            commit_seconds,
            checkpoint_seconds,
            auth_failures,
            approval_events,
            upstream_up,
            upstream_errors,
            upstream_names: Names::default(),
        }
    }

    /// One MCP request served. `method` is one of the protocol's method
    /// names (anything else is `other`); `tool` the called tool's name for
    /// `tools/call` when it exists; `error_type` a registered error name,
    /// `tool_error`, or empty on success.
    pub fn operation(&self, method: &str, tool: Option<&str>, error_type: &'static str, secs: f64) {
        let labels = OperationLabels {
            mcp_method_name: known_method(method),
            gen_ai_tool_name: tool
                .map(|t| self.operation_tools.admit(t))
                .unwrap_or_default(),
            error_type,
        };
        self.operations.get_or_create(&labels).observe(secs);
    }

    /// One HTTP response; `path` is what [`path_class`] made of its path.
    pub fn http_request(&self, method: &str, path: &'static str, code: u16) {
        let method = match method {
            "GET" => "GET",
            "POST" => "POST",
            "DELETE" => "DELETE",
            "HEAD" => "HEAD",
            "OPTIONS" => "OPTIONS",
            "PUT" => "PUT",
            _ => OTHER,
        };
        self.http_requests
            .get_or_create(&HttpLabels { method, path, code })
            .inc();
    }

    /// An error or refusal sent, by its registered name.
    pub fn error(&self, name: &'static str) {
        self.errors.get_or_create(&CodeLabels { code: name }).inc();
    }

    pub fn task_created(&self) {
        self.tasks_created.inc();
    }

    pub fn tool_result(&self, result: ToolResult) {
        self.tool_results
            .get_or_create(&ResultLabels {
                result: result.as_str(),
            })
            .inc();
    }

    /// One group commit of `rows` writes that took `secs`.
    pub fn commit(&self, rows: usize, secs: f64) {
        self.commit_rows.observe(rows as f64);
        self.commit_seconds.observe(secs);
    }

    pub fn checkpoint(&self, secs: f64) {
        self.checkpoint_seconds.observe(secs);
    }

    /// A request refused by authentication; `reason` is a fixed text.
    pub fn auth_failure(&self, reason: &'static str) {
        self.auth_failures
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// An approval journal event, by its kind.
    pub fn approval_event(&self, event: &'static str) {
        self.approval_events
            .get_or_create(&EventLabels { event })
            .inc();
    }

    /// Where an upstream stands: ready or not.
    pub fn upstream_state(&self, alias: &str, ready: bool) {
        let upstream = self.upstream_names.admit(alias);
        self.upstream_up
            .get_or_create(&UpstreamLabels { upstream })
            .set(i64::from(ready));
    }

    /// An upstream session failed or was lost.
    pub fn upstream_error(&self, alias: &str) {
        let upstream = self.upstream_names.admit(alias);
        self.upstream_errors
            .get_or_create(&UpstreamLabels { upstream })
            .inc();
    }

    /// The whole exposition: the counters, then `snapshot`, then the
    /// process's own figures, then `# EOF`.
    pub fn render(&self, snapshot: Snapshot) -> String {
        let mut out = String::with_capacity(16 * 1024);
        let mut scrape = Registry::default();
        snapshot.register(&mut scrape);
        process::register(&mut scrape);
        // Writing into a String cannot fail; an error would be a bug in the
        // encoder, and then the text simply ends early.
        let _ = text::encode_registry(&mut out, &self.registry);
        let _ = text::encode_registry(&mut out, &scrape);
        let _ = text::encode_eof(&mut out);
        out
    }
}

/// The label an HTTP path is counted under: one of a fixed few.
pub fn path_class(path: &str) -> &'static str {
    match path {
        "/mcp" => "/mcp",
        "/metrics" => "/metrics",
        "/healthz" => "/healthz",
        "/readyz" => "/readyz",
        p if p.starts_with("/admin/") => "/admin",
        p if p.starts_with("/.well-known/") => "/.well-known",
        _ => OTHER,
    }
}

/// The content type of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The content type of [`classic_text`]'s.
pub const CLASSIC_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The same exposition in Prometheus' classic text format (0.0.4), for a
/// scraper that does not ask for OpenMetrics (`promtool check metrics`,
/// older agents, a person with curl): no `# EOF` or `# UNIT` lines, a
/// counter's family named with its `_total` suffix, an info metric as a
/// gauge.
pub fn classic_text(openmetrics: &str) -> String {
    // A family's HELP comes before its TYPE: read every TYPE first.
    let kinds: std::collections::HashMap<&str, &str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.split_once(' '))
        .collect();
    let renamed = |name: &str| match kinds.get(name).copied() {
        Some("counter") => (format!("{name}_total"), "counter"),
        Some("info") => (format!("{name}_info"), "gauge"),
        Some(kind) => (name.to_string(), kind),
        None => (name.to_string(), "untyped"),
    };
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let name = rest.split_once(' ').map_or(rest, |(n, _)| n);
            let (name, kind) = renamed(name);
            out.push_str(&format!("# TYPE {name} {kind}\n"));
        } else if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            out.push_str(&format!("# HELP {} {help}\n", renamed(name).0));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

fn known_method(method: &str) -> &'static str {
    const METHODS: [&str; 12] = [
        "initialize",
        "ping",
        "server/discover",
        "tools/list",
        "tools/call",
        "tasks/get",
        "tasks/cancel",
        "tasks/update",
        "tasks/list",
        "tasks/result",
        "resources/list",
        "prompts/list",
    ];
    METHODS.into_iter().find(|m| *m == method).unwrap_or(OTHER)
}

/// The process's counters, created on first use.
pub fn get() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

/// Values read at the moment of a scrape.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Unexpired tasks by status; `None` when the store could not count
    /// them (disabled, or its queue full).
    pub tasks_by_status: Option<Vec<(&'static str, u64)>>,
    /// Rows retained, expired ones not yet swept included.
    pub tasks_retained: Option<u64>,
    pub store_disabled: bool,
    pub queue_depth: u64,
    pub queue_capacity: u64,
    pub wal_bytes: u64,
    pub task_reads: u64,
    /// Early polls held until due, and those answered from memory.
    pub polls_held: u64,
    pub polls_answered_from_memory: u64,
    pub tools_running: u64,
    pub runs_started: u64,
    /// Synchronous fallbacks by reason.
    pub fallbacks: Vec<(&'static str, u64)>,
    /// Open legacy sessions (HTTP only).
    pub legacy_sessions: Option<u64>,
    /// Proposals waiting and the age of the oldest, when approvals are on.
    pub approvals: Option<ApprovalsSnapshot>,
    /// Unexpired routes by phase; `None` when not counted.
    pub routes_by_phase: Option<Vec<(&'static str, u64)>>,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct ApprovalsSnapshot {
    pub pending: u64,
    pub oldest_pending_secs: f64,
    pub disabled: bool,
}

fn gauge(registry: &mut Registry, name: &str, help: &str, value: i64) {
    let g = Gauge::<i64>::default();
    g.set(value);
    registry.register(name, help, g);
}

fn counter(registry: &mut Registry, name: &str, help: &str, value: u64) {
    let c = Counter::<u64>::default();
    c.inc_by(value);
    registry.register(name, help, c);
}

fn labelled_gauge<L>(registry: &mut Registry, name: &str, help: &str, values: Vec<(L, u64)>)
where
    L: Clone + std::fmt::Debug + std::hash::Hash + Eq + EncodeLabelSet + Send + Sync + 'static,
{
    let family = Family::<L, Gauge>::default();
    for (labels, v) in values {
        family.get_or_create(&labels).set(v as i64);
    }
    registry.register(name, help, family);
}

impl Snapshot {
    fn register(self, r: &mut Registry) {
        if let Some(by_status) = self.tasks_by_status {
            labelled_gauge(
                r,
                "taskgate_tasks",
                "Unexpired tasks in the store, by status",
                by_status
                    .into_iter()
                    .map(|(status, n)| (StatusLabels { status }, n))
                    .collect(),
            );
        }
        if let Some(n) = self.tasks_retained {
            gauge(
                r,
                "taskgate_tasks_retained",
                "Task rows in the store, expired ones not yet swept included",
                n as i64,
            );
        }
        gauge(
            r,
            "taskgate_store_disabled",
            "1 when the task store latched disabled after a disk error (until a restart)",
            i64::from(self.store_disabled),
        );
        gauge(
            r,
            "taskgate_store_queue_depth",
            "Commands waiting for the store thread",
            self.queue_depth as i64,
        );
        gauge(
            r,
            "taskgate_store_queue_capacity",
            "The store queue's bound (store.queue_depth)",
            self.queue_capacity as i64,
        );
        let wal = Gauge::<i64>::default();
        wal.set(self.wal_bytes as i64);
        r.register_with_unit(
            "taskgate_store_wal",
            "Size of the task store's write-ahead log",
            Unit::Bytes,
            wal,
        );
        counter(
            r,
            "taskgate_store_task_reads",
            "Task reads that reached the store (held or remembered polls are not)",
            self.task_reads,
        );
        counter(
            r,
            "taskgate_polls_held",
            "Polls that came before their task's pollIntervalMs and were held until due",
            self.polls_held,
        );
        counter(
            r,
            "taskgate_polls_answered_from_memory",
            "Early polls answered with the record last told, without a store read",
            self.polls_answered_from_memory,
        );
        gauge(
            r,
            "taskgate_tools_running",
            "Tool runs holding a running slot",
            self.tools_running as i64,
        );
        counter(
            r,
            "taskgate_tool_runs_started",
            "Tool runs started, background and synchronous",
            self.runs_started,
        );
        let fallbacks = Family::<ReasonLabels, Counter>::default();
        for (reason, n) in self.fallbacks {
            fallbacks.get_or_create(&ReasonLabels { reason }).inc_by(n);
        }
        r.register(
            "taskgate_sync_fallbacks",
            "Calls of optional-task tools run synchronously because no task could be created, by reason",
            fallbacks,
        );
        if let Some(n) = self.legacy_sessions {
            gauge(
                r,
                "taskgate_legacy_sessions",
                "Open sessions of the 2025 protocol (HTTP)",
                n as i64,
            );
        }
        if let Some(a) = self.approvals {
            gauge(
                r,
                "taskgate_approvals_pending",
                "Proposals waiting for an administrator's decision",
                a.pending as i64,
            );
            let oldest = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
            oldest.set(a.oldest_pending_secs);
            r.register_with_unit(
                "taskgate_approvals_oldest_pending_age",
                "How long the oldest waiting proposal has waited (0 when none waits)",
                Unit::Seconds,
                oldest,
            );
            gauge(
                r,
                "taskgate_approvals_disabled",
                "1 when the approval journal could not be opened or is damaged",
                i64::from(a.disabled),
            );
        }
        if let Some(by_phase) = self.routes_by_phase {
            labelled_gauge(
                r,
                "taskgate_routes",
                "Unexpired durable routes to upstream servers, by phase",
                by_phase
                    .into_iter()
                    .map(|(phase, n)| (PhaseLabels { phase }, n))
                    .collect(),
            );
        }
    }
}

/// The `process_*` figures Prometheus' client libraries export, read from
/// `/proc/self`.
mod process {
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::gauge::Gauge;
    use prometheus_client::registry::{Registry, Unit};

    struct Stat {
        cpu_secs: f64,
        start_secs: f64,
        virtual_bytes: u64,
        resident_bytes: u64,
    }

    fn ticks_per_second() -> f64 {
        // SAFETY: sysconf only reads a system constant.
        let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        if t > 0 { t as f64 } else { 100.0 }
    }

    fn page_bytes() -> u64 {
        // SAFETY: as above.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if p > 0 { p as u64 } else { 4096 }
    }

    fn boot_secs() -> Option<f64> {
        let text = std::fs::read_to_string("/proc/stat").ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix("btime "))
            .and_then(|v| v.trim().parse().ok())
    }

    fn stat() -> Option<Stat> {
        let text = std::fs::read_to_string("/proc/self/stat").ok()?;
        // The command name may hold spaces and parentheses: fields are
        // counted from the last ')'.
        let rest = &text[text.rfind(')')? + 1..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        // Field 3 (state) is f[0]: utime is field 14, stime 15, starttime
        // 22, vsize 23, rss 24.
        let n = |field: usize| f.get(field - 3).and_then(|v| v.parse::<u64>().ok());
        let tick = ticks_per_second();
        Some(Stat {
            cpu_secs: (n(14)? + n(15)?) as f64 / tick,
            start_secs: boot_secs().unwrap_or(0.0) + n(22)? as f64 / tick,
            virtual_bytes: n(23)?,
            resident_bytes: n(24)? * page_bytes(),
        })
    }

    fn open_fds() -> Option<u64> {
        Some(std::fs::read_dir("/proc/self/fd").ok()?.count() as u64)
    }

    fn max_fds() -> Option<u64> {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the struct it is given.
        let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
        (rc == 0).then_some(limit.rlim_cur)
    }

    fn float_gauge(r: &mut Registry, name: &str, help: &str, unit: Unit, v: f64) {
        let g = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        g.set(v);
        r.register_with_unit(name, help, unit, g);
    }

    fn int_gauge(r: &mut Registry, name: &str, help: &str, unit: Option<Unit>, v: u64) {
        let g = Gauge::<i64>::default();
        g.set(v as i64);
        match unit {
            Some(u) => r.register_with_unit(name, help, u, g),
            None => r.register(name, help, g),
        }
    }

    pub(super) fn register(r: &mut Registry) {
        if let Some(s) = stat() {
            let cpu = Counter::<f64, std::sync::atomic::AtomicU64>::default();
            cpu.inc_by(s.cpu_secs);
            r.register_with_unit(
                "process_cpu",
                "User and system CPU time spent",
                Unit::Seconds,
                cpu,
            );
            float_gauge(
                r,
                "process_start_time",
                "Start time of the process since the Unix epoch",
                Unit::Seconds,
                s.start_secs,
            );
            int_gauge(
                r,
                "process_virtual_memory",
                "Virtual memory size",
                Some(Unit::Bytes),
                s.virtual_bytes,
            );
            int_gauge(
                r,
                "process_resident_memory",
                "Resident memory size",
                Some(Unit::Bytes),
                s.resident_bytes,
            );
        }
        if let Some(n) = open_fds() {
            int_gauge(r, "process_open_fds", "Open file descriptors", None, n);
        }
        if let Some(n) = max_fds() {
            int_gauge(r, "process_max_fds", "The file descriptor limit", None, n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_past_the_bound_share_one_series() {
        let names = Names::default();
        for i in 0..MAX_NAMED_SERIES {
            assert_eq!(names.admit(&format!("t{i}")), format!("t{i}"));
        }
        assert_eq!(names.admit("one-too-many"), OTHER);
        assert_eq!(names.admit("t0"), "t0");
    }

    #[test]
    fn unknown_methods_are_other() {
        assert_eq!(known_method("tasks/get"), "tasks/get");
        assert_eq!(known_method("tasks/get\u{0}x"), OTHER);
    }

    #[test]
    fn the_exposition_ends_with_eof_and_names_the_process() {
        let m = Metrics::new();
        m.operation("tools/call", Some("sleep"), "", 0.002);
        m.error("TG_UNKNOWN_TOOL");
        let text = m.render(Snapshot {
            tasks_by_status: Some(vec![("working", 2), ("completed", 5)]),
            ..Snapshot::default()
        });
        assert!(text.ends_with("# EOF\n"), "{text}");
        for line in [
            "taskgate_build_info{version=\"",
            "mcp_server_operation_duration_seconds_count{mcp_method_name=\"tools/call\",gen_ai_tool_name=\"sleep\",error_type=\"\"} 1",
            "taskgate_errors_total{code=\"TG_UNKNOWN_TOOL\"} 1",
            "taskgate_tasks{status=\"completed\"} 5",
            "process_resident_memory_bytes ",
            "process_cpu_seconds_total ",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }
}
