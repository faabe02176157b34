//! Structural rules of docs/ARCHITECTURE.md that the compiler cannot check,
//! written as ordinary tests over the source text.
//!
//! Invariant 1 of the map: Only `store/` opens SQLite, and only its thread
//! holds the connection. Guarded by:
//! `tests/architecture.rs::only_the_store_module_touches_sqlite` (every file
//! outside `store/`, unit tests included, names neither `rusqlite` nor
//! `libsqlite3`) and `the_store_hands_out_no_sqlite_type` (no public item of
//! `store/` — signature, public field, enum variant, re-export — names an
//! SQLite type); the connection lives in an `Rc` inside `engine::Engine`, made
//! on the store thread, and `engine::ENGINE_STAYS_ON_ITS_THREAD` fails the
//! build if `Engine` ever becomes `Send`.
//!
//! Invariant 10 of the map: Every JSON-RPC error taskgate sends comes from the
//! registry in `wire.rs`; its body is written in one place
//! (`WireCode::error_response`; rmcp writes the ones it sends from
//! `mcp::convert`'s `ErrorData`) and its HTTP answer chosen by one mapping
//! (`http::respond`). Guarded by:
//! `tests/architecture.rs::wire_errors_come_from_the_registry` (no code written
//! as a number outside `wire.rs`, no protocol error built outside
//! `mcp/convert.rs`, no error body written outside `wire.rs`), `wire::tests`,
//! `http::respond::tests`; scripts read the codes from `taskgate wire-codes`
//! (`tests/exit_codes.rs::wire_codes_lists_the_registry`)
//!
//! What this file proves: the layers, the import allow-list, where rmcp and
//! SQLite may appear, wire codes only from the registry, the packaged conffile;
//! every test and test file this map names exists (a file of tests/, a test in
//! one, the invariants' guards, this table against the directory)

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, from the edge inwards. A module may use modules of deeper
/// layers, and of its own layer only where [`SAME_LAYER`] says so.
const LAYERS: &[&[&str]] = &[
    &["main", "cli"],
    &[
        "service", "startup", "bench", "client", "logging", "admin", "verify",
    ],
    &["http", "mcp"],
    &["ops", "backup"],
    &["tasks", "parts", "upstream", "route"],
    &[
        "tools",
        "store",
        "artifacts",
        "state_dir",
        "testhooks",
        "auth",
        "approvals",
    ],
    &[
        "config",
        "wire",
        "exit",
        "events",
        "metrics",
        "ids",
        "process_limits",
    ],
];

/// Arrows inside one layer, each for a reason.
const SAME_LAYER: &[(&str, &str)] = &[
    // The operator commands share the CLI's argument types.
    ("main", "cli"),
    // `serve` and `check` share the startup steps.
    ("service", "startup"),
    // The serving process hosts the admin socket.
    ("service", "admin"),
    // The serving process applies the configured log filter, at start and
    // on reload.
    ("service", "logging"),
    // The benchmark drives a daemon with the operator client.
    ("bench", "client"),
    // The qualification starts the daemon as `serve` does, calls it as a
    // client over HTTP, and reads its provider's counts over the admin
    // socket.
    ("verify", "service"),
    ("verify", "client"),
    ("verify", "admin"),
    // The HTTP application hosts the MCP handler.
    ("http", "mcp"),
    // An online snapshot has the offline backup's format and checks.
    ("ops", "backup"),
    // The task service hands durable routes (their meta-tools and `tgr-`
    // task IDs) to the router.
    ("tasks", "route"),
    // A route is sent, polled and cancelled on an upstream's session.
    ("route", "upstream"),
    // The store reaches its fault hooks (tests only; no-ops in release).
    ("store", "testhooks"),
    // So does the approval journal (an injected sync fault).
    ("approvals", "testhooks"),
    // Artifacts live in the state directory and are keyed by task ID.
    ("artifacts", "state_dir"),
    ("artifacts", "store"),
    ("artifacts", "testhooks"),
    // Error types carry their wire code; exit classes are one enum.
    ("config", "exit"),
    // The loader reads, checks and documents the per-tool process limits
    // through their one definition, which the tools own.
    ("config", "process_limits"),
];

