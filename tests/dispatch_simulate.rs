//! The dispatcher end to end through `switchyard simulate`: small scenarios, as a user would
//! write them, run on simulated workers in virtual time, and what the report says.

use k8s_openapi::api::batch::v1::JobStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use switchyard::simulate::report::JobReport;
use switchyard::simulate::worker::BACKOFF_LIMIT;
use switchyard::simulate::{self, scenario, Report, Simulation, Strategy};

fn run(yaml: &str, strategy: Strategy) -> Report {
    let s = scenario::parse(yaml).expect("the test scenario parses");
    Simulation::new(&s, strategy).with_events().run()
}

fn job<'a>(report: &'a Report, name: &str) -> &'a JobReport {
    report
        .jobs
        .iter()
        .find(|j| j.name == name)
        .unwrap_or_else(|| panic!("{name} is in the report"))
}

fn seconds(v: &serde_json::Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("{v} is a time"))
}

/// The decisions about `subject` (`default/<name>: `, after its kind for a JobSet): each
/// one's virtual time and description.
fn decisions<'r>(report: &'r Report, subject: &str) -> Vec<(f64, &'r str)> {
    report
        .events
        .iter()
        .filter_map(|line| {
            let (t, rest) = line.trim().split_once("s  ")?;
            let rest = rest.strip_prefix(subject)?;
            Some((t.parse().expect("a time"), rest))
        })
        .collect()
}

/// The virtual times of the decisions about `job` whose description starts with `what`.
fn times(report: &Report, job: &str, what: &str) -> Vec<f64> {
    decisions(report, &format!("default/{job}: "))
        .into_iter()
        .filter(|(_, d)| d.starts_with(what))
        .map(|(t, _)| t)
        .collect()
}

/// Two GPU workers with 4 free GPUs each, behind kubelets running single-numa-node: `west`
/// has one GPU per NUMA zone, `east` two. A gang of two pods with two GPUs each fits only
/// in `east`, though `west` looks bigger (more CPUs) and has as many GPUs.
const NUMA: &str = r#"
clusters:
  - name: west
    nodes:
      - name: west-1
        allocatable: {cpu: "64", memory: 256Gi, nvidia.com/gpu: "4", pods: "110"}
        topology:
          attributes:
            - {name: topologyManagerPolicy, value: single-numa-node}
            - {name: topologyManagerScope, value: pod}
          zones:
            - {name: node-0, type: Node, resources: [{name: cpu, capacity: "16", allocatable: "16", available: "16"}, {name: memory, capacity: 64Gi, allocatable: 64Gi, available: 64Gi}, {name: nvidia.com/gpu, capacity: "1", allocatable: "1", available: "1"}]}
            - {name: node-1, type: Node, resources: [{name: cpu, capacity: "16", allocatable: "16", available: "16"}, {name: memory, capacity: 64Gi, allocatable: 64Gi, available: 64Gi}, {name: nvidia.com/gpu, capacity: "1", allocatable: "1", available: "1"}]}
            - {name: node-2, type: Node, resources: [{name: cpu, capacity: "16", allocatable: "16", available: "16"}, {name: memory, capacity: 64Gi, allocatable: 64Gi, available: 64Gi}, {name: nvidia.com/gpu, capacity: "1", allocatable: "1", available: "1"}]}
            - {name: node-3, type: Node, resources: [{name: cpu, capacity: "16", allocatable: "16", available: "16"}, {name: memory, capacity: 64Gi, allocatable: 64Gi, available: 64Gi}, {name: nvidia.com/gpu, capacity: "1", allocatable: "1", available: "1"}]}
  - name: east
    nodes:
      - name: east-1
        allocatable: {cpu: "32", memory: 256Gi, nvidia.com/gpu: "4", pods: "110"}
        topology:
          attributes:
            - {name: topologyManagerPolicy, value: single-numa-node}
            - {name: topologyManagerScope, value: pod}
          zones:
            - {name: node-0, type: Node, resources: [{name: cpu, capacity: "16", allocatable: "16", available: "16"}, {name: memory, capacity: 128Gi, allocatable: 128Gi, available: 128Gi}, {name: nvidia.com/gpu, capacity: "2", allocatable: "2", available: "2"}]}
            - {name: node-1, type: Node, resources: [{name: cpu, capacity: "16", allocatable: "16", available: "16"}, {name: memory, capacity: 128Gi, allocatable: 128Gi, available: 128Gi}, {name: nvidia.com/gpu, capacity: "2", allocatable: "2", available: "2"}]}
queues:
  - name: training
    clusters: [west, east]
jobs:
  - name: train
    queue: training
    submitAt: 0s
    parallelism: 2
    duration: 10m
    podStartDelay: 30s
    template:
      containers:
        - name: trainer
          resources:
            requests: {cpu: "4", memory: 16Gi, nvidia.com/gpu: "2"}
            limits: {cpu: "4", memory: 16Gi, nvidia.com/gpu: "2"}
"#;

#[test]
fn a_gang_runs_in_the_one_worker_where_it_fits_numa_aligned() {
    let report = run(NUMA, Strategy::Switchyard);
    let train = job(&report, "train");
    assert_eq!(train.cluster.as_deref(), Some("east"));
    assert_eq!(train.result, "Succeeded");
    assert_eq!(train.requeues, 0);
    assert_eq!(report.summary.topology_affinity_errors, 0);
    assert_eq!(times(&report, "train", "dispatched to worker east"), [0.0]);
    assert!(times(&report, "train", "dispatched to worker west").is_empty());
    assert_eq!(seconds(&train.finished), 630.0, "30s to start, 10m to run");

    // Judged by the sum of free resources, as a virtual node per cluster would, the same
    // gang goes to the bigger-looking worker and its kubelets reject the pods.
    let naive = run(NUMA, Strategy::SumAggregate);
    assert_eq!(job(&naive, "train").cluster.as_deref(), Some("west"));
    assert!(naive.summary.topology_affinity_errors > 0);
    assert_eq!(job(&naive, "train").result, "Failed");
}

#[test]
fn a_burst_of_jobs_runs_within_the_queue_quota() {
    // 10 CPUs of quota and 3-CPU Jobs: at most three run at once, though the worker could
    // hold twenty.
    let mut yaml = String::from(
        r#"
clusters:
  - name: cpu
    nodes:
      - {name: cpu-1, allocatable: {cpu: "32", memory: 128Gi, pods: "110"}}
      - {name: cpu-2, allocatable: {cpu: "32", memory: 128Gi, pods: "110"}}
queues:
  - name: batch
    clusters: [cpu]
    quota: {cpu: "10"}
jobs:
"#,
    );
    for i in 0..60 {
        yaml += &format!(
            "  - {{name: b{i:02}, queue: batch, submitAt: 0s, parallelism: 1, duration: 1m, template: {{containers: [{{name: c, resources: {{requests: {{cpu: \"3\", memory: 1Gi}}}}}}]}}}}\n"
        );
    }
    let report = run(&yaml, Strategy::Switchyard);
    assert_eq!(report.summary.succeeded, 60);
    assert_eq!(report.summary.pending, 0);
    assert_eq!(
        report.summary.max_quota_usage["batch"]["cpu"],
        serde_json::json!(0.9),
        "9 of the 10 CPUs at most"
    );
    // Three at a time, a minute each: twenty rounds.
    assert_eq!(seconds(&report.summary.makespan), 1200.0);
    let mut starts: Vec<f64> = report.jobs.iter().map(|j| seconds(&j.started)).collect();
    starts.sort_by(f64::total_cmp);
    for (i, round) in starts.chunks(3).enumerate() {
        assert_eq!(round, [60.0 * i as f64; 3], "round {i}");
    }
}

#[test]
fn a_job_that_never_gets_ready_is_requeued_with_backoff_then_given_up() {
    // Its image takes 10 minutes to pull; the queue waits 1 minute. Back-off 30s, 60s
    // capped at 45s; two requeues allowed.
    let yaml = r#"
clusters:
  - name: cpu
    nodes:
      - {name: cpu-1, allocatable: {cpu: "8", memory: 32Gi, pods: "110"}}
queues:
  - name: batch
    clusters: [cpu]
    waitForPodsReady:
      enabled: true
      timeout: 1m
      requeuing: {backoffBase: 30s, backoffMax: 45s, limit: 2}
jobs:
  - name: slow
    queue: batch
    submitAt: 0s
    parallelism: 2
    duration: 1m
    podStartDelay: 10m
    template: {containers: [{name: c, resources: {requests: {cpu: "1", memory: 1Gi}}}]}
  - name: quick
    queue: batch
    submitAt: 0s
    parallelism: 1
    duration: 1m
    podStartDelay: 5s
    template: {containers: [{name: c, resources: {requests: {cpu: "1", memory: 1Gi}}}]}
"#;
    let report = run(yaml, Strategy::Switchyard);
    let slow = job(&report, "slow");
    assert_eq!(slow.result, "Deactivated");
    assert_eq!(slow.requeues, 2);
    assert!(slow
        .reason
        .as_deref()
        .is_some_and(|r| r.contains("given up after 2 requeues")));
    // Admitted at 0, timed out at 60; back 30s later, out at 150; back 45s later (60s
    // capped), out at 255 for good.
    assert_eq!(times(&report, "slow", "dispatched"), [0.0, 90.0, 195.0]);
    assert_eq!(times(&report, "slow", "requeued"), [60.0, 150.0]);
    assert_eq!(times(&report, "slow", "deactivated"), [255.0]);
    assert_eq!(
        times(&report, "slow", "removing its copy"),
        [60.0, 150.0, 255.0]
    );
    // The other Job of the queue is not held back by it.
    let quick = job(&report, "quick");
    assert_eq!(quick.result, "Succeeded");
    assert_eq!(quick.requeues, 0);
    assert_eq!(seconds(&quick.finished), 65.0);
}

/// A Job requeued and still in back-off when the run ends says so: not "never admitted".
#[test]
fn a_job_in_back_off_when_the_run_ends_says_it_was_requeued() {
    // Its pods are never Ready within the timeout; the back-off outlasts the run.
    let yaml = r#"
clusters:
  - name: cpu
    nodes:
      - {name: cpu-1, allocatable: {cpu: "8", memory: 32Gi, pods: "110"}}
queues:
  - name: batch
    clusters: [cpu]
    waitForPodsReady:
      enabled: true
      timeout: 1m
      requeuing: {backoffBase: 9000h, backoffMax: 9000h}
jobs:
  - {name: slow, queue: batch, submitAt: 0s, parallelism: 1, duration: 1m, podStartDelay: 10m,
     template: {containers: [{name: c, resources: {requests: {cpu: "1", memory: 1Gi}}}]}}
"#;
    let report = run(yaml, Strategy::Switchyard);
    let slow = job(&report, "slow");
    assert_eq!((slow.result.as_str(), slow.requeues), ("Pending", 1));
    let reason = slow.reason.as_deref().unwrap_or_default();
    assert!(
        reason.starts_with("requeued once, and not admitted again when the simulation ended"),
        "{reason}"
    );
}

