//! scripts/test-summary.py, the summary scripts/test.sh ends with, fed
//! cargo test logs shaped as cargo writes them: the closing line counts
//! what the test binaries really ran, a crashed binary is counted as failed
//! by name, the ignored tests are only the listed child entry points, and
//! every binary is held to its minimum in tests/expected-tests.txt.
//!
//! `scripts/test.sh` is the test command (README): it checks and installs what
//! the suite needs, then runs `cargo test --locked` and the system test. Its
//! summary (`scripts/test-summary.py`) counts what each test binary really ran:
//! a binary that ends without its `test result:` line (a signal, an abort, an
//! early exit) is named and its tests that never reported `ok` count as failed;
//! every binary must pass at least the number of tests
//! `tests/expected-tests.txt` gives it, and a binary missing from that list or
//! from the run fails the run. Tests that only act as a child process's main
//! (`fault_child`, `kill_child`) are `#[ignore]`d with the reason "child entry
//! point: run by …", listed as such in that file, and started by their parent
//! with `--ignored --exact NAME`; they are reported as skipped, never as
//! passed, and any other ignored test fails the run. The closing line, `N
//! passed, N failed, N skipped`, is the sum over the binaries and the system
//! test, plus one failure for each of those checks that failed.
//!
//! What this file proves: the summary of `scripts/test.sh` over cargo test
//! logs: a crashed or silently exited binary counted as failed by name, the
//! closing line the sum of what ran, child entry points skipped (and failing
//! the run when counted as passed), any other ignored test, a binary under its
//! minimum, unlisted or not run, each failing the run (a run of chosen binaries
//! still holds each to its minimum); `tests/expected-tests.txt` names every
//! test binary

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

struct Summary {
    status: i32,
    lines: Vec<String>,
}

impl Summary {
    fn last(&self) -> &str {
        self.lines.last().map(String::as_str).unwrap_or("")
    }

    fn has(&self, line: &str) -> bool {
        self.lines.iter().any(|l| l == line)
    }

    fn checks(&self) -> Vec<&str> {
        self.lines
            .iter()
            .filter(|l| l.starts_with("FAIL check: "))
            .map(String::as_str)
            .collect()
    }
}

