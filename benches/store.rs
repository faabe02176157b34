//! Micro-benchmark of the store alone (no HTTP): creation one at a time and
//! from 32 concurrent callers (group commit), reads, and a 128-row expiry
//! sweep, on a real database in a temporary directory (or `$BENCH_DIR`, to
//! measure another disk). Run: `cargo bench --bench store`.
//!
//! Prints medians and p99; compare runs on the same host, and read the
//! concurrent figure as a ratio to the serial one.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use taskgate::store::{Clock, Digest, NewTask, Store, StoreOptions};

fn task(ttl_ms: i64) -> NewTask {
    NewTask {
        proposal: None,
        owner: Digest::of(b"bench"),
        reference: None,
        request: Some(Digest::of(b"request")),
        ttl_ms,
        poll_interval_ms: 1000,
    }
}

fn report(name: &str, mut v: Vec<Duration>, elapsed: Duration) {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{name:<34} n={:<6} p50 {:>8.3} ms  p99 {:>8.3} ms  {:>9.0}/s",
        v.len(),
        ms(v[v.len() / 2]),
        ms(v[(v.len() * 99 / 100).min(v.len() - 1)]),
        v.len() as f64 / elapsed.as_secs_f64()
    );
}

fn main() {
    let dir = common::scratch_dir("taskgate-store-bench-");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        // The store's clock is manual so that expiry is a step, not a wait;
        // latencies are measured on the real clock.
        let (clock, hand) = Clock::manual(Clock::system().now_ms());
        let options = StoreOptions {
            clock,
            ..StoreOptions::new(dir.path().join("tasks.db"))
        };
        let (store, _) = Store::open(options).expect("open");

        let mut lat = Vec::new();
        let start = Instant::now();
        for _ in 0..2000 {
            let t = Instant::now();
            store.create(task(86_400_000)).await.expect("create");
            lat.push(t.elapsed());
        }
        report("create, 1 caller", lat, start.elapsed());

        let start = Instant::now();
        let lat = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..32 {
            let (s, lat) = (store.clone(), lat.clone());
            set.spawn(async move {
                for _ in 0..500 {
                    let t = Instant::now();
                    s.create(task(86_400_000)).await.expect("create");
                    lat.lock().map(|mut l| l.push(t.elapsed())).ok();
                }
            });
        }
        while set.join_next().await.is_some() {}
        let v = lat.lock().map(|l| l.clone()).unwrap_or_default();
        report("create, 32 callers (group commit)", v, start.elapsed());

        let id = store
            .create(task(86_400_000))
            .await
            .expect("create")
            .record()
            .id
            .clone();
        let mut lat = Vec::new();
        let start = Instant::now();
        for _ in 0..5000 {
            let t = Instant::now();
            store.get(&id, &Digest::of(b"bench")).await.expect("get");
            lat.push(t.elapsed());
        }
        report("get, 1 caller", lat, start.elapsed());

        // All expire at once when the clock moves past them.
        for _ in 0..1280 {
            store.create(task(2000)).await.expect("create");
        }
        hand.advance(Duration::from_millis(2000));
        let mut lat = Vec::new();
        let start = Instant::now();
        for _ in 0..8 {
            let t = Instant::now();
            store.sweep_now().await.expect("sweep");
            lat.push(t.elapsed());
        }
        report("sweep of 128 expired rows", lat, start.elapsed());
        store.shutdown().await.expect("shutdown");
    });
}
