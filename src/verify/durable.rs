//! `taskgate verify --durable-tasks`: qualifies the durable route on this
//! host, end to end, with nothing but the binary itself.
//!
//! The router is the real daemon, started as `serve` starts it
//! ([`crate::service::run`]: the configuration read and checked, the state
//! directory claimed, the store opened and recovered) on a loopback port of
//! its own, with static tokens configured and every request carrying one;
//! each check is a caller's MCP request over HTTP, so the scopes, the wire
//! codes and the task handles are the ones a client meets. Its upstream is
//! an embedded qualification provider: this binary serving MCP over stdio
//! (`serve --stdio`) as a Tasks-capable upstream, whose task tool starts the
//! bounded JSON worker (`qualification-worker`) as a separate child process
//! writing under a temporary permitted root. The tools are pinned as an
//! operator pins them (the pins file beside the configuration, read at the
//! next start).
//!
//! The router is stopped and started again while the provider's session
//! stays connected (the daemon is given the upstream connections, which
//! outlive it), so recovery by the same key and public ID is shown on the
//! exact session the task was dispatched on. What reached the provider is
//! counted twice, independently of the worker's outputs: by the provider's
//! own status (tasks created, tool runs started, over its admin socket) and
//! by a ledger every worker process appends to before it checks anything.
//! An independent verifier ([`super::artifacts`]) reads what the worker
//! left; the worker's exit status is read from the provider's result (a
//! non-zero exit is an `isError` result naming the status and the worker's
//! one-line refusal). Everything it made is removed before it reports.
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
use crate::client::{Client, ClientError};
use crate::config::Overrides;
use crate::exit::{Classify, ExitClass, Refusal};
use crate::store::Digest;
use crate::upstream::{Pins, Upstreams};

/// The provider's alias and its tools.
const ALIAS: &str = "qualification";
const NORMALIZE: &str = "qualification.normalize";
const HOLD: &str = "qualification.hold";
/// How long the provider has to connect, and a task to end.
const SETTLE: Duration = Duration::from_secs(60);
/// The declared runtime of the run that stalls past it.
const SHORT_RUNTIME_MS: u64 = 1000;
/// The most a worker may write (the route's artifact bound).
const MAX_ARTIFACT_BYTES: u64 = 8 * 1024 * 1024;
/// The most task input the route carries.
const MAX_INPUT_BYTES: usize = 64 * 1024;
/// The worker's exit statuses the checks expect: a refused request (64),
/// an unsafe path (77), a run its runtime ended (1).
const EXIT_USAGE: u8 = 64;
const EXIT_UNSAFE_PATH: u8 = 77;
const EXIT_CALL_FAILED: u8 = 1;

/// The scopes of the qualifying caller, and of the one without the
/// conservative effect's scope.
const FULL_SCOPES: &[&str] = &[
    "tools:call",
    "tasks:read",
    "tasks:cancel",
    crate::auth::SCOPE_EFFECT_IDEMPOTENT_WRITE,
    crate::auth::SCOPE_EFFECT_NON_IDEMPOTENT_WRITE,
];
const NARROW_SCOPES: &[&str] = &[
    "tools:call",
    "tasks:read",
    "tasks:cancel",
    crate::auth::SCOPE_EFFECT_IDEMPOTENT_WRITE,
];

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
    tokens: PathBuf,
    provider_dir: PathBuf,
    provider_config: PathBuf,
    provider_state: PathBuf,
    /// The provider's tools' working directory.
    provider_work: PathBuf,
    /// The worker's permitted output root.
    out: PathBuf,
    /// Where the worker's ledger is (writable by the worker).
    ledger_dir: PathBuf,
    ledger: PathBuf,
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
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|source| VerifyError::Scratch {
            path: path.to_path_buf(),
            source,
        })
}

fn toml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

fn toml_path(p: &Path) -> String {
    toml_str(&p.to_string_lossy())
}

