//! What the package ships besides the binary, checked from the source
//! tree: the copyright file names every crate linked into the binary (its
//! crate paragraphs are generated here from `cargo metadata`, the rest
//! comes from `packaging/copyright.in`; `scripts/update-copyright.sh`
//! rewrites it), the man pages (generated and hand-written) reference only
//! pages that exist and have the sections an operator looks for, and the
//! bash completion is generated.
//!
//! `scripts/build-deb.sh` builds the release binary, renders the man pages
//! (`taskgate man --out`, hidden: taskgate(1), one page per command, and
//! taskgate.toml(5) from the key table; the two runbook pages `packaging/*.8`
//! are hand-written) into cargo's target directory (`CARGO_TARGET_DIR`
//! honoured: the assets name `target/release/…`, which cargo-deb reads from
//! wherever cargo builds), and runs cargo-deb with the metadata in
//! `Cargo.toml`: the unit from `systemd/`, maintainer scripts, the conffile
//! `packaging/taskgate.toml` (identical to `taskgate init --state-dir
//! /var/lib/taskgate`, checked by a test), the runbooks. lintian must report
//! nothing. `scripts/system-test.sh` installs the package in a booted Debian 12
//! container (systemd-nspawn) and checks the unit, the lock, the watchdog,
//! backup/restore, upgrade and purge, and tool confinement under the unit (a
//! probe tool denied the state directory, a `setsid` grandchild gone after a
//! cancel and after SIGKILL of the main process, a bounded fork bomb ended by
//! `max_processes` while `/healthz` answers, the running unit's exposure
//! score).
//!
//! What this file proves: the copyright file covers every linked crate as
//! Cargo.lock pins it; man pages name real commands, reference only shipped
//! pages and have the operator sections; bash completion is generated; the
//! package's built files are read from cargo's target directory
//! (`target/release/` assets, no fixed `target/` path in scripts/build-deb.sh)

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `cargo metadata` for this platform, offline: Cargo.lock decides.
fn metadata() -> Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let target = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
    let out = Command::new(cargo)
        .current_dir(repo())
        .args([
            "metadata",
            "--locked",
            "--offline",
            "--format-version",
            "1",
            "--filter-platform",
            &target,
        ])
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON")
}

/// The packages linked into the binary: reachable from taskgate through
/// normal dependencies (build scripts' and tests' dependencies are not
/// linked), without taskgate itself and the workspace's other crates
/// (crates/*: taskgate's own code, which `Files: *` covers).
fn linked(meta: &Value) -> Vec<&Value> {
    let packages: BTreeMap<&str, &Value> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p))
        .collect();
    let nodes: BTreeMap<&str, &Value> = meta["resolve"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["id"].as_str().unwrap(), n))
        .collect();
    let root = meta["resolve"]["root"].as_str().unwrap();
    let mut seen = BTreeSet::new();
    let mut stack = vec![root];
    while let Some(id) = stack.pop() {
        if !seen.insert(id) {
            continue;
        }
        for dep in nodes[id]["deps"].as_array().unwrap() {
            let normal = dep["dep_kinds"]
                .as_array()
                .unwrap()
                .iter()
                .any(|k| k["kind"].is_null());
            if normal {
                stack.push(dep["pkg"].as_str().unwrap());
            }
        }
    }
    let members: BTreeSet<&str> = meta["workspace_members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    assert!(members.contains(root), "{root} is no workspace member");
    seen.retain(|id| !members.contains(id));
    let mut out: Vec<&Value> = seen.iter().map(|id| packages[id]).collect();
    out.sort_by_key(|p| {
        (
            p["name"].as_str().unwrap().to_string(),
            p["version"].as_str().unwrap().to_string(),
        )
    });
    out
}

/// An SPDX expression as a tree.
#[derive(Debug)]
enum Spdx {
    Id(String, Option<String>),
    And(Vec<Spdx>),
    Or(Vec<Spdx>),
}

