//! The mutations: of a JSON-RPC message (methods, ids, versions, parameter
//! types and values, raw numbers and strings, deep nesting), of the headers
//! (the MCP headers, content type, accept, sessions, the request line), of
//! the body bytes, and garbage for a bare connection. Each draws from the
//! case's random stream and returns a label for reports.

use serde_json::{Value, json};

use super::request::Req;
use super::{LEGACY, MAX_REQUEST_BYTES, Rng, TASKS_EXT, V2026};

/// Raw JSON text spliced in where a placeholder string stands: numbers and
/// nesting `serde_json::Value` cannot hold.
pub struct Splices(pub Vec<Vec<u8>>);

impl Splices {
    pub fn add(&mut self, raw: Vec<u8>) -> Value {
        self.0.push(raw);
        Value::String(format!("@@splice{}@@", self.0.len() - 1))
    }

    pub fn render(&self, v: &Value) -> Vec<u8> {
        let mut out = serde_json::to_vec(v).unwrap();
        for (i, raw) in self.0.iter().enumerate().rev() {
            let marker = format!("\"@@splice{i}@@\"");
            if let Some(at) = find(&out, marker.as_bytes()) {
                out.splice(at..at + marker.len(), raw.iter().copied());
            }
        }
        out
    }
}

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

pub const METHODS: &[&str] = &[
    "tools/list",
    "tools/call",
    "tasks/get",
    "tasks/cancel",
    "tasks/update",
    "tasks/list",
    "tasks/result",
    "initialize",
    "notifications/initialized",
    "notifications/cancelled",
    "ping",
    "server/discover",
    "resources/list",
    "prompts/get",
    "completion/complete",
    "logging/setLevel",
    "",
    "TOOLS/LIST",
    "tools/list ",
    "tools/call\u{0}",
    "rpc.discover",
    "tasks/",
    "$/cancelRequest",
];

/// A value of a random JSON type, now and then a large or deep one.
pub fn any_value(rng: &mut Rng, splices: &mut Splices) -> Value {
    match rng.below(16) {
        0 => Value::Null,
        1 => json!(true),
        2 => json!(0),
        3 => json!(-1),
        4 => json!(1.5),
        5 => json!(""),
        6 => json!("x"),
        7 => json!([]),
        8 => json!({}),
        9 => json!([1, "two", null]),
        10 => json!({"a": {"b": [1]}}),
        11 => huge_string(rng),
        12 => deep(rng, splices),
        13 => splices.add(rng.pick(RAW_NUMBERS).as_bytes().to_vec()),
        14 => json!("\u{0}\u{1f}\u{202e}\u{fffd}"),
        _ => splices.add(rng.pick(RAW_STRINGS).as_bytes().to_vec()),
    }
}

pub const RAW_NUMBERS: &[&str] = &[
    "123456789012345678901234567890",
    "18446744073709551616",
    "-9223372036854775809",
    "1e999",
    "-1e999",
    "-0",
    "0.000000000000000000000000000001",
    "9007199254740993",
    "1E+2",
    "4.0",
];

/// String literals serde_json must refuse or decode carefully.
pub const RAW_STRINGS: &[&str] = &[
    r#""\ud800""#,
    r#""\udc00\ud800""#,
    r#""\u0000""#,
    r#""\uZZZZ""#,
    r#""\x41""#,
    "\"tab\there\"",
    "\"\u{7f}\"",
];

pub fn huge_string(rng: &mut Rng) -> Value {
    // Inside the body bound, at its edge, and past it.
    let n = *rng.pick(&[1_000, 16_000, MAX_REQUEST_BYTES - 600, 70_000, 200_000]);
    let unit = *rng.pick(&["a", "é", "\u{1f600}", "\\", "\""]);
    Value::String(unit.repeat(n / unit.len()))
}

/// Nesting around the serde_json recursion limit (128), and far past it
/// within the body bound.
pub fn deep(rng: &mut Rng, splices: &mut Splices) -> Value {
    let depth = *rng.pick(&[64, 127, 128, 129, 500, 5_000, 30_000]);
    let raw = if rng.chance(50) {
        format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
    } else {
        format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth))
    };
    splices.add(raw.into_bytes())
}

