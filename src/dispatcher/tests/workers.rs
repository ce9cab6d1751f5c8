//! Workers lost and back, workers that refuse a Job, and Jobs kept from a worker for a reason of their own.

use super::support::*;
use crate::dispatcher::*;
use crate::inventory::Inventory;
use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::sync::Arc;

// ---------------------------------------------------------------------------------------------
// 5. Lost workers.

fn lost_worker_env() -> Env {
    // limit 0: a PodsReady timeout would deactivate at once; losing the worker must not.
    let mut env = Env::new(
        roomy(),
        vec![queue(
            "q",
            "clusters: [a]\nworkerLostTimeout: 10m\nwaitForPodsReady:\n  enabled: true\n  timeout: 5m\n  requeuing: {limit: 0}",
        )],
    );
    env.submit(job("run").pods(2).build());
    env.settle();
    env.advance(secs(30));
    env.set_ready("run", 2);
    env.settle();
    assert!(is_true(env.job("run"), condition::PODS_READY));
    env
}

#[test]
fn a_short_disconnect_keeps_the_job_where_it_runs() {
    let mut env = lost_worker_env();
    let copy = env.remote_copy("run", "a").expect("copy").uid.clone();
    env.disconnect("a");
    env.advance(mins(9));
    let acts = env.settle();
    assert!(requeues(&acts).is_empty(), "{acts:#?}");
    env.reconnect("a");
    env.advance(mins(5));
    let acts = env.settle();
    assert!(requeues(&acts).is_empty(), "{acts:#?}");
    assert!(deletions(&acts).is_empty(), "{acts:#?}");
    assert_eq!(env.job("run").cluster.as_deref(), Some("a"));
    assert_eq!(
        env.remote_copy("run", "a").map(|c| c.uid.clone()),
        Some(copy)
    );
}

#[test]
fn a_worker_lost_too_long_gives_its_job_back_uncounted_and_its_stale_copy_goes_first() {
    let mut env = lost_worker_env();
    let old = env.remote_copy("run", "a").expect("copy").uid.clone();
    let lost_at = env.now;
    env.disconnect("a");
    // Left alone, the dispatcher wakes itself at workerLostTimeout and takes the Job back.
    env.idle_until(lost_at + mins(10));
    let is_requeue: fn(&Action) -> bool = |a| matches!(a, Action::Requeue { .. });
    assert_eq!(env.times_of("run", is_requeue), [lost_at + mins(10)]);
    let acts: Vec<Action> = env
        .done
        .iter()
        .filter(|(t, _)| *t == lost_at + mins(10))
        .map(|(_, a)| a.clone())
        .collect();
    assert_eq!(requeues(&acts), [("run".into(), reason::WORKER_LOST)]);
    // The worker cannot be asked to delete anything now.
    assert!(deletions(&acts).is_empty(), "{acts:#?}");
    let j = env.job("run");
    assert!(j.suspended && j.cluster.is_none());
    assert!(
        j.deactivated.is_none(),
        "not counted against the limit of 0"
    );
    assert_eq!(j.requeues, 0);
    assert_eq!(annotation(j, REQUEUES_ANNOTATION), None);
    assert_eq!(j.requeue_after, None, "no back-off");
    assert_eq!(
        cond(j, condition::REQUEUED),
        Some(("True".into(), reason::WORKER_LOST.into()))
    );
    assert!(env.admitted_usage("q").is_empty());

    // The worker comes back with the old copy still running.
    env.advance(mins(2));
    env.reconnect("a");
    let p = env.plan();
    assert_eq!(
        deletions(&p.actions),
        [("run".into(), "a".into(), reason::STALE_COPY)]
    );
    assert!(dispatches(&p.actions).is_empty(), "{:#?}", p.actions);
    // The deletion fails once: still nothing new goes there.
    for a in &p.actions {
        let ok = !matches!(a, Action::DeleteCopy { .. });
        env.execute(a, ok);
    }
    let p = env.plan();
    assert!(dispatches(&p.actions).is_empty(), "{:#?}", p.actions);
    assert_eq!(deletions(&p.actions).len(), 1, "the deletion is retried");
    for a in &p.actions {
        env.execute(a, true);
    }
    // Gone: the Job is dispatched there again, as a new copy.
    let acts = env.settle();
    assert_eq!(dispatches(&acts), [("run".into(), "a".into())]);
    let new = env.remote_copy("run", "a").expect("new copy").uid.clone();
    assert_ne!(new, old);
}

