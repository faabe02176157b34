#!/usr/bin/env python3
"""Measures how the HTTP side of a real `taskgate serve` holds up under hostile
local load: idle and slow connections, dribbled bodies, a flood of legacy
sessions and more long calls than there are running slots.

    scripts/hostile-load.py [options] all
    scripts/hostile-load.py [options] idle dribble sessions long-calls

Each scenario starts its own daemon (the binary given by --binary, by default
target/debug/taskgate beside this script) on an ephemeral 127.0.0.1 port, with
a generated configuration and a fresh private state directory (mode 0700) in a
temporary directory that is deleted afterwards. It learns the port and waits
for readiness through the systemd notify protocol (READY=1 and STATUS=), talks
only to 127.0.0.1, samples the daemon's VmRSS from /proc every 100 ms, and
prints figures: medians, 99th percentiles, maxima and counts. They are
measurements of this host, not a verdict; the exit status is 0 whenever every
scenario ran to its end.

Scenarios:

  idle        2,000 idle TCP connections and 256 slowloris connections (a
              request head dribbled one byte a second) opened at once, while
              /healthz and a fresh client's tasks/get of a task created
              beforehand are probed every 100 ms over the whole window (which
              outlasts server.header_read_timeout_ms): probe latencies, failed
              probes and when, how long each held connection was kept open,
              peak RSS.
  dribble     64 POSTs to /mcp announcing Content-Length: 100000 and sending
              one body byte a second, while tasks/get, a quick synchronous
              tools/call and /readyz are probed every 100 ms: whether polls and
              calls are admitted, what /readyz says meanwhile and when the
              dribblers are cut off. Run twice: once with bodies that name no
              method, once with bodies whose headers claim to be a tasks/get.
  sessions    50,000 legacy `initialize` requests on keep-alive connections:
              accepted versus refused (TG_SESSIONS_FULL), a fresh client's
              tasks/get every 100 ms meanwhile, RSS before, at its peak and
              after; then RSS for 30 s past server.session_idle_secs (set to
              5), once the sessions have expired.
  long-calls  24 concurrent task-augmented calls (protocol 2026-07-28 with the
              Tasks extension) of a tool that sleeps 20 s, against
              tasks.max_running = 4 and server.max_concurrent_requests = 16:
              what each call got, the number of tool processes (children of
              the daemon) every 100 ms, and tasks/get and tasks/cancel of the
              running tasks during the window (success counts, latencies), with
              /readyz alongside. With --no-tasks the calls run synchronously
              and hold request slots instead (with tasks.max_running raised
              through --set, past server.max_concurrent_requests they are
              refused and /readyz should say so); a task made beforehand is
              polled meanwhile.

Run it as an ordinary user. Run as root, it starts the daemon (and so every
tool process) as --user (default: nobody) instead, never as root.
"""

import argparse
import errno
import json
import os
import pwd
import random
import re
import resource
import selectors
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

PROTOCOL = "2026-07-28"
LEGACY_PROTOCOL = "2025-11-25"
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
# taskgate's own refusals are told apart by the name in their error's
# data (its registry: `taskgate wire-codes`), never by a copied number.
SESSIONS_FULL = "TG_SESSIONS_FULL"
SERVER_BUSY = "TG_SERVER_BUSY"
HOST = "127.0.0.1"

# ---------------------------------------------------------------- figures


