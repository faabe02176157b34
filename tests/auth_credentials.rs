//! Credentials: static tokens and JWTs turned into principals, every way a
//! credential is refused, revocation by reload, and the `taskgate token`
//! commands. Real files on disk with real permissions, the real binary for
//! the commands and for the startup refusals; JWTs are signed here with
//! keys generated here (Ed25519 and RSA).
//!
//! What this file proves: static tokens (ok, unknown, expired, revoked in the
//! file and by the revocations file); JWTs signed in the test with generated
//! Ed25519 and RSA keys: good, wrong and missing audience, expired, future
//! `nbf`, unknown key, wrong issuer, `alg: none`, HS256 signed with the RSA
//! public key, wrong `typ`, lifetime over the cap, revoked `jti`,
//! `issued_before`; a reload with a broken, unsafe or private-key-holding file
//! keeps the old set; `check` and `serve` refuse bad files with 77/78;
//! `taskgate token new → list → revoke` through the binary, the secret on no
//! disk

mod common;

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};

use common::*;
use taskgate::auth::{Authenticator, Rejection, tokens};
use taskgate::config::{Config, Overrides};

/// A fixed "now" (2030-03-17), so that expiry is decided by the test.
const NOW_MS: i64 = 1_900_000_000_000;
const NOW: i64 = NOW_MS / 1000;
const RESOURCE: &str = "https://tasks.example.test/mcp";
const ED_ISSUER: &str = "https://idp.example.test/realms/acme";
const RSA_ISSUER: &str = "https://rsa.example.test";

