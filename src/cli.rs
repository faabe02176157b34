//! Command-line definitions. The contract is stable: tests, docs and the
//! systemd unit rely on these names.
//!
//! Owns the command-line contract. clap definitions only. Names are stable:
//! tests, docs and the unit rely on them.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::Overrides;

#[derive(Debug, Parser)]
#[command(
    name = "taskgate",
    version,
    about = "Durable MCP Tasks daemon backed by SQLite",
    long_about = "taskgate serves the MCP Tasks extension (io.modelcontextprotocol/tasks, \
revision 2026-07-28) from a private SQLite store: a task a client was told exists is on disk, \
survives restarts, and is never run twice.\n\n\
Exit codes: 0 ok, 64 usage, 65 database validation failed, 74 I/O or recovery failure, \
75 ownership lock held, 77 unsafe path or permissions, 78 invalid configuration. \
`call` and `task` also exit 1 when the call failed, 69 when the daemon is unreachable and 76 \
when it refused the request or its answer was not understood."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon: validate the state directory and database, recover,
    /// then serve until SIGTERM or SIGINT.
    Serve(ServeArgs),
    /// Run every startup validation read-only, print what was found, and
    /// exit with the code serve would refuse with. Serves nothing.
    ///
    /// With --config-only, only the configuration and its tools are
    /// validated (as serve and a reload validate them), without the state
    /// directory or its lock: safe while the daemon serves, like `nginx -t`.
    Check(CheckArgs),
    /// Write a commented starter configuration (to stdout without --config).
    Init(InitArgs),
    /// Call a tool on a running daemon and print the result as JSON.
    ///
    /// Exit status: 0 success; 1 the call failed (a result with isError, or
    /// a task that ended failed or cancelled); 64 bad arguments; 69 the
    /// daemon cannot be reached, did not answer in time or answered 503;
    /// 76 the daemon refused the request with a JSON-RPC error (printed as
    /// {"error": …}) or answered in a way that is not MCP. When the reader
    /// of the output goes away (`| head`) the rest is dropped quietly.
    Call(CallArgs),
    /// Read or cancel a task on a running daemon.
    ///
    /// Exit status as for `call`: 0 success, 1 the task ended failed or
    /// cancelled (get), 64 bad arguments, 69 daemon unreachable, 76 request
    /// refused (an unknown task, for one) or answer not understood.
    Task(TaskArgs),
    /// Show what the daemon serving the state directory is doing: version,
    /// uptime, store state, task counts, queue, WAL, checkpoints,
    /// fallbacks. Asks over the private admin socket (root or the service
    /// user only).
    ///
    /// Exit status: 0 the daemon answered; 1 it answered but its task
    /// store is disabled until a restart; 69 no daemon serves the state
    /// directory (or it did not answer); 76 permission denied or the
    /// answer was not understood.
    Status(StatusArgs),
    /// Ask the daemon serving the state directory to re-read its
    /// configuration, exactly as SIGHUP does, wait until it is done and
    /// print what changed (`systemctl reload taskgate` runs this).
    ///
    /// Tools and the keys marked "on reload" apply to new calls; a changed
    /// startup-only key is named and keeps its running value until a
    /// restart. Running tasks are never interrupted.
    ///
    /// Exit status: 0 the reload was applied (startup-only keys that were
    /// kept are listed); 78 the new configuration is invalid and was
    /// refused, with the reason (77 when a file it names, such as a
    /// credential file, is unsafe): the daemon goes on with its previous
    /// settings; 69 no daemon serves the state directory, it did not
    /// answer in time, or it is stopping; 76 permission denied or the
    /// answer was not understood.
    Reload(ReloadArgs),
    /// The upstream MCP servers of the daemon serving the state directory:
    /// list them, show one's tools with their digests and pins, pin the
    /// tools you reviewed.
    ///
    /// A tool of an upstream is offered to callers as ALIAS.TOOL. Its
    /// digest (sha256 over the RFC 8785 canonical JSON of its name,
    /// description, input and output schema and annotations) is compared
    /// with the pin in upstream-pins.toml beside the configuration file: a
    /// tool whose digest differs from its pin is withheld until it is
    /// reviewed (`show`) and pinned again (`pin`, then `taskgate reload`).
    ///
    /// Exit status: 0 done; 1 (`show`) a tool is withheld; 64 no such
    /// upstream or tool; 69 no daemon serves the state directory; 76
    /// permission denied or the answer was not understood; 78 the pins
    /// file is invalid; 74 it could not be written.
    Upstream(UpstreamArgs),
    /// The daemon's durable routes to upstream tasks: each one's phase
    /// (prepared, dispatching, routed, cancel_requested,
    /// reconciliation_required, terminal), upstream, session and, when
    /// it needs reconciliation, why. Never a route's arguments: taskgate
    /// does not keep them.
    Routes(RoutesArgs),
    /// Calls held for an administrator's approval (tools with approval =
    /// "required"): list and show proposals (tool, caller, argument
    /// digest, the configured preview, deadlines, decision), approve or
    /// reject one, verify the approval journal. Over the admin socket, as
    /// root or the service user, who is recorded as the decider. Exit
    /// status: 0 done; 1 the proposal is unknown or already decided; 64
    /// approvals are not set up; 65 (verify) the journal failed its check;
    /// 69 no daemon serves the state directory; 74 the journal could not
    /// be written; 76 permission denied.
    Approvals(ApprovalsArgs),
    /// Qualify a capability of this host end to end, with nothing but this
    /// binary. --durable-tasks starts the daemon on a loopback port and
    /// drives the durable route over HTTP with tokens, against an embedded
    /// qualification provider (this binary serving MCP over stdio, its task
    /// tool a bounded JSON worker run as a separate process): a discarded
    /// acknowledgement recovered by the same key and task ID after the
    /// daemon restarts on the same provider session, one worker effect
    /// counted at the provider and checked by an independent verifier,
    /// refusals and scopes, input, output and runtime bounds, tampered and
    /// escaping artifacts, cleanup, the update refusal and the deadline's
    /// cancel. Prints the structured result as JSON on stdout and a summary
    /// on stderr; exits 0 only when the result is PASS (1 otherwise).
    Verify(VerifyArgs),
    /// Manage the static API tokens of [auth] tokens_file: create one (its
    /// secret is printed once and never stored), list them, revoke one.
    ///
    /// `new` writes nothing: it prints the secret, then the [[token]]
    /// stanza (holding only the secret's sha256) to add to the tokens file.
    /// `list` never shows a hash or a secret. `revoke` rewrites the tokens
    /// file in place (mode and owner kept); `systemctl reload taskgate`
    /// then applies it without a restart.
    Token(TokenArgs),
    /// Copy a stopped daemon's state directory to a new private directory,
    /// with a sha256 manifest, and verify the copy. Refused while a daemon
    /// holds the directory's lock. With --online, the running daemon writes
    /// the snapshot instead, while it goes on serving.
    Backup(BackupArgs),
    /// Replace a stopped daemon's state with a verified snapshot made by
    /// `backup`; the replaced files are kept beside the state directory.
    Restore(RestoreArgs),
    /// Measure capacity on this host: raw SQLite commits on the disk, then a
    /// real daemon on a scratch directory driven through MCP over HTTP;
    /// writes bench.json, bench.md and latency.svg.
    Bench(BenchArgs),
    /// Write the man pages (taskgate(1) and one per command into DIR/man1,
    /// taskgate.toml(5) into DIR/man5), or print the configuration
    /// reference table of docs/operations.md.
    #[command(hide = true)]
    Man(ManArgs),
    /// Internal: runs one tool for the daemon (see tools/shim.rs).
    #[command(name = "exec-tool", hide = true)]
    ExecTool(ExecToolArgs),
    /// Print the registry of taskgate's JSON-RPC error codes (code, name,
    /// help), so scripts and tests read them rather than copy numbers.
    #[command(name = "wire-codes", hide = true)]
    WireCodes(WireCodesArgs),
    /// Internal: the harmless worker that qualifies the durable route. Reads
    /// one bounded JSON request on stdin, writes its result and manifest as
    /// new files in one directory under --root, prints one JSON line (see
    /// verify/worker.rs).
    #[command(name = "qualification-worker", hide = true)]
    QualificationWorker {
        /// The directory the run's output directory is created in.
        #[arg(long, value_name = "DIR")]
        root: PathBuf,
        /// A file every run appends one line to, before any check.
        #[arg(long, value_name = "FILE")]
        ledger: Option<PathBuf>,
        /// Misbehave on purpose (honoured only in builds with test hooks).
        #[arg(long, value_enum)]
        liar: Option<crate::verify::Liar>,
    },
}

