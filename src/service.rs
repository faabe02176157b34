//! The serving process: startup in order, systemd notification (READY,
//! STATUS, WATCHDOG, RELOADING, STOPPING), signals, configuration reloads
//! and the shutdown order.
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

use std::sync::Arc;
use std::time::Duration;

use sd_notify::NotifyState;
use tokio::net::TcpListener;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admin::server::Admin;
use crate::admin::{AdminError, ReloadReply, Reloaded};
use crate::auth::{AuthError, Authenticator};
use crate::config::{Config, Overrides, keys};
use crate::exit::{ExitClass, Refusal};
use crate::http::tls::Tls;
use crate::http::{self, BoundedSessions, LimitedListener};
use crate::mcp::{self, Handler};
use crate::startup;
use crate::store::{Store, StoreError};
use crate::tasks::{Limits, TaskService};
use crate::tools::{Registry, Runner};

/// How many recovered task IDs the startup log names.
const RECOVERED_IDS_LOGGED: usize = 16;
/// How often STATUS= is refreshed with current counts.
const STATUS_REFRESH: Duration = Duration::from_secs(10);
/// How often spilled artifacts of expired tasks are looked for.
const ARTIFACT_SWEEP_INTERVAL: Duration = Duration::from_secs(60);
/// Artifacts examined per sweep.
const ARTIFACT_SWEEP_BATCH: usize = 256;
/// How often (at most) the count of legacy sessions is looked at, to give
/// memory back after sessions closed; more often when they expire sooner.
const MEMORY_CHORE_INTERVAL: Duration = Duration::from_secs(10);
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

/// SIGTERM and SIGINT (stop) and SIGHUP (reload), caught from before
/// startup until the process ends.
struct StopSignals {
    term: Signal,
    int: Signal,
    hup: Signal,
}

/// What the main loop heard.
enum Heard {
    Stop,
    Reload,
}

impl StopSignals {
    /// Must run inside the runtime. From here on no signal kills the
    /// process: one that arrives during startup is seen once serving begins.
    fn install() -> Result<StopSignals, Refusal> {
        let install = |kind: SignalKind, name: &str| {
            signal(kind).map_err(|e| {
                Refusal::new(
                    ExitClass::Io,
                    format!("cannot install the {name} handler: {e}"),
                )
            })
        };
        Ok(StopSignals {
            term: install(SignalKind::terminate(), "SIGTERM")?,
            int: install(SignalKind::interrupt(), "SIGINT")?,
            hup: install(SignalKind::hangup(), "SIGHUP")?,
        })
    }

    async fn recv(&mut self) -> Heard {
        tokio::select! {
            _ = self.term.recv() => tracing::info!("SIGTERM received"),
            _ = self.int.recv() => tracing::info!("SIGINT received"),
            _ = self.hup.recv() => {
                tracing::info!("SIGHUP received: reloading the configuration");
                return Heard::Reload;
            }
        }
        Heard::Stop
    }
}

/// What a reload needs: how the daemon was started, and the configuration
/// it started with (startup-only keys are compared with that one, so a
/// refused change is named again at every reload until a restart).
struct Reload {
    overrides: Overrides,
    builtins: Vec<Arc<dyn Runner>>,
    started: Config,
    /// The configuration the last applied reload read (at first the one
    /// the daemon started with): reloadable keys and tools are reported as
    /// changed against it.
    applied: Config,
    /// Reloads so far; numbered on the STATUS line, so that a reader can
    /// tell one reload's outcome from the previous one's.
    count: u64,
    /// The outcome of the last reload, for the STATUS line.
    last: Arc<std::sync::Mutex<Option<String>>>,
}

