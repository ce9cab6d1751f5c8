//! Live inventories from worker clusters through the real `kube::Client` and kube-runtime
//! watchers, against fake API servers on loopback: list then watch, watches that end and
//! resume, 410 Gone, 500s, a worker that never answers, a quiet one whose watches carry no
//! bookmark, NodeResourceTopology arriving late.

mod common;

use common::fake_api::{self, FakeApi, NODES, NRTS, PODS};
use prometheus_client::metrics::counter::Counter;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use switchyard::inventory::{Inventory, InventoryStore};
use switchyard::workers::hub::{self, Hub};
use switchyard::workers::watch::{self, WatchOptions};

struct Live {
    store: Arc<InventoryStore>,
    _hub: tokio::task::JoinHandle<()>,
}

fn start(workers: &[(&str, &FakeApi)], stale_after: Duration) -> Live {
    start_counting(workers, stale_after, None)
}

/// As [`start`], counting every watch restart in `restarts`.
fn start_counting(
    workers: &[(&str, &FakeApi)],
    stale_after: Duration,
    restarts: Option<Counter>,
) -> Live {
    start_timed(
        workers,
        stale_after,
        restarts,
        common::fleet::fast_watches(),
    )
}

/// As [`start_counting`], with these watch timings.
fn start_timed(
    workers: &[(&str, &FakeApi)],
    stale_after: Duration,
    restarts: Option<Counter>,
    timings: watch::WatchTimings,
) -> Live {
    let store = Arc::new(InventoryStore::default());
    let mut h = Hub::new(store.clone(), stale_after);
    let (tx, rx) = tokio::sync::mpsc::channel(1024);
    for (name, api) in workers {
        h.add_worker(name, Default::default(), SystemTime::now());
        let options = WatchOptions {
            probe_every: Duration::from_millis(200),
            probe_timeout: Duration::from_millis(500),
            timings: timings.clone(),
            restarts: restarts.clone(),
        };
        tokio::spawn(watch::run(
            name.to_string(),
            api.client(),
            tx.clone(),
            options,
        ));
    }
    let hub = tokio::spawn(hub::run(h, rx, Duration::from_millis(50)));
    Live { store, _hub: hub }
}

