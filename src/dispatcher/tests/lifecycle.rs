//! A dispatched Job's life: PodsReady timeouts and back-off, its copy's fate in the worker, a user who suspends it.

use super::support::*;
use crate::dispatcher::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::time::Duration;

// ---------------------------------------------------------------------------------------------
// 4. PodsReady timeout, back-off, deactivation.

#[test]
fn pods_never_ready_requeue_with_exponential_backoff_then_deactivate_at_the_limit() {
    let mut env = Env::new(
        roomy(),
        vec![queue(
            "q",
            "clusters: [a]\nwaitForPodsReady:\n  enabled: true\n  timeout: 5m\n  requeuing: {backoffBase: 60s, backoffMax: 150s, limit: 3}",
        )],
    );
    env.submit(job("slow").pods(2).build());
    let timeout = mins(5);
    // base × 2^(n−1), capped at 150s.
    let backoffs = [secs(60), secs(120), secs(150)];
    let is_requeue: fn(&Action) -> bool = |a| matches!(a, Action::Requeue { .. });
    let is_dispatch: fn(&Action) -> bool = |a| matches!(a, Action::Dispatch { .. });
    let is_deactivate: fn(&Action) -> bool = |a| matches!(a, Action::Deactivate { .. });

    env.settle();
    let mut admitted = env.now;
    let mut dispatched = vec![admitted];
    let mut requeued = Vec::new();
    for (n, backoff) in backoffs.iter().enumerate() {
        let n = n as u32 + 1;
        assert_eq!(env.job("slow").admitted_at, Some(admitted));
        // One pod of two gets Ready; never both.
        env.advance(secs(20));
        env.set_ready("slow", 1);

        // Left alone, the dispatcher wakes itself at the deadline and requeues then, not
        // before.
        let deadline = admitted + timeout;
        env.idle_until(deadline);
        requeued.push(deadline);
        assert_eq!(env.times_of("slow", is_requeue), requeued, "attempt {n}");
        let j = env.job("slow");
        assert!(j.suspended && j.cluster.is_none());
        assert!(env.remote_copy("slow", "a").is_none(), "copy removed");
        assert_eq!(j.requeues, n);
        assert_eq!(annotation(j, REQUEUES_ANNOTATION), Some(n.to_string()));
        let next = deadline + *backoff;
        assert_eq!(j.requeue_after, Some(next), "attempt {n}");
        assert_eq!(annotation(j, REQUEUE_AFTER_ANNOTATION), Some(rfc3339(next)));
        assert_eq!(
            cond(j, condition::REQUEUED),
            Some(("True".into(), reason::PODS_READY_TIMEOUT.into()))
        );
        assert_eq!(
            cond(j, condition::ADMITTED),
            Some(("False".into(), reason::PODS_READY_TIMEOUT.into()))
        );
        assert_eq!(
            cond(j, condition::PODS_READY),
            None,
            "no pods, no PodsReady"
        );
        assert!(
            env.admitted_usage("q").is_empty(),
            "its quota is given back"
        );
        let delete = env
            .done
            .iter()
            .find(|(t, a)| *t == deadline && matches!(a, Action::DeleteCopy { .. }));
        assert!(
            matches!(delete, Some((_, Action::DeleteCopy { reason: r, .. })) if *r == reason::PODS_READY_TIMEOUT),
            "{delete:?}"
        );

        // Admitted again when the back-off ends, not before.
        env.idle_until(next);
        dispatched.push(next);
        assert_eq!(env.times_of("slow", is_dispatch), dispatched, "attempt {n}");
        admitted = next;
    }

    // The fourth timeout is one too many: given up.
    let deadline = admitted + timeout;
    env.idle_until(deadline + Duration::from_secs(24 * 3600));
    assert_eq!(env.times_of("slow", is_requeue), requeued);
    assert_eq!(env.times_of("slow", is_deactivate), [deadline]);
    assert_eq!(
        env.times_of("slow", is_dispatch),
        dispatched,
        "a deactivated Job stays"
    );
    let j = env.job("slow");
    assert!(j.suspended && j.cluster.is_none());
    assert_eq!(j.requeues, 3);
    assert!(j.deactivated.is_some());
    assert!(annotation(j, DEACTIVATED_ANNOTATION).is_some());
    assert_eq!(
        cond(j, condition::DEACTIVATED),
        Some(("True".into(), reason::REQUEUING_LIMIT.into()))
    );
    assert!(env.remote_copy("slow", "a").is_none());
    assert!(env.admitted_usage("q").is_empty());
    assert!(env.refused.is_empty(), "{:?}", env.refused);
}

