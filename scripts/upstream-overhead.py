#!/usr/bin/env python3
"""What a synchronous call through taskgate adds to calling an upstream MCP
server directly: latency (median and p90 of sequential calls, each path on
one keep-alive connection) and the daemon's CPU per call.

    scripts/upstream-overhead.py --upstream http://127.0.0.1:PORT/mcp \\
        --taskgate http://127.0.0.1:8765/mcp --tool ALIAS.TOOL --pid DAEMON_PID \\
        [--upstream-pid PID] [--calls 500] [--args '{}']

The upstream must answer a 2025-11-25 `tools/call` without a session (the
stdlib server tests/interop/upstream_hostile.py does, in any mode but the
misbehaving ones); taskgate is called with protocol 2026-07-28 and no Tasks
extension, so the call is forwarded synchronously. Each path is warmed up
first. Prints one JSON object. Loopback only; a figure, never a pass/fail.
"""

import argparse
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


class Path:
    def __init__(self, url, modern):
        u = urllib.parse.urlsplit(url)
        if u.hostname not in ("127.0.0.1", "::1", "localhost"):
            raise SystemExit(f"{url}: loopback only")
        self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        self.path = u.path or "/mcp"
        self.modern = modern
        self.next_id = 0

    def call(self, tool, args):
        self.next_id += 1
        params = {"name": tool, "arguments": args}
        headers = {
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
        }
        if self.modern:
            params["_meta"] = {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/clientInfo": {"name": "overhead", "version": "1"},
            }
            headers.update({
                "mcp-protocol-version": "2026-07-28",
                "mcp-method": "tools/call",
                "mcp-name": tool,
            })
        else:
            headers["mcp-protocol-version"] = "2025-11-25"
        body = json.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": "tools/call",
                           "params": params})
        start = time.perf_counter()
        self.conn.request("POST", self.path, body, headers)
        resp = self.conn.getresponse()
        text = resp.read()
        took = time.perf_counter() - start
        if resp.status != 200 or b'"error"' in text[:200]:
            raise SystemExit(f"call failed: HTTP {resp.status}: {text[:300]!r}")
        return took


def run(path, tool, args, calls):
    for _ in range(min(50, calls)):
        path.call(tool, args)
    return [path.call(tool, args) for _ in range(calls)]


def summary(samples):
    s = sorted(samples)
    return {
        "median_ms": round(statistics.median(s) * 1000, 3),
        "p90_ms": round(s[int(len(s) * 0.9) - 1] * 1000, 3),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--upstream", required=True)
    p.add_argument("--taskgate", required=True)
    p.add_argument("--tool", required=True, help="ALIAS.TOOL as taskgate serves it")
    p.add_argument("--pid", type=int, required=True, help="the daemon's pid")
    p.add_argument("--upstream-pid", type=int, help="the upstream's pid, for its CPU")
    p.add_argument("--calls", type=int, default=500)
    p.add_argument("--args", default="{}")
    a = p.parse_args()
    args = json.loads(a.args)
    remote = a.tool.split(".", 1)[1]

    up_cpu0 = cpu_seconds(a.upstream_pid) if a.upstream_pid else None
    direct = run(Path(a.upstream, modern=False), remote, args, a.calls)
    up_cpu_direct = cpu_seconds(a.upstream_pid) - up_cpu0 if a.upstream_pid else None

    cpu0 = cpu_seconds(a.pid)
    t0 = time.perf_counter()
    via = run(Path(a.taskgate, modern=True), a.tool, args, a.calls)
    wall = time.perf_counter() - t0
    daemon_cpu = cpu_seconds(a.pid) - cpu0

    d, v = summary(direct), summary(via)
    out = {
        "calls": a.calls,
        "direct": d,
        "through_taskgate": v,
        "added_median_ms": round(v["median_ms"] - d["median_ms"], 3),
        "latency_ratio": round(v["median_ms"] / d["median_ms"], 2),
        # Includes the warm-up calls, as /proc counts them.
        "daemon_cpu_ms_per_call": round(daemon_cpu * 1000 / (a.calls + min(50, a.calls)), 3),
        "daemon_cpu_share_of_wall": round(daemon_cpu / wall, 3),
    }
    if up_cpu_direct is not None:
        per_call = up_cpu_direct * 1000 / (a.calls + min(50, a.calls))
        out["upstream_cpu_ms_per_direct_call"] = round(per_call, 3)
        if per_call > 0:
            out["daemon_cpu_ratio_to_upstream"] = round(out["daemon_cpu_ms_per_call"] / per_call, 2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
