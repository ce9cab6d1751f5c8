//! The WorkerCluster controller against fake API servers on loopback, through the real
//! `kube::Client`: a manager API server (WorkerClusters, kubeconfig Secrets, status patches)
//! and worker API servers over HTTPS reached with the kubeconfigs the Secrets hold.
//! Kubeconfig rotation, every unsafe kubeconfig refused in the status, missing Secrets,
//! unreachable and hanging workers, status summaries, leadership, removal, rate limits.

mod common;

use common::fake_api::{self, FakeApi, NODES, NRTS, PODS, SECRETS, WORKER_CLUSTERS};
use common::fleet::{
    active, answering_options, node_names, options, reason_is, wait_inventory, Fleet, NS, WAIT,
};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_kubeconfig_connects_and_a_rotation_rebuilds_the_client() {
    let (a, b) = (FakeApi::start_tls().await, FakeApi::start_tls().await);
    a.upsert(NODES, fake_api::node("a-1", 32, 4));
    b.upsert(NODES, fake_api::node("b-1", 16, 0));
    a.require_token("token-1");
    let fleet = Fleet::start().await;
    fleet.add("w1", &a.kubeconfig("token-1"));

    let v = fleet
        .view("w1", "connected", |v| v.connected && v.active)
        .await;
    assert_eq!(v.client_generation, 1);
    assert_eq!(v.reason, "Connected");
    assert_eq!(v.labels["tier"], "gold");
    assert!(v.disconnected_since.is_none());
    assert_eq!(node_names(v.client.unwrap()).await, vec!["a-1"]);
    wait_inventory(&fleet.store, "a-1 in w1", |inv| {
        inv.node("a-1").is_some_and(|(c, _)| c.name == "w1")
    })
    .await;
    let s = fleet
        .wait_status("w1", "Active=True", reason_is("Connected"))
        .await;
    assert_eq!(active(&s).0, "True");
    assert_eq!(s["conditions"][0]["observedGeneration"], 1);

    // The Secret now points at another server: a new client, requests go there.
    fleet.secret("w1-kubeconfig", &b.kubeconfig("token-2"));
    let v = fleet
        .view("w1", "the rotated client", |v| {
            v.client_generation == 2 && v.connected
        })
        .await;
    assert_eq!(node_names(v.client.unwrap()).await, vec!["b-1"]);
    wait_inventory(&fleet.store, "b-1 instead of a-1", |inv| {
        inv.node("b-1").is_some() && inv.node("a-1").is_none()
    })
    .await;
    assert!(b
        .recorded()
        .iter()
        .all(|r| r.authorization.as_deref() == Some("Bearer token-2")));

    // Only the token changes: a new client again, carrying the new token.
    b.require_token("token-3");
    fleet.secret("w1-kubeconfig", &b.kubeconfig("token-3"));
    let v = fleet
        .view("w1", "the client with the new token", |v| {
            v.client_generation == 3 && v.connected
        })
        .await;
    assert_eq!(node_names(v.client.unwrap()).await, vec!["b-1"]);
    assert!(b
        .recorded()
        .iter()
        .any(|r| r.authorization.as_deref() == Some("Bearer token-3")));

    let text = fleet.metrics.encode();
    assert!(
        text.contains("switchyard_worker_connected{cluster=\"w1\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("switchyard_worker_request_duration_seconds_count{cluster=\"w1\"}"),
        "{text}"
    );
    assert!(
        text.contains("switchyard_worker_watch_restarts_total{cluster=\"w1\"}"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_unsafe_kubeconfig_is_refused_in_the_status_with_its_reason() {
    let worker = FakeApi::start_tls().await;
    let good = worker.kubeconfig("tok");
    let ca_line = good
        .lines()
        .find(|l| l.contains("certificate-authority-data"))
        .unwrap()
        .to_string();
    let with = |from: &str, to: &str| {
        assert!(good.contains(from), "{from}");
        good.replace(from, to)
    };
    let cases = [
        ("http", with("server: https://", "server: http://"), "is not https"),
        (
            "skip-verify",
            with(&ca_line, "      insecure-skip-tls-verify: true"),
            "insecure-skip-tls-verify",
        ),
        (
            "ca-file",
            with(&ca_line, "      certificate-authority: /etc/ca.crt"),
            "certificate-authority file",
        ),
        ("token-file", with("token: tok", "tokenFile: /var/run/token"), "token-file"),
        (
            "cert-file",
            with("token: tok", "client-certificate: /c.crt\n      client-key-data: a2V5"),
            "client-certificate from a file",
        ),
        (
            "key-file",
            with("token: tok", "client-certificate-data: Y2VydA==\n      client-key: /k.key"),
            "client-key from a file",
        ),
        (
            "basic-auth",
            with("token: tok", "username: admin\n      password: secret"),
            "basic auth",
        ),
        (
            "exec",
            with(
                "token: tok",
                "exec:\n        apiVersion: client.authentication.k8s.io/v1\n        command: /bin/sh",
            ),
            "exec credential plugin",
        ),
        (
            "auth-provider",
            with("token: tok", "auth-provider:\n        name: gcp"),
            "auth-provider",
        ),
    ];
    let fleet = Fleet::start().await;
    for (name, kubeconfig, _) in &cases {
        fleet.add(name, kubeconfig);
    }
    for (name, _, why) in &cases {
        let s = fleet
            .wait_status(name, "InsecureKubeConfig", reason_is("InsecureKubeConfig"))
            .await;
        let (status, _, message) = active(&s);
        assert_eq!(status, "False", "{name}");
        assert!(
            message.contains(why),
            "{name}: {message:?} should name {why:?}"
        );
        assert!(message.starts_with("attempt "), "{message}");
        assert!(message.contains("next attempt at "), "{message}");
        let v = fleet.workers.get(name).unwrap();
        assert_eq!(v.reason, "InsecureKubeConfig");
        assert!(v.client.is_none() && !v.connected && v.disconnected_since.is_some());
    }
    assert!(
        worker.recorded().is_empty(),
        "no unsafe kubeconfig was ever used: {:?}",
        worker.requests()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_secret_is_a_bad_kubeconfig_until_a_good_one_appears() {
    let worker = FakeApi::start_tls().await;
    worker.upsert(NODES, fake_api::node("w-1", 8, 0));
    let fleet = Fleet::start().await;
    fleet.manager.upsert(
        WORKER_CLUSTERS,
        fake_api::worker_cluster("w1", "w1-kubeconfig", json!({})),
    );
    let s = fleet
        .wait_status("w1", "BadKubeConfig", reason_is("BadKubeConfig"))
        .await;
    let message = active(&s).2;
    assert!(
        message.contains("Secret switchyard-system/w1-kubeconfig not found"),
        "{message}"
    );
    assert_eq!(fleet.workers.get("w1").unwrap().reason, "BadKubeConfig");

    // A Secret without the key, then text that is not a kubeconfig.
    fleet.manager.upsert(
        SECRETS,
        json!({"metadata": {"name": "w1-kubeconfig", "namespace": NS}, "data": {"config": "eA=="}}),
    );
    fleet
        .wait_status("w1", "the missing key", |s| {
            active(s)
                .2
                .contains("has no key \"kubeconfig\" (keys: [config])")
        })
        .await;
    fleet.secret("w1-kubeconfig", "this: [is not a kubeconfig");
    fleet
        .wait_status("w1", "unparsable", |s| {
            active(s).1 == "BadKubeConfig" && active(s).2.contains("does not parse")
        })
        .await;
    let lost = fleet.workers.get("w1").unwrap().disconnected_since;

    // A good one is tried at once, not after the backoff.
    fleet.secret("w1-kubeconfig", &worker.kubeconfig("tok"));
    let v = fleet.view("w1", "connected", |v| v.connected).await;
    assert!(lost.is_some());
    assert!(v.disconnected_since.is_none());
    fleet
        .wait_status("w1", "Connected", reason_is("Connected"))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_worker_backs_off_and_keeps_the_time_it_was_lost() {
    // A port nobody listens on.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let worker = FakeApi::start_tls().await;
    let kubeconfig = worker
        .kubeconfig("tok")
        .replace(&worker.addr.port().to_string(), &closed.to_string());
    let fleet = Fleet::start().await;
    fleet.add("gone", &kubeconfig);
    let first = fleet
        .view("gone", "a failed attempt", |v| v.attempts >= 1)
        .await;
    assert_eq!(first.reason, "ClientConnectionFailed");
    assert!(!first.connected && first.client.is_some());
    let since = first.disconnected_since.unwrap();
    let third = fleet
        .view("gone", "three attempts", |v| v.attempts >= 3)
        .await;
    assert_eq!(third.disconnected_since, Some(since), "survives retries");
    // 300 ms doubling: the third failure waits 1.2 s.
    let wait = third
        .next_attempt
        .unwrap()
        .duration_since(std::time::SystemTime::now())
        .unwrap_or_default();
    assert!(wait <= Duration::from_millis(1200), "{wait:?}");
    let s = fleet
        .wait_status("gone", "three attempts in the status", |s| {
            s["connection"]["attempts"].as_i64() >= Some(3)
        })
        .await;
    let (status, reason, message) = active(&s);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "ClientConnectionFailed")
    );
    assert!(message.starts_with("attempt "), "{message}");
    assert!(message.contains("failed: GET /version"), "{message}");
    assert!(message.contains("; next attempt at 20"), "{message}");
    assert!(s["connection"]["disconnectedSince"].is_string());
    assert!(s["connection"]["nextAttemptTime"].is_string());
    assert!(s["connection"]["lastError"]
        .as_str()
        .unwrap()
        .contains("GET /version"));
    let text = fleet.metrics.encode();
    assert!(
        text.contains("switchyard_worker_connected{cluster=\"gone\"} 0"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_worker_never_delays_two_healthy_ones() {
    let (a, b, hung) = (
        FakeApi::start_tls().await,
        FakeApi::start_tls().await,
        FakeApi::start_tls().await,
    );
    a.upsert(NODES, fake_api::node("a-1", 8, 0));
    b.upsert(NODES, fake_api::node("b-1", 8, 0));
    hung.upsert(NODES, fake_api::node("h-1", 8, 0));
    hung.set_hang(true);
    // First with a probe that outlasts every wait here: had anything waited for the hung
    // worker, the healthy ones would not connect in time, whatever the machine's load.
    {
        let mut opts = options();
        opts.link.probe_timeout = 2 * WAIT;
        let fleet = Fleet::start_with(opts, true).await;
        fleet.add("hung", &hung.kubeconfig("tok"));
        fleet.add("a", &a.kubeconfig("tok"));
        fleet.add("b", &b.kubeconfig("tok"));
        fleet.view("a", "connected", |v| v.connected).await;
        fleet.view("b", "connected", |v| v.connected).await;
        wait_inventory(&fleet.store, "both healthy workers", |inv| {
            inv.node("a-1").is_some() && inv.node("b-1").is_some()
        })
        .await;
        let v = fleet.workers.get("hung").unwrap();
        assert!(
            !v.connected && v.attempts == 0,
            "the hung worker's first probe is still waiting: {v:?}"
        );
    }
    // Then with the short probe timeout: the hung worker fails on its own.
    let fleet = Fleet::start().await;
    fleet.add("hung", &hung.kubeconfig("tok"));
    fleet.add("a", &a.kubeconfig("tok"));
    fleet.add("b", &b.kubeconfig("tok"));
    fleet.view("a", "connected", |v| v.connected).await;
    fleet.view("b", "connected", |v| v.connected).await;
    let v = fleet
        .view("hung", "its probe timed out", |v| v.attempts >= 1)
        .await;
    assert_eq!(v.reason, "ClientConnectionFailed");
    assert!(v.message.contains("no answer within"), "{}", v.message);
    // Over time it goes stale in the inventory; the others stay schedulable.
    wait_inventory(&fleet.store, "the hung worker unschedulable", |inv| {
        inv.cluster("hung").is_some_and(|c| c.unavailable.is_some())
    })
    .await;
    let inv = fleet.store.snapshot();
    assert!(inv.cluster("a").unwrap().unavailable.is_none());
    assert!(inv.cluster("b").unwrap().unavailable.is_none());

    // It comes back: connected, listed, active.
    hung.set_hang(false);
    fleet
        .view("hung", "back", |v| v.connected && v.active)
        .await;
    wait_inventory(&fleet.store, "h-1", |inv| inv.node("h-1").is_some()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_that_are_not_established_in_time_count_as_a_failed_connection() {
    let worker = FakeApi::start_tls().await;
    worker.upsert(NODES, fake_api::node("w-1", 8, 0));
    // Probes answer, lists never do.
    worker.set_hang_collections(true);
    let fleet = Fleet::start().await;
    let started = Instant::now();
    fleet.add("w1", &worker.kubeconfig("tok"));
    let v = fleet
        .view("w1", "the establish timeout", |v| v.attempts >= 1)
        .await;
    assert_eq!(v.reason, "ClientConnectionFailed");
    assert!(
        v.message
            .contains("the node and pod lists did not complete within 3s"),
        "{}",
        v.message
    );
    assert!(started.elapsed() >= Duration::from_secs(3));
    worker.set_hang_collections(false);
    fleet.view("w1", "connected and fresh", |v| v.active).await;
    wait_inventory(&fleet.store, "w-1", |inv| inv.node("w-1").is_some()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_summary_follows_the_inventory_and_staleness_shows_in_the_status() {
    let worker = FakeApi::start_tls().await;
    worker.upsert(NODES, fake_api::node("g-1", 32, 8));
    worker.upsert(NODES, fake_api::node("c-1", 16, 0));
    worker.upsert(PODS, fake_api::pod("p1", "g-1", 10));
    worker.upsert(NRTS, fake_api::nrt("g-1", (3, 1)));
    let mut opts = options();
    opts.stale_after = Duration::from_secs(2);
    let fleet = Fleet::start_with(opts, true).await;
    fleet.add("w1", &worker.kubeconfig("tok"));
    let s = fleet
        .wait_status("w1", "a summary with NUMA data", |s| {
            s["summary"]["numaAwareNodes"] == 1
        })
        .await;
    let summary = &s["summary"];
    assert_eq!(summary["nodes"], 2);
    assert_eq!(summary["allocatable"]["cpu"], "48");
    assert_eq!(summary["allocatable"]["memory"], "256Gi");
    assert_eq!(summary["allocatable"]["nvidia.com/gpu"], "8");
    assert_eq!(summary["largestFreeOnNode"]["cpu"], "22");
    assert_eq!(summary["largestFreeOnNode"]["nvidia.com/gpu"], "8");
    assert_eq!(summary["largestFreeInNumaZone"]["nvidia.com/gpu"], "3");
    assert!(summary["lastSyncTime"].as_str().unwrap().ends_with('Z'));
    assert_eq!(active(&s).1, "Connected");

    // An event changes the summary.
    worker.upsert(PODS, fake_api::pod("p2", "g-1", 20));
    fleet
        .wait_status("w1", "the new pod counted", |s| {
            s["summary"]["largestFreeOnNode"]["cpu"] == "16"
        })
        .await;

    // The pod watch expires and its relists fail for a while: the worker still answers
    // probes, but its inventory goes stale, which makes it unschedulable until a relist
    // succeeds.
    worker.expire_next_watches(PODS, 1);
    worker.fail_next_lists(8);
    let s = fleet.wait_status("w1", "Stale", reason_is("Stale")).await;
    assert_eq!(active(&s).0, "False");
    assert!(active(&s).2.contains("stale"), "{s}");
    let v = fleet.view("w1", "stale", |v| v.reason == "Stale").await;
    assert!(v.connected && !v.active);
    assert!(fleet
        .store
        .snapshot()
        .cluster("w1")
        .unwrap()
        .unavailable
        .is_some());
    fleet
        .wait_status("w1", "fresh again", reason_is("Connected"))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_writes_status() {
    let worker = FakeApi::start_tls().await;
    // A probe that timed out would be a change worth a write.
    let fleet = Fleet::start_with(answering_options(), false).await;
    fleet.add("w1", &worker.kubeconfig("tok"));
    // Followers connect and publish views as well: the dispatcher's standby is warm.
    fleet.view("w1", "connected", |v| v.connected).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let status_writes = |api: &FakeApi| {
        api.recorded()
            .iter()
            .filter(|r| r.method == "PATCH" && r.uri.contains("/status"))
            .count()
    };
    assert_eq!(status_writes(&fleet.manager), 0);
    fleet.leader.send_replace(true);
    fleet
        .wait_status("w1", "written by the new leader", reason_is("Connected"))
        .await;
    // Once written, a steady worker's status is not rewritten.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let writes = status_writes(&fleet.manager);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        status_writes(&fleet.manager),
        writes,
        "no write without a change"
    );
    let patch = fleet
        .manager
        .recorded()
        .into_iter()
        .find(|r| r.method == "PATCH")
        .unwrap();
    assert_eq!(
        patch.content_type.as_deref(),
        Some("application/merge-patch+json")
    );
    assert!(patch
        .uri
        .starts_with("/apis/switchyard.dev/v1alpha1/workerclusters/w1/status"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_worker_cluster_is_forgotten_everywhere() {
    let worker = FakeApi::start_tls().await;
    worker.upsert(NODES, fake_api::node("w-1", 8, 0));
    let fleet = Fleet::start().await;
    fleet.add("w1", &worker.kubeconfig("tok"));
    fleet.view("w1", "connected", |v| v.connected).await;
    wait_inventory(&fleet.store, "w-1", |inv| inv.node("w-1").is_some()).await;
    fleet.manager.delete(WORKER_CLUSTERS, "w1");
    let deadline = Instant::now() + WAIT;
    while fleet.workers.get("w1").is_some() {
        assert!(Instant::now() < deadline, "the view stayed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_inventory(&fleet.store, "w1 gone", |inv| inv.cluster("w1").is_none()).await;
    assert!(!fleet.metrics.encode().contains("cluster=\"w1\""));
    // Its connection stopped: the worker hears nothing more.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = worker.recorded().len();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(worker.recorded().len(), before, "the link still runs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_kubeconfig_is_reread_when_the_file_changes() {
    let (a, b) = (FakeApi::start_tls().await, FakeApi::start_tls().await);
    a.upsert(NODES, fake_api::node("a-1", 8, 0));
    b.upsert(NODES, fake_api::node("b-1", 8, 0));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    let fleet = Fleet::start().await;
    fleet.manager.upsert(
        WORKER_CLUSTERS,
        json!({"metadata": {"name": "w1", "generation": 1},
               "spec": {"kubeConfig": {"location": path.to_str().unwrap(), "locationType": "Path"}}}),
    );
    let s = fleet
        .wait_status("w1", "no file yet", reason_is("BadKubeConfig"))
        .await;
    assert!(active(&s).2.contains("cannot read kubeconfig file"), "{s}");
    std::fs::write(&path, a.kubeconfig("tok")).unwrap();
    let v = fleet.view("w1", "connected to a", |v| v.connected).await;
    assert_eq!(node_names(v.client.unwrap()).await, vec!["a-1"]);
    // As the kubelet updates a Secret volume: a new file renamed over the old one.
    let tmp = dir.path().join("kubeconfig.new");
    std::fs::write(&tmp, b.kubeconfig("tok")).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    let v = fleet
        .view("w1", "connected to b", |v| {
            v.connected && v.client_generation == 2
        })
        .await;
    assert_eq!(node_names(v.client.unwrap()).await, vec!["b-1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_client_is_really_rate_limited() {
    use switchyard::workers::{client_for, ClientOptions, RateLimiter};
    let worker = FakeApi::start_tls().await;
    let latency =
        prometheus_client::metrics::histogram::Histogram::new([0.01, 0.1, 1.0].into_iter());
    let client = client_for(
        &worker.kubeconfig("tok"),
        &ClientOptions {
            limiter: Some(Arc::new(RateLimiter::new(10.0, 2))),
            latency: Some(latency.clone()),
        },
    )
    .await
    .unwrap();
    let started = Instant::now();
    for _ in 0..6 {
        client.apiserver_version().await.unwrap();
    }
    // Two at once, then one every 100 ms.
    assert!(
        started.elapsed() >= Duration::from_millis(390),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(worker.requests().len(), 6);
    let mut text = String::new();
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register("latency", "", latency);
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(text.contains("latency_count 6"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_pod_watch_hangs_goes_stale_though_it_answers_probes() {
    let worker = FakeApi::start_tls().await;
    worker.upsert(NODES, fake_api::node("w-1", 8, 0));
    worker.upsert(PODS, fake_api::pod("p1", "w-1", 2));
    // Probes answer throughout: a slow one must not reconnect and relist the pods.
    let fleet = Fleet::start_with(answering_options(), true).await;
    fleet.add("w1", &worker.kubeconfig("tok"));
    fleet
        .wait_status("w1", "Connected", reason_is("Connected"))
        .await;
    // Every new pod watch is accepted and then silent; /version, lists and the node watch
    // still answer. The current pod watch ends within 2 s and its successor hangs.
    worker.hang_watches(PODS, true);
    let s = fleet.wait_status("w1", "Stale", reason_is("Stale")).await;
    let stale_seen = Instant::now();
    // staleAfter counts from the last word of a pod watch (a bookmark, or the clean end of
    // the watch open when the hang began), not from the hang: that watch may have ended and
    // been replaced by a silent one just before the hang was set, or talked for 2 s after.
    let last_word = worker
        .last_watch_word(PODS)
        .expect("the pod watch said something before it hung");
    assert!(
        stale_seen.duration_since(last_word) >= Duration::from_secs(3),
        "stale only after staleAfter: {:?} after the pod watch's last word",
        stale_seen.duration_since(last_word)
    );
    let (status, _, message) = active(&s);
    assert_eq!(status, "False");
    assert!(message.contains("is stale"), "{message}");
    assert!(message.contains("the pod watch"), "{message}");
    assert!(!message.contains("the node watch"), "{message}");
    let v = fleet.view("w1", "stale", |v| v.reason == "Stale").await;
    assert!(v.connected && !v.active, "reachable, not fresh: {v:?}");
    assert!(worker.count("GET", "/version") > 0);
    // The watch answers again: fresh once a new watch delivers.
    worker.hang_watches(PODS, false);
    fleet
        .wait_status("w1", "fresh again", reason_is("Connected"))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnected_since_survives_a_failover_to_another_replica() {
    use std::time::SystemTime;
    use switchyard::inventory::InventoryStore;
    use switchyard::workers::controller;
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let worker = FakeApi::start_tls().await;
    let kubeconfig = worker
        .kubeconfig("tok")
        .replace(&worker.addr.port().to_string(), &closed.to_string());
    let fleet = Fleet::start().await;
    fleet.add("gone", &kubeconfig);
    let s = fleet
        .wait_status("gone", "disconnectedSince recorded", |s| {
            s["connection"]["disconnectedSince"].is_string()
        })
        .await;
    let recorded = s["connection"]["disconnectedSince"]
        .as_str()
        .unwrap()
        .to_string();
    // This replica steps down; another starts from scratch a while later and leads.
    fleet.leader.send_replace(false);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let attempts_before = fleet.status("gone")["connection"]["attempts"]
        .as_i64()
        .unwrap();
    let started = SystemTime::now();
    let (_leading, leader) = tokio::sync::watch::channel(true);
    let (workers, task) = controller::start(
        fleet.manager.client(),
        Arc::new(InventoryStore::default()),
        options(),
        leader,
        None,
    );
    let _task = common::fleet::Abort(task);
    let deadline = Instant::now() + WAIT;
    let view = loop {
        if let Some(v) = workers.get("gone").filter(|v| v.attempts >= 1) {
            break v;
        }
        assert!(Instant::now() < deadline, "{:?}", workers.get("gone"));
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let since = view.disconnected_since.expect("disconnected");
    assert!(
        since < started - Duration::from_secs(1),
        "T restored from the status, not this replica's first failure"
    );
    assert_eq!(
        switchyard::workers::connection::httpdate(since),
        recorded,
        "exactly the recorded T"
    );
    assert!(!view.connected);
    // The new leader writes it back unchanged, with its own attempts counted on top.
    let s = fleet
        .wait_status("gone", "the new leader's attempts", |s| {
            s["connection"]["attempts"].as_i64() > Some(attempts_before)
        })
        .await;
    assert_eq!(s["connection"]["disconnectedSince"], recorded.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_the_schema_should_have_refused_is_an_invalid_spec_naming_the_field() {
    let worker = FakeApi::start_tls().await;
    let fleet = Fleet::start().await;
    // The fake API server checks no schema, as an API server with an older CRD would not.
    fleet.secret("w1-kubeconfig", &worker.kubeconfig("tok"));
    fleet.manager.upsert(
        WORKER_CLUSTERS,
        fake_api::worker_cluster("w1", "w1-kubeconfig", json!({"not a key!": "x"})),
    );
    let long = "w".repeat(64);
    fleet.secret("long-kubeconfig", &worker.kubeconfig("tok"));
    fleet.manager.upsert(
        WORKER_CLUSTERS,
        fake_api::worker_cluster(&long, "long-kubeconfig", json!({})),
    );
    for (name, field) in [("w1", "spec.labels"), (long.as_str(), "metadata.name")] {
        let s = fleet
            .wait_status(name, "InvalidSpec", reason_is("InvalidSpec"))
            .await;
        let (status, _, message) = active(&s);
        assert_eq!(status, "False");
        assert!(message.contains(field), "{name}: {message}");
        let v = fleet.workers.get(name).unwrap();
        assert_eq!(v.reason, "InvalidSpec");
        assert!(!v.connected && v.client.is_none());
    }
    assert!(worker.recorded().is_empty(), "never connected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_kubeconfig_follows_a_secret_volume_swap_at_once_without_the_poll() {
    use std::os::unix::fs::symlink;
    let (a, b) = (FakeApi::start_tls().await, FakeApi::start_tls().await);
    a.upsert(NODES, fake_api::node("a-1", 8, 0));
    b.upsert(NODES, fake_api::node("b-1", 8, 0));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    // The poll alone would take an hour: only the directory's notifications can be quick.
    let mut opts = options();
    opts.file_poll = Duration::from_secs(3600);
    let fleet = Fleet::start_with(opts, true).await;
    fleet.manager.upsert(
        WORKER_CLUSTERS,
        json!({"metadata": {"name": "w1", "generation": 1},
               "spec": {"kubeConfig": {"location": path.to_str().unwrap(), "locationType": "Path"}}}),
    );
    fleet
        .wait_status("w1", "no file yet", reason_is("BadKubeConfig"))
        .await;
    // A Secret volume as the kubelet lays it out: the file a symlink through `..data`.
    let version = |name: &str, kubeconfig: &str| {
        let d = dir.path().join(name);
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("kubeconfig"), kubeconfig).unwrap();
    };
    version("..2026_11_22_10_00_00.1", &a.kubeconfig("tok"));
    symlink("..2026_11_22_10_00_00.1", dir.path().join("..data")).unwrap();
    symlink("..data/kubeconfig", &path).unwrap();
    let v = fleet.view("w1", "connected to a", |v| v.connected).await;
    assert_eq!(node_names(v.client.unwrap()).await, vec!["a-1"]);
    // The Secret changes: a new version directory, `..data` swapped by a rename.
    version("..2026_11_22_11_00_00.2", &b.kubeconfig("tok"));
    symlink("..2026_11_22_11_00_00.2", dir.path().join("..data_tmp")).unwrap();
    std::fs::rename(dir.path().join("..data_tmp"), dir.path().join("..data")).unwrap();
    let v = fleet
        .view("w1", "connected to b", |v| {
            v.connected && v.client_generation == 2
        })
        .await;
    assert_eq!(node_names(v.client.unwrap()).await, vec!["b-1"]);
}
