//! MCP over stdin/stdout, with every incoming line screened first.
//!
//! The protocol library reads newline-delimited JSON-RPC from stdin and
//! silently drops a line it cannot parse, so a client that sends a
//! malformed line waits forever. Here a pump sits between the process's
//! stdio and the library: each line is read (at most
//! `server.max_request_bytes`), passed through [`screen`], and either handed
//! on or answered at once with its JSON-RPC error. Answers from the library
//! and from the screen go out whole lines at a time, so they never
//! interleave mid-message.

use std::future::Future;

use tokio::io::{
    AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, DuplexStream,
};
use tokio::sync::mpsc;

use super::screen::{self, Refused};
use crate::wire;

/// Room in each in-process pipe between the pump and the library.
const PIPE_BYTES: usize = 64 * 1024;

/// Screened errors waiting to be written; past it, reading pauses.
const PENDING_REFUSALS: usize = 64;

/// The library's side of the pipes, and the pump that joins them to
/// `input` and `output`. The pump ends once the library has closed its
/// output and every answer is written.
pub fn screened<R, W>(
    input: R,
    output: W,
    max_line_bytes: usize,
) -> (
    (DuplexStream, DuplexStream),
    impl Future<Output = std::io::Result<()>> + Send + 'static,
)
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (to_library, library_reads) = tokio::io::duplex(PIPE_BYTES);
    let (library_writes, from_library) = tokio::io::duplex(PIPE_BYTES);
    let (refusals, pending) = mpsc::channel(PENDING_REFUSALS);
    let pump = async move {
        let reading = tokio::spawn(read_lines(
            tokio::io::BufReader::new(input),
            to_library,
            refusals,
            max_line_bytes,
        ));
        let written = write_lines(tokio::io::BufReader::new(from_library), pending, output).await;
        reading.abort();
        written
    };
    ((library_reads, library_writes), pump)
}

/// One line as read: whole, or cut off past the bound.
enum Line {
    Whole(Vec<u8>),
    TooLong,
    End,
}

/// Reads up to the next newline, keeping at most `max` bytes; a longer
/// line is consumed to its end and reported as too long.
async fn next_line<R: AsyncBufRead + Unpin>(input: &mut R, max: usize) -> std::io::Result<Line> {
    let mut line = Vec::new();
    let mut too_long = false;
    loop {
        let available = input.fill_buf().await?;
        if available.is_empty() {
            return Ok(match (too_long, line.is_empty()) {
                (true, _) => Line::TooLong,
                (false, true) => Line::End,
                (false, false) => Line::Whole(line),
            });
        }
        let (chunk, found) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (&available[..i], Some(i + 1)),
            None => (available, None),
        };
        if !too_long && line.len() + chunk.len() <= max {
            line.extend_from_slice(chunk);
        } else {
            too_long = true;
            line = Vec::new();
        }
        let used = found.unwrap_or(available.len());
        input.consume(used);
        if found.is_some() {
            return Ok(if too_long {
                Line::TooLong
            } else {
                Line::Whole(line)
            });
        }
    }
}

async fn read_lines<R: AsyncBufRead + Unpin>(
    mut input: R,
    mut to_library: DuplexStream,
    refusals: mpsc::Sender<Refused>,
    max: usize,
) {
    loop {
        let refusal = match next_line(&mut input, max).await {
            Ok(Line::End) => break,
            Err(e) => {
                tracing::warn!(error = %e, "reading stdin failed: {e}");
                break;
            }
            Ok(Line::TooLong) => Refused::new(
                wire::REQUEST_TOO_LARGE,
                format!("the message is longer than server.max_request_bytes = {max}"),
                serde_json::Value::Null,
            ),
            Ok(Line::Whole(mut line)) => {
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                // stdio carries no version beside the message: its `_meta` alone
                // declares the era.
                match screen::screen(&line, None) {
                    Ok(_) => {
                        line.push(b'\n');
                        if to_library.write_all(&line).await.is_err() {
                            // The library has stopped reading: the session is over.
                            break;
                        }
                        continue;
                    }
                    Err(refusal) => refusal,
                }
            }
        };
        if refusals.send(refusal).await.is_err() {
            break;
        }
    }
    // Dropping the pipe tells the library the client is gone.
    drop(to_library);
}

async fn write_lines<W: AsyncWrite + Unpin>(
    mut from_library: tokio::io::BufReader<DuplexStream>,
    mut pending: mpsc::Receiver<Refused>,
    mut output: W,
) -> std::io::Result<()> {
    // Kept across turns: a read interrupted by a refusal keeps its bytes
    // here and goes on where it stopped.
    let mut line = Vec::new();
    let mut refusals_open = true;
    loop {
        tokio::select! {
            read = from_library.read_until(b'\n', &mut line) => {
                let at_end = read? == 0;
                output.write_all(&line).await?;
                line.clear();
                if at_end {
                    break;
                }
            }
            refusal = pending.recv(), if refusals_open => match refusal {
                Some(refusal) => {
                    let mut text = refusal.to_json().to_string();
                    text.push('\n');
                    output.write_all(text.as_bytes()).await?;
                }
                None => refusals_open = false,
            },
        }
        output.flush().await?;
    }
    // The library is done; answer what the screen still holds.
    while let Ok(refusal) = pending.try_recv() {
        let mut text = refusal.to_json().to_string();
        text.push('\n');
        output.write_all(text.as_bytes()).await?;
    }
    output.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    async fn lines_of(input: &[u8], max: usize) -> Vec<String> {
        let mut reader = tokio::io::BufReader::new(input);
        let mut out = Vec::new();
        loop {
            match next_line(&mut reader, max).await.unwrap() {
                Line::End => return out,
                Line::TooLong => out.push("<too long>".into()),
                Line::Whole(l) => out.push(String::from_utf8(l).unwrap()),
            }
        }
    }

    #[tokio::test]
    async fn lines_are_bounded_and_a_long_one_is_skipped_whole() {
        let got = lines_of(b"abc\n0123456789\nxy\nlast", 5).await;
        assert_eq!(got, ["abc", "<too long>", "xy", "last"]);
    }

    #[tokio::test]
    async fn a_malformed_line_is_answered_and_good_ones_reach_the_library() {
        let (client, pump_input) = tokio::io::duplex(1024);
        let (pump_output, mut client_reads) = tokio::io::duplex(1024);
        let ((mut library_reads, library_writes), pump) = screened(pump_input, pump_output, 1024);
        let pump = tokio::spawn(pump);
        let mut client = client;
        client
            .write_all(b"{oops\n{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n")
            .await
            .unwrap();
        drop(client);
        let mut seen = String::new();
        library_reads.read_to_string(&mut seen).await.unwrap();
        assert_eq!(seen, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n");
        drop(library_writes);
        pump.await.unwrap().unwrap();
        let mut answered = String::new();
        client_reads.read_to_string(&mut answered).await.unwrap();
        let answer: serde_json::Value = serde_json::from_str(answered.trim()).unwrap();
        assert_eq!(answer["error"]["code"], -32700, "{answered}");
    }
}
