//! `switchyard crds` as a user runs it: two apiextensions.k8s.io/v1 CRDs whose schemas carry
//! the constraints that make `kubectl apply` refuse a bad WorkerCluster or DispatchQueue.
//! No API server here: the constraints are read from the schema and checked the way the API
//! server applies them (patterns with a regex engine, bounds by comparison).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use regex::Regex;
use serde::Deserialize;
use serde_json::Value;
use std::process::Command;
use switchyard::api::{DispatchQueueSpec, NamedQueueSpec};

const GOLDEN: &str = "tests/data/crds.yaml";

fn crds_output() -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .arg("crds")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The documents of the output, typed (so they are CRDs) and as JSON (to walk the schema).
fn crds() -> Vec<(CustomResourceDefinition, Value)> {
    let text = crds_output();
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| {
            let value = Value::deserialize(doc).unwrap();
            let typed: CustomResourceDefinition = serde_json::from_value(value.clone()).unwrap();
            (typed, value)
        })
        .collect()
}

fn crd(kind: &str) -> (CustomResourceDefinition, Value) {
    crds()
        .into_iter()
        .find(|(c, _)| c.spec.names.kind == kind)
        .unwrap_or_else(|| panic!("no CRD of kind {kind}"))
}

/// The schema at `path` under the version's root schema: property names, `[]` for items and
/// `{}` for map values.
fn schema<'a>(crd: &'a Value, path: &str) -> &'a Value {
    let mut s = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    for step in path.split('.').filter(|p| !p.is_empty()) {
        s = match step {
            "[]" => &s["items"],
            "{}" => &s["additionalProperties"],
            name => &s["properties"][name],
        };
        assert!(!s.is_null(), "no schema at {path:?} (stopped at {step:?})");
    }
    s
}

fn pattern(s: &Value) -> Regex {
    Regex::new(s["pattern"].as_str().expect("a pattern")).unwrap()
}

