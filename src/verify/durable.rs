//! `taskgate verify --durable-tasks`: qualifies the durable route on this
//! host, end to end, with nothing but the binary itself.
//!
//! It builds a router (a task store on a private temporary directory and
//! the route service) and an embedded qualification provider: this binary
//! serving MCP over stdio (`serve --stdio`) as a Tasks-capable upstream,
//! whose one task tool starts the bounded JSON worker
//! (`qualification-worker`) as a separate child process writing under a
//! temporary permitted root. Each check drives the router the way a caller
//! would, then an independent verifier ([`super::artifacts`]) reads what
//! the worker left. The router's store is closed and opened again while
//! the provider's session stays connected, so recovery by the same key and
//! public ID is shown on the exact session the task was created on.
//! Everything it made is removed before it reports.
//!
//! A provider session change (a reconnect) is not simulated here: the
//! route's source tests cover it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::artifacts::{self, Expected, Finding};
use super::{Identity, input_digest};
use crate::auth::Caller;
use crate::config::{Config, Overrides};
use crate::exit::{Classify, ExitClass};
use crate::route::{Check, MetaAnswer, RouteError, Router};
use crate::store::{Digest, Store, StoreOptions, TaskRecord, TaskStatus};
use crate::upstream::{Pins, Upstreams};

/// The provider's alias and its tools.
const ALIAS: &str = "qualification";
const NORMALIZE: &str = "qualification.normalize";
const HOLD: &str = "qualification.hold";
/// How long the provider has to connect, and a task to end.
const SETTLE: Duration = Duration::from_secs(60);
/// The router's poll interval here.
const POLL: Duration = Duration::from_millis(200);

#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("cannot prepare the qualification's temporary directory {path}: {source}")]
    Scratch {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the qualification could not start: {0}")]
    Setup(String),
}

impl Classify for VerifyError {
    fn exit_class(&self) -> ExitClass {
        match self {
            VerifyError::Scratch { .. } => ExitClass::Io,
            VerifyError::Setup(_) => ExitClass::CallFailed,
        }
    }
}

/// One named check and what it saw.
#[derive(Debug, Clone, Serialize)]
pub struct CheckResult {
    pub name: &'static str,
    pub pass: bool,
    pub evidence: Value,
}

/// The structured result: PASS only when every check passed.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub qualification: &'static str,
    pub result: &'static str,
    pub version: &'static str,
    pub duration_ms: u128,
    pub checks: Vec<CheckResult>,
    /// The temporary directory, when it was kept (`--keep`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept: Option<PathBuf>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.result == "PASS"
    }

    /// The human summary (for stderr).
    pub fn summary(&self) -> String {
        let mut out = String::new();
        for c in &self.checks {
            out.push_str(&format!(
                "{}  {}\n",
                if c.pass { "pass" } else { "FAIL" },
                c.name
            ));
        }
        out.push_str(&format!(
            "durable-tasks qualification: {} ({} checks, {} ms)\n",
            self.result,
            self.checks.len(),
            self.duration_ms
        ));
        out
    }
}

/// Where everything lives, under one private temporary directory.
struct Layout {
    root: PathBuf,
    router_config: PathBuf,
    router_state: PathBuf,
    provider_dir: PathBuf,
    provider_config: PathBuf,
    provider_state: PathBuf,
    /// The provider's tools' working directory.
    provider_work: PathBuf,
    /// The worker's permitted output root.
    out: PathBuf,
    /// The verifier's altered copies.
    scratch: PathBuf,
    /// A directory outside the permitted root that nothing may write into.
    outside: PathBuf,
}

fn mkdir(path: &Path) -> Result<(), VerifyError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(path)
        .map_err(|source| VerifyError::Scratch {
            path: path.to_path_buf(),
            source,
        })
}

fn write(path: &Path, text: &str) -> Result<(), VerifyError> {
    std::fs::write(path, text).map_err(|source| VerifyError::Scratch {
        path: path.to_path_buf(),
        source,
    })
}

