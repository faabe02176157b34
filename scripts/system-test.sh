#!/usr/bin/env bash
# End-to-end system test of the Debian package in a real booted systemd.
#
#   scripts/system-test.sh [DEB [UPGRADE_DEB]]
#
# Boots Debian 12 (bookworm) in a systemd-nspawn container with a private
# network namespace (loopback only), installs the package and checks the
# unit's hardening, the service's READY state, user and state-directory
# modes, durability across restarts, the lifetime lock, the watchdog, the
# backup/restore runbooks, status and online snapshots, an upgrade, removal
# and purge. One line per check: `PASS <check>` or `FAIL <check>: <why>`;
# exit status 1 if any check failed. `--help` prints this.
#
# Package completeness and journal hygiene have their own blocks:
# dpkg-verify-clean, backup-refuses-bad-destination-before-stopping,
# restore-refusal-after-stop-restarts-service, journal-err-shows-refused-start,
# journal-catalog-entry-resolves, purge-keeps-restore-evidence.
#
# Reload has its own block: `systemctl reload` is synchronous (the unit runs
# `taskgate reload`): reload-applies-tools-keeps-running-task,
# reload-refuses-invalid-conffile (it exits non-zero, the daemon keeps
# serving), reload-applies-log-filter.
#
# Tool confinement under the unit has its own block: tool-confinement-in-force,
# tool-denied-state-directory, tool-grandchild-dies-with-cancel,
# tool-grandchild-dies-with-daemon-kill, tool-fork-bomb-bounded-healthz-answers,
# unit-exposure-running.
#
# Without arguments it builds taskgate_<v>-1 and -2 (in debian/ of cargo's target directory) with
# scripts/build-deb.sh (on the host, before booting). With DEB it tests that
# package and builds the upgrade with --revision 2 unless UPGRADE_DEB is given.
#
# Needs root on a Debian 12 host; installs debootstrap and systemd-container
# (and lintian when building) if missing. The debootstrap tree is cached in
# target/nspawn/bookworm-base and copied to a fresh root for every run. The
# full log (commands, outputs, the container's journal) is written to
# target/nspawn/system-test.log. Set DEBIAN_MIRROR to override the mirror
# taken from the host's apt sources.
set -uo pipefail

case "${1:-}" in
  -h | --help)
    # The header above is the help.
    sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 0
    ;;
esac
repo="$(cd "$(dirname "$0")/.." && pwd)"
args=()
for a in "$@"; do args+=("$(realpath -e -- "$a" 2>/dev/null || echo "$a")"); done
cd "$repo"
started=$(date +%s)

if [ "$(id -u)" -ne 0 ]; then
  echo "system-test: must run as root (debootstrap, systemd-nspawn)" >&2
  exit 2
fi
if [ $# -gt 2 ]; then
  echo "usage: $0 [DEB [UPGRADE_DEB]]" >&2
  exit 64
fi

work="$repo/target/nspawn"
base="$work/bookworm-base"
suite=bookworm
includes=systemd,systemd-sysv,dbus,adduser,procps # procps: kept in the base tree for debugging inside the container (it has no network for apt); the package no longer depends on it
cache_key="debootstrap --variant=minbase --include=$includes $suite (v1)"
mkdir -p "$work"
log="$work/system-test.log"
: >"$log"
exec 3>&1 # the real stdout: check lines only; everything else goes to $log

say() { echo "$*" >&3; echo "$*" >>"$log"; }
note() { echo "# $*" >&3; echo "# $*" >>"$log"; }

# ---------------------------------------------------------------- checks --
CHECKS=(
  build-deb
  unit-security-score
  container-boot
  dpkg-install
  unit-verify
  dpkg-verify-clean
  unit-enabled-active-ready
  runs-as-taskgate
  state-dir-permissions
  test-setup
  task-survives-restart
  lock-refuses-second-serve
  lock-refuses-check
  operator-check-sees-service-state
  config-check-while-serving
  restart-with-running-tool-reads-interrupted
  reload-applies-tools-keeps-running-task
  reload-refuses-invalid-conffile
  reload-applies-log-filter
  credentials-under-the-unit
  tool-confinement-in-force
  tool-denied-state-directory
  tool-grandchild-dies-with-cancel
  tool-grandchild-dies-with-daemon-kill
  tool-fork-bomb-bounded-healthz-answers
  unit-exposure-running
  watchdog-restarts-hung-daemon
  backup-restore
  backup-refuses-bad-destination-before-stopping
  restore-refuses-tampered-snapshot
  status-over-admin-socket
  verify-durable-tasks-under-the-unit
  approval-held-call-under-the-unit
  online-snapshot-restores
  restore-refusal-after-stop-restarts-service
  journal-err-shows-refused-start
  journal-catalog-entry-resolves
  upgrade-keeps-data
  upgrade-refuses-bad-conffile-before-restart
  remove-keeps-state
  purge-removes-state
  purge-keeps-restore-evidence
)
declare -A reported=()
npass=0
nfail=0
WHY=""
INFO=""

pass() { reported[$1]=1; npass=$((npass + 1)); say "PASS $1${2:+ ($2)}"; }
fail() { reported[$1]=1; nfail=$((nfail + 1)); say "FAIL $1: $2"; }

# run_check NAME FUNCTION: the function returns 0 (optionally setting INFO)
# or non-zero with WHY set.
run_check() {
  local name=$1 fn=$2
  WHY="" INFO=""
  echo "=== check $name" >>"$log"
  if "$fn"; then pass "$name" "$INFO"; else fail "$name" "${WHY:-failed}"; fi
}

# Reports every check not yet reported as not run, then exits.
abort_rest() {
  local c
  for c in "${CHECKS[@]}"; do
    [ -n "${reported[$c]:-}" ] || fail "$c" "not run: $1"
  done
  exit 1 # the EXIT trap powers off, cleans up and prints the summary
}

oneline() { printf '%s' "$*" | tr '\n\t' '  ' | tr -s ' ' | cut -c1-400; }

# ------------------------------------------------------------- container --
run_dir=""
rootfs=""
boot_pid=""
pid1=""
CX_TIMEOUT=60
CX_ENV=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  LANG=C.UTF-8 HOME=/root TERM=dumb DEBIAN_FRONTEND=noninteractive)

# cx CMD...: runs CMD inside the container (all its namespaces), clean env.
cx() {
  timeout --kill-after=5 "$CX_TIMEOUT" \
    nsenter -t "$pid1" -a /usr/bin/env -i -C / "${CX_ENV[@]}" "$@" </dev/null
}
# run_cx CMD...: like cx, output in OUT, status in RC, both logged.
OUT="" RC=0
run_cx() {
  OUT=$(cx "$@" 2>&1)
  RC=$?
  printf '$ %s\n%s\n[exit %s]\n' "$*" "$OUT" "$RC" >>"$log"
}
unit_prop() { cx systemctl show -p "$1" --value taskgate.service 2>>"$log"; }

# The container's PID 1: the process named systemd that is PID 1 in its own
# PID namespace and descends from our boot job.
find_pid1() {
  local -A parent=()
  local -a cands=()
  local f pid k v name pp ns p
  for f in /proc/[0-9]*/status; do
    pid=${f#/proc/}
    pid=${pid%/status}
    name="" pp="" ns=""
    { while IFS=$'\t' read -r k v; do
        case $k in Name:) name=$v ;; PPid:) pp=$v ;; NSpid:) ns=$v ;; esac
      done <"$f"; } 2>/dev/null || continue
    parent[$pid]=$pp
    if [ "$name" = systemd ] && [ "${ns##*[[:space:]]}" = 1 ] && [ "$ns" != 1 ]; then
      cands+=("$pid")
    fi
  done
  for pid in "${cands[@]}"; do
    p=$pid
    while [ -n "$p" ] && [ "$p" -gt 1 ]; do
      if [ "$p" = "$boot_pid" ]; then echo "$pid"; return 0; fi
      p=${parent[$p]:-}
    done
  done
  return 1
}

cleanup() {
  local rc=$? i
  trap - EXIT INT TERM
  if [ -n "$pid1" ] && [ -d "/proc/$pid1" ]; then
    {
      echo "=== container journal"
      CX_TIMEOUT=20 cx journalctl -b --no-pager -o short-monotonic
      echo "=== taskgate.service"
      CX_TIMEOUT=20 cx systemctl status --no-pager -l taskgate.service
    } >>"$log" 2>&1
    CX_TIMEOUT=20 cx systemctl poweroff >>"$log" 2>&1
  fi
  if [ -n "$boot_pid" ]; then
    for i in $(seq 1 150); do
      kill -0 "$boot_pid" 2>/dev/null || break
      sleep 0.2
    done
    if kill -0 "$boot_pid" 2>/dev/null; then
      echo "container did not power off in 30 s; killing its PID 1 ($pid1)" >>"$log"
      [ -n "$pid1" ] && kill -KILL "$pid1" 2>/dev/null
      sleep 2
      kill -TERM "$boot_pid" 2>/dev/null
    fi
    wait "$boot_pid" 2>/dev/null
  fi
  if [ -n "$run_dir" ] && [ -d "$run_dir" ]; then
    [ -f "$run_dir/console.log" ] && cp "$run_dir/console.log" "$work/console.log"
    rm -rf --one-file-system "$run_dir"
  fi
  local total=$(($(date +%s) - started))
  say "SUMMARY: $npass passed, $nfail failed, $((${#CHECKS[@]} - npass - nfail)) not reported; ${total}s; log: $log"
  if [ "$nfail" -gt 0 ] || [ "$rc" -ne 0 ] || [ "$npass" -lt "${#CHECKS[@]}" ]; then exit 1; fi
  exit 0
}
trap cleanup EXIT
trap 'echo "interrupted" >>"$log"; exit 130' INT TERM

