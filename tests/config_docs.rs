//! Everything an operator reads about a configuration key is rendered from
//! the one table in src/config/keys.rs: the reference in docs/operations.md,
//! the taskgate.toml(5) page, the starter file (and packaged conffile).
//!
//! What this file proves: operations.md's reference table and the man pages are
//! the rendered key table

mod common;

use std::path::Path;

use common::*;
use taskgate::config::keys;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn operations_md_holds_the_rendered_reference() {
    let doc = std::fs::read_to_string(root().join("docs/operations.md")).unwrap();
    let begin = doc
        .find(keys::REFERENCE_BEGIN)
        .expect("docs/operations.md lacks the configuration reference's first marker");
    let end = doc[begin..]
        .find(keys::REFERENCE_END)
        .map(|i| begin + i + keys::REFERENCE_END.len() + 1)
        .expect("docs/operations.md lacks the configuration reference's end marker");
    assert_eq!(
        &doc[begin..end.min(doc.len())],
        keys::reference_markdown(),
        "regenerate the table: cargo run -- man --reference, and paste it over the old one"
    );
    // The binary prints the same table (how it is regenerated).
    let out = taskgate(&["man", "--reference"], &[]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        keys::reference_markdown()
    );
    for key in keys::KEYS {
        assert!(
            keys::reference_markdown().contains(&format!("| `{}` |", key.dotted())),
            "{}",
            key.dotted()
        );
    }
}

#[test]
fn man_pages_render_including_the_configuration_page() {
    let dir = private_dir();
    let out = taskgate(&["man", "--out", dir.path().to_str().unwrap()], &[]);
    assert!(out.status.success(), "{out:?}");
    let page = std::fs::read_to_string(dir.path().join("man5/taskgate.toml.5")).unwrap();
    assert_eq!(page, keys::man_page());
    assert!(dir.path().join("man1/taskgate.1").exists());
    assert!(dir.path().join("man1/taskgate-call.1").exists());

    // groff reads the page without a warning, and every key is in the text.
    // Without groff this check would pass having rendered nothing: it
    // fails instead (scripts/test.sh installs groff-base).
    let render = std::process::Command::new("groff")
        .args(["-man", "-Tutf8", "-ww"])
        .arg(dir.path().join("man5/taskgate.toml.5"))
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "groff cannot be run ({e}): apt-get install groff-base, which scripts/test.sh does"
            )
        });
    let stderr = String::from_utf8_lossy(&render.stderr);
    assert!(
        render.status.success() && stderr.trim().is_empty(),
        "{stderr}"
    );
    // Without SGR support grotty emboldens by overstriking (c, backspace, c).
    let mut text = String::new();
    for c in String::from_utf8_lossy(&render.stdout).chars() {
        if c == '\u{8}' {
            text.pop();
        } else {
            text.push(c);
        }
    }
    for key in keys::KEYS
        .iter()
        .chain(keys::TOOL_KEYS)
        .chain(keys::UPSTREAM_KEYS)
    {
        assert!(
            text.contains(key.name),
            "{} missing from the page",
            key.name
        );
    }
}

/// The lines of the commented example that starts with `first`, up to the
/// next blank line (`whole`: to the end of the file), uncommented.
fn example(starter: &str, first: &str, whole: bool) -> String {
    starter
        .lines()
        .skip_while(|l| !l.starts_with(first))
        .take_while(|l| whole || !l.is_empty())
        .map(|l| {
            format!(
                "{}\n",
                l.trim_start_matches("# ").split("  #").next().unwrap_or("")
            )
        })
        .collect()
}

#[test]
fn the_starter_file_and_its_examples_are_valid() {
    let dir = private_dir();
    let state = state_dir(dir.path());
    let starter = keys::starter_config(None);
    for key in keys::KEYS {
        assert!(
            starter.contains(&format!("\n{} = ", key.name))
                || starter.contains(&format!("\n# {} = ", key.name)),
            "{} missing from the starter file",
            key.dotted()
        );
    }
    // `taskgate init` prints exactly the starter file.
    let out = taskgate(&["init"], &[]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), starter);

    // The commented examples are valid once uncommented: `check` builds
    // the tool registry, placeholders included, and reads the upstream
    // tables (a stdio one and an https one, each with a tool's own table).
    let tool = example(&starter, "# [[tool]]", false);
    let upstreams = example(&starter, "# [[upstream]]", true);
    assert!(tool.contains("argv = "), "{tool}");
    assert_eq!(upstreams.matches("[[upstream]]").count(), 2, "{upstreams}");
    assert!(upstreams.contains("command = ["), "{upstreams}");
    assert!(upstreams.contains("url = \"https://"), "{upstreams}");
    assert!(upstreams.contains("bearer_token_file = "), "{upstreams}");
    // The credential file it names must exist and be private: a stand-in.
    let token = dir.path().join("tickets.token");
    std::fs::write(&token, "stand-in\n").unwrap();
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    assert!(
        upstreams.contains("\"/etc/taskgate/tickets.token\""),
        "{upstreams}"
    );
    let upstreams = upstreams.replace("/etc/taskgate/tickets.token", token.to_str().unwrap());
    for (name, text) in [("tool.toml", &tool), ("upstream.toml", &upstreams)] {
        let file = dir.path().join(name);
        std::fs::write(&file, text).unwrap();
        let out = taskgate(
            &[
                "check",
                "--config",
                file.to_str().unwrap(),
                "--state-dir",
                state.to_str().unwrap(),
            ],
            &[],
        );
        assert!(out.status.success(), "{text}\n{out:?}");
    }
}
