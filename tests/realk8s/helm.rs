//! The Helm chart rendered by Helm's own Go SDK, through tests/chart/render.py (as
//! tests/chart.rs renders it): `SWITCHYARD_HELM_PYTHON` names a Python with helm-python-sdk
//! (`.ci/run` makes one), else `python3`.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn python() -> String {
    std::env::var("SWITCHYARD_HELM_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Whether Helm can be used, or why not.
pub fn available() -> Result<(), String> {
    let python = python();
    match Command::new(&python)
        .arg(repo("tests/chart/render.py"))
        .arg("check")
        .output()
    {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!(
            "no Helm ({}); set SWITCHYARD_HELM_PYTHON to a Python with helm-python-sdk (.ci/run makes target/helm-venv)",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Err(format!("no Helm ({python}: {e})")),
    }
}

/// The objects the chart renders with `values` for release `switchyard` in
/// `switchyard-system`: (template path, object), in Helm's order.
pub fn render(values: &Value) -> Result<Vec<(String, Value)>, String> {
    let mut child = Command::new(python())
        .arg(repo("tests/chart/render.py"))
        .args(["template"])
        .arg(repo("charts/switchyard"))
        .args(["switchyard", "switchyard-system"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("render.py: {e}"))?;
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin
            .write_all(values.to_string().as_bytes())
            .map_err(|e| format!("render.py: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("render.py: {e}"))?;
    let parsed: Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "render.py printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    if !out.status.success() {
        return Err(format!(
            "Helm refused the values {values}: {}",
            parsed["error"]
        ));
    }
    let mut objects = Vec::new();
    for (path, text) in parsed["manifests"].as_object().into_iter().flatten() {
        if !path.ends_with(".yaml") {
            continue;
        }
        for doc in crate::k8s::objects::yaml_documents(text.as_str().unwrap_or_default())? {
            objects.push((path.clone(), doc));
        }
    }
    for text in parsed["crds"].as_array().into_iter().flatten() {
        for doc in crate::k8s::objects::yaml_documents(text.as_str().unwrap_or_default())? {
            objects.push(("crds".to_string(), doc));
        }
    }
    Ok(objects)
}