/// The answer to a copy's removal comes late: after the Job, requeued, was dispatched to the
/// same worker again and its new copy seen. Only the removed copy is forgotten; the new one is
/// still known, and goes when the Job is given up. (A fault schedule once forgot it: the new
/// copy ran on in its worker after the Job was deactivated.)
#[test]
fn a_late_answer_to_a_copys_removal_forgets_only_that_copy() {
    let mut env = Env::new(
        roomy(),
        vec![queue(
            "q",
            "clusters: [a]\nwaitForPodsReady:\n  enabled: true\n  timeout: 5m\n  requeuing: {backoffBase: 60s, limit: 1}",
        )],
    );
    env.submit(job("slow").build());
    env.settle();
    let uid = env.job("slow").uid.clone();
    let first = env
        .remote_copy("slow", "a")
        .expect("dispatched")
        .uid
        .clone();

    // Not Ready in time: requeued. The first copy's removal lands in the worker and its watch
    // tells, but the answer to the DELETE is late.
    env.advance(mins(5));
    let mut late = None;
    for _ in 0..5 {
        for a in env.plan().actions {
            match a {
                Action::DeleteCopy { .. } => late = Some(a),
                other => env.execute(&other, true),
            }
        }
        if late.is_some() {
            break;
        }
    }
    let late = late.expect("the first copy's removal");
    env.remote.get_mut("a").expect("worker").remove(&uid);
    env.world.forget_copy("a", &uid, &first);

    // Dispatched to the same worker after its back-off: a second copy.
    env.advance(secs(60));
    env.settle();
    let second = env
        .remote_copy("slow", "a")
        .expect("dispatched again")
        .uid
        .clone();
    assert_ne!(first, second);
    apply(&mut env.world, &late, Outcome::Done, env.now);
    assert_eq!(
        env.world.state.copy_in(&uid, "a").map(|c| c.uid.clone()),
        Some(second),
        "the second copy is still known"
    );

    // Not Ready in time again: given up, and the second copy goes too.
    env.advance(mins(5));
    env.settle();
    assert!(env.job("slow").deactivated.is_some());
    assert!(
        env.remote_copy("slow", "a").is_none(),
        "the second copy runs on in the worker of a Job given up"
    );
}

#[test]
fn an_offered_job_that_times_out_tries_other_workers_next() {
    // Offered to two of three equal workers; one copy is deleted there, the other never
    // gets Ready. The next attempt goes elsewhere.
    let inv = InventoryBuilder::default()
        .cluster("a")
        .node("a-0", 16, 0)
        .cluster("b")
        .node("b-0", 16, 0)
        .cluster("c")
        .node("c-0", 16, 0)
        .build();
    let mut env = Env::new(
        inv,
        vec![queue(
            "q",
            "clusters: [a, b, c]\nplacement: {fanout: 2}\nwaitForPodsReady:\n  enabled: true\n  timeout: 5m\n  requeuing: {backoffBase: 10s}",
        )],
    );
    env.submit(job("wide").build());
    env.settle();
    let offered = env.job("wide").offers.clone();
    assert_eq!(offered.len(), 2, "{:?}", env.job("wide"));
    let (kept, lost) = (offered[0].clone(), offered[1].clone());
    let uid = env.job("wide").uid.clone();
    env.remote.get_mut(&lost).expect("worker").remove(&uid);
    env.world.remove_copy(&lost, &uid);
    env.settle();
    assert_eq!(
        env.job("wide").offers,
        offered,
        "still offered while one copy lives"
    );

    env.advance(mins(5));
    let acts = env.settle();
    assert_eq!(
        requeues(&acts),
        [("wide".into(), reason::PODS_READY_TIMEOUT)]
    );
    let j = env.job("wide");
    assert_eq!(
        j.avoid.as_deref(),
        Some(kept.as_str()),
        "avoids where it timed out"
    );
    assert_eq!(annotation(j, AVOID_ANNOTATION), Some(kept.clone()));

    env.advance(secs(10));
    env.settle();
    let next = env.job("wide").offers.clone();
    assert_eq!(next.len(), 2);
    assert!(
        !next.contains(&kept),
        "offered to {next:?} after failing in {kept}"
    );
}

