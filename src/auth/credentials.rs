//! One credential set: the settings, the static tokens, the JWT issuers
//! with their keys and the revocations, read and validated together. It is
//! never changed once built; a reload builds a new one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sha2::Digest as _;

use super::jwt::{self, Issuer};
use super::revocation::Revocations;
use super::tokens::{self, StaticTokens};
use super::{AuthError, Principal, Rejection, ReloadSummary};
use crate::config::AuthSettings;

pub struct CredentialSet {
    settings: Arc<AuthSettings>,
    tokens: StaticTokens,
    issuers: HashMap<String, Issuer>,
    revocations: Revocations,
    /// JWTs whose signature and claims verified, by the SHA-256 of the
    /// token (never the token): a request presenting one again skips the
    /// signature check while its time window holds. The revocations are
    /// checked on every request all the same, and a reload (new keys, new
    /// revocations) builds a new set with an empty cache.
    verified: Mutex<HashMap<[u8; 32], jwt::Verified>>,
}

/// The most verified JWTs remembered; past it the expired ones go, and if
/// none has, all of them.
pub const MAX_CACHED_JWTS: usize = 4096;

impl CredentialSet {
    /// Reads every file the settings name; any problem refuses the whole set.
    pub fn load(settings: &AuthSettings) -> Result<CredentialSet, AuthError> {
        let tokens = match &settings.tokens_file {
            Some(path) => StaticTokens::load(path)?,
            None => StaticTokens::default(),
        };
        let mut issuers = HashMap::new();
        for s in &settings.jwt {
            issuers.insert(s.issuer.clone(), Issuer::load(s)?);
        }
        // A static token claiming a JWT issuer's name would make its holder
        // the same owner as that issuer's subject: refused.
        if let Some(t) = tokens
            .entries()
            .iter()
            .find(|t| issuers.contains_key(&t.issuer))
            && let Some(path) = &settings.tokens_file
        {
            return Err(AuthError::Invalid {
                path: path.clone(),
                message: format!(
                    "token {:?} names issuer {:?}, which is a configured JWT issuer; static tokens keep their own issuer",
                    t.id, t.issuer
                ),
            });
        }
        let revocations = match &settings.revocations_file {
            Some(path) => Revocations::load(path)?,
            None => Revocations::default(),
        };
        Ok(CredentialSet {
            settings: Arc::new(settings.clone()),
            tokens,
            issuers,
            revocations,
            verified: Mutex::new(HashMap::new()),
        })
    }

    /// Verified JWTs remembered now (at most [`MAX_CACHED_JWTS`]).
    pub fn cached_jwts(&self) -> usize {
        self.verified
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// The verified JWT the cache holds for `key`, if it verifies at `now_ms`.
    fn cached(&self, key: &[u8; 32], now_ms: i64) -> Option<jwt::Verified> {
        let cache = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        cache
            .get(key)
            .filter(|v| v.valid_from_ms <= now_ms && now_ms < v.valid_until_ms)
            .cloned()
    }

    fn remember(&self, key: [u8; 32], verified: &jwt::Verified, now_ms: i64) {
        let mut cache = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= MAX_CACHED_JWTS {
            cache.retain(|_, v| now_ms < v.valid_until_ms);
            if cache.len() >= MAX_CACHED_JWTS {
                cache.clear();
            }
        }
        cache.insert(key, verified.clone());
    }

    pub fn settings(&self) -> Arc<AuthSettings> {
        Arc::clone(&self.settings)
    }

    pub fn summary(&self) -> ReloadSummary {
        ReloadSummary {
            tokens: self.tokens.len(),
            issuers: self.issuers.len(),
            keys: self.issuers.values().map(Issuer::key_count).sum(),
            revocations: self.revocations.count(),
        }
    }

    /// The principal a bearer token stands for. The kind of credential is
    /// chosen by the token's shape alone: a `tgk_` secret is only ever
    /// looked up, a three-part token only ever verified as a JWT.
    pub fn authenticate(&self, token: &str, now_ms: i64) -> Result<Principal, Rejection> {
        if tokens::is_static_shape(token) {
            let (entry, principal) = self.tokens.check(token, now_ms)?;
            if self.revocations.token(&entry.id) {
                return Err(Rejection::Revoked);
            }
            return Ok(principal);
        }
        if token.bytes().filter(|b| *b == b'.').count() != 2 {
            return Err(Rejection::Malformed);
        }
        let key: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
        let verified = match self.cached(&key, now_ms) {
            Some(v) => v,
            None => {
                let (header, iss) = jwt::peek(token)?;
                let issuer = self.issuers.get(&iss).ok_or(Rejection::UnknownIssuer)?;
                let v = issuer.verify(token, &header, now_ms)?;
                self.remember(key, &v, now_ms);
                v
            }
        };
        let p = &verified.principal;
        if self.revocations.jwt(
            &p.issuer,
            verified.jti.as_deref(),
            &p.subject,
            verified.iat_ms,
        ) {
            return Err(Rejection::Revoked);
        }
        Ok(verified.principal)
    }
}
