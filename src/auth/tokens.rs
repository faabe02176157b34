//! Static API tokens: the tokens file, the secret's shape, and the
//! operator's `taskgate token new|list|revoke`.
//!
//! A secret is `tgk_` and the unpadded base64url text of 32 random bytes
//! (43 characters, no dots, so it can never be taken for a JWT). The file
//! holds only `sha256:` and the hex SHA-256 of the whole secret text,
//! prefix included: the secret cannot be recovered from the file, and
//! 256 random bits need no slow hash.
//!
//! ```toml
//! [[token]]
//! id = "ci"                      # a label for logs and revocation, never the secret
//! hash = "sha256:…"
//! issuer = "taskgate:static"     # optional
//! tenant = "acme"
//! subject = "ci@acme"
//! scopes = ["tools:call", "tasks:read"]
//! expires = "2027-06-01T00:00:00Z"   # optional
//! revoked = false                # optional
//! ```

use std::collections::{BTreeSet, HashMap};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::files::{self, Holds};
use super::{AuthError, KNOWN_SCOPES, Principal, Rejection, STATIC_ISSUER};

/// The prefix of every static secret: recognisable in a leak report and by
/// secret scanners.
pub const SECRET_PREFIX: &str = "tgk_";
/// Base64url characters of a 32-byte secret without padding.
const SECRET_CHARS: usize = 43;
/// Most `[[token]]` entries a file may hold.
pub const MAX_TOKENS: usize = 10_000;
/// Longest id, tenant or subject.
const MAX_NAME: usize = 256;

const WHAT: &str = "tokens file";
const KEY: &str = "auth.tokens_file";

/// Whether `token` has the shape of a static secret (it may still be
/// unknown).
pub fn is_static_shape(token: &str) -> bool {
    token.len() == SECRET_PREFIX.len() + SECRET_CHARS
        && token.starts_with(SECRET_PREFIX)
        && token[SECRET_PREFIX.len()..]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The `hash` a tokens file stores for `secret`.
pub fn hash_text(secret: &str) -> String {
    format!("sha256:{}", hex(&Sha256::digest(secret.as_bytes())))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// A new random secret.
pub fn new_secret() -> Result<String, AuthError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| AuthError::Other(format!("no randomness from the system: {e}")))?;
    Ok(format!("{SECRET_PREFIX}{}", URL_SAFE_NO_PAD.encode(bytes)))
}

/// One entry of the tokens file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticToken {
    pub id: String,
    hash: [u8; 32],
    pub issuer: String,
    pub tenant: String,
    pub subject: String,
    pub scopes: BTreeSet<String>,
    /// Unix milliseconds.
    pub expires_ms: Option<i64>,
    pub revoked: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawToken {
    id: String,
    hash: String,
    issuer: Option<String>,
    tenant: String,
    subject: String,
    scopes: Vec<String>,
    expires: Option<String>,
    revoked: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    token: Vec<RawToken>,
}

/// The static tokens of one file, found by the hash of the secret.
#[derive(Debug, Default)]
pub struct StaticTokens {
    entries: Vec<StaticToken>,
    by_hash: HashMap<[u8; 32], usize>,
}

impl StaticTokens {
    /// Reads and validates the tokens file completely.
    pub fn load(path: &Path) -> Result<StaticTokens, AuthError> {
        let text = files::read(path, WHAT, KEY, Holds::Secrets)?;
        Self::parse(path, &text)
    }

