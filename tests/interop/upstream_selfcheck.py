"""Checks the upstream test servers by hand, with a minimal JSON-RPC client
(python stdlib only) over stdio and over HTTP:

    python3 tests/interop/upstream_selfcheck.py [fastmcp|ts|hostile ...]

Starts each server through scripts/upstream-servers.sh in each transport
and shows, for FastMCP and the TypeScript SDK, the answer to a 2026-07-28
`server/discover` probe; where it succeeds, that a handshake-less
2026-07-28 tools/call works and that slow is cancelled (by
notifications/cancelled over stdio, by closing the connection over HTTP).
Then the 2025-11-25 handshake, tools/list, echo, fail, big, slow (its
marker file) and slow cancelled by notifications/cancelled; over HTTP, that
a request's headers reach UPSTREAM_HEADER_LOG. For the hostile
server, each mode's handshake and its misbehaviour. Prints one line per
check and exits non-zero when one fails. Sends traffic only to 127.0.0.1.
"""

import http.client
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "upstream-servers.sh")
LEGACY = "2025-11-25"
MODERN = "2026-07-28"
failures = 0


def check(name, ok, detail=""):
    global failures
    if not ok:
        failures += 1
    print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)


def meta(version):
    return {"_meta": {
        "io.modelcontextprotocol/protocolVersion": version,
        "io.modelcontextprotocol/clientInfo": {"name": "selfcheck", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": {},
    }}


class Closed(Exception):
    pass


class Stdio:
    def __init__(self, argv, env=None):
        self.errlog = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.errlog, env=env)
        self.lines = queue.Queue()
        self.next_id = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def notify(self, method, params=None):
        msg = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()

    def send(self, method, params=None):
        self.next_id += 1
        msg = {"jsonrpc": "2.0", "id": self.next_id, "method": method}
        if params is not None:
            msg["params"] = params
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()
        return self.next_id

    def wait(self, msg_id, timeout=30, raw=False):
        """The response to msg_id (or, with raw, the next line as bytes)."""
        deadline = time.monotonic() + timeout
        while True:
            line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            if line is None:
                raise Closed()
            if raw:
                return line
            msg = json.loads(line)
            if msg.get("id") == msg_id and "method" not in msg:
                return msg

    def request(self, method, params=None, timeout=30):
        return self.wait(self.send(method, params), timeout)

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def stderr(self):
        self.errlog.seek(0)
        return self.errlog.read().decode("utf-8", "replace")


