//! Every refused start, produced for real against the real binary: each
//! exits with its own code and one line naming the problem, and leaves
//! every file of the state directory as it was.
//!
//! Invariant 8 of the map: Every refused start has its own class and exit code
//! and leaves the files as they were (the one file it may create is a missing
//! `tasks.lock`, empty and private, because the lock needs it). Guarded by:
//! `tests/startup_refusals.rs` (every class; every file of the state directory
//! compared: names, modes, owner, contents, link targets;
//! `a_refused_start_creates_nothing_but_a_missing_lock_file`; the artifacts
//! directory, which comes after the schema step, is inspected before the first
//! write:
//! `an_artifacts_directory_serve_cannot_write_refuses_before_anything_is_written`,
//! for a start that would initialise, migrate, or record the store in the lock
//! file),
//! `tests/migration.rs::crash_between_migration_statements_leaves_v1_intact`,
//! `tests/exit_codes.rs::restart_prevent_exit_status_lists_exactly_the_non_retryable_classes`
//!
//! What this file proves: every refusal class through the real binary; the
//! whole state directory unchanged

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use common::*;

/// One entry of a directory tree as a refused start must leave it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    Dir { mode: u32, uid: u32 },
    File { mode: u32, uid: u32, sha256: String },
    Link { target: PathBuf },
    Other { mode: u32 },
}