/// The paths inside params worth breaking for each method.
pub fn param_paths(msg: &Value) -> Vec<Vec<&'static str>> {
    let mut paths = vec![vec!["_meta"]];
    let method = msg["method"].as_str().unwrap_or_default();
    match method {
        "tools/call" => {
            paths.extend([vec!["name"], vec!["arguments"], vec!["arguments", "text"]]);
        }
        "tasks/get" | "tasks/cancel" | "tasks/update" => {
            paths.extend([vec!["taskId"], vec!["inputResponses"]]);
        }
        "initialize" => {
            paths.extend([
                vec!["protocolVersion"],
                vec!["capabilities"],
                vec!["clientInfo"],
                vec!["clientInfo", "name"],
            ]);
        }
        _ => {}
    }
    if msg["params"].get("_meta").is_some() {
        paths.extend([
            vec!["_meta", "io.modelcontextprotocol/protocolVersion"],
            vec!["_meta", "io.modelcontextprotocol/clientCapabilities"],
            vec![
                "_meta",
                "io.modelcontextprotocol/clientCapabilities",
                "extensions",
            ],
            vec![
                "_meta",
                "io.modelcontextprotocol/clientCapabilities",
                "extensions",
                TASKS_EXT,
            ],
            vec!["_meta", "dev.taskgate/operationId"],
        ]);
    }
    paths
}

/// Sets (or with `None` removes) `params.<path>`, creating objects on the
/// way when they are missing.
pub fn set_param(msg: &mut Value, path: &[&str], v: Option<Value>) {
    let Some(obj) = msg.as_object_mut() else {
        return;
    };
    let mut cur = obj.entry("params").or_insert_with(|| json!({}));
    for key in &path[..path.len() - 1] {
        if !cur.is_object() {
            return;
        }
        cur = cur
            .as_object_mut()
            .unwrap()
            .entry(*key)
            .or_insert_with(|| json!({}));
    }
    let Some(last) = cur.as_object_mut() else {
        return;
    };
    let key = path[path.len() - 1];
    match v {
        Some(v) => {
            last.insert(key.into(), v);
        }
        None => {
            last.remove(key);
        }
    }
}

/// One mutation of the JSON-RPC message; returns its label.
pub fn mutate_message(msg: &mut Value, rng: &mut Rng, splices: &mut Splices) -> String {
    match rng.below(9) {
        0 => {
            let m = *rng.pick(METHODS);
            if rng.chance(85) {
                msg["method"] = json!(m);
                format!("method={m:?}")
            } else {
                msg["method"] = any_value(rng, splices);
                "method:type".into()
            }
        }
        1 => {
            let choice = rng.below(12);
            let v = match choice {
                0 => Value::Null,
                1 => json!({"a": 1}),
                2 => json!([1]),
                3 => json!(1.5),
                4 => json!(-1),
                5 => json!(""),
                6 => json!(true),
                7 => json!("x".repeat(10_000)),
                8 => splices.add(rng.pick(RAW_NUMBERS).as_bytes().to_vec()),
                9 => json!(u64::MAX),
                10 => json!(i64::MIN),
                _ => {
                    if let Some(o) = msg.as_object_mut() {
                        o.remove("id");
                    }
                    return "id:removed".into();
                }
            };
            msg["id"] = v;
            format!("id:{choice}")
        }
        2 => {
            let choices = [
                json!("1.0"),
                json!("2"),
                json!(2.0),
                json!(2),
                Value::Null,
                json!("2.0 "),
                json!("3.0"),
                json!(""),
            ];
            let v = rng.pick(&choices).clone();
            if rng.chance(20) {
                if let Some(o) = msg.as_object_mut() {
                    o.remove("jsonrpc");
                }
                "jsonrpc:removed".into()
            } else {
                msg["jsonrpc"] = v.clone();
                format!("jsonrpc={v}")
            }
        }
        3 => {
            if rng.chance(30) {
                if let Some(o) = msg.as_object_mut() {
                    o.remove("params");
                }
                "params:removed".into()
            } else {
                let choices = [json!([]), json!("x"), json!(1), Value::Null, json!(true)];
                let v = rng.pick(&choices);
                msg["params"] = v.clone();
                format!("params={v}")
            }
        }
        4..=6 => {
            let paths = param_paths(msg);
            let path = rng.pick(&paths).clone();
            if rng.chance(30) {
                set_param(msg, &path, None);
                format!("params.{}:removed", path.join("."))
            } else {
                let v = any_value(rng, splices);
                set_param(msg, &path, Some(v));
                format!("params.{}:replaced", path.join("."))
            }
        }
        7 => {
            let v = any_value(rng, splices);
            let key = *rng.pick(&["extra", "__proto__", "", "_meta", "params", "result"]);
            if let Some(o) = msg.as_object_mut() {
                o.insert(key.into(), v);
            }
            format!("member {key:?} added")
        }
        _ => {
            let version = *rng.pick(&[LEGACY, "2099-01-01", "", "2026-07-28\u{0}", "2026-7-28"]);
            set_param(
                msg,
                &["_meta", "io.modelcontextprotocol/protocolVersion"],
                Some(json!(version)),
            );
            format!("protocolVersion={version:?}")
        }
    }
}

