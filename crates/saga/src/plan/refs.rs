//! References in a plan's commands, `{"$from": "<JSON pointer>"}`: checked when the
//! plan is, resolved against the saga data when a command is built.

use std::collections::HashSet;

use serde_json::Value;

/// The pointer of `v` if it is a reference, `{"$from": "<pointer>"}`.
pub(super) fn reference(v: &Value) -> Option<&Value> {
    match v {
        Value::Object(m) if m.contains_key("$from") => m.get("$from"),
        _ => None,
    }
}

/// `template` with each reference replaced by what it points to in `data` (`null`
/// for nothing).
pub(super) fn resolve(template: &Value, data: &Value) -> Value {
    if let Some(Value::String(p)) = reference(template) {
        return data.pointer(p).cloned().unwrap_or(Value::Null);
    }
    match template {
        Value::Array(a) => Value::Array(a.iter().map(|v| resolve(v, data)).collect()),
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| (k.clone(), resolve(v, data)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Checks every reference in `v`: a string pointer into `/input`, or into the
/// results of an `earlier` step (or of step `own`, for a compensation).
pub(super) fn check_refs(
    v: &Value,
    earlier: &HashSet<&str>,
    own: Option<&str>,
) -> std::result::Result<(), String> {
    if let Value::Object(m) = v
        && let Some(p) = m.get("$from")
    {
        if m.len() != 1 {
            return Err("a reference is an object with `$from` alone".into());
        }
        let Value::String(p) = p else {
            return Err("`$from` must be a JSON pointer string".into());
        };
        let mut parts = p.split('/');
        let ok = parts.next() == Some("")
            && match parts.next() {
                Some("input") => true,
                Some("results") => parts.next().is_some_and(|step| {
                    let step = step.replace("~1", "/").replace("~0", "~");
                    earlier.contains(step.as_str()) || own == Some(step.as_str())
                }),
                _ => false,
            };
        if !ok {
            return Err(format!(
                "`$from: {p}` must point into /input or into /results/<step> of a step \
                 of an earlier stage{}",
                if own.is_some() {
                    " (or of this step)"
                } else {
                    ""
                }
            ));
        }
        return Ok(());
    }
    match v {
        Value::Array(a) => a.iter().try_for_each(|v| check_refs(v, earlier, own)),
        Value::Object(m) => m.values().try_for_each(|v| check_refs(v, earlier, own)),
        _ => Ok(()),
    }
}
