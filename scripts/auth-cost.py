#!/usr/bin/env python3
"""Measures what HTTP authentication costs a real `taskgate serve`: the
latency of a durable create and the daemon's CPU per request, with no
authentication, with a static token and with JWTs, in one run.

    scripts/auth-cost.py [--binary PATH] [--creates N] [--runs R] [--json FILE]

It builds nothing: it starts the binary given by --binary (by default
target/release/taskgate beside this script; build it with `cargo build
--release`), once per mode, each daemon `serve --bench-tool` on an
ephemeral 127.0.0.1 port with a generated configuration and a fresh private
state directory (mode 0700) in a temporary directory that is deleted
afterwards. Readiness and the port come from the systemd notify protocol
(READY=1 and STATUS=). The modes:

  none        no [auth]: every caller is the local owner.
  static      a tokens file with one static token (tgk_…); every request
              carries it.
  jwt-eddsa   one [[auth.jwt]] issuer whose JWKS file holds a generated
              Ed25519 key; every request carries one EdDSA-signed JWT.
  jwt-es256   the same with a generated P-256 key and ES256.
  jwt-rs256   the same with a generated 2048-bit RSA key and RS256.
  scraped     no [auth], like none, while a scraper reads its /metrics
              every second (--scrape-every) for the whole run: what being
              monitored costs a create (the scrapes that fall inside its
              chunks are counted in its CPU, in proportion to their time).

The authenticated modes set auth.local_owner = "never", so no request can
pass as the local owner: each one is authenticated.

Every mode creates N tasks (default 2000), one after another on one
keep-alive connection: `tools/call` of the built-in no-op tool with protocol
2026-07-28 and the Tasks extension, each answered with a committed task
handle (a durable create). The modes take turns in rounds of --chunk
creates, the order rotating each round, so host noise falls on all of them
alike; each daemon is idle while another mode runs. Before its first round a
mode makes --warmup creates that are not counted. The daemon's CPU is read
around each of its chunks: utime+stime of /proc/<pid>/stat (clock ticks),
and the on-CPU nanoseconds of its threads from /proc/<pid>/task/*/schedstat
(finer; a thread that exits within a chunk takes its share with it).

It prints, per mode: create latency p50/p90/p99, CPU per request, and each
against `none` (ratios, and the extra CPU in microseconds), as a markdown
table, and writes every figure to --json (default
./auth-cost-<UTC time>.json). With --runs R the whole measurement is
repeated R times with fresh daemons and the table gives the median of each
figure across the runs. The figures describe this host and this build; the
script gives no verdict and exits 0 whenever the measurement ran to its
end.

JWTs are signed with the `openssl` command (OpenSSL 1.1.1 or later, for
Ed25519), because Python's standard library has no Ed25519, ECDSA or RSA
signatures and this script must run on a fresh host with nothing else
installed. Keys are generated per run in the temporary directory and only
their public halves are given to the daemon, as JWKS files. Without
`openssl` the JWT modes are skipped and the report says so.

Run it as an ordinary user. Run as root, it starts the daemons as --user
(default: nobody) instead, never as root.
"""

import argparse
import base64
import datetime
import hashlib
import json
import os
import platform
import pwd
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

PROTOCOL = "2026-07-28"
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
BENCH_TOOL = "taskgate_bench_noop"
HOST = "127.0.0.1"
MODES = ["none", "static", "jwt-eddsa", "jwt-es256", "jwt-rs256", "scraped"]
RESOURCE = "https://taskgate.auth-cost.invalid/mcp"
ISSUER = "https://issuer.auth-cost.invalid"
SCOPES = "tools:call tasks:read"
CLK_TCK = os.sysconf("SC_CLK_TCK")

# ---------------------------------------------------------------- figures


