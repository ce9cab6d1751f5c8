//! The dispatcher between a real manager and real workers: Jobs run in a worker and end in
//! the manager, misfits wait, deletions follow, lost workers give their Jobs back, and a
//! killed leader is replaced without any Job running twice.

use crate::env::{condition, Env};
use crate::k8s::kubelet::RUN_SECONDS;
use crate::k8s::{eventually, ControlPlane};
use crate::Suite;
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{DeleteParams, ListParams, PostParams, PropagationPolicy};
use kube::runtime::watcher;
use kube::{Api, Client};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub(crate) const CLUSTER: &str = "switchyard.dev/cluster";
pub(crate) const ORIGIN: &str = "switchyard.dev/origin";

/// A Job of queue `queue` (named like its namespace): `pods` pods at once, each Guaranteed
/// with `cpu` CPUs, 1Gi and `gpus` GPUs, running `seconds` (None: until deleted).
pub(crate) fn job(
    name: &str,
    queue: &str,
    pods: i32,
    cpu: &str,
    gpus: u32,
    seconds: Option<u32>,
) -> Job {
    let mut r = json!({"cpu": cpu, "memory": "1Gi"});
    if gpus > 0 {
        r["nvidia.com/gpu"] = json!(gpus.to_string());
    }
    let annotations = match seconds {
        Some(s) => json!({RUN_SECONDS: s.to_string()}),
        None => json!({}),
    };
    serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": {"switchyard.dev/queue-name": queue}},
        "spec": {
            "parallelism": pods, "completions": pods, "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": annotations},
                "spec": {"restartPolicy": "Never",
                         "containers": [{"name": "main", "image": "busybox:1.36",
                                         "command": ["sh", "-c", "echo work"],
                                         "resources": {"requests": r, "limits": r}}]}},
        },
    }))
    .unwrap()
}

pub(crate) fn jobs(client: &Client, ns: &str) -> Api<Job> {
    Api::namespaced(client.clone(), ns)
}

pub(crate) fn annotation(job: &Job, key: &str) -> Option<String> {
    job.metadata.annotations.as_ref()?.get(key).cloned()
}

pub(crate) fn job_condition(job: &Job, type_: &str) -> Option<(String, String, String)> {
    job.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| {
            (
                c.status.clone(),
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        })
}

pub(crate) fn is_complete(job: &Job) -> bool {
    job_condition(job, "Complete").is_some_and(|c| c.0 == "True")
}

/// A short view of a Job for failure messages.
pub(crate) fn summary(job: &Job) -> String {
    let conditions: Vec<String> = job
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
        .iter()
        .map(|c| {
            format!(
                "{}={} ({})",
                c.type_,
                c.status,
                c.reason.clone().unwrap_or_default()
            )
        })
        .collect();
    format!(
        "suspend={:?} cluster={:?} active={:?} succeeded={:?} conditions={conditions:?}",
        job.spec.as_ref().and_then(|s| s.suspend),
        annotation(job, CLUSTER),
        job.status.as_ref().and_then(|s| s.active),
        job.status.as_ref().and_then(|s| s.succeeded),
    )
}

/// The copy of Job `ns/name` in a worker, if any.
pub(crate) async fn copy(
    plane: &ControlPlane,
    ns: &str,
    name: &str,
) -> Result<Option<Job>, String> {
    let api = jobs(&plane.admin, ns);
    let fetched = tokio::time::timeout(Duration::from_secs(5), api.get_opt(name))
        .await
        .map_err(|_| "the worker did not answer".to_string())?;
    fetched.map_err(|e| e.to_string())
}

pub(crate) fn uid(job: &Job) -> String {
    job.metadata.uid.clone().unwrap_or_default()
}

/// Pods of `ns` in `plane` that are Running.
pub(crate) async fn running_pods(plane: &ControlPlane, ns: &str) -> Result<Vec<Pod>, String> {
    let api: Api<Pod> = Api::namespaced(plane.admin.clone(), ns);
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    Ok(list
        .items
        .into_iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .collect())
}

/// No StatusRefused Event in `ns` (or anywhere, with `None`).
pub(crate) async fn status_refusals(client: &Client, ns: Option<&str>) -> Vec<String> {
    let api: Api<Event> = match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let list = api
        .list(&ListParams::default().fields("reason=StatusRefused"))
        .await
        .expect("Events can be listed");
    list.items
        .into_iter()
        .map(|e| {
            format!(
                "{}/{}: {}",
                e.involved_object.namespace.unwrap_or_default(),
                e.involved_object.name.unwrap_or_default(),
                e.message.unwrap_or_default()
            )
        })
        .collect()
}

