//! JobSets through the live dispatcher, between fake API servers on loopback (see
//! tests/common/dispatch.rs): the same flow as Jobs, with the JobSet's own copy, gang and
//! status. The objects are the ones captured from kube-apiserver with the real JobSet
//! controller (tests/fixtures/kube-api/jobset).

mod common;

use common::dispatch::{annotation, condition, eventually, queue, Fleet, WorkerSpec, NS};
use common::fake_api::{Refusal, JOBSETS};
use serde_json::{json, Value};

/// A captured object: the response body of an exchange in tests/fixtures/kube-api/jobset.
fn captured(name: &str) -> Value {
    let path = format!(
        "{}/tests/fixtures/kube-api/jobset/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let exchange: Value = serde_json::from_str(&text).expect("an exchange is JSON");
    exchange["response"]["body"].clone()
}

/// The queued JobSet `trainer` as the manager's API server stored it (defaulted by the JobSet
/// webhook, suspended and managed by Switchyard's): `driver` (1 Job of 1 pod) and `workers`
/// (2 Jobs of 2 pods). Its captured replicated Jobs ask for different pods; here both ask
/// for `cpu` CPUs, unless `as_captured`.
fn trainer(name: &str, cpu: u32, as_captured: bool) -> Value {
    let mut js = captured("get_jobset_queued");
    let meta = js["metadata"].as_object_mut().unwrap();
    meta.remove("managedFields");
    meta.insert("name".into(), name.into());
    meta.insert(
        "uid".into(),
        format!(
            "91413810-e95f-4305-a315-{:012x}",
            name.len() * 7919 + cpu as usize
        )
        .into(),
    );
    if !as_captured {
        for rj in js["spec"]["replicatedJobs"].as_array_mut().unwrap() {
            let pod = &mut rj["template"]["spec"]["template"]["spec"];
            let resources = json!({"cpu": cpu.to_string(), "memory": "1Gi"});
            pod["containers"][0]["resources"] = json!({"requests": resources, "limits": resources});
        }
    }
    js
}

fn worker(name: &'static str, nodes: u32) -> WorkerSpec {
    WorkerSpec {
        name,
        nodes,
        cpu: 4,
    }
}

/// A fleet whose manager and workers all serve the JobSet API (`but` not), JobSets on.
async fn fleet(workers: &[WorkerSpec], q: Value, without_crd: &[&str]) -> Fleet {
    let fleet = Fleet::start(workers, q).await;
    fleet.manager.serve_jobsets();
    for (name, api) in &fleet.workers {
        if !without_crd.contains(&name.as_str()) {
            api.serve_jobsets();
        }
    }
    fleet
}

fn jobset(fleet: &Fleet, name: &str) -> Value {
    fleet.manager.get(JOBSETS, NS, name).unwrap_or(Value::Null)
}

fn copies(fleet: &Fleet, name: &str) -> Vec<(String, Value)> {
    fleet
        .workers
        .iter()
        .filter_map(|(w, api)| api.get(JOBSETS, NS, name).map(|c| (w.clone(), c)))
        .filter(|(_, c)| c["metadata"]["deletionTimestamp"].is_null())
        .collect()
}

/// Sets a worker copy's status, as the worker's JobSet controller would.
fn copy_status(fleet: &Fleet, worker: &str, name: &str, status: Value) {
    let api = &fleet.workers[worker];
    let mut copy = api.get(JOBSETS, NS, name).expect("copy exists");
    copy["status"] = status;
    api.upsert(JOBSETS, copy);
}

fn running_status(ready_jobs: (i32, i32)) -> Value {
    let rjs = |name: &str, jobs: i32, ready: i32| json!({"name": name, "active": jobs, "ready": ready, "succeeded": 0, "failed": 0, "suspended": 0});
    json!({"replicatedJobsStatus": [rjs("workers", 2, ready_jobs.1), rjs("driver", 1, ready_jobs.0)],
           "restarts": 0})
}

fn research(clusters: &[&str], extra: Value) -> Value {
    queue("research", clusters, extra)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_jobset_runs_as_one_gang_in_one_worker_and_its_status_comes_back() {
    // 5 pods of 2 CPUs: only `big` (4 nodes of 4 CPUs) holds the whole gang.
    let fleet = fleet(
        &[worker("small", 2), worker("big", 4)],
        research(
            &["small", "big"],
            json!({"waitForPodsReady": {"timeout": "1h"}}),
        ),
        &[],
    )
    .await;
    let _d = fleet.dispatcher(true);
    fleet.manager.upsert(JOBSETS, trainer("trainer", 2, false));
    eventually(10, "a copy in big", || copies(&fleet, "trainer").len() == 1).await;
    let (w, copy) = copies(&fleet, "trainer").remove(0);
    assert_eq!(w, "big");
    assert_eq!(copy["kind"], "JobSet");
    assert_eq!(copy["spec"]["suspend"], false);
    assert!(copy["spec"].get("managedBy").is_none(), "{copy}");
    let uid = jobset(&fleet, "trainer")["metadata"]["uid"].clone();
    assert_eq!(copy["metadata"]["labels"]["switchyard.dev/origin-uid"], uid);
    assert!(copy["metadata"]["labels"]
        .get("switchyard.dev/queue-name")
        .is_none());
    for rj in copy["spec"]["replicatedJobs"].as_array().unwrap() {
        let template = &rj["template"]["spec"]["template"];
        assert_eq!(
            template["metadata"]["labels"]["switchyard.dev/origin-uid"],
            uid
        );
        assert_eq!(
            template["metadata"]["annotations"]["switchyard.dev/gang-size"], "5",
            "the worker's extender sees the whole gang"
        );
        // The JobSet's own fields are carried over as they are.
        assert_eq!(
            template["metadata"]["annotations"]["fake-kubelet/run-seconds"],
            "4"
        );
    }
    assert_eq!(copy["spec"]["network"]["enableDNSHostnames"], true);
    eventually(10, "the manager's JobSet unsuspended and Admitted", || {
        let js = jobset(&fleet, "trainer");
        js["spec"]["suspend"] == false
            && annotation(&js, "switchyard.dev/cluster") == Some("big")
            && condition(&js, "Admitted").is_some_and(|c| c["status"] == "True")
    })
    .await;

    // Ready counts whole Jobs: 2 of 3 Jobs ready is 3 of 5 pods, not yet PodsReady.
    copy_status(&fleet, "big", "trainer", running_status((1, 1)));
    eventually(10, "3 of 5 pods Ready", || {
        condition(&jobset(&fleet, "trainer"), "PodsReady")
            .is_some_and(|c| c["status"] == "False" && c["message"] == "3 of 5 pods Ready")
    })
    .await;
    copy_status(&fleet, "big", "trainer", running_status((1, 2)));
    eventually(10, "PodsReady", || {
        let js = jobset(&fleet, "trainer");
        condition(&js, "PodsReady").is_some_and(|c| c["status"] == "True")
            && js["status"]["replicatedJobsStatus"][0]["ready"] == 2
    })
    .await;

    // The worker's JobSet controller finishes it: the manager's says so, the copy goes.
    let done = captured("get_jobset_completed")["status"].clone();
    copy_status(&fleet, "big", "trainer", done.clone());
    eventually(10, "Completed on the manager, copy removed", || {
        let js = jobset(&fleet, "trainer");
        condition(&js, "Completed").is_some_and(|c| c["reason"] == "AllJobsCompleted")
            && js["status"]["terminalState"] == "Completed"
            && copies(&fleet, "trainer").is_empty()
    })
    .await;
    let js = jobset(&fleet, "trainer");
    assert_eq!(
        js["status"]["replicatedJobsStatus"],
        done["replicatedJobsStatus"]
    );
    assert_eq!(annotation(&js, "switchyard.dev/result"), Some("Succeeded"));
    assert!(fleet.uncovered().is_empty(), "{:?}", fleet.uncovered());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_copy_ends_the_jobset_failed() {
    let fleet = fleet(&[worker("big", 4)], research(&["big"], json!({})), &[]).await;
    let _d = fleet.dispatcher(true);
    fleet.manager.upsert(JOBSETS, trainer("trainer", 2, false));
    eventually(10, "a copy", || copies(&fleet, "trainer").len() == 1).await;
    let failed = captured("get_jobset_failed")["status"].clone();
    copy_status(&fleet, "big", "trainer", failed);
    eventually(10, "Failed on the manager", || {
        let js = jobset(&fleet, "trainer");
        condition(&js, "Failed").is_some_and(|c| c["reason"] == "FailedJobs")
            && js["status"]["terminalState"] == "Failed"
            && copies(&fleet, "trainer").is_empty()
    })
    .await;
    assert_eq!(
        annotation(&jobset(&fleet, "trainer"), "switchyard.dev/result"),
        Some("Failed")
    );
}

/// `trainer` as captured, but CPUs only (the fake workers have no GPUs): `driver` asks for 1
/// CPU, `workers` for 2.
fn trainer_of_two_shapes(name: &str) -> Value {
    let mut js = trainer(name, 2, true);
    for rj in js["spec"]["replicatedJobs"].as_array_mut().unwrap() {
        let resources =
            &mut rj["template"]["spec"]["template"]["spec"]["containers"][0]["resources"];
        for side in ["requests", "limits"] {
            resources[side]
                .as_object_mut()
                .unwrap()
                .remove("nvidia.com/gpu");
        }
    }
    js
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobset_whose_replicated_jobs_ask_for_different_pods_is_placed_whole() {
    // 4 workers' pods of 2 CPUs and a driver of 1 CPU: `tight` (2 nodes of 4 CPUs) holds the
    // workers but not the driver beside them; `roomy` (3 nodes) holds both.
    let fleet = fleet(
        &[worker("tight", 2), worker("roomy", 3)],
        research(&["tight", "roomy"], json!({})),
        &[],
    )
    .await;
    let _d = fleet.dispatcher(true);
    fleet
        .manager
        .upsert(JOBSETS, trainer_of_two_shapes("trainer"));
    eventually(10, "a copy", || copies(&fleet, "trainer").len() == 1).await;
    let (w, copy) = copies(&fleet, "trainer").remove(0);
    assert_eq!(w, "roomy");
    // Each replicated Job's pods are told the gang of their own shape.
    let sizes: Vec<(&str, &str)> = copy["spec"]["replicatedJobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|rj| {
            (
                rj["name"].as_str().unwrap(),
                rj["template"]["spec"]["template"]["metadata"]["annotations"]
                    ["switchyard.dev/gang-size"]
                    .as_str()
                    .unwrap(),
            )
        })
        .collect();
    assert_eq!(sizes, [("driver", "1"), ("workers", "4")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobset_no_worker_holds_whole_waits_and_says_why() {
    // `tight` (2 nodes of 4 CPUs) holds the 4 workers' pods of 2 CPUs, but not the driver of 1
    // CPU beside them; the quota (9 CPUs) would hold all 5.
    let quota = json!({"quota": {"cpu": "9"}});
    let fleet = fleet(&[worker("tight", 2)], research(&["tight"], quota), &[]).await;
    let d = fleet.dispatcher(true);
    fleet
        .manager
        .upsert(JOBSETS, trainer_of_two_shapes("trainer"));
    eventually(10, "a reason to wait", || {
        condition(&jobset(&fleet, "trainer"), "Admitted")
            .is_some_and(|c| c["status"] == "False" && c["reason"] == "NeverFits")
    })
    .await;
    d.settled().await;
    // The message names the part that does not fit, and beside what.
    let admitted = condition(&jobset(&fleet, "trainer"), "Admitted").cloned();
    assert_eq!(
        admitted.unwrap()["message"],
        "no worker of queue \"research\" could hold the gang of 5 pods even empty: tight: replicated Job driver, beside the pods of replicated Job workers: needs 1 cpu on one node; node tight-n0 has 0 free of 4 allocatable"
    );
    assert!(copies(&fleet, "trainer").is_empty());
    assert_eq!(jobset(&fleet, "trainer")["spec"]["suspend"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_counts_every_pod_of_a_jobset() {
    // Quota for 12 CPUs: one JobSet of 5 pods × 2 CPUs fits, two do not.
    let fleet = fleet(
        &[worker("big", 8)],
        research(&["big"], json!({"quota": {"cpu": "12"}})),
        &[],
    )
    .await;
    let d = fleet.dispatcher(true);
    fleet.manager.upsert(JOBSETS, trainer("first", 2, false));
    eventually(10, "first dispatched", || {
        copies(&fleet, "first").len() == 1
    })
    .await;
    fleet.manager.upsert(JOBSETS, trainer("second", 2, false));
    eventually(10, "second waits for quota", || {
        condition(&jobset(&fleet, "second"), "Admitted")
            .is_some_and(|c| c["status"] == "False" && c["reason"] == "QuotaExceeded")
    })
    .await;
    d.settled().await;
    assert!(copies(&fleet, "second").is_empty());
    // The first ends: the second runs.
    copy_status(
        &fleet,
        "big",
        "first",
        captured("get_jobset_completed")["status"].clone(),
    );
    eventually(10, "second dispatched", || {
        copies(&fleet, "second").len() == 1
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_workers_jobset_is_requeued_and_runs_elsewhere() {
    let mut fleet = fleet(
        &[worker("east", 4), worker("west", 4)],
        research(&["east", "west"], json!({"workerLostTimeout": "1s"})),
        &[],
    )
    .await;
    let _d = fleet.dispatcher(true);
    fleet.manager.upsert(JOBSETS, trainer("trainer", 2, false));
    eventually(10, "a copy", || copies(&fleet, "trainer").len() == 1).await;
    let first = copies(&fleet, "trainer").remove(0).0;
    let other = if first == "east" { "west" } else { "east" };
    fleet.disconnect(&first);
    eventually(10, "requeued and running in the other worker", || {
        let js = jobset(&fleet, "trainer");
        condition(&js, "Requeued").is_some_and(|c| c["reason"] == "WorkerLost")
            && annotation(&js, "switchyard.dev/cluster") == Some(other)
            && fleet.workers[other].get(JOBSETS, NS, "trainer").is_some()
    })
    .await;
    // The lost worker comes back with its stale copy: removed; one copy runs.
    fleet.reconnect(&first);
    eventually(10, "the stale copy is removed", || {
        let c = copies(&fleet, "trainer");
        c.len() == 1 && c[0].0 == other
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_manager_jobset_removes_its_copy() {
    let fleet = fleet(&[worker("big", 4)], research(&["big"], json!({})), &[]).await;
    let _d = fleet.dispatcher(true);
    fleet.manager.upsert(JOBSETS, trainer("trainer", 2, false));
    eventually(10, "a copy", || copies(&fleet, "trainer").len() == 1).await;
    fleet.manager.delete(JOBSETS, "trainer");
    eventually(10, "the copy is removed", || {
        copies(&fleet, "trainer").is_empty()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_without_the_jobset_api_is_passed_over_and_says_why() {
    // `plain` has room but no JobSet CRD; its Jobs watch still works (and it stays usable for
    // Jobs).
    let fleet = fleet(
        &[worker("plain", 8), worker("big", 4)],
        research(&["plain", "big"], json!({})),
        &["plain"],
    )
    .await;
    fleet.workers["plain"].refuse(Refusal {
        method: "POST",
        plural: "jobsets",
        sub: None,
        code: 404,
        reason: "NotFound",
        message: "the server could not find the requested resource".into(),
    });
    let _d = fleet.dispatcher(true);
    fleet.manager.upsert(JOBSETS, trainer("trainer", 2, false));
    eventually(10, "the copy runs in big", || {
        let c = copies(&fleet, "trainer");
        c.len() == 1 && c[0].0 == "big"
    })
    .await;
    let js = jobset(&fleet, "trainer");
    let refused = annotation(&js, "switchyard.dev/refused-by").unwrap_or_default();
    assert!(
        refused.contains("plain") && refused.contains("does not serve jobset.x-k8s.io/v1alpha2"),
        "{refused}"
    );
    // A Job still goes to `plain`, whose copies of Jobs were listed all along (2 pods of 4
    // CPUs: `big` has 6 CPUs left, on no node more than 4).
    fleet.submit(common::dispatch::job("plain-job", "research", 2, 4));
    eventually(10, "the Job runs in plain", || {
        fleet.workers["plain"]
            .get(common::fake_api::JOBS, NS, "plain-job")
            .is_some()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_jobset_api_in_the_manager_only_jobs_are_watched() {
    let fleet = Fleet::start(&[worker("big", 4)], research(&["big"], json!({}))).await;
    let d = fleet.dispatcher(true);
    fleet.submit(common::dispatch::job("train", "research", 1, 2));
    eventually(10, "the Job runs", || !fleet.copies("train").is_empty()).await;
    d.settled().await;
    assert_eq!(fleet.manager.count("GET", "/jobsets"), 0);
    assert!(fleet.uncovered().is_empty(), "{:?}", fleet.uncovered());
}