async fn wait_for(what: &str, store: &InventoryStore, cond: impl Fn(&Inventory) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if cond(&store.snapshot()) {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn free_cpu(inv: &Inventory, node: &str) -> Option<i64> {
    let (_, n) = inv.node(node)?;
    Some(n.free(inv.resources.id("cpu")?))
}

fn zones(inv: &Inventory, node: &str) -> usize {
    inv.node(node)
        .and_then(|(_, n)| n.numa.as_ref())
        .map_or(0, |t| t.zones.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_then_watch_feeds_the_inventory_incrementally() {
    let api = FakeApi::start().await;
    api.upsert(NODES, fake_api::node("w1-a", 32, 4));
    api.upsert(PODS, fake_api::pod("p1", "w1-a", 4));
    let live = start(&[("w1", &api)], Duration::from_secs(30));
    wait_for("the listed node and pod", &live.store, |inv| {
        free_cpu(inv, "w1-a") == Some(28_000)
    })
    .await;

    // Events after start-up: a new node, a new pod, a NodeResourceTopology arriving late.
    api.upsert(NODES, fake_api::node("w1-b", 16, 0));
    api.upsert(PODS, fake_api::pod("p2", "w1-a", 2));
    api.upsert(NRTS, fake_api::nrt("w1-a", (2, 4)));
    wait_for("events after start", &live.store, |inv| {
        free_cpu(inv, "w1-a") == Some(26_000)
            && inv.node("w1-b").is_some()
            && zones(inv, "w1-a") == 2
    })
    .await;

    // The watches end every 2 s (timeoutSeconds) and resume from their resourceVersion:
    // events emitted after that still arrive, and no relist was needed.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    api.delete(PODS, "p1");
    api.delete(NODES, "w1-b");
    wait_for("events after the watch resumed", &live.store, |inv| {
        free_cpu(inv, "w1-a") == Some(30_000) && inv.node("w1-b").is_none()
    })
    .await;
    let requests = api.requests();
    let node_lists = requests
        .iter()
        .filter(|r| r.starts_with("/api/v1/nodes?") && !r.contains("watch=true"))
        .count();
    assert_eq!(node_lists, 1, "resumed without listing again: {requests:?}");
    let urls: Vec<&String> = requests
        .iter()
        .filter(|r| r.starts_with("/api/v1/nodes?") && r.contains("watch=true"))
        .collect();
    let watches = api.watches(NODES);
    assert!(watches.len() >= 2, "the node watch resumed: {urls:?}");
    assert_eq!(watches.len(), urls.len());
    for (w, url) in watches.iter().zip(&urls) {
        let rv = url
            .split(['?', '&'])
            .find_map(|kv| kv.strip_prefix("resourceVersion="))
            .unwrap_or_default();
        assert_eq!(rv, w.from.to_string(), "{url}");
        assert!(url.contains("allowWatchBookmarks=true"), "{url}");
    }
    assert!(
        watches[0].from > 0,
        "the first watch starts from the list's resourceVersion"
    );
    for pair in watches.windows(2) {
        let last_seen = pair[0].last_sent.expect("each watch ends with a bookmark");
        assert_eq!(
            pair[1].from, last_seen,
            "resumed from exactly the last resourceVersion the previous watch sent: {watches:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gone_watches_relist_and_failed_lists_are_retried() {
    let api = FakeApi::start().await;
    api.upsert(NODES, fake_api::node("w1-a", 32, 4));
    api.fail_next_lists(2);
    let live = start(&[("w1", &api)], Duration::from_secs(30));
    wait_for("the node after two failed lists", &live.store, |inv| {
        inv.node("w1-a").is_some()
    })
    .await;

    let lists_before = api
        .requests()
        .iter()
        .filter(|r| !r.contains("watch=true") && r.starts_with("/api/v1/nodes"))
        .count();
    api.expire_next_watches(NODES, 1);
    // Let the current node watch end so the next one meets the 410.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    api.upsert(NODES, fake_api::node("w1-c", 8, 0));
    wait_for("the node added around the relist", &live.store, |inv| {
        inv.node("w1-c").is_some()
    })
    .await;
    let lists_after = api
        .requests()
        .iter()
        .filter(|r| !r.contains("watch=true") && r.starts_with("/api/v1/nodes"))
        .count();
    assert!(
        lists_after > lists_before,
        "410 Gone made the watcher list again"
    );
    assert!(
        live.store.snapshot().node("w1-a").is_some(),
        "a relist keeps what still exists"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_never_answers_goes_stale_without_delaying_the_others() {
    let (a, b, hung) = (
        FakeApi::start().await,
        FakeApi::start().await,
        FakeApi::start().await,
    );
    a.upsert(NODES, fake_api::node("a-1", 8, 0));
    b.upsert(NODES, fake_api::node("b-1", 8, 0));
    hung.upsert(NODES, fake_api::node("h-1", 8, 0));
    hung.set_hang(true);
    let started = Instant::now();
    let live = start(
        &[("a", &a), ("b", &b), ("hung", &hung)],
        Duration::from_millis(1500),
    );
    wait_for("both answering workers", &live.store, |inv| {
        inv.node("a-1").is_some() && inv.node("b-1").is_some()
    })
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the hung worker delayed the others"
    );
    // Unavailable from the start (never listed), then stale.
    wait_for("the hung worker marked stale", &live.store, |inv| {
        inv.cluster("hung").is_some_and(|c| {
            c.unavailable
                .as_deref()
                .is_some_and(|w| w.contains("stale"))
        })
    })
    .await;
    let inv = live.store.snapshot();
    let why = inv.cluster("hung").unwrap().unavailable.clone().unwrap();
    assert!(why.contains("stale"), "{why}");
    assert!(inv.cluster("a").unwrap().unavailable.is_none());
    // Once it answers again it is schedulable again.
    hung.set_hang(false);
    wait_for("the worker back", &live.store, |inv| {
        inv.node("h-1").is_some() && inv.cluster("hung").is_some_and(|c| c.unavailable.is_none())
    })
    .await;
}

/// kube-apiserver sends no bookmark on a collection where nothing changes: a quiet worker's
/// watches end at their timeout without a line. Each such clean end proves the worker
/// current, so it never goes stale, however long it stays quiet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_worker_whose_watches_end_without_bookmarks_stays_fresh() {
    let api = FakeApi::start().await;
    api.upsert(NODES, fake_api::node("q-1", 8, 0));
    api.upsert(NRTS, fake_api::nrt("q-1", (2, 4)));
    api.withhold_bookmarks(true);
    // The fake ends every watch after 2 s; stale after 3 s without proof.
    let timings = watch::WatchTimings {
        idle_timeout: Duration::from_secs(4),
        ..common::fleet::fast_watches()
    };
    let live = start_timed(&[("quiet", &api)], Duration::from_secs(3), None, timings);
    wait_for("the quiet worker listed", &live.store, |inv| {
        zones(inv, "q-1") == 2
            && inv
                .cluster("quiet")
                .is_some_and(|c| c.unavailable.is_none())
    })
    .await;
    let until = Instant::now() + Duration::from_secs(8);
    while Instant::now() < until {
        let inv = live.store.snapshot();
        let why = inv.cluster("quiet").and_then(|c| c.unavailable.clone());
        assert_eq!(why, None, "a quiet worker went unavailable");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let watches = api.watches(NODES);
    assert!(
        watches.len() >= 3,
        "the node watch ended and resumed: {watches:?}"
    );
    assert!(
        watches.iter().all(|w| w.last_sent.is_none()),
        "no watch sent a line: {watches:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_topology_crd_nodes_still_arrive_and_numa_data_follows_it() {
    let api = FakeApi::start().await;
    api.set_nrt_missing(true);
    api.upsert(NODES, fake_api::node("w1-a", 32, 4));
    let live = start(&[("w1", &api)], Duration::from_secs(30));
    wait_for("the node without NUMA data", &live.store, |inv| {
        inv.node("w1-a").is_some()
    })
    .await;
    assert_eq!(zones(&live.store.snapshot(), "w1-a"), 0);
    api.set_nrt_missing(false);
    api.upsert(NRTS, fake_api::nrt("w1-a", (4, 4)));
    wait_for("NUMA zones once the CRD exists", &live.store, |inv| {
        zones(inv, "w1-a") == 2
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absent_topology_crd_is_looked_for_again_without_counting_restarts() {
    let api = FakeApi::start().await;
    api.set_nrt_missing(true);
    api.upsert(NODES, fake_api::node("w1-a", 32, 4));
    let restarts = Counter::default();
    let live = start_counting(
        &[("w1", &api)],
        Duration::from_secs(30),
        Some(restarts.clone()),
    );
    wait_for("the node", &live.store, |inv| inv.node("w1-a").is_some()).await;
    // Several re-checks (every 300 ms here): none is a failure.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let checks = api.count("GET", "/noderesourcetopologies");
    assert!(
        (2..=8).contains(&checks),
        "re-checked at its pace: {checks}"
    );
    assert_eq!(restarts.get(), 0, "an absent CRD is no watch restart");
    assert!(live
        .store
        .snapshot()
        .cluster("w1")
        .unwrap()
        .unavailable
        .is_none());
    // Installed later: picked up at the next check.
    api.set_nrt_missing(false);
    api.upsert(NRTS, fake_api::nrt("w1-a", (4, 4)));
    wait_for("NUMA zones", &live.store, |inv| zones(inv, "w1-a") == 2).await;
    assert_eq!(restarts.get(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_without_standalone_feeds_the_extender_from_the_cluster_it_runs_in() {
    use common::tls_client::{connect, connector_from_dir};
    let api = FakeApi::start().await;
    api.upsert(NODES, fake_api::node("live-1", 8, 0));
    api.upsert(NODES, fake_api::node("live-2", 2, 0));
    let dir = tempfile::tempdir().unwrap();
    let mut settings = switchyard::config::ServeSettings::for_tests(
        switchyard::config::TlsSource::Dev(dir.path().into()),
    );
    settings.standalone = false;
    let running = switchyard::server::start_with_client(settings, Some(api.client()))
        .await
        .unwrap();
    let tls = connector_from_dir(dir.path());
    let mut conn = connect(&tls, running.https_addr, "localhost")
        .await
        .unwrap();
    let body = serde_json::json!({
        "Pod": {"metadata": {"name": "p", "namespace": "default", "uid": "u1", "resourceVersion": "1"},
                "spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "4"}}}]}},
        "NodeNames": ["live-1", "live-2"],
        "Nodes": null
    });
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (status, reply) = conn
            .post_json("/scheduler/filter", serde_json::to_vec(&body).unwrap())
            .await;
        assert_eq!(status, 200);
        let reply: serde_json::Value = serde_json::from_slice(&reply).unwrap();
        if reply["NodeNames"] == serde_json::json!(["live-1"]) {
            let why = reply["FailedAndUnresolvableNodes"]["live-2"]
                .as_str()
                .unwrap();
            assert!(why.contains("needs 4 cpu"), "{why}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the live inventory never reached the extender: {reply}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_cluster_whose_pods_cannot_be_listed_goes_stale_with_the_reason() {
    let api = FakeApi::start().await;
    api.upsert(NODES, fake_api::node("l-1", 8, 0));
    api.refuse(fake_api::Refusal {
        method: "GET",
        plural: "pods",
        sub: None,
        code: 403,
        reason: "Forbidden",
        message: "pods is forbidden: User \"system:serviceaccount:switchyard-system:switchyard\" cannot list resource \"pods\" in API group \"\" at the cluster scope".into(),
    });
    let live = start(&[("local", &api)], Duration::from_millis(1500));
    wait_for("the node", &live.store, |inv| inv.node("l-1").is_some()).await;
    // Probes answer all along; the pods never arrive.
    wait_for(
        "the cluster unschedulable, then stale",
        &live.store,
        |inv| {
            inv.cluster("local").is_some_and(|c| {
                c.unavailable
                    .as_deref()
                    .is_some_and(|w| w.contains("stale"))
            })
        },
    )
    .await;
    let why = live
        .store
        .snapshot()
        .cluster("local")
        .unwrap()
        .unavailable
        .clone()
        .unwrap();
    assert!(why.contains("stale") && why.contains("pod"), "{why}");
    assert!(why.contains("forbidden"), "the reason: {why}");
    // The worker still answers its probes (their interval, not the pod list, sets when the
    // first one is made: on a loaded machine it may come after the cluster went stale).
    common::dispatch::eventually(15, "a version probe answered", || {
        api.count("GET", "/version") > 0
    })
    .await;
    // Granted: fresh again.
    api.clear_refusals();
    wait_for("the cluster fresh again", &live.store, |inv| {
        inv.cluster("local")
            .is_some_and(|c| c.unavailable.is_none())
    })
    .await;
}
