//! The `taskgate` binary: parse the command line, run one command, map its
//! refusal to an exit code. Everything else lives in the library.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use clap::error::ErrorKind;
use sd_notify::NotifyState;

use taskgate::cli::{CallArgs, Cli, Command, InitArgs, TaskAction, TaskArgs};
use taskgate::client::{Client, ClientError};
use taskgate::exit::{ExitClass, Refusal};
use taskgate::startup::{self, CheckOutcome};
use taskgate::store::CheckReport;
use taskgate::{config, logging, service};

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
        let code = taskgate::exec::shim::run(args.parent, &args.argv);
        return ExitCode::from(code.clamp(0, 255) as u8);
    }
    logging::init();
    match cli.command {
        Command::Call(args) => return operator(|rt| rt.block_on(call(&args))),
        Command::Task(args) => return operator(|rt| rt.block_on(task(&args))),
        _ => {}
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(refusal) => {
            let line = refusal.line();
            eprintln!("{line}");
            // systemd keeps the last STATUS= of a failed start.
            service::notify(&[NotifyState::Status(&line)]);
            ExitCode::from(refusal.class.code())
        }
    }
}

fn run(cli: Cli) -> Result<(), Refusal> {
    match cli.command {
        Command::Serve(args) => {
            let transport = if args.stdio {
                service::Transport::Stdio
            } else {
                service::Transport::Http
            };
            service::serve(&args.overrides(), transport, args.bench_tool)
        }
        Command::Check(args) => check(&args.overrides()),
        Command::Init(args) => init(&args),
        Command::Backup(args) => {
            let lines = taskgate::backup::backup(&args.common.overrides(), &args.to)?;
            lines.iter().for_each(|l| println!("{l}"));
            Ok(())
        }
        Command::Restore(args) => {
            let lines = if args.verify_only {
                taskgate::backup::verify(&args.common.overrides(), &args.from)?
            } else {
                taskgate::backup::restore(&args.common.overrides(), &args.from)?
            };
            lines.iter().for_each(|l| println!("{l}"));
            Ok(())
        }
        Command::Man(args) => man_pages(&args.out),
        Command::Bench(args) => {
            let table = taskgate::bench::run(&taskgate::bench::BenchOptions {
                tasks: args.tasks,
                concurrency: args.concurrency,
                dir: args.dir,
                out: args.out,
                config: args.config,
                keep: args.keep,
            })?;
            print!("{table}");
            Ok(())
        }
        Command::Call(_) | Command::Task(_) | Command::ExecTool(_) => Ok(()),
    }
}

/// How an operator command ended.
enum Answer {
    Ok(serde_json::Value),
    /// The server answered, but with a failure the caller must see.
    Failed(serde_json::Value),
}

/// Runs an operator command on a small runtime and maps its outcome to an
/// exit status: 0 ok, 1 failure answered by the server, 64 usage, 69
/// unreachable.
fn operator(f: impl FnOnce(&tokio::runtime::Runtime) -> Result<Answer, ClientError>) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("taskgate: cannot start the async runtime: {e}");
            return ExitCode::from(ExitClass::Io.code());
        }
    };
    let pretty = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap_or_default();
    match f(&rt) {
        Ok(Answer::Ok(v)) => {
            println!("{}", pretty(&v));
            ExitCode::SUCCESS
        }
        Ok(Answer::Failed(v)) => {
            println!("{}", pretty(&v));
            ExitCode::from(1)
        }
        Err(ClientError::Rpc { error, .. }) => {
            println!("{}", pretty(&serde_json::json!({ "error": error })));
            ExitCode::from(1)
        }
        Err(e @ ClientError::BadUrl(_)) => {
            eprintln!("taskgate: {e}");
            ExitCode::from(ExitClass::Usage.code())
        }
        Err(e @ ClientError::Connect { .. }) => {
            eprintln!("taskgate: {e}");
            ExitCode::from(69)
        }
        Err(e) => {
            eprintln!("taskgate: {e}");
            ExitCode::from(1)
        }
    }
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

