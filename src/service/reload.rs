//! Configuration reloads (SIGHUP, or `reload` on the admin socket; one at
//! a time): RELOADING=1, the file read and validated as at startup, the
//! credentials renewed first, startup-only keys kept, tools and reloadable
//! keys swapped in for calls admitted afterwards, READY=1.
//!
//! `startup::effective` is the only function that turns overrides, the
//! environment and the file into validated settings and compiled tools;
//! `serve`, `check`, `check --config-only` and SIGHUP all call it, so what one
//! accepts the others accept. `config/keys.rs` marks each key `AtStart` or
//! `Reload`. A reload (SIGHUP, whose handler is installed at step 0, or a
//! `reload` request on the admin socket, which is what `taskgate reload` and
//! the unit's `ExecReload=` send; the main loop runs both through
//! `Process::reload_configuration`, one at a time) sends RELOADING=1 with
//! MONOTONIC_USEC, re-runs step 1 (which reads and validates the credential
//! files and the TLS pair too), and then: on an error changes nothing (logged
//! at error); then renews the credentials before anything else
//! (`Process::renew_credentials`): the TLS pair is read again and the validated
//! credential set is swapped into the running `auth::Authenticator` whole, so a
//! request sees the old set or the new one; a pair that does not load, or a
//! file that would turn authentication on or off (which changes who every open
//! session acts as), refuses the whole reload; otherwise it compares effective
//! values key by key with the configuration the daemon started with
//! (`Config::changes`), logs one warning per changed startup-only key and keeps
//! its old value, and swaps the tools and `tasks.poll_interval_ms` into
//! `TaskService` as one `Arc<Live>` (`TaskService::reload`). A call reads
//! `Live` at admission and keeps the `Arc<dyn Runner>` it found, so a running
//! or admitted call never sees a reload; nothing is stopped. Then the upstreams
//! are applied (`Upstreams::apply`, which waits for no upstream): an added one
//! starts connecting; a removed one is retired, its calls in flight finishing
//! first (each within its request timeout) while new calls no longer find it;
//! one whose connection settings changed (transport, program, URL, credential
//! file, bounds) is connected again; one whose tool settings or pins alone
//! changed keeps its connection and has its catalog rebuilt, so a re-pinned
//! tool is served and a tool whose pin no longer matches is withheld at once.
//! READY=1 closes the reload, its numbered outcome in STATUS=. Listener, store,
//! bounds and the state directory are startup-only: they size or own what
//! already runs. The admin caller is answered after READY=1 with what changed
//! (reloadable keys against the last applied file, tools added, removed or
//! redefined, upstreams added, removed, connected again or kept, startup-only
//! keys kept), or with the refusal (78 for an invalid file), so `systemctl
//! reload` ends when the new settings apply and fails on a refused file;
//! requests still queued when stopping begins are answered at once that nothing
//! was reloaded.

use std::sync::Arc;

use sd_notify::NotifyState;

use super::chores::status_line;
use super::{Options, Process, lock, notify, set_log_filter};
use crate::auth::AuthError;
use crate::config::{Config, keys};
use crate::exit::Refusal;
use crate::ops::{OpsError, Reloaded};
use crate::startup;
use crate::tools::Registry;

/// What a reload needs: how the daemon was started, and the configuration
/// it started with (startup-only keys are compared with that one, so a
/// refused change is named again at every reload until a restart).
pub(super) struct Reload {
    options: Options,
    started: Config,
    /// The configuration the last applied reload read (at first the one
    /// the daemon started with): reloadable keys and tools are reported as
    /// changed against it.
    applied: Config,
    /// Reloads so far; numbered on the STATUS line, so that a reader can
    /// tell one reload's outcome from the previous one's.
    count: u64,
    /// The outcome of the last reload, for the STATUS line.
    pub(super) last: Arc<std::sync::Mutex<Option<String>>>,
}

impl Reload {
    pub(super) fn new(options: Options, config: &Config) -> Reload {
        Reload {
            options,
            started: config.clone(),
            applied: config.clone(),
            count: 0,
            last: Arc::default(),
        }
    }
}