#[test]
fn jobs_that_waited_for_a_worker_kept_by_a_stale_copy_go_there_once_it_is_removed() {
    let mut env = lost_worker_env();
    env.disconnect("a");
    env.advance(mins(10));
    env.settle();
    // Another Job (another class) arrives while the worker is away.
    env.submit(job("next").each(2, 0).build());
    env.settle();
    env.advance(mins(2));
    env.reconnect("a");
    // The stale copy goes first; its deletion fails once, so a whole pass sees the worker
    // kept and remembers why "next" waits.
    let p = env.plan();
    assert!(dispatches(&p.actions).is_empty(), "{:#?}", p.actions);
    for a in &p.actions {
        env.execute(a, !matches!(a, Action::DeleteCopy { .. }));
    }
    let p = env.plan();
    assert!(dispatches(&p.actions).is_empty(), "{:#?}", p.actions);
    for a in &p.actions {
        env.execute(a, true);
    }
    // Gone: nothing else changed, and both Jobs go there.
    let mut went = dispatches(&env.settle());
    went.sort();
    assert_eq!(
        went,
        [("next".into(), "a".into()), ("run".into(), "a".into())]
    );
}

#[test]
fn a_job_lost_with_its_worker_runs_elsewhere_and_the_duplicate_is_removed_on_return() {
    let inv = two_workers(16);
    let mut env = Env::new(
        inv,
        vec![queue("q", "clusters: [a, b]\nworkerLostTimeout: 10m")],
    );
    env.submit(job("run").build());
    let first = dispatches(&env.settle())[0].1.clone();
    let other = if first == "a" { "b" } else { "a" };
    env.disconnect(&first);
    env.advance(mins(10));
    let acts = env.settle();
    assert_eq!(requeues(&acts), [("run".into(), reason::WORKER_LOST)]);
    assert_eq!(dispatches(&acts), [("run".into(), other.to_string())]);
    env.reconnect(&first);
    let acts = env.settle();
    assert_eq!(
        deletions(&acts),
        [("run".into(), first.clone(), reason::STALE_COPY)]
    );
    assert!(env.remote_copy("run", &first).is_none());
    assert_eq!(env.where_("run"), other);
    assert_eq!(env.job("run").cluster.as_deref(), Some(other));
}

#[test]
fn a_job_taken_back_does_not_start_elsewhere_while_its_old_copy_still_runs() {
    // The user suspends a running Job; its worker refuses the deletion for a while (its API
    // server errs, the connection stays up). Another worker has room, but the Job must not
    // start there while its first copy still runs.
    let inv = two_workers(16);
    let mut env = Env::new(inv, vec![queue("q", "clusters: [a, b]")]);
    env.submit(job("run").build());
    let first = dispatches(&env.settle())[0].1.clone();
    env.advance(secs(30));
    env.user_suspends("run");
    env.refusing.insert(first.clone());
    for round in 0..3 {
        env.step();
        env.step();
        assert!(
            env.duplicates.is_empty(),
            "round {round}: {:?}",
            env.duplicates
        );
        assert_eq!(env.where_("run"), first);
        assert!(env.job("run").cluster.is_none());
        env.advance(secs(5));
    }
    // The deletion goes through: the Job runs again.
    env.refusing.clear();
    let acts = env.settle();
    assert_eq!(dispatches(&acts).len(), 1, "{acts:#?}");
    assert!(env.duplicates.is_empty(), "{:?}", env.duplicates);
}

// ---------------------------------------------------------------------------------------------
// 9. Workers that refuse a Job, per-Job blockers, and the order of a requeue's writes.

/// A big worker `a` (64 CPUs) and a small one `b` (16).
fn big_and_small() -> Inventory {
    InventoryBuilder::default()
        .cluster("a")
        .node("a-0", 64, 0)
        .cluster("b")
        .node("b-0", 16, 0)
        .build()
}