/// Which modules each module may name (`crate::x` in the library,
/// `taskgate::x` in the binary). Each entry must point down a layer or be
/// listed in [`SAME_LAYER`]; a new arrow means a deliberate edit here and
/// in docs/ARCHITECTURE.md.
const ALLOWED: &[(&str, &[&str])] = &[
    (
        "main",
        &[
            "admin",
            "approvals",
            "auth",
            "backup",
            "bench",
            "cli",
            "client",
            "config",
            "exit",
            "logging",
            "service",
            "startup",
            "tools",
            "upstream",
            "verify",
            "wire",
        ],
    ),
    // The qualification worker's lies are a value of its flag.
    ("cli", &["config", "verify"]),
    (
        "service",
        &[
            "admin", "auth", "config", "events", "exit", "http", "logging", "mcp", "ops", "route",
            "startup", "store", "tasks", "tools", "upstream",
        ],
    ),
    (
        "admin",
        &[
            "approvals",
            "config",
            "exit",
            "ops",
            "parts",
            "state_dir",
            "store",
            "tasks",
            "tools",
            "upstream",
        ],
    ),
    (
        "startup",
        &[
            "artifacts",
            "auth",
            "config",
            "exit",
            "http",
            "parts",
            "state_dir",
            "store",
            "tools",
            "upstream",
        ],
    ),
    ("backup", &["config", "exit", "parts", "state_dir", "store"]),
    (
        "bench",
        &[
            "auth", "client", "config", "exit", "route", "store", "tools", "wire",
        ],
    ),
    // The client's unit test checks its default URL against the daemon's
    // default listen address.
    ("client", &["config", "exit", "wire"]),
    ("logging", &["config", "events"]),
    // The qualification worker's refusals carry their exit class (and its
    // lies are test hooks); the durable-tasks qualification starts the
    // daemon (service) on upstream connections it keeps, with tokens it
    // makes (auth), and calls it over HTTP (client) with the route's
    // meta-tools, expecting their wire codes; the provider's counts come
    // over the admin socket its state directory records.
    (
        "verify",
        &[
            "admin",
            "auth",
            "client",
            "config",
            "exit",
            "route",
            "service",
            "state_dir",
            "store",
            "testhooks",
            "upstream",
            "wire",
        ],
    ),
    (
        "http",
        &[
            "auth", "config", "exit", "mcp", "metrics", "ops", "tasks", "wire",
        ],
    ),
    // What operators and administrators do: the task service, the store's
    // reads, the upstreams, the durable parts and the backup format; every
    // refusal with its wire code and exit class.
    (
        "ops",
        &[
            "backup",
            "config",
            "exit",
            "parts",
            "state_dir",
            "store",
            "tasks",
            "tools",
            "upstream",
            "wire",
        ],
    ),
    (
        "mcp",
        &[
            "auth", "config", "metrics", "store", "tasks", "tools", "upstream", "wire",
        ],
    ),
    (
        "tasks",
        &[
            "approvals",
            "artifacts",
            "auth",
            "config",
            "events",
            "metrics",
            "route",
            "store",
            "testhooks",
            "tools",
            "wire",
        ],
    ),
    // Durable routes: their records in the store, the upstreams' sessions,
    // the caller's scopes.
    (
        "route",
        &[
            "auth",
            "config",
            "ids",
            "store",
            "testhooks",
            "tools",
            "upstream",
            "wire",
        ],
    ),
    (
        "parts",
        &[
            "approvals",
            "artifacts",
            "config",
            "exit",
            "state_dir",
            "store",
        ],
    ),
    // Upstream MCP servers are a source of tools the registry asks; the
    // registry knows nothing of them.
    (
        "upstream",
        &["auth", "config", "exit", "metrics", "tools", "wire"],
    ),
    ("tools", &["config", "exit", "process_limits", "wire"]),
    ("auth", &["config", "exit"]),
    (
        "store",
        &[
            "config",
            "events",
            "exit",
            "ids",
            "metrics",
            "testhooks",
            "wire",
        ],
    ),
    (
        "artifacts",
        &["exit", "ids", "state_dir", "store", "testhooks"],
    ),
    ("state_dir", &["exit"]),
    ("testhooks", &[]),
    // The approval journal is a file format of its own; its events are
    // counted.
    ("approvals", &["ids", "metrics", "testhooks"]),
    ("config", &["exit", "process_limits"]),
    ("wire", &[]),
    ("exit", &[]),
    ("events", &[]),
    ("metrics", &[]),
    ("ids", &[]),
    ("process_limits", &[]),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let p = entry
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// Every source file with its whole text, unit tests included: a test
/// module follows the same import rules (it may reach only what its
/// module may), and is exempt only from the rules that say so.
fn sources() -> Vec<(PathBuf, String)> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    assert!(files.len() > 20, "found only {} source files", files.len());
    files.sort();
    files
        .into_iter()
        .map(|f| {
            let text =
                std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            (f, text)
        })
        .collect()
}

/// Where a file's unit tests begin (`#[cfg(test)] mod tests`), if it has
/// them.
fn tests_start(text: &str) -> Option<usize> {
    text.find("#[cfg(test)]\nmod tests")
}

/// The module path of a file: `src/http/auth.rs` → `["http", "auth"]`,
/// `src/http/mod.rs` → `["http"]`, `src/lib.rs` → `[]`.
fn module_path(file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src()).unwrap_or(file);
    let mut path: Vec<String> = rel
        .components()
        .map(|c| {
            c.as_os_str()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_string()
        })
        .collect();
    if path.last().is_some_and(|l| l == "mod" || l == "lib") {
        path.pop();
    }
    path
}

/// Every top-level module a file names, however it names it: `crate::x`
/// (`taskgate::x` in the binary), an alias of the crate (`use crate as c`
/// then `c::x`), and `super::` chains that climb to the crate root
/// (`super::super::x` from `src/http/auth.rs`). Inside the unit tests at a
/// file's end, `super` is the file's own module.
fn modules_named(file: &Path, text: &str) -> BTreeSet<String> {
    let root = if module_of(file) == "main" {
        "taskgate"
    } else {
        "crate"
    };
    named_from_root(text, root, module_path(file).len())
}