#[test]
fn the_bundled_example_ends_as_its_comments_say() {
    let s = scenario::parse(scenario::BUNDLED).expect("the bundled scenario parses");
    let report = Simulation::new(&s, Strategy::Switchyard)
        .with_events()
        .run();
    // Only gpu-east can run train-b, 2 pods × 2 GPUs NUMA-aligned.
    let train_b = job(&report, "train-b");
    assert_eq!(train_b.cluster.as_deref(), Some("gpu-east"));
    assert_eq!(train_b.result, "Succeeded");
    assert_eq!(report.summary.topology_affinity_errors, 0);
    // slow-start is requeued up to its queue's limit, then given up.
    let slow = job(&report, "slow-start");
    assert_eq!(slow.result, "Deactivated");
    assert_eq!(slow.requeues, 2);
    // report fails by itself; everything else succeeds.
    assert_eq!(job(&report, "report").result, "Failed");
    for name in ["train-a", "etl-1", "etl-2", "etl-3"] {
        assert_eq!(job(&report, name).result, "Succeeded", "{name}");
    }
    // The batch queue's 48 CPUs are used up at times, never exceeded.
    let batch = &report.summary.max_quota_usage["batch"];
    assert_eq!(batch["cpu"], serde_json::json!(1));
    assert!(batch.values().all(|v| v.as_f64().is_some_and(|x| x <= 1.0)));

    // Quota waits: the batch queue's CPUs in use over time, from what was dispatched and
    // what ended.
    let cpus = |name: &str| -> f64 {
        let j = s.jobs.iter().find(|j| j.name == name).unwrap();
        f64::from(j.parallelism.min(j.completions)) * j.pod.node_request["cpu"] as f64 / 1000.0
    };
    let batch_jobs = ["etl-1", "etl-2", "etl-3", "slow-start", "report"];
    let mut changes: Vec<(f64, f64)> = Vec::new();
    for name in batch_jobs {
        for t in times(&report, name, "dispatched") {
            changes.push((t, cpus(name)));
        }
        for what in ["Succeeded", "Failed", "requeued", "deactivated"] {
            for t in times(&report, name, what) {
                changes.push((t, -cpus(name)));
            }
        }
    }
    changes.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
    let in_use_at = |t: f64| -> f64 { changes.iter().filter(|c| c.0 <= t).map(|c| c.1).sum() };
    // `report` (1 CPU) arrives at 300s and is dispatched only when etl-3 gives its 16 CPUs
    // back at 680s.
    let report_job = job(&report, "report");
    assert_eq!(seconds(&report_job.submitted), 300.0);
    assert_eq!(times(&report, "report", "dispatched"), [680.0]);
    assert_eq!(times(&report, "etl-3", "Succeeded"), [680.0]);
    // All that time the queue's 48 CPUs were in use, while cpu-central (64 CPUs) had room
    // for it: it waited for quota, not for a worker.
    for t in [300.0, 400.0, 609.0, 610.0, 679.0] {
        let used = in_use_at(t);
        assert_eq!(used, 48.0, "at {t}s");
        assert!(64.0 - used >= cpus("report"), "at {t}s the worker had room");
    }
}

/// Three identical workers; `a` is mostly taken by pods outside the scenario.
const THREE_WORKERS: &str = r#"
clusters:
  - name: a
    nodes:
      - {name: a-1, allocatable: {cpu: "8", memory: 32Gi, pods: "110"}, requested: {cpu: "6"}}
  - name: b
    nodes:
      - {name: b-1, allocatable: {cpu: "8", memory: 32Gi, pods: "110"}}
  - name: c
    nodes:
      - {name: c-1, allocatable: {cpu: "8", memory: 32Gi, pods: "110"}}
queues:
  - name: batch
    clusters: [a, b, c]
jobs:
  - {name: one, queue: batch, submitAt: 0s, parallelism: 2, duration: 1m, podStartDelay: 10s, template: {containers: [{name: c, resources: {requests: {cpu: "2", memory: 1Gi}}}]}}
  - {name: two, queue: batch, submitAt: 30s, parallelism: 1, duration: 1m, podStartDelay: 5s, template: {containers: [{name: c, resources: {requests: {cpu: "1", memory: 1Gi}}}]}}
"#;

#[test]
fn all_at_once_copies_to_every_worker_keeps_the_first_to_run_and_removes_the_others() {
    let report = run(THREE_WORKERS, Strategy::AllAtOnce);
    assert_eq!(report.strategy, "all-at-once");
    assert_eq!(report.summary.succeeded, 2);
    // `one` cannot start both its pods in `a`: `b` runs them first and keeps it.
    assert_eq!(times(&report, "one", "offered to workers a, b, c"), [0.0]);
    assert_eq!(
        times(&report, "one", "worker b ran all its pods first"),
        [10.0]
    );
    assert_eq!(job(&report, "one").cluster.as_deref(), Some("b"));
    for loser in ["a", "c"] {
        assert_eq!(
            times(
                &report,
                "one",
                &format!("removing its copy from worker {loser}")
            ),
            [10.0],
            "{loser}"
        );
    }
    assert_eq!(
        times(&report, "one", "removing its copy from worker b"),
        [70.0]
    );
    // `two` fits everywhere: the first worker of the queue wins the tie.
    assert_eq!(times(&report, "two", "offered to workers a, b, c"), [30.0]);
    assert_eq!(job(&report, "two").cluster.as_deref(), Some("a"));
    // Every Job: a create in each of the 3 workers, a delete in the 2 that lost, a delete in
    // the winner when it ends: 2 × workers writes.
    assert_eq!(report.summary.remote_writes_per_job, serde_json::json!(6));
    // The same trace dispatched by the exact fit: one create and one delete per Job.
    let exact = run(THREE_WORKERS, Strategy::Switchyard);
    assert_eq!(exact.summary.remote_writes_per_job, serde_json::json!(2));
    assert_eq!(exact.summary.succeeded, 2);
}

#[test]
fn the_scenario_format_example_parses() {
    let text = include_str!("data/formats/scenario.example.yaml");
    let s = scenario::parse(text).expect("the format's example parses");
    let clusters: Vec<&str> = s
        .inventory
        .clusters
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(clusters, ["eu-1", "us-1"]);
    assert_eq!(s.scheduler_name("eu-1"), None);
    assert_eq!(s.scheduler_name("us-1"), Some("switchyard-scheduler"));
    assert_eq!(s.queues.len(), 1);
    let (name, research) = &s.queues[0];
    assert_eq!(name, "research");
    assert_eq!(research.clusters, ["eu-1", "us-1"]);
    let wait = research
        .wait_for_pods_ready
        .as_ref()
        .expect("waitForPodsReady");
    assert_eq!(wait.timeout.as_secs(), 300);
    assert_eq!(wait.requeuing.limit, Some(3));
    assert_eq!(research.worker_lost_timeout.as_secs(), 900);
    let names: Vec<&str> = s.jobs.iter().map(|j| j.name.as_str()).collect();
    assert_eq!(names, ["train-a", "etl-b"]);
    let train = &s.jobs[0];
    assert_eq!((train.parallelism, train.completions), (2, 2));
    assert_eq!(train.pod_start_delay.as_secs(), 20);
    assert_eq!(train.pod.node_request["nvidia.com/gpu"], 1000);
    assert_eq!(s.jobs[1].submit_at.as_secs(), 30);
    // And it runs.
    let report = simulate::run(&s, Strategy::Switchyard);
    assert_eq!(report.jobs.len(), 2);
}

/// What the dispatcher remembers between and within passes (misfits, fits of a class, failed
/// classes, drained fits) only saves work: a busy synthetic run decides exactly the same
/// things, in the same order, with all of it forgotten at every pass.
#[test]
fn remembering_earlier_passes_changes_no_decision() {
    let text = simulate::synthetic::scenario_yaml(400, 6, 12, 3);
    let scenario = scenario::parse(&text).expect("the synthetic scenario parses");
    let with = Simulation::new(&scenario, Strategy::Switchyard)
        .with_events()
        .run();
    let without = Simulation::new(&scenario, Strategy::Switchyard)
        .with_events()
        .without_memory()
        .run();
    assert!(
        with.events.len() > 800,
        "a busy run: {} decisions",
        with.events.len()
    );
    let waited = with
        .jobs
        .iter()
        .filter(|j| seconds(&j.admitted) > seconds(&j.submitted))
        .count();
    assert!(waited > 50, "Jobs waited for room: {waited}");
    if let Some(i) = with
        .events
        .iter()
        .zip(&without.events)
        .position(|(a, b)| a != b)
    {
        panic!(
            "decision {i} differs:\n with memory:    {}\n without memory: {}",
            with.events[i], without.events[i]
        );
    }
    assert_eq!(with.events.len(), without.events.len());
}

// ---------------------------------------------------------------------------------------------
// Seed 000's "job status changes frequently".

/// `active`, `ready`, `succeeded`, `failed` of a Job status (absent: 0).
fn counts(s: &JobStatus) -> [i32; 4] {
    [s.active, s.ready, s.succeeded, s.failed].map(|c| c.unwrap_or(0))
}

fn is_true(s: &JobStatus, type_: &str) -> bool {
    s.conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == type_ && c.status == "True")
}

/// A status time as seconds since the scenario start.
fn since_start(t: Option<&Time>) -> Option<i64> {
    t.map(|t| t.0.as_second() - simulate::EPOCH_SECS as i64)
}