fn parse(expr: &str) -> Spdx {
    // Old crates write `MIT/Apache-2.0` for `MIT OR Apache-2.0`.
    let spaced = expr
        .replace('/', " OR ")
        .replace('(', " ( ")
        .replace(')', " ) ");
    let tokens: Vec<&str> = spaced.split_whitespace().collect();
    let mut pos = 0;
    let tree = parse_or(&tokens, &mut pos);
    assert_eq!(pos, tokens.len(), "cannot read the licence {expr:?}");
    tree
}

fn parse_or(t: &[&str], pos: &mut usize) -> Spdx {
    let mut parts = vec![parse_and(t, pos)];
    while t.get(*pos).is_some_and(|w| w.eq_ignore_ascii_case("OR")) {
        *pos += 1;
        parts.push(parse_and(t, pos));
    }
    if parts.len() == 1 {
        parts.pop().unwrap()
    } else {
        Spdx::Or(parts)
    }
}

fn parse_and(t: &[&str], pos: &mut usize) -> Spdx {
    let mut parts = vec![parse_atom(t, pos)];
    while t.get(*pos).is_some_and(|w| w.eq_ignore_ascii_case("AND")) {
        *pos += 1;
        parts.push(parse_atom(t, pos));
    }
    if parts.len() == 1 {
        parts.pop().unwrap()
    } else {
        Spdx::And(parts)
    }
}

fn parse_atom(t: &[&str], pos: &mut usize) -> Spdx {
    let word = t[*pos];
    *pos += 1;
    if word == "(" {
        let inner = parse_or(t, pos);
        assert_eq!(t.get(*pos), Some(&")"), "unbalanced licence expression");
        *pos += 1;
        return inner;
    }
    if t.get(*pos).is_some_and(|w| w.eq_ignore_ascii_case("WITH")) {
        let exception = t[*pos + 1].to_string();
        *pos += 2;
        return Spdx::Id(word.to_string(), Some(exception));
    }
    Spdx::Id(word.to_string(), None)
}

/// The copyright format's syntax: `or`, `and`, and a comma to make an
/// `and` bind looser than the `or`s before it (`A or B, and C`).
fn dep5(tree: &Spdx) -> String {
    match tree {
        Spdx::Id(id, None) => id.clone(),
        Spdx::Id(id, Some(exc)) => {
            format!("{id} with {} exception", exc.trim_end_matches("-exception"))
        }
        Spdx::Or(parts) => parts.iter().map(dep5).collect::<Vec<_>>().join(" or "),
        Spdx::And(parts) => {
            let loose = parts.iter().any(|p| matches!(p, Spdx::Or(_)));
            let sep = if loose { ", and " } else { " and " };
            parts.iter().map(dep5).collect::<Vec<_>>().join(sep)
        }
    }
}

fn names(tree: &Spdx, out: &mut BTreeSet<String>) {
    match tree {
        Spdx::Id(id, _) => {
            out.insert(id.clone());
        }
        Spdx::And(parts) | Spdx::Or(parts) => parts.iter().for_each(|p| names(p, out)),
    }
}

/// The whole copyright file, and the licence names its paragraphs use.
fn generate() -> (String, BTreeSet<String>) {
    let meta = metadata();
    let mut used = BTreeSet::new();
    let mut paragraphs = Vec::new();
    for p in linked(&meta) {
        let name = p["name"].as_str().unwrap();
        let version = p["version"].as_str().unwrap();
        let licence = p["license"].as_str().unwrap_or_else(|| {
            panic!(
                "{name} {version} declares no SPDX licence; describe it in packaging/copyright.in"
            )
        });
        let tree = parse(licence);
        names(&tree, &mut used);
        let authors: Vec<String> = p["authors"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str())
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        let holders = if authors.is_empty() {
            format!("the {name} authors")
        } else {
            authors.join("\n ")
        };
        paragraphs.push(format!(
            "Files: crates/{name}-{version}/*\nCopyright: {holders}\nLicense: {}",
            dep5(&tree)
        ));
    }
    let template = std::fs::read_to_string(repo().join("packaging/copyright.in"))
        .expect("read packaging/copyright.in");
    assert!(template.contains("@CRATES@"));
    (template.replace("@CRATES@", &paragraphs.join("\n\n")), used)
}