#[derive(Debug, Args)]
pub struct WireCodesArgs {
    /// One JSON array of {"code", "name", "help"} objects instead of one
    /// tab-separated line per code.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct BackupArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// The new directory to create for the copy; must not exist.
    #[arg(
        long,
        value_name = "DEST",
        required_unless_present = "into",
        conflicts_with = "into"
    )]
    pub to: Option<PathBuf>,
    /// Only check the state directory and the destination; take no lock
    /// and copy nothing (works while the daemon serves).
    #[arg(long, conflicts_with = "online")]
    pub dry_run: bool,
    /// Ask the running daemon to write the snapshot while it serves (over
    /// its admin socket: root or the service user). The daemon writes
    /// DEST, so DEST must be somewhere the service may write.
    #[arg(long)]
    pub online: bool,
    /// With --online: write the snapshot into DIR as taskgate-<UTC time>,
    /// then remove the oldest such snapshots beyond --keep.
    #[arg(long, value_name = "DIR", requires = "online")]
    pub into: Option<PathBuf>,
    /// With --into: how many snapshots to keep in DIR.
    #[arg(long, value_name = "N", requires = "into", default_value_t = 7,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub keep: u32,
    /// With --online: the admin socket to use (default: the one the daemon
    /// serving the state directory recorded in its tasks.lock).
    #[arg(long, value_name = "PATH", requires = "online")]
    pub socket: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Print the status as a JSON object (for scripts).
    #[arg(long)]
    pub json: bool,
    /// The admin socket to use (default: the one the daemon serving the
    /// state directory recorded in its tasks.lock).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ReloadArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// The admin socket to use (default: the one the daemon serving the
    /// state directory recorded in its tasks.lock).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// A snapshot directory made by `taskgate backup`.
    #[arg(long, value_name = "SNAPSHOT")]
    pub from: PathBuf,
    /// Only verify the snapshot (manifest and database); change nothing.
    #[arg(long)]
    pub verify_only: bool,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Tasks to create (e.g. 1000 or 10000).
    #[arg(long, default_value_t = 1000)]
    pub tasks: usize,
    /// Concurrent clients in the throughput phases (1..=1024); the
    /// benchmark daemon's request, connection and queue bounds are sized
    /// from it.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Where to create the scratch directory: the filesystem under test.
    /// Default: beside the configured state directory.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Where to write bench.json, bench.md and latency.svg.
    /// Default: ./taskgate-bench-<time>-<pid>.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Configuration whose state directory locates the default --dir.
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Keep the scratch directory (its database included) afterwards.
    #[arg(long)]
    pub keep: bool,
    /// The bare rmcp server (the `bare_rmcp` example of the source tree)
    /// that the no-op load is also run on, for the daemon's CPU per no-op
    /// against the library's own. Default: examples/bare_rmcp beside this
    /// executable, where cargo builds it; without one that target is
    /// reported as not measured.
    #[arg(long, value_name = "PATH")]
    pub bare_rmcp: Option<PathBuf>,
    /// Also drive the MCP server at URL (http:// to a 127.0.0.0/8 or [::1]
    /// address only: the benchmark never sends traffic beyond this host) with the same
    /// no-op load (`tools/list` of protocol 2026-07-28, no session, at
    /// --concurrency), and report taskgate's throughput, p50 and p99 as
    /// ratios to its, and its CPU per request when its process is known.
    #[arg(long, value_name = "URL")]
    pub compare: Option<String>,
    /// The process serving --compare, whose CPU time per request is read
    /// from its process CPU clock. Default: the owner of the socket listening on the URL's port,
    /// when this user can see it.
    #[arg(long, value_name = "PID", requires = "compare")]
    pub compare_pid: Option<u32>,
}