#[test]
fn a_job_whose_status_changes_every_second_is_mirrored_in_order_to_the_end() {
    // `busy` runs COMPLETIONS pods, PARALLELISM at a time, each Ready READY_AFTER seconds
    // after it starts and done RUNS_FOR seconds later: its copy's status changes every
    // second. `flaky`'s FLAKY_PODS pods fail until the worker's Job controller gives up.
    const PARALLELISM: u32 = 4;
    const COMPLETIONS: u32 = 30;
    const READY_AFTER: u32 = 1;
    const RUNS_FOR: u32 = 1;
    const FLAKY_PODS: i32 = 2;
    let yaml = format!(
        r#"
clusters:
  - name: only
    nodes:
      - {{name: only-1, allocatable: {{cpu: "16", memory: 64Gi, pods: "110"}}}}
queues:
  - name: batch
    clusters: [only]
jobs:
  - {{name: busy, queue: batch, submitAt: 0s, parallelism: {PARALLELISM}, completions: {COMPLETIONS}, duration: {RUNS_FOR}s, podStartDelay: {READY_AFTER}s, template: {{containers: [{{name: c, resources: {{requests: {{cpu: "1", memory: 1Gi}}}}}}]}}}}
  - {{name: flaky, queue: batch, submitAt: 0s, parallelism: {FLAKY_PODS}, duration: 5s, podStartDelay: 1s, fails: true, template: {{containers: [{{name: c, resources: {{requests: {{cpu: "1", memory: 1Gi}}}}}}]}}}}
"#
    );
    let s = scenario::parse(&yaml).expect("the test scenario parses");
    let report = Simulation::new(&s, Strategy::Switchyard)
        .with_events()
        .with_status_writes()
        .run();
    assert!(
        !report.events.iter().any(|e| e.contains("would refuse")),
        "every status written was one the API server accepts: {:#?}",
        report.events
    );
    let writes = |name: &str| -> Vec<(f64, JobStatus)> {
        let job = format!("default/{name}");
        report
            .status_writes
            .iter()
            .filter(|w| w.job == job)
            .map(|w| {
                let status = serde_json::from_value(w.status.clone()).expect("a Job status");
                (w.at, status)
            })
            .collect()
    };
    let busy = writes("busy");
    let flaky = writes("flaky");
    for (name, history) in [("busy", &busy), ("flaky", &flaky)] {
        for pair in history.windows(2) {
            assert_ne!(pair[0].1, pair[1].1, "{name}: a write that changed nothing");
        }
        // The copy is removed once the final status has reached the manager's Job: in the
        // same second, and that status is the last one written.
        let (end, last) = history.last().expect("statuses written");
        assert_eq!(
            times(
                &report,
                name,
                "removing its copy from worker only (Finished)"
            ),
            [*end],
            "{name}"
        );
        assert_eq!(seconds(&job(&report, name).finished), *end, "{name}");
        assert_eq!(since_start(last.start_time.as_ref()), Some(0), "{name}");
        assert_eq!(counts(last)[..2], [0, 0], "{name}: no pods left");
    }
    // The worker saw its copies created and removed, nothing else: the status changes
    // went to the manager only.
    assert_eq!(report.summary.remote_writes_per_job, serde_json::json!(2));

    // Every second, the manager's Job shows what the worker's Job controller just did: a
    // wave of pods started, then Ready, then succeeded as the next wave starts.
    let wave = f64::from(READY_AFTER + RUNS_FOR);
    let mut expected = Vec::new();
    for w in 0..COMPLETIONS.div_ceil(PARALLELISM) {
        let done = w * PARALLELISM;
        let pods = PARALLELISM.min(COMPLETIONS - done) as i32;
        let at = f64::from(w) * wave;
        expected.push((at, [pods, 0, done as i32, 0]));
        expected.push((at + f64::from(READY_AFTER), [pods, pods, done as i32, 0]));
    }
    let end = f64::from(COMPLETIONS.div_ceil(PARALLELISM)) * wave;
    expected.push((end, [0, 0, COMPLETIONS as i32, 0]));
    let seen: Vec<(f64, [i32; 4])> = busy.iter().map(|(t, s)| (*t, counts(s))).collect();
    assert_eq!(seen, expected);
    let (_, last) = busy.last().expect("statuses written");
    assert!(is_true(last, "SuccessCriteriaMet") && is_true(last, "Complete"));
    assert!(!is_true(last, "Failed"));
    assert_eq!(
        since_start(last.completion_time.as_ref()),
        Some(end as i64),
        "completed when its last pod did"
    );
    // Pods finishing while the next wave starts are no loss of readiness: once all Ready,
    // the Job stays PodsReady.
    let ready_from = busy
        .iter()
        .position(|(_, s)| is_true(s, "PodsReady"))
        .expect("busy got all its pods Ready");
    assert_eq!(busy[ready_from].0, f64::from(READY_AFTER));
    assert!(busy[ready_from..]
        .iter()
        .all(|(_, s)| is_true(s, "PodsReady")));
    let busy_report = job(&report, "busy");
    assert_eq!(busy_report.result, "Succeeded");
    assert_eq!(seconds(&busy_report.started), f64::from(READY_AFTER));
    assert_eq!(times(&report, "busy", "Succeeded in its worker"), [end]);

    // `flaky`'s pods start and fail together; the Job controller replaces them after
    // different back-offs (10 s, 20 s, ...), so from then on they are Ready and fail one at
    // a time, and each failure shows, up to the one past backoffLimit that fails the Job.
    let mut failed: Vec<i32> = flaky.iter().map(|(_, s)| counts(s)[3]).collect();
    failed.dedup();
    let gives_up = BACKOFF_LIMIT as i32 + 1;
    let expected: Vec<i32> = [0].into_iter().chain(FLAKY_PODS..=gives_up).collect();
    assert_eq!(failed, expected);
    assert!(
        flaky.iter().any(|(_, s)| counts(s)[..2] == [1, 1]),
        "one pod Ready while the other waits out its back-off"
    );
    let (end, last) = flaky.last().expect("statuses written");
    assert!(is_true(last, "FailureTarget") && is_true(last, "Failed"));
    assert!(!is_true(last, "Complete") && last.completion_time.is_none());
    assert_eq!(counts(last)[2..], [0, gives_up]);
    assert_eq!(job(&report, "flaky").result, "Failed");
    assert_eq!(times(&report, "flaky", "Failed in its worker"), [*end]);
}

// ---------------------------------------------------------------------------------------------
// What users feel: the worker's scheduler, waits, completion times and goodput.

/// One worker under `single-numa-node`: `wide` has the most CPUs and memory but one GPU per
/// NUMA zone, `narrow-1` and `narrow-2` two GPUs per zone. SCHEDULER is replaced by the
/// worker's `schedulerName` line, or by nothing.
const ONE_NUMA_WORKER: &str = r#"
clusters:
  - name: gpu
    SCHEDULER
    nodes:
      - name: wide
        allocatable: {cpu: "64", memory: 256Gi, nvidia.com/gpu: "4", pods: "110"}
        topology:
          attributes:
            - {name: topologyManagerPolicy, value: single-numa-node}
            - {name: topologyManagerScope, value: pod}
          zones:
            - {name: node-0, type: Node, resources: [{name: cpu, capacity: "16", allocatable: "16", available: "16"}, {name: memory, capacity: 64Gi, allocatable: 64Gi, available: 64Gi}, {name: nvidia.com/gpu, capacity: "1", allocatable: "1", available: "1"}]}
            - {name: node-1, type: Node, resources: [{name: cpu, capacity: "16", allocatable: "16", available: "16"}, {name: memory, capacity: 64Gi, allocatable: 64Gi, available: 64Gi}, {name: nvidia.com/gpu, capacity: "1", allocatable: "1", available: "1"}]}
            - {name: node-2, type: Node, resources: [{name: cpu, capacity: "16", allocatable: "16", available: "16"}, {name: memory, capacity: 64Gi, allocatable: 64Gi, available: 64Gi}, {name: nvidia.com/gpu, capacity: "1", allocatable: "1", available: "1"}]}
            - {name: node-3, type: Node, resources: [{name: cpu, capacity: "16", allocatable: "16", available: "16"}, {name: memory, capacity: 64Gi, allocatable: 64Gi, available: 64Gi}, {name: nvidia.com/gpu, capacity: "1", allocatable: "1", available: "1"}]}
      - name: narrow-1
        allocatable: {cpu: "32", memory: 256Gi, nvidia.com/gpu: "4", pods: "110"}
        topology:
          attributes:
            - {name: topologyManagerPolicy, value: single-numa-node}
            - {name: topologyManagerScope, value: pod}
          zones:
            - {name: node-0, type: Node, resources: [{name: cpu, capacity: "16", allocatable: "16", available: "16"}, {name: memory, capacity: 128Gi, allocatable: 128Gi, available: 128Gi}, {name: nvidia.com/gpu, capacity: "2", allocatable: "2", available: "2"}]}
            - {name: node-1, type: Node, resources: [{name: cpu, capacity: "16", allocatable: "16", available: "16"}, {name: memory, capacity: 128Gi, allocatable: 128Gi, available: 128Gi}, {name: nvidia.com/gpu, capacity: "2", allocatable: "2", available: "2"}]}
      - name: narrow-2
        allocatable: {cpu: "32", memory: 256Gi, nvidia.com/gpu: "4", pods: "110"}
        topology:
          attributes:
            - {name: topologyManagerPolicy, value: single-numa-node}
            - {name: topologyManagerScope, value: pod}
          zones:
            - {name: node-0, type: Node, resources: [{name: cpu, capacity: "16", allocatable: "16", available: "16"}, {name: memory, capacity: 128Gi, allocatable: 128Gi, available: 128Gi}, {name: nvidia.com/gpu, capacity: "2", allocatable: "2", available: "2"}]}
            - {name: node-1, type: Node, resources: [{name: cpu, capacity: "16", allocatable: "16", available: "16"}, {name: memory, capacity: 128Gi, allocatable: 128Gi, available: 128Gi}, {name: nvidia.com/gpu, capacity: "2", allocatable: "2", available: "2"}]}
queues:
  - name: training
    clusters: [gpu]
jobs:
  - name: train
    queue: training
    submitAt: 0s
    parallelism: 2
    duration: 10m
    podStartDelay: 30s
    template:
      containers:
        - name: trainer
          resources:
            requests: {cpu: "4", memory: 16Gi, nvidia.com/gpu: "2"}
            limits: {cpu: "4", memory: 16Gi, nvidia.com/gpu: "2"}
"#;

