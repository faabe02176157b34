//! `taskgate upstream`: list the daemon's upstreams, show one's tools
//! against their pins, pin the tools reviewed.

use std::path::PathBuf;

use taskgate::admin;
use taskgate::cli::{UpstreamAction, UpstreamArgs, UpstreamListArgs};
use taskgate::config;
use taskgate::exit::{ExitClass, Refusal};
use taskgate::upstream::{Pins, UpstreamStatus, diff};

use super::out;

pub(crate) fn upstream(args: &UpstreamArgs) -> Result<(), Refusal> {
    match &args.action {
        UpstreamAction::List(a) => list(a),
        UpstreamAction::Show(a) => show(&a.alias, &a.list),
        UpstreamAction::Pin(a) => pin(a),
    }
}

/// The configuration file whose pins are meant: `--config`, else
/// `$TASKGATE_CONFIG`, else the packaged service's.
fn config_file(given: Option<&PathBuf>) -> Result<PathBuf, Refusal> {
    let path = given
        .cloned()
        .or_else(|| std::env::var_os(config::ENV_CONFIG_PATH).map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(config::PACKAGE_CONFIG_PATH));
    if !path.is_file() {
        return Err(Refusal::new(
            ExitClass::Usage,
            format!(
                "{}: no configuration file here, so no pins file beside it; name the configuration with --config",
                path.display()
            ),
        ));
    }
    Ok(path)
}

fn list(a: &UpstreamListArgs) -> Result<(), Refusal> {
    let all = admin::client::upstreams(&a.common.overrides(), a.socket.as_deref(), None)?;
    if a.json {
        return out(serde_json::to_string_pretty(&all).unwrap_or_default());
    }
    if all.is_empty() {
        return out("no upstreams are configured ([[upstream]] in the configuration file)");
    }
    for u in &all {
        out(summary(u))?;
        if let Some(e) = &u.last_error {
            out(format!("    last error: {e}"))?;
        }
    }
    Ok(())
}

fn summary(u: &UpstreamStatus) -> String {
    let protocol = u.protocol_version.as_deref().unwrap_or("-");
    format!(
        "{}  {} since {}  {} {}  protocol {protocol}{}  route echo {}  tools {} ({} available, {} withheld, {} unpinned){}",
        u.alias,
        u.state,
        u.since,
        u.transport,
        u.target,
        if u.tasks_advertised {
            ", advertises Tasks"
        } else {
            ""
        },
        if u.route_echo == taskgate::config::RouteEcho::CreationOnly.as_str() {
            "creation_only (weaker: polls without an echo are trusted)"
        } else {
            u.route_echo.as_str()
        },
        u.tools,
        u.available,
        u.withheld,
        u.unpinned,
        u.session
            .as_deref()
            .map(|s| format!("  session {s}"))
            .unwrap_or_default(),
    )
}

fn show(alias: &str, a: &UpstreamListArgs) -> Result<(), Refusal> {
    let one = admin::client::upstreams(&a.common.overrides(), a.socket.as_deref(), Some(alias))?;
    let Some(u) = one.into_iter().next() else {
        return Err(Refusal::new(
            ExitClass::Protocol,
            "the daemon answered no upstream",
        ));
    };
    if a.json {
        out(serde_json::to_string_pretty(&u).unwrap_or_default())?;
    } else {
        // The pins file holds what was reviewed: a changed tool is shown
        // against it.
        let pins = config_file(a.common.config.as_ref())
            .ok()
            .and_then(|f| Pins::load(&config::pins_file(&f)).ok())
            .unwrap_or_default();
        out(summary(&u))?;
        if let Some(e) = &u.last_error {
            out(format!("    last error: {e}"))?;
        }
        for c in &u.capabilities {
            out(format!(
                "  {}  {}  {}  effect {}  task {}{}",
                c.name,
                c.digest,
                c.pin,
                c.effect,
                c.task,
                if c.approval {
                    "  approval required"
                } else {
                    ""
                }
            ))?;
            if let Some(w) = &c.withheld {
                out(format!("      withheld: {w}"))?;
            }
            if c.pin == "differs" {
                match pins.reviewed(&u.alias, &c.tool) {
                    Some(old) => {
                        out("      changed since the pin:")?;
                        for line in diff::changes(&old, &c.described) {
                            out(format!("        {line}"))?;
                        }
                    }
                    None => out(format!(
                        "      pinned {} (the pins file holds no reviewed description to compare with)",
                        c.pinned_digest.as_deref().unwrap_or("?")
                    ))?,
                }
            }
        }
    }
    if u.withheld > 0 {
        return Err(Refusal::new(
            ExitClass::CallFailed,
            format!("{} of {}'s tools are withheld", u.withheld, u.alias),
        ));
    }
    Ok(())
}

