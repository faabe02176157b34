//! The `taskgate` binary: parse the command line, run one command, print
//! its output and map its refusal to an exit code. Everything else lives in
//! the library.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use clap::error::ErrorKind;
use sd_notify::NotifyState;

use taskgate::cli::{
    CallArgs, Cli, Command, Endpoint, InitArgs, TaskAction, TaskArgs, TokenAction, TokenArgs,
    TokenFileArgs,
};
use taskgate::client::{Client, ClientError};
use taskgate::exit::{Classify, ExitClass, Refusal};
use taskgate::startup::{self, CheckOutcome};
use taskgate::{admin, config, logging, service};

fn main() -> ExitCode {
    // Files this process creates are private whatever the caller's umask.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return match e.kind() {
                ErrorKind::DisplayHelp
                | ErrorKind::DisplayVersion
                | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => ExitCode::SUCCESS,
                _ => ExitCode::from(ExitClass::Usage.code()),
            };
        }
    };
    if let Command::ExecTool(args) = &cli.command {
        // No logging, no runtime: the shim only runs the tool.
        let code = taskgate::tools::shim::run(args.parent, args.policy.as_deref(), &args.argv);
        return ExitCode::from(code.clamp(0, 255) as u8);
    }
    logging::init();
    match cli.command {
        Command::Call(args) => {
            let prepared = call_arguments(&args)
                .and_then(|arguments| Ok((arguments, target(&args.endpoint)?)));
            let (arguments, target) = match prepared {
                Ok(v) => v,
                Err(refusal) => {
                    say(&format!("taskgate: {}", refusal.message));
                    return ExitCode::from(refusal.class.code());
                }
            };
            return operator(|rt| rt.block_on(call(&args, &target, arguments)));
        }
        Command::Task(args) => {
            let endpoint = match &args.action {
                TaskAction::Get(r) | TaskAction::Cancel(r) => &r.endpoint,
            };
            let target = match target(endpoint) {
                Ok(target) => target,
                Err(refusal) => {
                    say(&format!("taskgate: {}", refusal.message));
                    return ExitCode::from(refusal.class.code());
                }
            };
            return operator(|rt| rt.block_on(task(&args, &target)));
        }
        Command::Status(args) => {
            // Printed before the status's own exit class takes effect: a
            // disabled store is shown, then reported by the exit code.
            let shown =
                admin::client::status(&args.common.overrides(), args.socket.as_deref(), args.json)
                    .and_then(|(lines, class)| {
                        lines.iter().try_for_each(out)?;
                        Ok(class)
                    });
            return match shown {
                Ok(None) => ExitCode::SUCCESS,
                Ok(Some(class)) => ExitCode::from(class.code()),
                Err(refusal) => {
                    say(&refusal.line());
                    ExitCode::from(refusal.class.code())
                }
            };
        }
        Command::Reload(args) => {
            // Under the unit (ExecReload=) stdout and stderr are the
            // journal, and systemctl reports the exit status.
            let done = admin::client::reload(&args.common.overrides(), args.socket.as_deref())
                .and_then(|lines| lines.iter().try_for_each(out));
            return match done {
                Ok(()) => ExitCode::SUCCESS,
                Err(refusal) => {
                    say(&refusal.line());
                    ExitCode::from(refusal.class.code())
                }
            };
        }
        _ => {}
    }
    // Only the daemon reports to the service manager: `check` also runs
    // under the unit (ExecStartPre=, ExecReload=), where systemd accepts
    // notifications from the main process only.
    let serving = matches!(cli.command, Command::Serve(_));
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(refusal) => {
            let line = refusal.line();
            logging::refused(&line, refusal.class.code());
            // systemd keeps the last STATUS= of a failed start.
            if serving {
                service::notify(&[NotifyState::Status(&line)]);
            }
            ExitCode::from(refusal.class.code())
        }
    }
}

