//! JobSets through the dispatcher, with the real JobSet controller in the manager (where it
//! must leave Switchyard's JobSets alone) and in both workers (where it runs the copies on the
//! fake kubelet's nodes): one completes, one fails, and one whose worker is lost is requeued
//! and completes in the other worker.

use crate::env::{condition, Env};
use crate::k8s::jobset::{jobsets, JOBSET_NAME_LABEL};
use crate::k8s::kubelet::{EXIT_CODE, RUN_SECONDS};
use crate::k8s::{eventually, ControlPlane};
use crate::Suite;
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{ListParams, PostParams};
use kube::core::DynamicObject;
use kube::runtime::watcher;
use kube::Api;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CLUSTER: &str = "switchyard.dev/cluster";
const ORIGIN: &str = "switchyard.dev/origin";
const GANG_SIZE: &str = "switchyard.dev/gang-size";

/// A JobSet of queue `queue`: replicated Jobs `leader` ×1 and `workers` ×2, one pod each of
/// the same shape (Guaranteed, 1 CPU, 256Mi), its pods running `seconds` and then exiting
/// with `exit_code`.
fn jobset(name: &str, queue: &str, seconds: u32, exit_code: u32) -> DynamicObject {
    let template = json!({"spec": {"parallelism": 1, "completions": 1, "backoffLimit": 0,
        "template": {
            "metadata": {"annotations": {RUN_SECONDS: seconds.to_string(),
                                         EXIT_CODE: exit_code.to_string()}},
            "spec": {"restartPolicy": "Never",
                     "containers": [{"name": "main", "image": "busybox:1.36",
                                     "resources": {"requests": {"cpu": "1", "memory": "256Mi"},
                                                   "limits": {"cpu": "1", "memory": "256Mi"}}}]}}}});
    serde_json::from_value(json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": name, "labels": {"switchyard.dev/queue-name": queue}},
        "spec": {"replicatedJobs": [
            {"name": "leader", "replicas": 1, "template": template.clone()},
            {"name": "workers", "replicas": 2, "template": template},
        ]},
    }))
    .expect("a JobSet")
}

/// The pods of the JobSet above: 1 leader and 2 workers.
const PODS: usize = 3;

fn annotation(js: &DynamicObject, key: &str) -> Option<String> {
    js.metadata.annotations.as_ref()?.get(key).cloned()
}

/// A short view of a JobSet for failure messages.
fn summary(js: &DynamicObject) -> String {
    let status = &js.data["status"];
    let conditions: Vec<String> = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            format!(
                "{}={} ({}: {})",
                c["type"], c["status"], c["reason"], c["message"]
            )
        })
        .collect();
    format!(
        "suspend={} managedBy={} cluster={:?} terminalState={} conditions={conditions:?} replicatedJobsStatus={}",
        js.data["spec"]["suspend"],
        js.data["spec"]["managedBy"],
        annotation(js, CLUSTER),
        status["terminalState"],
        status["replicatedJobsStatus"],
    )
}

/// (name, succeeded, failed) per replicated Job, by name.
fn replicated_jobs_status(js: &DynamicObject) -> Vec<(String, i64, i64)> {
    super::jobset::replicated_jobs_status(&js.data["status"])
}

/// The copy of JobSet `ns/name` in a worker, if any.
async fn copy(plane: &ControlPlane, ns: &str, name: &str) -> Result<Option<DynamicObject>, String> {
    let fetched = tokio::time::timeout(
        Duration::from_secs(5),
        jobsets(&plane.admin, ns).get_opt(name),
    )
    .await
    .map_err(|_| "the worker did not answer".to_string())?;
    fetched.map_err(|e| e.to_string())
}

/// The JobSet's pods Running in `plane`.
async fn running_pods(plane: &ControlPlane, ns: &str, name: &str) -> Result<usize, String> {
    let pods: Api<Pod> = Api::namespaced(plane.admin.clone(), ns);
    let list = pods
        .list(&ListParams::default().labels(&format!("{JOBSET_NAME_LABEL}={name}")))
        .await
        .map_err(|e| e.to_string())?;
    Ok(list
        .items
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .count())
}

