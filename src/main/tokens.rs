//! `taskgate token new|list|revoke`.

use super::*;

/// `taskgate token new|list|revoke`.
pub(crate) fn token(args: &TokenArgs) -> Result<(), Refusal> {
    use taskgate::auth::tokens;
    match &args.action {
        TokenAction::New(a) => {
            let (secret, stanza) = tokens::new_token(&tokens::NewToken {
                id: a.id.clone(),
                tenant: a.tenant.clone(),
                subject: a.subject.clone(),
                scopes: a.scopes.clone(),
                expires: a.expires.clone(),
                issuer: a.issuer.clone(),
            })
            .map_err(|e| Refusal::new(ExitClass::Usage, e.to_string()))?;
            // The secret exists only in this output: it is on no disk.
            out(&secret)?;
            out("")?;
            out(stanza.trim_end())?;
            say(
                "taskgate: the secret (first line) is shown only this once; add the stanza to the tokens file ([auth] tokens_file), then run `systemctl reload taskgate`",
            );
            Ok(())
        }
        TokenAction::List(file) => {
            let path = tokens_file(file)?;
            let set = tokens::StaticTokens::load(&path)?;
            out("id\ttenant\tsubject\tscopes\texpires\trevoked")?;
            for t in set.entries() {
                let expires = t.expires_ms.map_or("never".to_string(), |ms| {
                    chrono::DateTime::from_timestamp_millis(ms).map_or(ms.to_string(), |d| {
                        d.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                    })
                });
                let scopes: Vec<&str> = t.scopes.iter().map(String::as_str).collect();
                out(format!(
                    "{}\t{}\t{}\t{}\t{expires}\t{}",
                    t.id,
                    t.tenant,
                    t.subject,
                    if scopes.is_empty() {
                        "-".to_string()
                    } else {
                        scopes.join(",")
                    },
                    if t.revoked { "yes" } else { "no" }
                ))?;
            }
            Ok(())
        }
        TokenAction::Revoke(a) => {
            let path = tokens_file(&a.file)?;
            let changed = tokens::revoke(&path, &a.id)?;
            if changed {
                out(format!(
                    "token {:?} is marked revoked in {}; run `systemctl reload taskgate` to apply it (no restart needed)",
                    a.id,
                    path.display()
                ))
            } else {
                out(format!(
                    "token {:?} was already revoked in {}; run `systemctl reload taskgate` if the daemon has not read it yet",
                    a.id,
                    path.display()
                ))
            }
        }
    }
}

/// The tokens file the configuration names: `--config`, else
/// `$TASKGATE_CONFIG`, else the packaged service's file.
pub(crate) fn tokens_file(args: &TokenFileArgs) -> Result<std::path::PathBuf, Refusal> {
    let mut config_path = args.config.clone();
    if config_path.is_none() && std::env::var_os(config::ENV_CONFIG_PATH).is_none() {
        config_path = Some(std::path::PathBuf::from(config::PACKAGE_CONFIG_PATH));
    }
    let settings = config::configured_auth(&config::Overrides {
        config_path,
        ..Default::default()
    })?;
    settings.and_then(|s| s.tokens_file).ok_or_else(|| {
        Refusal::new(
            ExitClass::Config,
            "the configuration sets no [auth] tokens_file; set it (see taskgate.toml(5)) and name the configuration with --config",
        )
    })
}
