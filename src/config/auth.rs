//! `[auth]` and its `[[auth.jwt]]` issuers: the settings only. What the
//! files they name contain is read and checked by `auth`, which also
//! decides what a credential is worth; here a value is only well-formed.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde::Deserialize;

use super::keys::{self, AuthSettings, JwtLimits};
use super::settings::{self, Layers};
use super::{ConfigError, invalid_toml, require_absolute};

/// Most `[[auth.jwt]]` issuers a configuration may declare.
pub const MAX_JWT_ISSUERS: usize = 64;

/// The issuer every static token is given unless its entry names another;
/// reserved, so that no JWT issuer can mint owners of static tokens.
pub const STATIC_ISSUER: &str = "taskgate:static";

settings::choice! {
    /// Who acts as the local owner without a credential (`auth.local_owner`).
    pub enum LocalOwner {
        /// HTTP from a loopback address without `Authorization` (and stdio).
        Loopback = "loopback",
        /// Nobody over HTTP: loopback presents a credential too.
        Never = "never",
    }
}

/// A JWS algorithm an issuer may sign with. `none` has no variant: it can
/// never be allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum JwtAlgorithm {
    HS256,
    HS384,
    HS512,
    ES256,
    ES384,
    RS256,
    RS384,
    RS512,
    PS256,
    PS384,
    PS512,
    EdDSA,
}

impl JwtAlgorithm {
    const ALL: [JwtAlgorithm; 12] = [
        JwtAlgorithm::HS256,
        JwtAlgorithm::HS384,
        JwtAlgorithm::HS512,
        JwtAlgorithm::ES256,
        JwtAlgorithm::ES384,
        JwtAlgorithm::RS256,
        JwtAlgorithm::RS384,
        JwtAlgorithm::RS512,
        JwtAlgorithm::PS256,
        JwtAlgorithm::PS384,
        JwtAlgorithm::PS512,
        JwtAlgorithm::EdDSA,
    ];

    /// The name in a JWS header (RFC 7518).
    pub fn name(self) -> &'static str {
        match self {
            JwtAlgorithm::HS256 => "HS256",
            JwtAlgorithm::HS384 => "HS384",
            JwtAlgorithm::HS512 => "HS512",
            JwtAlgorithm::ES256 => "ES256",
            JwtAlgorithm::ES384 => "ES384",
            JwtAlgorithm::RS256 => "RS256",
            JwtAlgorithm::RS384 => "RS384",
            JwtAlgorithm::RS512 => "RS512",
            JwtAlgorithm::PS256 => "PS256",
            JwtAlgorithm::PS384 => "PS384",
            JwtAlgorithm::PS512 => "PS512",
            JwtAlgorithm::EdDSA => "EdDSA",
        }
    }

    pub fn from_name(name: &str) -> Option<JwtAlgorithm> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }

    /// A shared-secret (HMAC) algorithm.
    pub fn is_hmac(self) -> bool {
        matches!(
            self,
            JwtAlgorithm::HS256 | JwtAlgorithm::HS384 | JwtAlgorithm::HS512
        )
    }
}

/// Where a JWT's tenant comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TenantSource {
    /// A string claim of the token.
    Claim(String),
    /// One tenant for every token of the issuer.
    Fixed(String),
}

/// Where a JWT's scopes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScopeClaim {
    /// `scope`: one space-separated string (RFC 9068, RFC 8693).
    Scope,
    /// `scp`: an array of strings (Microsoft Entra, Okta).
    Scp,
}

/// One trusted issuer of JWT access tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtIssuer {
    /// The exact `iss`.
    pub issuer: String,
    pub jwks_file: Option<PathBuf>,
    pub hmac_secret_file: Option<PathBuf>,
    /// Accepted `aud` values (the configured resource by default).
    pub audiences: Vec<String>,
    pub algorithms: BTreeSet<JwtAlgorithm>,
    /// The `typ` the header must carry; `None` accepts any.
    pub require_typ: Option<String>,
    pub tenant: TenantSource,
    pub scope_claim: ScopeClaim,
    /// Its bounded keys.
    pub limits: JwtLimits,
    /// Listed as an authorization server in the protected resource metadata.
    pub advertise: bool,
}

impl AuthSettings {
    /// The issuers to list in the protected resource metadata.
    pub fn advertised_issuers(&self) -> impl Iterator<Item = &str> {
        self.jwt
            .iter()
            .filter(|j| j.advertise)
            .map(|j| j.issuer.as_str())
    }
}

