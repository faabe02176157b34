//! What a test needs from the machine beyond the build: root, or a tool
//! from Debian's packages. A test that needs one calls the guard first, so
//! that run without it (a plain `cargo test` as a normal user, or on a
//! machine without the tool) it fails at once naming what is missing and
//! how to get it, instead of panicking deep inside a helper. Nothing is
//! skipped: scripts/test.sh checks and installs all of these before it runs
//! the suite.

use std::path::Path;

/// Fails the calling test unless it runs as root. `why` says what the test
/// does that needs root (chown to another user, mount, ptrace).
#[track_caller]
pub fn require_root(why: &str) {
    if !nix::unistd::geteuid().is_root() {
        panic!("needs root ({why}): run scripts/test.sh as root");
    }
}

/// Fails the calling test unless `tool` is installed where the tests run
/// it from.
#[track_caller]
pub fn require_tool(tool: &str) {
    let (found, package) = match tool {
        // The tests run these two by absolute path, as Debian installs them.
        "strace" => (Path::new("/usr/bin/strace").is_file(), "strace"),
        "unshare" => (Path::new("/usr/bin/unshare").is_file(), "util-linux"),
        "ip" => (on_path("ip"), "iproute2"),
        other => (on_path(other), other),
    };
    if !found {
        panic!("needs {tool}: apt-get install {package} (or run scripts/test.sh as root)");
    }
    // strace attaches to a process that is not its child; where Yama
    // restricts ptrace to descendants, only root may do that.
    if tool == "strace" && !nix::unistd::geteuid().is_root() {
        let scope =
            std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").unwrap_or_default();
        if !matches!(scope.trim(), "" | "0") {
            panic!(
                "needs root (Yama ptrace_scope={}: strace may attach only to its own children): run scripts/test.sh as root",
                scope.trim()
            );
        }
    }
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(tool).is_file()))
        .unwrap_or(false)
}
