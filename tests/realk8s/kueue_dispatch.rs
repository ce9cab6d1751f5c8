//! Jobs through the dispatcher into a worker that runs the real Kueue controller manager
//! (`w3`, see `env`): a copy waits suspended in the worker's own queue until its quota has
//! room, then runs and completes in the manager; a copy the worker's Kueue never admits is
//! taken back after `workerAdmissionTimeout` and runs in another worker; a quota the worker
//! raises is seen by placement.
//!
//! Each scenario has a namespace, a ClusterQueue and a LocalQueue `switchyard` of its own in
//! `w3`, so they run side by side; every Job here asks for CPU and memory only, which the
//! ClusterQueues cover.

use crate::dispatch::{
    annotation, copy, is_complete, job, job_condition, jobs, status_refusals, summary, uid,
    wait_complete, wait_running_copy, CLUSTER, ORIGIN,
};
use crate::env::{Env, KUEUE_LOCAL_QUEUE, KUEUE_WORKER};
use crate::k8s::kueue::{self, cluster_queue, cluster_queues, workloads, QUEUE_NAME_LABEL};
use crate::k8s::objects::apply;
use crate::k8s::{eventually, ControlPlane};
use crate::Suite;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{DeleteParams, ListParams, PostParams, PropagationPolicy};
use kube::core::DynamicObject;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

const JOB_UID_LABEL: &str = "kueue.x-k8s.io/job-uid";
/// When the manager's Job was last dispatched (RFC 3339, whole seconds).
const ADMITTED_AT: &str = "switchyard.dev/admitted-at";

/// `WorkerAdmitted` of a manager's Job: (status, reason, message).
fn worker_admitted(job: &Job) -> Option<(String, String, String)> {
    job_condition(job, "WorkerAdmitted")
}

/// A Job's view with its `WorkerAdmitted` condition, for failure messages.
fn described(job: &Job) -> String {
    format!(
        "{}; WorkerAdmitted={:?}",
        summary(job),
        worker_admitted(job)
    )
}

/// The Workload Kueue made for the Job whose uid is `job_uid`, if any.
async fn workload_of(
    plane: &ControlPlane,
    ns: &str,
    job_uid: &str,
) -> Result<Option<DynamicObject>, String> {
    let list = workloads(&plane.admin, ns)
        .list(&ListParams::default().labels(&format!("{JOB_UID_LABEL}={job_uid}")))
        .await
        .map_err(|e| e.to_string())?;
    Ok(list.items.into_iter().next())
}

/// A Workload's condition `type_`: (status, reason, message).
fn workload_condition(wl: &DynamicObject, type_: &str) -> Option<(String, String, String)> {
    let c = crate::env::condition(&wl.data, type_);
    let text = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    (!c.is_null()).then(|| (text("status"), text("reason"), text("message")))
}

/// Sets a ClusterQueue of `w3` as `queue` says (server-side apply of the whole object).
async fn set_cluster_queue(plane: &ControlPlane, queue: &Value) {
    apply(&plane.admin, queue, false)
        .await
        .expect("the ClusterQueue is applied");
}

/// The namespace `ns` in the manager, in `w3` and in `others`, with its queues in `w3`.
async fn kueue_namespace<'a>(
    env: &'a Env,
    ns: &str,
    others: &[&str],
    queue: &Value,
) -> &'a ControlPlane {
    let w3 = &env.kueue_worker().await.plane;
    let mut workers = vec![KUEUE_WORKER];
    workers.extend_from_slice(others);
    env.namespace(ns, &workers).await;
    kueue::queues(&w3.admin, ns, KUEUE_LOCAL_QUEUE, queue)
        .await
        .expect("the Kueue queues of the namespace");
    w3
}

