//! A request as structure until it is rendered to the bytes sent, and the
//! cases a run sends: a base request of the test's table, mutated.

use serde_json::Value;

use super::mutate::{Splices, mutate_body, mutate_headers, mutate_message, raw_garbage};
use super::{Learnt, MAX_REQUEST_BYTES, Rng};

#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Framing {
    Length,
    /// No `Content-Length` and no chunking: the body is not a body.
    NoLength,
    /// `Content-Length` more than is sent; the client then closes its side.
    Longer(usize),
    /// `Content-Length` more than is sent, and the connection left open:
    /// the body-read timeout must end the request.
    Stalled(usize),
    /// `Content-Length` less than is sent: the rest is a next "request".
    Shorter(usize),
    Chunked,
    /// Chunked and a `Content-Length`, as request smuggling does.
    ChunkedAndLength,
    /// A chunk size that is not hex.
    BadChunk,
    /// `Content-Length` that is not a number.
    BadLength(&'static str),
    /// Two different `Content-Length` headers.
    TwoLengths,
}

pub struct Req {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
    pub framing: Framing,
    /// A well-formed HTTP request that reaches the application (as opposed
    /// to framing and head garbage that hyper deals with itself).
    pub well_formed: bool,
}

impl Req {
    pub fn new(method: &str, target: &str) -> Req {
        Req {
            method: method.into(),
            target: target.into(),
            headers: vec![("Host".into(), b"127.0.0.1".to_vec())],
            body: Vec::new(),
            framing: Framing::Length,
            well_formed: true,
        }
    }

    pub fn header(mut self, k: &str, v: &str) -> Req {
        self.headers.push((k.into(), v.as_bytes().to_vec()));
        self
    }

    pub fn remove(&mut self, k: &str) {
        self.headers.retain(|(h, _)| !h.eq_ignore_ascii_case(k));
    }

    pub fn set(&mut self, k: &str, v: &[u8]) {
        self.remove(k);
        self.headers.push((k.into(), v.to_vec()));
        // hyper refuses a head with a control character in a value (obs-text
        // above 0x7f passes): such a request never reaches the application.
        if v.iter().any(|&b| b == 0x7f || (b < 0x20 && b != b'\t')) {
            self.well_formed = false;
        }
    }

    pub fn get(&self, k: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(h, _)| h.eq_ignore_ascii_case(k))
            .map(|(_, v)| v.as_slice())
    }

    pub fn is_mcp_post(&self) -> bool {
        self.method == "POST" && self.target == "/mcp"
    }

    pub fn render(&self, rng_chunks: u64) -> Vec<u8> {
        let mut out = format!("{} {} HTTP/1.1\r\n", self.method, self.target).into_bytes();
        for (k, v) in &self.headers {
            out.extend_from_slice(k.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(v);
            out.extend_from_slice(b"\r\n");
        }
        let len = self.body.len();
        let mut body = self.body.clone();
        match self.framing {
            Framing::Length => {
                out.extend_from_slice(format!("Content-Length: {len}\r\n").as_bytes())
            }
            Framing::NoLength => {}
            Framing::Longer(n) | Framing::Stalled(n) => {
                out.extend_from_slice(format!("Content-Length: {}\r\n", len + n).as_bytes())
            }
            Framing::Shorter(n) => out.extend_from_slice(
                format!("Content-Length: {}\r\n", len.saturating_sub(n)).as_bytes(),
            ),
            Framing::Chunked | Framing::ChunkedAndLength | Framing::BadChunk => {
                out.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
                if self.framing == Framing::ChunkedAndLength {
                    out.extend_from_slice(format!("Content-Length: {len}\r\n").as_bytes());
                }
                body = chunked(&self.body, rng_chunks, self.framing == Framing::BadChunk);
            }
            Framing::BadLength(v) => {
                out.extend_from_slice(format!("Content-Length: {v}\r\n").as_bytes())
            }
            Framing::TwoLengths => out.extend_from_slice(
                format!("Content-Length: {len}\r\nContent-Length: {}\r\n", len + 1).as_bytes(),
            ),
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&body);
        out
    }
}