/// Runs the summary over `log` (cargo test's output, exit `cargo_status`)
/// with `expected` as the list of binaries.
fn summarize(log: &str, cargo_status: i32, expected: &str, extra: &[&str]) -> Summary {
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("cargo-test.log");
    let expected_path = dir.path().join("expected-tests.txt");
    std::fs::write(&log_path, log).unwrap();
    std::fs::write(&expected_path, expected).unwrap();
    let out = Command::new("python3")
        .arg(repo().join("scripts/test-summary.py"))
        .arg("--cargo-log")
        .arg(&log_path)
        .args(["--cargo-status", &cargo_status.to_string()])
        .arg("--expected")
        .arg(&expected_path)
        .args(extra)
        .output()
        .expect(
            "run python3 scripts/test-summary.py (python3 is a prerequisite of scripts/test.sh)",
        );
    assert!(
        out.stderr.is_empty(),
        "the summary wrote to stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<String> = text.lines().map(str::to_owned).collect();
    // Quoted, so that a failure's captured output shown in the real run's
    // log has no line the summary would read as a binary or a result.
    println!("{lines:#?}");
    Summary {
        status: out
            .status
            .code()
            .expect("the summary was killed by a signal"),
        lines,
    }
}

const LIB_OK: &str =
    "     Running unittests src/lib.rs (target/debug/deps/taskgate-5e1f2a3b4c5d6e7f)

running 3 tests
test a::one ... ok
test a::two ... ok
test b::three ... ok

test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.01s

";

const PARENT_OK: &str =
    "     Running tests/kill_durability.rs (target/debug/deps/kill_durability-0a1b2c3d4e5f6a7b)

running 2 tests
test kill_child ... ignored, child entry point: run by acknowledged_tasks_survive_sigkill
test acknowledged_tasks_survive_sigkill ... ok

test result: ok. 1 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 41.20s

";

/// Four tests; two reported ok, then the process aborted.
const CRASHED: &str = "     Running tests/store_behaviour.rs (target/debug/deps/store_behaviour-1122334455667788)

running 4 tests
test expiry_moves_with_the_clock ... ok
test limits_are_named ... ok
error: test failed, to rerun pass `--test store_behaviour`

Caused by:
  process didn't exit successfully: `/src/target/debug/deps/store_behaviour-1122334455667788` (signal: 6, SIGABRT: process abort signal)
";

const DOC_OK: &str = "   Doc-tests taskgate

running 1 test
test src/store/mod.rs - store::Store (line 12) ... ok

test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.30s

";

const EXPECTED: &str = "# binary  minimum  child entry points
src/lib.rs 3
tests/kill_durability.rs 1 kill_child
tests/store_behaviour.rs 4
doc-tests taskgate 1
";

#[test]
fn a_clean_run_counts_every_binary_and_the_child_entry_point_as_skipped() {
    let log = [
        LIB_OK,
        PARENT_OK,
        CRASHED.replace("4 tests", "0 tests").as_str(),
        DOC_OK,
    ]
    .concat();
    // The store binary here ran its four tests and reported them.
    let log = log.replace(
        "error: test failed, to rerun pass `--test store_behaviour`",
        "test c ... ok\ntest d ... ok\n\ntest result: ok. 4 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.00s\n",
    );
    let log = log.replace("running 0 tests", "running 4 tests");
    let s = summarize(&log, 0, EXPECTED, &[]);
    assert_eq!(s.checks(), Vec::<&str>::new());
    // cargo test's own result lines are still shown.
    assert!(s.has(
        "test result: ok. 1 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 41.20s"
    ));
    assert!(s.has(
        "  tests/kill_durability.rs: kill_child ignored: child entry point: run by acknowledged_tasks_survive_sigkill"
    ));
    assert!(s.has("  tests/kill_durability.rs: 1 passed, 0 failed, 1 ignored (at least 1)"));
    // 3 + 1 + 4 + 1 passed; the child entry point is skipped, never passed.
    assert_eq!(s.last(), "9 passed, 0 failed, 1 skipped");
    assert_eq!(s.status, 0);
}

#[test]
fn a_crashed_binary_is_named_and_its_unreported_tests_count_as_failed() {
    let log = [LIB_OK, PARENT_OK, CRASHED, DOC_OK].concat();
    let s = summarize(&log, 101, EXPECTED, &[]);
    assert!(
        s.has(
            "  CRASHED tests/store_behaviour.rs: ended without its test result line \
             (signal: 6, SIGABRT: process abort signal); of its 4 tests 2 reported ok, 2 counted failed"
        ),
        "{:#?}",
        s.lines
    );
    assert!(s.has("  tests/store_behaviour.rs: 2 passed, 2 failed, 0 ignored (at least 4)"));
    // Failed already, by name: not held to its minimum as well.
    assert_eq!(s.checks(), Vec::<&str>::new());
    // 3 + 1 + 2 + 1 passed; the 2 unreported tests failed.
    assert_eq!(s.last(), "7 passed, 2 failed, 1 skipped");
    assert_eq!(s.status, 1);
}

#[test]
fn a_binary_that_exits_without_its_result_line_is_counted_failed() {
    // A test called std::process::exit(0): no result line, cargo sees
    // success. One test was running and never reported.
    let quiet =
        "     Running tests/store_behaviour.rs (target/debug/deps/store_behaviour-1122334455667788)

running 4 tests
test expiry_moves_with_the_clock ... ok
test limits_are_named ... ok
test cancel_intent ... ok
";
    let log = [LIB_OK, PARENT_OK, quiet, DOC_OK].concat();
    let s = summarize(&log, 0, EXPECTED, &[]);
    assert!(s.has(
        "  CRASHED tests/store_behaviour.rs: ended without its test result line \
         (no exit status shown); of its 4 tests 3 reported ok, 1 counted failed"
    ));
    assert_eq!(s.last(), "8 passed, 1 failed, 1 skipped");
    assert_eq!(s.status, 1);
}

#[test]
fn a_child_entry_point_counted_as_passed_fails_the_run() {
    // How the child entry points ran before they were ignored: returning
    // at once, counted as a passed test.
    let parent =
        "     Running tests/kill_durability.rs (target/debug/deps/kill_durability-0a1b2c3d4e5f6a7b)

running 2 tests
test kill_child ... ok
test acknowledged_tasks_survive_sigkill ... ok

test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 41.20s

";
    let s = summarize(
        &[LIB_OK, parent, DOC_OK].concat(),
        0,
        EXPECTED,
        &["--partial"],
    );
    assert_eq!(
        s.checks(),
        [
            "FAIL check: tests/kill_durability.rs: child entry point kill_child ran as a test of its own: \
          mark it #[ignore = \"child entry point: run by PARENT\"] (counted as one failure)"
        ]
    );
    assert_eq!(s.last(), "6 passed, 1 failed, 0 skipped");
    assert_eq!(s.status, 1);
}

#[test]
fn an_ignored_test_that_is_no_child_entry_point_fails_the_run() {
    let lib = LIB_OK
        .replace("test b::three ... ok", "test b::three ... ignored")
        .replace(
            "3 passed; 0 failed; 0 ignored",
            "2 passed; 0 failed; 1 ignored",
        );
    let s = summarize(
        &[lib.as_str(), PARENT_OK, DOC_OK].concat(),
        0,
        EXPECTED,
        &["--partial"],
    );
    assert_eq!(
        s.checks(),
        [
            "FAIL check: src/lib.rs: b::three is ignored (no reason given) but is not a child entry point \
          in tests/expected-tests.txt: the suite ignores no other test (counted as one failure)"
        ]
    );
    // b::three and kill_child.
    assert_eq!(s.last(), "4 passed, 1 failed, 2 skipped");
    assert_eq!(s.status, 1);
}

#[test]
fn binaries_missing_from_the_list_or_the_run_fail_the_run() {
    let expected = format!("{EXPECTED}tests/gone.rs 5\n");
    let unlisted = LIB_OK.replace("src/lib.rs", "src/main.rs");
    let log = [LIB_OK, PARENT_OK, unlisted.as_str(), DOC_OK].concat();
    let s = summarize(&log, 0, &expected, &[]);
    assert_eq!(
        s.checks(),
        [
            "FAIL check: src/main.rs is not in tests/expected-tests.txt: add it with the number of tests \
             it must pass (counted as one failure)",
            "FAIL check: tests/store_behaviour.rs is in tests/expected-tests.txt but did not run \
             (counted as one failure)",
            "FAIL check: tests/gone.rs is in tests/expected-tests.txt but did not run (counted as one failure)",
        ]
    );
    assert_eq!(s.last(), "8 passed, 3 failed, 1 skipped");
    assert_eq!(s.status, 1);
}

#[test]
fn a_build_error_is_a_failure() {
    let log = "   Compiling taskgate v0.1.0\nerror[E0425]: cannot find value `x` in this scope\n";
    let s = summarize(log, 101, EXPECTED, &["--partial"]);
    assert!(s.has("error[E0425]: cannot find value `x` in this scope"));
    assert_eq!(s.last(), "0 passed, 1 failed, 0 skipped");
    assert_eq!(s.status, 1);
}

#[test]
fn a_member_crates_unit_tests_are_named_by_its_directory() {
    // cargo names the file inside its own package: both read src/lib.rs.
    let member = LIB_OK
        .replace(
            "taskgate-5e1f2a3b4c5d6e7f",
            "taskgate_store_engine-0f1e2d3c4b5a6978",
        )
        .replace("3 passed", "2 passed")
        .replace("test b::three ... ok\n", "");
    let member_doc = DOC_OK.replace("Doc-tests taskgate", "Doc-tests taskgate_store_engine");
    let expected =
        format!("{EXPECTED}crates/store-engine/src/lib.rs 2\ndoc-tests taskgate_store_engine 1\n");
    let log = [
        LIB_OK,
        PARENT_OK,
        member.as_str(),
        DOC_OK,
        member_doc.as_str(),
    ]
    .concat();
    let s = summarize(&log, 0, &expected, &["--selected"]);
    assert_eq!(s.checks(), Vec::<&str>::new());
    assert!(s.has("  src/lib.rs: 3 passed, 0 failed, 0 ignored (at least 3)"));
    assert!(s.has("  crates/store-engine/src/lib.rs: 2 passed, 0 failed, 0 ignored (at least 2)"));
    assert!(s.has("  doc-tests taskgate_store_engine: 1 passed, 0 failed, 0 ignored (at least 1)"));
    // 3 + 1 + 2 + 1 + 1 passed.
    assert_eq!(s.last(), "8 passed, 0 failed, 1 skipped");
}

/// The test binaries cargo builds from the workspace's sources: this
/// package's, and each member crate's unit and doc tests
/// (`crates/NAME/src/lib.rs`, `doc-tests taskgate_NAME`).
fn binaries_in_the_tree() -> BTreeSet<String> {
    let mut names: BTreeSet<String> = ["src/lib.rs", "src/main.rs", "doc-tests taskgate"]
        .map(str::to_owned)
        .into();
    for entry in std::fs::read_dir(repo().join("crates")).unwrap() {
        let dir = entry.unwrap().path();
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        if dir.join("src/lib.rs").is_file() {
            names.insert(format!("crates/{name}/src/lib.rs"));
            names.insert(format!("doc-tests taskgate_{}", name.replace('-', "_")));
        }
    }
    for entry in std::fs::read_dir(repo().join("tests")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") {
            names.insert(format!(
                "tests/{}",
                path.file_name().unwrap().to_string_lossy()
            ));
        }
    }
    names
}

