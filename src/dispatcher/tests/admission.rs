//! Admission as a user sees it: placement, quota, order and the PodsReady gate (starvation
//! has its own file).

use super::support::*;
use crate::dispatcher::job::to_system_time;
use crate::dispatcher::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

// ---------------------------------------------------------------------------------------------
// 1. Placement.

#[test]
fn a_gang_goes_to_the_one_cluster_where_it_fits_numa_aligned() {
    // The gang: 2 pods × (4 CPUs, 2 GPUs), each pod's GPUs in one NUMA zone.
    // - `spread`: 4 GPUs free, 1 per node: enough summed, no node holds a pod;
    // - `split`: one node, 4 GPUs, 1 per NUMA zone: the node has room, no zone does;
    // - `tiny`: 1 GPU in all;
    // - `aligned`: one node, 2 zones of 2 GPUs: the only one that can run it.
    // `spread` and `split` come first in the queue and are emptier (LeastAllocated would
    // prefer them), so only the NUMA-exact fit can pick `aligned`.
    let inv = InventoryBuilder::default()
        .cluster("spread")
        .node("spread-0", 64, 1)
        .node("spread-1", 64, 1)
        .node("spread-2", 64, 1)
        .node("spread-3", 64, 1)
        .cluster("split")
        .numa_node("split-0", &[(16, 1), (16, 1), (16, 1), (16, 1)])
        .cluster("tiny")
        .node("tiny-0", 8, 1)
        .cluster("aligned")
        .numa_node("aligned-0", &[(8, 2), (8, 2)])
        .build();
    let mut env = Env::new(
        inv,
        vec![queue(
            "q",
            "clusters: [spread, split, tiny, aligned]\nplacement: {fanout: 1}",
        )],
    );
    env.submit(job("train").pods(2).each(4, 2).build());

    let p = env.plan();
    let placed: Vec<&Action> = p
        .actions
        .iter()
        .filter(|a| matches!(a, Action::Dispatch { .. } | Action::Offer { .. }))
        .collect();
    assert_eq!(placed.len(), 1, "one placement: {placed:#?}");
    let Action::Dispatch { cluster, hold, .. } = placed[0] else {
        panic!("a dispatch, not an offer: {placed:#?}");
    };
    assert_eq!(cluster, "aligned");
    // The placement held for it: both pods on the aligned node, one per NUMA zone.
    assert_eq!(hold.cluster, "aligned");
    assert!(
        hold.takes.iter().all(|t| &*t.node == "aligned-0"),
        "{hold:#?}"
    );
    let gpu = env
        .world
        .state
        .inventory
        .resources
        .id("nvidia.com/gpu")
        .expect("gpu");
    let mut per_zone = BTreeMap::new();
    for t in &hold.takes {
        for &(zone, r, v) in &t.zone_amounts {
            if r == gpu {
                *per_zone.entry(zone).or_insert(0) += v;
            }
        }
    }
    assert_eq!(per_zone, BTreeMap::from([(0, 2000), (1, 2000)]));

    for a in p.actions {
        env.execute(&a, true);
    }
    assert_eq!(env.where_("train"), "aligned");
    assert_eq!(env.job("train").cluster.as_deref(), Some("aligned"));
    assert!(!env.job("train").suspended);
    assert_eq!(
        cond(env.job("train"), condition::ADMITTED),
        Some(("True".into(), reason::DISPATCHED.into()))
    );
    assert_eq!(
        annotation(env.job("train"), CLUSTER_ANNOTATION).as_deref(),
        Some("aligned")
    );

    // A second identical gang finds no aligned room left: it waits, and says why.
    env.submit(job("train-2").pods(2).each(4, 2).build());
    let p = env.plan();
    assert!(dispatches(&p.actions).is_empty(), "{:#?}", p.actions);
    let WaitReason { reason: why, .. } = p
        .waiting
        .values()
        .next()
        .expect("the second gang's class waits");
    assert_eq!(*why, reason::NO_WORKER_FITS);
}

