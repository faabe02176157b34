//! The registry of error codes taskgate puts on the wire.
//!
//! Every JSON-RPC error taskgate itself produces has an entry here: its
//! numeric code, a stable name for logs and docs, and one line of help for
//! the client. The MCP specification fixes a few codes (unknown task,
//! missing extension); the rest live in the JSON-RPC server range
//! -32040..=-32059, reserved for taskgate.

/// One registered wire error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireCode {
    pub code: i64,
    pub name: &'static str,
    pub help: &'static str,
}

macro_rules! registry {
    ($( $(#[$doc:meta])* $ident:ident = ($code:expr, $name:expr, $help:expr); )*) => {
        $( $(#[$doc])* pub const $ident: WireCode = WireCode { code: $code, name: $name, help: $help }; )*
        /// Every registered code, in declaration order.
        pub const ALL: &[WireCode] = &[ $( $ident ),* ];
    };
}

registry! {
    /// Unknown, expired and another owner's task IDs: one answer for all three.
    UNKNOWN_TASK = (-32602, "TG_TASK_NOT_FOUND",
        "no such task for this caller; it may never have existed, may have expired, or belongs to someone else");
    /// The task was running when the daemon stopped; it was not re-run.
    TASK_INTERRUPTED = (-32040, "TG_TASK_INTERRUPTED",
        "the daemon restarted while this task ran; its outcome is unknown and it was not run again; check the tool's effect before calling it again");
    /// The store's bounded admission queue was full.
    STORE_BUSY = (-32041, "TG_STORE_BUSY",
        "the task store's queue is full; retry after a short delay");
    /// Creation refused at a capacity bound (row limit, page cap, full disk).
    STORE_CAPACITY = (-32042, "TG_STORE_CAPACITY",
        "the task store is at capacity; wait for tasks to expire or ask the operator to raise the limit or free disk space");
    /// The task service latched disabled after an uncertain I/O error or corruption.
    STORE_UNAVAILABLE = (-32043, "TG_STORE_UNAVAILABLE",
        "the task store is disabled after a disk error until the daemon is restarted; the operator must check the disk and the logs");
    /// A creation reference was reused with different tool arguments.
    IDEMPOTENCY_CONFLICT = (-32044, "TG_TASK_IDEMPOTENCY_CONFLICT",
        "this operation reference was already used for a different call; use a new reference for a new call");
    /// A poll came sooner than the advertised poll interval.
    POLL_TOO_SOON = (-32045, "TG_TASK_POLL_TOO_SOON",
        "poll no faster than the task's pollIntervalMs; retry after the time given in data.retryAfterMs");
    /// A terminal payload exceeded the record limit and could not be spilled.
    RESULT_TOO_LARGE = (-32046, "TG_TASK_RESULT_TOO_LARGE",
        "the tool's result could not be stored in full; the task failed rather than keep a truncated result");
}

/// Looks a code up by number.
pub fn by_code(code: i64) -> Option<WireCode> {
    ALL.iter().copied().find(|w| w.code == code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn codes_and_names_are_unique_and_in_range() {
        let mut codes = HashSet::new();
        let mut names = HashSet::new();
        for w in ALL {
            assert!(codes.insert(w.code), "duplicate code {}", w.code);
            assert!(names.insert(w.name), "duplicate name {}", w.name);
            assert!(w.name.starts_with("TG_"), "{} lacks the TG_ prefix", w.name);
            assert!(
                w.code == -32602 || (-32059..=-32040).contains(&w.code),
                "{} uses {} outside the reserved range",
                w.name,
                w.code
            );
            assert!(!w.help.is_empty());
        }
        assert_eq!(by_code(-32041), Some(STORE_BUSY));
    }
}