/// Waits until the manager's Job `name` waits to be admitted (`Admitted=False`) for the
/// reason `reason` (any when `None`), its message containing `why`.
pub(crate) async fn wait_not_admitted(
    manager: &Api<Job>,
    name: &str,
    reason: Option<&str>,
    why: &str,
) {
    let what = format!("{name} waiting: {} ({why})", reason.unwrap_or("any reason"));
    eventually(&what, Duration::from_secs(60), || {
        let manager = manager.clone();
        async move {
            let job = manager.get(name).await.map_err(|e| e.to_string())?;
            match job_condition(&job, "Admitted") {
                Some((status, r, message))
                    if status == "False"
                        && reason.is_none_or(|want| r == want)
                        && message.contains(why) =>
                {
                    Ok(())
                }
                _ => Err(summary(&job)),
            }
        }
    })
    .await;
}

/// Waits until the manager's Job is Complete; returns it. `describe` says how it stands
/// while it is not.
pub(crate) async fn wait_complete(
    env: &Env,
    ns: &str,
    name: &str,
    describe: fn(&Job) -> String,
) -> Job {
    let manager = jobs(&env.manager.admin, ns);
    eventually(
        &format!("{ns}/{name} Complete in the manager"),
        Duration::from_secs(90),
        || {
            let manager = manager.clone();
            async move {
                let job = manager.get(name).await.map_err(|e| e.to_string())?;
                if is_complete(&job) {
                    Ok(job)
                } else {
                    Err(describe(&job))
                }
            }
        },
    )
    .await
}

/// Waits for the Job's copy to run in `worker` with a Running pod; returns the copy.
pub(crate) async fn wait_running_copy(env: &Env, worker: &str, ns: &str, name: &str) -> Job {
    let plane = &env.worker(worker).plane;
    let manager = jobs(&env.manager.admin, ns);
    eventually(
        &format!("Job {ns}/{name} running in {worker}"),
        Duration::from_secs(60),
        || {
            let manager = manager.clone();
            async move {
                let copy = copy(plane, ns, name).await?;
                let Some(copy) = copy else {
                    let job = manager.get(name).await.map_err(|e| e.to_string())?;
                    return Err(format!("no copy; manager's Job: {}", summary(&job)));
                };
                let running = running_pods(plane, ns).await?;
                if running.iter().any(|p| is_pod_of(p, name)) {
                    Ok(copy)
                } else {
                    Err("a copy, no Running pod yet".into())
                }
            }
        },
    )
    .await
}

/// A Job with 2 pods of one GPU each runs in w1 and is Complete in the manager with the
/// counts; the manager's own Job controller ran no pod for it; the copy is removed once the
/// result is recorded.
pub async fn a_gpu_job_runs_in_the_worker_and_completes_in_the_manager(suite: Arc<Suite>) {
    let env = suite.fleet().await;
    let _shared = env.exclusive.read().await;
    let ns = "gpu";
    env.namespace(ns, &["w1"]).await;
    env.queue(ns, &["w1"], json!({})).await;
    let manager = jobs(&env.manager.admin, ns);
    manager
        .create(
            &PostParams::default(),
            &job("train", ns, 2, "1", 1, Some(3)),
        )
        .await
        .expect("the Job is created");
    let w1 = &env.worker("w1").plane;
    let first = eventually(
        "the copy of gpu/train in w1",
        Duration::from_secs(60),
        || async {
            copy(w1, ns, "train")
                .await?
                .ok_or_else(|| "no copy yet".to_string())
        },
    )
    .await;
    let labels = first.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get(ORIGIN).map(String::as_str), Some("switchyard"));
    let copy_spec = first.spec.clone().unwrap();
    assert_ne!(copy_spec.suspend, Some(true), "the copy runs");
    assert_eq!(
        copy_spec.managed_by, None,
        "the worker's Job controller runs the copy"
    );

    let done = wait_complete(&env, ns, "train", summary).await;
    let status = done.status.clone().unwrap();
    assert_eq!(status.succeeded, Some(2), "{}", summary(&done));
    assert_eq!(status.failed.unwrap_or(0), 0, "{}", summary(&done));
    assert!(status.completion_time.is_some(), "{}", summary(&done));
    assert_eq!(annotation(&done, CLUSTER).as_deref(), Some("w1"));
    let manager_pods: Api<Pod> = Api::namespaced(env.manager.admin.clone(), ns);
    let pods = manager_pods.list(&ListParams::default()).await.unwrap();
    assert!(
        pods.items.is_empty(),
        "the manager ran pods of its own for gpu/train"
    );

    eventually(
        "the copy of gpu/train removed from w1",
        Duration::from_secs(60),
        || async {
            match copy(w1, ns, "train").await? {
                None => Ok(()),
                Some(c) => Err(format!("still there: {}", summary(&c))),
            }
        },
    )
    .await;
    let refused = status_refusals(&env.manager.admin, Some(ns)).await;
    assert!(refused.is_empty(), "{refused:?}");
}