pub const MCP_HEADERS: &[&str] = &["Mcp-Method", "Mcp-Name", "MCP-Protocol-Version"];

/// One mutation of the headers; returns its label.
pub fn mutate_headers(req: &mut Req, rng: &mut Rng) -> String {
    match rng.below(10) {
        0 => {
            let h = *rng.pick(MCP_HEADERS);
            req.remove(h);
            format!("{h}:removed")
        }
        1 => {
            let h = *rng.pick(MCP_HEADERS);
            let v = *rng.pick(&[
                "tools/call",
                "tools/list",
                "tasks/get",
                "initialize",
                "echo",
                "nope",
                LEGACY,
                V2026,
                "2099-01-01",
                "",
                "garbage\u{7f}",
            ]);
            req.set(h, v.as_bytes());
            format!("{h}={v:?}")
        }
        2 => {
            let h = *rng.pick(MCP_HEADERS);
            let v = req
                .get(h)
                .map(<[u8]>::to_vec)
                .unwrap_or_else(|| b"tools/call".to_vec());
            let v = if rng.chance(50) {
                v
            } else {
                b"tasks/cancel".to_vec()
            };
            req.headers.push((h.into(), v));
            format!("{h}:duplicated")
        }
        3 => replace_or_remove(
            req,
            rng,
            "Content-Type",
            &[
                "",
                "text/plain",
                "application/json; charset=utf-8",
                "application/jsonx",
                "APPLICATION/JSON",
                "multipart/form-data; boundary=x",
                "application/json, text/plain",
            ],
        ),
        4 => replace_or_remove(
            req,
            rng,
            "Accept",
            &[
                "application/json",
                "text/event-stream",
                "*/*",
                "application/json, text/event-stream;q=0",
                "text/html",
                "",
            ],
        ),
        5 => {
            let v: Vec<u8> = match rng.below(5) {
                0 => b"bogus".to_vec(),
                1 => b"".to_vec(),
                2 => "a".repeat(8_000).into_bytes(),
                3 => b"\xff\xfe session".to_vec(),
                _ => b"0123456789abcdef0123456789abcdef".to_vec(),
            };
            req.set("Mcp-Session-Id", &v);
            "bogus session id".into()
        }
        6 => {
            req.headers
                .push(("Expect".into(), b"100-continue".to_vec()));
            "expect:100-continue".into()
        }
        7 => {
            req.remove("Host");
            "host:removed".into()
        }
        8 => {
            // Past hyper's head limits: answered by hyper, not the app.
            req.well_formed = false;
            if rng.chance(50) {
                req.headers
                    .push(("X-Big".into(), "b".repeat(200_000).into_bytes()));
                "header:huge".into()
            } else {
                for i in 0..150 {
                    req.headers.push((format!("X-H{i}"), b"1".to_vec()));
                }
                "headers:150".into()
            }
        }
        _ => {
            let (m, t) = *rng.pick(&[
                ("PUT", "/mcp"),
                ("PATCH", "/mcp"),
                ("OPTIONS", "/mcp"),
                ("HEAD", "/mcp"),
                ("POST", "/mcp/"),
                ("POST", "/MCP"),
                ("POST", "/mcp?x=1"),
                ("POST", "//mcp"),
                ("POST", "/healthz"),
                ("GET", "/"),
                ("POST", "http://127.0.0.1/mcp"),
                ("GET", "/readyz?verbose"),
                ("TRACE", "/mcp"),
            ]);
            req.method = m.into();
            req.target = t.into();
            format!("{m} {t}")
        }
    }
}

/// `header` set to one of `values` or, one time in four, removed; returns
/// its label.
fn replace_or_remove(req: &mut Req, rng: &mut Rng, header: &str, values: &[&str]) -> String {
    let v = *rng.pick(values);
    let label = header.to_ascii_lowercase();
    if rng.chance(25) {
        req.remove(header);
        format!("{label}:removed")
    } else {
        req.set(header, v.as_bytes());
        format!("{label}={v:?}")
    }
}

