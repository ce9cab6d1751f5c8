//! The kube-scheduler extender over TLS, with bodies exactly as kube-scheduler sends them
//! (tests/fixtures/extender: real captures), both `nodeCacheCapable` forms, real and virtual
//! nodes, bind with and without an API server, and bad input.

mod common;

use common::tls_client::{connect, connector_from_dir, Connection};
use serde_json::{json, Value};
use std::path::Path;
use switchyard::config::{ServeSettings, TlsSource};
use switchyard::server::{self, Running};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

/// node-gpu-1: 2 GPUs free in each NUMA zone. node-gpu-2: 1 free in each zone, so a
/// 2-GPU Guaranteed pod fits it only across zones, which single-numa-node refuses.
/// Cluster eu-1 has three 8-GPU nodes (4 per zone) for virtual-node gangs.
const INVENTORY: &str = r#"
clusters:
  - name: local
    nodes:
      - name: node-gpu-1
        allocatable: {cpu: "32", memory: 128Gi, nvidia.com/gpu: "4", pods: "110"}
        requested: {}
        topology:
          attributes:
            - {name: topologyManagerPolicy, value: single-numa-node}
          zones:
            - name: node-0
              type: Node
              resources:
                - {name: cpu, capacity: "16", allocatable: "16", available: "16"}
                - {name: memory, capacity: 64Gi, allocatable: 64Gi, available: 64Gi}
                - {name: nvidia.com/gpu, capacity: "2", allocatable: "2", available: "2"}
            - name: node-1
              type: Node
              resources:
                - {name: cpu, capacity: "16", allocatable: "16", available: "16"}
                - {name: memory, capacity: 64Gi, allocatable: 64Gi, available: 64Gi}
                - {name: nvidia.com/gpu, capacity: "2", allocatable: "2", available: "2"}
      - name: node-gpu-2
        allocatable: {cpu: "32", memory: 128Gi, nvidia.com/gpu: "4", pods: "110"}
        requested: {nvidia.com/gpu: "2"}
        topology:
          attributes:
            - {name: topologyManagerPolicy, value: single-numa-node}
          zones:
            - name: node-0
              type: Node
              resources:
                - {name: cpu, capacity: "16", allocatable: "16", available: "16"}
                - {name: memory, capacity: 64Gi, allocatable: 64Gi, available: 64Gi}
                - {name: nvidia.com/gpu, capacity: "2", allocatable: "2", available: "1"}
            - name: node-1
              type: Node
              resources:
                - {name: cpu, capacity: "16", allocatable: "16", available: "16"}
                - {name: memory, capacity: 64Gi, allocatable: 64Gi, available: 64Gi}
                - {name: nvidia.com/gpu, capacity: "2", allocatable: "2", available: "1"}
  - name: eu-1
    nodes:
      - {name: eu-1-a, allocatable: {cpu: "64", memory: 256Gi, nvidia.com/gpu: "8", pods: "110"}}
      - {name: eu-1-b, allocatable: {cpu: "64", memory: 256Gi, nvidia.com/gpu: "8", pods: "110"}}
      - {name: eu-1-c, allocatable: {cpu: "64", memory: 256Gi, nvidia.com/gpu: "8", pods: "110"}}
"#;

