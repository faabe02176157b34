//! The configuration of the daemon `taskgate bench` starts, sized from the
//! load the benchmark drives, so that the daemon's own bounds are never
//! what a run measures.
//!
//! The benchmark drives at most `C` requests at once (`--concurrency`):
//! each of its clients has one request in flight at a time, tool calls in
//! the create phase and polls in the others. Every bound that such a
//! request passes is set to at least `C`, with room to spare; a
//! concurrency some bound cannot reach within its key's range is refused
//! before anything starts.

use std::fmt::Write as _;

use serde_json::{Map, Value};

use crate::config::keys::{
    KeySpec, SERVER_MAX_CONCURRENT_REQUESTS, SERVER_MAX_CONNECTIONS,
    SERVER_RESERVED_CONTROL_REQUESTS, STORE_MAX_LIVE_TASKS, STORE_QUEUE_DEPTH, TASKS_MAX_RUNNING,
    TASKS_POLL_INTERVAL_MS,
};
use crate::exit::{ExitClass, Refusal};

/// Connections beyond twice the concurrency: those of a finished phase's
/// clients still closing, and any other loopback client.
const SPARE_CONNECTIONS: u64 = 16;
/// Running slots per concurrent client: a run holds its slot until its
/// completion is committed, a batch behind its creation, so two batches of
/// `C` with room again as much.
const RUNNING_PER_CLIENT: u64 = 4;
/// Running slots at least (the daemon's default).
const MIN_RUNNING: u64 = 8;

/// One key the benchmark sets: what the load needs at least, and the value
/// it asks for (room to spare), before the key's range is applied.
struct Want {
    key: &'static KeySpec,
    /// Below this the daemon would refuse some of the benchmark's requests.
    needed: u64,
    wanted: u64,
    /// The flag whose value sets `needed`, for the refusal.
    flag: &'static str,
}

/// The benchmark daemon's configuration: each key with its value, in the
/// order written.
#[derive(Debug, Clone)]
pub struct Sizing {
    settings: Vec<(&'static KeySpec, u64)>,
}

impl Sizing {
    /// The configuration for `concurrency` clients and `tasks` tasks (plus
    /// `serial` created one after another first), or a usage refusal naming
    /// the key whose range cannot serve that load.
    pub fn for_load(concurrency: usize, tasks: usize, serial: usize) -> Result<Sizing, Refusal> {
        let c = concurrency as u64;
        let n = tasks as u64;
        let running = (c * RUNNING_PER_CLIENT)
            .max(MIN_RUNNING)
            .min(TASKS_MAX_RUNNING.int().max);
        let wants = [
            Want {
                key: &SERVER_MAX_CONNECTIONS,
                needed: c,
                wanted: 2 * c + SPARE_CONNECTIONS,
                flag: "--concurrency",
            },
            Want {
                key: &SERVER_MAX_CONCURRENT_REQUESTS,
                needed: c,
                wanted: 2 * c,
                flag: "--concurrency",
            },
            // Polls count here; at most half of these may be held until
            // their task's read is due, so all C can be.
            Want {
                key: &SERVER_RESERVED_CONTROL_REQUESTS,
                needed: c,
                wanted: 2 * c,
                flag: "--concurrency",
            },
            // C creations or reads at once, and the completions of the runs
            // still going.
            Want {
                key: &STORE_QUEUE_DEPTH,
                needed: c,
                wanted: (2 * c + running).max(STORE_QUEUE_DEPTH.int().default),
                flag: "--concurrency",
            },
            // A call that finds no free slot runs synchronously and is
            // counted as such: one slot is enough to be correct.
            Want {
                key: &TASKS_MAX_RUNNING,
                needed: 1,
                wanted: running,
                flag: "--concurrency",
            },
            Want {
                key: &STORE_MAX_LIVE_TASKS,
                needed: n + serial as u64,
                wanted: 2 * n + 1000,
                flag: "--tasks",
            },
            Want {
                key: &TASKS_POLL_INTERVAL_MS,
                needed: super::BENCH_POLL_INTERVAL_MS,
                wanted: super::BENCH_POLL_INTERVAL_MS,
                flag: "--concurrency",
            },
        ];
        let mut settings = Vec::with_capacity(wants.len());
        for w in wants {
            let range = w.key.int();
            if w.needed > range.max {
                let value = if w.flag == "--tasks" {
                    tasks
                } else {
                    concurrency
                };
                return Err(Refusal::new(
                    ExitClass::Usage,
                    format!(
                        "{} {value} is more than the benchmark daemon can serve: it needs {} of at least {}, \
                         and that key allows at most {}; use {} 1..={}",
                        w.flag,
                        w.key.dotted(),
                        w.needed,
                        range.max,
                        w.flag,
                        if w.flag == "--tasks" {
                            max_tasks(serial)
                        } else {
                            max_concurrency()
                        }
                    ),
                ));
            }
            let value = w.wanted.max(w.needed).clamp(range.min, range.max);
            settings.push((w.key, value));
        }
        Ok(Sizing { settings })
    }