#[test]
fn the_copyright_file_covers_every_linked_crate_as_cargo_lock_pins_it() {
    let (text, used) = generate();
    let path = repo().join("packaging/copyright");
    if std::env::var_os("TASKGATE_UPDATE_COPYRIGHT").is_some() {
        // Rewriting the file and then comparing it with itself would pass
        // having checked nothing: this run only rewrites, and says so.
        std::fs::write(&path, &text).expect("write packaging/copyright");
        panic!(
            "packaging/copyright was rewritten from Cargo.lock and nothing was checked; run the test again without TASKGATE_UPDATE_COPYRIGHT"
        );
    }
    let shipped = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        shipped == text,
        "packaging/copyright is out of date with Cargo.lock; run scripts/update-copyright.sh"
    );
    // Every licence a paragraph names has its own paragraph with the text.
    for name in used.iter().chain(["Apache-2.0".to_string()].iter()) {
        let standalone = format!("\n\nLicense: {name}\n ");
        assert!(
            text.contains(&standalone),
            "no standalone License: {name} paragraph with its text in packaging/copyright.in"
        );
    }
}

#[test]
fn licence_expressions_read_as_the_copyright_format_writes_them() {
    let cases = [
        ("MIT OR Apache-2.0", "MIT or Apache-2.0"),
        ("MIT/Apache-2.0", "MIT or Apache-2.0"),
        (
            "(MIT OR Apache-2.0) AND Unicode-3.0",
            "MIT or Apache-2.0, and Unicode-3.0",
        ),
        ("MIT AND BSD-3-Clause", "MIT and BSD-3-Clause"),
        (
            "Apache-2.0 WITH LLVM-exception OR MIT",
            "Apache-2.0 with LLVM exception or MIT",
        ),
    ];
    for (spdx, want) in cases {
        assert_eq!(dep5(&parse(spdx)), want, "{spdx}");
    }
}

/// Pages outside the package that ours may name: they come with systemd,
/// which the package depends on.
const SYSTEM_PAGES: [&str; 3] = ["journalctl(1)", "systemctl(1)", "systemd.timer(5)"];

/// Every `.BR name (section)` reference in a page, as `name(section)`.
fn references(page: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in page.lines() {
        let Some(rest) = line.strip_prefix(".BR ") else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let (Some(name), Some(sec)) = (words.next(), words.next()) else {
            continue;
        };
        let Some(sec) = sec.strip_prefix('(').and_then(|s| s.get(..1)) else {
            continue;
        };
        if sec.chars().all(|c| c.is_ascii_digit()) {
            out.push(format!(
                "{}({sec})",
                name.replace("\\-", "-").trim_matches('"')
            ));
        }
    }
    out
}