fn toml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

impl Layout {
    fn make() -> Result<Layout, VerifyError> {
        let base = std::env::temp_dir();
        let mut bytes = [0u8; 8];
        getrandom::fill(&mut bytes).map_err(|e| VerifyError::Setup(format!("random: {e}")))?;
        let tag: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let root = base.join(format!("taskgate-verify-{tag}"));
        mkdir(&root)?;
        let l = Layout {
            router_config: root.join("router").join("taskgate.toml"),
            router_state: root.join("router").join("state"),
            provider_dir: root.join("provider"),
            provider_config: root.join("provider").join("provider.toml"),
            provider_state: root.join("provider").join("state"),
            provider_work: root.join("provider").join("work"),
            out: root.join("out"),
            scratch: root.join("scratch"),
            outside: root.join("outside"),
            root,
        };
        for d in [
            l.root.join("router"),
            l.router_state.clone(),
            l.provider_dir.clone(),
            l.provider_state.clone(),
            l.provider_work.clone(),
            l.out.clone(),
            l.scratch.clone(),
            l.outside.clone(),
        ] {
            mkdir(&d)?;
        }
        Ok(l)
    }

    /// The provider: this binary's own task service, with the worker as a
    /// task tool confined to the output root, and a tool that only waits
    /// (for the deadline's cancel). The provider is confined as any stdio
    /// upstream (its directory readable, its state, its tools' working
    /// directory and the output root writable), and confines its own tools
    /// inside that. Its tools run in a working directory of its own: the
    /// scratch directory a tool would get otherwise lies in the temporary
    /// directory, which the provider's confinement does not grant.
    fn write_configs(&self, exe: &Path) -> Result<(), VerifyError> {
        let provider = format!(
            "[tasks]\npoll_interval_ms = 200\n\n[[tool]]\nname = \"normalize\"\ndescription = \"Normalises a small JSON object and writes a result and manifest under the permitted root.\"\nargv = [{exe}, \"qualification-worker\", \"--root\", {out}]\nworking_dir = {work}\nwrite_paths = [{out}]\neffect = \"idempotent_write\"\ntask = \"required\"\ntimeout_secs = 30\n\n[[tool]]\nname = \"hold\"\ndescription = \"Waits until it is cancelled.\"\nargv = [\"/bin/sleep\", \"60\"]\nworking_dir = {work}\neffect = \"idempotent_write\"\ntask = \"required\"\ntimeout_secs = 120\n",
            exe = toml_str(&exe.to_string_lossy()),
            out = toml_str(&self.out.to_string_lossy()),
            work = toml_str(&self.provider_work.to_string_lossy()),
        );
        write(&self.provider_config, &provider)?;
        let router = format!(
            "[[upstream]]\nalias = \"{ALIAS}\"\ncommand = [{exe}, \"serve\", \"--stdio\", \"--config\", {config}, \"--state-dir\", {state}]\nread_paths = [{dir}]\nwrite_paths = [{state}, {work}, {out}]\neffect = \"idempotent_write\"\nrequest_timeout_secs = 30\n",
            exe = toml_str(&exe.to_string_lossy()),
            config = toml_str(&self.provider_config.to_string_lossy()),
            state = toml_str(&self.provider_state.to_string_lossy()),
            dir = toml_str(&self.provider_dir.to_string_lossy()),
            work = toml_str(&self.provider_work.to_string_lossy()),
            out = toml_str(&self.out.to_string_lossy()),
        );
        write(&self.router_config, &router)
    }
}

/// The router as a caller meets it, and the store under it.
struct Bench {
    store: Store,
    router: Arc<Router>,
    upstreams: Arc<Upstreams>,
    layout: Layout,
    caller: Caller,
    owner: Digest,
}