# ------------------------------------------------------------ host setup --
need_pkgs=()
command -v debootstrap >/dev/null || need_pkgs+=(debootstrap)
command -v systemd-nspawn >/dev/null || need_pkgs+=(systemd-container)
if [ $# -eq 0 ] || [ $# -eq 1 ]; then
  command -v lintian >/dev/null || need_pkgs+=(lintian)
fi
if [ ${#need_pkgs[@]} -gt 0 ]; then
  note "installing ${need_pkgs[*]}"
  { apt-get update && apt-get install -y --no-install-recommends "${need_pkgs[@]}"; } >>"$log" 2>&1 \
    || { fail build-deb "apt-get install ${need_pkgs[*]} failed (see $log)"; abort_rest "host setup failed"; }
fi
for tool in systemd-analyze script unshare nsenter timeout; do
  command -v "$tool" >/dev/null || { fail build-deb "$tool is missing on the host"; abort_rest "host setup failed"; }
done

deb_arch=$(dpkg --print-architecture)
BUILT=""
build_deb() { # revision -> BUILT: the .deb's path
  local out rc
  out=$(scripts/build-deb.sh --revision "$1" 2>&1)
  rc=$?
  printf '$ scripts/build-deb.sh --revision %s\n%s\n[exit %s]\n' "$1" "$out" "$rc" >>"$log"
  [ $rc -eq 0 ] || { WHY="scripts/build-deb.sh --revision $1 exited $rc: $(oneline "$(printf '%s' "$out" | tail -n 5)")"; return 1; }
  BUILT=$(printf '%s\n' "$out" | sed -n 's/^built //p' | tail -n1)
  [ -n "$BUILT" ] || { WHY="scripts/build-deb.sh printed no 'built' line"; return 1; }
  case $BUILT in /*) ;; *) BUILT="$repo/$BUILT" ;; esac
  # cargo-deb deletes the other revisions from its debian/ directory: keep a copy.
  mkdir -p "$work/debs"
  cp "$BUILT" "$work/debs/" || { WHY="cannot copy $BUILT"; return 1; }
  BUILT="$work/debs/$(basename "$BUILT")"
}

deb1="" deb2=""
check_build() {
  if [ $# -ge 1 ]; then
    deb1=$1
  fi
  if [ $# -ge 2 ]; then
    deb2=$2
  fi
  if [ -z "$deb2" ]; then
    command -v cargo >/dev/null || { WHY="cargo is not installed (needed to build the package)"; return 1; }
    if ! command -v cargo-deb >/dev/null && ! cargo deb --version >/dev/null 2>&1; then
      note "installing cargo-deb (cargo install cargo-deb --locked)"
      cargo install cargo-deb --locked >>"$log" 2>&1 || { WHY="cargo install cargo-deb failed"; return 1; }
    fi
  fi
  if [ -z "$deb1" ]; then
    note "building the package (scripts/build-deb.sh --revision 1)"
    build_deb 1 || return 1
    deb1=$BUILT
  fi
  if [ -z "$deb2" ]; then
    note "building the upgrade package (scripts/build-deb.sh --revision 2)"
    build_deb 2 || return 1
    deb2=$BUILT
  fi
  local f
  for f in "$deb1" "$deb2"; do
    [ -f "$f" ] || { WHY="$f: no such file"; return 1; }
    [ "$(dpkg-deb -f "$f" Package 2>/dev/null)" = taskgate ] || { WHY="$f is not a taskgate package"; return 1; }
    [ "$(dpkg-deb -f "$f" Architecture)" = "$deb_arch" ] || { WHY="$f is not for $deb_arch"; return 1; }
  done
  v1=$(dpkg-deb -f "$deb1" Version)
  v2=$(dpkg-deb -f "$deb2" Version)
  dpkg --compare-versions "$v2" gt "$v1" || { WHY="the upgrade package's version $v2 is not newer than $v1"; return 1; }
  if [ $# -lt 2 ] && [ "$v2" != "${v1%-*}-2" ]; then
    WHY="scripts/build-deb.sh --revision 2 built version $v2, expected ${v1%-*}-2"
    return 1
  fi
  INFO="$(basename "$deb1"), upgrade $(basename "$deb2")"
}
v1="" v2=""
WHY="" INFO=""
echo "=== check build-deb" >>"$log"
if check_build "${args[@]}"; then
  if [ $# -ge 2 ]; then pass build-deb "given: $INFO"; else pass build-deb "$INFO; lintian clean"; fi
else
  fail build-deb "$WHY"
  abort_rest "no package to test"
fi

# 1. The unit's exposure score, offline, on the host.
check_security() {
  local unit="$repo/systemd/taskgate.service" out score
  out=$(systemd-analyze security --offline=yes "$unit" 2>&1)
  printf '$ systemd-analyze security --offline=yes %s\n%s\n' "$unit" "$out" >>"$log"
  score=$(printf '%s\n' "$out" | sed -n 's/.*Overall exposure level for [^:]*: \([0-9][0-9.]*\).*/\1/p' | tail -n1)
  [ -n "$score" ] || { WHY="no exposure level in the output of systemd-analyze security: $(oneline "$(printf '%s' "$out" | tail -n 3)")"; return 1; }
  awk -v s="$score" 'BEGIN { exit !(s <= 1.5) }' || { WHY="exposure $score > 1.5"; return 1; }
  INFO="systemd/taskgate.service exposure $score <= 1.5"
  # The unit the package ships must be the one scored.
  local shipped
  shipped=$(dpkg-deb --fsys-tarfile "$deb1" | tar -xOf - ./usr/lib/systemd/system/taskgate.service ./lib/systemd/system/taskgate.service 2>/dev/null)
  [ -n "$shipped" ] || { WHY="the package ships no taskgate.service"; return 1; }
  if [ "$shipped" != "$(cat "$unit")" ]; then
    local tmp
    tmp=$(mktemp -d)
    printf '%s\n' "$shipped" >"$tmp/taskgate.service"
    out=$(systemd-analyze security --offline=yes "$tmp/taskgate.service" 2>&1)
    rm -rf "$tmp"
    score=$(printf '%s\n' "$out" | sed -n 's/.*Overall exposure level for [^:]*: \([0-9][0-9.]*\).*/\1/p' | tail -n1)
    [ -n "$score" ] && awk -v s="$score" 'BEGIN { exit !(s <= 1.5) }' \
      || { WHY="the packaged unit differs from systemd/taskgate.service and scores ${score:-?} > 1.5"; return 1; }
    INFO="$INFO; packaged unit differs, exposure $score"
  fi
}
run_check unit-security-score check_security

# ------------------------------------------------------- debootstrap tree --
debian_mirror() {
  if [ -n "${DEBIAN_MIRROR:-}" ]; then echo "$DEBIAN_MIRROR"; return; fi
  local m
  m=$(apt-get indextargets --format '$(TARGET_OF) $(CODENAME) $(REPO_URI)' 2>/dev/null \
    | awk -v s="$suite" '$1 == "deb" && $2 == s && $3 !~ /security/ { print $3; exit }')
  if [ -z "$m" ]; then
    m=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
      | awk -v s="$suite" '$1 == "deb" && $0 !~ /security/ { for (i = 2; i < NF; i++) if ($i !~ /^\[/ && $(i+1) == s) { print $i; exit } }')
  fi
  if [ -z "$m" ]; then
    m=$(awk -v s="$suite" 'BEGIN { RS = "" } /(^|\n)Types:[^\n]*deb( |\n|$)/ && $0 ~ ("Suites:[^\n]* " s "( |\n|$)") && $0 !~ /security/ {
          if (match($0, /URIs: *[^ \n]+/)) { u = substr($0, RSTART, RLENGTH); sub(/URIs: */, "", u); print u; exit } }' \
      /etc/apt/sources.list.d/*.sources 2>/dev/null)
  fi
  echo "${m:-http://deb.debian.org/debian}"
}

ensure_base() {
  if [ -f "$base/.taskgate-cache" ] && [ "$(cat "$base/.taskgate-cache")" = "$cache_key" ]; then
    return 0
  fi
  local mirror tmp
  mirror=$(debian_mirror)
  tmp="$work/bookworm-base.tmp-$$"
  rm -rf --one-file-system "$tmp"
  note "debootstrap $suite from $mirror into $base (first run only, a few minutes)"
  if ! debootstrap --variant=minbase --include="$includes" "$suite" "$tmp" "$mirror" >>"$log" 2>&1; then
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

# Leftovers of runs that were killed (their process is gone).
for d in "$work"/run-*; do
  [ -d "$d" ] || continue
  p=${d##*-}
  kill -0 "$p" 2>/dev/null || rm -rf --one-file-system "$d"
done

boot_container() {
  exec 9>"$work/.cache.lock"
  flock 9
  ensure_base || { exec 9>&-; WHY="debootstrap failed (see $log)"; return 1; }
  exec 9>&-
  run_dir="$work/run-$$"
  rootfs="$run_dir/root"
  mkdir -p "$run_dir"
  cp -a --reflink=auto "$base" "$rootfs" || { WHY="copying the cached tree failed"; return 1; }
  mkdir -p "$rootfs/root/pkgs"
  cp "$deb1" "$rootfs/root/pkgs/install.deb"
  cp "$deb2" "$rootfs/root/pkgs/upgrade.deb"
  local t0=$(date +%s.%N)
  # nspawn's own seccomp filter knows nothing of Landlock; without these
  # three calls every tool in the container would look unconfinable (78).
  ROOTFS="$rootfs" MACHINE="taskgate-systest-$$" CONSOLE_LOG="$run_dir/console.log" \
    unshare -m --propagation private sh -c 'mount -t tmpfs tmpfs /run && \
      SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1 exec script -qfc \
      "systemd-nspawn -D \"\$ROOTFS\" -M \"\$MACHINE\" --private-network --register=no --keep-unit --capability=all --system-call-filter=bpf --system-call-filter=landlock_create_ruleset --system-call-filter=landlock_add_rule --system-call-filter=landlock_restrict_self --boot" \
      "$CONSOLE_LOG"' </dev/null >/dev/null 2>>"$log" &
  boot_pid=$!
  local i
  for i in $(seq 1 150); do
    pid1=$(find_pid1) && break
    pid1=""
    kill -0 "$boot_pid" 2>/dev/null || break
    sleep 0.2
  done
  [ -n "$pid1" ] || { WHY="no systemd PID 1 appeared (see $run_dir/console.log, copied to $work/console.log)"; return 1; }
  local state=""
  for i in $(seq 1 60); do
    state=$(CX_TIMEOUT=90 cx systemctl is-system-running --wait 2>>"$log")
    case $state in running | degraded) break ;; esac
    sleep 0.5
  done
  case $state in
    running) ;;
    degraded)
      echo "failed units at boot:" >>"$log"
      cx systemctl --failed --no-pager >>"$log" 2>&1
      ;;
    *) WHY="the container's systemd did not reach running (state: ${state:-none})"; return 1 ;;
  esac
  INFO="bookworm, systemd $(cx systemctl --version | awk 'NR==1 { print $2 }'), $state in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
}
run_check container-boot boot_container
[ -n "${reported[container-boot]:-}" ] && [ -n "$pid1" ] && [ -z "$WHY" ] || abort_rest "the container did not boot"

# ------------------------------------------------------------- the tests --
# 2. Install.
check_install() {
  run_cx dpkg -i /root/pkgs/install.deb
  [ "$RC" -eq 0 ] || { WHY="dpkg -i exited $RC: $(oneline "$(printf '%s' "$OUT" | tail -n 5)")"; return 1; }
  local st
  st=$(cx dpkg-query -W -f '${Status} ${Version}' taskgate 2>&1)
  [ "$st" = "install ok installed $v1" ] || { WHY="dpkg-query says: $st"; return 1; }
  INFO="taskgate $v1"
}
run_check dpkg-install check_install
[ -z "$WHY" ] || abort_rest "the package did not install"

# 1 (continued). systemd-analyze verify of the installed unit: no output at all.
check_verify() {
  local frag docs d name sec missing=""
  frag=$(unit_prop FragmentPath)
  [ -n "$frag" ] || { WHY="systemd does not know taskgate.service"; return 1; }
  run_cx systemd-analyze verify --man=no "$frag"
  [ "$RC" -eq 0 ] && [ -z "$OUT" ] || { WHY="systemd-analyze verify $frag (exit $RC) printed: $(oneline "$OUT")"; return 1; }
  # --man=no because the container has no man(1); check the references by hand.
  docs=$(unit_prop Documentation)
  for d in $docs; do
    case $d in
      man:*\(*\))
        name=${d#man:}
        sec=${name##*(}
        sec=${sec%)}
        name=${name%(*}
        cx test -f "/usr/share/man/man$sec/$name.$sec.gz" || missing="$missing $d"
        ;;
    esac
  done
  [ -z "$missing" ] || { WHY="Documentation= names man pages the package does not ship:$missing"; return 1; }
  INFO="$frag: no output; Documentation= man pages present"
}
run_check unit-verify check_verify

# 1 (continued). The package's md5sums cover what it installed: dpkg --verify
# prints nothing (run before test-setup edits the conffile).
check_dpkg_verify() {
  cx test -s /var/lib/dpkg/info/taskgate.md5sums || { WHY="the package installed no md5sums"; return 1; }
  run_cx dpkg --verify taskgate
  [ "$RC" -eq 0 ] && [ -z "$OUT" ] || { WHY="dpkg --verify taskgate (exit $RC): $(oneline "$OUT")"; return 1; }
  INFO="$(cx sh -c 'wc -l </var/lib/dpkg/info/taskgate.md5sums') files in md5sums, dpkg --verify silent"
}
run_check dpkg-verify-clean check_dpkg_verify

check_enabled_active() {
  local en props
  en=$(cx systemctl is-enabled taskgate.service 2>&1)
  [ "$en" = enabled ] || { WHY="is-enabled: $en"; return 1; }
  props=$(cx systemctl show -p Type -p ActiveState -p SubState -p StatusText taskgate.service 2>&1)
  echo "$props" >>"$log"
  grep -qx 'Type=notify' <<<"$props" || { WHY="not Type=notify: $(oneline "$props")"; return 1; }
  grep -qx 'ActiveState=active' <<<"$props" && grep -qx 'SubState=running' <<<"$props" \
    || { WHY="not active/running: $(oneline "$props")"; return 1; }
  grep -q '^StatusText=.*serving on' <<<"$props" || { WHY="StatusText lacks \"serving on\" (READY not reached?): $(oneline "$props")"; return 1; }
  INFO="enabled, active/running, $(grep '^StatusText=' <<<"$props" | cut -c1-120)"
}
run_check unit-enabled-active-ready check_enabled_active

check_user() {
  local pid uid gid puid pgid
  pid=$(unit_prop MainPID)
  [ -n "$pid" ] && [ "$pid" != 0 ] || { WHY="no MainPID"; return 1; }
  uid=$(cx id -u taskgate 2>&1) || { WHY="no taskgate user: $uid"; return 1; }
  gid=$(cx id -g taskgate 2>&1)
  puid=$(cx awk '/^Uid:/ { print $2, $3, $4, $5 }' "/proc/$pid/status")
  pgid=$(cx awk '/^Gid:/ { print $2, $3, $4, $5 }' "/proc/$pid/status")
  [ "$puid" = "$uid $uid $uid $uid" ] || { WHY="main PID $pid has uids $puid, taskgate is $uid"; return 1; }
  [ "$pgid" = "$gid $gid $gid $gid" ] || { WHY="main PID $pid has gids $pgid, taskgate is $gid"; return 1; }
  [ "$uid" -lt 1000 ] || { WHY="taskgate (uid $uid) is not a system user"; return 1; }
  INFO="main PID $pid runs as taskgate uid $uid gid $gid"
}
run_check runs-as-taskgate check_user

# 3. The state directory: 0700 taskgate, files 0600 taskgate.
STATE_DIR_INFO=""
state_dir_ok() {
  local listing line type mode user group path bad=""
  listing=$(cx find /var/lib/taskgate -printf '%y %m %u %g %p\n' 2>&1) || { WHY="cannot list /var/lib/taskgate: $(oneline "$listing")"; return 1; }
  echo "$listing" >>"$log"
  while read -r type mode user group path; do
    if [ "$path" = /var/lib/taskgate ]; then
      [ "$type $mode $user $group" = "d 700 taskgate taskgate" ] || bad="$bad $path is $type $mode $user:$group (want d 700 taskgate:taskgate);"
      continue
    fi
    case $type in
      f) [ "$mode $user" = "600 taskgate" ] || bad="$bad $path is $mode $user:$group (want 600 taskgate);" ;;
      d) [ "$mode $user" = "700 taskgate" ] || bad="$bad $path is dir $mode $user:$group (want 700 taskgate);" ;;
      *) bad="$bad $path has type $type;" ;;
    esac
  done <<<"$listing"
  grep -q ' /var/lib/taskgate/tasks.db$' <<<"$listing" || bad="$bad no tasks.db;"
  grep -q ' /var/lib/taskgate/tasks.lock$' <<<"$listing" || bad="$bad no tasks.lock;"
  [ -z "$bad" ] || { WHY="${bad%;}"; return 1; }
  STATE_DIR_INFO="$(grep -c '^f ' <<<"$listing") files: $(grep '^f ' <<<"$listing" | awk '{ sub(".*/", "", $5); printf "%s%s", sep, $5; sep=" " }')"
}
check_state_dir() {
  state_dir_ok || return 1
  INFO="0700 taskgate, $STATE_DIR_INFO all 0600 taskgate"
}
run_check state-dir-permissions check_state_dir

