"""A deliberately misbehaving upstream MCP server (python stdlib only), for
taskgate's tests of how it survives a bad upstream.

    python3 upstream_hostile.py MODE stdio
    python3 upstream_hostile.py MODE http PORT

Stdio speaks newline-delimited JSON-RPC. HTTP serves POST /mcp on
127.0.0.1:PORT, answering each request with one application/json body (no
SSE, no session id) and each notification or response with 202; GET and
DELETE get 405. With PORT 0 it picks a free port; in both HTTP cases it
prints `LISTENING <port>` on one stdout line once it accepts connections.

The handshake is a legacy one: `server/discover` (the 2026-07-28 lifecycle)
is refused with -32601 Method not found, so a client falls back to
`initialize`, which is answered with the client's protocolVersion when it is
a known one (2025-11-25 otherwise) and capabilities {"tools": {}}; `ping`
is answered too. What tools/list and tools/call do depends on MODE:

  normal   one tool `ok`; a call returns the text "ok"
  die      one tool `die`; a call makes the process exit at once with status
           1 (stdio), or closes the connection without a response (http;
           the server keeps running)
  hang     one tool `hang`; a call is never answered, while other requests
           still are
  huge     one tool `huge`; a call is answered with a valid result whose text
           is HOSTILE_HUGE_BYTES (100 MiB by default) of 'x', written in
           chunks
  garbage  one tool `garbage`; a call is answered with a line that is not
           JSON (b"\\x00\\xff not json {{{"), and the server keeps running
  many     100,000 tools `tool_000000`..`tool_099999`, listed in pages of
           1,000 with nextCursor, or in one page with HOSTILE_ONE_PAGE=1;
           a call to any of them returns "ok"
  drift    one tool `ok` whose definition is read from the JSON file named
           by HOSTILE_SCHEMA_FILE at each tools/list: the file holds an
           object whose members replace the tool's (description,
           inputSchema, title...); without the file the tool is as in normal
  refuse   one tool `refuse`; a call is answered with the JSON-RPC error
           -32000 "the upstream refuses: quota exhausted"
  slow     one tool `slow`; a call is answered "slept" after
           HOSTILE_SLOW_SECS seconds (default 2), other requests meanwhile
           (stdio only: a thread writes the late answer)

In every mode a tools/call behaves the mode's way whatever tool it names.

HOSTILE_MESSAGE_LOG names a file each received JSON-RPC message is appended
to, one a line. HOSTILE_LIST_CHANGED_FIFO (stdio only) names a FIFO: for each
line written to it the server sends notifications/tools/list_changed, so a
test changes the drift tool's file and then says so, as a server would. With UPSTREAM_HEADER_LOG set (HTTP only), every HTTP
request's method, path and headers (names lower-cased) are appended to that
file, one JSON object a line: {"method": ..., "path": ..., "headers": {...}}.
"""

import json
import os
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODES = ("normal", "die", "hang", "huge", "garbage", "many", "drift", "refuse", "slow")
KNOWN_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
GARBAGE = b"\x00\xff not json {{{"
PAGE = 1000
MANY = 100_000
CHUNK = 1 << 20

log_lock = threading.Lock()


def append_line(path, line):
    with log_lock, open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def ok_tool(name="ok"):
    return {
        "name": name,
        "description": f"The hostile server's {name} tool.",
        "inputSchema": {"type": "object", "properties": {}},
    }


def ok_result(text="ok"):
    return {"content": [{"type": "text", "text": text}], "isError": False}


class Reply:
    """What to do for one received message."""

    def __init__(self, kind, value=None):
        self.kind = kind  # "none", "json", "die", "garbage", "huge"
        self.value = value


def response(msg_id, result):
    return Reply("json", {"jsonrpc": "2.0", "id": msg_id, "result": result})


def error(msg_id, code, message):
    return Reply("json", {"jsonrpc": "2.0", "id": msg_id,
                          "error": {"code": code, "message": message}})


