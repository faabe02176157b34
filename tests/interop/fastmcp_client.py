"""An independent MCP client against taskgate: FastMCP 4.1.4 with
fastmcp-tasks, unpatched. It calls one tool as a task and lets the library
drive the task to its end, polling the way it always does (from 20 ms,
backing off to the server's pollIntervalMs). It knows none of taskgate's
error codes.

    python fastmcp_client.py http URL TOOL SECONDS
    python fastmcp_client.py stdio TASKGATE CONFIG STATE_DIR TOOL SECONDS

Prints one JSON line: the task id, its result text, how many tasks/get the
library sent, and the seconds it took; over stdio also what the daemon it
started reports of itself (`taskgate status --json`), asked once the result
is in and before the session, and with it the daemon, ends. Exits non-zero
on any error.
"""

import asyncio
import json
import subprocess
import sys
import time

from fastmcp import Client
from fastmcp.client.transports import StdioTransport
import fastmcp_tasks.client as tasks_client
from fastmcp_tasks.client import call_tool_task

polls = 0
_send_get = tasks_client._send_get


async def counting_send_get(*args, **kwargs):
    global polls
    polls += 1
    return await _send_get(*args, **kwargs)


tasks_client._send_get = counting_send_get


async def main() -> None:
    if sys.argv[1] == "http":
        target, tool, seconds = sys.argv[2], sys.argv[3], float(sys.argv[4])
    else:
        taskgate, config, state, tool, seconds = sys.argv[2:7]
        seconds = float(seconds)
        target = StdioTransport(
            taskgate,
            ["serve", "--stdio", "--config", config, "--state-dir", state],
            keep_alive=False,
        )
    async with Client(target) as client:
        started = time.monotonic()
        task = await call_tool_task(client, tool, {"seconds": seconds})
        result = await task.result()
        elapsed = time.monotonic() - started
        text = "".join(getattr(c, "text", "") for c in result.content)
        status = None
        if sys.argv[1] == "stdio":
            status = json.loads(subprocess.run(
                [taskgate, "status", "--json", "--state-dir", state],
                capture_output=True, check=True, text=True,
            ).stdout)
        print(json.dumps({
            "taskId": task.task_id,
            "text": text,
            "isError": bool(getattr(result, "is_error", False)),
            "polls": polls,
            "seconds": round(elapsed, 3),
            "status": status,
        }))


asyncio.run(main())
