#!/usr/bin/env bash
# Writes tests/fixtures/v1.db: a schema-version-1 taskgate store, as the
# first release wrote it, for the v1 -> v2 migration tests. The file is
# committed; rerun this only to re-create it (needs the sqlite3 CLI).
# Rows: one completed, one failed, one still working (restart recovery must
# fail it), one completed with a creation reference.
set -euo pipefail
out="$(dirname "$0")/../tests/fixtures/v1.db"
rm -f "$out" "$out-wal" "$out-shm"
owner="$(printf 'test-owner' | sha256sum | cut -d' ' -f1)"
ref="$(printf 'operation-1' | sha256sum | cut -d' ' -f1)"
req="$(printf 'request-1' | sha256sum | cut -d' ' -f1)"
far=4102444800000   # 2100-01-01
sqlite3 "$out" <<SQL
PRAGMA page_size = 4096;
PRAGMA journal_mode = WAL;
BEGIN;
CREATE TABLE tasks (
    id               TEXT    PRIMARY KEY NOT NULL,
    owner            BLOB    NOT NULL CHECK (length(owner) = 32),
    reference        BLOB    CHECK (reference IS NULL OR length(reference) = 32),
    request          BLOB    CHECK (request IS NULL OR length(request) = 32),
    status           TEXT    NOT NULL CHECK (status IN ('working','input_required','completed','failed','cancelled')),
    status_message   TEXT,
    created_ms       INTEGER NOT NULL,
    updated_ms       INTEGER NOT NULL,
    expires_ms       INTEGER NOT NULL,
    poll_interval_ms INTEGER NOT NULL,
    payload          BLOB,
    cancel_requested INTEGER NOT NULL DEFAULT 0
) STRICT;
CREATE UNIQUE INDEX tasks_owner_reference ON tasks (owner, reference) WHERE reference IS NOT NULL;
CREATE INDEX tasks_expires ON tasks (expires_ms);
INSERT INTO tasks VALUES ('tg-00000000000000000000000000000001', x'$owner', NULL, NULL, 'completed', NULL,
  1767225600000, 1767225601000, $far, 1000,
  CAST('{"result":{"content":[{"type":"text","text":"v1 completed result"}],"isError":false}}' AS BLOB), 0);
INSERT INTO tasks VALUES ('tg-00000000000000000000000000000002', x'$owner', NULL, NULL, 'failed', 'tool timed out',
  1767225600000, 1767225602000, $far, 1000,
  CAST('{"error":{"code":-32603,"message":"tool timed out"}}' AS BLOB), 0);
INSERT INTO tasks VALUES ('tg-00000000000000000000000000000003', x'$owner', NULL, NULL, 'working', NULL,
  1767225600000, 1767225600000, $far, 1000, NULL, 0);
INSERT INTO tasks VALUES ('tg-00000000000000000000000000000004', x'$owner', x'$ref', x'$req', 'completed', NULL,
  1767225600000, 1767225603000, $far, 1000,
  CAST('{"result":{"content":[{"type":"text","text":"referenced"}]}}' AS BLOB), 0);
PRAGMA user_version = 1;
COMMIT;
SQL
chmod 600 "$out"
sqlite3 "$out" 'PRAGMA integrity_check; PRAGMA user_version; SELECT count(*) FROM tasks;'