/// The ClusterQueue behind the namespace's LocalQueue is held (`stopPolicy: Hold`) while a
/// Job of 2 CPUs, `blocker`, is submitted in w3 itself to the same LocalQueue, then a Job of
/// 2 CPUs, `train`, through the manager: the quota (2 CPUs) shows room, so the copy is sent,
/// labelled with the LocalQueue and suspended, and the manager's Job says `WorkerAdmitted`
/// False (`Pending`). Released, the worker's Kueue admits the older `blocker`; the copy waits,
/// suspended, its Workload short of quota, until `blocker` completes; then Kueue admits and
/// resumes it, its pods run on w3's node, and the manager's Job ends `Complete` with its counts
/// and `WorkerAdmitted` True.
pub async fn a_job_waits_in_the_workers_kueue_until_its_quota_has_room_then_completes(
    suite: Arc<Suite>,
) {
    let env = suite.fleet().await;
    let _shared = env.exclusive.read().await;
    let (ns, cq) = ("kq-wait", "kq-wait");
    let held = cluster_queue(cq, ns, 2, "8Gi", "Hold");
    let w3 = kueue_namespace(&env, ns, &[], &held).await;
    env.queue(ns, &[KUEUE_WORKER], json!({})).await;

    let mut blocker = job("blocker", ns, 2, "1", 0, Some(5));
    blocker.metadata.labels =
        Some([(QUEUE_NAME_LABEL.to_string(), KUEUE_LOCAL_QUEUE.to_string())].into());
    blocker.spec.as_mut().unwrap().suspend = Some(true);
    let worker_jobs = jobs(&w3.admin, ns);
    let blocker = worker_jobs
        .create(&PostParams::default(), &blocker)
        .await
        .expect("the blocker is created in w3");
    eventually(
        "the blocker's Workload in w3",
        Duration::from_secs(30),
        || async {
            workload_of(w3, ns, &uid(&blocker))
                .await?
                .map(|_| ())
                .ok_or_else(|| "no Workload yet".to_string())
        },
    )
    .await;
    // Kueue orders a queue by creation time, to the second: the copy's Workload is younger.
    tokio::time::sleep(Duration::from_millis(1100)).await;

    let manager = jobs(&env.manager.admin, ns);
    manager
        .create(
            &PostParams::default(),
            &job("train", ns, 2, "1", 0, Some(3)),
        )
        .await
        .expect("the Job is created");
    let first = eventually(
        &format!("the copy of {ns}/train in {KUEUE_WORKER}"),
        Duration::from_secs(60),
        || async {
            copy(w3, ns, "train")
                .await?
                .ok_or_else(|| "no copy yet".to_string())
        },
    )
    .await;
    let labels = first.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get(ORIGIN).map(String::as_str), Some("switchyard"));
    assert_eq!(
        labels.get(QUEUE_NAME_LABEL).map(String::as_str),
        Some(KUEUE_LOCAL_QUEUE),
        "the copy enters the worker's LocalQueue"
    );
    assert_eq!(
        first.spec.as_ref().and_then(|s| s.suspend),
        Some(true),
        "the copy waits for the worker's Kueue: {}",
        summary(&first)
    );
    eventually(
        "the manager's Job waiting for the worker's Kueue (WorkerAdmitted False, Pending)",
        Duration::from_secs(30),
        || {
            let manager = manager.clone();
            async move {
                let job = manager.get("train").await.map_err(|e| e.to_string())?;
                match worker_admitted(&job) {
                    Some((s, r, _)) if s == "False" && r == "Pending" => Ok(()),
                    _ => Err(described(&job)),
                }
            }
        },
    )
    .await;

    // Released: the blocker, older, takes the whole quota; the copy waits for it.
    set_cluster_queue(w3, &cluster_queue(cq, ns, 2, "8Gi", "None")).await;
    let copy_uid = uid(&first);
    let waiting = eventually(
        "the copy's Workload short of quota while the blocker runs",
        Duration::from_secs(30),
        || async {
            let b = worker_jobs
                .get("blocker")
                .await
                .map_err(|e| e.to_string())?;
            let admitted = b.spec.as_ref().and_then(|s| s.suspend) == Some(false);
            let wl = workload_of(w3, ns, &copy_uid).await?;
            match wl
                .as_ref()
                .and_then(|w| workload_condition(w, "QuotaReserved"))
            {
                Some((s, _, m)) if admitted && s == "False" && m.contains("insufficient") => Ok(m),
                other => Err(format!(
                    "blocker admitted: {admitted}; copy's QuotaReserved: {other:?}"
                )),
            }
        },
    )
    .await;
    let now = copy(w3, ns, "train").await.unwrap().expect("the copy");
    assert_eq!(uid(&now), copy_uid, "the copy was replaced");
    assert_eq!(
        now.spec.as_ref().and_then(|s| s.suspend),
        Some(true),
        "the copy runs beside the blocker, though Kueue said: {waiting}"
    );
    let job = manager.get("train").await.unwrap();
    assert_eq!(
        worker_admitted(&job).map(|c| c.0),
        Some("False".into()),
        "{}",
        described(&job)
    );

    // The blocker done, Kueue admits the copy; its pods run on w3's node.
    let running = wait_running_copy(&env, KUEUE_WORKER, ns, "train").await;
    assert_eq!(uid(&running), copy_uid, "the copy was replaced");
    let b = worker_jobs.get("blocker").await.unwrap();
    assert!(
        is_complete(&b),
        "the copy was admitted before the blocker finished: {}",
        summary(&b)
    );
    let wl = workload_of(w3, ns, &copy_uid)
        .await
        .unwrap()
        .expect("the copy's Workload, labelled with its uid");
    assert_eq!(
        workload_condition(&wl, "QuotaReserved").map(|c| c.0),
        Some("True".into()),
        "{:?}",
        wl.data["status"]
    );

    let done = wait_complete(&env, ns, "train", described).await;
    let status = done.status.clone().unwrap();
    assert_eq!(status.succeeded, Some(2), "{}", described(&done));
    assert_eq!(status.failed.unwrap_or(0), 0, "{}", described(&done));
    assert_eq!(annotation(&done, CLUSTER).as_deref(), Some(KUEUE_WORKER));
    let admitted = worker_admitted(&done);
    assert_eq!(
        admitted.as_ref().map(|c| (c.0.as_str(), c.1.as_str())),
        Some(("True", "Admitted")),
        "{}",
        described(&done)
    );
    eventually(
        &format!("the copy of {ns}/train removed from {KUEUE_WORKER}"),
        Duration::from_secs(60),
        || async {
            match copy(w3, ns, "train").await? {
                None => Ok(()),
                Some(c) => Err(format!("still there: {}", summary(&c))),
            }
        },
    )
    .await;
    let refused = status_refusals(&env.manager.admin, Some(ns)).await;
    assert!(refused.is_empty(), "{refused:?}");
}

