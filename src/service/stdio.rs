//! Serving MCP over stdio: the screened line pump between the process's
//! stdio and the protocol library, and its stop.

use std::sync::Arc;

use super::{HTTP_CLOSE_LIMIT, Process};
use crate::exit::Refusal;
use crate::mcp::{self, Handler};

impl Process {
    pub(super) async fn run_stdio(
        &mut self,
        state_dir: String,
        max_line_bytes: usize,
    ) -> Result<(), Refusal> {
        use rmcp::ServiceExt;
        use rmcp::service::ServerInitializeError;
        tracing::info!(
            message_id = crate::events::READY,
            listen = "stdio",
            "serving MCP over stdio"
        );
        self.admin
            .start(self.ops.clone(), "stdio".into(), self.reload_sender.clone());
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
}
