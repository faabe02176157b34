//! Exit classes of the command line (sysexits), one per kind of refused
//! start, and one per outcome of the operator commands (`call`, `task`).
//!
//! systemd's `RestartPreventExitStatus=` lists exactly the classes for which
//! [`ExitClass::prevents_restart`] holds (a test reads the unit), so a code
//! must never change meaning. Every module error that can end the process
//! maps itself to one of these through [`Classify`].
//!
//! Owns exit classes. `ExitClass` (serve: 64/65/74/75/77/78; operator commands:
//! 1/69/76) and `Refusal`. A module error becomes a refusal through `Classify`.
//! `prevents_restart()` marks the classes systemd must not retry; a test checks
//! the unit's `RestartPreventExitStatus=` against it. Codes never change
//! meaning.

use std::fmt;

/// The outcome classes a `taskgate` process can exit with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitClass {
    /// Unknown flag, missing argument (64).
    Usage,
    /// The database failed validation: corruption, future or unversioned
    /// schema, an undecodable payload, a pragma that read back wrong (65).
    DatabaseInvalid,
    /// An I/O error or a failed recovery, including a full disk (74).
    Io,
    /// Another process holds the lifetime lock of the state directory (75).
    LockHeld,
    /// An unsafe path or permission on the state directory or its files (77).
    UnsafePath,
    /// Invalid configuration: unknown key, relative path, bound out of range (78).
    Config,
    /// Operator commands: the call ended in failure: the tool's result has
    /// `isError`, or the task ended failed or cancelled (1). sysexits has no
    /// class for a negative answer; 1 is the Unix convention for one.
    CallFailed,
    /// Operator commands: the daemon cannot be reached, the connection
    /// broke, no answer came in time, or it answered HTTP 503 (69,
    /// EX_UNAVAILABLE).
    Unreachable,
    /// Operator commands: the daemon refused the request with a JSON-RPC
    /// error (unknown tool or task, invalid arguments, polled too soon, a
    /// tool that could not run), or answered in a way that is not MCP (76,
    /// EX_PROTOCOL).
    Protocol,
}

impl ExitClass {
    /// Every class, for tests and generated docs.
    pub const ALL: [ExitClass; 9] = [
        ExitClass::Usage,
        ExitClass::DatabaseInvalid,
        ExitClass::Io,
        ExitClass::LockHeld,
        ExitClass::UnsafePath,
        ExitClass::Config,
        ExitClass::CallFailed,
        ExitClass::Unreachable,
        ExitClass::Protocol,
    ];

    pub fn code(self) -> u8 {
        match self {
            ExitClass::Usage => 64,
            ExitClass::DatabaseInvalid => 65,
            ExitClass::Io => 74,
            ExitClass::LockHeld => 75,
            ExitClass::UnsafePath => 77,
            ExitClass::Config => 78,
            ExitClass::CallFailed => 1,
            ExitClass::Unreachable => 69,
            ExitClass::Protocol => 76,
        }
    }

    /// Whether restarting the service would only meet the same refusal:
    /// the database, a permission or the configuration needs an operator.
    /// A held lock (the other process may exit) and an I/O error (the disk
    /// may recover or be freed) are worth retrying. The unit's
    /// `RestartPreventExitStatus=` lists exactly these codes.
    pub fn prevents_restart(self) -> bool {
        matches!(
            self,
            ExitClass::DatabaseInvalid | ExitClass::UnsafePath | ExitClass::Config
        )
    }

    pub fn label(self) -> &'static str {
        match self {
            ExitClass::Usage => "usage error",
            ExitClass::DatabaseInvalid => "database validation failed",
            ExitClass::Io => "I/O or recovery failure",
            ExitClass::LockHeld => "ownership lock held",
            ExitClass::UnsafePath => "unsafe path or permissions",
            ExitClass::Config => "invalid configuration",
            ExitClass::CallFailed => "the call failed",
            ExitClass::Unreachable => "daemon unreachable",
            ExitClass::Protocol => "request refused or answer not understood",
        }
    }
}

impl fmt::Display for ExitClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (exit {})", self.label(), self.code())
    }
}

/// Implemented by every error that can refuse a start.
pub trait Classify {
    fn exit_class(&self) -> ExitClass;
}

/// A refused start or command: its class and one line saying what was wrong
/// and what to do. `main` prints it as the process's last word.
#[derive(Debug)]
pub struct Refusal {
    pub class: ExitClass,
    pub message: String,
}

impl Refusal {
    pub fn new(class: ExitClass, message: impl Into<String>) -> Self {
        Refusal {
            class,
            message: message.into(),
        }
    }

    /// The single line printed on stderr (and sent as systemd STATUS=).
    pub fn line(&self) -> String {
        // One line, whatever the underlying error carried.
        let flat: String = self
            .message
            .chars()
            .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
            .collect();
        format!("taskgate: refused: {}: {}", self.class, flat)
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.line())
    }
}

impl std::error::Error for Refusal {}

impl<E: Classify + fmt::Display> From<E> for Refusal {
    fn from(e: E) -> Self {
        Refusal::new(e.exit_class(), e.to_string())
    }
}
