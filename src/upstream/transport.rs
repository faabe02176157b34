//! Reaching an upstream: its stdio program started under the shim, or
//! its streamable-HTTP endpoint through reqwest on the one rustls (ring)
//! stack the daemon already has. Whatever the transport, what comes back
//! is bounded before rmcp parses it.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, ReadBuf};

use crate::config::{UpstreamConfig, UpstreamTransport};
use crate::tools::confine;
use crate::tools::process::{Invocation, Server};

/// Why taskgate itself closed a connection (the reader refused what the
/// upstream sent): the calls in flight are told this rather than only that
/// the connection ended.
#[derive(Debug, Default)]
pub struct Refusal(AtomicU8);

const NONE: u8 = 0;
const OVERSIZED: u8 = 1;
const NOT_JSON: u8 = 2;
const TOO_MANY_TOOLS: u8 = 3;

/// What made the reader close the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// One message was longer than `max_response_bytes`.
    Oversized,
    /// A line that is not JSON.
    NotJson,
    /// A tool list longer than `max_tools` in one message.
    TooManyTools,
}

impl Refusal {
    pub fn get(&self) -> Option<Refused> {
        match self.0.load(Ordering::SeqCst) {
            OVERSIZED => Some(Refused::Oversized),
            NOT_JSON => Some(Refused::NotJson),
            TOO_MANY_TOOLS => Some(Refused::TooManyTools),
            _ => None,
        }
    }

    fn set(&self, what: u8) {
        let _ = self
            .0
            .compare_exchange(NONE, what, Ordering::SeqCst, Ordering::SeqCst);
    }
}

/// The upstream's stdout as rmcp reads it: only whole lines, each at most
/// `limit` bytes and each JSON. A longer line or one that is not JSON ends
/// the stream (rmcp sees the upstream close) and says why in `refusal`:
/// rmcp alone would drop an oversized line and keep waiting, so the call
/// it answered would hang until its timeout, and would skip a line it
/// cannot parse the same way.
pub struct Lines<R> {
    inner: R,
    limit: usize,
    max_tools: usize,
    refusal: Arc<Refusal>,
    /// The line being read.
    line: Vec<u8>,
    /// Checked bytes not yet handed to the reader.
    ready: Vec<u8>,
    offset: usize,
    ended: bool,
}

impl<R> Lines<R> {
    pub fn new(inner: R, limit: usize, max_tools: usize, refusal: Arc<Refusal>) -> Lines<R> {
        Lines {
            inner,
            limit,
            max_tools,
            refusal,
            line: Vec::new(),
            ready: Vec::new(),
            offset: 0,
            ended: false,
        }
    }

    /// Takes `chunk` in; false once the stream must end.
    fn take(&mut self, chunk: &[u8]) -> bool {
        let mut rest = chunk;
        while !rest.is_empty() {
            let (part, newline) = match rest.iter().position(|b| *b == b'\n') {
                Some(i) => (&rest[..i], true),
                None => (rest, false),
            };
            rest = &rest[part.len() + usize::from(newline)..];
            if self.line.len() + part.len() > self.limit {
                self.refusal.set(OVERSIZED);
                return false;
            }
            self.line.extend_from_slice(part);
            if !newline {
                continue;
            }
            let line = std::mem::take(&mut self.line);
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            // One pass that checks the syntax and counts a tool list's
            // entries without building them: 100,000 small tools fit in
            // `max_response_bytes` but would take many times that in
            // memory once parsed.
            match serde_json::from_slice::<Probe>(&line) {
                Err(_) => {
                    self.refusal.set(NOT_JSON);
                    return false;
                }
                Ok(Probe {
                    result:
                        Some(ProbeResult {
                            tools: Some(Count(n)),
                        }),
                }) if n > self.max_tools => {
                    self.refusal.set(TOO_MANY_TOOLS);
                    return false;
                }
                Ok(_) => {}
            }
            self.ready.extend_from_slice(&line);
            self.ready.push(b'\n');
        }
        true
    }
}

