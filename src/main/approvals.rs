//! `taskgate approvals`: proposals and decisions over the admin socket.

use taskgate::admin::ApprovalsStatus;
use taskgate::admin::{self, Decision, Request};
use taskgate::approvals::Proposal;
use taskgate::cli::{ApprovalsAction, ApprovalsArgs, UpstreamListArgs};
use taskgate::exit::Refusal;

use super::out;

pub(crate) fn approvals(args: &ApprovalsArgs) -> Result<(), Refusal> {
    match &args.action {
        ApprovalsAction::List(a) => {
            let request = Request::Approvals {
                id: None,
                pending: a.pending,
            };
            let (all, journal) = ask(&a.list, request)?;
            if a.list.json {
                return json(&all, &journal);
            }
            disabled(&journal)?;
            if all.is_empty() {
                return out(if a.pending {
                    "no proposals wait for a decision"
                } else {
                    "no proposals"
                });
            }
            for p in &all {
                out(format!(
                    "{}  {:<9}  {}  {}  decide before {}",
                    p.id,
                    p.state.as_str(),
                    p.tool,
                    p.principal,
                    time(p.decision_deadline_ms)
                ))?;
            }
            Ok(())
        }
        ApprovalsAction::Show(a) => {
            let request = Request::Approvals {
                id: Some(a.id.clone()),
                pending: false,
            };
            let (one, journal) = ask(&a.list, request)?;
            if a.list.json {
                return json(&one, &journal);
            }
            one.iter().try_for_each(show)
        }
        ApprovalsAction::Approve(a) => {
            let valid_for_ms = a.valid_for.map(|d| d.as_millis() as i64);
            let request = Request::Decide {
                id: a.id.clone(),
                decision: Decision::Approve { valid_for_ms },
            };
            decided(&a.list, request)
        }
        ApprovalsAction::Reject(a) => {
            let request = Request::Decide {
                id: a.id.clone(),
                decision: Decision::Reject {
                    reason: a.reason.clone(),
                },
            };
            decided(&a.list, request)
        }
        ApprovalsAction::Verify(l) => {
            let request = Request::Approvals {
                id: None,
                pending: true,
            };
            let (_, journal) = ask(l, request)?;
            // The JSON form exits as the text form does: a disabled journal
            // fails its check either way.
            let failed = || {
                Err(Refusal::new(
                    taskgate::exit::ExitClass::DatabaseInvalid,
                    "the approval journal failed its check",
                ))
            };
            if l.json {
                out(serde_json::to_string_pretty(&journal).unwrap_or_default())?;
                return match journal.disabled {
                    Some(_) => failed(),
                    None => Ok(()),
                };
            }
            let field = |name: &str, value: String| out(format!("{name:<12} {value}"));
            field("directory", journal.directory.display().to_string())?;
            match &journal.disabled {
                Some(reason) => {
                    field("health", format!("DISABLED: {reason}"))?;
                    failed()
                }
                None => {
                    field("health", "verified (every frame's hash chains)".into())?;
                    field("records", journal.records.to_string())?;
                    field("bytes", journal.bytes.to_string())?;
                    field("head", journal.head.clone())?;
                    field("pending", journal.pending.to_string())
                }
            }
        }
    }
}

fn ask(
    l: &UpstreamListArgs,
    request: Request,
) -> Result<(Vec<Proposal>, ApprovalsStatus), Refusal> {
    admin::client::approvals(&l.common.overrides(), l.socket.as_deref(), request)
}

fn decided(l: &UpstreamListArgs, request: Request) -> Result<(), Refusal> {
    let (one, journal) = ask(l, request)?;
    if l.json {
        return json(&one, &journal);
    }
    for p in &one {
        match p.state.as_str() {
            "approved" => out(format!(
                "{} approved: the identical call, issued again before {}, runs once",
                p.id,
                time(p.execution_deadline_ms.unwrap_or(0))
            ))?,
            state => out(format!("{} is {state}", p.id))?,
        }
    }
    Ok(())
}

fn json(proposals: &[Proposal], journal: &ApprovalsStatus) -> Result<(), Refusal> {
    out(serde_json::to_string_pretty(&serde_json::json!({
        "proposals": proposals,
        "journal": journal,
    }))
    .unwrap_or_default())
}

fn disabled(journal: &ApprovalsStatus) -> Result<(), Refusal> {
    match &journal.disabled {
        Some(reason) => out(format!("approvals are DISABLED: {reason}")),
        None => Ok(()),
    }
}

fn time(ms: i64) -> String {
    chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|| ms.to_string())
}

fn show(p: &Proposal) -> Result<(), Refusal> {
    let field = |name: &str, value: String| out(format!("{name:<20} {value}"));
    field("proposal", p.id.clone())?;
    field("state", p.state.as_str().into())?;
    field("tool", p.tool.clone())?;
    field("caller", p.principal.clone())?;
    field("arguments sha256", p.arguments.clone())?;
    if p.preview.is_empty() {
        field("preview", "-".into())?;
    }
    for (name, value) in &p.preview {
        field(&format!("preview {name}"), value.to_string())?;
    }
    field("created", time(p.created_ms))?;
    field("decide before", time(p.decision_deadline_ms))?;
    field(
        "use before",
        p.execution_deadline_ms
            .map(time)
            .unwrap_or_else(|| "-".into()),
    )?;
    field(
        "decided by",
        match (&p.decider, p.decided_ms) {
            (Some(who), Some(at)) => format!("{who} at {}", time(at)),
            _ => "-".into(),
        },
    )?;
    field("journal record", p.seq.to_string())
}
