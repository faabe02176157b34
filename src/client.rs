//! A small MCP client for operators and tests: `taskgate call` and
//! `taskgate task get|cancel` speak protocol 2026-07-28 over streamable
//! HTTP to a running daemon and print JSON.
//!
//! Owns the operator client. 2026-07-28 over HTTP (hyper, HTTP/1 only, no TLS
//! stack), JSON or SSE responses; polls at `pollIntervalMs` and honours
//! `retryAfterMs`; on request (`with_busy_retries`) sends a request refused as
//! busy (503 `TG_SERVER_BUSY`, or the connection bound's 503) again after its
//! `Retry-After`, a bounded number of times, counting busy answers (the retry
//! loop takes the exchange as a function, so its unit tests count what is sent
//! when on a paused clock). `request_meta` is the `_meta` every request carries
//! (version, capabilities, identity); the request micro-benchmark sends it too.
//! `ClientError` maps itself to the operator exit classes.

use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Request, Uri};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use thiserror::Error;
use tokio::net::TcpStream;

use crate::exit::{Classify, ExitClass};

pub const PROTOCOL_VERSION: &str = "2026-07-28";
pub const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";
pub const DEFAULT_URL: &str = "http://127.0.0.1:8765/mcp";
/// The largest response body the client reads.
const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;
/// Bound on one HTTP exchange.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);
/// The wait after a busy answer that names none (`Retry-After` absent or
/// unreadable): the daemon's own hint is one second.
const DEFAULT_BUSY_WAIT: Duration = Duration::from_secs(1);
/// Bounds on the wait a busy answer asks for: never a spin, never longer
/// than a person would wait for one request.
const MIN_BUSY_WAIT: Duration = Duration::from_millis(10);
const MAX_BUSY_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, Error)]
pub enum ClientError {
    #[error("{0} is not an http://host:port/path URL")]
    BadUrl(String),
    #[error("cannot reach {url}: {source}; is `taskgate serve` running there?")]
    Connect { url: String, source: std::io::Error },
    #[error("HTTP error talking to {url}: {detail}")]
    Http { url: String, detail: String },
    #[error("HTTP {status} from {url}: {body}")]
    Status {
        url: String,
        status: u16,
        body: String,
    },
    #[error("unreadable response: {0}")]
    Decode(String),
    /// The server answered with a JSON-RPC error.
    #[error("server error {code}: {message}")]
    Rpc {
        code: i64,
        message: String,
        error: Value,
    },
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// Every attempt was answered busy (`TG_SERVER_BUSY`, or the 503 of the
    /// connection bound); `last` is the final answer.
    #[error(
        "the server was still busy after {answers} busy answers, each retried after the wait it asked for: {last}"
    )]
    StillBusy {
        answers: u32,
        last: Box<ClientError>,
    },
}