/// Waits until the manager's JobSet has `terminalState` `state`; returns it.
async fn wait_terminal(env: &Env, ns: &str, name: &str, state: &str) -> DynamicObject {
    let api = jobsets(&env.manager.admin, ns);
    eventually(
        &format!("JobSet {ns}/{name} {state} in the manager"),
        Duration::from_secs(90),
        || {
            let api = api.clone();
            async move {
                let js = api.get(name).await.map_err(|e| e.to_string())?;
                if js.data["status"]["terminalState"] == state {
                    Ok(js)
                } else {
                    Err(summary(&js))
                }
            }
        },
    )
    .await
}

/// Waits until the worker holds no copy of the JobSet.
async fn wait_copy_removed(env: &Env, worker: &str, ns: &str, name: &str) {
    let plane = &env.worker(worker).plane;
    eventually(
        &format!("the copy of JobSet {ns}/{name} removed from {worker}"),
        Duration::from_secs(60),
        || async {
            match copy(plane, ns, name).await? {
                None => Ok(()),
                Some(c) => Err(format!("still there: {}", summary(&c))),
            }
        },
    )
    .await;
}

/// The manager's JobSet controller made nothing for the JobSet: no Job, no headless Service,
/// no pod.
async fn left_alone_in_the_manager(env: &Env, ns: &str, name: &str) {
    let admin = &env.manager.admin;
    let jobs: Api<Job> = Api::namespaced(admin.clone(), ns);
    let made = jobs
        .list(&ListParams::default().labels(&format!("{JOBSET_NAME_LABEL}={name}")))
        .await
        .expect("Jobs can be listed");
    assert!(
        made.items.is_empty(),
        "the manager's JobSet controller made Jobs for {ns}/{name}: {:?}",
        made.items
            .iter()
            .map(|j| j.metadata.name.clone())
            .collect::<Vec<_>>()
    );
    let services: Api<Service> = Api::namespaced(admin.clone(), ns);
    assert!(
        services
            .get_opt(name)
            .await
            .expect("Services can be read")
            .is_none(),
        "the manager's JobSet controller made the headless Service of {ns}/{name}"
    );
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let pods = pods.list(&ListParams::default()).await.expect("pods");
    assert!(
        pods.items.is_empty(),
        "the manager ran pods for {ns}/{name}"
    );
}

