//! Random runs: invariants after every step, and the caches held to the plain answers.

use super::support::*;
use crate::dispatcher::*;
use crate::rng::Rng;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::{BTreeMap, BTreeSet};

// ---------------------------------------------------------------------------------------------
// 8. Random runs.

/// What must hold after every step of a random run.
fn check_invariants(env: &Env, quotas: &BTreeMap<String, BTreeMap<String, i64>>, step: &str) {
    assert!(
        env.refused.is_empty(),
        "{step}: refused status {:?}",
        env.refused
    );
    for (q, quota) in quotas {
        let used = env.usage_within_quota(q);
        for (r, limit) in quota {
            let u = used.get(r).copied().unwrap_or(0);
            assert!(u <= *limit, "{step}: queue {q} uses {u} of {limit} {r}");
        }
        let seen = env
            .world
            .ledger
            .queue_use(q)
            .map(|u| u.usage.clone())
            .unwrap_or_default();
        assert_eq!(
            seen,
            env.admitted_usage(q),
            "{step}: queue {q}'s running total"
        );
    }
    // No copy is created while the Job still runs in another reachable worker.
    assert!(env.duplicates.is_empty(), "{step}: {:?}", env.duplicates);
    // Pods of a Job run in one worker at a time. By design there are two exceptions: a Job
    // offered to several workers at once (`placement.fanout` > 1) runs in up to that many
    // until the first to have all its pods Ready keeps it and the others' copies are removed;
    // and a copy in a worker that became unreachable is given up for lost (as MultiKueue does) and may
    // run on there until the worker answers again and the copy is removed.
    for j in env.world.state.jobs.values() {
        let running: Vec<&String> = env
            .remote
            .iter()
            .filter(|(c, m)| {
                env.reachable(c)
                    && m.get(&j.uid).is_some_and(|copy| {
                        !copy.deleting
                            && copy.status.terminal().is_none()
                            && copy.status.job().active.unwrap_or(0) > 0
                            && !env.lost_copies.contains(&((*c).clone(), copy.uid.clone()))
                    })
            })
            .map(|(c, _)| c)
            .collect();
        let fanout = (env.world.state.settings(&j.queue)).map_or(1, |s| s.fanout.max(1));
        assert!(
            running.len() <= fanout,
            "{step}: {} runs pods in {running:?} (fanout {fanout}, claimed for {:?}, offered to {:?})",
            j.key,
            j.cluster,
            j.offers
        );
    }
}

/// Once the dispatcher has done all it wanted (nothing failing), no Job runs in two
/// reachable workers, except in those it is offered to.
fn check_settled(env: &Env, step: &str) {
    for (c, copies) in &env.remote {
        if env.reachable(c) {
            for uid in copies.keys() {
                assert!(
                    env.world.state.job_by_uid(uid).is_some(),
                    "{step}: the copy of deleted Job {uid} stays in {c}"
                );
            }
        }
    }
    for j in env.world.state.jobs.values() {
        let places: Vec<&String> = env
            .remote
            .iter()
            .filter(|(c, m)| env.reachable(c) && m.get(&j.uid).is_some_and(|copy| !copy.deleting))
            .map(|(c, _)| c)
            .collect();
        assert!(
            places.iter().all(|c| j.kept_clusters().contains(c)),
            "{step}: {} has copies in {places:?} (claimed for {:?}, offered to {:?})",
            j.key,
            j.cluster,
            j.offers
        );
        if j.finished() || j.deleting {
            assert!(
                places.is_empty(),
                "{step}: {} finished or deleted, its copies stay in {places:?}",
                j.key
            );
            assert!(!j.holds_quota(), "{step}: {} ended, holds quota", j.key);
        } else if let Some(c) = &j.cluster {
            if env.world.state.workers[c].usable() {
                assert_eq!(
                    places,
                    [c],
                    "{step}: {} is claimed for {c} and does not run there",
                    j.key
                );
            }
        }
    }
}

