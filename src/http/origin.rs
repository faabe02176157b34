//! The `Origin` check on `/mcp`, before anything else looks at a request.
//!
//! A browser page can make requests to a loopback daemon (DNS rebinding
//! turns a hostile site's name into 127.0.0.1), and on loopback a request
//! without a credential may act as the local owner. Browsers send `Origin`
//! with such requests; non-browser clients send none. So a request that
//! carries `Origin` is served only when the origin is the daemon's own (the
//! `Host` it was addressed to, when that host is one the daemon answers to)
//! or is listed in `server.allowed_origins`; anything else gets 403 with a
//! JSON-RPC error, whatever the method. A request without `Origin` is not
//! affected.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;

use crate::config::normalize_origin;
use crate::mcp::screen::Refused;
use crate::wire;

/// Longest `Origin` value looked at; a longer one is refused.
const MAX_ORIGIN_BYTES: usize = 1024;

/// Which origins may call.
#[derive(Debug, Clone)]
pub struct OriginPolicy {
    /// `server.allowed_origins`, normalized.
    listed: Arc<Vec<String>>,
    /// The host names and addresses the daemon answers to (the same list
    /// the protocol library's `Host` check uses), lower case.
    own_hosts: Arc<Vec<String>>,
}

impl OriginPolicy {
    pub fn new(listed: &[String], own_hosts: &[String]) -> OriginPolicy {
        OriginPolicy {
            listed: Arc::new(listed.to_vec()),
            own_hosts: Arc::new(
                own_hosts
                    .iter()
                    .map(|h| h.trim_start_matches('[').trim_end_matches(']'))
                    .map(str::to_ascii_lowercase)
                    .collect(),
            ),
        }
    }

    /// Whether a request carrying `origin`, addressed to `host` (its `Host`
    /// header), may be served.
    pub fn allows(&self, origin: &str, host: Option<&str>) -> bool {
        let Some(origin) = normalize_origin(origin) else {
            return false;
        };
        if self.listed.contains(&origin) {
            return true;
        }
        // The daemon's own origin: the page was served from the very
        // authority this request was sent to, and that is a host the
        // daemon answers to (a rebound name is not).
        let Some((scheme, authority)) = origin.split_once("://") else {
            return false;
        };
        let Some(host) = host.and_then(|h| normalize_origin(&format!("{scheme}://{h}"))) else {
            return false;
        };
        let same_authority = host.split_once("://").is_some_and(|(_, a)| a == authority);
        let name = authority
            .rsplit_once(':')
            .map_or(authority, |(name, _)| name)
            .trim_start_matches('[')
            .trim_end_matches(']');
        same_authority && self.own_hosts.iter().any(|h| h == name)
    }
}

/// Refuses a `/mcp` request whose `Origin` may not call (see the module).
pub async fn check_origin(
    State(policy): State<OriginPolicy>,
    request: Request,
    next: Next,
) -> Response {
    let mut origins = request.headers().get_all(header::ORIGIN).iter();
    let Some(first) = origins.next() else {
        return next.run(request).await;
    };
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok());
    let text = first.to_str().ok().filter(|t| t.len() <= MAX_ORIGIN_BYTES);
    let allowed =
        origins.next().is_none() && text.is_some_and(|origin| policy.allows(origin, host));
    if allowed {
        return next.run(request).await;
    }
    let shown: String = text.unwrap_or("(unreadable)").chars().take(200).collect();
    tracing::debug!(origin = %shown, "a request from a browser origin that may not call was refused");
    super::respond::refused(&Refused::new(
        wire::ORIGIN_NOT_ALLOWED,
        format!(
            "requests from the web origin {shown:?} are not allowed; the operator can list it in server.allowed_origins"
        ),
        serde_json::Value::Null,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> OriginPolicy {
        OriginPolicy::new(
            &["https://console.example:8443".to_string()],
            &["localhost".into(), "127.0.0.1".into(), "::1".into()],
        )
    }

    #[test]
    fn the_daemons_own_origin_and_listed_ones_pass() {
        let p = policy();
        assert!(p.allows("http://127.0.0.1:8765", Some("127.0.0.1:8765")));
        assert!(p.allows("http://LOCALHOST:8765", Some("localhost:8765")));
        assert!(p.allows("http://[::1]:8765", Some("[::1]:8765")));
        assert!(p.allows("http://localhost", Some("localhost:80")));
        assert!(p.allows("https://console.example:8443", Some("127.0.0.1:8765")));
    }

    #[test]
    fn other_origins_and_rebound_names_are_refused() {
        let p = policy();
        assert!(!p.allows("http://evil.example", Some("127.0.0.1:8765")));
        // DNS rebinding: the page's own name, pointed at loopback.
        assert!(!p.allows("http://evil.example:8765", Some("evil.example:8765")));
        // Same host, another port: another origin.
        assert!(!p.allows("http://127.0.0.1:9999", Some("127.0.0.1:8765")));
        assert!(!p.allows("http://127.0.0.1:8765", None));
        assert!(!p.allows("null", Some("127.0.0.1:8765")));
        assert!(!p.allows("https://console.example", Some("127.0.0.1:8765")));
        assert!(!p.allows("http://127.0.0.1:8765/path", Some("127.0.0.1:8765")));
    }
}
