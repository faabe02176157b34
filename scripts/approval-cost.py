#!/usr/bin/env python3
"""What an approval-held call costs against an ordinary call of the same
command: latency (median and p90 of sequential requests on one keep-alive
connection) and the daemon's CPU per request, for three paths:

  ordinary   tools/call of a tool without approval (it runs);
  held       the first call of an approval-required tool with new
             arguments (a proposal journaled and synced; nothing runs);
  held_task  the same from a request that negotiated Tasks (the proposal
             journaled, then its approval-status task committed);
  reissue    the identical call again once approved (the approval spent,
             journaled and synced, then the tool runs).

    scripts/approval-cost.py --taskgate http://127.0.0.1:8765/mcp \\
        --pid DAEMON_PID --state-dir DIR [--bin taskgate] [--calls 200] \\
        [--ordinary echo] [--held guarded]

Both tools must take {"text": string} and run the same command; the held
one has approval = "required". Approvals are given with `taskgate approvals
approve` between the held and the re-issue rounds (not measured). Each path
is warmed up first. Prints one JSON object. Loopback only; a figure, never
a pass/fail.
"""

import argparse
import http.client
import json
import os
import statistics
import subprocess
import time
import urllib.parse

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


class Taskgate:
    def __init__(self, url):
        u = urllib.parse.urlsplit(url)
        if u.hostname not in ("127.0.0.1", "::1", "localhost"):
            raise SystemExit(f"{url}: loopback only")
        self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
        self.path = u.path or "/mcp"
        self.next_id = 0

    def call(self, tool, args, tasks=False):
        self.next_id += 1
        caps = {"extensions": {"io.modelcontextprotocol/tasks": {}}} if tasks else {}
        params = {
            "name": tool,
            "arguments": args,
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": caps,
                "io.modelcontextprotocol/clientInfo": {"name": "approval-cost", "version": "1"},
            },
        }
        headers = {
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
            "mcp-protocol-version": "2026-07-28",
            "mcp-method": "tools/call",
            "mcp-name": tool,
        }
        body = json.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": "tools/call",
                           "params": params})
        start = time.perf_counter()
        self.conn.request("POST", self.path, body, headers)
        resp = self.conn.getresponse()
        text = resp.read()
        took = time.perf_counter() - start
        answer = json.loads(text) if text.startswith(b"{") else None
        if resp.status != 200 or answer is None or "error" in answer:
            raise SystemExit(f"tools/call {tool} failed: HTTP {resp.status}: {text[:400]!r}")
        return took, answer["result"]


def summary(samples):
    s = sorted(samples)
    return {
        "median_ms": round(statistics.median(s) * 1000, 3),
        "p90_ms": round(s[int(len(s) * 0.9) - 1] * 1000, 3),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--taskgate", required=True)
    p.add_argument("--pid", type=int, required=True, help="the daemon's pid")
    p.add_argument("--state-dir", required=True, help="for `taskgate approvals`")
    p.add_argument("--bin", default="taskgate")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--ordinary", default="echo")
    p.add_argument("--held", default="guarded")
    a = p.parse_args()
    tg = Taskgate(a.taskgate)
    warm = min(20, a.calls)
    n = warm + a.calls
    run = os.urandom(4).hex()

    def measured(f):
        cpu0 = cpu_seconds(a.pid)
        samples = [f(i) for i in range(n)]
        return samples[warm:], cpu_seconds(a.pid) - cpu0

    ordinary, ordinary_cpu = measured(lambda i: tg.call(a.ordinary, {"text": f"o-{run}-{i}"})[0])

    proposals = []

    def hold(i):
        took, result = tg.call(a.held, {"text": f"h-{run}-{i}"})
        sc = result.get("structuredContent") or {}
        if sc.get("status") != "approval_required":
            raise SystemExit(f"not held: {result}")
        proposals.append(sc["proposal"])
        return took

    held, held_cpu = measured(hold)

    def hold_task(i):
        took, result = tg.call(a.held, {"text": f"t-{run}-{i}"}, tasks=True)
        if result.get("resultType") != "task":
            raise SystemExit(f"no approval task: {result}")
        return took

    held_task, held_task_cpu = measured(hold_task)
    for pid in proposals:
        subprocess.run([a.bin, "approvals", "approve", pid, "--state-dir", a.state_dir],
                       check=True, stdout=subprocess.DEVNULL)

    def reissue(i):
        took, result = tg.call(a.held, {"text": f"h-{run}-{i}"})
        if result.get("isError"):
            raise SystemExit(f"the approved re-issue did not run: {result}")
        return took

    reissued, reissue_cpu = measured(reissue)
    o, h, r = summary(ordinary), summary(held), summary(reissued)
    ht = summary(held_task)
    out = {
        "calls": a.calls,
        "ordinary_call": o,
        "held_call": h,
        "held_task": ht,
        "approved_reissue": r,
        "held_latency_ratio": round(h["median_ms"] / o["median_ms"], 2),
        "reissue_latency_ratio": round(r["median_ms"] / o["median_ms"], 2),
        "daemon_cpu_ms_per_ordinary_call": round(ordinary_cpu * 1000 / n, 3),
        "daemon_cpu_ms_per_held_call": round(held_cpu * 1000 / n, 3),
        "daemon_cpu_ms_per_held_task": round(held_task_cpu * 1000 / n, 3),
        "daemon_cpu_ms_per_reissue": round(reissue_cpu * 1000 / n, 3),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