#[test]
fn random_runs_keep_quota_single_placement_and_valid_statuses() {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for seed in 0..40u64 {
        let env = random_run(seed, 400, true);
        let kept = env.planned.iter().filter(|p| p.contains(" kept ")).count();
        *seen.entry("Kept room".into()).or_insert(0) += kept;
        for (_, a) in env.done {
            let kind = match a {
                Action::Requeue { reason, .. } => format!("Requeue {reason}"),
                Action::DeleteCopy { reason, .. } => format!("DeleteCopy {reason}"),
                Action::RecordResult { result, .. } => format!("RecordResult {result:?}"),
                Action::Dispatch { .. } => "Dispatch".into(),
                Action::Offer { .. } => "Offer".into(),
                Action::Choose { .. } => "Choose".into(),
                Action::Deactivate { .. } => "Deactivate".into(),
                _ => continue,
            };
            *seen.entry(kind).or_insert(0) += 1;
        }
    }
    // The runs went through every path they are meant to check.
    let reasons = [
        reason::PODS_READY_TIMEOUT,
        reason::PODS_READY_LOST,
        reason::WORKER_LOST,
        reason::REMOTE_DELETED,
        reason::SUSPENDED_BY_USER,
    ];
    let mut expected: Vec<String> = reasons.iter().map(|r| format!("Requeue {r}")).collect();
    expected.extend(
        [
            "Dispatch",
            "Offer",
            "Choose",
            "Deactivate",
            "RecordResult Succeeded",
            "RecordResult Failed",
            "DeleteCopy StaleCopy",
            "DeleteCopy Finished",
            "DeleteCopy OrphanedCopy",
            "Kept room",
        ]
        .map(String::from),
    );
    for kind in expected {
        assert!(
            seen.get(&kind).is_some_and(|n| *n > 0),
            "no {kind} in {seen:?}"
        );
    }
}

/// The caches only ever save work: random runs, with workers lost and back, writes failing,
/// Jobs requeued, suspended and deleted, decide exactly the same actions, in the same order,
/// whether admission's questions are answered from the caches or afresh.
#[test]
fn the_caches_change_no_decision_in_random_runs() {
    for seed in 0..24u64 {
        let cached = random_run(seed, 300, true).planned;
        let plain = random_run(seed, 300, false).planned;
        if let Some(i) = cached.iter().zip(&plain).position(|(a, b)| a != b) {
            panic!(
                "seed {seed}: decision {i} differs:\n cached: {}\n plain:  {}",
                cached[i], plain[i]
            );
        }
        assert_eq!(cached.len(), plain.len(), "seed {seed}");
    }
}

/// The random runs' queue "q", its workers in `order`: the runs reorder them now and then.
fn queue_q(order: &str) -> Queue {
    queue(
        "q",
        &format!("clusters: [{order}]\nquota: {{cpu: \"20\", nvidia.com/gpu: \"4\"}}\nworkerLostTimeout: 5m\nstarvationAfter: 4m\nwaitForPodsReady:\n  enabled: true\n  timeout: 3m\n  recoveryTimeout: 2m\n  requeuing: {{backoffBase: 30s, backoffMax: 2m, limit: 3}}"),
    )
}

/// The names of the Jobs `keep` keeps, sorted (the state's map has no order a seed can repeat).
fn job_names(env: &Env, keep: impl Fn(&Job) -> bool) -> Vec<String> {
    let names: BTreeSet<String> = env
        .world
        .state
        .jobs
        .values()
        .filter(|j| keep(j))
        .map(|j| j.key.name.clone())
        .collect();
    names.into_iter().collect()
}

/// Every copy in the workers, as (worker, uid of its Job).
fn every_copy(env: &Env) -> Vec<(String, String)> {
    env.remote
        .iter()
        .flat_map(|(c, m)| m.keys().map(move |u| (c.clone(), u.clone())))
        .collect()
}

