"""An upstream MCP server written with FastMCP (the `fastmcp` package that
fastmcp-tasks 4.1.4 installs), for taskgate to connect to as a client.

    python upstream_fastmcp.py stdio
    python upstream_fastmcp.py http PORT

It speaks both lifecycles: the 2026-07-28 one (`server/discover`, then
requests carrying their own _meta, no session) and the legacy `initialize`
one (2025-11-25 and older).

Over HTTP it serves streamable HTTP at http://127.0.0.1:PORT/mcp. A legacy
client gets a stateful session (an Mcp-Session-Id handed out on
initialize) and SSE streams for its POSTs, and must accept both
application/json and text/event-stream; a 2026-07-28 request gets
application/json, must carry an Mcp-Method header matching its method, and
is cancelled by closing its connection. With PORT 0 it picks a free port.
In both HTTP cases it prints `LISTENING <port>` on one stdout line once it
accepts connections. Over stdio nothing but MCP goes to stdout.

Tools:
  echo(text)             returns text
  slow(seconds, marker)  appends "started <pid>" to the file marker, sleeps,
                         appends "finished" and returns "slept"; when the
                         call is cancelled it appends "cancelled" instead
  fail(message)          a tool error (isError true) whose text is message
  big(bytes)             a string of that many 'x'

With UPSTREAM_HEADER_LOG set (HTTP only), every HTTP request's method,
path and headers (names lower-cased) are appended to that file, one JSON
object a line: {"method": ..., "path": ..., "headers": {...}}.
"""

import asyncio
import json
import os
import socket
import sys

# No update check against PyPI (FastMCP makes one only with its banner,
# which this server never shows).
os.environ.setdefault("FASTMCP_CHECK_FOR_UPDATES", "off")

from fastmcp import FastMCP  # noqa: E402 - after the environment is set
from fastmcp.exceptions import ToolError  # noqa: E402

mcp = FastMCP("upstream-fastmcp")


def _append(path: str, line: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()


@mcp.tool
def echo(text: str) -> str:
    """Returns the text."""
    return text


@mcp.tool
async def slow(seconds: float, marker: str) -> str:
    """Sleeps for the given seconds, recording its progress in the marker file."""
    _append(marker, f"started {os.getpid()}\n")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        # notifications/cancelled cancels the task running the tool.
        _append(marker, "cancelled\n")
        raise
    _append(marker, "finished\n")
    return "slept"


@mcp.tool
def fail(message: str) -> str:
    """Fails with the message as a tool error."""
    raise ToolError(message)


@mcp.tool
def big(bytes: int) -> str:
    """Returns a string of that many 'x'."""
    return "x" * bytes


class HeaderLog:
    """ASGI middleware: logs each HTTP request's headers; prints the
    LISTENING line when the application has started."""

    def __init__(self, app, log_path=None, port=None):
        self.app = app
        self.log_path = log_path
        self.port = port

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.log_path:
            headers = {}
            for name, value in scope.get("headers", []):
                key = name.decode("latin-1").lower()
                value = value.decode("latin-1")
                headers[key] = f"{headers[key]}, {value}" if key in headers else value
            _append(self.log_path, json.dumps({
                "method": scope.get("method"),
                "path": scope.get("path"),
                "headers": headers,
            }) + "\n")
        if scope["type"] == "lifespan" and self.port is not None:
            port = self.port

            async def announcing_send(message):
                await send(message)
                if message.get("type") == "lifespan.startup.complete":
                    # The socket is bound and listening before startup.
                    print(f"LISTENING {port}", flush=True)

            return await self.app(scope, receive, announcing_send)
        return await self.app(scope, receive, send)


def main() -> None:
    args = sys.argv[1:]
    if args == ["stdio"]:
        mcp.run(transport="stdio", show_banner=False, log_level="WARNING")
        return
    if len(args) != 2 or args[0] != "http":
        sys.exit("usage: upstream_fastmcp.py stdio | http PORT")
    from starlette.middleware import Middleware

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", int(args[1])))
    sock.listen(128)
    port = sock.getsockname()[1]
    middleware = [Middleware(HeaderLog, log_path=os.environ.get("UPSTREAM_HEADER_LOG"), port=port)]
    asyncio.run(mcp.run_http_async(
        show_banner=False,
        transport="http",
        host="127.0.0.1",
        port=port,
        path="/mcp",
        log_level="WARNING",
        middleware=middleware,
        sockets=[sock],
    ))


if __name__ == "__main__":
    main()
