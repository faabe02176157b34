//! A capability's schema digest: what pins an upstream tool to the
//! description the operator reviewed. sha256 over the RFC 8785 canonical
//! JSON of the tool's name, title, description, input and output schema
//! and annotations (everything of it a caller or a model is shown),
//! written `sha256:` and 64 lower-case hex digits.

use serde_json::{Map, Value};
use sha2::{Digest as _, Sha256};

/// The prefix of every digest's text.
pub const PREFIX: &str = "sha256:";

/// The digest of one tool as the upstream describes it (its own name, not
/// the alias-qualified one, so that a pin survives a renamed alias). A
/// part the tool leaves out is `null`, so that adding one changes the
/// digest.
pub fn capability(
    name: &str,
    title: Option<&str>,
    description: Option<&str>,
    input_schema: &Value,
    output_schema: Option<&Value>,
    annotations: Option<&Value>,
) -> String {
    let mut doc = Map::new();
    doc.insert("name".into(), Value::String(name.into()));
    doc.insert(
        "title".into(),
        title.map_or(Value::Null, |t| Value::String(t.into())),
    );
    doc.insert(
        "description".into(),
        description.map_or(Value::Null, |d| Value::String(d.into())),
    );
    doc.insert("inputSchema".into(), input_schema.clone());
    doc.insert(
        "outputSchema".into(),
        output_schema.cloned().unwrap_or(Value::Null),
    );
    doc.insert(
        "annotations".into(),
        annotations.cloned().unwrap_or(Value::Null),
    );
    of_value(&Value::Object(doc))
}

/// `sha256:…` of a JSON value's canonical form.
pub fn of_value(value: &Value) -> String {
    // Canonical JSON of a serde_json value cannot fail (its keys are
    // strings and its numbers finite); an impossible failure digests the
    // plain text, which still changes with the value.
    let bytes = serde_jcs::to_vec(value).unwrap_or_else(|_| value.to_string().into_bytes());
    let hash = Sha256::digest(&bytes);
    let mut out = String::with_capacity(PREFIX.len() + 64);
    out.push_str(PREFIX);
    for b in hash {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// Whether `text` is a digest as this module writes them.
pub fn is_digest(text: &str) -> bool {
    text.strip_prefix(PREFIX).is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_order_and_number_spelling_do_not_change_the_digest() {
        let a = capability(
            "t",
            None,
            Some("d"),
            &json!({"type": "object", "properties": {"n": {"type": "number", "maximum": 1.0}}}),
            None,
            None,
        );
        let b = capability(
            "t",
            None,
            Some("d"),
            &serde_json::from_str(
                r#"{"properties": {"n": {"maximum": 1, "type": "number"}}, "type": "object"}"#,
            )
            .unwrap(),
            None,
            None,
        );
        assert_eq!(a, b);
        assert!(is_digest(&a), "{a}");
    }

    #[test]
    fn every_part_counts() {
        let schema = json!({"type": "object"});
        let base = capability("t", None, Some("d"), &schema, None, None);
        assert_ne!(base, capability("u", None, Some("d"), &schema, None, None));
        assert_ne!(base, capability("t", None, Some("e"), &schema, None, None));
        assert_ne!(base, capability("t", None, None, &schema, None, None));
        assert_ne!(
            base,
            capability("t", Some("T"), Some("d"), &schema, None, None)
        );
        assert_ne!(
            base,
            capability(
                "t",
                None,
                Some("d"),
                &json!({"type": "object", "properties": {}}),
                None,
                None
            )
        );
        assert_ne!(
            base,
            capability("t", None, Some("d"), &schema, Some(&schema), None)
        );
        assert_ne!(
            base,
            capability(
                "t",
                None,
                Some("d"),
                &schema,
                None,
                Some(&json!({"readOnlyHint": true}))
            )
        );
    }

    /// RFC 8785's own example, section 3.2.2: the canonical text of its
    /// input, hashed.
    #[test]
    fn canonical_form_is_rfc_8785s() {
        let input: Value = serde_json::from_str(
            r#"{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
                "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
                "literals": [null, true, false]}"#,
        )
        .unwrap();
        let text = String::from_utf8(serde_jcs::to_vec(&input).unwrap()).unwrap();
        assert_eq!(
            text,
            r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
        );
    }
}