/// What [`Lines`] reads of a message: the length of a result's `tools`.
#[derive(serde::Deserialize)]
struct Probe {
    result: Option<ProbeResult>,
}

#[derive(serde::Deserialize)]
struct ProbeResult {
    tools: Option<Count>,
}

/// The length of a JSON array, its elements skipped (anything else is 0).
struct Count(usize);

impl<'de> serde::Deserialize<'de> for Count {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Count, D::Error> {
        struct Counting;
        impl<'de> serde::de::Visitor<'de> for Counting {
            type Value = Count;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Count, A::Error> {
                let mut n = 0;
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                    n += 1;
                }
                Ok(Count(n))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Count, A::Error> {
                while map
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {}
                Ok(Count(0))
            }
            fn visit_unit<E>(self) -> Result<Count, E> {
                Ok(Count(0))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Count, E> {
                Ok(Count(0))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Count, E> {
                Ok(Count(0))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Count, E> {
                Ok(Count(0))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Count, E> {
                Ok(Count(0))
            }
            fn visit_str<E>(self, _: &str) -> Result<Count, E> {
                Ok(Count(0))
            }
        }
        d.deserialize_any(Counting)
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Lines<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.offset < this.ready.len() {
                let n = (this.ready.len() - this.offset).min(buf.remaining());
                buf.put_slice(&this.ready[this.offset..this.offset + n]);
                this.offset += n;
                if this.offset == this.ready.len() {
                    this.ready.clear();
                    this.offset = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.ended {
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 16 * 1024];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) if read.filled().is_empty() => {
                    this.ended = true;
                }
                Poll::Ready(Ok(())) => {
                    let filled = read.filled().to_vec();
                    // The whole lines before a refused one are still
                    // handed over, then the stream ends.
                    if !this.take(&filled) {
                        this.ended = true;
                    }
                }
            }
        }
    }
}

/// A started stdio upstream: its process, and its pipes for rmcp.
pub struct Child {
    pub server: Server,
    pub stdin: tokio::process::ChildStdin,
    pub stdout: Lines<tokio::process::ChildStdout>,
}

/// Most lines of an upstream's stderr logged per connection; the rest are
/// counted, not logged, so that a chatty upstream cannot flood the journal.
const MAX_STDERR_LINES: usize = 200;

/// Longest stderr line logged (the rest of it is cut).
const MAX_STDERR_LINE: usize = 1024;

/// Starts a stdio upstream's program the way a command tool's runs: the
/// shim, its confinement and resource limits, only the allow-listed
/// environment. Its stderr is logged, bounded.
pub fn spawn(
    config: &UpstreamConfig,
    protected: &[PathBuf],
    refusal: Arc<Refusal>,
) -> Result<Child, String> {
    let UpstreamTransport::Stdio(process) = &config.transport else {
        return Err("not a command upstream".into());
    };
    let env = process
        .env
        .iter()
        .filter_map(|name| std::env::var(name).ok().map(|v| (name.clone(), v)))
        .collect();
    let inv = Invocation {
        argv: process.argv.clone(),
        env,
        working_dir: process.working_dir.clone(),
        stdin: Vec::new(),
        timeout: Duration::MAX,
        max_stdout: 0,
        max_stderr: 0,
        grace: Duration::from_secs(5),
        limits: Some(confine::limits(process)),
        paths: confine::paths(process, protected),
    };
    let mut server = Server::spawn(&inv).map_err(|e| e.to_string())?;
    let (Some(stdin), Some(stdout), Some(stderr)) = (
        server.child.stdin.take(),
        server.child.stdout.take(),
        server.child.stderr.take(),
    ) else {
        return Err("the program's pipes were not set up".into());
    };
    tokio::spawn(log_stderr(stderr, config.alias.clone()));
    let limit = usize::try_from(config.limits.max_response_bytes).unwrap_or(usize::MAX);
    Ok(Child {
        server,
        stdin,
        stdout: Lines::new(stdout, limit, config.limits.max_tools, refusal),
    })
}

/// Logs an upstream's stderr line by line: at most [`MAX_STDERR_LINES`]
/// lines of at most [`MAX_STDERR_LINE`] bytes each are kept; the rest of a
/// longer line is read and dropped, so a line without end costs no memory.
async fn log_stderr(stderr: tokio::process::ChildStderr, alias: String) {
    use tokio::io::AsyncBufReadExt;
    let mut reader = tokio::io::BufReader::new(stderr);
    let mut line: Vec<u8> = Vec::with_capacity(MAX_STDERR_LINE);
    let (mut logged, mut dropped) = (0usize, 0usize);
    let mut emit = |line: &mut Vec<u8>| {
        if logged < MAX_STDERR_LINES {
            let text = String::from_utf8_lossy(line);
            tracing::info!(upstream = %alias, "upstream {alias} stderr: {}", text.trim_end());
            logged += 1;
        } else {
            dropped += 1;
        }
        line.clear();
    };
    loop {
        let (used, ended) = {
            let buf = match reader.fill_buf().await {
                Ok(buf) if !buf.is_empty() => buf,
                _ => break,
            };
            let end = buf.iter().position(|b| *b == b'\n');
            let part = &buf[..end.unwrap_or(buf.len())];
            let room = MAX_STDERR_LINE.saturating_sub(line.len());
            line.extend_from_slice(&part[..part.len().min(room)]);
            (end.map_or(buf.len(), |i| i + 1), end.is_some())
        };
        reader.consume(used);
        if ended {
            emit(&mut line);
        }
    }
    if !line.is_empty() {
        emit(&mut line);
    }
    if dropped > 0 {
        tracing::info!(upstream = %alias, "upstream {alias}: {dropped} more stderr lines not logged");
    }
}

/// Where the system's trusted certificates are, for an `https` upstream
/// without a `ca_file` (Debian's ca-certificates bundle).
const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

fn trust_roots(ca_file: Option<&Path>) -> Result<tokio_rustls::rustls::RootCertStore, String> {
    use tokio_rustls::rustls::pki_types::CertificateDer;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    let path = ca_file.unwrap_or(Path::new(SYSTEM_CA_BUNDLE));
    let mut roots = tokio_rustls::rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("cannot read the CA file {}: {e}", path.display()))?;
    for cert in certs {
        let cert = cert.map_err(|e| format!("{}: {e}", path.display()))?;
        roots
            .add(cert)
            .map_err(|e| format!("{}: a certificate is unusable: {e}", path.display()))?;
    }
    if roots.is_empty() {
        return Err(format!("{} holds no certificate", path.display()));
    }
    Ok(roots)
}

/// The HTTP client of one upstream: TLS on ring with the configured (or
/// the system's) trust roots, no redirects (a redirect could take the
/// credential elsewhere), no proxy from the environment, the connect
/// timeout of the upstream.
pub fn http_client(
    url: &str,
    ca_file: Option<&Path>,
    connect_timeout: Duration,
) -> Result<reqwest::Client, String> {
    // reqwest wants a TLS configuration for every client, so a plain
    // http:// one gets one that trusts nothing (and is never used).
    let roots = if url.starts_with("https://") {
        trust_roots(ca_file)?
    } else {
        tokio_rustls::rustls::RootCertStore::empty()
    };
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let tls = tokio_rustls::rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut builder = reqwest::Client::builder();
    // `localhost` is loopback by the configuration's rule, whatever the
    // resolver (or a DNS search domain) would make of it.
    if let Ok(parsed) = reqwest::Url::parse(url)
        && parsed.host_str() == Some("localhost")
    {
        let port = parsed.port_or_known_default().unwrap_or(80);
        builder = builder.resolve_to_addrs(
            "localhost",
            &[
                std::net::SocketAddr::from(([127, 0, 0, 1], port)),
                std::net::SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port)),
            ],
        );
    }
    builder
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .connect_timeout(connect_timeout)
        // No idle connections kept: one left with an unread response
        // body would stall the next request on TCP's delayed ACK (rmcp's
        // own client makes the same choice).
        .pool_max_idle_per_host(0)
        .tls_backend_preconfigured(tls)
        .build()
        .map_err(|e| format!("HTTP client setup: {e}"))
}

