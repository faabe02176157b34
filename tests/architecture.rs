//! Structural rules of docs/ARCHITECTURE.md that the compiler cannot check,
//! written as ordinary tests over the source text.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, from the edge inwards. A module may use modules of deeper
/// layers, and of its own layer only where [`SAME_LAYER`] says so.
const LAYERS: &[&[&str]] = &[
    &["main", "cli"],
    &[
        "service", "startup", "backup", "bench", "client", "logging", "admin",
    ],
    &["http", "mcp"],
    &["tasks"],
    &[
        "tools",
        "store",
        "artifacts",
        "state_dir",
        "testhooks",
        "auth",
    ],
    &["config", "wire", "exit", "events"],
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
    // An online snapshot has the offline backup's format and checks.
    ("admin", "backup"),
    // The benchmark drives a daemon with the operator client.
    ("bench", "client"),
    // The HTTP application hosts the MCP handler.
    ("http", "mcp"),
    // The store reaches its fault hooks (tests only; no-ops in release).
    ("store", "testhooks"),
    // Artifacts live in the state directory and are keyed by task ID.
    ("artifacts", "state_dir"),
    ("artifacts", "store"),
    ("artifacts", "testhooks"),
    // Error types carry their wire code; exit classes are one enum.
    ("config", "exit"),
];

/// Which modules each module may name (`crate::x` in the library,
/// `taskgate::x` in the binary). Each entry must point down a layer or be
/// listed in [`SAME_LAYER`]; a new arrow means a deliberate edit here and
/// in docs/ARCHITECTURE.md.
const ALLOWED: &[(&str, &[&str])] = &[
    (
        "main",
        &[
            "admin", "auth", "backup", "bench", "cli", "client", "config", "exit", "logging",
            "service", "startup", "store", "tools",
        ],
    ),
    ("cli", &["client", "config"]),
    (
        "service",
        &[
            "admin", "auth", "config", "events", "exit", "http", "logging", "mcp", "startup",
            "store", "tasks", "tools",
        ],
    ),
    (
        "admin",
        &[
            "backup",
            "config",
            "exit",
            "http",
            "state_dir",
            "tasks",
            "tools",
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
            "state_dir",
            "store",
            "tools",
        ],
    ),
    ("backup", &["config", "exit", "state_dir", "store"]),
    (
        "bench",
        &["client", "config", "exit", "store", "tools", "wire"],
    ),
    ("client", &["exit", "wire"]),
    ("logging", &["config", "events"]),
    ("http", &["auth", "config", "exit", "mcp", "tasks", "wire"]),
    (
        "mcp",
        &["auth", "config", "store", "tasks", "tools", "wire"],
    ),
    (
        "tasks",
        &["artifacts", "auth", "config", "store", "tools", "wire"],
    ),
    ("tools", &["config", "exit", "wire"]),
    ("auth", &["config", "exit"]),
    ("store", &["config", "events", "exit", "testhooks", "wire"]),
    ("artifacts", &["exit", "state_dir", "store", "testhooks"]),
    ("state_dir", &["exit"]),
    ("testhooks", &[]),
    ("config", &["exit"]),
    ("wire", &[]),
    ("exit", &[]),
    ("events", &[]),
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

/// Every source file with its text, the unit tests at its end cut off
/// (a test may reach for anything).
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
            let code = match text.find("#[cfg(test)]\nmod tests") {
                Some(at) => text[..at].to_string(),
                None => text,
            };
            (f, code)
        })
        .collect()
}

/// `src/…` as a path relative to the crate, for messages.
fn shown(file: &Path) -> String {
    let rel = file.strip_prefix(src()).unwrap_or(file);
    format!("src/{}", rel.display())
}

/// The top-level module a file belongs to: `src/store/worker.rs` → `store`.
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

/// Every module imports only what its entry allows.
#[test]
fn modules_import_only_what_their_layer_allows() {
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut violations = Vec::new();
    for (file, text) in sources() {
        let module = module_of(&file);
        if module == "lib" {
            continue;
        }
        let prefix = if module == "main" {
            "taskgate::"
        } else {
            "crate::"
        };
        let Some(ok) = allowed.get(module.as_str()) else {
            violations.push(format!(
                "{}: module {module} has no entry in ALLOWED",
                shown(&file)
            ));
            continue;
        };
        for used in imports(&text, prefix) {
            if used != module && !ok.contains(&used.as_str()) {
                violations.push(format!(
                    "{}: {module} uses {used}, which its layer may not (see docs/ARCHITECTURE.md, Layers)",
                    shown(&file)
                ));
            }
        }
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
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
    // `logging` names rmcp's log targets (strings in its filter), no type.
    let may = ["mcp", "http", "service", "logging"];
    for (file, text) in sources() {
        let module = module_of(&file);
        if may.contains(&module.as_str()) {
            continue;
        }
        assert!(
            !text.contains("rmcp::"),
            "{} names rmcp's types; only {may:?} may",
            shown(&file)
        );
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
/// `Worker`, which is therefore not `Send` (asserted in `store::worker`).
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
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if !is_wire && json_rpc_code_literal(code) {
                violations.push(format!(
                    "{}:{}: a JSON-RPC error code written as a number; use a wire::… entry: {line}",
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
