#!/usr/bin/env bash
# The whole test suite, as one command (the one README.md gives):
#
#   scripts/test.sh [--check] [--no-system-test] [-- CARGO_TEST_ARGS...]
#
# First it checks everything the suite needs from the machine: root (tests
# chown files to another user, mount a tmpfs in a private mount namespace,
# and the package's system test boots a container), a C compiler, strace,
# unshare, npm (the MCP conformance suite), python3-venv (the FastMCP
# client from PyPI), and for the package's system
# test lintian, debootstrap, systemd-nspawn and cargo-deb 3.8.0. As root on
# Debian it installs what is missing (apt-get, cargo install --locked);
# otherwise it stops before running anything, with one line per missing
# item and the command that installs it.
#
# Then it runs `cargo test --locked --workspace --no-fail-fast` (every test
# binary of every crate, even after one fails) and the package's system test (scripts/system-test.sh),
# and ends with a summary (scripts/test-summary.py): cargo test's result
# lines, what each test binary ran against the least it must pass
# (tests/expected-tests.txt; a binary that crashed is named and counted as
# failed), the system test's PASS/FAIL lines, the time each took and a
# closing `N passed, N failed, N skipped`. Nothing is skipped: a test that
# cannot run fails and says why; the only ignored tests are the child
# entry points listed in tests/expected-tests.txt, which their parent tests
# run in processes of their own.
#
#   --check            only check (and install) the prerequisites
#   --no-system-test   cargo test only, without the package's system test
#   -- ARGS            passed to cargo test (e.g. `-- --test fault_injection`);
#                      binaries left out are then not checked, and with
#                      anything but `--test NAME`, `--lib`, `--bins`, `--doc`
#                      neither are the minimums
#
# Logs: target/test-logs/cargo-test.log and system-test.log.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"

usage() { echo "usage: $0 [--check] [--no-system-test] [-- CARGO_TEST_ARGS...]" >&2; exit 64; }
check_only=0
system_test=1
cargo_args=()
while [ $# -gt 0 ]; do
  case $1 in
    --check) check_only=1 ;;
    --no-system-test) system_test=0 ;;
    --) shift; cargo_args=("$@"); break ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) usage ;;
  esac
  shift
done

export DEBIAN_FRONTEND=noninteractive
cargo_deb_version=3.8.0
is_root=0
[ "$(id -u)" -eq 0 ] && is_root=1
has_apt=0
command -v apt-get >/dev/null && command -v dpkg >/dev/null && has_apt=1

# ------------------------------------------------------- prerequisites --
# Each missing item: a line saying what it is for, the Debian package that
# brings it (empty when apt cannot), and the command that installs it.
missing_what=()
missing_pkg=()
missing_how=()
need() { missing_what+=("$1"); missing_pkg+=("$2"); missing_how+=("$3"); }
apt_need() { # TOOL PACKAGE WHAT
  need "$1 ($3)" "$2" "apt-get install --no-install-recommends $2"
}
have_cargo_deb() {
  # `cargo deb --version` prints e.g. "cargo-deb 3.8.0".
  command -v cargo >/dev/null && cargo deb --version 2>/dev/null | grep -qw "$cargo_deb_version"
}

check_prereqs() {
  missing_what=() missing_pkg=() missing_how=()
  command -v cargo >/dev/null \
    || need "cargo (Rust 1.89 or newer, to build everything)" "" "install a Rust toolchain with rustup"
  command -v cc >/dev/null || apt_need cc gcc "C compiler and linker: the bundled SQLite, linking"
  # The tests run strace and unshare by the absolute paths Debian uses.
  [ -x /usr/bin/strace ] || apt_need strace strace "fault injection: EIO on fsync, ENOSPC on write"
  [ -x /usr/bin/unshare ] || apt_need unshare util-linux "a private mount namespace with a small tmpfs"
  command -v ip >/dev/null || apt_need ip iproute2 "a network namespace with an address that is not loopback"
  # The tests create their unprivileged service user with useradd, and
  # probe the admin socket from a tool written in perl (perl-base).
  [ -x /usr/sbin/useradd ] || apt_need useradd passwd "a service user the daemon runs as in the confinement tests"
  [ -x /usr/bin/perl ] || apt_need perl perl-base "a tool that probes the admin socket"
  command -v groff >/dev/null || apt_need groff groff-base "rendering the man pages without a warning"
  command -v promtool >/dev/null || apt_need promtool prometheus "checks /metrics and the shipped alert rules (promtool)"
  # npm may come from elsewhere than Debian (with its own node): only ask
  # apt for it when there is none at all.
  command -v npm >/dev/null || apt_need npm npm "fetches Node 22 and the MCP conformance suite"
  # The independent FastMCP client is installed from PyPI into a venv;
  # python3 itself (which python3-venv brings) writes the summary.
  python3 -c 'import venv, ensurepip' 2>/dev/null \
    || apt_need python3-venv python3-venv "a venv for the independent FastMCP client (fastmcp-tasks from PyPI), and python3 for the summary"
  if [ "$system_test" -eq 1 ]; then
    command -v lintian >/dev/null || apt_need lintian lintian "system test: the package must be lintian-clean"
    command -v debootstrap >/dev/null || apt_need debootstrap debootstrap "system test: builds the container's Debian 12 root"
    command -v systemd-nspawn >/dev/null || apt_need systemd-nspawn systemd-container "system test: boots the container"
    command -v systemd-analyze >/dev/null || apt_need systemd-analyze systemd "system test: the unit's security score"
    command -v nsenter >/dev/null || apt_need nsenter util-linux "system test: runs commands in the container"
    command -v script >/dev/null || apt_need script bsdutils "system test: the container's console"
    command -v dpkg-deb >/dev/null || apt_need dpkg-deb dpkg "system test: reads the built package"
    have_cargo_deb \
      || need "cargo-deb $cargo_deb_version (system test: builds the package)" "" \
        "cargo install cargo-deb --locked --version $cargo_deb_version"
  fi
}

