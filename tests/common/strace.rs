//! strace attached to every thread of a running process, injecting faults
//! into chosen system calls (the real ones SQLite makes).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const STEP_TIMEOUT: Duration = Duration::from_secs(30);

/// TracerPid of every thread of `pid`.
pub fn tracers(pid: i32) -> Vec<(String, i32)> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        let tracer = status
            .lines()
            .find_map(|l| l.strip_prefix("TracerPid:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(-1);
        out.push((task.file_name().to_string_lossy().to_string(), tracer));
    }
    out
}

/// strace attached to every thread of a child, injecting faults.
pub struct Strace {
    child: Child,
    log: PathBuf,
    target: i32,
}

impl Strace {
    /// Attaches and returns once every thread of `pid` is traced.
    pub fn attach(pid: i32, log: &Path, filter: &[&str]) -> Strace {
        let mut cmd = Command::new("/usr/bin/strace");
        cmd.args(["-f", "-qq", "-p", &pid.to_string(), "-o"])
            .arg(log)
            .args(filter)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let child = cmd.spawn().expect("run strace");
        let mut s = Strace {
            child,
            log: log.to_path_buf(),
            target: pid,
        };
        let me = s.child.id() as i32;
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            let threads = tracers(pid);
            if !threads.is_empty() && threads.iter().all(|(_, t)| *t == me) {
                break;
            }
            if let Some(status) = s.child.try_wait().unwrap() {
                let mut err = String::new();
                let _ = s.child.stderr.take().unwrap().read_to_string(&mut err);
                panic!("strace ended before attaching: {status:?}: {err}");
            }
            assert!(
                Instant::now() < deadline,
                "strace did not attach to every thread: {threads:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // Attaching is seize, then interrupt, then syscall tracing: give
        // the last thread a moment to reach its first traced stop.
        std::thread::sleep(Duration::from_millis(300));
        s
    }

    /// SIGTERM makes strace detach from every thread; waits until none is
    /// traced any more. Returns the number of injected faults it logged.
    pub fn detach(mut self) -> usize {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .expect("signal strace");
        super::wait_timeout(&mut self.child, STEP_TIMEOUT);
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            let threads = tracers(self.target);
            if threads.iter().all(|(_, t)| *t == 0) {
                break;
            }
            assert!(Instant::now() < deadline, "still traced: {threads:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
        self.injected()
    }

    pub fn injected(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("(INJECTED)"))
            .count()
    }
}

impl Drop for Strace {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
