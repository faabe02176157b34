//! The `taskgate` binary: parse the command line, run one command, map its
//! refusal to an exit code. Everything else lives in the library.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use clap::error::ErrorKind;
use sd_notify::NotifyState;

use taskgate::cli::{Cli, Command, InitArgs};
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
    logging::init();
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
        Command::Serve(args) => service::serve(&args.overrides()),
        Command::Check(args) => check(&args.overrides()),
        Command::Init(args) => init(&args),
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

fn init(args: &InitArgs) -> Result<(), Refusal> {
    let text = config::starter_config();
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