/// What `modules_named` finds, for a file `depth` modules below its
/// crate's root whose root is written `root` (`crate`, or `taskgate` in the
/// binary).
fn named_from_root(text: &str, root: &str, depth: usize) -> BTreeSet<String> {
    let mut prefixes = vec![format!("{root}::")];
    for alias in crate_aliases(text, root) {
        prefixes.push(format!("{alias}::"));
    }
    let mut found = BTreeSet::new();
    for prefix in &prefixes {
        found.extend(imports(text, prefix));
    }
    let inline = inline_modules(text);
    for (at, _) in text.match_indices("super::") {
        let before = text[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let d = depth + inline.iter().filter(|(a, b)| *a < at && at < *b).count();
        found.extend(climbed_to_the_root(&text[at..], d));
    }
    found
}

/// The spans of the inline modules of a file (`mod tests { … }`, `pub mod
/// bounds { … }`), from the `mod` keyword to the closing brace; braces in
/// character literals are skipped.
fn inline_modules(text: &str) -> Vec<(usize, usize)> {
    let bytes = text.as_bytes();
    let mut spans = Vec::new();
    for (at, _) in text.match_indices("mod ") {
        let before = text[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &text[at + 4..];
        let name = leading_name(rest);
        if name.is_empty() || !rest[name.len()..].trim_start().starts_with('{') {
            continue;
        }
        let open = at + 4 + name.len() + rest[name.len()..].find('{').unwrap_or(0);
        let mut depth = 0usize;
        let mut end = text.len();
        let mut i = open;
        while i < bytes.len() {
            let quoted = i > 0 && bytes[i - 1] == b'\'' && bytes.get(i + 1) == Some(&b'\'');
            match bytes[i] {
                b'{' if !quoted => depth += 1,
                b'}' if !quoted => {
                    depth -= 1;
                    if depth == 0 {
                        end = i;
                        break;
                    }
                }
                _ => {}
            }
            i += 1;
        }
        spans.push((at, end));
    }
    spans
}

/// Names given to the crate root: `use crate as c;`, `use crate::{self as
/// c}`, `extern crate self as c;` (with `taskgate` for `crate` in the
/// binary).
fn crate_aliases(text: &str, root: &str) -> Vec<String> {
    let mut out = Vec::new();
    for pattern in [
        format!("{root} as "),
        format!("{root}::{{self as "),
        "extern crate self as ".to_string(),
    ] {
        for (at, _) in text.match_indices(pattern.as_str()) {
            let before = text[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let name = leading_name(&text[at + pattern.len()..]);
            if !name.is_empty() {
                out.push(name);
            }
        }
    }
    out
}

/// The top-level modules named by the `super::` chain `path` starts with,
/// written in a module `depth` levels deep: none when the chain stays
/// inside the file's top-level module.
fn climbed_to_the_root(path: &str, depth: usize) -> BTreeSet<String> {
    let mut rest = path;
    let mut climbed = 0;
    while let Some(r) = rest.strip_prefix("super::") {
        climbed += 1;
        rest = r;
    }
    if climbed < depth {
        return BTreeSet::new();
    }
    // Only the chain's own path: `imports` reads to the end of it.
    let end = rest.find([';', '\n']).unwrap_or(rest.len());
    imports(&format!("crate::{}", &rest[..end]), "crate::")
}

/// `src/…` as a path relative to the crate, for messages.
fn shown(file: &Path) -> String {
    let rel = file.strip_prefix(src()).unwrap_or(file);
    format!("src/{}", rel.display())
}

/// The top-level module a file belongs to: `src/store/engine.rs` → `store`.
fn module_of(file: &Path) -> String {
    let rel = file.strip_prefix(src()).unwrap_or(file);
    let first = rel
        .components()
        .next()
        .map(|c| c.as_os_str().to_string_lossy().to_string())
        .unwrap_or_default();
    first.trim_end_matches(".rs").to_string()
}

/// The modules a file names through `crate::x` (or `taskgate::x` in the
/// binary), whether in a `use` or inline, in code or in doc links.
fn imports(text: &str, prefix: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (at, _) in text.match_indices(prefix) {
        let before = text[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &text[at + prefix.len()..];
        match rest.strip_prefix('{') {
            // `crate::{a, b::c, d::{e, f}}`: the first name of each member.
            Some(group) => {
                for member in top_level_members(group) {
                    let name = leading_name(member.trim_start());
                    if !name.is_empty() && name != "self" {
                        found.insert(name);
                    }
                }
            }
            None => {
                let name = leading_name(rest);
                if !name.is_empty() {
                    found.insert(name);
                }
            }
        }
    }
    found
}

/// A path's first segment: `store::Digest` → `store`.
fn leading_name(path: &str) -> String {
    path.chars()
        .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
        .collect()
}

/// The members of a `{…}` group (the text after its opening brace), split
/// at its own commas, up to its closing brace.
fn top_level_members(group: &str) -> Vec<&str> {
    let mut members = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                members.push(&group[start..i]);
                return members;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                members.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    members.push(&group[start..]);
    members
}

#[test]
fn the_import_scan_sees_paths_and_groups() {
    let text = "use crate::store::Digest;\nuse crate::{tasks, tools::{Runner, ToolSpec}, wire};\nlet x = crate::config::bounds::X;\n// [`crate::http`]\nmy_crate::mcp";
    let found: Vec<String> = imports(text, "crate::").into_iter().collect();
    assert_eq!(found, ["config", "http", "store", "tasks", "tools", "wire"]);
}

fn layer_of(module: &str) -> usize {
    LAYERS
        .iter()
        .position(|l| l.contains(&module))
        .unwrap_or_else(|| {
            panic!("module {module} is in no layer; add it to LAYERS and to docs/ARCHITECTURE.md")
        })
}

/// The allow-list itself points only down the layers.
#[test]
fn allowed_arrows_point_down_the_layers() {
    let mut listed = BTreeSet::new();
    for (from, tos) in ALLOWED {
        assert!(listed.insert(*from), "{from} is listed twice in ALLOWED");
        for to in *tos {
            let (lf, lt) = (layer_of(from), layer_of(to));
            assert!(
                lt > lf || (lt == lf && SAME_LAYER.contains(&(*from, *to))),
                "ALLOWED lets {from} (layer {lf}) use {to} (layer {lt}): an arrow back up the layers"
            );
        }
    }
    for layer in LAYERS {
        for m in *layer {
            assert!(listed.contains(m), "{m} has no entry in ALLOWED");
        }
    }
}

/// Every module imports only what its entry allows, and every entry is
/// used: an arrow no import needs is removed from the list (and from the
/// map), so the list stays the truth about the code.
#[test]
fn modules_import_only_what_their_layer_allows() {
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut violations = Vec::new();
    let mut used_by: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (file, text) in sources() {
        let module = module_of(&file);
        if module == "lib" {
            continue;
        }
        let Some(ok) = allowed.get(module.as_str()) else {
            violations.push(format!(
                "{}: module {module} has no entry in ALLOWED",
                shown(&file)
            ));
            continue;
        };
        for used in modules_named(&file, &text) {
            if used != module && !ok.contains(&used.as_str()) {
                violations.push(format!(
                    "{}: {module} uses {used}, which its layer may not (see docs/ARCHITECTURE.md, Layers)",
                    shown(&file)
                ));
            }
            used_by.entry(module.clone()).or_default().insert(used);
        }
    }
    for (module, tos) in ALLOWED {
        for to in *tos {
            if !used_by.get(*module).is_some_and(|u| u.contains(*to)) {
                violations.push(format!(
                    "ALLOWED lets {module} use {to}, but nothing in {module} does: remove the entry (here and in docs/ARCHITECTURE.md)"
                ));
            }
        }
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

#[test]
fn the_import_scan_resolves_super_chains_and_crate_aliases() {
    let file = src().join("http/auth.rs");
    let text = "use super::super::tasks::Call;\nuse super::origin;\nuse crate as c;\nfn f() { c::store::x(); }\nuse super::super::{wire, config::Config};\n#[cfg(test)]\nmod tests {\n    use super::super::super::events;\n    use super::super::mcp;\n}\n";
    let found: Vec<String> = modules_named(&file, text).into_iter().collect();
    assert_eq!(found, ["config", "events", "store", "tasks", "wire"]);
    // An inline module is one level deeper: `super` there is the file.
    let config = src().join("config/mod.rs");
    let text = "pub mod bounds {\n    use super::keys::*;\n    const C: char = '{';\n}\nuse super::tasks;\n";
    let found: Vec<String> = modules_named(&config, text).into_iter().collect();
    assert_eq!(found, ["tasks"]);
    let main = src().join("main.rs");
    let found: Vec<String> = modules_named(&main, "use taskgate as t;\nt::bench::run();")
        .into_iter()
        .collect();
    assert_eq!(found, ["bench"]);
}

/// The layer table here is the one in docs/ARCHITECTURE.md: the same
/// modules in the same layers, the same arrows inside a layer.
#[test]
fn the_layer_table_matches_the_architecture_document() {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/ARCHITECTURE.md"))
            .unwrap();
    let start = doc
        .find("| layer | modules |")
        .expect("the Layers table in docs/ARCHITECTURE.md");
    let rows: Vec<&str> = doc[start..]
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .collect();
    let ticked = |cell: &str| -> Vec<String> {
        cell.split('`')
            .skip(1)
            .step_by(2)
            .map(|m| m.trim_end_matches('/').to_string())
            .collect()
    };
    let mut layers = Vec::new();
    let mut arrows = BTreeSet::new();
    for row in &rows {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        // "", "0 edge", "`main`, `cli`", "main → cli; …", ""
        layers.push(ticked(cells[2]));
        // "a → b (why), a → c (why); d → e, f": reasons in parentheses
        // name no module; a name without an arrow continues the last one.
        let mut plain = String::new();
        let mut depth = 0;
        for c in cells[3].chars() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ if depth == 0 => plain.push(c),
                _ => {}
            }
        }
        for group in plain.split(';') {
            let mut from = String::new();
            for piece in group.split(',') {
                let to = match piece.split_once('→') {
                    Some((f, t)) => {
                        from = f.trim().to_string();
                        t
                    }
                    None => piece,
                };
                let to = to.trim();
                if !to.is_empty() && to != "—" {
                    arrows.insert((from.clone(), to.to_string()));
                }
            }
        }
    }
    let expected: Vec<Vec<String>> = LAYERS
        .iter()
        .map(|l| l.iter().map(|m| m.to_string()).collect())
        .collect();
    assert_eq!(
        layers, expected,
        "the layers in docs/ARCHITECTURE.md differ from LAYERS"
    );
    let expected: BTreeSet<(String, String)> = SAME_LAYER
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(
        arrows, expected,
        "the arrows inside layers in docs/ARCHITECTURE.md differ from SAME_LAYER"
    );
}

/// Every module under src/ is in the layer table (and so in the map).
#[test]
fn every_module_has_a_layer() {
    for (file, _) in sources() {
        let module = module_of(&file);
        if module != "lib" {
            layer_of(&module);
        }
    }
}

/// The protocol library's types stop at the protocol layer.
#[test]
fn protocol_types_stay_in_the_protocol_layer() {
    // `logging` names rmcp's log targets (strings in its filter), no type;
    // `upstream` is rmcp's client side, talking to upstream MCP servers.
    let may = ["mcp", "http", "service", "logging", "upstream"];
    for (file, text) in sources() {
        let module = module_of(&file);
        if may.contains(&module.as_str()) {
            continue;
        }
        for way in [
            "rmcp::",
            "use rmcp",
            "rmcp as ",
            "extern crate rmcp",
            "rmcp::{",
        ] {
            assert!(
                !text.contains(way),
                "{} names rmcp ({way:?}); only {may:?} may",
                shown(&file)
            );
        }
    }
}

/// Invariant 1: only `store/` opens SQLite.
#[test]
fn only_the_store_module_touches_sqlite() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    for file in files {
        if module_of(&file) == "store" {
            continue;
        }
        // The whole file, its unit tests included: a test module reaching
        // for SQLite is as much a second way in as product code.
        let text = std::fs::read_to_string(&file).unwrap();
        for name in ["rusqlite", "libsqlite3"] {
            assert!(
                !text.contains(name),
                "{} names {name}; only src/store/ may",
                shown(&file)
            );
        }
    }
}

/// What `src/store/` makes public, item by item: each `pub` declaration
/// (not `pub(crate)` or `pub(super)`), from its keyword to the end of its
/// signature (a struct's public fields are items of their own), or of its
/// body for an enum (its variants are as public as it is).
fn public_items(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("pub ") {
        let before = rest[..at].chars().last();
        let item = &rest[at..];
        rest = &rest[at + 4..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let body_is_public = item.starts_with("pub enum ");
        let mut depth = 0usize;
        let mut end = item.len();
        let mut previous = ' ';
        for (i, c) in item.char_indices() {
            let arrow = previous == '-';
            previous = c;
            match c {
                '>' if arrow => {}
                '(' | '<' | '[' => depth += 1,
                ')' | '>' | ']' => depth = depth.saturating_sub(1),
                '{' if !body_is_public && depth == 0 => {
                    end = i;
                    break;
                }
                '{' => depth += 1,
                '}' if body_is_public && depth == 1 => {
                    end = i + 1;
                    break;
                }
                '}' => depth = depth.saturating_sub(1),
                ';' if depth == 0 => {
                    end = i;
                    break;
                }
                ',' if depth == 0 && !body_is_public => {
                    // A public field of a struct: `pub name: Type,`.
                    end = i;
                    break;
                }
                _ => {}
            }
        }
        out.push(item[..end].to_string());
    }
    out
}

/// Invariant 1, structurally: nothing `store` makes public names an SQLite
/// type (a connection, a statement, a transaction, an error of rusqlite),
/// so no other module can be handed the connection, whatever it imports.
/// The connection itself is held in an `Rc` by the store thread's
/// `Engine`, which is therefore not `Send` (asserted in the store engine's
/// `thread.rs`).
#[test]
fn the_store_hands_out_no_sqlite_type() {
    let mut files = Vec::new();
    rust_files(&src().join("store"), &mut files);
    let mut seen = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let code = match text.find("#[cfg(test)]\nmod tests") {
            Some(at) => &text[..at],
            None => &text,
        };
        for item in public_items(code) {
            seen += 1;
            for sqlite in [
                "rusqlite",
                "Connection",
                "Transaction",
                "Statement",
                "Savepoint",
            ] {
                assert!(
                    !item.contains(sqlite),
                    "{} makes public an item naming {sqlite}:\n{item}",
                    shown(file)
                );
            }
        }
    }
    assert!(seen > 50, "read only {seen} public items of src/store/");
}

#[test]
fn the_public_item_scan_sees_signatures_fields_and_variants() {
    let text = "pub fn open(c: Connection, f: impl Fn(u8) -> Vec<u8>) -> Result<(), E> {\n body }\n\
                pub(crate) fn hidden(c: Connection) {}\n\
                pub struct S { pub conn: Rc<Connection>, other: u8 }\n\
                pub enum E { Sql(rusqlite::Error), Other }\n\
                pub use rusqlite::Connection as Handle;\n";
    let items = public_items(text);
    assert_eq!(items.len(), 5, "{items:#?}");
    assert_eq!(
        items[0],
        "pub fn open(c: Connection, f: impl Fn(u8) -> Vec<u8>) -> Result<(), E> "
    );
    assert_eq!(items[1], "pub struct S ");
    assert_eq!(items[2], "pub conn: Rc<Connection>");
    assert_eq!(items[3], "pub enum E { Sql(rusqlite::Error), Other }");
    assert_eq!(items[4], "pub use rusqlite::Connection as Handle");
}

/// Every JSON-RPC error taskgate produces comes from the registry in
/// `wire.rs`: no module writes a code as a number, and only
/// `mcp/convert.rs` builds the protocol library's error values.
#[test]
fn wire_errors_come_from_the_registry() {
    let mut violations = Vec::new();
    for (file, text) in sources() {
        let rel = file.strip_prefix(src()).unwrap_or(&file).to_path_buf();
        let is_wire = rel == Path::new("wire.rs");
        let is_convert = rel == Path::new("mcp/convert.rs");
        // Exempt from the number rule: unit tests, which assert the very
        // numbers the JSON-RPC specification fixes, so the registry is
        // checked against the specification rather than against itself.
        let tests_from = text[..tests_start(&text).unwrap_or(text.len())]
            .lines()
            .count();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if !is_wire && n < tests_from && json_rpc_code_literal(code) {
                violations.push(format!(
                    "{}:{}: a JSON-RPC error code written as a number; use a wire::… entry: {line}",
                    rel.display(),
                    n + 1
                ));
            }
            if !is_wire
                && n < tests_from
                && (code.contains("\"error\": {") || code.contains("\"error\":{"))
            {
                violations.push(format!(
                    "{}:{}: writes a JSON-RPC error body; use WireCode::error_response (or Refused::to_json): {line}",
                    rel.display(),
                    n + 1
                ));
            }
            if !is_convert && (code.contains("ErrorData::") || code.contains("ErrorCode(")) {
                violations.push(format!(
                    "{}:{}: builds a protocol error outside mcp/convert.rs; return a TaskError or use convert::from_code: {line}",
                    rel.display(),
                    n + 1
                ));
            }
        }
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

/// `-32xxx` as a literal: JSON-RPC's reserved and server error range.
fn json_rpc_code_literal(code: &str) -> bool {
    let bytes = code.as_bytes();
    code.match_indices("-32").any(|(at, _)| {
        let digits = &bytes[at + 1..];
        let n = digits.iter().take_while(|b| b.is_ascii_digit()).count();
        let before_ok = at == 0 || !bytes[at - 1].is_ascii_alphanumeric();
        before_ok && n == 5
    })
}

#[test]
fn the_code_literal_check_sees_codes_and_nothing_else() {
    assert!(json_rpc_code_literal("let c = -32045;"));
    assert!(json_rpc_code_literal("(-32602, \"x\")"));
    assert!(!json_rpc_code_literal("let x = -320;"));
    assert!(!json_rpc_code_literal("let x = -320456;"));
    assert!(!json_rpc_code_literal("let x = a-32045;"));
}

/// The configuration file the package installs is the starter file that
/// `taskgate init` writes: one source for the documented defaults.
#[test]
fn packaged_configuration_is_the_starter_file() {
    let shipped = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/taskgate.toml"),
    )
    .unwrap_or_else(|e| panic!("packaging/taskgate.toml: {e}"));
    assert_eq!(
        shipped,
        taskgate::config::starter_config(Some(taskgate::config::PACKAGE_STATE_DIR)),
        "regenerate with: taskgate init --state-dir /var/lib/taskgate > packaging/taskgate.toml"
    );
}

/// The names of a backquoted reference, with `{a,b}` alternatives
/// expanded: `{http,stdio}_x` is `http_x` and `stdio_x`; a whole `{a, b}`
/// is `a` and `b`.
fn expand_names(text: &str) -> Vec<String> {
    let Some(open) = text.find('{') else {
        return vec![text.trim().to_string()];
    };
    let Some(close) = text[open..].find('}').map(|c| open + c) else {
        return vec![text.trim().to_string()];
    };
    let (head, tail) = (&text[..open], &text[close + 1..]);
    text[open + 1..close]
        .split(',')
        .flat_map(|alt| expand_names(&format!("{head}{}{tail}", alt.trim())))
        .collect()
}

/// Whether `name` is defined (a function, a constant or a static) in the
/// Rust source `text`.
fn defines(text: &str, name: &str) -> bool {
    ["fn ", "const ", "static "].iter().any(|kw| {
        text.match_indices(&format!("{kw}{name}")).any(|(at, m)| {
            text[at + m.len()..]
                .chars()
                .next()
                .is_some_and(|c| !(c.is_alphanumeric() || c == '_'))
        })
    })
}

/// Every test docs/ARCHITECTURE.md names exists, so the map's claims point
/// at real guards: `tests/FILE.rs` is a file, `tests/FILE.rs::name` (and
/// each of `::{a, b}` and `{http,stdio}_name`) a function in it; a bare
/// test name in the invariants' "guarded by" column is a function of some
/// test file or unit test module; `module::ITEM` there is defined in that
/// module. The tests table lists every test file, and only those.
#[test]
fn every_test_and_file_the_architecture_doc_names_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/ARCHITECTURE.md")).unwrap();
    let mut sources = Vec::new();
    rust_files(&src(), &mut sources);
    rust_files(&root.join("tests"), &mut sources);
    // The workspace's crates: a guard may live in the crate that holds
    // the rule.
    rust_files(&root.join("crates"), &mut sources);
    let all_source: String = sources
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .collect();
    let mut problems = Vec::new();
    let mut checked = 0;
    let section = |title: &str| -> String {
        let start = doc.find(title).unwrap_or_else(|| panic!("no {title}"));
        let rest = &doc[start + title.len()..];
        rest[..rest.find("\n## ").unwrap_or(rest.len())].to_string()
    };
    let spans = |text: &str| -> Vec<String> {
        text.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    };
    for span in spans(&doc) {
        let Some(rest) = span.strip_prefix("tests/") else {
            continue;
        };
        let (file, names) = match rest.split_once("::") {
            Some((f, n)) => (f, Some(n)),
            None => (rest, None),
        };
        if !file.ends_with(".rs") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(root.join("tests").join(file)) else {
            problems.push(format!("`{span}`: no file tests/{file}"));
            continue;
        };
        checked += 1;
        for name in names.map(expand_names).unwrap_or_default() {
            checked += 1;
            if !defines(&text, &name) {
                problems.push(format!("`{span}`: tests/{file} has no fn {name}"));
            }
        }
    }
    // The invariants' guards named without their file.
    for line in section("## Invariants")
        .lines()
        .filter(|l| l.starts_with("| "))
    {
        let guarded = line.rsplit(" | ").next().unwrap_or_default();
        for span in spans(guarded) {
            if span.starts_with("tests/") || span.contains(' ') || span.contains('.') {
                continue;
            }
            let path: Vec<&str> = span.split("::").collect();
            let item = *path.last().unwrap_or(&"");
            let test_like = item.matches('_').count() >= 3
                || item.chars().all(|c| c.is_ascii_uppercase() || c == '_');
            if !test_like || item.contains(['{', '(']) {
                continue;
            }
            for name in expand_names(item) {
                checked += 1;
                if !defines(&all_source, &name) {
                    problems.push(format!(
                        "invariants: `{span}` names {name}, defined nowhere"
                    ));
                }
            }
        }
    }
    // The tests table and the test files.
    let listed: BTreeSet<String> = section("## Tests")
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once("` |"))
        .map(|(f, _)| f.to_string())
        .filter(|f| f.ends_with(".rs"))
        .collect();
    let files: BTreeSet<String> = std::fs::read_dir(root.join("tests"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|f| f.ends_with(".rs"))
        .collect();
    for f in files.difference(&listed) {
        problems.push(format!("tests/{f} is missing from the tests table"));
    }
    for f in listed.difference(&files) {
        problems.push(format!("the tests table lists {f}, which does not exist"));
    }
    assert!(checked >= 60, "only {checked} references checked");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The store engine's crate, which must not know what the store holds.
fn engine_crate() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/store-engine")
}

/// Where `word` occurs in `text` as a word of its own (not inside an
/// identifier: `tasks` in `tasks.db` or `crate::store::tasks`, not in
/// `subtasks` or `tasks_owner`).
fn word_at(text: &str, word: &str) -> Option<usize> {
    let ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
    text.match_indices(word).map(|(at, _)| at).find(|&at| {
        !ident(text[..at].chars().last()) && !ident(text[at + word.len()..].chars().next())
    })
}

#[test]
fn the_word_scan_sees_words_not_parts_of_names() {
    assert_eq!(word_at("use crate::store::tasks;", "tasks"), Some(18));
    assert_eq!(word_at("tasks.db", "tasks"), Some(0));
    assert_eq!(word_at("let subtasks = tasks_owner;", "tasks"), None);
    assert_eq!(word_at("Vec<TaskId>", "TaskId"), Some(4));
    assert_eq!(word_at("TaskIds", "TaskId"), None);
}

/// The engine knows no schema, twice over: the compiler holds it (its
/// crate depends on no taskgate crate, so it cannot name a kind; the kinds
/// are a registry it is generic over), and so does this scan, which reads
/// every file of the crate for the kinds' names. Only `store/` reaches it.
#[test]
fn the_store_engine_knows_no_kind_of_record() {
    let manifest = std::fs::read_to_string(engine_crate().join("Cargo.toml")).unwrap();
    let dependencies = manifest
        .split("\n[")
        .filter(|section| section.contains("dependencies]"))
        .collect::<Vec<_>>()
        .join("\n");
    for line in dependencies.lines().skip(1) {
        let name = line.split(['=', ' ', '.']).next().unwrap_or("");
        assert!(
            !name.starts_with("taskgate") && !line.contains("path ="),
            "crates/store-engine/Cargo.toml depends on a crate of this workspace: {line}"
        );
    }
    let mut files = Vec::new();
    rust_files(&engine_crate().join("src"), &mut files);
    assert!(
        files.len() >= 5,
        "read only {} files of the engine",
        files.len()
    );
    files.push(engine_crate().join("Cargo.toml"));
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for word in ["tasks", "routes", "leases", "TaskId"] {
            if let Some(at) = word_at(&text, word) {
                let line = text[..at].lines().count().max(1);
                panic!(
                    "{}:{line} names {word}: the store engine must not know the kinds of record",
                    file.display()
                );
            }
        }
    }
    for (file, text) in sources() {
        if module_of(&file) != "store" {
            assert!(
                !text.contains("taskgate_store_engine"),
                "{} names the store engine; only src/store/ may",
                shown(&file)
            );
        }
    }
}

/// What a file of `src/store/` reaches through `super::` (outside its unit
/// tests): the sibling file a path starts with, or `mod` for anything
/// `store/mod.rs` itself holds or re-exports.
fn store_imports(text: &str, siblings: &BTreeSet<String>) -> BTreeSet<String> {
    let code = &text[..tests_start(text).unwrap_or(text.len())];
    let first = |path: &str| -> String {
        let name: String = path
            .trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if siblings.contains(&name) {
            name
        } else {
            "mod".to_string()
        }
    };
    let mut found = BTreeSet::new();
    for (at, _) in code.match_indices("super::") {
        let rest = &code[at + "super::".len()..];
        match rest.strip_prefix('{') {
            Some(group) => found.extend(top_level_members(group).into_iter().map(first)),
            None => {
                found.insert(first(rest));
            }
        }
    }
    found
}

/// No two files of `src/store/` import each other, directly or round a
/// circle: `mod.rs` only declares and re-exports (it reaches every file),
/// and every other file imports from the file that defines what it needs.
#[test]
fn the_store_s_files_import_each_other_in_no_circle() {
    let dir = src().join("store");
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    let stem = |f: &Path| f.file_stem().unwrap().to_string_lossy().into_owned();
    let siblings: BTreeSet<String> = files.iter().map(|f| stem(f)).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let name = stem(file);
        let reached = if name == "mod" {
            siblings.iter().filter(|s| *s != "mod").cloned().collect()
        } else {
            store_imports(&std::fs::read_to_string(file).unwrap(), &siblings)
        };
        edges.insert(name, reached);
    }
    // Depth first from every file; a file met again on the current path
    // closes a circle.
    fn visit(
        at: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) {
        if let Some(from) = path.iter().position(|p| p == at) {
            panic!(
                "src/store/ imports round a circle: {} -> {at}",
                path[from..].join(" -> ")
            );
        }
        if done.contains(at) {
            return;
        }
        path.push(at.to_string());
        for next in edges.get(at).into_iter().flatten() {
            visit(next, edges, path, done);
        }
        path.pop();
        done.insert(at.to_string());
    }
    let mut done = BTreeSet::new();
    for file in edges.keys() {
        visit(file, &edges, &mut Vec::new(), &mut done);
    }
    assert!(
        edges.len() >= 8,
        "read only {} files of src/store/",
        edges.len()
    );
    let siblings_of = |f: &str| store_imports(f, &siblings);
    assert_eq!(
        siblings_of("use super::handle::{Store, X};\nuse super::{digest::Digest, Item};\n"),
        ["digest", "handle", "mod"].map(str::to_string).into()
    );
}

