//! Offline backup and restore through the real binary: refusals, the
//! manifest, what a restore brings back, the evidence it keeps, and the
//! snapshots it refuses without touching the live directory.
//!
//! What this file proves: backup and restore refusals and round trip, root
//! acting for the service user, non-ASCII paths

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::json;

fn demo_config(dir: &Path) -> std::path::PathBuf {
    write_config(
        dir,
        "[tasks]\npoll_interval_ms = 50\n",
        &[Tool::new("note")
            .argv(&["/usr/bin/printf", "%s", "{text}"])
            .task("optional")
            .param("text", "string")],
    )
}

async fn create(d: &Daemon, text: &str) -> String {
    let c = d.client(true);
    let r = c
        .call_tool("note", json!({"text": text}), None)
        .await
        .unwrap();
    let id = r["taskId"].as_str().unwrap().to_string();
    for _ in 0..100 {
        if let Ok(t) = c.get_task(&id).await
            && t["status"] == "completed"
        {
            return id;
        }
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    panic!("task {id} did not complete");
}

fn run(args: &[&str]) -> std::process::Output {
    taskgate(args, &[("HOME", "/nonexistent")])
}

#[test]
fn backup_then_restore_brings_back_the_state_at_the_backup() {
    let root = private_dir();
    let state = state_dir(root.path());
    let cfg = demo_config(root.path());
    let s = state.to_str().unwrap();
    let backup = root.path().join("backup-1");
    let b = backup.to_str().unwrap();
    let rt = runtime();

    let daemon = Daemon::start(&cfg, &state, &root.path().join("log1"));
    let before = rt.block_on(create(&daemon, "before the backup"));
    // Offline only: refused while the daemon holds the lock.
    let out = run(&["backup", "--state-dir", s, "--to", b]);
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    assert!(!backup.exists());
    assert!(daemon.stop().success());

    let out = run(&["backup", "--state-dir", s, "--to", b]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("integrity ok"));
    assert_eq!(
        std::fs::metadata(&backup).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let check = std::process::Command::new("sha256sum")
        .args(["-c", "MANIFEST.sha256"])
        .current_dir(&backup)
        .output()
        .unwrap();
    assert!(check.status.success(), "{check:?}");
    // Nothing beyond the manifest's files (a check must not leave sidecars).
    let mut names: Vec<_> = std::fs::read_dir(&backup)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["MANIFEST.sha256", "artifacts", "tasks.db"]
            .map(String::from)
            .to_vec()
            .into_iter()
            .filter(|n| n != "artifacts" || backup.join("artifacts").exists())
            .collect::<Vec<_>>()
    );

    let daemon = Daemon::start(&cfg, &state, &root.path().join("log2"));
    let after = rt.block_on(create(&daemon, "after the backup"));
    assert!(daemon.stop().success());

    let out = run(&["restore", "--state-dir", s, "--from", b]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let evidence = stdout
        .lines()
        .find_map(|l| l.strip_prefix("the replaced files are kept in "))
        .expect("names the evidence directory")
        .to_string();
    assert!(Path::new(&evidence).join("tasks.db").exists());

    let daemon = Daemon::start(&cfg, &state, &root.path().join("log3"));
    rt.block_on(async {
        let c = daemon.client(true);
        let t = c.get_task(&before).await.unwrap();
        assert_eq!(t["result"]["content"][0]["text"], "before the backup");
        assert!(
            c.get_task(&after).await.is_err(),
            "a task created after the backup is gone"
        );
    });
    assert!(daemon.stop().success());
}

#[test]
fn backup_refuses_unsafe_or_existing_destinations() {
    let root = private_dir();
    let state = state_dir(root.path());
    populate(&state, 2);
    let s = state.to_str().unwrap();
    let exists = root.path().join("exists");
    std::fs::create_dir(&exists).unwrap();
    let out = run(&["backup", "--state-dir", s, "--to", exists.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(77));
    assert!(one_line_stderr(&out).contains("already exists"));

    let inside = state.join("copy");
    let out = run(&["backup", "--state-dir", s, "--to", inside.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(77));
    assert!(one_line_stderr(&out).contains("inside or contains the state directory"));

    let open = root.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = run(&[
        "backup",
        "--state-dir",
        s,
        "--to",
        open.join("b").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(77));
    let line = one_line_stderr(&out);
    assert!(
        line.contains("backup destination is not private") && line.contains("mode 0777"),
        "{line}"
    );
    assert!(
        !line.contains("state directory"),
        "names the destination: {line}"
    );
    assert!(!open.join("b").exists());
}

#[test]
fn restore_refuses_bad_snapshots_and_leaves_the_live_directory_alone() {
    let root = private_dir();
    let state = state_dir(root.path());
    populate(&state, 4);
    let s = state.to_str().unwrap();
    let snap = root.path().join("snap");
    assert!(
        run(&["backup", "--state-dir", s, "--to", snap.to_str().unwrap()])
            .status
            .success()
    );
    // The live directory changes after the backup.
    populate(&state, 1);
    let live = sha256_file(&state.join("tasks.db"));

    // A flipped byte: the manifest catches it. It is the type byte of a
    // b-tree page in the middle of the file, so that the database is
    // corrupt whatever the layout of its pages (a byte in a page's free
    // space would pass the integrity check below).
    let mut bytes = std::fs::read(snap.join("tasks.db")).unwrap();
    let mid = bytes.len() / 4096 / 2 * 4096;
    bytes[mid] ^= 0xff;
    std::fs::write(snap.join("tasks.db"), &bytes).unwrap();
    let out = run(&[
        "restore",
        "--state-dir",
        s,
        "--from",
        snap.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(65));
    assert!(one_line_stderr(&out).contains("does not match its checksum"));
    assert_eq!(sha256_file(&state.join("tasks.db")), live);

    // A consistent manifest over a corrupt database: validation catches it.
    let sum = sha256_file(&snap.join("tasks.db"));
    std::fs::write(snap.join("MANIFEST.sha256"), format!("{sum}  tasks.db\n")).unwrap();
    let out = run(&[
        "restore",
        "--state-dir",
        s,
        "--from",
        snap.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(65), "{out:?}");
    assert!(one_line_stderr(&out).contains("fails validation"));
    assert_eq!(sha256_file(&state.join("tasks.db")), live);
    let siblings = std::fs::read_dir(root.path()).unwrap().count();
    assert_eq!(
        siblings, 2,
        "no evidence or staging left by a refused restore"
    );
}

#[test]
fn root_backs_up_and_restores_a_directory_owned_by_the_service_user() {
    prereq::require_root("chowns the state directory to another user");
    let root = private_dir();
    let state = state_dir(root.path());
    populate(&state, 3);
    let (uid, gid) = (
        nix::unistd::Uid::from_raw(4242),
        nix::unistd::Gid::from_raw(4343),
    );
    for entry in std::fs::read_dir(&state).unwrap() {
        nix::unistd::chown(&entry.unwrap().path(), Some(uid), Some(gid)).unwrap();
    }
    nix::unistd::chown(&state, Some(uid), Some(gid)).unwrap();
    let s = state.to_str().unwrap();
    let snap = root.path().join("snap");
    let out = run(&["backup", "--state-dir", s, "--to", snap.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let out = run(&[
        "restore",
        "--state-dir",
        s,
        "--from",
        snap.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    for name in ["tasks.db", "tasks.lock"] {
        assert_eq!(
            std::fs::metadata(state.join(name)).unwrap().uid(),
            4242,
            "{name}"
        );
    }
    // And the service user's directory still passes check (as root, on its behalf).
    let out = run(&["check", "--state-dir", s]);
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn backup_and_verification_work_under_a_non_ascii_path() {
    let root = private_dir();
    let parent = root.path().join("ü");
    std::fs::create_dir(&parent).unwrap();
    std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o700)).unwrap();
    let state = state_dir(&parent);
    populate(&state, 3);
    let snapshot = parent.join("snapshot-é");
    let (s, b) = (state.to_str().unwrap(), snapshot.to_str().unwrap());
    let out = run(&["backup", "--state-dir", s, "--to", b]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("copy verified"));
    let out = run(&["restore", "--state-dir", s, "--from", b, "--verify-only"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("3 tasks"));
}

/// The store identity the directory recorded beside its database.
fn recorded_store(dir: &Path) -> Option<String> {
    std::fs::read_to_string(dir.join("tasks.lock"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("store "))
        .map(str::to_string)
}

#[test]
fn a_restore_records_the_snapshots_store_beside_it() {
    let root = private_dir();
    let state = state_dir(root.path());
    let other_root = root.path().join("other-root");
    std::fs::create_dir(&other_root).unwrap();
    std::fs::set_permissions(&other_root, std::fs::Permissions::from_mode(0o700)).unwrap();
    let other = state_dir(&other_root);
    for dir in [&state, &other] {
        populate(dir, 2);
        assert!(Daemon::builder().state_dir(dir).start().stop().success());
    }
    let mine = recorded_store(&state).expect("serve records the store");
    let theirs = recorded_store(&other).expect("serve records the store");
    assert_ne!(mine, theirs);

    // A backup keeps the record.
    let s = state.to_str().unwrap();
    let snap = root.path().join("snap");
    let out = run(&["backup", "--state-dir", s, "--to", snap.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(recorded_store(&state).as_ref(), Some(&mine));

    // Restoring another store's snapshot is the operator's choice: the
    // directory then holds that store, and serves it.
    let other_snap = root.path().join("other-snap");
    let o = other.to_str().unwrap();
    let out = run(&[
        "backup",
        "--state-dir",
        o,
        "--to",
        other_snap.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let out = run(&[
        "restore",
        "--state-dir",
        s,
        "--from",
        other_snap.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(recorded_store(&state).as_ref(), Some(&theirs));
    let out = run(&["check", "--state-dir", s]);
    assert!(out.status.success(), "{out:?}");
    assert!(Daemon::builder().state_dir(&state).start().stop().success());
}

/// The documentation promises that a restore refuses a snapshot holding
/// files its manifest does not list: anything there was not made by
/// `backup` (or was added afterwards), and installing around it would
/// hide it. Each stray kind is refused before anything is touched.
#[test]
fn restore_refuses_a_snapshot_holding_files_the_manifest_does_not_list() {
    let root = private_dir();
    let state = state_dir(root.path());
    populate(&state, 2);
    let s = state.to_str().unwrap();
    let snap = root.path().join("snap");
    assert!(
        run(&["backup", "--state-dir", s, "--to", snap.to_str().unwrap()])
            .status
            .success()
    );
    let live = sha256_file(&state.join("tasks.db"));
    let artifacts = snap.join("artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    // (name, whether it is a directory)
    let strays = [
        ("notes.txt", false),
        ("tasks.db-shm", false),
        ("artifacts/readme.txt", false),
        ("artifacts/tg-stray.json", false),
        ("extra-dir", true),
    ];
    for (name, is_dir) in strays {
        let path = snap.join(name);
        if is_dir {
            std::fs::create_dir(&path).unwrap();
        } else {
            std::fs::write(&path, "{}").unwrap();
        }
        for verify_only in [true, false] {
            let mut args = vec![
                "restore",
                "--state-dir",
                s,
                "--from",
                snap.to_str().unwrap(),
            ];
            if verify_only {
                args.push("--verify-only");
            }
            let out = run(&args);
            let line = one_line_stderr(&out);
            assert_eq!(out.status.code(), Some(65), "{name}: {line}");
            assert!(
                line.contains(name) && line.contains("not in the manifest"),
                "{name}: {line}"
            );
        }
        assert_eq!(sha256_file(&state.join("tasks.db")), live, "{name}");
        if is_dir {
            std::fs::remove_dir(&path).unwrap();
        } else {
            std::fs::remove_file(&path).unwrap();
        }
    }
    // Without the strays the same snapshot is accepted.
    let out = run(&[
        "restore",
        "--state-dir",
        s,
        "--from",
        snap.to_str().unwrap(),
        "--verify-only",
    ]);
    assert!(out.status.success(), "{out:?}");
}

/// `taskgate-backup` checks the destination with `--dry-run` before it
/// stops the service: the check works while a daemon holds the lock, and
/// refuses a bad destination the way the real backup does, naming it.
#[test]
fn a_dry_run_checks_the_destination_while_the_daemon_serves() {
    let root = private_dir();
    let state = state_dir(root.path());
    populate(&state, 1);
    let daemon = Daemon::builder().state_dir(&state).start();
    let s = state.to_str().unwrap();
    let good = root.path().join("snap");
    let out = run(&[
        "backup",
        "--state-dir",
        s,
        "--to",
        good.to_str().unwrap(),
        "--dry-run",
    ]);
    assert!(out.status.success(), "{out:?}");
    assert!(!good.exists(), "a dry run copies nothing");

    let open = root.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    for dest in [open.join("b"), state.join("copy"), state.clone()] {
        let out = run(&[
            "backup",
            "--state-dir",
            s,
            "--to",
            dest.to_str().unwrap(),
            "--dry-run",
        ]);
        let line = one_line_stderr(&out);
        assert_eq!(out.status.code(), Some(77), "{line}");
        assert!(line.contains("backup destination"), "{line}");
    }
    // Without --dry-run a good destination meets the held lock.
    let out = run(&["backup", "--state-dir", s, "--to", good.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    assert!(!good.exists());
    assert!(daemon.stop().success());
}

/// The manifest names each durable part before its files; a manifest
/// written before parts existed (no part line) is the task store's, and
/// one naming a part this taskgate does not know is refused.
#[test]
fn the_manifest_names_each_part_and_a_manifest_without_parts_is_the_task_stores() {
    let root = private_dir();
    let state = state_dir(root.path());
    populate(&state, 3);
    let s = state.to_str().unwrap();
    let snap = root.path().join("snap");
    let out = run(&["backup", "--state-dir", s, "--to", snap.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let manifest = std::fs::read_to_string(snap.join("MANIFEST.sha256")).unwrap();
    let lines: Vec<&str> = manifest.lines().collect();
    assert_eq!(lines[0], "# part task-store", "{manifest}");
    // The approval journal's part follows, empty here (no tool needs
    // approval, so there is no journal).
    let journal = lines
        .iter()
        .position(|l| *l == "# part approval-journal")
        .unwrap_or_else(|| panic!("{manifest}"));
    assert_eq!(journal, lines.len() - 1, "{manifest}");
    let store = &lines[1..journal];
    assert!(store.iter().all(|l| !l.starts_with('#')), "{manifest}");
    assert!(
        store.iter().any(|l| l.ends_with("  tasks.db")),
        "{manifest}"
    );

    let verify = || {
        run(&[
            "restore",
            "--state-dir",
            s,
            "--from",
            snap.to_str().unwrap(),
            "--verify-only",
        ])
    };
    // Written before parts existed: the same files without the part line.
    std::fs::write(snap.join("MANIFEST.sha256"), lines[1..].join("\n") + "\n").unwrap();
    let out = verify();
    assert_eq!(out.status.code(), Some(0), "{out:?}");

    // A part this build does not know: refused, naming it.
    std::fs::write(
        snap.join("MANIFEST.sha256"),
        format!("# part journal\n{}\n", lines[1..].join("\n")),
    )
    .unwrap();
    let out = verify();
    assert_eq!(out.status.code(), Some(65), "{out:?}");
    assert!(
        one_line_stderr(&out).contains("names a part this taskgate does not know: \"journal\""),
        "{out:?}"
    );
}
