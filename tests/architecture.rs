//! Structural rules of docs/ARCHITECTURE.md that the compiler cannot check.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// Invariant 1: only `store/` opens SQLite.
#[test]
fn only_the_store_module_touches_sqlite() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 5);
    let store = src.join("store");
    for f in files {
        if f.starts_with(&store) {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        assert!(
            !text.contains("rusqlite"),
            "{} uses rusqlite; only src/store/ may",
            f.display()
        );
    }
}

/// Invariant 6: bounds are named constants or configuration; the store's
/// public constants keep the values the specification fixes.
#[test]
fn fixed_bounds_keep_their_specified_values() {
    use taskgate::config::bounds;
    use taskgate::store;
    assert_eq!(store::MAX_PAYLOAD_BYTES, 16 * 1024);
    assert_eq!(store::SWEEP_BATCH, 128);
    assert_eq!(store::SWEEP_INTERVAL, std::time::Duration::from_secs(1));
    assert_eq!(store::TERMINAL_RETENTION_MS, 3_600_000);
    assert_eq!(bounds::QUEUE_DEPTH_DEFAULT, 128);
    assert_eq!(bounds::MAX_DB_PAGES_DEFAULT, 1_048_576);
    assert_eq!(bounds::CHECKPOINT_INTERVAL_SECS_DEFAULT, 60);
}

/// The configuration file the package installs is the starter file that
/// `taskgate init` writes: one source for the documented defaults.
#[test]
fn packaged_configuration_is_the_starter_file() {
    let shipped = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/taskgate.toml"),
    )
    .unwrap();
    assert_eq!(
        shipped,
        taskgate::config::starter_config(Some(taskgate::config::PACKAGE_STATE_DIR)),
        "regenerate with: taskgate init --state-dir /var/lib/taskgate > packaging/taskgate.toml"
    );
}