fn write(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn load(config: &Path) -> Config {
    let env: HashMap<String, String> = [("HOME".to_string(), "/nonexistent".to_string())].into();
    Config::load_from(
        &Overrides {
            config_path: Some(config.to_path_buf()),
            ..Default::default()
        },
        &env,
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

fn authenticator(config: &Path) -> Authenticator {
    Authenticator::from_config(&load(config))
        .unwrap_or_else(|e| panic!("{e}"))
        .expect("authentication is on")
}

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// A compact JWS from a header, claims and a signing function.
fn jws(header: &Value, claims: &Value, sign: impl Fn(&[u8]) -> Vec<u8>) -> String {
    let input = format!(
        "{}.{}",
        b64(header.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    );
    let sig = sign(input.as_bytes());
    format!("{input}.{}", b64(&sig))
}

/// The keys of the test's two issuers, generated for this run.
struct Keys {
    ed: ed25519_dalek::SigningKey,
    /// A second Ed25519 key the issuer's JWKS does not hold.
    stranger: ed25519_dalek::SigningKey,
    /// An ES256 key in the same JWKS as `ed`.
    ec: p256::ecdsa::SigningKey,
    rsa: rsa::PrivateKey,
}

impl Keys {
    fn generate() -> Keys {
        let ed_key = || {
            let mut seed = [0u8; 32];
            getrandom::fill(&mut seed).unwrap();
            ed25519_dalek::SigningKey::from_bytes(&seed)
        };
        let ec = loop {
            let mut scalar = [0u8; 32];
            getrandom::fill(&mut scalar).unwrap();
            // Almost every 32-byte string is a valid scalar; retry if not.
            if let Ok(key) = p256::ecdsa::SigningKey::from_slice(&scalar) {
                break key;
            }
        };
        use rsa::Generate as _;
        Keys {
            ed: ed_key(),
            stranger: ed_key(),
            ec,
            rsa: rsa::PrivateKey::generate(),
        }
    }

    /// The Ed25519 issuer's keys: its Ed25519 key and a P-256 key.
    fn ed_jwks(&self) -> String {
        let point = self.ec.verifying_key().to_sec1_point(false);
        let xy = &point.as_bytes()[1..];
        json!({"keys": [{
            "kty": "OKP", "crv": "Ed25519", "kid": "ed1", "alg": "EdDSA", "use": "sig",
            "x": b64(self.ed.verifying_key().as_bytes()),
        }, {
            "kty": "EC", "crv": "P-256", "kid": "ec1", "use": "sig",
            "x": b64(&xy[..32]), "y": b64(&xy[32..]),
        }]})
        .to_string()
    }

    fn sign_ec(&self, header: &Value, claims: &Value) -> String {
        use p256::ecdsa::signature::Signer as _;
        jws(header, claims, |m| {
            let sig: p256::ecdsa::Signature = self.ec.sign(m);
            sig.to_bytes().to_vec()
        })
    }

    fn rsa_jwks(&self) -> String {
        use rsa::traits::PublicKeyParts as _;
        let public = self.rsa.to_public_key();
        json!({"keys": [{
            "kty": "RSA", "kid": "rsa1", "alg": "RS256", "use": "sig",
            "n": b64(&public.n_bytes()), "e": b64(&public.e_bytes()),
        }]})
        .to_string()
    }

    fn sign_ed(&self, claims: &Value) -> String {
        self.sign_ed_with(
            &json!({"alg": "EdDSA", "typ": "at+jwt", "kid": "ed1"}),
            claims,
        )
    }

    fn sign_ed_with(&self, header: &Value, claims: &Value) -> String {
        use ed25519_dalek::Signer as _;
        jws(header, claims, |m| self.ed.sign(m).to_bytes().to_vec())
    }

    fn sign_rsa(&self, claims: &Value) -> String {
        jws(
            &json!({"alg": "RS256", "typ": "at+jwt", "kid": "rsa1"}),
            claims,
            |m| {
                self.rsa
                    .pkcs1v15_sign::<rsa::sha2::Sha256>(m)
                    .unwrap()
                    .to_vec()
            },
        )
    }
}

/// Good claims for the Ed25519 issuer at NOW.
fn claims() -> Value {
    json!({
        "iss": ED_ISSUER, "sub": "agent-7", "aud": RESOURCE, "tid": "acme",
        "iat": NOW - 10, "nbf": NOW - 10, "exp": NOW + 600,
        "jti": "jti-1", "scope": "tools:call tasks:read openid",
    })
}

fn with(mut c: Value, key: &str, v: Value) -> Value {
    c[key] = v;
    c
}

fn without(mut c: Value, key: &str) -> Value {
    c.as_object_mut().unwrap().remove(key);
    c
}

/// A directory with a config naming a tokens file, a revocations file and
/// two JWT issuers (Ed25519 and RSA).
struct Site {
    dir: tempfile::TempDir,
    keys: Keys,
}

impl Site {
    fn new(tokens: &str, revocations: &str) -> Site {
        let site = Site {
            dir: private_dir(),
            keys: Keys::generate(),
        };
        write(&site.path("tokens.toml"), tokens, 0o640);
        write(&site.path("revocations.toml"), revocations, 0o644);
        write(&site.path("ed.json"), &site.keys.ed_jwks(), 0o644);
        write(&site.path("rsa.json"), &site.keys.rsa_jwks(), 0o644);
        let config = format!(
            r#"[auth]
resource = "{RESOURCE}"
tokens_file = "{}"
revocations_file = "{}"

[[auth.jwt]]
issuer = "{ED_ISSUER}"
jwks_file = "{}"
algorithms = ["EdDSA", "ES256"]
tenant_claim = "tid"
max_token_lifetime_secs = 3600
leeway_secs = 30
advertise = true

[[auth.jwt]]
issuer = "{RSA_ISSUER}"
jwks_file = "{}"
algorithms = ["RS256"]
tenant = "rsa-tenant"
scope_claim = "scp"
"#,
            site.path("tokens.toml").display(),
            site.path("revocations.toml").display(),
            site.path("ed.json").display(),
            site.path("rsa.json").display(),
        );
        write(&site.config(), &config, 0o644);
        site
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn config(&self) -> PathBuf {
        self.path("taskgate.toml")
    }
}

/// A `[[token]]` entry for `secret`.
fn entry(id: &str, secret: &str, extra: &str) -> String {
    format!(
        "[[token]]\nid = \"{id}\"\nhash = \"{}\"\ntenant = \"acme\"\nsubject = \"{id}@acme\"\nscopes = [\"tools:call\", \"tasks:read\"]\n{extra}\n",
        tokens::hash_text(secret)
    )
}

fn secret() -> String {
    tokens::new_secret().unwrap()
}

#[test]
fn static_tokens_ok_unknown_expired_and_revoked() {
    let (ok, expired, flagged, listed) = (secret(), secret(), secret(), secret());
    let text = [
        entry("ok", &ok, "expires = \"2031-01-01T00:00:00Z\""),
        entry("old", &expired, "expires = \"2030-01-01T00:00:00Z\""),
        entry("flagged", &flagged, "revoked = true"),
        entry("listed", &listed, ""),
    ]
    .concat();
    let site = Site::new(&text, "[[revoke]]\ntoken = \"listed\"\n");
    let auth = authenticator(&site.config());

    let p = auth.authenticate_at(&ok, NOW_MS).unwrap();
    assert_eq!(
        (
            p.issuer.as_str(),
            p.tenant.as_str(),
            p.subject.as_str(),
            p.credential_id.as_str()
        ),
        ("taskgate:static", "acme", "ok@acme", "ok")
    );
    assert!(p.missing(&["tools:call", "tasks:read"]).is_empty());
    assert_eq!(p.missing(&["tasks:cancel"]), ["tasks:cancel"]);
    assert_eq!(p.expires_ms, tokens::parse_time("2031-01-01T00:00:00Z"));

    assert_eq!(
        auth.authenticate_at(&secret(), NOW_MS),
        Err(Rejection::UnknownToken)
    );
    assert_eq!(
        auth.authenticate_at(&expired, NOW_MS),
        Err(Rejection::Expired)
    );
    assert_eq!(
        auth.authenticate_at(&flagged, NOW_MS),
        Err(Rejection::Revoked)
    );
    assert_eq!(
        auth.authenticate_at(&listed, NOW_MS),
        Err(Rejection::Revoked)
    );
    // Anything that is neither shape is refused without a lookup.
    for bad in [
        "",
        "tgk_",
        "Bearer x",
        "a.b",
        "a.b.c.d",
        &ok[..ok.len() - 1],
    ] {
        assert_eq!(
            auth.authenticate_at(bad, NOW_MS),
            Err(Rejection::Malformed),
            "{bad:?}"
        );
    }
    // A reason names the failure, never the token.
    let reason = Rejection::UnknownToken.to_string();
    assert!(!reason.contains("tgk_"), "{reason}");
}

#[test]
fn a_good_jwt_of_each_issuer_gives_its_principal() {
    let site = Site::new("", "");
    let auth = authenticator(&site.config());
    let p = auth
        .authenticate_at(&site.keys.sign_ed(&claims()), NOW_MS)
        .unwrap();
    assert_eq!(
        (
            p.issuer.as_str(),
            p.tenant.as_str(),
            p.subject.as_str(),
            p.credential_id.as_str()
        ),
        (ED_ISSUER, "acme", "agent-7", "jti-1")
    );
    // Scopes taskgate does not know (openid) are dropped.
    assert_eq!(
        p.scopes.iter().map(String::as_str).collect::<Vec<_>>(),
        ["tasks:read", "tools:call"]
    );
    assert_eq!(p.expires_ms, Some((NOW + 600) * 1000));

    // The issuer's P-256 key, by kid; and without a kid, the one key of
    // the issuer that fits the header's algorithm.
    let es = json!({"alg": "ES256", "typ": "at+jwt", "kid": "ec1"});
    let p = auth
        .authenticate_at(&site.keys.sign_ec(&es, &claims()), NOW_MS)
        .unwrap();
    assert_eq!(
        (p.issuer.as_str(), p.subject.as_str()),
        (ED_ISSUER, "agent-7")
    );
    let es = json!({"alg": "ES256", "typ": "at+jwt"});
    assert!(
        auth.authenticate_at(&site.keys.sign_ec(&es, &claims()), NOW_MS)
            .is_ok()
    );
    let ed = json!({"alg": "EdDSA", "typ": "at+jwt"});
    assert!(
        auth.authenticate_at(&site.keys.sign_ed_with(&ed, &claims()), NOW_MS)
            .is_ok()
    );

    let rsa_claims = json!({
        "iss": RSA_ISSUER, "sub": "svc", "aud": [RESOURCE, "other"], "iat": NOW,
        "exp": NOW + 60, "scp": ["tasks:cancel"],
    });
    let p = auth
        .authenticate_at(&site.keys.sign_rsa(&rsa_claims), NOW_MS)
        .unwrap();
    assert_eq!(
        (p.issuer.as_str(), p.tenant.as_str(), p.subject.as_str()),
        (RSA_ISSUER, "rsa-tenant", "svc")
    );
    assert!(p.missing(&["tasks:cancel"]).is_empty());

    let settings = auth.settings();
    assert_eq!(settings.resource.as_deref(), Some(RESOURCE));
    assert_eq!(settings.realm, "taskgate");
    assert_eq!(
        settings.advertised_issuers().collect::<Vec<_>>(),
        [ED_ISSUER]
    );
}

/// `max_token_lifetime_secs` (3600 here) and `leeway_secs` (30 here) at
/// their bounds and one second past them. A token is good only before
/// `exp` (RFC 7519), so with the leeway it is good until 30 s after `exp`,
/// that instant excluded; `nbf` and the lifetime include their bound.
#[test]
fn jwt_lifetime_and_leeway_are_enforced_at_their_bounds() {
    let site = Site::new("", "");
    let auth = authenticator(&site.config());
    let k = &site.keys;
    let at = |c: Value| auth.authenticate_at(&k.sign_ed(&c), NOW_MS);
    let life = |secs: i64| {
        with(
            with(claims(), "iat", json!(NOW - 100)),
            "exp",
            json!(NOW - 100 + secs),
        )
    };
    assert!(at(life(3600)).is_ok(), "a lifetime of exactly the cap");
    assert_eq!(at(life(3601)).map(|_| ()), Err(Rejection::LifetimeTooLong));
    let expired = |ago: i64| life(100 - ago);
    assert_eq!(
        at(expired(29)).map(|_| ()),
        Ok(()),
        "expired within the leeway"
    );
    assert_eq!(at(expired(30)).map(|_| ()), Err(Rejection::Expired));
    assert_eq!(
        at(with(claims(), "nbf", json!(NOW + 30))).map(|_| ()),
        Ok(()),
        "not yet valid within the leeway"
    );
    assert_eq!(
        at(with(claims(), "nbf", json!(NOW + 31))).map(|_| ()),
        Err(Rejection::NotYetValid)
    );
}

#[test]
fn every_bad_jwt_is_refused_for_its_own_reason() {
    let site = Site::new("", "");
    let auth = authenticator(&site.config());
    let k = &site.keys;
    let check = |token: String, want: Rejection, what: &str| {
        assert_eq!(auth.authenticate_at(&token, NOW_MS), Err(want), "{what}");
    };
    check(
        k.sign_ed(&with(claims(), "aud", json!("https://elsewhere.test/mcp"))),
        Rejection::WrongAudience,
        "wrong audience",
    );
    check(
        k.sign_ed(&without(claims(), "aud")),
        Rejection::WrongAudience,
        "missing audience",
    );
    check(
        k.sign_ed(&with(claims(), "exp", json!(NOW - 31))),
        Rejection::Expired,
        "expired beyond the leeway",
    );
    check(
        k.sign_ed(&with(claims(), "nbf", json!(NOW + 31))),
        Rejection::NotYetValid,
        "future nbf",
    );
    check(
        k.sign_ed(&without(claims(), "exp")),
        Rejection::BadClaims,
        "no exp",
    );
    check(
        k.sign_ed(&with(claims(), "iss", json!("https://evil.test"))),
        Rejection::UnknownIssuer,
        "wrong issuer",
    );
    check(
        k.sign_ed(&with(claims(), "iss", json!(format!("{ED_ISSUER}/")))),
        Rejection::UnknownIssuer,
        "issuer must match exactly",
    );
    check(
        k.sign_ed(&with(
            with(claims(), "iat", json!(NOW - 100)),
            "exp",
            json!(NOW + 3600),
        )),
        Rejection::LifetimeTooLong,
        "lifetime over the cap",
    );
    check(
        k.sign_ed(&without(with(claims(), "exp", json!(NOW + 7200)), "iat")),
        Rejection::LifetimeTooLong,
        "no iat: the remaining life counts",
    );
    check(
        k.sign_ed_with(
            &json!({"alg": "EdDSA", "typ": "JWT", "kid": "ed1"}),
            &claims(),
        ),
        Rejection::WrongType,
        "typ JWT where at+jwt is required",
    );
    check(
        k.sign_ed_with(&json!({"alg": "EdDSA", "kid": "ed1"}), &claims()),
        Rejection::WrongType,
        "no typ",
    );
    // The RFC 7515 long form of the media type is the same type.
    assert!(
        auth.authenticate_at(
            &k.sign_ed_with(
                &json!({"alg": "EdDSA", "typ": "application/at+jwt", "kid": "ed1"}),
                &claims()
            ),
            NOW_MS
        )
        .is_ok()
    );
    check(
        k.sign_ed_with(
            &json!({"alg": "EdDSA", "typ": "at+jwt", "kid": "ed9"}),
            &claims(),
        ),
        Rejection::UnknownKey,
        "unknown kid",
    );
    check(
        k.sign_ec(
            &json!({"alg": "ES256", "typ": "at+jwt", "kid": "ed1"}),
            &claims(),
        ),
        Rejection::UnknownKey,
        "a kid whose key does not fit the algorithm",
    );
    {
        use ed25519_dalek::Signer as _;
        let forged = jws(
            &json!({"alg": "EdDSA", "typ": "at+jwt", "kid": "ed1"}),
            &claims(),
            |m| k.stranger.sign(m).to_bytes().to_vec(),
        );
        check(
            forged,
            Rejection::BadSignature,
            "signed by a key the JWKS does not hold",
        );
    }
    // A token whose claims were changed after signing.
    let good = k.sign_ed(&claims());
    let mut parts: Vec<String> = good.split('.').map(str::to_string).collect();
    parts[1] = b64(with(claims(), "sub", json!("root")).to_string().as_bytes());
    check(parts.join("."), Rejection::BadSignature, "tampered claims");

    // alg none, whatever its spelling, with or without a signature.
    for alg in ["none", "None", "NONE"] {
        let header = b64(json!({"alg": alg, "typ": "at+jwt"}).to_string().as_bytes());
        let body = b64(claims().to_string().as_bytes());
        check(
            format!("{header}.{body}."),
            Rejection::AlgorithmNotAllowed,
            "alg none",
        );
    }
    // An algorithm the issuer does not allow, though the key would fit.
    let rsa_claims = json!({"iss": RSA_ISSUER, "sub": "svc", "aud": RESOURCE, "exp": NOW + 60});
    let ps = jws(
        &json!({"alg": "PS256", "typ": "at+jwt", "kid": "rsa1"}),
        &rsa_claims,
        |_| vec![0; 256],
    );
    check(
        ps,
        Rejection::AlgorithmNotAllowed,
        "PS256 not in the allow-list",
    );

    // Algorithm confusion: HS256 "signed" with the RSA public key as the
    // HMAC secret (both its PEM text and its JWKS bytes).
    use hmac::{KeyInit as _, Mac as _};
    use rsa::pkcs8::EncodePublicKey as _;
    let pem = site
        .keys
        .rsa
        .to_public_key()
        .to_public_key_pem(rsa::pkcs8::LineEnding::LF)
        .unwrap();
    let jwks = std::fs::read(site.path("rsa.json")).unwrap();
    for secret in [pem.as_bytes(), &jwks[..]] {
        let token = jws(
            &json!({"alg": "HS256", "typ": "at+jwt", "kid": "rsa1"}),
            &rsa_claims,
            |m| {
                let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret).unwrap();
                mac.update(m);
                mac.finalize().into_bytes().to_vec()
            },
        );
        check(
            token,
            Rejection::AlgorithmNotAllowed,
            "HS256 with the RSA public key",
        );
    }
    // The same claims properly signed pass: the refusals above are about
    // the algorithm, not the claims.
    assert!(
        auth.authenticate_at(&k.sign_rsa(&rsa_claims), NOW_MS)
            .is_ok()
    );
}

#[test]
fn revoked_jti_and_issued_before_refuse_jwts() {
    let site = Site::new(
        "",
        &format!(
            "[[revoke]]\nissuer = \"{ED_ISSUER}\"\njti = \"stolen\"\nuntil = \"2030-03-18T00:00:00Z\"\n\n[[revoke]]\nissuer = \"{ED_ISSUER}\"\nsubject = \"agent-9\"\nissued_before = \"2030-03-17T17:46:00Z\"\n"
        ),
    );
    let auth = authenticator(&site.config());
    let k = &site.keys;
    let before = tokens::parse_time("2030-03-17T17:46:00Z").unwrap() / 1000;
    assert_eq!(
        auth.authenticate_at(&k.sign_ed(&with(claims(), "jti", json!("stolen"))), NOW_MS),
        Err(Rejection::Revoked)
    );
    let agent9 = |iat: i64| {
        with(
            with(with(claims(), "sub", json!("agent-9")), "iat", json!(iat)),
            "nbf",
            json!(iat),
        )
    };
    // NOW is 2030-03-17T17:46:40Z: a token issued before 17:46:00 is
    // revoked, one issued at or after it is not.
    assert!(before < NOW && before > NOW - 600);
    assert_eq!(
        auth.authenticate_at(&k.sign_ed(&agent9(before - 1)), NOW_MS),
        Err(Rejection::Revoked)
    );
    assert!(
        auth.authenticate_at(&k.sign_ed(&agent9(before)), NOW_MS)
            .is_ok()
    );
    // Another subject of the same issuer is untouched.
    assert!(auth.authenticate_at(&k.sign_ed(&claims()), NOW_MS).is_ok());
}

#[test]
fn a_reload_with_a_broken_file_keeps_the_old_set_and_a_good_one_revokes() {
    let (a, b) = (secret(), secret());
    let tokens_text = [entry("a", &a, ""), entry("b", &b, "")].concat();
    let site = Site::new(&tokens_text, "");
    let auth = authenticator(&site.config());
    assert!(auth.authenticate_at(&a, NOW_MS).is_ok());

    // Broken content: refused (78), the old set stays.
    write(
        &site.path("tokens.toml"),
        &format!("{tokens_text}[[token]]\nid = \"c\"\n"),
        0o640,
    );
    let e = auth.reload(&load(&site.config())).unwrap_err();
    assert_eq!(taskgate::exit::Classify::exit_class(&e).code(), 78, "{e}");
    assert!(auth.authenticate_at(&a, NOW_MS).is_ok());
    // An unknown scope is broken content too.
    write(
        &site.path("tokens.toml"),
        &tokens_text.replace("tasks:read", "tasks:reed"),
        0o640,
    );
    assert!(auth.reload(&load(&site.config())).is_err());
    // Unsafe permissions: refused (77), the old set stays.
    write(&site.path("tokens.toml"), &tokens_text, 0o644);
    let e = auth.reload(&load(&site.config())).unwrap_err();
    assert_eq!(taskgate::exit::Classify::exit_class(&e).code(), 77, "{e}");
    // A broken revocations file or JWKS file keeps it too.
    write(&site.path("tokens.toml"), &tokens_text, 0o640);
    write(
        &site.path("revocations.toml"),
        "[[revoke]]\njti = \"x\"\n",
        0o644,
    );
    assert!(auth.reload(&load(&site.config())).is_err());
    write(&site.path("revocations.toml"), "", 0o644);
    write(&site.path("ed.json"), "{\"keys\": []}", 0o644);
    assert!(auth.reload(&load(&site.config())).is_err());
    // A JWKS holding a private key is refused: it would be a leak.
    let mut private: Value = serde_json::from_str(&site.keys.ed_jwks()).unwrap();
    private["keys"][0]["d"] = json!(b64(site.keys.ed.as_bytes()));
    write(&site.path("ed.json"), &private.to_string(), 0o644);
    let e = auth.reload(&load(&site.config())).unwrap_err();
    assert!(e.to_string().contains("private key"), "{e}");
    write(&site.path("ed.json"), &site.keys.ed_jwks(), 0o644);
    assert!(auth.authenticate_at(&a, NOW_MS).is_ok());

    // A good file that revokes `a` applies at once, without a restart.
    write(
        &site.path("revocations.toml"),
        "[[revoke]]\ntoken = \"a\"\n",
        0o644,
    );
    let summary = auth.reload(&load(&site.config())).unwrap();
    assert_eq!(
        (summary.tokens, summary.issuers, summary.revocations),
        (2, 2, 1)
    );
    assert_eq!(auth.authenticate_at(&a, NOW_MS), Err(Rejection::Revoked));
    assert!(auth.authenticate_at(&b, NOW_MS).is_ok());

    // A reload cannot turn authentication off: that takes a restart.
    let plain = site.path("plain.toml");
    write(&plain, "", 0o644);
    assert!(auth.reload(&load(&plain)).is_err());
    assert_eq!(auth.authenticate_at(&a, NOW_MS), Err(Rejection::Revoked));
}

#[test]
fn without_credentials_authentication_is_off() {
    let dir = private_dir();
    let file = dir.path().join("c.toml");
    write(&file, "[auth]\nrealm = \"x\"\n", 0o644);
    let config = load(&file);
    assert!(!config.auth_enabled());
    assert!(Authenticator::from_config(&config).unwrap().is_none());
}

/// `taskgate check` and `serve` refuse bad credential files alike: 78 for
/// what a file says, 77 for who may read it.
#[test]
fn check_and_serve_refuse_bad_credential_files() {
    let site = Site::new(&entry("a", &secret(), ""), "");
    let state = state_dir(site.dir.path());
    let config = site.config();
    let config = config.to_str().unwrap();
    let state = state.to_str().unwrap();
    let run = |cmd: &[&str]| {
        let mut args = cmd.to_vec();
        args.extend(["--config", config, "--state-dir", state]);
        taskgate(&args, &[])
    };
    let out = run(&["check", "--config-only"]);
    assert!(out.status.success(), "{out:?}");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        report.contains(
            "authentication: on: 1 static tokens, 2 JWT issuers with 3 keys, 0 revocations"
        ),
        "{report}"
    );

    let tokens = site.path("tokens.toml");
    let good = std::fs::read_to_string(&tokens).unwrap();
    let cases: [(&str, u32, i32, &str); 4] = [
        (&good, 0o644, 77, "tokens.toml"),
        (
            &good.replace("tasks:read", "tasks:everything"),
            0o640,
            78,
            "tasks:everything",
        ),
        (&good.replace("sha256:", "md5:"), 0o640, 78, "sha256"),
        ("[[token]]\nid = \"a\"\n", 0o600, 78, "hash"),
    ];
    for (text, mode, code, named) in cases {
        write(&tokens, text, mode);
        for cmd in [
            &["check", "--config-only"][..],
            &["check"],
            &["serve", "--listen", "127.0.0.1:0"],
        ] {
            let out = run(cmd);
            let line = one_line_stderr(&out);
            assert_eq!(out.status.code(), Some(code), "{cmd:?} {mode:o}: {line}");
            assert!(line.contains(named), "{line}");
        }
    }
    std::fs::remove_file(&tokens).unwrap();
    let out = run(&["check", "--config-only"]);
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    // The state directory was never touched by a refused start.
    assert_eq!(std::fs::read_dir(site.path("state")).unwrap().count(), 0);
}

/// A configuration error in `[auth]` names the key.
#[test]
fn auth_settings_are_validated_by_key() {
    let dir = private_dir();
    let file = dir.path().join("c.toml");
    let cases = [
        ("[auth]\nlocal_owner = \"sometimes\"\n", "auth.local_owner"),
        (
            "[auth]\ntokens_file = \"relative.toml\"\n",
            "auth.tokens_file",
        ),
        (
            "[auth]\nresource = \"tasks.example/mcp\"\n",
            "auth.resource",
        ),
        ("[auth]\nrealm = \"a\\\"b\"\n", "auth.realm"),
        ("[auth]\nlocal_owner = \"never\"\n", "no credential"),
        ("[auth]\ntokens = 3\n", "unknown key `tokens`"),
        (
            "[auth]\nresource = \"https://x.test/mcp\"\n[[auth.jwt]]\nissuer = \"i\"\njwks_file = \"/k.json\"\ntenant = \"t\"\nalgorithms = [\"none\"]\n",
            "never accepted",
        ),
        (
            "[auth]\nresource = \"https://x.test/mcp\"\n[[auth.jwt]]\nissuer = \"i\"\njwks_file = \"/k.json\"\ntenant = \"t\"\nalgorithms = [\"HS256\"]\n",
            "hmac_secret_file",
        ),
        (
            "[[auth.jwt]]\nissuer = \"i\"\njwks_file = \"/k.json\"\ntenant = \"t\"\n",
            "auth.resource",
        ),
        (
            "[auth]\nresource = \"https://x.test/mcp\"\n[[auth.jwt]]\nissuer = \"i\"\njwks_file = \"/k.json\"\n",
            "tenant",
        ),
        (
            "[auth]\nresource = \"https://x.test/mcp\"\n[[auth.jwt]]\nissuer = \"i\"\njwks_file = \"/k.json\"\ntenant = \"t\"\nleeway_secs = 301\n",
            "leeway_secs",
        ),
    ];
    let env: HashMap<String, String> = [("HOME".to_string(), "/h".to_string())].into();
    for (text, named) in cases {
        write(&file, text, 0o644);
        let e = Config::load_from(
            &Overrides {
                config_path: Some(file.clone()),
                ..Default::default()
            },
            &env,
        )
        .expect_err(text)
        .to_string();
        assert!(e.contains(named), "{text}: {e}");
    }
}

#[test]
fn token_commands_new_list_revoke_round_trip_and_the_secret_stays_off_disk() {
    let dir = private_dir();
    let tokens_path = dir.path().join("tokens.toml");
    write(&tokens_path, "# issued by the operator\n", 0o640);
    let config = dir.path().join("taskgate.toml");
    write(
        &config,
        &format!("[auth]\ntokens_file = \"{}\"\n", tokens_path.display()),
        0o644,
    );
    let config = config.to_str().unwrap();

    let out = taskgate(
        &[
            "token",
            "new",
            "--id",
            "ci",
            "--tenant",
            "acme",
            "--subject",
            "ci@acme",
            "--scope",
            "tools:call",
            "--scope",
            "tasks:read",
            "--expires",
            "2031-01-01T00:00:00Z",
        ],
        &[],
    );
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let secret = stdout.lines().next().unwrap().to_string();
    assert!(tokens::is_static_shape(&secret), "{stdout}");
    let stanza = stdout.split_once("\n\n").unwrap().1;
    assert!(
        stanza.starts_with("[[token]]\n") && !stanza.contains(&secret),
        "{stanza}"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("systemctl reload taskgate"));

    // The operator pastes the stanza.
    let mut text = std::fs::read_to_string(&tokens_path).unwrap();
    text.push_str(stanza);
    write(&tokens_path, &text, 0o640);
    let auth = authenticator(Path::new(config));
    let p = auth.authenticate_at(&secret, NOW_MS).unwrap();
    assert_eq!((p.tenant.as_str(), p.subject.as_str()), ("acme", "ci@acme"));

    let out = taskgate(&["token", "list", "--config", config], &[]);
    assert!(out.status.success(), "{out:?}");
    let listing = String::from_utf8(out.stdout).unwrap();
    assert!(
        listing.contains("ci\tacme\tci@acme\ttasks:read,tools:call\t2031-01-01T00:00:00Z\tno"),
        "{listing}"
    );
    assert!(
        !listing.contains("sha256") && !listing.contains(&secret),
        "{listing}"
    );

    // Revoke: mode kept, the comment kept, the operator told to reload.
    let out = taskgate(&["token", "revoke", "ci", "--config", config], &[]);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("systemctl reload taskgate"));
    let meta = std::fs::metadata(&tokens_path).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o640);
    let after = std::fs::read_to_string(&tokens_path).unwrap();
    assert!(
        after.starts_with("# issued by the operator\n") && after.contains("revoked = true"),
        "{after}"
    );
    let out = taskgate(&["token", "list", "--config", config], &[]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("\tyes"),
        "{out:?}"
    );
    // Still accepted until the daemon reloads; refused after.
    assert!(auth.authenticate_at(&secret, NOW_MS).is_ok());
    auth.reload(&load(Path::new(config))).unwrap();
    assert_eq!(
        auth.authenticate_at(&secret, NOW_MS),
        Err(Rejection::Revoked)
    );

    // Revoking twice is harmless; an unknown id is a usage error.
    let out = taskgate(&["token", "revoke", "ci", "--config", config], &[]);
    assert!(out.status.success(), "{out:?}");
    let out = taskgate(&["token", "revoke", "nobody", "--config", config], &[]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    // A bad scope on `new` is refused before any secret is printed.
    let out = taskgate(
        &[
            "token",
            "new",
            "--id",
            "x",
            "--tenant",
            "t",
            "--subject",
            "s",
            "--scope",
            "everything",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(out.stdout.is_empty());

    // The secret is in no file of the directory (nor a leftover temporary).
    let mut names = Vec::new();
    for e in std::fs::read_dir(dir.path()).unwrap() {
        let path = e.unwrap().path();
        names.push(path.file_name().unwrap().to_string_lossy().to_string());
        let bytes = std::fs::read(&path).unwrap();
        assert!(
            !String::from_utf8_lossy(&bytes).contains(&secret),
            "{} holds the secret",
            path.display()
        );
    }
    names.sort();
    assert_eq!(names, ["taskgate.toml", "tokens.toml"]);
}

/// A JWT that verified is remembered (by its digest) so that the next
/// request skips the signature check; the answer is the same as a fresh
/// verification at every moment, and a reload's revocation applies to it.
#[test]
fn a_remembered_jwt_answers_as_a_fresh_verification_would() {
    let site = Site::new("", "");
    let auth = authenticator(&site.config());
    let k = &site.keys;
    // Valid from NOW - 10 - 30 (nbf and iat, with the 30 s leeway) until
    // NOW + 600 + 30 (exp with the leeway).
    let token = k.sign_ed(&claims());
    let fresh = auth.authenticate_at(&token, NOW_MS).expect("verifies");
    // Remembered now: the same principal within the window, at its edges.
    for at in [NOW_MS, (NOW - 40) * 1000, (NOW + 630) * 1000 - 1] {
        assert_eq!(
            auth.authenticate_at(&token, at).as_ref(),
            Ok(&fresh),
            "at {at}"
        );
    }
    // Outside it, the reason a fresh verification gives.
    assert_eq!(
        auth.authenticate_at(&token, (NOW + 630) * 1000).map(|_| ()),
        Err(Rejection::Expired)
    );
    assert_eq!(
        auth.authenticate_at(&token, (NOW - 40) * 1000 - 1)
            .map(|_| ()),
        Err(Rejection::NotYetValid)
    );
    // Without iat the lifetime counts from now: the window opens when exp
    // is within the 3600 s cap.
    let no_iat = k.sign_ed(&without(without(claims(), "iat"), "nbf"));
    assert!(auth.authenticate_at(&no_iat, NOW_MS).is_ok());
    assert_eq!(
        auth.authenticate_at(&no_iat, (NOW + 600 - 3600) * 1000 - 1)
            .map(|_| ()),
        Err(Rejection::LifetimeTooLong)
    );
    // One changed byte of the signature is another token: verified afresh
    // and refused.
    let mut forged = token.clone().into_bytes();
    let last = forged.len() - 2;
    forged[last] = if forged[last] == b'A' { b'B' } else { b'A' };
    assert!(
        auth.authenticate_at(&String::from_utf8(forged).unwrap(), NOW_MS)
            .is_err()
    );
    // A revocation a reload brings applies to the remembered token at once.
    write(
        &site.path("revocations.toml"),
        &format!(
            "[[revoke]]\nissuer = \"{ED_ISSUER}\"\njti = \"jti-1\"\nuntil = \"2030-03-18T00:00:00Z\"\n"
        ),
        0o644,
    );
    auth.reload(&load(&site.config())).expect("reload");
    assert_eq!(
        auth.authenticate_at(&token, NOW_MS).map(|_| ()),
        Err(Rejection::Revoked)
    );
}

/// The remembered JWTs are bounded: past the bound the expired ones go,
/// then all of them, and every token still answers as it should.
#[test]
fn remembered_jwts_are_bounded() {
    let site = Site::new("", "");
    let auth = authenticator(&site.config());
    let k = &site.keys;
    let max = taskgate::auth::MAX_CACHED_JWTS;
    let tokens: Vec<String> = (0..=max)
        .map(|i| k.sign_ed(&with(claims(), "jti", json!(format!("jti-{i}")))))
        .collect();
    for (i, t) in tokens.iter().enumerate() {
        assert!(auth.authenticate_at(t, NOW_MS).is_ok(), "token {i}");
        assert!(
            auth.cached_jwts() <= max,
            "after token {i}: {}",
            auth.cached_jwts()
        );
    }
    // The bound was reached and the cache emptied to take the last one.
    assert_eq!(auth.cached_jwts(), 1);
    assert!(auth.authenticate_at(&tokens[0], NOW_MS).is_ok());
    assert_eq!(auth.cached_jwts(), 2);
}