/// A Job whose 5 GPUs per pod fit in no NUMA zone of w1 (4 per zone under single-numa-node,
/// though each node has 8) waits, suspended, saying which resource does not fit, and is never
/// dispatched; the validating webhook keeps a cluster admin from unsuspending it.
pub async fn a_job_that_fits_no_numa_zone_waits_with_the_reason_and_is_never_dispatched(
    suite: Arc<Suite>,
) {
    let env = suite.fleet().await;
    let _shared = env.exclusive.read().await;
    let ns = "numa";
    env.namespace(ns, &["w1"]).await;
    env.queue(ns, &["w1"], json!({})).await;
    let manager = jobs(&env.manager.admin, ns);
    manager
        .create(
            &PostParams::default(),
            &job("too-wide", ns, 1, "1", 5, Some(5)),
        )
        .await
        .expect("the Job is created");
    // The fleet is shared with the other scenarios: w1 may be unusable for a moment for a reason
    // of theirs (a copy of a Job taken back from it still being removed), and the reason says
    // so then. The NUMA reason is the one it settles on.
    const WHY: &str = "the Topology Manager of every node of cluster w1 (single-numa-node) would reject the pod: needs 5 nvidia.com/gpu on one NUMA node";
    wait_not_admitted(&manager, "too-wide", None, WHY).await;
    // Several passes later (one a second at least) it still has not gone anywhere.
    let w1 = &env.worker("w1").plane;
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        let job = manager.get("too-wide").await.unwrap();
        assert_eq!(
            job.spec.as_ref().unwrap().suspend,
            Some(true),
            "{}",
            summary(&job)
        );
        assert_eq!(annotation(&job, CLUSTER), None, "{}", summary(&job));
        assert!(
            copy(w1, ns, "too-wide").await.unwrap().is_none(),
            "a copy in w1"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let events: Api<Event> = Api::namespaced(env.manager.admin.clone(), ns);
    let dispatched = events
        .list(&ListParams::default().fields("reason=Dispatched"))
        .await
        .unwrap();
    assert!(
        dispatched.items.is_empty(),
        "a Dispatched event for numa/too-wide"
    );
    // Nor can anyone but the dispatcher start it by hand, a cluster admin included.
    let unsuspend = kube::api::Patch::Merge(json!({"spec": {"suspend": false}}));
    match manager
        .patch("too-wide", &kube::api::PatchParams::default(), &unsuspend)
        .await
    {
        Err(kube::Error::Api(e)) if e.code == 403 => {
            assert!(
                e.message.contains("validate-job.switchyard.dev"),
                "{}",
                e.message
            )
        }
        other => panic!("numa/too-wide was unsuspended by an admin: {other:?}"),
    }
    manager
        .delete("too-wide", &Default::default())
        .await
        .unwrap();
}

/// Deleting the manager's Job deletes its running copy (and so its pods) in the worker.
pub async fn deleting_a_managers_job_deletes_its_copy(suite: Arc<Suite>) {
    let env = suite.fleet().await;
    let _shared = env.exclusive.read().await;
    let ns = "delete";
    env.namespace(ns, &["w1"]).await;
    env.queue(ns, &["w1"], json!({})).await;
    let manager = jobs(&env.manager.admin, ns);
    manager
        .create(&PostParams::default(), &job("long", ns, 1, "1", 0, None))
        .await
        .expect("the Job is created");
    wait_running_copy(&env, "w1", ns, "long").await;
    manager
        .delete(
            "long",
            &DeleteParams {
                propagation_policy: Some(PropagationPolicy::Background),
                ..Default::default()
            },
        )
        .await
        .expect("the manager's Job is deleted");
    let w1 = &env.worker("w1").plane;
    eventually(
        "the copy of delete/long and its pod gone from w1",
        Duration::from_secs(60),
        || async {
            if let Some(c) = copy(w1, ns, "long").await? {
                return Err(format!("the copy is still there: {}", summary(&c)));
            }
            no_pods_left(w1, ns).await
        },
    )
    .await;
}

/// The nodes a copy's pods prefer (its preferred node affinity on `metadata.name`).
fn preferred_nodes(copy: &Job) -> Vec<String> {
    let copy = serde_json::to_value(copy).unwrap();
    let terms = &copy["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
        ["preferredDuringSchedulingIgnoredDuringExecution"];
    terms
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|t| {
            t["preference"]["matchFields"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter(|f| f["key"] == "metadata.name" && f["operator"] == "In")
        .flat_map(|f| f["values"].as_array().cloned().unwrap_or_default())
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect()
}

/// The node each Running pod of Job `name` in `plane` is bound to.
async fn pod_nodes(plane: &ControlPlane, ns: &str, name: &str) -> Result<Vec<String>, String> {
    Ok(running_pods(plane, ns)
        .await?
        .into_iter()
        .filter(|p| is_pod_of(p, name))
        .filter_map(|p| p.spec.and_then(|s| s.node_name))
        .collect())
}

/// Whether `pod` is one of Job `name`'s (the Job controller's `job-name` label).
fn is_pod_of(pod: &Pod, name: &str) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("job-name"))
        .is_some_and(|n| n == name)
}

/// w1's real default kube-scheduler puts the pods of two one-GPU Jobs on the node the
/// dispatcher's fit chose for both (the first of w1's nodes with room), though left to itself
/// it would spread the second to an emptier node: the copies' preferred node affinity
/// outweighs its resource scores.
pub async fn a_workers_default_scheduler_puts_the_pods_where_the_dispatcher_placed_them(
    suite: Arc<Suite>,
) {
    let env = suite.fleet().await;
    // Alone, so that no other scenario's pods fill the node between fit and schedule.
    let _alone = env.exclusive.write().await;
    let ns = "prefer";
    env.namespace(ns, &["w1"]).await;
    env.queue(ns, &["w1"], json!({})).await;
    let manager = jobs(&env.manager.admin, ns);
    let w1 = &env.worker("w1").plane;
    let w1_nodes: BTreeSet<String> = Api::<Node>::all(w1.admin.clone())
        .list(&ListParams::default())
        .await
        .expect("w1's nodes")
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    let mut placed = Vec::new();
    for name in ["first", "second"] {
        manager
            .create(&PostParams::default(), &job(name, ns, 1, "2", 1, None))
            .await
            .expect("the Job is created");
        let copy = wait_running_copy(&env, "w1", ns, name).await;
        let preferred = preferred_nodes(&copy);
        assert_eq!(
            preferred.len(),
            1,
            "{name}: one pod, one node: {preferred:?}"
        );
        assert!(
            w1_nodes.contains(&preferred[0]),
            "{preferred:?} of {w1_nodes:?}"
        );
        let bound = pod_nodes(w1, ns, name).await.expect("the pods");
        assert_eq!(
            bound, preferred,
            "{name}'s pod is bound where its copy prefers"
        );
        placed.push(preferred[0].clone());
    }
    assert_eq!(
        placed[0], placed[1],
        "the fit fills a node before the next; the default scheduler alone would spread"
    );
    for name in ["first", "second"] {
        let background = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            ..Default::default()
        };
        manager
            .delete(name, &background)
            .await
            .expect("the Job is deleted");
    }
    eventually(
        "the pods of prefer/* gone from w1",
        Duration::from_secs(60),
        || no_pods_left(w1, ns),
    )
    .await;
}

/// `Ok` once namespace `ns` of `plane` has no pod left.
async fn no_pods_left(plane: &ControlPlane, ns: &str) -> Result<(), String> {
    let api: Api<Pod> = Api::namespaced(plane.admin.clone(), ns);
    let pods = api
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    if pods.items.is_empty() {
        Ok(())
    } else {
        Err(format!("{} pods left", pods.items.len()))
    }
}

/// w2 partitioned (its API server stopped) for longer than the queue's workerLostTimeout:
/// the Job is requeued, not before the timeout; once w2 answers again, the stale copy is
/// deleted and the Job dispatched again, with one copy and one running pod.
pub async fn a_partition_longer_than_worker_lost_timeout_requeues_then_heals_to_one_copy(
    suite: Arc<Suite>,
) {
    let env = suite.fleet().await;
    let _shared = env.exclusive.read().await;
    let _w2 = env.w2_steady.write().await;
    let ns = "lost";
    let lost_after = Duration::from_secs(15);
    env.namespace(ns, &["w2"]).await;
    env.queue(ns, &["w2"], json!({"workerLostTimeout": "15s"}))
        .await;
    let manager = jobs(&env.manager.admin, ns);
    manager
        .create(
            &PostParams::default(),
            &job("survivor", ns, 1, "1", 0, None),
        )
        .await
        .expect("the Job is created");
    let first = wait_running_copy(&env, "w2", ns, "survivor").await;
    let w2 = &env.worker("w2").plane;

    let partition = w2.partition();
    let stopped = Instant::now();
    let requeued = eventually(
        "lost/survivor requeued while w2 is partitioned",
        Duration::from_secs(120),
        || {
            let manager = manager.clone();
            async move {
                let job = manager.get("survivor").await.map_err(|e| e.to_string())?;
                match job_condition(&job, "Requeued") {
                    Some((s, reason, _)) if s == "True" => Ok((job, reason)),
                    _ => Err(summary(&job)),
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
    assert_eq!(requeued.1, "WorkerLost", "{}", summary(&requeued.0));
    assert_eq!(
        annotation(&requeued.0, CLUSTER),
        None,
        "{}",
        summary(&requeued.0)
    );
    partition.heal();

    let second = eventually(
        "lost/survivor dispatched again to w2 after it answers again",
        Duration::from_secs(120),
        || async {
            let job = manager.get("survivor").await.map_err(|e| e.to_string())?;
            let copy = copy(w2, ns, "survivor").await?;
            match copy {
                Some(c)
                    if uid(&c) != uid(&first)
                        && annotation(&job, CLUSTER).as_deref() == Some("w2") =>
                {
                    Ok(c)
                }
                Some(c) => Err(format!(
                    "copy {} (first {}); manager: {}",
                    uid(&c),
                    uid(&first),
                    summary(&job)
                )),
                None => Err(format!("no copy; manager: {}", summary(&job))),
            }
        },
    )
    .await;
    // The stale copy's pod goes, the new one's runs: one running copy.
    eventually(
        "one running pod, of the new copy",
        Duration::from_secs(60),
        || async {
            let running = running_pods(w2, ns).await?;
            let owners: Vec<String> = running
                .iter()
                .filter_map(|p| p.metadata.labels.as_ref()?.get("controller-uid").cloned())
                .collect();
            if owners == [uid(&second)] {
                Ok(())
            } else {
                Err(format!(
                    "running pods of copies {owners:?}; new copy {}",
                    uid(&second)
                ))
            }
        },
    )
    .await;
    let copies = jobs(&w2.admin, ns)
        .list(&ListParams::default().labels(ORIGIN))
        .await
        .unwrap();
    assert_eq!(copies.items.len(), 1, "copies in w2");
    manager
        .delete("survivor", &Default::default())
        .await
        .unwrap();
    let refused = status_refusals(&env.manager.admin, Some(ns)).await;
    assert!(refused.is_empty(), "{refused:?}");
}

/// w2 partitioned just long enough to be seen disconnected, well within workerLostTimeout:
/// nothing is requeued, the copy stays the same, even past the time a requeue would have come.
pub async fn a_partition_shorter_than_worker_lost_timeout_requeues_nothing(suite: Arc<Suite>) {
    let env = suite.fleet().await;
    let _shared = env.exclusive.read().await;
    let _w2 = env.w2_steady.write().await;
    let ns = "blip";
    // Seeing w2 disconnected takes up to a probe interval and a probe timeout (10 s each):
    // the timeout must be longer, or the partition cannot be shorter than it.
    let lost_after = Duration::from_secs(25);
    env.namespace(ns, &["w2"]).await;
    env.queue(ns, &["w2"], json!({"workerLostTimeout": "25s"}))
        .await;
    let manager = jobs(&env.manager.admin, ns);
    manager
        .create(&PostParams::default(), &job("steady", ns, 1, "1", 0, None))
        .await
        .expect("the Job is created");
    let first = wait_running_copy(&env, "w2", ns, "steady").await;
    let w2 = &env.worker("w2").plane;
    let workers = crate::env::worker_clusters(&env.manager.admin);

    let partition = w2.partition();
    let stopped = Instant::now();
    eventually(
        "WorkerCluster w2 seen disconnected",
        Duration::from_secs(60),
        || {
            let workers = workers.clone();
            async move {
                let wc = workers.get("w2").await.map_err(|e| e.to_string())?;
                let active = condition(&wc.data, "Active");
                if active["status"] == "False" {
                    Ok(())
                } else {
                    Err(active.to_string())
                }
            }
        },
    )
    .await;
    let lasted = stopped.elapsed();
    partition.heal();
    assert!(lasted < lost_after, "the partition lasted {lasted:?}");
    env.wait_worker_active("w2", Duration::from_secs(60)).await;

    // Had the disconnection counted, a requeue would come workerLostTimeout after it.
    let until = stopped + lasted + lost_after + Duration::from_secs(5);
    while Instant::now() < until {
        let job = manager.get("steady").await.unwrap();
        assert!(
            job_condition(&job, "Requeued").is_none(),
            "requeued by a partition shorter than workerLostTimeout: {}",
            summary(&job)
        );
        assert_eq!(
            annotation(&job, CLUSTER).as_deref(),
            Some("w2"),
            "{}",
            summary(&job)
        );
        let now = copy(w2, ns, "steady").await.unwrap();
        assert_eq!(now.as_ref().map(uid), Some(uid(&first)), "the copy changed");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    manager.delete("steady", &Default::default()).await.unwrap();
}

/// What the pods of the burst's copies did, from a watch on the worker.
#[derive(Default)]
struct Copies {
    /// Job name → uids of the copies with a Running pod now.
    running: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
    /// Job name → every copy uid that ever ran a pod.
    ever: BTreeMap<String, BTreeSet<String>>,
    /// Moments two copies of one Job had Running pods together.
    doubled: Vec<String>,
}

impl Copies {
    fn saw(&mut self, pod: &Pod) {
        let Some(labels) = pod.metadata.labels.as_ref() else {
            return;
        };
        let (Some(job), Some(owner)) = (labels.get("job-name"), labels.get("controller-uid"))
        else {
            return;
        };
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            && pod.metadata.deletion_timestamp.is_none();
        let copies = self.running.entry(job.clone()).or_default();
        if running {
            copies.entry(owner.clone()).or_default().insert(pod_name);
            self.ever
                .entry(job.clone())
                .or_default()
                .insert(owner.clone());
        } else if let Some(pods) = copies.get_mut(owner) {
            pods.remove(&pod_name);
            if pods.is_empty() {
                copies.remove(owner);
            }
        }
        if copies.len() > 1 {
            self.doubled.push(format!(
                "{job}: copies {:?} running together",
                copies.keys().collect::<Vec<_>>()
            ));
        }
    }

    fn gone(&mut self, pod: &Pod) {
        let mut dead = pod.clone();
        dead.status = None;
        self.saw(&dead);
    }
}

/// Two replicas; a burst of 200 Jobs; the leader killed with SIGKILL once some are
/// dispatched and while the rest are still coming. The other replica takes the Lease over,
/// every Job completes, and no Job ever had two copies running at once. The new leader also
/// removes the virtual node of a WorkerCluster deleted while it did not lead.
pub async fn a_leader_killed_in_a_burst_of_200_jobs_is_replaced_and_every_job_completes_once(
    suite: Arc<Suite>,
) {
    const JOBS: usize = 200;
    let env = suite.fleet().await;
    let _alone = env.exclusive.write().await;
    let ns = "burst";
    env.namespace(ns, &["w1"]).await;
    env.queue(ns, &["w1"], json!({})).await;
    let leader = eventually("a leader", Duration::from_secs(30), || async {
        env.leader()
            .await
            .ok_or_else(|| "no Lease holder".to_string())
    })
    .await;

    // Left over from a WorkerCluster deleted while no replica led: the next leader removes it.
    let nodes: Api<Node> = Api::all(env.manager.admin.clone());
    let orphan: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "switchyard-gone",
                     "labels": {"switchyard.dev/cluster": "gone", "type": "virtual-kubelet"}},
    }))
    .unwrap();
    nodes
        .create(&PostParams::default(), &orphan)
        .await
        .expect("an orphaned virtual node");

    let copies = Arc::new(Mutex::new(Copies::default()));
    let w1 = &env.worker("w1").plane;
    let watch = tokio::spawn({
        let copies = copies.clone();
        let pods: Api<Pod> = Api::namespaced(w1.admin.clone(), ns);
        async move {
            let mut events = watcher(pods, watcher::Config::default()).boxed();
            while let Some(event) = events.next().await {
                match event {
                    Ok(watcher::Event::Apply(p)) | Ok(watcher::Event::InitApply(p)) => {
                        copies.lock().unwrap().saw(&p)
                    }
                    Ok(watcher::Event::Delete(p)) => copies.lock().unwrap().gone(&p),
                    _ => {}
                }
            }
        }
    });

    let manager = jobs(&env.manager.admin, ns);
    let submit = tokio::spawn({
        let manager = manager.clone();
        async move {
            futures::stream::iter(0..JOBS)
                .map(|i| {
                    let manager = manager.clone();
                    async move {
                        let j = job(&format!("job-{i:03}"), "burst", 1, "100m", 0, Some(2));
                        // A create in flight when the leader dies may meet a webhook call cut
                        // short: a user retries it.
                        for _ in 0..5 {
                            match manager.create(&PostParams::default(), &j).await {
                                Ok(_) => return Ok(()),
                                Err(kube::Error::Api(e)) if e.code == 409 => return Ok(()),
                                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
                            }
                        }
                        Err(format!("job-{i:03} could not be created"))
                    }
                })
                .buffer_unordered(10)
                .collect::<Vec<Result<(), String>>>()
                .await
        }
    });

    // In the middle of the burst: some Jobs dispatched, others still coming.
    eventually(
        "30 Jobs of the burst dispatched",
        Duration::from_secs(120),
        || {
            let manager = manager.clone();
            async move {
                let list = manager
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?;
                let dispatched = list
                    .items
                    .iter()
                    .filter(|j| annotation(j, CLUSTER).is_some())
                    .count();
                if dispatched >= 30 {
                    Ok(())
                } else {
                    Err(format!("{dispatched} of {} dispatched", list.items.len()))
                }
            }
        },
    )
    .await;
    {
        let mut replicas = env.replicas.lock().unwrap();
        let killed = replicas
            .iter_mut()
            .find(|r| r.name == leader)
            .expect("the leader is a replica");
        killed.process.kill();
    }
    let killed_at = Instant::now();
    let successor = eventually(
        "another replica takes the Lease",
        Duration::from_secs(60),
        || async {
            match env.leader().await {
                Some(l) if l != leader => Ok(l),
                other => Err(format!("holder {other:?}")),
            }
        },
    )
    .await;
    let took_over = killed_at.elapsed();
    eventually(
        &format!("{successor} removes the orphaned virtual node switchyard-gone"),
        Duration::from_secs(30),
        || {
            let nodes = nodes.clone();
            async move {
                match nodes.get_opt("switchyard-gone").await {
                    Ok(None) => Ok(()),
                    Ok(Some(_)) => Err("still there".to_string()),
                    Err(e) => Err(e.to_string()),
                }
            }
        },
    )
    .await;
    let created = submit.await.expect("the burst is submitted");
    let failed: Vec<&String> = created.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(failed.is_empty(), "{failed:?}");

    eventually(
        &format!("all {JOBS} Jobs Complete in the manager"),
        Duration::from_secs(240),
        || {
            let manager = manager.clone();
            async move {
                let list = manager
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?;
                let done = list.items.iter().filter(|j| is_complete(j)).count();
                if done == JOBS {
                    Ok(())
                } else {
                    let stuck: Vec<String> = list
                        .items
                        .iter()
                        .filter(|j| !is_complete(j))
                        .take(3)
                        .map(|j| {
                            format!(
                                "{}: {}",
                                j.metadata.name.clone().unwrap_or_default(),
                                summary(j)
                            )
                        })
                        .collect();
                    Err(format!(
                        "{done} of {} Complete; e.g. {stuck:?}",
                        list.items.len()
                    ))
                }
            }
        },
    )
    .await;
    watch.abort();
    let (doubled, ran, recreated) = {
        let seen = copies.lock().unwrap();
        let recreated: Vec<String> = seen
            .ever
            .iter()
            .filter(|(_, uids)| uids.len() > 1)
            .map(|(job, _)| job.clone())
            .collect();
        (seen.doubled.clone(), seen.ever.len(), recreated)
    };
    assert!(
        doubled.is_empty(),
        "Jobs with two running copies at once: {doubled:?}"
    );
    assert_eq!(ran, JOBS, "Jobs whose copy ran a pod in w1");
    eprintln!(
        "realk8s: {successor} took over {took_over:?} after {leader} was killed; {} Jobs ran in a second copy (one at a time): {recreated:?}",
        recreated.len()
    );
    let refused = status_refusals(&env.manager.admin, Some(ns)).await;
    assert!(refused.is_empty(), "{refused:?}");

    // Back to two replicas for whatever runs next.
    let restarted = env.start_replica(&leader).expect("the replica restarts");
    {
        let mut replicas = env.replicas.lock().unwrap();
        replicas.retain(|r| r.name != leader);
        replicas.push(restarted);
    }
    env.wait_replicas_ready().await;
    env.wait_replicas_settled().await;
    env.route_to_replicas();
}

/// Over the whole suite, the API server never refused a status write the dispatcher made
/// (each refusal is reported in a StatusRefused Event).
pub async fn no_status_write_was_ever_refused(suite: Arc<Suite>) {
    let env = suite.fleet().await;
    let events: Api<Event> = Api::all(env.manager.admin.clone());
    let all = events
        .list(&ListParams::default())
        .await
        .expect("Events can be listed");
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    for e in &all.items {
        *reasons
            .entry(e.reason.clone().unwrap_or_default())
            .or_default() += 1;
    }
    // What the suite made the manager say, for whoever reads the output.
    eprintln!("realk8s: Events in the manager by reason: {reasons:?}");
    let refused = status_refusals(&env.manager.admin, None).await;
    assert!(
        refused.is_empty(),
        "the API server refused status writes:\n{}",
        refused.join("\n")
    );
}

/// A Job of two pods that keep one to a node (a required pod anti-affinity to its own pods on
/// the hostname): w2 (one node) can never hold it, w1 (four) can.
pub async fn a_job_whose_pods_keep_one_to_a_node_goes_only_where_there_are_nodes_enough(
    suite: Arc<Suite>,
) {
    let affinity = json!({"affinity": {"podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": {"batch.kubernetes.io/job-name": "pair"}},
            "topologyKey": "kubernetes.io/hostname"
        }]
    }}});
    kept_apart(
        suite,
        "apart",
        affinity,
        "its pods keep one to a node",
        Landed::Apart,
    )
    .await;
}