def pct(values, q):
    """The q-th percentile (nearest rank) of values, or None."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(round(q / 100.0 * len(s) + 0.5)) - 1))
    return s[k]


def median_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def fmt(v, digits=3):
    if v is None:
        return "—"
    return "{:.{}f}".format(v, digits)


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------- tokens


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def openssl(*args, data=None):
    return subprocess.run(
        ["openssl"] + list(args), input=data, capture_output=True, check=True
    ).stdout


class Issuer:
    """A generated signing key (Ed25519, P-256 or RSA), its JWKS and its tokens.

    Signing goes through the `openssl` command, the one tool for it that a
    fresh host is likely to have; only the public key reaches the daemon."""

    def __init__(self, directory, alg):
        self.alg = alg
        self.key = os.path.join(directory, "{}.key.pem".format(alg.lower()))
        if alg == "EdDSA":
            openssl("genpkey", "-algorithm", "ed25519", "-out", self.key)
            der = openssl("pkey", "-in", self.key, "-pubout", "-outform", "DER")
            # The DER SubjectPublicKeyInfo of an Ed25519 key ends with
            # the 32-byte public key.
            jwk = {"kty": "OKP", "crv": "Ed25519", "x": b64url(der[-32:])}
        elif alg == "ES256":
            openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
                    "-out", self.key)
            der = openssl("pkey", "-in", self.key, "-pubout", "-outform", "DER")
            # ... and that of a P-256 key with the uncompressed point
            # 04 || x || y.
            point = der[-65:]
            jwk = {"kty": "EC", "crv": "P-256", "x": b64url(point[1:33]),
                   "y": b64url(point[33:])}
        elif alg == "RS256":
            openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
                    "-out", self.key)
            text = openssl("pkey", "-in", self.key, "-noout", "-text").decode()
            m = re.search(r"publicExponent: (\d+)", text)
            modulus = openssl("rsa", "-in", self.key, "-noout", "-modulus").decode()
            n = int(modulus.strip().split("=", 1)[1], 16)
            e = int(m.group(1))
            jwk = {"kty": "RSA",
                   "n": b64url(n.to_bytes((n.bit_length() + 7) // 8, "big")),
                   "e": b64url(e.to_bytes((e.bit_length() + 7) // 8, "big"))}
        else:
            raise ValueError(alg)
        os.chmod(self.key, 0o600)
        self.kid = "auth-cost-" + alg.lower()
        jwk.update({"kid": self.kid, "alg": alg, "use": "sig"})
        self.jwks = json.dumps({"keys": [jwk]})

    def token(self, subject):
        """An access token (RFC 9068) valid for the next 50 minutes."""
        now = int(time.time())
        header = {"alg": self.alg, "typ": "at+jwt", "kid": self.kid}
        claims = {"iss": ISSUER, "sub": subject, "aud": RESOURCE, "tid": "bench",
                  "iat": now, "nbf": now, "exp": now + 3000,
                  "jti": secrets.token_hex(8), "scope": SCOPES}
        signing_input = (b64url(json.dumps(header, separators=(",", ":")).encode()) + "." +
                         b64url(json.dumps(claims, separators=(",", ":")).encode()))
        # From a file: OpenSSL 3's one-shot Ed25519 signing needs the
        # message's size up front, which a pipe does not give.
        message = self.key + ".msg"
        with open(message, "wb") as f:
            f.write(signing_input.encode())
        if self.alg == "EdDSA":
            sig = openssl("pkeyutl", "-sign", "-inkey", self.key, "-rawin", "-in", message)
        elif self.alg == "ES256":
            sig = ecdsa_raw(openssl("dgst", "-sha256", "-sign", self.key, message))
        else:
            sig = openssl("dgst", "-sha256", "-sign", self.key, message)
        os.unlink(message)
        return signing_input + "." + b64url(sig)


def ecdsa_raw(der):
    """r || s, 32 bytes each, from OpenSSL's DER ECDSA-Sig-Value: a JWS
    carries the raw pair (RFC 7518, section 3.4)."""
    # SEQUENCE { INTEGER r, INTEGER s }, short lengths at this size.
    if der[0] != 0x30 or der[2] != 0x02:
        raise ValueError("not a DER ECDSA signature")
    rlen = der[3]
    r = der[4:4 + rlen]
    if der[4 + rlen] != 0x02:
        raise ValueError("not a DER ECDSA signature")
    slen = der[5 + rlen]
    s = der[6 + rlen:6 + rlen + slen]
    return (int.from_bytes(r, "big").to_bytes(32, "big") +
            int.from_bytes(s, "big").to_bytes(32, "big"))


def static_secret():
    """A secret of the shape taskgate issues: tgk_ and 43 base64url characters."""
    return "tgk_" + b64url(secrets.token_bytes(32))


def tokens_file(secret):
    digest = hashlib.sha256(secret.encode()).hexdigest()
    return ('# generated by auth-cost.py\n[[token]]\nid = "auth-cost"\n'
            'hash = "sha256:{}"\ntenant = "bench"\nsubject = "auth-cost@bench"\n'
            'scopes = ["tools:call", "tasks:read"]\n'.format(digest))


# ---------------------------------------------------------------- HTTP


class Conn:
    """One HTTP/1.1 keep-alive connection to the daemon."""

    def __init__(self, port, timeout=10.0):
        self.sock = socket.create_connection((HOST, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def close(self):
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

    def post(self, head, body):
        """Sends a prepared request head and body; (status, body bytes,
        whether the server closes the connection after it)."""
        self.sock.sendall(head + body)
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        raw, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            data = b""
            while True:
                size = int(self._line().split(b";")[0], 16)
                if size == 0:
                    while self._line():
                        pass
                    break
                data += self._exactly(size)
                self._exactly(2)
        else:
            data = self._exactly(int(headers.get("content-length", "0")))
        # The next request needs a new connection.
        closing = headers.get("connection", "").lower() == "close"
        return status, data, closing


def create_request(port, token, rid):
    body = json.dumps({
        "jsonrpc": "2.0", "id": rid, "method": "tools/call",
        "params": {
            "name": BENCH_TOOL, "arguments": {},
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": PROTOCOL,
                "io.modelcontextprotocol/clientCapabilities":
                    {"extensions": {TASKS_EXTENSION: {}}},
                "io.modelcontextprotocol/clientInfo": {"name": "auth-cost", "version": "1"},
            },
        },
    }).encode()
    head = [
        "POST /mcp HTTP/1.1",
        "Host: {}:{}".format(HOST, port),
        "Content-Type: application/json",
        "Accept: application/json, text/event-stream",
        "MCP-Protocol-Version: " + PROTOCOL,
        "Mcp-Method: tools/call",
        "Mcp-Name: " + BENCH_TOOL,
        "Content-Length: {}".format(len(body)),
    ]
    if token is not None:
        head.append("Authorization: Bearer " + token)
    return ("\r\n".join(head) + "\r\n\r\n").encode(), body


def outcome_of(status, data):
    """"task" for a committed task handle, otherwise what came instead."""
    text = data.decode("utf-8", "replace")
    msg = None
    try:
        msg = json.loads(text)
    except ValueError:
        for line in text.splitlines():
            if line.startswith("data:"):
                try:
                    msg = json.loads(line[5:].strip())
                    break
                except ValueError:
                    continue
    if not isinstance(msg, dict):
        return "http {}".format(status)
    if "error" in msg:
        return "rpc {}".format((msg["error"] or {}).get("code"))
    result = msg.get("result") or {}
    if status == 200 and result.get("resultType") == "task":
        return "task"
    if status == 200:
        return "synchronous result"
    return "http {}".format(status)


# ---------------------------------------------------------------- the daemon


def cpu_ticks(pid):
    """utime+stime of the whole process (every thread), in clock ticks."""
    with open("/proc/{}/stat".format(pid), "rb") as f:
        stat = f.read().decode("latin-1")
    fields = stat[stat.rfind(")") + 2:].split()
    # Fields 14 and 15 of proc(5), counted from after the command name.
    return int(fields[11]) + int(fields[12])


def cpu_ns(pid):
    """On-CPU nanoseconds of the process's live threads, from schedstat."""
    total, read = 0, 0
    try:
        tids = os.listdir("/proc/{}/task".format(pid))
    except OSError:
        return None
    for tid in tids:
        try:
            with open("/proc/{}/task/{}/schedstat".format(pid, tid)) as f:
                total += int(f.read().split()[0])
                read += 1
        except (OSError, ValueError, IndexError):
            # A thread that has just exited, or a kernel without schedstat.
            continue
    return total if read else None