/// Longest bearer credential taken from its file.
const MAX_BEARER_BYTES: usize = 8192;

/// The bearer credential in `file`: its first line, trimmed, from a file
/// as private as taskgate's own credential files. Read at start (and by
/// `check` and a reload, which refuse a missing or unsafe file) and at each
/// connection, so that a rotated credential needs no reload.
pub fn bearer(file: &Path, alias: &str) -> Result<String, crate::auth::AuthError> {
    let key = format!("upstream {alias:?} bearer_token_file");
    let text = crate::auth::read_secret_file(file, "upstream bearer credential", &key)?;
    let token = text.lines().next().unwrap_or_default().trim().to_string();
    if token.is_empty() || token.len() > MAX_BEARER_BYTES || token.contains(char::is_control) {
        return Err(crate::auth::AuthError::Invalid {
            path: file.to_path_buf(),
            message: format!(
                "{key} holds no usable credential: one line of at most {MAX_BEARER_BYTES} bytes without control characters"
            ),
        });
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    async fn read_all(input: &[u8], limit: usize) -> (Vec<u8>, Option<Refused>) {
        let refusal = Arc::new(Refusal::default());
        let mut lines = Lines::new(input, limit, 2, refusal.clone());
        let mut out = Vec::new();
        lines.read_to_end(&mut out).await.unwrap();
        (out, refusal.get())
    }

    #[tokio::test]
    async fn whole_json_lines_pass_and_anything_else_ends_the_stream() {
        let (out, why) = read_all(b"{\"a\":1}\n\n{\"b\":2}\n{\"c\"", 64).await;
        assert_eq!(out, b"{\"a\":1}\n{\"b\":2}\n");
        assert_eq!(why, None);

        let (out, why) = read_all(b"{\"a\":1}\n\x00\xff not json {{{\n{\"b\":2}\n", 64).await;
        assert_eq!(out, b"{\"a\":1}\n");
        assert_eq!(why, Some(Refused::NotJson));

        let long = format!("{{\"a\":\"{}\"}}\n{{\"b\":2}}\n", "x".repeat(100));
        let (out, why) = read_all(long.as_bytes(), 64).await;
        assert!(out.is_empty());
        assert_eq!(why, Some(Refused::Oversized));
        // At the limit exactly, the line passes.
        let exact = format!("{{\"a\":\"{}\"}}\n", "x".repeat(56));
        assert_eq!(exact.len() - 1, 64);
        let (out, why) = read_all(exact.as_bytes(), 64).await;
        assert_eq!(out, exact.as_bytes());
        assert_eq!(why, None);

        // A tool list past max_tools (2 here) is refused before it is parsed.
        let two = b"{\"id\":1,\"result\":{\"tools\":[{},{}]}}\n";
        assert_eq!(read_all(two, 64).await, (two.to_vec(), None));
        let three = b"{\"id\":1,\"result\":{\"tools\":[{},{},{}]}}\n";
        assert_eq!(
            read_all(three, 64).await,
            (Vec::new(), Some(Refused::TooManyTools))
        );
        // A result without tools, or with tools that is not a list, passes.
        let other = b"{\"id\":1,\"result\":{\"content\":[1,2,3],\"tools\":\"x\"}}\n";
        assert_eq!(read_all(other, 64).await, (other.to_vec(), None));
    }
}