/// Arrows between the crates of `crates/`, each for a reason the map's
/// Crates section gives: none so far. A crate there depends on no taskgate
/// crate unless listed here, and never on the `taskgate` package.
const CRATE_ARROWS: &[(&str, &str)] = &[];

/// Module rules inside a crate of `crates/`: for each crate with modules
/// of its own, which of its modules each may name (`crate::x`). A crate
/// of one file has none to keep apart.
const CRATE_MODULES: &[(&str, ModuleRules)] = &[(
    "store-engine",
    &[
        ("clock", &[]),
        ("migrate", &[]),
        // `rusqlite`: the re-export the `kinds!` macro names its types by.
        ("kind", &["migrate", "rusqlite"]),
        ("open", &["kind", "migrate"]),
        // The handle and the store thread share the queue's types.
        ("handle", &["kind", "open", "thread"]),
        ("thread", &["handle", "kind", "open"]),
        // The engine's own tests: a kind of record of their own.
        ("toy", &["kinds", "open"]),
    ],
)];

/// One crate's allow-list: each module with the modules it may name.
type ModuleRules = &'static [(&'static str, &'static [&'static str])];

/// The directories of `crates/`, by name.
fn member_crates() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates");
    let mut names: Vec<String> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.unwrap_or_else(|e| panic!("{}: {e}", root.display())))
        .filter(|e| e.path().join("Cargo.toml").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn manifest(path: &Path) -> toml::Table {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.parse()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every dependency a manifest declares, in any dependency table (also a
/// target's), by the package it names (`package = …` when renamed).
fn dependencies(manifest: &toml::Table) -> BTreeMap<String, toml::Value> {
    let mut tables: Vec<&toml::Table> = vec![manifest];
    if let Some(targets) = manifest.get("target").and_then(|t| t.as_table()) {
        tables.extend(targets.values().filter_map(|t| t.as_table()));
    }
    let mut out = BTreeMap::new();
    for table in tables {
        for kind in ["dependencies", "dev-dependencies", "build-dependencies"] {
            let Some(deps) = table.get(kind).and_then(|d| d.as_table()) else {
                continue;
            };
            for (name, spec) in deps {
                let package = spec
                    .get("package")
                    .and_then(|p| p.as_str())
                    .unwrap_or(name)
                    .to_string();
                out.insert(package, spec.clone());
            }
        }
    }
    out
}

/// The crate graph the map draws: each crate of `crates/` is package
/// `taskgate-NAME`, unpublished, of the root's edition; it depends on no
/// taskgate crate but the arrows [`CRATE_ARROWS`] allows (so the journal
/// cannot reach tasks, nor the engine a schema); the root package depends
/// on each of them by path; and docs/ARCHITECTURE.md names each crate.
#[test]
fn the_crate_graph_is_the_one_the_map_draws() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/ARCHITECTURE.md")).unwrap();
    let top = manifest(&root.join("Cargo.toml"));
    let root_deps = dependencies(&top);
    let crates = member_crates();
    assert!(!crates.is_empty(), "no crate in crates/");
    let packages: BTreeSet<String> = crates.iter().map(|c| format!("taskgate-{c}")).collect();
    let mut problems = Vec::new();
    for (from, to) in CRATE_ARROWS {
        for p in [from, to] {
            if !packages.contains(*p) {
                problems.push(format!("CRATE_ARROWS names {p}, no crate of crates/"));
            }
        }
    }
    for dir in &crates {
        let path = root.join("crates").join(dir).join("Cargo.toml");
        let m = manifest(&path);
        let package = m.get("package").and_then(|p| p.as_table());
        let field = |key: &str| package.and_then(|p| p.get(key)).cloned();
        let name = format!("taskgate-{dir}");
        if field("name").and_then(|n| n.as_str().map(str::to_owned)) != Some(name.clone()) {
            problems.push(format!("crates/{dir}: its package must be named {name}"));
        }
        if field("publish").and_then(|p| p.as_bool()) != Some(false) {
            problems.push(format!("crates/{dir}: publish = false"));
        }
        if field("edition").and_then(|e| e.as_str().map(str::to_owned)) != Some("2024".into()) {
            problems.push(format!("crates/{dir}: edition 2024, as the root"));
        }
        for dep in dependencies(&m).keys() {
            let ours = dep == "taskgate" || dep.starts_with("taskgate-");
            if ours && !CRATE_ARROWS.contains(&(name.as_str(), dep.as_str())) {
                problems.push(format!(
                    "crates/{dir} depends on {dep}: a crate of crates/ depends on no taskgate crate unless CRATE_ARROWS and the map's Crates section say why"
                ));
            }
        }
        match root_deps.get(&name) {
            Some(spec)
                if spec.get("path").and_then(|p| p.as_str())
                    == Some(format!("crates/{dir}").as_str()) => {}
            _ => problems.push(format!(
                "the root package does not depend on {name} (path = \"crates/{dir}\")"
            )),
        }
        for named in [format!("`{name}`"), format!("`crates/{dir}`")] {
            if !doc.contains(&named) {
                problems.push(format!(
                    "docs/ARCHITECTURE.md does not name {named}: say why the crate exists (Crates)"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The module rules inside each crate of `crates/`: a crate with modules
/// of its own has an entry in [`CRATE_MODULES`], and each of its modules
/// names (`crate::x`, a crate alias, a `super::` chain to the root) only
/// what its entry allows.
#[test]
fn modules_inside_each_crate_import_only_what_their_entry_allows() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates");
    let mut problems = Vec::new();
    for dir in member_crates() {
        let src = root.join(&dir).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        files.sort();
        let module_of = |file: &Path| -> String {
            let rel = file.strip_prefix(&src).unwrap_or(file);
            let first = rel
                .components()
                .next()
                .map(|c| c.as_os_str().to_string_lossy().to_string())
                .unwrap_or_default();
            first.trim_end_matches(".rs").to_string()
        };
        let modules: BTreeSet<String> = files
            .iter()
            .map(|f| module_of(f))
            .filter(|m| m != "lib" && m != "main")
            .collect();
        let entry = CRATE_MODULES.iter().find(|(c, _)| *c == dir);
        let Some((_, allowed)) = entry else {
            if !modules.is_empty() {
                problems.push(format!(
                    "crates/{dir} has modules {modules:?} but no entry in CRATE_MODULES"
                ));
            }
            continue;
        };
        let allowed: BTreeMap<&str, &[&str]> = allowed.iter().copied().collect();
        for file in &files {
            let module = module_of(file);
            if module == "lib" || module == "main" {
                continue;
            }
            let text = std::fs::read_to_string(file).unwrap();
            let Some(ok) = allowed.get(module.as_str()) else {
                problems.push(format!(
                    "crates/{dir}: module {module} has no entry in CRATE_MODULES"
                ));
                continue;
            };
            let depth = file
                .strip_prefix(&src)
                .map(|r| {
                    let n = r.components().count();
                    if r.ends_with("mod.rs") { n - 1 } else { n }
                })
                .unwrap_or(1);
            let named = named_from_root(&text, "crate", depth);
            for used in named {
                if used != module && !ok.contains(&used.as_str()) {
                    problems.push(format!(
                        "crates/{dir}/src: {module} uses {used}, which CRATE_MODULES does not allow"
                    ));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
