//! JWT access tokens (RFC 9068), checked offline: the issuer's public keys
//! come from a local JWKS file (or its shared secret from a file), read and
//! validated with the rest of the credential set.
//!
//! The signature is verified by `jsonwebtoken` with exactly the header's
//! algorithm, after that algorithm was found in the issuer's allow-list and
//! the key chosen fits it; every claim is then checked here, against the
//! caller's clock, so that tests can move time.

use std::collections::BTreeSet;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

use super::files::{self, Holds};
use super::{AuthError, KNOWN_SCOPES, Principal, Rejection};
use crate::config::{JwtAlgorithm, JwtIssuer, ScopeClaim, TenantSource};

/// Most keys one JWKS file may hold.
pub const MAX_KEYS: usize = 64;
/// Shortest shared secret for HS*: as long as the hash (RFC 7518 §3.2).
const MIN_SECRET_BYTES: usize = 32;
/// JWK members that only a private or symmetric key has (RFC 7518 §6).
const PRIVATE_MEMBERS: [&str; 7] = ["d", "p", "q", "dp", "dq", "qi", "k"];
/// Longest token looked at; a bigger one is refused before decoding.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

fn algorithm(a: JwtAlgorithm) -> Algorithm {
    match a {
        JwtAlgorithm::HS256 => Algorithm::HS256,
        JwtAlgorithm::HS384 => Algorithm::HS384,
        JwtAlgorithm::HS512 => Algorithm::HS512,
        JwtAlgorithm::ES256 => Algorithm::ES256,
        JwtAlgorithm::ES384 => Algorithm::ES384,
        JwtAlgorithm::RS256 => Algorithm::RS256,
        JwtAlgorithm::RS384 => Algorithm::RS384,
        JwtAlgorithm::RS512 => Algorithm::RS512,
        JwtAlgorithm::PS256 => Algorithm::PS256,
        JwtAlgorithm::PS384 => Algorithm::PS384,
        JwtAlgorithm::PS512 => Algorithm::PS512,
        JwtAlgorithm::EdDSA => Algorithm::EdDSA,
    }
}

/// One verification key of an issuer.
struct Key {
    kid: Option<String>,
    /// The JWK's own `alg`, when it names one: the key is used only with it.
    alg: Option<String>,
    family: jsonwebtoken::AlgorithmFamily,
    key: DecodingKey,
}

/// One trusted issuer, its keys loaded.
pub struct Issuer {
    pub settings: JwtIssuer,
    keys: Vec<Key>,
}