#[test]
fn a_job_whose_pods_all_get_ready_in_time_is_not_requeued() {
    let mut env = Env::new(
        roomy(),
        vec![queue(
            "q",
            "clusters: [a]\nwaitForPodsReady: {enabled: true, timeout: 5m}",
        )],
    );
    env.submit(job("quick").pods(3).build());
    env.settle();
    env.advance(mins(4));
    env.set_ready("quick", 3);
    env.settle();
    assert!(is_true(env.job("quick"), condition::PODS_READY));
    env.advance(mins(60));
    let acts = env.settle();
    assert!(requeues(&acts).is_empty(), "{acts:#?}");
    assert_eq!(env.job("quick").cluster.as_deref(), Some("a"));
}

#[test]
fn a_running_job_whose_admitted_condition_another_writer_dropped_says_it_again() {
    let mut env = Env::new(roomy(), vec![queue("q", "clusters: [a]")]);
    env.submit(job("train").pods(2).build());
    env.settle();
    assert!(is_true(env.job("train"), condition::ADMITTED));
    let admitted = condition(env.job("train"), condition::ADMITTED)
        .cloned()
        .unwrap();
    // A second dispatcher mirrored the copy's status from a view older than the unsuspend's
    // status write, and its write won: the conditions list, replaced whole, lost `Admitted`.
    let mut stale = env.job("train").clone();
    stale
        .status
        .conditions_mut()
        .retain(|c| c.type_ != condition::ADMITTED);
    env.world.upsert_job(stale);
    env.advance(secs(5));
    env.settle();
    let again = condition(env.job("train"), condition::ADMITTED).cloned();
    assert_eq!(
        again.as_ref().map(|c| c.status.as_str()),
        Some("True"),
        "{:#?}",
        env.job("train").status
    );
    let again = again.unwrap();
    assert!(
        again.message.as_deref().unwrap().contains("worker a"),
        "{again:?}"
    );
    assert_eq!(
        again.last_transition_time, admitted.last_transition_time,
        "admitted when it was dispatched, not when the condition was written again"
    );
    assert_eq!(env.job("train").cluster.as_deref(), Some("a"));
}

#[test]
fn a_job_dispatched_again_before_its_requeue_status_was_restored_still_says_it_was_requeued() {
    let mut env = Env::new(
        roomy(),
        vec![queue(
            "q",
            "clusters: [a]\nwaitForPodsReady:\n  enabled: true\n  timeout: 5m\n  requeuing: {backoffBase: 60s, limit: 3}",
        )],
    );
    env.submit(job("slow").pods(2).build());
    env.settle();
    env.idle_until(env.now + mins(5));
    assert_eq!(env.job("slow").requeues, 1);
    env.idle_until(env.now + mins(2));
    assert_eq!(
        env.job("slow").cluster.as_deref(),
        Some("a"),
        "dispatched again"
    );
    // The leader that requeued it died between its two writes (the annotations landed, the
    // status that says why did not), and the back-off had passed when the next leader read
    // it: that one dispatched it again from the status it found, without `Requeued`.
    let mut lost = env.job("slow").clone();
    lost.status
        .conditions_mut()
        .retain(|c| c.type_ != condition::REQUEUED);
    env.world.upsert_job(lost);
    env.advance(secs(5));
    env.settle();
    let j = env.job("slow");
    assert_eq!(j.cluster.as_deref(), Some("a"), "still running there");
    assert!(is_true(j, condition::ADMITTED));
    let requeued = condition(j, condition::REQUEUED).cloned();
    assert_eq!(
        requeued
            .as_ref()
            .map(|c| (c.status.as_str(), c.reason.as_deref())),
        Some(("True", Some(reason::PODS_READY_TIMEOUT))),
        "{:#?}",
        j.status
    );
    assert!(
        requeued.unwrap().message.unwrap().contains("1 so far"),
        "the count its annotations keep"
    );
}