class Http:
    """One MCP session over streamable HTTP."""

    def __init__(self, port, extra_headers=None):
        self.port = port
        self.session = None
        self.version = None
        self.extra = extra_headers or {}
        self.next_id = 0
        self.lock = threading.Lock()

    def post(self, msg, timeout=30, headers=None):
        """Status, headers and the JSON-RPC response (or the raw body)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if self.session:
            h["Mcp-Session-Id"] = self.session
        if self.version:
            h["MCP-Protocol-Version"] = self.version
        h.update(self.extra)
        h.update(headers or {})
        conn.request("POST", "/mcp", json.dumps(msg).encode(), h)
        resp = conn.getresponse()
        ctype = resp.getheader("Content-Type", "")
        rheaders = dict((k.lower(), v) for k, v in resp.getheaders())
        if "text/event-stream" in ctype:
            body = self._sse(resp, msg.get("id"))
        else:
            raw = resp.read()
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw
        conn.close()
        return resp.status, rheaders, body

    @staticmethod
    def _sse(resp, msg_id):
        data = []
        for line in resp:
            line = line.decode().rstrip("\r\n")
            if line.startswith("data:"):
                data.append(line[5:].lstrip())
            elif line == "" and data:
                msg = json.loads("\n".join(data))
                data = []
                if msg.get("id") == msg_id and "method" not in msg:
                    return msg
        return None

    def send(self, method, params=None, **kw):
        with self.lock:
            self.next_id += 1
            msg_id = self.next_id
        msg = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if params is not None:
            msg["params"] = params
        return self.post(msg, **kw)

    def request(self, method, params=None, timeout=30):
        status, _, body = self.send(method, params, timeout=timeout)
        if status != 200:
            raise RuntimeError(f"{method}: HTTP {status} {body}")
        return body

    def notify(self, method, params=None):
        msg = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        return self.post(msg)[0]


def start_http(argv, env=None):
    errlog = tempfile.TemporaryFile()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errlog, env=env)
    started = time.monotonic()
    line = proc.stdout.readline().decode()
    if not line.startswith("LISTENING "):
        errlog.seek(0)
        raise RuntimeError(f"{argv}: no LISTENING line: {line!r} {errlog.read()!r}")
    return proc, int(line.split()[1]), time.monotonic() - started


def stop(proc):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()


def handshake(client, label):
    init = client.request("initialize", {
        "protocolVersion": LEGACY, "capabilities": {},
        "clientInfo": {"name": "selfcheck", "version": "0"}})
    got = init.get("result", {}).get("protocolVersion")
    check(f"{label} initialize {LEGACY}", got == LEGACY, f"protocolVersion {got}")
    if isinstance(client, Http):
        client.version = got
    client.notify("notifications/initialized")
    return init


def text_of(resp):
    return "".join(c.get("text", "") for c in resp["result"]["content"])


def exercise_tools(client, label, tmp):
    tools = client.request("tools/list")["result"]["tools"]
    names = sorted(t["name"] for t in tools)
    check(f"{label} tools/list", names == ["big", "echo", "fail", "slow"], str(names))
    r = client.request("tools/call", {"name": "echo", "arguments": {"text": "héllo"}})
    check(f"{label} echo", text_of(r) == "héllo" and not r["result"].get("isError"), json.dumps(r["result"])[:200])
    r = client.request("tools/call", {"name": "fail", "arguments": {"message": "it broke"}})
    check(f"{label} fail", r["result"].get("isError") is True and text_of(r) == "it broke", json.dumps(r["result"]))
    r = client.request("tools/call", {"name": "big", "arguments": {"bytes": 1_000_000}})
    check(f"{label} big", text_of(r) == "x" * 1_000_000, f"{len(text_of(r))} bytes")

    marker = os.path.join(tmp, f"{label.replace(' ', '-')}-slow")
    r = client.request("tools/call", {"name": "slow", "arguments": {"seconds": 0.3, "marker": marker}})
    content = open(marker).read()
    lines = content.splitlines()
    check(f"{label} slow", text_of(r) == "slept" and len(lines) == 2 and lines[0].startswith("started ")
          and lines[1] == "finished", repr(content))

    marker = os.path.join(tmp, f"{label.replace(' ', '-')}-cancel")
    if isinstance(client, Stdio):
        msg_id = client.send("tools/call", {"name": "slow", "arguments": {"seconds": 10, "marker": marker}})
    else:
        with client.lock:
            msg_id = client.next_id + 1
        threading.Thread(target=lambda: client.send(
            "tools/call", {"name": "slow", "arguments": {"seconds": 10, "marker": marker}},
            timeout=15), daemon=True).start()
    deadline = time.monotonic() + 10
    while not (os.path.exists(marker) and open(marker).read()) and time.monotonic() < deadline:
        time.sleep(0.05)
    client.notify("notifications/cancelled", {"requestId": msg_id, "reason": "selfcheck"})
    deadline = time.monotonic() + 3
    while "cancelled" not in open(marker).read() and time.monotonic() < deadline:
        time.sleep(0.05)
    content = open(marker).read()
    check(f"{label} slow cancelled", content.endswith("cancelled\n") and "finished" not in content, repr(content))
    # Still serving after the cancellation.
    r = client.request("tools/call", {"name": "echo", "arguments": {"text": "after"}})
    check(f"{label} echo after cancel", text_of(r) == "after")


def check_sdk_server(kind, tmp):
    # stdio
    label = f"{kind} stdio"
    started = time.monotonic()
    c = Stdio([SCRIPT, kind, "stdio"])
    try:
        d = c.request("server/discover", meta(MODERN))
        print(f"INFO {label} server/discover answer ({time.monotonic() - started:.2f}s from start): {json.dumps(d)}")
        if "result" in d:
            r = c.request("tools/call", {"name": "echo", "arguments": {"text": "modern"}, **meta(MODERN)})
            check(f"{label} {MODERN} echo without initialize", text_of(r) == "modern", json.dumps(r)[:300])
            marker = os.path.join(tmp, f"{kind}-stdio-modern-cancel")
            msg_id = c.send("tools/call", {"name": "slow", "arguments": {"seconds": 10, "marker": marker},
                                           **meta(MODERN)})
            wait_for(marker, "started")
            c.notify("notifications/cancelled", {"requestId": msg_id, **meta(MODERN)})
            content = wait_for(marker, "cancelled")
            check(f"{label} {MODERN} slow cancelled by notifications/cancelled",
                  content.endswith("cancelled\n"), repr(content))
    finally:
        c.close()
    c = Stdio([SCRIPT, kind, "stdio"])
    try:
        handshake(c, label)
        exercise_tools(c, label, tmp)
    finally:
        c.close()
    stray = c.stderr().strip()
    if stray:
        print(f"INFO {label} stderr: {stray[:300]!r}")

    # http
    label = f"{kind} http"
    header_log = os.path.join(tmp, f"{kind}-headers.jsonl")
    env = dict(os.environ, UPSTREAM_HEADER_LOG=header_log)
    proc, port, secs = start_http([SCRIPT, kind, "http", "0"], env)
    print(f"INFO {label} LISTENING after {secs:.2f}s on port {port}")
    try:
        probe = Http(port)
        status, headers, body = probe.send("server/discover", meta(MODERN),
                                           headers={"MCP-Protocol-Version": MODERN,
                                                    "Mcp-Method": "server/discover"})
        shown = body if isinstance(body, bytes) else json.dumps(body)
        print(f"INFO {label} server/discover answer: HTTP {status} "
              f"session={headers.get('mcp-session-id')} {shown}")
        if status == 200 and isinstance(body, dict) and "result" in body:
            modern_http(probe, label, port, tmp, kind)
        c = Http(port, {"X-Selfcheck-Token": "secret-value"})
        status, headers, body = c.send("initialize", {
            "protocolVersion": LEGACY, "capabilities": {},
            "clientInfo": {"name": "selfcheck", "version": "0"}})
        c.session = headers.get("mcp-session-id")
        got = body["result"]["protocolVersion"]
        check(f"{label} initialize {LEGACY}", got == LEGACY,
              f"protocolVersion {got}, HTTP {status}, content-type {headers.get('content-type')}, session {c.session}")
        c.version = got
        c.notify("notifications/initialized")
        exercise_tools(c, label, tmp)
        logged = [json.loads(line) for line in open(header_log)]
        check(f"{label} header log", any(e["headers"].get("x-selfcheck-token") == "secret-value"
                                         and e["method"] == "POST" for e in logged),
              f"{len(logged)} requests logged; first: {json.dumps(logged[0])[:300]}")
    finally:
        stop(proc)


def wait_for(path, word, seconds=10):
    """The file's content once it holds word (or when seconds have passed)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if os.path.exists(path) and word in open(path).read():
            break
        time.sleep(0.05)
    return open(path).read() if os.path.exists(path) else ""


