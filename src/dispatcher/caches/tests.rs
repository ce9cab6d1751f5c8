//! The caches' own bookkeeping: which nodes changed since a count was made, and the room per
//! pod shape kept across passes. (That the caches never change a decision is held by the
//! comparisons of cached and plain runs in the dispatcher's tests.)

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
