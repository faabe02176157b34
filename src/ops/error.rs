//! Why an operator's or administrator's request was refused, and the one
//! place that decides how each refusal goes out: its registered wire code
//! (the body of an HTTP refusal), its HTTP status (`/admin/v1`) and its
//! exit class (the admin socket's answer, which the command-line client
//! exits with). A surface never picks a code, a status or a class of its
//! own: it asks [`OpsError::respond`].

use thiserror::Error;

use crate::backup::BackupError;
use crate::exit::{Classify, ExitClass};
use crate::store::StoreError;
use crate::wire::{self, WireCode};

#[derive(Debug, Error)]
pub enum OpsError {
    /// Approvals were never set up in this daemon.
    #[error(
        "approvals are not set up in this daemon: no [[tool]] or [upstream.tools.NAME] has approval = \"required\" and no approval journal exists"
    )]
    ApprovalsNotSetUp,
    /// The journal could not be opened, or an append of its failed.
    #[error("approvals are disabled ({0}); `taskgate status` says why")]
    ApprovalsDisabled(String),
    #[error("no proposal {0} in the approval journal")]
    UnknownProposal(String),
    /// A decision the journal's rules refuse (already decided, too late,
    /// self-approval, a reason too long).
    #[error("{0}")]
    DecisionRefused(String),
    #[error("the approval journal could not record the decision: {0}")]
    JournalFailed(String),
    #[error("no upstream {0:?} is configured; `taskgate upstream list` shows them")]
    UnknownUpstream(String),
    #[error("{0:?} is not a route ID (tgr- and 32 hex digits)")]
    NotARouteId(String),
    #[error("no unexpired route {0}")]
    UnknownRoute(String),
    /// The store could not answer a read (`what` names what was read).
    #[error("the store could not read {what}: {source}")]
    StoreRead {
        what: &'static str,
        source: StoreError,
    },
    /// The daemon is stopping; `then` says what the operator does instead.
    #[error("the daemon is stopping; {then}")]
    Stopping { then: &'static str },
    #[error("a snapshot is already being written; try again once it is done")]
    SnapshotRunning,
    #[error("the task store is disabled ({0}); stop the daemon and take an offline backup")]
    StoreDisabled(String),
    #[error("the snapshot failed: {0}; nothing was kept")]
    SnapshotFailed(StoreError),
    /// A snapshot's destination or copy refused (its class is the offline
    /// backup's for the same fault).
    #[error("{0}{hint}", hint = read_only_hint(.0))]
    Backup(BackupError),
    /// A reload's configuration refused; `class` is the class the file was
    /// refused with (78 for an invalid configuration).
    #[error("{message}")]
    ReloadRefused { class: ExitClass, message: String },
    /// A request this surface serves no more of now.
    #[error("{0}")]
    Busy(String),
    /// A caller this surface does not serve (a uid, a missing key).
    #[error("{0}")]
    Denied(String),
    /// A request that is not understood (its line, its query, its body).
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    RequestTooLarge(String),
    #[error("{0}")]
    RequestTimeout(String),
    /// The HTTP admin interface without `[auth]`.
    #[error(
        "the HTTP admin interface needs credentials ([auth]); use `taskgate approvals` over the admin socket"
    )]
    NoCredentials,
    /// A fault inside the daemon (a task that stopped, an answer that
    /// could not be encoded).
    #[error("{0}")]
    Internal(String),
}

/// What kind of refusal an [`OpsError`] is: the rows of [`Kind::respond`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    ApprovalsNotSetUp,
    ApprovalsDisabled,
    UnknownProposal,
    DecisionRefused,
    JournalFailed,
    UnknownUpstream,
    NotARouteId,
    UnknownRoute,
    StoreRead,
    Stopping,
    SnapshotRunning,
    StoreDisabled,
    SnapshotFailed,
    Backup,
    ReloadRefused,
    Busy,
    Denied,
    BadRequest,
    RequestTooLarge,
    RequestTimeout,
    NoCredentials,
    Internal,
}

/// Where a row's exit class comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Class(ExitClass),
    /// The class of the refusal the error carries (a configuration's, a
    /// backup's), so that `taskgate reload` and `backup --online` exit as
    /// a start and an offline backup would for the same fault.
    Carried,
}

/// Where a row's wire code comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Wire(WireCode),
    /// The code of the store's refusal ([`crate::tasks::store_wire`]).
    Store,
}

/// How one refusal goes out on every surface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Respond {
    pub wire: WireCode,
    /// The HTTP status of `/admin/v1`'s answer.
    pub http: u16,
    pub exit: ExitClass,
}

