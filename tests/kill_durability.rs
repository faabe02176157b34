//! Kill durability: a child process creates tasks under load and prints each
//! ID once `create` acknowledged it; it is SIGKILLed at a random moment, and
//! after every kill the database passes `integrity_check` and holds every ID
//! ever acknowledged. Then the store opens (restart recovery) once more.
//!
//! The test proves it did something: the child acknowledged tasks, and in
//! at least one round in 20 the kill cut off the acknowledgement of rows
//! that had committed (the kill landed between a COMMIT and its answer).
//!
//! The approval journal gets the same treatment: a child appends proposals
//! and approvals from several threads, printing each once its append
//! returned (synced); after every kill the journal opens (a torn final
//! record cut away) and holds every acknowledged decision.
//!
//! `TASKGATE_KILL_ROUNDS` sets the number of rounds (default 50, at least
//! 20); `TASKGATE_KILL_SEED` replays the kill delays of an earlier run.
//!
//! Invariant 2 of the map: A task handle reaches a client only after its row is
//! committed (synchronous=FULL); the tool starts only after that commit.
//! Guarded by: `tests/kill_durability.rs::acknowledged_tasks_survive_sigkill`
//! (the store under 50 random SIGKILLs; one kill in 20 at least must cut off
//! committed rows' answers); at the daemon,
//! `tests/mcp_durability.rs::every_handle_a_client_received_names_a_committed_row_across_a_sigkill`
//! (eight clients, SQLite's writes slowed 10 ms each by strace so that an
//! answer sent before its COMMIT is received before the frames reach the
//! kernel, SIGKILL, every handle read back after the restart);
//! `tests/fault_injection.rs::fsync_eio_on_a_creates_commit_is_uncertain_and_disables_the_store`
//! (the create whose COMMIT's sync failed is never acknowledged);
//! `tests/shutdown.rs::a_stop_under_load_answers_every_call_and_loses_no_handle`;
//! `tests/conformance.rs::official_conformance_suite_tasks_scenarios` (the
//! suite's Tasks scenarios)
//!
//! Invariant 24 of the map: An approval decision is acknowledged only once its
//! journal record is synced: no kill loses an acknowledged proposal or
//! approval. Guarded by:
//! `tests/kill_durability.rs::acknowledged_decisions_survive_sigkill`,
//! `tests/approvals.rs::a_decision_whose_journal_sync_fails_is_refused_and_disables_approvals_until_restart`
//! (EIO injected on the journal's sync by a test hook),
//! `src/approvals/gate.rs::a_decision_whose_sync_failed_is_never_acknowledged_and_disables_the_gate`
//!
//! What this file proves: slow: 50 SIGKILL rounds (`TASKGATE_KILL_ROUNDS`,
//! replay with `TASKGATE_KILL_SEED`) of the task store under concurrent
//! creates, and 50 of the approval journal under concurrent proposals and
//! approvals (segments of 64 KiB, so kills land in rotations too): after each
//! kill every acknowledged row or decision is there, and at least one kill in
//! 20 cut off synced work's answer (each writer passes its answer on 2 ms late,
//! as over a network, so the window is probed on fast disks too)

mod common;

use std::collections::HashSet;
use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use rusqlite::{Connection, OpenFlags};
use taskgate::config::StoreSettings;
use taskgate::store::{Store, StoreError, StoreOptions};

/// Names the database the child serves; its presence makes `kill_child` run.
const CHILD_ENV: &str = "TASKGATE_KILL_CHILD_DB";
const CHILD_TEST: &str = "kill_child";
const ROUNDS_ENV: &str = "TASKGATE_KILL_ROUNDS";
const SEED_ENV: &str = "TASKGATE_KILL_SEED";
const DEFAULT_ROUNDS: u32 = 50;
const MIN_ROUNDS: u32 = 20;
/// At least one round in this many (of those whose child got past opening
/// the store) must have cut off the acknowledgement of committed rows:
/// proof that kills land inside the commit-to-answer window, where a store
/// answering before its COMMIT would lose rows. About one round in five
/// does here.
const CUT_OFF_SHARE: u32 = 20;
/// Concurrent create loops in the child.
const LOOPS: usize = 16;
/// Each loop's pause after an acknowledgement. Unpaced, 16 loops commit
/// some 15 000 tasks a second here and the database outgrows the time
/// budget (every check and every startup reads all of it); paced, commits
/// still run back to back in batches of up to 16 writers.
const PACE: Duration = Duration::from_millis(8);
/// Long enough that nothing expires (and is swept) during the test.
const TTL_MS: i64 = 7 * 86_400_000;
/// Kill delays, in milliseconds after the spawn.
const MIN_DELAY_MS: u64 = 50;
const MAX_DELAY_MS: u64 = 1500;
/// A child not gone this long after SIGKILL fails the test.
const REAP_TIMEOUT: Duration = Duration::from_secs(10);
/// A child that was somehow never killed ends itself after this long.
const CHILD_LIFETIME: Duration = Duration::from_secs(60);
/// How long a writer takes to pass on an answer it got (a client's answer
/// crossing a network, in effect). Without it, on a disk whose fsync takes
/// a fraction of a millisecond, the window between a COMMIT and its
/// answer is so small a share of each cycle that almost no kill lands in
/// it, and the test could not show that it probed it.
const ANSWER_DELAY: Duration = Duration::from_millis(2);

