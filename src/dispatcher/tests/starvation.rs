//! Starvation, both ways: small Jobs pass a big one that cannot start (backfill), and a Job
//! that waited its queue's `starvationAfter` gets room kept for it, which later Jobs leave
//! alone while they still start beside it. `StrictFIFO` queues let no Job pass.

use super::support::*;
use crate::dispatcher::ledger::Hold;
use crate::dispatcher::*;
use crate::inventory::Inventory;
use std::sync::Arc;

/// Why the Job waits now, as the next plan says.
fn why(env: &mut Env, name: &str) -> WaitReason {
    let p = env.plan();
    let job = env.job(name);
    p.job_waiting
        .get(&job.key)
        .or_else(|| p.waiting.get(&job.class()))
        .cloned()
        .unwrap_or_else(|| panic!("{name} does not wait: {:#?}", p.actions))
}

/// The first dispatches of the steps from now on (at most ten steps).
fn first_dispatches(env: &mut Env) -> Vec<(String, String)> {
    for _ in 0..10 {
        let went = dispatches(&env.step().actions);
        if !went.is_empty() {
            return went;
        }
    }
    Vec::new()
}

/// The room kept for the Job: its worker and its nodes.
fn room_of(env: &Env, name: &str) -> Option<(String, Vec<String>)> {
    let hold: &Hold = env.world.ledger.hold_of(&env.job(name).uid)?;
    hold.nominated()?;
    let nodes = hold.takes.iter().map(|t| t.node.to_string()).collect();
    Some((hold.cluster.clone(), nodes))
}

/// One node `gpu` (32 CPUs, 8 GPUs) in worker `a`.
fn one_gpu_node() -> Inventory {
    InventoryBuilder::default()
        .cluster("a")
        .node("gpu", 32, 8)
        .build()
}

/// Queue `q` over worker `a`, with quota to spare (only room decides), starving after `after`.
fn starving_queue(after: &str, extra: &str) -> Queue {
    queue(
        "q",
        &format!("clusters: [a]\nquota: {{cpu: \"100\", nvidia.com/gpu: \"100\"}}\nstarvationAfter: {after}\n{extra}"),
    )
}

#[test]
fn a_starving_gang_keeps_its_own_room_and_cpu_jobs_still_start_beside_it() {
    // The holds' timeout (10m) is longer than the test: this inventory never shows the
    // dispatched Jobs' pods, their placements stay held until they finish.
    let mut env = Env::new(one_gpu_node(), vec![starving_queue("2m", "")]);
    env.submit(job("run").each(4, 6).created(env.now).build());
    assert_eq!(dispatches(&env.settle()), [("run".into(), "a".into())]);
    env.advance(secs(1));
    env.submit(job("big").each(8, 8).created(env.now).build());
    let w = why(&mut env, "big");
    assert_eq!(w.reason, reason::NO_WORKER_FITS, "{}", w.message);
    assert_eq!(
        room_of(&env, "big"),
        None,
        "no room is kept before starvationAfter"
    );

    // Two minutes on, the gang starves: the node's 8 GPUs (and 8 of its CPUs) are kept for
    // it, though 6 of the GPUs are still taken.
    env.advance(mins(3));
    env.settle();
    assert_eq!(room_of(&env, "big"), Some(("a".into(), vec!["gpu".into()])));
    let w = why(&mut env, "big");
    assert!(
        w.message
            .contains("room is kept for it in worker a (node gpu)"),
        "{}",
        w.message
    );

    // A CPU-only Job fits beside the room (32 − 4 running − 8 kept ≥ 8 CPUs): it starts.
    env.submit(job("cpu").each(8, 0).created(env.now).build());
    assert_eq!(dispatches(&env.settle()), [("cpu".into(), "a".into())]);
    // A Job that would take the GPUs the room needs waits, though 2 are free now.
    env.submit(job("gpu").each(1, 2).created(env.now).build());
    assert!(dispatches(&env.settle()).is_empty());
    let w = why(&mut env, "gpu");
    assert_eq!(w.reason, reason::NO_WORKER_FITS);
    assert!(
        w.message
            .contains("room there is kept for team/big, which is ahead of it"),
        "{}",
        w.message
    );

    // The running gang ends: the starving one takes its room, and lets it go.
    env.finish("run", true);
    let went = first_dispatches(&mut env);
    assert_eq!(went, [("big".into(), "a".into())]);
    assert_eq!(room_of(&env, "big"), None);
    assert!(env.world.ledger.nominations().next().is_none());
    // Its placement is held now: the small GPU Job still finds no GPU.
    assert!(dispatches(&env.settle()).is_empty());
    assert!(env.job("gpu").suspended);
}

