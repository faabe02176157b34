//! Micro-benchmark of the request path without HTTP: decode → admit →
//! commit → encode. A real daemon (`service::Daemon` with the benchmark's
//! no-op tool, as `serve --bench-tool` opens it, without a listener) on a
//! real database in a temporary directory (or `$BENCH_DIR`, to measure
//! another disk). Run: `cargo bench --bench request`.
//!
//! The whole path is the stdio transport in process: each request is one
//! line written into `mcp::stdio::screened` (the screen stdio serving puts
//! before the protocol library), decoded by rmcp and served by a real
//! `mcp::Handler` over the daemon's `TaskService`, and its answer is read
//! back as one line. The stages are timed apart as well: a `tools/call`
//! body as a 2026-07-28 client sends it (`client::request_meta`) screened
//! (`mcp::screen::screen`) and decoded into rmcp's message type; a call
//! admitted and committed by `TaskService::call`; the committed record
//! turned into the task handle (`mcp::convert`) and serialised.
//!
//! Prints n, p50, p99 and rate per case, and each case's p50 and rate as
//! ratios to the no-op floor (`tools/list` through the same handler; serial
//! cases against the serial floor, concurrent ones against the concurrent
//! floor). Compare runs on the same host; read the figures as ratios.
//!
//! `cargo bench --bench request` (`benches/request.rs`) times this path without
//! HTTP on a real store: the screen and rmcp's decoding, `TaskService::call`,
//! the conversion and encoding of the answer, and the whole of it through the
//! real handler over the stdio transport in process, each read as a ratio to a
//! no-op request through the same path; `benches/store.rs` times the store
//! alone.

mod common;

use std::collections::HashMap;
use std::future::Future;
use std::hint::black_box;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::ServiceExt;
use rmcp::model::{
    ClientJsonRpcMessage, CreateTaskResult, GetTaskResult, JsonRpcMessage, NumberOrString,
    ServerJsonRpcMessage, ServerResult,
};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream};
use tokio::sync::oneshot;

use taskgate::auth::Caller;
use taskgate::client::request_meta;
use taskgate::config::Overrides;
use taskgate::mcp::{Handler, convert, screen};
use taskgate::service::{Daemon, Options};
use taskgate::store::TaskRecord;
use taskgate::tasks::{Call, Delivery, TaskService};
use taskgate::tools::builtin::{BENCH_TOOL, bench_noop};

/// Concurrent callers in the concurrent cases.
const CALLERS: usize = 32;
/// Requests per caller in the concurrent cases.
const PER_CALLER: usize = 100;
/// Requests in the serial cases that commit (or poll a committed task).
const SERIAL: usize = 1000;
/// Requests in the serial no-op case.
const SERIAL_NOOP: usize = 3000;
/// Creates (and no-ops) through the whole path before anything is measured.
const WARM_UP: usize = 500;
/// Iterations of the stages that touch no disk.
const STAGE: usize = 20_000;
/// Room in each in-process pipe.
const PIPE_BYTES: usize = 64 * 1024;
/// The line bound of the stdio pump: `server.max_request_bytes`' default.
const MAX_LINE_BYTES: usize = 1024 * 1024;

/// The daemon's configuration: running slots and the store's queue sized
/// for the concurrent callers (with fewer slots a no-op call would run
/// synchronously and no task would be measured); defaults otherwise.
const CONFIG: &str = "[server]\nmax_concurrent_requests = 128\n\
                      [store]\nqueue_depth = 512\n\
                      [tasks]\nmax_running = 256\n";

struct Figures {
    n: usize,
    p50: Duration,
    p99: Duration,
    rate: f64,
}

fn figures(mut v: Vec<Duration>, elapsed: Duration) -> Figures {
    v.sort();
    Figures {
        n: v.len(),
        p50: v[v.len() / 2],
        p99: v[(v.len() * 99 / 100).min(v.len() - 1)],
        rate: v.len() as f64 / elapsed.as_secs_f64(),
    }
}

fn report(name: &str, f: &Figures, floor: Option<&Figures>) {
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let ratios = match floor {
        Some(fl) => format!(
            "p50 {:>7.2}x  rate {:>6.3}x",
            us(f.p50) / us(fl.p50),
            f.rate / fl.rate
        ),
        None => "(the floor)".into(),
    };
    println!(
        "{name:<44} n={:<6} p50 {:>9.1} µs  p99 {:>9.1} µs  {:>9.0}/s  {ratios}",
        f.n,
        us(f.p50),
        us(f.p99),
        f.rate
    );
}