fn options(db: PathBuf) -> StoreOptions {
    StoreOptions {
        // Tens of thousands of tasks pile up over the rounds; the
        // live-task bound is not what this test is about.
        settings: StoreSettings {
            max_live_tasks: 1_000_000,
            ..StoreSettings::default()
        },
        ..StoreOptions::new(db)
    }
}

/// The child's main, run by `acknowledged_tasks_survive_sigkill` in a
/// process of its own (`--ignored --exact kill_child`); a no-op unless the
/// parent set `CHILD_ENV`. Ignored so that a plain run never counts it as
/// a test.
#[test]
#[ignore = "child entry point: run by acknowledged_tasks_survive_sigkill"]
fn kill_child() {
    let Some(db) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    // libtest has printed "test kill_child ... " without a newline: end
    // that line so every protocol line starts a line of its own.
    say("");
    let rt = runtime();
    rt.block_on(async move {
        let (store, report) = Store::open(options(PathBuf::from(db))).expect("open the store");
        say(&format!(
            "open recovered={} retained={}",
            report.recovered, report.retained
        ));
        let mut loops = tokio::task::JoinSet::new();
        for _ in 0..LOOPS {
            let store = store.clone();
            loops.spawn(async move {
                loop {
                    match store.create(new_task(TTL_MS)).await {
                        // Printed only after the commit was acknowledged.
                        Ok(created) => {
                            tokio::time::sleep(ANSWER_DELAY).await;
                            say(&format!("ack {}", created.record().id));
                            tokio::time::sleep(PACE).await
                        }
                        Err(StoreError::Busy { .. }) => {
                            tokio::time::sleep(Duration::from_millis(1)).await
                        }
                        Err(e) => {
                            say(&format!("err {e}"));
                            tokio::time::sleep(Duration::from_millis(10)).await
                        }
                    }
                }
            });
        }
        // The loops never end: the parent's SIGKILL ends the process.
        tokio::select! {
            ended = loops.join_next() => panic!("a create loop ended: {ended:?}"),
            () = tokio::time::sleep(CHILD_LIFETIME) => {
                say("lifetime over");
                std::process::exit(3);
            }
        }
    });
}

/// One protocol line, flushed at once (a pipe write under PIPE_BUF bytes is
/// atomic, so a kill never leaves half a line behind a complete one).
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .expect("write to the parent");
}

/// xorshift64: enough randomness for kill delays, and replayable.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

fn seed() -> u64 {
    if let Ok(s) = std::env::var(SEED_ENV) {
        return s.parse().expect("TASKGATE_KILL_SEED must be a u64");
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    // xorshift must not start at zero.
    (nanos ^ u64::from(std::process::id())) | 1
}

fn rounds() -> u32 {
    let rounds = match std::env::var(ROUNDS_ENV) {
        Ok(s) => s.parse().expect("TASKGATE_KILL_ROUNDS must be a number"),
        Err(_) => DEFAULT_ROUNDS,
    };
    assert!(
        rounds >= MIN_ROUNDS,
        "{ROUNDS_ENV}={rounds}: at least {MIN_ROUNDS} rounds, or the share of kills that cut off committed rows proves nothing"
    );
    rounds
}

fn spawn_child(db: &Path) -> Child {
    spawn(CHILD_TEST, CHILD_ENV, db)
}

/// This test binary again, running only the child entry point `test`, with
/// `env` naming `path`.
fn spawn(test: &str, env: &str, path: &Path) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            test,
            "--nocapture",
            "--test-threads=1",
        ])
        .env(env, path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the child")
}

