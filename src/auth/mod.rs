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
//!
//! Owns who is calling. A JWT that verified is remembered in its credential set
//! by the SHA-256 of the token, with the time window in which it verifies again
//! (`MAX_CACHED_JWTS` 4,096; expired ones dropped first when full, else all): a
//! request presenting it again skips the signature check, never the revocation
//! check, and a reload's new set starts empty. `Principal` (issuer, tenant,
//! subject, scopes, credential id, expiry) from either credential kind, chosen
//! by the token's shape alone (`tgk_` + 43 base64url characters: a static
//! token, looked up by the SHA-256 of the text; two dots: a JWT, verified;
//! anything else refused); `Caller` (`Local` or `Authenticated`); the scope
//! names and the rule that `admin` implies all. `tokens.rs` (the tokens file,
//! secrets, `taskgate token new|list|revoke`), `jwt.rs` (offline JWKS per
//! issuer; the header's `alg` must be in the issuer's allow-list and fit the
//! key, `none` never; claims checked against the caller's clock),
//! `revocation.rs` (by token id, by issuer and `jti`, by issuer, subject and
//! `issued_before`), `files.rs` (a credential file is regular, owned by root or
//! us, never writable by others, and never readable by others when it holds
//! secrets: 77; bad content: 78), `credentials.rs` (one `CredentialSet`, built
//! and validated whole). `Authenticator` holds the current set and swaps it
//! whole on reload (`auth::reload`), so an invalid file keeps the old set;
//! turning authentication on or off is refused by a reload.
//! `startup::effective` builds the set, so `serve`, `check` and a reload refuse
//! the same files. Knows no protocol library, store or task (the owner digest
//! is computed by `tasks`); raw secrets and tokens are never written to disk,
//! log or error text (a `Rejection` names a reason, never the token).

mod credentials;
pub use credentials::MAX_CACHED_JWTS;
mod files;
mod jwt;
mod revocation;
pub mod tokens;

use std::collections::BTreeSet;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use thiserror::Error;

use crate::config::{AuthSettings, Config};
use crate::exit::{Classify, ExitClass};

pub use crate::config::{LocalOwner, STATIC_ISSUER};
pub use credentials::CredentialSet;

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
/// Reading `/metrics` with a credential.
pub const SCOPE_METRICS_READ: &str = "metrics:read";
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
    SCOPE_METRICS_READ,
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

/// Why a presented credential was not accepted: for the debug log and
/// tests only. The HTTP layer answers every one of them with the same
/// words. No variant carries any part of the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// Neither a static token (`tgk_…`) nor a JWT (three parts).
    Malformed,
    /// A static token whose hash is in no entry.
    UnknownToken,
    /// Past its `expires` or `exp` (leeway included).
    Expired,
    /// `nbf` (or `iat`) in the future, beyond the leeway.
    NotYetValid,
    /// Revoked in the tokens file or the revocations file.
    Revoked,
    /// A JWT whose `iss` is no configured issuer.
    UnknownIssuer,
    /// The header's `alg` is `none` or not in the issuer's allow-list.
    AlgorithmNotAllowed,
    /// The header's `typ` is not the one the issuer requires.
    WrongType,
    /// No key of the issuer has the header's `kid` (or fits its `alg`).
    UnknownKey,
    /// The signature does not verify with the issuer's key.
    BadSignature,
    /// `aud` is missing or names none of the accepted audiences.
    WrongAudience,
    /// `exp` minus `iat` (or now) exceeds the issuer's maximum lifetime.
    LifetimeTooLong,
    /// A claim taskgate needs is missing or of the wrong type.
    BadClaims,
}