impl Kind {
    pub const ALL: [Kind; 22] = [
        Kind::ApprovalsNotSetUp,
        Kind::ApprovalsDisabled,
        Kind::UnknownProposal,
        Kind::DecisionRefused,
        Kind::JournalFailed,
        Kind::UnknownUpstream,
        Kind::NotARouteId,
        Kind::UnknownRoute,
        Kind::StoreRead,
        Kind::Stopping,
        Kind::SnapshotRunning,
        Kind::StoreDisabled,
        Kind::SnapshotFailed,
        Kind::Backup,
        Kind::ReloadRefused,
        Kind::Busy,
        Kind::Denied,
        Kind::BadRequest,
        Kind::RequestTooLarge,
        Kind::RequestTimeout,
        Kind::NoCredentials,
        Kind::Internal,
    ];

    /// The table: each kind's wire code, HTTP status and exit class.
    pub fn respond(self) -> (Code, u16, Exit) {
        use Code::Wire as W;
        use Exit::Class as C;
        use ExitClass as E;
        match self {
            Kind::ApprovalsNotSetUp => (W(wire::INVALID_PARAMS), 404, C(E::Usage)),
            Kind::ApprovalsDisabled => (W(wire::APPROVALS_UNAVAILABLE), 503, C(E::CallFailed)),
            Kind::UnknownProposal => (W(wire::INVALID_PARAMS), 404, C(E::CallFailed)),
            Kind::DecisionRefused => (W(wire::INVALID_PARAMS), 409, C(E::CallFailed)),
            Kind::JournalFailed => (W(wire::INTERNAL), 500, C(E::Io)),
            Kind::UnknownUpstream => (W(wire::INVALID_PARAMS), 404, C(E::Usage)),
            Kind::NotARouteId => (W(wire::INVALID_PARAMS), 400, C(E::Usage)),
            Kind::UnknownRoute => (W(wire::INVALID_PARAMS), 404, C(E::CallFailed)),
            Kind::StoreRead => (Code::Store, 503, C(E::CallFailed)),
            Kind::Stopping => (W(wire::STOPPING), 503, C(E::Unreachable)),
            Kind::SnapshotRunning => (W(wire::SERVER_BUSY), 409, C(E::Unreachable)),
            Kind::StoreDisabled => (W(wire::STORE_UNAVAILABLE), 503, C(E::CallFailed)),
            Kind::SnapshotFailed => (W(wire::INTERNAL), 500, C(E::CallFailed)),
            Kind::Backup => (W(wire::INTERNAL), 500, Exit::Carried),
            Kind::ReloadRefused => (W(wire::INVALID_PARAMS), 422, Exit::Carried),
            Kind::Busy => (W(wire::SERVER_BUSY), 503, C(E::Unreachable)),
            Kind::Denied => (W(wire::FORBIDDEN), 403, C(E::Protocol)),
            Kind::BadRequest => (W(wire::INVALID_PARAMS), 400, C(E::Protocol)),
            Kind::RequestTooLarge => (W(wire::REQUEST_TOO_LARGE), 413, C(E::Protocol)),
            Kind::RequestTimeout => (W(wire::REQUEST_TIMEOUT), 408, C(E::Protocol)),
            Kind::NoCredentials => (W(wire::INVALID_PARAMS), 404, C(E::Usage)),
            Kind::Internal => (W(wire::INTERNAL), 500, C(E::Io)),
        }
    }
}

impl OpsError {
    pub fn kind(&self) -> Kind {
        match self {
            OpsError::ApprovalsNotSetUp => Kind::ApprovalsNotSetUp,
            OpsError::ApprovalsDisabled(_) => Kind::ApprovalsDisabled,
            OpsError::UnknownProposal(_) => Kind::UnknownProposal,
            OpsError::DecisionRefused(_) => Kind::DecisionRefused,
            OpsError::JournalFailed(_) => Kind::JournalFailed,
            OpsError::UnknownUpstream(_) => Kind::UnknownUpstream,
            OpsError::NotARouteId(_) => Kind::NotARouteId,
            OpsError::UnknownRoute(_) => Kind::UnknownRoute,
            OpsError::StoreRead { .. } => Kind::StoreRead,
            OpsError::Stopping { .. } => Kind::Stopping,
            OpsError::SnapshotRunning => Kind::SnapshotRunning,
            OpsError::StoreDisabled(_) => Kind::StoreDisabled,
            OpsError::SnapshotFailed(_) => Kind::SnapshotFailed,
            OpsError::Backup(_) => Kind::Backup,
            OpsError::ReloadRefused { .. } => Kind::ReloadRefused,
            OpsError::Busy(_) => Kind::Busy,
            OpsError::Denied(_) => Kind::Denied,
            OpsError::BadRequest(_) => Kind::BadRequest,
            OpsError::RequestTooLarge(_) => Kind::RequestTooLarge,
            OpsError::RequestTimeout(_) => Kind::RequestTimeout,
            OpsError::NoCredentials => Kind::NoCredentials,
            OpsError::Internal(_) => Kind::Internal,
        }
    }