fn fixture(name: &str) -> Value {
    let p =
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/extender/{name}.json"));
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

async fn start(dir: &Path, client: Option<kube::Client>) -> (Running, Connection) {
    switchyard::install_crypto_provider();
    let inventory = dir.join("inventory.yaml");
    std::fs::write(&inventory, INVENTORY).unwrap();
    let mut settings = ServeSettings::for_tests(TlsSource::Dev(dir.join("pki")));
    settings.inventory = Some(inventory);
    let running = server::start_with_client(settings, client).await.unwrap();
    let tls = connector_from_dir(&dir.join("pki"));
    let conn = connect(&tls, running.https_addr, "localhost")
        .await
        .unwrap();
    (running, conn)
}

async fn call(conn: &mut Connection, path: &str, body: &Value) -> (u16, Value) {
    let (status, body) = conn
        .post_json(path, serde_json::to_vec(body).unwrap())
        .await;
    let v = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into()));
    (status, v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_with_node_names_answers_names_from_the_input_only() {
    let dir = tempfile::tempdir().unwrap();
    let (running, mut conn) = start(dir.path(), None).await;
    let mut args = fixture("extender-filter-nodenames");
    args["NodeNames"] = json!(["node-gpu-2", "node-gpu-1", "ghost"]);
    let (status, reply) = call(&mut conn, "/scheduler/filter", &args).await;
    assert_eq!(status, 200);
    assert_eq!(reply["NodeNames"], json!(["node-gpu-1"]));
    assert_eq!(reply["Nodes"], Value::Null);
    assert_eq!(reply["Error"], "");
    let why = reply["FailedNodes"]["node-gpu-2"].as_str().unwrap();
    assert!(
        why.contains("needs 2 nvidia.com/gpu on one NUMA node under single-numa-node"),
        "{why}"
    );
    assert!(why.contains("1 free of 2 allocatable"), "{why}");
    let unknown = reply["FailedAndUnresolvableNodes"]["ghost"]
        .as_str()
        .unwrap();
    assert!(
        unknown.contains("not in Switchyard's inventory"),
        "{unknown}"
    );

    // Nothing passes: NodeNames is an empty array, never null (null drops every node).
    args["NodeNames"] = json!(["node-gpu-2"]);
    let (_, reply) = call(&mut conn, "/scheduler/filter", &args).await;
    assert_eq!(reply["NodeNames"], json!([]));
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_with_full_nodes_answers_the_passing_node_objects_verbatim() {
    let dir = tempfile::tempdir().unwrap();
    let (running, mut conn) = start(dir.path(), None).await;
    let args = fixture("extender-filter-nodes");
    let (status, reply) = call(&mut conn, "/scheduler/filter", &args).await;
    assert_eq!(status, 200);
    let items = reply["Nodes"]["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    let sent = args["Nodes"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["metadata"]["name"] == "node-gpu-1")
        .unwrap();
    assert_eq!(
        &items[0], sent,
        "a passing Node comes back exactly as it was sent"
    );
    assert_eq!(reply["NodeNames"], json!(["node-gpu-1"]));
    assert!(reply["FailedNodes"]["node-gpu-2"].is_string());
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prioritize_scores_every_candidate_from_0_to_10() {
    let dir = tempfile::tempdir().unwrap();
    let (running, mut conn) = start(dir.path(), None).await;
    // kube-scheduler calls filter then prioritize for the same pod version.
    let mut filter = fixture("extender-filter-nodenames");
    filter["NodeNames"] = json!(["node-gpu-1", "node-gpu-2"]);
    call(&mut conn, "/scheduler/filter", &filter).await;
    let args = fixture("extender-prioritize-nodenames-guaranteed");
    let (status, reply) = call(&mut conn, "/scheduler/prioritize", &args).await;
    assert_eq!(status, 200);
    let list = reply.as_array().expect("HostPriorityList is a bare array");
    assert_eq!(list.len(), 2);
    for entry in list {
        let score = entry["Score"].as_i64().unwrap();
        assert!((0..=10).contains(&score), "{entry}");
        assert!(entry["Host"].is_string());
    }
    let score_of = |n: &str| {
        list.iter().find(|e| e["Host"] == n).unwrap()["Score"]
            .as_i64()
            .unwrap()
    };
    assert!(score_of("node-gpu-1") > 0);
    assert_eq!(
        score_of("node-gpu-2"),
        0,
        "a node that does not fit scores 0"
    );
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn virtual_nodes_are_judged_as_whole_clusters_for_the_gang() {
    let dir = tempfile::tempdir().unwrap();
    let (running, mut conn) = start(dir.path(), None).await;
    let mut args = fixture("extender-filter-nodenames");
    args["NodeNames"] = json!(["switchyard-eu-1", "switchyard-local", "switchyard-nope"]);
    // Six 4-GPU pods: eu-1 has 24 GPUs on three nodes (two pods each) ...
    let r = json!({"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "4"});
    args["Pod"]["spec"]["containers"][0]["resources"] = json!({"requests": r, "limits": r});
    args["Pod"]["metadata"]["annotations"] = json!({"switchyard.dev/gang-size": "6"});
    let (_, reply) = call(&mut conn, "/scheduler/filter", &args).await;
    assert_eq!(reply["NodeNames"], json!(["switchyard-eu-1"]));
    // ... local has 8 GPUs in all (6 free), but no NUMA zone holds 4.
    let why = reply["FailedAndUnresolvableNodes"]["switchyard-local"]
        .as_str()
        .unwrap();
    assert!(why.contains("NUMA"), "{why}");
    assert!(reply["FailedAndUnresolvableNodes"]["switchyard-nope"].is_string());

    // Seven do not fit in eu-1 although it has 24 GPUs free.
    args["Pod"]["metadata"]["annotations"] = json!({"switchyard.dev/gang-size": "7"});
    args["Pod"]["metadata"]["resourceVersion"] = json!("999");
    let (_, reply) = call(&mut conn, "/scheduler/filter", &args).await;
    assert_eq!(reply["NodeNames"], json!([]));
    let why = reply["FailedNodes"]["switchyard-eu-1"].as_str().unwrap();
    assert!(why.contains("only 6 of 7 pods fit"), "{why}");
    running.shutdown().await;
}

/// The filter of virtual node `switchyard-eu-1` for a Guaranteed pod of Job `train` (the
/// labels its Job's controller gives it) with `gpus` GPUs.
fn eu1_train_pod(gpus: u32) -> Value {
    let mut args = fixture("extender-filter-nodenames");
    args["NodeNames"] = json!(["switchyard-eu-1"]);
    let r = json!({"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": gpus.to_string()});
    args["Pod"]["spec"]["containers"][0]["resources"] = json!({"requests": r, "limits": r});
    args["Pod"]["metadata"]["labels"] =
        json!({"batch.kubernetes.io/job-name": "train", "job-name": "train"});
    args
}

/// Filters `args`'s pod, changed since the last filter (a new resourceVersion, as the API
/// server gives it), on `switchyard-eu-1`, which must refuse it as unresolvable: the reason.
async fn refused_for_good(conn: &mut Connection, args: &mut Value) -> String {
    args["Pod"]["metadata"]["resourceVersion"] = json!("999");
    let (_, reply) = call(conn, "/scheduler/filter", args).await;
    assert_eq!(reply["NodeNames"], json!([]), "{reply}");
    let why = reply["FailedAndUnresolvableNodes"]["switchyard-eu-1"].as_str();
    why.unwrap_or_else(|| panic!("{reply}")).to_string()
}

/// A gang whose pods keep one to a node (their required anti-affinity to one another on the
/// hostname, by the label their Job's controller gives them) needs as many nodes as pods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_virtual_node_takes_a_gang_that_keeps_one_pod_to_a_node_only_with_a_node_each() {
    let dir = tempfile::tempdir().unwrap();
    let (running, mut conn) = start(dir.path(), None).await;
    let mut args = eu1_train_pod(1);
    args["Pod"]["spec"]["affinity"] = json!({"podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchExpressions": [{"key": "job-name", "operator": "In", "values": ["train"]}]},
            "topologyKey": "kubernetes.io/hostname"
        }]
    }});
    // eu-1's three nodes could hold twenty-four such pods, but one each at most: three fit ...
    args["Pod"]["metadata"]["annotations"] = json!({"switchyard.dev/gang-size": "3"});
    let (_, reply) = call(&mut conn, "/scheduler/filter", &args).await;
    assert_eq!(reply["NodeNames"], json!(["switchyard-eu-1"]), "{reply}");
    // ... four never do.
    args["Pod"]["metadata"]["annotations"] = json!({"switchyard.dev/gang-size": "4"});
    let why = refused_for_good(&mut conn, &mut args).await;
    assert!(why.contains("only 3 of 4 pods fit"), "{why}");
    assert!(why.contains("keep one to a node"), "{why}");
    running.shutdown().await;
}

/// A gang whose pods spread over nodes (a DoNotSchedule topology spread constraint on the
/// hostname over its own pods) is judged on a virtual node as PodTopologySpread binds it in
/// the worker: at most maxSkew above the least count on the nodes it counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_virtual_node_takes_a_gang_that_spreads_over_nodes_only_as_its_spread_allows() {
    let dir = tempfile::tempdir().unwrap();
    let (running, mut conn) = start(dir.path(), None).await;
    let mut args = eu1_train_pod(4);
    args["Pod"]["metadata"]["annotations"] = json!({"switchyard.dev/gang-size": "6"});
    let spread = |min_domains: u32| {
        json!([{
            "maxSkew": 1, "minDomains": min_domains, "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"job-name": "train"}}
        }])
    };
    // Six 4-GPU pods over eu-1's three nodes, two each: the spread holds ...
    args["Pod"]["spec"]["topologySpreadConstraints"] = spread(1);
    let (_, reply) = call(&mut conn, "/scheduler/filter", &args).await;
    assert_eq!(reply["NodeNames"], json!(["switchyard-eu-1"]), "{reply}");
    // ... but not with four nodes counted at least: the least count is taken as 0, and no node
    // may take more than one.
    args["Pod"]["spec"]["topologySpreadConstraints"] = spread(4);
    let why = refused_for_good(&mut conn, &mut args).await;
    assert!(why.contains("only 3 of 6 pods fit"), "{why}");
    assert!(
        why.contains("fewer than its minDomains 4, so no node may take more than 1"),
        "{why}"
    );
    running.shutdown().await;
}

/// A gang whose pods keep together (a required pod affinity to one another, by the label
/// their Job's controller gives them) is judged on a virtual node as InterPodAffinity binds
/// it in the worker: whole in one domain of the topology key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_virtual_node_takes_a_gang_kept_together_only_where_one_domain_holds_it() {
    let dir = tempfile::tempdir().unwrap();
    let (running, mut conn) = start(dir.path(), None).await;
    let mut args = eu1_train_pod(4);
    let together = |key: &str| {
        json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": {"job-name": "train"}},
            "topologyKey": key
        }]}})
    };
    // On one node: each of eu-1's three nodes holds two 4-GPU pods ...
    args["Pod"]["spec"]["affinity"] = together("kubernetes.io/hostname");
    args["Pod"]["metadata"]["annotations"] = json!({"switchyard.dev/gang-size": "2"});
    let (_, reply) = call(&mut conn, "/scheduler/filter", &args).await;
    assert_eq!(reply["NodeNames"], json!(["switchyard-eu-1"]), "{reply}");
    // ... and none three, though the cluster holds six.
    args["Pod"]["metadata"]["annotations"] = json!({"switchyard.dev/gang-size": "3"});
    args["Pod"]["metadata"]["resourceVersion"] = json!("998");
    let (_, reply) = call(&mut conn, "/scheduler/filter", &args).await;
    assert_eq!(reply["NodeNames"], json!([]), "{reply}");
    let why = reply["FailedNodes"]["switchyard-eu-1"].as_str().unwrap();
    assert!(why.contains("only 2 of 3 pods fit"), "{why}");
    assert!(
        why.contains("keep together in one kubernetes.io/hostname (a required pod affinity to one another), and none of the 3"),
        "{why}"
    );
    // In one zone: no node of eu-1 has a zone label, so never.
    args["Pod"]["spec"]["affinity"] = together("topology.kubernetes.io/zone");
    let why = refused_for_good(&mut conn, &mut args).await;
    assert!(
        why.contains("no node of cluster eu-1 has the label topology.kubernetes.io/zone"),
        "{why}"
    );
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bind_holds_the_space_and_posts_the_binding() {
    let api = MockServer::start().await;
    for pod in ["guaranteed-gpu-bind", "next-1"] {
        Mock::given(method("POST"))
            .and(path(format!("/api/v1/namespaces/sched/pods/{pod}/binding")))
            .respond_with(ResponseTemplate::new(201).set_body_json(json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201
            })))
            .expect(1)
            .mount(&api)
            .await;
    }
    let client = kube::Client::try_from(kube::Config::new(api.uri().parse().unwrap())).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (running, mut conn) = start(dir.path(), Some(client)).await;

    let bind = fixture("extender-bind");
    let mut filter = fixture("extender-filter-nodenames");
    filter["Pod"]["metadata"]["uid"] = bind["PodUID"].clone();
    filter["Pod"]["metadata"]["name"] = bind["PodName"].clone();
    filter["NodeNames"] = json!(["node-gpu-1"]);
    let (_, reply) = call(&mut conn, "/scheduler/filter", &filter).await;
    assert_eq!(reply["NodeNames"], json!(["node-gpu-1"]));

    let mut bind_to_1 = bind.clone();
    bind_to_1["Node"] = json!("node-gpu-1");
    let (status, reply) = call(&mut conn, "/scheduler/bind", &bind_to_1).await;
    assert_eq!(status, 200);
    assert_eq!(reply, json!({"Error": ""}));

    // Two more 2-GPU pods right away, before any kubelet reports them: the first still fits
    // (one zone left) and is bound; the second does not.
    for (i, want) in [(1, json!(["node-gpu-1"])), (2, json!([]))] {
        let mut next = fixture("extender-filter-nodenames");
        next["Pod"]["metadata"]["uid"] = json!(format!("next-{i}"));
        next["NodeNames"] = json!(["node-gpu-1"]);
        let (_, reply) = call(&mut conn, "/scheduler/filter", &next).await;
        assert_eq!(reply["NodeNames"], want, "{reply}");
        if i == 1 {
            let mut b = bind_to_1.clone();
            b["PodUID"] = json!("next-1");
            b["PodName"] = json!("next-1");
            let (_, r) = call(&mut conn, "/scheduler/bind", &b).await;
            assert_eq!(r, json!({"Error": ""}));
        }
    }
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_binding_is_reported_in_error() {
    let api = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(409).set_body_json(json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "pods \"guaranteed-gpu-bind\" is already assigned to node \"node-gpu-2\"",
            "reason": "Conflict", "code": 409
        })))
        .mount(&api)
        .await;
    let client = kube::Client::try_from(kube::Config::new(api.uri().parse().unwrap())).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (running, mut conn) = start(dir.path(), Some(client)).await;
    let (status, reply) = call(&mut conn, "/scheduler/bind", &fixture("extender-bind")).await;
    assert_eq!(status, 200);
    let err = reply["Error"].as_str().unwrap();
    assert!(err.contains("already assigned"), "{err}");
    running.shutdown().await;
}

