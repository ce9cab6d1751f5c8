//! Leader election through the real `kube::Client`: the exact Lease calls against the
//! captured kube-apiserver exchanges (tests/fixtures/kube-api/lease_*.json), then candidates
//! racing on a fake API server with real resourceVersion checks: one leader at a time,
//! expired leases taken over, a leader that cannot renew steps down, a stopped leader hands
//! over at once.

mod common;

use common::fake_api::{FakeApi, LEASES};
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use switchyard::leader::{self, ElectionConfig};
use tokio::sync::watch;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

const LEASE_PATH: &str =
    "/apis/coordination.k8s.io/v1/namespaces/switchyard-system/leases/switchyard-leader";
const LEASES_PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/switchyard-system/leases";

fn fixture(name: &str) -> Value {
    let path = format!(
        "{}/tests/fixtures/kube-api/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn reply(name: &str) -> ResponseTemplate {
    let f = fixture(name);
    ResponseTemplate::new(f["response"]["status"].as_u64().unwrap() as u16)
        .set_body_json(&f["response"]["body"])
}

fn config(identity: &str) -> ElectionConfig {
    ElectionConfig {
        lease_duration: Duration::from_millis(1500),
        renew_deadline: Duration::from_millis(1000),
        retry_period: Duration::from_millis(100),
        ..ElectionConfig::new("switchyard-system", "switchyard-leader", identity)
    }
}

struct Candidate {
    leading: watch::Receiver<bool>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

fn candidate(client: kube::Client, config: ElectionConfig) -> Candidate {
    let (tx, leading) = watch::channel(false);
    let (stop, stop_rx) = watch::channel(false);
    let task = tokio::spawn(leader::run(client, config, tx, stop_rx, Default::default()));
    Candidate {
        leading,
        stop,
        task,
    }
}

impl Candidate {
    async fn wait(&mut self, want: bool, what: &str) {
        let wait = tokio::time::timeout(
            Duration::from_secs(10),
            self.leading.wait_for(|l| *l == want),
        );
        assert!(matches!(wait.await, Ok(Ok(_))), "timed out: {what}");
    }
    async fn stop(self) {
        self.stop.send_replace(true);
        tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("the election ends on stop")
            .unwrap();
    }
}

fn mock_client(api: &MockServer) -> kube::Client {
    switchyard::install_crypto_provider();
    kube::Client::try_from(kube::Config::new(api.uri().parse().unwrap())).unwrap()
}

fn body(r: &Request) -> Value {
    serde_json::from_slice(&r.body).unwrap()
}

fn is_micro_time(v: &Value) -> bool {
    let s = v.as_str().unwrap_or_default();
    regex::Regex::new(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
        .unwrap()
        .is_match(s)
}

#[tokio::test]
async fn a_missing_lease_is_created_and_held() {
    let api = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(LEASE_PATH))
        .respond_with(reply("lease_get_missing"))
        .up_to_n_times(1)
        .mount(&api)
        .await;
    Mock::given(method("POST"))
        .and(path(LEASES_PATH))
        .respond_with(reply("lease_create"))
        .expect(1)
        .mount(&api)
        .await;
    // Renewals after the create.
    Mock::given(method("GET"))
        .and(path(LEASE_PATH))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(&fixture("lease_create")["response"]["body"]),
        )
        .mount(&api)
        .await;
    Mock::given(method("PUT"))
        .and(path(LEASE_PATH))
        .respond_with(reply("lease_renew"))
        .mount(&api)
        .await;
    let mut c = candidate(mock_client(&api), config("switchyard-0"));
    c.wait(true, "leading after the create").await;
    let requests = api.received_requests().await.unwrap();
    let create = requests
        .iter()
        .find(|r| r.method.as_str() == "POST")
        .unwrap();
    let sent = body(create);
    let want = &fixture("lease_create")["request"]["body"];
    assert_eq!(sent["apiVersion"], want["apiVersion"]);
    assert_eq!(sent["kind"], want["kind"]);
    assert_eq!(sent["metadata"], want["metadata"]);
    assert_eq!(sent["spec"]["holderIdentity"], "switchyard-0");
    // 1.5 s rounds up: a lease is never shorter than configured.
    assert_eq!(sent["spec"]["leaseDurationSeconds"], 2);
    assert_eq!(sent["spec"]["leaseTransitions"], 0);
    assert!(is_micro_time(&sent["spec"]["renewTime"]), "{sent}");
    assert_eq!(sent["spec"]["acquireTime"], sent["spec"]["renewTime"]);
    c.stop().await;
}

#[tokio::test]
async fn the_holder_renews_with_the_resource_version_it_read() {
    let api = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(LEASE_PATH))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(&fixture("lease_create")["response"]["body"]),
        )
        .mount(&api)
        .await;
    Mock::given(method("PUT"))
        .and(path(LEASE_PATH))
        .respond_with(reply("lease_renew"))
        .mount(&api)
        .await;
    let mut c = candidate(mock_client(&api), config("switchyard-0"));
    c.wait(true, "leading after the renewal").await;
    let requests = api.received_requests().await.unwrap();
    let put = body(
        requests
            .iter()
            .find(|r| r.method.as_str() == "PUT")
            .unwrap(),
    );
    let want = &fixture("lease_renew")["request"]["body"];
    assert_eq!(put["metadata"]["resourceVersion"], "391");
    assert_eq!(put["metadata"]["uid"], want["metadata"]["uid"]);
    assert_eq!(put["spec"]["holderIdentity"], "switchyard-0");
    assert_eq!(put["spec"]["acquireTime"], want["spec"]["acquireTime"]);
    assert_eq!(put["spec"]["leaseTransitions"], 0);
    assert!(is_micro_time(&put["spec"]["renewTime"]), "{put}");
    assert_ne!(put["spec"]["renewTime"], want["spec"]["acquireTime"]);
    c.stop().await;
}

