//! A raw HTTP/1.1 client for loopback: a request goes out as the bytes
//! the test wrote (so a test can send what no real client would), and the
//! answer is read whole by one reader, the status, headers and body (its
//! `Content-Length` or chunked framing undone), or what came of it when no
//! whole answer did. Tests that must control the socket themselves (a
//! request left half-sent, a body dribbled) keep it and read the answer
//! with [`read_response`] or [`parse`].

use std::fmt;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long [`exchange`] and [`Connection::send`] wait for a whole answer:
/// a guard against a hang, never what makes a test pass.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(30);

/// One answer.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    /// The status line and the header lines, as sent.
    pub head: String,
    pub headers: Vec<(String, String)>,
    /// The body, its framing removed.
    pub body: Vec<u8>,
    /// The server will not read another request on this connection.
    pub closes: bool,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(h, _)| h.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The JSON-RPC messages in the body: one JSON document, or the
    /// `data:` lines of an event stream.
    pub fn messages(&self) -> Vec<Value> {
        if let Ok(v) = serde_json::from_slice::<Value>(&self.body) {
            return vec![v];
        }
        String::from_utf8_lossy(&self.body)
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .collect()
    }
}

/// The answer as a test shows it: the head, a blank line, the body.
impl fmt::Display for Response {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}\r\n\r\n{}", self.head, self.text())
    }
}

/// What came of reading an answer.
#[derive(Debug)]
pub enum Outcome {
    Answer(Response),
    /// The connection ended before a whole answer; what came of it.
    Closed(Vec<u8>),
    /// Nothing more within the time allowed, the connection still open.
    Hang(Vec<u8>),
}

impl Outcome {
    /// The answer; anything else fails the test, saying what came.
    #[track_caller]
    pub fn answer(self) -> Response {
        match self {
            Outcome::Answer(r) => r,
            Outcome::Closed(got) => panic!(
                "the connection ended before a whole answer: {:?}",
                String::from_utf8_lossy(&got)
            ),
            Outcome::Hang(got) => panic!(
                "no whole answer in time: {:?}",
                String::from_utf8_lossy(&got)
            ),
        }
    }
}

/// How an answer is read.
#[derive(Clone, Copy, Debug)]
pub struct Reading {
    timeout: Duration,
    head_only: bool,
    stream: bool,
    until_answer: bool,
}

impl Reading {
    /// The whole answer, within `timeout` from the start of the read.
    pub fn within(timeout: Duration) -> Reading {
        Reading {
            timeout,
            head_only: false,
            stream: false,
            until_answer: false,
        }
    }

    /// An answer to HEAD: a head and no body.
    pub fn head_only(mut self, yes: bool) -> Reading {
        self.head_only = yes;
        self
    }

    /// A GET that may open an event stream, which stays open: its head is
    /// the answer.
    pub fn stream(mut self, yes: bool) -> Reading {
        self.stream = yes;
        self
    }

    /// An event stream is read only until it carries a JSON-RPC response:
    /// it may stay open after it.
    pub fn until_answer(mut self) -> Reading {
        self.until_answer = true;
        self
    }
}

/// Where an answer is read from: a socket, or bytes already read.
pub trait Source {
    /// Appends what comes next to `buf`: `Some(true)` when something came,
    /// `Some(false)` at the end, `None` when `deadline` passed first.
    fn fill(&mut self, buf: &mut Vec<u8>, deadline: Instant) -> Option<bool>;
}

impl Source for TcpStream {
    fn fill(&mut self, buf: &mut Vec<u8>, deadline: Instant) -> Option<bool> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        self.set_read_timeout(Some(left)).unwrap();
        let mut chunk = [0u8; 16 * 1024];
        match self.read(&mut chunk) {
            Ok(0) => Some(false),
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                Some(true)
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                None
            }
            // A reset is the end of the connection.
            Err(_) => Some(false),
        }
    }
}

