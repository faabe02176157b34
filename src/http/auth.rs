//! Authentication and scopes on `/mcp`, as the MCP authorization
//! specification asks of a resource server: every request passes here
//! first and leaves with its [`Caller`], or gets a Bearer challenge.
//!
//! - No credentials: 401 with a challenge that carries no `error`
//!   (RFC 6750 §3.1), unless the request came over loopback and
//!   `auth.local_owner = "loopback"` makes it the local caller.
//! - An `Authorization` header that is not one well-formed bearer
//!   credential (another scheme such as `Basic`, a tab instead of the
//!   space, two headers): 401 `error="invalid_request"`. Only a request
//!   with no `Authorization` header at all can be the local caller.
//! - A credential that is unknown, malformed, expired or revoked: 401
//!   `error="invalid_token"`, in one wording whatever the reason, so a
//!   prober learns nothing about which tokens exist. The reason goes to the
//!   debug log, never the token.
//! - A valid credential without a scope the request needs: 403
//!   `error="insufficient_scope"` with every scope the operation needs in
//!   one challenge. The task service checks again at admission; that check
//!   decides, this one only answers early with the right status.
//!
//! Protected resource metadata (RFC 9728) is served, and named in
//! challenges, when `auth.resource` is set and at least one JWT issuer is
//! advertised: the metadata must name an authorization server, and a
//! static-token-only server has none.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;
use serde_json::{Value, json};

use crate::auth::{Authenticator, Caller, KNOWN_SCOPES};
use crate::config::{AuthSettings, LocalOwner};
use crate::mcp::screen::{Kind, Refused};
use crate::tasks::{Operation, TaskService};
use crate::wire;

/// The peer of the connection a request came on, put into every request
/// by the accept loop.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

/// What the authentication middlewares need.
#[derive(Clone)]
pub struct Gate {
    /// `None`: no credentials are configured and every caller is local
    /// (the listener is loopback-only then).
    pub auth: Option<Arc<Authenticator>>,
    pub svc: Arc<TaskService>,
}

/// The one description of a rejected token, whatever the reason.
const INVALID_TOKEN: &str =
    "the bearer token is not valid here: unknown, malformed, expired or revoked";

/// The description of an `Authorization` header that is not a bearer
/// credential.
const INVALID_REQUEST: &str = "the Authorization header is not a bearer credential: send Authorization: Bearer <token>, or no Authorization header to act as the local owner where that is allowed";

/// Longest `Authorization` header value looked at; longer is malformed.
const MAX_AUTHORIZATION_BYTES: usize = 16 * 1024;

/// Attaches the request's [`Caller`], or answers 401.
pub async fn authenticate(State(gate): State<Gate>, mut request: Request, next: Next) -> Response {
    let Some(auth) = &gate.auth else {
        request.extensions_mut().insert(Caller::Local);
        return next.run(request).await;
    };
    let settings = auth.settings();
    let presented = match bearer(request.headers()) {
        Presented::Nothing => None,
        Presented::Token(token) => Some(token),
        Presented::Malformed => {
            return challenge(&settings, Challenge::InvalidRequest, Value::Null);
        }
    };
    let caller = match presented {
        Some(token) => match auth.authenticate(&token) {
            Ok(principal) => Caller::Authenticated(Arc::new(principal)),
            Err(rejection) => {
                crate::metrics::get().auth_failure(rejection.label());
                tracing::debug!(
                    reason = rejection.reason(),
                    "a bearer token was rejected ({})",
                    rejection.reason()
                );
                return challenge(&settings, Challenge::InvalidToken, Value::Null);
            }
        },
        None => {
            let loopback = request
                .extensions()
                .get::<Peer>()
                .is_some_and(|p| p.0.ip().is_loopback());
            if !(loopback && settings.local_owner == LocalOwner::Loopback) {
                return challenge(&settings, Challenge::Missing, Value::Null);
            }
            Caller::Local
        }
    };
    request.extensions_mut().insert(caller);
    next.run(request).await
}