# Test setup: a read-only task-capable tool in the (conf)file, and a short
# watchdog for check 6 in a drop-in. One restart for both.
check_setup() {
  run_cx sh -c 'cat >>/etc/taskgate/taskgate.toml <<EOF

# Added by scripts/system-test.sh: a quick read-only tool that can run as a task.
[[tool]]
name = "probe"
description = "Prints its text back (system test)."
argv = ["/usr/bin/printf", "%s", "{text}"]
effect = "read_only"
task = "optional"
timeout_secs = 10
[tool.input_schema]
type = "object"
required = ["text"]
[tool.input_schema.properties.text]
type = "string"
maxLength = 64
EOF
mkdir -p /etc/systemd/system/taskgate.service.d &&
printf "[Service]\nWatchdogSec=3s\n" >/etc/systemd/system/taskgate.service.d/system-test.conf &&
systemctl daemon-reload && systemctl restart taskgate.service'
  [ "$RC" -eq 0 ] || { WHY="restart with the test tool and WatchdogSec=3s failed (exit $RC): $(oneline "$OUT")"; return 1; }
  local wd
  wd=$(unit_prop WatchdogUSec)
  [ "$wd" = 3s ] || { WHY="WatchdogUSec is $wd after the drop-in, want 3s"; return 1; }
  [ "$(unit_prop ActiveState)" = active ] || { WHY="not active after the restart"; return 1; }
  INFO="tool probe added to /etc/taskgate/taskgate.toml, WatchdogSec=3s drop-in"
}
run_check test-setup check_setup

# Task helpers. create_task TEXT -> TASK_ID, completed.
TASK_ID=""
create_task() {
  TASK_ID=""
  run_cx taskgate call probe --args "{\"text\": \"$1\"}" --task
  [ "$RC" -eq 0 ] || { WHY="taskgate call probe --task exited $RC: $(oneline "$OUT")"; return 1; }
  grep -q '"resultType": *"task"' <<<"$OUT" || { WHY="the call returned no task: $(oneline "$OUT")"; return 1; }
  TASK_ID=$(grep -o '"taskId": *"tg-[0-9a-f]*"' <<<"$OUT" | grep -o 'tg-[0-9a-f]*' | head -n1)
  [ -n "$TASK_ID" ] || { WHY="no taskId in: $(oneline "$OUT")"; return 1; }
  run_cx taskgate task get "$TASK_ID" --wait
  [ "$RC" -eq 0 ] && grep -q '"status": *"completed"' <<<"$OUT" && grep -q "\"text\": *\"$1\"" <<<"$OUT" \
    || { WHY="task $TASK_ID did not complete with text $1 (exit $RC): $(oneline "$OUT")"; return 1; }
}
# task_get ID: one read (repeated once if polled too soon); OUT/RC.
task_get() {
  run_cx taskgate task get "$1"
  if [ "$RC" -ne 0 ] && grep -q TG_TASK_POLL_TOO_SOON <<<"$OUT"; then
    sleep 1.5
    run_cx taskgate task get "$1"
  fi
}
# task_present ID TEXT: the task reads completed with its text.
task_present() {
  task_get "$1"
  [ "$RC" -eq 0 ] && grep -q "\"taskId\": *\"$1\"" <<<"$OUT" && grep -q '"status": *"completed"' <<<"$OUT" \
    && grep -q "\"text\": *\"$2\"" <<<"$OUT"
}

# 4. A task survives a restart.
check_restart_durability() {
  create_task survivor || return 1
  local id=$TASK_ID old new
  old=$(unit_prop MainPID)
  run_cx systemctl restart taskgate.service
  [ "$RC" -eq 0 ] || { WHY="systemctl restart exited $RC: $(oneline "$OUT")"; return 1; }
  new=$(unit_prop MainPID)
  [ "$new" != "$old" ] && [ "$new" != 0 ] || { WHY="MainPID $old -> $new: not restarted"; return 1; }
  task_present "$id" survivor || { WHY="after the restart, task get $id (exit $RC): $(oneline "$OUT")"; return 1; }
  INFO="$id completed before and after restart (MainPID $old -> $new)"
}
run_check task-survives-restart check_restart_durability

# 5. The lifetime lock refuses a second process (75).
check_lock_serve() {
  run_cx runuser -u taskgate -- timeout 20 taskgate serve --config /etc/taskgate/taskgate.toml \
    --state-dir /var/lib/taskgate --listen 127.0.0.1:0
  [ "$RC" -eq 75 ] || { WHY="second serve exited $RC, want 75: $(oneline "$OUT")"; return 1; }
  [ "$(unit_prop ActiveState)" = active ] || { WHY="the service is no longer active"; return 1; }
  # The holder comes from the kernel's lock table, not the file.
  grep -q "(pid $(unit_prop MainPID), taskgate)" <<<"$OUT" \
    || { WHY="the refusal does not name the service's MainPID as the holder: $(oneline "$OUT")"; return 1; }
  INFO="exit 75: $(oneline "$OUT" | cut -c1-110)"
}
run_check lock-refuses-second-serve check_lock_serve

check_lock_check() {
  run_cx timeout 20 taskgate check --config /etc/taskgate/taskgate.toml --state-dir /var/lib/taskgate
  [ "$RC" -eq 75 ] || { WHY="taskgate check as root exited $RC, want 75: $(oneline "$OUT")"; return 1; }
  INFO="taskgate check as root: exit 75"
}
run_check lock-refuses-check check_lock_check

# The operator command docs/operations.md gives (`taskgate check --config
# /etc/taskgate/taskgate.toml`, e.g. before a manual backup) must look at the
# service's state directory and see its lock.
check_operator_check() {
  run_cx timeout 20 taskgate check --config /etc/taskgate/taskgate.toml
  [ "$RC" -eq 75 ] || { WHY="'taskgate check --config /etc/taskgate/taskgate.toml' as root exited $RC while the service runs, want 75: $(oneline "$OUT")"; return 1; }
  INFO="exit 75 without --state-dir"
}
run_check operator-check-sees-service-state check_operator_check

# ------------------------------------------- configuration test and reload --
# `taskgate check --config-only` takes no lock: it passes while the service
# serves (as the service user and as root), and the unit runs it before
# every start.
check_config_only() {
  local pid pre
  pid=$(unit_prop MainPID)
  run_cx runuser -u taskgate -- taskgate check --config-only --config /etc/taskgate/taskgate.toml
  [ "$RC" -eq 0 ] || { WHY="check --config-only as taskgate exited $RC while serving: $(oneline "$OUT")"; return 1; }
  grep -q '^ok: configuration /etc/taskgate/taskgate.toml: 1 tools' <<<"$OUT" || { WHY="unexpected output: $(oneline "$OUT")"; return 1; }
  run_cx taskgate check --config-only --config /etc/taskgate/taskgate.toml
  [ "$RC" -eq 0 ] || { WHY="check --config-only as root exited $RC while serving: $(oneline "$OUT")"; return 1; }
  pre=$(unit_prop ExecStartPre)
  grep -q 'check --config-only --config /etc/taskgate/taskgate.toml' <<<"$pre" || { WHY="ExecStartPre= does not run the check: $(oneline "$pre")"; return 1; }
  [ "$(unit_prop MainPID)" = "$pid" ] || { WHY="the service restarted meanwhile"; return 1; }
  INFO="exit 0 as taskgate and root while MainPID $pid serves; $(oneline "$(head -n1 <<<"$OUT")")"
}
run_check config-check-while-serving check_config_only

# reload_and_wait EXPECT: systemctl reload, which is synchronous (the
# unit's ExecReload= is `taskgate reload`, answered once the daemon has
# applied the file and sent READY=1), so the daemon's STATUS= must contain
# EXPECT the moment it returns: no polling. systemd reads the READY=1
# datagram before it reaps the control process that ends the reload job.
reload_and_wait() {
  local st
  run_cx systemctl reload taskgate.service
  [ "$RC" -eq 0 ] || { WHY="systemctl reload exited $RC: $(oneline "$OUT")"; return 1; }
  st=$(unit_prop StatusText)
  case $st in *"$1"*) return 0 ;; esac
  WHY="STATUS= did not say \"$1\" when systemctl reload returned (the reload is not synchronous): $(oneline "$st")"
  return 1
}

# A restart while a tool runs: the daemon stops its own tools
# (KillMode=mixed: systemd's SIGTERM goes to the daemon alone, and only what
# is left after the stop is killed), so every run reads TG_TASK_INTERRUPTED,
# never TG_TOOL_KILLED (under control-group the tool got SIGTERM at the same
# moment and, dying first, was recorded as killed in about one restart in
# four). RESTART_ROUNDS restarts, each with a task running.
RESTART_ROUNDS=20
RESTART_SAVED=/root/taskgate.toml.restart-test
check_restart_interrupts() {
  local rc=0
  cx cp -p /etc/taskgate/taskgate.toml "$RESTART_SAVED" || { WHY="cannot save the conffile"; return 1; }
  restart_rounds || rc=1
  # The conffile and a running service for the checks after this one, also
  # when a round failed.
  cx cp -p "$RESTART_SAVED" /etc/taskgate/taskgate.toml || { WHY="cannot restore the conffile"; return 1; }
  cx systemctl reset-failed taskgate.service >/dev/null 2>&1 || true
  run_cx systemctl restart taskgate.service
  [ "$rc" -eq 0 ] || return 1
  [ "$RC" -eq 0 ] || { WHY="the last restart exited $RC: $(oneline "$OUT")"; return 1; }
}
restart_rounds() {
  local i id interrupted=0 pid
  run_cx sh -c 'cat >>/etc/taskgate/taskgate.toml <<EOF

# Added by scripts/system-test.sh (restarts): a task that outlives a restart.
[[tool]]
name = "longnap"
description = "Sleeps for a while (system test)."
argv = ["/usr/bin/sleep", "30"]
effect = "read_only"
task = "required"
timeout_secs = 60
EOF'
  [ "$RC" -eq 0 ] || { WHY="cannot add the tool: $(oneline "$OUT")"; return 1; }
  for i in $(seq 1 "$RESTART_ROUNDS"); do
    # Each round is a start; the start limit would otherwise end the loop.
    cx systemctl reset-failed taskgate.service >/dev/null 2>&1 || true
    run_cx systemctl restart taskgate.service
    [ "$RC" -eq 0 ] || { WHY="round $i: systemctl restart exited $RC: $(oneline "$OUT")"; return 1; }
    run_cx taskgate call longnap --task
    id=$(grep -o '"taskId": *"tg-[0-9a-f]*"' <<<"$OUT" | grep -o 'tg-[0-9a-f]*' | head -n1)
    [ -n "$id" ] || { WHY="round $i: longnap returned no task (exit $RC): $(oneline "$OUT")"; return 1; }
    # Its process is running before the restart (the daemon counts runs).
    for _ in $(seq 1 50); do
      run_cx taskgate task get "$id"
      grep -q '"status": *"working"' <<<"$OUT" && break
      sleep 0.1
    done
    pid=$(unit_prop MainPID)
    cx systemctl reset-failed taskgate.service >/dev/null 2>&1 || true
    run_cx systemctl restart taskgate.service
    [ "$RC" -eq 0 ] || { WHY="round $i: systemctl restart exited $RC: $(oneline "$OUT")"; return 1; }
    [ "$(unit_prop MainPID)" != "$pid" ] || { WHY="round $i: MainPID $pid not restarted"; return 1; }
    run_cx taskgate task get "$id"
    if grep -q 'TG_TASK_INTERRUPTED' <<<"$OUT"; then
      interrupted=$((interrupted + 1))
    else
      WHY="round $i: task $id after the restart is not TG_TASK_INTERRUPTED: $(oneline "$OUT")"
      return 1
    fi
  done
  INFO="$interrupted of $RESTART_ROUNDS restarts with a running tool read TG_TASK_INTERRUPTED"
}
run_check restart-with-running-tool-reads-interrupted check_restart_interrupts

