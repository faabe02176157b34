"""Checks that upstream_tasks.py behaves as its docstring says, in every
mode, by driving it as a plain JSON-RPC client (python stdlib only).

    python3 tests/interop/upstream_tasks_selftest.py

Every mode is driven over stdio; echo and lost are driven over HTTP too.
Exits 0 when every check holds, 1 (naming the failed checks) otherwise.
"""

import http.client
import json
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(HERE, "upstream_tasks.py")
MODERN = "2026-07-28"
TASKS = "io.modelcontextprotocol/tasks"
ENVELOPE_KEY = "dev.taskgate/taskExecution"
WRONG_ID = "tgr-" + "0" * 32
WORK_MS = 200
ENVELOPE = {
    "publicTaskId": "tgr-0123456789abcdef0123456789abcdef",
    "requestDigest": "sha256:" + "1" * 64,
    "bindingDigest": "sha256:" + "2" * 64,
    "binding": {"source": "up", "capability": "work", "nested": [1, "two", None]},
}

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL {what}", flush=True)
    return cond


def meta(tasks=True, envelope=ENVELOPE):
    m = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities":
            {"extensions": {TASKS: {}}} if tasks else {},
        "io.modelcontextprotocol/clientInfo": {"name": "selftest", "version": "0"},
    }
    if envelope is not None:
        m[ENVELOPE_KEY] = envelope
    return m


def call_params(value="v", tasks=True, envelope=ENVELOPE):
    return {"name": "work", "arguments": {"value": value}, "_meta": meta(tasks, envelope)}


def effects(path):
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f if line.strip()]


