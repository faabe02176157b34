#!/usr/bin/env bash
# Acceptance check for the README's two commands on a fresh machine:
#
#   scripts/fresh-machine-test.sh
#
# Builds a fresh Debian 12 (bookworm) root with debootstrap (the same cached
# tree scripts/system-test.sh uses, target/nspawn/bookworm-base), gives it
# the host's Rust toolchain (~/.rustup bound read-only; rustup and its
# proxies copied into the container's own ~/.cargo/bin, so that `cargo
# install` works without touching the host and nothing installed on the
# host with `cargo install` comes along; crates come from the registry into
# the container's own ~/.cargo), copies a clean clone of this repository's
# HEAD into it and, in a systemd-nspawn container sharing the host's
# network (for the package registries), runs:
#
#   1. as a non-root user: the README's test command, which must stop at
#      once, run nothing and list what needs root;
#   2. as root: the README's first command (`cargo run --locked -- serve`),
#      until /healthz answers 200, then stops it with SIGTERM;
#   3. as root: the README's test command, which must install what it needs
#      and pass.
#
# The commands are read from the first sh block of README.md and run as
# written. Besides the toolchain, the container gets only what a Rust
# toolchain itself cannot work without: a C linker (gcc, libc6-dev) and the
# CA certificates cargo needs to fetch crates over TLS, with the host's
# locally added CAs and CA-bundle environment variables, so that it reaches
# the registries as the host does.
#
# Needs root, debootstrap and systemd-nspawn; took 31 min on two shared
# cores (a cold build, the suite, cargo install cargo-deb, the package
# builds and the system test's own debootstrap). The whole transcript goes to
# target/fresh-machine/transcript.log; the summary lines are printed and the
# last line is `N passed, N failed` over the three steps. Exit status 0 only
# if all three passed.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
if [ "$(id -u)" -ne 0 ]; then
  echo "fresh-machine-test: must run as root (debootstrap, systemd-nspawn)" >&2
  exit 2
fi
for tool in debootstrap systemd-nspawn unshare git; do
  command -v "$tool" >/dev/null || {
    echo "fresh-machine-test: $tool is missing: apt-get install debootstrap systemd-container util-linux git" >&2
    exit 2
  }
done
rustup_home="${RUSTUP_HOME:-$HOME/.rustup}"
cargo_home="${CARGO_HOME:-$HOME/.cargo}"
if [ ! -d "$rustup_home" ] || [ ! -x "$cargo_home/bin/cargo" ]; then
  echo "fresh-machine-test: no rustup toolchain at $rustup_home and $cargo_home/bin" >&2
  exit 2
fi

# The same cached tree as scripts/system-test.sh (same key, same lock).
nspawn_work="$repo/target/nspawn"
base="$nspawn_work/bookworm-base"
suite=bookworm
includes=systemd,systemd-sysv,dbus,adduser
cache_key="debootstrap --variant=minbase --include=$includes $suite (v1)"
work="$repo/target/fresh-machine"
run_dir="$work/run-$$"
transcript="$work/transcript.log"
mkdir -p "$nspawn_work" "$work"
: >"$transcript"
say() { echo "$*" | tee -a "$transcript"; }

cleanup() {
  if [ -d "$run_dir" ]; then
    umount -R "$run_dir/root" 2>/dev/null || true
    rm -rf --one-file-system "$run_dir"
  fi
}
trap cleanup EXIT

debian_mirror() {
  if [ -n "${DEBIAN_MIRROR:-}" ]; then echo "$DEBIAN_MIRROR"; return; fi
  local m
  # shellcheck disable=SC2016 # apt's own format fields
  m=$(apt-get indextargets --format '$(TARGET_OF) $(CODENAME) $(REPO_URI)' 2>/dev/null \
    | awk -v s="$suite" '$1 == "deb" && $2 == s && $3 !~ /security/ { print $3; exit }')
  echo "${m:-http://deb.debian.org/debian}"
}

ensure_base() {
  if [ -f "$base/.taskgate-cache" ] && [ "$(cat "$base/.taskgate-cache")" = "$cache_key" ]; then
    return 0
  fi
  local mirror tmp
  mirror=$(debian_mirror)
  tmp="$nspawn_work/bookworm-base.tmp-$$"
  rm -rf --one-file-system "$tmp"
  say "# debootstrap $suite from $mirror (first run only, a few minutes)"
  if ! debootstrap --variant=minbase --include="$includes" "$suite" "$tmp" "$mirror" >>"$transcript" 2>&1; then
    rm -rf --one-file-system "$tmp"
    return 1
  fi
  echo tg-test >"$tmp/etc/hostname"
  : >"$tmp/etc/machine-id"
  rm -f "$tmp/var/cache/apt/archives/"*.deb
  echo "$cache_key" >"$tmp/.taskgate-cache"
  rm -rf --one-file-system "$base"
  mv "$tmp" "$base"
}