/// One mutation of the body bytes; returns its label.
pub fn mutate_body(body: &mut Vec<u8>, rng: &mut Rng) -> String {
    match rng.below(9) {
        0 => {
            let at = rng.below(body.len());
            body.truncate(at);
            format!("body:truncated@{at}")
        }
        1 => {
            let choices: [&[u8]; 6] = [
                b"\xff",
                b"\xc3\x28",
                b"\xed\xa0\x80",
                b"\xf4\x90\x80\x80",
                b"\xc0\xaf",
                b"\x00",
            ];
            let bad = *rng.pick(&choices);
            // Inside a string value, where serde_json checks UTF-8.
            let at = match find(body, b"\"fuzz") {
                Some(i) if rng.chance(70) => i + 1,
                _ => rng.below(body.len() + 1),
            };
            body.splice(at..at, bad.iter().copied());
            "body:invalid-utf8".into()
        }
        2 => {
            let choices: [&[u8]; 12] = [
                b"hello",
                b"<?xml version=\"1.0\"?><a/>",
                b"{'jsonrpc': '2.0'}",
                b"nul",
                b"\x00\x00\x00\x00",
                b"{",
                b"}",
                b"\"string\"",
                b"42",
                b"null",
                b"{}",
                b"{\"jsonrpc\":\"2.0\"}",
            ];
            *body = rng.pick(&choices).to_vec();
            "body:not-json-rpc".into()
        }
        3 => {
            let one = body.clone();
            body.clear();
            body.push(b'[');
            let n = rng.below(3);
            for i in 0..n {
                if i > 0 {
                    body.push(b',');
                }
                body.extend_from_slice(&one);
            }
            body.push(b']');
            format!("body:batch of {n}")
        }
        4 => {
            body.clear();
            "body:empty".into()
        }
        5 => {
            let choices: [&[u8]; 4] = [b"}", b" garbage", b"\n{}", b"\x00"];
            let tail = *rng.pick(&choices);
            body.extend_from_slice(tail);
            "body:trailing bytes".into()
        }
        6 => {
            let mut v = b"\xef\xbb\xbf".to_vec();
            v.extend_from_slice(body);
            *body = v;
            "body:BOM".into()
        }
        7 => {
            let n = rng.below(body.len().max(1));
            for _ in 0..1 + rng.below(8) {
                if !body.is_empty() {
                    let at = rng.below(body.len());
                    body[at] = (rng.next() & 0xff) as u8;
                }
            }
            format!("body:bytes flipped near {n}")
        }
        _ => {
            let mut v = vec![b' '; rng.below(2_000)];
            v.extend_from_slice(body);
            v.extend(std::iter::repeat_n(b'\n', rng.below(100)));
            *body = v;
            "body:whitespace".into()
        }
    }
}

/// Garbage on a bare connection.
pub fn raw_garbage(rng: &mut Rng) -> (Vec<u8>, String) {
    match rng.below(12) {
        0 => {
            let n = 1 + rng.below(4096);
            ((0..n).map(|_| (rng.next() & 0xff) as u8).collect(), format!("raw:{n} random bytes"))
        }
        1 => (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec(), "raw:h2 preface".into()),
        2 => (b"GET /healthz HTTP/1.0\r\n\r\n".to_vec(), "raw:http/1.0".into()),
        3 => (b"GET /healthz HTTP/9.9\r\nHost: x\r\n\r\n".to_vec(), "raw:http/9.9".into()),
        4 => (b"\r\n\r\n\r\n\r\n".to_vec(), "raw:blank lines".into()),
        5 => (
            format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(70_000)).into_bytes(),
            "raw:huge uri".into(),
        ),
        6 => (
            b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".to_vec(),
            "raw:head cut short".into(),
        ),
        7 => (b"BREW /mcp HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), "raw:BREW".into()),
        8 => (
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nX: a\r\n b\r\n\r\n".to_vec(),
            "raw:folded header".into(),
        ),
        9 => (
            b"CONNECT 127.0.0.1:1 HTTP/1.1\r\nHost: 127.0.0.1:1\r\n\r\n".to_vec(),
            "raw:CONNECT".into(),
        ),
        10 => (
            b"GET /healthz HTTP/1.1\nHost: x\n\n".to_vec(),
            "raw:bare LF".into(),
        ),
        _ => (
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
                .to_vec(),
            "raw:CL+TE".into(),
        ),
    }
}
