//! The serving process: startup in order, systemd notification (READY,
//! STATUS, WATCHDOG, STOPPING), signals and the shutdown order.
//!
//! Shutdown: STOPPING=1; stop admitting (the HTTP listener closes, stdio
//! stops reading); every running tool is stopped and its task recorded as
//! failed (interrupted); then the store's final TRUNCATE checkpoint; exit 0.

use std::sync::Arc;
use std::time::Duration;

use sd_notify::NotifyState;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, Overrides};
use crate::exec::Registry;
use crate::exit::{ExitClass, Refusal};
use crate::http::{self, LimitedListener};
use crate::mcp::{Handler, TaskService};
use crate::startup;
use crate::store::{Store, StoreError};

/// How often STATUS= is refreshed with current counts.
const STATUS_REFRESH: Duration = Duration::from_secs(10);
/// How often spilled artifacts of expired tasks are looked for.
const ARTIFACT_SWEEP_INTERVAL: Duration = Duration::from_secs(60);
/// Artifacts examined per sweep.
const ARTIFACT_SWEEP_BATCH: usize = 256;

/// Sends states to the service manager; a no-op without `NOTIFY_SOCKET`.
pub fn notify(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, "cannot notify the service manager");
    }
}

/// Which transport serves the clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Http,
    Stdio,
}

/// Runs `taskgate serve` to completion.
pub fn serve(overrides: &Overrides, transport: Transport, bench_tool: bool) -> Result<(), Refusal> {
    let config = Config::load(overrides)?;
    if transport == Transport::Http {
        refuse_unauthenticated_exposure(&config)?;
    }
    let tools = Registry::build(&config.tools)?;
    let startup::Serving {
        claimed,
        store,
        artifacts,
        report,
    } = startup::open_serving(&config)?;
    tracing::info!(
        state_dir = %claimed.dir.path().display(),
        initialized = report.initialized,
        migrated_from = ?report.migrated_from,
        recovered = report.recovered,
        retained = report.retained,
        unexpired = report.unexpired,
        tools = config.tools.len(),
        "task store open"
    );
    if report.recovered > 0 {
        tracing::warn!(
            recovered = report.recovered,
            cancelled = report.cancelled,
            "tasks that were running when the daemon stopped have ended (cancelled if their cancel was committed, failed otherwise); none was re-run"
        );
    }
    let svc = TaskService::new(
        store.clone(),
        tools,
        artifacts,
        config.tasks.clone(),
        config.store.max_live_tasks,
        config.server.max_concurrent_requests,
    );
    if bench_tool {
        svc.enable_bench_tool();
        tracing::warn!(
            "serving the benchmark tool {}",
            crate::mcp::tasks::BENCH_TOOL
        );
    }
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
    let state_dir = claimed.dir.path().display().to_string();
    let result = runtime.block_on(async {
        match transport {
            Transport::Http => run_http(&config, svc, state_dir).await,
            Transport::Stdio => run_stdio(svc, state_dir).await,
        }
    });
    // The lock is released only when the process is done with the files.
    drop(claimed);
    result
}

/// Authentication arrives later; until then only loopback is served.
fn refuse_unauthenticated_exposure(config: &Config) -> Result<(), Refusal> {
    let addr = config.server.listen;
    if addr.ip().is_loopback() {
        Ok(())
    } else {
        Err(Refusal::new(
            ExitClass::Config,
            format!(
                "server.listen = {addr} is not a loopback address and no authentication is configured; listen on 127.0.0.1 or ::1"
            ),
        ))
    }
}

/// Background chores of a serving process, stopped by `stop`.
fn spawn_chores(
    svc: &Arc<TaskService>,
    describe: Arc<dyn Fn() -> String + Send + Sync>,
    stop: &CancellationToken,
) {
    tokio::spawn(refresh_status(svc.clone(), describe, stop.clone()));
    if let Some(period) = sd_notify::watchdog_enabled() {
        tokio::spawn(watchdog(svc.store().clone(), period, stop.clone()));
    }
    let (svc, stop) = (svc.clone(), stop.clone());
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(ARTIFACT_SWEEP_INTERVAL) => {}
                _ = stop.cancelled() => return,
            }
            svc.sweep_artifacts(ARTIFACT_SWEEP_BATCH).await;
        }
    });
}

