//! Helpers shared by the integration tests: real directories, the real
//! binary, real SQLite files.
//!
//! One harness (`tests/common`) starts every daemon process: the real binary on
//! port 0, with a notify socket the test owns; readiness and the address come
//! from `READY=1`/`STATUS=`, never from the log. A test that needs the serving
//! parts in process (a router to drive with `oneshot` on a paused clock, a
//! test's own built-in tools, the store's manual clock) opens them through the
//! daemon's own startup, `service::Daemon::start`, or serves a listener with
//! `service::run`; none wires startup, the task service or the router by hand.
//! Expiry and retention move the store's manual clock; poll pacing moves
//! tokio's paused clock. `tests/common` is the support module every test binary
//! compiles, one concern a file, re-exported by `mod.rs` (which holds the
//! harness itself: directories, the binary, the daemon, FIFOs): `fixtures.rs`
//! builds `[[tool]]` tables (`Tool::new(name).script(…).task(…)`, only the keys
//! a test sets, `effect` `read_only` unless given) and writes the configuration
//! file around the sections a test writes itself; `http.rs` is the raw HTTP/1.1
//! client: a request goes out as the bytes the test wrote, on a fresh or a
//! keep-alive connection, and one reader takes the answer whole (status,
//! headers, body with its `Content-Length` or chunked framing undone, an event
//! stream read until its answer where asked) or says what came instead (the
//! connection closed, or nothing more in time); tests that send a broken or
//! partial request keep their socket and read the answer with it; `mcp.rs`
//! holds the protocol versions, the Tasks extension's name and a 2026-07-28
//! request's `_meta`; `rss.rs` reads a process's resident memory and its peak
//! from `/proc`; `fuzz/` is the request fuzzer's framework (the seeded random
//! streams, requests as structure, the mutators, a run over keep-alive
//! connections with its judging, tally, replay lines and vacuity guard), whose
//! tests and tables (base requests, known defects, the daemon's configuration)
//! are `tests/fuzz_requests.rs`; `prereq.rs` the guards for root and Debian
//! tools; `strace.rs` fault injection into the store thread; `upstream.rs` the
//! upstream MCP servers tests put behind the daemon (the misbehaving stdlib
//! server behind a wrapper that gives it its environment and records its pid,
//! the SDK servers of `scripts/upstream-servers.sh`), their `[[upstream]]`
//! tables, and waiting for `status --json` to say where an upstream stands.
#![allow(dead_code)]

pub mod fixtures;
pub mod fuzz;
pub mod http;
pub mod mcp;
pub mod prereq;
pub mod route;
pub mod rss;
pub mod strace;
pub mod tls;
pub mod tokens;
pub mod upstream;

// Not every test binary uses every helper.
#[allow(unused_imports)]
pub use fixtures::{Tool, config_text, write_config};
#[allow(unused_imports)]
pub use http::http_get;
#[allow(unused_imports)]
pub use rss::{peak_rss_kib, rss_kib};

use std::ffi::{OsStr, OsString};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;

use taskgate::store::{Digest, NewTask, Store, StoreOptions};

pub const BIN: &str = env!("CARGO_BIN_EXE_taskgate");

/// A private (0700) directory under the system temp dir, which is a
/// root-owned sticky directory and so a trusted ancestor.
pub fn private_dir() -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix("taskgate-test-")
        .tempdir()
        .expect("tempdir");
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    d
}

/// A private state directory inside a fresh private temp dir.
pub fn state_dir(root: &Path) -> PathBuf {
    let p = root.join("state");
    std::fs::create_dir(&p).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700)).unwrap();
    p
}

/// The sha256 of a file's bytes, in hex. A file that cannot be read fails
/// the test: a missing file must never hash like an empty one.
pub fn sha256_file(path: &Path) -> String {
    let bytes =
        std::fs::read(path).unwrap_or_else(|e| panic!("cannot hash {}: {e}", path.display()));
    Digest::of(&bytes).to_hex()
}

pub fn owner() -> Digest {
    Digest::of(b"test-owner")
}