async fn call(args: &CallArgs) -> Result<Answer, ClientError> {
    let arguments: serde_json::Value = match serde_json::from_str(&args.args) {
        Ok(v @ serde_json::Value::Object(_)) => v,
        _ => {
            eprintln!("taskgate: --args must be a JSON object, e.g. --args '{{\"name\": \"x\"}}'");
            std::process::exit(ExitClass::Usage.code().into());
        }
    };
    let client = Client::new(&args.url, args.task)?;
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
        eprintln!("taskgate: task {id} created; waiting for it to end");
        return client.wait_task(&id, &result).await.map(judge);
    }
    Ok(judge(result))
}

async fn task(args: &TaskArgs) -> Result<Answer, ClientError> {
    match &args.action {
        TaskAction::Get(r) => {
            let client = Client::new(&r.url, true)?;
            let t = client.get_task(&r.id).await?;
            if r.wait {
                return client.wait_task(&r.id, &t).await.map(judge);
            }
            Ok(judge(t))
        }
        TaskAction::Cancel(r) => {
            let client = Client::new(&r.url, true)?;
            client.cancel_task(&r.id).await?;
            // The acknowledgement is empty; show where the task now stands.
            client.get_task(&r.id).await.map(Answer::Ok)
        }
    }
}

fn check(overrides: &config::Overrides) -> Result<(), Refusal> {
    match startup::check(overrides)? {
        CheckOutcome::NotCreatedYet(dir) => {
            println!(
                "state directory {} does not exist yet; `taskgate serve` creates it",
                dir.display()
            );
        }
        CheckOutcome::Checked(dir, report) => {
            let d = dir.path().display();
            match report {
                CheckReport::Missing => {
                    println!("ok: {d} is private; no database yet (serve creates it)")
                }
                CheckReport::Pristine => println!(
                    "ok: {d} is private; tasks.db is empty (an interrupted first start); serve initialises it"
                ),
                CheckReport::Valid {
                    version,
                    retained,
                    unexpired,
                    nonterminal,
                } => {
                    println!(
                        "ok: {d}: schema {version}, integrity ok, {retained} tasks retained ({unexpired} unexpired)"
                    );
                    if version < taskgate::store::SCHEMA_VERSION {
                        println!(
                            "note: serve will migrate schema {version} to {}",
                            taskgate::store::SCHEMA_VERSION
                        );
                    }
                    if nonterminal > 0 {
                        println!(
                            "note: {nonterminal} tasks were running at the last stop; serve marks them failed (interrupted), never re-runs them"
                        );
                    }
                }
            }
        }
    }
    Ok(())
}

fn man_pages(out: &std::path::Path) -> Result<(), Refusal> {
    use clap::CommandFactory;
    let io = |e: std::io::Error| Refusal::new(ExitClass::Io, format!("{}: {e}", out.display()));
    std::fs::create_dir_all(out).map_err(io)?;
    let cmd = Cli::command();
    let write = |name: &str, cmd: clap::Command| -> Result<(), Refusal> {
        let mut buf = Vec::new();
        clap_mangen::Man::new(cmd).render(&mut buf).map_err(io)?;
        std::fs::write(out.join(format!("{name}.1")), buf).map_err(io)
    };
    write("taskgate", cmd.clone())?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("taskgate-{}", sub.get_name());
        let leaked: &'static str = Box::leak(name.clone().into_boxed_str());
        write(&name, sub.clone().name(leaked))?;
    }
    println!("man pages written to {}", out.display());
    Ok(())
}

fn init(args: &InitArgs) -> Result<(), Refusal> {
    let text = config::starter_config(args.state_dir.as_deref().and_then(|p| p.to_str()));
    match &args.config {
        None => {
            let _ = std::io::stdout().write_all(text.as_bytes());
            Ok(())
        }
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
            println!("wrote {}", path.display());
            Ok(())
        }
    }
}
