//! `taskgate routes`: the daemon's durable routes over the admin socket.

use taskgate::admin::{self, RouteStatus};
use taskgate::cli::{RoutesAction, RoutesArgs};
use taskgate::exit::Refusal;

use super::out;

pub(crate) fn routes(args: &RoutesArgs) -> Result<(), Refusal> {
    match &args.action {
        RoutesAction::List(a) => {
            let l = &a.list;
            let all =
                admin::client::routes(&l.common.overrides(), l.socket.as_deref(), None, a.open)?;
            if l.json {
                return out(serde_json::to_string_pretty(&all).unwrap_or_default());
            }
            if all.is_empty() {
                return out(if a.open {
                    "no open routes"
                } else {
                    "no unexpired routes"
                });
            }
            for r in &all {
                out(summary(r))?;
                if r.phase == "reconciliation_required"
                    && let Some(reason) = &r.reason
                {
                    out(format!("    reconciliation: {reason}"))?;
                }
            }
            Ok(())
        }
        RoutesAction::Show(a) => {
            let l = &a.list;
            let one = admin::client::routes(
                &l.common.overrides(),
                l.socket.as_deref(),
                Some(&a.id),
                false,
            )?;
            if l.json {
                return out(serde_json::to_string_pretty(&one).unwrap_or_default());
            }
            for r in &one {
                show(r)?;
            }
            Ok(())
        }
    }
}

fn summary(r: &RouteStatus) -> String {
    format!(
        "{}  {:<23}  {:<9}  {}  created {}",
        r.id, r.phase, r.status, r.capability, r.created
    )
}

fn show(r: &RouteStatus) -> Result<(), Refusal> {
    let field = |name: &str, value: &str| out(format!("{name:<20} {value}"));
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    field("route", &r.id)?;
    field("phase", &r.phase)?;
    field(
        "caller reads",
        &if r.reconciliation_required {
            format!("{} (reconciliation required)", r.status)
        } else {
            r.status.clone()
        },
    )?;
    field("reason", &opt(&r.reason))?;
    field("capability", &r.capability)?;
    field("upstream", &r.upstream)?;
    field(
        "echo rule",
        &match r.route_echo.as_deref() {
            Some("creation_only") => {
                "creation_only (weaker: polls without an echo are trusted)".to_string()
            }
            Some(rule) => rule.to_string(),
            None => "- (the upstream is no longer configured)".to_string(),
        },
    )?;
    field("upstream task", &opt(&r.upstream_task_id))?;
    field("session", &opt(&r.session))?;
    field("coordinator", &opt(&r.coordinator))?;
    field("decided by", &opt(&r.decided_by))?;
    field(
        "cancel",
        &match &r.cancel_reason {
            Some(reason) => format!(
                "{reason}; {} forwarded, {}",
                r.cancel_attempts,
                if r.cancel_acknowledged {
                    "acknowledged"
                } else {
                    "not acknowledged"
                }
            ),
            None => "-".into(),
        },
    )?;
    field("owner", &r.owner)?;
    field("schema digest", &r.schema_digest)?;
    field("request digest", &r.request_digest)?;
    field("binding digest", &r.binding_digest)?;
    field("created", &r.created)?;
    field("updated", &r.updated)?;
    field("deadline", &r.deadline)?;
    field("expires", &r.expires)?;
    if let Some(b) = &r.binding {
        out("binding:")?;
        out(serde_json::to_string_pretty(b).unwrap_or_default())?;
    }
    Ok(())
}
