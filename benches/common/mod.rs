//! What the benchmark programs share.

/// A scratch directory for one run, in `$BENCH_DIR` (to measure another
/// disk) or the system's temporary directory; removed when dropped.
pub fn scratch_dir(prefix: &str) -> tempfile::TempDir {
    let base = std::env::var_os("BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(base)
        .expect("temporary directory")
}