/// Writes one line of the command's output on stdout. A reader that has
/// gone away (`taskgate call … | head`) has all it wanted: the rest of the
/// output is dropped quietly, as any Unix tool does, and the command still
/// ends with its own status. Any other write error is an I/O failure.
fn out(line: impl std::fmt::Display) -> Result<(), Refusal> {
    let mut stdout = std::io::stdout().lock();
    match writeln!(stdout, "{line}").and_then(|()| stdout.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(Refusal::new(
            ExitClass::Io,
            format!("cannot write to standard output: {e}"),
        )),
    }
}

/// Writes a line on stderr; if stderr itself is gone there is nobody left
/// to tell, so the error is dropped.
fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

fn run(cli: Cli) -> Result<(), Refusal> {
    match cli.command {
        Command::Serve(args) => {
            let transport = if args.stdio {
                service::Transport::Stdio
            } else {
                service::Transport::Http
            };
            // The benchmark's no-op tool is an ordinary built-in, present
            // only in a daemon that `taskgate bench` starts.
            let mut builtins: Vec<std::sync::Arc<dyn taskgate::tools::Runner>> = Vec::new();
            if args.bench_tool {
                builtins.push(std::sync::Arc::new(taskgate::tools::builtin::bench_noop()));
            }
            taskgate::tools::confine::protect_daemon();
            taskgate::tools::process::sweep_scratch();
            service::serve(
                service::Options {
                    overrides: args.overrides(),
                    builtins,
                    clock: None,
                },
                transport,
            )
        }
        Command::Check(args) if args.config_only => check_config(&args.common.overrides()),
        Command::Check(args) => check(&args.common.overrides()),
        Command::Init(args) => init(&args),
        Command::Backup(args) => {
            let overrides = args.common.overrides();
            let socket = args.socket.as_deref();
            let lines = match (&args.to, &args.into) {
                (Some(to), _) if args.online => {
                    admin::client::online_backup(&overrides, socket, to)?
                }
                (Some(to), _) if args.dry_run => taskgate::backup::check_backup(&overrides, to)?,
                (Some(to), _) => taskgate::backup::backup(&overrides, to)?,
                (None, Some(dir)) => {
                    admin::client::online_backup_into(&overrides, socket, dir, args.keep as usize)?
                }
                (None, None) => {
                    return Err(Refusal::new(ExitClass::Usage, "--to or --into is required"));
                }
            };
            lines.iter().try_for_each(out)
        }
        Command::Restore(args) => {
            let lines = if args.verify_only {
                taskgate::backup::verify(&args.common.overrides(), &args.from)?
            } else {
                taskgate::backup::restore(&args.common.overrides(), &args.from)?
            };
            lines.iter().try_for_each(out)
        }
        Command::Man(args) => match &args.out {
            Some(dir) => man_pages(dir),
            None => out(config::keys::reference_markdown().trim_end()),
        },
        Command::Bench(args) => {
            let table = taskgate::bench::run(&taskgate::bench::BenchOptions {
                tasks: args.tasks,
                concurrency: args.concurrency,
                dir: args.dir,
                out: args.out,
                config: args.config,
                keep: args.keep,
            })?;
            out(table.trim_end())
        }
        Command::Token(args) => token(&args),
        Command::WireCodes(args) => wire_codes(args.json),
        Command::Call(_)
        | Command::Task(_)
        | Command::Status(_)
        | Command::Reload(_)
        | Command::ExecTool(_) => Ok(()),
    }
}

/// `taskgate wire-codes`: the registry, for scripts and tests.
fn wire_codes(json: bool) -> Result<(), Refusal> {
    let all = taskgate::wire::ALL;
    if json {
        let list: Vec<serde_json::Value> = all
            .iter()
            .map(|w| serde_json::json!({"code": w.code, "name": w.name, "help": w.help}))
            .collect();
        return out(serde_json::Value::from(list).to_string());
    }
    all.iter()
        .try_for_each(|w| out(format!("{}\t{}\t{}", w.code, w.name, w.help)))
}

