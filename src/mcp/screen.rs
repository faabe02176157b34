//! A first look at every message a client sends, before the protocol
//! library parses it.
//!
//! The library answers malformed input in ways a JSON-RPC client cannot
//! read: plain-text HTTP 415 for a body that is not JSON or is a batch, no
//! reply at all on stdio, and "method not found" for a known method whose
//! parameters have the wrong shape (it falls back to treating the request
//! as an unknown custom one). The screen answers those itself, with the
//! JSON-RPC codes the specification fixes: parse error, invalid request,
//! invalid params. What passes the screen is a single, well-formed message
//! whose parameters (for the methods taskgate serves) deserialize into the
//! types the handler receives, so the library sees nothing it would
//! misreport.
//!
//! A request for a method taskgate does not serve is answered here too,
//! with method-not-found whatever its parameters: the library would first
//! hold an array or a missing `params`, or a 2026-07-28 request without its
//! `_meta`, against the request, as if the method existed. Which methods
//! exist depends on the protocol era the request declares: `initialize`
//! and `ping` belong to the legacy revisions (2025-11-25 and earlier) and
//! are gone from 2026-07-28, which carries the version, identity and
//! capabilities in every request's `_meta` instead of a handshake.
//!
//! The screen also tells the transports what a message is (a `tools/call`
//! or something else), so the HTTP side can count it against the right
//! request budget without trusting a header.

use rmcp::model::{
    CallToolRequestParams, CancelTaskParams, GetTaskParams, InitializeRequestParams,
    NumberOrString, PaginatedRequestParams, ProtocolVersion, UpdateTaskParams,
};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::wire::{self, WireCode};

/// What kind of message passed the screen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A request (it has an id): the client awaits an answer. `target` is
    /// what the `Mcp-Name` header mirrors: the tool of a `tools/call`, the
    /// task of a `tasks/*` request.
    Request {
        method: String,
        id: Value,
        target: Option<String>,
    },
    /// A notification (no id): nothing is answered.
    Notification { method: String },
    /// A client's answer to a request the server sent.
    Response,
}

impl Kind {
    /// A `tools/call` may run a tool for as long as it takes; everything
    /// else is answered promptly.
    pub fn is_call(&self) -> bool {
        matches!(self, Kind::Request { method, .. } if method == "tools/call")
    }
}

/// A message the screen refused, and the JSON-RPC error that answers it.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    pub code: WireCode,
    pub message: String,
    /// The request's id when it could be read, else `null`.
    pub id: Value,
    /// The request declared a protocol version without the `initialize`
    /// handshake (2026-07-28 or later), so it is served statelessly: over
    /// HTTP its method-not-found is a 404, where a legacy request gets its
    /// errors in a 200.
    pub modern: bool,
    /// Fields added to the error's `data` (beside its name and help).
    /// Boxed: it is rare, and the refusal travels in every screen result.
    pub extra: Option<Box<Value>>,
}

impl Refused {
    /// A refusal of a request that declared no 2026-07-28 version (or could
    /// not be read far enough to tell).
    pub fn new(code: WireCode, message: impl Into<String>, id: Value) -> Refused {
        Refused {
            code,
            message: message.into(),
            id,
            modern: false,
            extra: None,
        }
    }

    /// The same refusal with `extra` added to its error's `data`.
    pub fn with_data(self, extra: Value) -> Refused {
        Refused {
            extra: Some(Box::new(extra)),
            ..self
        }
    }

    /// The whole JSON-RPC error response.
    pub fn to_json(&self) -> Value {
        self.code
            .error_response(&self.id, &self.message, self.extra.as_deref())
    }
}

/// The values an HTTP request mirrors from its body into headers.
#[derive(Debug, Clone, Copy, Default)]
pub struct Mirrored<'a> {
    /// `MCP-Protocol-Version`.
    pub version: Option<&'a str>,
    /// `Mcp-Method`.
    pub method: Option<&'a str>,
}

/// The methods taskgate answers in either era. Every other request is
/// method-not-found.
const SERVED: &[&str] = &[
    "server/discover",
    "tools/list",
    "tools/call",
    "tasks/get",
    "tasks/cancel",
    "tasks/update",
];