    /// The value of `key`, if the benchmark sets it.
    pub fn get(&self, key: &KeySpec) -> Option<u64> {
        self.settings
            .iter()
            .find(|(k, _)| k.dotted() == key.dotted())
            .map(|(_, v)| *v)
    }

    /// The configuration file the daemon is started with: one table per
    /// section.
    pub fn toml(&self) -> String {
        let mut sections: Vec<&str> = Vec::new();
        for (key, _) in &self.settings {
            if !sections.contains(&key.section.name()) {
                sections.push(key.section.name());
            }
        }
        let mut s = String::new();
        for section in sections {
            let _ = writeln!(s, "[{section}]");
            for (key, value) in self
                .settings
                .iter()
                .filter(|(k, _)| k.section.name() == section)
            {
                let _ = writeln!(s, "{} = {value}", key.name);
            }
        }
        s
    }

    /// `{"server": {"max_connections": …, …}, "store": {…}, "tasks": {…}}`,
    /// as the configuration file would say it.
    pub fn json(&self) -> Value {
        let mut root = Map::new();
        for (key, value) in &self.settings {
            let section = root
                .entry(key.section.name())
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(m) = section {
                m.insert(key.name.to_string(), Value::from(*value));
            }
        }
        Value::Object(root)
    }

    /// `server.max_connections = 80, …`: one line for people.
    pub fn line(&self) -> String {
        self.settings
            .iter()
            .map(|(k, v)| format!("{} = {v}", k.dotted()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The largest `--concurrency` every key sized from it can serve.
pub fn max_concurrency() -> u64 {
    [
        &SERVER_MAX_CONNECTIONS,
        &SERVER_MAX_CONCURRENT_REQUESTS,
        &SERVER_RESERVED_CONTROL_REQUESTS,
        &STORE_QUEUE_DEPTH,
    ]
    .iter()
    .map(|k| k.int().max)
    .min()
    .unwrap_or(1)
}

/// The largest `--tasks` the live-task bound can hold, with `serial` more.
pub fn max_tasks(serial: usize) -> u64 {
    STORE_MAX_LIVE_TASKS.int().max - serial as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bound_a_request_passes_is_at_least_the_concurrency() {
        for c in [1, 16, 32, 100, 512, max_concurrency() as usize] {
            let s = Sizing::for_load(c, 10_000, 500).unwrap();
            for key in [
                &SERVER_MAX_CONNECTIONS,
                &SERVER_MAX_CONCURRENT_REQUESTS,
                &SERVER_RESERVED_CONTROL_REQUESTS,
                &STORE_QUEUE_DEPTH,
            ] {
                let v = s.get(key).unwrap();
                assert!(v >= c as u64, "{} = {v} at concurrency {c}", key.dotted());
                assert!(key.int().range().contains(&v));
            }
            assert!(s.get(&STORE_MAX_LIVE_TASKS).unwrap() >= 10_500);
        }
    }

    #[test]
    fn a_load_past_a_range_is_refused_naming_the_key() {
        let e = Sizing::for_load(max_concurrency() as usize + 1, 1000, 500).unwrap_err();
        assert_eq!(e.class, ExitClass::Usage);
        assert!(
            e.message.contains("server.reserved_control_requests"),
            "{e:?}"
        );
        let e = Sizing::for_load(32, 1_000_000, 500).unwrap_err();
        assert!(e.message.contains("store.max_live_tasks"), "{e:?}");
    }

    #[test]
    fn the_file_is_one_table_per_section() {
        let s = Sizing::for_load(32, 1000, 500).unwrap();
        let text = s.toml();
        let doc: toml::Table = text.parse().unwrap();
        assert_eq!(
            doc["server"]["reserved_control_requests"].as_integer(),
            Some(64)
        );
        assert_eq!(doc["tasks"]["poll_interval_ms"].as_integer(), Some(50));
        assert_eq!(s.json()["store"]["queue_depth"], Value::from(192u64));
    }
}