def modern_http(probe, label, port, tmp, kind):
    """2026-07-28 over HTTP: no handshake, no session; a request is
    cancelled by closing its connection."""
    probe.version = MODERN
    status, headers, body = probe.send(
        "tools/call", {"name": "echo", "arguments": {"text": "modern"}, **meta(MODERN)},
        headers={"Mcp-Method": "tools/call", "Mcp-Name": "echo"})
    check(f"{label} {MODERN} echo without initialize", status == 200 and text_of(body) == "modern",
          f"HTTP {status}, content-type {headers.get('content-type')}, session {headers.get('mcp-session-id')}")
    marker = os.path.join(tmp, f"{kind}-http-modern-cancel")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/mcp", json.dumps({
        "jsonrpc": "2.0", "id": 99, "method": "tools/call",
        "params": {"name": "slow", "arguments": {"seconds": 10, "marker": marker}, **meta(MODERN)}}),
        {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
         "MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/call", "Mcp-Name": "slow"})
    wait_for(marker, "started")
    conn.close()
    content = wait_for(marker, "cancelled", 5)
    check(f"{label} {MODERN} slow cancelled by closing the connection", content.endswith("cancelled\n"),
          repr(content))


def check_hostile(tmp):
    for transport in ("stdio", "http"):
        for mode in ("normal", "die", "hang", "huge", "garbage", "many", "drift"):
            label = f"hostile {mode} {transport}"
            env = dict(os.environ)
            schema = os.path.join(tmp, f"schema-{transport}.json")
            if mode == "drift":
                with open(schema, "w") as f:
                    json.dump({"description": "first", "inputSchema": {"type": "object"}}, f)
                env["HOSTILE_SCHEMA_FILE"] = schema
            proc = None
            if transport == "stdio":
                c = Stdio([SCRIPT, "hostile", mode, "stdio"], env)
            else:
                proc, port, _ = start_http([SCRIPT, "hostile", mode, "http", "0"], env)
                c = Http(port)
            try:
                if transport == "stdio":
                    d = c.request("server/discover", meta(MODERN))
                else:
                    d = c.send("server/discover", meta(MODERN))[2]
                check(f"{label} discover refused", d.get("error", {}).get("code") == -32601, json.dumps(d))
                handshake(c, label)
                tools = c.request("tools/list")["result"]
                name = tools["tools"][0]["name"]
                hostile_mode(c, label, mode, transport, tools, name, env, schema, proc)
            except Exception as e:  # noqa: BLE001 - report and go on
                check(label, False, f"{type(e).__name__}: {e}")
            finally:
                if transport == "stdio":
                    c.close()
                else:
                    stop(proc)


