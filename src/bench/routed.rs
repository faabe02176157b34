//! The routed-submit phase: what a durable submission to an upstream's
//! task costs. One more daemon, configured as the first plus one
//! `[[upstream]]`: this binary serving the benchmark's no-op tool over
//! stdio (`serve --stdio --bench-tool`), confined as any stdio upstream. Its
//! tool is pinned (`taskgate upstream pin`, then `taskgate reload`, as an
//! operator does), leased once, and submitted with `taskgate_submit` under a
//! fresh idempotency key each time: one at a time, then at the run's
//! concurrency. Each submission commits its route three times (prepared,
//! dispatching, routed) and waits for the upstream to create its own task.
//! One route is then polled until the upstream's task has completed, so the
//! phase is known to have routed work rather than refusals.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

use super::report::{PhaseFigures, RoutedCost};
use super::{Progress, Sizing, bench_client, concurrent, cpu_ns, private_dir, start_daemon};
use crate::client::{Client, ClientError};
use crate::route::{DESCRIBE_TOOL, LEASE_TOOL, SUBMISSION_SCHEMA, SUBMIT_TOOL, input_digest};
use crate::tools::builtin::BENCH_TOOL;

/// The upstream's alias in the routing daemon's configuration.
const ALIAS: &str = "up";
/// Submissions one at a time. With those at the run's concurrency they stay
/// under the routes one caller may hold at once (256): the benchmark is one
/// caller.
pub const SERIAL_SUBMITS: usize = 60;
pub const CONCURRENT_SUBMITS: usize = 180;
/// How long the upstream may take to connect, and the pin to apply.
const READY_WITHIN: Duration = Duration::from_secs(30);

fn quoted(p: &Path) -> String {
    toml::Value::String(p.to_string_lossy().into_owned()).to_string()
}