#[test]
fn starvation_after_0s_keeps_no_room() {
    let mut env = Env::new(one_gpu_node(), vec![starving_queue("0s", "")]);
    env.submit(job("run").each(4, 6).created(env.now).build());
    env.settle();
    env.advance(secs(1));
    env.submit(job("big").each(8, 8).created(env.now).build());
    // Long past the default 10m, within the running Job's hold.
    env.advance(mins(9));
    env.submit(job("gpu").each(1, 2).created(env.now).build());
    // The small GPU Job takes the 2 free GPUs: nothing is kept for the big one, ever.
    assert_eq!(dispatches(&env.settle()), [("gpu".into(), "a".into())]);
    assert_eq!(room_of(&env, "big"), None);
    let w = why(&mut env, "big");
    assert!(!w.message.contains("room"), "{}", w.message);
}

#[test]
fn the_room_is_on_the_nodes_freest_now_and_follows_the_nodes_that_free_first() {
    // Three 8-GPU nodes, busy with pods the dispatcher does not run: 6, 8 and 2 GPUs taken.
    let busy = |gpus: [u32; 3]| {
        let mut b = InventoryBuilder::default().cluster("a");
        for (i, g) in gpus.into_iter().enumerate() {
            b = b.node(&format!("n{i}"), 32, 8).busy(4, g);
        }
        Arc::new(b.build())
    };
    let mut env = Env::new(
        Inventory::clone(&busy([6, 8, 2])),
        vec![starving_queue("2m", "")],
    );
    env.submit(job("big").pods(2).each(4, 8).created(env.now).build());
    env.advance(mins(3));
    env.settle();
    // The two nodes with the most GPUs free now: n2 (6 free), then n0 (2 free).
    let nodes = |env: &Env| {
        let (worker, mut nodes) = room_of(env, "big").expect("room is kept");
        assert_eq!(worker, "a");
        nodes.sort();
        nodes
    };
    assert_eq!(nodes(&env), ["n0", "n2"]);

    // n1 drains first: the room moves there (n1 and n2 free sooner than n0 and n2), and a
    // small GPU Job takes the 2 GPUs free on n0, which the room no longer needs.
    env.world.set_inventory(busy([6, 0, 2]));
    env.submit(job("small").each(1, 2).created(env.now).build());
    assert_eq!(dispatches(&env.settle()), [("small".into(), "a".into())]);
    assert_eq!(nodes(&env), ["n1", "n2"]);
    let placed = |acts: &[Action], name: &str| -> Vec<String> {
        acts.iter()
            .find_map(|a| match a {
                Action::Dispatch { job, hold, .. } if job.name == name => {
                    Some(hold.takes.iter().map(|t| t.node.to_string()).collect())
                }
                _ => None,
            })
            .unwrap_or_default()
    };
    let small = placed(
        &env.done.iter().map(|(_, a)| a.clone()).collect::<Vec<_>>(),
        "small",
    );
    assert_eq!(small, ["n0"]);

    // Nothing frees sooner than n1 and n2 now: the room stays while n0 drains.
    env.world.set_inventory(busy([0, 0, 2]));
    assert!(dispatches(&env.settle()).is_empty());
    assert_eq!(nodes(&env), ["n1", "n2"]);
    // n2 drains: the gang starts on n1 and n2.
    env.world.set_inventory(busy([0, 0, 0]));
    let acts = env.settle();
    assert_eq!(dispatches(&acts), [("big".into(), "a".into())]);
    let mut big = placed(&acts, "big");
    big.sort();
    assert_eq!(big, ["n1", "n2"]);
}