impl Issuer {
    pub fn load(settings: &JwtIssuer) -> Result<Issuer, AuthError> {
        let mut keys = Vec::new();
        if let Some(path) = &settings.jwks_file {
            let text = files::read(path, "JWKS file", "auth.jwt.jwks_file", Holds::Public)?;
            let invalid = |message: String| AuthError::Invalid {
                path: path.clone(),
                message,
            };
            let set: JwkSet = serde_json::from_str(&text)
                .map_err(|e| invalid(format!("not a JWKS document ({{\"keys\": [...]}}): {e}")))?;
            // The JWK type drops members it does not know, private ones
            // included: look for them in the raw document. A private key
            // in a world-readable file is a leak to stop at once.
            if let Ok(raw) = serde_json::from_str::<Value>(&text)
                && let Some(keys) = raw.get("keys").and_then(Value::as_array)
                && let Some(i) = keys
                    .iter()
                    .position(|k| PRIVATE_MEMBERS.iter().any(|m| k.get(m).is_some()))
            {
                return Err(invalid(format!(
                    "key {} holds private key material; give the issuer's public keys only (and replace the leaked key)",
                    i + 1
                )));
            }
            if set.keys.is_empty() {
                return Err(invalid("holds no key".into()));
            }
            if set.keys.len() > MAX_KEYS {
                return Err(invalid(format!(
                    "holds {} keys; at most {MAX_KEYS} are allowed",
                    set.keys.len()
                )));
            }
            for (i, jwk) in set.keys.iter().enumerate() {
                keys.push(key(jwk).map_err(|m| invalid(format!("key {}: {m}", i + 1)))?);
            }
            let mut kids = BTreeSet::new();
            for k in keys.iter().filter_map(|k| k.kid.as_deref()) {
                if !kids.insert(k) {
                    return Err(invalid(format!("kid {k:?} appears twice")));
                }
            }
            // A key must be usable with some allowed algorithm; otherwise
            // the file and the allow-list disagree and one of them is wrong.
            for (i, k) in keys.iter().enumerate() {
                let usable = settings.algorithms.iter().any(|a| {
                    algorithm(*a).family() == k.family
                        && k.alg.as_deref().is_none_or(|x| x == a.name())
                });
                if !usable {
                    return Err(invalid(format!(
                        "key {} fits none of the issuer's algorithms ({})",
                        i + 1,
                        settings
                            .algorithms
                            .iter()
                            .map(|a| a.name())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                }
            }
        }
        if let Some(path) = &settings.hmac_secret_file {
            let mut secret = files::read_bytes(
                path,
                "HMAC secret file",
                "auth.jwt.hmac_secret_file",
                Holds::Secrets,
            )?;
            // Files written by `echo` end in a newline that is not part of
            // the secret.
            if secret.last() == Some(&b'\n') {
                secret.pop();
            }
            if secret.len() < MIN_SECRET_BYTES {
                return Err(AuthError::Invalid {
                    path: path.clone(),
                    message: format!(
                        "the secret is {} bytes; at least {MIN_SECRET_BYTES} are needed",
                        secret.len()
                    ),
                });
            }
            keys.push(Key {
                kid: None,
                alg: None,
                family: jsonwebtoken::AlgorithmFamily::Hmac,
                key: DecodingKey::from_secret(&secret).map_err(|e| AuthError::Invalid {
                    path: path.clone(),
                    message: format!("unusable secret: {e}"),
                })?,
            });
        }
        Ok(Issuer {
            settings: settings.clone(),
            keys,
        })
    }

    pub fn key_count(&self) -> usize {
        self.keys.len()
    }

    /// Verifies a token already found to name this issuer. Revocation is
    /// the caller's; the returned `iat` and `jti` serve it.
    pub fn verify(
        &self,
        token: &str,
        header: &RawHeader,
        now_ms: i64,
    ) -> Result<Verified, Rejection> {
        let s = &self.settings;
        let named = JwtAlgorithm::from_name(&header.alg)
            .filter(|a| s.algorithms.contains(a))
            .ok_or(Rejection::AlgorithmNotAllowed)?;
        let alg = algorithm(named);
        if let Some(want) = &s.require_typ {
            let typ = header.typ.as_deref().ok_or(Rejection::WrongType)?;
            let bare = typ
                .get(..12)
                .filter(|p| p.eq_ignore_ascii_case("application/"))
                .map_or(typ, |_| &typ[12..]);
            if !bare.eq_ignore_ascii_case(want) {
                return Err(Rejection::WrongType);
            }
        }
        let fits = |k: &&Key| {
            k.family == alg.family() && k.alg.as_deref().is_none_or(|a| a == named.name())
        };
        let key = match &header.kid {
            Some(kid) => self
                .keys
                .iter()
                .filter(|k| k.kid.as_deref() == Some(kid.as_str()))
                .find(fits),
            None => {
                let mut fitting = self.keys.iter().filter(fits);
                match (fitting.next(), fitting.next()) {
                    (Some(only), None) => Some(only),
                    _ => None,
                }
            }
        }
        .ok_or(Rejection::UnknownKey)?;

        let mut validation = Validation::new(alg);
        // Time, issuer and audience are checked below against the
        // caller's clock; the library checks the signature only.
        validation.required_spec_claims.clear();
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.validate_aud = false;
        validation.leeway = 0;
        let data = jsonwebtoken::decode::<Map<String, Value>>(token, &key.key, &validation)
            .map_err(|e| match e.kind() {
                ErrorKind::InvalidSignature => Rejection::BadSignature,
                ErrorKind::InvalidAlgorithm => Rejection::AlgorithmNotAllowed,
                ErrorKind::InvalidToken
                | ErrorKind::Base64(_)
                | ErrorKind::Json(_)
                | ErrorKind::Utf8(_) => Rejection::Malformed,
                _ => Rejection::BadSignature,
            })?;
        self.claims(&data.claims, now_ms)
    }

    fn claims(&self, c: &Map<String, Value>, now_ms: i64) -> Result<Verified, Rejection> {
        let s = &self.settings;
        if c.get("iss").and_then(Value::as_str) != Some(s.issuer.as_str()) {
            return Err(Rejection::UnknownIssuer);
        }
        let audience_ok = match c.get("aud") {
            Some(Value::String(a)) => s.audiences.iter().any(|x| x == a),
            Some(Value::Array(list)) => list
                .iter()
                .filter_map(Value::as_str)
                .any(|a| s.audiences.iter().any(|x| x == a)),
            _ => false,
        };
        if !audience_ok {
            return Err(Rejection::WrongAudience);
        }
        let leeway = i64::try_from(s.limits.leeway_secs).unwrap_or(0) * 1000;
        let exp = numeric_date(c, "exp")?.ok_or(Rejection::BadClaims)?;
        if now_ms >= exp.saturating_add(leeway) {
            return Err(Rejection::Expired);
        }
        if let Some(nbf) = numeric_date(c, "nbf")?
            && now_ms.saturating_add(leeway) < nbf
        {
            return Err(Rejection::NotYetValid);
        }
        let iat = numeric_date(c, "iat")?;
        if let Some(iat) = iat
            && now_ms.saturating_add(leeway) < iat
        {
            return Err(Rejection::NotYetValid);
        }
        let max = i64::try_from(s.limits.max_token_lifetime_secs).unwrap_or(i64::MAX / 1000) * 1000;
        if exp.saturating_sub(iat.unwrap_or(now_ms)) > max {
            return Err(Rejection::LifetimeTooLong);
        }
        let text = |name: &str| -> Result<String, Rejection> {
            match c.get(name) {
                Some(Value::String(v)) if !v.is_empty() && v.len() <= 1024 => Ok(v.clone()),
                _ => Err(Rejection::BadClaims),
            }
        };
        let subject = text("sub")?;
        let tenant = match &s.tenant {
            TenantSource::Claim(name) => text(name)?,
            TenantSource::Fixed(t) => t.clone(),
        };
        let jti = match c.get("jti") {
            None => None,
            Some(Value::String(j)) if j.len() <= 1024 => Some(j.clone()),
            Some(_) => return Err(Rejection::BadClaims),
        };
        let granted: Vec<&str> = match (s.scope_claim, c.get(scope_claim_name(s.scope_claim))) {
            (_, None) => Vec::new(),
            (_, Some(Value::String(list))) => list.split(' ').collect(),
            (ScopeClaim::Scp, Some(Value::Array(list))) => {
                list.iter().filter_map(Value::as_str).collect()
            }
            _ => return Err(Rejection::BadClaims),
        };
        // Only scopes taskgate knows matter; an identity provider adds its
        // own (openid, profile) that mean nothing here.
        let scopes = granted
            .into_iter()
            .filter(|g| KNOWN_SCOPES.contains(g))
            .map(str::to_string)
            .collect();
        let nbf = numeric_date(c, "nbf")?;
        let valid_from_ms = [
            nbf.map(|n| n.saturating_sub(leeway)),
            iat.map(|i| i.saturating_sub(leeway)),
            // Without iat the lifetime is counted from now.
            iat.is_none().then(|| exp.saturating_sub(max)),
        ]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(i64::MIN);
        Ok(Verified {
            principal: Principal {
                issuer: s.issuer.clone(),
                tenant,
                subject,
                scopes,
                credential_id: jti.clone().unwrap_or_default(),
                expires_ms: Some(exp),
            },
            jti,
            iat_ms: iat,
            valid_from_ms,
            valid_until_ms: exp.saturating_add(leeway),
        })
    }
}

fn scope_claim_name(c: ScopeClaim) -> &'static str {
    match c {
        ScopeClaim::Scope => "scope",
        ScopeClaim::Scp => "scp",
    }
}

/// A NumericDate claim (seconds, possibly fractional) in milliseconds.
fn numeric_date(c: &Map<String, Value>, name: &str) -> Result<Option<i64>, Rejection> {
    match c.get(name) {
        None => Ok(None),
        Some(v) => {
            let secs = v.as_f64().ok_or(Rejection::BadClaims)?;
            if !(0.0..=1.0e13).contains(&secs) {
                return Err(Rejection::BadClaims);
            }
            Ok(Some((secs * 1000.0) as i64))
        }
    }
}

/// A key from a JWK: public keys only, of a kind `jsonwebtoken` verifies.
fn key(jwk: &Jwk) -> Result<Key, String> {
    use jsonwebtoken::jwk::AlgorithmParameters;
    let family = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => jsonwebtoken::AlgorithmFamily::Rsa,
        AlgorithmParameters::EllipticCurve(_) => jsonwebtoken::AlgorithmFamily::Ec,
        AlgorithmParameters::OctetKeyPair(_) => jsonwebtoken::AlgorithmFamily::Ed,
        // A shared secret in a JWKS would be served as if public: refused;
        // HS* secrets come from hmac_secret_file.
        AlgorithmParameters::OctetKey(_) => {
            return Err("symmetric (kty \"oct\") keys are not accepted in a JWKS file; use hmac_secret_file".into());
        }
        _ => return Err("unsupported key type".into()),
    };
    if let Some(jsonwebtoken::jwk::PublicKeyUse::Encryption) = jwk.common.public_key_use {
        return Err("an encryption key (use \"enc\") cannot verify signatures".into());
    }
    let alg = match jwk.common.key_algorithm {
        None => None,
        Some(a) => {
            let name = format!("{a:?}");
            if JwtAlgorithm::from_name(&name).is_none() {
                return Err(format!(
                    "alg {name} is not a signature algorithm taskgate accepts"
                ));
            }
            Some(name)
        }
    };
    let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("unusable key: {e}"))?;
    Ok(Key {
        kid: jwk.common.key_id.clone(),
        alg,
        family,
        key,
    })
}