/// Answers 403 before the protocol library sees a request whose caller
/// lacks a scope its operation needs. Runs after the screen, which tells
/// the method and the tool from the body (so requests without the
/// `Mcp-Method` header, legacy sessions' among them, are checked too).
pub async fn check_scopes(State(gate): State<Gate>, request: Request, next: Next) -> Response {
    let (Some(auth), Some(Caller::Authenticated(principal))) =
        (&gate.auth, request.extensions().get::<Caller>())
    else {
        return next.run(request).await;
    };
    let Some(Kind::Request { method, id, target }) = request.extensions().get::<Kind>() else {
        return next.run(request).await;
    };
    let op = match method.as_str() {
        "tools/call" => Operation::Call {
            tool: target.as_deref().unwrap_or_default(),
        },
        "tasks/get" => Operation::Get,
        "tasks/cancel" => Operation::Cancel,
        "tasks/update" => Operation::Update,
        _ => return next.run(request).await,
    };
    let needed = gate.svc.scopes_needed(op);
    let missing = principal.missing(&needed);
    if missing.is_empty() {
        return next.run(request).await;
    }
    challenge(
        &auth.settings(),
        Challenge::InsufficientScope {
            needed: needed.iter().map(|s| s.to_string()).collect(),
            missing: missing.iter().map(|s| s.to_string()).collect(),
        },
        id.clone(),
    )
}

enum Presented {
    /// No `Authorization` header at all: the only request that may be the
    /// local caller.
    Nothing,
    Token(String),
    /// An `Authorization` header that is not one well-formed bearer
    /// credential (another scheme, no space after the scheme, several
    /// headers, a value that is not a token68).
    Malformed,
}

/// The bearer token of `Authorization: Bearer <token>` (the scheme is
/// case-insensitive, RFC 9110 §11.1). A header that is present but holds
/// anything else is malformed, never "no credential": otherwise a client
/// that sent the wrong scheme would silently act as the local owner.
fn bearer(headers: &axum::http::HeaderMap) -> Presented {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let Some(value) = values.next() else {
        return Presented::Nothing;
    };
    if values.next().is_some() || value.len() > MAX_AUTHORIZATION_BYTES {
        return Presented::Malformed;
    }
    let Ok(text) = value.to_str() else {
        return Presented::Malformed;
    };
    let Some((scheme, rest)) = text.split_once(' ') else {
        return Presented::Malformed;
    };
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Presented::Malformed;
    }
    let token = rest.trim_matches(' ');
    // token68 (RFC 9110 §11.2): a JWT's and a static token's characters.
    let token68 = !token.is_empty()
        && token
            .trim_end_matches('=')
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~+/".contains(&b));
    match token68 {
        true => Presented::Token(token.to_string()),
        false => Presented::Malformed,
    }
}

/// Which refusal a challenge carries.
pub(super) enum Challenge {
    Missing,
    /// An `Authorization` header that is not a bearer credential
    /// (RFC 6750 §3.1 `invalid_request`).
    InvalidRequest,
    InvalidToken,
    InsufficientScope {
        needed: Vec<String>,
        missing: Vec<String>,
    },
}

/// Where this server's protected resource metadata is, when it serves it:
/// the well-known prefix inserted before the resource's path (RFC 9728 §3.1).
pub fn metadata_url(settings: &AuthSettings) -> Option<String> {
    settings.advertised_issuers().next()?;
    let resource = settings.resource.as_deref()?;
    let (scheme, rest) = resource.split_once("://")?;
    let (authority, path) = match rest.find('/') {
        Some(at) => rest.split_at(at),
        None => (rest, ""),
    };
    let path = path.trim_end_matches('/');
    Some(format!(
        "{scheme}://{authority}/.well-known/oauth-protected-resource{path}"
    ))
}

/// The path part of [`metadata_url`], which the router serves.
pub fn metadata_path(settings: &AuthSettings) -> Option<String> {
    let url = metadata_url(settings)?;
    let (_, rest) = url.split_once("://")?;
    rest.find('/').map(|at| rest[at..].to_string())
}

/// The RFC 9728 document.
pub fn metadata(settings: &AuthSettings) -> Value {
    json!({
        "resource": settings.resource,
        "authorization_servers": settings.advertised_issuers().collect::<Vec<_>>(),
        "scopes_supported": KNOWN_SCOPES,
        "bearer_methods_supported": ["header"],
        "resource_name": "taskgate",
    })
}