started=$(date +%s)
(
  flock 9
  ensure_base
) 9>"$nspawn_work/.cache.lock" || { say "FAIL fresh-root: debootstrap failed (see $transcript)"; exit 1; }

rootfs="$run_dir/root"
mkdir -p "$run_dir"
cp -a --reflink=auto "$base" "$rootfs"
rm -f "$rootfs/.taskgate-cache"
# A machine ID, as a booted machine has from its first boot (the cached tree
# leaves it empty for the system test's container to be given its own);
# systemd-nspawn refuses to start a container on a host without one.
tr -d - </proc/sys/kernel/random/uuid >"$rootfs/etc/machine-id"
commit=$(git rev-parse HEAD)
# A clean clone of the committed tree: nothing from this work tree's
# target/ or uncommitted files.
git clone -q --no-local --no-hardlinks "$repo" "$rootfs/root/taskgate"
git -C "$rootfs/root/taskgate" checkout -q --detach "$commit"
# ~/.cargo/bin as rustup made it: rustup and its proxies (cargo, rustc, ...),
# none of what was later installed there with `cargo install`. A copy in
# the container's own ~/.cargo, so that `cargo install` works there.
for home in root home/dev; do
  mkdir -p "$rootfs/$home/.rustup" "$rootfs/$home/.cargo/bin"
  cp -a "$cargo_home/bin/rustup" "$rootfs/$home/.cargo/bin/"
  for f in "$cargo_home"/bin/*; do
    if [ -L "$f" ] && [ "$(readlink "$f")" = rustup ]; then cp -a "$f" "$rootfs/$home/.cargo/bin/"; fi
  done
done
git clone -q --no-local --no-hardlinks "$repo" "$rootfs/home/dev/taskgate"
git -C "$rootfs/home/dev/taskgate" checkout -q --detach "$commit"

# The host's locally added trust anchors (an egress that inspects TLS has
# its CA there): the container reaches the package registries the way the
# host does. ca-certificates, installed below, adds them to the bundle.
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  mkdir -p "$rootfs/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
fi

# The commands as README.md gives them: its first sh block, comments cut.
readme_cmds=$(awk '/^```sh$/ { inblock = 1; next } inblock && /^```$/ { exit } inblock' README.md \
  | sed 's/[[:space:]]*#.*$//' | grep -v '^[[:space:]]*$')
serve_cmd=$(grep -m1 'serve' <<<"$readme_cmds" || true)
test_cmd=$(grep -m1 -v 'serve' <<<"$readme_cmds" || true)
if [ -z "$serve_cmd" ] || [ -z "$test_cmd" ]; then
  say "FAIL readme: no serve and test command in README.md's first sh block"
  exit 1
fi

# What runs inside the container (PID 2 under nspawn's stub init).
{
  echo '#!/bin/bash'
  echo 'set -uo pipefail'
  printf 'serve_cmd=%q\ntest_cmd=%q\n' "$serve_cmd" "$test_cmd"
  cat <<'INNER'
export DEBIAN_FRONTEND=noninteractive
result() { echo "RESULT $*"; }
elapsed() { echo $(($(date +%s) - $1)); }

echo "== toolchain prerequisites: a C linker and CA certificates"
apt-get update -qq && apt-get install -y -qq --no-install-recommends gcc libc6-dev ca-certificates >/dev/null \
  || { result "FAIL toolchain-prerequisites: apt-get install gcc libc6-dev ca-certificates failed"; exit 1; }
useradd -M -d /home/dev -s /bin/bash dev
chown -R dev:dev /home/dev/taskgate /home/dev/.cargo && chown dev:dev /home/dev

echo "== 1. as a non-root user: $test_cmd"
t0=$(date +%s)
out=$(runuser -u dev -- env -i HOME=/home/dev PATH=/home/dev/.cargo/bin:/usr/local/bin:/usr/bin:/bin \
  LANG=C.UTF-8 RUSTUP_AUTO_INSTALL=0 bash -c "cd /home/dev/taskgate && $test_cmd" 2>&1)
rc=$?
printf '%s\n' "$out" | sed 's/^/  | /'
secs=$(elapsed "$t0")
if [ "$rc" -ne 0 ] && grep -q "need root" <<<"$out" && grep -q "nothing was run" <<<"$out" && [ "$secs" -le 30 ]; then
  result "PASS non-root-stops-at-once (exit $rc after ${secs}s, listing what needs root)"
else
  result "FAIL non-root-stops-at-once: exit $rc after ${secs}s"
fi

cd /root/taskgate
echo "== 2. as root: $serve_cmd"
t0=$(date +%s)
bash -c "exec $serve_cmd" >/root/serve.log 2>&1 &
pid=$!
health=""
# A cold build comes first: wait while the process lives, at most 60 min.
while kill -0 "$pid" 2>/dev/null && [ "$(elapsed "$t0")" -lt 3600 ]; do
  health=$(timeout 10 bash -c 'exec 3<>/dev/tcp/127.0.0.1/8765 &&
    printf "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n" >&3 &&
    head -n1 <&3' 2>/dev/null | tr -d '\r')
  [ -n "$health" ] && break
  sleep 1
done
up=$(elapsed "$t0")
kill -TERM "$pid" 2>/dev/null
wait "$pid"
src=$?
tail -n 5 /root/serve.log | sed 's/^/  | /'
case $health in
  "HTTP/1.1 200"*)
    if [ "$src" -eq 0 ]; then
      result "PASS serve (GET /healthz: $health after ${up}s, build included; exit 0 on SIGTERM)"
    else
      result "FAIL serve: /healthz answered $health but the daemon exited $src on SIGTERM"
    fi ;;
  *) result "FAIL serve: no 200 from /healthz (got '${health:-nothing}', exit $src after ${up}s; see serve.log)" ;;
esac

echo "== 3. as root: $test_cmd"
t0=$(date +%s)
bash -c "$test_cmd" 2>&1 | tee /root/test.log
trc=${PIPESTATUS[0]}
closing=$(grep -E '^[0-9]+ passed, [0-9]+ failed' /root/test.log | tail -n1)
if [ "$trc" -eq 0 ]; then
  result "PASS test-command (exit 0 after $(elapsed "$t0")s: $closing)"
else
  result "FAIL test-command: exit $trc after $(elapsed "$t0")s: ${closing:-no closing line}"
fi
INNER
} >"$rootfs/root/fresh-run.sh"
chmod 755 "$rootfs/root/fresh-run.sh"

say "# fresh Debian 12 root: $rootfs; repository at $commit"
say "# toolchain: $rustup_home (read-only), rustup and its proxies from $cargo_home/bin"
cx_env=(-E LANG=C.UTF-8 -E HOME=/root -E TERM=dumb
  -E PATH=/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
# The machine's own settings for its toolchain and its clients' trust
# store, as every shell on the host has them.
for v in RUSTUP_AUTO_INSTALL SSL_CERT_FILE SSL_CERT_DIR NODE_EXTRA_CA_CERTS CURL_CA_BUNDLE \
  GIT_SSL_CAINFO REQUESTS_CA_BUNDLE PIP_CERT; do
  [ -n "${!v:-}" ] && cx_env+=(-E "$v=${!v}")
done
# Like a machine of its own: every capability, no system-call filter (the
# suite attaches strace and mounts; the system test nests a container).
status=0
# shellcheck disable=SC2016 # expanded by the inner shell
ROOTFS="$rootfs" RUSTUP_SRC="$rustup_home" \
  SYSTEMD_SECCOMP=0 unshare -m --propagation private bash -c '
    mount -t tmpfs tmpfs /run &&
    exec systemd-nspawn -q -D "$ROOTFS" -M "tg-fresh-$$" --register=no --keep-unit \
      --as-pid2 --capability=all --resolv-conf=copy-host --timezone=off \
      --bind-ro="$RUSTUP_SRC:/root/.rustup" --bind-ro="$RUSTUP_SRC:/home/dev/.rustup" \
      "$@" /root/fresh-run.sh' nspawn "${cx_env[@]}" </dev/null 2>&1 \
  | tee -a "$transcript" || status=$?

echo "== summary"
# The test command's own summary (as root), then one line per step.
awk '/^== summary$/ { f = 1 } f && !/^RESULT / { print } /^[0-9]+ passed, [0-9]+ failed/ { f = 0 }' "$transcript"
grep "^RESULT" "$transcript" || true
npass=$(grep -c '^RESULT PASS' "$transcript" || true)
nfail=$(grep -c '^RESULT FAIL' "$transcript" || true)
[ $((npass + nfail)) -ge 3 ] || nfail=$((3 - npass))
echo "fresh machine: $(($(date +%s) - started))s, container exit $status"
echo "$npass passed, $nfail failed"
[ "$nfail" -eq 0 ] && [ "$status" -eq 0 ]