class Daemon:
    """A real `taskgate serve --bench-tool` on an ephemeral loopback port."""

    def __init__(self, opts, mode, root, auth_text, files):
        self.opts = opts
        self.mode = mode
        self.dir = os.path.join(root, mode)
        os.mkdir(self.dir, 0o700)
        self.state = os.path.join(self.dir, "state")
        os.mkdir(self.state, 0o700)
        self.config = os.path.join(self.dir, "taskgate.toml")
        self.log = os.path.join(self.dir, "daemon.log")
        user = None
        if os.geteuid() == 0:
            user = pwd.getpwnam(opts.user)
        written = [self.dir, self.state, self.config]
        for name, (text, mode_bits) in files.items():
            path = os.path.join(self.dir, name)
            with open(path, "w") as f:
                f.write(text)
            os.chmod(path, mode_bits)
            written.append(path)
            auth_text = auth_text.replace("{" + name + "}", path)
        with open(self.config, "w") as f:
            f.write("# generated by auth-cost.py ({})\n{}".format(mode, auth_text))
        notify_path = os.path.join(self.dir, "notify.sock")
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(notify_path)
        self.notify.settimeout(0.2)
        written.append(notify_path)
        kwargs = {}
        if user is not None:
            for p in written:
                os.chown(p, user.pw_uid, user.pw_gid)
            kwargs = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
        log = open(self.log, "wb")
        self.proc = subprocess.Popen(
            [opts.binary, "serve", "--bench-tool", "--config", self.config,
             "--state-dir", self.state, "--listen", HOST + ":0"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
            # As `taskgate bench` runs its daemon: warnings, and taskgate's
            # own lines at info (none per request).
            env={"PATH": "/usr/bin:/bin", "NOTIFY_SOCKET": notify_path,
                 "TASKGATE_LOG": "warn,taskgate=info"},
            cwd=self.dir, **kwargs)
        log.close()
        self.pid = self.proc.pid
        try:
            self.port = self._wait_ready(60.0)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, limit):
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("the {} daemon exited ({}) before READY=1:\n{}".format(
                    self.mode, self.proc.returncode, self.log_tail()))
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
        raise RuntimeError("no READY=1 from the {} daemon within {} s:\n{}".format(
            self.mode, limit, self.log_tail()))

    def log_tail(self, n=20):
        try:
            with open(self.log, "rb") as f:
                return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.notify.close()
        return self.proc.returncode