#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct ManArgs {
    /// Directory to write the pages into (man1/ and man5/ are created).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Print the configuration reference (markdown, with the markers that
    /// delimit it in docs/operations.md) instead.
    #[arg(long)]
    pub reference: bool,
}

#[derive(Debug, Args)]
pub struct ExecToolArgs {
    /// The daemon's pid.
    #[arg(long)]
    pub parent: u32,
    /// The confinement, limits and grace, as JSON (see tools/shim.rs).
    #[arg(long)]
    pub policy: Option<String>,
    /// The tool's argv.
    #[arg(last = true, required = true)]
    pub argv: Vec<String>,
}

#[derive(Debug, Args)]
pub struct CallArgs {
    /// The tool to call.
    pub tool: String,
    /// The tool's arguments, a JSON object.
    #[arg(long, value_name = "JSON", default_value = "{}")]
    pub args: String,
    /// Declare the Tasks extension, so a task-capable tool returns a task.
    #[arg(long)]
    pub task: bool,
    /// With --task: poll the task until it ends and print its final state.
    #[arg(long, requires = "task")]
    pub wait: bool,
    /// An operation ID: calling again with the same one returns the same
    /// task instead of running the tool twice.
    #[arg(long, value_name = "ID")]
    pub operation_id: Option<String>,
    #[command(flatten)]
    pub endpoint: Endpoint,
}

