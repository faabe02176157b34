//! The serving process: startup in order, systemd notification (READY,
//! STATUS, WATCHDOG, RELOADING, STOPPING), signals, configuration reloads
//! and the shutdown order.
//!
//! [`run`] is the in-process entry point (mini-redis's `server::run`): it
//! serves a bound listener until a shutdown future resolves, then stops in
//! the order below. `taskgate serve` ([`serve`]) is the same daemon behind
//! the process edge: a runtime, the signal handlers, the listener bound
//! before anything in the state directory is touched. Tests that need the
//! serving parts without a listener open a [`Daemon`] and drive its
//! router in process. The reloads are in `reload.rs`, the chores (STATUS=,
//! the watchdog, artifact sweeps, memory) in `chores.rs`, stdio in
//! `stdio.rs`, the stop and reload sources in `control.rs`.
//!
//! Signal handlers are installed before any startup work, so a SIGTERM at
//! any moment, even the instant READY=1 went out, is a clean stop, and a
//! SIGHUP during startup (whose default would end the process) is a reload
//! once serving begins.
//!
//! Reload (SIGHUP, or a `reload` request on the admin socket, which is
//! what `taskgate reload` and the unit's `ExecReload=` send; both run the
//! one `Process::reload_configuration`, one at a time): RELOADING=1; the
//! file is read and validated by the same function as at startup
//! ([`startup::effective`]); an invalid one changes nothing (logged at
//! error); a changed startup-only key is kept at its started value (one
//! warning naming it); tools and the reloadable keys are swapped in for
//! calls admitted afterwards (`TaskService::reload`); READY=1. Nothing that
//! runs is stopped or altered. The admin socket's caller gets the outcome
//! (what changed, what was kept, or why the file was refused) once READY=1
//! went out, so `systemctl reload` ends when the new settings apply.
//!
//! Shutdown: stop admitting (a call is refused with `TG_SERVER_STOPPING`,
//! polls and cancels are still answered), then STOPPING=1; every
//! running tool is stopped and its task recorded as failed (interrupted);
//! the HTTP listener closes and in-flight requests get their real answers;
//! streams and sessions end; the background chores end; then the store's
//! final TRUNCATE checkpoint; exit 0.
//!
//! One process serves one state directory. Startup is synchronous and strictly
//! ordered; the async runtime exists from the first step only so that SIGTERM
//! and SIGINT are caught from the start.
//!
//! Owns the serving process. `mod.rs`: `run(listener, options, shutdown)`, the
//! in-process entry point (mini-redis's `server::run`: serves a listener the
//! caller bound until a shutdown future resolves, then stops in the order
//! below), and `serve`, the same daemon behind the process edge (a runtime, the
//! signal handlers before any startup work, the listener bound before the store
//! opens); both open a `Daemon` (the state directory claimed, the durable parts
//! opened and recovered, the task service, the admin socket bound), which tests
//! also open in process to drive its router (`Daemon::start`, `Daemon::app`)
//! with their own built-in tools and the store's manual clock (`Options`); the
//! stop order. `control.rs`: where stop and reload requests come from
//! (SIGTERM/SIGINT/SIGHUP, or the shutdown future). `reload.rs`: configuration
//! reloads. `chores.rs`: READY/STATUS/WATCHDOG/STOPPING (every STATUS= while
//! serving goes through one `StatusBoard`: a withheld watchdog ping sends a
//! `WATCHDOG WITHHELD: …` notice, which refreshed counts never replace until
//! pings resume, and nothing replaces `stopping`) and the chores on a
//! `TaskTracker` (STATUS, watchdog, artifact sweep, and giving memory back with
//! `malloc_trim` once legacy sessions closed: glibc would otherwise keep a
//! burst's peak for good). `stdio.rs`: serving over stdio. Holds the
//! `upstream::Upstreams` (connected once serving begins, applied again by each
//! reload, stopped after every run). Holds no task state.
//!
//! The stop order. On SIGTERM or SIGINT (at any moment after step 0):
//!
//! - Stop step 1: Admission ends first: every new `tools/call` is refused with
//!   `TG_SERVER_STOPPING` (polls and cancels are still answered, so clients can
//!   see their tasks end); then `STOPPING=1`, and `/readyz` says 503.
//!
//! - Stop step 2: Every run is stopped (SIGTERM, grace, SIGKILL to its group);
//!   a background task is recorded `failed` (interrupted), or `cancelled` if
//!   its cancel had been committed; a synchronous call answers with the
//!   interruption error. The service waits on its `TaskTracker` for every
//!   outcome, including calls still between admission and their spawn (each
//!   holds a tracker token).
//!
//! - Stop step 3: The listener closes; in-flight requests finish with their
//!   real answers (`Drain::idle`), after which the request slots are closed: a
//!   request on a connection still open is answered `TG_SERVER_STOPPING` at the
//!   door and never reaches the protocol layer.
//!
//! - Stop step 4: SSE streams and legacy sessions end (`Drain::end_streams`);
//!   connections close.
//!
//! - Stop step 5: The upstreams are stopped (their calls were stopped with
//!   every run in step 2): each supervisor ends, its connection closes and a
//!   stdio upstream's process group is ended through its shim; a removed
//!   upstream still retiring is stopped too. Upstreams are stopped after the
//!   tools' runs and before the store closes.
//!
//! - Stop step 6: The chores end; the store's final TRUNCATE checkpoint; exit 0.
//!   A clean stop leaves `tasks.db` and `tasks.lock`.