# ---------------------------------------------------------------- one run


class Mode:
    """One mode's daemon, credential and tally."""

    def __init__(self, name, daemon, token):
        self.name = name
        self.daemon = daemon
        # One token for the whole run, as a client reuses its access token.
        self.token = token
        self.conn = None
        self.rid = 0
        self.latencies = []
        self.outcomes = {}
        self.ticks = 0
        self.ns = 0
        self.counted = 0

    def connect(self):
        if self.conn is not None:
            self.conn.close()
        self.conn = Conn(self.daemon.port)

    def one(self):
        """One create: (seconds, outcome). A connection the server closed
        (its keep-alive idle bound) is reopened and the create sent again."""
        self.rid += 1
        head, body = create_request(self.daemon.port, self.token, self.rid)
        for attempt in (0, 1):
            if self.conn is None:
                self.connect()
            t0 = time.perf_counter()
            try:
                status, data, closing = self.conn.post(head, body)
            except (ConnectionError, OSError):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise
                continue
            took = time.perf_counter() - t0
            if closing:
                self.conn.close()
                self.conn = None
            return took, outcome_of(status, data)
        raise RuntimeError("unreachable")

    def chunk(self, n, count=True):
        # A fresh connection per chunk, opened outside the timed part: the
        # daemon closes a connection idle past server.header_read_timeout_ms.
        self.connect()
        pid = self.daemon.pid
        t0, n0 = cpu_ticks(pid), cpu_ns(pid)
        lat = []
        outs = {}
        for _ in range(n):
            took, outcome = self.one()
            lat.append(took)
            outs[outcome] = outs.get(outcome, 0) + 1
        t1, n1 = cpu_ticks(pid), cpu_ns(pid)
        if not count:
            return outs
        self.latencies.extend(lat)
        for k, v in outs.items():
            self.outcomes[k] = self.outcomes.get(k, 0) + v
        self.ticks += t1 - t0
        if n0 is None or n1 is None or self.ns is None:
            self.ns = None
        else:
            self.ns += max(0, n1 - n0)
        self.counted += n
        return outs

    def figures(self):
        lat = self.latencies
        return {
            "creates": self.counted,
            "outcomes": self.outcomes,
            "p50_ms": pct(lat, 50) * 1000 if lat else None,
            "p90_ms": pct(lat, 90) * 1000 if lat else None,
            "p99_ms": pct(lat, 99) * 1000 if lat else None,
            "mean_ms": statistics.mean(lat) * 1000 if lat else None,
            "cpu_us_per_request": (self.ticks / CLK_TCK * 1e6 / self.counted
                                   if self.counted else None),
            "cpu_us_per_request_schedstat": (self.ns / 1000.0 / self.counted
                                             if self.counted and self.ns is not None
                                             else None),
            "cpu_ticks": self.ticks,
            "token_bytes": len(self.token) if self.token else 0,
        }