fn random_run(seed: u64, steps: usize, remember: bool) -> Env {
    let mut rng = Rng::new(seed + 1);
    let inv = InventoryBuilder::default()
        .cluster("a")
        .node("a-0", 16, 4)
        .labels("{zone: z1}")
        .node("a-1", 16, 0)
        .labels("{zone: z1}")
        .cluster("b")
        .numa_node("b-0", &[(8, 2), (8, 2)])
        .labels("{zone: z2}")
        .cluster("c")
        .node("c-0", 8, 0)
        .build();
    let queues = vec![
        queue_q("a, b, c"),
        queue(
            "wide",
            "clusters: [a, b, c]\nquota: {cpu: \"12\"}\nplacement: {fanout: 2}\nworkerLostTimeout: 3m\nwaitForPodsReady: {enabled: true, blockAdmission: true, timeout: 4m}",
        ),
        queue(
            "strict",
            "clusters: [a, c]\nquota: {cpu: \"10\"}\nqueueingStrategy: StrictFIFO\nstarvationAfter: 2m",
        ),
    ];
    let quotas: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::from([
        (
            "q".to_string(),
            BTreeMap::from([("cpu".into(), 20_000), ("nvidia.com/gpu".into(), 4_000)]),
        ),
        ("wide".to_string(), BTreeMap::from([("cpu".into(), 12_000)])),
        (
            "strict".to_string(),
            BTreeMap::from([("cpu".into(), 10_000)]),
        ),
    ]);
    let mut env = Env::new(inv, queues);
    env.world.config.remember = remember;
    let clusters = ["a", "b", "c"];
    let mut submitted = 0;
    let mut old_workers: BTreeSet<String> = BTreeSet::new();

    for step in 0..steps {
        let what = rng.below(100);
        let label = format!("seed {seed} step {step}");
        match what {
            0..=19 => {
                let q = match rng.below(10) {
                    0..=5 => "q",
                    6..=7 => "wide",
                    _ => "strict",
                };
                let gpus = if q == "q" && rng.percent(40) {
                    1 + rng.below(2) as u32
                } else {
                    0
                };
                let mut j = job(&format!("j{submitted}"))
                    .queue(q)
                    .pods(1 + rng.below(3) as u32)
                    .each(1 + rng.below(4) as u32, gpus);
                // Some gangs keep their pods one to a node.
                if rng.percent(15) {
                    j = j.one_per_node();
                } else if rng.percent(15) {
                    // Some spread them over nodes.
                    j = j.spread(1 + rng.below(2) as u32);
                } else if rng.percent(15) {
                    // Some keep them together: on one node, or in one zone (c has none).
                    let keys = [crate::placement::apart::HOSTNAME, "zone"];
                    j = j.together(keys[rng.below(2) as usize]);
                }
                // Some gangs have pods of a second shape beside (a JobSet's driver).
                if rng.percent(15) {
                    j = j.beside(1, 1 + rng.below(2) as u32, 0);
                }
                let j = j.priority(rng.below(3) as i32).created(env.now).build();
                submitted += 1;
                env.submit(j);
            }
            20..=21 => {
                let c = clusters[rng.below(3) as usize].to_string();
                if !env.refusing.remove(&c) {
                    env.refusing.insert(c);
                }
            }
            22..=24 => {
                let c = clusters[rng.below(3) as usize];
                if env.reachable(c) {
                    env.disconnect(c);
                } else {
                    env.reconnect(c);
                }
            }
            25..=44 => {
                // Pods of a copy get Ready (or some stop being Ready).
                let copies = every_copy(&env);
                if let Some((c, uid)) = rng.pick(&copies).cloned() {
                    let Some(name) = env.world.state.job_by_uid(&uid).map(|j| j.key.name.clone())
                    else {
                        continue;
                    };
                    let gang = env.job(&name).gang() as i32;
                    let ready = if rng.percent(70) {
                        gang
                    } else {
                        rng.below(gang as u64) as i32
                    };
                    let copy = &env.remote[&c][&uid];
                    if copy.status.terminal().is_none() {
                        env.change_copy(&name, &c, |copy| {
                            copy.status.job_mut().ready = Some(ready)
                        });
                    }
                }
            }
            45..=54 => {
                // A copy finishes.
                let copies = every_copy(&env);
                if let Some((c, uid)) = rng.pick(&copies).cloned() {
                    let Some(j) = env.world.state.job_by_uid(&uid) else {
                        continue;
                    };
                    let (name, gang) = (j.key.name.clone(), j.gang() as i32);
                    let at = Time(mirror::to_timestamp(env.now));
                    let ok = rng.percent(75);
                    let new_style = rng.percent(70) || old_workers.contains(&c);
                    if !new_style {
                        old_workers.insert(c.clone());
                    }
                    if env.remote[&c][&uid].status.terminal().is_none() {
                        env.change_copy(&name, &c, |copy| {
                            finish_copy(copy, gang, ok, at, new_style)
                        });
                    }
                }
            }
            55..=58 => {
                // Someone deletes a copy in its worker.
                let copies = every_copy(&env);
                if let Some((c, uid)) = rng.pick(&copies).cloned() {
                    env.remote.get_mut(&c).expect("worker").remove(&uid);
                    if env.reachable(&c) {
                        env.world.remove_copy(&c, &uid);
                    }
                }
            }
            59..=61 => {
                // The user suspends an admitted Job.
                let admitted = job_names(&env, |j| j.admitted_at.is_some() && !j.suspended);
                if let Some(name) = rng.pick(&admitted).cloned() {
                    env.user_suspends(&name);
                }
            }
            62..=63 => {
                // The user deletes a Job: gone at once, or kept while its copies go.
                let names = job_names(&env, |_| true);
                if let Some(name) = rng.pick(&names).cloned() {
                    let key = JobKey::new("team", &name);
                    if rng.percent(50) {
                        env.world.remove_job(&key);
                    } else {
                        let mut j = env.job(&name).clone();
                        j.deleting = true;
                        env.world.upsert_job(j);
                    }
                }
            }
            64 => {
                // Someone reorders queue "q"'s workers: what was found of its classes, by
                // position in that list, must not be taken for another worker.
                let orders = ["a, b, c", "c, a, b", "b, c, a", "c, b, a"];
                env.world
                    .upsert_queue(queue_q(orders[rng.below(4) as usize]));
            }
            _ => env.advance(secs(1 + rng.below(90))),
        }
        // A Job being deleted goes once no worker holds a copy of it.
        let gone: Vec<JobKey> = env
            .world
            .state
            .jobs
            .values()
            .filter(|j| j.deleting && env.remote.values().all(|m| !m.contains_key(&j.uid)))
            .map(|j| j.key.clone())
            .collect();
        for key in gone {
            env.world.remove_job(&key);
        }
        check_invariants(&env, &quotas, &label);

        // The dispatcher plans and its actions are carried out; now and then one fails.
        for round in 0..5 {
            let p = env.plan();
            if p.actions.is_empty() {
                break;
            }
            for a in &p.actions {
                let ok = !rng.percent(8);
                env.execute(a, ok);
                check_invariants(&env, &quotas, &format!("{label} round {round} after {a:?}"));
            }
        }
        if step % 10 == 9 {
            // Every worker takes writes for a moment: the dispatcher gets all it asks for.
            let refusing = std::mem::take(&mut env.refusing);
            // Copies whose create failed are created again once their retry is due.
            let until = env.now + env.world.config.create_retry_after;
            env.idle_until(until);
            check_invariants(&env, &quotas, &label);
            check_settled(&env, &label);
            env.refusing = refusing;
        }
    }
    env
}