impl Rejection {
    /// The reason as a metric label: lower case, no spaces, fixed.
    pub fn label(self) -> &'static str {
        match self {
            Rejection::Malformed => "malformed_token",
            Rejection::UnknownToken => "unknown_token",
            Rejection::Expired => "expired",
            Rejection::NotYetValid => "not_yet_valid",
            Rejection::Revoked => "revoked",
            Rejection::UnknownIssuer => "unknown_issuer",
            Rejection::AlgorithmNotAllowed => "algorithm_not_allowed",
            Rejection::WrongType => "wrong_type",
            Rejection::UnknownKey => "unknown_key",
            Rejection::BadSignature => "bad_signature",
            Rejection::WrongAudience => "wrong_audience",
            Rejection::LifetimeTooLong => "lifetime_too_long",
            Rejection::BadClaims => "bad_claims",
        }
    }

    /// A short, fixed reason.
    pub fn reason(self) -> &'static str {
        match self {
            Rejection::Malformed => "not a token taskgate issues or accepts",
            Rejection::UnknownToken => "unknown static token",
            Rejection::Expired => "expired",
            Rejection::NotYetValid => "not yet valid",
            Rejection::Revoked => "revoked",
            Rejection::UnknownIssuer => "issuer not trusted",
            Rejection::AlgorithmNotAllowed => "algorithm not allowed",
            Rejection::WrongType => "wrong token type (typ)",
            Rejection::UnknownKey => "no such key for the issuer",
            Rejection::BadSignature => "bad signature",
            Rejection::WrongAudience => "wrong or missing audience",
            Rejection::LifetimeTooLong => "lifetime over the issuer's maximum",
            Rejection::BadClaims => "missing or malformed claims",
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.reason())
    }
}

/// A credential file or setting that cannot be used: refuses a start or a
/// reload.
#[derive(Debug, Error)]
pub enum AuthError {
    #[error("{what} {path:?} does not exist; create it or fix {key}")]
    Missing {
        what: &'static str,
        path: PathBuf,
        key: String,
    },
    #[error("{what} {path:?} cannot be read: {source}")]
    Unreadable {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what} {path:?} {why}")]
    Unsafe {
        what: &'static str,
        path: PathBuf,
        why: String,
    },
    #[error("{path:?}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error(
        "authentication cannot be turned {0} by a reload (running calls were admitted under the other rule); restart the service to apply it"
    )]
    OnOff(&'static str),
    #[error("{path:?} has no token with id {id:?}; `taskgate token list` shows the ids")]
    NoSuchToken { path: PathBuf, id: String },
    #[error("{0}")]
    Other(String),
}

impl Classify for AuthError {
    fn exit_class(&self) -> ExitClass {
        match self {
            AuthError::Unreadable { source, .. }
                if source.kind() == std::io::ErrorKind::PermissionDenied =>
            {
                ExitClass::UnsafePath
            }
            AuthError::Unreadable { .. } => ExitClass::Io,
            AuthError::Unsafe { .. } => ExitClass::UnsafePath,
            AuthError::NoSuchToken { .. } => ExitClass::Usage,
            AuthError::Missing { .. }
            | AuthError::Invalid { .. }
            | AuthError::OnOff(_)
            | AuthError::Other(_) => ExitClass::Config,
        }
    }
}

/// What a successful (re)load holds, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReloadSummary {
    /// Static tokens, revoked ones included.
    pub tokens: usize,
    pub issuers: usize,
    /// Public keys over all JWKS files (a shared secret counts as one).
    pub keys: usize,
    /// Entries of the revocations file.
    pub revocations: usize,
}

impl fmt::Display for ReloadSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} static tokens, {} JWT issuers with {} keys, {} revocations",
            self.tokens, self.issuers, self.keys, self.revocations
        )
    }
}

/// Checks bearer tokens against the current credential set. Shared in an
/// `Arc`; a reload swaps the whole set at once, so a request sees the old
/// set or the new one, never a mixture.
pub struct Authenticator {
    current: RwLock<Arc<CredentialSet>>,
}

impl fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authenticator")
            .field("summary", &self.set().summary())
            .finish()
    }
}