/// The ClusterQueue is held (`stopPolicy: Hold`): the quota shows room, a copy is sent to w3
/// and never admitted there. After the queue's `workerAdmissionTimeout` (5 s), not before,
/// the Job is taken back (`Requeued`, reason `WorkerAdmissionTimeout`, not counted towards
/// `requeuing.limit`), runs in w1 and completes; w3's copy is removed.
pub async fn a_copy_the_workers_kueue_never_admits_is_taken_back_and_runs_in_another_worker(
    suite: Arc<Suite>,
) {
    let env = suite.fleet().await;
    let _shared = env.exclusive.read().await;
    let (ns, cq) = ("kq-timeout", "kq-timeout");
    let timeout = Duration::from_secs(5);
    let w3 = kueue_namespace(&env, ns, &["w1"], &cluster_queue(cq, ns, 4, "8Gi", "Hold")).await;
    // w3 only until the copy is there; then w1 too, where it can go once taken back.
    let settings = json!({"workerAdmissionTimeout": "5s"});
    env.queue(ns, &[KUEUE_WORKER], settings.clone()).await;
    let manager = jobs(&env.manager.admin, ns);
    let submitted = Instant::now();
    manager
        .create(
            &PostParams::default(),
            &job("stuck", ns, 1, "1", 0, Some(2)),
        )
        .await
        .expect("the Job is created");
    let first = eventually(
        &format!("the copy of {ns}/stuck in {KUEUE_WORKER}"),
        Duration::from_secs(60),
        || async {
            copy(w3, ns, "stuck")
                .await?
                .ok_or_else(|| "no copy yet".to_string())
        },
    )
    .await;
    assert_eq!(first.spec.as_ref().and_then(|s| s.suspend), Some(true));
    env.queue(ns, &[KUEUE_WORKER, "w1"], settings).await;
    // The dispatch time is written to the manager's Job just after the copy is created.
    let dispatched_at = eventually(
        &format!("{ns}/stuck's {ADMITTED_AT}"),
        Duration::from_secs(30),
        || {
            let manager = manager.clone();
            async move {
                let job = manager.get("stuck").await.map_err(|e| e.to_string())?;
                annotation(&job, ADMITTED_AT)
                    .and_then(|t| t.parse::<Timestamp>().ok())
                    .ok_or_else(|| format!("no {ADMITTED_AT}: {}", described(&job)))
            }
        },
    )
    .await;

    let requeued = eventually(
        &format!("{ns}/stuck taken back from {KUEUE_WORKER}"),
        Duration::from_secs(60),
        || {
            let manager = manager.clone();
            async move {
                let job = manager.get("stuck").await.map_err(|e| e.to_string())?;
                match job_condition(&job, "Requeued") {
                    Some((s, _, _)) if s == "True" => Ok(job),
                    _ => Err(described(&job)),
                }
            }
        },
    )
    .await;
    // The take-back comes no sooner than the timeout after the dispatch (`admitted-at` is
    // to the millisecond); a second of slack for the clocks of the test and the dispatcher.
    let after = submitted.elapsed();
    assert!(
        after + Duration::from_secs(1) >= timeout,
        "taken back {after:?} after the submission, before workerAdmissionTimeout ({timeout:?})"
    );
    let requeued_at = requeued
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Requeued"))
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0)
        .expect("Requeued has a time");
    // A condition's time is whole seconds (cut, not rounded): compared with the dispatch's
    // second.
    let dispatched_second = Timestamp::from_second(dispatched_at.as_second()).unwrap();
    let waited = requeued_at.duration_since(dispatched_second);
    assert!(
        waited >= SignedDuration::from_secs(5),
        "taken back at {requeued_at}, {waited:?} after the dispatch at {dispatched_at}"
    );
    let (_, why, message) = job_condition(&requeued, "Requeued").unwrap();
    assert_eq!(why, "WorkerAdmissionTimeout", "{message}");
    assert!(
        message.contains(&format!(
            "worker {KUEUE_WORKER}'s Kueue did not admit the Job within workerAdmissionTimeout (5s)"
        )),
        "{message}"
    );
    let done = wait_complete(&env, ns, "stuck", described).await;
    assert_eq!(
        annotation(&done, CLUSTER).as_deref(),
        Some("w1"),
        "{}",
        described(&done)
    );
    assert_eq!(
        annotation(&done, "switchyard.dev/requeues").unwrap_or_else(|| "0".into()),
        "0",
        "counted towards requeuing.limit: {}",
        described(&done)
    );
    assert_eq!(
        job_condition(&done, "Requeued").map(|c| c.1),
        Some("WorkerAdmissionTimeout".into()),
        "{}",
        described(&done)
    );
    eventually(
        &format!("the copy of {ns}/stuck removed from {KUEUE_WORKER}"),
        Duration::from_secs(60),
        || async {
            match copy(w3, ns, "stuck").await? {
                None => Ok(()),
                Some(c) => Err(format!("still there: {}", summary(&c))),
            }
        },
    )
    .await;
    // Kueue never admitted it.
    let workloads = workloads(&w3.admin, ns)
        .list(&ListParams::default())
        .await
        .unwrap();
    for wl in &workloads.items {
        assert_ne!(
            workload_condition(wl, "QuotaReserved").map(|c| c.0),
            Some("True".into()),
            "{:?}",
            wl.data["status"]
        );
    }
}