def hostile_mode(c, label, mode, transport, tools, name, env, schema, proc):
    call = {"name": name, "arguments": {}}
    if mode in ("normal", "drift"):
        r = c.request("tools/call", call)
        check(f"{label} call", text_of(r) == "ok" and name == "ok", name)
    if mode == "drift":
        check(f"{label} first schema", tools["tools"][0]["description"] == "first")
        with open(schema, "w") as f:
            json.dump({"description": "second", "inputSchema": {
                "type": "object", "properties": {"n": {"type": "integer"}}}}, f)
        t = c.request("tools/list")["result"]["tools"][0]
        check(f"{label} drifted schema", t["description"] == "second" and "n" in t["inputSchema"]["properties"],
              json.dumps(t))
    if mode == "die":
        if transport == "stdio":
            c.send("tools/call", call)
            try:
                c.wait(None, timeout=5)
                check(f"{label} exits", False, "got a line")
            except Closed:
                c.proc.wait(5)
                check(f"{label} exits", c.proc.returncode == 1, f"status {c.proc.returncode}")
        else:
            try:
                c.send("tools/call", call, timeout=5)
                check(f"{label} closes", False, "got a response")
            except (http.client.RemoteDisconnected, ConnectionResetError) as e:
                check(f"{label} closes", True, type(e).__name__)
            r = c.request("ping")
            check(f"{label} still serving", r.get("result") == {} and proc.poll() is None)
    if mode == "hang":
        try:
            if transport == "stdio":
                c.wait(c.send("tools/call", call), timeout=1.5)
            else:
                c.send("tools/call", call, timeout=1.5)
            check(f"{label} never answers", False, "answered")
        except (queue.Empty, TimeoutError, OSError):
            check(f"{label} never answers", True)
        check(f"{label} ping still answered", c.request("ping").get("result") == {})
    if mode == "huge":
        started = time.monotonic()
        r = c.request("tools/call", call, timeout=120)
        text = text_of(r)
        check(f"{label} 100 MiB result", len(text) == 100 << 20 and text[:1] == "x",
              f"{len(text)} bytes in {time.monotonic() - started:.2f}s")
    if mode == "garbage":
        if transport == "stdio":
            c.send("tools/call", call)
            line = c.wait(None, raw=True, timeout=5)
            check(f"{label} not JSON", line.startswith(b"\x00\xff"), repr(line))
        else:
            status, headers, body = c.send("tools/call", call)
            check(f"{label} not JSON", isinstance(body, bytes) and body.startswith(b"\x00\xff"),
                  f"HTTP {status} {headers.get('content-type')} {body!r}")
        check(f"{label} ping still answered", c.request("ping").get("result") == {})
    if mode == "many":
        seen, pages, cursor = [], 0, None
        while True:
            page = c.request("tools/list", {"cursor": cursor} if cursor else {})["result"]
            seen += [t["name"] for t in page["tools"]]
            pages += 1
            cursor = page.get("nextCursor")
            if not cursor:
                break
        check(f"{label} paged", len(set(seen)) == 100_000 and pages == 100, f"{len(seen)} tools, {pages} pages")
        r = c.request("tools/call", {"name": "tool_012345", "arguments": {}})
        check(f"{label} call", text_of(r) == "ok")
        one = dict(env, HOSTILE_ONE_PAGE="1")
        if transport == "stdio":
            c1 = Stdio([SCRIPT, "hostile", "many", "stdio"], one)
            try:
                handshake(c1, label + " one page")
                page = c1.request("tools/list")["result"]
            finally:
                c1.close()
        else:
            p1, port1, _ = start_http([SCRIPT, "hostile", "many", "http", "0"], one)
            try:
                c1 = Http(port1)
                handshake(c1, label + " one page")
                page = c1.request("tools/list")["result"]
            finally:
                stop(p1)
        check(f"{label} one page", len(page["tools"]) == 100_000 and "nextCursor" not in page,
              f"{len(page['tools'])} tools")


def main():
    which = sys.argv[1:] or ["fastmcp", "ts", "hostile"]
    started = time.monotonic()
    subprocess.run([SCRIPT, "install"], check=True)
    print(f"INFO install took {time.monotonic() - started:.1f}s")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in which:
            if kind == "hostile":
                check_hostile(tmp)
            else:
                try:
                    check_sdk_server(kind, tmp)
                except Exception as e:  # noqa: BLE001 - report and go on
                    check(kind, False, f"{type(e).__name__}: {e}")
    print(f"{'all passed' if not failures else f'{failures} failed'}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
