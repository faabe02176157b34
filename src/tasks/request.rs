//! The identities a task is found by: the request (tool and arguments,
//! whatever key order the client sent) and the client's operation
//! reference. Both are stored only as digests.

use serde_json::{Map, Value, json};

use crate::store::Digest;

/// The digest of a request: a repeat of an operation reference with another
/// request is a conflict, not the same task.
pub fn identity(tool: &str, args: &Map<String, Value>) -> Digest {
    let request = json!({"tool": tool, "arguments": args});
    Digest::of(canonical_json(&request).as_bytes())
}

/// The digest an operation reference is stored under.
pub fn reference(operation_id: &str) -> Digest {
    Digest::of_parts(&[b"operation", operation_id.as_bytes()])
}

/// Canonical JSON: object keys sorted at every depth, no whitespace.
fn canonical_json(v: &Value) -> String {
    fn write(v: &Value, out: &mut String) {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                out.push('{');
                for (i, k) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String((*k).clone()).to_string());
                    out.push(':');
                    write(&m[*k], out);
                }
                out.push('}');
            }
            Value::Array(a) => {
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(x, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut s = String::new();
    write(v, &mut s);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_json_sorts_keys_at_every_depth() {
        let a: Value =
            serde_json::from_str(r#"{"b":1,"a":{"y":[1,{"d":2,"c":3}],"x":"s"}}"#).unwrap();
        assert_eq!(
            canonical_json(&a),
            r#"{"a":{"x":"s","y":[1,{"c":3,"d":2}]},"b":1}"#
        );
    }

    #[test]
    fn key_order_does_not_change_the_identity() {
        let a: Value = serde_json::from_str(r#"{"x":1,"y":{"b":2,"a":3}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"y":{"a":3,"b":2},"x":1}"#).unwrap();
        let (Value::Object(a), Value::Object(b)) = (a, b) else {
            unreachable!()
        };
        assert_eq!(identity("t", &a), identity("t", &b));
        assert_ne!(identity("t", &a), identity("u", &a));
    }
}