/// The worker refused the copy: what the live executor records when it gives the claim back.
fn refuse(env: &mut Env, name: &str, cluster: &str) {
    let j = env.job(name).clone();
    let n = j.refusals.get(cluster).map_or(1, |r| r.count + 1);
    let retry_at = env.now + env.world.config.refusal_backoff(n);
    let a = Action::Unclaim {
        job: j.key.clone(),
        cluster: cluster.into(),
        reason: reason::WORKER_REFUSED,
        message: "admission webhook \"x\" denied the request: no".into(),
        retry_at,
    };
    env.execute(&a, true);
}

#[test]
fn refusals_back_off_exponentially_per_worker() {
    let c = DispatchConfig::default();
    let waits: Vec<u64> = (1..=8).map(|n| c.refusal_backoff(n).as_secs()).collect();
    assert_eq!(waits, [5, 10, 20, 40, 80, 160, 300, 300]);
    assert_eq!(c.refusal_backoff(u32::MAX), c.refusal_backoff_max);
}

#[test]
fn a_worker_that_refused_a_job_is_left_alone_for_its_backoff_while_others_take_it() {
    let mut env = Env::new(big_and_small(), vec![queue("q", "clusters: [a, b]")]);
    env.submit(job("run").build());
    // `a` is the emptier worker: the first choice. It refuses the copy.
    let p = env.plan();
    assert_eq!(dispatches(&p.actions), [("run".into(), "a".into())]);
    refuse(&mut env, "run", "a");
    let j = env.job("run");
    assert_eq!(j.refusals["a"].count, 1);
    assert_eq!(j.requeues, 0, "a refusal is not the Job's fault");
    assert!(annotation(j, REFUSED_ANNOTATION).is_some_and(|v| v.contains("denied the request")));
    // Tried elsewhere at once.
    let acts = env.settle();
    assert_eq!(dispatches(&acts), [("run".into(), "b".into())]);
    assert!(env.refused.is_empty(), "{:?}", env.refused);
}

#[test]
fn a_job_refused_by_its_only_worker_waits_out_the_backoff_then_tries_again() {
    let mut env = Env::new(roomy(), vec![queue("q", "clusters: [a]")]);
    env.submit(job("run").build());
    let p = env.plan();
    assert_eq!(dispatches(&p.actions), [("run".into(), "a".into())]);
    let mut attempts = vec![env.now];
    let mut backoffs = Vec::new();
    for n in 1..=3 {
        refuse(&mut env, "run", "a");
        let retry_at = env.job("run").refusals["a"].retry_at;
        backoffs.push(retry_at.duration_since(env.now).unwrap().as_secs());
        // Nothing is dispatched before the back-off ends; the Job says why, and when.
        let p = env.plan();
        assert!(
            dispatches(&p.actions).is_empty(),
            "refusal {n}: {:?}",
            p.actions
        );
        let WaitReason {
            reason: why,
            message,
        } = &p.job_waiting[&JobKey::new("team", "run")];
        assert_eq!(*why, reason::WORKER_REFUSED);
        assert!(
            message.contains("denied the request") && message.contains(&rfc3339(retry_at)),
            "{message}"
        );
        assert_eq!(p.wake_at, Some(retry_at), "woken when the back-off ends");
        env.advance_to(retry_at);
        let p = env.plan();
        assert_eq!(
            dispatches(&p.actions),
            [("run".into(), "a".into())],
            "refusal {n}"
        );
        attempts.push(env.now);
    }
    assert_eq!(backoffs, [5, 10, 20]);
    assert_eq!(env.job("run").requeues, 0);
    // It takes the copy this time: the refusals there are forgotten.
    let acts = env.settle();
    assert_eq!(dispatches(&acts), [("run".into(), "a".into())]);
    assert!(env.job("run").refusals.is_empty());
    assert!(env.refused.is_empty(), "{:?}", env.refused);
}