/// `body` in chunks of sizes drawn from `seed`.
pub fn chunked(body: &[u8], seed: u64, bad: bool) -> Vec<u8> {
    let mut rng = Rng(seed);
    let mut out = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let n = (1 + rng.below(4096)).min(rest.len());
        if bad && rng.chance(50) {
            out.extend_from_slice(b"zz\r\n");
        } else {
            out.extend_from_slice(format!("{n:x}\r\n").as_bytes());
        }
        out.extend_from_slice(&rest[..n]);
        out.extend_from_slice(b"\r\n");
        rest = &rest[n..];
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

/// What goes on the wire for one fuzz case.
pub struct Case {
    pub index: u64,
    /// The base request and the mutations applied, for reports.
    pub label: String,
    pub bytes: Vec<u8>,
    /// Sent alone on a fresh connection whose sending side is then closed
    /// (garbage and bodies shorter than announced): any answer, or none.
    pub raw: bool,
    /// The connection cannot carry another request after this one.
    pub last_on_connection: bool,
    /// A `POST /mcp` that reaches the application.
    pub mcp_post: bool,
    pub well_formed: bool,
    pub head_only: bool,
    /// A GET that may open a server-sent event stream that stays open.
    pub stream: bool,
    /// A raw case whose sending side stays open: the server must end it
    /// itself (an answer, or the header-read timeout).
    pub leave_open: bool,
    /// An unmutated stateless request: it must be served (2xx).
    pub control: bool,
    /// A body past `MAX_REQUEST_BYTES`: the server may answer before it has
    /// read it all and close, and the unread rest then resets the
    /// connection, which can discard the answer on the client's side.
    pub oversize: bool,
}

/// A valid request before mutation, as a test's table makes it.
pub struct BaseRequest {
    /// What it is, for reports.
    pub label: String,
    /// Its JSON-RPC message (`Value::Null` for a request without a body).
    pub message: Value,
    /// The request around it, with the headers its transport asks for.
    pub req: Req,
    /// A 2026-07-28 request, which needs no session: unmutated, it must be
    /// served.
    pub stateless: bool,
}

/// Draws a base request: from the case's random stream, with the JSON-RPC
/// id given, filling in what was learnt.
pub type BaseOf = fn(&mut Rng, u64, &Learnt) -> BaseRequest;

/// Request `index` of the run with `seed`, made from the base request
/// `base` draws.
pub fn make_case(seed: u64, index: u64, learnt: &Learnt, base: BaseOf) -> Case {
    let mut rng = Rng::for_case(seed, 1, index);
    if rng.chance(2) {
        let (bytes, mut label) = raw_garbage(&mut rng);
        // Rarely: each such case costs up to the header-read timeout.
        let leave_open = rng.chance(3);
        if leave_open {
            label.push_str(" (left open)");
        }
        return Case {
            index,
            label,
            bytes,
            raw: true,
            last_on_connection: true,
            mcp_post: false,
            well_formed: false,
            head_only: false,
            stream: false,
            leave_open,
            control: false,
            oversize: false,
        };
    }
    let BaseRequest {
        label,
        message: mut msg,
        mut req,
        stateless,
    } = base(&mut rng, index + 1, learnt);
    let mut labels = vec![label];
    let mut splices = Splices(Vec::new());
    let has_body = !msg.is_null();
    // One request in eight stays valid: the control that proves the
    // daemon still does its job between the broken ones.
    let mutations = if rng.chance(12) { 0 } else { 1 + rng.below(3) };
    let mut body_mutations = Vec::new();
    for _ in 0..mutations {
        match rng.below(10) {
            0..=4 if has_body => labels.push(mutate_message(&mut msg, &mut rng, &mut splices)),
            5..=7 => labels.push(mutate_headers(&mut req, &mut rng)),
            _ if has_body => body_mutations.push(rng.next()),
            _ => labels.push(mutate_headers(&mut req, &mut rng)),
        }
    }
    if has_body {
        req.body = splices.render(&msg);
        for s in body_mutations {
            labels.push(mutate_body(&mut req.body, &mut Rng(s)));
        }
    }
    let mut raw = false;
    let mut last = false;
    // Rarely, as each costs `server.body_read_timeout_ms`: a request whose
    // body stops short on an open connection, which the server must answer
    // (408) and close.
    if mutations > 0 && rng.below(1000) == 0 {
        let framing = Framing::Stalled(1 + rng.below(1000));
        req.framing = framing;
        labels.push(format!("framing:{framing:?}"));
        last = true;
    } else if mutations > 0 && rng.chance(8) {
        let (longer, shorter) = (1 + rng.below(100_000), 1 + rng.below(20));
        let framing = *rng.pick(&[
            Framing::NoLength,
            Framing::Longer(longer),
            Framing::Shorter(shorter),
            Framing::Chunked,
            Framing::Chunked,
            Framing::ChunkedAndLength,
            Framing::BadChunk,
            Framing::BadLength("abc"),
            Framing::BadLength("-1"),
            Framing::BadLength("99999999999999999999999"),
            Framing::TwoLengths,
        ]);
        req.framing = framing;
        labels.push(format!("framing:{framing:?}"));
        match framing {
            Framing::Chunked => {}
            // The body bytes follow a request that has none: the server
            // reads them as the next request.
            Framing::NoLength => last = true,
            Framing::Longer(_) | Framing::BadChunk => {
                // A body that never completes is followed by the end of
                // the connection: without it the server would rightly
                // wait for the rest.
                raw = true;
                last = true;
                req.well_formed = false;
            }
            _ => {
                last = true;
                req.well_formed = false;
            }
        }
    }
    let huge_head = labels.iter().any(|l| l.starts_with("header"));
    let bytes = req.render(rng.next());
    Case {
        index,
        label: labels.join(" "),
        bytes,
        raw,
        last_on_connection: last || huge_head,
        mcp_post: req.is_mcp_post() && req.well_formed,
        well_formed: req.well_formed,
        head_only: req.method == "HEAD",
        stream: req.method == "GET" && req.target == "/mcp",
        leave_open: false,
        control: mutations == 0 && req.framing == Framing::Length && stateless,
        oversize: req.body.len() > MAX_REQUEST_BYTES,
    }
}

/// Line `index` of a stdio run with `seed`: the message of the base request
/// `base` draws, mutated, on one line; and its label.
pub fn make_line(seed: u64, index: u64, learnt: &Learnt, base: BaseOf) -> (Vec<u8>, String) {
    let mut rng = Rng::for_case(seed, 2, index);
    let BaseRequest {
        label,
        message: mut msg,
        ..
    } = base(&mut rng, index + 1, learnt);
    let mut labels = vec![label];
    let mut splices = Splices(Vec::new());
    let mutations = if rng.chance(12) { 0 } else { 1 + rng.below(3) };
    let mut body_mutations = Vec::new();
    for _ in 0..mutations {
        if rng.chance(70) {
            labels.push(mutate_message(&mut msg, &mut rng, &mut splices));
        } else {
            body_mutations.push(rng.next());
        }
    }
    let mut line = splices.render(&msg);
    for s in body_mutations {
        labels.push(mutate_body(&mut line, &mut Rng(s)));
    }
    // One message a line: a newline inside would make two.
    for b in line.iter_mut() {
        if *b == b'\n' || *b == b'\r' {
            *b = b' ';
        }
    }
    line.push(b'\n');
    (line, labels.join(" "))
}