# What needs root, said before anything else when not root.
needs_root_lines() {
  echo "  tests/startup_refusals.rs, tests/backup_restore.rs: chown files to another user"
  echo "  tests/fault_injection.rs: mounts a 3 MiB tmpfs in a private mount namespace (unshare -m)"
  echo "  tests/auth_http.rs: a network namespace of its own with an address that is not loopback"
  echo "  tests/tool_confinement.rs: creates a service user (useradd) and runs the daemon as it"
  if [ "$system_test" -eq 1 ]; then
    echo "  scripts/system-test.sh: debootstrap and a booted systemd-nspawn container"
  fi
  echo "  installing what is missing (apt-get install, cargo install)"
}

print_missing() {
  local i
  for i in "${!missing_what[@]}"; do
    echo "  missing ${missing_what[$i]}: ${missing_how[$i]}"
  done
}

check_prereqs

if [ "$is_root" -eq 0 ]; then
  echo "test.sh: not running as root (uid $(id -u)); nothing was run. These need root:"
  needs_root_lines
  print_missing
  echo "run it as root: sudo scripts/test.sh"
  exit 2
fi

if [ ${#missing_what[@]} -gt 0 ] && [ "$has_apt" -eq 1 ]; then
  echo "== installing what the suite needs"
  pkgs=()
  for p in "${missing_pkg[@]}"; do
    [ -n "$p" ] && [[ " ${pkgs[*]} " != *" $p "* ]] && pkgs+=("$p")
  done
  if [ ${#pkgs[@]} -gt 0 ]; then
    echo "apt-get install ${pkgs[*]}"
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null; } \
      || echo "apt-get install ${pkgs[*]} failed"
  fi
  if [ "$system_test" -eq 1 ] && command -v cargo >/dev/null && ! have_cargo_deb; then
    echo "cargo install cargo-deb --locked --version $cargo_deb_version"
    cargo install cargo-deb --locked --version "$cargo_deb_version" --quiet \
      || echo "cargo install cargo-deb failed"
  fi
  check_prereqs
fi

if [ ${#missing_what[@]} -gt 0 ]; then
  echo "test.sh: missing prerequisites; nothing was run:"
  print_missing
  exit 2
fi
echo "== prerequisites: all present"
[ "$check_only" -eq 1 ] && exit 0

# ----------------------------------------------------------------- runs --
logs="$repo/target/test-logs"
mkdir -p "$logs"
started=$(date +%s)

# The independent upstream servers (FastMCP from PyPI, the TypeScript SDK
# from npm) are installed once before the tests, which would otherwise
# wait for the install in turn.
echo "== upstream test servers (scripts/upstream-servers.sh install)"
scripts/upstream-servers.sh install \
  || echo "scripts/upstream-servers.sh install failed; tests/upstream_interop.rs will say why"

echo "== cargo test --locked --workspace --no-fail-fast ${cargo_args[*]}"
t0=$(date +%s)
test_status=0
cargo test --locked --workspace --no-fail-fast "${cargo_args[@]}" 2>&1 | tee "$logs/cargo-test.log" || test_status=$?
test_secs=$(($(date +%s) - t0))

sys_status=0
sys_secs=0
: >"$logs/system-test.log"
if [ "$system_test" -eq 1 ]; then
  echo "== package system test in a booted systemd (scripts/system-test.sh)"
  t0=$(date +%s)
  scripts/system-test.sh 2>&1 | tee "$logs/system-test.log" || sys_status=$?
  sys_secs=$(($(date +%s) - t0))
fi

# -------------------------------------------------------------- summary --
# scripts/test-summary.py reads the logs binary by binary: cargo test's own
# result lines, what each test binary ran (a crashed one counted as failed,
# by name), each binary against its least number of passing tests in
# tests/expected-tests.txt, the ignored tests (only the child entry points
# listed there), the system test's PASS/FAIL lines, and the closing line.
echo "== summary"
summary_args=(--cargo-log "$logs/cargo-test.log" --cargo-status "$test_status"
  --cargo-secs "$test_secs" --expected "$repo/tests/expected-tests.txt")
# Arguments to cargo test choose part of the suite. When they only name
# binaries (`--test NAME`, `--lib`, `--bins`, `--doc`), each binary that ran
# is still held to its minimum and those that did not are not checked; any
# other argument (a test name filter, `--skip`, ...) leaves out the
# minimums as well.
if [ ${#cargo_args[@]} -gt 0 ]; then
  scope=--selected
  i=0
  while [ "$i" -lt ${#cargo_args[@]} ]; do
    case ${cargo_args[$i]} in
      --test | --bin) i=$((i + 1)) ;;
      --lib | --bins | --tests | --doc) ;;
      *) scope=--partial ;;
    esac
    i=$((i + 1))
  done
  summary_args+=("$scope")
fi
if [ "$system_test" -eq 1 ]; then
  summary_args+=(--system-log "$logs/system-test.log" --system-status "$sys_status"
    --system-secs "$sys_secs")
fi
summary_status=0
python3 "$repo/scripts/test-summary.py" "${summary_args[@]}" \
  --total-secs "$(($(date +%s) - started))" || summary_status=$?
[ "$test_status" -eq 0 ] && [ "$sys_status" -eq 0 ] && [ "$summary_status" -eq 0 ]