impl Process {
    /// One reload, between RELOADING=1 and READY=1 (systemd's reload
    /// protocol: MONOTONIC_USEC ties the two to this reload). The one code
    /// path for SIGHUP and `taskgate reload`.
    pub(super) async fn reload_configuration(&mut self) -> Result<Reloaded, OpsError> {
        match NotifyState::monotonic_usec_now() {
            Ok(now) => notify(&[NotifyState::Reloading, now]),
            Err(_) => notify(&[NotifyState::Reloading]),
        }
        self.reload.count += 1;
        let number = self.reload.count;
        let validated = self
            .reload
            .options
            .effective()
            .and_then(|mut new| self.renew_credentials(&mut new).map(|()| new));
        let outcome = match validated {
            Ok(new) => {
                let upstreams = (
                    new.config.upstreams.clone(),
                    new.pins.clone(),
                    new.protected.clone(),
                );
                let mut done = self.apply(number, new);
                let applied = self
                    .upstreams
                    .apply(&upstreams.0, &upstreams.1, upstreams.2)
                    .await;
                let changed = !(applied.added.is_empty()
                    && applied.removed.is_empty()
                    && applied.restarted.is_empty()
                    && applied.updated.is_empty());
                let line = format!(
                    "upstreams: added: {}; removed: {}; connected again (connection settings changed): {}; tool settings or pins changed, connection kept: {}",
                    list(&applied.added.iter().collect::<Vec<_>>()),
                    list(&applied.removed.iter().collect::<Vec<_>>()),
                    list(&applied.restarted.iter().collect::<Vec<_>>()),
                    list(&applied.updated.iter().collect::<Vec<_>>()),
                );
                tracing::info!("configuration reloaded: {line}");
                if changed {
                    // Before the closing line about running tasks.
                    let at = done.lines.len().saturating_sub(1);
                    if changed && done.lines.iter().any(|l| l == NOTHING_CHANGED) {
                        done.lines.retain(|l| l != NOTHING_CHANGED);
                    }
                    let at = at.min(done.lines.len().saturating_sub(1));
                    done.lines.insert(at, line);
                }
                Ok(done)
            }
            Err(refusal) => {
                tracing::error!(
                    "configuration reload refused: {}; still running on the previous configuration",
                    refusal.message
                );
                Err(OpsError::ReloadRefused {
                    class: refusal.class,
                    message: format!(
                        "reload {number} refused: {}; the daemon goes on with its previous configuration",
                        refusal.message
                    ),
                })
            }
        };
        let summary = match &outcome {
            Err(_) => "refused (invalid configuration; see the log)".to_string(),
            Ok(done) if done.kept.is_empty() => "applied".to_string(),
            Ok(done) => format!(
                "applied, except startup-only {} (restart to apply)",
                done.kept.join(", ")
            ),
        };
        *lock(&self.reload.last) = Some(format!("reload {number} {summary}"));
        let describe = self.describe.clone();
        let status = match describe {
            Some(describe) => status_line(&self.svc, &self.store, &describe()).await,
            None => String::new(),
        };
        self.board.ready(&status);
        outcome
    }

    /// The reload's credential step, before anything else is applied: the
    /// TLS pair is read again and the validated credential set swapped in.
    /// Turning authentication on or off is refused (it changes who every
    /// open session acts as; a restart does it), and so is a TLS pair that
    /// does not load, keeping the one in force.
    fn renew_credentials(&mut self, new: &mut startup::Effective) -> Result<(), Refusal> {
        if let Some(tls) = &self.tls {
            tls.reload().map_err(Refusal::from)?;
        }
        match (&self.auth, new.auth.take()) {
            (Some(running), Some(fresh)) => {
                let summary = running.adopt(fresh);
                tracing::info!("credentials reloaded: {summary}");
                Ok(())
            }
            (None, None) => Ok(()),
            (Some(_), None) => Err(AuthError::OnOff("off").into()),
            (None, Some(_)) => Err(AuthError::OnOff("on").into()),
        }
    }

