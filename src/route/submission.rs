//! `taskgate.task-submission/1`: its shape, its bounds, and the binding a
//! route is committed with. Everything here is checked before anything is
//! stored or sent.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::error::{Check, RouteError};
use crate::store::Digest;

/// The submission schema this build accepts.
pub const SUBMISSION_SCHEMA: &str = "taskgate.task-submission/1";
/// Longest canonical input and longest accepted output.
pub const MAX_IO_BYTES: u64 = 64 * 1024;
/// Longest declared runtime.
pub const MAX_RUNTIME_MS: u64 = 30_000;
/// Most declared artifact bytes.
pub const MAX_ARTIFACT_BYTES: u64 = 8 * 1024 * 1024;
/// Longest retention, and the farthest deadline from admission.
pub const MAX_RETENTION_MS: u64 = 3_600_000;
/// The only attempt a submission may be.
pub const ONLY_ATTEMPT: u32 = 1;
/// The conservative effect class every routed submission runs under.
pub const CONSERVATIVE_EFFECT: &str = "non_idempotent_write";
/// Longest identifier (logical task, correlation, idempotency key).
const MAX_IDENTIFIER_BYTES: usize = 256;

/// The limits a submission declares for its worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Limits {
    pub runtime_ms: u64,
    pub artifact_bytes: u64,
    pub output_bytes: u64,
}

/// One submission, as the caller wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Submission {
    pub schema: String,
    pub lease_id: String,
    pub capability: String,
    pub logical_task_id: String,
    pub attempt: u32,
    pub correlation_id: String,
    pub idempotency_key: String,
    pub input_digest: String,
    pub acceptance_policy_digest: String,
    pub artifact_scope_digest: String,
    pub provider_interface_version: String,
    pub deadline_unix_ms: i64,
    pub retention_ms: u64,
    pub limits: Limits,
    pub permitted_effect: String,
    pub cleanup_required: bool,
}

fn bounds(message: impl Into<String>) -> RouteError {
    RouteError::refused(Check::Bounds, message)
}