#[test]
fn man_pages_name_real_commands_reference_shipped_pages_and_have_the_operator_sections() {
    let dir = common::private_dir();
    let out = common::taskgate(&["man", "--out", dir.path().to_str().unwrap()], &[]);
    assert!(out.status.success(), "{out:?}");
    let man8 = dir.path().join("man8");
    std::fs::create_dir_all(&man8).unwrap();
    for page in ["taskgate-backup.8", "taskgate-restore.8"] {
        std::fs::copy(repo().join("packaging").join(page), man8.join(page)).unwrap();
    }
    // `man taskgate-backup` opens the runbook: no section-1 page shadows it.
    for shadow in ["taskgate-backup.1", "taskgate-restore.1"] {
        assert!(!dir.path().join("man1").join(shadow).exists(), "{shadow}");
    }
    let mut shipped = BTreeSet::new();
    let mut pages = Vec::new();
    for sec in ["1", "5", "8"] {
        for entry in std::fs::read_dir(dir.path().join(format!("man{sec}"))).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            let stem = name.strip_suffix(&format!(".{sec}")).unwrap().to_string();
            shipped.insert(format!("{stem}({sec})"));
            pages.push((stem, sec, std::fs::read_to_string(&path).unwrap()));
        }
    }
    for (stem, sec, text) in &pages {
        for r in references(text) {
            assert!(
                shipped.contains(&r) || SYSTEM_PAGES.contains(&r.as_str()),
                "{stem}({sec}) references {r}, which is not shipped"
            );
        }
        let mut wanted = vec![".SH \"SEE ALSO\"", ".SH FILES"];
        if *sec != "5" {
            wanted.extend([".SH \"EXIT STATUS\"", ".SH ENVIRONMENT", ".SH SYNOPSIS"]);
        }
        if stem == "taskgate-call" || stem == "taskgate-task" {
            // The operator client touches no file and no state directory.
            wanted.retain(|w| *w != ".SH FILES" && *w != ".SH ENVIRONMENT");
        }
        for w in wanted {
            assert!(text.contains(w), "{stem}({sec}) has no {w}");
        }
        // A synopsis names the command as it is typed.
        if let Some(cmd) = stem.strip_prefix("taskgate-")
            && *sec == "1"
        {
            let typed = format!("\\fBtaskgate {cmd}\\fR");
            assert!(text.contains(&typed), "{stem}(1): synopsis lacks {typed}");
        }
    }
    for runbook in ["taskgate-backup", "taskgate-restore"] {
        let text = &pages.iter().find(|p| p.0 == runbook).unwrap().2;
        let cmd = runbook.replace('-', " ");
        assert!(
            text.contains(&format!(".B {cmd}")),
            "{runbook}(8) documents `{cmd}`"
        );
    }

    // groff reads every page without a warning.
    for (stem, sec, _) in &pages {
        let path = dir.path().join(format!("man{sec}/{stem}.{sec}"));
        let Ok(render) = std::process::Command::new("sh")
            .arg("-c")
            .arg("preconv \"$1\" | groff -man -Tutf8 -ww >/dev/null")
            .arg("sh")
            .arg(&path)
            .output()
        else {
            continue;
        };
        let stderr = String::from_utf8_lossy(&render.stderr);
        assert!(
            render.status.success() && stderr.trim().is_empty(),
            "{stem}({sec}): {stderr}"
        );
    }

    // The bash completion knows every command.
    let completion = std::fs::read_to_string(dir.path().join("completions/taskgate")).unwrap();
    assert!(completion.contains("complete -F _taskgate"), "{completion}");
    for cmd in [
        "serve",
        "check",
        "backup",
        "restore",
        "call",
        "task",
        "bench",
        "--state-dir",
    ] {
        assert!(completion.contains(cmd), "completion lacks {cmd}");
    }
}

/// A built file the package ships is read from cargo's target directory
/// wherever it is (`CARGO_TARGET_DIR`): Cargo.toml names it under
/// `target/release/`, the one prefix cargo-deb resolves there (any other
/// `target/` path is read from the source tree), and scripts/build-deb.sh
/// names no path under a fixed `target/`, taking the directory from cargo.
#[test]
fn the_package_reads_its_built_files_from_cargos_target_directory() {
    let meta = metadata();
    let package = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "taskgate")
        .expect("the taskgate package");
    let assets = package["metadata"]["deb"]["assets"]
        .as_array()
        .expect("[package.metadata.deb] assets");
    let mut built = 0;
    for asset in assets {
        let source = asset[0].as_str().unwrap();
        if source.starts_with("target/") {
            assert!(
                source.starts_with("target/release/"),
                "the asset {source} is read from the source tree's target/, not cargo's target directory"
            );
            built += 1;
        }
    }
    assert!(built >= 5, "the binary, the man pages and the completion");

    let script = std::fs::read_to_string(repo().join("scripts/build-deb.sh")).unwrap();
    for (n, line) in script.lines().enumerate() {
        let code = line.trim_start();
        if code.starts_with('#') {
            continue;
        }
        let fixed = code.match_indices("target/").any(|(at, _)| {
            code[..at]
                .chars()
                .last()
                .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'))
        });
        assert!(
            !fixed,
            "scripts/build-deb.sh line {}: a fixed target/ path ignores CARGO_TARGET_DIR: {line}",
            n + 1
        );
    }
}
