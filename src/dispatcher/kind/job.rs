//! batch/v1 Job: one Job's pods are the gang (`parallelism`, or `completions` when smaller);
//! its status rules are in [`super::super::mirror`].

use super::{count, template_shape, Gang};
use serde_json::{Map, Value};

/// Labels kube-apiserver puts on a Job's pod template (and in its generated selector).
const CONTROLLER_LABELS: [&str; 4] = [
    "batch.kubernetes.io/controller-uid",
    "controller-uid",
    "batch.kubernetes.io/job-name",
    "job-name",
];

/// The pods that must run at once: parallelism, or completions when smaller.
pub(crate) fn gang(obj: &Value) -> Gang {
    let spec = &obj["spec"];
    let meta = &obj["metadata"];
    let (shape, key) = template_shape(
        &spec["template"],
        meta["name"].as_str().unwrap_or_default(),
        meta["namespace"].as_str().unwrap_or_default(),
        "spec.template",
    );
    let parallelism = count(&spec["parallelism"]).unwrap_or(1);
    let pods = match count(&spec["completions"]) {
        Some(c) => parallelism.min(c),
        None => parallelism,
    };
    Gang::single(shape, key, pods)
}

/// The copy does without the selector and controller labels the manager's API server
/// generated (the worker's makes its own), unless the user chose them (`manualSelector`).
pub(crate) fn prepare_copy(spec: &mut Map<String, Value>) -> Vec<&mut Map<String, Value>> {
    let manual = spec.get("manualSelector").and_then(Value::as_bool) == Some(true);
    if !manual {
        spec.remove("selector");
        spec.remove("manualSelector");
    }
    let template = super::super::remote::object(spec, "template");
    if !manual {
        let labels = super::super::remote::object(
            super::super::remote::object(template, "metadata"),
            "labels",
        );
        for l in CONTROLLER_LABELS {
            labels.remove(l);
        }
    }
    vec![template]
}