/// A 401 or 403 with its `WWW-Authenticate` challenge and a JSON-RPC error
/// body.
pub(super) fn challenge(settings: &AuthSettings, kind: Challenge, id: Value) -> Response {
    let mut params = vec![format!("realm=\"{}\"", quoted(&settings.realm))];
    // An invalid token is counted with its reason where it was rejected.
    match &kind {
        Challenge::Missing => crate::metrics::get().auth_failure("missing"),
        Challenge::InvalidRequest => crate::metrics::get().auth_failure("malformed_header"),
        Challenge::InsufficientScope { .. } => {
            crate::metrics::get().auth_failure("insufficient_scope")
        }
        Challenge::InvalidToken => {}
    }
    let (code, message, data) = match &kind {
        Challenge::Missing => (
            wire::UNAUTHENTICATED,
            "this request needs a bearer token: send Authorization: Bearer <token>".to_string(),
            None,
        ),
        Challenge::InvalidRequest => {
            params.push("error=\"invalid_request\"".into());
            params.push(format!("error_description=\"{INVALID_REQUEST}\""));
            (wire::UNAUTHENTICATED, INVALID_REQUEST.to_string(), None)
        }
        Challenge::InvalidToken => {
            params.push("error=\"invalid_token\"".into());
            params.push(format!("error_description=\"{INVALID_TOKEN}\""));
            (wire::UNAUTHENTICATED, INVALID_TOKEN.to_string(), None)
        }
        Challenge::InsufficientScope { needed, missing } => {
            params.push("error=\"insufficient_scope\"".into());
            params.push(format!("scope=\"{}\"", needed.join(" ")));
            let message = format!(
                "this credential lacks the scope{} {} needed here; ask for a token that grants {}",
                if missing.len() == 1 { "" } else { "s" },
                missing.join(", "),
                if missing.len() == 1 { "it" } else { "them" }
            );
            params.push(format!("error_description=\"{}\"", quoted(&message)));
            (
                wire::FORBIDDEN,
                message,
                Some(json!({"missingScopes": missing})),
            )
        }
    };
    if let Some(url) = metadata_url(settings) {
        params.push(format!("resource_metadata=\"{url}\""));
    }
    let mut refusal = Refused::new(code, message, id);
    if let Some(data) = data {
        refusal = refusal.with_data(data);
    }
    // A 401 leaves the body unread: the mapping closes its connection.
    super::respond::challenged(&refusal, &format!("Bearer {}", params.join(", ")))
}

/// A value inside a quoted-string: backslash and quote escaped, controls
/// dropped.
fn quoted(s: &str) -> String {
    s.chars()
        .filter(|c| !c.is_control())
        .flat_map(|c| match c {
            '"' | '\\' => vec!['\\', c],
            c => vec![c],
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_scheme_is_case_insensitive_and_any_other_header_is_malformed() {
        let with = |v: &str| {
            let mut h = axum::http::HeaderMap::new();
            h.insert(
                header::AUTHORIZATION,
                axum::http::HeaderValue::from_str(v).unwrap(),
            );
            bearer(&h)
        };
        assert!(matches!(with("Bearer tgk_abc"), Presented::Token(t) if t == "tgk_abc"));
        assert!(matches!(with("bearer a.b.c"), Presented::Token(t) if t == "a.b.c"));
        // A present header is never "no credential".
        assert!(matches!(with("Basic dXNlcjpwYXNz"), Presented::Malformed));
        assert!(matches!(with("Token tgk_abc"), Presented::Malformed));
        assert!(matches!(with("Bearer\ttgk_abc"), Presented::Malformed));
        assert!(matches!(with(""), Presented::Malformed));
        assert!(matches!(with("Bearer"), Presented::Malformed));
        assert!(matches!(with("Bearer a b"), Presented::Malformed));
        assert!(matches!(with("Bearer a\"b"), Presented::Malformed));
        assert!(matches!(
            bearer(&axum::http::HeaderMap::new()),
            Presented::Nothing
        ));
    }
}