/// `n` steps one after another; each step times itself (what it prepares
/// first, a request's bytes, is not counted).
async fn serial<F, Fut>(n: usize, mut step: F) -> Figures
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Duration>,
{
    let mut lat = Vec::with_capacity(n);
    let start = Instant::now();
    for i in 0..n {
        lat.push(step(i).await);
    }
    figures(lat, start.elapsed())
}

/// `CALLERS` callers at once, each doing `PER_CALLER` steps one after
/// another; `step(caller, i)` times itself.
async fn concurrent<F, Fut>(step: F) -> Figures
where
    F: Fn(usize, usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Duration> + Send,
{
    let step = Arc::new(step);
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for caller in 0..CALLERS {
        let step = step.clone();
        set.spawn(async move {
            let mut lat = Vec::with_capacity(PER_CALLER);
            for i in 0..PER_CALLER {
                lat.push(step(caller, i).await);
            }
            lat
        });
    }
    let mut lat = Vec::with_capacity(CALLERS * PER_CALLER);
    while let Some(done) = set.join_next().await {
        lat.extend(done.expect("caller"));
    }
    figures(lat, start.elapsed())
}

/// A JSON-RPC request as a 2026-07-28 client sends it: the parameters with
/// the `_meta` the operator client puts into every request (protocol
/// version, capabilities with the Tasks extension, identity).
fn body(id: i64, method: &str, mut params: Value) -> Vec<u8> {
    params["_meta"] = request_meta(true);
    serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
        .expect("encode")
}

fn create_params() -> Value {
    json!({"name": BENCH_TOOL, "arguments": {}})
}

/// Answers kept by a case to be checked once it is over, each with the task
/// it is about.
type Answers = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

#[derive(serde::Deserialize)]
struct Answered {
    id: i64,
}

/// The client's end of an in-process stdio connection to a real handler:
/// requests go in as lines, answers are matched to them by id.
struct Wire {
    writer: tokio::sync::Mutex<DuplexStream>,
    waiting: Mutex<HashMap<i64, oneshot::Sender<Vec<u8>>>>,
    next_id: AtomicI64,
}

impl Wire {
    fn start(svc: Arc<TaskService>) -> Arc<Wire> {
        let (client_writes, pump_reads) = tokio::io::duplex(PIPE_BYTES);
        let (pump_writes, client_reads) = tokio::io::duplex(PIPE_BYTES);
        // As `serve --stdio` joins its stdio to the library.
        let (transport, pump) =
            taskgate::mcp::stdio::screened(pump_reads, pump_writes, MAX_LINE_BYTES);
        tokio::spawn(pump);
        tokio::spawn(async move {
            match Handler::for_stdio(svc).serve(transport).await {
                Ok(running) => drop(running.waiting().await),
                Err(e) => panic!("cannot serve: {e}"),
            }
        });
        let wire = Arc::new(Wire {
            writer: tokio::sync::Mutex::new(client_writes),
            waiting: Mutex::new(HashMap::new()),
            next_id: AtomicI64::new(1),
        });
        let reader = wire.clone();
        tokio::spawn(async move {
            let mut answers = BufReader::new(client_reads);
            loop {
                let mut line = Vec::new();
                match answers.read_until(b'\n', &mut line).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                let Answered { id } = serde_json::from_slice(&line).unwrap_or_else(|e| {
                    panic!(
                        "an answer without an id ({e}): {}",
                        String::from_utf8_lossy(&line)
                    )
                });
                let waiter = reader.waiting.lock().expect("waiting").remove(&id);
                if let Some(waiter) = waiter {
                    let _ = waiter.send(line);
                }
            }
        });
        wire
    }

    /// The next request's id and bytes (one line).
    fn request(&self, method: &str, params: Value) -> (i64, Vec<u8>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut line = body(id, method, params);
        line.push(b'\n');
        (id, line)
    }

    /// Sends one request line and waits for its answer.
    async fn send(&self, (id, line): (i64, Vec<u8>)) -> Vec<u8> {
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().expect("waiting").insert(id, tx);
        self.writer
            .lock()
            .await
            .write_all(&line)
            .await
            .expect("write");
        rx.await.expect("answer")
    }

    /// Sends one request and returns how long its answer took, and the answer.
    async fn timed(&self, method: &str, params: Value) -> (Duration, Vec<u8>) {
        let request = self.request(method, params);
        let t = Instant::now();
        let answer = self.send(request).await;
        (t.elapsed(), answer)
    }
}

/// An answer's `result`; an error answer ends the benchmark (its figures
/// would measure a refusal).
fn result_of(answer: &[u8]) -> Value {
    let v: Value = serde_json::from_slice(answer).expect("answer JSON");
    match v.get("result") {
        Some(r) => r.clone(),
        None => panic!("not a result: {v}"),
    }
}

/// The task ID of a create's answer, which must be a task.
fn task_of(answer: &[u8]) -> String {
    let r = result_of(answer);
    assert_eq!(
        r["resultType"], "task",
        "the call did not create a task: {r}"
    );
    r["taskId"].as_str().expect("taskId").to_string()
}

fn local_call() -> Call {
    Call {
        tool: BENCH_TOOL.into(),
        arguments: Some(serde_json::Map::new()),
        caller: Caller::Local,
        negotiated: true,
        operation_id: None,
        client_cancel: Default::default(),
    }
}

async fn committed(svc: &Arc<TaskService>) -> TaskRecord {
    match svc.call(local_call()).await.expect("call") {
        Delivery::Task(record) | Delivery::Routed { task: record, .. } => record,
        Delivery::Now(v) => panic!("the call ran synchronously: {v}"),
    }
}

fn main() {
    let dir = common::scratch_dir("taskgate-request-bench-");
    let private = |p: &std::path::Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    };
    private(dir.path());
    let state = dir.path().join("state");
    std::fs::create_dir(&state).expect("state directory");
    private(&state);
    let config = dir.path().join("taskgate.toml");
    std::fs::write(&config, CONFIG).expect("config");
    let daemon = Daemon::start(Options {
        overrides: Overrides {
            config_path: Some(config),
            state_dir: Some(state),
            listen: None,
        },
        builtins: vec![Arc::new(bench_noop())],
        clock: None,
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("cannot open the daemon: {e:?}"));
    let svc = daemon.service().clone();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let wire = Wire::start(svc.clone());
        // Warm up: the handler's first requests, and enough commits that
        // the write-ahead log has been checkpointed and reused a few times.
        for _ in 0..WARM_UP {
            result_of(&wire.timed("tools/list", json!({})).await.1);
            task_of(&wire.timed("tools/call", create_params()).await.1);
        }

        // The floor: a request that reads and writes nothing.
        let w = wire.clone();
        let floor = serial(SERIAL_NOOP, |_| {
            let w = w.clone();
            async move {
                let (t, answer) = w.timed("tools/list", json!({})).await;
                black_box(answer);
                t
            }
        })
        .await;
        report("no-op tools/list, 1 caller", &floor, None);
        let w = wire.clone();
        let floor_c = concurrent(move |_, _| {
            let w = w.clone();
            async move {
                let (t, answer) = w.timed("tools/list", json!({})).await;
                black_box(answer);
                t
            }
        })
        .await;
        report(
            &format!("no-op tools/list, {CALLERS} callers"),
            &floor_c,
            None,
        );

        // Decode: the bytes the daemon receives, screened, then decoded
        // into the protocol library's message.
        let call_body = body(7, "tools/call", create_params());
        let f = serial(STAGE, |_| {
            let t = Instant::now();
            black_box(screen::screen(black_box(&call_body), None).expect("screened"));
            std::future::ready(t.elapsed())
        })
        .await;
        report("decode tools/call: screen", &f, Some(&floor));
        let f = serial(STAGE, |_| {
            let t = Instant::now();
            black_box(screen::screen(black_box(&call_body), None).expect("screened"));
            let message: ClientJsonRpcMessage =
                serde_json::from_slice(black_box(&call_body)).expect("decoded");
            assert!(matches!(message, JsonRpcMessage::Request(_)));
            black_box(message);
            std::future::ready(t.elapsed())
        })
        .await;
        report("decode tools/call: screen + rmcp", &f, Some(&floor));

        // Admit and commit: the task service alone, one durable create at
        // a time.
        let s = svc.clone();
        let f = serial(SERIAL, |_| {
            let s = s.clone();
            async move {
                let t = Instant::now();
                black_box(committed(&s).await);
                t.elapsed()
            }
        })
        .await;
        report("admit + commit (TaskService::call)", &f, Some(&floor));

        // Encode: the committed record as the task handle, and a completed
        // task as tasks/get answers it, serialised as the library writes
        // them.
        let record = committed(&svc).await;
        let f = serial(STAGE, |i| {
            let t = Instant::now();
            let created = CreateTaskResult::new(convert::task(black_box(&record)));
            let message = ServerJsonRpcMessage::response(
                ServerResult::CreateTaskResult(created),
                NumberOrString::Number(i as i64),
            );
            black_box(serde_json::to_vec(&message).expect("encoded"));
            std::future::ready(t.elapsed())
        })
        .await;
        report("encode create answer (convert + serde)", &f, Some(&floor));
        let done = loop {
            let r = svc
                .get(record.id.as_str(), &Caller::Local)
                .await
                .expect("get");
            if r.outcome.is_some() {
                break r;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let f = serial(STAGE, |i| {
            // The view takes the record; its copy is made outside the timing.
            let record = done.clone();
            let t = Instant::now();
            let got = GetTaskResult::new(convert::detailed(black_box(record)));
            let message = ServerJsonRpcMessage::response(
                ServerResult::GetTaskResult(got),
                NumberOrString::Number(i as i64),
            );
            black_box(serde_json::to_vec(&message).expect("encoded"));
            std::future::ready(t.elapsed())
        })
        .await;
        report(
            "encode tasks/get answer (convert + serde)",
            &f,
            Some(&floor),
        );

        // The whole path: a durable create of the no-op tool.
        let w = wire.clone();
        let serial_answers = Arc::new(Mutex::new(Vec::with_capacity(SERIAL)));
        let a = serial_answers.clone();
        let f = serial(SERIAL, |_| {
            let (w, a) = (w.clone(), a.clone());
            async move {
                let (t, answer) = w.timed("tools/call", create_params()).await;
                a.lock().expect("answers").push(answer);
                t
            }
        })
        .await;
        report("create (whole path), 1 caller", &f, Some(&floor));
        let w = wire.clone();
        let concurrent_answers = Arc::new(Mutex::new(Vec::with_capacity(CALLERS * PER_CALLER)));
        let a = concurrent_answers.clone();
        let f = concurrent(move |_, _| {
            let (w, a) = (w.clone(), a.clone());
            async move {
                let (t, answer) = w.timed("tools/call", create_params()).await;
                a.lock().expect("answers").push(answer);
                t
            }
        })
        .await;
        report(
            &format!("create (whole path), {CALLERS} callers"),
            &f,
            Some(&floor_c),
        );

        // The poll path: tasks/get of each task once (a first poll reads the
        // store; a second within pollIntervalMs would be held until due).
        let take = |answers: &Arc<Mutex<Vec<Vec<u8>>>>| -> Vec<String> {
            let answers = std::mem::take(&mut *answers.lock().expect("answers"));
            answers.iter().map(|a| task_of(a)).collect()
        };
        // Each answer is checked once the case is over.
        let check = |polls: &Answers| {
            for (id, answer) in std::mem::take(&mut *polls.lock().expect("polls")) {
                let r = result_of(&answer);
                assert_eq!(r["taskId"], id.as_str(), "{r}");
            }
        };
        let ids = Arc::new(take(&serial_answers));
        let polls = Arc::new(Mutex::new(Vec::with_capacity(ids.len())));
        let (w, p) = (wire.clone(), polls.clone());
        let f = serial(ids.len(), |i| {
            let (w, ids, p) = (w.clone(), ids.clone(), p.clone());
            async move {
                let (t, answer) = w.timed("tasks/get", json!({"taskId": ids[i]})).await;
                p.lock().expect("polls").push((ids[i].clone(), answer));
                t
            }
        })
        .await;
        check(&polls);
        report("tasks/get (whole path), 1 caller", &f, Some(&floor));
        let ids = Arc::new(take(&concurrent_answers));
        let (w, p) = (wire.clone(), polls.clone());
        let f = concurrent(move |caller, i| {
            let (w, ids, p) = (w.clone(), ids.clone(), p.clone());
            async move {
                let id = &ids[caller * PER_CALLER + i];
                let (t, answer) = w.timed("tasks/get", json!({"taskId": id})).await;
                p.lock().expect("polls").push((id.clone(), answer));
                t
            }
        })
        .await;
        check(&polls);
        report(
            &format!("tasks/get (whole path), {CALLERS} callers"),
            &f,
            Some(&floor_c),
        );

        svc.stop_running(svc.stop_limit()).await;
        daemon.store().shutdown().await.expect("shutdown");
    });
    drop(daemon);
}