/// A JobSet of two replicated Jobs created through the manager's API server is suspended and
/// marked managed by the webhook, dispatched to w1 as a copy the worker's JobSet controller
/// runs, and ends `Completed` in the manager with its `replicatedJobsStatus`, `PodsReady`
/// having been True while it ran; the manager's JobSet controller made nothing for it, and the
/// copy is removed once the result is recorded.
pub async fn a_jobset_runs_in_a_worker_and_completes_in_the_manager(suite: Arc<Suite>) {
    let env = suite.fleet().await;
    let _shared = env.exclusive.read().await;
    env.start_jobset_controllers().await;
    let (ns, name) = ("js-complete", "train");
    env.namespace(ns, &["w1"]).await;
    env.queue(ns, &["w1"], json!({})).await;
    let manager = jobsets(&env.manager.admin, ns);

    // Every state the manager's JobSet goes through: whether PodsReady was True before it
    // ended.
    let ready_while_running = Arc::new(Mutex::new(false));
    let watch = tokio::spawn({
        let seen = ready_while_running.clone();
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let mut events = watcher(manager.clone(), config).boxed();
        async move {
            while let Some(event) = events.next().await {
                if let Ok(watcher::Event::Apply(js) | watcher::Event::InitApply(js)) = event {
                    let ready = condition(&js.data, "PodsReady")["status"] == "True";
                    if ready && js.data["status"]["terminalState"].is_null() {
                        *seen.lock().unwrap() = true;
                    }
                }
            }
        }
    });

    let created = manager
        .create(&PostParams::default(), &jobset(name, ns, 5, 0))
        .await
        .expect("the JobSet is created");
    assert_eq!(
        created.data["spec"]["managedBy"],
        "switchyard.dev/dispatcher",
        "the mutating webhook marks the JobSet managed: {}",
        summary(&created)
    );
    assert_eq!(
        created.data["spec"]["suspend"],
        true,
        "the mutating webhook suspends the JobSet: {}",
        summary(&created)
    );

    let w1 = &env.worker("w1").plane;
    let first = eventually(
        &format!("the copy of {ns}/{name} in w1"),
        Duration::from_secs(60),
        || async {
            copy(w1, ns, name)
                .await?
                .ok_or_else(|| "no copy yet".to_string())
        },
    )
    .await;
    let labels = first.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get(ORIGIN).map(String::as_str), Some("switchyard"));
    assert!(
        first.data["spec"]["managedBy"].is_null(),
        "the worker's JobSet controller runs the copy: {}",
        summary(&first)
    );
    assert_ne!(first.data["spec"]["suspend"], true, "the copy runs");
    let gang_sizes: Vec<&Value> = first.data["spec"]["replicatedJobs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|rj| &rj["template"]["spec"]["template"]["metadata"]["annotations"][GANG_SIZE])
        .collect();
    assert_eq!(
        gang_sizes,
        vec![&json!(PODS.to_string()); 2],
        "every pod template of the copy carries the whole gang's size"
    );

    let done = wait_terminal(&env, ns, name, "Completed").await;
    let completed = condition(&done.data, "Completed");
    assert_eq!(
        (completed["status"].as_str(), completed["reason"].as_str()),
        (Some("True"), Some("AllJobsCompleted")),
        "{}",
        summary(&done)
    );
    assert_eq!(
        replicated_jobs_status(&done),
        vec![("leader".into(), 1, 0), ("workers".into(), 2, 0)],
        "succeeded and failed Jobs per replicated Job: {}",
        summary(&done)
    );
    let pods_ready = condition(&done.data, "PodsReady");
    assert_eq!(
        (pods_ready["status"].as_str(), pods_ready["reason"].as_str()),
        (Some("True"), Some("PodsReady")),
        "{}",
        summary(&done)
    );
    assert_eq!(annotation(&done, CLUSTER).as_deref(), Some("w1"));
    watch.abort();
    assert!(
        *ready_while_running.lock().unwrap(),
        "PodsReady was never True before {ns}/{name} ended"
    );
    left_alone_in_the_manager(&env, ns, name).await;
    wait_copy_removed(&env, "w1", ns, name).await;
}

/// A JobSet whose pods exit 1 (default failurePolicy: no restart) ends `Failed` in the manager;
/// its copy is removed.
pub async fn a_failing_jobset_is_failed_in_the_manager(suite: Arc<Suite>) {
    let env = suite.fleet().await;
    let _shared = env.exclusive.read().await;
    env.start_jobset_controllers().await;
    let (ns, name) = ("js-fail", "broken");
    env.namespace(ns, &["w1"]).await;
    env.queue(ns, &["w1"], json!({})).await;
    jobsets(&env.manager.admin, ns)
        .create(&PostParams::default(), &jobset(name, ns, 1, 1))
        .await
        .expect("the JobSet is created");
    let done = wait_terminal(&env, ns, name, "Failed").await;
    let failed = condition(&done.data, "Failed");
    assert_eq!(
        (failed["status"].as_str(), failed["reason"].as_str()),
        (Some("True"), Some("FailedJobs")),
        "{}",
        summary(&done)
    );
    assert!(
        condition(&done.data, "Completed")["status"] != "True",
        "{}",
        summary(&done)
    );
    assert_eq!(annotation(&done, CLUSTER).as_deref(), Some("w1"));
    left_alone_in_the_manager(&env, ns, name).await;
    wait_copy_removed(&env, "w1", ns, name).await;
}