#[test]
fn the_checked_in_list_names_every_test_binary_and_its_child_entry_points() {
    let text = std::fs::read_to_string(repo().join("tests/expected-tests.txt")).unwrap();
    let mut listed = BTreeSet::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap().trim();
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (name, rest) = match fields[0] {
            "doc-tests" => (format!("doc-tests {}", fields[1]), &fields[2..]),
            file => (file.to_owned(), &fields[1..]),
        };
        let minimum: u32 = rest[0]
            .parse()
            .unwrap_or_else(|_| panic!("{name}: minimum {:?} is not a number", rest[0]));
        // A test file holds tests; src/ and the doc tests may have none.
        assert!(
            minimum > 0 || !name.starts_with("tests/"),
            "{name}: a test file with a minimum of 0 tests checks nothing"
        );
        // Each child entry point is an ignored test of that file, saying so.
        for child in &rest[1..] {
            let source = std::fs::read_to_string(repo().join(&name)).unwrap();
            let marked = "#[ignore = \"child entry point: ";
            let at = source
                .find(&format!("fn {child}()"))
                .unwrap_or_else(|| panic!("{name} has no fn {child}()"));
            assert!(
                source[..at]
                    .trim_end()
                    .lines()
                    .last()
                    .unwrap_or("")
                    .contains(marked),
                "{name}: {child} is listed as a child entry point but not marked {marked}…\"]"
            );
        }
        listed.insert(name);
    }
    assert_eq!(listed, binaries_in_the_tree());
    assert!(Path::new(&repo().join("scripts/test-summary.py")).is_file());
}

#[test]
fn a_run_of_chosen_binaries_holds_each_to_its_minimum_and_leaves_out_the_rest() {
    let log = [LIB_OK, CRASHED.replace("4 tests", "1 test").as_str()].concat();
    // The store binary ran one test, reported it and ended normally.
    let log = log.replace(
        "test limits_are_named ... ok\nerror: test failed, to rerun pass `--test store_behaviour`",
        "\ntest result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.00s\n",
    );
    let s = summarize(&log, 0, EXPECTED, &["--selected"]);
    assert_eq!(
        s.checks(),
        [
            "FAIL check: tests/store_behaviour.rs passed 1 tests, fewer than the 4 it must pass \
          (counted as one failure)"
        ]
    );
    assert_eq!(s.last(), "4 passed, 1 failed, 0 skipped");
    assert_eq!(s.status, 1);
}