/// The routing daemon's configuration: `base` plus the upstream.
fn config(base: &str, exe: &Path, provider: &Path) -> String {
    format!(
        "{base}\n[[upstream]]\nalias = \"{ALIAS}\"\ncommand = [{exe}, \"serve\", \"--stdio\", \"--bench-tool\", \"--config\", {config}, \"--state-dir\", {state}]\nread_paths = [{dir}]\nwrite_paths = [{state}]\neffect = \"idempotent_write\"\nrequest_timeout_secs = 30\n",
        exe = quoted(exe),
        config = quoted(&provider.join("provider.toml")),
        state = quoted(&provider.join("state")),
        dir = quoted(provider),
    )
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Runs `taskgate ARGS --config CONFIG --state-dir STATE` and says why it
/// failed, if it did.
fn operator(args: &[&str], config: &Path, state: &Path) -> Result<(), String> {
    let out = Command::new("/proc/self/exe")
        .args(args)
        .arg("--config")
        .arg(config)
        .arg("--state-dir")
        .arg(state)
        .output()
        .map_err(|e| format!("taskgate {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "taskgate {} exited {}: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Lists tools until one named `name` appears.
async fn wait_for_tool(client: &Client, name: &str) -> Result<(), String> {
    let deadline = Instant::now() + READY_WITHIN;
    loop {
        let listed = client
            .request("tools/list", json!({}), None, None)
            .await
            .map_err(|e| format!("tools/list: {e}"))?;
        let found = listed["tools"]
            .as_array()
            .is_some_and(|tools| tools.iter().any(|t| t["name"] == name));
        if found {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{name} was not listed within {READY_WITHIN:?}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn structured(answer: Value, what: &str) -> Result<Value, String> {
    if answer["isError"] == true {
        return Err(format!("{what} was refused: {answer}"));
    }
    Ok(answer["structuredContent"].clone())
}

/// Everything a submission carries but its key.
struct Template {
    lease: Value,
    capability: String,
    schema_digest: Value,
    input_digest: String,
}

impl Template {
    fn submission(&self, key: &str) -> Value {
        json!({
            "submission": {
                "schema": SUBMISSION_SCHEMA,
                "leaseId": self.lease,
                "capability": self.capability,
                "logicalTaskId": format!("bench-{key}"),
                "attempt": 1,
                "correlationId": format!("bench-{key}"),
                "idempotencyKey": key,
                "inputDigest": self.input_digest,
                "acceptancePolicyDigest": "0".repeat(64),
                "artifactScopeDigest": "0".repeat(64),
                "providerInterfaceVersion": self.schema_digest,
                "deadlineUnixMs": now_ms() + 300_000,
                "retentionMs": 600_000,
                "limits": {"runtimeMs": 30_000, "artifactBytes": 65_536, "outputBytes": 65_536},
                "permittedEffect": "non_idempotent_write",
                "cleanupRequired": true,
            },
            "arguments": {},
        })
    }
}

/// One submission; the route's task ID.
async fn submit(
    client: Arc<Client>,
    template: Arc<Template>,
    key: String,
) -> Result<(Vec<Duration>, Option<String>, u64), ClientError> {
    let t = Instant::now();
    let answer = client
        .call_tool(SUBMIT_TOOL, template.submission(&key), None)
        .await?;
    let took = t.elapsed();
    match super::task_id_of(&answer) {
        Some(id) => Ok((vec![took], Some(id), 0)),
        None => Err(ClientError::Decode(format!(
            "taskgate_submit did not answer with a task: {answer}"
        ))),
    }
}

/// The phase, or why it was not measured: none of this fails the run.
pub fn measure(
    rt: &tokio::runtime::Runtime,
    sizing: &Sizing,
    scratch: &Path,
    c: usize,
    progress: &Progress,
) -> Result<RoutedCost, String> {
    let exe = std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?;
    let provider = scratch.join("provider");
    for dir in [provider.clone(), provider.join("state")] {
        private_dir(&dir).map_err(|e| e.to_string())?;
    }
    let io = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
    let provider_config = provider.join("provider.toml");
    std::fs::write(&provider_config, "").map_err(|e| io(&provider_config, e))?;
    let router_config = scratch.join("bench-routed.toml");
    std::fs::write(&router_config, config(&sizing.toml(), &exe, &provider))
        .map_err(|e| io(&router_config, e))?;
    let state = scratch.join("state-routed");
    private_dir(&state).map_err(|e| e.to_string())?;
    let daemon = start_daemon(scratch, "-routed", &router_config)
        .map_err(|e| format!("the routing daemon: {e}"))?;
    let pid = daemon.child.id();
    let url = daemon.url.clone();
    let remote = format!("{ALIAS}.{BENCH_TOOL}");
    rt.block_on(async {
        let client = bench_client(&url, None).map_err(|e| e.to_string())?;
        // The operator's steps: the upstream connected, its tool pinned,
        // the pin applied.
        wait_for_tool(&client, &remote).await?;
        operator(&["upstream", "pin", ALIAS], &router_config, &state)?;
        operator(&["reload"], &router_config, &state)?;
        wait_for_tool(&client, DESCRIBE_TOOL).await?;

        let described = structured(
            client
                .call_tool(DESCRIBE_TOOL, json!({}), None)
                .await
                .map_err(|e| format!("{DESCRIBE_TOOL}: {e}"))?,
            DESCRIBE_TOOL,
        )?;
        let capability = described["capabilities"]
            .as_array()
            .and_then(|a| a.iter().find(|c| c["name"] == remote.as_str()).cloned())
            .ok_or_else(|| format!("{remote} is not routable: {described}"))?;
        let effect = capability["effect"].as_str().unwrap_or_default().to_string();
        let lease = structured(
            client
                .call_tool(
                    LEASE_TOOL,
                    json!({"capabilities": [remote], "effects": [effect, "non_idempotent_write"]}),
                    None,
                )
                .await
                .map_err(|e| format!("{LEASE_TOOL}: {e}"))?,
            LEASE_TOOL,
        )?;
        let template = Arc::new(Template {
            lease: lease["leaseId"].clone(),
            capability: remote.clone(),
            schema_digest: capability["schemaDigest"].clone(),
            input_digest: input_digest(&Map::new()),
        });

        let run_id = format!("{}-{}", std::process::id(), now_ms());
        let phase = |n: usize, conc: usize, name: &'static str, offset: usize| {
            let (template, run_id, url) = (template.clone(), run_id.clone(), url.clone());
            async move {
                let count = Arc::new(AtomicUsize::new(0));
                let before = cpu_ns(pid);
                let run = super::with_progress(
                    progress,
                    name,
                    n,
                    count.clone(),
                    concurrent(&url, None, n, conc, count, move |client, i| {
                        submit(client, template.clone(), format!("{run_id}-{}", offset + i))
                    }),
                )
                .await
                .map_err(|e| format!("{name}: {e}"))?;
                let cpu = cpu_ns(pid).saturating_sub(before);
                Ok::<_, String>((run, cpu))
            }
        };
        let (serial, _) = phase(SERIAL_SUBMITS, 1, "routed, 1", 0).await?;
        let (concurrent_run, cpu) =
            phase(CONCURRENT_SUBMITS, c, "routed", SERIAL_SUBMITS).await?;

        // One route followed to its end: the upstream ran the tool.
        let first = serial
            .ids
            .first()
            .map(|(_, id)| id.clone())
            .ok_or("no submission answered with a task")?;
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            let task = client
                .get_task(&first)
                .await
                .map_err(|e| format!("polling route {first}: {e}"))?;
            match task["status"].as_str() {
                Some("completed") => break,
                Some("working" | "input_required") if Instant::now() < deadline => {
                    let wait = task["pollIntervalMs"].as_u64().unwrap_or(100).clamp(10, 1000);
                    tokio::time::sleep(Duration::from_millis(wait)).await;
                }
                _ => return Err(format!("route {first} did not complete: {task}")),
            }
        }
        let cost = RoutedCost {
            serial: PhaseFigures::of(&serial.latencies, serial.elapsed, 0, serial.busy),
            concurrent: PhaseFigures::of(
                &concurrent_run.latencies,
                concurrent_run.elapsed,
                0,
                concurrent_run.busy,
            ),
            submits: CONCURRENT_SUBMITS,
            cpu_us_per_submit: cpu as f64 / 1000.0 / CONCURRENT_SUBMITS as f64,
        };
        progress.done(&format!(
            "routed: {SERIAL_SUBMITS} submits one at a time p50 {:.3} ms; {CONCURRENT_SUBMITS} at concurrency {c} at {:.0}/s, daemon CPU {:.0} µs each",
            cost.serial.latency.p50_ms, cost.concurrent.per_sec, cost.cpu_us_per_submit
        ));
        Ok(cost)
    })
}