CONF_SAVED=/root/taskgate.toml.system-test
# A reload adds a tool that a new call can use at once; a later reload that
# also changes a startup-only key (server.max_connections) applies the new
# tool and refuses that key by name in the journal, while a task started
# before it keeps running and then completes. The main PID never changes.
check_reload() {
  local pid id refused
  pid=$(unit_prop MainPID)
  cx cp -p /etc/taskgate/taskgate.toml "$CONF_SAVED" || { WHY="cannot save the conffile"; return 1; }
  run_cx sh -c 'cat >>/etc/taskgate/taskgate.toml <<EOF

# Added by scripts/system-test.sh (reload): a task that runs for a while.
[[tool]]
name = "nap"
description = "Sleeps for the given seconds (system test)."
argv = ["/usr/bin/sleep", "{seconds}"]
effect = "read_only"
task = "optional"
timeout_secs = 60
[tool.input_schema]
type = "object"
required = ["seconds"]
[tool.input_schema.properties.seconds]
type = "string"
pattern = "^[0-9]$"
EOF'
  reload_and_wait "reload 1 applied" || return 1
  run_cx taskgate call nap --args '{"seconds": "6"}' --task
  [ "$RC" -eq 0 ] || { WHY="the reloaded tool nap cannot be called (exit $RC): $(oneline "$OUT")"; return 1; }
  id=$(grep -o '"taskId": *"tg-[0-9a-f]*"' <<<"$OUT" | grep -o 'tg-[0-9a-f]*' | head -n1)
  [ -n "$id" ] || { WHY="nap returned no task: $(oneline "$OUT")"; return 1; }
  # Second reload while nap runs: a new tool, and a startup-only key changed.
  run_cx sh -c 'sed -i "s/^max_connections = 256\$/max_connections = 300/" /etc/taskgate/taskgate.toml &&
    grep -q "^max_connections = 300\$" /etc/taskgate/taskgate.toml &&
    sed "s/^name = \"probe\"\$/name = \"probe2\"/" "'"$CONF_SAVED"'" | sed -n "/^# Added by scripts\/system-test.sh: a quick/,\$p" >>/etc/taskgate/taskgate.toml'
  [ "$RC" -eq 0 ] || { WHY="cannot edit the conffile: $(oneline "$OUT")"; return 1; }
  reload_and_wait "reload 2 applied, except startup-only server.max_connections" || return 1
  refused=$(cx journalctl -u taskgate.service --no-pager -o cat | grep -c 'server.max_connections = 300 in the new configuration, but it applies at start only; keeping 256')
  [ "$refused" = 1 ] || { WHY="the journal names the refused key $refused times, want 1"; return 1; }
  run_cx taskgate call probe2 --args '{"text": "reloaded"}'
  [ "$RC" -eq 0 ] && grep -q reloaded <<<"$OUT" || { WHY="probe2 added by the reload does not answer (exit $RC): $(oneline "$OUT")"; return 1; }
  run_cx taskgate task get "$id"
  grep -q '"status": *"working"' <<<"$OUT" || { WHY="task $id is not working after the reload: $(oneline "$OUT")"; return 1; }
  run_cx taskgate task get "$id" --wait
  [ "$RC" -eq 0 ] && grep -q '"status": *"completed"' <<<"$OUT" || { WHY="task $id did not complete after the reloads (exit $RC): $(oneline "$OUT")"; return 1; }
  [ "$(unit_prop MainPID)" = "$pid" ] || { WHY="MainPID changed $pid -> $(unit_prop MainPID): the reload restarted the daemon"; return 1; }
  # Back to the file the other checks expect.
  cx cp -p "$CONF_SAVED" /etc/taskgate/taskgate.toml || { WHY="cannot restore the conffile"; return 1; }
  reload_and_wait "reload 3 applied" || return 1
  INFO="nap added (task $id ran across the second reload and completed), probe2 added, server.max_connections refused by name; MainPID $pid throughout"
}
run_check reload-applies-tools-keeps-running-task check_reload

# Synchronous reload refusing a bad file: `systemctl reload` runs
# `taskgate reload`, which waits for the daemon's answer, so an invalid
# file fails the reload with the daemon's reason in the journal, and the
# daemon keeps serving on its previous configuration. `taskgate reload` by
# hand exits 78 naming the key.
check_reload_invalid() {
  local pid rc byhand
  pid=$(unit_prop MainPID)
  run_cx sh -c 'sed -i "s/^max_connections = 256\$/max_connection = 256/" /etc/taskgate/taskgate.toml && grep -q "^max_connection = 256\$" /etc/taskgate/taskgate.toml'
  [ "$RC" -eq 0 ] || { WHY="cannot break the conffile: $(oneline "$OUT")"; return 1; }
  run_cx systemctl reload taskgate.service
  rc=$RC
  run_cx taskgate reload --config /etc/taskgate/taskgate.toml
  byhand_rc=$RC byhand=$OUT
  cx cp -p "$CONF_SAVED" /etc/taskgate/taskgate.toml
  # The whole line, not `oneline` (which cuts it at 400 characters).
  [ "$byhand_rc" -eq 78 ] && grep -qF 'unknown key `max_connection`' <<<"$byhand" && grep -qF 'goes on with its previous configuration' <<<"$byhand" \
    || { WHY="taskgate reload of an invalid file: want exit 78 naming the key, got $byhand_rc: $(oneline "$byhand")"; return 1; }
  [ "$rc" -ne 0 ] || { WHY="systemctl reload of an invalid file exited 0"; return 1; }
  [ "$(unit_prop ActiveState)/$(unit_prop SubState)" = active/running ] || { WHY="not active/running after a refused reload"; return 1; }
  [ "$(unit_prop MainPID)" = "$pid" ] || { WHY="MainPID changed after a refused reload"; return 1; }
  run_cx taskgate call probe --args '{"text": "still"}'
  [ "$RC" -eq 0 ] && grep -q still <<<"$OUT" || { WHY="probe does not answer after a refused reload (exit $RC): $(oneline "$OUT")"; return 1; }
  cx journalctl -u taskgate.service --no-pager -o cat | grep 'configuration reload refused' | grep -q 'unknown key `max_connection`' \
    || { WHY="the journal lacks the daemon's refusal line"; return 1; }
  case $(unit_prop StatusText) in *"refused (invalid configuration"*) ;;
    *) WHY="STATUS= does not report the refused reload: $(oneline "$(unit_prop StatusText)")"; return 1 ;; esac
  INFO="systemctl reload exited $rc, taskgate reload exited $byhand_rc naming the key, MainPID $pid kept, probe answers"
}
run_check reload-refuses-invalid-conffile check_reload_invalid

# Log filter reload: `[log] filter` made verbose in the conffile and applied
# by `systemctl reload` lets taskgate's debug events into the journal (a
# task's creation is one), without a restart; an invalid filter fails the
# reload and the verbose one stays; then back to the packaged filter.
debug_events() { cx journalctl -u taskgate.service --no-pager -o cat | grep -c 'task created; starting it'; }
check_reload_log_filter() {
  local pid n0 n1 i rc
  pid=$(unit_prop MainPID)
  n0=$(debug_events)
  run_cx sh -c 'sed -i "s/^filter = .*/filter = \"info,taskgate=debug\"/" /etc/taskgate/taskgate.toml && grep -q "^filter = \"info,taskgate=debug\"\$" /etc/taskgate/taskgate.toml'
  [ "$RC" -eq 0 ] || { WHY="cannot set [log] filter in the conffile: $(oneline "$OUT")"; return 1; }
  run_cx systemctl reload taskgate.service
  [ "$RC" -eq 0 ] || { WHY="systemctl reload with a verbose filter exited $RC: $(oneline "$OUT")"; return 1; }
  run_cx taskgate call probe --args '{"text": "verbose"}' --task --wait
  [ "$RC" -eq 0 ] || { WHY="probe as a task failed after the filter reload (exit $RC): $(oneline "$OUT")"; return 1; }
  # The event is asserted, not waited for: journald may take a moment to
  # store what it received.
  for i in $(seq 1 50); do
    n1=$(debug_events)
    [ "$n1" -gt "$n0" ] && break
    sleep 0.1
  done
  [ "$n1" -gt "$n0" ] || { WHY="no debug event in the journal after reloading [log] filter = info,taskgate=debug ($n0 before, $n1 after)"; return 1; }
  run_cx sh -c 'sed -i "s/^filter = .*/filter = \"info,taskgate=loud\"/" /etc/taskgate/taskgate.toml'
  run_cx systemctl reload taskgate.service
  rc=$RC
  cx cp -p "$CONF_SAVED" /etc/taskgate/taskgate.toml || { WHY="cannot restore the conffile"; return 1; }
  [ "$rc" -ne 0 ] || { WHY="systemctl reload with an invalid filter exited 0"; return 1; }
  cx journalctl -u taskgate.service --no-pager -o cat | grep 'configuration reload refused' | grep -q 'log.filter' \
    || { WHY="the journal does not name log.filter in the refused reload"; return 1; }
  run_cx systemctl reload taskgate.service
  [ "$RC" -eq 0 ] || { WHY="systemctl reload back to the packaged filter exited $RC"; return 1; }
  [ "$(unit_prop MainPID)" = "$pid" ] || { WHY="MainPID changed $pid -> $(unit_prop MainPID)"; return 1; }
  INFO="debug events $n0 -> $n1 after the filter reload; invalid filter refused by systemctl reload (exit $rc); MainPID $pid throughout"
}
run_check reload-applies-log-filter check_reload_log_filter

