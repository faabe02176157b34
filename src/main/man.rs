//! The man pages: taskgate(1), a page per command, taskgate.toml(5), and
//! the bash completion.

use super::*;

/// Commands documented by a section-8 runbook page of the same name rather
/// than a section-1 page: `man taskgate-backup` must open the runbook
/// (section 1 is searched first, so a generated taskgate-backup.1 would
/// hide it), and that page also documents `taskgate backup` itself.
const RUNBOOK_COMMANDS: [&str; 2] = ["backup", "restore"];

/// The man page that documents a command, as `name(section)`.
fn page_of(command: &str) -> String {
    if RUNBOOK_COMMANDS.contains(&command) {
        format!("taskgate\\-{command}(8)")
    } else {
        format!("taskgate\\-{command}(1)")
    }
}

/// EXIT STATUS of a section-1 page: `serve` and `check` share the startup
/// refusals; the operator client has its own codes.
fn exit_status_section(command: Option<&str>) -> String {
    let startup = "\
.TP\n.B 0\nSuccess (serve: a clean stop after SIGTERM or SIGINT).\n\
.TP\n.B 64\nUsage: an unknown or missing argument.\n\
.TP\n.B 65\nThe database failed validation (corrupt, newer schema, replaced, undecodable).\n\
.TP\n.B 74\nAn I/O error, or restart recovery failed.\n\
.TP\n.B 75\nThe state directory's lifetime lock is held by another process (named in the message).\n\
.TP\n.B 77\nAn unsafe path or permissions (group/other access, a link, a wrong owner, an untrusted parent).\n\
.TP\n.B 78\nInvalid configuration (an unknown key, a relative path, a value out of range).\n";
    let client = "\
.TP\n.B 0\nThe call succeeded (a task: completed, or still working without \\-\\-wait).\n\
.TP\n.B 1\nThe call failed: a result with isError, or a task that ended failed or cancelled.\n\
.TP\n.B 64\nBad arguments (\\-\\-args is not a JSON object, \\-\\-url is not an http:// URL).\n\
.TP\n.B 69\nThe daemon cannot be reached, did not answer in time, or answered 503.\n\
.TP\n.B 74\nThe command could not run (its runtime did not start, stdout failed).\n\
.TP\n.B 76\nThe daemon refused the request with a JSON\\-RPC error, or its answer is not MCP.\n";
    let body = match command {
        Some("serve" | "check") => startup.to_string(),
        Some("call" | "task") => client.to_string(),
        Some("reload") => ".TP\n.B 0\nThe reload was applied; startup\\-only keys that changed and were kept are listed.\n.TP\n.B 64\nUsage.\n.TP\n.B 69\nNo daemon serves the state directory, it did not answer in time, or it is stopping.\n.TP\n.B 76\nPermission denied (root or the service user only), or the answer was not understood.\n.TP\n.B 77\nA file the new configuration names (a credential file) has unsafe permissions; refused like 78.\n.TP\n.B 78\nThe new configuration is invalid and was refused, with the reason; the daemon goes on with its previous settings.\n".into(),
        Some("init") => ".TP\n.B 0\nThe file was written.\n.TP\n.B 64\nUsage.\n.TP\n.B 74\nThe file exists already or cannot be written.\n".into(),
        Some(_) => ".TP\n.B 0\nSuccess.\n.TP\n.B 64\nUsage.\n.PP\nAny other status is a refusal of the class listed in\n.BR taskgate (1),\nexplained by the one line on standard error.\n".into(),
        None => format!("{startup}.PP\nThe operator client (call, task) also exits with:\n{client}"),
    };
    format!(".SH \"EXIT STATUS\"\n{body}")
}