/// Runs `taskgate serve` to completion. `builtins` are tools served beside
/// the configured ones (the benchmark's no-op tool, under `taskgate bench`).
pub fn serve(
    overrides: &Overrides,
    transport: Transport,
    builtins: Vec<Arc<dyn Runner>>,
) -> Result<(), Refusal> {
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

    for b in &builtins {
        tracing::warn!(tool = %b.spec().name, "serving a built-in test tool: {}", b.spec().name);
    }
    let startup::Effective {
        config,
        tools,
        auth,
        tls,
    } = startup::effective(overrides, builtins.clone())?;
    if transport == Transport::Stdio
        && config
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
    let auth = auth.map(Arc::new);
    let tls = tls.map(Arc::new);
    // From here on the configured filter applies (the logger started with
    // `TASKGATE_LOG` or the default, before any configuration was read).
    set_log_filter(&config.log.filter);
    let reload = Reload {
        overrides: overrides.clone(),
        builtins,
        started: config.clone(),
        applied: config.clone(),
        count: 0,
        last: Arc::default(),
    };
    // Bound before the store opens: an address in use is refused before
    // anything in the state directory is touched.
    let listener = match transport {
        Transport::Http => Some(runtime.block_on(bind(&config))?),
        Transport::Stdio => None,
    };
    let mut serving = startup::open_serving(&config)?;
    // The lock is held: a socket file a killed daemon left is replaced.
    let admin = Admin::bind(
        &mut serving.claimed.lock,
        serving.claimed.dir.path(),
        &config,
    );
    let report = &serving.report;
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
    let state_dir = serving.claimed.dir.path().display().to_string();
    let (reload_sender, reload_requests) = mpsc::channel(RELOAD_QUEUE);
    let result = runtime.block_on(async {
        let mut process = Process {
            svc,
            signals,
            reload,
            reload_sender,
            reload_requests,
            describe: None,
            board: Arc::new(StatusBoard::default()),
            chores: TaskTracker::new(),
            chores_stop: CancellationToken::new(),
            admin,
            auth,
            tls,
        };
        match listener {
            Some(listener) => process.run_http(listener, &config, state_dir).await,
            None => {
                process
                    .run_stdio(state_dir, config.server.max_request_bytes)
                    .await
            }
        }
    });
    // The lock is released only when the process is done with the files.
    drop(serving.claimed);
    result
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
    signals: StopSignals,
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
}

impl Process {
    fn spawn_chores(&self, describe: Arc<dyn Fn() -> String + Send + Sync>) {
        let stop = &self.chores_stop;
        self.chores.spawn(refresh_status(
            self.svc.clone(),
            self.board.clone(),
            describe.clone(),
            stop.clone(),
        ));
        if let Some(period) = sd_notify::watchdog_enabled() {
            self.chores.spawn(watchdog(
                self.svc.store().clone(),
                self.board.clone(),
                describe,
                period,
                stop.clone(),
            ));
        }
        self.chores
            .spawn(sweep_artifacts(self.svc.clone(), stop.clone()));
    }

    async fn ready(&mut self, describe: Arc<dyn Fn() -> String + Send + Sync>) {
        // The last reload's outcome stays on the STATUS line.
        let last = self.reload.last.clone();
        let describe: Arc<dyn Fn() -> String + Send + Sync> =
            Arc::new(move || match lock(&last).as_deref() {
                Some(reload) => format!("{}; {reload}", describe()),
                None => describe(),
            });
        let status = status_line(&self.svc, &describe()).await;
        self.board.ready(&status);
        self.describe = Some(describe.clone());
        self.spawn_chores(describe);
    }