# Credentials under the hardened unit (User=taskgate, PrivateUsers=yes): a
# tokens file made from `taskgate token new`, root:taskgate 0640, is read
# by the service when authentication is turned on (a restart); `taskgate
# token revoke` keeps its mode and owner and `systemctl reload` applies it;
# a tokens file other users may read fails the reload naming the file, and
# the daemon keeps serving. The secret reaches no log. Afterwards the
# packaged conffile is put back and the service restarted (turning
# authentication off takes a restart).
check_credentials() {
  local pid rc byhand secret
  run_cx sh -c 'umask 077 &&
taskgate token new --id system-test --tenant test --subject system-test --scope tasks:read >/root/token.out &&
sed -n "3,\$p" /root/token.out >/etc/taskgate/tokens.toml &&
chown root:taskgate /etc/taskgate/tokens.toml && chmod 0640 /etc/taskgate/tokens.toml &&
sed -i "s|^# tokens_file = .*|tokens_file = \"/etc/taskgate/tokens.toml\"|" /etc/taskgate/taskgate.toml &&
grep -q "^tokens_file = \"/etc/taskgate/tokens.toml\"\$" /etc/taskgate/taskgate.toml &&
systemctl restart taskgate.service'
  [ "$RC" -eq 0 ] || { WHY="restart with a root:taskgate 0640 tokens file failed (exit $RC): $(oneline "$OUT") $(oneline "$(unit_prop StatusText)")"; return 1; }
  [ "$(unit_prop ActiveState)/$(unit_prop SubState)" = active/running ] || { WHY="not active/running with the tokens file: $(oneline "$(unit_prop StatusText)")"; return 1; }
  pid=$(unit_prop MainPID)
  run_cx taskgate check --config-only --config /etc/taskgate/taskgate.toml
  case $OUT in *"authentication: on: 1 static tokens"*) ;;
    *) WHY="check --config-only does not report the token (exit $RC): $(oneline "$OUT")"; return 1 ;; esac
  run_cx sh -c 'taskgate token revoke system-test --config /etc/taskgate/taskgate.toml && stat -c "mode %a %U:%G" /etc/taskgate/tokens.toml && grep -c "^revoked = true" /etc/taskgate/tokens.toml'
  case $OUT in *"systemctl reload taskgate"*"mode 640 root:taskgate"*) ;;
    *) WHY="taskgate token revoke (exit $RC): $(oneline "$OUT")"; return 1 ;; esac
  run_cx systemctl reload taskgate.service
  [ "$RC" -eq 0 ] || { WHY="systemctl reload after the revocation exited $RC: $(oneline "$OUT")"; return 1; }
  run_cx chmod 0644 /etc/taskgate/tokens.toml
  run_cx systemctl reload taskgate.service
  rc=$RC
  run_cx taskgate reload --config /etc/taskgate/taskgate.toml
  byhand="$RC $(oneline "$OUT")"
  secret=$(cx head -n 1 /root/token.out)
  cx cp -p "$CONF_SAVED" /etc/taskgate/taskgate.toml
  cx rm -f /etc/taskgate/tokens.toml /root/token.out
  [ "$rc" -ne 0 ] || { WHY="systemctl reload with a world-readable tokens file exited 0"; return 1; }
  case $byhand in 7[78]" "*tokens.toml*) ;;
    *) WHY="taskgate reload with a world-readable tokens file: want 77 or 78 naming the file, got: $byhand"; return 1 ;; esac
  [ "$(unit_prop ActiveState)" = active ] && [ "$(unit_prop MainPID)" = "$pid" ] \
    || { WHY="the daemon did not keep serving after the refused reload (MainPID $pid -> $(unit_prop MainPID))"; return 1; }
  case $secret in tgk_*) ;; *) WHY="token new printed no secret on its first line"; return 1 ;; esac
  if cx journalctl --no-pager -o cat | grep -qF "$secret"; then WHY="the token's secret is in the journal"; return 1; fi
  run_cx systemctl restart taskgate.service
  [ "$RC" -eq 0 ] && [ "$(unit_prop ActiveState)" = active ] || { WHY="restart on the packaged conffile failed (exit $RC): $(oneline "$OUT")"; return 1; }
  INFO="service read the 0640 root:taskgate tokens file; revoke kept mode and owner and reloaded; world-readable file refused by reload ($byhand); MainPID $pid kept; secret not in the journal"
}
run_check credentials-under-the-unit check_credentials

# ------------------------------------------- tool confinement under the unit --
# Tools run inside the unit's sandbox and, inside it, under their own
# confinement (Landlock, limits, the subreaper shim). With probe tools added
# to the conffile: status, check and the journal say what is in force; a
# tool cannot read, list or write the state directory the unit lets the
# daemon write; a setsid grandchild dies with a cancel and with SIGKILL of
# the main process; a bounded fork bomb fails its task with TG_TOOL_LIMIT
# while /healthz answers; the running unit's exposure score is recorded.
# The conffile is put back (and the service restarted) afterwards.
CONF_CONFINE=/root/taskgate.toml.confinement
check_confinement_setup() {
  cx cp -p /etc/taskgate/taskgate.toml "$CONF_CONFINE" || { WHY="cannot save the conffile"; return 1; }
  # Written from the host into the container's tree: the tools' shell
  # scripts hold quotes that would not survive another level of sh -c.
  cat >>"$rootfs/etc/taskgate/taskgate.toml" <<'EOF'

# Added by scripts/system-test.sh (confinement): probes of the per-tool sandbox.
[[tool]]
name = "cprobe"
description = "Tries the state directory, then its scratch directory (system test)."
argv = ["/bin/sh", "-c", "for p in 'cat /var/lib/taskgate/tasks.db' 'ls /var/lib/taskgate' 'touch /var/lib/taskgate/stray'; do if e=$($p 2>&1 >/dev/null); then echo \"reached: $p\"; else echo \"denied: $p: $e\"; fi; done; touch ./scratch && echo \"scratch: $(pwd)\""]
effect = "read_only"
timeout_secs = 20

[[tool]]
name = "clister"
description = "Lists a path; its argv invites option injection (system test)."
argv = ["/bin/ls", "-l", "{path}"]
effect = "read_only"
[tool.input_schema]
type = "object"
[tool.input_schema.properties.path]
type = "string"

[[tool]]
name = "cspawn"
description = "Starts a grandchild that leaves its session with setsid (system test)."
argv = ["/bin/sh", "-c", "setsid sh -c 'exec sleep 985' & sleep 984"]
effect = "read_only"
task = "optional"
timeout_secs = 120

[[tool]]
name = "cbomb"
description = "A fork bomb bounded at ten levels, held to 32 processes (system test)."
argv = ["/bin/sh", "-c", "f() {{ if [ $1 -lt 9 ]; then f $(($1+1)) & f $(($1+1)) & fi; exec sleep 30; }}; f 0"]
effect = "read_only"
task = "optional"
timeout_secs = 60
max_processes = 32
EOF
  run_cx systemctl restart taskgate.service
  [ "$RC" -eq 0 ] || { WHY="restart with the probe tools failed (exit $RC): $(oneline "$OUT")"; return 1; }
  run_cx taskgate status
  local line
  line=$(grep '^tool confinement: ' <<<"$OUT")
  grep -q '^tool confinement: Landlock ABI [1-9]' <<<"$line" || { WHY="status shows no Landlock ABI: $(oneline "$OUT")"; return 1; }
  grep -q 'subreaper kills every descendant' <<<"$line" || { WHY="status does not name the subreaper kill: $(oneline "$line")"; return 1; }
  grep -q '^tool "cbomb": confined (Landlock); .*max_processes 32,' <<<"$OUT" || { WHY="status lacks cbomb's sandbox and limits: $(oneline "$OUT")"; return 1; }
  run_cx taskgate status --json
  grep -q '"landlock_abi": *[1-9]' <<<"$OUT" && grep -q '"sandbox": *"confined"' <<<"$OUT" \
    || { WHY="status --json lacks the confinement fields: $(oneline "$OUT")"; return 1; }
  run_cx taskgate check --config-only --config /etc/taskgate/taskgate.toml
  [ "$RC" -eq 0 ] && grep -qF "$line" <<<"$OUT" || { WHY="check does not print the status's confinement line (exit $RC): $(oneline "$OUT")"; return 1; }
  cx journalctl -u taskgate.service -p warning --no-pager -o cat | grep -q 'tool "clister": argv element 2 starts with {path}' \
    || { WHY="the option-injection warning is not in the journal at warning priority"; return 1; }
  INFO="$line"
}
run_check tool-confinement-in-force check_confinement_setup

check_confinement_state_dir() {
  run_cx taskgate call cprobe
  [ "$RC" -eq 0 ] || { WHY="taskgate call cprobe exited $RC: $(oneline "$OUT")"; return 1; }
  local what
  for what in 'cat /var/lib/taskgate/tasks.db' 'ls /var/lib/taskgate' 'touch /var/lib/taskgate/stray'; do
    # One probe's line: the JSON text escapes newlines, so stop at a backslash.
    grep -q "denied: $what: [^\\]*Permission denied" <<<"$OUT" || { WHY="$what was not refused with EACCES: $(oneline "$OUT")"; return 1; }
  done
  grep -q 'scratch: /run/taskgate/' <<<"$OUT" || { WHY="the tool did not write its scratch directory under /run/taskgate: $(oneline "$OUT")"; return 1; }
  ! cx test -e /var/lib/taskgate/stray || { WHY="/var/lib/taskgate/stray exists"; return 1; }
  state_dir_ok || return 1
  INFO="tasks.db, listing and writing /var/lib/taskgate: Permission denied; $(grep -o 'scratch: [^"\\]*' <<<"$OUT" | head -n1)"
}
run_check tool-denied-state-directory check_confinement_state_dir

# spawned_sleeps: both sleeps of cspawn exist (up to 20 s).
spawned_sleeps() {
  local i
  for i in $(seq 1 100); do
    cx pgrep -fx 'sleep 985' >/dev/null && cx pgrep -fx 'sleep 984' >/dev/null && return 0
    sleep 0.2
  done
  WHY="the tool's sleeps did not both start: 985: $(cx pgrep -fx 'sleep 985' | tr '\n' ' ') 984: $(cx pgrep -fx 'sleep 984' | tr '\n' ' ')"
  return 1
}
# process_absent CMDLINE: true only when pgrep inside the container ran and
# found no such process (exit 1); a failed nsenter or a timeout is not
# "gone".
process_absent() {
  [ "$(cx /bin/sh -c 'pgrep -fx "$1" >/dev/null; echo "pgrep=$?"' sh "$1" 2>>"$log")" = "pgrep=1" ]
}
# sleeps_gone SECONDS: neither sleep of cspawn is left after SECONDS.
SLEEPS_GONE_AFTER=""
sleeps_gone() {
  local i t0=$(date +%s.%N)
  for i in $(seq 1 $(($1 * 5))); do
    if process_absent 'sleep 985' && process_absent 'sleep 984'; then
      SLEEPS_GONE_AFTER=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
      return 0
    fi
    sleep 0.2
  done
  WHY="still running after $1 s: sleep 985 (setsid grandchild): $(cx pgrep -fx 'sleep 985' | tr '\n' ' '); sleep 984: $(cx pgrep -fx 'sleep 984' | tr '\n' ' ')"
  return 1
}
# start_spawner -> TASK_ID of a running cspawn task, its sleeps running.
start_spawner() {
  run_cx taskgate call cspawn --task
  TASK_ID=$(grep -o '"taskId": *"tg-[0-9a-f]*"' <<<"$OUT" | grep -o 'tg-[0-9a-f]*' | head -n1)
  [ -n "$TASK_ID" ] || { WHY="cspawn returned no task (exit $RC): $(oneline "$OUT")"; return 1; }
  spawned_sleeps
}

check_confinement_cancel() {
  start_spawner || return 1
  local id=$TASK_ID
  run_cx taskgate task cancel "$id"
  [ "$RC" -eq 0 ] || { WHY="taskgate task cancel $id exited $RC: $(oneline "$OUT")"; return 1; }
  sleeps_gone 15 || return 1
  INFO="task $id cancelled; the setsid grandchild and the child gone ${SLEEPS_GONE_AFTER}s after the cancel"
}
run_check tool-grandchild-dies-with-cancel check_confinement_cancel

# SIGKILL of the main process only (not systemctl kill, which signals the
# whole cgroup): the shim's parent-death signal ends the tool's processes.
# systemd then also kills what is left of the unit's cgroup before the
# restart, so outside the unit tests/tool_confinement.rs shows the shim's
# part alone.
check_confinement_daemon_kill() {
  start_spawner || return 1
  local id=$TASK_ID old new i
  old=$(unit_prop MainPID)
  run_cx sh -c "kill -KILL $old"
  [ "$RC" -eq 0 ] || { WHY="kill -KILL $old failed: $(oneline "$OUT")"; return 1; }
  sleeps_gone 15 || return 1
  local gone=$SLEEPS_GONE_AFTER
  for i in $(seq 1 100); do
    new=$(unit_prop MainPID)
    [ -n "$new" ] && [ "$new" != 0 ] && [ "$new" != "$old" ] && [ "$(unit_prop ActiveState)/$(unit_prop SubState)" = active/running ] && break
    sleep 0.2
  done
  [ "$new" != "$old" ] && [ "$(unit_prop ActiveState)" = active ] || { WHY="not restarted after SIGKILL of $old: MainPID $new, $(unit_prop ActiveState)"; return 1; }
  task_get "$id"
  grep -q '"status": *"failed"' <<<"$OUT" || { WHY="task $id after the restart: $(oneline "$OUT")"; return 1; }
  INFO="kill -9 of MainPID $old: both sleeps gone after ${gone}s, restarted as $new, task $id failed (interrupted)"
}
run_check tool-grandchild-dies-with-daemon-kill check_confinement_daemon_kill