#[test]
fn a_job_asking_for_a_resource_no_node_lists_yet_starts_once_a_node_lists_it() {
    // Worker `a` lists no GPUs at first: the resource is unknown to the whole inventory.
    let nodes = |allocatable: &str| {
        crate::inventory::parse_yaml(&format!(
            "clusters:\n  - name: a\n    nodes:\n      - name: a1\n        allocatable: {{{allocatable}}}\n"
        ))
        .expect("inventory parses")
    };
    let mut env = Env::new(
        nodes("cpu: \"16\", memory: 64Gi, pods: \"110\""),
        vec![queue(
            "q",
            "clusters: [a]\nquota: {cpu: \"16\", nvidia.com/gpu: \"4\"}",
        )],
    );
    env.submit(job("train").each(2, 1).build());
    env.settle();
    env.advance(secs(30));
    env.settle();
    assert_eq!(env.job("train").cluster, None, "no node has a GPU yet");
    // Its GPUs are installed (the device plugin lists them): the Job starts there.
    env.world.set_inventory(Arc::new(nodes(
        "cpu: \"16\", memory: 64Gi, nvidia.com/gpu: \"4\", pods: \"110\"",
    )));
    env.advance(secs(1));
    env.settle();
    assert_eq!(env.job("train").cluster.as_deref(), Some("a"));
}

// ---------------------------------------------------------------------------------------------
// 2. Quota.

#[test]
fn a_burst_of_a_thousand_jobs_never_exceeds_the_queue_quota() {
    // 10 CPUs of quota, 3 CPUs per Job: 3 at a time, though the worker has room for 85.
    let mut env = Env::new(
        roomy(),
        vec![queue("q", "clusters: [a]\nquota: {cpu: \"10\"}")],
    );
    for i in 0..1000 {
        env.submit(
            job(&format!("burst-{i:04}"))
                .each(3, 0)
                .created(t0() + Duration::from_millis(i))
                .build(),
        );
    }
    let quota = 10_000;
    let check = |env: &Env| {
        let used = env.admitted_usage("q").get("cpu").copied().unwrap_or(0);
        assert!(used <= quota, "{used}m CPU admitted, quota {quota}m");
        let seen = env
            .world
            .ledger
            .queue_use("q")
            .map_or(0, |u| u.usage.get("cpu").copied().unwrap_or(0));
        assert_eq!(seen, used, "the queue's running total matches its Jobs");
    };
    let admitted = |env: &Env| {
        env.world
            .state
            .jobs
            .values()
            .filter(|j| j.holds_quota())
            .count()
    };

    let mut finished = 0;
    for round in 0..1000 {
        // Plan and carry out, checking after every action.
        for _ in 0..20 {
            let p = env.plan();
            if p.actions.is_empty() {
                break;
            }
            for a in &p.actions {
                env.execute(a, true);
                check(&env);
            }
        }
        // floor(10 / 3) = 3 admitted whenever that many are left.
        let left = env
            .world
            .state
            .jobs
            .values()
            .filter(|j| !j.finished())
            .count();
        assert_eq!(admitted(&env), left.min(3), "round {round}");
        // The oldest admitted Jobs run and finish, in turn.
        let running: Vec<String> = env
            .world
            .state
            .jobs
            .values()
            .filter(|j| j.cluster.is_some() && !j.finished())
            .map(|j| j.key.name.clone())
            .collect();
        for name in running.iter().take(1 + round % 3) {
            env.set_ready(name, 1);
            env.finish(name, true);
            finished += 1;
        }
        env.advance(secs(1));
        if finished >= 1000 {
            break;
        }
    }
    env.settle();
    check(&env);
    assert_eq!(finished, 1000);
    assert!(env
        .world
        .state
        .jobs
        .values()
        .all(|j| j.result == Some(JobResult::Succeeded)));
    assert!(env.refused.is_empty(), "{:?}", env.refused);
}

// ---------------------------------------------------------------------------------------------
// 3. Order and blockAdmission.