#[test]
fn a_gangs_pods_go_where_the_dispatchers_fit_put_them_even_under_a_default_scheduler() {
    // Two of the worker's nodes can hold the gang NUMA-aligned. Its default scheduler only
    // looks at free CPUs and memory: left to itself it puts each pod on `wide`, and the
    // kubelet there rejects it, again at every replacement, until the Job controller gives
    // up. That is what happens to a strategy that sends the Job without a placement.
    let blind = run(
        &ONE_NUMA_WORKER.replace("SCHEDULER", ""),
        Strategy::SumAggregate,
    );
    let train = job(&blind, "train");
    assert_eq!(train.cluster.as_deref(), Some("gpu"));
    assert_eq!(train.result, "Failed");
    let every_pod_failure = u64::from(BACKOFF_LIMIT) + 1;
    assert_eq!(
        blind.summary.topology_affinity_errors, every_pod_failure,
        "each pod failure was a TopologyAffinityError"
    );
    assert_eq!(
        blind.summary.topology_affinity_errors_by_cluster["gpu"],
        blind.summary.topology_affinity_errors
    );

    // Switchyard's copy prefers the nodes its exact fit found, and the default scheduler's
    // NodeAffinity score outweighs its resource score: the pods land where the kubelet
    // admits them.
    let preferred = run(
        &ONE_NUMA_WORKER.replace("SCHEDULER", ""),
        Strategy::Switchyard,
    );
    let train = job(&preferred, "train");
    assert_eq!(train.result, "Succeeded");
    assert_eq!(seconds(&train.finished), 630.0, "30s to start, 10m to run");
    assert_eq!(preferred.summary.topology_affinity_errors, 0);

    // With `schedulerName` the worker's NUMA-aware scheduler aligns the pods either way.
    for strategy in [Strategy::Switchyard, Strategy::SumAggregate] {
        let aware = run(
            &ONE_NUMA_WORKER.replace("SCHEDULER", "schedulerName: switchyard-scheduler"),
            strategy,
        );
        let train = job(&aware, "train");
        assert_eq!(train.result, "Succeeded", "{strategy:?}");
        assert_eq!(seconds(&train.finished), 630.0);
        assert_eq!(
            aware.summary.topology_affinity_errors_by_cluster,
            [("gpu".to_string(), 0)].into()
        );
    }
}

/// One worker of two 4-GPU nodes; SCHEDULER is its `schedulerName` line or nothing,
/// STRATEGY its queue's placement strategy. Two 1-GPU Jobs that run an hour, then a Job that
/// needs a whole node's GPUs.
const TWO_GPU_NODES: &str = r#"
clusters:
  - name: gpu
    SCHEDULER
    nodes:
      - {name: n1, allocatable: {cpu: "16", memory: 64Gi, nvidia.com/gpu: "4", pods: "110"}}
      - {name: n2, allocatable: {cpu: "16", memory: 64Gi, nvidia.com/gpu: "4", pods: "110"}}
queues:
  - name: training
    clusters: [gpu]
    placement: {strategy: STRATEGY}
jobs:
  - {name: small-1, queue: training, submitAt: 0s, parallelism: 1, duration: 1h, podStartDelay: 10s, template: {containers: [{name: c, resources: {requests: {cpu: "1", memory: 1Gi, nvidia.com/gpu: "1"}}}]}}
  - {name: small-2, queue: training, submitAt: 1s, parallelism: 1, duration: 1h, podStartDelay: 10s, template: {containers: [{name: c, resources: {requests: {cpu: "1", memory: 1Gi, nvidia.com/gpu: "1"}}}]}}
  - {name: whole-node, queue: training, submitAt: 2m, parallelism: 1, duration: 10m, podStartDelay: 10s, template: {containers: [{name: c, resources: {requests: {cpu: "4", memory: 8Gi, nvidia.com/gpu: "4"}}}]}}
"#;

#[test]
fn pods_are_packed_where_the_dispatcher_placed_them_or_as_the_queues_strategy_says() {
    let scenario = |scheduler: &str, strategy: &str| {
        TWO_GPU_NODES
            .replace("SCHEDULER", scheduler)
            .replace("STRATEGY", strategy)
    };
    let aware = "schedulerName: switchyard-scheduler";
    let started = |r: &Report| seconds(&job(r, "whole-node").started);
    let at_once = 130.0; // submitted at 2m, Ready 10s later
                         // Without a placement from the dispatcher (sum-aggregate), a NUMA-aware worker ranks
                         // nodes by the queue's strategy, which the copy's pods carry. MostAllocated puts the
                         // second small Job beside the first, and the other node stays whole for the Job that
                         // needs all of it; LeastAllocated puts one on each node, and the big one waits an hour.
    let packed = run(&scenario(aware, "MostAllocated"), Strategy::SumAggregate);
    assert_eq!(started(&packed), at_once);
    let spread = run(&scenario(aware, "LeastAllocated"), Strategy::SumAggregate);
    assert!(started(&spread) > 3600.0, "started at {}", started(&spread));
    // The default scheduler knows nothing of the strategy: it spreads by cpu and memory.
    let blind = run(&scenario("", "MostAllocated"), Strategy::SumAggregate);
    assert!(started(&blind) > 3600.0, "started at {}", started(&blind));
    // Switchyard's pods prefer the nodes of its fit, which fills each node in the worker's
    // order as far as it goes: the second small Job goes beside the first under either
    // scheduler and either strategy.
    for (scheduler, strategy) in [("", "LeastAllocated"), (aware, "LeastAllocated")] {
        let r = run(&scenario(scheduler, strategy), Strategy::Switchyard);
        assert_eq!(started(&r), at_once, "{scheduler:?} {strategy}");
        assert_eq!(job(&r, "whole-node").result, "Succeeded");
    }
    for r in [&packed, &spread, &blind] {
        assert_eq!(job(r, "whole-node").result, "Succeeded");
    }
}

/// One worker with room for everything that fits at all: every time below follows from the
/// Jobs' own delays and durations.
const FOUR_KINDS_OF_JOBS: &str = r#"
clusters:
  - name: w
    nodes:
      - {name: w-1, allocatable: {cpu: "16", memory: 64Gi, nvidia.com/gpu: "2", pods: "110"}}
queues:
  - name: a
    clusters: [w]
  - name: b
    clusters: [w]
jobs:
  - {name: cpu-job, queue: a, submitAt: 0s, parallelism: 2, completions: 3, duration: 10m, podStartDelay: 30s, template: {containers: [{name: c, resources: {requests: {cpu: "2", memory: 4Gi}}}]}}
  - {name: too-big, queue: a, submitAt: 0s, parallelism: 1, duration: 10m, template: {containers: [{name: c, resources: {requests: {cpu: "32", memory: 1Gi, nvidia.com/gpu: "1"}}}]}}
  - {name: flaky, queue: b, submitAt: 0s, parallelism: 1, duration: 1m, podStartDelay: 10s, fails: true, template: {containers: [{name: c, resources: {requests: {cpu: "1", memory: 1Gi}}}]}}
  - {name: gpu-job, queue: b, submitAt: 1m, parallelism: 1, duration: 30m, podStartDelay: 1m, template: {containers: [{name: c, resources: {requests: {cpu: "4", memory: 8Gi, nvidia.com/gpu: "1"}}}]}}
"#;

#[test]
fn waits_completion_times_and_goodput_are_what_the_jobs_went_through() {
    // By hand:
    // - cpu-job (queue a, cpu-only): 2 pods at a time, 3 completions, 2 CPUs and 4 GiB each.
    //   Admitted at 0; pods 1 and 2 Ready at 30, done at 630; pod 3 starts at 630, Ready at
    //   660, done at 1260. Started 30 (both pods of the gang Ready), finished 1260.
    //   Goodput: 3 pods × 600 s = 1800 pod-s = 0.5 pod-h: cpu 2 × 0.5 = 1, memory 4 × 0.5 = 2.
    // - too-big (queue a, nvidia.com/gpu): 32 CPUs, more than the worker and the queue have:
    //   pending, never started.
    // - flaky (queue b, cpu-only): its pod is Ready at 10 and fails at 70; replacements after
    //   10, 20, 40, 80, 160, 320 s fail at 150, 240, 350, 500, 730, 1120: the 7th failure,
    //   past backoffLimit 6, fails the Job at 1120. Started 10; no goodput (it failed).
    // - gpu-job (queue b, nvidia.com/gpu): submitted and admitted at 60, Ready at 120, done
    //   at 1920. Goodput: 1800 s = 0.5 h: cpu 4 × 0.5 = 2, memory 8 × 0.5 = 4, gpu 0.5.
    // Start waits: cpu-job 30, flaky 10, gpu-job 60 → sorted 10, 30, 60: mean 33.333, p50 the
    // 2nd (⌈0.5 × 3⌉), p95 the 3rd (⌈0.95 × 3⌉). Completion times (Succeeded only): cpu-job
    // 1260, gpu-job 1860: mean 1560, p50 the 1st, p95 the 2nd.
    let report = run(FOUR_KINDS_OF_JOBS, Strategy::Switchyard);
    let s = &report.summary;
    let spread = |s: &simulate::report::Spread| serde_json::json!([s.mean, s.p50, s.p95, s.max]);
    assert_eq!((s.jobs, s.succeeded, s.failed, s.pending), (4, 2, 1, 1));
    assert_eq!(s.mean_wait, serde_json::json!(0), "admitted as submitted");
    assert_eq!(
        spread(&s.start_wait),
        serde_json::json!([33.333, 30, 60, 60])
    );
    assert_eq!(
        spread(&s.completion_time),
        serde_json::json!([1560, 1260, 1860, 1860])
    );
    assert_eq!(
        serde_json::to_value(&s.goodput).unwrap(),
        serde_json::json!({"cpu": 3, "memory": 6, "nvidia.com/gpu": 0.5})
    );

    // Queue a: cpu-job and too-big. Start waits: 30. Goodput: cpu-job's; too-big asks for a
    // GPU, so the queue shows 0 GPU-hours.
    let a = &s.by_queue["a"];
    assert_eq!((a.jobs, a.succeeded, a.failed, a.pending), (2, 1, 0, 1));
    assert_eq!(spread(&a.start_wait), serde_json::json!([30, 30, 30, 30]));
    assert_eq!(
        serde_json::to_value(&a.goodput).unwrap(),
        serde_json::json!({"cpu": 1, "memory": 2, "nvidia.com/gpu": 0})
    );
    // Queue b: flaky and gpu-job. Start waits 10, 60: mean 35, p50 the 1st, p95 the 2nd.
    let b = &s.by_queue["b"];
    assert_eq!((b.jobs, b.succeeded, b.failed, b.pending), (2, 1, 1, 0));
    assert_eq!(spread(&b.start_wait), serde_json::json!([35, 10, 60, 60]));
    assert_eq!(
        serde_json::to_value(&b.goodput).unwrap(),
        serde_json::json!({"cpu": 2, "memory": 4, "nvidia.com/gpu": 0.5})
    );

    // Kinds: cpu-only is cpu-job and flaky (start waits 30, 10); nvidia.com/gpu is too-big
    // and gpu-job (start wait 60).
    assert_eq!(
        s.by_kind.keys().collect::<Vec<_>>(),
        ["cpu-only", "nvidia.com/gpu"]
    );
    let cpu = &s.by_kind["cpu-only"];
    assert_eq!(
        (cpu.jobs, cpu.succeeded, cpu.failed, cpu.pending),
        (2, 1, 1, 0)
    );
    assert_eq!(spread(&cpu.start_wait), serde_json::json!([20, 10, 30, 30]));
    assert_eq!(
        serde_json::to_value(&cpu.goodput).unwrap(),
        serde_json::json!({"cpu": 1, "memory": 2})
    );
    let gpu = &s.by_kind["nvidia.com/gpu"];
    assert_eq!(
        (gpu.jobs, gpu.succeeded, gpu.failed, gpu.pending),
        (2, 1, 0, 1)
    );
    assert_eq!(spread(&gpu.start_wait), serde_json::json!([60, 60, 60, 60]));
    assert_eq!(
        serde_json::to_value(&gpu.goodput).unwrap(),
        serde_json::json!({"cpu": 2, "memory": 4, "nvidia.com/gpu": 0.5})
    );
    assert_eq!(
        s.topology_affinity_errors_by_cluster,
        [("w".to_string(), 0)].into()
    );
}