#[test]
fn a_requeued_job_holds_its_quota_until_its_old_copy_is_gone() {
    let two = two_workers(64);
    let mut env = Env::new(
        two,
        vec![queue(
            "q",
            "clusters: [a, b]\nquota: {cpu: \"2\"}\nwaitForPodsReady:\n  enabled: true\n  timeout: 5m\n  requeuing: {backoffBase: 60s, limit: 3}",
        )],
    );
    env.submit(job("slow").pods(2).created(t0()).build());
    env.settle();
    let first = env.job("slow").cluster.clone().expect("dispatched");
    env.advance(secs(1));
    env.submit(job("next").pods(2).created(env.now).build());
    env.settle();
    assert_eq!(env.job("next").cluster, None, "no quota left");
    // The PodsReady timeout requeues `slow`; its worker refuses the copy's removal for now.
    env.refusing.insert(first.clone());
    env.advance_to(t0() + mins(5));
    for _ in 0..5 {
        env.step();
        env.advance(secs(1));
    }
    assert_eq!(env.job("slow").requeues, 1);
    assert!(
        env.remote_copy("slow", &first).is_some(),
        "its copy still runs"
    );
    assert_eq!(
        env.job("next").cluster,
        None,
        "the quota is still used by the copy's pods (worker b has room)"
    );
    assert_eq!(
        env.world.ledger.queue_use("q").map(|u| u.usage.clone()),
        Some(env.admitted_usage("q"))
    );
    // The copy goes: its quota is free, and the next Job in line takes it.
    env.refusing.clear();
    env.advance(secs(10));
    env.settle();
    assert!(env.remote_copy("slow", &first).is_none());
    assert!(env.job("next").cluster.is_some(), "{:#?}", env.planned);
}

// ---------------------------------------------------------------------------------------------
// 6. The copy's fate in its worker.

#[test]
fn a_copy_deleted_in_its_worker_requeues_the_job_uncounted() {
    let mut env = Env::new(roomy(), vec![queue("q", "clusters: [a]")]);
    env.submit(job("gone").build());
    env.settle();
    env.advance(secs(10));
    env.delete_in_worker("gone");
    let p = env.step();
    assert_eq!(
        requeues(&p.actions),
        [("gone".into(), reason::REMOTE_DELETED)]
    );
    let j = env.job("gone");
    assert_eq!(
        cond(j, condition::REQUEUED),
        Some(("True".into(), reason::REMOTE_DELETED.into()))
    );
    assert_eq!(j.requeues, 0);
    assert_eq!(j.requeue_after, None);
    // It waits in its queue again, and goes back.
    let acts = env.settle();
    assert_eq!(dispatches(&acts), [("gone".into(), "a".into())]);
}