impl Source for &[u8] {
    fn fill(&mut self, buf: &mut Vec<u8>, _deadline: Instant) -> Option<bool> {
        if self.is_empty() {
            return Some(false);
        }
        buf.extend_from_slice(self);
        *self = &[];
        Some(true)
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Reads one answer from `s`, skipping 1xx interim answers.
pub fn read_response(s: &mut impl Source, how: &Reading) -> Outcome {
    let deadline = Instant::now() + how.timeout;
    let mut buf: Vec<u8> = Vec::new();
    loop {
        // The head.
        let end = loop {
            if let Some(i) = find(&buf, b"\r\n\r\n") {
                break i;
            }
            match s.fill(&mut buf, deadline) {
                Some(true) => {}
                Some(false) => return Outcome::Closed(buf),
                None => return Outcome::Hang(buf),
            }
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        buf.drain(..end + 4);
        let mut lines = head.split("\r\n");
        let status: u16 = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        if (100..200).contains(&status) {
            continue;
        }
        let mut answer = Response {
            status,
            head,
            headers,
            body: Vec::new(),
            closes: false,
        };
        answer.closes = answer
            .header("connection")
            .is_some_and(|c| c.eq_ignore_ascii_case("close"));
        let sse = answer
            .header("content-type")
            .is_some_and(|c| c.starts_with("text/event-stream"));
        if how.head_only || status == 204 || status == 304 {
            return Outcome::Answer(answer);
        }
        if sse && how.stream {
            // A stream that stays open: the head is the answer.
            answer.closes = true;
            return Outcome::Answer(answer);
        }
        let chunked = answer
            .header("transfer-encoding")
            .is_some_and(|t| t.eq_ignore_ascii_case("chunked"));
        if chunked {
            // Decoded chunk by chunk; `raw` holds what is not decoded yet.
            let mut raw = std::mem::take(&mut buf);
            loop {
                while let Some(line_end) = find(&raw, b"\r\n") {
                    let size_text = String::from_utf8_lossy(&raw[..line_end]).into_owned();
                    let size =
                        usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16);
                    let Ok(size) = size else {
                        return Outcome::Closed(raw);
                    };
                    if size == 0 {
                        return Outcome::Answer(answer);
                    }
                    if raw.len() < line_end + 2 + size + 2 {
                        break;
                    }
                    answer
                        .body
                        .extend_from_slice(&raw[line_end + 2..line_end + 2 + size]);
                    raw.drain(..line_end + 2 + size + 2);
                }
                if sse && how.until_answer && sse_has_response(&answer.body) {
                    // The stream may stay open after its answer.
                    answer.closes = true;
                    return Outcome::Answer(answer);
                }
                match s.fill(&mut raw, deadline) {
                    Some(true) => {}
                    Some(false) => return Outcome::Closed(answer.body),
                    None => return Outcome::Hang(answer.body),
                }
            }
        }
        match answer.header("content-length").map(str::parse::<usize>) {
            Some(Ok(len)) => {
                while buf.len() < len {
                    match s.fill(&mut buf, deadline) {
                        Some(true) => {}
                        Some(false) => return Outcome::Closed(buf),
                        None => return Outcome::Hang(buf),
                    }
                }
                buf.truncate(len);
                answer.body = buf;
                return Outcome::Answer(answer);
            }
            _ => {
                // No length: the body runs to the end of the connection.
                loop {
                    match s.fill(&mut buf, deadline) {
                        Some(true) => {}
                        Some(false) => break,
                        None => return Outcome::Hang(buf),
                    }
                }
                answer.body = buf;
                answer.closes = true;
                return Outcome::Answer(answer);
            }
        }
    }
}

/// Whether the complete lines of an event stream carry a JSON-RPC response.
fn sse_has_response(body: &[u8]) -> bool {
    let text = String::from_utf8_lossy(body);
    let Some(complete) = text.rfind('\n').map(|i| &text[..i]) else {
        return false;
    };
    complete.lines().any(|l| {
        l.strip_prefix("data:")
            .and_then(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .is_some_and(|v| v.get("result").is_some() || v.get("error").is_some())
    })
}

/// The answer in `raw`, bytes read to the end of a connection.
pub fn parse(mut raw: &[u8]) -> Outcome {
    read_response(&mut raw, &Reading::within(Duration::ZERO))
}

/// A connection to the daemon's loopback port; a write that cannot go
/// out within `timeout` fails.
pub fn connect(port: u16, timeout: Duration) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port))
        .unwrap_or_else(|e| panic!("connect to the daemon on port {port}: {e}"));
    s.set_nodelay(true).unwrap();
    s.set_write_timeout(Some(timeout)).unwrap();
    s
}

/// Sends `request` on `s` and reads what answers it.
pub fn send_on(s: &mut TcpStream, request: &[u8], how: &Reading) -> Outcome {
    match s.write_all(request) {
        Ok(()) => read_response(s, how),
        Err(_) => Outcome::Closed(Vec::new()),
    }
}

/// [`read_response`]; an answer that closes the connection is then read
/// on to the connection's end (within `how`'s time again), so that the
/// server has let go of the connection, and of its slot, when this
/// returns.
pub fn read_to_close(s: &mut TcpStream, how: &Reading) -> Outcome {
    let out = read_response(s, how);
    if let Outcome::Answer(r) = &out
        && r.closes
    {
        let deadline = Instant::now() + how.timeout;
        let mut rest = Vec::new();
        while s.fill(&mut rest, deadline) == Some(true) {
            rest.clear();
        }
    }
    out
}

/// Sends `request` on `s`, a connection for this one request (it asks the
/// server to close it), and reads what answers it as [`read_to_close`]
/// does.
pub fn exchange_on(mut s: TcpStream, request: &[u8], within: Duration) -> Outcome {
    match s.write_all(request) {
        Ok(()) => read_to_close(&mut s, &Reading::within(within)),
        Err(_) => Outcome::Closed(Vec::new()),
    }
}

/// [`exchange_on`] a fresh connection; the whole answer, which must come
/// within [`ANSWER_WITHIN`].
#[track_caller]
pub fn exchange(port: u16, request: &[u8]) -> Response {
    exchange_on(connect(port, ANSWER_WITHIN), request, ANSWER_WITHIN).answer()
}

/// A keep-alive connection: requests one after another, each answer read
/// whole before the next goes out.
pub struct Connection {
    s: TcpStream,
}

impl Connection {
    pub fn open(port: u16) -> Connection {
        Connection {
            s: connect(port, ANSWER_WITHIN),
        }
    }

    /// Sends `request`; its whole answer, which must come within
    /// [`ANSWER_WITHIN`].
    #[track_caller]
    pub fn send(&mut self, request: &[u8]) -> Response {
        send_on(&mut self.s, request, &Reading::within(ANSWER_WITHIN)).answer()
    }

    /// The socket, for a test that goes on with it by hand.
    pub fn into_stream(self) -> TcpStream {
        self.s
    }
}

/// A plain HTTP GET on loopback; the whole answer as text, status line
/// first (what came, when no whole answer came within 5 s).
pub fn http_get(port: u16, path: &str) -> String {
    let within = Duration::from_secs(5);
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    match exchange_on(connect(port, within), request.as_bytes(), within) {
        Outcome::Answer(r) => r.to_string(),
        Outcome::Closed(got) | Outcome::Hang(got) => String::from_utf8_lossy(&got).into_owned(),
    }
}
