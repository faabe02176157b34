//! The `taskgate` binary: parse the command line, run one command, print
//! its output and map its refusal to an exit code. Everything else lives in
//! the library. Beside this file (`src/main/`): the operator client's
//! commands (`operator.rs`), `check`'s report (`report.rs`), the token
//! commands (`tokens.rs`) and the man pages (`man.rs`).
//!
//! Owns process edge. Parses the CLI, sets umask 077, runs one command, prints
//! a refusal as one line and exits with its class's code. Formats `check`'s
//! report and the operator client's output; every write to stdout goes through
//! one writer that ends quietly when the reader has gone (a closed pipe is not
//! an error). The only place that turns the bench flag into a built-in tool.
//! Beside it in `src/main/` (modules of the binary): `operator.rs` (`call`,
//! `task`: their target, token and exit statuses), `report.rs` (what `check`
//! prints), `tokens.rs` (`token new|list|revoke`), `upstream.rs` (`upstream
//! list|show|pin`: the upstreams over the admin socket, the diff against the
//! reviewed description, the pins file written whole and read back), `man.rs`
//! (the man pages and the completion).

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

#[path = "main/approvals.rs"]
mod approvals;
#[path = "main/man.rs"]
mod man;
#[path = "main/operator.rs"]
mod operator;
#[path = "main/report.rs"]
mod report;
#[path = "main/routes.rs"]
mod routes;
#[path = "main/tokens.rs"]
mod tokens;
#[path = "main/upstream.rs"]
mod upstream;

use man::man_pages;
use operator::{call, call_arguments, target, task};
use report::{check, check_config};
use tokens::token;

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
            return operator::operator(|rt| rt.block_on(call(&args, &target, arguments)));
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
            return operator::operator(|rt| rt.block_on(task(&args, &target)));
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
                    ..Default::default()
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
                bare_rmcp: args.bare_rmcp,
                compare: args.compare,
                compare_pid: args.compare_pid,
            })?;
            out(table.trim_end())
        }
        Command::Token(args) => token(&args),
        Command::Upstream(args) => upstream::upstream(&args),
        Command::Routes(args) => routes::routes(&args),
        Command::Approvals(args) => approvals::approvals(&args),
        Command::Verify(args) => verify(&args),
        Command::WireCodes(args) => wire_codes(args.json),
        Command::QualificationWorker { root, ledger, liar } => taskgate::verify::run_with(
            &taskgate::verify::WorkerOptions { root, ledger, liar },
            std::io::stdin().lock(),
            std::io::stdout().lock(),
        )
        .map_err(Refusal::from),
        Command::Call(_)
        | Command::Task(_)
        | Command::Status(_)
        | Command::Reload(_)
        | Command::ExecTool(_) => Ok(()),
    }
}

/// `taskgate verify --durable-tasks`: the structured result on stdout, the
/// summary on stderr; a FAIL is a failed call (1).
fn verify(args: &taskgate::cli::VerifyArgs) -> Result<(), Refusal> {
    // The summary is what stderr is for here: the parts' own progress is
    // shown only when asked for with TASKGATE_LOG.
    if std::env::var_os(taskgate::config::ENV_LOG).is_none() {
        let _ = logging::apply_filter("warn");
    }
    let report = taskgate::verify::durable::run(args.keep).map_err(Refusal::from)?;
    out(serde_json::to_string_pretty(&report).unwrap_or_default())?;
    eprint!("{}", report.summary());
    if report.passed() {
        Ok(())
    } else {
        Err(Refusal::new(
            taskgate::exit::ExitClass::CallFailed,
            "the durable-tasks qualification did not pass; the failed checks and their evidence are in the result on stdout",
        ))
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