/// `taskgate token new|list|revoke`.
fn token(args: &TokenArgs) -> Result<(), Refusal> {
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
fn tokens_file(args: &TokenFileArgs) -> Result<std::path::PathBuf, Refusal> {
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

/// How an operator command ended.
enum Answer {
    Ok(serde_json::Value),
    /// The server answered, but with a failure the caller must see.
    Failed(serde_json::Value),
}

/// Runs an operator command on a small runtime, prints its JSON on stdout
/// and maps its outcome to an exit status (see [`ExitClass`]: 0 ok,
/// 1 the call failed, 64 usage, 69 daemon unreachable, 76 request refused
/// or answer not understood).
fn operator(f: impl FnOnce(&tokio::runtime::Runtime) -> Result<Answer, ClientError>) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            say(&format!("taskgate: cannot start the async runtime: {e}"));
            return ExitCode::from(ExitClass::Io.code());
        }
    };
    let (class, shown) = match f(&rt) {
        Ok(Answer::Ok(v)) => (None, Some(v)),
        Ok(Answer::Failed(v)) => (Some(ExitClass::CallFailed), Some(v)),
        Err(ClientError::Rpc { error, .. }) => (
            Some(ExitClass::Protocol),
            Some(serde_json::json!({ "error": error })),
        ),
        Err(e) => {
            say(&format!("taskgate: {e}"));
            (Some(e.exit_class()), None)
        }
    };
    if let Some(v) = shown {
        let text = serde_json::to_string_pretty(&v).unwrap_or_default();
        if let Err(refusal) = out(text) {
            say(&refusal.line());
            return ExitCode::from(refusal.class.code());
        }
    }
    class.map_or(ExitCode::SUCCESS, |c| ExitCode::from(c.code()))
}

fn judge(v: serde_json::Value) -> Answer {
    let failed = matches!(
        v.get("status").and_then(|s| s.as_str()),
        Some("failed" | "cancelled")
    ) || v.get("isError").and_then(|e| e.as_bool()) == Some(true)
        || v.pointer("/result/isError").and_then(|e| e.as_bool()) == Some(true);
    if failed {
        Answer::Failed(v)
    } else {
        Answer::Ok(v)
    }
}

/// Where the operator client goes and the bearer token it sends.
struct Target {
    url: String,
    token: Option<String>,
}

impl Target {
    fn client(&self, tasks: bool) -> Result<Client, ClientError> {
        Ok(Client::new(&self.url, tasks)?.with_token(self.token.clone()))
    }
}

/// Longest token file read.
const MAX_TOKEN_FILE_BYTES: u64 = 64 * 1024;

fn target(endpoint: &Endpoint) -> Result<Target, Refusal> {
    let token = match &endpoint.token_file {
        Some(path) => {
            use std::io::Read;
            let mut text = String::new();
            std::fs::File::open(path)
                .and_then(|f| f.take(MAX_TOKEN_FILE_BYTES).read_to_string(&mut text))
                .map_err(|e| {
                    Refusal::new(
                        ExitClass::Usage,
                        format!("cannot read the token file {}: {e}", path.display()),
                    )
                })?;
            let line = text.lines().next().unwrap_or_default().trim().to_string();
            if line.is_empty() {
                return Err(Refusal::new(
                    ExitClass::Usage,
                    format!("the token file {} is empty", path.display()),
                ));
            }
            Some(line)
        }
        None => std::env::var("TASKGATE_TOKEN")
            .ok()
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty()),
    };
    Ok(Target {
        url: endpoint_url(endpoint)?,
        token,
    })
}

/// The operator client's endpoint: `--url`, else the `server.listen` of the
/// configuration a daemon would read: `--config`, `$TASKGATE_CONFIG`, else
/// the packaged service's file when it exists (an operator on that host
/// means that daemon), else the embedded default.
fn endpoint_url(endpoint: &Endpoint) -> Result<String, Refusal> {
    if let Some(url) = &endpoint.url {
        return Ok(url.clone());
    }
    let mut config_path = endpoint.config.clone();
    if config_path.is_none() && std::env::var_os(config::ENV_CONFIG_PATH).is_none() {
        let packaged = std::path::Path::new(config::PACKAGE_CONFIG_PATH);
        if packaged.exists() {
            config_path = Some(packaged.to_path_buf());
        }
    }
    let listen = config::configured_listen(&config::Overrides {
        config_path,
        ..Default::default()
    })?;
    if listen.port() == 0 {
        return Err(Refusal::new(
            ExitClass::Usage,
            format!(
                "server.listen = {listen} names no fixed port (the daemon picks one); name it with --url"
            ),
        ));
    }
    Ok(format!("http://{listen}/mcp"))
}