impl Authenticator {
    /// The authenticator a configuration asks for, every file read and
    /// validated; `None` when authentication is off (no credentials are
    /// configured).
    pub fn from_config(config: &Config) -> Result<Option<Authenticator>, AuthError> {
        let Some(settings) = &config.auth else {
            return Ok(None);
        };
        let set = CredentialSet::load(settings)?;
        Ok(Some(Authenticator {
            current: RwLock::new(Arc::new(set)),
        }))
    }

    fn set(&self) -> Arc<CredentialSet> {
        // A poisoned lock still holds a complete set: swaps replace the Arc
        // whole, so no writer can leave it half-changed.
        match self.current.read() {
            Ok(g) => Arc::clone(&g),
            Err(p) => Arc::clone(&p.into_inner()),
        }
    }

    /// Checks a bearer token (the text after `Bearer `) against the system
    /// clock.
    pub fn authenticate(&self, bearer_token: &str) -> Result<Principal, Rejection> {
        self.authenticate_at(bearer_token, now_ms())
    }

    /// [`Authenticator::authenticate`] at a given time (Unix milliseconds).
    pub fn authenticate_at(&self, bearer_token: &str, now_ms: i64) -> Result<Principal, Rejection> {
        self.set().authenticate(bearer_token, now_ms)
    }

    /// Verified JWTs the current set remembers (bounded by
    /// [`MAX_CACHED_JWTS`]).
    pub fn cached_jwts(&self) -> usize {
        self.set().cached_jwts()
    }

    /// The settings of the current set: local owner rule, realm, resource,
    /// advertised issuers.
    pub fn settings(&self) -> Arc<AuthSettings> {
        self.set().settings()
    }

    /// What the current set holds.
    pub fn summary(&self) -> ReloadSummary {
        self.set().summary()
    }

    /// Reads and validates a whole new set from `config` and swaps it in;
    /// on any error the current set stays. Refused when `config` turns
    /// authentication off (a restart does that).
    pub fn reload(&self, config: &Config) -> Result<ReloadSummary, AuthError> {
        let Some(settings) = &config.auth else {
            return Err(AuthError::OnOff("off"));
        };
        let set = CredentialSet::load(settings)?;
        Ok(self.install(set))
    }

    /// Swaps in a set already validated (by [`Authenticator::from_config`]
    /// in the same reload); returns what it holds.
    pub fn adopt(&self, other: Authenticator) -> ReloadSummary {
        let set = match other.current.into_inner() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        };
        let summary = set.summary();
        self.swap(set);
        summary
    }

    fn install(&self, set: CredentialSet) -> ReloadSummary {
        let summary = set.summary();
        self.swap(Arc::new(set));
        summary
    }

    fn swap(&self, set: Arc<CredentialSet>) {
        match self.current.write() {
            Ok(mut g) => *g = set,
            Err(p) => *p.into_inner() = set,
        }
    }
}

/// A reload's credential step, for the daemon's reload path: the running
/// authenticator (if authentication was on at start) takes the new
/// configuration's set. Turning authentication on or off is refused: it
/// changes who every running session acts as, which takes a restart.
pub fn reload(
    running: Option<&Authenticator>,
    new: &Config,
) -> Result<Option<ReloadSummary>, AuthError> {
    match (running, new.auth_enabled()) {
        (Some(auth), _) => auth.reload(new).map(Some),
        (None, true) => Err(AuthError::OnOff("on")),
        (None, false) => Ok(None),
    }
}

/// The system clock in Unix milliseconds.
pub fn now_ms() -> i64 {
    match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        // A clock before 1970 makes every credential look not yet valid or
        // long valid; treat it as the epoch.
        Err(_) => 0,
    }
}

/// A file holding a secret taskgate presents elsewhere (an upstream's
/// bearer credential), read under the rules of its own credential files:
/// regular, owned by root or this process, no access for others (77), at
/// most `files::MAX_FILE_BYTES` of UTF-8 (78). `key` names the setting.
pub fn read_secret_file(
    path: &std::path::Path,
    what: &'static str,
    key: &str,
) -> Result<String, AuthError> {
    files::read(path, what, key, files::Holds::Secrets)
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