#[tokio::test]
async fn a_conflict_means_someone_else_won() {
    // A takeover of the expired lease of switchyard-0 that loses the race: 409.
    let api = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(LEASE_PATH))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(&fixture("lease_create")["response"]["body"]),
        )
        .mount(&api)
        .await;
    Mock::given(method("PUT"))
        .and(path(LEASE_PATH))
        .respond_with(reply("lease_takeover_stale_rv"))
        .mount(&api)
        .await;
    let c = candidate(mock_client(&api), config("switchyard-1"));
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!*c.leading.borrow());
    let requests = api.received_requests().await.unwrap();
    let put = body(
        requests
            .iter()
            .find(|r| r.method.as_str() == "PUT")
            .unwrap(),
    );
    assert_eq!(put["spec"]["holderIdentity"], "switchyard-1");
    assert_eq!(put["spec"]["leaseTransitions"], 1);
    assert_eq!(put["metadata"]["resourceVersion"], "391");

    // A leader whose renewal meets a 409 steps down at once.
    let api = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(LEASE_PATH))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(&fixture("lease_create")["response"]["body"]),
        )
        .mount(&api)
        .await;
    Mock::given(method("PUT"))
        .and(path(LEASE_PATH))
        .respond_with(reply("lease_renew"))
        .up_to_n_times(2)
        .mount(&api)
        .await;
    Mock::given(method("PUT"))
        .and(path(LEASE_PATH))
        .respond_with(reply("lease_takeover_stale_rv"))
        .mount(&api)
        .await;
    c.stop().await;
    let mut c = candidate(mock_client(&api), config("switchyard-0"));
    c.wait(true, "leading").await;
    c.wait(false, "stepped down on 409").await;
    c.stop().await;

    // Two candidates creating it at once: the second POST gets AlreadyExists.
    let api = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(LEASE_PATH))
        .respond_with(reply("lease_get_missing"))
        .mount(&api)
        .await;
    Mock::given(method("POST"))
        .and(path(LEASES_PATH))
        .respond_with(reply("lease_create_already_exists"))
        .mount(&api)
        .await;
    let c = candidate(mock_client(&api), config("switchyard-0"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!*c.leading.borrow());
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn candidates_racing_on_one_lease_never_lead_together_and_a_stopped_leader_hands_over_at_once(
) {
    let api = FakeApi::start().await;
    let mut candidates: Vec<Candidate> = (0..3)
        .map(|i| candidate(api.client(), config(&format!("switchyard-{i}"))))
        .collect();
    let started = Instant::now();
    let mut led = false;
    while started.elapsed() < Duration::from_secs(2) {
        let leaders = candidates.iter().filter(|c| *c.leading.borrow()).count();
        assert!(leaders <= 1, "{leaders} leaders at once");
        led |= leaders == 1;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(led, "nobody led");
    let lease = api
        .get(LEASES, "switchyard-system", "switchyard-leader")
        .unwrap();
    let holder = lease["spec"]["holderIdentity"]
        .as_str()
        .unwrap()
        .to_string();
    let i = candidates.iter().position(|c| *c.leading.borrow()).unwrap();
    assert_eq!(holder, format!("switchyard-{i}"));
    let transitions = lease["spec"]["leaseTransitions"].as_i64().unwrap();

    // The leader stops: it releases the Lease and a successor leads well before the lease
    // would have expired.
    let old = candidates.remove(i);
    let stopped = Instant::now();
    old.stop().await;
    let (mut a, mut b) = (candidates.remove(0), candidates.remove(0));
    let next = tokio::time::timeout(Duration::from_secs(5), async {
        tokio::select! {
            _ = a.leading.wait_for(|l| *l) => {}
            _ = b.leading.wait_for(|l| *l) => {}
        }
    })
    .await;
    assert!(next.is_ok(), "no successor");
    assert!(
        stopped.elapsed() < Duration::from_millis(1200),
        "the successor waited for expiry: {:?}",
        stopped.elapsed()
    );
    assert!(!(*a.leading.borrow() && *b.leading.borrow()));
    let lease = api
        .get(LEASES, "switchyard-system", "switchyard-leader")
        .unwrap();
    assert_ne!(
        lease["spec"]["holderIdentity"].as_str(),
        Some(holder.as_str())
    );
    assert!(lease["spec"]["leaseTransitions"].as_i64().unwrap() > transitions);
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_is_taken_over_and_a_leader_that_cannot_renew_steps_down() {
    let api = FakeApi::start().await;
    api.upsert(
        LEASES,
        json!({"metadata": {"name": "switchyard-leader", "namespace": "switchyard-system"},
               "spec": {"holderIdentity": "switchyard-gone", "leaseDurationSeconds": 15,
                        "acquireTime": "2026-11-22T03:55:02.499338Z",
                        "renewTime": "2026-11-22T03:55:02.499338Z", "leaseTransitions": 4}}),
    );
    let mut c = candidate(api.client(), config("switchyard-new"));
    c.wait(true, "took the expired lease over").await;
    let lease = api
        .get(LEASES, "switchyard-system", "switchyard-leader")
        .unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "switchyard-new");
    assert_eq!(lease["spec"]["leaseTransitions"], 5);
    assert_ne!(lease["spec"]["acquireTime"], "2026-11-22T03:55:02.499338Z");

    // The API server stops answering: the leader steps down within its renew deadline,
    // before the lease (1.5 s) could expire for anyone else.
    api.set_hang(true);
    let hung = Instant::now();
    c.wait(false, "stepped down").await;
    assert!(
        hung.elapsed() < Duration::from_millis(1500),
        "{:?}",
        hung.elapsed()
    );
    c.task.abort();
}

#[tokio::test]
async fn a_valid_lease_of_another_is_followed() {
    let api = FakeApi::start().await;
    let renew = leader::micro_time(std::time::SystemTime::now());
    api.upsert(
        LEASES,
        json!({"metadata": {"name": "switchyard-leader", "namespace": "switchyard-system"},
               "spec": {"holderIdentity": "switchyard-other", "leaseDurationSeconds": 60,
                        "renewTime": renew, "acquireTime": renew, "leaseTransitions": 0}}),
    );
    let c = candidate(api.client(), config("switchyard-me"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!*c.leading.borrow());
    assert!(
        api.recorded().iter().all(|r| r.method == "GET"),
        "a follower never writes"
    );
    c.stop().await;
}

/// A candidate alone on a fake API, once it leads: the API, its writes in flight, whether it
/// leads, its stop and its task.
async fn leading_alone() -> (
    FakeApi,
    leader::WritesInFlight,
    watch::Receiver<bool>,
    watch::Sender<bool>,
    tokio::task::JoinHandle<()>,
) {
    let api = FakeApi::start().await;
    let writes = leader::WritesInFlight::default();
    let (tx, mut leading) = watch::channel(false);
    let (stop, stop_rx) = watch::channel(false);
    let task = tokio::spawn(leader::run(
        api.client(),
        config("switchyard-0"),
        tx,
        stop_rx,
        writes.clone(),
    ));
    tokio::time::timeout(Duration::from_secs(10), leading.wait_for(|l| *l))
        .await
        .expect("it leads")
        .unwrap();
    (api, writes, leading, stop, task)
}

/// The holder of the Lease as the fake API has it.
fn holder(api: &FakeApi) -> Option<String> {
    api.get(LEASES, "switchyard-system", "switchyard-leader")
        .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_string))
}

#[tokio::test]
async fn a_stopping_leader_gives_the_lease_up_only_after_its_writes_in_flight_are_answered() {
    let (api, writes, mut leading, stop, task) = leading_alone().await;
    // A claim sent just before SIGTERM, not answered yet.
    let write = writes.begin();
    stop.send_replace(true);
    tokio::time::timeout(Duration::from_secs(5), leading.wait_for(|l| !*l))
        .await
        .expect("it stops deciding at once")
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        holder(&api).as_deref(),
        Some("switchyard-0"),
        "the Lease was given up with a write in flight: a successor could admit before it lands"
    );
    assert!(!task.is_finished());
    // Answered: now the Lease goes, well before it would expire.
    drop(write);
    tokio::time::timeout(Duration::from_secs(2), task)
        .await
        .expect("the election ends once the write is answered")
        .unwrap();
    assert_eq!(holder(&api), None, "the Lease is given up");
}