/// The parts of a JWS header read before anything is verified.
#[derive(Debug)]
pub struct RawHeader {
    pub alg: String,
    pub typ: Option<String>,
    pub kid: Option<String>,
}

/// What a verified token gave, beside the principal: revocation inputs.
#[derive(Debug, Clone)]
pub struct Verified {
    pub principal: Principal,
    pub jti: Option<String>,
    pub iat_ms: Option<i64>,
    /// The times (Unix ms) between which the same token verifies again:
    /// from when `nbf`, `iat` and the lifetime bound allow it, until `exp`
    /// (both with the leeway). What a cache of verified tokens checks.
    pub valid_from_ms: i64,
    pub valid_until_ms: i64,
}

/// The unverified header and `iss` of a three-part token: enough to pick
/// the issuer and refuse `alg: none` before any key is touched.
pub fn peek(token: &str) -> Result<(RawHeader, String), Rejection> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(Rejection::Malformed);
    }
    let mut parts = token.split('.');
    let (Some(h), Some(p), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Rejection::Malformed);
    };
    let json = |part: &str| -> Result<Map<String, Value>, Rejection> {
        let bytes = URL_SAFE_NO_PAD
            .decode(part)
            .map_err(|_| Rejection::Malformed)?;
        serde_json::from_slice(&bytes).map_err(|_| Rejection::Malformed)
    };
    let header = json(h)?;
    let alg = header
        .get("alg")
        .and_then(Value::as_str)
        .ok_or(Rejection::Malformed)?;
    if alg.eq_ignore_ascii_case("none") {
        return Err(Rejection::AlgorithmNotAllowed);
    }
    let string = |k: &str| -> Result<Option<String>, Rejection> {
        match header.get(k) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(Rejection::Malformed),
        }
    };
    let raw = RawHeader {
        alg: alg.to_string(),
        typ: string("typ")?,
        kid: string("kid")?,
    };
    let claims = json(p)?;
    let iss = match claims.get("iss") {
        Some(Value::String(s)) => s.clone(),
        _ => return Err(Rejection::UnknownIssuer),
    };
    Ok((raw, iss))
}