fn is_hex_digest(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The canonical (RFC 8785) bytes of a JSON value.
pub fn canonical(value: &Value) -> Vec<u8> {
    serde_jcs::to_vec(value).unwrap_or_else(|_| value.to_string().into_bytes())
}

/// The lower-case hex sha256 of the canonical arguments: what `inputDigest`
/// must be.
pub fn input_digest(arguments: &Map<String, Value>) -> String {
    use sha2::Digest as _;
    let bytes = canonical(&Value::Object(arguments.clone()));
    let digest: [u8; 32] = sha2::Sha256::digest(&bytes).into();
    Digest(digest).to_hex()
}

impl Submission {
    /// Reads the `submission` argument strictly.
    pub fn parse(value: Option<&Value>) -> Result<Submission, RouteError> {
        let Some(value) = value else {
            return Err(RouteError::refused(
                Check::Schema,
                format!("taskgate_submit needs a \"submission\" object ({SUBMISSION_SCHEMA})"),
            ));
        };
        let s: Submission = serde_json::from_value(value.clone()).map_err(|e| {
            RouteError::refused(
                Check::Schema,
                format!("the submission does not have the shape of {SUBMISSION_SCHEMA}: {e}"),
            )
        })?;
        if s.schema != SUBMISSION_SCHEMA {
            return Err(RouteError::refused(
                Check::Schema,
                format!(
                    "submission schema {:?} is not supported; this taskgate accepts {SUBMISSION_SCHEMA}",
                    s.schema
                ),
            ));
        }
        Ok(s)
    }

    /// The bounds that need no state: identifiers, attempt, cleanup, the
    /// declared limits, retention and deadline against `now_ms`, the
    /// permitted effect, the digests' shape, and the input's size and
    /// digest.
    pub fn check(&self, arguments: &Map<String, Value>, now_ms: i64) -> Result<(), RouteError> {
        for (name, value) in [
            ("logicalTaskId", &self.logical_task_id),
            ("correlationId", &self.correlation_id),
            ("idempotencyKey", &self.idempotency_key),
            ("leaseId", &self.lease_id),
        ] {
            if value.is_empty() || value.len() > MAX_IDENTIFIER_BYTES {
                return Err(RouteError::refused(
                    Check::Schema,
                    format!("{name} must be 1-{MAX_IDENTIFIER_BYTES} bytes"),
                ));
            }
        }
        for (name, value) in [
            ("inputDigest", &self.input_digest),
            ("acceptancePolicyDigest", &self.acceptance_policy_digest),
            ("artifactScopeDigest", &self.artifact_scope_digest),
        ] {
            if !is_hex_digest(value) {
                return Err(RouteError::refused(
                    Check::Schema,
                    format!("{name} must be a sha256 digest: 64 lower-case hex digits"),
                ));
            }
        }
        if self.attempt != ONLY_ATTEMPT {
            return Err(bounds(format!(
                "attempt {} refused: a durable route admits exactly one attempt ({ONLY_ATTEMPT}); a new attempt is a new logical task",
                self.attempt
            )));
        }
        if !self.cleanup_required {
            return Err(bounds(
                "cleanupRequired must be true: the worker must clean up what it owns",
            ));
        }
        let l = &self.limits;
        if l.runtime_ms == 0 || l.runtime_ms > MAX_RUNTIME_MS {
            return Err(bounds(format!(
                "limits.runtimeMs must be 1-{MAX_RUNTIME_MS}"
            )));
        }
        if l.artifact_bytes > MAX_ARTIFACT_BYTES {
            return Err(bounds(format!(
                "limits.artifactBytes must be at most {MAX_ARTIFACT_BYTES}"
            )));
        }
        if l.output_bytes == 0 || l.output_bytes > MAX_IO_BYTES {
            return Err(bounds(format!(
                "limits.outputBytes must be 1-{MAX_IO_BYTES}"
            )));
        }
        if self.retention_ms == 0 || self.retention_ms > MAX_RETENTION_MS {
            return Err(bounds(format!(
                "retentionMs must be 1-{MAX_RETENTION_MS} (one hour)"
            )));
        }
        if self.deadline_unix_ms <= now_ms {
            return Err(bounds(format!(
                "deadlineUnixMs {} is not in the future (now {now_ms})",
                self.deadline_unix_ms
            )));
        }
        let ahead = (self.deadline_unix_ms - now_ms) as u64;
        if ahead > self.retention_ms {
            return Err(bounds(
                "deadlineUnixMs lies beyond the retention: a task must end before its record may go",
            ));
        }
        if ahead > MAX_RETENTION_MS {
            return Err(bounds("deadlineUnixMs lies more than one hour ahead"));
        }
        if self.permitted_effect != CONSERVATIVE_EFFECT {
            return Err(RouteError::refused(
                Check::Effect,
                format!(
                    "permittedEffect must be {CONSERVATIVE_EFFECT:?}: a routed submission is treated as a non-idempotent write whatever the upstream's hints say"
                ),
            ));
        }
        self.check_input(arguments)
    }

    /// The input's bound and its digest: checked first, even for a
    /// submission that finds its route again by its key.
    pub fn check_input(&self, arguments: &Map<String, Value>) -> Result<(), RouteError> {
        let size = canonical(&Value::Object(arguments.clone())).len() as u64;
        if size > MAX_IO_BYTES {
            return Err(bounds(format!(
                "the arguments are {size} bytes in canonical form; at most {MAX_IO_BYTES} are routed"
            )));
        }
        if input_digest(arguments) != self.input_digest {
            return Err(RouteError::refused(
                Check::InputDigest,
                "inputDigest is not the sha256 of the arguments' canonical JSON (RFC 8785); compute it over exactly the arguments sent",
            ));
        }
        Ok(())
    }

    /// The binding committed with the route and sent in the execution
    /// envelope: the submission's every identity and declaration, and no
    /// argument value. It is made of the submission alone, so that a
    /// caller who lost the answer finds the route again by the same key
    /// and submission whatever has changed since (the lease expired, the
    /// deadline passed, the upstream disconnected); what the route was
    /// bound to upstream is kept beside it (its source digest).
    pub fn binding(&self) -> Value {
        json!({
            "schema": self.schema,
            "leaseId": self.lease_id,
            "capability": self.capability,
            "providerInterfaceVersion": self.provider_interface_version,
            "logicalTaskId": self.logical_task_id,
            "attempt": self.attempt,
            "correlationId": self.correlation_id,
            "idempotencyKey": self.idempotency_key,
            "inputDigest": self.input_digest,
            "acceptancePolicyDigest": self.acceptance_policy_digest,
            "artifactScopeDigest": self.artifact_scope_digest,
            "deadlineUnixMs": self.deadline_unix_ms,
            "retentionMs": self.retention_ms,
            "limits": self.limits,
            "permittedEffect": self.permitted_effect,
            "cleanupRequired": self.cleanup_required,
        })
    }
}

/// The digest of the request sent upstream: the tool and its canonical
/// arguments.
pub fn request_digest(remote: &str, arguments: &Map<String, Value>) -> Digest {
    Digest::of_parts(&[
        b"taskgate-route-request",
        remote.as_bytes(),
        &canonical(&Value::Object(arguments.clone())),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> Map<String, Value> {
        json!({"value": "x"}).as_object().unwrap().clone()
    }

    fn valid(now: i64) -> Submission {
        Submission {
            schema: SUBMISSION_SCHEMA.into(),
            lease_id: "tgl-1".into(),
            capability: "up.work".into(),
            logical_task_id: "t".into(),
            attempt: 1,
            correlation_id: "c".into(),
            idempotency_key: "k".into(),
            input_digest: input_digest(&args()),
            acceptance_policy_digest: "a".repeat(64),
            artifact_scope_digest: "b".repeat(64),
            provider_interface_version: "d".into(),
            deadline_unix_ms: now + 60_000,
            retention_ms: 600_000,
            limits: Limits {
                runtime_ms: 30_000,
                artifact_bytes: MAX_ARTIFACT_BYTES,
                output_bytes: MAX_IO_BYTES,
            },
            permitted_effect: CONSERVATIVE_EFFECT.into(),
            cleanup_required: true,
        }
    }

    fn check_of(s: &Submission, now: i64) -> Option<&'static str> {
        s.check(&args(), now).err().map(|e| match e {
            RouteError::Refused { check, .. } => check.as_str(),
            _ => "other",
        })
    }

    #[test]
    fn a_valid_submission_at_every_bound_passes() {
        let now = 1_000_000;
        assert_eq!(check_of(&valid(now), now), None);
        let mut s = valid(now);
        s.retention_ms = MAX_RETENTION_MS;
        s.deadline_unix_ms = now + MAX_RETENTION_MS as i64;
        assert_eq!(check_of(&s, now), None);
    }

    #[test]
    fn every_bound_one_past_is_refused() {
        let now = 1_000_000;
        type Change = Box<dyn Fn(&mut Submission)>;
        let cases: Vec<(&str, Change)> = vec![
            ("attempt 2", Box::new(|s| s.attempt = 2)),
            ("no cleanup", Box::new(|s| s.cleanup_required = false)),
            (
                "runtime",
                Box::new(|s| s.limits.runtime_ms = MAX_RUNTIME_MS + 1),
            ),
            (
                "artifacts",
                Box::new(|s| s.limits.artifact_bytes = MAX_ARTIFACT_BYTES + 1),
            ),
            (
                "output",
                Box::new(|s| s.limits.output_bytes = MAX_IO_BYTES + 1),
            ),
            (
                "retention",
                Box::new(|s| s.retention_ms = MAX_RETENTION_MS + 1),
            ),
            ("past deadline", Box::new(move |s| s.deadline_unix_ms = now)),
            (
                "beyond retention",
                Box::new(move |s| {
                    s.retention_ms = 1000;
                    s.deadline_unix_ms = now + 1001;
                }),
            ),
        ];
        for (what, change) in cases {
            let mut s = valid(now);
            change(&mut s);
            assert_eq!(check_of(&s, now), Some("bounds"), "{what}");
        }
        let mut s = valid(now);
        s.permitted_effect = "idempotent_write".into();
        assert_eq!(check_of(&s, now), Some("effect"));
        let mut s = valid(now);
        s.input_digest = "0".repeat(64);
        assert_eq!(check_of(&s, now), Some("input_digest"));
        let mut s = valid(now);
        s.acceptance_policy_digest = "XYZ".into();
        assert_eq!(check_of(&s, now), Some("schema"));
    }

    #[test]
    fn input_of_64_kib_passes_and_one_byte_more_is_refused() {
        let now = 1_000_000;
        // {"v":"…"} is 8 bytes around the string.
        let fill = |n: usize| {
            let mut m = Map::new();
            m.insert("v".into(), Value::String("x".repeat(n)));
            m
        };
        let at = fill(MAX_IO_BYTES as usize - 8);
        assert_eq!(
            canonical(&Value::Object(at.clone())).len() as u64,
            MAX_IO_BYTES
        );
        let mut s = valid(now);
        s.input_digest = input_digest(&at);
        assert!(s.check(&at, now).is_ok());
        let over = fill(MAX_IO_BYTES as usize - 7);
        s.input_digest = input_digest(&over);
        assert!(matches!(
            s.check(&over, now),
            Err(RouteError::Refused {
                check: Check::Bounds,
                ..
            })
        ));
    }

    #[test]
    fn unknown_fields_and_other_schemas_are_refused() {
        let mut v = serde_json::to_value(valid(0)).unwrap();
        v["extra"] = json!(1);
        assert!(Submission::parse(Some(&v)).is_err());
        let mut v = serde_json::to_value(valid(0)).unwrap();
        v["schema"] = json!("taskgate.task-submission/2");
        assert!(Submission::parse(Some(&v)).is_err());
        let v = serde_json::to_value(valid(0)).unwrap();
        assert!(Submission::parse(Some(&v)).is_ok());
    }
}