check_confinement_fork_bomb() {
  cat >"$rootfs/root/confine-bomb.sh" <<'EOF'
#!/bin/bash
# Runs the bounded fork bomb as a task and waits for it, asking /healthz
# every 0.2 s meanwhile.
health() {
  local line=""
  { printf 'GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' >&5
    read -r -t 5 line <&5; } 5<>/dev/tcp/127.0.0.1/8765 2>/dev/null || return 1
  case $line in "HTTP/1.1 200"*) return 0 ;; esac
  return 1
}
taskgate call cbomb --task --wait >/root/confine-bomb.out 2>&1 &
call=$!
ok=0 bad=0
while kill -0 "$call" 2>/dev/null; do
  if health; then ok=$((ok + 1)); else bad=$((bad + 1)); fi
  sleep 0.2
done
wait "$call"
echo "call exit $?; healthz ok $ok failed $bad"
cat /root/confine-bomb.out
EOF
  local t0 took left i
  t0=$(date +%s.%N)
  CX_TIMEOUT=120 run_cx bash /root/confine-bomb.sh
  took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  local summary
  summary=$(head -n1 <<<"$OUT")
  grep -q '"status": *"failed"' <<<"$OUT" && grep -q 'max_processes' <<<"$OUT" \
    || { WHY="the bomb's task did not fail naming max_processes ($summary): $(oneline "$OUT")"; return 1; }
  grep -q 'TG_TOOL_LIMIT' <<<"$OUT" || { WHY="no TG_TOOL_LIMIT in the task's error: $(oneline "$OUT")"; return 1; }
  grep -q 'healthz ok [1-9][0-9]* failed 0$' <<<"$summary" || { WHY="/healthz did not answer throughout: $summary"; return 1; }
  for i in $(seq 1 50); do
    left=$(cx pgrep -u taskgate -fx 'sleep 30' | wc -l)
    [ "$left" -eq 0 ] && break
    sleep 0.2
  done
  [ "$left" -eq 0 ] || { WHY="$left of the bomb's sleeps are left"; return 1; }
  [ "$(unit_prop ActiveState)" = active ] || { WHY="the service is not active after the bomb"; return 1; }
  INFO="$summary; task failed with TG_TOOL_LIMIT naming max_processes in ${took}s; no process of the bomb left"
}
run_check tool-fork-bomb-bounded-healthz-answers check_confinement_fork_bomb

# The exposure score of the unit as systemd runs it (the offline score of
# the unit file is unit-security-score).
check_running_exposure() {
  local score
  run_cx systemd-analyze security --no-pager taskgate.service
  score=$(printf '%s\n' "$OUT" | sed -n 's/.*Overall exposure level for [^:]*: \([0-9][0-9.]*\).*/\1/p' | tail -n1)
  [ -n "$score" ] || { WHY="no exposure level (exit $RC): $(oneline "$(tail -n 3 <<<"$OUT")")"; return 1; }
  awk -v s="$score" 'BEGIN { exit !(s <= 1.0) }' || { WHY="exposure $score > 1.0 under systemd"; return 1; }
  INFO="systemd-analyze security taskgate.service in the container: exposure $score <= 1.0"
}
run_check unit-exposure-running check_running_exposure

# Back to the conffile the later checks expect.
cx cp -p "$CONF_CONFINE" /etc/taskgate/taskgate.toml >>"$log" 2>&1
run_cx systemctl restart taskgate.service
[ "$RC" -eq 0 ] || note "restart after the confinement checks exited $RC: $(oneline "$OUT")"

watchdog_timeouts() { cx journalctl -b -u taskgate.service --no-pager -o cat 2>/dev/null | grep -ci 'watchdog timeout'; }

# 6. The watchdog restarts a hung (stopped) daemon.
WATCHDOG_COUNT=""
check_watchdog() {
  local old new state sub before after t0 elapsed i nr0 nr1
  old=$(unit_prop MainPID)
  [ -n "$old" ] && [ "$old" != 0 ] || { WHY="no MainPID"; return 1; }
  before=$(watchdog_timeouts)
  nr0=$(unit_prop NRestarts)
  t0=$(date +%s.%N)
  run_cx sh -c "kill -STOP $old" # the shell's kill: the container has no procps
  [ "$RC" -eq 0 ] || { WHY="kill -STOP $old failed: $OUT"; return 1; }
  for i in $(seq 1 120); do
    sleep 0.5
    new=$(unit_prop MainPID)
    state=$(unit_prop ActiveState)
    sub=$(unit_prop SubState)
    if [ -n "$new" ] && [ "$new" != 0 ] && [ "$new" != "$old" ] && [ "$state/$sub" = active/running ]; then break; fi
  done
  elapsed=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  if [ "$new" = "$old" ] || [ "$new" = 0 ] || [ "$state/$sub" != active/running ]; then
    cx sh -c "kill -CONT $old" 2>/dev/null
    WHY="after ${elapsed}s: MainPID $old -> $new, $state/$sub"
    return 1
  fi
  ! cx test -d "/proc/$old" || { WHY="the hung process $old still exists after the restart"; return 1; }
  after=$(watchdog_timeouts)
  WATCHDOG_COUNT=$after
  [ "$after" -gt "$before" ] || { WHY="restarted but the journal shows no watchdog timeout"; return 1; }
  nr1=$(unit_prop NRestarts)
  # WatchdogSec=3s + RestartSec=2s + start; far beyond that means the kill waited for a timeout.
  awk -v e="$elapsed" 'BEGIN { exit !(e <= 20) }' || { WHY="took ${elapsed}s (WatchdogSec=3s, RestartSec=2s)"; return 1; }
  INFO="MainPID $old -> $new in ${elapsed}s, NRestarts $nr0 -> $nr1, journal: $(cx journalctl -b -u taskgate.service --no-pager -o cat | grep -i 'watchdog timeout' | tail -n1)"
}
run_check watchdog-restarts-hung-daemon check_watchdog

# 7. Backup, then restore.
TASK_A=""
check_backup_restore() {
  create_task alpha || return 1
  TASK_A=$TASK_ID
  run_cx taskgate-backup /root/backup-1
  [ "$RC" -eq 0 ] || { WHY="taskgate-backup exited $RC: $(oneline "$OUT")"; return 1; }
  [ "$(unit_prop ActiveState)" = active ] || { WHY="not active after taskgate-backup"; return 1; }
  local bmode
  bmode=$(cx stat -c '%a %U' /root/backup-1)
  [ "$bmode" = "700 root" ] || { WHY="/root/backup-1 is $bmode, want 700 root"; return 1; }
  run_cx sh -c 'cd /root/backup-1 && sha256sum -c MANIFEST.sha256'
  [ "$RC" -eq 0 ] || { WHY="sha256sum -c of the backup's manifest failed: $(oneline "$OUT")"; return 1; }
  create_task bravo || return 1
  local task_b=$TASK_ID
  run_cx taskgate-restore /root/backup-1
  [ "$RC" -eq 0 ] || { WHY="taskgate-restore exited $RC: $(oneline "$OUT")"; return 1; }
  [ "$(unit_prop ActiveState)" = active ] || { WHY="not active after taskgate-restore: $(unit_prop StatusText)"; return 1; }
  task_present "$TASK_A" alpha || { WHY="task A $TASK_A missing after restore (exit $RC): $(oneline "$OUT")"; return 1; }
  # The code is read from the installed binary's registry, not copied.
  local not_found
  not_found=$(cx taskgate wire-codes | awk -F'\t' '$2 == "TG_TASK_NOT_FOUND" { print $1 }')
  [ -n "$not_found" ] || { WHY="taskgate wire-codes lists no TG_TASK_NOT_FOUND"; return 1; }
  task_get "$task_b"
  [ "$RC" -eq 76 ] && grep -q -- "$not_found" <<<"$OUT" \
    || { WHY="task B $task_b after restore: exit $RC, want 76 (the daemon refused the request) with $not_found: $(oneline "$OUT")"; return 1; }
  local ev
  ev=$(cx sh -c 'ls -d /var/lib/taskgate.replaced-*' 2>/dev/null)
  [ -n "$ev" ] || { WHY="no /var/lib/taskgate.replaced-* evidence directory"; return 1; }
  cx test -f "$(head -n1 <<<"$ev")/tasks.db" || { WHY="$ev holds no tasks.db"; return 1; }
  state_dir_ok || { WHY="after restore: $WHY"; return 1; }
  INFO="A $TASK_A kept, B $task_b gone ($not_found), active, evidence $(head -n1 <<<"$ev")"
}
run_check backup-restore check_backup_restore

# 7 (continued). taskgate-backup checks the destination before it stops the
# service, and names it as the destination.
check_backup_destination() {
  run_cx sh -c 'mkdir -p /root/open && chmod 0777 /root/open'
  local pid0 pid1_
  pid0=$(unit_prop MainPID)
  run_cx taskgate-backup /root/open/b
  [ "$RC" -eq 77 ] || { WHY="taskgate-backup to a world-writable parent exited $RC, want 77: $(oneline "$OUT")"; return 1; }
  grep -q 'backup destination is not private' <<<"$OUT" || { WHY="the refusal does not name the destination: $(oneline "$OUT")"; return 1; }
  ! grep -q '^taskgate-backup: stopping' <<<"$OUT" || { WHY="the service was stopped before the refusal: $(oneline "$OUT")"; return 1; }
  pid1_=$(unit_prop MainPID)
  [ "$pid0" = "$pid1_" ] && [ "$(unit_prop ActiveState)" = active ] \
    || { WHY="the service was disturbed (MainPID $pid0 -> $pid1_)"; return 1; }
  ! cx test -e /root/open/b || { WHY="/root/open/b was created"; return 1; }
  INFO="exit 77, MainPID $pid0 unchanged: $(oneline "$(grep -m1 'refused:' <<<"$OUT")" | sed 's/^taskgate: refused: //' | cut -c1-120)"
}
run_check backup-refuses-bad-destination-before-stopping check_backup_destination

# 7 (continued). A tampered snapshot is refused and changes nothing.
live_fingerprint() {
  cx sh -c 'cd /var/lib/taskgate && find . -printf "%y %m %u %s %p\n" | sort && find . -type f -exec sha256sum {} + | sort'
}
check_tampered() {
  [ -n "$TASK_A" ] || { WHY="no task A (backup-restore failed)"; return 1; }
  cx test -d /root/backup-1 || { WHY="no /root/backup-1 (backup-restore failed)"; return 1; }
  run_cx cp -a /root/backup-1 /root/backup-tampered
  [ "$RC" -eq 0 ] || { WHY="cp failed: $OUT"; return 1; }
  local f="$rootfs/root/backup-tampered/tasks.db" size off byte s0 s1
  size=$(stat -c %s "$f")
  off=$((size / 2 + 17))
  byte=$(od -An -tu1 -j "$off" -N1 "$f" | tr -d ' ')
  s0=$(sha256sum <"$f")
  # shellcheck disable=SC2059
  printf "\\$(printf %03o $((byte ^ 0x5a)))" | dd of="$f" bs=1 seek="$off" count=1 conv=notrunc status=none
  s1=$(sha256sum <"$f")
  [ "$s0" != "$s1" ] || { WHY="could not flip a byte in the copy"; return 1; }
  local ev0 ev1 fp0 fp1 pid0 pid1_
  ev0=$(cx sh -c 'ls -d /var/lib/taskgate.replaced-* 2>/dev/null | wc -l')
  # While the service runs: refused before anything is stopped.
  pid0=$(unit_prop MainPID)
  run_cx taskgate-restore /root/backup-tampered
  [ "$RC" -ne 0 ] || { WHY="taskgate-restore accepted the tampered snapshot"; return 1; }
  local refusal=$OUT
  pid1_=$(unit_prop MainPID)
  [ "$pid1_" = "$pid0" ] && [ "$(unit_prop ActiveState)" = active ] \
    || { WHY="the refused restore disturbed the service (MainPID $pid0 -> $pid1_)"; return 1; }
  # With the service stopped: the live files are byte-for-byte the same.
  run_cx systemctl stop taskgate.service
  fp0=$(live_fingerprint)
  run_cx taskgate-restore /root/backup-tampered
  [ "$RC" -ne 0 ] || { WHY="taskgate-restore accepted the tampered snapshot (service stopped)"; return 1; }
  fp1=$(live_fingerprint)
  printf '%s\n--- after\n%s\n' "$fp0" "$fp1" >>"$log"
  local active_after
  active_after=$(unit_prop ActiveState)
  cx systemctl start taskgate.service >>"$log" 2>&1
  [ -n "$fp0" ] && [ "$fp0" = "$fp1" ] || { WHY="the live state directory changed: $(oneline "$(diff <(echo "$fp0") <(echo "$fp1"))")"; return 1; }
  [ "$active_after" != active ] || { WHY="the refused restore started the stopped service"; return 1; }
  ev1=$(cx sh -c 'ls -d /var/lib/taskgate.replaced-* 2>/dev/null | wc -l')
  [ "$ev0" = "$ev1" ] || { WHY="a refused restore created an evidence directory"; return 1; }
  [ "$(unit_prop ActiveState)" = active ] || { WHY="the service did not start again afterwards"; return 1; }
  task_present "$TASK_A" alpha || { WHY="task A missing afterwards (exit $RC): $(oneline "$OUT")"; return 1; }
  INFO="live files unchanged; refused with: $(oneline "$(grep -m1 -i 'checksum\|rejected\|refused' <<<"$refusal")" | sed 's/^taskgate: refused: //' | cut -c1-150)"
}
run_check restore-refuses-tampered-snapshot check_tampered

