//! The default-queue rule with Namespace labels read from a (fake) API server through the
//! real `kube::Client`: cached, bounded, and failing closed with a clear message.

mod common;

use common::tls_client::{connect, connector_from_dir};
use common::{fixture, fixture_json, patched_object};
use serde_json::{json, Value};
use std::time::Duration;
use switchyard::config::{ServeSettings, TlsSource};
use switchyard::namespaces::NamespaceLabels;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

fn client(uri: &str) -> kube::Client {
    switchyard::install_crypto_provider();
    let config = kube::Config::new(uri.parse().unwrap());
    kube::Client::try_from(config).unwrap()
}

/// A Namespace exactly as kube-apiserver returns it.
fn namespace(name: &str, labels: Value) -> Value {
    json!({
        "kind": "Namespace",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": "5b1f0d7c-3f5a-4a55-9a40-0d8b8f3c9a11",
            "resourceVersion": "4211",
            "creationTimestamp": "2026-11-22T03:10:00Z",
            "labels": labels,
            "managedFields": []
        },
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"}
    })
}

fn not_found(name: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": format!("namespaces \"{name}\" not found"), "reason": "NotFound",
           "details": {"name": name, "kind": "namespaces"}, "code": 404})
}

#[tokio::test]
async fn labels_are_read_once_then_cached_and_missing_namespaces_are_none() {
    let api = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/api/v1/namespaces/team-a"))
        .respond_with(ResponseTemplate::new(200).set_body_json(namespace(
            "team-a",
            json!({"kubernetes.io/metadata.name": "team-a", "team": "ml"}),
        )))
        .expect(1)
        .mount(&api)
        .await;
    Mock::given(method("GET"))
        .and(path("/api/v1/namespaces/gone"))
        .respond_with(ResponseTemplate::new(404).set_body_json(not_found("gone")))
        .mount(&api)
        .await;
    let ns = NamespaceLabels::live(client(&api.uri()), Duration::from_secs(30));
    for _ in 0..3 {
        let labels = ns.get("team-a").await.unwrap().unwrap();
        assert_eq!(labels.get("team").map(String::as_str), Some("ml"));
    }
    assert!(ns.get("gone").await.unwrap().is_none());
}

#[tokio::test]
async fn failures_are_errors_naming_the_namespace_and_are_not_cached() {
    let api = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/api/v1/namespaces/team-a"))
        .respond_with(ResponseTemplate::new(500).set_body_string("etcd is down"))
        .up_to_n_times(1)
        .mount(&api)
        .await;
    Mock::given(method("GET"))
        .and(path("/api/v1/namespaces/team-a"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(namespace("team-a", json!({"team": "ml"}))),
        )
        .mount(&api)
        .await;
    let ns = NamespaceLabels::live(client(&api.uri()), Duration::from_secs(30));
    let err = ns.get("team-a").await.unwrap_err();
    assert!(err.to_string().contains("\"team-a\""), "{err}");
    assert!(
        ns.get("team-a").await.unwrap().is_some(),
        "retried after a failure"
    );

    // An API server that never answers: bounded by the lookup timeout.
    let hung = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(200).set_delay(Duration::from_secs(30)))
        .mount(&hung)
        .await;
    let ns = NamespaceLabels::live(client(&hung.uri()), Duration::from_secs(30));
    let started = std::time::Instant::now();
    let err = ns.get("team-a").await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "lookup is bounded"
    );
    assert!(err.to_string().contains("no answer"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_applies_the_default_queue_by_namespace_labels() {
    let api = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/api/v1/namespaces/team-a"))
        .respond_with(ResponseTemplate::new(200).set_body_json(namespace(
            "team-a",
            json!({"kubernetes.io/metadata.name": "team-a", "team": "ml"}),
        )))
        .mount(&api)
        .await;
    Mock::given(method("GET"))
        .and(path("/api/v1/namespaces/research"))
        .respond_with(ResponseTemplate::new(503).set_body_string("unavailable"))
        .mount(&api)
        .await;
    let dir = tempfile::tempdir().unwrap();
    let mut settings = ServeSettings::for_tests(TlsSource::Dev(dir.path().into()));
    settings.standalone = false;
    settings.policy.default_queue = Some("ml-batch".into());
    settings.policy.managed_namespaces =
        Some(serde_json::from_value(json!({"matchLabels": {"team": "ml"}})).unwrap());
    let running = switchyard::server::start_with_client(settings, Some(client(&api.uri())))
        .await
        .unwrap();
    let tls = connector_from_dir(dir.path());
    let mut conn = connect(&tls, running.https_addr, "localhost")
        .await
        .unwrap();

    let review = fixture_json("mutate-create-default-namespace");
    let (status, body) = conn
        .post_json(
            "/mutate-batch-v1-job",
            fixture("mutate-create-default-namespace"),
        )
        .await;
    assert_eq!(status, 200);
    let reply: Value = serde_json::from_slice(&body).unwrap();
    let job = patched_object(&review, &reply);
    assert_eq!(
        job["metadata"]["labels"]["switchyard.dev/queue-name"],
        "ml-batch"
    );
    assert_eq!(job["spec"]["suspend"], true);
    assert_eq!(job["spec"]["managedBy"], "switchyard.dev/dispatcher");

    // The API server cannot say what research's labels are: fail closed, say why.
    let (status, body) = conn
        .post_json("/mutate-batch-v1-job", fixture("mutate-create-no-labels"))
        .await;
    assert_eq!(status, 200);
    let reply: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(reply["response"]["allowed"], false);
    assert_eq!(reply["response"]["status"]["code"], 503);
    let message = reply["response"]["status"]["message"].as_str().unwrap();
    assert!(message.contains("Namespace \"research\""), "{message}");

    // A labelled Job needs no lookup at all.
    let (status, body) = conn
        .post_json(
            "/mutate-batch-v1-job",
            fixture("admission-mutate-create-basic"),
        )
        .await;
    assert_eq!(status, 200);
    let reply: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(reply["response"]["allowed"], true);
    running.shutdown().await;
}