/// Every entry under `root` (and `root` itself, as ""), by relative path:
/// names, modes, owners, file contents and link targets. No link is
/// followed.
fn tree(root: &Path) -> BTreeMap<PathBuf, Entry> {
    fn walk(root: &Path, rel: &Path, out: &mut BTreeMap<PathBuf, Entry>) {
        let path = root.join(rel);
        let meta =
            std::fs::symlink_metadata(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mode = meta.mode() & 0o7777;
        let uid = meta.uid();
        let entry = if meta.file_type().is_symlink() {
            Entry::Link {
                target: std::fs::read_link(&path).unwrap(),
            }
        } else if meta.is_dir() {
            let mut names: Vec<_> = std::fs::read_dir(&path)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            names.sort();
            for n in names {
                walk(root, &rel.join(n), out);
            }
            Entry::Dir { mode, uid }
        } else if meta.is_file() {
            Entry::File {
                mode,
                uid,
                sha256: sha256_file(&path),
            }
        } else {
            Entry::Other { mode }
        };
        out.insert(rel.to_path_buf(), entry);
    }
    let mut out = BTreeMap::new();
    walk(root, Path::new(""), &mut out);
    out
}

/// Gives a fixture the lock file a directory that has been served has,
/// naming the pid of its last server. (Taking the lock needs the file, so a
/// start on a directory without one creates it, empty and 0600: see
/// `a_refused_start_creates_nothing_but_a_missing_lock_file`.)
fn served_before(dir: &Path) {
    let lock = dir.join("tasks.lock");
    if std::fs::symlink_metadata(&lock).is_err() {
        std::fs::write(&lock, "4242\n").unwrap();
        chmod(&lock, 0o600);
    }
}

/// Runs `check` and `serve` on `dir`; both must refuse with `code`, print
/// one line containing every `needles`, and leave every file of the state
/// directory exactly as it was.
fn assert_refused(dir: &Path, extra: &[&str], code: i32, needles: &[&str]) {
    served_before(dir);
    assert_refused_as_is(dir, extra, code, needles, &|args| {
        taskgate(args, &[("HOME", "/nonexistent")])
    });
}

/// [`assert_refused`] for a directory prepared to the last byte (no lock
/// file is added), with `run` running the binary with `args`.
fn assert_refused_as_is(
    dir: &Path,
    extra: &[&str],
    code: i32,
    needles: &[&str],
    run: &dyn Fn(&[&str]) -> std::process::Output,
) {
    let before = tree(dir);
    let dir_s = dir.to_str().unwrap();
    for sub in ["check", "serve"] {
        let mut args = vec![sub, "--state-dir", dir_s];
        if sub == "serve" {
            args.extend(["--listen", "127.0.0.1:0"]);
        }
        args.extend(extra);
        let out = run(&args);
        let line = one_line_stderr(&out);
        assert_eq!(out.status.code(), Some(code), "{sub}: {line}");
        assert!(line.starts_with("taskgate: refused: "), "{line}");
        assert!(line.contains(&format!("(exit {code})")), "{line}");
        for n in needles {
            assert!(line.contains(n), "{sub}: {line:?} lacks {n:?}");
        }
        assert_eq!(tree(dir), before, "{sub} changed the state directory");
    }
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn chown(p: &Path, uid: u32) {
    nix::unistd::chown(p, Some(nix::unistd::Uid::from_raw(uid)), None).unwrap();
}

fn valid_store() -> (tempfile::TempDir, std::path::PathBuf) {
    let root = private_dir();
    let dir = state_dir(root.path());
    populate(&dir, 6);
    served_before(&dir);
    (root, dir)
}

#[test]
fn a_valid_store_passes_check() {
    let (_root, dir) = valid_store();
    let out = taskgate(&["check", "--state-dir", dir.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("schema {}", taskgate::store::SCHEMA_VERSION))
            && stdout.contains("6 tasks retained"),
        "{stdout}"
    );
}

#[test]
fn group_or_other_bits_on_the_directory() {
    let (_root, dir) = valid_store();
    chmod(&dir, 0o750);
    assert_refused(&dir, &[], 77, &["unsafe path", "mode 0750", "chmod 700"]);
}

#[test]
fn group_or_other_bits_on_a_file() {
    let (_root, dir) = valid_store();
    chmod(&dir.join("tasks.db"), 0o640);
    assert_refused(&dir, &[], 77, &["tasks.db", "mode 0640"]);
}

#[test]
fn symlinked_database() {
    let (root, dir) = valid_store();
    let elsewhere = root.path().join("real.db");
    std::fs::rename(dir.join("tasks.db"), &elsewhere).unwrap();
    symlink(&elsewhere, dir.join("tasks.db")).unwrap();
    let before = sha256_file(&elsewhere);
    assert_refused(&dir, &[], 77, &["tasks.db", "symbolic link"]);
    assert_eq!(sha256_file(&elsewhere), before);
}

#[test]
fn symlinked_lock_file() {
    let (root, dir) = valid_store();
    let target = root.path().join("lock-target");
    std::fs::write(&target, "").unwrap();
    std::fs::remove_file(dir.join("tasks.lock")).ok();
    symlink(&target, dir.join("tasks.lock")).unwrap();
    let before = sha256_file(&target);
    assert_refused(&dir, &[], 77, &["tasks.lock", "symbolic link"]);
    assert_eq!(sha256_file(&target), before);
}

#[test]
fn hard_linked_database() {
    let (root, dir) = valid_store();
    std::fs::hard_link(dir.join("tasks.db"), root.path().join("other-name")).unwrap();
    assert_refused(&dir, &[], 77, &["tasks.db", "2 hard links"]);
}

#[test]
fn database_owned_by_someone_else() {
    prereq::require_root("chowns the database to another user");
    let (_root, dir) = valid_store();
    chown(&dir.join("tasks.db"), 4242);
    assert_refused(&dir, &[], 77, &["tasks.db", "uid 4242"]);
}

#[test]
fn directory_owned_by_someone_else() {
    prereq::require_root("chowns the state directory to another user");
    let (_root, dir) = valid_store();
    chown(&dir, 4242);
    assert_refused(&dir, &[], 77, &["uid 4242", "chown"]);
}

#[test]
fn untrusted_ancestor_writable_by_others() {
    let root = private_dir();
    let open = root.path().join("open");
    std::fs::create_dir(&open).unwrap();
    let dir = state_dir(&open);
    populate(&dir, 2);
    chmod(&open, 0o777);
    assert_refused(&dir, &[], 77, &["untrusted ancestor", "0777"]);
}

#[test]
fn sticky_ancestor_must_be_root_owned() {
    prereq::require_root("chowns a directory to another user");
    let root = private_dir();
    let sticky = root.path().join("sticky");
    std::fs::create_dir(&sticky).unwrap();
    let dir = state_dir(&sticky);
    populate(&dir, 2);
    chmod(&sticky, 0o1777);
    // Root-owned and sticky, like /tmp: trusted.
    let out = taskgate(&["check", "--state-dir", dir.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    // Sticky but owned by another user: that user could replace our entry.
    chown(&sticky, 4242);
    assert_refused(&dir, &[], 77, &["untrusted ancestor", "uid 4242"]);
}

#[test]
fn missing_configured_directory() {
    let root = private_dir();
    let dir = root.path().join("absent");
    let out = taskgate(&["check", "--state-dir", dir.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(77));
    assert!(one_line_stderr(&out).contains("install -d -m 700"));
}

fn spawn_server(dir: &Path) -> Daemon {
    Daemon::builder().state_dir(dir).start()
}

#[test]
fn second_process_is_refused_by_the_lock() {
    let (_root, dir) = valid_store();
    let first = spawn_server(&dir);
    let pid = first.child.id().to_string();
    for sub in ["serve", "check"] {
        let out = taskgate(
            &[
                sub,
                "--state-dir",
                dir.to_str().unwrap(),
                "--listen",
                "127.0.0.1:0",
            ][..if sub == "serve" { 5 } else { 3 }],
            &[],
        );
        let line = one_line_stderr(&out);
        assert_eq!(out.status.code(), Some(75), "{line}");
        assert!(line.contains("tasks.lock") && line.contains(&pid), "{line}");
        assert!(line.contains("never delete the lock file"), "{line}");
    }
    assert!(first.stop().success());
    assert!(
        dir.join("tasks.lock").exists(),
        "the lock file is never deleted"
    );
}

/// The pid written in tasks.lock is the last process that recorded
/// itself; the refusal must name the process that really holds the flock
/// (from the kernel's lock table), here this test, not the stale 4242.
#[test]
fn a_held_lock_names_its_real_holder_not_the_pid_in_the_file() {
    let (_root, dir) = valid_store();
    assert_eq!(
        std::fs::read_to_string(dir.join("tasks.lock")).unwrap(),
        "4242\n"
    );
    let held = std::fs::OpenOptions::new()
        .read(true)
        .open(dir.join("tasks.lock"))
        .unwrap();
    held.try_lock().unwrap();
    let me = std::process::id();
    let comm = std::fs::read_to_string("/proc/self/comm").unwrap();
    let pid_and_comm = format!("pid {me}, {}", comm.trim());
    assert_refused(
        &dir,
        &[],
        75,
        &["lifetime lock is held", pid_and_comm.as_str()],
    );
    for sub in ["check", "serve"] {
        let out = taskgate(&[sub, "--state-dir", dir.to_str().unwrap()], &[]);
        let said = one_line_stderr(&out);
        assert!(!said.contains("4242"), "{sub}: {said}");
    }
    drop(held);
}

/// Root running `serve` against the service user's directory is told how
/// to run the service (systemctl, or runuser as the owner), not to chown
/// the store to root; `check` as root still acts on the owner's behalf.
#[test]
fn root_serving_the_service_users_directory_is_told_to_run_it_as_the_owner() {
    prereq::require_root("chowns the state directory to another user");
    let (_root, dir) = valid_store();
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    for entry in std::fs::read_dir(&dir).unwrap() {
        chown(&entry.unwrap().path(), nobody.uid.as_raw());
    }
    chown(&dir, nobody.uid.as_raw());
    let before = tree(&dir);
    let out = taskgate(
        &[
            "serve",
            "--state-dir",
            dir.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ],
        &[],
    );
    let line = one_line_stderr(&out);
    assert_eq!(out.status.code(), Some(77), "{line}");
    assert!(line.contains("systemctl start taskgate"), "{line}");
    assert!(
        line.contains("runuser -u nobody -- taskgate serve"),
        "{line}"
    );
    assert!(!line.contains("chown it"), "{line}");
    assert_eq!(tree(&dir), before);
    let out = taskgate(&["check", "--state-dir", dir.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{out:?}");
}

fn with_db(dir: &Path, sql: &str) {
    let c = rusqlite::Connection::open(dir.join("tasks.db")).unwrap();
    c.execute_batch(sql).unwrap();
    c.close().unwrap();
}

#[test]
fn future_schema_version() {
    let (_root, dir) = valid_store();
    with_db(&dir, "PRAGMA user_version = 99");
    assert_refused(&dir, &[], 65, &["schema version 99", "newer"]);
}

#[test]
fn non_empty_unversioned_database() {
    let root = private_dir();
    let dir = state_dir(root.path());
    with_db(
        &dir,
        "PRAGMA page_size=4096; PRAGMA journal_mode=WAL; CREATE TABLE other(x); INSERT INTO other VALUES (1);",
    );
    chmod(&dir.join("tasks.db"), 0o600);
    assert_refused(&dir, &[], 65, &["without a taskgate schema version"]);
}

#[test]
fn corrupted_page() {
    let root = private_dir();
    let dir = state_dir(root.path());
    populate(&dir, 200);
    let db = dir.join("tasks.db");
    let mut bytes = std::fs::read(&db).unwrap();
    assert!(bytes.len() > 6 * 4096, "need several pages");
    // Overwrite a whole b-tree page in the middle of the file (header page
    // untouched), as a torn or misdirected write would.
    let page = bytes.len() / 4096 / 2;
    for b in &mut bytes[page * 4096..(page + 1) * 4096] {
        *b = 0x5a;
    }
    std::fs::write(&db, &bytes).unwrap();
    assert_refused(&dir, &[], 65, &["corrupt", "restore a known-good snapshot"]);
}

#[test]
fn not_a_database() {
    let root = private_dir();
    let dir = state_dir(root.path());
    std::fs::write(dir.join("tasks.db"), vec![0x42u8; 8192]).unwrap();
    chmod(&dir.join("tasks.db"), 0o600);
    assert_refused(&dir, &[], 65, &["corrupt"]);
}

#[test]
fn undecodable_payload() {
    let (_root, dir) = valid_store();
    with_db(
        &dir,
        "UPDATE tasks SET payload = CAST('{not json' AS BLOB) WHERE rowid = (SELECT min(rowid) FROM tasks WHERE payload IS NOT NULL);",
    );
    assert_refused(&dir, &[], 65, &["undecodable payload", "tg-"]);
}

#[test]
fn wrong_page_size() {
    let root = private_dir();
    let dir = state_dir(root.path());
    with_db(
        &dir,
        "PRAGMA page_size=1024; PRAGMA journal_mode=WAL; PRAGMA user_version=2; CREATE TABLE t(x);",
    );
    chmod(&dir.join("tasks.db"), 0o600);
    assert_refused(&dir, &[], 65, &["page_size", "1024", "4096"]);
}

#[test]
fn rollback_journal_database() {
    let (_root, dir) = valid_store();
    with_db(&dir, "PRAGMA journal_mode=DELETE;");
    assert_refused(&dir, &[], 65, &["journal_mode", "delete"]);
}

#[test]
fn database_larger_than_the_page_cap() {
    let (_root, dir) = valid_store();
    let root = private_dir();
    let cfg = root.path().join("c.toml");
    std::fs::write(&cfg, "[store]\nmax_db_pages = 64\n").unwrap();
    // Fill past 64 pages first.
    let rt = runtime();
    rt.block_on(async {
        let (store, _) =
            taskgate::store::Store::open(taskgate::store::StoreOptions::new(dir.join("tasks.db")))
                .unwrap();
        for _ in 0..40 {
            let id = store
                .create(new_task(86_400_000))
                .await
                .unwrap()
                .record()
                .id
                .clone();
            store
                .finish(
                    &id,
                    taskgate::store::TaskStatus::Completed,
                    Some(taskgate::store::Outcome::Result(serde_json::json!(
                        "y".repeat(15000)
                    ))),
                )
                .await
                .unwrap();
        }
        store.shutdown().await.unwrap();
    });
    assert_refused(
        &dir,
        &["--config", cfg.to_str().unwrap()],
        65,
        &["max_page_count", "64"],
    );
}

#[test]
fn bad_configuration() {
    let (root, dir) = valid_store();
    let cases: &[(&str, &[&str])] = &[
        ("[store]\nqueue_dept = 3\n", &["queue_dept", "line 2"]),
        ("[stor]\n", &["stor"]),
        (
            "[store]\nqueue_depth = 0\n",
            &["store.queue_depth", "out of range"],
        ),
        (
            "[store]\ndirectory = \"relative/dir\"\n",
            &["store.directory", "relative"],
        ),
        ("[server]\nlisten = 5\n", &["listen", "line 2"]),
        // `check` runs exactly the validations `serve` runs: a non-loopback
        // address is refused by both, not only when serving.
        (
            "[server]\nlisten = \"0.0.0.0:8765\"\n",
            &["server.listen = 0.0.0.0:8765", "not a loopback address"],
        ),
        ("this is not toml", &["c.toml"]),
    ];
    let cfg = root.path().join("c.toml");
    for (text, needles) in cases {
        std::fs::write(&cfg, text).unwrap();
        assert_refused(&dir, &["--config", cfg.to_str().unwrap()], 78, needles);
    }
    // The environment layer is checked the same way, and named.
    for sub in ["check", "serve"] {
        let out = taskgate(
            &[sub, "--state-dir", dir.to_str().unwrap()],
            &[("TASKGATE_STORE_MAX_LIVE_TASKS", "0")],
        );
        assert_eq!(out.status.code(), Some(78));
        assert!(one_line_stderr(&out).contains("TASKGATE_STORE_MAX_LIVE_TASKS"));
    }
    let out = taskgate(
        &["check", "--state-dir", dir.to_str().unwrap()],
        &[("TASKGATE_SERVER_LISTEN", "nonsense")],
    );
    assert_eq!(out.status.code(), Some(78));
    assert!(one_line_stderr(&out).contains("server.listen"));
    let out = taskgate(&["check", "--state-dir", "relative/dir"], &[]);
    assert_eq!(out.status.code(), Some(78));
    assert!(one_line_stderr(&out).contains("relative"));
}

#[test]
fn non_loopback_listen_without_authentication() {
    let (_root, dir) = valid_store();
    let before = tree(&dir);
    let out = taskgate(
        &[
            "serve",
            "--state-dir",
            dir.to_str().unwrap(),
            "--listen",
            "0.0.0.0:8765",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(78));
    assert!(one_line_stderr(&out).contains("not a loopback address"));
    assert_eq!(tree(&dir), before);
}

#[test]
fn unknown_flag_is_a_usage_error() {
    let out = taskgate(&["serve", "--no-such-flag"], &[]);
    assert_eq!(out.status.code(), Some(64));
    let out = taskgate(&["--help"], &[]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("Exit codes"));
}

#[test]
fn default_directory_is_created_private() {
    let root = private_dir();
    let xdg = root.path().join("xdg");
    let xdg_s = xdg.to_str().unwrap();
    // check does not create anything.
    let out = taskgate(&["check"], &[("XDG_STATE_HOME", xdg_s)]);
    assert_eq!(out.status.code(), Some(0));
    assert!(!xdg.exists());
    let daemon = Daemon::builder().env("XDG_STATE_HOME", xdg_s).start();
    let dir = xdg.join("taskgate");
    let ready = http_get(daemon.port, "/readyz");
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    let status = daemon.stop();
    assert!(status.success(), "{status:?}");
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    for f in ["tasks.db", "tasks.lock"] {
        let m = std::fs::metadata(dir.join(f)).unwrap().permissions().mode() & 0o777;
        assert_eq!(m, 0o600, "{f}");
    }
    // A clean stop checkpointed and removed the WAL sidecars.
    assert!(!dir.join("tasks.db-wal").exists());
    assert!(!dir.join("tasks.db-shm").exists());
}

#[test]
fn pristine_empty_file_is_initialised() {
    let root = private_dir();
    let dir = state_dir(root.path());
    std::fs::write(dir.join("tasks.db"), b"").unwrap();
    chmod(&dir.join("tasks.db"), 0o600);
    let out = taskgate(&["check", "--state-dir", dir.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("empty"));
    let rt = runtime();
    rt.block_on(async {
        let (store, report) =
            taskgate::store::Store::open(taskgate::store::StoreOptions::new(dir.join("tasks.db")))
                .unwrap();
        assert!(report.initialized);
        store.shutdown().await.unwrap();
    });
}

#[test]
fn a_refused_start_creates_nothing_but_a_missing_lock_file() {
    let root = private_dir();
    let dir = state_dir(root.path());
    std::fs::write(dir.join("tasks.db"), vec![0x42u8; 8192]).unwrap();
    chmod(&dir.join("tasks.db"), 0o600);
    let mut expected = tree(&dir);
    let out = taskgate(
        &[
            "serve",
            "--state-dir",
            dir.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(65), "{out:?}");
    // The lock must exist to be held: it is created empty and private, and
    // nothing else is.
    expected.insert(
        PathBuf::from("tasks.lock"),
        Entry::File {
            mode: 0o600,
            uid: nix::unistd::geteuid().as_raw(),
            sha256: taskgate::store::Digest::of(b"").to_hex(),
        },
    );
    assert_eq!(tree(&dir), expected);
}

#[test]
fn a_state_directory_under_a_non_ascii_path_is_checked_and_served() {
    let root = private_dir();
    let parent = root.path().join("ü");
    std::fs::create_dir(&parent).unwrap();
    chmod(&parent, 0o700);
    let dir = state_dir(&parent);
    populate(&dir, 4);
    let out = taskgate(&["check", "--state-dir", dir.to_str().unwrap()], &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "check: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("4 tasks retained"), "{stdout}");

    let daemon = Daemon::builder().state_dir(&dir).start();
    let ready = http_get(daemon.port, "/readyz");
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    let status = daemon.stop();
    assert!(status.success(), "{status:?}");
    let out = taskgate(&["check", "--state-dir", dir.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

#[test]
fn an_address_in_use_is_refused_before_the_directory_changes() {
    let (_root, dir) = valid_store();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let before = tree(&dir);
    let out = taskgate(
        &[
            "serve",
            "--state-dir",
            dir.to_str().unwrap(),
            "--listen",
            &addr,
        ],
        &[],
    );
    let line = one_line_stderr(&out);
    assert_eq!(out.status.code(), Some(74), "{line}");
    assert!(line.contains("cannot listen"), "{line}");
    assert_eq!(
        tree(&dir),
        before,
        "a refused start changed the state directory"
    );
}

#[test]
fn check_says_how_serve_will_end_the_tasks_that_were_running() {
    let root = private_dir();
    let dir = state_dir(root.path());
    // Tasks 1, 3 and 5 are left working, as a crash leaves them; 1 also
    // has a committed cancel.
    let ids = populate(&dir, 6);
    with_db(
        &dir,
        &format!(
            "UPDATE tasks SET cancel_requested = 1 WHERE id = '{}'",
            ids[1]
        ),
    );
    let out = taskgate(&["check", "--state-dir", dir.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("3 tasks were running")
            && stdout.contains("2 failed (interrupted), 1 cancelled"),
        "{stdout}"
    );
}

/// Serves `dir` once and stops it cleanly.
fn serve_once(dir: &Path) {
    let daemon = spawn_server(dir);
    assert!(daemon.stop().success());
}

/// The store identity the directory recorded beside its database.
fn recorded_store(dir: &Path) -> Option<String> {
    std::fs::read_to_string(dir.join("tasks.lock"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("store "))
        .map(str::to_string)
}

/// The store identity the database holds.
fn db_identity(dir: &Path) -> Option<String> {
    let c = rusqlite::Connection::open(dir.join("tasks.db")).unwrap();
    let id = c
        .query_row("SELECT id FROM store_identity", [], |r| r.get(0))
        .ok();
    c.close().unwrap();
    id
}

#[test]
fn an_emptied_or_removed_database_in_a_served_directory_is_refused() {
    let (_root, dir) = valid_store();
    serve_once(&dir);
    assert!(recorded_store(&dir).is_some(), "serve records the store");
    let db = dir.join("tasks.db");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&db)
        .unwrap()
        .set_len(0)
        .unwrap();
    assert_refused(
        &dir,
        &[],
        65,
        &[
            "database replaced",
            "tasks.db is empty",
            "restore the store's snapshot or move the directory aside",
        ],
    );
    std::fs::remove_file(&db).unwrap();
    assert_refused(&dir, &[], 65, &["database replaced", "tasks.db is missing"]);
}

#[test]
fn a_database_from_another_store_is_refused() {
    let (_root, dir) = valid_store();
    serve_once(&dir);
    let (_other_root, other) = valid_store();
    serve_once(&other);
    std::fs::copy(other.join("tasks.db"), dir.join("tasks.db")).unwrap();
    chmod(&dir.join("tasks.db"), 0o600);
    assert_refused(&dir, &[], 65, &["database replaced", "another store"]);
    // A database with no identity at all (an older store's) is no
    // replacement for the one recorded either.
    with_db(&dir, "DROP TABLE store_identity");
    assert_refused(&dir, &[], 65, &["database replaced", "no store identity"]);
}

#[test]
fn an_interrupted_first_provisioning_resumes() {
    let root = private_dir();
    let dir = state_dir(root.path());
    let dir_s = dir.to_str().unwrap();
    // Killed inside the initialising transaction: nothing was committed,
    // so nothing is recorded beside the database.
    let out = taskgate(
        &["serve", "--state-dir", dir_s, "--listen", "127.0.0.1:0"],
        &[("TASKGATE_TEST_CRASH_AT", "mid-migration")],
    );
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&out.status),
        Some(libc::SIGABRT),
        "{out:?}"
    );
    assert_eq!(recorded_store(&dir), None);
    let out = taskgate(&["check", "--state-dir", dir_s], &[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    // The restart provisions the store; killed right after, the next start
    // serves the same store.
    spawn_server(&dir).kill();
    let id = recorded_store(&dir).expect("the first start records its store");
    serve_once(&dir);
    assert_eq!(recorded_store(&dir).as_ref(), Some(&id));
    assert_eq!(db_identity(&dir).as_ref(), Some(&id));
}

#[test]
fn a_store_made_before_identities_gets_one_on_its_first_start() {
    let (_root, dir) = valid_store();
    // As a store made by an earlier version: no identity in the database,
    // none recorded beside it.
    with_db(&dir, "DROP TABLE store_identity");
    assert_eq!(recorded_store(&dir), None);
    let dir_s = dir.to_str().unwrap();
    let out = taskgate(&["check", "--state-dir", dir_s], &[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    serve_once(&dir);
    let id = recorded_store(&dir).expect("serve records the store");
    assert_eq!(db_identity(&dir), Some(id));
    let out = taskgate(&["check", "--state-dir", dir_s], &[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("6 tasks retained"));
}

/// Runs the binary with `args` where `dir` cannot be written by this
/// process: mode 0500 for a user; for root, whom permission bits do not
/// stop, a read-only bind mount of `dir` in a private mount namespace.
fn taskgate_with_read_only(dir: &Path, args: &[&str]) -> std::process::Output {
    let mut cmd = if nix::unistd::geteuid().is_root() {
        let mut cmd = std::process::Command::new("/usr/bin/unshare");
        cmd.args(["-m", "--propagation", "private", "/bin/sh", "-c"])
            .arg(r#"mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" || exit 97; shift; exec "$@""#)
            .arg("sh")
            .arg(dir)
            .arg(BIN);
        cmd
    } else {
        std::process::Command::new(BIN)
    };
    cmd.args(args)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", "/nonexistent");
    let out = cmd.output().expect("run taskgate");
    assert_ne!(
        out.status.code(),
        Some(97),
        "the read-only mount failed: {out:?}"
    );
    out
}

/// The refusals that come after the database's validation in startup's
/// order (the artifacts directory, which serving writes to) are decided
/// before the first write too: a start that would initialise a new
/// database, migrate a schema-1 one, or record a store's identity in the
/// lock file refuses with every file as it was, the interrupted write's
/// temporary file included.
#[test]
fn an_artifacts_directory_serve_cannot_write_refuses_before_anything_is_written() {
    let v1 = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1.db");
    type Prepare<'a> = &'a dyn Fn(&Path);
    let cases: [(&str, Prepare); 3] = [
        ("no database yet (would be initialised)", &|_| {}),
        ("a schema-1 database (would be migrated)", &|dir| {
            std::fs::copy(&v1, dir.join("tasks.db")).unwrap();
            chmod(&dir.join("tasks.db"), 0o600);
        }),
        ("a store not yet recorded in the lock file", &|dir| {
            populate(dir, 3);
        }),
    ];
    for (what, prepare) in cases {
        let root = private_dir();
        let dir = state_dir(root.path());
        prepare(&dir);
        served_before(&dir);
        let artifacts = dir.join("artifacts");
        std::fs::create_dir(&artifacts).unwrap();
        let tmp = artifacts.join(format!(
            ".{}.tmp",
            taskgate::store::TaskId::generate().unwrap().as_str()
        ));
        std::fs::write(&tmp, b"half a result").unwrap();
        chmod(&tmp, 0o600);
        let mode = if nix::unistd::geteuid().is_root() {
            0o700
        } else {
            0o500
        };
        chmod(&artifacts, mode);
        let lock_before = std::fs::read(dir.join("tasks.lock")).unwrap();
        println!("{what}");
        assert_refused_as_is(
            &dir,
            &[],
            77,
            &["artifacts", "cannot list and write it"],
            &|args| taskgate_with_read_only(&artifacts, args),
        );
        assert_eq!(
            std::fs::read(dir.join("tasks.lock")).unwrap(),
            lock_before,
            "{what}"
        );
        assert!(tmp.exists(), "{what}: the temporary was removed");
        chmod(&artifacts, 0o700);
        // Writable again, the same directory serves.
        serve_once(&dir);
        assert!(!tmp.exists(), "{what}: a start removes the temporaries");
        assert!(recorded_store(&dir).is_some(), "{what}");
    }
}
