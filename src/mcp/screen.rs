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
//! The screen also tells the transports what a message is (a `tools/call`
//! or something else), so the HTTP side can count it against the right
//! request budget without trusting a header.

use rmcp::model::{
    CallToolRequestParams, CancelTaskParams, GetTaskParams, InitializeRequestParams,
    NumberOrString, PaginatedRequestParams, UpdateTaskParams,
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
pub struct Refusal {
    pub code: WireCode,
    pub message: String,
    /// The request's id when it could be read, else `null`.
    pub id: Value,
}

impl Refusal {
    fn new(code: WireCode, message: impl Into<String>, id: Value) -> Refusal {
        Refusal {
            code,
            message: message.into(),
            id,
        }
    }

    /// The whole JSON-RPC error response.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "jsonrpc": "2.0",
            "id": self.id,
            "error": {
                "code": self.code.code,
                "message": self.message,
                "data": self.code.data(),
            }
        })
    }
}

/// Looks at one message's bytes. `Ok` when it is a single well-formed
/// JSON-RPC message; `Err` with the error to send back otherwise (for a
/// notification or response, the caller decides whether anything is sent).
pub fn screen(bytes: &[u8]) -> Result<Kind, Refusal> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        Refusal::new(
            wire::PARSE_ERROR,
            format!("the message is not valid JSON ({e}); send one JSON-RPC 2.0 object"),
            Value::Null,
        )
    })?;
    let object = match value {
        Value::Object(object) => object,
        Value::Array(_) => {
            return Err(Refusal::new(
                wire::INVALID_REQUEST,
                "batches are not supported; send one JSON-RPC message at a time",
                Value::Null,
            ));
        }
        _ => {
            return Err(Refusal::new(
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
                return Err(Refusal::new(
                    wire::INVALID_REQUEST,
                    "\"id\" must be a string or an integer",
                    Value::Null,
                ));
            }
        },
    };
    let echo = id.clone().unwrap_or(Value::Null);
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(Refusal::new(
            wire::INVALID_REQUEST,
            "\"jsonrpc\" must be \"2.0\"",
            echo,
        ));
    }

    let Some(method) = object.get("method") else {
        let answers = object.contains_key("result") || object.contains_key("error");
        return match (answers, id) {
            (true, Some(_)) => Ok(Kind::Response),
            _ => Err(Refusal::new(
                wire::INVALID_REQUEST,
                "a JSON-RPC message needs a \"method\" (a request or notification) or an \"id\" with \"result\" or \"error\" (a response)",
                echo,
            )),
        };
    };
    if object.contains_key("result") || object.contains_key("error") {
        return Err(Refusal::new(
            wire::INVALID_REQUEST,
            "a message with a \"method\" is a request or notification and carries no \"result\" or \"error\"",
            echo,
        ));
    }
    let Some(method) = method.as_str() else {
        return Err(Refusal::new(
            wire::INVALID_REQUEST,
            "\"method\" must be a string",
            echo,
        ));
    };
    let params = object.get("params");
    if let Some(p) = params
        && !p.is_object()
    {
        return Err(Refusal::new(
            wire::INVALID_PARAMS,
            format!("invalid params for {method}: \"params\" must be an object"),
            echo,
        ));
    }
    if id.is_none() {
        return Ok(Kind::Notification {
            method: method.to_string(),
        });
    }
    if let Err(problem) = check_params(method, params) {
        return Err(Refusal::new(
            wire::INVALID_PARAMS,
            format!("invalid params for {method}: {problem}"),
            echo,
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

/// The parameters of the methods taskgate serves must deserialize into the
/// types the handler gets. Other methods are the library's to answer.
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

    fn refused(body: &str) -> Refusal {
        match screen(body.as_bytes()) {
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
        let r = screen(&[0xff, 0xfe, b'{']).unwrap_err();
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
        let kind = screen(call.as_bytes()).unwrap();
        assert!(kind.is_call());
        let get = r#"{"jsonrpc":"2.0","id":2,"method":"tasks/get","params":{"taskId":"t"}}"#;
        assert!(!screen(get.as_bytes()).unwrap().is_call());
        let list = r#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#;
        assert!(screen(list.as_bytes()).is_ok());
        let unknown = r#"{"jsonrpc":"2.0","id":4,"method":"nope","params":{"a":1}}"#;
        assert!(
            screen(unknown.as_bytes()).is_ok(),
            "the library answers -32601"
        );
        let note = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
        assert_eq!(
            screen(note.as_bytes()).unwrap(),
            Kind::Notification {
                method: "notifications/initialized".into()
            }
        );
        let answer = r#"{"jsonrpc":"2.0","id":9,"result":{}}"#;
        assert_eq!(screen(answer.as_bytes()).unwrap(), Kind::Response);
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