class Scraper:
    """Reads a daemon's /metrics every `every` seconds on a thread of its
    own until stopped; counts the scrapes and their bytes."""

    def __init__(self, port, every):
        import threading
        self.port, self.every = port, every
        self.scrapes, self.bytes, self.failures = 0, 0, 0
        self.stop_flag = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop_flag.wait(self.every):
            try:
                with socket.create_connection((HOST, self.port), timeout=10) as s:
                    s.sendall("GET /metrics HTTP/1.1\r\nHost: {}:{}\r\nAccept: "
                              "application/openmetrics-text;version=1.0.0\r\n"
                              "Connection: close\r\n\r\n".format(HOST, self.port).encode())
                    data = b""
                    while True:
                        chunk = s.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                if not data.startswith(b"HTTP/1.1 200"):
                    self.failures += 1
                    continue
                self.scrapes += 1
                self.bytes += len(data)
            except OSError:
                self.failures += 1

    def stop(self):
        self.stop_flag.set()
        self.thread.join()


def auth_config(mode):
    """([auth] configuration text, {file name: (content, mode)}) of a mode."""
    if mode in ("none", "scraped"):
        return "", {}
    if mode == "static":
        return ('[auth]\nlocal_owner = "never"\ntokens_file = "{tokens.toml}"\n'), None
    alg = {"jwt-eddsa": "EdDSA", "jwt-es256": "ES256", "jwt-rs256": "RS256"}[mode]
    text = ('[auth]\nlocal_owner = "never"\nresource = "{}"\n\n[[auth.jwt]]\n'
            'issuer = "{}"\njwks_file = "{{jwks.json}}"\nalgorithms = ["{}"]\n'
            'tenant_claim = "tid"\n').format(RESOURCE, ISSUER, alg)
    return text, alg