#[test]
fn a_job_kept_from_a_worker_for_its_own_reason_does_not_hold_back_its_class() {
    // An earlier Job named `first` is still being removed from the only worker: `first` must
    // wait, but `second` (same queue, namespace and template: the same class) must not.
    let mut env = Env::new(roomy(), vec![queue("q", "clusters: [a]")]);
    let earlier = job("first").uid("uid-of-an-earlier-first").build();
    let old = copy_of(&earlier, "a", "old-copy").deleting();
    env.remote
        .get_mut("a")
        .unwrap()
        .insert(old.origin_uid.clone(), old.clone());
    env.world.upsert_copy(old);
    env.submit(job("first").created(t0()).build());
    env.submit(job("second").created(t0() + secs(1)).build());
    let p = env.plan();
    assert_eq!(dispatches(&p.actions), [("second".into(), "a".into())]);
    let message = &p.job_waiting[&JobKey::new("team", "first")].message;
    assert!(message.contains("still being removed"), "{message}");
    // And again once nothing changed (nothing remembered for the class from `first`).
    env.submit(job("third").created(t0() + secs(2)).build());
    let p = env.plan();
    let d = dispatches(&p.actions);
    assert!(d.contains(&("third".into(), "a".into())), "{d:?}");
    assert!(!d.iter().any(|(n, _)| n == "first"));
}

#[test]
fn a_pods_ready_timeout_writes_the_requeue_before_removing_the_copy() {
    let mut env = Env::new(
        roomy(),
        vec![queue(
            "q",
            "clusters: [a]\nwaitForPodsReady:\n  enabled: true\n  timeout: 1m\n  requeuing: {backoffBase: 30s, limit: 3}",
        )],
    );
    env.submit(job("slow").pods(2).build());
    env.settle();
    env.advance(mins(2));
    // The decision: the requeue, and no removal yet.
    let p = env.plan();
    assert_eq!(
        requeues(&p.actions),
        [("slow".into(), reason::PODS_READY_TIMEOUT)]
    );
    assert!(deletions(&p.actions).is_empty(), "{:#?}", p.actions);
    // The requeue write fails (a 500, a 409): nothing was removed, and the next plan decides
    // the same, counted once.
    for a in &p.actions {
        env.execute(a, !matches!(a, Action::Requeue { .. }));
    }
    assert!(env.remote_copy("slow", "a").is_some());
    let p = env.plan();
    let counted: Vec<u32> = p
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::Requeue { requeues, .. } => Some(*requeues),
            _ => None,
        })
        .collect();
    assert_eq!(counted, [1], "{:#?}", p.actions);
    assert!(!requeues(&p.actions)
        .iter()
        .any(|(_, r)| *r == reason::REMOTE_DELETED));
    for a in &p.actions {
        env.execute(a, true);
    }
    // Landed: the count and back-off are on the Job. The process dies before the copy is
    // removed; the next one removes it and keeps the count.
    let j = env.job("slow");
    assert_eq!((j.requeues, j.requeue_after), (1, Some(env.now + secs(30))));
    assert!(env.remote_copy("slow", "a").is_some());
    env.restart();
    let p = env.plan();
    assert_eq!(
        deletions(&p.actions),
        [("slow".into(), "a".into(), reason::PODS_READY_TIMEOUT)]
    );
    assert!(requeues(&p.actions).is_empty(), "{:#?}", p.actions);
    for a in &p.actions {
        env.execute(a, true);
    }
    assert!(env.remote_copy("slow", "a").is_none());
    assert_eq!(env.job("slow").requeues, 1);
    // Back after its back-off, once.
    env.advance(secs(30));
    let acts = env.settle();
    assert_eq!(dispatches(&acts), [("slow".into(), "a".into())]);
    assert_eq!(env.job("slow").requeues, 1);
    assert!(env.refused.is_empty(), "{:?}", env.refused);
}

/// The copy's Job controller decided the Job fails (FailureTarget) and has not finished it.
fn failing(copy: &mut WorkerCopy, at: Time) {
    copy.status.job_mut().conditions = Some(vec![JobCondition {
        type_: "FailureTarget".into(),
        status: "True".into(),
        reason: Some("PodFailurePolicy".into()),
        message: Some("Container main for pod team/x failed with exit code 42".into()),
        last_probe_time: Some(at.clone()),
        last_transition_time: Some(at),
    }]);
    copy.status.job_mut().failed = Some(1);
}