/// Where the operator client finds the daemon.
#[derive(Debug, Args)]
pub struct Endpoint {
    /// The daemon's MCP endpoint. Default: http://<server.listen>/mcp of
    /// the configuration (--config, $TASKGATE_CONFIG, else the package's
    /// /etc/taskgate/taskgate.toml when it exists), else
    /// http://127.0.0.1:8765/mcp.
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
    /// The configuration whose server.listen names the daemon (as for serve).
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// A file holding the bearer token to send (its first line), for a
    /// daemon whose [auth] asks for credentials. Without it, the token in
    /// $TASKGATE_TOKEN is sent, if set. A token is never taken from the
    /// command line, where other users could read it.
    #[arg(long, value_name = "PATH", env = "TASKGATE_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct TaskArgs {
    #[command(subcommand)]
    pub action: TaskAction,
}

#[derive(Debug, Subcommand)]
pub enum TaskAction {
    /// Print a task's state (and its result or error once it has ended).
    Get(TaskRef),
    /// Ask for a task to be cancelled; prints the task as it then stands.
    Cancel(TaskRef),
}

#[derive(Debug, Args)]
pub struct TaskRef {
    /// The task ID (tg-…).
    pub id: String,
    /// Poll until the task has ended (get only).
    #[arg(long)]
    pub wait: bool,
    #[command(flatten)]
    pub endpoint: Endpoint,
}

#[derive(Debug, Args)]
pub struct UpstreamArgs {
    #[command(subcommand)]
    pub action: UpstreamAction,
}

