//! The caches' own bookkeeping: which nodes changed since a count was made, the held views
//! brought up to date, and the room per pod shape kept across passes. (That the caches never
//! change a decision is held by the comparisons of cached and plain runs in the dispatcher's
//! tests.)

use super::*;
use crate::dispatcher::job::ClassKey;
use crate::inventory::parse_yaml;

#[test]
fn every_node_whose_room_changed_either_way_is_told_to_whoever_counted_before() {
    let queues = BTreeMap::new();
    let mut caches = Caches::default();
    assert_eq!(caches.touches("a", 0), Some((&[][..], 0)), "nothing yet");
    caches.capacity_changed_on("a", 3); // gained room
    caches.node_lost_room("a", 5); // lost room: no capacity epoch for that
    assert_eq!(caches.capacity_epoch("a"), 1);
    let end = caches.touches_end("a");
    assert_eq!(caches.touches("a", 0), Some((&[3, 5][..], end)));
    caches.node_lost_room("a", 3);
    assert_eq!(caches.touches("a", end), Some((&[3][..], end + 1)));
    // A change to the whole worker: whoever counted before it counts every node again.
    let before = caches.touches_end("a");
    caches.capacity_changed("a", &queues);
    assert_eq!(caches.touches("a", before), None);
    assert_eq!(caches.touches("a", 0), None);
    let after = caches.touches_end("a");
    assert_eq!(caches.touches("a", after), Some((&[][..], after)));
    // A long log keeps its recent half: a reader further behind counts everything again.
    for i in 0..100_000 {
        caches.node_lost_room("a", i % 7);
    }
    assert_eq!(caches.touches("a", after), None);
    let end = caches.touches_end("a");
    assert_eq!(end, after + 100_000);
    assert_eq!(caches.touches("a", end - 2).map(|(n, _)| n.len()), Some(2));
    assert_eq!(
        caches.touches("b", 3),
        None,
        "a worker never seen, asked past its start"
    );
}

#[test]
fn the_room_kept_per_shape_does_not_outlive_its_workers_and_shapes() {
    let inventory = parse_yaml(
        "clusters:\n  - name: a\n    nodes:\n      - name: a1\n        allocatable: {cpu: \"8\", memory: 8Gi, pods: \"110\"}\n",
    )
    .expect("inventory parses");
    let mut caches = Caches::default();
    let room = |n: u64| -> ShapeRooms {
        let mut rooms = ShapeRooms::default();
        for worker in ["a", "gone"] {
            for shape in 0..n {
                rooms
                    .entry(worker.to_string())
                    .or_default()
                    .insert(shape, ShapeRoom::default());
            }
        }
        rooms
    };
    // Nothing pending any more: a long-running dispatcher that saw many shapes come and go,
    // in a worker it still has and in one it no longer has.
    let nothing_pending: BTreeMap<ClassKey, ()> = BTreeMap::new();
    caches.keep_shape_rooms(room(40), &inventory, &nothing_pending);
    let kept = caches.take_shape_rooms();
    assert!(
        !kept.contains_key("gone"),
        "a worker no longer in the inventory"
    );
    assert_eq!(kept.get("a").map(|m| m.len()), Some(0), "shapes no Job has");
    // A few shapes stay without a look at the pending Jobs.
    let mut few = room(3);
    few.remove("gone");
    caches.keep_shape_rooms(few, &inventory, &nothing_pending);
    assert_eq!(caches.take_shape_rooms()["a"].len(), 3);
}

#[test]
fn a_bound_pod_shape_is_kept_while_the_resource_table_stays_the_same() {
    let inventory = |resources: &str| {
        parse_yaml(&format!(
            "clusters:\n  - name: a\n    nodes:\n      - name: a1\n        allocatable: {{{resources}}}\n"
        ))
        .expect("inventory parses")
    };
    let plain = inventory("cpu: \"8\", memory: 8Gi, pods: \"110\"");
    let view: crate::placement::PodView = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ml", "uid": "u"},
        "spec": {"containers": [{"name": "main", "resources": {"requests": {
            "cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"
        }}}]}
    }))
    .expect("pod parses");
    let shape = crate::placement::PodShape::from_view(&view).expect("pod is valid");
    let bind = |inv: &Inventory| Arc::new(shape.bind(&inv.resources));
    let ids = |b: &BoundPod| -> Vec<Option<usize>> { b.node_request.iter().map(|a| a.0).collect() };
    let pending: BTreeMap<ClassKey, ()> = BTreeMap::new();
    let mut caches = Caches::default();
    assert!(
        caches.bound_pods(&plain.resources).is_none(),
        "nothing kept yet"
    );
    caches.keep_bound(vec![(7, bind(&plain))], &plain.resources, &pending);
    let kept = caches
        .bound_pods(&plain.resources)
        .expect("kept for the same table");
    assert_eq!(ids(&kept[&7]), ids(&bind(&plain)), "as binding afresh");
    // A table that learnt a resource (here the GPUs the pod asks for) binds anew.
    let gpus = inventory("cpu: \"8\", memory: 8Gi, nvidia.com/gpu: \"8\", pods: \"110\"");
    assert!(caches.bound_pods(&gpus.resources).is_none());
    assert_ne!(ids(&bind(&gpus)), ids(&bind(&plain)));
    caches.keep_bound(vec![(7, bind(&gpus))], &gpus.resources, &pending);
    let kept = caches
        .bound_pods(&gpus.resources)
        .expect("kept for the new table");
    assert_eq!(ids(&kept[&7]), ids(&bind(&gpus)));
    assert!(
        caches.bound_pods(&plain.resources).is_none(),
        "the old table's are gone"
    );
    // Many shapes and no pending Job: only the shapes a pending Job has are kept.
    let many: Vec<_> = (0..40).map(|k| (k, bind(&gpus))).collect();
    caches.keep_bound(many, &gpus.resources, &pending);
    assert_eq!(caches.bound_pods(&gpus.resources).map(|m| m.len()), Some(0));
}

