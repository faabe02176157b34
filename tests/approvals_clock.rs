//! Approval deadlines on an injected clock: a daemon opened in process by
//! the real startup path (`service::Daemon::start`, a real task store and
//! journal on disk) whose store clock the test moves. The held tool is a
//! built-in of the test that counts its runs (a command tool's shim is the
//! daemon's own binary, which a test binary is not). A proposal nobody decides expires (journaled before its task
//! shows it), an approval first observed after its execution window reads
//! expired and runs nothing, and an expiry journaled but not yet projected
//! (what a crash between the two leaves) is projected after a restart.
//!
//! Invariant 25 of the map: The approval journal is bounded without losing
//! evidence: a proposal is forgotten only once it is decided and no approval
//! task waiting on it can still be read, a segment is removed only when every
//! proposal it holds is forgotten and only after `journal.base` (where the
//! chain now begins) is synced, and a journal missing its first segments
//! without that base is still refused as damaged; one caller cannot take
//! another's room (per-owner bounds on waiting and kept proposals). Guarded by:
//! `src/approvals/gate.rs::settled_proposals_are_forgotten_and_only_their_segments_removed`,
//! `src/approvals/gate.rs::proposals_kept_are_bounded_per_owner_and_in_all`,
//! `src/approvals/journal.rs::old_segments_go_behind_a_base_and_the_journal_still_verifies`,
//! `src/approvals/journal.rs::the_base_is_synced_before_any_segment_is_removed`,
//! `src/tasks/approval.rs::a_decided_proposal_is_kept_exactly_as_long_as_its_longest_lived_task`,
//! `tests/approvals_clock.rs::forgotten_proposals_leave_the_journal_and_a_backup_carries_its_base`
//!
//! What this file proves: approval deadlines on an injected clock, in a daemon
//! opened in process by the real startup path (real store and journal; the held
//! tool a built-in counting its runs): a proposal nobody decides waits at its
//! deadline and expires a millisecond after (journaled, then projected; a
//! decision on it refused; the identical call asks afresh), an approval first
//! observed after its execution window reads expired and runs nothing, an
//! expiry journaled but not projected (what a crash between them leaves)
//! projected after a restart, a receipt unchanged an hour later; proposals
//! decided a day before forgotten and the segments holding only them removed
//! behind `journal.base`, which an offline backup carries and a restore brings
//! back (the journal reopening where it begins)

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use taskgate::auth::Caller;
use taskgate::config::Overrides;
use taskgate::config::{Effect, TaskMode};
use taskgate::service::{Daemon, Options};
use taskgate::store::{Clock, ManualClock, TaskRecord, TaskStatus};
use taskgate::tasks::{Call, Decider, Decision, Delivery, TaskError};
use taskgate::tools::{ApprovalRule, ArgumentError, RunFuture, Runner, ToolSpec};

/// 2026-12-01T00:00:00Z.
const START_MS: i64 = 1_796_083_200_000;
const DECISION_WINDOW: Duration = Duration::from_secs(600);
const EXECUTION_WINDOW: Duration = Duration::from_secs(300);

struct Fixture {
    root: tempfile::TempDir,
    state: PathBuf,
    daemon: Daemon,
    clock: ManualClock,
    runs: Arc<AtomicUsize>,
}

/// `deploy`: needs approval; counts its runs.
#[derive(Debug)]
struct Deploy {
    spec: ToolSpec,
    rule: ApprovalRule,
    runs: Arc<AtomicUsize>,
}

impl Runner for Deploy {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn validate(&self, _args: &Value) -> Result<(), ArgumentError> {
        Ok(())
    }

    fn run<'a>(
        &'a self,
        _args: &'a Map<String, Value>,
        _grace: Duration,
        _cancel: &'a CancellationToken,
    ) -> RunFuture<'a> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Ok(json!({"content": [{"type": "text", "text": "deployed"}]})) })
    }

    fn starts_process(&self) -> bool {
        false
    }

    fn approval(&self) -> Option<&ApprovalRule> {
        Some(&self.rule)
    }
}

fn deploy(runs: Arc<AtomicUsize>) -> Arc<dyn Runner> {
    Arc::new(Deploy {
        spec: ToolSpec {
            name: "deploy".into(),
            description: "needs approval".into(),
            input_schema: json!({"type": "object"}),
            effect: Effect::NonIdempotentWrite,
            task: TaskMode::Never,
            shown: Default::default(),
        },
        rule: ApprovalRule {
            definition: "0".repeat(64),
            preview: vec!["target".into()],
        },
        runs,
    })
}