# ---------------------------------------------- status and online snapshots --
# `taskgate status` over the admin socket in /run/taskgate, as root (served)
# and as another user (refused); then an online snapshot while a task runs,
# restored into a fresh directory and checked; the shipped timer is disabled
# and its service takes a snapshot into /var/backups/taskgate.
check_admin_status() {
  run_cx taskgate status
  [ "$RC" -eq 0 ] || { WHY="taskgate status exited $RC: $(oneline "$OUT")"; return 1; }
  grep -q '^task store  *serving' <<<"$OUT" || { WHY="no 'task store serving' in: $(oneline "$OUT")"; return 1; }
  grep -q '^admin socket  */run/taskgate/admin.sock' <<<"$OUT" || { WHY="socket not in /run/taskgate: $(oneline "$OUT")"; return 1; }
  grep -q '^state directory  */var/lib/taskgate' <<<"$OUT" || { WHY="wrong state directory: $(oneline "$OUT")"; return 1; }
  run_cx taskgate status --json
  [ "$RC" -eq 0 ] && grep -q '"store": *"serving"' <<<"$OUT" || { WHY="status --json exited $RC: $(oneline "$OUT")"; return 1; }
  local smode
  smode=$(cx stat -c '%a %U' /run/taskgate/admin.sock)
  [ "$smode" = "600 taskgate" ] || { WHY="/run/taskgate/admin.sock is $smode, want 600 taskgate"; return 1; }
  run_cx setpriv --reuid=65534 --regid=65534 --clear-groups taskgate status --socket /run/taskgate/admin.sock
  [ "$RC" -eq 76 ] || { WHY="status as nobody exited $RC, want 76: $(oneline "$OUT")"; return 1; }
  INFO="serving, socket 600 taskgate in /run/taskgate, nobody refused (76)"
}
run_check status-over-admin-socket check_admin_status

# `taskgate verify --durable-tasks` as the package's user inside the
# packaged unit's own sandbox: a oneshot unit made from the installed one
# (same user, same hardening; its own ExecStart, no state or runtime
# directory of the daemon's), so the embedded provider, its worker and the
# qualification's temporary directory (in the unit's private /tmp) meet the
# daemon's restrictions. It must exit 0 with a PASS result.
check_verify_durable() {
  local frag unit="$rootfs/etc/systemd/system/tg-verify.service" journal
  frag=$(unit_prop FragmentPath)
  [ -n "$frag" ] && [ -f "$rootfs$frag" ] || { WHY="the installed unit's file is not found ($frag)"; return 1; }
  sed -e 's/^Type=.*/Type=oneshot/' \
    -e 's|^ExecStart=.*|ExecStart=/usr/bin/taskgate verify --durable-tasks|' \
    -e '/^ExecStartPre=/d; /^ExecReload=/d; /^WatchdogSec=/d; /^NotifyAccess=/d; /^Restart/d' \
    -e '/^StateDirectory/d; /^RuntimeDirectory/d; /^TimeoutStopSec=/d; /^StartLimit/d' \
    -e '/^\[Install\]/,$d' \
    -e 's/^Description=.*/Description=taskgate durable-tasks qualification (system test)/' \
    "$rootfs$frag" >"$unit" || { WHY="cannot write the qualification's unit"; return 1; }
  printf 'TimeoutStartSec=180\n' >>"$unit"
  run_cx systemctl daemon-reload
  local CX_TIMEOUT=200
  run_cx systemctl start tg-verify.service
  local rc=$RC
  journal=$(cx journalctl -u tg-verify.service --no-pager -o cat)
  printf '%s\n' "$journal" >>"$log"
  rm -f "$unit"
  cx systemctl daemon-reload
  [ "$rc" -eq 0 ] || { WHY="the qualification unit failed (exit $rc): $(oneline "$(grep -E '^(FAIL|durable-tasks|taskgate)' <<<"$journal")")"; return 1; }
  grep -q '"result": "PASS"' <<<"$journal" || { WHY="no PASS result in its output: $(oneline "$journal")"; return 1; }
  grep -q '^durable-tasks qualification: PASS' <<<"$journal" || { WHY="no PASS summary on its stderr: $(oneline "$journal")"; return 1; }
  ! grep -q '^FAIL ' <<<"$journal" || { WHY="a check failed: $(oneline "$(grep '^FAIL ' <<<"$journal")")"; return 1; }
  INFO="$(grep '^durable-tasks qualification: ' <<<"$journal"), as taskgate under the unit's sandbox"
}
run_check verify-durable-tasks-under-the-unit check_verify_durable

# An approval-held call under the unit: the journal in its own
# StateDirectory=, a held call approved by the administrator with the CLI,
# the identical re-issue run once (the daemon's run counter is the marker),
# a second re-issue held again; a backup and restore carry the journal with
# the tasks (a decision taken after the backup is gone after the restore).
runs_started() { cx taskgate status --json | grep -o '"runs_started": *[0-9]*' | grep -o '[0-9]*$'; }
check_approvals() {
  local mode
  mode=$(cx stat -c '%a %U' /var/lib/taskgate-approvals 2>&1)
  [ "$mode" = "700 taskgate" ] || { WHY="/var/lib/taskgate-approvals is $mode, want 700 taskgate"; return 1; }
  run_cx sh -c 'cat >>/etc/taskgate/taskgate.toml <<EOF

# Added by scripts/system-test.sh: a tool that waits for an administrator.
[[tool]]
name = "guarded"
description = "Prints its text back once an administrator approved the call (system test)."
argv = ["/usr/bin/printf", "%s", "{text}"]
effect = "read_only"
approval = "required"
approval_preview = ["text"]
timeout_secs = 10
[tool.input_schema]
type = "object"
required = ["text"]
[tool.input_schema.properties.text]
type = "string"
maxLength = 64
EOF
systemctl reload taskgate.service'
  [ "$RC" -eq 0 ] || { WHY="adding the guarded tool and reloading failed (exit $RC): $(oneline "$OUT")"; return 1; }
  run_cx taskgate call guarded --args '{"text": "held-1"}'
  local p1 p2 runs0 runs1
  p1=$(grep -o 'tgp-[0-9a-f]*' <<<"$OUT" | head -n1)
  [ "$RC" -eq 1 ] && grep -q approval_required <<<"$OUT" && [ -n "$p1" ] \
    || { WHY="the held call answered exit $RC without approval_required and a proposal: $(oneline "$OUT")"; return 1; }
  runs0=$(runs_started)
  run_cx taskgate approvals show "$p1"
  grep -q 'held-1' <<<"$OUT" || { WHY="approvals show $p1 lacks the preview: $(oneline "$OUT")"; return 1; }
  run_cx taskgate approvals approve "$p1"
  [ "$RC" -eq 0 ] || { WHY="approvals approve $p1 exited $RC: $(oneline "$OUT")"; return 1; }
  [ "$(runs_started)" = "$runs0" ] || { WHY="the approval ran something by itself"; return 1; }
  run_cx taskgate call guarded --args '{"text": "held-1"}'
  [ "$RC" -eq 0 ] && grep -q '"text": *"held-1"' <<<"$OUT" \
    || { WHY="the approved re-issue exited $RC: $(oneline "$OUT")"; return 1; }
  runs1=$(runs_started)
  [ "$runs1" -eq $((runs0 + 1)) ] || { WHY="runs_started went $runs0 -> $runs1 on the re-issue, want one run"; return 1; }
  run_cx taskgate call guarded --args '{"text": "held-1"}'
  p2=$(grep -o 'tgp-[0-9a-f]*' <<<"$OUT" | head -n1)
  [ "$RC" -eq 1 ] && [ -n "$p2" ] && [ "$p2" != "$p1" ] \
    || { WHY="a second re-issue was not held as a new proposal (exit $RC): $(oneline "$OUT")"; return 1; }
  [ "$(runs_started)" = "$runs1" ] || { WHY="the second re-issue ran"; return 1; }

  run_cx taskgate-backup /root/backup-approvals
  [ "$RC" -eq 0 ] || { WHY="taskgate-backup exited $RC: $(oneline "$OUT")"; return 1; }
  cx test -f /root/backup-approvals/approvals/journal-000001.log || { WHY="the backup holds no approval journal"; return 1; }
  run_cx taskgate approvals reject "$p2" --reason "after the backup"
  [ "$RC" -eq 0 ] || { WHY="approvals reject $p2 exited $RC: $(oneline "$OUT")"; return 1; }
  run_cx taskgate-restore /root/backup-approvals
  [ "$RC" -eq 0 ] || { WHY="taskgate-restore exited $RC: $(oneline "$OUT")"; return 1; }
  [ "$(unit_prop ActiveState)" = active ] || { WHY="not active after the restore"; return 1; }
  run_cx taskgate approvals show "$p2" --json
  grep -q '"state": *"pending"' <<<"$OUT" || { WHY="after the restore $p2 is not pending again: $(oneline "$OUT")"; return 1; }
  run_cx taskgate approvals show "$p1" --json
  grep -q '"state": *"consumed"' <<<"$OUT" || { WHY="after the restore $p1 is not consumed: $(oneline "$OUT")"; return 1; }
  run_cx taskgate approvals verify
  [ "$RC" -eq 0 ] || { WHY="approvals verify exited $RC after the restore: $(oneline "$OUT")"; return 1; }
  INFO="$p1 approved and run once ($runs0 -> $runs1 runs), $p2 held; restore put $p2 back to pending"
}
run_check approval-held-call-under-the-unit check_approvals

check_online_snapshot() {
  local pid_before id snap=/var/backups/taskgate/online-1
  pid_before=$(unit_prop MainPID)
  create_task delta || return 1
  id=$TASK_ID
  run_cx taskgate backup --online --to "$snap"
  [ "$RC" -eq 0 ] || { WHY="backup --online exited $RC: $(oneline "$OUT")"; return 1; }
  grep -q 'copy verified' <<<"$OUT" || { WHY="no 'copy verified': $(oneline "$OUT")"; return 1; }
  [ "$(unit_prop MainPID)" = "$pid_before" ] && [ "$(unit_prop ActiveState)" = active ] \
    || { WHY="the daemon did not keep serving through the snapshot"; return 1; }
  run_cx sh -c "cd $snap && sha256sum -c MANIFEST.sha256"
  [ "$RC" -eq 0 ] || { WHY="sha256sum -c of the online snapshot failed: $(oneline "$OUT")"; return 1; }
  run_cx sh -c "install -d -m 0700 /root/fresh && taskgate restore --state-dir /root/fresh --from $snap && taskgate check --state-dir /root/fresh"
  [ "$RC" -eq 0 ] && grep -q 'integrity ok' <<<"$OUT" || { WHY="restore+check of the online snapshot exited $RC: $(oneline "$OUT")"; return 1; }
  task_present "$id" delta || { WHY="task $id unreadable after the snapshot (exit $RC): $(oneline "$OUT")"; return 1; }
  [ "$(cx systemctl is-enabled taskgate-snapshot.timer 2>/dev/null)" = disabled ] \
    || { WHY="taskgate-snapshot.timer is $(cx systemctl is-enabled taskgate-snapshot.timer 2>&1), want disabled"; return 1; }
  run_cx systemctl start taskgate-snapshot.service
  [ "$RC" -eq 0 ] || { WHY="taskgate-snapshot.service failed ($RC): $(oneline "$(cx journalctl -u taskgate-snapshot.service --no-pager -o cat | tail -n 3)")"; return 1; }
  local made
  made=$(cx sh -c 'ls -d /var/backups/taskgate/taskgate-* 2>/dev/null | head -n1')
  [ -n "$made" ] && cx test -f "$made/MANIFEST.sha256" || { WHY="the snapshot service wrote nothing into /var/backups/taskgate"; return 1; }
  INFO="$snap restored and checked; timer disabled; service wrote $made"
}
run_check online-snapshot-restores check_online_snapshot