/// `--args`, which must be a JSON object.
fn call_arguments(args: &CallArgs) -> Result<serde_json::Value, Refusal> {
    match serde_json::from_str(&args.args) {
        Ok(v @ serde_json::Value::Object(_)) => Ok(v),
        _ => Err(Refusal::new(
            ExitClass::Usage,
            "--args must be a JSON object, e.g. --args '{\"name\": \"x\"}'",
        )),
    }
}

async fn call(
    args: &CallArgs,
    target: &Target,
    arguments: serde_json::Value,
) -> Result<Answer, ClientError> {
    let client = target.client(args.task)?;
    let result = client
        .call_tool(&args.tool, arguments, args.operation_id.as_deref())
        .await?;
    let is_task = result.get("resultType").and_then(|r| r.as_str()) == Some("task");
    if is_task && args.wait {
        let id = result
            .get("taskId")
            .and_then(|i| i.as_str())
            .unwrap_or_default()
            .to_string();
        say(&format!(
            "taskgate: task {id} created; waiting for it to end"
        ));
        return client.wait_task(&id, &result).await.map(judge);
    }
    Ok(judge(result))
}

async fn task(args: &TaskArgs, target: &Target) -> Result<Answer, ClientError> {
    match &args.action {
        TaskAction::Get(r) => {
            let client = target.client(true)?;
            let t = client.get_task(&r.id).await?;
            if r.wait {
                return client.wait_task(&r.id, &t).await.map(judge);
            }
            Ok(judge(t))
        }
        TaskAction::Cancel(r) => {
            let client = target.client(true)?;
            client.cancel_task(&r.id).await?;
            // The acknowledgement is empty; show where the task now stands.
            client.get_task(&r.id).await.map(Answer::Ok)
        }
    }
}

/// `check --config-only`: what serve and a reload would accept, without
/// the state directory.
fn check_config(overrides: &config::Overrides) -> Result<(), Refusal> {
    let startup::Effective { config, tools, .. } = startup::effective(overrides, Vec::new())?;
    let file = match &config.file {
        Some(path) => path.display().to_string(),
        None => "no file (the embedded defaults)".to_string(),
    };
    out(format!(
        "ok: configuration {file}: {} tools, listen {}",
        tools.specs().count(),
        config.server.listen
    ))?;
    out(format!(
        "state directory {} ({}); not opened",
        config.state_dir.display(),
        config.state_dir_source
    ))?;
    auth_report(&config)?;
    tool_report(&tools)
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

fn check(overrides: &config::Overrides) -> Result<(), Refusal> {
    let (source, outcome) = startup::check(overrides)?;
    let startup::Effective { config, tools, .. } = startup::effective(overrides, Vec::new())?;
    auth_report(&config)?;
    tool_report(&tools)?;
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
fn man_pages(dir: &std::path::Path) -> Result<(), Refusal> {
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

fn init(args: &InitArgs) -> Result<(), Refusal> {
    let text = config::starter_config(args.state_dir.as_deref().and_then(|p| p.to_str()));
    match &args.config {
        None => out(text.trim_end()),
        Some(path) => {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)
                .map_err(|e| {
                    Refusal::new(
                        ExitClass::Io,
                        format!("{}: cannot create: {e}; choose a new path", path.display()),
                    )
                })?;
            file.write_all(text.as_bytes()).map_err(|e| {
                Refusal::new(
                    ExitClass::Io,
                    format!("{}: cannot write: {e}", path.display()),
                )
            })?;
            out(format!("wrote {}", path.display()))
        }
    }
}