class Hostile:
    def __init__(self, mode):
        self.mode = mode

    def tools(self):
        if self.mode in ("normal",):
            return [ok_tool()]
        if self.mode == "drift":
            tool = ok_tool()
            path = os.environ.get("HOSTILE_SCHEMA_FILE")
            if path and os.path.exists(path):
                with open(path, encoding="utf-8") as f:
                    tool.update(json.load(f))
            return [tool]
        return [ok_tool(self.mode)]

    def list_tools(self, params):
        if self.mode != "many":
            return {"tools": self.tools()}
        if os.environ.get("HOSTILE_ONE_PAGE") == "1":
            start, end = 0, MANY
        else:
            cursor = (params or {}).get("cursor")
            start = int(cursor) if cursor else 0
            end = min(start + PAGE, MANY)
        result = {"tools": [ok_tool(f"tool_{i:06d}") for i in range(start, end)]}
        if end < MANY:
            result["nextCursor"] = str(end)
        return result

    def handle(self, msg):
        if not isinstance(msg, dict) or "method" not in msg:
            return Reply("none")  # a response or something unknown
        method = msg["method"]
        if "id" not in msg:
            return Reply("none")  # a notification
        msg_id = msg["id"]
        params = msg.get("params")
        if method == "server/discover":
            return error(msg_id, -32601, "Method not found: server/discover")
        if method == "initialize":
            asked = (params or {}).get("protocolVersion")
            return response(msg_id, {
                "protocolVersion": asked if asked in KNOWN_VERSIONS else KNOWN_VERSIONS[0],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": f"upstream-hostile-{self.mode}", "version": "1.0.0"},
            })
        if method == "ping":
            return response(msg_id, {})
        if method == "tools/list":
            try:
                return response(msg_id, self.list_tools(params))
            except (ValueError, OSError) as e:
                return error(msg_id, -32602, f"tools/list: {e}")
        if method == "tools/call":
            if self.mode == "die":
                return Reply("die")
            if self.mode == "hang":
                return Reply("none")
            if self.mode == "garbage":
                return Reply("garbage")
            if self.mode == "huge":
                return Reply("huge", msg_id)
            if self.mode == "slow":
                return Reply("slow", msg_id)
            if self.mode == "refuse":
                return error(msg_id, -32000, "the upstream refuses: quota exhausted")
            return response(msg_id, ok_result())
        return error(msg_id, -32601, f"Method not found: {method}")


def huge_parts(msg_id):
    """The huge result as a prefix, a chunk count and size, and a suffix."""
    total = int(os.environ.get("HOSTILE_HUGE_BYTES", str(100 << 20)))
    prefix = ('{"jsonrpc":"2.0","id":' + json.dumps(msg_id)
              + ',"result":{"content":[{"type":"text","text":"').encode()
    suffix = b'"}],"isError":false}}'
    return prefix, total, suffix


def write_huge(write, msg_id):
    prefix, total, suffix = huge_parts(msg_id)
    write(prefix)
    chunk = b"x" * CHUNK
    left = total
    while left > 0:
        n = min(left, CHUNK)
        write(chunk if n == CHUNK else chunk[:n])
        left -= n
    write(suffix)


def log_message(raw):
    path = os.environ.get("HOSTILE_MESSAGE_LOG")
    if path:
        append_line(path, raw.decode("utf-8", "replace").rstrip("\r\n"))


write_lock = threading.Lock()


def answer_late(out, msg_id):
    time.sleep(float(os.environ.get("HOSTILE_SLOW_SECS", "2")))
    with write_lock:
        out.write(json.dumps({"jsonrpc": "2.0", "id": msg_id, "result": ok_result("slept")}).encode() + b"\n")
        out.flush()


