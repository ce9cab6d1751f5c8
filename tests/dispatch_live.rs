//! The live dispatcher between a manager and worker clusters (fake API servers on loopback,
//! shaped after real kube-apiserver 1.36 exchanges), through the real `kube::Client`: the
//! MultiKueue job flow of seed 000 and what goes wrong around it.

mod common;

use common::dispatch::*;
use common::fake_api::{Refusal, EVENTS, JOBS};
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

fn dispatched_to(fleet: &Fleet, name: &str) -> Option<String> {
    let j = fleet.job(name);
    let claimed = annotation(&j, CLAIM)?.to_string();
    (j["spec"]["suspend"] == false).then_some(claimed)
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
    tokio::time::sleep(Duration::from_millis(800)).await;
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
    let _a = fleet.dispatcher(true);
    let _b = fleet.dispatcher(true);
    eventually(20, "every Job is dispatched", || {
        (0..24).all(|i| dispatched_to(&fleet, &format!("job-{i}")).is_some())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
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
    // Both claimed: the claim that came second carried a stale resourceVersion and lost.
    let recorded = fleet.manager.recorded();
    let conflicts: Vec<_> = recorded
        .iter()
        .filter(|r| r.method == "PATCH" && r.status == Some(409))
        .collect();
    assert!(
        !conflicts.is_empty(),
        "the two dispatchers raced for the same Jobs: some claim got 409 Conflict"
    );
    for r in &conflicts {
        let body = r.body.clone().unwrap_or(Value::Null);
        assert!(
            body["metadata"]["resourceVersion"].is_string()
                && body["metadata"]["annotations"][CLAIM].is_string(),
            "only a claim (with its resourceVersion precondition) can conflict: {body}"
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
    let _d = fleet.dispatcher(true);
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
    tokio::time::sleep(Duration::from_millis(500)).await;
    let running: Vec<String> = (0..5)
        .map(|i| format!("q-{i}"))
        .filter(|n| dispatched_to(&fleet, n).is_some())
        .collect();
    assert_eq!(running.len(), 2, "never more than the quota: {running:?}");
    assert_eq!(running, vec!["q-0", "q-1"], "oldest first (then by name)");
    let queue_status = fleet
        .manager
        .get(common::fake_api::DISPATCH_QUEUES, "", "research")
        .unwrap()["status"]
        .clone();
    assert_eq!(queue_status["admitted"], 2, "{queue_status}");
    assert_eq!(queue_status["pending"], 3, "{queue_status}");

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
    assert!(dispatched_to(&fleet, "q-3").is_none());
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
    let workers = vec![
        WorkerSpec {
            name: "east",
            nodes: 1,
            cpu: 16,
        },
        WorkerSpec {
            name: "west",
            nodes: 1,
            cpu: 8,
        },
    ];
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
    fleet.submit(job("train", "research", 1, 4));
    eventually(10, "dispatched to east", || {
        dispatched_to(&fleet, "train").as_deref() == Some("east")
    })
    .await;
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
    let copy = switchyard::dispatcher::remote::copy_of(&stored, "switchyard", None).unwrap();
    fleet.workers["only"].upsert(JOBS, copy);
    fleet.submit(job("fresh", "research", 1, 4));
    let d = fleet.dispatcher(false);
    tokio::time::sleep(Duration::from_millis(400)).await;
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
    let workers = vec![
        WorkerSpec {
            name: "east",
            nodes: 1,
            cpu: 64,
        },
        WorkerSpec {
            name: "west",
            nodes: 1,
            cpu: 16,
        },
    ];
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
