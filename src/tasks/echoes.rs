//! The execution envelopes taskgate received as a provider: when another
//! router (another taskgate, say) hands it a durable route's submission, the
//! envelope goes back on the task handle and on every `tasks/get` answer
//! for that task, as a router that checks every answer requires.
//!
//! They are kept in memory only, for the life of the process. A router
//! asks about a task only on the connection it created it on, and that
//! connection ends with this process; an envelope forgotten (evicted, or
//! across a restart) makes the answer go back without an echo, which a
//! router takes for an unknown outcome, never for success. Bounded in
//! entries and bytes: an envelope larger than [`MAX_ECHO_BYTES`] is not
//! kept, and past [`MAX_ECHOES`] the oldest is forgotten.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use serde_json::Value;

use crate::store::TaskId;

/// Envelopes kept at most.
pub const MAX_ECHOES: usize = 4096;
/// The largest envelope kept, as JSON.
pub const MAX_ECHO_BYTES: usize = 4096;

#[derive(Default)]
pub struct Echoes {
    inner: Mutex<Book>,
}

#[derive(Default)]
struct Book {
    by_task: HashMap<TaskId, Value>,
    /// Oldest first, for eviction.
    order: VecDeque<TaskId>,
}

impl Echoes {
    /// Keeps `envelope` for `task`, unless it is too large to.
    pub fn remember(&self, task: &TaskId, envelope: &Value) {
        if serde_json::to_vec(envelope).map_or(true, |b| b.len() > MAX_ECHO_BYTES) {
            return;
        }
        let mut book = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if book
            .by_task
            .insert(task.clone(), envelope.clone())
            .is_none()
        {
            book.order.push_back(task.clone());
        }
        while book.order.len() > MAX_ECHOES {
            if let Some(old) = book.order.pop_front() {
                book.by_task.remove(&old);
            }
        }
    }

    /// The envelope kept for `task`, if any.
    pub fn of(&self, task: &TaskId) -> Option<Value> {
        let book = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        book.by_task.get(task).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn id(n: usize) -> TaskId {
        TaskId::parse(&format!("tg-{n:032x}")).expect("a task ID")
    }

    #[test]
    fn envelopes_are_bounded_in_count_and_size() {
        let echoes = Echoes::default();
        for n in 0..=MAX_ECHOES {
            echoes.remember(&id(n), &json!({"publicTaskId": n}));
        }
        assert_eq!(echoes.of(&id(0)), None, "the oldest is forgotten");
        assert_eq!(echoes.of(&id(1)), Some(json!({"publicTaskId": 1})));
        assert_eq!(
            echoes.of(&id(MAX_ECHOES)),
            Some(json!({"publicTaskId": MAX_ECHOES}))
        );
        let big = json!({"binding": "x".repeat(MAX_ECHO_BYTES)});
        echoes.remember(&id(MAX_ECHOES + 1), &big);
        assert_eq!(echoes.of(&id(MAX_ECHOES + 1)), None, "too large to keep");
    }
}