def pct(values, q):
    """The q-th percentile (nearest rank) of values, or None."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(round(q / 100.0 * len(s) + 0.5)) - 1))
    return s[k]


def ms(seconds):
    return None if seconds is None else round(seconds * 1000.0, 1)


def lat(values):
    """Median, p99 and max of latencies in seconds, as milliseconds."""
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "median_ms": ms(statistics.median(values)),
        "p99_ms": ms(pct(values, 99)),
        "max_ms": ms(max(values)),
    }


def fmt_lat(d):
    if not d.get("n"):
        return "none answered"
    return "n={n} median {median_ms} ms, p99 {p99_ms} ms, max {max_ms} ms".format(**d)


def mib(kib):
    return None if kib is None else round(kib / 1024.0, 1)


def counts(items):
    out = {}
    for i in items:
        out[i] = out.get(i, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


class Report:
    """Lines printed as they come, and the same figures for --json."""

    def __init__(self):
        self.figures = {}
        self.scenario = None

    def start(self, name, what):
        self.scenario = name
        self.figures[name] = {}
        print("\n== {}: {}".format(name, what), flush=True)

    def put(self, key, value, line=None):
        self.figures[self.scenario][key] = value
        if line is None:
            line = "{}: {}".format(key, value)
        print("  " + line, flush=True)

    def note(self, text):
        print("  . " + text, flush=True)


# ---------------------------------------------------------------- HTTP


class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers
        self.body = body

    def header(self, name):
        return self.headers.get(name.lower())

    def json(self):
        """The JSON-RPC message of a JSON body or of an SSE stream."""
        text = self.body.decode("utf-8", "replace")
        try:
            return json.loads(text)
        except ValueError:
            pass
        for line in text.splitlines():
            if line.startswith("data:"):
                try:
                    return json.loads(line[5:].strip())
                except ValueError:
                    continue
        return None


class Conn:
    """One HTTP/1.1 connection to the daemon, kept alive between requests."""

    def __init__(self, port, timeout):
        self.sock = socket.create_connection((HOST, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.closed = False

    def close(self):
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass

    def _fill(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("connection closed by the server")
        self.buf += chunk

    def _line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exactly(self, n):
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def request(self, method, path, headers=None, body=b"", close=False):
        head = ["{} {} HTTP/1.1".format(method, path), "Host: {}".format(HOST)]
        for k, v in (headers or {}).items():
            head.append("{}: {}".format(k, v))
        if body or method == "POST":
            head.append("Content-Length: {}".format(len(body)))
        if close:
            head.append("Connection: close")
        self.sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        return self.response(method)

    def response(self, method="GET"):
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        raw, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        status = int(parts[1])
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        if method == "HEAD" or status in (204, 304):
            body = b""
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            body = b""
            while True:
                size = int(self._line().split(b";")[0], 16)
                if size == 0:
                    while self._line():
                        pass
                    break
                body += self._exactly(size)
                self._exactly(2)
        elif "content-length" in headers:
            body = self._exactly(int(headers["content-length"]))
        else:
            # Delimited by the end of the connection.
            try:
                while True:
                    self._fill()
            except (ConnectionError, OSError):
                pass
            body, self.buf = self.buf, b""
            self.closed = True
        if headers.get("connection", "").lower() == "close":
            self.close()
        return Response(status, headers, body)


def once(port, method, path, headers=None, body=b"", timeout=5.0):
    """One request on a fresh connection: (Response or None, error, seconds)."""
    t0 = time.monotonic()
    c = None
    try:
        c = Conn(port, timeout)
        r = c.request(method, path, headers, body, close=True)
        return r, None, time.monotonic() - t0
    except (OSError, ConnectionError, ValueError, IndexError) as e:
        return None, type(e).__name__, time.monotonic() - t0
    finally:
        if c is not None:
            c.close()


def mcp_body(method, params, tasks, rid=1):
    extensions = {TASKS_EXTENSION: {}} if tasks else {}
    params = dict(params)
    params["_meta"] = {
        "io.modelcontextprotocol/protocolVersion": PROTOCOL,
        "io.modelcontextprotocol/clientCapabilities": {"extensions": extensions},
        "io.modelcontextprotocol/clientInfo": {"name": "hostile-load", "version": "1"},
    }
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}).encode()


def mcp_headers(method, name=None):
    h = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": PROTOCOL,
        "Mcp-Method": method,
    }
    if name is not None:
        h["Mcp-Name"] = name
    return h


def mcp(port, method, params, name=None, tasks=True, timeout=5.0):
    """A 2026-07-28 request on a fresh connection.

    Returns (outcome, message, seconds): outcome is "ok", "rpc <code>",
    "http <status>" or the name of a network error."""
    r, err, took = once(
        port, "POST", "/mcp", mcp_headers(method, name), mcp_body(method, params, tasks), timeout
    )
    if r is None:
        return err, None, took
    m = r.json()
    if isinstance(m, dict) and "error" in m:
        return "rpc {}".format(m["error"].get("code")), m, took
    if r.status != 200 or not isinstance(m, dict) or "result" not in m:
        return "http {}".format(r.status), m, took
    return "ok", m["result"], took


def get_status(port, path, timeout=5.0):
    r, err, took = once(port, "GET", path, timeout=timeout)
    return (err if r is None else r.status), took


# ---------------------------------------------------------------- the daemon


def error_name(response):
    """The registered name of taskgate's JSON-RPC error in a response."""
    error = (response.json() or {}).get("error") or {}
    return (error.get("data") or {}).get("name")


def key_reference(binary):
    """{dotted key: default text} from `taskgate man --reference`."""
    out = subprocess.run(
        [binary, "man", "--reference"], capture_output=True, text=True, check=True
    ).stdout
    keys = {}
    for m in re.finditer(r"^\| `([a-z_]+\.[a-z_]+)` \| ([^|]*) \|", out, re.M):
        keys[m.group(1)] = m.group(2).strip()
    return keys


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    return json.dumps(v)


TOOLS = """
[[tool]]
name = "quick"
description = "Answers at once."
argv = ["/bin/echo", "done"]
effect = "read_only"
task = "optional"
timeout_secs = 30
[tool.input_schema]
type = "object"

[[tool]]
name = "quick_sync"
description = "Answers at once, never as a task."
argv = ["/bin/echo", "done"]
effect = "read_only"
task = "never"
timeout_secs = 30
[tool.input_schema]
type = "object"

[[tool]]
name = "sleep"
description = "Sleeps for the given number of seconds."
argv = ["/bin/sleep", "{seconds}"]
effect = "read_only"
task = "optional"
timeout_secs = 600
[tool.input_schema]
type = "object"
required = ["seconds"]
[tool.input_schema.properties.seconds]
type = "integer"
minimum = 0
maximum = 600
"""


class Daemon:
    """A real `taskgate serve` on an ephemeral loopback port."""

    def __init__(self, opts, settings, report):
        self.opts = opts
        self.report = report
        self.dir = tempfile.mkdtemp(prefix="taskgate-hostile-")
        os.chmod(self.dir, 0o700)
        self.state = os.path.join(self.dir, "state")
        os.mkdir(self.state, 0o700)
        self.config = os.path.join(self.dir, "taskgate.toml")
        self.log = os.path.join(self.dir, "daemon.log")
        sections = {}
        for dotted, value in settings.items():
            section, key = dotted.split(".", 1)
            sections.setdefault(section, []).append("{} = {}".format(key, toml_value(value)))
        text = "# generated by hostile-load.py\n"
        for section, lines in sections.items():
            text += "\n[{}]\n{}\n".format(section, "\n".join(lines))
        with open(self.config, "w") as f:
            f.write(text + TOOLS)
        self.settings = settings
        notify_path = os.path.join(self.dir, "notify.sock")
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(notify_path)
        self.notify.settimeout(0.2)
        user = None
        if os.geteuid() == 0:
            user = pwd.getpwnam(opts.user)
            for p in (self.dir, self.state, self.config, notify_path):
                os.chown(p, user.pw_uid, user.pw_gid)
        log = open(self.log, "wb")
        kwargs = {}
        if user is not None:
            kwargs = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
        self.proc = subprocess.Popen(
            [
                opts.binary, "serve",
                "--config", self.config,
                "--state-dir", self.state,
                "--listen", HOST + ":0",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            env={"PATH": "/usr/bin:/bin", "NOTIFY_SOCKET": notify_path},
            cwd=self.dir,
            **kwargs,
        )
        log.close()
        self.pid = self.proc.pid
        try:
            self.port = self._wait_ready(30.0)
        except BaseException:
            # Nothing to measure: leave no daemon or directory behind.
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.notify.close()
            if not opts.keep:
                shutil.rmtree(self.dir, ignore_errors=True)
            raise
        self.rss = RssSampler(self.pid)
        self.rss.start()

    def _wait_ready(self, limit):
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("the daemon exited ({}) before READY=1:\n{}".format(
                    self.proc.returncode, self.log_tail()))
            try:
                msg = self.notify.recv(65536).decode("utf-8", "replace")
            except socket.timeout:
                continue
            if "READY=1" not in msg.split("\n"):
                continue
            m = re.search(r"serving on 127\.0\.0\.1:(\d+)", msg)
            if not m:
                raise RuntimeError("READY=1 without a loopback port in STATUS=: " + msg)
            return int(m.group(1))
        raise RuntimeError("no READY=1 within {} s:\n{}".format(limit, self.log_tail()))

    def log_tail(self, n=20):
        try:
            with open(self.log, "rb") as f:
                return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-n:])
        except OSError:
            return ""

    def url_port(self):
        return self.port

    def stop(self):
        self.rss.stop()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.report.note("the daemon did not stop within 30 s of SIGTERM; killed")
                self.proc.kill()
                self.proc.wait()
        code = self.proc.returncode
        self.notify.close()
        if self.opts.keep:
            self.report.note("kept " + self.dir)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)
        return code


