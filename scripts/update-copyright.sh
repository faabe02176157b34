#!/usr/bin/env bash
# Regenerates packaging/copyright (the package's debian/copyright) from
# Cargo.lock: one paragraph per crate linked into the binary, with its
# licence; the hand-written parts are in packaging/copyright.in. Run it after
# changing dependencies; tests/package_copyright.rs fails until you do.
set -euo pipefail
cd "$(dirname "$0")/.."
TASKGATE_UPDATE_COPYRIGHT=1 cargo test --locked --test package_contents -- --quiet
echo "packaging/copyright regenerated; review with: git diff packaging/copyright"
