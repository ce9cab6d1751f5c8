use super::*;

const HEAD: &str = r#"
clusters:
  - name: gpu
    nodes:
      - {name: gpu-1, allocatable: {cpu: "64", memory: 256Gi, nvidia.com/gpu: "8", pods: "110"}}
queues:
  - name: training
    clusters: [gpu]
jobs:
"#;

const GPU_POD: &str = r#"{containers: [{name: c, resources: {requests: {cpu: "2", memory: 8Gi, nvidia.com/gpu: "1"}}}]}"#;
const CPU_POD: &str =
    r#"{containers: [{name: c, resources: {requests: {cpu: "1", memory: 1Gi}}}]}"#;

fn with_jobs(jobs: &str) -> String {
    format!("{HEAD}{jobs}")
}

fn error(jobs: &str) -> String {
    match parse(&with_jobs(jobs)) {
        Ok(_) => panic!("refused: {jobs}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_jobset_is_one_gang_of_every_pod_of_every_replicated_job() {
    let s = parse(&with_jobs(&format!(
        r#"
  - name: train
    kind: JobSet
    queue: training
    submitAt: 0s
    duration: 10m
    replicatedJobs:
      - {{name: leader, parallelism: 2, template: {GPU_POD}}}
      - {{name: workers, replicas: 3, parallelism: 4, completions: 2, template: {GPU_POD}}}
      - {{name: single, template: {GPU_POD}}}
  - {{name: plain, queue: training, submitAt: 0s, parallelism: 2, duration: 1m, template: {GPU_POD}}}
"#
    )))
    .unwrap();
    let train = &s.jobs[0];
    assert!(train.is_jobset());
    assert_eq!(train.key().to_string(), "JobSet default/train");
    let parts: Vec<(&str, u32, u32)> = train
        .parts
        .iter()
        .map(|p| (p.name.as_str(), p.jobs, p.pods_per_job))
        .collect();
    // Completions below parallelism: a workers Job runs 2 pods at once.
    assert_eq!(
        parts,
        [("leader", 1, 2), ("workers", 3, 2), ("single", 1, 1)]
    );
    assert_eq!(train.pods(), 2 + 6 + 1);
    assert_eq!((train.parallelism, train.completions), (9, 9));
    let workers = &train.replicated_jobs[1];
    assert_eq!(
        (workers.replicas, workers.parallelism, workers.completions),
        (3, 4, 2)
    );
    assert!(train.extra.is_empty());
    // One shape, no pods beside it; keyed as the dispatcher keys it, by all its templates.
    assert!(
        Arc::ptr_eq(&train.pod, &s.jobs[1].pod),
        "one template, analysed once"
    );
    assert_ne!(train.shape_key, s.jobs[1].shape_key);
    assert_eq!(s.jobs[1].key().to_string(), "default/plain");
    assert_eq!(s.jobs[1].kind, Kind::Job);
    assert_eq!(s.jobs[1].pods(), 2);
}

#[test]
fn a_jobset_of_pods_of_different_shapes_is_the_dispatchers_gang_of_them() {
    let s = parse(&with_jobs(&format!(
        r#"
  - name: mixed
    kind: JobSet
    queue: training
    submitAt: 0s
    duration: 10m
    replicatedJobs:
      - {{name: driver, template: {CPU_POD}}}
      - {{name: workers, replicas: 2, template: {GPU_POD}}}
  - {{name: cpu, queue: training, submitAt: 0s, parallelism: 3, duration: 1m, template: {CPU_POD}}}
"#
    )))
    .unwrap();
    let mixed = &s.jobs[0];
    assert_eq!(mixed.pods(), 3);
    // The main shape is the one most pods ask for; the driver's pod is placed beside them.
    assert!(mixed.pod.node_request.contains_key("nvidia.com/gpu"));
    assert_eq!(mixed.extra.len(), 1);
    assert_eq!(mixed.extra[0].pods, 1);
    assert!(!mixed.extra[0]
        .shape
        .node_request
        .contains_key("nvidia.com/gpu"));
    assert_eq!(mixed.shapes().count(), 2);
    // Not one admission class with a Job of the driver's pods, as many of them.
    assert_eq!(mixed.pods(), s.jobs[1].pods());
    assert_ne!(mixed.shape_key, s.jobs[1].shape_key);
}

#[test]
fn bad_jobsets_are_named_with_what_to_do() {
    let cases = [
        (
            "  - {name: a, kind: JobSet, queue: training, submitAt: 0s, duration: 1m}".to_string(),
            "jobs[0] (a): replicatedJobs: a JobSet needs at least one replicated Job",
        ),
        (
            "  - {name: a, kind: JobSet, queue: training, submitAt: 0s, duration: 1m, replicatedJobs: []}"
                .to_string(),
            "jobs[0] (a): replicatedJobs: a JobSet needs at least one replicated Job",
        ),
        (
            format!("  - {{name: a, kind: JobSet, queue: training, submitAt: 0s, duration: 1m, parallelism: 2, replicatedJobs: [{{name: w, template: {GPU_POD}}}]}}"),
            "jobs[0] (a): parallelism: a JobSet has none of its own: give it in each of its replicatedJobs",
        ),
        (
            format!("  - {{name: a, kind: JobSet, queue: training, submitAt: 0s, duration: 1m, template: {GPU_POD}, replicatedJobs: [{{name: w, template: {GPU_POD}}}]}}"),
            "jobs[0] (a): template: a JobSet has none of its own",
        ),
        (
            format!("  - {{name: a, kind: JobSet, queue: training, submitAt: 0s, duration: 1m, replicatedJobs: [{{name: w, template: {GPU_POD}}}, {{name: w, replicas: 2, template: {GPU_POD}}}]}}"),
            r#"jobs[0] (a): replicatedJobs[1] (w).name: two replicated Jobs are named "w""#,
        ),
        (
            format!("  - {{name: a, kind: JobSet, queue: training, submitAt: 0s, duration: 1m, replicatedJobs: [{{name: W_1, template: {GPU_POD}}}]}}"),
            r#"jobs[0] (a): replicatedJobs[0] (W_1).name: "W_1" is not a DNS-1123 label"#,
        ),
        (
            format!("  - {{name: a, kind: JobSet, queue: training, submitAt: 0s, duration: 1m, replicatedJobs: [{{name: w, replicas: 0, template: {GPU_POD}}}]}}"),
            "jobs[0] (a): replicatedJobs[0] (w).replicas: must be at least 1",
        ),
        (
            format!("  - {{name: a, kind: JobSet, queue: training, submitAt: 0s, duration: 1m, replicatedJobs: [{{name: w, parallelism: 2, completions: 0, template: {GPU_POD}}}]}}"),
            "jobs[0] (a): replicatedJobs[0] (w).completions: must be at least 1",
        ),
        (
            "  - {name: a, kind: JobSet, queue: training, submitAt: 0s, duration: 1m, replicatedJobs: [{name: w}]}"
                .to_string(),
            "jobs[0] (a): replicatedJobs[0] (w).template: needs at least one container",
        ),
        (
            format!("  - {{name: a, kind: JobSet, queue: training, submitAt: 0s, duration: 1m, replicatedJobs: [{{name: w, replica: 2, template: {GPU_POD}}}]}}"),
            "unknown field `replica`, expected one of `name`, `replicas`, `parallelism`, `completions`, `template`",
        ),
        (
            format!("  - {{name: a, kind: Deployment, queue: training, submitAt: 0s, duration: 1m, parallelism: 1, template: {GPU_POD}}}"),
            "unknown variant `Deployment`, expected `Job` or `JobSet`",
        ),
        (
            format!("  - {{name: a, queue: training, submitAt: 0s, duration: 1m, replicatedJobs: [{{name: w, template: {GPU_POD}}}]}}"),
            "jobs[0] (a): replicatedJobs: only a JobSet has replicated Jobs (add `kind: JobSet`",
        ),
        (
            format!("  - {{name: a, kind: Job, queue: training, submitAt: 0s, duration: 1m, template: {GPU_POD}}}"),
            "jobs[0] (a): parallelism: required for a Job",
        ),
        (
            format!("  - {{name: a, kind: JobSet, queue: training, submitAt: 0s, duration: 1m, replicatedJobs: [{{name: w, replicas: 6000, template: {GPU_POD}}}, {{name: x, replicas: 4001, template: {GPU_POD}}}]}}"),
            "jobs[0] (a): replicatedJobs: 10001 Jobs in all, more than simulate runs in one JobSet (10000)",
        ),
        (
            format!("  - {{name: a, kind: JobSet, queue: training, submitAt: 0s, duration: 1m, replicatedJobs: [{{name: w, replicas: 2, parallelism: 4000000000, template: {GPU_POD}}}]}}"),
            "jobs[0] (a): replicatedJobs: 2 replicas of 4000000000 pods each is more than 4294967295 pods",
        ),
        (
            format!("  - {{name: a, queue: training, submitAt: 0s, duration: 1m, parallelism: 1, template: {GPU_POD}}}\n  - {{name: a, kind: JobSet, queue: training, submitAt: 0s, duration: 1m, replicatedJobs: [{{name: w, template: {GPU_POD}}}]}}"),
            "jobs[1] (a): name: default/a appears twice",
        ),
    ];
    for (jobs, want) in cases {
        let got = error(&jobs);
        assert!(got.contains(want), "{jobs}\n  said: {got}\n  want: {want}");
    }
}

#[test]
fn the_jobset_of_the_docs_parses_as_they_say() {
    let doc = include_str!("../../../docs/simulate.md");
    let section = &doc[doc.find("## JobSets").expect("a JobSets section")..];
    let start = section.find("```yaml\n").expect("a YAML example") + "```yaml\n".len();
    let end = start + section[start..].find("```").expect("its end");
    let jobs = section[start..end]
        .strip_prefix("jobs:\n")
        .expect("a list of jobs");
    let s = parse(&with_jobs(jobs)).expect("the documented JobSet parses");
    let pretrain = &s.jobs[0];
    assert!(pretrain.is_jobset());
    assert_eq!(pretrain.pods(), 8, "as the docs count it");
    assert!(pretrain.extra.is_empty());
}

/// A scenario whose one cluster has `kueue:` as given (YAML, indented for a cluster field).
fn with_kueue(kueue: &str) -> Result<Scenario, ScenarioError> {
    parse(&format!(
        r#"
clusters:
  - name: gpu
    nodes:
      - {{name: gpu-1, allocatable: {{cpu: "64", memory: 256Gi, nvidia.com/gpu: "8", pods: "110"}}}}
    kueue: {kueue}
  - name: plain
    nodes:
      - {{name: plain-1, allocatable: {{cpu: "8", memory: 32Gi, pods: "110"}}}}
queues:
  - name: training
    clusters: [gpu, plain]
jobs:
  - {{name: a, namespace: research, queue: training, submitAt: 0s, parallelism: 1, duration: 1m, template: {CPU_POD}}}
  - {{name: b, queue: training, submitAt: 0s, parallelism: 1, duration: 1m, template: {CPU_POD}}}
"#
    ))
}

#[test]
fn a_cluster_s_kueue_is_its_quota_queue_name_and_local_workloads() {
    let s = with_kueue(
        r#"{quota: {cpu: "32", memory: 128Gi, nvidia.com/gpu: 4}, localWorkloads: [{submitAt: 1m, duration: 10m, request: {cpu: 500m}, priority: 3}]}"#,
    )
    .unwrap();
    let k = s.kueue("gpu").expect("gpu runs Kueue");
    assert_eq!(k.local_queue, DEFAULT_LOCAL_QUEUE);
    assert_eq!(
        k.quota,
        BTreeMap::from([
            ("cpu".to_string(), 32_000),
            ("memory".to_string(), 128_000 << 30),
            ("nvidia.com/gpu".to_string(), 4_000),
        ])
    );
    assert!(k.strict, "StrictFIFO unless told otherwise");
    assert_eq!(
        k.local_workloads,
        [LocalWorkload {
            submit_at: Duration::from_secs(60),
            duration: Duration::from_secs(600),
            request: BTreeMap::from([("cpu".to_string(), 500)]),
            priority: 3,
        }]
    );
    assert!(s.kueue("plain").is_none());
    assert!(s.has_kueue());
    assert_eq!(s.namespaces(), ["default", "research"]);

    let s = with_kueue(
        r#"{quota: {cpu: "8"}, localQueueName: user-queue, queueingStrategy: BestEffortFIFO}"#,
    )
    .unwrap();
    let k = s.kueue("gpu").unwrap();
    assert_eq!((k.local_queue.as_str(), k.strict), ("user-queue", false));
    assert!(!with_kueue("null").unwrap().has_kueue());
}

#[test]
fn a_bad_kueue_is_named_with_what_to_do() {
    let cases = [
        ("{quota: {}}", "clusters[0] (gpu): kueue.quota: give the ClusterQueue's nominal quota of at least one resource"),
        ("{}", "missing field `quota`"),
        (r#"{quota: {cpu: lots}}"#, r#"clusters[0] (gpu): kueue.quota.cpu: "lots" is not a Kubernetes quantity"#),
        (r#"{quota: {cpu: "-1"}}"#, r#"kueue.quota.cpu: "-1" is negative"#),
        (r#"{quota: {cpu: "8"}, localQueueName: User_Queue}"#, r#"kueue.localQueueName: "User_Queue" is not a DNS-1123 subdomain"#),
        (r#"{quota: {cpu: "8"}, queueingStrategy: Fair}"#, "unknown variant `Fair`, expected `StrictFIFO` or `BestEffortFIFO`"),
        (r#"{quota: {cpu: "8"}, cohort: all}"#, "unknown field `cohort`"),
        (r#"{quota: {cpu: "8"}, localWorkloads: [{submitAt: 0s, duration: 1m, request: {}}]}"#, "kueue.localWorkloads[0].request: give what it takes of the quota"),
        (r#"{quota: {cpu: "8"}, localWorkloads: [{submitAt: 0s, duration: 1m, request: {memory: 1Gi}}]}"#, "kueue.localWorkloads[0].request: memory is not in the quota: Kueue would never admit it"),
        (r#"{quota: {cpu: "8"}, localWorkloads: [{submitAt: soon, duration: 1m, request: {cpu: 1}}]}"#, "kueue.localWorkloads[0].submitAt: "),
        (r#"{quota: {cpu: "8"}, localWorkloads: [{submitAt: 0s, duration: 1m, request: {cpu: x}}]}"#, r#"kueue.localWorkloads[0].request.cpu: "x" is not a Kubernetes quantity"#),
    ];
    for (kueue, want) in cases {
        let got = match with_kueue(kueue) {
            Ok(_) => panic!("accepted: {kueue}"),
            Err(e) => e.to_string(),
        };
        assert!(got.contains(want), "{kueue}\n  said: {got}\n  want: {want}");
    }
}

/// Jobs with the same pod template share one shape (and so one admission class), whether the
/// template is written inline or in block style, while a template that differs in what the
/// engine reads (its requests, a toleration) gets a shape of its own.
#[test]
fn identical_pod_templates_share_one_shape_and_different_ones_do_not() {
    let s = parse(&with_jobs(&format!(
        r#"
  - {{name: a, queue: training, submitAt: 0s, parallelism: 1, duration: 1m, template: {GPU_POD}}}
  - name: b
    queue: training
    submitAt: 1s
    parallelism: 1
    duration: 1m
    template:
      containers:
        - name: c
          resources:
            requests: {{cpu: "2", memory: 8Gi, nvidia.com/gpu: "1"}}
  - {{name: c, queue: training, submitAt: 2s, parallelism: 1, duration: 1m, template: {CPU_POD}}}
  - {{name: d, queue: training, submitAt: 3s, parallelism: 1, duration: 1m, template: {{containers: [{{name: c, resources: {{requests: {{cpu: "4", memory: 8Gi, nvidia.com/gpu: "1"}}}}}}]}}}}
  - {{name: e, queue: training, submitAt: 4s, parallelism: 1, duration: 1m, template: {{containers: [{{name: c, resources: {{requests: {{cpu: "2", memory: 8Gi, nvidia.com/gpu: "1"}}}}}}], tolerations: [{{key: gpu, operator: Exists}}]}}}}
  - {{name: f, queue: training, submitAt: 5s, parallelism: 1, duration: 1m, template: {CPU_POD}}}
"#
    )))
    .unwrap();
    let key = |name: &str| {
        let j = s.jobs.iter().find(|j| j.name == name).unwrap();
        j.shape_key
    };
    assert_eq!(key("a"), key("b"));
    assert_eq!(key("c"), key("f"));
    let distinct: BTreeSet<u64> = ["a", "c", "d", "e"].into_iter().map(key).collect();
    assert_eq!(distinct.len(), 4, "a, c, d and e ask for different pods");
}

#[test]
fn a_byte_order_mark_is_read_past_and_an_empty_or_clusterless_scenario_is_refused() {
    // Some editors start a UTF-8 file with one; the YAML parser took it for a first document.
    let text = format!("\u{feff}{}", with_jobs(&format!(
        "  - {{name: a, queue: training, submitAt: 0s, duration: 1m, parallelism: 1, template: {CPU_POD}}}"
    )));
    assert_eq!(parse(&text).unwrap().jobs.len(), 1);
    for empty in ["", "\u{feff}", "clusters: []\njobs: []\n"] {
        let err = parse(empty).unwrap_err().to_string();
        assert!(
            err.contains("a scenario needs at least one cluster"),
            "{empty:?}: {err}"
        );
    }
}

#[test]
fn a_node_named_twice_in_a_cluster_is_refused() {
    let text = HEAD.replace(
        "      - {name: gpu-1,",
        "      - {name: gpu-1, allocatable: {cpu: \"1\"}}\n      - {name: gpu-1,",
    );
    let err = parse(&text).unwrap_err().to_string();
    assert!(
        err.contains("cluster gpu node gpu-1") && err.contains("appears twice"),
        "{err}"
    );
}

#[test]
fn a_bad_template_is_named_by_its_field_not_as_a_pod_without_a_name() {
    let err = error(
        r#"  - {name: a, queue: training, submitAt: 0s, duration: 1m, parallelism: 1, template: {containers: [{name: c, resources: {requests: {cpu: x}}}]}}"#,
    );
    assert!(
        err.ends_with(r#"jobs[0] (a): template: container c: resource cpu: "x" is not a Kubernetes quantity (e.g. 500m, 2, 64Gi, 1.5G)"#),
        "{err}"
    );
}