# 7 (continued). A restore refused after the service was stopped starts it
# again. Another process (flock) takes the lock the moment the daemon lets
# go of it: `taskgate restore` refuses (75, naming flock), and the runbook
# must start the service again; its start is refused too (75) until flock
# lets go, and Restart= brings it back on the files it had.
REFUSED_AT=""
check_restore_refusal_restarts() {
  [ -n "$TASK_A" ] || { WHY="no task A (backup-restore failed)"; return 1; }
  cx test -d /root/backup-1 || { WHY="no /root/backup-1 (backup-restore failed)"; return 1; }
  local ev0 ev1 i state
  ev0=$(cx sh -c 'ls -d /var/lib/taskgate.replaced-* 2>/dev/null | wc -l')
  REFUSED_AT=$(cx date '+%Y-%m-%d %H:%M:%S')
  run_cx systemd-run --unit=tg-lock-holder --collect flock /var/lib/taskgate/tasks.lock sleep 8
  [ "$RC" -eq 0 ] || { WHY="systemd-run flock failed: $(oneline "$OUT")"; return 1; }
  run_cx taskgate-restore /root/backup-1
  [ "$RC" -eq 75 ] || { WHY="taskgate-restore with the lock taken exited $RC, want 75: $(oneline "$OUT")"; return 1; }
  grep -q 'held by another process (pid [0-9]*, flock)' <<<"$OUT" \
    || { WHY="the refusal does not name flock as the holder: $(oneline "$OUT")"; return 1; }
  grep -q 'starting it again' <<<"$OUT" || { WHY="the runbook did not say it starts the service again: $(oneline "$OUT")"; return 1; }
  for i in $(seq 1 60); do
    state=$(unit_prop ActiveState)
    [ "$state" = active ] && break
    sleep 0.5
  done
  [ "$state" = active ] || { WHY="the service is $state 30 s after the refused restore: $(unit_prop StatusText)"; return 1; }
  ev1=$(cx sh -c 'ls -d /var/lib/taskgate.replaced-* 2>/dev/null | wc -l')
  [ "$ev0" = "$ev1" ] || { WHY="the refused restore created an evidence directory"; return 1; }
  task_present "$TASK_A" alpha || { WHY="task A missing afterwards (exit $RC): $(oneline "$OUT")"; return 1; }
  INFO="exit 75 naming flock; service active again after ${i} polls, task A readable"
}
run_check restore-refusal-after-stop-restarts-service check_restore_refusal_restarts

# 10. The journal: the refused starts above are at priority err, under the
# unit, with the refusal's message ID; no source path of the build machine.
REFUSED_ID=371a2363426c438a9af7ec8ee4eff1db
check_journal_err() {
  [ -n "$REFUSED_AT" ] || { WHY="no refused start to look for (previous check failed)"; return 1; }
  local err ids paths
  err=$(cx journalctl -b -u taskgate.service -p err --since "$REFUSED_AT" --no-pager -o cat)
  printf '%s\n' "$err" >>"$log"
  grep -q 'refused: ownership lock held (exit 75)' <<<"$err" \
    || { WHY="journalctl -u taskgate -p err shows no refused start: $(oneline "$(tail -n 3 <<<"$err")")"; return 1; }
  ids=$(cx journalctl -b -u taskgate.service MESSAGE_ID=$REFUSED_ID --no-pager -o cat | wc -l)
  [ "$ids" -ge 1 ] || { WHY="no message with MESSAGE_ID=$REFUSED_ID under the unit"; return 1; }
  paths=$(cx journalctl -b -u taskgate.service --no-pager -o verbose | sed -n 's/^ *CODE_FILE=//p' | sort -u)
  printf 'CODE_FILE values:\n%s\n' "$paths" >>"$log"
  [ -n "$paths" ] || { WHY="no CODE_FILE field in the unit's journal"; return 1; }
  ! grep -q -e '^/work' -e '/\.cargo/' -e '^/root' -e '^/home' <<<"$paths" \
    || { WHY="CODE_FILE names a build path: $(oneline "$(grep -e '^/work' -e '/\.cargo/' -e '^/root' -e '^/home' <<<"$paths" | head -n 2)")"; return 1; }
  INFO="$(grep -c 'refused:' <<<"$err") refused start(s) at err, $ids with MESSAGE_ID, CODE_FILE e.g. $(head -n1 <<<"$paths")"
}
run_check journal-err-shows-refused-start check_journal_err

check_journal_catalog() {
  run_cx journalctl --list-catalog $REFUSED_ID
  [ "$RC" -eq 0 ] && grep -q 'taskgate refused to start' <<<"$OUT" \
    || { WHY="journalctl --list-catalog $REFUSED_ID (exit $RC): $(oneline "$OUT")"; return 1; }
  local x
  x=$(cx journalctl -b -u taskgate.service -x MESSAGE_ID=$REFUSED_ID --no-pager | tail -n 20)
  printf '%s\n' "$x" >>"$log"
  grep -q 'Subject: taskgate refused to start (exit status 75)' <<<"$x" \
    || { WHY="journalctl -x shows no catalog text for the refusal: $(oneline "$(tail -n 4 <<<"$x")")"; return 1; }
  INFO="catalog indexed on install; journalctl -x explains the refusal"
}
run_check journal-catalog-entry-resolves check_journal_catalog

# 8. Upgrade to the rebuilt package.
check_upgrade() {
  local old new ver wd_before wd_after
  old=$(unit_prop MainPID)
  wd_before=$(watchdog_timeouts)
  run_cx dpkg --force-confold -i /root/pkgs/upgrade.deb
  [ "$RC" -eq 0 ] || { WHY="dpkg -i of the upgrade exited $RC: $(oneline "$(printf '%s' "$OUT" | tail -n 5)")"; return 1; }
  ver=$(cx dpkg-query -W -f '${Status} ${Version}' taskgate)
  [ "$ver" = "install ok installed $v2" ] || { WHY="dpkg-query says: $ver, want $v2"; return 1; }
  new=$(unit_prop MainPID)
  [ -n "$new" ] && [ "$new" != 0 ] && [ "$new" != "$old" ] || { WHY="not restarted by the upgrade (MainPID $old -> $new)"; return 1; }
  wd_after=$(watchdog_timeouts)
  [ "$wd_after" = "$wd_before" ] || { WHY="a watchdog timeout happened during the upgrade"; return 1; }
  [ "$(unit_prop ActiveState)/$(unit_prop SubState)" = active/running ] || { WHY="not active/running after the upgrade"; return 1; }
  unit_prop StatusText | grep -q 'serving on' || { WHY="StatusText lacks serving on: $(unit_prop StatusText)"; return 1; }
  [ -n "$TASK_A" ] || { WHY="no task A (backup-restore failed)"; return 1; }
  task_present "$TASK_A" alpha || { WHY="task A $TASK_A missing after the upgrade (exit $RC): $(oneline "$OUT")"; return 1; }
  cx grep -q '^name = "probe"' /etc/taskgate/taskgate.toml || { WHY="the edited conffile was replaced"; return 1; }
  INFO="$v1 -> $v2, MainPID $old -> $new, task A kept, conffile edit kept"
}
run_check upgrade-keeps-data check_upgrade

# A conffile the new version refuses: the package's postinst stops before
# debhelper's restart, says what is wrong, and the running daemon goes on.
# (The upgrade package is installed again: for dpkg that is an upgrade from
# the configured version, and the postinst runs the same way.) Fixing the
# file and `dpkg --configure` finish it.
check_upgrade_bad_conffile() {
  local pid st new
  pid=$(unit_prop MainPID)
  cx cp -p /etc/taskgate/taskgate.toml "$CONF_SAVED" || { WHY="cannot save the conffile"; return 1; }
  run_cx sh -c 'sed -i "s/^max_connections = 256\$/max_connection = 256/" /etc/taskgate/taskgate.toml && grep -q "^max_connection = 256\$" /etc/taskgate/taskgate.toml'
  [ "$RC" -eq 0 ] || { WHY="cannot break the conffile: $(oneline "$OUT")"; return 1; }
  run_cx dpkg --force-confold -i /root/pkgs/upgrade.deb
  [ "$RC" -ne 0 ] || { WHY="dpkg -i with a refused conffile exited 0"; cx cp -p "$CONF_SAVED" /etc/taskgate/taskgate.toml; return 1; }
  grep -q 'refuses /etc/taskgate/taskgate.toml' <<<"$OUT" && grep -q 'max_connection' <<<"$OUT" && grep -q 'NOT restarted' <<<"$OUT" \
    || { WHY="dpkg's output does not say what is wrong: $(oneline "$OUT")"; cx cp -p "$CONF_SAVED" /etc/taskgate/taskgate.toml; return 1; }
  [ "$(unit_prop MainPID)" = "$pid" ] && [ "$(unit_prop ActiveState)" = active ] \
    || { WHY="the daemon did not keep running (MainPID $pid -> $(unit_prop MainPID), $(unit_prop ActiveState))"; cx cp -p "$CONF_SAVED" /etc/taskgate/taskgate.toml; return 1; }
  st=$(cx dpkg-query -W -f '${Status}' taskgate)
  cx cp -p "$CONF_SAVED" /etc/taskgate/taskgate.toml
  run_cx dpkg --configure taskgate
  [ "$RC" -eq 0 ] || { WHY="dpkg --configure after fixing the file exited $RC: $(oneline "$OUT")"; return 1; }
  new=$(unit_prop MainPID)
  [ "$new" != "$pid" ] && [ "$(unit_prop ActiveState)/$(unit_prop SubState)" = active/running ] \
    || { WHY="not restarted by dpkg --configure (MainPID $pid -> $new)"; return 1; }
  INFO="refused before the restart ($st, MainPID $pid kept); after the fix dpkg --configure restarted it (MainPID $new)"
}
run_check upgrade-refuses-bad-conffile-before-restart check_upgrade_bad_conffile

# 9. Remove keeps the state; purge removes it.
check_remove() {
  run_cx dpkg -r taskgate
  [ "$RC" -eq 0 ] || { WHY="dpkg -r exited $RC: $(oneline "$OUT")"; return 1; }
  local state procs
  state=$(cx systemctl is-active taskgate.service 2>&1)
  [ "$state" != active ] && [ "$state" != activating ] && [ "$state" != deactivating ] \
    || { WHY="taskgate.service is $state after dpkg -r"; return 1; }
  procs=$(cx sh -c 'for c in /proc/[0-9]*/comm; do [ "$(cat "$c" 2>/dev/null)" = taskgate ] && echo "${c%/comm}"; done')
  [ -z "$procs" ] || { WHY="taskgate processes still running: $(oneline "$procs")"; return 1; }
  cx test -f /var/lib/taskgate/tasks.db || { WHY="/var/lib/taskgate/tasks.db is gone after dpkg -r"; return 1; }
  INFO="unit $state, no taskgate process, /var/lib/taskgate/tasks.db kept"
}
run_check remove-keeps-state check_remove

check_purge() {
  run_cx dpkg --purge taskgate
  [ "$RC" -eq 0 ] || { WHY="dpkg --purge exited $RC: $(oneline "$OUT")"; return 1; }
  ! cx test -e /var/lib/taskgate || { WHY="/var/lib/taskgate still exists after purge"; return 1; }
  ! cx test -e /var/lib/taskgate-approvals || { WHY="/var/lib/taskgate-approvals still exists after purge"; return 1; }
  local st
  st=$(cx dpkg-query -W -f '${Status}' taskgate 2>&1)
  case $st in *not-installed* | *"no packages found"*) ;; *) WHY="dpkg-query says: $st"; return 1 ;; esac
  INFO="/var/lib/taskgate and /var/lib/taskgate-approvals removed"
}
PURGE_OUT=""
check_purge_wrap() { check_purge; local rc=$?; PURGE_OUT=$OUT; return $rc; }
run_check purge-removes-state check_purge_wrap

# 9 (continued). Purge keeps what a restore kept as evidence, and says so.
check_purge_evidence() {
  local ev
  ev=$(cx sh -c 'ls -d /var/lib/taskgate.replaced-* 2>/dev/null')
  [ -n "$ev" ] || { WHY="no /var/lib/taskgate.replaced-* left after purge"; return 1; }
  grep -q "purge keeps $(head -n1 <<<"$ev")" <<<"$PURGE_OUT" \
    || { WHY="purge did not name the evidence it keeps: $(oneline "$PURGE_OUT")"; return 1; }
  INFO="kept and named: $(oneline "$ev")"
}
run_check purge-keeps-restore-evidence check_purge_evidence

exit 0
