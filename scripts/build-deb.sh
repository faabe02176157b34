#!/usr/bin/env bash
# Builds the release .deb: scripts/build-deb.sh [--revision N] [--features F]
# Output: target/debian/taskgate_<version>-<revision>_<arch>.deb, then lintian.
# Needs cargo-deb (cargo install cargo-deb --locked) and lintian.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
revision=1
features=()
while [ $# -gt 0 ]; do
  case "$1" in
    --revision) revision=$2; shift 2 ;;
    --features) features=(--features "$2"); shift 2 ;;
    *) echo "usage: $0 [--revision N] [--features F]" >&2; exit 64 ;;
  esac
done

cargo build --release --locked "${features[@]}"

rm -rf target/man
mkdir -p target/man/man1 target/man/man5 target/man/man8
target/release/taskgate man --out target/man >/dev/null
cp packaging/taskgate-backup.8 packaging/taskgate-restore.8 target/man/man8/
find target/man -type f ! -name '*.gz' -exec gzip -9n {} +

cargo deb --no-build --locked --deb-revision "$revision" "${features[@]}"
deb="$(ls -t target/debian/taskgate_*_"$(dpkg --print-architecture)".deb | head -n1)"
echo "built $deb"
if command -v lintian >/dev/null; then
  lintian --fail-on error,warning --suppress-tags initial-upload-closes-no-bugs "$deb"
  echo "lintian: no errors, no warnings"
fi