/// A held view brought up to date in place answers as the worker made afresh with its holds
/// taken off, as holds come and go and the inventory's nodes change; the nodes nothing is
/// held on stay the inventory's own, and a held node that nothing changed is kept.
#[test]
fn a_held_view_brought_up_to_date_is_the_worker_with_its_holds_taken_off() {
    use crate::dispatcher::ledger::{Hold, HoldKind};
    use crate::dispatcher::oracle::view::with_holds_taken_off;
    use crate::placement::inflight::Take;
    use std::time::SystemTime;

    let inventory = parse_yaml(
        "clusters:\n  - name: a\n    nodes:\n      - name: a1\n        allocatable: {cpu: \"8\", memory: 8Gi, pods: \"110\"}\n      - name: a2\n        allocatable: {cpu: \"8\", memory: 8Gi, pods: \"110\"}\n      - name: a3\n        allocatable: {cpu: \"8\", memory: 8Gi, pods: \"110\"}\n",
    )
    .expect("inventory parses");
    let cpu = inventory.resources.id("cpu").expect("cpu is listed");
    let mut base = inventory.clusters[0].clone();
    let hold = |uid: &str, node: &Arc<Node>, index: usize, millis: i64| Hold {
        job_uid: uid.to_string(),
        cluster: "a".to_string(),
        takes: vec![Take {
            node: node.name.clone(),
            index,
            amounts: vec![(cpu, millis)],
            zone_amounts: Vec::new(),
        }],
        kind: HoldKind::Dispatched,
        since: SystemTime::UNIX_EPOCH,
        serial: 0,
    };
    let requested =
        |c: &Cluster| -> Vec<Vec<i64>> { c.nodes.iter().map(|n| n.requested.clone()).collect() };
    let check = |view: &HeldView, base: &Arc<Cluster>, ledger: &Ledger, step: &str| {
        let afresh = with_holds_taken_off(base, ledger.holds_in("a"));
        assert_eq!(requested(&view.view), requested(&afresh), "{step}");
        let held: Vec<usize> = view.held.iter().map(|n| n.index).collect();
        for (i, (mine, own)) in view.view.nodes.iter().zip(&base.nodes).enumerate() {
            assert_eq!(
                Arc::ptr_eq(mine, own),
                !held.contains(&i),
                "{step}: node {i} is the inventory's own unless held on"
            );
        }
    };

    let mut ledger = Ledger::default();
    ledger.hold(hold("j1", &base.nodes[0], 0, 2000));
    let mut view = HeldView::of(&base);
    oracle::held_view(&mut view, &ledger, "a", &base, 1);
    check(&view, &base, &ledger, "one hold");
    let first = Arc::as_ptr(&view.view);

    // The hold moves from the first node to the second.
    ledger.release("j1");
    ledger.hold(hold("j2", &base.nodes[1], 1, 3000));
    oracle::held_view(&mut view, &ledger, "a", &base, 2);
    check(&view, &base, &ledger, "the hold moved");
    assert_eq!(Arc::as_ptr(&view.view), first, "changed in place");
    let held_node = view.view.nodes[1].clone();

    // A pod starts on the third node: the inventory's cluster is another one.
    let changed = Arc::make_mut(&mut Arc::make_mut(&mut base).nodes[2]);
    changed.requested[cpu] += 1000;
    assert!(!view.is_current(&base, 2));
    oracle::held_view(&mut view, &ledger, "a", &base, 2);
    check(&view, &base, &ledger, "a node changed");
    assert!(
        Arc::ptr_eq(&view.view.nodes[1], &held_node),
        "the held node nothing changed is kept"
    );

    // Something still shares the view (a pass that made it): it is copied, not changed.
    let shared = view.view.clone();
    ledger.release("j2");
    oracle::held_view(&mut view, &ledger, "a", &base, 3);
    check(&view, &base, &ledger, "no hold left");
    assert_eq!(requested(&shared)[1][cpu], requested(&base)[1][cpu] + 3000);
}