#[test]
fn higher_priority_goes_first_then_the_older_job() {
    // Quota for one Job at a time. Names and submission order are the reverse of the
    // expected order, so neither decides.
    let mut env = Env::new(
        roomy(),
        vec![queue("q", "clusters: [a]\nquota: {cpu: \"1\"}")],
    );
    env.submit(job("aaa-low-oldest").priority(0).created(t0()).build());
    env.submit(
        job("mmm-high-newer")
            .priority(10)
            .created(t0() + secs(20))
            .build(),
    );
    env.submit(
        job("zzz-high-older")
            .priority(10)
            .created(t0() + secs(10))
            .build(),
    );
    env.advance(secs(30));

    let mut order = Vec::new();
    for _ in 0..3 {
        let acts = env.settle();
        let d = dispatches(&acts);
        assert_eq!(d.len(), 1, "one at a time: {d:?}");
        order.push(d[0].0.clone());
        env.set_ready(&d[0].0, 1);
        env.finish(&d[0].0, true);
        env.advance(secs(5));
    }
    assert_eq!(
        order,
        ["zzz-high-older", "mmm-high-newer", "aaa-low-oldest"]
    );
}

#[test]
fn block_admission_holds_the_next_job_until_the_first_is_pods_ready() {
    let mut env = Env::new(
        roomy(),
        vec![queue(
            "q",
            "clusters: [a]\nwaitForPodsReady: {enabled: true, blockAdmission: true, timeout: 10m}",
        )],
    );
    env.submit(job("first").pods(2).created(t0()).build());
    env.submit(job("second").created(t0() + secs(1)).build());
    env.advance(secs(2));

    let acts = env.settle();
    assert_eq!(dispatches(&acts), [("first".into(), "a".into())]);
    let p = env.plan();
    assert_eq!(
        p.waiting.values().map(|w| w.reason).collect::<Vec<_>>(),
        [reason::WAITING_FOR_PODS_READY]
    );

    // One of two pods Ready: still blocked.
    env.advance(secs(30));
    env.set_ready("first", 1);
    let acts = env.settle();
    assert!(dispatches(&acts).is_empty(), "{acts:#?}");
    assert_eq!(
        cond(env.job("first"), condition::PODS_READY).map(|c| c.0),
        Some("False".into())
    );
    assert!(env.job("second").suspended);

    // Both Ready: PodsReady turns True and only then is the second admitted.
    env.advance(secs(30));
    env.set_ready("first", 2);
    let acts = env.settle();
    assert_eq!(dispatches(&acts), [("second".into(), "a".into())]);
    let (at, _) = env
        .done
        .iter()
        .find(|(_, a)| matches!(a, Action::Dispatch { job, .. } if job.name == "second"))
        .expect("second dispatched");
    let ready_at = condition(env.job("first"), condition::PODS_READY)
        .and_then(|c| c.last_transition_time.clone())
        .map(|t| to_system_time(&t.0))
        .expect("PodsReady has a transition time");
    assert!(is_true(env.job("first"), condition::PODS_READY));
    assert!(ready_at <= *at);
    // The status write that made first PodsReady came before second's dispatch.
    let write = env
        .done
        .iter()
        .position(|(_, a)| matches!(a, Action::WriteStatus { job, status, .. } if job.name == "first" && status.conditions().iter().any(|c| c.type_ == condition::PODS_READY && c.status == "True")))
        .expect("PodsReady=True written");
    let dispatch = env
        .done
        .iter()
        .position(|(_, a)| matches!(a, Action::Dispatch { job, .. } if job.name == "second"))
        .expect("second dispatched");
    assert!(write < dispatch);
}

