//! The serving process: startup in order, systemd notification (READY,
//! STATUS, WATCHDOG, STOPPING), signals and the shutdown order.
//!
//! Shutdown: STOPPING=1, stop admitting (the HTTP server stops accepting and
//! drains), then the store's final TRUNCATE checkpoint, then exit 0.

use std::net::SocketAddr;
use std::time::Duration;

use sd_notify::NotifyState;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::config::{Config, Overrides};
use crate::exit::{ExitClass, Refusal};
use crate::http::{self, HttpState};
use crate::startup;
use crate::store::{Store, StoreError, StoreOptions};

/// How often STATUS= is refreshed with current counts.
const STATUS_REFRESH: Duration = Duration::from_secs(10);

/// Sends states to the service manager; a no-op without `NOTIFY_SOCKET`.
pub fn notify(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, "cannot notify the service manager");
    }
}

/// Runs `taskgate serve` to completion.
pub fn serve(overrides: &Overrides) -> Result<(), Refusal> {
    let config = Config::load(overrides)?;
    refuse_unauthenticated_exposure(config.server.listen)?;
    let claimed = startup::claim(&config)?;
    let options = StoreOptions::from_settings(&claimed.dir.db_path(), &config.store);
    let (store, report) = Store::open(options)?;
    tracing::info!(
        state_dir = %claimed.dir.path().display(),
        initialized = report.initialized,
        migrated_from = ?report.migrated_from,
        recovered = report.recovered,
        retained = report.retained,
        unexpired = report.unexpired,
        "task store open"
    );
    if report.recovered > 0 {
        tracing::warn!(
            recovered = report.recovered,
            "tasks that were running when the daemon stopped are now failed; none was re-run"
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
    let result = runtime.block_on(run(config, store, state_dir));
    // The lock is released only when the process is done with the files.
    drop(claimed);
    result
}

/// Authentication arrives later; until then only loopback is served.
fn refuse_unauthenticated_exposure(addr: SocketAddr) -> Result<(), Refusal> {
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

async fn run(config: Config, store: Store, state_dir: String) -> Result<(), Refusal> {
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
    let (stop_tx, stop_rx) = watch::channel(false);

    let router = http::router(HttpState {
        store: store.clone(),
    });
    let mut server_stop = stop_rx.clone();
    let server = tokio::spawn(http::run(listener, router, async move {
        let _ = server_stop.wait_for(|s| *s).await;
    }));

    let status = status_line(&store, &state_dir, local).await;
    notify(&[NotifyState::Ready, NotifyState::Status(&status)]);
    tracing::info!(listen = %local, "serving");

    tokio::spawn(refresh_status(
        store.clone(),
        state_dir.clone(),
        local,
        stop_rx.clone(),
    ));
    if let Some(period) = sd_notify::watchdog_enabled() {
        tokio::spawn(watchdog(store.clone(), period, stop_rx.clone()));
    }

    wait_for_signal().await;
    notify(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
    tracing::info!("stopping: no new requests are admitted");
    let _ = stop_tx.send(true);
    match server.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "HTTP server ended with an error"),
        Err(e) => tracing::warn!(error = %e, "HTTP server task failed"),
    }
    match store.shutdown().await {
        Ok(()) => tracing::info!("stopped cleanly"),
        Err(e) => tracing::warn!(error = %e, "store shutdown incomplete"),
    }
    Ok(())
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

async fn status_line(store: &Store, state_dir: &str, listen: SocketAddr) -> String {
    if let Some(reason) = store.disabled_reason() {
        return format!(
            "DEGRADED: task store disabled until restart ({reason}); state {state_dir}; listening on {listen}"
        );
    }
    match store.stats().await {
        Ok(s) => format!(
            "serving on {listen}; state {state_dir}; tasks retained {}, unexpired {}",
            s.retained, s.unexpired
        ),
        Err(e) => format!("serving on {listen}; state {state_dir}; task counts unavailable: {e}"),
    }
}

async fn refresh_status(
    store: Store,
    state_dir: String,
    listen: SocketAddr,
    mut stop: watch::Receiver<bool>,
) {
    let mut last = String::new();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(STATUS_REFRESH) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let line = status_line(&store, &state_dir, listen).await;
        if line != last {
            notify(&[NotifyState::Status(&line)]);
            last = line;
        }
    }
}

/// Pings the watchdog at half its period, but only while the store thread
/// answers: a hung store thread lets systemd restart the daemon.
async fn watchdog(store: Store, period: Duration, mut stop: watch::Receiver<bool>) {
    let interval = period / 2;
    let mut last_progress = store.progress();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.wait_for(|s| *s) => return,
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
