use super::dispatch_queue::{PlacementStrategy, RequeuingSettings, WaitForPodsReady};
use super::schema::{LABEL_VALUE_PATTERN, QUANTITY_PATTERN};
use super::*;
use crate::quantity::Milli;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use regex::Regex;
use serde_json::json;
use std::str::FromStr;
use std::time::Duration;

const SCENARIO: &str = include_str!("../../tests/data/formats/scenario.example.yaml");

fn scenario_queues() -> Vec<NamedQueueSpec> {
    #[derive(serde::Deserialize)]
    struct Scenario {
        queues: Vec<NamedQueueSpec>,
    }
    serde_yaml::from_str::<Scenario>(SCENARIO).unwrap().queues
}

fn spec(yaml: &str) -> DispatchQueueSpec {
    serde_yaml::from_str(yaml).unwrap()
}

fn errors(yaml: &str) -> Vec<String> {
    spec(yaml).validate().unwrap_err()
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[test]
fn the_scenario_example_queue_resolves() {
    let queues = scenario_queues();
    assert_eq!(queues.len(), 1);
    let q = &queues[0];
    assert_eq!(q.name, "research");
    q.validate().unwrap();
    let s = q.spec.resolve().unwrap();
    assert_eq!(s.clusters, ["eu-1", "us-1"]);
    let quota = s.quota.unwrap();
    assert_eq!(quota["cpu"], Milli(96_000));
    assert_eq!(quota["memory"], Milli(384 * (1 << 30) * 1000));
    assert_eq!(quota["nvidia.com/gpu"], Milli(4000));
    let ready = s.wait_for_pods_ready.unwrap();
    assert_eq!(ready.timeout, secs(300));
    assert_eq!(ready.recovery_timeout, None);
    assert!(!ready.block_admission);
    assert_eq!(
        ready.requeuing,
        RequeuingSettings {
            backoff_base: secs(60),
            backoff_max: secs(3600),
            limit: Some(3)
        }
    );
    assert_eq!(s.strategy, crate::placement::Strategy::LeastAllocated);
    assert_eq!(s.fanout, 1);
    assert_eq!(s.worker_lost_timeout, secs(900));
}

#[test]
fn an_absent_field_takes_its_documented_default() {
    let s = spec("clusters: [a]");
    assert_eq!(s.quota, None);
    assert_eq!(s.wait_for_pods_ready, WaitForPodsReady::default());
    assert_eq!(s.wait_for_pods_ready.timeout.as_str(), "5m");
    assert_eq!(s.wait_for_pods_ready.requeuing.backoff_base.as_str(), "60s");
    assert_eq!(s.wait_for_pods_ready.requeuing.backoff_max.as_str(), "1h");
    assert_eq!(s.placement.strategy, PlacementStrategy::LeastAllocated);
    assert_eq!(s.placement.fanout, 1);
    assert_eq!(s.worker_lost_timeout.as_str(), "15m");
    let r = s.resolve().unwrap();
    assert_eq!(r.wait_for_pods_ready, None, "waiting is off by default");
    assert_eq!(r.quota, None, "absent quota is automatic");
    assert_eq!(r.worker_lost_timeout, secs(900));
    // A half-written block keeps the defaults of what it leaves out.
    let s = spec("clusters: [a]\nwaitForPodsReady: {enabled: true, requeuing: {limit: 0}}");
    let ready = s.resolve().unwrap().wait_for_pods_ready.unwrap();
    assert_eq!(ready.timeout, secs(300));
    assert_eq!(ready.requeuing.backoff_max, secs(3600));
    assert_eq!(ready.requeuing.limit, Some(0));
}

#[test]
fn bad_specs_are_refused_with_the_field_named() {
    let cases: &[(&str, &str)] = &[
        ("clusters: []", "clusters: must name at least one"),
        ("clusters: [a, b, a]", "clusters[2]: \"a\" is listed twice"),
        ("clusters: [Eu_1]", "clusters[0]: \"Eu_1\" is not a WorkerCluster name"),
        ("clusters: [a]\nplacement: {fanout: 0}", "placement.fanout: 0 is out of range"),
        ("clusters: [a]\nplacement: {fanout: 65}", "placement.fanout: 65"),
        (
            "clusters: [a]\nwaitForPodsReady: {timeout: 5 minutes}",
            "waitForPodsReady.timeout: \"5 minutes\" is not a duration",
        ),
        (
            "clusters: [a]\nwaitForPodsReady: {timeout: 0s}",
            "waitForPodsReady.timeout: must be above 0",
        ),
        (
            "clusters: [a]\nwaitForPodsReady: {recoveryTimeout: '0'}",
            "waitForPodsReady.recoveryTimeout: must be above 0",
        ),
        (
            "clusters: [a]\nworkerLostTimeout: 1d",
            "workerLostTimeout: \"1d\" is not a duration",
        ),
        (
            "clusters: [a]\nworkerLostTimeout: 3000000h",
            "workerLostTimeout: \"3000000h\" is longer than Kubernetes can hold (about 292 years)",
        ),
        (
            "clusters: [a]\nwaitForPodsReady: {requeuing: {backoffBase: 2h}}",
            "backoffBase 2h is longer than backoffMax 1h",
        ),
        (
            "clusters: [a]\nwaitForPodsReady: {requeuing: {limit: -1}}",
            "waitForPodsReady.requeuing.limit: must not be negative",
        ),
        ("clusters: [a]\nquota: {cpu: lots}", "quota[cpu]: \"lots\" is not a Kubernetes quantity"),
        ("clusters: [a]\nquota: {cpu: '-1'}", "quota[cpu]: \"-1\""),
        ("clusters: [a]\nquota: {cpu: -1}", "quota[cpu]: \"-1\""),
        ("clusters: [a]\nquota: {'/gpu': 1}", "quota: \"/gpu\" is not a resource name"),
        (
            "clusters: [a]\nnamespaceSelector: {matchExpressions: [{key: team, operator: In}]}",
            "namespaceSelector: matchExpressions key \"team\": operator In needs at least one value",
        ),
        (
            "clusters: [a]\nnamespaceSelector: {matchLabels: {team name: ml}}",
            "namespaceSelector: matchLabels: \"team name\" is not a label key",
        ),
    ];
    for (yaml, want) in cases {
        let errs = errors(yaml);
        assert!(
            errs.iter().any(|e| e.contains(want)),
            "{yaml:?}: want {want:?} in {errs:?}"
        );
    }
    // Every problem is reported, not only the first.
    assert_eq!(
        errors("clusters: []\nplacement: {fanout: 0}\nworkerLostTimeout: 0s").len(),
        3
    );
}

#[test]
fn an_unknown_strategy_does_not_read() {
    let err =
        serde_yaml::from_str::<DispatchQueueSpec>("clusters: [a]\nplacement: {strategy: Random}")
            .unwrap_err()
            .to_string();
    assert!(err.contains("unknown variant `Random`"), "{err}");
    assert!(
        err.contains("LeastNUMANodes"),
        "the message lists the choices: {err}"
    );
}

#[test]
fn placement_strategies_are_the_engines() {
    for (name, api) in [
        ("LeastAllocated", PlacementStrategy::LeastAllocated),
        ("MostAllocated", PlacementStrategy::MostAllocated),
        ("BalancedAllocation", PlacementStrategy::BalancedAllocation),
        ("LeastNUMANodes", PlacementStrategy::LeastNumaNodes),
    ] {
        assert_eq!(serde_json::to_value(api).unwrap(), json!(name));
        let engine = crate::placement::Strategy::from(api);
        assert_eq!(engine, crate::placement::Strategy::from_str(name).unwrap());
        // The name a copy's pods carry in their annotation is the one a pod's is read as.
        assert_eq!(engine.as_str(), name);
    }
}

#[test]
fn queue_names_must_be_label_values() {
    let mut q = scenario_queues().remove(0);
    q.name = "research.team".into();
    assert!(q.validate().unwrap_err()[0].starts_with("name: \"research.team\""));
    q.name = "x".repeat(64);
    assert!(q.validate().is_err());
}

#[test]
fn objects_from_a_newer_api_server_read_and_their_quantities_keep_their_form() {
    // As the API server answers: int-or-string quantities as numbers, fields this version
    // does not know, in spec and status.
    let obj = json!({
        "apiVersion": "switchyard.dev/v1alpha1",
        "kind": "DispatchQueue",
        "metadata": {"name": "research", "generation": 3},
        "spec": {
            "clusters": ["eu-1"],
            "quota": {"cpu": 96, "memory": "384Gi"},
            "preemption": {"policy": "LowerPriority"},
            "placement": {"strategy": "MostAllocated", "fanout": 2, "spread": true},
        },
        "status": {
            "pending": 4,
            "admitted": 2,
            "running": 1,
            "quotaUsage": {"cpu": "16"},
            "borrowed": {"cpu": "2"},
            "conditions": [{
                "type": "Active", "status": "True", "reason": "Ready", "message": "",
                "lastTransitionTime": "2025-01-01T00:00:00Z", "observedGeneration": 3,
            }],
        },
    });
    let q: DispatchQueue = serde_json::from_value(obj.clone()).unwrap();
    assert_eq!(q.spec.quota.as_ref().unwrap()["cpu"], Quantity("96".into()));
    assert_eq!(q.spec.placement.fanout, 2);
    let status = q.status.as_ref().unwrap();
    assert_eq!((status.pending, status.admitted, status.running), (4, 2, 1));
    assert!(status.is_active());
    q.spec.validate().unwrap();
}

#[test]
fn durations_read_as_written_and_integers_as_seconds() {
    let s = spec("clusters: [a]\nworkerLostTimeout: 90\nwaitForPodsReady: {timeout: 1h30m}");
    assert_eq!(s.worker_lost_timeout.as_str(), "90s");
    assert_eq!(s.wait_for_pods_ready.timeout.as_str(), "1h30m");
    assert_eq!(
        serde_json::to_value(&s.wait_for_pods_ready.timeout).unwrap(),
        json!("1h30m")
    );
    assert!(
        serde_yaml::from_str::<DispatchQueueSpec>("clusters: [a]\nworkerLostTimeout: -5").is_err()
    );
    assert_eq!(KubeDuration::from(secs(5400)).as_str(), "90m");
    assert_eq!(KubeDuration::from(secs(7200)).as_str(), "2h");
    assert_eq!(
        KubeDuration::from(Duration::from_millis(1500)).as_str(),
        "1500ms"
    );
    assert_eq!(KubeDuration::from(Duration::ZERO).get(), Ok(Duration::ZERO));
}

#[test]
fn the_duration_pattern_accepts_exactly_what_parses() {
    let pattern = Regex::new(DURATION_PATTERN).unwrap();
    let good = [
        "0",
        "0s",
        "30s",
        "5m",
        "1h30m",
        "1.5h",
        ".5s",
        "5.s",
        "250ms",
        "10us",
        "10\u{b5}s",
        "100ns",
        "1h1m1s1ms",
    ];
    for d in good {
        assert!(pattern.is_match(d), "pattern refuses {d:?}");
        assert!(
            crate::config::parse_duration(d).is_ok(),
            "parser refuses {d:?}"
        );
    }
    let bad = [
        "",
        "10",
        "5 minutes",
        "s",
        "1x",
        "-1s",
        "+1s",
        "1d",
        ".s",
        "1h 30m",
        "00",
    ];
    for d in bad {
        assert!(!pattern.is_match(d), "pattern accepts {d:?}");
    }
    // What the pattern refuses, the parser refuses too, or the schema and the scenario reader
    // would disagree.
    for d in bad {
        assert!(
            crate::config::parse_duration(d).is_err(),
            "parser accepts {d:?}"
        );
    }
}

#[test]
fn the_quantity_pattern_agrees_with_the_quantity_parser() {
    let pattern = Regex::new(QUANTITY_PATTERN).unwrap();
    for q in [
        "96", "384Gi", "500m", "1.5", "2e3", ".5", "1.", "+4", "64Mi", "1k", "1E3",
    ] {
        assert!(pattern.is_match(q), "pattern refuses {q:?}");
        assert!(crate::quantity::parse(q).is_ok(), "parser refuses {q:?}");
    }
    for q in ["lots", "-1", "1.5.5", "1Gb", "Gi", "", "1 Gi", "0x10"] {
        assert!(!pattern.is_match(q), "pattern accepts {q:?}");
        assert!(crate::quantity::parse(q).is_err(), "parser accepts {q:?}");
    }
}

#[test]
fn name_patterns_agree_with_the_name_checks() {
    let subdomain = Regex::new(DNS1123_SUBDOMAIN_PATTERN).unwrap();
    let label_value = Regex::new(LABEL_VALUE_PATTERN).unwrap();
    for s in ["eu-1", "a", "a.b-c.d", "0", "eu-1-kubeconfig"] {
        assert!(subdomain.is_match(s) && is_dns1123_subdomain(s), "{s:?}");
    }
    for s in ["", "Eu-1", "-a", "a-", "a..b", "a_b", ".a", "a."] {
        assert!(!subdomain.is_match(s) && !is_dns1123_subdomain(s), "{s:?}");
    }
    for s in ["", "a", "A_b.c-D", "x86_64"] {
        assert!(label_value.is_match(s) && is_label_value(s), "{s:?}");
    }
    for s in ["-a", "a-", "a b", "a/b", "ü"] {
        assert!(!label_value.is_match(s) && !is_label_value(s), "{s:?}");
    }
    assert!(is_qualified_name("nvidia.com/gpu") && is_qualified_name("cpu"));
    assert!(!is_qualified_name("nvidia.com/") && !is_qualified_name("a/b/c"));
    assert!(!is_dns1123_subdomain(&"a".repeat(254)));
}

#[test]
fn requeue_backoff_doubles_up_to_the_max() {
    let r = RequeuingSettings {
        backoff_base: secs(60),
        backoff_max: secs(3600),
        limit: Some(3),
    };
    let waits: Vec<u64> = (1..=8).map(|n| r.backoff(n).as_secs()).collect();
    assert_eq!(waits, [60, 120, 240, 480, 960, 1920, 3600, 3600]);
    assert_eq!(r.backoff(1000), secs(3600), "no overflow");
    assert!(r.may_requeue(2) && !r.may_requeue(3));
    let forever = RequeuingSettings { limit: None, ..r };
    assert!(forever.may_requeue(u32::MAX));
}

#[test]
fn fanout_is_capped_at_the_number_of_clusters() {
    let s = spec("clusters: [a, b]\nplacement: {fanout: 5}");
    assert_eq!(s.resolve().unwrap().fanout, 2);
}

#[test]
fn a_selector_is_kept() {
    let s = spec("clusters: [a]\nnamespaceSelector: {matchLabels: {team: ml}}");
    let want = LabelSelector {
        match_labels: Some([("team".to_string(), "ml".to_string())].into()),
        ..Default::default()
    };
    assert_eq!(
        s.resolve().unwrap().namespace_selector.map(|s| s.source),
        Some(want)
    );
    let s = spec(
        "clusters: [a]\nnamespaceSelector: {matchExpressions: [{key: team, operator: Gt, values: ['1']}]}",
    );
    assert!(s.validate().unwrap_err()[0].contains("unknown operator"));
}

fn cluster(yaml: &str) -> WorkerClusterSpec {
    serde_yaml::from_str(yaml).unwrap()
}

#[test]
fn worker_cluster_specs_check_location_labels_and_scheduler() {
    let c = cluster("kubeConfig: {location: eu-1-kubeconfig}\nlabels: {region: eu, nvidia.com/gpu.product: H100}\nschedulerName: numa-aware");
    assert_eq!(
        c.kube_config.location_type,
        LocationType::Secret,
        "the default"
    );
    c.validate().unwrap();
    cluster("kubeConfig: {location: /etc/switchyard/eu-1, locationType: Path}")
        .validate()
        .unwrap();
    let cases = [
        (
            "kubeConfig: {location: ''}",
            "kubeConfig.location: must not be empty",
        ),
        ("kubeConfig: {location: /etc/kc}", "is not a Secret name"),
        (
            "kubeConfig: {location: kc, locationType: Path}",
            "is not an absolute path",
        ),
        (
            "kubeConfig: {location: kc}\nlabels: {'a b': x}",
            "labels: key \"a b\"",
        ),
        (
            "kubeConfig: {location: kc}\nlabels: {a: 'x y'}",
            "labels[a]: \"x y\"",
        ),
        (
            "kubeConfig: {location: kc}\nschedulerName: Default",
            "schedulerName: \"Default\"",
        ),
    ];
    for (yaml, want) in cases {
        let errs = cluster(yaml).validate().unwrap_err();
        assert!(errs.iter().any(|e| e.contains(want)), "{yaml:?}: {errs:?}");
    }
    let err =
        serde_yaml::from_str::<WorkerClusterSpec>("kubeConfig: {location: kc, locationType: Env}")
            .unwrap_err()
            .to_string();
    assert!(err.contains("Secret") && err.contains("Path"), "{err}");
}

#[test]
fn worker_cluster_status_reads_as_written() {
    let status: WorkerClusterStatus = serde_json::from_value(json!({
        "conditions": [{
            "type": "Active", "status": "False", "reason": "ClientConnectionFailed",
            "message": "dial tcp 10.0.0.1:6443: connection refused",
            "lastTransitionTime": "2025-01-01T00:00:00Z",
        }],
        "summary": {
            "nodes": 3, "numaAwareNodes": 2,
            "allocatable": {"cpu": "96", "memory": "384Gi"},
            "largestFreeOnNode": {"cpu": 32},
            "largestFreeInNumaZone": {"cpu": "16"},
            "lastSyncTime": "2025-01-01T00:00:00Z",
        },
        "connection": {"disconnectedSince": "2025-01-01T00:00:00Z", "attempts": 4},
    }))
    .unwrap();
    assert!(!status.is_active());
    let summary = status.summary.as_ref().unwrap();
    assert_eq!(summary.largest_free_on_node["cpu"], Quantity("32".into()));
    assert_eq!(status.connection.as_ref().unwrap().attempts, 4);
    let back = serde_json::to_value(&status).unwrap();
    assert_eq!(back["summary"]["numaAwareNodes"], 2);
    assert_eq!(
        back["connection"].get("lastError"),
        None,
        "absent stays absent"
    );
}

fn at(rfc3339: &str) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    serde_json::from_value(json!(rfc3339)).unwrap()
}

