"""A scriptable upstream MCP server that serves the Tasks extension
(io.modelcontextprotocol/tasks, protocol 2026-07-28), python stdlib only,
for taskgate's tests of routing tool calls to an upstream's tasks.

    python3 upstream_tasks.py MODE stdio
    python3 upstream_tasks.py MODE http PORT

Stdio speaks newline-delimited JSON-RPC. HTTP serves POST /mcp on
127.0.0.1:PORT, answering each request with one application/json body (no
SSE, no session id) and each notification or response with 202; GET and
DELETE get 405. With PORT 0 it picks a free port; in both HTTP cases it
prints `LISTENING <port>` on one stdout line once it accepts connections.
It checks no HTTP header (MCP-Protocol-Version, Mcp-Method, Mcp-Name).

Lifecycle. `server/discover` (2026-07-28) is answered with

    {"resultType": "complete",
     "supportedVersions": ["2024-11-05", "2025-03-26", "2025-06-18",
                           "2025-11-25", "2026-07-28"],
     "capabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}},
                      "tools": {}},
     "ttlMs": 0, "cacheScope": "private",
     "_meta": {"io.modelcontextprotocol/serverInfo":
               {"name": "upstream-tasks-MODE", "version": "1.0.0"}}}

so a client that prefers 2026-07-28 selects it and sees Tasks advertised;
a discover whose `_meta` names another protocol version gets -32022 with
data {"supported": [...]}. A legacy `initialize` is answered as by a
server without Tasks: the client's protocolVersion when it is a known
legacy one (2025-11-25 otherwise, also for 2026-07-28) and capabilities
{"tools": {}}. `ping` is answered {}. Every other request is taken on its
own: a request is "modern" when its `params._meta` names
io.modelcontextprotocol/protocolVersion "2026-07-28", and a modern result
carries `"resultType": "complete"` (tools/list also `"ttlMs": 0,
"cacheScope": "private"`); a legacy one does not.

One tool, `work`, input {"value": string} (required). A tools/call naming
another tool, or without a string `value`, gets -32602 and does nothing.
A tools/call is made a task when the request is modern and its
`_meta["io.modelcontextprotocol/clientCapabilities"].extensions` holds
"io.modelcontextprotocol/tasks"; the answer is a CreateTaskResult

    {"resultType": "task", "taskId": "up-<32 hex>", "status": "working",
     "createdAt": "...Z", "lastUpdatedAt": "...Z", "ttlMs": 3600000,
     "pollIntervalMs": UPSTREAM_TASKS_POLL_MS, "_meta": {ECHO}}

Otherwise the call is answered synchronously with the CallToolResult
{"content": [{"type": "text", "text": "done <value>"}], "isError": false,
"_meta": {ECHO}}. Task ids are random, so an id from before a restart is
unknown afterwards: tasks live in this process's memory only.

Effects. Each tools/call that does the work (a created task, or a
synchronous answer) appends one line to the file named by
UPSTREAM_TASKS_EFFECT_LOG, if set, before anything is answered:
{"task": "<id>" or null when synchronous, "value": "<value>", "envelope":
<the request's _meta["dev.taskgate/taskExecution"], or null>}.

A task completes UPSTREAM_TASKS_WORK_MS milliseconds (default 300) after
its creation (worked out when it is read). `tasks/get {taskId}` answers

    {"resultType": "complete", "taskId": ..., "status": "working" |
     "completed" | "cancelled", "createdAt": ..., "lastUpdatedAt": ...,
     "ttlMs": 3600000, "pollIntervalMs": ..., "_meta": {ECHO},
     "result": {"content": [{"type": "text", "text": "done <value>"}],
                "isError": false}}          (result only when completed)

`tasks/cancel {taskId}` makes a working task cancelled (a finished task
stays as it is) and `tasks/update {taskId, ...}` changes nothing; both
answer the acknowledgement {"resultType": "complete"}. An unknown taskId
(or none) on tasks/get, tasks/cancel or tasks/update gets -32602 "task
not found". Any other method gets -32601.

THE ECHO. A tools/call's `params._meta["dev.taskgate/taskExecution"]`
(taskgate's envelope: {"publicTaskId", "requestDigest", "bindingDigest",
"binding"}) is returned unchanged at `_meta["dev.taskgate/taskExecution"]`
of the CreateTaskResult, of a synchronous CallToolResult and of every
tasks/get result of that task. A call without the envelope gets no echo
(no `_meta` at all). MODE changes what happens:

  echo        the behaviour above
  noecho      never echoes
  wrongid     echoes the envelope with publicTaskId replaced by
              "tgr-" and 32 zeros (an envelope that is not an object is
              echoed as it came)
  lost        a tools/call records its effect line, then the process exits
              at once with status 1 without answering (stdio), or the
              connection is closed without a response while the server
              keeps running (http): the ambiguous dispatch
  hangcancel  tasks/cancel is never answered and changes nothing (the task
              goes on and completes); other requests still are answered
  failcancel  tasks/cancel is answered with the JSON-RPC error -32603
              "cancel failed" and changes nothing
  sync        every tools/call is answered synchronously, with the echo,
              even when the request declares Tasks
  forever     tasks never complete on their own: they stay working until
              cancelled
  othertask   tasks/get for any of its tasks answers with another task:
              taskId "up-" and 32 f's, status completed, the result
              {"content": [{"type": "text", "text": "another task's
              answer"}], ...}, and the asked-for task's own echo (so only
              the task ID gives it away)
  getnoecho   echoes at creation, but no tasks/get answer carries `_meta`
  getwrongecho  tasks/get answers echo the envelope with bindingDigest
              replaced by 64 zeros (creation echoes it unchanged)
  flakyget    the first tasks/get of each task gets the JSON-RPC error
              -32603 "temporarily unavailable"; later ones are answered
              as in echo
  restart     as echo, and each start of the process appends the line
              "START <pid>" to UPSTREAM_TASKS_EFFECT_LOG, so a test that
              kills the server can tell the sessions apart (a task id of an
              earlier process is unknown, -32602)

Environment:
  UPSTREAM_TASKS_EFFECT_LOG   the effect lines (and START lines), above
  UPSTREAM_TASKS_MESSAGE_LOG  each received JSON-RPC message is appended
                              to this file, one a line
  UPSTREAM_TASKS_WORK_MS      how long a task works, ms (default 300)
  UPSTREAM_TASKS_POLL_MS      the pollIntervalMs it suggests (default 100)
  UPSTREAM_HEADER_LOG         (HTTP only) each HTTP request's method, path
                              and headers (names lower-cased), one JSON
                              object a line: {"method", "path", "headers"}
"""

