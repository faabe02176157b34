#!/usr/bin/env bash
# Installs the independent client FastMCP (fastmcp-tasks 4.1.4, from the
# PyPI registry) into target/interop-fastmcp once, and runs
# tests/interop/fastmcp_client.py with it; the arguments are the client's.
#
#   scripts/interop-fastmcp.sh http URL TOOL SECONDS
#   scripts/interop-fastmcp.sh stdio TASKGATE CONFIG STATE_DIR TOOL SECONDS
#
# Needs python3 with the venv module (Debian: python3-venv).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/target/interop-fastmcp"
version="4.1.4"
mkdir -p "$root/target"
# Two tests may start at once: one installs, the other waits for it.
exec 9>"$root/target/interop-fastmcp.lock"
flock 9
if ! "$venv/bin/python" -c "import fastmcp_tasks" 2>/dev/null; then
  echo "== installing fastmcp-tasks $version into $venv" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "fastmcp-tasks==$version" >&2
fi
export PYTHONDONTWRITEBYTECODE=1
flock -u 9
exec "$venv/bin/python" "$root/tests/interop/fastmcp_client.py" "$@"
