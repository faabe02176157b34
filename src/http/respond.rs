//! The one mapping from a refusal to its HTTP answer. Whatever refuses a
//! `/mcp` request before or around the protocol library (the origin check,
//! authentication, the body's size and time, the screen, the request and
//! session bounds) hands a [`Refused`] here, and its wire code alone
//! decides the status, whether the connection closes and whether the
//! client is told when to retry. The body is the JSON-RPC error the screen
//! and stdio send too ([`Refused::to_json`]).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::mcp::screen::Refused;
use crate::wire::{self, WireCode};

/// How an HTTP refusal is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Disposition {
    pub status: StatusCode,
    /// The connection closes after the answer: the rest of the request was
    /// never read (or must not be), so the stream cannot be reused.
    pub close: bool,
    /// `Retry-After: 1`: the refusal is about load and passes.
    pub retry_after: bool,
}

/// The answer each refusal gets, by its wire code (and, for an unknown
/// method, by whether the request was a stateless 2026-07-28 one).
pub fn disposition(code: WireCode, modern: bool) -> Disposition {
    // Names are unique in the registry; numbers are not (a request too
    // large shares -32600 with an invalid one).
    let is = |w: WireCode| code.name == w.name;
    let (status, close, retry_after) = if is(wire::UNAUTHENTICATED) {
        (StatusCode::UNAUTHORIZED, true, false)
    } else if is(wire::FORBIDDEN) {
        (StatusCode::FORBIDDEN, false, false)
    } else if is(wire::ORIGIN_NOT_ALLOWED) {
        (StatusCode::FORBIDDEN, true, false)
    } else if is(wire::REQUEST_TOO_LARGE) {
        (StatusCode::PAYLOAD_TOO_LARGE, true, false)
    } else if is(wire::REQUEST_TIMEOUT) {
        (StatusCode::REQUEST_TIMEOUT, true, false)
    } else if is(wire::SERVER_BUSY) || is(wire::STOPPING) || is(wire::SESSIONS_FULL) {
        (StatusCode::SERVICE_UNAVAILABLE, false, true)
    } else if is(wire::METHOD_NOT_FOUND) {
        // The stateless binding's 404 for an unserved method; a legacy
        // request gets it in a 200, as the library answers a legacy
        // session (a legacy client takes a 404 for a session that has
        // gone).
        let status = if modern {
            StatusCode::NOT_FOUND
        } else {
            StatusCode::OK
        };
        (status, false, false)
    } else {
        // Everything else refused here is a malformed request.
        (StatusCode::BAD_REQUEST, false, false)
    };
    Disposition {
        status,
        close,
        retry_after,
    }
}

/// The HTTP answer to a refusal.
pub fn refused(refusal: &Refused) -> Response {
    answer(refusal, disposition(refusal.code, refusal.modern))
}

/// A refusal the protocol library made with a plain-text body
/// (`TG_HTTP_REFUSED` carrying its words): the library's status is kept.
pub fn from_library(refusal: &Refused, status: StatusCode) -> Response {
    answer(
        refusal,
        Disposition {
            status,
            close: false,
            retry_after: false,
        },
    )
}

fn answer(refusal: &Refused, d: Disposition) -> Response {
    crate::metrics::get().error(refusal.code.name);
    let mut response = (
        d.status,
        [(header::CONTENT_TYPE, "application/json")],
        refusal.to_json().to_string(),
    )
        .into_response();
    let headers = response.headers_mut();
    if d.close {
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    if d.retry_after {
        headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

/// [`refused`] with a `WWW-Authenticate` challenge (bare `Bearer` if the
/// parameters cannot be a header value).
pub fn challenged(refusal: &Refused, challenge: &str) -> Response {
    let mut response = refused(refusal);
    let value =
        HeaderValue::from_str(challenge).unwrap_or_else(|_| HeaderValue::from_static("Bearer"));
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, value);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refusal_has_its_status_and_connection_rule() {
        let cases = [
            (wire::UNAUTHENTICATED, false, 401, true, false),
            (wire::FORBIDDEN, false, 403, false, false),
            (wire::ORIGIN_NOT_ALLOWED, false, 403, true, false),
            (wire::REQUEST_TOO_LARGE, false, 413, true, false),
            (wire::REQUEST_TIMEOUT, false, 408, true, false),
            (wire::SERVER_BUSY, false, 503, false, true),
            (wire::STOPPING, false, 503, false, true),
            (wire::SESSIONS_FULL, false, 503, false, true),
            (wire::METHOD_NOT_FOUND, true, 404, false, false),
            (wire::METHOD_NOT_FOUND, false, 200, false, false),
            (wire::PARSE_ERROR, false, 400, false, false),
            (wire::INVALID_REQUEST, false, 400, false, false),
            (wire::HEADER_MISMATCH, true, 400, false, false),
        ];
        for (code, modern, status, close, retry_after) in cases {
            let d = disposition(code, modern);
            assert_eq!(
                (d.status.as_u16(), d.close, d.retry_after),
                (status, close, retry_after),
                "{}",
                code.name
            );
        }
    }

    #[test]
    fn the_answer_carries_the_json_rpc_error_and_its_headers() {
        let r = Refused::new(wire::SERVER_BUSY, "busy", serde_json::Value::from(3))
            .with_data(serde_json::json!({"retryAfterMs": 1000}));
        let response = challenged(&r, "Bearer realm=\"x\"");
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        let h = response.headers();
        assert_eq!(h[header::RETRY_AFTER], "1");
        assert_eq!(h[header::WWW_AUTHENTICATE], "Bearer realm=\"x\"");
        assert_eq!(h[header::CONTENT_TYPE], "application/json");
        let body = r.to_json();
        assert_eq!(body["id"], 3);
        assert_eq!(body["error"]["code"], wire::SERVER_BUSY.code);
        assert_eq!(body["error"]["data"]["name"], wire::SERVER_BUSY.name);
        assert_eq!(body["error"]["data"]["retryAfterMs"], 1000);
    }
}