/// The secrets of the two callers.
struct Secrets {
    qualifier: String,
    narrow: String,
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
            tokens: root.join("router").join("tokens.toml"),
            provider_dir: root.join("provider"),
            provider_config: root.join("provider").join("provider.toml"),
            provider_state: root.join("provider").join("state"),
            provider_work: root.join("provider").join("work"),
            out: root.join("out"),
            ledger_dir: root.join("ledger"),
            ledger: root.join("ledger").join("runs.jsonl"),
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
            l.ledger_dir.clone(),
            l.scratch.clone(),
            l.outside.clone(),
        ] {
            mkdir(&d)?;
        }
        Ok(l)
    }

    /// The provider: this binary's own task service, with the worker as a
    /// task tool confined to the output root (and its ledger), and a tool
    /// that only waits (for the deadline's cancel). The provider is
    /// confined as any stdio upstream (its directory readable, its state,
    /// its tools' working directory, the output root and the ledger
    /// writable), and confines its own tools inside that. Its tools run in
    /// a working directory of its own: the scratch directory a tool would
    /// get otherwise lies in the temporary directory, which the provider's
    /// confinement does not grant. The router: that upstream, static
    /// tokens, and a credential required of every request.
    fn write_configs(&self, exe: &Path, liar: Option<&str>) -> Result<Secrets, VerifyError> {
        let mut worker = vec![
            toml_path(exe),
            toml_str("qualification-worker"),
            toml_str("--root"),
            toml_path(&self.out),
            toml_str("--ledger"),
            toml_path(&self.ledger),
        ];
        if let Some(liar) = liar {
            worker.extend([toml_str("--liar"), toml_str(liar)]);
        }
        let provider = format!(
            "[tasks]\npoll_interval_ms = 200\n\n[[tool]]\nname = \"normalize\"\ndescription = \"Normalises a small JSON object and writes a result and manifest under the permitted root.\"\nargv = [{argv}]\nworking_dir = {work}\nwrite_paths = [{out}, {ledger}]\neffect = \"idempotent_write\"\ntask = \"required\"\ntimeout_secs = 30\n\n[[tool]]\nname = \"hold\"\ndescription = \"Waits until it is cancelled.\"\nargv = [\"/bin/sleep\", \"60\"]\nworking_dir = {work}\neffect = \"idempotent_write\"\ntask = \"required\"\ntimeout_secs = 120\n",
            argv = worker.join(", "),
            out = toml_path(&self.out),
            ledger = toml_path(&self.ledger_dir),
            work = toml_path(&self.provider_work),
        );
        write(&self.provider_config, &provider)?;
        let (qualifier, qualifier_entry) = token("qualifier", FULL_SCOPES)?;
        let (narrow, narrow_entry) = token("narrow", NARROW_SCOPES)?;
        write(&self.tokens, &format!("{qualifier_entry}\n{narrow_entry}"))?;
        let router = format!(
            "[log]\nfilter = \"warn\"\n\n[tasks]\npoll_interval_ms = 200\n\n[auth]\ntokens_file = {tokens}\nlocal_owner = \"never\"\n\n[[upstream]]\nalias = \"{ALIAS}\"\ncommand = [{exe}, \"serve\", \"--stdio\", \"--config\", {config}, \"--state-dir\", {state}]\nread_paths = [{dir}]\nwrite_paths = [{state}, {work}, {out}, {ledger}]\neffect = \"idempotent_write\"\nrequest_timeout_secs = 30\n",
            tokens = toml_path(&self.tokens),
            exe = toml_path(exe),
            config = toml_path(&self.provider_config),
            state = toml_path(&self.provider_state),
            dir = toml_path(&self.provider_dir),
            work = toml_path(&self.provider_work),
            out = toml_path(&self.out),
            ledger = toml_path(&self.ledger_dir),
        );
        write(&self.router_config, &router)?;
        Ok(Secrets { qualifier, narrow })
    }

    fn router_overrides(&self, listen: Option<String>) -> Overrides {
        Overrides {
            config_path: Some(self.router_config.clone()),
            state_dir: Some(self.router_state.clone()),
            listen,
        }
    }

    /// The worker processes the ledger holds for `correlation_id` (every
    /// process, with `None`).
    fn ledger_runs(&self, correlation_id: Option<&str>) -> usize {
        std::fs::read_to_string(&self.ledger)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|l| correlation_id.is_none_or(|c| l["correlationId"] == c))
            .count()
    }

    fn outputs(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.out)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }
}

/// A token as `taskgate token new` makes one: its secret and its entry.
fn token(id: &str, scopes: &[&str]) -> Result<(String, String), VerifyError> {
    crate::auth::tokens::new_token(&crate::auth::tokens::NewToken {
        id: id.into(),
        tenant: "qualification".into(),
        subject: format!("{id}@qualification"),
        scopes: scopes.iter().map(|s| s.to_string()).collect(),
        expires: None,
        issuer: None,
    })
    .map_err(|e| VerifyError::Setup(format!("a token: {e}")))
}

/// The router daemon, serving on its loopback port until stopped.
struct RouterDaemon {
    url: String,
    stop: CancellationToken,
    serving: tokio::task::JoinHandle<Result<(), Refusal>>,
}

impl RouterDaemon {
    /// Starts the daemon as `serve` does, on `upstreams` (which it leaves
    /// connected when it stops). Its listener is bound first, so a request
    /// sent now is answered once it serves.
    async fn start(layout: &Layout, upstreams: &Arc<Upstreams>) -> Result<Self, VerifyError> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| VerifyError::Setup(format!("a loopback listener: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| VerifyError::Setup(format!("a loopback listener: {e}")))?;
        let options = crate::service::Options {
            overrides: layout.router_overrides(Some(addr.to_string())),
            env: Some(Arc::new(qualification_env())),
            upstreams: Some(upstreams.clone()),
            ..Default::default()
        };
        let stop = CancellationToken::new();
        let until = stop.clone();
        let serving = tokio::spawn(crate::service::run(listener, options, async move {
            until.cancelled().await
        }));
        Ok(RouterDaemon {
            url: format!("http://{addr}/mcp"),
            stop,
            serving,
        })
    }

    /// Stops it in order, as SIGTERM would, and waits for its store to close.
    async fn stop(self) -> Result<(), VerifyError> {
        self.stop.cancel();
        match self.serving.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(refusal)) => Err(VerifyError::Setup(format!("the router: {refusal}"))),
            Err(e) => Err(VerifyError::Setup(format!("the router did not stop: {e}"))),
        }
    }

    /// Why it stopped serving, if it did (a refused start).
    async fn refusal(&mut self) -> Option<String> {
        if !self.serving.is_finished() {
            return None;
        }
        match (&mut self.serving).await {
            Ok(Ok(())) => Some("it stopped".into()),
            Ok(Err(refusal)) => Some(refusal.to_string()),
            Err(e) => Some(e.to_string()),
        }
    }
}

/// The environment the router's configuration is layered from: none of
/// the operator's `TASKGATE_*` variables, but the log filter they asked
/// for.
fn qualification_env() -> HashMap<String, String> {
    std::env::var(crate::config::ENV_LOG)
        .ok()
        .map(|filter| (crate::config::ENV_LOG.to_string(), filter))
        .into_iter()
        .collect()
}