pub fn new_task(ttl_ms: i64) -> NewTask {
    NewTask {
        proposal: None,
        owner: owner(),
        reference: None,
        request: None,
        ttl_ms,
        poll_interval_ms: 500,
    }
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Creates a valid, cleanly closed database with `n` tasks in `dir`,
/// half of them completed.
pub fn populate(dir: &Path, n: usize) -> Vec<String> {
    let rt = runtime();
    rt.block_on(async {
        let (store, _) = Store::open(StoreOptions::new(dir.join("tasks.db"))).unwrap();
        let mut ids = Vec::new();
        for i in 0..n {
            let created = store.create(new_task(86_400_000)).await.unwrap();
            let id = created.record().id.clone();
            if i % 2 == 0 {
                store
                    .finish(
                        &id,
                        taskgate::store::TaskStatus::Completed,
                        Some(taskgate::store::Outcome::Result(
                            serde_json::json!({"content":[{"type":"text","text":format!("result {i} {}", "x".repeat(200))}]}),
                        )),
                    )
                    .await
                    .unwrap();
            }
            ids.push(id.to_string());
        }
        store.shutdown().await.unwrap();
        ids
    })
}

/// Runs the real binary with a clean, predictable environment; a run that
/// has not ended after 60 s is killed and fails the test.
pub fn taskgate(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let child = cmd.spawn().expect("run taskgate");
    let pid = child.id();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if done_rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .is_err()
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            return true;
        }
        false
    });
    let out = child.wait_with_output().expect("wait for taskgate");
    let _ = done_tx.send(());
    let timed_out = watchdog.join().unwrap_or(false);
    assert!(!timed_out, "taskgate {args:?} did not finish within 60 s");
    out
}

/// What the daemon serving `state` reports of itself now
/// (`taskgate status --json` over its admin socket).
pub fn admin_status(state: &Path) -> serde_json::Value {
    let out = taskgate(
        &["status", "--json", "--state-dir", &state.to_string_lossy()],
        &[],
    );
    assert!(out.status.success(), "taskgate status --json: {out:?}");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("taskgate status --json printed no JSON ({e}): {out:?}"))
}

/// The refusal line of a failed run: asserts there is exactly one line.
pub fn one_line_stderr(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "expected one stderr line, got: {text:?}");
    lines[0].to_string()
}

/// What the harness hears about a daemon: a service-manager notification,
/// or the end of the process.
enum Event {
    Notify(String),
    Exited,
}

/// A copy of the binary under test that another user can run: a test
/// that acts as another user must not run the build's own file, which
/// sits wherever the checkout is (under a home directory other users
/// cannot enter, on a fresh machine). The copy lives in a new directory
/// under the system temp dir (root-owned, 0755, a trusted ancestor for a
/// state directory), removed when this is dropped.
pub struct SharedBinary {
    dir: tempfile::TempDir,
    pub path: PathBuf,
}

impl SharedBinary {
    /// The directory holding the copy: reachable by every user.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

pub fn binary_for_other_users() -> SharedBinary {
    let dir = tempfile::Builder::new()
        .prefix("taskgate-test-bin-")
        .tempdir()
        .expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.path().join("taskgate");
    std::fs::copy(BIN, &path).expect("copy the binary");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    SharedBinary { dir, path }
}

/// The unprivileged service user the tests run a daemon as (created with
/// `useradd` the first time, as a system user without a home or a login
/// shell); needs root.
pub const SERVICE_USER: &str = "taskgate-test-svc";

pub fn service_user() -> nix::unistd::User {
    static CREATE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = CREATE.lock().unwrap_or_else(|e| e.into_inner());
    let lookup = || nix::unistd::User::from_name(SERVICE_USER).expect("look up the service user");
    if let Some(u) = lookup() {
        return u;
    }
    let out = Command::new("/usr/sbin/useradd")
        .args([
            "--system",
            "--user-group",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            SERVICE_USER,
        ])
        .output()
        .expect("run useradd (passwd package)");
    // 9: another test binary created it meanwhile.
    assert!(
        out.status.success() || out.status.code() == Some(9),
        "useradd {SERVICE_USER}: {out:?}"
    );
    lookup().unwrap_or_else(|| panic!("useradd made no user {SERVICE_USER}"))
}

/// How to start a daemon: `Daemon::builder()…start()`.
pub struct DaemonOptions {
    program: Option<PathBuf>,
    user: Option<(u32, u32)>,
    config: Option<PathBuf>,
    state: Option<PathBuf>,
    log: Option<PathBuf>,
    envs: Vec<(OsString, OsString)>,
    args: Vec<OsString>,
    stdio: bool,
    ready_within: Duration,
}

impl DaemonOptions {
    /// Runs this binary instead of the build's (a [`SharedBinary`], for a
    /// daemon run as another user).
    pub fn program(mut self, path: &Path) -> Self {
        self.program = Some(path.to_path_buf());
        self
    }