class Stdio:
    """The server over stdio, with a reader thread collecting answers."""

    def __init__(self, mode, tmp):
        self.effect_log = os.path.join(tmp, f"{mode}-effects.log")
        self.message_log = os.path.join(tmp, f"{mode}-messages.log")
        env = dict(os.environ, UPSTREAM_TASKS_EFFECT_LOG=self.effect_log,
                   UPSTREAM_TASKS_MESSAGE_LOG=self.message_log,
                   UPSTREAM_TASKS_WORK_MS=str(WORK_MS))
        self.mode = mode
        self.env = env
        self.start()
        self.next_id = 0

    def start(self):
        self.proc = subprocess.Popen(
            [sys.executable, SERVER, self.mode, "stdio"], env=self.env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.answers = queue.Queue()
        threading.Thread(target=self.read, args=(self.proc, self.answers), daemon=True).start()

    @staticmethod
    def read(proc, answers):
        for line in proc.stdout:
            answers.put(json.loads(line))
        answers.put(None)  # end of output

    def send(self, method, params=None):
        self.next_id += 1
        msg = {"jsonrpc": "2.0", "id": self.next_id, "method": method}
        if params is not None:
            msg["params"] = params
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()
        return self.next_id

    def wait(self, msg_id, timeout=5.0):
        """The answer to msg_id, or None when none comes within timeout
        (or the server's output ended)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                answer = self.answers.get(timeout=left)
            except queue.Empty:
                return None
            if answer is None:
                self.answers.put(None)
                return None
            if answer.get("id") == msg_id:
                return answer

    def request(self, method, params=None, timeout=5.0):
        return self.wait(self.send(method, params), timeout)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Http:
    """The server over HTTP on a port it picked."""

    def __init__(self, mode, tmp):
        self.effect_log = os.path.join(tmp, f"http-{mode}-effects.log")
        env = dict(os.environ, UPSTREAM_TASKS_EFFECT_LOG=self.effect_log,
                   UPSTREAM_TASKS_WORK_MS=str(WORK_MS),
                   UPSTREAM_HEADER_LOG=os.path.join(tmp, f"http-{mode}-headers.log"))
        self.proc = subprocess.Popen([sys.executable, SERVER, mode, "http", "0"], env=env,
                                     stdout=subprocess.PIPE)
        line = self.proc.stdout.readline().decode()
        m = re.match(r"LISTENING (\d+)", line)
        assert m, f"no LISTENING line: {line!r}"
        self.port = int(m.group(1))
        self.next_id = 0

    def request(self, method, params=None, timeout=5.0):
        """(HTTP status, answer); (None, None) when the connection closed
        without a response, ("timeout", None) when none came in time."""
        self.next_id += 1
        msg = {"jsonrpc": "2.0", "id": self.next_id, "method": method}
        if params is not None:
            msg["params"] = params
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request("POST", "/mcp", json.dumps(msg),
                         {"Content-Type": "application/json",
                          "Accept": "application/json, text/event-stream",
                          "MCP-Protocol-Version": MODERN, "Mcp-Method": method})
            resp = conn.getresponse()
            body = resp.read()
            return resp.status, (json.loads(body) if body else None)
        except (http.client.RemoteDisconnected, ConnectionResetError):
            return None, None
        except TimeoutError:
            return "timeout", None
        finally:
            conn.close()

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def result(answer):
    return (answer or {}).get("result") or {}


def is_create(answer):
    r = result(answer)
    return (r.get("resultType") == "task" and r.get("status") == "working"
            and re.fullmatch(r"up-[0-9a-f]{32}", r.get("taskId", "")) is not None
            and r.get("ttlMs") == 3_600_000 and isinstance(r.get("pollIntervalMs"), int)
            and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", r.get("createdAt", ""))
            is not None and "lastUpdatedAt" in r)


def expected_echo(mode):
    if mode == "noecho":
        return None
    if mode == "wrongid":
        return {ENVELOPE_KEY: dict(ENVELOPE, publicTaskId=WRONG_ID)}
    return {ENVELOPE_KEY: ENVELOPE}


def error_code(answer):
    return ((answer or {}).get("error") or {}).get("code")


def common_checks(s, mode):
    """What every mode does alike: the lifecycle, tools/list, errors."""
    d = s.request("server/discover", {"_meta": meta(envelope=None)})
    r = result(d)
    check(r.get("resultType") == "complete" and MODERN in r.get("supportedVersions", [])
          and r.get("capabilities") == {"extensions": {TASKS: {}}, "tools": {}}
          and r.get("ttlMs") == 0 and r.get("cacheScope") == "private"
          and r.get("_meta", {}).get("io.modelcontextprotocol/serverInfo")
          == {"name": f"upstream-tasks-{mode}", "version": "1.0.0"},
          f"{mode}: server/discover shape: {d}")
    bad = s.request("server/discover", {"_meta": dict(
        meta(envelope=None), **{"io.modelcontextprotocol/protocolVersion": "2099-01-01"})})
    check(error_code(bad) == -32022 and MODERN in bad["error"]["data"]["supported"],
          f"{mode}: unknown version on discover -> -32022: {bad}")
    i = s.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                 "clientInfo": {"name": "x", "version": "1"}})
    check(result(i).get("protocolVersion") == "2025-11-25"
          and result(i).get("capabilities") == {"tools": {}},
          f"{mode}: legacy initialize without Tasks: {i}")
    i = s.request("initialize", {"protocolVersion": MODERN, "capabilities": {},
                                 "clientInfo": {"name": "x", "version": "1"}})
    check(result(i).get("protocolVersion") == "2025-11-25",
          f"{mode}: initialize offering 2026-07-28 gets 2025-11-25: {i}")
    check(result(s.request("ping")) == {}, f"{mode}: ping")
    t = result(s.request("tools/list", {"_meta": meta(envelope=None)}))
    check(t.get("resultType") == "complete" and len(t.get("tools", [])) == 1
          and t["tools"][0]["name"] == "work"
          and t["tools"][0]["inputSchema"] == {
              "type": "object", "properties": {"value": {"type": "string"}},
              "required": ["value"]},
          f"{mode}: modern tools/list: {t}")
    t = result(s.request("tools/list"))
    check("resultType" not in t and t.get("tools", [{}])[0].get("name") == "work",
          f"{mode}: legacy tools/list: {t}")
    for method in ("tasks/get", "tasks/cancel", "tasks/update"):
        a = s.request(method, {"taskId": "up-" + "f" * 32, "_meta": meta(envelope=None)})
        check(error_code(a) == -32602, f"{mode}: {method} unknown task -> -32602: {a}")
    check(error_code(s.request("tasks/list", {"_meta": meta()})) == -32601,
          f"{mode}: tasks/list -> -32601")
    before = len(effects(s.effect_log))
    a = s.request("tools/call", {"name": "other", "arguments": {"value": "x"}, "_meta": meta()})
    check(error_code(a) == -32602, f"{mode}: unknown tool -> -32602: {a}")
    a = s.request("tools/call", {"name": "work", "arguments": {"value": 3}, "_meta": meta()})
    check(error_code(a) == -32602, f"{mode}: non-string value -> -32602: {a}")
    check(len(effects(s.effect_log)) == before, f"{mode}: refused calls record no effect")


def start_lines(s, count):
    """The START lines of the effect log once there are count of them
    (or after 5 s)."""
    deadline = time.monotonic() + 5
    while True:
        lines = [line for line in effects(s.effect_log) if line.startswith("START")]
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.02)


def effect_of(s, value):
    found = [json.loads(line) for line in effects(s.effect_log)
             if line.startswith("{") and json.loads(line)["value"] == value]
    return found


def check_task_mode(mode, tmp):
    s = Stdio(mode, tmp)
    try:
        if mode == "restart":
            lines = start_lines(s, 1)
            check(lines == [f"START {s.proc.pid}"] and effects(s.effect_log) == lines,
                  f"restart: START line first: {lines}")
        common_checks(s, mode)
        echo = expected_echo(mode)

        # A task: created with the echo, one effect line, completes.
        a = s.request("tools/call", call_params("alpha"))
        if mode == "sync":
            r = result(a)
            check(r == {"resultType": "complete", "content": [{"type": "text", "text": "done alpha"}],
                        "isError": False, "_meta": echo},
                  f"sync: tasks declared, still a synchronous result with echo: {a}")
            check(effect_of(s, "alpha") == [{"task": None, "value": "alpha", "envelope": ENVELOPE}],
                  f"sync: one effect line: {effects(s.effect_log)}")
            return
        check(is_create(a), f"{mode}: CreateTaskResult shape: {a}")
        check(result(a).get("_meta") == echo, f"{mode}: echo on CreateTaskResult: {a}")
        tid = result(a).get("taskId")
        check(effect_of(s, "alpha") == [{"task": tid, "value": "alpha", "envelope": ENVELOPE}],
              f"{mode}: one effect line for the task: {effects(s.effect_log)}")
        g = result(s.request("tasks/get", {"taskId": tid, "_meta": meta(envelope=None)}))
        check(g.get("resultType") == "complete" and g.get("status") == "working"
              and "result" not in g and g.get("taskId") == tid and g.get("_meta") == echo,
              f"{mode}: tasks/get while working: {g}")
        time.sleep(WORK_MS / 1000 * 2)
        g = result(s.request("tasks/get", {"taskId": tid, "_meta": meta(envelope=None)}))
        if mode == "forever":
            check(g.get("status") == "working" and "result" not in g,
                  f"forever: still working after the work time: {g}")
        else:
            check(g.get("status") == "completed"
                  and g.get("result") == {"content": [{"type": "text", "text": "done alpha"}],
                                          "isError": False}
                  and g.get("_meta") == echo and g.get("lastUpdatedAt") >= g.get("createdAt"),
                  f"{mode}: tasks/get completed with the inlined result: {g}")
        u = s.request("tasks/update", {"taskId": tid, "inputResponses": {}, "_meta": meta()})
        check(result(u) == {"resultType": "complete"}, f"{mode}: tasks/update ack: {u}")

        # Cancelling a working task.
        b = result(s.request("tools/call", call_params("beta")))
        bid = b.get("taskId")
        if mode == "hangcancel":
            c = s.request("tasks/cancel", {"taskId": bid, "_meta": meta()}, timeout=1.0)
            check(c is None, f"hangcancel: tasks/cancel unanswered: {c}")
            g = s.request("tasks/get", {"taskId": bid, "_meta": meta()})
            check(result(g).get("status") in ("working", "completed"),
                  f"hangcancel: tasks/get still answered, not cancelled: {g}")
        elif mode == "failcancel":
            c = s.request("tasks/cancel", {"taskId": bid, "_meta": meta()})
            check((c or {}).get("error") == {"code": -32603, "message": "cancel failed"},
                  f"failcancel: tasks/cancel -> -32603 cancel failed: {c}")
            g = s.request("tasks/get", {"taskId": bid, "_meta": meta()})
            check(result(g).get("status") in ("working", "completed"),
                  f"failcancel: task not cancelled: {g}")
        else:
            c = s.request("tasks/cancel", {"taskId": bid, "_meta": meta()})
            check(result(c) == {"resultType": "complete"}, f"{mode}: tasks/cancel ack: {c}")
            time.sleep(WORK_MS / 1000 * 2)
            g = result(s.request("tasks/get", {"taskId": bid, "_meta": meta()}))
            check(g.get("status") == "cancelled" and "result" not in g and g.get("_meta") == echo,
                  f"{mode}: cancelled stays cancelled: {g}")
            if mode != "forever":
                c = s.request("tasks/cancel", {"taskId": tid, "_meta": meta()})
                g = result(s.request("tasks/get", {"taskId": tid, "_meta": meta()}))
                check(result(c) == {"resultType": "complete"} and g.get("status") == "completed",
                      f"{mode}: cancelling a completed task leaves it completed: {g}")

        # Without Tasks declared: synchronous, with the echo, one effect.
        a = s.request("tools/call", call_params("gamma", tasks=False))
        check(result(a) == {"resultType": "complete",
                            "content": [{"type": "text", "text": "done gamma"}],
                            "isError": False, **({"_meta": echo} if echo else {})},
              f"{mode}: synchronous CallToolResult with echo: {a}")
        check(effect_of(s, "gamma") == [{"task": None, "value": "gamma", "envelope": ENVELOPE}],
              f"{mode}: one effect line for the synchronous call")
        # Without an envelope: no _meta at all, envelope null.
        a = result(s.request("tools/call", call_params("delta", envelope=None)))
        check(is_create({"result": a}) and "_meta" not in a,
              f"{mode}: no envelope, no echo: {a}")
        check(effect_of(s, "delta") == [{"task": a.get("taskId"), "value": "delta",
                                         "envelope": None}],
              f"{mode}: effect line with a null envelope")
        # A legacy call (no _meta): a plain result without resultType.
        a = result(s.request("tools/call", {"name": "work", "arguments": {"value": "eps"}}))
        check(a == {"content": [{"type": "text", "text": "done eps"}], "isError": False},
              f"{mode}: legacy tools/call: {a}")
        # Tasks declared on a legacy protocol version: no task.
        m = dict(meta(), **{"io.modelcontextprotocol/protocolVersion": "2025-11-25"})
        a = result(s.request("tools/call", {"name": "work", "arguments": {"value": "z"},
                                            "_meta": m}))
        check(a.get("content") == [{"type": "text", "text": "done z"}] and "taskId" not in a,
              f"{mode}: Tasks below 2026-07-28 give no task: {a}")

        if mode == "restart":
            s.proc.kill()
            s.proc.wait()
            s.start()
            lines = start_lines(s, 2)
            check(len(lines) == 2 and lines[1] == f"START {s.proc.pid}",
                  f"restart: a second START line: {lines}")
            g = s.request("tasks/get", {"taskId": tid, "_meta": meta()})
            check(error_code(g) == -32602, f"restart: an earlier task id is unknown: {g}")
        check(all(json.loads(line)["method"] for line in effects(s.message_log)),
              f"{mode}: the message log holds each received message")
    finally:
        s.stop()


def check_lost(tmp):
    s = Stdio("lost", tmp)
    try:
        common_checks(s, "lost")
        a = s.request("tools/call", call_params("lost-value"))
        check(a is None, f"lost: no answer: {a}")
        check(s.proc.wait(5) == 1, "lost: exits with status 1")
        lines = [json.loads(line) for line in effects(s.effect_log)]
        check(len(lines) == 1 and lines[0]["value"] == "lost-value"
              and re.fullmatch(r"up-[0-9a-f]{32}", lines[0]["task"] or "")
              and lines[0]["envelope"] == ENVELOPE,
              f"lost: the effect was recorded: {lines}")
    finally:
        s.stop()


def check_http(tmp):
    h = Http("echo", tmp)
    try:
        status, d = h.request("server/discover", {"_meta": meta(envelope=None)})
        check(status == 200 and TASKS in result(d).get("capabilities", {}).get("extensions", {}),
              f"http echo: discover: {status} {d}")
        status, a = h.request("tools/call", call_params("h1"))
        check(status == 200 and is_create(a)
              and result(a).get("_meta") == {ENVELOPE_KEY: ENVELOPE},
              f"http echo: CreateTaskResult with echo: {a}")
        time.sleep(WORK_MS / 1000 * 2)
        status, g = h.request("tasks/get", {"taskId": result(a).get("taskId"), "_meta": meta()})
        check(status == 200 and result(g).get("status") == "completed"
              and result(g).get("_meta") == {ENVELOPE_KEY: ENVELOPE},
              f"http echo: tasks/get completed with echo: {g}")
        conn = http.client.HTTPConnection("127.0.0.1", h.port, timeout=5)
        conn.request("POST", "/mcp", json.dumps({"jsonrpc": "2.0", "method": "notifications/x"}),
                     {"Content-Type": "application/json"})
        check(conn.getresponse().status == 202, "http echo: a notification gets 202")
        conn.close()
    finally:
        h.stop()
    h = Http("lost", tmp)
    try:
        status, a = h.request("tools/call", call_params("h2"))
        check(status is None, f"http lost: connection closed without a response: {status} {a}")
        check(len(effects(h.effect_log)) == 1, "http lost: the effect was recorded")
        status, p = h.request("ping")
        check(status == 200 and result(p) == {}, "http lost: the server keeps running")
    finally:
        h.stop()
    h = Http("hangcancel", tmp)
    try:
        status, a = h.request("tools/call", call_params("h3"))
        tid = result(a).get("taskId")
        status, c = h.request("tasks/cancel", {"taskId": tid, "_meta": meta()}, timeout=1.0)
        check(status == "timeout", f"http hangcancel: tasks/cancel unanswered: {status} {c}")
        status, g = h.request("tasks/get", {"taskId": tid, "_meta": meta()})
        check(status == 200 and result(g).get("taskId") == tid,
              f"http hangcancel: tasks/get still answered: {g}")
    finally:
        h.stop()


def main():
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("echo", "noecho", "wrongid", "hangcancel", "failcancel", "sync",
                     "forever", "restart"):
            check_task_mode(mode, tmp)
            print(f"mode {mode}: done", flush=True)
        check_lost(tmp)
        print("mode lost: done", flush=True)
        check_http(tmp)
        print("http: done", flush=True)
    if failures:
        print(f"{len(failures)} check(s) failed", flush=True)
        sys.exit(1)
    print("all modes behave as documented", flush=True)


if __name__ == "__main__":
    main()