/// A JobSet running in w2 when w2 is partitioned (its API server stopped) for longer than the
/// queue's workerLostTimeout is requeued (`Requeued` True, reason `WorkerLost`), not before
/// the timeout, is copied to w1 while w2 is still away and completes there; healed, w2 loses
/// the stale copy.
pub async fn a_lost_workers_jobset_is_requeued_and_completes_in_the_other_worker(
    suite: Arc<Suite>,
) {
    let env = suite.fleet().await;
    let _shared = env.exclusive.read().await;
    let w2_steady = env.w2_steady.write().await;
    env.start_jobset_controllers().await;
    let (ns, name) = ("js-lost", "moved");
    let lost_after = Duration::from_secs(5);
    env.namespace(ns, &["w1", "w2"]).await;
    // w2 only until the JobSet runs there; then w1 too, where it can go once w2 is lost.
    env.queue(ns, &["w2"], json!({"workerLostTimeout": "5s"}))
        .await;
    let manager = jobsets(&env.manager.admin, ns);
    manager
        .create(&PostParams::default(), &jobset(name, ns, 8, 0))
        .await
        .expect("the JobSet is created");
    let w2 = &env.worker("w2").plane;
    let first = eventually(
        &format!("{ns}/{name} running in w2"),
        Duration::from_secs(60),
        || async {
            let Some(c) = copy(w2, ns, name).await? else {
                let js = manager.get(name).await.map_err(|e| e.to_string())?;
                return Err(format!("no copy; manager's: {}", summary(&js)));
            };
            match running_pods(w2, ns, name).await? {
                n if n == PODS => Ok(c),
                n => Err(format!("{n} of {PODS} pods Running")),
            }
        },
    )
    .await;
    env.queue(ns, &["w2", "w1"], json!({"workerLostTimeout": "5s"}))
        .await;

    let partition = w2.partition();
    let stopped = Instant::now();
    let requeued = eventually(
        &format!("{ns}/{name} requeued while w2 is partitioned"),
        Duration::from_secs(60),
        || {
            let manager = manager.clone();
            async move {
                let js = manager.get(name).await.map_err(|e| e.to_string())?;
                if condition(&js.data, "Requeued")["status"] == "True" {
                    Ok(js)
                } else {
                    Err(summary(&js))
                }
            }
        },
    )
    .await;
    let after = stopped.elapsed();
    assert!(
        after >= lost_after,
        "requeued {after:?} after the partition began, before workerLostTimeout ({lost_after:?})"
    );
    assert_eq!(
        condition(&requeued.data, "Requeued")["reason"],
        "WorkerLost",
        "{}",
        summary(&requeued)
    );
    // Placed in w1 while w2 is still away; then w2 may come back (healed early, its
    // reconnection back-off stays short).
    let w1 = &env.worker("w1").plane;
    eventually(
        &format!("{ns}/{name} copied to w1 while w2 is partitioned"),
        Duration::from_secs(30),
        || async {
            let js = manager.get(name).await.map_err(|e| e.to_string())?;
            match copy(w1, ns, name).await? {
                Some(_) if annotation(&js, CLUSTER).as_deref() == Some("w1") => Ok(()),
                _ => Err(summary(&js)),
            }
        },
    )
    .await;
    partition.heal();

    // Back, w2 loses the stale copy (and so its Jobs and pods), and is steady again for the
    // scenarios that need it while the JobSet runs on in w1.
    eventually(
        &format!("the stale copy of {ns}/{name} removed from w2"),
        Duration::from_secs(60),
        || async {
            match copy(w2, ns, name).await? {
                Some(c) if c.metadata.uid == first.metadata.uid => {
                    Err(format!("still there: {}", summary(&c)))
                }
                Some(c) => Err(format!("another copy: {}", summary(&c))),
                None => Ok(()),
            }
        },
    )
    .await;
    env.wait_worker_active("w2", Duration::from_secs(60)).await;
    drop(w2_steady);

    let done = wait_terminal(&env, ns, name, "Completed").await;
    assert_eq!(
        annotation(&done, CLUSTER).as_deref(),
        Some("w1"),
        "{}",
        summary(&done)
    );
    assert_eq!(
        replicated_jobs_status(&done),
        vec![("leader".into(), 1, 0), ("workers".into(), 2, 0)],
        "{}",
        summary(&done)
    );
    assert_eq!(
        condition(&done.data, "Requeued")["reason"],
        "WorkerLost",
        "{}",
        summary(&done)
    );
    left_alone_in_the_manager(&env, ns, name).await;
    wait_copy_removed(&env, "w1", ns, name).await;
}
