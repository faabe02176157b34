//! The floor `taskgate bench` compares the daemon with: rmcp's
//! `StreamableHttpService` serving one no-op tool and nothing else.
//!
//! ```text
//! bare_rmcp PORT
//! ```
//!
//! It listens on 127.0.0.1:PORT (0 picks a free port), prints the bound
//! address (`127.0.0.1:PORT`) on one line of stdout once it accepts
//! connections, and serves until it is killed. No sessions: every request
//! is answered on its own, statelessly, with a plain JSON body, the way
//! rmcp serves protocol revision 2026-07-28 (which has no sessions), and
//! the way taskgate answers the same requests. No authentication, no
//! bounds, no store: whatever taskgate spends beyond this is its own.

use std::io::Write as _;
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler};

/// The one tool: it completes at once and does nothing.
const NOOP_TOOL: &str = "noop";

#[derive(Clone)]
struct Bare {
    tools: Arc<Vec<Tool>>,
}

impl ServerHandler for Bare {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools.as_ref().clone()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if request.name != NOOP_TOOL {
            return Err(ErrorData::invalid_params(
                format!("unknown tool {}", request.name),
                None,
            ));
        }
        Ok(CallToolResult::success(vec![ContentBlock::text("ok")]).into())
    }
}

fn usage(msg: &str) -> ! {
    eprintln!("bare_rmcp: {msg}\nusage: bare_rmcp PORT");
    std::process::exit(64)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let port: u16 = match (args.next(), args.next()) {
        (Some(p), None) => p
            .parse()
            .unwrap_or_else(|_| usage(&format!("{p} is not a port"))),
        _ => usage("one argument expected"),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bare_rmcp: runtime: {e}");
            std::process::exit(71)
        }
    };
    if let Err(e) = runtime.block_on(serve(port)) {
        eprintln!("bare_rmcp: {e}");
        std::process::exit(74)
    }
}

async fn serve(port: u16) -> std::io::Result<()> {
    let schema = serde_json::Map::from_iter([("type".to_string(), serde_json::json!("object"))]);
    let tools = Arc::new(vec![Tool::new(
        NOOP_TOOL,
        "Completes at once and does nothing.",
        schema,
    )]);
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true);
    let service = StreamableHttpService::new(
        move || {
            Ok(Bare {
                tools: tools.clone(),
            })
        },
        Arc::new(NeverSessionManager::default()),
        config,
    );
    let router = axum::Router::new().route_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    let mut out = std::io::stdout();
    writeln!(out, "{addr}")?;
    out.flush()?;
    axum::serve(listener, router).await
}