#[test]
fn a_job_whose_worker_decided_it_fails_ends_failed_when_its_copy_goes() {
    for lost in [false, true] {
        let mut env = Env::new(
            roomy(),
            vec![queue("q", "clusters: [a]\nworkerLostTimeout: 5m")],
        );
        env.submit(job("doomed").build());
        env.settle();
        env.advance(secs(10));
        let at = Time(mirror::to_timestamp(env.now));
        env.change_copy("doomed", "a", |c| failing(c, at));
        env.settle();
        assert!(is_true(env.job("doomed"), "FailureTarget"), "mirrored");
        if lost {
            env.disconnect("a");
            env.advance(mins(6));
        } else {
            env.delete_in_worker("doomed");
        }
        let acts = env.settle();
        assert!(
            env.refused.is_empty(),
            "lost {lost}: every write passes the API server: {:?}",
            env.refused
        );
        assert!(requeues(&acts).is_empty(), "lost {lost}: {acts:#?}");
        let j = env.job("doomed");
        assert_eq!(j.result, Some(JobResult::Failed), "lost {lost}");
        assert!(
            is_true(j, "Failed") && is_true(j, "FailureTarget"),
            "lost {lost}"
        );
        assert!(j.status.job().start_time.is_some());
        assert!(!j.holds_quota());
        if lost {
            // The worker comes back: its copy goes.
            env.reconnect("a");
            env.settle();
            assert!(env.remote_copy("doomed", "a").is_none());
        }
    }
}

#[test]
fn the_api_servers_rules_on_target_conditions_are_modelled() {
    let at = Time(mirror::to_timestamp(t0()));
    let c = |t: &str| JobCondition {
        type_: t.into(),
        status: "True".into(),
        reason: None,
        message: None,
        last_probe_time: None,
        last_transition_time: Some(at.clone()),
    };
    let with = |types: &[&str]| JobStatus {
        start_time: Some(at.clone()),
        conditions: Some(types.iter().map(|t| c(t)).collect()),
        ..Default::default()
    };
    let v = |old: &JobStatus, new: &JobStatus| mirror::violation(old, new, true);
    assert!(v(&with(&["FailureTarget"]), &with(&[]))
        .is_some_and(|m| m.contains("cannot disable the terminal FailureTarget=True")));
    assert!(v(&with(&["SuccessCriteriaMet"]), &with(&[]))
        .is_some_and(|m| m.contains("cannot disable the SuccessCriteriaMet=True")));
    assert!(v(&with(&[]), &with(&["SuccessCriteriaMet", "FailureTarget"])).is_some());
    let mut complete = with(&["SuccessCriteriaMet", "Complete", "FailureTarget"]);
    complete.completion_time = Some(at.clone());
    assert!(v(&with(&["FailureTarget"]), &complete)
        .is_some_and(|m| m.contains("Complete=True and FailureTarget")));
    // The requeue of a Job with a target condition keeps it: the write stays valid.
    let old = with(&["FailureTarget"]);
    let requeued = status::requeued(&old.clone().into(), reason::WORKER_LOST, "m", t0());
    assert_eq!(v(&old, requeued.job()), None);
    // Unsetting completionTime is not "mutating" it (the API server allows it).
    let mut set = with(&[]);
    set.completion_time = Some(at.clone());
    assert!(v(&set, &with(&[])).is_none());
}

#[test]
fn a_short_disconnect_keeps_the_workers_share_of_the_automatic_quota() {
    let inv = InventoryBuilder::default()
        .cluster("a")
        .node("a-0", 16, 0)
        .cluster("b")
        .node("b-0", 8, 0)
        .build();
    let mut env = Env::new(
        inv,
        vec![queue("q", "clusters: [a, b]\nworkerLostTimeout: 10m")],
    );
    let settings = env.world.state.queues["q"].settings.clone().unwrap();
    let cpu = |env: &Env| effective_quota(&env.world.state, &settings, env.now)["cpu"];
    assert_eq!(cpu(&env), 24_000);
    env.disconnect("a");
    env.advance(mins(9));
    assert_eq!(cpu(&env), 24_000, "a short disconnect changes nothing");
    // A Job only `a` can hold waits for it: not "never fits".
    env.submit(job("wide").each(12, 0).created(env.now).build());
    let p = env.plan();
    assert!(dispatches(&p.actions).is_empty());
    let why = &p.waiting.values().next().expect("it waits").reason;
    assert_eq!(*why, reason::NO_WORKER_FITS);
    // Lost: its share goes.
    env.advance(mins(1));
    assert_eq!(cpu(&env), 8_000);
    env.reconnect("a");
    assert_eq!(cpu(&env), 24_000);
    let acts = env.settle();
    assert_eq!(dispatches(&acts), [("wide".into(), "a".into())]);
}