impl Classify for ClientError {
    /// The operator commands' exit status for each way a request can fail.
    fn exit_class(&self) -> ExitClass {
        match self {
            ClientError::BadUrl(_) => ExitClass::Usage,
            ClientError::Connect { .. } | ClientError::Http { .. } | ClientError::Timeout(_) => {
                ExitClass::Unreachable
            }
            // 503 is the daemon saying it cannot take the request now
            // (connection or request limit, or stopping).
            ClientError::Status { status: 503, .. } => ExitClass::Unreachable,
            ClientError::Status { .. } | ClientError::Decode(_) | ClientError::Rpc { .. } => {
                ExitClass::Protocol
            }
            ClientError::StillBusy { last, .. } => last.exit_class(),
        }
    }
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// A client bound to one server URL. It keeps one HTTP/1.1 connection
/// open and reconnects when the server closed it.
pub struct Client {
    url: String,
    uri: Uri,
    /// Declare the Tasks extension in every request.
    tasks: bool,
    next_id: std::sync::atomic::AtomicU64,
    conn: tokio::sync::Mutex<Option<Sender>>,
    /// Sent as `Authorization: Bearer …` when set.
    token: Option<String>,
    /// How many times one request is sent again after a busy answer.
    busy_retries: u32,
    /// Busy answers received so far, over all requests.
    busy_answers: std::sync::atomic::AtomicU64,
}

/// One HTTP answer, before it is read as JSON-RPC.
struct Answer {
    status: u16,
    /// `Retry-After` in delta-seconds, when present and readable.
    retry_after: Option<Duration>,
    text: String,
}

/// The `_meta` this client puts into every request: the 2026-07-28
/// protocol version, its capabilities (the Tasks extension when `tasks`)
/// and its identity. Public so that the request micro-benchmark
/// (`benches/request.rs`) sends exactly what the client sends.
pub fn request_meta(tasks: bool) -> Value {
    let mut extensions = serde_json::Map::new();
    if tasks {
        extensions.insert(TASKS_EXTENSION.into(), json!({}));
    }
    json!({
        "io.modelcontextprotocol/protocolVersion": PROTOCOL_VERSION,
        "io.modelcontextprotocol/clientCapabilities": {"extensions": extensions},
        "io.modelcontextprotocol/clientInfo": {"name": "taskgate-cli", "version": env!("CARGO_PKG_VERSION")},
    })
}

impl Client {
    pub fn new(url: &str, tasks: bool) -> Result<Client, ClientError> {
        let uri: Uri = url.parse().map_err(|_| ClientError::BadUrl(url.into()))?;
        if uri.scheme_str() != Some("http") || uri.host().is_none() {
            return Err(ClientError::BadUrl(url.into()));
        }
        Ok(Client {
            url: url.into(),
            uri,
            tasks,
            next_id: std::sync::atomic::AtomicU64::new(1),
            conn: tokio::sync::Mutex::new(None),
            token: None,
            busy_retries: 0,
            busy_answers: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Sends a request again, up to `retries` times, when the server answers
    /// that it is busy, each time after the wait the answer asks for
    /// (`data.retryAfterMs`, else `Retry-After`, else one second; within
    /// 10 ms..=30 s). Such a request was refused before the server read it,
    /// so sending it again is safe. Without this a busy answer is an error
    /// at once.
    pub fn with_busy_retries(mut self, retries: u32) -> Client {
        self.busy_retries = retries;
        self
    }

    /// Busy answers this client has received (each retried while retries
    /// were left).
    pub fn busy_answers(&self) -> u64 {
        self.busy_answers.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sends `token` as a bearer credential with every request.
    pub fn with_token(mut self, token: Option<String>) -> Client {
        self.token = token;
        self
    }

    fn meta(&self, extra: Option<(&str, Value)>) -> Value {
        let mut meta = request_meta(self.tasks);
        if let Some((k, v)) = extra {
            meta[k] = v;
        }
        meta
    }

    /// Sends one request and returns its `result`.
    pub async fn request(
        &self,
        method: &str,
        mut params: Value,
        name: Option<&str>,
        extra_meta: Option<(&str, Value)>,
    ) -> Result<Value, ClientError> {
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        params["_meta"] = self.meta(extra_meta);
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let body = body.to_string();
        self.sending(id, || {
            let exchange = self.exchange(method, name, body.clone());
            async {
                tokio::time::timeout(REQUEST_TIMEOUT, exchange)
                    .await
                    .map_err(|_| ClientError::Timeout(REQUEST_TIMEOUT))?
            }
        })
        .await
    }

    /// Sends with `send` until an answer is not busy or the busy retries
    /// are spent, waiting before each retry what the busy answer asked for.
    /// Apart from the exchange, so that a test can count what is sent when
    /// on a paused clock.
    async fn sending<F: Future<Output = Result<Answer, ClientError>>>(
        &self,
        id: u64,
        mut send: impl FnMut() -> F,
    ) -> Result<Value, ClientError> {
        let mut answers = 0u32;
        loop {
            let answer = send().await?;
            let wait = busy_wait(&answer);
            let outcome = self.read_answer(answer, id);
            let Some(wait) = wait else {
                return outcome;
            };
            self.busy_answers
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            answers += 1;
            if answers > self.busy_retries {
                let last = match outcome {
                    Err(e) => e,
                    Ok(_) => {
                        return Err(ClientError::Decode(
                            "a 503 busy answer that also carried a result".into(),
                        ));
                    }
                };
                return Err(if self.busy_retries == 0 {
                    last
                } else {
                    ClientError::StillBusy {
                        answers,
                        last: Box::new(last),
                    }
                });
            }
            tokio::time::sleep(wait).await;
        }
    }

    /// The `result` of an answer, or the error it carries.
    fn read_answer(&self, answer: Answer, id: u64) -> Result<Value, ClientError> {
        let text = answer.text;
        // JSON-RPC errors may come with a 4xx status; the body says more.
        if answer.status >= 400 && !text.trim_start().starts_with('{') && !text.contains("data:") {
            return Err(ClientError::Status {
                url: self.url.clone(),
                status: answer.status,
                body: text.trim().to_string(),
            });
        }
        let message = response_message(&text, id)?;
        if let Some(err) = message.get("error") {
            return Err(ClientError::Rpc {
                code: err.get("code").and_then(Value::as_i64).unwrap_or(0),
                message: err
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                error: err.clone(),
            });
        }
        message
            .get("result")
            .cloned()
            .ok_or_else(|| ClientError::Decode("response has neither result nor error".into()))
    }

    async fn connect(&self) -> Result<Sender, ClientError> {
        // An IPv6 address is bracketed in a URI, never in a socket address.
        let host = self
            .uri
            .host()
            .unwrap_or("127.0.0.1")
            .trim_start_matches('[')
            .trim_end_matches(']');
        let port = self.uri.port_u16().unwrap_or(80);
        let stream =
            TcpStream::connect((host, port))
                .await
                .map_err(|source| ClientError::Connect {
                    url: self.url.clone(),
                    source,
                })?;
        let _ = stream.set_nodelay(true);
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| ClientError::Http {
                url: self.url.clone(),
                detail: e.to_string(),
            })?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }

    async fn exchange(
        &self,
        method: &str,
        name: Option<&str>,
        body: String,
    ) -> Result<Answer, ClientError> {
        let host = self.uri.host().unwrap_or("127.0.0.1");
        let port = self.uri.port_u16().unwrap_or(80);
        let http = |e: hyper::Error| ClientError::Http {
            url: self.url.clone(),
            detail: e.to_string(),
        };
        let mut slot = self.conn.lock().await;
        let reusable = match slot.take() {
            Some(mut s) => s.ready().await.is_ok().then_some(s),
            None => None,
        };
        let mut sender = match reusable {
            Some(s) => s,
            None => self.connect().await?,
        };
        let path = self
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/mcp");
        let mut req = Request::post(path)
            .header("host", format!("{host}:{port}"))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", PROTOCOL_VERSION)
            .header("mcp-method", method);
        if let Some(n) = name {
            req = req.header("mcp-name", n);
        }
        if let Some(token) = &self.token {
            req = req.header("authorization", format!("Bearer {token}"));
        }
        let req = req
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| ClientError::Http {
                url: self.url.clone(),
                detail: e.to_string(),
            })?;
        let resp = sender.send_request(req).await.map_err(http)?;
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get(hyper::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let limited = http_body_util::Limited::new(resp.into_body(), MAX_RESPONSE_BYTES);
        let bytes = limited
            .collect()
            .await
            .map_err(|e| ClientError::Http {
                url: self.url.clone(),
                detail: e.to_string(),
            })?
            .to_bytes();
        // The connection serves the next request too.
        *slot = Some(sender);
        drop(slot);
        Ok(Answer {
            status,
            retry_after,
            text: String::from_utf8_lossy(&bytes).into_owned(),
        })
    }

    /// `tools/call`.
    pub async fn call_tool(
        &self,
        tool: &str,
        arguments: Value,
        operation_id: Option<&str>,
    ) -> Result<Value, ClientError> {
        self.request(
            "tools/call",
            json!({"name": tool, "arguments": arguments}),
            Some(tool),
            operation_id.map(|o| ("dev.taskgate/operationId", json!(o))),
        )
        .await
    }

    pub async fn get_task(&self, id: &str) -> Result<Value, ClientError> {
        self.request("tasks/get", json!({"taskId": id}), Some(id), None)
            .await
    }

    pub async fn cancel_task(&self, id: &str) -> Result<Value, ClientError> {
        self.request("tasks/cancel", json!({"taskId": id}), Some(id), None)
            .await
    }

    /// Polls until the task is terminal, honouring `pollIntervalMs`.
    pub async fn wait_task(&self, id: &str, first: &Value) -> Result<Value, ClientError> {
        let mut interval = poll_interval(first);
        loop {
            tokio::time::sleep(interval).await;
            let t = match self.get_task(id).await {
                Err(ClientError::Rpc { error, .. })
                    if error.pointer("/data/retryAfterMs").is_some() =>
                {
                    let ms = error
                        .pointer("/data/retryAfterMs")
                        .and_then(Value::as_u64)
                        .unwrap_or(100);
                    interval = Duration::from_millis(ms.max(10));
                    continue;
                }
                other => other?,
            };
            match t.get("status").and_then(Value::as_str) {
                Some("completed" | "failed" | "cancelled") => return Ok(t),
                _ => interval = poll_interval(&t),
            }
        }
    }
}

/// How long to wait before sending again, if `answer` says the server is
/// busy: a 503 carrying `TG_SERVER_BUSY` (a request bound), or the plain
/// 503 of the connection bound. Any other 503 (`TG_SERVER_STOPPING`,
/// `TG_SESSIONS_FULL`) is not a busy answer: sending again would not help.
fn busy_wait(answer: &Answer) -> Option<Duration> {
    if answer.status != 503 {
        return None;
    }
    let hinted_ms = match serde_json::from_str::<Value>(&answer.text) {
        Ok(v) => {
            let error = v.get("error")?;
            if error.get("code").and_then(Value::as_i64) != Some(crate::wire::SERVER_BUSY.code) {
                return None;
            }
            error.pointer("/data/retryAfterMs").and_then(Value::as_u64)
        }
        // The connection bound answers in plain text, before any request
        // was read.
        Err(_) if answer.retry_after.is_some() => None,
        Err(_) => return None,
    };
    let wait = hinted_ms
        .map(Duration::from_millis)
        .or(answer.retry_after)
        .unwrap_or(DEFAULT_BUSY_WAIT);
    Some(wait.clamp(MIN_BUSY_WAIT, MAX_BUSY_WAIT))
}

fn poll_interval(task: &Value) -> Duration {
    Duration::from_millis(
        task.get("pollIntervalMs")
            .and_then(Value::as_u64)
            .unwrap_or(1000)
            .clamp(10, 60_000),
    )
}

/// The JSON-RPC response with `id` in a JSON body or an SSE stream.
fn response_message(text: &str, id: u64) -> Result<Value, ClientError> {
    if let Ok(v) = serde_json::from_str::<Value>(text) {
        return Ok(v);
    }
    for line in text.lines() {
        if let Some(data) = line.strip_prefix("data:")
            && let Ok(v) = serde_json::from_str::<Value>(data.trim())
            && v.get("id").and_then(Value::as_u64) == Some(id)
        {
            return Ok(v);
        }
    }
    Err(ClientError::Decode(format!(
        "no JSON-RPC response in: {}",
        text.chars().take(200).collect::<String>()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A busy answer as the daemon sends it: 503, `Retry-After`, and the
    /// JSON-RPC error (with `data.retryAfterMs` when `hint_ms` is given).
    fn busy(retry_after: Option<u64>, hint_ms: Option<u64>) -> Answer {
        let mut error = json!({"code": crate::wire::SERVER_BUSY.code, "message": "busy"});
        if let Some(ms) = hint_ms {
            error["data"] = json!({ "retryAfterMs": ms });
        }
        Answer {
            status: 503,
            retry_after: retry_after.map(Duration::from_secs),
            text: json!({"jsonrpc": "2.0", "id": 1, "error": error}).to_string(),
        }
    }

    /// When, on the paused clock, each attempt was sent, answered busy
    /// every time, by a client allowed `retries` retries.
    async fn busy_attempts(retries: u32, answer: impl Fn() -> Answer) -> Vec<Duration> {
        let client = Client::new("http://127.0.0.1:1/mcp", true)
            .unwrap_or_else(|e| panic!("{e}"))
            .with_busy_retries(retries);
        let start = tokio::time::Instant::now();
        let mut sent = Vec::new();
        let got = client
            .sending(1, || {
                sent.push(start.elapsed());
                std::future::ready(Ok(answer()))
            })
            .await;
        match got {
            Err(ClientError::StillBusy { answers, .. }) => assert_eq!(answers, retries + 1),
            other => panic!("expected the client to give up, got {other:?}"),
        }
        assert_eq!(client.busy_answers(), u64::from(retries) + 1);
        sent
    }

    /// Each retry is sent exactly when the busy answer said to, never
    /// sooner: the wait is the paused clock's, so nothing here depends on
    /// how fast the machine is.
    #[tokio::test(start_paused = true)]
    async fn a_busy_answer_is_sent_again_after_the_wait_it_asks_for() {
        let s = Duration::from_secs;
        // The daemon's answer: `Retry-After: 1` and `retryAfterMs` 1000.
        assert_eq!(
            busy_attempts(2, || busy(Some(1), Some(1000))).await,
            [s(0), s(1), s(2)]
        );
        // `data.retryAfterMs` is the finer hint and wins.
        assert_eq!(
            busy_attempts(1, || busy(Some(1), Some(250))).await,
            [s(0), Duration::from_millis(250)]
        );
        // `Retry-After` alone, then no hint at all (one second).
        assert_eq!(busy_attempts(1, || busy(Some(3), None)).await, [s(0), s(3)]);
        assert_eq!(busy_attempts(1, || busy(None, None)).await, [s(0), s(1)]);
    }

    /// Without retries a busy answer is the error itself, at once.
    #[tokio::test(start_paused = true)]
    async fn a_client_told_nothing_sends_once() {
        let client = Client::new("http://127.0.0.1:1/mcp", true).unwrap_or_else(|e| panic!("{e}"));
        let mut sent = 0;
        let got = client
            .sending(1, || {
                sent += 1;
                std::future::ready(Ok(busy(Some(1), Some(1000))))
            })
            .await;
        assert!(
            matches!(got, Err(ClientError::Rpc { code, .. }) if code == crate::wire::SERVER_BUSY.code),
            "{got:?}"
        );
        assert_eq!(sent, 1);
    }

    /// The client's default URL is the daemon's default listen address: one
    /// definition of that address, in the configuration's key table.
    #[test]
    fn the_default_url_is_the_default_listen_address() {
        assert_eq!(
            DEFAULT_URL,
            format!("http://{}/mcp", crate::config::DEFAULT_LISTEN)
        );
    }
}
