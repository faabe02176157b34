#!/usr/bin/env python3
"""The summary that ends scripts/test.sh: what every test binary ran.

    test-summary.py --cargo-log LOG --cargo-status N --cargo-secs N
                    --expected tests/expected-tests.txt [--selected | --partial]
                    [--system-log LOG --system-status N --system-secs N]
                    --total-secs N

It reads cargo test's output binary by binary: each `Running <file> (...)`
or `Doc-tests <crate>` line opens a binary, and that binary's own
`test result:` line closes it. A binary that has no result line (killed by
a signal, aborted, or exited early) is named as crashed and counted as
failed: its tests that reported `ok` before it ended passed, every other
test it was running failed (at least one). cargo names a file inside its
own package, so the unit tests of a workspace member (package
`taskgate-NAME` in crates/NAME/, test binary `taskgate_NAME-<hash>`) are
named `crates/NAME/src/lib.rs`, apart from the taskgate crate's
`src/lib.rs`; its doc tests are `doc-tests taskgate_NAME`.

The expected list names every binary, the least number of tests it must
pass, and its child entry points: tests marked #[ignore] because they only
do something in a child process a parent test starts (with `--ignored
--exact NAME`). The run fails, with one line each, when a binary passed
fewer tests than its minimum, is missing from the list, or is in the list
but did not run; when a test is ignored that is not a listed child entry
point, or a listed child entry point ran as a test of its own. Each such
check is counted as one failure. With --selected (cargo test was given
only the binaries to run) a listed binary that did not run is not checked;
with --partial (it was given a test name filter or other arguments) the
minimums are not checked either.

The last line is `N passed, N failed, N skipped`: the sum of what the
binaries and the system test ran (ignored tests are skipped, never passed),
plus one failure per failed check. Exit status 0 only when nothing failed.
"""

import argparse
import re
import sys

RUNNING = re.compile(r"^\s+Running (?:unittests )?(\S+) \(")
# The test binary of a workspace member's own sources: deps/taskgate_NAME-HASH.
MEMBER = re.compile(r"^\s+Running unittests \S+ \(\S*deps/taskgate_([a-z0-9_]+)-[0-9a-f]+\)")
DOCTESTS = re.compile(r"^\s+Doc-tests (\S+)")
RUNNING_N = re.compile(r"^running (\d+) tests?$")
TEST_LINE = re.compile(r"^test (.+?) \.\.\. (ok|FAILED|ignored)(?:, (.*))?$")
RESULT = re.compile(r"^test result: (\S+)\. (.*)$")
NOT_SUCCESSFUL = re.compile(r"process didn't exit successfully: .*\((.+)\)\s*$")
# The lines cargo test's summary has always shown (results, failures,
# build errors).
SHOWN = re.compile(
    r"^(test result:|\s+Running|\s+Doc-tests|failures:|    [a-zA-Z0-9_:]+$|error(\[E[0-9]+\])?:)"
)


class Binary:
    def __init__(self, name):
        self.name = name
        self.running = None  # "running N tests"
        self.ok = 0
        self.failed_lines = 0
        self.ignored = []  # (test, reason)
        self.ran_as_test = set()  # names reported ok or FAILED
        self.result = None  # (passed, failed, ignored)
        self.exit_reason = None

    @property
    def crashed(self):
        return self.result is None

    def counts(self):
        """(passed, failed, ignored) of what this binary really ran."""
        if self.result is not None:
            return self.result
        ignored = len(self.ignored)
        # Every test it was running that did not report ok or ignored
        # (those that reported FAILED among them) failed.
        not_ok = (self.running or 0) - self.ok - ignored
        return self.ok, max(1, self.failed_lines, not_ok), ignored


def count_of(words, what):
    m = re.search(r"(\d+) " + what, words)
    return int(m.group(1)) if m else 0


def parse_cargo_log(lines):
    """The binaries in run order, and the lines shown before them (build
    output) that belong to none."""
    binaries = []
    cur = None
    for line in lines:
        line = line.rstrip("\n")
        m = RUNNING.match(line) or DOCTESTS.match(line)
        if m:
            name = m.group(1) if RUNNING.match(line) else "doc-tests " + m.group(1)
            member = MEMBER.match(line)
            if member:
                name = f"crates/{member.group(1).replace('_', '-')}/{name}"
            cur = Binary(name)
            binaries.append(cur)
            continue
        if cur is None:
            continue
        m = RUNNING_N.match(line)
        if m and cur.running is None:
            cur.running = int(m.group(1))
            continue
        m = RESULT.match(line)
        if m:
            # The last one is the binary's own: a child's output shown in
            # a failure's captured stdout comes before it.
            words = m.group(2)
            cur.result = (
                count_of(words, "passed"),
                count_of(words, "failed"),
                count_of(words, "ignored"),
            )
            continue
        m = TEST_LINE.match(line)
        if m:
            test, outcome, reason = m.groups()
            if outcome == "ok":
                cur.ok += 1
                cur.ran_as_test.add(test)
            elif outcome == "FAILED":
                cur.failed_lines += 1
                cur.ran_as_test.add(test)
            else:
                cur.ignored.append((test, reason or ""))
            continue
        m = NOT_SUCCESSFUL.search(line)
        if m:
            cur.exit_reason = m.group(1)
    return binaries