#[test]
fn set_condition_keeps_the_transition_time_while_the_status_holds() {
    let t0 = at("2025-01-01T00:00:00Z");
    let t1 = at("2025-01-01T00:05:00Z");
    let mut conditions = Vec::new();
    let active =
        |status, reason, now| condition(CONDITION_ACTIVE, status, reason, "m", now, Some(1));
    assert!(set_condition(
        &mut conditions,
        active(false, cluster_reason::BAD_KUBE_CONFIG, t0.clone())
    ));
    assert!(
        !set_condition(
            &mut conditions,
            active(false, cluster_reason::BAD_KUBE_CONFIG, t1.clone())
        ),
        "nothing changed"
    );
    assert!(set_condition(
        &mut conditions,
        active(false, cluster_reason::CLIENT_CONNECTION_FAILED, t1.clone())
    ));
    assert_eq!(
        conditions[0].last_transition_time, t0,
        "still False since t0"
    );
    assert_eq!(conditions[0].reason, "ClientConnectionFailed");
    assert!(set_condition(
        &mut conditions,
        active(true, cluster_reason::CONNECTED, t1.clone())
    ));
    assert_eq!(conditions[0].last_transition_time, t1);
    assert_eq!(conditions[0].status, "True");
    assert_eq!(conditions.len(), 1);
    let status = WorkerClusterStatus {
        conditions,
        ..Default::default()
    };
    assert!(status.is_active());
}