    fn parse(path: &Path, text: &str) -> Result<StaticTokens, AuthError> {
        let invalid = |message: String| AuthError::Invalid {
            path: path.to_path_buf(),
            message,
        };
        let raw: RawFile = toml::from_str(text).map_err(|e| invalid(toml_message(text, &e)))?;
        if raw.token.len() > MAX_TOKENS {
            return Err(invalid(format!(
                "{} tokens; at most {MAX_TOKENS} are allowed",
                raw.token.len()
            )));
        }
        let mut set = StaticTokens::default();
        for t in raw.token {
            let token = entry(t).map_err(&invalid)?;
            if set.entries.iter().any(|e| e.id == token.id) {
                return Err(invalid(format!(
                    "token id {:?} appears twice; ids must be unique",
                    token.id
                )));
            }
            if set.by_hash.contains_key(&token.hash) {
                return Err(invalid(format!(
                    "token {:?} has the same hash as an earlier entry; one secret, one entry",
                    token.id
                )));
            }
            set.by_hash.insert(token.hash, set.entries.len());
            set.entries.push(token);
        }
        Ok(set)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn entries(&self) -> &[StaticToken] {
        &self.entries
    }

    /// The entry whose secret this is. The lookup is by SHA-256 of the
    /// presented text: its timing tells nothing about a stored secret.
    pub fn find(&self, secret: &str) -> Option<&StaticToken> {
        let digest: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
        self.by_hash.get(&digest).map(|&i| &self.entries[i])
    }

    /// The principal of a static secret at `now_ms`, revocation by the
    /// revocations file left to the caller.
    pub fn check(&self, secret: &str, now_ms: i64) -> Result<(&StaticToken, Principal), Rejection> {
        let token = self.find(secret).ok_or(Rejection::UnknownToken)?;
        if token.revoked {
            return Err(Rejection::Revoked);
        }
        if token.expires_ms.is_some_and(|e| now_ms >= e) {
            return Err(Rejection::Expired);
        }
        Ok((
            token,
            Principal {
                issuer: token.issuer.clone(),
                tenant: token.tenant.clone(),
                subject: token.subject.clone(),
                scopes: token.scopes.clone(),
                credential_id: token.id.clone(),
                expires_ms: token.expires_ms,
            },
        ))
    }
}

/// A TOML error as one line with its line number, never quoting the text
/// (a tokens file is not secret, but a pasted secret in it would be).
fn toml_message(text: &str, e: &toml::de::Error) -> String {
    match e.span() {
        Some(span) => {
            let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
            format!("line {line}: {}", e.message().trim())
        }
        None => e.message().trim().to_string(),
    }
}

fn valid_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_NAME && !s.chars().any(char::is_control)
}

/// A token id: a label used on the command line and in the log.
pub fn valid_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'@'))
}

/// Parses an RFC 3339 time into Unix milliseconds.
pub fn parse_time(text: &str) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.timestamp_millis())
}

/// Checks scope names against the ones taskgate knows.
pub fn check_scopes(scopes: &[String]) -> Result<BTreeSet<String>, String> {
    let mut set = BTreeSet::new();
    for s in scopes {
        if !KNOWN_SCOPES.contains(&s.as_str()) {
            return Err(format!(
                "unknown scope {s:?}; the scopes are {}",
                KNOWN_SCOPES.join(", ")
            ));
        }
        set.insert(s.clone());
    }
    Ok(set)
}

fn entry(t: RawToken) -> Result<StaticToken, String> {
    if !valid_id(&t.id) {
        return Err(format!(
            "token id {:?} must be 1-64 characters of A-Z a-z 0-9 _ - . @",
            t.id
        ));
    }
    let at = |m: String| format!("token {:?}: {m}", t.id);
    let hash = t
        .hash
        .strip_prefix("sha256:")
        .and_then(parse_hex32)
        .ok_or_else(|| at("hash must be \"sha256:\" and 64 hex digits".into()))?;
    let issuer = t.issuer.unwrap_or_else(|| STATIC_ISSUER.to_string());
    for (name, v) in [
        ("issuer", &issuer),
        ("tenant", &t.tenant),
        ("subject", &t.subject),
    ] {
        if !valid_name(v) {
            return Err(at(format!(
                "{name} must be 1-{MAX_NAME} characters without control characters"
            )));
        }
    }
    let scopes = check_scopes(&t.scopes).map_err(at)?;
    let expires_ms = match &t.expires {
        None => None,
        Some(text) => Some(parse_time(text).ok_or_else(|| {
            at(format!(
                "expires = {text:?} is not an RFC 3339 time like 2027-06-01T00:00:00Z"
            ))
        })?),
    };
    Ok(StaticToken {
        id: t.id,
        hash,
        issuer,
        tenant: t.tenant,
        subject: t.subject,
        scopes,
        expires_ms,
        revoked: t.revoked.unwrap_or(false),
    })
}

fn parse_hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, chunk) in s.as_bytes().chunks(2).enumerate() {
        let pair = std::str::from_utf8(chunk).ok()?;
        out[i] = u8::from_str_radix(pair, 16).ok()?;
    }
    Some(out)
}

// ---- the operator's commands -------------------------------------------

