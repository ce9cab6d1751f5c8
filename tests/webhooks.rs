//! The plain manifests in webhooks/ against the server they configure: the paths it serves,
//! the settings the issue asks for, and which Job and JobSet writes the API server would send
//! to each hook (its rules, namespaceSelector and objectSelector, evaluated as kube-apiserver
//! does).

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ValidatingWebhook,
    ValidatingWebhookConfiguration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use std::collections::BTreeMap;
use switchyard::selector;
use switchyard::wellknown::{
    MUTATE_JOB_PATH, NAMESPACE_NAME_LABEL, QUEUE_LABEL, VALIDATE_JOB_PATH,
};

fn manifest<T: serde::de::DeserializeOwned>(name: &str) -> T {
    let path = format!("{}/webhooks/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{path} is not a {name}: {e}"))
}

/// What kube-apiserver decides before calling a webhook for a Job write.
struct Hook<'a> {
    rules: &'a [RuleWithOperations],
    namespace_selector: Option<&'a LabelSelector>,
    object_selector: Option<&'a LabelSelector>,
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn namespace(name: &str) -> BTreeMap<String, String> {
    labels(&[(NAMESPACE_NAME_LABEL, name)])
}

/// A resource as webhook rules name it: group, version, resource.
type Resource = (&'static str, &'static str, &'static str);
const JOBS: Resource = ("batch", "v1", "jobs");
const JOBSETS: Resource = ("jobset.x-k8s.io", "v1alpha2", "jobsets");

// The paths the server answers JobSet reviews on, as issue 22 decided them (src/server.rs).
const MUTATE_JOBSET_PATH: &str = "/mutate-jobset-x-k8s-io-v1alpha2-jobset";
const VALIDATE_JOBSET_PATH: &str = "/validate-jobset-x-k8s-io-v1alpha2-jobset";

impl<'a> Hook<'a> {
    fn of_mutating(w: &'a MutatingWebhook) -> Self {
        Hook {
            rules: w.rules.as_deref().unwrap_or_default(),
            namespace_selector: w.namespace_selector.as_ref(),
            object_selector: w.object_selector.as_ref(),
        }
    }

    fn of_validating(w: &'a ValidatingWebhook) -> Self {
        Hook {
            rules: w.rules.as_deref().unwrap_or_default(),
            namespace_selector: w.namespace_selector.as_ref(),
            object_selector: w.object_selector.as_ref(),
        }
    }

    /// Whether a batch/v1 Job `operation` in a namespace labelled `ns` is sent to the hook.
    fn calls(
        &self,
        operation: &str,
        ns: &BTreeMap<String, String>,
        old: Option<&BTreeMap<String, String>>,
        new: Option<&BTreeMap<String, String>>,
    ) -> bool {
        self.calls_on(JOBS, operation, ns, old, new)
    }

    /// Whether an `operation` on `resource` in a namespace labelled `ns` is sent to the hook.
    /// An absent selector selects everything; an objectSelector is matched against both the
    /// old and the new object, and either matching is enough (an absent object never matches).
    fn calls_on(
        &self,
        (group, version, resource): Resource,
        operation: &str,
        ns: &BTreeMap<String, String>,
        old: Option<&BTreeMap<String, String>>,
        new: Option<&BTreeMap<String, String>>,
    ) -> bool {
        let has = |list: &Option<Vec<String>>, want: &str| {
            list.as_ref()
                .is_some_and(|l| l.iter().any(|x| x == want || x == "*"))
        };
        let ruled = self.rules.iter().any(|r| {
            has(&r.operations, operation)
                && has(&r.api_groups, group)
                && has(&r.api_versions, version)
                && has(&r.resources, resource)
        });
        let in_namespace = self
            .namespace_selector
            .is_none_or(|s| selector::matches(s, ns));
        let object = match self.object_selector {
            None => true,
            Some(s) => [old, new]
                .into_iter()
                .flatten()
                .any(|l| selector::matches(s, l)),
        };
        ruled && in_namespace && object
    }
}

#[test]
fn manifests_match_the_server_and_the_issue() {
    let mutating: MutatingWebhookConfiguration = manifest("mutating.yaml");
    let validating: ValidatingWebhookConfiguration = manifest("validating.yaml");
    assert_eq!(
        mutating.metadata.name.as_deref(),
        Some("switchyard-mutating")
    );
    assert_eq!(
        validating.metadata.name.as_deref(),
        Some("switchyard-validating")
    );
    // The Job hook, then the JobSet hook (last, so that deleting it is cutting the end).
    let [m, _] = mutating.webhooks.as_deref().unwrap() else {
        panic!("two mutating webhooks")
    };
    let [v, _] = validating.webhooks.as_deref().unwrap() else {
        panic!("two validating webhooks")
    };
    assert_eq!(m.name, "mutate-job.switchyard.dev");
    assert_eq!(v.name, "validate-job.switchyard.dev");

    let path = |c: &k8s_openapi::api::admissionregistration::v1::WebhookClientConfig| {
        c.service.as_ref().and_then(|s| s.path.clone())
    };
    assert_eq!(path(&m.client_config).as_deref(), Some(MUTATE_JOB_PATH));
    assert_eq!(path(&v.client_config).as_deref(), Some(VALIDATE_JOB_PATH));

    for (hook, versions, side_effects, failure_policy, timeout, match_policy) in [
        (
            "mutating",
            &m.admission_review_versions,
            m.side_effects.as_str(),
            m.failure_policy.as_deref(),
            m.timeout_seconds,
            m.match_policy.as_deref(),
        ),
        (
            "validating",
            &v.admission_review_versions,
            v.side_effects.as_str(),
            v.failure_policy.as_deref(),
            v.timeout_seconds,
            v.match_policy.as_deref(),
        ),
    ] {
        assert_eq!(versions, &["v1"], "{hook}");
        assert_eq!(side_effects, "None", "{hook}");
        assert_eq!(failure_policy, Some("Fail"), "{hook}");
        assert_eq!(timeout, Some(5), "{hook}");
        assert_eq!(match_policy, Some("Equivalent"), "{hook}");
    }
    let service = m.client_config.service.as_ref().unwrap();
    assert_eq!(
        (service.namespace.as_str(), service.name.as_str()),
        ("switchyard-system", "switchyard-webhook")
    );
    assert_eq!(v.client_config.service.as_ref().unwrap().name, service.name);
    assert_eq!(m.reinvocation_policy.as_deref(), Some("Never"));
}

/// Each JobSet entry is its configuration's Job entry for another resource: the same service,
/// settings, selectors and operations; only the name, the path and the resource differ.
#[test]
fn the_jobset_entries_mirror_the_job_entries() {
    let mutating: MutatingWebhookConfiguration = manifest("mutating.yaml");
    let validating: ValidatingWebhookConfiguration = manifest("validating.yaml");
    let jobset_rules = |job: &[RuleWithOperations]| -> Vec<RuleWithOperations> {
        job.iter()
            .map(|r| RuleWithOperations {
                api_groups: Some(vec![JOBSETS.0.into()]),
                api_versions: Some(vec![JOBSETS.1.into()]),
                resources: Some(vec![JOBSETS.2.into()]),
                ..r.clone()
            })
            .collect()
    };

    let [job, jobset] = mutating.webhooks.as_deref().unwrap() else {
        panic!("two mutating webhooks")
    };
    assert_eq!(jobset.name, "mutate-jobset.switchyard.dev");
    let mut mirrored = job.clone();
    mirrored.name.clone_from(&jobset.name);
    mirrored.client_config.service.as_mut().unwrap().path = Some(MUTATE_JOBSET_PATH.into());
    mirrored.rules = Some(jobset_rules(job.rules.as_deref().unwrap()));
    assert_eq!(jobset, &mirrored);

    let [job, jobset] = validating.webhooks.as_deref().unwrap() else {
        panic!("two validating webhooks")
    };
    assert_eq!(jobset.name, "validate-jobset.switchyard.dev");
    let mut mirrored = job.clone();
    mirrored.name.clone_from(&jobset.name);
    mirrored.client_config.service.as_mut().unwrap().path = Some(VALIDATE_JOBSET_PATH.into());
    mirrored.rules = Some(jobset_rules(job.rules.as_deref().unwrap()));
    assert_eq!(jobset, &mirrored);
}

#[test]
fn each_hook_is_sent_the_jobset_writes_and_only_those() {
    let mutating: MutatingWebhookConfiguration = manifest("mutating.yaml");
    let validating: ValidatingWebhookConfiguration = manifest("validating.yaml");
    let queued = labels(&[(QUEUE_LABEL, "research")]);
    let plain = labels(&[("app", "trainer")]);
    let research = namespace("research");
    // (name, hook) of every entry: mutating Job, mutating JobSet, validating Job, validating
    // JobSet.
    let mut hooks = Vec::new();
    for w in mutating.webhooks.as_deref().unwrap() {
        hooks.push((w.name.as_str(), Hook::of_mutating(w)));
    }
    for w in validating.webhooks.as_deref().unwrap() {
        hooks.push((w.name.as_str(), Hook::of_validating(w)));
    }
    for (name, h) in &hooks {
        let for_jobsets = name.contains("jobset");
        // Each entry sees its own kind only.
        assert_eq!(
            h.calls_on(JOBSETS, "CREATE", &research, None, Some(&queued)),
            for_jobsets,
            "{name}"
        );
        assert_eq!(
            h.calls_on(JOBS, "CREATE", &research, None, Some(&queued)),
            !for_jobsets,
            "{name}"
        );
        // Another version is not in the rule; with matchPolicy Equivalent the API server
        // still sends such a write, converted to v1alpha2, when the CRD serves both.
        assert!(
            !h.calls_on(
                ("jobset.x-k8s.io", "v1alpha1", "jobsets"),
                "CREATE",
                &research,
                None,
                Some(&queued)
            ),
            "{name}"
        );
        assert!(
            !h.calls_on(
                JOBSETS,
                "CREATE",
                &namespace("kube-system"),
                None,
                Some(&queued)
            ),
            "{name}"
        );
    }
    let (_, mutate) = &hooks[1];
    let (_, validate) = &hooks[3];
    assert!(!mutate.calls_on(JOBSETS, "CREATE", &research, None, Some(&plain)));
    assert!(!mutate.calls_on(JOBSETS, "UPDATE", &research, Some(&queued), Some(&queued)));
    assert!(validate.calls_on(JOBSETS, "CREATE", &research, None, Some(&plain)));
    assert!(validate.calls_on(JOBSETS, "UPDATE", &research, Some(&queued), Some(&plain)));
    assert!(!validate.calls_on(JOBSETS, "DELETE", &research, Some(&queued), None));
}

#[test]
fn each_hook_is_sent_the_job_writes_its_rules_need() {
    let mutating: MutatingWebhookConfiguration = manifest("mutating.yaml");
    let validating: ValidatingWebhookConfiguration = manifest("validating.yaml");
    let mutate = Hook::of_mutating(&mutating.webhooks.as_deref().unwrap()[0]);
    let validate = Hook::of_validating(&validating.webhooks.as_deref().unwrap()[0]);
    let queued = labels(&[(QUEUE_LABEL, "research"), ("app", "trainer")]);
    let plain = labels(&[("app", "trainer")]);
    let research = namespace("research");

    // Neither hook sees the system namespaces, whatever the Job.
    for ns in ["kube-system", "switchyard-system"] {
        for hook in [&mutate, &validate] {
            assert!(
                !hook.calls("CREATE", &namespace(ns), None, Some(&queued)),
                "{ns}"
            );
            assert!(
                !hook.calls("UPDATE", &namespace(ns), Some(&queued), Some(&plain)),
                "{ns}"
            );
        }
    }

    // Mutating: CREATE of labelled Jobs only.
    assert!(mutate.calls("CREATE", &research, None, Some(&queued)));
    assert!(!mutate.calls("CREATE", &research, None, Some(&plain)));
    assert!(!mutate.calls("CREATE", &research, None, Some(&BTreeMap::new())));
    assert!(!mutate.calls("UPDATE", &research, Some(&queued), Some(&queued)));

    // Validating: CREATE and UPDATE, including the writes a queue-label selector on the new
    // object alone would hide.
    assert!(validate.calls("CREATE", &research, None, Some(&queued)));
    assert!(
        validate.calls("UPDATE", &research, Some(&queued), Some(&plain)),
        "an UPDATE removing the queue label"
    );
    assert!(
        validate.calls("CREATE", &research, None, Some(&plain)),
        "a Job with our spec.managedBy but no queue label"
    );
    assert!(validate.calls("UPDATE", &research, Some(&plain), Some(&queued)));
    assert!(!validate.calls("DELETE", &research, Some(&queued), None));
}