fn rules(s: &Value) -> Vec<(String, String)> {
    s["x-kubernetes-validations"]
        .as_array()
        .map(|rules| {
            rules
                .iter()
                .map(|r| {
                    (
                        r["rule"].as_str().unwrap().to_string(),
                        r["message"].as_str().unwrap().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_output_is_the_golden_file() {
    let golden = std::fs::read_to_string(GOLDEN).unwrap();
    assert!(
        crds_output() == golden,
        "the CRDs changed: review the change, then regenerate {GOLDEN} with\n    cargo run -q -- crds > {GOLDEN}"
    );
}

#[test]
fn two_cluster_scoped_v1_crds_with_a_status_subresource() {
    let all = crds();
    let names: Vec<_> = all
        .iter()
        .map(|(c, _)| c.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "workerclusters.switchyard.dev",
            "dispatchqueues.switchyard.dev"
        ]
    );
    for (c, raw) in &all {
        assert_eq!(raw["apiVersion"], "apiextensions.k8s.io/v1");
        assert_eq!(raw["kind"], "CustomResourceDefinition");
        assert_eq!(c.spec.group, "switchyard.dev");
        assert_eq!(c.spec.scope, "Cluster");
        assert_eq!(c.spec.versions.len(), 1);
        let v = &c.spec.versions[0];
        assert_eq!(v.name, "v1alpha1");
        assert!(v.served && v.storage);
        assert!(v.subresources.as_ref().unwrap().status.is_some());
        assert_eq!(
            c.spec.names.categories.as_deref(),
            Some(&["switchyard".to_string()][..])
        );
        assert_eq!(schema(raw, "")["required"], serde_json::json!(["spec"]));
    }
    let (wc, _) = crd("WorkerCluster");
    assert_eq!(
        wc.spec.names.short_names.as_deref(),
        Some(&["wc".to_string()][..])
    );
    let (dq, _) = crd("DispatchQueue");
    assert_eq!(
        dq.spec.names.short_names.as_deref(),
        Some(&["dq".to_string()][..])
    );
}

#[test]
fn printer_columns() {
    let columns = |kind| {
        let (c, _) = crd(kind);
        c.spec.versions[0]
            .additional_printer_columns
            .clone()
            .unwrap()
            .into_iter()
            .map(|col| (col.name, col.json_path, col.priority.unwrap_or(0)))
            .collect::<Vec<_>>()
    };
    let active = r#".status.conditions[?(@.type=="Active")].status"#;
    let wc = columns("WorkerCluster");
    let shown: Vec<_> = wc.iter().filter(|c| c.2 == 0).collect();
    assert_eq!(
        shown
            .iter()
            .map(|c| (c.0.as_str(), c.1.as_str()))
            .collect::<Vec<_>>(),
        [
            ("Active", active),
            ("Nodes", ".status.summary.nodes"),
            ("Age", ".metadata.creationTimestamp")
        ]
    );
    let dq = columns("DispatchQueue");
    for (name, path) in [
        ("Active", active),
        ("Pending", ".status.pending"),
        ("Admitted", ".status.admitted"),
        ("Running", ".status.running"),
    ] {
        assert!(
            dq.iter().any(|c| c.0 == name && c.1 == path),
            "{name} in {dq:?}"
        );
    }
}

#[test]
fn worker_cluster_schema_refuses_bad_kubeconfig_locations() {
    let (_, wc) = crd("WorkerCluster");
    let location = schema(&wc, "spec.kubeConfig.location");
    assert_eq!(location["minLength"], 1, "an empty location is refused");
    let location_type = schema(&wc, "spec.kubeConfig.locationType");
    assert_eq!(location_type["enum"], serde_json::json!(["Secret", "Path"]));
    assert_eq!(location_type["default"], "Secret");
    assert_eq!(
        schema(&wc, "spec")["required"],
        serde_json::json!(["kubeConfig"])
    );
    let kc_rules = rules(schema(&wc, "spec.kubeConfig"));
    assert!(kc_rules
        .iter()
        .any(|(r, m)| r.contains("self.location.matches(") && m.contains("Secret")));
    assert!(kc_rules
        .iter()
        .any(|(r, m)| r.contains("startsWith('/')") && m.contains("absolute")));
    let label_value = pattern(schema(&wc, "spec.labels.{}"));
    assert!(label_value.is_match("H100") && !label_value.is_match("not valid"));
    let scheduler = pattern(schema(&wc, "spec.schedulerName"));
    assert!(scheduler.is_match("numa-aware") && !scheduler.is_match("Numa Aware"));
    let conditions = schema(&wc, "status.conditions");
    assert_eq!(conditions["x-kubernetes-list-type"], "map");
    assert_eq!(
        conditions["x-kubernetes-list-map-keys"],
        serde_json::json!(["type"])
    );
    for field in [
        "nodes",
        "numaAwareNodes",
        "allocatable",
        "largestFreeOnNode",
        "largestFreeInNumaZone",
        "lastSyncTime",
    ] {
        schema(&wc, &format!("status.summary.{field}"));
    }
    for field in ["disconnectedSince", "attempts"] {
        schema(&wc, &format!("status.connection.{field}"));
    }
}

#[test]
fn dispatch_queue_schema_refuses_what_validate_refuses() {
    let (_, dq) = crd("DispatchQueue");
    // Empty or repeated clusters.
    let clusters = schema(&dq, "spec.clusters");
    assert_eq!(clusters["minItems"], 1);
    assert_eq!(clusters["x-kubernetes-list-type"], "set");
    assert_eq!(
        schema(&dq, "spec")["required"],
        serde_json::json!(["clusters"])
    );
    assert!(!pattern(schema(&dq, "spec.clusters.[]")).is_match("Eu_1"));
    // Zero fanout; an unknown strategy.
    let fanout = schema(&dq, "spec.placement.fanout");
    assert_eq!(fanout["minimum"].as_f64(), Some(1.0));
    assert_eq!(fanout["default"], 1);
    let strategy = schema(&dq, "spec.placement.strategy");
    assert_eq!(
        strategy["enum"],
        serde_json::json!([
            "LeastAllocated",
            "MostAllocated",
            "BalancedAllocation",
            "LeastNUMANodes"
        ])
    );
    assert_eq!(strategy["default"], "LeastAllocated");
    // Bad durations, and their defaults.
    for (path, default) in [
        ("spec.waitForPodsReady.timeout", Some("5m")),
        ("spec.waitForPodsReady.recoveryTimeout", None),
        ("spec.waitForPodsReady.requeuing.backoffBase", Some("60s")),
        ("spec.waitForPodsReady.requeuing.backoffMax", Some("1h")),
        ("spec.workerLostTimeout", Some("15m")),
    ] {
        let s = schema(&dq, path);
        let p = pattern(s);
        assert!(p.is_match("1h30m") && p.is_match("250ms"), "{path}");
        for bad in ["5 minutes", "10", "-1s", "1d", ""] {
            assert!(!p.is_match(bad), "{path} accepts {bad:?}");
        }
        assert_eq!(s["default"].as_str(), default, "{path}");
    }
    assert_eq!(
        schema(&dq, "spec.waitForPodsReady.enabled")["default"],
        false
    );
    assert_eq!(
        schema(&dq, "spec.waitForPodsReady.requeuing.limit")["minimum"].as_f64(),
        Some(0.0)
    );
    // Bad quantities: the grammar for strings, no negative integers.
    let quota = schema(&dq, "spec.quota.{}");
    assert_eq!(quota["x-kubernetes-int-or-string"], true);
    assert_eq!(quota["minimum"].as_f64(), Some(0.0));
    let q = pattern(quota);
    for good in ["96", "384Gi", "500m", "1.5", "2e3"] {
        assert!(q.is_match(good), "{good}");
    }
    for bad in ["lots", "-1", "1Gb", "1 Gi"] {
        assert!(!q.is_match(bad), "{bad}");
    }
    // The CEL rules, each with a message.
    let requeuing = rules(schema(&dq, "spec.waitForPodsReady.requeuing"));
    assert!(requeuing.iter().any(|(r, m)| r
        .contains("duration(self.backoffBase) <= duration(self.backoffMax)")
        && m.contains("backoffBase")));
    let ready = rules(schema(&dq, "spec.waitForPodsReady"));
    assert!(ready.iter().any(
        |(r, m)| r.contains("duration(self.timeout) > duration('0s')") && m.contains("above 0")
    ));
    assert!(rules(schema(&dq, "spec"))
        .iter()
        .any(|(r, _)| r.contains("duration(self.workerLostTimeout)")));
    assert!(rules(schema(&dq, ""))
        .iter()
        .any(|(r, m)| r.contains("self.metadata.name") && m.contains("DNS-1123 label")));
    let operator = schema(&dq, "spec.namespaceSelector.matchExpressions.[].operator");
    assert_eq!(
        operator["enum"],
        serde_json::json!(["In", "NotIn", "Exists", "DoesNotExist"])
    );
    assert!(!rules(schema(&dq, "spec.namespaceSelector.matchExpressions.[]")).is_empty());
}

#[test]
fn every_cel_rule_is_guarded_against_malformed_durations() {
    // The API server runs CEL rules even when a pattern failed; duration() on a malformed
    // string would add an evaluation error to the pattern's clear message.
    let (_, dq) = crd("DispatchQueue");
    let mut found = 0;
    let mut stack = vec![&dq];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(m) => {
                if let Some(rule) = m.get("rule").and_then(Value::as_str) {
                    for field in rule.match_indices("duration(self.").map(|(i, _)| {
                        let rest = &rule[i + "duration(self.".len()..];
                        &rest[..rest.find(')').unwrap()]
                    }) {
                        found += 1;
                        assert!(rule.contains(&format!("!self.{field}.matches(")), "{rule}");
                    }
                }
                stack.extend(m.values());
            }
            Value::Array(a) => stack.extend(a),
            _ => {}
        }
    }
    assert!(found >= 5, "{found} duration() calls");
}

#[test]
fn the_scenario_example_queue_is_a_dispatch_queue_spec() {
    #[derive(Deserialize)]
    struct Scenario {
        queues: Vec<NamedQueueSpec>,
    }
    let text = std::fs::read_to_string("tests/data/formats/scenario.example.yaml").unwrap();
    let scenario: Scenario = serde_yaml::from_str(&text).unwrap();
    let q = &scenario.queues[0];
    q.validate().unwrap();
    // As a DispatchQueue object, the same spec reads the same.
    let spec: DispatchQueueSpec =
        serde_json::from_value(serde_json::to_value(&q.spec).unwrap()).unwrap();
    assert_eq!(spec, q.spec);
}

#[test]
fn bad_specs_are_refused_by_validate() {
    for (yaml, field) in [
        ("clusters: []", "clusters"),
        ("clusters: [a]\nplacement: {fanout: 0}", "placement.fanout"),
        (
            "clusters: [a]\nworkerLostTimeout: 5 minutes",
            "workerLostTimeout",
        ),
        ("clusters: [a]\nquota: {cpu: lots}", "quota[cpu]"),
    ] {
        let spec: DispatchQueueSpec = serde_yaml::from_str(yaml).unwrap();
        let errors = spec.validate().unwrap_err();
        assert!(
            errors.iter().any(|e| e.starts_with(field)),
            "{yaml:?}: {errors:?}"
        );
    }
    assert!(serde_yaml::from_str::<DispatchQueueSpec>(
        "clusters: [a]\nplacement: {strategy: Random}"
    )
    .is_err());
}

/// The key pattern and length bound of a map's `self.all(k, ...)` rule.
fn key_rule(s: &Value) -> (Regex, usize, String) {
    let (rule, message) = rules(s)
        .into_iter()
        .find(|(r, _)| r.starts_with("self.all(k, "))
        .expect("a rule over every key");
    let pattern = rule
        .split_once("k.matches('")
        .and_then(|(_, rest)| rest.rsplit_once("'))"))
        .map(|(p, _)| p)
        .expect("k.matches('...')");
    let max: usize = rule
        .split_once("size(k) <= ")
        .and_then(|(_, rest)| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("size(k) <= N");
    (Regex::new(pattern).unwrap(), max, message)
}

#[test]
fn map_keys_are_checked_as_the_api_server_checks_label_keys_and_resource_names() {
    let (_, wc) = crd("WorkerCluster");
    let (_, dq) = crd("DispatchQueue");
    let long_name = format!("example.com/{}", "n".repeat(64));
    let cases = [
        ("tier", true),
        ("example.com/rack", true),
        ("nvidia.com/gpu", true),
        ("hugepages-2Mi", true),
        ("a_b.c-D9", true),
        ("not a key!", false),
        ("/x", false),
        ("example.com/", false),
        ("Example.com/rack", false),
        ("-tier", false),
        ("tier-", false),
        ("a/b/c", false),
        (long_name.as_str(), false),
    ];
    for (schema_at, what) in [
        (schema(&wc, "spec.labels"), "label key"),
        (schema(&dq, "spec.quota"), "resource name"),
    ] {
        assert_eq!(
            schema_at["maxProperties"], 64,
            "{what}: bounded for CEL's cost"
        );
        let (pattern, max, message) = key_rule(schema_at);
        assert!(message.contains(what), "{message}");
        for (key, good) in cases {
            let schema_says = key.len() <= max && pattern.is_match(key);
            assert_eq!(schema_says, good, "{what} {key:?}");
            // The Rust check for objects read without an API server agrees.
            assert_eq!(
                switchyard::api::is_qualified_name(key),
                good,
                "validate on {key:?}"
            );
        }
    }
}

#[test]
fn worker_cluster_names_are_at_most_63_characters() {
    let (_, wc) = crd("WorkerCluster");
    let root = rules(schema(&wc, ""));
    let (rule, message) = root
        .iter()
        .find(|(r, _)| r.contains("self.metadata.name"))
        .expect("a rule on the name");
    assert_eq!(rule, "self.metadata.name.size() <= 63");
    assert!(
        message.contains("63") && message.contains("switchyard.dev/cluster"),
        "{message}"
    );
    let spec: switchyard::api::WorkerClusterSpec =
        serde_yaml::from_str("kubeConfig: {location: w1-kubeconfig}\nlabels: {\"not a key!\": x}")
            .unwrap();
    let errors = switchyard::api::validate_worker_cluster(&"w".repeat(64), &spec).unwrap_err();
    assert!(errors[0].starts_with("metadata.name: "), "{errors:?}");
    assert!(errors[1].starts_with("spec.labels: "), "{errors:?}");
    let good: switchyard::api::WorkerClusterSpec =
        serde_yaml::from_str("kubeConfig: {location: w1-kubeconfig}\nlabels: {tier: gold}")
            .unwrap();
    assert!(switchyard::api::validate_worker_cluster(&"w".repeat(63), &good).is_ok());
}
