//! Certificate rotation the way the kubelet updates a mounted Secret: a new timestamped
//! directory, then an atomic rename of the `..data` symlink. New handshakes see the new
//! certificate, open connections stay up, and a bad pair is refused with the old one kept.

mod common;

use common::fixture;
use common::tls_client::{connect, connector};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::{Duration, Instant};
use switchyard::certs::{generate, Generated};
use switchyard::config::{ServeSettings, TlsSource};

/// Writes a new payload directory and swaps `..data` to it, as the kubelet's atomic writer does.
fn kubelet_swap(dir: &Path, version: &str, cert: &str, key: &str) {
    let payload = dir.join(format!("..{version}"));
    std::fs::create_dir(&payload).unwrap();
    std::fs::write(payload.join("tls.crt"), cert).unwrap();
    std::fs::write(payload.join("tls.key"), key).unwrap();
    let tmp = dir.join("..data_tmp");
    symlink(format!("..{version}"), &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    for f in ["tls.crt", "tls.key"] {
        if std::fs::symlink_metadata(dir.join(f)).is_err() {
            symlink(format!("..data/{f}"), dir.join(f)).unwrap();
        }
    }
}

fn leaf(g: &Generated) -> CertificateDer<'static> {
    CertificateDer::pem_slice_iter(g.cert_pem.as_bytes())
        .next()
        .unwrap()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewed_certificates_are_served_without_restart() {
    switchyard::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let names = ["localhost".to_string()];
    let first = generate(&names, &[]).unwrap();
    let second = generate(&names, &[]).unwrap();
    let third = generate(&names, &[]).unwrap();
    kubelet_swap(dir.path(), "2026_11_22_01", &first.cert_pem, &first.key_pem);

    let mut settings = ServeSettings::for_tests(TlsSource::Files {
        cert: dir.path().join("tls.crt"),
        key: dir.path().join("tls.key"),
    });
    settings.tls_reload_interval = Duration::from_millis(100);
    let running = switchyard::server::start(settings).await.unwrap();

    // The client trusts all three CAs, as it would trust one CA across leaf renewals.
    let trust = [&first, &second, &third]
        .iter()
        .map(|g| g.ca_cert_pem.as_str())
        .collect::<String>();
    let tls = connector(trust.as_bytes(), None);
    let mut held = connect(&tls, running.https_addr, "localhost")
        .await
        .unwrap();
    assert_eq!(held.server_cert, leaf(&first));
    let body = fixture("admission-mutate-create-basic");
    assert_eq!(
        held.post_json("/mutate-batch-v1-job", body.clone()).await.0,
        200
    );

    kubelet_swap(
        dir.path(),
        "2026_11_22_02",
        &second.cert_pem,
        &second.key_pem,
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let fresh = connect(&tls, running.https_addr, "localhost")
            .await
            .unwrap();
        if fresh.server_cert == leaf(&second) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the renewed certificate was never served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The connection opened before the renewal is still up and still serving.
    assert_eq!(
        held.post_json("/mutate-batch-v1-job", body.clone()).await.0,
        200
    );
    assert_eq!(held.server_cert, leaf(&first));

    // A bad pair: the third certificate with the second key. Refused, the second kept.
    kubelet_swap(
        dir.path(),
        "2026_11_22_03",
        &third.cert_pem,
        &second.key_pem,
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !running
        .metrics
        .encode()
        .contains(r#"switchyard_tls_reloads_total{result="error"} 1"#)
    {
        assert!(Instant::now() < deadline, "the bad pair was never counted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut fresh = connect(&tls, running.https_addr, "localhost")
        .await
        .unwrap();
    assert_eq!(
        fresh.server_cert,
        leaf(&second),
        "the old pair keeps serving"
    );
    assert_eq!(
        fresh
            .post_json("/mutate-batch-v1-job", body.clone())
            .await
            .0,
        200
    );

    // An unreadable key is refused the same way.
    kubelet_swap(dir.path(), "2026_11_22_04", &third.cert_pem, "not a key");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let fresh = connect(&tls, running.https_addr, "localhost")
        .await
        .unwrap();
    assert_eq!(fresh.server_cert, leaf(&second));
    let metrics = running.metrics.encode();
    assert!(
        metrics.contains(r#"switchyard_tls_reloads_total{result="error"} 2"#),
        "{metrics}"
    );
    assert!(metrics.contains(r#"switchyard_tls_reloads_total{result="success"} 1"#));

    // A good pair after the bad ones is picked up.
    kubelet_swap(dir.path(), "2026_11_22_05", &third.cert_pem, &third.key_pem);
    let deadline = Instant::now() + Duration::from_secs(10);
    while connect(&tls, running.https_addr, "localhost")
        .await
        .unwrap()
        .server_cert
        != leaf(&third)
    {
        assert!(Instant::now() < deadline, "the fixed pair was never served");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.shutdown().await;
}
