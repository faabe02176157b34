//! The private admin socket, through the real binary and a real socket:
//! `taskgate status` (text and JSON), who may connect, the socket's bounds
//! (idle, oversize, flood), stale sockets, and online snapshots taken while
//! tasks run and creates go on, restored with `taskgate restore` and
//! verified with `taskgate check`.
//!
//! What this file proves: the admin socket: `status` text and JSON, 69 with no
//! daemon, a stale socket replaced after SIGKILL, another uid refused (mode and
//! credentials; the client run from a private copy of the binary that user can
//! reach), a request without this start's admin key (none, wrong, the last
//! start's, not JSON) refused with one identical line and the key in no log,
//! environment or command line, request and connection bounds, an online
//! snapshot while a task runs and creates continue, restored and checked,
//! `--into … --keep N`; SIGTERM during a snapshot (the store thread held by the
//! stall hook): finished inside the stop's 10 s wait it is complete and
//! verifies, still copying past it the store abandons it between steps and
//! `DEST` is gone, the daemon exits 0 and its store checks

mod common;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

fn config(dir: &Path) -> PathBuf {
    write_config(
        dir,
        "",
        &[Tool::new("nap")
            .script("sleep $0; printf rested")
            .args(&["{seconds}"])
            .task("optional")
            .timeout_secs(120)
            .param("seconds", "number")],
    )
}

fn start(root: &Path, state: &Path) -> Daemon {
    Daemon::start(&config(root), state, &root.join("daemon.log"))
}

fn status_json(state: &Path) -> Value {
    let out = taskgate(
        &["status", "--json", "--state-dir", state.to_str().unwrap()],
        &[],
    );
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).expect("status --json prints one JSON object")
}

/// The admin key the serving daemon recorded in `tasks.lock`.
fn admin_key(state: &Path) -> String {
    let text = std::fs::read_to_string(state.join("tasks.lock")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("admin-key "))
        .unwrap_or_else(|| panic!("no admin key in tasks.lock: {text:?}"))
        .to_string()
}

/// One raw request line on the socket; the answer line.
fn raw_request(sock: &Path, line: &str) -> String {
    let mut s = UnixStream::connect(sock).unwrap();
    s.write_all(format!("{line}\n").as_bytes()).unwrap();
    read_to_close(&mut s, Duration::from_secs(10)).0
}

/// Starts a `nap` task of `seconds` and returns its ID.
fn start_nap(d: &Daemon, seconds: u64) -> String {
    let rt = runtime();
    rt.block_on(async {
        let r = d
            .client(true)
            .call_tool("nap", json!({ "seconds": seconds }), None)
            .await
            .expect("call nap");
        r["taskId"].as_str().expect("a task handle").to_string()
    })
}

