//! Who is calling: credentials turned into a [`Principal`], and the scopes
//! an operation needs.
//!
//! Two kinds of credential produce the same `Principal`: static API tokens
//! from a tokens file (stored only as `sha256:` hashes) and JWT access
//! tokens checked offline against a local JWKS file per trusted issuer. The
//! kind is chosen by the token's shape, never by trying both. The whole
//! credential set is swapped atomically on reload, after it has validated
//! completely.
//!
//! Rules: this module knows no protocol library, no store and no task; the
//! owner digest of a principal is computed by `tasks`. Raw secrets and
//! tokens are never written anywhere (disk, log, error text).

use std::collections::BTreeSet;
use std::sync::Arc;

/// `tools/call` of any tool.
pub const SCOPE_TOOLS_CALL: &str = "tools:call";
/// Also needed to call a tool whose effect is `idempotent_write`.
pub const SCOPE_EFFECT_IDEMPOTENT_WRITE: &str = "taskgate:effect:idempotent-write";
/// Also needed to call a tool whose effect is `non_idempotent_write`.
pub const SCOPE_EFFECT_NON_IDEMPOTENT_WRITE: &str = "taskgate:effect:non-idempotent-write";
/// `tasks/get` and the built-in `artifact_read`.
pub const SCOPE_TASKS_READ: &str = "tasks:read";
/// `tasks/cancel` and `tasks/update`.
pub const SCOPE_TASKS_CANCEL: &str = "tasks:cancel";
/// Listing and showing held approvals.
pub const SCOPE_APPROVALS_READ: &str = "approvals:read";
/// Approving or rejecting a held call.
pub const SCOPE_APPROVALS_DECIDE: &str = "approvals:decide";
/// Implies every other scope.
pub const SCOPE_ADMIN: &str = "admin";

/// Every scope taskgate knows, for documentation and for refusing a
/// misspelt scope in a tokens file.
pub const KNOWN_SCOPES: &[&str] = &[
    SCOPE_TOOLS_CALL,
    SCOPE_EFFECT_IDEMPOTENT_WRITE,
    SCOPE_EFFECT_NON_IDEMPOTENT_WRITE,
    SCOPE_TASKS_READ,
    SCOPE_TASKS_CANCEL,
    SCOPE_APPROVALS_READ,
    SCOPE_APPROVALS_DECIDE,
    SCOPE_ADMIN,
];

/// An authenticated caller, whatever the credential was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// `taskgate:static` for a static token; the JWT's exact `iss` otherwise.
    pub issuer: String,
    pub tenant: String,
    pub subject: String,
    pub scopes: BTreeSet<String>,
    /// The static token's id or the JWT's `jti` (when present): a label for
    /// logs, never the secret.
    pub credential_id: String,
    /// When the credential stops being valid (Unix milliseconds).
    pub expires_ms: Option<i64>,
}

impl Principal {
    /// The scopes in `needed` this principal lacks, in `needed`'s order;
    /// `admin` implies every scope.
    pub fn missing<'a>(&self, needed: &[&'a str]) -> Vec<&'a str> {
        if self.scopes.contains(SCOPE_ADMIN) {
            return Vec::new();
        }
        needed
            .iter()
            .copied()
            .filter(|s| !self.scopes.contains(*s))
            .collect()
    }
}

/// Who a request acts as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// stdio, or loopback HTTP without credentials where `[auth]` allows
    /// it: the one local owner, with every scope.
    Local,
    /// A caller that presented a valid credential.
    Authenticated(Arc<Principal>),
}

impl Caller {
    /// The scopes in `needed` this caller lacks.
    pub fn missing<'a>(&self, needed: &[&'a str]) -> Vec<&'a str> {
        match self {
            Caller::Local => Vec::new(),
            Caller::Authenticated(p) => p.missing(needed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(scopes: &[&str]) -> Principal {
        Principal {
            issuer: "taskgate:static".into(),
            tenant: "acme".into(),
            subject: "ci".into(),
            scopes: scopes.iter().map(|s| s.to_string()).collect(),
            credential_id: "ci".into(),
            expires_ms: None,
        }
    }

    #[test]
    fn missing_scopes_keep_the_order_asked_and_admin_implies_all() {
        let p = principal(&[SCOPE_TASKS_READ]);
        assert_eq!(
            p.missing(&[
                SCOPE_TOOLS_CALL,
                SCOPE_TASKS_READ,
                SCOPE_EFFECT_IDEMPOTENT_WRITE
            ]),
            vec![SCOPE_TOOLS_CALL, SCOPE_EFFECT_IDEMPOTENT_WRITE]
        );
        assert!(principal(&[SCOPE_ADMIN]).missing(KNOWN_SCOPES).is_empty());
        assert!(Caller::Local.missing(KNOWN_SCOPES).is_empty());
    }
}