/// The methods of the legacy revisions only: 2026-07-28 removed them.
const LEGACY_ONLY: &[&str] = &["initialize", "ping"];

/// The key of `_meta` that carries a 2026-07-28 request's protocol version.
const VERSION_META_KEY: &str = "io.modelcontextprotocol/protocolVersion";

/// Looks at one message's bytes. `Ok` when it is a single well-formed
/// JSON-RPC message; `Err` with the error to send back otherwise (for a
/// notification or response, the caller decides whether anything is sent).
///
/// `headers` is what the transport carries beside the message (HTTP's
/// mirrored headers); stdio has none. A request is of the 2026-07-28 era
/// when the version in its `_meta` names a revision without the
/// `initialize` handshake, or, when its `_meta` names none, the
/// `MCP-Protocol-Version` header does. The version inside a legacy
/// `initialize`'s parameters is not such a declaration: it is the legacy
/// handshake's offer, answered with the newest legacy revision.
pub fn screen(bytes: &[u8], headers: Option<&Mirrored>) -> Result<Kind, Refused> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        Refused::new(
            wire::PARSE_ERROR,
            format!("the message is not valid JSON ({e}); send one JSON-RPC 2.0 object"),
            Value::Null,
        )
    })?;
    let object = match value {
        Value::Object(object) => object,
        Value::Array(_) => {
            return Err(Refused::new(
                wire::INVALID_REQUEST,
                "batches are not supported; send one JSON-RPC message at a time",
                Value::Null,
            ));
        }
        _ => {
            return Err(Refused::new(
                wire::INVALID_REQUEST,
                "a JSON-RPC message must be an object",
                Value::Null,
            ));
        }
    };

    let id = match object.get("id") {
        None => None,
        Some(raw) => match serde_json::from_value::<NumberOrString>(raw.clone()) {
            Ok(_) => Some(raw.clone()),
            Err(_) => {
                return Err(Refused::new(
                    wire::INVALID_REQUEST,
                    "\"id\" must be a string or an integer",
                    Value::Null,
                ));
            }
        },
    };
    let echo = id.clone().unwrap_or(Value::Null);
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(Refused::new(
            wire::INVALID_REQUEST,
            "\"jsonrpc\" must be \"2.0\"",
            echo,
        ));
    }

    let Some(method) = object.get("method") else {
        let answers = object.contains_key("result") || object.contains_key("error");
        return match (answers, id) {
            (true, Some(_)) => Ok(Kind::Response),
            _ => Err(Refused::new(
                wire::INVALID_REQUEST,
                "a JSON-RPC message needs a \"method\" (a request or notification) or an \"id\" with \"result\" or \"error\" (a response)",
                echo,
            )),
        };
    };
    if object.contains_key("result") || object.contains_key("error") {
        return Err(Refused::new(
            wire::INVALID_REQUEST,
            "a message with a \"method\" is a request or notification and carries no \"result\" or \"error\"",
            echo,
        ));
    }
    let Some(method) = method.as_str() else {
        return Err(Refused::new(
            wire::INVALID_REQUEST,
            "\"method\" must be a string",
            echo,
        ));
    };
    let params = object.get("params");
    let meta_version = params
        .and_then(|p| p.get("_meta"))
        .and_then(|m| m.get(VERSION_META_KEY))
        .and_then(Value::as_str);
    let header_version = headers.and_then(|h| h.version);
    // Dated revisions order lexically, as the library compares them.
    let modern = meta_version
        .or(header_version)
        .is_some_and(|v| v >= ProtocolVersion::NO_INITIALIZE.as_str());
    let refuse = |code: WireCode, message: String| Refused {
        modern,
        ..Refused::new(code, message, echo.clone())
    };
    if id.is_some()
        && let Err(problem) = served(method, modern)
    {
        // The library checks a request's headers against its body before
        // anything else; the screen, answering in its place, does the same.
        if let Some(h) = headers
            && let Some(mismatch) = mismatch(h, method, meta_version, modern)
        {
            return Err(Refused {
                modern,
                ..Refused::new(wire::HEADER_MISMATCH, mismatch, echo)
            });
        }
        return Err(refuse(wire::METHOD_NOT_FOUND, problem));
    }
    if let Some(p) = params
        && !p.is_object()
    {
        return Err(refuse(
            wire::INVALID_PARAMS,
            format!("invalid params for {method}: \"params\" must be an object"),
        ));
    }
    if id.is_none() {
        return Ok(Kind::Notification {
            method: method.to_string(),
        });
    }
    if let Err(problem) = check_params(method, params) {
        return Err(refuse(
            wire::INVALID_PARAMS,
            format!("invalid params for {method}: {problem}"),
        ));
    }
    let target = match method {
        "tools/call" => params.and_then(|p| p.get("name")),
        m if m.starts_with("tasks/") => params.and_then(|p| p.get("taskId")),
        _ => None,
    }
    .and_then(Value::as_str)
    .map(str::to_string);
    Ok(Kind::Request {
        method: method.to_string(),
        id: echo,
        target,
    })
}