#[derive(Debug, Subcommand)]
pub enum UpstreamAction {
    /// Each upstream: its state, protocol, whether it advertised Tasks, its
    /// tools (available, withheld, unpinned) and its last error.
    List(UpstreamListArgs),
    /// One upstream's tools: name, digest, pin (pinned, unpinned, or
    /// differs with what changed since the pin), effect, task mode, and why
    /// a tool is withheld.
    Show(UpstreamShowArgs),
    /// Pin the live digests of an upstream's tools (all of them, or those
    /// named) in upstream-pins.toml beside the configuration file; apply
    /// with `taskgate reload`.
    Pin(UpstreamPinArgs),
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Qualify durable routes to upstream tasks (the only qualification
    /// there is; it must be named).
    #[arg(long, required = true)]
    pub durable_tasks: bool,
    /// Keep the temporary directory (its path is in the result) to
    /// investigate a failure; it is removed otherwise.
    #[arg(long)]
    pub keep: bool,
}

#[derive(Debug, Args)]
pub struct ApprovalsArgs {
    #[command(subcommand)]
    pub action: ApprovalsAction,
}

#[derive(Debug, Subcommand)]
pub enum ApprovalsAction {
    /// Proposals, newest first (at most 500): ID, state, tool, caller and
    /// decision deadline.
    List(ApprovalsListArgs),
    /// One proposal: tool, caller, argument digest and preview, times,
    /// and the decision with who made it.
    Show(ApprovalsIdArgs),
    /// Approve proposal ID: the caller's identical call, issued again
    /// within the execution window, runs once.
    Approve(ApprovalsApproveArgs),
    /// Reject proposal ID: the identical call is refused until the
    /// proposal's deadline. The reason stays in the approval journal; the
    /// caller never sees it.
    Reject(ApprovalsRejectArgs),
    /// The approval journal's checkpoint (identity, records, bytes, head
    /// hash) and health, to compare two copies of it.
    Verify(UpstreamListArgs),
}

#[derive(Debug, Args)]
pub struct ApprovalsListArgs {
    /// Only proposals still waiting for a decision.
    #[arg(long)]
    pub pending: bool,
    #[command(flatten)]
    pub list: UpstreamListArgs,
}

#[derive(Debug, Args)]
pub struct ApprovalsIdArgs {
    /// The proposal ID (tgp-…).
    pub id: String,
    #[command(flatten)]
    pub list: UpstreamListArgs,
}

#[derive(Debug, Args)]
pub struct ApprovalsApproveArgs {
    /// The proposal ID (tgp-…).
    pub id: String,
    /// How long the approval may be used, such as 90s, 15m or 1h (at most
    /// approvals.execution_window_secs, which is also the default).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub valid_for: Option<std::time::Duration>,
    #[command(flatten)]
    pub list: UpstreamListArgs,
}

#[derive(Debug, Args)]
pub struct ApprovalsRejectArgs {
    /// The proposal ID (tgp-…).
    pub id: String,
    /// Why (at most 512 bytes; kept in the approval journal only).
    #[arg(long, value_name = "TEXT", required = true)]
    pub reason: String,
    #[command(flatten)]
    pub list: UpstreamListArgs,
}

/// A duration written as a number and a unit: `s`, `m`, `h` or `d`.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} needs a unit: s, m, h or d (such as 15m)"))?;
    let (n, unit) = text.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{text:?} does not start with a number"))?;
    let secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{text:?}: the unit is s, m, h or d")),
    };
    n.checked_mul(secs)
        .filter(|s| *s > 0)
        .map(std::time::Duration::from_secs)
        .ok_or_else(|| format!("{text:?} is not a usable duration"))
}

#[derive(Debug, Args)]
pub struct RoutesArgs {
    #[command(subcommand)]
    pub action: RoutesAction,
}

#[derive(Debug, Subcommand)]
pub enum RoutesAction {
    /// Unexpired routes, newest first (at most 500): ID, phase, what the
    /// caller reads, capability, and the reason of one that needs
    /// reconciliation.
    List(RoutesListArgs),
    /// One route: every phase field, its digests and its submission
    /// binding (identifiers and digests, no argument values).
    Show(RoutesShowArgs),
}

#[derive(Debug, Args)]
pub struct RoutesListArgs {
    /// Only routes that are not terminal.
    #[arg(long)]
    pub open: bool,
    #[command(flatten)]
    pub list: UpstreamListArgs,
}

#[derive(Debug, Args)]
pub struct RoutesShowArgs {
    /// The route's public task ID (tgr-…).
    pub id: String,
    #[command(flatten)]
    pub list: UpstreamListArgs,
}

#[derive(Debug, Args)]
pub struct UpstreamListArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Print JSON (for scripts).
    #[arg(long)]
    pub json: bool,
    /// The admin socket to use (default: the one the daemon serving the
    /// state directory recorded in its tasks.lock).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct UpstreamShowArgs {
    /// The upstream's alias.
    pub alias: String,
    #[command(flatten)]
    pub list: UpstreamListArgs,
}

