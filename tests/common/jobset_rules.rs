//! What the JobSet CRD's schema (jobset.x-k8s.io/v1alpha2) refuses in a status write: the only
//! check kube-apiserver makes of one (tests/fixtures/kube-api/jobset/FACTS.md, "Writing a
//! JobSet's status"), written here again over plain JSON so that the fake API server refuses
//! what the real one would, whatever code in the crate computed it.

use serde_json::Value;

/// The CRD's pattern for a condition's reason, `^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`.
fn reason_matches(r: &str) -> bool {
    let b = r.as_bytes();
    let (Some(first), Some(last)) = (b.first(), b.last()) else {
        return false;
    };
    first.is_ascii_alphabetic()
        && (b.len() == 1 || last.is_ascii_alphanumeric() || *last == b'_')
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b',' | b':'))
}

/// The first thing the schema refuses in `status`, in the API server's words; `None` when it
/// may be written.
pub fn violation(status: &Value) -> Option<String> {
    if status.is_null() {
        return None;
    }
    let mut types = Vec::new();
    for (i, c) in status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let at = format!("status.conditions[{i}]");
        for field in ["type", "status", "reason", "message", "lastTransitionTime"] {
            if !c[field].is_string() {
                return Some(format!("{at}.{field}: Required value"));
            }
        }
        let type_ = c["type"].as_str().unwrap_or_default();
        if types.contains(&type_) {
            return Some(format!("{at}: Duplicate value: {{\"type\":{type_:?}}}"));
        }
        types.push(type_);
        if !["True", "False", "Unknown"].contains(&c["status"].as_str().unwrap_or_default()) {
            return Some(format!("{at}.status: Unsupported value: {}", c["status"]));
        }
        let reason = c["reason"].as_str().unwrap_or_default();
        if reason.is_empty() || reason.len() > 1024 || !reason_matches(reason) {
            return Some(format!(
                "{at}.reason: Invalid value: {reason:?}: should match '^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$'"
            ));
        }
        if c["message"].as_str().is_some_and(|m| m.len() > 32768) {
            return Some(format!(
                "{at}.message: Too long: may not be more than 32768 bytes"
            ));
        }
        let time = c["lastTransitionTime"].as_str().unwrap_or_default();
        if time.parse::<k8s_openapi::jiff::Timestamp>().is_err() {
            return Some(format!(
                "{at}.lastTransitionTime: Invalid value: {time:?}: must be of type date-time"
            ));
        }
    }
    let mut names = Vec::new();
    for (i, r) in status["replicatedJobsStatus"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let at = format!("status.replicatedJobsStatus[{i}]");
        if !r["name"].is_string() {
            return Some(format!("{at}.name: Required value"));
        }
        for field in ["active", "ready", "succeeded", "failed", "suspended"] {
            if !r[field].is_i64() {
                return Some(format!("{at}.{field}: Required value"));
            }
        }
        let name = r["name"].as_str().unwrap_or_default();
        if names.contains(&name) {
            return Some(format!("{at}: Duplicate value: {{\"name\":{name:?}}}"));
        }
        names.push(name);
    }
    None
}