def parse_expected(lines):
    """{binary: (minimum, [child entry points])}, or raises ValueError."""
    expected = {}
    for n, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        if fields[0] == "doc-tests" and len(fields) > 1:  # "doc-tests CRATE MINIMUM"
            fields = [f"doc-tests {fields[1]}"] + fields[2:]
        if len(fields) < 2 or not fields[1].isdigit():
            raise ValueError(f"line {n}: want `BINARY MINIMUM [CHILD_ENTRY_POINT...]`, got {line!r}")
        name = fields[0]
        if name in expected:
            raise ValueError(f"line {n}: {name} is listed twice")
        expected[name] = (int(fields[1]), fields[2:])
    return expected


def summarize(cargo_lines, cargo_status, expected, partial, out, selected=False):
    """Prints the cargo test part of the summary. Returns (passed, failed,
    skipped, failed_checks)."""
    for line in cargo_lines:
        line = line.rstrip("\n")
        if SHOWN.match(line):
            print(line, file=out)
    binaries = parse_cargo_log(cargo_lines)
    checks = []
    passed = failed = skipped = 0
    print("per test binary (passed, failed, ignored; the least it must pass):", file=out)
    seen = set()
    for b in binaries:
        p, f, i = b.counts()
        passed, failed, skipped = passed + p, failed + f, skipped + i
        minimum, children = expected.get(b.name, (None, []))
        want = "not listed" if minimum is None else f"at least {minimum}"
        print(f"  {b.name}: {p} passed, {f} failed, {i} ignored ({want})", file=out)
        if b.crashed:
            how = b.exit_reason or "no exit status shown"
            print(
                f"  CRASHED {b.name}: ended without its test result line ({how}); "
                f"of its {b.running if b.running is not None else 'unknown number of'} tests "
                f"{p} reported ok, {f} counted failed",
                file=out,
            )
        if b.name in seen:
            checks.append(f"{b.name} ran twice")
        seen.add(b.name)
        for test, reason in b.ignored:
            if test in children:
                print(f"  {b.name}: {test} ignored: {reason or 'no reason given'}", file=out)
            else:
                checks.append(
                    f"{b.name}: {test} is ignored ({reason or 'no reason given'}) but is not a "
                    "child entry point in tests/expected-tests.txt: the suite ignores no other test"
                )
        for test in children:
            if test in b.ran_as_test:
                checks.append(
                    f"{b.name}: child entry point {test} ran as a test of its own: mark it "
                    '#[ignore = "child entry point: run by PARENT"]'
                )
        if minimum is None:
            checks.append(
                f"{b.name} is not in tests/expected-tests.txt: add it with the number of tests it must pass"
            )
        elif not partial and not b.crashed and p < minimum:
            # A crashed binary has failed already, by name.
            checks.append(f"{b.name} passed {p} tests, fewer than the {minimum} it must pass")
    if not partial and not selected:
        for name in expected:
            if name not in seen:
                checks.append(f"{name} is in tests/expected-tests.txt but did not run")
    elif partial:
        print(
            "  (cargo test was given arguments: binaries not run and minimums are not checked)",
            file=out,
        )
    else:
        print("  (cargo test was given the binaries to run: the others are not checked)", file=out)
    if cargo_status != 0 and failed == 0 and not checks:
        # It stopped before reporting a failed test (a build error).
        checks.append(f"cargo test exited {cargo_status} without a failed test or crashed binary")
    for c in checks:
        print(f"FAIL check: {c} (counted as one failure)", file=out)
    return passed, failed, skipped, len(checks)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cargo-log", required=True)
    ap.add_argument("--cargo-status", type=int, required=True)
    ap.add_argument("--cargo-secs", type=int, default=0)
    ap.add_argument("--expected", required=True)
    ap.add_argument("--partial", action="store_true")
    ap.add_argument("--selected", action="store_true")
    ap.add_argument("--system-log")
    ap.add_argument("--system-status", type=int, default=0)
    ap.add_argument("--system-secs", type=int, default=0)
    ap.add_argument("--total-secs", type=int, default=0)
    args = ap.parse_args(argv)
    out = sys.stdout

    with open(args.cargo_log, errors="replace") as f:
        cargo_lines = f.readlines()
    try:
        with open(args.expected) as f:
            expected = parse_expected(f.readlines())
    except (OSError, ValueError) as e:
        print(f"FAIL check: {args.expected}: {e} (counted as one failure)", file=out)
        expected, bad_list = {}, 1
    else:
        bad_list = 0
    passed, failed, skipped, checks = summarize(
        cargo_lines, args.cargo_status, expected, args.partial, out, args.selected
    )
    checks += bad_list
    print(f"cargo test: exit {args.cargo_status}, {args.cargo_secs}s", file=out)

    s_pass = s_fail = 0
    if args.system_log is not None:
        with open(args.system_log, errors="replace") as f:
            sys_lines = [l.rstrip("\n") for l in f]
        for line in sys_lines:
            if re.match(r"^(PASS|FAIL|SUMMARY)", line):
                print(line, file=out)
        s_pass = sum(1 for l in sys_lines if l.startswith("PASS "))
        s_fail = sum(1 for l in sys_lines if l.startswith("FAIL "))
        if args.system_status != 0 and s_fail == 0:
            print(
                f"scripts/system-test.sh exited {args.system_status} without a FAIL line: "
                "counted as one failure",
                file=out,
            )
            s_fail = 1
        print(f"system test: exit {args.system_status}, {args.system_secs}s", file=out)
    else:
        print("system test: not run (--no-system-test)", file=out)
    print(f"total time: {args.total_secs}s", file=out)
    total_fail = failed + s_fail + checks
    print(f"{passed + s_pass} passed, {total_fail} failed, {skipped} skipped", file=out)
    ok = total_fail == 0 and args.cargo_status == 0 and args.system_status == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