/// The extender's paths answer another method than POST with 405 and `Allow: POST`, as the
/// webhooks' do, not with "no such path".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_methods_than_post_are_not_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let (running, mut conn) = start(dir.path(), None).await;
    for (method, path) in [
        ("GET", "/scheduler/filter"),
        ("PUT", "/scheduler/prioritize"),
        ("DELETE", "/scheduler/bind"),
        ("GET", "/mutate-batch-v1-job"),
    ] {
        let (status, allow) = conn.bodiless(method, path).await;
        assert_eq!(
            (status, allow.as_deref()),
            (405, Some("POST")),
            "{method} {path}"
        );
    }
    running.shutdown().await;
}

/// Without an API server (`--standalone`) a binding is refused in its Error, not answered as
/// made (a scheduler would take the pod for bound), and holds no room; an empty node is a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_extender_says_it_binds_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (running, mut conn) = start(dir.path(), None).await;
    let bind = fixture("extender-bind");
    // Three 2-GPU pods, one after the other: the third would not fit were the first two
    // bindings held (bind_holds_the_space_and_posts_the_binding).
    for i in 0..3 {
        let mut filter = fixture("extender-filter-nodenames");
        filter["Pod"]["metadata"]["uid"] = json!(format!("standalone-{i}"));
        filter["NodeNames"] = json!(["node-gpu-1"]);
        let (_, reply) = call(&mut conn, "/scheduler/filter", &filter).await;
        assert_eq!(
            reply["NodeNames"],
            json!(["node-gpu-1"]),
            "pod {i}: {reply}"
        );
        let mut bind_to_1 = bind.clone();
        bind_to_1["PodUID"] = json!(format!("standalone-{i}"));
        bind_to_1["Node"] = json!("node-gpu-1");
        let (status, reply) = call(&mut conn, "/scheduler/bind", &bind_to_1).await;
        assert_eq!(status, 200);
        let error = reply["Error"].as_str().unwrap();
        assert!(error.contains("no API server to bind pod"), "{error}");
    }
    let mut nowhere = bind.clone();
    nowhere["Node"] = json!("");
    let (status, _) = call(&mut conn, "/scheduler/bind", &nowhere).await;
    assert_eq!(status, 400);
    running.shutdown().await;
}

