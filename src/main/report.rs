//! What `taskgate check` prints: the configuration, authentication, tool
//! confinement and every durable part.

use super::*;

/// `check --config-only`: what serve and a reload would accept, without
/// the state directory.
pub(crate) fn check_config(overrides: &config::Overrides) -> Result<(), Refusal> {
    let startup::Effective {
        config,
        tools,
        pins,
        ..
    } = startup::effective(overrides, Vec::new())?;
    let file = match &config.file {
        Some(path) => path.display().to_string(),
        None => "no file (the embedded defaults)".to_string(),
    };
    out(format!(
        "ok: configuration {file}: {} tools, listen {}",
        tools.own_specs().count(),
        config.server.listen
    ))?;
    out(format!(
        "state directory {} ({}); not opened",
        config.state_dir.display(),
        config.state_dir_source
    ))?;
    auth_report(&config)?;
    tool_report(&tools)?;
    upstream_report(&config, &pins)
}

/// Each upstream as configured, its pins, and pins of upstreams no longer
/// configured. Nothing is connected: what an upstream offers is for the
/// running daemon to find out (`taskgate upstream list`).
fn upstream_report(
    config: &config::Config,
    pins: &taskgate::upstream::Pins,
) -> Result<(), Refusal> {
    for u in &config.upstreams {
        out(format!(
            "upstream {}: {} {}; its tools default to effect {} and task {}{}",
            u.alias,
            u.kind(),
            u.target(),
            taskgate::upstream::effect_name(u.effect),
            taskgate::upstream::task_name(u.task),
            if pins.any_for(&u.alias) {
                "; has pins"
            } else {
                "; no pins yet (`taskgate upstream pin` once it is connected)"
            }
        ))?;
    }
    for alias in pins.upstreams() {
        if !config.upstreams.iter().any(|u| u.alias == alias) {
            out(format!(
                "warning: the pins file holds pins of upstream {alias:?}, which is not configured; they are unused"
            ))?;
        }
    }
    Ok(())
}

/// What `[auth]` admits. `effective` has read and validated the credential
/// files already; this reads them again for the counts.
fn auth_report(config: &config::Config) -> Result<(), Refusal> {
    match taskgate::auth::Authenticator::from_config(config)? {
        None => out(
            "authentication: off (no [auth] tokens_file and no [[auth.jwt]] issuer): every caller is the local owner",
        ),
        Some(auth) => out(format!("authentication: on: {}", auth.summary())),
    }
}

/// The confinement in force for tools, and the tools' warnings.
fn tool_report(tools: &taskgate::tools::Registry) -> Result<(), Refusal> {
    for line in tools.confinement().lines() {
        out(line)?;
    }
    for w in tools.warnings() {
        out(format!("warning: {w}"))?;
    }
    Ok(())
}

pub(crate) fn check(overrides: &config::Overrides) -> Result<(), Refusal> {
    let (source, outcome) = startup::check(overrides)?;
    let startup::Effective {
        config,
        tools,
        pins,
        ..
    } = startup::effective(overrides, Vec::new())?;
    auth_report(&config)?;
    tool_report(&tools)?;
    upstream_report(&config, &pins)?;
    match outcome {
        CheckOutcome::NotCreatedYet(dir) => out(format!(
            "state directory {} does not exist yet; `taskgate serve` creates it",
            dir.display()
        )),
        CheckOutcome::Checked(dir, lines) => {
            out(format!(
                "state directory {} ({source})",
                dir.path().display()
            ))?;
            lines.into_iter().try_for_each(out)
        }
    }
}