#[test]
fn the_crds_are_two_deterministic_documents() {
    let yaml = crds_yaml();
    assert_eq!(yaml, crds_yaml());
    assert!(yaml.starts_with("---\n"));
    assert_eq!(yaml.matches("\n---\n").count(), 1);
    let names: Vec<String> = crds()
        .iter()
        .map(|c| c.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "workerclusters.switchyard.dev",
            "dispatchqueues.switchyard.dev"
        ]
    );
}

#[test]
fn a_scenario_queue_takes_the_keys_of_the_crd_spec_and_its_name() {
    use kube::CustomResourceExt as _;
    let crd = serde_json::to_value(DispatchQueue::crd()).unwrap();
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let mut keys: Vec<String> = spec["properties"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .chain(["name".to_string()])
        .collect();
    keys.sort();
    assert_eq!(super::dispatch_queue::named_queue_keys(), keys);
}

#[test]
fn a_scenario_queue_refuses_a_key_that_is_not_a_setting_and_says_where() {
    #[derive(serde::Deserialize, Debug)]
    struct Scenario {
        #[allow(dead_code)]
        queues: Vec<NamedQueueSpec>,
    }
    let error = |line4: &str| {
        let text = format!("queues:\n  - name: a\n    clusters: [c]\n    {line4}\n");
        serde_yaml::from_str::<Scenario>(&text)
            .unwrap_err()
            .to_string()
    };
    let e = error("starvatoinAfter: 5m");
    assert!(
        e.contains("queues[0]: unknown field `starvatoinAfter`"),
        "{e}"
    );
    assert!(e.contains("line 4"), "{e}");
    // A mistake inside a setting is reported at the setting, not at the queue.
    let e = error("placement: {strategy: Least}");
    assert!(
        e.contains("queues[0].placement.strategy: unknown variant `Least`"),
        "{e}"
    );
    assert!(e.contains("line 4"), "{e}");
}

#[test]
fn a_scenario_queue_and_the_crd_spec_default_alike() {
    // The queue entry's fields are spelled out beside the CRD spec's: what they leave out
    // must default the same, from a bare entry to the shared format's example.
    #[derive(serde::Deserialize)]
    struct Scenario {
        queues: Vec<serde_yaml::Mapping>,
    }
    let mut entries = vec![serde_yaml::from_str("{name: a, clusters: [c]}").unwrap()];
    entries.extend(serde_yaml::from_str::<Scenario>(SCENARIO).unwrap().queues);
    entries.push(
        serde_yaml::from_str("{name: b, clusters: [c], waitForPodsReady: {enabled: true}}")
            .unwrap(),
    );
    for entry in entries {
        let named: NamedQueueSpec =
            serde_yaml::from_value(serde_yaml::Value::Mapping(entry.clone())).unwrap();
        let mut spec = entry;
        spec.remove("name");
        let crd: DispatchQueueSpec =
            serde_yaml::from_value(serde_yaml::Value::Mapping(spec)).unwrap();
        assert_eq!(named.spec, crd);
    }
}