#[tokio::test]
async fn a_stopping_leader_gives_the_lease_up_even_if_its_last_renewal_landed_after_it_read_it() {
    let (api, writes, _leading, stop, task) = leading_alone().await;
    // Held in the stop by a write in flight, while a renewal it sent just before the stop (and
    // stopped waiting for) lands: the Lease's resourceVersion moves past the one it holds.
    let write = writes.begin();
    stop.send_replace(true);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut lease = api
        .get(LEASES, "switchyard-system", "switchyard-leader")
        .expect("the Lease");
    lease["spec"]["renewTime"] = json!("2026-11-27T18:37:39.153619Z");
    api.upsert(LEASES, lease);
    drop(write);
    tokio::time::timeout(Duration::from_secs(3), task)
        .await
        .expect("the election ends")
        .unwrap();
    assert_eq!(
        holder(&api),
        None,
        "the Lease is given up, not left to expire"
    );
}

#[tokio::test]
async fn a_stopping_leader_whose_write_is_never_answered_leaves_the_lease_to_expire() {
    let (api, writes, _leading, stop, task) = leading_alone().await;
    let _stuck = writes.begin();
    let stopped = Instant::now();
    stop.send_replace(true);
    // The renew deadline (1 s here) bounds the wait; the Lease is then not given up.
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the election ends after the renew deadline")
        .unwrap();
    assert!(stopped.elapsed() >= Duration::from_millis(1000));
    assert_eq!(
        holder(&api).as_deref(),
        Some("switchyard-0"),
        "kept until it expires: a successor waits out leaseDuration, the write's time to land"
    );
}