    /// How this refusal goes out, on every surface.
    pub fn respond(&self) -> Respond {
        let (code, http, exit) = self.kind().respond();
        let wire = match (code, self) {
            (Code::Wire(w), _) => w,
            (Code::Store, OpsError::StoreRead { source, .. }) => crate::tasks::store_wire(source),
            (Code::Store, _) => wire::INTERNAL,
        };
        let exit = match (exit, self) {
            (Exit::Class(c), _) => c,
            (Exit::Carried, OpsError::ReloadRefused { class, .. }) => *class,
            (Exit::Carried, OpsError::Backup(e)) => e.exit_class(),
            (Exit::Carried, _) => ExitClass::Io,
        };
        Respond { wire, http, exit }
    }
}

/// Where the service may not write: what the operator does about it.
fn read_only_hint(e: &BackupError) -> &'static str {
    let read_only = matches!(e, BackupError::Io { source, .. }
        if matches!(source.raw_os_error(), Some(libc::EROFS | libc::EACCES)));
    if read_only {
        "; the service may write only where its unit allows (the packaged unit: under /var/backups/taskgate; elsewhere add ReadWritePaths= in a drop-in)"
    } else {
        ""
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// One error of every variant; the match in `kind` has no catch-all,
    /// so a new variant fails to compile until it has a row, and a new
    /// row must be added here and to `Kind::ALL` for this test to see it.
    fn one_of_each() -> Vec<OpsError> {
        vec![
            OpsError::ApprovalsNotSetUp,
            OpsError::ApprovalsDisabled("damaged".into()),
            OpsError::UnknownProposal("tgp-x".into()),
            OpsError::DecisionRefused("already decided".into()),
            OpsError::JournalFailed("disk".into()),
            OpsError::UnknownUpstream("a".into()),
            OpsError::NotARouteId("x".into()),
            OpsError::UnknownRoute("tgr-x".into()),
            OpsError::StoreRead {
                what: "the routes",
                source: StoreError::Stopped,
            },
            OpsError::Stopping { then: "nothing" },
            OpsError::SnapshotRunning,
            OpsError::StoreDisabled("disk".into()),
            OpsError::SnapshotFailed(StoreError::Stopped),
            OpsError::Backup(BackupError::Destination {
                path: PathBuf::from("/x"),
                problem: "exists".into(),
            }),
            OpsError::ReloadRefused {
                class: ExitClass::Config,
                message: "bad".into(),
            },
            OpsError::Busy("full".into()),
            OpsError::Denied("uid".into()),
            OpsError::BadRequest("malformed".into()),
            OpsError::RequestTooLarge("long".into()),
            OpsError::RequestTimeout("slow".into()),
            OpsError::NoCredentials,
            OpsError::Internal("bug".into()),
        ]
    }

    #[test]
    fn every_refusal_has_its_code_status_and_class_in_the_one_table() {
        let errors = one_of_each();
        let kinds: Vec<Kind> = errors.iter().map(OpsError::kind).collect();
        assert_eq!(kinds, Kind::ALL.to_vec(), "one error per kind, in order");
        for e in &errors {
            let r = e.respond();
            let (code, http, exit) = e.kind().respond();
            assert!(
                wire::ALL.contains(&r.wire),
                "{:?}: {} is not registered",
                e.kind(),
                r.wire.name
            );
            if let Code::Wire(w) = code {
                assert_eq!(r.wire, w, "{:?}", e.kind());
            }
            assert_eq!(r.http, http);
            assert!((400..600).contains(&r.http), "{:?}: {}", e.kind(), r.http);
            assert!(ExitClass::ALL.contains(&r.exit), "{:?}", e.kind());
            if let Exit::Class(c) = exit {
                assert_eq!(r.exit, c, "{:?}", e.kind());
            }
            // A refusal is never exit 0, and never a class a start uses
            // for its own refusals other than those the table names.
            assert_ne!(r.exit.code(), 0);
        }
        // Carried classes are the carried refusal's.
        assert_eq!(errors[13].respond().exit, ExitClass::UnsafePath);
        assert_eq!(errors[14].respond().exit, ExitClass::Config);
        // The store's refusal keeps the store's code.
        assert_eq!(errors[8].respond().wire, wire::STORE_UNAVAILABLE);
    }

    #[test]
    fn the_approval_refusals_keep_the_codes_and_statuses_clients_know() {
        let known = [
            (
                OpsError::UnknownProposal("tgp-x".into()),
                "TG_INVALID_PARAMS",
                404,
                1,
            ),
            (
                OpsError::DecisionRefused("decided".into()),
                "TG_INVALID_PARAMS",
                409,
                1,
            ),
            (
                OpsError::ApprovalsDisabled("damaged".into()),
                "TG_APPROVALS_UNAVAILABLE",
                503,
                1,
            ),
            (
                OpsError::JournalFailed("disk".into()),
                "TG_INTERNAL",
                500,
                74,
            ),
            (OpsError::ApprovalsNotSetUp, "TG_INVALID_PARAMS", 404, 64),
        ];
        for (e, name, http, exit) in known {
            let r = e.respond();
            assert_eq!(
                (r.wire.name, r.http, r.exit.code()),
                (name, http, exit),
                "{e:?}"
            );
        }
    }
}
