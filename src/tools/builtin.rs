//! Built-in tools that need nothing but their arguments. (`artifact_read`
//! needs the store and the caller's identity, so it lives with the tasks.)

use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::{ArgumentError, RunFuture, Runner, ToolSpec, result_json};
use crate::config::{Effect, TaskMode};

/// The benchmark's tool, served only by a daemon that `taskgate bench`
/// starts (`serve --bench-tool`): it completes at once and runs nothing, so
/// the benchmark measures taskgate rather than a tool.
pub const BENCH_TOOL: &str = "taskgate_bench_noop";

#[derive(Debug)]
pub struct BenchNoop {
    spec: ToolSpec,
}

/// The benchmark's no-op tool, ready to register.
pub fn bench_noop() -> BenchNoop {
    BenchNoop {
        spec: ToolSpec {
            name: BENCH_TOOL.into(),
            description: "Benchmark tool: completes at once (present only under taskgate bench)."
                .into(),
            input_schema: json!({"type": "object"}),
            effect: Effect::ReadOnly,
            task: TaskMode::Optional,
            shown: Default::default(),
        },
    }
}

impl Runner for BenchNoop {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn validate(&self, _args: &Value) -> Result<(), ArgumentError> {
        Ok(())
    }

    fn run<'a>(
        &'a self,
        _args: &'a Map<String, Value>,
        _grace: Duration,
        _cancel: &'a CancellationToken,
    ) -> RunFuture<'a> {
        Box::pin(async { Ok(result_json("ok".into(), None, false)) })
    }

    fn starts_process(&self) -> bool {
        false
    }
}