import json
import os
import secrets
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODES = ("echo", "noecho", "wrongid", "lost", "hangcancel", "failcancel",
         "sync", "forever", "restart", "othertask", "getnoecho", "getwrongecho",
         "flakyget")
OTHER_TASK = "up-" + "f" * 32
MODERN = "2026-07-28"
LEGACY_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
SUPPORTED = sorted(LEGACY_VERSIONS) + [MODERN]
TASKS = "io.modelcontextprotocol/tasks"
VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
CAPS_KEY = "io.modelcontextprotocol/clientCapabilities"
ENVELOPE = "dev.taskgate/taskExecution"
WRONG_ID = "tgr-" + "0" * 32
TTL_MS = 3_600_000

TOOL = {
    "name": "work",
    "description": "Does a little work on the value and reports it done.",
    "inputSchema": {
        "type": "object",
        "properties": {"value": {"type": "string"}},
        "required": ["value"],
    },
}

log_lock = threading.Lock()


def append_line(path, line):
    with log_lock, open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def env_ms(name, default):
    return int(os.environ.get(name, str(default)))


def iso(ms):
    """Milliseconds since the epoch as ISO 8601 UTC with milliseconds."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


def now_ms():
    return int(time.time() * 1000)


class Reply:
    """What to do for one received message."""

    def __init__(self, kind, value=None):
        self.kind = kind  # "none", "json", "lost", "hang"
        self.value = value


def response(msg_id, result):
    return Reply("json", {"jsonrpc": "2.0", "id": msg_id, "result": result})


def error(msg_id, code, message, data=None):
    err = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return Reply("json", {"jsonrpc": "2.0", "id": msg_id, "error": err})


def done_result(value):
    return {"content": [{"type": "text", "text": f"done {value}"}], "isError": False}


class Task:
    def __init__(self, task_id, value, echo, created):
        self.id = task_id
        self.value = value
        self.echo = echo  # the _meta to return, or None
        self.created = created
        self.cancelled_at = None
        self.gets = 0


class Upstream:
    def __init__(self, mode):
        self.mode = mode
        self.tasks = {}
        self.lock = threading.Lock()
        self.work_ms = env_ms("UPSTREAM_TASKS_WORK_MS", 300)
        self.poll_ms = env_ms("UPSTREAM_TASKS_POLL_MS", 100)

    # What goes back in a result's _meta for a request's envelope.
    def echo_meta(self, envelope):
        if envelope is None or self.mode == "noecho":
            return None
        if self.mode == "wrongid" and isinstance(envelope, dict):
            envelope = dict(envelope, publicTaskId=WRONG_ID)
        return {ENVELOPE: envelope}

    def state(self, task):
        """(status, lastUpdatedAt ms) of a task now."""
        if task.cancelled_at is not None:
            return "cancelled", task.cancelled_at
        finish = task.created + self.work_ms
        if self.mode != "forever" and now_ms() >= finish:
            return "completed", finish
        return "working", task.created

    def task_fields(self, task, status, updated):
        return {
            "taskId": task.id,
            "status": status,
            "createdAt": iso(task.created),
            "lastUpdatedAt": iso(updated),
            "ttlMs": TTL_MS,
            "pollIntervalMs": self.poll_ms,
        }

    def record(self, task_id, value, envelope):
        path = os.environ.get("UPSTREAM_TASKS_EFFECT_LOG")
        if path:
            append_line(path, json.dumps({"task": task_id, "value": value, "envelope": envelope}))

    def call_tool(self, msg_id, params, meta, modern):
        if params.get("name") != TOOL["name"]:
            return error(msg_id, -32602, f"Unknown tool: {params.get('name')}")
        args = params.get("arguments")
        value = args.get("value") if isinstance(args, dict) else None
        if not isinstance(value, str):
            return error(msg_id, -32602, "Invalid arguments: `value` must be a string")
        envelope = meta.get(ENVELOPE)
        caps = meta.get(CAPS_KEY)
        extensions = caps.get("extensions") if isinstance(caps, dict) else None
        as_task = (modern and isinstance(extensions, dict) and TASKS in extensions
                   and self.mode != "sync")
        echo = self.echo_meta(envelope)
        if not as_task:
            self.record(None, value, envelope)
            if self.mode == "lost":
                return Reply("lost")
            result = done_result(value)
            if modern:
                result = {"resultType": "complete", **result}
            if echo is not None:
                result["_meta"] = echo
            return response(msg_id, result)
        task = Task("up-" + secrets.token_hex(16), value, echo, now_ms())
        with self.lock:
            self.tasks[task.id] = task
        self.record(task.id, value, envelope)
        if self.mode == "lost":
            return Reply("lost")
        result = {"resultType": "task", **self.task_fields(task, "working", task.created)}
        if echo is not None:
            result["_meta"] = echo
        return response(msg_id, result)

    def find(self, params):
        task_id = params.get("taskId")
        with self.lock:
            return self.tasks.get(task_id) if isinstance(task_id, str) else None

    def get_task(self, msg_id, task):
        with self.lock:
            status, updated = self.state(task)
            task.gets += 1
            first_get = task.gets == 1
        if self.mode == "flakyget" and first_get:
            return error(msg_id, -32603, "temporarily unavailable")
        result = {"resultType": "complete", **self.task_fields(task, status, updated)}
        if status == "completed":
            result["result"] = done_result(task.value)
        if self.mode == "othertask":
            # Another task's status and result, under the asked-for task's
            # own echo.
            result.update(taskId=OTHER_TASK, status="completed",
                          result={"content": [{"type": "text", "text": "another task's answer"}],
                                  "isError": False})
        echo = task.echo
        if self.mode == "getnoecho":
            echo = None
        elif self.mode == "getwrongecho" and echo is not None:
            envelope = echo.get(ENVELOPE)
            if isinstance(envelope, dict):
                echo = {ENVELOPE: dict(envelope, bindingDigest="0" * 64)}
        if echo is not None:
            result["_meta"] = echo
        return response(msg_id, result)

    def cancel_task(self, msg_id, task):
        if self.mode == "hangcancel":
            return Reply("hang")
        if self.mode == "failcancel":
            return error(msg_id, -32603, "cancel failed")
        with self.lock:
            if self.state(task)[0] == "working":
                task.cancelled_at = now_ms()
        return response(msg_id, {"resultType": "complete"})

    def handle(self, msg):
        if not isinstance(msg, dict) or "method" not in msg:
            return Reply("none")  # a response or something unknown
        if "id" not in msg:
            return Reply("none")  # a notification
        method = msg["method"]
        msg_id = msg["id"]
        params = msg.get("params")
        params = params if isinstance(params, dict) else {}
        meta = params.get("_meta")
        meta = meta if isinstance(meta, dict) else {}
        modern = meta.get(VERSION_KEY) == MODERN
        if method == "server/discover":
            asked = meta.get(VERSION_KEY)
            if asked is not None and asked not in SUPPORTED:
                return error(msg_id, -32022, f"Unsupported protocol version: {asked}",
                             {"supported": SUPPORTED, "requested": asked})
            return response(msg_id, {
                "resultType": "complete",
                "supportedVersions": SUPPORTED,
                "capabilities": {"extensions": {TASKS: {}}, "tools": {}},
                "ttlMs": 0,
                "cacheScope": "private",
                "_meta": {"io.modelcontextprotocol/serverInfo": {
                    "name": f"upstream-tasks-{self.mode}", "version": "1.0.0"}},
            })
        if method == "initialize":
            asked = params.get("protocolVersion")
            return response(msg_id, {
                "protocolVersion": asked if asked in LEGACY_VERSIONS else LEGACY_VERSIONS[0],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": f"upstream-tasks-{self.mode}", "version": "1.0.0"},
            })
        if method == "ping":
            return response(msg_id, {})
        if method == "tools/list":
            result = {"tools": [TOOL]}
            if modern:
                result = {"resultType": "complete", **result, "ttlMs": 0, "cacheScope": "private"}
            return response(msg_id, result)
        if method == "tools/call":
            return self.call_tool(msg_id, params, meta, modern)
        if method in ("tasks/get", "tasks/cancel", "tasks/update"):
            task = self.find(params)
            if task is None:
                return error(msg_id, -32602, "task not found")
            if method == "tasks/get":
                return self.get_task(msg_id, task)
            if method == "tasks/cancel":
                return self.cancel_task(msg_id, task)
            return response(msg_id, {"resultType": "complete"})
        return error(msg_id, -32601, f"Method not found: {method}")


def log_message(raw):
    path = os.environ.get("UPSTREAM_TASKS_MESSAGE_LOG")
    if path:
        append_line(path, raw.decode("utf-8", "replace").rstrip("\r\n"))


def serve_stdio(upstream):
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        log_message(line)
        try:
            msg = json.loads(line)
        except ValueError:
            reply = error(None, -32700, "Parse error")
        else:
            reply = upstream.handle(msg)
        if reply.kind == "lost":
            os._exit(1)
        if reply.kind == "json":
            # Nothing here waits: a request left unanswered (hangcancel)
            # just gets no line, and the next one is read at once.
            out.write(json.dumps(reply.value).encode() + b"\n")
            out.flush()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "upstream-tasks"
    upstream = None

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
        reply = self.upstream.handle(msg)
        if reply.kind == "hang":
            # Hold the request open for good; other requests are served on
            # their own threads.
            threading.Event().wait()
        elif reply.kind == "none":
            self.send_plain(202, b"", None)
        elif reply.kind == "json":
            self.send_plain(200, json.dumps(reply.value).encode())
        elif reply.kind == "lost":
            # Close the connection without writing a response.
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


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
        sys.exit(f"usage: upstream_tasks.py {'|'.join(MODES)} stdio | MODE http PORT")
    upstream = Upstream(args[0])
    if args[0] == "restart":
        path = os.environ.get("UPSTREAM_TASKS_EFFECT_LOG")
        if path:
            append_line(path, f"START {os.getpid()}")
    if args[1] == "stdio":
        serve_stdio(upstream)
        return
    Handler.upstream = upstream
    httpd = Server(("127.0.0.1", int(args[2])), Handler)
    print(f"LISTENING {httpd.server_address[1]}", flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    main()