#[test]
fn a_gang_that_spreads_over_nodes_goes_where_its_spread_fits() {
    // `busy`: three nodes of 16 CPUs, one of them full; `calm`: two of 16, both free. The
    // gang's 4 pods of 4 CPUs fit `busy` packed, or spread as 2 + 2 on its free nodes, but
    // its full node counts with none, so a node may take one: 2 of 4. In `calm`, 2 + 2.
    let inv = InventoryBuilder::default()
        .cluster("busy")
        .node("busy-0", 16, 0)
        .node("busy-1", 16, 0)
        .busy(16, 0)
        .node("busy-2", 16, 0)
        .cluster("calm")
        .node("calm-0", 16, 0)
        .node("calm-1", 16, 0)
        .build();
    let mut env = Env::new(
        inv,
        vec![queue("q", "clusters: [busy, calm]\nplacement: {fanout: 1}")],
    );
    env.submit(job("spread").pods(4).each(4, 0).spread(1).build());
    env.submit(job("packed").pods(4).each(4, 0).build());
    env.settle();
    assert_eq!(env.job("packed").cluster.as_deref(), Some("busy"));
    assert_eq!(env.job("spread").cluster.as_deref(), Some("calm"));
    // Where only `busy` is: it waits for the full node to drain (then 2 + 1 + 1), saying why.
    let mut env = Env::new(
        InventoryBuilder::default()
            .cluster("busy")
            .node("busy-0", 16, 0)
            .node("busy-1", 16, 0)
            .busy(16, 0)
            .node("busy-2", 16, 0)
            .build(),
        vec![queue("q", "clusters: [busy]")],
    );
    env.submit(job("spread").pods(4).each(4, 0).spread(1).build());
    let p = env.plan();
    let spread = env.job("spread");
    let why = (p.job_waiting.get(&spread.key))
        .or_else(|| p.waiting.get(&spread.class()))
        .expect("spread waits");
    assert_eq!(
        why.message,
        "no worker can take the gang of 4 pods now: busy: only 2 of 4 pods fit at once in cluster busy; then: its pods spread over nodes (a topology spread constraint on kubernetes.io/hostname, maxSkew 1): node busy-1 of cluster busy takes 0 of them, so no node may take more than 1"
    );
}

#[test]
fn a_gang_that_keeps_one_pod_to_a_node_goes_where_there_are_nodes_enough() {
    // `tall`: two nodes of 32 CPUs, room for the whole gang two to a node; `wide`: four of 8.
    // `tall` comes first and is the emptier: a gang packed two to a node would go there, and
    // half its pods would stay Pending.
    let inv = InventoryBuilder::default()
        .cluster("tall")
        .node("tall-0", 32, 0)
        .node("tall-1", 32, 0)
        .cluster("wide")
        .node("wide-0", 8, 0)
        .node("wide-1", 8, 0)
        .node("wide-2", 8, 0)
        .node("wide-3", 8, 0)
        .build();
    let mut env = Env::new(
        inv,
        vec![queue("q", "clusters: [tall, wide]\nplacement: {fanout: 1}")],
    );
    env.submit(job("train").pods(4).each(4, 0).one_per_node().build());
    // The same gang without the anti-affinity fits `tall`.
    env.submit(job("packed").pods(4).each(4, 0).build());
    let p = env.plan();
    let placed: BTreeMap<String, (String, Vec<String>)> = p
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::Dispatch {
                job: key,
                cluster,
                hold,
                ..
            } => Some((
                key.name.clone(),
                (
                    cluster.clone(),
                    hold.takes.iter().map(|t| t.node.to_string()).collect(),
                ),
            )),
            _ => None,
        })
        .collect();
    let (cluster, mut nodes) = placed["train"].clone();
    nodes.sort();
    assert_eq!(cluster, "wide");
    assert_eq!(nodes, ["wide-0", "wide-1", "wide-2", "wide-3"]);
    assert_eq!(placed["packed"].0, "tall");

    // A gang of five such pods never fits: no worker of the queue has five nodes.
    env.submit(job("five").pods(5).each(1, 0).one_per_node().build());
    env.settle();
    assert_eq!(env.job("five").cluster, None);
    let p = env.plan();
    let five = env.job("five");
    let why = (p.job_waiting.get(&five.key))
        .or_else(|| p.waiting.get(&five.class()))
        .expect("five waits");
    assert_eq!(why.reason, reason::NEVER_FITS, "{}", why.message);
    assert!(why.message.contains("one to a node"), "{}", why.message);
}
