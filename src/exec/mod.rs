//! Command tools: the registry built from `[[tool]]` configuration, argument
//! validation against each tool's JSON Schema, argv templates, and the
//! bounded child process that runs a call ([`process`]).

pub mod process;
pub mod shim;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};
use thiserror::Error;

use crate::config::{TaskMode, ToolConfig};
use crate::exit::{Classify, ExitClass};

pub use process::{Finished, Invocation, RunError};

/// A tool definition that cannot be served (exit 78 at startup).
#[derive(Debug, Error)]
pub enum RegistryError {
    #[error("tool {tool:?}: input_schema is not a valid JSON Schema: {detail}; fix the schema")]
    BadSchema { tool: String, detail: String },
    #[error(
        "tool {tool:?}: argv placeholder {{{name}}} names no property of input_schema; declare it under properties or remove it"
    )]
    UnknownPlaceholder { tool: String, name: String },
    #[error(
        "tool {tool:?}: argv element {element:?} has an unclosed '{{'; write '{{{{' for a literal brace"
    )]
    BadTemplate { tool: String, element: String },
}

impl Classify for RegistryError {
    fn exit_class(&self) -> ExitClass {
        ExitClass::Config
    }
}

/// Arguments that do not satisfy the tool's schema.
#[derive(Debug, Error, Clone, PartialEq)]
#[error("invalid arguments for {tool}: {location}: {problem}")]
pub struct ArgumentError {
    pub tool: String,
    /// JSON pointer of the offending value, e.g. `/seconds`.
    pub location: String,
    pub problem: String,
}

/// One piece of an argv element.
#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Text(String),
    Arg(String),
}

#[derive(Debug)]
pub struct Tool {
    pub config: ToolConfig,
    validator: jsonschema::Validator,
    template: Vec<Vec<Piece>>,
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

/// How an argument value appears in argv.
fn render(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

impl Tool {
    pub fn build(config: ToolConfig) -> Result<Tool, RegistryError> {
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
        Ok(Tool {
            config,
            validator,
            template,
        })
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    pub fn task_mode(&self) -> TaskMode {
        self.config.task
    }

    /// Checks the arguments against the input schema; names the first
    /// offending location. The message never echoes the value itself.
    pub fn validate(&self, args: &Value) -> Result<(), ArgumentError> {
        match self.validator.iter_errors(args).next() {
            None => Ok(()),
            Some(e) => {
                let location = e.instance_path().to_string();
                Err(ArgumentError {
                    tool: self.config.name.clone(),
                    location: if location.is_empty() {
                        "arguments".into()
                    } else {
                        format!("arguments{location}")
                    },
                    problem: e.masked().to_string(),
                })
            }
        }
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
    pub fn invocation(&self, args: &Map<String, Value>, grace: Duration) -> Invocation {
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
            timeout: self.config.timeout,
            max_stdout: self.config.max_stdout_bytes,
            max_stderr: self.config.max_stderr_bytes,
            grace,
        }
    }
}

/// Every configured tool, by name.
#[derive(Debug, Default, Clone)]
pub struct Registry {
    tools: BTreeMap<String, Arc<Tool>>,
}

impl Registry {
    pub fn build(configs: &[ToolConfig]) -> Result<Registry, RegistryError> {
        let mut tools = BTreeMap::new();
        for c in configs {
            let tool = Tool::build(c.clone())?;
            tools.insert(c.name.clone(), Arc::new(tool));
        }
        Ok(Registry { tools })
    }

    pub fn get(&self, name: &str) -> Option<Arc<Tool>> {
        self.tools.get(name).cloned()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Tool>> {
        self.tools.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Effect, TaskMode};
    use serde_json::json;

    fn tool(argv: &[&str], schema: Value) -> Result<Tool, RegistryError> {
        Tool::build(ToolConfig {
            name: "t".into(),
            description: String::new(),
            argv: argv.iter().map(|s| s.to_string()).collect(),
            input_schema: schema,
            working_dir: None,
            env: vec![],
            timeout: Duration::from_secs(1),
            max_stdout_bytes: 10,
            max_stderr_bytes: 10,
            effect: Effect::ReadOnly,
            task: TaskMode::Never,
        })
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
    fn validation_names_the_field_without_echoing_it() {
        let schema = json!({"type":"object","properties":{"seconds":{"type":"number"}},"required":["seconds"]});
        let t = tool(&["/bin/x"], schema).unwrap();
        let e = t.validate(&json!({"seconds": "secret-value"})).unwrap_err();
        assert_eq!(e.location, "arguments/seconds");
        assert!(!e.problem.contains("secret-value"), "{e}");
        let e = t.validate(&json!({})).unwrap_err();
        assert!(e.problem.contains("seconds"), "{e}");
        assert!(t.validate(&json!({"seconds": 1.5})).is_ok());
    }
}