/// What `taskgate token new` asks for.
#[derive(Debug, Clone)]
pub struct NewToken {
    pub id: String,
    pub tenant: String,
    pub subject: String,
    pub scopes: Vec<String>,
    pub expires: Option<String>,
    pub issuer: Option<String>,
}

/// A new secret and the `[[token]]` stanza that admits it. Nothing is
/// written anywhere: the caller prints both once.
pub fn new_token(req: &NewToken) -> Result<(String, String), AuthError> {
    let bad = |m: String| AuthError::Other(m);
    if !valid_id(&req.id) {
        return Err(bad(format!(
            "--id {:?} must be 1-64 characters of A-Z a-z 0-9 _ - . @",
            req.id
        )));
    }
    check_scopes(&req.scopes).map_err(bad)?;
    if let Some(e) = &req.expires
        && parse_time(e).is_none()
    {
        return Err(bad(format!(
            "--expires {e:?} is not an RFC 3339 time like 2027-06-01T00:00:00Z"
        )));
    }
    let secret = new_secret()?;
    let mut stanza = String::from("[[token]]\n");
    let q = |s: &str| toml::Value::String(s.to_string()).to_string();
    stanza.push_str(&format!("id = {}\n", q(&req.id)));
    stanza.push_str(&format!("hash = {}\n", q(&hash_text(&secret))));
    if let Some(issuer) = &req.issuer {
        stanza.push_str(&format!("issuer = {}\n", q(issuer)));
    }
    stanza.push_str(&format!("tenant = {}\n", q(&req.tenant)));
    stanza.push_str(&format!("subject = {}\n", q(&req.subject)));
    let scopes: Vec<String> = req.scopes.iter().map(|s| q(s)).collect();
    stanza.push_str(&format!("scopes = [{}]\n", scopes.join(", ")));
    if let Some(e) = &req.expires {
        stanza.push_str(&format!("expires = {}\n", q(e)));
    }
    stanza.push_str("revoked = false\n");
    // The stanza must read back as a valid entry with this secret's hash.
    let check = StaticTokens::parse(Path::new("the new stanza"), &stanza)?;
    if check.find(&secret).is_none() {
        return Err(bad("the new stanza does not admit its own secret".into()));
    }
    Ok((secret, stanza))
}

/// `taskgate token revoke`: sets `revoked = true` on the entry `id` of the
/// tokens file, rewriting it atomically with its mode and owner, comments
/// and layout kept. Returns false when the entry was already revoked.
pub fn revoke(path: &Path, id: &str) -> Result<bool, AuthError> {
    let text = files::read(path, WHAT, KEY, Holds::Secrets)?;
    let tokens = StaticTokens::parse(path, &text)?;
    let Some(token) = tokens.entries.iter().find(|t| t.id == id) else {
        return Err(AuthError::NoSuchToken {
            path: path.to_path_buf(),
            id: id.to_string(),
        });
    };
    if token.revoked {
        return Ok(false);
    }
    let edited = set_revoked(&text, id).ok_or_else(|| AuthError::Invalid {
        path: path.to_path_buf(),
        message: format!("cannot locate the entry {id:?} in the text to edit it"),
    })?;
    // The edit must leave a file that parses to the same entries, this one
    // revoked.
    let after = StaticTokens::parse(path, &edited)?;
    let ok = after.len() == tokens.len()
        && after
            .entries
            .iter()
            .zip(&tokens.entries)
            .all(|(a, b)| a.id == b.id && a.hash == b.hash && (a.revoked || a.id != id))
        && after.entries.iter().any(|t| t.id == id && t.revoked);
    if !ok {
        return Err(AuthError::Other(format!(
            "editing {path:?} would change more than the revoked flag of {id:?}; edit the file by hand"
        )));
    }
    replace_file(path, edited.as_bytes())?;
    Ok(true)
}