#[test]
fn a_job_s_work_counts_once_under_all_at_once_too() {
    // All-at-once starts pods of each Job in every worker and removes the copies that lose:
    // only the copy that completed counts, so the goodput is the exact fit's.
    // `one`: 2 pods × 2 CPUs × 60 s = 240 CPU-s; `two`: 1 CPU × 60 s = 60 CPU-s; 300 CPU-s =
    // 0.083 core-hours. Memory: 3 pod-minutes × 1 GiB = 0.05 GiB-hours.
    for strategy in [Strategy::AllAtOnce, Strategy::Switchyard] {
        let report = run(THREE_WORKERS, strategy);
        assert_eq!(
            serde_json::to_value(&report.summary.goodput).unwrap(),
            serde_json::json!({"cpu": 0.083, "memory": 0.05}),
            "{strategy:?}"
        );
    }
}

#[test]
fn a_bad_scheduler_name_or_a_misspelt_cluster_field_is_named() {
    let cluster = |extra: &str| {
        format!(
            "clusters:\n  - name: west\n    {extra}\n    nodes:\n      - {{name: west-1, allocatable: {{cpu: \"4\"}}}}\n"
        )
    };
    let err = scenario::parse(&cluster("schedulerName: Not_A_Profile"))
        .expect_err("not a scheduler name")
        .to_string();
    assert!(
        err.contains("clusters[0] (west): schedulerName: \"Not_A_Profile\""),
        "{err}"
    );
    let err = scenario::parse(&cluster("schedulername: numa"))
        .expect_err("not a field")
        .to_string();
    assert!(
        err.contains("unknown field `schedulername`") && err.contains("`schedulerName`"),
        "{err}"
    );
}

/// A worker's NUMA-aware scheduler binds a pod only where the kubelet admits it: on the mixed
/// trace with a `schedulerName` on every cluster no kubelet rejects anything, whatever chose
/// the worker, and no pod waits for ever for a node it can be aligned on.
#[test]
fn with_numa_aware_schedulers_no_kubelet_rejects_a_pod() {
    // 4 clusters of 8 nodes: the largest gang (8 pods × 4 GPUs) fits in each.
    let trace = |scheduler| {
        let text = simulate::synthetic::mixed_trace(4, 8, 150, 11, scheduler);
        scenario::parse(&text).expect("the mixed trace parses")
    };
    let aware = trace(Some("switchyard-scheduler"));
    for strategy in Strategy::ALL {
        let s = simulate::run(&aware, strategy).summary;
        assert_eq!(s.topology_affinity_errors, 0, "{strategy:?}");
        assert_eq!(
            (s.succeeded, s.failed, s.pending),
            (150, 0, 0),
            "{strategy:?}"
        );
    }
    // The same trace on default schedulers: single-numa-node and restricted kubelets reject
    // pods the default scheduler put where they cannot be aligned.
    let default = trace(None);
    let s = simulate::run(&default, Strategy::SumAggregate).summary;
    assert!(s.topology_affinity_errors > 0);
}

/// One worker behind the default (LeastAllocated, NUMA-unaware) scheduler: two GPU nodes and a
/// CPU node that is already partly used, so that the GPU nodes look the emptiest to it.
const ROOM_FOR_A_GANG: &str = r#"
clusters:
  - name: w
    nodes:
      - {name: g1, allocatable: {cpu: "64", memory: 256Gi, nvidia.com/gpu: "8", pods: "110"}}
      - {name: g2, allocatable: {cpu: "64", memory: 256Gi, nvidia.com/gpu: "8", pods: "110"}}
      - {name: c1, allocatable: {cpu: "40", memory: 256Gi, pods: "110"}, requested: {cpu: "8"}}
queues:
  - name: q
    clusters: [w]
    starvationAfter: 1m
jobs:
  - {name: long, queue: q, submitAt: 0s, parallelism: 1, duration: 30m, template: {containers: [{name: c, resources: {requests: {cpu: "8", memory: 8Gi, nvidia.com/gpu: "8"}}}]}}
  - {name: gang, queue: q, submitAt: 10s, parallelism: 2, duration: 10m, template: {containers: [{name: c, resources: {requests: {cpu: "48", memory: 8Gi, nvidia.com/gpu: "8"}}}]}}
  - {name: small, queue: q, submitAt: 5m, parallelism: 1, duration: 40m, template: {containers: [{name: c, resources: {requests: {cpu: "24", memory: 8Gi}}}]}}
"#;

#[test]
fn the_room_kept_for_a_starving_gang_is_left_alone_by_the_workers_scheduler() {
    // `gang` needs both GPU nodes; `long` holds one of them for 30 minutes. After a minute
    // of waiting, room is kept for `gang` on both; `small` still starts beside that room,
    // on c1. The worker's scheduler alone would put `small` on the emptier-looking free GPU
    // node and take CPUs the gang needs there for 40 minutes; the copy's node affinity keeps
    // it off, and the gang starts as soon as `long` ends.
    let report = run(ROOM_FOR_A_GANG, Strategy::Switchyard);
    let (long, gang, small) = (
        job(&report, "long"),
        job(&report, "gang"),
        job(&report, "small"),
    );
    assert_eq!(
        seconds(&small.started),
        300.0,
        "small starts beside the room"
    );
    assert_eq!(seconds(&long.finished), 1800.0);
    assert_eq!(gang.result, "Succeeded");
    assert_eq!(
        seconds(&gang.started),
        1800.0,
        "the gang starts when long ends, not when small does"
    );
    assert_eq!(report.summary.failed, 0);
}

/// Two GPU workers behind single-numa-node kubelets, `large` with 2 nodes of 4 GPUs (2 per
/// NUMA node), `small` with one such node; then `jobs` (queues and Jobs).
fn jobsets(jobs: &str) -> String {
    let node = |name: &str| {
        format!(
            r#"      - name: {name}
        allocatable: {{cpu: "32", memory: 256Gi, nvidia.com/gpu: "4", pods: "110"}}
        topology:
          attributes:
            - {{name: topologyManagerPolicy, value: single-numa-node}}
            - {{name: topologyManagerScope, value: pod}}
          zones:
            - {{name: node-0, type: Node, resources: [{{name: cpu, capacity: "16", allocatable: "16", available: "16"}}, {{name: memory, capacity: 128Gi, allocatable: 128Gi, available: 128Gi}}, {{name: nvidia.com/gpu, capacity: "2", allocatable: "2", available: "2"}}]}}
            - {{name: node-1, type: Node, resources: [{{name: cpu, capacity: "16", allocatable: "16", available: "16"}}, {{name: memory, capacity: 128Gi, allocatable: 128Gi, available: 128Gi}}, {{name: nvidia.com/gpu, capacity: "2", allocatable: "2", available: "2"}}]}}
"#
        )
    };
    format!(
        "clusters:\n  - name: large\n    nodes:\n{}{}  - name: small\n    nodes:\n{}{jobs}",
        node("large-1"),
        node("large-2"),
        node("small-1"),
    )
}

const GPU_POD: &str = r#"{containers: [{name: trainer, resources: {requests: {cpu: "4", memory: 16Gi, nvidia.com/gpu: "1"}, limits: {cpu: "4", memory: 16Gi, nvidia.com/gpu: "1"}}}]}"#;

/// A JobSet of a `leader` Job and `workers` Jobs (`replicas`), 2 pods of 1 GPU each.
fn jobset(name: &str, submit: &str, workers: u32, extra: &str) -> String {
    format!(
        r#"  - name: {name}
    kind: JobSet
    queue: training
    submitAt: {submit}
    duration: 10m
    podStartDelay: 30s
{extra}    replicatedJobs:
      - {{name: leader, parallelism: 2, template: {GPU_POD}}}
      - {{name: workers, replicas: {workers}, parallelism: 2, template: {GPU_POD}}}
"#
    )
}

/// The statuses written to the manager's JobSet `name`, in order.
fn jobset_writes(report: &Report, name: &str) -> Vec<(f64, serde_json::Value)> {
    let key = format!("JobSet default/{name}");
    report
        .status_writes
        .iter()
        .filter(|w| w.job == key)
        .map(|w| (w.at, w.status.clone()))
        .collect()
}

/// The decisions about JobSet `name` whose description contains `what`.
fn jobset_times(report: &Report, name: &str, what: &str) -> Vec<f64> {
    decisions(report, &format!("JobSet default/{name}: "))
        .into_iter()
        .filter(|(_, d)| d.contains(what))
        .map(|(t, _)| t)
        .collect()
}