fn drain(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        buf
    })
}

fn kill(child: &Child) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("SIGKILL the child");
}

/// SIGKILLs `child` after `delay` (it must still be running then) and
/// returns what it printed.
fn kill_after(mut child: Child, delay: Duration, round: u32) -> Vec<u8> {
    let stdout = drain(child.stdout.take().unwrap());
    let stderr = drain(child.stderr.take().unwrap());
    std::thread::sleep(delay);
    let early = child.try_wait().expect("poll the child");
    kill(&child);
    let status = wait_timeout(&mut child, REAP_TIMEOUT);
    let out = stdout.join().unwrap();
    let err = String::from_utf8_lossy(&stderr.join().unwrap()).to_string();
    assert!(
        early.is_none(),
        "round {round}: the child ended before the kill ({status:?}); stderr:\n{err}"
    );
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "round {round}: {status:?}; stderr:\n{err}"
    );
    out
}

/// Complete lines only: a trailing fragment without its newline is dropped.
fn complete_lines(bytes: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(bytes);
    let mut parts: Vec<&str> = text.split('\n').collect();
    parts.pop(); // the part after the last newline: empty, or incomplete
    parts.into_iter().map(str::to_string).collect()
}

/// Integrity and the IDs present, read through a read-only connection so
/// the file stays exactly as the kill left it for the next child's recovery.
fn inspect(db: &Path) -> Option<HashSet<String>> {
    if !db.exists() {
        return None;
    }
    let conn = Connection::open_with_flags(
        db,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .expect("open the database read-only");
    let check: Vec<String> = conn
        .prepare("PRAGMA integrity_check")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(check, vec!["ok".to_string()], "integrity_check");
    let has_table: bool = conn
        .query_row(
            "SELECT count(*) > 0 FROM sqlite_schema WHERE type = 'table' AND name = 'tasks'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    if !has_table {
        // Killed before the first start finished initialising the schema.
        return None;
    }
    let ids = conn
        .prepare("SELECT id FROM tasks")
        .unwrap()
        .query_map([], |r| r.get::<_, String>(0))
        .unwrap()
        .collect::<Result<HashSet<_>, _>>()
        .unwrap();
    Some(ids)
}

#[test]
fn acknowledged_tasks_survive_sigkill() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let started = Instant::now();
    let rounds = rounds();
    let seed = seed();
    println!("kill test: {rounds} rounds, {SEED_ENV}={seed}");
    let mut rng = XorShift(seed);

    let root = private_dir();
    let dir = state_dir(root.path());
    let db = dir.join("tasks.db");
    let mut acked: HashSet<String> = HashSet::new();
    let mut present: HashSet<String> = HashSet::new();
    let mut opened_rounds = 0u32;
    // Rounds whose kill cut off the acknowledgement of committed rows.
    let mut rounds_cut_off = 0u32;

    for round in 1..=rounds {
        let delay =
            Duration::from_millis(MIN_DELAY_MS + rng.next() % (MAX_DELAY_MS - MIN_DELAY_MS + 1));
        let out = kill_after(spawn_child(&db), delay, round);

        let mut round_acks = 0usize;
        let mut opened = false;
        for line in complete_lines(&out) {
            if let Some(id) = line.strip_prefix("ack ") {
                assert!(
                    acked.insert(id.to_string()),
                    "round {round}: {id} acknowledged twice"
                );
                round_acks += 1;
            } else if let Some(e) = line.strip_prefix("err ") {
                panic!("round {round}: a create failed under plain load: {e}");
            } else if line.starts_with("open ") {
                opened = true;
            }
        }
        opened_rounds += u32::from(opened);

        let checked = Instant::now();
        let found = inspect(&db);
        let ids = found.as_ref();
        let missing: Vec<&String> = acked
            .iter()
            .filter(|id| !ids.is_some_and(|ids| ids.contains(*id)))
            .collect();
        assert!(
            missing.is_empty(),
            "round {round} (killed after {delay:?}, {SEED_ENV}={seed}): {} acknowledged IDs missing after the kill, e.g. {:?}",
            missing.len(),
            &missing[..missing.len().min(5)]
        );
        let unacked_before = present.len() - (acked.len() - round_acks);
        present = found.unwrap_or_default();
        // Rows this round committed whose acknowledgement the kill cut off:
        // the kill landed between a COMMIT and the answer to its writers.
        let cut_off = present.len() - acked.len() - unacked_before;
        rounds_cut_off += u32::from(cut_off > 0);
        println!(
            "round {round:>3}: killed after {:>4} ms, opened={opened}, acked {round_acks:>5}, committed unacknowledged {cut_off:>3}, total acked {:>6}, rows {:>6}, checked in {} ms",
            delay.as_millis(),
            acked.len(),
            present.len(),
            checked.elapsed().as_millis()
        );
    }

    assert!(
        opened_rounds > 0 && !acked.is_empty(),
        "the child never got to acknowledge anything: the test proved nothing"
    );
    let unacknowledged = present.len() - acked.len();
    println!(
        "kill test summary: rounds {rounds}, rounds past open {opened_rounds}, rounds whose kill cut off committed rows {rounds_cut_off}, acknowledged {}, committed but unacknowledged {unacknowledged}, rows {}, seed {seed}",
        acked.len(),
        present.len()
    );

    assert!(
        rounds_cut_off * CUT_OFF_SHARE >= opened_rounds,
        "only {rounds_cut_off} of {opened_rounds} kills cut off committed rows (at least one in {CUT_OFF_SHARE} must): the kills did not land inside commits ({SEED_ENV}={seed})"
    );

    // Startup (validation and restart recovery) passes on what the last kill
    // left, and nothing acknowledged is lost by it.
    let rt = runtime();
    rt.block_on(async {
        let (store, report) = Store::open(options(db.clone())).expect("startup after the kills");
        assert_eq!(report.retained, present.len() as u64, "{report:?}");
        assert_eq!(report.unexpired, present.len() as u64, "{report:?}");
        let owner = owner();
        for id in acked.iter().take(100) {
            let id = taskgate::store::TaskId::parse(id).unwrap();
            let rec = store.get(&id, &owner).await.unwrap();
            let rec = rec.unwrap_or_else(|| panic!("{id} not readable after restart"));
            assert!(
                rec.status.is_terminal(),
                "{rec:?}: recovery left it running"
            );
        }
        store.shutdown().await.unwrap();
        println!("final open: {report:?}");
    });
    let after = inspect(&db).expect("tasks table");
    assert!(acked.is_subset(&after), "acknowledged IDs lost by startup");
    println!("kill test took {:?}", started.elapsed());
}