    /// Applies a validated configuration: the reloadable parts go to new
    /// calls, a changed startup-only key is named and left as it started.
    /// Returns what changed, for the caller of `taskgate reload`.
    fn apply(&mut self, number: u64, new: startup::Effective) -> Reloaded {
        let mut kept = Vec::new();
        let mut kept_lines = Vec::new();
        for change in self.reload.started.changes(&new.config) {
            if change.key.is_startup_only() {
                tracing::warn!(
                    key = %change.key.dotted(),
                    "configuration reload: {} = {} in the new configuration, but it applies at start only; keeping {} until a restart",
                    change.key.dotted(),
                    change.new,
                    change.old
                );
                kept_lines.push(format!(
                    "not applied: {} = {} applies at start only; the daemon keeps {} until a restart",
                    change.key.dotted(),
                    change.new,
                    change.old
                ));
                kept.push(change.key.dotted());
            }
        }
        // Reloadable keys, against what the previous reload applied.
        let mut changed: Vec<String> = self
            .reload
            .applied
            .changes(&new.config)
            .into_iter()
            .filter(|c| !c.key.is_startup_only())
            .map(|c| format!("changed: {} {} -> {}", c.key.dotted(), c.old, c.new))
            .collect();
        let names = |r: &Registry| -> std::collections::BTreeSet<String> {
            r.own_specs().map(|s| s.name.clone()).collect()
        };
        let before = names(&self.svc.tools());
        let after = names(&new.tools);
        let added: Vec<&String> = after.difference(&before).collect();
        let removed: Vec<&String> = before.difference(&after).collect();
        // A tool of the same name whose definition differs in the file.
        let redefined: Vec<&String> = new
            .config
            .tools
            .iter()
            .filter(|t| {
                self.reload
                    .applied
                    .tools
                    .iter()
                    .any(|old| old.name == t.name && *old != **t)
            })
            .map(|t| &t.name)
            .collect();
        if !(added.is_empty() && removed.is_empty() && redefined.is_empty()) {
            changed.push(format!(
                "changed: tools (added: {}; removed: {}; redefined: {})",
                list(&added),
                list(&removed),
                list(&redefined)
            ));
        }
        let poll_interval = new.config.tasks.poll_interval;
        tracing::info!(
            tools = after.len(),
            "configuration reloaded: {} tools (added: {}; removed: {}; redefined: {}), {} = {} ms; running tasks keep the tools they started with",
            after.len(),
            list(&added),
            list(&removed),
            list(&redefined),
            keys::TASKS_POLL_INTERVAL_MS.dotted(),
            poll_interval.as_millis()
        );
        new.tools.log_confinement();
        // The first tool that needs approval opens the journal now (its
        // settings are the ones the daemon started with).
        if self.svc.approvals().is_none() && new.config.needs_approvals() {
            self.svc
                .attach_approvals(std::sync::Arc::new(crate::tasks::Approvals::open(
                    &self.reload.applied.approvals,
                    self.reload.applied.tasks.default_ttl,
                )));
        }
        self.svc
            .reload(new.tools.with_source(self.upstreams.clone()), poll_interval);
        set_log_filter(&new.config.log.filter);
        self.reload.applied = new.config;

        let mut lines = vec![if kept.is_empty() {
            format!("reload {number}: applied")
        } else {
            format!(
                "reload {number}: applied, except startup-only {} (restart to apply)",
                kept.join(", ")
            )
        }];
        if changed.is_empty() {
            lines.push(NOTHING_CHANGED.to_string());
        }
        lines.extend(changed);
        lines.extend(kept_lines);
        lines.push("running tasks keep the tool definitions they started with".to_string());
        Reloaded {
            number,
            kept,
            lines,
        }
    }
}

const NOTHING_CHANGED: &str = "no reloadable setting or tool changed";

/// `a, b` or `none`.
fn list(names: &[&String]) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names
            .iter()
            .map(|n| n.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}