/// How long `pin` waits for another `pin` of the same file to finish.
const PIN_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// An exclusive lock (flock) on the directory of the pins file: the file
/// itself is replaced whole by each write, so it cannot carry the lock.
fn lock_pins(pins: &std::path::Path) -> Result<std::fs::File, Refusal> {
    let dir = pins
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let handle = std::fs::File::open(dir).map_err(|e| {
        Refusal::new(
            ExitClass::Io,
            format!("cannot open {} to lock the pins file: {e}", dir.display()),
        )
    })?;
    let start = std::time::Instant::now();
    loop {
        match handle.try_lock() {
            Ok(()) => return Ok(handle),
            Err(std::fs::TryLockError::WouldBlock) if start.elapsed() < PIN_LOCK_WAIT => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(Refusal::new(
                    ExitClass::CallFailed,
                    format!(
                        "another `taskgate upstream pin` has held {} for {} s; nothing was pinned: try again once it has finished",
                        dir.display(),
                        PIN_LOCK_WAIT.as_secs()
                    ),
                ));
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(Refusal::new(
                    ExitClass::Io,
                    format!("cannot lock {}: {e}", dir.display()),
                ));
            }
        }
    }
}

fn pin(a: &taskgate::cli::UpstreamPinArgs) -> Result<(), Refusal> {
    if a.expect.is_some() && a.tools.len() != 1 {
        return Err(Refusal::new(
            ExitClass::Usage,
            "--expect goes with exactly one TOOL",
        ));
    }
    let file = config_file(a.common.config.as_ref())?;
    let pins_path = config::pins_file(&file);
    // Read, change and write the file whole under one lock, so that two
    // pins at once cannot lose one another's change.
    let _lock = lock_pins(&pins_path)?;
    let mut pins = Pins::load(&pins_path)?;
    let one = admin::client::upstreams(&a.common.overrides(), a.socket.as_deref(), Some(&a.alias))?;
    let Some(u) = one.into_iter().next() else {
        return Err(Refusal::new(
            ExitClass::Protocol,
            "the daemon answered no upstream",
        ));
    };
    if u.capabilities.is_empty() {
        return Err(Refusal::new(
            ExitClass::Unreachable,
            format!(
                "upstream {} lists no tools now ({}{}); pin once it is connected",
                u.alias,
                u.state,
                u.last_error
                    .as_deref()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default()
            ),
        ));
    }
    let chosen: Vec<_> = if a.tools.is_empty() {
        u.capabilities.iter().collect()
    } else {
        let mut v = Vec::new();
        for t in &a.tools {
            match u.capabilities.iter().find(|c| &c.tool == t) {
                Some(c) => v.push(c),
                None => {
                    return Err(Refusal::new(
                        ExitClass::Usage,
                        format!(
                            "upstream {} lists no tool {t:?}; `taskgate upstream show {}` lists its tools",
                            u.alias, u.alias
                        ),
                    ));
                }
            }
        }
        v
    };
    if let (Some(expect), [c]) = (&a.expect, chosen.as_slice())
        && &c.digest != expect
    {
        return Err(Refusal::new(
            ExitClass::CallFailed,
            format!(
                "{}'s live digest is {}, not the {expect} you expected: it changed since you reviewed it; nothing was pinned",
                c.name, c.digest
            ),
        ));
    }
    let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
    for c in &chosen {
        pins.set(
            &u.alias,
            &c.tool,
            &c.digest,
            now.clone(),
            Some(&c.described),
        );
    }
    pins.write(&pins_path)?;
    // Read back as the daemon will read it.
    Pins::load(&pins_path)?;
    for c in &chosen {
        out(format!("pinned {} {}", c.name, c.digest))?;
    }
    out(format!(
        "wrote {}; apply with `taskgate reload` (systemctl reload taskgate)",
        pins_path.display()
    ))
}