    /// Serves reloads, signalled or asked for on the admin socket, until a
    /// stop signal comes.
    async fn until_stop(&mut self) {
        loop {
            tokio::select! {
                heard = self.signals.recv() => match heard {
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

    /// One reload, between RELOADING=1 and READY=1 (systemd's reload
    /// protocol: MONOTONIC_USEC ties the two to this reload). The one code
    /// path for SIGHUP and `taskgate reload`.
    async fn reload_configuration(&mut self) -> Result<Reloaded, AdminError> {
        match NotifyState::monotonic_usec_now() {
            Ok(now) => notify(&[NotifyState::Reloading, now]),
            Err(_) => notify(&[NotifyState::Reloading]),
        }
        self.reload.count += 1;
        let number = self.reload.count;
        let outcome = match startup::effective(&self.reload.overrides, self.reload.builtins.clone())
        {
            Err(refusal) => {
                tracing::error!(
                    "configuration reload refused: {}; still running on the previous configuration",
                    refusal.message
                );
                Err(AdminError::new(
                    refusal.class,
                    format!(
                        "reload {number} refused: {}; the daemon goes on with its previous configuration",
                        refusal.message
                    ),
                ))
            }
            Ok(mut new) => match self.renew_credentials(&mut new) {
                Err(refusal) => {
                    tracing::error!(
                        "configuration reload refused: {}; still running on the previous configuration",
                        refusal.message
                    );
                    Err(AdminError::new(
                        refusal.class,
                        format!(
                            "reload {number} refused: {}; the daemon goes on with its previous configuration",
                            refusal.message
                        ),
                    ))
                }
                Ok(()) => Ok(self.apply(number, new)),
            },
        };
        let summary = match &outcome {
            Err(_) => "refused (invalid configuration; see the log)".to_string(),
            Ok(done) if done.kept.is_empty() => "applied".to_string(),
            Ok(done) => format!(
                "applied, except startup-only {} (restart to apply)",
                done.kept.join(", ")
            ),
        };
        *lock(&self.reload.last) = Some(format!("reload {number} {summary}"));
        let describe = self.describe.clone();
        let status = match describe {
            Some(describe) => status_line(&self.svc, &describe()).await,
            None => String::new(),
        };
        self.board.ready(&status);
        outcome
    }

    /// The reload's credential step, before anything else is applied: the
    /// TLS pair is read again and the validated credential set swapped in.
    /// Turning authentication on or off is refused (it changes who every
    /// open session acts as; a restart does it), and so is a TLS pair that
    /// does not load, keeping the one in force.
    fn renew_credentials(&mut self, new: &mut startup::Effective) -> Result<(), Refusal> {
        if let Some(tls) = &self.tls {
            tls.reload().map_err(Refusal::from)?;
        }
        match (&self.auth, new.auth.take()) {
            (Some(running), Some(fresh)) => {
                let summary = running.adopt(fresh);
                tracing::info!("credentials reloaded: {summary}");
                Ok(())
            }
            (None, None) => Ok(()),
            (Some(_), None) => Err(AuthError::OnOff("off").into()),
            (None, Some(_)) => Err(AuthError::OnOff("on").into()),
        }
    }

    /// Applies a validated configuration: the reloadable parts go to new
    /// calls, a changed startup-only key is named and left as it started.
    /// Returns what changed, for the caller of `taskgate reload`.
    fn apply(&mut self, number: u64, new: startup::Effective) -> Reloaded {
        let mut kept = Vec::new();
        let mut kept_lines = Vec::new();
        for change in self.reload.started.changes(&new.config) {
            if change.key.is_startup_only() {
                tracing::warn!(
                    key = %change.key.dotted(),
                    "configuration reload: {} = {} in the new configuration, but it applies at start only; keeping {} until a restart",
                    change.key.dotted(),
                    change.new,
                    change.old
                );
                kept_lines.push(format!(
                    "not applied: {} = {} applies at start only; the daemon keeps {} until a restart",
                    change.key.dotted(),
                    change.new,
                    change.old
                ));
                kept.push(change.key.dotted());
            }
        }
        // Reloadable keys, against what the previous reload applied.
        let mut changed: Vec<String> = self
            .reload
            .applied
            .changes(&new.config)
            .into_iter()
            .filter(|c| !c.key.is_startup_only())
            .map(|c| format!("changed: {} {} -> {}", c.key.dotted(), c.old, c.new))
            .collect();
        let names = |r: &Registry| -> std::collections::BTreeSet<String> {
            r.specs().map(|s| s.name.clone()).collect()
        };
        let before = names(&self.svc.tools());
        let after = names(&new.tools);
        let added: Vec<&String> = after.difference(&before).collect();
        let removed: Vec<&String> = before.difference(&after).collect();
        // A tool of the same name whose definition differs in the file.
        let redefined: Vec<&String> = new
            .config
            .tools
            .iter()
            .filter(|t| {
                self.reload
                    .applied
                    .tools
                    .iter()
                    .any(|old| old.name == t.name && *old != **t)
            })
            .map(|t| &t.name)
            .collect();
        if !(added.is_empty() && removed.is_empty() && redefined.is_empty()) {
            changed.push(format!(
                "changed: tools (added: {}; removed: {}; redefined: {})",
                list(&added),
                list(&removed),
                list(&redefined)
            ));
        }
        let poll_interval = new.config.tasks.poll_interval;
        tracing::info!(
            tools = after.len(),
            "configuration reloaded: {} tools (added: {}; removed: {}; redefined: {}), {} = {} ms; running tasks keep the tools they started with",
            after.len(),
            list(&added),
            list(&removed),
            list(&redefined),
            keys::TASKS_POLL_INTERVAL_MS.dotted(),
            poll_interval.as_millis()
        );
        new.tools.log_confinement();
        self.svc.reload(new.tools, poll_interval);
        set_log_filter(&new.config.log.filter);
        self.reload.applied = new.config;

        let mut lines = vec![if kept.is_empty() {
            format!("reload {number}: applied")
        } else {
            format!(
                "reload {number}: applied, except startup-only {} (restart to apply)",
                kept.join(", ")
            )
        }];
        if changed.is_empty() {
            lines.push("no reloadable setting or tool changed".to_string());
        }
        lines.extend(changed);
        lines.extend(kept_lines);
        lines.push("running tasks keep the tool definitions they started with".to_string());
        Reloaded {
            number,
            kept,
            lines,
        }
    }

    async fn run_http(
        &mut self,
        listener: TcpListener,
        config: &Config,
        state_dir: String,
    ) -> Result<(), Refusal> {
        let local = listener
            .local_addr()
            .map_err(|e| Refusal::new(ExitClass::Io, e.to_string()))?;
        let app = http::App::with_auth(self.svc.clone(), &config.server, self.auth.clone());
        let drain = app.drain();
        let sessions = app.sessions();
        self.chores.spawn(return_memory_after_sessions(
            sessions.clone(),
            MEMORY_CHORE_INTERVAL.min(config.server.session_idle),
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
            self.svc.clone(),
            local.to_string(),
            Some(sessions),
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

    async fn run_stdio(&mut self, state_dir: String, max_line_bytes: usize) -> Result<(), Refusal> {
        use rmcp::ServiceExt;
        use rmcp::service::ServerInitializeError;
        tracing::info!(
            message_id = crate::events::READY,
            listen = "stdio",
            "serving MCP over stdio"
        );
        self.admin.start(
            self.svc.clone(),
            "stdio".into(),
            None,
            self.reload_sender.clone(),
        );
        // Ready as soon as stdin is read: the client speaks first.
        self.ready(Arc::new(move || {
            format!("serving on stdio; state {state_dir}")
        }))
        .await;

        // Malformed lines are answered by the screen; the library sees only
        // well-formed ones.
        let (stdin, stdout) = rmcp::transport::stdio();
        let (transport, pump) = mcp::stdio::screened(stdin, stdout, max_line_bytes);
        let pump = tokio::spawn(pump);
        let serving = Handler::for_stdio(self.svc.clone()).serve(transport);
        let running = tokio::select! {
            _ = self.until_stop() => None,
            r = serving => match r {
                Ok(running) => Some(running),
                // The client left before its first lifecycle request: a normal end.
                Err(ServerInitializeError::ConnectionClosed(_)) => {
                    tracing::info!("stdio client went away");
                    None
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot serve on stdio: {e}");
                    None
                }
            },
        };
        // The session still running when a signal came: ended after the tools.
        let mut session = None;
        if let Some(running) = running {
            let cancel = running.cancellation_token();
            let mut waiting = Box::pin(running.waiting());
            tokio::select! {
                _ = self.until_stop() => session = Some((cancel, waiting)),
                r = &mut waiting => match r {
                    Ok(reason) => tracing::info!(?reason, "stdio client went away ({reason:?})"),
                    Err(e) => tracing::warn!(error = %e, "stdio service ended with an error: {e}"),
                },
            }
        }
        self.begin_stopping();
        self.svc.stop_running(self.svc.stop_limit()).await;
        if let Some((cancel, waiting)) = session {
            cancel.cancel();
            let _ = tokio::time::timeout(HTTP_CLOSE_LIMIT, waiting).await;
        }
        // The library has closed its side: the pump writes what is left.
        match tokio::time::timeout(HTTP_CLOSE_LIMIT, pump).await {
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "writing to stdout failed: {e}"),
            Ok(_) => {}
            Err(_) => tracing::warn!("stdout did not take the last answers in time"),
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

    /// The chores end, then the store closes with its final checkpoint.
    async fn finish(&mut self) {
        self.chores_stop.cancel();
        self.chores.close();
        self.chores.wait().await;
        // Answered until here, so `status` shows the stop; a snapshot being
        // written finishes first (bounded), then the socket file goes.
        self.admin.stop().await;
        let closed = self.svc.store().shutdown().await;
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

/// `a, b` or `none`.
fn list(names: &[&String]) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names
            .iter()
            .map(|n| n.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Ticks every `period`, the first one `period` from now; a late tick
/// delays the next rather than bursting to catch up.
async fn ticker(period: Duration) -> tokio::time::Interval {
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    ticks
}

async fn status_line(svc: &TaskService, where_: &str) -> String {
    let store = svc.store();
    // Calls that wanted a task and ran synchronously: said only when any did.
    let fallbacks = match svc.fallbacks() {
        f if f.total() == 0 => String::new(),
        f => format!("; {f}"),
    };
    if let Some(reason) = store.disabled_reason() {
        return format!(
            "DEGRADED: task store disabled until restart ({reason}); {where_}{fallbacks}"
        );
    }
    match store.stats().await {
        Ok(s) => format!(
            "{where_}; tasks retained {}, unexpired {}, running {}{fallbacks}",
            s.retained,
            s.unexpired,
            svc.running_count()
        ),
        Err(e) => format!("{where_}; task counts unavailable: {e}{fallbacks}"),
    }
}

async fn refresh_status(
    svc: Arc<TaskService>,
    board: Arc<StatusBoard>,
    describe: Arc<dyn Fn() -> String + Send + Sync>,
    stop: CancellationToken,
) {
    let mut ticks = ticker(STATUS_REFRESH).await;
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            // A fallback shows at once, not at the next tick.
            _ = svc.fallback_noted() => {}
            // So do the counts again once the watchdog's notice is over.
            _ = board.resumed.notified() => {}
            _ = stop.cancelled() => return,
        }
        let generation = board.generation();
        let line = status_line(&svc, &describe()).await;
        board.publish(&line, generation);
    }
}

/// The one sender of STATUS= while serving. The refresh chore's counts and
/// the watchdog's notice both go through it, so that counts (built while
/// the store still answered, or saying it was too busy to count) never
/// replace the notice that pings are being withheld, and nothing replaces
/// STATUS=stopping.
#[derive(Default)]
struct StatusBoard {
    state: std::sync::Mutex<BoardState>,
    /// Wakes the refresh chore when pings resume.
    resumed: Notify,
}

#[derive(Default)]
struct BoardState {
    /// The last STATUS= sent.
    last: String,
    /// The watchdog withholds its pings: its notice is the status.
    withheld: bool,
    /// Counts every start and end of a withheld stretch: a line built
    /// across one is stale.
    generation: u64,
    /// STOPPING=1 went out.
    stopping: bool,
}

impl StatusBoard {
    fn generation(&self) -> u64 {
        lock(&self.state).generation
    }

    /// READY=1 with `status`, or alone while the watchdog's notice stands.
    fn ready(&self, status: &str) {
        let mut state = lock(&self.state);
        if state.withheld || state.stopping {
            notify(&[NotifyState::Ready]);
        } else {
            notify(&[NotifyState::Ready, NotifyState::Status(status)]);
            state.last = status.to_string();
        }
    }

    /// A refreshed status line, built after `generation` was read.
    fn publish(&self, line: &str, generation: u64) {
        let mut state = lock(&self.state);
        if state.withheld || state.stopping || state.generation != generation {
            return;
        }
        if state.last != line {
            notify(&[NotifyState::Status(line)]);
            state.last = line.to_string();
        }
    }

    /// The watchdog withheld a ping: `notice` is the status, sent for every
    /// ping withheld (it says for how long the store has been silent).
    fn withhold(&self, notice: &str) {
        let mut state = lock(&self.state);
        if state.stopping {
            return;
        }
        if !state.withheld {
            state.withheld = true;
            state.generation += 1;
        }
        notify(&[NotifyState::Status(notice)]);
        state.last = notice.to_string();
    }

    /// Pings go out again: the refresh chore puts the counts back. True
    /// when pings had been withheld.
    fn resume(&self) -> bool {
        let mut state = lock(&self.state);
        if !state.withheld {
            return false;
        }
        state.withheld = false;
        state.generation += 1;
        self.resumed.notify_one();
        true
    }

    fn stopping(&self) {
        let mut state = lock(&self.state);
        state.stopping = true;
        notify(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
        state.last = "stopping".to_string();
    }
}

async fn sweep_artifacts(svc: Arc<TaskService>, stop: CancellationToken) {
    let mut ticks = ticker(ARTIFACT_SWEEP_INTERVAL).await;
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stop.cancelled() => return,
        }
        svc.sweep_artifacts(ARTIFACT_SWEEP_BATCH).await;
    }
}

/// Gives memory back to the system once legacy sessions have closed.
///
/// glibc keeps what its per-thread arenas freed for reuse, so a burst of
/// sessions (up to `server.max_sessions`, tens of KiB each) would otherwise
/// keep the process at its peak size long after they expired. When fewer
/// sessions are open than at their peak since the last look, the free
/// memory is returned with `malloc_trim`.
async fn return_memory_after_sessions(
    sessions: Arc<BoundedSessions>,
    every: Duration,
    stop: CancellationToken,
) {
    let mut ticks = ticker(every).await;
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stop.cancelled() => return,
        }
        let (peak, open) = sessions.take_peak().await;
        if open < peak {
            return_freed_memory();
            tracing::debug!(peak, open, "legacy sessions closed; free memory returned");
        }
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn return_freed_memory() {
    // SAFETY: malloc_trim takes no pointers; it only walks glibc's own free
    // lists, under the allocator's locks, and is safe from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn return_freed_memory() {}

/// Pings the watchdog at half its period, but only while the store thread
/// answers: a hung store thread lets systemd restart the daemon. Each ping
/// withheld replaces STATUS= with a notice saying so (`systemctl status`
/// then shows why the watchdog will fire); the counts come back with the
/// first ping after it.
async fn watchdog(
    store: Store,
    board: Arc<StatusBoard>,
    describe: Arc<dyn Fn() -> String + Send + Sync>,
    period: Duration,
    stop: CancellationToken,
) {
    let interval = period / 2;
    let mut ticks = ticker(interval).await;
    let mut last_progress = store.progress();
    let mut answered = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stop.cancelled() => return,
        }
        let alive = match tokio::time::timeout(interval, store.ping()).await {
            Ok(Ok(())) => true,
            // A full queue is busy, not hung, if the thread moved since.
            Ok(Err(StoreError::Busy { .. })) => store.progress() != last_progress,
            _ => false,
        };
        last_progress = store.progress();
        if alive {
            let silent = answered.elapsed();
            answered = tokio::time::Instant::now();
            notify(&[NotifyState::Watchdog]);
            if board.resume() {
                tracing::warn!(
                    silent_ms = silent.as_millis() as u64,
                    "the store thread answers again after {:.1} s; watchdog pings resumed",
                    silent.as_secs_f64()
                );
            }
        } else {
            let silent = answered.elapsed();
            tracing::error!(
                silent_ms = silent.as_millis() as u64,
                "the store thread has not answered for {:.1} s; withholding the watchdog ping",
                silent.as_secs_f64()
            );
            board.withhold(&withheld_notice(silent, &describe()));
        }
    }
}

/// The STATUS= line while the watchdog withholds its pings.
fn withheld_notice(silent: Duration, where_: &str) -> String {
    format!(
        "WATCHDOG WITHHELD: the task store has not answered for {:.1} s, so no watchdog ping is sent and systemd restarts taskgate once WatchdogSec passes without one; check the disk holding the state directory (a hung or failing disk stalls the store) and the journal; {where_}",
        silent.as_secs_f64()
    )
}
