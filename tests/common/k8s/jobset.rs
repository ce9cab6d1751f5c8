//! The JobSet API (`jobset.x-k8s.io/v1alpha2`) and the real JobSet controller in a control
//! plane, run out of cluster as `../shared/k8s/README.md` describes: its CRD applied server-side
//! (800 KB: too big for client-side apply's annotation), its webhooks registered at
//! `https://127.0.0.1:PORT` with a CA of their own, the controller with the admin kubeconfig,
//! no leader election and no internal certificate management, ready when `/readyz` says so and
//! the API server gets answers from its webhooks.

use super::control_plane::ControlPlane;
use super::objects::{self, apply};
use super::pki::Ca;
use super::process::Process;
use super::{free_port, webhooks_reachable};
use base64::Engine;
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use serde_json::{json, Value};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

/// The CRD of JobSet v0.11.0 (`config/components/crd/bases`).
pub const CRD_YAML: &str = include_str!("../../data/crds/jobset/jobset.x-k8s.io_jobsets.yaml");
pub const CRD_NAME: &str = "jobsets.jobset.x-k8s.io";
/// Label the controller puts on the Jobs and pods of a JobSet, valued with its name.
pub const JOBSET_NAME_LABEL: &str = "jobset.sigs.k8s.io/jobset-name";

pub fn resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("jobset.x-k8s.io", "v1alpha2", "JobSet"),
        "jobsets",
    )
}

/// The JobSets of namespace `ns`.
pub fn jobsets(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &resource())
}

/// Applies the JobSet CRD and waits until it is Established.
pub async fn install_crd(client: &Client) -> Result<(), String> {
    objects::apply_yaml(client, CRD_YAML).await?;
    objects::wait_established(client, CRD_NAME, Duration::from_secs(30)).await;
    Ok(())
}

/// The controller's two webhook configurations (as `config/components/webhook` renders them),
/// pointed at `port` on loopback.
fn webhooks(port: u16, ca_bundle: &str) -> [Value; 2] {
    let hook = |name: &str, path: &str, group: &str, resource: &str, operations: &[&str]| {
        let mut hook = json!({
            "name": name,
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "clientConfig": {"url": format!("https://127.0.0.1:{port}{path}"), "caBundle": ca_bundle},
            "rules": [{"apiGroups": [group], "apiVersions": [if group.is_empty() { "v1" } else { "v1alpha2" }],
                       "operations": operations, "resources": [resource]}],
        });
        if resource == "pods" {
            // Only the pods of JobSets call it.
            hook["objectSelector"] =
                json!({"matchExpressions": [{"key": JOBSET_NAME_LABEL, "operator": "Exists"}]});
        }
        hook
    };
    [
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "jobset-mutating-webhook-configuration"},
            "webhooks": [
                hook("mjobset.kb.io", "/mutate-jobset-x-k8s-io-v1alpha2-jobset", "jobset.x-k8s.io", "jobsets", &["CREATE"]),
                hook("mpod.kb.io", "/mutate--v1-pod", "", "pods", &["CREATE"]),
            ],
        }),
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "jobset-validating-webhook-configuration"},
            "webhooks": [
                hook("vjobset.kb.io", "/validate-jobset-x-k8s-io-v1alpha2-jobset", "jobset.x-k8s.io", "jobsets", &["CREATE", "UPDATE"]),
                hook("vpod.kb.io", "/validate--v1-pod", "", "pods", &["CREATE"]),
            ],
        }),
    ]
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Installs the CRD and the webhooks in `plane`, starts `binary` and waits until it serves.
pub(super) async fn start(plane: &ControlPlane, binary: &Path) -> Result<Process, String> {
    let name = &plane.name;
    install_crd(&plane.admin).await?;
    let dir = plane.dir.join("jobset-controller");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let ca = Ca::new(&format!("{name}-jobset-webhook-ca"));
    let serving = ca.server("127.0.0.1", &["localhost"], &[IpAddr::from([127, 0, 0, 1])]);
    // certDir must hold these two names.
    write(&dir.join("tls.crt"), &serving.cert_pem)?;
    write(&dir.join("tls.key"), &serving.key_pem)?;
    let (webhook, health) = (free_port(), free_port());
    let config = json!({
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": false},
        // Else its cert rotator wants a Secret and Service in jobset-system, and makes
        // certificates without 127.0.0.1.
        "internalCertManagement": {"enable": false},
        "webhook": {"host": "127.0.0.1", "port": webhook, "certDir": dir},
        // No metrics server: nothing scrapes it, and its certificate watcher would take one
        // more of the inotify instances every process of the user shares (128 by default).
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": format!("127.0.0.1:{health}")},
    });
    let config_path = dir.join("config.yaml");
    write(&config_path, &config.to_string())?;
    let bundle = base64::engine::general_purpose::STANDARD.encode(ca.cert_pem());
    for object in webhooks(webhook, &bundle) {
        apply(&plane.admin, &object, false).await?;
    }
    let mut command = std::process::Command::new(binary);
    command
        .arg("--kubeconfig")
        .arg(&plane.admin_kubeconfig)
        .arg("--config")
        .arg(&config_path)
        .arg("--zap-devel=false");
    let mut process = Process::spawn(
        &format!("{name} jobset-controller"),
        command,
        &plane.dir.join("jobset-controller.log"),
    )?;
    let health: SocketAddr = ([127, 0, 0, 1], health).into();
    process.ready(health).await?;
    // Ready is not yet reachable: a dry-run create goes through both JobSet webhooks.
    let probe: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": "webhook-probe", "namespace": "default"},
        "spec": {"replicatedJobs": [{"name": "probe", "template": {"spec": {"template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox:1.36"}]}}}}}]},
    }))
    .expect("a JobSet");
    webhooks_reachable(
        &format!("{name}'s JobSet controller"),
        jobsets(&plane.admin, "default"),
        probe,
    )
    .await;
    Ok(process)
}
