#!/usr/bin/env python3
"""What a durable submission costs against an ordinary call of the same
upstream tool through taskgate: latency (median and p90 of sequential
requests on one keep-alive connection) and the daemon's CPU per request.

    scripts/route-cost.py --taskgate http://127.0.0.1:8765/mcp \\
        --capability ALIAS.TOOL --pid DAEMON_PID [--calls 300] [--args '{}']

The capability must be routable (pinned; its upstream negotiated
2026-07-28 and advertises Tasks) and answer an ordinary call without a
task. The ordinary path is `tools/call ALIAS.TOOL` on protocol 2026-07-28
without the Tasks extension (forwarded synchronously); the durable path is
`taskgate_submit` with a new idempotency key each time, under one lease
(taken once), answered once the upstream created its task. Each path is
warmed up first. Prints one JSON object. Loopback only; a figure, never a
pass/fail.
"""

import argparse
import hashlib
import http.client
import json
import os
import statistics
import time
import urllib.parse

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def canonical(value):
    # RFC 8785 for inputs without floats.
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


class Taskgate:
    def __init__(self, url):
        u = urllib.parse.urlsplit(url)
        if u.hostname not in ("127.0.0.1", "::1", "localhost"):
            raise SystemExit(f"{url}: loopback only")
        self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
        self.path = u.path or "/mcp"
        self.next_id = 0

    def request(self, method, params, name, tasks):
        self.next_id += 1
        caps = {"extensions": {"io.modelcontextprotocol/tasks": {}}} if tasks else {}
        params = dict(params)
        params["_meta"] = {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": caps,
            "io.modelcontextprotocol/clientInfo": {"name": "route-cost", "version": "1"},
        }
        headers = {
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
            "mcp-protocol-version": "2026-07-28",
            "mcp-method": method,
            "mcp-name": name,
        }
        body = json.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": method,
                           "params": params})
        start = time.perf_counter()
        self.conn.request("POST", self.path, body, headers)
        resp = self.conn.getresponse()
        text = resp.read()
        took = time.perf_counter() - start
        answer = json.loads(text) if text.startswith(b"{") else None
        if resp.status != 200 or answer is None or "error" in answer:
            raise SystemExit(f"{method} failed: HTTP {resp.status}: {text[:400]!r}")
        return took, answer["result"]

    def call(self, tool, args, tasks=False):
        return self.request("tools/call", {"name": tool, "arguments": args}, tool, tasks)


def summary(samples):
    s = sorted(samples)
    return {
        "median_ms": round(statistics.median(s) * 1000, 3),
        "p90_ms": round(s[int(len(s) * 0.9) - 1] * 1000, 3),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--taskgate", required=True)
    p.add_argument("--capability", required=True, help="ALIAS.TOOL")
    p.add_argument("--pid", type=int, required=True, help="the daemon's pid")
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--args", default="{}")
    a = p.parse_args()
    args = json.loads(a.args)
    tg = Taskgate(a.taskgate)
    warm = min(30, a.calls)

    cpu0 = cpu_seconds(a.pid)
    ordinary = [tg.call(a.capability, args)[0] for _ in range(warm + a.calls)][warm:]
    ordinary_cpu = cpu_seconds(a.pid) - cpu0

    _, described = tg.call("taskgate_describe", {})
    cap = next(c for c in described["structuredContent"]["capabilities"]
               if c["name"] == a.capability)
    _, leased = tg.call("taskgate_lease", {
        "capabilities": [a.capability],
        "effects": sorted({cap["effect"], "non_idempotent_write"}),
        "ttlMs": 3_600_000,
    })
    lease = leased["structuredContent"]
    digest = hashlib.sha256(canonical(args)).hexdigest()
    run = os.urandom(4).hex()

    def submit(i):
        now = int(time.time() * 1000)
        submission = {
            "schema": "taskgate.task-submission/1",
            "leaseId": lease["leaseId"],
            "capability": a.capability,
            "logicalTaskId": f"cost-{run}-{i}",
            "attempt": 1,
            "correlationId": f"cost-{run}-{i}",
            "idempotencyKey": f"cost-{run}-{i}",
            "inputDigest": digest,
            "acceptancePolicyDigest": "0" * 64,
            "artifactScopeDigest": "0" * 64,
            "providerInterfaceVersion": cap["schemaDigest"],
            "deadlineUnixMs": now + 600_000,
            "retentionMs": 3_600_000,
            "limits": {"runtimeMs": 30_000, "artifactBytes": 0, "outputBytes": 65_536},
            "permittedEffect": "non_idempotent_write",
            "cleanupRequired": True,
        }
        took, handle = tg.call("taskgate_submit",
                               {"submission": submission, "arguments": args}, tasks=True)
        if not handle.get("taskId", "").startswith("tgr-"):
            raise SystemExit(f"not a route: {handle}")
        return took

    cpu0 = cpu_seconds(a.pid)
    durable = [submit(i) for i in range(warm + a.calls)][warm:]
    durable_cpu = cpu_seconds(a.pid) - cpu0

    o, d = summary(ordinary), summary(durable)
    per = warm + a.calls
    out = {
        "calls": a.calls,
        "ordinary_call": o,
        "durable_submit": d,
        "latency_ratio": round(d["median_ms"] / o["median_ms"], 2),
        "daemon_cpu_ms_per_ordinary_call": round(ordinary_cpu * 1000 / per, 3),
        "daemon_cpu_ms_per_durable_submit": round(durable_cpu * 1000 / per, 3),
    }
    if ordinary_cpu > 0:
        out["daemon_cpu_ratio"] = round(durable_cpu / ordinary_cpu, 2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