/// `replicatedJobsStatus` as (name, ready, succeeded, failed, active).
fn replicated(status: &serde_json::Value) -> Vec<(String, i64, i64, i64, i64)> {
    status["replicatedJobsStatus"]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|r| {
                    let n = |k: &str| r[k].as_i64().unwrap_or_else(|| panic!("{k} in {r}"));
                    (
                        r["name"].as_str().unwrap().to_string(),
                        n("ready"),
                        n("succeeded"),
                        n("failed"),
                        n("active"),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn condition<'a>(status: &'a serde_json::Value, type_: &str) -> Option<&'a serde_json::Value> {
    status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

fn run_with_writes(yaml: &str) -> Report {
    let s = scenario::parse(yaml).expect("the test scenario parses");
    let report = Simulation::new(&s, Strategy::Switchyard)
        .with_events()
        .with_status_writes()
        .run();
    assert!(
        !report.events.iter().any(|e| e.contains("would refuse")),
        "every status written was one the API server accepts: {:#?}",
        report.events
    );
    report
}

#[test]
fn a_jobset_runs_as_one_gang_in_one_worker_and_its_status_is_mirrored() {
    // 1 leader Job and 3 worker Jobs of 2 pods: 8 GPUs, which only `large` has.
    let yaml = jobsets(&format!(
        "queues:\n  - name: training\n    clusters: [small, large]\n    waitForPodsReady: {{enabled: true, timeout: 5m}}\njobs:\n{}",
        jobset("train", "0s", 3, "")
    ));
    let report = run_with_writes(&yaml);
    let train = job(&report, "train");
    assert_eq!(train.kind.as_deref(), Some("JobSet"));
    assert_eq!(train.result, "Succeeded", "{:?}", train.reason);
    assert_eq!(train.cluster.as_deref(), Some("large"));
    assert_eq!(train.requeues, 0);
    assert_eq!(
        jobset_times(&report, "train", "dispatched to worker"),
        [0.0]
    );
    assert_eq!(report.summary.topology_affinity_errors, 0);
    // Every pod was created at dispatch and Ready 30s later, together: the whole gang.
    assert_eq!(seconds(&train.started), 30.0);
    assert_eq!(seconds(&train.finished), 630.0);
    // 8 pods × 1 GPU × 10 minutes.
    assert_eq!(report.summary.goodput["nvidia.com/gpu"], 1.333);

    let writes = jobset_writes(&report, "train");
    let ready = writes
        .iter()
        .find(|(_, s)| condition(s, "PodsReady").is_some_and(|c| c["status"] == "True"))
        .expect("PodsReady was written");
    assert_eq!(ready.0, 30.0);
    assert_eq!(
        replicated(&ready.1),
        [
            ("leader".into(), 1, 0, 0, 1),
            ("workers".into(), 3, 0, 0, 3)
        ]
    );
    let (at, last) = writes.last().expect("statuses were written");
    assert_eq!(*at, 630.0);
    assert_eq!(
        replicated(last),
        [
            ("leader".into(), 0, 1, 0, 0),
            ("workers".into(), 0, 3, 0, 0)
        ]
    );
    let completed = condition(last, "Completed").expect("Completed");
    assert_eq!(completed["status"], "True");
    assert_eq!(completed["reason"], "AllJobsCompleted");
    assert_eq!(last["terminalState"], "Completed");
    assert_eq!(last["restarts"], 0);
    assert!(condition(last, "Failed").is_none());
}

#[test]
fn a_jobset_too_big_for_any_worker_waits() {
    // 1 + 4 Jobs of 2 pods: 10 GPUs, more than any worker has (8 and 4), less than the
    // queue's quota (their sum).
    let yaml = jobsets(&format!(
        "queues:\n  - name: training\n    clusters: [small, large]\njobs:\n{}",
        jobset("huge", "0s", 4, "")
    ));
    let report = run(&yaml, Strategy::Switchyard);
    let huge = job(&report, "huge");
    assert_eq!(huge.result, "Pending");
    assert_eq!(huge.admitted, serde_json::Value::Null);
    let why = huge.reason.as_deref().unwrap();
    assert!(
        why.contains("could hold the gang of 10 pods even empty"),
        "{why}"
    );
}

#[test]
fn a_jobset_whose_pods_fail_ends_failed_and_its_jobs_go() {
    // Beside it, a Job of the same pods that fail the same way.
    let yaml = jobsets(&format!(
        "queues:\n  - name: training\n    clusters: [large]\njobs:\n{}  - {{name: alone, queue: training, submitAt: 0s, parallelism: 2, duration: 10m, podStartDelay: 30s, fails: true, template: {GPU_POD}}}\n",
        jobset("broken", "0s", 1, "    fails: true\n")
    ));
    let report = run_with_writes(&yaml);
    let broken = job(&report, "broken");
    assert_eq!(broken.result, "Failed");
    let why = broken.reason.as_deref().unwrap();
    assert!(why.contains("of its Jobs failed in worker large"), "{why}");
    assert!(
        why.contains(&format!("backoffLimit {BACKOFF_LIMIT}")),
        "{why}"
    );
    assert_eq!(report.summary.failed, 2);
    assert_eq!(
        report.summary.goodput.get("nvidia.com/gpu"),
        Some(&0.into())
    );

    let writes = jobset_writes(&report, "broken");
    let (_, last) = writes.last().expect("statuses were written");
    let failed = condition(last, "Failed").expect("Failed");
    assert_eq!(failed["status"], "True");
    assert_eq!(failed["reason"], "FailedJobs");
    let message = failed["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "jobset failed due to one or more job failures (first failed job: broken-"
        ),
        "{message}"
    );
    assert_eq!(last["terminalState"], "Failed");
    assert!(condition(last, "Completed").is_none());
    // The first Job past its backoffLimit failed the set; the others were deleted.
    let counts = replicated(last);
    let failed_jobs: i64 = counts.iter().map(|c| c.3).sum();
    assert_eq!(failed_jobs, 1, "{counts:?}");
    assert!(counts.iter().all(|c| c.4 == 0 && c.1 == 0), "{counts:?}");
    // It failed when its first Job did: when the lone Job of the same pods failed.
    let alone = job(&report, "alone");
    assert_eq!(alone.result, "Failed");
    assert_eq!(seconds(&broken.finished), seconds(&alone.finished));
}

#[test]
fn a_jobset_whose_replicated_jobs_ask_for_different_pods_runs_them_together_in_one_worker() {
    // A CPU-only driver beside 3 worker Jobs of 2 GPU pods: 6 GPUs, which `small` (4) cannot
    // hold, `large` (8) can.
    let cpu_pod =
        r#"{containers: [{name: driver, resources: {requests: {cpu: "2", memory: 4Gi}}}]}"#;
    let yaml = jobsets(&format!(
        r#"queues:
  - name: training
    clusters: [small, large]
jobs:
  - name: mixed
    kind: JobSet
    queue: training
    submitAt: 0s
    duration: 10m
    podStartDelay: 30s
    replicatedJobs:
      - {{name: driver, template: {cpu_pod}}}
      - {{name: workers, replicas: 3, parallelism: 2, template: {GPU_POD}}}
"#
    ));
    let report = run_with_writes(&yaml);
    let mixed = job(&report, "mixed");
    assert_eq!(mixed.result, "Succeeded", "{:?}", mixed.reason);
    assert_eq!(mixed.cluster.as_deref(), Some("large"));
    assert_eq!(
        jobset_times(&report, "mixed", "dispatched to worker"),
        [0.0]
    );
    assert_eq!(seconds(&mixed.started), 30.0, "all 7 pods Ready together");
    assert_eq!(seconds(&mixed.finished), 630.0);
    // Quota and goodput count both shapes: 2 + 6 × 4 CPUs of 96, 6 GPUs of 12; the driver's
    // 2 CPUs and the workers' 24 for 10 minutes.
    let quota = &report.summary.max_quota_usage["training"];
    assert_eq!(quota["cpu"], serde_json::json!(0.271));
    assert_eq!(quota["nvidia.com/gpu"], serde_json::json!(0.5));
    assert_eq!(report.summary.goodput["cpu"], serde_json::json!(4.333));
    assert_eq!(
        report.summary.goodput["nvidia.com/gpu"],
        serde_json::json!(1)
    );
    let (_, last) = jobset_writes(&report, "mixed").pop().expect("statuses");
    assert_eq!(
        replicated(&last),
        [
            ("driver".into(), 0, 1, 0, 0),
            ("workers".into(), 0, 3, 0, 0)
        ]
    );
}

#[test]
fn a_jobset_part_that_fits_no_worker_beside_the_others_is_named_in_the_reason_it_waits() {
    // In `small` (one node of two NUMA zones of 16 CPUs and 2 GPUs, single-numa-node) the 4
    // worker pods of 5 CPUs and 1 GPU take two to a zone, leaving 6 CPUs in each: the driver's
    // Guaranteed 7 CPUs fit neither zone, though the node alone would take it (and the
    // queue's quota, 32 CPUs, all 27).
    let pod = |name: &str, cpu: &str, gpu: &str| {
        format!(
            r#"{{containers: [{{name: {name}, resources: {{requests: {{cpu: "{cpu}", memory: 1Gi{gpu}}}, limits: {{cpu: "{cpu}", memory: 1Gi{gpu}}}}}}}]}}"#
        )
    };
    let yaml = jobsets(&format!(
        r#"queues:
  - name: training
    clusters: [small]
jobs:
  - name: mixed
    kind: JobSet
    queue: training
    submitAt: 0s
    duration: 10m
    podStartDelay: 30s
    replicatedJobs:
      - {{name: driver, template: {}}}
      - {{name: workers, replicas: 2, parallelism: 2, template: {}}}
"#,
        pod("driver", "7", ""),
        pod("worker", "5", ", nvidia.com/gpu: \"1\""),
    ));
    let report = run(&yaml, Strategy::Switchyard);
    let mixed = job(&report, "mixed");
    assert_eq!(mixed.result, "Pending");
    assert_eq!(
        mixed.reason.as_deref(),
        Some("no worker of queue \"training\" could hold the gang of 5 pods even empty: small: replicated Job driver, beside the pods of replicated Job workers: the Topology Manager of node small-1 (single-numa-node) would reject the pod (pod scope): needs 7 cpu on one NUMA node under single-numa-node; the largest NUMA zone has 6 free of 16 allocatable")
    );
}

#[test]
fn quota_counts_every_pod_of_a_jobset() {
    // Two JobSets of 4 pods of 1 GPU: `large` (8 GPUs) holds both at once, but not 6 GPUs of
    // quota.
    let scenario = |quota: &str| {
        jobsets(&format!(
            "queues:\n  - name: training\n    clusters: [large]\n{quota}jobs:\n{}{}",
            jobset("first", "0s", 1, ""),
            jobset("second", "0s", 1, "")
        ))
    };
    let report = run(
        &scenario("    quota: {cpu: \"96\", memory: 768Gi, nvidia.com/gpu: \"6\"}\n"),
        Strategy::Switchyard,
    );
    let (first, second) = (job(&report, "first"), job(&report, "second"));
    assert_eq!(
        (first.result.as_str(), second.result.as_str()),
        ("Succeeded", "Succeeded")
    );
    assert_eq!(seconds(&first.admitted), 0.0);
    assert_eq!(seconds(&first.finished), 630.0);
    assert_eq!(
        seconds(&second.admitted),
        630.0,
        "admitted once the first gave its quota back"
    );
    assert_eq!(
        report.summary.max_quota_usage["training"]["nvidia.com/gpu"],
        serde_json::json!(0.667)
    );
    // Without that quota, both run at once.
    let free = run(&scenario(""), Strategy::Switchyard);
    for name in ["first", "second"] {
        assert_eq!(seconds(&job(&free, name).admitted), 0.0, "{name}");
    }
}

#[test]
fn a_jobset_s_pods_are_placed_and_admitted_by_kubelets_one_by_one_as_a_job_s() {
    // The gang of `NUMA`'s `train` as a JobSet: a leader and a worker Job of one pod of 2
    // GPUs each.
    let (head, _) = NUMA.split_once("jobs:").unwrap();
    let pod = r#"{containers: [{name: trainer, resources: {requests: {cpu: "4", memory: 16Gi, nvidia.com/gpu: "2"}, limits: {cpu: "4", memory: 16Gi, nvidia.com/gpu: "2"}}}]}"#;
    let yaml = format!(
        r#"{head}jobs:
  - name: train
    kind: JobSet
    queue: training
    submitAt: 0s
    duration: 10m
    podStartDelay: 30s
    replicatedJobs:
      - {{name: leader, template: {pod}}}
      - {{name: worker, template: {pod}}}
"#
    );
    let exact = run(&yaml, Strategy::Switchyard);
    let train = job(&exact, "train");
    assert_eq!(train.cluster.as_deref(), Some("east"));
    assert_eq!(train.result, "Succeeded");
    assert_eq!(seconds(&train.finished), 630.0);
    assert_eq!(exact.summary.topology_affinity_errors, 0);
    // Sent where the sum of free resources looks big enough, each of its pods is rejected
    // by west's kubelet until one of its Jobs gives up, and with it the JobSet.
    let naive = run(&yaml, Strategy::SumAggregate);
    let train = job(&naive, "train");
    assert_eq!(train.cluster.as_deref(), Some("west"));
    assert_eq!(train.result, "Failed");
    assert!(naive.summary.topology_affinity_errors > u64::from(BACKOFF_LIMIT));
    assert_eq!(
        naive.summary.topology_affinity_errors_by_cluster["west"],
        naive.summary.topology_affinity_errors
    );
    let why = train.reason.as_deref().unwrap();
    assert!(why.contains("TopologyAffinityError"), "{why}");
}

/// `own` runs its own Kueue: 8 CPUs of quota on 32 CPUs of nodes, and its users' workloads
/// take 6 CPUs of it for 10 minutes from the start, then 4 CPUs (submitted at 30 s, so at
/// the head of its StrictFIFO queue until the first ends). `clusters` of the queue, its
/// settings and the jobs are the test's.
fn kueue_scenario(clusters: &str, settings: &str, jobs: &str) -> String {
    format!(
        r#"
clusters:
  - name: own
    kueue:
      quota: {{cpu: "8", memory: 64Gi}}
      localWorkloads:
        - {{submitAt: 0s, duration: 10m, request: {{cpu: "6"}}}}
        - {{submitAt: 30s, duration: 5m, request: {{cpu: "4"}}}}
    nodes:
      - {{name: own-1, allocatable: {{cpu: "32", memory: 128Gi, pods: "110"}}}}
  - name: plain
    nodes:
      - {{name: plain-1, allocatable: {{cpu: "8", memory: 32Gi, pods: "110"}}}}
queues:
  - name: batch
    clusters: {clusters}
{settings}
jobs:
{jobs}
"#
    )
}

/// A Job of `pods` pods of `cpus` CPUs each, running 5 minutes, Ready 10 s after they start.
fn cpu_job(name: &str, submit: &str, pods: u32, cpus: u32) -> String {
    format!(
        r#"  - {{name: {name}, queue: batch, submitAt: {submit}, parallelism: {pods}, duration: 5m, podStartDelay: 10s, template: {{containers: [{{name: c, resources: {{requests: {{cpu: "{cpus}", memory: 1Gi}}}}}}]}}}}"#
    )
}

#[test]
fn a_copy_waits_suspended_in_its_worker_s_kueue_until_the_quota_has_room_then_runs() {
    // 2 of the 8 CPUs are free when `small` comes: the dispatcher sends it, but the worker's
    // Kueue admits strictly in order, and the 4-CPU workload ahead of it does not fit until
    // the 6-CPU one ends at 10 minutes. PodsReady (2 minutes) counts from that admission.
    let yaml = kueue_scenario(
        "[own]",
        "    workerAdmissionTimeout: 20m\n    waitForPodsReady: {enabled: true, timeout: 2m}",
        &cpu_job("small", "1m", 1, 1),
    );
    let report = run_with_writes(&yaml);
    let small = job(&report, "small");
    assert_eq!(times(&report, "small", "dispatched to worker own"), [60.0]);
    assert_eq!(small.cluster.as_deref(), Some("own"));
    assert_eq!(seconds(&small.admitted), 60.0);
    assert_eq!(
        seconds(&small.started),
        610.0,
        "admitted by Kueue at 600, Ready 10 s on"
    );
    assert_eq!(seconds(&small.finished), 910.0);
    assert_eq!((small.result.as_str(), small.requeues), ("Succeeded", 0));
    assert!(
        times(&report, "small", "requeued").is_empty(),
        "PodsReady counts from the worker's admission"
    );
    assert_eq!(
        report.summary.start_wait.max,
        serde_json::json!(550),
        "the start wait includes the Kueue wait"
    );
    // The manager's Job says where its copy waits, then that the worker admitted it.
    let worker_admitted: Vec<(f64, String, String)> = report
        .status_writes
        .iter()
        .filter(|w| w.job == "default/small")
        .filter_map(|w| {
            let c = condition(&w.status, "WorkerAdmitted")?;
            Some((
                w.at,
                c["status"].as_str()?.into(),
                c["reason"].as_str()?.into(),
            ))
        })
        .collect();
    assert_eq!(
        worker_admitted.first(),
        Some(&(60.0, "False".into(), "Pending".into()))
    );
    assert_eq!(
        worker_admitted.iter().find(|w| w.1 == "True"),
        Some(&(600.0, "True".into(), "Admitted".into()))
    );
    let last = &report
        .status_writes
        .iter()
        .rfind(|w| w.job == "default/small")
        .unwrap()
        .status;
    assert!(is_true(
        &serde_json::from_value(last.clone()).unwrap(),
        "Complete"
    ));
    // Mirrored from the copy: resumed when admitted.
    assert_eq!(last["startTime"], "2026-01-01T00:10:00Z");
}

#[test]
fn no_job_goes_where_the_worker_s_kueue_quota_cannot_cover_it_now() {
    // 2 CPUs of `own`'s quota are free: a 3-CPU Job goes to `plain`, though `own`'s nodes
    // are idle; a 12-CPU one fits neither and waits, the reason naming `own`'s quota.
    let jobs = [cpu_job("three", "1m", 1, 3), cpu_job("twelve", "1m", 3, 4)].join("\n");
    let report = run(
        &kueue_scenario("[own, plain]", "", &jobs),
        Strategy::Switchyard,
    );
    let three = job(&report, "three");
    assert_eq!(three.cluster.as_deref(), Some("plain"));
    assert_eq!(seconds(&three.started), 70.0);
    assert!(times(&report, "three", "dispatched to worker own").is_empty());
    // Even once the worker's own workloads have ended, its whole quota is 8 CPUs, not 12:
    // the run ends with `twelve` waiting.
    let twelve = job(&report, "twelve");
    assert_eq!(twelve.result, "Pending");
    assert!(times(&report, "twelve", "dispatched").is_empty());
    let why = twelve.reason.as_deref().unwrap_or_default();
    assert!(
        why.contains(
            "own: its Kueue ClusterQueue \"cluster-queue\" has 8 cpu of quota free, the gang needs 12"
        ),
        "{why}"
    );
}

#[test]
fn a_copy_its_worker_s_kueue_does_not_admit_in_time_is_taken_back_uncounted_and_runs_elsewhere() {
    // As above, `small` waits behind the worker's own 4-CPU workload; the queue waits 5
    // minutes (the default workerAdmissionTimeout) for the worker's Kueue, then takes the
    // copy back and sends the Job to `plain`.
    let yaml = kueue_scenario("[own, plain]", "", &cpu_job("small", "1m", 1, 1));
    let s = scenario::parse(&yaml).unwrap();
    let report = Simulation::new(&s, Strategy::Switchyard)
        .with_events()
        .with_usage_history()
        .run();
    assert_eq!(times(&report, "small", "dispatched to worker own"), [60.0]);
    let requeued = times(
        &report,
        "small",
        "requeued: worker own's Kueue did not admit the Job within workerAdmissionTimeout (300s)",
    );
    assert_eq!(requeued, [360.0], "{:#?}", report.events);
    assert_eq!(
        times(&report, "small", "removing its copy from worker own"),
        [360.0]
    );
    assert_eq!(
        times(&report, "small", "dispatched to worker plain"),
        [360.0]
    );
    let small = job(&report, "small");
    assert_eq!(small.cluster.as_deref(), Some("plain"));
    assert_eq!((small.result.as_str(), small.requeues), ("Succeeded", 0));
    assert_eq!(seconds(&small.started), 370.0);
    // The copy deleted in `own` left its Kueue: none of its pods ever ran there, not even
    // once the quota had room (at 600 s).
    let own = report
        .capacity
        .iter()
        .find(|c| c.cluster == "own" && c.resource == "cpu")
        .expect("own's CPUs are charted");
    assert!(own.steps.iter().all(|(_, used)| *used == 0.0), "{own:?}");
}

#[test]
fn a_jobset_waits_for_quota_for_all_its_pods_in_a_kueue_worker() {
    // 3 pods of 1 CPU in two replicated Jobs: 3 CPUs of `own`'s quota, 2 free until the
    // first workload ends; then the 4-CPU one goes first (it came first) and 4 are left.
    let yaml = kueue_scenario(
        "[own]",
        "",
        r#"  - name: set
    kind: JobSet
    queue: batch
    submitAt: 1m
    duration: 5m
    replicatedJobs:
      - {name: leader, template: {containers: [{name: c, resources: {requests: {cpu: "1", memory: 1Gi}}}]}}
      - {name: workers, replicas: 2, template: {containers: [{name: c, resources: {requests: {cpu: "1", memory: 1Gi}}}]}}"#,
    );
    let report = run_with_writes(&yaml);
    assert_eq!(
        jobset_times(&report, "set", "dispatched to worker own"),
        [600.0]
    );
    let set = report.jobs.iter().find(|j| j.name == "set").unwrap();
    assert_eq!(set.result, "Succeeded");
    assert_eq!(seconds(&set.started), 600.0);
    let writes = jobset_writes(&report, "set");
    let last = &writes.last().unwrap().1;
    assert_eq!(last["terminalState"], "Completed");
    // The worker's Kueue resumed the copy: the manager's JobSet says so in `WorkerAdmitted`,
    // and the copy's own `Suspended` condition is not mirrored.
    let admitted = condition(last, "WorkerAdmitted").expect("WorkerAdmitted");
    assert_eq!(admitted["status"], "True");
    assert!(condition(last, "Suspended").is_none());
}

#[test]
fn the_kueue_example_runs_as_its_comments_say() {
    let s = scenario::load(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/kueue-scenario.yaml"
    )))
    .expect("the example parses");
    assert!(s.kueue("team-a").is_some() && s.kueue("shared").is_none());
    let report = Simulation::new(&s, Strategy::Switchyard)
        .with_events()
        .run();
    for j in &report.jobs {
        assert_eq!(
            (j.name.as_str(), j.result.as_str()),
            (j.name.as_str(), "Succeeded")
        );
    }
    assert_eq!(
        times(&report, "etl-1", "dispatched to worker team-a"),
        [0.0]
    );
    assert_eq!(
        times(&report, "etl-3", "dispatched to worker team-a"),
        [180.0]
    );
    assert_eq!(
        times(&report, "etl-3", "dispatched to worker shared"),
        [360.0]
    );
    assert_eq!(job(&report, "etl-3").requeues, 0);
    assert_eq!(
        times(&report, "etl-6", "dispatched to worker shared"),
        [920.0]
    );
}

