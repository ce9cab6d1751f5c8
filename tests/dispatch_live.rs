//! The live dispatcher between a manager and worker clusters (fake API servers on loopback,
//! shaped after real kube-apiserver 1.36 exchanges), through the real `kube::Client`: the
//! MultiKueue job flow of seed 000 and what goes wrong around it.

mod common;

use common::dispatch::*;
use common::fake_api::{Loss, Refusal, EVENTS, JOBS};
use serde_json::{json, Value};
use std::time::Duration;

const CLAIM: &str = "switchyard.dev/cluster";

fn two_small_one_big() -> Vec<WorkerSpec> {
    vec![
        // 4 × 16 CPUs: 64 free in sum, but no node takes a 24-CPU pod.
        WorkerSpec {
            name: "small-a",
            nodes: 4,
            cpu: 16,
        },
        WorkerSpec {
            name: "big",
            nodes: 1,
            cpu: 32,
        },
        WorkerSpec {
            name: "small-b",
            nodes: 2,
            cpu: 8,
        },
    ]
}

/// The worker a Job runs in, once the dispatch is whole: claimed, unsuspended and saying
/// `Admitted=True`. The spec and the status are two writes (two subresources), so a reader
/// can briefly see the first without the second; a test waits for both.
fn dispatched_to(fleet: &Fleet, name: &str) -> Option<String> {
    let j = fleet.job(name);
    let claimed = annotation(&j, CLAIM)?.to_string();
    let admitted = condition(&j, "Admitted").is_some_and(|c| c["status"] == "True");
    (j["spec"]["suspend"] == false && admitted).then_some(claimed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_job_runs_in_exactly_one_worker_and_its_status_comes_back() {
    let fleet = Fleet::start(
        &two_small_one_big(),
        queue("research", &["small-a", "big", "small-b"], json!({})),
    )
    .await;
    let _d = fleet.dispatcher(true);
    let mut submitted = job("train", "research", 1, 24);
    submitted["spec"]["futureField"] = json!({"kept": true});
    submitted["spec"]["template"]["spec"]["futurePodField"] = json!("x");
    fleet.submit(submitted);

    eventually(10, "the Job is dispatched", || {
        dispatched_to(&fleet, "train").is_some()
    })
    .await;
    assert_eq!(
        dispatched_to(&fleet, "train").as_deref(),
        Some("big"),
        "the only worker with a node that fits the 24-CPU pod"
    );
    let copies = fleet.copies("train");
    assert_eq!(copies.len(), 1, "one copy, in one worker: {copies:?}");
    let (worker, copy) = &copies[0];
    assert_eq!(worker, "big");
    let manager_job = fleet.job("train");
    assert_eq!(
        copy["metadata"]["labels"]["switchyard.dev/origin-uid"],
        manager_job["metadata"]["uid"]
    );
    assert_eq!(
        copy["metadata"]["labels"]["switchyard.dev/origin"],
        "switchyard"
    );
    assert!(copy["metadata"]["labels"]["switchyard.dev/queue-name"].is_null());
    assert!(
        copy["spec"]["managedBy"].is_null(),
        "the worker's Job controller runs it"
    );
    assert_eq!(copy["spec"]["suspend"], false);
    assert!(
        copy["spec"]["selector"].is_null(),
        "the worker generates its own selector"
    );
    assert_eq!(
        copy["spec"]["futureField"],
        json!({"kept": true}),
        "unknown fields survive"
    );
    assert_eq!(copy["spec"]["template"]["spec"]["futurePodField"], "x");
    assert!(copy["metadata"]["annotations"][CLAIM].is_null());
    let admitted = condition(&manager_job, "Admitted").expect("Admitted condition");
    assert_eq!(admitted["status"], "True");
    assert!(admitted["message"].as_str().unwrap().contains("big"));

    // The worker's Job controller starts the pod: the manager's Job says so.
    fleet.copy_status(
        "big",
        "train",
        json!({"active": 1, "ready": 1, "startTime": "2026-11-22T04:00:00Z",
               "uncountedTerminatedPods": {}}),
    );
    eventually(10, "the status is mirrored", || {
        let j = fleet.job("train");
        j["status"]["active"] == 1
            && condition(&j, "PodsReady").is_some_and(|c| c["status"] == "True")
    })
    .await;

    // It finishes: the manager's Job completes, the copy goes.
    fleet.copy_status(
        "big",
        "train",
        json!({"succeeded": 1, "active": 0, "ready": 0,
               "startTime": "2026-11-22T04:00:00Z", "completionTime": "2026-11-22T04:01:00Z",
               "uncountedTerminatedPods": {},
               "conditions": [
                 {"type": "SuccessCriteriaMet", "status": "True", "reason": "CompletionsReached",
                  "message": "Reached expected number of succeeded pods",
                  "lastProbeTime": "2026-11-22T04:01:00Z", "lastTransitionTime": "2026-11-22T04:01:00Z"},
                 {"type": "Complete", "status": "True", "reason": "CompletionsReached",
                  "message": "Reached expected number of succeeded pods",
                  "lastProbeTime": "2026-11-22T04:01:00Z", "lastTransitionTime": "2026-11-22T04:01:00Z"}]}),
    );
    eventually(10, "the Job completes and its copy is removed", || {
        let j = fleet.job("train");
        condition(&j, "Complete").is_some_and(|c| c["status"] == "True")
            && j["status"]["succeeded"] == 1
            && fleet.copies("train").is_empty()
    })
    .await;
    assert_eq!(
        annotation(&fleet.job("train"), "switchyard.dev/result"),
        Some("Succeeded")
    );
    let events: Vec<Value> = fleet.manager.list(EVENTS);
    assert!(
        events.iter().any(|e| e["reason"] == "Dispatched"
            && e["regarding"]["name"] == "train"
            && e["note"].as_str().unwrap_or("").contains("big")),
        "a Dispatched Event on the Job: {events:?}"
    );
    assert_eq!(
        fleet.uncovered(),
        Vec::<String>::new(),
        "requests outside the chart's RBAC"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copys_pods_carry_their_queues_placement_strategy_and_prefer_their_placement() {
    let fleet = Fleet::start(
        &two_small_one_big(),
        queue(
            "research",
            &["small-a", "big", "small-b"],
            json!({"placement": {"strategy": "MostAllocated"}}),
        ),
    )
    .await;
    let _d = fleet.dispatcher(true);
    let mut submitted = job("train", "research", 1, 2);
    submitted["spec"]["template"]["metadata"]["annotations"] = json!({"team": "ml"});
    fleet.submit(submitted);
    eventually(10, "the Job is dispatched", || {
        dispatched_to(&fleet, "train").is_some()
    })
    .await;
    let copies = fleet.copies("train");
    assert_eq!(copies.len(), 1);
    // A worker whose scheduler asks Switchyard's extender ranks the nodes as the queue says.
    let annotations = &copies[0].1["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(
        annotations,
        &json!({"team": "ml", "switchyard.dev/placement-strategy": "MostAllocated"})
    );
    // And they prefer the node the dispatcher's fit found for them there.
    let worker = &copies[0].0;
    let preferred = &copies[0].1["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
        ["preferredDuringSchedulingIgnoredDuringExecution"];
    let nodes = &preferred[0]["preference"]["matchFields"][0];
    assert_eq!(preferred[0]["weight"], 100);
    assert_eq!(nodes["key"], "metadata.name");
    assert_eq!(nodes["operator"], "In");
    let nodes = nodes["values"].as_array().unwrap();
    assert_eq!(nodes.len(), 1, "one pod, one node: {nodes:?}");
    assert!(
        nodes[0].as_str().unwrap().starts_with(worker.as_str()),
        "a node of {worker}: {nodes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_refuses_the_job_gives_it_back_and_another_takes_it() {
    let workers = vec![
        WorkerSpec {
            name: "first",
            nodes: 1,
            cpu: 64,
        },
        WorkerSpec {
            name: "second",
            nodes: 1,
            cpu: 32,
        },
    ];
    let fleet = Fleet::start(&workers, queue("research", &["first", "second"], json!({}))).await;
    // The emptier worker refuses: an admission webhook or quota there.
    fleet.workers["first"].refuse(Refusal {
        method: "POST",
        plural: "jobs",
        sub: None,
        code: 403,
        reason: "Forbidden",
        message: "jobs \"train\" is forbidden: exceeded quota: compute, requested: requests.cpu=8, used: requests.cpu=0, limited: requests.cpu=4".into(),
    });
    let _d = fleet.dispatcher(true);
    fleet.submit(job("train", "research", 1, 8));
    eventually(15, "the Job runs in the second worker", || {
        dispatched_to(&fleet, "train").as_deref() == Some("second")
    })
    .await;
    assert_eq!(fleet.copies("train").len(), 1);
    let events = fleet.manager.list(EVENTS);
    assert!(
        events.iter().any(|e| e["reason"] == "WorkerRefused"
            && e["type"] == "Warning"
            && e["note"].as_str().unwrap_or("").contains("exceeded quota")),
        "the refusal is reported on the Job: {events:?}"
    );
    assert_eq!(fleet.uncovered(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_missing_in_the_worker_sends_the_job_elsewhere() {
    let workers = vec![
        WorkerSpec {
            name: "first",
            nodes: 1,
            cpu: 64,
        },
        WorkerSpec {
            name: "second",
            nodes: 1,
            cpu: 32,
        },
    ];
    let fleet = Fleet::start(&workers, queue("research", &["first", "second"], json!({}))).await;
    fleet.workers["first"].require_namespaces();
    fleet.workers["first"].delete(common::fake_api::NAMESPACES, NS);
    let _d = fleet.dispatcher(true);
    fleet.submit(job("train", "research", 1, 8));
    eventually(15, "the Job runs in the second worker", || {
        dispatched_to(&fleet, "train").as_deref() == Some("second")
    })
    .await;
    let events = fleet.manager.list(EVENTS);
    assert!(
        events.iter().any(|e| e["note"]
            .as_str()
            .unwrap_or("")
            .contains("does not exist in worker first")),
        "{events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_fails_transiently_keeps_the_claim_and_gets_the_copy_later() {
    let workers = vec![WorkerSpec {
        name: "only",
        nodes: 1,
        cpu: 64,
    }];
    let fleet = Fleet::start(&workers, queue("research", &["only"], json!({}))).await;
    fleet.workers["only"].refuse(Refusal {
        method: "POST",
        plural: "jobs",
        sub: None,
        code: 503,
        reason: "ServiceUnavailable",
        message: "the server is currently unable to handle the request".into(),
    });
    let _d = fleet.dispatcher(true);
    fleet.submit(job("train", "research", 1, 8));
    eventually(10, "the Job is claimed", || {
        annotation(&fleet.job("train"), CLAIM) == Some("only")
    })
    .await;
    eventually(10, "the create is tried again", || {
        fleet.workers["only"].count("POST", "/jobs") >= 2
    })
    .await;
    let j = fleet.job("train");
    assert_eq!(
        j["spec"]["suspend"], true,
        "not unsuspended without its copy"
    );
    assert!(fleet.copies("train").is_empty());
    fleet.workers["only"].clear_refusals();
    eventually(10, "the copy is created once the worker answers", || {
        dispatched_to(&fleet, "train").as_deref() == Some("only")
    })
    .await;
    assert_eq!(fleet.copies("train").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_dispatchers_at_once_never_run_a_job_twice() {
    let workers = vec![
        WorkerSpec {
            name: "east",
            nodes: 4,
            cpu: 16,
        },
        WorkerSpec {
            name: "west",
            nodes: 4,
            cpu: 16,
        },
    ];
    let fleet = Fleet::start(&workers, queue("research", &["east", "west"], json!({}))).await;
    for i in 0..24 {
        fleet.submit(job(&format!("job-{i}"), "research", 1, 4));
    }
    // Writes take a moment, so both dispatchers' claims are in flight together.
    fleet.manager.set_write_delay(Duration::from_millis(50));
    // Split brain: both believe they lead.
    let a = fleet.dispatcher(true);
    let b = fleet.dispatcher(true);
    eventually(20, "every Job is dispatched", || {
        (0..24).all(|i| dispatched_to(&fleet, &format!("job-{i}")).is_some())
    })
    .await;
    a.settled().await;
    b.settled().await;
    for i in 0..24 {
        let name = format!("job-{i}");
        let copies = fleet.copies(&name);
        assert_eq!(copies.len(), 1, "{name}: {copies:?}");
        assert_eq!(
            Some(copies[0].0.as_str()),
            annotation(&fleet.job(&name), CLAIM),
            "{name} runs where it is claimed"
        );
    }
    // Both claimed: the claim that came second carried a stale resourceVersion and lost. Every
    // write carries the resourceVersion it was computed from, so a status written from a stale
    // view (which would replace the conditions list whole and drop `Admitted`) loses too.
    let recorded = fleet.manager.recorded();
    let conflicts: Vec<_> = recorded
        .iter()
        .filter(|r| r.method == "PATCH" && r.status == Some(409))
        .collect();
    assert!(
        conflicts.iter().any(|r| r
            .body
            .as_ref()
            .is_some_and(|b| b["metadata"]["annotations"][CLAIM].is_string())),
        "the two dispatchers raced for the same Jobs: some claim got 409 Conflict"
    );
    for r in recorded
        .iter()
        .filter(|r| r.method == "PATCH" && r.uri.contains("/jobs/"))
    {
        let body = r.body.clone().unwrap_or(Value::Null);
        assert!(
            body["metadata"]["resourceVersion"].is_string(),
            "every patch of a manager Job is conditional on what it was computed from: {body}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_holds_jobs_back_until_others_finish_and_says_why() {
    let workers = vec![WorkerSpec {
        name: "only",
        nodes: 4,
        cpu: 16,
    }];
    let fleet = Fleet::start(
        &workers,
        queue("research", &["only"], json!({"quota": {"cpu": "8"}})),
    )
    .await;
    let d = fleet.dispatcher(true);
    for i in 0..5 {
        fleet.submit(job(&format!("q-{i}"), "research", 1, 4));
    }
    eventually(10, "two Jobs fill the quota", || {
        (0..5)
            .filter(|i| dispatched_to(&fleet, &format!("q-{i}")).is_some())
            .count()
            == 2
    })
    .await;
    eventually(10, "the others say they wait for quota", || {
        (0..5)
            .map(|i| fleet.job(&format!("q-{i}")))
            .filter(|j| {
                condition(j, "Admitted")
                    .is_some_and(|c| c["status"] == "False" && c["reason"] == "QuotaExceeded")
            })
            .count()
            == 3
    })
    .await;
    d.settled().await;
    let running: Vec<String> = (0..5)
        .map(|i| format!("q-{i}"))
        .filter(|n| dispatched_to(&fleet, n).is_some())
        .collect();
    assert_eq!(running.len(), 2, "never more than the quota: {running:?}");
    assert_eq!(running, vec!["q-0", "q-1"], "oldest first (then by name)");
    // The queue's status is written on its own, at most every `queue_status_every`.
    let queue_status = || {
        fleet
            .manager
            .get(common::fake_api::DISPATCH_QUEUES, "", "research")
            .unwrap()["status"]
            .clone()
    };
    eventually(
        10,
        "the queue's status counts 2 admitted and 3 pending",
        || {
            let s = queue_status();
            s["admitted"] == 2 && s["pending"] == 3
        },
    )
    .await;

    // One fails in its worker: its quota goes to the next.
    fleet.copy_status(
        "only",
        "q-0",
        json!({"failed": 1, "active": 0, "startTime": "2026-11-22T04:00:00Z",
               "uncountedTerminatedPods": {},
               "conditions": [
                 {"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded",
                  "message": "Job has reached the specified backoff limit",
                  "lastProbeTime": "2026-11-22T04:01:00Z", "lastTransitionTime": "2026-11-22T04:01:00Z"},
                 {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                  "message": "Job has reached the specified backoff limit",
                  "lastProbeTime": "2026-11-22T04:01:00Z", "lastTransitionTime": "2026-11-22T04:01:00Z"}]}),
    );
    eventually(
        10,
        "q-0 fails in the manager and q-2 takes its quota",
        || {
            let j = fleet.job("q-0");
            condition(&j, "Failed").is_some_and(|c| c["status"] == "True")
                && dispatched_to(&fleet, "q-2").is_some()
        },
    )
    .await;
    assert_eq!(
        annotation(&fleet.job("q-0"), "switchyard.dev/result"),
        Some("Failed")
    );
    let q3 = fleet.job("q-3");
    assert_eq!(q3["spec"]["suspend"], true, "q-3 waits: no quota left");
    assert_eq!(annotation(&q3, CLAIM), None);
    assert_eq!(fleet.uncovered(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_deleted_in_the_worker_is_requeued_and_runs_again() {
    let workers = vec![WorkerSpec {
        name: "only",
        nodes: 1,
        cpu: 16,
    }];
    let fleet = Fleet::start(&workers, queue("research", &["only"], json!({}))).await;
    let _d = fleet.dispatcher(true);
    fleet.submit(job("train", "research", 1, 4));
    eventually(10, "dispatched", || {
        dispatched_to(&fleet, "train").is_some()
    })
    .await;
    let first_uid = fleet.copies("train")[0].1["metadata"]["uid"].clone();
    fleet.workers["only"].delete(JOBS, &format!("{NS}/train"));
    eventually(10, "requeued and dispatched again with a new copy", || {
        let j = fleet.job("train");
        let copies = fleet.copies("train");
        condition(&j, "Requeued")
            .is_some_and(|c| c["status"] == "True" && c["reason"] == "DeletedInWorker")
            && copies.len() == 1
            && copies[0].1["metadata"]["uid"] != first_uid
            && j["spec"]["suspend"] == false
    })
    .await;
    assert_eq!(
        annotation(&fleet.job("train"), "switchyard.dev/requeues"),
        None,
        "a copy deleted by someone else is not the Job's fault: not counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_manager_job_removes_its_copy() {
    let workers = vec![WorkerSpec {
        name: "only",
        nodes: 1,
        cpu: 16,
    }];
    let fleet = Fleet::start(&workers, queue("research", &["only"], json!({}))).await;
    let _d = fleet.dispatcher(true);
    fleet.submit(job("train", "research", 1, 4));
    eventually(10, "dispatched", || {
        dispatched_to(&fleet, "train").is_some()
    })
    .await;
    fleet.manager.delete(JOBS, &format!("{NS}/train"));
    eventually(10, "the copy is removed", || {
        fleet.copies("train").is_empty()
    })
    .await;
    let deletes: Vec<_> = fleet.workers["only"]
        .recorded()
        .into_iter()
        .filter(|r| r.method == "DELETE")
        .collect();
    assert_eq!(deletes.len(), 1);
    let body = deletes[0].body.clone().unwrap_or(Value::Null);
    assert_eq!(body["propagationPolicy"], "Background", "{body}");
    assert!(
        body["preconditions"]["uid"].is_string(),
        "only the copy it saw: {body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_pods_never_get_ready_is_requeued_and_given_up_at_the_limit() {
    let workers = vec![WorkerSpec {
        name: "only",
        nodes: 1,
        cpu: 16,
    }];
    let fleet = Fleet::start(
        &workers,
        queue(
            "research",
            &["only"],
            json!({"waitForPodsReady": {"enabled": true, "timeout": "1s",
                   "requeuing": {"backoffBase": "1s", "backoffMax": "2s", "limit": 2}}}),
        ),
    )
    .await;
    let _d = fleet.dispatcher(true);
    fleet.submit(job("slow", "research", 2, 4));
    eventually(10, "dispatched", || dispatched_to(&fleet, "slow").is_some()).await;
    eventually(10, "requeued once after the timeout", || {
        let j = fleet.job("slow");
        annotation(&j, "switchyard.dev/requeues") == Some("1")
            && condition(&j, "Requeued").is_some_and(|c| c["reason"] == "PodsReadyTimeout")
    })
    .await;
    eventually(20, "deactivated at the limit", || {
        let j = fleet.job("slow");
        condition(&j, "Deactivated").is_some_and(|c| c["status"] == "True")
    })
    .await;
    let j = fleet.job("slow");
    assert_eq!(
        j["spec"]["suspend"], true,
        "a deactivated Job stays suspended"
    );
    assert!(annotation(&j, CLAIM).is_none());
    eventually(10, "no copy is left", || fleet.copies("slow").is_empty()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_lost_longer_than_its_timeout_loses_its_job_to_another() {
    let (mut fleet, _d) = train_in_east("1s").await;
    fleet.disconnect("east");
    eventually(10, "requeued and running in west", || {
        let j = fleet.job("train");
        condition(&j, "Requeued").is_some_and(|c| c["reason"] == "WorkerLost")
            && dispatched_to(&fleet, "train").as_deref() == Some("west")
    })
    .await;
    // East comes back with the stale copy: it is removed; one copy runs.
    fleet.reconnect("east");
    eventually(10, "the stale copy in east is removed", || {
        let copies = fleet.copies("train");
        copies.len() == 1 && copies[0].0 == "west"
    })
    .await;
}

/// The queue's only worker is lost: its Job is taken back, and waits for the worker to
/// answer again (the automatic quota without it is zero, but it may come back), then runs
/// there again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_only_worker_is_lost_waits_for_it_not_for_ever() {
    let workers = vec![WorkerSpec {
        name: "east",
        nodes: 1,
        cpu: 16,
    }];
    let mut fleet = Fleet::start(
        &workers,
        queue("research", &["east"], json!({"workerLostTimeout": "1s"})),
    )
    .await;
    let d = fleet.dispatcher(true);
    fleet.submit(job("train", "research", 2, 4));
    eventually(10, "dispatched to east", || {
        dispatched_to(&fleet, "train").as_deref() == Some("east")
    })
    .await;
    fleet.disconnect("east");
    eventually(10, "taken back, waiting for east", || {
        let j = fleet.job("train");
        condition(&j, "Requeued").is_some_and(|c| c["reason"] == "WorkerLost")
            && condition(&j, "Admitted").is_some_and(|c| c["reason"] == "WorkerUnreachable")
    })
    .await;
    d.settled().await;
    let admitted = condition(&fleet.job("train"), "Admitted").unwrap().clone();
    let message = admitted["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("while worker east is unreachable")
            && message.contains("8 cpu (0 without them)"),
        "{admitted}"
    );
    // No write to the manager ever said it would never fit.
    let said = |what: &str| {
        fleet
            .manager
            .recorded()
            .iter()
            .filter(|r| r.method == "PATCH" && r.uri.contains("/jobs/train"))
            .any(|r| {
                r.body
                    .as_ref()
                    .is_some_and(|b| b.to_string().contains(what))
            })
    };
    assert!(said("WorkerUnreachable") && !said("NeverFits"));
    fleet.reconnect("east");
    eventually(10, "runs in east again, once", || {
        let copies = fleet.copies("train");
        dispatched_to(&fleet, "train").as_deref() == Some("east")
            && copies.len() == 1
            && copies[0].1["spec"]["suspend"] == false
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_dispatcher_after_a_restart_finishes_what_the_old_one_began() {
    let workers = vec![WorkerSpec {
        name: "only",
        nodes: 4,
        cpu: 16,
    }];
    let fleet = Fleet::start(&workers, queue("research", &["only"], json!({}))).await;
    // The old leader claimed a Job and died before creating its copy.
    let mut claimed = job("half-done", "research", 1, 4);
    claimed["metadata"]["annotations"] = json!({CLAIM: "only"});
    fleet.submit(claimed);
    // ... and claimed another, created its copy, and died before unsuspending it.
    let mut created = job("nearly-done", "research", 1, 4);
    created["metadata"]["annotations"] = json!({CLAIM: "only"});
    let stored = fleet.submit(created);
    let copy =
        switchyard::dispatcher::remote::copy_of(&stored, "switchyard", Default::default()).unwrap();
    fleet.workers["only"].upsert(JOBS, copy);
    fleet.submit(job("fresh", "research", 1, 4));
    let d = fleet.dispatcher(false);
    d.settled().await;
    assert!(
        fleet.copies("fresh").is_empty() && fleet.copies("half-done").is_empty(),
        "a replica that does not lead writes nothing"
    );
    d.leader.send(true).unwrap();
    eventually(10, "all run, once each", || {
        ["half-done", "nearly-done", "fresh"]
            .iter()
            .all(|n| dispatched_to(&fleet, n).is_some())
    })
    .await;
    for n in ["half-done", "nearly-done", "fresh"] {
        assert_eq!(fleet.copies(n).len(), 1, "{n}");
    }
    assert_eq!(
        fleet.workers["only"].count("POST", "/jobs"),
        2,
        "the copy made before the restart is kept, not made again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unresponsive_worker_does_not_hold_the_job_once_it_is_declared_lost() {
    let workers = east_west(64, 16);
    let mut fleet = Fleet::start(
        &workers,
        queue(
            "research",
            &["east", "west"],
            json!({"workerLostTimeout": "1s"}),
        ),
    )
    .await;
    let _d = fleet.dispatcher(true);
    // East takes the request and never answers.
    fleet.workers["east"].set_write_delay(Duration::from_secs(3600));
    fleet.submit(job("train", "research", 1, 8));
    eventually(10, "claimed for east", || {
        annotation(&fleet.job("train"), CLAIM) == Some("east")
    })
    .await;
    // Its API server stops answering probes too: the controller says it is gone.
    fleet.disconnect("east");
    eventually(15, "requeued and running in west", || {
        dispatched_to(&fleet, "train").as_deref() == Some("west")
    })
    .await;
    assert_eq!(fleet.copies("train").len(), 1);
}

// ---------------------------------------------------------------------------------------------
// Workers that refuse the copy: backed off per worker, not retried in a loop.

fn refusal(code: u16, reason: &'static str, message: &str) -> Refusal {
    Refusal {
        method: "POST",
        plural: "jobs",
        sub: None,
        code,
        reason,
        message: message.into(),
    }
}

/// What a validating admission webhook's denial looks like to the client (kube-apiserver
/// answers 400 unless the webhook gave a code, and prefixes the webhook's name).
const WEBHOOK_DENIAL: &str = "admission webhook \"jobs.policy.example.com\" denied the request: Jobs in namespace research must carry a cost-center label";

/// Workers `east` and `west`, one node each, of these many CPUs.
fn east_west(east: u32, west: u32) -> Vec<WorkerSpec> {
    vec![
        WorkerSpec {
            name: "east",
            nodes: 1,
            cpu: east,
        },
        WorkerSpec {
            name: "west",
            nodes: 1,
            cpu: west,
        },
    ]
}

fn one_worker(name: &'static str) -> Vec<WorkerSpec> {
    vec![WorkerSpec {
        name,
        nodes: 1,
        cpu: 64,
    }]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_refuses_every_copy_is_retried_with_backoff_and_says_why() {
    let fleet = Fleet::start(&one_worker("only"), queue("research", &["only"], json!({}))).await;
    fleet.workers["only"].refuse(refusal(
        403,
        "Forbidden",
        "jobs.batch is forbidden: User \"system:serviceaccount:switchyard-system:switchyard\" cannot create resource \"jobs\" in API group \"batch\" in the namespace \"research\"",
    ));
    let d = fleet.dispatcher(true);
    fleet.submit(job("train", "research", 1, 8));
    eventually(10, "the refusal is on the Job", || {
        condition(&fleet.job("train"), "Admitted")
            .is_some_and(|c| c["status"] == "False" && c["reason"] == "WorkerRefused")
    })
    .await;
    d.settled().await;
    let creates = fleet.workers["only"].count("POST", "/jobs");
    assert!(
        (1..=2).contains(&creates),
        "the refusing worker is not asked again before its back-off ends: {creates} creates in 4s"
    );
    let j = fleet.job("train");
    let admitted = condition(&j, "Admitted").unwrap();
    let message = admitted["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("cannot create resource") && message.contains("not before"),
        "why, and when it is tried again: {message}"
    );
    assert_eq!(j["spec"]["suspend"], true);
    assert!(annotation(&j, CLAIM).is_none());
    assert_eq!(
        annotation(&j, "switchyard.dev/requeues"),
        None,
        "a refusal is not the Job's fault"
    );
    // The worker is fixed: the Job goes there once its back-off ends.
    fleet.workers["only"].clear_refusals();
    eventually(20, "dispatched once the back-off ends", || {
        dispatched_to(&fleet, "train").as_deref() == Some("only")
    })
    .await;
    assert_eq!(fleet.copies("train").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_that_deny_the_job_by_webhook_are_not_alternated_in_a_loop() {
    let workers = east_west(64, 64);
    let fleet = Fleet::start(&workers, queue("research", &["east", "west"], json!({}))).await;
    fleet.workers["east"].refuse(refusal(400, "", WEBHOOK_DENIAL));
    fleet.workers["west"].refuse(refusal(
        403,
        "Forbidden",
        "admission webhook \"quota.example.com\" denied the request: research is over its GPU budget",
    ));
    let d = fleet.dispatcher(true);
    fleet.submit(job("train", "research", 1, 8));
    d.settled().await;
    for w in ["east", "west"] {
        let creates = fleet.workers[w].count("POST", "/jobs");
        assert!(
            (1..=2).contains(&creates),
            "{w}: {creates} creates in 4s; each refusing worker waits out its own back-off"
        );
    }
    let j = fleet.job("train");
    let message = condition(&j, "Admitted").unwrap()["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        message.contains("east") && message.contains("west") && message.contains("not before"),
        "{message}"
    );
    assert_eq!(annotation(&j, "switchyard.dev/requeues"), None);
    let events = fleet.manager.list(EVENTS);
    assert!(
        events.iter().any(|e| e["reason"] == "WorkerRefused"
            && e["note"]
                .as_str()
                .unwrap_or("")
                .contains("denied the request")),
        "{events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_denial_sends_the_job_to_the_worker_that_takes_it() {
    let workers = vec![
        WorkerSpec {
            name: "picky",
            nodes: 1,
            cpu: 64,
        },
        WorkerSpec {
            name: "easy",
            nodes: 1,
            cpu: 32,
        },
    ];
    let fleet = Fleet::start(&workers, queue("research", &["picky", "easy"], json!({}))).await;
    fleet.workers["picky"].refuse(refusal(400, "", WEBHOOK_DENIAL));
    let d = fleet.dispatcher(true);
    fleet.submit(job("train", "research", 1, 8));
    eventually(10, "the Job runs in the worker that takes it", || {
        dispatched_to(&fleet, "train").as_deref() == Some("easy")
    })
    .await;
    d.settled().await;
    assert_eq!(fleet.workers["picky"].count("POST", "/jobs"), 1);
    assert_eq!(fleet.copies("train").len(), 1);
    let events = fleet.manager.list(EVENTS);
    assert!(
        events.iter().any(|e| e["reason"] == "WorkerRefused"
            && e["note"].as_str().unwrap_or("").contains(WEBHOOK_DENIAL)),
        "{events:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Requeues that must not lose their count.

fn pods_ready_queue(timeout: &str, limit: u32) -> Value {
    queue(
        "research",
        &["only"],
        json!({"waitForPodsReady": {"enabled": true, "timeout": timeout,
               "requeuing": {"backoffBase": "1s", "backoffMax": "2s", "limit": limit}}}),
    )
}

/// Status writes to the manager Job `name`, in order.
fn status_writes(fleet: &Fleet, name: &str) -> Vec<Value> {
    fleet
        .manager
        .recorded()
        .into_iter()
        .filter(|r| {
            r.method == "PATCH"
                && r.uri.contains(&format!("/jobs/{name}/status"))
                && r.status == Some(200)
        })
        .filter_map(|r| r.body)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pods_ready_timeout_is_counted_even_when_the_requeue_write_fails_once() {
    for (code, reason) in [(500, "InternalError"), (409, "Conflict")] {
        let fleet = Fleet::start(&one_worker("only"), pods_ready_queue("1s", 3)).await;
        // The first write of the requeue count fails.
        fleet.manager.fail_next(
            "PATCH",
            "/jobs/slow",
            Some("\"switchyard.dev/requeues\":\"1\""),
            1,
            Refusal {
                method: "PATCH",
                plural: "jobs",
                sub: None,
                code,
                reason,
                message: "the request failed (test)".into(),
            },
        );
        let _d = fleet.dispatcher(true);
        fleet.submit(job("slow", "research", 2, 4));
        eventually(10, "dispatched", || dispatched_to(&fleet, "slow").is_some()).await;
        eventually(10, "the requeue is counted", || {
            annotation(&fleet.job("slow"), "switchyard.dev/requeues") == Some("1")
        })
        .await;
        let j = fleet.job("slow");
        assert_eq!(
            fleet.workers["only"].count("POST", "/jobs"),
            1,
            "{code}: counted before the Job ran again"
        );
        assert!(
            annotation(&j, "switchyard.dev/requeue-after").is_some(),
            "{code}: with its back-off"
        );
        assert!(
            fleet
                .manager
                .recorded()
                .iter()
                .any(|r| r.method == "PATCH" && r.status == Some(code)),
            "{code}: the failure happened"
        );
        for w in status_writes(&fleet, "slow") {
            assert!(
                !w.to_string().contains("DeletedInWorker"),
                "{code}: the copy's removal was never taken for a deletion by someone else: {w}"
            );
        }
        eventually(10, "the copy is removed", || {
            fleet.copies("slow").is_empty() || dispatched_to(&fleet, "slow").is_some()
        })
        .await;
    }
}

/// A requeue and a deactivation are each two writes, the Job's annotations and then its
/// status. When the status write fails after the annotations landed (or the leader dies
/// between them), the next pass finds the Job already requeued or deactivated: without
/// writing that status again, the Job never showed why (found by tests/fault_schedules.rs,
/// e.g. seed 43).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requeue_or_deactivation_whose_status_write_failed_still_says_why() {
    let fleet = Fleet::start(&one_worker("only"), pods_ready_queue("1s", 1)).await;
    let refusal = || Refusal {
        method: "PATCH",
        plural: "jobs",
        sub: Some("status"),
        code: 500,
        reason: "InternalError",
        message: "the request failed (test)".into(),
    };
    for what in ["PodsReadyTimeout", "RequeuingLimitExceeded"] {
        fleet
            .manager
            .fail_next("PATCH", "/jobs/slow/status", Some(what), 1, refusal());
    }
    let _d = fleet.dispatcher(true);
    fleet.submit(job("slow", "research", 2, 4));
    eventually(10, "requeued once, saying why", || {
        let j = fleet.job("slow");
        annotation(&j, "switchyard.dev/requeues") == Some("1")
            && j["spec"]["suspend"] == true
            && condition(&j, "Requeued").is_some_and(|c| c["reason"] == "PodsReadyTimeout")
    })
    .await;
    eventually(20, "deactivated at the limit, saying so", || {
        let j = fleet.job("slow");
        annotation(&j, "switchyard.dev/deactivated").is_some()
            && condition(&j, "Deactivated")
                .is_some_and(|c| c["status"] == "True" && c["reason"] == "RequeuingLimitExceeded")
    })
    .await;
    let failed = fleet
        .manager
        .recorded()
        .iter()
        .filter(|r| r.method == "PATCH" && r.uri.contains("/status") && r.status == Some(500))
        .count();
    assert_eq!(failed, 2, "both status writes failed once");
}

// ---------------------------------------------------------------------------------------------
// The Job status rules, checked before writing.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_the_api_server_would_refuse_is_reported_and_not_sent() {
    let fleet = Fleet::start(&one_worker("only"), queue("research", &["only"], json!({}))).await;
    // Claimed, running, and its status says FailureTarget (a condition that may never be
    // removed, and that Complete may not join); then its copy completes.
    let mut claimed = job("odd", "research", 1, 4);
    claimed["metadata"]["annotations"] =
        json!({CLAIM: "only", "switchyard.dev/admitted-at": "2026-11-22T04:00:00Z"});
    claimed["spec"]["suspend"] = json!(false);
    claimed["status"] = json!({"active": 1, "startTime": "2026-11-22T04:00:00Z",
        "conditions": [{"type": "FailureTarget", "status": "True", "reason": "PodFailurePolicy",
            "message": "m", "lastProbeTime": "2026-11-22T04:00:30Z",
            "lastTransitionTime": "2026-11-22T04:00:30Z"}]});
    let stored = fleet.submit(claimed);
    let mut copy =
        switchyard::dispatcher::remote::copy_of(&stored, "switchyard", Default::default()).unwrap();
    copy["status"] = json!({"succeeded": 1, "active": 0,
        "startTime": "2026-11-22T04:00:00Z", "completionTime": "2026-11-22T04:01:00Z",
        "conditions": [
            {"type": "SuccessCriteriaMet", "status": "True", "reason": "CompletionsReached",
             "message": "m", "lastProbeTime": "2026-11-22T04:01:00Z", "lastTransitionTime": "2026-11-22T04:01:00Z"},
            {"type": "Complete", "status": "True", "reason": "CompletionsReached",
             "message": "m", "lastProbeTime": "2026-11-22T04:01:00Z", "lastTransitionTime": "2026-11-22T04:01:00Z"}]});
    fleet.workers["only"].upsert(JOBS, copy);
    let _d = fleet.dispatcher(true);
    eventually(10, "the result is recorded and the copy removed", || {
        annotation(&fleet.job("odd"), "switchyard.dev/result") == Some("Succeeded")
            && fleet.copies("odd").is_empty()
    })
    .await;
    for w in status_writes(&fleet, "odd") {
        assert!(
            !w.to_string().contains("\"Complete\""),
            "Complete next to FailureTarget is refused by the API server; not sent: {w}"
        );
    }
    let events = fleet.manager.list(EVENTS);
    assert!(
        events.iter().any(|e| e["reason"] == "StatusRefused"
            && e["note"].as_str().unwrap_or("").contains("FailureTarget")),
        "{events:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Manager writes refused for good: reported once, not retried until the Job changes.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_the_manager_refuses_is_reported_once_and_retried_when_the_job_changes() {
    let fleet = Fleet::start(&one_worker("only"), queue("research", &["only"], json!({}))).await;
    fleet.manager.refuse(Refusal {
        method: "PATCH",
        plural: "jobs",
        sub: None,
        code: 403,
        reason: "Forbidden",
        message: "admission webhook \"freeze.example.com\" denied the request: changes to Jobs are frozen".into(),
    });
    let d = fleet.dispatcher(true);
    fleet.submit(job("train", "research", 1, 4));
    eventually(10, "the refusal is reported", || {
        fleet
            .manager
            .list(EVENTS)
            .iter()
            .any(|e| e["reason"] == "WriteRefused")
    })
    .await;
    d.settled().await;
    let patches = |fleet: &Fleet| {
        fleet
            .manager
            .recorded()
            .iter()
            .filter(|r| r.method == "PATCH" && r.uri.contains("/jobs/train?"))
            .count()
    };
    assert_eq!(
        patches(&fleet),
        1,
        "not retried while the Job stays the same"
    );
    let refused: Vec<Value> = fleet
        .manager
        .list(EVENTS)
        .into_iter()
        .filter(|e| e["reason"] == "WriteRefused")
        .collect();
    assert_eq!(refused.len(), 1, "reported once: {refused:?}");
    assert!(refused[0]["note"]
        .as_str()
        .unwrap_or("")
        .contains("changes to Jobs are frozen"));
    // The freeze ends and someone edits the Job: it is tried again.
    fleet.manager.clear_refusals();
    let mut j = fleet.job("train");
    j["metadata"]["labels"]["touched"] = json!("yes");
    fleet.submit(j);
    eventually(10, "dispatched after the Job changed", || {
        dispatched_to(&fleet, "train").is_some()
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// A short disconnect changes nothing.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_lost_for_less_than_its_timeout_changes_nothing() {
    let (mut fleet, d) = train_in_east("30s").await;
    let uid = fleet.copies("train")[0].1["metadata"]["uid"].clone();
    fleet.disconnect("east");
    // A Job that only east can hold arrives while it is away: the queue's automatic quota
    // still counts east, and the Job waits for east to answer, not "never fits".
    fleet.submit(job("wide", "research", 1, 12));
    eventually(10, "the new Job says why it waits", || {
        condition(&fleet.job("wide"), "Admitted").is_some_and(|c| c["status"] == "False")
    })
    .await;
    d.settled().await;
    let wide = condition(&fleet.job("wide"), "Admitted").unwrap().clone();
    assert_eq!(wide["reason"], "WorkerUnreachable", "{wide}");
    let message = wide["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("worker east could, and it is unreachable")
            && message.contains("east: not connected (dial tcp: connection refused)"),
        "{wide}"
    );
    let q = fleet
        .manager
        .get(common::fake_api::DISPATCH_QUEUES, "", "research")
        .unwrap();
    assert_eq!(
        q["status"]["effectiveQuota"]["cpu"], "24",
        "east's CPUs still count: {}",
        q["status"]
    );
    fleet.reconnect("east");
    eventually(10, "the waiting Job goes to east once it is back", || {
        dispatched_to(&fleet, "wide").as_deref() == Some("east")
    })
    .await;
    let j = fleet.job("train");
    assert!(condition(&j, "Requeued").is_none(), "never requeued");
    assert_eq!(dispatched_to(&fleet, "train").as_deref(), Some("east"));
    let copies = fleet.copies("train");
    assert_eq!(copies.len(), 1);
    assert_eq!(copies[0].1["metadata"]["uid"], uid, "the same copy runs on");
    assert_eq!(fleet.workers["east"].count("DELETE", "/jobs"), 0);
    assert_eq!(fleet.workers["west"].count("POST", "/jobs"), 0);
}

// ---------------------------------------------------------------------------------------------
// blockAdmission: one Job at a time, in priority order, until its pods are Ready.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_admission_admits_one_job_at_a_time_in_priority_order() {
    let fleet = Fleet::start(
        &one_worker("only"),
        queue(
            "research",
            &["only"],
            json!({"waitForPodsReady": {"enabled": true, "blockAdmission": true, "timeout": "60s"}}),
        ),
    )
    .await;
    let mut urgent = job("b-urgent", "research", 2, 4);
    urgent["spec"]["template"]["spec"]["priorityClassName"] = json!("high");
    for j in [
        job("c-later", "research", 1, 4),
        urgent,
        job("a-first", "research", 1, 4),
    ] {
        fleet.submit(j);
    }
    let d = fleet.dispatcher(true);
    let running = |fleet: &Fleet| -> Vec<&str> {
        ["a-first", "b-urgent", "c-later"]
            .into_iter()
            .filter(|n| dispatched_to(fleet, n).is_some())
            .collect()
    };
    for (expected, next) in [
        (vec!["b-urgent"], "b-urgent"),
        (vec!["a-first", "b-urgent"], "a-first"),
        (vec!["a-first", "b-urgent", "c-later"], "c-later"),
    ] {
        eventually(10, &format!("{expected:?} admitted"), || {
            running(&fleet) == expected
        })
        .await;
        d.settled().await;
        assert_eq!(
            running(&fleet),
            expected,
            "nothing else until {next} is Ready"
        );
        for n in ["a-first", "b-urgent", "c-later"] {
            if !expected.contains(&n) {
                let c = condition(&fleet.job(n), "Admitted")
                    .cloned()
                    .unwrap_or(Value::Null);
                assert_eq!(c["reason"], "WaitingForPodsReady", "{n}: {c}");
            }
        }
        let pods = fleet.job(next)["spec"]["parallelism"].as_i64().unwrap();
        fleet.copy_status(
            "only",
            next,
            json!({"active": pods, "ready": pods, "startTime": "2026-11-22T04:00:00Z"}),
        );
        eventually(10, &format!("{next} is PodsReady"), || {
            condition(&fleet.job(next), "PodsReady").is_some_and(|c| c["status"] == "True")
        })
        .await;
    }
}

// ---------------------------------------------------------------------------------------------
// Seed 000's "job status changes frequently".

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_whose_status_changes_quickly_is_followed_in_order_to_the_end() {
    let fleet = Fleet::start(&one_worker("only"), queue("research", &["only"], json!({}))).await;
    let _d = fleet.dispatcher(true);
    let mut busy = job("busy", "research", 4, 1);
    busy["spec"]["completions"] = json!(40);
    fleet.submit(busy);
    eventually(10, "dispatched", || dispatched_to(&fleet, "busy").is_some()).await;
    let start = "2026-11-22T04:00:00Z";
    for done in 0..40 {
        let active = (40 - done).min(4);
        fleet.copy_status(
            "only",
            "busy",
            json!({"active": active, "ready": active.min(done % 5), "succeeded": done,
                   "failed": done / 10, "startTime": start,
                   "uncountedTerminatedPods": {}}),
        );
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    let final_status = json!({"active": 0, "ready": 0, "succeeded": 40, "failed": 3,
        "startTime": start, "completionTime": "2026-11-22T04:05:00Z",
        "uncountedTerminatedPods": {},
        "conditions": [
            {"type": "SuccessCriteriaMet", "status": "True", "reason": "CompletionsReached",
             "message": "Reached expected number of succeeded pods",
             "lastProbeTime": "2026-11-22T04:05:00Z", "lastTransitionTime": "2026-11-22T04:05:00Z"},
            {"type": "Complete", "status": "True", "reason": "CompletionsReached",
             "message": "Reached expected number of succeeded pods",
             "lastProbeTime": "2026-11-22T04:05:00Z", "lastTransitionTime": "2026-11-22T04:05:00Z"}]});
    fleet.copy_status("only", "busy", final_status.clone());
    eventually(10, "the Job completes", || {
        condition(&fleet.job("busy"), "Complete").is_some_and(|c| c["status"] == "True")
    })
    .await;
    let j = fleet.job("busy");
    for field in ["succeeded", "failed", "startTime", "completionTime"] {
        assert_eq!(
            j["status"][field], final_status[field],
            "{field} ends equal"
        );
    }
    assert!(j["status"]["active"].as_i64().unwrap_or(0) == 0);
    // The fake API server records a write's answer just after storing it: the final write
    // may show in the Job a moment before it shows as answered.
    eventually(5, "the final status write is recorded as answered", || {
        status_writes(&fleet, "busy")
            .iter()
            .any(|w| w["status"]["succeeded"] == 40)
    })
    .await;
    // Every write went forward: counters never went down, ready never above active, and
    // the changes came in the order the worker made them.
    let writes = status_writes(&fleet, "busy");
    let mut last = (0, 0);
    let mut seen = 0;
    for w in &writes {
        let s = &w["status"];
        let succeeded = s["succeeded"].as_i64().unwrap_or(last.0);
        let failed = s["failed"].as_i64().unwrap_or(last.1);
        assert!(
            succeeded >= last.0 && failed >= last.1,
            "counters went back: {last:?} then {w}"
        );
        if let (Some(r), Some(a)) = (s["ready"].as_i64(), s["active"].as_i64()) {
            assert!(r <= a, "{w}");
        }
        if s.get("succeeded").is_some() {
            seen += 1;
        }
        last = (succeeded, failed);
    }
    assert_eq!(last, (40, 3));
    assert!(
        seen >= 5,
        "the manager followed the changes as they came, not only the end: {seen} writes"
    );
}

// ---------------------------------------------------------------------------------------------
// Leadership changes in the middle of a dispatch.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_loses_the_lease_between_claim_and_create_leaves_exactly_one_copy() {
    let fleet = Fleet::start(&one_worker("only"), queue("research", &["only"], json!({}))).await;
    // The worker takes its time: the old leader's create is still on the wire when the new
    // leader takes over.
    fleet.workers["only"].set_write_delay(Duration::from_millis(600));
    let old = fleet.dispatcher(true);
    let new = fleet.dispatcher(false);
    fleet.submit(job("train", "research", 1, 4));
    eventually(10, "the old leader claimed it", || {
        annotation(&fleet.job("train"), CLAIM).is_some()
    })
    .await;
    assert!(fleet.copies("train").is_empty(), "its create is in flight");
    old.leader.send(false).unwrap();
    new.leader.send(true).unwrap();
    eventually(10, "the Job runs", || {
        dispatched_to(&fleet, "train").is_some()
    })
    .await;
    new.settled().await;
    let copies = fleet.copies("train");
    assert_eq!(copies.len(), 1, "{copies:?}");
    assert_eq!(
        copies[0].1["metadata"]["labels"]["switchyard.dev/origin-uid"],
        fleet.job("train")["metadata"]["uid"]
    );
    assert_eq!(
        fleet.workers["only"].count("DELETE", "/jobs"),
        0,
        "the copy that runs is never removed"
    );
    assert!(
        fleet.workers["only"].count("POST", "/jobs") >= 2,
        "both leaders tried to create it; the second was told it exists and adopted it"
    );
    assert_eq!(dispatched_to(&fleet, "train").as_deref(), Some("only"));
}

/// CPUs of the Jobs the manager shows claimed.
fn claimed_cpu(fleet: &Fleet, jobs: &[(&str, u32)]) -> u32 {
    jobs.iter()
        .filter(|(name, _)| annotation(&fleet.job(name), CLAIM).is_some())
        .map(|(_, cpu)| cpu)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_whose_watch_lags_does_not_admit_into_quota_the_old_one_handed_out() {
    let fleet = Fleet::start(
        &east_west(16, 16),
        queue(
            "research",
            &["east", "west"],
            json!({"quota": {"cpu": "10"}}),
        ),
    )
    .await;
    // Why a Job waits is written once: a rewrite would change small-1 after the standby
    // listed it, and the standby's claim of it would then meet 409.
    let mut options = Fleet::options();
    options.config.wait_rewrite_after = Duration::from_secs(3600);
    let jobs = [("small-0", 4), ("big", 8), ("small-1", 4)];
    let old = fleet.dispatcher_with(true, options.clone());
    fleet.submit(job("small-0", "research", 1, 4));
    eventually(10, "small-0 runs", || {
        dispatched_to(&fleet, "small-0").is_some()
    })
    .await;
    fleet.submit(job("big", "research", 1, 8));
    fleet.submit(job("small-1", "research", 1, 4));
    // small-1 waits behind big, whose quota is held for it.
    eventually(10, "big and small-1 wait for quota", || {
        ["big", "small-1"].iter().all(|n| {
            condition(&fleet.job(n), "Admitted").is_some_and(|c| c["reason"] == "QuotaExceeded")
        })
    })
    .await;
    old.settled().await;

    // The standby lists the Jobs as they are now; its watch then stays silent, as one that
    // lags behind the writes.
    let watches = fleet.manager.watches(JOBS).len();
    fleet.manager.hang_watches(JOBS, true);
    let new = fleet.dispatcher_with(false, options);
    eventually(10, "the standby listed the Jobs and watches them", || {
        fleet.manager.watches(JOBS).len() > watches
    })
    .await;
    fleet.manager.hang_watches(JOBS, false);
    new.settled().await;

    // small-0 is deleted; the leader removes its copy and gives its room to big.
    fleet.manager.delete(JOBS, "small-0");
    eventually(10, "big runs in small-0's room", || {
        dispatched_to(&fleet, "big").is_some()
    })
    .await;
    old.settled().await;
    assert_eq!(claimed_cpu(&fleet, &jobs), 8);

    // The lease passes at once. The standby's watch still shows small-0 holding 4 CPUs and
    // big unclaimed, with a copy in a worker: while it asks the manager about that copy,
    // small-1 would fit in the other worker.
    old.leader.send(false).unwrap();
    new.leader.send(true).unwrap();
    new.settled().await;
    new.settled().await;
    assert_eq!(
        annotation(&fleet.job("small-1"), CLAIM),
        None,
        "small-1 waits: big holds 8 of the 10 CPUs"
    );
    assert_eq!(claimed_cpu(&fleet, &jobs), 8, "the quota holds");
    assert_eq!(fleet.copies("small-1").len(), 0);
    assert_eq!(dispatched_to(&fleet, "big").as_deref(), Some("west"));
    assert_eq!(fleet.uncovered(), Vec::<String>::new());
}

// ---------------------------------------------------------------------------------------------
// A restart in the middle of each step: no duplicates, no losses.

fn ago(secs: u64) -> String {
    switchyard::dispatcher::rfc3339(std::time::SystemTime::now() - Duration::from_secs(secs))
}

fn from_now(secs: u64) -> String {
    switchyard::dispatcher::rfc3339(std::time::SystemTime::now() + Duration::from_secs(secs))
}

/// `train` (one pod, 4 CPUs) dispatched to `east` (16 CPUs), the other worker of queue
/// `research` being `west` (8 CPUs); workers are lost after `lost_after`.
async fn train_in_east(lost_after: &str) -> (Fleet, Running) {
    let workers = east_west(16, 8);
    let fleet = Fleet::start(
        &workers,
        queue(
            "research",
            &["east", "west"],
            json!({"workerLostTimeout": lost_after}),
        ),
    )
    .await;
    let dispatcher = fleet.dispatcher(true);
    fleet.submit(job("train", "research", 1, 4));
    eventually(10, "dispatched to east", || {
        dispatched_to(&fleet, "train").as_deref() == Some("east")
    })
    .await;
    (fleet, dispatcher)
}

/// Live copies of the Job (not being deleted) across the workers.
fn live_copies(fleet: &Fleet, name: &str) -> usize {
    fleet
        .copies(name)
        .iter()
        .filter(|(_, c)| c["metadata"]["deletionTimestamp"].is_null())
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_after_the_requeue_was_written_removes_the_copy_and_keeps_the_count() {
    let fleet = Fleet::start(
        &east_west(16, 16),
        queue(
            "research",
            &["east", "west"],
            json!({"waitForPodsReady": {"enabled": true, "timeout": "30s",
                   "requeuing": {"backoffBase": "1s", "limit": 5}}}),
        ),
    )
    .await;
    // Requeued by the old leader (counted, with back-off), which died before removing the
    // copy from east.
    let mut requeued = job("again", "research", 1, 4);
    requeued["metadata"]["annotations"] = json!({
        "switchyard.dev/requeues": "1",
        "switchyard.dev/requeue-after": from_now(1),
        "switchyard.dev/avoid-cluster": "east"});
    let stored = fleet.submit(requeued);
    let copy =
        switchyard::dispatcher::remote::copy_of(&stored, "switchyard", Default::default()).unwrap();
    fleet.workers["east"].upsert(JOBS, copy);
    let _d = fleet.dispatcher(true);
    let mut max_live = 0;
    eventually(15, "the old copy is gone and the Job runs again", || {
        max_live = max_live.max(live_copies(&fleet, "again"));
        fleet.workers["east"].get(JOBS, NS, "again").is_none()
            && dispatched_to(&fleet, "again").is_some()
    })
    .await;
    assert_eq!(max_live, 1, "never two copies at once");
    assert_eq!(fleet.workers["east"].count("DELETE", "/jobs"), 1);
    assert_eq!(
        annotation(&fleet.job("again"), "switchyard.dev/requeues"),
        Some("1"),
        "the count survives"
    );
    let posts =
        fleet.workers["east"].count("POST", "/jobs") + fleet.workers["west"].count("POST", "/jobs");
    assert_eq!(posts, 1, "one new copy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_after_the_final_status_was_mirrored_only_removes_the_copy() {
    let fleet = Fleet::start(&one_worker("only"), queue("research", &["only"], json!({}))).await;
    let complete = json!({"succeeded": 1, "startTime": "2026-11-22T04:00:00Z",
        "completionTime": "2026-11-22T04:01:00Z",
        "conditions": [
            {"type": "SuccessCriteriaMet", "status": "True", "reason": "CompletionsReached",
             "message": "m", "lastProbeTime": "2026-11-22T04:01:00Z", "lastTransitionTime": "2026-11-22T04:01:00Z"},
            {"type": "Complete", "status": "True", "reason": "CompletionsReached",
             "message": "m", "lastProbeTime": "2026-11-22T04:01:00Z", "lastTransitionTime": "2026-11-22T04:01:00Z"}]});
    let mut done = job("done", "research", 1, 4);
    done["metadata"]["annotations"] = json!({CLAIM: "only",
        "switchyard.dev/admitted-at": ago(120), "switchyard.dev/result": "Succeeded"});
    done["spec"]["suspend"] = json!(false);
    done["status"] = complete.clone();
    let stored = fleet.submit(done);
    let mut copy =
        switchyard::dispatcher::remote::copy_of(&stored, "switchyard", Default::default()).unwrap();
    copy["status"] = complete.clone();
    fleet.workers["only"].upsert(JOBS, copy);
    let d = fleet.dispatcher(true);
    eventually(10, "the finished Job's copy is removed", || {
        fleet.copies("done").is_empty()
    })
    .await;
    d.settled().await;
    let j = fleet.job("done");
    assert_eq!(j["status"]["succeeded"], 1);
    assert!(condition(&j, "Complete").is_some_and(|c| c["status"] == "True"));
    assert!(condition(&j, "Requeued").is_none());
    assert_eq!(
        fleet.workers["only"].count("POST", "/jobs"),
        0,
        "never run again"
    );
    assert!(
        status_writes(&fleet, "done").is_empty(),
        "nothing left to mirror"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_past_a_pods_ready_deadline_requeues_once_then_runs_once() {
    let fleet = Fleet::start(
        &east_west(16, 16),
        queue(
            "research",
            &["east", "west"],
            json!({"waitForPodsReady": {"enabled": true, "timeout": "2s",
                   "requeuing": {"backoffBase": "1s", "limit": 5}}}),
        ),
    )
    .await;
    // Dispatched to east a minute ago; its pods never got Ready; the dispatcher was away.
    let mut late = job("late", "research", 1, 4);
    late["metadata"]["annotations"] = json!({CLAIM: "east", "switchyard.dev/admitted-at": ago(60)});
    late["spec"]["suspend"] = json!(false);
    let stored = fleet.submit(late);
    let mut copy =
        switchyard::dispatcher::remote::copy_of(&stored, "switchyard", Default::default()).unwrap();
    copy["status"] = json!({"active": 1, "ready": 0, "startTime": "2026-11-22T04:00:00Z"});
    fleet.workers["east"].upsert(JOBS, copy);
    let _d = fleet.dispatcher(true);
    let mut max_live = 0;
    eventually(15, "requeued once and running in west", || {
        max_live = max_live.max(live_copies(&fleet, "late"));
        dispatched_to(&fleet, "late").as_deref() == Some("west")
    })
    .await;
    assert_eq!(max_live, 1, "never two copies at once");
    let j = fleet.job("late");
    assert_eq!(annotation(&j, "switchyard.dev/requeues"), Some("1"));
    assert!(fleet.workers["east"].get(JOBS, NS, "late").is_none());
    assert_eq!(fleet.workers["west"].count("POST", "/jobs"), 1);
    assert_eq!(fleet.workers["east"].count("POST", "/jobs"), 0);
}

// ---------------------------------------------------------------------------------------------
// A burst: the queue's quota is never exceeded.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_jobs_never_exceeds_the_queue_quota() {
    const JOBS_IN_BURST: usize = 240;
    const QUOTA: usize = 20;
    let workers = vec![
        WorkerSpec {
            name: "east",
            nodes: 4,
            cpu: 16,
        },
        WorkerSpec {
            name: "west",
            nodes: 4,
            cpu: 16,
        },
    ];
    let fleet = Fleet::start(
        &workers,
        queue(
            "research",
            &["east", "west"],
            json!({"quota": {"cpu": QUOTA.to_string()}}),
        ),
    )
    .await;
    for i in 0..JOBS_IN_BURST {
        fleet.submit(job(&format!("b-{i:03}"), "research", 1, 1));
    }
    let _d = fleet.dispatcher(true);
    let started = std::time::Instant::now();
    let mut most = 0;
    let complete = json!({"succeeded": 1, "active": 0, "startTime": "2026-11-22T04:00:00Z",
        "completionTime": "2026-11-22T04:00:01Z", "uncountedTerminatedPods": {},
        "conditions": [
            {"type": "SuccessCriteriaMet", "status": "True", "reason": "CompletionsReached",
             "message": "m", "lastProbeTime": "2026-11-22T04:00:01Z", "lastTransitionTime": "2026-11-22T04:00:01Z"},
            {"type": "Complete", "status": "True", "reason": "CompletionsReached",
             "message": "m", "lastProbeTime": "2026-11-22T04:00:01Z", "lastTransitionTime": "2026-11-22T04:00:01Z"}]});
    loop {
        // Copies not yet finished: each holds one CPU of the quota.
        let mut running = Vec::new();
        for (w, api) in &fleet.workers {
            for c in api.list(JOBS) {
                if condition(&c, "Complete").is_none() {
                    running.push((
                        w.clone(),
                        c["metadata"]["name"].as_str().unwrap().to_string(),
                    ));
                }
            }
        }
        most = most.max(running.len());
        assert!(
            running.len() <= QUOTA,
            "{} copies run at once",
            running.len()
        );
        let q = fleet
            .manager
            .get(common::fake_api::DISPATCH_QUEUES, "", "research")
            .unwrap();
        if let Some(used) = q["status"]["quotaUsage"]["cpu"].as_str() {
            assert!(
                used.parse::<usize>().unwrap_or(0) <= QUOTA,
                "{}",
                q["status"]
            );
        }
        // Their pods finish.
        for (w, name) in running {
            fleet.copy_status(&w, &name, complete.clone());
        }
        let done = (0..JOBS_IN_BURST)
            .filter(|i| {
                annotation(&fleet.job(&format!("b-{i:03}")), "switchyard.dev/result")
                    == Some("Succeeded")
            })
            .count();
        if done == JOBS_IN_BURST {
            break;
        }
        // A bound for liveness, not speed: alone it takes about 3 s, on a loaded CI machine
        // many times that.
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{done} of {JOBS_IN_BURST} done after 60s"
        );
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert!(
        most >= QUOTA / 2,
        "the quota was the limit: at most {most} at once"
    );
    // Each Job ran once.
    let mut creates = std::collections::BTreeMap::new();
    for api in fleet.workers.values() {
        for r in api.recorded() {
            if r.method == "POST" && r.uri.contains("/jobs") && r.status == Some(201) {
                let name = r.body.as_ref().unwrap()["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .to_string();
                *creates.entry(name).or_insert(0) += 1;
            }
        }
    }
    assert_eq!(creates.len(), JOBS_IN_BURST);
    let twice: Vec<(String, Value, Vec<Value>)> = creates
        .iter()
        .filter(|(_, n)| **n != 1)
        .map(|(name, _)| {
            let events: Vec<Value> = fleet
                .manager
                .list(EVENTS)
                .into_iter()
                .filter(|e| e["regarding"]["name"] == name.as_str())
                .map(|e| json!([e["reason"], e["note"]]))
                .collect();
            (name.clone(), fleet.job(name)["status"].clone(), events)
        })
        .collect();
    assert!(twice.is_empty(), "ran twice: {twice:#?}");
}

// ---------------------------------------------------------------------------------------------
// What users see: every waiting Job says why, without a burst of writes; metrics.

/// The value of one series in the OpenMetrics text, if present.
fn series(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_waiting_job_says_why_at_a_bounded_rate_and_the_metrics_count_them() {
    let fleet = Fleet::start(
        &one_worker("only"),
        queue("research", &["only"], json!({"quota": {"cpu": "8"}})),
    )
    .await;
    let metrics = std::sync::Arc::new(switchyard::metrics::Metrics::new());
    let mut options = Fleet::options();
    options.wait_writes_per_second = 10;
    let _d = fleet.dispatcher_with_metrics(true, options, Some(metrics.clone()));
    let names: Vec<String> = (0..40).map(|i| format!("w-{i:02}")).collect();
    for n in &names {
        fleet.submit(job(n, "research", 1, 4));
    }
    let waiting_for_quota = |fleet: &Fleet| {
        names
            .iter()
            .filter(|n| {
                condition(&fleet.job(n), "Admitted")
                    .is_some_and(|c| c["status"] == "False" && c["reason"] == "QuotaExceeded")
            })
            .count()
    };
    eventually(5, "two Jobs fill the quota", || {
        names
            .iter()
            .filter(|n| dispatched_to(&fleet, n).is_some())
            .count()
            == 2
    })
    .await;
    let first_second = waiting_for_quota(&fleet);
    assert!(
        first_second <= 25,
        "reasons are written at a bounded rate, not all at once: {first_second}"
    );
    eventually(15, "every one of the 38 waiting Jobs says why", || {
        waiting_for_quota(&fleet) == 38
    })
    .await;
    // The counts are published at each plan; a Job whose condition is being written when
    // one plan runs is counted by the next.
    eventually(5, "the metrics count the 38 waiting Jobs", || {
        series(
            &metrics.encode(),
            "switchyard_queue_waiting_jobs{queue=\"research\",reason=\"Quota\"}",
        ) == Some(38.0)
    })
    .await;
    let text = metrics.encode();
    let q = |m: &str, l: &str| series(&text, &format!("switchyard_{m}{{queue=\"research\",{l}}}"));
    assert_eq!(q("queue_quota", "resource=\"cpu\""), Some(8.0), "{text}");
    assert_eq!(
        q("queue_quota_used", "resource=\"cpu\""),
        Some(8.0),
        "{text}"
    );
    assert_eq!(
        q("queue_waiting_jobs", "reason=\"Quota\""),
        Some(38.0),
        "{text}"
    );
    for other in ["PodsReadyGate", "NoFit", "Backoff", "Inactive"] {
        assert_eq!(
            q("queue_waiting_jobs", &format!("reason=\"{other}\"")),
            Some(0.0),
            "{text}"
        );
    }
    // A copy deleted in its worker: a requeue, counted by reason.
    let running = names
        .iter()
        .find(|n| dispatched_to(&fleet, n).is_some())
        .unwrap()
        .clone();
    fleet.workers["only"].delete(JOBS, &format!("{NS}/{running}"));
    eventually(10, "the requeue is counted", || {
        series(
            &metrics.encode(),
            "switchyard_dispatch_requeues_total{queue=\"research\",reason=\"DeletedInWorker\"}",
        ) == Some(1.0)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_in_backoff_keeps_saying_when_it_is_tried_next() {
    let fleet = Fleet::start(
        &one_worker("only"),
        queue(
            "research",
            &["only"],
            json!({"quota": {"cpu": "4"},
                   "waitForPodsReady": {"enabled": true, "timeout": "1s",
                       "requeuing": {"backoffBase": "20s", "limit": 3}}}),
        ),
    )
    .await;
    let d = fleet.dispatcher(true);
    fleet.submit(job("a-slow", "research", 1, 4));
    eventually(10, "requeued after its timeout", || {
        annotation(&fleet.job("a-slow"), "switchyard.dev/requeues") == Some("1")
    })
    .await;
    // Two more of its class: one takes the quota, the other waits for it.
    fleet.submit(job("b-next", "research", 1, 4));
    fleet.submit(job("c-last", "research", 1, 4));
    eventually(10, "the last one waits for quota", || {
        condition(&fleet.job("c-last"), "Admitted").is_some_and(|c| c["reason"] == "QuotaExceeded")
    })
    .await;
    d.settled().await;
    let a = condition(&fleet.job("a-slow"), "Admitted")
        .cloned()
        .unwrap();
    assert_eq!(a["reason"], "PodsReadyTimeout", "{a}");
    assert!(
        a["message"]
            .as_str()
            .unwrap_or("")
            .contains("next attempt not before"),
        "its back-off is not overwritten by its class's quota message: {a}"
    );
}

/// A fleet whose dispatcher's watch of the manager's Jobs shows nothing after its first list:
/// its view falls behind, as a second dispatcher's (or a cached list's) would. With `claimed`,
/// that list held the Job `claimed` of a queue that does not exist, and it was seen waiting.
async fn a_view_behind(claimed: bool) -> (Fleet, Running) {
    let fleet = Fleet::start(
        &east_west(16, 16),
        queue("research", &["east", "west"], json!({})),
    )
    .await;
    fleet.manager.hang_watches(JOBS, true);
    if claimed {
        fleet.submit(job("claimed", "elsewhere", 1, 4));
    }
    let d = fleet.dispatcher(true);
    if claimed {
        eventually(10, "the dispatcher has seen the Job wait", || {
            condition(&fleet.job("claimed"), "Admitted").is_some_and(|c| c["status"] == "False")
        })
        .await;
    } else {
        d.settled().await;
    }
    (fleet, d)
}

/// `job` claimed for east and unsuspended, as another dispatcher writes it; as stored.
fn claimed_for_east(fleet: &Fleet, mut job: Value) -> Value {
    job["metadata"]["annotations"] = json!({CLAIM: "east", "switchyard.dev/admitted-at": ago(0)});
    job["spec"]["suspend"] = json!(false);
    fleet.manager.upsert(JOBS, job)
}

/// The copy of the manager Job `stored` in east, as its dispatcher creates it.
fn copy_in_east(fleet: &Fleet, stored: &Value) {
    let copy =
        switchyard::dispatcher::remote::copy_of(stored, "switchyard", Default::default()).unwrap();
    fleet.workers["east"].upsert(JOBS, copy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_claimed_by_a_job_newer_than_the_dispatchers_view_is_not_removed() {
    let (fleet, d) = a_view_behind(true).await;
    // Another dispatcher claims it for east, creates its copy and unsuspends it.
    let stored = claimed_for_east(&fleet, fleet.job("claimed"));
    copy_in_east(&fleet, &stored);

    // Seen from the stale view, the copy is one its Job does not keep; the Job read again
    // says it does.
    eventually(10, "the dispatcher acts on the copy", || {
        fleet.manager.count("GET", "/jobs/claimed") > 0
            || fleet.workers["east"].count("DELETE", "/jobs") > 0
    })
    .await;
    d.settled().await;
    assert_eq!(
        fleet.workers["east"].count("DELETE", "/jobs"),
        0,
        "the copy the Job claims stays"
    );
    assert_eq!(fleet.copies("claimed").len(), 1);
    assert_eq!(annotation(&fleet.job("claimed"), CLAIM), Some("east"));
    assert_eq!(fleet.job("claimed")["spec"]["suspend"], false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_whose_job_the_dispatchers_watch_has_not_shown_yet_is_kept() {
    // The dispatcher lists no Job, and its watch then shows nothing.
    let (fleet, d) = a_view_behind(false).await;
    // Another dispatcher's Job, claimed for east, with its copy there: to this dispatcher the
    // copy's Job is unknown, and the Job read again shows it keeps the copy.
    let stored = claimed_for_east(&fleet, job("claimed", "research", 1, 4));
    copy_in_east(&fleet, &stored);
    eventually(10, "the dispatcher reads the Job again", || {
        fleet.manager.count("GET", "/jobs/claimed") > 0
    })
    .await;
    d.settled().await;
    d.settled().await;
    assert_eq!(
        fleet.workers["east"].count("DELETE", "/jobs"),
        0,
        "the copy stays"
    );
    assert_eq!(
        fleet.manager.count("GET", "/jobs/claimed"),
        1,
        "read once, not again at every look while the watch is behind"
    );
}

/// The copy of `stored` is made in east, and the dispatcher, to which it looks unkept, reads
/// the Job again: the read is made at once and answered 3 s late.
async fn read_late_with_its_copy_in_east(fleet: &Fleet, stored: &Value) {
    fleet.manager.lose_next(
        "GET",
        "/jobs/claimed",
        1,
        Loss::Hang(Duration::from_secs(3)),
    );
    copy_in_east(fleet, stored);
    eventually(10, "the dispatcher reads the Job again", || {
        fleet.manager.count("GET", "/jobs/claimed") > 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_deleted_while_it_was_read_again_does_not_keep_its_copy() {
    let (fleet, _d) = a_view_behind(true).await;
    // Another dispatcher claims it for east and creates its copy; this dispatcher's read of
    // the Job (to check the copy it thinks unkept) sees that claim, but its answer is slow.
    let stored = claimed_for_east(&fleet, fleet.job("claimed"));
    read_late_with_its_copy_in_east(&fleet, &stored).await;
    // Meanwhile the Job is deleted, and the dispatcher's watch catches up (its deletion
    // included) before that read answers.
    fleet.manager.delete(JOBS, "claimed");
    fleet.manager.hang_watches(JOBS, false);
    fleet.manager.end_watches();
    eventually(10, "the watch shows the deletion", || {
        fleet
            .manager
            .watches(JOBS)
            .iter()
            .any(|w| w.last_sent.is_some())
    })
    .await;
    // The late answer is older than the deletion: the copy goes with its Job.
    eventually(15, "the copy is removed", || {
        fleet.copies("claimed").is_empty()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_its_watch_never_showed_deleted_while_it_was_read_again_does_not_keep_its_copy() {
    // The Job is made, read and deleted while the dispatcher's watch shows nothing; the watch
    // then has to list the Jobs again (410 Gone), and the list no longer has it. (Its queue
    // does not exist, so the dispatcher has nothing to write to it: a write would find it gone.)
    let (fleet, _d) = a_view_behind(false).await;
    let stored = claimed_for_east(&fleet, job("claimed", "elsewhere", 1, 4));
    read_late_with_its_copy_in_east(&fleet, &stored).await;
    fleet.manager.delete(JOBS, "claimed");
    fleet.submit(job("later", "elsewhere", 1, 4));
    fleet.manager.expire_next_watches(JOBS, 1);
    fleet.manager.hang_watches(JOBS, false);
    fleet.manager.end_watches();
    eventually(10, "the list after the 410 shows a later Job", || {
        condition(&fleet.job("later"), "Admitted").is_some_and(|c| c["status"] == "False")
    })
    .await;
    eventually(15, "the copy is removed", || {
        fleet.copies("claimed").is_empty()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_whose_job_read_again_still_does_not_keep_it_is_removed() {
    let fleet = Fleet::start(
        &east_west(16, 16),
        queue("research", &["east", "west"], json!({})),
    )
    .await;
    let stored = fleet.submit(job("unclaimed", "elsewhere", 1, 4));
    // A copy left from an earlier attempt: the Job, read again, claims no worker.
    let copy =
        switchyard::dispatcher::remote::copy_of(&stored, "switchyard", Default::default()).unwrap();
    fleet.workers["west"].upsert(JOBS, copy);
    let _d = fleet.dispatcher(true);
    eventually(10, "the stale copy is removed", || {
        fleet.copies("unclaimed").is_empty()
    })
    .await;
    assert_eq!(fleet.workers["west"].count("DELETE", "/jobs"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_started_beside_a_starving_gangs_room_keeps_its_pods_off_that_room() {
    // Three 16-CPU nodes; `run` takes 12 CPUs on two of them. `big` (2 × 16 CPUs) fits
    // only once one of those ends; after a second of waiting, room is kept for it.
    let workers = vec![WorkerSpec {
        name: "only",
        nodes: 3,
        cpu: 16,
    }];
    let fleet = Fleet::start(
        &workers,
        // Quota to spare: only room decides.
        queue(
            "research",
            &["only"],
            json!({"starvationAfter": "1s", "quota": {"cpu": "100", "memory": "100Gi"}}),
        ),
    )
    .await;
    let d = fleet.dispatcher(true);
    fleet.submit(job("run", "research", 2, 12));
    eventually(10, "run is dispatched", || {
        dispatched_to(&fleet, "run").is_some()
    })
    .await;
    fleet.submit(job("big", "research", 2, 16));
    let kept = "room is kept for it in worker only (nodes ";
    eventually(10, "room is kept for big", || {
        condition(&fleet.job("big"), "Admitted")
            .and_then(|c| c["message"].as_str())
            .is_some_and(|m| m.contains(kept))
    })
    .await;
    let message = condition(&fleet.job("big"), "Admitted").unwrap()["message"]
        .as_str()
        .unwrap()
        .to_string();
    let rest = &message[message.find(kept).unwrap() + kept.len()..];
    let mut room: Vec<&str> = rest[..rest.find(')').unwrap()].split(", ").collect();
    room.sort();
    assert_eq!(room.len(), 2, "{message}");

    // A small Job fits beside the room (4 CPUs are left where `run` is and the room is
    // not): its copy tells the worker's scheduler to keep its pods off the room's nodes.
    fleet.submit(job("small", "research", 1, 4));
    eventually(10, "small is dispatched", || {
        dispatched_to(&fleet, "small").is_some()
    })
    .await;
    d.settled().await;
    let copies = fleet.copies("small");
    assert_eq!(copies.len(), 1);
    let terms = &copies[0].1["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
        ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
    // One node a requirement: the API server takes one value for `In` and `NotIn` on a
    // node field.
    let fields: Vec<Value> = (room.iter())
        .map(|n| json!({"key": "metadata.name", "operator": "NotIn", "values": [n]}))
        .collect();
    assert_eq!(terms, &json!([{ "matchFields": fields }]), "{message}");
    // `run`'s copy was made before any room was kept: it is kept off no node (it only
    // prefers its own placement's).
    let run = fleet.copies("run");
    let affinity = &run[0].1["spec"]["template"]["spec"]["affinity"]["nodeAffinity"];
    assert!(affinity["requiredDuringSchedulingIgnoredDuringExecution"].is_null());
    assert!(affinity["preferredDuringSchedulingIgnoredDuringExecution"].is_array());
    assert_eq!(dispatched_to(&fleet, "big"), None);
}

/// Puts the Job's copy in east, unseen by the dispatcher, and has east answer no read of its
/// Jobs (lists and gets answered 500).
/// Waits until the dispatcher asked east for its copy of `train` and east answered `code`,
/// then until the dispatcher settled.
async fn east_asked_for_train(fleet: &Fleet, d: &Running, code: u16) {
    eventually(
        10,
        &format!("the dispatcher asked east for train's copy, answered {code}"),
        || {
            fleet.workers["east"].recorded().iter().any(|r| {
                r.method == "GET" && r.uri.contains("/jobs/train") && r.status == Some(code)
            })
        },
    )
    .await;
    d.settled().await;
}

fn copy_in_east_that_east_cannot_read(fleet: &Fleet, stored: &Value) {
    let copy =
        switchyard::dispatcher::remote::copy_of(stored, "switchyard", Default::default()).unwrap();
    fleet.workers["east"].upsert(JOBS, copy);
    fleet.workers["east"].refuse(Refusal {
        method: "GET",
        ..refusal(500, "InternalError", "etcdserver: request timed out")
    });
}

/// East (16 CPUs) and west (64 CPUs, the emptier: a Job given back goes there) in the queue
/// `research`.
async fn east_and_emptier_west() -> Fleet {
    let workers = east_west(16, 64);
    Fleet::start(&workers, queue("research", &["east", "west"], json!({}))).await
}

/// Found by tests/fault_schedules.rs (seed 5662): the lease went to a replica whose watch of
/// the worker had missed the copy the old leader had just created. The new leader took the
/// copy for deleted, and its check of the worker failed (500): the Job was requeued on that
/// guess and started a second copy elsewhere while the first ran. A worker that cannot say
/// whether the copy is there keeps the Job until it can. (A new leader now lists the copies
/// afresh; the leader here is one whose watch is behind, with a Job another writer claimed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_the_worker_cannot_confirm_is_not_taken_for_deleted() {
    let fleet = east_and_emptier_west().await;
    // The watch of east's copies lists, then hears nothing more.
    fleet.workers["east"].hang_watches(JOBS, true);
    let d = fleet.dispatcher(true);
    d.settled().await;
    // A Job running in east, its copy there unseen by the watch; and east answers no read of
    // its Jobs.
    let mut running = job("train", "research", 1, 4);
    running["metadata"]["annotations"] =
        json!({CLAIM: "east", "switchyard.dev/admitted-at": ago(60)});
    running["spec"]["suspend"] = json!(false);
    copy_in_east_that_east_cannot_read(&fleet, &running);
    fleet.submit(running);
    east_asked_for_train(&fleet, &d, 500).await;
    assert_eq!(
        annotation(&fleet.job("train"), CLAIM),
        Some("east"),
        "still claimed for east"
    );
    assert!(
        fleet.copies("train").iter().all(|(w, _)| w == "east"),
        "no second copy"
    );
    // East answers again: the copy is found and kept.
    fleet.workers["east"].clear_refusals();
    east_asked_for_train(&fleet, &d, 200).await;
    assert_eq!(annotation(&fleet.job("train"), CLAIM), Some("east"));
    let copies = fleet.copies("train");
    assert_eq!(copies.len(), 1, "{copies:?}");
    assert!(condition(&fleet.job("train"), "Requeued").is_none());
}

#[tokio::test]
async fn a_job_taken_back_from_a_worker_whose_copies_are_not_listed_is_not_started_elsewhere() {
    let fleet = east_and_emptier_west().await;
    // Taken back from east (its pods were not Ready in time), due to be tried again now; its
    // copy there is still running, and east answers but cannot list its Jobs (a new leader
    // whose watch of east lost its place, say).
    let mut requeued = job("train", "research", 1, 4);
    requeued["metadata"]["annotations"] = json!({
        "switchyard.dev/avoid-cluster": "east",
        "switchyard.dev/requeues": "1",
        "switchyard.dev/requeue-after": ago(5),
    });
    let stored = fleet.submit(requeued);
    copy_in_east_that_east_cannot_read(&fleet, &stored);
    let d = fleet.dispatcher(true);
    eventually(10, "east was asked for its Jobs", || {
        fleet.workers["east"]
            .recorded()
            .iter()
            .any(|r| r.method == "GET" && r.status == Some(500))
    })
    .await;
    d.settled().await;
    assert!(
        fleet.copies("train").iter().all(|(w, _)| w == "east"),
        "started in west while its copy may still run in east"
    );
    assert_eq!(annotation(&fleet.job("train"), CLAIM), None);
    // East lists again: the stale copy is removed, then the Job starts once, in west.
    fleet.workers["east"].clear_refusals();
    eventually(20, "the Job runs in west alone", || {
        let copies = fleet.copies("train");
        copies.len() == 1 && copies[0].0 == "west"
    })
    .await;
    assert_eq!(annotation(&fleet.job("train"), CLAIM), Some("west"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requeued_job_holds_its_quota_until_its_old_copy_is_deleted() {
    let workers = east_west(16, 16);
    let fleet = Fleet::start(
        &workers,
        queue(
            "research",
            &["east", "west"],
            json!({"quota": {"cpu": "8"},
                   "waitForPodsReady": {"enabled": true, "timeout": "1s",
                       "requeuing": {"backoffBase": "60s", "limit": 3}}}),
        ),
    )
    .await;
    // The workers cannot delete for now: the requeued Job's copy keeps running.
    for w in ["east", "west"] {
        fleet.workers[w].refuse(Refusal {
            method: "DELETE",
            ..refusal(503, "ServiceUnavailable", "try again later")
        });
    }
    let _d = fleet.dispatcher(true);
    fleet.submit(job("slow", "research", 1, 8));
    eventually(10, "requeued after the PodsReady timeout", || {
        let j = fleet.job("slow");
        annotation(&j, "switchyard.dev/requeues") == Some("1")
            && condition(&j, "Requeued").is_some_and(|c| c["reason"] == "PodsReadyTimeout")
    })
    .await;
    assert_eq!(fleet.copies("slow").len(), 1, "its copy still runs");
    fleet.submit(job("next", "research", 1, 8));
    // (Not `settled`: the refused deletion is retried all along.)
    eventually(10, "the next Job says it waits for quota", || {
        condition(&fleet.job("next"), "Admitted").is_some_and(|c| c["reason"] == "QuotaExceeded")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let next = fleet.job("next");
    assert!(
        annotation(&next, CLAIM).is_none(),
        "not admitted while the old copy's pods use the quota: {next}"
    );
    // The deletion lands: the quota is free, and the next Job takes it.
    for w in ["east", "west"] {
        fleet.workers[w].clear_refusals();
    }
    eventually(15, "the next Job runs once the old copy is gone", || {
        dispatched_to(&fleet, "next").is_some()
    })
    .await;
    assert!(fleet.copies("slow").is_empty());
}

/// Found by tests/fault_schedules.rs (seed 8388): the same for a Job offered to two workers
/// (`fanout: 2`): the check asked no worker at all, and the Job, taken for deleted in both,
/// was offered again while its copies ran, three copies at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offered_copy_the_worker_cannot_confirm_is_not_taken_for_deleted() {
    let workers = east_west(16, 64);
    let fleet = Fleet::start(
        &workers,
        queue(
            "research",
            &["east", "west"],
            json!({"placement": {"fanout": 2}}),
        ),
    )
    .await;
    fleet.workers["east"].hang_watches(JOBS, true);
    let d = fleet.dispatcher(true);
    d.settled().await;
    // Offered to both; its copy runs in east, unseen by the watch, and east answers no read.
    let mut offered = job("train", "research", 1, 4);
    offered["metadata"]["annotations"] = json!({
        "switchyard.dev/offered-to": "east,west",
        "switchyard.dev/admitted-at": ago(60),
    });
    offered["spec"]["suspend"] = json!(false);
    copy_in_east_that_east_cannot_read(&fleet, &offered);
    fleet.submit(offered);
    east_asked_for_train(&fleet, &d, 500).await;
    let j = fleet.job("train");
    assert_eq!(
        annotation(&j, "switchyard.dev/offered-to"),
        Some("east,west"),
        "still offered: {j}"
    );
    assert!(condition(&j, "Requeued").is_none(), "{j}");
    assert!(
        fleet.copies("train").iter().all(|(w, _)| w == "east"),
        "no other copy"
    );
    // East answers again: the copy is found and kept.
    fleet.workers["east"].clear_refusals();
    east_asked_for_train(&fleet, &d, 200).await;
    assert!(condition(&fleet.job("train"), "Requeued").is_none());
    assert_eq!(fleet.copies("train").len(), 1);
}

/// Found by tests/fault_schedules.rs (seed 5086): the lease passed to a replica whose watch of
/// a worker had not yet shown the copy of a Job the old leader had just taken back. That copy
/// still ran and held its queue's quota, but the new leader did not know of it and admitted
/// the next Job into the same quota. A new leader now lists the workers' copies afresh before
/// it admits anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_counts_the_copies_its_watch_had_not_shown() {
    let fleet = Fleet::start(
        &east_west(16, 64),
        queue(
            "research",
            &["east", "west"],
            json!({"quota": {"cpu": "8"}}),
        ),
    )
    .await;
    // The standby's watch of east's copies lists, then hears nothing more.
    fleet.workers["east"].hang_watches(JOBS, true);
    let d = fleet.dispatcher(false);
    d.settled().await;
    // The old leader took `slow` back from east (its copy there still running, its deletion
    // not landed yet), then lost the lease.
    let mut slow = job("slow", "research", 1, 8);
    slow["metadata"]["annotations"] = json!({
        "switchyard.dev/avoid-cluster": "east",
        "switchyard.dev/requeue-after": from_now(600),
    });
    let copy =
        switchyard::dispatcher::remote::copy_of(&slow, "switchyard", Default::default()).unwrap();
    fleet.workers["east"].upsert(JOBS, copy);
    fleet.submit(slow);
    fleet.submit(job("next", "research", 1, 8));
    d.settled().await;
    // East cannot delete for now: the copy keeps running.
    fleet.workers["east"].refuse(Refusal {
        method: "DELETE",
        ..refusal(503, "ServiceUnavailable", "try again later")
    });
    d.leader.send(true).unwrap();
    // (Not `settled`: the refused deletion is retried all along.)
    eventually(10, "the next Job says it waits for quota", || {
        condition(&fleet.job("next"), "Admitted").is_some_and(|c| c["reason"] == "QuotaExceeded")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        annotation(&fleet.job("next"), CLAIM).is_none(),
        "not admitted while slow's copy runs in east: {}",
        fleet.job("next")
    );
}
