//! The credentials of the benchmark's authenticated phases, made fresh for
//! each run: a static token (a tokens file holding its hash) and a JWT
//! issuer (a generated Ed25519 key whose public half alone the daemon gets,
//! as a JWKS file) with one access token signed here. Each comes with the
//! `[auth]` section that makes the daemon require it: `local_owner =
//! "never"`, so that every request is authenticated.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

use jsonwebtoken::jwk::{Jwk, JwkSet, PublicKeyUse};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::json;

use crate::auth::tokens;

/// The audience the benchmark's JWTs name; never resolved or contacted.
const RESOURCE: &str = "https://taskgate-bench.invalid/mcp";
const ISSUER: &str = "https://issuer.taskgate-bench.invalid";
const KEY_ID: &str = "taskgate-bench-ed25519";
/// What a create and a poll need (the benchmark's tool is read-only).
const SCOPES: &[&str] = &["tools:call", "tasks:read"];
/// Seconds a benchmark JWT is valid: within the issuer's default maximum
/// lifetime (an hour), and longer than any run.
const TOKEN_LIFETIME_SECS: i64 = 3000;
/// The PKCS #8 v1 prefix of an Ed25519 private key (RFC 8410): the DER
/// that precedes its 32-byte seed.
const ED25519_PKCS8_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// An `[auth]` configuration and the bearer credential it accepts.
pub struct Credential {
    /// The configuration to append to the daemon's file.
    pub toml: String,
    /// Sent as `Authorization: Bearer …`.
    pub token: String,
}

/// A private file (0600), created new.
fn write_private(path: &Path, text: &str) -> Result<(), String> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// A path as a TOML string, quoted and escaped.
fn toml_path(path: &Path) -> Result<String, String> {
    let text = path
        .to_str()
        .ok_or_else(|| format!("{} is not UTF-8", path.display()))?;
    Ok(toml::Value::String(text.to_string()).to_string())
}

/// A static token in a tokens file in `dir`.
pub fn static_token(dir: &Path) -> Result<Credential, String> {
    let secret = tokens::new_secret().map_err(|e| e.to_string())?;
    let file = dir.join("bench-tokens.toml");
    let scopes = SCOPES
        .iter()
        .map(|s| format!("{s:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    write_private(
        &file,
        &format!(
            "[[token]]\nid = \"bench\"\nhash = \"{}\"\ntenant = \"bench\"\nsubject = \"bench\"\nscopes = [{scopes}]\n",
            tokens::hash_text(&secret)
        ),
    )?;
    Ok(Credential {
        toml: format!(
            "\n[auth]\nlocal_owner = \"never\"\ntokens_file = {}\n",
            toml_path(&file)?
        ),
        token: secret,
    })
}

/// A JWT issuer with a new Ed25519 key (its JWKS file in `dir`) and one
/// access token (RFC 9068) it signed.
pub fn jwt(dir: &Path) -> Result<Credential, String> {
    let mut der = ED25519_PKCS8_PREFIX.to_vec();
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| format!("no randomness from the system: {e}"))?;
    der.extend_from_slice(&seed);
    let key = EncodingKey::from_ed_der(&der);
    let mut jwk = Jwk::from_encoding_key(&key, Algorithm::EdDSA)
        .map_err(|e| format!("the generated Ed25519 key: {e}"))?;
    jwk.common.key_id = Some(KEY_ID.into());
    jwk.common.public_key_use = Some(PublicKeyUse::Signature);
    let jwks =
        serde_json::to_string(&JwkSet { keys: vec![jwk] }).map_err(|e| format!("the JWKS: {e}"))?;
    let file = dir.join("bench-jwks.json");
    write_private(&file, &jwks)?;

    let now = chrono::Utc::now().timestamp();
    let mut jti = [0u8; 8];
    getrandom::fill(&mut jti).map_err(|e| format!("no randomness from the system: {e}"))?;
    let mut header = Header::new(Algorithm::EdDSA);
    header.typ = Some("at+jwt".into());
    header.kid = Some(KEY_ID.into());
    let claims = json!({
        "iss": ISSUER,
        "sub": "bench",
        "aud": RESOURCE,
        "tid": "bench",
        "iat": now,
        "nbf": now,
        "exp": now + TOKEN_LIFETIME_SECS,
        "jti": jti.iter().map(|b| format!("{b:02x}")).collect::<String>(),
        "scope": SCOPES.join(" "),
    });
    let token = jsonwebtoken::encode(&header, &claims, &key)
        .map_err(|e| format!("signing the benchmark's JWT: {e}"))?;
    Ok(Credential {
        toml: format!(
            "\n[auth]\nlocal_owner = \"never\"\nresource = \"{RESOURCE}\"\n\n[[auth.jwt]]\n\
             issuer = \"{ISSUER}\"\njwks_file = {}\nalgorithms = [\"EdDSA\"]\ntenant_claim = \"tid\"\n",
            toml_path(&file)?
        ),
        token,
    })
}