#[test]
fn jobs_offered_at_once_to_a_kueue_worker_count_against_its_quota_together() {
    // `own` has 2 CPUs of quota free, and no workload of its own waits: of two 2-CPU Jobs
    // judged in one pass, only the first may also be offered there; the second would only
    // wait in its queue.
    let yaml = r#"
clusters:
  - name: own
    kueue:
      quota: {cpu: "8", memory: 64Gi}
      localWorkloads: [{submitAt: 0s, duration: 1h, request: {cpu: "6"}}]
    nodes: [{name: own-1, allocatable: {cpu: "32", memory: 128Gi, pods: "110"}}]
  - name: plain
    nodes: [{name: plain-1, allocatable: {cpu: "8", memory: 32Gi, pods: "110"}}]
queues:
  - {name: batch, clusters: [own, plain]}
jobs:
"#
    .to_string()
        + &[cpu_job("a", "1m", 1, 2), cpu_job("b", "1m", 1, 2)].join("\n");
    let report = run(&yaml, Strategy::AllAtOnce);
    assert_eq!(times(&report, "a", "offered to workers own, plain"), [60.0]);
    assert_eq!(
        times(&report, "b", "dispatched to worker plain"),
        [60.0],
        "{:#?}",
        report.events
    );
    for name in ["a", "b"] {
        assert_eq!(job(&report, name).result, "Succeeded");
    }
}

