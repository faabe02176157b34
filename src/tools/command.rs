//! Command tools: a `[[tool]]` entry compiled once at startup (its JSON
//! Schema, its argv template) and run per call as a bounded child process
//! ([`super::process`]). Its stdout becomes the result's text (and its
//! structured content when it is a JSON object); a non-zero exit is an
//! error *result*, a death by signal, timeout or overflow a run error.

use std::time::Duration;

use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use super::confine;
use super::process::{self, Invocation};
use super::shim::Paths;
use super::{ArgumentError, RegistryError, RunError, RunFuture, Runner, ToolSpec, result_json};
use crate::config::ToolConfig;
use crate::process_limits::ProcessLimits;

/// One piece of an argv element.
#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Text(String),
    Arg(String),
}

#[derive(Debug)]
pub struct CommandTool {
    config: ToolConfig,
    spec: ToolSpec,
    validator: jsonschema::Validator,
    template: Vec<Vec<Piece>>,
    limits: ProcessLimits,
    paths: Option<Paths>,
    approval: Option<super::ApprovalRule>,
}

/// The digest of what a tool runs (everything but its name's origin and
/// description): an approval covers calls to this definition only.
fn definition_digest(config: &ToolConfig) -> String {
    use sha2::Digest as _;
    let what = format!(
        "{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}",
        config.name,
        config.argv,
        serde_jcs::to_string(&config.input_schema).unwrap_or_default(),
        config.working_dir,
        config.env,
        config.effect,
        config.task,
        config.limits,
        config.confinement,
    );
    let digest = sha2::Sha256::digest(what.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_element(tool: &str, element: &str) -> Result<Vec<Piece>, RegistryError> {
    let bad = || RegistryError::BadTemplate {
        tool: tool.into(),
        element: element.into(),
    };
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut chars = element.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                text.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                text.push('}');
            }
            '{' => {
                let mut name = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some(ch) => name.push(ch),
                        None => return Err(bad()),
                    }
                }
                if !text.is_empty() {
                    pieces.push(Piece::Text(std::mem::take(&mut text)));
                }
                pieces.push(Piece::Arg(name));
            }
            c => text.push(c),
        }
    }
    if !text.is_empty() || pieces.is_empty() {
        pieces.push(Piece::Text(text));
    }
    Ok(pieces)
}

/// Whether argv is `SHELL -c SCRIPT …`: what follows the script is
/// positional parameters, never options.
fn is_shell_script(argv: &[String]) -> bool {
    let shell = argv
        .first()
        .and_then(|p| std::path::Path::new(p).file_name())
        .and_then(|n| n.to_str());
    matches!(shell, Some("sh" | "bash" | "dash" | "ksh" | "zsh"))
        && argv.get(1).is_some_and(|a| a == "-c")
}

/// What a configured tool must keep to to be served, however well-formed
/// its table: a name the daemon's own tools do not take, and no background
/// task for a non-idempotent write, whose effect a restart during the run
/// would leave unknown (a task is never run twice, so nobody could tell
/// whether it happened).
fn check_rules(config: &ToolConfig) -> Result<(), RegistryError> {
    if super::RESERVED_TOOL_NAMES.contains(&config.name.as_str()) {
        return Err(RegistryError::Reserved {
            tool: config.name.clone(),
            origin: config.origin.clone(),
        });
    }
    if config.effect.forbids(config.task) {
        return Err(RegistryError::BackgroundWrite {
            tool: config.name.clone(),
            origin: config.origin.clone(),
        });
    }
    Ok(())
}

