//! The real server on 127.0.0.1 over TLS, with a client that verifies the server certificate.

mod common;

use common::tls_client::{connect, connector, connector_from_dir};
use common::{assert_echo, fixture, fixture_json, patched_object, probe_get};
use serde_json::{json, Value};
use std::time::Duration;
use switchyard::config::{ServeSettings, TlsSource};
use switchyard::server::{self, Running};

async fn start(dir: &std::path::Path) -> Running {
    switchyard::install_crypto_provider();
    server::start(ServeSettings::for_tests(TlsSource::Dev(dir.into())))
        .await
        .expect("server starts")
}

fn reply_json(status: u16, body: &[u8]) -> Value {
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(body));
    serde_json::from_slice(body).expect("reply is JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reviews_over_tls_are_answered_and_patches_apply() {
    let dir = tempfile::tempdir().unwrap();
    let running = start(dir.path()).await;
    let tls = connector_from_dir(dir.path());
    let mut conn = connect(&tls, running.https_addr, "localhost")
        .await
        .unwrap();

    // Many reviews on one kept-alive connection, as kube-apiserver sends them.
    for _ in 0..3 {
        let review = fixture_json("admission-mutate-create-basic");
        let (status, body) = conn
            .post_json(
                "/mutate-batch-v1-job",
                fixture("admission-mutate-create-basic"),
            )
            .await;
        let reply = reply_json(status, &body);
        assert_echo(&review, &reply);
        let job = patched_object(&review, &reply);
        assert_eq!(job["spec"]["suspend"], true);
        assert_eq!(job["spec"]["managedBy"], "switchyard.dev/dispatcher");
        assert_eq!(
            job["metadata"]["labels"]["switchyard.dev/queue-name"],
            "research"
        );
    }

    let review = fixture_json("validate-update-unsuspend-alice-managed");
    let (status, body) = conn
        .post_json(
            "/validate-batch-v1-job",
            fixture("validate-update-unsuspend-alice-managed"),
        )
        .await;
    let reply = reply_json(status, &body);
    assert_echo(&review, &reply);
    assert_eq!(reply["response"]["allowed"], false);
    assert_eq!(reply["response"]["status"]["code"], 403);

    // The IP address is in the certificate too.
    let mut by_ip = connect(&tls, running.https_addr, "127.0.0.1")
        .await
        .unwrap();
    let (status, _) = by_ip
        .post_json("/validate-batch-v1-job", fixture("validate-create-mutated"))
        .await;
    assert_eq!(status, 200);

    // A client that does not trust our CA fails the handshake.
    let other = switchyard::certs::generate(&["localhost".into()], &[]).unwrap();
    let untrusting = connector(other.ca_cert_pem.as_bytes(), None);
    assert!(connect(&untrusting, running.https_addr, "localhost")
        .await
        .is_err());
    running.shutdown().await;
}