/// The text with `revoked = true` in the `[[token]]` whose id is `id`:
/// an existing `revoked` value is replaced, else a line is added after the
/// `id` line.
fn set_revoked(text: &str, id: &str) -> Option<String> {
    use toml::de::{DeTable, DeValue};
    let doc = DeTable::parse(text).ok()?;
    let root = doc.get_ref();
    let (_, tokens) = root.iter().find(|(k, _)| k.get_ref().as_ref() == "token")?;
    let DeValue::Array(tables) = tokens.get_ref() else {
        return None;
    };
    for table in tables.iter() {
        let DeValue::Table(t) = table.get_ref() else {
            continue;
        };
        let (_, id_value) = t.iter().find(|(k, _)| k.get_ref().as_ref() == "id")?;
        let DeValue::String(v) = id_value.get_ref() else {
            continue;
        };
        if v.as_ref() != id {
            continue;
        }
        if let Some((_, value)) = t.iter().find(|(k, _)| k.get_ref().as_ref() == "revoked") {
            let span = value.span();
            let mut out = String::with_capacity(text.len());
            out.push_str(&text[..span.start]);
            out.push_str("true");
            out.push_str(&text[span.end..]);
            return Some(out);
        }
        // After the end of the line holding the id.
        let end = id_value.span().end;
        // A file whose last line is the id has no newline to insert after.
        let (line_end, newline) = match text[end..].find('\n') {
            Some(i) => (end + i + 1, ""),
            None => (text.len(), "\n"),
        };
        let mut out = String::with_capacity(text.len() + 16);
        out.push_str(&text[..line_end]);
        out.push_str(newline);
        out.push_str("revoked = true\n");
        out.push_str(&text[line_end..]);
        return Some(out);
    }
    None
}

/// Replaces `path` with `bytes` atomically: a temporary file beside it
/// with the same mode and owner, synced, renamed over it, and the
/// directory synced.
fn replace_file(path: &Path, bytes: &[u8]) -> Result<(), AuthError> {
    use std::io::Write as _;
    let io = |source: std::io::Error| AuthError::Unreadable {
        what: WHAT,
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "tokens".into());
    let tmp: PathBuf = dir.join(format!(".{name}.taskgate-{}.tmp", std::process::id()));
    let mode = meta.mode() & 0o7777;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode & 0o700)
        .open(&tmp)
        .map_err(io)?;
    let result = (|| {
        // Owner first, then the mode: a chown may clear set-id bits, and
        // group bits are granted only once the group is the right one.
        if let Err(e) = nix::unistd::fchown(
            &file,
            Some(nix::unistd::Uid::from_raw(meta.uid())),
            Some(nix::unistd::Gid::from_raw(meta.gid())),
        ) {
            return Err(io(std::io::Error::from(e)));
        }
        file.set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(io)?;
        file.write_all(bytes).map_err(io)?;
        file.sync_all().map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)?;
        if let Ok(d) = std::fs::File::open(dir) {
            d.sync_all().map_err(io)?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_secret_has_the_static_shape_and_its_stanza_admits_it() {
        let (secret, stanza) = new_token(&NewToken {
            id: "ci".into(),
            tenant: "acme".into(),
            subject: "ci@acme".into(),
            scopes: vec!["tools:call".into()],
            expires: None,
            issuer: None,
        })
        .unwrap();
        assert!(is_static_shape(&secret), "{secret}");
        assert!(!stanza.contains(&secret));
        assert!(!is_static_shape("tgk_short"));
        assert!(!is_static_shape(&format!(
            "{}.",
            &secret[..secret.len() - 1]
        )));
    }

    #[test]
    fn revoking_edits_only_the_flag_and_keeps_comments() {
        let text = "# ours\n[[token]]\nid = \"a\" # first\nhash = \"sha256:0000000000000000000000000000000000000000000000000000000000000000\"\ntenant = \"t\"\nsubject = \"s\"\nscopes = []\n\n[[token]]\nid = \"b\"\nhash = \"sha256:1111111111111111111111111111111111111111111111111111111111111111\"\ntenant = \"t\"\nsubject = \"s\"\nscopes = []\nrevoked = false\n";
        let a = set_revoked(text, "a").unwrap();
        assert!(
            a.contains("id = \"a\" # first\nrevoked = true\nhash"),
            "{a}"
        );
        assert!(a.starts_with("# ours\n"));
        let b = set_revoked(text, "b").unwrap();
        assert!(b.ends_with("revoked = true\n"), "{b}");
        assert!(set_revoked(text, "c").is_none());
        let last = "[[token]]\nscopes = []\nid = \"z\"";
        assert_eq!(
            set_revoked(last, "z").unwrap(),
            "[[token]]\nscopes = []\nid = \"z\"\nrevoked = true\n"
        );
    }
}