#[test]
fn status_shows_one_screen_and_json_for_scripts() {
    let root = private_dir();
    let state = state_dir(root.path());
    let d = start(root.path(), &state);
    let task = start_nap(&d, 60);
    let polled = runtime().block_on(d.client(true).get_task(&task)).unwrap();
    assert_eq!(polled["status"], "working", "{polled}");

    let out = taskgate(&["status", "--state-dir", state.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let canonical = std::fs::canonicalize(&state).unwrap();
    for expected in [
        format!("taskgate {}", env!("CARGO_PKG_VERSION")),
        format!("state directory  {}", canonical.display()),
        format!(
            "listening on     127.0.0.1:{}",
            d.url().split(':').nth(2).unwrap().trim_end_matches("/mcp")
        ),
        format!(
            "admin socket     {}",
            canonical.join("admin.sock").display()
        ),
        "task store       serving".to_string(),
        "tasks            1 retained, 1 unexpired, 1 running".to_string(),
        "since start      1 tool runs started, 1 task reads from the store".to_string(),
        "store queue      0 of ".to_string(),
        "fallbacks        none".to_string(),
    ] {
        assert!(
            text.contains(&expected),
            "{expected:?} missing from:\n{text}"
        );
    }

    let s = status_json(&state);
    assert_eq!(s["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(s["pid"], d.pid().as_raw());
    assert_eq!(s["state_dir"], canonical.to_str().unwrap());
    assert_eq!(s["store"], "serving");
    assert_eq!(s["tasks"], json!({"retained": 1, "unexpired": 1}));
    assert_eq!(s["running"], 1);
    assert_eq!(s["runs_started"], 1);
    assert_eq!(s["task_reads"], 1);
    assert_eq!(s["fallbacks"]["total"], 0);
    assert_eq!(s["snapshot_running"], false);
    assert!(s["queue"]["capacity"].as_u64().unwrap() > 0);
    assert!(s["wal_bytes"].is_u64());
    assert!(s["uptime_secs"].is_u64());
    // Every durable part says what it holds on disk: the task store its
    // database (and WAL) in the state directory, the approval journal
    // nothing (no tool here needs approval).
    let parts = s["parts"].as_array().expect("parts");
    assert_eq!(parts.len(), 2, "{parts:?}");
    assert_eq!(parts[1]["name"], "approval-journal");
    assert_eq!(parts[1]["files"], 0, "{parts:?}");
    assert_eq!(parts[0]["name"], "task-store");
    assert_eq!(parts[0]["dir"], canonical.to_str().unwrap());
    assert!(parts[0]["files"].as_u64().unwrap() >= 1, "{parts:?}");
    let on_disk: u64 = ["tasks.db", "tasks.db-wal"]
        .iter()
        .filter_map(|f| std::fs::metadata(state.join(f)).ok())
        .map(|m| m.len())
        .sum();
    assert!(parts[0]["bytes"].as_u64().unwrap() >= 4096, "{parts:?}");
    assert!(
        parts[0]["bytes"].as_u64().unwrap() <= on_disk,
        "{parts:?} of {on_disk}"
    );
    assert!(
        text.contains("durable part     task-store: "),
        "no durable part line in:\n{text}"
    );

    // While stopping, the answer says so; after the stop nothing answers.
    let rt = runtime();
    rt.block_on(async { d.client(true).cancel_task(&task).await.unwrap() });
    let status = d.stop();
    assert!(status.success());
    assert!(
        !state.join("admin.sock").exists(),
        "a clean stop removes the admin socket"
    );
    let out = taskgate(&["status", "--state-dir", state.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    assert!(
        one_line_stderr(&out).contains("no daemon is serving"),
        "{out:?}"
    );
}

#[test]
fn status_without_a_daemon_says_so_with_exit_69() {
    let root = private_dir();
    let state = state_dir(root.path());
    let out = taskgate(&["status", "--state-dir", state.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    let line = one_line_stderr(&out);
    assert!(line.contains("no daemon is serving"), "{line}");
    assert!(line.contains("daemon unreachable (exit 69)"), "{line}");
    // The online backup says the same, and creates nothing.
    let dest = root.path().join("snap");
    let out = taskgate(
        &[
            "backup",
            "--online",
            "--state-dir",
            state.to_str().unwrap(),
            "--to",
            dest.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    assert!(!dest.exists());
}

#[test]
fn a_stale_socket_left_by_a_killed_daemon_is_replaced_at_the_next_start() {
    let root = private_dir();
    let state = state_dir(root.path());
    let d = start(root.path(), &state);
    d.kill();
    let sock = state.join("admin.sock");
    assert!(sock.exists(), "SIGKILL leaves the socket file behind");
    let out = taskgate(&["status", "--state-dir", state.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    assert!(
        one_line_stderr(&out).contains("nothing listening"),
        "{out:?}"
    );

    let d = start(root.path(), &state);
    let s = status_json(&state);
    assert_eq!(s["pid"], d.pid().as_raw());
    assert!(d.log_text().contains("replaced the stale admin socket"));
    assert!(d.stop().success());
}

/// `status` tells what restart recovery ended at this start, every kind's
/// (a task killed with its daemon, here), and nothing after a clean one.
#[test]
fn status_tells_what_recovery_ended_at_this_start() {
    let root = private_dir();
    let state = state_dir(root.path());
    let d = start(root.path(), &state);
    assert!(status_json(&state).get("recovered").is_none());
    start_nap(&d, 60);
    d.kill();

    let d = start(root.path(), &state);
    let s = status_json(&state);
    assert_eq!(
        s["recovered"],
        json!([
            "1 tasks running at the last stop ended: 1 failed (interrupted), 0 cancelled (their cancel had been committed); none was re-run"
        ]),
        "{s}"
    );
    let out = taskgate(&["status", "--state-dir", state.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l.starts_with("recovered        1 tasks running at the last stop ended")),
        "{out:?}"
    );
    assert!(d.stop().success());
}

#[test]
fn the_socket_goes_in_the_runtime_directory_when_systemd_gives_one() {
    let root = private_dir();
    let state = state_dir(root.path());
    let runtime_dir = root.path().join("run");
    std::fs::create_dir(&runtime_dir).unwrap();
    std::fs::set_permissions(&runtime_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let d = Daemon::builder()
        .config(&config(root.path()))
        .state_dir(&state)
        .env("RUNTIME_DIRECTORY", &runtime_dir)
        .start();
    let sock = runtime_dir.join("admin.sock");
    let mode = std::fs::symlink_metadata(&sock)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the socket is private");
    assert!(!state.join("admin.sock").exists());
    // The client has no $RUNTIME_DIRECTORY: it finds the socket through
    // the state directory's lock file.
    let s = status_json(&state);
    assert_eq!(s["admin_socket"], sock.to_str().unwrap());
    assert!(d.stop().success());
    assert!(!sock.exists());
}

#[test]
fn a_peer_of_another_uid_is_refused_even_when_the_file_would_let_it_in() {
    prereq::require_root("runs the client as another user");
    let root = private_dir();
    let state = state_dir(root.path());
    let d = start(root.path(), &state);
    let sock = state.join("admin.sock");
    // Not the build's own file: nobody may not be able to reach it.
    let bin = binary_for_other_users();
    let as_nobody = |socket: &Path| {
        let mut cmd = std::process::Command::new(&bin.path);
        cmd.args(["status", "--socket", socket.to_str().unwrap()])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .current_dir("/");
        std::os::unix::process::CommandExt::uid(&mut cmd, 65534);
        std::os::unix::process::CommandExt::gid(&mut cmd, 65534);
        cmd.output().expect("run taskgate as nobody")
    };
    // The file's mode stops it first.
    let mut dirs = vec![root.path().to_path_buf(), state.clone()];
    for dir in &dirs {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    }
    let out = as_nobody(&sock);
    assert_eq!(out.status.code(), Some(76), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("permission denied on"),
        "{out:?}"
    );
    // With the file opened up, the credential check still refuses.
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = as_nobody(&sock);
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600)).unwrap();
    for dir in dirs.drain(..) {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    assert_eq!(out.status.code(), Some(76), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("permission denied: uid 65534 may not use the admin socket"),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "nothing about the daemon is shown");
    assert!(
        d.log_text()
            .contains("admin connection from uid 65534 refused")
    );
    // Root (the test) is still served.
    assert_eq!(status_json(&state)["store"], "serving");
    assert!(d.stop().success());
}

/// Every request must carry the admin key the daemon made at its start and
/// recorded in `tasks.lock`: without it (no key, a wrong one, the last
/// start's, a line that is not JSON) the answer is one refusal line, the
/// same every time, and nothing is done; the key is new at each start and
/// is in neither the log nor the daemon's environment or command line.
#[test]
fn requests_without_this_starts_admin_key_are_refused_alike() {
    let root = private_dir();
    let state = state_dir(root.path());
    let mut d = start(root.path(), &state);
    let sock = state.join("admin.sock");
    let key = admin_key(&state);
    assert_eq!(key.len(), 64, "{key}");
    assert!(key.bytes().all(|b| b.is_ascii_hexdigit()), "{key}");

    let dest = root.path().join("snap");
    let wrong = "0".repeat(64);
    let refusals: Vec<String> = [
        json!({"op": "status"}).to_string(),
        json!({"op": "status", "key": wrong}).to_string(),
        json!({"op": "status", "key": key[..32]}).to_string(),
        json!({"op": "status", "key": 7}).to_string(),
        json!({"op": "snapshot", "to": dest}).to_string(),
        json!({"op": "reload", "key": wrong}).to_string(),
        "not json".to_string(),
    ]
    .iter()
    .map(|line| raw_request(&sock, line))
    .collect();
    for r in &refusals {
        assert_eq!(r, &refusals[0], "every refusal is the same line");
    }
    let refusal: Value = serde_json::from_str(refusals[0].trim()).unwrap();
    assert_eq!(refusal["answer"], "error", "{refusal}");
    assert_eq!(refusal["exit"], 76, "{refusal}");
    assert!(
        refusal["message"]
            .as_str()
            .unwrap()
            .contains("did not carry this daemon's admin key"),
        "{refusal}"
    );
    assert!(!dest.exists(), "no snapshot without the key");
    assert!(
        !d.notifications().iter().any(|n| n.contains("RELOADING=1")),
        "no reload without the key"
    );

    // With the key: served.
    let served = raw_request(&sock, &json!({"op": "status", "key": key}).to_string());
    let served: Value = serde_json::from_str(served.trim()).unwrap();
    assert_eq!(served["answer"], "status", "{served}");

    // Never in the log, the environment or the command line.
    let log = d.log_text();
    assert!(
        log.contains("did not present this start's admin key"),
        "{log}"
    );
    assert!(!log.contains(&key), "the key is not logged");
    for file in ["environ", "cmdline"] {
        let text = std::fs::read(format!("/proc/{}/{file}", d.pid())).unwrap();
        assert!(
            !String::from_utf8_lossy(&text).contains(&key),
            "the key is not in /proc/PID/{file}"
        );
    }

    // A new start makes a new key; the old one is refused.
    assert!(d.stop().success());
    let d = start(root.path(), &state);
    let again = admin_key(&state);
    assert_ne!(again, key);
    let old = raw_request(&sock, &json!({"op": "status", "key": key}).to_string());
    assert_eq!(old, refusals[0]);
    assert_eq!(status_json(&state)["store"], "serving");
    assert!(d.stop().success());
}

/// Reads what the daemon sends until it closes (or `limit` passes).
fn read_to_close(s: &mut UnixStream, limit: Duration) -> (String, Duration) {
    let began = Instant::now();
    s.set_read_timeout(Some(limit)).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    (String::from_utf8_lossy(&got).to_string(), began.elapsed())
}

#[test]
fn idle_oversize_and_flooding_connections_are_bounded() {
    let root = private_dir();
    let state = state_dir(root.path());
    let d = start(root.path(), &state);
    let sock = state.join("admin.sock");

    // An oversize request is refused and closed at once.
    let mut s = UnixStream::connect(&sock).unwrap();
    let _ = s.write_all(&vec![b'x'; taskgate::admin::MAX_REQUEST_BYTES + 1]);
    let (answer, _) = read_to_close(&mut s, Duration::from_secs(10));
    assert!(answer.contains("request longer than"), "{answer:?}");

    // A malformed request (with the key) gets an error, not silence.
    let key = admin_key(&state);
    let answer = raw_request(&sock, &json!({"op": "format_disk", "key": key}).to_string());
    assert!(answer.contains("malformed request"), "{answer:?}");

    // A flood of idle connections: the bound is held, the next one is
    // told at once, and once the idle ones are cut off after the read
    // timeout the socket serves again.
    let idle: Vec<UnixStream> = (0..taskgate::admin::MAX_CONNECTIONS)
        .map(|_| UnixStream::connect(&sock).unwrap())
        .collect();
    // Let the accept loop take them all.
    let mut extra = None;
    for _ in 0..50 {
        let mut s = UnixStream::connect(&sock).unwrap();
        // Refused connections are closed before they are read.
        let _ = s.write_all(format!("{}\n", json!({"op": "status", "key": key})).as_bytes());
        let (answer, _) = read_to_close(&mut s, Duration::from_secs(10));
        if answer.contains("admin connections already") {
            extra = Some(answer);
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(extra.is_some(), "a connection past the bound is refused");
    let mut first = idle.into_iter().next().unwrap();
    let (answer, waited) = read_to_close(&mut first, Duration::from_secs(20));
    assert!(answer.contains("no whole request within"), "{answer:?}");
    assert!(
        waited < Duration::from_secs(15),
        "the idle connection was closed after the read timeout ({waited:?})"
    );
    // All idle ones are gone by now: status is served again.
    let mut served = false;
    for _ in 0..50 {
        let out = taskgate(&["status", "--state-dir", state.to_str().unwrap()], &[]);
        if out.status.success() {
            served = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        served,
        "status is served once the idle connections are gone"
    );
    assert!(d.stop().success());
}

#[test]
fn an_online_snapshot_taken_while_a_task_runs_and_creates_go_on_restores_and_checks() {
    let root = private_dir();
    let state = state_dir(root.path());
    populate(&state, 400);
    let d = start(root.path(), &state);
    let running = start_nap(&d, 60);

    // Creates keep flowing from another thread while the snapshot is taken.
    let url = d.url();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let creator = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let rt = runtime();
            rt.block_on(async {
                let client = taskgate::client::Client::new(&url, true).unwrap();
                let mut ok = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) || ok < 5 {
                    let r = client
                        .call_tool("nap", json!({ "seconds": 0 }), None)
                        .await
                        .expect("a create during the snapshot succeeds");
                    assert_eq!(r["resultType"], "task", "{r}");
                    ok += 1;
                }
                ok
            })
        })
    };
    let dest = root.path().join("snapshot");
    let out = taskgate(
        &[
            "backup",
            "--online",
            "--state-dir",
            state.to_str().unwrap(),
            "--to",
            dest.to_str().unwrap(),
        ],
        &[],
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let created = creator.join().expect("the creating thread");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("online: database copied while serving"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "copy verified: schema {}, integrity ok",
            taskgate::store::SCHEMA_VERSION
        )),
        "{text}"
    );
    assert!(created >= 5);

    // The running task was not disturbed.
    let rt = runtime();
    let t = rt.block_on(async { d.client(true).get_task(&running).await.unwrap() });
    assert_eq!(t["status"], "working", "{t}");
    assert!(status_json(&state)["running"].as_u64() >= Some(1));

    // The snapshot has the offline format: it verifies, restores into a
    // fresh directory, and that directory checks.
    let out = taskgate(
        &[
            "restore",
            "--verify-only",
            "--state-dir",
            state.to_str().unwrap(),
            "--from",
            dest.to_str().unwrap(),
        ],
        &[],
    );
    assert!(out.status.success(), "{out:?}");
    let fresh_root = private_dir();
    let fresh = state_dir(fresh_root.path());
    let out = taskgate(
        &[
            "restore",
            "--state-dir",
            fresh.to_str().unwrap(),
            "--from",
            dest.to_str().unwrap(),
        ],
        &[],
    );
    assert!(out.status.success(), "{out:?}");
    let out = taskgate(&["check", "--state-dir", fresh.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{out:?}");
    let check = String::from_utf8_lossy(&out.stdout);
    let retained: u64 = check
        .split(" tasks retained")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {check}"));
    assert!(
        retained >= 401,
        "the 400 populated tasks and the running one are in the copy: {check}"
    );
    // The task that was running when the copy was made is ended by the
    // restored daemon's recovery, never re-run.
    assert!(check.contains("were running at the last stop"), "{check}");

    // A second snapshot to the same place is refused before any work.
    let out = taskgate(
        &[
            "backup",
            "--online",
            "--state-dir",
            state.to_str().unwrap(),
            "--to",
            dest.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(77), "{out:?}");
    assert!(one_line_stderr(&out).contains("already exists"));
    assert!(d.stop().success());
}

#[test]
fn online_snapshots_into_a_directory_keep_the_newest_n() {
    let root = private_dir();
    let state = state_dir(root.path());
    let d = start(root.path(), &state);
    let into = root.path().join("snapshots");
    std::fs::create_dir(&into).unwrap();
    std::fs::set_permissions(&into, std::fs::Permissions::from_mode(0o700)).unwrap();
    // Something else in the directory is never touched.
    std::fs::create_dir(into.join("taskgate-keep-me")).unwrap();
    for _ in 0..3 {
        let out = taskgate(
            &[
                "backup",
                "--online",
                "--state-dir",
                state.to_str().unwrap(),
                "--into",
                into.to_str().unwrap(),
                "--keep",
                "2",
            ],
            &[],
        );
        assert!(out.status.success(), "{out:?}");
        // Names carry the second.
        std::thread::sleep(Duration::from_millis(1100));
    }
    let mut names: Vec<String> = std::fs::read_dir(&into)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    names.sort();
    assert_eq!(names.len(), 3, "{names:?}");
    assert_eq!(names[2], "taskgate-keep-me");
    for n in &names[..2] {
        let out = taskgate(
            &[
                "restore",
                "--verify-only",
                "--state-dir",
                state.to_str().unwrap(),
                "--from",
                into.join(n).to_str().unwrap(),
            ],
            &[],
        );
        assert!(out.status.success(), "{out:?}");
    }
    assert!(d.stop().success());
}

#[test]
fn the_store_copies_itself_while_creates_go_on() {
    use taskgate::store::{Store, StoreOptions};
    let root = private_dir();
    let state = state_dir(root.path());
    populate(&state, 300);
    let rt = runtime();
    rt.block_on(async {
        let (store, _) = Store::open(StoreOptions::new(state.join("tasks.db"))).unwrap();
        let dest = root.path().join("copy.db");
        std::fs::File::create(&dest).unwrap();
        let creates = (0..100).map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.create(new_task(86_400_000)).await })
        });
        let creates: Vec<_> = creates.collect();
        let report = store.snapshot(&dest).await.expect("snapshot");
        for c in creates {
            c.await
                .unwrap()
                .expect("a create beside the snapshot succeeds");
        }
        assert!(report.pages > 0 && report.steps > 0, "{report:?}");
        store.shutdown().await.unwrap();
        let copy = taskgate::store::check_read_only(
            &dest,
            taskgate::config::StoreSettings::default().max_db_pages,
        )
        .expect("the copy checks");
        match copy {
            taskgate::store::CheckReport::Valid { status, .. } => {
                assert!(
                    status.tasks.retained >= 300,
                    "every task committed before it is in the copy"
                )
            }
            other => panic!("{other:?}"),
        }
    });
}

/// A database larger than one snapshot step (256 pages of 4 KiB), so that
/// a stop can meet the copy between steps: `n` completed tasks with 4 KiB
/// results, created by concurrent writers (group commit) to keep the
/// set-up short.
fn populate_large(dir: &Path, n: usize) {
    use taskgate::store::{Outcome, Store, StoreOptions, TaskStatus};
    let rt = runtime();
    rt.block_on(async {
        let (store, _) = Store::open(StoreOptions::new(dir.join("tasks.db"))).unwrap();
        let writers: Vec<_> = (0..16)
            .map(|w| {
                let store = store.clone();
                tokio::spawn(async move {
                    for i in (w..n).step_by(16) {
                        let created = store.create(new_task(86_400_000)).await.unwrap();
                        let text = format!("result {i} {}", "x".repeat(4096));
                        store
                            .finish(
                                &created.record().id,
                                TaskStatus::Completed,
                                Some(Outcome::Result(
                                    json!({"content":[{"type":"text","text": text}]}),
                                )),
                            )
                            .await
                            .unwrap();
                    }
                })
            })
            .collect();
        for w in writers {
            w.await.unwrap();
        }
        store.shutdown().await.unwrap();
    });
}

/// Polls `status --json` (the daemon's own account, over its socket) until
/// it says an online snapshot is being written.
fn wait_for_snapshot_running(state: &Path, limit: Duration) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if status_json(state)["snapshot_running"] == json!(true) {
            return;
        }
    }
    panic!("no snapshot running after {limit:?}");
}

/// A stop that meets an online snapshot still being written. The store
/// thread is held by the test hook's stall file (checked before each step
/// of the copy), then SIGTERM comes.
///
/// Without `past_the_admin_limit` the operator's `taskgate backup --online`
/// is in flight, and the hold ends as soon as stopping began: the snapshot
/// finishes inside the stop's wait for admin connections, and must be
/// complete. With it, the hold lasts until the stop has given up waiting
/// (its 10 s limit) and closes the store, which abandons the copy between
/// two steps. Here the request goes over the socket directly, right after
/// the store thread answered a status and went back to waiting, so that
/// the held store thread is inside the copy (it takes the request, stalls
/// before the first step, and meets the shutdown after it).
///
/// Either way the daemon stops cleanly (exit 0, its store checks), and
/// DEST is a complete snapshot that verifies, or is absent: never a
/// partial copy.
fn stop_during_an_online_snapshot(past_the_admin_limit: bool) {
    let root = private_dir();
    let state = state_dir(root.path());
    populate_large(&state, 1200);
    let stall = root.path().join("stall");
    let log = root.path().join("daemon.log");
    let mut d = Daemon::builder()
        .config(&config(root.path()))
        .state_dir(&state)
        .log(&log)
        .env("TASKGATE_TEST_STALL_FILE", &stall)
        .start();
    let db_bytes = std::fs::metadata(state.join("tasks.db")).unwrap().len();
    assert!(
        db_bytes > 2 * 256 * 4096,
        "the database ({db_bytes} bytes) must take several snapshot steps"
    );

    let dest = root.path().join("snapshot");
    let backup = if past_the_admin_limit {
        // The store thread has just answered this status's count.
        assert!(status_json(&state)["tasks"]["retained"].as_u64() == Some(1200));
        std::fs::write(&stall, b"").unwrap();
        let mut socket = UnixStream::connect(state.join("admin.sock")).unwrap();
        let request = json!({"op": "snapshot", "to": dest, "key": admin_key(&state)});
        socket.write_all(format!("{request}\n").as_bytes()).unwrap();
        std::thread::spawn(move || read_to_close(&mut socket, Duration::from_secs(60)).0)
    } else {
        std::fs::write(&stall, b"").unwrap();
        let (state, dest) = (state.clone(), dest.clone());
        std::thread::spawn(move || {
            let out = taskgate(
                &[
                    "backup",
                    "--online",
                    "--state-dir",
                    state.to_str().unwrap(),
                    "--to",
                    dest.to_str().unwrap(),
                ],
                &[],
            );
            assert!(out.status.success(), "{out:?}");
            String::from_utf8_lossy(&out.stdout).to_string()
        })
    };
    wait_for_snapshot_running(&state, Duration::from_secs(30));
    assert!(dest.join("tasks.db").exists(), "the snapshot has begun");

    d.signal(nix::sys::signal::Signal::SIGTERM);
    d.wait_for("STOPPING=1", Duration::from_secs(15));
    if past_the_admin_limit {
        // The behaviour under test: the stop gave up waiting for the
        // snapshot's connection, and goes on to close the store.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !d.log_text().contains("admin connections still open after") {
            assert!(
                Instant::now() < deadline,
                "the stop never gave up on the admin connection:\n{}",
                d.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    std::fs::remove_file(&stall).unwrap();
    let status = d.wait_exit(Duration::from_secs(60));
    assert!(status.success(), "{status}; log:\n{}", d.log_text());
    let answer = backup.join().expect("the backup thread");

    if past_the_admin_limit {
        // Abandoned: nothing is kept, and a caller still connected is told
        // the snapshot did not happen (or hears nothing: the daemon ended).
        assert!(
            !dest.exists(),
            "a partial snapshot was left: {:?}; answer {answer:?}; log:\n{}",
            std::fs::read_dir(&dest).map(|r| r
                .filter_map(|e| e.ok())
                .map(|e| e.file_name())
                .collect::<Vec<_>>()),
            d.log_text()
        );
        assert!(
            answer.is_empty() || answer.contains("nothing was kept"),
            "{answer}"
        );
    } else {
        assert!(answer.contains("copy verified"), "{answer}");
        let verified = taskgate(
            &[
                "restore",
                "--verify-only",
                "--state-dir",
                state.to_str().unwrap(),
                "--from",
                dest.to_str().unwrap(),
            ],
            &[],
        );
        assert!(verified.status.success(), "{verified:?}");
    }
    // The daemon's own files are as a clean stop leaves them.
    let check = taskgate(&["check", "--state-dir", state.to_str().unwrap()], &[]);
    assert!(check.status.success(), "{check:?}");
}

#[test]
fn a_snapshot_that_finishes_while_the_daemon_stops_is_complete() {
    stop_during_an_online_snapshot(false);
}

#[test]
fn a_snapshot_still_running_past_the_stop_limit_leaves_no_partial_copy() {
    stop_during_an_online_snapshot(true);
}