/// Names the journal directory the journal child appends to.
const JOURNAL_CHILD_ENV: &str = "TASKGATE_KILL_CHILD_JOURNAL";
const JOURNAL_CHILD_TEST: &str = "journal_kill_child";
/// Threads appending to the journal in the child.
const JOURNAL_WRITERS: usize = 4;

fn gate_settings() -> taskgate::approvals::GateSettings {
    taskgate::approvals::GateSettings {
        decision_window_ms: TTL_MS,
        execution_window_ms: TTL_MS,
        // The smallest segments, so that kills land in rotations too.
        segment_max_bytes: 64 * 1024,
        max_pending: 1_000_000,
        max_pending_per_owner: 1_000_000,
        max_proposals: 1_000_000,
        max_proposals_per_owner: 1_000_000,
        // Nothing is forgotten while the loop runs: every acknowledged
        // decision is looked for after each kill.
        retain_ms: i64::MAX / 4,
        forbid_self_approval: true,
    }
}

/// The journal child's main (see `acknowledged_decisions_survive_sigkill`):
/// proposes and approves calls from several threads, printing each once
/// its append returned.
#[test]
#[ignore = "child entry point: run by acknowledged_decisions_survive_sigkill"]
fn journal_kill_child() {
    let Some(dir) = std::env::var_os(JOURNAL_CHILD_ENV) else {
        return;
    };
    say("");
    let (gate, _) = taskgate::approvals::Gate::open_dir(Path::new(&dir), gate_settings())
        .expect("open the journal");
    say("open");
    let gate = std::sync::Arc::new(gate);
    let pid = std::process::id();
    let writers: Vec<_> = (0..JOURNAL_WRITERS)
        .map(|w| {
            let gate = gate.clone();
            std::thread::spawn(move || {
                for n in 0u64.. {
                    let held = taskgate::approvals::HeldCall {
                        owner: "caller".into(),
                        call: format!("{pid}-{w}-{n}"),
                        tool: "deploy".into(),
                        principal: "the kill test".into(),
                        arguments: "0".repeat(64),
                        preview: Default::default(),
                    };
                    let id = match gate.admit(&held, 1) {
                        Ok(taskgate::approvals::Admission::Held { proposal, .. }) => proposal,
                        other => panic!("admit: {other:?}"),
                    };
                    std::thread::sleep(ANSWER_DELAY);
                    say(&format!("proposed {id}"));
                    gate.approve(&id, "admin", "admin", 2).expect("approve");
                    std::thread::sleep(ANSWER_DELAY);
                    say(&format!("approved {id}"));
                }
            })
        })
        .collect();
    std::thread::sleep(CHILD_LIFETIME);
    drop(writers);
    say("lifetime over");
    std::process::exit(3);
}