/// Found by the random runs: a gang kept one to a node that no worker holds says so for good
/// (each node holds one), until a node loses room: the node then refuses it for a reason
/// that may pass, and the gang waits. In a StrictFIFO queue that decides whether a later Job
/// passes it. The caches must see the change, though no node gained room.
#[test]
fn a_gang_kept_apart_is_judged_afresh_when_a_node_loses_room() {
    let why = |env: &mut Env, name: &str| {
        let p = env.plan();
        let job = env.job(name);
        let waits = p
            .job_waiting
            .get(&job.key)
            .or_else(|| p.waiting.get(&job.class()));
        waits.map(|w| w.reason)
    };
    let run = |remember: bool| {
        let inv = InventoryBuilder::default()
            .cluster("a")
            .node("a-0", 8, 0)
            .node("a-1", 8, 0)
            .build();
        let queues = vec![
            queue("strict", "clusters: [a]\nqueueingStrategy: StrictFIFO"),
            queue("other", "clusters: [a]"),
        ];
        let mut env = Env::new(inv, queues);
        env.world.config.remember = remember;
        let apart = job("apart")
            .queue("strict")
            .pods(3)
            .each(1, 0)
            .one_per_node();
        env.submit(apart.created(t0()).build());
        env.settle();
        let mut seen = vec![why(&mut env, "apart")];
        // A Job of another queue fills a-0.
        env.advance(secs(10));
        let filler = job("filler").queue("other").pods(1).each(8, 0);
        env.submit(filler.created(env.now).build());
        env.settle();
        env.advance(secs(10));
        let later = job("later").queue("strict").pods(1).each(1, 0);
        env.submit(later.created(env.now).build());
        env.settle();
        seen.extend([why(&mut env, "apart"), why(&mut env, "later")]);
        (seen, env.planned)
    };
    let (seen, cached) = run(true);
    let (plain_seen, plain) = run(false);
    assert_eq!(cached, plain, "the caches decided otherwise");
    assert_eq!(seen, plain_seen);
    assert!(
        plain
            .iter()
            .any(|a| a.contains("\"filler\" }, cluster: \"a\"")),
        "{plain:#?}"
    );
    // As the plain answers have it: for good while each node holds one; a wait once a node
    // refuses for want of room, which holds the later Job back.
    let (never, wait) = (reason::NEVER_FITS, reason::NO_WORKER_FITS);
    assert_eq!(
        seen,
        [Some(never), Some(wait), Some(reason::BEHIND_OLDER_JOB)]
    );
}