fn config(root: &Path) -> PathBuf {
    let path = root.join("taskgate.toml");
    std::fs::write(
        &path,
        format!(
            "[approvals]\ndecision_window_secs = {}\nexecution_window_secs = {}\npoll_interval_ms = 5000\nsegment_max_bytes = 65536\n",
            DECISION_WINDOW.as_secs(),
            EXECUTION_WINDOW.as_secs(),
        ),
    )
    .unwrap();
    path
}

fn open(root: &Path, state: &Path, clock: Clock, runs: &Arc<AtomicUsize>) -> Daemon {
    // The journal is opened when it exists: made here, as a tool of the
    // configuration needing approval would have it made.
    let journal = root.join("state-approvals");
    std::fs::create_dir_all(&journal).unwrap();
    std::fs::set_permissions(
        &journal,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    Daemon::start(Options {
        overrides: Overrides {
            config_path: Some(config(root)),
            state_dir: Some(state.to_path_buf()),
            listen: None,
        },
        builtins: vec![deploy(runs.clone())],
        clock: Some(clock),
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("{e:?}"))
}

fn fixture() -> Fixture {
    let root = common::private_dir();
    let state = common::state_dir(root.path());
    reopen(root, state, Arc::new(AtomicUsize::new(0)), START_MS)
}

/// The same directories served again, with the clock at `at_ms`.
fn reopen(root: tempfile::TempDir, state: PathBuf, runs: Arc<AtomicUsize>, at_ms: i64) -> Fixture {
    let (clock, manual) = Clock::manual(at_ms);
    let daemon = open(root.path(), &state, clock, &runs);
    Fixture {
        root,
        state,
        daemon,
        clock: manual,
        runs,
    }
}

impl Fixture {
    async fn call(&self, negotiated: bool, target: &str) -> Result<Delivery, TaskError> {
        let mut args = Map::new();
        args.insert("target".into(), json!(target));
        self.daemon
            .service()
            .call(Call {
                tool: "deploy".into(),
                arguments: Some(args),
                caller: Caller::Local,
                negotiated,
                operation_id: None,
                client_cancel: CancellationToken::new(),
            })
            .await
    }

    async fn task(&self, target: &str) -> TaskRecord {
        match self.call(true, target).await {
            Ok(Delivery::Task(record)) => record,
            other => panic!("expected an approval task: {other:?}"),
        }
    }

    /// The proposal of the `approval_required` answer to a plain call.
    async fn held(&self, target: &str) -> String {
        match self.call(false, target).await {
            Ok(Delivery::Now(v)) => v["structuredContent"]["proposal"]
                .as_str()
                .unwrap_or_else(|| panic!("not held: {v}"))
                .to_string(),
            other => panic!("expected approval_required: {other:?}"),
        }
    }

    async fn get(&self, id: &str) -> TaskRecord {
        self.daemon
            .service()
            .get(id, &Caller::Local)
            .await
            .unwrap_or_else(|e| panic!("tasks/get {id}: {e}"))
    }

    fn proposal_state(&self, id: &str) -> String {
        let approvals = self.daemon.service().approvals().expect("approvals");
        let now = self.daemon.store().clock().now_ms();
        approvals.proposals(Some(id), false, now).expect("proposal")[0]
            .state
            .as_str()
            .to_string()
    }

    fn only_proposal(&self) -> String {
        let approvals = self.daemon.service().approvals().expect("approvals");
        let all = approvals.proposals(None, false, 0).expect("proposals");
        assert_eq!(all.len(), 1, "{all:?}");
        all[0].id.clone()
    }

    fn marker(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    async fn close(self) -> (tempfile::TempDir, PathBuf, Arc<AtomicUsize>) {
        self.daemon
            .store()
            .shutdown()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        (self.root, self.state, self.runs)
    }
}

/// The text of a finished approval task's result, and whether it is an error.
fn outcome(record: &TaskRecord) -> (String, bool) {
    match &record.outcome {
        Some(taskgate::store::Outcome::Result(v)) => (
            v["content"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            v["isError"].as_bool().unwrap_or(false),
        ),
        other => panic!("no result: {other:?}"),
    }
}

fn past(window: Duration) -> Duration {
    window + Duration::from_millis(1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proposal_nobody_decides_expires_and_an_identical_call_asks_afresh() {
    let f = fixture();
    let task = f.task("prod").await;
    let proposal = f.only_proposal();
    f.clock.advance(DECISION_WINDOW);
    // At its deadline it still waits (and a call joins it).
    assert_eq!(f.held("prod").await, proposal);
    f.clock.advance(Duration::from_millis(1));
    let done = f.get(task.id.as_str()).await;
    assert_eq!(done.status, TaskStatus::Completed);
    let (text, is_error) = outcome(&done);
    assert!(is_error && text.contains("expired"), "{text}");
    // Journaled, not only shown.
    assert_eq!(f.proposal_state(&proposal), "expired");
    let fresh = f.held("prod").await;
    assert_ne!(fresh, proposal);
    // A decision on the expired proposal is refused.
    let approvals = f.daemon.service().approvals().unwrap().clone();
    let late = approvals
        .decide(
            &proposal,
            Decision::Approve { valid_for_ms: None },
            Decider {
                name: "admin".into(),
                identity: "uid:0".into(),
            },
            f.daemon.store().clock().now_ms(),
        )
        .await;
    assert!(late.is_err(), "{late:?}");
    assert_eq!(f.marker(), 0);
    f.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_first_seen_after_its_window_reads_expired_and_runs_nothing() {
    let f = fixture();
    let task = f.task("prod").await;
    let proposal = f.only_proposal();
    let approvals = f.daemon.service().approvals().unwrap().clone();
    let now = f.daemon.store().clock().now_ms();
    let admin = Decider {
        name: "admin".into(),
        identity: "uid:0".into(),
    };
    approvals
        .decide(
            &proposal,
            Decision::Approve { valid_for_ms: None },
            admin,
            now,
        )
        .await
        .expect("approve");
    f.clock.advance(past(EXECUTION_WINDOW));
    let done = f.get(task.id.as_str()).await;
    let (text, is_error) = outcome(&done);
    assert!(is_error && text.contains("expired"), "{text}");
    // The identical call is not covered any more: it asks afresh.
    let fresh = f.held("prod").await;
    assert_ne!(fresh, proposal);
    assert_eq!(f.marker(), 0);
    f.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expiry_journaled_but_not_projected_is_projected_after_a_restart() {
    let f = fixture();
    let task = f.task("prod").await;
    let proposal = f.only_proposal();
    f.clock.advance(past(DECISION_WINDOW));
    // The expiry journaled, the task not yet told: what a crash between
    // the two leaves behind.
    let now = f.daemon.store().clock().now_ms();
    let gate = f
        .daemon
        .service()
        .approvals()
        .and_then(|a| a.gate().cloned())
        .expect("gate");
    assert_eq!(
        gate.expire_due(now).expect("expire"),
        vec![proposal.clone()]
    );
    drop(gate);
    let (root, state, runs) = f.close().await;

    let f = reopen(root, state, runs, now + 1);
    let done = f.get(task.id.as_str()).await;
    assert_eq!(done.status, TaskStatus::Completed);
    assert!(outcome(&done).1);
    assert_eq!(f.proposal_state(&proposal), "expired");
    f.close().await;
}

/// The receipt of an approval reads the same once the proposal is spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receipt_is_history_and_never_asks_the_journal_again() {
    let f = fixture();
    let task = f.task("prod").await;
    let proposal = f.only_proposal();
    let approvals = f.daemon.service().approvals().unwrap().clone();
    let now = f.daemon.store().clock().now_ms();
    approvals
        .decide(
            &proposal,
            Decision::Approve {
                valid_for_ms: Some(60_000),
            },
            Decider {
                name: "admin".into(),
                identity: "uid:0".into(),
            },
            now,
        )
        .await
        .expect("approve");
    let receipt = f.get(task.id.as_str()).await;
    let (text, is_error) = outcome(&receipt);
    assert!(!is_error && text.contains("Approval recorded"), "{text}");
    match f.call(false, "prod").await {
        Ok(Delivery::Now(v)) => assert_eq!(v["content"][0]["text"], "deployed", "{v}"),
        other => panic!("the re-issue did not run: {other:?}"),
    }
    assert_eq!(f.marker(), 1);
    // Long after, the receipt is unchanged: terminal rows never consult the
    // gate.
    f.clock.advance(Duration::from_secs(3600));
    let later = f.get(task.id.as_str()).await;
    assert_eq!(later.outcome, receipt.outcome);
    let value: Value = serde_json::to_value(outcome(&later).0).unwrap();
    assert!(value.as_str().unwrap().contains(&proposal));
    f.close().await;
}

/// Proposals decided long ago are forgotten and the segments holding only
/// them removed behind `journal.base`; a backup carries the base, and the
/// restored journal opens where it begins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forgotten_proposals_leave_the_journal_and_a_backup_carries_its_base() {
    let f = fixture();
    // A Tasks client's call, approved and read to its receipt.
    let task = f.task("receipt").await;
    let approvals = f.daemon.service().approvals().unwrap().clone();
    let first = f.only_proposal();
    let now = f.daemon.store().clock().now_ms();
    let admin = Decider {
        name: "admin".into(),
        identity: "uid:0".into(),
    };
    approvals
        .decide(&first, Decision::Approve { valid_for_ms: None }, admin, now)
        .await
        .expect("approve");
    let receipt = f.get(task.id.as_str()).await;
    assert_eq!(receipt.status, TaskStatus::Completed);
    // Many held calls nobody decides: several 64 KiB segments.
    for i in 0..600 {
        f.held(&format!("target-{i}")).await;
    }
    let journal = f.root.path().join("state-approvals");
    let segments = |dir: &Path| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("journal-"))
            .collect();
        names.sort();
        names
    };
    let before = segments(&journal);
    assert!(before.len() >= 4, "{before:?}");
    // Past their deadline they expire; a day later (the tasks' default
    // time to live) nothing can wait on them any more.
    f.clock.advance(past(DECISION_WINDOW));
    let gate = approvals.gate().cloned().expect("gate");
    let now = f.daemon.store().clock().now_ms();
    assert_eq!(gate.expire_due(now).expect("expire").len(), 600);
    let records = gate.checkpoint().records;
    f.clock
        .advance(Duration::from_secs(86_400) + Duration::from_secs(60));
    let newest = f.held("after-a-day").await;
    let listed = approvals.proposals(None, false, 0).expect("list");
    assert_eq!(
        listed.iter().map(|p| p.id.clone()).collect::<Vec<_>>(),
        vec![newest.clone()]
    );
    let after = segments(&journal);
    assert!(
        after.len() < before.len() && !after.contains(&before[0]),
        "{before:?} -> {after:?}"
    );
    assert!(journal.join("journal.base").exists());
    assert_eq!(gate.checkpoint().records, records + 1, "sequences go on");
    // The approval task's own lifetime (the default day) is over too: what
    // made forgetting its proposal safe.
    assert!(
        f.daemon
            .service()
            .get(task.id.as_str(), &Caller::Local)
            .await
            .is_err(),
        "the approval task outlived its proposal"
    );
    drop(gate);
    drop(approvals);
    let (root, state, runs) = f.close().await;

    // An offline backup carries the base; the restored journal opens
    // where it begins, with the waiting proposal.
    let dest = root.path().join("backup");
    let st = state.to_string_lossy().into_owned();
    let out = common::taskgate(
        &["backup", "--state-dir", &st, "--to", dest.to_str().unwrap()],
        &[],
    );
    assert!(out.status.success(), "{out:?}");
    let manifest = std::fs::read_to_string(dest.join("MANIFEST.sha256")).unwrap();
    assert!(
        manifest.contains("approvals/journal.base") && !manifest.contains(&before[0]),
        "{manifest}"
    );
    std::fs::remove_dir_all(&journal).unwrap();
    let out = common::taskgate(
        &[
            "restore",
            "--state-dir",
            &st,
            "--from",
            dest.to_str().unwrap(),
        ],
        &[],
    );
    assert!(out.status.success(), "{out:?}");
    assert!(journal.join("journal.base").exists());
    let f = reopen(root, state, runs, START_MS + 2 * 86_400_000);
    assert_eq!(f.only_proposal(), newest);
    assert_eq!(f.proposal_state(&newest), "pending");
    assert_eq!(f.marker(), 0);
    f.close().await;
}