def parents():
    """{pid: parent pid} of every process, from /proc."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/{}/stat".format(entry), "rb") as f:
                stat = f.read().decode("latin-1")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 1:
            out[int(entry)] = int(fields[1])
    return out


def descendants_of(pid):
    """(direct children, all descendants) of pid: one direct child per tool
    run (the tool, or the confinement shim that starts it), and every
    process a run has under it."""
    ppid = parents()
    kids = {}
    for p, pp in ppid.items():
        kids.setdefault(pp, []).append(p)
    direct = kids.get(pid, [])
    seen, todo = 0, list(direct)
    while todo:
        p = todo.pop()
        seen += 1
        todo.extend(kids.get(p, []))
    return len(direct), seen


TCP_STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1",
              "05": "FIN_WAIT2", "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT",
              "09": "LAST_ACK", "0A": "LISTEN", "0B": "CLOSING"}


def tcp_states(port):
    """{peer port: state} of the loopback sockets whose local port is `port`
    (the daemon's ends of its connections), from /proc/net/tcp."""
    out = {}
    try:
        with open("/proc/net/tcp") as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return out
    for line in lines:
        p = line.split()
        local, remote, st = p[1], p[2], p[3]
        if int(local.split(":")[1], 16) == port:
            out[int(remote.split(":")[1], 16)] = TCP_STATES.get(st, st)
    return out


def vm(pid, field):
    try:
        with open("/proc/{}/status".format(pid)) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class RssSampler(threading.Thread):
    """VmRSS of the daemon every 100 ms, in KiB."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid = pid
        self.samples = []
        self.halt = threading.Event()

    def run(self):
        while not self.halt.is_set():
            v = vm(self.pid, "VmRSS")
            if v is not None:
                self.samples.append((time.monotonic(), v))
            self.halt.wait(0.1)

    def stop(self):
        self.halt.set()

    def now(self):
        return vm(self.pid, "VmRSS")

    def peak_between(self, t0, t1):
        vals = [v for (t, v) in self.samples if t0 <= t <= t1]
        return max(vals) if vals else None


# ---------------------------------------------------------------- probes


class Prober(threading.Thread):
    """Calls `probe()` every `every` seconds (never two at once) until told
    to stop; keeps (time since `t0`, outcome, seconds) for each."""

    def __init__(self, probe, t0, every=0.1):
        super().__init__(daemon=True)
        self.probe = probe
        self.t0 = t0
        self.every = every
        self.results = []
        self.halt = threading.Event()

    def run(self):
        nxt = time.monotonic()
        while not self.halt.is_set():
            start = time.monotonic()
            outcome, took = self.probe()
            self.results.append((start - self.t0, outcome, took))
            nxt += self.every
            self.halt.wait(max(0.0, nxt - time.monotonic()))
            nxt = max(nxt, time.monotonic() - self.every)

    def stop(self):
        self.halt.set()
        self.join()


def summarise_probes(report, label, results, ok, slow=1.0):
    """Latency of the probes that answered as hoped, and when the others
    failed (seconds since the attack began)."""
    good = [took for (_, o, took) in results if ok(o)]
    bad = [(t, o) for (t, o, _) in results if not ok(o)]
    over = [t for (t, o, took) in results if ok(o) and took > slow]
    fig = {
        "probes": len(results),
        "ok": len(good),
        "failed": len(bad),
        "latency": lat(good),
        "answered_over_1s": len(over),
        "failures": counts(o for (_, o) in bad),
    }
    line = "{}: {} probes, {} ok ({}), {} failed".format(
        label, len(results), len(good), fmt_lat(fig["latency"]), len(bad))
    if bad:
        fig["first_failure_s"] = round(min(t for t, _ in bad), 2)
        fig["last_failure_s"] = round(max(t for t, _ in bad), 2)
        line += " {} between {} s and {} s".format(
            fig["failures"], fig["first_failure_s"], fig["last_failure_s"])
    if over:
        line += "; {} answered after more than 1 s".format(len(over))
    report.put(label, fig, line)
    return fig


def create_task(port):
    """A completed task to poll: a quick tool called as a task."""
    outcome, result, _ = mcp(port, "tools/call", {"name": "quick", "arguments": {}}, name="quick")
    if outcome != "ok" or result.get("resultType") != "task":
        raise RuntimeError("could not create a task to poll: {} {}".format(outcome, result))
    return result["taskId"]


def poll_probe(port, task_id):
    def probe():
        outcome, _, took = mcp(port, "tasks/get", {"taskId": task_id}, name=task_id)
        return outcome, took
    return probe


def get_probe(port, path):
    def probe():
        return get_status(port, path)
    return probe


def raise_fd_limit(need):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, need)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    if want < need:
        raise SystemExit(
            "hostile-load: {} file descriptors needed, the hard limit is {}".format(need, want))


# ---------------------------------------------------------------- attackers


class Attack:
    """Many non-blocking client sockets driven from one selector. Each
    socket is connected, sends `first` once connected, then `every` seconds
    one byte of `drip` (if any). What the server sends back and when it
    closes the socket are recorded per socket. With `reopen` (seconds), a
    socket the server closed or refused is replaced by a new one of the same
    kind that long after, as a persistent attacker would."""

    def __init__(self, port, kinds, t0, reopen=None):
        self.port = port
        self.t0 = t0
        self.sel = selectors.DefaultSelector()
        self.conns = []
        self.kinds = kinds  # list of (kind, first, drip, every)
        self.reopen = reopen
        self.pending = []  # (when, spec) of sockets to open again
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _connect(self, spec):
        kind, first, drip, every = spec
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        rc = s.connect_ex((HOST, self.port))
        c = {
            "kind": kind, "spec": spec, "sock": s, "first": first, "drip": drip,
            "every": every, "connected": None, "sent": 0, "next_drip": None, "reply": b"",
            "first_reply": None, "closed": None, "error": None,
        }
        self.conns.append(c)
        if rc not in (0, errno.EINPROGRESS):
            self._end(c, time.monotonic(), errno.errorcode.get(rc, str(rc)), registered=False)
        else:
            self.sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE, c)

    def open(self):
        for spec in self.kinds:
            self._connect(spec)
        self.opened = time.monotonic() - self.t0
        self.thread.start()

    def _end(self, c, now, error=None, registered=True):
        c["closed"] = now - self.t0
        c["error"] = error
        if registered:
            try:
                self.sel.unregister(c["sock"])
            except (KeyError, ValueError):
                pass
        c["sock"].close()
        if self.reopen is not None and not self.halt.is_set():
            self.pending.append((now + self.reopen, c["spec"]))

    def _run(self):
        while not self.halt.is_set():
            now = time.monotonic()
            if self.pending and self.pending[0][0] <= now:
                due = [spec for (when, spec) in self.pending if when <= now]
                self.pending = [(w, spec) for (w, spec) in self.pending if w > now]
                for spec in due:
                    self._connect(spec)
            if not self.sel.get_map():
                # Every socket has ended: nothing to wait for but the stop.
                self.halt.wait(0.05)
                continue
            events = self.sel.select(timeout=0.05)
            now = time.monotonic()
            for key, mask in events:
                c = key.data
                if c["closed"] is not None:
                    continue
                if mask & selectors.EVENT_WRITE and c["connected"] is None:
                    err = c["sock"].getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if err:
                        self._end(c, now, errno.errorcode.get(err, str(err)))
                        continue
                    c["connected"] = now - self.t0
                    try:
                        if c["first"]:
                            c["sock"].send(c["first"])
                    except OSError as e:
                        self._end(c, now, type(e).__name__)
                        continue
                    if c["drip"]:
                        c["next_drip"] = now + c["every"]
                    self.sel.modify(c["sock"], selectors.EVENT_READ, c)
                if mask & selectors.EVENT_READ:
                    try:
                        data = c["sock"].recv(65536)
                    except OSError as e:
                        self._end(c, now, type(e).__name__)
                        continue
                    if not data:
                        self._end(c, now)
                        continue
                    if c["first_reply"] is None:
                        c["first_reply"] = now - self.t0
                    if len(c["reply"]) < 4096:
                        c["reply"] += data
            for key in list(self.sel.get_map().values()):
                c = key.data
                if c["closed"] is None and c["next_drip"] is not None and now >= c["next_drip"]:
                    byte = c["drip"][c["sent"] % len(c["drip"]):][:1]
                    try:
                        c["sock"].send(byte)
                        c["sent"] += 1
                    except OSError as e:
                        self._end(c, now, type(e).__name__)
                        continue
                    c["next_drip"] = now + c["every"]

    def stop(self):
        self.halt.set()
        self.thread.join()
        # A socket the client sees connected may never have reached the
        # daemon: when a burst overflows the listener's accept queue, the
        # kernel drops the handshake's last ACK and keeps the server end
        # half-open (SYN_RECV) until a retransmission gets through.
        server_ends = tcp_states(self.port)
        for c in self.conns:
            if c["closed"] is None:
                try:
                    c["server_end"] = server_ends.get(c["sock"].getsockname()[1], "absent")
                except OSError:
                    c["server_end"] = "unknown"
                c["sock"].close()

    def status_of(self, c):
        """The HTTP status the server answered this socket with, if any."""
        m = re.match(rb"HTTP/1\.1 (\d{3})", c["reply"])
        return int(m.group(1)) if m else None

    def summary(self, kind):
        mine = [c for c in self.conns if c["kind"] == kind]
        never = [c for c in mine if c["connected"] is None]
        reached = [c for c in mine if c["connected"] is not None]
        refused = [c for c in reached if self.status_of(c) == 503]
        rest = [c for c in reached if self.status_of(c) != 503]
        closed = [c for c in rest if c["closed"] is not None]
        still = [c for c in rest if c["closed"] is None and c.get("server_end") == "ESTABLISHED"]
        half_open = [c for c in rest if c["closed"] is None
                     and c.get("server_end") != "ESTABLISHED"]
        kept = [c["closed"] - c["connected"] for c in closed]
        waited = [c["first_reply"] - c["connected"] for c in refused]
        return {
            "opened": len(mine),
            "refused_503": len(refused),
            "refused_after_s_max": round(max(waited), 2) if waited else None,
            "closed_by_server": len(closed),
            "kept_open_s": {
                "median": round(statistics.median(kept), 2) if kept else None,
                "min": round(min(kept), 2) if kept else None,
                "max": round(max(kept), 2) if kept else None,
            },
            "answers": counts(self.status_of(c) or "none" for c in closed),
            "still_open_at_end": len(still),
            "never_accepted": len(half_open),
            "never_connected": len(never),
        }


def describe(s, noun):
    """One line for an Attack.summary."""
    return ("{} {n}: {refused_503} refused with 503 (the last {refused_after_s_max} s after "
            "connecting); {closed_by_server} closed by the server after median {med} s (min {mn} "
            "s, max {mx} s), answered {answers}; {still_open_at_end} still open when the window "
            "ended; {never_accepted} never accepted (half-open: the listener's accept queue "
            "overflowed); {never_connected} never connected").format(
                s["opened"], n=noun, med=s["kept_open_s"]["median"], mn=s["kept_open_s"]["min"],
                mx=s["kept_open_s"]["max"], **s)


# ---------------------------------------------------------------- scenarios


def ms_key(keys, name, fallback):
    try:
        return int(keys.get(name, fallback))
    except ValueError:
        return fallback


def scenario_idle(opts, keys, report):
    report.start("idle", "{} idle + {} slowloris connections".format(opts.idle, opts.slowloris))
    raise_fd_limit(opts.idle + opts.slowloris + 256)
    header_ms = ms_key(keys, "server.header_read_timeout_ms", 10000)
    if "server.header_read_timeout_ms" in opts.settings:
        header_ms = int(opts.settings["server.header_read_timeout_ms"])
    # Long enough for a connection whose SYN was dropped (the accept queue
    # overflowed) and retried to take a freed slot and be timed out too.
    window = opts.window or 2 * header_ms / 1000.0 + 10.0
    d = Daemon(opts, dict({"tasks.poll_interval_ms": 50}, **opts.settings), report)
    try:
        report.note("daemon pid {} on port {}; server.max_connections {}, "
                    "server.header_read_timeout_ms {}; window {} s".format(
                        d.pid, d.port, opts.settings.get(
                            "server.max_connections", keys.get("server.max_connections")),
                        header_ms, window))
        task_id = create_task(d.port)
        time.sleep(0.5)
        rss_before = d.rss.now()
        # Idle sockets and slowloris sockets interleaved, so that both kinds
        # hold some of the connection slots.
        total = opts.idle + opts.slowloris
        kinds = []
        every = total / opts.slowloris if opts.slowloris else None
        slow_at = set(int(i * every) for i in range(opts.slowloris)) if every else set()
        head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
        for i in range(total):
            if i in slow_at:
                kinds.append(("slowloris", head[:1], head[1:] + b"a" * 4096, 1.0))
            else:
                kinds.append(("idle", b"", b"", None))
        # Two seconds of probes before the attack give the quiet baseline.
        t0 = time.monotonic() + 2.0
        probes = [Prober(get_probe(d.port, "/healthz"), t0),
                  Prober(poll_probe(d.port, task_id), t0)]
        for p in probes:
            p.start()
        time.sleep(max(0.0, t0 - time.monotonic()))
        attack = Attack(d.port, kinds, t0, reopen=opts.reopen)
        attack.open()
        report.note("{} sockets opened in {:.2f} s{}".format(
            total, attack.opened, "" if opts.reopen is None else
            "; each one the server closes or refuses is opened again {} s later".format(
                opts.reopen)))
        time.sleep(window)
        for p in probes:
            p.stop()
        attack.stop()
        t1 = time.monotonic()
        for label, p, ok in (("healthz", probes[0], lambda o: o == 200),
                             ("tasks/get (fresh client)", probes[1], lambda o: o == "ok")):
            quiet = [r for r in p.results if r[0] < 0]
            report.put(label + " baseline", lat([took for (_, o, took) in quiet if ok(o)]),
                       "{} before the attack: {}".format(
                           label, fmt_lat(lat([took for (_, o, took) in quiet if ok(o)]))))
            summarise_probes(report, label, [r for r in p.results if r[0] >= 0], ok)
        after = [r for r in probes[0].results + probes[1].results if r[0] > header_ms / 1000.0 + 1]
        report.put("probes_after_header_timeout", {
            "probes": len(after),
            "failed": sum(1 for (_, o, _) in after if o not in (200, "ok")),
            "latency": lat([took for (_, o, took) in after if o in (200, "ok")]),
        }, "probes more than header timeout + 1 s after the attack began: {} ({} failed); {}".format(
            len(after), sum(1 for (_, o, _) in after if o not in (200, "ok")),
            fmt_lat(lat([took for (_, o, took) in after if o in (200, "ok")]))))
        for kind in ("idle", "slowloris"):
            s = attack.summary(kind)
            report.put(kind + "_connections", s, describe(s, kind + " connections"))
        peak = d.rss.peak_between(t0, t1)
        report.put("rss", {"before_kib": rss_before, "peak_kib": peak, "after_kib": d.rss.now()},
                   "RSS: before {} MiB, peak {} MiB, end {} MiB".format(
                       mib(rss_before), mib(peak), mib(d.rss.now())))
    finally:
        report.put("daemon_exit", d.stop())


def dribble_phase(opts, keys, report, label, claim):
    body_ms = opts.settings.get("server.body_read_timeout_ms",
                                keys.get("server.body_read_timeout_ms"))
    window = opts.window or (int(body_ms) / 1000.0 + 10.0 if body_ms else 30.0)
    d = Daemon(opts, dict({"tasks.poll_interval_ms": 50}, **opts.settings), report)
    try:
        report.note("{}: daemon pid {} on port {}; server.body_read_timeout_ms {}; window {} s"
                    .format(label, d.pid, d.port, body_ms or "(no such key)", window))
        task_id = create_task(d.port)
        rss_before = d.rss.now()
        headers = ["POST /mcp HTTP/1.1", "Host: 127.0.0.1",
                   "Content-Type: application/json",
                   "Accept: application/json, text/event-stream",
                   "Content-Length: 100000"]
        if claim:
            headers += ["MCP-Protocol-Version: " + PROTOCOL, "Mcp-Method: tasks/get",
                        "Mcp-Name: " + task_id]
        head = ("\r\n".join(headers) + "\r\n\r\n").encode()
        kinds = [("dribbler", head + b"{", b" " * 100000, 1.0)] * opts.dribblers
        t0 = time.monotonic()
        attack = Attack(d.port, kinds, t0)
        attack.open()
        time.sleep(0.3)

        def call():
            outcome, _, took = mcp(d.port, "tools/call", {"name": "quick_sync", "arguments": {}},
                                   name="quick_sync", tasks=False)
            return outcome, took

        probes = [Prober(poll_probe(d.port, task_id), t0), Prober(call, t0),
                  Prober(get_probe(d.port, "/readyz"), t0)]
        for p in probes:
            p.start()
        time.sleep(window)
        for p in probes:
            p.stop()
        attack.stop()
        t1 = time.monotonic()
        summarise_probes(report, label + " tasks/get", probes[0].results, lambda o: o == "ok")
        summarise_probes(report, label + " tools/call", probes[1].results, lambda o: o == "ok")
        ready = probes[2].results
        report.put(label + " readyz", counts(o for (_, o, _) in ready),
                   "{} /readyz answers: {}".format(label, counts(o for (_, o, _) in ready)))
        # /readyz tells the truth when it says 200 exactly while /mcp admits
        # requests: compare each answer with the nearest call and poll.
        for what, probe in (("call", probes[1]), ("poll", probes[0])):
            disagree = 0
            for (t, o, _) in ready:
                if not probe.results:
                    break
                nearest = min(probe.results, key=lambda r: abs(r[0] - t))
                if (o == 200) != (nearest[1] == "ok"):
                    disagree += 1
            report.put("{} readyz_disagrees_with_{}".format(label, what), disagree,
                       "{} /readyz answers that disagreed with the nearest {}'s admission: "
                       "{} of {}".format(label, what, disagree, len(ready)))
        s = attack.summary("dribbler")
        report.put(label + " dribblers", s, describe(s, label + " dribblers"))
        peak = d.rss.peak_between(t0, t1)
        report.put(label + " rss", {"before_kib": rss_before, "peak_kib": peak},
                   "{} RSS: before {} MiB, peak {} MiB".format(label, mib(rss_before), mib(peak)))
    finally:
        report.put(label + " daemon_exit", d.stop())


def scenario_dribble(opts, keys, report):
    report.start("dribble", "{} dribbled request bodies".format(opts.dribblers))
    dribble_phase(opts, keys, report, "unnamed", claim=False)
    dribble_phase(opts, keys, report, "claims-tasks/get", claim=True)


def legacy_initialize_body(rid):
    return json.dumps({
        "jsonrpc": "2.0", "id": rid, "method": "initialize",
        "params": {
            "protocolVersion": LEGACY_PROTOCOL,
            "capabilities": {},
            "clientInfo": {"name": "legacy-client", "version": "1"},
        },
    }).encode()


LEGACY_HEADERS = {"Content-Type": "application/json",
                  "Accept": "application/json, text/event-stream"}


def scenario_sessions(opts, keys, report):
    report.start("sessions", "{} legacy initialize requests".format(opts.sessions))
    settings = dict({"server.session_idle_secs": 5, "tasks.poll_interval_ms": 50},
                    **opts.settings)
    idle = int(settings["server.session_idle_secs"])
    d = Daemon(opts, settings, report)
    try:
        report.note("daemon pid {} on port {}; server.max_sessions {}, session_idle_secs {}; "
                    "{} keep-alive connections".format(
                        d.pid, d.port, settings.get("server.max_sessions",
                                                    keys.get("server.max_sessions")),
                        idle, opts.session_conns))
        time.sleep(1.0)
        rss_before = d.rss.now()
        tally = {"accepted": 0, "refused_sessions_full": 0, "refused_server_busy": 0,
                 "other": {}, "reconnects": 0,
                 "samples": {}}
        lock = threading.Lock()
        per = [opts.sessions // opts.session_conns] * opts.session_conns
        per[0] += opts.sessions - sum(per)

        def worker(n, base):
            conn = None
            for i in range(n):
                rid = base + i
                for _ in range(3):
                    try:
                        if conn is None or conn.closed:
                            if conn is not None:
                                with lock:
                                    tally["reconnects"] += 1
                            conn = Conn(d.port, 10.0)
                        r = conn.request("POST", "/mcp", LEGACY_HEADERS,
                                         legacy_initialize_body(rid))
                        break
                    except (OSError, ConnectionError) as e:
                        r = type(e).__name__
                        if conn is not None:
                            conn.close()
                with lock:
                    if isinstance(r, str):
                        tally["other"][r] = tally["other"].get(r, 0) + 1
                    elif r.status == 200 and r.header("mcp-session-id"):
                        tally["accepted"] += 1
                    elif r.status == 503 and error_name(r) == SESSIONS_FULL:
                        tally["refused_sessions_full"] += 1
                    elif r.status == 503 and error_name(r) == SERVER_BUSY:
                        tally["refused_server_busy"] += 1
                    else:
                        k = "http {}".format(r.status)
                        tally["other"][k] = tally["other"].get(k, 0) + 1
                        tally["samples"].setdefault(
                            k, r.body[:200].decode("utf-8", "replace"))
            if conn is not None:
                conn.close()

        # Polls of a task made beforehand, every 100 ms during the flood:
        # initialize and tasks/get may share a request budget.
        task_id = create_task(d.port)
        t0 = time.monotonic()
        poller = Prober(poll_probe(d.port, task_id), t0)
        poller.start()
        threads = []
        base = 1
        for n in per:
            threads.append(threading.Thread(target=worker, args=(n, base), daemon=True))
            base += n
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        t1 = time.monotonic()
        poller.stop()
        rss_end = d.rss.now()
        peak = max(v for v in (d.rss.peak_between(t0, t1), rss_end) if v is not None)
        report.put("requests", dict(tally, seconds=round(t1 - t0, 1)),
                   "{} requests in {:.1f} s ({:.0f}/s): {} accepted, {} refused with "
                   "TG_SESSIONS_FULL, {} with TG_SERVER_BUSY, other {}, reconnects {}".format(
                       opts.sessions, t1 - t0, opts.sessions / (t1 - t0), tally["accepted"],
                       tally["refused_sessions_full"], tally["refused_server_busy"],
                       tally["other"], tally["reconnects"]))
        for k, body in tally["samples"].items():
            report.note("first {} body: {!r}".format(k, body))
        summarise_probes(report, "tasks/get during the flood", poller.results,
                         lambda o: o == "ok")
        # Past the idle expiry every session has gone: sample RSS meanwhile.
        expiry_at = t1 + idle
        sample_until = expiry_at + opts.expiry_watch
        rows = []
        while time.monotonic() < sample_until:
            time.sleep(1.0)
            rows.append((round(time.monotonic() - t1, 1), d.rss.now()))
        after_expiry = [v for (t, v) in rows if t >= idle + 1]
        # When RSS first came within 1 MiB of its lowest after the expiry.
        low_at = None
        if after_expiry:
            low_at = next(t for (t, v) in rows if t >= idle + 1 and v <= min(after_expiry) + 1024)
        # A fresh initialize is taken again once the sessions expired.
        r, err, _ = once(d.port, "POST", "/mcp", LEGACY_HEADERS, legacy_initialize_body(0))
        fresh = err or r.status
        report.put("rss", {
            "before_kib": rss_before, "peak_kib": peak, "at_end_of_requests_kib": rss_end,
            "after_expiry_first_kib": after_expiry[0] if after_expiry else None,
            "after_expiry_min_kib": min(after_expiry) if after_expiry else None,
            "after_expiry_last_kib": after_expiry[-1] if after_expiry else None,
            "lowest_reached_s": low_at,
            "timeline": rows,
        }, "RSS: before {} MiB, peak {} MiB, at the end of the requests {} MiB; after expiry "
           "(+{} s .. +{} s): first {} MiB, min {} MiB (reached at +{} s), last {} MiB".format(
               mib(rss_before), mib(peak), mib(rss_end), idle + 1, round(sample_until - t1),
               mib(after_expiry[0]) if after_expiry else None,
               mib(min(after_expiry)) if after_expiry else None, low_at,
               mib(after_expiry[-1]) if after_expiry else None))
        report.put("initialize_after_expiry", fresh,
                   "a fresh initialize after expiry: {}".format(fresh))
    finally:
        report.put("daemon_exit", d.stop())


def scenario_long_calls(opts, keys, report):
    report.start("long-calls", "{} concurrent {} s {} calls".format(
        opts.calls, opts.tool_secs, "synchronous" if opts.no_tasks else "task"))
    settings = dict({"tasks.max_running": 4, "server.max_concurrent_requests": 16,
                     "tasks.poll_interval_ms": 50, "tasks.cancel_grace_ms": 1000},
                    **opts.settings)
    d = Daemon(opts, settings, report)
    try:
        report.note("daemon pid {} on port {}; tasks.max_running {}, "
                    "server.max_concurrent_requests {}".format(
                        d.pid, d.port, settings["tasks.max_running"],
                        settings["server.max_concurrent_requests"]))
        quick_task = create_task(d.port) if opts.no_tasks else None
        t0 = time.monotonic()
        kids = []
        halt = threading.Event()

        def sample_children():
            while not halt.is_set():
                direct, every = descendants_of(d.pid)
                kids.append((time.monotonic() - t0, direct, every))
                halt.wait(0.1)

        sampler = threading.Thread(target=sample_children, daemon=True)
        sampler.start()
        calls = [None] * opts.calls
        gate = threading.Barrier(opts.calls)

        def call(i):
            gate.wait()
            outcome, result, took = mcp(
                d.port, "tools/call", {"name": "sleep", "arguments": {"seconds": opts.tool_secs}},
                name="sleep", tasks=not opts.no_tasks, timeout=opts.tool_secs + 60)
            calls[i] = (outcome, result, took)

        callers = [threading.Thread(target=call, args=(i,), daemon=True)
                   for i in range(opts.calls)]
        for t in callers:
            t.start()
        # Every call answers at once (a task or a refusal) or, run
        # synchronously, after the tool's time: poll the tasks meanwhile.
        first_answers = time.monotonic() + 5.0
        while time.monotonic() < first_answers and any(c is None for c in calls):
            time.sleep(0.05)
        tasks = [c[1]["taskId"] for c in calls
                 if c is not None and c[0] == "ok" and c[1].get("resultType") == "task"]
        report.note("{} calls answered within 5 s; {} became tasks".format(
            sum(1 for c in calls if c is not None), len(tasks)))
        if opts.no_tasks:
            # Nothing of the calls to poll: a task made beforehand stands in.
            tasks = [quick_task]
        gets, cancels, ready = [], [], []
        to_cancel = [] if opts.no_tasks else tasks[: len(tasks) // 2]
        cancel_at = time.monotonic() + opts.tool_secs / 4.0
        statuses = {}
        deadline = t0 + opts.tool_secs + 15.0
        i = 0
        while time.monotonic() < deadline:
            if tasks:
                tid = tasks[i % len(tasks)]
                i += 1
                outcome, result, took = mcp(d.port, "tasks/get", {"taskId": tid}, name=tid)
                gets.append((time.monotonic() - t0, outcome, took))
                if outcome == "ok":
                    statuses[tid] = result.get("status")
            if to_cancel and time.monotonic() >= cancel_at:
                for tid in to_cancel:
                    outcome, _, took = mcp(d.port, "tasks/cancel", {"taskId": tid}, name=tid)
                    cancels.append((time.monotonic() - t0, outcome, took))
                to_cancel = []
            r, took = get_status(d.port, "/readyz")
            ready.append((time.monotonic() - t0, r, took))
            done = all(statuses.get(t) in ("completed", "failed", "cancelled") for t in tasks)
            if done and all(c is not None for c in calls):
                break
            time.sleep(0.1 / max(1, len(tasks)))
        for t in callers:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        halt.set()
        sampler.join()
        outcomes = []
        for c in calls:
            if c is None:
                outcomes.append("no answer")
            elif c[0] == "ok":
                outcomes.append("task" if c[1].get("resultType") == "task" else "synchronous result")
            elif c[0].startswith("rpc ") and isinstance(c[1], dict):
                name = ((c[1].get("error") or {}).get("data") or {}).get("name")
                outcomes.append("{} {}".format(c[0], name or ""))
            else:
                outcomes.append(c[0])
        call_lat = [c[2] for c in calls if c is not None]
        report.put("calls", {"outcomes": counts(outcomes), "latency": lat(call_lat)},
                   "calls: {}; answered {}".format(counts(outcomes), fmt_lat(lat(call_lat))))
        max_kids = max(k for (_, k, _) in kids) if kids else 0
        max_all = max(a for (_, _, a) in kids) if kids else 0
        report.put("tool_processes", {"max": max_kids, "max_descendants": max_all,
                                      "samples": len(kids)},
                   "tool runs (the daemon's children): at most {} at once; all processes under "
                   "the daemon: at most {} ({} samples, every 100 ms)".format(
                       max_kids, max_all, len(kids)))
        summarise_probes(report, "tasks/get", gets, lambda o: o == "ok")
        summarise_probes(report, "tasks/cancel", cancels, lambda o: o == "ok")
        report.put("final_statuses", counts(statuses.values()),
                   "task statuses at the end: {}".format(counts(statuses.values())))
        report.put("readyz", counts(r for (_, r, _) in ready),
                   "/readyz during the window: {}".format(counts(r for (_, r, _) in ready)))
        report.put("rss_peak_kib", d.rss.peak_between(t0, time.monotonic()),
                   "RSS peak {} MiB".format(mib(d.rss.peak_between(t0, time.monotonic()))))
    finally:
        report.put("daemon_exit", d.stop())


SCENARIOS = {
    "idle": scenario_idle,
    "dribble": scenario_dribble,
    "sessions": scenario_sessions,
    "long-calls": scenario_long_calls,
}


def parse_setting(text):
    key, sep, value = text.partition("=")
    if not sep or "." not in key:
        raise argparse.ArgumentTypeError("expected SECTION.KEY=VALUE, e.g. server.max_sessions=512")
    value = value.strip()
    try:
        return key.strip(), int(value)
    except ValueError:
        return key.strip(), value


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenarios", nargs="+", metavar="SCENARIO",
                    choices=["all"] + list(SCENARIOS),
                    help="one or more of: all, " + ", ".join(SCENARIOS))
    ap.add_argument("--binary", default=os.path.join(here, "..", "target", "debug", "taskgate"),
                    help="the taskgate binary to start (default: target/debug/taskgate)")
    ap.add_argument("--set", dest="sets", action="append", default=[], type=parse_setting,
                    metavar="SECTION.KEY=VALUE",
                    help="a configuration setting for every daemon started, over the "
                         "scenario's own (repeatable)")
    ap.add_argument("--user", default="nobody",
                    help="run as root, the daemon runs as this user (default: nobody)")
    ap.add_argument("--window", type=float, default=None,
                    help="seconds each idle/dribble window lasts (default: the relevant "
                         "timeout + 10 s)")
    ap.add_argument("--idle", type=int, default=2000, help="idle connections (2000)")
    ap.add_argument("--slowloris", type=int, default=256, help="slowloris connections (256)")
    ap.add_argument("--reopen", type=float, default=None, metavar="SECS",
                    help="idle: open a new connection of the same kind SECS after the server "
                         "closed or refused one (a persistent attacker); by default none is "
                         "reopened")
    ap.add_argument("--dribblers", type=int, default=64, help="dribbled bodies (64)")
    ap.add_argument("--sessions", type=int, default=50000,
                    help="legacy initialize requests (50000)")
    ap.add_argument("--session-conns", type=int, default=8,
                    help="keep-alive connections the initialize requests are spread over (8)")
    ap.add_argument("--expiry-watch", type=float, default=30.0,
                    help="seconds RSS is sampled past the session expiry (30)")
    ap.add_argument("--calls", type=int, default=24, help="concurrent long calls (24)")
    ap.add_argument("--tool-secs", type=int, default=20, help="how long the long tool sleeps (20)")
    ap.add_argument("--no-tasks", action="store_true",
                    help="long-calls: the calls do not negotiate Tasks, so they run synchronously "
                         "and hold request slots (raise tasks.max_running with --set to let them); "
                         "a task made beforehand is polled instead")
    ap.add_argument("--json", metavar="FILE", help="also write every figure to FILE as JSON")
    ap.add_argument("--keep", action="store_true",
                    help="keep each daemon's temporary directory (configuration, log)")
    opts = ap.parse_args()
    opts.binary = os.path.abspath(opts.binary)
    opts.settings = dict(opts.sets)
    if not os.access(opts.binary, os.X_OK):
        ap.error("{} is not an executable; build it (cargo build) or name one with --binary"
                 .format(opts.binary))
    if os.geteuid() == 0:
        try:
            if pwd.getpwnam(opts.user).pw_uid == 0:
                ap.error("--user must not be root")
        except KeyError:
            ap.error("no user {!r} (--user)".format(opts.user))
    names = list(SCENARIOS) if "all" in opts.scenarios else list(dict.fromkeys(opts.scenarios))

    def stopped(signum, _frame):
        # Unwinds through each scenario's `finally`, which stops its daemon
        # and removes its temporary directory.
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stopped)
    try:
        keys = key_reference(opts.binary)
    except (OSError, subprocess.CalledProcessError) as e:
        ap.error("{} does not list its configuration keys (man --reference): {}".format(
            opts.binary, e))
    report = Report()
    version = subprocess.run([opts.binary, "--version"], capture_output=True,
                             text=True).stdout.strip()
    print("hostile-load: {} ({}); scenarios: {}".format(
        opts.binary, version or "version unknown", ", ".join(names)), flush=True)
    if os.geteuid() == 0:
        print("hostile-load: running as root; the daemon runs as {}".format(opts.user))
    random.seed(0)
    for name in names:
        try:
            SCENARIOS[name](opts, keys, report)
        except RuntimeError as e:
            print("hostile-load: {}: {}".format(name, e), file=sys.stderr)
            return 1
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(report.figures, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