    /// Runs the daemon as this uid and gid (the test must be root); the
    /// notify socket is made reachable by it.
    pub fn user(mut self, uid: u32, gid: u32) -> Self {
        self.user = Some((uid, gid));
        self
    }

    /// `--config PATH`.
    pub fn config(mut self, path: &Path) -> Self {
        self.config = Some(path.to_path_buf());
        self
    }

    /// `--state-dir PATH`.
    pub fn state_dir(mut self, path: &Path) -> Self {
        self.state = Some(path.to_path_buf());
        self
    }

    /// Where the daemon's stderr goes (by default a file in the harness's
    /// own private directory).
    pub fn log(mut self, path: &Path) -> Self {
        self.log = Some(path.to_path_buf());
        self
    }

    /// One more environment variable (the environment is otherwise only
    /// PATH and NOTIFY_SOCKET).
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.envs
            .push((key.as_ref().to_os_string(), value.as_ref().to_os_string()));
        self
    }

    /// One more command-line argument after `serve`.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(arg.as_ref().to_os_string());
        self
    }

    /// Serve MCP on stdin/stdout (piped, in `Daemon::child`) instead of HTTP.
    pub fn stdio(mut self) -> Self {
        self.stdio = true;
        self
    }

    /// How long READY=1 may take (30 s unless set).
    pub fn ready_within(mut self, limit: Duration) -> Self {
        self.ready_within = limit;
        self
    }

    /// Starts the daemon and returns once it sent READY=1: over HTTP its
    /// port is then known from STATUS=. A daemon that ends first, or is not
    /// ready in time, fails the test.
    pub fn start(self) -> Daemon {
        let limit = self.ready_within;
        let mut d = self.spawn();
        let ready = d.wait_for("READY=1", limit);
        let status = ready
            .lines()
            .find_map(|l| l.strip_prefix("STATUS="))
            .unwrap_or_else(|| panic!("READY=1 came without a STATUS= line: {ready:?}"))
            .to_string();
        if !d.stdio {
            d.port = status
                .split("serving on 127.0.0.1:")
                .nth(1)
                .and_then(|r| r.split(';').next())
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("STATUS= names no loopback port: {status:?}"));
        }
        d.status = status;
        d
    }

    /// Starts the daemon without waiting for anything: for tests of what
    /// happens before READY=1 (or instead of it).
    pub fn spawn(self) -> Daemon {
        let dir = private_dir();
        let sock_path = dir.path().join("notify.sock");
        let sock = UnixDatagram::bind(&sock_path).expect("bind the notify socket");
        let log = self.log.unwrap_or_else(|| dir.path().join("daemon.log"));
        let err = std::fs::File::create(&log).expect("create the daemon log");
        let mut cmd = Command::new(self.program.as_deref().unwrap_or(Path::new(BIN)));
        if let Some((uid, gid)) = self.user {
            // Only the daemon's user may send on the socket; the directory
            // lets it pass, without listing it.
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
            nix::unistd::chown(
                &sock_path,
                Some(nix::unistd::Uid::from_raw(uid)),
                Some(nix::unistd::Gid::from_raw(gid)),
            )
            .expect("give the notify socket to the daemon's user");
            std::os::unix::process::CommandExt::uid(&mut cmd, uid);
            std::os::unix::process::CommandExt::gid(&mut cmd, gid);
            cmd.current_dir("/");
        }
        cmd.arg("serve");
        if self.stdio {
            cmd.arg("--stdio")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped());
        } else {
            cmd.args(["--listen", "127.0.0.1:0"])
                .stdin(Stdio::null())
                .stdout(Stdio::null());
        }
        if let Some(config) = &self.config {
            cmd.arg("--config").arg(config);
        }
        if let Some(state) = &self.state {
            cmd.arg("--state-dir").arg(state);
        }
        cmd.args(&self.args)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("NOTIFY_SOCKET", &sock_path)
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stderr(err);
        let child = cmd.spawn().expect("start taskgate serve");

        let (tx, events) = mpsc::channel();
        let reader = sock.try_clone().expect("clone the notify socket");
        let notes_tx = tx.clone();
        // Ends once the socket is shut down and its queue read out.
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok(n) = reader.recv(&mut buf) {
                if n == 0 {
                    break;
                }
                let m = String::from_utf8_lossy(&buf[..n]).to_string();
                if notes_tx.send(Event::Notify(m)).is_err() {
                    break;
                }
            }
        });
        let pid = Pid::from_raw(child.id() as i32);
        std::thread::spawn(move || {
            exited(pid);
            let _ = tx.send(Event::Exited);
        });
        Daemon {
            child,
            port: 0,
            log,
            status: String::new(),
            stdio: self.stdio,
            events,
            notes: Vec::new(),
            exit: None,
            sock,
            _dir: dir,
        }
    }
}

