#!/usr/bin/env bash
# Regenerates packaging/copyright (the package's debian/copyright) from
# Cargo.lock: one paragraph per crate linked into the binary, with its
# licence; the hand-written parts are in packaging/copyright.in. Run it after
# changing dependencies; tests/package_copyright.rs fails until you do.
set -euo pipefail
cd "$(dirname "$0")/.."
# The rewriting run reports itself as a failure on purpose (it checks
# nothing); the second run checks what it wrote.
TASKGATE_UPDATE_COPYRIGHT=1 cargo test --locked --test package_contents \
  -- --quiet the_copyright_file_covers_every_linked_crate_as_cargo_lock_pins_it >/dev/null 2>&1 || true
cargo test --locked --test package_contents -- --quiet
echo "packaging/copyright regenerated; review with: git diff packaging/copyright"