#[test]
fn workers_judged_across_the_cores_get_the_same_placements_as_one_by_one() {
    // Four workers of 3,000 nodes each: enough nodes for a Job's first look at them to be
    // spread over the cores. Without memory the same workers are judged one after another.
    let mut b = InventoryBuilder::default();
    for (c, cpus) in [("a", 4), ("b", 16), ("c", 8), ("d", 32)] {
        b = b.cluster(c).node(&format!("{c}-0"), cpus, 0);
    }
    let mut inv = b.build();
    for c in &mut inv.clusters {
        let c = Arc::make_mut(c);
        let proto = (*c.nodes[0]).clone();
        let name = c.name.clone();
        c.nodes = (0..3000)
            .map(|i| {
                let mut n = proto.clone();
                n.name = format!("{name}-{i}").into();
                Arc::new(n)
            })
            .collect();
    }
    let inv = inv.finish();
    let placements = |remember: bool| {
        let mut env = Env::new(
            inv.clone(),
            vec![queue("q", "clusters: [a, b, c, d]\nplacement: {fanout: 1}")],
        );
        env.world.config.remember = remember;
        // 12 CPUs a pod: only b and d; 24 CPUs a pod: only d; 2 CPUs: anywhere.
        env.submit(job("wide").pods(8).each(12, 0).created(t0()).build());
        env.submit(
            job("big")
                .pods(3)
                .each(24, 0)
                .created(t0() + secs(1))
                .build(),
        );
        env.submit(
            job("small")
                .pods(5)
                .each(2, 0)
                .created(t0() + secs(2))
                .build(),
        );
        env.submit(
            job("huge")
                .pods(1)
                .each(64, 0)
                .created(t0() + secs(3))
                .build(),
        );
        let p = env.plan();
        p.actions
            .iter()
            .filter_map(|a| match a {
                Action::Dispatch { job, cluster, hold } => {
                    Some((job.name.clone(), cluster.clone(), hold.takes.len()))
                }
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    let parallel = placements(true);
    assert_eq!(parallel, placements(false));
    let workers: Vec<(&str, &str)> = parallel
        .iter()
        .map(|(j, c, _)| (j.as_str(), c.as_str()))
        .collect();
    assert_eq!(workers.len(), 3, "huge fits nowhere: {parallel:?}");
    assert!(matches!(workers[0], ("wide", "b" | "d")), "{parallel:?}");
    assert_eq!(workers[1], ("big", "d"));
    assert_eq!(workers[2].0, "small");
}

#[test]
fn a_queue_admits_nothing_until_the_copies_of_its_answering_workers_are_listed() {
    let two = two_workers(64);
    let mut env = Env::new(two, vec![queue("q", "clusters: [a, b]")]);
    // Worker b answers again, its copies not listed yet (a new leader's first list, or a
    // relist after its watch lost its place): a copy of a Job taken back may run there.
    let mut b = env.world.state.workers["b"].clone();
    b.copies_unlisted_since = Some(env.now);
    env.world.upsert_worker(b.clone());
    env.submit(job("train").build());
    let p = env.plan();
    assert!(dispatches(&p.actions).is_empty(), "{:#?}", p.actions);
    let WaitReason {
        reason: why,
        message,
        ..
    } = p.waiting.values().next().expect("the Job's class waits");
    assert_eq!(*why, reason::QUOTA_NOT_COUNTED);
    assert!(message.contains("worker b"), "{message}");
    // Listed: admitted at once, into either worker.
    b.copies_unlisted_since = None;
    env.world.upsert_worker(b.clone());
    env.advance(secs(1));
    let acts = env.settle();
    assert_eq!(dispatches(&acts).len(), 1, "{acts:#?}");

    // A worker whose copies cannot be listed at all holds its queues back for
    // `unlisted_grace` only; the dispatcher wakes itself then.
    b.copies_unlisted_since = Some(env.now);
    env.world.upsert_worker(b);
    env.submit(job("later").created(env.now).build());
    let from = env.now;
    env.settle();
    assert_eq!(env.job("later").cluster, None);
    let grace = env.world.config.unlisted_grace;
    env.idle_until(from + grace);
    assert_eq!(
        env.job("later").cluster.as_deref(),
        Some("a"),
        "worker b's copies are unknown: only a takes it"
    );
}