/// Blocks until `pid`, a child of this process, has ended, leaving it
/// unreaped (WNOWAIT): its pid cannot be reused until `Child::wait` reaps
/// it, so a later kill can never reach another process.
fn exited(pid: Pid) {
    use nix::sys::wait::{Id, WaitPidFlag, waitid};
    loop {
        match waitid(Id::Pid(pid), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT) {
            Err(nix::errno::Errno::EINTR) => continue,
            _ => return,
        }
    }
}

/// A real `taskgate serve` (HTTP on an ephemeral loopback port, or stdio)
/// that tells the test it is ready, and everything else it tells systemd,
/// through a NOTIFY_SOCKET the harness owns. SIGKILLed when dropped unless
/// it has already ended.
pub struct Daemon {
    pub child: Child,
    /// The HTTP port from STATUS= (0 over stdio).
    pub port: u16,
    pub log: PathBuf,
    /// The STATUS= line sent with READY=1.
    pub status: String,
    stdio: bool,
    events: Receiver<Event>,
    /// Every notification received so far, in order.
    notes: Vec<String>,
    exit: Option<ExitStatus>,
    sock: UnixDatagram,
    /// Holds the notify socket (and the default log).
    _dir: tempfile::TempDir,
}

impl Daemon {
    pub fn builder() -> DaemonOptions {
        DaemonOptions {
            program: None,
            user: None,
            config: None,
            state: None,
            log: None,
            envs: Vec::new(),
            args: Vec::new(),
            stdio: false,
            ready_within: Duration::from_secs(30),
        }
    }

    /// HTTP with a config file and a state directory, stderr in `log`.
    pub fn start(config: &Path, state: &Path, log: &Path) -> Daemon {
        Daemon::builder()
            .config(config)
            .state_dir(state)
            .log(log)
            .start()
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    pub fn client(&self, tasks: bool) -> taskgate::client::Client {
        taskgate::client::Client::new(&self.url(), tasks).unwrap()
    }

    /// The daemon's stderr so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn signal(&self, sig: Signal) {
        if self.exit.is_none() {
            nix::sys::signal::kill(self.pid(), sig).expect("signal the daemon");
        }
    }

    /// Waits up to `limit` for a notification containing `needle` and
    /// returns it. The daemon ending first, or the time running out, fails
    /// the test.
    pub fn wait_for(&mut self, needle: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(Event::Notify(m)) => {
                    self.notes.push(m.clone());
                    if m.contains(needle) {
                        return m;
                    }
                }
                Ok(Event::Exited) | Err(RecvTimeoutError::Disconnected) => {
                    let status = self.reap();
                    panic!(
                        "taskgate ended ({status}) before notifying {needle:?}; notifications {:?}; log:\n{}",
                        self.notes,
                        self.log_text()
                    );
                }
                Err(RecvTimeoutError::Timeout) => panic!(
                    "taskgate sent no {needle:?} within {limit:?}; notifications {:?}; log:\n{}",
                    self.notes,
                    self.log_text()
                ),
            }
        }
    }

    /// [`Daemon::wait_for`], also returning every notification that came
    /// before the match since this call, in order: datagrams on one socket
    /// keep the order they were sent in, so this is what the daemon said
    /// between two events, whatever time passed.
    pub fn wait_for_collecting(&mut self, needle: &str, limit: Duration) -> (String, Vec<String>) {
        let from = self.notes.len();
        let found = self.wait_for(needle, limit);
        let before = self.notes[from..self.notes.len() - 1].to_vec();
        (found, before)
    }

    /// Every notification received so far (those already queued included).
    pub fn notifications(&mut self) -> &[String] {
        while let Ok(e) = self.events.try_recv() {
            if let Event::Notify(m) = e {
                self.notes.push(m);
            }
        }
        &self.notes
    }

    /// Waits for the process to end and reaps it; after `limit` it is
    /// SIGKILLed and the test fails. The notifications it sent before it
    /// ended are all in `notifications()` afterwards.
    pub fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        if let Some(status) = self.exit {
            return status;
        }
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(Event::Notify(m)) => self.notes.push(m),
                Ok(Event::Exited) | Err(RecvTimeoutError::Disconnected) => return self.reap(),
                Err(RecvTimeoutError::Timeout) => {
                    let _ = self.child.kill();
                    let status = self.reap();
                    panic!(
                        "taskgate did not end within {limit:?} (killed: {status}); notifications {:?}; log:\n{}",
                        self.notes,
                        self.log_text()
                    );
                }
            }
        }
    }

    /// Reaps the ended process and reads out what it sent before.
    fn reap(&mut self) -> ExitStatus {
        let status = self.child.wait().expect("reap taskgate");
        self.exit = Some(status);
        // Shut down, the socket still hands out what is queued, then ends
        // the reader; the reader's end closes the channel.
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(Event::Notify(m)) => self.notes.push(m),
                Ok(Event::Exited) => {}
                Err(_) => break,
            }
        }
        status
    }

    /// SIGTERM and wait: a clean stop. Any other end is described on
    /// stderr (shown with the failing test) before the caller asserts.
    pub fn stop(mut self) -> ExitStatus {
        self.signal(Signal::SIGTERM);
        let status = self.wait_exit(Duration::from_secs(30));
        if !status.success() {
            eprintln!(
                "taskgate did not stop cleanly on SIGTERM: {status}; notifications {:?}; log:\n{}",
                self.notes,
                self.log_text()
            );
        }
        status
    }

    /// SIGKILL and reap: a crash.
    pub fn kill(mut self) {
        self.signal(Signal::SIGKILL);
        self.wait_exit(Duration::from_secs(30));
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.exit.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}

