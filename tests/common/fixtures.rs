//! The configuration files tests write: `[[tool]]` tables from one builder,
//! rendered as TOML after the sections a test writes itself. A test names
//! only the keys it relies on, so what it configures can be read at the
//! call.

use std::fmt;
use std::path::{Path, PathBuf};

/// One `[[tool]]` table. `effect` is `read_only` unless set; every other
/// key is left out unless set.
#[derive(Clone, Debug)]
pub struct Tool {
    name: String,
    description: Option<String>,
    argv: Vec<String>,
    /// Why the tool runs unconfined, when it does.
    unconfined: Option<String>,
    effect: String,
    task: Option<String>,
    /// Further `key = value` lines, as TOML.
    keys: Vec<String>,
    schema: Option<Schema>,
}

/// The tool's `input_schema`: an object with these properties.
#[derive(Clone, Debug, Default)]
struct Schema {
    required: Vec<String>,
    /// Name and JSON type.
    properties: Vec<(String, String)>,
}

impl Tool {
    /// `deploy {target}`, held for an administrator's approval: each run
    /// appends its target to `out/marker` and prints "deployed".
    pub fn held_deploy(out: &std::path::Path) -> Tool {
        Tool::new("deploy")
            .script(&format!(
                "printf '%s\\n' \"$0\" >> {}/marker; printf deployed",
                out.display()
            ))
            .args(&["{target}"])
            .param("target", "string")
            .extra(&format!(
                "approval = \"required\"\nwrite_paths = [\"{}\"]",
                out.display()
            ))
    }

    pub fn new(name: &str) -> Tool {
        Tool {
            name: name.into(),
            description: None,
            argv: Vec::new(),
            unconfined: None,
            effect: "read_only".into(),
            task: None,
            keys: Vec::new(),
            schema: None,
        }
    }

    pub fn description(mut self, text: &str) -> Tool {
        self.description = Some(text.into());
        self
    }

    /// The whole command line.
    pub fn argv(mut self, argv: &[&str]) -> Tool {
        self.argv = argv.iter().map(|a| a.to_string()).collect();
        self
    }

    /// `/bin/sh -c script`; [`Tool::args`] adds what the script gets as
    /// `$0`, `$1`, ….
    pub fn script(self, script: &str) -> Tool {
        self.argv(&["/bin/sh", "-c", script])
    }

    /// More arguments after those given so far.
    pub fn args(mut self, args: &[&str]) -> Tool {
        self.argv.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// `sandbox = "unconfined"`; `why` is written beside it.
    pub fn unconfined(mut self, why: &str) -> Tool {
        self.unconfined = Some(why.into());
        self
    }

    pub fn effect(mut self, effect: &str) -> Tool {
        self.effect = effect.into();
        self
    }

    /// `task = "optional"`, `"required"` or `"forbidden"`.
    pub fn task(mut self, mode: &str) -> Tool {
        self.task = Some(mode.into());
        self
    }

    pub fn timeout_secs(self, secs: u64) -> Tool {
        self.extra(&format!("timeout_secs = {secs}"))
    }

    /// Lines of TOML for keys the builder has no method for (limits,
    /// `write_paths`); nothing when empty.
    pub fn extra(mut self, lines: &str) -> Tool {
        if !lines.trim().is_empty() {
            self.keys.push(lines.trim_end().to_string());
        }
        self
    }

    /// An `input_schema` of type object (with no properties unless
    /// [`Tool::param`] adds some).
    pub fn input(mut self) -> Tool {
        self.schema.get_or_insert_with(Schema::default);
        self
    }

    /// A property of the input object, of JSON type `kind`.
    pub fn param(mut self, name: &str, kind: &str) -> Tool {
        let schema = self.schema.get_or_insert_with(Schema::default);
        schema.properties.push((name.into(), kind.into()));
        self
    }

    /// A property the input object must have.
    pub fn required(mut self, name: &str, kind: &str) -> Tool {
        self = self.param(name, kind);
        if let Some(schema) = &mut self.schema {
            schema.required.push(name.into());
        }
        self
    }
}

impl fmt::Display for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "\n[[tool]]")?;
        writeln!(f, "name = {}", toml_string(&self.name))?;
        if let Some(d) = &self.description {
            writeln!(f, "description = {}", toml_string(d))?;
        }
        if !self.argv.is_empty() {
            writeln!(f, "argv = {}", toml_array(&self.argv))?;
        }
        if let Some(why) = &self.unconfined {
            writeln!(f, "sandbox = \"unconfined\" # {why}")?;
        }
        writeln!(f, "effect = {}", toml_string(&self.effect))?;
        if let Some(t) = &self.task {
            writeln!(f, "task = {}", toml_string(t))?;
        }
        for k in &self.keys {
            writeln!(f, "{k}")?;
        }
        if let Some(s) = &self.schema {
            writeln!(f, "[tool.input_schema]\ntype = \"object\"")?;
            if !s.required.is_empty() {
                writeln!(f, "required = {}", toml_array(&s.required))?;
            }
            for (name, kind) in &s.properties {
                writeln!(
                    f,
                    "[tool.input_schema.properties.{name}]\ntype = {}",
                    toml_string(kind)
                )?;
            }
        }
        Ok(())
    }
}

/// `s` as a TOML basic string.
pub fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn toml_array(items: &[String]) -> String {
    let items: Vec<String> = items.iter().map(|i| toml_string(i)).collect();
    format!("[{}]", items.join(", "))
}

/// A configuration: `sections` as the test wrote them, then the tools.
pub fn config_text(sections: &str, tools: &[Tool]) -> String {
    let mut text = sections.to_string();
    for t in tools {
        text.push_str(&t.to_string());
    }
    text
}

/// Writes [`config_text`] to `taskgate.toml` in `dir`; its path.
pub fn write_config(dir: &Path, sections: &str, tools: &[Tool]) -> PathBuf {
    let p = dir.join("taskgate.toml");
    std::fs::write(&p, config_text(sections, tools)).expect("write the configuration");
    p
}
