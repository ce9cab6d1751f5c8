//! Workers that run Kueue (`WorkerCluster.spec.kueue`), through the live dispatcher and fake
//! API servers on loopback: copies enter the worker's own LocalQueue suspended, placement
//! reads the worker's ClusterQueue, timers count from the worker's admission, a copy the
//! worker does not admit in time is taken back. The fake worker plays its Kueue by hand:
//! it unsuspends a copy, writes its Workload's conditions, changes its ClusterQueue.

mod common;

use common::dispatch::{annotation, condition, eventually, job, queue, Fleet, WorkerSpec, NS};
use common::fake_api::JOBS;
use serde_json::{json, Value};

const CLUSTER_QUEUES: &str = "/apis/kueue.x-k8s.io/v1beta1/clusterqueues";
const LOCAL_QUEUES: &str = "/apis/kueue.x-k8s.io/v1beta1/localqueues";
const WORKLOADS: &str = "/apis/kueue.x-k8s.io/v1beta1/workloads";

fn cluster_queue(cpus: u32, reserved: u32) -> Value {
    json!({
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue",
        "metadata": {"name": "cluster-queue"},
        "spec": {"namespaceSelector": {}, "resourceGroups": [{
            "coveredResources": ["cpu", "memory"],
            "flavors": [{"name": "default-flavor", "resources": [
                {"name": "cpu", "nominalQuota": cpus},
                {"name": "memory", "nominalQuota": "256Gi"}]}]}]},
        "status": {"flavorsReservation": [{"name": "default-flavor", "resources": [
            {"name": "cpu", "total": reserved.to_string(), "borrowed": "0"},
            {"name": "memory", "total": "0", "borrowed": "0"}]}]}
    })
}

/// `kueue` (a worker that runs Kueue, its ClusterQueue `cpus` CPUs of quota) and `plain`.
async fn fleet(cpus: u32, q: Value) -> Fleet {
    let workers = [
        WorkerSpec {
            name: "kueue",
            nodes: 2,
            cpu: 8,
        },
        WorkerSpec {
            name: "plain",
            nodes: 2,
            cpu: 8,
        },
    ];
    let mut fleet = Fleet::start(&workers, q).await;
    let k = &fleet.workers["kueue"];
    k.allow_kueue_reads();
    k.upsert(CLUSTER_QUEUES, cluster_queue(cpus, 0));
    k.upsert(
        LOCAL_QUEUES,
        json!({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
               "metadata": {"name": "user-queue", "namespace": NS},
               "spec": {"clusterQueue": "cluster-queue"}}),
    );
    fleet.views.get_mut("kueue").unwrap().kueue = Some("user-queue".into());
    fleet.publish();
    fleet
}

fn copy_in(fleet: &Fleet, worker: &str, name: &str) -> Option<Value> {
    fleet.workers[worker]
        .get(JOBS, NS, name)
        .filter(|c| c["metadata"]["deletionTimestamp"].is_null())
}

