//! The framework of a seeded, replayable request fuzzer against the real
//! daemon (`tests/fuzz_requests.rs` holds the tests and their tables: the
//! base requests, the known defects, the daemon's configuration).
//!
//! Every case is a function of the seed and its index alone ([`Rng::for_case`];
//! what earlier answers taught, [`Learnt`], is filled in when it is sent),
//! so a failure printed with its seed and index replays. `request.rs`: a
//! request as structure until it is rendered, and a case made from a base
//! request of the test's table (how many mutations, which framing);
//! `mutate.rs`: the mutations of messages, headers and bodies, and garbage
//! for bare connections; `run.rs`: sending cases over keep-alive
//! connections, judging what came back, the tally and the failure
//! descriptions.

pub mod mutate;
pub mod request;
pub mod run;

#[allow(unused_imports)]
pub use request::*;
#[allow(unused_imports)]
pub use run::*;

use std::time::Duration;

use serde_json::Value;

pub use super::mcp::{LEGACY, TASKS_EXT, V2026};

/// The body bound the daemon under fuzzing runs with
/// (`server.max_request_bytes`): small, so that bodies on both sides of it
/// stay cheap to send and to parse.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// Longest wait for one answer while the connection is open. Every tool the
/// fuzzed daemon runs ends at once, so only a stuck daemon takes this long.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);

// Randomness: splitmix64, one stream per request so that each request is a
// function of (seed, index) alone.

pub struct Rng(u64);

impl Rng {
    pub fn for_case(seed: u64, stream: u64, index: u64) -> Rng {
        let mut r = Rng(seed ^ stream.wrapping_mul(0xd1b5_4a32_d192_ed03));
        r.0 ^= r
            .next()
            .wrapping_add(index.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        r
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// A number from the environment variable `key` (decimal, or hex after
/// `0x`; `_` separators allowed), or `default` when it is not set.
pub fn number_from(key: &str, default: u64) -> u64 {
    match std::env::var(key) {
        Ok(s) => parse_u64(&s).unwrap_or_else(|| panic!("{key} must be a number, got {s:?}")),
        Err(_) => default,
    }
}

pub fn parse_u64(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(&hex.replace('_', ""), 16).ok(),
        None => s.replace('_', "").parse().ok(),
    }
}

// What is learnt from answers and filled into later requests.

#[derive(Default)]
pub struct Learnt {
    pub tasks: Vec<String>,
    pub sessions: Vec<String>,
}

impl Learnt {
    pub fn task(&self, rng: &mut Rng) -> String {
        if self.tasks.is_empty() || rng.chance(10) {
            // Looks like an ID, names nothing.
            return "00000000000000000000000000".into();
        }
        self.tasks[self.tasks.len() - 1 - rng.below(self.tasks.len().min(8))].clone()
    }

    pub fn session(&self, rng: &mut Rng) -> Option<String> {
        if self.sessions.is_empty() {
            return None;
        }
        // Mostly the newest session, which is likeliest still open.
        let back = if rng.chance(70) {
            0
        } else {
            rng.below(self.sessions.len())
        };
        Some(self.sessions[self.sessions.len() - 1 - back].clone())
    }

    pub fn remember(list: &mut Vec<String>, id: String) {
        if !list.contains(&id) {
            list.push(id);
            if list.len() > 32 {
                list.remove(0);
            }
        }
    }
}

/// `_meta` of a 2026-07-28 request of the fuzzer, with or without the
/// Tasks extension.
pub fn meta(tasks: bool) -> Value {
    super::mcp::meta("fuzz-requests", tasks)
}