#[test]
fn room_is_kept_for_one_job_per_worker_and_in_at_most_half_of_a_queues_workers() {
    // Two workers, each one 8-GPU node with 6 GPUs taken by pods the dispatcher does not run.
    let inv = InventoryBuilder::default()
        .cluster("a")
        .node("a-0", 32, 8)
        .busy(0, 6)
        .cluster("b")
        .node("b-0", 32, 8)
        .busy(0, 6)
        .build();
    let spec = |q: &str| {
        queue(
            q,
            "clusters: [a, b]\nquota: {cpu: \"100\", nvidia.com/gpu: \"100\"}\nstarvationAfter: 1m",
        )
    };
    let mut env = Env::new(inv, vec![spec("q"), spec("r")]);
    // Three Jobs of q, each its own class (a class's Jobs wait behind its first anyway).
    for (i, name) in ["q-1", "q-2", "q-3"].into_iter().enumerate() {
        let cpus = i as u32 + 1;
        env.submit(
            job(name)
                .each(cpus, 8)
                .created(env.now + secs(i as u64))
                .build(),
        );
    }
    env.advance(secs(10));
    env.submit(job("r-1").queue("r").each(1, 8).created(env.now).build());
    env.advance(mins(5));
    env.settle();
    // q keeps room in one of its two workers (half), for its oldest Job; r in the other.
    let (q_worker, _) = room_of(&env, "q-1").expect("the oldest Job of q has room");
    let (r_worker, _) = room_of(&env, "r-1").expect("r's Job has room");
    assert_ne!(q_worker, r_worker, "one Job per worker");
    assert_eq!(room_of(&env, "q-2"), None);
    assert_eq!(room_of(&env, "q-3"), None);
    let w = why(&mut env, "q-2");
    assert!(
        w.message
            .contains("its queue keeps room for at most 1 Job at once"),
        "{}",
        w.message
    );
}

#[test]
fn strict_fifo_never_lets_a_later_job_pass_but_one_that_can_never_fit_blocks_no_one() {
    let mut env = Env::new(
        one_gpu_node(),
        vec![starving_queue("2m", "queueingStrategy: StrictFIFO")],
    );
    env.submit(job("run").each(4, 6).created(env.now).build());
    env.settle();
    env.advance(secs(1));
    // Larger than the node even empty: it waits for ever, and holds no one back.
    env.submit(job("huge").each(64, 0).created(env.now).build());
    env.advance(secs(1));
    env.submit(job("early").each(1, 0).created(env.now).build());
    assert_eq!(dispatches(&env.settle()), [("early".into(), "a".into())]);
    assert_eq!(why(&mut env, "huge").reason, reason::NEVER_FITS);

    // A gang that does not fit now holds back every Job after it, even those that fit.
    env.advance(secs(1));
    env.submit(job("big").each(8, 8).created(env.now).build());
    env.advance(secs(1));
    env.submit(job("small").each(1, 0).created(env.now).build());
    assert!(dispatches(&env.settle()).is_empty());
    let w = why(&mut env, "small");
    assert_eq!(w.reason, reason::BEHIND_OLDER_JOB);
    assert!(
        w.message.contains("waiting behind team/big"),
        "{}",
        w.message
    );
    assert_eq!(wait_category(w.reason), "Order");

    // Once the gang starts, the rest follow in order.
    env.finish("run", true);
    let mut went = Vec::new();
    for _ in 0..10 {
        went.extend(dispatches(&env.step().actions));
        if went.len() >= 2 {
            break;
        }
    }
    assert_eq!(
        went,
        [("big".into(), "a".into()), ("small".into(), "a".into())]
    );
}

#[test]
fn under_best_effort_fifo_the_same_small_job_passes() {
    let mut env = Env::new(one_gpu_node(), vec![starving_queue("2m", "")]);
    env.submit(job("run").each(4, 6).created(env.now).build());
    env.settle();
    env.advance(secs(1));
    env.submit(job("big").each(8, 8).created(env.now).build());
    env.advance(secs(1));
    env.submit(job("small").each(1, 0).created(env.now).build());
    assert_eq!(dispatches(&env.settle()), [("small".into(), "a".into())]);
}