fn open_store(layout: &Layout) -> Result<Store, VerifyError> {
    Store::open(StoreOptions::new(layout.router_state.join("tasks.db")))
        .map(|(s, _)| s)
        .map_err(|e| VerifyError::Setup(format!("the router's store: {e}")))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn structured(answer: Result<MetaAnswer, RouteError>) -> Result<Value, String> {
    match answer {
        Ok(MetaAnswer::Result(v)) => Ok(v["structuredContent"].clone()),
        Ok(MetaAnswer::Task { task: t, .. }) => {
            Err(format!("a task where a result was expected: {}", t.id))
        }
        Err(e) => Err(e.message()),
    }
}

/// The worker's request for `input`, written to `output`.
fn worker_request(key: &str, input: &Value, output: &str, fault: &str) -> (Value, Identity) {
    let input_map = input.as_object().cloned().unwrap_or_default();
    let identity = Identity {
        correlation_id: format!("qualification-{key}"),
        logical_task_id: format!("logical-{key}"),
        attempt: 1,
        input_digest: input_digest(&input_map),
    };
    let request = json!({
        "identity": identity,
        "input": input,
        "output": output,
        "fault": fault,
    });
    (request, identity)
}

impl Bench {
    async fn call(&self, tool: &str, args: Value) -> Result<MetaAnswer, RouteError> {
        let Value::Object(map) = args else {
            return Err(RouteError::Internal("arguments must be an object".into()));
        };
        self.router
            .call(tool, Some(map), &self.caller, self.owner, true)
            .await
    }

    async fn describe(&self) -> Result<Value, String> {
        structured(self.call(crate::route::DESCRIBE_TOOL, json!({})).await)
    }

    async fn capability(&self, name: &str) -> Result<Value, String> {
        let d = self.describe().await?;
        d["capabilities"]
            .as_array()
            .and_then(|a| a.iter().find(|c| c["name"] == name).cloned())
            .ok_or_else(|| format!("{name} is not routable: {d}"))
    }

    async fn lease(&self, name: &str, effects: &[&str]) -> Result<Value, String> {
        structured(
            self.call(
                crate::route::LEASE_TOOL,
                json!({"capabilities": [name], "effects": effects}),
            )
            .await,
        )
    }

    /// A valid submission of `arguments` to `name` under `key`.
    async fn submission(
        &self,
        name: &str,
        key: &str,
        arguments: &Value,
        deadline: Duration,
    ) -> Result<Value, String> {
        let cap = self.capability(name).await?;
        let lease = self
            .lease(
                name,
                &[
                    cap["effect"].as_str().unwrap_or_default(),
                    "non_idempotent_write",
                ],
            )
            .await?;
        Ok(json!({
            "schema": crate::route::SUBMISSION_SCHEMA,
            "leaseId": lease["leaseId"],
            "capability": name,
            "logicalTaskId": format!("logical-{key}"),
            "attempt": 1,
            "correlationId": format!("qualification-{key}"),
            "idempotencyKey": key,
            "inputDigest": input_digest(&arguments.as_object().cloned().unwrap_or_default()),
            "acceptancePolicyDigest": Digest::of(b"qualification acceptance policy").to_hex(),
            "artifactScopeDigest": Digest::of(b"qualification artifact scope").to_hex(),
            "providerInterfaceVersion": cap["schemaDigest"],
            "deadlineUnixMs": now_ms() + deadline.as_millis() as i64,
            "retentionMs": 600_000,
            "limits": {"runtimeMs": 30_000, "artifactBytes": 65_536, "outputBytes": 65_536},
            "permittedEffect": "non_idempotent_write",
            "cleanupRequired": true,
        }))
    }

    async fn submit(
        &self,
        submission: &Value,
        arguments: &Value,
    ) -> Result<TaskRecord, RouteError> {
        match self
            .call(
                crate::route::SUBMIT_TOOL,
                json!({"submission": submission, "arguments": arguments}),
            )
            .await?
        {
            MetaAnswer::Task { task: t, .. } => Ok(t),
            MetaAnswer::Result(v) => Err(RouteError::Internal(format!(
                "a result where a task was expected: {v}"
            ))),
        }
    }

    /// Polls until terminal.
    async fn wait(&self, id: &str) -> Result<TaskRecord, String> {
        let start = Instant::now();
        loop {
            let t = self
                .router
                .get(id, &self.caller, &self.owner)
                .await
                .map_err(|e| e.message())?;
            if t.status.is_terminal() {
                return Ok(t);
            }
            if start.elapsed() > SETTLE {
                return Err(format!("{id} did not end within {} s", SETTLE.as_secs()));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The router's store closed and opened again, with a new router on
    /// the same upstreams (whose session stays connected).
    async fn reopen(&mut self) -> Result<(), VerifyError> {
        self.router.finish().await;
        self.store
            .shutdown()
            .await
            .map_err(|e| VerifyError::Setup(format!("closing the router's store: {e}")))?;
        self.store = open_store(&self.layout)?;
        self.router = Router::new(self.store.clone(), self.upstreams.clone(), POLL);
        Ok(())
    }

    fn session(&self) -> Option<String> {
        self.upstreams
            .status(false)
            .into_iter()
            .find(|u| u.alias == ALIAS)
            .and_then(|u| u.session)
    }
}

fn result_text(t: &TaskRecord) -> Value {
    match &t.outcome {
        Some(crate::store::Outcome::Result(v)) => v.clone(),
        Some(crate::store::Outcome::Error(e)) => json!({"error": e}),
        None => Value::Null,
    }
}

fn refused_check(r: Result<TaskRecord, RouteError>) -> String {
    match r {
        Err(RouteError::Refused { check, .. }) => check.as_str().to_string(),
        Err(e) => format!("other: {}", e.wire().name),
        Ok(t) => format!("accepted as {}", t.id),
    }
}

/// Copies `out/NAME`'s regular files to `scratch/AS`.
fn copy_run(layout: &Layout, name: &str, to: &str) -> std::io::Result<PathBuf> {
    let from = layout.out.join(name);
    let dest = layout.scratch.join(to);
    std::fs::create_dir(&dest)?;
    for f in [super::RESULT_FILE, super::MANIFEST_FILE] {
        std::fs::copy(from.join(f), dest.join(f))?;
    }
    Ok(dest)
}

fn finding_name(f: &Finding) -> &'static str {
    match f {
        Finding::Missing { .. } => "missing",
        Finding::Truncated { .. } => "truncated",
        Finding::DigestMismatch { .. } => "digest_mismatch",
        Finding::IdentityChanged { .. } => "identity_changed",
        Finding::Unlisted { .. } => "unlisted",
        Finding::Symlink { .. } => "symlink",
        Finding::Malformed { .. } => "malformed",
        Finding::Io { .. } => "io",
    }
}

/// Runs the qualification. `keep` leaves the temporary directory for
/// investigation (it is removed otherwise, whatever the result).
pub fn run(keep: bool) -> Result<Report, VerifyError> {
    let started = Instant::now();
    let layout = Layout::make()?;
    let root = layout.root.clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| VerifyError::Setup(format!("runtime: {e}")))?;
    let outcome = runtime.block_on(qualify(layout));
    let kept = if keep {
        Some(root.clone())
    } else {
        let _ = std::fs::remove_dir_all(&root);
        None
    };
    let mut checks = outcome?;
    if !keep {
        checks.push(CheckResult {
            name: "nothing_left_behind",
            pass: !root.exists(),
            evidence: json!({"temporaryDirectory": root, "exists": root.exists()}),
        });
    }
    let pass = checks.iter().all(|c| c.pass);
    Ok(Report {
        qualification: "durable-tasks",
        result: if pass { "PASS" } else { "FAIL" },
        version: env!("CARGO_PKG_VERSION"),
        duration_ms: started.elapsed().as_millis(),
        checks,
        kept,
    })
}

async fn qualify(layout: Layout) -> Result<Vec<CheckResult>, VerifyError> {
    let exe = std::env::current_exe()
        .map_err(|e| VerifyError::Setup(format!("cannot find this binary: {e}")))?;
    layout.write_configs(&exe)?;
    let overrides = Overrides {
        config_path: Some(layout.router_config.clone()),
        state_dir: Some(layout.router_state.clone()),
        listen: None,
    };
    // The operator's TASKGATE_* variables are not this qualification's.
    let config = Config::load_from(&overrides, &HashMap::new())
        .map_err(|e| VerifyError::Setup(format!("its configuration: {e}")))?;
    let protected = crate::tools::confine::protected(&config.state_dir, config.file.as_deref());
    let stop = CancellationToken::new();
    let upstreams = Upstreams::new(protected.clone(), stop.clone());
    upstreams
        .apply(&config.upstreams, &Pins::default(), protected.clone())
        .await;
    let mut checks = Vec::new();
    // The provider connects; its tools are pinned as an operator would.
    let start = Instant::now();
    let status = loop {
        let all = upstreams.status(true);
        if let Some(u) = all
            .into_iter()
            .find(|u| u.alias == ALIAS && u.state == "ready")
        {
            break u;
        }
        if start.elapsed() > SETTLE {
            upstreams.stop_all().await;
            let last = upstreams
                .status(false)
                .into_iter()
                .next()
                .and_then(|u| u.last_error)
                .unwrap_or_default();
            return Err(VerifyError::Setup(format!(
                "the qualification provider did not connect within {} s: {last}",
                SETTLE.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut pins = Pins::default();
    for cap in &status.capabilities {
        pins.set(
            ALIAS,
            &cap.tool,
            &cap.digest,
            "qualification".into(),
            Some(&cap.described),
        );
    }
    upstreams
        .apply(&config.upstreams, &pins, protected.clone())
        .await;
    checks.push(CheckResult {
        name: "provider_negotiated_tasks",
        pass: status.protocol_version.as_deref() == Some(crate::upstream::ROUTABLE_PROTOCOL)
            && status.tasks_advertised,
        evidence: json!({
            "protocol": status.protocol_version,
            "tasksAdvertised": status.tasks_advertised,
            "session": status.session,
            "server": status.server,
        }),
    });
    let store = open_store(&layout)?;
    let mut bench = Bench {
        router: Router::new(store.clone(), upstreams.clone(), POLL),
        store,
        upstreams: upstreams.clone(),
        layout,
        caller: Caller::Local,
        owner: crate::tasks::local_owner(),
    };
    let result = scenarios(&mut bench, &mut checks).await;
    bench.router.finish().await;
    bench.upstreams.stop_all().await;
    let _ = bench.store.shutdown().await;
    stop.cancel();
    if let Err(e) = result {
        checks.push(CheckResult {
            name: "scenarios_completed",
            pass: false,
            evidence: json!({"error": e}),
        });
    }
    Ok(checks)
}

async fn scenarios(b: &mut Bench, checks: &mut Vec<CheckResult>) -> Result<(), String> {
    // Describe and lease.
    let cap = b.capability(NORMALIZE).await?;
    checks.push(CheckResult {
        name: "describe",
        pass: cap["schemaDigest"]
            .as_str()
            .is_some_and(|d| d.starts_with("sha256:"))
            && cap["taskCeiling"] == "non_idempotent_write",
        evidence: cap.clone(),
    });
    let lease = b
        .lease(NORMALIZE, &["idempotent_write", "non_idempotent_write"])
        .await?;
    let expires = lease["expiresAtUnixMs"].as_i64().unwrap_or(0);
    checks.push(CheckResult {
        name: "lease_absolute_expiry",
        pass: expires > now_ms() && lease["leaseId"].is_string(),
        evidence: lease.clone(),
    });

    // Refusals: nothing is stored or sent for any of them.
    let (good_args, _) = worker_request("refusal", &json!({"name": "x"}), "refusal", "none");
    let good = b
        .submission(NORMALIZE, "refusal", &good_args, Duration::from_secs(300))
        .await?;
    let with = |k: &str, v: Value| {
        let mut s = good.clone();
        s[k] = v;
        s
    };
    let mut refusals = serde_json::Map::new();
    let mut all_refused = true;
    for (case, sub, args, want) in [
        (
            "schema",
            with("schema", json!("taskgate.task-submission/0")),
            good_args.clone(),
            Check::Schema,
        ),
        (
            "lease",
            with("leaseId", json!("tgl-unknown")),
            good_args.clone(),
            Check::Lease,
        ),
        (
            "capability",
            with("capability", json!("qualification.absent")),
            good_args.clone(),
            Check::Capability,
        ),
        (
            "provider_interface",
            with("providerInterfaceVersion", json!("sha256:0")),
            good_args.clone(),
            Check::ProviderInterface,
        ),
        (
            "effect",
            with("permittedEffect", json!("idempotent_write")),
            good_args.clone(),
            Check::Effect,
        ),
        (
            "bounds",
            with("attempt", json!(2)),
            good_args.clone(),
            Check::Bounds,
        ),
        (
            "input_digest",
            good.clone(),
            json!({"identity": good_args["identity"], "input": {"name": "y"}, "output": "refusal", "fault": "none"}),
            Check::InputDigest,
        ),
    ] {
        let got = refused_check(b.submit(&sub, &args).await);
        all_refused &= got == want.as_str();
        refusals.insert(case.into(), json!(got));
    }
    let lease_without = b.lease(NORMALIZE, &["idempotent_write"]).await;
    let lease_refused = lease_without
        .as_ref()
        .err()
        .is_some_and(|e| e.contains("non_idempotent_write"));
    refusals.insert(
        "lease_without_conservative_effect".into(),
        json!(lease_refused),
    );
    let nothing_written = std::fs::read_dir(&b.layout.out)
        .map(|d| d.count() == 0)
        .unwrap_or(false);
    checks.push(CheckResult {
        name: "schema_lease_capability_effect_refusals",
        pass: all_refused && lease_refused && nothing_written,
        evidence: json!({"refused": refusals, "workerOutputsAfterRefusals": !nothing_written}),
    });

    // A caller-discarded acknowledgement, the router's store reopened on
    // the same provider session, and recovery by the same key and ID.
    let input = json!({"name": "  Ada Lovelace  ", "count": 3, "ok": true});
    let (args, identity) = worker_request("main", &input, "run-main", "none");
    let sub = b
        .submission(NORMALIZE, "main", &args, Duration::from_secs(300))
        .await?;
    let discarded = b.submit(&sub, &args).await.map_err(|e| e.message())?;
    let session_before = b.session();
    b.reopen().await.map_err(|e| e.to_string())?;
    let session_after = b.session();
    let recovered = b.submit(&sub, &args).await.map_err(|e| e.message())?;
    let done = b.wait(recovered.id.as_str()).await?;
    let by_id = b
        .router
        .get(discarded.id.as_str(), &b.caller, &b.owner)
        .await
        .map_err(|e| e.message())?;
    let runs: Vec<String> = std::fs::read_dir(&b.layout.out)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    let expected = Expected::for_input(identity.clone(), input.as_object().unwrap_or(&Map::new()));
    let verified = artifacts::check(&b.layout.out, "run-main", &expected);
    checks.push(CheckResult {
        name: "discarded_acknowledgement_recovered_after_router_reopen",
        pass: recovered.id == discarded.id
            && session_before.is_some()
            && session_before == session_after
            && done.status == TaskStatus::Completed
            && by_id.status == TaskStatus::Completed,
        evidence: json!({
            "publicTaskId": discarded.id.as_str(),
            "recoveredTaskId": recovered.id.as_str(),
            "sessionBeforeReopen": session_before,
            "sessionAfterReopen": session_after,
            "status": done.status.as_str(),
            "providerResult": result_text(&done),
        }),
    });
    checks.push(CheckResult {
        name: "one_observed_worker_effect_verified",
        pass: runs == ["run-main"] && verified.is_ok(),
        evidence: json!({
            "outputs": runs,
            "verifier": match &verified {
                Ok(e) => serde_json::to_value(e).unwrap_or_default(),
                Err(f) => json!({"finding": f.to_string()}),
            },
        }),
    });

    // The same key with changed input.
    let (changed, _) = worker_request("main", &json!({"name": "Grace Hopper"}), "run-main", "none");
    let mut changed_sub = sub.clone();
    changed_sub["inputDigest"] = json!(input_digest(changed.as_object().unwrap_or(&Map::new())));
    let conflict = b.submit(&changed_sub, &changed).await;
    checks.push(CheckResult {
        name: "changed_input_key_reuse_refused",
        pass: matches!(conflict, Err(RouteError::IdempotencyConflict)),
        evidence: json!({"answer": match &conflict { Ok(t) => json!(t.id.as_str()), Err(e) => json!(e.wire().name) }}),
    });

    // Exit zero, invalid output: the verifier rejects it.
    let (bad_args, bad_identity) = worker_request(
        "fault",
        &json!({"name": "Ada"}),
        "run-fault",
        "change-identity",
    );
    let bad_sub = b
        .submission(NORMALIZE, "fault", &bad_args, Duration::from_secs(300))
        .await?;
    let bad = b
        .submit(&bad_sub, &bad_args)
        .await
        .map_err(|e| e.message())?;
    let bad_done = b.wait(bad.id.as_str()).await?;
    let bad_check = artifacts::check(
        &b.layout.out,
        "run-fault",
        &Expected::for_input(
            bad_identity,
            &Map::from_iter([("name".to_string(), json!("Ada"))]),
        ),
    );
    checks.push(CheckResult {
        name: "exit_zero_invalid_output_rejected",
        pass: bad_done.status == TaskStatus::Completed
            && matches!(bad_check, Err(Finding::IdentityChanged { .. })),
        evidence: json!({
            "providerStatus": bad_done.status.as_str(),
            "verifier": bad_check.as_ref().err().map(|f| f.to_string()),
        }),
    });

    // Missing, truncated and swapped artifacts, on copies.
    let (other_args, _) = worker_request("other", &json!({"name": "Grace"}), "run-other", "none");
    let other_sub = b
        .submission(NORMALIZE, "other", &other_args, Duration::from_secs(300))
        .await?;
    let other = b
        .submit(&other_sub, &other_args)
        .await
        .map_err(|e| e.message())?;
    b.wait(other.id.as_str()).await?;
    let mut tamper = serde_json::Map::new();
    let mut tamper_ok = true;
    let cases: [(&str, &str); 3] = [
        ("missing", "missing"),
        ("truncated", "truncated"),
        ("swapped", "digest_mismatch"),
    ];
    for (case, want) in cases {
        let dir =
            copy_run(&b.layout, "run-main", case).map_err(|e| format!("copying a run: {e}"))?;
        let result = dir.join(super::RESULT_FILE);
        let change = match case {
            "missing" => std::fs::remove_file(&result),
            "truncated" => std::fs::read(&result)
                .and_then(|bytes| std::fs::write(&result, &bytes[..bytes.len() / 2])),
            _ => std::fs::read(b.layout.out.join("run-other").join(super::RESULT_FILE)).and_then(
                |other| {
                    // Another valid run's result, padded to the listed size so
                    // that only its content can tell.
                    let size = std::fs::metadata(&result)?.len() as usize;
                    let mut bytes = other;
                    bytes.resize(size, b' ');
                    std::fs::write(&result, bytes)
                },
            ),
        };
        change.map_err(|e| format!("altering a copy: {e}"))?;
        let got = match artifacts::check(&b.layout.scratch, case, &expected) {
            Ok(_) => "accepted".to_string(),
            Err(f) => finding_name(&f).to_string(),
        };
        tamper_ok &= got == want;
        tamper.insert(case.into(), json!(got));
        let _ = std::fs::remove_dir_all(&dir);
    }
    checks.push(CheckResult {
        name: "missing_truncated_swapped_artifacts_detected",
        pass: tamper_ok,
        evidence: Value::Object(tamper),
    });

    // Traversal and a symbolic link at the output: refused, nothing
    // written outside the root.
    let (escape_args, _) = worker_request("escape", &json!({"name": "x"}), "../outside", "none");
    let escape_sub = b
        .submission(NORMALIZE, "escape", &escape_args, Duration::from_secs(300))
        .await?;
    let escape = b
        .submit(&escape_sub, &escape_args)
        .await
        .map_err(|e| e.message())?;
    let escape_done = b.wait(escape.id.as_str()).await?;
    let link = b.layout.out.join("linked");
    std::os::unix::fs::symlink(&b.layout.outside, &link)
        .map_err(|e| format!("making a link: {e}"))?;
    let (link_args, _) = worker_request("link", &json!({"name": "x"}), "linked", "none");
    let link_sub = b
        .submission(NORMALIZE, "link", &link_args, Duration::from_secs(300))
        .await?;
    let linked = b
        .submit(&link_sub, &link_args)
        .await
        .map_err(|e| e.message())?;
    let link_done = b.wait(linked.id.as_str()).await?;
    let _ = std::fs::remove_file(&link);
    let outside_empty = std::fs::read_dir(&b.layout.outside)
        .map(|d| d.count() == 0)
        .unwrap_or(false);
    let is_error = |t: &TaskRecord| match &t.outcome {
        Some(crate::store::Outcome::Result(v)) => v["isError"] == true,
        Some(crate::store::Outcome::Error(_)) => true,
        None => false,
    };
    checks.push(CheckResult {
        name: "traversal_and_symlink_refused",
        pass: is_error(&escape_done) && is_error(&link_done) && outside_empty,
        evidence: json!({
            "traversal": result_text(&escape_done),
            "symlink": result_text(&link_done),
            "outsideTheRootEmpty": outside_empty,
        }),
    });

    // tasks/update is refused for a route.
    let update = b
        .router
        .update(recovered.id.as_str(), &b.caller, &b.owner)
        .await;
    checks.push(CheckResult {
        name: "update_unsupported",
        pass: matches!(update, Err(RouteError::UpdateUnsupported)),
        evidence: json!({"answer": update.err().map(|e| e.wire().name)}),
    });

    // A poll past the deadline cancels.
    let hold_args = json!({});
    let hold_sub = b
        .submission(HOLD, "deadline", &hold_args, Duration::from_millis(1500))
        .await?;
    let hold = b
        .submit(&hold_sub, &hold_args)
        .await
        .map_err(|e| e.message())?;
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let held = b.wait(hold.id.as_str()).await?;
    checks.push(CheckResult {
        name: "poll_driven_deadline_cancellation",
        pass: held.status == TaskStatus::Cancelled,
        evidence: json!({"status": held.status.as_str(), "message": held.status_message}),
    });

    // Cleanup of what the worker owns: only what the manifests list.
    let mut removed = Vec::new();
    let mut cleanup_ok = true;
    for run in ["run-main", "run-fault", "run-other"] {
        match artifacts::remove_owned(&b.layout.out, run) {
            Ok(r) => removed.push(serde_json::to_value(&r).unwrap_or_default()),
            Err(e) => {
                cleanup_ok = false;
                removed.push(json!({"output": run, "error": e.to_string()}));
            }
        }
    }
    let left: Vec<String> = std::fs::read_dir(&b.layout.out)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    checks.push(CheckResult {
        name: "owned_resources_cleaned_up",
        pass: cleanup_ok && left.is_empty(),
        evidence: json!({"removed": removed, "left": left}),
    });
    Ok(())
}
