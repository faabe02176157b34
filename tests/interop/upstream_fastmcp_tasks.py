"""A durable-route provider written with FastMCP and fastmcp-tasks 4.1.4
(PyPI), unpatched, for taskgate to route submissions to.

    python upstream_fastmcp_tasks.py stdio

It negotiates 2026-07-28 (`server/discover`) and advertises the
`io.modelcontextprotocol/tasks` extension through fastmcp-tasks'
`TasksExtension` (an in-memory Docket backend, one process). Its one tool,
`work(value)`, runs only as a task and returns "done <value>".

A durable-route provider must echo the request's
`_meta["dev.taskgate/taskExecution"]` object unchanged in the `_meta` of
the CreateTaskResult it answers with. fastmcp-tasks builds that result
before the tool body runs (the body runs later, in a Docket worker) and
gives it no `_meta` (fastmcp_tasks/models.py, creation.py), so the tool body
cannot do it. FastMCP's documented middleware can: `on_call_tool` wraps the
extensions' tools/call interceptors (fastmcp/server/server.py, call_tool),
so it sees the CreateTaskResult the tasks extension made, reads the request
`_meta` from the public `Context.request_context.meta`, and returns the
result with the envelope in its `_meta`. The MCP SDK's runner dumps that
model by alias and keeps a handler's `_meta` (adding only its serverInfo
stamp). Nothing of the SDKs is patched.

With UPSTREAM_FASTMCP_TASKS_ECHO=0 the middleware only logs and echoes
nothing: the server is then fastmcp-tasks as it comes.

With UPSTREAM_TASKS_MESSAGE_LOG set, every tools/call that reaches the
server is appended to that file as {"method": "tools/call", "name": ...,
"envelope": ...}, one JSON object a line; with UPSTREAM_TASKS_EFFECT_LOG
set, every run of the tool body appends {"value": ...}. Over stdio nothing
but MCP goes to stdout.
"""

import json
import os
import sys
from typing import Any

# No update check against PyPI (FastMCP makes one only with its banner,
# which this server never shows).
os.environ.setdefault("FASTMCP_CHECK_FOR_UPDATES", "off")

from fastmcp import FastMCP  # noqa: E402 - after the environment is set
from fastmcp.server.middleware import Middleware  # noqa: E402
from fastmcp.utilities.tasks import TaskConfig  # noqa: E402
from fastmcp_tasks import TasksExtension  # noqa: E402
from fastmcp_tasks.models import CreateTaskResult  # noqa: E402
from pydantic import Field  # noqa: E402

EXECUTION_META_KEY = "dev.taskgate/taskExecution"


def _log(env: str, record: dict[str, Any]) -> None:
    path = os.environ.get(env)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()


class EchoingCreateTaskResult(CreateTaskResult):
    """fastmcp-tasks' CreateTaskResult with the `_meta` it leaves out."""

    meta: dict[str, Any] | None = Field(default=None, serialization_alias="_meta")


class EchoExecutionEnvelope(Middleware):
    """Echoes the request's execution envelope on the task it created."""

    async def on_call_tool(self, context, call_next):
        request = context.fastmcp_context.request_context
        meta = (request.meta if request is not None else None) or {}
        envelope = meta.get(EXECUTION_META_KEY)
        _log("UPSTREAM_TASKS_MESSAGE_LOG", {
            "method": "tools/call",
            "name": context.message.name,
            "envelope": envelope,
        })
        result = await call_next(context)
        echo = os.environ.get("UPSTREAM_FASTMCP_TASKS_ECHO", "1") != "0"
        if echo and envelope is not None and isinstance(result, CreateTaskResult):
            return EchoingCreateTaskResult(
                **result.model_dump(), meta={EXECUTION_META_KEY: envelope}
            )
        return result


mcp = FastMCP("upstream-fastmcp-tasks", middleware=[EchoExecutionEnvelope()])
mcp.add_extension(TasksExtension(url="memory://"))


@mcp.tool(task=TaskConfig(mode="required"))
async def work(value: str) -> str:
    """Does the work on value, as a task."""
    _log("UPSTREAM_TASKS_EFFECT_LOG", {"value": value})
    return f"done {value}"


def main() -> None:
    if sys.argv[1:] != ["stdio"]:
        sys.exit("usage: upstream_fastmcp_tasks.py stdio")
    mcp.run(transport="stdio", show_banner=False, log_level="WARNING")


if __name__ == "__main__":
    main()