/// w3's ClusterQueue has 2 CPUs of quota, 1 of them reserved by a Job submitted in w3 itself
/// (its status says so); a Job of 2 CPUs, for w3 only, waits in the manager with
/// `WorkerQuotaExceeded`, naming that ClusterQueue and what is short, and no copy is made.
/// The worker's admin raises the quota to 4 CPUs: the Job is sent there, admitted by the
/// worker's Kueue, and completes.
pub async fn a_quota_raised_in_the_worker_is_seen_by_placement(suite: Arc<Suite>) {
    let env = suite.fleet().await;
    let _shared = env.exclusive.read().await;
    let (ns, cq) = ("kq-quota", "kq-quota");
    let w3 = kueue_namespace(&env, ns, &[], &cluster_queue(cq, ns, 2, "8Gi", "None")).await;
    env.queue(ns, &[KUEUE_WORKER], json!({})).await;

    // A Job of w3's own users holds 1 CPU of the quota until deleted.
    let mut local = job("local", ns, 1, "1", 0, None);
    local.metadata.labels =
        Some([(QUEUE_NAME_LABEL.to_string(), KUEUE_LOCAL_QUEUE.to_string())].into());
    let worker_jobs = jobs(&w3.admin, ns);
    worker_jobs
        .create(&PostParams::default(), &local)
        .await
        .expect("a Job submitted in w3");
    eventually(
        "1 CPU reserved in the ClusterQueue's status",
        Duration::from_secs(30),
        || async {
            let q = cluster_queues(&w3.admin)
                .get(cq)
                .await
                .map_err(|e| e.to_string())?;
            let cpu = q.data["status"]["flavorsReservation"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|f| f["name"] == "default-flavor")
                .flat_map(|f| f["resources"].as_array().into_iter().flatten())
                .find(|r| r["name"] == "cpu")
                .map(|r| r["total"].clone());
            if cpu == Some(json!("1")) {
                Ok(())
            } else {
                Err(format!("{}", q.data["status"]))
            }
        },
    )
    .await;
    wait_running_copy(&env, KUEUE_WORKER, ns, "local").await;

    let manager = jobs(&env.manager.admin, ns);
    manager
        .create(
            &PostParams::default(),
            &job("grows", ns, 2, "1", 0, Some(2)),
        )
        .await
        .expect("the Job is created");
    let expected =
        format!("its Kueue ClusterQueue \"{cq}\" has 1 cpu of quota free, the gang needs 2");
    eventually(
        "the Job waiting for the worker's quota",
        Duration::from_secs(60),
        || {
            let (manager, expected) = (manager.clone(), &expected);
            async move {
                let job = manager.get("grows").await.map_err(|e| e.to_string())?;
                match job_condition(&job, "Admitted") {
                    Some((s, r, m))
                        if s == "False" && r == "WorkerQuotaExceeded" && m.contains(expected) =>
                    {
                        Ok(())
                    }
                    other => Err(format!("Admitted: {other:?}")),
                }
            }
        },
    )
    .await;
    assert!(
        copy(w3, ns, "grows").await.unwrap().is_none(),
        "a copy sent to a queue without room"
    );

    set_cluster_queue(w3, &cluster_queue(cq, ns, 4, "8Gi", "None")).await;
    let done = wait_complete(&env, ns, "grows", described).await;
    assert_eq!(
        annotation(&done, CLUSTER).as_deref(),
        Some(KUEUE_WORKER),
        "{}",
        described(&done)
    );
    assert_eq!(
        worker_admitted(&done).map(|c| c.0),
        Some("True".into()),
        "{}",
        described(&done)
    );
    worker_jobs
        .delete(
            "local",
            &DeleteParams {
                propagation_policy: Some(PropagationPolicy::Background),
                ..Default::default()
            },
        )
        .await
        .expect("the Job of w3's users is deleted");
}