/// What the provider counts of itself: tasks it holds and tool runs it
/// started, read over its admin socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
struct ProviderCounts {
    tasks: u64,
    runs: u64,
}

async fn provider_counts(layout: &Layout) -> Result<ProviderCounts, String> {
    let overrides = Overrides {
        config_path: Some(layout.provider_config.clone()),
        state_dir: Some(layout.provider_state.clone()),
        listen: None,
    };
    let state = layout.provider_state.clone();
    tokio::task::spawn_blocking(move || {
        // The socket the provider recorded, named: finding it through the
        // configuration would read the operator's `TASKGATE_*` variables.
        let recorded = crate::state_dir::recorded_admin(&state).map_err(|e| {
            format!(
                "the provider's admin socket is not recorded in {}: {e}",
                state.display()
            )
        })?;
        let socket = recorded
            .socket
            .unwrap_or_else(|| crate::admin::socket_path(&state));
        let target =
            crate::admin::client::locate(&overrides, Some(&socket)).map_err(|e| e.to_string())?;
        match crate::admin::client::ask(
            &target,
            &crate::admin::Request::Status,
            Some(Duration::from_secs(10)),
        )
        .map_err(|e| e.to_string())?
        {
            crate::admin::Answer::Status(s) => Ok(ProviderCounts {
                tasks: s.tasks.map(|t| t.retained).unwrap_or(0),
                runs: s.runs_started,
            }),
            _ => Err("the provider answered something else than its status".to_string()),
        }
    })
    .await
    .map_err(|e| e.to_string())?
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The wire name of a refusal (`TG_…`), from a JSON-RPC error or the body
/// of an HTTP refusal; the error itself otherwise.
fn wire_name(e: &ClientError) -> String {
    let from = |error: &Value| error["data"]["name"].as_str().map(str::to_string);
    match e {
        ClientError::Rpc { error, .. } => from(error),
        ClientError::Status { body, .. } => serde_json::from_str::<Value>(body)
            .ok()
            .and_then(|v| from(&v["error"])),
        _ => None,
    }
    .unwrap_or_else(|| e.to_string())
}

/// The rule a refused submission broke (`data.check`).
fn refused_check(r: &Result<Value, ClientError>) -> String {
    match r {
        Err(ClientError::Rpc { error, .. }) if error["data"]["check"].is_string() => error["data"]
            ["check"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        Err(e) => format!("other: {}", wire_name(e)),
        Ok(t) => format!("accepted as {}", task_id(t)),
    }
}

fn task_id(handle: &Value) -> String {
    handle["task"]["taskId"]
        .as_str()
        .or(handle["taskId"].as_str())
        .unwrap_or_default()
        .to_string()
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

/// The worker's run as the provider reported it: how it exited and what
/// it said.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
struct WorkerExit {
    /// The task's status at the router.
    status: String,
    /// 0 for a result without `isError`; otherwise the status the provider
    /// named ("… exited with status N: …"), if it named one.
    exit_status: Option<u8>,
    /// The worker's line (exit 0) or its one-line refusal.
    said: String,
    /// The worker's line as JSON, on exit 0.
    line: Value,
}

impl WorkerExit {
    fn of(task: &Value) -> WorkerExit {
        let result = &task["result"];
        let text = result["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let exit_status = if task["status"] == "completed" && result["isError"] != true {
            Some(0)
        } else {
            text.split_once("exited with status ")
                .and_then(|(_, rest)| rest.split(':').next())
                .and_then(|n| n.trim().parse().ok())
        };
        let said = if text.is_empty() {
            task["error"].to_string()
        } else {
            text
        };
        WorkerExit {
            status: task["status"].as_str().unwrap_or_default().to_string(),
            exit_status,
            said,
            line: result["structuredContent"].clone(),
        }
    }

    /// The worker exited 0 and printed its line.
    fn succeeded(&self) -> bool {
        self.status == "completed" && self.exit_status == Some(0) && self.line.is_object()
    }

    /// The worker itself refused with `status`, saying `says`.
    fn refused(&self, status: u8, says: &str) -> bool {
        self.status == "completed" && self.exit_status == Some(status) && self.said.contains(says)
    }
}

/// The router as a caller meets it over HTTP, and what it runs on.
struct Bench {
    daemon: Option<RouterDaemon>,
    upstreams: Arc<Upstreams>,
    layout: Layout,
    secrets: Secrets,
    client: Client,
    narrow: Client,
}

impl Bench {
    fn clients(url: &str, secrets: &Secrets) -> Result<(Client, Client), VerifyError> {
        let make = |secret: &str| {
            Client::new(url, true)
                .map(|c| c.with_token(Some(secret.to_string())).with_busy_retries(3))
                .map_err(|e| VerifyError::Setup(format!("a client: {e}")))
        };
        Ok((make(&secrets.qualifier)?, make(&secrets.narrow)?))
    }

    async fn call(&self, tool: &str, args: Value) -> Result<Value, ClientError> {
        self.client.call_tool(tool, args, None).await
    }

    async fn describe(&self) -> Result<Value, String> {
        self.call(crate::route::DESCRIBE_TOOL, json!({}))
            .await
            .map(|r| r["structuredContent"].clone())
            .map_err(|e| e.to_string())
    }

    async fn capability(&self, name: &str) -> Result<Value, String> {
        let d = self.describe().await?;
        d["capabilities"]
            .as_array()
            .and_then(|a| a.iter().find(|c| c["name"] == name).cloned())
            .ok_or_else(|| format!("{name} is not routable: {d}"))
    }

    async fn lease_as(
        &self,
        client: &Client,
        name: &str,
        effects: &[&str],
    ) -> Result<Value, String> {
        client
            .call_tool(
                crate::route::LEASE_TOOL,
                json!({"capabilities": [name], "effects": effects}),
                None,
            )
            .await
            .map(|r| r["structuredContent"].clone())
            .map_err(|e| e.to_string())
    }

    /// A valid submission of `arguments` to `name` under `key`, leased by
    /// `client`, declaring `limits`.
    async fn submission_as(
        &self,
        client: &Client,
        name: &str,
        key: &str,
        arguments: &Value,
        deadline: Duration,
        limits: Value,
    ) -> Result<Value, String> {
        let cap = self.capability(name).await?;
        let lease = self
            .lease_as(
                client,
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
            "limits": limits,
            "permittedEffect": "non_idempotent_write",
            "cleanupRequired": true,
        }))
    }

    async fn submission(
        &self,
        name: &str,
        key: &str,
        arguments: &Value,
        deadline: Duration,
    ) -> Result<Value, String> {
        self.submission_as(
            &self.client,
            name,
            key,
            arguments,
            deadline,
            default_limits(),
        )
        .await
    }

    async fn submit_as(
        &self,
        client: &Client,
        submission: &Value,
        arguments: &Value,
    ) -> Result<Value, ClientError> {
        client
            .call_tool(
                crate::route::SUBMIT_TOOL,
                json!({"submission": submission, "arguments": arguments}),
                None,
            )
            .await
    }

    async fn submit(&self, submission: &Value, arguments: &Value) -> Result<Value, ClientError> {
        self.submit_as(&self.client, submission, arguments).await
    }

    /// Submits and returns the public task ID.
    async fn submit_id(&self, submission: &Value, arguments: &Value) -> Result<String, String> {
        let handle = self
            .submit(submission, arguments)
            .await
            .map_err(|e| e.to_string())?;
        match task_id(&handle) {
            id if id.is_empty() => Err(format!("not a task handle: {handle}")),
            id => Ok(id),
        }
    }

    /// Polls until terminal, at the interval the router asks for.
    async fn wait(&self, id: &str) -> Result<Value, String> {
        let start = Instant::now();
        loop {
            let t = self.client.get_task(id).await.map_err(|e| e.to_string())?;
            if matches!(
                t["status"].as_str(),
                Some("completed" | "failed" | "cancelled")
            ) {
                return Ok(t);
            }
            if start.elapsed() > SETTLE {
                return Err(format!("{id} did not end within {} s", SETTLE.as_secs()));
            }
            let ms = t["pollIntervalMs"].as_u64().unwrap_or(200).clamp(10, 1000);
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    }

    /// The router stopped and started again on the same upstream
    /// connections: a new daemon, the same store file, the same session.
    async fn restart_router(&mut self) -> Result<(), VerifyError> {
        if let Some(d) = self.daemon.take() {
            d.stop().await?;
        }
        let d = RouterDaemon::start(&self.layout, &self.upstreams).await?;
        let (client, narrow) = Bench::clients(&d.url, &self.secrets)?;
        self.client = client;
        self.narrow = narrow;
        self.daemon = Some(d);
        self.until_routable().await
    }

    /// Waits until the router serves and routes the provider's tools.
    async fn until_routable(&mut self) -> Result<(), VerifyError> {
        let start = Instant::now();
        loop {
            let last = match self.capability(NORMALIZE).await {
                Ok(_) => return Ok(()),
                Err(e) => e,
            };
            if let Some(d) = self.daemon.as_mut()
                && let Some(why) = d.refusal().await
            {
                return Err(VerifyError::Setup(format!(
                    "the router did not start: {why}"
                )));
            }
            if start.elapsed() > SETTLE {
                return Err(VerifyError::Setup(format!(
                    "the router did not route the provider's tools within {} s: {last}",
                    SETTLE.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn session(&self) -> Option<String> {
        self.upstreams
            .status(false)
            .into_iter()
            .find(|u| u.alias == ALIAS)
            .and_then(|u| u.session)
    }
}

/// The limits a submission declares, unless a check needs others.
fn default_limits() -> Value {
    json!({"runtimeMs": 30_000, "artifactBytes": 65_536, "outputBytes": 65_536})
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
    drop(runtime);
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
    let liar = crate::testhooks::lying_worker();
    let secrets = layout.write_configs(&exe, liar.as_deref())?;
    // The upstream connections outlive each router daemon; they stop here.
    let stop = CancellationToken::new();
    let upstreams = Upstreams::new(Vec::new(), stop.clone());
    let first = RouterDaemon::start(&layout, &upstreams).await?;
    let (client, narrow) = Bench::clients(&first.url, &secrets)?;
    let mut bench = Bench {
        daemon: Some(first),
        upstreams: upstreams.clone(),
        layout,
        secrets,
        client,
        narrow,
    };
    let mut checks = Vec::new();
    let result = match connect_and_pin(&mut bench, &mut checks).await {
        Ok(()) => scenarios(&mut bench, &mut checks).await,
        Err(e) => Err(e.to_string()),
    };
    if let Some(d) = bench.daemon.take()
        && let Err(e) = d.stop().await
    {
        checks.push(CheckResult {
            name: "router_stopped_cleanly",
            pass: false,
            evidence: json!({"error": e.to_string()}),
        });
    }
    upstreams.stop_all().await;
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

/// The provider connects through the first router; its tools are pinned
/// as an operator pins them (the pins file beside the configuration), and
/// the router started again reads them, on the same connection.
async fn connect_and_pin(b: &mut Bench, checks: &mut Vec<CheckResult>) -> Result<(), VerifyError> {
    let start = Instant::now();
    let status = loop {
        if let Some(u) = b
            .upstreams
            .status(true)
            .into_iter()
            .find(|u| u.alias == ALIAS && u.state == "ready")
        {
            break u;
        }
        if let Some(d) = b.daemon.as_mut()
            && let Some(why) = d.refusal().await
        {
            return Err(VerifyError::Setup(format!(
                "the router did not start: {why}"
            )));
        }
        if start.elapsed() > SETTLE {
            let last = b
                .upstreams
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
    pins.write(&crate::config::pins_file(&b.layout.router_config))
        .map_err(|e| VerifyError::Setup(format!("the pins file: {e}")))?;
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
    b.restart_router().await
}

fn check(checks: &mut Vec<CheckResult>, name: &'static str, pass: bool, evidence: Value) {
    checks.push(CheckResult {
        name,
        pass,
        evidence,
    });
}

async fn scenarios(b: &mut Bench, checks: &mut Vec<CheckResult>) -> Result<(), String> {
    let counts_at_start = provider_counts(&b.layout).await;

    // Describe and lease.
    let cap = b.capability(NORMALIZE).await?;
    check(
        checks,
        "describe",
        cap["schemaDigest"]
            .as_str()
            .is_some_and(|d| d.starts_with("sha256:"))
            && cap["taskCeiling"] == "non_idempotent_write",
        cap.clone(),
    );
    let lease = b
        .lease_as(
            &b.client,
            NORMALIZE,
            &["idempotent_write", "non_idempotent_write"],
        )
        .await?;
    let expires = lease["expiresAtUnixMs"].as_i64().unwrap_or(0);
    check(
        checks,
        "lease_absolute_expiry",
        expires > now_ms() && lease["leaseId"].is_string(),
        lease.clone(),
    );

    refusals(b, checks).await?;
    scopes(b, checks).await?;

    // A caller-discarded acknowledgement, the router stopped and started
    // again on the same provider session, and recovery by the same key
    // and ID. What reached the provider is counted around it.
    let before = provider_counts(&b.layout).await;
    let input = json!({"name": "  Ada Lovelace  ", "count": 3, "ok": true});
    let (args, identity) = worker_request("main", &input, "run-main", "none");
    let sub = b
        .submission(NORMALIZE, "main", &args, Duration::from_secs(300))
        .await?;
    let discarded = b.submit_id(&sub, &args).await?;
    let session_before = b.session();
    b.restart_router().await.map_err(|e| e.to_string())?;
    let session_after = b.session();
    let recovered = b.submit_id(&sub, &args).await?;
    let done = b.wait(&recovered).await?;
    let by_id = b.wait(&discarded).await?;
    let after = provider_counts(&b.layout).await;
    let main_runs = b.layout.ledger_runs(Some("qualification-main"));
    let outputs = b.layout.outputs();
    let expected = Expected::for_input(identity.clone(), input.as_object().unwrap_or(&Map::new()));
    let verified = artifacts::check(&b.layout.out, "run-main", &expected);
    let worker = WorkerExit::of(&done);
    check(
        checks,
        "discarded_acknowledgement_recovered_after_router_reopen",
        recovered == discarded
            && session_before.is_some()
            && session_before == session_after
            && done["status"] == "completed"
            && by_id["status"] == "completed",
        json!({
            "publicTaskId": discarded,
            "recoveredTaskId": recovered,
            "sessionBeforeReopen": session_before,
            "sessionAfterReopen": session_after,
            "status": done["status"],
            "providerResult": done["result"],
        }),
    );
    let received = match (&before, &after) {
        (Ok(b), Ok(a)) => Some((
            a.tasks.saturating_sub(b.tasks),
            a.runs.saturating_sub(b.runs),
        )),
        _ => None,
    };
    let digest_agrees = verified
        .as_ref()
        .is_ok_and(|e| worker.line["resultDigest"] == e.result_digest.as_str());
    check(
        checks,
        "one_observed_worker_effect_verified",
        received == Some((1, 1))
            && main_runs == 1
            && worker.succeeded()
            && digest_agrees
            && outputs == ["run-main"]
            && verified.is_ok(),
        json!({
            "providerTasksCreated": received.map(|r| r.0),
            "providerToolRunsStarted": received.map(|r| r.1),
            "providerCounts": {"before": counts_json(&before), "after": counts_json(&after)},
            "workerProcessesInLedger": main_runs,
            "worker": worker,
            "outputs": outputs,
            "verifier": match &verified {
                Ok(e) => serde_json::to_value(e).unwrap_or_default(),
                Err(f) => json!({"finding": f.to_string()}),
            },
        }),
    );

    // The same key with changed input.
    let (changed, _) = worker_request("main", &json!({"name": "Grace Hopper"}), "run-main", "none");
    let mut changed_sub = sub.clone();
    changed_sub["inputDigest"] = json!(input_digest(changed.as_object().unwrap_or(&Map::new())));
    let conflict = b.submit(&changed_sub, &changed).await;
    let conflict_name = match &conflict {
        Ok(t) => format!("accepted as {}", task_id(t)),
        Err(e) => wire_name(e),
    };
    check(
        checks,
        "changed_input_key_reuse_refused",
        conflict_name == crate::wire::IDEMPOTENCY_CONFLICT.name,
        json!({"answer": conflict_name}),
    );

    exit_zero_invalid_output(b, checks).await?;
    tampering(b, checks, &expected).await?;

    // The deadline's cancel is due while the bounds are checked.
    let hold_args = json!({});
    let hold_sub = b
        .submission(HOLD, "deadline", &hold_args, Duration::from_millis(1500))
        .await?;
    let hold = b.submit_id(&hold_sub, &hold_args).await?;
    let hold_due = Instant::now() + Duration::from_millis(1500);

    bounds(b, checks).await?;
    traversal_and_symlink(b, checks).await?;

    // tasks/update is refused for a route, on the wire.
    let update = b
        .client
        .request(
            "tasks/update",
            json!({"taskId": recovered, "inputResponses": {}}),
            Some(&recovered),
            None,
        )
        .await;
    let update_name = match &update {
        Ok(v) => format!("answered {v}"),
        Err(e) => wire_name(e),
    };
    check(
        checks,
        "update_unsupported",
        update_name == crate::wire::UPDATE_UNSUPPORTED_DURABLE.name,
        json!({"answer": update_name}),
    );

    // A poll past the deadline cancels.
    tokio::time::sleep_until(tokio::time::Instant::from_std(hold_due)).await;
    let held = b.wait(&hold).await?;
    check(
        checks,
        "poll_driven_deadline_cancellation",
        held["status"] == "cancelled",
        json!({"status": held["status"], "message": held["statusMessage"]}),
    );

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
    let left = b.layout.outputs();
    check(
        checks,
        "owned_resources_cleaned_up",
        cleanup_ok && left.is_empty(),
        json!({"removed": removed, "left": left}),
    );
    // Every worker process is one the provider started for a call it
    // received: nothing ran that was not asked for.
    let at_end = provider_counts(&b.layout).await;
    let processes = b.layout.ledger_runs(None);
    let runs = match (&counts_at_start, &at_end) {
        (Ok(s), Ok(e)) => Some(e.runs.saturating_sub(s.runs)),
        _ => None,
    };
    check(
        checks,
        "every_worker_run_was_received",
        // The hold tool's run is the provider's, not a worker's.
        runs.is_some_and(|r| r == processes as u64 + 1),
        json!({
            "providerToolRunsStarted": runs,
            "workerProcessesInLedger": processes,
            "providerCounts": {"atStart": counts_json(&counts_at_start), "atEnd": counts_json(&at_end)},
        }),
    );
    Ok(())
}

fn counts_json(c: &Result<ProviderCounts, String>) -> Value {
    match c {
        Ok(c) => serde_json::to_value(c).unwrap_or_default(),
        Err(e) => json!({"error": e}),
    }
}

/// Schema, lease, capability, interface, effect and bound refusals:
/// nothing is stored, and nothing reaches the provider.
async fn refusals(b: &Bench, checks: &mut Vec<CheckResult>) -> Result<(), String> {
    let before = provider_counts(&b.layout).await;
    let (good_args, _) = worker_request("refusal", &json!({"name": "x"}), "refusal", "none");
    let good = b
        .submission(NORMALIZE, "refusal", &good_args, Duration::from_secs(300))
        .await?;
    let with = |k: &str, v: Value| {
        let mut s = good.clone();
        s[k] = v;
        s
    };
    let mut refused = Map::new();
    let mut all_refused = true;
    for (case, sub, args, want) in [
        (
            "schema",
            with("schema", json!("taskgate.task-submission/0")),
            good_args.clone(),
            "schema",
        ),
        (
            "lease",
            with("leaseId", json!("tgl-unknown")),
            good_args.clone(),
            "lease",
        ),
        (
            "capability",
            with("capability", json!("qualification.absent")),
            good_args.clone(),
            "capability",
        ),
        (
            "provider_interface",
            with("providerInterfaceVersion", json!("sha256:0")),
            good_args.clone(),
            "provider_interface",
        ),
        (
            "effect",
            with("permittedEffect", json!("idempotent_write")),
            good_args.clone(),
            "effect",
        ),
        (
            "bounds",
            with("attempt", json!(2)),
            good_args.clone(),
            "bounds",
        ),
        (
            "declared_artifacts_over_8_mib",
            with(
                "limits",
                json!({"runtimeMs": 30_000, "artifactBytes": MAX_ARTIFACT_BYTES + 1, "outputBytes": 65_536}),
            ),
            good_args.clone(),
            "bounds",
        ),
        (
            "input_digest",
            good.clone(),
            json!({"identity": good_args["identity"], "input": {"name": "y"}, "output": "refusal", "fault": "none"}),
            "input_digest",
        ),
    ] {
        let got = refused_check(&b.submit(&sub, &args).await);
        all_refused &= got == want;
        refused.insert(case.into(), json!(got));
    }
    let lease_without = b
        .lease_as(&b.client, NORMALIZE, &["idempotent_write"])
        .await;
    let lease_refused = lease_without
        .as_ref()
        .err()
        .is_some_and(|e| e.contains("non_idempotent_write"));
    refused.insert(
        "lease_without_conservative_effect".into(),
        json!(lease_refused),
    );
    let after = provider_counts(&b.layout).await;
    let nothing_received = before.is_ok() && before == after;
    let nothing_written = b.layout.outputs().is_empty() && b.layout.ledger_runs(None) == 0;
    check(
        checks,
        "schema_lease_capability_effect_refusals",
        all_refused && lease_refused && nothing_written && nothing_received,
        json!({
            "refused": refused,
            "providerCounts": {"before": counts_json(&before), "after": counts_json(&after)},
            "workerRuns": b.layout.ledger_runs(None),
        }),
    );
    Ok(())
}

/// The effect scopes and the credential, as the HTTP path enforces them:
/// a request without a token is refused; a token without the conservative
/// effect's scope cannot submit; another caller's task reads as unknown.
async fn scopes(b: &Bench, checks: &mut Vec<CheckResult>) -> Result<(), String> {
    let before = provider_counts(&b.layout).await;
    let url = b.daemon.as_ref().map(|d| d.url.clone()).unwrap_or_default();
    let anonymous = Client::new(&url, true).map_err(|e| e.to_string())?;
    let tokenless = match anonymous
        .call_tool(crate::route::DESCRIBE_TOOL, json!({}), None)
        .await
    {
        Ok(_) => "answered".to_string(),
        Err(e) => wire_name(&e),
    };
    let (args, _) = worker_request("narrow", &json!({"name": "x"}), "narrow", "none");
    let sub = b
        .submission_as(
            &b.narrow,
            NORMALIZE,
            "narrow",
            &args,
            Duration::from_secs(300),
            default_limits(),
        )
        .await?;
    let forbidden = b.submit_as(&b.narrow, &sub, &args).await;
    let missing = match &forbidden {
        Err(ClientError::Rpc { error, .. }) => error["data"]["missingScopes"].clone(),
        Err(ClientError::Status { body, .. }) => serde_json::from_str::<Value>(body)
            .map(|v| v["error"]["data"]["missingScopes"].clone())
            .unwrap_or_default(),
        Ok(_) => Value::Null,
        Err(_) => Value::Null,
    };
    let forbidden_name = match &forbidden {
        Ok(t) => format!("accepted as {}", task_id(t)),
        Err(e) => wire_name(e),
    };
    // The qualifier's own refusal case is a task of its own: the narrow
    // caller must not see it.
    let (own_args, _) = worker_request("own", &json!({"name": "own"}), "own", "escape");
    let own_sub = b
        .submission(NORMALIZE, "own", &own_args, Duration::from_secs(300))
        .await?;
    let own = b.submit_id(&own_sub, &own_args).await?;
    let own_done = b.wait(&own).await?;
    let foreign = match b.narrow.get_task(&own).await {
        Ok(t) => format!("answered {}", t["status"]),
        Err(e) => wire_name(&e),
    };
    let after = provider_counts(&b.layout).await;
    let received = match (&before, &after) {
        (Ok(b), Ok(a)) => Some(a.tasks.saturating_sub(b.tasks)),
        _ => None,
    };
    check(
        checks,
        "effect_scopes_enforced_over_http",
        tokenless == crate::wire::UNAUTHENTICATED.name
            && forbidden_name == crate::wire::FORBIDDEN.name
            && missing == json!([crate::auth::SCOPE_EFFECT_NON_IDEMPOTENT_WRITE])
            && foreign == crate::wire::UNKNOWN_TASK.name
            && own_done["status"] == "completed"
            // Only the qualifier's own task reached the provider.
            && received == Some(1),
        json!({
            "withoutToken": tokenless,
            "withoutNonIdempotentWriteScope": forbidden_name,
            "missingScopes": missing,
            "anotherCallersTask": foreign,
            "providerTasksCreated": received,
        }),
    );
    Ok(())
}

/// A worker that exits 0 but changed a bound identity in its output: the
/// provider reports success, the verifier rejects the output.
async fn exit_zero_invalid_output(b: &Bench, checks: &mut Vec<CheckResult>) -> Result<(), String> {
    let (bad_args, bad_identity) = worker_request(
        "fault",
        &json!({"name": "Ada"}),
        "run-fault",
        "change-identity",
    );
    let bad_sub = b
        .submission(NORMALIZE, "fault", &bad_args, Duration::from_secs(300))
        .await?;
    let bad = b.submit_id(&bad_sub, &bad_args).await?;
    let bad_done = b.wait(&bad).await?;
    let worker = WorkerExit::of(&bad_done);
    let bad_check = artifacts::check(
        &b.layout.out,
        "run-fault",
        &Expected::for_input(
            bad_identity,
            &Map::from_iter([("name".to_string(), json!("Ada"))]),
        ),
    );
    check(
        checks,
        "exit_zero_invalid_output_rejected",
        worker.succeeded() && matches!(bad_check, Err(Finding::IdentityChanged { .. })),
        json!({
            "worker": worker,
            "verifier": bad_check.as_ref().err().map(|f| f.to_string()),
        }),
    );
    Ok(())
}

/// Missing, truncated and swapped artifacts, on copies of real runs.
async fn tampering(
    b: &Bench,
    checks: &mut Vec<CheckResult>,
    expected: &Expected,
) -> Result<(), String> {
    let (other_args, _) = worker_request("other", &json!({"name": "Grace"}), "run-other", "none");
    let other_sub = b
        .submission(NORMALIZE, "other", &other_args, Duration::from_secs(300))
        .await?;
    let other = b.submit_id(&other_sub, &other_args).await?;
    b.wait(&other).await?;
    let mut tamper = Map::new();
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
        let got = match artifacts::check(&b.layout.scratch, case, expected) {
            Ok(_) => "accepted".to_string(),
            Err(f) => finding_name(&f).to_string(),
        };
        tamper_ok &= got == want;
        tamper.insert(case.into(), json!(got));
        let _ = std::fs::remove_dir_all(&dir);
    }
    check(
        checks,
        "missing_truncated_swapped_artifacts_detected",
        tamper_ok,
        Value::Object(tamper),
    );
    Ok(())
}

/// Bounded execution and artifacts: an input over 64 KiB is refused by
/// the router before anything is sent; a run that would write more than
/// 8 MiB is refused by the worker before it writes; a run past its
/// declared runtime is ended by the worker. Each with its named error.
async fn bounds(b: &Bench, checks: &mut Vec<CheckResult>) -> Result<(), String> {
    // Over 64 KiB of input.
    let before = provider_counts(&b.layout).await;
    let runs_before = b.layout.ledger_runs(None);
    let (big_args, _) = worker_request(
        "big-input",
        &json!({"name": "x".repeat(MAX_INPUT_BYTES + 1)}),
        "run-big-input",
        "none",
    );
    let big_sub = b
        .submission(NORMALIZE, "big-input", &big_args, Duration::from_secs(300))
        .await?;
    let big = b.submit(&big_sub, &big_args).await;
    let big_answer = match &big {
        Err(ClientError::Rpc { error, .. }) => json!({
            "name": error["data"]["name"],
            "check": error["data"]["check"],
            "message": error["message"],
        }),
        Err(e) => json!({"other": e.to_string()}),
        Ok(t) => json!({"accepted": task_id(t)}),
    };
    let after = provider_counts(&b.layout).await;
    check(
        checks,
        "input_over_64_kib_refused",
        big_answer["check"] == "bounds"
            && big_answer["message"]
                .as_str()
                .is_some_and(|m| m.contains("at most 65536"))
            && before.is_ok()
            && before == after
            && b.layout.ledger_runs(None) == runs_before,
        json!({
            "answer": big_answer,
            "providerCounts": {"before": counts_json(&before), "after": counts_json(&after)},
        }),
    );

    // Over 8 MiB of output, and past the declared runtime: both run at once.
    let mut fill_args = worker_request(
        "big-output",
        &json!({"name": "x"}),
        "run-big-output",
        "none",
    )
    .0;
    fill_args["limits"] = json!({"runtimeMs": 30_000, "artifactBytes": MAX_ARTIFACT_BYTES});
    fill_args["fill"] = json!(MAX_ARTIFACT_BYTES);
    let fill_sub = b
        .submission_as(
            &b.client,
            NORMALIZE,
            "big-output",
            &fill_args,
            Duration::from_secs(300),
            json!({"runtimeMs": 30_000, "artifactBytes": MAX_ARTIFACT_BYTES, "outputBytes": 65_536}),
        )
        .await?;
    let mut stall_args = worker_request("stall", &json!({"name": "x"}), "run-stall", "stall").0;
    stall_args["limits"] = json!({"runtimeMs": SHORT_RUNTIME_MS, "artifactBytes": 65_536});
    let stall_sub = b
        .submission_as(
            &b.client,
            NORMALIZE,
            "stall",
            &stall_args,
            Duration::from_secs(300),
            json!({"runtimeMs": SHORT_RUNTIME_MS, "artifactBytes": 65_536, "outputBytes": 65_536}),
        )
        .await?;
    let fill = b.submit_id(&fill_sub, &fill_args).await?;
    let stall = b.submit_id(&stall_sub, &stall_args).await?;
    let fill_done = WorkerExit::of(&b.wait(&fill).await?);
    let stall_done = WorkerExit::of(&b.wait(&stall).await?);
    let outputs = b.layout.outputs();
    let written = |name: &str| outputs.iter().any(|o| o == name);
    check(
        checks,
        "output_over_8_mib_refused",
        fill_done.refused(EXIT_USAGE, "more than its bound of 8388608")
            && b.layout.ledger_runs(Some("qualification-big-output")) == 1
            && !written("run-big-output"),
        json!({"worker": fill_done, "outputWritten": written("run-big-output")}),
    );
    check(
        checks,
        "run_past_declared_runtime_ended",
        stall_done.refused(
            EXIT_CALL_FAILED,
            &format!("passed its declared runtime of {SHORT_RUNTIME_MS} ms"),
        ) && b.layout.ledger_runs(Some("qualification-stall")) == 1
            && !written("run-stall"),
        json!({"worker": stall_done, "outputWritten": written("run-stall")}),
    );
    Ok(())
}

/// Traversal and a symbolic link at the output: the worker's own
/// refusals (its exit status and its words, not a denial by the sandbox),
/// and nothing written outside the root.
async fn traversal_and_symlink(b: &Bench, checks: &mut Vec<CheckResult>) -> Result<(), String> {
    let (escape_args, _) = worker_request("escape", &json!({"name": "x"}), "../outside", "none");
    let escape_sub = b
        .submission(NORMALIZE, "escape", &escape_args, Duration::from_secs(300))
        .await?;
    let link = b.layout.out.join("linked");
    std::os::unix::fs::symlink(&b.layout.outside, &link)
        .map_err(|e| format!("making a link: {e}"))?;
    let (link_args, _) = worker_request("link", &json!({"name": "x"}), "linked", "none");
    let link_sub = b
        .submission(NORMALIZE, "link", &link_args, Duration::from_secs(300))
        .await?;
    let escape = b.submit_id(&escape_sub, &escape_args).await?;
    let linked = b.submit_id(&link_sub, &link_args).await?;
    let escape_done = WorkerExit::of(&b.wait(&escape).await?);
    let link_done = WorkerExit::of(&b.wait(&linked).await?);
    let _ = std::fs::remove_file(&link);
    let outside_empty = std::fs::read_dir(&b.layout.outside)
        .map(|d| d.count() == 0)
        .unwrap_or(false);
    check(
        checks,
        "traversal_and_symlink_refused",
        escape_done.refused(EXIT_UNSAFE_PATH, "refused as traversal")
            && link_done.refused(EXIT_UNSAFE_PATH, "a symbolic link; refused, not followed")
            && outside_empty,
        json!({
            "traversal": escape_done,
            "symlink": link_done,
            "outsideTheRootEmpty": outside_empty,
        }),
    );
    Ok(())
}