fn spawn_journal_child(dir: &Path) -> Child {
    spawn(JOURNAL_CHILD_TEST, JOURNAL_CHILD_ENV, dir)
}

#[test]
fn acknowledged_decisions_survive_sigkill() {
    if std::env::var_os(CHILD_ENV).is_some() || std::env::var_os(JOURNAL_CHILD_ENV).is_some() {
        return;
    }
    use taskgate::approvals::{Gate, State};
    let rounds = rounds();
    let seed = seed();
    println!("journal kill test: {rounds} rounds, {SEED_ENV}={seed}");
    let mut rng = XorShift(seed);
    let root = private_dir();
    let dir = root.path().join("approvals");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let mut proposed: HashSet<String> = HashSet::new();
    let mut approved: HashSet<String> = HashSet::new();
    let (mut opened_rounds, mut rounds_cut_off, mut torn_rounds) = (0u32, 0u32, 0u32);

    for round in 1..=rounds {
        let delay =
            Duration::from_millis(MIN_DELAY_MS + rng.next() % (MAX_DELAY_MS - MIN_DELAY_MS + 1));
        let out = kill_after(spawn_journal_child(&dir), delay, round);
        let mut opened = false;
        for line in complete_lines(&out) {
            if let Some(id) = line.strip_prefix("proposed ") {
                proposed.insert(id.to_string());
            } else if let Some(id) = line.strip_prefix("approved ") {
                approved.insert(id.to_string());
            } else if line == "open" {
                opened = true;
            }
        }
        opened_rounds += u32::from(opened);

        // What the next start sees: the chain verified, a torn final record
        // cut away, every acknowledged decision there.
        let (gate, report) = Gate::open(&dir, gate_settings()).unwrap_or_else(|e| {
            panic!("round {round} (killed after {delay:?}, {SEED_ENV}={seed}): the journal did not open: {e}")
        });
        torn_rounds += u32::from(report.truncated > 0);
        for id in &proposed {
            let p = gate.proposal(id);
            assert!(
                p.is_some(),
                "round {round}: acknowledged proposal {id} lost ({SEED_ENV}={seed})"
            );
        }
        for id in &approved {
            assert_eq!(
                gate.proposal(id).map(|p| p.state),
                Some(State::Approved),
                "round {round}: acknowledged approval of {id} lost ({SEED_ENV}={seed})"
            );
        }
        let all = gate.list();
        // Appends this round made whose acknowledgement the kill cut off.
        let cut_off = all.iter().filter(|p| !proposed.contains(&p.id)).count()
            + all
                .iter()
                .filter(|p| p.state == State::Approved && !approved.contains(&p.id))
                .count();
        rounds_cut_off += u32::from(cut_off > 0);
        // Every record held counts as known from now on.
        proposed.extend(all.iter().map(|p| p.id.clone()));
        approved.extend(
            all.iter()
                .filter(|p| p.state == State::Approved)
                .map(|p| p.id.clone()),
        );
        println!(
            "round {round:>3}: killed after {:>4} ms, opened={opened}, records {}, torn tail {} bytes, unacknowledged {cut_off}",
            delay.as_millis(),
            gate.head_seq(),
            report.truncated
        );
    }
    assert!(
        opened_rounds > 0 && !approved.is_empty(),
        "the child never acknowledged anything: the test proved nothing"
    );
    println!(
        "journal kill test summary: rounds {rounds}, past open {opened_rounds}, cut off {rounds_cut_off}, torn tails {torn_rounds}, proposals {}, seed {seed}",
        proposed.len()
    );
    assert!(
        rounds_cut_off * CUT_OFF_SHARE >= opened_rounds,
        "only {rounds_cut_off} of {opened_rounds} kills cut off synced appends (at least one in {CUT_OFF_SHARE} must) ({SEED_ENV}={seed})"
    );
}
