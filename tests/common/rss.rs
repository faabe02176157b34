//! A process's resident memory, as the kernel counts it in
//! `/proc/PID/status`.

/// The resident memory of `pid` now (`VmRSS`), in KiB; `None` once the
/// process is gone.
pub fn rss_kib(pid: i32) -> Option<u64> {
    status_kib(pid, "VmRSS:")
}

/// The peak resident memory of `pid` so far (`VmHWM`), in KiB.
pub fn peak_rss_kib(pid: i32) -> Option<u64> {
    status_kib(pid, "VmHWM:")
}

fn status_kib(pid: i32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}