/// A Job of two pods spread over at least two nodes (a DoNotSchedule topology spread
/// constraint on the hostname over its own pods, minDomains 2): on w2 (one node, fewer than
/// minDomains) the least count is taken as 0, so its node may take one pod; on w1 (four) the
/// real kube-scheduler binds them to two nodes.
pub async fn a_job_whose_pods_spread_over_nodes_goes_only_where_its_spread_fits(suite: Arc<Suite>) {
    let spread = json!({"topologySpreadConstraints": [{
        "maxSkew": 1,
        "minDomains": 2,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"batch.kubernetes.io/job-name": "pair"}}
    }]});
    let why = "fewer than its minDomains 2, so no node may take more than 1";
    kept_apart(suite, "spread", spread, why, Landed::Apart).await;
}

/// A Job of two pods kept together in one topology zone (a required pod affinity to its own
/// pods on `topology.kubernetes.io/zone`): w2's node has no zone label, so the real
/// kube-scheduler would bind neither pod there; in w1 both land in one of its two zones.
pub async fn a_job_whose_pods_keep_together_goes_only_where_one_zone_holds_it(suite: Arc<Suite>) {
    let together = json!({"affinity": {"podAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": {"batch.kubernetes.io/job-name": "pair"}},
            "topologyKey": crate::env::ZONE
        }]
    }}});
    let why = "no node of cluster w2 has the label topology.kubernetes.io/zone";
    kept_apart(suite, "together", together, why, Landed::InOneZone).await;
}