/// How an argument value appears in argv.
fn render(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Whether a program described as `config` can be confined as it asks: no
/// declared path overlapping `protected`, and Landlock on this kernel
/// unless it runs unconfined. For command tools and stdio upstreams alike.
pub fn check_confinement(
    config: &ToolConfig,
    protected: &[std::path::PathBuf],
) -> Result<(), RegistryError> {
    if let Some((path, protected)) = confine::refused_path(config, protected) {
        return Err(RegistryError::Protected {
            tool: config.name.clone(),
            path,
            protected,
        });
    }
    if confine::paths(config, protected).is_some() && confine::landlock_abi() == 0 {
        return Err(RegistryError::NoLandlock {
            tool: config.name.clone(),
        });
    }
    Ok(())
}

impl CommandTool {
    pub fn build(config: ToolConfig) -> Result<CommandTool, RegistryError> {
        CommandTool::build_protected(config, &[])
    }

    /// Compiles a tool that must never reach `protected` (the state
    /// directory, the configuration): a declared path overlapping one is
    /// refused, and a confined tool needs a kernel with Landlock.
    pub fn build_protected(
        config: ToolConfig,
        protected: &[std::path::PathBuf],
    ) -> Result<CommandTool, RegistryError> {
        check_rules(&config)?;
        check_confinement(&config, protected)?;
        let paths = confine::paths(&config, protected);
        let limits = confine::limits(&config);
        let validator = jsonschema::validator_for(&config.input_schema).map_err(|e| {
            RegistryError::BadSchema {
                tool: config.name.clone(),
                detail: e.masked().to_string(),
            }
        })?;
        let properties = config
            .input_schema
            .get("properties")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let mut template = Vec::new();
        for element in &config.argv {
            let pieces = parse_element(&config.name, element)?;
            for p in &pieces {
                if let Piece::Arg(name) = p
                    && !properties.contains_key(name)
                {
                    return Err(RegistryError::UnknownPlaceholder {
                        tool: config.name.clone(),
                        name: name.clone(),
                    });
                }
            }
            template.push(pieces);
        }
        let spec = ToolSpec {
            name: config.name.clone(),
            description: config.description.clone(),
            input_schema: config.input_schema.clone(),
            effect: config.effect,
            task: config.task,
            shown: Default::default(),
        };
        let approval =
            (config.approval == crate::config::Approval::Required).then(|| super::ApprovalRule {
                definition: definition_digest(&config),
                preview: config.approval_preview.clone(),
            });
        Ok(CommandTool {
            approval,
            config,
            spec,
            validator,
            template,
            limits,
            paths,
        })
    }

    /// What `taskgate check` should warn about: an argv element that
    /// starts with a placeholder can be filled with `--output=x` and read
    /// by the program as an option, unless a `--` element precedes it, the
    /// schema constrains the value (`pattern`, `enum`, `const`, or a type
    /// other than string), or it follows a shell's `-c` script (where it
    /// is a positional parameter).
    pub fn warnings(&self) -> Vec<String> {
        let properties = self.config.input_schema.get("properties");
        let shell_script = is_shell_script(&self.config.argv);
        let mut out = Vec::new();
        let mut after_dashes = false;
        for (i, pieces) in self.template.iter().enumerate() {
            if matches!(pieces.as_slice(), [Piece::Text(t)] if t == "--") {
                after_dashes = true;
            }
            let Some(Piece::Arg(name)) = pieces.first() else {
                continue;
            };
            if after_dashes || (shell_script && i >= 3) {
                continue;
            }
            let schema = properties.and_then(|p| p.get(name));
            let constrained = schema.is_some_and(|s| {
                s.get("pattern").is_some()
                    || s.get("enum").is_some()
                    || s.get("const").is_some()
                    || s.get("type").is_some_and(|t| t != "string")
            });
            if !constrained {
                out.push(format!(
                    "tool {:?}: argv element {i} starts with {{{name}}}, so a caller can pass an option such as --output=x to {}; put \"--\" before it, or constrain {name} in input_schema (pattern, enum, or a non-string type)",
                    self.config.name,
                    self.config.argv.first().map(String::as_str).unwrap_or_default()
                ));
            }
        }
        out
    }

    /// Checks the arguments against the input schema; names the first
    /// offending location. The message never echoes the value itself.
    fn check(&self, args: &Value) -> Result<(), ArgumentError> {
        super::check_arguments(&self.validator, &self.config.name, args)
    }

    /// The argv for these (validated) arguments. An element that is exactly
    /// one placeholder is left out when its argument is absent.
    pub fn argv(&self, args: &Map<String, Value>) -> Vec<String> {
        let mut argv = Vec::with_capacity(self.template.len());
        for pieces in &self.template {
            if let [Piece::Arg(name)] = pieces.as_slice() {
                if let Some(v) = args.get(name) {
                    argv.push(render(v));
                }
                continue;
            }
            let mut s = String::new();
            for p in pieces {
                match p {
                    Piece::Text(t) => s.push_str(t),
                    Piece::Arg(name) => s.push_str(&args.get(name).map(render).unwrap_or_default()),
                }
            }
            argv.push(s);
        }
        argv
    }

    /// The full invocation of one call.
    fn invocation(&self, args: &Map<String, Value>, grace: Duration) -> Invocation {
        let env = self
            .config
            .env
            .iter()
            .filter_map(|name| std::env::var(name).ok().map(|v| (name.clone(), v)))
            .collect();
        Invocation {
            argv: self.argv(args),
            env,
            working_dir: self.config.working_dir.clone(),
            stdin: serde_json::to_vec(args).unwrap_or_default(),
            timeout: self.config.limits.timeout,
            max_stdout: self.config.limits.max_stdout_bytes,
            max_stderr: self.config.limits.max_stderr_bytes,
            grace,
            limits: Some(self.limits),
            paths: self.paths.clone(),
        }
    }
}

/// What a finished process means: stdout as the result (structured too
/// when it is a JSON object), a non-zero exit as an error result naming the
/// status, a death by signal as a run error.
fn interpret(tool: &str, finished: process::Finished) -> Result<Value, RunError> {
    if finished.status.success() {
        let text = String::from_utf8_lossy(&finished.stdout).into_owned();
        let structured = serde_json::from_slice::<Value>(&finished.stdout)
            .ok()
            .filter(Value::is_object);
        return Ok(result_json(text, structured, false));
    }
    match (finished.status.code(), finished.signal()) {
        (Some(code), _) => {
            let stderr = String::from_utf8_lossy(&finished.stderr);
            let stdout = String::from_utf8_lossy(&finished.stdout);
            let detail = if stderr.trim().is_empty() {
                stdout
            } else {
                stderr
            };
            let text = format!("{tool} exited with status {code}: {}", detail.trim_end());
            Ok(result_json(text, None, true))
        }
        (None, signal) => Err(RunError::Killed {
            signal: signal.unwrap_or(0),
        }),
    }
}

impl Runner for CommandTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn approval(&self) -> Option<&super::ApprovalRule> {
        self.approval.as_ref()
    }

    fn warnings(&self) -> Vec<String> {
        CommandTool::warnings(self)
    }

    fn confinement(&self) -> Option<confine::ToolState> {
        Some(confine::ToolState::of(&self.config))
    }

    fn validate(&self, args: &Value) -> Result<(), ArgumentError> {
        self.check(args)
    }

    fn run<'a>(
        &'a self,
        args: &'a Map<String, Value>,
        grace: Duration,
        cancel: &'a CancellationToken,
    ) -> RunFuture<'a> {
        Box::pin(async move {
            let invocation = self.invocation(args, grace);
            let finished = process::run(&invocation, cancel).await?;
            interpret(&self.spec.name, finished)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Effect, TaskMode, ToolLimits};
    use serde_json::json;

    fn config(argv: &[&str], schema: Value) -> ToolConfig {
        ToolConfig {
            name: "t".into(),
            description: String::new(),
            argv: argv.iter().map(|s| s.to_string()).collect(),
            input_schema: schema,
            working_dir: None,
            env: vec![],
            effect: Effect::ReadOnly,
            task: TaskMode::Never,
            approval: Default::default(),
            approval_preview: vec![],
            limits: ToolLimits {
                timeout: Duration::from_secs(1),
                max_stdout_bytes: 10,
                max_stderr_bytes: 10,
                ..ToolLimits::default()
            },
            confinement: Default::default(),
            origin: "c.toml".into(),
        }
    }

    fn tool(argv: &[&str], schema: Value) -> Result<CommandTool, RegistryError> {
        CommandTool::build(config(argv, schema))
    }

    /// The daemon's own names and a non-idempotent background task are
    /// refused, as the operator wrote them (78).
    #[test]
    fn reserved_names_and_background_writes_are_refused() {
        let reserved = CommandTool::build(ToolConfig {
            name: crate::tools::ARTIFACT_READ.into(),
            ..config(&["/bin/x"], json!({"type": "object"}))
        });
        let e = reserved.unwrap_err();
        assert!(matches!(e, RegistryError::Reserved { .. }), "{e}");
        assert_eq!(
            e.to_string(),
            "c.toml: [[tool]] \"artifact_read\": this name is reserved for a built-in tool; fix or remove that key (see `taskgate init` for every key)"
        );
        assert_eq!(
            crate::exit::Classify::exit_class(&e),
            crate::exit::ExitClass::Config
        );
        for task in [TaskMode::Optional, TaskMode::Required] {
            let write = CommandTool::build(ToolConfig {
                effect: Effect::NonIdempotentWrite,
                task,
                ..config(&["/bin/x"], json!({"type": "object"}))
            });
            let e = write.unwrap_err();
            assert!(
                e.to_string().starts_with("c.toml: [[tool]] \"t\": a non-idempotent write cannot run as a background task (a restart would leave its effect unknown);"),
                "{e}"
            );
        }
        assert!(
            CommandTool::build(ToolConfig {
                effect: Effect::NonIdempotentWrite,
                task: TaskMode::Never,
                ..config(&["/bin/x"], json!({"type": "object"}))
            })
            .is_ok()
        );
    }

    #[test]
    fn templates_render_and_drop_absent_whole_placeholders() {
        let schema = json!({"type":"object","properties":{"a":{"type":"string"},"n":{"type":"integer"},"o":{"type":"object"}}});
        let t = tool(&["/bin/x", "{a}", "--n={n}", "{{literal}}", "{o}"], schema).unwrap();
        let args = json!({"n": 3, "o": {"k": 1}});
        assert_eq!(
            t.argv(args.as_object().unwrap()),
            vec!["/bin/x", "--n=3", "{literal}", "{\"k\":1}"]
        );
    }

    #[test]
    fn unknown_placeholders_and_bad_schemas_are_refused() {
        let schema = json!({"type":"object","properties":{}});
        assert!(matches!(
            tool(&["/bin/x", "{nope}"], schema.clone()),
            Err(RegistryError::UnknownPlaceholder { .. })
        ));
        assert!(matches!(
            tool(&["/bin/x", "{open"], schema),
            Err(RegistryError::BadTemplate { .. })
        ));
        assert!(matches!(
            tool(&["/bin/x"], json!({"type": 17})),
            Err(RegistryError::BadSchema { .. })
        ));
    }

    #[test]
    fn whole_placeholders_without_dashes_or_constraints_are_warned_about() {
        let schema = json!({"type":"object","properties":{
            "path":{"type":"string"},
            "mode":{"type":"string","enum":["a","b"]},
            "n":{"type":"integer"},
            "name":{"type":"string","pattern":"^[a-z]+$"}}});
        let t = tool(
            &["/bin/ls", "{mode}", "{n}", "{name}", "--n={n}", "{path}"],
            schema.clone(),
        )
        .unwrap();
        let w = t.warnings();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("{path}") && w[0].contains("--"), "{w:?}");
        let safe = tool(&["/bin/ls", "-l", "--", "{path}"], schema.clone()).unwrap();
        assert!(safe.warnings().is_empty());
        let script = tool(&["/bin/sh", "-c", "ls -- \"$1\"", "sh", "{path}"], schema).unwrap();
        assert!(script.warnings().is_empty());
    }

    #[test]
    fn validation_names_the_field_without_echoing_it() {
        let schema = json!({"type":"object","properties":{"seconds":{"type":"number"}},"required":["seconds"]});
        let t = tool(&["/bin/x"], schema).unwrap();
        let e = t.check(&json!({"seconds": "secret-value"})).unwrap_err();
        assert_eq!(e.location, "arguments/seconds");
        assert!(!e.problem.contains("secret-value"), "{e}");
        let e = t.check(&json!({})).unwrap_err();
        assert!(e.problem.contains("seconds"), "{e}");
        assert!(t.check(&json!({"seconds": 1.5})).is_ok());
    }
}
