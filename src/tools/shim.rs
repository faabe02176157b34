//! The tool shim: `taskgate exec-tool --parent PID -- ARGV…`, run by the
//! daemon in place of the tool itself, in the tool's process group.
//!
//! It exists so that nothing a tool starts outlives the daemon, even when
//! the daemon is killed with SIGKILL and has no chance to clean up: the
//! kernel signals the shim when the daemon dies (`PR_SET_PDEATHSIG`), and
//! the shim kills its whole process group, the tool and the tool's own
//! children included. It passes everything else through: stdin, stdout,
//! stderr, environment, working directory, and the tool's exit status.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::Command;

use nix::sys::prctl::set_pdeathsig;
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, kill, raise, sigaction};
use nix::unistd::Pid;

/// The signal the kernel sends the shim when the daemon dies.
const PARENT_DEATH: Signal = Signal::SIGUSR1;
/// Exit status when the tool could not be started (as a shell would).
pub const CANNOT_EXECUTE: i32 = 126;

extern "C" fn kill_group(_: libc::c_int) {
    // kill(2) is async-signal-safe; pid 0 means our own process group.
    let _ = kill(Pid::from_raw(0), Signal::SIGKILL);
}

extern "C" fn ignore(_: libc::c_int) {}

fn handle(signal: Signal, handler: extern "C" fn(libc::c_int)) {
    let action = SigAction::new(
        SigHandler::Handler(handler),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    // SAFETY: the handlers only call async-signal-safe functions.
    let _ = unsafe { sigaction(signal, &action) };
}

fn reset(signal: Signal) {
    let action = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    // SAFETY: restoring the default disposition.
    let _ = unsafe { sigaction(signal, &action) };
}

/// Runs the tool and returns the exit code to end with (a signal death is
/// re-raised instead, so the daemon sees the tool's own outcome).
pub fn run(parent: u32, argv: &[String]) -> i32 {
    handle(PARENT_DEATH, kill_group);
    // SIGTERM is for the tool (the daemon signals the whole group): the
    // shim stays until the tool has gone, to report how it ended.
    handle(Signal::SIGTERM, ignore);
    let _ = set_pdeathsig(PARENT_DEATH);
    if std::os::unix::process::parent_id() != parent {
        // The daemon died before the shim was ready.
        kill_group(0);
    }
    let Some((program, args)) = argv.split_first() else {
        eprintln!("taskgate exec-tool: no program given");
        return CANNOT_EXECUTE;
    };
    let mut cmd = Command::new(program);
    cmd.args(args);
    // SAFETY: prctl(2) is async-signal-safe and allocates nothing; the tool
    // dies if the shim does.
    unsafe {
        cmd.pre_exec(|| set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from));
    }
    let status = match cmd.spawn().and_then(|mut c| c.wait()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("taskgate exec-tool: cannot start {program}: {e}");
            return CANNOT_EXECUTE;
        }
    };
    if let Some(code) = status.code() {
        return code;
    }
    let sig = status.signal().unwrap_or(libc::SIGKILL);
    if let Ok(s) = Signal::try_from(sig) {
        reset(s);
        let _ = raise(s);
    }
    128 + sig
}
