//! What a serving daemon listens to besides its clients: SIGTERM and
//! SIGINT (stop) and SIGHUP (reload) for `taskgate serve`, or a shutdown
//! future for a daemon run in process.

use std::future::Future;
use std::pin::Pin;

use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::exit::{ExitClass, Refusal};

/// SIGTERM and SIGINT (stop) and SIGHUP (reload), caught from before
/// startup until the process ends.
pub(super) struct StopSignals {
    term: Signal,
    int: Signal,
    hup: Signal,
}

/// What the main loop heard.
pub(super) enum Heard {
    Stop,
    Reload,
}

impl StopSignals {
    /// Must run inside the runtime. From here on no signal kills the
    /// process: one that arrives during startup is seen once serving begins.
    pub(super) fn install() -> Result<StopSignals, Refusal> {
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

    pub(super) async fn recv(&mut self) -> Heard {
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

/// Where stop and reload requests come from.
pub(super) enum Control {
    Signals(StopSignals),
    /// A stop once the future resolves, then no other request.
    Shutdown(Option<Pin<Box<dyn Future<Output = ()> + Send>>>),
}

impl Control {
    pub(super) fn until(shutdown: impl Future<Output = ()> + Send + 'static) -> Control {
        Control::Shutdown(Some(Box::pin(shutdown)))
    }

    pub(super) async fn recv(&mut self) -> Heard {
        match self {
            Control::Signals(signals) => signals.recv().await,
            Control::Shutdown(pending) => match pending {
                Some(shutdown) => {
                    shutdown.as_mut().await;
                    *pending = None;
                    Heard::Stop
                }
                // Already heard: the daemon is stopping.
                None => Heard::Stop,
            },
        }
    }
}
