//! Real Kubernetes control planes for tests, in the manner of controller-runtime's envtest:
//! etcd, kube-apiserver and, where a test needs them, kube-controller-manager and
//! kube-scheduler, started from a folder of binaries ([`assets`]) on loopback, each with its
//! own PKI and free ports, and stopped on every exit path (dropped, or killed by the
//! [`reaper`] if the test process dies first). [`kubelet`] stands in for the kubelets; [`jobset`]
//! runs the JobSet controller, [`kueue`] the Kueue controller manager.

#![allow(dead_code)]

pub mod assets;
pub mod control_plane;
pub mod jobset;
pub mod kubelet;
pub mod kueue;
pub mod objects;
pub mod pki;
pub mod process;
pub mod reaper;
pub mod service;

use std::future::Future;
use std::time::{Duration, Instant};

pub use assets::Assets;
pub use control_plane::{ControlPlane, Options};

/// A port free on loopback now, for a process about to be started to listen on.
///
/// Taken below the kernel's ephemeral range: a port the kernel picked for `bind(0)` and that
/// was released can be given to any outgoing connection before the process binds it (a
/// kube-apiserver failed so, its port taken by a connection to etcd). Each port is handed out
/// once per test process.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ephemeral_start: u32 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    let (low, high) = (10_000u32, ephemeral_start.max(12_000));
    let span = high - low;
    // Different test processes start at different places.
    let start = std::process::id().wrapping_mul(7919) % span;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (low + (start + n) % span) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port on loopback between {low} and {high}");
}

/// Waits until the API server reaches a controller's admission webhooks: a dry-run create of
/// `probe` goes through them (the controller reporting ready is not enough: the API server may
/// not reach it yet). Up to 90 s: with several control planes starting on 2 cores, one dry-run
/// create was seen to wait 30 s in kube-apiserver (its watch cache behind: "Too large resource
/// version") before the webhooks were reached.
pub async fn webhooks_reachable<K>(what: &str, api: kube::Api<K>, probe: K)
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let dry_run = kube::api::PostParams {
        dry_run: true,
        ..Default::default()
    };
    eventually(
        &format!("{what}: the API server reaches the webhooks"),
        Duration::from_secs(90),
        || {
            let (api, probe, dry_run) = (api.clone(), probe.clone(), dry_run.clone());
            async move {
                api.create(&dry_run, &probe)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
        },
    )
    .await;
}

/// Polls `check` until it returns `Ok`; `Err` carries what was seen instead. After `timeout`
/// the test fails, naming what it waited for and what it saw last.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let start = Instant::now();
    let mut delay = Duration::from_millis(50);
    loop {
        let seen = match tokio::time::timeout(timeout, check()).await {
            Ok(Ok(v)) => return v,
            Ok(Err(seen)) => seen,
            Err(_) => "the check itself did not answer".to_string(),
        };
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}; last seen: {seen}");
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(500));
    }
}
