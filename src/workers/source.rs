//! Where a worker's kubeconfig comes from, kept current: a Secret in Switchyard's namespace
//! (key `kubeconfig`), watched, or a file in the pod, re-read whenever its directory changes
//! and on a timer, and compared by content. The directory is watched rather than the file: a
//! Secret volume swaps a `..data` symlink beside it, which a watch on the file itself misses.
//! The timer stays as a fallback for what notifications do not cover (a file system without
//! them, a watch that could not be set up, a swap higher up the path).
//!
//! Each source publishes its latest [`Reading`]; the worker's connection rebuilds its client
//! when the text changes, and nothing else.

use crate::api::{KubeConfig, LocationType, KUBECONFIG_SECRET_KEY};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::watch;

/// The kubeconfig text, or why there is none (the `BadKubeConfig` message).
pub(crate) type Reading = Result<String, String>;

/// Starts watching `location`; the receiver holds `None` until the first reading. The task
/// ends when every receiver is gone.
pub(crate) fn spawn(
    location: &KubeConfig,
    manager: kube::Client,
    namespace: &str,
    file_poll: Duration,
) -> watch::Receiver<Option<Reading>> {
    let (tx, rx) = watch::channel(None);
    match location.location_type {
        LocationType::Secret => {
            tokio::spawn(secret(
                Api::namespaced(manager, namespace),
                namespace.to_string(),
                location.location.clone(),
                tx,
            ));
        }
        LocationType::Path => {
            tokio::spawn(file(PathBuf::from(&location.location), file_poll, tx));
        }
    }
    rx
}

fn publish(tx: &watch::Sender<Option<Reading>>, reading: Reading) {
    tx.send_if_modified(|current| {
        if current.as_ref() == Some(&reading) {
            return false;
        }
        *current = Some(reading);
        true
    });
}

/// The kubeconfig a Secret holds, or why it holds none.
pub(crate) fn from_secret(secret: &Secret, namespace: &str) -> Reading {
    let name = secret.metadata.name.as_deref().unwrap_or_default();
    let data = secret.data.as_ref();
    let Some(bytes) = data.and_then(|d| d.get(KUBECONFIG_SECRET_KEY)) else {
        let keys: Vec<&str> = data
            .into_iter()
            .flat_map(|d| d.keys().map(String::as_str))
            .collect();
        return Err(format!(
            "Secret {namespace}/{name} has no key {KUBECONFIG_SECRET_KEY:?} (keys: [{}]): put the kubeconfig under {KUBECONFIG_SECRET_KEY:?}",
            keys.join(", ")
        ));
    };
    String::from_utf8(bytes.0.clone()).map_err(|_| {
        format!("Secret {namespace}/{name} key {KUBECONFIG_SECRET_KEY:?} is not UTF-8 text")
    })
}

async fn secret(
    api: Api<Secret>,
    namespace: String,
    name: String,
    tx: watch::Sender<Option<Reading>>,
) {
    let missing = || {
        Err(format!(
            "Secret {namespace}/{name} not found: create it with the worker's kubeconfig under the key {KUBECONFIG_SECRET_KEY:?}"
        ))
    };
    // Only this one Secret: the manager never reads the other Secrets of its namespace.
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let stream = watcher(api, config).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut relisted: Option<Reading> = None;
    loop {
        let item = tokio::select! {
            _ = tx.closed() => return,
            item = stream.next() => item,
        };
        match item {
            None => return,
            Some(Ok(Event::Init)) => relisted = None,
            Some(Ok(Event::InitApply(s))) => relisted = Some(from_secret(&s, &namespace)),
            Some(Ok(Event::InitDone)) => publish(&tx, relisted.take().unwrap_or_else(missing)),
            Some(Ok(Event::Apply(s))) => publish(&tx, from_secret(&s, &namespace)),
            Some(Ok(Event::Delete(_))) => publish(&tx, missing()),
            Some(Err(e)) => {
                tracing::warn!(secret = %name, namespace = %namespace, error = %e, "cannot watch a worker's kubeconfig Secret");
                // A failed watch says nothing about the kubeconfig already read; it matters
                // only when there is none yet.
                if tx.borrow().is_none() {
                    publish(
                        &tx,
                        Err(format!(
                            "cannot read Secret {namespace}/{name}: {e}; check that Switchyard may get, list and watch Secrets in {namespace}"
                        )),
                    );
                }
            }
        }
    }
}

/// Notifies `changed` of every change in the directory holding `path`; `None` (logged) when
/// the directory cannot be watched, leaving the poll alone.
fn watch_directory(
    path: &std::path::Path,
    changed: tokio::sync::mpsc::Sender<()>,
) -> Option<notify::RecommendedWatcher> {
    use notify::Watcher;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty())?;
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // One pending wake-up is enough: the file is read whole each time.
        if event.is_ok() {
            let _ = changed.try_send(());
        }
    })
    .and_then(|mut w| {
        w.watch(dir, notify::RecursiveMode::NonRecursive)?;
        Ok(w)
    });
    match watcher {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::info!(dir = %dir.display(), error = %e, "cannot watch a kubeconfig's directory; re-reading it on a timer only");
            None
        }
    }
}

async fn file(path: PathBuf, poll: Duration, tx: watch::Sender<Option<Reading>>) {
    let (changed_tx, mut changed) = tokio::sync::mpsc::channel(1);
    // Kept for as long as the file is read: dropping it stops the notifications.
    let _watcher = watch_directory(&path, changed_tx);
    loop {
        let reading = tokio::fs::read_to_string(&path).await.map_err(|e| {
            format!(
                "cannot read kubeconfig file {}: {e}; mount it into the Switchyard pod",
                path.display()
            )
        });
        publish(&tx, reading);
        tokio::select! {
            _ = tx.closed() => return,
            _ = tokio::time::sleep(poll) => {}
            Some(()) = changed.recv() => {}
        }
    }
}