const ENVIRONMENT_SECTION: &str = r#".SH ENVIRONMENT
.TP
.B TASKGATE_LOG
The log filter, the configuration key [log] filter (default info for taskgate's own events; for example debug); it overrides the file.
.TP
.BI TASKGATE_ SECTION _ KEY
Any configuration key, for example TASKGATE_STORE_QUEUE_DEPTH=256; it overrides the file, and flags override it.
.TP
.B STATE_DIRECTORY
Set by systemd's StateDirectory=; chooses the state directory unless \-\-state\-dir is given.
.TP
.B XDG_STATE_HOME
Without any other choice the state directory is $XDG_STATE_HOME/taskgate (~/.local/state/taskgate), created 0700.
.TP
.BR NOTIFY_SOCKET ", " WATCHDOG_USEC
Set by systemd: serve reports READY=1, STATUS=, WATCHDOG=1 and STOPPING=1 there.
.TP
.B JOURNAL_STREAM
Set by systemd: when standard error is the journal, taskgate logs to it with structured fields and message IDs.
"#;

const FILES_SECTION: &str = r#".SH FILES
.TP
.I /etc/taskgate/taskgate.toml
The configuration read by the service; see
.BR taskgate.toml (5).
.TP
.I /var/lib/taskgate
The service's state directory (mode 0700, owned by the taskgate user): tasks.db, tasks.db\-wal, tasks.db\-shm, tasks.lock (the lifetime lock; never delete it) and artifacts/ (spilled results).
.TP
.I /var/lib/taskgate.replaced\-TIME
What a restore replaced, kept as evidence.
.TP
.I /usr/lib/systemd/catalog/taskgate.catalog
Explanations of taskgate's journal messages (journalctl \-x).
"#;

fn see_also(except: &str) -> String {
    let pages = [
        "taskgate (1)",
        "taskgate.toml (5)",
        "taskgate\\-backup (8)",
        "taskgate\\-restore (8)",
        "journalctl (1)",
    ];
    let shown: Vec<String> = pages
        .iter()
        .filter(|p| **p != except)
        .map(|p| format!(".BR {p}"))
        .collect();
    format!(
        ".SH \"SEE ALSO\"\n{},\n/usr/share/doc/taskgate/operations.md,\n/usr/share/doc/taskgate/README.Debian\n",
        shown.join(",\n")
    )
}

/// Renders one section-1 page: clap's NAME, SYNOPSIS (the real command
/// line, `taskgate serve …`), DESCRIPTION and OPTIONS, then `extra`.
fn render_page(cmd: clap::Command, extra: &str) -> std::io::Result<Vec<u8>> {
    let man = clap_mangen::Man::new(cmd)
        .manual("taskgate manual")
        .source(format!("taskgate {}", env!("CARGO_PKG_VERSION")));
    let mut buf = Vec::new();
    man.render_title(&mut buf)?;
    man.render_name_section(&mut buf)?;
    man.render_synopsis_section(&mut buf)?;
    man.render_description_section(&mut buf)?;
    man.render_options_section(&mut buf)?;
    buf.extend_from_slice(extra.as_bytes());
    Ok(buf)
}

/// A clap section rendered without its `.SH` heading, to merge into
/// another page (the synopsis and options of `taskgate task get`).
/// Each rendering starts with roff's preamble (the `Aq` string) and then
/// the heading; both are dropped.
fn without_heading(rendered: Vec<u8>) -> String {
    let text = String::from_utf8_lossy(&rendered).into_owned();
    match text.find(".SH ") {
        Some(at) => text[at..]
            .split_once('\n')
            .map(|(_, rest)| rest.to_string())
            .unwrap_or_default(),
        None => text,
    }
}

/// Writes taskgate(1) and one page per command into `dir/man1` (except
/// backup and restore, whose runbook pages in section 8 document them),
/// taskgate.toml(5), rendered from the configuration table, into
/// `dir/man5`, and the bash completion into `dir/completions/taskgate`.
pub(crate) fn man_pages(dir: &std::path::Path) -> Result<(), Refusal> {
    use clap::CommandFactory;
    let io = |path: &std::path::Path, e: std::io::Error| {
        Refusal::new(ExitClass::Io, format!("{}: {e}", path.display()))
    };
    let (man1, man5, completions) = (dir.join("man1"), dir.join("man5"), dir.join("completions"));
    for d in [&man1, &man5, &completions] {
        std::fs::create_dir_all(d).map_err(|e| io(d, e))?;
    }
    let cmd = Cli::command();
    let commands: Vec<&clap::Command> =
        cmd.get_subcommands().filter(|s| !s.is_hide_set()).collect();

    // taskgate(1): the commands, each with the page that documents it.
    let mut list = String::from(".SH COMMANDS\n");
    for sub in &commands {
        let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
        list.push_str(&format!(
            ".TP\n.B taskgate {}\n{}; see\n.BR {}.\n",
            sub.get_name(),
            about
                .trim_end_matches('.')
                .replace('-', "\\-")
                .replace('\n', " "),
            page_of(sub.get_name()).replacen('(', " (", 1)
        ));
    }
    let extra = format!(
        "{list}{}{ENVIRONMENT_SECTION}{FILES_SECTION}{}",
        exit_status_section(None),
        see_also("taskgate (1)")
    );
    let top = cmd.clone().disable_help_subcommand(true);
    let path = man1.join("taskgate.1");
    let page = render_page(top, &extra).map_err(|e| io(&path, e))?;
    std::fs::write(&path, page).map_err(|e| io(&path, e))?;

    for sub in commands {
        let name = sub.get_name().to_string();
        if RUNBOOK_COMMANDS.contains(&name.as_str()) {
            continue;
        }
        let path = man1.join(format!("taskgate-{name}.1"));
        let mut extra = String::new();
        // `taskgate task get|cancel`: their synopses and options on this
        // page; no page per sub-command.
        for inner in sub.get_subcommands().filter(|s| !s.is_hide_set()) {
            let full = format!("taskgate {name} {}", inner.get_name());
            let man = clap_mangen::Man::new(inner.clone().bin_name(full.clone()));
            let (mut synopsis, mut options) = (Vec::new(), Vec::new());
            man.render_synopsis_section(&mut synopsis)
                .and_then(|_| man.render_options_section(&mut options))
                .map_err(|e| io(&path, e))?;
            extra.push_str(&format!(
                ".SH \"{}\"\n{}",
                full.to_uppercase(),
                without_heading(synopsis)
            ));
            if let Some(about) = inner.get_about() {
                extra.push_str(&format!(".PP\n{}\n", about.to_string().replace('-', "\\-")));
            }
            extra.push_str(&without_heading(options));
        }
        extra.push_str(&exit_status_section(Some(&name)));
        if name != "call" && name != "task" {
            extra.push_str(ENVIRONMENT_SECTION);
            extra.push_str(FILES_SECTION);
        }
        extra.push_str(&see_also(""));
        let leaked: &'static str = Box::leak(format!("taskgate-{name}").into_boxed_str());
        let bin: &'static str = Box::leak(format!("taskgate {name}").into_boxed_str());
        let page = render_page(
            sub.clone()
                .name(leaked)
                .bin_name(bin)
                .disable_help_subcommand(true),
            &extra,
        )
        .map_err(|e| io(&path, e))?;
        std::fs::write(&path, page).map_err(|e| io(&path, e))?;
    }

    let page = man5.join("taskgate.toml.5");
    std::fs::write(&page, config::keys::man_page()).map_err(|e| io(&page, e))?;

    // Bash completion, generated from the same definitions.
    let path = completions.join("taskgate");
    let mut buf = Vec::new();
    clap_complete::generate(
        clap_complete::Shell::Bash,
        &mut Cli::command(),
        "taskgate",
        &mut buf,
    );
    std::fs::write(&path, buf).map_err(|e| io(&path, e))?;
    out(format!(
        "man pages and completion written to {}",
        dir.display()
    ))
}