#[derive(Debug, Args)]
pub struct UpstreamPinArgs {
    /// The upstream's alias.
    pub alias: String,
    /// The upstream's own tool names to pin (default: every tool it lists
    /// now).
    pub tools: Vec<String>,
    /// Pin only if the tool's live digest is this one (the digest you
    /// reviewed with `show`); with one TOOL.
    #[arg(long, value_name = "DIGEST")]
    pub expect: Option<String>,
    #[command(flatten)]
    pub common: CommonArgs,
    /// The admin socket to use.
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct TokenArgs {
    #[command(subcommand)]
    pub action: TokenAction,
}

#[derive(Debug, Subcommand)]
pub enum TokenAction {
    /// Create a token: print its secret once, then the [[token]] stanza
    /// to add to the tokens file.
    New(TokenNewArgs),
    /// List the tokens file's entries: id, tenant, subject, scopes,
    /// expiry, revoked.
    List(TokenFileArgs),
    /// Mark a token revoked in the tokens file.
    Revoke(TokenRevokeArgs),
}

#[derive(Debug, Args)]
pub struct TokenNewArgs {
    /// The token's id: a label for logs and revocation (A-Z a-z 0-9 _ - . @).
    #[arg(long, value_name = "ID")]
    pub id: String,
    /// The tenant the token acts in.
    #[arg(long, value_name = "TENANT")]
    pub tenant: String,
    /// The subject (who holds the token).
    #[arg(long, value_name = "SUBJECT")]
    pub subject: String,
    /// A scope granted (repeat for several), e.g. tools:call, tasks:read,
    /// tasks:cancel, taskgate:effect:idempotent-write, admin.
    #[arg(long = "scope", value_name = "SCOPE")]
    pub scopes: Vec<String>,
    /// When the token stops working, an RFC 3339 time such as
    /// 2027-06-01T00:00:00Z. Default: never.
    #[arg(long, value_name = "RFC3339")]
    pub expires: Option<String>,
    /// The issuer recorded for the token's owner (default taskgate:static).
    #[arg(long, value_name = "ISSUER")]
    pub issuer: Option<String>,
}

#[derive(Debug, Args)]
pub struct TokenFileArgs {
    /// The configuration whose [auth] tokens_file to use: --config, else
    /// $TASKGATE_CONFIG, else /etc/taskgate/taskgate.toml.
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct TokenRevokeArgs {
    /// The id of the token to revoke.
    pub id: String,
    #[command(flatten)]
    pub file: TokenFileArgs,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Validate the configuration and its tools only; never open the state
    /// directory or its lock (usable while the daemon serves).
    #[arg(long)]
    pub config_only: bool,
}

#[derive(Debug, Args)]
pub struct CommonArgs {
    /// Configuration file (TOML). Also $TASKGATE_CONFIG. Without one, the
    /// embedded defaults apply.
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// State directory (absolute). Overrides $STATE_DIRECTORY and
    /// [store] directory; the default is $XDG_STATE_HOME/taskgate.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// HTTP listen address, e.g. 127.0.0.1:8765 (loopback only).
    #[arg(long, value_name = "ADDR", conflicts_with = "stdio")]
    pub listen: Option<String>,
    /// Serve one MCP client over stdin/stdout instead of HTTP (for clients
    /// that start the server as a subprocess). Logs go to stderr.
    #[arg(long)]
    pub stdio: bool,
    /// Serve the benchmark's built-in instant tool (used by `taskgate bench`).
    #[arg(long, hide = true)]
    pub bench_tool: bool,
}

#[derive(Debug, Args)]
pub struct InitArgs {
    /// Where to write the starter configuration; refuses to overwrite.
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Set `[store] directory` to this (absolute) directory.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

impl CommonArgs {
    pub fn overrides(&self) -> Overrides {
        Overrides {
            config_path: self.config.clone(),
            state_dir: self.state_dir.clone(),
            listen: None,
        }
    }
}

impl ServeArgs {
    pub fn overrides(&self) -> Overrides {
        Overrides {
            listen: self.listen.clone(),
            ..self.common.overrides()
        }
    }
}