mod chores;
mod control;
mod reload;
mod stdio;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use sd_notify::NotifyState;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admin::ReloadReply;
use crate::admin::server::Admin;
use crate::auth::Authenticator;
use crate::config::{Config, Overrides, keys};
use crate::exit::{ExitClass, Refusal};
use crate::http::tls::Tls;
use crate::http::{self, LimitedListener};
use crate::ops::Ops;
use crate::startup::{self, Claimed, Effective};
use crate::store::{self, Clock, Store};
use crate::tasks::{Limits, TaskService};
use crate::tools::Runner;
use crate::upstream::{Pins, Upstreams};
use chores::StatusBoard;
use control::{Control, Heard, StopSignals};
use reload::Reload;

/// How many recovered task IDs the startup log names.
const RECOVERED_IDS_LOGGED: usize = 16;
/// How long in-flight HTTP requests get to finish once the listener closed.
const HTTP_DRAIN_LIMIT: Duration = Duration::from_secs(10);
/// How long the server gets to close its connections after that.
const HTTP_CLOSE_LIMIT: Duration = Duration::from_secs(5);
/// Reload requests from the admin socket waiting for the serving process:
/// one per admin connection at most.
const RELOAD_QUEUE: usize = crate::admin::MAX_CONNECTIONS;

/// Sends states to the service manager; a no-op without `NOTIFY_SOCKET`.
pub fn notify(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, "cannot notify the service manager: {e}");
    }
}

/// Which transport serves the clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Http,
    Stdio,
}

/// How a daemon is started.
#[derive(Clone, Default)]
pub struct Options {
    /// What the command line gave (`--config`, `--state-dir`, `--listen`);
    /// a reload reads the configuration again the same way.
    pub overrides: Overrides,
    /// Tools served beside the configured ones: the benchmark's no-op
    /// under `taskgate bench`, a test's own in process.
    pub builtins: Vec<Arc<dyn Runner>>,
    /// The store's clock: the system's, unless a test moves its own.
    pub clock: Option<Clock>,
    /// The environment the configuration is layered from (its `TASKGATE_*`
    /// variables), at startup and at every reload: the process's own unless
    /// given. `taskgate verify` gives its own, so that an operator's
    /// variables do not change what it qualifies.
    pub env: Option<Arc<HashMap<String, String>>>,
    /// Upstream connections that outlive this daemon: used instead of its
    /// own, and left connected when it stops. `taskgate verify` restarts
    /// the router on them to show recovery on the very session a route was
    /// dispatched on.
    pub upstreams: Option<Arc<Upstreams>>,
}

impl Options {
    /// Step 1 as this daemon reads it, at startup and at a reload.
    fn effective(&self) -> Result<Effective, Refusal> {
        match &self.env {
            Some(env) => startup::effective_in(&self.overrides, env, self.builtins.clone()),
            None => startup::effective(&self.overrides, self.builtins.clone()),
        }
    }
}