#[test]
fn a_starving_job_short_of_its_queues_quota_gets_room_too_and_other_queues_leave_it() {
    // Queue `q` may use 8 GPUs; `run` uses 6 of them. Queue `other` shares worker `a`.
    let q = queue(
        "q",
        "clusters: [a]\nquota: {cpu: \"100\", nvidia.com/gpu: \"8\"}\nstarvationAfter: 2m\n",
    );
    let other = queue("other", "clusters: [a]\nstarvationAfter: 0s\n");
    let mut env = Env::new(one_gpu_node(), vec![q, other]);
    env.submit(job("run").each(4, 6).created(env.now).build());
    assert_eq!(dispatches(&env.settle()), [("run".into(), "a".into())]);
    env.advance(secs(1));
    env.submit(job("big").each(8, 8).created(env.now).build());
    env.advance(mins(3));
    env.settle();
    let w = why(&mut env, "big");
    assert_eq!(w.reason, reason::QUOTA_EXCEEDED, "{}", w.message);
    assert!(
        w.message.contains("its quota is held for it from now on")
            && w.message
                .contains("room is kept for it in worker a (node gpu)"),
        "{}",
        w.message
    );
    assert_eq!(room_of(&env, "big"), Some(("a".into(), vec!["gpu".into()])));

    // Another queue's Job asks for the 2 free GPUs: its own quota covers them, but they
    // are the starving Job's room.
    env.submit(
        job("theirs")
            .queue("other")
            .each(1, 2)
            .created(env.now)
            .build(),
    );
    assert!(dispatches(&env.settle()).is_empty());
    assert_eq!(why(&mut env, "theirs").reason, reason::NO_WORKER_FITS);

    // `run` ends: quota and nodes are back, and the starving Job starts first.
    env.finish("run", true);
    let mut went = Vec::new();
    for _ in 0..10 {
        went.extend(dispatches(&env.step().actions));
        if went.iter().any(|(j, _)| j == "big") {
            break;
        }
    }
    assert_eq!(went, [("big".into(), "a".into())]);
}

/// Two starving Jobs of queue `q` (with `extra` in its spec) and the one room of worker `a`,
/// whose 8 GPUs a running Job takes: `small` (one 1-GPU pod) submitted first, `whole` (one
/// pod of all 8 GPUs) `later` after it. Returns which of them room is kept for once `small`
/// has waited 5 minutes.
fn room_goes_to(later: std::time::Duration, extra: &str) -> Vec<&'static str> {
    let mut env = Env::new(one_gpu_node(), vec![starving_queue("2m", extra)]);
    env.submit(job("run").each(4, 8).created(env.now).build());
    assert_eq!(dispatches(&env.settle()), [("run".into(), "a".into())]);
    env.advance(secs(1));
    env.submit(job("small").each(1, 1).created(env.now).build());
    env.advance(later);
    env.submit(job("whole").each(4, 8).created(env.now).build());
    env.advance(mins(5) - later);
    assert!(dispatches(&env.settle()).is_empty());
    ["small", "whole"]
        .into_iter()
        .filter(|name| room_of(&env, name).is_some())
        .collect()
}

#[test]
fn a_starving_job_of_larger_pods_counts_as_older_by_a_share_of_its_age() {
    // `whole` takes a whole node, `small` an eighth: at 5 minutes, `whole` (4.5 minutes old)
    // counts as 54 s older than it is, `small` as 7.5 s older: `whole` goes first.
    assert_eq!(room_goes_to(secs(30), ""), ["whole"]);
    // Submitted 2 minutes after `small` (more than a sixth of its age), `whole` does not pass.
    assert_eq!(room_goes_to(mins(2), ""), ["small"]);
    // Under StrictFIFO no Job passes an older one.
    assert_eq!(
        room_goes_to(secs(30), "queueingStrategy: StrictFIFO"),
        ["small"]
    );
}