/// What is wrong with a request's mirrored headers, if anything: a
/// 2026-07-28 request must mirror its method in `Mcp-Method`, and any
/// request whose `_meta` names a version must name the same one in
/// `MCP-Protocol-Version`.
fn mismatch(
    headers: &Mirrored,
    method: &str,
    meta_version: Option<&str>,
    modern: bool,
) -> Option<String> {
    match headers.method {
        None if modern => {
            return Some(format!(
                "the Mcp-Method header is missing; send Mcp-Method: {method}"
            ));
        }
        Some(m) if modern && m != method => {
            return Some(format!(
                "the Mcp-Method header ({m}) does not match the body's method ({method})"
            ));
        }
        _ => {}
    }
    match (meta_version, headers.version) {
        (Some(v), None) => Some(format!(
            "the MCP-Protocol-Version header is missing; send MCP-Protocol-Version: {v}, the version in _meta"
        )),
        (Some(v), Some(h)) if v != h => Some(format!(
            "the MCP-Protocol-Version header ({h}) does not match the _meta protocol version ({v})"
        )),
        _ => None,
    }
}

/// `Ok` when taskgate serves `method` in the request's era; else what to
/// send instead.
fn served(method: &str, modern: bool) -> Result<(), String> {
    if SERVED.contains(&method) {
        return Ok(());
    }
    if LEGACY_ONLY.contains(&method) {
        if !modern {
            return Ok(());
        }
        let legacy: Vec<&str> = ProtocolVersion::KNOWN_VERSIONS
            .iter()
            .filter(|v| v.has_initialize())
            .map(ProtocolVersion::as_str)
            .collect();
        return Err(format!(
            "method not found: {method} does not exist at protocol {} and later, which this request declares; send each request with its own _meta (server/discover lists what this server supports), or open a legacy session with initialize at one of {} and no 2026-07-28 _meta or MCP-Protocol-Version",
            ProtocolVersion::NO_INITIALIZE,
            legacy.join(", ")
        ));
    }
    Err(format!(
        "method not found: taskgate does not serve {method:?}; it serves {} (and initialize and ping to legacy clients)",
        SERVED.join(", ")
    ))
}

/// The parameters of the methods taskgate serves must deserialize into the
/// types the handler gets.
fn check_params(method: &str, params: Option<&Value>) -> Result<(), String> {
    match method {
        "initialize" => required::<InitializeRequestParams>(params),
        "tools/call" => required::<CallToolRequestParams>(params),
        "tools/list" => optional::<PaginatedRequestParams>(params),
        "tasks/get" => required::<GetTaskParams>(params),
        "tasks/cancel" => required::<CancelTaskParams>(params),
        "tasks/update" => required::<UpdateTaskParams>(params),
        _ => Ok(()),
    }
}

fn required<T: DeserializeOwned>(params: Option<&Value>) -> Result<(), String> {
    match params {
        None => Err("\"params\" is missing".into()),
        Some(p) => optional::<T>(Some(p)),
    }
}