/// Runs `taskgate serve` to completion: the async runtime, the signal
/// handlers (before any startup work), the configuration, the listener
/// (bound before the state directory is touched), then the daemon until a
/// stop signal.
pub fn serve(options: Options, transport: Transport) -> Result<(), Refusal> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("taskgate-rt")
        .build()
        .map_err(|e| {
            Refusal::new(
                ExitClass::Io,
                format!("cannot start the async runtime: {e}"),
            )
        })?;
    let signals = runtime.block_on(async { StopSignals::install() })?;
    let effective = configure(&options, transport)?;
    let listener = match transport {
        Transport::Http => Some(runtime.block_on(bind(&effective.config))?),
        Transport::Stdio => None,
    };
    let daemon = Daemon::open(options, effective)?;
    let control = Control::Signals(signals);
    runtime.block_on(async move {
        match listener {
            Some(listener) => daemon.serve_http(listener, control).await,
            None => daemon.serve_stdio(control).await,
        }
    })
}

/// Serves `listener` until `shutdown` resolves, then stops in order, as
/// `taskgate serve` does on SIGTERM; reloads come over the admin socket.
/// The daemon's own startup and refusals are those of `serve`; the caller
/// owns the process (no signal handler is installed, no runtime made).
pub async fn run(
    listener: TcpListener,
    options: Options,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Refusal> {
    // Opening validates and recovers the store on its own thread and waits
    // for it: a blocking step.
    let daemon = tokio::task::spawn_blocking(move || Daemon::start(options))
        .await
        .map_err(|e| Refusal::new(ExitClass::Io, format!("startup did not finish: {e}")))??;
    daemon.serve_http(listener, Control::until(shutdown)).await
}

/// Step 1: the effective settings, and the rules that need the transport.
/// From here on the configured log filter applies (the logger started with
/// `TASKGATE_LOG` or the default, before any configuration was read).
fn configure(options: &Options, transport: Transport) -> Result<Effective, Refusal> {
    for b in &options.builtins {
        tracing::warn!(tool = %b.spec().name, "serving a built-in test tool: {}", b.spec().name);
    }
    let effective = options.effective()?;
    if transport == Transport::Stdio
        && effective
            .config
            .auth
            .as_ref()
            .is_some_and(|a| a.local_owner == crate::config::LocalOwner::Never)
    {
        // stdio carries no credential: under `never` it would have to act as
        // someone it cannot prove to be.
        return Err(Refusal::new(
            ExitClass::Config,
            "auth.local_owner = \"never\" leaves stdio no caller to act as (it cannot present a credential); serve over HTTP, or set auth.local_owner = \"loopback\"".to_string(),
        ));
    }
    set_log_filter(&effective.config.log.filter);
    Ok(effective)
}

/// A daemon opened and not yet serving: the state directory claimed (its
/// lock held until the daemon is dropped), the store validated, opened and
/// recovered, the task service on it, the admin socket bound.
pub struct Daemon {
    config: Config,
    svc: Arc<TaskService>,
    /// The task store the service runs on: the daemon closes it last.
    store: Store,
    /// What operators and administrators do, whatever surface they use.
    ops: Arc<Ops>,
    claimed: Claimed,
    admin: Admin,
    reload: Reload,
    auth: Option<Arc<Authenticator>>,
    tls: Option<Arc<Tls>>,
    /// The upstream MCP servers: connected once the daemon serves.
    upstreams: Arc<Upstreams>,
    /// Whether they are this daemon's to stop (not given in `Options`).
    owns_upstreams: bool,
    pins: Pins,
    /// The paths no tool or stdio upstream may reach.
    protected: Vec<std::path::PathBuf>,
}

impl Daemon {
    /// Startup step 1 (the configuration, as `serve` reads it) and
    /// [`Daemon::open`]: a daemon in process, for tests. Blocking.
    pub fn start(options: Options) -> Result<Daemon, Refusal> {
        let effective = configure(&options, Transport::Http)?;
        Daemon::open(options, effective)
    }

    /// Startup steps 3–9 (the state directory, its lock, the durable
    /// parts, recovery), then the task service. Blocking.
    pub fn open(options: Options, effective: Effective) -> Result<Daemon, Refusal> {
        let Effective {
            config,
            tools,
            auth,
            tls,
            pins,
            protected,
        } = effective;
        // Their supervisors start when the daemon serves (`Process::ready`);
        // until an upstream answers, its tools are absent.
        let (upstreams, owns_upstreams) = match &options.upstreams {
            Some(shared) => (shared.clone(), false),
            None => (
                Upstreams::new(protected.clone(), CancellationToken::new()),
                true,
            ),
        };
        let tools = tools.with_source(upstreams.clone());
        let clock = options.clock.clone().unwrap_or_else(store::system_clock);
        let mut serving = startup::open_serving(&config, clock)?;
        // The lock is held: a socket file a killed daemon left is replaced.
        let admin = Admin::bind(&mut serving.claimed.lock, serving.claimed.dir.path());
        let report = &serving.report;
        let recovered = report.recovery_lines();
        tracing::info!(
            message_id = crate::events::START,
            state_dir = %serving.claimed.dir.path().display(),
            state_dir_source = %config.state_dir_source,
            initialized = report.initialized,
            migrated_from = ?report.migrated_from,
            recovered = report.recovered,
            retained = report.retained,
            unexpired = report.unexpired,
            tools = config.tools.len(),
            "task store open in {}: {} tasks retained ({} unexpired), {} tools",
            serving.claimed.dir.path().display(),
            report.retained,
            report.unexpired,
            config.tools.len(),
        );
        tools.log_confinement();
        if report.recovered > 0 {
            // Enough IDs to find the affected tasks, never an unbounded line.
            let shown: Vec<&str> = report
                .recovered_ids
                .iter()
                .take(RECOVERED_IDS_LOGGED)
                .map(|id| id.as_str())
                .collect();
            tracing::warn!(
                message_id = crate::events::RECOVERY,
                recovered = report.recovered,
                cancelled = report.cancelled,
                first_ids = %shown.join(" "),
                "{} tasks that were running when the daemon stopped have ended ({} cancelled as their cancel was committed, the rest failed); none was re-run; first: {}",
                report.recovered,
                report.cancelled,
                shown.join(" "),
            );
        }
        let svc = TaskService::new(
            serving.store.clone(),
            tools,
            serving.artifacts,
            config.tasks.clone(),
            Limits {
                max_polls_tracked: config.store.max_live_tasks as usize,
                max_sync_calls: config.server.max_concurrent_requests,
                // At most half the control budget waits in early polls, so
                // cancels and on-time polls always find a slot.
                max_held_polls: (config.server.reserved_control_requests / 2).max(1),
            },
        );
        svc.attach_router(crate::route::Router::new(
            serving.store.clone(),
            upstreams.clone(),
            config.tasks.poll_interval,
        ));
        // The journal is opened when a tool needs approval, or when one
        // exists already (its waiting tasks still need it).
        if config.needs_approvals() || config.approvals.directory.exists() {
            svc.attach_approvals(Arc::new(crate::tasks::Approvals::open(
                &config.approvals,
                config.tasks.default_ttl,
            )));
        }
        let ops = Ops::new(
            svc.clone(),
            serving.store.clone(),
            upstreams.clone(),
            serving.claimed.dir.path(),
            &config,
        );
        ops.recovered(recovered);
        Ok(Daemon {
            reload: Reload::new(options, &config),
            config,
            svc,
            store: serving.store,
            ops,
            claimed: serving.claimed,
            admin,
            auth: auth.map(Arc::new),
            tls: tls.map(Arc::new),
            upstreams,
            owns_upstreams,
            pins,
            protected,
        })
    }

    /// The task service the daemon serves.
    pub fn service(&self) -> &Arc<TaskService> {
        &self.svc
    }

    /// The task store the daemon serves from: it closes it last.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The HTTP application `serve` puts behind its listener, for driving
    /// in process (a new one at each call: its own sessions and budgets).
    pub fn app(&self) -> http::App {
        http::App::with_auth(
            self.svc.clone(),
            self.ops.clone(),
            &self.config.server,
            self.auth.clone(),
        )
    }

    /// What operators and administrators do to this daemon.
    pub fn ops(&self) -> &Arc<Ops> {
        &self.ops
    }

    fn into_process(self, control: Control) -> (Process, Config, Claimed) {
        let (reload_sender, reload_requests) = mpsc::channel(RELOAD_QUEUE);
        let process = Process {
            svc: self.svc,
            store: self.store,
            ops: self.ops,
            control,
            reload: self.reload,
            reload_sender,
            reload_requests,
            describe: None,
            board: Arc::new(StatusBoard::default()),
            chores: TaskTracker::new(),
            chores_stop: CancellationToken::new(),
            admin: self.admin,
            auth: self.auth,
            tls: self.tls,
            first_upstreams: Some((self.config.upstreams.clone(), self.pins)),
            first_protected: Some(self.protected),
            upstreams: self.upstreams,
            owns_upstreams: self.owns_upstreams,
        };
        (process, self.config, self.claimed)
    }

    async fn serve_http(self, listener: TcpListener, control: Control) -> Result<(), Refusal> {
        let state_dir = self.claimed.dir.path().display().to_string();
        let app = self.app();
        let (mut process, config, claimed) = self.into_process(control);
        let result = process.run_http(listener, app, &config, state_dir).await;
        // The lock is released only when the process is done with the files.
        drop(claimed);
        result
    }

    async fn serve_stdio(self, control: Control) -> Result<(), Refusal> {
        let state_dir = self.claimed.dir.path().display().to_string();
        let (mut process, config, claimed) = self.into_process(control);
        let result = process
            .run_stdio(state_dir, config.server.max_request_bytes)
            .await;
        drop(claimed);
        result
    }
}

async fn bind(config: &Config) -> Result<TcpListener, Refusal> {
    TcpListener::bind(config.server.listen).await.map_err(|e| {
        Refusal::new(
            ExitClass::Io,
            format!(
                "cannot listen on {}: {e}; choose another address with --listen or server.listen",
                config.server.listen
            ),
        )
    })
}

/// A serving process once startup is done.
struct Process {
    svc: Arc<TaskService>,
    store: Store,
    ops: Arc<Ops>,
    /// Stop and reload requests besides the admin socket's.
    control: Control,
    reload: Reload,
    /// Given to the admin socket, whose `reload` requests come in on
    /// `reload_requests`.
    reload_sender: mpsc::Sender<ReloadReply>,
    reload_requests: mpsc::Receiver<ReloadReply>,
    /// Where the daemon serves, for STATUS= (set once ready).
    describe: Option<Arc<dyn Fn() -> String + Send + Sync>>,
    /// Every STATUS= sent while serving goes through it.
    board: Arc<StatusBoard>,
    /// Status refresh, watchdog, artifact sweep.
    chores: TaskTracker,
    chores_stop: CancellationToken,
    /// The private admin socket (`taskgate status`, online snapshots).
    admin: Admin,
    /// The credentials in force, swapped by reloads; `None`: every caller
    /// is local.
    auth: Option<Arc<Authenticator>>,
    /// The TLS pair in force, re-read by reloads.
    tls: Option<Arc<Tls>>,
    upstreams: Arc<Upstreams>,
    owns_upstreams: bool,
    /// The upstreams to connect once serving (taken by `ready`).
    first_upstreams: Option<(Vec<crate::config::UpstreamConfig>, Pins)>,
    first_protected: Option<Vec<std::path::PathBuf>>,
}

impl Process {
    fn spawn_chores(&self, describe: Arc<dyn Fn() -> String + Send + Sync>) {
        let stop = &self.chores_stop;
        self.chores.spawn(chores::refresh_status(
            self.svc.clone(),
            self.store.clone(),
            self.board.clone(),
            describe.clone(),
            stop.clone(),
        ));
        if let Some(period) = sd_notify::watchdog_enabled() {
            self.chores.spawn(chores::watchdog(
                self.store.clone(),
                self.board.clone(),
                describe,
                period,
                stop.clone(),
            ));
        }
        self.chores
            .spawn(chores::sweep_artifacts(self.svc.clone(), stop.clone()));
    }

    async fn ready(&mut self, describe: Arc<dyn Fn() -> String + Send + Sync>) {
        // The last reload's outcome stays on the STATUS line.
        let last = self.reload.last.clone();
        let describe: Arc<dyn Fn() -> String + Send + Sync> =
            Arc::new(move || match lock(&last).as_deref() {
                Some(reload) => format!("{}; {reload}", describe()),
                None => describe(),
            });
        // Connecting happens in the background: no upstream delays READY.
        if let Some((configs, pins)) = self.first_upstreams.take() {
            let protected = self.first_protected.take().unwrap_or_default();
            self.upstreams.apply(&configs, &pins, protected).await;
        }
        let status = chores::status_line(&self.svc, &self.store, &describe()).await;
        self.board.ready(&status);
        self.describe = Some(describe.clone());
        self.spawn_chores(describe);
    }

    /// Serves reloads, signalled or asked for on the admin socket, until a
    /// stop signal comes.
    async fn until_stop(&mut self) {
        loop {
            tokio::select! {
                heard = self.control.recv() => match heard {
                    Heard::Stop => return,
                    Heard::Reload => {
                        // The outcome is in the log and on the STATUS line.
                        let _ = self.reload_configuration().await;
                    }
                },
                Some(reply) = self.reload_requests.recv() => {
                    let outcome = self.reload_configuration().await;
                    // A caller that went away has missed nothing the log
                    // does not say.
                    let _ = reply.send(outcome);
                }
            }
        }
    }

    async fn run_http(
        &mut self,
        listener: TcpListener,
        app: http::App,
        config: &Config,
        state_dir: String,
    ) -> Result<(), Refusal> {
        let local = listener
            .local_addr()
            .map_err(|e| Refusal::new(ExitClass::Io, e.to_string()))?;
        let drain = app.drain();
        let sessions = app.sessions();
        self.chores.spawn(chores::return_memory_after_sessions(
            sessions.clone(),
            chores::MEMORY_CHORE_INTERVAL.min(config.server.session_idle),
            self.chores_stop.clone(),
        ));
        let listener_stop = CancellationToken::new();
        let server = {
            let stop = listener_stop.clone();
            tokio::spawn(http::run(
                LimitedListener::new(listener, config.server.max_connections),
                app.router,
                config.server.header_read_timeout,
                self.tls.clone(),
                async move { stop.cancelled().await },
            ))
        };
        tracing::info!(
            message_id = crate::events::READY,
            listen = %local,
            "serving MCP over HTTP at http://{local}/mcp"
        );
        self.admin.start(
            self.ops.clone(),
            local.to_string(),
            self.reload_sender.clone(),
        );
        self.ready(Arc::new(move || {
            format!("serving on {local}; state {state_dir}")
        }))
        .await;

        self.until_stop().await;
        self.begin_stopping();
        // Tools first, while clients can still poll their tasks' ends.
        self.svc.stop_running(self.svc.stop_limit()).await;
        // Then the listener: in-flight requests finish with their answers
        // before streams and sessions are ended.
        listener_stop.cancel();
        if !drain.idle(HTTP_DRAIN_LIMIT).await {
            tracing::warn!("HTTP requests still in flight after {HTTP_DRAIN_LIMIT:?}; ending them");
        }
        drain.end_streams();
        let abort = server.abort_handle();
        match tokio::time::timeout(HTTP_CLOSE_LIMIT, server).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "HTTP server ended with an error: {e}"),
            Ok(Err(e)) => tracing::warn!(error = %e, "HTTP server task failed: {e}"),
            Err(_) => {
                tracing::warn!("HTTP connections did not close in time; dropping them");
                abort.abort();
            }
        }
        self.finish().await;
        Ok(())
    }

    fn begin_stopping(&mut self) {
        // Admission ends before STOPPING=1 goes out: a call that arrives once
        // stopping has been announced is refused, never started.
        self.svc.stop_admitting();
        // Reloads asked for and not yet run: their callers hear at once
        // that nothing was reloaded (their reply is dropped).
        self.reload_requests.close();
        while self.reload_requests.try_recv().is_ok() {}
        self.board.stopping();
        tracing::info!("stopping: no new calls are admitted");
    }

    /// The upstreams are closed (their calls were stopped with the tools),
    /// the chores end, then the store closes with its final checkpoint.
    async fn finish(&mut self) {
        if self.owns_upstreams {
            self.upstreams.stop_all().await;
        }
        self.chores_stop.cancel();
        self.chores.close();
        self.chores.wait().await;
        // Answered until here, so `status` shows the stop; a snapshot being
        // written finishes first (bounded), then the socket file goes.
        self.admin.stop().await;
        let closed = self.store.shutdown().await;
        // A snapshot the closing store abandoned removes its copy first.
        self.admin.after_store_closed().await;
        match closed {
            Ok(()) => tracing::info!("stopped cleanly"),
            Err(e) => tracing::warn!(error = %e, "store shutdown incomplete: {e}"),
        }
    }
}

/// Applies a validated log filter. It parsed when the configuration was
/// loaded, so a failure here is a logger that was never installed (the
/// filter stays as it was, and says so).
fn set_log_filter(filter: &str) {
    match crate::logging::apply_filter(filter) {
        Ok(true) => tracing::info!(filter, "log filter {}: {filter}", keys::LOG_FILTER.dotted()),
        Ok(false) => {}
        Err(e) => tracing::warn!(error = %e, "log filter unchanged: {e}"),
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