/// A long NodeNames list (over 64 KiB, judged on the blocking pool) is answered like a short
/// one; a list longer than any cluster's (millions of names fit the body limit, and took
/// gigabytes to answer) is refused; a reason quoting a long value is cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_lists_are_judged_and_longer_than_any_cluster_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (running, mut conn) = start(dir.path(), None).await;
    let mut many = fixture("extender-filter-nodenames");
    let unknown: Vec<String> = (0..5000).map(|i| format!("elsewhere-{i:05}")).collect();
    let mut names = vec!["node-gpu-1".to_string()];
    names.extend(unknown.iter().cloned());
    many["NodeNames"] = json!(names);
    assert!(many.to_string().len() > 64 * 1024);
    let (status, reply) = call(&mut conn, "/scheduler/filter", &many).await;
    assert_eq!(status, 200);
    assert_eq!(reply["NodeNames"], json!(["node-gpu-1"]));
    let failed = reply["FailedAndUnresolvableNodes"].as_object().unwrap();
    assert_eq!(failed.len(), 5000, "every unknown name is answered");

    let mut too_many = fixture("extender-filter-nodenames");
    too_many["NodeNames"] = json!((0..65_537).map(|i| format!("n{i}")).collect::<Vec<_>>());
    let (status, reply) = call(&mut conn, "/scheduler/filter", &too_many).await;
    assert_eq!(status, 400);
    let text = reply.as_str().unwrap_or_default();
    assert!(
        text.contains("NodeNames lists 65537 nodes, more than the 65536"),
        "{text}"
    );
    // Longer than any list of 65,536 node names: refused before it is read.
    let mut huge = fixture("extender-filter-nodenames");
    let long_name = "n".repeat(250);
    huge["NodeNames"] = json!(vec![long_name; 70_000]);
    let (status, reply) = call(&mut conn, "/scheduler/filter", &huge).await;
    assert_eq!(status, 400);
    let text = reply.as_str().unwrap_or_default();
    assert!(
        text.contains("more than a list of 65536 node names takes"),
        "{text}"
    );

    // A resource name of 10 KB (the API server would not take it; anyone may send it here).
    let mut long = fixture("extender-filter-nodenames");
    long["Pod"]["metadata"]["uid"] = json!("long-resource");
    long["Pod"]["spec"]["containers"][0]["resources"]["requests"]
        [format!("example.com/{}", "r".repeat(10_000))] = json!("1");
    long["NodeNames"] = json!(["node-gpu-1", "node-gpu-2"]);
    let (status, reply) = call(&mut conn, "/scheduler/filter", &long).await;
    assert_eq!(status, 200);
    for (key, why) in reply["FailedNodes"]
        .as_object()
        .into_iter()
        .chain(reply["FailedAndUnresolvableNodes"].as_object())
        .flatten()
    {
        let why = why.as_str().unwrap();
        assert!(why.len() <= 515, "{key}: a reason of {} bytes", why.len());
    }
    running.shutdown().await;
}

