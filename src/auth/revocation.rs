//! The revocations file: credentials refused before they expire, re-read on
//! every reload so that revoking never needs a restart.
//!
//! ```toml
//! [[revoke]]                      # a static token, by its id
//! token = "ci"
//!
//! [[revoke]]                      # one JWT
//! issuer = "https://idp.example.com/realms/acme"
//! jti = "6c1f…"
//! until = "2026-12-01T12:00:00Z"  # optional: the token's exp, after which the entry may go
//!
//! [[revoke]]                      # everything a subject was issued before a time
//! issuer = "https://idp.example.com/realms/acme"
//! subject = "agent-7"
//! issued_before = "2026-11-30T00:00:00Z"
//! ```

use std::collections::{HashMap, HashSet};
use std::path::Path;

use serde::Deserialize;

use super::AuthError;
use super::files::{self, Holds};
use super::tokens::parse_time;

/// Most `[[revoke]]` entries a file may hold.
pub const MAX_REVOCATIONS: usize = 100_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRevoke {
    token: Option<String>,
    issuer: Option<String>,
    jti: Option<String>,
    until: Option<String>,
    subject: Option<String>,
    issued_before: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    revoke: Vec<RawRevoke>,
}

/// Every revocation, indexed for the checks a request makes.
#[derive(Debug, Default)]
pub struct Revocations {
    tokens: HashSet<String>,
    jtis: HashSet<(String, String)>,
    /// (issuer, subject) → the latest `issued_before`, Unix milliseconds.
    subjects: HashMap<(String, String), i64>,
    entries: usize,
}

impl Revocations {
    pub fn load(path: &Path) -> Result<Revocations, AuthError> {
        let text = files::read(
            path,
            "revocations file",
            "auth.revocations_file",
            Holds::Public,
        )?;
        Self::parse(path, &text)
    }

    fn parse(path: &Path, text: &str) -> Result<Revocations, AuthError> {
        let invalid = |message: String| AuthError::Invalid {
            path: path.to_path_buf(),
            message,
        };
        let raw: RawFile = toml::from_str(text).map_err(|e| {
            let line = e
                .span()
                .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
            invalid(match line {
                Some(l) => format!("line {l}: {}", e.message().trim()),
                None => e.message().trim().to_string(),
            })
        })?;
        if raw.revoke.len() > MAX_REVOCATIONS {
            return Err(invalid(format!(
                "{} entries; at most {MAX_REVOCATIONS} are allowed",
                raw.revoke.len()
            )));
        }
        let mut r = Revocations {
            entries: raw.revoke.len(),
            ..Default::default()
        };
        for (i, e) in raw.revoke.into_iter().enumerate() {
            let at = |m: &str| invalid(format!("[[revoke]] number {}: {m}", i + 1));
            let nonempty = |v: &Option<String>| v.as_deref().is_some_and(|s| !s.is_empty());
            match (&e.token, &e.issuer, &e.jti, &e.subject, &e.issued_before) {
                (Some(id), None, None, None, None) if !id.is_empty() => {
                    if e.until.is_some() {
                        return Err(at("`until` belongs to a JWT entry (issuer and jti)"));
                    }
                    r.tokens.insert(id.clone());
                }
                (None, Some(iss), Some(jti), None, None)
                    if nonempty(&e.issuer) && nonempty(&e.jti) =>
                {
                    if let Some(u) = &e.until
                        && parse_time(u).is_none()
                    {
                        return Err(at(
                            "until is not an RFC 3339 time like 2026-12-01T12:00:00Z",
                        ));
                    }
                    r.jtis.insert((iss.clone(), jti.clone()));
                }
                (None, Some(iss), None, Some(sub), Some(before))
                    if nonempty(&e.issuer) && nonempty(&e.subject) =>
                {
                    if e.until.is_some() {
                        return Err(at("`until` belongs to a JWT entry (issuer and jti)"));
                    }
                    let Some(ms) = parse_time(before) else {
                        return Err(at(
                            "issued_before is not an RFC 3339 time like 2026-11-30T00:00:00Z",
                        ));
                    };
                    let slot = r.subjects.entry((iss.clone(), sub.clone())).or_insert(ms);
                    *slot = (*slot).max(ms);
                }
                _ => {
                    return Err(at(
                        "give exactly one of: token = ID; issuer and jti; issuer, subject and issued_before",
                    ));
                }
            }
        }
        Ok(r)
    }

    /// Entries of the file.
    pub fn count(&self) -> usize {
        self.entries
    }

    /// A static token revoked by id.
    pub fn token(&self, id: &str) -> bool {
        self.tokens.contains(id)
    }

    /// A JWT revoked by its `jti` or by its subject's `issued_before`. A
    /// token without `iat` under an `issued_before` entry cannot show it
    /// was issued later, so it counts as revoked.
    pub fn jwt(&self, issuer: &str, jti: Option<&str>, subject: &str, iat_ms: Option<i64>) -> bool {
        if let Some(jti) = jti
            && self.jtis.contains(&(issuer.to_string(), jti.to_string()))
        {
            return true;
        }
        match self
            .subjects
            .get(&(issuer.to_string(), subject.to_string()))
        {
            Some(&before) => iat_ms.is_none_or(|iat| iat < before),
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_entry_kind_and_mixtures_refused() {
        let p = Path::new("r.toml");
        let r = Revocations::parse(
            p,
            "[[revoke]]\ntoken = \"ci\"\n[[revoke]]\nissuer = \"i\"\njti = \"j\"\n[[revoke]]\nissuer = \"i\"\nsubject = \"s\"\nissued_before = \"2026-01-01T00:00:00Z\"\n",
        )
        .unwrap();
        assert!(r.token("ci") && !r.token("other"));
        assert!(r.jwt("i", Some("j"), "x", Some(0)));
        assert!(!r.jwt("other", Some("j"), "x", Some(0)));
        let before = parse_time("2026-01-01T00:00:00Z").unwrap();
        assert!(r.jwt("i", None, "s", Some(before - 1)));
        assert!(!r.jwt("i", None, "s", Some(before)));
        assert!(r.jwt("i", None, "s", None));
        for bad in [
            "[[revoke]]\ntoken = \"ci\"\njti = \"j\"\n",
            "[[revoke]]\nissuer = \"i\"\n",
            "[[revoke]]\nissuer = \"i\"\nsubject = \"s\"\nissued_before = \"yesterday\"\n",
            "[[revoke]]\ntokn = \"ci\"\n",
        ] {
            assert!(Revocations::parse(p, bad).is_err(), "{bad}");
        }
    }
}