/// The shape of an `[[auth.jwt]]` table, deserialised from the file's text
/// so that an unknown key or a value of the wrong type is named with its
/// line. Its bounded keys ([`keys::JWT_KEYS`]) are read from the table
/// through their definitions ([`JwtLimits`]); they are listed here only so
/// that the shape accepts them and checks their type.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawJwt {
    issuer: String,
    jwks_file: Option<PathBuf>,
    hmac_secret_file: Option<PathBuf>,
    audiences: Option<Vec<String>>,
    algorithms: Option<Vec<String>>,
    require_typ: Option<String>,
    tenant_claim: Option<String>,
    tenant: Option<String>,
    scope_claim: Option<String>,
    #[allow(dead_code, reason = "read through JWT_MAX_TOKEN_LIFETIME_SECS")]
    max_token_lifetime_secs: Option<u64>,
    #[allow(dead_code, reason = "read through JWT_LEEWAY_SECS")]
    leeway_secs: Option<u64>,
    advertise: Option<bool>,
}

/// Only `[auth] jwt`, the rest of the file being checked key by key.
#[derive(Debug, Default, Deserialize)]
struct RawFile {
    #[serde(default)]
    auth: RawAuth,
}

#[derive(Debug, Default, Deserialize)]
struct RawAuth {
    #[serde(default)]
    jwt: Vec<RawJwt>,
}

/// The `[[auth.jwt]]` tables of a file, deserialised from its text so that
/// an error in one points at its line.
pub(super) fn raw_issuers(origin: &str, text: &str) -> Result<Vec<RawJwt>, ConfigError> {
    toml::from_str::<RawFile>(text)
        .map(|f| f.auth.jwt)
        .map_err(|e| invalid_toml(origin, text, &e))
}

const DEFAULT_ALGORITHMS: [JwtAlgorithm; 3] = [
    JwtAlgorithm::EdDSA,
    JwtAlgorithm::ES256,
    JwtAlgorithm::RS256,
];
const DEFAULT_TYP: &str = "at+jwt";

/// `[auth]` (its keys read from the layers already) with its issuers from
/// their `[[auth.jwt]]` tables: `None` when no credential is configured.
/// Every key is checked either way, so a wrong value is refused before it
/// would matter.
pub(super) fn settings(
    mut auth: AuthSettings,
    raw_jwt: Vec<(RawJwt, toml::Table)>,
    origin: &str,
) -> Result<Option<AuthSettings>, ConfigError> {
    super::at_most(
        raw_jwt.len(),
        MAX_JWT_ISSUERS,
        "[[auth.jwt]] issuers",
        origin,
    )?;
    for (raw, table) in raw_jwt {
        let issuer = issuer_settings(raw, &table, auth.resource.as_deref(), origin)?;
        if auth.jwt.iter().any(|j| j.issuer == issuer.issuer) {
            return Err(ConfigError::Invalid {
                origin: format!("{origin}: [[auth.jwt]] {:?}", issuer.issuer),
                message: "declared twice; each issuer has one table".into(),
            });
        }
        auth.jwt.push(issuer);
    }
    if auth.tokens_file.is_none() && auth.jwt.is_empty() {
        if auth.local_owner == LocalOwner::Never {
            return Err(ConfigError::Invalid {
                origin: origin.to_string(),
                message: format!(
                    "{} = \"never\" but no credential is configured, so nobody could call over HTTP; set {} or declare an [[auth.jwt]] issuer",
                    keys::AUTH_LOCAL_OWNER.dotted(),
                    keys::AUTH_TOKENS_FILE.dotted()
                ),
            });
        }
        return Ok(None);
    }
    Ok(Some(auth))
}