/// `tall`: two nodes of 32 CPUs; `wide`: four of 8 (SCHEDULER: each worker's
/// `schedulerName` line, or nothing). `train`'s four pods of 4 CPUs keep one to a node, as
/// distributed training Jobs often ask; `packed` is the same Job without that.
const ONE_POD_PER_NODE: &str = r#"
clusters:
  - name: tall
    SCHEDULER
    nodes:
      - {name: tall-1, allocatable: {cpu: "32", memory: 64Gi, pods: "110"}}
      - {name: tall-2, allocatable: {cpu: "32", memory: 64Gi, pods: "110"}}
  - name: wide
    SCHEDULER
    nodes:
      - {name: wide-1, allocatable: {cpu: "8", memory: 16Gi, pods: "110"}}
      - {name: wide-2, allocatable: {cpu: "8", memory: 16Gi, pods: "110"}}
      - {name: wide-3, allocatable: {cpu: "8", memory: 16Gi, pods: "110"}}
      - {name: wide-4, allocatable: {cpu: "8", memory: 16Gi, pods: "110"}}
queues:
  - name: training
    clusters: [tall, wide]
    waitForPodsReady: {enabled: true, timeout: 5m, requeuing: {backoffBase: 1m, limit: 2}}
jobs:
  - name: train
    queue: training
    submitAt: 0s
    parallelism: 4
    duration: 30m
    podStartDelay: 10s
    template:
      containers: [{name: c, resources: {requests: {cpu: "4", memory: 2Gi}}}]
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            - labelSelector: {matchLabels: {batch.kubernetes.io/job-name: train}}
              topologyKey: kubernetes.io/hostname
  - {name: packed, queue: training, submitAt: 1h, parallelism: 4, duration: 30m, podStartDelay: 10s, template: {containers: [{name: c, resources: {requests: {cpu: "4", memory: 2Gi}}}]}}
"#;

#[test]
fn a_gang_that_keeps_one_pod_to_a_node_is_sent_where_there_are_nodes_enough() {
    // `tall` holds it packed two to a node, not one to a node.
    sent_where_it_fits(ONE_POD_PER_NODE);
}

/// `scenario` (with `SCHEDULER` for each worker's scheduler setting) sends Job `train`, 4 pods
/// kept apart, to `wide`, the worker where they fit apart, under both scheduler setups, where
/// the same Job unkept (`packed`) goes to `tall`, which looks emptier; and a dispatcher that
/// judges by summed room sends it to `tall`, where the worker's scheduler leaves two pods
/// Pending until waitForPodsReady takes the Job back.
fn sent_where_it_fits(scenario: &str) {
    for scheduler in ["", "schedulerName: switchyard-scheduler"] {
        let scenario = scenario.replace("SCHEDULER", scheduler);
        let r = run(&scenario, Strategy::Switchyard);
        let train = job(&r, "train");
        assert_eq!(train.cluster.as_deref(), Some("wide"), "{scheduler:?}");
        assert_eq!((train.result.as_str(), train.requeues), ("Succeeded", 0));
        assert_eq!(seconds(&train.started), 10.0, "it runs at once");
        assert_eq!(job(&r, "packed").cluster.as_deref(), Some("tall"));
        let r = run(&scenario, Strategy::SumAggregate);
        let train = job(&r, "train");
        assert!(train.requeues >= 1, "{scheduler:?}: {train:?}");
        assert!(seconds(&train.started) >= 300.0, "{scheduler:?}: {train:?}");
    }
}

/// The anti-affinity that keeps Job `train`'s pods one to a node in [`ONE_POD_PER_NODE`].
const APART: &str = "      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            - labelSelector: {matchLabels: {batch.kubernetes.io/job-name: train}}
              topologyKey: kubernetes.io/hostname
";

/// [`ONE_POD_PER_NODE`] with Job `train` spread over nodes instead, and a third node in `tall`
/// with a taint the Job does not tolerate: PodTopologySpread still counts it
/// (nodeTaintsPolicy: Ignore), with none of the pods.
fn spread_over_nodes() -> String {
    const TALL_2: &str =
        "      - {name: tall-2, allocatable: {cpu: \"32\", memory: 64Gi, pods: \"110\"}}\n";
    const SPREAD: &str = "      topologySpreadConstraints:
        - maxSkew: 1
          topologyKey: kubernetes.io/hostname
          whenUnsatisfiable: DoNotSchedule
          labelSelector: {matchLabels: {batch.kubernetes.io/job-name: train}}
";
    let tainted = format!(
        "{TALL_2}      - {{name: tall-3, allocatable: {{cpu: \"32\", memory: 64Gi, pods: \"110\"}}, taints: [{{key: dedicated, value: db, effect: NoSchedule}}]}}\n"
    );
    assert!(ONE_POD_PER_NODE.contains(TALL_2) && ONE_POD_PER_NODE.contains(APART));
    ONE_POD_PER_NODE
        .replace(TALL_2, &tainted)
        .replace(APART, SPREAD)
}

/// [`ONE_POD_PER_NODE`] with Job `train` kept together in one zone instead: `wide`'s nodes
/// are all in one zone, and `tall`'s two nodes, in two zones, have room for three of its pods
/// each.
fn together_in_a_zone() -> String {
    const TOGETHER: &str = "      affinity:
        podAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            - labelSelector: {matchLabels: {batch.kubernetes.io/job-name: train}}
              topologyKey: topology.kubernetes.io/zone
";
    assert!(ONE_POD_PER_NODE.contains(APART));
    let mut scenario = ONE_POD_PER_NODE.replace(APART, TOGETHER);
    for (node, zone, cpu) in [("tall-1", "x", "12"), ("tall-2", "y", "12")] {
        let old = format!("{{name: {node}, allocatable: {{cpu: \"32\"");
        let new = format!("{{name: {node}, labels: {{topology.kubernetes.io/zone: {zone}}}, allocatable: {{cpu: \"{cpu}\"");
        assert!(scenario.contains(&old), "{old}");
        scenario = scenario.replace(&old, &new);
    }
    for i in 1..=4 {
        let old = format!("{{name: wide-{i}, ");
        assert!(scenario.contains(&old), "{old}");
        scenario = scenario.replace(
            &old,
            &format!("{old}labels: {{topology.kubernetes.io/zone: w}}, "),
        );
    }
    scenario
}

#[test]
fn a_gang_kept_together_in_a_zone_is_sent_where_one_zone_holds_it() {
    // `tall` holds it across its two zones, three and one, not in one.
    sent_where_it_fits(&together_in_a_zone());
}

#[test]
fn a_gang_that_spreads_over_nodes_is_sent_where_its_spread_fits() {
    // In `tall` the tainted node counts with none of the pods: each other node may take one,
    // 2 of 4.
    sent_where_it_fits(&spread_over_nodes());
}