async fn run_http(
    config: &Config,
    svc: Arc<TaskService>,
    state_dir: String,
) -> Result<(), Refusal> {
    let listener = TcpListener::bind(config.server.listen).await.map_err(|e| {
        Refusal::new(
            ExitClass::Io,
            format!(
                "cannot listen on {}: {e}; choose another address with --listen or server.listen",
                config.server.listen
            ),
        )
    })?;
    let local = listener
        .local_addr()
        .map_err(|e| Refusal::new(ExitClass::Io, e.to_string()))?;
    let stop = CancellationToken::new();
    let router = http::router(svc.clone(), &config.server, stop.child_token());
    let server_stop = stop.clone();
    let server = tokio::spawn(http::run(
        LimitedListener::new(listener, config.server.max_connections),
        router,
        async move { server_stop.cancelled().await },
    ));

    let where_: Arc<dyn Fn() -> String + Send + Sync> =
        Arc::new(move || format!("serving on {local}; state {state_dir}"));
    let status = status_line(&svc, &where_()).await;
    notify(&[NotifyState::Ready, NotifyState::Status(&status)]);
    tracing::info!(listen = %local, "serving MCP over HTTP at /mcp");
    spawn_chores(&svc, where_, &stop);

    wait_for_signal().await;
    begin_stopping();
    // Stop the tools first so that in-flight requests can complete, then
    // let the HTTP server drain.
    svc.shutdown().await;
    stop.cancel();
    match tokio::time::timeout(Duration::from_secs(10), server).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => tracing::warn!(error = %e, "HTTP server ended with an error"),
        Ok(Err(e)) => tracing::warn!(error = %e, "HTTP server task failed"),
        Err(_) => tracing::warn!("HTTP connections did not drain in 10 s; closing them"),
    }
    finish(&svc).await;
    Ok(())
}

async fn run_stdio(svc: Arc<TaskService>, state_dir: String) -> Result<(), Refusal> {
    use rmcp::ServiceExt;
    use rmcp::service::ServerInitializeError;
    let stop = CancellationToken::new();
    let where_: Arc<dyn Fn() -> String + Send + Sync> =
        Arc::new(move || format!("serving on stdio; state {state_dir}"));
    // Ready as soon as stdin is read: the client speaks first.
    let status = status_line(&svc, &where_()).await;
    notify(&[NotifyState::Ready, NotifyState::Status(&status)]);
    tracing::info!("serving MCP over stdio");
    spawn_chores(&svc, where_, &stop);

    let serving = Handler::new(svc.clone()).serve(rmcp::transport::stdio());
    let running = tokio::select! {
        _ = wait_for_signal() => None,
        r = serving => match r {
            Ok(running) => Some(running),
            // The client left before its first lifecycle request: a normal end.
            Err(ServerInitializeError::ConnectionClosed(_)) => {
                tracing::info!("stdio client went away");
                None
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot serve on stdio");
                None
            }
        },
    };
    if let Some(running) = running {
        let cancel = running.cancellation_token();
        tokio::select! {
            _ = wait_for_signal() => {}
            r = running.waiting() => {
                match r {
                    Ok(reason) => tracing::info!(?reason, "stdio client went away"),
                    Err(e) => tracing::warn!(error = %e, "stdio service ended with an error"),
                }
            }
        }
        cancel.cancel();
    }
    begin_stopping();
    svc.shutdown().await;
    stop.cancel();
    finish(&svc).await;
    Ok(())
}

fn begin_stopping() {
    notify(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
    tracing::info!("stopping: no new requests are admitted");
}

async fn finish(svc: &TaskService) {
    match svc.store().shutdown().await {
        Ok(()) => tracing::info!("stopped cleanly"),
        Err(e) => tracing::warn!(error = %e, "store shutdown incomplete"),
    }
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM received"),
                _ = int.recv() => tracing::info!("SIGINT received"),
            }
        }
        _ => {
            tracing::error!("cannot install signal handlers; stopping");
        }
    }
}

async fn status_line(svc: &TaskService, where_: &str) -> String {
    let store = svc.store();
    if let Some(reason) = store.disabled_reason() {
        return format!("DEGRADED: task store disabled until restart ({reason}); {where_}");
    }
    match store.stats().await {
        Ok(s) => format!(
            "{where_}; tasks retained {}, unexpired {}, running {}",
            s.retained,
            s.unexpired,
            svc.running_count()
        ),
        Err(e) => format!("{where_}; task counts unavailable: {e}"),
    }
}

async fn refresh_status(
    svc: Arc<TaskService>,
    describe: Arc<dyn Fn() -> String + Send + Sync>,
    stop: CancellationToken,
) {
    let mut last = String::new();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(STATUS_REFRESH) => {}
            _ = stop.cancelled() => return,
        }
        let line = status_line(&svc, &describe()).await;
        if line != last {
            notify(&[NotifyState::Status(&line)]);
            last = line;
        }
    }
}

/// Pings the watchdog at half its period, but only while the store thread
/// answers: a hung store thread lets systemd restart the daemon.
async fn watchdog(store: Store, period: Duration, stop: CancellationToken) {
    let interval = period / 2;
    let mut last_progress = store.progress();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
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
            notify(&[NotifyState::Watchdog]);
        } else {
            tracing::error!("the store thread is not answering; withholding the watchdog ping");
        }
    }
}