def announce_list_changes(out, fifo):
    notice = json.dumps({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}).encode()
    while True:
        # Opening blocks until a writer comes; its end is one batch.
        with open(fifo, "rb") as f:
            for _ in f:
                with write_lock:
                    out.write(notice + b"\n")
                    out.flush()


def serve_stdio(server):
    out = sys.stdout.buffer
    fifo = os.environ.get("HOSTILE_LIST_CHANGED_FIFO")
    if fifo:
        threading.Thread(target=announce_list_changes, args=(out, fifo), daemon=True).start()
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        log_message(line)
        try:
            msg = json.loads(line)
        except ValueError:
            reply = error(None, -32700, "Parse error")
        else:
            reply = server.handle(msg)
        if reply.kind == "slow":
            threading.Thread(target=answer_late, args=(out, reply.value), daemon=True).start()
            continue
        if reply.kind == "json":
            with write_lock:
                out.write(json.dumps(reply.value).encode() + b"\n")
        elif reply.kind == "die":
            os._exit(1)
        elif reply.kind == "garbage":
            out.write(GARBAGE + b"\n")
        elif reply.kind == "huge":
            write_huge(out.write, reply.value)
            out.write(b"\n")
        out.flush()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "upstream-hostile"
    hostile = None

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass  # keep stderr quiet

    def log_headers(self):
        path = os.environ.get("UPSTREAM_HEADER_LOG")
        if not path:
            return
        headers = {}
        for name, value in self.headers.items():
            key = name.lower()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        append_line(path, json.dumps({
            "method": self.command, "path": self.path.split("?")[0], "headers": headers,
        }))

    def read_body(self):
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return body
                body += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length", "0")))

    def setup(self):
        super().setup()
        # Headers and body go out in two writes: without this, Nagle's
        # algorithm holds the body for the client's delayed ACK (40 ms).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send_plain(self, status, body=b"", content_type="application/json", extra=()):
        self.send_response(status)
        if body or content_type:
            self.send_header("Content-Type", content_type)
        for name, value in extra:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def do_GET(self):
        self.log_headers()
        self.send_plain(405, b"", "text/plain", [("Allow", "POST")])

    do_DELETE = do_GET

    def do_POST(self):
        self.log_headers()
        body = self.read_body()
        if self.path.split("?")[0] != "/mcp":
            self.send_plain(404, b"", "text/plain")
            return
        log_message(body)
        try:
            msg = json.loads(body)
        except ValueError:
            self.send_plain(400, json.dumps(error(None, -32700, "Parse error").value).encode())
            return
        reply = self.hostile.handle(msg)
        if reply.kind == "none":
            if isinstance(msg, dict) and "id" in msg and "method" in msg:
                # hang: hold the request open for good; other requests are
                # served on their own threads.
                threading.Event().wait()
            self.send_plain(202, b"", None)
        elif reply.kind == "json":
            self.send_plain(200, json.dumps(reply.value).encode())
        elif reply.kind == "die":
            # Close the connection without writing a response.
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        elif reply.kind == "garbage":
            self.send_plain(200, GARBAGE)
        elif reply.kind == "huge":
            prefix, total, suffix = huge_parts(reply.value)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(prefix) + total + len(suffix)))
            self.end_headers()
            try:
                write_huge(self.wfile.write, reply.value)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def handle_error(self, request, client_address):
        # A client that hangs up mid-response is expected here.
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


def main():
    args = sys.argv[1:]
    if len(args) < 2 or args[0] not in MODES or not (
            args[1:] == ["stdio"] or (len(args) == 3 and args[1] == "http" and args[2].isdigit())):
        sys.exit(f"usage: upstream_hostile.py {'|'.join(MODES)} stdio | MODE http PORT")
    hostile = Hostile(args[0])
    if args[1] == "stdio":
        serve_stdio(hostile)
        return
    Handler.hostile = hostile
    httpd = Server(("127.0.0.1", int(args[2])), Handler)
    print(f"LISTENING {httpd.server_address[1]}", flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    main()