/// The worker's Kueue admits the copy: its Workload reserves quota, the Job controller
/// resumes it.
fn kueue_admits(fleet: &Fleet, name: &str) {
    let api = &fleet.workers["kueue"];
    let mut copy = api.get(JOBS, NS, name).expect("a copy");
    let uid = copy["metadata"]["uid"].clone();
    api.upsert(
        WORKLOADS,
        json!({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
               "metadata": {"name": format!("job-{name}"), "namespace": NS,
                            "labels": {"kueue.x-k8s.io/job-uid": uid}},
               "status": {"conditions": [
                   {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": "Quota reserved in ClusterQueue cluster-queue", "lastTransitionTime": "2026-11-26T06:00:00Z"},
                   {"type": "Admitted", "status": "True", "reason": "Admitted", "message": "The workload is admitted", "lastTransitionTime": "2026-11-26T06:00:00Z"}]}}),
    );
    copy["spec"]["suspend"] = json!(false);
    copy["status"] = json!({"active": 1, "ready": 0, "startTime": common::dispatch::now_rfc3339(),
        "conditions": [{"type": "Suspended", "status": "False", "reason": "JobResumed",
                        "message": "Job resumed", "lastTransitionTime": common::dispatch::now_rfc3339(),
                        "lastProbeTime": common::dispatch::now_rfc3339()}]});
    api.upsert(JOBS, copy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_enters_the_workers_own_queue_suspended_and_runs_once_admitted() {
    let fleet = fleet(16, queue("research", &["kueue", "plain"], json!({}))).await;
    let _d = fleet.dispatcher(true);
    fleet.submit(job("train", "research", 2, 4));
    eventually(10, "a copy in the Kueue worker", || {
        copy_in(&fleet, "kueue", "train").is_some()
    })
    .await;
    let copy = copy_in(&fleet, "kueue", "train").unwrap();
    assert_eq!(
        copy["spec"]["suspend"], true,
        "the worker's Kueue unsuspends it"
    );
    assert_eq!(
        copy["metadata"]["labels"]["kueue.x-k8s.io/queue-name"],
        "user-queue"
    );
    eventually(10, "the manager's Job waits for the worker's Kueue", || {
        condition(&fleet.job("train"), "WorkerAdmitted")
            .is_some_and(|c| c["status"] == "False" && c["reason"] == "Pending")
    })
    .await;
    // Never unsuspended by Switchyard.
    assert_eq!(
        copy_in(&fleet, "kueue", "train").unwrap()["spec"]["suspend"],
        true
    );
    // The worker's Job controller says the copy is suspended: that is the worker's business,
    // not the manager's Job's (it is not suspended), and is not mirrored.
    fleet.copy_status(
        "kueue",
        "train",
        json!({"conditions": [{"type": "Suspended", "status": "True", "reason": "JobSuspended",
            "message": "Job suspended", "lastTransitionTime": common::dispatch::now_rfc3339(),
            "lastProbeTime": common::dispatch::now_rfc3339()}]}),
    );
    kueue_admits(&fleet, "train");
    eventually(10, "WorkerAdmitted", || {
        let j = fleet.job("train");
        condition(&j, "WorkerAdmitted").is_some_and(|c| c["status"] == "True")
            && j["status"]["startTime"].is_string()
    })
    .await;
    assert!(condition(&fleet.job("train"), "Suspended").is_none());
    assert!(fleet.uncovered().is_empty(), "{:?}", fleet.uncovered());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placement_reads_the_workers_quota_and_sees_it_change() {
    // The Kueue worker's ClusterQueue has 4 CPUs: an 8-CPU gang is not sent there.
    let fleet = fleet(4, queue("research", &["kueue"], json!({}))).await;
    let d = fleet.dispatcher(true);
    fleet.submit(job("train", "research", 2, 4));
    eventually(10, "waits for the worker's quota", || {
        condition(&fleet.job("train"), "Admitted").is_some_and(|c| {
            c["status"] == "False"
                && c["reason"] == "WorkerQuotaExceeded"
                && c["message"].as_str().is_some_and(|m| {
                    m.contains("its Kueue ClusterQueue \"cluster-queue\" has 4 cpu of quota free, the gang needs 8")
                })
        })
    })
    .await;
    d.settled().await;
    assert!(copy_in(&fleet, "kueue", "train").is_none());
    // The worker's quota grows: seen, and the Job goes there.
    fleet.workers["kueue"].upsert(CLUSTER_QUEUES, cluster_queue(12, 2));
    eventually(10, "sent once the quota has room", || {
        copy_in(&fleet, "kueue", "train").is_some()
    })
    .await;
}

/// `train` (2 pods of 4 CPUs) sent to the Kueue worker, whose queue has room; `plain` beside.
async fn sent_to_kueue(admission_timeout: &str) -> (Fleet, common::dispatch::Running) {
    let fleet = fleet(
        16,
        queue(
            "research",
            &["kueue", "plain"],
            json!({"workerAdmissionTimeout": admission_timeout}),
        ),
    )
    .await;
    let d = fleet.dispatcher(true);
    fleet.submit(job("train", "research", 2, 4));
    eventually(10, "a copy in the Kueue worker", || {
        copy_in(&fleet, "kueue", "train").is_some()
    })
    .await;
    (fleet, d)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_the_worker_never_admits_is_taken_back_uncounted_and_runs_elsewhere() {
    let (fleet, _d) = sent_to_kueue("1s").await;
    eventually(10, "taken back and running in plain", || {
        let j = fleet.job("train");
        condition(&j, "Requeued").is_some_and(|c| c["reason"] == "WorkerAdmissionTimeout")
            && annotation(&j, "switchyard.dev/cluster") == Some("plain")
            && copy_in(&fleet, "plain", "train").is_some()
            && copy_in(&fleet, "kueue", "train").is_none()
    })
    .await;
    let j = fleet.job("train");
    assert_eq!(
        annotation(&j, "switchyard.dev/requeues").unwrap_or("0"),
        "0",
        "never counted towards requeuing.limit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_the_workers_kueue_evicts_says_why_then_goes_elsewhere() {
    let (fleet, _d) = sent_to_kueue("2s").await;
    kueue_admits(&fleet, "train");
    eventually(10, "WorkerAdmitted", || {
        condition(&fleet.job("train"), "WorkerAdmitted").is_some_and(|c| c["status"] == "True")
    })
    .await;
    // The worker's Kueue preempts it: the Workload says so, the copy is suspended again.
    let api = &fleet.workers["kueue"];
    let mut wl = api.list(WORKLOADS).remove(0);
    wl["status"]["conditions"] = json!([
        {"type": "Evicted", "status": "True", "reason": "Preempted",
         "message": "Preempted to accommodate a workload (UID: 1) due to prioritization in the ClusterQueue",
         "lastTransitionTime": common::dispatch::now_rfc3339()}]);
    api.upsert(WORKLOADS, wl);
    let mut copy = api.get(JOBS, NS, "train").unwrap();
    copy["spec"]["suspend"] = json!(true);
    copy["status"]["conditions"] = json!([{"type": "Suspended", "status": "True",
        "reason": "JobSuspended", "message": "Job suspended",
        "lastTransitionTime": common::dispatch::now_rfc3339(),
        "lastProbeTime": common::dispatch::now_rfc3339()}]);
    copy["status"]["active"] = json!(0);
    api.upsert(JOBS, copy);
    eventually(10, "the manager's Job says the worker preempted it", || {
        condition(&fleet.job("train"), "WorkerAdmitted").is_some_and(|c| {
            c["status"] == "False"
                && c["reason"] == "Preempted"
                && c["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("due to prioritization"))
        })
    })
    .await;
    eventually(10, "not admitted again in time: runs in plain", || {
        annotation(&fleet.job("train"), "switchyard.dev/cluster") == Some("plain")
            && copy_in(&fleet, "plain", "train").is_some()
    })
    .await;
}
