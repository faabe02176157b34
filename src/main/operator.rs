//! The operator client's commands: `taskgate call` and `taskgate task`,
//! their target and token, and their exit statuses.

use super::*;

/// How an operator command ended.
pub(crate) enum Answer {
    Ok(serde_json::Value),
    /// The server answered, but with a failure the caller must see.
    Failed(serde_json::Value),
}

/// Runs an operator command on a small runtime, prints its JSON on stdout
/// and maps its outcome to an exit status (see [`ExitClass`]: 0 ok,
/// 1 the call failed, 64 usage, 69 daemon unreachable, 76 request refused
/// or answer not understood).
pub(crate) fn operator(
    f: impl FnOnce(&tokio::runtime::Runtime) -> Result<Answer, ClientError>,
) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            say(&format!("taskgate: cannot start the async runtime: {e}"));
            return ExitCode::from(ExitClass::Io.code());
        }
    };
    let (class, shown) = match f(&rt) {
        Ok(Answer::Ok(v)) => (None, Some(v)),
        Ok(Answer::Failed(v)) => (Some(ExitClass::CallFailed), Some(v)),
        Err(ClientError::Rpc { error, .. }) => (
            Some(ExitClass::Protocol),
            Some(serde_json::json!({ "error": error })),
        ),
        Err(e) => {
            say(&format!("taskgate: {e}"));
            (Some(e.exit_class()), None)
        }
    };
    if let Some(v) = shown {
        let text = serde_json::to_string_pretty(&v).unwrap_or_default();
        if let Err(refusal) = out(text) {
            say(&refusal.line());
            return ExitCode::from(refusal.class.code());
        }
    }
    class.map_or(ExitCode::SUCCESS, |c| ExitCode::from(c.code()))
}

fn judge(v: serde_json::Value) -> Answer {
    let failed = matches!(
        v.get("status").and_then(|s| s.as_str()),
        Some("failed" | "cancelled")
    ) || v.get("isError").and_then(|e| e.as_bool()) == Some(true)
        || v.pointer("/result/isError").and_then(|e| e.as_bool()) == Some(true);
    if failed {
        Answer::Failed(v)
    } else {
        Answer::Ok(v)
    }
}

/// Where the operator client goes and the bearer token it sends.
pub(crate) struct Target {
    url: String,
    token: Option<String>,
}

impl Target {
    fn client(&self, tasks: bool) -> Result<Client, ClientError> {
        Ok(Client::new(&self.url, tasks)?.with_token(self.token.clone()))
    }
}

/// Longest token file read.
const MAX_TOKEN_FILE_BYTES: u64 = 64 * 1024;

pub(crate) fn target(endpoint: &Endpoint) -> Result<Target, Refusal> {
    let token = match &endpoint.token_file {
        Some(path) => {
            use std::io::Read;
            let mut text = String::new();
            std::fs::File::open(path)
                .and_then(|f| f.take(MAX_TOKEN_FILE_BYTES).read_to_string(&mut text))
                .map_err(|e| {
                    Refusal::new(
                        ExitClass::Usage,
                        format!("cannot read the token file {}: {e}", path.display()),
                    )
                })?;
            let line = text.lines().next().unwrap_or_default().trim().to_string();
            if line.is_empty() {
                return Err(Refusal::new(
                    ExitClass::Usage,
                    format!("the token file {} is empty", path.display()),
                ));
            }
            Some(line)
        }
        None => std::env::var(taskgate::config::ENV_CLIENT_TOKEN)
            .ok()
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty()),
    };
    Ok(Target {
        url: endpoint_url(endpoint)?,
        token,
    })
}

/// The operator client's endpoint: `--url`, else the `server.listen` of the
/// configuration a daemon would read: `--config`, `$TASKGATE_CONFIG`, else
/// the packaged service's file when it exists (an operator on that host
/// means that daemon), else the embedded default.
fn endpoint_url(endpoint: &Endpoint) -> Result<String, Refusal> {
    if let Some(url) = &endpoint.url {
        return Ok(url.clone());
    }
    let mut config_path = endpoint.config.clone();
    if config_path.is_none() && std::env::var_os(config::ENV_CONFIG_PATH).is_none() {
        let packaged = std::path::Path::new(config::PACKAGE_CONFIG_PATH);
        if packaged.exists() {
            config_path = Some(packaged.to_path_buf());
        }
    }
    let listen = config::configured_listen(&config::Overrides {
        config_path,
        ..Default::default()
    })?;
    if listen.port() == 0 {
        return Err(Refusal::new(
            ExitClass::Usage,
            format!(
                "server.listen = {listen} names no fixed port (the daemon picks one); name it with --url"
            ),
        ));
    }
    Ok(format!("http://{listen}/mcp"))
}

/// `--args`, which must be a JSON object.
pub(crate) fn call_arguments(args: &CallArgs) -> Result<serde_json::Value, Refusal> {
    match serde_json::from_str(&args.args) {
        Ok(v @ serde_json::Value::Object(_)) => Ok(v),
        _ => Err(Refusal::new(
            ExitClass::Usage,
            "--args must be a JSON object, e.g. --args '{\"name\": \"x\"}'",
        )),
    }
}

pub(crate) async fn call(
    args: &CallArgs,
    target: &Target,
    arguments: serde_json::Value,
) -> Result<Answer, ClientError> {
    let client = target.client(args.task)?;
    let result = client
        .call_tool(&args.tool, arguments, args.operation_id.as_deref())
        .await?;
    let is_task = result.get("resultType").and_then(|r| r.as_str()) == Some("task");
    if is_task && args.wait {
        let id = result
            .get("taskId")
            .and_then(|i| i.as_str())
            .unwrap_or_default()
            .to_string();
        say(&format!(
            "taskgate: task {id} created; waiting for it to end"
        ));
        return client.wait_task(&id, &result).await.map(judge);
    }
    Ok(judge(result))
}

pub(crate) async fn task(args: &TaskArgs, target: &Target) -> Result<Answer, ClientError> {
    match &args.action {
        TaskAction::Get(r) => {
            let client = target.client(true)?;
            let t = client.get_task(&r.id).await?;
            if r.wait {
                return client.wait_task(&r.id, &t).await.map(judge);
            }
            Ok(judge(t))
        }
        TaskAction::Cancel(r) => {
            let client = target.client(true)?;
            client.cancel_task(&r.id).await?;
            // The acknowledgement is empty; show where the task now stands.
            client.get_task(&r.id).await.map(Answer::Ok)
        }
    }
}