/// A reason never repeats a huge request back, nor once per node: a body that is a 200 KB
/// string gets a 400 of a few hundred bytes, and a Pod that is one, or a 100 KB quantity, a
/// short reason on each node it fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasons_about_huge_input_stay_short() {
    let dir = tempfile::tempdir().unwrap();
    let (running, mut conn) = start(dir.path(), None).await;
    let huge = "x".repeat(200 * 1024);
    let (status, reply) = call(&mut conn, "/scheduler/filter", &json!(huge)).await;
    let text = reply.as_str().unwrap_or_default();
    assert_eq!(status, 400, "{}", &text[..text.len().min(300)]);
    assert!(
        text.contains("not a JSON extender request"),
        "{}",
        &text[..text.len().min(300)]
    );
    assert!(text.len() < 600, "a reply of {} bytes", text.len());

    let nodes = json!(["eu-1-a", "eu-1-b", "eu-1-c"]);
    let mut quantity = fixture("extender-filter-nodenames");
    quantity["Pod"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] =
        json!("9".repeat(100 * 1024) + "q");
    quantity["NodeNames"] = nodes.clone();
    let cases = [
        (
            json!({"Pod": huge, "NodeNames": nodes}),
            "Pod could not be read",
        ),
        (quantity, "is not a Kubernetes quantity"),
    ];
    for (body, says) in cases {
        let (status, reply) = call(&mut conn, "/scheduler/filter", &body).await;
        let shown = reply.to_string();
        assert_eq!(status, 200, "{}", &shown[..shown.len().min(300)]);
        let failed = reply["FailedAndUnresolvableNodes"].as_object().unwrap();
        assert_eq!(failed.len(), 3, "{}", &shown[..shown.len().min(300)]);
        for why in failed.values() {
            let why = why.as_str().unwrap();
            assert!(why.contains(says), "{}", &why[..why.len().min(300)]);
            assert!(why.len() < 400, "a reason of {} bytes", why.len());
        }
    }
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_400_with_a_reason_and_any_casing_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let (running, mut conn) = start(dir.path(), None).await;
    let tls = connector_from_dir(&dir.path().join("pki"));
    for body in [
        &b"{"[..],
        b"[]",
        b"not json",
        br#"{"NodeNames": 5, "Pod": {}}"#,
    ] {
        let (status, text) = conn.post_json("/scheduler/filter", body.to_vec()).await;
        assert_eq!(status, 400, "{}", String::from_utf8_lossy(&text));
        assert_eq!(String::from_utf8_lossy(&text).trim_end().lines().count(), 1);
    }
    let (status, _) = conn
        .post_json("/scheduler/prioritize", br#"{"NodeNames": []}"#.to_vec())
        .await;
    assert_eq!(status, 400, "prioritize without a Pod");
    let (status, _) = conn
        .post_json("/scheduler/bind", br#"{"PodName": "a"}"#.to_vec())
        .await;
    assert_eq!(status, 400, "bind without a node");

    // camelCase and lowercase keys work too; a pod with an unreadable quantity fits nowhere.
    let args = fixture("extender-filter-nodenames");
    let lower = json!({"pod": args["Pod"], "nodenames": ["node-gpu-1"], "nodes": null});
    let (_, reply) = call(&mut conn, "/scheduler/filter", &lower).await;
    assert_eq!(reply["NodeNames"], json!(["node-gpu-1"]));
    let mut bad_pod = args.clone();
    bad_pod["Pod"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = json!("four");
    bad_pod["NodeNames"] = json!(["node-gpu-1"]);
    bad_pod["Pod"]["metadata"]["resourceVersion"] = json!("453");
    let (_, reply) = call(&mut conn, "/scheduler/filter", &bad_pod).await;
    assert_eq!(reply["NodeNames"], json!([]));
    let why = reply["FailedAndUnresolvableNodes"]["node-gpu-1"]
        .as_str()
        .unwrap();
    assert!(why.contains("\"four\""), "{why}");

    let mut conn = connect(&tls, running.https_addr, "localhost")
        .await
        .unwrap();
    let (status, reply) = call(&mut conn, "/scheduler/filter", &args).await;
    assert_eq!(status, 200, "still serving: {reply}");
    running.shutdown().await;
}