fn finished_job_is_mirrored_recorded_and_removed(succeeded: bool, new_style: bool) {
    // Quota for one Job: the second waits for the first's.
    let mut env = Env::new(
        roomy(),
        vec![queue("q", "clusters: [a]\nquota: {cpu: \"2\"}")],
    );
    env.submit(job("done").pods(2).created(t0()).build());
    env.submit(job("next").pods(2).created(t0() + secs(1)).build());
    env.advance(secs(1));
    assert_eq!(dispatches(&env.settle()), [("done".into(), "a".into())]);
    env.advance(secs(10));
    env.set_ready("done", 2);
    env.settle();
    env.advance(mins(3));
    let gang = 2;
    let at = Time(mirror::to_timestamp(env.now));
    env.change_copy("done", "a", |c| {
        finish_copy(c, gang, succeeded, at, new_style)
    });
    let acts = env.settle();

    let expected = if succeeded {
        JobResult::Succeeded
    } else {
        JobResult::Failed
    };
    let j = env.job("done");
    assert_eq!(j.result, Some(expected));
    assert_eq!(
        annotation(j, RESULT_ANNOTATION).as_deref(),
        Some(expected.as_str())
    );
    assert_eq!(j.status.terminal(), Some(expected));
    if succeeded {
        assert_eq!(j.status.job().succeeded, Some(2));
        assert!(j.status.job().completion_time.is_some());
        assert!(is_true(j, "SuccessCriteriaMet"));
    } else {
        assert!(j.status.job().failed.unwrap_or(0) > 0);
        assert!(is_true(j, "FailureTarget"));
    }
    assert_eq!(j.status.job().active.unwrap_or(0), 0);
    // The result is recorded before the copy is removed.
    let record = acts
        .iter()
        .position(|a| matches!(a, Action::RecordResult { .. }))
        .expect("result recorded");
    let delete = acts
        .iter()
        .position(|a| matches!(a, Action::DeleteCopy { reason: r, .. } if *r == reason::FINISHED))
        .expect("copy removed");
    assert!(record < delete);
    assert!(env.remote_copy("done", "a").is_none());
    // Its quota went to the next Job.
    assert!(!j.holds_quota());
    assert_eq!(dispatches(&acts), [("next".into(), "a".into())]);
    assert!(env.refused.is_empty(), "{:?}", env.refused);
}

#[test]
fn a_job_completed_in_its_worker_is_mirrored_recorded_removed_and_frees_its_quota() {
    finished_job_is_mirrored_recorded_and_removed(true, true);
}

#[test]
fn a_job_failed_in_its_worker_is_mirrored_recorded_removed_and_frees_its_quota() {
    finished_job_is_mirrored_recorded_and_removed(false, true);
}

#[test]
fn a_job_finished_by_a_pre_1_31_worker_gets_the_conditions_the_api_server_requires() {
    finished_job_is_mirrored_recorded_and_removed(true, false);
    finished_job_is_mirrored_recorded_and_removed(false, false);
}

// ---------------------------------------------------------------------------------------------
// 7. Suspended by the user.

#[test]
fn a_job_the_user_suspends_is_taken_back_uncounted() {
    let mut env = Env::new(
        roomy(),
        vec![queue(
            "q",
            "clusters: [a]\nwaitForPodsReady: {enabled: true, requeuing: {limit: 0}}",
        )],
    );
    env.submit(job("paused").build());
    env.settle();
    env.advance(secs(30));
    env.set_ready("paused", 1);
    env.settle();
    env.advance(secs(30));
    env.user_suspends("paused");
    let p = env.step();
    assert_eq!(
        requeues(&p.actions),
        [("paused".into(), reason::SUSPENDED_BY_USER)]
    );
    assert_eq!(
        deletions(&p.actions),
        [("paused".into(), "a".into(), reason::SUSPENDED_BY_USER)]
    );
    let j = env.job("paused");
    assert!(env.remote_copy("paused", "a").is_none());
    assert!(j.suspended && j.cluster.is_none());
    assert_eq!(j.requeues, 0);
    assert_eq!(j.requeue_after, None);
    assert!(j.deactivated.is_none());
    assert_eq!(
        cond(j, condition::REQUEUED),
        Some(("True".into(), reason::SUSPENDED_BY_USER.into()))
    );
    assert!(!j.holds_quota());
}