fn optional<T: DeserializeOwned>(params: Option<&Value>) -> Result<(), String> {
    match params {
        None => Ok(()),
        // serde's message names the field and the type it wanted.
        Some(p) => T::deserialize(p).map(drop).map_err(|e| e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(body: &str) -> Refused {
        match screen(body.as_bytes(), None) {
            Err(r) => r,
            Ok(kind) => panic!("{body} passed the screen as {kind:?}"),
        }
    }

    #[test]
    fn not_json_is_a_parse_error() {
        for body in ["{bad json", "", "\u{feff}{}", "{\"a\":1"] {
            let r = refused(body);
            assert_eq!(r.code.code, -32700, "{body}");
            assert_eq!(r.id, Value::Null);
        }
        let r = screen(&[0xff, 0xfe, b'{'], None).unwrap_err();
        assert_eq!(r.code.code, -32700);
    }

    #[test]
    fn batches_and_non_objects_are_invalid_requests() {
        for body in [
            r#"[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]"#,
            "[]",
            r#""str""#,
            "7",
            "null",
        ] {
            assert_eq!(refused(body).code.code, -32600, "{body}");
        }
    }

    #[test]
    fn a_broken_envelope_is_an_invalid_request_that_echoes_a_readable_id() {
        let r = refused(r#"{"jsonrpc":"1.0","id":5,"method":"tools/list"}"#);
        assert_eq!((r.code.code, r.id), (-32600, Value::from(5)));
        let r = refused(r#"{"jsonrpc":"2.0","id":{},"method":"tools/list"}"#);
        assert_eq!((r.code.code, r.id), (-32600, Value::Null));
        let r = refused(r#"{"jsonrpc":"2.0","id":1.5,"method":"tools/list"}"#);
        assert_eq!(r.code.code, -32600);
        let r = refused(r#"{"jsonrpc":"2.0","id":"a","method":7}"#);
        assert_eq!((r.code.code, r.id), (-32600, Value::from("a")));
        let r = refused(r#"{"jsonrpc":"2.0","id":1}"#);
        assert_eq!(r.code.code, -32600);
        let r = refused(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list","result":{}}"#);
        assert_eq!((r.code.code, r.id), (-32600, Value::from(2)));
    }

    #[test]
    fn wrong_params_of_a_served_method_are_invalid_params() {
        for body in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":123}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tasks/get"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tasks/cancel","params":{"taskId":[]}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":[1]}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":7}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":[]}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"cursor":5}}"#,
        ] {
            let r = refused(body);
            assert_eq!((r.code.code, r.id), (-32602, Value::from(1)), "{body}");
            assert!(r.message.starts_with("invalid params for"), "{}", r.message);
        }
    }

    #[test]
    fn well_formed_messages_pass_and_say_what_they_are() {
        let call = r#"{"jsonrpc":"2.0","id":"c","method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"},"_meta":{"x":1}}}"#;
        let kind = screen(call.as_bytes(), None).unwrap();
        assert!(kind.is_call());
        let get = r#"{"jsonrpc":"2.0","id":2,"method":"tasks/get","params":{"taskId":"t"}}"#;
        assert!(!screen(get.as_bytes(), None).unwrap().is_call());
        let list = r#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#;
        assert!(screen(list.as_bytes(), None).is_ok());
        let note = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
        assert_eq!(
            screen(note.as_bytes(), None).unwrap(),
            Kind::Notification {
                method: "notifications/initialized".into()
            }
        );
        let answer = r#"{"jsonrpc":"2.0","id":9,"result":{}}"#;
        assert_eq!(screen(answer.as_bytes(), None).unwrap(), Kind::Response);
    }

    const MODERN_META: &str = r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#;
    const LEGACY_INIT: &str = r#"{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"c","version":"1"}}"#;

    fn request(method: &str, params: Option<&str>) -> String {
        match params {
            Some(p) => format!(r#"{{"jsonrpc":"2.0","id":7,"method":"{method}","params":{p}}}"#),
            None => format!(r#"{{"jsonrpc":"2.0","id":7,"method":"{method}"}}"#),
        }
    }

    /// Over HTTP (`header` is its MCP-Protocol-Version) with an Mcp-Method
    /// that mirrors the body's method; over stdio when `header` is `None`.
    fn screened(body: &str, header: Option<&str>) -> Result<Kind, Refused> {
        let parsed: Value = serde_json::from_str(body).unwrap();
        let method = parsed["method"].as_str();
        let mirrored = header.map(|version| Mirrored {
            version: Some(version),
            method,
        });
        screen(body.as_bytes(), mirrored.as_ref())
    }

    fn not_found(body: &str, header: Option<&str>) -> Refused {
        let r = match screened(body, header) {
            Err(r) => r,
            Ok(kind) => panic!("{body} with {header:?} passed the screen as {kind:?}"),
        };
        assert_eq!(
            (r.code.code, &r.id),
            (-32601, &Value::from(7)),
            "{body} with {header:?}: {r:?}"
        );
        assert_eq!(r.to_json()["error"]["data"]["name"], "TG_METHOD_NOT_FOUND");
        r
    }

    #[test]
    fn initialize_and_ping_declaring_2026_07_28_are_method_not_found() {
        let modern_meta = format!(r#"{{"_meta":{MODERN_META}}}"#);
        let legacy_with_modern_meta = format!(
            r#"{{"protocolVersion":"2025-11-25","capabilities":{{}},"clientInfo":{{"name":"c","version":"1"}},"_meta":{MODERN_META}}}"#
        );
        for (params, header) in [
            // The conformance suite's probe: 2026-07-28 in _meta and header.
            (Some(modern_meta.as_str()), Some("2026-07-28")),
            // stdio: the _meta alone declares it.
            (Some(modern_meta.as_str()), None),
            (Some(legacy_with_modern_meta.as_str()), None),
            // HTTP: the header alone declares it.
            (Some(LEGACY_INIT), Some("2026-07-28")),
            (None, Some("2026-07-28")),
            (Some("[]"), Some("2026-07-28")),
            // A later revision has no handshake either.
            (Some(LEGACY_INIT), Some("2027-01-01")),
        ] {
            let r = not_found(&request("initialize", params), header);
            assert!(r.modern, "{params:?} {header:?}");
            for said in ["2026-07-28", "2025-11-25", "server/discover"] {
                assert!(r.message.contains(said), "{}", r.message);
            }
            let r = not_found(&request("ping", params), header);
            assert!(r.modern, "{params:?} {header:?}");
        }
    }

    #[test]
    fn legacy_initialize_and_ping_still_pass() {
        // The version inside initialize's params is the legacy handshake's
        // offer (rmcp's own client offers 2026-07-28 there by default): it
        // is answered with the newest legacy revision, not refused.
        let offers_2026 = LEGACY_INIT.replace("2025-11-25", "2026-07-28");
        for (params, header) in [
            (LEGACY_INIT, None),
            (LEGACY_INIT, Some("2025-11-25")),
            (offers_2026.as_str(), None),
        ] {
            let body = request("initialize", Some(params));
            assert!(
                matches!(screened(&body, header), Ok(Kind::Request { .. })),
                "{body} with {header:?}"
            );
        }
        for header in [None, Some("2025-11-25"), Some("2025-06-18")] {
            let body = request("ping", None);
            assert!(screened(&body, header).is_ok(), "{header:?}");
        }
        // A legacy initialize with broken params is still invalid params.
        let r = refused(&request("initialize", Some("{}")));
        assert_eq!((r.code.code, r.modern), (-32602, false));
    }

    #[test]
    fn methods_taskgate_does_not_serve_are_method_not_found_whatever_their_params() {
        let modern_meta = format!(r#"{{"_meta":{MODERN_META}}}"#);
        let legacy_meta = r#"{"_meta":{"io.modelcontextprotocol/protocolVersion":"2025-11-25"}}"#;
        for method in [
            "tasks/result",
            "tasks/list",
            "logging/setLevel",
            "resources/subscribe",
            "nope",
        ] {
            for params in [
                Some(modern_meta.as_str()),
                Some(legacy_meta),
                Some("{}"),
                Some("[]"),
                Some("[1,2]"),
                Some("\"x\""),
                Some("5"),
                Some("null"),
                None,
            ] {
                for header in [None, Some("2026-07-28"), Some("2025-11-25")] {
                    // A header naming another version than _meta is a
                    // header mismatch (headers_that_do_not_mirror_…).
                    let meta_says = match params {
                        Some(p) if p == modern_meta => Some("2026-07-28"),
                        Some(p) if p == legacy_meta => Some("2025-11-25"),
                        _ => None,
                    };
                    if header.is_some() && meta_says.is_some() && header != meta_says {
                        continue;
                    }
                    let r = not_found(&request(method, params), header);
                    let modern = match params {
                        Some(p) if p == modern_meta => true,
                        Some(p) if p == legacy_meta => false,
                        _ => header == Some("2026-07-28"),
                    };
                    assert_eq!(r.modern, modern, "{method} {params:?} {header:?}");
                    assert!(r.message.contains(method), "{}", r.message);
                }
            }
        }
        // A notification gets no answer: it is not refused for its method.
        let note = r#"{"jsonrpc":"2.0","method":"notifications/whatever","params":{}}"#;
        assert!(screened(note, Some("2026-07-28")).is_ok());
        // What taskgate serves still passes with a modern _meta.
        for method in ["server/discover", "tools/list"] {
            let body = request(method, Some(&modern_meta));
            assert!(screened(&body, Some("2026-07-28")).is_ok(), "{method}");
        }
    }

    #[test]
    fn headers_that_do_not_mirror_an_unserved_request_are_a_header_mismatch() {
        let meta = format!(r#"{{"_meta":{MODERN_META}}}"#);
        let body = request("tasks/list", Some(&meta));
        let bare = request("initialize", None);
        for (body, version, method, said) in [
            (
                &body,
                Some("2026-07-28"),
                None,
                "Mcp-Method header is missing",
            ),
            (
                &body,
                Some("2026-07-28"),
                Some("tools/list"),
                "(tools/list) does not match",
            ),
            (
                &body,
                None,
                Some("tasks/list"),
                "MCP-Protocol-Version header is missing",
            ),
            (
                &body,
                Some("2027-01-01"),
                Some("tasks/list"),
                "(2027-01-01) does not match",
            ),
            (
                &bare,
                Some("2026-07-28"),
                Some("tools/call"),
                "does not match",
            ),
        ] {
            let h = Mirrored { version, method };
            let r = screen(body.as_bytes(), Some(&h)).unwrap_err();
            assert_eq!((r.code.code, &r.id), (-32020, &Value::from(7)), "{h:?}");
            assert_eq!(r.code.name, "TG_HEADER_MISMATCH");
            assert!(r.message.contains(said), "{h:?}: {}", r.message);
        }
        // Mirrored headers: method-not-found.
        let h = Mirrored {
            version: Some("2026-07-28"),
            method: Some("tasks/list"),
        };
        let r = screen(body.as_bytes(), Some(&h)).unwrap_err();
        assert_eq!((r.code.code, r.modern), (-32601, true));
        // A legacy request's _meta version must match the header too.
        let legacy_meta = request(
            "tasks/list",
            Some(r#"{"_meta":{"io.modelcontextprotocol/protocolVersion":"2025-11-25"}}"#),
        );
        let h = Mirrored {
            version: Some("2026-07-28"),
            method: Some("tasks/list"),
        };
        let r = screen(legacy_meta.as_bytes(), Some(&h)).unwrap_err();
        assert_eq!(r.code.code, -32020, "{}", r.message);
        // A legacy request mirrors nothing else: method-not-found.
        let legacy = request("tasks/list", Some("[]"));
        let h = Mirrored {
            version: Some("2025-11-25"),
            method: None,
        };
        let r = screen(legacy.as_bytes(), Some(&h)).unwrap_err();
        assert_eq!((r.code.code, r.modern), (-32601, false));
    }

    #[test]
    fn refusals_are_json_rpc_errors_from_the_registry() {
        let r = refused("{");
        let j = r.to_json();
        assert_eq!(j["jsonrpc"], "2.0");
        assert_eq!(j["error"]["code"], -32700);
        assert_eq!(j["error"]["data"]["name"], "TG_PARSE_ERROR");
    }
}