/// What the API server should store for each mutating fixture: the request's object with
/// these (JSON Pointer, value) changes; no changes means no patch at all.
fn expected_changes(fixture: &str) -> Vec<(&'static str, Value)> {
    let ours = || {
        vec![
            ("/spec/suspend", json!(true)),
            ("/spec/managedBy", json!("switchyard.dev/dispatcher")),
        ]
    };
    match fixture {
        "admission-mutate-create-basic"
        | "mutate-create-unknown-fields"
        | "mutate-create-dry-run"
        | "mutate-create-generate-name"
        // kubernetes.io/job-controller is replaced.
        | "mutate-create-managedby-jobcontroller" => ours(),
        // Another controller's managedBy is left for the validating hook to refuse.
        "mutate-create-managedby-other" => vec![("/spec/suspend", json!(true))],
        // No labels map at all: created whole, with the default queue.
        "mutate-create-default-namespace" => {
            let mut c = ours();
            c.push((
                "/metadata/labels",
                json!({"switchyard.dev/queue-name": "team-queue"}),
            ));
            c
        }
        "mutate-create-no-labels" | "mutate-create-other-labels" | "mutate-create-already-suspended" => {
            Vec::new()
        }
        other => panic!("no expectation for mutating fixture {other}: add one"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mutating_fixture_over_tls_patches_to_the_expected_object() {
    switchyard::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let mut settings = ServeSettings::for_tests(TlsSource::Dev(dir.path().into()));
    settings.policy.default_queue = Some("team-queue".into());
    settings.policy.managed_namespaces = Some(
        serde_json::from_value(json!({"matchLabels": {"kubernetes.io/metadata.name": "team-a"}}))
            .unwrap(),
    );
    let running = server::start(settings).await.unwrap();
    let tls = connector_from_dir(dir.path());
    let mut conn = connect(&tls, running.https_addr, "localhost")
        .await
        .unwrap();

    let mut fixtures: Vec<String> = std::fs::read_dir(common::fixture_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter_map(|f| f.strip_suffix(".json").map(str::to_owned))
        .filter(|f| f.starts_with("mutate-") || f.starts_with("admission-mutate-"))
        .collect();
    fixtures.sort();
    assert!(fixtures.len() >= 10, "{fixtures:?}");
    for name in &fixtures {
        let review = fixture_json(name);
        let (status, body) = conn.post_json("/mutate-batch-v1-job", fixture(name)).await;
        let reply = reply_json(status, &body);
        assert_echo(&review, &reply);
        assert_eq!(reply["response"]["allowed"], true, "{name}: {reply}");
        let changes = expected_changes(name);
        assert_eq!(
            common::patch_of(&reply).is_some(),
            !changes.is_empty(),
            "{name}: {reply}"
        );
        let mut expected = review["request"]["object"].clone();
        for (pointer, value) in changes {
            let (parent, key) = pointer.rsplit_once('/').unwrap();
            expected
                .pointer_mut(parent)
                .and_then(Value::as_object_mut)
                .unwrap_or_else(|| panic!("{name}: no object at {parent}"))
                .insert(key.to_string(), value);
        }
        assert_eq!(patched_object(&review, &reply), expected, "{name}");
    }
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_clear_4xx_and_the_server_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let running = start(dir.path()).await;
    let tls = connector_from_dir(dir.path());
    let mut conn = connect(&tls, running.https_addr, "localhost")
        .await
        .unwrap();
    let path = "/mutate-batch-v1-job";

    let (status, body) = conn.post_json(path, b"not json".to_vec()).await;
    assert_eq!(status, 400);
    let line = String::from_utf8(body).unwrap();
    assert!(line.contains("not a JSON AdmissionReview"), "{line}");
    assert_eq!(line.trim_end().lines().count(), 1, "one line: {line:?}");

    let full = fixture("admission-mutate-create-basic");
    let (status, _) = conn.post_json(path, full[..full.len() / 3].to_vec()).await;
    assert_eq!(status, 400, "truncated JSON");

    let (status, body) = conn
        .post_json(path, br#"{"kind":"AdmissionReview"}"#.to_vec())
        .await;
    assert_eq!(status, 400);
    assert!(String::from_utf8_lossy(&body).contains("no request"));

    // Refused before the body is read; the server may then close the connection.
    let (status, body) = conn.post(path, "text/plain", full.clone()).await;
    assert_eq!(status, 415);
    assert!(String::from_utf8_lossy(&body).contains("application/json"));
    let mut conn = connect(&tls, running.https_addr, "localhost")
        .await
        .unwrap();

    // Known uid, wrong kind: denied inside a well-formed review.
    let mut pod = fixture_json("admission-mutate-create-basic");
    pod["request"]["kind"] = serde_json::json!({"group": "", "version": "v1", "kind": "Pod"});
    let (status, body) = conn
        .post_json(path, serde_json::to_vec(&pod).unwrap())
        .await;
    let reply = reply_json(status, &body);
    assert_echo(&pod, &reply);
    assert_eq!(reply["response"]["allowed"], false);
    assert_eq!(reply["response"]["status"]["code"], 400);

    // Over the limit (7 MiB: an UPDATE carries two objects of up to 3 MiB each).
    let (status, body) = conn.post_json(path, vec![b' '; 8 * 1024 * 1024]).await;
    assert_eq!(status, 413, "{}", String::from_utf8_lossy(&body));
    // A large but legal UPDATE review (two ~2.5 MiB objects) is served.
    let mut big = fixture_json("validate-update-unsuspend-alice-managed");
    let filler = "x".repeat(2_500_000);
    big["request"]["object"]["metadata"]["annotations"] = serde_json::json!({"big": filler});
    big["request"]["oldObject"]["metadata"]["annotations"] = serde_json::json!({"big": filler});
    let mut conn = connect(&tls, running.https_addr, "localhost")
        .await
        .unwrap();
    let (status, body) = conn
        .post_json("/validate-batch-v1-job", serde_json::to_vec(&big).unwrap())
        .await;
    assert_eq!(reply_json(status, &body)["response"]["allowed"], false);

    let (status, _) = conn.post_json("/nope", full.clone()).await;
    assert_eq!(status, 404);

    // Still serving after all of that.
    let mut conn = connect(&tls, running.https_addr, "localhost")
        .await
        .unwrap();
    let (status, body) = conn.post_json(path, full).await;
    assert_eq!(reply_json(status, &body)["response"]["allowed"], true);
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let running = start(dir.path()).await;
    let tls = connector_from_dir(dir.path());
    let mut conn = connect(&tls, running.https_addr, "localhost")
        .await
        .unwrap();
    conn.post_json(
        "/mutate-batch-v1-job",
        fixture("admission-mutate-create-basic"),
    )
    .await;
    conn.post_json("/validate-batch-v1-job", b"{".to_vec())
        .await;

    assert_eq!(probe_get(running.probe_addr, "/healthz").await.0, 200);
    let (status, ready) = probe_get(running.probe_addr, "/readyz").await;
    assert_eq!(status, 200);
    assert!(ready.contains("standalone"), "{ready}");
    let (status, metrics) = probe_get(running.probe_addr, "/metrics").await;
    assert_eq!(status, 200);
    for line in [
        r#"switchyard_http_requests_total{path="/mutate-batch-v1-job",result="patched"} 1"#,
        r#"switchyard_http_requests_total{path="/validate-batch-v1-job",result="bad_request"} 1"#,
        r#"switchyard_http_request_duration_seconds_count{path="/mutate-batch-v1-job",result="patched"} 1"#,
        "switchyard_build_info{version=",
        "# TYPE switchyard_tls_reloads counter",
        "# EOF",
    ] {
        assert!(metrics.contains(line), "missing {line:?} in\n{metrics}");
    }
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_required_when_a_client_ca_is_given() {
    switchyard::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let server = switchyard::certs::generate(&["localhost".into()], &[]).unwrap();
    switchyard::certs::write(dir.path(), &server).unwrap();
    // kube-apiserver's client certificate, from a CA of its own.
    let client = switchyard::certs::generate(&["kube-apiserver".into()], &[]).unwrap();
    let client_ca = dir.path().join("client-ca.crt");
    std::fs::write(&client_ca, &client.ca_cert_pem).unwrap();

    let mut settings = ServeSettings::for_tests(TlsSource::Files {
        cert: dir.path().join("tls.crt"),
        key: dir.path().join("tls.key"),
    });
    settings.client_ca = Some(client_ca);
    let running = server::start(settings).await.unwrap();

    let with_cert = connector(
        server.ca_cert_pem.as_bytes(),
        Some((client.cert_pem.as_bytes(), client.key_pem.as_bytes())),
    );
    let mut conn = connect(&with_cert, running.https_addr, "localhost")
        .await
        .unwrap();
    let (status, _) = conn
        .post_json(
            "/mutate-batch-v1-job",
            fixture("admission-mutate-create-basic"),
        )
        .await;
    assert_eq!(status, 200);

    // Without a client certificate the server refuses; with TLS 1.3 the refusal surfaces
    // on the first exchange rather than in the handshake.
    let without = connector(server.ca_cert_pem.as_bytes(), None);
    let refused = match connect(&without, running.https_addr, "localhost").await {
        Err(_) => true,
        Ok(mut c) => {
            let req = hyper::Request::post("/mutate-batch-v1-job")
                .header("host", "localhost")
                .header("content-type", "application/json")
                .body(http_body_util::Full::new(hyper::body::Bytes::from_static(
                    b"{}",
                )))
                .unwrap();
            // A refusal is an error on the connection; a hang is no refusal and fails here.
            tokio::time::timeout(Duration::from_secs(5), async {
                c.sender.ready().await.is_err() || c.sender.send_request(req).await.is_err()
            })
            .await
            .expect("the refusal arrives within 5 s, not a hang")
        }
    };
    assert!(refused, "a client without a certificate must be refused");
    running.shutdown().await;
}