fn issuer_settings(
    raw: RawJwt,
    table: &toml::Table,
    resource: Option<&str>,
    origin: &str,
) -> Result<JwtIssuer, ConfigError> {
    let at = format!("{origin}: [[auth.jwt]] {:?}", raw.issuer);
    let bad = |message: String| ConfigError::Invalid {
        origin: at.clone(),
        message,
    };
    if raw.issuer.is_empty() || raw.issuer.len() > 2048 {
        return Err(bad(
            "issuer must be 1-2048 characters, the exact `iss`".into()
        ));
    }
    if raw.issuer == STATIC_ISSUER {
        return Err(bad(format!(
            "{STATIC_ISSUER:?} is the issuer of static tokens and cannot be a JWT issuer"
        )));
    }
    for (key, path) in [
        ("jwks_file", &raw.jwks_file),
        ("hmac_secret_file", &raw.hmac_secret_file),
    ] {
        if let Some(path) = path {
            require_absolute(
                format!("auth.jwt.{key}"),
                path,
                format!("{origin}: [[auth.jwt]] {:?}", raw.issuer),
            )?;
        }
    }
    let audiences = match (&raw.audiences, resource) {
        (Some(list), _) if list.is_empty() => {
            return Err(bad(
                "audiences is empty; list at least one `aud` value".into()
            ));
        }
        (Some(list), _) => list.clone(),
        (None, Some(resource)) => vec![resource.to_string()],
        (None, None) => {
            return Err(bad(format!(
                "no audience: set {} (this server's canonical URI) or the issuer's audiences",
                keys::AUTH_RESOURCE.dotted()
            )));
        }
    };
    let mut algorithms = BTreeSet::new();
    match &raw.algorithms {
        None => algorithms.extend(DEFAULT_ALGORITHMS),
        Some(names) if names.is_empty() => {
            return Err(bad("algorithms is empty; allow at least one".into()));
        }
        Some(names) => {
            for name in names {
                if name.eq_ignore_ascii_case("none") {
                    return Err(bad(
                        "algorithm \"none\" is never accepted: an unsigned token proves nothing"
                            .into(),
                    ));
                }
                let Some(alg) = JwtAlgorithm::from_name(name) else {
                    return Err(bad(format!(
                        "unknown algorithm {name:?}; the algorithms are {}",
                        JwtAlgorithm::ALL.map(JwtAlgorithm::name).join(", ")
                    )));
                };
                algorithms.insert(alg);
            }
        }
    }
    let hmac = algorithms.iter().any(|a| a.is_hmac());
    let asymmetric = algorithms.iter().any(|a| !a.is_hmac());
    // A shared secret and public keys never mix in one issuer: a verifier
    // that accepts both is how a public key ends up used as an HMAC secret.
    if hmac && asymmetric {
        return Err(bad(
            "algorithms mixes HS* with public-key algorithms; declare a second issuer table instead"
                .into(),
        ));
    }
    if hmac && raw.hmac_secret_file.is_none() {
        return Err(bad(
            "HS256/HS384/HS512 need hmac_secret_file (a shared secret); without one only public-key algorithms are allowed".into(),
        ));
    }
    if !hmac && raw.hmac_secret_file.is_some() {
        return Err(bad(
            "hmac_secret_file is set but algorithms allows no HS* algorithm".into(),
        ));
    }
    if asymmetric && raw.jwks_file.is_none() {
        return Err(bad(
            "jwks_file is required: the issuer's public keys as a JWKS document".into(),
        ));
    }
    if hmac && raw.jwks_file.is_some() {
        return Err(bad(
            "jwks_file is set but algorithms allows only HS* (shared secret)".into(),
        ));
    }
    let tenant = match (raw.tenant_claim, raw.tenant) {
        (Some(claim), None) if !claim.is_empty() => TenantSource::Claim(claim),
        (None, Some(tenant)) if !tenant.is_empty() => TenantSource::Fixed(tenant),
        (Some(_), Some(_)) => {
            return Err(bad("set tenant_claim or tenant, not both".into()));
        }
        _ => {
            return Err(bad(
                "no tenant: set tenant_claim (the claim naming the tenant) or tenant (one fixed tenant)".into(),
            ));
        }
    };
    let scope_claim = match raw.scope_claim.as_deref() {
        None | Some("scope") => ScopeClaim::Scope,
        Some("scp") => ScopeClaim::Scp,
        Some(other) => {
            return Err(bad(format!(
                "scope_claim = {other:?} is not one of scope, scp"
            )));
        }
    };
    let require_typ = match raw.require_typ {
        None => Some(DEFAULT_TYP.to_string()),
        Some(t) if t.is_empty() => None,
        Some(t) => Some(t),
    };
    if let Some(a) = audiences.iter().find(|a| a.is_empty()) {
        return Err(bad(format!("audience {a:?} is empty")));
    }
    // The table's origin names the issuer, so a key is named alone.
    let limits = JwtLimits::load(&Layers::table(
        keys::JWT_KEYS,
        table,
        &Layers::default(),
        &at,
        String::new(),
    ))?;
    Ok(JwtIssuer {
        limits,
        issuer: raw.issuer,
        jwks_file: raw.jwks_file,
        hmac_secret_file: raw.hmac_secret_file,
        audiences,
        algorithms,
        require_typ,
        tenant,
        scope_claim,
        advertise: raw.advertise.unwrap_or(false),
    })
}