def one_run(opts, run_index, modes, report):
    root = tempfile.mkdtemp(prefix="taskgate-auth-cost-")
    os.chmod(root, 0o700)
    if os.geteuid() == 0:
        user = pwd.getpwnam(opts.user)
        os.chown(root, user.pw_uid, user.pw_gid)
    running = []
    try:
        keydir = os.path.join(root, "keys")
        os.mkdir(keydir, 0o700)
        for name in modes:
            text, extra = auth_config(name)
            files = {}
            if name in ("none", "scraped"):
                token = None
            elif name == "static":
                token = static_secret()
                files["tokens.toml"] = (tokens_file(token), 0o600)
            else:
                issuer = Issuer(keydir, extra)
                files["jwks.json"] = (issuer.jwks, 0o644)
                token = issuer.token("auth-cost@bench")
            running.append(Mode(name, Daemon(opts, name, root, text, files), token))
        for m in running:
            if m.name in ("none", "scraped"):
                continue
            # A create without the token must be refused, or the mode
            # would not be measuring authentication at all.
            c = Conn(m.daemon.port)
            try:
                head, body = create_request(m.daemon.port, None, 0)
                status, _, _ = c.post(head, body)
            finally:
                c.close()
            if status != 401:
                raise RuntimeError("the {} daemon answered a create without a token with {}, "
                                   "not 401".format(m.name, status))
        load_before = loadavg()
        for m in running:
            outs = m.chunk(opts.warmup, count=False)
            if opts.warmup and set(outs) != {"task"}:
                raise RuntimeError("the {} daemon did not answer creates with tasks: {}\n{}"
                                   .format(m.name, outs, m.daemon.log_tail()))
        scrapers = {m.name: Scraper(m.daemon.port, opts.scrape_every)
                    for m in running if m.name == "scraped"}
        rounds = -(-opts.creates // opts.chunk)
        started = time.monotonic()
        for r in range(rounds):
            n = min(opts.chunk, opts.creates - r * opts.chunk)
            k = r % len(running)
            for m in running[k:] + running[:k]:
                m.chunk(n)
        elapsed = time.monotonic() - started
        load_after = loadavg()
        for sc in scrapers.values():
            sc.stop()
        figures = {m.name: m.figures() for m in running}
        for name, sc in scrapers.items():
            if sc.failures or not sc.scrapes:
                raise RuntimeError("the scraper of {} read {} scrapes and failed {} times"
                                   .format(name, sc.scrapes, sc.failures))
            figures[name]["scrapes"] = sc.scrapes
            figures[name]["scrape_bytes_mean"] = sc.bytes // sc.scrapes
        for m in running:
            if m.conn is not None:
                m.conn.close()
        exits = {m.name: m.daemon.stop() for m in running}
        base = figures.get("none")
        for name, f in figures.items():
            if base is None:
                continue
            for key in ("p50_ms", "p90_ms", "p99_ms", "cpu_us_per_request",
                        "cpu_us_per_request_schedstat"):
                f[key.replace("_ms", "").replace("_us_per_request", "") + "_ratio"] = \
                    ratio(f[key], base[key])
            for key in ("cpu_us_per_request", "cpu_us_per_request_schedstat"):
                f[key.replace("cpu_us_per_request", "extra_cpu_us")] = (
                    None if f[key] is None or base[key] is None else f[key] - base[key])
        result = {"run": run_index, "rounds": rounds, "seconds": round(elapsed, 1),
                  "loadavg_before": load_before, "loadavg_after": load_after,
                  "daemon_exits": exits, "modes": figures}
        report.append(result)
        return result
    finally:
        for m in running:
            if m.daemon.proc.poll() is None:
                m.daemon.stop()
        if opts.keep:
            print("auth-cost: kept " + root, file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------- report

COLUMNS = [
    ("p50 ms", "p50_ms", 3), ("p90 ms", "p90_ms", 3), ("p99 ms", "p99_ms", 3),
    ("CPU µs/req", "cpu_us_per_request", 0), ("CPU µs/req (schedstat)",
                                              "cpu_us_per_request_schedstat", 0),
    ("p50 ×", "p50_ratio", 3), ("p99 ×", "p99_ratio", 3), ("CPU ×", "cpu_ratio", 3),
    ("CPU × (schedstat)", "cpu_schedstat_ratio", 3),
    ("extra CPU µs (schedstat)", "extra_cpu_us_schedstat", 0),
]


def table(per_mode, modes):
    lines = ["| mode | " + " | ".join(c[0] for c in COLUMNS) + " |",
             "|---|" + "---|" * len(COLUMNS)]
    for name in modes:
        f = per_mode.get(name)
        if f is None:
            continue
        lines.append("| {} | {} |".format(
            name, " | ".join(fmt(f.get(key), d) for (_, key, d) in COLUMNS)))
    return "\n".join(lines)


def medians(runs, modes):
    out = {}
    for name in modes:
        rows = [r["modes"][name] for r in runs if name in r["modes"]]
        if not rows:
            continue
        out[name] = {key: median_or_none([row.get(key) for row in rows])
                     for (_, key, _) in COLUMNS}
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(here, "..", "target", "release", "taskgate"),
                    help="the taskgate binary to start (default: target/release/taskgate)")
    ap.add_argument("--creates", type=int, default=2000,
                    help="durable creates per mode and run (2000)")
    ap.add_argument("--chunk", type=int, default=200,
                    help="creates per mode in each round before the next mode's turn (200)")
    ap.add_argument("--warmup", type=int, default=50,
                    help="uncounted creates per mode before the first round (50)")
    ap.add_argument("--runs", type=int, default=1,
                    help="repeat the whole measurement with fresh daemons; the table gives "
                         "medians across runs (1)")
    ap.add_argument("--modes", default=",".join(MODES),
                    help="comma-separated subset of: " + ", ".join(MODES) + " (all)")
    ap.add_argument("--scrape-every", type=float, default=1.0,
                    help="seconds between scrapes of /metrics in the scraped mode (1)")
    ap.add_argument("--json", metavar="FILE",
                    help="where to write every figure (default ./auth-cost-<UTC time>.json)")
    ap.add_argument("--user", default="nobody",
                    help="run as root, the daemons run as this user (default: nobody)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the temporary directory (configurations, logs, keys)")
    opts = ap.parse_args()
    opts.binary = os.path.abspath(opts.binary)
    if not os.access(opts.binary, os.X_OK):
        ap.error("{} is not an executable; build it (cargo build --release) or name one "
                 "with --binary".format(opts.binary))
    if opts.creates < 1 or opts.chunk < 1 or opts.warmup < 0 or opts.runs < 1:
        ap.error("--creates, --chunk and --runs must be positive, --warmup not negative")
    modes = [m.strip() for m in opts.modes.split(",") if m.strip()]
    for m in modes:
        if m not in MODES:
            ap.error("unknown mode {!r}; modes are {}".format(m, ", ".join(MODES)))
    if os.geteuid() == 0:
        try:
            if pwd.getpwnam(opts.user).pw_uid == 0:
                ap.error("--user must not be root")
        except KeyError:
            ap.error("no user {!r} (--user)".format(opts.user))
    skipped = []
    if any(m.startswith("jwt-") for m in modes) and shutil.which("openssl") is None:
        skipped = [m for m in modes if m.startswith("jwt-")]
        modes = [m for m in modes if not m.startswith("jwt-")]
        print("auth-cost: no openssl command, so no JWTs can be signed: skipping {}".format(
            ", ".join(skipped)), file=sys.stderr)

    def stopped(signum, _frame):
        # Unwinds through one_run's `finally`, which stops the daemons and
        # removes the temporary directory.
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stopped)
    version = subprocess.run([opts.binary, "--version"], capture_output=True,
                             text=True).stdout.strip()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out_path = opts.json or "auth-cost-{}.json".format(stamp)
    print("auth-cost: {} ({}); modes {}; {} creates per mode in rounds of {}, {} run(s); "
          "{} CPUs, load average {}".format(
              opts.binary, version or "version unknown", ", ".join(modes), opts.creates,
              opts.chunk, opts.runs, os.cpu_count(), loadavg()), flush=True)
    runs = []
    for i in range(opts.runs):
        try:
            r = one_run(opts, i + 1, modes, runs)
        except (RuntimeError, subprocess.CalledProcessError) as e:
            print("auth-cost: run {}: {}".format(i + 1, e), file=sys.stderr)
            return 1
        odd = {n: f["outcomes"] for n, f in r["modes"].items()
               if set(f["outcomes"]) != {"task"}}
        print("\nrun {} ({} rounds, {} s; load average before {}, after {}){}".format(
            r["run"], r["rounds"], r["seconds"], r["loadavg_before"], r["loadavg_after"],
            "; NOT every create was a task: {}".format(odd) if odd else ""), flush=True)
        print(table(r["modes"], modes), flush=True)
    summary = medians(runs, modes)
    if opts.runs > 1:
        print("\nmedians across {} runs".format(opts.runs))
        print(table(summary, modes))
    doc = {
        "binary": opts.binary,
        "version": version,
        "time": stamp,
        "host": {"cpus": os.cpu_count(), "kernel": platform.release(),
                 "python": platform.python_version(), "clock_ticks_per_s": CLK_TCK},
        "options": {"creates": opts.creates, "chunk": opts.chunk, "warmup": opts.warmup,
                    "runs": opts.runs, "modes": modes, "skipped": skipped},
        "runs": runs,
        "medians": summary,
    }
    with open(out_path, "w") as f:
        json.dump(doc, f, indent=2)
    print("\nauth-cost: figures written to {}".format(out_path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
