use super::*;
use crate::simulate::scenario::KueueSpec;

fn amounts(pairs: &[(&str, i64)]) -> Amounts {
    pairs.iter().map(|(r, v)| (r.to_string(), *v)).collect()
}

fn kueue(strict: bool) -> SimKueue {
    SimKueue::new(Arc::new(KueueSpec {
        local_queue: "default".into(),
        quota: amounts(&[("cpu", 8000), ("memory", 32 << 30)]),
        strict,
        local_workloads: Vec::new(),
    }))
}

fn copy(uid: &str) -> Admittee {
    Admittee::Copy(uid.into())
}

#[test]
fn strict_fifo_admits_in_order_and_a_head_that_does_not_fit_holds_back_the_rest() {
    let mut k = kueue(true);
    k.enqueue(copy("a"), amounts(&[("cpu", 6000)]), 0);
    k.enqueue(copy("b"), amounts(&[("cpu", 4000)]), 0);
    k.enqueue(copy("c"), amounts(&[("cpu", 1000)]), 0);
    assert_eq!(k.admit(), [copy("a")]);
    assert_eq!(k.reserved()["cpu"], 6000);
    // b (4 CPUs) does not fit the 2 left; c would, but waits behind b.
    assert!(k.admit().is_empty());
    assert!(k.remove(&copy("a")), "a held quota");
    assert_eq!(k.admit(), [copy("b"), copy("c")]);
    assert_eq!(k.reserved(), amounts(&[("cpu", 5000), ("memory", 0)]));
}

#[test]
fn best_effort_fifo_lets_later_workloads_that_fit_go_first() {
    let mut k = kueue(false);
    k.enqueue(copy("a"), amounts(&[("cpu", 6000)]), 0);
    k.enqueue(copy("b"), amounts(&[("cpu", 4000)]), 0);
    k.enqueue(copy("c"), amounts(&[("cpu", 1000)]), 0);
    assert_eq!(k.admit(), [copy("a"), copy("c")]);
    assert_eq!(k.admitted().collect::<Vec<_>>(), [&copy("a"), &copy("c")]);
}

#[test]
fn higher_priority_goes_first_and_what_can_never_fit_holds_back_nothing() {
    let mut k = kueue(true);
    k.enqueue(copy("big"), amounts(&[("cpu", 9000)]), 10);
    k.enqueue(copy("gpu"), amounts(&[("nvidia.com/gpu", 1000)]), 10);
    k.enqueue(copy("low"), amounts(&[("cpu", 2000)]), 0);
    k.enqueue(Admittee::Local(0), amounts(&[("cpu", 6000)]), 5);
    // Neither `big` (more than the whole quota) nor `gpu` (not covered) ever fits: the
    // local workload of priority 5 goes first, then the rest by priority.
    assert_eq!(k.admit(), [Admittee::Local(0), copy("low")]);
    // A pending workload removed gave back nothing.
    assert!(!k.remove(&copy("big")));
}

#[test]
fn the_dispatcher_reads_one_cluster_queue_behind_a_local_queue_in_every_namespace() {
    let mut k = kueue(true);
    k.enqueue(copy("a"), amounts(&[("cpu", 6000), ("memory", 1 << 30)]), 0);
    k.admit();
    let view = k.view(&["default".into(), "research".into()]);
    assert_eq!(
        view.cluster_queue_of("research", "default"),
        Some(CLUSTER_QUEUE)
    );
    assert_eq!(view.cluster_queue_of("research", "other"), None);
    // The headroom rule reads it as a live ClusterQueue's status.
    let need = amounts(&[("cpu", 3000)]);
    let short = view
        .short("research", "default", &need, &[])
        .expect("short");
    assert_eq!(
        short.describe("research", "default"),
        "its Kueue ClusterQueue \"cluster-queue\" has 2 cpu of quota free, the gang needs 3"
    );
    assert_eq!(
        view.short("default", "default", &amounts(&[("cpu", 2000)]), &[]),
        None
    );
}