#[test]
fn a_pods_size_is_its_largest_share_of_the_largest_node_and_its_bonus_a_share_of_its_age() {
    use crate::dispatcher::admission::heads::{largest_on_a_node, size_bonus, size_share};
    // The largest nodes: 64 CPUs (b-0), 8 GPUs (a-0); 256Gi of memory each.
    let inv = InventoryBuilder::default()
        .cluster("a")
        .node("a-0", 32, 8)
        .cluster("b")
        .node("b-0", 64, 0)
        .build();
    let share = |cpus, gpus| size_share(&pod(cpus, gpus).0, &largest_on_a_node(&inv), &inv);
    assert_eq!(share(16, 0), 250, "16 of 64 CPUs");
    assert_eq!(share(16, 4), 500, "4 of 8 GPUs");
    assert_eq!(
        share(128, 0),
        1000,
        "more than any node has counts as a whole node"
    );
    assert_eq!(share(0, 0), 3, "1Gi of 256Gi");
    // A resource no node has counts for nothing.
    let none = InventoryBuilder::default()
        .cluster("c")
        .node("c-0", 64, 0)
        .build();
    let no_gpus = size_share(&pod(16, 8).0, &largest_on_a_node(&none), &none);
    assert_eq!(no_gpus, 250);

    assert_eq!(
        size_bonus(mins(10), 1000),
        mins(2),
        "a fifth of its age for a whole node"
    );
    assert_eq!(size_bonus(mins(10), 125), secs(15));
    assert_eq!(size_bonus(mins(10), 0), secs(0));
    assert_eq!(
        size_bonus(mins(10), 5000),
        mins(2),
        "never more than a whole node's"
    );
    // An age as long as a clock can hold does not overflow.
    let _ = size_bonus(std::time::Duration::MAX, 1000);
}

#[test]
fn without_exact_placement_jobs_go_in_kueues_plain_order() {
    // Kueue's ways (simulate's baselines) keep no room, and order Jobs by priority and age
    // alone: when the running Job ends, the older 1-GPU Job takes its GPUs first, and the
    // whole-node Job submitted 30 s after it waits.
    let mut env = Env::new(one_gpu_node(), vec![starving_queue("2m", "")]);
    env.world.config.placement = crate::dispatcher::world::Placement::SumOfFree;
    env.submit(job("run").each(4, 8).created(env.now).build());
    assert_eq!(dispatches(&env.settle()), [("run".into(), "a".into())]);
    env.advance(secs(1));
    env.submit(job("small").each(1, 1).created(env.now).build());
    env.advance(secs(30));
    env.submit(job("whole").each(4, 8).created(env.now).build());
    env.advance(mins(5));
    assert!(dispatches(&env.settle()).is_empty());
    env.finish("run", true);
    let mut went = Vec::new();
    for _ in 0..10 {
        went.extend(dispatches(&env.step().actions));
    }
    assert_eq!(went, [("small".into(), "a".into())]);
}

#[test]
fn a_starving_gang_that_keeps_one_pod_to_a_node_keeps_room_on_a_node_for_each_pod() {
    let inv = InventoryBuilder::default()
        .cluster("a")
        .node("n1", 16, 0)
        .node("n2", 16, 0)
        .node("n3", 16, 0)
        .build();
    let mut env = Env::new(inv, vec![starving_queue("2m", "")]);
    env.submit(job("run").each(12, 0).created(env.now).build());
    assert_eq!(dispatches(&env.settle()), [("run".into(), "a".into())]);
    env.advance(secs(1));
    // Three pods of 8 CPUs, one to a node: the two free nodes could hold four such pods
    // packed, but only two of these.
    env.submit(
        job("big")
            .pods(3)
            .each(8, 0)
            .one_per_node()
            .created(env.now)
            .build(),
    );
    assert!(dispatches(&env.settle()).is_empty());
    env.advance(mins(3));
    env.settle();
    let (worker, mut nodes) = room_of(&env, "big").expect("room is kept for big");
    nodes.sort();
    assert_eq!(
        (worker.as_str(), nodes),
        ("a", vec!["n1".into(), "n2".into(), "n3".into()])
    );
    // Beside the room (8 CPUs kept on each node), a Job of 8 CPUs still starts; one of 12,
    // which only the nodes of the room could hold, waits.
    env.submit(job("eight").each(8, 0).created(env.now).build());
    assert_eq!(dispatches(&env.settle()), [("eight".into(), "a".into())]);
    env.submit(job("twelve").each(12, 0).created(env.now).build());
    assert!(dispatches(&env.settle()).is_empty());
    // `run` ends: the gang starts, a pod on each node.
    env.finish("run", true);
    let went = first_dispatches(&mut env);
    assert_eq!(went, [("big".into(), "a".into())]);
}
