//! strace attached to the store thread of a running process, injecting
//! faults into chosen system calls (the real ones SQLite makes).
//!
//! Invariant 1 puts every SQLite call on one thread, `taskgate-store`, so
//! tracing that thread alone reaches every read, write and sync of the
//! database and nothing else: no artifact file, no socket, no other
//! thread's work can take an injected fault meant for the store.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const STEP_TIMEOUT: Duration = Duration::from_secs(30);

/// The name the store gives its thread (`Store::begin_open`).
pub const STORE_THREAD: &str = "taskgate-store";

/// System calls the store thread makes while it waits for commands (its
/// queue's timed wait, resumed after the attach interrupted it, and the
/// stall hook's sleep). They are traced too so that the log shows when
/// tracing is in force; a store thread wakes at least once a second (the
/// sweep timer).
const IDLE_CALLS: &str = "futex,restart_syscall,clock_nanosleep,nanosleep";

/// The thread ID of `pid`'s thread named `name`; fails unless there is
/// exactly one.
pub fn thread_named(pid: i32, name: &str) -> i32 {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap_or_else(|e| panic!("threads of {pid}: {e}"));
    let found: Vec<i32> = tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == name)
        })
        .filter_map(|t| t.file_name().to_str()?.parse().ok())
        .collect();
    assert_eq!(found.len(), 1, "threads of {pid} named {name}: {found:?}");
    found[0]
}

/// TracerPid of one thread of `pid` (-1 when it is gone).
pub fn tracer(pid: i32, tid: i32) -> i32 {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("TracerPid:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(-1)
}

/// strace attached to one thread, injecting faults.
pub struct Strace {
    child: Child,
    log: PathBuf,
    target: (i32, i32),
}

impl Strace {
    /// Attaches to the store thread of `pid`, tracing `calls` (e.g.
    /// `"fsync,fdatasync"`) and injecting `inject` (strace's
    /// `-e inject=` value, e.g. `"fsync,fdatasync:error=EIO"`). Returns
    /// once tracing is in force: strace has logged a system call of the
    /// thread, which it does only for a thread it has stopped and resumed
    /// under syscall tracing. From then on every call in `calls` is seen.
    pub fn attach_store_thread(pid: i32, log: &Path, calls: &str, inject: &str) -> Strace {
        let tid = thread_named(pid, STORE_THREAD);
        let mut cmd = Command::new("/usr/bin/strace");
        // -y: file descriptors with their paths, so a log line says which
        // file a fault was injected into.
        cmd.args(["-qq", "-y", "-p", &tid.to_string(), "-o"])
            .arg(log)
            .arg("-e")
            .arg(format!("trace={calls},{IDLE_CALLS}"))
            .arg("-e")
            .arg(format!("inject={inject}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let child = cmd.spawn().expect("run strace");
        let mut s = Strace {
            child,
            log: log.to_path_buf(),
            target: (pid, tid),
        };
        let me = s.child.id() as i32;
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            let traced = tracer(pid, tid) == me;
            if traced && !s.lines().is_empty() {
                break;
            }
            if let Some(status) = s.child.try_wait().unwrap() {
                let mut err = String::new();
                let _ = s.child.stderr.take().unwrap().read_to_string(&mut err);
                panic!("strace ended before tracing {tid}: {status:?}: {err}");
            }
            assert!(
                Instant::now() < deadline,
                "strace logged no system call of the store thread {tid} (traced: {traced})"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        s
    }

    /// SIGTERM makes strace detach; waits until the thread is traced no
    /// more. Returns the number of injected faults it logged.
    pub fn detach(mut self) -> usize {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .expect("signal strace");
        super::wait_timeout(&mut self.child, STEP_TIMEOUT);
        let (pid, tid) = self.target;
        let deadline = Instant::now() + STEP_TIMEOUT;
        while tracer(pid, tid) > 0 {
            assert!(Instant::now() < deadline, "{tid} still traced");
            std::thread::sleep(Duration::from_millis(10));
        }
        self.injected()
    }

    /// The lines strace has logged so far.
    pub fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// The logged calls whose fault was injected.
    pub fn injected_lines(&self) -> Vec<String> {
        self.lines()
            .into_iter()
            .filter(|l| l.contains("(INJECTED)"))
            .collect()
    }

    pub fn injected(&self) -> usize {
        self.injected_lines().len()
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
