//! Stable journal message IDs (`MESSAGE_ID=`, 128 bits as 32 hex digits,
//! made once with `journalctl --new-id128`), one per event an operator or
//! a monitor looks for. Never change one: monitors match on them. Each has
//! an entry in `packaging/taskgate.catalog` (a test in `logging` keeps the
//! two in step), which `journalctl -x` shows beside the message. A
//! foundation module, so that every layer that reports such an event (the
//! store latching disabled, the service starting) can name its ID.
//!
//! Owns journal message IDs. The stable 128-bit `MESSAGE_ID`s (start, ready,
//! refused start, store disabled, recovery), each with an entry in
//! `packaging/taskgate.catalog`; a `logging` unit test keeps IDs and catalog in
//! step.

/// The task store is open: validated, migrated, recovered.
pub const START: &str = "8cdb7d07eec9463a9f62fbdf4dcde4b1";
/// Serving: the listener is bound and READY=1 is sent.
pub const READY: &str = "b74d7969db2c4c458140ee0c819e2036";
/// A refused start (or a refused operator command): the one line and
/// its exit status.
pub const REFUSED: &str = "371a2363426c438a9af7ec8ee4eff1db";
/// The task store latched disabled after an I/O error or corruption.
pub const STORE_DISABLED: &str = "be6f7498545c4cd5bbc20707025df058";
/// Restart recovery ended tasks that were running at the last stop.
pub const RECOVERY: &str = "1c1a5031a90f4132ab6724b7a4e4ab8f";
/// A call was held for an administrator's approval as a new proposal.
pub const APPROVAL_PROPOSED: &str = "6502ee7b32334dedad51a855c05a0c34";
/// An administrator approved or rejected a proposal.
pub const APPROVAL_DECIDED: &str = "4f2ade0873214c93a02746a126073539";
/// Every ID, for the catalog test.
pub const ALL: [(&str, &str); 7] = [
    ("START", START),
    ("READY", READY),
    ("REFUSED", REFUSED),
    ("STORE_DISABLED", STORE_DISABLED),
    ("RECOVERY", RECOVERY),
    ("APPROVAL_PROPOSED", APPROVAL_PROPOSED),
    ("APPROVAL_DECIDED", APPROVAL_DECIDED),
];
