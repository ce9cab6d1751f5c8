//! Certificate rotation the way the kubelet updates a mounted Secret: a new timestamped
//! directory, an atomic rename of the `..data` symlink, then the old directory deleted. New
//! handshakes see the new certificate, open connections keep working, and a bad pair or
//! files that cannot be read are refused with the old certificate kept.

mod common;

use common::tls_client::{connect, connector, Connection};
use common::{fixture, fixture_json};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use std::future::Future;
use std::net::SocketAddr;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::{Duration, Instant};
use switchyard::certs::{generate, Generated};
use switchyard::config::{ServeSettings, TlsSource};
use switchyard::metrics::Metrics;
use tokio_rustls::TlsConnector;

const RELOAD_INTERVAL: Duration = Duration::from_millis(100);

/// Writes a new payload directory holding `files`, swaps `..data` to it and deletes the
/// previous payload directory, as the kubelet's atomic writer does.
fn kubelet_swap(dir: &Path, version: &str, files: &[(&str, &str)]) {
    let payload = dir.join(format!("..{version}"));
    std::fs::create_dir(&payload).unwrap();
    for (name, text) in files {
        std::fs::write(payload.join(name), text).unwrap();
    }
    let previous = std::fs::read_link(dir.join("..data")).ok();
    let tmp = dir.join("..data_tmp");
    symlink(format!("..{version}"), &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    for f in ["tls.crt", "tls.key"] {
        if std::fs::symlink_metadata(dir.join(f)).is_err() {
            symlink(format!("..data/{f}"), dir.join(f)).unwrap();
        }
    }
    if let Some(old) = previous {
        std::fs::remove_dir_all(dir.join(old)).unwrap();
    }
}

fn pair(g: &Generated) -> [(&'static str, &str); 2] {
    [("tls.crt", &g.cert_pem), ("tls.key", &g.key_pem)]
}

fn leaf(g: &Generated) -> CertificateDer<'static> {
    CertificateDer::pem_slice_iter(g.cert_pem.as_bytes())
        .next()
        .unwrap()
        .unwrap()
}

/// Polls `check` until it holds, failing the test with `what` after 10 s.
async fn until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn reloads(metrics: &Metrics, result: &str) -> u64 {
    let text = metrics.encode();
    let prefix = format!("switchyard_tls_reloads_total{{result=\"{result}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} in\n{text}"))
        .parse()
        .unwrap()
}

async fn served_now(tls: &TlsConnector, addr: SocketAddr) -> CertificateDer<'static> {
    connect(tls, addr, "localhost").await.unwrap().server_cert
}

/// A review on `conn` gets a real reply: 200, the request's uid, allowed.
async fn answers(conn: &mut Connection) {
    let review = fixture_json("admission-mutate-create-basic");
    let (status, body) = tokio::time::timeout(
        Duration::from_secs(5),
        conn.post_json(
            "/mutate-batch-v1-job",
            fixture("admission-mutate-create-basic"),
        ),
    )
    .await
    .expect("a reply within 5 s");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let reply: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(reply["response"]["uid"], review["request"]["uid"]);
    assert_eq!(reply["response"]["allowed"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewed_certificates_are_served_without_restart() {
    switchyard::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let names = ["localhost".to_string()];
    let first = generate(&names, &[]).unwrap();
    let second = generate(&names, &[]).unwrap();
    let third = generate(&names, &[]).unwrap();
    kubelet_swap(dir.path(), "2026_11_22_01", &pair(&first));

    let mut settings = ServeSettings::for_tests(TlsSource::Files {
        cert: dir.path().join("tls.crt"),
        key: dir.path().join("tls.key"),
    });
    settings.tls_reload_interval = RELOAD_INTERVAL;
    let running = switchyard::server::start(settings).await.unwrap();
    let (addr, metrics) = (running.https_addr, running.metrics.clone());

    // The client trusts all three CAs, as it would trust one CA across leaf renewals.
    let trust = [&first, &second, &third]
        .iter()
        .map(|g| g.ca_cert_pem.as_str())
        .collect::<String>();
    let tls = connector(trust.as_bytes(), None);
    let mut held = connect(&tls, addr, "localhost").await.unwrap();
    assert_eq!(held.server_cert, leaf(&first));
    answers(&mut held).await;

    // Renewal: new handshakes get the second certificate; the connection opened before it,
    // whose certificate's directory is gone now, still answers.
    kubelet_swap(dir.path(), "2026_11_22_02", &pair(&second));
    until("the renewed certificate is served", || async {
        served_now(&tls, addr).await == leaf(&second)
    })
    .await;
    answers(&mut held).await;
    assert_eq!(reloads(&metrics, "success"), 1);
    assert_eq!(reloads(&metrics, "error"), 0);

    // A bad pair: the third certificate with the second key. Refused, the second kept.
    kubelet_swap(
        dir.path(),
        "2026_11_22_03",
        &[("tls.crt", &third.cert_pem), ("tls.key", &second.key_pem)],
    );
    until("the mismatched pair is counted", || async {
        reloads(&metrics, "error") == 1
    })
    .await;
    let mut fresh = connect(&tls, addr, "localhost").await.unwrap();
    assert_eq!(
        fresh.server_cert,
        leaf(&second),
        "the old pair keeps serving"
    );
    answers(&mut fresh).await;

    // A key that does not parse is refused the same way.
    kubelet_swap(
        dir.path(),
        "2026_11_22_04",
        &[("tls.crt", &third.cert_pem), ("tls.key", "not a key")],
    );
    until("the unreadable key is counted", || async {
        reloads(&metrics, "error") == 2
    })
    .await;
    assert_eq!(served_now(&tls, addr).await, leaf(&second));

    // A Secret without tls.key: the file cannot be read at all. Counted once, old one kept.
    kubelet_swap(dir.path(), "2026_11_22_05", &[("tls.crt", &third.cert_pem)]);
    until("the missing key file is counted", || async {
        reloads(&metrics, "error") == 3
    })
    .await;
    let mut fresh = connect(&tls, addr, "localhost").await.unwrap();
    assert_eq!(fresh.server_cert, leaf(&second));
    answers(&mut fresh).await;
    answers(&mut held).await;

    // The pair being served comes back: no reload. There is nothing to wait for here, so the
    // state is held for several reload intervals before the next change.
    kubelet_swap(dir.path(), "2026_11_22_06", &pair(&second));
    tokio::time::sleep(RELOAD_INTERVAL * 5).await;
    assert_eq!(
        reloads(&metrics, "success"),
        1,
        "the served pair is no reload"
    );
    assert_eq!(
        reloads(&metrics, "error"),
        3,
        "a read error is counted once"
    );

    // A good pair after all of that is picked up, and counted once.
    kubelet_swap(dir.path(), "2026_11_22_07", &pair(&third));
    until("the third certificate is served", || async {
        served_now(&tls, addr).await == leaf(&third)
    })
    .await;
    assert_eq!(reloads(&metrics, "success"), 2);
    assert_eq!(reloads(&metrics, "error"), 3);
    answers(&mut held).await;
    running.shutdown().await;
}