/// Waits for a child to end; one still running after `limit` is SIGKILLed
/// and fails the test.
pub fn wait_timeout(child: &mut Child, limit: Duration) -> ExitStatus {
    let (tx, rx) = mpsc::channel();
    let pid = Pid::from_raw(child.id() as i32);
    std::thread::spawn(move || {
        exited(pid);
        let _ = tx.send(());
    });
    if rx.recv_timeout(limit).is_err() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("process {pid} did not exit within {limit:?}");
    }
    child.wait().expect("reap the child")
}

/// A named pipe a tool writes a line into when it gets that far: reading
/// it blocks until then, so a test waits for a tool without polling.
pub struct Fifo {
    pub path: PathBuf,
}

impl Fifo {
    pub fn new(path: &Path) -> Fifo {
        nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
        Fifo {
            path: path.to_path_buf(),
        }
    }

    /// Writes `text` to the tool reading this pipe and closes it: the
    /// release of a tool that blocks until told to go on. A tool that has
    /// not opened the pipe within `limit` fails the test.
    pub fn write(&self, text: &str, limit: Duration) {
        let (tx, rx) = mpsc::channel();
        let (path, text) = (self.path.clone(), text.to_string());
        // Opening a FIFO for writing blocks until a reader opens it.
        std::thread::spawn(move || {
            let _ = tx.send(std::fs::write(&path, text));
        });
        match rx.recv_timeout(limit) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("writing {}: {e}", self.path.display()),
            Err(_) => panic!("nothing opened {} within {limit:?}", self.path.display()),
        }
    }

    /// Whether a process has the pipe open for reading now (or is waiting
    /// in its open): a non-blocking open for writing fails with ENXIO only
    /// when none has.
    pub fn has_reader(&self) -> bool {
        use std::os::unix::fs::OpenOptionsExt;
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&self.path)
        {
            Ok(_) => true,
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => false,
            Err(e) => panic!("opening {}: {e}", self.path.display()),
        }
    }

    /// What the tool wrote, once it has closed its end; a tool that has not
    /// written within `limit` fails the test.
    pub fn read(&self, limit: Duration) -> String {
        let (tx, rx) = mpsc::channel();
        let path = self.path.clone();
        // Opening a FIFO for reading blocks until a writer opens it; the
        // thread is left behind only when the test fails anyway.
        std::thread::spawn(move || {
            let _ = tx.send(std::fs::read_to_string(&path));
        });
        match rx.recv_timeout(limit) {
            Ok(Ok(text)) => text,
            Ok(Err(e)) => panic!("reading {}: {e}", self.path.display()),
            Err(_) => panic!(
                "nothing was written to {} within {limit:?}",
                self.path.display()
            ),
        }
    }
}
