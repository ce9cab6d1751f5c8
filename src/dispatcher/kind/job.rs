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
        (
            super::Kind::Job,
            meta["name"].as_str().unwrap_or_default(),
            meta["namespace"].as_str().unwrap_or_default(),
        ),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::apart::Unmodelled;
    use serde_json::json;

    /// The Job of the admission fixture, as kube-apiserver sent it.
    fn fixture_job() -> Value {
        let review: Value = serde_json::from_str(include_str!(
            "../../../tests/fixtures/admission/admission-mutate-create-basic.json"
        ))
        .unwrap();
        review["request"]["object"].clone()
    }

    fn with_anti_affinity(mut job: Value, selector: Value) -> Value {
        job["spec"]["template"]["spec"]["affinity"] = json!({"podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": selector, "topologyKey": "kubernetes.io/hostname"}
            ]
        }});
        job
    }

    #[test]
    fn a_job_whose_pods_select_one_another_by_its_name_keeps_them_one_to_a_node() {
        let plain = gang(&fixture_job());
        let by_name = json!({"matchLabels": {"batch.kubernetes.io/job-name": "basic"}});
        let apart = gang(&with_anti_affinity(fixture_job(), by_name.clone()));
        let shape = apart.shape.as_ref().unwrap();
        assert!(shape.one_per_node && shape.unmodelled_terms.is_empty());
        assert!(!plain.shape.as_ref().unwrap().one_per_node);
        // The same template in a Job of another name selects other pods: not modelled.
        let mut other = with_anti_affinity(fixture_job(), by_name);
        other["metadata"]["name"] = "other".into();
        let other = gang(&other);
        let shape = other.shape.as_ref().unwrap();
        assert!(!shape.one_per_node);
        assert_eq!(shape.unmodelled_terms, [Unmodelled::AntiAffinity(0)]);
        // Their keys differ, so they are never one class.
        assert_ne!(apart.shape_key, other.shape_key);
    }

    #[test]
    fn the_same_spec_with_other_template_labels_is_another_class() {
        let by_app = json!({"matchLabels": {"app": "trainer"}});
        let labelled = |app: &str| {
            let mut job = with_anti_affinity(fixture_job(), by_app.clone());
            job["spec"]["template"]["metadata"]["labels"] = json!({"app": app});
            gang(&job)
        };
        let (trainer, other) = (labelled("trainer"), labelled("other"));
        assert!(trainer.shape.as_ref().unwrap().one_per_node);
        assert!(!other.shape.as_ref().unwrap().one_per_node);
        assert_ne!(trainer.shape_key, other.shape_key);
        // Labels that change nothing placement sees leave the key as it was.
        let mut job = fixture_job();
        let before = gang(&job).shape_key;
        job["spec"]["template"]["metadata"]["labels"] = json!({"controller-uid": "u-1"});
        assert_eq!(gang(&job).shape_key, before);
    }
}