/// Where the two pods of [`kept_apart`]'s Job must land in w1.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Landed {
    /// On two different nodes (the Job has two pods).
    Apart,
    /// In one topology zone.
    InOneZone,
}

impl Landed {
    /// Whether `nodes` (of w1) are where the pods must be.
    fn holds(self, nodes: &[&String]) -> bool {
        let distinct: BTreeSet<&String> = nodes.iter().copied().collect();
        let zones: BTreeSet<&str> = nodes.iter().map(|n| crate::env::w1_zone(n)).collect();
        match self {
            Landed::Apart => distinct.len() == 2,
            Landed::InOneZone => zones.len() == 1,
        }
    }
}

/// Job `pair` (two pods of 1 CPU, 3 seconds each) with `fields` in its pod spec, in a queue over
/// w2 alone (namespace `<prefix>-w2`): it waits as `NeverFits`, saying `why`, and no copy is
/// made. Then in a queue over w1 alone: dispatched, placed and bound by the worker's real
/// kube-scheduler as `landed` says, and complete in the manager.
async fn kept_apart(
    suite: Arc<Suite>,
    prefix: &str,
    fields: serde_json::Value,
    why: &str,
    landed: Landed,
) {
    let env = suite.fleet().await;
    let _shared = env.exclusive.read().await;
    let submit = |worker: &'static str| {
        let (env, fields) = (&env, fields.clone());
        let ns = format!("{prefix}-{worker}");
        async move {
            env.namespace(&ns, &[worker]).await;
            env.queue(&ns, &[worker], json!({})).await;
            let mut pair = serde_json::to_value(job("pair", &ns, 2, "1", 1, Some(3))).unwrap();
            let spec = pair["spec"]["template"]["spec"].as_object_mut().unwrap();
            spec.extend(fields.as_object().unwrap().clone());
            let manager = jobs(&env.manager.admin, &ns);
            manager
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(pair).unwrap(),
                )
                .await
                .expect("the Job is created");
            (ns, manager)
        }
    };
    // w2 alone: never. w2 must answer as it normally does (no partition scenario may stop its
    // API server meanwhile), both for the dispatcher's verdict and for the look for a copy.
    let w2_steady = env.w2_steady.read().await;
    let (ns, manager) = submit("w2").await;
    wait_not_admitted(&manager, "pair", Some("NeverFits"), why).await;
    let w2 = &env.worker("w2").plane;
    assert!(
        copy(w2, &ns, "pair").await.unwrap().is_none(),
        "a copy in w2"
    );
    manager.delete("pair", &Default::default()).await.unwrap();
    drop(w2_steady);

    // w1: a pod on each of two nodes.
    let (ns, _) = submit("w1").await;
    let ns = ns.as_str();
    let w1 = &env.worker("w1").plane;
    let copy = wait_running_copy(&env, "w1", ns, "pair").await;
    let preferred: Vec<String> = preferred_nodes(&copy);
    let preferred: Vec<&String> = preferred.iter().collect();
    assert!(landed.holds(&preferred), "the fit's nodes: {preferred:?}");
    // Each pod runs for 3 seconds: the nodes of every pod bound so far, whatever its phase.
    let bound = eventually(
        &format!("both pods of {ns}/pair bound"),
        Duration::from_secs(60),
        || async {
            let pods: Api<Pod> = Api::namespaced(w1.admin.clone(), ns);
            let list = pods
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let nodes: Vec<String> = (list.items.into_iter())
                .filter(|p| is_pod_of(p, "pair"))
                .filter_map(|p| p.spec.and_then(|s| s.node_name))
                .collect();
            match nodes.len() {
                2 => Ok(nodes),
                _ => Err(format!("bound to {nodes:?}")),
            }
        },
    )
    .await;
    let bound: Vec<&String> = bound.iter().collect();
    assert!(landed.holds(&bound), "{landed:?}: {bound:?}");
    let done = wait_complete(&env, ns, "pair", summary).await;
    assert_eq!(annotation(&done, CLUSTER).as_deref(), Some("w1"));
    assert_eq!(done.status.unwrap().succeeded, Some(2));
}
